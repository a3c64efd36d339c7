"""A certified epsilon for a PLD composition tree under the FFT's round-off (the tilted-FFT
certificate; docs/accounting.md, "MMCC: the composition's FFT round-off, certified").

Why: :mod:`mfcli.accounting.pld_ops` composes PLDs with dp-accounting's arithmetic (FFT power,
real-FFT convolution), bit for bit. Its round-off is smooth and one-signed and can lower the
hockey-stick curve D(eps) below the exact composition's by up to 1e-4 of delta (epsilon off by
3e-6 relative at delta 1e-10; docs/performance.md, "FFT round-off of PLD composition"): an
unproven, unsafe-side error. The run's arithmetic stays; this module certifies its answer.

How: the composition is recorded as a tree (:func:`leaf`, :func:`self_compose`, :func:`compose`
run pld_ops' operations and keep their inputs). :func:`certify` redoes the tree once per direction
on exponentially tilted PMFs q_j = p_j e^(theta l_j) / M(theta) -- tilting commutes with
convolution, so the exact untilted mass at loss l of any node is x_l e^(s - theta l), s the sum of
the leaves' log M -- with every rounding bounded:

* the FFT's absolute error within Higham's model (Accuracy and Stability, 2nd ed., Thm 24.2):
  ||fl(F x) - F x||_2 <= alpha sqrt(n) ||x||_2 and per coefficient <= alpha ||x||_1, alpha =
  eta log2(n) / (1 - eta log2(n)), eta = :data:`FFT_ETA_ULPS` u -- an ASSUMPTION (pocketfft's
  transforms; scripts/check_fft_roundoff.py --check-assumption finds at most 3 % of it);
  the k-th power of the spectrum by square-and-multiply (:func:`mfcli.util.floating.integer_power`,
  proven for every k: numpy's own ``**`` calls cpow, whose accuracy is only assumed, for k >= 100);
  numpy's exp / expm1 within :data:`mfcli.util.floating.ELEMENTARY_ULPS` (the model of
  :mod:`mfcli.util.floating`); the direct convolutions and sums within gamma_n;
* that error, carried in l1 through the tree (err1), moves D(eps) by at most
  err1 e^(s - theta eps) (every loss above eps has e^(-theta l) < e^(-theta eps)): the Chernoff
  bound at eps times err1, so relative to D, not to the bulk of the distribution;
* windows: a self-composition keeps the run's Chernoff window, on a circular FFT at least as long
  as the run's (exact circular aliases are non-negative, so each kept position is an upper bound
  on its true mass; the length is raised where aliases wrapped down, amplified by the untilt,
  would loosen the bound); the true mass outside the window is at most the run's tail mass
  (dp-accounting's Chernoff bounds, each side tail/2, with their own rounding allowed for),
  charged in full, with the mass at infinity; pairwise compositions are not cut (nothing is
  moved; lengths add).

The result D_cert(eps) >= the exact composition's D(eps) of the leaf PMFs (which are themselves
pessimistic), in each direction; :func:`certify` finds the smallest eps with D_cert(eps) <= delta
(to 1e-10 relative), searching up or down from the run's value.

The lower side (:func:`lower_delta_bound`, :func:`certify_lower`; docs/accounting.md, balls-in-bins
"Floating point"): the same tilted chain, but every self-composition a binary power of linear
(zero-padded or direct) compositions, so no alias and no window (only tails dropped, which a
lower bound may do): the exact finite mass at loss l is at least x*_l e^(s* - theta l), and
D(eps) >= sum over losses surely above eps of x+_l times
lower bounds of the untilt and of the weight 1 - e^(eps - l), minus err1 e^(s* - theta eps);
:func:`certify_lower` steps eps down a ladder from the run's value until that exceeds delta
(a lower bound on the exact composition's epsilon). Layer 2: only pld_ops, numpy and scipy.fft
below it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from mfcli.accounting import pld_ops
from mfcli.errors import MfcliError
from mfcli.util import memory
from mfcli.util.floating import (
    ELEMENTARY_ULPS,
    UNIT_ROUNDOFF,
    gamma,
    integer_power,
    integer_power_rounding,
    integer_power_underflow,
)

_U = UNIT_ROUNDOFF

#: Assumed constant of the FFT error model, in units of roundoff (Higham's eta = mu + gamma_4
#: (sqrt 2 + mu) for radix 2 with twiddles within mu; pocketfft's twiddles are products of two
#: table entries, mu about 3 u, so about 8.7 u; 10 u leaves room for its other radices). An
#: assumption, checked (not proven) by scripts/check_fft_roundoff.py --check-assumption.
FFT_ETA_ULPS = 10.0

#: Pairwise compositions of the tilted chain are direct convolutions (relative error gamma_n per
#: term, no FFT model) up to this many products, FFT convolutions above.
DIRECT_WORK = 4_000_000

#: The smallest normal double (rounded up): a generous bound on the absolute error of an entry
#: whose result, or an intermediate of it, falls below the normal range, where the relative model
#: does not hold (a subnormal or zero result of one operation is within 2^-1075 of the exact one).
_UNDERFLOW = 2.3e-308

#: A tilted self-composition's circular length is raised until the aliases wrapped down into
#: its window (amplified by the untilt) total at most this share of the run's tail mass: a
#: choice of tightness (they are counted, never lost), not of validity.
ALIAS_SHARE = 1e-2
#: ... but to at most this many times the run's length (cost and memory; measured: 2.4 x in the
#: 1.08 M-point self-composition of docs/performance.md's case a).
MAX_LENGTH_FACTOR = 4

#: Tilts searched (golden section on the convex log-mgf) within these ends.
_THETA_RANGE = (1e-3, 200.0)

DIRECTIONS = ("remove", "add")


# ---------------------------------------------------------------------------------------------
# The recorded tree


@dataclass(frozen=True, eq=False)
class Node:
    """One PLD of a recorded composition: ``pld`` is the run's result (pld_ops' arithmetic), the
    rest says how it was made: ``kind`` "leaf" (an input, exact by definition), "self"
    (``pld_ops.self_compose(children[0].pld, times, tail)``) or "compose"
    (``pld_ops.compose(children[0].pld, children[1].pld, tail)``)."""

    pld: pld_ops.Pld
    kind: str = "leaf"
    children: tuple[Node, ...] = field(default=(), repr=False)
    times: int = 1
    tail: float = 0.0


def leaf(pld: pld_ops.Pld) -> Node:
    """An input of the composition (its PMFs must be non-negative)."""
    return Node(pld)


def self_compose(node: Node, num_times: int, tail_mass_truncation: float = pld_ops.TAIL_MASS_TRUNCATION) -> Node:
    """``pld_ops.self_compose`` of a leaf, recorded. Only leaves: the certificate's window argument
    needs the exact input (a computed PMF would carry its round-off into the Chernoff window)."""
    if node.kind != "leaf":
        raise MfcliError("the composition certificate covers self-compositions of input PLDs only")
    # the run's own arithmetic need not be dp-accounting's: its answer is certified (real FFTs)
    out = pld_ops.self_compose(node.pld, int(num_times), tail_mass_truncation, bit_for_bit=False)
    return Node(out, "self", (node,), int(num_times), float(tail_mass_truncation))


def compose(a: Node, b: Node, tail_mass_truncation: float = pld_ops.TAIL_MASS_TRUNCATION) -> Node:
    """``pld_ops.compose`` of the two, recorded."""
    return Node(pld_ops.compose(a.pld, b.pld, tail_mass_truncation), "compose", (a, b), 1, float(tail_mass_truncation))


def compose_counted(leaves: Sequence[tuple[pld_ops.Pld, int]]) -> Node | None:
    """Every input PLD composed with itself ``count`` times, then all of them together, recorded:
    the leaves self-composed (a count of 1 is the leaf itself; counts below 1 are skipped), then a
    balanced pairwise composition (each level's FFTs add up to the total length once). None when
    nothing is left. MMCC's rows and the certified DP-SGD's groups are composed this way."""
    nodes = [self_compose(leaf(p), int(k)) if int(k) > 1 else leaf(p) for p, k in leaves if int(k) >= 1]
    if not nodes:
        return None
    while len(nodes) > 1:
        nodes = [compose(nodes[i], nodes[i + 1]) if i + 1 < len(nodes) else nodes[i] for i in range(0, len(nodes), 2)]
    return nodes[0]


def _direction(pld: pld_ops.Pld, direction: str) -> pld_ops.Pmf:
    return pld.remove if direction == "remove" else pld.add_pmf


# ---------------------------------------------------------------------------------------------
# Error model of the FFT operations


def _alpha(n: int) -> float:
    """Higham's factor log2(n) eta / (1 - log2(n) eta), eta = FFT_ETA_ULPS u (assumed model)."""
    t = FFT_ETA_ULPS * _U * math.log2(max(n, 2))
    return t / (1 - t)


def _norms(x: np.ndarray) -> tuple[float, float]:
    """Upper bounds on ||x||_1 and ||x||_2 (sums of non-negative terms within gamma_n)."""
    g = 1 + gamma(x.size + 2)
    return float(np.abs(x).sum()) * g, float(np.sqrt(float(np.dot(x, x)) * g)) * g


def _fft_conv_bound(a1: float, a2: float, b1: float, b2: float, n: int) -> float:
    """Bound on ||fl(conv) - conv||_2 of a real-FFT convolution of length n (scipy's
    fftconvolve): forward transforms within alpha sqrt(n) ||x||_2 in 2-norm and alpha ||x||_1 per
    coefficient, |F x|_j <= ||x||_1; the complex product within sqrt2 gamma_2 (Higham Lemma 3.5);
    the inverse within alpha of its exact output (||ifft z||_2 = ||z||_2 / sqrt n)."""
    al = _alpha(n)
    prod = al * (a2 * b1 + a1 * b2) + al * al * a2 * b1   # ||z_hat - z||_2 / sqrt(n), product exact
    zhat = (1 + al) ** 2 * min(a1 * b2, a2 * b1)          # ||z_hat||_2 / sqrt(n)
    g2 = math.sqrt(2) * gamma(2)
    return (prod + g2 * zhat + al * zhat * (1 + g2)) * (1 + 4 * _U)


def _fft_power_bound(p1: float, p2: float, k: int, n: int) -> float:
    """Bound on ||fl(irfft(rfft(p)^k)) - irfft(rfft(p)^k)||_2 over the n circular outputs (the
    model below holds for the real transforms' Hermitian-extended spectrum), from upper
    bounds p1 >= ||p||_1, p2 >= ||p||_2. Forward: ||y_hat - y||_2 <= alpha sqrt(n) p2 and |y_j|,
    |y_hat_j| <= m = p1 (1 + alpha); power: |y_hat^k - y^k| <= k |y_hat - y| m^(k - 1); its own
    rounding: square-and-multiply (:func:`mfcli.util.floating.integer_power`, for every k; numpy's
    ``**`` calls cpow for k >= 100), relative (1 + sqrt2 gamma_2)^(k - 1) - 1
    (:func:`~mfcli.util.floating.integer_power_rounding`) plus an absolute underflow allowance
    per coefficient (:func:`~mfcli.util.floating.integer_power_underflow`; its l2 over the n
    coefficients is sqrt(n) times it, 1 after the inverse's 1 / sqrt(n)); inverse within alpha of its exact output."""
    al = _alpha(n)
    m = p1 * (1 + al)
    spread = k * al * p2 * m ** (k - 1)
    y2 = (1 + al) * p2
    zhat = m ** (k - 1) * y2
    pow_err = integer_power_rounding(k) * zhat + integer_power_underflow(k, m)
    return (spread + pow_err + al * (zhat + pow_err)) * (1 + 4 * _U)


# ---------------------------------------------------------------------------------------------
# The tilted chain


@dataclass
class _Tilted:
    """A node in the tilted domain, one direction. The true measure of the node (the exact
    composition of its leaves) is good + bad with good <= e^(s* - theta l_i) x*_i at every loss
    l_i = (lower + i) d and |bad| <= ``bad``, x* the exact arithmetic's tilted values
    (sum |x_i - x*_i| <= ``err1``), s* the exact sum of the leaves' computed log M
    (|s - s*| <= ``s_err``); ``total`` bounds the true measure's total mass."""

    lower: int
    x: np.ndarray
    s: float
    s_err: float
    err1: float
    bad: float
    total: float
    rho: float = 0.0     # a leaf's: its entries' relative error (the tilt's roundings)
    tiny: float = 0.0    # a leaf's: its absolute error from subnormal results
    _norms: tuple[float, float] | None = None

    def norms(self) -> tuple[float, float]:
        """:func:`_norms` of x, computed once."""
        if self._norms is None:
            self._norms = _norms(self.x)
        return self._norms


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    return m + math.log(float(np.exp(x - m).sum()))


class _Chain:
    """The tree of one direction redone on PMFs tilted by ``theta`` (memoised per node)."""

    def __init__(self, theta: float, direction: str, epsilon: float = -math.inf) -> None:
        if not theta >= 0 or not math.isfinite(theta):
            raise MfcliError(f"the tilt theta must be a finite non-negative number, got {theta!r}")
        self.theta = float(theta)
        self.direction = direction
        # the smallest eps the chain is expected to be asked about: only aliases landing above it
        # count for the circular lengths (a choice of tightness; any eps is still bounded validly)
        self.epsilon = float(epsilon)
        self.d = 0.0
        self.memo: dict[int, _Tilted] = {}
        self.cache: dict[int, tuple[float, np.ndarray, np.ndarray, float]] = {}

    def of(self, node: Node) -> _Tilted:
        key = id(node)
        if key not in self.memo:
            if node.kind == "leaf":
                self.memo[key] = self._leaf(_direction(node.pld, self.direction))
            elif node.kind == "self":
                self.memo[key] = self._self(node)
            elif node.kind == "compose":
                self.memo[key] = self._compose(self.of(node.children[0]), self.of(node.children[1]))
            else:
                raise MfcliError(f"unknown composition node {node.kind!r}")
        return self.memo[key]

    def _leaf(self, p: pld_ops.Pmf) -> _Tilted:
        if np.any(p.probs < 0) or not p.infinity_mass >= 0:
            raise MfcliError("the composition certificate needs non-negative input PMFs")
        self.d = d = p.discretization
        lj = (np.arange(p.size) + p.lower_loss) * d
        pos = p.probs > 0
        if not pos.any():
            raise MfcliError("the composition certificate needs an input PMF with positive mass")
        arg = self.theta * lj
        log_m = _logsumexp(np.log(p.probs[pos]) + arg[pos])  # any value: a common factor, cancelled
        # q_j = (p_j e_j) e_j, e_j = exp((theta l_j - log M) / 2): p_j e^(theta l_j) <= M, so the
        # exponent is at most -log p_j <= 745 and its half does not overflow; no log of p_j (its
        # error would scale with |log p_j|)
        with np.errstate(over="ignore", under="ignore"):
            e = np.where(pos, np.exp(0.5 * (arg - log_m)), 0.0)
            first = p.probs * e
            q = first * e
        if not np.all(np.isfinite(q)):
            raise MfcliError("the composition certificate's tilt overflowed (theta too large)")
        # relative: l_j (one rounding), theta l_j (one), - log M (one, of the argument), two exps
        # (ELEMENTARY_ULPS each), two products; absolute: a product whose result is subnormal is
        # within 2^-1075 (the first one's error then scaled by e_j)
        rho = _U * (3 * self.theta * float(np.abs(lj).max()) + abs(log_m) + 2 * ELEMENTARY_ULPS + 2) * 1.01
        tiny = float((e[first < 2.0 ** -1022] * 2.0 ** -1075).sum()) * 1.01 + q.size * _UNDERFLOW
        q1 = float(q.sum()) * (1 + gamma(q.size))
        total = (float(p.probs.sum()) * (1 + gamma(p.size)) + p.infinity_mass) * (1 + 2 * _U)
        return _Tilted(p.lower_loss, q, log_m, 0.0, rho * q1 + tiny, p.infinity_mass, total, rho, tiny)

    def _self(self, node: Node) -> _Tilted:
        child = node.children[0]
        k = node.times
        p = _direction(child.pld, self.direction)
        out = _direction(node.pld, self.direction)
        base = self.of(child)
        if k == 1:
            return base
        if out.sparse:  # pld_ops' sparse path: pairwise products; here the same, uncut
            res = base
            for _ in range(k - 1):
                res = self._compose(res, base)
            return res
        from scipy import fft

        # the run's window and circular length (pld_ops._self_compose_dense)
        lo = out.lower_loss - p.lower_loss * k
        length = out.size
        n = self._circular_length(p, k, lo, length, node.tail)
        # real transforms: half the work of the complex ones; the error model is stated for the
        # Hermitian-extended spectrum (irfft's projection onto it can only shorten the error)
        x = np.roll(fft.irfft(integer_power(fft.rfft(base.x, n), k), n), -lo)[:length].copy()
        q1, q2 = base.norms()
        # an absolute error t on the input moves the exact k-fold by <= k t ||q||_1^(k-1) in l1
        fresh = math.sqrt(n) * _fft_power_bound(q1, q2, k, n) + k * base.tiny * max(q1, 1.0) ** (k - 1)
        # the leaf's tilt errors are relative and every term non-negative: the exact k-fold
        # composition of the computed q is within (1 + rho_q)^k - 1 of the exact one
        err1 = fresh + math.expm1(k * math.log1p(base.rho)) * (_norms(x)[0] + fresh)
        # the true mass outside the window: dp-accounting's Chernoff bounds give tail / 2 per side;
        # the window ends were computed in floating point (pld_ops._chernoff_window: each log-mgf
        # within (L + 25) u (1.01) + u (|lmgf| + 20), |lmgf| <= 20 + |log sum p|, twice that for either of the
        # two ways it is computed; the bound's own roundings), so the exponent of each Chernoff
        # bound is within slack of its exact value, and the tail within e^slack of tail / 2
        size = p.size
        mass = float(p.probs.sum())
        lmgf_max = 20.0 + (abs(math.log(mass)) if mass > 0 else 0.0)  # |t k| <= 20 at every order
        lmgf_err = 2.0 * ((size + 25) * _U * 1.01 + _U * (lmgf_max + 20.0))
        slack = k * lmgf_err + 8 * _U * (lmgf_max * k + 40)
        outside = node.tail * math.exp(slack) * (1 + 4 * _U)
        # the infinity atom: P(some copy is at infinity) = T^k - (T - inf)^k <= k inf T^(k - 1)
        t = max(base.total, 1.0)
        infinite = k * p.infinity_mass * t ** (k - 1) * (1 + gamma(k + 4))
        return _Tilted(p.lower_loss * k + lo, x, k * base.s, _U * abs(k * base.s), err1 * (1 + 4 * _U),
                       (outside + infinite) * (1 + 2 * _U), base.total ** k * (1 + gamma(2 * k + 4)))

    def _circular_length(self, p: pld_ops.Pmf, k: int, lo: int, length: int, tail: float) -> int:
        """The circular FFT length of a tilted self-composition on the run's window [lo, lo + length).

        Any length >= the window's is valid (the exact circular aliases are non-negative: each
        kept position bounds its true mass from above). Tilting makes an alias from above costly:
        a mass c_m wrapped down by n positions counts e^(theta n d) c_m after the untilt. Only the
        aliases landing at a loss above the chain's eps (``self.epsilon``, the run's epsilon: the
        search ends within the run's FFT noise of it) enter D(eps) there; those landing below it
        only enlarge x's norms (or, below a lower answer, loosen the bound, never invalidate it).
        So the length is about the run's (pld_ops: next_fast_len(max(window, input)), here the real
        transform's fast length), raised until the
        aliases landing at l >= l_e = max(l_lo, eps), in total at most
        sum_(l_m >= l_e + n d) c_m e^(theta (l_m - l_e)) <=
        exp(k log M(theta2) - theta l_e - (theta2 - theta)(l_e + n d)) for any theta2 > theta
        (every wrap by t >= 1 lengths has e^(theta t n d) <= e^(theta (l_m - l_e))),
        are below ALIAS_SHARE of the tail mass: a choice of tightness, not of validity (capped at the
        length with no alias from above, at MAX_LENGTH_FACTOR times the run's, and at the memory
        left, where the run's length is kept)."""
        from scipy import fft

        n_run = fft.next_fast_len(max(length, p.size), True)
        n_full = k * (p.size - 1) + 1 - lo
        if tail <= 0 or n_run >= n_full:
            return n_run
        d = p.discretization
        pos = p.probs > 0
        lg = np.log(p.probs[pos])
        lj = (np.flatnonzero(pos) + p.lower_loss) * d
        l_lo = (p.lower_loss * k + lo) * d
        l_e = max(l_lo, self.epsilon)
        log_target = math.log(ALIAS_SHARE * tail)
        best = math.inf
        for step in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0):
            th2 = self.theta + step
            reach = (k * _logsumexp(lg + th2 * lj) - self.theta * l_e - log_target) / step  # l_e + n d
            best = min(best, reach)
        need = math.ceil((best - l_e) / d) + 1 if math.isfinite(best) else n_full
        n = fft.next_fast_len(min(max(need, n_run), n_full, MAX_LENGTH_FACTOR * n_run), True)
        left = memory.memory_left()
        if n > n_run and left is not None and n * pld_ops._FFT_BYTES_PER_POINT > left:
            return n_run  # looser, equally valid
        return n

    def _compose(self, a: _Tilted, b: _Tilted) -> _Tilted:
        na, nb = a.x.size, b.x.size
        a1, a2 = a.norms()
        b1, b2 = b.norms()
        if min(na, nb) == 1 or na * nb <= DIRECT_WORK:
            # direct: each output a sum of at most min(na, nb) products, any order
            x = np.convolve(a.x, b.x)
            fresh = gamma(min(na, nb) + 1) * a1 * b1 + na * nb * _UNDERFLOW
        else:
            from scipy import fft

            shape = na + nb - 1
            n = fft.next_fast_len(shape, True)
            x = fft.irfft(fft.rfft(a.x, n) * fft.rfft(b.x, n), n)[:shape].copy()
            fresh = math.sqrt(shape) * _fft_conv_bound(a1, a2, b1, b2, n)
        # x_a * x_b - x*_a * x*_b = e_a * x*_b + x_a * e_b: l1 <= err_a (||x_b||_1 + err_b) + err_b ||x_a||_1
        err1 = (a.err1 * (b1 + b.err1) + b.err1 * a1 + fresh) * (1 + 4 * _U)
        s = a.s + b.s
        # the true measure A * B = good_a * good_b + bad_a * B + good_a * bad_b
        bad = (a.bad * b.total + b.bad * a.total) * (1 + 4 * _U)
        return _Tilted(a.lower + b.lower, x, s, a.s_err + b.s_err + _U * abs(s), err1, bad,
                       a.total * b.total * (1 + 2 * _U))

    def _above(self, t: _Tilted, eps: float) -> tuple[np.ndarray, np.ndarray, float]:
        """(losses that may exceed eps, their untilted masses x+ e^(s - theta l) as computed, the
        relative error bound of the untilt), cached for the ladder's later, larger eps."""
        cached = self.cache.get(id(t))
        if cached is not None and cached[0] <= eps:
            return cached[1], cached[2], cached[3]
        lpos = (np.arange(t.x.size) + t.lower) * self.d
        # every loss whose exact value may exceed eps (fl(l) within u |l| of it)
        above = lpos > eps - 4 * _U * (abs(eps) + np.abs(lpos))
        la = lpos[above]
        # the untilt's exponent: s's own error, theta l (two roundings), the difference (one), exp
        rho_u = math.expm1((t.s_err + _U * (abs(t.s) + 3 * float(np.abs(self.theta * la).max(initial=0.0))
                                            + ELEMENTARY_ULPS + 1)) * 1.01)
        with np.errstate(over="ignore"):
            v = np.maximum(t.x[above], 0.0) * np.exp(t.s - self.theta * la)
        self.cache[id(t)] = (eps, la, v, rho_u)
        return la, v, rho_u

    def slope(self, t: _Tilted, eps: float) -> float:
        """-dD/d eps of the main term at eps, as computed (sum over losses above eps of the
        untilted mass times e^(eps - l)): only an estimate, to place the ladder's first rung."""
        la, v, _ = self._above(t, eps)
        keep = la > eps
        with np.errstate(over="ignore"):
            return float(np.dot(v[keep], np.exp(eps - la[keep])))

    def delta_bound(self, t: _Tilted, eps: float) -> tuple[float, float]:
        """(upper bound on the exact composition's D(eps), the part of it due to round-off)."""
        la, v, rho_u = self._above(t, eps)
        keep = la > eps - 4 * _U * (abs(eps) + np.abs(la))
        la, v = la[keep], v[keep]
        # an upper bound on the weight 1 - e^(eps - l): the argument within 2.1 u (|eps| + |l|),
        # expm1 assumed within ELEMENTARY_ULPS
        w = (np.maximum(-np.expm1(eps - la), 0.0) * (1 + (ELEMENTARY_ULPS + 1) * _U)
             + 2.1 * _U * (abs(eps) + np.abs(la)))
        main = float(np.dot(v, w))
        # the error term: exact weights <= 1, every loss above eps has e^(-theta l) <= e^(-theta eps)
        log_chernoff = t.s - self.theta * eps + t.s_err
        if log_chernoff > 700:
            return math.inf, math.inf
        err = t.err1 * math.exp(log_chernoff) * (1 + 4 * _U)
        fac = (1 + rho_u) * (1 + gamma(t.x.size + 4))
        total = (fac * (main + err + la.size * _UNDERFLOW) + t.bad) * (1 + 2 * _U)
        if not math.isfinite(total):
            return math.inf, math.inf
        return total, total - fac * main - t.bad


