"""Bridges between mfcli artifacts and jax_privacy 2.0 (docs/frameworks.md, "JAX and jax_privacy").

Two directions:

* **Export** (:func:`streaming_matrix`, :func:`dense_privatizer`): an mfcli operator (the dense
  root, a compressed decoder, or any operator whose streaming matrix has a registered exporter,
  :func:`register_exporter`) as jax_privacy's ``StreamingMatrix``, to hand to
  ``jax_privacy.noise_addition.matrix_factorization_privatizer``::

      from mfcli.adapters.jax_privacy import streaming_matrix
      c_inv = streaming_matrix("momentum.h5", kind="gradient")     # C^-1 (C^^-1 if compressed)
      privatizer = noise_addition.matrix_factorization_privatizer(c_inv, stddev=sigma * clip, prng_key=key)

  jax_privacy then draws Z itself (from ``prng_key``); mfcli contributes the operator, not its
  Philox noise. Structured artifacts export as jax_privacy's own types: a banded Toeplitz C as its
  coefficients and C^-1 as ``toeplitz.inverse_as_streaming_matrix``, a BLT as a
  ``BufferedToeplitz`` and C^-1 as its ``inverse_as_streaming_matrix``; every other artifact as
  the dense C (:func:`native_strategy`). :func:`import_strategy` takes each of them back.
  Unlike jax_privacy's own matrices, the export **stops at step n**: step t >= n
  raises :class:`~mfcli.errors.NoiseStreamExhaustedError` (eagerly; under ``jit`` wrap the step in
  :func:`mfcli.adapters.optax.checked`) and, should the error be swallowed, the row it returns is
  NaN, never a reused or invented row. jax_privacy 2.0.0's dense privatizer indexes its matrix
  with the step (``noising_matrix[index]``), which JAX clamps, so step n, n+1, ... silently reuse
  row n-1: correlated noise the privacy analysis never accounted. :func:`dense_privatizer` is that
  privatizer with the same hard stop (O(d) memory; the streaming export of a dense operator keeps
  all n noise rows, O(n d)).

* **Import** (:func:`import_strategy`, :func:`save_imported_strategy`): a jax_privacy strategy C
  (a dense matrix, a ``ColumnNormalizedBanded``, Toeplitz coefficients, a ``BufferedToeplitz``)
  for an mfcli workload A into a verified artifact (decoder B = A C^-1, A = B C checked, the
  sensitivity and losses recomputed by mfcli from C), so ``inspect``, ``compare --artifact`` and
  ``account`` work on it::

      from mfcli.adapters.jax_privacy import save_imported_strategy
      from mfcli.model.workloads import build_workload
      save_imported_strategy("blt.h5", blt, build_workload("prefix", 1024))

  The artifact's ``solver`` attribute says ``{"method": "imported", "certified": false}`` and the
  group ``imported`` keeps the source parameters: no optimality certificate is claimed.

Formal guarantees: an export reproduces the operator the noise stream and ``account`` use
(:func:`mfcli.strategies.operators.select_operator`), so its privacy is that of the artifact: sensitivity
``operator.sensitivity`` x clip against noise ``stddev``; a jax_privacy ``stddev`` of
``sigma * clip`` is mfcli's noise std sigma on C G (``mfcli account --sigma``, the adapters'
``noise_std``; the noise multiplier is sigma / sensitivity). An import's numbers are recomputed from the
materialised C in float64 (never taken from jax_privacy), for single participation unless a
``participation`` schema is given.

jax_privacy is optional and imported only when an export is built; without it those functions
raise one :class:`~mfcli.errors.MfcliError` line saying how to install it.
"""
from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mfcli.errors import MfcliError, NoiseStreamExhaustedError
from mfcli.strategies.blt import BufferedToeplitz
from mfcli.strategies.operators import BandedLowRank, DenseLowerTriangular, select_operator
from mfcli.strategies.toeplitz import BandedToeplitz

