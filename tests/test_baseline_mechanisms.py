"""The baselines as mechanisms of any n (mfcli.strategies.baseline_mechanisms), tested against
independent derivations: the dense matrices of mfcli.strategies.baselines with
mfcli.model.participation.sensitivity (brute force over the patterns at small n), closed forms
from the literature for n = 2^k (the tree's total variance, Honaker's estimator variances from the
algebra of the tree's Gram matrix), and the noise the dense decoder streams from the same rows."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from accounting_oracles import gaussian_delta
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation, sensitivity
from mfcli.strategies.baseline_mechanisms import TreeMechanism, baseline_mechanism
from mfcli.strategies.baselines import build_strategy
from mfcli.strategies.operators import DenseOperator, MatrixStrategy, Mechanism
from mfcli.strategies.toeplitz import materialize, toeplitz_workload
from mfcli.util.limits import STRUCTURED_DENSE_MAX_N

BASELINES = ("identity", "tree", "honaker-online", "honaker-full", "sqrt")
PREFIX = toeplitz_workload("prefix")
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


MOMENTUM = toeplitz_workload("momentum", beta=0.7)


def dense(name: str, workload, n: int):
    """The dense factorization mfcli.strategies.baselines builds (verified A = B C)."""
    return build_strategy(name, materialize(workload.coefs(n), n)).factorization


def schemas(n: int):
    yield SingleParticipation()
    for k in (2, 3, n):
        if n % k == 0 and k > 1:
            yield FixedEpoch(epochs=k)
    if n <= 64:  # the dense min-sep sensitivity enumerates patterns
        yield MinSeparation(separation=max(1, n // 3))


@pytest.mark.parametrize("workload", [PREFIX, MOMENTUM], ids=["prefix", "momentum"])
@pytest.mark.parametrize("n", [2, 3, 7, 8, 64, 1000])
@pytest.mark.parametrize("name", BASELINES)
def test_losses_and_sensitivities_match_the_dense_matrices(name, n, workload):
    mech = baseline_mechanism(name, workload, n)
    assert isinstance(mech, Mechanism) and mech.kind == name and mech.n == n
    fact = dense(name, workload, n)
    unit = np.sum(fact.decoder**2, axis=1)
    for schema in schemas(n):
        loss = mech.loss(schema=schema)
        want = sensitivity(fact.strategy, schema)
        assert loss.sensitivity.value == pytest.approx(want.value, rel=1e-12)
        assert loss.sensitivity.value >= want.value * (1 - 1e-15)  # a guarantee rounds up
        assert loss.sensitivity.exact == want.exact
        np.testing.assert_allclose(loss.unit, unit, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(loss.per_step, want.value**2 * unit, rtol=1e-10, atol=1e-12)
    assert mech.rows == fact.m and mech.sensitivity == pytest.approx(fact.sensitivity, rel=1e-15)
    np.testing.assert_array_equal(mech.accounting_matrix(), fact.strategy)
    np.testing.assert_array_equal(mech.release_steps, build_strategy(name, fact.workload).release_steps)
    assert mech.is_tree == (name in ("tree", "honaker-online", "honaker-full"))


def honaker_full_complete(n: int) -> np.ndarray:
    """Var of the full Honaker (least squares) prefix estimate for n = 2^k, unit noise, derived
    here from the Gram matrix alone: X = C^T C = sum_l E_l with E_l = blockdiag(J_{2^l}) = 2^l P_l,
    P_l the projection onto vectors constant on the level-l blocks (nested: P_l P_m = P_max).
    With Q_m = P_m - P_{m+1} (Q_k = P_k) orthogonal, X = sum_m (2^{m+1} - 1) Q_m, so
    x^T X^-1 x = sum_m (||P_m x||^2 - ||P_{m+1} x||^2) / (2^{m+1} - 1); for x = 1_[0, t],
    ||P_l x||^2 = floor((t + 1) / 2^l) 2^l + ((t + 1) mod 2^l)^2 / 2^l."""
    k = int(math.log2(n))
    t1 = np.arange(1, n + 1, dtype=np.float64)

    def p2(lvl: int) -> np.ndarray:
        if lvl > k:
            return np.zeros(n)
        w = 2.0**lvl
        return np.floor(t1 / w) * w + np.mod(t1, w) ** 2 / w

    return sum((p2(m) - p2(m + 1)) / (2.0 ** (m + 1) - 1) for m in range(k + 1))


def honaker_online_complete(n: int) -> np.ndarray:
    """Streaming Honaker for n = 2^k: a complete level-l subtree's estimate has variance
    a_l = 2^l / (2^(l+1) - 1) (1 / a_l = 1 / (2 a_{l-1}) + 1, a_0 = 1), one per set bit of t + 1."""
    t1 = np.arange(1, n + 1)
    return sum(((t1 >> lvl) & 1) * 2.0**lvl / (2.0 ** (lvl + 1) - 1) for lvl in range(int(math.log2(n)) + 1))


@pytest.mark.parametrize("n", [64, 2**16, 2**20])
def test_closed_forms_for_complete_trees_beyond_the_dense_limit(n):
    k = int(math.log2(n))
    tree = baseline_mechanism("tree", PREFIX, n).loss()
    # sum_{t=1}^{2^k} popcount(t) = k 2^(k-1) + 1 nodes used, each at variance K + 1
    assert tree.total == pytest.approx((k + 1) * (k * 2 ** (k - 1) + 1), rel=1e-13)
    assert tree.sensitivity.value == pytest.approx(math.sqrt(k + 1), rel=1e-15) and tree.sensitivity.exact
    full = baseline_mechanism("honaker-full", PREFIX, n).loss()
    np.testing.assert_allclose(full.unit, honaker_full_complete(n), rtol=1e-11)
    online = baseline_mechanism("honaker-online", PREFIX, n).loss()
    np.testing.assert_allclose(online.unit, honaker_online_complete(n), rtol=1e-12)
    if n <= 64:  # the oracles themselves against the dense decoders
        np.testing.assert_allclose(honaker_full_complete(n), np.sum(dense("honaker-full", PREFIX, n).decoder ** 2, 1),
                                   rtol=1e-12)
        np.testing.assert_allclose(honaker_online_complete(n),
                                   np.sum(dense("honaker-online", PREFIX, n).decoder ** 2, 1), rtol=1e-12)
    # every step in one epoch-residue pattern (b = 1): ||C 1||^2 = sum_l 2^(k-l) 4^l
    every = baseline_mechanism("tree", PREFIX, n).schema_sensitivity(FixedEpoch(epochs=n))
    assert every.value**2 == pytest.approx(2**k * (2 ** (k + 1) - 1), rel=1e-15) and every.exact


def test_sqrt_and_identity_at_a_million_steps():
    n = 10**6
    sq = baseline_mechanism("sqrt", PREFIX, n)
    c = np.array([math.comb(2 * j, j) / 4**j for j in range(600)])  # binom(2j, j) / 4^j in integers
    loss = sq.loss(schema=FixedEpoch(epochs=4))
    # B = S^1/2 for prefix sums: ||B[t, :]||^2 = sum_{j <= t} c_j^2
    np.testing.assert_allclose(loss.unit[:600], np.cumsum(c * c), rtol=1e-12)
    assert loss.sensitivity.exact and np.all(np.diff(loss.unit) >= 0)
    ident = baseline_mechanism("identity", MOMENTUM, n).loss(schema=MinSeparation(separation=1000))
    a = (1 - 0.7 ** np.arange(1, n + 1)) / 0.3
    # (rounding: n = 10^6 terms of a recursion against the closed form)
    assert ident.total == pytest.approx(ident.sensitivity.value**2 * float(np.dot(np.arange(n, 0, -1), a * a)),
                                        rel=1e-10)
    assert ident.sensitivity.value == pytest.approx(math.sqrt(1000), rel=1e-12) and ident.sensitivity.exact


def test_what_has_no_exact_number_above_the_limit_is_refused_in_one_line():
    n = STRUCTURED_DENSE_MAX_N + 1
    tree = baseline_mechanism("tree", PREFIX, n)
    with pytest.raises(MfcliError, match=f"has no closed form.*n <= {STRUCTURED_DENSE_MAX_N} only"):
        tree.loss(schema=MinSeparation(separation=100))
    with pytest.raises(MfcliError, match="closed form for the prefix workload only"):
        baseline_mechanism("honaker-full", MOMENTUM, n).loss()
    with pytest.raises(MfcliError, match="needs a square"):
        tree.cyclic_numbers(SingleParticipation())
    assert tree.accounting_matrix() is None and "n <= 8192 only" in tree.matrix_refusal("mmcc")
    with pytest.raises(MfcliError, match="no baseline with a form of any n"):
        baseline_mechanism("optimal", PREFIX, 16)
    with pytest.raises(MfcliError, match="n >= 2"):
        baseline_mechanism("tree", PREFIX, 1)


def test_every_kind_has_a_loss():
    n = 16
    fact = dense("sqrt", PREFIX, n)
    op = DenseOperator(fact)
    loss = op.loss(schema=FixedEpoch(epochs=2))
    assert loss.total == pytest.approx(sensitivity(fact.strategy, FixedEpoch(epochs=2)).value ** 2
                                       * float(np.sum(fact.decoder**2)), rel=1e-12)
    assert op.loss().total == pytest.approx(fact.loss_total, rel=1e-15)
    with pytest.raises(MfcliError, match="another workload"):
        op.loss(np.eye(n))
    with pytest.raises(MfcliError, match="needs the decoder B"):
        MatrixStrategy(fact.strategy, np.arange(n)).loss()
    # the sqrt mechanism from its first column and the dense root of the same matrices agree
    assert baseline_mechanism("sqrt", PREFIX, n).loss().total == pytest.approx(op.loss().total, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# The tree's noise stream: O(log n) rows of state, the same rows as the dense decoder's stream


def stream_rows(op, n, *, start=None, d=3, seed=20261202):
    from mfcli.training.noise import _stream_of

    s = _stream_of(op, kind="iterate", d=d, seed=seed, dtype=np.dtype("float64"), threads=1, max_memory=None,
                   where="test", workload_name="w", workload_params={})
    state = s.init() if start is None else s.state_at(start)
    out = []
    for _ in range(n - (start or 0)):
        row, state = s.next(state)
        out.append(row)
    return np.array(out), s


@pytest.mark.parametrize("workload", [PREFIX, MOMENTUM], ids=["prefix", "momentum"])
@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 64])
def test_tree_stream_equals_the_dense_decoder_stream(n, workload):
    tree = baseline_mechanism("tree", workload, n)
    got, stream = stream_rows(tree, n)
    want, _ = stream_rows(DenseOperator(dense("tree", workload, n)), n)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert stream.width == 0 and stream.rank == (n - 1).bit_length() + 1 + (workload.name == "momentum")
    resumed, _ = stream_rows(tree, n, start=n // 2)
    np.testing.assert_allclose(resumed, got[n // 2:], rtol=1e-12, atol=1e-12)
    with pytest.raises(MfcliError, match="needs a square strategy"):
        tree.streaming("gradient")


def test_tree_stream_at_a_million_steps_keeps_log_n_rows():
    tree = baseline_mechanism("tree", PREFIX, 10**6)
    matrix = tree.streaming("iterate").matrix
    assert matrix.width + matrix.rank == 21  # K + 1 = 21 levels, nothing else
    assert isinstance(tree, TreeMechanism) and tree.max_n["stream"] is None


# ---------------------------------------------------------------------------------------------
# The mechanism is all account needs (library): a tree at n = 65536


def test_account_takes_a_tree_mechanism_beyond_the_dense_limit():
    from mfcli.services.account import StrategyInput, account

    n = 2**16
    mech = baseline_mechanism("tree", PREFIX, n)
    inp = StrategyInput(name="tree", strategy=np.zeros((0, 0)), release_steps=np.zeros(0, dtype=np.int64),
                        source="tree", is_tree=True, mechanism=mech)
    report = account(inp, sigma=8.0, sampling=None, participation=FixedEpoch(epochs=4), settings=["deterministic"])
    sens = mech.schema_sensitivity(FixedEpoch(epochs=4)).value
    eps = report.rows["deterministic"]["epsilon"]
    assert gaussian_delta(eps, sens / 8.0) <= 1e-6 * (1 + 1e-6)
    assert gaussian_delta(eps * (1 - 1e-3), sens / 8.0) > 1e-6


# ---------------------------------------------------------------------------------------------
# compare above the dense limit


def test_compare_beyond_the_dense_limit_lists_every_baseline_but_optimal():
    n = 2**16
    r = run("compare", "--n", n, "--strategies", "identity,tree,honaker-online,honaker-full,sqrt", "--format",
            "json", "-q")
    assert r.exit_code == 0, r.output
    rows = {s["name"]: s for s in json.loads(r.stdout)["strategies"]}
    assert list(rows) == ["identity", "tree", "honaker-online", "honaker-full", "sqrt"]
    assert rows["tree"]["loss_total"] == pytest.approx(17 * (16 * 2**15 + 1), rel=1e-13)
    assert rows["honaker-full"]["loss_mean"] == pytest.approx(17 * float(np.mean(honaker_full_complete(n))), rel=1e-11)
    assert rows["honaker-full"]["causal"] is False and rows["honaker-online"]["causal"] is True
    assert json.loads(r.stdout)["best_causal"] == "sqrt"


@pytest.mark.parametrize("args, match", [
    (["--strategies", "optimal"], "optimal is a dense solve"),
    (["--strategies", "tree", "--min-sep", "100"], "has no closed form"),
    (["--strategies", "honaker-online", "--workload", "momentum"], "prefix workload only"),
])
def test_compare_beyond_the_dense_limit_refuses_in_one_line(args, match):
    r = run("compare", "--n", 20_000, *args, "-q")
    assert r.exit_code in (1, 2) and r.stderr.strip().startswith("error:") and match in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["tree", "honaker-online", "honaker-full"])
def test_momentum_with_beta_zero_is_the_prefix_sum(name: str) -> None:
    """beta = 0 makes momentum the prefix sum; its filter's denominator carries a trailing zero
    (1, -1, 0), which once crashed the tree's closed form with a shape error."""
    n = 1000
    zero = baseline_mechanism(name, toeplitz_workload("momentum", beta=0.0), n).loss()
    prefix = baseline_mechanism(name, PREFIX, n).loss()
    assert zero.total == pytest.approx(prefix.total, rel=1e-12)
    r = run("compare", "--n", 10_000, "-w", "momentum", "--beta", 0, "-s", "tree", "--format", "json", "-q")
    assert r.exit_code == 0, r.output