def _leaves(node: Node, mult: int, out: dict[int, tuple[Node, int]]) -> None:
    """Every leaf of the tree with the number of times the exact composition takes it."""
    if node.kind == "leaf":
        prev = out.get(id(node))
        out[id(node)] = (node, mult + (prev[1] if prev else 0))
    else:
        for c in node.children:
            _leaves(c, mult * node.times, out)


def chernoff_theta(node: Node, direction: str, eps: float, *, iterations: int = 40) -> float:
    """The tilt minimising the Chernoff bound at eps of the exact, uncut composition of the tree's
    leaves, prod_leaves M_leaf(theta)^count e^(-theta eps), within _THETA_RANGE: the factor by
    which the certificate's round-off term is multiplied. Its logarithm F is convex in theta, with
    F' = sum of count x the tilted leaf's mean loss - eps and F'' = sum of count x its variance,
    so the minimum is the root of F' (an end of the range where F' keeps one sign there), found by
    Newton's method kept inside a bracket (geometric bisection where a step leaves it) to a
    relative 1e-3 in theta (the bound is flat at its minimum: a closer theta changes nothing
    measurable). A choice only: any theta >= 0 gives a valid certificate."""
    found: dict[int, tuple[Node, int]] = {}
    _leaves(node, 1, found)
    lgs, ls, mults, starts = [], [], [], []
    at = 0
    for leaf_node, mult in found.values():
        pmf = _direction(leaf_node.pld, direction)
        pos = pmf.probs > 0
        if not pos.any():
            continue
        lgs.append(np.log(pmf.probs[pos]))
        ls.append((np.flatnonzero(pos) + pmf.lower_loss) * pmf.discretization)
        mults.append(float(mult))
        starts.append(at)
        at += int(pos.sum())
    if not lgs:
        return _THETA_RANGE[0]
    lg, loss, w, idx = np.concatenate(lgs), np.concatenate(ls), np.array(mults), np.array(starts)
    seg = np.repeat(np.arange(idx.size), np.diff(np.append(idx, lg.size)))

    def slope_curvature(th: float) -> tuple[float, float]:
        v = lg + th * loss
        e = np.exp(v - np.maximum.reduceat(v, idx)[seg])
        el = e * loss
        s0, s1, s2 = (np.add.reduceat(a, idx) for a in (e, el, el * loss))
        mean = s1 / s0
        return float(np.dot(w, mean)) - eps, float(np.dot(w, np.maximum(s2 / s0 - mean * mean, 0.0)))

    lo, hi = _THETA_RANGE
    th = 1.0
    for _ in range(iterations):
        d1, d2 = slope_curvature(th)
        if not math.isfinite(d1):
            break
        if d1 < 0:
            lo = th
        else:
            hi = th
        step = d1 / d2 if d2 > 0 else math.inf
        nxt = th - step
        if not lo < nxt < hi:
            nxt = math.sqrt(lo * hi)
        if hi <= lo * (1 + 1e-3) or abs(nxt - th) <= 1e-3 * th:
            th = nxt
            break
        th = nxt
    # near an end of the range that no point with the other sign of F' has bounded: if F' keeps
    # its sign up to that end, the end is the minimum
    for end, sign in ((_THETA_RANGE[1], -1.0), (_THETA_RANGE[0], 1.0)):
        if (hi if sign < 0 else lo) == end and abs(th - end) <= 1e-2 * end:
            d1, _ = slope_curvature(end)
            if d1 * sign > 0:
                return end
    return th


