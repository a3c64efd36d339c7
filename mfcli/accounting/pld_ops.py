"""Privacy loss distributions (PLDs) without dp-accounting on the import path: a dense PMF type,
a PLD of two directions, composition, self-composition and epsilon for delta, each the same
arithmetic as dp-accounting's (``pld.pld_pmf`` and ``pld.privacy_loss_distribution``), with the
same results bit for bit, at a fraction of the cost.

Why a type of our own: importing dp-accounting loads scipy.signal and scipy.stats (about 1 s of
CPU, most of the headline ``mfcli account``) only to hold arrays that mfcli builds itself
(:mod:`mfcli.accounting.mog_pld`, :mod:`mfcli.accounting.single_pass`). dp-accounting stays the
oracle: tests/test_accounting_pld_ops.py compares every operation here with its own, bit for bit,
and :meth:`Pld.to_dp_accounting` / :meth:`Pld.from_dp_accounting` convert both ways (imported
lazily).

* :class:`Pmf` -- dp-accounting's ``DensePLDPmf`` (probabilities of the losses
  (lower_loss + i) d, and the mass at +infinity), with a flag ``sparse`` saying that dp-accounting
  would hold the same PMF in its dictionary form (``SparsePLDPmf``, at most 1000 points): that form
  composes by a dictionary product and scans its losses as k d (not as a running sum), and those
  are the operations this module then performs, so results stay equal to dp-accounting's.
* :func:`compose` -- ``PrivacyLossDistribution.compose`` (``compose_pmfs``): scipy.signal's
  ``fftconvolve`` is re-done with the same scipy.fft calls (:func:`_fftconvolve`), the tails cut
  as ``_truncate_tails`` cuts them, vectorised.
* :func:`self_compose` -- ``PrivacyLossDistribution.self_compose``. dp-accounting's
  ``DensePLDPmf.self_compose`` cuts the n-fold convolution to a window from Chernoff bounds on 40
  orders lambda, each a scalar ``scipy.special.logsumexp`` over the whole PMF (0.2-0.4 s of the
  headline ``mfcli account`` for its two 2 x 10^5-point PMFs). Only the two integer window ends
  reach the result (and through them the FFT length): here the 40 log-mgfs are sums against
  successive powers of e^(+-k / L) (two array passes each), each order's bound is formed from them,
  and recomputed with scipy's ``logsumexp`` (dp-accounting's call) whenever it lies within a proven
  error margin of an integer (where ceil/floor could differ). The FFT convolution and the infinity
  mass are the same calls as dp-accounting's.
* :func:`epsilon_for_delta` -- ``PrivacyLossDistribution.get_epsilon_for_delta``. dp-accounting
  scans the losses from the top in a Python loop (``pld_pmf._get_epsilon_for_delta``) until
  log((mass_upper - delta) / mass_lower) reaches the loss. Here the scan runs over blocks of
  losses as arrays: the running masses are cumulative sums (sequential, so equal to the loop's
  additions), each loss is the loop's own (a running sum of -d, or k d for a sparse PMF), the exp
  of every loss is ``math.exp`` (the loop's function, numpy's SIMD exp may differ in the last
  bit), and the stopping test is decided with ``np.log`` where it is clear by a margin and with
  ``math.log`` (the loop's) where it is not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mfcli.errors import MfcliError
from mfcli.util.floating import integer_power

#: Unit roundoff of float64.
_U = 2.0 ** -53

#: Losses below this end :func:`epsilon_for_delta`'s scan with epsilon 0 (``math.exp(-l)``
#: overflows a float below -709.78; any loss <= 0 would do, see ``_pmf_epsilon``).
_EXP_OVERFLOW_LOSS = -709.0

#: First block of losses scanned by :func:`epsilon_for_delta` (then twice as large each time: the
#: block the scan stops in is computed in full, and with 4x the headline's reduction row computed
#: ~180 000 of its ~380 000 math.exp past the stop; the blocks do not change the result, whose
#: running sums carry over from block to block).
_FIRST_BLOCK = 2048

#: dp-accounting's ``pld_pmf._MAX_PMF_SPARSE_SIZE``: PMFs of at most this many points it keeps as
#: dictionaries (its sparse form); tests/test_accounting_pld_ops.py holds the two equal.
MAX_SPARSE_SIZE = 1000

#: Default tail mass cut by a composition (dp-accounting's default too).
TAIL_MASS_TRUNCATION = 1e-15

#: Bytes of address space an FFT self-composition of L points takes at its peak, per point, with
#: a margin: measured at L = 1.6e7, 72 bytes of resident memory and 88 of address space (the
#: complex transform of the zero-padded input, its power, the inverse, pocketfft's buffers, the
#: rolled real part); the estimate :func:`self_compose` checks before allocating.
_FFT_BYTES_PER_POINT = 96


@dataclass(frozen=True, eq=False)
class Pmf:
    """A discretised privacy loss distribution of one direction: probability ``probs[i]`` at the
    loss (``lower_loss`` + i) x ``discretization``, ``infinity_mass`` at +infinity.

    ``pessimistic``: rounded so that epsilons computed from it are upper bounds (dp-accounting's
    ``pessimistic_estimate``). ``sparse``: dp-accounting would keep this PMF as a ``SparsePLDPmf``
    (module docstring); only the arithmetic of later operations depends on it, not the values."""

    discretization: float
    lower_loss: int
    probs: np.ndarray = field(repr=False)
    infinity_mass: float
    pessimistic: bool = True
    sparse: bool = False

    @property
    def size(self) -> int:
        return int(self.probs.size)

    def to_dp_accounting(self) -> Any:
        """The same PMF as dp-accounting's ``DensePLDPmf`` or (``sparse``) ``SparsePLDPmf``."""
        from dp_accounting.pld import pld_pmf

        if self.sparse:
            loss_probs = dict(zip(range(self.lower_loss, self.lower_loss + self.size), self.probs, strict=True))
            return pld_pmf.SparsePLDPmf(loss_probs, self.discretization, self.infinity_mass, self.pessimistic)
        return pld_pmf.DensePLDPmf(self.discretization, self.lower_loss, self.probs, self.infinity_mass,
                                   self.pessimistic)

    @classmethod
    def from_dp_accounting(cls, pmf: Any) -> Pmf:
        """A dp-accounting ``DensePLDPmf`` or ``SparsePLDPmf`` (its dictionary laid out densely, as
        its own ``to_dense_pmf`` does)."""
        sparse = hasattr(pmf, "_loss_probs")
        dense = pmf.to_dense_pmf() if sparse else pmf
        return cls(dense._discretization, int(dense._lower_loss), np.asarray(dense._probs, dtype=np.float64),
                   dense._infinity_mass, bool(dense._pessimistic_estimate), sparse)


