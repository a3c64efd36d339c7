"""Vectorised privacy loss distribution of a scalar mixture-of-Gaussians (MoG) mechanism.

The pair is P = N(0, sigma^2) (example absent) against Q = sum_i q_i N(s_i, sigma^2) with s_i >= 0
(example present with a random sensitivity). dp-accounting builds its PLD with
``pld.privacy_loss_distribution.from_mixture_gaussian_mechanism``: the pessimistic
"connect-the-dots" discretisation of the hockey-stick curve delta(eps) on the grid eps_k = k d.
That builder inverts the privacy loss with a scalar binary search per grid point, which costs
seconds per mechanism at d = 1e-4. MMCC needs one such PLD per distinct row of C, so this module
computes the same quantities with array operations:

* the loss L(x) = log(mu_upper(x) / mu_lower(x)) is a log-sum-exp of affine functions of x, hence
  convex (REMOVE) or concave (ADD) and monotone; its inverse x*(eps) on the whole eps grid is
  found by a vectorised Halley iteration (the loss's second derivative is the variance of its
  slopes) from a chord start, stopped by an error bound (one evaluation per point, mostly)
  instead of a 1e-6 bisection;
* the two directions share that work (:func:`mixture_pld`): the ADD loss is the REMOVE loss
  mirrored, so the ADD root at eps is minus the REMOVE root at -eps, and the mixture CDF entries
  of both come from one ``erfc`` each (:func:`_paired_deltas`);
* delta(eps) = mu_upper_cdf(x*) - e^eps mu_lower_cdf(x*) is then evaluated exactly at the
  maximiser x*, which is the hockey-stick divergence itself (dp-accounting evaluates it at a point
  up to 1e-6 away from x*, which can only give a value up to second order smaller);
* the truncation points, the eps range and the connect-the-dots probabilities follow
  dp-accounting's algorithm (``privacy_loss_tail`` with log mass bound -50, and
  ``pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap``), held in mfcli's own PLD type
  (:class:`mfcli.accounting.pld_ops.Pld`, convertible to dp-accounting's), which composes with
  every other PLD mfcli builds.

Formal guarantees: the returned :class:`~mfcli.accounting.pld_ops.Pld` is a pessimistic estimate for both
neighbouring directions (REMOVE: mu_upper = sum q_i N(-s_i), mu_lower = N(0); ADD: mu_upper = N(0),
mu_lower = sum q_i N(s_i)), exactly as dp-accounting's own builder: tests compare the two on many
mixtures (tests/test_accounting_mog_pld.py).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from mfcli.accounting import pld_ops
from mfcli.errors import MfcliError
from mfcli.util.validation import positive_number

#: dp-accounting's default: ln of the noise mass that may be cut from each tail.
LOG_MASS_TRUNCATION_BOUND = -50.0

_CHUNK = 4096

#: Points of :func:`_invert`'s starting grid over [lower_x, upper_x].
_START_GRID = 129


def _check_mixture(sigma: float, sens: ArrayLike, probs: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(sens, dtype=np.float64).ravel()
    q = np.asarray(probs, dtype=np.float64).ravel()
    positive_number(sigma, "mixture-of-Gaussians noise")
    if s.shape != q.shape or s.size == 0:
        raise MfcliError("mixture-of-Gaussians sensitivities and probabilities must be non-empty and of equal length")
    keep = q > 0
    s, q = s[keep], q[keep]
    if np.any(s < 0) or not np.all(np.isfinite(s)):
        raise MfcliError("mixture-of-Gaussians sensitivities must be finite and non-negative")
    if not math.isclose(float(q.sum()), 1.0, rel_tol=1e-9, abs_tol=1e-12):
        raise MfcliError(f"mixture-of-Gaussians probabilities sum to {q.sum()!r}, not 1")
    if s.max() <= 0:
        raise MfcliError("a mixture of Gaussians needs at least one positive sensitivity")
    order = np.argsort(s, kind="stable")
    return s[order], q[order]


class _Loss:
    """Privacy loss of one direction of the MoG pair, vectorised over x.

    REMOVE: L(x) = log sum_i q_i exp((-s_i x - s_i^2/2) / v), convex, decreasing.
    ADD:    L(x) = -log sum_i q_i exp((s_i x - s_i^2/2) / v), concave, decreasing.
    """

    def __init__(self, sigma: float, s: np.ndarray, q: np.ndarray, remove: bool) -> None:
        self.sigma = sigma
        self.v = sigma * sigma
        self.s = s
        self.q = q
        self.remove = remove
        self.logq = np.log(q)
        self.const = self.logq - s * s / (2 * self.v)
        self.slope = (-s if remove else s) / self.v
        #: max - min of the slopes (bounds the third derivative of L by the second: :func:`_halley_step`)
        self.slope_range = float(self.slope.max() - self.slope.min())
        zero = s == 0
        #: limit of L at the end where only s = 0 survives (x -> +inf REMOVE, x -> -inf ADD)
        q0 = float(q[zero].sum()) if zero.any() else 0.0
        self.flat_limit = (math.log(q0) if q0 > 0 else -math.inf) if remove else (-math.log(q0) if q0 > 0 else math.inf)
        #: what depends on the pair only, computed once per instance (a search over eps, as the
        #: lower bound's bisection, evaluates the same pair many times): the truncation points
        #: per log-mass bound, and :func:`_invert`'s starting grid per truncation.
        self.cache: dict[tuple, Any] = {}

    def _shifted_exponents(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(w, amax): w[k, i] = exp(const_i + x_k slope_i - amax_k), amax_k the row's largest
        exponent. One (len(x), support) array, updated in place: the same roundings as forming
        const + x slope, subtracting the maximum and exponentiating in separate arrays, without
        allocating (and faulting in) a fresh array at every step, which took as long as the
        arithmetic."""
        w = np.multiply.outer(x, self.slope)
        w += self.const  # x slope + const: the same sum as const + x slope
        amax = w.max(axis=1)
        w -= amax[:, None]
        np.exp(w, out=w)
        return w, amax

    def value_slope_curvature(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """L, dL/dx and d2L/dx2 at x: the log-sum-exp, its slope E[b] (the slopes b under the
        weights w) and, for d2L/dx2, the variance of the slopes under the weights w (the second cumulant: >= 0 for the convex
        REMOVE loss, <= 0 for the concave ADD loss), formed as E[b^2] - E[b]^2 (its cancellation
        is absolute, ~1e-16 E[b]^2: it only steers and bounds the error of a step in
        :func:`_invert`)."""
        w, amax = self._shifted_exponents(x)
        tot = w.sum(axis=1)
        lse = np.log(tot) + amax
        dlse = (w @ self.slope) / tot
        var = np.maximum((w @ (self.slope * self.slope)) / tot - dlse * dlse, 0.0)
        if self.remove:
            return lse, dlse, var
        return -lse, -dlse, -var

    def value(self, x: np.ndarray) -> np.ndarray:
        """L(x): the value of :meth:`value_slope_curvature` (the same arithmetic) without the derivatives."""
        x = np.atleast_1d(np.asarray(x, dtype=np.float64))
        w, amax = self._shifted_exponents(x)
        lse = np.log(w.sum(axis=1)) + amax
        return lse if self.remove else -lse

    # distributions (the (len(x), support) arrays formed and transformed in place, as above)
    def upper_cdf(self, x: np.ndarray) -> np.ndarray:
        if self.remove:
            w = np.add.outer(x, self.s)
            w /= self.sigma
            return special.ndtr(w, out=w) @ self.q
        return special.ndtr(x / self.sigma)

    def lower_cdf(self, x: np.ndarray) -> np.ndarray:
        if self.remove:
            return special.ndtr(x / self.sigma)
        w = np.subtract.outer(x, self.s)
        w /= self.sigma
        return special.ndtr(w, out=w) @ self.q

    def lower_log_cdf(self, x: np.ndarray) -> np.ndarray:
        """log mu_lower_cdf(x), accurate where the CDF underflows (log_ndtr, then log-sum-exp
        over the mixture)."""
        if self.remove:
            return special.log_ndtr(x / self.sigma)
        w = np.subtract.outer(x, self.s)
        w /= self.sigma
        return special.logsumexp(special.log_ndtr(w) + self.logq, axis=1)


#: Above this eps, e^eps mu_lower_cdf(x) is formed as exp(eps + log mu_lower_cdf(x)): e^eps
#: overflows a float above 709.78, and e^eps times a CDF that underflowed to 0 is NaN, not the
#: small number it is. Below it the product is formed directly (the values of every earlier
#: version, bit for bit).
_EXP_SAFE_EPS = 700.0


def _scaled_lower(loss: _Loss, x: np.ndarray, eps: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """e^eps mu_lower_cdf(x) of ``loss``, given ``lower`` = mu_lower_cdf(x)."""
    big = eps > _EXP_SAFE_EPS
    if not big.any():
        return np.exp(eps) * lower
    out = np.empty_like(eps)
    out[~big] = np.exp(eps[~big]) * lower[~big]
    with np.errstate(over="ignore"):
        out[big] = np.exp(eps[big] + loss.lower_log_cdf(x[big]))
    return out


def _truncation(loss: _Loss, log_mass_bound: float) -> tuple[float, float]:
    """dp-accounting's ``privacy_loss_tail`` truncation points (lower_x, upper_x) of mu_upper
    (computed once per loss and bound)."""
    key = ("truncation", log_mass_bound)
    if key not in loss.cache:
        # the same mixture is truncated again by another instance (mixture_pld after loss_range)
        shared = (loss.sigma, loss.s.tobytes(), loss.q.tobytes(), loss.remove, log_mass_bound)
        got = _TRUNCATIONS.get(shared)
        if got is None:
            got = _truncation_points(loss, log_mass_bound)
            if len(_TRUNCATIONS) >= 4096:
                _TRUNCATIONS.clear()
            _TRUNCATIONS[shared] = got
        loss.cache[key] = got
    return loss.cache[key]


#: Truncation points by (sigma, support, probabilities, direction, bound): a pure function of
#: those, memoised (bounded) across :class:`_Loss` instances.
_TRUNCATIONS: dict[tuple, tuple[float, float]] = {}


def _truncation_points(loss: _Loss, log_mass_bound: float) -> tuple[float, float]:
    tail_mass = 0.5 * math.exp(log_mass_bound)
    z = float(special.ndtri(tail_mass)) * loss.sigma  # negative
    upper_x = -z
    if not loss.remove:
        return z, upper_x
    # mu_upper_cdf(lower_x) = tail_mass, searched in [z - max s, z] to precision 1e-4, left end kept
    lo, hi = z - float(loss.s.max()), z
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        if float(loss.upper_cdf(np.array([mid]))[0]) < tail_mass:
            lo = mid
        else:
            hi = mid
    return lo, upper_x


def _invert(loss: _Loss, eps: np.ndarray, lower_x: float, upper_x: float) -> np.ndarray:
    """x*(eps) with L(x*) = eps for every eps strictly inside the loss range (vectorised Halley
    steps, :func:`_halley_step`).

    Starting points come from a coarse monotone grid (:data:`_START_GRID` points): the chord of
    the grid cell with L >= eps > L (next point). A point stops once the error its last step leaves
    is estimated below 1e-14 (1 + |x|) (a few ulps: mostly after one evaluation), its step is
    negligible, or L equals eps to rounding. Every evaluation also narrows a bracket of the root
    (L non-increasing); a point the steps have not settled in :data:`_HALLEY_STEPS` (a start far
    out on a nearly flat stretch, where Halley's steps are short) is finished by bisection of its
    bracket (:func:`_bisect_roots`).
    """
    key = ("grid", lower_x, upper_x)
    if key not in loss.cache:
        span = upper_x - lower_x
        # the roots may lie outside [lower_x, upper_x] when eps is near the flat limit: extend the grid
        grid = np.concatenate([
            [lower_x - 4 * span],
            np.linspace(lower_x, upper_x, _START_GRID),
            [upper_x + 4 * span, upper_x + 64 * span],
        ])
        loss.cache[key] = grid, loss.value(grid)  # L non-increasing on the grid
    grid, lg = loss.cache[key]
    out = np.empty_like(eps)
    for start in range(0, eps.size, _CHUNK):
        e = eps[start:start + _CHUNK]
        # bracketing grid cell: lg[i] >= e > lg[i + 1] (lg is decreasing)
        i = np.clip(np.searchsorted(-lg, -e, side="right") - 1, 0, grid.size - 2)
        x0, x1, l0, l1 = grid[i], grid[i + 1], lg[i], lg[i + 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.clip((l0 - e) / (l0 - l1), 0.0, 1.0)
        frac = np.where(np.isfinite(frac), frac, 0.5)
        # chord start on the convex (REMOVE) / concave (ADD) loss, then Halley steps
        x = x0 + frac * (x1 - x0)
        # a bracket [lo, hi] of each root, from the evaluations so far (infinite: none yet)
        lo = np.where(l0 > e, x0, -np.inf)
        hi = np.where(l1 < e, x1, np.inf)
        live = np.arange(e.size)  # the points not yet converged: only they are evaluated again
        for _ in range(_HALLEY_STEPS):
            xl, el = x[live], e[live]
            val, slope, curv = loss.value_slope_curvature(xl)
            lo[live] = np.where(val > el, np.maximum(lo[live], xl), lo[live])
            hi[live] = np.where(val < el, np.minimum(hi[live], xl), hi[live])
            step, err = _halley_step(val - el, slope, curv, loss.slope_range)
            xl = xl - step
            x[live] = xl
            # converged: the error left after this step (its estimate) is a few ulps of x, the
            # step is negligible, or the loss already equals eps to rounding (then the step is
            # round-off divided by a tiny slope and x cannot be pinned further; the delta
            # evaluated there is off by second order in that step)
            done = ((err <= 1e-14 * (1.0 + np.abs(xl))) | (np.abs(step) <= 1e-12 * (1.0 + np.abs(xl)))
                    | (np.abs(val - el) <= 1e-15 * (1.0 + np.abs(el))))
            live = live[~done]
            if live.size == 0:
                break
        else:
            x[live] = _bisect_roots(loss, e[live], x[live], lo[live], hi[live])
        out[start:start + _CHUNK] = x
    return out


#: Halley steps per point before its root is finished by bisection (most points need 1 to 3).
_HALLEY_STEPS = 40


def _bisect_roots(loss: _Loss, eps: np.ndarray, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The roots of L(x) = eps (L non-increasing) by bisection, from brackets lo < root < hi found
    so far (an infinite end is first pushed out from x by doubling steps until L crosses eps),
    halved until they are 1e-14 (1 + |x|) wide (or stop shrinking): the midpoints.

    Raises:
        MfcliError: no bracket within 2^60 (the loss does not reach eps: not a valid mixture)."""
    lo, hi = lo.copy(), hi.copy()
    for side in (lo, hi):
        bad = ~np.isfinite(side)
        width = np.ones(x.size)
        for _ in range(60):
            if not bad.any():
                break
            probe = x[bad] + (-width[bad] if side is lo else width[bad])
            val = loss.value(probe)
            found = val > eps[bad] if side is lo else val < eps[bad]
            idx = np.flatnonzero(bad)
            side[idx[found]] = probe[found]
            width[idx[~found]] *= 2.0
            bad[idx[found]] = False
        if bad.any():
            raise MfcliError("the privacy-loss inversion found no bracket of a root: the loss does not reach "
                             "the requested epsilon")
    for _ in range(2200):  # each halving shrinks a finite bracket: done long before in practice
        mid = 0.5 * (lo + hi)
        open_ = (hi - lo > 1e-14 * (1.0 + np.abs(mid))) & (mid > lo) & (mid < hi)
        if not open_.any():
            break
        above = loss.value(mid[open_]) > eps[open_]
        idx = np.flatnonzero(open_)
        lo[idx[above]] = mid[open_][above]
        hi[idx[~above]] = mid[open_][~above]
    return 0.5 * (lo + hi)


def _halley_step(f: np.ndarray, d1: np.ndarray, d2: np.ndarray, slope_range: float) -> tuple[np.ndarray, np.ndarray]:
    """(step, error estimate) towards the root of L - eps, from f = L - eps, d1 = dL/dx and
    d2 = d2L/dx2 at x.

    Halley's step f / (d1 - f d2 / (2 d1)) (cubic convergence), Newton's f / d1 where Halley's
    denominator falls below half of d1 (far from the root). The error left after Halley's step is
    about (|d3| / (6 |d1|) + (d2 / (2 d1))^2) |step|^3, and |d3| <= R |d2| for the third derivative
    d3 (the third central moment of the slopes b under the weights, with |b - E b| <= R, the range
    of the slopes); after Newton's, about |d2| / (2 |d1|) step^2. The estimate is twice these.
    Where the loss is flat (a step that is not finite): step 0, and the caller stops there."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        newton = f / d1
        denom = 1.0 - newton * d2 / (2.0 * d1)
        halley = denom >= 0.5
        step = np.where(halley, newton / denom, newton)
        a = np.abs(d2 / (2.0 * d1))
        err = 2.0 * np.where(halley, (slope_range * a / 3.0 + a * a) * np.abs(step) ** 3, a * step * step)
    ok = np.isfinite(step)
    return np.where(ok, step, 0.0), np.where(ok & np.isfinite(err), err, np.inf)


def hockey_stick(
    sigma: float,
    sens: ArrayLike,
    probs: ArrayLike,
    epsilons: np.ndarray,
    *,
    remove: bool,
) -> np.ndarray:
    """Exact hockey-stick divergence delta(eps) of one direction of the MoG pair.

    REMOVE: H_eps(sum q_i N(-s_i) || N(0)); ADD: H_eps(N(0) || sum q_i N(s_i)) (dp-accounting's
    conventions; by symmetry the REMOVE value equals H_eps(Q || P) and ADD equals H_eps(P || Q)
    for Q = sum q_i N(s_i), P = N(0)).
    """
    s, q = _check_mixture(sigma, sens, probs)
    loss = _Loss(float(sigma), s, q, remove)
    return _deltas(loss, np.asarray(epsilons, dtype=np.float64))


class HockeyStickCurve:
    """delta(eps) of one direction of the MoG pair (as :func:`hockey_stick`), for many eps in
    turn: the pair's truncation and the inversion's starting grid are computed once, not at every
    call, so a search over eps (a bisection) costs one root search per point. Same values as
    :func:`hockey_stick`, bit for bit."""

    def __init__(self, sigma: float, sens: ArrayLike, probs: ArrayLike, *, remove: bool) -> None:
        s, q = _check_mixture(sigma, sens, probs)
        self._loss = _Loss(float(sigma), s, q, remove)

    def __call__(self, epsilons: np.ndarray) -> np.ndarray:
        return _deltas(self._loss, np.asarray(epsilons, dtype=np.float64))


def _deltas(loss: _Loss, eps: np.ndarray) -> np.ndarray:
    delta = np.zeros_like(eps)
    if loss.remove:
        trivial = eps <= loss.flat_limit  # the loss never goes below log q0: delta = 1 - e^eps
        delta[trivial] = -np.expm1(eps[trivial])
    else:
        trivial = eps >= loss.flat_limit  # the loss never exceeds -log q0: delta = 0
    inside = ~trivial
    if inside.any():
        lower_x, upper_x = _truncation(loss, LOG_MASS_TRUNCATION_BOUND)
        e_in = eps[inside]
        x = _invert(loss, e_in, lower_x, upper_x)
        d = np.empty(x.size)
        for start in range(0, x.size, _CHUNK):
            xs = x[start:start + _CHUNK]
            es = e_in[start:start + _CHUNK]
            d[start:start + _CHUNK] = loss.upper_cdf(xs) - _scaled_lower(loss, xs, es, loss.lower_cdf(xs))
        delta[inside] = d
    return np.clip(delta, 0.0, 1.0)


def _grid_points(loss: _Loss, discretization: float, max_points: int | None) -> np.ndarray:
    """The integers k of the connect-the-dots points eps = k d of one direction: dp-accounting's
    range (the loss at the truncation points, rounded out to the grid), every ``stride``-th point
    when ``max_points`` binds, both ends always included."""
    lower_x, upper_x = _truncation(loss, LOG_MASS_TRUNCATION_BOUND)
    eps_upper = float(loss.value(np.array([lower_x]))[0])
    eps_lower = float(loss.value(np.array([upper_x]))[0])
    k_hi = math.ceil(eps_upper / discretization)
    k_lo = math.floor(eps_lower / discretization)
    stride = 1
    if max_points is not None and k_hi - k_lo + 1 > max_points:
        stride = math.ceil((k_hi - k_lo) / (max_points - 1))
    ks = np.arange(k_lo, k_hi + 1, stride)
    if ks[-1] != k_hi:
        ks = np.append(ks, k_hi)
    return ks


def _pmf_from_deltas(discretization: float, ks: np.ndarray, deltas: np.ndarray):
    # same post-hoc monotonicity fix as dp-accounting (can only raise deltas)
    deltas = np.maximum.accumulate(deltas[::-1])[::-1]
    return connect_dots_pmf(discretization, ks, deltas)


def _mixture_tails(y: np.ndarray, s: np.ndarray, q: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(sum_i q_i Phi(t_i), sum_i q_i Phi(-t_i)) with t_i = (y + s_i) / sigma for every y, the
    support s sorted: REMOVE's mu_upper_cdf at y and ADD's mu_lower_cdf at -y (:func:`_paired_deltas`).

    t_i < 0 exactly for i < i0 = the number of s_i < -y (rounding is monotone, and y + s rounds to
    0 only if it is 0). With e_i = Phi(-|t_i|) (one ``erfc`` per entry, accurate in both tails),
    the two sums are A + Q_big - B and Q_small - A + B for A = sum_{i < i0} q_i e_i,
    B = sum_{i >= i0} q_i e_i and Q_small, Q_big the q-mass below and from i0, each from its own
    running sum. Neither loses relative precision where it is small: Q_big = 0 leaves A alone,
    Q_big > 0 keeps the first above Q_big / 2 (e <= 1/2), and B, formed as the total minus A,
    errs by ~1e-16 A only; likewise the second. A and B come from one running sum of q_i e_i per
    point, where a mask and 1 - e per entry, both tails and two products with q took twice the
    passes over the (points x support) array."""
    cdf_sum = np.empty(y.size)
    sf_sum = np.empty(y.size)
    q_before = np.concatenate(([0.0], np.cumsum(q)))
    q_from = np.concatenate((np.cumsum(q[::-1])[::-1], [0.0]))
    for start in range(0, y.size, _CHUNK):
        yc = y[start:start + _CHUNK]
        i0 = np.searchsorted(s, -yc, side="left")
        t = np.add.outer(yc, s)
        t /= sigma  # the arguments of _Loss.upper_cdf, formed as it forms them
        np.abs(t, out=t)
        t *= math.sqrt(0.5)
        e = special.erfc(t, out=t)  # 2 Phi(-|t|)
        e *= q
        run = np.cumsum(e, axis=1, out=e)
        a = np.where(i0 > 0, run[np.arange(yc.size), np.maximum(i0 - 1, 0)], 0.0)
        b = run[:, -1] - a
        q_small, q_big = q_before[i0], q_from[i0]
        cdf_sum[start:start + _CHUNK] = 0.5 * a + q_big - 0.5 * b
        sf_sum[start:start + _CHUNK] = q_small - 0.5 * a + 0.5 * b
    return cdf_sum, sf_sum


def _paired_deltas(remove: _Loss, add: _Loss, eps_r: np.ndarray, eps_a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """delta(eps) of both directions of one mixture, each root and each mixture CDF entry computed
    once for the two.

    Why they can be shared: the ADD loss is the REMOVE loss mirrored, L_add(x) = -L_remove(-x)
    (the same exponents, with x and the slopes negated: bit for bit), so the ADD root at eps is
    minus the REMOVE root at -eps, and on the connect-the-dots lattice -eps = (-k) d is a REMOVE
    point too (for MMCC's rows the mirrored ADD points are a subset of the REMOVE points: half of
    the roots and half of the mixture CDF entries). At that root y the ADD mixture CDF is
    sum_i q_i Phi(-(y + s_i) / sigma), the upper tail of the very arguments t = (y + s_i) / sigma
    of the REMOVE CDF; one ``erfc`` per entry gives both sums accurately (:func:`_mixture_tails`),
    where ``ndtr(t)`` and ``ndtr(-t)`` took two.
    The formulas of delta are those of :func:`_deltas` (REMOVE: mu_upper_cdf(x*) - e^eps
    mu_lower_cdf(x*), ADD likewise at -y); only round-off differs."""
    delta_r = np.zeros_like(eps_r)
    trivial_r = eps_r <= remove.flat_limit  # as in _deltas: delta = 1 - e^eps
    delta_r[trivial_r] = -np.expm1(eps_r[trivial_r])
    delta_a = np.zeros_like(eps_a)
    in_r = ~trivial_r
    in_a = ~(eps_a >= add.flat_limit)  # as in _deltas: delta = 0 beyond -log q0
    # the REMOVE points at which to invert: both sets of roots (add.flat_limit = -remove.flat_limit,
    # so the mirrored ADD points are inside the REMOVE range)
    pts = np.union1d(eps_r[in_r], -eps_a[in_a])
    if pts.size:
        lower_x, upper_x = _truncation(remove, LOG_MASS_TRUNCATION_BOUND)
        y = _invert(remove, pts, lower_x, upper_x)
        cdf_sum, sf_sum = _mixture_tails(y, remove.s, remove.q, remove.sigma)
        if in_r.any():
            i = np.searchsorted(pts, eps_r[in_r])
            e_in = eps_r[in_r]
            delta_r[in_r] = cdf_sum[i] - _scaled_lower(remove, y[i], e_in, remove.lower_cdf(y[i]))
        if in_a.any():
            i = np.searchsorted(pts, -eps_a[in_a])
            e_in = eps_a[in_a]
            delta_a[in_a] = add.upper_cdf(-y[i]) - _scaled_lower(add, -y[i], e_in, sf_sum[i])
    return np.clip(delta_r, 0.0, 1.0), np.clip(delta_a, 0.0, 1.0)


def connect_dots_pmf(discretization: float, rounded_epsilons: np.ndarray, deltas: np.ndarray):
    """Pessimistic connect-the-dots PMF on the points eps_i = rounded_epsilons[i] * d
    (Doroshenko et al. 2022, Algorithm 1), built directly as a dense PMF.

    Same formula as ``dp_accounting.pld.pld_pmf.create_pmf_pessimistic_connect_dots`` (which goes
    through a Python dict): mass y_{i-1} + z_i at eps_i with y_0 = 1 - delta_1,
    y_i = (delta_{i+1} - delta_i) / (e^(eps_i - eps_{i+1}) - 1),
    z_i = (delta_{i+1} - delta_i) / (e^(eps_{i+1} - eps_i) - 1), z_n = 0, and delta_n at +inf.
    Any increasing set of points gives a pessimistic PMF; fewer points, a coarser one.

    Raises:
        MfcliError: a delta is NaN (it would make every probability composed with it NaN).
    """
    ks = np.asarray(rounded_epsilons, dtype=np.int64)
    deltas = np.asarray(deltas, dtype=np.float64)
    if np.isnan(deltas).any():  # a PMF of NaNs composes to an epsilon of NaNs (or a crash): refuse
        k = int(ks[np.flatnonzero(np.isnan(deltas))[0]])
        raise MfcliError(f"the hockey-stick divergence at eps = {k * discretization:g} is not a number")
    deltas = np.minimum.accumulate(deltas)
    gaps = np.diff(ks)
    if ks.size == 1:
        probs = np.array([1.0 - deltas[0]])
    elif np.all(gaps == gaps[0]):
        # evenly spaced: dp-accounting's numerically stabler fixed-gap form of the same formula
        g = gaps[0] * discretization
        dd = np.diff(deltas)
        probs = np.empty_like(deltas)
        probs[0] = 1 - deltas[0] + dd[0] / math.expm1(g)
        probs[1:-1] = (dd[1:] - dd[:-1] * math.exp(g)) / math.expm1(g)
        probs[-1] = dd[-1] / math.expm1(-g)
        probs = np.maximum(0.0, probs)
    else:
        ed = np.diff(ks) * discretization
        dd = np.diff(deltas)
        y = np.append(1.0 - deltas[0], dd / np.expm1(-ed))
        z = np.append(dd / np.expm1(ed), 0.0)
        probs = np.maximum(0.0, y + z)
    dense = np.zeros(int(ks[-1] - ks[0]) + 1)
    dense[ks - ks[0]] = probs
    return pld_ops.Pmf(discretization, int(ks[0]), dense, float(deltas[-1]), True)


def compose(a: pld_ops.Pld, b: pld_ops.Pld, *, tail_mass_truncation: float = 1e-15) -> pld_ops.Pld:
    """Compose two pessimistic PLDs: :func:`mfcli.accounting.pld_ops.compose`, the arithmetic of
    dp-accounting's ``PrivacyLossDistribution.compose`` (FFT convolution, tails of mass <= 1e-15
    cut pessimistically) with a vectorised truncation (dp-accounting scans the array in a Python
    loop)."""
    return pld_ops.compose(a, b, tail_mass_truncation)


def loss_range(sigma: float, sensitivities: ArrayLike, probabilities: ArrayLike) -> float:
    """Width of the privacy-loss interval the PLD of this mixture spans (both directions summed):
    the PLD has about width / d points per direction at discretization d."""
    s, q = _check_mixture(sigma, sensitivities, probabilities)
    width = 0.0
    for remove in (True, False):
        loss = _Loss(float(sigma), s, q, remove)
        lower_x, upper_x = _truncation(loss, LOG_MASS_TRUNCATION_BOUND)
        vals = loss.value(np.array([lower_x, upper_x]))
        width += float(vals[0] - vals[1])
    return width


def mixture_pld(
    sigma: float,
    sensitivities: ArrayLike,
    probabilities: ArrayLike,
    *,
    value_discretization_interval: float = 1e-4,
    max_points: int | None = None,
):
    """Pessimistic PLD (both directions) of the MoG mechanism: the fast equivalent of
    ``dp_accounting.pld.privacy_loss_distribution.from_mixture_gaussian_mechanism``.

    Args:
        sigma: noise standard deviation.
        sensitivities: support of the (random) sensitivity, non-negative.
        probabilities: its probabilities (summing to 1).
        value_discretization_interval: the PLD grid d.
        max_points: if given, delta(eps) is evaluated on at most this many evenly spaced grid
            points (always including both ends) and the connect-the-dots PMF is built on them:
            still pessimistic, slightly coarser, and proportionally cheaper.

    Returns:
        a :class:`mfcli.accounting.pld_ops.Pld` (``to_dp_accounting`` gives dp-accounting's
        ``PrivacyLossDistribution``).

    Formal guarantees: pessimistic connect-the-dots discretisation of the exact hockey-stick curves
    (see the module docstring); composing it with other pessimistic PLDs gives an upper bound on
    epsilon.
    """
    if not (value_discretization_interval > 0):
        raise MfcliError("the value discretization interval must be positive")
    s, q = _check_mixture(sigma, sensitivities, probabilities)
    d = value_discretization_interval
    remove, add = _Loss(float(sigma), s, q, True), _Loss(float(sigma), s, q, False)
    ks_r, ks_a = _grid_points(remove, d, max_points), _grid_points(add, d, max_points)
    delta_r, delta_a = _paired_deltas(remove, add, ks_r * d, ks_a * d)
    pmf_remove = _pmf_from_deltas(d, ks_r, delta_r)
    pmf_add = _pmf_from_deltas(d, ks_a, delta_a)
    return pld_ops.Pld(pmf_remove, pmf_add)


def reference_mixture_pld(
    sigma: float,
    sensitivities: ArrayLike,
    probabilities: ArrayLike,
    *,
    value_discretization_interval: float = 1e-4,
):
    """dp-accounting's own (slow) builder, for cross-checks and the ``engine="dp-accounting"`` path."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    s, q = _check_mixture(sigma, sensitivities, probabilities)
    return pld_lib.from_mixture_gaussian_mechanism(
        standard_deviation=float(sigma),
        sensitivities=list(map(float, s)),
        sampling_probs=list(map(float, q)),
        value_discretization_interval=value_discretization_interval,
    )
