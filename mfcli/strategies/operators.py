"""Noise operators: one class per representation of a mechanism, one verified reader, and the one
function that decides which operator runs (docs/noise-streams.md, docs/compress.md).

A factorization A = B C is run as ``A G + B Z = B (C G + Z)``; its privacy is set by the strategy C
that is actually released (sens(C) = max column norm), and the noise a trainer adds is a row of
C^-1 Z (gradient noise) or B Z (iterate noise). An artifact can hold two mechanisms for the same
workload: the dense root (B, C) and, in group ``compressed``, a banded plus low-rank decoder
B^ = band_K(B) + mask(U V^T) with C^ = B^-1 A. Which one a noise stream streams and which one
``account`` accounts must be the same: both call :func:`select_operator`.

Two layers:

* :class:`StreamingMatrix` (protocol): a lower-triangular matrix M streamed against Z row by row
  by one recursion (``step``) that numpy, torch and jax drivers all run:
  :class:`BandedLowRank` (``M[t, t-i] = band[t, i]`` for i < W, ``M[t, j] = u[t] . v[j]`` for
  j <= t - W; W kept rows and R running sums), :class:`BandedInverse` (M^-1 of a banded M: a
  BandMF C), :class:`IirRecursion` and :class:`BufferRecursion` (mixins of the structured banded
  Toeplitz and BLT operators), or :class:`DenseLowerTriangular` (the rows of Z kept, t
  multiply-adds at step t).
* :class:`NoiseOperator` (protocol): a mechanism: the accounted strategy and its recomputed
  sensitivity, the decoder (``dense()``), the streaming matrix for each noise kind, and its HDF5
  group. :class:`DenseOperator` (the root B, C) and :class:`CompressedOperator` (B^, C^) implement
  it; banded Toeplitz or BLT operators would be a third and fourth class with the same protocol.

:func:`read_compressed` is the only reader of the ``compressed`` group. It is strict: a malformed
group, a non-zero band entry above the first row (outside the matrix), a non-finite entry or a
stored ``sensitivity`` / ``loss_total`` / ``loss_increase`` that differs from its recomputation
from ``band``, ``u`` and ``v`` is an :class:`~mfcli.errors.ArtifactError`; nothing is repaired.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from mfcli.accounting.defaults import REFERENCE_SETTINGS
from mfcli.errors import ArtifactError, MfcliError
from mfcli.model.artifact_format import compression_declared_problem, dataset_sha256
from mfcli.model.factorization import Factorization, is_lower_triangular
from mfcli.util.forward import Forwarded

if TYPE_CHECKING:
    from mfcli.model.participation import Participation, Sensitivity

#: Name of the HDF5 group that holds the compressed decoder.
GROUP = "compressed"
#: Relative tolerance for the stored sensitivity and loss against their recomputation.
ATTR_RTOL = 1e-9
#: Absolute tolerance for the stored loss_increase (a difference of two relative numbers).
INCREASE_ATOL = 1e-8
#: Operator choices: ``auto`` streams (and accounts) the compressed decoder when there is one.
CHOICES = ("auto", "dense", "compressed")
#: Noise kinds: gradient noise C^-1 Z, iterate noise B Z.
KINDS = ("gradient", "iterate")
#: Relative max-entry error allowed between a banded-low-rank representation and the operator.
OPERATOR_RTOL = 1e-10
#: Largest number of sub-diagonals of A^-1 the compressed gradient stream folds into its band.
MAX_INVERSE_BANDWIDTH = 64
#: Relative size below which an entry of A^-1 counts as zero when finding its bandwidth (the
#: representation is then verified against the exact operator to OPERATOR_RTOL).
_INVERSE_ZERO_RTOL = 1e-13

#: Prefix and order of the parts hashed into a compressed operator's identity
#: (:func:`compressed_identity_sha256`, docs/artifact-format.md).
IDENTITY_TAG = "mfcli.operator.compressed.v1"
IDENTITY_PARTS = ("workload", f"{GROUP}/band", f"{GROUP}/u", f"{GROUP}/v")

DEFINITION = (
    "B^[t, j] = band[t, t - j] for 0 <= t - j < K; u[t] . v[j] for j <= t - K; 0 for j > t"
)


# --------------------------------------------------------------------------------------------
# Streaming matrices
# --------------------------------------------------------------------------------------------


class ArrayOps(Protocol):
    """The few array operations a stream recursion uses, for numpy, torch or jax arrays.

    ``set_row``/``set_rows`` may update in place (numpy, torch) or return a new array (jax): a
    recursion always uses the array they return. Indices may be traced values under ``jax.jit``.
    """

    def zeros(self, rows: int, d: int) -> Any: ...

    def set_row(self, a: Any, i: Any, value: Any) -> Any: ...

    def set_rows(self, a: Any, start: int, values: Any) -> Any: ...

    def matvec(self, coef: Any, rows: Any) -> Any:
        """``coef`` (k,) times ``rows`` (k, d): a (d,) row."""
        ...

    def addmv(self, x: Any, coef: Any, rows: Any, alpha: float) -> Any:
        """``x + alpha * (coef @ rows)``, in place on ``x`` where the arrays allow (one pass over
        x instead of a product and a sum): ``x`` must be a row the recursion owns, never one a
        state also holds."""
        ...

    def add_outer(self, a: Any, coef: Any, row: Any) -> Any:
        """``a + coef[:, None] * row[None, :]`` (a: k x d), in place where the arrays allow."""
        ...

    def scale_add(self, a: Any, scale: Any, row: Any) -> Any:
        """``scale[:, None] * a + row[None, :]`` (a: k x d), in place where the arrays allow."""
        ...

    def prefix_matvec(self, coef: Any, rows: Any, k: Any) -> Any:
        """``sum_{j < k} coef[j] rows[j]``: k multiply-adds of a row."""
        ...

    def fill_rows(self, a: Any, lo: Any, hi: Any, draw: Callable[[Any], Any]) -> Any:
        """``a[j] = draw(j)`` for lo <= j < hi."""
        ...


#: A stream state: (ring of kept noise rows, width x d; carried rows, rank x d).
StreamState = tuple[Any, Any]


@runtime_checkable
class StreamingMatrix(Protocol):
    """A lower-triangular matrix M applied to the noise Z one row at a time, by a recursion whose
    cost per step does not grow with t (the dense kind excepted: t multiply-adds, no redraws).

    The state is two arrays of d columns: ``width`` kept rows of Z (slot j mod width, or slot j
    for the dense kind) and ``rank`` carried rows (running sums, recent outputs or buffers). Only
    the carried rows go into a checkpoint; the kept noise rows are redrawn from (seed, j) on load
    (:meth:`kept_rows`). Every operation acts on each of the d coordinates separately, so a
    driver may run :meth:`step` on blocks of columns.
    """

    method: str

    @property
    def n(self) -> int: ...

    @property
    def width(self) -> int:
        """Rows of Z the state keeps."""
        ...

    @property
    def rank(self) -> int:
        """Carried rows the state keeps (checkpointed)."""
        ...

    def dense(self) -> np.ndarray:
        """M as a dense matrix (for checks and small problems)."""
        ...

    def fingerprint_arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays that identify M (hashed into a stream's fingerprint)."""
        ...

    def tables(self) -> dict[str, np.ndarray]:
        """Constant coefficient tables (float64, or int64 for indices) :meth:`step` reads; a
        driver converts them once to its arrays (floats in the stream's dtype)."""
        ...

    def step(self, t: Any, draw: Callable[[Any], Any], state: StreamState, tab: Mapping[str, Any],
             xp: ArrayOps) -> tuple[Any, StreamState]:
        """Row t of M Z and the state after step t; ``draw(j)`` gives row j of Z."""
        ...

    def kept_rows(self, t: int) -> list[tuple[int, int]]:
        """(slot, j): the rows of Z held in the ring before step t."""
        ...

    def abs_row_sums(self) -> np.ndarray:
        """sum_j |M[t, j]| for each t (float64; inf where it overflows): bounds each row's size."""
        ...

    def memory_advice(self, kind: str, d: int) -> str:
        """What to do when its state for d columns is over a memory budget (``kind``: the noise
        kind, gradient or iterate), in words: each kind knows what its state grows with."""
        ...


