"""optax adapter: correlated gradient noise from an mfcli artifact as a GradientTransformation.

Example::

    import jax, optax
    from mfcli.io.artifact import shipped_artifact
    from mfcli.training.noise import noise_stream
    from mfcli.adapters.optax import checked, correlated_noise

    d = sum(x.size for x in jax.tree_util.tree_leaves(params))
    stream = noise_stream(shipped_artifact("momentum-n256"), kind="gradient", d=d, seed=SECRET_SEED)
    tx = optax.chain(
        correlated_noise(stream, noise_std=1.0, clip_norm=1.0),   # + noise_std clip (C^-1 Z)[t]
        optax.sgd(learning_rate=0.1, momentum=0.9),                      # runs the workload A
    )
    opt_state = tx.init(params)
    updates, opt_state = checked(jax.jit(tx.update))(summed_clipped_grads, opt_state)

The incoming updates must be the SUM of per-example clipped gradients (pass ``batch_size`` if they
are the mean over a fixed batch). The noise is the artifact's **gradient** noise, row t of C^-1 Z
(C^^-1 Z compressed), never the iterate noise B Z.

How it runs: entirely inside ``jit``, with no host callback and no replay. The stream's recursion
(the same :meth:`~mfcli.strategies.operators.StreamingMatrix.step` the numpy stream runs: banded-low-rank,
banded inverse, Toeplitz recursion, BLT buffers, or the kept rows of Z for a dense C^-1) is traced
with jax arrays, its state (``ring``: kept rows of Z; ``running``: carried rows) is part of the
optax state, and Z[t] is ``jax.random.normal(jax.random.fold_in(key, t), (d,))`` with ``key``
derived from the seed (:func:`jax_key`): the noise is a function of (seed, t) only, the same
across processes and restarts on the same platform, but not the numpy stream's numbers
(docs/noise-streams.md, "Reproducibility"). Checkpoint the optax state as usual and the stream
resumes exactly; for an authenticated checkpoint (refused on load if edited) save
``state_dict(stream, noise_state)`` and restore with ``load_state_dict(stream, checkpoint)``, the
format of every mfcli noise stream. Donate the optimizer state to ``jit`` (``donate_argnums``) to
update the buffers in place.

Step t >= n raises :class:`~mfcli.errors.NoiseStreamExhaustedError` when ``update`` runs eagerly.
Under ``jit`` nothing can raise without a host round trip, so the step's noise is NaN (the
parameters become NaN, never trained with invented noise) and the state records why; wrap the
jitted step in :func:`checked` to get the mfcli error instead::

    train_step = checked(jax.jit(train_step))   # raises NoiseStreamExhaustedError at step n

The same holds for a state of another stream (another seed, artifact, d or dtype): ``MfcliError``.

Formal guarantees: as for :mod:`mfcli.adapters.torch`: the mechanism is C G + Z, with
sensitivity ``stream.sensitivity`` x clip and noise noise_std x clip (noise_std: the std of the noise on C G per unit clip norm;
the noise multiplier noise_std / sensitivity is accepted with a record only, :func:`correlated_noise`).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from mfcli.adapters import check_gradient_stream, check_noise_options
from mfcli.errors import MfcliError, NoiseStreamExhaustedError
from mfcli.training.noise import NoiseStream, cast_tables
from mfcli.training.record import resolve_noise_std

#: The ``generator`` field of checkpoints written here: Z[j] from jax's threefry PRNG.
JAX_GENERATOR = "jax-threefry2x32"

#: ``status`` values of the state: what :func:`checked` reports.
OK, EXHAUSTED, FOREIGN = 0, 1, 2


class CorrelatedNoiseState(NamedTuple):
    """optax state: the next step, the recursion's state (``ring``: kept rows of Z; ``running``:
    carried rows), the stream tag, n and a status (0 ok, 1 a step at t >= n ran, 2 the state
    was fed to another stream's transformation)."""

    step: jnp.ndarray
    ring: jnp.ndarray
    running: jnp.ndarray
    tag: jnp.ndarray
    end: jnp.ndarray
    status: jnp.ndarray


def _tag_words(stream: NoiseStream) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(stream.tag[:16]), dtype=">u4").astype(np.uint32)


