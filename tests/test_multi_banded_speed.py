"""The band-storage BandMF solver's Newton preconditioner and storage choice (mfcli.optimize.multi_banded).

Oracles: the preconditioner against the Hessian written as an n^2 x n^2 Kronecker matrix
(M (x) X^-1 + X^-1 (x) M, solved by numpy), so neither the Lyapunov basis nor the low-rank
algebra of the code is reused; the band solve against the dense solver (a different iteration) on
the same problem, each certificate bounding the other's answer; the schema sensitivity of the
returned C by brute force over every participation pattern and sign vector.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from banded_cases import random_band_x, workload_matrix
from sensitivity_oracle import brute_sensitivity

import mfcli.optimize.multi_solver as ms
from mfcli.model.participation import FixedEpoch, MinSeparation
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.multi_banded import _Banded, _FastOps, _kmul, _LowRankInverse, _operators, _trace_ktxk, from_band, to_band
from mfcli.optimize.multi_solver import multi_participation_factorization


def _kron_hessian(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """H with vec(H[D]) = H vec(D), H[D] = X^-1 D M + M D X^-1, M = X^-1 A^T A X^-1."""
    xi = np.linalg.inv(x)
    m = xi @ a.T @ a @ xi
    return np.kron(m, xi) + np.kron(xi, m)


def _band_problem(name: str, n: int, b: int, cond: float) -> tuple:
    """(A, X, the band problem, X in band storage, its factors) for a random b-banded X."""
    a = workload_matrix(name, n)
    x = random_band_x(n, b, cond)
    prob = _Banded(a, b)
    xb = to_band(x, b)
    _, factors = prob.value(xb)
    assert factors is not None
    return a, x, prob, xb, factors


@pytest.mark.parametrize(("name", "n", "b"), [("momentum", 12, 3), ("prefix", 10, 4), ("cooldown", 9, 2)])
def test_full_rank_preconditioner_is_the_inverse_hessian(name, n, b):
    """With r = n - 1 (every eigenpair but one, c the last) N_r = N: the exact inverse Hessian."""
    a, x, prob, xb, factors = _band_problem(name, n, b, n)
    pre = _LowRankInverse(prob, factors, prob.blocks(xb), n - 1)
    h = _kron_hessian(a, x)
    rng = np.random.default_rng(1)
    for _ in range(3):
        g = from_band(rng.standard_normal((b, n)) * (prob.w > 0))
        d = np.linalg.solve(h, g.reshape(-1)).reshape(n, n)
        assert np.allclose(pre(to_band(g, b)), to_band(d, b), rtol=1e-7, atol=1e-9 * np.abs(d).max())


@pytest.mark.parametrize(("name", "n", "b", "rank"), [("momentum", 24, 5, 4), ("prefix", 19, 4, 6), ("cooldown", 16, 16, 3)])
def test_low_rank_preconditioner_is_symmetric_positive_definite(name, n, b, rank):
    """Any rank: a self-adjoint positive definite operator on the band (so CG stays valid), and
    the inverse of the Hessian with N = L^T M L replaced by its rank-r truncation N_r (dense)."""
    _, x, prob, xb, factors = _band_problem(name, n, b, n + rank)
    pre = _LowRankInverse(prob, factors, prob.blocks(xb), rank)
    rng = np.random.default_rng(2)
    basis = [rng.standard_normal((b, n)) * (prob.w > 0) for _ in range(6)]
    gram = np.array([[prob.dot(p, pre(q)) for q in basis] for p in basis])
    assert np.allclose(gram, gram.T, rtol=1e-9, atol=1e-12 * np.abs(gram).max())
    assert np.linalg.eigvalsh((gram + gram.T) / 2).min() > 0
    # Dense oracle: N_r = c (I - Q Q^T) + Q diag(l) Q^T with the code's own Q, l, c (the range
    # finder is tested by the full-rank case); inverse of H_r by the Kronecker matrix.
    low = np.linalg.cholesky(x)
    q = np.linalg.solve(low, pre.w[:n])  # W = L Q
    nr = pre.c * (np.eye(n) - q @ q.T) + q @ np.diag(pre.lam) @ q.T
    li = np.linalg.inv(low)
    h = np.kron(li.T @ nr @ li, li.T @ li) + np.kron(li.T @ li, li.T @ nr @ li)  # X^-1 = L^-T L^-1
    g = from_band(basis[0])
    d = np.linalg.solve(h, g.reshape(-1)).reshape(n, n)
    assert np.allclose(pre(basis[0]), to_band(d, b), rtol=1e-7, atol=1e-9 * np.abs(d).max())


# n not a power of two, b not dividing n, k below ceil(n / b), b = n / 2 (one padded block).
CASES = [
    ("momentum", 12, MinSeparation(separation=3)),
    ("cooldown", 11, MinSeparation(separation=4)),
    ("prefix", 10, MinSeparation(separation=3, max_participations=2)),
    ("momentum", 45, MinSeparation(separation=7)),
    ("cooldown", 40, MinSeparation(separation=6, max_participations=4)),
    ("prefix", 36, MinSeparation(separation=18)),
]


@pytest.mark.parametrize(("name", "n", "schema"), CASES)
def test_band_and_dense_storage_reach_the_same_certified_optimum(name, n, schema):
    a = workload_matrix(name, n)
    band = multi_participation_factorization(a, schema, tol=1e-9, storage="banded", threads=1)
    dense = multi_participation_factorization(a, schema, tol=1e-9, storage="dense", threads=1)
    assert band.converged and dense.converged
    assert band.certificate()["method"].endswith("-band-storage")
    # Each certificate bounds the other's answer, so both losses lie within the gaps of one optimum.
    assert band.dual <= dense.loss_total * (1 + 1e-12) and dense.dual <= band.loss_total * (1 + 1e-12)
    assert band.loss_total == pytest.approx(dense.loss_total, rel=2e-9)
    b, k = schema.separation, schema.participations(n)
    c = band.factorization.strategy
    assert not np.tril(c, -b).any()  # b bands
    norms = np.linalg.norm(c, axis=0)
    assert np.allclose(norms, 1.0, rtol=1e-12)  # equal column norms: diag(X) = 1
    assert band.sensitivity == pytest.approx(math.sqrt(k), rel=1e-12)
    if n <= 12:
        assert brute_sensitivity(c, schema) == pytest.approx(math.sqrt(k), rel=1e-12)


@pytest.mark.parametrize(("n", "schema", "band"), [
    (64, MinSeparation(separation=8), True),  # at the threshold, b = n / 8
    (63, MinSeparation(separation=7), False),  # below the threshold (b <= n / 8)
    (64, MinSeparation(separation=9), False),  # b > n / 8
    (64, MinSeparation(separation=8, max_participations=1), False),  # k = 1: the dense problem
    (64, FixedEpoch(epochs=8), False),
])
def test_auto_storage_decision_table(monkeypatch, n, schema, band):
    monkeypatch.setattr(ms, "BANDED_MIN_N", 64)
    res = multi_participation_factorization(prefix_workload(n).matrix, schema, tol=1e-3, threads=1)
    assert res.certificate()["method"].endswith("-band-storage") is band


def _dense_n(a: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """N = L^-1 A^T A L^-T (X = L L^T) and L, by numpy."""
    low = np.linalg.cholesky(x)
    y = np.linalg.solve(low, a.T)
    return y @ y.T, low


def _inverse_hessian_with(x: np.ndarray, low: np.ndarray, nr: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The inverse of H[D] = X^-1 D M + M D X^-1 with L^T M L = nr, by the Kronecker matrix."""
    li = np.linalg.inv(low)
    m = li.T @ nr @ li
    xi = li.T @ li
    h = np.kron(m, xi) + np.kron(xi, m)
    return np.linalg.solve(h, g.reshape(-1)).reshape(g.shape)


