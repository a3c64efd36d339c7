"""How far the FFT round-off of PLD composition moves the hockey-stick curve and epsilon, measured
against a reference, and a bound on it (docs/performance.md, "FFT round-off of PLD composition").

What it does, per case:

1. Runs the accounting with pld_ops' ``self_compose`` / ``compose`` / ``epsilon_for_delta``
   recorded (same code, wrapped), keeping every input, output and the target delta.
2. Replays every recorded operation in a *reference* arithmetic on the SAME discrete choices as
   the run (the same FFT lengths and Chernoff windows, hence the same aliasing, the same tail-cut
   indices; only the values differ): long double (64-bit significand, unit roundoff 2^-64, 2048 x
   smaller than double's) FFTs via scipy.fft, or, for pairwise compositions of at most
   ``DIRECT_MAX`` points, a direct long-double convolution (a sum of non-negative products, relative
   error <= gamma_N in any order: independent of any FFT).
3. Compares the run's final PMF with the reference's: largest |error| per entry, the hockey-stick
   D(eps) = sum_i p_i (1 - e^(eps - l_i))_+ + p_inf (in long double) at the run's epsilon, and the
   epsilon of each at the target delta.
4. Bounds the error a priori / a posteriori (the "bound" columns) under an assumption on the FFT's
   accuracy (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Thm 24.2, form
   ||fl(F x) - F x||_2 <= eta log2(n) ||F x||_2; here eta = ``ETA_U`` u and the per-coefficient form
   |fl(F x)_j - (F x)_j| <= eta log2(n) ||x||_1), which ``--check-assumption`` tests against long
   double on random and PMF-shaped inputs of pocketfft's lengths. The bound on D at eps, added to
   the infinity mass, gives the "cost" columns: the epsilon it certifies against the run's.
5. Prototypes a certificate: every recorded operation redone once more on exponentially tilted
   PMFs (:class:`TiltedChain`; for a self-composition, one more FFT power):
   its round-off is relative to D, not to the bulk;
   ``--tilt-selftest`` holds it against the true (unwindowed, unaliased) composition on a coarser
   grid.

Usage:  python scripts/check_fft_roundoff.py [--cases a,b,c,c10,d] [--check-assumption] [--tilt-selftest]
(about 1 minute of CPU for everything; nothing under mfcli/ is changed)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import fft

from mfcli.accounting import pld_certify, pld_ops

LD = np.longdouble
U = 2.0 ** -53
#: Assumed constant of the FFT error model, in units of u: Higham's eta = mu + gamma_4 (sqrt 2 + mu)
#: for radix 2 with twiddles within mu; pocketfft forms its twiddles as products of two table
#: entries (mu about 3 u), so eta about 8.7 u; 10 u leaves room for its radix 3, 5, 7, 11 passes.
ETA_U = 10.0
#: Pairwise compositions up to this many points (the longer input) are replayed by direct convolution.
DIRECT_MAX = 6000


def gamma(k: float) -> float:
    return k * U / (1 - k * U)


# ---------------------------------------------------------------------------------------------
# 1. Recording a run


@dataclass
class Event:
    kind: str            # "self", "compose", "eps"
    where: str
    args: tuple
    out: Any


def _caller() -> str:
    for fr in traceback.extract_stack()[::-1]:
        for m in ("mmcc.py", "single_pass.py", "reduction.py", "multi.py"):
            if m in fr.filename:
                return m[:-3] + "." + fr.name
    return "?"


@contextlib.contextmanager
def recording():
    events: list[Event] = []
    orig = pld_ops.self_compose, pld_ops.compose, pld_ops.epsilon_for_delta
    o_sc, o_c, o_e = orig

    def sc(pld, n, t=pld_ops.TAIL_MASS_TRUNCATION):
        out = o_sc(pld, n, t)
        events.append(Event("self", _caller(), (pld, n, t), out))
        return out

    def c(a, b, t=pld_ops.TAIL_MASS_TRUNCATION):
        out = o_c(a, b, t)
        events.append(Event("compose", _caller(), (a, b, t), out))
        return out

    def e(pld, delta):
        out = o_e(pld, delta)
        events.append(Event("eps", _caller(), (pld, delta), out))
        return out

    meths = pld_ops.Pld.compose, pld_ops.Pld.self_compose
    pld_ops.self_compose, pld_ops.compose, pld_ops.epsilon_for_delta = sc, c, e
    pld_ops.Pld.compose = lambda self, o, t=pld_ops.TAIL_MASS_TRUNCATION: c(self, o, t)  # type: ignore[method-assign,assignment]
    pld_ops.Pld.self_compose = lambda self, n, t=pld_ops.TAIL_MASS_TRUNCATION: sc(self, n, t)  # type: ignore[method-assign,assignment]
    try:
        yield events
    finally:
        pld_ops.self_compose, pld_ops.compose, pld_ops.epsilon_for_delta = orig
        pld_ops.Pld.compose, pld_ops.Pld.self_compose = meths  # type: ignore[method-assign]


def run_cli(argv: list[str]) -> None:
    import typer.main

    from mfcli.cli.app import app

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(SystemExit):
            typer.main.get_command(app).main(argv, standalone_mode=False)


# ---------------------------------------------------------------------------------------------
# 2. Reference replay (long double, same discrete choices) with the bound carried along


@dataclass
class RefPmf:
    """A direction in the reference arithmetic, on the run's grid window, with ``err1``: the bound
    on sum_i |run_i - exact_i| + |run_inf - exact_inf| (l1, what a hockey-stick value can move)."""
    lower: int
    probs: np.ndarray        # long double
    inf: LD
    err1: float = 0.0


def _ref_of_input(p: pld_ops.Pmf) -> RefPmf:
    # inputs that no recorded operation made (the mixture PMFs): exact by definition
    return RefPmf(p.lower_loss, p.probs.astype(LD), LD(p.infinity_mass), 0.0)


def _alpha(n: int) -> float:
    """Higham's Thm 24.2 factor log2(n) eta / (1 - log2(n) eta), eta = ETA_U u (the assumed model)."""
    t = ETA_U * U * math.log2(n)
    return t / (1 - t)