def jax_key(seed: int) -> jnp.ndarray:
    """The jax PRNG key of a noise seed: a raw threefry key whose two uint32 words are the first 8
    bytes (big-endian) of SHA-256 of ``b"mfcli-jax-noise|" + str(seed)``. Z[j] of the jax stream is
    ``jax.random.normal(jax.random.fold_in(jax_key(seed), j), (d,), dtype)``."""
    digest = hashlib.sha256(f"mfcli-jax-noise|{int(seed)}".encode()).digest()
    return jnp.asarray(np.frombuffer(digest[:8], dtype=">u4").astype(np.uint32))


class JaxOps:
    """:class:`mfcli.strategies.operators.ArrayOps` on jax arrays: functional updates, loops as
    ``lax.fori_loop`` (their bounds may be traced), matrix products at full precision."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype

    def zeros(self, rows: int, d: int) -> jnp.ndarray:
        return jnp.zeros((rows, d), dtype=self.dtype)

    def set_row(self, a: jnp.ndarray, i: Any, value: jnp.ndarray) -> jnp.ndarray:
        return a.at[i].set(value)

    def set_rows(self, a: jnp.ndarray, start: int, values: jnp.ndarray) -> jnp.ndarray:
        return a.at[start:start + values.shape[0]].set(values)

    def matvec(self, coef: jnp.ndarray, rows: jnp.ndarray) -> jnp.ndarray:
        return jnp.matmul(coef, rows, precision=jax.lax.Precision.HIGHEST)

    def addmv(self, x: jnp.ndarray, coef: jnp.ndarray, rows: jnp.ndarray, alpha: float) -> jnp.ndarray:
        prod = self.matvec(coef, rows)
        return x - prod if alpha == -1.0 else x + (prod if alpha == 1.0 else alpha * prod)

    def add_outer(self, a: jnp.ndarray, coef: jnp.ndarray, row: jnp.ndarray) -> jnp.ndarray:
        return a + coef[:, None] * row[None, :]

    def scale_add(self, a: jnp.ndarray, scale: jnp.ndarray, row: jnp.ndarray) -> jnp.ndarray:
        return scale[:, None] * a + row[None, :]

    #: Rows per iteration of :meth:`prefix_matvec`: the accumulator is read and written once per
    #: UNROLL rows, and each iteration of the loop has a fixed cost that matters at small d (32:
    #: 64 rows of 10^6 in 17.2 ms, as one jnp.matmul, against 22.1 ms for 4; 400 rows of 50,890 in
    #: 6.3 ms against 9.0; measured, docs/performance.md).
    UNROLL = 32

    def prefix_matvec(self, coef: jnp.ndarray, rows: jnp.ndarray, k: Any) -> jnp.ndarray:
        d = rows.shape[1]
        u = self.UNROLL

        def body(i: Any, acc: jnp.ndarray) -> jnp.ndarray:
            for q in range(u):
                j = i * u + q
                # past k: row k - 1 again (already in cache) times a zero coefficient, so the
                # last iteration reads no row beyond the k the step needs
                jj = jnp.minimum(j, k - 1)
                acc = acc + jnp.where(j < k, coef[jj], 0) * rows[jj]
            return acc

        return jax.lax.fori_loop(0, (k + u - 1) // u, body, jnp.zeros(d, self.dtype))

    def fill_rows(self, a: jnp.ndarray, lo: Any, hi: Any, draw: Callable[[Any], Any]) -> jnp.ndarray:
        return jax.lax.fori_loop(lo, hi, lambda j, acc: acc.at[j].set(draw(j)), a)


class JaxStream:
    """The jax driver of a :class:`~mfcli.training.noise.NoiseStream`: its recursion's tables as jax
    arrays, ``draw(j)`` from :func:`jax_key`, and ``step(t, ring, running)`` (jit-traceable)."""

    def __init__(self, stream: NoiseStream) -> None:
        dt = stream.dtype
        if dt == np.float64 and jax.dtypes.canonicalize_dtype(np.float64) != np.float64:  # x64 disabled
            raise MfcliError("a float64 noise stream needs jax_enable_x64; use dtype='float32' or enable x64")
        self.stream, self.dtype = stream, dt
        self.ops = JaxOps(dt)
        self.tables = cast_tables(stream.operator.tables(), jnp.asarray, dt, index=lambda a: jnp.asarray(a, jnp.int32))
        self.key = jax_key(stream.seed)

    def draw(self, j: Any) -> jnp.ndarray:
        return jax.random.normal(jax.random.fold_in(self.key, j), (self.stream.d,), dtype=self.dtype)

    def init(self) -> tuple[jnp.ndarray, jnp.ndarray]:
        return self.ops.zeros(self.stream.width, self.stream.d), self.ops.zeros(self.stream.rank, self.stream.d)

    def step(self, t: Any, ring: jnp.ndarray, running: jnp.ndarray) -> tuple[jnp.ndarray, tuple[Any, Any]]:
        return self.stream.operator.step(t, self.draw, (ring, running), self.tables, self.ops)

    def generator_check(self, t: int) -> str:
        """Hash of 16 normals the jax generator draws for row max(t - 1, 0)'s key."""
        head = jax.random.normal(jax.random.fold_in(self.key, max(t - 1, 0)), (16,), dtype=self.dtype)
        return hashlib.sha256(np.asarray(head).tobytes()).hexdigest()