@pytest.mark.parametrize(("name", "n", "b", "rank", "bottom"), [
    ("momentum", 12, 3, 2, 3),
    ("prefix", 11, 4, 1, 4),
    ("cooldown", 10, 2, 3, 2),
    ("momentum", 12, 3, 5, 6),  # every eigenpair but one: N_r = N
])
def test_two_sided_preconditioner_against_the_dense_spectrum(name, n, b, rank, bottom):
    """With N^-1 and tr(N^-1) given, the preconditioner keeps the ``rank`` largest and ``bottom``
    smallest eigenpairs of N and flattens the rest to their harmonic mean: at these sizes the range
    finders span the whole space, so the result must be the inverse Hessian with N_r built from
    numpy's eigendecomposition of N (the Kronecker matrix), self-adjoint and positive definite."""
    a, x, prob, xb, factors = _band_problem(name, n, b, n + rank)
    big_n, low = _dense_n(a, x)
    n_inv = np.linalg.inv(big_n)
    pre = _LowRankInverse(prob, factors, prob.blocks(xb), rank, apply_ninv=lambda v: n_inv @ v, bottom=bottom,
                          ninv_trace=float(np.trace(n_inv)))
    lam, vec = np.linalg.eigh(big_n)  # ascending
    kept = np.r_[np.arange(n - rank, n), np.arange(bottom)]
    rest = np.setdiff1d(np.arange(n), kept)
    hm = len(rest) / np.sum(1.0 / lam[rest])
    assert pre.c == pytest.approx(hm, rel=1e-8)
    assert np.allclose(np.sort(pre.lam), np.sort(lam[kept]), rtol=1e-8)
    assert np.allclose(pre.q.T @ pre.q, np.eye(rank + bottom), atol=1e-10)
    nr = vec @ np.diag(np.where(np.isin(np.arange(n), kept), lam, hm)) @ vec.T
    rng = np.random.default_rng(3)
    basis = [rng.standard_normal((b, n)) * (prob.w > 0) for _ in range(5)]
    for g in basis[:2]:
        d = _inverse_hessian_with(x, low, nr, from_band(g))
        assert np.allclose(pre(g), to_band(d, b), rtol=1e-7, atol=1e-9 * np.abs(d).max())
    gram = np.array([[prob.dot(p, pre(q)) for q in basis] for p in basis])
    assert np.allclose(gram, gram.T, rtol=1e-9, atol=1e-12 * np.abs(gram).max())
    assert np.linalg.eigvalsh((gram + gram.T) / 2).min() > 0


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name", ["momentum", "prefix", "cooldown"])
def test_solver_preconditioner_is_the_inverse_hessian_at_n_40(name, fast):
    """The solver's own preconditioner (both operator sets: N^-1 = L^T K K^T L by banded products
    and tr(K^T X K) from the band, or (A^T A)^-1 formed densely): at n = 40 it keeps the 32 largest
    and 7 smallest eigenpairs, and the one left out is its own harmonic mean, so N_r = N and the
    operator is the exact inverse Hessian (Kronecker oracle)."""
    n, b = 40, 6
    a = workload_matrix(name, n)
    x = random_band_x(n, b, 5)
    prob = _Banded(a, b)
    xb = to_band(x, b)
    ops = _operators(a, prob, fast)
    assert isinstance(ops, _FastOps) is fast
    _, state = ops.value(xb)
    pre = ops.preconditioner(xb, state, prob.blocks(xb), None)
    assert len(pre.lam) == n - 1
    big_n, low = _dense_n(a, x)
    g = from_band(np.random.default_rng(4).standard_normal((b, n)) * (prob.w > 0))
    d = _inverse_hessian_with(x, low, big_n, g)
    assert np.allclose(pre(to_band(g, b)), to_band(d, b), rtol=1e-6, atol=1e-8 * np.abs(d).max())


