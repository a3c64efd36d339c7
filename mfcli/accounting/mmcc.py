"""Amplified accounting for matrix mechanisms with Poisson sampling (MMCC-style), as derived in
docs/accounting.md, section "MMCC: amplification by Poisson sampling for any non-negative causal C"
(after Choquette-Choo, Ganesh, Steinke, Thakurta 2024, "Privacy amplification for matrix
mechanisms", arXiv:2310.15526).

Model. C (m x n, non-negative) is scaled to max column norm 1 and sigma_eff = sigma / sens(C) is
the noise multiplier per unit sensitivity. Rows are released in order; row r uses only columns
j <= t(r) (its release step). The example takes part in step j independently with probability p
(Poisson sampling); neighbouring datasets differ by adding or removing it. The scalar dominating
pair (the paper's Thm 4.8 / Cor. 4.7) is P = N(0, sigma^2 I_m) against Q = E_b N(C b, sigma^2 I_m),
b_j ~ Bernoulli(p) i.i.d.

Algorithm ("MMCC-style conditional composition; a valid upper bound, possibly looser than the
paper's algorithm"), delta = delta_pld + delta_tail + delta_trunc:

1. Tail events (:func:`tail_epsilons`). With G = C[:r]^T C[:r] the Gram matrix of the rows
   released before r, for every pair (r, j) with C[r, j] > 0 and G[j, j] > 0 the log-likelihood
   ratio of the earlier outputs for "j took part" is at most
   l = (W + sigma sqrt(G[j,j]) N(0,1) - G[j,j]/2) / sigma^2, W = sum_j' b_j' G[j, j'] (under Q;
   under P it is smaller since W = 0). Each of the K pairs gets delta_rj = delta_tail / K and eps_rj
   is the smallest eps with T(eps) = P(l > eps) <= delta_rj. The law of W is computed exactly on
   the grid h_W (every G[j, j'] rounded UP to a multiple of h_W) by convolving binomials (one per
   distinct rounded value), with the mass above a cap counted as always in the tail.
2. Posterior bounds. p~_rj = p e^eps_rj / (p e^eps_rj + 1 - p) on the event that every l <= eps_rj
   (Bayes' rule; the supremum over the other participations is taken since C >= 0); p~ = p for a
   column not seen before row r; p~ = 1 if the tail cannot be met.
3. Row mechanism (:func:`row_mixture`). S_r = sum_j C[r, j] B_j, B_j ~ Bernoulli(p~_rj)
   independent, with every C[r, j] rounded UP to the grid 1/M (default 1/50 = 0.02); the law of
   S_r is a convolution. Upper-tail mass beyond the point where it falls below eta_r is cut and
   the rest renormalised; the cut joins delta as delta_trunc = sum_r eta_r / (1 - eta_r) (below
   1e-6 delta): in the remove direction the pair with the cut is dominated by "with probability
   eta_r reveal everything, otherwise the renormalised mixture" (cost eta_r); in the add direction
   Q >= (1 - eta_r) Q' gives H(P || Q) <= H(P || Q') + eta_r / (1 - eta_r), the larger charge. The row is the dp-accounting
   event MixtureOfGaussiansDpEvent(sigma_eff, support, probabilities).
4. Composition. Identical rows are grouped (SelfComposedDpEvent); every distinct row's pessimistic
   PLD is built (:mod:`mfcli.accounting.mog_pld`, equal to dp-accounting's builder) and all are
   composed; eps = get_epsilon_for_delta(delta_pld), raised where needed to an epsilon certified
   against the composition's FFT round-off (:mod:`mfcli.accounting.pld_certify`).

Why it is valid (lemma level): conditional composition (on the event that every l <= eps_rj, each
row's conditional pair is dominated by the row mixture; the event fails with probability at most
delta_tail under both P and Q); the conditional law of the participations given the past is
coordinatewise dominated by independent Bernoulli(p~) (each conditional probability is at most p~),
and S_r is monotone in them since C >= 0; a mixture of N(s, sigma^2) over s >= 0 has a monotone
likelihood ratio, so rounding s up (in the stochastic order) can only increase both hockey-stick
divergences; the PLD discretisation is pessimistic.

Also here: the lower bound (post-processed statistic 1^T C^-1 y, exact), and the full-participation
sanity bound (a Gaussian with sensitivity ||C 1||_2).
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np
from scipy import special

from mfcli.accounting import mmcc_lower, mog_pld, pld_certify, pld_ops
from mfcli.accounting.defaults import DEFAULT_MIXTURE_RESOLUTION, DEFAULT_TAIL_FRACTION
from mfcli.accounting.events import plain_json, plain_mixture_rows
from mfcli.accounting.single_pass import (
    DEFAULT_DELTA,
    DEFAULT_DISCRETIZATION,
    check_delta,
    check_pld_inputs,
    check_sampling,
    check_sigma,
    gaussian_epsilon,
)
from mfcli.errors import MfcliError
from mfcli.util.blas import blas_threads
from mfcli.util.floating import ELEMENTARY_ULPS, NDTR_ULPS_0, NDTR_ULPS_2, UNIT_ROUNDOFF, gamma
from mfcli.util.memory import check_memory, format_size
from mfcli.util.progress import ProgressCallback, Ticker
from mfcli.util.rows import fields_of
from mfcli.util.search import smallest_true

#: Share of delta spent on cutting the row mixtures' upper tails (all rows together).
TRUNCATION_SHARE = 1e-6
#: Work budget of all row PLDs together: sum over distinct rows of (privacy-curve points) x
#: (support size). The PLD grid is coarsened in 1-2-5 steps from the requested one until it fits.
PLD_WORK_BUDGET = 3e7
#: Default R of the row mixtures' fine grid 1/(M R): weights are convolved there and only each row's
#: sum is rounded up to the grid 1/M (:func:`coarsen_up`).
DEFAULT_MIXTURE_REFINEMENT = 20
#: Element operations allowed for all rows' fine-grid convolutions together (about a second or
#: two); rows that would exceed their share use a smaller refinement (:func:`row_refinement`).
ROW_WORK_BUDGET = 1e9
#: Default u of :func:`tail_allocation`: the share of delta_tail split uniformly over the tail
#: events (the rest in proportion to C[r, j]).
DEFAULT_TAIL_UNIFORM_SHARE = 1.0
#: Keys of the tail step per batch (memory: batch x cap doubles).
_TAIL_BATCH = 1024


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _single_blas_thread(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with BLAS limited to one thread (:func:`mfcli.util.blas.blas_threads`): MMCC's matrix
    products are small (about 10^3 x 20 by 20 x 10^2, and matrix-vector products inside the PLD
    builder), where a second thread adds CPU time (it spins, and stalls under load: the headline
    account took 17 s of CPU with two threads and 12 s with one, on 2 cores under load ~8) and
    saves little wall time. Each product's entries are summed in the same order either way: the
    numbers are those of the default."""
    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with blas_threads(1, scipy_blas=False):  # numpy.linalg and numpy products only
            return fn(*args, **kwargs)
    return wrapper


# ---------------------------------------------------------------------------------------------
# Input checks


@dataclass(frozen=True)
class PreparedStrategy:
    """A strategy checked for MMCC: non-negative, causal in release order, scaled to unit sensitivity.

    Attributes:
        strategy: C / sens(C) (m x n).
        sensitivity: sens(C) of the matrix as given.
        release_steps: t(r) for every row.
    """

    strategy: np.ndarray
    sensitivity: float
    release_steps: np.ndarray

    @property
    def m(self) -> int:
        return self.strategy.shape[0]

    @property
    def n(self) -> int:
        return self.strategy.shape[1]


#: What holds for a C that MMCC refuses (negative entries): not the single-pass bound (under
#: Poisson sampling an example may take part in many steps), but the deterministic bound over
#: every participation pattern, which joint convexity of the hockey-stick divergence carries over
#: to the sampler's mixture (docs/accounting.md, "A C with negative entries").
NEGATIVE_C_ADVICE = ("Without amplification, the deterministic bound over every participation pattern (minimum "
                     "separation 1: any subset of the steps) is valid under Poisson sampling; the single-pass bound "
                     "is not, since an example may take part in many steps")


def check_causal(strategy: np.ndarray, release_steps: np.ndarray, *, what: str) -> None:
    """Refuse a C that is not causal in release order: an entry C[r, j] != 0 with j > t(r) (exact,
    as :func:`mfcli.model.factorization.is_lower_triangular`). Row r's release would then depend on a
    gradient of a later step, and the adaptive analyses (``what`` names the one that assumes it:
    MMCC, the single-pass and deterministic Gaussian bounds) do not hold.

    Raises:
        MfcliError: in one line, naming the first such entry.
    """
    c = np.asarray(strategy)
    t = np.asarray(release_steps)
    cols = np.arange(c.shape[1])
    bad = (c != 0) & (cols[None, :] > t[:, None])
    if np.any(bad):
        r, j = np.argwhere(bad)[0]
        raise MfcliError(
            f"the strategy C is not causal: row {r} (released at step {t[r]}) uses column {j}; "
            f"{what} needs C lower-triangular in release order (gradients chosen adaptively)"
        )


