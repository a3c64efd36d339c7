"""MMCC's floating point upstream of the row PLDs, against independent derivations (mpmath at 60
digits, exact rationals): the tail events' Gram entries, the tail probability T's proven upper
bound and the tail epsilons it certifies, the posterior bounds p~, the FFT law's error bound, and
the lower bound's certified hockey-stick values (docs/accounting.md, "Round-off upstream of the
row PLDs"). Each adversarial case is one where the floating-point value alone (the code before
0.5) falls on the wrong side of the exact one, so a mutant without the allowance fails here."""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest

from mfcli.accounting import mmcc as M
from mfcli.accounting import mmcc_lower as ML

mp.mp.dps = 60


def _phibar(z: mp.mpf) -> mp.mpf:
    return mp.erfc(z / mp.sqrt(2)) / 2


# ---------------------------------------------------------------------------------------------
# the tail problems' Gram entries


def _adversarial_c() -> np.ndarray:
    """Column 0 sums in floating point to exactly the W grid point 0.25 = 5/20 (and to a multiple
    of 2^-40) while its exact Gram entry is 0.25 + 1e-18 above it."""
    return np.array([[0.5, 0.0, 0.0],
                     [1e-9, 0.6, 0.0],
                     [0.8, 0.3, 1.0]])


def test_gram_entries_rounded_up_above_the_exact_ones() -> None:
    c = _adversarial_c()
    prep = M.prepare_strategy(c)
    assert prep.sensitivity == 1.0  # the prepared entries are C's, exactly
    g_computed = c[0, 0] * c[0, 0] + c[1, 0] * c[1, 0]
    assert g_computed == 0.25  # the floating-point sum lands on the grid point
    exact = Fraction(c[0, 0]) ** 2 + Fraction(c[1, 0]) ** 2
    assert exact > Fraction(1, 4)
    pairs = M.collect_tail_pairs(prep, resolution=20)
    # the pair (r = 2, j = 0): its W histogram holds G[0, 0] (rounded up to 6/20, not 5/20) and G[0, 1]
    i = int(np.flatnonzero((pairs.rows == 2) & (pairs.cols == 0))[0])
    hist = pairs.counts[pairs.key[i]]
    assert hist[5] == 0 and hist[6] == 1
    assert Fraction(6, 20) >= exact * Fraction(1 + 4 * 2**-53)  # with the scaling's two half-ulps
    # G[j, j]'s interval holds the exact diagonal
    g_lo, g_hi = pairs.g_bounds()
    k = pairs.key[i]
    assert Fraction(float(g_lo[k])) <= exact * Fraction(1 - 4 * 2**-53)
    assert Fraction(float(g_hi[k])) >= exact * Fraction(1 + 4 * 2**-53)


def test_tiny_entries_are_refused() -> None:
    c = np.eye(3)
    c[2, 0] = 1e-160
    with pytest.raises(M.MfcliError, match="normal"):
        M.prepare_strategy(c)


# ---------------------------------------------------------------------------------------------
# the tail probability T and the tail epsilons


def _cancelling_problem():
    """One atom of W at x0 / M_W and a tiny G[j, j]: y = eps sigma^2 + g/2 - x0 / M_W is a difference
    of two numbers near 0.777 while tau = sigma sqrt(g) is 1e-5, so y's rounding moves z by ~1e-11
    and f by ~z 1e-11 relatively: far beyond the 1e-12 slack the search had alone."""
    sigma, mw, x0, n = 0.01, 1000, 777, 800
    q = M.G_QUANTUM
    g_hi = np.array([round(1e-6 / q) * q])
    g_lo = g_hi - q
    pmf = np.zeros((1, n))
    pmf[0, x0] = 1.0
    return pmf, dict(sigma=sigma, h=1.0 / mw, g_lo=g_lo, g_hi=g_hi), mw, x0


def _exact_t(eps: float, kw: dict, mw: int, x0: int) -> mp.mpf:
    """T of the atom at the exact grid value x0 / M_W (y >= 0: tau = sigma sqrt(g_hi))."""
    sigma = mp.mpf(kw["sigma"])
    y = mp.mpf(eps) * sigma**2 + mp.mpf(float(kw["g_lo"][0])) / 2 - mp.mpf(x0) / mw
    assert y > 0
    return _phibar(y / (sigma * mp.sqrt(mp.mpf(float(kw["g_hi"][0])))))


