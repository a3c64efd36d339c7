"""Banded plus low-rank compression of a decoder (Denisov et al. 2022, arXiv:2202.08312; docs/compress.md).

A dense decoder B (n x n, lower-triangular) costs O(n d) memory to stream: step t's noise mixes
every earlier noise row. The compressed decoder

    B^ = band_K(B) + mask(U V^T),   band_K keeps 0 <= t - j < K,  mask keeps j <= t - K,

keeps the last K diagonals of B exactly and replaces everything older by a rank-R matrix fitted
by alternating least squares (ALS) on exactly those older entries. Because the low-rank part only
touches noise rows j <= t - K, a trainer can stream B^ Z with the running state
S_m = sum_{j <= m} V[j]^T Z[j] (R x d): (B^ Z)[t] = sum_{i < K} band[t, i] Z[t - i] + U[t] S_{t-K}.

Privacy trap: the trainer then releases A G + B^ Z = B^ (C^ G + Z) with C^ = B^-1 A, so the
mechanism's privacy is set by sens(C^), not by the sens(C) of the dense solution. Every
:class:`~mfcli.strategies.operators.CompressedOperator` recomputes C^, its sensitivity and its loss
sens(C^)^2 ||B^||_F^2 from B^, and :func:`mfcli.strategies.operators.read_compressed` (the one reader of the
group, used by noise streams, adapters, account and inspect) re-derives them from the stored
``band``, ``u`` and ``v`` before it returns anything.

Compressed artifact layout (format v1, docs/artifact-format.md): the root keeps the dense
workload / strategy / decoder it was made from, and group ``compressed`` holds datasets ``band``
(n x K, ``band[t, i] = B^[t, t - i]``, zero where t - i < 0), ``u`` and ``v`` (n x R; rows of
``u`` before K and rows of ``v`` after n - 1 - K are never used and are written as zero) and
attributes ``band``, ``rank``, ``sensitivity``, ``loss_total``, ``loss_increase`` and more.

Example:
    >>> from mfcli.model.workloads import prefix_workload
    >>> from mfcli.optimize.dense import optimal_factorization
    >>> fact = optimal_factorization(prefix_workload(16).matrix, tol=1e-9).factorization
    >>> comp = compress_factorization(fact, band=16, rank=0)   # K = n keeps B exactly
    >>> bool(np.array_equal(comp.decoder, fact.decoder)), abs(comp.loss_increase) < 1e-12
    (True, True)
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mfcli.errors import MfcliError
from mfcli.model.factorization import Factorization, sensitivity
from mfcli.model.participation import Participation, SingleParticipation
from mfcli.model.participation import sensitivity as schema_sensitivity
from mfcli.strategies.operators import (
    GROUP,
    BandedLowRank,
    CompressedOperator,
    band_values,
    check_band_rank,
    strategy_for_decoder,
)
from mfcli.util.search import smallest_true

#: Default cap on the rank tried by the automatic search.
DEFAULT_MAX_SEARCH_RANK = 64
#: Rows of the batched R x R solves done at once in ALS (bounds memory to CHUNK * R^2 floats).
_CHUNK_FLOATS = 1 << 22

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
    # only the last iterate is kept (the iterates are yielded from the start, so there is one)
    it, u, v = deque(als_iterates(block, rank, max_iter=iterations, seed=seed), maxlen=1)[0]
    res = float(np.linalg.norm(block - np.tril(u @ v.T)))
    uf, vf = _embed(u, v, n, band)
    return LowRankFit(uf, vf, it, res, target)


# --------------------------------------------------------------------------------------------
# Compressing a factorization
# --------------------------------------------------------------------------------------------


def _require_square(fact: Factorization) -> None:
    if fact.m != fact.n:
        raise MfcliError(
            f"compression needs a square decoder; this strategy has {fact.m} rows for n = {fact.n} "
            "(a tree or other non-square baseline)"
        )


#: ALS iterations at which the true loss is evaluated (powers of two, and max_iter itself).
CHECKPOINTS = tuple(2**i for i in range(20))
DEFAULT_MAX_ITER = 64


def _multi(participation: Participation | None) -> bool:
    return participation is not None and not isinstance(participation, SingleParticipation)


def mechanism_loss(strategy: np.ndarray, decoder: np.ndarray, participation: Participation | None = None) -> float:
    """sens(C)^2 ||B||_F^2: the total loss of (C, B) at noise multiplier 1, with sens(C) under
    ``participation`` (None or single: the single-participation sensitivity; otherwise the schema's
    :func:`mfcli.model.participation.sensitivity` value, an upper bound where it is not exact, as the
    accounting uses it)."""
    if participation is None or isinstance(participation, SingleParticipation):
        s = sensitivity(strategy)
    else:
        s = schema_sensitivity(strategy, participation).value
    return float(s) ** 2 * float(np.sum(np.asarray(decoder) ** 2))


def check_als_iterations(max_iter: Any) -> int:
    """The most ALS iterations: an integer >= 0 (0 keeps the randomized-SVD start)."""
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 0:
        raise MfcliError(f"max ALS iterations must be an integer >= 0, got {max_iter!r}")
    return int(max_iter)


def check_max_loss_increase(max_loss_increase: Any) -> float:
    """A budget on the relative loss increase: a finite number >= 0. 0 is allowed: it is met by a
    setting that does not raise the loss at all (B^ = B exactly, or a non-optimal B whose
    compression lowers the loss), though roundoff in C^ = B^-1 A can put even K = n, R = 0 a
    little above it."""
    if (isinstance(max_loss_increase, bool) or not isinstance(max_loss_increase, (int, float, np.floating))
            or not math.isfinite(max_loss_increase) or max_loss_increase < 0):
        raise MfcliError(f"the budget on the loss increase must be a finite number >= 0, got {max_loss_increase!r}")
    return float(max_loss_increase)


def percent(fraction: float) -> str:
    """``fraction`` as a percentage with four decimals (``1.2500%``), or, where those would show a
    nonzero value as 0.0000%, with three significant digits (``3.55e-12%``), so a loss increase
    that misses a budget of 0 is never shown as 0."""
    text = f"{fraction:.4%}"
    if fraction != 0 and text.lstrip("-") == "0.0000%":
        return f"{100 * fraction:.3g}%"
    return text


def compress_factorization(
    fact: Factorization, *, band: int, rank: int, max_iter: int = DEFAULT_MAX_ITER,
    participation: Participation | None = None,
) -> CompressedOperator:
    """Compress the decoder of a square factorization to K exact diagonals plus a rank-R tail.

    B^ = band_K(B) + mask(U V^T) with U, V from alternating least squares on the masked entries
    (:func:`als_iterates`). ALS minimises the Frobenius error ||B - B^||_F, which is only a
    proxy: what matters is the loss sens(C^)^2 ||B^||_F^2 with C^ = B^-1 A, and a tighter
    Frobenius fit can raise sens(C^) (the loss is not monotone along the ALS iterations). So the
    loss is recomputed at iterations 1, 2, 4, 8, ... and ``max_iter`` and the iterate with the
    lowest loss is kept: never worse than plain ALS stopped at ``max_iter``. Deterministic.
    ``participation``: the schema whose loss picks the iterate (default single participation);
    under a multi-participation schema sens(C^) is that schema's.

    Only the decoder B is used (and A, to form C^); entries of B above the diagonal (a non-causal
    B) are dropped, so B^ is always lower-triangular.

    Formal guarantees: the returned :class:`~mfcli.strategies.operators.CompressedOperator` carries C^ = B^-1 A recomputed from
    the returned B^, verified A = B^ C^; its sensitivity and loss describe that mechanism.

    Raises:
        MfcliError: K or R out of range, a non-square factorization, or a B^ that cannot be
            inverted stably.
    """
    _require_square(fact)
    n = fact.n
    check_band_rank(n, band, rank)
    check_als_iterations(max_iter)
    b = fact.decoder
    a = fact.workload
    bv = band_values(b, band)
    m = n - band
    block = masked_block(b, band) if m > 0 else np.zeros((0, 0))

    def build(u: np.ndarray, v: np.ndarray, iterations: int) -> CompressedOperator:
        return CompressedOperator.build(fact, BandedLowRank(band=bv, u=u, v=v), als_iterations=iterations)

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
        b_hat = BandedLowRank(band=bv, u=uf, v=vf).dense()
        try:
            c_hat = strategy_for_decoder(a, b_hat)
        except MfcliError as exc:  # an ill-conditioned iterate: not a candidate
            failure = exc
            continue
        loss = mechanism_loss(c_hat, b_hat, participation)
        if best is None or loss < best[0]:
            best = (loss, uf, vf, it)
    if best is None:
        raise failure or MfcliError("ALS produced no usable compressed decoder")
    return build(best[1], best[2], best[3])


# --------------------------------------------------------------------------------------------
# Choosing (K, R) for a loss budget
# --------------------------------------------------------------------------------------------


class Evaluation(NamedTuple):
    """One (K, R) tried by :func:`search_compression`: the loss increase and sens(C^) under the
    search's participation schema (the budget's quantity)."""

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

    compression: CompressedOperator
    max_loss_increase: float
    evaluations: tuple[Evaluation, ...] = field(default_factory=tuple)
    participation: Participation = field(default_factory=SingleParticipation)


class _Search:
    """The state of one (K, R) search: the settings evaluated (cached) and the cheapest feasible
    one so far. Each method is one step of :func:`search_compression`."""

    def __init__(
        self, fact: Factorization, *, max_loss_increase: float, k_cap: int, r_cap: int, max_iter: int,
        progress: Callable[[Evaluation], None] | None, participation: Participation | None = None,
    ) -> None:
        self.fact = fact
        self.participation = participation if _multi(participation) else None
        # the dense mechanism's loss under the schema, once (single participation: the operator's own)
        self.dense_loss = (mechanism_loss(fact.strategy, fact.decoder, self.participation)
                           if self.participation is not None else None)
        self.n = fact.n
        self.budget = max_loss_increase
        self.k_cap = k_cap
        self.r_cap = r_cap
        self.max_iter = max_iter
        self.progress = progress
        self.evaluations: list[Evaluation] = []
        self.cache: dict[tuple[int, int], Evaluation] = {}
        self.best: Evaluation | None = None
        self.best_operator: CompressedOperator | None = None

    def evaluate(self, k: int, r: int) -> Evaluation:
        """Compress at (k, r) once (cached); keep it if it is the cheapest feasible so far."""
        key = (k, r)
        if key in self.cache:
            return self.cache[key]
        comp = compress_factorization(self.fact, band=k, rank=r, max_iter=self.max_iter,
                                      participation=self.participation)
        if self.participation is None or self.dense_loss is None:
            e = Evaluation(k, r, comp.loss_increase, comp.sensitivity)
        else:
            f = comp.factorization
            sens = float(schema_sensitivity(f.strategy, self.participation).value)
            loss = sens**2 * float(np.sum(f.decoder**2))
            e = Evaluation(k, r, loss / self.dense_loss - 1.0, sens)
        self.cache[key] = e
        self.evaluations.append(e)
        if self.progress is not None:
            self.progress(e)
        if e.loss_increase <= self.budget and (
            self.best is None or (e.cost, e.loss_increase) < (self.best.cost, self.best.loss_increase)
        ):
            self.best, self.best_operator = e, comp
        return e

    def ok(self, k: int, r: int) -> bool:
        return self.evaluate(k, r).loss_increase <= self.budget

    @staticmethod
    def first_feasible(lo: int, hi: int, feasible: Callable[[int], bool]) -> int | None:
        """Smallest x in [lo, hi] with feasible(x), by bisection (feasibility assumed monotone), or None."""
        if hi < lo or not feasible(hi):
            return None
        return smallest_true(feasible, lo, hi)

    def smallest_k(self, r: int, hi: int) -> int | None:
        """Smallest feasible K in [1, hi] at rank r, or None."""
        return self.first_feasible(1, min(hi, self.n - r, self.k_cap), lambda k: self.ok(k, r))

    def smallest_r(self, k: int) -> int | None:
        """Smallest feasible R in [0, r_cap] at band k, or None."""
        return self.first_feasible(0, min(self.r_cap, self.n - k), lambda r: self.ok(k, r))

    def diagonal_bound(self) -> int:
        """An upper bound on the cost from the diagonal K = R (doubling, then bisection),
        starting from the always feasible K = n, R = 0 (B itself)."""
        n = self.n
        best_cost = n
        d_lo, d_hi = 0, None
        d = 1
        while 2 * d <= n and d <= min(self.r_cap, self.k_cap):
            if self.ok(d, d):
                d_hi = d
                break
            d_lo = d
            d *= 2
        if d_hi is not None:
            while d_hi - d_lo > 1:
                mid = (d_lo + d_hi) // 2
                if self.ok(mid, mid):
                    d_hi = mid
                else:
                    d_lo = mid
            best_cost = min(best_cost, 2 * d_hi)
        return best_cost

    def cheapest(self) -> None:
        """The bound from the diagonal, then, for R = 0, 1, ..., the smallest feasible K below
        both the bound and the previous R's smallest K."""
        best_cost = self.diagonal_bound()
        k_prev = self.n
        r = 0
        while r <= self.r_cap and r + 1 <= best_cost:
            k = self.smallest_k(r, min(best_cost - r, k_prev))
            if k is not None:
                best_cost = min(best_cost, k + r)
                k_prev = k
                if k == 1:
                    break
            r += 1
        if self.best is None:
            self.ok(min(self.n, self.k_cap), 0)

    def result(self) -> SearchResult:
        if self.best_operator is None:
            tried = min(self.evaluations, key=lambda e: e.loss_increase) if self.evaluations else None
            where = (
                f"; the best tried, K = {tried.band}, R = {tried.rank}, increases the loss by {percent(tried.loss_increase)}"
                if tried else ""
            )
            raise MfcliError(
                f"no compression within the limits keeps the loss increase <= {self.budget:g}{where}"
            )
        return SearchResult(self.best_operator, self.budget, tuple(self.evaluations),
                            self.participation or SingleParticipation())


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
    participation: Participation | None = None,
) -> SearchResult:
    """Find the cheapest (K, R), cost K + R per streamed step, whose loss increase is within
    ``max_loss_increase`` (ties: lower loss). A fixed ``band`` or ``rank`` is kept as given.
    The loss is sens(C^)^2 ||B^||_F^2 under ``participation`` (default single participation;
    under a multi-participation schema its sensitivity, an upper bound where not exact), relative
    to the dense mechanism's under the same schema.

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
    max_loss_increase = check_max_loss_increase(max_loss_increase)
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

    search = _Search(fact, max_loss_increase=float(max_loss_increase), k_cap=k_cap, r_cap=r_cap,
                     max_iter=max_iter, progress=progress, participation=participation)
    if band is not None and rank is not None:
        search.evaluate(band, rank)
    elif band is not None:
        search.smallest_r(band)
    elif rank is not None:
        search.smallest_k(rank, n)
    else:
        search.cheapest()
    return search.result()


# --------------------------------------------------------------------------------------------
# Artifacts: write a compressed artifact, load and verify the compressed group
# --------------------------------------------------------------------------------------------


def default_output_path(source: str | Path, band: int, rank: int) -> Path:
    """``<input stem>-k<K>r<R>.h5`` beside the input."""
    p = Path(source)
    return p.with_name(f"{p.stem}-k{band}r{rank}.h5")


def check_compressible(artifact: Any, *, force: bool = False) -> None:
    """Refuse a non-square, non-causal or already compressed artifact (the last two unless
    ``force``), with a message that says why."""
    fact = artifact.factorization
    _require_square(fact)
    if GROUP in artifact.groups and not force:
        raise MfcliError(
            f"{artifact.path} is already compressed (K = {artifact.groups[GROUP]['attrs'].get('band')}, "
            f"R = {artifact.groups[GROUP]['attrs'].get('rank')}); pass force=True to compress its dense decoder again"
        )
    if not fact.causal and not force:
        raise MfcliError(
            f"{artifact.path} is not causal (strategy {artifact.strategy_name!r} is offline-only); "
            "its entries above the diagonal would be dropped. Pass force=True to compress anyway"
        )


@dataclass(frozen=True, eq=False)
class CompressedArtifact:
    """What :func:`compress_artifact` wrote."""

    path: Path
    sha256: str
    compression: CompressedOperator
    search: SearchResult | None


#: Attributes of the ``compressed`` group under a multi-participation schema: the compressed
#: operator's sensitivity under the artifact's schema (upper bound), whether it is attained, the
#: attained lower value, and the method (:class:`mfcli.model.participation.Sensitivity`).
SCHEMA_ATTRS = ("schema_sensitivity", "schema_sensitivity_exact", "schema_sensitivity_lower",
                "schema_sensitivity_method")


def stored_schema(declared: Participation, requested: Participation | None, what: str) -> Participation:
    """The schema a compressed artifact stores: ``requested``, or the one the source declares.
    A request that contradicts a declared multi-participation schema is refused.

    Raises:
        MfcliError: the contradiction, in one line.
    """
    if requested is None or requested == declared or isinstance(declared, SingleParticipation):
        return declared if requested is None else requested
    raise MfcliError(f"{what} declares {declared.describe()}; compressing it for {requested.describe()} instead "
                     "is refused (give its own schema or none)")


def schema_sensitivity_attrs(strategy_matrix: np.ndarray, schema: Participation) -> dict[str, Any]:
    """:data:`SCHEMA_ATTRS` of C under ``schema``, recomputed (empty under single participation,
    where ``sensitivity`` is the schema's)."""
    from mfcli.model.participation import sensitivity as schema_sensitivity

    if isinstance(schema, SingleParticipation):
        return {}
    s = schema_sensitivity(np.asarray(strategy_matrix, dtype=np.float64), schema)
    return dict(zip(SCHEMA_ATTRS, (float(s.value), bool(s.exact), float(s.lower), str(s.method)), strict=True))


def _with_schema(group: dict, comp: CompressedOperator, schema: Participation) -> dict:
    return {**group, "attrs": {**group["attrs"], **schema_sensitivity_attrs(comp.factorization.strategy, schema)}}


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
    participation: Participation | None = None,
) -> CompressedArtifact:
    """Load and verify ``source``, compress its decoder and write a NEW artifact (atomically).

    With both ``band`` and ``rank``: that setting (and, if ``max_loss_increase`` is given, a
    check that it meets it; nothing is written otherwise). With ``max_loss_increase``: the
    cheapest setting meeting it (see :func:`search_compression`), keeping any of K, R given; the
    loss increase is measured under the schema stored (``participation``, else the declared one).
    The input file is never modified; ``out`` defaults to ``<stem>-k<K>r<R>.h5`` beside it.

    ``participation`` (None: the schema the source declares) is stored in the new artifact; under
    a multi-participation schema the ``compressed`` group also stores the compressed operator's
    sensitivity under it (:data:`SCHEMA_ATTRS`), recomputed from C^ = B^-1 A by
    :func:`mfcli.model.participation.sensitivity` (exact, or an upper bound labelled as one), which
    ``mfcli inspect`` checks against a fresh recomputation.

    Raises:
        MfcliError: a schema that contradicts a multi-participation schema the source declares,
            or that does not fit n; nothing is written.
    """
    from mfcli.io.artifact import file_sha256, load_artifact, refuse_input_as_output, save_artifact

    src = Path(source)
    if out is not None:  # before the search, which can take minutes
        refuse_input_as_output(out, [(src, "artifact")], what="compression")
    art = load_artifact(src)
    check_compressible(art, force=force)
    schema = stored_schema(art.participation, participation, str(src))
    schema.check(art.n)
    # An already compressed input (with force) is recompressed from its dense root decoder; its
    # old group is not carried over.
    fact = art.factorization
    search: SearchResult | None = None
    if max_loss_increase is not None:
        search = search_compression(
            fact, max_loss_increase=max_loss_increase, band=band, rank=rank,
            max_band=max_band, max_rank=max_rank, max_iter=max_iter, progress=progress, participation=schema,
        )
        comp = search.compression
    elif band is not None and rank is not None:
        comp = compress_factorization(fact, band=band, rank=rank, max_iter=max_iter, participation=schema)
    else:
        raise MfcliError("give both band and rank, or max_loss_increase to choose them")

    target = Path(out) if out is not None else default_output_path(src, comp.band, comp.rank)
    if out is None:  # a given out was checked before the search; the default name only now exists
        refuse_input_as_output(target, [(src, "artifact")], what="compression")
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
        groups={GROUP: _with_schema(comp.group(source=source_info), comp, schema)},
        force=force,
        # None keeps a single-participation file as it was (no attribute means single participation).
        participation=None if isinstance(schema, SingleParticipation) else schema,
    )
    return CompressedArtifact(path=target, sha256=digest, compression=comp, search=search)
