"""Adapters that load an mfcli noise stream into a training loop (docs/noise-streams.md).

* :mod:`mfcli.adapters.torch`: :class:`~mfcli.adapters.torch.CorrelatedNoiseOptimizer`, a wrapper
  around any ``torch.optim`` optimizer that adds ``sigma * clip * (C^-1 Z)[t]`` to the summed
  clipped gradient before each step (needs ``pip install mfcli[torch]``).
* :mod:`mfcli.adapters.optax`: :func:`~mfcli.adapters.optax.correlated_noise`, an
  ``optax.GradientTransformation`` doing the same for JAX (needs ``jax`` and ``optax``).
* anything else: use :func:`mfcli.noise.noise_stream` directly; its rows are plain numpy arrays.

Both adapters carry gradient noise, rows of C^-1 Z (C^^-1 Z for a compressed artifact), never the
iterate noise B Z. Each accepts ``postprocess``, a callable applied to the flattened noisy
gradient (d,) before the optimizer sees it: the hook for post-processing such as Laplacian
smoothing, which costs no privacy.

The submodules import their framework on import; this package imports neither.
"""
