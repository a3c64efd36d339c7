"""Banded plus low-rank compression of a decoder (BRIEF section 6, Knowl 9; docs/compress.md).

A dense decoder B (n x n, lower-triangular) costs O(n d) memory to stream: step t's noise mixes
every earlier noise row. The compressed decoder

    B^ = band_K(B) + mask(U V^T),   band_K keeps 0 <= t - j < K,  mask keeps j <= t - K,

keeps the last K diagonals of B exactly and replaces everything older by a rank-R matrix fitted
by alternating least squares (ALS) on exactly those older entries. Because the low-rank part only
touches noise rows j <= t - K, a trainer can stream B^ Z with the running state
S_m = sum_{j <= m} V[j]^T Z[j] (R x d): (B^ Z)[t] = sum_{i < K} band[t, i] Z[t - i] + U[t] S_{t-K}.

Privacy trap: the trainer then releases A G + B^ Z = B^ (C^ G + Z) with C^ = B^-1 A, so the
mechanism's privacy is set by sens(C^), not by the sens(C) of the dense solution. Every
:class:`Compression` recomputes C^, its sensitivity and its loss sens(C^)^2 ||B^||_F^2 from B^,
and :func:`load_compressed` re-derives them from the stored ``band``, ``u`` and ``v`` before it
returns anything.

Compressed artifact layout (format v1, docs/artifact-format.md): the root keeps the dense
workload / strategy / decoder it was made from, and group ``compressed`` holds datasets ``band``
(n x K, ``band[t, i] = B^[t, t - i]``, zero where t - i < 0), ``u`` and ``v`` (n x R; rows of
``u`` before K and rows of ``v`` after n - 1 - K are never used and are written as zero) and
attributes ``band``, ``rank``, ``sensitivity``, ``loss_total``, ``loss_increase`` and more.

Example:
    >>> from mfcli.workloads import prefix_workload
    >>> from mfcli.solver import optimal_factorization
    >>> fact = optimal_factorization(prefix_workload(16).matrix, tol=1e-9).factorization
    >>> comp = compress_factorization(fact, band=16, rank=0)   # K = n keeps B exactly
    >>> bool(np.array_equal(comp.decoder, fact.decoder)), abs(comp.loss_increase) < 1e-12
    (True, True)
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import numpy as np

from mfcli.errors import ArtifactError, MfcliError
from mfcli.factorization import Factorization, sensitivity

#: Name of the HDF5 group that holds the compressed decoder.
GROUP = "compressed"
#: Relative tolerance for the stored sensitivity and loss against their recomputation.
ATTR_RTOL = 1e-9
#: Absolute tolerance for the stored loss_increase (a difference of two relative numbers).
INCREASE_ATOL = 1e-8
#: Default cap on the rank tried by the automatic search.
DEFAULT_MAX_SEARCH_RANK = 64
#: Rows of the batched R x R solves done at once in ALS (bounds memory to CHUNK * R^2 floats).
_CHUNK_FLOATS = 1 << 22

DEFINITION = (
    "B^[t, j] = band[t, t - j] for 0 <= t - j < K; u[t] . v[j] for j <= t - K; 0 for j > t"
)


# --------------------------------------------------------------------------------------------
# The layout: band values, masked low-rank part, and the decoder they define
# --------------------------------------------------------------------------------------------


def check_band_rank(n: int, band: int, rank: int) -> None:
    """Raise MfcliError unless 1 <= K <= n and 0 <= R <= n - K.

    K >= 1 keeps the diagonal of B (so B^ is invertible); the masked region j <= t - K has
    n - K rows and columns, so a rank above n - K means nothing.
    """
    if isinstance(band, bool) or not isinstance(band, (int, np.integer)):
        raise MfcliError(f"band K must be an integer, got {band!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise MfcliError(f"rank R must be an integer, got {rank!r}")
    if not 1 <= band <= n:
        raise MfcliError(f"band K = {band} is out of range: need 1 <= K <= n = {n}")
    if not 0 <= rank <= n - band:
        raise MfcliError(f"rank R = {rank} is out of range: need 0 <= R <= n - K = {n - band}")


def band_values(decoder: np.ndarray, band: int) -> np.ndarray:
    """The n x K band layout of a square matrix: ``out[t, i] = decoder[t, t - i]`` (0 if t < i)."""
    b = np.asarray(decoder, dtype=np.float64)
    n = b.shape[0]
    out = np.zeros((n, band))
    for i in range(band):
        out[i:, i] = np.diagonal(b, offset=-i)
    return out


def compressed_decoder(band: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Assemble B^ (n x n, lower-triangular) from the stored layout.

    Args:
        band: n x K, ``band[t, i] = B^[t, t - i]``; entries with t - i < 0 are ignored.
        u, v: n x R; the low-rank part contributes ``u[t] . v[j]`` only where j <= t - K.

    Raises:
        MfcliError: if the shapes do not fit together.
    """
    bd = np.asarray(band, dtype=np.float64)
    uu = np.asarray(u, dtype=np.float64)
    vv = np.asarray(v, dtype=np.float64)
    if bd.ndim != 2 or uu.ndim != 2 or vv.ndim != 2:
        raise MfcliError("band, u and v must be 2-D arrays")
    n, k = bd.shape
    if uu.shape != vv.shape or uu.shape[0] != n:
        raise MfcliError(f"u {uu.shape} and v {vv.shape} must both be n x R with n = {n} (band is {bd.shape})")
    if not 1 <= k <= n:
        raise MfcliError(f"band has {k} columns; need 1 <= K <= n = {n}")
    out = np.zeros((n, n))
    if uu.shape[1] > 0 and k < n:
        out[k:, : n - k] = np.tril(uu[k:] @ vv[: n - k].T)
    rows = np.arange(n)
    for i in range(k):
        out[rows[i:], rows[i:] - i] = bd[i:, i]
    return out


