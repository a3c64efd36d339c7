"""Independent oracles shared by the noise-stream and adapter tests (not through mfcli.training.noise).

* :func:`philox_z`: Z drawn straight from numpy's Philox, entries 65536 c .. of row j from
  Philox(key=seed, counter=(0, c, j, 0)).
* :func:`save_truncated_svd_compression`: an optimal momentum artifact with a hand-built
  ``compressed`` group (band of the decoder plus a truncated SVD of the rest), its sensitivity and
  loss recomputed here by a dense triangular solve.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.linalg

from mfcli.io.artifact import save_artifact
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.dense import optimal_factorization

BLOCK = 65536


def philox_z(seed: int, rows: int, d: int, dtype: str = "float64") -> np.ndarray:
    out = np.empty((rows, d), dtype=dtype)
    for j in range(rows):
        for c, start in enumerate(range(0, d, BLOCK)):
            bitgen = np.random.Philox(key=seed, counter=np.array([0, c, j, 0], dtype=np.uint64))
            size = min(BLOCK, d - start)
            out[j, start:start + size] = np.random.Generator(bitgen).standard_normal(size, dtype=np.dtype(dtype))
    return out


def decoder_from_layout(band: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """B^ entry by entry from the layout: band[t, t-j] inside the band, u[t].v[j] for j <= t-K."""
    n, k = band.shape
    out = np.zeros((n, n))
    for t in range(n):
        for j in range(t + 1):
            out[t, j] = band[t, t - j] if t - j < k else float(u[t] @ v[j])
    return out


def _dense_loss(fact) -> float:
    """sens(C)^2 ||B||_F^2 of the dense root, from the matrices."""
    c, b = fact.strategy, fact.decoder
    return float(np.max(np.sum(c**2, axis=0)) * np.sum(b**2))


def save_truncated_svd_compression(path: Path, *, n: int, beta: float, band: int, rank: int):
    """Write the artifact; return (path, A, dense factorization, B^)."""
    a = momentum_workload(n, beta=beta).matrix
    fact = optimal_factorization(a, tol=1e-9).factorization
    b = fact.decoder
    band_values = np.zeros((n, band))
    for i in range(band):
        band_values[i:, i] = np.diagonal(b, -i)
    left, s, right = np.linalg.svd(np.tril(b, -band))
    u, v = left[:, :rank] * s[:rank], right[:rank].T
    b_hat = np.where(np.tril(np.ones((n, n)), -band) > 0, u @ v.T, np.tril(b))
    c_hat = scipy.linalg.solve_triangular(b_hat, a, lower=True)
    sens = float(np.sqrt(np.max(np.sum(c_hat**2, axis=0))))
    save_artifact(path, fact, workload_name="momentum", workload_params={"beta": beta, "lr": "constant"},
                  strategy_name="optimal",
                  groups={"compressed": {"datasets": {"band": band_values, "u": u, "v": v},
                                         "attrs": {"band": band, "rank": rank, "sensitivity": sens,
                                                   "loss_total": sens**2 * float(np.sum(b_hat**2)),
                                                   "loss_increase": sens**2 * float(np.sum(b_hat**2))
                                                   / _dense_loss(fact) - 1.0}}})
    return path, a, fact, b_hat


def jax_z(seed: int, rows: int, d: int, dtype: str = "float32") -> np.ndarray:
    """Z of the jax streams, from the documented contract (docs/noise-streams.md): row j is
    jax.random.normal(fold_in(key, j), (d,)) with the raw threefry key whose two uint32 words are
    the first 8 bytes of SHA-256("mfcli-jax-noise|<seed>"), big-endian."""
    import hashlib

    import jax

    words = np.frombuffer(hashlib.sha256(f"mfcli-jax-noise|{seed}".encode()).digest()[:8], dtype=">u4")
    key = jax.numpy.asarray(words.astype(np.uint32))
    return np.stack([np.asarray(jax.random.normal(jax.random.fold_in(key, j), (d,), dtype=dtype))
                     for j in range(rows)])


def torch_z(seed: int, rows: int, d: int, dtype: str = "float32", device: str = "cpu") -> np.ndarray:
    """Z of the torch streams, from the documented contract: row j is torch.randn(d) from a
    torch.Generator on the device seeded with the first 8 bytes (big-endian, top bit cleared) of
    SHA-256("mfcli-torch-noise|<seed>|<j>")."""
    import hashlib

    import torch

    out = []
    for j in range(rows):
        gen = torch.Generator(device=device)
        digest = hashlib.sha256(f"mfcli-torch-noise|{seed}|{j}".encode()).digest()
        gen.manual_seed(int.from_bytes(digest[:8], "big") & (2**63 - 1))
        out.append(torch.randn(d, generator=gen, device=device, dtype=getattr(torch, dtype)).cpu().numpy())
    return np.stack(out)