#: The jax_privacy release these bridges are written and tested against.
JAX_PRIVACY_VERSION = "2.0.0"
INSTALL_HINT = f"pip install 'mfcli[jax]' (Python >= 3.11; it includes jax-privacy=={JAX_PRIVACY_VERSION})"

#: Strategy kinds :func:`import_strategy` recognises.
IMPORT_KINDS = ("dense", "banded", "toeplitz", "blt")


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MfcliError(f"this needs jax_privacy, which is not installed: {INSTALL_HINT}") from None


def _exhausted(step: int, n: int) -> NoiseStreamExhaustedError:
    return NoiseStreamExhaustedError(
        f"noise stream exhausted: step {step} >= n = {n}; the artifact covers steps 0..{n - 1} "
        "and running past the end would break the privacy guarantee"
    )


# --------------------------------------------------------------------------------------------
# Export: an mfcli operator as a jax_privacy StreamingMatrix
# --------------------------------------------------------------------------------------------


def _operator(source: Any, variant: str) -> Any:
    """The noise operator of ``source``: a path (dense or structured artifact), a loaded artifact
    or an operator itself."""
    if isinstance(source, (str, Path)):
        from mfcli.io.artifact import load_any_artifact

        return select_operator(load_any_artifact(source), variant)
    if (hasattr(source, "factorization") or hasattr(source, "schema_sensitivity")) and hasattr(source, "groups"):
        return select_operator(source, variant)
    if hasattr(source, "streaming") and hasattr(source, "sensitivity"):
        return source
    raise TypeError(f"expected an artifact path, a loaded artifact or a noise operator, got {type(source).__name__}")


def _guard(step: Any, n: int) -> Any:
    """``step`` after the hard stop: raises for step >= n (eagerly, or on the host from compiled
    code). The returned step is what the caller indexes with, so the check cannot be dropped as
    dead code."""
    import jax
    import jax.numpy as jnp

    if not isinstance(step, jax.core.Tracer):
        if int(step) >= n:
            raise _exhausted(int(step), n)
        return step

    def host(t: np.ndarray) -> np.ndarray:
        if np.any(np.asarray(t) >= n):
            raise _exhausted(int(np.max(t)), n)
        return np.asarray(t, dtype=np.int32)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(jnp.shape(step), jnp.int32), step, vmap_method="broadcast_all")


def _poison(out: Any, step: Any, n: int) -> Any:
    import jax.numpy as jnp

    return jnp.where(step < n, out, jnp.asarray(jnp.nan, dtype=out.dtype))


def _flatten(value: Any) -> tuple[list[Any], Any]:
    """Leaves and tree definition of a pytree (states hold one array per leaf of the noise)."""
    import jax

    return jax.tree.flatten(value)


def _banded_exporter(matrix: BandedLowRank) -> tuple[Callable, Callable]:
    """init/next of the banded-low-rank recurrence (module :mod:`mfcli.training.noise`): W recent rows, R
    running sums S_m = sum_{j<=m} v[j] z_j; row t = sum_i band[t, i] z_{t-i} + u[t] . S_{t-W}."""
    import jax
    import jax.numpy as jnp

    n, w, r = matrix.n, matrix.width, matrix.rank
    coef = matrix.coefficient_table()
    v = np.asarray(matrix.v)

    def init(abstract: Any) -> Any:
        return (
            jnp.zeros((), jnp.int32),
            jax.tree.map(lambda x: jnp.zeros((w, *x.shape), x.dtype), abstract),
            jax.tree.map(lambda x: jnp.zeros((r, *x.shape), x.dtype), abstract),
        )

    def next_(value: Any, state: Any) -> Any:
        t, rings, sums = state
        safe = _guard(t, n)
        m = safe - w
        row = jnp.asarray(coef)[jnp.minimum(safe, n - 1)]
        v_m = jnp.asarray(v)[jnp.maximum(m, 0)]

        def leaf(z: Any, ring: Any, running: Any) -> tuple[Any, Any, Any]:
            z_m = jax.lax.dynamic_index_in_dim(ring, jnp.mod(m, w), axis=0, keepdims=False)
            running = jnp.where(m >= 0, running + jnp.tensordot(v_m.astype(z.dtype), z_m, axes=0), running)
            ring = jax.lax.dynamic_update_index_in_dim(ring, z.astype(ring.dtype), jnp.mod(safe, w), axis=0)
            c = row.astype(ring.dtype)
            out = jnp.tensordot(c[:w], ring, axes=1) + jnp.tensordot(c[w:], running, axes=1)
            return _poison(out, t, n), ring, running

        flat_z, tree = _flatten(value)
        parts = [leaf(z, a, b) for z, a, b in zip(flat_z, tree.flatten_up_to(rings), tree.flatten_up_to(sums), strict=True)]
        out, rings, sums = (tree.unflatten([p[i] for p in parts]) for i in range(3))
        return out, (t + 1, rings, sums)

    return init, next_


