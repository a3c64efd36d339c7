"""The preconditioned CG loop of the Newton solvers (mfcli/optimize/pcg.py), against independent answers:
numpy.linalg.solve on SPD systems, the Krylov-subspace minimiser that CG's k-th iterate is (dense
projection, for the step cap), exact termination in as many steps as A has distinct eigenvalues,
hand-computed iterates on an indefinite operator, and a weighted inner product on 2-d arrays."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mfcli.optimize.pcg import pcg


def spd(n: int, cond: float, seed: int) -> np.ndarray:
    """A random SPD matrix with eigenvalues spread geometrically over [1, cond]."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * np.geomspace(1.0, cond, n)) @ q.T


def preconditioners(a: np.ndarray) -> dict:
    """r -> M r: none, Jacobi, the exact inverse and A^-1 + E E^T (SPD, E random of the size
    of A^-1's smallest eigenvalue)."""
    n = a.shape[0]
    ainv = np.linalg.inv(a)
    e = np.random.default_rng(n).standard_normal((n, n)) * (0.5 / np.sqrt(n) / np.linalg.eigvalsh(a)[-1] ** 0.5)
    approx = ainv + e @ e.T
    return {
        "identity": lambda r: r.copy(),
        "jacobi": lambda r: r / np.diag(a),
        "exact": lambda r: np.linalg.solve(a, r),
        "approximate": lambda r: approx @ r,
    }


@pytest.mark.parametrize("precond", ["identity", "jacobi", "exact", "approximate"])
@pytest.mark.parametrize(("n", "cond"), [(1, 1.0), (5, 10.0), (20, 1e3), (60, 1e2)])
def test_solves_spd_systems_like_numpy(n, cond, precond):
    a = spd(n, cond, seed=n)
    b = np.random.default_rng(100 + n).standard_normal(n)
    b_before = b.copy()
    res = pcg(lambda x: a @ x, preconditioners(a)[precond], b, rtol=1e-13, max_steps=10 * n)
    assert res.stopped == "converged"
    assert np.allclose(res.solution, np.linalg.solve(a, b), rtol=0, atol=1e-9 * np.abs(np.linalg.solve(a, b)).max())
    assert np.array_equal(b, b_before)  # the right-hand side is not modified
    if precond == "exact":  # M = A^-1: the first step lands on the solution
        assert res.steps == 1


@given(
    arrays(np.float64, (6, 6), elements=st.floats(-1, 1)),
    arrays(np.float64, 6, elements=st.floats(-1, 1)),
    st.integers(1, 6),
)
def test_property_solution_of_any_spd_system(g, b, n):
    """A = G G^T + I (SPD, eigenvalues in [1, 37]); Jacobi preconditioner."""
    g, b = g[:n, :n], b[:n]
    a = g @ g.T + np.eye(n)
    res = pcg(lambda x: a @ x, lambda r: r / np.diag(a), b, rtol=1e-12, max_steps=20 * n)
    assert res.stopped == "converged"
    assert res.steps <= 20 * n
    assert np.allclose(a @ res.solution, b, rtol=0, atol=1e-9)


@pytest.mark.parametrize("distinct", [1, 2, 3, 5, 12])
def test_terminates_in_as_many_steps_as_distinct_eigenvalues(distinct):
    """Unpreconditioned CG on A with k distinct eigenvalues terminates in at most k steps (the
    Krylov space has dimension k); at n = 12 with 12 well-spread eigenvalues that is <= n."""
    n = 12
    rng = np.random.default_rng(distinct)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    levels = np.linspace(1.0, 3.0, distinct)
    a = (q * levels[np.arange(n) % distinct]) @ q.T
    b = rng.standard_normal(n)
    res = pcg(lambda x: a @ x, lambda r: r.copy(), b, rtol=1e-10, max_steps=3 * n)
    assert res.stopped == "converged"
    assert res.steps <= distinct
    assert np.allclose(a @ res.solution, b, atol=1e-9)


