"""Streams of correlated noise for training: what a trainer adds at step t (docs/noise-streams.md).

A factorization A = B C is run in training as ``A G + B Z = A (G + C^-1 Z)``. A framework that
already runs the optimizer encoded in the workload A (SGD, heavy-ball momentum, a learning-rate
schedule) therefore adds one row of correlated noise per step. Two operators exist and users
confuse them, so every stream says which one it carries:

* ``kind="gradient"``: row t of **C^-1 Z**, added to the summed clipped gradient of step t (what
  the PyTorch and optax adapters do). For a compressed artifact this is C^^-1 Z = A^-1 B^ Z.
* ``kind="iterate"``: row t of **B Z**, the noise on the released iterate/output of step t (for a
  trainer that releases A G itself, e.g. a prefix-sum server). Compressed: B^ Z.

Noise comes per unit noise multiplier and clip norm: the trainer multiplies it by
``sigma * clip``. Z is an n x d (m x d for a non-square strategy) matrix of independent standard
normals whose row j is drawn from ``(seed, j)`` with numpy's counter-based Philox generator
(key = seed; entries in blocks of 65,536, block c from counter (0, c, j, 0)), so a row can be
drawn block-parallel (``threads``) with the same result. This numpy stream is the reference; the
torch and optax adapters run the same recursions with their own generators
(docs/noise-streams.md, "Reproducibility contract").

How a step is computed: one recursion per kind, :meth:`mfcli.strategies.operators.StreamingMatrix.step`,
whose state is ``width`` kept rows of Z and ``rank`` carried rows (the stream's ``method`` names
it):

* ``banded-low-rank`` (compressed artifacts): ``M[t, t-i] = band[t, i]`` for i < W and
  ``M[t, j] = U[t] . V[j]`` for j <= t - W, so
  ``(M Z)[t] = sum_{i<W} band[t, i] Z[t-i] + U[t] . S_{t-W}`` with the running sums
  ``S_m = sum_{j<=m} V[j]^T Z[j]``: W kept rows, R carried. Iterate noise has W = K; gradient
  noise W = K + p when A^-1 is banded with p sub-diagonals, since then
  ``C^^-1 = band_p(A^-1) B^`` is again banded (K + p) plus masked rank R.
* ``banded-inverse`` (dense artifacts whose C is banded, e.g. BandMF):
  ``x_t = (z_t - sum_{k<=p} M[t, t-k] x_{t-k}) / M[t, t]`` with M = C (gradient) or B^-1 = C A^-1
  (iterate) when banded: p carried outputs.
* ``recursion`` (structured artifacts): a banded Toeplitz C^-1 = num(z) / den(z) as the filter
  ``den_0 x_t = sum_{k<=W} num_k Z[t-k] - sum_{1<=k<=R} den_k x_{t-k}``; a BLT in its buffer form
  (:class:`mfcli.strategies.operators.BufferRecursion`), which keeps each decay exact.
* ``history`` (any other dense operator: a dense optimal C^-1, a tree decoder): the rows of Z
  drawn so far are kept (m x d floats, checked against ``max_memory`` up front) and row t costs
  t multiply-adds of d floats; nothing is redrawn.

All but ``history`` cost O((width + rank) d) per step and (width + rank + 1) d floats, whatever
t and n.

The state is an immutable :class:`NoiseState`; :meth:`NoiseStream.next` is pure in effect: calling
it twice on the same state returns the same noise. To keep memory at (width + rank + 1) d the
latest state lends its working buffers to the next one; using an older state again is still
correct (its buffers are rebuilt by running the recursion from step 0, O(t d), with a
:class:`StaleNoiseStateWarning`) but slow. :meth:`NoiseStream.state_dict` /
:meth:`NoiseStream.load_state_dict` checkpoint and resume a stream exactly: the one checkpoint
format of every stream and adapter (:meth:`NoiseStream.checkpoint`) holds the carried rows, and
the kept rows of Z are redrawn on load.

Formal guarantees: the noise a stream returns at step t equals row t of ``M Z`` with M the
operator named by ``kind`` (C^-1 or B, or their compressed versions), computed in the stream's
dtype; a banded representation (banded-low-rank or banded-inverse) is used only after it
reproduces M (computed independently by a dense triangular solve) to a relative max-entry error
of 1e-10. Step t >= n is refused: reusing or inventing noise rows past the end breaks the privacy
analysis; so is an operator whose rows could overflow the dtype, and a state over the memory
budget. The privacy of training with a stream is set by :attr:`NoiseStream.sensitivity` (sens(C),
or sens(C^) recomputed for a compressed artifact) and the noise multiplier, not by the stream
itself. The seed is a secret: anyone who knows it can regenerate Z and remove the noise; so can
anyone who reads a checkpoint of the carried rows together with the seed.
"""
from __future__ import annotations

import hashlib
import hmac
import threading
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

import numpy as np

from mfcli.errors import MfcliError, NoiseStreamExhaustedError
from mfcli.strategies.operators import CHOICES, KINDS, StreamingMatrix, select_operator
from mfcli.util.memory import check_memory, default_max_memory
from mfcli.util.validation import positive_int

VARIANTS = CHOICES
DTYPES = ("float32", "float64")
#: Seeds are Philox keys: integers in [0, 2^128).
SEED_BOUND = 2**128

#: Entries per block of a noise row: block c of Z[j] is drawn from Philox counter (0, c, j, 0),
#: and a step works block by block (in cache, and in parallel with ``threads``).
BLOCK = 1 << 16
_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCAL = threading.local()
_MASK64 = (1 << 64) - 1