def test_tail_bound_above_mpmath_where_the_plain_value_is_below() -> None:
    pmf, kw, mw, x0 = _cancelling_problem()
    n = pmf.shape[1]
    extra = np.zeros(1)
    plain_below = 0
    for z in np.linspace(5, 30, 120):
        eps = np.array([(x0 / mw - kw["g_lo"][0] / 2 + z * kw["sigma"] * math.sqrt(kw["g_hi"][0])) / kw["sigma"] ** 2])
        exact = _exact_t(float(eps[0]), kw, mw, x0)
        norm = np.empty(1)
        t = M._tail_T(pmf, extra, 0.0, eps, norm_out=norm, **kw)
        up = M._tail_T_up(t, extra, norm, 0.0, eps, M.TailProof.plain(1, n, 0.0), n, **kw)
        assert mp.mpf(float(up[0])) >= exact
        plain_below += mp.mpf(float(t[0])) * (1 + mp.mpf(M.TAIL_SLACK)) < exact
    assert plain_below > 10  # the old certificate (t (1 + 1e-12) <= delta) would pass below the exact T


def test_tail_epsilon_certified_against_mpmath() -> None:
    pmf, kw, mw, x0 = _cancelling_problem()
    for target_z in (6.0, 9.0, 14.0):
        delta = float(_phibar(mp.mpf(target_z)))
        eps = M.solve_tail_eps(pmf, np.zeros(1), 0.0, delta=delta, tol=1e-12, **kw)
        assert np.isfinite(eps[0])
        assert _exact_t(float(eps[0]), kw, mw, x0) <= delta


def _exact_w_law(counts: np.ndarray, p: float) -> list:
    """The law of W = sum of counts[k] Bernoulli(p) terms of weight k, in mpmath, by convolution."""
    law = [mp.mpf(1)]
    pp, qq = mp.mpf(p), 1 - mp.mpf(p)
    for k, c in enumerate(counts.tolist()):
        for _ in range(int(c) if k else 0):
            new = [mp.mpf(0)] * (len(law) + k)
            for i, v in enumerate(law):
                new[i] += qq * v
                new[i + k] += pp * v
            law = new
    return law


@pytest.mark.parametrize("p", [0.01, 0.3])
def test_fft_error_bound_above_the_actual_error(p: float) -> None:
    rng = np.random.default_rng(3)
    counts = np.zeros((3, 22), dtype=np.int64)
    for row in counts:
        row[rng.integers(1, 22, 25)] += 1
    length = 1024
    pmf = M._w_pmf_fft(counts, p, length)
    err = M.fft_error_l2(int(counts.sum(axis=1).max()), 22, p, length, norm=np.sqrt((pmf * pmf).sum(axis=1)))
    for b in range(3):
        law = _exact_w_law(counts[b], p)
        folded = [mp.mpf(0)] * length
        for i, v in enumerate(law):
            folded[i % length] += v
        actual = mp.sqrt(sum((mp.mpf(float(pmf[b, i])) - folded[i]) ** 2 for i in range(length)))
        assert actual <= err[b]
        assert err[b] < 1e-12


@pytest.mark.parametrize("level", [20.0, 60.0, 150.0])
def test_chernoff_bound_with_its_round_off_above_the_exact_tail(level: float) -> None:
    counts = np.zeros((1, 22), dtype=np.int64)
    counts[0, [3, 7, 7, 12, 20, 21]] = [4, 2, 3, 5, 6, 1]
    counts[0, 7] = 5
    p = 0.05
    lmgf = M._log_mgf(counts, p, M._CHERNOFF_LAMBDAS)
    value, rel = M._chernoff_and_error(lmgf, level, counts.sum(axis=1).astype(float),
                                       (counts @ np.arange(22)).astype(float), p, 22)
    law = _exact_w_law(counts[0], p)
    exact_tail = sum(law[math.ceil(level):])
    assert mp.mpf(float(value[0])) * (1 + mp.mpf(float(rel[0]))) >= exact_tail
    # and the Chernoff bound at the chosen lambda, exactly, is below the bound with its round-off
    bound = lmgf[0] - M._CHERNOFF_LAMBDAS * level
    lam = mp.mpf(float(M._CHERNOFF_LAMBDAS[int(np.argmin(bound))]))
    exact_mgf = sum(v * mp.e ** (lam * i) for i, v in enumerate(law))
    assert value[0] < 1.0
    assert mp.e ** (mp.log(exact_mgf) - lam * level) <= mp.mpf(float(value[0])) * (1 + mp.mpf(float(rel[0])))


# ---------------------------------------------------------------------------------------------
# posterior bounds