@pytest.mark.parametrize("precond", ["identity", "jacobi", "approximate"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_step_cap_returns_the_krylov_minimiser(k, precond):
    """After k steps preconditioned CG is at the minimiser of the A-norm error over the Krylov
    space span{M b, (M A) M b, ...} (k vectors): computed here by a dense Galerkin projection."""
    n = 30
    a = spd(n, 1e4, seed=3)
    b = np.random.default_rng(4).standard_normal(n)
    m = preconditioners(a)[precond]
    calls = []
    res = pcg(lambda x: a @ x, lambda r: calls.append(1) or m(r), b, rtol=1e-14, max_steps=k)
    assert (res.steps, res.stopped) == (k, "max_steps")
    assert len(calls) == k  # M b, then one per step but the last (its residual is not needed)
    galerkin = krylov_minimiser(a, m, b, k)
    assert np.allclose(res.solution, galerkin, rtol=0, atol=1e-8 * np.abs(galerkin).max())


def krylov_minimiser(a: np.ndarray, m, b: np.ndarray, k: int) -> np.ndarray:
    """argmin of ||x - A^-1 b||_A over span{M b, (M A) M b, ..., (M A)^(k-1) M b}: an orthonormal
    basis by Arnoldi (Gram-Schmidt twice; the monomial basis is too ill-conditioned), then the
    Galerkin solve."""
    v = np.zeros((b.size, 0))
    w = m(b)
    for _ in range(k):
        for _ in range(2):
            w = w - v @ (v.T @ w)
        v = np.column_stack([v, w / np.linalg.norm(w)])
        w = m(a @ v[:, -1])
    return v @ np.linalg.solve(v.T @ a @ v, v.T @ b)


@pytest.mark.parametrize("precond", ["identity", "jacobi"])
@pytest.mark.parametrize("rtol", [0.5, 0.1, 1e-2, 1e-5])
def test_stops_at_the_first_step_with_small_preconditioned_residual(rtol, precond):
    """The stopping rule: the first k with sqrt(<r_k, M r_k>) <= rtol sqrt(<b, M b>), r_k the
    residual of the Krylov minimiser (computed densely, not from CG's recurrences)."""
    n = 30
    a = spd(n, 20.0, seed=8)
    b = np.random.default_rng(9).standard_normal(n)
    m = preconditioners(a)[precond]

    def ratio(k: int) -> float:
        r = b - a @ krylov_minimiser(a, m, b, k)
        return float(np.sqrt(r @ m(r) / (b @ m(b))))

    expected = next(k for k in range(1, n + 1) if ratio(k) <= rtol)
    assert ratio(expected) < rtol * (1 - 1e-6) and (expected == 1 or ratio(expected - 1) > rtol * (1 + 1e-6))
    res = pcg(lambda x: a @ x, m, b, rtol=rtol, max_steps=n)
    assert (res.steps, res.stopped) == (expected, "converged")


def test_no_step_allowed_returns_the_preconditioned_rhs():
    a = spd(4, 10.0, seed=1)
    b = np.arange(1.0, 5.0)
    res = pcg(lambda x: a @ x, lambda r: r / np.diag(a), b, rtol=1e-8, max_steps=0)
    assert (res.steps, res.stopped) == (0, "max_steps")
    assert np.array_equal(res.solution, b / np.diag(a))


def test_negative_curvature_stops_before_the_step():
    """A = diag(1, 0, -1), b = (2, 0, 1): step 1 has p = b, <p, A p> = 3, x1 = (5/3) b; then
    r1 = (-4/3, 0, 8/3), beta = 16/9, p1 = (20/9, 0, 40/9) with curvature (20/9)^2 - (40/9)^2 < 0."""
    a = np.diag([1.0, 0.0, -1.0])
    b = np.array([2.0, 0.0, 1.0])
    res = pcg(lambda x: a @ x, lambda r: r.copy(), b, rtol=1e-12, max_steps=10)
    assert (res.steps, res.stopped) == (2, "curvature")
    assert np.allclose(res.solution, 5.0 / 3.0 * b, rtol=1e-15)


@pytest.mark.parametrize("diag", [[1.0, -1.0], [1.0, 0.0]])
def test_nonpositive_curvature_on_the_first_step_returns_the_preconditioned_rhs(diag):
    """No update made: the truncated-Newton fallback is the first search direction M b."""
    a = np.diag(diag)
    b = np.array([0.0, 3.0])
    res = pcg(lambda x: a @ x, lambda r: 2.0 * r, b, rtol=1e-12, max_steps=10)
    assert (res.steps, res.stopped) == (1, "curvature")
    assert np.array_equal(res.solution, 2.0 * b)


def test_indefinite_preconditioner_is_a_breakdown():
    a = np.eye(3)
    b = np.ones(3)
    res = pcg(lambda x: a @ x, lambda r: -r, b, rtol=1e-12, max_steps=10)
    assert (res.steps, res.stopped) == (0, "breakdown")
    assert np.array_equal(res.solution, -b)


def test_zero_rhs_gives_zero_without_applying_the_operator():
    calls = []

    def apply(x: np.ndarray) -> np.ndarray:
        calls.append(x)
        return x

    res = pcg(apply, lambda r: r.copy(), np.zeros((3, 2)), rtol=1e-8, max_steps=5)
    assert (res.steps, res.stopped, calls) == (0, "converged", [])
    assert res.solution.shape == (3, 2) and not res.solution.any()


@pytest.mark.parametrize("precond", ["identity", "weighted-jacobi"])
def test_weighted_inner_product_on_band_shaped_arrays(precond):
    """The band-storage case: 2-d arrays with <P, Q> = sum w P Q. A = W^-1 S (S SPD on the
    flattened entries) is self-adjoint under it although not symmetric, so the solution
    S^-1 (W b) is reached only with the weighted product."""
    shape = (4, 3)
    n = 12
    rng = np.random.default_rng(5)
    w = rng.uniform(0.5, 4.0, shape)
    s = spd(n, 50.0, seed=6)

    def apply(x: np.ndarray) -> np.ndarray:
        return (s @ x.ravel()).reshape(shape) / w

    def dot(p: np.ndarray, q: np.ndarray) -> float:
        return float(np.einsum("ij,ij,ij->", w, p, q))

    m = (lambda r: r.copy()) if precond == "identity" else (lambda r: r * w / np.diag(s).reshape(shape))
    b = rng.standard_normal(shape)
    res = pcg(apply, m, b, rtol=1e-13, max_steps=5 * n, dot=dot)
    expected = np.linalg.solve(s, (w * b).ravel()).reshape(shape)
    assert res.stopped == "converged"
    assert np.allclose(res.solution, expected, rtol=0, atol=1e-9 * np.abs(expected).max())
    euclid = pcg(apply, m, b, rtol=1e-13, max_steps=5 * n)
    assert not np.allclose(euclid.solution, expected, rtol=0, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize(("rtol", "max_steps", "message"),
                         [(-1e-3, 5, "rtol"), (float("nan"), 5, "rtol"), (1e-3, -1, "max_steps")])
def test_bad_options_are_refused(rtol, max_steps, message):
    with pytest.raises(ValueError, match=message):
        pcg(lambda x: x, lambda r: r, np.ones(2), rtol=rtol, max_steps=max_steps)
