"""Two operations on dp-accounting's dense privacy loss distributions, with dp-accounting's own
results bit for bit, at a fraction of the cost: the self-composition of a PLD and its epsilon at a
given delta. MMCC and every DP-SGD row call them on PMFs of 10^4-10^5 points, where dp-accounting
spends most of the time in Python-level scans, not in arithmetic.

* :func:`self_compose` -- ``PrivacyLossDistribution.self_compose``. dp-accounting's
  ``DensePLDPmf.self_compose`` cuts the n-fold convolution to a window from Chernoff bounds on 40
  orders lambda, each a scalar ``scipy.special.logsumexp`` over the whole PMF (0.2-0.4 s of the
  headline ``mfcli account`` for its two 2 x 10^5-point PMFs). Only the two integer window ends
  reach the result (and through them the FFT length): here the 40 log-mgfs are sums against
  successive powers of e^(+-k / L) (two array passes each), each order's bound is formed from them,
  and recomputed with dp-accounting's own ``logsumexp`` whenever it lies within a proven error
  margin of an integer (where ceil/floor could differ). The FFT convolution and the infinity mass
  are the same calls as dp-accounting's.
* :func:`epsilon_for_delta` -- ``PrivacyLossDistribution.get_epsilon_for_delta``. dp-accounting scans
  the losses from the top in a Python loop (``pld_pmf._get_epsilon_for_delta``) until
  log((mass_upper - delta) / mass_lower) reaches the loss. Here the scan runs over blocks of
  losses as arrays: the running masses are cumulative sums (sequential, so equal to the loop's
  additions), each loss is the loop's own running sum of -d, the exp of every loss is ``math.exp``
  (the loop's function, numpy's SIMD exp may differ in the last bit), and the stopping test is
  decided with ``np.log`` where it is clear by a margin and with ``math.log`` (the loop's) where it
  is not.

Anything other than a dense PMF (a sparse one, an identity PLD) goes to dp-accounting itself.
tests/test_accounting_pld_ops.py compares both functions with dp-accounting's, bit for bit, over a
table of PLDs (Poisson-sampled Gaussians, mixtures, composed ones) and deltas.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Unit roundoff of float64.
_U = 2.0 ** -53

#: Losses below this end :func:`epsilon_for_delta`'s scan with epsilon 0 (``math.exp(-l)``
#: overflows a float below -709.78; any loss <= 0 would do, see ``_pmf_epsilon``).
_EXP_OVERFLOW_LOSS = -709.0

#: First block of losses scanned by :func:`epsilon_for_delta` (then 4x larger each time).
_FIRST_BLOCK = 2048


def _is_dense(pmf: Any) -> bool:
    from dp_accounting.pld import pld_pmf

    return type(pmf) is pld_pmf.DensePLDPmf


# ---------------------------------------------------------------------------------------------
# Self-composition


def _chernoff_window(probs: np.ndarray, num_times: int, tail_mass_truncation: float) -> tuple[int, int]:
    """dp-accounting's ``common.compute_self_convolve_bounds(probs, num_times, tail)`` (its default
    orders t = j / L, j = -20..-1, 1..20, L = len(probs)), with the log-mgfs computed by numpy and
    dp-accounting's ``logsumexp`` only where needed.

    Our log-mgf: lmgf(t) = log sum_k p_k b_k^j with b_k = e^(k / L) (j > 0) or e^(-k / L) (j < 0),
    the powers by repeated multiplication (two passes over the PMF per order, all terms
    between e^-20 and e^20: no overflow, no shift needed).

    Why the window is the same: for each order the bound is B(t) = (n lmgf(t) + log(2 / tail)) / t,
    rounded up (t > 0) or down (t < 0). Both lmgfs are the log of the same sum of L non-negative
    terms; each term is within (|j| + 3) u relative of its exact value here (exp, |j| - 1 products,
    the product with p_k) and within 4 u in scipy's, and a sum of non-negative terms in any order
    adds at most (L - 1) u relative, so each lmgf is within (L + 25) u (1.01) of the exact one, plus
    u (|lmgf| + 20) for the final log and shift; the two B(t) differ by at most n Delta / |t|, Delta
    twice that. Where our B(t) is farther than 4 times this (plus the rounding of B itself) from
    every integer, ceil/floor of both agree; where it is not, or is not finite, dp-accounting's own
    value of that order is computed and used.
    """
    from scipy import special

    size = len(probs)
    upper = (size - 1) * num_times
    lower = 0
    if tail_mass_truncation == 0:
        return lower, upper
    orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / size
    k = np.arange(size)
    log_term = math.log(2 / tail_mass_truncation)
    approx: dict[int, float] = {}
    terms = np.empty(size)
    for sign in (1, -1):
        base = np.exp(k * (sign / size))
        power = base.copy()
        for j in range(1, 21):
            if j > 1:
                power *= base
            # numpy's own sum, not a BLAS dot product: a threaded BLAS call would wake (and spin)
            # its idle threads for a product this small
            s = float(np.multiply(probs, power, out=terms).sum())
            approx[sign * j] = math.log(s) if s > 0 and math.isfinite(s) else math.nan
    for j, order in zip(list(range(-20, 0)) + list(range(1, 21)), orders, strict=True):
        lmgf = approx[j]
        bound = (num_times * lmgf + log_term) / order
        exact = not math.isfinite(bound)
        if not exact:
            err = 2.0 * ((size + 25) * _U * 1.01 + _U * (abs(lmgf) + 20.0))
            margin = 4.0 * (num_times * err / abs(order) + 4 * _U * abs(bound)) + 1e-300
            exact = abs(bound - round(bound)) <= margin
        if exact:  # dp-accounting's own value of this order
            log_mgf_value = special.logsumexp(k * order, b=probs)
            bound = (num_times * log_mgf_value + log_term) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper = min(upper, math.ceil(bound))
        if order < 0:
            lower = max(lower, math.floor(bound))
    return lower, upper


def _self_compose_pmf(pmf: Any, num_times: int, tail_mass_truncation: float) -> Any:
    """``DensePLDPmf.self_compose``: the n-fold convolution by one FFT of the next fast length of
    the Chernoff window (:func:`_chernoff_window`), the same calls as dp-accounting's."""
    from dp_accounting.pld import pld_pmf
    from scipy import fft

    if not _is_dense(pmf) or num_times <= 0:
        return pmf.self_compose(num_times, tail_mass_truncation)
    probs = pmf._probs
    lo, hi = _chernoff_window(probs, num_times, tail_mass_truncation)
    length = hi - lo + 1
    fast = fft.next_fast_len(max(length, len(probs)))
    full = np.real(fft.ifft(fft.fft(probs, fast) ** num_times))
    out = np.array(np.roll(full, -lo)[:length])
    inf_prob = tail_mass_truncation - math.expm1(num_times * math.log1p(-pmf._infinity_mass))
    return pld_pmf.DensePLDPmf(pmf._discretization, pmf._lower_loss * num_times + lo, out, inf_prob,
                               pmf._pessimistic_estimate)


