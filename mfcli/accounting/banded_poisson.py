"""Banded C under Poisson sampling: the exact likelihood ratio, an importance-sampled ESTIMATE of
epsilon, and a certified lower bound from rows with disjoint supports (docs/accounting.md, "Banded C
under Poisson sampling").

Model (the MMCC pair, docs/accounting.md): C is square, lower-triangular, non-negative, scaled to
max column norm 1, and b-banded (C[r, j] = 0 unless 0 <= r - j < b); sigma is the noise multiplier
per unit sensitivity. P = N(0, sigma^2 I) (example absent), Q = E_x N(C x, sigma^2 I) with
x_j ~ Bernoulli(p) i.i.d. (present, Poisson sampling).

1. Exact likelihood ratio (:func:`log_likelihood_ratio`). Row r of C x depends only on the window
   x_{r-b+1..r}, and the rows of y are independent given x, so
   L(y) = dQ/dP(y) = E_x prod_r exp((y_r mu_r(x) - mu_r(x)^2 / 2) / sigma^2) is a hidden-Markov
   forward recursion over the 2^(b-1) states of the last b - 1 bits: O(n 2^b) per sample,
   vectorised over samples. It is the same sum as the brute force over all 2^n patterns, only
   regrouped (tested against it).
2. ESTIMATE of epsilon (:func:`estimate_epsilon`): delta_remove(eps) = E_P[(L - e^eps)_+] and
   delta_add(eps) = E_P[(1 - e^eps L)_+] (named as dp-accounting and docs/accounting.md name them:
   remove is H(with || without) = H(Q || P), add the reverse) by importance sampling from the defensive mixture
   R = a P + (1 - a) mean_k R_k, R_k = E_x N(theta s_k C x, sigma^2 I), x ~ Bernoulli(q_k) (theta =
   +1 for remove, -1 for add; q_k in {p, 4p, 16p} capped at max(0.5, p), s_k in {1, 2, 4, 8}, all
   at once with fixed weights). dR/dP = a + (1 - a) mean_k L_{q_k, theta s_k C}(y) comes from the same recursion, so
   every weight is exact and at most 1 / a. The estimate and its confidence interval (pointwise
   normal interval of z standard errors on delta, inverted in eps) are an ESTIMATE: never a
   guarantee, never used to calibrate.
3. Certified lower bound (:func:`disjoint_rows_lower_bound`): keep only the rows r0, r0 + b,
   r0 + 2b, ... of y. Their column windows are disjoint, so under both P and Q they are independent,
   and row r alone is the mixture E N(sum_j C[r, j] x_j, sigma^2) against N(0, sigma^2): the kept
   rows are the composition of those one-dimensional mixtures, whose epsilon is computed with an
   optimistic PLD (a lower estimate). Post-processing cannot raise epsilon, so the result is a lower
   bound on the true epsilon. For C = I it is DP-SGD.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from mfcli.accounting.mmcc import PreparedStrategy, prepare_strategy
from mfcli.accounting.mmcc_lower import epsilon_bracket
from mfcli.accounting.single_pass import DEFAULT_DELTA, check_delta, check_sampling, check_sigma
from mfcli.errors import MfcliError
from mfcli.util.progress import ProgressCallback, Ticker
from mfcli.util.rows import fields_of

#: Largest bandwidth the forward recursion and the estimate are run for (2^(b-1) states).
MAX_BAND = 10
#: Work budget of the estimate: samples x n x 2^b x (likelihood recursions per sample), per direction.
ESTIMATE_WORK = 2e8
#: Most samples per direction.
MAX_SAMPLES = 50_000
#: Sample batches per direction (progress is reported after each).
BATCHES = 4
#: Mean scales s of the proposal components (:func:`proposal_components`).
PROPOSAL_SCALES = (1.0, 2.0, 4.0, 8.0)
#: Share of the defensive component P in the importance-sampling proposal.
DEFENSIVE_SHARE = 0.1
#: Standard errors on each side of the estimate's interval.
CONFIDENCE_Z = 3.0


# ---------------------------------------------------------------------------------------------
# Structure


def bandwidth(strategy: np.ndarray) -> int | None:
    """b = 1 + max(r - j) over the non-zero entries of a square lower-triangular C; None when C is
    not square or has an entry above the diagonal."""
    c = np.asarray(strategy)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        return None
    r, j = np.nonzero(c)
    if r.size == 0:
        return None
    if np.any(j > r):
        return None
    return int((r - j).max()) + 1


def window_coefficients(strategy: np.ndarray, band: int) -> np.ndarray:
    """K (n x b): K[r, k] = C[r, r - b + 1 + k] (oldest column first; 0 for columns before 0)."""
    c = np.asarray(strategy, dtype=np.float64)
    n = c.shape[0]
    k = np.zeros((n, band))
    for d in range(band):  # d = r - j
        diag = np.diagonal(c, offset=-d)  # C[j + d, j], j = 0..n-d-1
        k[d:, band - 1 - d] = diag
    return k


def _window_bits(band: int) -> np.ndarray:
    """bits[w, k]: bit k (oldest first) of window w, the oldest bit being the most significant."""
    w = np.arange(1 << band)
    return (w[:, None] >> (band - 1 - np.arange(band))[None, :]) & 1


# ---------------------------------------------------------------------------------------------
# 1. Exact likelihood ratio


def log_likelihood_ratio(y: np.ndarray, strategy: np.ndarray, *, sampling: float, sigma: float,
                         band: int | None = None) -> np.ndarray:
    """log dQ/dP at every row of ``y`` (N x n) for Q = E_x N(C x, sigma^2 I), x_j ~ Bernoulli(p)
    i.i.d., P = N(0, sigma^2 I), C square lower-triangular and ``band``-banded (any sign: the
    proposal of the estimate uses -C).

    Forward recursion over the states (x_{r-b+2}, ..., x_r): alpha_r(s') = sum over the dropped
    bit of alpha_{r-1}(s) Pr(x_r) exp((y_r mu_r(w) - mu_r(w)^2 / 2) / sigma^2), w the window
    (s, x_r); alpha is renormalised every row and the logarithms of the scales are accumulated.
    Exact up to floating point (no truncation, no sampling).
    """
    c = np.asarray(strategy, dtype=np.float64)
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    n = c.shape[0]
    if y.shape[1] != n:
        raise MfcliError(f"y has {y.shape[1]} coordinates for a {n} x {n} strategy")
    b = bandwidth(c) if band is None else int(band)
    if b is None:
        raise MfcliError("the likelihood recursion needs a square lower-triangular C")
    p = float(sampling)
    if not 0 < p <= 1:
        raise MfcliError(f"the sampling rate must lie in (0, 1], got {p!r}")
    nsamp = y.shape[0]
    kmat = window_coefficients(c, b) / (sigma * sigma)  # y_r K / sigma^2 is the per-bit log factor
    bits = _window_bits(b)
    mu = window_coefficients(c, b) @ bits.T  # (n, 2^b)
    newest = bits[:, -1]
    with np.errstate(divide="ignore"):
        log_prior = np.where(newest == 1, math.log(p), math.log1p(-p) if p < 1 else -np.inf)
    s_count = 1 << (b - 1)
    # samples along the last axis: every per-row operation reads contiguous memory
    yt = np.ascontiguousarray(y.T)
    alpha = np.zeros((s_count, nsamp))
    alpha[0] = 1.0  # bits before step 0 are 0 (the example cannot take part before it exists)
    log_scale = np.zeros(nsamp)
    prev_idx = np.arange(1 << b) >> 1  # state before the step for window w
    for r in range(n):
        lf = kmat[r][:, None] * yt[r][None, :]  # (b, N) log factor of each set bit
        m = np.maximum(lf, 0.0)
        f1 = np.exp(lf - m)
        f0 = np.exp(-m)
        # butterfly: window value = prod_k (f1_k if bit k else f0_k); the bit added last becomes
        # the most significant, so go from the newest bit to the oldest
        v = np.ones((1, nsamp))
        for k in reversed(range(b)):
            v = np.concatenate([v * f0[k], v * f1[k]], axis=0)
        const = np.exp(-mu[r] ** 2 / (2 * sigma * sigma) + log_prior)  # (2^b,)
        v *= const[:, None]
        v *= alpha[prev_idx] if b > 1 else alpha
        new = v[:s_count] + v[s_count:]
        tot = new.sum(axis=0)
        # tot == 0 only for an impossible pattern (p = 1 and ...): log 0 = -inf is then exact
        with np.errstate(divide="ignore", invalid="ignore"):
            log_scale += np.log(tot) + m.sum(axis=0)
            alpha = new / np.where(tot > 0, tot, 1.0)[None, :]
    return log_scale


def log_likelihood_ratio_brute_force(y: np.ndarray, strategy: np.ndarray, *, sampling: float,
                                     sigma: float) -> np.ndarray:
    """log dQ/dP by summing over all 2^n participation patterns (tests only; n <= 16)."""
    c = np.asarray(strategy, dtype=np.float64)
    n = c.shape[1]
    if n > 16:
        raise MfcliError("brute force over 2^n patterns is for n <= 16")
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    pats = ((np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1).astype(np.float64)
    means = pats @ c.T  # (2^n, m)
    k = pats.sum(axis=1)
    p = sampling
    with np.errstate(divide="ignore"):
        logw = k * math.log(p) + (n - k) * (math.log1p(-p) if p < 1 else -np.inf)
    expo = (y @ means.T - 0.5 * (means**2).sum(axis=1)[None, :]) / sigma**2 + logw[None, :]
    return special.logsumexp(expo, axis=1)


def sample_mixture(rng: np.random.Generator, strategy: np.ndarray, *, sampling: float, sigma: float,
                   size: int, scale: float = 1.0) -> np.ndarray:
    """``size`` draws of y = scale * C x + sigma Z, x_j ~ Bernoulli(sampling), Z standard normal."""
    c = np.asarray(strategy, dtype=np.float64)
    x = (rng.random((size, c.shape[1])) < sampling).astype(np.float64)
    return scale * (x @ c.T) + sigma * rng.standard_normal((size, c.shape[0]))


# ---------------------------------------------------------------------------------------------
# 2. Importance-sampled ESTIMATE


@dataclass(frozen=True)
class DirectionEstimate:
    """One direction of the estimate: eps where the estimated delta curve meets delta, and the
    interval where the curve +- z standard errors meets it."""

    direction: str
    epsilon: float
    low: float
    high: float
    samples: int
    components: int
    relative_error: float


@dataclass(frozen=True)
class EpsilonEstimate:
    """ESTIMATE of the true epsilon of the banded Poisson pair, with an approximate confidence
    interval; never a guarantee. The pair's epsilon and each end of its interval are the larger
    of the two directions' (computed from ``remove`` and ``add``, not stored beside them)."""

    delta: float
    band: int
    z: float
    add: DirectionEstimate
    remove: DirectionEstimate
    seed: int
    seconds: float

    @property
    def epsilon(self) -> float:
        return max(self.remove.epsilon, self.add.epsilon)

    @property
    def low(self) -> float:
        return max(self.remove.low, self.add.low)

    @property
    def high(self) -> float:
        return max(self.remove.high, self.add.high)

    def as_dict(self) -> dict:
        return fields_of(
            self, "epsilon", first={"kind": "ESTIMATE (Monte Carlo, not a guarantee; never used to calibrate)"},
            interval=[self.low, self.high], delta=self.delta, band=self.band, standard_errors=self.z, seed=self.seed,
            seconds=self.seconds, directions={
                d.direction: {"epsilon": d.epsilon, "interval": [d.low, d.high], "samples": d.samples,
                              "proposal_components": d.components, "relative_error_at_delta": d.relative_error}
                for d in (self.remove, self.add)
            },
            method="exact likelihood ratio by the banded forward recursion; importance sampling from a "
                   "defensive mixture of Poisson-mixture proposals at several rates and mean scales; interval = "
                   "normal approximation, z standard errors on delta(eps), inverted in eps",
        )


def _delta_terms(log_l: np.ndarray, eps: float, direction: str) -> np.ndarray:
    """(L - e^eps)_+ (remove) or (1 - e^eps L)_+ (add) per sample, overflow-free."""
    if direction == "remove":
        with np.errstate(over="ignore"):
            return np.where(log_l > eps, np.exp(log_l) - math.exp(eps), 0.0)
    return np.where(log_l + eps < 0, -np.expm1(np.minimum(log_l + eps, 0.0)), 0.0)


def _curve(log_l: np.ndarray, log_w: np.ndarray, eps: float, direction: str) -> tuple[float, float]:
    """Importance-sampled delta(eps) and its standard error."""
    t = _delta_terms(log_l, eps, direction)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.where(t > 0, t * np.exp(log_w), 0.0)
    n = v.size
    mean = float(v.mean())
    se = float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return mean, se


def proposal_components(p: float) -> list[tuple[float, float]]:
    """The components (q, s) of the proposal mixture: y = theta s C x + sigma Z, x_j ~ Bernoulli(q).

    q > p covers the events where many participations add up (large sigma); s > 1 covers the
    events where one participation meets a far Gaussian tail (small sigma, small p: for C = I,
    sigma = 1, p = 0.05 the remove curve at delta = 1e-6 is set by y_r near 5.5, which a proposal with
    s = 1 reaches with probability about 3e-6 per sample). All are used at once, with fixed
    weights. The earlier proposal (s = 1 only, one q chosen by a pilot run with the smallest
    estimated error) rarely reached such tails: the samples missed them, so both the estimate of
    delta and its standard error came out low and the interval under-covered (C = I, n = 8, sigma
    1, p 0.05, delta 1e-6: [1.814, 1.972] against the true 2.0222)."""
    rates = sorted({min(max(0.5, p), p * f) for f in (1, 4, 16)})  # never below p
    return [(q, s) for q in rates for s in PROPOSAL_SCALES]


def _draw(rng: np.random.Generator, c: np.ndarray, band: int, *, p: float, sigma: float, size: int,
          direction: str) -> tuple[np.ndarray, np.ndarray]:
    """Samples from the defensive proposal R = a P + (1 - a) mean_k R_k (R_k the components of
    :func:`proposal_components`, theta = +1 for remove, -1 for add); returns (log L_p(y),
    log dP/dR(y)). dR/dP = a + (1 - a) mean_k L_{q_k, theta s_k C}(y), every term exact by the
    same recursion, so dP/dR <= 1 / a."""
    theta = 1.0 if direction == "remove" else -1.0
    comps = proposal_components(p)
    which = rng.integers(0, len(comps), size)
    y = np.empty((size, c.shape[0]))
    for k, (q, s) in enumerate(comps):
        sel = which == k
        y[sel] = sample_mixture(rng, c, sampling=q, sigma=sigma, size=int(sel.sum()), scale=theta * s)
    from_p = rng.random(size) < DEFENSIVE_SHARE
    y[from_p] = sigma * rng.standard_normal((int(from_p.sum()), c.shape[0]))
    log_l = log_likelihood_ratio(y, c, sampling=p, sigma=sigma, band=band)
    log_mix = special.logsumexp(
        np.stack([log_likelihood_ratio(y, theta * s * c, sampling=q, sigma=sigma, band=band) for q, s in comps]),
        axis=0) - math.log(len(comps))
    log_r = np.logaddexp(math.log(DEFENSIVE_SHARE), math.log1p(-DEFENSIVE_SHARE) + log_mix)
    return log_l, -log_r


def _estimate_direction(rng: np.random.Generator, c: np.ndarray, band: int, *, p: float, sigma: float,
                        delta: float, samples: int, z: float, direction: str,
                        tick: Callable[[], None] = lambda: None) -> DirectionEstimate:
    parts = []
    for k in range(BATCHES):  # in batches, for the progress report
        size = samples * (k + 1) // BATCHES - samples * k // BATCHES
        parts.append(_draw(rng, c, band, p=p, sigma=sigma, size=size, direction=direction))
        tick()
    ll = np.concatenate([a for a, _ in parts])
    lw = np.concatenate([b for _, b in parts])

    def bound(x: float, k: float) -> float:
        m, se = _curve(ll, lw, x, direction)
        return m + k * se

    def solve(fn: Callable[[float], float]) -> float:
        """Smallest eps (to 1e-6 relative) with fn(eps) <= delta, inf beyond 1e4: the upper end."""
        return epsilon_bracket(fn, delta, rel_tol=1e-6, max_steps=80, eps_max=1e4)[1]

    est = solve(lambda x: _curve(ll, lw, x, direction)[0])
    high = solve(lambda x: bound(x, z))  # delta(eps) + z se <= delta from here on
    low = solve(lambda x: bound(x, -z))
    m, se = _curve(ll, lw, est, direction) if math.isfinite(est) else (0.0, math.inf)
    return DirectionEstimate(direction=direction, epsilon=est, low=low, high=high, samples=samples,
                             components=len(proposal_components(p)), relative_error=se / m if m > 0 else math.inf)


def _banded_strategy(strategy: np.ndarray | PreparedStrategy, *, max_band: int, what: str,
                     limit_note: str = "") -> tuple[PreparedStrategy, int]:
    """The prepared strategy and its bandwidth b, for ``what`` (a routine that needs a square
    lower-triangular C released one row per step, with b <= max_band).

    Raises:
        MfcliError: in one line, naming ``what``.
    """
    prep = prepare_strategy(strategy)
    b = bandwidth(prep.strategy)
    if b is None or not np.array_equal(prep.release_steps, np.arange(prep.n)):
        raise MfcliError(f"{what} needs a square lower-triangular C released one row per step")
    if b > max_band:
        raise MfcliError(f"C has bandwidth {b}; {what} runs for bandwidth <= {max_band}{limit_note}")
    return prep, b


def estimate_epsilon(
    strategy: np.ndarray | PreparedStrategy,
    *,
    sigma: float,
    sampling: float,
    delta: float = DEFAULT_DELTA,
    samples: int | None = None,
    seed: int = 0,
    z: float = CONFIDENCE_Z,
    max_band: int = MAX_BAND,
    on_progress: ProgressCallback | None = None,
) -> EpsilonEstimate:
    """ESTIMATE of the epsilon of the exact banded Poisson pair (max of remove and add), with an
    approximate confidence interval (module docstring, step 2). Not a bound: it is reported beside
    the bracket and never used to calibrate.

    Args:
        strategy: square, lower-triangular, non-negative, banded C (any scale; scaled to unit
            sensitivity here, sigma / sens(C) is the noise multiplier).
        sigma, sampling, delta: as for :func:`mfcli.accounting.mmcc.mmcc`.
        samples: samples per direction (default: the work budget ``ESTIMATE_WORK / (n 2^b)``,
            between 500 and ``MAX_SAMPLES``).
        seed: random seed (the estimate is reproducible).
        z: standard errors on each side of the interval.
        max_band: refuse C with a larger bandwidth (2^(b-1) states).
        on_progress: receives the sample batches drawn (phase ``banded estimate``,
            :mod:`mfcli.util.progress`).

    Raises:
        MfcliError: C not square lower-triangular non-negative, or banded with b > max_band.
    """
    t0 = time.perf_counter()
    sigma = check_sigma(sigma)
    p = check_sampling(sampling)
    delta = check_delta(delta)
    prep, b = _banded_strategy(strategy, max_band=max_band, what="the banded estimate",
                               limit_note=" (2^(b-1) states per step)")
    c = prep.strategy
    sig = sigma / prep.sensitivity
    n = prep.n
    if samples is None:
        recursions = len(proposal_components(p)) + 1
        samples = int(min(MAX_SAMPLES, max(500, ESTIMATE_WORK / (n * (1 << b) * recursions))))
    if samples < 10:
        raise MfcliError("the estimate needs at least 10 samples per direction")
    rng = np.random.default_rng(seed)
    ticker = Ticker(on_progress, "banded estimate", 2 * BATCHES, unit="sample batches")
    drawn = 0

    def tick() -> None:
        nonlocal drawn
        drawn += 1
        ticker(drawn)

    remove = _estimate_direction(rng, c, b, p=p, sigma=sig, delta=delta, samples=samples, z=z, direction="remove",
                              tick=tick)
    add = _estimate_direction(rng, c, b, p=p, sigma=sig, delta=delta, samples=samples, z=z, direction="add",
                              tick=tick)
    ticker.finish()
    return EpsilonEstimate(delta=delta, band=b, z=z, remove=remove, add=add, seed=seed, seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# 3. Certified lower bound from rows with disjoint supports


@dataclass(frozen=True)
class DisjointRowsLowerBound:
    """Lower bound on the true epsilon: the optimistic-PLD epsilon of the rows r0, r0 + b, ... of y
    (disjoint column windows, hence independent under both hypotheses)."""

    epsilon: float
    delta: float
    band: int
    offset: int
    rows_used: int
    value_discretization: float

    def as_dict(self) -> dict:
        return fields_of(
            self, "epsilon", "delta", "band", first_row=self.offset, rows_used=self.rows_used,
            value_discretization=self.value_discretization,
            method="post-processing: rows first_row, first_row + b, ... of y have disjoint column windows, so "
                   "they are independent one-dimensional Gaussian mixtures under both hypotheses; their "
                   "composition's exact loss distributions with every loss rounded down (a lower estimate)",
        )


#: Mixture components below this probability are moved to sensitivity 0 (down: still a lower bound).
_NEGLIGIBLE = 1e-14


def row_law(weights: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact law of sum_j weights[j] x_j, x_j ~ Bernoulli(p) i.i.d., over all 2^k subsets (k <=
    MAX_BAND), equal values merged; components with probability below 1e-14 are moved to 0 (a
    stochastically smaller law: the pair's divergences can only fall)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w[w != 0]
    k = w.size
    pats = ((np.arange(1 << k)[:, None] >> np.arange(k)[None, :]) & 1).astype(np.float64)
    vals = pats @ w
    cnt = pats.sum(axis=1)
    pr = p**cnt * (1 - p) ** (k - cnt)
    small = pr < _NEGLIGIBLE
    vals = np.where(small, 0.0, vals)
    uniq, inv = np.unique(np.round(vals, 15), return_inverse=True)
    probs = np.bincount(inv.ravel(), weights=pr, minlength=uniq.size)
    keep = probs > 0
    return uniq[keep], probs[keep] / probs[keep].sum()


def row_loss_pmfs(support: np.ndarray, probs: np.ndarray, sigma: float, grid: float,
                  y_range: float = 12.0) -> tuple[tuple[int, np.ndarray], tuple[int, np.ndarray]]:
    """Privacy-loss PMFs of one row pair Q = sum_k probs_k N(support_k, sigma^2) vs P = N(0, sigma^2),
    every loss rounded DOWN to the grid: (offset, masses) for the remove direction (loss
    l(y) = log dQ/dP(y), y ~ Q) and for the add direction (loss -l(y), y ~ P).

    l is increasing in y (support >= 0). y is cut into bins fine enough that l moves by at most one
    grid step in a bin; each bin's exact mass (normal CDFs) goes to the grid point at or below the
    smallest loss in the bin. Mass beyond ``y_range`` standard deviations is dropped. Every
    operation moves loss down or drops mass, so each direction's hockey-stick curve computed from
    these PMFs is at most the exact one.
    """
    from scipy.stats import norm

    s = np.asarray(support, dtype=np.float64)
    pr = np.asarray(probs, dtype=np.float64)
    smax = float(s.max())
    lo, hi = -y_range * sigma, smax + y_range * sigma
    step = grid * sigma * sigma / max(smax, 1e-300)
    ny = math.ceil((hi - lo) / step) + 1
    y = np.linspace(lo, hi, ny)
    logpi = np.log(pr)
    loss = special.logsumexp(logpi[None, :] + (np.outer(y, s) - 0.5 * s * s) / (sigma * sigma), axis=1)
    loss = np.maximum.accumulate(loss)  # l is increasing; guard against round-off wiggles
    # remove direction: y ~ Q, bin [y_i, y_i+1] -> floor(l(y_i) / grid)
    cdf_q = (pr[None, :] * norm.cdf((y[:, None] - s[None, :]) / sigma)).sum(axis=1)
    mass_q = np.maximum(np.diff(cdf_q), 0.0)
    idx_q = np.floor(loss[:-1] / grid).astype(np.int64)
    # add direction: y ~ P, loss -l decreasing: bin -> floor(-l(y_i+1) / grid)
    cdf_p = norm.cdf(y / sigma)
    mass_p = np.maximum(np.diff(cdf_p), 0.0)
    idx_p = np.floor(-loss[1:] / grid).astype(np.int64)

    def pack(idx: np.ndarray, mass: np.ndarray) -> tuple[int, np.ndarray]:
        off = int(idx.min())
        return off, np.bincount(idx - off, weights=mass)

    return pack(idx_q, mass_q), pack(idx_p, mass_p)


#: Unit round-off and the constant of the FFT convolution error bound
#: ||fl(a * b) - a * b||_2 <= FFT_C u log2(N) ||a||_2 ||b||_2 (Cooley-Tukey; generous constant).
_U = 2.0**-53
_FFT_C = 10.0
#: Masses below this are dropped from the ends of every PMF (dropping mass lowers the curve).
_TRIM = 1e-18

PMF = tuple  # (offset: int, masses: np.ndarray, l2 error bound: float)


def _trim(off: int, m: np.ndarray, err: float) -> PMF:
    """Drop leading and trailing masses below ``_TRIM`` (only ever lowers the hockey-stick curve)."""
    nz = np.flatnonzero(m > _TRIM)
    if nz.size == 0:
        return off, np.zeros(1), err
    return off + int(nz[0]), np.ascontiguousarray(m[nz[0]:nz[-1] + 1]), err


def _convolve(a: PMF, b: PMF) -> PMF:
    """FFT convolution of two PMFs, negative round-off clipped to 0 (towards the truth), with the
    l2 error bound err_a ||b||_1 + err_b ||a||_1 + C u log2(N) ||a||_2 ||b||_2 (||.||_1 <= 1)."""
    length = a[1].size + b[1].size - 1
    nfft = 1 << max(1, (length - 1).bit_length())
    out = np.fft.irfft(np.fft.rfft(a[1], nfft) * np.fft.rfft(b[1], nfft), nfft)[:length]
    err = a[2] + b[2] + _FFT_C * _U * math.log2(nfft) * float(np.linalg.norm(a[1]) * np.linalg.norm(b[1]))
    return _trim(a[0] + b[0], np.maximum(out, 0.0), err)


def _power(pmf: PMF, count: int) -> PMF:
    """count-fold self-convolution by binary powering."""
    result: PMF | None = None
    base = pmf
    k = int(count)
    while k:
        if k & 1:
            result = base if result is None else _convolve(result, base)
        k >>= 1
        if k:
            base = _convolve(base, base)
    assert result is not None
    return result


def _hockey(pmf: PMF, grid: float, eps: float) -> float:
    """sum_i m_i (1 - e^(eps - L_i))_+ minus the round-off allowance err_l2 ||f||_2 (a lower
    estimate of the curve of the PMF without round-off)."""
    off, m, err = pmf
    start = max(0, math.floor(eps / grid) - off)
    losses = (off + np.arange(start, m.size)) * grid
    f = np.maximum(-np.expm1(eps - losses), 0.0)
    return float(np.dot(m[start:], f)) - err * float(np.linalg.norm(f))


def disjoint_rows_lower_bound(
    strategy: np.ndarray | PreparedStrategy,
    *,
    sigma: float,
    sampling: float,
    delta: float = DEFAULT_DELTA,
    grid: float = 1e-4,
    max_band: int = MAX_BAND,
    offsets: Sequence[int] | None = None,
) -> DisjointRowsLowerBound:
    """Certified lower bound on the true epsilon of the banded Poisson pair (module docstring,
    step 3); the best over the first-row offsets tried (default: 0 and (n - 1) mod b, the one
    that keeps the last row).

    Formal guarantees: the kept rows are a post-processing of the output; for offsets fixed in
    advance each value is a lower bound, hence so is their maximum. Each row's privacy loss is
    rounded DOWN to ``grid`` and mass is only ever dropped (:func:`row_loss_pmfs`), so the composed
    hockey-stick curves are below the exact ones (minus a floating-point allowance for the FFTs);
    the eps returned is the lower end of the bisection, where the lowered curve is still above
    delta.
    """
    sigma = check_sigma(sigma)
    p = check_sampling(sampling)
    delta = check_delta(delta)
    prep, b = _banded_strategy(strategy, max_band=max_band, what="the disjoint-rows lower bound")
    c = prep.strategy
    sig = sigma / prep.sensitivity
    n = prep.n
    best: DisjointRowsLowerBound | None = None
    for r0 in (sorted({0, (n - 1) % b}) if offsets is None else offsets):
        rows = list(range(int(r0), n, b))
        groups: dict[bytes, list] = {}
        for r in rows:
            sup, pr = row_law(c[r, max(0, r - b + 1):r + 1], p)
            key = sup.tobytes() + pr.tobytes()
            if key in groups:
                groups[key][2] += 1
            else:
                groups[key] = [sup, pr, 1]
        total: list = [None, None]
        for sup, pr, count in groups.values():
            if sup.max() <= 0:
                continue  # the example never reaches this row: no information
            for d, (off, m) in enumerate(row_loss_pmfs(sup, pr, sig, grid)):
                comp = _power(_trim(off, m, 0.0), int(count))
                total[d] = comp if total[d] is None else _convolve(total[d], comp)
        if total[0] is None:
            eps = 0.0
        else:
            remove_pmf, add_pmf = total

            def worst(e: float, remove_pmf: PMF = remove_pmf, add_pmf: PMF = add_pmf) -> float:
                return max(_hockey(remove_pmf, grid, e), _hockey(add_pmf, grid, e))

            eps = epsilon_bracket(worst, delta, rel_tol=1e-9, max_steps=60, eps_max=1e4)[0]
        if best is None or eps > best.epsilon:
            best = DisjointRowsLowerBound(epsilon=eps, delta=delta, band=b, offset=int(r0), rows_used=len(rows),
                                          value_discretization=grid)
    assert best is not None
    return best


__all__ = [
    "MAX_BAND",
    "DirectionEstimate",
    "DisjointRowsLowerBound",
    "EpsilonEstimate",
    "bandwidth",
    "disjoint_rows_lower_bound",
    "estimate_epsilon",
    "log_likelihood_ratio",
    "log_likelihood_ratio_brute_force",
    "row_law",
    "sample_mixture",
    "window_coefficients",
]
