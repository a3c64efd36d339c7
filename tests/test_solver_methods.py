"""The pieces of the fast (Newton) solver against independent derivations.

Oracles: scipy.linalg.sqrtm and dense solves for the bounds; an O(n^4) sum and central finite
differences of the dual (eigenvalues from numpy) for the Hessian; an explicit aggregation matrix
for the coarse problem; the Anderson and plain fixed-point methods for the optimum.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

from mfcli.errors import MfcliError
from mfcli.model.factorization import is_lower_triangular
from mfcli.model.workloads import build_workload, momentum_workload, prefix_workload
from mfcli.optimize.dense import (
    COARSE_MIN_N,
    DEFAULT_METHOD,
    METHODS,
    certified_dual,
    coarsen_gram,
    dual_hessian,
    evaluate,
    exp_sum,
    newton_direction,
    optimal_factorization,
)


def _random_lower(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.tril(rng.uniform(-1, 1, size=(n, n)), -1) / math.sqrt(n)
    np.fill_diagonal(a, rng.uniform(0.5, 2.0, size=n) * rng.choice([-1, 1], size=n))
    return a


def _dual_value(gram: np.ndarray, v: np.ndarray) -> float:
    """2 tr(H^1/2) - sum(v) from numpy's eigenvalues (not the solver's eigh call)."""
    sv = np.sqrt(v)
    lam = np.linalg.eigvalsh(gram * np.outer(sv, sv))
    return 2.0 * float(np.sum(np.sqrt(np.clip(lam, 0, None)))) - float(v.sum())


def _exact_t(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    """T = sum_ij w_ij (q_i o q_j)(q_i o q_j)^T, w_ij = s_i s_j / (s_i + s_j), term by term."""
    n = len(s)
    t = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            z = q[:, i] * q[:, j]
            t += s[i] * s[j] / (s[i] + s[j]) * np.outer(z, z)
    return t


@pytest.mark.parametrize("n, seed", [(3, 0), (8, 1), (15, 2)])
def test_bounds_match_dense_matrix_functions(n, seed):
    a = _random_lower(n, seed)
    gram = a.T @ a
    v = np.exp(np.random.default_rng(seed).normal(size=n))
    b = evaluate(gram, v)
    # Independent route: X(v) = D^-1/2 H^1/2 D^-1/2 via sqrtm, columns normalised, dense solve.
    d = np.diag(np.sqrt(v))
    h_sqrt = np.real(scipy.linalg.sqrtm(d @ gram @ d))
    x = np.linalg.inv(d) @ h_sqrt @ np.linalg.inv(d)
    w = np.diag(1.0 / np.sqrt(np.diag(x)))
    x_norm = w @ x @ w
    primal = float(np.trace(gram @ np.linalg.inv(x_norm)))
    assert b.primal == pytest.approx(primal, rel=1e-9)
    assert b.dual == pytest.approx(np.trace(h_sqrt) ** 2 / v.sum(), rel=1e-10)
    np.testing.assert_allclose(b.phi, np.diag(h_sqrt), rtol=1e-9)
    assert b.dual <= b.primal * (1 + 1e-12)


def _nuclear_norm_mpmath(k: np.ndarray) -> float:
    """sum of singular values in 50-digit arithmetic (independent of LAPACK)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    m = mpmath.matrix(k.tolist())
    s = mpmath.svd_r(m, compute_uv=False)
    return float(sum(s))


@pytest.mark.parametrize("n, beta", [(12, 0.9), (20, 0.99)])
def test_certified_dual_routes_against_extended_precision(n, beta):
    a = momentum_workload(n, beta=beta).matrix
    gram = a.T @ a
    v = np.exp(np.random.default_rng(n).normal(size=n))
    b = evaluate(gram, v)
    truth = _nuclear_norm_mpmath(a * np.sqrt(v)[None, :]) ** 2 / v.sum()
    svd_route = certified_dual(a, v)
    fast_route = certified_dual(a, v, b.eigvecs)
    assert svd_route == pytest.approx(truth, rel=1e-13)
    # The eigenvector route is a lower bound, tight to second order in the eigenvector error.
    assert fast_route <= truth * (1 + 1e-13)
    assert fast_route == pytest.approx(truth, rel=1e-12)


