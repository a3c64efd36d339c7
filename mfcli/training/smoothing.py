"""Laplacian smoothing of noisy updates (DP-LSSGD: Wang et al. 2019, arXiv:1906.12056; docs/concepts.md).

A trainer that privatises a gradient g_t by adding noise (independent, or the correlated
(C^-1 Z)[t] of a matrix-factorization mechanism) may replace the noisy vector v = g_t + noise by

    u = A_s^-1 v,   A_s = I - s L,

where L is the discrete 1-D Laplacian with periodic boundary on the d model coordinates
(L[i, i] = -2, L[i, i +- 1 mod d] = 1) and s >= 0 is the smoothing strength. A_s is a circulant
matrix, so the solve is diagonal in the Fourier basis:

    u^_k = v^_k / (1 + 2 s (1 - cos(2 pi k / d))),   k = 0 .. d-1,

which costs O(d log d) per vector (numpy's real FFT), never a d x d matrix.

What it does to the noise: A_s^-1 is symmetric with eigenvalues in [1 / (1 + 4 s), 1]; the k = 0
mode (the mean over coordinates) passes unchanged and high-frequency noise is damped, so isotropic
noise of variance sigma^2 per coordinate leaves with variance
sigma^2 * mean_k (1 + 2 s (1 - cos(2 pi k / d)))^-2 per coordinate (:func:`noise_variance_factor`).

Formal guarantees: smoothing is post-processing. It is a fixed linear map that depends only on s
and d, reads nothing but the already-privatised vector, and draws no randomness, so it leaves
every (epsilon, delta) that holds for the noisy stream unchanged; the accountant is never told
about it. s = 0 returns the input unchanged (bit for bit), which is plain DP-SGD / DP-MF.

Composability: every noise stream produces a per-step vector to add to the step's summed clipped
gradient; smooth the sum, ``smooth(g_t + noise_t, s=s)``. With a learning-rate schedule or
momentum folded into the workload A the smoothing applies per step before the optimizer, so the
released iterate noise becomes B Z A_s^-1 (rows are steps, columns are coordinates).

Example:
    >>> import numpy as np
    >>> u = laplacian_smooth(np.array([0.0, 0.0, 3.0, 0.0, 0.0]), s=1.0)
    >>> float(u.sum())     # the mean (k = 0 mode) is preserved
    3.0
    >>> bool(u[2] < 3.0 and u[1] > 0.0)   # the spike is spread to its neighbours
    True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mfcli.errors import MfcliError


def _check_s(s: float) -> float:
    try:
        val = float(s)
    except (TypeError, ValueError):
        raise MfcliError(f"the smoothing strength s must be a number, got {s!r}") from None
    if not math.isfinite(val) or val < 0:
        raise MfcliError(f"the smoothing strength s must be finite and >= 0, got {s!r}")
    return val


def _check_d(d: int) -> int:
    if isinstance(d, bool) or int(d) != d or int(d) < 1:
        raise MfcliError(f"the number of coordinates d must be a positive integer, got {d!r}")
    return int(d)


def smoothing_denominators(d: int, *, s: float) -> np.ndarray:
    """Fourier multipliers of A_s for a real FFT of length d: 1 + 2 s (1 - cos(2 pi k / d)).

    Returns the d // 2 + 1 values for k = 0 .. d // 2 (the rfft half-spectrum); the eigenvalues
    of A_s are these values (each k in 1 .. ceil(d/2) - 1 twice).
    """
    d = _check_d(d)
    s = _check_s(s)
    k = np.arange(d // 2 + 1, dtype=np.float64)
    return 1.0 + 2.0 * s * (1.0 - np.cos(2.0 * np.pi * k / d))


def laplacian_smooth(v: Any, *, s: float, axis: int = -1) -> np.ndarray:
    """Return u = A_s^-1 v, smoothing along ``axis`` (default: the last one, the coordinates).

    Args:
        v: a real array of shape (d,) or (batch, d) (any shape: every 1-D slice along ``axis`` is
            smoothed independently).
        s: smoothing strength, s >= 0. s = 0 returns a float64 copy of ``v`` unchanged.
        axis: the coordinate axis.

    Returns:
        A new float64 array of the shape of ``v``; ``v`` is not modified.

    Raises:
        MfcliError: s negative or not finite, v empty, complex or containing NaN or inf.

    Formal guarantees: post-processing of v only (see the module docstring); linear, symmetric,
    with operator norm 1 and the coordinate sum preserved.
    """
    s = _check_s(s)
    arr = np.asarray(v)
    if np.iscomplexobj(arr):
        raise MfcliError("Laplacian smoothing needs a real array, got a complex one")
    try:
        arr = np.array(arr, dtype=np.float64)  # always a copy
    except (TypeError, ValueError) as exc:
        raise MfcliError(f"cannot smooth a non-numeric array: {exc}") from None
    if arr.ndim == 0:
        raise MfcliError("Laplacian smoothing needs an array of coordinates, got a scalar")
    if arr.size == 0:
        raise MfcliError(f"cannot smooth an empty array (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise MfcliError("cannot smooth an array that contains NaN or inf")
    if not -arr.ndim <= int(axis) < arr.ndim:
        raise MfcliError(f"axis {axis} is out of range for an array of shape {arr.shape}")
    axis = int(axis) % arr.ndim
    if s == 0.0:
        return arr
    d = arr.shape[axis]
    denom = smoothing_denominators(d, s=s)
    shape = [1] * arr.ndim
    shape[axis] = denom.shape[0]
    spec = np.fft.rfft(arr, axis=axis)
    spec /= denom.reshape(shape)
    return np.fft.irfft(spec, n=d, axis=axis)


def noise_variance_factor(d: int, *, s: float) -> float:
    """Per-coordinate variance of A_s^-1 z for z ~ N(0, I_d): tr(A_s^-2) / d.

    The factor by which smoothing shrinks the variance of isotropic noise, computed exactly from
    the eigenvalues. It is 1 at s = 0 and tends, as d grows, to the closed form
    (1 + 2 s) / (1 + 4 s)^(3/2) (the mean of (a - b cos theta)^-2 over a period, a = 1 + 2 s,
    b = 2 s); e.g. s = 1: 0.268, s = 3: 0.149.
    """
    d = _check_d(d)
    s = _check_s(s)
    k = np.arange(d, dtype=np.float64)
    lam = 1.0 + 2.0 * s * (1.0 - np.cos(2.0 * np.pi * k / d))
    return float(np.mean(lam ** -2.0))


def smoothing_matrix(d: int, *, s: float) -> np.ndarray:
    """The dense d x d matrix A_s = I - s L (for tests and small d only)."""
    d = _check_d(d)
    s = _check_s(s)
    eye = np.eye(d)
    lap = np.roll(eye, 1, axis=1) + np.roll(eye, -1, axis=1) - 2.0 * eye
    return eye - s * lap


@dataclass(frozen=True)
class LaplacianSmoother:
    """A smoothing hook with a fixed strength: ``LaplacianSmoother(s)(v) == laplacian_smooth(v, s=s)``.

    Callable on numpy arrays of shape (d,) or (batch, d), on torch tensors (smoothed with
    ``torch.fft`` on the tensor's own device and dtype) and on JAX arrays, traced ones included
    (``jax.numpy.fft``, so it can run inside ``jit``), always over the last dimension. One object
    serves the numpy trainer, the PyTorch wrapper and the optax transformation as their
    ``postprocess`` hook::

        CorrelatedNoiseOptimizer(inner, ..., postprocess=LaplacianSmoother(1.0))   # PyTorch
        correlated_noise(stream, ..., postprocess=LaplacianSmoother(1.0))          # optax

    Attributes:
        s: smoothing strength, s >= 0 (0 is the identity).
    """

    s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "s", _check_s(self.s))

    def __call__(self, v: Any) -> Any:
        if _is_torch_tensor(v):
            return smooth_torch(v, s=self.s)
        if _is_jax_array(v):
            return smooth_jax(v, s=self.s)
        return laplacian_smooth(v, s=self.s)

    @property
    def is_identity(self) -> bool:
        return self.s == 0.0


def _is_torch_tensor(v: Any) -> bool:
    mod = type(v).__module__
    return mod.startswith("torch") and hasattr(v, "dim") and hasattr(v, "device")


def _is_jax_array(v: Any) -> bool:
    return type(v).__module__.startswith(("jax", "jaxlib")) and hasattr(v, "shape") and hasattr(v, "dtype")


def smooth_jax(v: Any, *, s: float) -> Any:
    """u = A_s^-1 v for a real JAX array (or tracer), over its last dimension.

    Pure ``jax.numpy``, so it traces under ``jit``; s = 0 returns ``v`` itself. Same operator and
    guarantees as :func:`laplacian_smooth`.
    """
    s = _check_s(s)
    if s == 0.0:
        return v
    import jax.numpy as jnp  # optional dependency, only reached with a JAX array

    if jnp.iscomplexobj(v):
        raise MfcliError("Laplacian smoothing needs a real array, got a complex one")
    if v.ndim == 0 or v.size == 0:
        raise MfcliError(f"cannot smooth an array of shape {tuple(v.shape)}")
    d = int(v.shape[-1])
    dt = v.dtype if jnp.issubdtype(v.dtype, jnp.floating) else jnp.float32
    denom = jnp.asarray(smoothing_denominators(d, s=s), dtype=dt)
    out = jnp.fft.irfft(jnp.fft.rfft(v.astype(dt), axis=-1) / denom, n=d, axis=-1)
    return out.astype(v.dtype)


def smooth_torch(v: Any, *, s: float) -> Any:
    """u = A_s^-1 v for a real torch tensor, over its last dimension (any leading batch dims).

    Uses ``torch.fft.rfft``/``irfft`` so the data stays on its device; s = 0 returns ``v`` itself.
    Same operator and guarantees as :func:`laplacian_smooth`.
    """
    s = _check_s(s)
    if s == 0.0:
        return v
    import torch  # optional dependency, only reached with a torch tensor

    if v.is_complex():
        raise MfcliError("Laplacian smoothing needs a real tensor, got a complex one")
    if v.dim() == 0 or v.numel() == 0:
        raise MfcliError(f"cannot smooth a tensor of shape {tuple(v.shape)}")
    d = int(v.shape[-1])
    work = v if v.dtype in (torch.float32, torch.float64) else v.to(torch.float32)
    k = torch.arange(d // 2 + 1, device=work.device, dtype=torch.float64)
    denom = (1.0 + 2.0 * s * (1.0 - torch.cos(2.0 * math.pi * k / d))).to(work.dtype)
    out = torch.fft.irfft(torch.fft.rfft(work, dim=-1) / denom, n=d, dim=-1)
    return out.to(v.dtype)