STATE_FORMAT = "mfcli.noise_state"
#: Version 2 added the authentication tag; version 3 the generator field and one format for every
#: kind and adapter (carried rows of the kind's recursion). Older checkpoints are refused.
STATE_FORMAT_VERSION = 3
#: Checkpoint fields covered by the authentication tag (everything but the tag itself).
_TAGGED_FIELDS = (
    "format", "format_version", "t", "n", "d", "dtype", "kind", "variant", "method", "fingerprint",
    "generator", "seed_sha256", "generator_check",
)
#: The ``generator`` of numpy streams: Z[j] from Philox (key seed, counter (0, block, j, 0)).
NUMPY_GENERATOR = "numpy-philox"
#: Default budget for a stream's state, bytes (None: no limit): half the physical memory.
DEFAULT_MAX_MEMORY = default_max_memory()

OPERATOR_NAMES = {
    ("gradient", "dense"): "C^-1 (gradient noise: add row t to the summed clipped gradient of step t)",
    ("gradient", "compressed"): "C^^-1 = A^-1 B^ (gradient noise of the compressed mechanism)",
    ("iterate", "dense"): "B (iterate noise: row t is the noise on the released output of step t)",
    ("iterate", "compressed"): "B^ (iterate noise of the compressed mechanism)",
    ("gradient", "structured"): "C^-1 of a structured (Toeplitz) strategy, by recursion (gradient noise)",
    ("iterate", "structured"): "B = A C^-1 of a structured (Toeplitz) strategy, by recursion (iterate noise)",
}


class StaleNoiseStateWarning(UserWarning):
    """An older :class:`NoiseState` was used again; its buffers are rebuilt in O(t d)."""


# ---------------------------------------------------------------------------------------------
# Noise rows


def check_seed(seed: Any, *, what: str = "noise seed") -> int:
    """Validate a seed (``what`` names it in the error): an integer in [0, 2^128), a Philox key."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise MfcliError(f"the {what} must be an integer in [0, 2^128), got {type(seed).__name__}")
    s = int(seed)
    if not 0 <= s < SEED_BOUND:
        raise MfcliError(f"the {what} must be an integer in [0, 2^128)")
    return s


def check_dtype(dtype: Any) -> np.dtype:
    """float32 or float64 (as a name or numpy dtype)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise MfcliError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if dt.name not in DTYPES:
        raise MfcliError(f"dtype must be float32 or float64, got {dt.name}")
    return dt


def check_dimension(d: Any) -> int:
    """The number of model parameters d: a positive integer of at most
    :data:`mfcli.util.validation.MAX_COUNT` (a larger one cannot be sized in floats)."""
    return positive_int(d, "d (the number of model parameters)")


def _fill_block(seed: int, j: int, block: int, out: np.ndarray) -> None:
    """Block ``block`` of Z[j] (entries block * BLOCK ..): Philox key seed, counter (0, block, j, 0).

    Equivalent to ``Generator(Philox(key=seed, counter=[0, block, j, 0])).standard_normal(...)``;
    a per-thread generator is reset to that fresh state instead of being constructed (30x faster,
    which matters when a row of a small d is drawn at every step).
    """
    gen = getattr(_LOCAL, "generator", None)
    if gen is None:
        gen = _LOCAL.generator = np.random.Generator(np.random.Philox(key=0))
    gen.bit_generator.state = {
        "bit_generator": "Philox",
        "state": {
            "counter": np.array([0, block, j, 0], dtype=np.uint64),
            "key": np.array([seed & _MASK64, seed >> 64], dtype=np.uint64),
        },
        "buffer": np.zeros(4, dtype=np.uint64),
        "buffer_pos": 4,          # empty output buffer, as in a freshly constructed Philox
        "has_uint32": 0,
        "uinteger": 0,
    }
    gen.standard_normal(out=out, dtype=out.dtype)


def _blocks(d: int) -> list[tuple[int, int, int]]:
    return [(c, start, min(start + BLOCK, d)) for c, start in enumerate(range(0, d, BLOCK))]