def self_compose(pld: Any, num_times: int, tail_mass_truncation: float = 1e-15) -> Any:
    """``pld.self_compose(num_times, tail_mass_truncation)`` of a dp-accounting
    ``PrivacyLossDistribution``, bit for bit, without its 40 scalar logsumexp passes (see the module
    docstring)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    remove = _self_compose_pmf(pld._pmf_remove, num_times, tail_mass_truncation)
    if pld._symmetric:
        return pld_lib.PrivacyLossDistribution(remove)
    return pld_lib.PrivacyLossDistribution(remove, _self_compose_pmf(pld._pmf_add, num_times, tail_mass_truncation))


# ---------------------------------------------------------------------------------------------
# Epsilon for delta


def _pmf_epsilon(pmf: Any, delta: float) -> float:
    """``DensePLDPmf.get_epsilon_for_delta(delta)``, scanned in blocks (module docstring).

    The loop it reproduces, over the losses l from the top (l_0 = the largest, l_{i+1} = l_i - d
    as a running sum) with their probabilities p, masses U = infinity mass and V = 0:
    stop before i if U > delta, V > 0 and log((U - delta) / V) >= l_i; else U += p_i,
    V += exp(-l_i) p_i, and return max(0, l_i) if then U >= delta and V == 0. After the loop (or
    the stop): 0 if U <= V + delta, else log((U - delta) / V).

    Where the loop would reach a loss below -709 (``math.exp(-l)`` overflows: dp-accounting raises
    OverflowError there, e.g. for a tiny noise multiplier) the answer is 0, returned without
    going on: U - delta <= V holds once the loop has passed, without stopping, a loss l_k in
    (-d, 0] (U <= delta, or (U - delta) / V < e^(l_k) <= 1), or at the start if every loss is
    below 0 (U = infinity mass <= delta, V = 0), and every later loss l <= 0 adds p to
    U and e^(-l) p >= p to V, which keeps U - delta <= V to the end: the final test returns 0, and
    so does any later stop (its result is the same final test) or early return (max(0, l) with
    l <= 0).
    """
    if not _is_dense(pmf):
        return pmf.get_epsilon_for_delta(delta)
    inf_mass = pmf._infinity_mass
    if inf_mass > delta:
        return math.inf
    d = pmf._discretization
    rev = np.flip(pmf._probs)
    n = rev.size
    loss = (pmf._lower_loss + n - 1) * d  # the running loss, as itertools.count(upper_loss, -d) keeps it
    mass_upper: Any = inf_mass
    mass_lower: Any = 0
    start = 0
    block = _FIRST_BLOCK
    while start < n:
        stop = min(n, start + block)
        m = stop - start
        steps = np.empty(m)
        steps[0] = loss
        steps[1:] = -d
        losses = np.cumsum(steps)  # sequential: l_{i+1} = l_i + (-d), the loop's own roundings
        # A loss below _EXP_OVERFLOW_LOSS ends the scan (docstring): the block stops before it.
        below = np.flatnonzero(losses < _EXP_OVERFLOW_LOSS)
        overflows = below.size > 0
        if overflows:
            stop = start + int(below[0])
            m = stop - start
            losses = losses[:m]
        p = rev[start:stop]
        e = np.array([math.exp(-v) for v in losses.tolist()])
        up = np.empty(m + 1)
        up[0] = mass_upper
        up[1:] = p
        up = np.cumsum(up)  # up[i]: U before loss i of the block, up[i + 1]: after
        lw = np.empty(m + 1)
        lw[0] = mass_lower
        lw[1:] = e * p
        lw = np.cumsum(lw)
        ub, lb = up[:-1], lw[:-1]
        # the stopping test before each loss: decided by np.log where it holds or fails by a clear
        # margin (np.log and math.log differ by a few ulps at most), by math.log otherwise
        live = (ub > delta) & (lb > 0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.where(live, (ub - delta) / np.where(live, lb, 1.0), 1.0)
            approx = np.log(ratio)
        gap = approx - losses
        tol = 64 * _U * (np.abs(approx) + np.abs(losses)) + 1e-300
        stop_at = live & (gap > tol)
        for i in np.flatnonzero(live & (np.abs(gap) <= tol)).tolist():
            if math.log((float(ub[i]) - delta) / float(lb[i])) >= losses[i]:
                stop_at[i] = True
        first_stop = int(np.argmax(stop_at)) if stop_at.any() else m
        # the early return after adding loss i: U >= delta with V still exactly 0
        ret = (up[1:] >= delta) & (lw[1:] == 0)
        first_ret = int(np.argmax(ret)) if ret.any() else m
        if first_ret < first_stop:
            return max(0, float(losses[first_ret]))
        if first_stop < m:
            mass_upper, mass_lower = up[first_stop], lw[first_stop]
            break
        if overflows:
            return 0
        mass_upper, mass_lower = up[m], lw[m]
        loss = float(losses[-1]) - d
        start = stop
        block *= 4
    if mass_upper <= mass_lower + delta:
        return 0
    return math.log((mass_upper - delta) / mass_lower)


def epsilon_for_delta(pld: Any, delta: float) -> float:
    """``pld.get_epsilon_for_delta(delta)`` of a dp-accounting ``PrivacyLossDistribution``, bit for
    bit, scanning the losses as arrays (see the module docstring): the larger of the two
    directions' epsilons (the remove direction's alone for a symmetric PLD)."""
    eps_remove = _pmf_epsilon(pld._pmf_remove, delta)
    if pld._symmetric:
        return eps_remove
    return max(eps_remove, _pmf_epsilon(pld._pmf_add, delta))