def _dense_exporter(matrix: Any) -> tuple[Callable, Callable]:
    """init/next for any lower-triangular M given densely: all n noise rows are kept (O(n d)
    memory) and row t is M[t] . history. Use :func:`dense_privatizer` for O(d) memory."""
    import jax
    import jax.numpy as jnp

    m = np.asarray(matrix.dense(), dtype=np.float64)
    n = m.shape[0]

    def init(abstract: Any) -> Any:
        return jnp.zeros((), jnp.int32), jax.tree.map(lambda x: jnp.zeros((n, *x.shape), x.dtype), abstract)

    def next_(value: Any, state: Any) -> Any:
        t, hists = state
        safe = jnp.minimum(_guard(t, n), n - 1)
        row = jnp.asarray(m)[safe]

        def leaf(z: Any, hist: Any) -> tuple[Any, Any]:
            hist = jax.lax.dynamic_update_index_in_dim(hist, z.astype(hist.dtype), safe, axis=0)
            return _poison(jnp.tensordot(row.astype(hist.dtype), hist, axes=1), t, n), hist

        flat_z, tree = _flatten(value)
        parts = [leaf(z, h) for z, h in zip(flat_z, tree.flatten_up_to(hists), strict=True)]
        return tree.unflatten([p[0] for p in parts]), (t + 1, tree.unflatten([p[1] for p in parts]))

    return init, next_


def _stopped(inner: Any, n: int) -> tuple[Callable, Callable]:
    """init/next of a jax_privacy StreamingMatrix ``inner`` (unbounded, like its Toeplitz and BLT
    matrices) with the hard stop at n: a step counter beside its state; step t >= n raises
    :class:`~mfcli.errors.NoiseStreamExhaustedError` and yields NaN."""
    import jax
    import jax.numpy as jnp

    def init(abstract: Any) -> Any:
        return jnp.zeros((), jnp.int32), inner.init_multiply(abstract)

    def next_(value: Any, state: Any) -> Any:
        t, inner_state = state
        safe = _guard(t, n)
        out, inner_state = inner.multiply_next(value, inner_state)
        return jax.tree.map(lambda x: _poison(x, safe, n), out), (t + 1, inner_state)

    return init, next_


@dataclass(frozen=True)
class NativeExport:
    """How one kind of strategy is written in jax_privacy's own types (a registry entry,
    :func:`register_native`): ``strategy`` maps the kind's strategy object (the ``strategy`` of its
    operator) to jax_privacy's representation of C, for its ``matrix_factorization`` functions and
    :func:`import_strategy`; ``inverse`` maps it to jax_privacy's own ``StreamingMatrix`` of C^-1
    (unbounded: :func:`streaming_matrix` adds the hard stop at n)."""

    strategy: Callable[[Any], Any]
    inverse: Callable[[Any], Any]


def _toeplitz_coefs(strategy: BandedToeplitz) -> np.ndarray:
    """A banded Toeplitz C as jax_privacy's ``toeplitz`` module represents it: its b coefficients."""
    return np.array(strategy.coefs, dtype=np.float64)


def _toeplitz_inverse(strategy: BandedToeplitz) -> Any:
    return _require("jax_privacy.matrix_factorization.toeplitz").inverse_as_streaming_matrix(_toeplitz_coefs(strategy))


