"""The binary-tree mechanism under balls-in-bins batching (random allocation), with a
deterministic bracket on epsilon (docs/accounting.md, "Binary tree under balls-in-bins").

Setting: one epoch of n = 2^L steps; every example is placed in exactly one step, chosen
uniformly at random and independently of the other examples; C is the binary-tree encoder on
n leaves (every column in L + 1 nodes) with noise N(0, sigma^2) per node. Epochs compose: every
epoch draws a fresh allocation, fresh noise and runs its own tree.

The pair analysed (docs/accounting.md states where it dominates the training run) is
P = (1/n) sum_i N(C e_i, sigma^2 I) against Q = N(0, sigma^2 I). Its likelihood ratio at a node v
of the tree is R_v = w_v (R_left + R_right) / 2 with w_v = exp(y_v / sigma^2 - 1/(2 sigma^2)), so
L_v = log R_v = G_v + log((e^A + e^A') / 2) where A, A' are the children's log-ratios. Under Q
the children are independent copies of the level below and G_v ~ N(-1/(2 sigma^2), 1/sigma^2);
under P the example lies below one child (left or right with probability 1/2), so one child has
its P-law, the other its Q-law, and G_v has mean +1/(2 sigma^2).

The laws are propagated level by level on the grid h Z, twice:

* U (round up): U_v = ceil_h(G_v + log((e^U_l + e^U_r) / 2)) >= L_v pointwise. Mass that leaves
  the grid at the top is dropped (it stands for +inf); mass below the grid is moved up to its
  lowest point. The law of U under P is a pessimistic privacy-loss distribution of the remove
  direction (loss L under P, missing mass = infinity mass), and the law of U under Q gives the
  optimistic add direction (loss -U under Q, dropped mass = loss -inf).
* D (round down): D_v <= L_v pointwise; mass above the grid is moved down to its top, mass below
  is dropped (stands for -inf). D under Q gives the pessimistic add direction (loss -D, missing
  mass = infinity mass), D under P the optimistic remove direction.

Because U >= L >= D pointwise and every hockey-stick divergence is monotone in the loss, the two
PLDs built from them bracket the true privacy profile: ``upper`` is a valid epsilon(delta) (after
composition too: dp-accounting's pessimistic PLD composition), ``lower`` is never above the
truth. The PLDs are :mod:`mfcli.accounting.pld_ops`' (dp-accounting's construction, composition
and epsilon, bit for bit, without importing it: ``mfcli account`` never loads dp-accounting).
Floating point (proven; docs/accounting.md, "Floating point"): every law carries ``rho``, a bound
on the relative error of each of its masses against the law exact arithmetic gives from the same
discrete choices, and ``dropped``, a bound on that law's missing mass. Both are computed alongside
the law from its actual values, under IEEE double rounding (no underflow: entries below
:data:`FLOOR` are dropped one-sidedly) and one assumption (scipy's ndtr within
:data:`NDTR_ULPS_0` + :data:`NDTR_ULPS_2` x^2 ulps). Every sum is of non-negative terms and none
is a difference (the pair step's window sums come from a doubling table, not from prefix-sum
differences), so the bounds are relative: the PLDs' masses are scaled to their side of the exact
law (pessimistic up, optimistic down), no slack is added to delta, and deltas down to 1e-14 give
finite brackets. The epsilon ends are checked against the PLDs with every rounding counted
(:func:`_hockey_bound`) and moved outward where needed. Several epochs: the upper end's
composition (pld_ops' FFT) is certified by :mod:`mfcli.accounting.pld_certify` (``certify``), the
lower end's by the same module's lower certificate (``certify_lower``: the composition redone by
linear, unaliased compositions of tilted PMFs, the round-off subtracted).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from mfcli.accounting import pld_certify, pld_ops
from mfcli.accounting.defaults import DEFAULT_DELTA
from mfcli.accounting.single_pass import check_delta, check_sigma
from mfcli.errors import MfcliError
from mfcli.util.floating import NDTR_ULPS_0, NDTR_ULPS_2, UNIT_ROUNDOFF
from mfcli.util.floating import gamma as _gamma
from mfcli.util.progress import ProgressCallback, Ticker
from mfcli.util.validation import positive_int, positive_number

#: Default grid of the log-likelihood ratio (rounding per level; the bracket width grows with
#: 2 (L + 1) h).
DEFAULT_GRID = 1e-3
#: Automatic grid: start coarse, refine until upper / lower <= AUTO_RATIO or the grid reaches AUTO_FINEST.
AUTO_START, AUTO_FINEST, AUTO_RATIO = 4e-3, 5e-4, 1.02
#: DP-SGD's pair has no convolution per level, so its automatic grid may go finer: at small epsilon
#: (sigma 8, n = 1024, delta 1e-6) the bracket at 5e-4 is [0.0100, 0.0155], at 2.5e-4 [0.0111, 0.0138]
#: (docs/accounting.md, the comparison with the random-allocation package).
DPSGD_AUTO_FINEST = 2.5e-4
#: Tail mass below which a law's tail is cut (moved one-sidedly or dropped to an infinity atom).
TAIL_CUT = 1e-30
#: G is kept on mean +- this many standard deviations (beyond: moved or dropped one-sidedly).
G_WIDTH_SD = 12.0
#: Largest grid size (points) of one law; a finer grid or a wider law is refused.
MAX_POINTS = 4_000_000
#: Positive entries below this are dropped one-sidedly (U to +inf, D to -inf, counted in the
#: law's missing mass), so every entry is >= FLOOR and every product of two is a normal number:
#: the relative error model above then holds for every operation (no underflow).
FLOOR = 1e-150
#: Largest relative error bound accepted (the bounds' algebra takes it small; never near in use).
MAX_RHO = 1e-3


def _combine(*rel: float) -> float:
    """An upper bound on prod(1 + r_i) - 1 and on 1 - prod(1 - r_i) for r_i >= 0 (both are at most
    expm1(sum r_i)); the factor covers the few roundings of this evaluation itself."""
    return math.expm1(math.fsum(rel)) * (1.0 + 1e-9)


def _mass_bound(computed: float, rho: float, roundings: int) -> float:
    """An upper bound on the exact mass of entries whose computed sum (``roundings`` roundings per
    term at most) is ``computed``, each entry within relative ``rho`` of its exact value:
    computed / ((1 - gamma)(1 - rho)) <= computed (1 + 2 (gamma + rho)), plus room for this
    product's rounding."""
    return computed * (1.0 + 2.0 * (_gamma(roundings) + rho) + 8.0 * UNIT_ROUNDOFF)