def correlated_noise(
    stream: NoiseStream,
    *,
    noise_std: float | None = None,
    noise_multiplier: float | None = None,
    record: Any = None,
    clip_norm: float,
    batch_size: int | None = None,
    postprocess: Callable[[jnp.ndarray], jnp.ndarray] | None = None,
) -> optax.GradientTransformation:
    """A GradientTransformation adding ``noise_std * clip * (C^-1 Z)[t]`` to the updates of step t.

    Args:
        stream: a :class:`mfcli.training.noise.NoiseStream` of kind ``gradient`` whose ``d`` equals the
            number of parameters (all leaves of the params pytree, in ``ravel_pytree`` order).
        noise_std: the std of the noise on C G per unit clip norm (0.2's ``noise_multiplier``).
        noise_multiplier: noise_std / sensitivity (as Opacus and jax_privacy count it); only with
            ``record`` (whose accounted sensitivity it divides by), refused without one.
        record: a verified :class:`mfcli.training.record.TrainingRecord` whose operator ``stream``
            streams (:func:`mfcli.training.record.record_stream`): the noise std is the record's;
            ``noise_std``/``noise_multiplier`` may be omitted and, if given, must be the record's.
        clip_norm: the per-example clip norm.
        batch_size: None if updates are summed clipped gradients; B if averaged over B.
        postprocess: optional ``f(flat) -> flat`` on the flattened noisy gradient (length d)
            before it leaves this transformation, e.g. Laplacian smoothing.
    """
    check_gradient_stream(stream, "correlated_noise")
    std = resolve_noise_std(noise_std=noise_std, noise_multiplier=noise_multiplier, record=record)
    assert std is not None
    check_noise_options(noise_std=std, clip_norm=clip_norm, batch_size=batch_size, postprocess=postprocess)
    if record is not None and stream.n != record.n:
        raise MfcliError(f"the noise stream has n = {stream.n} steps but the record accounts {record.n}")
    driver = JaxStream(stream)
    scale = std * float(clip_norm) / (batch_size or 1)
    n, d = stream.n, stream.d
    tag = _tag_words(stream)

    def init_fn(params: Any) -> CorrelatedNoiseState:
        flat, _ = ravel_pytree(params)
        if flat.size != d:
            raise MfcliError(f"the noise stream has d = {d} but the parameters have {flat.size} entries")
        ring, running = driver.init()
        return CorrelatedNoiseState(step=jnp.zeros((), dtype=jnp.int32), ring=ring, running=running,
                                    tag=jnp.asarray(tag), end=jnp.asarray(n, dtype=jnp.int32),
                                    status=jnp.zeros((), dtype=jnp.int32))

    def update_fn(updates: Any, state: CorrelatedNoiseState, params: Any = None) -> tuple[Any, CorrelatedNoiseState]:
        del params
        flat, unravel = ravel_pytree(updates)
        if flat.size != d:
            raise MfcliError(f"the noise stream has d = {d} but the updates have {flat.size} entries")
        t = state.step
        if not isinstance(t, jax.core.Tracer) and not isinstance(state.tag, jax.core.Tracer):
            _raise_for(state, expected_tag=tag)   # eager: refuse before computing anything
        foreign = jnp.any(state.tag != jnp.asarray(tag))
        status = jnp.where(state.status != OK, state.status,
                           jnp.where(foreign, FOREIGN, jnp.where(t >= n, EXHAUSTED, OK))).astype(jnp.int32)
        # Tables are indexed at min(t, n - 1): past the end the row is discarded (NaN) anyway.
        row, (ring, running) = driver.step(jnp.minimum(t, n - 1), state.ring, state.running)
        noise = jnp.where(status == OK, scale * row, jnp.nan)
        noisy = flat + noise.astype(flat.dtype)
        if postprocess is not None:
            out = postprocess(noisy)
            if getattr(out, "shape", None) != noisy.shape:
                raise MfcliError(f"postprocess must return an array of shape {noisy.shape}")
            noisy = out
        # A refused step keeps its step number (for the message) and a sticky status: every later
        # row is NaN too, and state_dict refuses the state, so its buffers no longer matter (not
        # selecting them back saves a pass over the state, n x d for a dense stream).
        new_state = CorrelatedNoiseState(
            step=jnp.where(status == OK, t + 1, t).astype(jnp.int32), ring=ring, running=running,
            tag=state.tag, end=state.end, status=status,
        )
        return unravel(noisy), new_state

    return optax.GradientTransformation(init_fn, update_fn)