def _pool(threads: int) -> ThreadPoolExecutor:
    pool = _POOLS.get(threads)
    if pool is None:
        pool = _POOLS.setdefault(threads, ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mfcli-noise"))
    return pool


def _for_blocks(d: int, threads: int, work: Callable[[int, int, int], None]) -> None:
    """Run ``work(block, start, stop)`` over the coordinate blocks, in threads if asked (numpy's
    generators and ufuncs release the GIL). Results never depend on the thread count."""
    blocks = _blocks(d)
    if threads <= 1 or len(blocks) == 1:
        for blk in blocks:
            work(*blk)
        return
    for fut in [_pool(threads).submit(work, *blk) for blk in blocks]:
        fut.result()


def noise_row(
    seed: int, j: int, d: int, dtype: Any = "float64", *, out: np.ndarray | None = None, threads: int = 1
) -> np.ndarray:
    """Z[j]: d independent standard normals regenerated from ``(seed, j)``.

    Entries are drawn in blocks of :data:`BLOCK` = 65,536: block c of row j comes from Philox with
    key ``seed`` and counter ``(0, c, j, 0)`` (numpy's ``standard_normal``), so rows and blocks
    use disjoint parts of the counter space and blocks can be drawn in parallel (``threads``)
    with the same result. float32 rows are drawn with numpy's float32 sampler, so a float32
    stream is not the float64 stream rounded: the dtype is part of the stream's identity.
    """
    seed = check_seed(seed)
    dt = check_dtype(dtype)
    if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or int(j) < 0:
        raise MfcliError(f"noise row index must be a non-negative integer, got {j!r}")
    if out is None:
        out = np.empty(check_dimension(d), dtype=dt)
    elif out.dtype != dt or out.ndim != 1 or not out.flags.c_contiguous:
        raise MfcliError(f"out must be a contiguous 1-D {dt.name} array")
    jj = int(j)
    _for_blocks(out.shape[0], threads, lambda c, a, b: _fill_block(seed, jj, c, out[a:b]))
    return out


def noise_matrix(seed: int, rows: int, d: int, dtype: Any = "float64") -> np.ndarray:
    """Z[0:rows] stacked (rows x d): for tests and small problems, never for training at scale."""
    dt = check_dtype(dtype)
    z = np.empty((rows, check_dimension(d)), dtype=dt)
    for j in range(rows):
        noise_row(seed, j, d, dt, out=z[j])
    return z


# ---------------------------------------------------------------------------------------------
# Stream and state


class NumpyOps:
    """:class:`mfcli.strategies.operators.ArrayOps` on numpy arrays, updating in place (the reference).

    ``fill(j, out)``, when given, writes Z[j] (this block of it) into ``out``: :meth:`fill_rows`
    then draws straight into the kept rows instead of drawing a row and copying it there.
    """

    def __init__(self, dtype: np.dtype, fill: Callable[[int, np.ndarray], None] | None = None) -> None:
        self.dtype = dtype
        self.fill = fill

    def zeros(self, rows: int, d: int) -> np.ndarray:
        return np.zeros((rows, d), dtype=self.dtype)

    def set_row(self, a: np.ndarray, i: Any, value: np.ndarray) -> np.ndarray:
        a[i] = value
        return a

    def set_rows(self, a: np.ndarray, start: int, values: np.ndarray) -> np.ndarray:
        target = a[start:start + values.shape[0]]
        if target.__array_interface__["data"][0] != values.__array_interface__["data"][0]:  # updated in place already
            target[...] = values
        return a

    def matvec(self, coef: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return coef @ rows

    def addmv(self, x: np.ndarray, coef: np.ndarray, rows: np.ndarray, alpha: float) -> np.ndarray:
        # x - coef @ rows (alpha -1) rounds exactly as the expression: same bits, no temporary sum
        (np.subtract if alpha == -1.0 else np.add)(x, coef @ rows if abs(alpha) == 1.0 else alpha * (coef @ rows), out=x)
        return x

    def add_outer(self, a: np.ndarray, coef: np.ndarray, row: np.ndarray) -> np.ndarray:
        scratch = np.empty_like(row)
        for r in range(a.shape[0]):
            np.multiply(row, coef[r], out=scratch)
            np.add(a[r], scratch, out=a[r])
        return a

    def scale_add(self, a: np.ndarray, scale: np.ndarray, row: np.ndarray) -> np.ndarray:
        np.multiply(a, scale[:, None], out=a)
        np.add(a, row[None, :], out=a)
        return a

    def prefix_matvec(self, coef: np.ndarray, rows: np.ndarray, k: Any) -> np.ndarray:
        k = int(k)
        return coef[:k] @ rows[:k]

    def fill_rows(self, a: np.ndarray, lo: Any, hi: Any, draw: Callable[[Any], Any]) -> np.ndarray:
        for j in range(int(lo), int(hi)):
            if self.fill is not None and a[j].flags.c_contiguous:
                self.fill(j, a[j])
            else:
                a[j] = draw(j)
        return a


def cast_tables(tables: Mapping[str, np.ndarray], convert: Callable[[np.ndarray], Any], dtype: Any, *,
                index: Callable[[np.ndarray], Any] | None = None) -> dict[str, Any]:
    """A recursion's tables for a driver: float tables cast to the stream's dtype and converted
    (``convert``: to device or jax arrays); index tables (integers) converted by ``index``, by
    default kept as numpy on the host, where an eager driver reads its loop bounds."""
    def one(v: np.ndarray) -> Any:
        if v.dtype.kind in "iu":
            return v if index is None else index(v)
        return convert(np.ascontiguousarray(v, dtype=dtype))

    return {k: one(v) for k, v in tables.items()}


@dataclass(eq=False)
class _Workspace:
    """The recursion's state for the step ``position``: ``ring`` (kept rows of Z) and ``carry``
    (running sums, recent outputs or buffers), each with d columns. Private: lent from state to
    state."""

    ring: np.ndarray
    carry: np.ndarray
    position: int


@dataclass(frozen=True, eq=False)
class NoiseState:
    """Where a noise stream stands: the next step to produce is ``t``.

    A plain immutable value: keep it, pass it to :meth:`NoiseStream.next`, checkpoint it with
    :meth:`NoiseStream.state_dict`. It carries a tag of the stream that made it, so it cannot be
    fed to a stream with another seed, operator, d or dtype.
    """

    t: int
    stream_tag: str
    _work: _Workspace | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, eq=False)
class NoiseStream:
    """Correlated noise for a model of ``d`` parameters, one row per training step.

    Build one with :func:`noise_stream`. Use as::

        state = stream.init()
        for t in range(stream.n):
            noise, state = stream.next(state)      # (d,) array, unit noise multiplier and clip
            grad += sigma * clip * noise           # kind="gradient": C^-1 Z, added to gradients

    Attributes:
        kind: ``gradient`` (rows of C^-1 Z) or ``iterate`` (rows of B Z).
        variant: ``dense``, ``compressed`` or ``structured``.
        n: steps covered; step t >= n is refused.
        d: model dimension.
        dtype: float32 or float64.
        method: the recursion's name (``banded-low-rank``, ``banded-inverse``, ``recursion``,
            ``buffers`` or ``history``; module docstring), for humans and checkpoints.
        operator: the :class:`~mfcli.strategies.operators.StreamingMatrix` applied to Z: its ``step`` is
            the one implementation every driver (numpy here, torch and jax in the adapters) runs.
        sensitivity: single participation sensitivity of the accounted strategy, in units of the
            clip norm: what the privacy accounting of training with this stream must use.
        fingerprint: SHA-256 of kind, variant and the operator's float64 bytes.
        source: the artifact path.
        inverse_bandwidth: p, sub-diagonals of A^-1 (compressed gradient streams only).
        workload_name, workload_params: what the artifact says A is (for adapters' checks).
        threads: worker threads a step uses over blocks of 65,536 coordinates (results do not
            depend on it).
        accounted_operator: the label of the mechanism whose strategy accounting uses.
    """

    kind: str
    variant: str
    n: int
    d: int
    dtype: np.dtype
    seed: int = field(repr=False)
    method: str
    operator: StreamingMatrix = field(repr=False)
    sensitivity: float
    fingerprint: str
    source: str = ""
    inverse_bandwidth: int | None = None
    workload_name: str = ""
    workload_params: Mapping[str, Any] = field(default_factory=dict, repr=False)
    threads: int = 1
    accounted_operator: str = ""

    # ------------------------------------------------------------------ description

    @property
    def operator_name(self) -> str:
        """Which operator this stream carries, in words (C^-1 gradient noise vs B iterate noise)."""
        return OPERATOR_NAMES[(self.kind, self.variant)]

    @property
    def width(self) -> int:
        """Rows of Z the state keeps (the band W; all m rows for the dense ``history`` kind)."""
        return self.operator.width

    @property
    def rank(self) -> int:
        """Carried rows of d floats (running sums, recent outputs or buffers), checkpointed."""
        return self.operator.rank

    @property
    def tag(self) -> str:
        """Identity of the noise sequence: operator fingerprint, seed, d and dtype (hashed once:
        every step checks its state against it)."""
        cached = self.__dict__.get("_tag_cache")
        if cached is None:
            h = hashlib.sha256()
            h.update(f"{self.fingerprint}|{self.seed}|{self.d}|{self.dtype.name}".encode())
            cached = h.hexdigest()
            object.__setattr__(self, "_tag_cache", cached)
        return cached

    def memory_floats(self) -> int:
        """Floats a step holds, the returned row included: (width + rank + 1) d."""
        return stream_floats(self.operator, self.d)

    def describe(self) -> dict:
        """A JSON-ready summary of the stream (no seed)."""
        return {
            "kind": self.kind,
            "operator": self.operator_name,
            "variant": self.variant,
            "method": self.method,
            "n": self.n,
            "d": self.d,
            "dtype": self.dtype.name,
            "band_width": self.width,
            "rank": self.rank,
            "inverse_bandwidth": self.inverse_bandwidth,
            "memory_floats": self.memory_floats(),
            "sensitivity": self.sensitivity,
            "accounted_operator": self.accounted_operator,
            "fingerprint": self.fingerprint,
            "source": self.source,
        }

    def operator_matrix(self) -> np.ndarray:
        """The operator M the stream applies to Z (n x n, or n x m for a non-square strategy)."""
        return self.operator.dense()

    # ------------------------------------------------------------------ pure interface

    def init(self) -> NoiseState:
        """The state before step 0."""
        return NoiseState(t=0, stream_tag=self.tag, _work=self._new_workspace(0))

    def next(self, state: NoiseState) -> tuple[np.ndarray, NoiseState]:
        """Row ``state.t`` of the stream's noise and the state for the following step.

        Returns a new (d,) array the caller owns. Raises MfcliError at t >= n, for a state of
        another stream, or for a row that is not finite.
        """
        t = self._check_state(state)
        work = state._work
        if work is None or work.position != t:
            if work is not None:
                warnings.warn(
                    f"noise state for step {t} was used again after a later step; rebuilding its "
                    "buffers from the seed (O(t d)). Keep only the latest state, or branch with "
                    "state_dict/load_state_dict.",
                    StaleNoiseStateWarning,
                    stacklevel=2,
                )
            work = self._rebuild(t)
        out = self._advance(work, t)
        return out, NoiseState(t=t + 1, stream_tag=state.stream_tag, _work=work)

    def state_at(self, t: int) -> NoiseState:
        """The state before step ``t``, rebuilt from the seed by running the recursion (O(t d))."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) <= self.n:
            raise MfcliError(f"step must be an integer in [0, {self.n}], got {t!r}")
        return NoiseState(t=int(t), stream_tag=self.tag, _work=self._rebuild(int(t)))

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self, state: NoiseState) -> dict:
        """A checkpoint of ``state``: plain Python values and numpy arrays (np.savez, pickle).

        The one checkpoint format of every noise stream and adapter (:meth:`checkpoint`): the
        step, the stream's identity (operator fingerprint, a hash of the seed, d, dtype, kind),
        the generator that draws Z, the carried rows (running sums, recent outputs or buffers;
        the kept noise rows are redrawn on load), and ``tag``: an HMAC-SHA256 of all of it keyed
        by a key derived from the seed (never stored), so an edited checkpoint (running sums
        zeroed, step changed) is refused by :meth:`load_state_dict`. Only one-way hashes of the
        seed are in it; with a low-entropy seed those could be brute-forced, so draw seeds with
        ``secrets.randbits(128)``. Keep the checkpoint private all the same: the carried rows are
        sums of noise.
        """
        t = self._check_state(state, allow_end=True)
        work = state._work
        if work is None or work.position != t:
            work = self._rebuild(t)
        return self.checkpoint(t, work.carry, generator=NUMPY_GENERATOR, generator_check=self._generator_check(t))

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> NoiseState:
        """The state a :meth:`state_dict` checkpoint describes, after checking it fits this stream.

        Raises MfcliError naming the mismatch: another seed, operator, kind, d, dtype or
        generator, a malformed or edited checkpoint, or a numpy whose generator draws different
        noise for (seed, j).
        """
        t, carry = self.restore(state_dict, generator=NUMPY_GENERATOR, generator_check=self._generator_check)
        work = self._new_workspace(t)
        work.carry[...] = carry
        for slot, j in self.operator.kept_rows(t):
            noise_row(self.seed, j, self.d, self.dtype, out=work.ring[slot], threads=self.threads)
        return NoiseState(t=t, stream_tag=self.tag, _work=work)

    def checkpoint(self, t: int, carry: np.ndarray, *, generator: str, generator_check: str) -> dict:
        """The checkpoint dict of a state at step ``t`` with carried rows ``carry`` (rank x d,
        host numpy), for a driver whose Z comes from ``generator``; ``generator_check`` is a hash
        of noise that generator draws (refused on load if it draws differently). The torch and
        optax adapters checkpoint through this, so every stream has one format."""
        carry = np.array(carry, dtype=self.dtype, order="C", copy=True)   # never a view of a live state
        sd: dict[str, Any] = {
            "format": STATE_FORMAT,
            "format_version": STATE_FORMAT_VERSION,
            "t": int(t),
            "n": self.n,
            "d": self.d,
            "dtype": self.dtype.name,
            "kind": self.kind,
            "variant": self.variant,
            "method": self.method,
            "fingerprint": self.fingerprint,
            "generator": generator,
            "seed_sha256": self._seed_hash(),
            "generator_check": generator_check,
            "running": carry,
        }
        sd["tag"] = self._checkpoint_tag(sd, carry)
        return sd

    def restore(self, state_dict: Mapping[str, Any], *, generator: str,
                generator_check: Callable[[int], str]) -> tuple[int, np.ndarray]:
        """(step, carried rows) of a :meth:`checkpoint` dict, after checking that it fits this
        stream and ``generator``, that its tag verifies and that ``generator_check(t)`` matches."""
        if isinstance(state_dict, Mapping):   # np.load gives 0-d arrays for the scalars
            sd = {k: (v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v) for k, v in state_dict.items()}
        else:
            sd = state_dict
        if not isinstance(sd, Mapping) or sd.get("format") != STATE_FORMAT:
            raise MfcliError("not an mfcli noise-stream checkpoint (format is not mfcli.noise_state)")
        if sd.get("format_version") != STATE_FORMAT_VERSION:
            raise MfcliError(f"noise checkpoint format_version {sd.get('format_version')!r} is not supported "
                             f"(this mfcli reads version {STATE_FORMAT_VERSION})")
        for key, mine in (
            ("kind", self.kind),
            ("variant", self.variant),
            ("n", self.n),
            ("d", self.d),
            ("dtype", self.dtype.name),
            ("method", self.method),
            ("fingerprint", self.fingerprint),
            ("generator", generator),
        ):
            theirs = sd.get(key)
            if theirs != mine:
                what = "operator (artifact)" if key == "fingerprint" else key
                raise MfcliError(f"noise checkpoint does not fit this stream: {what} is {theirs!r}, the stream has {mine!r}")
        if sd.get("seed_sha256") != self._seed_hash():
            raise MfcliError("noise checkpoint was written with a different seed than this stream's")
        t = sd.get("t")
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) <= self.n:
            raise MfcliError(f"noise checkpoint step t = {t!r} is out of range 0..{self.n}")
        t = int(t)
        running = np.asarray(sd.get("running"))
        if running.shape != (self.rank, self.d):
            raise MfcliError(
                f"noise checkpoint running sums have shape {running.shape}, expected {(self.rank, self.d)}"
            )
        if not np.all(np.isfinite(running)):
            raise MfcliError("noise checkpoint running sums contain NaN or inf")
        tag = sd.get("tag")
        if not isinstance(tag, str) or not hmac.compare_digest(tag, self._checkpoint_tag(sd, running)):
            raise MfcliError(
                "noise checkpoint failed its authentication tag: it was edited (step, running sums or "
                "identity changed) or not written by this stream; resuming from it would break the noise"
            )
        if sd.get("generator_check") != generator_check(t):
            raise MfcliError(
                f"this {generator} generator draws different noise for (seed, row) than the one that wrote "
                "the checkpoint; resuming would break the noise correlation"
            )
        return t, np.array(running, dtype=self.dtype)

    # ------------------------------------------------------------------ internals

    def _seed_hash(self) -> str:
        return hashlib.sha256(f"mfcli-noise-seed|{self.seed}|{self.fingerprint}".encode()).hexdigest()

    def _checkpoint_tag(self, sd: Mapping[str, Any], running: np.ndarray) -> str:
        """HMAC-SHA256 over the checkpoint's fields and running sums, keyed by SHA-256 of the seed
        (and the operator), so only a holder of the seed can write a checkpoint that loads."""
        key = hashlib.sha256(f"mfcli-noise-checkpoint-key|{self.seed}|{self.fingerprint}".encode()).digest()
        mac = hmac.new(key, digestmod=hashlib.sha256)
        for name in _TAGGED_FIELDS:
            v = sd.get(name)
            text = str(int(v)) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else repr(v)
            mac.update(f"{name}={text};".encode())
        arr = np.ascontiguousarray(running, dtype=self.dtype)
        mac.update(f"running={arr.shape}|{arr.dtype.name};".encode())
        mac.update(arr.tobytes())
        return mac.hexdigest()

    def _generator_check(self, t: int) -> str:
        """Hash of the first entries of the last noise row drawn before step t (Z[0] at t = 0)."""
        j = max(t - 1, 0)
        k = min(self.d, 16)
        head = np.empty(self.d, dtype=self.dtype)
        noise_row(self.seed, j, self.d, self.dtype, out=head)
        return hashlib.sha256(head[:k].tobytes()).hexdigest()

    def _check_state(self, state: Any, *, allow_end: bool = False) -> int:
        if not isinstance(state, NoiseState):
            raise MfcliError(f"expected a NoiseState, got {type(state).__name__}")
        if state.stream_tag != self.tag:
            raise MfcliError("this noise state belongs to another stream (different seed, artifact, d or dtype)")
        return check_step(state.t, self.n, allow_end=allow_end)

    def _new_workspace(self, position: int) -> _Workspace:
        return _Workspace(ring=np.zeros((self.width, self.d), dtype=self.dtype),
                          carry=np.zeros((self.rank, self.d), dtype=self.dtype), position=position)

    @property
    def _tables(self) -> dict[str, Any]:
        cached = self.__dict__.get("_tables_cache")
        if cached is None:
            cached = cast_tables(self.operator.tables(), lambda a: a, self.dtype)
            object.__setattr__(self, "_tables_cache", cached)
        return cached

    def _rebuild(self, t: int) -> _Workspace:
        """The state before step t, from the seed alone: the recursion run from step 0."""
        work = self._new_workspace(0)
        for s in range(t):
            self._advance(work, s, check=False)
        return work

    def _advance(self, work: _Workspace, t: int, *, check: bool = True) -> np.ndarray:
        """One step of the operator's recursion, block by block (each block's Z drawn from its
        own Philox counter, its state updated in place while in cache). Every coordinate sees the
        same operations in the same order whatever the thread count."""
        op, tab = self.operator, self._tables
        out = np.empty(self.d, dtype=self.dtype)
        seed, dt = self.seed, self.dtype
        bad: list[int] = []

        def block(c: int, a: int, b: int) -> None:
            here = out[a:b]

            def fill(j: int, into: np.ndarray) -> None:
                _fill_block(seed, int(j), c, into)

            def draw(j: Any) -> np.ndarray:
                # Z[t] goes straight into the returned row: a recursion that updates it in place
                # (BLT, Toeplitz, BandMF) then returns it and nothing is copied
                z = here if int(j) == t else np.empty(b - a, dtype=dt)
                _fill_block(seed, int(j), c, z)
                return z

            views = (work.ring[:, a:b], work.carry[:, a:b])
            row, new = op.step(t, draw, views, tab, NumpyOps(dt, fill))
            for old, now in zip(views, new, strict=True):
                if now is not old:
                    old[...] = now
            if row is not here:
                here[...] = row
            if check and not np.isfinite(here).all():   # in cache, block by block
                bad.append(c)

        _for_blocks(self.d, self.threads, block)
        work.position = t + 1
        if bad:
            raise MfcliError(f"noise row {t} is not finite: the operator's coefficients overflow {dt.name} "
                             "(a strategy this ill-conditioned cannot be trained with)")
        return out


def check_step(t: Any, n: int, *, allow_end: bool = False) -> int:
    """A stream position: refuses t < 0 and t >= n (t == n too unless ``allow_end``): noise past
    the end of the artifact breaks the privacy analysis."""
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise MfcliError(f"noise state step {t!r} is not a non-negative integer")
    if t >= n and not (allow_end and t == n):
        raise NoiseStreamExhaustedError(
            f"noise stream exhausted: step {t} >= n = {n}; the artifact covers steps "
            f"0..{n - 1} and running past the end would break the privacy guarantee"
        )
    return int(t)


def stream_floats(operator: StreamingMatrix, d: int) -> int:
    """Floats a stream of ``operator`` holds for d parameters: its kept noise rows, its carried
    rows and the returned row, (width + rank + 1) d (n x d and more for the dense kind)."""
    return (operator.width + operator.rank + 1) * int(d)


#: A Gaussian entry's magnitude no noise row reaches in practice (P(|z| > 12) < 4e-33 per entry):
#: the factor :func:`check_finite_rows` allows between a row of M Z and M's absolute row sum.
GAUSSIAN_BOUND = 12.0


def check_finite_rows(operator: StreamingMatrix, dtype: np.dtype, *, where: str) -> None:
    """Refuse an operator some row of which would overflow ``dtype``: |(M Z)[t]| <= sum_j |M[t, j]|
    max |Z|, so a row sum above finfo.max / :data:`GAUSSIAN_BOUND` (or one that overflows float64)
    can give inf. Names the first such step."""
    sums = operator.abs_row_sums()
    limit = float(np.finfo(dtype).max) / GAUSSIAN_BOUND
    bad = np.flatnonzero(~(sums <= limit))
    if bad.size:
        t = int(bad[0])
        raise MfcliError(
            f"{where}: the noise operator's row {t} has absolute sum {sums[t]:.3g} (> {limit:.3g} = the largest "
            f"{dtype.name} / {GAUSSIAN_BOUND:g}): its noise can overflow to inf from step {t}; this strategy is too "
            "ill-conditioned to stream"
        )


# ---------------------------------------------------------------------------------------------
# Construction from an artifact


def _fingerprint(kind: str, variant: str, op: StreamingMatrix) -> str:
    h = hashlib.sha256()
    h.update(f"mfcli-noise|{kind}|{variant}|".encode())
    for arr in op.fingerprint_arrays():
        a = np.ascontiguousarray(arr, dtype="<f8")
        h.update(f"{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _check_stream_options(
    *, kind: Any, variant: Any, d: Any, seed: Any, dtype: Any, threads: Any
) -> tuple[int, int, np.dtype, int]:
    """Validate the options of :func:`noise_stream` before any file is read."""
    if kind not in KINDS:
        raise MfcliError(f"noise kind must be 'gradient' (C^-1 Z) or 'iterate' (B Z), got {kind!r}")
    if variant not in VARIANTS:
        raise MfcliError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    dims, key, dt = check_dimension(d), check_seed(seed), check_dtype(dtype)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= int(threads) <= 256:
        raise MfcliError(f"threads must be an integer in 1..256, got {threads!r}")
    return dims, key, dt, int(threads)


class AccountedOperator(NamedTuple):
    """The operator a verified accounting record accounted: its ``operator`` label and
    ``strategy_sha256`` attributes, and the record's id (for messages)."""

    label: str
    strategy_sha256: str
    record: str = ""


