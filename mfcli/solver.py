"""The optimal factorization of a workload, with a duality-gap certificate (BRIEF section 4).

Problem: minimise tr(A^T A X^-1) over X > 0 with diag(X) <= 1, X = C^T C. For dual weights v > 0
let D = diag(v), H = D^1/2 A^T A D^1/2 = Q diag(lambda) Q^T and s = sqrt(lambda). Then

* the fixed-point map is phi(v) = diag(H^1/2) = (Q o Q) s; the optimum has phi(v) = v;
* every v gives a dual lower bound; the best rescaling of v gives sum(s)^2 / sum(v);
* every v gives a feasible primal: X(v) = D^-1/2 H^1/2 D^-1/2 with its columns normalised,
  X~ = Phi^-1/2 H^1/2 Phi^-1/2 (Phi = diag(phi)), whose loss tr(A^T A X~^-1) is an upper bound.

Both bounds are recomputed at every iterate from one symmetric eigendecomposition, whatever
produced the iterate, so acceleration cannot make the certificate dishonest: the relative gap
(U - L) / U reported at the end bounds how far the returned factorization is from optimal.

Methods:
    ``anderson`` (default): Anderson-accelerated fixed point in log(v), with a restart whenever
        the dual bound drops, so it never wanders far from the plain iteration's path.
    ``fixed-point``: the plain iteration v <- phi(v) of the seed paper, for reproduction and as
        the benchmark baseline.

Example:
    >>> from mfcli.workloads import prefix_workload
    >>> res = optimal_factorization(prefix_workload(2).matrix, tol=1e-10)
    >>> round(res.factorization.loss_total, 8)   # golden ratio squared
    2.61803399
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
import scipy.linalg

from mfcli.errors import MfcliError
from mfcli.factorization import Factorization, total_loss

METHODS = ("anderson", "fixed-point")


class Bounds(NamedTuple):
    """What one eigendecomposition at dual weights v certifies."""

    phi: np.ndarray  # fixed-point image diag(H^1/2)
    dual: float  # lower bound on the optimal loss
    primal: float  # loss of the column-normalised feasible X~(v)
    eigvecs: np.ndarray  # Q
    sqrt_eigvals: np.ndarray  # s


class Progress(NamedTuple):
    """One line of solver progress, passed to the callback after every iteration."""

    iteration: int
    primal: float  # best (smallest) feasible loss so far
    dual: float  # best (largest) lower bound so far
    gap: float  # (primal - dual) / primal
    seconds: float
    method: str


@dataclass(frozen=True, eq=False)
class SolveResult:
    """The certified optimum.

    Attributes:
        factorization: lower-triangular C (unit column norms) and B = A C^-1, verified A = B C.
        dual_weights: the v whose feasible primal was returned (warm-start state).
        primal: loss_total recomputed from the returned B and C.
        dual: best dual lower bound over all iterates.
        gap: (primal - dual) / primal, from the recomputed primal.
        converged: gap <= tol.
    """

    factorization: Factorization
    dual_weights: np.ndarray
    primal: float
    dual: float
    gap: float
    iterations: int
    seconds: float
    method: str
    tol: float
    converged: bool
    history: list[Progress] = field(default_factory=list, repr=False)

    def certificate(self) -> dict:
        """JSON-ready solver record (stored in artifacts as the ``solver`` attribute)."""
        return {
            "method": self.method,
            "tol": self.tol,
            "gap": self.gap,
            "primal": self.primal,
            "dual": self.dual,
            "iterations": self.iterations,
            "seconds": self.seconds,
            "converged": self.converged,
        }


def evaluate(gram: np.ndarray, v: np.ndarray) -> Bounds:
    """Bounds at dual weights v for the Gram matrix A^T A (one eigendecomposition)."""
    sv = np.sqrt(v)
    h = gram * sv[:, None]
    h *= sv[None, :]
    lam, q = scipy.linalg.eigh(h, overwrite_a=False, check_finite=False, driver="evd")
    # H is positive definite for a full-rank workload; clip round-off below zero.
    lam = np.maximum(lam, lam[-1] * 1e-300 if lam[-1] > 0 else 1e-300)
    s = np.sqrt(lam)
    phi = np.einsum("ij,ij,j->i", q, q, s)
    dual = float(s.sum() ** 2 / v.sum())
    # Primal of X~: tr(A^T A X~^-1) = tr(R H R H^-1/2) with R = diag(sqrt(phi / v)).
    r = np.sqrt(phi / v)
    h_inv_sqrt = (q / s) @ q.T
    h *= r[:, None]
    h *= r[None, :]
    primal = float(np.einsum("ij,ij->", h, h_inv_sqrt))
    return Bounds(phi, dual, primal, q, s)


def strategy_from_bounds(b: Bounds) -> np.ndarray:
    """Lower-triangular C with C^T C = X~ and unit column norms (reverse-order Cholesky)."""
    h_sqrt = (b.eigvecs * b.sqrt_eigvals) @ b.eigvecs.T
    w = 1.0 / np.sqrt(b.phi)
    x = h_sqrt * w[:, None] * w[None, :]
    x = 0.5 * (x + x.T)
    # P X P = L L^T  =>  C = P L^T P is lower-triangular with C^T C = X.
    try:
        lower = scipy.linalg.cholesky(x[::-1, ::-1], lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise MfcliError("the optimal X is numerically singular; the workload is too ill-conditioned") from None
    c = np.ascontiguousarray(lower.T[::-1, ::-1])
    return np.tril(c)


def decoder_for(workload: np.ndarray, strategy: np.ndarray) -> np.ndarray:
    """B = A C^-1 for lower-triangular C, by a triangular solve (C^T B^T = A^T)."""
    bt = scipy.linalg.solve_triangular(strategy, workload.T, lower=True, trans="T", check_finite=False)
    return np.tril(bt.T)


def dual_weights_from_strategy(workload: np.ndarray, strategy: np.ndarray) -> np.ndarray:
    """Recover dual weights from a strategy (warm start): at the optimum X D X = A^T A, whose
    diagonal gives (X o X) v = diag(A^T A)."""
    x = strategy.T @ strategy
    gram_diag = np.einsum("ij,ij->j", workload, workload)
    try:
        v = np.linalg.solve(x * x, gram_diag)
    except np.linalg.LinAlgError:
        v = gram_diag.copy()
    floor = 1e-8 * max(float(np.max(np.abs(v))), 1e-300)
    return np.where(np.isfinite(v) & (v > floor), v, floor)


def resample_weights(v: np.ndarray, n: int) -> np.ndarray:
    """Interpolate dual weights to a different n (warm start from a neighbouring size)."""
    v = np.asarray(v, dtype=np.float64)
    if v.shape[0] == n:
        return v.copy()
    src = (np.arange(v.shape[0]) + 0.5) / v.shape[0]
    dst = (np.arange(n) + 0.5) / n
    return np.exp(np.interp(dst, src, np.log(v)))


def optimal_factorization(
    workload: np.ndarray,
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
    method: str = "anderson",
    v0: np.ndarray | None = None,
    memory: int = 6,
    callback: Callable[[Progress], None] | None = None,
) -> SolveResult:
    """Solve for the optimal lower-triangular factorization of ``workload`` to relative gap ``tol``.

    Args:
        workload: n x n full-rank lower-triangular A (validate with
            :func:`mfcli.workloads.check_workload_matrix`).
        tol: stop when (primal - dual) / primal <= tol.
        max_iter: eigendecompositions at most; the result then carries the gap reached.
        method: ``anderson`` or ``fixed-point``.
        v0: starting dual weights (any positive vector; resampled if its length differs).
        memory: Anderson history length.
        callback: called with :class:`Progress` after every iteration (may raise to abort).

    Formal guarantees: the returned factorization satisfies A = B C to 1e-8 relative Frobenius
    error, C is lower-triangular with unit column norms (sensitivity 1), and its loss is within
    ``gap`` (relative) of the optimum over all factorizations with sensitivity 1.
    """
    if method not in METHODS:
        raise MfcliError(f"unknown solver method {method!r}; choose one of {', '.join(METHODS)}")
    if not (0 < tol < 1) or not math.isfinite(tol):
        raise MfcliError(f"tol must be in (0, 1), got {tol}")
    if max_iter < 1:
        raise MfcliError(f"max_iter must be at least 1, got {max_iter}")
    a = np.asarray(workload, dtype=np.float64)
    n = a.shape[0]
    gram = a.T @ a
    if v0 is None:
        v = np.ones(n)
    else:
        v = resample_weights(v0, n)
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise MfcliError("warm-start dual weights must be positive and finite")
    v = v / np.exp(np.mean(np.log(v)))

    start = time.perf_counter()
    best_dual = -math.inf
    best_primal = math.inf
    best: tuple[np.ndarray, Bounds] | None = None
    xs: list[np.ndarray] = []
    fs: list[np.ndarray] = []
    history: list[Progress] = []
    it = 0
    gap = math.inf
    for it in range(1, max_iter + 1):
        bnd = evaluate(gram, v)
        dual_dropped = bnd.dual < best_dual
        best_dual = max(best_dual, bnd.dual)
        if bnd.primal < best_primal:
            best_primal = bnd.primal
            best = (v, bnd)
        gap = (best_primal - best_dual) / best_primal
        prog = Progress(it, best_primal, best_dual, gap, time.perf_counter() - start, method)
        history.append(prog)
        if callback is not None:
            callback(prog)
        if gap <= tol:
            break
        if method == "fixed-point":
            v = bnd.phi
            continue
        # Anderson on g(x) = log phi(e^x), residual with its mean removed: the problem is
        # invariant to the scale of v, so only the direction of log v matters.
        x = np.log(v)
        f = np.log(bnd.phi / v)
        f -= f.mean()
        if dual_dropped:
            xs.clear()
            fs.clear()
        xs.append(x)
        fs.append(f)
        del xs[: -memory - 1], fs[: -memory - 1]
        if len(xs) > 1:
            dx = np.diff(np.array(xs), axis=0).T
            df = np.diff(np.array(fs), axis=0).T
            gamma = np.linalg.lstsq(df, f, rcond=None)[0]
            x_new = x + f - (dx + df) @ gamma
        else:
            x_new = x + f
        x_new -= x_new.mean()
        if not np.all(np.isfinite(x_new)) or np.max(np.abs(x_new)) > 700:
            xs.clear()
            fs.clear()
            x_new = x + f
            x_new -= x_new.mean()
        v = np.exp(x_new)

    assert best is not None
    v_best, bnd_best = best
    strategy = strategy_from_bounds(bnd_best)
    decoder = decoder_for(a, strategy)
    fact = Factorization(workload=a, strategy=strategy, decoder=decoder, causal=True).verify()
    primal = total_loss(decoder=decoder, strategy=strategy)
    gap_final = (primal - best_dual) / primal
    seconds = time.perf_counter() - start
    return SolveResult(
        factorization=fact,
        dual_weights=v_best,
        primal=primal,
        dual=best_dual,
        gap=gap_final,
        iterations=it,
        seconds=seconds,
        method=method,
        tol=tol,
        converged=gap_final <= tol,
        history=history,
    )
