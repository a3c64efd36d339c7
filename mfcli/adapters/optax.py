"""optax adapter: correlated gradient noise from an mfcli artifact as a GradientTransformation.

Example::

    import jax, optax
    from mfcli.artifact import shipped_artifact
    from mfcli.noise import noise_stream
    from mfcli.adapters.optax import correlated_noise

    d = sum(x.size for x in jax.tree_util.tree_leaves(params))
    stream = noise_stream(shipped_artifact("momentum-n256"), kind="gradient", d=d, seed=SECRET_SEED)
    tx = optax.chain(
        correlated_noise(stream, noise_multiplier=1.0, clip_norm=1.0),   # + sigma clip (C^-1 Z)[t]
        optax.sgd(learning_rate=0.1, momentum=0.9),                      # runs the workload A
    )
    opt_state = tx.init(params)
    updates, opt_state = jax.jit(tx.update)(summed_clipped_grads, opt_state)

The incoming updates must be the SUM of per-example clipped gradients (pass ``batch_size`` if they
are the mean over a fixed batch). The noise is the artifact's **gradient** noise, row t of C^-1 Z
(C^^-1 Z compressed), never the iterate noise B Z.

How it runs: the noise row Z[t] is drawn on the host by numpy's Philox from (seed, t) through
``jax.pure_callback`` (a pure function of t, so it is safe under ``jit``); the banded-low-rank
recurrence (module :mod:`mfcli.noise`) runs in JAX on the optimizer state, which holds the W most
recent noise rows and the R running sums: checkpoint the optax state as usual and the stream
resumes exactly; for an authenticated checkpoint (refused on load if edited) save
``state_dict(stream, noise_state)`` and restore with ``load_state_dict(stream, checkpoint)``. Donate the optimizer
state to ``jit`` (``donate_argnums``) to update those
buffers in place. A dense artifact (method ``regenerate``) computes its whole row on the host,
O(t d) per step: compress it first for large models.

Step t >= n raises :class:`~mfcli.errors.NoiseStreamExhaustedError` when ``update`` runs eagerly.
Under ``jit`` the refusal happens on the host, inside the compiled step, and JAX reports it as a
runtime error (``jax.errors.JaxRuntimeError`` or ``ValueError``, by where JAX notices it)
whose text begins ``INTERNAL: CpuCallback error``; wrap the jitted step in
:func:`checked` to get the mfcli error back::

    train_step = checked(jax.jit(train_step))   # raises NoiseStreamExhaustedError at step n

Formal guarantees: as for :mod:`mfcli.adapters.torch`: the mechanism is C G + Z, with
sensitivity ``stream.sensitivity`` x clip and noise sigma x clip.
"""
from __future__ import annotations

import functools
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
from mfcli.noise import NoiseStream, noise_row
from mfcli.operators import BandedLowRank


class CorrelatedNoiseState(NamedTuple):
    """optax state: the next step, the ring of recent noise rows, the running sums, a stream tag."""

    step: jnp.ndarray
    ring: jnp.ndarray
    running: jnp.ndarray
    tag: jnp.ndarray


def _tag_words(stream: NoiseStream) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(stream.tag[:16]), dtype=">u4").astype(np.uint32)