def _accounted_variant(art: Any, accounted: Any, variant: str) -> str:
    """The variant (``dense``, ``compressed`` or a structured artifact's own) of the operator
    ``accounted`` names, checked against the artifact's operator of that variant (label and
    identity hash) and against an explicit ``variant``. The record itself is read and verified in
    the training layer (:func:`mfcli.training.samplers.record_noise_stream`): this module reads none."""
    if not isinstance(accounted, AccountedOperator):
        raise MfcliError(f"accounted must be an AccountedOperator (of a verified accounting record), got {accounted!r}")
    label, sha = accounted.label, accounted.strategy_sha256
    who = f"accounting record {accounted.record!r}" if accounted.record else "the accounting record"
    structured = hasattr(art, "schema_sensitivity")
    wanted = "auto" if structured else ("compressed" if label.startswith("compressed") else "dense")
    if variant != "auto" and variant != wanted and not (structured and variant == "dense"):
        raise MfcliError(f"{who} accounted the {label} operator; a {variant} noise stream "
                         f"is not what it accounted (use variant={wanted!r} or leave it auto)")
    op = select_operator(art, wanted)
    if op.label != label or op.identity_sha256 != sha:
        raise MfcliError(f"{who} accounted operator {label!r} (sha256 {str(sha)[:12]}...), which is not this "
                         f"artifact's {op.label!r} (sha256 {op.identity_sha256[:12]}...): the record is not for "
                         "this noise")
    return wanted


