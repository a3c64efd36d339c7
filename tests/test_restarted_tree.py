"""The binary tree (and the Honaker estimators) restarted every epoch, as a mechanism of any n
(``TreeMechanism`` and ``HonakerMechanism`` with ``epochs=e``, what ``mfcli plan``'s tree rows run), against independent
derivations: the dense matrices built here from their definitions at small n (C = blockdiag of
one tree's encoder, B = A blockdiag(S^-1 B_e), A from the momentum recursion), brute-force
sensitivities, and at large n the prefix sums' closed form (row t = E s + tau of a tree on
s = 2^k leaves: popcount(tau + 1) + E, since each finished epoch's total is the root)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sensitivity_oracle import brute_sensitivity
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, SingleParticipation
from mfcli.schemas import load_schema, validate
from mfcli.services.plan import TrainingSetup, enumerate_candidates, evaluate, tree_mechanism, tree_spectral_upper
from mfcli.strategies.baseline_mechanisms import baseline_mechanism
from mfcli.strategies.baselines import build_strategy, tree_strategy_matrix
from mfcli.strategies.toeplitz import toeplitz_workload
from mfcli.strategies.tree_error import tree_fixed_epoch_sensitivity, tree_gram_row_sum

WORKLOADS = [toeplitz_workload("prefix"), toeplitz_workload("momentum", beta=0.9),
             toeplitz_workload("momentum", beta=0.5)]


def workload_matrix(n: int, beta: float) -> np.ndarray:
    """A of n steps from its definition: a_t = sum_{u <= t} beta^u, lower-triangular Toeplitz
    (beta = 0: the prefix sums)."""
    col = np.cumsum(beta ** np.arange(n, dtype=np.float64))
    i, j = np.indices((n, n))
    return np.where(i >= j, col[np.clip(i - j, 0, None)], 0.0)


def restarted_dense(name: str, s: int, epochs: int, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, C, B) of the tree kind ``name`` on s leaves restarted for ``epochs`` epochs, dense."""
    b_e = np.asarray(build_strategy(name, np.tril(np.ones((s, s)))).factorization.decoder)  # prefix decoder
    m = np.vstack([b_e[:1], np.diff(b_e, axis=0)])
    a = workload_matrix(s * epochs, beta)
    eye = np.eye(epochs)
    return a, np.kron(eye, tree_strategy_matrix(s)), a @ np.kron(eye, m)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: f"{w.name}-{w.beta}")
@pytest.mark.parametrize("name", ["tree", "honaker-online", "honaker-full"])
@pytest.mark.parametrize(("s", "epochs"), [(2, 3), (5, 3), (8, 4), (10, 2), (13, 5)])
def test_restarted_losses_match_the_dense_matrices(name: str, workload, s: int, epochs: int) -> None:
    beta = 0.0 if workload.name == "prefix" else float(workload.beta)
    a, c, b = restarted_dense(name, s, epochs, beta)
    np.testing.assert_allclose(b @ c, a, atol=1e-9)  # the dense pair is a factorization of A
    mech = baseline_mechanism(name, workload, s * epochs, epochs=epochs)
    np.testing.assert_array_equal(mech.dense_strategy(), c)
    loss = mech.loss(schema=FixedEpoch(epochs=epochs))
    np.testing.assert_allclose(loss.unit, np.sum(b * b, axis=1), rtol=1e-11)
    # the fixed-epoch schema sensitivity: each epoch's column lies in K + 1 nodes of its own tree
    assert loss.sensitivity.exact
    assert loss.sensitivity.value == pytest.approx(math.sqrt(epochs * ((s - 1).bit_length() + 1)), rel=1e-15)
    assert mech.sensitivity == pytest.approx(math.sqrt((s - 1).bit_length() + 1), rel=1e-15)
    assert mech.rows == c.shape[0] and not mech.is_tree


@pytest.mark.parametrize(("s", "restarts", "epochs"), [(4, 2, 2), (6, 2, 4), (4, 4, 2), (3, 4, 4), (8, 2, 4)])
def test_restarted_fixed_epoch_sensitivity_by_brute_force(s: int, restarts: int, epochs: int) -> None:
    """Schemas whose epochs differ from the restarts too: the exact count against brute force
    over every pattern and sign on the dense blockdiag C."""
    n = s * restarts
    c = np.kron(np.eye(restarts), tree_strategy_matrix(s))
    sens2, _ = tree_fixed_epoch_sensitivity(n, epochs, period=s)
    assert math.sqrt(sens2) == pytest.approx(brute_sensitivity(c, FixedEpoch(epochs=epochs)), rel=1e-12)