def correlated_noise(
    stream: NoiseStream,
    *,
    noise_multiplier: float,
    clip_norm: float,
    batch_size: int | None = None,
    postprocess: Callable[[jnp.ndarray], jnp.ndarray] | None = None,
) -> optax.GradientTransformation:
    """A GradientTransformation adding ``sigma * clip * (C^-1 Z)[t]`` to the updates of step t.

    Args:
        stream: a :class:`mfcli.noise.NoiseStream` of kind ``gradient`` whose ``d`` equals the
            number of parameters (all leaves of the params pytree, in ``ravel_pytree`` order).
        noise_multiplier: sigma.
        clip_norm: the per-example clip norm.
        batch_size: None if updates are summed clipped gradients; B if averaged over B.
        postprocess: optional ``f(flat) -> flat`` on the flattened noisy gradient (length d)
            before it leaves this transformation, e.g. Laplacian smoothing.
    """
    check_gradient_stream(stream, "correlated_noise")
    check_noise_options(
        noise_multiplier=noise_multiplier, clip_norm=clip_norm, batch_size=batch_size, postprocess=postprocess
    )
    dt = stream.dtype
    if dt == np.float64 and jax.dtypes.canonicalize_dtype(np.float64) != np.float64:  # x64 disabled
        raise MfcliError("a float64 noise stream needs jax_enable_x64; use dtype='float32' or enable x64")
    scale = float(noise_multiplier) * float(clip_norm) / (batch_size or 1)
    n, d = stream.n, stream.d
    tag = _tag_words(stream)
    banded = stream.method == "banded-low-rank"
    w, r = stream.width, stream.rank
    if banded:
        assert isinstance(stream.operator, BandedLowRank)
        coef_table = jnp.asarray(stream.operator.coefficient_table().astype(dt))
        v_table = jnp.asarray(np.asarray(stream.operator.v, dtype=dt))

    def host_row(t: np.ndarray, got_tag: np.ndarray) -> np.ndarray:
        step = int(t)
        if not np.array_equal(np.asarray(got_tag, dtype=np.uint32), tag):
            raise MfcliError("this optax state belongs to another noise stream (different seed, artifact, d or dtype)")
        if not 0 <= step < n:
            raise NoiseStreamExhaustedError(
                f"noise stream exhausted: step {step} >= n = {n}; the artifact covers steps 0..{n - 1} "
                "and running past the end would break the privacy guarantee"
            )
        if banded:
            return noise_row(stream.seed, step, d, dt)
        row, _ = stream.next(stream.state_at(step))
        return row

    def init_fn(params: Any) -> CorrelatedNoiseState:
        flat, _ = ravel_pytree(params)
        if flat.size != d:
            raise MfcliError(f"the noise stream has d = {d} but the parameters have {flat.size} entries")
        return CorrelatedNoiseState(
            step=jnp.zeros((), dtype=jnp.int32),
            ring=jnp.zeros((w, d), dtype=dt),
            running=jnp.zeros((r, d), dtype=dt),
            tag=jnp.asarray(tag),
        )

    def update_fn(updates: Any, state: CorrelatedNoiseState, params: Any = None) -> tuple[Any, CorrelatedNoiseState]:
        del params
        flat, unravel = ravel_pytree(updates)
        if flat.size != d:
            raise MfcliError(f"the noise stream has d = {d} but the updates have {flat.size} entries")
        t = state.step
        if not isinstance(t, jax.core.Tracer) and not isinstance(state.tag, jax.core.Tracer):
            if not np.array_equal(np.asarray(state.tag, dtype=np.uint32), tag):
                raise MfcliError(
                    "this optax state belongs to another noise stream (different seed, artifact, d or dtype)"
                )
            host_step = int(t)
            if host_step >= n:
                raise NoiseStreamExhaustedError(
                    f"noise stream exhausted: step {host_step} >= n = {n}; the artifact covers steps "
                    f"0..{n - 1} and running past the end would break the privacy guarantee"
                )
        z = jax.pure_callback(host_row, jax.ShapeDtypeStruct((d,), dt), t, state.tag)
        ring, running = state.ring, state.running
        if banded:
            m = t - w
            slot_m = jnp.mod(m, w)
            z_m = jax.lax.dynamic_index_in_dim(ring, slot_m, axis=0, keepdims=False)
            v_m = v_table[jnp.maximum(m, 0)]
            running = jnp.where(m >= 0, running + v_m[:, None] * z_m[None, :], running)
            ring = jax.lax.dynamic_update_index_in_dim(ring, z, jnp.mod(t, w), axis=0)
            c = coef_table[jnp.minimum(t, n - 1)]
            noise = c[:w] @ ring + c[w:] @ running
        else:
            noise = z
        noisy = flat + (scale * noise).astype(flat.dtype)
        if postprocess is not None:
            out = postprocess(noisy)
            if getattr(out, "shape", None) != noisy.shape:
                raise MfcliError(f"postprocess must return an array of shape {noisy.shape}")
            noisy = out
        new_state = CorrelatedNoiseState(step=t + 1, ring=ring, running=running, tag=state.tag)
        return unravel(noisy), new_state

    return optax.GradientTransformation(init_fn, update_fn)


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

    Calls ``fn``, waits for its outputs (``jax.block_until_ready``: a compiled step reports a
    host-side refusal only when its outputs are ready) and turns a JAX runtime error that
    carries an mfcli error (:func:`mfcli_error_from`) back into that error, e.g.
    :class:`~mfcli.errors.NoiseStreamExhaustedError` when the step passes n. Waiting costs the
    overlap of one step's dispatch with the next one's Python work, nothing when the loop reads
    the loss every step anyway.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log = logging.getLogger("jax._src.callback")
        log.addFilter(_drop_mfcli_tracebacks)
        try:
            return jax.block_until_ready(fn(*args, **kwargs))
        except MfcliError:
            raise
        except Exception as exc:
            err = mfcli_error_from(exc)
            if err is None:
                raise
            raise err from None
        finally:
            log.removeFilter(_drop_mfcli_tracebacks)

    return wrapper