# ---------------------------------------------------------------------------------------------
# Public entry points


@dataclass(frozen=True)
class Certificate:
    """D_cert(eps), an upper bound on the exact composition's delta at eps (both directions):
    ``bound(eps)``; the tilts used, per direction."""

    bound: Callable[[float], float]
    thetas: dict[str, float]


def _chains(node: Node, epsilon: float, theta: float | None, direction: str | None) -> tuple[list, dict[str, float]]:
    """The tilted chains (and their tilts) of :func:`certificate`."""
    if direction is not None and direction not in DIRECTIONS:
        raise MfcliError(f"unknown PLD direction {direction!r} (remove or add)")
    dirs = (direction,) if direction is not None else DIRECTIONS[:1] if node.pld.symmetric else DIRECTIONS
    chains = []
    thetas = {}
    for dname in dirs:
        th = chernoff_theta(node, dname, epsilon) if theta is None else float(theta)
        chain = _Chain(th, dname, epsilon)
        chains.append((chain, chain.of(node)))
        thetas[dname] = th
    return chains, thetas


def certificate(node: Node, epsilon: float, *, theta: float | None = None,
                direction: str | None = None) -> Certificate:
    """The tilted chains of both directions (one of a symmetric PLD; or the ``direction`` given),
    each tilted by the theta minimising the exact composition's Chernoff bound at ``epsilon``
    (:func:`chernoff_theta`), or by the ``theta`` given (any >= 0 is valid)."""
    chains, thetas = _chains(node, epsilon, theta, direction)

    def bound(eps: float) -> float:
        return max(chain.delta_bound(t, eps)[0] for chain, t in chains)

    return Certificate(bound, thetas)


