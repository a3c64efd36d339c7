"""Newton on the fixed-epoch dual (mfcli.optimize.multi_fixed_epoch) behind multi_participation_factorization.

Oracles, none of them the method's own earlier output:

* the primal L-BFGS / truncated-Newton solver (``method="primal"``, a different algorithm with its
  own certificate): each certified bound lies below the other's loss, so the two optima agree
  within the gaps;
* k = 1 is the single-participation problem: :func:`mfcli.optimize.dense.optimal_factorization`;
* feasibility of the returned C from C itself: X = C^T C orthogonal within each class, class sums
  1, sensitivity 1 by :func:`mfcli.model.participation.sensitivity` and by brute force over every sign
  vector of every participation pattern (n <= 12);
* the dual gradient against central differences of g(W) = 2 tr((A W A^T)^1/2) - sum lambda (plain
  numpy eigenvalues), and the approximate Hessian against differences of that gradient (within the
  exponential-sum kernel's few per cent);
* the nuclear-norm lower bound against singular values.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from sensitivity_oracle import brute_sensitivity_squared
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, sensitivity
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.optimize.multi_fixed_epoch import (
    DUAL_METHOD,
    _cm_order,
    _evaluate,
    _Hessian,
    _project,
    _to_cm,
    nuclear_lower_bound,
)
from mfcli.optimize.multi_solver import multi_participation_factorization

runner = CliRunner()


def workload(name: str, n: int) -> np.ndarray:
    return prefix_workload(n).matrix if name == "prefix" else momentum_workload(n, beta=0.9).matrix


# (n, k): b = n / k includes odd and non-power-of-two b (3, 5, 10) and b = 1.
CASES = [(8, 2), (12, 3), (12, 4), (30, 3), (40, 8), (24, 12), (8, 8)]


@pytest.mark.parametrize(("n", "k"), CASES)
@pytest.mark.parametrize("name", ["prefix", "momentum"])
def test_dual_method_agrees_with_primal_solver(name, n, k):
    a = workload(name, n)
    schema = FixedEpoch(epochs=k)
    new = multi_participation_factorization(a, schema, tol=1e-8, threads=1)
    old = multi_participation_factorization(a, schema, tol=1e-8, threads=1, method="primal")
    assert new.converged and old.converged
    assert new.certificate()["method"] == DUAL_METHOD  # no primal fallback was needed
    assert -1e-12 <= new.gap <= 1e-8
    # Cross weak duality: each certified bound is below the other solver's feasible loss.
    assert new.dual <= old.loss_total * (1 + 1e-12)
    assert old.dual <= new.loss_total * (1 + 1e-12)
    assert new.loss_total == pytest.approx(old.loss_total, rel=2e-8)
    c, b = new.factorization.strategy, new.factorization.decoder
    assert np.allclose(b @ c, a, rtol=0, atol=1e-9 * np.abs(a).max())
    assert np.array_equal(c, np.tril(c))
    x = c.T @ c
    bb = n // k
    same = (np.arange(n)[:, None] % bb == np.arange(n)[None, :] % bb) & ~np.eye(n, dtype=bool)
    assert np.abs(x[same]).max(initial=0.0) <= 1e-9 * np.abs(np.diag(x)).max()  # orthogonal across epochs
    sums = np.bincount(np.arange(n) % bb, weights=np.diag(x))
    assert np.all(sums <= 1 + 1e-12) and np.allclose(sums, 1.0, rtol=1e-9)
    sens = sensitivity(c, schema)
    assert sens.exact and sens.value == pytest.approx(1.0, rel=1e-9) and new.sensitivity == sens.value
    if n <= 12:
        assert brute_sensitivity_squared(c, schema) == pytest.approx(1.0, rel=1e-9)
    assert new.loss_total == pytest.approx(new.sensitivity**2 * float(np.sum(b * b)), rel=1e-12)


@pytest.mark.parametrize("name", ["prefix", "momentum"])
def test_one_epoch_is_the_single_participation_optimum(name):
    """n = 256 runs the coarse-to-fine start (one coarse level of 128 steps)."""
    a = workload(name, 256)
    single = optimal_factorization(a, tol=1e-9, threads=1)
    res = multi_participation_factorization(a, FixedEpoch(epochs=1), tol=1e-8, threads=1)
    assert res.converged and res.certificate()["method"] == DUAL_METHOD
    assert res.dual <= single.primal * (1 + 1e-12) and single.dual <= res.loss_total * (1 + 1e-12)
    assert res.loss_total == pytest.approx(single.primal, rel=2e-8)


def test_coarse_start_with_several_epochs_against_primal_solver():
    """n = 256, 4 epochs of 64 steps: the coarse level merges steps within each epoch."""
    a = workload("prefix", 256)
    schema = FixedEpoch(epochs=4)
    new = multi_participation_factorization(a, schema, tol=1e-7, threads=1)
    old = multi_participation_factorization(a, schema, tol=1e-7, threads=1, method="primal")
    assert new.converged and new.certificate()["method"] == DUAL_METHOD
    assert new.dual <= old.loss_total * (1 + 1e-12) and old.dual <= new.loss_total * (1 + 1e-12)


def _dual_value(a: np.ndarray, w_nat: np.ndarray, k: int) -> float:
    """g(W) = 2 tr((A W A^T)^1/2) - sum of the class multipliers, by plain eigenvalues."""
    lam = np.linalg.eigvalsh(a @ w_nat @ a.T)
    return 2 * float(np.sum(np.sqrt(np.maximum(lam, 0.0)))) - float(np.trace(w_nat)) / k


def _natural(blocks: np.ndarray, k: int) -> np.ndarray:
    b = blocks.shape[0]
    n = b * k
    cm = np.zeros((n, n))
    for c in range(b):
        cm[c * k:(c + 1) * k, c * k:(c + 1) * k] = blocks[c]
    order = _cm_order(k, b)
    out = np.empty_like(cm)
    out[np.ix_(order, order)] = cm
    return out


def _random_dual_point(rng: np.random.Generator, b: int, k: int) -> np.ndarray:
    z = rng.standard_normal((b, k, k)) * 0.2
    w = _project(z)
    w[:, np.arange(k), np.arange(k)] = 0.0
    lo = np.linalg.eigvalsh(w).min(axis=1)
    w[:, np.arange(k), np.arange(k)] = (np.abs(lo) + rng.uniform(0.5, 2.0, b))[:, None]
    return w


@pytest.mark.parametrize(("n", "k"), [(12, 3), (15, 5), (8, 1)])
def test_gradient_and_hessian_against_differences(n, k):
    rng = np.random.default_rng(n + k)
    a = workload("momentum", n)
    b = n // k
    w = _random_dual_point(rng, b, k)
    gram_cm = _to_cm(a.T @ a, k, b)
    ev = _evaluate(gram_cm, w)
    assert ev is not None
    w = ev.w  # the rescaled point the gradient belongs to
    assert np.allclose(np.einsum("cii->ci", w), w[:, :1, 0])  # constant diagonal kept
    # the eigh dual estimate equals the bound formula at this W
    assert ev.dual == pytest.approx(_dual_value(a, _natural(w, k), k), rel=1e-10)
    d = _project(rng.standard_normal((b, k, k)))
    h = 1e-5 / float(np.abs(d).max()) * float(np.abs(w).max())
    fd = (_dual_value(a, _natural(w + h * d, k), k) - _dual_value(a, _natural(w - h * d, k), k)) / (2 * h)
    assert float(np.vdot(ev.grad, d)) == pytest.approx(fd, rel=1e-6)
    # minus the Hessian in direction d, by differences of the exact gradient
    ep, em = _evaluate(gram_cm, w + h * d), _evaluate(gram_cm, w - h * d)

    def raw_grad(e):  # gradient without the rescaling _evaluate applies (grad scales as c^-1/2)
        c = float(e.w[0, 0, 0] / (w + h * d if e is ep else w - h * d)[0, 0, 0])
        return (e.grad + np.eye(k)[None] / k) * np.sqrt(c) - np.eye(k)[None] / k

    hd_fd = -(raw_grad(ep) - raw_grad(em)) / (2 * h)
    hd = _Hessian(ev, None).apply(d)
    assert float(np.vdot(d, hd)) > 0
    assert float(np.vdot(d, hd)) == pytest.approx(float(np.vdot(d, hd_fd)), rel=0.06)
    assert np.linalg.norm(hd - hd_fd) <= 0.1 * np.linalg.norm(hd_fd)


@settings(max_examples=30, deadline=None)
@given(seed=hst.integers(0, 2**31 - 1), n=hst.integers(2, 30), noise=hst.sampled_from([0.0, 1e-8, 1e-4, 1e-2]))
def test_nuclear_lower_bound_is_below_singular_values(seed, n, noise):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n, n)) * np.exp(rng.uniform(-8, 8, n))[None, :]
    _, _, vt = np.linalg.svd(k)
    q = np.linalg.qr(vt.T + noise * rng.standard_normal((n, n)))[0]  # near the right singular vectors
    bound = nuclear_lower_bound(k @ q)
    truth = float(np.linalg.svd(k, compute_uv=False).sum())
    if bound is not None:
        assert bound <= truth * (1 + 1e-12)
    if noise == 0.0:
        assert bound is not None and bound == pytest.approx(truth, rel=1e-8)


def test_method_argument():
    a = workload("prefix", 8)
    with pytest.raises(MfcliError, match="method must be"):
        multi_participation_factorization(a, FixedEpoch(epochs=2), method="newton")
    from mfcli.model.participation import MinSeparation

    with pytest.raises(MfcliError, match="dual method needs a fixed-epoch"):
        multi_participation_factorization(a, MinSeparation(separation=2), method="dual")


def test_cli_epochs_json_records_the_dual_method(tmp_path):
    out = tmp_path / "fe.h5"
    r = runner.invoke(app, ["optimize", "--n", "36", "--epochs", "4", "--workload", "momentum",
                            "--tol", "1e-8", "--out", str(out), "--json", "-q"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["converged"] and obj["gap"] <= 1e-8 and obj["dual"] <= obj["loss"]["total"]
    assert obj["sensitivity"] == pytest.approx(1.0, rel=1e-12)
    from mfcli.io.artifact import load_artifact

    art = load_artifact(out)
    assert art.attrs["solver"]["method"] == DUAL_METHOD
    old = multi_participation_factorization(art.factorization.workload, FixedEpoch(epochs=4), tol=1e-8,
                                            method="primal")
    assert obj["dual"] <= old.loss_total * (1 + 1e-12) and old.dual <= obj["loss"]["total"] * (1 + 1e-12)


def test_primal_solver_continues_when_the_dual_method_stops_short(monkeypatch):
    """A dual run cut off after its first iteration (as a stall would) hands its X to the primal
    solver; the result is certified to tol and keeps the better bound."""
    import mfcli.optimize.multi_fixed_epoch as fe

    monkeypatch.setattr(fe._Walker, "next", lambda self, ev: None)
    a = workload("momentum", 24)
    schema = FixedEpoch(epochs=3)
    res = multi_participation_factorization(a, schema, tol=1e-8, threads=1)
    assert res.converged and res.gap <= 1e-8
    assert res.certificate()["method"].startswith(DUAL_METHOD + "+lbfgs")
    assert res.history[0].method == DUAL_METHOD and res.history[-1].method != DUAL_METHOD
    old = multi_participation_factorization(a, schema, tol=1e-8, threads=1, method="primal")
    assert res.dual <= old.loss_total * (1 + 1e-12) and old.dual <= res.loss_total * (1 + 1e-12)
    assert sensitivity(res.factorization.strategy, schema).value == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("fail", ["second", "always"])
def test_trial_points_that_cannot_be_evaluated(monkeypatch, fail):
    """A trial W whose Cholesky fails is replaced by a shorter step; if not even the start can be
    evaluated, the primal solver runs instead. Either way the answer is certified."""
    import mfcli.optimize.multi_fixed_epoch as fe

    calls = []
    real = fe._evaluate

    def flaky(gram_cm, w):
        calls.append(1)
        if fail == "always" or len(calls) == 2:
            return None
        return real(gram_cm, w)

    monkeypatch.setattr(fe, "_evaluate", flaky)
    a = workload("prefix", 24)
    res = multi_participation_factorization(a, FixedEpoch(epochs=3), tol=1e-8, threads=1)
    assert res.converged and res.gap <= 1e-8
    method = res.certificate()["method"]
    assert method == (DUAL_METHOD if fail == "second" else "lbfgs-newton-fixed-epoch")
    assert sensitivity(res.factorization.strategy, FixedEpoch(epochs=3)).value == pytest.approx(1.0, rel=1e-12)