@pytest.mark.parametrize("k", [14, 16])
@pytest.mark.parametrize("epochs", [1, 3, 8])
def test_restarted_prefix_tree_closed_form_beyond_the_dense_limit(k: int, epochs: int) -> None:
    s = 1 << k
    mech = baseline_mechanism("tree", toeplitz_workload("prefix"), s * epochs, epochs=epochs)
    unit = mech.loss().unit
    tau = np.arange(s)
    popcount = np.array([bin(t + 1).count("1") for t in tau], dtype=np.float64)
    want = np.concatenate([popcount + e for e in range(epochs)])
    np.testing.assert_array_equal(unit, want)
    # the total: e (k 2^(k-1) + 1) per-epoch trees plus s e (e - 1) / 2 finished-epoch roots
    assert float(np.sum(unit)) == epochs * (k * 2 ** (k - 1) + 1) + s * epochs * (epochs - 1) / 2


def test_restarted_honaker_prefix_beyond_the_dense_limit_adds_the_root_per_finished_epoch() -> None:
    """Honaker online on prefix sums: row t = E s + tau is one tree's row tau plus E times the
    variance of the root's estimate (the last row of one tree), checked against the single tree."""
    s, epochs = 10_000, 3
    one = baseline_mechanism("honaker-online", toeplitz_workload("prefix"), s).loss().unit
    got = baseline_mechanism("honaker-online", toeplitz_workload("prefix"), s * epochs, epochs=epochs).loss().unit
    np.testing.assert_allclose(got, np.concatenate([one + e * one[-1] for e in range(epochs)]), rtol=1e-14)


@pytest.mark.parametrize("s", [*range(2, 40), 64, 100, 128, 255])
def test_tree_gram_bound_is_a_spectral_upper_bound(s: int) -> None:
    c = tree_strategy_matrix(s)
    top = float(np.linalg.norm(c, 2)) ** 2
    bound = tree_gram_row_sum(s)
    assert bound >= top * (1 - 1e-12)
    if s & (s - 1) == 0:
        assert bound == 2 * s - 1 and top == pytest.approx(bound, rel=1e-10)


def test_restarted_tree_refusals_in_one_line() -> None:
    wl = toeplitz_workload("momentum", beta=0.9)
    with pytest.raises(MfcliError, match="dividing n"):
        baseline_mechanism("tree", wl, 10, epochs=3)
    with pytest.raises(MfcliError, match="not restarted per epoch"):
        baseline_mechanism("sqrt", wl, 10, epochs=2)
    with pytest.raises(MfcliError, match="no noise stream"):
        baseline_mechanism("tree", wl, 10, epochs=2).streaming("iterate")
    big = baseline_mechanism("honaker-online", wl, 2 * 10_000, epochs=2)
    with pytest.raises(MfcliError, match="closed form for the prefix workload only"):
        big.loss()


def test_plan_tree_rows_beyond_the_dense_limit() -> None:
    """plan at n = 10^4 (100 epochs of 100 steps) shows the tree and Honaker rows, each from the
    restarted tree: the fixed-order sensitivity sqrt(e (K + 1)) and the RMSE of the closed form
    (prefix: row E s + tau has ||B[t]||^2 = ||B_e[tau]||^2 + E popcount(s))."""
    setup = TrainingSetup(examples=1000, batch=10, epochs=100, epsilon=4.0, batching=("fixed-order",))
    assert setup.n == 10_000
    cands = {c.key: c for c in enumerate_candidates(setup)[0]}
    tree = evaluate(setup, cands["tree"])
    honaker = evaluate(setup, cands["honaker"])
    s, e = 100, 100
    assert tree.sensitivity == pytest.approx(math.sqrt(e * 8), rel=1e-15)  # K + 1 = ceil(log2 100) + 1 = 8
    _, _, b = restarted_dense("tree", s, 2, 0.0)  # rows of the first two epochs, dense
    first = np.sum(b[:s] ** 2, axis=1)
    last = float(np.sum(b[s - 1] ** 2))
    rows = np.concatenate([first + ep * last for ep in range(e)])
    assert tree.rmse_mean == pytest.approx(tree.sigma * math.sqrt(float(np.mean(rows))), rel=1e-12)
    assert tree.rmse_max == pytest.approx(tree.sigma * math.sqrt(float(rows.max())), rel=1e-12)
    assert honaker.sigma == tree.sigma and honaker.rmse_mean < tree.rmse_mean
    assert tree.spectral_norm == pytest.approx(tree_spectral_upper(tree_mechanism(setup, "tree")))


