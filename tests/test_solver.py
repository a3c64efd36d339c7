"""Optimal solver against independent oracles: closed forms, a second optimiser, baselines."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
from hypothesis import given, settings
from hypothesis import strategies as st

from mfcli.errors import MfcliError
from mfcli.model.factorization import is_lower_triangular
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization

GOLDEN_SQ = ((1 + math.sqrt(5)) / 2) ** 2


@pytest.mark.parametrize("method", ["anderson", "fixed-point"])
def test_n2_prefix_is_golden_ratio_squared(method):
    res = optimal_factorization(prefix_workload(2).matrix, tol=1e-12, method=method)
    assert res.factorization.loss_total == pytest.approx(GOLDEN_SQ, rel=1e-11)
    assert res.dual <= GOLDEN_SQ * (1 + 1e-12)


@pytest.mark.parametrize("method", ["anderson", "fixed-point"])
def test_n64_prefix_known_optimum(method):
    res = optimal_factorization(prefix_workload(64).matrix, tol=1e-8, method=method, max_iter=5000)
    assert res.gap <= 1e-8
    f = res.factorization
    assert f.loss_total == pytest.approx(282.2014, abs=5e-5)
    assert f.loss_mean == pytest.approx(4.4094, abs=5e-5)


def _sqrt_toeplitz(n: int) -> np.ndarray:
    # binom(2k, k) / 4^k via scipy's exact binomials, independent of mfcli.strategies.baselines.
    coef = np.array([scipy.special.comb(2 * k, k, exact=True) / 4**k for k in range(n)], dtype=float)
    return scipy.linalg.toeplitz(coef, np.zeros(n))


@pytest.mark.parametrize("n", [1, 2, 5, 16, 33])
def test_optimal_beats_sqrt_beats_identity(n):
    a = prefix_workload(n).matrix
    opt = optimal_factorization(a, tol=1e-9).factorization.loss_total
    c = _sqrt_toeplitz(n)
    sqrt_loss = np.max(np.sum(c**2, axis=0)) * np.sum(c**2)  # B = C = S^1/2
    identity = n * (n + 1) / 2
    assert opt <= sqrt_loss * (1 + 1e-9)
    assert sqrt_loss <= identity * (1 + 1e-12)
    if n == 1:
        assert opt == pytest.approx(1.0)


def _independent_optimum(a: np.ndarray) -> float:
    """min tr(A^T A X^-1) over correlation matrices X = W L L^T W, W = diag(L L^T)^-1/2,
    by L-BFGS with an analytic gradient; a different route from the fixed point."""
    n = a.shape[0]
    gram = a.T @ a
    il = np.tril_indices(n)

    def f(theta):
        low = np.zeros((n, n))
        low[il] = theta
        y = low @ low.T
        d = np.sqrt(np.diag(y))
        x = y / np.outer(d, d)
        xi = np.linalg.inv(x)
        val = np.trace(gram @ xi)
        gx = -xi @ gram @ xi  # d val / d X
        # X = D^-1 Y D^-1 with D = diag(y)^1/2
        gy = gx / np.outer(d, d)
        gy -= np.diag(np.sum(gx * x, axis=1) / np.diag(y))
        gl = (gy + gy.T) @ low
        return val, gl[il]

    best = np.inf
    rng = np.random.default_rng(0)
    for trial in range(3):
        low0 = np.linalg.cholesky(np.eye(n) + (0.3 * trial) * np.cov(rng.normal(size=(n, 3 * n))))
        r = scipy.optimize.minimize(f, low0[il], jac=True, method="L-BFGS-B",
                                    options={"maxiter": 20000, "ftol": 1e-15, "gtol": 1e-12})
        best = min(best, r.fun)
    return best


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=7),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_matches_independent_solver_on_random_lower_triangular(n, seed):
    rng = np.random.default_rng(seed)
    a = np.tril(rng.uniform(-2, 2, size=(n, n)))
    np.fill_diagonal(a, rng.choice([-1, 1], size=n) * rng.uniform(0.5, 2.0, size=n))
    res = optimal_factorization(a, tol=1e-10, max_iter=5000)
    other = _independent_optimum(a)
    assert res.dual <= other * (1 + 1e-9)
    assert res.factorization.loss_total == pytest.approx(other, rel=1e-6)


@pytest.mark.parametrize("method", ["anderson", "fixed-point"])
@pytest.mark.parametrize("workload", [prefix_workload(40), momentum_workload(40, beta=0.9)])
def test_dual_never_exceeds_primal_and_certificate_is_recomputed(method, workload):
    seen = []
    res = optimal_factorization(workload.matrix, tol=1e-7, method=method, max_iter=3000,
                                callback=seen.append)
    assert seen, "callback was never called"
    for p in seen:
        assert p.dual <= p.primal * (1 + 1e-12)
    f = res.factorization
    # The reported primal is the loss of the returned matrices, recomputed independently here.
    b, c = f.decoder, f.strategy
    recomputed = np.max(np.sum(c**2, axis=0)) * np.sum(b**2)
    assert res.primal == pytest.approx(recomputed, rel=1e-12)
    assert res.gap == pytest.approx((recomputed - res.dual) / recomputed, abs=1e-12)
    assert res.gap <= 1e-7
    np.testing.assert_allclose(b @ c, workload.matrix, atol=1e-9 * np.abs(workload.matrix).max())
    assert is_lower_triangular(c) and is_lower_triangular(b)
    np.testing.assert_allclose(np.linalg.norm(c, axis=0), 1.0, rtol=1e-10)


def test_methods_agree_and_anderson_needs_fewer_iterations():
    a = momentum_workload(64, beta=0.9).matrix
    fast = optimal_factorization(a, tol=1e-7)
    slow = optimal_factorization(a, tol=1e-7, method="fixed-point", max_iter=5000)
    assert fast.factorization.loss_total == pytest.approx(slow.factorization.loss_total, rel=2e-7)
    assert fast.iterations < slow.iterations


def test_max_iter_reports_unconverged_but_valid_certificate():
    a = momentum_workload(64).matrix
    res = optimal_factorization(a, tol=1e-12, max_iter=3, method="fixed-point")
    assert not res.converged and res.iterations == 3
    assert res.gap > 1e-12
    assert res.dual <= res.primal


def test_warm_start_from_other_size_converges_faster():
    a = prefix_workload(128).matrix
    cold = optimal_factorization(a, tol=1e-8)
    coarse = optimal_factorization(prefix_workload(64).matrix, tol=1e-8)
    warm = optimal_factorization(a, tol=1e-8, v0=coarse.dual_weights)
    assert warm.factorization.loss_total == pytest.approx(cold.factorization.loss_total, rel=1e-7)
    assert warm.iterations <= cold.iterations


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tol": 0.0}, "tol"),
        ({"tol": 1.5}, "tol"),
        ({"max_iter": 0}, "max_iter"),
        ({"method": "newton-magic"}, "method"),
        ({"v0": np.array([1.0, -1.0, 1.0])}, "positive"),
    ],
)
def test_bad_solver_options(kwargs, message):
    with pytest.raises(MfcliError, match=message):
        optimal_factorization(prefix_workload(3).matrix, **kwargs)