def delta_bound(node: Node, epsilon: float, *, theta: float | None = None, direction: str | None = None) -> float:
    """D_cert(epsilon): an upper bound on the delta at ``epsilon`` of the exact composition of the
    tree's leaves (the larger direction, or the ``direction`` given), every rounding counted under
    the stated FFT model."""
    return certificate(node, epsilon, theta=theta, direction=direction).bound(float(epsilon))


def certify(node: Node, epsilon: float, delta: float, *, theta: float | None = None,
            direction: str | None = None) -> float:
    """The smallest eps' at which D_cert(eps') <= ``delta``, to 1e-10 relative (a passing eps'
    with a failing one at most 1e-10 max(1, eps') below it, or 0): an epsilon for ``delta`` proven
    for the exact composition of the leaves under the stated FFT model (inf where none is found);
    both directions (the larger), or the ``direction`` given. Searched from ``epsilon`` (the run's
    value): where it fails, up a doubling ladder whose first step is 1.5 Newton steps of the
    failing direction's main term (at least 1e-13, at most 1e-3 relative), then bisected back;
    where it passes, down to a failing point by tangent steps (D is convex and decreasing: the
    tangent at a passing point crosses delta at or below the crossing), then by chords (the chord
    between a failing and a passing point crosses delta at or above it) and a probe 1e-10 below
    each passing chord point. So the answer does not inherit the run's own FFT noise (up to 3e-6
    relative at delta 1e-10), whichever side it fell on. Where the search starts changes how many
    bounds are evaluated, not what is returned beyond the resolution: every eps returned passed
    the check."""
    epsilon = max(float(epsilon), 0.0)
    if not math.isfinite(epsilon):
        return epsilon
    chains, _ = _chains(node, epsilon, theta, direction)

    def passes(eps: float) -> bool:  # D_cert(eps) <= delta in every direction (stops at the first that fails)
        return all(chain.delta_bound(t, eps)[0] <= delta for chain, t in chains)

    if passes(epsilon):
        return _down(chains, epsilon, delta)
    # the first rung: a Newton step on the failing direction's main term (D is convex and
    # decreasing in eps, so the linear step is short of the crossing; 1.5 times it) -- a choice
    # of where the ladder starts only: every returned eps passed the check above
    step = 1e-13 * max(1.0, epsilon)
    for chain, t in chains:
        excess, slope = chain.delta_bound(t, epsilon)[0] - delta, chain.slope(t, epsilon)
        if excess > 0 and slope > 0 and math.isfinite(excess / slope):
            step = max(step, min(1.5 * excess / slope, 1e-3 * max(1.0, epsilon)))
    low = epsilon
    for _ in range(80):
        high = low + step
        if passes(high):  # tighten between the last failing rung and the first passing one
            return _tighten(high, low, passes)
        low = high
        step *= 2.0
    return math.inf


