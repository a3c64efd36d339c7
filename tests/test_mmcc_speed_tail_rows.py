"""MMCC's step 1 and step 3 against straightforward evaluations: ``_tail_z`` / ``_tail_T`` written
into caller-owned arrays and ``row_mixture`` with its scratch array and zero-kept buffer equal a
plain reference (fresh arrays, every mask formed, the whole cumulative sum) bit for bit;
``solve_tail_eps`` (Newton steps, then one certificate evaluation) equals itself on fresh arrays
bit for bit, and returns certified values within its tolerance of plain bisection."""
from __future__ import annotations

import numpy as np
import pytest
from accounting_oracles import row_mixture_step_by_step
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from mfcli.accounting import mmcc as M
from mfcli.util.search import smallest_true


def _reference_tail_z(eps, n, *, sigma, h, g_lo, g_hi):
    """-z of the tail problem as documented: (x h - eps sigma^2 - g_lo/2) / tau with tau = sigma
    sqrt(g_hi) for y >= 0 and sigma sqrt(g_lo) for y < 0 (the same operations, every mask formed)."""
    x = np.arange(n) * h
    nz = x[None, :] - (eps * sigma * sigma + g_lo / 2)[:, None]
    neg = nz > 0
    nz = nz * (1.0 / (sigma * np.sqrt(g_hi)))[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.sqrt(g_hi / g_lo)
    ratio = np.where(np.isfinite(ratio), ratio, np.inf)
    with np.errstate(invalid="ignore"):  # 0 x inf where y = 0 exactly and g_lo = 0: not selected
        return np.where(neg, nz * ratio[:, None], nz)


def _reference_tail_T(pmf, extra, err_l2, eps, *, sigma, h, g_lo, g_hi):
    """T as documented, and its first two derivatives in eps formed per entry from the textbook
    formulas (f' = -phi(z) k, f'' = z phi(z) k^2, k = sigma / sqrt(g_hi); d||f|| = (f . f') / ||f||)."""
    z = _reference_tail_z(eps, pmf.shape[1], sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
    f = special.ndtr(z)
    t = np.einsum("bx,bx->b", pmf, f) + extra
    if err_l2:
        t += err_l2 * np.sqrt(np.einsum("bx,bx->b", f, f))
    k = (sigma / np.sqrt(g_hi))[:, None]
    phi = np.exp(-0.5 * np.square(z)) / np.sqrt(2 * np.pi)  # z here is -z of the documentation
    df = -phi * k
    with np.errstate(invalid="ignore"):  # 0 x inf where z is infinite: z phi(z) -> 0 there
        d2f = np.where(np.isinf(z), 0.0, -z * phi) * k * k
    norm = np.sqrt((f * f).sum(axis=1))
    d1 = (pmf * df).sum(axis=1) + err_l2 * (f * df).sum(axis=1) / np.where(norm > 0, norm, np.inf)
    return t, d1, (pmf * d2f).sum(axis=1)


def _problem(seed: int, *, b: int = 120, n: int = 50, negative: bool = True):
    rng = np.random.default_rng(seed)
    sigma, h = float(rng.uniform(0.3, 4)), 0.05
    pmf = rng.dirichlet(np.ones(n) * 0.3, size=b)
    extra = rng.uniform(0, 1e-9, b) * (rng.random(b) < 0.7)
    g_hi = rng.uniform(0.02, 1.0, b)
    g_lo = np.maximum(g_hi - M.G_QUANTUM, 0.0)
    g_lo[:2] = 0.0  # an infinite tau ratio for y < 0
    # small eps: many entries with y < 0 (the rescaled branch); else y >= 0 throughout
    eps = rng.uniform(0, 0.3, b) if negative else rng.uniform(n * h / sigma**2 + 0.1, 3.0, b)
    return pmf, extra, eps, dict(sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("negative", [True, False])
def test_tail_z_and_T_into_reused_arrays_equal_the_reference(seed: int, negative: bool) -> None:
    pmf, extra, eps, kw = _problem(seed, negative=negative)
    ref_z = _reference_tail_z(eps, pmf.shape[1], **kw)
    assert ((ref_z > 0).any() and (ref_z < 0).any()) if negative else (ref_z < 0).all()
    # dirty caller-owned arrays: every entry must be written
    work = np.full((2, *pmf.shape), np.nan)
    z = M._tail_z(eps, pmf.shape[1], out=work[0], **kw)
    assert z.tobytes() == ref_z.tobytes()
    assert M._tail_z(eps, pmf.shape[1], **kw).tobytes() == ref_z.tobytes()
    ref_t, ref_d1, ref_d2 = _reference_tail_T(pmf, extra, M.FFT_ERROR_L2, eps, **kw)
    for w in (None, (work[0], work[1]), (work[0], work[1], np.full(pmf.shape, np.nan))):
        t, d1, d2, _ = M._tail_T(pmf, extra, M.FFT_ERROR_L2, eps, with_slope=True, work=w, **kw)
        assert t.tobytes() == ref_t.tobytes()
        # the derivatives only steer the search: the same values up to the order of the sums
        assert np.isfinite(d1).all() and np.isfinite(d2).all()
        np.testing.assert_allclose(d1, ref_d1, rtol=1e-12)
        np.testing.assert_allclose(d2, ref_d2, rtol=1e-12, atol=1e-300)
        t = M._tail_T(pmf, extra, M.FFT_ERROR_L2, eps, work=w, **kw)
        assert t.tobytes() == ref_t.tobytes()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tail_T_derivatives_equal_finite_differences(seed: int) -> None:
    """T' and T'' of ``_tail_T`` (every y >= 0, where tau is the documented sigma sqrt(g_hi)) against
    central differences of the reference T, relative to T (T spans 1e-100 to 1 here): an
    independent check of the formulas, the err_l2 ||f|| term's derivative included (its allowance
    scaled up so that it matters)."""
    pmf, _, eps, kw = _problem(seed, negative=False)
    extra = np.zeros(pmf.shape[0])
    err = 1e-4
    t, d1, _, _ = M._tail_T(pmf, extra, err, eps, with_slope=True, **kw)
    rows = t > 1e-250
    assert rows.sum() > pmf.shape[0] // 2
    step = 1e-6
    tp, tm = (_reference_tail_T(pmf, extra, err, eps + s, **kw)[0] for s in (step, -step))
    np.testing.assert_allclose((d1 / t)[rows], ((np.log(tp) - np.log(tm)) / (2 * step))[rows], rtol=1e-5)
    # T'' of the main sum (the allowance's second derivative is not formed)
    t0 = M._tail_T(pmf, extra, 0.0, eps, with_slope=True, **kw)
    step = 1e-4
    mp, mm, m0 = (_reference_tail_T(pmf, extra, 0.0, eps + s, **kw)[0] for s in (step, -step, 0.0))
    fd = (mp / m0 - 2 + mm / m0) / step**2
    np.testing.assert_allclose((t0[2] / t0[0])[rows], fd[rows], rtol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_solve_tail_eps_with_reused_arrays_equals_fresh_arrays(seed: int, monkeypatch) -> None:
    """The Newton search with its arrays reused (row subsets written into the first rows) returns
    the eps of the same search run on fresh arrays, bit for bit; and each eps meets its delta
    while eps - 1e-7 (above the tolerance) does not, for the reference T."""
    pmf, extra, _, kw = _problem(seed, b=200, n=60)
    rng = np.random.default_rng(seed + 10)
    delta = 10.0 ** rng.uniform(-12, -4, pmf.shape[0])
    got = M.solve_tail_eps(pmf, extra, M.FFT_ERROR_L2, delta=delta, **kw)
    plain = M._tail_T

    def fresh(*args, work=None, **kwargs):
        return plain(*args, **kwargs)

    monkeypatch.setattr(M, "_tail_T", fresh)
    want = M.solve_tail_eps(pmf, extra, M.FFT_ERROR_L2, delta=delta, **kw)
    assert got.tobytes() == want.tobytes()
    fin = np.isfinite(got) & (got > 0)
    assert fin.sum() > pmf.shape[0] // 2
    slack = 1 + 1e-12
    t_at, *_ = _reference_tail_T(pmf[fin], extra[fin], M.FFT_ERROR_L2, got[fin],
                                **{**kw, "g_lo": kw["g_lo"][fin], "g_hi": kw["g_hi"][fin]})
    assert np.all(t_at * slack <= delta[fin])
    below, *_ = _reference_tail_T(pmf[fin], extra[fin], M.FFT_ERROR_L2, got[fin] - 1e-7,
                                 **{**kw, "g_lo": kw["g_lo"][fin], "g_hi": kw["g_hi"][fin]})
    assert np.all(below * slack > delta[fin])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("negative", [True, False])
def test_tail_T_bound_is_above_the_direct_evaluation(seed: int, negative: bool) -> None:
    """The certificate bound (T a step above x from the sums formed at x) is never below T
    evaluated directly there (the reference, every entry through ``ndtr``), for steps from 1e-10
    to 0.3, rows with y < 0 entries and an infinite tau ratio included; and for steps <= 1e-6 it
    exceeds it by at most 1e-6 of T (at the search's steps of ~1e-8, ~1e-10 of T: far less than
    the ~1.5e-8 of T by which T falls over the certificate's margin on the headline). A bound
    without its second-order term fails the first check: it is below T for the larger steps."""
    pmf, extra, eps, kw = _problem(seed, negative=negative)
    t, _, _, terms = M._tail_T(pmf, extra, M.FFT_ERROR_L2, eps, with_slope=True, **kw)
    first_order_only_fails = False
    for step in (1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 0.3):
        st_ = np.full(pmf.shape[0], step)
        bound = M._tail_T_bound(t, terms, st_)
        direct = _reference_tail_T(pmf, extra, M.FFT_ERROR_L2, eps + step, **kw)[0]
        assert np.all(bound >= direct * (1 - 1e-13)), step
        if step <= 1e-6:
            assert np.all(bound - direct <= 1e-6 * direct + 1e-300)
        linear = M._tail_T_bound(t, (terms[0], np.zeros_like(terms[1]), terms[2]), st_)
        first_order_only_fails |= bool(np.any(linear < direct * (1 - 1e-13)))
    assert first_order_only_fails


def _bisect_smallest_eps(pmf, extra, err_l2, delta, kw, *, hi, iters=70):
    """The smallest eps in [0, hi] with T(eps) * slack <= delta, by bisection on the reference T
    (an independent oracle: no Newton step, no estimate), to (hi / 2^70)."""
    slack = 1 + 1e-12
    lo = np.zeros(pmf.shape[0])
    hi = hi.copy()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        t = _reference_tail_T(pmf, extra, err_l2, mid, **kw)[0]
        ok = t * slack <= delta
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return hi


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_solve_tail_eps_is_certified_and_within_tolerance_of_bisection(seed: int) -> None:
    """Every finite eps of the search meets its delta under the reference T (the certificate) and
    lies within tol (1 + eps) of the smallest such eps found by plain bisection; eps = 0 and +inf
    exactly where the bisection says so. Deltas over eight decades, rows with y < 0 entries, rows
    whose T is mostly the flat ``extra`` (Newton steps that leave the bracket: bisection)."""
    pmf, extra, _, kw = _problem(seed, b=160, n=60)
    rng = np.random.default_rng(seed + 20)
    b = pmf.shape[0]
    delta = 10.0 ** rng.uniform(-13, -3, b)
    delta[:5] = 0.9  # met at eps = 0
    delta[5:10] = 1e-300  # never met: +inf
    extra[10:20] = delta[10:20] * rng.uniform(0.5, 0.99, 10)  # T flat near delta
    tol = 1e-8
    got = M.solve_tail_eps(pmf, extra, M.FFT_ERROR_L2, delta=delta, tol=tol, **kw)
    hi = (pmf.shape[1] * kw["h"] + 40 * kw["sigma"] * np.sqrt(kw["g_hi"])) / kw["sigma"] ** 2 + 1.0
    t_hi, *_ = _reference_tail_T(pmf, extra, M.FFT_ERROR_L2, hi, **kw)
    t_0, *_ = _reference_tail_T(pmf, extra, M.FFT_ERROR_L2, np.zeros(b), **kw)
    slack = 1 + 1e-12
    np.testing.assert_array_equal(got == 0, t_0 * slack <= delta)
    np.testing.assert_array_equal(np.isinf(got), (t_0 * slack > delta) & (t_hi * slack > delta))
    fin = np.isfinite(got) & (got > 0)
    assert fin.sum() > b // 2
    sub = {**kw, "g_lo": kw["g_lo"][fin], "g_hi": kw["g_hi"][fin]}
    t_at, *_ = _reference_tail_T(pmf[fin], extra[fin], M.FFT_ERROR_L2, got[fin], **sub)
    assert np.all(t_at * slack <= delta[fin])
    best = _bisect_smallest_eps(pmf[fin], extra[fin], M.FFT_ERROR_L2, delta[fin], sub, hi=hi[fin])
    assert np.all(got[fin] >= best - 1e-15 * (1 + best))
    # rows with g_lo = 0 and entries y < 0: the proven round-off bound has no finite argument error
    # there (tau_lo = 0), so their eps is larger (still certified); the others meet the target
    tight = kw["g_lo"][fin] > 0
    assert np.all((got[fin] - best)[tight] <= tol * (1 + got[fin][tight]))


@settings(max_examples=60, deadline=None)
@given(
    w=st.lists(st.integers(1, 60), min_size=1, max_size=40),
    q=st.lists(st.sampled_from([0.0, 1e-3, 0.01, 0.05, 0.3, 0.9, 1.0]), min_size=40, max_size=40),
    cut=st.sampled_from([0.0, 1e-14, 1e-9, 1e-4]),
)
def test_row_mixture_equals_the_reference_recursion(w, q, cut) -> None:
    weights = np.array(w, dtype=np.int64)
    probs = np.array(q[:len(w)])
    got = M.row_mixture(weights, probs, cut=cut)
    want = row_mixture_step_by_step(weights, probs, cut=cut)
    assert got[0].tobytes() == want[0].tobytes()
    assert got[1].tobytes() == want[1].tobytes()
    assert got[2] == want[2]


def test_row_mixture_cut_rows_equal_the_reference() -> None:
    """A dense row with many cuts (the case the zero-kept buffer must get right)."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        weights = rng.integers(1, 120, 150)
        probs = rng.choice([0.01, 0.02, 0.2], 150)
        got = M.row_mixture(weights, probs, cut=1e-9)
        want = row_mixture_step_by_step(weights, probs, cut=1e-9)
        assert got[2] > 0
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
        assert got[2] == want[2]


def _reference_tail_pairs(c: np.ndarray, resolution: int):
    """MMCC's tail pairs by the definition, pair by pair: G accumulated row by row (full outer
    products, the same sums), each seen column's rounded-up G row binned, problems keyed by
    (g index, histogram) in order of first occurrence."""
    m, n = c.shape
    nbins = resolution + 2
    g = np.zeros((n, n))
    seen = np.zeros(n, dtype=bool)
    keys: dict = {}
    rows, cols, key, counts, gidx = [], [], [], [], []
    for r in range(m):
        for j in np.flatnonzero(c[r]):
            if not seen[j]:
                continue
            k = np.minimum(M._round_up_to_grid(g[j, seen], resolution), nbins - 1)
            hist = np.bincount(k, minlength=nbins)
            hist[0] = 0
            kb = (int(np.ceil(g[j, j] / M.G_QUANTUM)), tuple(hist.tolist()))
            if kb not in keys:
                keys[kb] = len(keys)
                counts.append(hist)
                gidx.append(kb[0])
            rows.append(r)
            cols.append(j)
            key.append(keys[kb])
        g += np.outer(c[r], c[r])
        seen |= c[r] != 0
    return rows, cols, key, counts, gidx


def _pair_cases():
    rng = np.random.default_rng(7)
    dense = np.tril(rng.uniform(0.1, 1.0, (24, 24)))  # every index set a range: the sliced path
    toeplitz = sum(np.diag(np.full(30 - k, 0.5 ** k), -k) for k in range(4))  # repeated problems
    sparse = np.tril(rng.uniform(0.1, 1.0, (28, 28)) * (rng.random((28, 28)) < 0.3)) + np.eye(28)  # gathered path
    # rows released at the last step over equal columns: the pairs of one row share a new problem
    ones = (np.ones((6, 4)), np.full(6, 3))
    return [(dense, None), (toeplitz, None), (sparse, None), ones]


@pytest.mark.parametrize("case", range(4))
def test_collect_tail_pairs_equals_the_pair_by_pair_definition(case: int) -> None:
    """The row-at-a-time collection (views where the indices are ranges, keys of a whole row at
    once, the first pair of each new problem found by index) equals the definition pair by pair:
    the same pairs, problem indices, histograms and g indices."""
    c, steps = _pair_cases()[case]
    prep = M.prepare_strategy(c, steps)
    got = M.collect_tail_pairs(prep, resolution=20)
    rows, cols, key, counts, gidx = _reference_tail_pairs(prep.strategy, 20)
    assert got.rows.tolist() == rows and got.cols.tolist() == cols and got.key.tolist() == key
    assert got.counts.tolist() == [h.tolist() for h in counts] and got.g_index.tolist() == gidx
    assert got.counts.shape[0] < len(rows) or case in (0, 2)  # the repeated cases do repeat


@settings(max_examples=200, deadline=None)
@given(lo=st.integers(0, 50), width=st.integers(0, 300), at=st.integers(0, 400), guess=st.integers(-10, 500))
def test_smallest_level_equals_plain_bisection(lo: int, width: int, at: int, guess: int) -> None:
    """The cut search from a guess returns what the plain bisection over [lo, hi] returns, for every
    threshold (true from ``at`` on, always at hi) and every guess, in or out of range."""
    hi = lo + width
    first = min(max(at, lo), hi)

    def holds(c: int) -> bool:
        assert lo <= c <= hi
        return c >= first

    a, b = lo, hi
    while a < b:
        mid = (a + b) // 2
        if holds(mid):
            b = mid
        else:
            a = mid + 1
    assert smallest_true(holds, lo, hi, guess=guess) == a


def test_tail_epsilons_cut_from_the_guess_equals_the_bisection(monkeypatch) -> None:
    """tail_epsilons with the closed-form start of the cut search equals it with the search
    started at the bottom (the plain bisection), bit for bit, on a banded and a dense strategy."""
    for c in (sum(np.diag(np.full(40 - k, 0.6 ** k), -k) for k in range(6)),
              np.tril(np.random.default_rng(3).uniform(0.1, 1.0, (24, 24)))):
        prep = M.prepare_strategy(c)
        sigma = 1.5 / prep.sensitivity
        pairs = M.collect_tail_pairs(prep, resolution=M.default_tail_resolution(sigma))
        got = M.tail_epsilons(pairs, p=0.05, sigma=sigma, delta_pair=1e-9)
        with monkeypatch.context() as mp:
            mp.setattr(M, "_chernoff_level_guess", lambda *a: 1)
            want = M.tail_epsilons(pairs, p=0.05, sigma=sigma, delta_pair=1e-9)
        assert got.tobytes() == want.tobytes()
