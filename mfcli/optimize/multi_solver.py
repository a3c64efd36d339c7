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
(:mod:`mfcli.optimize.multi_fixed_epoch`, ``method="auto"``); the primal solver below handles BandMF, more
epochs, ``method="primal"``, and continues from the dual method's X if that stops short of ``tol``.
The primal solver minimises f over the feasible affine set by L-BFGS (gradient -X^-1 A^T A X^-1 projected onto
the set's directions, backtracking on positive definiteness and sufficient decrease; near the
optimum, truncated Newton steps by preconditioned conjugate gradients instead) and takes
the dual candidate from the same gradient: W = P(X^-1 A^T A X^-1), the projection onto the dual
support, shifted by t I (t >= 0; still a valid W) until it is positive definite. The bound is
evaluated with the singular values of A R (R the Cholesky factor of W), as the single-participation
certificate is. The returned gap compares it with the loss recomputed from the returned B and C.

Example (k = 2 epochs of 4 steps of the prefix sum):
    >>> from mfcli.model.participation import FixedEpoch
    >>> from mfcli.model.workloads import prefix_workload
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

import mfcli.optimize.multi_banded as multi_banded
from mfcli.errors import MfcliError
from mfcli.model.factorization import Factorization
from mfcli.model.participation import Participation, sensitivity
from mfcli.optimize.dense import Progress, auto_threads, blas_threads, certificate_record, decoder_for
from mfcli.optimize.lbfgs import Certificates, Memory, backtrack, memory_size
from mfcli.optimize.multi_fixed_epoch import DUAL_METHOD
from mfcli.optimize.multi_fixed_epoch import MAX_EPOCHS as FE_MAX_EPOCHS
from mfcli.optimize.multi_fixed_epoch import applicable as fixed_epoch_applicable
from mfcli.optimize.multi_structure import Structure, certify
from mfcli.optimize.pcg import pcg