def _buffered_toeplitz(strategy: BufferedToeplitz) -> Any:
    """A BLT as jax_privacy's ``BufferedToeplitz`` (``buf_decay`` = theta, ``output_scale`` = omega:
    the same parameterisation, c_0 = 1, c_t = sum_i omega_i theta_i^(t-1)); float64 when
    ``jax_enable_x64`` is on (jax_privacy's recommendation), float32 else."""
    bt = _require("jax_privacy.matrix_factorization.buffered_toeplitz")
    import jax
    import jax.numpy as jnp

    dtype = jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32
    return bt.BufferedToeplitz.build(buf_decay=np.asarray(strategy.theta), output_scale=np.asarray(strategy.omega),
                                     dtype=dtype)


#: The kinds jax_privacy has a type of its own for, by the class of their strategy object; an
#: operator whose strategy is of no registered class (a dense root, a compressed decoder, the
#: baselines) is exported as its dense C.
_NATIVE: dict[type, NativeExport] = {
    BandedToeplitz: NativeExport(_toeplitz_coefs, _toeplitz_inverse),
    BufferedToeplitz: NativeExport(_buffered_toeplitz, lambda st: _buffered_toeplitz(st).inverse_as_streaming_matrix()),
}


def register_native(strategy_type: type, export: NativeExport) -> None:
    """Register jax_privacy's own representation of a kind of strategy (its strategy class, or a
    base class its kinds share): :func:`native_strategy` and the gradient export of
    :func:`streaming_matrix` then use it."""
    _NATIVE[strategy_type] = export


def _native(op: Any) -> NativeExport | None:
    """The registered native form of ``op``'s strategy (its own class's entry, else the nearest
    base class's), None where it is exported densely."""
    for cls in type(getattr(op, "strategy", None)).__mro__:
        if cls in _NATIVE:
            return _NATIVE[cls]
    return None


def native_strategy(source: Any, *, variant: str = "auto") -> Any:
    """The strategy C of ``source`` in jax_privacy's own representation, for its
    ``matrix_factorization`` functions (and back through :func:`import_strategy`): the
    registered form of its kind (:data:`_NATIVE`, :func:`register_native`), else the dense C:

    * a banded Toeplitz artifact: its b coefficients, a 1-D float64 array (jax_privacy's
      ``toeplitz`` module represents a banded Toeplitz C by them);
    * a BLT artifact: a ``buffered_toeplitz.BufferedToeplitz`` with ``buf_decay`` = theta and
      ``output_scale`` = omega (the same parameterisation: c_0 = 1, c_t = sum_i omega_i
      theta_i^(t-1)); float64 when ``jax_enable_x64`` is on (jax_privacy's recommendation), float32 else;
    * any other operator (dense root, compressed, a BandMF or other dense artifact): the n x n C
      as a float64 array (jax_privacy's ``dense`` module).

    Raises:
        MfcliError: jax_privacy missing (BLT), an unusable artifact.
    """
    op = _operator(source, variant)
    native = _native(op)
    if native is not None:
        return native.strategy(op.strategy)
    return np.array(op.factorization.strategy, dtype=np.float64)


#: Exporters by streaming-matrix type; anything else with ``dense()`` is exported densely.
_EXPORTERS: dict[type, Callable[[Any], tuple[Callable, Callable]]] = {
    BandedLowRank: _banded_exporter,
    DenseLowerTriangular: _dense_exporter,
}


def register_exporter(matrix_type: type, exporter: Callable[[Any], tuple[Callable, Callable]]) -> None:
    """Register how a streaming-matrix type (e.g. a structured Toeplitz or BLT operator) becomes
    jax_privacy ``(init_multiply, multiply_next)`` over pytrees; ``multiply_next`` must refuse
    step >= n (see :func:`guard_step`)."""
    _EXPORTERS[matrix_type] = exporter


def guard_step(step: Any, n: int) -> Any:
    """The hard stop for exporters: ``step`` itself, after raising
    :class:`~mfcli.errors.NoiseStreamExhaustedError` for step >= n (on the host under ``jit``).
    Index with the returned value so the check stays in the compiled program."""
    return _guard(step, n)


