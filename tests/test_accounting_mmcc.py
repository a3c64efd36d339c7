"""MMCC (docs/accounting.md) against its oracles: DP-SGD for C = I, the exact small cases, the bracket
[lower bound, full participation], monotonicity, and unit tests of every step (tail law and bound
against brute force and Monte Carlo, rounding always upward, dp-accounting's own composition)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from accounting_oracles import banded, bernoulli_sum_law, sqrt_toeplitz, unit
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mfcli.accounting import mmcc as M
from mfcli.accounting.single_pass import dpsgd, gaussian_epsilon
from mfcli.errors import MfcliError


def tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Binary tree encoder on n = 2^k leaves built here (rows in release order: a leaf, then the
    ancestors that close at the same step, bottom-up) and the release steps."""
    rows, steps = [], []
    k = int(math.log2(n))
    for t in range(n):
        for level in range(k + 1):
            size = 2**level
            if (t + 1) % size == 0:
                r = np.zeros(n)
                r[t + 1 - size:t + 1] = 1.0
                rows.append(r)
                steps.append(t)
    return np.array(rows), np.array(steps)


# ---------------------------------------------------------------------------------------------
# Whole-algorithm oracles


def test_identity_equals_dpsgd() -> None:
    r = M.mmcc(np.eye(64), sigma=4.0, sampling=0.01, delta=1e-6)
    assert r.pairs == 0 and r.delta_tail == 0.0 and r.delta_pld == pytest.approx(1e-6, rel=1e-9)
    assert r.value_discretization == 1e-4
    ref = dpsgd(sigma=4.0, sampling=0.01, steps=64, delta=1e-6).epsilon
    assert r.epsilon == pytest.approx(ref, rel=1e-8)
    assert r.epsilon == pytest.approx(0.0767230, abs=5e-8)


@pytest.mark.parametrize("n,sigma,p", [(32, 2.0, 0.05), (100, 1.0, 0.2)])
def test_identity_equals_dpsgd_other_settings(n: int, sigma: float, p: float) -> None:
    r = M.mmcc(np.eye(n), sigma=sigma, sampling=p, delta=1e-5, value_discretization=1e-3)
    ref = dpsgd(sigma=sigma, sampling=p, steps=n, delta=1e-5, value_discretization=1e-3).epsilon
    assert r.epsilon == pytest.approx(ref, rel=1e-7)


# docs/accounting.md, "Exact small cases": true epsilon by Monte Carlo, [low, high] = 3 standard errors.
EXACT = [
    ("band2", lambda: unit(banded(8, 2)), 2.0, 0.05, 1e-2, 0.0990, 0.0999),
    ("sqrtS", lambda: unit(sqrt_toeplitz(6)), 1.0, 0.2, 1e-2, 3.0725, 3.1017),
    ("ones", lambda: unit(np.tril(np.ones((8, 8)))), 2.0, 0.05, 1e-3, 0.4109, 0.4166),
]


@pytest.mark.parametrize("name,make,sigma,p,delta,low,high", EXACT, ids=[e[0] for e in EXACT])
def test_exact_small_cases(name, make, sigma, p, delta, low, high) -> None:
    c = make()
    r = M.mmcc(c, sigma=sigma, sampling=p, delta=delta, value_discretization=1e-3)
    lb = M.lower_bound(c, sigma=sigma, sampling=p, delta=delta)
    assert r.epsilon >= low
    assert lb.epsilon <= high
    assert r.epsilon <= 12 * high  # observed looseness 1.1x to 10x (same section)


BRACKET = [
    ("identity", lambda: (np.eye(16), None)),
    ("band2", lambda: (banded(16, 2), None)),
    ("band8", lambda: (banded(16, 8), None)),
    ("sqrt", lambda: (sqrt_toeplitz(16), None)),
    ("tree", lambda: tree(16)),
]


