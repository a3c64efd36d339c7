"""The factorization value object (A, B, C) and the error and sensitivity it implies.

Notation (see docs/concepts.md):

=========  ==================  ==========================================================
symbol     name                meaning
=========  ==================  ==========================================================
A          ``workload``        n x n lower-triangular operator on the gradient stream
C          ``strategy``        m x n encoder; the mechanism privatises C G + Z
B          ``decoder``         n x m with A = B C; the output is A G + B Z
C^-1       ``noising_matrix``  square C only: noise added to step t's gradient is (C^-1 Z)[t]
=========  ==================  ==========================================================

Formal guarantees: every number here is recomputed from the matrices on access; nothing is
carried along from a solver. Sensitivity is for single participation (each example in at most one
step) in units of the clip norm.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mfcli.errors import MfcliError
from mfcli.util.rows import fields_of

#: Relative Frobenius tolerance for A = B C.
RECONSTRUCTION_RTOL = 1e-8


def sensitivity(strategy: np.ndarray) -> float:
    """Single-participation L2 sensitivity: the largest column norm max_j ||C[:, j]||_2."""
    c = np.asarray(strategy, dtype=np.float64)
    return float(np.sqrt(np.max(np.einsum("ij,ij->j", c, c))))


def per_step_error(*, decoder: np.ndarray, strategy: np.ndarray) -> np.ndarray:
    """Expected squared error of each released step per unit noise: sens(C)^2 ||B[t, :]||^2."""
    b = np.asarray(decoder, dtype=np.float64)
    return sensitivity(strategy) ** 2 * np.einsum("ij,ij->i", b, b)


def total_loss(*, decoder: np.ndarray, strategy: np.ndarray) -> float:
    """Total squared error sens(C)^2 ||B||_F^2 (noise multiplier 1, clip norm 1)."""
    b = np.asarray(decoder, dtype=np.float64)
    return float(sensitivity(strategy) ** 2 * np.sum(b * b))


def is_lower_triangular(mat: np.ndarray) -> bool:
    """Exact causality check of a square matrix: every entry above the diagonal is zero."""
    m = np.asarray(mat)
    return m.ndim == 2 and m.shape[0] == m.shape[1] and not np.any(np.triu(m, 1))


@dataclass(frozen=True, eq=False)
class Factorization:
    """A factorization A = B C of a workload, with its error and sensitivity.

    Attributes:
        workload: A, n x n.
        strategy: C, m x n.
        decoder: B, n x m.
        causal: whether the mechanism can be run as a stream (B and C lower-triangular in release
            order). For square factors this is checked; a non-square strategy (the binary tree)
            must declare it.

    Example:
        >>> import numpy as np
        >>> f = Factorization(workload=np.tril(np.ones((2, 2))), strategy=np.eye(2),
        ...                   decoder=np.tril(np.ones((2, 2))))
        >>> f.loss_total, f.sensitivity
        (3.0, 1.0)
    """

    workload: np.ndarray
    strategy: np.ndarray
    decoder: np.ndarray
    causal: bool | None = None

    def __post_init__(self) -> None:
        a = np.asarray(self.workload, dtype=np.float64)
        c = np.asarray(self.strategy, dtype=np.float64)
        b = np.asarray(self.decoder, dtype=np.float64)
        for name, m in (("workload", a), ("strategy", c), ("decoder", b)):
            if m.ndim != 2:
                raise MfcliError(f"{name} must be a 2-D matrix, got shape {m.shape}")
            if not np.all(np.isfinite(m)):
                raise MfcliError(f"{name} contains NaN or inf")
        n = a.shape[0]
        if a.shape != (n, n):
            raise MfcliError(f"workload must be square, got shape {a.shape}")
        if c.shape[1] != n:
            raise MfcliError(f"strategy has {c.shape[1]} columns, the workload has n = {n}")
        if b.shape != (n, c.shape[0]):
            raise MfcliError(
                f"decoder has shape {b.shape}, expected {(n, c.shape[0])} for a {c.shape} strategy"
            )
        causal = self.causal
        if causal is None:
            causal = is_lower_triangular(c) and is_lower_triangular(b)
        for m in (a, b, c):
            m.setflags(write=False)
        object.__setattr__(self, "workload", a)
        object.__setattr__(self, "strategy", c)
        object.__setattr__(self, "decoder", b)
        object.__setattr__(self, "causal", bool(causal))

    @property
    def n(self) -> int:
        return int(self.workload.shape[0])

    @property
    def m(self) -> int:
        return int(self.strategy.shape[0])

    @cached_property
    def sensitivity(self) -> float:
        return sensitivity(self.strategy)

    @cached_property
    def per_step_error(self) -> np.ndarray:
        return per_step_error(decoder=self.decoder, strategy=self.strategy)

    @property
    def loss_total(self) -> float:
        return float(np.sum(self.per_step_error))

    @property
    def loss_mean(self) -> float:
        return self.loss_total / self.n

    @property
    def rmse(self) -> float:
        return float(np.sqrt(self.loss_mean))

    @property
    def loss_max(self) -> float:
        return float(np.max(self.per_step_error))

    @cached_property
    def reconstruction_error(self) -> float:
        """||A - B C||_F / ||A||_F."""
        a = self.workload
        return float(np.linalg.norm(a - self.decoder @ self.strategy) / np.linalg.norm(a))

    def verify(self, *, rtol: float = RECONSTRUCTION_RTOL) -> Factorization:
        """Check A = B C (relative Frobenius error <= rtol) and, for square causal factors,
        lower-triangularity. Raises MfcliError naming what failed; returns self."""
        err = self.reconstruction_error
        if not err <= rtol:
            raise MfcliError(f"A != B C: relative reconstruction error {err:.3e} exceeds {rtol:g}")
        if self.causal and self.m == self.n:
            if not is_lower_triangular(self.strategy):
                raise MfcliError("strategy C is marked causal but is not lower-triangular")
            if not is_lower_triangular(self.decoder):
                raise MfcliError("decoder B is marked causal but is not lower-triangular")
        return self

    def noising_matrix(self) -> np.ndarray:
        """C^-1 for a square lower-triangular strategy: the gradient-noise operator."""
        if self.m != self.n:
            raise MfcliError("only a square strategy has a noising matrix C^-1")
        import scipy.linalg  # here, not at the top: scipy costs ~0.5 s of start-up (inspect needs none)

        return scipy.linalg.solve_triangular(
            self.strategy, np.eye(self.n), lower=is_lower_triangular(self.strategy)
        )

    def summary(self) -> dict:
        """Error and sensitivity, recomputed, as a JSON-ready dict."""
        return fields_of(self, "n", "m", "causal", "sensitivity", "loss_total", "loss_mean", "rmse", "loss_max",
                         "reconstruction_error")