class StreamOptions(TypedDict, total=False):
    """The options of :func:`noise_stream` that a function building its stream through it passes on
    unchanged (:func:`mfcli.training.samplers.record_noise_stream`): typed once here, so that their
    defaults and meanings stay :func:`noise_stream`'s alone (mypy checks the two agree)."""

    dtype: Any
    variant: str
    threads: int
    max_memory: int | None


def noise_stream(
    artifact: Any,
    *,
    kind: str,
    d: int,
    seed: int,
    dtype: Any = "float32",
    variant: str = "auto",
    threads: int = 1,
    accounted: AccountedOperator | None = None,
    max_memory: int | None = DEFAULT_MAX_MEMORY,
) -> NoiseStream:
    """A noise stream for a model of ``d`` parameters from an artifact (path or loaded Artifact).

    Args:
        artifact: path to an mfcli artifact, or an :class:`mfcli.io.artifact.Artifact`.
        kind: ``gradient`` (C^-1 Z, add to the summed clipped gradient) or ``iterate`` (B Z, the
            noise on the released iterate). Required: the two are easy to confuse.
        d: number of model parameters (the length of each noise row).
        seed: secret integer in [0, 2^128); e.g. ``secrets.randbits(128)``, stored safely for
            resume.
        dtype: float32 (default) or float64.
        variant: ``auto`` (the compressed decoder if the artifact has one, else dense), ``dense``
            or ``compressed``.
        threads: threads a step uses, over blocks of 65,536 coordinates (numpy's generators and
            ufuncs release the GIL). The noise does not depend on it. With threads > 1, keep BLAS
            single-threaded (OPENBLAS_NUM_THREADS=1) to avoid oversubscription.
        accounted: the :class:`AccountedOperator` of a VERIFIED accounting record (its
            ``operator`` and ``strategy_sha256`` attributes). The stream is then
            built for that operator, whatever ``auto`` would pick; an explicit ``variant`` that
            names another operator, or an artifact whose operator has another checksum, is
            refused. To stream by record id, with the record verified first, use
            :func:`mfcli.training.samplers.record_noise_stream` (this module reads no records).
        max_memory: bytes the stream's state may take ((width + rank + 1) d floats, computed up
            front; n x d for a dense strategy that is neither banded nor compressed); default
            half the physical memory, None for no limit.

    Formal guarantees: see the module docstring. For a compressed artifact the stored
    ``sensitivity`` of C^ = B^-1 A is recomputed and must match; the stream's
    :attr:`~NoiseStream.sensitivity` is that recomputed value.

    Raises:
        MfcliError / ArtifactError: a bad option, a non-causal artifact, gradient noise for a
            non-square strategy, an inconsistent compressed group, an ``accounted`` operator
            that is not this artifact's, or an operator whose rows would overflow ``dtype``.
        MemoryLimitError: the state would exceed ``max_memory`` (the message names the estimate
            and the structured or compressed alternative).
    """
    from mfcli.io.artifact import Artifact, StructuredArtifact, load_any_artifact

    d, seed, dt, threads = _check_stream_options(kind=kind, variant=variant, d=d, seed=seed, dtype=dtype, threads=threads)
    if max_memory is not None and (isinstance(max_memory, bool) or not isinstance(max_memory, (int, np.integer))
                                   or max_memory <= 0):
        raise MfcliError(f"max_memory must be a positive number of bytes or None, got {max_memory!r}")
    art = artifact if isinstance(artifact, (Artifact, StructuredArtifact)) else load_any_artifact(Path(artifact))
    where = str(art.path)
    if accounted is not None:
        variant = _accounted_variant(art, accounted, variant)
    if not isinstance(art, StructuredArtifact) and not art.factorization.causal:
        raise MfcliError(f"{where} is not causal (an offline-only strategy): it cannot be streamed")
    # The same choice as mfcli.accounting: the operator streamed is the operator accounted.
    chosen = select_operator(art, variant)
    return _stream_of(chosen, kind=kind, d=d, seed=seed, dtype=dt, threads=threads, max_memory=max_memory,
                      where=where, workload_name=art.workload_name,
                      workload_params=dict(art.attrs.get("workload_params") or {}))


