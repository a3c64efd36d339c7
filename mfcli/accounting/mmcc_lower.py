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
from scipy import special

from mfcli.accounting import mog_pld
from mfcli.util.floating import ELEMENTARY_ULPS, NDTR_ULPS_0, NDTR_ULPS_2, UNIT_ROUNDOFF, gamma

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


def _threshold(tau: float, s: np.ndarray, logq: np.ndarray, level: float) -> float:
    """A t where log LR(t) = log sum_i q_i e^((s_i t - s_i^2 / 2) / tau^2), increasing and convex in t
    (s >= 0), crosses ``level``: the optimal half-line's end (an end of the range where it does not
    cross). Newton's method from the right end (monotone for a convex increasing function). Any t
    gives a valid lower bound (:func:`certified_divergence`); this one the best."""
    inv = 1.0 / (tau * tau)
    half = 0.5 * s * s

    def llr(t: float) -> tuple[float, float]:
        a = logq + (s * t - half) * inv
        m = float(a.max())
        w = np.exp(a - m)
        total = float(w.sum())
        return m + math.log(total), float(w @ s) / total * inv

    lo, t = -40.0 * tau, float(s.max()) + 40.0 * tau
    if llr(lo)[0] >= level:
        return lo
    for _ in range(100):
        v, d = llr(t)
        if v <= level or d <= 0:
            return t
        step = (v - level) / d
        t -= step
        if step <= 1e-13 * (abs(t) + tau):
            return t
    return t


def certified_divergence(eps: float, tau: float, support: np.ndarray, probs: np.ndarray, rho: float) -> float:
    """A proven lower bound on the larger of the two hockey-stick divergences at ``eps`` (<= 700)
    between P = N(0, tau^2) and Q = sum_i q_i N(s_i, tau^2), for every law q within a relative
    ``rho`` of ``probs`` (the mean law's own round-off), under the model of :mod:`mfcli.util.floating`.

    Any half-line is a test: H(Q || P) >= Q(y > t) - e^eps P(y > t) and H(P || Q) >= P(y < t) -
    e^eps Q(y < t) for every t (at the optimal t, :func:`_threshold`, equality). Each is A - e^eps
    B with A, B sums of normal CDFs at a_i = (s_i - t) / tau or its negatives, each argument
    formed with two roundings (|da| <= 2u |a|): by Phibar's hazard (<= z_+ + 1) a value moves by a
    factor within e^(2u a (a + 1)), ndtr is within (NDTR_ULPS_0 + NDTR_ULPS_2 a^2) u (values below
    2^-1022: 2^-1021 absolute), the sums within gamma_(n + 2), q within rho, exp within
    ELEMENTARY_ULPS u: A >= A_c (1 - r) - 2^-1020 and B <= B_c (1 + r) + 2^-1020 with r from the
    largest |a|; the final expression's roundings cost gamma_6 (A_c + e^eps B_c) more."""
    u = UNIT_ROUNDOFF
    s = np.asarray(support, dtype=np.float64)
    q = np.asarray(probs, dtype=np.float64)
    keep = q > 0
    s, q = s[keep], q[keep]
    if s.size == 0:
        return -math.inf
    logq = np.log(q)
    e_eps = math.exp(eps) * (1 + (ELEMENTARY_ULPS + 1) * u)
    best = -math.inf
    for remove in (True, False):
        t = _threshold(tau, s, logq, eps if remove else -eps)
        a_q = (s - t) / tau  # Q's atoms' standardised distances above t
        a_p = -t / tau
        if remove:  # Q(y > t) - e^eps P(y > t)
            a_vals, b_vals = special.ndtr(a_q), special.ndtr(np.array([a_p]))
            big_a, big_b = float(q @ a_vals), float(b_vals[0])
        else:  # P(y < t) - e^eps Q(y < t)
            a_vals, b_vals = special.ndtr(np.array([-a_p])), special.ndtr(-a_q)
            big_a, big_b = float(a_vals[0]), float(q @ b_vals)
        amax = float(max(np.abs(a_q).max(), abs(a_p)))
        r = ((1 + rho) * (1 + (NDTR_ULPS_0 + NDTR_ULPS_2 * amax * amax) * u) * math.exp(2 * u * amax * (amax + 1))
             * (1 + gamma(s.size + 2)) - 1) * 1.01
        val = (big_a * (1 - r) - 2.0**-1020 - e_eps * (big_b * (1 + r) + 2.0**-1020)
               - gamma(6) * (big_a + e_eps * big_b))
        best = max(best, val)
    return best


def mixture_epsilon(tau: float, support: np.ndarray, probs: np.ndarray, delta: float,
                    rho: float | None = None) -> float:
    """Largest eps (to 1e-7 relative) at which the pair N(0, tau^2) vs sum_i probs_i N(support_i,
    tau^2) still has hockey-stick divergence > delta in one of the two directions (0 if none):
    a lower end, so the pair's true epsilon at delta is >= the value returned.

    With ``rho`` (the probabilities' relative round-off) the value is certified: the bisection's
    lower end (mog_pld's evaluation, which steers) is lowered until :func:`certified_divergence`
    proves the exact divergence above delta there (by 1e-9, 4e-9, ... relatively; at most 700,
    e^eps's range), else 0."""
    if support.size == 0 or support.max() <= 0:
        return 0.0
    lo = _bisected_epsilon(tau, support, probs, delta)
    if rho is None or lo <= 0:
        return lo
    e = min(lo, 700.0)
    for k in range(40):
        if certified_divergence(e, tau, support, probs, rho) > delta:
            return e
        e = min(lo, 700.0) * (1 - 1e-9 * 4.0**k)
        if e <= 0:
            break
    return 0.0