def _exhausted(step: int, n: int) -> NoiseStreamExhaustedError:
    return NoiseStreamExhaustedError(
        f"noise stream exhausted: step {step} >= n = {n}; the artifact covers steps 0..{n - 1} "
        "and running past the end would break the privacy guarantee"
    )


_FOREIGN_TEXT = "this optax state belongs to another noise stream (different seed, artifact, d or dtype)"


def _raise_for(state: CorrelatedNoiseState, *, expected_tag: np.ndarray | None = None) -> None:
    """Raise the mfcli error a (host) state records or will cause: another stream's state, or a
    step at or past n."""
    status = int(state.status)
    if status == FOREIGN or (expected_tag is not None
                             and not np.array_equal(np.asarray(state.tag, dtype=np.uint32), expected_tag)):
        raise MfcliError(_FOREIGN_TEXT)
    n = int(state.end)
    if status == EXHAUSTED:
        raise _exhausted(int(state.step), n)
    if expected_tag is not None and int(state.step) >= n:
        raise _exhausted(int(state.step), n)


#: mfcli errors a host callback can raise inside compiled code, by the name JAX's text shows.
_CALLBACK_ERRORS: dict[str, type[MfcliError]] = {
    "NoiseStreamExhaustedError": NoiseStreamExhaustedError,
    "MfcliError": MfcliError,
}
_CALLBACK_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(" + "|".join(_CALLBACK_ERRORS) + r"): (.+?)\s*$", re.MULTILINE)