#: Certified gap below which the solver switches from L-BFGS to truncated Newton steps
#: (:func:`_newton_direction`). Far from the optimum the Newton steps are heavily damped, so the
#: cheaper L-BFGS iterations get there first.
NEWTON_GAP = 0.3
#: Conjugate-gradient iterations at most per Newton step.
NEWTON_CG = 50
#: ``storage="auto"`` keeps BandMF iterates in band storage (:mod:`mfcli.optimize.multi_banded`) from this n
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
        sensitivity: the schema sensitivity of C, recomputed by :func:`mfcli.model.participation.sensitivity`
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
        if dual:  # the dual Newton method of mfcli.optimize.multi_fixed_epoch, then maybe the primal solver
            method = DUAL_METHOD + ("" if len(dual) == len(self.history) else f"+{method}")
        return certificate_record(
            method=method, structure=self.structure, tol=self.tol, gap=self.gap, primal=self.loss_total,
            dual=self.dual, sensitivity=self.sensitivity, iterations=self.iterations, seconds=self.seconds,
            converged=self.converged, coarse_iterations=self.coarse_iterations, threads=self.threads)


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
        participation: :class:`~mfcli.model.participation.FixedEpoch` or
            :class:`~mfcli.model.participation.MinSeparation` (BandMF with b = separation bands).
        tol: stop at this relative gap (primal - dual) / primal.
        max_iter: L-BFGS iterations at most; the result then carries the gap reached.
        dual_every: iterations between dual certificates (each one Cholesky and one SVD).
        callback: called with :class:`~mfcli.optimize.dense.Progress` after each certificate.
        threads: BLAS threads (as :func:`mfcli.optimize.dense.optimal_factorization`); ``"auto"`` runs
            band storage on one thread (measured faster there on any load).
        x0: a feasible starting X (tests); default the scaled identity, or for band storage the
            coarse-to-fine start (:func:`mfcli.optimize.multi_banded.coarse_start`).
        precondition: L-BFGS initial inverse Hessian D -> P(X D X) (the affine-invariant metric
            of the positive definite cone; P the projection onto feasible directions) instead of
            the identity. Speed only: the certificate is the same.
        newton_gap: once a certified gap is at most this, take truncated Newton steps
            (:func:`_newton_direction`, a certificate after each) instead of L-BFGS steps; 0 never.
            Speed only: the certificate is the same.
        storage: ``"banded"`` keeps the BandMF iterate in band storage (:mod:`mfcli.optimize.multi_banded`,
            O(n^2 b) per L-BFGS iteration and per Newton-CG step, certificates only once the primal
            stalls); ``"dense"`` the n x n iterate of this module; ``"auto"`` banded for BandMF
            with k > 1, n >= ``BANDED_MIN_N`` and b <= n / ``BANDED_MIN_RATIO`` (where it measured
            faster), else dense. Speed only: the certificate is the same.
        method: fixed-epoch only: ``"dual"`` Newton on the block-structured dual
            (:mod:`mfcli.optimize.multi_fixed_epoch`, for k <= ``MAX_EPOCHS`` epochs; if it stops short of
            ``tol`` the primal solver continues from its X); ``"primal"`` the L-BFGS / truncated
            Newton solver of this module; ``"auto"`` dual where it applies and no ``x0`` is given.
            Speed only: the certificate is the same.

    Formal guarantees: A = B C to 1e-8 relative; C lower-triangular; ``sensitivity`` is the
    schema sensitivity of C recomputed by :func:`mfcli.model.participation.sensitivity`, which is exact
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
    st = Structure(n, participation)
    limit = auto_threads() if threads == "auto" else threads
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise MfcliError(f"threads must be a positive integer, None or 'auto', got {threads!r}")
    if storage not in ("auto", "dense", "banded"):
        raise MfcliError(f"storage must be 'auto', 'dense' or 'banded', got {storage!r}")
    band_ok = st.banded
    if storage == "banded" and not band_ok:
        raise MfcliError("banded storage needs a min-separation schema with more than one participation")
    if method not in ("auto", "dual", "primal"):
        raise MfcliError(f"method must be 'auto', 'dual' or 'primal', got {method!r}")
    dual_ok = st.name == "fixed-epoch" and fixed_epoch_applicable(n, n // len(st.count))
    if method == "dual" and not dual_ok:
        raise MfcliError(f"the dual method needs a fixed-epoch schema with at most {FE_MAX_EPOCHS} epochs")
    use_dual = method == "dual" or (method == "auto" and dual_ok and x0 is None)
    use_band = storage == "banded" or (
        storage == "auto" and band_ok and n >= BANDED_MIN_N and BANDED_MIN_RATIO * st.bands <= n)
    if threads == "auto" and use_band:
        # The band path is hundreds of sequential (b + 2p)-sized block products, which OpenBLAS
        # splits across threads at a loss: at n = 2048, 64 bands, on 2 idle cores, one thread
        # took 15.5 s (prefix) and 30.2 s (momentum) wall, two threads 25.9 s and 48.2 s.
        limit = 1
    with blas_threads(limit):
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
    a: np.ndarray, st: Structure, schema: Participation, *, tol: float, max_iter: int,
    callback: Callable[[Progress], None] | None, fallback: dict,
) -> MultiSolveResult:
    """Newton on the fixed-epoch dual (:mod:`mfcli.optimize.multi_fixed_epoch`); if its certified gap (from
    the loss recomputed from B and C) misses ``tol``, the primal solver continues from its X and
    the better of the two certified bounds is kept (both are valid lower bounds)."""
    from mfcli.optimize.multi_fixed_epoch import solve_dual

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


def _solve_in_band(
    a: np.ndarray, st: Structure, schema: Participation, *, tol: float, max_iter: int,
    callback: Callable[[Progress], None] | None, x0: np.ndarray | None,
) -> MultiSolveResult:
    start = time.perf_counter()
    memory = memory_size(a.size)
    band0, levels = (None, []) if x0 is not None else multi_banded.coarse_start(a, st, memory=memory)
    # Through the module, not a name bound at import: tests substitute mfcli.optimize.multi_banded.solve_banded.
    x, best_dual, it, history = multi_banded.solve_banded(
        a, st, tol=tol, max_iter=max_iter, callback=callback, x0=x0, memory=memory, start_band=band0)
    res = _result(a, st, schema, x, best_dual * st.scale, start=start, iterations=it, tol=tol, history=history)
    return dataclasses.replace(res, coarse_iterations=tuple(levels))