def test_certified_dual_is_a_lower_bound_for_poor_eigenvectors():
    n = 16
    a = momentum_workload(n, beta=0.9).matrix
    v = np.exp(np.random.default_rng(5).normal(size=n))
    truth = certified_dual(a, v)
    b = evaluate(a.T @ a, v)
    kappa = b.sqrt_eigvals.max() / b.sqrt_eigvals.min()
    rng = np.random.default_rng(6)
    for eps in (1e-9, 1e-6, 1e-3, 1.0):
        # Perturb the eigenvectors by a rotation exp(eps S): a large direction leaking into a
        # small column is amplified by up to kappa = s_max / s_min, so F ~ eps kappa. The bound
        # stays valid, loosens like (eps kappa)^2, and for a far-off basis (||F|| > 1) falls back
        # to the singular values.
        s = rng.normal(size=(n, n))
        rot = scipy.linalg.expm(eps * (s - s.T) / math.sqrt(n))
        bound = certified_dual(a, v, b.eigvecs @ rot)
        assert bound <= truth * (1 + 1e-13)
        assert bound >= truth * (1 - (eps * kappa) ** 2) or bound == pytest.approx(truth, rel=1e-13)


def test_exact_hessian_is_the_daleckii_krein_formula():
    # Hessian of g(x) = f(e^x) is -T + diag(phi - v); compare with central differences of f.
    n = 7
    a = momentum_workload(n, beta=0.8).matrix
    gram = a.T @ a
    x0 = np.random.default_rng(3).normal(size=n) * 0.4
    b = evaluate(gram, np.exp(x0))
    t = _exact_t(b.eigvecs, b.sqrt_eigvals)
    hess = -t + np.diag(b.phi - np.exp(x0))
    eps = 1e-4
    fd = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            e_i, e_j = np.eye(n)[i] * eps, np.eye(n)[j] * eps
            fd[i, j] = (
                _dual_value(gram, np.exp(x0 + e_i + e_j)) - _dual_value(gram, np.exp(x0 + e_i - e_j))
                - _dual_value(gram, np.exp(x0 - e_i + e_j)) + _dual_value(gram, np.exp(x0 - e_i - e_j))
            ) / (4 * eps * eps)
    np.testing.assert_allclose(fd, hess, atol=1e-5 * np.abs(hess).max())
    # T 1 = phi / 2 (sum over j of (q_i . q_j) w_ij collapses to the diagonal w_ii = s_i / 2).
    np.testing.assert_allclose(t.sum(axis=1), b.phi / 2, rtol=1e-10)


@pytest.mark.parametrize("workload", [prefix_workload(24), momentum_workload(24, beta=0.9)])
@pytest.mark.parametrize("terms", [6, 10])
def test_approximate_hessian_is_within_the_kernel_error(workload, terms):
    gram = workload.matrix.T @ workload.matrix
    v = np.exp(np.random.default_rng(terms).normal(size=24) * 0.5)
    b = evaluate(gram, v)
    exact = _exact_t(b.eigvecs, b.sqrt_eigvals)
    upper = dual_hessian(b.eigvecs, b.sqrt_eigvals, terms=terms).astype(np.float64)
    approx = np.triu(upper) + np.triu(upper, 1).T
    s = b.sqrt_eigvals
    log_range = math.ceil(math.log(s.max() / s.min()) * 4) / 4
    err = exp_sum(log_range, terms)[2]
    # (1 - err) T <= T~ <= (1 + err) T: the generalised eigenvalues lie in [1 - err, 1 + err].
    ev = scipy.linalg.eigvalsh(approx, exact)
    tol32 = 1e-4  # float32 accumulation and column truncation
    assert ev.min() >= 1 - err - tol32 and ev.max() <= 1 + err + tol32
    assert np.all(approx >= 0)  # every entry is a positive combination