@pytest.mark.parametrize("name,make", BRACKET, ids=[b[0] for b in BRACKET])
def test_bracket_lower_mmcc_full_participation(name, make) -> None:
    c, steps = make()
    kw = dict(sigma=3.0, sampling=0.02, delta=1e-5, release_steps=steps)
    r = M.mmcc(c, value_discretization=1e-3, **kw)
    lb = M.lower_bound(c, **kw)
    fp = M.full_participation(c, sigma=3.0, delta=1e-5, release_steps=steps)
    assert lb.epsilon <= r.epsilon <= fp.epsilon
    # the full-participation bound is a Gaussian with sensitivity ||C 1|| / sens(C)
    sens = np.sqrt((c**2).sum(axis=0)).max()
    assert fp.epsilon == pytest.approx(gaussian_epsilon(1e-5, np.linalg.norm(c.sum(axis=1)) / 3.0), rel=1e-12)
    assert fp.sensitivity == pytest.approx(np.linalg.norm(c.sum(axis=1)) / sens, rel=1e-12)


def test_monotone_in_sigma_and_p() -> None:
    c = banded(24, 4)
    kw = dict(delta=1e-5, value_discretization=1e-3)
    by_sigma = [M.mmcc(c, sigma=s, sampling=0.02, **kw).epsilon for s in (1.5, 3.0, 6.0)]
    assert by_sigma[0] > by_sigma[1] > by_sigma[2]
    by_p = [M.mmcc(c, sigma=3.0, sampling=q, **kw).epsilon for q in (0.005, 0.02, 0.08)]
    assert by_p[0] < by_p[1] < by_p[2]


def test_scale_invariance() -> None:
    """sigma is in units of C as given: scaling C and sigma together changes nothing."""
    c = banded(12, 3)
    a = M.mmcc(c, sigma=2.0, sampling=0.05, value_discretization=1e-3).epsilon
    b = M.mmcc(5 * c, sigma=10.0, sampling=0.05, value_discretization=1e-3).epsilon
    assert a == pytest.approx(b, rel=1e-9)


def test_fast_engine_equals_dp_accounting_engine() -> None:
    c = banded(6, 2)
    kw = dict(sigma=2.0, sampling=0.1, delta=1e-4, value_discretization=1e-2, pld_work_budget=None)
    fast = M.mmcc(c, engine="fast", **kw)
    ref = M.mmcc(c, engine="dp-accounting", **kw)
    assert fast.epsilon == pytest.approx(ref.epsilon, rel=1e-7)
    # the recorded event is what was composed: dp-accounting's accountant on it gives the same eps
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-2)
    acc.compose(fast.dp_event())
    assert acc.get_epsilon(fast.delta_pld) == pytest.approx(ref.epsilon, rel=1e-9)


def test_tail_fractions_take_the_best() -> None:
    c = banded(12, 3)
    r = M.mmcc(c, sigma=2.0, sampling=0.05, tail_fractions=(0.1, 0.5, 0.9), value_discretization=1e-3)
    assert set(r.fractions_tried) == {0.1, 0.5, 0.9}
    assert r.epsilon == min(r.fractions_tried.values())
    assert r.delta_tail == pytest.approx(r.tail_fraction * r.delta)


def test_p_one_is_full_participation() -> None:
    c = banded(8, 2)
    r = M.mmcc(c, sigma=3.0, sampling=1.0, delta=1e-5, value_discretization=1e-4)
    fp = M.full_participation(c, sigma=3.0, delta=1e-5)
    assert r.delta_tail == 0.0 and r.max_p_tilde == 1.0
    # rows rounded up to the mixture grid: at least the exact Gaussian, and close to it
    assert fp.epsilon - 1e-9 <= r.epsilon <= fp.epsilon * 1.03


# ---------------------------------------------------------------------------------------------
# Step 1: the tail events