def mfcli_error_from(exc: BaseException) -> MfcliError | None:
    """The mfcli error a JAX runtime error carries, or None if it carries none.

    An exception raised in a ``jax.pure_callback`` inside compiled code reaches Python as a
    runtime error (``JaxRuntimeError`` or ``ValueError``: ``INTERNAL: CpuCallback error calling
    callback: Traceback ...``) whose text
    ends with the original ``<ErrorClass>: <message>`` line; this reads that last line back into
    the mfcli error type (:data:`_CALLBACK_ERRORS`) with its one-line message.
    """
    if isinstance(exc, MfcliError):
        return exc
    found = _CALLBACK_ERROR_LINE.findall(str(exc))
    if not found:
        return None
    name, message = found[-1]
    return _CALLBACK_ERRORS[name](message)


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (typically a jitted training step) that raises mfcli's own errors.

    Calls ``fn``, waits for its outputs (``jax.block_until_ready``) and reads the status of every
    :class:`CorrelatedNoiseState` among them: a step at t >= n raises
    :class:`~mfcli.errors.NoiseStreamExhaustedError`, a state of another stream
    :class:`~mfcli.errors.MfcliError` (the noise of that step is NaN either way). A JAX runtime
    error that carries an mfcli error (:func:`mfcli_error_from`) is raised as that error. Waiting
    costs the overlap of one step's dispatch with the next one's Python work, nothing when the
    loop reads the loss every step anyway.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log = logging.getLogger("jax._src.callback")
        log.addFilter(_drop_mfcli_tracebacks)
        try:
            out = jax.block_until_ready(fn(*args, **kwargs))
        except MfcliError:
            raise
        except Exception as exc:
            err = mfcli_error_from(exc)
            if err is None:
                raise
            raise err from None
        finally:
            log.removeFilter(_drop_mfcli_tracebacks)
        for leaf in jax.tree_util.tree_leaves(out, is_leaf=lambda x: isinstance(x, CorrelatedNoiseState)):
            if isinstance(leaf, CorrelatedNoiseState):
                _raise_for(leaf)
        return out

    return wrapper


def _drop_mfcli_tracebacks(record: logging.LogRecord) -> bool:
    """JAX logs every exception a callback raises with its traceback; under :func:`checked` an
    mfcli error is raised again as itself, so its log record would only repeat it."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, MfcliError)


def state_dict(stream: NoiseStream, state: CorrelatedNoiseState) -> dict:
    """An authenticated checkpoint of the optax noise state, in the one format of every mfcli
    noise stream (:meth:`mfcli.training.noise.NoiseStream.checkpoint`: step, carried rows, HMAC-SHA256 tag
    keyed from the seed, generator ``jax-threefry2x32``), host numpy values only.

    Save this, not the raw ``CorrelatedNoiseState`` pytree: :func:`load_state_dict` refuses an
    edited checkpoint (running sums zeroed, step changed), a raw pytree cannot be authenticated.
    """
    if not isinstance(state, CorrelatedNoiseState):
        raise MfcliError(f"expected a CorrelatedNoiseState, got {type(state).__name__}")
    _raise_for(state, expected_tag=None)
    if not np.array_equal(np.asarray(state.tag, dtype=np.uint32), _tag_words(stream)):
        raise MfcliError(_FOREIGN_TEXT)
    t = int(state.step)
    return stream.checkpoint(t, np.asarray(state.running), generator=JAX_GENERATOR,
                             generator_check=JaxStream(stream).generator_check(t))


def load_state_dict(stream: NoiseStream, checkpoint: Any) -> CorrelatedNoiseState:
    """The optax noise state a :func:`state_dict` checkpoint describes, after
    :meth:`NoiseStream.restore` has checked its tag and that it fits ``stream`` and the jax
    generator; the kept rows of Z are redrawn from the seed."""
    driver = JaxStream(stream)
    t, running = stream.restore(checkpoint, generator=JAX_GENERATOR, generator_check=driver.generator_check)
    ring, _ = driver.init()
    for slot, j in stream.operator.kept_rows(t):
        ring = ring.at[slot].set(driver.draw(j))
    return CorrelatedNoiseState(
        step=jnp.asarray(t, dtype=jnp.int32),
        ring=ring,
        running=jnp.asarray(running),
        tag=jnp.asarray(_tag_words(stream)),
        end=jnp.asarray(stream.n, dtype=jnp.int32),
        status=jnp.zeros((), dtype=jnp.int32),
    )


__all__ = [
    "CorrelatedNoiseState", "JaxOps", "JaxStream", "checked", "correlated_noise", "jax_key", "load_state_dict",
    "mfcli_error_from", "state_dict",
]