def test_posterior_bound_above_mpmath() -> None:
    rng = np.random.default_rng(11)
    ps = np.concatenate([10.0 ** rng.uniform(-6, -0.01, 300), [1e-300, 0.5, 0.999999]])
    eps = np.concatenate([rng.uniform(0, 40, 300), [3.0, 1e-300, 745.0]])
    got = np.array([M.posterior_bound(float(p), np.array([e]))[0] for p, e in zip(ps, eps, strict=True)])
    raw_below = 0
    for p, e, g in zip(ps, eps, got, strict=True):
        exact = 1 / (1 + (1 - mp.mpf(p)) / mp.mpf(p) * mp.e ** (-mp.mpf(e)))
        assert mp.mpf(float(g)) >= exact
        raw = 1.0 / (1.0 + (1.0 - p) / p * math.exp(-e))
        raw_below += mp.mpf(raw) < exact
    assert raw_below > 20  # without the margin the plain evaluation falls below p~


# ---------------------------------------------------------------------------------------------
# the lower bound


def _exact_divergence(eps: float, tau: float, s: np.ndarray, q: np.ndarray) -> mp.mpf:
    """max of the two hockey-stick divergences of N(0, tau^2) and sum q_i N(s_i, tau^2) at eps:
    each a half-line test at the threshold where the likelihood ratio crosses e^(+-eps)."""
    t_, s_, q_ = mp.mpf(tau), [mp.mpf(float(v)) for v in s], [mp.mpf(float(v)) for v in q]

    def llr(t):
        return mp.log(sum(qq * mp.e ** ((ss * t - ss * ss / 2) / t_**2) for ss, qq in zip(s_, q_, strict=True)))

    best = mp.mpf(-1)
    for level, remove in ((mp.mpf(eps), True), (-mp.mpf(eps), False)):
        lo, hi = mp.mpf(-50) * t_, mp.mpf(max(s_)) + 50 * t_
        for _ in range(220):  # bisection: llr rises with t
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if llr(mid) < level else (lo, mid)
        thr = (lo + hi) / 2
        if remove:
            val = sum(qq * _phibar((thr - ss) / t_) for ss, qq in zip(s_, q_, strict=True)) \
                - mp.e ** mp.mpf(eps) * _phibar(thr / t_)
        else:
            val = (1 - _phibar(thr / t_)) - mp.e ** mp.mpf(eps) * sum(
                qq * (1 - _phibar((thr - ss) / t_)) for ss, qq in zip(s_, q_, strict=True))
        best = max(best, val)
    return best


@pytest.mark.parametrize("eps", [0.2, 1.0, 2.5])
def test_certified_divergence_below_mpmath(eps: float) -> None:
    s = np.array([0.0, 3.0, 7.0, 12.0])
    q = np.array([0.6, 0.25, 0.1, 0.05])
    tau = 2.5
    got = ML.certified_divergence(eps, tau, s, q, 1e-12)
    exact = _exact_divergence(eps, tau, s, q)
    assert mp.mpf(got) <= exact
    assert mp.mpf(got) >= exact * (1 - mp.mpf(1e-9)) - mp.mpf(1e-300)  # and close to it


def test_certified_divergence_covers_every_law_within_rho() -> None:
    """With rho = 1e-2 the certified value is below the exact divergence of a law within rho of the
    given one (mass moved from the upper atoms to 0 by a relative rho: a smaller divergence)."""
    s = np.array([0.0, 3.0, 7.0, 12.0])
    q = np.array([0.6, 0.25, 0.1, 0.05])
    rho = 1e-2
    moved = q.copy()
    moved[1:] *= 1 - rho
    moved[0] += rho * q[1:].sum()
    assert np.all(np.abs(moved / q - 1) <= rho * 1.001)
    for eps in (0.3, 1.5):
        assert mp.mpf(ML.certified_divergence(eps, 2.5, s, q, rho * 1.001)) <= _exact_divergence(eps, 2.5, s, moved)


