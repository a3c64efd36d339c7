"""Adapters that load an mfcli noise stream into a training loop (docs/noise-streams.md).

* :mod:`mfcli.adapters.torch`: :class:`~mfcli.adapters.torch.CorrelatedNoiseOptimizer`, a wrapper
  around any ``torch.optim`` optimizer that adds ``sigma * clip * (C^-1 Z)[t]`` to the summed
  clipped gradient before each step (needs ``pip install mfcli[torch]``).
* :mod:`mfcli.adapters.opacus`: :func:`~mfcli.adapters.opacus.make_private`, Opacus clipping and
  Poisson sampling with mfcli's correlated noise and MMCC epsilon (needs ``mfcli[opacus]``).
* :mod:`mfcli.adapters.optax`: :func:`~mfcli.adapters.optax.correlated_noise`, an
  ``optax.GradientTransformation`` doing the same for JAX (needs ``jax`` and ``optax``).
* anything else: use :func:`mfcli.training.noise.noise_stream` directly; its rows are plain numpy arrays.

Both adapters carry gradient noise, rows of C^-1 Z (C^^-1 Z for a compressed artifact), never the
iterate noise B Z. Both run the stream's one recursion (:meth:`mfcli.strategies.operators.StreamingMatrix.step`,
the same as the numpy stream's) where the noise is used: torch on the parameters' device with a
``torch.Generator`` there, optax inside ``jit`` with ``jax.random``; each draws its own Z from the
seed (docs/noise-streams.md, "Reproducibility contract") and checkpoints in the one format of
:meth:`mfcli.training.noise.NoiseStream.checkpoint`. Each accepts ``postprocess``, a callable applied to the flattened noisy
gradient (d,) before the optimizer sees it: the hook for post-processing such as Laplacian
smoothing, which costs no privacy.

The submodules import their framework on import; this package imports neither.
"""
from __future__ import annotations

import math
from typing import Any

from mfcli.errors import MfcliError


def check_noise_options(*, noise_std: Any, clip_norm: Any, batch_size: Any, postprocess: Any) -> None:
    """Validate the options both adapters share; raise MfcliError naming the bad one. ``noise_std``
    is the std of the noise on C G per unit clip norm, as
    :func:`mfcli.training.record.resolve_noise_std` resolved it."""
    for name, value in (("noise_std", noise_std), ("clip_norm", clip_norm)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise MfcliError(f"{name} must be a finite non-negative number, got {value!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise MfcliError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if postprocess is not None and not callable(postprocess):
        raise MfcliError("postprocess must be callable")


def check_gradient_stream(stream: Any, adds: str) -> None:
    """Both adapters add C^-1 Z to gradients: ``stream`` must be a NoiseStream of kind
    ``gradient``. ``adds`` names the adapter in the message ("this optimizer", ...)."""
    from mfcli.training.noise import NoiseStream

    if not isinstance(stream, NoiseStream):
        raise MfcliError(f"stream must be an mfcli NoiseStream, got {type(stream).__name__}")
    if stream.kind != "gradient":
        raise MfcliError(
            f"{adds} adds noise to gradients: it needs a kind='gradient' stream (C^-1 Z), "
            f"not {stream.kind!r} ({stream.operator_name})"
        )