def prepare_strategy(strategy: np.ndarray | PreparedStrategy,
                     release_steps: Sequence[int] | np.ndarray | None = None) -> PreparedStrategy:
    """Check C for MMCC and scale it to max column norm 1. A strategy prepared already is
    returned as it is (with its own release steps), so every MMCC function takes either.

    Raises:
        MfcliError: C not a finite 2-D array, a negative entry, a zero column, release steps that
            are not non-decreasing in range, or an entry C[r, j] != 0 with j > t(r) (non-causal).
    """
    if isinstance(strategy, PreparedStrategy):
        return strategy
    c = np.asarray(strategy, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] == 0 or c.shape[1] == 0:
        raise MfcliError(f"the strategy C must be a non-empty 2-D matrix, got shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise MfcliError("the strategy C contains NaN or infinite entries")
    m, n = c.shape
    if np.any(c < 0):
        r, j = np.argwhere(c < 0)[0]
        raise MfcliError(
            f"MMCC needs a non-negative strategy C; C[{r}, {j}] = {c[r, j]:.3g} < 0. {NEGATIVE_C_ADVICE}"
        )
    if release_steps is None:
        if m != n:
            raise MfcliError(f"a non-square C ({m} x {n}) needs the release step of every row")
        t = np.arange(n)
    else:
        t = np.asarray(release_steps, dtype=np.int64)
        if t.shape != (m,):
            raise MfcliError(f"{t.size} release steps for {m} rows of C")
        if np.any(np.diff(t) < 0) or t.min() < 0 or t.max() >= n:
            raise MfcliError("release steps must be non-decreasing and within 0..n-1")
    check_causal(c, t, what="MMCC")
    norms = np.sqrt(np.einsum("ij,ij->j", c, c))
    if np.any(norms == 0):
        raise MfcliError(f"column {int(np.argmin(norms))} of C is zero: that step's gradient is never used")
    sens = float(norms.max())
    cn = c / sens
    nonzero = cn[cn != 0]
    if nonzero.size and float(nonzero.min()) < TINY_ENTRY:
        r, j = np.argwhere((cn != 0) & (cn < TINY_ENTRY))[0]
        raise MfcliError(
            f"C[{r}, {j}] = {c[r, j]:.3g} is below {TINY_ENTRY:.3g} of the largest column norm: MMCC's round-off "
            "bounds assume products of entries are normal floating-point numbers; set such entries to 0"
        )
    cn.setflags(write=False)
    t.setflags(write=False)
    return PreparedStrategy(strategy=cn, sensitivity=sens, release_steps=t)


#: Smallest non-zero entry of the scaled C that MMCC accepts (:func:`prepare_strategy`): products of
#: two entries stay normal numbers (>= 2^-1022), where the floating-point model of
#: :mod:`mfcli.util.floating` gives relative error bounds (:func:`gram_error`).
TINY_ENTRY = 2.0 ** -500


def _round_up_to_grid(x: np.ndarray, resolution: int) -> np.ndarray:
    """Integers k with k / resolution >= x (checked in floating point), x >= 0."""
    k = np.ceil(x * resolution)
    k += k / resolution < x  # (+ 1 where rounding left k / resolution below x; exact)
    return k.astype(np.int64)


def default_tail_resolution(sigma_eff: float) -> int:
    """Grid 1/M_W for W: h_W = 0.01 sigma^2 clipped to [1e-3, 0.05] (rounding W up by h_W per
    participant moves eps_rj by at most h_W / sigma^2 per participant, i.e. 1%)."""
    h = min(0.05, max(1e-3, 0.01 * sigma_eff * sigma_eff))
    return math.ceil(1.0 / h)


# ---------------------------------------------------------------------------------------------
# Step 1: tail events


@dataclass(frozen=True)
class TailPairs:
    """The (r, j) pairs of step 1, grouped by their tail problem.

    Attributes:
        rows: row index r of every pair.
        cols: column index j of every pair.
        key: index of the pair's distinct tail problem.
        counts: (U, M_W + 2) histogram of the rounded-up G[j, j'] (in units 1/M_W) per problem.
        g_index: (U,) the computed G[j, j] rounded up to the grid 2^-40: in ((g_index - 1) 2^-40,
            g_index 2^-40].
        resolution: M_W.
        g_slack: quanta 2^-40 by which :attr:`g_bounds` widens that interval on each side, so that it
            holds the exact G[j, j] and not only the computed one (:func:`gram_error`).
    """

    rows: np.ndarray
    cols: np.ndarray
    key: np.ndarray
    counts: np.ndarray
    g_index: np.ndarray
    resolution: int
    g_slack: int = 0

    def g_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(g_lo, g_hi) per problem: multiples of 2^-40 (exact) with g_lo <= the exact G[j, j] <= g_hi."""
        g_hi = (self.g_index + self.g_slack) * G_QUANTUM
        g_lo = np.maximum(self.g_index - 1 - self.g_slack, 0) * G_QUANTUM
        return g_lo, g_hi

    @property
    def count(self) -> int:
        return int(self.rows.size)


G_QUANTUM = 2.0 ** -40


def gram_error(m: int) -> float:
    """A relative bound e with |G - G_c| <= e G_c entrywise, G_c the Gram entries of
    :func:`collect_tail_pairs` (running sums over at most m rows of floating-point products of the
    prepared C's entries) and G the exact Gram entries of the exact scaled strategy.

    Why: the mechanism C x + sigma Z equals (C / s) x + (sigma / s) Z for any s > 0; take s =
    sigma / sigma_eff with sigma_eff the computed sigma / sens(C), so that sigma_eff is exact and
    the exact scaled entries are C[r, j] sigma_eff / sigma = C[r, j] / sens (1 + e1), while the
    prepared entries are fl(C[r, j] / sens) = C[r, j] / sens (1 + e2), |e1|, |e2| <= u: each exact
    entry is within (1 + u) / (1 - u) <= 1 + gamma_2 of the prepared one, a product within
    1 + gamma_4. G_c sums at most m non-negative products, each meeting at most m roundings (its
    own and the additions), so it is within gamma_m of the exact sum of the prepared products
    (Higham 3.1; every product a normal number: :func:`prepare_strategy` refuses entries below
    :data:`TINY_ENTRY`). Together: within gamma_(2 m + 8) (Higham, Lemma 3.3, with room)."""
    return gamma(2 * m + 8)


def _bytes_per_distinct(nbins: int) -> int:
    """Bytes per distinct tail problem while collecting: its int64 histogram (a row of its row's
    block), its dictionary key (int32 histogram + 8 bytes, ~33 of header), the dictionary slot (up
    to twice while it resizes), its g index, and the stacked copies of both made at the end."""
    return 8 * nbins + (4 * nbins + 8 + 33) + 2 * 48 + 8 + 8 * nbins + 8


#: Slack on the memory estimates: interpreter and allocator overheads the byte count leaves out.
_MEMORY_SLACK = (1.1, 2**19)


def tail_pairs_memory(prep: PreparedStrategy, *, resolution: int) -> tuple[int, int]:
    """Estimated peak bytes of :func:`collect_tail_pairs` before any distinct problem is stored:
    the m x n strategy (the caller's copy and the prepared one), G (n x n), the largest row's
    temporaries (the |pairs| x |seen columns| block of G, its rounding and bin indices, the
    |pairs| x bins histogram) and the pair arrays (three int64 per pair, twice while joined).
    What scales with n is G and the per-row block (both ~n^2 for a dense C); the distinct
    problems add :func:`_bytes_per_distinct` each and are checked while they are collected.

    Returns (fixed, worst): the fixed part, and the peak if every tail pair were a distinct
    problem (a dense optimal C at small sigma comes close; Toeplitz-like C far below)."""
    c = prep.strategy
    m, n = c.shape
    nbins = resolution + 2
    nz = c != 0
    used = nz.any(axis=0)
    first = np.where(used, nz.argmax(axis=0), m)  # first row using each column
    seen_before = np.searchsorted(np.sort(first), np.arange(m), side="left")  # columns seen before row r
    pairs_per_row = (nz & (first[None, :] < np.arange(m)[:, None])).sum(axis=1)
    block = int(np.max(pairs_per_row * (3 * 8 * seen_before + 2 * 8 * nbins), initial=0))
    k = int(pairs_per_row.sum())
    fixed = 2 * 8 * m * n + 8 * n * n + block + 2 * 3 * 8 * k
    scale, extra = _MEMORY_SLACK
    return int(scale * fixed + extra), int(scale * (fixed + k * _bytes_per_distinct(nbins)) + extra)


def collect_tail_pairs(prep: PreparedStrategy, *, resolution: int, max_memory: int | None = None,
                       on_progress: ProgressCallback | None = None) -> TailPairs:
    """Walk the rows in release order, keep G = C[:r]^T C[:r], and group the pairs (r, j) of
    step 1 by (G[j, j], multiset of rounded-up G[j, j']): identical problems are solved once.

    ``max_memory`` (bytes, None: no limit): the fixed part (:func:`tail_pairs_memory`) is checked
    before starting, and the distinct problems, whose number depends on C, as they are found.
    ``on_progress`` receives the rows walked (phase ``MMCC tail events``, :mod:`mfcli.util.progress`)."""
    c = prep.strategy
    m, n = c.shape
    fixed = tail_pairs_memory(prep, resolution=resolution)[0] if max_memory is not None else 0
    way = "raise the memory limit, or account a strategy with fewer steps or fewer nonzeros (a banded or compressed C)"
    check_memory(fixed, max_memory, what=f"collecting MMCC's tail events for this {m} x {n} strategy", way_forward=way)
    per_distinct = int(_MEMORY_SLACK[0] * _bytes_per_distinct(resolution + 2))
    room = None if max_memory is None else (max_memory - fixed) // per_distinct
    g = np.zeros((n, n))
    nbins = resolution + 2
    keys: dict[bytes, int] = {}
    distinct = 0
    counts_list: list[np.ndarray] = []  # blocks of rows of the histogram, in problem order
    gidx_list: list[np.ndarray] = []
    rows_out: list[np.ndarray] = []
    cols_out: list[np.ndarray] = []
    key_out: list[np.ndarray] = []
    seen = np.zeros(n, dtype=bool)
    # the exact Gram entries are within a relative e of the computed ones (gram_error): every entry
    # is raised by 1 + 2e before it is rounded up to the W grid, so that the exact k / M_W >=
    # fl(k / M_W) / (1 + u) >= fl(G_c (1 + 2e)) / (1 + u) >= G_c (1 + 2e) / (1 + u)^3 >= G_c (1 + e);
    # the diagonal's interval is widened by g_slack quanta each side (G <= 1 + 1e-9 < 2: columns of
    # norm at most 1 up to round-off)
    err_g = gram_error(m)
    g_up = 1.0 + 2.0 * err_g
    g_slack = math.ceil(2.0 * err_g / G_QUANTUM * 1.01)
    tick = Ticker(on_progress, "MMCC tail events", m, unit="rows")
    for r in range(m):
        tick(r)
        row = c[r]
        cols = np.flatnonzero(row)
        if cols.size == 0:
            continue
        pj = cols[seen[cols]]
        if pj.size:
            seen_cols = np.flatnonzero(seen)
            gsub = g[_submatrix(pj, seen_cols)]
            kk = _round_up_to_grid(gsub * g_up, resolution)
            kk = np.minimum(kk, nbins - 1)  # G <= 1 (unit columns), so this never binds beyond 1 + 1/M
            flat = (np.arange(pj.size)[:, None] * nbins + kk).ravel()
            hist = np.bincount(flat, minlength=pj.size * nbins).reshape(pj.size, nbins)
            hist[:, 0] = 0  # G[j, j'] = 0 contributes nothing to W
            gdiag = g[pj, pj]
            gq = np.ceil(gdiag / G_QUANTUM).astype(np.int64)
            kidx = np.empty(pj.size, dtype=np.int64)
            # every pair's key (its g index, then its histogram as int32) as one bytes object,
            # formed for the whole row at once
            raw = np.concatenate([gq[:, None].view(np.uint8), hist.astype(np.int32).view(np.uint8)], axis=1)
            row_keys = np.ascontiguousarray(raw).view(np.dtype((np.void, raw.shape[1]))).ravel().tolist()
            # each key's problem: its index if seen before, else the next one (setdefault reads
            # len(keys) before it inserts): problems numbered in the order they first occur
            kidx[:] = [keys.setdefault(kb, len(keys)) for kb in row_keys]
            if room is not None and len(keys) > room:  # (at most one row's problems beyond the room)
                check_memory(fixed + (room + 1) * per_distinct, max_memory, way_forward=way,
                             what=f"collecting MMCC's tail events for this {m} x {n} strategy "
                             f"({room} distinct tail problems by row {r} of {m})")
            # the row's pairs that open a new problem, in order: the first pair of each new index
            fresh = np.flatnonzero(kidx >= distinct)
            if fresh.size > len(keys) - distinct:  # pairs of this row sharing a new problem: its first pair
                fresh = fresh[np.unique(kidx[fresh], return_index=True)[1]]
            new = fresh
            distinct = len(keys)
            if new.size:  # their histograms and g indices, one block per row
                counts_list.append(hist[new].astype(np.int64))
                gidx_list.append(gq[new])
            rows_out.append(np.full(pj.size, r, dtype=np.int64))
            cols_out.append(pj)
            key_out.append(kidx)
        # G += c_r^T c_r on the row's support
        v = row[cols]
        g[_submatrix(cols, cols)] += np.outer(v, v)
        seen[cols] = True
    tick.finish()
    if counts_list:
        counts = np.vstack(counts_list)
        gidx = np.concatenate(gidx_list).astype(np.int64)
        rows_a, cols_a, key_a = np.concatenate(rows_out), np.concatenate(cols_out), np.concatenate(key_out)
    else:
        counts = np.zeros((0, nbins), dtype=np.int64)
        gidx = np.zeros(0, dtype=np.int64)
        rows_a = cols_a = key_a = np.zeros(0, dtype=np.int64)
    return TailPairs(rows=rows_a, cols=cols_a, key=key_a, counts=counts, g_index=gidx, resolution=resolution,
                     g_slack=g_slack)


def _submatrix(rows: np.ndarray, cols: np.ndarray) -> tuple[Any, ...]:
    """The index of the submatrix (``rows``, ``cols``) (sorted distinct indices): slices where both
    are ranges (a dense C), so that it is a view and no gathered copy, else ``np.ix_``."""
    def contiguous(idx: np.ndarray) -> bool:
        return bool(idx.size) and int(idx[-1]) - int(idx[0]) + 1 == idx.size

    if contiguous(rows) and contiguous(cols):
        return slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1)
    return np.ix_(rows, cols)


def w_law(counts: np.ndarray, p: float, cap: int, *, tiny: float = 1e-40) -> tuple[np.ndarray, np.ndarray]:
    """Law of W = sum of Bernoulli(p) terms with integer weights, truncated at ``cap`` (direct
    convolution; the reference for :func:`w_law_fft`).

    Args:
        counts: (B, K) - counts[b, k] terms of weight k (k = 0 ignored).
        p: Bernoulli probability.
        cap: grid points kept (values 0..cap-1).
        tiny: a binomial's upper tail below this is not expanded term by term (it is added to the
            overflow instead, which only makes the tail larger).

    Returns:
        (pmf, overflow): pmf[b, x] = P(W_b = x) for x < cap, overflow[b] >= P(W_b >= cap).

    Formal guarantees: every operation adds products of non-negative numbers (no cancellation);
    mass that is not tracked is counted in ``overflow``.
    """
    # scipy.stats costs about a second to import (docstring processing); only this reference path
    # uses it, the default FFT path does not
    from scipy import stats

    bsz, nb = counts.shape
    pmf = np.zeros((bsz, cap))
    pmf[:, 0] = 1.0
    ov = np.zeros(bsz)
    for k in range(1, nb):
        h = counts[:, k]
        hmax = int(h.max()) if bsz else 0
        if hmax == 0:
            continue
        # number of binomial terms to expand: all of them, or until the tail is negligible
        imax = hmax
        sf = stats.binom.sf(np.arange(hmax + 1), hmax, p)
        below = np.flatnonzero(sf < tiny)
        if below.size:
            imax = min(imax, int(below[0]))
        imax = min(imax, (cap - 1) // k + 1)
        i = np.arange(imax + 1)
        bi = stats.binom.pmf(i[None, :], h[:, None], p)  # (B, imax+1)
        tail = stats.binom.sf(imax, h, p)  # P(more than imax of these terms)
        rc = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]  # rc[:, x] = mass of pmf at >= x
        total = rc[:, 0].copy()
        new = pmf * bi[:, 0:1]
        add_ov = tail * total
        for ii in range(1, imax + 1):
            s = ii * k
            w = bi[:, ii:ii + 1]
            if s < cap:
                new[:, s:] += w * pmf[:, :cap - s]
                add_ov += w[:, 0] * rc[:, cap - s]
            else:
                add_ov += w[:, 0] * total
        pmf = new
        ov = ov + add_ov
    return pmf, ov


#: The l2 error allowance of a W pmf computed by FFT that the tail search once charged alone (a guess:
#: 10x the Cooley-Tukey bound of the transform alone). It stays inside the computed T (the proven
#: bound, :func:`_tail_T_up`, may count it); :func:`fft_error_l2` derives the bound, phi's forming included.
FFT_ERROR_L2 = 1e-13


def fft_error_l2(terms: int, nk: int, p: float, length: int, norm: np.ndarray | None = None) -> float | np.ndarray:
    """A bound on ||pmf_c - pmf_L||_2, pmf_c the pmf :func:`_w_pmf_fft` computes for a problem with
    at most ``terms`` Bernoulli terms of weights below ``nk``, pmf_L the exact law of W folded
    modulo L = ``length`` (inf for p >= 1/2, where 1 - p + p e^(i theta) can vanish). ``norm``:
    the computed ||pmf_c||_2 per problem (over all L values); without it ||pmf_L||_2 <= 1 is used.

    Model (:mod:`mfcli.util.floating`): numpy's exp, log, cos, sin, hypot and arctan2 within
    ELEMENTARY_ULPS u (glibc's: 1 to 2), the FFT within pld_certify's model (Higham Thm 24.2 with
    eta = pld_certify.FFT_ETA_ULPS u, an assumption shared with the composition's certificate).

    Derivation. z = 1 - p + p e^(-i theta), theta = 2 pi k w / L <= pi (nk - 1), formed with three
    roundings (|d theta| <= 3 u theta), cos/sin, a product and a complex sum: |z_c - z| <= e_z =
    u (3 + p (3 pi (nk - 1) + 2 ELEM + 1)). |z| lies in [1 - 2p, 1] and |arg z| <= A_ang =
    asin(p / (1 - p)), so log|z| and arg z are off by at most 1.01 e_z / (1 - 2p) each, plus ELEM
    u (1 + A_log) and ELEM u A_ang (hypot, log and arctan2; A_log = |log(1 - 2p)|). The exponents
    re = counts @ log|z| and im = counts @ arg z (at most ``terms`` counts; the products' gamma_nk
    of sum counts |.|) are off by E <= terms (2.02 e_z / (1 - 2p) + ELEM u (1 + A_log + A_ang)) +
    1.01 gamma_nk terms (A_log + A_ang) together, so phi_c = e^re_c (cos im_c + i sin im_c) (exp,
    cos, sin, two products) is within eps_phi |phi|, eps_phi = expm1(E) + e^E sqrt2 (2 ELEM + 2)
    u 1.01, at every frequency. By Parseval (||phi||_2 = sqrt(L) ||pmf_L||_2) the inverse DFT of
    the error has l2 norm <= eps_phi ||pmf_L||_2; the real inverse FFT adds alpha ||pmf of phi_c||_2
    <= alpha (1 + eps_phi) ||pmf_L||_2 (Higham's alpha = eta log2 L / (1 - eta log2 L); the 1/L
    scaling one rounding): the error is at most c ||pmf_L||_2 with c = (eps_phi + alpha (1 +
    eps_phi) + 2u) 1.01, and ||pmf_L||_2 <= ||pmf_c||_2 + the error (clipping negative values to 0
    only moves them towards pmf_L >= 0), so it is at most c ||pmf_c||_2 / (1 - c)."""
    if p >= 0.5:
        return math.inf if norm is None else np.full(np.shape(norm), math.inf)
    u = UNIT_ROUNDOFF
    el = ELEMENTARY_ULPS
    e_z = u * (3.0 + p * (3.0 * math.pi * max(nk - 1, 1) + 2.0 * el + 1.0))
    if e_z / (1.0 - 2.0 * p) > 0.019:
        # the linearisation 1.01 x of -log(1 - x) and asin(x) (x = e_z / (1 - 2p)) holds only for
        # x <= 0.019 (reviewer, 2026-12-02: p within ~3e-13 of 1/2): no bound beyond it
        return math.inf if norm is None else np.full(np.shape(norm), math.inf)
    a_log = abs(math.log1p(-2.0 * p))
    a_ang = math.asin(min(1.0, p / (1.0 - p)))
    big_e = terms * (2.02 * e_z / (1.0 - 2.0 * p) + el * u * (1.0 + a_log + a_ang)) \
        + 1.01 * gamma(nk) * terms * (a_log + a_ang)
    eps_phi = math.expm1(big_e) + math.exp(big_e) * math.sqrt(2.0) * (2.0 * el + 2.0) * u * 1.01
    t = pld_certify.FFT_ETA_ULPS * u * math.log2(max(length, 2))
    alpha = t / (1.0 - t)
    c = (eps_phi + alpha * (1.0 + eps_phi) + 2.0 * u) * 1.01
    if norm is None:
        return c
    return c * np.asarray(norm) * (1 + gamma(length + 2)) / (1.0 - c) * (1 + gamma(3))


def chernoff_error(counts: np.ndarray, p: float, log_mgf: np.ndarray, level: float | np.ndarray) -> np.ndarray:
    """A relative bound on the round-off of :func:`_chernoff_from_mgf` at ``level`` per problem: the
    exact Chernoff bound exp(lmgf(lam) - lam level) at the chosen lam (a valid bound on P(W >= level)
    for any lam >= 0) is at most the computed value times 1 + the result (:func:`_chernoff_and_error`)."""
    nk = counts.shape[1]
    return _chernoff_and_error(log_mgf, level, counts.sum(axis=1).astype(np.float64),
                               (counts @ np.arange(nk)).astype(np.float64), p, nk)[1]


def _chernoff_and_error(log_mgf: np.ndarray, level: float | np.ndarray, terms: np.ndarray, support: np.ndarray,
                        p: float, nk: int) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`_chernoff_from_mgf`'s value, its relative round-off bound) in one pass; ``terms`` and
    ``support`` per problem: sum_k counts_k and sum_k k counts_k.

    Each term log(1 - p + p e^(lam k)) = logaddexp(log1p(-p), log p + k lam) is within (2 ELEM +
    4) u (|log1p(-p)| + |log p| + k lam + 1) of exact (log1p, log, the product and sum, logaddexp's
    exp, log1p and max), has absolute value below that sum, and the product with counts adds
    gamma_K of sum counts |term|: the log-mgf is within (gamma_K + (2 ELEM + 4) u) S, S = sum_k
    counts_k (|log1p(-p)| + |log p| + k lam + 1) = terms (|log1p(-p)| + |log p| + 1) + lam support;
    subtracting lam level (two roundings) and exp (ELEM u) add the rest."""
    u = UNIT_ROUNDOFF
    lev = np.asarray(level, dtype=np.float64)
    bound = log_mgf - _CHERNOFF_LAMBDAS[None, :] * (lev[:, None] if lev.ndim else lev)
    j = np.argmin(bound, axis=1)
    rows = np.arange(bound.shape[0])
    lo = bound[rows, j]  # the minimum, as bound.min(axis=1) gives it
    value = np.minimum(1.0, np.exp(lo))
    lam = _CHERNOFF_LAMBDAS[j]
    a = abs(math.log1p(-p)) if p < 1 else 0.0
    big_s = terms * (a + abs(math.log(p)) + 1.0) + lam * support
    e = (gamma(nk) + (2 * ELEMENTARY_ULPS + 4) * u) * big_s + 2 * u * (np.abs(log_mgf[rows, j]) + lam * lev) \
        + (ELEMENTARY_ULPS + 1) * u
    return value, np.expm1(e * 1.01) * 1.01


def _log_mgf(counts: np.ndarray, p: float, lam: np.ndarray) -> np.ndarray:
    """log E[exp(lam W)] for every problem (rows) and lam (columns)."""
    k = np.arange(counts.shape[1])
    # log(1 - p + p e^(lam k)), overflow-free
    terms = np.logaddexp(math.log1p(-p) if p < 1 else -np.inf, math.log(p) + np.outer(k, lam))  # (K, n_lam)
    return counts @ terms


#: The lambda grid of :func:`chernoff_tail`.
_CHERNOFF_LAMBDAS = np.geomspace(1e-3, 20.0, 48)
_CHERNOFF_LAMBDAS.setflags(write=False)


def chernoff_tail(counts: np.ndarray, p: float, level: float) -> np.ndarray:
    """Upper bound on P(W >= level) (grid units): min over a lambda grid of
    exp(log E[e^(lam W)] - lam level) (Markov's inequality), capped at 1."""
    return _chernoff_from_mgf(_log_mgf(counts, p, _CHERNOFF_LAMBDAS), level)


def _chernoff_from_mgf(log_mgf: np.ndarray, level: float | np.ndarray) -> np.ndarray:
    """:func:`chernoff_tail` from its log-mgf table (problems x lambdas), which does not depend on
    the level: a search over levels computes the table once. ``level``: one value, or one per problem."""
    lev = np.asarray(level, dtype=np.float64)
    bound = log_mgf - _CHERNOFF_LAMBDAS[None, :] * (lev[:, None] if lev.ndim else lev)
    return np.minimum(1.0, np.exp(bound.min(axis=1)))


def w_law_fft(counts: np.ndarray, p: float, length: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Law of W on 0..length-1 through its characteristic function (the fast path).

    phi(w) = prod_k (1 - p + p e^(-2 pi i w k / L))^counts[k] is computed as exp(counts @ log(...))
    (one matrix product for all problems) and inverted by a real FFT of length L = ``length``.
    The FFT folds the mass at W >= L onto 0..L-1, i.e. onto smaller values; since the tail
    probability is increasing in W this could only lower T, so the caller adds an upper bound on
    P(W >= c) for some c <= L (:func:`chernoff_tail`) and uses the pmf below c only.

    Returns:
        (pmf, extra, err_l2): the computed pmf (negative round-off clipped to 0), an upper bound on
        P(W >= L) per problem, and a bound on the l2 norm of the pmf's round-off error.
    """
    pmf = _w_pmf_fft(counts, p, length)
    extra = chernoff_tail(counts, p, float(length))
    return pmf, extra, float(fft_error_l2(int(counts.sum(axis=1).max(initial=0)), counts.shape[1], p, length))


def _w_pmf_fft(counts: np.ndarray, p: float, length: int) -> np.ndarray:
    """The pmf of :func:`w_law_fft` alone (its folding bound is the caller's)."""
    logmag, ang = _fft_factors(counts.shape[1], p, length)
    cf = counts.astype(np.float64)
    re = cf @ logmag
    im = cf @ ang
    # phi = e^re (cos im + i sin im), its parts written in place: the same products as the complex
    # expression (whose 0 x sin and 0 x cos terms add exact zeros), without four complex temporaries
    phi = np.empty(re.shape, dtype=np.complex128)
    np.exp(re, out=re)
    np.multiply(re, np.cos(im), out=phi.real)
    np.multiply(re, np.sin(im, out=im), out=phi.imag)
    pmf = np.fft.irfft(phi, n=length, axis=1)
    np.maximum(pmf, 0.0, out=pmf)
    return pmf


@functools.lru_cache(maxsize=8)
def _fft_factors(nk: int, p: float, length: int) -> tuple[np.ndarray, np.ndarray]:
    """log |z| and arg z of z = 1 - p + p e^(-2 pi i w k / L) (k < nk, w <= L/2): the same for
    every batch of problems, so computed once per (nk, p, L)."""
    nfreq = length // 2 + 1
    w = np.arange(nfreq)
    k = np.arange(nk)
    z = 1 - p + p * np.exp(-2j * np.pi * np.outer(k, w) / length)  # (K, nfreq)
    mag = np.abs(z)
    logmag = np.where(mag > 0, np.log(np.where(mag > 0, mag, 1.0)), -1e4)
    ang = np.angle(z)
    logmag.setflags(write=False)
    ang.setflags(write=False)
    return logmag, ang


#: ndtr(-z) is exactly 0.0 for z >= this (scipy's erfc underflows to 0 beyond z = 37.68), and so
#: is exp(-z^2 / 2): a row of :func:`_tail_T` whose every z is at least this adds exactly nothing.
_F_ZERO_Z = 40.0


def _tail_z(eps: np.ndarray, n: int, *, sigma: float, h: float, g_lo: np.ndarray, g_hi: np.ndarray,
            start: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """-z of :func:`_tail_T` (rows: problems, columns: x = start..n-1), i.e. -y / tau(y). Formed as
    x h - (eps sigma^2 + g_lo/2) and scaled: the exact negatives of the values z would have
    (IEEE rounding is symmetric), without a pass to negate them. Every entry is computed on its
    own, so the columns from ``start`` on equal those of the full array bit for bit. ``out``: an
    array of the result's shape to write it to (no fresh array per Newton step)."""
    x = np.arange(start, n) * h
    nz = np.subtract(x[None, :], (eps * sigma * sigma + g_lo / 2)[:, None], out=out)  # -y
    # -y rises with x (x h is non-decreasing and rounding is monotone): only a row whose last
    # entry is positive has any y < 0, so the mask is formed only when one has
    neg = nz > 0 if nz.shape[1] and np.any(nz[:, -1] > 0) else None
    nz *= (1.0 / (sigma * np.sqrt(g_hi)))[:, None]
    if neg is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.sqrt(g_hi / g_lo)  # >= 1: the smaller tau for y < 0
        ratio = np.where(np.isfinite(ratio), ratio, np.inf)
        np.multiply(nz, ratio[:, None], out=nz, where=neg)
    return nz


#: z above which Phibar(z - 0.05) < 2^-1022: such an f_x is counted as known to 2^-1022 absolute
#: (mfcli.util.floating: ndtr has no relative accuracy there).
_Z_SUBNORMAL = 37.6


def _tail_z_at(eps: np.ndarray, x: np.ndarray, *, sigma: float, h: float, g_lo: np.ndarray,
               g_hi: np.ndarray) -> np.ndarray:
    """-z of :func:`_tail_z` at column x[b] of every row b: the same operations on the same values,
    so equal to that entry bit for bit."""
    nz = np.subtract(x.astype(np.float64) * h, eps * sigma * sigma + g_lo / 2)
    neg = nz > 0
    nz *= 1.0 / (sigma * np.sqrt(g_hi))
    if np.any(neg):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.sqrt(g_hi / g_lo)
        ratio = np.where(np.isfinite(ratio), ratio, np.inf)
        np.multiply(nz, ratio, out=nz, where=neg)
    return nz


def _tail_roundoff(eps: np.ndarray, last: np.ndarray, *, sigma: float, h: float, g_lo: np.ndarray,
                   g_hi: np.ndarray, zf: tuple[np.ndarray, np.ndarray] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(r, d, zabs, f_last) per problem for the columns 0..last[b] of :func:`_tail_T` at ``eps``:
    every computed f_x = ndtr(-z_c) is within F_x <= f_c (1 + r) + 2^-1021 of the exact
    F_x = Phibar(u_x) (u_x = y_x / tau(y_x) at the exact grid value x / M_W; the argument's error
    is at most d), zabs >= every |z_c|, f_last the computed f at x = last.

    Why: z falls with x, so z_c at x = 0 and at x = last (formed exactly as :func:`_tail_z` forms
    every entry) bound all. y_c = fl(x h - fl(eps sigma sigma + g_lo / 2)) is within gamma_6 (A +
    (last + 1) h) of the exact y, A = eps sigma^2 + g_lo/2 (non-negative terms, x h within gamma_2
    of x / M_W, the subtraction); the scale (and the ratio of the y < 0 branch) add gamma_7 |z|.
    Where every exact y is positive (z_c(last) tau_hi > 2 err_y) the branch is tau_hi's, else
    tau_lo bounds both, and where the computed and exact y differ in sign both z are within err_y
    / tau_lo of 0: d = 1.01 (2 err_y / tau + gamma_7 zabs). Phibar's hazard phi / Phibar is at
    most z_+ + 1 (Sampford: (z + sqrt(z^2 + 4)) / 2), so Phibar(z_c - d) <= Phibar(z_c) e^(d (z_+ +
    1)); ndtr is within (NDTR_ULPS_0 + NDTR_ULPS_2 t^2) u of Phibar(z_c) (t = z_c, the assumption
    of mfcli.util.floating) where that value is a normal number; entries with z_c >= 37.6 have
    Phibar(z_c - d) < 2^-1022 (d < 0.05) and are counted in the absolute 2^-1021. ``zf``: the -z
    and f arrays :func:`_tail_T` formed at ``eps`` (read there instead of formed again)."""
    if zf is not None:
        rows = np.arange(last.size)
        z0, nz_last, f_last = zf[0][:, 0], zf[0][rows, last], zf[1][rows, last]
    else:
        kw: dict[str, Any] = dict(sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
        z0 = _tail_z(eps, 1, **kw)[:, 0]
        nz_last = _tail_z_at(eps, last, **kw)
        f_last = special.ndtr(nz_last)
    rel, d, zabs = _roundoff_from(-z0, -nz_last, eps, last, sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
    return rel, d, zabs, f_last


def _tail_roundoff_range(eps_lo: np.ndarray, eps_hi: np.ndarray, last: np.ndarray, *, sigma: float, h: float,
                         g_lo: np.ndarray, g_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r, d, zabs) of :func:`_tail_roundoff` valid at every eps in [eps_lo, eps_hi] at once: z falls
    with x and with eps (the computed -z is a monotone function of x h - A), so its largest value is
    at (x = 0, eps_hi) and its smallest at (x = last, eps_lo); err_y is largest at eps_hi; and r, d
    rise with |z| and err_y. The tail search forms it once per batch (its bracket's ends)."""
    kw: dict[str, Any] = dict(sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
    z0 = -_tail_z(eps_hi, 1, **kw)[:, 0]
    zl = -_tail_z_at(eps_lo, last, **kw)
    return _roundoff_from(z0, zl, eps_hi, last, sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)


def _roundoff_from(z0: np.ndarray, zl: np.ndarray, eps: np.ndarray, last: np.ndarray, *, sigma: float, h: float,
                   g_lo: np.ndarray, g_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r, d, zabs) of :func:`_tail_roundoff` from the largest z (z0), the smallest (zl) and the
    largest eps."""
    u = UNIT_ROUNDOFF
    big_a = eps * sigma * sigma + g_lo / 2
    err_y = gamma(6) * (big_a + (last + 1) * h) * 1.01
    tau_hi = sigma * np.sqrt(g_hi)
    tau_lo = sigma * np.sqrt(g_lo)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tau = np.where(zl * tau_hi > 2 * err_y, tau_hi, tau_lo)
        zabs = np.maximum(np.abs(z0), np.abs(zl))
        d = 1.01 * (2 * err_y / tau + gamma(7) * zabs)
        zpos = np.clip(z0, 0.0, _Z_SUBNORMAL)
        t2 = np.maximum(zpos * zpos, np.where(zl < 0, zl * zl, 0.0))
        rel = (1 + (NDTR_ULPS_0 + NDTR_ULPS_2 * t2) * u) * np.exp(d * (zpos + 1)) - 1
    rel = np.where(np.isfinite(rel) & (d < 0.05), rel, np.inf)
    return rel, d, zabs


#: The relative margin the tail search once used alone: kept as a floor of the proven one, so
#: that the certified epsilons do not move where the proof needs less (the proof does not use it).
TAIL_SLACK = 1e-12


def _roundoff_at(rng: tuple[np.ndarray, np.ndarray, np.ndarray], eps: np.ndarray, last: np.ndarray,
                 zf: tuple[np.ndarray, np.ndarray], rows: np.ndarray, *, sigma: float, h: float, g_lo: np.ndarray,
                 g_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_tail_roundoff` at ``eps`` (rows of a batch) from the whole bracket's values ``rng``
    (:func:`_tail_roundoff_range`, taken for these rows), formed at ``eps`` itself only where the
    bracket's are infinite (g_lo = 0 with y < 0 somewhere in the bracket but not at eps);
    ``zf``: the -z and f arrays of the evaluation, whose rows ``rows`` these are."""
    r, d, zabs = rng
    f_last = zf[1][rows, last]
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        r, d, zabs = r.copy(), d.copy(), zabs.copy()
        rb, db, zb, _ = _tail_roundoff(eps[bad], last[bad], sigma=sigma, h=h, g_lo=g_lo[bad], g_hi=g_hi[bad],
                                       zf=(zf[0][rows[bad]], zf[1][rows[bad]]))
        r[bad], d[bad], zabs[bad] = rb, db, zb
    return r, d, zabs, f_last


@dataclass(frozen=True)
class TailProof:
    """What the proven bound on T (:func:`_tail_T_up`) needs of a batch of tail problems besides
    the computed T, per problem: ``last`` = its own cut - 1 (at most the last column), ``error`` >=
    ||pmf_c - pmf_L||_2 (:func:`fft_error_l2`), ``extra_own`` >= P(W > last) and ``rel_own``,
    ``rel_cut`` the round-off of that Chernoff bound and of the batch's ``extra`` (at the last
    column; :func:`chernoff_error`). :meth:`plain` is the proof of a T whose inputs are taken as
    exact (``error`` = the legacy allowance, no Chernoff round-off)."""

    last: np.ndarray
    error: np.ndarray
    extra_own: np.ndarray
    rel_own: np.ndarray
    rel_cut: np.ndarray

    @staticmethod
    def plain(b: int, columns: int, error: float) -> TailProof:
        z = np.zeros(b)
        return TailProof(last=np.full(b, max(columns - 1, 0), dtype=np.int64), error=np.full(b, float(error)),
                         extra_own=z, rel_own=z, rel_cut=z)

    def take(self, idx: np.ndarray) -> TailProof:
        return TailProof(last=self.last[idx], error=self.error[idx], extra_own=self.extra_own[idx],
                         rel_own=self.rel_own[idx], rel_cut=self.rel_cut[idx])


def _tail_T_up(t: np.ndarray, extra: np.ndarray, norm: np.ndarray, legacy: float, eps: np.ndarray, proof: TailProof,
               columns: int, *, sigma: float, h: float, g_lo: np.ndarray, g_hi: np.ndarray,
               roundoff: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
    """A proven upper bound on the exact T(eps) (the tail probability of step 1) from the computed
    t = fl(S + extra + legacy N) of :func:`_tail_T` over ``columns`` columns: S = sum_x pmf_c[x]
    f_c[x], ``extra`` >= P(W >= columns) up to its round-off, N = fl(||f_c||_2) (``norm``).

    Exact T <= sum_{x < c} pmf_L[x] F_x + P(W >= c) for any c <= columns (pmf_L the law folded
    modulo the FFT length: aliases only add mass; F_x the exact f at the exact grid value) <=
    sum_{x < columns} pmf_c F + err ||F_{x < c}||_2 + P(W >= c) (Cauchy-Schwarz with ||pmf_c -
    pmf_L||_2 <= err = ``proof.error``; the added terms x >= c are non-negative). F <= f_c (1 + r)
    + 2^-1021 (:func:`_tail_roundoff`), and sums of n non-negative terms are within gamma_n of
    their computed values, so with rr = (1 + r)(1 + gamma_(columns + 4)) - 1:

    * c = columns (the batch's cut): T <= t (1 + rr) + extra rel_cut + max(0, err (1 + rr) -
      legacy) N + 2^-1020 (1 + err sqrt(columns)) (t holds legacy N already);
    * c = last + 1 (the problem's own cut): F rises with x, so ||F_{x < c}|| <= sqrt(c) (f_last (1 +
      r) + 2^-1021): T <= t (1 + rr) + extra_own (1 + rel_own) + err sqrt(c) (f_last (1 + rr) +
      2^-1021) + 2^-1020 (where c = columns, extra_own is t's extra: only rel_own is added);

    the smaller of the two; the relative factor at least 1 + :data:`TAIL_SLACK`; 2^-1020 bounds
    the 2^-1021 of each F times sum pmf_c <= 2; the expression's own roundings are gamma_8 more.
    Every added term is non-increasing in eps (the Taylor certificate :func:`_tail_T_bound_up`
    relies on it). ``roundoff``: :func:`_tail_roundoff` at ``eps`` where the caller has it."""
    r, _, _, f_last = roundoff if roundoff is not None else _tail_roundoff(eps, proof.last, sigma=sigma, h=h,
                                                                           g_lo=g_lo, g_hi=g_hi)
    c = proof.last + 1.0
    rr = ((1 + r) * (1 + gamma(columns + 4)) - 1) * 1.01
    err = proof.error
    with np.errstate(invalid="ignore"):
        full = (extra * proof.rel_cut + np.maximum(err * (1 + rr) - legacy, 0.0) * norm
                + 2.0**-1020 * (1 + err * math.sqrt(columns)))
        own_extra = np.where(proof.last >= columns - 1, proof.extra_own * proof.rel_own,
                             proof.extra_own * (1 + proof.rel_own))
        own = own_extra + err * np.sqrt(c) * (f_last * (1 + rr) + 2.0**-1021) + 2.0**-1020
        up = t * (1 + np.maximum(rr, TAIL_SLACK)) + np.minimum(full, own)
    up = np.where(np.isnan(up), np.inf, up)
    return up * (1 + gamma(8))


def _tail_T(pmf: np.ndarray, extra: np.ndarray, err_l2: float, eps: np.ndarray, *, sigma: float, h: float,
            g_lo: np.ndarray, g_hi: np.ndarray, with_slope: bool = False,
            work: tuple[np.ndarray, ...] | None = None, norm_out: np.ndarray | None = None,
            zf_out: list | None = None):
    """Upper bound on P(l > eps): sum_x pmf[x] f_x + extra + err_l2 ||f||_2 with
    f_x = Phibar(y_x / tau(y_x)), y_x = eps sigma^2 + g_lo/2 - x h and tau = sigma sqrt(g_hi) if
    y >= 0 else sigma sqrt(g_lo) (f is decreasing in y, so rounding W up and g down can only raise
    it). With ``with_slope`` also returns T' and T'' (d/deps, d^2/deps^2; the first with the
    err_l2 ||f|| term), formed with tau = sigma sqrt(g_hi) for every entry: they only steer the
    search (:func:`solve_tail_eps`), no bound uses them; and the sums :func:`_tail_T_bound` needs
    to bound T a little above eps. ``work``: arrays of pmf's shape for z and
    f (and a third for the derivatives), reused across calls (the same values as fresh arrays;
    allocating and faulting in arrays of this size per Newton step took a sixth of its time)."""
    z = _tail_z(eps, pmf.shape[1], sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi,
                out=None if work is None else work[0])  # -z
    f = special.ndtr(z, out=None if work is None else work[1])
    if zf_out is not None:  # the -z and f arrays, for the proven bound (_tail_roundoff reads them)
        zf_out[:] = [z, f]
    t = np.einsum("bx,bx->b", pmf, f) + extra
    norm_f = np.sqrt(np.einsum("bx,bx->b", f, f)) if err_l2 or norm_out is not None else None
    if norm_f is not None:
        t += err_l2 * norm_f
        if norm_out is not None:  # ||f||_2 for the proven bound (_tail_T_up)
            norm_out[:] = norm_f
    if not with_slope:
        return t
    # f' = -phi(z) k and f'' = z phi(z) k^2 with k = dz/deps = sigma^2 / tau
    ph = np.square(z, out=None if work is None or len(work) < 3 else work[2])
    ph *= -0.5
    np.exp(ph, out=ph)  # sqrt(2 pi) phi(z)
    k = sigma * sigma / (sigma * np.sqrt(g_hi))
    c = k / math.sqrt(2 * math.pi)
    s_phi = np.einsum("bx,bx->b", pmf, ph)
    d1 = s_phi
    if norm_f is not None:  # d ||f|| / deps = (f . f') / ||f||
        with np.errstate(divide="ignore", invalid="ignore"):
            d1 = s_phi + err_l2 * np.where(norm_f > 0, np.einsum("bx,bx->b", f, ph) / norm_f, 0.0)
    with np.errstate(invalid="ignore"):
        ph *= z  # -z sqrt(2 pi) phi(z); NaN = 0 x inf where z is infinite (g_lo = 0, y < 0)
    d2 = np.einsum("bx,bx->b", pmf, ph)
    nan = np.flatnonzero(np.isnan(d2))
    if nan.size:  # z phi(z) -> 0 as |z| -> inf
        d2[nan] = np.einsum("bx,bx->b", pmf[nan], np.nan_to_num(ph[nan], nan=0.0))
    # sqrt(2 pi) m_x with m_x = u phi(u) for u = -(-z) >= 1, else phi(1) (the maximum of u phi(u)):
    # m_x bounds u' phi(u') for every u' >= u (:func:`_tail_T_bound`)
    np.negative(ph, out=ph)
    np.copyto(ph, _SQRT2PI_PHI1, where=z > -1.0)
    s_m = np.einsum("bx,bx->b", pmf, ph)
    return t, -d1 * c, -d2 * (c * k), (s_phi, s_m, k)


#: sqrt(2 pi) phi(1) = e^-1/2 = 0.60653..., rounded up: sqrt(2 pi) times the maximum of u phi(u).
_SQRT2PI_PHI1 = 0.6066


def _tail_T_bound(t: np.ndarray, terms: tuple[np.ndarray, np.ndarray, np.ndarray], step: np.ndarray) -> np.ndarray:
    """Upper bound on T(x + step), step >= 0, from T(x) and the sums ``terms`` that
    :func:`_tail_T` formed at x with the slope (so that a certificate next to x needs no new
    ``ndtr`` per entry).

    Why it holds: each f_x = Phibar(u_x) with u_x = y_x / tau(y_x) (the z of :func:`_tail_z`);
    raising eps by ``step`` raises y_x by sigma^2 step, hence u_x by at least D = k step,
    k = sigma / sqrt(g_hi) (the slope sigma^2 / tau of the y >= 0 branch; the y < 0 branch has
    the smaller tau and the larger slope, and u is continuous where y crosses 0). Phibar is
    decreasing, so f_x(x + step) <= Phibar(u_x + D) = Phibar(u_x) - phi(u_x) D + xi phi(xi) D^2 / 2
    for some xi in [u_x, u_x + D] (Taylor, Lagrange remainder; Phibar'' = u phi(u)), and
    xi phi(xi) <= m_x: u phi(u) is decreasing on [1, inf), so m_x = u_x phi(u_x) where u_x >= 1,
    and its maximum phi(1) elsewhere. The err_l2 ||f|| term does not rise (every f_x falls).
    Summing with the weights pmf[x] >= 0:
    T(x + step) <= T(x) - k step sum pmf phi(u) + (k step)^2 / 2 sum pmf m.
    The sums are the floating-point ones of T(x) itself (the same trust as a direct evaluation;
    the caller compares with delta under the same 1 + 1e-12 slack). For the headline's steps
    (~1e-8) the remainder is ~1e-10 of T, the certificate margin (T falls by ~1.5e-8 of T over
    the tol / 20 above the root) far above it."""
    s_phi, s_m, k = terms
    d = k * step * (1.0 / math.sqrt(2 * math.pi))
    return t - s_phi * d + (0.5 * k * step) * d * s_m


def _tail_T_bound_up(t_up: np.ndarray, terms: tuple[np.ndarray, np.ndarray, np.ndarray], step: np.ndarray,
                     d_arg: np.ndarray, zabs: np.ndarray, n: int) -> np.ndarray:
    """:func:`_tail_T_bound` with round-off: a proven upper bound on the exact T(x + step) from
    t_up (:func:`_tail_T_up` at x, >= sum pmf_c F + err_l2 ||F|| + the exact extra) and the sums.

    The Taylor argument holds for the exact F with the exact u_x and weights pmf_c (the FFT error
    term only falls, ||F(x + step)|| <= ||F(x)||): T(x + step) <= t_up - k step sum pmf_c phi(u) +
    (k step)^2 / 2 sum pmf_c m(u). The computed sum of phi is within rho = d (2 zabs + d) + (ELEM +
    4 + zabs^2) u + gamma_(n + 8) of the one at the exact u (phi's exponent moves by at most d (2
    |z| + d), exp and the squares' roundings, the sum and k's three roundings), so it is taken
    times 1 - 1e-6 where rho <= 1e-7 (else no bound: +inf); likewise m(u) <= m_c (1 + 2 rho): u
    phi(u) falls on [1, inf), so m(u_c - d) / m(u_c) <= e^(d u_c) where u_c - d >= 1, it is flat
    at its maximum u = 1 (within 1 - d^2 there) and the table's e^-1/2 is rounded up; the
    remainder is taken times 1 + 1e-6. The few roundings of the result: t_up times 1 + gamma_6."""
    s_phi, s_m, k = terms
    rho = d_arg * (2 * zabs + d_arg) + (ELEMENTARY_ULPS + 4 + zabs * zabs) * UNIT_ROUNDOFF + gamma(n + 8)
    d = k * step * (1.0 / math.sqrt(2 * math.pi))
    with np.errstate(invalid="ignore"):
        b = t_up * (1 + gamma(6)) - s_phi * d * (1 - 1e-6) + (0.5 * k * step) * d * s_m * (1 + 1e-6)
    return np.where((rho <= 1e-7) & np.isfinite(b), b, np.inf)


def _tail_T_meets(pmf: np.ndarray, extra: np.ndarray, err_l2: float, eps: np.ndarray, delta: np.ndarray,
                  slack: float, *, sigma: float, h: float, g_lo: np.ndarray, g_hi: np.ndarray,
                  proof: TailProof | None = None,
                  roundoff: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``_tail_T_up(...) * slack <= delta`` per problem (True: the exact T(eps) <= delta, proven;
    ``proof`` as :func:`solve_tail_eps` takes it; ``roundoff``: (r, d, zabs) of
    :func:`_tail_roundoff_range` over a range holding ``eps``), with T computed in full only where a cheap
    certificate does not settle it (the bracket's ends are only compared with delta, their values
    are not used):

    * every z of the row >= :data:`_F_ZERO_Z` (z falls with x: the last column is checked): every
      computed f_x is exactly 0 and the exact one below 2^-1022 (its argument is off by at most d
      < 0.05, :func:`_tail_roundoff`), so T <= extra (1 + rel_cut) + 2^-1020 (1 + err sqrt n);
    * the x = 0 term alone exceeds delta / slack by a relative 1e-9: the answer is False (only a
      True must be proven: False moves the search up).
    """
    b, n = pmf.shape
    proof = TailProof.plain(b, n, err_l2) if proof is None else proof
    kw: dict[str, Any] = dict(sigma=sigma, h=h)
    out = np.empty(b, dtype=bool)
    last = np.full(b, n - 1, dtype=np.int64)
    zl = _tail_z_at(eps, last, g_lo=g_lo, g_hi=g_hi, **kw) if n else np.full(b, -np.inf)
    zero = zl <= -_F_ZERO_Z
    if zero.any():
        zi = np.flatnonzero(zero)
        d_arg = np.full(zi.size, np.inf) if roundoff is None else roundoff[1][zi].copy()
        redo = np.flatnonzero(~(d_arg < 0.05))  # no bracket value, or an infinite one: at eps itself
        if redo.size:
            sel_z = zi[redo]
            d_arg[redo] = _tail_roundoff(eps[sel_z], last[sel_z], g_lo=g_lo[sel_z], g_hi=g_hi[sel_z], **kw)[1]
        up = (extra[zero] * (1 + np.maximum(proof.rel_cut[zero], TAIL_SLACK))
              + 2.0**-1020 * (1 + proof.error[zero] * math.sqrt(n))) * (1 + gamma(4))
        out[zero] = (d_arg < 0.05) & (up * slack <= delta[zero])
    first = np.zeros(b)
    if n:
        first = pmf[:, 0] * special.ndtr(_tail_z(eps, 1, g_lo=g_lo, g_hi=g_hi, **kw)[:, 0])
    above = ~zero & (first * (1 - 1e-9) > delta)
    out[above] = False
    rest = np.flatnonzero(~zero & ~above)
    if rest.size:
        sub = pmf if rest.size == b else pmf[rest]
        norm = np.empty(rest.size)
        zf: list = []
        t = _tail_T(sub, extra[rest], err_l2, eps[rest], g_lo=g_lo[rest], g_hi=g_hi[rest], norm_out=norm, zf_out=zf,
                    **kw)
        pr = proof.take(rest)
        ro = None if roundoff is None else _roundoff_at(
            (roundoff[0][rest], roundoff[1][rest], roundoff[2][rest]), eps[rest], pr.last, (zf[0], zf[1]),
            np.arange(rest.size), g_lo=g_lo[rest], g_hi=g_hi[rest], **kw)
        t = _tail_T_up(t, extra[rest], norm, err_l2, eps[rest], pr, n, g_lo=g_lo[rest], g_hi=g_hi[rest],
                       roundoff=ro, **kw)
        out[rest] = t * slack <= delta[rest]
    return out


#: Columns per bin of the start's surrogate (:func:`_tail_nodes`): two nodes stand for this many columns.
_START_BIN = 16


def _tail_nodes(pmf: np.ndarray, m: int = _START_BIN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, weights, error weights), each (b, 2 ceil(n / m)): per row and per bin of ``m``
    columns (the last one padded with zeros), the two-point Gauss rule of the bin's pmf: the nodes
    and weights whose sums of 1, x, x^2 and x^3 equal the pmf's; nodes inside the bin, weights >= 0;
    one node of the whole weight where the bin's mass sits on one column (or is 0). sum_j weights
    f(positions) approximates sum_x pmf[x] f(x) for a smooth f up to the rule's error, m0 E[pi^2]
    f^(4)(xi) / 24 per bin (pi the bin's orthogonal polynomial of degree 2); the error weights are
    each node's weight times E[pi^2] / 24, so that sum_j error weights f^(4)(positions) estimates
    that error. The surrogate of :func:`_tail_T` (:func:`_tail_T_nodes`) that steers the start of
    :func:`solve_tail_eps` at a fraction of its cost; a heuristic only: no bound uses it."""
    b, n = pmf.shape
    nb = -(-n // m)
    padded = np.zeros((b, nb * m))
    padded[:, :n] = pmf
    # sums of pmf d^k (k = 0..3) per bin, d the offset from the bin's centre: (4, b nb), each contiguous
    vander = np.vander(np.arange(m) - (m - 1) / 2.0, 5, increasing=True)
    # (the tall product, not its transpose: OpenBLAS sums each entry in the same order at any thread
    # count only in this orientation, and mmcc's numbers must not depend on the BLAS threads)
    mom = np.ascontiguousarray((padded.reshape(b * nb, m) @ vander).T)
    m0, mu, e2, c3, c4 = mom  # filled in place below (fewer temporaries: this runs once per batch)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.divide(1.0, m0)
        mu *= inv
        e2 *= inv
        c3 *= inv  # E d^3
        c4 *= inv  # E d^4
        # the fourth central moment E d^4 - 4 mu E d^3 + 6 mu^2 E d^2 - 3 mu^4 (Horner in mu)
        acc = np.multiply(mu, -3.0)
        acc *= mu
        acc += 6.0 * e2
        acc *= mu
        acc -= 4.0 * c3
        acc *= mu
        c4 += acc
        np.multiply(mu, mu, out=inv)  # mu^2
        c2 = np.subtract(e2, inv)
        inv *= -2.0
        e2 *= 3.0
        inv += e2
        inv *= mu
        c3 -= inv  # the third central moment E d^3 - mu (3 E d^2 - 2 mu^2)
        # the nodes mu + t are the roots of t^2 - (c3 / c2) t - c2 (the degree-2 orthogonal polynomial)
        c3_saved = c3.copy()
        q = np.divide(c3, c2, out=c3)
        root = np.multiply(q, q, out=inv)
        e2 = np.multiply(c2, 4.0, out=e2)
        root += e2
        np.sqrt(root, out=root)
        t1 = np.subtract(q, root, out=e2)
        t1 *= 0.5
        t2 = np.add(q, root, out=q)
        t2 *= 0.5
        w1 = np.subtract(t2, t1, out=root)
        np.divide(t2, w1, out=w1)
        w1 *= m0
        # the rule's error is m0 E[pi^2] f^(4)(xi) / 24, pi the orthogonal polynomial: E[pi^2] =
        # c4 - c2^2 - c3^2 / c2 (= c4 - c2^2 - q c3)
        np.multiply(c3_saved, c3_saved, out=acc)
        acc /= c2
        acc += c2 * c2
        c4 -= acc
        c4 *= 1.0 / 24.0
    two = np.isfinite(w1) & (c2 > 1e-12) & (m0 > 0)
    kappa = np.where(two & np.isfinite(c4), np.maximum(c4, 0.0), 0.0)
    # a point mass or an empty bin (or a degenerate one): one node, at the mean
    mu[~(m0 > 0)] = 0.0
    mu += np.tile(np.arange(nb) * m + (m - 1) / 2.0, b)
    pos = np.empty((2, b * nb))
    np.add(mu, t1, out=pos[0])
    np.add(mu, t2, out=pos[1])
    np.copyto(pos, mu, where=~two)
    wts = np.empty((2, b * nb))
    np.clip(w1, 0.0, m0, out=wts[0])
    np.copyto(wts[0], m0, where=~two)
    np.subtract(m0, wts[0], out=wts[1])
    wk = np.multiply(wts, kappa)
    # (b, 2 nb): the first node of every bin, then the second
    pos, wts, wk = (a.reshape(2, b, nb).transpose(1, 0, 2).reshape(b, 2 * nb) for a in (pos, wts, wk))
    return pos, wts, wk


def _tail_T_nodes(nodes: tuple[np.ndarray, np.ndarray, np.ndarray], extra: np.ndarray, eps: np.ndarray, *,
                  sigma: float, h: float, g_lo: np.ndarray, g_hi: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, T', T'') of :func:`_tail_T` from the nodes of :func:`_tail_nodes` instead of every column,
    without the err_l2 ||f|| term and with tau = sigma sqrt(g_hi) for every entry: the start's
    surrogate; it steers only. Each sum carries the rule's leading error term (weights E[pi^2] / 24
    times the summand's fourth derivative in x, s^4 He_n(-z) phi(z) up to sign, s = h / tau): the
    rule alone under-counts T by ~1e-3 of itself (f rises like an exponential in x), which would put
    the start ~4e-5 below the root."""
    pos, wts, wk = nodes
    tau = sigma * np.sqrt(g_hi)
    nz = pos * h
    nz -= (eps * sigma * sigma + g_lo / 2)[:, None]
    nz *= (1.0 / tau)[:, None]  # -z
    t = np.einsum("bx,bx->b", wts, special.ndtr(nz)) + extra
    ph = np.square(nz)
    z2 = ph.copy()
    ph *= -0.5
    np.exp(ph, out=ph)  # sqrt(2 pi) phi(z)
    s4 = ((h / tau) ** 2) ** 2
    k = sigma * sigma / tau
    c = k / math.sqrt(2 * math.pi)
    wkp = wk * ph
    # He_3(v) = v^3 - 3 v, He_4 = v^4 - 6 v^2 + 3, He_5 = v^5 - 10 v^3 + 15 v at v = nz (= -z)
    he3 = (z2 - 3.0) * nz
    he4 = z2 * (z2 - 6.0) + 3.0
    he5 = nz * (z2 * (z2 - 10.0) + 15.0)
    t -= np.einsum("bx,bx->b", wkp, he3) * s4 * (1 / math.sqrt(2 * math.pi))
    d1 = np.einsum("bx,bx->b", wts, ph) + np.einsum("bx,bx->b", wkp, he4) * s4
    ph *= nz
    d2 = np.einsum("bx,bx->b", wts, ph) + np.einsum("bx,bx->b", wkp, he5) * s4
    return t, -d1 * c, -d2 * (c * k)


def solve_tail_eps(pmf: np.ndarray, extra: np.ndarray, err_l2: float, *, sigma: float, h: float,
                   g_lo: np.ndarray, g_hi: np.ndarray, delta: float | np.ndarray, tol: float = 1e-8,
                   proof: TailProof | None = None) -> np.ndarray:
    """Smallest eps >= 0 (to ``tol``) with T(eps) <= delta per problem (``delta`` a scalar or one
    value per problem); +inf where none does.

    The first point: one step of the same kind from the W = 0 term's own solution (a lower bound)
    on a cheap surrogate of T (:func:`_surrogate_start`: a two-point Gauss rule per 16 columns),
    a little below its root. Then steps inside a bracket (bisection when a step leaves it), each
    from T, T' and T'' at the current point (:func:`_tail_T`): on v = Phibar^-1(T), which is close
    to affine in eps (exactly so for a single Gaussian term, where log T is close to quadratic), the
    root of v's second-order Taylor model (Newton's step where it has none); on log T where v is
    out of range (T above 1/2 or v's density below 1e-250). Once Newton's error after the step,
    |v''| step^2 / (2 |v'|) (or the same for log T), is below tol (1 + root) / 100, the point root
    + tol (1 + root) / 20 is the certificate candidate: T there is bounded from the sums at the
    step point (:func:`_tail_T_bound_up`, no new ``ndtr`` pass), and where that bound holds, the
    smaller point at which the same bound meets delta (:func:`_tail_bound_step`) is returned if
    the bound holds there too; where it does not settle it, the candidate is evaluated; if T <=
    delta there the search ends, otherwise the point is the bracket's new lower end and a step
    point. The search also ends when the bracket is narrower than tol (1 + hi).

    What makes the result valid is only this: the returned value is the upper end of a bracket,
    at which a proven upper bound on the exact T (:func:`_tail_T_up`, :func:`_tail_T_bound_up`:
    the round-off of ndtr, of z, of the sums, ``err_l2`` >= the l2 error of ``pmf`` and
    ``extra_error`` >= the relative error of ``extra``) was found <= delta; the start, the steps
    and the error estimate decide where T is evaluated. On the headline's 32 640 problems the
    search takes 1.02 evaluations with derivatives and 0.02 direct certificates per problem (2.0
    and 0.01 from the W = 0 term's solution itself; Newton on log T with the error estimated from
    the slopes took 3.1 and 0.9), and every eps lies within 0.0501 tol (1 + eps) of the smallest
    certified eps that plain bisection finds, the median within 0.0007 tol (the candidate alone:
    0.05; before the steps on v: a median of 0.25 and up to 0.86; at delta 1e-10 up to 1.9e5 tol);
    "to tol" is a target the estimate meets there, not a guarantee: an estimate that is off can
    only return a larger eps, never an uncertified one.
    """
    b, n = pmf.shape
    slack = 1.0  # the bounds carry the round-off (alone, the margin was a relative 1e-12)
    delta = np.broadcast_to(np.asarray(delta, dtype=np.float64), (b,))
    proof = TailProof.plain(b, n, err_l2) if proof is None else proof
    out = np.full(b, np.inf)
    kw: dict[str, Any] = dict(sigma=sigma, h=h)
    cap_w = pmf.shape[1] * h
    hi = (cap_w + 40 * sigma * np.sqrt(g_hi)) / sigma**2 + 1.0
    lo = np.zeros(b)
    # the round-off allowances over the whole bracket [0, hi] at once (every eps the search visits)
    r_all, d_all, zabs_all = _tail_roundoff_range(lo, hi, proof.last, sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
    rng = (r_all, d_all, zabs_all)
    zero = _tail_T_meets(pmf, extra, err_l2, lo, delta, slack, g_lo=g_lo, g_hi=g_hi, proof=proof, roundoff=rng, **kw)
    out[zero] = 0.0
    # where even hi fails, the tail cannot be met: +inf
    active = ~zero & _tail_T_meets(pmf, extra, err_l2, hi, delta, slack, g_lo=g_lo, g_hi=g_hi, proof=proof,
                                   roundoff=rng, **kw)
    # the W = 0 term's own solution (a lower bound on the answer), then the surrogate's step from it
    p0 = np.maximum(pmf[:, 0], 1e-300)
    z0 = -special.ndtri(np.clip(delta / p0, 1e-300, 0.5))
    x = np.clip((z0 * sigma * np.sqrt(g_hi) - g_lo / 2) / sigma**2, lo, hi)
    logd = np.log(delta)
    v_delta = -special.ndtri(delta)  # Phibar^-1(delta)
    x = _surrogate_start(pmf, extra, x, lo, hi, active, logd, v_delta, sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
    solvable = active.copy()
    check = np.zeros(b, dtype=bool)  # x is a certificate candidate: T alone is evaluated there
    # the steps' arrays, reused (the first k rows serve a step on k problems)
    work = np.empty((4, *pmf.shape))
    for _ in range(100):
        live = active & (hi - lo > tol * (1 + hi))
        if not live.any():
            break
        for certify in (True, False):
            # (a candidate that fails its check is a step point at once, in the same round)
            idx = np.flatnonzero(live & active & (check == certify))
            if idx.size == 0:
                continue
            xi = np.clip(x[idx], lo[idx], hi[idx])
            # every row: no copy (each row's T is its own)
            sub = pmf if idx.size == b else np.take(pmf, idx, axis=0, out=work[3, :idx.size])
            norm = np.empty(idx.size)
            zf_list: list = []
            got = _tail_T(sub, extra[idx], err_l2, xi, g_lo=g_lo[idx], g_hi=g_hi[idx], with_slope=not certify,
                          work=(work[0, :idx.size], work[1, :idx.size], work[2, :idx.size]), norm_out=norm,
                          zf_out=zf_list, **kw)
            t0 = got if certify else got[0]
            zf = (zf_list[0], zf_list[1])
            # the proven bound is >= t0 (1 + TAIL_SLACK): formed only where that meets delta (the
            # others fail anyway; their steps are taken from t0 (1 + TAIL_SLACK))
            t = t0 * (1 + TAIL_SLACK)
            # (a step point near the root steers by the proven bound too: its Taylor candidate is
            # checked against it)
            can = np.flatnonzero(t <= delta[idx] * (1.0 if certify else 1.001))
            # the proven bound and its argument error per row of this evaluation, formed once (the
            # Taylor certificate below reads them for the same rows)
            t_upx = np.full(idx.size, np.nan)
            d_argx = np.full(idx.size, np.nan)
            zabsx = np.full(idx.size, np.nan)

            at = dict(idx=idx, xi=xi, t0=t0, norm=norm, zf=zf, rng=rng, proof=proof, extra=extra, err_l2=err_l2,
                      out=(t_upx, d_argx, zabsx), sigma=sigma, h=h, g_lo=g_lo, g_hi=g_hi)
            if can.size:
                _proven_rows(can, **at)
                t[can] = t_upx[can] * slack
            meets = t <= delta[idx]
            lo[idx] = np.where(meets, lo[idx], xi)
            hi[idx] = np.where(meets, xi, hi[idx])
            if certify:  # certified: done, hi = x; else x is the lower end, and a step point
                active[idx[meets]] = False
                check[idx] = False
                continue
            step, step_err = _tail_step(t, got[1], got[2], logd[idx], v_delta[idx])
            root = xi - step
            lo_i, hi_i = lo[idx], hi[idx]
            ready = np.isfinite(root) & (step_err <= 0.01 * tol * (1 + np.abs(root)))
            nx = np.where(ready, root + 0.05 * tol * (1 + root), root)
            # hi certified already and within the margin above the root: done
            done = ready & (nx >= hi_i) & (root < hi_i)
            active[idx[done]] = False
            # a step outside the bracket bisects
            bad = ~np.isfinite(nx) | (nx <= lo_i) | (nx >= hi_i)
            x[idx] = np.where(bad, 0.5 * (lo_i + hi_i), nx)
            check[idx] = ready & ~bad
            # a candidate above this point: certified by the bound from this point's sums where it
            # holds (no evaluation), else evaluated in the next round
            up = np.flatnonzero(check[idx] & (nx >= xi))
            if up.size:
                miss = up[np.isnan(t_upx[up])]
                if miss.size:
                    _proven_rows(miss, **at)
                t_up, d_u_arg, zabs_u = t_upx[up], d_argx[up], zabsx[up]
                terms_u = tuple(a[up] for a in got[3])
                d_u = delta[idx[up]]
                bound = _tail_T_bound_up(t_up, terms_u, nx[up] - xi[up], d_u_arg, zabs_u, n)
                # the same bound falls to delta already at xi + s (the smaller root of its quadratic in
                # the step): that point, where the bound holds there too, is a certified one at most
                # the bound's own slack above the root (the candidate is ~0.05 tol above it)
                low = xi[up] + _tail_bound_step(t_up, terms_u, d_u)
                with np.errstate(invalid="ignore"):
                    low_ok = (low >= xi[up]) & (low < nx[up])
                b_low = _tail_T_bound_up(t_up, terms_u, np.where(low_ok, low - xi[up], 0.0), d_u_arg, zabs_u, n)
                low_ok &= b_low * slack <= d_u
                meets = low_ok | (bound * slack <= d_u)
                ok = up[meets]
                hi[idx[ok]] = np.where(low_ok, low, nx[up])[meets]
                active[idx[ok]] = False
                check[idx[ok]] = False
    out[solvable] = hi[solvable]
    return out


def _surrogate_start(pmf: np.ndarray, extra: np.ndarray, x: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     active: np.ndarray, logd: np.ndarray, v_delta: np.ndarray, *, sigma: float, h: float,
                     g_lo: np.ndarray, g_hi: np.ndarray) -> np.ndarray:
    """Where :func:`solve_tail_eps` evaluates first (rows ``active``): from ``x`` (the W = 0 term's
    solution, below the root) one step of :func:`_tail_step` on the surrogate :func:`_tail_T_nodes`,
    lowered by :data:`_START_MARGIN` (1 + x); never below ``x`` nor outside [lo, hi].

    Why: the search's first evaluation then falls just below the root in most problems, where its own
    step is ready and the Taylor certificate (:func:`_tail_T_bound_up`) reaches the candidate above
    it: one evaluation of T with its slopes per problem instead of two. On the headline the step
    from ``x`` (0.01 to 0.2 long) lands a median 6e-6 and at most ~6e-4 below the root (the
    quadratic model's error: T's own step does the same), the surrogate is within ~2e-5 of T
    (~8e-4 where G[j, j] is small) and under-counts it (its error term is that of the next order),
    and the margin keeps the point below the root, where the candidate needs no evaluation of its
    own (a start above it costs one: a margin of -2e-5 took 0.9 more per problem). No start below
    ``x``: that is below the root. It steers only: any start leaves the result certified."""
    idx = np.flatnonzero(active)
    if idx.size == 0 or pmf.shape[1] < 2 * _START_BIN:
        return x
    nodes = _tail_nodes(pmf, _START_BIN)
    if idx.size < pmf.shape[0]:
        nodes = (nodes[0][idx], nodes[1][idx], nodes[2][idx])
    x0 = x[idx]
    t, d1, d2 = _tail_T_nodes(nodes, extra[idx], x0, sigma=sigma, h=h, g_lo=g_lo[idx], g_hi=g_hi[idx])
    step, _ = _tail_step(t, d1, d2, logd[idx], v_delta[idx])
    with np.errstate(invalid="ignore", over="ignore"):
        xi = x0 - step
    xi = np.where(np.isfinite(xi), xi, x0)  # a flat surrogate: the old start
    xi = xi - _START_MARGIN * (1 + xi)
    out = x.copy()
    out[idx] = np.clip(np.maximum(xi, x0), lo[idx], hi[idx])
    return out


#: The relative margin by which :func:`_surrogate_start` stays below the surrogate's root.
_START_MARGIN = 2e-6


def _proven_rows(rows: np.ndarray, *, idx: np.ndarray, xi: np.ndarray, t0: np.ndarray, norm: np.ndarray,
                 zf: tuple[np.ndarray, np.ndarray], rng: tuple[np.ndarray, np.ndarray, np.ndarray], proof: TailProof,
                 extra: np.ndarray, err_l2: float, out: tuple[np.ndarray, np.ndarray, np.ndarray], sigma: float,
                 h: float, g_lo: np.ndarray, g_hi: np.ndarray) -> None:
    """For the rows ``rows`` of an evaluation of :func:`solve_tail_eps` (problems ``idx[rows]``, at
    ``xi[rows]``): the proven bound :func:`_tail_T_up` and the argument error and largest |z| of
    its round-off (:func:`_roundoff_at`), written into ``out``'s three arrays at ``rows``."""
    sel = idx[rows]
    n = zf[0].shape[1]
    ro = _roundoff_at((rng[0][sel], rng[1][sel], rng[2][sel]), xi[rows], proof.last[sel], zf, rows, sigma=sigma, h=h,
                      g_lo=g_lo[sel], g_hi=g_hi[sel])
    out[0][rows] = _tail_T_up(t0[rows], extra[sel], norm[rows], err_l2, xi[rows], proof.take(sel), n, sigma=sigma, h=h,
                              g_lo=g_lo[sel], g_hi=g_hi[sel], roundoff=ro)
    out[1][rows], out[2][rows] = ro[1], ro[2]


def _tail_bound_step(t_up: np.ndarray, terms: tuple[np.ndarray, np.ndarray, np.ndarray],
                     delta: np.ndarray) -> np.ndarray:
    """The smallest step s >= 0 at which :func:`_tail_T_bound_up`'s quadratic in the step, t_up (1 +
    gamma_6) - B s + C s^2, meets ``delta`` (its smaller root, in the stable form), raised by a
    relative 1e-9 so that the bound evaluated there (which the caller checks: only that certifies)
    is not above delta by a rounding; NaN where it has none. Steers only."""
    s_phi, s_m, k = terms
    a0 = t_up * (1 + gamma(6)) - delta
    b1 = s_phi * k * (1 - 1e-6) / math.sqrt(2 * math.pi)
    c2 = 0.5 * k * k * s_m * (1 + 1e-6) / math.sqrt(2 * math.pi)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        disc = b1 * b1 - 4 * c2 * a0
        step = 2 * a0 / (b1 + np.sqrt(disc))
    return np.where((disc >= 0) & np.isfinite(step), np.maximum(step, 0.0) * (1 + 1e-9), np.nan)


def _tail_step(t: np.ndarray, d1: np.ndarray, d2: np.ndarray, log_delta: np.ndarray,
               v_delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x - root estimate, Newton's error estimate) of :func:`solve_tail_eps` from T, T', T'' at x.

    On v = Phibar^-1(T) (v' = -T' / phi(v), v'' = v v'^2 - T'' / phi(v)): the root of the
    quadratic Taylor model v - v_delta + v' r + v'' r^2 / 2 nearest to 0 (stable form), Newton's
    r = -(v - v_delta) / v' where the model has no real root; error estimate |v''| r_N^2 /
    (2 |v'|), that of Newton's step (an over-estimate for the quadratic step). On g = log T where
    v is out of range: Newton's step and |g''| r^2 / (2 |g'|). NaN or infinite where T is flat:
    the caller bisects."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        tt = np.maximum(t, 1e-300)
        g1 = d1 / tt  # d log T / d eps
        step = (np.log(tt) - log_delta) / g1
        err = np.abs(d2 / tt - g1 * g1) * step * step / (2 * np.abs(g1))
        v = -special.ndtri(np.minimum(t, 1.0))
        phv = np.exp(-0.5 * v * v) * (1 / math.sqrt(2 * math.pi))
        v1 = -d1 / phv
        v2 = v * v1 * v1 - d2 / phv
        vv = v - v_delta
        newton = vv / v1
        verr = np.abs(v2) * newton * newton / (2 * np.abs(v1))
        disc = v1 * v1 - 2 * vv * v2
        quad = 2 * vv / (v1 + np.sign(v1) * np.sqrt(np.maximum(disc, 0.0)))
        vstep = np.where((disc > 0) & np.isfinite(quad), quad, newton)
        use_v = np.isfinite(vstep) & np.isfinite(verr) & (phv > 1e-250) & (t < 0.5)
    return np.where(use_v, vstep, step), np.where(use_v, verr, err)


def tail_epsilons(pairs: TailPairs, *, p: float, sigma: float, delta_pair: float | np.ndarray,
                  method: str = "fft") -> np.ndarray:
    """eps of every distinct tail problem (+inf where the tail cannot be met): step 1 of
    docs/accounting.md, "Algorithm". ``delta_pair``: the tail probability allowed, one value for
    all problems or one per problem (:func:`tail_allocation`).

    ``method`` "fft" (default, fast, with explicit folding and round-off allowances) or "direct"
    (exact convolution)."""
    u = pairs.counts.shape[0]
    out = np.full(u, np.inf)
    if u == 0:
        return out
    h = 1.0 / pairs.resolution
    delta_all = np.broadcast_to(np.asarray(delta_pair, dtype=np.float64), (u,))
    weights = np.arange(pairs.counts.shape[1])
    support = pairs.counts @ weights  # largest rounded W (grid units)
    terms = pairs.counts.sum(axis=1)
    order = np.argsort(terms, kind="stable")
    g_lo, g_hi = pairs.g_bounds()
    for start in range(0, u, _TAIL_BATCH):
        sel = order[start:start + _TAIL_BATCH]
        counts = pairs.counts[sel]
        sup = support[sel]
        tsel = terms[sel].astype(np.float64)
        dsel = delta_all[sel]
        # cut: the first grid value c with P(W >= c) <= 1e-3 delta_pair for every problem (Chernoff
        # bound; exactly 0 beyond a problem's largest value). W >= c is then counted as "always in
        # the tail" (a valid over-estimate that moves eps by a negligible amount).
        # the Chernoff bound's log-mgf table does not depend on the level: once per batch
        lmgf = _log_mgf(counts, p, _CHERNOFF_LAMBDAS)

        def tail_at(c: int, lmgf: np.ndarray = lmgf, sup: np.ndarray = sup) -> np.ndarray:
            t = _chernoff_from_mgf(lmgf, float(c))
            t[sup < c] = 0.0
            return t

        target = 1e-3 * dsel

        def below(c: int, tail_at: Callable[[int], np.ndarray] = tail_at, target: np.ndarray = target) -> bool:
            return bool(np.all(tail_at(c) <= target))

        cut = max(1, smallest_true(below, 1, int(sup.max()) + 1, guess=_chernoff_level_guess(lmgf, target, sup)))
        if method == "direct":
            pmf, extra = w_law(counts, p, cut)
            err = 0.0
            proof = TailProof.plain(sel.size, cut, 0.0)  # the reference: scipy's binomial values taken as exact
        elif method == "fft":
            length = 1 << max(4, (cut - 1).bit_length())
            pmf = _w_pmf_fft(counts, p, length)
            err = FFT_ERROR_L2  # the legacy allowance inside the computed T (kept; no proof uses it)
            pmf = pmf[:, :cut]  # a view (rows contiguous): the search's sums read it as they would a copy
            # P(W >= cut): covers the dropped values and the FFT's folding (tail_at's value)
            extra, rel_cut = _chernoff_and_error(lmgf, float(cut), tsel, sup, p, counts.shape[1])
            extra[sup < cut] = 0.0
            # ||pmf_L||_2 <= ||pmf_c||_2 below cut + the error + ||pmf_L||_2 from cut on (<= its mass,
            # P(W >= cut) (1 + rel_cut), aliases included); the error is at most c ||pmf_L||_2 (c of
            # fft_error_l2), so at most c (n_cut + extra') / (1 - c), and 1 - 2c leaves room
            c_unit = float(fft_error_l2(int(terms[sel].max()), counts.shape[1], p, length))
            n_cut = np.sqrt(np.einsum("bx,bx->b", pmf, pmf)) * (1 + gamma(cut + 2))
            err_proof = c_unit * (n_cut + extra * (1 + rel_cut)) / (1 - 2 * c_unit) * (1 + gamma(4)) \
                if c_unit < 0.25 else np.full(sel.size, math.inf)
            # each problem's own cut c_b <= cut, where its Chernoff bound falls to 1e-10 of its
            # delta: the proof counts P(W >= c_b) as always in the tail and meets the FFT's error
            # only below c_b (:func:`_tail_T_up`), where f is small (an l2 error over all of the
            # batch's cut, where f nears 1 for a small G[j, j], would cost more than the tail)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                lev = ((lmgf - np.log(1e-10 * dsel)[:, None]) / _CHERNOFF_LAMBDAS[None, :]).min(axis=1)
            own = np.clip(np.ceil(np.nan_to_num(lev, nan=cut, posinf=cut)), 1, cut).astype(np.int64)
            own = np.minimum(own, sup + 1)
            extra_own, rel_own = _chernoff_and_error(lmgf, own.astype(np.float64), tsel, sup, p, counts.shape[1])
            extra_own[sup < own] = 0.0
            proof = TailProof(last=own - 1, error=np.asarray(err_proof, dtype=np.float64), extra_own=extra_own,
                              rel_own=rel_own, rel_cut=rel_cut)
        else:
            raise MfcliError(f"unknown tail method {method!r}")
        out[sel] = solve_tail_eps(pmf, extra, err, sigma=sigma, h=h, g_lo=g_lo[sel], g_hi=g_hi[sel],
                                  delta=dsel, proof=proof)
    return out


def _chernoff_level_guess(log_mgf: np.ndarray, target: np.ndarray, support: np.ndarray) -> int:
    """Where the cut search of :func:`tail_epsilons` starts: the largest over the problems of the
    smallest level c with exp(min over lambda of (log E e^(lambda W) - lambda c)) <= target, i.e.
    ceil(min over lambda of (log mgf - log target) / lambda), but at most the support's end + 1
    (where the tail is 0). Only a starting point (:func:`mfcli.util.search.smallest_true` checks
    it); 1 where it is not finite."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lev = ((log_mgf - np.log(target)[:, None]) / _CHERNOFF_LAMBDAS[None, :]).min(axis=1)
        lev = np.minimum(np.ceil(lev), support + 1.0)
    best = float(lev.max()) if lev.size else 1.0
    return int(best) if math.isfinite(best) else 1


def tail_allocation(prep: PreparedStrategy, pairs: TailPairs, uniform_share: float) -> np.ndarray:
    """Share of delta_tail for every distinct tail problem (docs/accounting.md, "Algorithm", step 1).

    Pair (r, j) is allotted a_rj = u / K + (1 - u) C[r, j] / sum_pairs C[r', j'] (u =
    ``uniform_share``): a pair whose column carries more weight in its row moves that row's mixture
    more, so it gets more of the budget. The union bound only needs sum_pairs a_rj <= 1; pairs that
    share a problem (solved once) all use the smallest allotment among them, so the shares used
    sum to at most 1. u = 1 is the uniform split delta_tail / K.
    """
    k = pairs.count
    u = pairs.counts.shape[0]
    if k == 0:
        return np.zeros(u)
    # the shares used sum to at most 1 in exact arithmetic: each computed share (and its product
    # with delta_tail) is within a few roundings of the exact value, which the relative 1e-12 given
    # up covers for any number of pairs below 10^3 x 2^53 / 4
    if uniform_share >= 1.0:
        return np.full(u, (1.0 / k) * (1.0 - 1e-12))
    w = prep.strategy[pairs.rows, pairs.cols]
    a = uniform_share / k + (1.0 - uniform_share) * w / w.sum()
    share = np.full(u, np.inf)
    np.minimum.at(share, pairs.key, a)
    return share * (1.0 - 1e-12)  # round-off in the sum (gamma_K of it; K <= 10^3 u^-1 / 4)


#: Relative margin by which :func:`posterior_bound` raises p~ (it covers the evaluation's round-off).
POSTERIOR_MARGIN = 1e-12


def posterior_bound(p: float, eps: np.ndarray) -> np.ndarray:
    """p~ = p e^eps / (p e^eps + 1 - p) = 1 / (1 + c e^-eps), c = (1 - p) / p, rounded up by a
    relative :data:`POSTERIOR_MARGIN`; 1 where eps is infinite; never below p (eps >= 0).

    Round-off (model of :mod:`mfcli.util.floating`): c is formed with two roundings, e^-eps within
    ELEMENTARY_ULPS u, their product one more: the computed X = c e^-eps is within gamma_7 of the
    exact one (ELEMENTARY_ULPS = 4 counted as 4 roundings), D = fl(1 + X) within gamma_8 of 1 + X
    (the sum of non-negative terms), fl(1 / D) within gamma_9 of p~, and the margin's product and
    fl(1 + 1e-12) two more: the result is >= p~ (1 - gamma_9)(1 + 1e-12)(1 - u)^2 > p~, since
    gamma_11 < 1.3e-15. Where e^-eps is below the smallest normal number, X < c 2^-1022 and the
    computed p~ is 1 or within u of it, >= p~ after the margin or the cap at 1. The floor p covers
    c = inf (p below 1 / 1.8e308), where 1 / (1 + inf) = 0."""
    eps = np.asarray(eps, dtype=np.float64)
    with np.errstate(over="ignore"):
        pt = 1.0 / (1.0 + (1.0 - p) / p * np.exp(-eps))
    pt = np.where(np.isfinite(eps), np.maximum(pt * (1 + POSTERIOR_MARGIN), p), 1.0)
    return np.minimum(pt, 1.0)


# ---------------------------------------------------------------------------------------------
# Step 3: row mixtures


def row_mixture(weights: np.ndarray, probs: np.ndarray, *, cut: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Law of S = sum_j weights[j] B_j, B_j ~ Bernoulli(probs[j]) independent, integer weights.

    The upper tail is cut where its mass falls below ``cut`` (spread over the steps), the rest is
    renormalised.

    Returns:
        (support, probabilities, eta): integer support points with positive probability, their
        renormalised probabilities, and the cut mass eta <= cut.
    """
    order = np.lexsort((probs, weights))
    weights = np.asarray(weights)[order]
    probs = np.asarray(probs)[order]
    per_step = cut / max(1, weights.size)
    # the law is kept reversed at the end of buf, P(S = i) at buf[total - 1 - i]: it is buf[lo:][::-1]
    # (size = total - lo entries), updated in place with the same products and sums as forming
    # (1 - q) pmf and adding q pmf shifted by w in a fresh array (0 + x is x): no new array per
    # column, which with the tail cut below was most of the time of a row of ~100 columns. Reversed,
    # the upper tail the cut reads is a forward slice at lo, and a step is three ufunc calls on
    # views (no setitem). buf is kept 0 below lo (a cut zeroes what it removes), so a step writes
    # no zeros first, and q pmf goes to a scratch array allocated once.
    total = int(np.sum(weights[probs > 0])) + 1
    buf = np.zeros(total)
    scratch = np.empty(total)
    lo = total - 1
    buf[lo] = 1.0
    eta = 0.0
    multiply, add = np.multiply, np.add
    for w, q in zip(weights.tolist(), probs.tolist(), strict=True):
        if q <= 0:
            continue
        law = buf[lo:]
        shifted = multiply(law, q, out=scratch[lo:])
        multiply(law, 1 - q, out=law)
        lo -= w
        moved = buf[lo:total - w]  # P(S + w = i) for the same i: law index i - w, w places on
        add(moved, shifted, out=moved)
        size = total - lo
        # cut the upper tail with mass <= per_step
        # the upper-tail masses from the top, only as far as needed: a cumulative sum is sequential,
        # so a prefix is bit-identical to the prefix of the full one, and the cut reads only up to
        # the first value above per_step
        m = 2 * w + 32
        rc = buf[lo:lo + m].cumsum()  # (a slice past the end is the whole law)
        while m < size and rc[-1] <= per_step:
            m *= 4
            rc = buf[lo:lo + m].cumsum()
        k = int(rc.searchsorted(per_step, side="right"))  # rc[:k] <= per_step
        if 0 < k < size:
            eta += float(rc[k - 1])
            buf[lo:lo + k] = 0.0
            lo += k
    pmf = buf[lo:][::-1]
    support = np.flatnonzero(pmf > 0)
    pr = pmf[support]
    pr = pr / pr.sum()
    return support, pr, eta


def coarsen_up(support: np.ndarray, probs: np.ndarray, refinement: int) -> tuple[np.ndarray, np.ndarray]:
    """Move every atom k (fine grid 1/(M R)) UP to the coarse grid point ceil(k / R) (grid 1/M)
    and add the probabilities that land on the same point.

    Why: rounding every weight C[r, j] up to the coarse grid 1/M costs up to 1/M per participating
    column, which for a dense row (hundreds of small entries) inflates S_r by several grid steps;
    convolving on the fine grid and rounding only the sum costs at most 1/M + k / (M R) for k
    participants, with the same coarse support (the PLD's cost). Pointwise S_coarse >= S, so the
    coarse law is stochastically larger (docs/accounting.md, "Algorithm", step 3)."""
    if refinement == 1:
        return support, probs
    coarse = -((-np.asarray(support, dtype=np.int64)) // refinement)  # ceil for non-negative ints
    rise = np.diff(coarse)
    if (rise >= 0).all():
        # an increasing support (row_mixture's): its distinct values and each atom's index among them
        # (np.unique's, without its sort) are where coarse steps up
        steps = rise > 0
        pts = coarse[np.concatenate(([True], steps))]
        inv = np.concatenate(([0], np.cumsum(steps)))
    else:
        pts, inv = np.unique(coarse, return_inverse=True)
    pr = np.bincount(inv, weights=probs)
    keep = pr > 0
    return pts[keep], pr[keep] / pr[keep].sum()


@dataclass(frozen=True)
class RowGroup:
    """A distinct row mechanism: MoG(sigma, support / resolution, probabilities), ``count`` rows."""

    support: np.ndarray
    probabilities: np.ndarray
    count: int
    eta: float
    first_row: int
    #: rho: every probability within a relative rho of the law exact arithmetic gives from the same
    #: weights and Bernoulli probabilities (the convolutions' and renormalisations' round-off; eta
    #: is rounded up by it too): passed to the row PLD (mog_pld.mixture_pld's probability_error)
    rho: float = 0.0

    def mixture(self, resolution: int) -> tuple[list[float], list[float]]:
        """(sensitivities, probabilities) of the row's mixture of Gaussians as Python floats: what
        dp-accounting's ``MixtureOfGaussiansDpEvent`` and its JSON hold."""
        return [float(s) / resolution for s in self.support], [float(q) for q in self.probabilities]


def row_refinement(nnz: int, coarse_length: int, refinement: int, budget: float) -> int:
    """The largest R' in (R, 10, 5, 2, 1) (those <= R) whose fine-grid convolution, about
    nnz x coarse_length x R' element operations, fits ``budget``: a dense row of a large C
    (hundreds of columns, a long law) falls back to a coarser fine grid, 1 at worst (every weight
    rounded to 1/M, the original step 3), so the run time stays near the original's."""
    for r in (refinement, 10, 5, 2, 1):
        if r <= refinement and (r == 1 or nnz * coarse_length * r <= budget):
            return r
    return 1


def build_row_groups(prep: PreparedStrategy, pairs: TailPairs, p_tilde_pair: np.ndarray, p: float, *,
                     resolution: int, cut: float, refinement: int = 1,
                     work_budget: float = ROW_WORK_BUDGET) -> tuple[list[RowGroup], int]:
    """Step 3 for every row, identical row laws grouped. With ``refinement`` R > 1 the weights are
    rounded up to the fine grid 1/(M R'), the law is convolved there and its sum rounded up to the
    grid 1/M (:func:`coarsen_up`), with R' <= R chosen per row to fit ``work_budget`` / rows
    (:func:`row_refinement`). Returns the groups and the smallest R' used."""
    c = prep.strategy
    m = c.shape[0]
    # p~ of the pairs, by row
    bounds = np.searchsorted(pairs.rows, np.arange(m + 1)) if pairs.count else np.zeros(m + 1, dtype=np.int64)
    groups: dict[bytes, list] = {}
    order: list[bytes] = []
    per_row = work_budget / max(1, m)
    used = refinement
    for r in range(m):
        cols = np.flatnonzero(c[r])
        if cols.size == 0:
            continue
        probs = np.full(cols.size, p)
        a, b = bounds[r], bounds[r + 1]
        if b > a:
            pos = np.searchsorted(cols, pairs.cols[a:b])
            probs[pos] = p_tilde_pair[a:b]
        coarse = _round_up_to_grid(c[r, cols], resolution)
        if refinement > 1 and row_refinement(cols.size, int(coarse.sum()) + 1, refinement, per_row) == refinement:
            # the coarse law's length (at most the sum of its weights, plus one) cannot lower R':
            # it is not needed
            rr = refinement
        else:
            support, pr, eta = row_mixture(coarse, probs, cut=cut)
            rr = row_refinement(cols.size, int(support.max()) + 1, refinement, per_row) if refinement > 1 else 1
        if rr > 1:
            support, pr, eta = row_mixture(_round_up_to_grid(c[r, cols], resolution * rr), probs, cut=cut)
            support, pr = coarsen_up(support, pr, rr)
        used = min(used, rr)
        rho = _law_error(cols.size, int(support.max()) * rr + 1, rr)
        eta *= 1.0 + rho  # a floating-point sum of masses each within rho: rounded up
        key = support.astype(np.int64).tobytes() + pr.tobytes()
        g = groups.get(key)
        if g is None:
            groups[key] = [support, pr, 1, eta, r, rho]
            order.append(key)
        else:
            g[2] += 1
            g[3] = max(g[3], eta)
            g[5] = max(g[5], rho)
    return [RowGroup(support=g[0], probabilities=g[1], count=g[2], eta=g[3], first_row=g[4], rho=g[5])
            for g in (groups[k] for k in order)], used


def _law_error(columns: int, size: int, refinement: int) -> float:
    """A bound on the relative error of every probability of a row law (:func:`row_mixture`, then
    :func:`coarsen_up`) against exact arithmetic on the same inputs: each Bernoulli step multiplies
    by q or by fl(1 - q) and adds (at most three roundings per column on any path), the cut's and
    the renormalisations' sums (at most ``size`` terms each, twice) and divisions, coarsening's
    sums of ``refinement`` terms; gamma of the total, doubled for the ratio of two such sums.
    Sums of non-negative terms only (Higham 3.1): any order."""
    return 2.02 * gamma(3 * columns + 2 * size + refinement + 8)


# ---------------------------------------------------------------------------------------------
# The whole algorithm


@dataclass(frozen=True)
class MMCCResult:
    """MMCC upper bound and everything needed to audit it.

    Attributes:
        epsilon: eps at ``delta`` = delta_pld + delta_tail + delta_trunc (an upper bound).
        delta, delta_pld, delta_tail, delta_trunc: the delta split.
        tail_fraction: f = delta_tail / delta as chosen (the best of ``fractions_tried``).
        pairs: K, the number of tail events.
        distinct_tail_problems: how many distinct tail problems were solved.
        max_p_tilde: the largest posterior bound p~.
        rows, distinct_rows: rows of C and distinct row mechanisms.
        sigma, sensitivity, noise_multiplier: sigma as given, sens(C), sigma / sens(C).
        sampling: p.
        value_discretization: PLD grid used; requested_discretization: the one asked for (the
            grid is coarsened to fit the work budget, see :func:`choose_discretization`).
        mixture_resolution, tail_resolution: M and M_W of the rounding grids 1/M, 1/M_W.
        fractions_tried: {f: eps} for every tail fraction tried.
        seconds: wall time.
        events: the row events (dp-accounting), grouped; see :meth:`dp_event`.
    """

    epsilon: float
    delta: float
    delta_pld: float
    delta_tail: float
    delta_trunc: float
    tail_fraction: float
    pairs: int
    distinct_tail_problems: int
    max_p_tilde: float
    rows: int
    distinct_rows: int
    sigma: float
    sensitivity: float
    noise_multiplier: float
    sampling: float
    steps: int
    value_discretization: float
    requested_discretization: float
    mixture_resolution: int
    tail_resolution: int
    fractions_tried: dict
    seconds: float
    groups: tuple = field(repr=False, default=())
    mixture_refinement: int = 1
    tail_uniform_share: float = 1.0
    #: "fast" (floating point certified) or "dp-accounting" (its builder and composition, uncertified)
    engine: str = "fast"

    def dp_event(self):
        """ComposedDpEvent of SelfComposedDpEvent(MixtureOfGaussiansDpEvent(...), count) per
        distinct row: exactly what was composed (conditionally on the tail events)."""
        from dp_accounting import dp_event

        return dp_event.ComposedDpEvent([
            dp_event.SelfComposedDpEvent(
                dp_event.MixtureOfGaussiansDpEvent(self.noise_multiplier, *g.mixture(self.mixture_resolution)),
                int(g.count),
            )
            for g in self.groups
        ])

    def as_dict(self, *, include_event: bool = True) -> dict:
        d = {
            "setting": "mmcc",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "delta_pld": self.delta_pld,
            "delta_tail": self.delta_tail,
            "delta_trunc": self.delta_trunc,
            "tail_fraction": self.tail_fraction,
            "fractions_tried": {str(k): v for k, v in self.fractions_tried.items()},
            "tail_events_K": self.pairs,
            "distinct_tail_problems": self.distinct_tail_problems,
            "max_p_tilde": self.max_p_tilde,
            "rows": self.rows,
            "distinct_rows": self.distinct_rows,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "noise_multiplier": self.noise_multiplier,
            "sampling": self.sampling,
            "steps": self.steps,
            "value_discretization": self.value_discretization,
            "requested_discretization": self.requested_discretization,
            "mixture_grid": 1.0 / self.mixture_resolution,
            "tail_grid": 1.0 / self.tail_resolution,
            "mixture_fine_grid": 1.0 / (self.mixture_resolution * self.mixture_refinement),
            "tail_uniform_share": self.tail_uniform_share,
            "seconds": self.seconds,
            "method": "MMCC-style conditional composition (docs/accounting.md); a valid upper bound, "
                      "possibly looser than the paper's algorithm; "
                      + ("round-off certified: row PMFs lifted over proven delta bounds, the composition's FFT "
                         "error bounded by tilted FFTs (assumed: FFT, erfc/ndtr and exp accuracy models, "
                         "mfcli.util.floating and pld_certify)" if self.engine == "fast"
                         else "dp-accounting's builder and composition (round-off not certified)"),
            "assumptions": "Poisson sampling with rate p in every step; add or remove one example; C >= 0 "
                           "causal in release order, scaled to unit sensitivity; pessimistic PLD",
        }
        if include_event:
            d["dp_event"] = plain_json(plain_mixture_rows(self.noise_multiplier, [  # event_to_json(self.dp_event())
                (*g.mixture(self.mixture_resolution), int(g.count)) for g in self.groups]))
        return d


def choose_discretization(groups: Sequence[RowGroup], *, sigma: float, resolution: int, requested: float,
                          budget: float | None = PLD_WORK_BUDGET) -> float:
    """The PLD grid for the row mechanisms: the requested d, or the first of d x (2, 5, 10, 20,
    ...) for which sum_rows (loss range / grid) x (support size) fits ``budget``. A coarser grid is
    still pessimistic (connect-the-dots on fewer points); it only loosens the bound slightly."""
    if budget is None:
        return requested
    work = 0.0
    for g in groups:
        # at the sensitivities the row PLDs are built from (:func:`_compose`): their truncation
        # points, searched here, are then found in mog_pld's memo, not searched again
        work += mog_pld.loss_range(sigma, _sensitivities_up(g.support, resolution), g.probabilities) * g.support.size
    steps = (1, 2, 5)
    i = 0
    d = requested
    while work / d > budget and d < 0.1:
        i += 1
        d = requested * steps[i % 3] * 10 ** (i // 3)
    return d


def _sensitivities_up(support: np.ndarray, resolution: int) -> np.ndarray:
    """The row's sensitivities as floats no smaller than the exact sums of the weights they stand
    for (a larger sensitivity is pessimistic: the mixture's likelihood ratio is monotone in it).

    Each weight x_j (an entry of the prepared C) was rounded to k_j with fl(k_j / M) >= x_j
    (:func:`_round_up_to_grid`), so the exact k_j / M >= x_j / (1 + u), and the exact scaled
    weight w_j <= x_j (1 + u) / (1 - u) (:func:`gram_error`: the scaling by sens(C)): K / M >= sum
    w_j (1 - u) / (1 + u)^2. s = fl(K / M) >= K / M / (1 + u); fl(s (1 + 8u)) >= s (1 + 8u) / (1 + u)
    (1 + 8u = 1 + 2^-50 is a float); one float up multiplies by more than 1 + u. Together the result
    is >= sum w_j (1 + 8u)(1 - u) / (1 + u)^3 > sum w_j. K = 0 stays 0."""
    k = np.asarray(support, dtype=np.int64)
    s = k / resolution
    return np.where(k == 0, 0.0, np.nextafter(s * (1.0 + 8.0 * UNIT_ROUNDOFF), np.inf))


def _compose(groups: Sequence[RowGroup], *, sigma: float, resolution: int, d: float, engine: str):
    if engine == "dp-accounting":
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=d)
        for g in groups:
            acc.compose(dp_event.MixtureOfGaussiansDpEvent(sigma, *g.mixture(resolution)), int(g.count))
        return pld_ops.Pld.from_dp_accounting(acc._pld)
    # recorded (pld_ops' arithmetic, the same calls) for the round-off certificate (pld_certify)
    # every row's PLD at once (mog_pld.mixture_plds: each the one mixture_pld gives, bit for bit)
    plds = mog_pld.mixture_plds(sigma, [(_sensitivities_up(g.support, resolution), g.probabilities, g.rho)
                                        for g in groups], value_discretization_interval=d)
    node = pld_certify.compose_counted([(pld, int(g.count)) for pld, g in zip(plds, groups, strict=True)])
    assert node is not None  # every group has count >= 1 and there is at least one
    return node


def check_tail_fraction(f: Any) -> float:
    """A share of delta for MMCC's tail events: a number in (0, 1)."""
    try:
        v = float(f)
    except (TypeError, ValueError):
        raise MfcliError(f"tail fractions must lie in (0, 1), got {f!r}") from None
    if not 0.0 < v < 1.0:
        raise MfcliError(f"tail fractions must lie in (0, 1), got {f!r}")
    return v


@_single_blas_thread
def mmcc(
    strategy: np.ndarray | PreparedStrategy,
    *,
    sigma: float,
    sampling: float,
    delta: float = DEFAULT_DELTA,
    release_steps: Sequence[int] | None = None,
    tail_fractions: Sequence[float] = (DEFAULT_TAIL_FRACTION,),
    value_discretization: float = DEFAULT_DISCRETIZATION,
    mixture_resolution: int = DEFAULT_MIXTURE_RESOLUTION,
    tail_resolution: int | None = None,
    engine: str = "fast",
    pld_work_budget: float | None = PLD_WORK_BUDGET,
    tail_method: str = "fft",
    progress: Callable[[str], None] | None = None,
    max_memory: int | None = None,
    on_progress: ProgressCallback | None = None,
    mixture_refinement: int = DEFAULT_MIXTURE_REFINEMENT,
    tail_uniform_share: float = DEFAULT_TAIL_UNIFORM_SHARE,
) -> MMCCResult:
    """Epsilon of the matrix mechanism C G + Z under Poisson sampling (docs/accounting.md, "Algorithm").

    Args:
        strategy: C (m x n, non-negative, causal in release order), any scale.
        sigma: noise standard deviation in units of the clip norm for C as given; the noise
            multiplier per unit sensitivity is sigma / sens(C).
        sampling: Poisson rate p in (0, 1].
        delta: total delta.
        release_steps: t(r) of every row (default: square C, t(r) = r).
        tail_fractions: f values tried for delta_tail = f delta; the smallest eps is reported
            (free: no data is touched).
        value_discretization: PLD grid requested (the finest used).
        mixture_resolution: M, rows' sensitivities are rounded up to multiples of 1/M.
        tail_resolution: M_W, G entries rounded up to multiples of 1/M_W (default from sigma).
        engine: "fast" (vectorised PLD builder; epsilon certified against the composition's FFT
            round-off, :mod:`mfcli.accounting.pld_certify`) or "dp-accounting" (its PLDAccountant
            with MixtureOfGaussiansDpEvent; slow, for cross-checks; its epsilon is dp-accounting's,
            NOT certified against that round-off).
        pld_work_budget: the row PLDs' grid is coarsened (1-2-5 steps) until their total work fits
            this budget (None: never); the grid used is reported as ``value_discretization``.
        tail_method: "fft" or "direct" (see :func:`tail_epsilons`).
        mixture_refinement: R; rows are convolved on the grid 1/(M R') and each row's sum is
            rounded up to 1/M (1: every weight rounded up to 1/M, the original step 3); R' <= R
            per row within a work budget (:func:`row_refinement`); the result reports the
            smallest R' used.
        tail_uniform_share: u in (0, 1]; delta_tail is split over the K tail events as
            u / K + (1 - u) C[r, j] / sum C (:func:`tail_allocation`; 1: uniform).
        progress: called with short stage messages (the first states the memory estimate).
        max_memory: bytes the tail-event collection may use (None: no limit); a run that would
            exceed it raises :class:`mfcli.util.memory.MemoryLimitError` with the estimate, before
            allocating it. The composition's memory is bounded by ``pld_work_budget``.
        on_progress: receives :class:`mfcli.util.progress.ProgressEvent` (phases ``MMCC tail events``:
            rows walked; ``MMCC composition``: tail fractions done).

    Formal guarantees: an upper bound on the epsilon of add/remove-one DP at ``delta`` for the
    adaptive matrix mechanism with Poisson sampling (see the module docstring for the argument).
    For C = I it equals DP-SGD (K = 0, all of delta to the PLD).
    """
    t0 = time.perf_counter()
    sigma, p, delta, d = check_pld_inputs(sigma, sampling, delta, value_discretization)
    if engine not in ("fast", "dp-accounting"):
        raise MfcliError(f"unknown accounting engine {engine!r} (fast or dp-accounting)")
    if isinstance(mixture_resolution, bool) or int(mixture_resolution) != mixture_resolution or mixture_resolution < 1:
        raise MfcliError("the mixture resolution must be a positive integer")
    if isinstance(mixture_refinement, bool) or int(mixture_refinement) != mixture_refinement or mixture_refinement < 1:
        raise MfcliError("the mixture refinement must be a positive integer")
    if not 0.0 < float(tail_uniform_share) <= 1.0:
        raise MfcliError(f"the uniform share of the tail delta must lie in (0, 1], got {tail_uniform_share!r}")
    fracs = [check_tail_fraction(f) for f in tail_fractions]
    if not fracs:
        raise MfcliError(f"tail fractions must lie in (0, 1), got {tail_fractions!r}")
    prep = prepare_strategy(strategy, release_steps)
    sig = sigma / prep.sensitivity
    res_w = int(tail_resolution) if tail_resolution is not None else default_tail_resolution(sig)
    say = progress or (lambda s: None)

    fixed, worst = tail_pairs_memory(prep, resolution=res_w)
    limit = "" if max_memory is None else f"; limit {format_size(max_memory)}"
    say(f"MMCC: collecting tail events ({prep.m} rows; memory {format_size(fixed)}, up to {format_size(worst)} "
        f"if every tail problem is distinct{limit})")
    pairs = collect_tail_pairs(prep, resolution=res_w, max_memory=max_memory, on_progress=on_progress)
    k_pairs = pairs.count
    cut = TRUNCATION_SHARE * delta / max(1, prep.m)
    best: tuple | None = None
    tried: dict = {}
    tick = Ticker(on_progress, "MMCC composition", len(fracs), unit="tail fractions")
    for i, f in enumerate(fracs):
        tick(i)
        if k_pairs == 0 or p == 1.0:
            # no tail events (every column new when used, e.g. C = I) or no randomness to hide in
            f_eff, delta_tail = 0.0, 0.0
            p_tilde = np.ones(k_pairs) if p == 1.0 else np.zeros(0)
            max_pt = p if k_pairs == 0 else 1.0
        else:
            f_eff = f
            delta_tail = f * delta
            say(f"MMCC: {k_pairs} tail events, {pairs.counts.shape[0]} distinct (f = {f:g})")
            share = tail_allocation(prep, pairs, float(tail_uniform_share))
            eps_u = tail_epsilons(pairs, p=p, sigma=sig, delta_pair=delta_tail * share, method=tail_method)
            p_tilde = posterior_bound(p, eps_u[pairs.key])
            max_pt = float(max(p, p_tilde.max()))
        groups, r_used = build_row_groups(prep, pairs, p_tilde, p, resolution=mixture_resolution, cut=cut,
                                          refinement=int(mixture_refinement))
        # Cutting mass eta from a row's mixture costs eta in the remove direction and
        # eta / (1 - eta) in the add direction (Q >= (1 - eta) Q'); charge the larger.
        # (rounded up: gamma of the sum's terms and roundings); delta_pld rounded down, so that the
        # three parts add up to at most delta in exact arithmetic
        delta_trunc = float(sum(g.count * g.eta / (1.0 - g.eta) for g in groups)) * (1.0 + gamma(len(groups) + 4))
        delta_pld = (delta - delta_tail - delta_trunc) * (1.0 - 4.0 * UNIT_ROUNDOFF) - 4.0 * UNIT_ROUNDOFF * delta
        if not delta_pld > 0:
            tried[f_eff] = math.inf
            continue
        say(f"MMCC: composing {len(groups)} distinct row mechanisms of {prep.m}")
        d_used = d if engine == "dp-accounting" else choose_discretization(
            groups, sigma=sig, resolution=mixture_resolution, requested=d, budget=pld_work_budget)
        pld = _compose(groups, sigma=sig, resolution=mixture_resolution, d=d_used, engine=engine)
        # the fast engine's epsilon certified against the FFT's round-off (pld_certify); the
        # dp-accounting engine's is its own, uncertified
        eps = (pld_certify.certified_epsilon(pld, delta_pld) if isinstance(pld, pld_certify.Node)
               else float(pld_ops.epsilon_for_delta(pld, delta_pld)))
        tried[f_eff] = eps
        if best is None or eps < best[0]:
            best = (eps, f_eff, delta_pld, delta_tail, delta_trunc, max_pt, groups, d_used, r_used)
        if f_eff == 0.0:
            break
    tick.finish()
    assert best is not None
    eps, f_eff, delta_pld, delta_tail, delta_trunc, max_pt, groups, d_used, r_used = best
    return MMCCResult(
        epsilon=eps, delta=delta, delta_pld=delta_pld, delta_tail=delta_tail, delta_trunc=delta_trunc,
        tail_fraction=f_eff, pairs=k_pairs, distinct_tail_problems=int(pairs.counts.shape[0]),
        max_p_tilde=max_pt, rows=prep.m, distinct_rows=len(groups), sigma=sigma,
        sensitivity=prep.sensitivity, noise_multiplier=sig, sampling=p, steps=prep.n,
        value_discretization=d_used, requested_discretization=d,
        mixture_resolution=int(mixture_resolution), tail_resolution=res_w,
        fractions_tried=tried, seconds=time.perf_counter() - t0, groups=tuple(groups),
        mixture_refinement=int(r_used), tail_uniform_share=float(tail_uniform_share), engine=engine,
    )


# ---------------------------------------------------------------------------------------------
# Brackets: lower bound and full-participation sanity bound


@dataclass(frozen=True)
class LowerBoundResult:
    """Exact epsilon of the best post-processed statistic T_v = v^T C^+ y tried (a lower bound on
    the true eps; :mod:`mfcli.accounting.mmcc_lower`).

    Attributes:
        epsilon: the largest of the statistics' epsilons.
        noise_scale: tau of the best statistic (in units of its largest weight).
        statistic: name of the best statistic ("ones": v = 1, the spec's 1^T C^+ y; "score":
            v = C^T C 1, i.e. T = (C 1)^T y up to scale; "score2": v = (C^T C)^2 1).
        tried: {name: epsilon} of every statistic tried.
    """

    epsilon: float
    delta: float
    noise_scale: float
    steps: int
    sampling: float
    statistic: str = "ones"
    tried: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return fields_of(
            self, "epsilon", "delta", "statistic", first={"setting": "lower-bound"},
            statistics_tried=dict(self.tried), statistic_noise_std=self.noise_scale,
            method="max over v in {1, C^T C 1, (C^T C)^2 1} of the exact epsilon of T_v = v^T C^+ y = "
                   "v^T b + N(0, tau^2), tau^2 = sigma_eff^2 v^T (C^T C)^-1 v, b_j ~ Bernoulli(p); v rounded "
                   "down to a grid; exact hockey-stick divergence (max of add and remove), bisection on eps",
            assumptions="Poisson sampling with rate p; add or remove one example; valid for the true "
                        "epsilon of any mechanism whose outputs determine T",
        )


@_single_blas_thread
def lower_bound(
    strategy: np.ndarray | PreparedStrategy,
    *,
    sigma: float,
    sampling: float,
    delta: float = DEFAULT_DELTA,
    release_steps: Sequence[int] | None = None,
    statistics: Sequence[str] = mmcc_lower.STATISTICS,
) -> LowerBoundResult:
    """Lower bound on the true epsilon (docs/accounting.md, "A tighter lower bound"): the largest
    exact epsilon of the statistics T_v = v^T C^+ y for v in ``statistics`` (C scaled to unit
    sensitivity, C^+ the least-squares left inverse). T_v is v^T b + N(0, tau^2) under Q and
    N(0, tau^2) under P, tau^2 = sigma_eff^2 v^T (C^T C)^-1 v; its exact hockey-stick curve
    (both directions) is inverted by bisection. ``statistics=("ones",)`` is the spec's 1^T C^+ y.

    Formal guarantees: each T_v is a post-processing of the mechanism's output, fixed before any
    data is seen, so its epsilon can only be smaller than the mechanism's: never above the true
    epsilon, and neither is their maximum. Every rounding (weights down, binomial tails moved down,
    tau up, the bisection's lower end) only lowers the value further, and the floating point is
    bounded: the statistic is the one the computed weights define, its noise rounded up, the
    hockey-stick value certified (:func:`mmcc_lower.statistic_epsilon` with the strategy).
    """
    sigma = check_sigma(sigma)
    p = check_sampling(sampling)
    delta = check_delta(delta)
    names = tuple(statistics)
    if not names or any(s not in mmcc_lower.STATISTICS for s in names):
        raise MfcliError(f"lower-bound statistics must be among {', '.join(mmcc_lower.STATISTICS)}, got {names!r}")
    prep = prepare_strategy(strategy, release_steps)
    c = prep.strategy
    sig = sigma / prep.sensitivity
    gram = c.T @ c
    try:
        chol = np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        raise MfcliError("C has dependent columns: no left inverse, no lower bound") from None
    tried: dict[str, float] = {}
    best = (-1.0, "", 0.0)
    for name in names:
        v = mmcc_lower.statistic_weights(gram, name)
        eps, tau = mmcc_lower.statistic_epsilon(chol, v, sigma_eff=sig, p=p, delta=delta, strategy=c)
        tried[name] = eps
        if eps > best[0]:
            best = (eps, name, tau)
    return LowerBoundResult(epsilon=best[0], delta=delta, noise_scale=best[2], steps=prep.n, sampling=p,
                            statistic=best[1], tried=tried)


@dataclass(frozen=True)
class FullParticipationResult:
    """Gaussian with sensitivity ||C 1||_2 (the example in every step): a sanity upper bound."""

    epsilon: float
    delta: float
    sensitivity: float

    def as_dict(self) -> dict:
        return fields_of(
            self, "epsilon", "delta", "sensitivity", first={"setting": "full-participation"},
            method="exact analytic Gaussian with sensitivity ||C 1||_2 (C scaled to unit sensitivity)",
            assumptions="holds for any participation pattern (C >= 0); no amplification",
        )


def full_participation(
    strategy: np.ndarray | PreparedStrategy,
    *,
    sigma: float,
    delta: float = DEFAULT_DELTA,
    release_steps: Sequence[int] | None = None,
) -> FullParticipationResult:
    """Epsilon of a Gaussian with sensitivity ||C 1||_2 / sens(C) and noise sigma / sens(C) -- an
    upper bound for every sampling scheme since C >= 0 (joint convexity of the hockey-stick
    divergence over the mixture of participation patterns)."""
    sigma = check_sigma(sigma)
    delta = check_delta(delta)
    prep = prepare_strategy(strategy, release_steps)
    sens1 = float(np.linalg.norm(prep.strategy.sum(axis=1)))
    sig = sigma / prep.sensitivity
    return FullParticipationResult(epsilon=gaussian_epsilon(delta, sens1 / sig), delta=delta, sensitivity=sens1)


def summary_row(result: Any) -> dict:
    """as_dict() of any accounting result (helper for renderers)."""
    return result.as_dict()
