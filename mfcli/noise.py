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
normals whose row j is regenerated on demand from ``(seed, j)`` with numpy's counter-based Philox
generator (key = seed; entries in blocks of 65,536, block c from counter (0, c, j, 0)), so no
noise history is stored and a row can be drawn block-parallel (``threads``) with the same result.

How a step is computed (the *method* of a stream):

* ``banded-low-rank``: the operator M has rows ``M[t, t-i] = band[t, i]`` for i < W and
  ``M[t, j] = U[t] . V[j]`` for j <= t - W. Then
  ``(M Z)[t] = sum_{i<W} band[t, i] Z[t-i] + U[t] . S_{t-W}``, ``S_m = sum_{j<=m} V[j]^T Z[j]``
  (an R x d running sum). Each step draws one new noise row and touches W + R rows of d floats:
  O((W + R) d) time and (W + R + 1) d floats of memory (W recent noise rows, R running sums and
  the returned row, which doubles as scratch). Compressed artifacts stream this way: iterate
  noise has W = K; gradient noise has W = K + p when A^-1 is banded with p sub-diagonals (p = 1
  for prefix sums, p = 2 for heavy-ball momentum, with any learning-rate schedule), since then
  ``C^^-1 = band_p(A^-1) B^`` is again banded (K + p) plus masked rank R with U' = band_p(A^-1) U.
* ``recursion``: a structured (Toeplitz) artifact, whose operator is the rational filter
  num(z) / den(z) (:class:`mfcli.structured.RationalToeplitz`):
  ``den_0 x_t = sum_{k<=W} num_k Z[t-k] - sum_{1<=k<=R} den_k x_{t-k}``. W recent noise rows
  (regenerated on resume) and R recent outputs (kept in checkpoints in place of running sums):
  O((W + R) d) time and (W + R + 1) d floats, whatever n. A BLT runs in its buffer form
  (:class:`mfcli.structured.BltRecursion`: W = 0, R = buffers (+ 2 for momentum iterate
  noise, + 1 for prefix)), which keeps each decay exact where the polynomial form would not.
* ``regenerate``: any other causal operator (a dense optimal C^-1, a tree decoder, a compressed
  gradient stream whose A^-1 is not banded): ``(M Z)[t] = sum_j M[t, j] Z[j]`` over the non-zero
  entries of row t, regenerating each Z[j]. Memory 2 d floats, time O(nnz(M[t]) d) per step, i.e.
  O(t d) for a dense lower-triangular operator: at d = 10^6 that is seconds per step late in a
  run (see docs/noise-streams.md for measurements); compress the artifact to stream fast.

The state is an immutable :class:`NoiseState`; :meth:`NoiseStream.next` is pure in effect: calling
it twice on the same state returns the same noise. To keep memory at (W + R + 1) d the latest state
lends its working buffers to the next one; using an older state again is still correct (its
buffers are rebuilt from (seed, t) in O(t d), with a :class:`StaleNoiseStateWarning`) but slow.
:meth:`NoiseStream.state_dict` / :meth:`NoiseStream.load_state_dict` checkpoint and resume a stream
exactly without that rebuild: the running sums are updated element-wise (no BLAS, no fused
multiply-add) and are bit-reproducible, and each returned row is one matrix-vector product over
them, identical under the same BLAS thread setting.

Formal guarantees: the noise a stream returns at step t equals row t of ``M Z`` with M the
operator named by ``kind`` (C^-1 or B, or their compressed versions), computed in the stream's
dtype; a banded-low-rank representation is used only after it reproduces M (computed
independently by a dense triangular solve) to a relative max-entry error of 1e-10. Step t >= n
is refused: reusing or inventing noise rows past the end breaks the privacy analysis. The
privacy of training with a stream is set by :attr:`NoiseStream.sensitivity` (sens(C), or sens(C^)
recomputed for a compressed artifact) and the noise multiplier, not by the stream itself. The
seed is a secret: anyone who knows it can regenerate Z and remove the noise; so can anyone who
reads a checkpoint of the running sums together with the seed.
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
from typing import Any

import numpy as np

