"""The optimal factorization of a workload, with a duality-gap certificate (docs/concepts.md).

Problem: minimise tr(A^T A X^-1) over X > 0 with diag(X) <= 1, X = C^T C. For dual weights v > 0
let D = diag(v), H = D^1/2 A^T A D^1/2 = Q diag(lambda) Q^T and s = sqrt(lambda). Then

* the fixed-point map is phi(v) = diag(H^1/2) = (Q o Q) s; the optimum has phi(v) = v;
* every v gives a dual lower bound; the best rescaling of v gives sum(s)^2 / sum(v);
* every v gives a feasible primal: X(v) = D^-1/2 H^1/2 D^-1/2 with its columns normalised,
  X~ = Phi^-1/2 H^1/2 Phi^-1/2 (Phi = diag(phi)), whose loss tr(A^T A X~^-1) is an upper bound.

Both bounds are estimated at every iterate from one symmetric eigendecomposition, whatever
produced the iterate, so acceleration cannot make the certificate dishonest. The certificate
itself is recomputed more carefully: the primal is the loss of the returned B and C, and the
dual comes from the singular values of A D^1/2 (:func:`certified_dual`), because the
eigenvalues of the explicitly formed H lose the small s to round-off (~1e-9 relative on
momentum workloads, and the best of many noisy iterates picks the upward errors). The relative
gap (U - L) / U reported at the end bounds how far the returned factorization is from optimal.

Methods:
    ``newton`` (default): Newton's method on the concave dual f(v) = 2 tr(H^1/2) - sum(v), with
        a preconditioned Hessian and a coarse-to-fine start (below). A handful of full-size
        eigendecompositions reach gap 1e-6 where the plain iteration needs hundreds.
    ``anderson``: Anderson-accelerated fixed point in log(v), with a restart whenever the dual
        bound drops, so it never wanders far from the plain iteration's path.
    ``fixed-point``: the plain iteration v <- phi(v) of Denisov et al. 2022, for reproduction and as
        the benchmark baseline.

The Newton step. In x = log v the gradient of f is phi - v, and the Hessian of f in v, written
in the variable u = dv / v, is -T with (Daleckii-Krein, d^2 tr(M^1/2) for M = A D A^T)

    T = sum_ij w_ij (q_i o q_j)(q_i o q_j)^T,   w_ij = s_i s_j / (s_i + s_j) = 1 / (1/s_i + 1/s_j),

q_i the eigenvectors of H. Forming T exactly costs O(n^4). Writing the kernel as an exponential
sum, 1/x ~ sum_r c_r exp(-t_r x) (relative error a few per cent on the range of x = 1/s_i +
1/s_j, fitted once per range by least squares), makes it a short sum of Hadamard squares,

    T ~ sum_r c_r P_r o P_r,   P_r = Q diag(exp(-t_r / s)) Q^T,

each P_r one rank-truncated float32 SYRK (columns with exp(-t_r / s_i) ~ 0 are dropped). Since
w, and so every entry of T, is a positive combination, a relative kernel error e gives
(1 - e) T <= T~ <= (1 + e) T: the step is Newton's up to a factor 1 +- e, so convergence is
quadratic until the e-limited linear rate takes over. The step solves T~ dx = phi - v
(Jacobi-scaled float32 Cholesky) and moves v <- v (1 + dx) where dx > 0, v <- v exp(dx) where
dx < 0 (the v-space Newton step, kept positive). The dual is rescaled to its best multiple
after every eigendecomposition (free: H(c v) = c H(v)), and a step whose dual falls is halved.

Coarse-to-fine start. For n >= 256 the solver first solves coarser problems whose steps are
merged in pairs (Gram matrix P^T A^T A P, P summing adjacent columns), halving until fewer
than 256 steps remain, each to a Newton-decrement tolerance, and interpolates log v to the
next size. A coarse level costs
an eighth of the next; the full-size problem then starts at gap ~1e-3 and needs 2-4
eigendecompositions. Coarse iterations certify nothing and are reported separately.

Example:
    >>> from mfcli.model.workloads import prefix_workload
    >>> res = optimal_factorization(prefix_workload(2).matrix, tol=1e-10)
    >>> round(res.factorization.loss_total, 8)   # golden ratio squared
    2.61803399
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from mfcli.errors import MfcliError
from mfcli.model.factorization import Factorization, total_loss
from mfcli.util.blas import blas_threads

# scipy.linalg is imported inside the functions that use it, not here: `mfcli optimize --help`
# and `mfcli compare --help` import this module for option defaults and need no scipy.

METHODS = ("newton", "anderson", "fixed-point")
DEFAULT_METHOD = "newton"
#: The dense solver's stopping rule (:func:`optimal_factorization`; ``optimize`` and ``compare``
#: when --tol / --max-iter are not given): relative duality gap, full-size iterations.
DEFAULT_TOL = 1e-6
DEFAULT_MAX_ITER = 1000

#: Coarse-to-fine start: used for n >= 2 * COARSE_MIN_N; the coarsest level has between
#: COARSE_MIN_N and 2 * COARSE_MIN_N steps.
COARSE_MIN_N = 128
#: Relative Newton decrement at which a coarse level hands over to the next, and the most
#: eigendecompositions one coarse level may use.
COARSE_TOL = 1e-4
COARSE_MAX_ITER = 40


# BLAS threads. LAPACK decompositions (eigh, SVD, Cholesky) spend much of their time in
# level-2 BLAS that synchronises the BLAS threads once per column, and small BLAS calls
# synchronise on every call. On a machine where other processes hold the cores, a descheduled
# BLAS thread stalls each of those steps. Measured with OpenBLAS on 2 cores under load ~8:
# eigh at n = 2048 took 20 s with 2 threads and 3.5 s with 1, Cholesky 8.7 s vs 0.44 s, and a
# whole n = 256 solve 15 s vs 0.16 s; GEMM/SYRK at n = 2048 were unaffected (0.60 s vs 0.67 s).
# On an idle machine 2 threads are faster (eigh 1.0 s vs 1.45 s). Hence ``threads="auto"``.


def auto_threads() -> int | None:
    """1 when the machine is busy (1-minute load average above CPUs - 1), else None (the BLAS
    default). A speed heuristic only: results do not depend on it."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    cpus = os.cpu_count() or 1
    return 1 if load > cpus - 1 else None