@pytest.mark.parametrize(("n", "p", "b"), [(9, 2, 2), (10, 1, 4), (7, 2, 1)])
def test_banded_helpers_against_dense_products(n, p, b):
    """tr(K^T X K) from the bands, K U and K^T U from K's band, L^T W from the Cholesky blocks."""
    rng = np.random.default_rng(n + p + b)
    k = np.tril(np.triu(rng.standard_normal((n, n)), -p))
    np.fill_diagonal(k, 1.0 + rng.random(n))
    k_band = np.array([np.r_[np.diagonal(k, -d), np.zeros(d)] for d in range(p + 1)])
    x = random_band_x(n, b, 7) if b > 1 else np.eye(n)
    xb = to_band(x, b)
    assert _trace_ktxk(k_band, xb) == pytest.approx(float(np.trace(k.T @ x @ k)), rel=1e-12)
    u = rng.standard_normal((n, 3))
    assert np.allclose(_kmul(k_band, u, transpose=False), k @ u, atol=1e-13)
    assert np.allclose(_kmul(k_band, u, transpose=True), k.T @ u, atol=1e-13)
    prob = _Banded(np.eye(n), b)
    chol = prob.cholesky(xb)
    assert chol is not None
    rows = prob.nblocks * b
    w = np.zeros((rows, 3))
    w[:n] = u
    low = np.linalg.cholesky(x)
    assert np.allclose(prob.ltmul(*chol, w)[:n], low.T @ u, atol=1e-12)


def test_auto_threads_runs_band_storage_on_one_thread() -> None:
    # One BLAS thread is the measured-faster setting of the band path (docs/performance.md); the
    # result and its certificate record the limit the solve actually ran under.
    res = multi_participation_factorization(prefix_workload(64).matrix, MinSeparation(separation=8), tol=1e-4,
                                            storage="banded", threads="auto")
    assert res.threads == 1
    assert res.certificate()["blas_threads"] == 1
