"""Lower-triangular Toeplitz strategies that never form an n x n matrix: the common primitives and
the banded Toeplitz kind.

A lower-triangular Toeplitz matrix is given by its first column (its *coefficients*); products and
inverses of such matrices are Toeplitz again, and the first column of a product is the causal
convolution of the first columns, cut at n. So for a Toeplitz workload A, strategy C and decoder
B = A C^-1:

* the noising matrix C^-1 has coefficients ``inverse_coefs(c, n)``: the impulse response of the
  filter 1 / c(z), O(n b) for b stored coefficients;
* the decoder's coefficients beta = A C^-1 e_0 are the impulse response of a(z) / c(z), where the
  workload a(z) is a short rational filter (prefix: 1 / (1 - z); momentum: 1 / ((1 - z)(1 - beta z)));
* row t of B is (beta_t, ..., beta_0), so the per-step error is err_t = sens^2 sum_{k<=t} beta_k^2
  (mfcli's loss convention: noise multiplier 1, clip norm 1, sens the schema's sensitivity),
  the mean loss is err.sum() / n and the max loss is err_{n-1} = sens^2 ||beta||^2.

Learning-rate schedules are *not* Toeplitz (A = M_eta M_beta scales column j by eta_j), so only
the constant schedule is accepted here.

Sensitivity of a Toeplitz C (first column c, n columns) under a participation schema
(:func:`toeplitz_sensitivity`; the proof is in docs/concepts.md, "Sensitivity of Toeplitz
strategies"): let P_0 = {0, s, 2s, ..., (k-1)s} be the earliest pattern (s the separation or the
epoch length, k the schema's participations) and v = C 1_{P_0} = sum_{m<k} shift_{ms}(c) cut at n.

* single: ||c||_2 (the first column is the longest column); exact.
* fixed-epoch: every pattern is P_0 shifted right, and shifting right only cuts more of the
  vector off at n, so max_P sum_{i,l in P} |X_il| <= ||C(|c|) 1_{P_0}||^2: an upper bound, exact
  (attained by the all-plus witness) when c does not change sign.
* min-sep: with c' the reverse cumulative maximum of |c| (c'_t = max_{u>=t} |c_u|, non-negative,
  non-increasing, >= |c|), |X_il| <= X'_il, and for non-negative non-increasing c' the inner
  product <C' e_p, C' e_q> = sum_{u <= n-1-q} c'_u c'_{u+q-p} is non-increasing in the gap q - p
  and in q; a b-separated pattern p_0 < ... < p_{j-1} (j <= k) has p_m - p_l >= (m - l) s and
  p_m >= m s, so every term is at most the matching term of P_0: sens^2 <= ||C' 1_{P_0}||^2.
  Exact when c is non-negative and non-increasing (then c' = c, the bound of 2405.13763 Thm 2).

Example (the square root of the prefix sum, 2 bands, n = 2: beta = (1, 1/2), sens^2 = 5/4, so
total = 5/4 (2 + 1/4), max = 5/4 (1 + 1/4)):
    >>> from mfcli.strategies.toeplitz import BandedToeplitz, TOEPLITZ_PREFIX
    >>> bt = BandedToeplitz.sqrt_init(2)
    >>> bt.coefs.tolist(), bt.decoder_coefs(TOEPLITZ_PREFIX, 2).tolist()
    ([1.0, 0.5], [1.0, 0.5])
    >>> loss = bt.loss(2, TOEPLITZ_PREFIX)
    >>> round(loss.total, 12), round(loss.mean, 12), round(loss.max, 12)
    (2.8125, 1.40625, 1.5625)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from mfcli.errors import ArtifactError, MfcliError
from mfcli.model.participation import (
    EXACT_RTOL,
    FixedEpoch,
    Participation,
    Sensitivity,
    SingleParticipation,
)
from mfcli.strategies.operators import IirRecursion
from mfcli.util.directed import sqrt_down, sqrt_up
from mfcli.util.limits import STRUCTURED_DENSE_MAX_N, STRUCTURED_MAX_N
from mfcli.util.validation import step_count

#: The most steps a structured strategy is evaluated or optimised for (:mod:`mfcli.util.limits`).
MAX_STRUCTURED_N = STRUCTURED_MAX_N

#: The most bands a banded Toeplitz strategy may have.
MAX_BANDS = 4096

#: Above k x len(c) multiply-adds, the pattern vector v is formed by FFT convolution; its result
#: is then raised by this relative slack so that the printed upper bound stays an upper bound.
FFT_THRESHOLD = 50_000_000
FFT_SLACK = 1e-9

ERROR_KINDS = ("mean", "max")


# ---------------------------------------------------------------------------------------------
# Toeplitz workloads


@dataclass(frozen=True)
class ToeplitzWorkload:
    """A lower-triangular Toeplitz workload as a rational filter: its first column is the impulse
    response of numerator(z) / denominator(z) (coefficients in powers of the delay z).

    Attributes:
        name: ``prefix`` or ``momentum``.
        numerator, denominator: the filter (denominator[0] = 1).
        beta: the momentum coefficient (0 for prefix).
    """

    name: str
    numerator: tuple[float, ...]
    denominator: tuple[float, ...]
    beta: float = 0.0

    def coefs(self, n: int) -> np.ndarray:
        """The first column of A, length n."""
        return _impulse(np.asarray(self.numerator), np.asarray(self.denominator), check_n(n))

    def describe(self) -> str:
        return "prefix sum" if self.name == "prefix" else f"momentum (beta = {self.beta:g})"


TOEPLITZ_PREFIX = ToeplitzWorkload("prefix", (1.0,), (1.0, -1.0))


def toeplitz_workload(name: str, *, beta: float = 0.9, lr: Any = "constant") -> ToeplitzWorkload:
    """The Toeplitz form of a named workload: ``prefix`` (all-ones first column) or ``momentum``
    (first column a_t = sum_{u<=t} beta^u, as in :func:`mfcli.model.workloads.momentum_workload` with
    constant learning rate 1).

    Raises:
        MfcliError: a learning-rate schedule other than ``constant`` (it scales the workload's
            columns, so A is no longer Toeplitz), a custom workload, or beta outside [0, 1).
    """
    if lr is not None and lr != "constant":
        raise MfcliError(f"structured strategies need a Toeplitz workload; learning-rate schedule {lr!r} "
                         "scales the workload's columns, so it is not Toeplitz (use the constant schedule)")
    if name == "prefix":
        return TOEPLITZ_PREFIX
    if name == "momentum":
        b = float(beta)
        if not (0.0 <= b < 1.0) or not math.isfinite(b):
            raise MfcliError(f"beta must be in [0, 1), got {beta}")
        return ToeplitzWorkload("momentum", (1.0,), (1.0, -(1.0 + b), b), beta=b)
    raise MfcliError(f"structured strategies support the prefix and momentum workloads, got {name!r} "
                     "(a custom workload is not known to be Toeplitz)")


def check_n(n: Any) -> int:
    """A number of steps for a structured strategy: 1 <= n <= MAX_STRUCTURED_N."""
    n = step_count(n)
    if n > MAX_STRUCTURED_N:
        raise MfcliError(f"n must be at most {MAX_STRUCTURED_N} for a structured strategy, got {n}")
    return n


# ---------------------------------------------------------------------------------------------
# Toeplitz algebra on first columns


def _impulse(num: np.ndarray, den: np.ndarray, n: int) -> np.ndarray:
    """The first n terms of the impulse response of num(z) / den(z) (an IIR filter, O(n len))."""
    import scipy.signal

    x = np.zeros(n)
    x[0] = 1.0
    return scipy.signal.lfilter(num, den, x)


def _as_coefs(c: Any, what: str = "coefs") -> np.ndarray:
    arr = np.asarray(c, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise MfcliError(f"{what} must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise MfcliError(f"{what} has non-finite entries")
    if arr[0] == 0:
        raise MfcliError(f"{what}[0] must be non-zero (the Toeplitz matrix must be invertible)")
    return arr


def multiply_coefs(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """First column of the product of two lower-triangular Toeplitz matrices, length n."""
    return np.convolve(np.asarray(a, dtype=np.float64)[:n], np.asarray(b, dtype=np.float64)[:n])[:n]


def inverse_coefs(c: np.ndarray, n: int) -> np.ndarray:
    """First column of C^-1 (the noising matrix) for the Toeplitz C with first column c: the
    impulse response of 1 / c(z), O(n len(c))."""
    c = _as_coefs(c)
    return _impulse(np.array([1.0]), c[:n], check_n(n))


def decoder_coefs(c: np.ndarray, workload: ToeplitzWorkload, n: int) -> np.ndarray:
    """First column beta of B = A C^-1: the impulse response of a(z) / c(z), O(n (len(c) + 3))."""
    c = _as_coefs(c)
    n = check_n(n)
    den = np.convolve(c[:n], np.asarray(workload.denominator))
    return _impulse(np.asarray(workload.numerator), den, n)


def materialize(coefs: np.ndarray, n: int) -> np.ndarray:
    """The dense n x n lower-triangular Toeplitz matrix (small n only: refuses above STRUCTURED_DENSE_MAX_N)."""
    n = check_n(n)
    if n > STRUCTURED_DENSE_MAX_N:
        raise MfcliError(f"a dense Toeplitz matrix is built for n <= {STRUCTURED_DENSE_MAX_N} only, got n = {n}")
    col = np.zeros(n)
    c = np.asarray(coefs, dtype=np.float64)[:n]
    col[: c.size] = c
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return np.where(diff >= 0, col[np.clip(diff, 0, None)], 0.0)


class Loss(NamedTuple):
    """Errors of a Toeplitz factorization in mfcli's convention (noise multiplier 1, clip norm 1).

    total = sens^2 ||B||_F^2, mean = total / n, max = the last step's error (err_t is
    non-decreasing in t for a Toeplitz decoder), sensitivity the schema's (an upper bound).
    """

    total: float
    mean: float
    max: float
    sensitivity: float


def per_step_error(c: np.ndarray, workload: ToeplitzWorkload, n: int, sens: float) -> np.ndarray:
    """err_t = sens^2 sum_{k<=t} beta_k^2, length n (O(n) memory)."""
    beta = decoder_coefs(c, workload, n)
    return sens**2 * np.cumsum(beta * beta)


def loss_from_decoder(beta: np.ndarray, sens: float) -> Loss:
    """The :class:`Loss` of a Toeplitz decoder with first column beta at sensitivity sens."""
    n = beta.size
    sq = beta * beta
    total = sens**2 * float(np.dot(np.arange(n, 0, -1, dtype=np.float64), sq))
    return Loss(total=total, mean=total / n, max=sens**2 * float(sq.sum()), sensitivity=float(sens))


# ---------------------------------------------------------------------------------------------
# Sensitivity


def schema_shape(n: int, schema: Participation) -> tuple[int, int]:
    """(s, k): the spacing (epoch length for fixed-epoch, n for single) and the participations
    of the earliest pattern P_0 = {0, s, ..., (k - 1) s}."""
    return schema.spacing(n), schema.participations(n)


def _add_shifts(x: np.ndarray, n: int, sep: int, k: int) -> np.ndarray:
    """sum_{m<k} shift_{m sep}(x) cut at n, adding the shifted copies in turn (each entry a
    sequential sum of at most k terms, the order the rounding bounds below assume)."""
    v = np.zeros(n)
    for m in range(k):
        start = m * sep
        length = min(x.size, n - start)
        v[start:start + length] += x[:length]
    return v


def pattern_vector(c: np.ndarray, n: int, sep: int, k: int) -> tuple[np.ndarray, bool]:
    """v = sum_{m<k} shift_{m sep}(c) cut at n, and whether it was formed by FFT (then rounded)."""
    c = np.asarray(c, dtype=np.float64)[:n]
    k = min(k, -(-n // sep))
    if k * c.size <= FFT_THRESHOLD:
        return _add_shifts(c, n, sep, k), False
    import scipy.signal

    comb = np.zeros(n)
    comb[: k * sep: sep] = 1.0
    return scipy.signal.fftconvolve(comb, c)[:n], True


def reverse_cummax(c: np.ndarray) -> np.ndarray:
    """c'_t = max_{u>=t} |c_u|: the smallest non-negative non-increasing sequence >= |c|."""
    return np.maximum.accumulate(np.abs(np.asarray(c, dtype=np.float64))[::-1])[::-1]


