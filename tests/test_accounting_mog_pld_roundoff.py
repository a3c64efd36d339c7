"""Round-off of the MMCC row PLDs (mog_pld.mixture_pld): each row's connect-the-dots PMF must
dominate the *exact* hockey-stick curve of its mixture, not only the curve that floating point
computed (docs/accounting.md, "Round-off of the MMCC row PLDs").

The independent truth is mpmath at 40 digits: the privacy loss inverted by its own root finder and
the two CDFs evaluated exactly. Checked: the per-point upper bounds (`_paired_deltas`' third and
fourth arrays) are above the exact delta and tight; the certified PMF's curve is above the exact
delta at grid points and between them; the plain connect-the-dots PMF of the computed deltas is
*below* it somewhere (what the certification repairs: the test can fail); the curve's lower bound
(`_curve_lower_bounds`) brackets an exact sum; and erfc's assumed accuracy (the one assumption)
holds against mpmath over the range the rows use.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import special

from mfcli.accounting import mog_pld
from mfcli.util import floating

CTX = mpmath.MPContext()
CTX.dps = 40

#: (sigma, sensitivities, probabilities, grid): the reviewer's reproducer row (identity, p = 0.3,
#: sigma 0.6), a five-point support, one without a zero component (no flat limit), a row far in
#: its tails at a coarse grid.
MIXTURES = [
    (0.6, [0.0, 1.0], [0.7, 0.3], 1e-4),
    (1.1, [0.0, 0.2, 0.5, 0.8, 1.0], [0.5, 0.2, 0.15, 0.1, 0.05], 1e-4),
    (0.8, [0.3, 1.0], [0.6, 0.4], 2e-4),
    (2.5, [0.0, 1.0], [0.95, 0.05], 1e-3),
]


def _exact_delta(sigma: float, sens: list[float], probs: list[float], eps: float, remove: bool, x0: float) -> mpmath.mpf:
    """delta(eps) of one direction at 40 digits: REMOVE H_eps(sum q N(-s) || N(0)), ADD
    H_eps(N(0) || sum q N(s)); both losses decrease in x, so delta = P(X < x*) - e^eps Q(X < x*)
    at the root x* of L = eps (bracketed from the float root x0 outwards, then Illinois)."""
    sg = CTX.mpf(sigma)
    s = [CTX.mpf(v) for v in sens]
    q = [CTX.mpf(v) for v in probs]
    e = CTX.mpf(eps)

    def pdf(x: mpmath.mpf, m: mpmath.mpf) -> mpmath.mpf:
        return CTX.npdf(x, m, sg)

    def cdf(x: mpmath.mpf, m: mpmath.mpf) -> mpmath.mpf:
        return CTX.ncdf(x, m, sg)

    if remove:
        def loss(x):
            return CTX.log(sum(qi * pdf(x, -si) for si, qi in zip(s, q, strict=True)) / pdf(x, 0))
        p_cdf = lambda x: sum(qi * cdf(x, -si) for si, qi in zip(s, q, strict=True))  # noqa: E731
        q_cdf = lambda x: cdf(x, 0)  # noqa: E731
    else:
        def loss(x):
            return CTX.log(pdf(x, 0) / sum(qi * pdf(x, si) for si, qi in zip(s, q, strict=True)))
        p_cdf = lambda x: cdf(x, 0)  # noqa: E731
        q_cdf = lambda x: sum(qi * cdf(x, si) for si, qi in zip(s, q, strict=True))  # noqa: E731
    lo, hi, w = CTX.mpf(x0), CTX.mpf(x0), CTX.mpf("1e-6")
    while loss(lo) <= e:
        lo -= w
        w *= 2
    w = CTX.mpf("1e-6")
    while loss(hi) >= e:
        hi += w
        w *= 2
    root = CTX.findroot(lambda x: loss(x) - e, (lo, hi), solver="illinois")
    return p_cdf(root) - CTX.exp(e) * q_cdf(root)


def _sample(ks: np.ndarray, deltas: np.ndarray, count: int) -> np.ndarray:
    """Indices into the grid: evenly spread, plus the upper tail where delta is small but positive."""
    n = ks.size
    spread = np.linspace(0, n - 1, count // 2).astype(int)
    tail = np.flatnonzero((deltas > 1e-30) & (deltas < 1e-6))
    tail = tail[np.linspace(0, tail.size - 1, min(tail.size, count // 2)).astype(int)] if tail.size else tail
    return np.unique(np.concatenate((spread, tail)))


def _grid(sigma: float, sens: list[float], probs: list[float], d: float):
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    remove, add = mog_pld._Loss(float(sigma), s, q, True), mog_pld._Loss(float(sigma), s, q, False)
    ks_r, ks_a = mog_pld._grid_points(remove, d, None), mog_pld._grid_points(add, d, None)
    out = mog_pld._paired_deltas(remove, add, ks_r * d, ks_a * d)
    return remove, add, ks_r, ks_a, out


def _curve(pmf, eps: float) -> tuple[float, float]:
    """The PMF's hockey-stick curve at eps and a bound on the evaluation's error: the terms
    p_i (1 - e^(eps - l_i)) above eps, each within 4 ulps (expm1, the product, l_i = k_i d and
    eps - l_i), summed by math.fsum (correctly rounded)."""
    losses = (pmf.lower_loss + np.arange(pmf.size)) * pmf.discretization
    keep = losses > eps
    terms = pmf.probs[keep] * -np.expm1(eps - losses[keep])
    value = math.fsum(terms.tolist()) + pmf.infinity_mass
    return value, 8.0 * floating.UNIT_ROUNDOFF * value


@pytest.mark.parametrize("sigma,sens,probs,d", MIXTURES)
def test_delta_bounds_are_above_the_exact_delta_and_tight(sigma, sens, probs, d) -> None:
    remove, add, ks_r, ks_a, (delta_r, delta_a, bound_r, bound_a) = _grid(sigma, sens, probs, d)
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    for ks, delta, bound, loss, is_remove in ((ks_r, delta_r, bound_r, remove, True), (ks_a, delta_a, bound_a, add, False)):
        eps = ks * d
        inside = ~mog_pld._near_flat(loss, eps) & (delta > 0)
        idx = _sample(ks, np.where(inside, delta, 0.0), 24)
        idx = idx[inside[idx]]
        roots = mog_pld._invert(loss, eps[idx], *mog_pld._truncation(loss, mog_pld.LOG_MASS_TRUNCATION_BOUND))
        for j, x0 in zip(idx.tolist(), roots.tolist(), strict=True):
            exact = _exact_delta(sigma, s.tolist(), q.tolist(), float(CTX.mpf(int(ks[j])) * CTX.mpf(d)), is_remove, x0)
            assert CTX.mpf(bound[j]) >= exact, (is_remove, eps[j], bound[j], exact)
            # tight: the allowance is round-off sized, not a blanket margin
            assert bound[j] - float(exact) <= 1e-11 * float(exact) + 1e-14, (is_remove, eps[j], bound[j], exact)


@pytest.mark.parametrize("sigma,sens,probs,d", [m for m in MIXTURES if m[1][0] == 0.0])
def test_flat_limit_bounds_hold_where_the_loss_cannot_reach(sigma, sens, probs, d) -> None:
    """REMOVE at eps <= log q0: the exact delta is 1 - e^eps (the loss never goes below log q0);
    ADD at eps >= -log q0: 0. There the bounds come from the flat limit alone (_flat_bounds), tight."""
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    remove, add = mog_pld._Loss(float(sigma), s, q, True), mog_pld._Loss(float(sigma), s, q, False)
    q0 = CTX.fsum(CTX.mpf(qi) for qi, si in zip(q.tolist(), s.tolist(), strict=True) if si == 0)
    eps = remove.flat_limit - np.concatenate((np.geomspace(1e-12, 3.0, 40), [0.0]))
    bound = mog_pld._flat_bounds(remove, eps)
    for e, b in zip(eps.tolist(), bound.tolist(), strict=True):
        exact = -CTX.expm1(CTX.mpf(e))
        assert CTX.log(q0) >= CTX.mpf(e) - 1e-15  # the test's own premise: at or below the flat limit
        assert CTX.mpf(b) >= exact
        assert b <= float(exact) * (1 + 1e-12) + 1e-9 * math.exp(e) * 1e-3
    above = add.flat_limit + np.geomspace(1e-8, 3.0, 20)
    assert np.all(mog_pld._flat_bounds(add, above) == 0.0)
    assert np.all(np.isinf(mog_pld._flat_bounds(remove, np.array([remove.flat_limit + 0.1]))))


@pytest.mark.parametrize("sigma,sens,probs,d", MIXTURES[:2])
def test_certified_pmf_dominates_the_exact_curve_where_the_plain_one_does_not(sigma, sens, probs, d) -> None:
    remove, add, ks_r, ks_a, (delta_r, delta_a, _, _) = _grid(sigma, sens, probs, d)
    pld = mog_pld.mixture_pld(sigma, sens, probs, value_discretization_interval=d)
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    plain_below = 0
    for ks, delta, loss, is_remove, pmf in ((ks_r, delta_r, remove, True, pld.remove), (ks_a, delta_a, add, False, pld.add)):
        plain = mog_pld.connect_dots_pmf(d, ks, np.maximum.accumulate(delta[::-1])[::-1])
        eps = ks * d
        inside = ~mog_pld._near_flat(loss, eps) & (delta > 0)
        idx = _sample(ks, np.where(inside, delta, 0.0), 40)
        idx = idx[inside[idx]]
        roots = mog_pld._invert(loss, eps[idx], *mog_pld._truncation(loss, mog_pld.LOG_MASS_TRUNCATION_BOUND))
        for j, x0 in zip(idx.tolist(), roots.tolist(), strict=True):
            e = float(CTX.mpf(int(ks[j])) * CTX.mpf(d))
            exact = _exact_delta(sigma, s.tolist(), q.tolist(), e, is_remove, x0)
            value, err = _curve(pmf, e)
            assert value - err >= exact, (is_remove, e)
            value, err = _curve(plain, e)
            plain_below += value + err < exact
            if j + 1 < ks.size:  # halfway to the next point (the chord argument)
                mid = 0.5 * (e + float(ks[j + 1]) * d)
                value, err = _curve(pmf, mid)
                assert value - err >= _exact_delta(sigma, s.tolist(), q.tolist(), mid, is_remove, x0), (is_remove, mid)
    assert plain_below > 0  # the uncertified construction falls below the truth: what is repaired


def test_curve_lower_bound_brackets_an_exact_sum() -> None:
    rng = np.random.default_rng(5)
    d = 1e-3
    ks = np.sort(rng.choice(np.arange(-4000, 4000), size=600, replace=False)).astype(np.float64)
    p = rng.random(600) ** 6 * 1e-2
    p_inf = 3e-12
    low = mog_pld._curve_lower_bounds(ks, d, p, p_inf)
    for j in [*range(0, 600, 37), 598, 599]:
        exact = CTX.mpf(p_inf) + CTX.fsum(CTX.mpf(pi) * -CTX.expm1(-(CTX.mpf(int(ki)) - CTX.mpf(int(ks[j]))) * CTX.mpf(d))
                                          for pi, ki in zip(p[j + 1:].tolist(), ks[j + 1:].tolist(), strict=True))
        assert CTX.mpf(low[j]) <= exact
        assert low[j] >= float(exact) * (1 - 1e-10)


def test_erfc_within_its_assumed_allowance() -> None:
    """The one assumption of the rows' error bound (mfcli.util.floating): erfc(z) within
    (NDTR_ULPS_0 + NDTR_ULPS_2 t^2) u relatively, t = sqrt(2) z, over the arguments the rows use
    where the result is a normal number (z <= 26: erfc(26) = 5.7e-296; beyond, it underflows and the
    bound counts an absolute 2^-1022 per term instead)."""
    rng = np.random.default_rng(11)
    z = np.concatenate([rng.uniform(0, 26, 3000), np.linspace(0, 26, 1001)])
    got = special.erfc(z)
    t2 = 2.0 * z * z
    allowed = (floating.NDTR_ULPS_0 + floating.NDTR_ULPS_2 * t2) * floating.UNIT_ROUNDOFF
    worst = 0.0
    for zi, gi, ai in zip(z.tolist(), got.tolist(), allowed.tolist(), strict=True):
        exact = CTX.erfc(CTX.mpf(zi))
        worst = max(worst, float(abs(CTX.mpf(gi) / exact - 1)) / ai)
    assert worst <= 1.0
    assert worst > 0.01  # the allowance is not far above what erfc really does
    # below the smallest normal number: no relative accuracy, but within 2^-1022 absolute
    for f, exact in ((special.erfc, CTX.erfc), (special.ndtr, CTX.ncdf)):
        args = np.linspace(26.4, 27.4, 300) if f is special.erfc else np.linspace(-37.4, -38.6, 300)
        for a in args.tolist():
            assert abs(CTX.mpf(float(f(a))) - exact(CTX.mpf(a))) <= CTX.mpf(2) ** -1022


def test_a_far_component_is_inverted_to_round_off() -> None:
    """A tiny, far component (s = 60 at sigma 0.3): Halley's error estimate, blind to curvature that
    switches on within a step, stopped roots 0.6 away in loss; the certification's residual check
    finds them and bisection finishes them, so the bounds stay finite and epsilon too."""
    sigma, sens, probs = 0.3, [0.0, 0.2, 0.4, 60.0], [0.5, 0.3, 0.2 - 1e-8, 1e-8]
    d = 0.1
    *_, (delta_r, delta_a, bound_r, bound_a) = _grid(sigma, sens, probs, d)
    assert np.all(bound_r >= delta_r) and np.all(bound_a >= delta_a)
    assert np.all(bound_r - delta_r <= 1e-11 * delta_r + 1e-14)
    assert np.all(bound_a - delta_a <= 1e-11 * delta_a + 1e-14)
    assert math.isfinite(mog_pld.mixture_pld(sigma, sens, probs, value_discretization_interval=d).get_epsilon_for_delta(1e-9))


# Reviewer's extreme cases: eps above 700 (e^eps formed from logs; sigma 0.03 puts the grid past
# 2000), no zero component with s / sigma > 22 (the ADD log form), and a strided grid.
EXTREME = [
    (0.03, [0.0, 1.0], [0.7, 0.3], 0.5, None),
    (0.04, [0.3, 1.0], [0.5, 0.5], 0.5, None),
    (1.0, list(np.arange(30) * 0.04), list(np.exp(-np.arange(30) * 0.5) / np.exp(-np.arange(30) * 0.5).sum()), 1e-4, 300),
]


@pytest.mark.parametrize("sigma,sens,probs,d,max_points", EXTREME)
def test_certified_curve_in_the_extreme_cases(sigma, sens, probs, d, max_points) -> None:
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    pld = mog_pld.mixture_pld(sigma, sens, probs, value_discretization_interval=d, max_points=max_points)
    checked_big = 0
    for loss, is_remove, pmf in ((mog_pld._Loss(float(sigma), s, q, True), True, pld.remove),
                                 (mog_pld._Loss(float(sigma), s, q, False), False, pld.add)):
        ks = mog_pld._grid_points(loss, d, max_points)
        lx, ux = mog_pld._truncation(loss, mog_pld.LOG_MASS_TRUNCATION_BOUND)
        lmin, lmax = float(loss.value(np.array([ux]))[0]), float(loss.value(np.array([lx]))[0])
        idx = np.unique(np.concatenate([np.linspace(0, ks.size - 1, 10).astype(int),
                                        ks.size - 1 - np.geomspace(1, ks.size - 1, 10).astype(int)]))
        for j in idx.tolist():
            for e in (float(ks[j]) * d, 0.5 * float(ks[j] + ks[min(j + 1, ks.size - 1)]) * d):
                if not lmin < e < lmax or mog_pld._near_flat(loss, np.array([e]))[0]:
                    continue
                x0 = float(mog_pld._invert(loss, np.array([e]), lx, ux)[0])
                exact = _exact_delta(sigma, s.tolist(), q.tolist(), e, is_remove, x0)
                if exact <= 0:
                    continue
                value, err = _curve(pmf, e)
                assert value - err >= exact, (is_remove, e)
                checked_big += e > 700
    assert checked_big > 0 or max_points is not None or sigma > 0.035


def test_max_points_below_two_is_refused() -> None:
    for bad in (0, 1, 2.5):
        with pytest.raises(mog_pld.MfcliError, match="max_points"):
            mog_pld.mixture_pld(1.0, [0.0, 1.0], [0.5, 0.5], value_discretization_interval=1e-3, max_points=bad)


def test_probability_error_covers_every_mixture_within_it() -> None:
    """mixture_pld(..., probability_error=rho) dominates the mixtures whose probabilities are within
    rho of the given ones (MMCC passes the round-off of the convolutions that formed them). Here
    mass 0.99 rho q_0 moves from s = 0 to s = 1 (every probability within rho, the law
    stochastically larger): the PLD built with rho is above that mixture's exact delta, the one
    built without is below it."""
    sigma, s, q, d, rho = 0.7, [0.0, 0.5, 1.0], [0.2, 0.3, 0.5], 1e-4, 1e-7
    moved = 0.99 * rho * q[0]
    shifted = [q[0] - moved, q[1], q[2] + moved]
    covered = mog_pld.mixture_pld(sigma, s, q, value_discretization_interval=d, probability_error=rho)
    plain = mog_pld.mixture_pld(sigma, s, q, value_discretization_interval=d)
    below = 0
    sa, qa = np.array(s), np.array(q)
    for is_remove, loss, pmf_c, pmf_p in ((True, mog_pld._Loss(sigma, sa, qa, True), covered.remove, plain.remove),
                                          (False, mog_pld._Loss(sigma, sa, qa, False), covered.add, plain.add)):
        lx, ux = mog_pld._truncation(loss, mog_pld.LOG_MASS_TRUNCATION_BOUND)
        for e in np.linspace(0.05, 1.2, 9).tolist():  # below the ADD flat limit -log q_0 = 1.61
            x0 = float(mog_pld._invert(loss, np.array([e]), lx, ux)[0])
            exact = _exact_delta(sigma, s, shifted, e, is_remove, x0)
            value, err = _curve(pmf_c, e)
            assert value - err >= exact, (is_remove, e)
            value, err = _curve(pmf_p, e)
            below += value + err < exact
    assert below > 0
    with pytest.raises(mog_pld.MfcliError, match="probability_error"):
        mog_pld.mixture_pld(sigma, s, q, value_discretization_interval=d, probability_error=0.1)