@pytest.mark.parametrize("weights,p", [([1, 2, 2, 3], 0.3), ([5, 1, 1, 1, 4, 2, 7], 0.1), ([3] * 9, 0.5)])
def test_w_law_matches_enumeration(weights, p) -> None:
    w = np.array(weights)
    counts = np.bincount(w, minlength=w.max() + 1)[None, :]
    brute = bernoulli_sum_law(w, p)
    cap = int(w.sum()) + 1
    pmf, ov = M.w_law(counts, p, cap)
    for x, prob in brute.items():
        assert pmf[0, x] == pytest.approx(prob, rel=1e-12, abs=1e-18)
    assert ov[0] == pytest.approx(0.0, abs=1e-15)
    # truncated: the mass at and above the cap is all in the overflow
    cap2 = int(w.sum()) // 2
    pmf2, ov2 = M.w_law(counts, p, cap2)
    above = sum(v for x, v in brute.items() if x >= cap2)
    assert ov2[0] == pytest.approx(above, rel=1e-10)
    np.testing.assert_allclose(pmf2[0], pmf[0, :cap2], rtol=1e-12, atol=1e-18)
    # the FFT path agrees, and its Chernoff tail bound is a bound
    pf, _, err = M.w_law_fft(counts, p, 64)
    # (p >= 1/2: no proven bound, err = inf; the values still agree to the former allowance)
    np.testing.assert_allclose(pf[0, :cap], pmf[0], atol=err if np.isfinite(err) else M.FFT_ERROR_L2)
    for c in range(1, cap + 2):
        assert M.chernoff_tail(counts, p, float(c))[0] >= sum(v for x, v in brute.items() if x >= c) * (1 - 1e-12)


def test_tail_problem_llr_law_by_simulation() -> None:
    """The tail variable of step 1, l = (W + sigma ||c|| Z - G_jj / 2) / sigma^2, has the law of the
    actual log-likelihood bound (<c, y_<r> - G_jj/2) / sigma^2 with y_<r = C[:r] b + sigma Z."""
    rng = np.random.default_rng(7)
    c = unit(banded(6, 3))
    sigma, p, r, j = 0.8, 0.3, 4, 2
    col = c[:r, j]
    g = c[:r].T @ c[:r]
    trials = 200_000
    b = rng.random((trials, 6)) < p
    y = (b @ c[:r].T) + sigma * rng.standard_normal((trials, r))
    l_actual = (y @ col - g[j, j] / 2) / sigma**2
    b2 = rng.random((trials, 6)) < p
    w = b2 @ g[j]
    l_formula = (w + sigma * np.sqrt(g[j, j]) * rng.standard_normal(trials) - g[j, j] / 2) / sigma**2
    for q in (0.5, 0.9, 0.99):
        assert np.quantile(l_actual, q) == pytest.approx(np.quantile(l_formula, q), abs=0.03)