_U = 2.0**-53  # unit roundoff of float64
#: Block length of :func:`sum_squares_bounds`: each block's sum of squares is a float64 dot
#: product (relative error at most gamma_block), the block sums are added exactly by math.fsum.
_SUM_BLOCK = 256


#: Up to this many terms :func:`sum_squares_bounds` sums the squares exactly (then rounds once).
_EXACT_SUM_MAX = 16384


def sum_squares_bounds(a: np.ndarray) -> tuple[float, float]:
    """(lower, upper) floats around sum_t a_t^2, proven.

    Up to :data:`_EXACT_SUM_MAX` terms: each square is split exactly into two floats (Veltkamp /
    Dekker: a^2 = p + e with p = fl(a^2)), and math.fsum returns the correctly rounded sum of all
    of them, so the two neighbouring floats bound the exact value (an absolute 4 x 2^-1074 per term
    covers underflow of the splitting for |a| < 1e-145). Above: blocks of :data:`_SUM_BLOCK`
    squares are summed in float64 (relative error <= gamma_B = B u / (1 - B u) whatever the
    order, u = 2^-53, for non-negative terms), the block sums by math.fsum (one more u), so the
    true sum lies within a factor 1 +- 2 (B + 2) u of the result, each end then rounded outwards.
    O(len(a)) time; relative width one unit of rounding, or about 1e-13 above the cut."""
    a = np.asarray(a, dtype=np.float64).ravel()
    if a.size == 0:
        return 0.0, 0.0
    if a.size <= _EXACT_SUM_MAX and np.all(np.abs(a) < 1e150):
        split = a * 134217729.0  # 2^27 + 1
        hi = split - (split - a)
        lo = a - hi
        p = a * a
        e = ((hi * hi - p) + 2 * hi * lo) + lo * lo
        s = math.fsum(np.concatenate([p, e]).tolist())
        tiny = 4 * a.size * 2.0**-1074
        return max(math.nextafter(s - tiny, -math.inf), 0.0), math.nextafter(s + tiny, math.inf)
    pad = (-a.size) % _SUM_BLOCK
    blocks = np.concatenate([a, np.zeros(pad)]).reshape(-1, _SUM_BLOCK)
    s = math.fsum(np.einsum("ij,ij->i", blocks, blocks).tolist())
    slack = 2 * (_SUM_BLOCK + 2) * _U
    return max(math.nextafter(s * (1 - slack), -math.inf), 0.0), math.nextafter(s * (1 + slack), math.inf)