def _drop_mfcli_tracebacks(record: logging.LogRecord) -> bool:
    """JAX logs every exception a callback raises with its traceback; under :func:`checked` an
    mfcli error is raised again as itself, so its log record would only repeat it."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, MfcliError)


def state_dict(stream: NoiseStream, state: CorrelatedNoiseState) -> dict:
    """An authenticated checkpoint of the optax noise state: :meth:`NoiseStream.state_dict`'s
    format (step, running sums, HMAC-SHA256 tag keyed from the seed), host numpy values only.

    Save this, not the raw ``CorrelatedNoiseState`` pytree: :func:`load_state_dict` refuses an
    edited checkpoint (running sums zeroed, step changed), a raw pytree cannot be authenticated.
    """
    from mfcli.noise import NoiseState, _Workspace

    if not isinstance(state, CorrelatedNoiseState):
        raise MfcliError(f"expected a CorrelatedNoiseState, got {type(state).__name__}")
    if not np.array_equal(np.asarray(state.tag, dtype=np.uint32), _tag_words(stream)):
        raise MfcliError("this optax state belongs to another noise stream (different seed, artifact, d or dtype)")
    t = int(state.step)
    work = None
    if stream.method == "banded-low-rank":
        buf = np.concatenate([np.asarray(state.ring, dtype=stream.dtype), np.asarray(state.running, dtype=stream.dtype)])
        work = _Workspace(buf=buf, position=t)
    return stream.state_dict(NoiseState(t=t, stream_tag=stream.tag, _work=work))


def load_state_dict(stream: NoiseStream, checkpoint: Any) -> CorrelatedNoiseState:
    """The optax noise state a :func:`state_dict` checkpoint describes, after
    :meth:`NoiseStream.load_state_dict` has checked its tag and that it fits ``stream``; the ring
    of recent noise rows is regenerated from the seed."""
    noise_state = stream.load_state_dict(checkpoint)
    w, r, d = stream.width, stream.rank, stream.d
    work = noise_state._work
    if work is None:
        ring = np.zeros((w, d), dtype=stream.dtype)
        running = np.zeros((r, d), dtype=stream.dtype)
    else:
        ring, running = work.buf[:w], work.buf[w:]
    return CorrelatedNoiseState(
        step=jnp.asarray(noise_state.t, dtype=jnp.int32),
        ring=jnp.asarray(ring),
        running=jnp.asarray(running),
        tag=jnp.asarray(_tag_words(stream)),
    )


__all__ = [
    "CorrelatedNoiseState", "checked", "correlated_noise", "load_state_dict", "mfcli_error_from", "state_dict",
]