@pytest.mark.parametrize("method", ["direct", "fft"])
def test_tail_eps_against_monte_carlo(method: str) -> None:
    """eps_rj solved on the rounded-up law meets its delta for the exact tail (Monte Carlo), and is
    not far above the exact solution."""
    rng = np.random.default_rng(3)
    c = unit(banded(8, 3))
    prep = M.prepare_strategy(c)
    sigma, p = 0.7, 0.2
    pairs = M.collect_tail_pairs(prep, resolution=M.default_tail_resolution(sigma))
    delta_pair = 1e-2
    eps = M.tail_epsilons(pairs, p=p, sigma=sigma, delta_pair=delta_pair, method=method)
    assert np.all(np.isfinite(eps)) and np.all(eps > 0)
    # replay three pairs exactly
    g_full = None
    trials = 400_000
    for idx in (0, pairs.count // 2, pairs.count - 1):
        r, j = int(pairs.rows[idx]), int(pairs.cols[idx])
        g_full = c[:r].T @ c[:r]
        b = rng.random((trials, c.shape[1])) < p
        loss = (b @ g_full[j] + sigma * np.sqrt(g_full[j, j]) * rng.standard_normal(trials) - g_full[j, j] / 2) / sigma**2
        e = eps[pairs.key[idx]]
        tail = np.mean(loss > e)
        se = math.sqrt(delta_pair * (1 - delta_pair) / trials)
        assert tail <= delta_pair + 4 * se
        # and the rounding costs little: a slightly smaller eps already fails
        assert np.mean(loss > e - 0.1) > delta_pair


@given(x=st.lists(st.floats(0, 3, allow_nan=False), min_size=1, max_size=20), m=st.integers(1, 200))
def test_round_up_to_grid_never_rounds_down(x, m) -> None:
    a = np.array(x)
    k = M._round_up_to_grid(a, m)
    assert np.all(k / m >= a)
    assert np.all((k - 1) / m < a + 1e-12)


@given(p=st.floats(1e-4, 0.999), eps=st.floats(0, 20))
def test_posterior_bound_rounds_up(p: float, eps: float) -> None:
    exact = p * math.exp(eps) / (p * math.exp(eps) + 1 - p)
    got = float(M.posterior_bound(p, np.array([eps]))[0])
    assert exact <= got <= min(1.0, exact * (1 + 1e-9))
    assert got >= p


def test_posterior_bound_infinite_eps_is_one() -> None:
    assert M.posterior_bound(0.01, np.array([np.inf]))[0] == 1.0


# ---------------------------------------------------------------------------------------------
# Step 3: row mixtures


@settings(max_examples=15)
@given(
    w=st.lists(st.integers(1, 6), min_size=1, max_size=7),
    q=st.lists(st.floats(0.01, 0.99), min_size=7, max_size=7),
)
def test_row_mixture_matches_enumeration(w, q) -> None:
    w = np.array(w)
    q = np.array(q[: w.size])
    support, probs, eta = M.row_mixture(w, q, cut=0.0)
    brute = bernoulli_sum_law(w, q)
    assert eta == 0.0
    assert dict(zip(support.tolist(), probs.tolist(), strict=True)) == pytest.approx(brute, rel=1e-10)


def test_row_mixture_cut_is_counted() -> None:
    w = np.array([1, 2, 3, 4, 5, 6])
    q = np.full(6, 0.1)
    support_full, probs_full, eta_full = M.row_mixture(w, q, cut=0.0)
    support, probs, eta = M.row_mixture(w, q, cut=1e-3)
    assert eta_full == 0.0 and support_full.max() == 21
    assert 0 < eta <= 1e-3
    assert support.max() < 21
    assert probs.sum() == pytest.approx(1.0)
    # every outcome beyond the cut support went through a cut partial sum, so eta covers its mass
    assert 0 < probs_full[support_full > support.max()].sum() <= eta * (1 + 1e-12)


def test_rounded_rows_dominate_exact_rows() -> None:
    """Rounding C[r, j] up to the grid makes S_r stochastically larger: its CDF is pointwise below
    the exact one (computed by enumeration)."""
    c = unit(sqrt_toeplitz(5))
    row = c[4]
    q = np.array([0.05, 0.1, 0.2, 0.3, 0.4])
    k = M._round_up_to_grid(row, 50)
    support, probs, _ = M.row_mixture(k, q, cut=0.0)
    grid = np.linspace(0, row.sum() + 0.1, 400)
    rounded_cdf = np.array([probs[support / 50 <= t].sum() for t in grid])
    exact = bernoulli_sum_law(row, q)
    exact_cdf = np.array([sum(v for s, v in exact.items() if s <= t) for t in grid])
    assert np.all(rounded_cdf <= exact_cdf + 1e-12)


# ---------------------------------------------------------------------------------------------
# Lower bound and input checks


def test_lower_bound_is_the_exact_epsilon_of_the_statistic() -> None:
    """For C = I the statistic is Bin(n, p) + N(0, n sigma^2); dp-accounting's exact MoG
    hockey-stick at the reported eps must sit at delta (both directions' max)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    n, sigma, p, delta = 20, 1.0, 0.1, 1e-4
    lb = M.lower_bound(np.eye(n), sigma=sigma, sampling=p, delta=delta)
    assert lb.noise_scale == pytest.approx(sigma * math.sqrt(n))
    k = np.arange(n + 1)
    pr = stats.binom.pmf(k, n, p)
    keep = pr > 1e-300

    def worst(e: float) -> float:
        out = 0.0
        for adj in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD):
            loss = plm.MixtureGaussianPrivacyLoss(lb.noise_scale, list(k[keep].astype(float)), list(pr[keep] / pr[keep].sum()),
                                                  adjacency_type=adj)
            out = max(out, float(loss.get_delta_for_epsilon([e])[0]))
        return out

    assert worst(lb.epsilon) >= delta * (1 - 1e-6)
    assert worst(lb.epsilon * 1.001 + 1e-6) <= delta


@pytest.mark.parametrize(
    "c,steps,msg",
    [
        (np.array([[1.0, 0.0], [-0.1, 1.0]]), None, "non-negative"),
        (np.array([[1.0, 0.5], [0.0, 1.0]]), None, "not causal"),
        (np.array([[1.0, 0.0], [1.0, 0.0]]), None, "column 1"),
        (np.ones((3, 2)), None, "release step"),
        (np.array([[1.0, 0.0], [0.0, 1.0]]), [1, 0], "non-decreasing"),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), None, "NaN"),
        (np.zeros((0, 3)), None, "non-empty"),
    ],
)
def test_prepare_strategy_rejects(c, steps, msg) -> None:
    with pytest.raises(MfcliError, match=msg):
        M.prepare_strategy(c, steps)


@pytest.mark.parametrize(
    "kwargs",
    [dict(sigma=0.0, sampling=0.1), dict(sigma=1.0, sampling=0.0), dict(sigma=1.0, sampling=1.01),
     dict(sigma=1.0, sampling=0.1, delta=1.0), dict(sigma=1.0, sampling=0.1, tail_fractions=(1.0,)),
     dict(sigma=1.0, sampling=0.1, engine="magic")],
)
def test_mmcc_bad_parameters(kwargs) -> None:
    with pytest.raises(MfcliError):
        M.mmcc(np.eye(3), **kwargs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tail_bracket_decisions_equal_the_full_evaluation(seed: int) -> None:
    """``_tail_T_meets`` settles T_up(eps) * slack <= delta (T_up the proven bound on the exact T,
    ``_tail_T_up``) by certificates where it can (every f is 0; the x = 0 term alone above delta):
    the same decision as evaluating T_up in full, at the bracket's ends and in between, for deltas
    around T's values, except within 1e-9 of T_up (the shortcut's own bound differs by round-off)."""
    rng = np.random.default_rng(seed)
    b, n, sigma, h = 300, 60, float(rng.uniform(0.5, 4)), 0.05
    pmf = rng.dirichlet(np.ones(n) * 0.3, size=b)
    extra = rng.uniform(0, 1e-9, b) * (rng.random(b) < 0.7)
    g_hi = rng.uniform(0.05, 1.0, b)
    g_lo = np.maximum(g_hi - M.G_QUANTUM, 0.0)
    hi = (n * h + 40 * sigma * np.sqrt(g_hi)) / sigma**2 + 1.0
    slack = 1 + 1e-12
    for eps in (np.zeros(b), hi, hi * rng.uniform(0, 1, b)):
        norm = np.empty(b)
        t = M._tail_T(pmf, extra, M.FFT_ERROR_L2, eps, sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi, norm_out=norm)
        t = M._tail_T_up(t, extra, norm, M.FFT_ERROR_L2, eps, M.TailProof.plain(b, n, M.FFT_ERROR_L2), n,
                         sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
        for delta in (t * slack, np.nextafter(t * slack, 0), t * rng.uniform(0.5, 2, b), np.full(b, 1e-10)):
            got = M._tail_T_meets(pmf, extra, M.FFT_ERROR_L2, eps, delta, slack, sigma=sigma, h=h,
                                         g_lo=g_lo, g_hi=g_hi)
            clear = np.abs(t * slack / delta - 1) > 1e-9
            np.testing.assert_array_equal(got[clear], (t * slack <= delta)[clear])
            assert np.all(~got | (t * slack <= delta * (1 + 1e-9)))


@pytest.mark.parametrize("seed", [0, 1])
def test_tail_z_from_a_start_column_equals_the_full_array(seed: int) -> None:
    """``_tail_z(..., start=k)`` (the bracket's certificate needs the last column only) gives the
    full array's columns k.. bit for bit, y < 0 (the rescaled entries) included."""
    rng = np.random.default_rng(seed)
    b, n, sigma, h = 50, 40, float(rng.uniform(0.5, 4)), 0.05
    eps = rng.uniform(0, 0.5, b)
    g_hi = rng.uniform(0.05, 1.0, b)
    g_lo = np.maximum(g_hi - M.G_QUANTUM, 0.0)
    g_lo[:3] = 0.0  # tau's ratio infinite for y < 0
    full = M._tail_z(eps, n, sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
    assert (full > 0).any() and (full < 0).any()
    for start in (0, 1, n // 2, n - 1):
        part = M._tail_z(eps, n, sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi, start=start)
        assert part.tobytes() == np.ascontiguousarray(full[:, start:]).tobytes()