def _dot(p: np.ndarray, q: np.ndarray) -> float:
    """The Frobenius inner product of two n x n iterates."""
    return float(np.vdot(p, q))


def _solve(
    a: np.ndarray, st: Structure, schema: Participation, *, tol: float, max_iter: int, dual_every: int,
    callback: Callable[[Progress], None] | None, x0: np.ndarray | None, precondition: bool, newton_gap: float,
) -> MultiSolveResult:
    start = time.perf_counter()
    x = st.normalize(np.array(x0, dtype=np.float64)) if x0 is not None else st.start()
    f, factors = _value(a, x)
    if factors is None:
        raise MfcliError("the starting X is not positive definite")
    m = _gradient(factors)
    g = st.tangent(-m)
    pairs = Memory(memory_size(x.size), _dot)
    certs = Certificates(st.scale, callback, start)
    history = certs.history
    it = 0
    for it in range(1, max_iter + 1):
        newton = newton_gap > 0 and bool(history) and history[-1].gap <= newton_gap
        if it == 1 or it % dual_every == 0 or newton:
            gap = certs.record(it, f, certify(a, st, m), ("newton-" if newton else "lbfgs-") + st.name)
            if gap <= tol:
                break
        if newton:
            d = _newton_direction(x, m, g, factors[0], st, history[-1].gap)
        else:
            d = _lbfgs_direction(pairs, g, x if precondition else None, st)
        slope = _dot(g, d)
        if slope >= 0:  # not a descent direction: restart from the gradient
            pairs.clear()
            d = -g * (1.0 / max(float(np.abs(g).max()), 1e-300)) * 0.1
            slope = _dot(g, d)
        found = backtrack(lambda trial: _value(a, trial), x, d, f, slope)
        if found is None:
            break  # no decrease possible at this precision: the round-off floor
        x_new, f_new, new_factors = found
        m_new = _gradient(new_factors)
        g_new = st.tangent(-m_new)
        pairs.push(x_new - x, g_new - g)
        x, f, m, g = x_new, f_new, m_new, g_new
        factors = new_factors
    else:
        certs.add(certify(a, st, m))
    if not history or history[-1].iteration != it:
        certs.add(certify(a, st, m))
    return _result(a, st, schema, x, certs.best * st.scale, start=start, iterations=it, tol=tol, history=history)


def _lbfgs_direction(pairs: Memory, g: np.ndarray, x: np.ndarray | None, st: Structure) -> np.ndarray:
    """The L-BFGS direction -H g with the initial inverse Hessian D -> P(X D X) (identity when x
    is None), scaled by the usual gamma."""

    def h0(q: np.ndarray) -> np.ndarray:
        return q if x is None else st.tangent(x @ q @ x)

    def curvature(y: np.ndarray) -> float:
        # <y, P(X y X)> = <y, X y X> = tr(Y X Y X) for the tangent y (P is an orthogonal
        # projection): one product instead of two.
        yx = y @ x if x is not None else y
        return float(np.vdot(yx, yx.T))

    return pairs.direction(g, h0, curvature, lambda r: 1.0 / max(float(np.abs(r).max()), 1e-300) * 0.1)


def _newton_direction(
    x: np.ndarray, m: np.ndarray, g: np.ndarray, lower: np.ndarray, st: Structure, gap: float
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
    (:func:`mfcli.optimize.pcg.pcg`, which falls back to -P H^-1 P g if it stops before its first step)."""
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


def strategy_from_gram(x: np.ndarray) -> np.ndarray:
    """Lower-triangular C with C^T C = X (reversed Cholesky: J X J = L L^T gives C = J L^T J)."""
    import scipy.linalg

    try:
        lower = scipy.linalg.cholesky(x[::-1, ::-1], lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise MfcliError("the optimal X is numerically singular; the workload is too ill-conditioned") from None
    return np.tril(np.ascontiguousarray(lower.T[::-1, ::-1]))


def _result(
    a: np.ndarray, st: Structure, schema: Participation, x: np.ndarray, dual: float, *, start: float,
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
