"""MMCC's row PLDs built together (mog_pld.mixture_plds, as mmcc._compose builds them) against each
row's PLD built on its own (mog_pld.mixture_pld): every PMF, bit for bit, on the rows of several
strategies (each row PLD is a certified pessimistic PLD, tests/test_accounting_mog_pld_roundoff.py;
batching must not change one of them). And mmcc.row_mixture against the step-by-step law of
S = sum_j w_j B_j formed in fresh arrays, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
from accounting_oracles import banded, row_mixture_step_by_step, sqrt_toeplitz
from mog_cases import MMCC_LIKE_ROWS

from mfcli.accounting import mmcc as M
from mfcli.accounting import mog_pld


def _same_pmf(a, b) -> bool:
    return (a.discretization == b.discretization and a.lower_loss == b.lower_loss and a.infinity_mass == b.infinity_mass
            and a.pessimistic == b.pessimistic and a.sparse == b.sparse and a.probs.dtype == b.probs.dtype
            and np.array_equal(a.probs, b.probs))


def _row_groups(c: np.ndarray, sigma: float, p: float) -> tuple[list, dict]:
    """The row groups and arguments mmcc passes to _compose for strategy c (captured from a run)."""
    seen: list = []
    orig = M._compose

    def spy(groups, **kw):
        seen.append((list(groups), kw))
        return orig(groups, **kw)

    M._compose = spy
    try:
        M.mmcc(c, sigma=sigma, sampling=p, delta=1e-6, value_discretization=2e-3)
    finally:
        M._compose = orig
    return seen[0]


@pytest.mark.parametrize("c, sigma, p", [
    (np.eye(8), 1.0, 0.1),
    (banded(32, 2), 2.0, 0.05),
    (banded(48, 8), 3.0, 0.02),
    (sqrt_toeplitz(32), 0.8, 0.3),
    (sqrt_toeplitz(48), 6.0, 0.01),
], ids=["identity", "2-banded", "8-banded", "sqrt-low-sigma", "sqrt"])
def test_rows_built_together_equal_each_built_alone(c, sigma, p) -> None:
    groups, kw = _row_groups(c, sigma, p)
    assert len(groups) >= 1
    rows = [(M._sensitivities_up(g.support, kw["resolution"]), g.probabilities, g.rho) for g in groups]
    together = mog_pld.mixture_plds(kw["sigma"], rows, value_discretization_interval=kw["d"])
    assert len(together) == len(rows)
    for (s, q, rho), pld in zip(rows, together, strict=True):
        alone = mog_pld.mixture_pld(kw["sigma"], s, q, value_discretization_interval=kw["d"], probability_error=rho)
        assert _same_pmf(pld.remove, alone.remove) and _same_pmf(pld.add, alone.add)


def test_mixtures_of_every_kind_together_equal_each_alone() -> None:
    """With and without an atom at 0 (a flat limit or none), two components (DP-SGD), different
    probability errors, a thinned grid (max_points), and the same mixture twice."""
    sigma = 4.0
    rows = [(s, q, 0.0) for _, s, q in MMCC_LIKE_ROWS]
    rows += [([0.0, 1.0], [0.99, 0.01], 0.0), ([0.0, 0.5, 2.0], [0.5, 0.3, 0.2], 1e-9),
             (list(np.arange(1, 40) / 20), list(np.full(39, 1 / 39)), 3e-12), ([0.0, 1.0], [0.99, 0.01], 0.0)]
    for max_points in (None, 50):
        together = mog_pld.mixture_plds(sigma, rows, value_discretization_interval=1e-3, max_points=max_points)
        for (s, q, rho), pld in zip(rows, together, strict=True):
            alone = mog_pld.mixture_pld(sigma, s, q, value_discretization_interval=1e-3, max_points=max_points,
                                        probability_error=rho)
            assert _same_pmf(pld.remove, alone.remove) and _same_pmf(pld.add, alone.add)


@pytest.mark.parametrize("n, seed", [(1, 0), (7, 1), (60, 2), (150, 3)])
def test_row_mixture_equals_the_step_by_step_law(n, seed) -> None:
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 120, size=n)
    probs = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0.01, 0.06, size=n)) if n > 1 else np.array([0.03])
    for cut in (1e-15, 1e-9):
        got = M.row_mixture(weights, probs, cut=cut)
        want = row_mixture_step_by_step(weights, probs, cut=cut)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


@pytest.mark.parametrize("c, sigma, p", [(banded(32, 2), 2.0, 0.05), (sqrt_toeplitz(48), 6.0, 0.01)],
                         ids=["2-banded", "sqrt"])
def test_deltas_and_bounds_together_equal_each_alone(c, sigma, p) -> None:
    """The deltas and their proven bounds themselves (the PMF's lift can hide a changed bound)."""
    groups, kw = _row_groups(c, sigma, p)
    d = kw["d"]
    items = []
    for g in groups:
        s, q = mog_pld._check_mixture(kw["sigma"], M._sensitivities_up(g.support, kw["resolution"]), g.probabilities)
        remove = mog_pld._Loss(kw["sigma"], s, q, True)
        add = mog_pld._Loss(kw["sigma"], s, q, False, mirror=remove)
        remove.prob_error = add.prob_error = g.rho + 3e-16
        items.append((remove, add, mog_pld._grid_points(remove, d, None) * d, mog_pld._grid_points(add, d, None) * d))
    together = mog_pld._paired_deltas_many(items)
    for item, got in zip(items, together, strict=True):
        alone = mog_pld._paired_deltas(*item)
        assert all(np.array_equal(a, b) for a, b in zip(got, alone, strict=True))
    # the roots' error bounds (R, m, Delta) too: they enter the delta bounds only at second order
    ys, epss, traces = [], [], []
    for remove, _, eps_r, _ in items:
        pts = eps_r[eps_r > remove.flat_limit]
        trace = np.empty((5, pts.size))
        ys.append(mog_pld._invert(remove, pts, *mog_pld._truncation(remove, mog_pld.LOG_MASS_TRUNCATION_BOUND), trace))
        epss.append(pts)
        traces.append(trace)
    together = mog_pld._root_errors_many([it[0] for it in items], ys, epss, traces)
    for item, y, pts, trace, got in zip(items, ys, epss, traces, together, strict=True):
        assert np.array_equal(got, mog_pld._root_errors(item[0], y, pts, trace))


def test_fft_convolution_is_scipy_signals_bit_for_bit() -> None:
    """pld_ops._fftconvolve (rfft / irfft) against scipy.signal.fftconvolve (rfftn / irfftn), the
    composition dp-accounting runs, on lengths of every kind (1, odd, even, fast and slow sizes)."""
    from scipy import signal

    from mfcli.accounting import pld_ops

    rng = np.random.default_rng(5)
    for na, nb in [(1, 7), (2, 2), (3, 500), (331, 329), (1000, 1), (1023, 77), (2048, 2048), (4097, 13)]:
        a, b = rng.random(na), rng.random(nb)
        assert np.array_equal(pld_ops._fftconvolve(a, b), signal.fftconvolve(a, b))


def test_reverse_cumsums_of_rows_equal_each_rows_own() -> None:
    """The running sums of the row PMFs' curves by block size, with their roundings counts, against
    _reverse_cumsum of each row alone (lengths over several block sizes, 1 included)."""
    rng = np.random.default_rng(7)
    lengths = np.array([1, 2, 3, 4, 8, 9, 15, 16, 17, 99, 100, 101, 330, 502])
    x = rng.random((lengths.size, int(lengths.max())))
    run, counts = mog_pld._reverse_cumsums(x, lengths)
    for j, n in enumerate(lengths.tolist()):
        want, count = mog_pld._reverse_cumsum(x[j, :n])
        assert np.array_equal(run[j, :n], want) and counts[j] == count


@pytest.mark.parametrize("refinement", [1, 2, 20])
def test_coarsen_up_equals_the_sorted_unique_form(refinement) -> None:
    """coarsen_up (runs of an increasing support) against np.unique + np.bincount, bit for bit."""
    rng = np.random.default_rng(refinement)
    for support in (np.array([0]), np.array([3]), np.sort(rng.choice(4000, 300, replace=False)), np.array([4, 0, 9])):
        probs = rng.random(support.size)
        probs /= probs.sum()
        coarse = -((-support) // refinement)
        pts, inv = np.unique(coarse, return_inverse=True)
        pr = np.bincount(inv, weights=probs)
        keep = pr > 0
        got = M.coarsen_up(support, probs, refinement)
        if refinement == 1:
            assert got[0] is support and got[1] is probs
        else:
            assert np.array_equal(got[0], pts[keep]) and np.array_equal(got[1], pr[keep] / pr[keep].sum())


def test_rows_built_in_small_batches_equal_each_alone(monkeypatch) -> None:
    """The batches of mixture_plds and the padded groups of its PMFs, made small (many of each, rows
    sorted by length within them), change no row either."""
    groups, kw = _row_groups(sqrt_toeplitz(48), 6.0, 0.01)
    rows = [(M._sensitivities_up(g.support, kw["resolution"]), g.probabilities, g.rho) for g in groups]
    monkeypatch.setattr(mog_pld, "_BATCH_POINTS", 300)
    monkeypatch.setattr(mog_pld, "_PAD_POINTS", 700)
    together = mog_pld.mixture_plds(kw["sigma"], rows, value_discretization_interval=kw["d"])
    for (s, q, rho), pld in zip(rows, together, strict=True):
        alone = mog_pld.mixture_pld(kw["sigma"], s, q, value_discretization_interval=kw["d"], probability_error=rho)
        assert _same_pmf(pld.remove, alone.remove) and _same_pmf(pld.add, alone.add)