from mfcli.errors import MfcliError, NoiseStreamExhaustedError
from mfcli.operators import (
    CHOICES,
    KINDS,
    BandedLowRank,
    DenseLowerTriangular,
    StreamingMatrix,
    select_operator,
)

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
#: Version 2 added the authentication tag; version 1 checkpoints (no tag) are refused.
STATE_FORMAT_VERSION = 2
#: Checkpoint fields covered by the authentication tag (everything but the tag itself).
_TAGGED_FIELDS = (
    "format", "format_version", "t", "n", "d", "dtype", "kind", "variant", "method", "fingerprint",
    "seed_sha256", "generator_check",
)

OPERATOR_NAMES = {
    ("gradient", "dense"): "C^-1 (gradient noise: add row t to the summed clipped gradient of step t)",
    ("gradient", "compressed"): "C^^-1 = A^-1 B^ (gradient noise of the compressed mechanism)",
    ("iterate", "dense"): "B (iterate noise: row t is the noise on the released output of step t)",
    ("iterate", "compressed"): "B^ (iterate noise of the compressed mechanism)",
    ("gradient", "structured"): "C^-1 of a structured (Toeplitz) strategy, by recursion (gradient noise)",
    ("iterate", "structured"): "B = A C^-1 of a structured (Toeplitz) strategy, by recursion (iterate noise)",
}
#: Methods that keep a workspace (W recent noise rows, R running sums or recent outputs).
_BUFFERED = ("banded-low-rank", "recursion")


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
    """The number of model parameters d: a positive integer."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or int(d) < 1:
        raise MfcliError(f"d (the number of model parameters) must be a positive integer, got {d!r}")
    return int(d)


def _fill_block(seed: int, j: int, block: int, out: np.ndarray) -> None:
    """Block ``block`` of Z[j] (entries block * BLOCK ..): Philox key seed, counter (0, block, j, 0).

    Equivalent to ``Generator(Philox(key=seed, counter=[0, block, j, 0])).standard_normal(...)``;
    a per-thread generator is reset to that fresh state instead of being constructed (30x faster,
    which matters when a dense row regenerates thousands of small rows).
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