def _stream_of(chosen: Any, *, kind: str, d: int, seed: int, dtype: np.dtype, threads: int,
               max_memory: int | None, where: str, workload_name: str,
               workload_params: Mapping[str, Any]) -> NoiseStream:
    """The stream of operator ``chosen`` (a :class:`~mfcli.strategies.operators.NoiseOperator`): its
    recursion, checked against the memory budget and for rows that overflow ``dtype``."""
    matrix, inverse_bandwidth = chosen.streaming(kind, where=where)
    _check_budget(matrix, d, dtype, max_memory, where=where, kind=kind)
    check_finite_rows(matrix, dtype, where=where)
    return NoiseStream(
        kind=kind,
        variant=chosen.variant,
        n=chosen.n,
        d=d,
        dtype=dtype,
        seed=seed,
        method=matrix.method,
        operator=matrix,
        sensitivity=chosen.sensitivity,
        fingerprint=_fingerprint(kind, chosen.variant, matrix),
        source=where,
        inverse_bandwidth=inverse_bandwidth,
        workload_name=workload_name,
        workload_params=dict(workload_params),
        threads=threads,
        accounted_operator=chosen.label,
    )


def strategy_stream(
    strategy: Any,
    *,
    n: int,
    d: int,
    seed: int,
    kind: str = "gradient",
    workload: Any = None,
    dtype: Any = "float64",
    threads: int = 1,
    max_memory: int | None = DEFAULT_MAX_MEMORY,
) -> NoiseStream:
    """The noise stream of a structured strategy held in memory (a
    :class:`~mfcli.strategies.toeplitz.BandedToeplitz` or :class:`~mfcli.strategies.blt.BufferedToeplitz`), without an
    artifact: the same :class:`NoiseStream`, recursion, rows and checkpoint format as
    :func:`noise_stream` on the artifact of that strategy (bit-identical rows, tested).

    Args:
        strategy: the structured strategy C.
        n: steps covered; step n and beyond is refused.
        d, seed, dtype, threads, max_memory: as :func:`noise_stream` (dtype defaults to float64).
        kind: ``gradient`` (rows of C^-1 Z) or ``iterate`` (rows of B Z, which needs ``workload``).
        workload: the :class:`~mfcli.strategies.toeplitz.ToeplitzWorkload` A (iterate noise B = A C^-1 only;
            default prefix sums).

    Memory: the recursion's state, (width + rank + 1) d floats (a BLT: buffers + 1 rows besides
    the returned one); time O((width + rank) d) per step.

    Raises:
        MfcliError: a bad option or n; MemoryLimitError: over ``max_memory``.
    """
    from mfcli.strategies.structured import StructuredOperator, strategy_class, workload_params
    from mfcli.strategies.toeplitz import toeplitz_workload

    d, seed, dt, threads = _check_stream_options(kind=kind, variant="auto", d=d, seed=seed, dtype=dtype,
                                                 threads=threads)
    kind_name = getattr(strategy, "kind", None)
    try:
        cls = strategy_class(str(kind_name))
    except MfcliError:
        cls = None
    if cls is None or not isinstance(strategy, cls):
        raise TypeError(f"strategy must be a structured strategy (BandedToeplitz or BufferedToeplitz), "
                        f"got {type(strategy).__name__}")
    w = toeplitz_workload("prefix") if workload is None else workload
    # n is checked by the strategy's own sensitivity (each kind's limit, mfcli.util.limits)
    op = StructuredOperator(strategy, w, positive_int(n, "n"))
    where = f"the {kind_name} strategy"
    return _stream_of(op, kind=kind, d=d, seed=seed, dtype=dt, threads=threads, max_memory=max_memory,
                      where=where, workload_name=w.name, workload_params=workload_params(w))


def _check_budget(matrix: StreamingMatrix, d: int, dtype: np.dtype, max_memory: int | None, *, where: str,
                  kind: str) -> None:
    """Refuse a stream whose state ((width + rank + 1) d floats) exceeds ``max_memory``."""
    estimate = stream_floats(matrix, d) * dtype.itemsize
    forward = matrix.memory_advice(kind, d)
    check_memory(estimate, max_memory, what=f"the noise stream of {where} (its state)",
                 way_forward=forward)


__all__ = [
    "NUMPY_GENERATOR",
    "AccountedOperator",
    "NoiseState",
    "NoiseStream",
    "NumpyOps",
    "StaleNoiseStateWarning",
    "StreamOptions",
    "check_finite_rows",
    "check_seed",
    "check_step",
    "noise_matrix",
    "noise_row",
    "noise_stream",
    "strategy_stream",
    "stream_floats",
]