def test_lower_bound_statistic_on_an_ill_conditioned_strategy() -> None:
    """The statistic is T = s a^T y with a = fl(C x) (x the computed solution of C^T C x = v) and s
    fixed by the noise tau returned (s sigma_eff ||a|| = tau): in exact arithmetic (mpmath, exact
    rationals) its mean weights s C^T a are >= v (1 + u) for the exact scaled C (within 1 - 2u of the
    prepared entries), however inaccurate the solve: here cond(C^T C) ~ 1e10."""
    n = 6
    c = np.eye(n) * 0.1 + np.eye(n, k=-1)
    prep = M.prepare_strategy(c)
    cp = prep.strategy
    g = cp.T @ cp
    chol = np.linalg.cholesky(g)
    sigma_eff = 1.3
    u = Fraction(2**-53)
    for name in ML.STATISTICS:
        v = ML.statistic_weights(g, name)
        eps, tau = ML.statistic_epsilon(chol, v, sigma_eff=sigma_eff, p=0.1, delta=1e-5, strategy=cp)
        x = np.linalg.solve(chol.T, np.linalg.solve(chol, v))
        a = cp @ x
        norm_a = mp.sqrt(sum(mp.mpf(float(e)) ** 2 for e in a))
        scale = Fraction(mp.nstr(mp.mpf(tau) / (mp.mpf(sigma_eff) * norm_a), 40))
        means = [sum(Fraction(float(cp[r, j])) * Fraction(float(a[r])) for r in range(n)) for j in range(n)]
        if eps == 0.0:
            continue  # a statistic refused (a negative exact weight possible): 0 is a valid lower bound
        for j in range(n):
            assert scale * means[j] * (1 - 2 * u) >= Fraction(float(v[j])) * (1 + u)


def test_lower_bound_statistic_weights_and_noise_exact() -> None:
    """With the strategy, the statistic is T = (1 + kappa) a^T y: in exact rationals its mean
    weights are >= v (1 + u) (so the rounded-down mean law is below them) and its noise is <= tau."""
    c = M.prepare_strategy(np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None]).strategy
    g = c.T @ c
    chol = np.linalg.cholesky(g)
    v = ML.statistic_weights(g, "score")
    _, tau = ML.statistic_epsilon(chol, v, sigma_eff=1.3, p=0.1, delta=1e-5, strategy=c)
    x = np.linalg.solve(chol.T, np.linalg.solve(chol, v))
    a = c @ x
    got = c.T @ a
    err = M.gamma(2 * 5 + 8) * (c.T @ np.abs(a))
    low = got - 2 * err
    kappa = float(np.max(np.maximum(v * (1 + 2**-53) - low, 0) / low)) * 2 + 4 * 2**-53
    ce = [[Fraction(float(e)) for e in row] for row in c]
    af = [Fraction(float(e)) for e in a]
    scale = Fraction(1 - 2 * 2**-53)  # the exact scaled C is within (1 + u) / (1 - u) of the prepared one
    for j in range(5):
        mean_j = (1 + Fraction(kappa)) * sum(ce[r][j] * af[r] for r in range(5)) * scale
        assert mean_j >= Fraction(float(v[j])) * (1 + Fraction(2**-53))
    noise = mp.mpf(1.3) * (1 + mp.mpf(kappa)) * mp.sqrt(sum(mp.mpf(float(e)) ** 2 for e in a))
    assert mp.mpf(tau) >= noise


def test_lower_bound_unchanged_by_the_certificate() -> None:
    """The certified lower bound equals the bisection's lower end where the certificate holds there
    (the headline's case), and is never above it."""
    c = np.tril(np.ones((12, 12)))
    lb = M.lower_bound(c, sigma=3.0, sampling=0.05, delta=1e-5)
    prep = M.prepare_strategy(c)
    g = prep.strategy.T @ prep.strategy
    chol = np.linalg.cholesky(g)
    for name, eps in lb.tried.items():
        v = ML.statistic_weights(g, name)
        plain, _ = ML.statistic_epsilon(chol, v, sigma_eff=3.0 / prep.sensitivity, p=0.05, delta=1e-5)
        assert eps <= plain
        assert eps >= plain * (1 - 1e-6)


@pytest.mark.parametrize("p, finite", [(0.5 - 7.4e-14, False), (0.5 - 1e-12, True), (0.49, True), (0.5, False)])
def test_fft_error_bound_refuses_where_its_linearisation_fails(p: float, finite: bool) -> None:
    """Near p = 1/2 the log's error bound 1.01 x (x = e_z / (1 - 2p)) stops covering -log(1 - x)
    (x > 0.019): the bound is +inf there (reviewer's case p = 0.5 - 7.4e-14, nk 22, where x = 0.08
    and the claimed 0.0808 fell below -log(1 - x) = 0.0834), finite where x is small."""
    u = 2.0 ** -53
    e_z = u * (3.0 + p * (3.0 * math.pi * 21 + 2.0 * 4 + 1.0))
    x = e_z / (1.0 - 2.0 * p) if p < 0.5 else math.inf
    assert (x <= 0.019) == finite
    if finite:
        assert -math.log1p(-x) <= 1.01 * x
    assert math.isfinite(M.fft_error_l2(1000, 22, p, 256)) == finite
