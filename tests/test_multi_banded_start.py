"""The coarse-to-fine start of the BandMF band path (mfcli.optimize.multi_banded.coarse_start).

Oracles: the warm-started solve against the cold (diagonal) start and the dense solver, each
certified by its own dual bound (the losses must agree within the gaps); the start's feasibility
checked densely (symmetric, b-banded, unit diagonal, smallest eigenvalue by numpy); the band
helpers against dense numpy formulas.
"""
from __future__ import annotations

import numpy as np
import pytest

import mfcli.optimize.multi_banded as mb
from mfcli.model.participation import MinSeparation
from mfcli.optimize.multi_banded import coarse_start, extend_band, from_band, to_band, unit_diagonal
from mfcli.optimize.multi_solver import multi_participation_factorization
from mfcli.optimize.multi_structure import Structure
from tests.banded_cases import random_band_x, workload_matrix


def _coarse_from(monkeypatch: pytest.MonkeyPatch, min_n: int) -> None:
    """Coarse levels from m >= min_n (the default, 256, is too large for a unit test)."""
    monkeypatch.setattr(mb, "COARSE_MIN_N", min_n)


def _f(a: np.ndarray, x: np.ndarray) -> float:
    """tr(A X^-1 A^T) by a dense solve."""
    return float(np.trace(a @ np.linalg.solve(x, a.T)))


def _start(a: np.ndarray, schema: MinSeparation) -> tuple[np.ndarray | None, list[tuple[int, int]]]:
    st = Structure(a.shape[0], schema)
    return coarse_start(a, st, memory=30)


CASES = [  # coarse levels m (coarsest first) with COARSE_MIN_N = 16: m = n // 2 recursively, m >= 16, m >= 4 b
    ("prefix", 64, MinSeparation(separation=4), [16, 32]),
    ("momentum", 72, MinSeparation(separation=4), [18, 36]),
    ("cooldown", 48, MinSeparation(separation=4, max_participations=6), [24]),
    ("prefix", 40, MinSeparation(separation=5), [20]),
]


@pytest.mark.parametrize(("name", "n", "schema", "levels"), CASES)
def test_warm_start_reaches_the_certified_optimum_of_the_cold_start(name, n, schema, levels, monkeypatch):
    a = workload_matrix(name, n)
    # tol 1e-8: the band path's Newton phase stalls at gap ~1.9e-9 on cooldown n = 64 (main too).
    dense = multi_participation_factorization(a, schema, tol=1e-8, storage="dense", threads=1)
    _coarse_from(monkeypatch, 10**9)
    cold = multi_participation_factorization(a, schema, tol=1e-8, storage="banded", threads=1)
    _coarse_from(monkeypatch, 16)
    warm = multi_participation_factorization(a, schema, tol=1e-8, storage="banded", threads=1)
    assert cold.coarse_iterations == ()
    assert [m for m, _ in warm.coarse_iterations] == levels
    assert warm.certificate()["coarse_iterations"] == [list(lv) for lv in warm.coarse_iterations]
    for res in (cold, warm, dense):
        assert res.converged and res.gap <= 1e-8
    # Each certificate bounds every answer: all three losses lie within the gaps of one optimum.
    for p in (cold, warm, dense):
        for q in (cold, warm, dense):
            assert q.dual <= p.loss_total * (1 + 1e-12)
    assert warm.loss_total == pytest.approx(cold.loss_total, rel=2e-8)
    assert warm.loss_total == pytest.approx(dense.loss_total, rel=2e-8)
    c = warm.factorization.strategy
    assert not np.tril(c, -schema.separation).any()
    assert np.allclose(np.linalg.norm(c, axis=0), 1.0, rtol=1e-12)


