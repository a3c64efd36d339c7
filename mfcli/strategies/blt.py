"""Buffered linear Toeplitz (BLT) strategies: C never materialised, O(n d) losses, O(buffers) noise.

A BLT (Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024, arXiv 2404.16706) is the lower-
triangular Toeplitz strategy C with first column

    c_0 = 1,   c_t = sum_i omega_i theta_i^(t-1)   (t >= 1),

buffer decays theta_1..theta_d and output scales omega_1..omega_d (d = ``buffers``). As a linear
system it has d scalar buffers per coordinate: s_{t+1} = theta o s_t + x_t 1, y_t = x_t + omega . s_t.
Its inverse C^-1 (the noising matrix) is again a BLT; its parameters have a closed form (below).
The maths, with proofs, is in docs/structured.md, section "BLT".

* :class:`BufferedToeplitz`: the strategy; coefficients of C and C^-1 in O(n d), the inverse BLT,
  sensitivity under every participation schema, per-step error and max / mean loss for the prefix
  and (constant learning-rate) momentum workloads in O(n d), closed forms in O(d^2).
* :func:`optimize_blt`: the parameters minimising max or mean loss (scipy L-BFGS-B with analytic
  gradients of closed forms that do not grow with n, several starts including a quadrature of
  the arcsine representation of the square root factorization).
* Its noise (rows of C^-1 Z in O(buffers x d) memory) is the one noise stream of
  :mod:`mfcli.training.noise`: :func:`mfcli.training.noise.strategy_stream` for a BLT in memory,
  :func:`mfcli.training.noise.noise_stream` for its artifact (the same rows and checkpoint format).

Loss convention (as in :mod:`mfcli.model.factorization`): per-step error err_t = sens(C)^2 ||B[t, :]||^2
with B = A C^-1, max loss = max_t err_t, mean loss = sum_t err_t / n; noise multiplier 1, clip 1.

Workloads. A Toeplitz loss needs a Toeplitz workload: the prefix sum S (first column all ones)
and heavy-ball momentum with a constant learning rate, A = S M_beta (first column
a_t = (1 - beta^(t+1)) / (1 - beta)). A learning-rate schedule makes A = S diag(eta) M_beta, which
is not Toeplitz (nor is B = A C^-1), so its error has no O(n d) form here and is refused.

Workload validation and the sensitivity of a Toeplitz first column (and its gradient) are
mfcli/strategies/toeplitz.py's, shared with banded Toeplitz; this module adds the BLT's closed forms.

Example (the one-buffer BLT c = (1, 0.5, 0.25, ...)):
    >>> from mfcli.strategies.blt import BufferedToeplitz
    >>> blt = BufferedToeplitz(theta=[0.5], omega=[0.5])
    >>> blt.strategy_coefs(4).tolist()
    [1.0, 0.5, 0.25, 0.125]
    >>> blt.noising_coefs(4).round(12).tolist()
    [1.0, -0.5, 0.0, 0.0]
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from mfcli.errors import ArtifactError, MfcliError
from mfcli.model.participation import (
    FixedEpoch,
    MinSeparation,
    Participation,
    Sensitivity,
    SingleParticipation,
)
from mfcli.strategies import toeplitz as _toeplitz
from mfcli.strategies.operators import BufferRecursion
from mfcli.util.directed import sqrt_down, sqrt_up
from mfcli.util.limits import BLT_MAX_N
from mfcli.util.validation import step_count

#: The most buffers a BLT may have (near-optimality needs O(log n); 2404.16706 Conj. 9.1).
MAX_BUFFERS = 32
#: The largest n the BLT routines accept (:data:`mfcli.util.limits.BLT_MAX_N`, with its reason).
MAX_STEPS = BLT_MAX_N
#: Relative tolerance within which a sensitivity witness is taken to attain the bound.
EXACT_RTOL = 1e-10
ERRORS = ("max", "mean")
TOEPLITZ_WORKLOADS = ("prefix", "momentum")


# ---------------------------------------------------------------------------------------------
# Toeplitz helpers (generic in the first column; see the module docstring)


def workload_gamma(workload: Any = "prefix", *, beta: float | None = None) -> float:
    """The momentum parameter gamma of a Toeplitz workload A(z) = 1 / ((1 - z)(1 - gamma z)).

    ``prefix`` is gamma = 0; ``momentum`` is gamma = beta (default 0.9, as in
    :func:`mfcli.model.workloads.momentum_workload`). A :class:`mfcli.model.workloads.Workload` is accepted
    when it is prefix or momentum with a constant learning rate. The validation is
    :func:`mfcli.strategies.toeplitz.toeplitz_workload`'s (one representation of a Toeplitz workload).

    Raises:
        MfcliError: an unknown name, beta outside [0, 1), a learning-rate schedule, a custom workload.
    """
    from mfcli.model.workloads import Workload

    lr: Any = "constant"
    if isinstance(workload, Workload):
        lr = workload.params.get("lr", "constant")
        if workload.name == "momentum":
            beta = float(workload.params["beta"])
        workload = workload.name
    if workload not in TOEPLITZ_WORKLOADS:
        raise MfcliError(f"a BLT loss needs a Toeplitz workload, one of {', '.join(TOEPLITZ_WORKLOADS)}; got {workload!r}")
    if workload == "prefix" and beta not in (None, 0, 0.0):
        raise MfcliError("beta applies to the momentum workload only")
    b = 0.9 if beta is None else beta
    if workload == "momentum" and (isinstance(b, bool) or not isinstance(b, (int, float, np.integer, np.floating))):
        raise MfcliError(f"beta must be in [0, 1), got {b!r}")
    return _toeplitz.toeplitz_workload(str(workload), beta=float(b) if workload == "momentum" else 0.9, lr=lr).beta


def _apply_workload(gamma: float, x: np.ndarray) -> np.ndarray:
    """A x for the Toeplitz workload of ``gamma`` (x a first column or a vector): a prefix sum,
    then, for momentum, the filter y_t = x_t + gamma y_{t-1}; O(n)."""
    y = np.cumsum(x)
    if gamma:
        from scipy.signal import lfilter

        y = lfilter([1.0], [1.0, -gamma], y)
    return np.asarray(y, dtype=np.float64)


def _apply_workload_adjoint(gamma: float, g: np.ndarray) -> np.ndarray:
    """A^T g (the adjoint of :func:`_apply_workload`): the same filter run backwards."""
    return _apply_workload(gamma, g[::-1])[::-1]


# ---------------------------------------------------------------------------------------------
# Geometric sums G_m(x) = sum_{s<m} x^s and their derivatives, stable near x = 1


def _h(u: np.ndarray) -> np.ndarray:
    """expm1(u) / u, with h(0) = 1."""
    out = np.ones_like(u)
    big = np.abs(u) > 1e-8
    out[big] = np.expm1(u[big]) / u[big]
    small = ~big
    out[small] = 1.0 + u[small] / 2
    return out


_HP_SERIES = np.array([(k + 1) / math.factorial(k + 2) for k in range(18)])


def _hprime(u: np.ndarray) -> np.ndarray:
    """h'(u) = (e^u (u - 1) + 1) / u^2; a Taylor series near 0, where the formula cancels."""
    out = np.empty_like(u)
    near = np.abs(u) < 0.5
    un = u[near]
    out[near] = np.polynomial.polynomial.polyval(un, _HP_SERIES)
    uf = u[~near]
    with np.errstate(over="ignore"):
        out[~near] = (np.exp(uf) * (uf - 1) + 1) / (uf * uf)
    return out


