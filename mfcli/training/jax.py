"""Private training in JAX from an accounting record (docs/training.md).

Example (``pip install mfcli[jax]``)::

    import functools
    from mfcli.training.jax import make_private

    priv = make_private(params, optax.sgd(0.5), (x_train, y_train), artifact="run.h5",
                        seed=secrets.randbits(128), clip_norm=1.0, loss_fn=loss_one)
    opt_state = priv.tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(1,))    # the noise state updates in place
    def step(params, opt_state, x, y, mask):
        grads = priv.clipped_grad(params, x, y, mask)      # clipped per example, padding masked out
        updates, opt_state = priv.tx.update(grads, opt_state, params)   # + correlated noise
        return optax.apply_updates(params, updates), opt_state

    for x, y, mask in priv.batches():                     # the record's n batches, padded
        params, opt_state = step(params, opt_state, x, y, mask)
    priv.epsilon()                                         # the verified record's epsilon

What runs is what the record accounts, as in :mod:`mfcli.training.torch`: the record's batch
sampler (:func:`mfcli.training.record.build_sampler`), its noise std, the noise of the operator it
accounted (:func:`mfcli.adapters.optax.correlated_noise` over
:func:`mfcli.training.record.record_stream`) and its n steps; declarations that disagree are refused in one line.

Fixed shapes. Poisson and cyclic batches vary in size, and ``jit`` compiles once per input shape.
:meth:`PrivateTraining.batches` pads every batch to the smallest of a few sizes
(:attr:`PrivateTraining.shapes`, by default 1/2, 3/4, 1, 5/4, 3/2 and 2 times the expected batch,
then doublings up to N), with a mask that is 1 on the real examples and 0 on the padding; so
``jit`` compiles at most ``len(shapes)`` times. :meth:`PrivateTraining.clipped_grad` multiplies
each clipped per-example gradient by its mask, so padding contributes exactly zero: the clipped
sum is the one over the batch as drawn (never truncated: a batch larger than every size gets the
next doubling).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mfcli.adapters.optax import correlated_noise
from mfcli.errors import MfcliError
from mfcli.training.noise import check_seed
from mfcli.training.record import RecordOptions, TrainingRecord, check_clip_norm, declared_batches, record_stream

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11; annotations only, so no runtime dependency

#: Default padded sizes, as multiples of the expected batch size.
SHAPE_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def padded_shapes(expected: float, examples: int, factors: Sequence[float] = SHAPE_FACTORS) -> tuple[int, ...]:
    """The sizes batches are padded to: ``ceil(f * expected)`` for each factor, then doublings of
    the largest up to ``examples`` (a batch never exceeds N), sorted and distinct."""
    sizes = {max(1, math.ceil(f * expected)) for f in factors}
    top = max(sizes)
    while top < examples:
        top *= 2
        sizes.add(min(top, examples))
    return tuple(sorted(s for s in sizes if s <= examples) or [examples])


def pad_to(shapes: Sequence[int], size: int) -> int:
    """The smallest of ``shapes`` that holds ``size`` examples."""
    for s in shapes:
        if s >= size:
            return s
    raise MfcliError(f"a batch of {size} examples exceeds every padded size {list(shapes)}")


@dataclass
class PrivateTraining:
    """What :func:`make_private` returns: the noisy optimizer, the padded batches, the clipped
    gradient and the record's epsilon.

    Attributes:
        tx: ``optax.chain(correlated_noise(...), your optimizer)``.
        record: the :class:`~mfcli.training.record.TrainingRecord` followed.
        sampler: the mfcli batch sampler of the record.
        expected_batch_size: B, the constant the clipped sum and the noise are divided by.
        shapes: the padded batch sizes (``jit`` compiles at most once per size).
        clip_norm: the per-example clipping norm.
    """

    tx: optax.GradientTransformation
    record: TrainingRecord
    sampler: Any
    expected_batch_size: int
    shapes: tuple[int, ...]
    clip_norm: float
    data: tuple[np.ndarray, ...] = field(repr=False)
    loss_fn: Callable[..., Any] = field(repr=False)

    @property
    def n(self) -> int:
        """Steps training takes (the artifact's n)."""
        return self.record.n

    def epsilon(self, delta: float | None = None) -> float:
        """The verified record's epsilon (at its delta)."""
        return self.record.epsilon_at(delta)

    def epsilon_per_epoch(self, delta: float | None = None) -> list[float | None]:
        """Epsilon after each epoch (:meth:`TrainingRecord.epsilon_per_epoch`)."""
        return self.record.epsilon_per_epoch(delta)

    def batches(self, start: int = 0) -> Iterator[tuple[np.ndarray, ...]]:
        """For steps ``start`` .. n - 1: the batch's arrays padded to a size of :attr:`shapes`
        (padding repeats example 0, masked out), then the mask (float32, 1 = real example)."""
        for idx in self.sampler.batches(start):
            size = pad_to(self.shapes, len(idx))
            full = np.zeros(size, dtype=np.int64)
            full[:len(idx)] = idx
            mask = np.zeros(size, dtype=np.float32)
            mask[:len(idx)] = 1.0
            yield (*(a[full] for a in self.data), mask)

    def clipped_grad(self, params: Any, *batch: Any) -> Any:
        """The sum over the batch of the per-example gradients of ``loss_fn(params, *example)``,
        each scaled to norm at most ``clip_norm`` and multiplied by its mask, divided by B. Call
        as ``clipped_grad(params, x, y, mask)`` inside ``jit``."""
        *arrays, mask = batch
        grads = jax.vmap(jax.grad(self.loss_fn), in_axes=(None, *([0] * len(arrays))))(params, *arrays)
        leaves = jax.tree_util.tree_leaves(grads)
        count = mask.shape[0]
        norms = jnp.sqrt(sum(jnp.sum(g.reshape(count, -1) ** 2, axis=1) for g in leaves))
        # min(1, clip / norm) (1 for a zero gradient), times the mask: padding contributes zero
        factor = jnp.where(norms > self.clip_norm, self.clip_norm / jnp.maximum(norms, 1e-30), 1.0) * mask
        b = self.expected_batch_size
        return jax.tree_util.tree_map(
            lambda g: jnp.tensordot(factor.astype(g.dtype), g, axes=1) / b, grads)


def make_private(
    params: Any,
    optimizer: optax.GradientTransformation,
    data: Sequence[np.ndarray],
    *,
    artifact: str | Path,
    seed: int,
    clip_norm: float,
    loss_fn: Callable[..., Any],
    shapes: Sequence[int] | None = None,
    dtype: str = "float32",
    **options: Unpack[RecordOptions],
) -> PrivateTraining:
    """Train under one accounting record of ``artifact`` in JAX.

    Args:
        params: the model parameters (a pytree; its size is the noise rows' d).
        optimizer: the optax optimizer computing the artifact's workload (``optax.sgd(lr)`` for
            ``prefix``, ``optax.sgd(lr, momentum=beta)`` for ``momentum``).
        data: the examples as arrays with a leading axis of length N (e.g. ``(x, y)``).
        artifact, seed, clip_norm: as :func:`mfcli.training.torch.make_private`.
        loss_fn: ``loss_fn(params, *example)`` for one example (no batch axis), a scalar.
        shapes: the padded batch sizes (default :func:`padded_shapes`).
        dtype: the noise dtype (float64 needs ``jax_enable_x64``).
        **options: the record and the numbers declared about it, as for
            :func:`mfcli.training.torch.make_private` (:class:`mfcli.training.record.RecordOptions`).

    Raises:
        MfcliError: as :func:`mfcli.training.torch.make_private`.
    """
    clip_norm = check_clip_norm(clip_norm)
    if not callable(loss_fn):
        raise MfcliError("loss_fn must be callable: loss_fn(params, *example)")
    seed = check_seed(seed)
    arrays = tuple(np.asarray(a) for a in data)
    if not arrays or any(a.ndim < 1 for a in arrays):
        raise MfcliError("data must be a sequence of arrays with a leading example axis")
    examples = int(arrays[0].shape[0])
    if examples < 1 or any(a.shape[0] != examples for a in arrays):
        raise MfcliError(f"every data array needs the same number of examples (the first has {examples})")
    rec, batches, expected = declared_batches(artifact, examples=examples, seed=seed, **options)
    if shapes is None:
        sizes = padded_shapes(batches.expected_batch_size(0), examples)
    else:
        sizes = tuple(sorted({int(s) for s in shapes}))
        if not sizes or sizes[0] < 1:
            raise MfcliError("shapes must be positive batch sizes")
        if sizes[-1] < examples:   # never truncate: a batch can hold up to N examples
            sizes = (*sizes, examples)
    d = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(params))
    stream = record_stream(rec, d=d, seed=seed, dtype=dtype)
    tx = optax.chain(correlated_noise(stream, record=rec, clip_norm=clip_norm, batch_size=expected), optimizer)
    return PrivateTraining(tx=tx, record=rec, sampler=batches, expected_batch_size=expected, shapes=sizes,
                           clip_norm=clip_norm, data=arrays, loss_fn=loss_fn)


__all__ = ["SHAPE_FACTORS", "PrivateTraining", "make_private", "pad_to", "padded_shapes"]