# --------------------------------------------------------------------------------------------
# Alternating least squares on the masked entries
# --------------------------------------------------------------------------------------------


class LowRankFit(NamedTuple):
    """Result of :func:`fit_low_rank` (n x R factors, zero rows where unused)."""

    u: np.ndarray
    v: np.ndarray
    iterations: int
    residual: float  # ||M - tril(U V^T)||_F over the masked entries
    target_norm: float  # ||M||_F over the masked entries


def masked_block(decoder: np.ndarray, band: int) -> np.ndarray:
    """M = tril(B[K:, :n-K]): the entries with j <= t - K, as a square lower-triangular block
    (row t' = t - K, column j' = j)."""
    b = np.asarray(decoder, dtype=np.float64)
    m = b.shape[0] - band
    return np.tril(b[band:, :m])


def _prefix_gram_solve(factors: np.ndarray, rhs: np.ndarray, ridge: float) -> np.ndarray:
    """Row i of the result solves (sum_{j <= i} f_j f_j^T + ridge I) x = rhs_i."""
    m, r = factors.shape
    out = np.empty_like(rhs)
    acc = np.zeros((r, r))
    eye = ridge * np.eye(r)
    chunk = max(1, _CHUNK_FLOATS // max(1, r * r))
    for s in range(0, m, chunk):
        f = factors[s : s + chunk]
        g = np.cumsum(f[:, :, None] * f[:, None, :], axis=0)
        g += acc
        acc = g[-1].copy()
        g += eye
        out[s : s + chunk] = np.linalg.solve(g, rhs[s : s + chunk, :, None])[..., 0]
    return out


def als_iterates(
    block: np.ndarray, rank: int, *, max_iter: int, seed: int = 0
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (iteration, U, V) for the masked rank-R fit of a square lower-triangular block M:
    iteration 0 is the start, then one U step and one V step per iteration.

    Objective: sum over j' <= t' of (M[t', j'] - U[t'] . V[j'])^2. The U step solves, exactly,
    one R x R least-squares problem per row t' over its observed columns j' <= t'; the V step one
    per column j' over its observed rows t' >= j'. The Gram matrices are running prefix / suffix
    sums. A ridge of 1e-12 of the mean squared factor norm makes the first rows (fewer than R
    observed entries) well-posed without changing the fit measurably. Start: a randomized SVD of
    M (two power iterations, fixed seed), so the iterates are deterministic.
    """
    m = block.shape[0]
    rng = np.random.default_rng(seed)
    width = min(m, rank + 10)
    y = block @ rng.standard_normal((m, width))
    for _ in range(2):
        q, _ = np.linalg.qr(y)
        y = block @ (block.T @ q)
    q, _ = np.linalg.qr(y)
    ub, s, vt = np.linalg.svd(q.T @ block, full_matrices=False)
    root = np.sqrt(s[:rank])
    u = (q @ ub[:, :rank]) * root
    v = vt[:rank].T * root
    yield 0, u, v
    for it in range(1, max_iter + 1):
        ridge_v = 1e-12 * max(float(np.sum(v * v)) / rank, 1e-300)
        u = _prefix_gram_solve(v, block @ v, ridge_v)
        ridge_u = 1e-12 * max(float(np.sum(u * u)) / rank, 1e-300)
        # Column j' is observed in rows t' >= j': a suffix sum, i.e. a prefix sum reversed.
        v = _prefix_gram_solve(u[::-1], (block.T @ u)[::-1], ridge_u)[::-1]
        yield it, u, v


def _embed(u: np.ndarray, v: np.ndarray, n: int, band: int) -> tuple[np.ndarray, np.ndarray]:
    """Place block factors into n x R arrays: u rows K.., v rows ..n-1-K, zeros elsewhere."""
    rank = u.shape[1]
    uf = np.zeros((n, rank))
    vf = np.zeros((n, rank))
    uf[band:] = u
    vf[: n - band] = v
    return uf, vf


def fit_low_rank(
    decoder: np.ndarray, *, band: int, rank: int, iterations: int = 20, seed: int = 0
) -> LowRankFit:
    """Fit U, V (n x R) to the entries of ``decoder`` with j <= t - K by ``iterations`` rounds of
    alternating least squares (:func:`als_iterates`), minimising the Frobenius error on exactly
    those entries. Rows of U before K and rows of V after n - 1 - K are never used; they are zero.
    """
    b = np.asarray(decoder, dtype=np.float64)
    n = b.shape[0]
    check_band_rank(n, band, rank)
    if n - band == 0:
        return LowRankFit(np.zeros((n, rank)), np.zeros((n, rank)), 0, 0.0, 0.0)
    block = masked_block(b, band)
    target = float(np.linalg.norm(block))
    if rank == 0 or target == 0.0:
        return LowRankFit(np.zeros((n, rank)), np.zeros((n, rank)), 0, target, target)
    it, u, v = 0, None, None
    for it, u, v in als_iterates(block, rank, max_iter=iterations, seed=seed):
        pass
    res = float(np.linalg.norm(block - np.tril(u @ v.T)))
    uf, vf = _embed(u, v, n, band)
    return LowRankFit(uf, vf, it, res, target)


# --------------------------------------------------------------------------------------------
# The compressed mechanism and its recomputed numbers
# --------------------------------------------------------------------------------------------


def strategy_for_decoder(workload: np.ndarray, decoder: np.ndarray, *, block: int = 256) -> np.ndarray:
    """C^ = B^-1 A for a lower-triangular B^ with non-zero diagonal and lower-triangular A.

    C^ is lower-triangular, so columns j0..j1 only need the trailing system
    B^[j0:, j0:] C^[j0:, j0:j1] = A[j0:, j0:j1]: blocked triangular solves costing about 0.4 n^3
    flops instead of n^3 for one solve against all of A.

    Raises:
        MfcliError: if B^ has a zero diagonal entry or the solve is not finite.
    """
    a = np.asarray(workload, dtype=np.float64)
    b = np.asarray(decoder, dtype=np.float64)
    d = np.diagonal(b)
    if not np.all(np.isfinite(d)) or np.any(d == 0):
        raise MfcliError("the compressed decoder has a zero on its diagonal and cannot be inverted")
    import scipy.linalg  # not at module level: inspect imports this module and needs no scipy

    n = a.shape[0]
    c = np.zeros((n, n))
    if np.any(np.triu(a, 1)):
        c[:] = scipy.linalg.solve_triangular(b, a, lower=True, check_finite=False)
    else:
        for j0 in range(0, n, block):
            j1 = min(n, j0 + block)
            c[j0:, j0:j1] = scipy.linalg.solve_triangular(
                b[j0:, j0:], a[j0:, j0:j1], lower=True, check_finite=False
            )
    if not np.all(np.isfinite(c)):
        raise MfcliError("the compressed decoder is numerically singular: C^ = B^-1 A is not finite")
    return np.tril(c)


@dataclass(frozen=True, eq=False)
class Compression:
    """A banded plus low-rank decoder B^ and the mechanism (A, C^ = B^-1 A, B^) it implies.

    Attributes:
        band: K, the number of exact diagonals kept.
        rank: R, the rank of the masked low-rank part.
        band_values: n x K, ``band_values[t, i] = B^[t, t - i]``.
        u, v: n x R low-rank factors (used only where j <= t - K).
        factorization: workload A, strategy C^ = B^-1 A, decoder B^ (verified A = B^ C^).
        dense_loss_total: loss of the dense factorization it was made from.
        dense_sensitivity: sens(C) of that dense factorization.
        fit_relative_error: ||B - B^||_F / ||B||_F against the dense decoder.
        als_iterations: ALS iterations used (0 when R = 0 or K = n).

    Formal guarantees: ``sensitivity``, ``loss_total`` and ``loss_increase`` are recomputed from
    B^ on access (sens(C^) = max_j ||(B^-1 A)[:, j]||_2, single participation, clip norm 1), not
    carried over from the dense solution. Releasing A G + B^ Z with Z ~ N(0, sigma^2) is the
    Gaussian mechanism on C^ G with L2 sensitivity sens(C^) x clip, post-processed by B^.
    """

    band: int
    rank: int
    band_values: np.ndarray
    u: np.ndarray
    v: np.ndarray
    factorization: Factorization
    dense_loss_total: float
    dense_sensitivity: float
    fit_relative_error: float
    als_iterations: int = 0

    @property
    def n(self) -> int:
        return self.factorization.n

    @property
    def decoder(self) -> np.ndarray:
        """B^."""
        return self.factorization.decoder

    @property
    def strategy(self) -> np.ndarray:
        """C^ = B^-1 A."""
        return self.factorization.strategy

    @property
    def sensitivity(self) -> float:
        return self.factorization.sensitivity

    @property
    def loss_total(self) -> float:
        return self.factorization.loss_total

    @property
    def loss_increase(self) -> float:
        """loss_total / dense_loss_total - 1 (0.01 means 1% more total squared error)."""
        return self.loss_total / self.dense_loss_total - 1.0

    @property
    def stream_cost(self) -> int:
        """K + R: noise rows touched per step (K band rows, R state rows)."""
        return self.band + self.rank

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict:
        """The ``compressed`` group for :func:`mfcli.artifact.save_artifact`."""
        attrs: dict[str, Any] = {
            **self._numbers(),
            "definition": DEFINITION,
            "noise_operator": "B^ (iterate noise); gradient noise is (C^-1 Z)[t] with C^ = B^-1 A",
        }
        attrs.update(source or {})
        return {"datasets": {"band": self.band_values, "u": self.u, "v": self.v}, "attrs": attrs}

    def summary(self) -> dict:
        """Recomputed numbers as a JSON-ready dict."""
        return {**self._numbers(), "stream_cost": self.stream_cost}

    def _numbers(self) -> dict:
        """The recomputed numbers both the stored group and the summary carry."""
        f = self.factorization
        return {
            "band": int(self.band),
            "rank": int(self.rank),
            "sensitivity": f.sensitivity,
            "loss_total": f.loss_total,
            "loss_mean": f.loss_mean,
            "loss_max": f.loss_max,
            "loss_increase": self.loss_increase,
            "dense_loss_total": self.dense_loss_total,
            "dense_sensitivity": self.dense_sensitivity,
            "fit_relative_error": self.fit_relative_error,
            "als_iterations": int(self.als_iterations),
        }


def _require_square(fact: Factorization) -> None:
    if fact.m != fact.n:
        raise MfcliError(
            f"compression needs a square decoder; this strategy has {fact.m} rows for n = {fact.n} "
            "(a tree or other non-square baseline)"
        )


def mechanism_for_decoder(
    workload: np.ndarray, decoder: np.ndarray
) -> Factorization:
    """The factorization (A, C^ = B^-1 A, B^) a lower-triangular decoder implies, verified."""
    c = strategy_for_decoder(workload, decoder)
    fact = Factorization(workload=workload, strategy=c, decoder=decoder, causal=True)
    try:
        fact.verify()
    except MfcliError as exc:
        raise MfcliError(f"the compressed decoder is too ill-conditioned to use: {exc}") from None
    return fact


#: ALS iterations at which the true loss is evaluated (powers of two, and max_iter itself).
CHECKPOINTS = tuple(2**i for i in range(20))
DEFAULT_MAX_ITER = 64


def compress_factorization(
    fact: Factorization, *, band: int, rank: int, max_iter: int = DEFAULT_MAX_ITER
) -> Compression:
    """Compress the decoder of a square factorization to K exact diagonals plus a rank-R tail.

    B^ = band_K(B) + mask(U V^T) with U, V from alternating least squares on the masked entries
    (:func:`als_iterates`). ALS minimises the Frobenius error ||B - B^||_F, which is only a
    proxy: what matters is the loss sens(C^)^2 ||B^||_F^2 with C^ = B^-1 A, and a tighter
    Frobenius fit can raise sens(C^) (the loss is not monotone along the ALS iterations). So the
    loss is recomputed at iterations 1, 2, 4, 8, ... and ``max_iter`` and the iterate with the
    lowest loss is kept: never worse than plain ALS stopped at ``max_iter``. Deterministic.

    Only the decoder B is used (and A, to form C^); entries of B above the diagonal (a non-causal
    B) are dropped, so B^ is always lower-triangular.

    Formal guarantees: the returned :class:`Compression` carries C^ = B^-1 A recomputed from
    the returned B^, verified A = B^ C^; its sensitivity and loss describe that mechanism.

    Raises:
        MfcliError: K or R out of range, a non-square factorization, or a B^ that cannot be
            inverted stably.
    """
    _require_square(fact)
    n = fact.n
    check_band_rank(n, band, rank)
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 0:
        raise MfcliError(f"max ALS iterations must be an integer >= 0, got {max_iter!r}")
    b = fact.decoder
    a = fact.workload
    bv = band_values(b, band)
    m = n - band
    block = masked_block(b, band) if m > 0 else np.zeros((0, 0))
    norm_b = float(np.linalg.norm(b))

    def build(u: np.ndarray, v: np.ndarray, iterations: int) -> Compression:
        b_hat = compressed_decoder(bv, u, v)
        return Compression(
            band=int(band), rank=int(rank), band_values=bv, u=u, v=v,
            factorization=mechanism_for_decoder(a, b_hat), dense_loss_total=fact.loss_total,
            dense_sensitivity=fact.sensitivity,
            fit_relative_error=float(np.linalg.norm(b - b_hat) / norm_b), als_iterations=iterations,
        )

    if rank == 0 or m == 0 or not np.any(block):
        return build(np.zeros((n, rank)), np.zeros((n, rank)), 0)
    # Checkpoints only need the loss (one blocked triangular solve); the full verification of
    # A = B^ C^ (an n^3 product) is done once, for the iterate kept.
    best: tuple[float, np.ndarray, np.ndarray, int] | None = None
    failure: MfcliError | None = None
    checkpoints = set(CHECKPOINTS) | {max_iter}
    for it, u, v in als_iterates(block, rank, max_iter=max_iter):
        if it not in checkpoints:
            continue
        uf, vf = _embed(u, v, n, band)
        b_hat = compressed_decoder(bv, uf, vf)
        try:
            c_hat = strategy_for_decoder(a, b_hat)
        except MfcliError as exc:  # an ill-conditioned iterate: not a candidate
            failure = exc
            continue
        loss = sensitivity(c_hat) ** 2 * float(np.sum(b_hat * b_hat))
        if best is None or loss < best[0]:
            best = (loss, uf, vf, it)
    if best is None:
        raise failure or MfcliError("ALS produced no usable compressed decoder")
    return build(best[1], best[2], best[3])


# --------------------------------------------------------------------------------------------
# Choosing (K, R) for a loss budget
# --------------------------------------------------------------------------------------------


class Evaluation(NamedTuple):
    """One (K, R) tried by :func:`search_compression`."""

    band: int
    rank: int
    loss_increase: float
    sensitivity: float

    @property
    def cost(self) -> int:
        return self.band + self.rank


@dataclass(frozen=True, eq=False)
class SearchResult:
    """The cheapest setting found and every setting evaluated on the way."""

    compression: Compression
    max_loss_increase: float
    evaluations: tuple[Evaluation, ...] = field(default_factory=tuple)


def search_compression(
    fact: Factorization,
    *,
    max_loss_increase: float,
    band: int | None = None,
    rank: int | None = None,
    max_band: int | None = None,
    max_rank: int | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
    progress: Callable[[Evaluation], None] | None = None,
) -> SearchResult:
    """Find the cheapest (K, R), cost K + R per streamed step, whose loss increase is within
    ``max_loss_increase`` (ties: lower loss). A fixed ``band`` or ``rank`` is kept as given.

    Method: first an upper bound on the diagonal K = R (1, 2, 4, ... until the budget is met,
    then bisection), starting from the always feasible K = n, R = 0 (B itself). Then for
    R = 0, 1, ... the smallest feasible K is found by bisection on [1, min(best - R, K_{R-1})]
    (best = cheapest cost so far, K_{R-1} the previous rank's smallest K), stopping when
    R + 1 > best, K reaches 1, or R > ``max_rank``. This needs tens of evaluations where a full
    grid needs thousands. The bisections assume the loss increase does not grow with K at fixed
    R, nor with R at fixed K. That usually holds (every extra diagonal is kept exactly, every
    extra rank fits the older entries better) but not always, since the loss depends on
    sens(B^-1 A) and not on the fit alone; where it fails the search can miss a cheaper setting.
    Whatever happens, the setting returned was evaluated and meets the budget.

    Raises:
        MfcliError: a bad budget or range, or no setting within the limits meets the budget.
    """
    _require_square(fact)
    n = fact.n
    if not (isinstance(max_loss_increase, (int, float)) and math.isfinite(max_loss_increase)) or max_loss_increase < 0:
        raise MfcliError(f"--max-loss-increase must be a finite number >= 0, got {max_loss_increase!r}")
    k_cap = n if max_band is None else int(max_band)
    if not 1 <= k_cap <= n:
        raise MfcliError(f"max band {max_band} is out of range: need 1 <= K <= n = {n}")
    r_cap = min(n - 1, DEFAULT_MAX_SEARCH_RANK) if max_rank is None else int(max_rank)
    if r_cap < 0:
        raise MfcliError(f"max rank {max_rank} is out of range: need R >= 0")
    if band is not None and rank is not None:
        check_band_rank(n, band, rank)
    elif band is not None:
        check_band_rank(n, band, 0)
    elif rank is not None:
        check_band_rank(n, 1, rank)

    evaluations: list[Evaluation] = []
    cache: dict[tuple[int, int], Evaluation] = {}
    best: dict[str, Any] = {"comp": None}

    def better(e: Evaluation) -> bool:
        cur = best.get("eval")
        return cur is None or (e.cost, e.loss_increase) < (cur.cost, cur.loss_increase)

    def evaluate(k: int, r: int) -> Evaluation:
        key = (k, r)
        if key in cache:
            return cache[key]
        comp = compress_factorization(fact, band=k, rank=r, max_iter=max_iter)
        e = Evaluation(k, r, comp.loss_increase, comp.sensitivity)
        cache[key] = e
        evaluations.append(e)
        if progress is not None:
            progress(e)
        if e.loss_increase <= max_loss_increase and better(e):
            best["eval"] = e
            best["comp"] = comp
        return e

    def ok(k: int, r: int) -> bool:
        return evaluate(k, r).loss_increase <= max_loss_increase

    def first_feasible(lo: int, hi: int, feasible: Callable[[int], bool]) -> int | None:
        """Smallest x in [lo, hi] with feasible(x), by bisection (feasibility assumed monotone), or None."""
        if hi < lo or not feasible(hi):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if feasible(mid):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def smallest_k(r: int, hi: int) -> int | None:
        """Smallest feasible K in [1, hi] at rank r, or None."""
        return first_feasible(1, min(hi, n - r, k_cap), lambda k: ok(k, r))

    def smallest_r(k: int) -> int | None:
        """Smallest feasible R in [0, r_cap] at band k, or None."""
        return first_feasible(0, min(r_cap, n - k), lambda r: ok(k, r))

    if band is not None and rank is not None:
        evaluate(band, rank)
    elif band is not None:
        smallest_r(band)
    elif rank is not None:
        smallest_k(rank, n)
    else:
        # Upper bound from the diagonal K = R (doubling, then bisection), then, for R = 0, 1, ...,
        # the smallest feasible K below both the bound and the previous R's smallest K.
        best_cost = n  # K = n, R = 0 is B itself: always feasible
        d_lo, d_hi = 0, None
        d = 1
        while 2 * d <= n and d <= min(r_cap, k_cap):
            if ok(d, d):
                d_hi = d
                break
            d_lo = d
            d *= 2
        if d_hi is not None:
            while d_hi - d_lo > 1:
                mid = (d_lo + d_hi) // 2
                if ok(mid, mid):
                    d_hi = mid
                else:
                    d_lo = mid
            best_cost = min(best_cost, 2 * d_hi)
        k_prev = n
        r = 0
        while r <= r_cap and r + 1 <= best_cost:
            k = smallest_k(r, min(best_cost - r, k_prev))
            if k is not None:
                best_cost = min(best_cost, k + r)
                k_prev = k
                if k == 1:
                    break
            r += 1
        if best.get("eval") is None:
            ok(min(n, k_cap), 0)

    if best["comp"] is None:
        tried = min(evaluations, key=lambda e: e.loss_increase) if evaluations else None
        where = f"; the best tried, K = {tried.band}, R = {tried.rank}, increases the loss by {tried.loss_increase:.4%}" if tried else ""
        raise MfcliError(
            f"no compression within the limits keeps the loss increase <= {max_loss_increase:g}{where}"
        )
    return SearchResult(best["comp"], float(max_loss_increase), tuple(evaluations))


# --------------------------------------------------------------------------------------------
# Artifacts: write a compressed artifact, load and verify the compressed group
# --------------------------------------------------------------------------------------------


def default_output_path(source: str | Path, band: int, rank: int) -> Path:
    """``<input stem>-k<K>r<R>.h5`` beside the input."""
    p = Path(source)
    return p.with_name(f"{p.stem}-k{band}r{rank}.h5")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_compressible(artifact: Any, *, force: bool = False) -> None:
    """Refuse a non-square, non-causal or already compressed artifact (the last two unless
    ``force``), with a message that says why."""
    fact = artifact.factorization
    _require_square(fact)
    if GROUP in artifact.groups and not force:
        raise MfcliError(
            f"{artifact.path} is already compressed (K = {artifact.groups[GROUP]['attrs'].get('band')}, "
            f"R = {artifact.groups[GROUP]['attrs'].get('rank')}); use --force to compress its dense decoder again"
        )
    if not fact.causal and not force:
        raise MfcliError(
            f"{artifact.path} is not causal (strategy {artifact.strategy_name!r} is offline-only); "
            "its entries above the diagonal would be dropped. Use --force to compress anyway"
        )


@dataclass(frozen=True, eq=False)
class CompressedArtifact:
    """What :func:`compress_artifact` wrote."""

    path: Path
    sha256: str
    compression: Compression
    search: SearchResult | None


def compress_artifact(
    source: str | Path,
    *,
    band: int | None = None,
    rank: int | None = None,
    max_loss_increase: float | None = None,
    max_band: int | None = None,
    max_rank: int | None = None,
    out: str | Path | None = None,
    force: bool = False,
    command: str = "",
    max_iter: int = DEFAULT_MAX_ITER,
    progress: Callable[[Evaluation], None] | None = None,
) -> CompressedArtifact:
    """Load and verify ``source``, compress its decoder and write a NEW artifact (atomically).

    With both ``band`` and ``rank``: that setting (and, if ``max_loss_increase`` is given, a
    check that it meets it; nothing is written otherwise). With ``max_loss_increase``: the
    cheapest setting meeting it (see :func:`search_compression`), keeping any of K, R given.
    The input file is never modified; ``out`` defaults to ``<stem>-k<K>r<R>.h5`` beside it.
    """
    from mfcli.artifact import file_sha256, load_artifact, save_artifact

    src = Path(source)
    art = load_artifact(src)
    check_compressible(art, force=force)
    # An already compressed input (with force) is recompressed from its dense root decoder; its
    # old group is not carried over.
    fact = art.factorization
    search: SearchResult | None = None
    if max_loss_increase is not None:
        search = search_compression(
            fact, max_loss_increase=max_loss_increase, band=band, rank=rank,
            max_band=max_band, max_rank=max_rank, max_iter=max_iter, progress=progress,
        )
        comp = search.compression
    elif band is not None and rank is not None:
        comp = compress_factorization(fact, band=band, rank=rank, max_iter=max_iter)
    else:
        raise MfcliError("give both --band and --rank, or --max-loss-increase to choose them")

    target = Path(out) if out is not None else default_output_path(src, comp.band, comp.rank)
    if _same_file(src, target) or target.resolve() == src.resolve():
        raise MfcliError(f"the output {target} is the input artifact; compression never modifies its input")
    base_name = str(art.attrs.get("strategy_name", "unknown")).split("+compressed")[0]
    source_info = {
        "source_file": src.name,
        "source_sha256": file_sha256(src),
        "source_command": str(art.attrs.get("command", "")),
        "source_created_utc": str(art.attrs.get("created_utc", "")),
    }
    digest = save_artifact(
        target,
        fact,
        workload_name=art.workload_name,
        workload_params=art.attrs.get("workload_params") if isinstance(art.attrs.get("workload_params"), dict) else {},
        strategy_name=f"{base_name}+compressed",
        solver=art.attrs.get("solver") if isinstance(art.attrs.get("solver"), dict) else {},
        command=command,
        dual_weights=art.dual_weights,
        extra_attrs={"compression_band": comp.band, "compression_rank": comp.rank},
        groups={GROUP: comp.group(source=source_info)},
        force=force,
    )
    return CompressedArtifact(path=target, sha256=digest, compression=comp, search=search)


class CompressedCheck(NamedTuple):
    """One stored number of the ``compressed`` group next to its recomputation."""

    name: str
    stored: Any
    recomputed: Any
    ok: bool


def recompute_compressed(
    fact: Factorization, group: Mapping[str, Any]
) -> tuple[Compression | None, list[CompressedCheck], str | None]:
    """Rebuild B^ from a ``compressed`` group and compare every stored number.

    Returns (compression or None, checks, structural problem or None). Never raises for a bad
    group: :func:`load_compressed` and ``mfcli inspect`` decide what to do with the findings.
    """
    attrs = group.get("attrs", {})
    ds = group.get("datasets", {})
    n = fact.n
    missing = [name for name in ("band", "u", "v") if name not in ds]
    if missing:
        return None, [], f"group {GROUP!r} lacks dataset(s) {', '.join(missing)}"
    bd, u, v = (np.asarray(ds[name], dtype=np.float64) for name in ("band", "u", "v"))
    if bd.ndim != 2 or bd.shape[0] != n:
        return None, [], f"{GROUP}/band has shape {bd.shape}, expected n x K with n = {n}"
    k = bd.shape[1]
    if u.ndim != 2 or u.shape != v.shape or u.shape[0] != n:
        return None, [], f"{GROUP}/u {u.shape} and {GROUP}/v {v.shape} must both be n x R with n = {n}"
    r = u.shape[1]
    try:
        check_band_rank(n, k, r)
    except MfcliError as exc:
        return None, [], str(exc)
    if attrs.get("band") != k or attrs.get("rank") != r:
        return None, [], (
            f"{GROUP} attributes band = {attrs.get('band')!r}, rank = {attrs.get('rank')!r} "
            f"do not match the datasets (K = {k}, R = {r})"
        )
    if any(np.any(bd[:i, i]) for i in range(min(k, n))):
        return None, [], f"{GROUP}/band has non-zero entries where t - i < 0 (outside the matrix)"
    if fact.m != n:
        return None, [], "a compressed group needs a square root factorization"
    b_hat = compressed_decoder(bd, u, v)
    try:
        mech = mechanism_for_decoder(fact.workload, b_hat)
    except MfcliError as exc:
        return None, [], str(exc)
    b = fact.decoder
    comp = Compression(
        band=k, rank=r, band_values=bd, u=u, v=v, factorization=mech,
        dense_loss_total=fact.loss_total, dense_sensitivity=fact.sensitivity,
        fit_relative_error=float(np.linalg.norm(b - b_hat) / np.linalg.norm(b)),
        als_iterations=int(attrs.get("als_iterations", 0) or 0),
    )
    checks = []
    for name, recomputed, rtol, atol in (
        ("sensitivity", comp.sensitivity, ATTR_RTOL, 0.0),
        ("loss_total", comp.loss_total, ATTR_RTOL, 0.0),
        ("loss_increase", comp.loss_increase, 0.0, INCREASE_ATOL),
    ):
        stored = attrs.get(name)
        ok = isinstance(stored, (int, float)) and not isinstance(stored, bool) and bool(
            np.isclose(stored, recomputed, rtol=rtol, atol=atol)
        )
        checks.append(CompressedCheck(name, stored, recomputed, ok))
    return comp, checks, None


def load_compressed(artifact: Any) -> Compression:
    """The verified compressed decoder of a loaded artifact (from :func:`mfcli.artifact.load_artifact`,
    which has already checked every dataset's SHA-256 and the dense root).

    Rebuilds B^ from ``band``, ``u``, ``v``, recomputes C^ = B^-1 A, sens(C^), the loss
    sens(C^)^2 ||B^||_F^2 and the loss increase, and compares each with the stored attribute.

    Raises:
        ArtifactError: no ``compressed`` group, a malformed one, or a stored number that does not
            match its recomputation (naming which).
    """
    p = getattr(artifact, "path", "artifact")
    group = artifact.groups.get(GROUP)
    if group is None:
        raise ArtifactError(f"{p} has no {GROUP!r} group (run mfcli compress first)")
    comp, checks, problem = recompute_compressed(artifact.factorization, group)
    if problem is not None or comp is None:
        raise ArtifactError(f"{p}: {problem}")
    for c in checks:
        if not c.ok:
            raise ArtifactError(
                f"{p}: stored {GROUP}/{c.name} {c.stored!r} does not match the value recomputed "
                f"from band, u and v ({c.recomputed!r})"
            )
    return comp