@pytest.mark.parametrize(("name", "n", "b"), [("prefix", 64, 4), ("momentum", 72, 4), ("prefix", 96, 6)])
def test_coarse_start_is_feasible_and_better_than_the_diagonal(name, n, b, monkeypatch):
    _coarse_from(monkeypatch, 16)
    a = workload_matrix(name, n)
    band, levels = _start(a, MinSeparation(separation=b))
    assert band is not None and band.shape == (b, n)
    assert levels[-1][0] == n // 2
    x = from_band(unit_diagonal(band))
    idx = np.arange(n)
    assert np.allclose(x, x.T)
    assert not x[np.abs(np.subtract.outer(idx, idx)) >= b].any()
    assert np.allclose(np.diag(x), 1.0, rtol=0, atol=1e-14)
    assert np.linalg.eigvalsh(x).min() > 0
    optimum = multi_participation_factorization(a, MinSeparation(separation=b), tol=1e-9, storage="dense",
                                                threads=1)
    f_opt = optimum.loss_total / MinSeparation(separation=b).participations(n)  # loss = k f
    # The start is much closer to the optimum than the diagonal start (relative excess of f).
    assert _f(a, x) / f_opt - 1 < 0.2 * (_f(a, np.eye(n)) / f_opt - 1)


@pytest.mark.parametrize(("n", "b"), [(64, 4), (40, 5)])
def test_no_coarse_level_below_the_thresholds(n, b, monkeypatch):
    a = workload_matrix("prefix", n)
    assert _start(a, MinSeparation(separation=b)) == (None, [])  # default COARSE_MIN_N = 256
    _coarse_from(monkeypatch, 16)
    monkeypatch.setattr(mb, "COARSE_MIN_RATIO", n)  # m >= n b never holds
    assert _start(a, MinSeparation(separation=b)) == (None, [])


def test_a_given_x0_is_not_replaced_by_the_coarse_start(monkeypatch):
    _coarse_from(monkeypatch, 16)
    a = workload_matrix("prefix", 64)
    res = multi_participation_factorization(a, MinSeparation(separation=4), tol=1e-8, storage="banded",
                                            threads=1, x0=np.eye(64))
    assert res.coarse_iterations == () and res.converged


@pytest.mark.parametrize("bad", ["indefinite", "worse"])
def test_a_start_band_that_is_indefinite_or_worse_falls_back_to_the_diagonal(bad):
    n, b = 48, 6
    a = workload_matrix("prefix", n)
    schema = MinSeparation(separation=b)
    st = Structure(n, schema)
    band = to_band(np.eye(n), b)
    band[1] = 0.9 if bad == "indefinite" else -0.3  # -0.3: positive definite, f above the diagonal's
    x = from_band(band)
    assert (np.linalg.eigvalsh(x).min() < 0) == (bad == "indefinite")
    if bad == "worse":
        assert _f(a, x) > _f(a, np.eye(n))
    kw = dict(tol=1e-8, max_iter=1000, callback=None, x0=None, memory=30)
    cold = mb.solve_banded(a, st, **kw)
    given = mb.solve_banded(a, st, **kw, start_band=band)
    assert given[2] == cold[2]  # the same iterations: the same (diagonal) start
    np.testing.assert_array_equal(given[0], cold[0])


@pytest.mark.parametrize(("m", "n", "b"), [(32, 64, 4), (33, 70, 5), (16, 16, 8), (20, 41, 3)])
def test_extend_band_of_a_toeplitz_band_is_the_larger_toeplitz_band(m, n, b):
    rng = np.random.default_rng(m + n + b)
    t = np.concatenate([[1.0], rng.uniform(-0.2, 0.2, b - 1)])

    def toeplitz(k: int) -> np.ndarray:
        idx = np.arange(k)
        lag = np.abs(np.subtract.outer(idx, idx))
        return np.where(lag < b, t[np.minimum(lag, b - 1)], 0.0)

    np.testing.assert_array_equal(from_band(extend_band(to_band(toeplitz(m), b), n)), toeplitz(n))


def test_extend_band_keeps_both_ends():
    m, n, b = 24, 60, 4
    x = random_band_x(m, b, 7)
    out = from_band(extend_band(to_band(x, b), n))
    h = m // 2
    np.testing.assert_array_equal(out[:h, :h], x[:h, :h])
    np.testing.assert_array_equal(out[n - (m - h):, n - (m - h):], x[h:, h:])


@pytest.mark.parametrize(("n", "b"), [(20, 4), (9, 9), (31, 2)])
def test_unit_diagonal_is_the_dense_rescaling(n, b):
    rng = np.random.default_rng(n)
    x = random_band_x(n, b, n)
    d = rng.uniform(0.5, 2.0, n)
    scaled = x * np.sqrt(np.outer(d, d))
    np.testing.assert_allclose(from_band(unit_diagonal(to_band(scaled, b))), x, rtol=1e-14, atol=1e-15)