def streaming_matrix(source: Any, *, kind: str = "gradient", variant: str = "auto") -> Any:
    """The operator of ``source`` for noise ``kind`` as a jax_privacy ``StreamingMatrix``.

    Args:
        source: an artifact path, a loaded :class:`~mfcli.io.artifact.Artifact`, or a noise operator
            (:class:`~mfcli.strategies.operators.DenseOperator`, :class:`~mfcli.strategies.operators.CompressedOperator`).
        kind: ``gradient`` (C^-1, what a privatizer adds to summed clipped gradients) or
            ``iterate`` (B).
        variant: ``auto``, ``dense`` or ``compressed`` (:func:`mfcli.strategies.operators.select_operator`).

    A banded Toeplitz or BLT artifact's gradient operator is jax_privacy's own streaming C^-1
    (``toeplitz.inverse_as_streaming_matrix``, ``BufferedToeplitz.inverse_as_streaming_matrix``:
    b - 1 rows or one buffer per buffer of state); a compressed operator streams its
    banded-low-rank form (W + R rows of state per parameter); any other (a dense root, the
    iterate operator of a structured artifact at n <= its dense limit) keeps every noise row
    (n rows of state). Step t >= n raises
    :class:`~mfcli.errors.NoiseStreamExhaustedError` and yields NaN rather than noise.

    Raises:
        MfcliError: jax_privacy missing, a non-square operator, an unusable artifact.
    """
    sm_mod = _require("jax_privacy.matrix_factorization.streaming_matrix")
    op = _operator(source, variant)
    native = _native(op) if kind == "gradient" else None
    if native is not None:
        return sm_mod.StreamingMatrix(*_stopped(native.inverse(op.strategy), op.n))
    matrix = op.streaming(kind).matrix
    exporter = _EXPORTERS.get(type(matrix))
    if exporter is None:
        exporter = _dense_exporter
    dense = matrix.dense() if exporter is _dense_exporter else None
    if dense is not None and (dense.ndim != 2 or dense.shape[0] != dense.shape[1]):
        raise MfcliError(
            f"the {kind} operator is {dense.shape[0]} x {dense.shape[1]}: jax_privacy streams one noise row per step, "
            "so only a square operator can be exported"
        )
    init, next_ = exporter(matrix)
    return sm_mod.StreamingMatrix(init, next_)


def dense_privatizer(
    source: Any, *, stddev: float, prng_key: Any, kind: str = "gradient", variant: str = "auto"
) -> Any:
    """jax_privacy's dense ``matrix_factorization_privatizer`` for the operator of ``source``,
    with mfcli's hard stop: update t >= n raises :class:`~mfcli.errors.NoiseStreamExhaustedError`
    (the unguarded privatizer reuses row n-1) and its output is NaN.

    Noise row t regenerates the t + 1 rows of Z it needs from ``prng_key`` (O(t d) time, O(d)
    memory), as jax_privacy's privatizer does.
    """
    noise_addition = _require("jax_privacy.noise_addition")
    import jax
    import jax.numpy as jnp
    import optax

    op = _operator(source, variant)
    m = np.asarray(op.streaming(kind).matrix.dense(), dtype=np.float64)
    n = m.shape[0]
    if m.shape != (n, n):
        raise MfcliError(f"the {kind} operator is {m.shape[0]} x {m.shape[1]}: only a square operator can be exported")
    inner = noise_addition.matrix_factorization_privatizer(m, stddev=stddev, prng_key=prng_key)

    def update(updates: Any, state: Any, params: Any = None) -> Any:
        safe = _guard(state, n)
        noisy, new_state = inner.update(updates, jnp.minimum(safe, n - 1), params)
        return jax.tree.map(lambda x: _poison(x, state, n), noisy), new_state

    return optax.GradientTransformation(inner.init, update)


# --------------------------------------------------------------------------------------------
# Import: a jax_privacy strategy as a verified mfcli artifact
# --------------------------------------------------------------------------------------------