def tree_height(n: int) -> int:
    """L with n = 2^L; balls-in-bins accounting of the tree needs n a power of two."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise MfcliError(f"the number of steps must be a positive integer, got {n!r}")
    n = int(n)
    if n & (n - 1):
        raise MfcliError(
            f"balls-in-bins accounting of the binary tree needs n a power of two (a full tree), got n = {n}"
        )
    return n.bit_length() - 1


@dataclass
class _Law:
    """A sub-probability measure on the grid h Z: mass ``p[k]`` at (lo + k) h, as computed in
    floating point, with its error bound against E, the law that exact (real) arithmetic would
    give from the same discrete choices (grid indices c_d, tail cuts, dropped entries):

    * ``rho``: |p[k] - E[k]| <= rho E[k] for every k (a relative bound, so tail masses far below
      1e-16 are as accurate as the bulk);
    * ``dropped``: an upper bound on E's missing mass 1 - sum E (the mass moved to +inf for U, to
      -inf for D: tails and entries below FLOOR)."""

    lo: int
    p: np.ndarray
    rho: float = 0.0
    dropped: float = 0.0

    @property
    def hi(self) -> int:
        return self.lo + self.p.size - 1


def _floor(x: _Law) -> _Law:
    """Drop the positive entries below FLOOR (to the missing mass: U = +inf or D = -inf, both
    one-sided), so that every product of two entries is a normal number."""
    small = (x.p > 0) & (x.p < FLOOR)
    if not small.any():
        return x
    p = x.p.copy()
    gone = float(np.sum(p[small]))
    p[small] = 0.0
    return _Law(x.lo, p, x.rho, x.dropped + _mass_bound(gone, x.rho, int(small.sum())))


def _phi_index(dmax: int, h: float, up: bool, alpha: float = 0.5) -> np.ndarray:
    """c_d = round(phi(d h) / h) for d = 0..dmax, phi(x) = log(alpha + (1 - alpha) e^-x), rounded up
    or down: log(alpha e^A + (1 - alpha) e^B) = A + phi(A - B) when A >= B (alpha = 1/2: the plain
    average, phi(x) = log((1 + e^-x) / 2)).

    The margin makes float error in phi round away from the truth (outward), never inward: with
    np.exp and np.log1p within 4 ulps (an assumption; glibc's are within 2), x = d h within u x,
    and the weight's ratio and log within a few ulps, |computed phi - phi| <= 16 u (x + 4) (phi's
    slope is below 1, |phi| <= log 3, 1 - alpha >= 1/3), and the division by h adds u |v|; the
    margin is twice that, plus 1e-9 (any larger margin is also valid: outward only)."""
    d = np.arange(dmax + 1, dtype=np.float64)
    x = d * h
    phi = np.log1p((1.0 - alpha) / alpha * np.exp(-x)) + math.log(alpha)
    v = phi / h
    margin = 1e-9 + 2.0 * UNIT_ROUNDOFF * (16.0 * (x + 4.0) / h + np.abs(v))
    out = np.ceil(v + margin) if up else np.floor(v - margin)
    out[0] = 0  # phi(0) = 0 exactly
    return out.astype(np.int64)


def _ndtr_rel(x: np.ndarray, t: np.ndarray, mean: float, sd: float) -> np.ndarray:
    """Relative error bound of ndtr(x) against Phi at the exact point (t - mean) / sd, x that point
    formed in floating point from t (one rounding: (m - 1) h or m h), mean and sd: the NDTR_ULPS
    allowance, plus |x - exact| <= 8 u (|t| + |mean|) / sd (five roundings, the inputs' own
    included) times phi / Phi-tail <= |x| + 2.6 (Mills' ratio; 2.6 covers |x| < 1)."""
    u = UNIT_ROUNDOFF
    return (1.01 * (NDTR_ULPS_0 + NDTR_ULPS_2 * x * x) * u
            + 1.02 * (np.abs(x) + 2.7) * 8.0 * u * (np.abs(t) + abs(mean)) / sd)


def _interval_mass(a: np.ndarray, b: np.ndarray, ra: np.ndarray, rb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P(Z in (a, b]) for standard normal Z, from the nearer tail (a difference of two tails of the
    same side), and a bound on its absolute error given the relative bounds ``ra``, ``rb`` of the
    two ndtr values: |w - exact| <= u w + (ra Ta + rb Tb) (1 + 2 r) (the subtraction's rounding
    and the two values' errors; T / (1 - r) bounds the exact tail)."""
    upper = a > 0
    ta = np.where(upper, special.ndtr(-a), special.ndtr(a))
    tb = np.where(upper, special.ndtr(-b), special.ndtr(b))
    w = np.where(upper, ta - tb, tb - ta)
    r = max(float(np.max(ra, initial=0.0)), float(np.max(rb, initial=0.0)))
    err = UNIT_ROUNDOFF * np.abs(w) + (ra * ta + rb * tb) * (1.0 + 2.0 * r)
    return w, err


def _g_kernel(mean: float, sd: float, h: float, up: bool) -> _Law:
    """The one-step rounding kernel of G ~ N(mean, sd^2): mass of round(x + G) = x + m h for grid x.

    up: P(G in ((m - 1) h, m h]); mass below the kept range is moved to its lowest point, mass
    above it is dropped (stands for +inf). down: P(G in [m h, (m + 1) h)); mass above is moved to
    the top point, mass below is dropped (-inf). Its ``rho`` bounds every mass's relative error
    (ndtr's assumed accuracy, :data:`NDTR_ULPS_0`; the difference of two tails of the same side);
    ``dropped`` the dropped tail.
    """
    lo_v, hi_v = mean - G_WIDTH_SD * sd, mean + G_WIDTH_SD * sd
    m = np.arange(math.floor(lo_v / h) - (0 if up else 1), math.ceil(hi_v / h) + 1)
    # up: the interval ((m - 1) h, m h]; down: [m h, (m + 1) h)
    t_lo, t_hi = ((m - 1) * h, m * h) if up else (m * h, (m + 1) * h)
    a, b = (t_lo - mean) / sd, (t_hi - mean) / sd
    ra, rb = _ndtr_rel(a, t_lo, mean, sd), _ndtr_rel(b, t_hi, mean, sd)
    w, err = _interval_mass(a, b, ra, rb)
    if up:
        w[0] = special.ndtr(b[0])  # everything at or below the first point is moved up to it
        err[0] = w[0] * rb[0] * (1.0 + 2.0 * rb[0])
        tail, r_tail = float(special.ndtr(-b[-1])), float(rb[-1])  # the upper tail beyond m[-1] is dropped
    else:
        w[-1] = special.ndtr(-a[-1])  # everything above is moved down to it
        err[-1] = w[-1] * ra[-1] * (1.0 + 2.0 * ra[-1])
        tail, r_tail = float(special.ndtr(a[0])), float(ra[0])  # the lower tail below m[0] is dropped
    if not np.all(w > 2.0 * err):
        raise MfcliError(f"the grid {h:g} is too fine for sigma = {1.0 / sd:g}: the noise kernel's masses lose "
                         "their relative accuracy; use a coarser grid")
    rho = float(np.max(err / (w - err))) * (1.0 + 1e-9)  # exact >= w - err
    return _floor(_Law(int(m[0]), w, rho, tail * (1.0 + 2.0 * r_tail + 8.0 * UNIT_ROUNDOFF)))


def _add_up(*x: float) -> float:
    """An upper bound on the exact sum of non-negative floats (fsum is correctly rounded)."""
    return math.fsum(x) * (1.0 + 4.0 * UNIT_ROUNDOFF)


def _runs(c: np.ndarray, d_start: int) -> list[tuple[int, int]]:
    """The runs [d1, d2) of equal c_d, cut to d >= d_start."""
    change = np.flatnonzero(np.diff(c)) + 1
    starts = np.concatenate(([0], change)).tolist()
    ends = np.concatenate((change, [c.size])).tolist()
    return [(max(s, d_start), e) for s, e in zip(starts, ends, strict=True) if max(s, d_start) < e]


def _window_table(py: np.ndarray, pad: int, levels: int) -> list[np.ndarray]:
    """T[k][pad + j] = py[j - 2^k + 1] + ... + py[j] (indices below 0 count 0), for k < levels: a
    balanced sum of 2^k terms, so at most k roundings on any term's way."""
    table = [np.concatenate((np.zeros(pad), py))]
    for k in range(1, levels):
        prev, s = table[-1], 1 << (k - 1)
        cur = prev.copy()
        cur[s:] += prev[:-s]
        table.append(cur)
    return table


def _window(table: list[np.ndarray], pad: int, ell: int, count: int) -> np.ndarray:
    """py[j - ell + 1] + ... + py[j] for j = 0..count-1, as the sum of one table entry per binary
    digit of ell, largest first (at most 2 (levels - 1) roundings on any term's way)."""
    pieces = []
    off = 0
    for k in reversed(range(ell.bit_length())):
        if ell >> k & 1:
            pieces.append(table[k][pad - off:pad - off + count])
            off += 1 << k
    if len(pieces) == 1:
        return pieces[0]
    w = pieces[0] + pieces[1]
    for piece in pieces[2:]:
        w += piece
    return w


def _blocked_prefix(py: np.ndarray) -> tuple[np.ndarray, int]:
    """The inclusive prefix sums py[0] + ... + py[j] and the most roundings on a term's way:
    sequential sums within blocks of about sqrt(size) and over the block totals (b + nb, not the
    size of a plain cumsum)."""
    n = py.size
    b = max(1, math.isqrt(n))
    nb = -(-n // b)
    x = np.zeros(nb * b)
    x[:n] = py
    within = np.cumsum(x.reshape(nb, b), axis=1)
    carry = np.concatenate(([0.0], np.cumsum(within[:-1, -1])))
    return (within + carry[:, None]).ravel()[:n], b + nb


def _add_max_part(out: np.ndarray, px: np.ndarray, py: np.ndarray, c: np.ndarray, d_start: int,
                  shift_min: int) -> tuple[int, int]:
    """Add to ``out`` the mass of {X at grid index i is the max, Y at i - d, d >= d_start}, placed at
    index i + c_d (entry k - shift_min holds index k). c_d is constant on runs of d, so each run is
    one shifted product of X's law with a window sum of Y's.

    The window sums are sums of non-negative terms, never differences (a difference of prefix
    sums has an absolute error of the prefix's size, so a tail window 1e-20 would come out as
    rounding noise): windows inside the grid from a doubling table (:func:`_window_table`),
    windows reaching the grid's start from blocked prefix sums. Returns (runs, roundings): every
    entry added is X's mass times a window with at most ``roundings`` roundings on any term's
    way, and every entry of ``out`` receives at most one term per run."""
    size = px.size
    runs = _runs(c, d_start)
    longest = max((d2 - d1 for d1, d2 in runs if d2 < size), default=1)
    levels = longest.bit_length()
    table = _window_table(py, longest - 1, levels)
    prefix, prefix_roundings = _blocked_prefix(py)
    for d1, d2 in runs:
        count = size - d1
        # for i = d1..size-1: the window sum of py over j in [max(i - d2 + 1, 0), i - d1]
        w = prefix[:count] if d2 >= size else _window(table, longest - 1, d2 - d1, count)
        k0 = int(c[d1]) - shift_min + d1
        out[k0:k0 + count] += px[d1:] * w
    return len(runs), max(2 * levels, prefix_roundings) + 1


def _pair(a: _Law, b: _Law, h: float, up: bool, alpha: float = 0.5) -> _Law:
    """Law of round(log(alpha e^A + (1 - alpha) e^B)) for independent A ~ a, B ~ b on the grid.

    log(alpha e^x + (1 - alpha) e^y) = max(x, y) + phi(|x - y|) with phi's weight alpha when x is
    the max, 1 - alpha when y is; with both on the grid, the index is max(i, j) + c_{|i - j|}
    (:func:`_phi_index`, rounded up or down). Ties (d = 0, phi = 0) are counted once, with A.

    Error: every output entry is a sum, over at most one term per run, of a mass of one law times
    a window sum of the other's (non-negative terms throughout), so its relative error is at most
    (1 + rho_a)(1 + rho_b)(1 + gamma_k) - 1, k the roundings on a term's way (window, product,
    accumulation); the exact missing mass is 1 - (1 - m_a)(1 - m_b) <= m_a + m_b.
    """
    lo = min(a.lo, b.lo)
    hi = max(a.hi, b.hi)
    size = hi - lo + 1
    pa = np.zeros(size)
    pb = np.zeros(size)
    pa[a.lo - lo:a.lo - lo + a.p.size] = a.p
    pb[b.lo - lo:b.lo - lo + b.p.size] = b.p
    c_a = _phi_index(size - 1, h, up, alpha)
    c_b = c_a if alpha == 0.5 else _phi_index(size - 1, h, up, 1.0 - alpha)
    shift_min = int(min(c_a.min(), c_b.min()))
    out = np.zeros(size - shift_min)  # entry k - shift_min holds index k
    runs_a, k_a = _add_max_part(out, pa, pb, c_a, 0, shift_min)  # A the max (ties here)
    runs_b, k_b = _add_max_part(out, pb, pa, c_b, 1, shift_min)  # B strictly the max
    rho = _combine(a.rho, b.rho, _gamma(max(k_a, k_b) + runs_a + runs_b))
    return _floor(_Law(lo + shift_min, out, rho, _add_up(a.dropped, b.dropped)))


def _mix(a: _Law, wa: float, b: _Law, wb: float) -> _Law:
    """The law wa a + wb b (non-negative weights, each within one rounding of the exact weight:
    with the product and the sum, three roundings per term; the missing mass is at most the
    larger of the two, the weights summing to 1)."""
    lo = min(a.lo, b.lo)
    out = np.zeros(max(a.hi, b.hi) - lo + 1)
    out[a.lo - lo:a.lo - lo + a.p.size] += wa * a.p
    out[b.lo - lo:b.lo - lo + b.p.size] += wb * b.p
    return _Law(lo, out, _combine(max(a.rho, b.rho), _gamma(3)), max(a.dropped, b.dropped))


def _convolve(a: _Law, k: _Law) -> _Law:
    """Law of A + K on the grid (direct convolution: each output a sum of at most min(sizes)
    products of non-negative terms, in whatever order numpy's dot takes them, so its relative
    error is at most gamma_{min(sizes)}; an FFT's error would be absolute, not relative)."""
    if a.p.size * k.p.size > 2e9:
        raise MfcliError(f"the likelihood-ratio law needs a {a.p.size} x {k.p.size}-point convolution at this grid "
                         "and sigma; use a coarser grid")
    rho = _combine(a.rho, k.rho, _gamma(min(a.p.size, k.p.size) + 1))
    return _Law(a.lo + k.lo, np.convolve(a.p, k.p), rho, _add_up(a.dropped, k.dropped))


def _trim(x: _Law, up: bool, tail: float) -> _Law:
    """Cut tails of mass < tail one-sidedly: up-laws move the low tail up and drop the high tail;
    down-laws move the high tail down and drop the low tail; then :func:`_floor`. The moved
    tail's sum (sequential, lo_k terms) adds gamma_{lo_k + 1} to the relative error of the entry
    it lands on; the dropped tail's exact mass is bounded by :func:`_mass_bound`."""
    p = x.p
    if not (p > 0).any():
        return _Law(x.lo, np.zeros(1), x.rho, x.dropped)
    c = np.cumsum(p)
    lo_k = int(np.searchsorted(c, tail, side="right"))  # first index where cumulative >= tail
    rc = np.cumsum(p[::-1])
    hi_k = p.size - 1 - int(np.searchsorted(rc, tail, side="right"))
    lo_k = min(lo_k, p.size - 1)
    hi_k = max(hi_k, lo_k)
    q = p[lo_k:hi_k + 1].copy()
    rho, dropped = x.rho, x.dropped
    if up:
        if lo_k > 0:
            q[0] += c[lo_k - 1]  # low tail moved up
            rho = _combine(rho, _gamma(lo_k + 1))
        if hi_k < p.size - 1:  # high tail dropped (+inf)
            dropped = _add_up(dropped, _mass_bound(float(rc[p.size - 2 - hi_k]), x.rho, p.size - 1 - hi_k))
    else:
        if hi_k < p.size - 1:
            q[-1] += rc[p.size - 2 - hi_k]  # high tail moved down
            rho = _combine(rho, _gamma(p.size - hi_k + 1))
        if lo_k > 0:  # low tail dropped (-inf)
            dropped = _add_up(dropped, _mass_bound(float(c[lo_k - 1]), x.rho, lo_k))
    return _floor(_Law(x.lo + lo_k, q, rho, dropped))


@dataclass(frozen=True)
class _RootLaws:
    p_up: _Law
    q_up: _Law
    p_down: _Law
    q_down: _Law


def _root_laws(height: int, sigma: float, h: float, on_progress: ProgressCallback | None = None) -> _RootLaws:
    """The four grid laws of the root's log-ratio (U and D, under P and Q); ``on_progress``
    receives the tree levels propagated (two passes: rounded up and down). DP-SGD's pair (no
    noisy output at the internal nodes) is :func:`_allocation_laws`."""
    sd = 1.0 / sigma
    m = 0.5 / sigma**2
    laws = {}
    tick = Ticker(on_progress, f"balls-in-bins tree (grid {h:.3g})", 2 * height, unit="levels")
    for up in (True, False):
        kq = _g_kernel(-m, sd, h, up)
        kp = _g_kernel(m, sd, h, up)
        q = _trim(kq, up, TAIL_CUT)
        p = _trim(kp, up, TAIL_CUT)
        for level in range(height):
            tick((0 if up else height) + level)
            if max(p.p.size, q.p.size) * 2 > MAX_POINTS:
                raise MfcliError(f"the grid {h:g} needs more than {MAX_POINTS} points; use a coarser grid")
            pq = _pair(p, q, h, up)
            qq = _pair(q, q, h, up)
            p = _trim(_convolve(pq, kp), up, TAIL_CUT)
            q = _trim(_convolve(qq, kq), up, TAIL_CUT)
        laws[up] = (p, q)
    tick.finish()
    return _RootLaws(p_up=laws[True][0], q_up=laws[True][1], p_down=laws[False][0], q_down=laws[False][1])


def _allocation_laws(n: int, sigma: float, h: float, on_progress: ProgressCallback | None = None) -> _RootLaws:
    """The four grid laws of log R, R = (1/n) sum_i w_i the likelihood ratio of DP-SGD's
    balls-in-bins pair at any n (U and D, under P and Q).

    R over m steps is split into its first ceil(m/2) and last floor(m/2) steps, R = alpha R_l +
    (1 - alpha) R_r with alpha = ceil(m/2) / m, the halves independent under Q. Under P the example
    is in the left half with probability alpha (there R_l has its P-law, R_r its Q-law) and in the
    right one otherwise, so the P-law is the alpha-mixture of the two pairs; for equal halves the
    two pairs have the same law (exchange the halves) and one is computed. Every size occurs at
    most twice per level (m -> ceil, floor), so a level costs at most four pairs; n = 2^L gives
    the balanced tree of pairwise averages, level by level, as before."""
    sd = 1.0 / sigma
    m0 = 0.5 / sigma**2
    sizes: set[int] = set()
    todo = [n]
    while todo:
        m = todo.pop()
        if m > 1 and m not in sizes:
            sizes.add(m)
            todo.extend(((m + 1) // 2, m // 2))
    tick = Ticker(on_progress, f"balls-in-bins DP-SGD (grid {h:.3g})", 2 * len(sizes), unit="levels")
    laws = {}
    done = 0
    for up in (True, False):
        memo: dict[int, tuple[_Law, _Law]] = {
            1: (_trim(_g_kernel(m0, sd, h, up), up, TAIL_CUT), _trim(_g_kernel(-m0, sd, h, up), up, TAIL_CUT))}
        for m in sorted(sizes):
            tick(done)
            done += 1
            ml, mr = (m + 1) // 2, m // 2
            (pl, ql), (pr, qr) = memo[ml], memo[mr]
            if max(pl.p.size, ql.p.size, pr.p.size, qr.p.size) * 2 > MAX_POINTS:
                raise MfcliError(f"the grid {h:g} needs more than {MAX_POINTS} points; use a coarser grid")
            alpha = ml / m
            q = _trim(_pair(ql, qr, h, up, alpha), up, TAIL_CUT)
            if ml == mr:
                p = _trim(_pair(pl, qr, h, up), up, TAIL_CUT)
            else:
                p = _trim(_mix(_pair(pl, qr, h, up, alpha), alpha, _pair(ql, pr, h, up, alpha), mr / m),
                          up, TAIL_CUT)
            memo[m] = (p, q)
        laws[up] = memo[n]
    tick.finish()
    return _RootLaws(p_up=laws[True][0], q_up=laws[True][1], p_down=laws[False][0], q_down=laws[False][1])


def _as_dict(law: _Law, sign: int) -> dict[int, float]:
    """The law as rounded losses {sign x grid index: mass}, from its lowest to its highest point of
    positive mass (zeros between them kept: pld_ops' PMFs are contiguous, and so dp-accounting's
    equal pld_ops' from this dictionary, :func:`pld_ops.from_rounded_probability`), keys ascending.
    A law without mass is one point of mass 0 (its PMF then has only the infinity mass)."""
    keep = np.flatnonzero(law.p > 0)
    if keep.size == 0:
        return {int(sign * law.lo): 0.0}
    idx = range(int(keep[0]), int(keep[-1]) + 1)
    return {int(sign * (law.lo + k)): float(law.p[k]) for k in (idx if sign > 0 else reversed(idx))}


def _check_rho(law: _Law) -> float:
    if not law.rho <= MAX_RHO:
        raise MfcliError(f"the floating-point error bound of a balls-in-bins law ({law.rho:.3g}) is too large "
                         "for a certified bracket; use fewer steps or a coarser grid")
    return law.rho


def _scaled(law: _Law, up: bool) -> _Law:
    """The law's masses scaled so that each is >= (``up``) or <= its exact value E[k]:
    |p - E| <= rho E, so E <= p / ((1 - rho)(1 - u)) <= p (1 + 2 (rho + u)) and
    E >= p / ((1 + rho)(1 + u)) >= p (1 - rho - 2.5 u), the product's own rounding included (the
    factor's rounding is at most u above 1 and u / 2 below)."""
    rho = _check_rho(law)
    u = UNIT_ROUNDOFF
    factor = 1.0 + 2.0 * (rho + 2.0 * u) if up else 1.0 - (rho + 3.0 * u)
    return _Law(law.lo, law.p * factor, 0.0, law.dropped)


def _plds(laws: _RootLaws, h: float) -> tuple[pld_ops.Pld, pld_ops.Pld]:
    """(pessimistic, optimistic) PLDs of one epoch (dp-accounting's
    ``create_from_rounded_probability``, bit for bit, without importing it).

    Floating point: the pessimistic PLD's masses are each at least the exact law's (scaled up by
    the law's relative bound) and its infinity mass at least the exact missing mass (``dropped``);
    the optimistic PLD's masses are each at most the exact law's, its infinity mass 0. Every
    hockey-stick divergence is a non-negative combination of the masses, so the first is >= and
    the second <= the exact laws' divergences, which bracket the pair's; no slack on delta."""
    p_up, q_down = _scaled(laws.p_up, True), _scaled(laws.q_down, True)
    upper = pld_ops.from_rounded_probability(
        _as_dict(p_up, +1), p_up.dropped, h, pessimistic_estimate=True,
        rounded_probability_mass_function_add=_as_dict(q_down, -1),
        infinity_mass_add=q_down.dropped, symmetric=False,
    )
    # optimistic: missing mass stands for loss -inf (contributes nothing)
    lower = pld_ops.from_rounded_probability(
        _as_dict(_scaled(laws.p_down, False), +1), 0.0, h, pessimistic_estimate=False,
        rounded_probability_mass_function_add=_as_dict(_scaled(laws.q_up, False), -1), infinity_mass_add=0.0,
        symmetric=False,
    )
    return upper, lower


@dataclass(frozen=True)
class _Bracket:
    """An epsilon bracket of a balls-in-bins pair at ``delta``: ``epsilon`` the guarantee (upper
    end), ``lower`` never above the pair's true epsilon; ``steps`` n per epoch, ``epochs``
    composed (fresh allocation per epoch), ``grid`` the grid h of the log-likelihood ratio."""

    epsilon: float
    lower: float
    delta: float
    sigma: float
    steps: int
    epochs: int
    grid: float

    @property
    def ratio(self) -> float:
        """upper / lower (inf when the lower end is 0)."""
        return self.epsilon / self.lower if self.lower > 0 else math.inf

    def _row(self, setting: str, *, method: str, assumptions: str) -> dict:
        """The JSON row of the bracket: the fields above, the setting's method and assumptions."""
        return {
            "setting": setting,
            "batching": "balls-in-bins",
            "epsilon": self.epsilon,
            "bracket": [self.lower, self.epsilon],
            "lower_bound": self.lower,
            "delta": self.delta,
            "sigma": self.sigma,
            "steps": self.steps,
            "epochs": self.epochs,
            "grid": self.grid,
            "method": method,
            "assumptions": assumptions,
        }


@dataclass(frozen=True)
class BallsInBinsTreeResult(_Bracket):
    """Binary tree under balls-in-bins batching (fields: :class:`_Bracket`; ``sigma`` the noise
    standard deviation per node, in units of the tree's 0/1 entries)."""

    def as_dict(self) -> dict:
        return self._row(
            "balls-in-bins-tree",
            method="exact recursive law of the tree's log-likelihood ratio on a grid, rounded up (guarantee) and "
                   "down (lower bound) at every level; epochs composed with dp-accounting's PLD "
                   "arithmetic, both ends' round-off certified (pld_certify: the upper end's delta bounded from "
                   "above, the lower end's from below)",
            assumptions="balls-in-bins batching: every example in exactly one uniformly random step of each epoch, "
                        "independently of the others and of the previous epochs; binary tree on n = 2^L leaves, "
                        "restarted every epoch; an example's contribution is the same vector (norm <= 1, clip "
                        "norm units) whichever step it lands in, fixed in advance (non-adaptive; "
                        "docs/accounting.md says why the adaptive case is not claimed); add or remove one example",
        )


def _check_epochs(epochs: int) -> int:
    return positive_int(epochs, "the number of epochs")


def _epoch_plds(laws: Callable[..., Any], size: int, *, sigma: float, epochs: int, grid: float,
                on_progress: ProgressCallback | None, record: bool = False) -> tuple[Any, Any]:
    """(pessimistic, optimistic) PLDs of one epoch's ``laws(size, sigma, h, on_progress)`` on the
    grid h, composed over ``epochs`` independent epochs (a fresh allocation each), after checking
    sigma, epochs and the grid. ``record``: the pessimistic one as a
    :class:`mfcli.accounting.pld_certify.Node` (the epoch's PLD a leaf, self-composed with the same
    arithmetic), for the certificate of the composition's round-off, and the optimistic one
    likewise (:func:`mfcli.accounting.pld_certify.certify_lower` redoes it for a proven lower
    end)."""
    sigma = check_sigma(sigma)
    epochs = _check_epochs(epochs)
    h = _check_grid(grid)
    upper, lower = _plds(laws(size, sigma, h, on_progress), h)
    if not record:
        return _compose_epochs(upper, lower, epochs)
    node, low = pld_certify.leaf(upper), pld_certify.leaf(lower)
    if epochs > 1:
        node, low = pld_certify.self_compose(node, epochs), pld_certify.self_compose(low, epochs)
    return node, low


def _compose_epochs(upper: pld_ops.Pld, lower: pld_ops.Pld, epochs: int) -> tuple[pld_ops.Pld, pld_ops.Pld]:
    """One epoch's (pessimistic, optimistic) PLDs self-composed ``epochs`` times, as
    dp-accounting's ``self_compose`` composes them (pld_ops cuts a composition's tails on each
    PMF's own side, as dp-accounting does)."""
    if epochs == 1:
        return upper, lower
    return upper.self_compose(epochs), lower.self_compose(epochs)


def _check_grid(grid: float) -> float:
    return positive_number(grid, "the grid", upper=0.1, upper_closed=True)


def tree_plds(*, n: int, sigma: float, epochs: int = 1, grid: float = DEFAULT_GRID,
              on_progress: ProgressCallback | None = None) -> tuple[pld_ops.Pld, pld_ops.Pld]:
    """(pessimistic, optimistic) PLDs of ``epochs`` epochs of the tree under balls-in-bins: every
    hockey-stick divergence of the pessimistic one is >= the pair's, of the optimistic one <=
    (one epoch: floating-point error included, each mass on its side of the exact law's; several:
    up to the composition's own floating-point error, pld_ops' FFT).

    They are :class:`mfcli.accounting.pld_ops.Pld` objects, equal bit for bit to the
    dp-accounting ``PrivacyLossDistribution`` objects built from the same rounded laws and
    composed over the epochs; ``get_epsilon_for_delta``, ``self_compose`` and ``compose`` are
    dp-accounting's (pld_ops cuts a composition's 1e-15 tails on each PMF's own side, as it does);
    ``.to_dp_accounting()`` gives dp-accounting's object for the rest of its API
    (``get_delta_for_epsilon``, ...)."""
    return _epoch_plds(_root_laws, tree_height(n), sigma=sigma, epochs=epochs, grid=grid, on_progress=on_progress)


def tree_balls_in_bins(
    *, n: int, sigma: float, delta: float = DEFAULT_DELTA, epochs: int = 1, grid: float | None = None,
    on_progress: ProgressCallback | None = None,
) -> BallsInBinsTreeResult:
    """Epsilon bracket of the binary tree on n = 2^L leaves under balls-in-bins batching.

    ``grid=None`` chooses the grid: from AUTO_START, refined until upper / lower <= AUTO_RATIO
    (or AUTO_FINEST is reached); the cost grows as 1/grid^2.

    Formal guarantees: ``epsilon`` is a valid (epsilon, delta) bound for the pair
    P = (1/n) sum_i N(C e_i, sigma^2 I) vs Q = N(0, sigma^2 I) in both directions, composed over
    ``epochs`` independent epochs; ``lower`` is at most the pair's true epsilon. Both hold at
    every grid; the grid only decides how far apart they are. ``on_progress`` receives the
    levels propagated at each grid tried (:mod:`mfcli.util.progress`; the number of grids is not
    known in advance).
    """
    delta = check_delta(delta)
    epochs = _check_epochs(epochs)
    eps_u, eps_l, h = _refined_bracket(
        lambda h: _epoch_plds(_root_laws, tree_height(n), sigma=sigma, epochs=epochs, grid=h,
                              on_progress=on_progress, record=True), delta, grid)
    return BallsInBinsTreeResult(epsilon=eps_u, lower=eps_l, delta=delta, sigma=float(sigma), steps=int(n),
                                 epochs=epochs, grid=h)


def _refined_bracket(plds_at: Callable[[float], tuple[Any, Any]], delta: float,
                     grid: float | None, finest: float = AUTO_FINEST) -> tuple[float, float, float]:
    """(upper epsilon, lower epsilon, grid) from the (pessimistic, optimistic) PLDs ``plds_at(h)``:
    at ``grid``, or (None) from AUTO_START refined until upper / lower <= AUTO_RATIO, ``finest``
    is reached or the upper end is not finite. Each end is pld_ops' epsilon, then certified
    against the PLDs by :func:`_hockey_bound` (moved outward where the check needs it); PLDs given
    as recorded compositions (:class:`mfcli.accounting.pld_certify.Node`, several epochs) are
    certified by :func:`mfcli.accounting.pld_certify.certify` (pessimistic) and
    :func:`mfcli.accounting.pld_certify.certify_lower` (optimistic, from the run's value capped at
    the upper end) instead: each proven for the exact composition of the epoch's PLD, the FFT's
    round-off counted."""
    h = AUTO_START if grid is None else grid
    while True:
        upper, lower = plds_at(h)
        node = upper if isinstance(upper, pld_certify.Node) else None
        if node is not None:
            upper = node.pld
        low_node = lower if isinstance(lower, pld_certify.Node) else None
        if low_node is not None:
            lower = low_node.pld
        run_u = max(float(upper.get_epsilon_for_delta(delta)), 0.0)
        if node is not None and node.kind != "leaf":
            eps_u = pld_certify.certify(node, run_u, delta)
        else:
            eps_u = _certified_upper(upper, run_u, delta)
        start = max(min(float(lower.get_epsilon_for_delta(delta)), eps_u), 0.0)
        if low_node is not None and low_node.kind != "leaf":
            eps_l = pld_certify.certify_lower(low_node, start, delta)
        else:
            eps_l = _certified_lower(lower, start, delta)
        ratio = eps_u / eps_l if eps_l > 0 else math.inf
        if grid is not None or ratio <= AUTO_RATIO or h <= finest or not math.isfinite(eps_u):
            return eps_u, eps_l, float(h)
        # the bracket's width is about proportional to the grid
        h = max(finest, h * max(0.1, 0.9 * (AUTO_RATIO - 1) / (ratio - 1)))


def _hockey_bound(pmf: pld_ops.Pmf, eps: float, above: bool) -> float:
    """A bound, from above (``above``) or below, on the hockey-stick divergence that the PMF
    states exactly: infinity mass + sum_k p_k (1 - e^(eps - l_k))_+ with l_k = (lower_loss + k) d
    the exact products and p_k the stored masses.

    pld_ops' epsilon search (dp-accounting's loop) runs in floating point with losses as a
    running sum, so its answer is checked here with every rounding accounted for: l_k = k d is
    within u |l_k| and x = eps - l_k within u (|l_k| + |x|) of the exact values, so the exact x lies
    in x +- 2 u (|l_k| + |x|); (1 - e^x)_+ is decreasing, evaluated at that interval's end with
    np.expm1 (assumed within 4 ulps: the factor 1 +- 8 u); products and the sum (any order) of
    non-negative terms within gamma_{N + 2}; the last addition within u."""
    u = UNIT_ROUNDOFF
    p = pmf.probs
    losses = np.arange(pmf.lower_loss, pmf.lower_loss + p.size, dtype=np.float64) * pmf.discretization
    x = eps - losses
    err = 2.0 * u * (np.abs(losses) + np.abs(x))
    f = -np.expm1(np.minimum(x - err if above else x + err, 0.0)) * ((1.0 + 8.0 * u) if above else (1.0 - 8.0 * u))
    g = _gamma(p.size + 2)
    total = float(np.sum(p * f)) * ((1.0 + g) if above else (1.0 - g))
    return (total + pmf.infinity_mass) * ((1.0 + 2.0 * u) if above else (1.0 - 2.0 * u))


def _pld_hockey_bound(pld: pld_ops.Pld, eps: float, above: bool) -> float:
    """:func:`_hockey_bound` of the PLD's delta(eps): the larger of its two directions'."""
    return max(_hockey_bound(pld.remove, eps, above), _hockey_bound(pld.add_pmf, eps, above))


def _certified_upper(upper: pld_ops.Pld, eps: float, delta: float) -> float:
    """The smallest eps' >= eps on a doubling ladder (steps from 1e-13 relative) at which the
    pessimistic PLD's delta, bounded from above in both directions, is <= delta (inf if none)."""
    if not math.isfinite(eps):
        return eps
    step = 1e-13 * max(1.0, eps)
    for _ in range(64):
        if _pld_hockey_bound(upper, eps, True) <= delta:
            return eps
        eps += step
        step *= 2.0
    return math.inf


def _certified_lower(lower: pld_ops.Pld, eps: float, delta: float) -> float:
    """The largest eps' <= eps on a doubling ladder at which the optimistic PLD's delta, bounded
    from below in one direction, is > delta (so the pair's epsilon is >= eps'), or 0."""
    step = 1e-13 * max(1.0, eps)
    while eps > 0:
        if _pld_hockey_bound(lower, eps, False) > delta:
            return eps
        eps -= step
        step *= 2.0
    return 0.0


def tree_delta_bracket(*, n: int, sigma: float, epsilon: float, epochs: int = 1,
                       grid: float = DEFAULT_GRID) -> tuple[float, float]:
    """[lower, upper] on the pair's delta(epsilon) (max over the two directions) over ``epochs``
    epochs. One epoch: the PLDs' hockey-stick divergences bounded with their floating-point error
    (:func:`_hockey_bound`). Several: the epochs' composition redone with its round-off certified,
    the upper end by :func:`mfcli.accounting.pld_certify.delta_bound` of the pessimistic
    composition, the lower by :func:`mfcli.accounting.pld_certify.lower_delta_bound` of the
    optimistic one (the composed PLDs themselves carry pld_ops' 1e-15 tail charge and FFT
    round-off, so their own divergence is no lower bound: at n 4, sigma 2, 3 epochs, eps 11 it was
    1.3e-15 where the exact composition's is 2e-18)."""
    upper, lower = _epoch_plds(_root_laws, tree_height(n), sigma=sigma, epochs=epochs, grid=grid,
                               on_progress=None, record=True)
    eps = float(epsilon)
    if upper.kind == "leaf":
        return max(0.0, _pld_hockey_bound(lower.pld, eps, False)), _pld_hockey_bound(upper.pld, eps, True)
    return max(0.0, pld_certify.lower_delta_bound(lower, eps)), pld_certify.delta_bound(upper, eps)


@dataclass(frozen=True)
class BallsInBinsDpSgdResult(_Bracket):
    """DP-SGD (C = I) under balls-in-bins batching: guarantee and lower end of its bracket
    (fields: :class:`_Bracket`; ``sigma`` the noise multiplier)."""

    def as_dict(self) -> dict:
        return self._row(
            "balls-in-bins-dp-sgd",
            method="exact law of the log-likelihood ratio log((1/n) sum_i exp(y_i / sigma^2 - 1 / (2 sigma^2))) of "
                   "the pair (1/n) sum_i N(e_i, sigma^2 I) vs N(0, sigma^2 I), by pairwise averaging on a grid "
                   "rounded up (guarantee) and down (lower bound); epochs composed with dp-accounting's PLD "
                   "arithmetic, both ends' round-off certified (pld_certify: the upper end's delta bounded from "
                   "above, the lower end's from below)",
            assumptions="DP-SGD (C = I) with balls-in-bins batching: every example in exactly one uniformly random "
                        "step of each epoch, independently of the others; an example's contribution "
                        "is the same vector (norm <= 1) whichever step it lands in, fixed in advance (non-adaptive); "
                        "add or remove one example",
        )


def _check_steps(n: int) -> int:
    return positive_int(n, "the number of steps")


def dpsgd_plds(*, n: int, sigma: float, epochs: int = 1, grid: float = DEFAULT_GRID,
               on_progress: ProgressCallback | None = None) -> tuple[pld_ops.Pld, pld_ops.Pld]:
    """(pessimistic, optimistic) PLDs of ``epochs`` epochs of DP-SGD's balls-in-bins pair (see
    :func:`dpsgd_balls_in_bins`): :class:`mfcli.accounting.pld_ops.Pld` objects, as
    :func:`tree_plds` returns."""
    return _epoch_plds(_allocation_laws, _check_steps(n), sigma=sigma, epochs=epochs, grid=grid,
                       on_progress=on_progress)


def dpsgd_balls_in_bins(
    *, n: int, sigma: float, delta: float = DEFAULT_DELTA, epochs: int = 1, grid: float | None = None,
    on_progress: ProgressCallback | None = None,
) -> BallsInBinsDpSgdResult:
    """Epsilon bracket of DP-SGD (noise multiplier sigma, any n steps) under balls-in-bins batching.

    The pair P = (1/n) sum_i N(e_i, sigma^2 I) vs Q = N(0, sigma^2 I) (random allocation of one
    Gaussian step among n; Feldman and Shenfeld, arXiv 2502.08202, whose exact PLD this computes on
    a grid). Its likelihood ratio is the average of the n leaf ratios w_i, computed as a tree of
    weighted pairwise averages (halves of ceil(m/2) and floor(m/2) steps, :func:`_allocation_laws`):
    the recursion of :func:`tree_balls_in_bins` without noise at the internal nodes, with the same
    one-sided rounding, so the same proof gives: ``epsilon`` is a valid bound for the pair in both
    directions (the example's contribution fixed in advance, docs/accounting.md), ``lower`` at most
    its true epsilon. ``grid=None`` refines as the tree does, down to DPSGD_AUTO_FINEST.

    Raises:
        MfcliError: a parameter out of range.
    """
    delta = check_delta(delta)
    epochs = _check_epochs(epochs)
    _check_steps(n)
    eps_u, eps_l, h = _refined_bracket(
        lambda h: _epoch_plds(_allocation_laws, n, sigma=sigma, epochs=epochs, grid=h, on_progress=on_progress,
                              record=True), delta, grid, finest=DPSGD_AUTO_FINEST)
    return BallsInBinsDpSgdResult(epsilon=eps_u, lower=eps_l, delta=delta, sigma=float(sigma), steps=int(n),
                                  epochs=epochs, grid=h)


__all__ = [
    "DEFAULT_GRID",
    "BallsInBinsDpSgdResult",
    "BallsInBinsTreeResult",
    "dpsgd_balls_in_bins",
    "dpsgd_plds",
    "tree_balls_in_bins",
    "tree_delta_bracket",
    "tree_height",
    "tree_plds",
]
