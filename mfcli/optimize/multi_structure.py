"""The feasible set of the multi-participation problems and their dual certificate, shared by the
primal solvers in dense storage (:mod:`mfcli.optimize.multi_solver`) and in band storage
(:mod:`mfcli.optimize.multi_banded`); the problems and the dual are derived in docs/multi-participation.md.

Both solvers minimise f(X) = tr(A^T A X^-1) over the same set (a mask of entries fixed at zero
and linear constraints on diag(X)), and both are certified by the same bound: the dual candidate
W = P(X^-1 A^T A X^-1) (P the projection onto the dual support), shifted by t I until it is
positive definite, gives f* >= ||A W^1/2||_*^2 / m(W) (:func:`certify`). Kept in one module below
both solvers so that neither imports the other.
"""
from __future__ import annotations

import math

import numpy as np

from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation


class Structure:
    """The feasible set of one problem: its mask, its diagonal constraints, and the matching
    dual support. ``classes[i]`` is the diagonal constraint that index i belongs to; ``banded``:
    the feasible X is banded (min-separation with more than one participation), so it can be
    stored in band storage."""

    def __init__(self, n: int, schema: Participation) -> None:
        self.n = n
        idx = np.arange(n)
        if isinstance(schema, FixedEpoch):
            k = schema.participations(n)
            b = n // k
            self.name = "fixed-epoch"
            self.banded = False
            self.classes = idx % b
            self.scale = 1.0  # sens^2 = max class sum of diag X = 1
            mask = (idx[:, None] % b == idx[None, :] % b) & (idx[:, None] != idx[None, :])
        elif isinstance(schema, MinSeparation):
            k = schema.participations(n)
            b = schema.separation
            self.name = "banded"
            self.classes = idx
            self.scale = float(k)  # sens^2 = k max diag X = k
            # k = 1: one participation, no cross terms: the dense problem (bands would only restrict).
            mask = np.abs(idx[:, None] - idx[None, :]) >= b if k > 1 else np.zeros((n, n), dtype=bool)
            self.banded = bool(mask.any())  # k > 1: the band is imposed (band storage applies)
        else:
            raise MfcliError(f"no multi-participation solver for {schema.describe()}; use the single-participation solver")
        self.mask = mask  # X is zero here; the dual Z lives here
        self.free = ~mask
        np.fill_diagonal(self.free, False)  # free off-diagonal primal entries
        self.count = np.bincount(self.classes).astype(float)

    @property
    def bands(self) -> int:
        """b: the number of bands of the feasible X (its first masked offset; n when none is)."""
        for d in range(1, self.n):
            if self.mask[d, 0]:
                return d
        return self.n

    def class_mean(self, d: np.ndarray) -> np.ndarray:
        return (np.bincount(self.classes, weights=d) / self.count)[self.classes]

    def tangent(self, g: np.ndarray) -> np.ndarray:
        """Project a symmetric matrix onto the directions that keep X feasible (in place)."""
        g[self.mask] = 0.0
        d = np.diag(g).copy()
        np.fill_diagonal(g, d - self.class_mean(d))
        return g

    def dual(self, m: np.ndarray) -> tuple[np.ndarray, float]:
        """Dual candidate W from X^-1 A^T A X^-1 and its mass (sum of diagonal multipliers)."""
        w = np.where(self.mask, m, 0.0)
        mu = self.class_mean(np.diag(m).copy())
        np.fill_diagonal(w, mu)
        mass = float(np.sum(np.bincount(self.classes, weights=mu) / self.count))
        return w, mass

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """Rescale rows and columns so that every diagonal constraint is tight (feasible)."""
        d = np.diag(x)
        sums = np.bincount(self.classes, weights=d)[self.classes]
        s = 1.0 / np.sqrt(sums)
        x = x * s[:, None] * s[None, :]
        x[self.mask] = 0.0
        return x

    def start(self) -> np.ndarray:
        return np.diag(1.0 / self.count[self.classes])


def dual_bound(workload: np.ndarray, w: np.ndarray, mass: float) -> float:
    """||A W^1/2||_*^2 / mass for W > 0 (-inf when W is not numerically positive definite).

    Valid as a lower bound for any W of the dual form (module docstring), computed from the
    singular values of A R with W = R R^T (LAPACK gesdd, ~n eps s_max absolute)."""
    import scipy.linalg

    try:
        r = scipy.linalg.cholesky(w, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return -math.inf
    sigma = scipy.linalg.svdvals(workload @ r, overwrite_a=True, check_finite=False)
    return float(sigma.sum() ** 2 / mass)


def certify(a: np.ndarray, st: Structure, m: np.ndarray) -> float:
    """The best dual bound from the candidate P(m), shifted by t I until positive definite."""
    w, mass = st.dual(m)
    bound = dual_bound(a, w, mass)
    if bound > -math.inf:
        return bound
    shift = 1e-10 * float(np.trace(w)) / st.n
    for _ in range(12):
        w2 = w + shift * np.eye(st.n)
        # A diagonal shift raises every multiplier of a class by the same amount.
        bound = dual_bound(a, w2, mass + shift * len(st.count))
        if bound > -math.inf:
            return bound
        shift *= 10.0
    return 0.0