def init_state(matrix: StreamingMatrix, d: int, xp: ArrayOps) -> StreamState:
    """The state before step 0: zero rows (``init(d, dtype)`` of the protocol; the dtype is xp's)."""
    return xp.zeros(matrix.width, d), xp.zeros(matrix.rank, d)


def _rotation(coefs: np.ndarray, period: int) -> np.ndarray:
    """``rot[s, (s - k) mod P] = coefs[k - 1]`` for k = 1..P: the coefficient of the row written
    k steps before a step t with t mod P = s, in ring-slot order."""
    rot = np.zeros((max(period, 1), period))
    for s in range(period):
        for k in range(1, period + 1):
            rot[s, (s - k) % period] = coefs[k - 1]
    return rot


def _toeplitz_row_sums(coefs: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.cumsum(np.abs(coefs))
    out[~np.isfinite(out)] = np.inf
    return np.maximum.accumulate(out)


def _dense_row_sums(matrix: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.sum(np.abs(matrix), axis=1)
    out[~np.isfinite(out)] = np.inf
    return out


class BoundedState:
    """:meth:`StreamingMatrix.memory_advice` of every kind whose state does not grow with t (all
    but the dense history): fewer parameters, fewer bands or buffers, or a larger budget."""

    if TYPE_CHECKING:  # supplied by each kind

        method: str

        @property
        def width(self) -> int: ...

        @property
        def rank(self) -> int: ...

    def memory_advice(self, kind: str, d: int) -> str:
        return (f"its {self.method} keeps {self.width + self.rank} row(s) of d = {d} floats besides the row "
                "it returns; use fewer parameters, fewer bands or buffers, or pass a larger max_memory")


class ToeplitzRecursion(BoundedState):
    """What the two recursions of a structured Toeplitz strategy (:class:`IirRecursion`,
    :class:`BufferRecursion`) share: n is the kind's ``size`` field, the stream's name is
    "recursion" (it says "no growth with t"; the fingerprint says which one), and the row sums
    are those of the Toeplitz matrix of the kind's ``coefs()``."""

    method = "recursion"

    if TYPE_CHECKING:  # supplied by each kind

        size: int

        def coefs(self) -> np.ndarray: ...

    @property
    def n(self) -> int:
        return self.size

    def abs_row_sums(self) -> np.ndarray:
        return _toeplitz_row_sums(self.coefs())


class IirRecursion(ToeplitzRecursion):
    """C^-1 (or A C^-1) of a structured Toeplitz strategy as the rational filter num(z) / den(z):
    ``den_0 x_t = sum_{k<=W} num_k z_{t-k} - sum_{1<=k<=R} den_k x_{t-k}``. State: the W most
    recent noise rows and the R most recent outputs. O((W + R) d) per step, whatever n.

    A mixin: the class using it has ``numerator``, ``denominator``, ``size`` (n), ``width``, ``rank``
    and ``coefs()``.
    """

    numerator: np.ndarray
    denominator: np.ndarray

    def tables(self) -> dict[str, np.ndarray]:
        w, r = self.width, self.rank
        num, den = np.asarray(self.numerator, float), np.asarray(self.denominator, float)
        return {"num0": num[:1], "den0": den[:1], "numrot": _rotation(num[1:], w), "denrot": _rotation(den[1:], r)}

    def step(self, t: Any, draw: Callable[[Any], Any], state: StreamState, tab: Mapping[str, Any],
             xp: ArrayOps) -> tuple[Any, StreamState]:
        w, r = self.width, self.rank
        ring, outs = state
        z = draw(t)
        acc = z if float(self.numerator[0]) == 1.0 else z * tab["num0"][0]   # static: skip a pass when 1
        if w:
            acc = acc + xp.matvec(tab["numrot"][t % w], ring)
            ring = xp.set_row(ring, t % w, z)
        if r:   # acc is never a row the state holds: z itself only when w = 0 (else acc is a new sum)
            acc = xp.addmv(acc, tab["denrot"][t % r], outs, -1.0)
        x = acc if float(self.denominator[0]) == 1.0 else acc / tab["den0"][0]
        if r:
            outs = xp.set_row(outs, t % r, x)
        return x, (ring, outs)

    def kept_rows(self, t: int) -> list[tuple[int, int]]:
        w = self.width
        return [(j % w, j) for j in range(max(0, t - w), t)]


class BufferRecursion(ToeplitzRecursion):
    """A BLT's C^-1 in its buffer form: ``x_t = z_t - sum_i omega_i s_i``, then each buffer
    ``s_i <- theta_i s_i + x_t``; for iterate noise the output then runs through the workload's
    all-pole filter, ``y_t = (x_t - sum_{k>=1} post_k y_{t-k}) / post_0``. State: the buffers and
    the P recent outputs y. O((buffers + P) d) per step, whatever n.

    A mixin: the class using it has ``theta``, ``omega``, ``post_den``, ``size`` (n), ``buffers``
    and ``coefs()``.
    """

    theta: np.ndarray
    omega: np.ndarray
    post_den: np.ndarray

    @property
    def _post(self) -> int:
        return int(np.asarray(self.post_den).size - 1)

    def tables(self) -> dict[str, np.ndarray]:
        post = np.asarray(self.post_den, float)
        return {"theta": np.asarray(self.theta, float), "omega": np.asarray(self.omega, float),
                "post0": post[:1], "postrot": _rotation(post[1:], self._post)}

    def step(self, t: Any, draw: Callable[[Any], Any], state: StreamState, tab: Mapping[str, Any],
             xp: ArrayOps) -> tuple[Any, StreamState]:
        nb, p = self.buffers, self._post  # type: ignore[attr-defined]
        ring, carry = state
        z = draw(t)
        s = carry[:nb]
        x = xp.addmv(z, tab["omega"], s, -1.0)   # z is this step's own draw, held by no state
        carry = xp.set_rows(carry, 0, xp.scale_add(s, tab["theta"], x))
        if p:   # the buffers got x's values (scale_add), not x itself
            x = xp.addmv(x, tab["postrot"][t % p], carry[nb:], -1.0) / tab["post0"][0]
            carry = xp.set_row(carry, nb + t % p, x)
        return x, (ring, carry)

    def kept_rows(self, t: int) -> list[tuple[int, int]]:
        return []


def band_values(matrix: np.ndarray, band: int) -> np.ndarray:
    """The n x K band layout of a square matrix: ``out[t, i] = matrix[t, t - i]`` (0 if t < i)."""
    b = np.asarray(matrix, dtype=np.float64)
    n = b.shape[0]
    out = np.zeros((n, band))
    for i in range(min(band, n)):
        out[i:, i] = np.diagonal(b, offset=-i)
    return out


@dataclass(frozen=True, eq=False)
class BandedLowRank(BoundedState):
    """A lower-triangular n x n matrix M = band_W(M) + mask_W(U V^T).

    Attributes:
        band: n x W, ``band[t, i] = M[t, t - i]``; entries with t - i < 0 lie outside the matrix
            and must be zero (a non-zero one is refused, never silently dropped).
        u: n x R.
        v: n x R; ``M[t, j] = u[t] . v[j]`` for j <= t - W.

    Raises:
        MfcliError: shapes that do not fit, NaN or inf, or a non-zero entry outside the matrix.
    """

    band: np.ndarray
    u: np.ndarray
    v: np.ndarray

    def __post_init__(self) -> None:
        bd = np.array(self.band, dtype=np.float64)
        uu = np.array(self.u, dtype=np.float64)
        vv = np.array(self.v, dtype=np.float64)
        if bd.ndim != 2 or uu.ndim != 2 or vv.ndim != 2:
            raise MfcliError("band, u and v must be 2-D arrays")
        n, w = bd.shape
        if not 1 <= w <= n:
            raise MfcliError(f"band has {w} columns; need 1 <= K <= n = {n}")
        if uu.shape != vv.shape or uu.shape[0] != n:
            raise MfcliError(f"u {uu.shape} and v {vv.shape} must both be n x R with n = {n} (band is {bd.shape})")
        for name, m in (("band", bd), ("u", uu), ("v", vv)):
            if not np.all(np.isfinite(m)):
                raise MfcliError(f"{name} contains NaN or inf")
        outside = np.arange(w)[None, :] > np.arange(n)[:, None]
        if np.any(bd[outside]):
            raise MfcliError("band has non-zero entries where t - i < 0 (outside the matrix)")
        for m in (bd, uu, vv):
            m.setflags(write=False)
        object.__setattr__(self, "band", bd)
        object.__setattr__(self, "u", uu)
        object.__setattr__(self, "v", vv)

    @property
    def n(self) -> int:
        return int(self.band.shape[0])

    @property
    def width(self) -> int:
        return int(self.band.shape[1])

    @property
    def rank(self) -> int:
        return int(self.u.shape[1])

    def dense(self) -> np.ndarray:
        """The n x n matrix M."""
        n, w = self.n, self.width
        out = np.zeros((n, n))
        if self.rank > 0 and w < n:
            out[w:, : n - w] = np.tril(self.u[w:] @ self.v[: n - w].T)
        rows = np.arange(n)
        for i in range(w):
            out[rows[i:], rows[i:] - i] = self.band[i:, i]
        return out

    def slot_coefficients(self, t: int) -> np.ndarray:
        """Row t in streaming-buffer order (length W + R): the band entry for Z[j] at ring slot
        j mod W for j in (t - W, t], then u[t] for the R running sums S_{t-W}."""
        w = self.width
        c = np.zeros(w + self.rank)
        i = np.arange(min(w, t + 1))
        c[(t - i) % w] = self.band[t, i]
        c[w:] = self.u[t]
        return c

    def coefficient_table(self) -> np.ndarray:
        """:meth:`slot_coefficients` for every t (n x (W + R)): what a jitted trainer indexes."""
        return np.stack([self.slot_coefficients(t) for t in range(self.n)]) if self.n else np.zeros((0, self.width + self.rank))

    def fingerprint_arrays(self) -> tuple[np.ndarray, ...]:
        return (self.band, self.u, self.v)

    # -- the recursion: W recent noise rows (slot j mod W) and R running sums S_{t-W}
    method = "banded-low-rank"

    def tables(self) -> dict[str, np.ndarray]:
        w = self.width
        vpad = np.zeros((self.n, self.rank))
        vpad[w:] = self.v[: self.n - w]   # S_{t-W} = S_{t-W-1} + V[t-W]^T Z[t-W] at step t >= W
        return {"coef": self.coefficient_table(), "vpad": vpad}

    def step(self, t: Any, draw: Callable[[Any], Any], state: StreamState, tab: Mapping[str, Any],
             xp: ArrayOps) -> tuple[Any, StreamState]:
        w, r = self.width, self.rank
        ring, sums = state
        slot = t % w
        if r:   # ring slot t mod W still holds Z[t - W] (zeros before step W)
            sums = xp.add_outer(sums, tab["vpad"][t], ring[slot])
        ring = xp.set_row(ring, slot, draw(t))
        c = tab["coef"][t]
        row = xp.matvec(c[:w], ring)
        if r:
            row = xp.addmv(row, c[w:], sums, 1.0)
        return row, (ring, sums)

    def kept_rows(self, t: int) -> list[tuple[int, int]]:
        return [(j % self.width, j) for j in range(max(0, t - self.width), t)]

    def abs_row_sums(self) -> np.ndarray:
        return _dense_row_sums(self.dense())


@dataclass(frozen=True, eq=False)
class BandedInverse(BoundedState):
    """M^-1 for a lower-triangular M with p sub-diagonals (a BandMF strategy C, or B^-1 = C A^-1
    when that is banded): ``x_t = (z_t - sum_{1<=k<=p} M[t, t-k] x_{t-k}) / M[t, t]``. State: the
    p most recent outputs. O(p d) per step, whatever t.

    Attributes:
        band: n x (p + 1), ``band[t, k] = M[t, t - k]`` (zero where t < k).
    """

    band: np.ndarray

    method = "banded-inverse"

    def __post_init__(self) -> None:
        bd = np.array(self.band, dtype=np.float64)
        if bd.ndim != 2 or bd.shape[1] < 1 or not np.all(np.isfinite(bd)) or np.any(bd[:, 0] == 0):
            raise MfcliError("a banded inverse needs an n x (p + 1) finite band with a non-zero diagonal")
        bd.setflags(write=False)
        object.__setattr__(self, "band", bd)

    @classmethod
    def of(cls, matrix: np.ndarray, bandwidth: int) -> BandedInverse:
        return cls(band_values(matrix, bandwidth + 1))

    @property
    def n(self) -> int:
        return int(self.band.shape[0])

    @property
    def width(self) -> int:
        return 0

    @property
    def rank(self) -> int:
        return int(self.band.shape[1] - 1)

    def banded(self) -> np.ndarray:
        """M itself (n x n)."""
        n = self.n
        out = np.zeros((n, n))
        rows = np.arange(n)
        for k in range(self.band.shape[1]):
            out[rows[k:], rows[k:] - k] = self.band[k:, k]
        return out

    def dense(self) -> np.ndarray:
        import scipy.linalg

        return scipy.linalg.solve_triangular(self.banded(), np.eye(self.n), lower=True)

    def fingerprint_arrays(self) -> tuple[np.ndarray, ...]:
        return (self.band,)

    def tables(self) -> dict[str, np.ndarray]:
        p = self.rank
        rot = np.zeros((self.n, p))
        for t in range(self.n):
            for k in range(1, p + 1):
                rot[t, (t - k) % p] = self.band[t, k]
        return {"rot": rot, "diag": np.array(self.band[:, 0])}

    def step(self, t: Any, draw: Callable[[Any], Any], state: StreamState, tab: Mapping[str, Any],
             xp: ArrayOps) -> tuple[Any, StreamState]:
        p = self.rank
        ring, outs = state
        x = draw(t)
        if p:
            x = xp.addmv(x, tab["rot"][t], outs, -1.0)
        x = x / tab["diag"][t]
        if p:
            outs = xp.set_row(outs, t % p, x)
        return x, (ring, outs)

    def kept_rows(self, t: int) -> list[tuple[int, int]]:
        return []

    def abs_row_sums(self) -> np.ndarray:
        return _dense_row_sums(self.dense())


@dataclass(frozen=True, eq=False)
class DenseLowerTriangular:
    """A dense operator (n x n lower-triangular, or n x m for a non-square decoder), streamed by
    keeping the rows of Z drawn so far: step t draws the rows row t first needs and costs one
    multiply-add of a d-row per non-zero column up to the last one row t uses (t + 1 for a
    lower-triangular M). Memory: m x d, all of Z (what :func:`mfcli.training.noise.noise_stream` checks
    against its memory budget); nothing is redrawn.
    """

    matrix: np.ndarray

    def __post_init__(self) -> None:
        m = np.array(self.matrix, dtype=np.float64)
        m.setflags(write=False)
        object.__setattr__(self, "matrix", m)

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def width(self) -> int:
        return self.columns

    @property
    def rank(self) -> int:
        return 0

    def dense(self) -> np.ndarray:
        return np.array(self.matrix)

    def row(self, t: int) -> np.ndarray:
        """Row t of M (read-only view)."""
        return self.matrix[t]

    def fingerprint_arrays(self) -> tuple[np.ndarray, ...]:
        return (self.matrix,)

    method = "history"

    @property
    def columns(self) -> int:
        """m: rows of Z the operator reads."""
        return int(self.matrix.shape[1])

    def _need(self) -> np.ndarray:
        """need[t]: rows of Z steps 0..t read (1 + the last non-zero column so far)."""
        nz = self.matrix != 0
        last = np.where(nz.any(axis=1), self.columns - 1 - np.argmax(nz[:, ::-1], axis=1), -1)
        return np.maximum.accumulate(last + 1).astype(np.int64)

    def tables(self) -> dict[str, np.ndarray]:
        need = self._need()
        return {"matrix": self.matrix, "need": need, "first": np.concatenate([[0], need[:-1]]).astype(np.int64)}

    def step(self, t: Any, draw: Callable[[Any], Any], state: StreamState, tab: Mapping[str, Any],
             xp: ArrayOps) -> tuple[Any, StreamState]:
        ring, carry = state
        ring = xp.fill_rows(ring, tab["first"][t], tab["need"][t], draw)
        return xp.prefix_matvec(tab["matrix"][t], ring, tab["need"][t]), (ring, carry)

    def kept_rows(self, t: int) -> list[tuple[int, int]]:
        held = int(self._need()[t - 1]) if t > 0 else 0
        return [(j, j) for j in range(held)]

    def memory_advice(self, kind: str, d: int) -> str:
        """The dense history grows with t: stream a compressed or structured form instead."""
        return (f"a dense {kind} operator keeps all {self.width} rows of Z (t multiply-adds per step); "
                "stream it in O(band) memory instead: compress it (mfcli compress --band K --rank R) or "
                "use a structured strategy (banded Toeplitz, BLT or BandMF: mfcli plan --out), or pass a "
                "larger max_memory")

    def abs_row_sums(self) -> np.ndarray:
        return _dense_row_sums(self.matrix)


#: Most sub-diagonals a banded C (or B^-1) may have for its inverse to stream by recursion: the
#: state holds that many rows of d floats, as many as a compressed stream's band and rank.
MAX_RECURSION_BANDWIDTH = 256


def banded_inverse_of(fact: Factorization, kind: str, exact: np.ndarray) -> BandedInverse | None:
    """The recursion for a dense artifact whose operator's inverse is banded: gradient noise
    C^-1 when C has exactly zero entries below its p-th sub-diagonal (BandMF), iterate noise B
    when B^-1 = C A^-1 is banded likewise. Used only when M^-1 reproduces ``exact`` (the operator
    computed by a dense triangular solve) to :data:`OPERATOR_RTOL`; None otherwise."""
    import scipy.linalg

    c = np.asarray(fact.strategy, dtype=np.float64)
    p = _lower_bandwidth(c, rtol=0.0)
    if p > MAX_RECURSION_BANDWIDTH or p >= fact.n - 1:
        return None
    if kind == "gradient":
        m = c
    else:
        a = np.asarray(fact.workload, dtype=np.float64)
        m = np.tril(scipy.linalg.solve_triangular(a.T, c.T, lower=False).T)   # C A^-1, from A^T X^T = C^T
        m[np.abs(m) <= 1e-15 * np.max(np.abs(m))] = 0.0
        p = _lower_bandwidth(m, rtol=0.0)
        if p > MAX_RECURSION_BANDWIDTH or p >= fact.n - 1:
            return None
    rec = BandedInverse.of(m, p)
    if _relative_error(rec.dense(), exact) > OPERATOR_RTOL:
        return None
    return rec


def _lower_bandwidth(mat: np.ndarray, *, rtol: float) -> int:
    """Number of non-negligible sub-diagonals of a lower-triangular matrix."""
    mag = np.abs(mat)
    scale = mag.max(axis=1, keepdims=True)
    nz = mag > rtol * scale
    t, j = np.nonzero(nz)
    return int(np.max(t - j)) if t.size else 0


def _relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    scale = float(np.max(np.abs(exact)))
    return float(np.max(np.abs(approx - exact))) / scale if scale > 0 else float(np.max(np.abs(approx)))


def compressed_gradient_operator(
    workload: np.ndarray, decoder: BandedLowRank
) -> tuple[BandedLowRank | None, np.ndarray, int]:
    """C^^-1 = A^-1 B^ for a compressed decoder B^, as banded-low-rank when A^-1 is banded.

    Returns ``(structured or None, dense C^^-1, p)``: with ``L = band_p(A^-1)`` the operator is
    band_(K+p)(L B^) plus masked rank R with U' = L U and the same V; it is returned only if it
    reproduces the dense ``solve_triangular(A, B^)`` to :data:`OPERATOR_RTOL`. Otherwise (a custom
    workload whose inverse is not banded) the first element is None and the stream keeps the rows
    of Z (:class:`DenseLowerTriangular`).
    """
    a = np.asarray(workload, dtype=np.float64)
    n = a.shape[0]
    b_hat = decoder.dense()
    import scipy.linalg  # not at module level: commands that never solve (inspect --help) skip scipy

    exact = scipy.linalg.solve_triangular(a, b_hat, lower=True)
    a_inv = scipy.linalg.solve_triangular(a, np.eye(n), lower=True)
    p = _lower_bandwidth(a_inv, rtol=_INVERSE_ZERO_RTOL)
    if p > MAX_INVERSE_BANDWIDTH or decoder.width + p > n:
        return None, exact, p
    low = np.tril(np.triu(a_inv, -p))
    structured = BandedLowRank(band=band_values(low @ b_hat, decoder.width + p), u=low @ decoder.u, v=decoder.v)
    if _relative_error(structured.dense(), exact) > OPERATOR_RTOL:
        return None, exact, p
    return structured, exact, p


class Streaming(NamedTuple):
    """What a noise stream needs from an operator for one noise kind."""

    matrix: StreamingMatrix
    inverse_bandwidth: int | None  # p, sub-diagonals of A^-1 (compressed gradient noise only)


# --------------------------------------------------------------------------------------------
# Mechanisms (noise operators)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class WorkloadLoss:
    """A mechanism's errors on a workload under a participation schema (noise multiplier 1,
    clip norm 1), recomputed by the mechanism from what it runs (:meth:`Mechanism.loss`).

    Attributes:
        sensitivity: the schema sensitivity the errors are scaled by (an upper bound where not
            ``exact``: the errors are then upper bounds too).
        unit: ||B[t, :]||^2 for each step t (the error at unit sensitivity).
        per_step: sens^2 ||B[t, :]||^2, the expected squared error of step t.
        method: how ``unit`` was computed, in words (``dense B``, a closed form, ...).
    """

    sensitivity: Sensitivity
    unit: np.ndarray
    per_step: np.ndarray
    method: str = "dense B"

    @classmethod
    def scaled(cls, sens: Sensitivity, unit: np.ndarray, method: str) -> WorkloadLoss:
        """The loss at ``sens`` of per-step unit errors ``unit``."""
        unit = np.asarray(unit, dtype=np.float64)
        return cls(sens, unit, sens.value**2 * unit, method)

    @property
    def total(self) -> float:
        """sens^2 ||B||_F^2 (the mean, RMSE and worst step follow from ``per_step``)."""
        return float(np.sum(self.per_step))

    @property
    def frobenius(self) -> float:
        """||B||_F^2 (unit sensitivity): what calibrating sigma to a target needs besides sens."""
        return float(np.sum(self.unit))


def check_own_workload(workload: Any, own: np.ndarray, what: str) -> None:
    """Refuse a workload other than ``own`` (the A a decoder was made for): a dense mechanism's
    decoder B answers its own workload only. None, A itself or a workload object holding it pass."""
    if workload is None:
        return
    a = np.asarray(getattr(workload, "matrix", workload), dtype=np.float64)
    if a.shape != np.shape(own) or not np.array_equal(a, own):
        raise MfcliError(f"{what} was made for another workload: its decoder answers its own workload A only")


def factorization_loss(fact: Factorization, schema: Participation | None) -> WorkloadLoss:
    """The loss of a mechanism held as matrices (A, B, C): under single participation (or None)
    sens = the max column norm of C and the errors :attr:`Factorization.per_step_error`; under
    another schema sens from :func:`mfcli.model.participation.sensitivity` of C, times
    ||B[t, :]||^2 of the dense decoder."""
    from mfcli.model.participation import Sensitivity, SingleParticipation, sensitivity

    b = np.asarray(fact.decoder, dtype=np.float64)
    if schema is None or isinstance(schema, SingleParticipation):
        value = float(fact.sensitivity)
        single = Sensitivity(value=value, exact=True, lower=value, method="max column norm",
                             schema=SingleParticipation())
        return WorkloadLoss(single, np.einsum("ij,ij->i", b, b), fact.per_step_error, "dense B")
    s = sensitivity(np.asarray(fact.strategy, dtype=np.float64), schema)
    unit = np.sum(b**2, axis=1)
    return WorkloadLoss(s, unit, s.value**2 * unit, "dense B")


#: The accounting settings every mechanism runs without its dense C, at any n: from its own numbers
#: (single-pass and deterministic from its sensitivities, cyclic Poisson from its cyclic numbers)
#: and the DP-SGD reference rows (:data:`mfcli.accounting.defaults.REFERENCE_SETTINGS`: they account
#: C = I at the same sigma, from n and sigma alone). MMCC and the DP-SGD reduction need C; a kind
#: adds what its own structure gives (:attr:`Mechanism.matrix_free_settings`).
MATRIX_FREE_SETTINGS: tuple[str, ...] = ("single-pass", "deterministic", "cyclic-poisson", *REFERENCE_SETTINGS)


@runtime_checkable
class Mechanism(Protocol):
    """A mechanism A = B C of any kind, as every consumer sees it: what is accounted, inspected,
    compared and streamed (issue 23). Every kind implements it: the operators of a dense artifact
    (:class:`DenseOperator`, :class:`CompressedOperator`), a strategy matrix without an artifact
    (:class:`MatrixStrategy`: a .npy C, a built-in baseline) and a structured strategy
    (:class:`mfcli.strategies.structured.StructuredOperator`: banded Toeplitz, BLT).

    Identity: ``kind`` (the registry key, :data:`mfcli.model.kinds.KINDS`), ``label`` (what account
    prints and records name: ``"dense"``, ``"compressed (band 4, rank 2)"``,
    ``"banded-toeplitz (coefs 3)"``), ``n``, ``identity_sha256`` (None where nothing is stored).

    Accounting: ``sensitivity`` (single participation), :meth:`schema_sensitivity` (exact, or a
    bound labelled as one by ``Sensitivity.exact``), :meth:`cyclic_numbers` (band count and max
    column norm, all cyclic Poisson needs), :meth:`check_causal`, ``release_steps`` and
    :meth:`accounting_matrix` (the dense C where n allows it, else None and
    :meth:`matrix_refusal` says why). ``max_n`` gives the largest n of each capability
    (None: any n).

    Running: :meth:`streaming` (the matrix a noise stream runs), :meth:`dense` (the decoder, size
    limited like the strategy), ``factorization`` (A, C, B as matrices, size limited) and
    :meth:`group` (the artifact group of its parameters; None for the root).

    Errors: :meth:`loss` (sensitivity and per-step errors on a workload under a schema), what
    ``compare`` tabulates for every kind.
    """

    @property
    def kind(self) -> str:
        """The registry key of its kind (:data:`mfcli.model.kinds.KINDS`)."""
        ...

    @property
    def variant(self) -> str:
        """Its noise stream variant (``"dense"``, ``"compressed"`` or ``"structured"``): what a stream
        records and :func:`mfcli.training.noise.noise_stream`'s ``variant`` selects."""
        ...

    @property
    def label(self) -> str:
        """What account prints and records name (``"compressed (band 4, rank 2)"``)."""
        ...

    @property
    def n(self) -> int:
        """The number of steps."""
        ...

    @property
    def factorization(self) -> Factorization:
        """A, C and B as matrices (size limited as :meth:`dense`)."""
        ...

    @property
    def sensitivity(self) -> float:
        """The L2 sensitivity of C under single participation (clip norm 1)."""
        ...

    @property
    def identity_sha256(self) -> str | None:
        """SHA-256 of the stored arrays that define the operator (never of a matrix computed
        from them, whose bytes could depend on the LAPACK build): what an accounting record's
        ``strategy_sha256`` holds (docs/artifact-format.md)."""
        ...

    @property
    def release_steps(self) -> np.ndarray:
        """t(r): the step at which row r of C is released."""
        ...

    @property
    def max_n(self) -> Mapping[str, int | None]:
        """The largest n each capability supports (``matrix``: :meth:`accounting_matrix`,
        ``factorization`` and :meth:`dense`; ``sensitivity``, ``cyclic``, ``stream``); None: any n."""
        ...

    @property
    def rows(self) -> int:
        """m, the rows of C (n for a square C; 2n - 1 for the binary tree)."""
        ...

    @property
    def causal(self) -> bool:
        """B and C are lower-triangular in release order: the mechanism runs as a stream (the
        offline Honaker estimator is not)."""
        ...

    @property
    def is_tree(self) -> bool:
        """C is the binary-tree encoder (the shuffled-tree and balls-in-bins-tree settings apply)."""
        ...

    @property
    def is_identity(self) -> bool:
        """C is exactly the identity, entry by entry (then the mechanism is DP-SGD and DP-SGD's
        accounting holds for it); False where the kind cannot tell exactly (the safe side)."""
        ...

    @property
    def matrix_free_settings(self) -> tuple[str, ...]:
        """The accounting settings it runs without its dense C (:data:`MATRIX_FREE_SETTINGS`, plus
        what its kind's structure gives: the binary tree's own bounds need only n and sigma); the
        others run where :meth:`accounting_matrix` gives C. ``services.account`` asks this, not
        the kind's name."""
        ...

    def schema_sensitivity(self, schema: Participation) -> Sensitivity:
        """The L2 sensitivity under ``schema`` (exact or a bound, as ``exact`` says)."""
        ...

    def cyclic_numbers(self, schema: Participation) -> tuple[int, float]:
        """(bands, max column norm) of C for cyclic Poisson sampling under ``schema``
        (2306.08153 Thm. 3), after checking that its conditions hold for this C."""
        ...

    def check_causal(self, what: str) -> None:
        """Refuse a C that is not causal in release order (``what`` names the bound assuming it)."""
        ...

    def accounting_matrix(self) -> np.ndarray | None:
        """The dense strategy C the matrix settings (MMCC, the DP-SGD reduction) run on; None
        above ``max_n["matrix"]``."""
        ...

    @property
    def no_matrix_reason(self) -> str | None:
        """Why :meth:`accounting_matrix` is None, in words (None when it is not)."""
        ...

    def matrix_refusal(self, what: str) -> str:
        """The one-line refusal of ``what``, which needs the dense C, above ``max_n["matrix"]``."""
        ...

    def dense(self) -> np.ndarray:
        """The decoder (B or B^) as a dense matrix."""
        ...

    def streaming(self, kind: str, *, where: str = "artifact") -> Streaming:
        """The matrix streamed for noise ``kind`` (gradient: C^-1; iterate: B)."""
        ...

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict | None:
        """Its HDF5 group for :func:`mfcli.io.artifact.save_artifact` (None: it is the root)."""
        ...

    def loss(self, workload: Any = None, *, schema: Participation | None = None) -> WorkloadLoss:
        """Its errors on ``workload`` (None: the workload it was made for) under ``schema``
        (None: single participation), recomputed without an n x n matrix where the kind allows
        (:class:`WorkloadLoss`). A kind refuses, in one line, a workload its decoder cannot answer
        and a schema or n it has no exact or certified number for."""
        ...


#: The name the protocol had before it covered accounting (kept: adapters and tests name it).
NoiseOperator = Mechanism


def tree_release(c: np.ndarray) -> np.ndarray | None:
    """Release steps if C is (a positive multiple of) the binary-tree encoder for its n."""
    from mfcli.strategies.baselines import tree_release_steps, tree_strategy_matrix

    n = c.shape[1]
    if n < 2:
        return None
    t = tree_strategy_matrix(n)
    if t.shape != c.shape:
        return None
    scale = c.max()
    if scale <= 0 or not np.allclose(c / scale, t, rtol=0, atol=1e-12):
        return None
    return tree_release_steps(n)


class MatrixAccounting:
    """The accounting part of :class:`Mechanism` for a kind whose strategy C is a matrix at hand
    (``strategy``, ``release_steps``): every number is computed from C."""

    if TYPE_CHECKING:  # supplied by each kind (a field or a property)

        @property
        def strategy(self) -> np.ndarray: ...

        @property
        def release_steps(self) -> np.ndarray: ...

    @property
    def max_n(self) -> Mapping[str, int | None]:
        return {"matrix": None, "sensitivity": None, "cyclic": None, "stream": None}

    def schema_sensitivity(self, schema: Participation) -> Sensitivity:
        from mfcli.model.participation import sensitivity

        return sensitivity(np.asarray(self.strategy, dtype=np.float64), schema)

    def cyclic_numbers(self, schema: Participation) -> tuple[int, float]:
        from mfcli.accounting.multi import band_count, check_cyclic, cycle_length

        c = np.asarray(self.strategy, dtype=np.float64)
        check_cyclic(c, cycle_length(schema, c.shape[1]))
        return band_count(c), float(np.sqrt(np.max(np.sum(c * c, axis=0))))

    @property
    def rows(self) -> int:
        """m, the rows of C."""
        return int(np.shape(self.strategy)[0])

    @property
    def is_tree(self) -> bool:
        """C is (a multiple of) the binary-tree encoder: the tree's own settings apply."""
        return tree_release(np.asarray(self.strategy, dtype=np.float64)) is not None

    @property
    def is_identity(self) -> bool:
        """C == I entry by entry (a square C only)."""
        c = np.asarray(self.strategy)
        return c.ndim == 2 and c.shape[0] == c.shape[1] and bool(np.array_equal(c, np.eye(c.shape[0])))

    def check_causal(self, what: str) -> None:
        from mfcli.accounting.mmcc import check_causal

        check_causal(self.strategy, self.release_steps, what=what)

    def accounting_matrix(self) -> np.ndarray | None:
        return np.asarray(self.strategy, dtype=np.float64)

    #: C is always at hand.
    no_matrix_reason: str | None = None
    #: What would run without C (every setting runs here: C is at hand).
    matrix_free_settings: tuple[str, ...] = MATRIX_FREE_SETTINGS

    def matrix_refusal(self, what: str) -> str:  # pragma: no cover - C is always at hand
        return f"{what} needs the dense strategy C"


def _matrix_release(c: np.ndarray, where: str) -> np.ndarray:
    """Row by row for a square C, the tree's nodes as they close for the tree's C."""
    tr = tree_release(c)
    if tr is not None:
        return tr
    if c.shape[0] == c.shape[1]:
        return np.arange(c.shape[0])
    raise MfcliError(f"{where}: a non-square strategy ({c.shape[0]} x {c.shape[1]}) that is not the binary tree")


@dataclass(frozen=True, eq=False)
class MatrixStrategy(MatrixAccounting):
    """A strategy known only as its matrix C (a .npy file, a built-in baseline, a matrix held in
    memory): the accounting part of the protocol; nothing is streamed or stored."""

    strategy: np.ndarray
    release_steps: np.ndarray

    kind = "matrix"
    variant = "dense"
    label = "dense"
    identity_sha256 = None
    #: Its C is checked causal where an accounting assumes it (check_causal); it has no B.
    causal = True

    @property
    def n(self) -> int:
        return int(np.shape(self.strategy)[1])

    @property
    def sensitivity(self) -> float:
        from mfcli.model.factorization import sensitivity

        return float(sensitivity(self.strategy))

    def _no_decoder(self, what: str) -> MfcliError:
        return MfcliError(f"{what} needs the decoder B: a strategy matrix C alone (a .npy file, a built-in strategy "
                          "in account) has none; use an artifact")

    @property
    def factorization(self) -> Factorization:
        raise self._no_decoder("the factorization")

    def dense(self) -> np.ndarray:
        raise self._no_decoder("the dense decoder")

    def streaming(self, kind: str, *, where: str = "artifact") -> Streaming:
        raise self._no_decoder("a noise stream")

    def loss(self, workload: Any = None, *, schema: Participation | None = None) -> WorkloadLoss:
        raise self._no_decoder("the loss")

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict | None:
        return None


class FactorizationMechanism(MatrixAccounting):
    """The members of :class:`Mechanism` common to the kinds held as a verified factorization
    (A, B, C) (``factorization``): the dense root and the compressed operator."""

    if TYPE_CHECKING:  # a field of each kind

        @property
        def factorization(self) -> Factorization: ...

        @property
        def label(self) -> str: ...

    @cached_property
    def release_steps(self) -> np.ndarray:
        return _matrix_release(np.asarray(self.factorization.strategy, dtype=np.float64), "artifact")

    n = Forwarded[int]("factorization", "n")
    strategy = Forwarded[np.ndarray]("factorization", "strategy", doc="C, the strategy that is accounted.")
    sensitivity = Forwarded("factorization", "sensitivity", float)
    causal = Forwarded("factorization", "causal", bool)

    def dense(self) -> np.ndarray:
        return np.array(self.factorization.decoder)

    def loss(self, workload: Any = None, *, schema: Participation | None = None) -> WorkloadLoss:
        """:func:`factorization_loss` on its own workload (another is refused)."""
        check_own_workload(workload, self.factorization.workload, f"the {self.label} mechanism")
        return factorization_loss(self.factorization, schema)


@dataclass(frozen=True, eq=False)
class DenseOperator(FactorizationMechanism):
    """The dense root mechanism of an artifact: strategy C, decoder B, gradient noise C^-1."""

    factorization: Factorization

    variant = "dense"
    kind = "dense"
    label = "dense"

    @property
    def identity_sha256(self) -> str:
        """:func:`mfcli.io.artifact.dataset_sha256` of the strategy C (float64): the stored
        ``strategy`` dataset's own ``sha256`` attribute, since C is stored, not computed."""
        return dataset_sha256(np.asarray(self.factorization.strategy, dtype=np.float64))

    def streaming(self, kind: str, *, where: str = "artifact") -> Streaming:
        fact = self.factorization
        if kind == "gradient":
            if fact.m != fact.n:
                raise MfcliError(
                    f"{where} has a {fact.m} x {fact.n} strategy: gradient noise C^-1 Z needs a square "
                    "strategy (use kind='iterate' for B Z)"
                )
            op = fact.noising_matrix()
        elif kind == "iterate":
            op = np.array(fact.decoder)
        else:
            raise MfcliError(f"noise kind must be 'gradient' (C^-1 Z) or 'iterate' (B Z), got {kind!r}")
        if fact.m == fact.n and not is_lower_triangular(op):
            raise MfcliError(f"{where}: the {kind} operator is not lower-triangular: it cannot be streamed")
        if fact.m == fact.n:
            banded = banded_inverse_of(fact, kind, op)
            if banded is not None:
                return Streaming(banded, None)
        return Streaming(DenseLowerTriangular(op), None)

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict | None:
        return None


def strategy_for_decoder(workload: np.ndarray, decoder: np.ndarray, *, block: int = 256) -> np.ndarray:
    """C^ = B^-1 A for a lower-triangular B^ with non-zero diagonal and lower-triangular A.

    C^ is lower-triangular, so columns j0..j1 only need the trailing system
    B^[j0:, j0:] C^[j0:, j0:j1] = A[j0:, j0:j1]: blocked triangular solves costing about 0.4 n^3
    flops instead of n^3 for one solve against all of A.

    Raises:
        MfcliError: if B^ has a zero diagonal entry or the solve is not finite.
    """
    a = np.asarray(workload, dtype=np.float64)
    b = np.asarray(decoder, dtype=np.float64)
    d = np.diagonal(b)
    if not np.all(np.isfinite(d)) or np.any(d == 0):
        raise MfcliError("the compressed decoder has a zero on its diagonal and cannot be inverted")
    import scipy.linalg  # not at module level: inspect imports this module and needs no scipy to start

    n = a.shape[0]
    c = np.zeros((n, n))
    if np.any(np.triu(a, 1)):
        c[:] = scipy.linalg.solve_triangular(b, a, lower=True, check_finite=False)
    else:
        for j0 in range(0, n, block):
            j1 = min(n, j0 + block)
            c[j0:, j0:j1] = scipy.linalg.solve_triangular(
                b[j0:, j0:], a[j0:, j0:j1], lower=True, check_finite=False
            )
    if not np.all(np.isfinite(c)):
        raise MfcliError("the compressed decoder is numerically singular: C^ = B^-1 A is not finite")
    return np.tril(c)


def mechanism_for_decoder(workload: np.ndarray, decoder: np.ndarray) -> Factorization:
    """The factorization (A, C^ = B^-1 A, B^) a lower-triangular decoder implies, verified."""
    c = strategy_for_decoder(workload, decoder)
    fact = Factorization(workload=workload, strategy=c, decoder=decoder, causal=True)
    try:
        fact.verify()
    except MfcliError as exc:
        raise MfcliError(f"the compressed decoder is too ill-conditioned to use: {exc}") from None
    return fact


def compressed_identity_sha256(workload: np.ndarray, band: np.ndarray, u: np.ndarray, v: np.ndarray) -> str:
    """Identity of the compressed mechanism (A, B^): SHA-256 of the ASCII text
    ``"mfcli.operator.compressed.v1 workload=<h> compressed/band=<h> compressed/u=<h> compressed/v=<h>"``
    where each ``<h>`` is :func:`mfcli.io.artifact.dataset_sha256` of that array as float64 (for
    the float64 datasets mfcli writes, the dataset's stored ``sha256`` attribute).

    A and B^ = (band, u, v) define the mechanism completely (C^ = B^-1 A), and these hashes are
    of stored bytes, so the identity is the same on every machine.
    """
    arrays = (workload, band, u, v)
    text = " ".join([IDENTITY_TAG] + [
        f"{name}={dataset_sha256(np.asarray(arr, dtype=np.float64))}" for name, arr in zip(IDENTITY_PARTS, arrays, strict=True)
    ])
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def check_band_rank(n: int, band: int, rank: int) -> None:
    """Raise MfcliError unless 1 <= K <= n and 0 <= R <= n - K.

    K >= 1 keeps the diagonal of B (so B^ is invertible); the masked region j <= t - K has
    n - K rows and columns, so a rank above n - K means nothing.
    """
    if isinstance(band, bool) or not isinstance(band, (int, np.integer)):
        raise MfcliError(f"band K must be an integer, got {band!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise MfcliError(f"rank R must be an integer, got {rank!r}")
    if not 1 <= band <= n:
        raise MfcliError(f"band K = {band} is out of range: need 1 <= K <= n = {n}")
    if not 0 <= rank <= n - band:
        raise MfcliError(f"rank R = {rank} is out of range: need 0 <= R <= n - K = {n - band}")


@dataclass(frozen=True, eq=False)
class CompressedOperator(FactorizationMechanism):
    """A banded plus low-rank decoder B^ and the mechanism (A, C^ = B^-1 A, B^) it implies.

    Attributes:
        decoder_matrix: B^ as a :class:`BandedLowRank` (K = its width, R = its rank).
        factorization: workload A, strategy C^ = B^-1 A, decoder B^ (verified A = B^ C^).
        dense_loss_total: loss of the dense factorization it was made from.
        dense_sensitivity: sens(C) of that dense factorization.
        fit_relative_error: ||B - B^||_F / ||B||_F against the dense decoder.
        als_iterations: ALS iterations used (0 when R = 0 or K = n).

    Formal guarantees: ``sensitivity``, ``loss_total`` and ``loss_increase`` are recomputed from
    B^ (sens(C^) = max_j ||(B^-1 A)[:, j]||_2, single participation, clip norm 1), not carried
    over from the dense solution. Releasing A G + B^ Z with Z ~ N(0, sigma^2) is the Gaussian
    mechanism on C^ G with L2 sensitivity sens(C^) x clip, post-processed by B^.
    """

    decoder_matrix: BandedLowRank
    factorization: Factorization
    dense_loss_total: float
    dense_sensitivity: float
    fit_relative_error: float
    als_iterations: int = 0

    variant = "compressed"
    kind = "compressed"

    @classmethod
    def build(
        cls, dense: Factorization, decoder: BandedLowRank, *, als_iterations: int = 0
    ) -> CompressedOperator:
        """The compressed mechanism of ``decoder`` for the workload of ``dense``, recomputed."""
        b_hat = decoder.dense()
        b = dense.decoder
        return cls(
            decoder_matrix=decoder, factorization=mechanism_for_decoder(dense.workload, b_hat),
            dense_loss_total=dense.loss_total, dense_sensitivity=dense.sensitivity,
            fit_relative_error=float(np.linalg.norm(b - b_hat) / np.linalg.norm(b)),
            als_iterations=int(als_iterations),
        )

    band = Forwarded[int]("decoder_matrix", "width", doc="K, the number of exact diagonals kept.")
    rank = Forwarded[int]("decoder_matrix", "rank", doc="R, the rank of the masked low-rank part.")
    band_values = Forwarded[np.ndarray]("decoder_matrix", "band", doc="n x K, ``band_values[t, i] = B^[t, t - i]``.")
    u = Forwarded[np.ndarray]("decoder_matrix", "u")
    v = Forwarded[np.ndarray]("decoder_matrix", "v")

    @property
    def label(self) -> str:
        return f"compressed (band {self.band}, rank {self.rank})"

    @property
    def decoder(self) -> np.ndarray:
        """B^ (the accounted strategy ``strategy`` is C^ = B^-1 A)."""
        return self.factorization.decoder

    @property
    def identity_sha256(self) -> str:
        """:func:`compressed_identity_sha256` of A, band, u and v: C^ = B^-1 A is computed by a
        triangular solve whose last bits depend on the LAPACK build, so it is not hashed."""
        return compressed_identity_sha256(
            self.factorization.workload, self.decoder_matrix.band, self.decoder_matrix.u, self.decoder_matrix.v
        )

    @property
    def loss_total(self) -> float:
        return self.factorization.loss_total

    @property
    def loss_increase(self) -> float:
        """loss_total / dense_loss_total - 1 (0.01 means 1% more total squared error)."""
        return self.loss_total / self.dense_loss_total - 1.0

    @property
    def stream_cost(self) -> int:
        """K + R: noise rows touched per step (K band rows, R state rows)."""
        return self.band + self.rank

    def streaming(self, kind: str, *, where: str = "artifact") -> Streaming:
        if kind == "iterate":
            return Streaming(self.decoder_matrix, None)
        if kind != "gradient":
            raise MfcliError(f"noise kind must be 'gradient' (C^-1 Z) or 'iterate' (B Z), got {kind!r}")
        structured, exact, p = compressed_gradient_operator(self.factorization.workload, self.decoder_matrix)
        if structured is not None:
            return Streaming(structured, p)
        return Streaming(DenseLowerTriangular(exact), p)

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict:
        """The ``compressed`` group for :func:`mfcli.io.artifact.save_artifact`."""
        attrs: dict[str, Any] = {
            **self.numbers(),
            "definition": DEFINITION,
            "noise_operator": "B^ (iterate noise); gradient noise is (C^-1 Z)[t] with C^ = B^-1 A",
        }
        attrs.update(source or {})
        return {"datasets": {"band": self.band_values, "u": self.u, "v": self.v}, "attrs": attrs}

    def summary(self) -> dict:
        """Recomputed numbers as a JSON-ready dict."""
        return {**self.numbers(), "stream_cost": self.stream_cost}

    def numbers(self) -> dict:
        """The recomputed numbers both the stored group and the summary carry."""
        f = self.factorization
        return {
            "band": int(self.band),
            "rank": int(self.rank),
            "sensitivity": f.sensitivity,
            "loss_total": f.loss_total,
            "loss_mean": f.loss_mean,
            "loss_max": f.loss_max,
            "loss_increase": self.loss_increase,
            "dense_loss_total": self.dense_loss_total,
            "dense_sensitivity": self.dense_sensitivity,
            "fit_relative_error": self.fit_relative_error,
            "als_iterations": int(self.als_iterations),
        }


# --------------------------------------------------------------------------------------------
# The one reader of the compressed group, and the one choice of the operator that runs
# --------------------------------------------------------------------------------------------


class NumberCheck(NamedTuple):
    """One stored number next to its recomputation."""

    name: str
    stored: Any
    recomputed: Any
    ok: bool


@dataclass(frozen=True)
class CompressedReading:
    """What :func:`check_compressed` found: the operator (None if the group is unusable), each
    stored number next to its recomputation, and the structural problem if any."""

    operator: CompressedOperator | None
    checks: tuple[NumberCheck, ...] = field(default_factory=tuple)
    problem: str | None = None

    def failures(self) -> list[str]:
        """Every finding as one line (empty when the group is sound)."""
        out = [self.problem] if self.problem else []
        out += [
            f"stored {GROUP}/{c.name} {c.stored!r} does not match the value recomputed from band, u and v "
            f"({c.recomputed!r})"
            for c in self.checks if not c.ok
        ]
        return out


def check_compressed(dense: Factorization, group: Mapping[str, Any]) -> CompressedReading:
    """Rebuild B^ from a ``compressed`` group and compare every stored number; never raises for a
    bad group (``mfcli inspect`` lists the findings, :func:`read_compressed` refuses them)."""
    attrs = group.get("attrs", {})
    ds = group.get("datasets", {})
    n = dense.n
    missing = [name for name in ("band", "u", "v") if name not in ds]
    if missing:
        return CompressedReading(None, problem=f"group {GROUP!r} lacks dataset(s) {', '.join(missing)}")
    try:
        bd, u, v = (np.asarray(ds[name], dtype=np.float64) for name in ("band", "u", "v"))
    except (TypeError, ValueError):
        return CompressedReading(None, problem=f"{GROUP}/band, u and v must be numeric arrays")
    k_attr, r_attr = attrs.get("band"), attrs.get("rank")
    if dense.m != n:
        return CompressedReading(None, problem="a compressed group needs a square root factorization")
    if bd.ndim != 2 or bd.shape != (n, k_attr):
        return CompressedReading(
            None, problem=f"{GROUP} band has shape {bd.shape}, expected ({n}, {k_attr!r}) from its attributes"
        )
    if u.ndim != 2 or v.ndim != 2 or u.shape != (n, r_attr) or v.shape != (n, r_attr):
        return CompressedReading(
            None, problem=f"{GROUP} u {u.shape} and v {v.shape} must be ({n}, {r_attr!r}) from its attributes"
        )
    try:
        check_band_rank(n, bd.shape[1], u.shape[1])
        op = CompressedOperator.build(
            dense, BandedLowRank(band=bd, u=u, v=v), als_iterations=_int_or_zero(attrs.get("als_iterations"))
        )
    except MfcliError as exc:
        return CompressedReading(None, problem=f"{GROUP} group: {exc}")
    checks = []
    for name, recomputed, rtol, atol in (
        ("sensitivity", op.sensitivity, ATTR_RTOL, 0.0),
        ("loss_total", op.loss_total, ATTR_RTOL, 0.0),
        ("loss_increase", op.loss_increase, 0.0, INCREASE_ATOL),
    ):
        stored = attrs.get(name)
        ok = isinstance(stored, (int, float)) and not isinstance(stored, bool) and bool(
            np.isclose(stored, recomputed, rtol=rtol, atol=atol)
        )
        checks.append(NumberCheck(name, stored, recomputed, ok))
    return CompressedReading(op, tuple(checks))


def _int_or_zero(value: Any) -> int:
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else 0


def read_compressed(artifact: Any) -> CompressedOperator:
    """The verified compressed operator of a loaded artifact (from :func:`mfcli.io.artifact.load_artifact`,
    which has already checked every dataset's SHA-256 and the dense root).

    Rebuilds B^ from ``band``, ``u``, ``v``, recomputes C^ = B^-1 A, sens(C^), the loss
    sens(C^)^2 ||B^||_F^2 and the loss increase, and compares each with the stored attribute.

    Raises:
        ArtifactError: no ``compressed`` group, a malformed one, or a stored number that does not
            match its recomputation (naming which).
    """
    where = str(getattr(artifact, "path", "artifact"))
    group = artifact.groups.get(GROUP)
    if group is None:
        raise ArtifactError(f"{where} has no {GROUP!r} group (no compressed decoder; run mfcli compress first)")
    reading = check_compressed(artifact.factorization, group)
    failures = reading.failures()
    if failures or reading.operator is None:
        raise ArtifactError(f"{where}: {failures[0] if failures else 'unreadable compressed group'}")
    return reading.operator


def check_operator_choice(choice: Any) -> str:
    """``choice`` if it is one of :data:`CHOICES`; the one check of an operator choice.

    Raises:
        MfcliError: any other value.
    """
    if choice not in CHOICES:
        raise MfcliError(f"operator must be one of {', '.join(CHOICES)}, got {choice!r}")
    return str(choice)


def operators_of(artifact: Any) -> list[Mechanism]:
    """Every operator a loaded artifact of any kind has, the one it runs by default first: a
    structured artifact's one (its parameters); a dense artifact's dense root and, with a
    ``compressed`` group, the compressed one (:func:`read_compressed`, strict)."""
    if hasattr(artifact, "schema_sensitivity"):  # artifact I/O: a structured artifact (mfcli.strategies.structured)
        return [artifact.operator()]
    ops: list[Mechanism] = [DenseOperator(artifact.factorization)]
    if GROUP in artifact.groups:
        ops.append(read_compressed(artifact))
    return ops


def select_operator(artifact: Any, choice: str = "auto") -> DenseOperator | CompressedOperator:
    """The operator that runs for ``artifact``: what noise streams stream and what accounting
    accounts (one function, so the two cannot disagree).

    ``auto`` is the compressed operator when the artifact has a ``compressed`` group, else the
    dense root; ``dense`` and ``compressed`` force one (``compressed`` where there is none is an
    error). The compressed operator comes from :func:`read_compressed` (strict, recomputed).

    Raises:
        MfcliError: an unknown choice, or ``compressed`` without a compressed group.
        ArtifactError: a compressed group that does not verify.
    """
    check_operator_choice(choice)
    if hasattr(artifact, "schema_sensitivity"):  # a structured artifact (mfcli.strategies.structured)
        if choice == "compressed":
            raise MfcliError(f"{artifact.path} is a structured {artifact.kind} strategy: a structured artifact has "
                             f"one operator (its parameters); operator {choice!r} does not apply")
        return artifact.operator()
    has = GROUP in artifact.groups
    declared = compression_declared_problem(getattr(artifact, "attrs", {}), has)
    if declared is not None and choice == "auto":  # never a silent fall-back to the dense operator
        raise ArtifactError(f"{getattr(artifact, 'path', 'artifact')}: {declared}; refusing to pick an operator "
                            "(choose dense explicitly to use the root decoder)")
    if choice == "compressed" and not has:
        raise MfcliError(f"{getattr(artifact, 'path', 'artifact')} has no compressed decoder (run mfcli compress first)")
    if choice == "compressed" or (choice == "auto" and has):
        return read_compressed(artifact)
    return DenseOperator(artifact.factorization)


__all__ = [
    "CHOICES",
    "GROUP",
    "ArrayOps",
    "BandedInverse",
    "BandedLowRank",
    "BufferRecursion",
    "CompressedOperator",
    "CompressedReading",
    "DenseLowerTriangular",
    "DenseOperator",
    "IirRecursion",
    "MatrixAccounting",
    "MatrixStrategy",
    "Mechanism",
    "NoiseOperator",
    "NumberCheck",
    "StreamState",
    "Streaming",
    "StreamingMatrix",
    "band_values",
    "banded_inverse_of",
    "check_band_rank",
    "check_compressed",
    "check_operator_choice",
    "compressed_gradient_operator",
    "compressed_identity_sha256",
    "init_state",
    "mechanism_for_decoder",
    "operators_of",
    "read_compressed",
    "select_operator",
    "strategy_for_decoder",
    "tree_release",
]