def window_sums(b: np.ndarray, n: int, sep: int, k: int) -> np.ndarray:
    """v_t = sum_{m<k, m sep <= t} b_{t - m sep} for t < n (b zero beyond its length): the pattern
    vector C(b) 1_{P_0} of :func:`pattern_vector`, without FFT and without subtraction.

    Up to :data:`FFT_THRESHOLD` multiply-adds the k shifted copies are added in turn (O(n)
    memory). Beyond, in O(n) time whatever k: the n entries are laid out as J = ceil(n / sep)
    rows of sep, and entry row j sums rows j - k + 1..j (a sliding window over rows); with k - 1
    zero rows in front and the rows cut into chunks of k, every window is a chunk's suffix plus
    the next chunk's prefix (two running sums; a few n floats of memory). Either way each v_t is a
    sum of at most k of the b's in floating point: for b >= 0 its relative error is at most
    gamma_k = k u / (1 - k u) (u = 2^-53), the bound :func:`toeplitz_sensitivity` rounds up by."""
    b = np.asarray(b, dtype=np.float64)[:n]
    rows = -(-n // sep)
    k = max(1, min(k, rows))
    if k * b.size <= FFT_THRESHOLD:
        # few shifts: add them in turn (each entry a sequential sum of at most k terms), O(n) memory
        return _add_shifts(b, n, sep, k)
    x = np.zeros(rows * sep)
    x[: b.size] = b
    mat = x.reshape(rows, sep)
    if k >= rows:
        return np.cumsum(mat, axis=0).reshape(-1)[:n]
    chunks = -(-(rows + k - 1) // k)
    y = np.zeros((chunks, k, sep))
    y.reshape(-1, sep)[k - 1: k - 1 + rows] = mat
    del x, mat
    prefix = np.cumsum(y, axis=1)              # prefix[ch, i] = rows ch k .. ch k + i
    suffix = np.cumsum(y[:, ::-1], axis=1)     # suffix[ch, k - 1 - i] = rows ch k + i .. ch k + k - 1
    del y
    j = np.arange(rows)
    end = j + k - 1
    out = prefix[end // k, end % k]
    inner = j % k != 0                         # the window starts inside a chunk: add its suffix
    out[inner] += suffix[j[inner] // k, k - 1 - j[inner] % k]
    return out.reshape(-1)[:n]


def toeplitz_sensitivity(coefs: np.ndarray, n: int, schema: Participation, *,
                         coef_error: np.ndarray | None = None) -> Sensitivity:
    """The L2 sensitivity of the n x n lower-triangular Toeplitz C with first column ``coefs``
    (zero beyond its length) under ``schema``, in O(n) without forming C.

    Returns an upper bound with an all-plus witness on the earliest pattern (see the module
    docstring for the proof); ``exact`` when the witness attains the bound to 1e-10: for single
    participation, for fixed-epoch when c does not change sign, for min-sep when c is
    non-negative and non-increasing.

    The bound is certified against rounding: it is computed from a non-negative vector (|c|,
    or its reverse cumulative maximum) by sums of non-negative terms only, whose rounding error
    has a proven relative bound (:func:`window_sums`, :func:`sum_squares_bounds`), and rounded up
    by it. ``coef_error``: e_t >= |coefs_t - c_t| when the coefficients were themselves computed
    with rounding (a BLT's); the bound is then taken over |coefs| + e, which dominates the true |c|.
    """
    c = _as_coefs(coefs)[:check_n(n)]
    absc = np.abs(c)
    err = np.zeros(c.size)
    if coef_error is not None:
        err = np.asarray(coef_error, dtype=np.float64)[: c.size]
        if err.shape != c.shape or not np.all(np.isfinite(err)) or np.any(err < 0):
            raise MfcliError("coef_error must be finite, non-negative and one per coefficient")
        # |c| <= |coefs| + e; one more unit of rounding covers the rounding of that sum
        absc = (absc + err) * (1 + 2 * _U)
    if not np.all(np.isfinite(absc)):
        raise MfcliError("the strategy's coefficients overflow: no finite sensitivity")
    if isinstance(schema, SingleParticipation):
        hi2 = sum_squares_bounds(absc)[1]
        # |c| >= |coefs| - e (a lower bound only: rounding it down once more is enough)
        lo2 = sum_squares_bounds(np.maximum(np.abs(c) - err, 0.0) * (1 - 2 * _U))[0]
        value, lower = sqrt_up(hi2), sqrt_down(min(lo2, hi2))
        return Sensitivity(value=value, exact=lower >= value * (1 - EXACT_RTOL), lower=lower,
                           method="norm of the first column", schema=schema)
    schema.check(n)
    sep, k = schema_shape(n, schema)
    k = max(1, min(k, -(-n // sep)))
    if isinstance(schema, FixedEpoch):
        bound_c = absc
        how = "fixed-epoch: |c| on the first epoch-residue pattern"
    else:
        bound_c = reverse_cummax(absc)
        how = "min-sep: reverse cummax of |c| on k participations exactly the separation apart"
    v = window_sums(bound_c, n, sep, k)
    _, upper2 = sum_squares_bounds(v)
    # each entry of v is a sum of at most k non-negative terms: relative error <= gamma_k
    upper2 = math.nextafter(upper2 * (1 + 3 * k * _U), math.inf)
    # The all-plus witness on P_0. When every c_t is known to be >= 0 (c - e >= 0), its value is
    # bounded below by that of c - e, a sum of non-negative terms rounded down like the bound;
    # otherwise it is evaluated from the computed coefficients (the lower end is then a value,
    # not a proven bound, and only decides ``exact``).
    low_c = c - err
    signed = not np.all(low_c >= 0)
    witness = window_sums(c if signed else low_c * (1 - 2 * _U), n, sep, k)
    lower2 = sum_squares_bounds(witness)[0] * (1 - 3 * k * _U)
    lower2 = min(lower2, upper2)
    exact = lower2 >= upper2 * (1 - EXACT_RTOL)
    return Sensitivity(value=sqrt_up(upper2), exact=exact, lower=sqrt_down(max(lower2, 0.0)),
                       method=how + (", attained" if exact else " (upper bound)"), schema=schema)


def _sens2_and_grad(c: np.ndarray, n: int, sep: int, k: int) -> tuple[float, np.ndarray]:
    """||v||^2 for v = C 1_{P_0} and its gradient in c: d/dc_j = 2 sum_m v[m sep + j]."""
    v, _ = pattern_vector(c, n, sep, k)
    k = min(k, -(-n // sep))
    grad = np.zeros(c.size)
    for m in range(k):
        start = m * sep
        length = min(c.size, n - start)
        grad[:length] += 2 * v[start:start + length]
    return float(v @ v), grad


# ---------------------------------------------------------------------------------------------
# The banded Toeplitz kind


def check_bands(bands: Any, n: int | None = None) -> int:
    """A number of bands: 1 <= bands <= MAX_BANDS and (given n) bands <= n."""
    b = step_count(bands, name="bands")
    if b > MAX_BANDS:
        raise MfcliError(f"bands must be at most {MAX_BANDS}, got {b}")
    if n is not None and b > n:
        raise MfcliError(f"bands = {b} exceeds the number of steps n = {n}")
    return b


@dataclass(frozen=True, eq=False)
class RationalToeplitz(IirRecursion):
    """The n x n lower-triangular Toeplitz matrix of num(z) / den(z), streamed by the recursion
    den_0 x_t = sum_{k<W+1} num_k z_{t-k} - sum_{1<=k<=R} den_k x_{t-k}.

    ``width`` W = len(num) - 1 recent noise rows (regenerated from the seed on resume) and
    ``rank`` R = len(den) - 1 recent outputs (kept in checkpoints, like running sums).
    """

    numerator: np.ndarray
    denominator: np.ndarray
    size: int

    @property
    def width(self) -> int:
        return int(self.numerator.size - 1)

    @property
    def rank(self) -> int:
        return int(self.denominator.size - 1)

    def coefs(self) -> np.ndarray:
        """The first column (impulse response), length n."""
        return _impulse(self.numerator, self.denominator, self.size)

    def dense(self) -> np.ndarray:
        return materialize(self.coefs(), self.size)

    def fingerprint_arrays(self) -> tuple[np.ndarray, ...]:
        return (self.numerator, self.denominator, np.array([float(self.size)]))


def rational_recursion(num: np.ndarray, den: np.ndarray, workload: ToeplitzWorkload, kind: str,
                       n: int) -> RationalToeplitz:
    """The streamed operator of a kind whose C^-1 is num(z) / den(z): C^-1 itself for gradient
    noise, B = A C^-1 (the workload's filter after it) for iterate noise."""
    if kind == "iterate":
        num, den = np.convolve(num, workload.numerator), np.convolve(den, workload.denominator)
    return RationalToeplitz(np.asarray(num, float), np.asarray(den, float), n)


def rational_decoder(num: np.ndarray, den: np.ndarray, workload: ToeplitzWorkload, n: int) -> np.ndarray:
    """First column of B = A C^-1 for C^-1 = num(z) / den(z): the impulse response of the product
    filter, O(n order)."""
    return _impulse(np.convolve(num, workload.numerator), np.convolve(den, workload.denominator), check_n(n))


@dataclass(frozen=True, eq=False)
class BandedToeplitz:
    """A banded lower-triangular Toeplitz strategy: C[i, j] = c_{i-j} for 0 <= i - j < b, else 0.

    Its noising matrix C^-1 is Toeplitz (not banded); noise C^-1 Z streams by the recursion
    x_t = (z_t - sum_{k=1}^{b-1} c_k x_{t-k}) / c_0 in O(b d) memory.
    """

    coefs: np.ndarray = field()
    kind: str = field(default="banded-toeplitz", init=False)

    def __post_init__(self) -> None:
        c = _as_coefs(self.coefs).copy()
        check_bands(c.size)
        if c[0] <= 0:
            raise MfcliError(f"coefs[0] must be positive, got {c[0]!r}")
        c.setflags(write=False)
        object.__setattr__(self, "coefs", c)

    @property
    def bands(self) -> int:
        return int(self.coefs.size)

    @classmethod
    def sqrt_init(cls, bands: int) -> BandedToeplitz:
        """The first ``bands`` coefficients of S^1/2 (binom(2k, k) / 4^k): a good start for prefix."""
        from mfcli.strategies.baselines import sqrt_coefficients

        return cls(sqrt_coefficients(check_bands(bands)))

    def strategy_coefs(self, n: int) -> np.ndarray:
        """First column of C, length n."""
        n = check_n(n)
        out = np.zeros(n)
        out[: min(n, self.bands)] = self.coefs[:n]
        return out

    def noising_coefs(self, n: int) -> np.ndarray:
        """First column of C^-1, length n."""
        return inverse_coefs(self.coefs, n)

    def is_identity(self, n: int) -> bool:
        """C (n x n) == I exactly: c_0 = 1 and every later coefficient within n is 0."""
        c = self.coefs[: check_n(n)]
        return float(c[0]) == 1.0 and not np.any(c[1:])

    def decoder_coefs(self, workload: ToeplitzWorkload, n: int) -> np.ndarray:
        """First column of B = A C^-1, length n."""
        return decoder_coefs(self.coefs, workload, n)

    def rational(self) -> tuple[np.ndarray, np.ndarray]:
        """C^-1 as num(z) / den(z) = 1 / c(z)."""
        return np.array([1.0]), np.array(self.coefs)

    def workload_decoder(self, workload: ToeplitzWorkload, n: int) -> np.ndarray:
        """First column of B = A C^-1 (what the structured mechanism runs): :meth:`decoder_coefs`,
        the one route for a banded C (its rational form 1 / c(z) gives the same bits,
        tests/test_toeplitz.py holds the two equal, bands beyond n included)."""
        return self.decoder_coefs(workload, n)

    def recursion(self, workload: ToeplitzWorkload, kind: str, n: int) -> RationalToeplitz:
        """The streamed operator (``kind``: gradient C^-1, iterate B): the IIR recursion of 1 / c(z)."""
        return rational_recursion(*self.rational(), workload, kind, n)

    def parameters(self) -> dict[str, np.ndarray]:
        """What an artifact stores: ``{"coefs": c_0..c_{b-1}}``."""
        return {"coefs": np.array(self.coefs)}

    @classmethod
    def from_parameters(cls, params: Any) -> BandedToeplitz:
        """The strategy from stored parameters; :class:`ArtifactError` unless they are exactly
        ``{"coefs": a finite 1-D array of 1..MAX_BANDS values with coefs[0] > 0}``."""
        if not hasattr(params, "keys") or set(params.keys()) != {"coefs"}:
            keys = sorted(params.keys()) if hasattr(params, "keys") else type(params).__name__
            raise ArtifactError(f"banded-toeplitz parameters must be exactly ['coefs'], got {keys}")
        try:
            return cls(np.asarray(params["coefs"], dtype=np.float64))
        except (MfcliError, TypeError, ValueError) as exc:
            raise ArtifactError(f"banded-toeplitz parameters: {exc}") from None

    def sensitivity(self, n: int, schema: Participation) -> Sensitivity:
        """The schema sensitivity (see :func:`toeplitz_sensitivity`)."""
        return toeplitz_sensitivity(self.coefs, n, schema)

    def loss(self, n: int, workload: ToeplitzWorkload, schema: Participation | None = None) -> Loss:
        """Total, mean and max loss at the schema's sensitivity (single participation by default)."""
        sens = self.sensitivity(n, schema or SingleParticipation()).value
        return loss_from_decoder(self.decoder_coefs(workload, n), sens)

    def dense(self, n: int) -> np.ndarray:
        """C as a dense matrix (n <= STRUCTURED_DENSE_MAX_N)."""
        return materialize(self.coefs, n)


# ---------------------------------------------------------------------------------------------
# Optimisation


class OptimizeResult(NamedTuple):
    strategy: BandedToeplitz
    loss: Loss
    iterations: int
    converged: bool


def _objective(x: np.ndarray, workload: ToeplitzWorkload, n: int, sep: int, k: int,
               weights: np.ndarray) -> tuple[float, np.ndarray]:
    """f(c) = ||C 1_{P_0}||^2 sum_t w_t beta_t^2 with c = (1, x), and its gradient in x.

    d beta_t / d c_j = -(C^-1 beta)_{t-j} (Toeplitz matrices commute), so
    d sum_t w_t beta_t^2 / d c_j = -2 sum_t w_t beta_t h_{t-j} with h = C^-1 beta.
    """
    import scipy.signal

    c = np.concatenate([[1.0], x])
    with np.errstate(all="ignore"):
        beta = decoder_coefs(c, workload, n)
        err = float(np.dot(weights, beta * beta))
        if not math.isfinite(err) or err > 1e300:
            return 1e300, -np.ones_like(x)
        h = scipy.signal.lfilter([1.0], c, beta)
        u = weights * beta
        gerr = np.array([-2.0 * float(np.dot(u[j:], h[: n - j])) for j in range(1, c.size)])
    s2, gs = _sens2_and_grad(c, n, sep, k)
    f = s2 * err
    g = gs[1:] * err + s2 * gerr
    if not (math.isfinite(f) and np.all(np.isfinite(g))):
        return 1e300, -np.ones_like(x)
    return f, g


def _ratio_objective(r: np.ndarray, *args: Any) -> tuple[float, np.ndarray]:
    """:func:`_objective` in the ratios c_j = r_1 ... r_j: df/dr_i = (r_1 ... r_{i-1}) S_i with
    S_i = sum_{j>=i} g_j prod_{i<l<=j} r_l (S_i = g_i + r_{i+1} S_{i+1}), exact also where r_i = 0."""
    c = np.cumprod(r)
    f, g = _objective(c, *args)
    s = np.zeros(r.size)
    acc = 0.0
    for i in range(r.size - 1, -1, -1):
        acc = g[i] + (r[i + 1] * acc if i + 1 < r.size else 0.0)
        s[i] = acc
    before = np.concatenate([[1.0], c[:-1]])
    return f, before * s


def optimize_banded_toeplitz(
    n: int,
    bands: int,
    *,
    workload: ToeplitzWorkload = TOEPLITZ_PREFIX,
    schema: Participation | None = None,
    error: str = "mean",
    init: np.ndarray | None = None,
    max_iterations: int = 1000,
    tol: float = 1e-12,
) -> OptimizeResult:
    """Banded Toeplitz coefficients (c_0 = 1) minimising the mean or max loss under ``schema`` by
    L-BFGS-B with analytic gradients, O(n b) time and O(n) memory per evaluation.

    The objective's sensitivity is ||C 1_{P_0}||^2. Under single participation it is exact for
    every c and the search is free; under fixed-epoch it is exact for c >= 0 and under min-sep for
    non-negative non-increasing c, and the search is restricted to those sets, so the objective
    is the certified loss. The returned loss is recomputed with :func:`toeplitz_sensitivity`.

    Raises:
        MfcliError: n or bands out of range, an unknown error kind, or a schema that does not fit n.
    """
    import scipy.optimize

    n = check_n(n)
    bands = check_bands(bands, n)
    schema = schema or SingleParticipation()
    schema.check(n)
    if error not in ERROR_KINDS:
        raise MfcliError(f"error must be one of {', '.join(ERROR_KINDS)}, got {error!r}")
    sep, k = schema_shape(n, schema)
    weights = (np.arange(n, 0, -1, dtype=np.float64) / n) if error == "mean" else np.ones(n)
    if init is None:
        start = BandedToeplitz.sqrt_init(bands).coefs
    else:
        start = _as_coefs(init, "init")
        start = np.concatenate([start, np.zeros(max(bands - start.size, 0))])[:bands] / start[0]
    if bands == 1:
        strat = BandedToeplitz(np.array([1.0]))
        return OptimizeResult(strat, strat.loss(n, workload, schema), 0, True)
    args = (workload, n, sep, k, weights)
    opts = {"maxiter": max_iterations, "ftol": tol, "gtol": 1e-12, "maxcor": 20}
    if isinstance(schema, SingleParticipation):
        # ||c|| is the exact sensitivity of every c: no constraint
        res = scipy.optimize.minimize(_objective, start[1:], args=args, jac=True, method="L-BFGS-B", options=opts)
        coefs = np.concatenate([[1.0], res.x])
    elif isinstance(schema, FixedEpoch):
        # exact for c >= 0 (module docstring), so the search stays there
        res = scipy.optimize.minimize(_objective, np.maximum(start[1:], 0.0), args=args, jac=True, method="L-BFGS-B",
                                      bounds=[(0.0, None)] * (bands - 1), options=opts)
        coefs = np.concatenate([[1.0], res.x])
    else:
        # exact for non-negative non-increasing c: c_j = r_1 ... r_j with r in [0, 1]
        mono = np.minimum.accumulate(np.maximum(start, 0.0))
        ratios = np.divide(mono[1:], mono[:-1], out=np.zeros(bands - 1), where=mono[:-1] > 0)
        res = scipy.optimize.minimize(_ratio_objective, ratios, args=args, jac=True, method="L-BFGS-B",
                                      bounds=[(0.0, 1.0)] * (bands - 1), options=opts)
        coefs = np.concatenate([[1.0], np.cumprod(res.x)])
    strat = BandedToeplitz(coefs)
    return OptimizeResult(strat, strat.loss(n, workload, schema), int(res.nit), bool(res.success))


__all__ = [
    "MAX_BANDS",
    "TOEPLITZ_PREFIX",
    "BandedToeplitz",
    "Loss",
    "ToeplitzWorkload",
    "decoder_coefs",
    "inverse_coefs",
    "loss_from_decoder",
    "materialize",
    "multiply_coefs",
    "optimize_banded_toeplitz",
    "per_step_error",
    "reverse_cummax",
    "sum_squares_bounds",
    "toeplitz_sensitivity",
    "toeplitz_workload",
    "window_sums",
]