def _geom(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """G_m(x) = sum_{s<m} x^s and G_m'(x), elementwise for |x| < 1 (x = 1 allowed: m, m(m-1)/2).

    For x > 1/2 in the log domain, x = e^L: G = m h(mL) / h(L) with h(u) = expm1(u)/u, and
    dG/dL = m (m h'(mL) h(L) - h(mL) h'(L)) / h(L)^2, free of the cancellation of
    (1 - x^m)/(1 - x) and its derivative when m (1 - x) is small.
    """
    x = np.asarray(x, dtype=np.float64)
    g = np.empty_like(x)
    dg = np.empty_like(x)
    if m <= 0:
        g[...] = 0.0
        dg[...] = 0.0
        return g, dg
    pos = x > 0.5
    xp = x[pos]
    lg = np.log(xp)
    h1, hm = _h(lg), _h(m * lg)
    d1, dm = _hprime(lg), _hprime(m * lg)
    g[pos] = m * hm / h1
    dg[pos] = m * (m * dm * h1 - hm * d1) / (h1 * h1) / xp
    xo = x[~pos]
    with np.errstate(under="ignore"):
        xm1 = np.power(xo, m - 1)
    g[~pos] = (1 - xm1 * xo) / (1 - xo)
    dg[~pos] = (1 - m * xm1 + (m - 1) * xm1 * xo) / (1 - xo) ** 2
    return g, dg


# ---------------------------------------------------------------------------------------------
# Certified sensitivity: an enclosure of ||c||^2 in exact fixed-point interval arithmetic
#
# The closed form 1 + omega^T G omega sums d^2 terms whose signs differ when the scales omega do:
# in float64 a crafted BLT (scales +-A with decays 4e-11 apart) loses every digit (0.0123 where
# ||c||^2 = 1.00002), and any float recomputation of the same formula agrees with it. So the
# number a guarantee rests on is computed here in exact integer arithmetic instead: every
# quantity is an interval [lo, hi] / 2^P of integers, each operation rounds lo down and hi up,
# the parameters (binary floats, exact rationals) enter exactly, and P grows until the enclosure
# is narrower than 2^-60 relative. The upper end, rounded up to a float, is the sensitivity; the
# lower end bounds the true value from below. docs/structured.md, "Certified sensitivity".

#: Starting and largest working precision (bits after the binary point) of the enclosure.
_CERT_MIN_BITS = 128
_CERT_MAX_BITS = 1 << 14
#: The enclosure is accepted when its width is below this fraction of its lower end.
_CERT_RTOL = 2.0**-60
_CERT_INV_RTOL = 2**60


def _cert_bits(theta: np.ndarray, omega: np.ndarray, m: int) -> int:
    """A working precision for :func:`_sens2_enclosure`: enough bits for the largest term
    |omega_i omega_j| / (1 - |theta_i theta_j|) of the sum to keep 2^-100 absolute accuracy."""
    big = 0.0
    for i in range(theta.shape[0]):
        for j in range(theta.shape[0]):
            if omega[i] and omega[j]:
                gap = 1.0 - abs(float(theta[i]) * float(theta[j]))
                big = max(big, math.log2(abs(float(omega[i]))) + math.log2(abs(float(omega[j]))) - math.log2(gap))
    return _CERT_MIN_BITS + max(m.bit_length(), 1) + max(0, math.ceil(big)) + 2 * max(theta.shape[0], 1).bit_length()


def _fixed(v: float, p: int) -> tuple[int, int]:
    """[lo, hi] with lo <= v 2^p <= hi, integers one apart at most (v is an exact binary rational)."""
    num, den = float(v).as_integer_ratio()
    q, r = divmod(num << p, den)
    return q, q + (r != 0)


def _mul_round(a: int, b: int, p: int, up: bool) -> int:
    prod = a * b
    return -((-prod) >> p) if up else prod >> p


def _pow_bound(x: int, m: int, p: int, up: bool) -> int:
    """x^m (x >= 0 in units of 2^-p) rounded down or up at every step: a lower or upper bound,
    since every operand is non-negative and rounding is monotone."""
    result, base = 1 << p, x
    while m:
        if m & 1:
            result = _mul_round(result, base, p, up)
        m >>= 1
        if m:
            base = _mul_round(base, base, p, up)
    return result


def _ipow(x: tuple[int, int], m: int, p: int) -> tuple[int, int]:
    """An enclosure of x^m for x in the interval ``x``."""
    lo, hi = x
    if lo >= 0:
        return _pow_bound(lo, m, p, False), _pow_bound(hi, m, p, True)
    if hi <= 0:
        a, b = _pow_bound(-hi, m, p, False), _pow_bound(-lo, m, p, True)
        return (-b, -a) if m & 1 else (a, b)
    top = _pow_bound(max(-lo, hi), m, p, True)
    return (-top, top) if m & 1 else (0, top)


def _idiv(num: tuple[int, int], den: tuple[int, int], p: int) -> tuple[int, int]:
    """An enclosure of num / den for an interval den > 0."""
    a, b = num
    lo = (a << p) // (den[1] if a >= 0 else den[0])
    hi = -((-(b << p)) // (den[0] if b >= 0 else den[1]))
    return lo, hi


def _sens2_enclosure(theta: np.ndarray, omega: np.ndarray, n: int, p: int) -> tuple[int, int]:
    """[lo, hi] / 2^p containing ||c||^2 = 1 + sum_ij omega_i omega_j G_{n-1}(theta_i theta_j),
    with G_m(x) = (1 - x^m) / (1 - x), evaluated in interval arithmetic (module comment above)."""
    one = 1 << p
    m = n - 1
    total_lo = total_hi = one
    if m <= 0:
        return total_lo, total_hi
    ratios = [float(v).as_integer_ratio() for v in omega]
    th = [float(v).as_integer_ratio() for v in theta]
    d = theta.shape[0]
    for i in range(d):
        if omega[i] == 0:
            continue
        for j in range(i, d):
            if omega[j] == 0:
                continue
            xn, xd = th[i][0] * th[j][0], th[i][1] * th[j][1]  # theta_i theta_j exactly
            q, r = divmod(xn << p, xd)
            x = (q, q + (r != 0))
            xm = _ipow(x, m, p)
            g = _idiv((one - xm[1], one - xm[0]), (one - x[1], one - x[0]), p)
            # times omega_i omega_j (twice off the diagonal), exactly, then rounded outwards
            wn = ratios[i][0] * ratios[j][0] * (1 if i == j else 2)
            wd = ratios[i][1] * ratios[j][1]
            ends = (g[0] * wn, g[1] * wn)
            total_lo += min(ends) // wd
            total_hi += -((-max(ends)) // wd)
    return total_lo, total_hi


def _ratio_up(num: int, den: int) -> float:
    """The smallest float >= num / den (den > 0)."""
    f = num / den
    a, b = f.as_integer_ratio()
    return math.nextafter(f, math.inf) if a * den < num * b else f


def _ratio_down(num: int, den: int) -> float:
    """The largest float <= num / den (den > 0)."""
    f = num / den
    a, b = f.as_integer_ratio()
    return math.nextafter(f, -math.inf) if a * den > num * b else f


def certified_sens2(theta: np.ndarray, omega: np.ndarray, n: int) -> tuple[float, float]:
    """(lower, upper): floats with lower <= ||c||^2 <= upper for the BLT (theta, omega) over n
    steps, the exact squared norm of C's first column (its longest column), from the parameters
    as stored (exact binary rationals); upper / lower - 1 is at most a few units of rounding.

    Raises:
        MfcliError: the enclosure stays wider than 2^-60 relative at 2^14 bits (scales whose
            terms cancel by thousands of digits): such a BLT has no certifiable sensitivity.
    """
    p = min(_cert_bits(theta, omega, n - 1), _CERT_MAX_BITS)
    while True:
        lo, hi = _sens2_enclosure(theta, omega, n, p)
        if lo > 0 and (hi - lo) * _CERT_INV_RTOL <= lo:
            try:
                return _ratio_down(lo, 1 << p), _ratio_up(hi, 1 << p)
            except OverflowError:
                raise MfcliError("the sensitivity of this BLT overflows a float (output scales omega too large)") from None
        if p >= _CERT_MAX_BITS:
            raise MfcliError("the sensitivity of this BLT cannot be certified: its output scales omega cancel "
                             f"beyond {_CERT_MAX_BITS} bits of precision (|omega| up to {float(np.max(np.abs(omega))):.3g})")
        p = min(2 * p, _CERT_MAX_BITS)


# ---------------------------------------------------------------------------------------------
# The strategy


def _param_vector(value: Any, name: str) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise MfcliError(f"{name} must be a vector of numbers") from None
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise MfcliError(f"{name} must be a 1-D vector, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise MfcliError(f"{name} has non-finite entries")
    arr.setflags(write=False)
    return arr


def _check_n(n: Any) -> int:
    n = step_count(n)
    if n > MAX_STEPS:
        raise MfcliError(f"n must be at most {MAX_STEPS}, got {n}")
    return n


def check_buffers(buffers: Any, n: int | None = None) -> int:
    """A number of BLT buffers: 1 <= buffers <= MAX_BUFFERS and (given n) buffers < n. The one
    validator of a buffer count (:func:`optimize_blt`, ``--buffers`` of the CLI): messages name
    the parameter, not a flag."""
    k = step_count(buffers, name="buffers")
    if k > MAX_BUFFERS:
        raise MfcliError(f"buffers must be at most {MAX_BUFFERS}, got {k}")
    if n is not None and k >= n:
        raise MfcliError(f"buffers = {k} must be below the number of steps n = {n}")
    return k


@dataclass(frozen=True, kw_only=True, eq=False)
class BufferedToeplitz:
    """The BLT strategy C with c_0 = 1, c_t = sum_i omega_i theta_i^(t-1) (t >= 1).

    Attributes:
        theta: buffer decays, distinct, each in (-1, 1) (an optimised strategy has them in
            (0, 1); its inverse may have negative ones).
        omega: output scales, one per buffer.

    Raises:
        MfcliError: lengths differ, more than :data:`MAX_BUFFERS` buffers, a non-finite entry, a
            decay outside (-1, 1), or two equal decays (one buffer; merge their scales).
    """

    theta: np.ndarray
    omega: np.ndarray
    kind: ClassVar[str] = "blt"

    def __post_init__(self) -> None:
        theta = _param_vector(self.theta, "theta")
        omega = _param_vector(self.omega, "omega")
        if theta.shape != omega.shape:
            raise MfcliError(f"theta and omega must have the same length, got {theta.shape[0]} and {omega.shape[0]}")
        if theta.shape[0] > MAX_BUFFERS:
            raise MfcliError(f"a BLT has at most {MAX_BUFFERS} buffers, got {theta.shape[0]}")
        if np.any(np.abs(theta) >= 1):
            raise MfcliError(f"every buffer decay theta must be in (-1, 1), got {theta.tolist()}")
        if np.unique(theta).shape[0] != theta.shape[0]:
            raise MfcliError("the buffer decays theta must be distinct (merge equal ones into one buffer)")
        object.__setattr__(self, "theta", theta)
        object.__setattr__(self, "omega", omega)

    @property
    def buffers(self) -> int:
        """d: the number of buffers (state per coordinate of the noise stream)."""
        return int(self.theta.shape[0])

    def __repr__(self) -> str:
        return f"BufferedToeplitz(theta={self.theta.tolist()}, omega={self.omega.tolist()})"

    # -- coefficients ---------------------------------------------------------------------

    def strategy_coefs(self, n: int) -> np.ndarray:
        """First column of C, length n, in O(n d) time and O(n) memory."""
        n = _check_n(n)
        c = np.zeros(n)
        c[0] = 1.0
        if n > 1:
            powers = np.arange(n - 1, dtype=np.float64)
            with np.errstate(under="ignore"):
                for th, om in zip(self.theta, self.omega, strict=True):
                    c[1:] += om * np.power(th, powers)
        return c

    def is_identity(self, n: int) -> bool:
        """C (n x n) == I: n = 1, or every scale omega is 0 (then every c_t, t >= 1, is 0 in any
        arithmetic). With distinct decays the converse holds for n > d (the c_t, 1 <= t <= d,
        form a non-singular Vandermonde system in omega); for n <= d a C that is I with some
        omega != 0 is answered False, the safe side (DP-SGD's accounting is then not claimed)."""
        return _check_n(n) == 1 or not np.any(self.omega)

    def noising_coefs(self, n: int) -> np.ndarray:
        """First column of C^-1 (the noising matrix), length n, in O(n d): d_0 = 1,
        d_t = sum_k omega'_k lambda_k^(t-1) with the inverse BLT's parameters (complex conjugate
        pairs allowed here, so every BLT has its noising coefficients)."""
        n = _check_n(n)
        lam, omp = _inverse_parameters(self.theta, self.omega, allow_complex=True)
        out = np.zeros(n, dtype=np.result_type(lam, omp, np.float64))
        out[0] = 1.0
        if n > 1:
            powers = np.arange(n - 1, dtype=np.float64)
            with np.errstate(under="ignore"):
                for la, om in zip(lam, omp, strict=True):
                    out[1:] += om * np.power(la, powers)
        return np.ascontiguousarray(out.real, dtype=np.float64)

    def inverse(self) -> BufferedToeplitz:
        """The BLT of C^-1, in closed form.

        C(z) = 1 + sum_i omega_i z / (1 - theta_i z). Its inverse has poles 1/lambda_k, where the
        lambda_k are the eigenvalues of diag(theta) - 1 omega^T, i.e. the roots of the secular
        equation sum_i omega_i / (theta_i - lambda) = 1, and residues giving
        omega'_k = -1 / sum_i omega_i / (theta_i - lambda_k)^2 (docs/structured.md, "BLT").

        Raises:
            MfcliError: C^-1 is not a real BLT with distinct decays in (-1, 1). For omega > 0 the
                roots are real and interlace the theta (one in each gap, one below theta_min),
                and the lowest is below -1 exactly when sum_i omega_i / (1 + theta_i) > 1;
                with mixed signs they may be complex. :meth:`noising_coefs` works in every case.
        """
        lam, omp = _inverse_parameters(self.theta, self.omega)
        if np.any(np.abs(lam) >= 1):
            raise MfcliError(f"C^-1 has a buffer decay outside (-1, 1): {lam.tolist()}")
        return BufferedToeplitz(theta=lam, omega=omp)

    def workload_decoder(self, workload: _toeplitz.ToeplitzWorkload, n: int) -> np.ndarray:
        """First column of B = A C^-1 from the exponential-sum form of C^-1 (:meth:`noising_coefs`),
        which stays accurate where the polynomial form's poles cluster near 1."""
        import scipy.signal

        return scipy.signal.lfilter(workload.numerator, workload.denominator, self.noising_coefs(_check_n(n)))

    def recursion(self, workload: _toeplitz.ToeplitzWorkload, kind: str, n: int) -> BltRecursion:
        """The streamed operator (``kind``: gradient C^-1, iterate B) in buffer form
        (:class:`BltRecursion`), the workload's all-pole filter after it for iterate noise."""
        if tuple(workload.numerator) != (1.0,):
            raise MfcliError(f"a BLT iterate stream needs an all-pole workload filter, got {workload.name}")
        post = np.asarray(workload.denominator if kind == "iterate" else (1.0,), dtype=np.float64)
        return BltRecursion(np.array(self.theta), np.array(self.omega), post, n)

    def rational(self) -> tuple[np.ndarray, np.ndarray]:
        """C^-1 as num(z) / den(z), the form :mod:`mfcli.strategies.structured` streams noise with (O(d)
        state per coordinate): C(z) = den(z) / P(z) with P(z) = prod_i (1 - theta_i z) and
        den(z) = P(z) + z sum_i omega_i prod_{j != i} (1 - theta_j z), so num = P.

        The polynomial (direct) form is what the noise recursion runs; its impulse response
        matches :meth:`noising_coefs` (the exponential-sum form) to about 1e-11 at n = 10^5 and
        1e-7 at n = 10^6 for an optimised BLT (poles clustered near 1)."""
        num = np.atleast_1d(np.poly(self.theta)).astype(np.float64)
        den = num.copy()
        for i in range(self.buffers):
            den[1:] += self.omega[i] * np.atleast_1d(np.poly(np.delete(self.theta, i)))
        return num, den

    # -- artifact parameters --------------------------------------------------------------

    def parameters(self) -> dict[str, np.ndarray]:
        """What an artifact stores: ``{"theta": ..., "omega": ...}`` (float64 vectors)."""
        return {"theta": np.array(self.theta), "omega": np.array(self.omega)}

    @classmethod
    def from_parameters(cls, params: Mapping[str, Any]) -> BufferedToeplitz:
        """The BLT stored by :meth:`parameters`; :class:`ArtifactError` on anything else."""
        if not isinstance(params, Mapping) or set(params) != {"theta", "omega"}:
            keys = sorted(params) if isinstance(params, Mapping) else type(params).__name__
            raise ArtifactError(f"BLT parameters must be exactly theta and omega, got {keys}")
        try:
            return cls(theta=params["theta"], omega=params["omega"])
        except MfcliError as exc:
            raise ArtifactError(f"BLT parameters: {exc}") from None

    # -- sensitivity ----------------------------------------------------------------------

    def sensitivity_squared_single(self, n: int) -> float:
        """||c||^2 over n steps, certified: a float >= the exact squared column norm and within a
        few units of rounding of it (:func:`certified_sens2`, exact interval arithmetic on the
        closed form of 2404.16706 Lemma 5.3, 1 + sum_ij omega_i omega_j (1 - (theta_i
        theta_j)^(n-1)) / (1 - theta_i theta_j)). The float64 evaluation of that closed form can
        lose every digit when the scales omega have mixed signs; it is never used for a privacy
        number. O(d^2 log n) big-integer operations, cached per n.

        Raises:
            MfcliError: the value cannot be certified (see :func:`certified_sens2`)."""
        return self._sens2_bounds(n)[1]

    def _sens2_bounds(self, n: int) -> tuple[float, float]:
        n = _check_n(n)
        cache: dict[int, tuple[float, float]] = self.__dict__.setdefault("_sens2_cache", {})
        if n not in cache:
            cache[n] = certified_sens2(self.theta, self.omega, n)
        return cache[n]

    def coefficient_error_bounds(self, n: int) -> np.ndarray:
        """e_t >= |strategy_coefs(n)[t] - c_t|: a bound on the rounding error of each computed
        coefficient (c_0 = 1 is exact). c_t = sum_i omega_i theta_i^(t-1) is summed in float64 from
        d products of a correctly rounded power (numpy's pow is within 1 ulp) and a scale, so
        |error| <= gamma_(d+2) sum_i |omega_i| |theta_i|^(t-1) + d 2^-1074 max |omega| (gamma_k =
        k u / (1 - k u), u = 2^-53; the last term covers underflow), and the sum of absolute
        terms is computed alike; the bound below has a factor 2 to spare. With mixed-sign scales
        the coefficients cancel and e_t can exceed |c_t|: a sensitivity built on |c| + e is still
        an upper bound."""
        return self._coefs_and_error(n)[1]

    def _coefs_and_error(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(strategy_coefs(n), coefficient_error_bounds(n)) from one power per buffer; the
        coefficients are computed by the same operations as :meth:`strategy_coefs` (same bits)."""
        n = _check_n(n)
        c = np.zeros(n)
        c[0] = 1.0
        e = np.zeros(n)
        if n > 1:
            u = 2.0**-53
            act = self.omega != 0  # a zero-scale buffer adds exact zeros
            d = int(np.count_nonzero(act))
            powers = np.arange(n - 1, dtype=np.float64)
            with np.errstate(under="ignore"):
                for th, om in zip(self.theta, self.omega, strict=True):
                    p = np.power(th, powers)
                    c[1:] += om * p
                    if om != 0:
                        e[1:] += abs(float(om)) * np.abs(p)
            e *= 2 * (d + 3) * u / (1 - (d + 3) * u)
            e[1:] += (d + 1) * 2.0**-1074 * (float(np.max(np.abs(self.omega))) if d else 0.0)
        return c, e

    def sensitivity(self, n: int, schema: Participation | None = None) -> Sensitivity:
        """L2 sensitivity of C over n steps under ``schema`` (default single participation), never
        below the true value for the parameters as stored.

        Single participation: the certified enclosure of ||c||^2 (:meth:`sensitivity_squared_single`);
        ``value`` is its upper end rounded up, ``lower`` its lower end rounded down (they differ by
        a few units of rounding). Fixed-epoch and min-sep: from the n coefficients in O(n d), each
        widened by its rounding-error bound (:meth:`coefficient_error_bounds`) before
        :func:`mfcli.strategies.toeplitz.toeplitz_sensitivity` takes absolute values (exact for non-negative,
        respectively non-negative non-increasing, coefficients; otherwise a proven upper bound).
        """
        schema = SingleParticipation() if schema is None else schema
        if isinstance(schema, SingleParticipation):
            schema.check(n)
            lo, hi = self._sens2_bounds(n)
            value, lower = sqrt_up(hi), sqrt_down(lo)
            return Sensitivity(value=value, exact=lower >= value * (1 - EXACT_RTOL), lower=lower,
                               method="BLT: closed-form column norm, certified by exact interval arithmetic",
                               schema=schema)
        coefs, err = self._coefs_and_error(n)
        return _toeplitz.toeplitz_sensitivity(coefs, n, schema, coef_error=err)

    # -- error ----------------------------------------------------------------------------

    def decoder_coefs(self, n: int, workload: Any = "prefix", *, beta: float | None = None) -> np.ndarray:
        """First column of B = A C^-1 (Toeplitz) for a Toeplitz workload, O(n d)."""
        gamma = workload_gamma(workload, beta=beta)
        return _apply_workload(gamma, self.noising_coefs(n))

    def per_step_error(self, n: int, workload: Any = "prefix", *, beta: float | None = None) -> np.ndarray:
        """||B[t, :]||^2 for t < n (without the sensitivity factor), O(n d)."""
        gamma = workload_gamma(workload, beta=beta)
        beta_t = _apply_workload(gamma, self.noising_coefs(n))
        return np.cumsum(beta_t * beta_t)

    def loss(self, n: int, *, workload: Any = "prefix", beta: float | None = None, error: str = "max",
             schema: Participation | None = None) -> float:
        """sens(C)^2 times the max or mean of the per-step errors over n steps, O(n d)."""
        if error not in ERRORS:
            raise MfcliError(f"error must be one of {', '.join(ERRORS)}, got {error!r}")
        err = self.per_step_error(n, workload, beta=beta)
        sens = self.sensitivity(n, schema).value
        return sens * sens * float(err[-1] if error == "max" else err.mean())

    def max_loss_closed_form(self, n: int, workload: Any = "prefix", *, beta: float | None = None) -> float:
        """Single-participation max loss in O(d^2), independent of n: ||c||^2 ||beta||^2 with
        beta_t = sum_j rho_j mu_j^t the exponential-sum form of B's first column
        (docs/structured.md, "BLT")."""
        n = _check_n(n)
        gamma = workload_gamma(workload, beta=beta)
        lam, omp = _inverse_parameters(self.theta, self.omega)
        rho, mu = _decoder_terms(lam, omp, gamma)
        g, _ = _geom(np.outer(mu, mu).real, n)
        return self.sensitivity_squared_single(n) * float((rho @ g @ rho).real)

    def limit_max_loss_rate(self) -> float:
        """lim max loss / n as n -> infinity (prefix, single participation): K^2 ||c||_inf^2 with
        K = 1 / C(1) = 1 / (1 + sum_i omega_i / (1 - theta_i)). A BLT's max loss grows linearly in
        n, so a BLT is near-optimal only up to the horizon it was optimised for."""
        k = 1.0 / (1.0 + float(np.sum(self.omega / (1 - self.theta))))
        g = 1.0 / (1 - np.outer(self.theta, self.theta))
        return k * k * float(1.0 + self.omega @ g @ self.omega)


@dataclass(frozen=True, eq=False)
class BltRecursion(BufferRecursion):
    """The noise operator of a BLT strategy, streamed in its parallel (buffer) form rather than
    as a polynomial ratio: x = C^-1 z by C's own buffers, x_t = z_t - sum_i omega_i s_i, then
    s_i <- theta_i s_i + x_t (as :func:`mfcli.training.noise.strategy_stream`); for iterate noise the
    output then runs through the workload's filter 1 / post_den (y_t = x_t - sum_k post_den_k
    y_{t-k}). The polynomial form of C^-1 moves poles that cluster near 1: in float32 an
    optimised 4-buffer BLT at n = 10^5 gets a different operator (coefficients off by 5e-4);
    the buffer form keeps each decay as its own number.

    ``width`` 0 (no noise rows are kept) and ``rank`` = buffers + len(post_den) - 1 state rows
    (kept in checkpoints, like running sums).
    """

    theta: np.ndarray
    omega: np.ndarray
    post_den: np.ndarray
    size: int

    @property
    def buffers(self) -> int:
        return int(self.theta.size)

    @property
    def width(self) -> int:
        return 0

    @property
    def rank(self) -> int:
        return self.buffers + int(self.post_den.size - 1)

    def coefs(self) -> np.ndarray:
        """The first column (impulse response), length n, from the exponential-sum form."""
        import scipy.signal

        d = BufferedToeplitz(theta=self.theta, omega=self.omega).noising_coefs(self.size)
        return scipy.signal.lfilter([1.0], self.post_den, d)

    def dense(self) -> np.ndarray:
        return _toeplitz.materialize(self.coefs(), self.size)

    def fingerprint_arrays(self) -> tuple[np.ndarray, ...]:
        return (self.theta, self.omega, self.post_den, np.array([float(self.size)]))


def _inverse_parameters(theta: np.ndarray, omega: np.ndarray, *, allow_complex: bool = False
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(lambda, omega') of C^-1 (see :meth:`BufferedToeplitz.inverse`); complex conjugate pairs
    only with ``allow_complex`` (possible only when some omega_i < 0)."""
    lam, omp, _ = _inverse_with_gaps(theta, omega, allow_complex=allow_complex)
    return lam, omp


def _inverse_with_gaps(theta: np.ndarray, omega: np.ndarray, *, allow_complex: bool = False
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lambda, omega', gaps) of C^-1 over the buffers with omega_i != 0, where gaps[k, i] =
    theta_i - lambda_k to relative rounding (:func:`_secular_roots`), also when lambda_k lies
    within rounding of a decay theta_i, as it does for a buffer of tiny scale: theta_i - lambda_k
    computed from the rounded lambda_k would be wrong there, and with it omega'_k and the whole
    noising matrix (the optimiser then minimised a loss that C did not have)."""
    keep = omega != 0  # a buffer with omega_i = 0 does not act
    th, om = theta[keep], omega[keep]
    if th.shape[0] == 0:
        return np.zeros(0), np.zeros(0), np.zeros((0, 0))
    roots = np.linalg.eigvals(np.diag(th) - np.outer(np.ones(th.shape[0]), om))
    # For omega > 0 the roots are real and interlace the decays (f is increasing between poles),
    # so an imaginary part is rounding; otherwise a complex pair means no real inverse BLT.
    real = bool(np.all(om > 0)) or not np.any(np.abs(roots.imag) > 1e-8 * max(1.0, float(np.max(np.abs(roots)))))
    if real:
        lam, diff = _secular_roots(np.sort(roots.real), th, om)
    elif allow_complex:
        lam = roots
        diff = th[None, :] - lam[:, None]
    else:
        raise MfcliError("C^-1 is not a real BLT (complex decays); use positive output scales omega")
    if np.any(np.abs(diff) < 1e-300):
        raise MfcliError("C^-1 is not a BLT with distinct decays")
    s2 = np.sum(om[None, :] / diff**2, axis=1)
    return lam, -1.0 / s2, diff


def _secular_roots(lam: np.ndarray, th: np.ndarray, om: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The real roots of f(lambda) = sum_i omega_i / (theta_i - lambda) - 1 near the estimates
    ``lam``, and gaps[k, i] = theta_i - lambda_k accurate to relative rounding.

    Each root is written lambda_k = theta_o + tau_k from its nearest decay theta_o, so that
    theta_i - lambda_k = (theta_i - theta_o) - tau_k has no cancellation (it is exactly -tau_k for
    i = o), and tau_k is found by Newton's method on G(tau) = -tau f(theta_o + tau) = omega_o +
    tau R(tau), R(tau) = 1 - sum_{i != o} omega_i / (theta_i - theta_o - tau): G is smooth at the
    pole theta_o, so Newton converges to full relative precision in tau even when the root lies
    within rounding of theta_o (omega_o tiny: tau ~ -omega_o / R(0)). A step is kept only where it
    reduces |G|."""
    d = th.shape[0]
    o = np.argmin(np.abs(th[None, :] - lam[:, None]), axis=1)
    base = th[o]
    delta = th[None, :] - base[:, None]          # theta_i - theta_o, exactly 0 at i = o
    others = np.arange(d)[None, :] != o[:, None]
    om_o = om[o]
    tau = lam - base

    def g_and_slope(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        gap = np.where(others, delta - t[:, None], 1.0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            r = 1.0 - np.sum(np.where(others, om / gap, 0.0), axis=1)
            rp = -np.sum(np.where(others, om / gap**2, 0.0), axis=1)
            return om_o + t * r, r + t * rp

    g, gp = g_and_slope(tau)
    for _ in range(8):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            cand = tau - g / gp
        g2, gp2 = g_and_slope(cand)
        better = np.isfinite(g2) & np.isfinite(cand) & (np.abs(g2) < np.abs(g))
        if not np.any(better):
            break
        tau = np.where(better, cand, tau)
        g = np.where(better, g2, g)
        gp = np.where(better, gp2, gp)
    return base + tau, delta - tau[:, None]


def _inverse_jacobian(theta: np.ndarray, omega: np.ndarray, lam: np.ndarray, omp: np.ndarray,
                      gaps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """d(lambda, omega')/d(theta, omega) by implicit differentiation of the secular equation:
    two d x 2d matrices (columns: theta then omega). Requires omega_i != 0. ``gaps``: theta_i -
    lambda_k to relative rounding (:func:`_inverse_with_gaps`); default computed from lambda."""
    diff = theta[None, :] - lam[:, None] if gaps is None else gaps          # (k, i)
    inv1, inv2 = 1.0 / diff, 1.0 / diff**2
    s2 = inv2 @ omega
    s3 = (inv2 * inv1) @ omega
    dlam_dth = omega[None, :] * inv2 / s2[:, None]
    dlam_dom = -inv1 / s2[:, None]
    ds2_dth = -2 * omega[None, :] * inv2 * inv1 + 2 * s3[:, None] * dlam_dth
    ds2_dom = inv2 + 2 * s3[:, None] * dlam_dom
    # omega' = -1 / s2
    scale = (1.0 / s2**2)[:, None]
    return np.hstack([dlam_dth, dlam_dom]), np.hstack([ds2_dth * scale, ds2_dom * scale])


def _decoder_terms(lam: np.ndarray, omp: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """B's first column as an exponential sum beta_t = sum_j rho_j mu_j^t (t >= 0).

    D(z) = 1 + sum_k omega'_k z / (1 - lambda_k z); z / ((1 - z)(1 - lambda z)) =
    (1/(1-z) - 1/(1-lambda z)) / (1 - lambda), so the prefix sum has mu = (1, lambda) and
    rho = (K, -omega' / (1 - lambda)), K = 1 + sum_k omega'_k / (1 - lambda_k); momentum then
    maps rho mu^t to rho (mu^(t+1) - gamma^(t+1)) / (mu - gamma). Works with complex input (for
    complex-step derivatives)."""
    a = -omp / (1 - lam)
    rho = np.concatenate([[1.0 - np.sum(a)], a])
    mu = np.concatenate([[1.0], lam])
    if gamma:
        w = rho / (mu - gamma)
        rho = np.concatenate([w * mu, [-gamma * np.sum(w)]])
        mu = np.concatenate([mu, [gamma]])
    return rho, mu


# ---------------------------------------------------------------------------------------------
# Losses with gradients for the optimiser (parameters theta in (0, 1), omega > 0)


# The mean error's weights: sum_t err_t = sum_{s<n} (n - s) beta_s^2, so with beta_s = sum_j rho_j
# mu_j^s the mean error is sum_jl rho_j rho_l W_n(mu_j mu_l) / n, W_n(x) = sum_{s<n} (n - s) x^s.
# phi_k(u) = int_0^1 v^k e^(uv) dv (k = 0, 1, 2) carries W_n and W_n' stably near x = 1.
_PHI_TERMS = 30
_PHI_SERIES = [np.array([1.0 / (math.factorial(j) * (j + k + 1)) for j in range(_PHI_TERMS)]) for k in range(3)]


def _phi(u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """phi_0, phi_1, phi_2 at u <= 0 (elementwise): their Taylor series sum_j u^j / (j! (j+k+1))
    for |u| <= 2 (30 terms: truncation below 1e-23), the closed forms (e^u - 1)/u,
    (e^u (u - 1) + 1)/u^2 and (e^u (u^2 - 2u + 2) - 2)/u^3 beyond (where they lose at most a
    factor of about 4 to cancellation)."""
    u = np.asarray(u, dtype=np.float64)
    out = [np.empty_like(u) for _ in range(3)]
    near = np.abs(u) <= 2.0
    un = u[near]
    for k in range(3):
        out[k][near] = np.polynomial.polynomial.polyval(un, _PHI_SERIES[k])
    uf = u[~near]
    with np.errstate(under="ignore", over="ignore"):
        e = np.exp(uf)
    out[0][~near] = np.expm1(uf) / uf
    out[1][~near] = (e * (uf - 1) + 1) / (uf * uf)
    out[2][~near] = (e * (uf * (uf - 2) + 2) - 2) / (uf * uf * uf)
    return out[0], out[1], out[2]


def _mean_weights(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """W_n(x) = sum_{s<n} (n - s) x^s and W_n'(x), elementwise for -1 < x <= 1.

    For x > 1/2, x = e^L: with M_k = sum_{s<n} s^k e^(sL) = d^k/dL^k (n phi_0(nL) / phi_0(L)),
    W = n M_0 - M_1 = n (n R (phi_0(u) - phi_1(u)) - phi_0(u) R') and dW/dL = n M_1 - M_2 =
    n (n^2 R (phi_1(u) - phi_2(u)) + n R' (phi_0(u) - 2 phi_1(u)) - phi_0(u) R''), where u = nL,
    R = 1/phi_0(L), R' = -phi_1/phi_0^2, R'' = (2 phi_1^2 - phi_0 phi_2)/phi_0^3 at L. The first
    is a sum of positive terms and the second cancels by at most a factor of about 3, so both are
    accurate to a few ulps when n (1 - x) is tiny -- where (n(1-x) - x(1-x^n))/(1-x)^2 loses
    every digit. For x <= 1/2 (1 - x >= 1/2) the rational forms are used:
    W = (n y - x (1 - x^n)) / y^2 and W' = (2 n y - (1 - x^n)(n + 1 - (n - 1) x)) / y^3, y = 1 - x.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.empty_like(x)
    dw = np.empty_like(x)
    pos = x > 0.5
    xp = x[pos]
    lg = np.log(xp)
    p0, p1, p2 = _phi(lg)
    q0, q1, q2 = _phi(n * lg)
    r = 1.0 / p0
    r1 = -p1 / (p0 * p0)
    r2 = (2 * p1 * p1 - p0 * p2) / (p0 * p0 * p0)
    w[pos] = n * (n * r * (q0 - q1) - q0 * r1)
    dw[pos] = n * (n * n * r * (q1 - q2) + n * r1 * (q0 - 2 * q1) - q0 * r2) / xp
    xo = x[~pos]
    y = 1.0 - xo
    with np.errstate(under="ignore"):
        xn = np.power(xo, n)
    w[~pos] = (n * y - xo * (1 - xn)) / (y * y)
    dw[~pos] = (2 * n * y - (1 - xn) * (n + 1 - (n - 1) * xo)) / (y * y * y)
    return w, dw


def _err_and_grad_closed(theta: np.ndarray, omega: np.ndarray, n: int, gamma: float, error: str
                         ) -> tuple[float, np.ndarray]:
    """The max error ||beta||^2 = sum_jl rho_j rho_l G_n(mu_j mu_l) or the mean error
    sum_jl rho_j rho_l W_n(mu_j mu_l) / n (beta = B's first column, an exponential sum; see
    :func:`_decoder_terms`) and its gradient in (theta, omega), O(d^2) whatever n is."""
    d = theta.shape[0]
    lam, omp, gaps = _inverse_with_gaps(theta, omega)
    rho, mu = _decoder_terms(lam, omp, gamma)
    if error == "max":
        g2, dg2 = _geom(np.outer(mu, mu), n)
    else:
        g2, dg2 = _mean_weights(np.outer(mu, mu), n)
        g2, dg2 = g2 / n, dg2 / n
    err = float(rho @ g2 @ rho)
    ge_rho = 2 * g2 @ rho
    ge_mu = 2 * rho * ((dg2 * mu[None, :]) @ rho)
    # (lambda, omega') -> (rho, mu): complex-step derivatives of the arithmetic map (exact to
    # rounding: no subtraction of nearly equal numbers is differentiated).
    h = 1e-30
    g_lam = np.zeros(d)
    g_omp = np.zeros(d)
    for k in range(d):
        for which, out in ((0, g_lam), (1, g_omp)):
            lc = lam.astype(complex)
            oc = omp.astype(complex)
            (lc if which == 0 else oc)[k] += 1j * h
            r, m = _decoder_terms(lc, oc, gamma)
            out[k] = float((ge_rho @ r.imag + ge_mu @ m.imag) / h)
    j_lam, j_omp = _inverse_jacobian(theta, omega, lam, omp, gaps)
    return err, g_lam @ j_lam + g_omp @ j_omp


#: Benchmarks only (scripts/bench_blt.py --direct): make :func:`optimize_blt` evaluate every
#: objective by the O(n d) :func:`_loss_and_grad_general`, as it did before the closed forms.
_FORCE_DIRECT_OBJECTIVE = False

#: The most blocks (participations' strides) for which the sensitivity of a multi-participation
#: schema is summed block by block in :func:`_sens2_and_grad_blocks` (O(blocks d^2)); beyond, the
#: optimiser uses the O(n d) objective.
MAX_CLOSED_BLOCKS = 4096


def _closed_form_applies(n: int, schema: Participation) -> bool:
    """Whether :func:`_loss_and_grad_closed` evaluates the loss under ``schema`` (it does for
    single participation always, for fixed-epoch and min-sep up to :data:`MAX_CLOSED_BLOCKS`
    strides of the earliest pattern)."""
    sep, _ = _toeplitz.schema_shape(n, schema)
    return -(-n // sep) <= MAX_CLOSED_BLOCKS


def _sens2_and_grad_blocks(theta: np.ndarray, omega: np.ndarray, n: int, schema: Participation
                           ) -> tuple[float, np.ndarray]:
    """sens(C)^2 = ||v||^2, v = C 1_P for the earliest pattern P = {0, s, .., (k-1) s} of
    ``schema`` (what :func:`mfcli.strategies.toeplitz._sens2_and_grad` computes from the n coefficients, with
    c_0 lifted to c_1 under min-sep when c_1 > c_0, as the O(n d) objective does), and its gradient
    in (theta, omega), in O(Q d^2) for Q = ceil(n / s) blocks (single participation: Q = 1, the
    closed form of :meth:`BufferedToeplitz.sensitivity_squared_single`).

    Block q holds steps q s + r, r < L_q = min(s, n - q s), and v_{qs+r} = sum_{j=lo_q}^{q}
    c_{js+r} with lo_q = max(0, q - k + 1). With x_i = theta_i^s and c_t = sum_i omega_i
    theta_i^(t-1) (t >= 1): for r >= 1, v = sum_i a_i(q) theta_i^(r-1) with a_i(q) = omega_i
    sum_{j=lo_q}^{q} x_i^j, so sum_{1<=r<L_q} v^2 = a(q)^T G_{L_q-1}(theta theta^T) a(q); for r = 0,
    v = c_0 [lo_q = 0] + sum_i omega_i theta_i^(s-1) sum_{j=max(lo_q,1)}^{q} x_i^(j-1). The
    window sums are x^a G_m(x) with G_m(x) = sum_{j<m} x^j summed directly (positive terms)."""
    sep, k = _toeplitz.schema_shape(n, schema)
    k = min(k, -(-n // sep))
    nq = -(-n // sep)
    d = theta.shape[0]
    lift = isinstance(schema, MinSeparation) and n > 1 and float(np.sum(omega)) > 1.0
    c0 = float(np.sum(omega)) if lift else 1.0
    with np.errstate(under="ignore"):
        x = np.power(theta, sep)
        p = np.power(theta, sep - 1)
        dp = (sep - 1) * np.power(theta, max(sep - 2, 0)) if sep > 1 else np.zeros(d)
        # G_m(x_i), G_m'(x_i) for m <= nq by direct (positive) sums
        jj = np.arange(nq, dtype=np.float64)[:, None]
        pw = np.power(x[None, :], jj)                                       # x^j, j < nq
        pw1 = np.vstack([np.zeros((1, d)), jj[1:] * np.power(x[None, :], jj[1:] - 1)]) if nq > 1 else np.zeros((1, d))
    gtab = np.vstack([np.zeros((1, d)), np.cumsum(pw, axis=0)])             # G_m, m = 0..nq
    dgtab = np.vstack([np.zeros((1, d)), np.cumsum(pw1, axis=0)])
    q = np.arange(nq)
    lo = np.maximum(0, q - k + 1)

    def window(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """sum_{a<=j<b} x^j = x^a G_{b-a}(x) and its derivative in x, per (q, i)."""
        m = b - a
        with np.errstate(under="ignore"):
            xa = np.power(x[None, :], a[:, None])
            xa1 = np.where(a[:, None] > 0, a[:, None] * np.power(x[None, :], np.maximum(a - 1, 0)[:, None]), 0.0)
        return xa * gtab[m], xa1 * gtab[m] + xa * dgtab[m]

    wv, dwv = window(lo, q + 1)                        # sum_{j=lo}^{q} x^j
    lo1 = np.maximum(lo, 1)
    uv, duv = window(lo1 - 1, q)                       # sum_{j=lo1}^{q} x^(j-1) (empty for q = 0)
    first = (lo == 0).astype(np.float64)
    big_a = c0 * first + uv @ (omega * p)              # v at r = 0, per block
    av = omega[None, :] * wv                           # a_i(q)
    dx = sep * p                                       # dx_i / dtheta_i
    lengths = np.minimum(sep, n - q * sep)
    total = float(big_a @ big_a)
    g_th = 2 * (big_a @ (uv * dp[None, :] + duv * (p * dx)[None, :])) * omega
    g_om = 2 * (big_a @ uv) * p + (2 * float(big_a @ first) if lift else 0.0)
    for length in np.unique(lengths):
        rows = lengths == length
        gm, dgm = _geom(np.outer(theta, theta), int(length) - 1)
        a = av[rows]
        ma = a @ gm                                    # (M a)_i per block (M symmetric)
        total += float(np.sum(ma * a))
        g_om += 2 * np.sum(ma * wv[rows], axis=0)
        g_th += 2 * np.sum(ma * dwv[rows], axis=0) * omega * dx
        g_th += 2 * np.sum(a * ((a * theta[None, :]) @ dgm.T), axis=0)
    return total, np.concatenate([g_th, g_om])


def _loss_and_grad_closed(theta: np.ndarray, omega: np.ndarray, n: int, gamma: float, error: str = "max",
                          schema: Participation | None = None) -> tuple[float, np.ndarray]:
    """Max or mean loss and its gradient in (theta, omega) without the n coefficients: O(d^2)
    under single participation, O(Q d^2) under a schema whose earliest pattern spans Q blocks
    (:func:`_sens2_and_grad_blocks`; the optimiser uses it when :func:`_closed_form_applies`).
    Equal to :func:`_loss_and_grad_general` (the O(n d) evaluator) to rounding."""
    schema = SingleParticipation() if schema is None else schema
    sens2, gs = _sens2_and_grad_blocks(theta, omega, n, schema)
    err, ge = _err_and_grad_closed(theta, omega, n, gamma, error)
    return float(sens2 * err), err * gs + sens2 * ge


def _power_sums(base: np.ndarray, weights: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """For each base b_k: sum_{s<m} w_s b_k^s and sum_{s<m} s w_s b_k^(s-1) (w of length m)."""
    s = np.arange(m, dtype=np.float64)
    out0 = np.empty(base.shape[0])
    out1 = np.empty(base.shape[0])
    with np.errstate(under="ignore"):
        for k, b in enumerate(base):
            p = np.power(b, s)
            out0[k] = weights @ p
            out1[k] = (weights[1:] * s[1:]) @ p[:-1] if m > 1 else 0.0
    return out0, out1


def _loss_and_grad_general(theta: np.ndarray, omega: np.ndarray, n: int, gamma: float, error: str,
                           schema: Participation) -> tuple[float, np.ndarray]:
    """Max or mean loss under any schema and its gradient in (theta, omega), O(n d)."""
    blt = BufferedToeplitz(theta=theta, omega=omega)
    lam, omp, gaps = _inverse_with_gaps(theta, omega)
    dcoef = np.zeros(n)
    dcoef[0] = 1.0
    s_idx = np.arange(n - 1, dtype=np.float64)
    with np.errstate(under="ignore", over="ignore"):
        for la, om in zip(lam, omp, strict=True):
            dcoef[1:] += om * np.power(la, s_idx)
    beta = _apply_workload(gamma, dcoef)
    err_t = np.cumsum(beta * beta)
    if error == "max":
        err = float(err_t[-1])
        g_beta = 2 * beta
    else:
        err = float(err_t.mean())
        g_beta = 2 * beta * (n - np.arange(n)) / n
    g_d = _apply_workload_adjoint(gamma, g_beta)
    # d_t = sum_k omega'_k lambda_k^(t-1), t >= 1
    s0, s1 = _power_sums(lam, g_d[1:], n - 1)
    g_omp = s0
    g_lam = omp * s1
    j_lam, j_omp = _inverse_jacobian(theta, omega, lam, omp, gaps)
    ge = g_lam @ j_lam + g_omp @ j_omp
    c = blt.strategy_coefs(n)
    if isinstance(schema, SingleParticipation):
        sens2 = float(c @ c)
        g_c = 2 * c
    else:
        b, k = _toeplitz.schema_shape(n, schema)
        chat = c.copy()
        lift = isinstance(schema, MinSeparation) and n > 1 and c[1] > c[0]
        if lift:  # for omega > 0 the reverse cummax of c changes c_0 only: max(1, c_1)
            chat[0] = c[1]
        sens2, g_c = _toeplitz._sens2_and_grad(chat, n, b, k)
        if lift:
            g_c[1] += g_c[0]
        g_c[0] = 0.0
    t0, t1 = _power_sums(theta, g_c[1:], n - 1)
    gs = np.concatenate([omega * t1, t0])
    return sens2 * err, err * gs + sens2 * ge


# ---------------------------------------------------------------------------------------------
# Optimisation


@dataclass(frozen=True, kw_only=True, eq=False)
class BltOptimum:
    """The result of :func:`optimize_blt`.

    Attributes:
        blt: the best strategy found.
        loss: its loss, recomputed in O(n d) from ``blt`` (not the optimiser's value).
        error: ``max`` or ``mean``.
        n, workload, beta, schema: the problem.
        start_losses: the optimiser's loss reached from each start, over every level of
            buffers tried (1 to ``buffers``), in order.
        seconds: wall time.
    """

    blt: BufferedToeplitz
    loss: float
    error: str
    n: int
    workload: str
    beta: float | None
    schema: Participation
    start_losses: tuple[float, ...] = field(default_factory=tuple)
    seconds: float = 0.0


def quadrature_start(n: int, buffers: int, *, low: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A BLT approximating the square-root factorization, c_t ~ binom(2t, t) / 4^t.

    Those coefficients are the moments of the arcsine law, c_t = E[S^t], S ~ Beta(1/2, 1/2), so
    (1 - z)^(-1/2) = E[1 / (1 - S z)], a Stieltjes function; a d-point quadrature of S gives the
    rational (BLT) approximation c_t ~ sum_i w_i s_i^t, i.e. theta_i = s_i, omega_i = w_i s_i.
    The nodes are spread geometrically in 1 - s from ``low`` (default 1/(2n)) to 1.
    """
    low = 1.0 / (2 * n) if low is None else low
    edges = np.geomspace(low, 1.0, buffers + 1)  # in u = 1 - s
    cdf = (2 / np.pi) * np.arcsin(np.sqrt(1 - edges))  # P(S <= 1 - u)
    weights = cdf[:-1] - cdf[1:]
    weights[0] += 1 - cdf[0]  # the mass above 1 - low goes to the slowest buffer
    nodes = 1 - np.sqrt(edges[:-1] * edges[1:])
    return nodes, weights * nodes


def optimize_blt(
    *,
    n: int,
    buffers: int,
    workload: Any = "prefix",
    beta: float | None = None,
    error: str = "max",
    schema: Participation | None = None,
    starts: int = 3,
    max_iter: int = 500,
    seed: int = 0,
) -> BltOptimum:
    """The BLT with ``buffers`` buffers minimising max or mean loss over n steps.

    L-BFGS-B on theta = sigmoid(x), omega = exp(y) (so theta in (0, 1), omega > 0, and C^-1
    is a real BLT), minimising log(loss) with analytic gradients: max and mean error in closed
    form (O(d^2), n-independent), times the sensitivity in closed form (O(d^2) for single
    participation, O(Q d^2) under fixed-epoch or min-sep whose earliest pattern spans Q blocks);
    beyond :data:`MAX_CLOSED_BLOCKS` blocks the O(n d) form. All differentiate through the
    inverse BLT by implicit differentiation of its secular equation.
    Buffers are added one at a time, each level warm-started from the previous level's optimum
    plus one new small buffer. At the requested level also: the quadrature start
    (:func:`quadrature_start`) at two horizons, seeded random perturbations of it, and decays
    spread geometrically in 1 - theta; when the best result has two (nearly) equal decays, one of
    them is re-placed and optimised again (up to two rounds). Each level's loss is recomputed in
    O(n d) from its BLT, and a level that does not beat the previous one keeps that BLT padded with
    zero-scale buffers, so the returned loss is non-increasing in ``buffers`` (the returned BLT
    has ``buffers`` buffers, some possibly with omega = 0, unless two decays coincide exactly
    and are merged). Overflowing trial points count
    as an infinite loss, without floating-point warnings.

    Raises:
        MfcliError: n, buffers, error, workload or schema out of range.
    """
    from scipy.optimize import minimize

    t_start = time.perf_counter()
    n = _check_n(n)
    if n < 2:
        raise MfcliError(f"n must be at least 2 to optimise a BLT, got {n}")
    buffers = check_buffers(buffers)
    if error not in ERRORS:
        raise MfcliError(f"error must be one of {', '.join(ERRORS)}, got {error!r}")
    starts = step_count(starts, name="starts")
    schema = SingleParticipation() if schema is None else schema
    if not isinstance(schema, (SingleParticipation, FixedEpoch, MinSeparation)):
        raise TypeError(f"schema must be a participation schema, got {type(schema).__name__}")
    schema.check(n)
    gamma = workload_gamma(workload, beta=beta)
    name = workload.name if hasattr(workload, "name") else str(workload)
    closed = _closed_form_applies(n, schema) and not _FORCE_DIRECT_OBJECTIVE

    def objective(x: np.ndarray, k: int) -> tuple[float, np.ndarray]:
        theta = 1 / (1 + np.exp(-x[:k]))
        omega = np.exp(x[k:])
        # Trial points of the line search may overflow (decays near 1, huge scales): such a point
        # is rejected as +inf-like rather than warning on stderr.
        try:
            with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
                if closed:
                    val, g = _loss_and_grad_closed(theta, omega, n, gamma, error, schema)
                else:
                    val, g = _loss_and_grad_general(theta, omega, n, gamma, error, schema)
        except (MfcliError, np.linalg.LinAlgError, FloatingPointError):
            return 1e300, np.zeros_like(x)
        if not (np.isfinite(val) and val > 0 and np.all(np.isfinite(g))):
            return 1e300, np.zeros_like(x)
        chain = np.concatenate([theta * (1 - theta), omega])
        return math.log(val), g * chain / val

    rng = np.random.default_rng(seed)
    reached: list[float] = []

    def solve(k: int, prev: np.ndarray | None, n_starts: int, rounds: int) -> tuple[float, np.ndarray]:
        """The best (log loss, x) for k buffers: quadrature, geometric and random starts, plus a
        warm start from the (k-1)-buffer optimum ``prev`` with one new buffer, then up to
        ``rounds`` re-placements of a duplicated decay."""
        inits = []
        if n_starts:
            for low in (1.0 / (2 * n), 1.0 / (8 * n)):
                th, om = quadrature_start(n, k, low=low)
                inits.append(np.concatenate([np.log(th / (1 - th)), np.log(om)]))
            while len(inits) < n_starts:
                inits.append(inits[0] + rng.normal(scale=0.5, size=2 * k))
            inits = inits[:n_starts]
            inits.append(_geometric_start(n, k))
        if prev is not None:
            warm = _insert_buffer(prev, k - 1)
            # only the most promising warm start (by its starting loss): each run costs
            warm = [min(warm, key=lambda x0: objective(x0, k)[0])]
            inits.extend(warm)
        bounds = [(-25.0, 25.0)] * k + [(-40.0, 5.0)] * k
        best: tuple[float, np.ndarray] | None = None

        def run(x0: np.ndarray) -> None:
            nonlocal best
            res = minimize(objective, x0, args=(k,), jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": max_iter, "ftol": 1e-13, "gtol": 1e-9, "maxcor": 20})
            val = float(res.fun)
            reached.append(val)
            if best is None or val < best[0]:
                best = (val, res.x)

        for x0 in inits:
            run(x0)
        # Two equal decays are a saddle the gradient cannot leave (the loss is symmetric in the
        # pair): the optimiser then sits on a (d-1)-buffer BLT. Re-place one of the pair below the
        # fastest, above the slowest, or in the widest gap of the decays, and optimise again.
        for _ in range(rounds):
            assert best is not None
            x = best[1]
            order = np.argsort(x[:k])
            logits = x[:k][order]
            gaps = np.diff(logits)
            if k < 2 or gaps.min() > 1e-3 * max(1.0, float(np.abs(logits).max())):
                break
            dup = int(order[int(np.argmin(gaps)) + 1])
            widest = int(np.argmax(gaps))
            for target in (logits[0] - 2.0, logits[-1] + 2.0, (logits[widest] + logits[widest + 1]) / 2):
                x0 = x.copy()
                x0[dup] = min(max(target, -24.0), 24.0)
                x0[k + dup] = x[k + dup] - 1.0
                run(x0)
        assert best is not None
        return best

    # The k-buffer family contains every (k-1)-buffer BLT (a zero-scale buffer does not act), so
    # buffers are added one at a time, each level warm-started from the previous optimum, and a
    # level that does not beat the previous one keeps it: the loss is non-increasing in k.
    wname, wbeta = ("momentum", gamma) if gamma else ("prefix", None)

    def assemble(x: np.ndarray, k: int) -> tuple[float, BufferedToeplitz] | None:
        """The BLT at optimiser point x and its loss recomputed in O(n d) (None if invalid)."""
        theta = 1 / (1 + np.exp(-x[:k]))
        omega = np.where(x[k:] <= _ZERO_SCALE, 0.0, np.exp(np.maximum(x[k:], -745.0)))
        # A scale negligible next to the others (e.g. at its bound) is set to zero: the buffer
        # then does not act, instead of leaving a root of the inverse within rounding of its decay.
        omega = np.where(omega < 1e-12 * float(np.max(omega)), 0.0, omega)
        try:
            with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
                cand = _canonical(theta, omega)
                val = float(cand.loss(n, workload=wname, beta=wbeta, error=error, schema=schema))
        except (MfcliError, np.linalg.LinAlgError):
            return None
        return (val, cand) if math.isfinite(val) else None

    # The k-buffer family contains every (k-1)-buffer BLT (a zero-scale buffer does not act), so
    # buffers are added one at a time, each level warm-started from the previous optimum; a level
    # whose recomputed loss does not beat the previous level keeps that BLT, embedded with
    # zero-scale buffers: the returned loss is non-increasing in the number of buffers.
    best: tuple[float, BufferedToeplitz] | None = None
    best_x, best_k = np.zeros(0), 0
    for k in range(1, buffers + 1):
        # Lower levels only seed the next one: warm starts only (one quadrature start for a
        # single buffer), no re-placement rounds; the requested level gets every start.
        top = k == buffers
        _, x = solve(k, best_x if best_k else None, starts if top else int(k == 1), 2 if top else 0)
        got = assemble(x, k)
        if got is not None and (best is None or got[0] < best[0]):
            best, best_x, best_k = got, x, k
        elif best_k:
            best_x = _embed(best_x, best_k, k)
            best_k = k
    if best is None:
        raise MfcliError("the BLT optimisation found no valid strategy")
    loss, blt = best
    if blt.buffers < buffers:  # keep the requested shape: extra buffers with scale zero
        got = assemble(best_x, best_k)
        if got is not None and got[0] == loss:
            loss, blt = got
    return BltOptimum(blt=blt, loss=loss, error=error, n=n, workload=name, beta=gamma if gamma else None,
                      schema=schema, start_losses=tuple(math.exp(v) if v < 700 else math.inf for v in reached),
                      seconds=time.perf_counter() - t_start)


_ZERO_SCALE = -1e3  # a log-scale at or below this marks a buffer embedded with omega = 0


def _geometric_start(n: int, k: int) -> np.ndarray:
    """Optimiser start (logit theta, log omega) with decays spread geometrically in 1 - theta
    from 1/n to 1/2 (distinct and well separated) and equal scales summing to 1/2."""
    u = np.geomspace(1.0 / n, 0.5, k) if k > 1 else np.array([1.0 / math.sqrt(n)])
    th = 1 - u
    return np.concatenate([np.log(th / u), np.full(k, math.log(0.5 / k))])


def _insert_buffer(x: np.ndarray, k: int) -> list[np.ndarray]:
    """Starts for k + 1 buffers from a k-buffer point x: a new buffer with a small scale below
    the fastest decay, above the slowest, and in the widest gap (in logit theta)."""
    logits, logs = x[:k], np.maximum(x[k:], -40.0)
    lo, hi = float(logits.min()), float(logits.max())
    targets = [lo - 2.0, hi + 2.0]
    if k > 1:
        srt = np.sort(logits)
        i = int(np.argmax(np.diff(srt)))
        targets.append(float(srt[i] + srt[i + 1]) / 2)
    small = float(logs.max()) - 3.0
    return [np.concatenate([logits, [min(max(t, -24.0), 24.0)], logs, [max(small, -39.0)]]) for t in targets]


def _embed(x: np.ndarray, k: int, m: int) -> np.ndarray:
    """The k-buffer point x as an m-buffer one: the extra buffers get distinct decays and scale
    zero (log-scale :data:`_ZERO_SCALE`), so they do not act."""
    extra = m - k
    logits = np.concatenate([x[:k], float(np.min(x[:k])) - 2.0 - 2.0 * np.arange(extra)])
    return np.concatenate([logits, x[k:], np.full(extra, 2 * _ZERO_SCALE)])


def _canonical(theta: np.ndarray, omega: np.ndarray) -> BufferedToeplitz:
    """Sorted by decay, equal decays merged (their scales add), so the BLT validates."""
    order = np.argsort(theta)
    theta, omega = theta[order], omega[order]
    keep_t: list[float] = []
    keep_o: list[float] = []
    for th, om in zip(theta, omega, strict=True):
        if keep_t and th == keep_t[-1]:
            keep_o[-1] += om
        else:
            keep_t.append(float(th))
            keep_o.append(float(om))
    return BufferedToeplitz(theta=np.array(keep_t), omega=np.array(keep_o))


__all__ = [
    "BltOptimum",
    "BufferedToeplitz",
    "check_buffers",
    "optimize_blt",
    "quadrature_start",
    "workload_gamma",
]