@dataclass(frozen=True, eq=False)
class Pld:
    """A privacy loss distribution of both directions (dp-accounting's ``PrivacyLossDistribution``):
    ``remove`` (mu_upper = the pair with the example, against without) and ``add``; ``add`` is None
    for a symmetric PLD (the add direction equals the remove one)."""

    remove: Pmf
    add: Pmf | None = None

    @property
    def symmetric(self) -> bool:
        return self.add is None

    @property
    def add_pmf(self) -> Pmf:
        """The add direction's PMF (the remove one for a symmetric PLD)."""
        return self.remove if self.add is None else self.add

    @property
    def discretization(self) -> float:
        return self.remove.discretization

    def compose(self, other: Pld, tail_mass_truncation: float = TAIL_MASS_TRUNCATION) -> Pld:
        """:func:`compose` of the two."""
        return compose(self, other, tail_mass_truncation)

    def self_compose(self, num_times: int, tail_mass_truncation: float = TAIL_MASS_TRUNCATION) -> Pld:
        """:func:`self_compose`."""
        return self_compose(self, num_times, tail_mass_truncation)

    def get_epsilon_for_delta(self, delta: float) -> float:
        """:func:`epsilon_for_delta` (dp-accounting's name)."""
        return epsilon_for_delta(self, delta)

    def to_dp_accounting(self) -> Any:
        """The same PLD as dp-accounting's ``PrivacyLossDistribution`` (for its API, and tests)."""
        from dp_accounting.pld import privacy_loss_distribution as pld_lib

        if self.add is None:
            return pld_lib.PrivacyLossDistribution(self.remove.to_dp_accounting())
        return pld_lib.PrivacyLossDistribution(self.remove.to_dp_accounting(), self.add.to_dp_accounting())

    @classmethod
    def from_dp_accounting(cls, pld: Any) -> Pld:
        """A dp-accounting ``PrivacyLossDistribution`` as a :class:`Pld`."""
        remove = Pmf.from_dp_accounting(pld._pmf_remove)
        return cls(remove, None if pld._symmetric else Pmf.from_dp_accounting(pld._pmf_add))