def _tighten(good: float, bad: float, ok: Callable[[float], bool]) -> float:
    """Bisection between ``good`` (where ``ok`` holds) and ``bad`` (where it fails) until they are
    within 1e-10 max(1, the larger): the last point where ``ok`` held (the ladders of
    :func:`certify` and :func:`certify_lower`)."""
    for _ in range(60):
        if abs(good - bad) <= 1e-10 * max(1.0, good, bad):
            break
        mid = 0.5 * (good + bad)
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def _down(chains: list, epsilon: float, delta: float) -> float:
    """:func:`certify` from a passing ``epsilon``: the smallest passing eps to 1e-10 relative (see
    there). The tangent and chord points only steer; each is evaluated, and only an evaluated
    passing point is returned."""

    def bound(eps: float) -> float:
        return max(chain.delta_bound(t, eps)[0] for chain, t in chains)

    def resolution(eps: float) -> float:
        return 1e-10 * max(1.0, eps)

    high, d_high = epsilon, bound(epsilon)
    low, d_low = None, math.nan
    for _ in range(40):  # tangent steps down until one fails (each passing one is the new high)
        if high <= 0.0:
            return 0.0
        slope = max(chain.slope(t, high) for chain, t in chains)
        gap = (delta - d_high) / slope if slope > 0 else math.inf
        step = min(max(gap, resolution(high)), high) if math.isfinite(gap) else high
        cand = high - step
        d_cand = bound(cand)
        if d_cand > delta:
            low, d_low = cand, d_cand
            break
        high, d_high = cand, d_cand
    if low is None:
        return high
    for i in range(60):
        if high - low <= resolution(high):
            return high
        probe = high - 0.5 * resolution(high)
        if i % 2 == 0 and probe > low:  # the passing end may already be the answer
            d_probe = bound(probe)
            if d_probe > delta:
                return high
            high, d_high = probe, d_probe
            continue
        # the chord's crossing (kept inside the bracket; bisection where it would not move)
        w = (d_low - delta) / (d_low - d_high) if d_low > d_high else 0.5
        cand = low + min(max(w, 0.01), 0.99) * (high - low)
        d_cand = bound(cand)
        if d_cand <= delta:
            high, d_high = cand, d_cand
        else:
            low, d_low = cand, d_cand
    return high


