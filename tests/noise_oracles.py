"""Independent oracles shared by the noise-stream and adapter tests (not through mfcli.noise).

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

from mfcli.artifact import save_artifact
from mfcli.solver import optimal_factorization
from mfcli.workloads import momentum_workload

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
