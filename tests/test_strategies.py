"""Strategies against closed forms and explicit definitions (never against their own output)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mfcli.errors import MfcliError
from mfcli.io.artifact import load_artifact, save_strategy, strategy_from_artifact
from mfcli.model.workloads import build_workload, momentum_workload, prefix_workload
from mfcli.strategies.baselines import (
    STRATEGY_NAMES,
    TREE_STRATEGIES,
    build_strategy,
    honaker_full_decoder,
    honaker_online_decoder,
    is_causal_in_release_order,
    sqrt_coefficients,
    sqrt_strategy_matrix,
    tree_decoder,
    tree_release_steps,
    tree_strategy_matrix,
)


def S(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n)))


def dyadic_nodes_bruteforce(n: int) -> list[tuple[int, int, int]]:
    """(release step, level, start) of every node, enumerated from the definition: all dyadic
    intervals of the padded tree that meet [0, n), truncated to n - 1, sorted by release step and
    then bottom-up."""
    n_pad = 1
    while n_pad < n:
        n_pad *= 2
    nodes = []
    size, level = 1, 0
    while size <= n_pad:
        for start in range(0, n_pad, size):
            if start < n:
                nodes.append((min(start + size - 1, n - 1), level, start))
        size, level = size * 2, level + 1
    return sorted(nodes)


# --- the tree encoder ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 31, 64, 100])
def test_tree_matrix_matches_bruteforce_enumeration(n: int) -> None:
    nodes = dyadic_nodes_bruteforce(n)
    expected = np.zeros((len(nodes), n))
    for i, (end, _level, start) in enumerate(nodes):
        expected[i, start : end + 1] = 1
    np.testing.assert_array_equal(tree_strategy_matrix(n), expected)
    np.testing.assert_array_equal(tree_release_steps(n), [end for end, _, _ in nodes])


def test_tree_n2_rows_in_release_order() -> None:
    np.testing.assert_array_equal(tree_strategy_matrix(2), [[1, 0], [0, 1], [1, 1]])
    np.testing.assert_array_equal(tree_release_steps(2), [0, 1, 1])
    # n = 4: leaf 0 | leaf 1, [0,1] | leaf 2 | leaf 3, [2,3], [0,3]
    np.testing.assert_array_equal(
        tree_strategy_matrix(4),
        [[1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 1, 1], [1, 1, 1, 1]],
    )


@pytest.mark.parametrize("n,rows", [(2, 3), (3, 6), (4, 7), (5, 11), (8, 15), (9, 20), (1024, 2047)])
def test_tree_row_count_and_sensitivity(n: int, rows: int) -> None:
    c = tree_strategy_matrix(n)
    k = math.ceil(math.log2(n))
    assert c.shape == (rows, n)
    # Every column lies in exactly one node per level: K + 1 ones.
    np.testing.assert_array_equal(c.sum(axis=0), np.full(n, k + 1))


@pytest.mark.parametrize("k", range(1, 9))
def test_tree_loss_closed_form(k: int) -> None:
    n = 2**k
    fact = build_strategy("tree", prefix_workload(n)).factorization
    assert fact.loss_total == pytest.approx((k + 1) * (k * 2 ** (k - 1) + 1), rel=1e-12)
    assert fact.sensitivity**2 == pytest.approx(k + 1, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 7, 8, 13, 64])
def test_tree_decoder_rows_are_binary_decompositions(n: int) -> None:
    b = tree_decoder(n)
    c = tree_strategy_matrix(n)
    for t in range(n):
        assert b[t].sum() == bin(t + 1).count("1")
        # The chosen nodes tile [0, t] exactly.
        np.testing.assert_array_equal(b[t] @ c, S(n)[t])


@pytest.mark.parametrize("n", [1, 0])
def test_tree_strategies_refuse_n_below_2(n: int) -> None:
    with pytest.raises(MfcliError, match="n >= 2"):
        tree_strategy_matrix(n)
    if n == 1:
        for name in TREE_STRATEGIES:
            with pytest.raises(MfcliError, match="binary tree needs n >= 2"):
                build_strategy(name, prefix_workload(1))


# --- Honaker -----------------------------------------------------------------------------------


def test_honaker_n2_matrices_from_brief() -> None:
    online = build_strategy("honaker-online", prefix_workload(2)).factorization.decoder
    full = build_strategy("honaker-full", prefix_workload(2)).factorization.decoder
    np.testing.assert_allclose(online, [[1, 0, 0], [1 / 3, 1 / 3, 2 / 3]], atol=1e-15)
    np.testing.assert_allclose(full, [[2 / 3, -1 / 3, 1 / 3], [1 / 3, 1 / 3, 2 / 3]], atol=1e-15)


def test_honaker_online_n4_last_row_by_hand() -> None:
    # Variances bottom-up: leaves 1, pairs V = 2 -> 2/3, root V = 4/3 -> 4/7. Weights on the
    # root 4/7, on each pair (3/7)(2/3) = 2/7, on each leaf (3/7)(1/3) = 1/7.
    b = honaker_online_decoder(4)
    # Rows in release order: l0, l1, [0,1], l2, l3, [2,3], [0,3]
    np.testing.assert_allclose(b[3], [1 / 7, 1 / 7, 2 / 7, 1 / 7, 1 / 7, 2 / 7, 4 / 7], atol=1e-15)
    np.testing.assert_allclose(b[1], [1 / 3, 1 / 3, 2 / 3, 0, 0, 0, 0], atol=1e-15)
    np.testing.assert_allclose(b[2], [1 / 3, 1 / 3, 2 / 3, 1, 0, 0, 0], atol=1e-15)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 16, 21, 32, 45, 64])
def test_honaker_online_equals_constrained_pseudo_inverse(n: int) -> None:
    """Row t is S_t C_t^+ with C_t the rows released by step t (the explicit definition)."""
    c = tree_strategy_matrix(n)
    release = tree_release_steps(n)
    b = honaker_online_decoder(n)
    for t in range(n):
        closed = release <= t
        expected = np.zeros(c.shape[0])
        expected[closed] = S(n)[t] @ np.linalg.pinv(c[closed])
        np.testing.assert_allclose(b[t], expected, atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 16, 21, 64])
def test_honaker_full_equals_pseudo_inverse(n: int) -> None:
    np.testing.assert_allclose(honaker_full_decoder(n), S(n) @ np.linalg.pinv(tree_strategy_matrix(n)), atol=1e-11)


@given(st.integers(min_value=2, max_value=300))
def test_per_step_error_ordering(n: int) -> None:
    """Minimum-norm properties: honaker-online row t is the least-norm decoder over the closed
    nodes, which the plain tree also uses; honaker-full is the least-norm over all nodes."""
    a = prefix_workload(n)
    tree, online, full = (build_strategy(s, a).factorization.per_step_error for s in TREE_STRATEGIES)
    assert np.all(online <= tree * (1 + 1e-12))
    assert np.all(full <= online * (1 + 1e-12))
    assert online[0] == pytest.approx(tree[0])  # only the first leaf is closed at step 0


# --- sqrt ----------------------------------------------------------------------------------------


def test_sqrt_coefficients_exact() -> None:
    coeffs = sqrt_coefficients(60)
    exact = [Fraction(math.comb(2 * k, k), 4**k) for k in range(60)]
    np.testing.assert_allclose(coeffs, [float(x) for x in exact], rtol=1e-14)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 100, 300])
def test_sqrt_sensitivity_and_square(n: int) -> None:
    fact = build_strategy("sqrt", prefix_workload(n)).factorization
    exact = sum(Fraction(math.comb(2 * k, k), 4**k) ** 2 for k in range(n))
    assert fact.sensitivity**2 == pytest.approx(float(exact), rel=1e-13)
    c = sqrt_strategy_matrix(n)
    np.testing.assert_allclose(c @ c, S(n), atol=1e-12 * n)
    # Loss = sens^2 ||C||_F^2 = sens^2 sum_k (n - k) c_k^2.
    frob = sum((n - k) * Fraction(math.comb(2 * k, k), 4**k) ** 2 for k in range(n))
    assert fact.loss_total == pytest.approx(float(exact * frob), rel=1e-12)


# --- identity, every strategy, post-processing -----------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 64, 500])
def test_identity_loss_prefix(n: int) -> None:
    fact = build_strategy("identity", prefix_workload(n)).factorization
    assert fact.loss_total == n * (n + 1) / 2
    assert fact.sensitivity == 1.0


def release_order_bruteforce_causal(c: np.ndarray, b: np.ndarray, release: np.ndarray) -> bool:
    for i in range(c.shape[0]):
        for j in range(c.shape[1]):
            if j > release[i] and c[i, j] != 0:
                return False
    for t in range(b.shape[0]):
        for i in range(b.shape[1]):
            if release[i] > t and b[t, i] != 0:
                return False
    return True


WORKLOADS = {
    "prefix": lambda n: prefix_workload(n),
    "momentum": lambda n: momentum_workload(n, beta=0.9),
    "cooldown": lambda n: build_workload("momentum", n, lr="cooldown"),
    "prefix-step-decay": lambda n: build_workload("prefix", n, lr="step-decay"),
}


@pytest.mark.parametrize("wname", sorted(WORKLOADS))
@pytest.mark.parametrize("n", [2, 5, 16])
@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_every_strategy_factorizes_and_causal_ones_stream(wname: str, n: int, name: str) -> None:
    w = WORKLOADS[wname](n)
    s = build_strategy(name, w, tol=1e-8)
    f = s.factorization
    np.testing.assert_allclose(f.decoder @ f.strategy, w.matrix, atol=1e-10 * np.abs(w.matrix).max())
    assert s.causal == (name != "honaker-full") == f.causal
    assert release_order_bruteforce_causal(f.strategy, f.decoder, s.release_steps) == s.causal
    if f.m == f.n:
        assert np.all(np.triu(f.strategy, 1) == 0) and np.all(np.triu(f.decoder, 1) == 0)


@pytest.mark.parametrize("name", ["tree", "honaker-online", "honaker-full", "sqrt"])
def test_post_processing_is_a_times_s_inverse(name: str) -> None:
    n = 24
    w = momentum_workload(n, beta=0.8)
    on_prefix = build_strategy(name, prefix_workload(n)).factorization
    on_a = build_strategy(name, w).factorization
    expected = w.matrix @ np.linalg.inv(S(n)) @ on_prefix.decoder
    np.testing.assert_allclose(on_a.decoder, expected, atol=1e-10)
    np.testing.assert_array_equal(on_a.strategy, on_prefix.strategy)


def test_optimal_prefix_64_and_beats_baselines() -> None:
    fact = build_strategy("optimal", prefix_workload(64), tol=1e-8).factorization
    assert fact.loss_total == pytest.approx(282.2014, abs=1e-3)  # docs/concepts.md, "Known small cases"
    w = momentum_workload(64)
    best = build_strategy("optimal", w, tol=1e-6).factorization.loss_total
    for name in ("identity", "tree", "honaker-online", "sqrt"):
        assert best < build_strategy(name, w).factorization.loss_total


def test_is_causal_in_release_order_detects_violations() -> None:
    c = tree_strategy_matrix(4)
    r = tree_release_steps(4)
    assert not is_causal_in_release_order(strategy=c, decoder=honaker_full_decoder(4), release_steps=r)
    assert is_causal_in_release_order(strategy=c, decoder=honaker_online_decoder(4), release_steps=r)
    early = r.copy()
    early[-1] = 2  # the root claims to close before its last column
    assert not is_causal_in_release_order(strategy=c, decoder=tree_decoder(4), release_steps=early)


def test_bad_names() -> None:
    with pytest.raises(MfcliError, match="unknown strategy 'trie'"):
        build_strategy("trie", prefix_workload(4))


# --- artifacts -----------------------------------------------------------------------------------


def test_save_and_reload_tree_baseline(tmp_path) -> None:
    w = momentum_workload(12)
    s = build_strategy("honaker-online", w)
    path = tmp_path / "honaker.h5"
    save_strategy(path, s, workload_name=w.name, workload_params=w.params)
    art = load_artifact(path)  # verifies checksums, sensitivity, loss and A = B C
    assert art.strategy_name == "honaker-online"
    assert art.factorization.loss_total == pytest.approx(s.factorization.loss_total, rel=1e-12)
    back = strategy_from_artifact(path, w.matrix)
    assert strategy_from_artifact(path, w).release_steps.tolist() == back.release_steps.tolist()  # a Workload too
    np.testing.assert_array_equal(back.release_steps, tree_release_steps(12))
    assert back.causal


def test_artifact_mismatch_is_refused(tmp_path) -> None:
    w = prefix_workload(8)
    path = tmp_path / "sqrt.h5"
    save_strategy(path, build_strategy("sqrt", w), workload_name=w.name)
    with pytest.raises(MfcliError, match="n = 8, the table's workload has n = 9"):
        strategy_from_artifact(path, prefix_workload(9).matrix)
    with pytest.raises(MfcliError, match="different workload"):
        strategy_from_artifact(path, momentum_workload(8).matrix)
    with pytest.raises(MfcliError, match="does not exist"):
        strategy_from_artifact(tmp_path / "missing.h5", w.matrix)