def certified_epsilon(node: Node, delta: float) -> float:
    """The smallest epsilon for ``delta`` that :func:`certify` proves for the exact composition of
    the recorded tree's leaves, searched from the run's PLD's own epsilon (which it may end above
    or below: the run's FFT noise falls on either side)."""
    # only the search's start (it goes up or down from there): numpy's exp, not libm's per loss
    return certify(node, float(pld_ops.epsilon_for_delta(node.pld, delta, bit_for_bit=False)), delta)


# ---------------------------------------------------------------------------------------------
# The lower side: a proven lower bound on the exact composition's delta


class _LowerChain(_Chain):
    """The tree of one direction redone on tilted PMFs for a LOWER bound on D(eps).

    As :class:`_Chain`, except that a self-composition is a binary power of linear compositions
    (:meth:`_Chain._compose`: direct, or a real FFT zero-padded to at least the full support),
    never the run's circular power on its window. So nothing wraps round (no aliases, which are
    non-negative and would have to be bounded from above and subtracted), and the only cuts are
    the tails that :func:`_trimmed` drops (a lower bound may drop mass): the exact composition's
    finite mass at the loss l_i is at least x*_i e^(s* - theta l_i), x* the exact arithmetic's
    tilted values of the kept (restricted) measures (sum |x_i - x*_i| <= ``err1``), s* the exact
    sum of the leaves' computed log M. Why linear: the tilted law of a k-fold is about sqrt(k)
    times a leaf's width once its tails are trimmed, so its real FFTs are cheap next to the epoch's
    own law. ``bad`` and ``total`` are carried but not used: the leaves' infinity masses only add
    to D, which a lower bound may leave out."""

    def _leaf(self, p: pld_ops.Pmf) -> _Tilted:
        return _trimmed(super()._leaf(p))

    def _compose(self, a: _Tilted, b: _Tilted) -> _Tilted:
        return _trimmed(super()._compose(a, b))

    def _self(self, node: Node) -> _Tilted:
        power = self.of(node.children[0])
        k = node.times
        result: _Tilted | None = None
        while k:
            if k & 1:
                result = power if result is None else self._compose(result, power)
            k >>= 1
            if k:
                power = self._compose(power, power)
        if result is None:
            raise MfcliError("a PLD can only be composed a positive number of times")
        return result

    def delta_lower(self, t: _Tilted, eps: float) -> float:
        """A lower bound on the exact composition's D(eps) (may be negative: then it says nothing).

        D*(eps) >= sum over losses surely above eps of x*_i E*_i w*_i, E*_i = e^(s* - theta l*_i),
        w*_i = 1 - e^(eps - l*_i) in [0, 1] (the other losses and the infinity mass only add), and
        x*_i >= x+_i - |x_i - x*_i| (x* >= 0), so D* >= sum x+_i E*_i w*_i - err1 e^(s* - theta eps)
        (every kept l*_i > eps, theta >= 0). Each factor is bounded from below with its rounding."""
        lpos = (np.arange(t.x.size) + t.lower) * self.d
        # fl(l) is within u |l| of the exact loss: keep the losses surely above eps
        keep = lpos > eps + 4 * _U * (abs(eps) + np.abs(lpos))
        la = lpos[keep]
        if la.size == 0:
            return 0.0
        xa = np.maximum(t.x[keep], 0.0)
        # the untilt e^(s - theta l): s's own error, theta l (its rounding and l's), the difference,
        # exp (ELEMENTARY_ULPS), and the two products below
        rho_u = math.expm1((t.s_err + _U * (abs(t.s) + 3 * float(np.abs(self.theta * la).max())
                                            + ELEMENTARY_ULPS + 3)) * 1.01)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            v = xa * np.exp(t.s - self.theta * la)
            # a lower bound on 1 - e^(eps - l*): eps - l* <= fl(eps - fl(l)) + 2.01 u (|eps| + |l|),
            # raised by 4 u (...) to cover the addition's rounding too (-expm1 is decreasing), and
            # expm1 within ELEMENTARY_ULPS
            arg = np.minimum(eps - la + 4 * _U * (abs(eps) + np.abs(la)), 0.0)
            w = -np.expm1(arg) * (1 - (ELEMENTARY_ULPS + 2) * _U)
            terms = v * w
        terms[~np.isfinite(terms)] = 0.0  # left out (an overflowed untilt): every exact term is >= 0
        # a sum of non-negative terms within gamma_n; each term within rho_u of x+ E* w_low; the
        # factors 1 - gamma and 1 - rho_u within u / 2 as floats, and the three products: 1 - 6 u
        main = float(terms.sum()) * (1 - gamma(la.size + 4)) * (1 - rho_u) * (1 - 6 * _U)
        # the round-off term, bounded from above: e^(s* - theta eps) <= e^(s + s_err - theta eps), the
        # exponent's roundings (theta eps, two sums, this margin's) and exp's error allowed for
        log_ch = t.s - self.theta * eps + t.s_err
        log_ch += 4 * _U * (abs(t.s) + abs(self.theta * eps) + t.s_err + 1)
        if log_ch > 700:
            return -math.inf
        err = t.err1 * math.exp(log_ch) * (1 + (ELEMENTARY_ULPS + 4) * _U)
        # terms whose untilt or product fell below the normal range: within 2^-1022 absolute each
        sub = (err + 4 * la.size * _UNDERFLOW) * (1 + 2 * _U)
        low = main - sub  # one rounding: (main - sub)(1 + u) at most when positive
        return low * (1 - 3 * _U) if low > 0 else low