class Bounds(NamedTuple):
    """What one eigendecomposition at dual weights v tells (estimates of both bounds)."""

    phi: np.ndarray  # fixed-point image diag(H^1/2)
    dual: float  # sum(s)^2 / sum(v): the lower bound, with eigh's round-off in small s
    primal: float  # loss of the column-normalised feasible X~(v) (nan if not computed)
    eigvecs: np.ndarray  # Q
    sqrt_eigvals: np.ndarray  # s


class Progress(NamedTuple):
    """One line of solver progress, passed to the callback after every full-size iteration, and
    by solvers with a coarse-to-fine start (:mod:`mfcli.optimize.multi_fixed_epoch`) after each step on a
    coarse level too: such an event has a non-empty ``stage`` naming the level, its iteration
    counts that level's steps, and primal, dual and gap are NaN (a coarse problem bounds nothing
    about the real one). Coarse events never enter a solve's ``history``."""

    iteration: int
    primal: float  # best (smallest) feasible loss so far (eigh-based estimate)
    dual: float  # best (largest) lower bound so far (eigh-based estimate)
    gap: float  # (primal - dual) / primal
    seconds: float
    method: str
    stage: str = ""  # "" for the full-size problem; else the coarse level, in words


@dataclass(frozen=True, eq=False)
class SolveResult:
    """The certified optimum.

    Attributes:
        factorization: lower-triangular C (unit column norms) and B = A C^-1, verified A = B C.
        dual_weights: the v whose feasible primal was returned (warm-start state).
        primal: loss_total recomputed from the returned B and C.
        dual: certified dual lower bound (:func:`certified_dual`, best over the iterates where
            it was computed).
        gap: (primal - dual) / primal, from the recomputed primal.
        iterations: full-size eigendecompositions.
        converged: gap <= tol.
        coarse_iterations: ``newton`` only: (n, eigendecompositions) for each coarse level of
            the multilevel start, coarsest first (empty when it was not used).
        threads: the BLAS thread limit the solve ran with (None: the BLAS default).
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
    coarse_iterations: tuple[tuple[int, int], ...] = ()
    threads: int | None = None

    def certificate(self) -> dict:
        """JSON-ready solver record (stored in artifacts as the ``solver`` attribute)."""
        return certificate_record(
            method=self.method, tol=self.tol, gap=self.gap, primal=self.primal, dual=self.dual,
            iterations=self.iterations, seconds=self.seconds, converged=self.converged,
            coarse_iterations=self.coarse_iterations, threads=self.threads)


def certificate_record(
    *, method: str, tol: float, gap: float, primal: float, dual: float, iterations: int, seconds: float,
    converged: bool, coarse_iterations: tuple[tuple[int, int], ...] = (), threads: int | None = None,
    structure: str | None = None, sensitivity: float | None = None,
) -> dict:
    """The JSON-ready solver record of a certified solve (an artifact's ``solver`` attribute), one
    layout for the single-participation solver and the multi-participation ones (which add the
    ``structure`` of the feasible set and the schema ``sensitivity``). Optional keys are omitted,
    not null: ``coarse_iterations`` when no coarse start ran, ``blas_threads`` when the BLAS
    default was used."""
    cert: dict = {"method": method}
    if structure is not None:
        cert["structure"] = structure
    cert.update(tol=tol, gap=gap, primal=primal, dual=dual)
    if sensitivity is not None:
        cert["sensitivity"] = sensitivity
    cert.update(iterations=iterations, seconds=seconds, converged=converged)
    if coarse_iterations:
        cert["coarse_iterations"] = [list(level) for level in coarse_iterations]
    if threads is not None:
        cert["blas_threads"] = threads
    return cert


def evaluate(gram: np.ndarray, v: np.ndarray, *, primal: bool = True) -> Bounds:
    """Bounds at dual weights v for the Gram matrix A^T A (one eigendecomposition).

    The primal is tr(A^T A X~^-1) = tr(R H R H^-1/2) with R = diag(sqrt(phi / v)); in the
    eigenbasis, with M = Q^T R Q, it is sum_ij M_ij^2 s_j^2 / s_i, a sum of non-negative terms
    (no cancellation) that costs one SYRK. ``primal=False`` skips it (coarse levels).
    """
    import scipy.linalg

    sv = np.sqrt(v)
    h = gram * sv[:, None]
    h *= sv[None, :]
    # H is symmetric: hand LAPACK a Fortran-ordered view so that it works in place (no copy).
    h = h if h.flags.f_contiguous else h.T
    lam, q = scipy.linalg.eigh(h, overwrite_a=True, check_finite=False, driver="evd")
    del h
    # H is positive definite for a full-rank workload; clip round-off below zero.
    lam = np.maximum(lam, lam[-1] * 1e-300 if lam[-1] > 0 else 1e-300)
    s = np.sqrt(lam)
    phi = np.einsum("ij,ij,j->i", q, q, s)
    dual = float(s.sum() ** 2 / v.sum())
    value = math.nan
    if primal:
        y = q * ((phi / v) ** 0.25)[:, None]
        m = scipy.linalg.blas.dsyrk(1.0, y, trans=1, lower=0)  # upper triangle of Q^T R Q
        del y
        m *= m
        u, w = 1.0 / s, lam
        value = float(u @ (m @ w) + w @ (m @ u) - np.sum(np.diag(m) * u * w))
    return Bounds(phi, dual, value, q, s)


def certified_dual(workload: np.ndarray, v: np.ndarray, eigvecs: np.ndarray | None = None) -> float:
    """The dual bound sum(s)^2 / sum(v) with sum(s) = ||A D^1/2||_* (nuclear norm) obtained
    without the eigenvalues of the explicitly formed H = (A D^1/2)^T (A D^1/2).

    Why: forming H squares the condition number, so eigh gets a small eigenvalue lambda only to
    an absolute error ~ eps lambda_max and sqrt(lambda) to ~ sqrt(eps lambda_max). On a momentum
    workload with a cooldown schedule (n = 300) that moved sum(s) by 3e-9 relative, and taking
    the best of many noisy iterates picks the upward errors.

    Route 1 (``eigvecs`` given, the Q of the eigendecomposition at v): Y = A D^1/2 Q, column
    norms d_i, normalised Gram N^T N = I + F. For Z = Y D^-1 (I - F/2),
    Z^T Z = I - 3F^2/4 + F^3/4 has norm <= 1 whenever ||F||_2 <= 3, so by the duality of
    spectral and nuclear norms ||A D^1/2||_* >= tr(Z^T Y) = sum_i d_i (1 - sum_j F_ij^2 / 2).
    Column norms and normalised inner products are computed to ~n eps relative accuracy
    however small the column, and the bound is below the truth by O(d F^2) only: one TRMM and
    one SYRK (about a quarter of an eigendecomposition).
    Route 2 (no eigvecs, or ||F||_F > 1): the singular values of A D^1/2 (LAPACK gesdd), each
    to ~n eps s_max absolute; about two eigendecompositions.
    Both are valid to ~n eps relative, far below any useful tol.
    """
    import scipy.linalg

    a = np.asarray(workload, dtype=np.float64)
    sv = np.sqrt(v)
    if eigvecs is not None:
        y = scipy.linalg.blas.dtrmm(1.0, a, eigvecs * sv[:, None], lower=1)  # A D^1/2 Q
        d = np.sqrt(np.einsum("ij,ij->j", y, y))
        if np.all(np.isfinite(d)) and np.all(d > 0):
            y /= d[None, :]
            f = scipy.linalg.blas.dsyrk(1.0, y, trans=1, lower=0)  # upper triangle of N^T N
            del y
            np.fill_diagonal(f, 0.0)
            f *= f
            row = f.sum(axis=0) + f.sum(axis=1)  # sum_j F_ij^2 (F symmetric, upper stored)
            del f
            if np.all(np.isfinite(row)) and float(row.sum()) <= 1.0:
                nuclear = float(np.sum(d * (1.0 - 0.5 * row)))
                return nuclear * nuclear / float(v.sum())
    k = a * sv[None, :]
    sigma = scipy.linalg.svdvals(k, overwrite_a=True, check_finite=False)
    return float(sigma.sum() ** 2 / v.sum())


def _rescaled(b: Bounds, v: np.ndarray) -> tuple[np.ndarray, Bounds]:
    """Move v to its best multiple c v, c = (sum s / sum v)^2 (H(c v) = c H(v): no new
    eigendecomposition). There the unscaled dual 2 sum(s) - sum(v) equals the scaled bound."""
    c = (float(b.sqrt_eigvals.sum()) / float(v.sum())) ** 2
    rc = math.sqrt(c)
    return v * c, b._replace(phi=b.phi * rc, sqrt_eigvals=b.sqrt_eigvals * rc)


@lru_cache(maxsize=128)
def exp_sum(log_range: float, terms: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Weights c >= 0 and rates t with sum_r c_r exp(-t_r y) ~ 1/y on [1, e^log_range].

    Rates are geometric; their span is chosen among a few offsets and the weights are the
    least-squares fit of the relative error on a log grid. Returns (c, t, max relative error).
    """
    span = max(log_range, 1.0)
    y = np.exp(np.linspace(0.0, span, 400))
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    for lo in (0.0, 0.5, 1.0, 1.5):
        for hi in (0.0, 0.5, 1.0, 1.5):
            t = np.exp(np.linspace(-span - lo, hi, terms))
            basis = np.exp(-np.outer(y, t)) * y[:, None]
            c = np.linalg.lstsq(basis, np.ones_like(y), rcond=None)[0]
            c = np.maximum(c, 0.0)
            err = float(np.max(np.abs(basis @ c - 1.0)))
            if best is None or err < best[2]:
                best = (c, t, err)
    assert best is not None
    return best


def _kernel_terms(log_range: float) -> int:
    """Exponential-sum length for a kernel range: about 2-4 % relative error."""
    return int(min(16, max(4, round(0.75 * log_range + 1.0))))


class KernelSum(NamedTuple):
    """sum_r c_r exp(-t_r x / x_min) ~ 1/x on the kernel's range x = 1/s_i + 1/s_j >= x_min (what
    :func:`dual_hessian` and the fixed-epoch dual's Hessian expand w_ij = 1 / (1/s_i + 1/s_j) in)."""

    coef: np.ndarray  # c
    rates: np.ndarray  # t
    x_min: float  # 2 / max(s), the smallest x
    s_safe: np.ndarray  # s with its tiny entries raised to max(s) 1e-14 (the range the fit covers)


def kernel_sum(s: np.ndarray, terms: int | None, default_terms: Callable[[float], int]) -> KernelSum:
    """The exponential sum of the kernel 1 / (1/s_i + 1/s_j) for the spectrum ``s``: its range
    (log of max(s) / min(s), in quarters, min(s) floored at 1e-14 max(s)) fitted by
    :func:`exp_sum` with ``terms`` terms, or ``default_terms(log_range)`` (each solver sets its
    own accuracy)."""
    s_max = float(s.max())
    s_lo = max(float(s.min()), s_max * 1e-14)
    x_min = 2.0 / s_max
    log_range = math.ceil(math.log(s_max / s_lo) * 4.0) / 4.0
    k = terms if terms is not None else default_terms(log_range)
    c, t, _ = exp_sum(log_range, k)
    return KernelSum(c, t, x_min, np.maximum(s, s_lo))


def dual_hessian(q: np.ndarray, s: np.ndarray, *, terms: int | None = None) -> np.ndarray:
    """Approximate T (minus the Hessian of the dual in u = dv/v), upper triangle, float32.

    T = sum_ij w_ij (q_i o q_j)(q_i o q_j)^T with w_ij = 1 / (1/s_i + 1/s_j), approximated by an
    exponential sum of the kernel (module docstring). Entries are non-negative sums, so float32
    keeps each to ~1e-6 relative accuracy.
    """
    import scipy.linalg

    c, t, x_min, s_safe = kernel_sum(s, terms, _kernel_terms)
    n = q.shape[0]
    q32 = q.astype(np.float32)
    acc = np.zeros((n, n), dtype=np.float32)
    for cr, tr in zip(c, t, strict=True):
        if cr <= 0.0:
            continue
        tau = tr / x_min
        e = np.exp(-tau / s_safe)
        # exp(-tau/s_i) < 6e-6 leaves every pair term below ~1e-4 of w_ij: drop the column.
        cols = np.nonzero(e > 6e-6)[0]
        if cols.size == 0:
            continue
        y = q32[:, cols] * np.sqrt(e[cols] * math.sqrt(cr / x_min)).astype(np.float32)
        p = scipy.linalg.blas.ssyrk(1.0, y, trans=0, lower=0)
        del y
        p *= p
        acc += p
        del p
    return acc


def newton_direction(b: Bounds, v: np.ndarray, *, terms: int | None = None) -> tuple[np.ndarray, float] | None:
    """Newton direction dx (in u = dv/v) for the dual at v and the relative Newton decrement
    (g . dx) / (2 f), an estimate of the dual's relative distance to the optimum.

    Returns None when the approximate Hessian cannot be factorised (the caller falls back to a
    fixed-point step)."""
    import scipy.linalg

    grad = b.phi - v
    t = dual_hessian(b.eigvecs, b.sqrt_eigvals, terms=terms)
    d = np.diag(t).astype(np.float64)
    if not np.all(np.isfinite(d)) or np.any(d <= 0):
        return None
    scale = (1.0 / np.sqrt(d)).astype(np.float32)
    t *= scale[:, None]
    t *= scale[None, :]
    try:
        factor = scipy.linalg.cho_factor(t, lower=False, overwrite_a=True, check_finite=False)
        y = scipy.linalg.cho_solve(factor, (grad * scale).astype(np.float32), check_finite=False)
    except (np.linalg.LinAlgError, ValueError):
        return None
    dx = y.astype(np.float64) * scale
    if not np.all(np.isfinite(dx)):
        return None
    f = 2.0 * float(b.sqrt_eigvals.sum()) - float(v.sum())
    decrement = float(grad @ dx) / (2.0 * abs(f)) if f != 0 else math.inf
    return dx, decrement


def _log_step(dx: np.ndarray, limit: float = 4.0) -> np.ndarray:
    """log(v_new / v) for the v-space step v (1 + dx), applied multiplicatively where dx < 0,
    shortened uniformly so that no weight moves by more than e^limit."""
    step = np.where(dx > 0, np.log1p(np.maximum(dx, 0.0)), dx)
    big = float(np.max(np.abs(step)))
    if big > limit:
        step *= limit / big
    return step


def coarsen_gram(gram: np.ndarray) -> np.ndarray:
    """P^T G P with P summing adjacent steps (2i, 2i+1): the Gram matrix of the workload whose
    noise is shared by pairs of steps. Positive definite whenever G is."""
    n = gram.shape[0]
    if n % 2:
        gram = np.pad(gram, ((0, 1), (0, 1)))
    return gram[0::2, 0::2] + gram[1::2, 0::2] + gram[0::2, 1::2] + gram[1::2, 1::2]


def strategy_from_bounds(b: Bounds) -> np.ndarray:
    """Lower-triangular C with C^T C = X~ and unit column norms (reverse-order Cholesky)."""
    import scipy.linalg

    y = b.eigvecs * np.sqrt(b.sqrt_eigvals)
    x = scipy.linalg.blas.dsyrk(1.0, y)  # upper triangle of H^1/2 = Q S Q^T
    del y
    w = 1.0 / np.sqrt(b.phi)
    x *= w[:, None]
    x *= w[None, :]
    # P X P = L L^T  =>  C = P L^T P is lower-triangular with C^T C = X. The reversed upper
    # triangle of X is the lower triangle of P X P, the only one the factorisation reads.
    try:
        lower = scipy.linalg.cholesky(x[::-1, ::-1], lower=True, overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError:
        raise MfcliError("the optimal X is numerically singular; the workload is too ill-conditioned") from None
    del x
    c = np.ascontiguousarray(lower.T[::-1, ::-1])
    del lower
    return np.tril(c)


def decoder_for(workload: np.ndarray, strategy: np.ndarray) -> np.ndarray:
    """B = A C^-1 for lower-triangular C, by a triangular solve (C^T B^T = A^T)."""
    import scipy.linalg

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


def warm_start_weights(artifact: Any, workload: np.ndarray) -> np.ndarray:
    """Dual weights to start a solve for ``workload`` from an earlier artifact, already read by the
    caller (an :class:`~mfcli.io.artifact.Artifact`: ``warm_start_weights(load_artifact(path), A)``;
    the optimisers never open files).

    The artifact's stored solver dual weights if it has them (any n: the solver resamples them
    to the workload's size), else weights recovered from its strategy by
    :func:`dual_weights_from_strategy`, which needs the same n. A warm start only changes where
    the iteration begins; the result is certified by its own duality gap either way.

    Raises:
        MfcliError: it has no dual weights and another n.
        TypeError: ``artifact`` is not a loaded dense artifact (no dual weights, n and factorization).
    """
    if not all(hasattr(artifact, name) for name in ("dual_weights", "n", "factorization")):
        raise TypeError(f"artifact must be a loaded Artifact (mfcli.io.artifact.load_artifact), "
                        f"got {type(artifact).__name__}")
    art = artifact
    if art.dual_weights is not None:
        return np.array(art.dual_weights, dtype=np.float64)
    a = np.asarray(workload, dtype=np.float64)
    if art.n != a.shape[0]:
        raise MfcliError(
            f"warm start from an artifact without dual weights needs the same n "
            f"(the artifact has n = {art.n}, the workload n = {a.shape[0]})"
        )
    return dual_weights_from_strategy(a, art.factorization.strategy)


def resample_weights(v: np.ndarray, n: int) -> np.ndarray:
    """Interpolate dual weights to a different n (warm start from a neighbouring size)."""
    v = np.asarray(v, dtype=np.float64)
    if v.shape[0] == n:
        return v.copy()
    src = (np.arange(v.shape[0]) + 0.5) / v.shape[0]
    dst = (np.arange(n) + 0.5) / n
    return np.exp(np.interp(dst, src, np.log(v)))


class _NewtonWalker:
    """Newton iterates with the dual safeguard: a trial whose (scaled) dual falls below the
    last accepted one is replaced by half the step; after a few halvings, a fixed-point step."""

    MAX_HALVINGS = 5

    def __init__(self, terms: int | None) -> None:
        self.terms = terms
        self.accepted: tuple[np.ndarray, float, np.ndarray] | None = None  # v, dual, phi
        self.step: np.ndarray | None = None
        self.halvings = 0
        self.decrement = math.inf

    def next(self, v: np.ndarray, b: Bounds) -> np.ndarray:
        """Given the trial v (already rescaled) and its bounds, return the next trial."""
        acc = self.accepted
        slack = 1e-13 * abs(acc[1]) if acc is not None else 0.0
        if acc is not None and b.dual < acc[1] - slack and self.step is not None:
            if self.halvings < self.MAX_HALVINGS:
                self.halvings += 1
                self.step = 0.5 * self.step
                return acc[0] * np.exp(self.step)
            # Give up on this direction: one plain fixed-point step from the accepted point.
            self.halvings = 0
            self.step = None
            return acc[2].copy()
        self.accepted = (v, b.dual, b.phi)
        self.halvings = 0
        found = newton_direction(b, v, terms=self.terms)
        if found is None:
            self.step = None
            self.decrement = math.inf
            return b.phi.copy()
        dx, self.decrement = found
        self.step = _log_step(dx)
        return v * np.exp(self.step)


def _coarse_start(gram: np.ndarray, terms: int | None) -> tuple[np.ndarray | None, list[tuple[int, int]]]:
    """Dual weights for ``gram`` from the multilevel start, or None when n is too small."""
    n = gram.shape[0]
    if n < 2 * COARSE_MIN_N:
        return None, []
    grams = [coarsen_gram(gram)]
    while grams[-1].shape[0] >= 2 * COARSE_MIN_N:
        grams.append(coarsen_gram(grams[-1]))
    v: np.ndarray | None = None
    levels: list[tuple[int, int]] = []
    for g in reversed(grams):
        m = g.shape[0]
        v = np.ones(m) if v is None else resample_weights(v, m)
        walker = _NewtonWalker(terms)
        evals = 0
        for evals in range(1, COARSE_MAX_ITER + 1):  # noqa: B007 (the count after the loop is reported)
            b = evaluate(g, v, primal=False)
            v, b = _rescaled(b, v)
            v_next = walker.next(v, b)
            if walker.halvings == 0 and walker.decrement <= COARSE_TOL:
                break
            v = v_next
        assert walker.accepted is not None
        v = walker.accepted[0]
        levels.append((m, evals))
    grams.clear()
    return v, levels


def optimal_factorization(
    workload: np.ndarray,
    *,
    tol: float = DEFAULT_TOL,
    max_iter: int = DEFAULT_MAX_ITER,
    method: str = DEFAULT_METHOD,
    v0: np.ndarray | None = None,
    memory: int = 6,
    callback: Callable[[Progress], None] | None = None,
    multilevel: bool = True,
    hessian_terms: int | None = None,
    threads: int | str | None = "auto",
) -> SolveResult:
    """Solve for the optimal lower-triangular factorization of ``workload`` to relative gap ``tol``.

    Args:
        workload: n x n full-rank lower-triangular A (validate with
            :func:`mfcli.model.workloads.check_workload_matrix`).
        tol: stop when (primal - dual) / primal <= tol.
        max_iter: full-size eigendecompositions at most; the result then carries the gap reached.
        method: ``newton`` (default), ``anderson`` or ``fixed-point``.
        v0: starting dual weights (any positive vector; resampled if its length differs). With
            ``newton`` a v0 replaces the multilevel start.
        memory: Anderson history length.
        callback: called with :class:`Progress` after every full-size iteration (may raise to
            abort).
        multilevel: ``newton`` only: use the coarse-to-fine start for n >= 256.
        hessian_terms: ``newton`` only: exponential-sum length of the Hessian kernel (default
            chosen from the eigenvalue range).
        threads: BLAS threads during the solve: an int, None for the BLAS default, or
            ``"auto"`` (1 on a busy machine, else the default; see :func:`auto_threads`).
            Affects speed only.

    Formal guarantees: the returned factorization satisfies A = B C to 1e-8 relative Frobenius
    error, C is lower-triangular with unit column norms (sensitivity 1), and its loss is within
    ``gap`` (relative) of the optimum over all factorizations with sensitivity 1. Whatever the
    method, the gap is (primal - dual) / primal with the primal recomputed from the returned B
    and C and the dual the largest :func:`certified_dual` (singular values of A D^1/2) among
    the iterates where it was computed. The iteration itself runs on eigh-based estimates of
    both bounds (what :class:`Progress` reports); the loop ends only when the certified dual
    confirms the estimated gap.
    """
    if method not in METHODS:
        raise MfcliError(f"unknown solver method {method!r}; choose one of {', '.join(METHODS)}")
    if not (0 < tol < 1) or not math.isfinite(tol):
        raise MfcliError(f"tol must be in (0, 1), got {tol}")
    if max_iter < 1:
        raise MfcliError(f"max_iter must be at least 1, got {max_iter}")
    if hessian_terms is not None and not (4 <= hessian_terms <= 40):
        raise MfcliError(f"hessian_terms must be in [4, 40], got {hessian_terms}")
    if threads == "auto":
        limit = auto_threads()
    elif threads is None:
        limit = None
    elif isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be a positive integer, None or 'auto', got {type(threads).__name__}")
    elif threads >= 1:
        limit = int(threads)
    else:
        raise MfcliError(f"threads must be a positive integer, None or 'auto', got {threads!r}")
    with blas_threads(limit):
        res = _solve(workload, tol=tol, max_iter=max_iter, method=method, v0=v0, memory=memory,
                     callback=callback, multilevel=multilevel, hessian_terms=hessian_terms)
    return dataclasses.replace(res, threads=limit)


class _FixedPointMethod:
    """The plain iteration of Denisov et al. 2022: the next weights are phi(v)."""

    rescales = False

    def next(self, v: np.ndarray, b: Bounds, *, dual_dropped: bool, improved: bool) -> np.ndarray | None:
        return b.phi


class _AndersonMethod:
    """Anderson acceleration of the fixed point on g(x) = log phi(e^x), with the residual's mean
    removed: the problem is invariant to the scale of v, so only the direction of log v matters.
    The history restarts when the dual drops or the extrapolation leaves the safe range."""

    rescales = False

    def __init__(self, memory: int) -> None:
        self.memory = memory
        self.xs: list[np.ndarray] = []
        self.fs: list[np.ndarray] = []

    def next(self, v: np.ndarray, b: Bounds, *, dual_dropped: bool, improved: bool) -> np.ndarray | None:
        xs, fs = self.xs, self.fs
        x = np.log(v)
        f = np.log(b.phi / v)
        f -= f.mean()
        if dual_dropped:
            xs.clear()
            fs.clear()
        xs.append(x)
        fs.append(f)
        del xs[: -self.memory - 1], fs[: -self.memory - 1]
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
        return np.exp(x_new)


class _NewtonMethod:
    """Safeguarded Newton (:class:`_NewtonWalker`) on the rescaled weights; stops at the round-off
    floor, when several iterations in a row improve neither bound."""

    rescales = True
    STALL_LIMIT = 8

    def __init__(self, hessian_terms: int | None) -> None:
        self.walker = _NewtonWalker(hessian_terms)
        self.stalled = 0

    def next(self, v: np.ndarray, b: Bounds, *, dual_dropped: bool, improved: bool) -> np.ndarray | None:
        self.stalled = 0 if improved else self.stalled + 1
        if self.stalled >= self.STALL_LIMIT:
            return None
        return self.walker.next(v, b)


_Method = _FixedPointMethod | _AndersonMethod | _NewtonMethod


def _method(name: str, *, memory: int, hessian_terms: int | None) -> _Method:
    if name == "newton":
        return _NewtonMethod(hessian_terms)
    if name == "anderson":
        return _AndersonMethod(memory)
    return _FixedPointMethod()


class _Certifier:
    """Bound bookkeeping shared by every method: the best primal iterate (the one returned), the
    best estimated dual, and the certified dual (:func:`certified_dual`) that confirms the gap."""

    def __init__(self, workload: np.ndarray, v: np.ndarray) -> None:
        self.a = workload
        self.best_dual = -math.inf  # eigh-based estimates
        self.best_primal = math.inf
        self.best: tuple[np.ndarray, Bounds] | None = None
        self.cert_dual = -math.inf  # largest certified_dual computed
        self.v_best_dual = v
        self.gap = math.inf

    def record(self, v: np.ndarray, b: Bounds) -> tuple[bool, bool]:
        """Take in one iterate; return (its dual dropped below the best, it improved a bound)."""
        dual_dropped = b.dual < self.best_dual
        improved = b.dual > self.best_dual * (1 + 1e-15) or b.primal < self.best_primal * (1 - 1e-15)
        if b.dual > self.best_dual:
            self.best_dual, self.v_best_dual = b.dual, v
        if b.primal < self.best_primal:
            self.best_primal = b.primal
            self.best = (v, b)
        self.gap = (self.best_primal - self.best_dual) / self.best_primal
        return dual_dropped, improved

    def confirms(self, v: np.ndarray, b: Bounds, tol: float) -> bool:
        """Whether a certified dual confirms the estimated gap <= tol: first the cheap route at
        this iterate (its eigenvectors), then singular values at the best-dual iterate."""
        self.cert_dual = max(self.cert_dual, certified_dual(self.a, v, b.eigvecs))
        if (self.best_primal - self.cert_dual) / self.best_primal > tol:
            self.cert_dual = max(self.cert_dual, certified_dual(self.a, self.v_best_dual))
        return (self.best_primal - self.cert_dual) / self.best_primal <= tol

    def final_dual(self) -> float:
        """The certified dual; computed at the best-dual iterate if the loop never certified
        (stopped by max_iter or the round-off floor)."""
        if self.cert_dual == -math.inf:
            self.cert_dual = certified_dual(self.a, self.v_best_dual)
        return self.cert_dual


def _initial_weights(
    gram: np.ndarray, v0: np.ndarray | None, *, method: str, multilevel: bool, hessian_terms: int | None
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Starting dual weights (geometric mean 1) and the coarse levels of a multilevel start."""
    n = gram.shape[0]
    coarse: list[tuple[int, int]] = []
    if v0 is None:
        v = np.ones(n)
        if method == "newton" and multilevel:
            v_coarse, coarse = _coarse_start(gram, hessian_terms)
            if v_coarse is not None:
                v = resample_weights(v_coarse, n)
    else:
        v = resample_weights(v0, n)
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise MfcliError("warm-start dual weights must be positive and finite")
    return v / np.exp(np.mean(np.log(v))), coarse


def _solve(
    workload: np.ndarray,
    *,
    tol: float,
    max_iter: int,
    method: str,
    v0: np.ndarray | None,
    memory: int,
    callback: Callable[[Progress], None] | None,
    multilevel: bool,
    hessian_terms: int | None,
) -> SolveResult:
    import scipy.linalg

    a = np.asarray(workload, dtype=np.float64)
    start = time.perf_counter()
    gram = scipy.linalg.blas.dsyrk(1.0, a, trans=1, lower=0)  # upper triangle of A^T A
    gram += np.triu(gram, 1).T
    v, coarse = _initial_weights(gram, v0, method=method, multilevel=multilevel, hessian_terms=hessian_terms)
    stepper = _method(method, memory=memory, hessian_terms=hessian_terms)
    book = _Certifier(a, v)
    history: list[Progress] = []
    it = 0
    for it in range(1, max_iter + 1):
        bnd = evaluate(gram, v)
        if stepper.rescales:
            v, bnd = _rescaled(bnd, v)
        dual_dropped, improved = book.record(v, bnd)
        prog = Progress(it, book.best_primal, book.best_dual, book.gap, time.perf_counter() - start, method)
        history.append(prog)
        if callback is not None:
            callback(prog)
        if book.gap <= tol and book.confirms(v, bnd, tol):
            break
        v_next = stepper.next(v, bnd, dual_dropped=dual_dropped, improved=improved)
        del bnd  # keep at most the best iterate's eigenvectors alive
        if v_next is None:
            break
        v = v_next
    del stepper, gram
    return _result(book, start=start, iterations=it, method=method, tol=tol, history=history, coarse=coarse)


def _result(
    book: _Certifier, *, start: float, iterations: int, method: str, tol: float, history: list[Progress],
    coarse: list[tuple[int, int]],
) -> SolveResult:
    """The certified answer: the best primal iterate's factorization, its loss recomputed from
    the returned B and C, and the gap against the certified dual."""
    assert book.best is not None
    v_best, bnd_best = book.best
    book.best = None
    cert_dual = book.final_dual()
    a = book.a
    strategy = strategy_from_bounds(bnd_best)
    del bnd_best
    decoder = decoder_for(a, strategy)
    fact = Factorization(workload=a, strategy=strategy, decoder=decoder, causal=True).verify()
    primal = total_loss(decoder=decoder, strategy=strategy)
    gap_final = (primal - cert_dual) / primal
    seconds = time.perf_counter() - start
    return SolveResult(
        factorization=fact,
        dual_weights=v_best,
        primal=primal,
        dual=cert_dual,
        gap=gap_final,
        iterations=iterations,
        seconds=seconds,
        method=method,
        tol=tol,
        converged=gap_final <= tol,
        history=history,
        coarse_iterations=tuple(coarse),
    )