def test_plan_says_why_a_row_it_cannot_compute_is_missing() -> None:
    """One epoch of 10^4 steps on momentum: the tree row in closed form, Honaker skipped with the
    mechanism's reason (no closed form on momentum above the dense limit)."""
    setup = TrainingSetup(examples=10_000, batch=1, epochs=1, epsilon=4.0, workload="momentum",
                          batching=("fixed-order",))
    cands = {c.key: c for c in enumerate_candidates(setup)[0]}
    tree = evaluate(setup, cands["tree"])
    assert tree.sensitivity == pytest.approx(math.sqrt(15), rel=1e-15)  # ceil(log2 10^4) + 1
    mech = tree_mechanism(setup, "tree")
    assert tree.rmse_mean == pytest.approx(
        tree.sigma * math.sqrt(float(np.mean(mech.loss(schema=SingleParticipation()).unit))), rel=1e-14)
    skipped = evaluate(setup, cands["honaker"])
    assert "closed form for the prefix workload only" in getattr(skipped, "reason", "")
    # above the dense limit the spectral bound comes from the Gram row sums, without the matrix
    assert tree.spectral_norm == pytest.approx(math.sqrt(tree_gram_row_sum(10_000)), rel=1e-15)


def test_restarted_momentum_tree_beyond_the_dense_limit_by_direct_recursion() -> None:
    """Momentum (beta = 0.9), 2 epochs of s = 8200 > 8192 steps: ||B[t, :]||^2 against B built
    here row by row from the definition, B = P R with P = 1 / (1 - beta z) (B[t] = beta B[t-1] +
    R[t]) and R[t] the indicator of the nodes the prefix estimate at t uses: the minimal dyadic
    decomposition of the current epoch's [0, tau] (one node per set bit l of tau + 1, node
    ((tau + 1) >> l) - 1 of level l) plus, for each finished epoch, the decomposition of its [0, s-1]."""
    s, epochs, beta = 8200, 2, 0.9
    levels = (s - 1).bit_length() + 1
    offset = np.concatenate([[0], np.cumsum([-(-s // (1 << lvl)) for lvl in range(levels)])])  # nodes per level
    per_epoch = int(offset[-1])

    def dec(tau: int, ep: int) -> list[int]:
        return [ep * per_epoch + int(offset[lvl]) + ((tau + 1) >> lvl) - 1 for lvl in range(levels)
                if (tau + 1) >> lvl & 1]

    row = np.zeros(epochs * per_epoch)
    want = np.empty(s * epochs)
    for t in range(s * epochs):
        ep, tau = divmod(t, s)
        row *= beta
        for e in range(ep):
            row[dec(s - 1, e)] += 1.0
        row[dec(tau, ep)] += 1.0
        want[t] = row @ row
    got = baseline_mechanism("tree", toeplitz_workload("momentum", beta=beta), s * epochs, epochs=epochs).loss().unit
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_cli_plan_shows_the_tree_rows_beyond_the_dense_limit() -> None:
    """``mfcli plan`` at n = 20000 (2 epochs of 10^4 steps, prefix): the tree and Honaker rows are
    in the JSON (it validates), with the schema sensitivity sqrt(2 x 15) and the tree's RMSE from
    the closed form (row E s + tau: popcount(tau + 1) + E popcount(s), popcount(10^4) = 5)."""
    r = CliRunner().invoke(app, ["plan", "--examples", "10000", "--batch", "1", "--epochs", "2", "--epsilon", "4",
                                 "--batching", "fixed-order", "--bands", "2", "--buffers", "2", "--workers", "0",
                                 "--json", "-q"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert validate(obj, load_schema("plan")) == []
    rows = {c["candidate"]: c for c in obj["candidates"]}
    assert {"tree", "honaker"} <= set(rows)
    tree = rows["tree"]
    assert tree["sensitivity"] == pytest.approx(math.sqrt(2 * 15), rel=1e-15)
    s = 10_000
    pop = np.array([bin(t + 1).count("1") for t in range(s)], dtype=np.float64)
    unit = np.concatenate([pop, pop + bin(s).count("1")])
    assert tree["rmse_mean"] == pytest.approx(tree["noise_std"] * math.sqrt(float(np.mean(unit))), rel=1e-12)
    assert rows["honaker"]["rmse_mean"] < tree["rmse_mean"]