#: The lower chain drops the ends of each node's tilted values whose total is at most this share
#: of the node's err1 (on each side: half of it): a lower bound may drop mass, so any cut is valid;
#: this one costs at most TRIM_SHARE times the round-off term already subtracted per cut, and keeps
#: a k-fold's length near the tilted law's width (about sqrt(k)) instead of its support (k N).
TRIM_SHARE = 1e-3


def _trimmed(t: _Tilted) -> _Tilted:
    """``t`` without the ends of x whose |x| total at most TRIM_SHARE err1 / 2 on each side. Valid
    for the lower chain whatever the cut: x* restricted to the kept positions is a measure below
    the exact one (x* >= 0), the kept x is within err1 of it in l1, and every later composition of
    it is below the exact composition."""
    budget = 0.5 * TRIM_SHARE * t.err1
    mag = np.abs(t.x)
    left = int(np.searchsorted(np.cumsum(mag), budget, side="right"))
    right = int(np.searchsorted(np.cumsum(mag[::-1]), budget, side="right"))
    if left == 0 and right == 0:
        return t
    if left + right >= t.x.size:  # everything within the budget: keep the largest entry
        i = int(np.argmax(mag))
        left, right = i, t.x.size - i - 1
    return replace(t, lower=t.lower + left, x=t.x[left:t.x.size - right].copy(), _norms=None)


