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
* many mixtures at one sigma and grid (MMCC's hundreds of rows) are built together
  (:func:`mixture_plds`): what is elementwise runs once on all their points, what reduces over a
  mixture's support per mixture on the arrays its own build uses, so each PLD is bit for bit the
  one :func:`mixture_pld` gives alone (tests/test_mog_pld_batched.py);
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
mu_lower = sum q_i N(s_i)), as dp-accounting's own builder is in exact arithmetic (tests compare the
two on many mixtures, tests/test_accounting_mog_pld.py), and also under round-off: each grid
point's delta gets a proven upper bound (:func:`_delta_bounds`, :func:`_root_errors`,
:func:`_flat_bounds`; the floating-point model and its one assumption, erfc's accuracy, are
:mod:`mfcli.util.floating`'s) and the PMF is lifted until its curve dominates them
(:func:`_certified`); docs/accounting.md, "Round-off of the row PLDs", has the argument, and
tests/test_accounting_mog_pld_roundoff.py checks it against 40-digit mpmath.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from mfcli.accounting import pld_ops
from mfcli.errors import MfcliError
from mfcli.util.floating import ELEMENTARY_ULPS, NDTR_ULPS_0, NDTR_ULPS_2, UNIT_ROUNDOFF, gamma
from mfcli.util.validation import positive_number

#: dp-accounting's default: ln of the noise mass that may be cut from each tail.
LOG_MASS_TRUNCATION_BOUND = -50.0

_CHUNK = 4096

#: Points of :func:`_invert`'s starting grid over [lower_x, upper_x].
_START_GRID = 129

#: Supports of at most this many components have their exponents formed column by column
#: (:meth:`_Loss._shifted_exponents`).
_NARROW = 8