def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _finite(name: str, arr: Any) -> np.ndarray:
    try:
        out = np.asarray(arr, dtype=np.float64)
    except (TypeError, ValueError):
        raise MfcliError(f"{name} must be numeric, got {type(arr).__name__}") from None
    if not np.all(np.isfinite(out)):
        raise MfcliError(f"{name} contains NaN or inf")
    return out


def _toeplitz(coefs: np.ndarray, n: int) -> np.ndarray:
    """Lower-triangular Toeplitz C with C[t, j] = coefs[t - j] (zero past the coefficients)."""
    col = np.zeros(n)
    k = min(n, coefs.size)
    col[:k] = coefs[:k]
    idx = np.arange(n)[:, None] - np.arange(n)[None, :]
    return np.where(idx >= 0, col[np.clip(idx, 0, n - 1)], 0.0)


def strategy_matrix(strategy: Any, n: int) -> tuple[str, np.ndarray, dict[str, np.ndarray]]:
    """``(kind, C, parameters)`` for a jax_privacy strategy, materialised in float64 by mfcli.

    * a 2-D array: the dense strategy C itself (``dense``);
    * a 1-D array: lower-triangular Toeplitz coefficients, C[t, j] = coef[t - j] (``toeplitz``;
      jax_privacy's ``toeplitz`` module, banded Toeplitz when shorter than n);
    * ``ColumnNormalizedBanded``: C[t, j] = params[j, t - j] for t - j < bands, each column
      divided by its norm (``banded``);
    * ``BufferedToeplitz``: Toeplitz with coefficients 1, then sum_i output_scale[i] *
      buf_decay[i]^(k-1) for k >= 1 (``blt``).

    The parameters are what the artifact's ``imported`` group keeps.
    """
    name = type(strategy).__name__
    module = type(strategy).__module__
    if module.startswith("jax_privacy") and name == "BufferedToeplitz":
        decay = _finite("buf_decay", strategy.buf_decay).ravel()
        scale = _finite("output_scale", strategy.output_scale).ravel()
        if decay.shape != scale.shape:
            raise MfcliError(f"buf_decay {decay.shape} and output_scale {scale.shape} must have the same shape")
        coefs = np.ones(n)
        if n > 1:
            powers = np.arange(n - 1)[:, None]
            coefs[1:] = np.sum(decay[None, :] ** powers * scale[None, :], axis=1)
        return "blt", _toeplitz(coefs, n), {"buf_decay": decay, "output_scale": scale}
    if module.startswith("jax_privacy") and name == "ColumnNormalizedBanded":
        params = _finite("params", strategy.params)
        if params.ndim != 2 or params.shape[0] != n or not 1 <= params.shape[1] <= n:
            raise MfcliError(f"the banded strategy has params of shape {params.shape}; expected ({n}, bands <= {n})")
        bands = params.shape[1]
        c = np.zeros((n, n))
        for i in range(bands):
            j = np.arange(n - i)
            c[j + i, j] = params[j, i]
        norms = np.linalg.norm(c, axis=0)
        if not np.all(norms > 0):
            raise MfcliError("the banded strategy has a zero column: it cannot be normalised or inverted")
        return "banded", c / norms, {"params": params}
    if module.startswith("jax_privacy"):
        raise MfcliError(
            f"cannot import a {name}: pass a dense strategy matrix C, Toeplitz coefficients, "
            "a ColumnNormalizedBanded or a BufferedToeplitz"
        )
    arr = _finite("the strategy", strategy)
    if arr.ndim == 1:
        if arr.size == 0:
            raise MfcliError("the Toeplitz coefficients are empty")
        if arr.size > n:
            raise MfcliError(f"{arr.size} Toeplitz coefficients for n = {n}: at most n are used; pass coef[:n]")
        return "toeplitz", _toeplitz(arr, n), {"coefs": arr}
    if arr.ndim == 2:
        if arr.shape != (n, n):
            raise MfcliError(f"the strategy matrix is {arr.shape[0]} x {arr.shape[1]}; the workload needs {n} x {n}")
        return "dense", arr, {}
    raise MfcliError(f"a strategy must be a 1-D (Toeplitz) or 2-D (dense) array, got {arr.ndim} dimensions")


