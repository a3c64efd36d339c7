"""Certified lower bounds for the Poisson-sampled matrix mechanism from linear statistics
(docs/accounting.md, "A tighter lower bound: the best of a few linear statistics").

Any statistic computed from the mechanism's output y = C (x + b) + Z is post-processing, so its
exact epsilon is at most the mechanism's: every statistic gives a valid lower bound, and so does
the largest of several fixed in advance (they do not depend on the data). For v >= 0 and a C with
independent columns, T_v = v^T C^+ y with C^+ = (C^T C)^-1 C^T the least-squares left inverse is

    T_v = v^T b + N(0, tau^2),   tau^2 = sigma_eff^2 v^T (C^T C)^-1 v,

with b_j ~ Bernoulli(p) i.i.d. under Q (example present) and b = 0 under P: a one-dimensional
mixture of Gaussians with non-negative means, whose hockey-stick divergences are computed exactly
(:func:`mfcli.accounting.mog_pld.hockey_stick`, both directions).

Which v. v = 1 (T = 1^T C^+ y, the spec's statistic) weights every step equally. The score of
the mixture at small p, sum_j (C e_j)^T y = (C 1)^T y, is T_v with v = C^T C 1: it weights a step
by how strongly its column correlates with the others, which is what dense correlated-noise C
(where a participation shows in many rows) leaks; v = (C^T C)^2 1 is one more power step towards
the top eigenvector. Measured at the headline (sigma 4, p 0.01, momentum-n256): 1.477 (v = 1),
2.189 (C^T C 1), 2.194 ((C^T C)^2 1).

Rounding, always towards less privacy loss: v is scaled to max 1 and every v_j rounded DOWN to the
grid 1/M (so the mean v^T b only decreases pointwise, a stochastically smaller mean law), the
upper tails below 1e-30 are moved down to their last kept point, tau is rounded UP (extra
independent noise is post-processing). A mixture of N(s, tau^2) over s >= 0 has a monotone
likelihood ratio against N(0, tau^2), so the optimal tests are half-lines and a stochastically
smaller s gives smaller divergences in both directions; the value returned is the lower end of a
bisection bracket whose delta exceeds the target.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from mfcli.accounting import mog_pld

#: The weight vectors v tried, by name (see the module docstring).
STATISTICS = ("ones", "score", "score2")
#: Grid 1/M of the rounded-down weights v_j (v scaled to max 1).
WEIGHT_RESOLUTION = 200
#: Most atoms of the mean law handed to the hockey-stick evaluation (each evaluation costs ~1000 x
#: atoms); a larger law is coarsened by rounding its atoms DOWN (:func:`coarsen_down`).
MAX_ATOMS = 1000
#: Upper-tail mass of the mean law below this (all steps together) is moved down, never up.
_TAIL = 1e-30


def statistic_weights(gram: np.ndarray, name: str) -> np.ndarray:
    """v for the statistic ``name`` (one of :data:`STATISTICS`), non-negative, scaled to max 1."""
    n = gram.shape[0]
    v = np.ones(n)
    if name == "score":
        v = gram @ v
    elif name == "score2":
        v = gram @ (gram @ v)
    elif name != "ones":
        raise ValueError(f"unknown statistic {name!r}")
    v = np.maximum(v, 0.0)  # C >= 0 makes these non-negative; guard against round-off
    return v / v.max()


def mean_law(weights: np.ndarray, p: float, resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """Law of sum_j floor(weights_j M) B_j (B_j ~ Bernoulli(p) i.i.d.) on the integers, as
    (support, probabilities): weights rounded DOWN to the grid 1/M, one two-point convolution per
    step (O(support) each: non-negative sums only, no cancellation), and after each step the upper
    tail below 1e-30 / n moved DOWN onto the largest value kept."""
    w = np.asarray(weights, dtype=np.float64)
    k = np.floor(w * resolution).astype(np.int64)
    k = np.where(k / resolution > w, k - 1, k)  # never up, even where w * M rounded up in floating point
    k = np.sort(k[k > 0])
    per_step = _TAIL / max(1, k.size)
    pmf = np.array([1.0])
    for kk in k.tolist():
        new = np.zeros(pmf.size + kk)
        new[:pmf.size] = (1 - p) * pmf
        new[kk:] += p * pmf
        pmf = new
        rc = np.cumsum(pmf[::-1])
        cut = int(np.searchsorted(rc, per_step, side="right"))  # rc[:cut] <= per_step
        if 0 < cut < pmf.size:
            moved = float(rc[cut - 1])
            pmf = pmf[:pmf.size - cut]
            pmf[-1] += moved
    support = np.flatnonzero(pmf > 0)
    pr = pmf[support]
    return support, pr / pr.sum()


def coarsen_down(support: np.ndarray, probs: np.ndarray, max_atoms: int = MAX_ATOMS) -> tuple[np.ndarray, np.ndarray]:
    """Move the atoms (integers >= 0) DOWN to multiples of the smallest factor f with at most
    ``max_atoms`` distinct values (a stochastically smaller law: only lowers the divergence)."""
    if support.size <= max_atoms:
        return support, probs
    f = 1
    while True:
        f *= 2
        pts = (support // f) * f
        if np.unique(pts).size <= max_atoms:
            break
    vals, inv = np.unique(pts, return_inverse=True)
    pr = np.bincount(inv, weights=probs)
    return vals, pr / pr.sum()


def epsilon_bracket(curve: Callable[[float], float], delta: float, *, rel_tol: float, max_steps: int,
                    eps_max: float) -> tuple[float, float]:
    """Bracket (lo, hi) of the epsilon at which a non-increasing hockey-stick curve falls to
    ``delta``: doubling from 1, then bisection until hi - lo <= rel_tol (1 + hi) or after
    ``max_steps`` halvings. curve(lo) > delta >= curve(hi) wherever the curve was evaluated.

    (0, 0) when curve(0) <= delta already; (lo, inf) when the doubling passes ``eps_max`` with the
    curve still above delta (lo the last point found above it). A lower bound takes lo (the curve
    was seen above delta there, so at least that much loss is certain), an estimate or an upper
    bound takes hi (the curve was seen at or below delta there). The one bisection shared by the
    linear-statistic and the banded Poisson accounting.
    """
    if curve(0.0) <= delta:
        return 0.0, 0.0
    lo, hi = 0.0, 1.0
    while curve(hi) > delta:
        lo, hi = hi, 2 * hi
        if hi > eps_max:
            return lo, math.inf
    for _ in range(max_steps):
        if hi - lo <= rel_tol * (1 + hi):
            break
        mid = 0.5 * (lo + hi)
        if curve(mid) > delta:
            lo = mid
        else:
            hi = mid
    return lo, hi


def mixture_epsilon(tau: float, support: np.ndarray, probs: np.ndarray, delta: float) -> float:
    """Largest eps (to 1e-7 relative) at which the pair N(0, tau^2) vs sum_i probs_i N(support_i,
    tau^2) still has hockey-stick divergence > delta in one of the two directions (0 if none):
    a lower end, so the pair's true epsilon at delta is >= the value returned."""
    if support.size == 0 or support.max() <= 0:
        return 0.0

    remove = mog_pld.HockeyStickCurve(tau, support, probs, remove=True)
    add = mog_pld.HockeyStickCurve(tau, support, probs, remove=False)

    def worst(e: float) -> float:
        return max(remove(np.array([e]))[0], add(np.array([e]))[0])

    return epsilon_bracket(worst, delta, rel_tol=1e-7, max_steps=100, eps_max=1e6)[0]


def statistic_epsilon(gram_chol: np.ndarray, weights: np.ndarray, *, sigma_eff: float, p: float, delta: float,
                      resolution: int = WEIGHT_RESOLUTION) -> tuple[float, float]:
    """(eps, tau): exact epsilon of T_v = v^T C^+ y (rounded towards less loss as described in the
    module docstring) and its noise scale, for v = ``weights`` >= 0 with max 1 and the Cholesky
    factor of C^T C."""
    z = np.linalg.solve(gram_chol, weights)
    tau = sigma_eff * float(np.sqrt(z @ z)) * (1 + 1e-9)
    support, probs = coarsen_down(*mean_law(weights, p, resolution))
    return mixture_epsilon(tau * resolution, support.astype(np.float64), probs, delta), tau


__all__ = ["STATISTICS", "WEIGHT_RESOLUTION", "epsilon_bracket", "mean_law", "mixture_epsilon", "statistic_epsilon",
           "statistic_weights"]