@dataclass(eq=False)
class _Workspace:
    """Working buffers of a banded-low-rank stream, valid for the state at step ``position``.

    Rows 0..W-1 of ``buf`` hold Z[j] in slot j mod W for j in [position - W, position); rows
    W..W+R-1 hold S_{position-W-1}. Private: lent from state to state.
    """

    buf: np.ndarray
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
        variant: ``dense`` (the artifact's B, C) or ``compressed`` (its B^, C^).
        n: steps covered; step t >= n is refused.
        d: model dimension.
        dtype: float32 or float64.
        method: ``banded-low-rank``, ``recursion`` or ``regenerate`` (module docstring).
        operator: the matrix applied to Z (:class:`~mfcli.operators.BandedLowRank`, streamed
            with running sums, or :class:`~mfcli.operators.DenseLowerTriangular`, regenerated).
        sensitivity: sens(C) (dense) or sens(C^) (compressed), single participation, in units of
            the clip norm: what the privacy accounting of training with this stream must use.
        fingerprint: SHA-256 of kind, variant and the operator's float64 bytes.
        source: the artifact path.
        inverse_bandwidth: p, sub-diagonals of A^-1 (compressed gradient streams only).
        workload_name, workload_params: what the artifact says A is (for adapters' checks).
        threads: worker threads a step uses over blocks of 65,536 coordinates (results do not
            depend on it).
        accounted_operator: the label of the mechanism whose strategy accounting uses
            (``"dense"`` or ``"compressed (band K, rank R)"``, as ``mfcli account`` prints it).
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
        """W: noise rows in the band (0 for a regenerating stream)."""
        return self.operator.width

    @property
    def rank(self) -> int:
        """R: running sums kept (0 for a regenerating stream)."""
        return self.operator.rank

    @property
    def tag(self) -> str:
        """Identity of the noise sequence: operator fingerprint, seed, d and dtype (hashed)."""
        h = hashlib.sha256()
        h.update(f"{self.fingerprint}|{self.seed}|{self.d}|{self.dtype.name}".encode())
        return h.hexdigest()

    def memory_floats(self) -> int:
        """Floats a step holds, the returned row included: (W + R + 1) d for a banded stream,
        2 d for a regenerating one (a previous row the caller still holds is not counted)."""
        if self.method in _BUFFERED:
            return (self.width + self.rank + 1) * self.d
        return 2 * self.d

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
        return NoiseState(t=0, stream_tag=self.tag, _work=self._fresh_workspace(0))

    def next(self, state: NoiseState) -> tuple[np.ndarray, NoiseState]:
        """Row ``state.t`` of the stream's noise and the state for the following step.

        Returns a new (d,) array the caller owns. Raises MfcliError at t >= n or for a state of
        another stream.
        """
        t = self._check_state(state)
        if self.method == "regenerate":
            return self._regenerate_row(t), NoiseState(t=t + 1, stream_tag=state.stream_tag)
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
        """The state before step ``t``, rebuilt from the seed (O(t d) for a banded stream)."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) <= self.n:
            raise MfcliError(f"step must be an integer in [0, {self.n}], got {t!r}")
        t = int(t)
        work = self._rebuild(t) if self.method in _BUFFERED else None
        return NoiseState(t=t, stream_tag=self.tag, _work=work)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self, state: NoiseState) -> dict:
        """A checkpoint of ``state``: plain Python values and numpy arrays (np.savez, pickle).

        Holds the step, the stream's identity (operator fingerprint, a hash of the seed, d, dtype,
        kind), for a banded stream the R x d running sums (the recent noise rows are regenerated
        on load), and ``tag``: an HMAC-SHA256 of all of it keyed by a key derived from the seed
        (SHA-256 of the seed, never stored), so an edited checkpoint (running sums zeroed, step
        changed) is refused by :meth:`load_state_dict`. The seed itself is not in it, only one-way
        hashes; with a low-entropy seed those could be brute-forced, so draw seeds with
        ``secrets.randbits(128)``. Keep the checkpoint private all the same: the running sums are
        sums of noise.
        """
        t = self._check_state(state, allow_end=True)
        running = np.zeros((self.rank, self.d), dtype=self.dtype)
        if self.method in _BUFFERED and self.rank:
            work = state._work
            if work is None or work.position != t:
                work = self._rebuild(t)
            running = work.buf[self.width:].copy()
        sd: dict[str, Any] = {
            "format": STATE_FORMAT,
            "format_version": STATE_FORMAT_VERSION,
            "t": t,
            "n": self.n,
            "d": self.d,
            "dtype": self.dtype.name,
            "kind": self.kind,
            "variant": self.variant,
            "method": self.method,
            "fingerprint": self.fingerprint,
            "seed_sha256": self._seed_hash(),
            "generator_check": self._generator_check(t),
            "running": running,
        }
        sd["tag"] = self._checkpoint_tag(sd, running)
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> NoiseState:
        """The state a :meth:`state_dict` checkpoint describes, after checking it fits this stream.

        Raises MfcliError naming the mismatch: another seed, operator, kind, d or dtype, a
        malformed checkpoint, or a numpy whose generator draws different noise for (seed, j).
        """
        if isinstance(state_dict, Mapping):   # np.load gives 0-d arrays for the scalars
            sd = {k: (v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v) for k, v in state_dict.items()}
        else:
            sd = state_dict
        if not isinstance(sd, Mapping) or sd.get("format") != STATE_FORMAT:
            raise MfcliError("not an mfcli noise-stream checkpoint (format is not mfcli.noise_state)")
        if sd.get("format_version") != STATE_FORMAT_VERSION:
            raise MfcliError(f"noise checkpoint format_version {sd.get('format_version')!r} is not supported")
        for key, mine in (
            ("kind", self.kind),
            ("variant", self.variant),
            ("n", self.n),
            ("d", self.d),
            ("dtype", self.dtype.name),
            ("method", self.method),
            ("fingerprint", self.fingerprint),
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
        if sd.get("generator_check") != self._generator_check(t):
            raise MfcliError(
                "this numpy draws different noise for (seed, row) than the one that wrote the "
                "checkpoint; resuming would break the noise correlation"
            )
        if self.method == "regenerate":
            return NoiseState(t=t, stream_tag=self.tag)
        work = self._new_workspace(t)
        work.buf[self.width:] = running
        for j in range(max(0, t - self.width), t):
            noise_row(self.seed, j, self.d, self.dtype, out=work.buf[j % self.width], threads=self.threads)
        return NoiseState(t=t, stream_tag=self.tag, _work=work)

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
        t = state.t
        if t < 0:
            raise MfcliError(f"noise state step {t} is negative")
        if t >= self.n and not (allow_end and t == self.n):
            raise NoiseStreamExhaustedError(
                f"noise stream exhausted: step {t} >= n = {self.n}; the artifact covers steps "
                f"0..{self.n - 1} and running past the end would break the privacy guarantee"
            )
        return int(t)

    def _fresh_workspace(self, position: int) -> _Workspace | None:
        if self.method not in _BUFFERED:
            return None
        return self._new_workspace(position)

    def _new_workspace(self, position: int) -> _Workspace:
        buf = np.zeros((self.width + self.rank, self.d), dtype=self.dtype)
        return _Workspace(buf=buf, position=position)

    def _accumulate(self, work: _Workspace, m: int, z_m: np.ndarray, scratch: np.ndarray, a: int, b: int) -> None:
        """S_m = S_{m-1} + V[m]^T Z[m] on coordinates a..b-1, in place (``scratch``: free d floats).

        Element-wise multiply then add (no BLAS, no fused multiply-add), block by block: the
        running sums are bit-reproducible whatever the threads, BLAS or buffer alignment, which
        makes a resumed stream identical.
        """
        w = self.width
        coeffs = self._v_cast[m]
        sc = scratch[a:b]
        z = z_m[a:b]
        for r in range(self.rank):
            s = work.buf[w + r, a:b]
            np.multiply(z, coeffs[r], out=sc)
            np.add(s, sc, out=s)

    def _rebuild(self, t: int) -> _Workspace:
        """Buffers for the state before step t, from the seed alone."""
        work = self._new_workspace(t)
        if self.method == "recursion":  # the recursion itself, from step 0: O(t (W + R) d)
            work.position = 0
            for s in range(t):
                self._advance(work, s)
            return work
        w = self.width
        if self.rank and t > w:
            row = np.empty(self.d, dtype=self.dtype)
            scratch = np.empty(self.d, dtype=self.dtype)
            for m in range(0, t - w):

                def block(c: int, a: int, b: int, m: int = m) -> None:
                    _fill_block(self.seed, m, c, row[a:b])
                    self._accumulate(work, m, row, scratch, a, b)

                _for_blocks(self.d, self.threads, block)
        for j in range(max(0, t - w), t):
            noise_row(self.seed, j, self.d, self.dtype, out=work.buf[j % w], threads=self.threads)
        return work

    def _advance(self, work: _Workspace, t: int) -> np.ndarray:
        """One step, block by block: S_{t-W} += V[t-W]^T Z[t-W] (Z[t-W] sits in slot t mod W),
        draw Z[t] into that slot, then the returned row = coefficients . buffer rows."""
        if self.method == "recursion":
            return self._advance_recursion(work, t)
        w = self.width
        m = t - w
        slot = t % w
        assert isinstance(self.operator, BandedLowRank)
        coef = self.operator.slot_coefficients(t).astype(self.dtype)
        out = np.empty(self.d, dtype=self.dtype)      # the returned row; scratch until its block is set
        buf = work.buf

        def block(c: int, a: int, b: int) -> None:
            if m >= 0 and self.rank:
                self._accumulate(work, m, buf[slot], out, a, b)
            _fill_block(self.seed, t, c, buf[slot, a:b])
            np.matmul(coef, buf[:, a:b], out=out[a:b])

        _for_blocks(self.d, self.threads, block)
        work.position = t + 1
        return out

    def _advance_recursion(self, work: _Workspace, t: int) -> np.ndarray:
        """One step of den_0 x_t = sum_{k<=W} num_k z_{t-k} - sum_{1<=k<=R} den_k x_{t-k}: buffer
        slots 0..W-1 hold z_{t-W}..z_{t-1} (slot j mod W), slots W..W+R-1 hold x_{t-R}..x_{t-1}
        (slot W + j mod R). Element-wise, in a fixed order, so a rebuilt or resumed state gives
        the same bits."""
        op = self.operator
        if hasattr(op, "omega"):  # mfcli.structured.BltRecursion: the buffer form
            return self._advance_blt(work, t)
        w, r = self.width, self.rank
        num = [self.dtype.type(x) for x in op.numerator]  # type: ignore[attr-defined]
        den = [self.dtype.type(x) for x in op.denominator]  # type: ignore[attr-defined]
        out = np.empty(self.d, dtype=self.dtype)
        z = np.empty(self.d, dtype=self.dtype)
        sc_all = np.empty(self.d, dtype=self.dtype)
        buf = work.buf

        def block(c: int, a: int, b: int) -> None:
            o, zt, sc = out[a:b], z[a:b], sc_all[a:b]
            _fill_block(self.seed, t, c, zt)
            np.multiply(zt, num[0], out=o)
            for k in range(1, min(w, t) + 1):
                np.multiply(buf[(t - k) % w, a:b], num[k], out=sc)
                np.add(o, sc, out=o)
            for k in range(1, min(r, t) + 1):
                np.multiply(buf[w + (t - k) % r, a:b], den[k], out=sc)
                np.subtract(o, sc, out=o)
            if den[0] != 1:
                np.divide(o, den[0], out=o)
            if w:
                buf[t % w, a:b] = zt
            if r:
                buf[w + t % r, a:b] = o

        _for_blocks(self.d, self.threads, block)
        work.position = t + 1
        return out

    def _advance_blt(self, work: _Workspace, t: int) -> np.ndarray:
        """One step of a BLT stream (:class:`mfcli.structured.BltRecursion`): x_t = z_t - sum_i
        omega_i s_i, s_i <- theta_i s_i + x_t (rows 0..K-1 of the buffer), then for iterate
        noise y_t = x_t - sum_{k>=1} post_k y_{t-k} (rows K.. hold y_{t-P}..y_{t-1}, slot
        K + j mod P). Element-wise in a fixed order: resumed and rebuilt states give the same bits."""
        op = self.operator
        theta = [self.dtype.type(x) for x in op.theta]  # type: ignore[attr-defined]
        omega = [self.dtype.type(x) for x in op.omega]  # type: ignore[attr-defined]
        post = [self.dtype.type(x) for x in op.post_den]  # type: ignore[attr-defined]
        nb, p = len(theta), len(post) - 1
        out = np.empty(self.d, dtype=self.dtype)
        sc_all = np.empty(self.d, dtype=self.dtype)
        buf = work.buf

        from mfcli.blt import buffer_step

        def block(c: int, a: int, b: int) -> None:
            o, sc = out[a:b], sc_all[a:b]
            _fill_block(self.seed, t, c, o)
            buffer_step(theta, omega, buf[:nb, a:b], o, sc)
            if p:
                for k in range(1, min(p, t) + 1):
                    np.multiply(buf[nb + (t - k) % p, a:b], post[k], out=sc)
                    np.subtract(o, sc, out=o)
                buf[nb + t % p, a:b] = o

        _for_blocks(self.d, self.threads, block)
        work.position = t + 1
        return out

    def _regenerate_row(self, t: int) -> np.ndarray:
        assert isinstance(self.operator, DenseLowerTriangular)
        row = self.operator.row(t)
        support = [(int(j), self.dtype.type(row[j])) for j in np.flatnonzero(row)]
        out = np.zeros(self.d, dtype=self.dtype)
        scratch = np.empty(self.d, dtype=self.dtype)

        def block(c: int, a: int, b: int) -> None:
            o, sc = out[a:b], scratch[a:b]
            for j, coeff in support:
                _fill_block(self.seed, j, c, sc)
                np.multiply(sc, coeff, out=sc)
                np.add(o, sc, out=o)

        _for_blocks(self.d, self.threads, block)
        return out

    @property
    def _v_cast(self) -> np.ndarray:
        cached = self.__dict__.get("_v_cast_cache")
        if cached is None:
            assert isinstance(self.operator, BandedLowRank)
            cached = np.ascontiguousarray(self.operator.v, dtype=self.dtype)
            object.__setattr__(self, "_v_cast_cache", cached)
        return cached


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


def _record_variant(art: Any, record: Any, variant: str) -> str:
    """The variant (``dense``, ``compressed`` or a structured artifact's own) of the operator that
    accounting record ``record`` of ``art`` accounted, checked against its stored identity hash
    and against an explicit ``variant``."""
    from mfcli.operators import select_operator
    from mfcli.samplers import accounting_records

    if not isinstance(record, str):
        raise MfcliError(f"record must be an accounting record id (a string), got {record!r}")
    records = accounting_records(art.path)
    if record not in records:
        have = ", ".join(records) or "none"
        raise MfcliError(f"{art.path} has no accounting record {record!r} (it has: {have})")
    attrs = records[record]
    label = str(attrs.get("operator") or "dense")   # records without the attribute accounted the dense C
    structured = hasattr(art, "schema_sensitivity")
    wanted = "auto" if structured else ("compressed" if label.startswith("compressed") else "dense")
    if variant != "auto" and variant != wanted and not (structured and variant == "dense"):
        raise MfcliError(f"accounting record {record!r} accounted the {label} operator; a {variant} noise stream "
                         f"is not what it accounted (use variant={wanted!r} or leave it auto)")
    op = select_operator(art, wanted)
    if op.label != label or op.identity_sha256 != attrs.get("strategy_sha256"):
        raise MfcliError(f"accounting record {record!r} accounted operator {label!r} (sha256 "
                         f"{str(attrs.get('strategy_sha256'))[:12]}...), which is not this artifact's {op.label!r} "
                         f"(sha256 {op.identity_sha256[:12]}...): the record is not for this noise")
    return wanted


def noise_stream(
    artifact: Any,
    *,
    kind: str,
    d: int,
    seed: int,
    dtype: Any = "float32",
    variant: str = "auto",
    threads: int = 1,
    record: str | None = None,
) -> NoiseStream:
    """A noise stream for a model of ``d`` parameters from an artifact (path or loaded Artifact).

    Args:
        artifact: path to an mfcli artifact, or an :class:`mfcli.artifact.Artifact`.
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
        record: the id of the artifact's accounting record whose ``sigma`` you train with
            (``mfcli inspect`` lists them; :func:`mfcli.samplers.sampler_record` picks one). The
            stream is then built for the operator that record accounted (its ``operator`` and
            ``strategy_sha256``), whatever ``auto`` would pick: a record's sigma is calibrated for
            one operator, and noise of another (a compressed C^ where the dense C was accounted,
            or the other way round) is not what was accounted. An explicit ``variant`` that names
            another operator is refused.

    Formal guarantees: see the module docstring. For a compressed artifact the stored
    ``sensitivity`` of C^ = B^-1 A is recomputed and must match; the stream's
    :attr:`~NoiseStream.sensitivity` is that recomputed value.

    Raises:
        MfcliError / ArtifactError: a bad option, a non-causal artifact, gradient noise for a
            non-square strategy, an inconsistent compressed group, or a ``record`` that is missing
            or accounted another operator than ``variant`` or than this artifact has.
    """
    from mfcli.artifact import Artifact
    from mfcli.structured import BltRecursion, RationalToeplitz, StructuredArtifact, load_any_artifact

    d, seed, dt, threads = _check_stream_options(kind=kind, variant=variant, d=d, seed=seed, dtype=dtype, threads=threads)
    art = artifact if isinstance(artifact, (Artifact, StructuredArtifact)) else load_any_artifact(Path(artifact))
    where = str(art.path)
    if record is not None:
        variant = _record_variant(art, record, variant)
    if isinstance(art, StructuredArtifact):
        if variant == "compressed":
            raise MfcliError(f"{where} has no compressed decoder (it is a structured {art.kind} strategy)")
        op = art.operator()
        rec, _ = op.streaming(kind, where=where)
        assert isinstance(rec, (RationalToeplitz, BltRecursion))
        return NoiseStream(
            kind=kind, variant=op.variant, n=art.n, d=d, dtype=dt, seed=seed, method="recursion",
            operator=rec, sensitivity=op.sensitivity, fingerprint=_fingerprint(kind, op.variant, rec), source=where,
            workload_name=art.workload_name, workload_params=dict(art.attrs.get("workload_params") or {}),
            threads=threads, accounted_operator=op.label,
        )
    fact = art.factorization
    if not fact.causal:
        raise MfcliError(f"{where} is not causal (an offline-only strategy): it cannot be streamed")
    # The same choice as mfcli.accounting: the operator streamed is the operator accounted.
    chosen = select_operator(art, variant)
    matrix, inverse_bandwidth = chosen.streaming(kind, where=where)
    method = "banded-low-rank" if isinstance(matrix, BandedLowRank) else "regenerate"
    return NoiseStream(
        kind=kind,
        variant=chosen.variant,
        n=fact.n,
        d=d,
        dtype=dt,
        seed=seed,
        method=method,
        operator=matrix,
        sensitivity=chosen.sensitivity,
        fingerprint=_fingerprint(kind, chosen.variant, matrix),
        source=where,
        inverse_bandwidth=inverse_bandwidth,
        workload_name=art.workload_name,
        workload_params=dict(art.attrs.get("workload_params") or {}),
        threads=threads,
        accounted_operator=chosen.label,
    )


__all__ = [
    "NoiseState",
    "NoiseStream",
    "StaleNoiseStateWarning",
    "check_seed",
    "noise_matrix",
    "noise_row",
    "noise_stream",
]