def import_strategy(strategy: Any, workload: Any) -> Any:
    """A verified :class:`~mfcli.strategies.baselines.Strategy` for a jax_privacy strategy C and an mfcli
    :class:`~mfcli.model.workloads.Workload` A: decoder B = A C^-1 by a triangular solve, A = B C
    checked, sensitivity and losses recomputed from C.

    Raises:
        MfcliError: an unknown strategy type, a shape that does not fit, C not lower-triangular
            or singular, A = B C failing (ill-conditioned C).
    """
    import scipy.linalg

    from mfcli.model.factorization import Factorization, is_lower_triangular
    from mfcli.model.workloads import Workload
    from mfcli.strategies.baselines import Strategy

    if not isinstance(workload, Workload):
        raise TypeError("workload must be an mfcli Workload (mfcli.model.workloads.build_workload), "
                        f"got {type(workload).__name__}")
    a = np.asarray(workload.matrix, dtype=np.float64)
    n = a.shape[0]
    kind, c, _ = strategy_matrix(strategy, n)
    if not is_lower_triangular(c):
        raise MfcliError("the strategy C is not lower-triangular: it cannot be run as a stream")
    diag = np.abs(np.diagonal(c))
    if not np.all(diag > 0):
        raise MfcliError("the strategy C has a zero on its diagonal: it is singular")
    b = scipy.linalg.solve_triangular(c.T, a.T, lower=False).T   # B C = A  <=>  C^T B^T = A^T
    if not np.all(np.isfinite(b)):
        raise MfcliError("the strategy C is numerically singular: B = A C^-1 is not finite")
    b = np.tril(b)
    fact = Factorization(workload=a, strategy=c, decoder=b, causal=True)
    try:
        fact.verify()
    except MfcliError as exc:
        raise MfcliError(f"the imported strategy is too ill-conditioned to use: {exc}") from None
    return Strategy(f"jax_privacy-{kind}", fact, True, f"jax_privacy {kind} strategy (imported, not certified)")


def save_imported_strategy(
    path: str | Path,
    strategy: Any,
    workload: Any,
    *,
    force: bool = False,
    participation: Any = None,
    command: str = "",
) -> str:
    """Write :func:`import_strategy`'s result as an artifact (atomically); returns its SHA-256.

    Root attribute ``solver`` is ``{"method": "imported", "certified": false, "source": ...}``
    (no gap or dual: nothing is certified); group ``imported`` holds the source parameters
    (``buf_decay``/``output_scale``, ``params`` or ``coefs``) and attributes ``source``,
    ``kind``, ``jax_privacy_version`` and ``certified = false``.
    """
    from mfcli.io.artifact import save_artifact

    imported = import_strategy(strategy, workload)
    kind, _, params = strategy_matrix(strategy, workload.n)
    try:
        version = importlib.metadata.version("jax-privacy")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    source = f"jax_privacy {kind} strategy ({_class_name(strategy)})"
    return save_artifact(
        path, imported.factorization, workload_name=workload.name, workload_params=dict(workload.params),
        strategy_name=imported.name, command=command, force=force, participation=participation,
        solver={"method": "imported", "certified": False, "source": source},
        groups={"imported": {
            "datasets": params,
            "attrs": {"source": "jax_privacy", "kind": kind, "class": _class_name(strategy),
                      "jax_privacy_version": version, "certified": False,
                      "note": "strategy C imported; decoder, sensitivity and losses recomputed by mfcli"},
        }},
    )


__all__ = [
    "IMPORT_KINDS",
    "JAX_PRIVACY_VERSION",
    "NativeExport",
    "dense_privatizer",
    "guard_step",
    "import_strategy",
    "native_strategy",
    "register_exporter",
    "register_native",
    "save_imported_strategy",
    "strategy_matrix",
    "streaming_matrix",
]