def _lower_chains(node: Node, epsilon: float, theta: float | None,
                  direction: str | None) -> list[tuple[_LowerChain, _Tilted]]:
    """The lower chains of each direction (one of a symmetric PLD; or the ``direction`` given),
    tilted as :func:`certificate`'s are (:func:`chernoff_theta` at ``epsilon``, or ``theta``)."""
    if direction is not None and direction not in DIRECTIONS:
        raise MfcliError(f"unknown PLD direction {direction!r} (remove or add)")
    dirs = (direction,) if direction is not None else DIRECTIONS[:1] if node.pld.symmetric else DIRECTIONS
    found: dict[int, tuple[Node, int]] = {}
    _leaves(node, 1, found)
    chains = []
    for dname in dirs:
        if not all(np.any(_direction(lf.pld, dname).probs > 0) for lf, _ in found.values()):
            continue  # a leaf without finite mass: the composition has none, its D is its infinity mass (left out)
        th = chernoff_theta(node, dname, epsilon) if theta is None else float(theta)
        chain = _LowerChain(th, dname, epsilon)
        chains.append((chain, chain.of(node)))
    return chains


def lower_delta_bound(node: Node, epsilon: float, *, theta: float | None = None,
                      direction: str | None = None) -> float:
    """A proven lower bound on the delta at ``epsilon`` of the exact composition of the tree's
    leaves (the larger direction's, or the ``direction`` given): the tree redone by linear
    compositions of tilted PMFs, the round-off bounded under the stated FFT model (direct
    convolutions, within gamma_n, for the small products), subtracted. May be negative."""
    eps = float(epsilon)
    return max((chain.delta_lower(t, eps) for chain, t in _lower_chains(node, eps, theta, direction)), default=0.0)


def certify_lower(node: Node, epsilon: float, delta: float, *, theta: float | None = None,
                  direction: str | None = None) -> float:
    """The largest eps' <= ``epsilon`` on a doubling ladder down, then bisected to 1e-10 relative,
    at which :func:`lower_delta_bound` > ``delta`` in some direction: the exact composition's
    delta at eps' exceeds ``delta``, so its epsilon for ``delta`` is >= eps' (0.0 where none is
    found). The first step is 1.5 Newton steps of the main term (at least 1e-13, at most 1e-3
    relative): where the ladder starts changes the work, not the validity (every eps' returned
    passed the check). An infinite ``epsilon`` (the run's, where its infinity mass reaches delta)
    starts from the composition's largest loss; the chains are tilted again for an eps more than
    1 % from the one they were tilted for (``theta`` None)."""
    epsilon = float(epsilon)
    if not epsilon > 0:
        return 0.0
    if not math.isfinite(epsilon):
        # the exact composition's D is its infinity mass (left out) at and above its largest loss
        found: dict[int, tuple[Node, int]] = {}
        _leaves(node, 1, found)
        epsilon = max(sum(m * (_direction(lf.pld, dn).lower_loss + _direction(lf.pld, dn).size - 1)
                          * _direction(lf.pld, dn).discretization for lf, m in found.values()) for dn in DIRECTIONS)
        if not epsilon > 0:
            return 0.0
    chains = _lower_chains(node, epsilon, theta, direction)
    aim = [epsilon]  # the eps the chains are tilted for

    def passes(eps: float) -> bool:
        nonlocal chains
        if theta is None and abs(eps - aim[0]) > 0.01 * aim[0]:
            # away from the tilt's aim the round-off term (relative to the Chernoff bound at the
            # aim's tilt) can swamp D: tilt again for this eps (a choice only; any tilt is valid)
            chains, aim[0] = _lower_chains(node, eps, None, direction), eps
        return any(chain.delta_lower(t, eps) > delta for chain, t in chains)

    if passes(epsilon):
        return epsilon
    step = 1e-13 * max(1.0, epsilon)
    for chain, t in chains:
        short, slope = delta - chain.delta_lower(t, epsilon), chain.slope(t, epsilon)
        if slope > 0 and math.isfinite(short / slope):
            step = max(step, min(1.5 * short / slope, 1e-3 * max(1.0, epsilon)))
    high = epsilon
    for _ in range(80):
        low = max(high - step, 0.0)
        if passes(low):
            return _tighten(low, high, passes)
        if low == 0.0:
            return 0.0
        high = low
        step *= 2.0
    return 0.0