@pytest.mark.parametrize("log_range, terms", [(2.0, 4), (9.0, 8), (14.0, 12), (20.0, 16)])
def test_exponential_sum_error_is_what_it_reports(log_range, terms):
    c, t, err = exp_sum(log_range, terms)
    y = np.exp(np.linspace(0.0, log_range, 20011))  # a grid 50x finer than the fit's
    rel = np.abs(y * (np.exp(-np.outer(y, t)) @ c) - 1.0)
    assert np.all(c >= 0)
    assert rel.max() <= err * 1.02 + 1e-12
    assert err < 0.1


@pytest.mark.parametrize("n", [2, 5, 6, 9])
def test_coarse_gram_is_pairwise_aggregation(n):
    a = _random_lower(n, n)
    gram = a.T @ a
    m = (n + 1) // 2
    p = np.zeros((n, m))
    p[np.arange(n), np.arange(n) // 2] = 1.0
    np.testing.assert_allclose(coarsen_gram(gram), p.T @ gram @ p, rtol=1e-13, atol=1e-13)
    assert np.all(np.linalg.eigvalsh(coarsen_gram(gram)) > 0)


def test_newton_direction_is_an_ascent_direction_and_steps_increase_the_dual():
    a = momentum_workload(40, beta=0.9).matrix
    gram = a.T @ a
    v = np.ones(40)
    b = evaluate(gram, v)
    c = (b.sqrt_eigvals.sum() / v.sum()) ** 2
    v, b = c * v, b._replace(phi=b.phi * math.sqrt(c), sqrt_eigvals=b.sqrt_eigvals * math.sqrt(c))
    dx, dec = newton_direction(b, v)
    grad = b.phi - v
    assert grad @ dx > 0 and dec > 0
    f0 = _dual_value(gram, v)
    assert _dual_value(gram, v * np.exp(1e-3 * dx)) > f0
    # For small steps the increase matches the first-order prediction.
    step = 1e-5
    assert (_dual_value(gram, v * np.exp(step * dx)) - f0) / step == pytest.approx(grad @ dx, rel=1e-3)


CASES = [
    ("prefix", {}),
    ("momentum", {"beta": 0.9}),
    ("momentum", {"beta": 0.9, "lr": "cooldown"}),
    ("prefix", {"lr": "step-decay"}),
]


@pytest.mark.parametrize("name, kwargs", CASES)
def test_newton_agrees_with_anderson_and_is_certified(name, kwargs):
    w = build_workload(name, 300, **kwargs)  # n >= 256: the multilevel start is used
    fast = optimal_factorization(w.matrix, tol=1e-8)
    ref = optimal_factorization(w.matrix, tol=1e-8, method="anderson", max_iter=3000)
    assert fast.method == DEFAULT_METHOD == "newton"
    assert fast.coarse_iterations and fast.coarse_iterations[0][0] < 2 * COARSE_MIN_N
    assert fast.converged and fast.gap <= 1e-8
    assert fast.primal == pytest.approx(ref.primal, rel=2e-8)
    # Each certificate brackets the other's loss.
    assert fast.dual <= ref.primal * (1 + 1e-12) and ref.dual <= fast.primal * (1 + 1e-12)
    f = fast.factorization
    np.testing.assert_allclose(f.decoder @ f.strategy, w.matrix, atol=1e-9 * np.abs(w.matrix).max())
    assert is_lower_triangular(f.strategy) and is_lower_triangular(f.decoder)
    np.testing.assert_allclose(np.linalg.norm(f.strategy, axis=0), 1.0, rtol=1e-10)
    assert fast.iterations <= 6  # full-size eigendecompositions (Anderson needs several times more)
    assert fast.iterations < ref.iterations


def test_multilevel_start_and_plain_start_reach_the_same_optimum():
    a = momentum_workload(260, beta=0.9).matrix
    ml = optimal_factorization(a, tol=1e-9)
    plain = optimal_factorization(a, tol=1e-9, multilevel=False)
    assert ml.coarse_iterations and not plain.coarse_iterations
    assert ml.primal == pytest.approx(plain.primal, rel=2e-9)
    assert "coarse_iterations" in ml.certificate() and "coarse_iterations" not in plain.certificate()


def test_fixed_point_baseline_needs_many_more_iterations_on_momentum():
    a = momentum_workload(128, beta=0.9).matrix
    fast = optimal_factorization(a, tol=1e-6)
    slow = optimal_factorization(a, tol=1e-6, method="fixed-point", max_iter=5000)
    assert slow.converged and fast.converged
    assert fast.primal == pytest.approx(slow.primal, rel=2e-6)
    assert 10 * fast.iterations < slow.iterations


def test_warm_start_from_the_solution_certifies_at_once():
    a = momentum_workload(96, beta=0.9).matrix
    res = optimal_factorization(a, tol=1e-9)
    again = optimal_factorization(a, tol=1e-7, v0=res.dual_weights)
    assert again.iterations == 1 and again.converged


@settings(max_examples=15, deadline=None)
@given(n=st.integers(min_value=1, max_value=40), seed=st.integers(min_value=0, max_value=2**31 - 1))
def test_newton_converges_on_random_workloads(n, seed):
    a = _random_lower(n, seed)
    res = optimal_factorization(a, tol=1e-9, max_iter=200)
    assert res.converged
    ref = optimal_factorization(a, tol=1e-9, method="anderson", max_iter=5000)
    assert res.primal == pytest.approx(ref.primal, rel=5e-9)
    for p in res.history:
        assert p.dual <= p.primal * (1 + 1e-12)


def test_weak_hessian_still_converges_honestly():
    # Four kernel terms: a crude Hessian (tens of per cent off), so more steps, same optimum.
    a = momentum_workload(64, beta=0.9).matrix
    crude = optimal_factorization(a, tol=1e-9, hessian_terms=4, max_iter=200)
    good = optimal_factorization(a, tol=1e-9)
    assert crude.converged and crude.iterations >= good.iterations
    assert crude.primal == pytest.approx(good.primal, rel=2e-9)


def test_round_off_floor_stops_before_max_iter():
    a = momentum_workload(48, beta=0.9).matrix
    res = optimal_factorization(a, tol=1e-16 + 1e-300, max_iter=400)
    assert res.iterations < 400
    assert abs(res.gap) < 1e-10  # the bounds meet to round-off


def test_methods_tuple_and_bad_options():
    assert set(METHODS) == {"newton", "anderson", "fixed-point"}
    with pytest.raises(MfcliError, match="hessian_terms"):
        optimal_factorization(prefix_workload(4).matrix, hessian_terms=1)
    for bad in (0, -2):
        with pytest.raises(MfcliError, match="threads"):
            optimal_factorization(prefix_workload(4).matrix, threads=bad)
    for wrong_type in ("two", 1.5, True):  # a programming mistake, not bad data
        with pytest.raises(TypeError, match="threads"):
            optimal_factorization(prefix_workload(4).matrix, threads=wrong_type)


def test_thread_limit_is_recorded_and_does_not_change_the_answer():
    a = momentum_workload(40, beta=0.9).matrix
    one = optimal_factorization(a, tol=1e-9, threads=1)
    default = optimal_factorization(a, tol=1e-9, threads=None)
    assert one.threads == 1 and one.certificate()["blas_threads"] == 1
    assert default.threads is None and "blas_threads" not in default.certificate()
    assert one.primal == pytest.approx(default.primal, rel=1e-12)
