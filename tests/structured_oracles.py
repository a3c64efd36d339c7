"""Dense twins of structured (Toeplitz, BLT) operators, built from their definitions for the tests
that compare mfcli's structured code with dense algebra (not a test module; nothing here calls
mfcli.strategies.blt or mfcli.strategies.toeplitz).

* :func:`toeplitz_dense`: the lower-triangular Toeplitz matrix of a first column.
* :func:`blt_coefs`, :func:`blt_dense`: a buffered linear Toeplitz C (C_ii = 1, C_ij = sum_k
  omega_k theta_k^(i - j - 1) below the diagonal), its first column and the dense matrix.
* :func:`dense_workload`: the dense prefix-sum or momentum workload a Toeplitz workload stands for.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mfcli.model.workloads import momentum_workload, prefix_workload


def toeplitz_dense(coefs: np.ndarray) -> np.ndarray:
    """The n x n lower-triangular Toeplitz matrix with first column ``coefs``."""
    c = np.asarray(coefs, dtype=np.float64)
    i, j = np.indices((c.size, c.size))
    return np.where(i >= j, c[np.clip(i - j, 0, None)], 0.0)


def blt_coefs(theta: Sequence[float], omega: Sequence[float], n: int) -> np.ndarray:
    """First column of the BLT C with these (theta, omega): 1, then sum_k omega_k theta_k^(t - 1)."""
    t = np.arange(1, n)
    c = np.ones(n)
    c[1:] = sum(om * th ** (t - 1.0) for th, om in zip(theta, omega, strict=True))
    return c


def blt_dense(theta: Sequence[float], omega: Sequence[float], n: int) -> np.ndarray:
    """The dense n x n BLT C with these (theta, omega)."""
    return toeplitz_dense(blt_coefs(theta, omega, n))


def dense_workload(w, n: int) -> np.ndarray:
    """The dense workload matrix of the Toeplitz workload ``w`` (prefix sums, or momentum with w.beta)."""
    return prefix_workload(n).matrix if w.name == "prefix" else momentum_workload(n, beta=w.beta).matrix
