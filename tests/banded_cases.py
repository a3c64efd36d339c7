"""Shared inputs of the BandMF band-storage tests (test_multi_banded_speed, test_selected_inversion):
the built-in workload matrices by name and a random b-banded symmetric X with unit diagonal."""
from __future__ import annotations

import numpy as np

from mfcli.model.workloads import learning_rates, momentum_workload, prefix_workload


def workload_matrix(name: str, n: int) -> np.ndarray:
    """A of ``prefix``, ``momentum`` (beta 0.9) or ``cooldown`` (momentum with cooldown learning rates)."""
    if name == "prefix":
        return prefix_workload(n).matrix
    if name == "momentum":
        return momentum_workload(n, beta=0.9).matrix
    return momentum_workload(n, beta=0.9, lr=learning_rates(n, "cooldown")).matrix


def random_band_x(n: int, b: int, seed: int) -> np.ndarray:
    """A symmetric X with X_ii = 1, zero outside |i - j| < b and small random entries (scale 0.3 / b)
    inside, so that it is positive definite at the tests' sizes (the tests factor it)."""
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((n, n)) * 0.3 / b
    x = np.where(np.abs(np.subtract.outer(np.arange(n), np.arange(n))) < b, r + r.T, 0.0)
    np.fill_diagonal(x, 1.0)
    return x