def _conv_ld(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if max(a.size, b.size) <= DIRECT_MAX or min(a.size, b.size) == 1:
        return np.convolve(a, b)  # direct: sums of products, long double
    shape = a.size + b.size - 1
    n = fft.next_fast_len(shape, True)
    return fft.irfft(fft.rfft(a, n) * fft.rfft(b, n), n)[:shape]


def _compose_bound(a: pld_ops.Pmf, b: pld_ops.Pmf) -> float:
    """Bound on ||fl(conv) - conv||_2 of the run's inputs (pld_ops._fftconvolve): forward
    transforms within alpha sqrt(n) ||x||_2 (2-norm) and alpha ||x||_1 (per coefficient); |F x|_j <=
    ||x||_1; the product within sqrt2 gamma_2; the inverse within alpha of its exact output."""
    if a.size == 1 or b.size == 1:
        return 0.0
    shape = a.size + b.size - 1
    n = fft.next_fast_len(shape, True)
    al = _alpha(n)
    a1, b1 = float(np.abs(a.probs).sum()) * (1 + gamma(a.size)), float(np.abs(b.probs).sum()) * (1 + gamma(b.size))
    a2, b2 = float(np.linalg.norm(a.probs)) * (1 + gamma(a.size)), float(np.linalg.norm(b.probs)) * (1 + gamma(b.size))
    prod = al * (a2 * b1 + a1 * b2) + al * al * a2 * b1  # ||z_hat - z||_2 / sqrt(n), first part
    zhat = (1 + al) ** 2 * min(a1 * b2, a2 * b1)            # ||z_hat||_2 / sqrt(n)
    return (prod + math.sqrt(2) * gamma(2) * zhat + al * zhat * (1 + math.sqrt(2) * gamma(2))) * (1 + 4 * U)


def _self_bound(p: pld_ops.Pmf, k: int, n: int) -> float:
    """Bound on ||fl(ifft(fft(p)^k)) - ifft(fft(p)^k)||_2 over the n circular outputs."""
    p1 = float(np.abs(p.probs).sum()) * (1 + gamma(p.size))
    p2 = float(np.linalg.norm(p.probs)) * (1 + gamma(p.size))
    return _self_bound_norms(p1, p2, k, n)


def _self_bound_norms(p1: float, p2: float, k: int, n: int) -> float:
    """:func:`_self_bound` from upper bounds p1 >= ||p||_1, p2 >= ||p||_2 of the input.

    Forward: ||y_hat - y||_2 <= alpha sqrt(n) p2 and |y_j|, |y_hat_j| <= m = p1 (1 + alpha) (the
    assumed FFT model). Power: |y_hat^k - y^k| <= k |y_hat - y| m^(k - 1), so
    ||y_hat^k - y^k||_2 / sqrt(n) <= k alpha p2 m^(k - 1). The power's own rounding: numpy's binary
    powering for k < 100 (complex products each within sqrt2 gamma_2 relative, Higham Lemma 3.5;
    an early square's error is raised by every later squaring, so (1 + sqrt2 gamma_2)^(k - 1) - 1
    in all; mfcli.util.floating.integer_power_rounding, the library's own powering for every k);
    for k >= 100 numpy calls cpow (glibc: cexp(k clog y)), here ASSUMED
    within 8 u (1 + k pi + k |log|y||) relative, whose last term is at most (2 / e) |y|^(k/2)
    absolute. Inverse: within alpha of its exact output, ||ifft(z)||_2 = ||z||_2 / sqrt(n)."""
    al = _alpha(n)
    m = p1 * (1 + al)
    spread = k * al * p2 * m ** (k - 1)                 # ||y_hat^k - y^k||_2 / sqrt(n)
    y2 = (1 + al) * p2                                   # ||y_hat||_2 / sqrt(n)
    zhat = m ** (k - 1) * y2                             # ||y_hat^k||_2 / sqrt(n)
    if k < 100:
        g_pow = (1 + math.sqrt(2) * gamma(2)) ** (k - 1) - 1
        pow_err = g_pow * zhat
    else:
        g_pow = 8 * U * (1 + k * math.pi + k * max(0.0, math.log(m)))
        pow_err = g_pow * zhat + 8 * U * (2 / math.e) * m ** max(0, k // 2 - 1) * y2
    return (spread + pow_err + al * (zhat + pow_err)) * (1 + 4 * U)


def replay_self(p: pld_ops.Pmf, k: int, out: pld_ops.Pmf, ref_in: RefPmf | None,
                tail: float) -> tuple[RefPmf, dict]:
    """Reference of _self_compose_dense on the run's window (out.lower_loss, out.size)."""
    assert not p.sparse, "sparse self-composition not replayed here"
    lo = out.lower_loss - p.lower_loss * k
    length = out.size
    n = fft.next_fast_len(max(length, p.size))
    x = (ref_in.probs if ref_in is not None else p.probs.astype(LD))
    full = np.real(fft.ifft(fft.fft(x, n) ** k))
    probs = np.roll(full, -lo)[:length]
    inf = LD(tail) - np.expm1(LD(k) * np.log1p(-LD(p.infinity_mass)))
    e2 = _self_bound(p, k, n)
    ref = RefPmf(out.lower_loss, probs, inf, 0.0)
    return ref, {"n": n, "bound2": e2, "in_err1": 0.0 if ref_in is None else ref_in.err1}


def replay_compose(a: pld_ops.Pmf, b: pld_ops.Pmf, out: pld_ops.Pmf, ra: RefPmf, rb: RefPmf) -> tuple[RefPmf, dict]:
    full = _conv_ld(ra.probs, rb.probs)
    left = out.lower_loss - a.lower_loss - b.lower_loss
    right = left + out.size
    probs = full[left:right].copy()
    probs[0] += full[:left].sum()
    inf = ra.inf + rb.inf - ra.inf * rb.inf + full[right:].sum()
    e2 = _compose_bound(a, b)
    shape = a.size + b.size - 1
    # l1 error: propagated (||e_a * b||_1 <= ||e_a||_1 ||b||_1, b's exact mass <= its computed l1 +
    # its error), the fresh FFT error over the `shape` outputs (l1 <= sqrt(shape) l2), the cut sums
    a1, b1 = float(np.abs(a.probs).sum()) + a.infinity_mass, float(np.abs(b.probs).sum()) + b.infinity_mass
    err1 = (ra.err1 * (b1 + rb.err1) + rb.err1 * a1 + math.sqrt(shape) * e2
            + gamma(shape) * (float(np.abs(out.probs).sum()) + out.infinity_mass) + 4 * U)
    return RefPmf(out.lower_loss, probs, inf, err1), {"bound2": e2}


# ---------------------------------------------------------------------------------------------
# 3. Hockey stick, epsilon (long double)


def hockey(probs: np.ndarray, lower: int, inf: float, d: float, eps: float) -> LD:
    """D(eps) = sum_i p_i (1 - e^(eps - l_i))_+ + p_inf over the entries with l_i > eps."""
    k0 = max(0, math.floor(eps / d) - lower - 1)
    p = np.asarray(probs[k0:], dtype=LD)
    losses = (np.arange(k0, probs.size, dtype=LD) + LD(lower)) * LD(d)
    w = -np.expm1(LD(eps) - losses)
    w[w < 0] = 0
    return (p * w).sum() + LD(inf)


def eps_for(probs, lower, inf, d, delta, hi=None) -> float:
    """Smallest eps with D(eps) <= delta (bisection, 60 steps, long double D)."""
    lo_e, hi_e = 0.0, hi if hi is not None else (lower + len(probs)) * d
    if hockey(probs, lower, inf, d, 0.0) <= delta:
        return 0.0
    for _ in range(64):
        mid = 0.5 * (lo_e + hi_e)
        if hockey(probs, lower, inf, d, mid) <= delta:
            hi_e = mid
        else:
            lo_e = mid
    return hi_e


def count_above(lower: int, size: int, d: float, eps: float) -> int:
    return max(0, lower + size - 1 - math.floor(eps / d))


# ---------------------------------------------------------------------------------------------
# 3b. A certificate by an exponentially tilted FFT (prototype)


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    return m + math.log(float(np.exp(x - m).sum()))


@dataclass
class TNode:
    """A direction in the tilted domain: the untilted mass at grid index ``lower + i`` is
    x_i exp(s - theta (lower + i) d) (plus non-negative aliases, see :class:`TiltedChain`);
    ``err1`` bounds sum_i |x_i - exact_i| (computed against exact tilted values); ``inf`` is an
    upper bound on the untilted infinity mass; ``s_err`` bounds |s - exact s| (s's own roundings:
    the exact relation holds with the sum of the leaves' computed log M, times k)."""
    lower: int
    x: np.ndarray
    s: float
    inf: float
    err1: float
    s_err: float = 0.0


class TiltedChain:
    """A certified upper bound on D(eps) of a recorded composition tree, each operation redone on
    exponentially tilted PMFs q_j = p_j e^(theta l_j) / M(theta) (M = sum_j p_j e^(theta l_j)):

    * exactness: tilting commutes with convolution ((a e^(theta l)) * (b e^(theta l)) =
      (a * b) e^(theta l), losses add), so the exact untilted masses are x_i e^(s - theta l_i), s
      the sum of the leaves' log M (times k for a k-fold composition);
    * round-off: the FFT's absolute error on x (the same model and bounds as the run's, with the
      tilted norms, ||q||_1 = 1), carried in l1 through the tree, moves D by at most
      e^(s - theta eps) err1 (every loss above eps has e^(-theta l) < e^(-theta eps)): the
      Chernoff bound of the composition at eps times err1, i.e. relative to D, not to the bulk;
    * windows: a self-composition uses the run's circular length n and window [lo, lo + length)
      (in exact arithmetic each position holds its own mass plus non-negative aliases: an upper
      bound). The true mass OUTSIDE the window, below lo and above lo + length - 1, is at most
      tail / 2 per side by dp-accounting's Chernoff bounds, so at most the run's tail charge in
      its infinity mass, which is taken over here -- up to the rounding of the computed window
      ends (a relative e^(k Delta) on the tail, Delta ~ 2 L u: not counted in this prototype; the
      library's certificate, mfcli.accounting.pld_certify, counts it and composes the charges
      with the total masses). Aliases wrapped DOWN into the window count e^(theta n d) times after
      the untilt: valid but loose (the library raises n until they are negligible). Pairwise
      compositions are NOT cut (the run's cuts only move mass up; here nothing moves), so the
      tree's lengths add up;
    * the tilt's roundings: q_j within rho_q relative (np.exp ASSUMED within 4 ulps), a k-fold
      composition of non-negative inputs within (1 + rho_q)^k - 1; the untilt's exp within rho_u.
    """

    def __init__(self, events: list[Event], theta: float) -> None:
        self.theta = theta
        self.nodes: dict[int, TNode] = {}
        self.d = 0.0
        for ev in events:
            if ev.kind == "self":
                pld, k, _ = ev.args
                for p, o in paired(ev.out, pld):
                    if id(o) not in self.nodes:
                        assert id(p) not in self.nodes, "self-composition of a computed PMF: not covered"
                        self.nodes[id(o)] = self._self(p, k, o)
            elif ev.kind == "compose":
                a, b, _ = ev.args
                for pa, pb, o in paired(ev.out, a, b):
                    if id(o) not in self.nodes:
                        na = self.nodes.get(id(pa)) or self._leaf(pa)
                        nb = self.nodes.get(id(pb)) or self._leaf(pb)
                        self.nodes[id(o)] = self._compose(na, nb)

    def _tilt(self, p: pld_ops.Pmf) -> tuple[np.ndarray, float, float]:
        d = self.d = p.discretization
        lj = (np.arange(p.size) + p.lower_loss) * d
        pos = p.probs > 0
        lp = np.full(p.size, -np.inf)
        lp[pos] = np.log(p.probs[pos])
        log_m = _logsumexp(lp + self.theta * lj)  # any value: a common factor, cancelled by the untilt
        # q_j = p_j exp(theta l_j - log M): l_j (one rounding), theta l_j (one), - log M (one, of
        # the argument), exp (ASSUMED <= 4 u), the product (one); no log of p_j (its error would
        # scale with |log p_j|); a result in the subnormal range is within 2^-1075 absolute
        q = p.probs * np.exp(self.theta * lj - log_m)
        rho_q = U * (3 * self.theta * float(np.abs(lj).max()) + abs(log_m) + 5) * 1.01
        return q, log_m, rho_q

    def _leaf(self, p: pld_ops.Pmf) -> TNode:
        q, log_m, rho_q = self._tilt(p)
        # relative rho_q per entry; an entry that underflowed to 0 was below 2.3e-308
        return TNode(p.lower_loss, q, log_m, p.infinity_mass, rho_q * float(q.sum()) * 1.01 + q.size * 2.3e-308)

    def _self(self, p: pld_ops.Pmf, k: int, out: pld_ops.Pmf) -> TNode:
        q, log_m, rho_q = self._tilt(p)
        lo = out.lower_loss - p.lower_loss * k
        n = fft.next_fast_len(max(out.size, p.size))
        x = np.roll(np.real(fft.ifft(fft.fft(q, n) ** k)), -lo)
        e2 = _self_bound_norms(float(q.sum()) * (1 + gamma(q.size)), float(np.linalg.norm(q)) * (1 + gamma(q.size)), k, n)
        fresh = math.sqrt(n) * e2 + k * q.size * 2.3e-308
        err1 = fresh + ((1 + rho_q) ** k - 1) * (float(np.abs(x).sum()) * (1 + gamma(n)) + fresh)
        return TNode(p.lower_loss * k + lo, x, k * log_m, out.infinity_mass, err1, U * abs(k * log_m))

    def _compose(self, a: TNode, b: TNode) -> TNode:
        x = pld_ops._fftconvolve(a.x, b.x)
        e2 = _compose_bound(pld_ops.Pmf(self.d, 0, a.x, 0.0), pld_ops.Pmf(self.d, 0, b.x, 0.0))
        a1 = float(np.abs(a.x).sum()) * (1 + gamma(a.x.size))
        b1 = float(np.abs(b.x).sum()) * (1 + gamma(b.x.size))
        err1 = a.err1 * (b1 + b.err1) + b.err1 * a1 + math.sqrt(x.size) * e2
        inf = (a.inf + b.inf - a.inf * b.inf) * (1 + 4 * U)
        return TNode(a.lower + b.lower, x, a.s + b.s, inf, err1 * (1 + 4 * U), a.s_err + b.s_err + U * abs(a.s + b.s))

    def delta_bound(self, pmf: pld_ops.Pmf, eps: float) -> tuple[float, float]:
        """(certified upper bound on D_exact(eps) of the direction the run returned as ``pmf``,
        its round-off part)."""
        node = self.nodes[id(pmf)]
        lpos = (np.arange(node.x.size) + node.lower) * self.d
        # every loss whose exact value may exceed eps (fl(l) within u |l| of it), with an upper
        # bound on its weight 1 - e^(eps - l): the argument within 2.1 u (|eps| + |l|), expm1
        # ASSUMED within 4 u
        above = lpos > eps - 4 * U * (abs(eps) + np.abs(lpos))
        la = lpos[above]
        expo = node.s - self.theta * la
        # the untilt's exponent: s's own error, theta l (two roundings), the difference (one), exp (4 u)
        rho_u = (node.s_err + U * (abs(node.s) + 3 * float(np.abs(self.theta * la).max(initial=0.0)) + 5)) * 1.01
        rho_u = math.expm1(rho_u)
        w = np.maximum(-np.expm1(eps - la), 0.0) * (1 + 5 * U) + 2.1 * U * (abs(eps) + np.abs(la))
        main = float((np.maximum(node.x[above], 0) * np.exp(expo) * w).sum())
        err = node.err1 * math.exp(node.s - self.theta * eps) * (1 + 1e-12)  # weights <= 1 + 1e-12
        fac = (1 + rho_u) * (1 + gamma(node.x.size + 4))
        total = fac * (main + err) + node.inf * (1 + 4 * U)
        return total, total - main - node.inf

    def epsilon(self, pmf: pld_ops.Pmf, delta: float, hi: float) -> float:
        if self.delta_bound(pmf, hi)[0] > delta:
            return math.inf
        lo_e = 0.0
        for _ in range(64):
            mid = 0.5 * (lo_e + hi)
            if self.delta_bound(pmf, mid)[0] <= delta:
                hi = mid
            else:
                lo_e = mid
        return hi


def chernoff_theta(pmf: pld_ops.Pmf, eps: float) -> float:
    """The tilt minimising the Chernoff bound sum_i p_i e^(theta (l_i - eps)) of the run's PMF (a
    choice only: any theta > 0 gives a valid certificate)."""
    pos = pmf.probs > 0
    lg = np.log(pmf.probs[pos])
    ls = (np.flatnonzero(pos) + pmf.lower_loss) * pmf.discretization - eps
    grid = np.geomspace(0.01, 5.0, 60)
    vals = [_logsumexp(lg + th * ls) for th in grid]
    return float(grid[int(np.argmin(vals))])


# ---------------------------------------------------------------------------------------------
# 4. Cases


def record_case(name: str) -> tuple[list[Event], str]:
    with recording() as events:
        if name == "a":
            run_cli(["account", "--json", "--strategy", "identity", "--n", "64", "--sigma", "0.6", "--sampling", "0.3",
                     "--delta", "1e-10"])
            where = "mmcc."
        elif name == "b":
            run_cli(["account", "--json", "--sigma", "4", "--sampling", "0.01"])
            where = "mmcc."
        elif name == "d":
            run_cli(["account", "--json", "--strategy", "tree", "--n", "64", "--sigma", "8", "--sampling", "0.05",
                     "--delta", "1e-10"])
            where = "mmcc."
        elif name in ("c", "c10"):
            from mfcli.accounting import single_pass

            single_pass._poisson_gaussian_epsilon(1.0, 0.1, 256, 1e-6 if name == "c" else 1e-10, 1e-4)
            where = "single_pass."
        else:
            raise SystemExit(f"unknown case {name}")
    return [e for e in events if e.where.startswith(where)], where


def directions(pld: pld_ops.Pld) -> list[tuple[str, pld_ops.Pmf]]:
    return [("remove", pld.remove)] + ([] if pld.symmetric else [("add", pld.add_pmf)])


def paired(out: pld_ops.Pld, *ins: pld_ops.Pld) -> list[tuple[pld_ops.Pmf, ...]]:
    """(inputs' PMFs..., output's PMF) per direction of the output (a symmetric input serves both)."""
    rows = [(*(p.remove for p in ins), out.remove)]
    if not out.symmetric:
        rows.append((*(p.add_pmf for p in ins), out.add_pmf))
    return rows


def replay(events: list[Event]) -> tuple[dict, dict]:
    refs: dict[int, RefPmf] = {}
    last: dict[int, tuple[str, dict, Event]] = {}
    for ev in events:
        if ev.kind == "self":
            pld, k, tail = ev.args
            for p, o in paired(ev.out, pld):
                if id(o) in refs:
                    continue
                rin = refs.get(id(p))
                assert rin is None, "self-composition of a computed PMF: not covered"
                ref, info = replay_self(p, k, o, rin, tail)
                ref.err1 = math.sqrt(o.size) * info["bound2"] + 8 * U * (1 + k)  # l1 over the window + inf mass
                refs[id(o)] = ref
                last[id(o)] = ("self", info, ev)
        elif ev.kind == "compose":
            a, b, _ = ev.args
            for pa, pb, o in paired(ev.out, a, b):
                if id(o) in refs:
                    continue
                ra = refs.get(id(pa)) or _ref_of_input(pa)
                rb = refs.get(id(pb)) or _ref_of_input(pb)
                ref, info = replay_compose(pa, pb, o, ra, rb)
                info["in"] = (pa, pb, ra, rb)
                if min(pa.size, pb.size) == 1:  # exact product by one number: keep the other's bound form
                    big, small = (pa, pb) if pb.size == 1 else (pb, pa)
                    if id(big) in last:
                        info["through"] = ((big, refs[id(big)], last[id(big)]), abs(float(small.probs[0])))
                refs[id(o)] = ref
                last[id(o)] = ("compose", info, ev)
    return refs, last


def d_bound(pmf: pld_ops.Pmf, ref: RefPmf, last: tuple[str, dict, Event], eps: float) -> float:
    """Bound on |D_run(eps) - D_exact(eps)|: the l1 error of the entries above eps and of the
    infinity mass. Where the last operation is an FFT, its fresh error counts over the entries
    above eps only (sqrt(#) times its 2-norm bound), the propagated l1 error in full."""
    kind, info, _ = last
    d = pmf.discretization
    if kind == "compose" and "through" in info:  # a product with a one-point PMF: the input's error, scaled
        src, scale = info["through"]
        return scale * d_bound(src[0], src[1], src[2], eps) + 8 * U
    if kind == "self":
        return math.sqrt(count_above(pmf.lower_loss, pmf.size, d, eps) + 1) * info["bound2"] + 8 * U
    pa, pb, ra, rb = info["in"]
    shape = pa.size + pb.size - 1
    above = count_above(pa.lower_loss + pb.lower_loss, shape, d, eps) + 1
    a1, b1 = float(np.abs(pa.probs).sum()) + pa.infinity_mass, float(np.abs(pb.probs).sum()) + pb.infinity_mass
    return (ra.err1 * (b1 + rb.err1) + rb.err1 * a1 + math.sqrt(above) * info["bound2"]
            + gamma(shape) * (float(np.abs(pmf.probs).sum()) + pmf.infinity_mass) + 4 * U)


def to_tree(events: list[Event]) -> pld_certify.Node | None:
    """The recorded run as the library's composition tree (mfcli.accounting.pld_certify); None
    where it ends in no recorded operation."""
    nodes: dict[int, pld_certify.Node] = {}
    last = None
    for ev in events:
        if ev.kind == "self":
            pld, k, tail = ev.args
            last = nodes[id(ev.out)] = pld_certify.Node(ev.out, "self", (pld_certify.leaf(pld),), int(k), float(tail))
        elif ev.kind == "compose":
            a, b, tail = ev.args
            kids = (nodes.get(id(a)) or pld_certify.leaf(a), nodes.get(id(b)) or pld_certify.leaf(b))
            last = nodes[id(ev.out)] = pld_certify.Node(ev.out, "compose", kids, 1, float(tail))
    return last


def report_case(name: str) -> list[dict]:
    t0 = time.process_time()
    events, _ = record_case(name)
    t1 = time.process_time()
    refs, last = replay(events)
    t2 = time.process_time()
    fin = [e for e in events if e.kind == "eps"][-1]
    pld, delta = fin.args
    eps_run = float(fin.out)
    n_self = sum(e.kind == "self" for e in events)
    n_comp = sum(e.kind == "compose" for e in events)
    rows = []
    for dname, pmf in directions(pld):
        ref = refs[id(pmf)]
        assert ref.lower == pmf.lower_loss and ref.probs.size == pmf.size
        d = pmf.discretization
        err = pmf.probs.astype(LD) - ref.probs
        dr = hockey(pmf.probs, pmf.lower_loss, pmf.infinity_mass, d, eps_run)
        dx = hockey(ref.probs, ref.lower, ref.inf, d, eps_run)
        bd = d_bound(pmf, ref, last[id(pmf)], eps_run)
        e_run = eps_for(pmf.probs, pmf.lower_loss, pmf.infinity_mass, d, delta)
        e_ref = eps_for(ref.probs, ref.lower, ref.inf, d, delta)
        e_cost = eps_for(pmf.probs, pmf.lower_loss, pmf.infinity_mass + bd, d, delta)
        # the same bound for a long-double composition (unit roundoff 2^-64): the bound scales with u
        ld_scale = float(np.finfo(LD).eps) / 2 / U
        e_cost_ld = eps_for(pmf.probs, pmf.lower_loss, pmf.infinity_mass + bd * ld_scale, d, delta)
        # the tilted chain: every recorded operation redone on tilted PMFs (theta from the run's PMF)
        tc0 = time.process_time()
        theta = chernoff_theta(pmf, eps_run)
        chain = TiltedChain(events, theta)
        dc, dcerr = chain.delta_bound(pmf, eps_run)
        node = chain.nodes[id(pmf)]
        e_cert = chain.epsilon(pmf, delta, (node.lower + node.x.size) * d)
        tilt = dict(theta=theta, Dcert=dc, Dcert_err=dcerr, e_cert=e_cert, cert_cpu=time.process_time() - tc0)
        tree = to_tree(events)
        tilt["e_lib"] = pld_certify.certify(tree, eps_run, delta, direction=dname) if tree is not None else math.nan
        rows.append(dict(
            case=name, dir=dname, ops=f"{n_self}s+{n_comp}c", size=pmf.size, d=d, delta=delta, eps=eps_run,
            max_abs=float(np.abs(err).max()), max_ref=float(ref.probs.max()), neg=int((pmf.probs < 0).sum()),
            min_neg=float(min(0.0, pmf.probs.min())), above=count_above(pmf.lower_loss, pmf.size, d, eps_run),
            dD=float(dx - dr), D=float(dx), bound=bd, e_run=e_run, e_ref=e_ref, e_cost=e_cost,
            rec_cpu=t1 - t0, replay_cpu=t2 - t1, e_cost_ld=e_cost_ld, **tilt,
        ))
    return rows


# ---------------------------------------------------------------------------------------------
# 5. The FFT accuracy assumption against long double


def check_assumption(rng: np.random.Generator) -> list[dict]:
    """Largest observed ratio of pocketfft's double error to the assumed bound, both forms."""
    out = []
    for n in (1000, 2 ** 12, 3 ** 8, 5 ** 6, 7 ** 5, 11 ** 4, 2 ** 16 * 3, 2 ** 20, 1_083_289):
        n = fft.next_fast_len(n)
        worst2 = worstinf = 0.0
        for kind in ("uniform", "gauss", "spiky"):
            if kind == "uniform":
                x = rng.random(n)
            elif kind == "gauss":
                t = np.arange(n)
                x = np.exp(-0.5 * ((t - n / 3) / (n / 50)) ** 2)
            else:
                x = np.zeros(n)
                x[rng.integers(0, n, 5)] = rng.random(5)
                x[0] = 1.0
            x /= x.sum()
            for tr in ("rfft", "fft"):
                f = getattr(fft, tr)
                y = f(x)
                y_ref = f(x.astype(LD))
                e = np.abs(y.astype(np.clongdouble) - y_ref)
                full = 1.0 if tr == "fft" else 2.0  # the half spectrum's 2-norm at most that of the whole
                a = _alpha(n)
                worst2 = max(worst2, float(np.sqrt((e ** 2).sum() * full) / (a * math.sqrt(n) * np.linalg.norm(x))))
                worstinf = max(worstinf, float(e.max() / (a * x.sum())))
            yi = fft.irfft(fft.rfft(x), n)
            yi_ref = fft.irfft(fft.rfft(x).astype(np.clongdouble), n)
            e = yi.astype(LD) - yi_ref
            worst2 = max(worst2, float(np.sqrt((e ** 2).sum()) / (_alpha(n) * float(np.sqrt((yi_ref ** 2).sum())))))
        out.append(dict(n=n, ratio2=worst2, ratio_inf=worstinf))
    return out


def tilt_selftest() -> list[dict]:
    """The tilted certificate against the TRUE k-fold composition (no window, no aliasing: a long
    double FFT of the full linear length) on a coarser grid where that fits: it must not be below."""
    from mfcli.accounting import single_pass

    rows = []
    pld = single_pass._poisson_gaussian_pld(1.0, 0.1, 1e-3)
    for k in (64, 256):
        out = pld_ops.self_compose(pld, k)
        for dname, p, o in (("remove", pld.remove, out.remove), ("add", pld.add_pmf, out.add_pmf)):
            d = p.discretization
            for delta in (1e-6, 1e-10):
                eps = eps_for(o.probs, o.lower_loss, o.infinity_mass, d, delta)
                full_len = k * (p.size - 1) + 1
                nf = fft.next_fast_len(full_len, True)
                x = p.probs.astype(LD)
                c = fft.irfft(fft.rfft(x, nf) ** k, nf)[:full_len]
                inf_true = -np.expm1(LD(k) * np.log1p(-LD(p.infinity_mass)))
                d_true = hockey(c, p.lower_loss * k, inf_true, d, eps)
                nf2 = fft.next_fast_len(nf + 997, True)  # another length: an empirical look at the reference's error
                c2 = fft.irfft(fft.rfft(x, nf2) ** k, nf2)[:full_len]
                d_true2 = hockey(c2, p.lower_loss * k, inf_true, d, eps)
                ld_err = (math.sqrt(count_above(p.lower_loss * k, full_len, d, eps) + 1)
                          * _self_bound(p, k, nf) * float(np.finfo(LD).eps) / 2 / U)
                chain = TiltedChain([Event("self", "", (pld, k, pld_ops.TAIL_MASS_TRUNCATION), out)],
                                    chernoff_theta(o, eps))
                dc, dce = chain.delta_bound(o, eps)
                tree = pld_certify.self_compose(pld_certify.leaf(pld), k)
                d_lib = pld_certify.delta_bound(tree, eps, direction=dname)
                rows.append(dict(k=k, dir=dname, delta=delta, eps=eps, d_true=float(d_true), ld_err=ld_err,
                                 ld_diff=float(abs(d_true2 - d_true)), d_cert=dc, d_cert_err=dce,
                                 ok=dc >= float(max(d_true, d_true2)), d_lib=d_lib,
                                 ok_lib=d_lib >= float(max(d_true, d_true2))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="a,b,c,c10,d",
                    help="comma-separated among a (identity n 64 sigma 0.6 p 0.3 delta 1e-10), b (the headline's "
                         "MMCC), c (DP-SGD sigma 1 p 0.1 256 steps, delta 1e-6), c10 (c at delta 1e-10), d (tree n 64 sigma 8 "
                         "p 0.05 delta 1e-10: six self-compositions and FFT compositions of up to 130 000 points)")
    ap.add_argument("--check-assumption", action="store_true")
    ap.add_argument("--tilt-selftest", action="store_true",
                    help="the tilted certificate against the true composition on a coarser grid")
    args = ap.parse_args()
    print(f"FFT error model: eta = {ETA_U:g} u per log2(n) (assumption); reference: long double "
          f"(eps {np.finfo(LD).eps:.2g}), direct convolution up to {DIRECT_MAX} points", file=sys.stderr)
    if args.check_assumption:
        print("| n | max error / assumed 2-norm bound | max error / assumed per-coefficient bound |")
        print("|---:|---:|---:|")
        for r in check_assumption(np.random.default_rng(1)):
            print(f"| {r['n']} | {r['ratio2']:.3g} | {r['ratio_inf']:.3g} |")
        print()
    if args.tilt_selftest:
        print("Tilted certificate against the true composition (DP-SGD sigma 1, p 0.1, grid 1e-3):\n")
        print("| k | dir | delta | eps (run) | D_true(eps) | its long-double bound / two lengths differ by | "
              "certified D / D_true - 1 | round-off part | certified >= true | library: D / D_true - 1 | "
              "library >= true (both lengths) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in tilt_selftest():
            print(f"| {r['k']} | {r['dir']} | {r['delta']:.0e} | {r['eps']:.6g} | {r['d_true']:.4g} | "
                  f"{r['ld_err']:.1g} / {r['ld_diff']:.1g} | "
                  f"{r['d_cert'] / r['d_true'] - 1:.2g} | {r['d_cert_err']:.1g} | {r['ok']} | "
                  f"{r['d_lib'] / r['d_true'] - 1:.2g} | {r['ok_lib']} |", flush=True)
        print()
    rows = [r for name in args.cases.split(",") if name for r in report_case(name.strip())]
    print("Measured (run against the reference, same discrete choices):\n")
    print("| case | dir | ops | points | above eps | delta | eps (run) | max abs err/entry | max p | "
          "neg entries (min) | D_exact - D_run at eps | (same) / delta | eps run / exact - 1 |")
    print("|" + "---|" * 13)
    for r in rows:
        print(f"| {r['case']} | {r['dir']} | {r['ops']} | {r['size']} | {r['above']} | {r['delta']:.3g} | "
              f"{r['eps']:.6g} | {r['max_abs']:.2g} | {r['max_ref']:.2g} | {r['neg']} ({r['min_neg']:.1g}) | "
              f"{r['dD']:.2g} | {r['dD'] / r['delta']:.2g} | {r['e_run'] / r['e_ref'] - 1:.2g} |")
    print("\nBounds and their cost (eps certified / eps run - 1):\n")
    print("| case | dir | a-priori bound on abs err of D | bound / measured | cost, double | "
          "cost, long double FFT | tilted: theta | tilted: round-off part | tilted: certified D / D_exact - 1 | "
          "tilted: eps certified / exact - 1 | tilted: eps certified / run - 1 | tilted CPU s | "
          "library (pld_certify): eps certified / run - 1 | library: eps certified / exact - 1 |")
    print("|" + "---|" * 14)
    for r in rows:
        t = (f"{r['theta']:.3g} | {r['Dcert_err']:.2g} | {(r['Dcert'] - r['D']) / r['D']:.2g} | "
             f"{r['e_cert'] / r['e_ref'] - 1:.2g} | {r['e_cert'] / r['e_run'] - 1:.2g} | {r['cert_cpu']:.1f} | "
             f"{r['e_lib'] / r['eps'] - 1:.2g} | {r['e_lib'] / r['e_ref'] - 1:.2g}")
        print(f"| {r['case']} | {r['dir']} | {r['bound']:.2g} | {r['bound'] / max(abs(r['dD']), 1e-300):.2g} | "
              f"{r['e_cost'] / r['e_run'] - 1:.2g} | {r['e_cost_ld'] / r['e_run'] - 1:.2g} | {t} |")
    for r in rows:
        print(f"  ({r['case']} {r['dir']}: record {r['rec_cpu']:.1f} s, replay {r['replay_cpu']:.1f} s CPU)",
              file=sys.stderr)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU {ru.ru_utime + ru.ru_stime:.1f} s, peak RSS {ru.ru_maxrss / 1024:.0f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