def identity(value_discretization_interval: float = 1e-4) -> Pld:
    """dp-accounting's ``identity``: all mass at loss 0 (a mechanism that reveals nothing), the
    start of its accountant's composition."""
    return Pld(Pmf(value_discretization_interval, 0, np.array([1.0]), 0.0, True, True))


# ---------------------------------------------------------------------------------------------
# Composition


def _check_composable(a: Pmf, b: Pmf) -> None:
    if a.discretization != b.discretization:
        raise MfcliError(f"cannot compose PLDs of different discretizations ({a.discretization} and "
                         f"{b.discretization})")
    if a.pessimistic != b.pessimistic:
        raise MfcliError("cannot compose a pessimistic PLD with an optimistic one")


def _fftconvolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``scipy.signal.fftconvolve(a, b)`` of two 1-d float arrays (mode "full"), by the same
    scipy.fft calls it makes (real FFTs of the next fast length, their product, the inverse, cut to
    the full length), without importing scipy.signal; a length-1 input is a plain product there as
    here."""
    from scipy import fft

    if a.size == 1 or b.size == 1:
        return a * b
    shape = a.size + b.size - 1
    n = fft.next_fast_len(shape, True)
    # scipy.signal's rfftn / irfftn over the one axis, as rfft / irfft: the same pocketfft transforms
    # of the same arrays (the same numbers: tests/test_accounting_pld_ops.py), without the n-d
    # wrappers' argument handling, which took most of the time of a row PLD's composition
    ret = fft.irfft(fft.rfft(a, n) * fft.rfft(b, n), n)
    return ret[:shape].copy()


def _prefix_to_truncate(probs: np.ndarray, threshold: float) -> int:
    """The first i whose running sum p_0 + ... + p_i exceeds ``threshold`` (the length if none):
    the running sums are not monotone (an FFT leaves tiny negative probabilities), so the first
    crossing, not a binary search."""
    above = np.cumsum(probs) > threshold
    return int(np.argmax(above)) if above.any() else int(probs.size)


def _truncate_tails(probs: np.ndarray, tail_mass_truncation: float,
                    pessimistic: bool = True) -> tuple[int, np.ndarray, float]:
    """dp-accounting's ``_truncate_tails``, vectorised: cut the longest prefix and suffix of mass
    <= tail/2 each (running sums, sequential as its loop). Pessimistic: the prefix mass goes to
    the first kept point, the suffix mass to +inf (returned). Optimistic: the prefix mass is
    dropped (it stands for loss -inf), the suffix mass goes to the last kept point."""
    if tail_mass_truncation == 0:
        return 0, probs, 0
    half = tail_mass_truncation / 2
    left = _prefix_to_truncate(probs, half)
    right = probs.size - _prefix_to_truncate(probs[::-1], half)
    right = max(right, left + 1)
    left_mass = np.sum(probs[:left])
    right_mass = np.sum(probs[right:])
    out = probs[left:right].copy()
    if not pessimistic:
        out[-1] += right_mass
        return left, out, 0
    out[0] += left_mass
    return left, out, right_mass


def _compose_sparse(a: Pmf, b: Pmf, tail_mass_truncation: float) -> Pmf:
    """``SparsePLDPmf.compose``: the dictionary product, each loss's terms added in the order its
    double loop adds them (a's losses ascending, the first term added to 0.0)."""
    probs = np.zeros(a.size + b.size - 1)
    for i, v in enumerate(a.probs.tolist()):
        probs[i:i + b.size] += v * b.probs
    inf = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass
    offset, probs, right = _truncate_tails(probs, tail_mass_truncation, a.pessimistic)
    return Pmf(a.discretization, a.lower_loss + b.lower_loss + offset, probs, inf + right, a.pessimistic, True)


def compose_pmfs(a: Pmf, b: Pmf, tail_mass_truncation: float = TAIL_MASS_TRUNCATION) -> Pmf:
    """dp-accounting's ``compose_pmfs``: the dictionary product where both are sparse and small,
    else the FFT convolution (``DensePLDPmf.compose``)."""
    _check_composable(a, b)
    if a.sparse and b.sparse and a.size * b.size <= MAX_SPARSE_SIZE:
        return _compose_sparse(a, b, tail_mass_truncation)
    probs = _fftconvolve(a.probs, b.probs)
    inf = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass
    offset, probs, right = _truncate_tails(probs, tail_mass_truncation, a.pessimistic)
    return Pmf(a.discretization, a.lower_loss + b.lower_loss + offset, probs, inf + right, a.pessimistic)


def compose(a: Pld, b: Pld, tail_mass_truncation: float = TAIL_MASS_TRUNCATION) -> Pld:
    """``PrivacyLossDistribution.compose``: each direction composed (:func:`compose_pmfs`),
    symmetric when both are."""
    remove = compose_pmfs(a.remove, b.remove, tail_mass_truncation)
    if a.symmetric and b.symmetric:
        return Pld(remove)
    return Pld(remove, compose_pmfs(a.add_pmf, b.add_pmf, tail_mass_truncation))


# ---------------------------------------------------------------------------------------------
# Self-composition


def _chernoff_window(probs: np.ndarray, num_times: int, tail_mass_truncation: float) -> tuple[int, int]:
    """dp-accounting's ``common.compute_self_convolve_bounds(probs, num_times, tail)`` (its default
    orders t = j / L, j = -20..-1, 1..20, L = len(probs)), with the log-mgfs computed by numpy and
    scipy's ``logsumexp`` (dp-accounting's call) only where needed.

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
    for sign in (1, -1):
        base = np.exp(k * (sign / size))
        power = base.copy()
        for j in range(1, 21):
            if j > 1:
                power *= base
            # einsum's own dot product (one pass, no temporary), not BLAS: a threaded BLAS call
            # would wake (and spin) its idle threads for a product this small; its order of the
            # additions is another one, which the error bound below allows (any order)
            s = float(np.einsum("i,i->", probs, power))
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


def _self_compose_dense(pmf: Pmf, num_times: int, tail_mass_truncation: float, bit_for_bit: bool = True) -> Pmf:
    """``DensePLDPmf.self_compose``: the n-fold convolution by one FFT of the next fast length of
    the Chernoff window (:func:`_chernoff_window`), the same calls as dp-accounting's
    (``common.self_convolve``). Refused (MemoryLimitError) before anything is allocated when the
    FFT would not fit in :func:`mfcli.util.memory.memory_left`. ``bit_for_bit`` False: real
    transforms (half the work; the same window, the last bits may differ)."""
    from scipy import fft

    probs = pmf.probs
    lo, hi = _chernoff_window(probs, num_times, tail_mass_truncation)
    length = hi - lo + 1
    fast = fft.next_fast_len(max(length, len(probs)), not bit_for_bit)
    from mfcli.util import memory

    memory.check_memory(
        fast * _FFT_BYTES_PER_POINT, memory.memory_left(),
        what=f"composing a privacy loss distribution {num_times} times (an FFT of {fast:,} points: its losses "
             f"spread over {pmf.size:,} points of {pmf.discretization:g}, too many for this discretization "
             "when the noise multiplier is this small)",
        way_forward="a larger noise multiplier or a coarser value discretization needs fewer points")
    if bit_for_bit:
        full = np.real(fft.ifft(fft.fft(probs, fast) ** num_times))
    else:
        full = fft.irfft(integer_power(fft.rfft(probs, fast), num_times), fast)  # no cpow: k >= 100 is 30x slower
    out = np.array(np.roll(full, -lo)[:length])
    inf_prob = tail_mass_truncation - math.expm1(num_times * math.log1p(-pmf.infinity_mass))
    return Pmf(pmf.discretization, pmf.lower_loss * num_times + lo, out, inf_prob, pmf.pessimistic)


def _power_exceeds(base: int, exponent: int, limit: int) -> bool:
    """base^exponent > limit, without forming a power of millions of digits (dp-accounting's test
    ``size**num_times > _MAX_PMF_SPARSE_SIZE``, for num_times up to the number of steps)."""
    if base <= 1:
        return base > limit
    power = 1
    for _ in range(exponent):
        power *= base
        if power > limit:
            return True
    return False


def _self_compose_pmf(pmf: Pmf, num_times: int, tail_mass_truncation: float, bit_for_bit: bool = True) -> Pmf:
    """``PLDPmf.self_compose`` of either of dp-accounting's forms: a sparse PMF is itself once,
    composed pairwise while size^n stays within :data:`MAX_SPARSE_SIZE` (truncated at the last
    step only), else made dense."""
    if num_times <= 0:
        raise MfcliError(f"a PLD can only be composed a positive number of times, not {num_times}")
    if not pmf.sparse:
        return _self_compose_dense(pmf, num_times, tail_mass_truncation, bit_for_bit)
    if num_times == 1:
        return pmf
    if _power_exceeds(pmf.size, num_times, MAX_SPARSE_SIZE):
        return _self_compose_dense(pmf, num_times, tail_mass_truncation, bit_for_bit)
    result = pmf
    for i in range(2, num_times + 1):
        result = _compose_sparse(result, pmf, 0 if i != num_times else tail_mass_truncation)
    return result


def self_compose(pld: Pld, num_times: int, tail_mass_truncation: float = TAIL_MASS_TRUNCATION, *,
                 bit_for_bit: bool = True) -> Pld:
    """``PrivacyLossDistribution.self_compose(num_times, tail_mass_truncation)``, bit for bit,
    without its 40 scalar logsumexp passes (see the module docstring). ``bit_for_bit`` False: a
    dense FFT by real transforms (half the work, the same window; the masses may differ in their
    last bits), for runs whose answer is certified anyway (:mod:`mfcli.accounting.pld_certify`).

    Raises:
        MfcliError: ``num_times`` < 1, or the FFT would not fit in memory (a noise multiplier too
            small for the discretization)."""
    remove = _self_compose_pmf(pld.remove, num_times, tail_mass_truncation, bit_for_bit)
    if pld.symmetric:
        return Pld(remove)
    return Pld(remove, _self_compose_pmf(pld.add_pmf, num_times, tail_mass_truncation, bit_for_bit))


# ---------------------------------------------------------------------------------------------
# Epsilon for delta


def _pmf_epsilon(pmf: Pmf, delta: float, *, bit_for_bit: bool = True) -> float:
    """``PLDPmf.get_epsilon_for_delta(delta)``, scanned in blocks (module docstring).

    The loop it reproduces, over the losses l from the top (dense: l_0 = the largest,
    l_{i+1} = l_i - d as a running sum; sparse: l = k d) with their probabilities p, masses
    U = infinity mass and V = 0: stop before i if U > delta, V > 0 and log((U - delta) / V) >= l_i;
    else U += p_i, V += exp(-l_i) p_i, and return max(0, l_i) if then U >= delta and V == 0. After
    the loop (or the stop): 0 if U <= V + delta, else log((U - delta) / V).

    Where the loop would reach a loss below -709 (``math.exp(-l)`` overflows: dp-accounting raises
    OverflowError there, e.g. for a tiny noise multiplier) the answer is 0, returned without
    going on: U - delta <= V holds once the loop has passed, without stopping, a loss l_k in
    (-d, 0] (U <= delta, or (U - delta) / V < e^(l_k) <= 1), or at the start if every loss is
    below 0 (U = infinity mass <= delta, V = 0), and every later loss l <= 0 adds p to
    U and e^(-l) p >= p to V, which keeps U - delta <= V to the end: the final test returns 0, and
    so does any later stop (its result is the same final test) or early return (max(0, l) with
    l <= 0).

    ``bit_for_bit`` False: e^(-l) by numpy's vectorised exp instead of ``math.exp`` per loss (about
    a third of the scan's time); numpy's and libm's exp may differ in the last bit, so the answer
    may too. For a starting point only (:func:`mfcli.accounting.pld_certify.certified_epsilon`).
    """
    inf_mass = pmf.infinity_mass
    if inf_mass > delta:
        return math.inf
    d = pmf.discretization
    rev = np.flip(pmf.probs)
    n = rev.size
    top = pmf.lower_loss + n - 1
    loss = top * d  # the running loss, as itertools.count(upper_loss, -d) keeps it
    mass_upper: Any = inf_mass
    mass_lower: Any = 0
    start = 0
    block = _FIRST_BLOCK
    while start < n:
        stop = min(n, start + block)
        m = stop - start
        if pmf.sparse:  # the losses k d, as SparsePLDPmf._get_losses_probs forms them
            losses = np.arange(top - start, top - stop, -1, dtype=np.int64) * d
        else:
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
        e = np.array([math.exp(-v) for v in losses.tolist()]) if bit_for_bit else np.exp(-losses)
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
        block *= 2
    if mass_upper <= mass_lower + delta:
        return 0
    return math.log((mass_upper - delta) / mass_lower)


def epsilon_for_delta(pld: Pld, delta: float, *, bit_for_bit: bool = True) -> float:
    """``PrivacyLossDistribution.get_epsilon_for_delta(delta)``, bit for bit, scanning the losses
    as arrays (see the module docstring): the larger of the two directions' epsilons (the remove
    direction's alone for a symmetric PLD). ``bit_for_bit`` False: the same scan with numpy's exp,
    equal up to the last bits (a starting point, see :func:`_pmf_epsilon`)."""
    eps_remove = _pmf_epsilon(pld.remove, delta, bit_for_bit=bit_for_bit)
    if pld.symmetric:
        return eps_remove
    return max(eps_remove, _pmf_epsilon(pld.add_pmf, delta, bit_for_bit=bit_for_bit))


def from_rounded_probability(
    rounded_probability_mass_function: dict[int, float], infinity_mass: float,
    value_discretization_interval: float, pessimistic_estimate: bool = True,
    rounded_probability_mass_function_add: dict[int, float] | None = None,
    infinity_mass_add: float | None = None, symmetric: bool = True,
) -> Pld:
    """dp-accounting's ``PrivacyLossDistribution.create_from_rounded_probability``: a PLD from the
    probabilities of the rounded losses, ``{k: probability of the loss k x
    value_discretization_interval}`` and the mass at +infinity, per direction (remove, and add
    unless ``symmetric``), pessimistic or optimistic.

    Each direction takes the form dp-accounting's ``create_pmf`` gives it: at most
    :data:`MAX_SPARSE_SIZE` keys the sparse form (:class:`Pmf` ``sparse``), more the dense one
    with the missing losses between the smallest and the largest key at probability 0 (as its
    ``dictionary_to_list`` fills them). The probabilities, lower loss and infinity mass are the
    arguments themselves, so every later operation here equals dp-accounting's on its PLD, with
    two limits that only a sparse-sized mapping can reach: a :class:`Pmf` is contiguous, so keys
    with gaps count as their span (not their number) where a composition chooses between the
    sparse and the dense form; and a sparse composition adds a loss's terms in ascending order of
    the first PMF's losses, as dp-accounting does when the mapping's keys are in ascending order
    (a self-composition gives the same bits in any key order: its terms come in mirrored pairs).
    Give contiguous mappings in ascending key order for results equal to dp-accounting's.

    Raises:
        MfcliError: an empty mapping; the add direction given for a symmetric PLD, or missing
            for an asymmetric one.
    """

    def pmf(loss_probs: dict[int, float], inf_mass: float, what: str) -> Pmf:
        if not loss_probs:
            raise MfcliError(f"the {what} probability mass function has no losses")
        keys = np.fromiter(loss_probs.keys(), dtype=np.int64, count=len(loss_probs))
        lower = int(keys.min())
        probs = np.zeros(int(keys.max()) - lower + 1)
        probs[keys - lower] = np.fromiter(loss_probs.values(), dtype=np.float64, count=len(loss_probs))
        return Pmf(value_discretization_interval, lower, probs, inf_mass, bool(pessimistic_estimate),
                   len(loss_probs) <= MAX_SPARSE_SIZE)

    remove = pmf(rounded_probability_mass_function, infinity_mass, "remove direction's")
    if symmetric:
        if rounded_probability_mass_function_add is not None or infinity_mass_add is not None:
            raise MfcliError("a symmetric PLD takes no add direction (rounded_probability_mass_function_add, "
                             "infinity_mass_add)")
        return Pld(remove)
    if rounded_probability_mass_function_add is None or infinity_mass_add is None:
        raise MfcliError("an asymmetric PLD needs its add direction (rounded_probability_mass_function_add and "
                         "infinity_mass_add)")
    return Pld(remove, pmf(rounded_probability_mass_function_add, infinity_mass_add, "add direction's"))
