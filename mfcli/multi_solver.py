"""Certified optimal factorizations for multi-participation schemas (docs/multi-participation.md).

Two convex problems in X = C^T C, each with linear constraints, both in the form

    minimise f(X) = tr(A^T A X^-1)  over X > 0 with  X_ij = 0 for (i, j) in the mask M,
                                                    and linear constraints on diag(X),

* **fixed-epoch** (k epochs of b = n / k steps, Choquette-Choo et al. 2023, arXiv 2211.06530):
  M = {i != j, i = j mod b} (X orthogonal across the epochs of one example) and, for each of
  the b residue classes c, sum_{i in c} X_ii <= 1. On such an X the k participations of an
  example add orthogonally, so the sensitivity is exactly sqrt(max_c sum_{i in c} X_ii) = 1.
* **BandMF** for min-separation b with k participations (arXiv 2306.08153): M = {|i - j| >= b}
  (X b-banded) and X_ii <= 1. Steps b or more apart have X_il = 0, so the sensitivity is exactly
  sqrt(k) (k = min(max participations, ceil(n / b))).

Each is a restriction (the orthogonality, the bands) of the problem "best C for the schema", as
in the papers; the certificate is for the restricted problem.

Dual (derivation in docs/multi-participation.md). For W = D + Z > 0 with Z symmetric and
supported on M, and D diagonal holding the multipliers of the diagonal constraints (constant on a
residue class for fixed-epoch; mass m(W) = the sum of the multipliers),

    f* >= ||A W^1/2||_*^2 / m(W)          (||.||_* the nuclear norm; any W = R R^T gives ||A R||_*).

At the optimum W* = X*^-1 A^T A X*^-1 restricted to that support, with equality.

Fixed-epoch schemas with at most 32 epochs are solved on that dual by Newton's method
(:mod:`mfcli.multi_fixed_epoch`, ``method="auto"``); the primal solver below handles BandMF, more
epochs, ``method="primal"``, and continues from the dual method's X if that stops short of ``tol``.
The primal solver minimises f over the feasible affine set by L-BFGS (gradient -X^-1 A^T A X^-1 projected onto
the set's directions, backtracking on positive definiteness and sufficient decrease; near the
optimum, truncated Newton steps by preconditioned conjugate gradients instead) and takes
the dual candidate from the same gradient: W = P(X^-1 A^T A X^-1), the projection onto the dual
support, shifted by t I (t >= 0; still a valid W) until it is positive definite. The bound is
evaluated with the singular values of A R (R the Cholesky factor of W), as the single-participation
certificate is. The returned gap compares it with the loss recomputed from the returned B and C.

Example (k = 2 epochs of 4 steps of the prefix sum):
    >>> from mfcli.participation import FixedEpoch
    >>> from mfcli.workloads import prefix_workload
    >>> res = multi_participation_factorization(prefix_workload(8).matrix, FixedEpoch(epochs=2), tol=1e-8)
    >>> res.converged, round(res.sensitivity, 9)
    (True, 1.0)
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mfcli.errors import MfcliError
from mfcli.factorization import Factorization
from mfcli.multi_fixed_epoch import DUAL_METHOD
from mfcli.multi_fixed_epoch import MAX_EPOCHS as FE_MAX_EPOCHS
from mfcli.multi_fixed_epoch import applicable as fixed_epoch_applicable
from mfcli.participation import FixedEpoch, MinSeparation, Participation, sensitivity
from mfcli.pcg import pcg
from mfcli.solver import Progress, _blas_threads, auto_threads, decoder_for

#: L-BFGS history length (pairs of n x n matrices), capped by MEMORY_BYTES. Measured at n = 256
#: (prefix, 16 epochs / 16 bands): 30 pairs took 220 / 140 iterations, 10 pairs 320 / 170.
MEMORY = 30
MEMORY_BYTES = 1.5e9
#: Armijo sufficient-decrease constant.
ARMIJO = 1e-4
#: Certified gap below which the solver switches from L-BFGS to truncated Newton steps
#: (:func:`_newton_direction`). Far from the optimum the Newton steps are heavily damped, so the
#: cheaper L-BFGS iterations get there first.
NEWTON_GAP = 0.3
#: Conjugate-gradient iterations at most per Newton step.
NEWTON_CG = 50
#: ``storage="auto"`` keeps BandMF iterates in band storage (:mod:`mfcli.multi_banded`) from this n
#: on and for b <= n / BANDED_MIN_RATIO: one band iteration costs O(n^2 b) against O(n^3) dense,
#: but the band solver takes ~2x the iterations. Measured (threads=1, CPU s, band / dense, prefix
#: and momentum): n = 128, b = 32: 0.28 / 0.16, 1.03 / 0.49; n = 256, b = 64: 1.23 / 1.02,
#: 5.07 / 3.03; n = 256, b = 32: 1.29 / 1.49, 3.6 / 5.4; n = 512, b = 64: 7.0 / 13.0, 21.1 / 40.7.
BANDED_MIN_N = 256
BANDED_MIN_RATIO = 8


@dataclass(frozen=True, eq=False)
class MultiSolveResult:
    """A certified optimum for a participation schema.

    Attributes:
        factorization: lower-triangular C and B = A C^-1 (verified A = B C). Its own
            ``sensitivity``/``loss_*`` are single-participation numbers; use the fields below.
        participation: the schema.
        structure: ``fixed-epoch`` (orthogonal across epochs) or ``banded`` (BandMF, b bands).
        sensitivity: the schema sensitivity of C, recomputed by :func:`mfcli.participation.sensitivity`
            (exact for these structures).
        loss_total: sensitivity^2 ||B||_F^2, recomputed from the returned matrices (the primal).
        dual: certified lower bound on the optimal loss of the restricted problem.
        gap: (loss_total - dual) / loss_total.
    """

    factorization: Factorization
    participation: Participation
    structure: str
    sensitivity: float
    loss_total: float
    dual: float
    gap: float
    iterations: int
    seconds: float
    tol: float
    converged: bool
    history: list[Progress] = field(default_factory=list, repr=False)
    threads: int | None = None
    #: (n, eigendecompositions) per coarse level of the fixed-epoch dual method's coarse-to-fine
    #: start, or (m, iterations) per coarse level of the BandMF band path's (coarsest first).
    coarse_iterations: tuple[tuple[int, int], ...] = ()

    @property
    def primal(self) -> float:
        """The loss of the returned factorization (an upper bound on the optimum)."""
        return self.loss_total

    @property
    def loss_mean(self) -> float:
        """loss_total / n (the per-step mean, the convention of ``mfcli optimize``)."""
        return self.loss_total / self.factorization.n

    @property
    def per_step_error(self) -> np.ndarray:
        """sensitivity^2 ||B[i, :]||^2 for each step i."""
        b = self.factorization.decoder
        return self.sensitivity**2 * np.einsum("ij,ij->i", b, b)

    def certificate(self) -> dict:
        """JSON-ready solver record (the artifact's ``solver`` attribute)."""
        newton = any(p.method.startswith("newton-") for p in self.history)
        dual = [p for p in self.history if p.method == DUAL_METHOD]
        method = (f"lbfgs-newton-{self.structure}" if newton else f"lbfgs-{self.structure}") \
            + ("-band-storage" if any(p.method.endswith("band-storage") for p in self.history) else "")
        if dual:  # the dual Newton method of mfcli.multi_fixed_epoch, then maybe the primal solver
            method = DUAL_METHOD + ("" if len(dual) == len(self.history) else f"+{method}")
        cert = {
            "method": method,
            "structure": self.structure,
            "tol": self.tol,
            "gap": self.gap,
            "primal": self.loss_total,
            "dual": self.dual,
            "sensitivity": self.sensitivity,
            "iterations": self.iterations,
            "seconds": self.seconds,
            "converged": self.converged,
        }
        if self.coarse_iterations:
            cert["coarse_iterations"] = [list(level) for level in self.coarse_iterations]
        if self.threads is not None:
            cert["blas_threads"] = self.threads
        return cert


class _Structure:
    """The feasible set of one problem: its mask, its diagonal constraints, and the matching
    dual support. ``classes[i]`` is the diagonal constraint that index i belongs to."""

    def __init__(self, n: int, schema: Participation) -> None:
        self.n = n
        idx = np.arange(n)
        if isinstance(schema, FixedEpoch):
            k = schema.participations(n)
            b = n // k
            self.name = "fixed-epoch"
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
        else:
            raise MfcliError(f"no multi-participation solver for {schema.describe()}; use the single-participation solver")
        self.mask = mask  # X is zero here; the dual Z lives here
        self.free = ~mask
        np.fill_diagonal(self.free, False)  # free off-diagonal primal entries
        self.count = np.bincount(self.classes).astype(float)

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


def _value(a: np.ndarray, x: np.ndarray) -> tuple[float, tuple[np.ndarray, np.ndarray] | None]:
    """f(X) = tr(A X^-1 A^T) = ||L^-1 A^T||_F^2 (X = L L^T) and the factors (L, L^-1 A^T) that
    :func:`_gradient` reuses; (inf, None) if X is not numerically positive definite.

    The gradient is not formed here: line-search trials that are rejected need only the value
    (one Cholesky and one triangular solve)."""
    import scipy.linalg

    try:
        lower = scipy.linalg.cholesky(x, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return math.inf, None
    y = scipy.linalg.solve_triangular(lower, a.T, lower=True, check_finite=False)  # L^-1 A^T
    val = float(np.einsum("ij,ij->", y, y))
    if not math.isfinite(val) or val <= 0:
        return math.inf, None
    return val, (lower, y)


def _gradient(factors: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """X^-1 A^T A X^-1 (minus the gradient of f) from :func:`_value`'s factors: one more
    triangular solve and a symmetric rank-n update (BLAS syrk, half a product's work)."""
    import scipy.linalg
    from scipy.linalg.blas import dsyrk

    lower, y = factors
    mt = scipy.linalg.solve_triangular(lower, y, lower=True, trans="T", check_finite=False)  # X^-1 A^T
    upper = dsyrk(1.0, np.asfortranarray(mt), lower=0)  # upper triangle of mt mt^T
    return np.triu(upper) + np.triu(upper, 1).T


def _objective(a: np.ndarray, x: np.ndarray, *, gradient: bool = True) -> tuple[float, np.ndarray | None]:
    """f(X) = tr(A X^-1 A^T) and X^-1 A^T A X^-1 (minus the gradient); (inf, None) if X is not
    numerically positive definite."""
    val, factors = _value(a, x)
    if factors is None:
        return math.inf, None
    return val, (_gradient(factors) if gradient else None)


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


def _certify(a: np.ndarray, st: _Structure, m: np.ndarray) -> float:
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


def multi_participation_factorization(
    workload: np.ndarray,
    participation: Participation,
    *,
    tol: float = 1e-6,
    max_iter: int = 5000,
    dual_every: int = 10,
    callback: Callable[[Progress], None] | None = None,
    threads: int | str | None = "auto",
    x0: np.ndarray | None = None,
    precondition: bool = True,
    newton_gap: float = NEWTON_GAP,
    storage: str = "auto",
    method: str = "auto",
) -> MultiSolveResult:
    """The optimal factorization of ``workload`` for a fixed-epoch or min-separation schema.

    Args:
        workload: n x n full-rank lower-triangular A.
        participation: :class:`~mfcli.participation.FixedEpoch` or
            :class:`~mfcli.participation.MinSeparation` (BandMF with b = separation bands).
        tol: stop at this relative gap (primal - dual) / primal.
        max_iter: L-BFGS iterations at most; the result then carries the gap reached.
        dual_every: iterations between dual certificates (each one Cholesky and one SVD).
        callback: called with :class:`~mfcli.solver.Progress` after each certificate.
        threads: BLAS threads (as :func:`mfcli.solver.optimal_factorization`); ``"auto"`` runs
            band storage on one thread (measured faster there on any load).
        x0: a feasible starting X (tests); default the scaled identity, or for band storage the
            coarse-to-fine start (:func:`mfcli.multi_banded.coarse_start`).
        precondition: L-BFGS initial inverse Hessian D -> P(X D X) (the affine-invariant metric
            of the positive definite cone; P the projection onto feasible directions) instead of
            the identity. Speed only: the certificate is the same.
        newton_gap: once a certified gap is at most this, take truncated Newton steps
            (:func:`_newton_direction`, a certificate after each) instead of L-BFGS steps; 0 never.
            Speed only: the certificate is the same.
        storage: ``"banded"`` keeps the BandMF iterate in band storage (:mod:`mfcli.multi_banded`,
            O(n^2 b) per L-BFGS iteration and per Newton-CG step, certificates only once the primal
            stalls); ``"dense"`` the n x n iterate of this module; ``"auto"`` banded for BandMF
            with k > 1, n >= ``BANDED_MIN_N`` and b <= n / ``BANDED_MIN_RATIO`` (where it measured
            faster), else dense. Speed only: the certificate is the same.
        method: fixed-epoch only: ``"dual"`` Newton on the block-structured dual
            (:mod:`mfcli.multi_fixed_epoch`, for k <= ``MAX_EPOCHS`` epochs; if it stops short of
            ``tol`` the primal solver continues from its X); ``"primal"`` the L-BFGS / truncated
            Newton solver of this module; ``"auto"`` dual where it applies and no ``x0`` is given.
            Speed only: the certificate is the same.

    Formal guarantees: A = B C to 1e-8 relative; C lower-triangular; ``sensitivity`` is the
    schema sensitivity of C recomputed by :func:`mfcli.participation.sensitivity`, which is exact
    on these structures (an error is raised if it is not); the loss is within ``gap`` of the
    optimum of the restricted problem, the dual being a certified bound.
    """
    if not (0 < tol < 1) or not math.isfinite(tol):
        raise MfcliError(f"tol must be in (0, 1), got {tol}")
    if max_iter < 1:
        raise MfcliError(f"max_iter must be at least 1, got {max_iter}")
    a = np.asarray(workload, dtype=np.float64)
    n = a.shape[0]
    participation.check(n)
    st = _Structure(n, participation)
    limit = auto_threads() if threads == "auto" else threads
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise MfcliError(f"threads must be a positive integer, None or 'auto', got {threads!r}")
    if storage not in ("auto", "dense", "banded"):
        raise MfcliError(f"storage must be 'auto', 'dense' or 'banded', got {storage!r}")
    band_ok = st.name == "banded" and bool(st.mask.any())  # k > 1: the band is imposed
    if storage == "banded" and not band_ok:
        raise MfcliError("banded storage needs a min-separation schema with more than one participation")
    if method not in ("auto", "dual", "primal"):
        raise MfcliError(f"method must be 'auto', 'dual' or 'primal', got {method!r}")
    dual_ok = st.name == "fixed-epoch" and fixed_epoch_applicable(n, n // len(st.count))
    if method == "dual" and not dual_ok:
        raise MfcliError(f"the dual method needs a fixed-epoch schema with at most {FE_MAX_EPOCHS} epochs")
    use_dual = method == "dual" or (method == "auto" and dual_ok and x0 is None)
    use_band = storage == "banded" or (
        storage == "auto" and band_ok and n >= BANDED_MIN_N and BANDED_MIN_RATIO * _bands(st) <= n)
    if threads == "auto" and use_band:
        # The band path is hundreds of sequential (b + 2p)-sized block products, which OpenBLAS
        # splits across threads at a loss: at n = 2048, 64 bands, on 2 idle cores, one thread
        # took 15.5 s (prefix) and 30.2 s (momentum) wall, two threads 25.9 s and 48.2 s.
        limit = 1
    with _blas_threads(limit):
        if use_dual:
            res = _solve_fixed_epoch_dual(a, st, participation, tol=tol, max_iter=max_iter, callback=callback,
                                          fallback=dict(dual_every=max(1, dual_every), precondition=precondition,
                                                        newton_gap=newton_gap))
            return dataclasses.replace(res, threads=limit)
        if use_band:
            res = _solve_in_band(a, st, participation, tol=tol, max_iter=max_iter, callback=callback, x0=x0)
            return dataclasses.replace(res, threads=limit)
        res = _solve(a, st, participation, tol=tol, max_iter=max_iter, dual_every=max(1, dual_every),
                     callback=callback, x0=x0, precondition=precondition, newton_gap=newton_gap)
    return dataclasses.replace(res, threads=limit)


def _solve_fixed_epoch_dual(
    a: np.ndarray, st: _Structure, schema: Participation, *, tol: float, max_iter: int,
    callback: Callable[[Progress], None] | None, fallback: dict,
) -> MultiSolveResult:
    """Newton on the fixed-epoch dual (:mod:`mfcli.multi_fixed_epoch`); if its certified gap (from
    the loss recomputed from B and C) misses ``tol``, the primal solver continues from its X and
    the better of the two certified bounds is kept (both are valid lower bounds)."""
    from mfcli.multi_fixed_epoch import solve_dual

    start = time.perf_counter()
    k = len(st.classes) // len(st.count)
    sol = solve_dual(a, k, tol=tol, max_iter=max_iter, callback=callback)
    if sol is None:
        return _solve(a, st, schema, tol=tol, max_iter=max_iter, callback=callback, x0=None, **fallback)
    res = _result(a, st, schema, sol.x, sol.dual, start=start, iterations=sol.iterations, tol=tol,
                  history=sol.history)
    res = dataclasses.replace(res, coarse_iterations=tuple(sol.coarse))
    if res.converged or max_iter <= sol.iterations:
        return res
    more = _solve(a, st, schema, tol=tol, max_iter=max_iter - sol.iterations, callback=callback, x0=sol.x,
                  **fallback)
    dual = max(res.dual, more.dual)
    best = more if more.loss_total <= res.loss_total else res
    gap = (best.loss_total - dual) / best.loss_total
    return dataclasses.replace(best, dual=dual, gap=gap, converged=gap <= tol, iterations=sol.iterations + more.iterations,
                               seconds=time.perf_counter() - start, history=sol.history + more.history)


def _bands(st: _Structure) -> int:
    """The number of bands of a banded structure (its first masked offset)."""
    from mfcli.multi_banded import bandwidth

    return bandwidth(st)


def _solve_in_band(
    a: np.ndarray, st: _Structure, schema: Participation, *, tol: float, max_iter: int,
    callback: Callable[[Progress], None] | None, x0: np.ndarray | None,
) -> MultiSolveResult:
    from mfcli.multi_banded import coarse_start, solve_banded

    start = time.perf_counter()
    memory = max(5, min(MEMORY, int(MEMORY_BYTES / (16 * a.size))))
    band0, levels = (None, []) if x0 is not None else coarse_start(a, st, memory=memory, certify=_certify,
                                                                   armijo=ARMIJO)
    x, best_dual, it, history = solve_banded(
        a, st, tol=tol, max_iter=max_iter, callback=callback, x0=x0, memory=memory, certify=_certify, armijo=ARMIJO,
        start_band=band0)
    res = _result(a, st, schema, x, best_dual * st.scale, start=start, iterations=it, tol=tol, history=history)
    return dataclasses.replace(res, coarse_iterations=tuple(levels))


def _solve(
    a: np.ndarray, st: _Structure, schema: Participation, *, tol: float, max_iter: int, dual_every: int,
    callback: Callable[[Progress], None] | None, x0: np.ndarray | None, precondition: bool, newton_gap: float,
) -> MultiSolveResult:
    start = time.perf_counter()
    x = st.normalize(np.array(x0, dtype=np.float64)) if x0 is not None else st.start()
    f, factors = _value(a, x)
    if factors is None:
        raise MfcliError("the starting X is not positive definite")
    m = _gradient(factors)
    g = st.tangent(-m)
    memory = max(5, min(MEMORY, int(MEMORY_BYTES / (16 * x.size))))
    ss: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    best_dual = -math.inf
    history: list[Progress] = []
    it = 0
    for it in range(1, max_iter + 1):
        newton = newton_gap > 0 and bool(history) and history[-1].gap <= newton_gap
        if it == 1 or it % dual_every == 0 or newton:
            best_dual = max(best_dual, _certify(a, st, m))
            gap = (f - best_dual) / f
            method = ("newton-" if newton else "lbfgs-") + st.name
            prog = Progress(it, f * st.scale, best_dual * st.scale, gap, time.perf_counter() - start, method)
            history.append(prog)
            if callback is not None:
                callback(prog)
            if gap <= tol:
                break
        if newton:
            d = _newton_direction(x, m, g, factors[0], st, history[-1].gap)
        else:
            d = _two_loop(g, ss, ys, x if precondition else None, st)
        slope = float(np.vdot(g, d))
        if slope >= 0:  # not a descent direction: restart from the gradient
            ss.clear()
            ys.clear()
            d = -g * (1.0 / max(float(np.abs(g).max()), 1e-300)) * 0.1
            slope = float(np.vdot(g, d))
        step = 1.0
        for _ in range(60):
            x_new = x + step * d
            f_new, new_factors = _value(a, x_new)
            if new_factors is not None and f_new <= f + ARMIJO * step * slope:
                break
            step *= 0.5
        else:
            break  # no decrease possible at this precision: the round-off floor
        assert new_factors is not None
        m_new = _gradient(new_factors)
        g_new = st.tangent(-m_new)
        s_vec, y_vec = x_new - x, g_new - g
        if float(np.vdot(s_vec, y_vec)) > 1e-300:
            ss.append(s_vec)
            ys.append(y_vec)
            if len(ss) > memory:
                ss.pop(0)
                ys.pop(0)
        x, f, m, g = x_new, f_new, m_new, g_new
        factors = new_factors
    else:
        best_dual = max(best_dual, _certify(a, st, m))
    if not history or history[-1].iteration != it:
        best_dual = max(best_dual, _certify(a, st, m))
    return _result(a, st, schema, x, best_dual * st.scale, start=start, iterations=it, tol=tol, history=history)


def _newton_direction(
    x: np.ndarray, m: np.ndarray, g: np.ndarray, lower: np.ndarray, st: _Structure, gap: float
) -> np.ndarray:
    """A truncated Newton direction: preconditioned conjugate gradients on H d = -g over the
    feasible directions (P the projection onto them).

    The Hessian of f at X in direction D is X^-1 D M + M D X^-1 (M = X^-1 A^T A X^-1). Its
    inverse without constraints is explicit in the basis V = L U (X = L L^T, L^T M L = U diag(l) U^T),
    where V^T X^-1 V = I and V^T M V = diag(l): H^-1[G] = V ((V^T G V) / (l_i + l_j)) V^T. CG on the
    projected Hessian P H P with the preconditioner P H^-1 P (positive definite on the feasible
    directions) handles the constraints exactly, which the same inverse used as an L-BFGS initial
    Hessian does not (the projection wrecks its scale direction). The CG tolerance shrinks with the
    certified gap (superlinear local convergence); a non-positive curvature stops CG early
    (:func:`mfcli.pcg.pcg`, which falls back to -P H^-1 P g if it stops before its first step)."""
    import scipy.linalg

    lam, u = scipy.linalg.eigh(lower.T @ m @ lower, check_finite=False, overwrite_a=True)
    v = lower @ u
    den = lam[:, None] + lam[None, :]
    li = scipy.linalg.solve_triangular(lower, np.eye(st.n), lower=True, check_finite=False)
    xi = li.T @ li  # X^-1

    def hess(d: np.ndarray) -> np.ndarray:
        h = xi @ d @ m
        return st.tangent(h + h.T)

    def precond(r: np.ndarray) -> np.ndarray:
        return st.tangent(v @ ((v.T @ r @ v) / den) @ v.T)

    return pcg(hess, precond, -g, rtol=min(0.5, math.sqrt(max(gap, 0.0))), max_steps=NEWTON_CG).solution


def _two_loop(
    g: np.ndarray, ss: list[np.ndarray], ys: list[np.ndarray], x: np.ndarray | None, st: _Structure
) -> np.ndarray:
    """The L-BFGS direction -H g (two-loop recursion, Frobenius inner product) with the initial
    inverse Hessian D -> P(X D X) (identity when x is None), scaled by the usual gamma."""

    def h0(q: np.ndarray) -> np.ndarray:
        return q if x is None else st.tangent(x @ q @ x)

    q = g.copy()
    alphas = []
    for s, y in zip(reversed(ss), reversed(ys), strict=True):
        rho = 1.0 / float(np.vdot(y, s))
        alpha = rho * float(np.vdot(s, q))
        q -= alpha * y
        alphas.append((rho, alpha, s, y))
    r = h0(q)
    if ss:
        # <y, P(X y X)> = <y, X y X> = tr(Y X Y X) for the tangent y (P is an orthogonal
        # projection): one product instead of two.
        yx = ys[-1] @ x if x is not None else ys[-1]
        gamma = float(np.vdot(ss[-1], ys[-1]) / np.vdot(yx, yx.T))
    else:
        gamma = 1.0 / max(float(np.abs(r).max()), 1e-300) * 0.1
    q = r * gamma
    for rho, alpha, s, y in reversed(alphas):
        beta = rho * float(np.vdot(y, q))
        q += (alpha - beta) * s
    return -q


def strategy_from_gram(x: np.ndarray) -> np.ndarray:
    """Lower-triangular C with C^T C = X (reversed Cholesky: J X J = L L^T gives C = J L^T J)."""
    import scipy.linalg

    try:
        lower = scipy.linalg.cholesky(x[::-1, ::-1], lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise MfcliError("the optimal X is numerically singular; the workload is too ill-conditioned") from None
    return np.tril(np.ascontiguousarray(lower.T[::-1, ::-1]))


def _result(
    a: np.ndarray, st: _Structure, schema: Participation, x: np.ndarray, dual: float, *, start: float,
    iterations: int, tol: float, history: list[Progress],
) -> MultiSolveResult:
    """The answer from the final X: feasible by rescaling, its loss and schema sensitivity
    recomputed from the returned C and B."""
    x = st.normalize((x + x.T) / 2)
    strategy = strategy_from_gram(x)
    decoder = decoder_for(a, strategy)
    fact = Factorization(workload=a, strategy=strategy, decoder=decoder, causal=True).verify()
    sens = sensitivity(strategy, schema)
    if not sens.exact:  # cannot happen for these structures; refuse rather than print a bound as exact
        raise MfcliError(f"the schema sensitivity of the solution is not exact ({sens.method})")
    loss = sens.value**2 * float(np.sum(decoder * decoder))
    gap = (loss - dual) / loss
    return MultiSolveResult(
        factorization=fact, participation=schema, structure=st.name, sensitivity=sens.value, loss_total=loss,
        dual=dual, gap=gap, iterations=iterations, seconds=time.perf_counter() - start, tol=tol,
        converged=gap <= tol, history=history,
    )