def _check_mixture(sigma: float, sens: ArrayLike, probs: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(sens, dtype=np.float64).ravel()
    q = np.asarray(probs, dtype=np.float64).ravel()
    positive_number(sigma, "mixture-of-Gaussians noise")
    if s.shape != q.shape or s.size == 0:
        raise MfcliError("mixture-of-Gaussians sensitivities and probabilities must be non-empty and of equal length")
    keep = q > 0
    if not keep.all():
        s, q = s[keep], q[keep]
    if np.any(s < 0) or not np.all(np.isfinite(s)):
        raise MfcliError("mixture-of-Gaussians sensitivities must be finite and non-negative")
    if not math.isclose(float(q.sum()), 1.0, rel_tol=1e-9, abs_tol=1e-12):
        raise MfcliError(f"mixture-of-Gaussians probabilities sum to {q.sum()!r}, not 1")
    if s.max() <= 0:
        raise MfcliError("a mixture of Gaussians needs at least one positive sensitivity")
    if np.any(s[1:] < s[:-1]):
        order = np.argsort(s, kind="stable")
        return s[order], q[order]
    return s.copy(), q.copy()  # already sorted (MMCC's rows): the stable order is the identity


class _Loss:
    """Privacy loss of one direction of the MoG pair, vectorised over x.

    REMOVE: L(x) = log sum_i q_i exp((-s_i x - s_i^2/2) / v), convex, decreasing.
    ADD:    L(x) = -log sum_i q_i exp((s_i x - s_i^2/2) / v), concave, decreasing.
    """

    def __init__(self, sigma: float, s: np.ndarray, q: np.ndarray, remove: bool, *, mirror: _Loss | None = None) -> None:
        self.sigma = sigma
        self.v = sigma * sigma
        self.s = s
        self.q = q
        self.remove = remove
        self.logq: np.ndarray
        self.const: np.ndarray
        self.slope: np.ndarray
        if mirror is not None:
            # the other direction of the same mixture: log q and the constants are the same arrays'
            # values, the slopes negated ((-s) / v = -(s / v) exactly)
            self.logq, self.const, self.slope = mirror.logq, mirror.const, -mirror.slope
        else:
            self.logq = np.log(q)
            self.const = self.logq - s * s / (2 * self.v)
            self.slope = (-s if remove else s) / self.v
        #: the squared slopes (the second moment in :meth:`value_slope_curvature`)
        self.slope_sq = self.slope * self.slope
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
        #: rho: every probability within a relative rho of the exact mechanism's (mixture_pld's
        #: ``probability_error`` plus the given probabilities' distance from summing to 1)
        self.prob_error = 0.0

    def _shifted_exponents(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(w, amax): w[k, i] = exp(const_i + x_k slope_i - amax_k), amax_k the row's largest
        exponent. One (len(x), support) array, updated in place: the same roundings as forming
        const + x slope, subtracting the maximum and exponentiating in separate arrays, without
        allocating (and faulting in) a fresh array at every step, which took as long as the
        arithmetic."""
        k = self.slope.size
        if k > _NARROW:
            w = np.multiply.outer(x, self.slope)
            w += self.const  # x slope + const: the same sum as const + x slope
            amax = w.max(axis=1)
        else:
            # a few components (the DP-SGD step's two): numpy's broadcasting and row reductions over
            # a short last axis cost ~20 ns a row, so the columns are formed one by one (the same
            # products and sums) and the maximum taken across them (a maximum is exact: any order
            # gives the same value, up to the sign of a zero, which changes neither w below, where
            # w_i - (+-0) = w_i and exp(+-0) = 1, nor log(tot) + amax, log(tot) >= +0 there)
            w = np.empty((x.size, k))
            for i in range(k):
                col = w[:, i]
                np.multiply(x, self.slope[i], out=col)
                col += self.const[i]
            amax = w[:, 0].copy()
            for i in range(1, k):
                np.maximum(amax, w[:, i], out=amax)
        w -= amax[:, None]
        np.exp(w, out=w)
        return w, amax

    def _row_sums(self, w: np.ndarray) -> np.ndarray:
        """w.sum(axis=1), bit for bit: for two columns the one addition w_0 + w_1 (numpy's row sum
        of two), formed without the per-row cost of a reduction over a short axis."""
        if w.shape[1] == 2:
            return w[:, 0] + w[:, 1]
        return w.sum(axis=1)

    def value_slope_curvature(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """L, dL/dx and d2L/dx2 at x: the log-sum-exp, its slope E[b] (the slopes b under the
        weights w) and, for d2L/dx2, the variance of the slopes under the weights w (the second cumulant: >= 0 for the convex
        REMOVE loss, <= 0 for the concave ADD loss), formed as E[b^2] - E[b]^2 (its cancellation
        is absolute, ~1e-16 E[b]^2: it only steers and bounds the error of a step in
        :func:`_invert`)."""
        w, amax = self._shifted_exponents(x)
        tot = self._row_sums(w)
        lse = np.log(tot) + amax
        dlse = (w @ self.slope) / tot
        var = np.maximum((w @ self.slope_sq) / tot - dlse * dlse, 0.0)
        if self.remove:
            return lse, dlse, var
        return -lse, -dlse, -var

    def value(self, x: np.ndarray) -> np.ndarray:
        """L(x): the value of :meth:`value_slope_curvature` (the same arithmetic) without the derivatives."""
        x = np.atleast_1d(np.asarray(x, dtype=np.float64))
        w, amax = self._shifted_exponents(x)
        lse = np.log(self._row_sums(w)) + amax
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
#: version, bit for bit), except where the CDF is not a normal number (:func:`_log_form`).
_EXP_SAFE_EPS = 700.0
#: The smallest normal double, 2^-1022.
_TINY = float(np.finfo(np.float64).tiny)


def _log_form(eps: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Where e^eps mu_lower_cdf is formed from log mu_lower_cdf: above :data:`_EXP_SAFE_EPS`, and
    where the CDF came out below the smallest normal number (scipy's erfc and ndtr lose all
    relative accuracy there, up to ~1e-310 absolute, which e^eps would magnify)."""
    return (eps > _EXP_SAFE_EPS) | ((lower < 2.0 * _TINY) & (eps > 0))


def _scaled_lower(loss: _Loss, x: np.ndarray, eps: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """e^eps mu_lower_cdf(x) of ``loss``, given ``lower`` = mu_lower_cdf(x)."""
    big = _log_form(eps, lower)
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
    # mu_upper_cdf at one point as loss.upper_cdf forms it (mid + s_i, divided by sigma, ndtr, the
    # (1, support) row times q), in one buffer: the per-step cost is the calls, not the arithmetic
    row = np.empty((1, loss.s.size))
    flat = row[0]
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        np.add(mid, loss.s, out=flat)
        flat /= loss.sigma
        special.ndtr(flat, out=flat)
        if float((row @ loss.q)[0]) < tail_mass:
            lo = mid
        else:
            hi = mid
    return lo, upper_x


def _invert(loss: _Loss, eps: np.ndarray, lower_x: float, upper_x: float, trace: np.ndarray | None = None) -> np.ndarray:
    """x*(eps) with L(x*) = eps for every eps strictly inside the loss range (vectorised Halley
    steps, :func:`_halley_step`).

    Starting points come from a coarse monotone grid (:data:`_START_GRID` points): the chord of
    the grid cell with L >= eps > L (next point). A point stops once the error its last step leaves
    is estimated below 1e-14 (1 + |x|) (a few ulps: mostly after one evaluation), its step is
    negligible, or L equals eps to rounding. Every evaluation also narrows a bracket of the root
    (L non-increasing; the evaluations are kept and the bracket formed from them, :func:`_brackets`,
    only where needed): a point the steps have not settled in :data:`_HALLEY_STEPS` (a start far
    out on a nearly flat stretch, where Halley's steps are short) is finished by bisection of its
    bracket (:func:`_bisect_roots`).

    ``trace``, if given (shape (5, len(eps))), receives for each point what :func:`_root_errors`
    needs: the last evaluation's x, L - eps, dL/dx and d2L/dx2, and the step taken from there to
    the returned root (NaN for a root finished by bisection). :func:`_invert_many` (of this one
    loss) computes it.
    """
    return _invert_many([loss], [eps], [(lower_x, upper_x)], [trace])[0]


def _start_grid(loss: _Loss, lower_x: float, upper_x: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_invert`'s starting grid over [lower_x, upper_x] and L on it (computed once per loss)."""
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
    return loss.cache[key]


def _invert_many(losses: list[_Loss], epss: list[np.ndarray], ends: list[tuple[float, float]],
                 traces: list[np.ndarray | None]) -> list[np.ndarray]:
    """:func:`_invert` of each (loss, eps, (lower_x, upper_x), trace), bit for bit: the loop of
    Halley steps runs over all of them at once. Each loss's points go in chunks of :data:`_CHUNK`
    (the units, as :func:`_invert` splits them); each step evaluates every unit's loss on exactly the
    points its own loop evaluates (:meth:`_Loss.value_slope_curvature` reduces over the support, per
    unit), and does the rest (starting chords, steps, error estimates, stopping rules) on all units'
    points at once: elementwise, each loss's slope range repeated at its points."""
    outs = [np.empty_like(e) for e in epss]
    units = [(j, start, e[start:start + _CHUNK]) for j, e in enumerate(epss) for start in range(0, e.size, _CHUNK)]
    if not units:
        return outs
    grids = [_start_grid(loss, lo, hi) for loss, (lo, hi) in zip(losses, ends, strict=True)]
    base = np.cumsum([0, *(g[0].size for g in grids)]).tolist()  # each grid's place in the concatenation
    # bracketing grid cell of each point: lg[i] >= e > lg[i + 1] (lg is decreasing)
    cells = [np.clip(np.searchsorted(-grids[j][1], -e, side="right") - 1, 0, grids[j][0].size - 2) + base[j]
             for j, _, e in units]
    cell = np.concatenate(cells)
    grid_all = np.concatenate([g[0] for g in grids])
    lg_all = np.concatenate([g[1] for g in grids])
    e_all = np.concatenate([u[2] for u in units])
    x0, x1, l0, l1 = grid_all[cell], grid_all[cell + 1], lg_all[cell], lg_all[cell + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.clip((l0 - e_all) / (l0 - l1), 0.0, 1.0)
    frac = np.where(np.isfinite(frac), frac, 0.5)
    # chord start on the convex (REMOVE) / concave (ADD) loss, then Halley steps
    start_x = x0 + frac * (x1 - x0)
    counts = [u[2].size for u in units]
    at = np.cumsum([0, *counts]).tolist()
    xs = [start_x[at[k]:at[k + 1]] for k in range(len(units))]  # each unit's x (replaced, not written to, at first)
    # every evaluation (its points, x and L) is kept: the bracket of each root that they give is
    # formed only for the points the steps do not settle (rarely any)
    history: list[list[tuple[np.ndarray | None, np.ndarray, np.ndarray]]] = [[] for _ in units]
    live: list[np.ndarray | None] = [None] * len(units)  # None: every point of the unit; else those not converged
    active = list(range(len(units)))
    for _ in range(_HALLEY_STEPS):
        parts: list[tuple[np.ndarray, ...]] = []
        for k in active:
            e = units[k][2]
            xl, el = (xs[k], e) if live[k] is None else (xs[k][live[k]], e[live[k]])
            val, slope, curv = losses[units[k][0]].value_slope_curvature(xl)
            history[k].append((live[k], xl, val))
            parts.append((xl, el, val, slope, curv))
        sizes = [p[0].size for p in parts]
        xl, el, val, slope, curv = (np.concatenate([p[i] for p in parts]) for i in range(5))
        spread = _per_point([losses[units[k][0]].slope_range for k in active], sizes)
        f = val - el
        step, err = _halley_step(f, slope, curv, spread)
        moved = xl - step
        # converged: the error left after this step (its estimate) is a few ulps of x, the
        # step is negligible, or the loss already equals eps to rounding (then the step is
        # round-off divided by a tiny slope and x cannot be pinned further; the delta
        # evaluated there is off by second order in that step)
        done = ((err <= 1e-14 * (1.0 + np.abs(moved))) | (np.abs(step) <= 1e-12 * (1.0 + np.abs(moved)))
                | (np.abs(f) <= 1e-15 * (1.0 + np.abs(el))))
        rows = np.stack((xl, f, slope, curv, step))
        still = []
        first = 0
        for k, n in zip(active, sizes, strict=True):
            part = slice(first, first + n)
            first += n
            j, start, e = units[k]
            trace = traces[j]
            lv = live[k]
            if trace is not None:
                trace[:, slice(start, start + e.size) if lv is None else start + lv] = rows[:, part]
            if lv is None:
                xs[k] = moved[part]
                lv = np.flatnonzero(~done[part])
            else:
                xs[k][lv] = moved[part]
                lv = lv[~done[part]]
            live[k] = lv
            if lv.size:
                still.append(k)
        active = still
        if not active:
            break
    for k in active:  # not settled in _HALLEY_STEPS: bisection of the brackets
        j, start, e = units[k]
        lv = live[k]
        assert lv is not None  # set by the first step
        part = slice(at[k], at[k + 1])
        lo, hi = _brackets(x0[part], x1[part], l0[part], l1[part], e, history[k])
        xs[k][lv] = _bisect_roots(losses[j], e[lv], xs[k][lv], lo[lv], hi[lv])
        trace = traces[j]
        if trace is not None:
            trace[:, start + lv] = np.nan
    for k, (j, start, e) in enumerate(units):
        outs[j][start:start + e.size] = xs[k]
    return outs


def _brackets(x0: np.ndarray, x1: np.ndarray, l0: np.ndarray, l1: np.ndarray, e: np.ndarray,
              history: list[tuple[np.ndarray | None, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] brackets of the roots L(x) = e (L non-increasing) from the starting grid cell
    (x0, L = l0), (x1, L = l1) and every evaluation since (``history``: the evaluated points' indices,
    None for all, their x and L), infinite where none: each x with L > e is a lower end, each with
    L < e an upper one (the largest, the smallest kept)."""
    lo = np.where(l0 > e, x0, -np.inf)
    hi = np.where(l1 < e, x1, np.inf)
    for live, xl, val in history:
        sel = slice(None) if live is None else live
        el = e[sel]
        lo[sel] = np.where(val > el, np.maximum(lo[sel], xl), lo[sel])
        hi[sel] = np.where(val < el, np.minimum(hi[sel], xl), hi[sel])
    return lo, hi


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


def _halley_step(f: np.ndarray, d1: np.ndarray, d2: np.ndarray, slope_range: float | np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(step, error estimate) towards the root of L - eps, from f = L - eps, d1 = dL/dx and
    d2 = d2L/dx2 at x.

    Halley's step f / (d1 - f d2 / (2 d1)) (cubic convergence), Newton's f / d1 where Halley's
    denominator falls below half of d1 (far from the root). The error left after Halley's step is
    about (|d3| / (6 |d1|) + (d2 / (2 d1))^2) |step|^3, and |d3| <= R |d2| for the third derivative
    d3 (the third central moment of the slopes b under the weights, with |b - E b| <= R, the range
    of the slopes); after Newton's, about |d2| / (2 |d1|) step^2. The estimate is twice these.
    Where the loss is flat (a step that is not finite): step 0, and the caller stops there.
    ``slope_range`` R: a float, or one per point (:func:`_invert_many`)."""
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


def _loss_ends(remove: _Loss, add: _Loss) -> tuple[tuple[float, float], tuple[float, float]]:
    """The loss at both truncation points of each direction, (L(lower_x), L(upper_x)) for REMOVE
    and for ADD, from one evaluation of the REMOVE loss at four points: L_add(x) = -L_remove(-x) bit
    for bit (the same exponents, x and the slopes negated), and each row of the (points, support)
    arrays is formed and reduced on its own, so a point's L does not depend on the others
    evaluated with it. A pure function of the mixture, memoised like the truncation points (MMCC's
    grid choice, :func:`loss_range`, asks for the same rows' ends before their PLDs are built)."""
    shared = (remove.sigma, remove.s.tobytes(), remove.q.tobytes())
    got = _ENDS.get(shared)
    if got is None:
        lx_r, ux_r = _truncation(remove, LOG_MASS_TRUNCATION_BOUND)
        lx_a, ux_a = _truncation(add, LOG_MASS_TRUNCATION_BOUND)
        v = remove.value(np.array([lx_r, ux_r, -lx_a, -ux_a])).tolist()
        got = (v[0], v[1]), (-v[2], -v[3])
        if len(_ENDS) >= 4096:
            _ENDS.clear()
        _ENDS[shared] = got
    return got


#: :func:`_loss_ends` by (sigma, support, probabilities) (bounded, as :data:`_TRUNCATIONS`).
_ENDS: dict[tuple, tuple[tuple[float, float], tuple[float, float]]] = {}


def _grid_points(loss: _Loss, discretization: float, max_points: int | None,
                 ends: tuple[float, float] | None = None) -> np.ndarray:
    """The integers k of the connect-the-dots points eps = k d of one direction: dp-accounting's
    range (the loss at the truncation points, rounded out to the grid; ``ends``: those two losses,
    if known), every ``stride``-th point when ``max_points`` binds, both ends always included."""
    if ends is None:
        lower_x, upper_x = _truncation(loss, LOG_MASS_TRUNCATION_BOUND)
        # both ends in one evaluation (each row reduced on its own: :func:`_loss_ends`)
        eps_upper, eps_lower = loss.value(np.array([lower_x, upper_x])).tolist()
    else:
        eps_upper, eps_lower = ends
    k_hi = math.ceil(eps_upper / discretization)
    k_lo = math.floor(eps_lower / discretization)
    stride = 1
    if max_points is not None and k_hi - k_lo + 1 > max_points:
        stride = math.ceil((k_hi - k_lo) / (max_points - 1))
    ks = np.arange(k_lo, k_hi + 1, stride)
    if ks[-1] != k_hi:
        ks = np.append(ks, k_hi)
    return ks


def _pmf_from_deltas(discretization: float, ks: np.ndarray, deltas: np.ndarray, bounds: np.ndarray):
    # same post-hoc monotonicity fix as dp-accounting (can only raise deltas), then the lift that
    # makes the PMF dominate the proven bounds on the exact deltas (round-off)
    deltas = np.maximum.accumulate(deltas[::-1])[::-1]
    return _certified(connect_dots_pmf(discretization, ks, deltas), ks, bounds)


def _pmfs_from_deltas_many(discretization: float, grids: list[np.ndarray], deltas: list[np.ndarray],
                           bounds: list[np.ndarray]) -> list[pld_ops.Pmf]:
    """:func:`_pmf_from_deltas` of each (ks, deltas, bounds), bit for bit, those on consecutive grid
    points (ks = k0, k0 + 1, ...: every row PLD of MMCC) together: the running maxima and minima,
    the connect-the-dots masses, the curve's lower bounds and the lift's maxima on arrays of one row
    per PMF (padded past its end with values no operation of its row reads: a running maximum from
    the end starts at -inf there, every maximum takes -inf for them), the running sums of
    :func:`_reverse_cumsum` per block size (the same blocks and additions, :func:`_reverse_cumsums`).
    The sums of a row that are not running sums (:func:`_mass_shortfall`) stay per row. Others (one
    point, strides, a span past one exponent segment, a NaN delta): :func:`_pmf_from_deltas`."""
    d = discretization
    for b in bounds:
        _check_bounds(b)
    out: list[pld_ops.Pmf | None] = [None] * len(grids)
    fast = []
    for i, (ks, dl) in enumerate(zip(grids, deltas, strict=True)):
        n = ks.size
        # _curve_lower_bounds in one segment: its first search gives 0 (ks[0] >= ks[-1] - 600 / d)
        if (n >= 2 and int(ks[-1]) - int(ks[0]) == n - 1 and float(ks[0]) >= float(ks[-1]) - 600.0 / d
                and not np.isnan(dl).any()):
            fast.append(i)
        else:
            out[i] = _pmf_from_deltas(d, ks, dl, bounds[i])
    # shortest first, in groups whose padded arrays stay within _PAD_POINTS (a few long rows among
    # many short ones would otherwise pad every row to the longest)
    fast.sort(key=lambda i: grids[i].size)
    group: list[int] = []
    for i in [*fast, -1]:
        if group and (i < 0 or (len(group) + 1) * grids[i].size > _PAD_POINTS):
            for j, pmf in zip(group, _pmfs_consecutive(d, [grids[j] for j in group], [deltas[j] for j in group],
                                                       [bounds[j] for j in group]), strict=True):
                out[j] = pmf
            group = []
        if i >= 0:
            group.append(i)
    assert all(pmf is not None for pmf in out)  # every row went one way or the other
    return [pmf for pmf in out if pmf is not None]


#: Points (rows x the longest row) of the padded arrays of one group of :func:`_pmfs_consecutive`.
_PAD_POINTS = 1 << 20


def _pmfs_consecutive(d: float, grids: list[np.ndarray], deltas: list[np.ndarray], bounds: list[np.ndarray]
                      ) -> list[pld_ops.Pmf]:
    """:func:`_pmfs_from_deltas_many`' PMFs of rows on consecutive grid points (at least two, in one
    exponent segment, no NaN delta), one padded row each: :func:`_pmf_from_deltas` on every row, its
    formulas shared (:func:`_fixed_gap_masses`, :func:`_curve_rho`, :func:`_lift_kappa`,
    :func:`_lifted_pmf`)."""
    lengths = np.array([g.size for g in grids])
    width = int(lengths.max())
    valid = np.arange(width) < lengths[:, None]
    rows = np.arange(len(grids))
    last = lengths - 1
    dl = np.full((len(grids), width), -np.inf)
    dl[valid] = np.concatenate(deltas)
    bd = np.zeros((len(grids), width))
    bd[valid] = np.concatenate(bounds)
    # past a row's end its first point again (exponents 0 there: nothing overflows)
    ks = np.repeat(np.array([g[0] for g in grids], dtype=np.int64)[:, None], width, axis=1)
    ks[valid] = np.concatenate(grids)
    if not bool(np.all(np.diff(ks, axis=1)[valid[:, 1:]] == 1)):  # not consecutive after all
        return [_pmf_from_deltas(d, ks_, dl_, b_) for ks_, dl_, b_ in zip(grids, deltas, bounds, strict=True)]
    # _pmf_from_deltas' monotonicity fix, then connect_dots_pmf's (a no-op after it, kept: the same values)
    dl = np.maximum.accumulate(dl[:, ::-1], axis=1)[:, ::-1]
    dl = np.minimum.accumulate(dl, axis=1)
    # connect_dots_pmf, evenly spaced (gap 1)
    with np.errstate(invalid="ignore"):  # past a row's end: -inf - -inf
        probs = _fixed_gap_masses(dl, np.int64(1) * d, last)
    infinity = dl[rows, last]
    # _certified: _curve_lower_bounds in one segment (a = 0, top = n)
    ksf = ks.astype(np.float64)
    arg = (ksf - ksf[:, :1]) * d
    p = np.where(valid, probs, 0.0)
    run, r1 = _reverse_cumsums(p * np.exp(-arg), lengths)
    e = run * np.exp(arg)
    run, r2 = _reverse_cumsums(-np.expm1(-np.diff(ksf, axis=1) * d) * e[:, 1:], lengths - 1)
    curve = np.empty((len(grids), width))
    curve[:, :-1] = run + infinity[:, None]
    curve[rows, last] = infinity
    rhos = [_curve_rho(max(r1[j], r2[j]), 1, float((ksf[j, last[j]] - ksf[j, 0]) * d)) for j in range(len(grids))]
    low = curve * (1.0 - np.array(rhos)[:, None]) - 1e-50
    # the lift: kappa from the relative deficits where the curve's bound is positive (all of them or
    # some: the same maximum), eta from what is still over
    with np.errstate(invalid="ignore", divide="ignore"):
        deficit = np.where(valid & (low > 0), (bd - low) / low, -np.inf)
    kappas = [_lift_kappa(float(m)) for m in np.max(deficit, axis=1, initial=0.0)]
    lifted = low * (1.0 + np.array(kappas))[:, None] * (1.0 - 2.0 * UNIT_ROUNDOFF)
    overs = np.max(np.where(valid, bd - lifted, -np.inf), axis=1, initial=0.0)
    out: list[pld_ops.Pmf] = []
    for j in range(len(grids)):
        row_probs = probs[j, :int(lengths[j])].copy()
        out.append(_lifted_pmf(d, int(ks[j, 0]), row_probs, row_probs, float(infinity[j]), kappas[j], float(overs[j])))
    return out


def _reverse_cumsums(x: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """:func:`_reverse_cumsum` of each row of x (its first lengths[j] entries; the rest of a row is
    left unset), bit for bit, and the roundings count of each: the rows of one block size in one
    array (blocks of a row past its length are zeros, added after its own: they change nothing)."""
    out = np.empty(x.shape)
    counts = [0] * x.shape[0]
    blocks = [max(1, math.isqrt(int(n))) for n in lengths]
    for block in sorted(set(blocks)):
        idx = np.array([j for j, b in enumerate(blocks) if b == block])
        n = lengths[idx]
        nb = -(-n // block)
        size = int(nb.max()) * block
        pos = np.arange(size)
        src = n[:, None] - 1 - pos  # entry i of the reversed row is x[n - 1 - i]
        inside = src >= 0
        padded = np.zeros((idx.size, size))
        padded[inside] = x[np.repeat(idx, n), src[inside]]
        run = np.cumsum(padded.reshape(idx.size, -1, block), axis=2)
        offsets = np.zeros(run.shape[:2])
        offsets[:, 1:] = np.cumsum(run[:, :, -1], axis=1)[:, :-1]
        run += offsets[:, :, None]
        flat = run.reshape(idx.size, size)
        # out[j, i] = flat[j, n - 1 - i] for i < n
        out[np.repeat(idx, n), src[inside]] = flat[inside]
        for j, b in zip(idx.tolist(), nb.tolist(), strict=True):
            counts[j] = block + b + 1
    return out, counts

def _mixture_tails(y: np.ndarray, s: np.ndarray, q: np.ndarray, sigma: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sum_i q_i Phi(t_i), sum_i q_i Phi(-t_i)) with t_i = (y + s_i) / sigma for every y, the
    support s sorted: REMOVE's mu_upper_cdf at y and ADD's mu_lower_cdf at -y (:func:`_paired_deltas`),
    and a bound on each sum's absolute round-off (see the last paragraph).

    t_i < 0 exactly for i < i0 = the number of s_i < -y (rounding is monotone, and y + s rounds to
    0 only if it is 0). With e_i = Phi(-|t_i|) (one ``erfc`` per entry, accurate in both tails),
    the two sums are A + Q_big - B and Q_small - A + B for A = sum_{i < i0} q_i e_i,
    B = sum_{i >= i0} q_i e_i and Q_small, Q_big the q-mass below and from i0, each from its own
    running sum. Neither loses relative precision where it is small: Q_big = 0 leaves A alone,
    Q_big > 0 keeps the first above Q_big / 2 (e <= 1/2), and B, formed as the total minus A,
    errs by ~1e-16 A only; likewise the second. A and B come from one running sum of q_i e_i per
    point, where a mask and 1 - e per entry, both tails and two products with q took twice the
    passes over the (points x support) array.

    Round-off: rho_i = 40 + 28 z_i^2 (z_i = |t_i| / sqrt 2, erfc's argument) bounds, in units of
    roundoff, the relative error of the computed q_i erfc(z_i) against q_i erfc at the exact
    |t_i| / sqrt 2: erfc's assumed allowance (32 + 16 z^2, :data:`mfcli.util.floating.NDTR_ULPS_0`),
    the four roundings that form z (relative 4u, amplified by |d log erfc / dz| <= z + sqrt(z^2 + 2)
    <= 2 z + 1.42, Abramowitz-Stegun 7.1.13: 8.1 z^2 + 5.8 z <= 11 z^2 + 3) and the product with q.
    Each sum's bound: half the erfc terms' own errors (sum q_i e_i rho_i u / 2), the running sums
    of the q_i e_i (at most k roundings per term: gamma_k of their total each, the partial A, the
    total and B = total - A) and of q (Q_big or Q_small), the two additions, and 2^-1022 per term
    for an erfc that underflows (z > 26.5: no relative accuracy there)."""
    cdf_sum = np.empty(y.size)
    sf_sum = np.empty(y.size)
    err_cdf = np.empty(y.size)
    err_sf = np.empty(y.size)
    k = s.size
    sums = 2.0 * gamma(k + 2) + 4.0 * UNIT_ROUNDOFF
    q_before = np.concatenate(([0.0], np.cumsum(q)))
    q_from = np.concatenate((np.cumsum(q[::-1])[::-1], [0.0]))
    for start in range(0, y.size, _CHUNK):
        yc = y[start:start + _CHUNK]
        i0 = np.searchsorted(s, -yc, side="left")
        t = np.add.outer(yc, s)
        t /= sigma  # the arguments of _Loss.upper_cdf, formed as it forms them
        np.abs(t, out=t)
        t *= math.sqrt(0.5)
        z2 = np.square(t)
        e = special.erfc(t, out=t)  # 2 Phi(-|t|)
        e *= q
        weighted = np.einsum("ij,ij->i", e, z2)  # sum q e z^2; rho = 40 + 28 z^2 below
        a, total = _running_sums(e, i0, z2)  # z2 is spent: its memory takes the transposed copy
        b = total - a
        weighted = 40.0 * total + 28.0 * weighted
        q_small, q_big = q_before[i0], q_from[i0]
        cdf_sum[start:start + _CHUNK] = 0.5 * a + q_big - 0.5 * b
        sf_sum[start:start + _CHUNK] = q_small - 0.5 * a + 0.5 * b
        err_cdf[start:start + _CHUNK] = 1.01 * (0.5 * UNIT_ROUNDOFF * weighted + sums * (total + q_big) + k * _TINY)
        err_sf[start:start + _CHUNK] = 1.01 * (0.5 * UNIT_ROUNDOFF * weighted + sums * (total + q_small) + k * _TINY)
    return cdf_sum, sf_sum, err_cdf, err_sf


def _running_sums(e: np.ndarray, i0: np.ndarray, scratch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each row p of the (points, support) array e of non-negative numbers: the running sum
    ((e_0 + e_1) + ...) + e_(i0_p - 1) of its first i0_p entries (0 for i0_p = 0) and that of all of
    them, left to right: the entries i0_p - 1 and -1 of ``np.cumsum(e, axis=1)``, bit for bit.

    Why not the cumsum: an accumulation runs along its axis one element at a time, each add waiting
    for the last (four times the cost of the erfc's other passes). A reduction over the first axis of
    the transposed (support, points) copy adds whole rows, e_i of every point at once, in the same
    order i = 0, 1, ... (numpy reduces along a non-innermost axis row by row, elementwise; only an
    innermost reduction is pairwise, hence at least two points); the prefix is the same reduction
    with the entries from i0_p on replaced by +0, which leaves a non-negative sum unchanged.
    ``scratch``, if given (an array of e's size the caller is done with), holds the copy."""
    n, k = e.shape
    if n < 2 or k < 2:
        run = np.cumsum(e, axis=1)
        return np.where(i0 > 0, run[np.arange(n), np.maximum(i0 - 1, 0)], 0.0), run[:, -1]
    if scratch is not None and scratch.size == e.size and scratch.dtype == e.dtype and scratch.flags.c_contiguous:
        et = scratch.reshape(k, n)  # memory the caller no longer needs (no fresh array to fault in)
        np.copyto(et, e.T)
    else:
        et = np.ascontiguousarray(e.T)
    total = np.add.reduce(et, axis=0)
    m = int(i0.max())
    if m == 0:
        return np.zeros(n), total
    head = et[:m]
    small = np.int16 if k < 2 ** 15 else np.int64  # the comparison's cost is its width
    np.copyto(head, 0.0, where=np.arange(m, dtype=small)[:, None] >= i0.astype(small))  # et is ours
    return np.add.reduce(head, axis=0), total


def _inversion_points(e_r: np.ndarray, m_a: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(np.union1d(e_r, m_a), the positions of m_a in it or None): the sorted distinct REMOVE points
    and mirrored ADD points. Usually (MMCC's rows, e_r strictly increasing) every m_a is an e_r:
    then the union is e_r itself, found by one search (the one the ADD deltas need anyway) instead
    of sorting both. The one value that may differ from union1d's is the sign of a zero (0 in e_r,
    -0 in m_a: the sort keeps either), which no computation downstream sees: the points enter the
    inversion only through comparisons, |eps| and L - eps, where L is never -0 (a log-sum-exp:
    log(tot) >= +0 plus the maximum exponent), so L - (+-0) is the same number."""
    if e_r.size and bool(np.all(e_r[1:] > e_r[:-1])):
        j = np.searchsorted(e_r, m_a)
        if bool(np.all(e_r[np.minimum(j, e_r.size - 1)] == m_a)):
            return e_r, j
    return np.union1d(e_r, m_a), None


def _paired_deltas(remove: _Loss, add: _Loss, eps_r: np.ndarray, eps_a: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """delta(eps) of both directions of one mixture, each root and each mixture CDF entry computed
    once for the two, and for each point a proven upper bound on the exact delta at the exact
    grid value (:func:`_delta_bounds`): (delta_remove, delta_add, bound_remove, bound_add).

    Why they can be shared: the ADD loss is the REMOVE loss mirrored, L_add(x) = -L_remove(-x)
    (the same exponents, with x and the slopes negated: bit for bit), so the ADD root at eps is
    minus the REMOVE root at -eps, and on the connect-the-dots lattice -eps = (-k) d is a REMOVE
    point too (for MMCC's rows the mirrored ADD points are a subset of the REMOVE points: half of
    the roots and half of the mixture CDF entries). At that root y the ADD mixture CDF is
    sum_i q_i Phi(-(y + s_i) / sigma), the upper tail of the very arguments t = (y + s_i) / sigma
    of the REMOVE CDF; one ``erfc`` per entry gives both sums accurately (:func:`_mixture_tails`),
    where ``ndtr(t)`` and ``ndtr(-t)`` took two.
    The formulas of delta are those of :func:`_deltas` (REMOVE: mu_upper_cdf(x*) - e^eps
    mu_lower_cdf(x*), ADD likewise at -y); only round-off differs. :func:`_paired_deltas_many`
    (of this one mixture) computes them."""
    return _paired_deltas_many([(remove, add, eps_r, eps_a)])[0]


def _per_point(values: list[float], counts: list[int]) -> np.ndarray:
    """values[i] repeated counts[i] times: a per-mixture number at each of that mixture's points (the
    same float: an elementwise operation with it gives what the operation with the scalar gives)."""
    return np.repeat(np.array(values, dtype=np.float64), counts)


def _paired_deltas_many(items: list[tuple[_Loss, _Loss, np.ndarray, np.ndarray]]
                        ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """:func:`_paired_deltas` of each (remove, add, eps_r, eps_a) in ``items``, bit for bit the values
    each gives on its own (tests/test_mog_pld_batched.py), in fewer array operations: MMCC's rows
    are hundreds of mixtures of a few hundred points each, where the per-call cost of the ~600
    array operations per mixture was most of the time.

    Which parts are batched: what is elementwise given a few numbers per mixture (the roots' error
    bounds, the CDFs at the roots, the deltas and their bounds) runs once on all mixtures' points
    concatenated, each per-mixture number (computed by the same Python expression as before) repeated
    at its points: an elementwise operation gives each point the value it gives on its own. What
    reduces over a mixture's support (the inversion's evaluations, the mixture sums) runs per
    mixture on exactly the arrays it ran on before, since a reduction's (and a BLAS product's)
    rounding may depend on the shape it is given."""
    n_items = len(items)
    results: list[list[np.ndarray]] = []
    # per mixture: the trivial points, the flat-limit bounds, the roots and the mixture sums
    inside: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
    roots: list[tuple[np.ndarray, np.ndarray]] = []  # (y, trace) per mixture with points to invert
    for remove, add, eps_r, eps_a in items:
        delta_r = np.zeros_like(eps_r)
        trivial_r = eps_r <= remove.flat_limit  # as in _deltas: delta = 1 - e^eps
        delta_r[trivial_r] = -np.expm1(eps_r[trivial_r])
        delta_a = np.zeros_like(eps_a)
        in_r = ~trivial_r
        in_a = ~(eps_a >= add.flat_limit)  # as in _deltas: delta = 0 beyond -log q0
        results.append([delta_r, delta_a, _flat_bounds(remove, eps_r), _flat_bounds(add, eps_a)])
        # the REMOVE points at which to invert: both sets of roots (add.flat_limit = -remove.flat_limit,
        # so the mirrored ADD points are inside the REMOVE range)
        e_r, e_a = eps_r[in_r], eps_a[in_a]
        pts, i_a = _inversion_points(e_r, -e_a)
        inside.append((in_r, in_a, e_r, e_a, pts, i_a))
    removes = [it[0] for it in items]
    # the roots of every mixture's points (its REMOVE loss), all inverted together
    traces = [np.empty((5, v[4].size)) for v in inside]
    found = _invert_many([removes[j] for j in range(n_items) if inside[j][4].size],
                         [v[4] for v in inside if v[4].size],
                         [_truncation(removes[j], LOG_MASS_TRUNCATION_BOUND) for j in range(n_items) if inside[j][4].size],
                         [traces[j] for j in range(n_items) if inside[j][4].size])
    found.reverse()
    for j in range(n_items):
        roots.append((found.pop() if inside[j][4].size else inside[j][4], traces[j]))
    errors = _root_errors_many(removes, [r[0] for r in roots], [v[4] for v in inside], [r[1] for r in roots])
    # per mixture: the loose roots redone, the mixture sums at the roots, and what the REMOVE and ADD
    # points read of them
    sel_r: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    sel_a: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for row in range(n_items):
        remove = removes[row]
        _, _, e_r, e_a, pts, i_a = inside[row]
        y, trace = roots[row]
        root = errors[row]
        if not pts.size:
            continue
        # a root whose residual is far above round-off (Halley's error estimate misled by curvature
        # that changes fast, as where a far component takes over) is finished by bisection
        loose = ~(root[:, 0] <= _LOOSE_RESIDUAL * (1.0 + np.abs(pts)))
        if loose.any():
            y[loose] = _bisect_roots(remove, pts[loose], y[loose], np.full(int(loose.sum()), -np.inf),
                                     np.full(int(loose.sum()), np.inf))
            trace[:, loose] = np.nan
            root[loose] = _root_errors(remove, y[loose], pts[loose], trace[:, loose])
        cdf_sum, sf_sum, err_cdf, err_sf = _mixture_tails(y, remove.s, remove.q, remove.sigma)
        if e_r.size:
            if e_r.size == pts.size and bool(np.all(e_r[1:] > e_r[:-1])):
                # pts holds the distinct e_r and no more: pts[j] == e_r[j], the search would give j
                sel_r.append((y, cdf_sum, err_cdf, root, e_r))
            else:
                i = np.searchsorted(pts, e_r)
                sel_r.append((y[i], cdf_sum[i], err_cdf[i], root[i], e_r))
        if e_a.size:
            i = i_a if i_a is not None else np.searchsorted(pts, -e_a)
            sf_i = sf_sum[i]
            sel_a.append((-y[i], sf_i, err_sf[i] / np.maximum(sf_i, np.finfo(float).tiny), root[i], e_a))
    rows_r = [j for j in range(n_items) if inside[j][4].size and inside[j][2].size]
    rows_a = [j for j in range(n_items) if inside[j][4].size and inside[j][3].size]
    # the deltas at the roots and their bounds, all mixtures' points at once (REMOVE, then ADD)
    if rows_r:
        counts = [s[4].size for s in sel_r]
        losses = [removes[j] for j in rows_r]
        yi, cdf_i, err_i, root_i, e_r = (np.concatenate([s[k] for s in sel_r]) for k in range(5))
        sigma = _per_point([loss.sigma for loss in losses], counts)
        lower = special.ndtr(yi / sigma)  # remove.lower_cdf
        scaled = _scaled_lower_many(losses, counts, yi, e_r, lower)
        d_r = cdf_i - scaled
        b = _delta_bounds_many(losses, counts, yi, e_r, d_r, cdf_i, err_i, lower, scaled,
                               _ndtr_allowance(yi / sigma), root_i, remove=True)
        _scatter_rows(results, inside, rows_r, 0, counts, d_r, b, _near_flat_many(losses, counts, e_r))
    if rows_a:
        counts = [s[4].size for s in sel_a]
        losses = [items[j][1] for j in rows_a]
        x_a, sf_i, rel_sf, root_i, e_a = (np.concatenate([s[k] for s in sel_a]) for k in range(5))
        sigma = _per_point([loss.sigma for loss in losses], counts)
        upper = special.ndtr(x_a / sigma)  # add.upper_cdf
        scaled = _scaled_lower_many(losses, counts, x_a, e_a, sf_i)
        d_a = upper - scaled
        b = _delta_bounds_many(losses, counts, x_a, e_a, d_a, upper, _ndtr_allowance(x_a / sigma) * upper,
                               sf_i, scaled, rel_sf, root_i, remove=False)
        _scatter_rows(results, inside, rows_a, 1, counts, d_a, b, _near_flat_many(losses, counts, e_a))
    return [(np.clip(r[0], 0.0, 1.0), np.clip(r[1], 0.0, 1.0), r[2], r[3]) for r in results]


def _scatter_rows(results: list, inside: list, rows: list[int], side: int, counts: list[int], deltas: np.ndarray,
                  bounds: np.ndarray, near: np.ndarray) -> None:
    """Write one side's (0 REMOVE, 1 ADD) deltas and bounds of the rows ``rows``, concatenated with
    ``counts`` points each, into ``results[row]`` at the row's inverted points (``inside[row][side]``);
    the flat-limit bound stays where ``near``."""
    cuts = np.cumsum(counts)[:-1]
    for j, part_d, part_b, part_near in zip(rows, np.split(deltas, cuts), np.split(bounds, cuts),
                                            np.split(near, cuts), strict=True):
        at = inside[j][side]
        results[j][side][at] = part_d
        results[j][side + 2][at] = np.where(part_near, results[j][side + 2][at], part_b)


def _scaled_lower_many(losses: list[_Loss], counts: list[int], x: np.ndarray, eps: np.ndarray,
                       lower: np.ndarray) -> np.ndarray:
    """:func:`_scaled_lower` of each loss at its ``counts`` consecutive points of x, eps, lower."""
    big = _log_form(eps, lower)
    if not big.any():
        return np.exp(eps) * lower
    out = np.empty_like(eps)
    small = ~big
    out[small] = np.exp(eps[small]) * lower[small]
    start = 0
    for loss, n in zip(losses, counts, strict=True):
        part = slice(start, start + n)
        start += n
        sel = start - n + np.flatnonzero(big[part])
        if sel.size:
            with np.errstate(over="ignore"):
                out[sel] = np.exp(eps[sel] + loss.lower_log_cdf(x[sel]))
    return out


def _near_flat_many(losses: list[_Loss], counts: list[int], eps: np.ndarray) -> np.ndarray:
    """:func:`_near_flat` of each loss (all of one direction) at its ``counts`` consecutive eps."""
    if not losses:
        return np.zeros(eps.shape, dtype=bool)
    remove = losses[0].remove
    # the threshold of each loss as _near_flat forms it; none (never near) without a flat limit
    limits, has = [], []
    for loss in losses:
        has.append(math.isfinite(loss.flat_limit))
        margin = _NEAR_FLAT * (1.0 + abs(loss.flat_limit)) if has[-1] else 0.0
        limits.append(loss.flat_limit + margin if remove else loss.flat_limit - margin)
    limit = _per_point(limits, counts)
    with np.errstate(invalid="ignore"):
        near = eps <= limit if remove else eps >= limit
    return near & np.repeat(np.array(has, dtype=bool), counts)


# ---------------------------------------------------------------------------------------------
# Round-off: a proven upper bound on the exact delta at every grid point, and a connect-the-dots
# PMF lifted to dominate it (docs/accounting.md, "Round-off of the MMCC row PLDs")

#: Points within this relative distance of a flat limit of the loss take the flat-limit bound
#: (:func:`_flat_bounds`), valid everywhere, instead of the root's (which needs a root).
_NEAR_FLAT = 1e-9
#: Largest relative lift of a row PMF's masses (:func:`_certified`); a larger deficit is covered
#: by infinity mass instead.
_KAPPA_CAP = 1e-9


def _ndtr_allowance(x: np.ndarray) -> np.ndarray:
    """Relative error bound of ``ndtr(x)`` (x = y / sigma, formed with one rounding) against Phi at
    the exact y / sigma: the assumed allowance (NDTR_ULPS_0 + NDTR_ULPS_2 x^2) u plus the argument's
    rounding u |x| amplified by |d log Phi / dx| <= |x| + 1 (Mills' ratio)."""
    ax = np.abs(x)
    return (NDTR_ULPS_0 + NDTR_ULPS_2 * ax * ax + 1.01 * ax * (ax + 1.0) + 1.0) * UNIT_ROUNDOFF


def _root_errors(loss: _Loss, y: np.ndarray, eps: np.ndarray, trace: np.ndarray) -> np.ndarray:
    """For each computed root y of L(x) = eps (REMOVE loss: convex, decreasing) the triple
    (R, m, Delta): R >= |L(y) - eps| (exact L, exact grid value), m <= |L'(y)| (0 where unknown),
    and Delta >= |x* - y| for the exact root x* (inf where not bounded). :func:`_delta_bounds`
    turns them into a bound on the shortfall of g(y) = mu_upper_cdf(y) - e^eps mu_lower_cdf(y)
    below its maximum g(x*) = delta(eps).

    From the last evaluation (``trace``: x_k, f = L(x_k) - eps, L'(x_k) and L''(x_k) as computed,
    and the step s to y = x_k - s): Taylor, L(y) = L(x_k) - L'(x_k) s + L''(x_k) s^2 / 2
    - L^(3)(xi) s^3 / 6. L'' is the variance of the slopes b_i under the weights and L^(3) their
    third central moment, at most B L'' in size (B the slopes' range), so L'' grows by at most
    e^(B t) over a distance t, and it never exceeds B^2 / 4 (Popoviciu): on [x_k - t, x_k + t],
    |L''| <= c(t) = min(B^2 / 4, (L''(x_k) + its round-off) e^(B t)) and |L^(3)| <= B c(t).
    Round-off of the computed values (:mod:`mfcli.util.floating` model: the exponents
    z_i = const_i + x b_i with their inputs' roundings, the maximum subtracted, exp, the sum, log):
    at most e = 16 u (1 + |x| max|b| + max(|log q| + s^2 / 2v) + |L| + k) for L, 3e relatively
    for L' (a weighted mean of slopes of one sign), (4e + 8u) max b^2 for L''; the grid value's
    rounding adds u |eps| and forming y adds u |y| |L'|. m = |L'(x_k)| (1 - 3e) - c(t) t with
    t = |s| + u |y|. Delta: with t' = t + 4R / m, m' = |L'(x_k)| (1 - 3e) - c(t') t' >= m / 2 and
    c(t') R <= m'^2 / 2, |L(y + t) - L(y)| >= m' t - c(t') t^2 / 2 on the way to the root, which at
    t = 2R / m' (<= 4R / m) is >= R, the loss monotone up to there: the root lies within 2R / m'.
    A root finished by bisection is evaluated afresh (x_k = y, s = 0). :func:`_root_errors_many`
    (of this one loss) computes them."""
    return _root_errors_many([loss], [y], [eps], [trace])[0]


def _root_errors_many(losses: list[_Loss], ys: list[np.ndarray], epss: list[np.ndarray],
                      traces: list[np.ndarray]) -> list[np.ndarray]:
    """:func:`_root_errors` of each (loss, y, eps, trace), bit for bit: the Taylor bounds of all
    losses' roots at once (elementwise, each loss's numbers repeated at its points), the fresh
    evaluations per loss on the points its own call evaluates."""
    counts = [y.size for y in ys]
    params = [(float(loss.s.size), float(np.max(np.abs(loss.logq) + loss.s * loss.s / (2.0 * loss.v))),
               float(np.max(np.abs(loss.slope))), loss.slope_range) for loss in losses]
    y = np.concatenate(ys)
    eps = np.concatenate(epss)
    xk, f, d1, d2, step = np.concatenate(traces, axis=1)  # read only (rows of the trace)
    k, cmax, bmax, spread = (_per_point([p[i] for p in params], counts) for i in range(4))
    curv_max = _per_point([1.01 * p[3] ** 2 / 4.0 for p in params], counts)
    # in blocks that stay in cache (every operation is elementwise: the same numbers)
    out = np.empty((y.size, 3))
    for start in range(0, y.size, _ROOT_BLOCK):
        b = slice(start, start + _ROOT_BLOCK)
        out[b] = _root_bounds(xk[b], f[b], d1[b], d2[b], step[b], y[b], eps[b], k=k[b], cmax=cmax[b], bmax=bmax[b],
                              spread=spread[b], curv_max=curv_max[b])
    # the roots finished by bisection, and those whose Taylor bound is loose (a long last step where
    # the curvature changes fast), are evaluated afresh at y (x_k = y, s = 0)
    fresh = np.isnan(xk) | ~(out[:, 0] <= _FRESH_RESIDUAL * (1.0 + np.abs(eps)))
    parts = np.split(out, np.cumsum(counts)[:-1]) if counts else []
    if fresh.any():
        start = 0
        for loss, n, part, (kk, cm, bm, sp) in zip(losses, counts, parts, params, strict=True):
            idx = np.flatnonzero(fresh[start:start + n])
            yl, el = y[start:start + n], eps[start:start + n]
            start += n
            for first in range(0, idx.size, _CHUNK):
                i = idx[first:first + _CHUNK]
                val, slope, c2 = loss.value_slope_curvature(yl[i])
                part[i] = _root_bounds(yl[i], val - el[i], slope, c2, np.zeros(i.size), yl[i], el[i], k=int(kk), cmax=cm,
                                       bmax=bm, spread=sp)
    return parts

#: Points per block of :func:`_root_bounds` in :func:`_root_errors` (its ~70 array operations on
#: 200k points ran from memory, not cache: 19 ms against 14 ms in blocks).
_ROOT_BLOCK = 16384
#: A Taylor bound on a root's residual above this (times 1 + |eps|) is replaced by a fresh evaluation.
_FRESH_RESIDUAL = 1e-12
#: A root whose proven residual is above this (times 1 + |eps|) is found again by bisection.
_LOOSE_RESIDUAL = 1e-9


def _root_bounds(xk: np.ndarray, f: np.ndarray, d1: np.ndarray, d2: np.ndarray, step: np.ndarray, y: np.ndarray,
                 eps: np.ndarray, *, k: Any, cmax: Any, bmax: Any, spread: Any, curv_max: Any = None) -> np.ndarray:
    """:func:`_root_errors`' (R, m, Delta) from one evaluation at x_k (its docstring has the argument). The
    loss's numbers k, cmax, bmax, spread (and curv_max, 1.01 spread^2 / 4 if not given) are floats, or
    arrays of them per point (:func:`_root_errors_many`)."""
    u = UNIT_ROUNDOFF
    if curv_max is None:
        curv_max = 1.01 * spread ** 2 / 4.0
    e = 16.0 * u * (1.0 + np.abs(xk) * bmax + cmax + np.abs(f + eps) + k)
    d2_here = np.abs(d2) + (4.0 * e + 8.0 * u) * bmax * bmax

    def curvature(t: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.minimum(curv_max, 1.01 * d2_here * np.exp(np.minimum(spread * t, 700.0)))

    ad1 = np.where(e < 0.1, np.abs(d1) * (1.0 - 3.0 * e), 0.0)
    a_s = np.abs(step)
    t = a_s + u * np.abs(y)
    c1 = curvature(t)
    quad_term = 0.5 * d2 * step * step
    r = 1.02 * (np.abs(f - d1 * step + quad_term) + e + u * (np.abs(eps) + 2.0 * np.abs(f)) + 3.0 * e * np.abs(d1) * a_s
                + (d2_here - np.abs(d2)) * 0.5 * a_s * a_s + spread * c1 * a_s ** 3 / 6.0
                + np.abs(d1) * u * (np.abs(y) + 2.0 * a_s) + 4.0 * u * np.abs(quad_term))
    m = np.maximum(ad1 - c1 * t, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t2 = t + 4.0 * r / m
        c2 = curvature(np.where(np.isfinite(t2), t2, 0.0))
        m2 = ad1 - c2 * t2
        quad = (m > 0) & np.isfinite(t2) & (m2 >= 0.5 * m) & (c2 * r <= 0.5 * m2 * m2)
        dist = np.where(quad, 2.02 * r / np.where(quad, m2, 1.0), np.inf)
    return np.stack((r, m, dist), axis=1)


def _delta_bounds(loss: _Loss, x: np.ndarray, eps: np.ndarray, delta: np.ndarray, upper: np.ndarray,
                  err_upper: np.ndarray, lower: np.ndarray, scaled: np.ndarray, rel_lower: np.ndarray,
                  root: np.ndarray, *, remove: bool) -> np.ndarray:
    """A proven upper bound on the exact delta(eps) (exact grid value, exact mixture) at points whose
    computed value is ``delta`` = ``upper`` - ``scaled`` at the computed root x of ``loss``
    (REMOVE: x = y; ADD: x = -y, y the REMOVE root). err_upper bounds mu_upper_cdf(x)'s absolute
    round-off; rel_lower mu_lower_cdf(x)'s relative round-off; ``root`` is :func:`_root_errors`'
    (R, m, Delta) for y.

    The bound is delta + |upper error| + |scaled error| + the root's shortfall
    g(x*) - g(x) = integral between x and x* of w (e^L - e^eps), w the mu_lower density, with
    |e^L - e^eps| <= e^eps expm1(R) there (L monotone). Both directions have N(0) on one side:
    REMOVE's mu_lower, whose e^eps w is bounded directly; ADD's mu_upper u = e^L w, so
    e^eps w <= e^R u. Two bounds, the smaller taken: Delta times the largest such density on the
    interval (N(0) at its point nearest 0), and the N(0) mass of everything the interval can
    cover: x* >= y - R / m always (if L(y) < eps, the tangent at y, under the convex REMOVE loss,
    meets eps within (eps - L(y)) / m; else x* >= y), so for REMOVE the interval lies in
    [y - R / m, inf) and for ADD in (-inf, -y + R / m], each of N(0) mass Phi((R / m - y) / sigma)
    (1 without m). :func:`_delta_bounds_many` (of this one loss) computes it."""
    return _delta_bounds_many([loss], [x.size], x, eps, delta, upper, err_upper, lower, scaled, rel_lower, root,
                              remove=remove)


def _delta_bounds_many(losses: list[_Loss], counts: list[int], x: np.ndarray, eps: np.ndarray, delta: np.ndarray,
                       upper: np.ndarray, err_upper: np.ndarray, lower: np.ndarray, scaled: np.ndarray,
                       rel_lower: np.ndarray, root: np.ndarray, *, remove: bool) -> np.ndarray:
    """:func:`_delta_bounds` of each loss (all of one direction) at its ``counts`` consecutive points
    of the arrays, bit for bit: every operation is elementwise, each loss's numbers (sigma, max s,
    the probabilities' error and what follows from them, by the same Python expressions) repeated
    at its points."""
    u = UNIT_ROUNDOFF
    r, m, dist = root[:, 0], root[:, 1], root[:, 2]
    sigma = _per_point([loss.sigma for loss in losses], counts)
    big = _log_form(eps, lower)
    # e^eps mu_lower_cdf: exp (ELEMENTARY_ULPS), the product, the grid value's rounding (u |eps|)
    rel_scaled = rel_lower + (ELEMENTARY_ULPS + 2.0 + 1.01 * np.abs(eps)) * u
    if big.any():  # formed as exp(eps + log mu_lower_cdf), log_ndtr within the same allowance as ndtr
        # (it does not underflow): log's error and the exponent's rounding too
        log_lower = np.log(np.maximum(scaled, np.finfo(float).tiny)) - eps
        x_max = (np.abs(x) + _per_point([float(loss.s.max()) for loss in losses], counts)) / sigma
        rel_big = (64.0 + 16.0 * x_max * x_max + 16.0 * (np.abs(eps) + np.abs(log_lower))) * u
        rel_scaled = np.where(big, np.maximum(rel_scaled, rel_big), rel_scaled)
    # an underflowed CDF at eps <= 0 (formed directly): its absolute error, at most 2^-1022 (both
    # erfc and ndtr stay within 0.005 of that in the tests), times e^eps <= 1
    evaluation = err_upper + 1.01 * rel_scaled * scaled + u * np.abs(delta) + 2.0 * _TINY
    # probabilities within rho of the exact ones (loss.prob_error): REMOVE's P = sum q N(-s) is at
    # most (1 + rho) times the computed one, so delta <= (1 + rho) delta_computed(eps - log(1 + rho));
    # ADD's Q = sum q N(s) at least (1 - rho) times, so delta <= delta_computed(eps + log(1 - rho)).
    # The eps shift t moves e^eps mu_lower by t e^eps mu_lower at most (1 - e^-t <= t) and the
    # root's residual by t.
    shifts = [1.01 * (math.log1p(loss.prob_error) if remove else -math.log1p(-loss.prob_error)) for loss in losses]
    shift = _per_point(shifts, counts)
    moved = shift > 0
    if moved.any():
        evaluation = np.where(moved, evaluation + _per_point([1.01 * t for t in shifts], counts) * scaled, evaluation)
        grow = (r + shift) / np.where(r > 0, r, 1.0)
        dist = np.where(moved & np.isfinite(dist), dist * grow, dist)  # Delta <= 2R / m grows with R
        r = np.where(moved, r + shift, r)
    y = x if remove else -x
    log_density = _per_point([math.log(loss.sigma * math.sqrt(2.0 * math.pi)) for loss in losses], counts)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        log_scale = eps if remove else r  # e^eps w <= e^scale N(0) density (or mass); no cap: an
        # overflow is inf, and the bound then falls back to the other form or to 1
        z = np.maximum(np.abs(y) - dist, 0.0) / sigma
        near = dist * np.exp(log_scale - 0.5 * z * z - log_density)
        reach = np.where(m > 0, r / np.where(m > 0, m, 1.0), np.inf)
        log_mass = np.where(np.isfinite(reach), special.log_ndtr((reach - y) / sigma), 0.0)
        far = np.exp(log_scale + log_mass) * (1.0 + 1e-6) + _TINY
        shortfall = np.expm1(r) * np.fmin(np.where(np.isfinite(dist), near, np.inf), far)
    shortfall = np.where(np.isfinite(shortfall), shortfall, 1.0)
    lift = _per_point([1.0 + loss.prob_error if remove else 1.0 for loss in losses], counts)
    return np.minimum((delta + evaluation + 1.01 * shortfall) * lift * (1.0 + 8.0 * u), 1.0)


def _flat_error(loss: _Loss) -> float:
    """Bound on |computed flat limit - exact flat limit| (+-log of q0, a sum of the given q)."""
    return (((loss.s.size + 4) * 1.01 + ELEMENTARY_ULPS * abs(loss.flat_limit)) * UNIT_ROUNDOFF * 1.01
            + 1.01 * -math.log1p(-loss.prob_error))  # q0 itself within rho


def _near_flat(loss: _Loss, eps: np.ndarray) -> np.ndarray:
    """The points whose bound is the flat-limit bound (:func:`_flat_bounds`): REMOVE eps at or
    below log q0 (plus a margin), ADD eps at or above -log q0 (less a margin)."""
    if not math.isfinite(loss.flat_limit):
        return np.zeros(eps.shape, dtype=bool)
    margin = _NEAR_FLAT * (1.0 + abs(loss.flat_limit))
    return eps <= loss.flat_limit + margin if loss.remove else eps >= loss.flat_limit - margin


def _flat_bounds(loss: _Loss, eps: np.ndarray) -> np.ndarray:
    """Upper bounds on delta(eps) from the flat limit alone, valid at every eps, at the points
    :func:`_near_flat` selects (inf elsewhere, and where the loss has no flat limit, q0 = 0).
    REMOVE: L >= log q0, so delta - (1 - e^eps) = E_Q[(e^eps - e^L)_+] <= e^eps (eps - log q0)_+.
    ADD: L <= -log q0, so delta = E_Q[(e^L - e^eps)_+] <= e^flat (flat - eps)_+. Each with its
    round-off (the flat limit's, expm1's, the grid value's)."""
    u = UNIT_ROUNDOFF
    out = np.full(eps.shape, np.inf)
    near = _near_flat(loss, eps)
    if not near.any():
        return out
    e = eps[near]
    flat, err = loss.flat_limit, _flat_error(loss)
    slack = err + 2.0 * u * np.abs(e)
    if loss.remove:  # e <= flat + margin < 0 here
        base = np.maximum(-np.expm1(e), 0.0) * (1.0 + (ELEMENTARY_ULPS + 2.0 + np.abs(e)) * u)
        extra = np.exp(e) * np.maximum(e - flat + slack, 0.0)
    else:
        base = np.zeros_like(e)
        extra = math.exp(flat + err) * np.maximum(flat - e + slack, 0.0)
    lift = 1.0 + loss.prob_error if loss.remove else 1.0  # P = sum q N(-s) scales with the q (REMOVE)
    out[near] = np.minimum((base + 1.02 * extra) * lift * (1.0 + 8.0 * u), 1.0)
    return out


def _reverse_cumsum(x: np.ndarray) -> tuple[np.ndarray, int]:
    """sum_{i >= j} x_i for every j, in blocks of about sqrt(n) (each block's running sums, then the
    blocks' totals'), and the number of roundings a term meets at most: a sum of non-negative terms
    is then within gamma of that number of its exact value (a plain running sum's n would be 2e-9
    relative at n = 2e7)."""
    n = x.size
    block = max(1, math.isqrt(n))
    nb = -(-n // block)
    padded = np.zeros(nb * block)
    padded[:n] = x[::-1]
    run = np.cumsum(padded.reshape(nb, block), axis=1)
    offsets = np.concatenate(([0.0], np.cumsum(run[:, -1])[:-1]))
    run += offsets[:, None]
    return run.ravel()[:n][::-1], block + nb + 1


def _curve_lower_bounds(ks: np.ndarray, d: float, p: np.ndarray, p_inf: float) -> np.ndarray:
    """Lower bounds on the hockey-stick curve D(eps_j) = sum_{i > j} p_i (1 - e^-(eps_i - eps_j)) + p_inf
    of the PMF with masses p_i at eps_i = ks_i d (exactly), at every point eps_j.

    Without cancellation: D_j - D_{j+1} = (1 - e^-(eps_{j+1} - eps_j)) E_{j+1} with
    E_m = sum_{i >= m} p_i e^-(eps_i - eps_m), so D is a running sum of non-negative terms and E
    one too (in segments of at most 600 in eps, so that no exponential overflows): every step is a
    sum of non-negative terms or a product, each with a relative error bound (the exponents are
    formed as (integer difference) x d, one rounding), so D's computed value is within a relative
    rho of the exact one (plus underflow: at most 2^-1074 per operation, scaled by e^600 at most,
    1e-50 in all)."""
    n = p.size
    e = np.empty(n)
    top = n
    segments = 0
    span_max = 0.0
    roundings = 0
    while top > 0:
        a = min(int(np.searchsorted(ks, ks[top - 1] - 600.0 / d, side="left")), top - 1)
        seg = slice(a, top)
        arg = (ks[seg] - ks[a]) * d  # >= 0, <= 600
        run, r = _reverse_cumsum(p[seg] * np.exp(-arg))
        roundings = max(roundings, r)
        e[seg] = run * np.exp(arg)
        if top < n:
            e[seg] += np.exp(-(ks[top] - ks[seg]) * d) * e[top]
        span_max = max(span_max, float((ks[min(top, n - 1)] - ks[a]) * d))
        segments += 1
        top = a
    curve = np.empty(n)
    curve[-1] = p_inf
    if n > 1:
        run, r = _reverse_cumsum(-np.expm1(-np.diff(ks) * d) * e[1:])
        roundings = max(roundings, r)
        curve[:-1] = run + p_inf
    return curve * (1.0 - _curve_rho(roundings, segments, span_max)) - 1e-50


def _curve_rho(roundings: int, segments: int, span_max: float) -> float:
    """The relative error bound of :func:`_curve_lower_bounds`' computed curve: the running sums'
    roundings (gamma of their count + 8) and, per exponent segment, the exponentials' and products'
    (16 + 3 x the segment's span, in units of roundoff), raised by 5 %."""
    return 1.05 * (2.0 * gamma(roundings + 8) + (segments + 2) * (16.0 + 3.0 * span_max) * UNIT_ROUNDOFF)


def _check_bounds(bound: np.ndarray) -> None:
    """Refuse a row whose proven delta bounds are undefined (NaN): the lift would spread the NaN to
    every mass. It happens where a sensitivity is so small against sigma (about 1e-200 of it) that
    the loss's slope range is 0; no PLD is claimed there."""
    if np.isnan(bound).any():
        raise MfcliError("a mixture-of-Gaussians PLD could not bound its round-off (a sensitivity too small "
                         "against sigma, below about 1e-200 of it?): no PLD is claimed for it")


def _certified(pmf: pld_ops.Pmf, ks: np.ndarray, bound: np.ndarray) -> pld_ops.Pmf:
    """``pmf`` (connect-the-dots on the points ks d) lifted so that its curve dominates ``bound``
    (upper bounds on the exact delta) at every point, and its total mass is at least 1.

    Why that suffices: between two points the PMF's curve is linear in e^eps and the exact one is
    convex in e^eps (a chord above both ends lies above it); beyond the last point the curve is the
    infinity mass, at least the exact delta there and so beyond; below the first point it is linear
    in e^eps from the total mass (at e^eps = 0) to its value at the first point, above the chord
    from 1 to the exact value. Two lifts keep the PMF a valid pessimistic one: every mass times
    1 + kappa (the curve times 1 + kappa: for relative deficits, the usual case) and mass eta added
    at +inf (the curve plus eta: the rest). Composition is linear in each factor's curve, so a
    lifted PMF composes to an upper bound."""
    _check_bounds(bound)
    u = UNIT_ROUNDOFF
    d = pmf.discretization
    # the masses at the points (every one of them when the points are consecutive: the array itself)
    p = pmf.probs if ks.size == pmf.probs.size else pmf.probs[ks - ks[0]]
    low = _curve_lower_bounds(ks.astype(np.float64), d, p, pmf.infinity_mass)
    pos = low > 0
    deficit = 0.0
    if pos.all():
        deficit = float(np.max((bound - low) / low, initial=0.0))
    elif pos.any():
        deficit = float(np.max((bound[pos] - low[pos]) / low[pos], initial=0.0))
    kappa = _lift_kappa(deficit)
    lifted = low * (1.0 + kappa) * (1.0 - 2.0 * u)
    over = float(np.max(bound - lifted, initial=0.0))
    return _lifted_pmf(d, pmf.lower_loss, pmf.probs, p, pmf.infinity_mass, kappa, over, unlifted=pmf)


def _lift_kappa(deficit: float) -> float:
    """The relative lift of :func:`_certified` from the largest relative deficit of the curve's lower
    bound below the proven bounds: raised by 1e-6 (its own rounding), at least 0, at most
    :data:`_KAPPA_CAP` (the rest goes to infinity mass)."""
    return min(max(deficit * (1.0 + 1e-6), 0.0), _KAPPA_CAP)


def _lifted_pmf(d: float, lower_loss: int, probs: np.ndarray, p_points: np.ndarray, infinity_mass: float,
                kappa: float, over: float, unlifted: pld_ops.Pmf | None = None) -> pld_ops.Pmf:
    """The lift of :func:`_certified`: every mass times 1 + kappa (+ 4u) and eta = the largest of
    ``over`` (what the curve still misses after kappa), the mass shortfall of the masses at the points
    ``p_points`` (:func:`_mass_shortfall`) and 0 added at +inf (times 1 + 1e-6). Nothing to lift:
    ``unlifted`` itself where given."""
    u = UNIT_ROUNDOFF
    eta = max(over, _mass_shortfall(p_points, infinity_mass, kappa, over), 0.0)
    if kappa == 0.0 and eta == 0.0:
        return unlifted if unlifted is not None else pld_ops.Pmf(d, lower_loss, probs, infinity_mass, True)
    factor = 1.0 + (kappa + 4.0 * u)
    infinity = (infinity_mass * factor + eta * (1.0 + 1e-6)) * (1.0 + 4.0 * u)
    return pld_ops.Pmf(d, lower_loss, probs * factor, float(infinity), True)


def _mass_shortfall(p: np.ndarray, infinity_mass: float, kappa: float, over: float) -> float:
    """1 - total (1 + kappa) (1 - 2u) for total = (fsum(p) + infinity_mass) (1 - 4u), a lower bound on
    the PMF's mass (fsum: correctly rounded), or any number at most ``over`` (>= 0) when that is
    certain without the exact sum: :func:`_certified` takes the largest of ``over``, this and 0, so
    its value is then ``over`` either way (bit for bit the same lift, without fsum's list of floats).

    Certain when it holds at a lower bound on fsum(p) (each rounding is monotone, so the expression
    does not increase with the total): the pairwise sum S of the n non-negative p is within
    gamma_(n-1) <= 1.01 (n - 1) u of the exact sum, so S (1 - 4 n u), rounded, is at most the exact
    sum, and fsum(p), the exact sum rounded, is at least that float."""
    u = UNIT_ROUNDOFF
    n = p.size
    rough = float(np.sum(p))
    if math.isfinite(rough) and n * u < 1e-3 and not (p < 0).any():
        low = ((rough * (1.0 - 4.0 * n * u)) + infinity_mass) * (1.0 - 4.0 * u)
        if 1.0 - low * (1.0 + kappa) * (1.0 - 2.0 * u) <= over:
            return over
    # fsum over the buffer's floats themselves (a list of Python floats first took as long again)
    total = (math.fsum(np.ascontiguousarray(p, dtype=np.float64).data) + infinity_mass) * (1.0 - 4.0 * u)
    return 1.0 - total * (1.0 + kappa) * (1.0 - 2.0 * u)


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
        probs = _fixed_gap_masses(deltas, gaps[0] * discretization, np.array(deltas.size - 1))
    else:
        ed = np.diff(ks) * discretization
        dd = np.diff(deltas)
        y = np.append(1.0 - deltas[0], dd / np.expm1(-ed))
        z = np.append(dd / np.expm1(ed), 0.0)
        probs = np.maximum(0.0, y + z)
    dense = np.zeros(int(ks[-1] - ks[0]) + 1)
    dense[ks - ks[0]] = probs
    return pld_ops.Pmf(discretization, int(ks[0]), dense, float(deltas[-1]), True)


def _fixed_gap_masses(deltas: np.ndarray, g: float, last: np.ndarray) -> np.ndarray:
    """The connect-the-dots masses on evenly spaced points (gap ``g`` in eps; dp-accounting's
    numerically stabler fixed-gap form of :func:`connect_dots_pmf`'s formula) along the last axis of
    ``deltas``: one row, or several padded rows whose last points are at ``last`` (one index per
    row; past it a row's values are not meaningful). Negative masses are set to 0."""
    dd = np.diff(deltas, axis=-1)
    probs = np.empty(deltas.shape)
    probs[..., 0] = 1 - deltas[..., 0] + dd[..., 0] / math.expm1(g)
    probs[..., 1:-1] = (dd[..., 1:] - dd[..., :-1] * math.exp(g)) / math.expm1(g)
    at = np.asarray(last)[..., None]
    np.put_along_axis(probs, at, np.take_along_axis(dd, at - 1, axis=-1) / math.expm1(-g), axis=-1)
    return np.maximum(0.0, probs)


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
    remove = _Loss(float(sigma), s, q, True)
    width = 0.0
    for top, bottom in _loss_ends(remove, _Loss(float(sigma), s, q, False, mirror=remove)):
        width += top - bottom
    return width


def mixture_pld(
    sigma: float,
    sensitivities: ArrayLike,
    probabilities: ArrayLike,
    *,
    value_discretization_interval: float = 1e-4,
    max_points: int | None = None,
    probability_error: float = 0.0,
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
        probability_error: rho, a bound on the relative error of every given probability against
            the exact mechanism's (e.g. the round-off of the convolutions that formed them): the
            PLD dominates every mixture on the same support whose probabilities are within rho of
            the given ones (their distance from summing to 1 is added to rho).

    Returns:
        a :class:`mfcli.accounting.pld_ops.Pld` (``to_dp_accounting`` gives dp-accounting's
        ``PrivacyLossDistribution``).

    Formal guarantees: pessimistic connect-the-dots discretisation of the exact hockey-stick curves
    (see the module docstring); composing it with other pessimistic PLDs gives an upper bound on
    epsilon.
    """
    return mixture_plds(sigma, [(sensitivities, probabilities, probability_error)],
                        value_discretization_interval=value_discretization_interval, max_points=max_points)[0]


def mixture_plds(
    sigma: float,
    mixtures: Sequence[tuple[ArrayLike, ArrayLike, float]],
    *,
    value_discretization_interval: float = 1e-4,
    max_points: int | None = None,
) -> list[pld_ops.Pld]:
    """:func:`mixture_pld` of every (sensitivities, probabilities, probability_error) in
    ``mixtures``, at one sigma and grid: each PLD bit for bit the one its own call gives (the
    deltas and bounds of all mixtures are computed together, :func:`_paired_deltas_many`: MMCC's
    hundreds of row mechanisms cost ~600 small array operations each one by one)."""
    if not (value_discretization_interval > 0):
        raise MfcliError("the value discretization interval must be positive")
    if max_points is not None and not (isinstance(max_points, (int, np.integer)) and max_points >= 2):
        raise MfcliError(f"max_points must be an integer of at least 2 (both ends of the grid), got {max_points!r}")
    d = value_discretization_interval
    items = []
    grids = []
    for sensitivities, probabilities, probability_error in mixtures:
        s, q = _check_mixture(sigma, sensitivities, probabilities)
        remove = _Loss(float(sigma), s, q, True)
        add = _Loss(float(sigma), s, q, False, mirror=remove)
        if not (0.0 <= probability_error <= 1e-6):
            raise MfcliError(f"probability_error must lie in [0, 1e-6], got {probability_error!r}")
        rho = (float(probability_error) + abs(math.fsum(q.tolist()) - 1.0)) * (1.0 + 1e-9) + 2.0 * UNIT_ROUNDOFF
        remove.prob_error = add.prob_error = rho
        ends_r, ends_a = _loss_ends(remove, add)
        ks_r, ks_a = _grid_points(remove, d, max_points, ends_r), _grid_points(add, d, max_points, ends_a)
        items.append((remove, add, ks_r * d, ks_a * d))
        grids.append((ks_r, ks_a))
    out: list[pld_ops.Pld] = []
    # in batches of at most about _BATCH_POINTS grid points (their arrays side by side: the memory of
    # a few times their PMFs', not of all rows' at once)
    first = 0
    while first < len(items):
        last, points = first, 0
        while last < len(items) and (last == first or points + grids[last][0].size + grids[last][1].size
                                     <= _BATCH_POINTS):
            points += grids[last][0].size + grids[last][1].size
            last += 1
        ks_all, deltas, bounds = [], [], []
        for (ks_r, ks_a), (delta_r, delta_a, bound_r, bound_a) in zip(
                grids[first:last], _paired_deltas_many(items[first:last]), strict=True):
            ks_all += [ks_r, ks_a]
            deltas += [delta_r, delta_a]
            bounds += [bound_r, bound_a]
        pmfs = _pmfs_from_deltas_many(d, ks_all, deltas, bounds)
        out += [pld_ops.Pld(pmfs[2 * i], pmfs[2 * i + 1]) for i in range(last - first)]
        first = last
    return out


#: Grid points (both directions) of the mixtures :func:`mixture_plds` builds together at most (one
#: mixture of more goes alone).
_BATCH_POINTS = 1 << 20


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