def _bisected_epsilon(tau: float, support: np.ndarray, probs: np.ndarray, delta: float) -> float:
    """The bisection's lower end of :func:`mixture_epsilon` on mog_pld's evaluation of the curve."""
    remove = mog_pld.HockeyStickCurve(tau, support, probs, remove=True)
    add = mog_pld.HockeyStickCurve(tau, support, probs, remove=False)

    def worst(e: float) -> float:
        return max(remove(np.array([e]))[0], add(np.array([e]))[0])

    return epsilon_bracket(worst, delta, rel_tol=1e-7, max_steps=100, eps_max=1e6)[0]


def law_error(weights: np.ndarray, resolution: int) -> float:
    """A relative bound on the round-off of every probability of :func:`mean_law` then
    :func:`coarsen_down` against exact arithmetic on the same cut decisions (the law that moving
    the cut tails down in exact arithmetic gives, stochastically smaller than the exact one): each
    step multiplies by p or fl(1 - p) and adds (three roundings), a moved tail is a sum of at most
    S terms (S = the largest support, the sum of the integer weights + 1) added to one entry, the
    renormalisation and the coarsening sum at most S terms and divide; gamma of the total, doubled
    for the ratio of two such sums (non-negative terms only: Higham 3.1)."""
    k = np.floor(np.asarray(weights, dtype=np.float64) * resolution)
    n = int(np.count_nonzero(k > 0))
    size = int(k[k > 0].sum()) + 1
    return 2.02 * gamma(n * (3 + size) + 4 * size + 16)


def statistic_epsilon(gram_chol: np.ndarray, weights: np.ndarray, *, sigma_eff: float, p: float, delta: float,
                      resolution: int = WEIGHT_RESOLUTION, strategy: np.ndarray | None = None) -> tuple[float, float]:
    """(eps, tau): exact epsilon of T_v = v^T C^+ y (rounded towards less loss as described in the
    module docstring) and its noise scale, for v = ``weights`` >= 0 with max 1 and the Cholesky
    factor of C^T C.

    With ``strategy`` (the prepared C) the value is proven below the exact epsilon of a statistic
    under the model of :mod:`mfcli.util.floating`. The statistic is T = (1 + kappa) a^T y with a =
    fl(C x), x the computed solution of C^T C x = v: any fixed a is post-processing, its mean
    weights are (1 + kappa) C^T a (the exact scaled C, within 1 + gamma_2 of the prepared entries,
    mmcc.gram_error) and its noise (1 + kappa) sigma_eff ||a||. The computed c = fl(C^T a) is within
    e = gamma_(2m + 8) fl(C^T |a|) of C^T a (C >= 0), so (1 + kappa)(c - e) >= v (1 + u) for
    every v_j > 0 with kappa from the worst j (taken twice, plus 4u): the mean law of ``weights``
    rounded down (:func:`mean_law`: exact k / M <= fl(k / M)(1 + u) <= v (1 + u)) is pointwise
    below the statistic's, and every exact weight is >= c - e >= 0 (else the statistic is not
    used: 0). tau = fl(sigma_eff ||a||)(1 + kappa)(1 + 1e-9) >= the exact noise (1e-9 covers the
    norm's gamma_(m + 2) for m below 10^6); the mean law's round-off is :func:`law_error` and the
    hockey-stick value is certified (:func:`mixture_epsilon` with rho). Without ``strategy``:
    tau^2 = sigma_eff^2 v^T (C^T C)^-1 v from the Cholesky factor as computed, the hockey-stick
    value as evaluated (round-off not bounded)."""
    if strategy is None:
        z = np.linalg.solve(gram_chol, weights)
        tau = sigma_eff * float(np.sqrt(z @ z)) * (1 + 1e-9)
        support, probs = coarsen_down(*mean_law(weights, p, resolution))
        return mixture_epsilon(tau * resolution, support.astype(np.float64), probs, delta), tau
    u = UNIT_ROUNDOFF
    c = np.asarray(strategy, dtype=np.float64)
    x = np.linalg.solve(gram_chol.T, np.linalg.solve(gram_chol, weights))
    a = c @ x
    got = c.T @ a
    err = gamma(2 * c.shape[0] + 8) * (c.T @ np.abs(a))
    low = got - 2.0 * err  # <= got - err, the one rounding of the difference included (err >= 8u got)
    v = np.asarray(weights, dtype=np.float64)
    if np.any(low < 0) or np.any((v > 0) & ~(low > 0)):
        return 0.0, sigma_eff * float(np.linalg.norm(a))
    pos = v > 0
    kappa = float(np.max(np.maximum(v[pos] * (1 + u) - low[pos], 0.0) / low[pos], initial=0.0)) * 2.0 + 4 * u
    tau = sigma_eff * float(np.sqrt(a @ a)) * (1 + kappa) * (1 + 1e-9)
    support, probs = coarsen_down(*mean_law(weights, p, resolution))
    rho = law_error(weights, resolution)
    return mixture_epsilon(tau * resolution, support.astype(np.float64), probs, delta, rho=rho), tau


__all__ = ["STATISTICS", "WEIGHT_RESOLUTION", "certified_divergence", "epsilon_bracket", "law_error", "mean_law",
           "mixture_epsilon", "statistic_epsilon",
           "statistic_weights"]
