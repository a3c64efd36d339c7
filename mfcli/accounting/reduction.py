"""The DP-SGD reduction: any causal C is at least as private as DP-SGD with noise multiplier
sigma / ||C||_2 under the same batch sampler (docs/accounting.md, "The DP-SGD reduction bound").

Statement. Let C be n x n lower-triangular (any signs), the release C G + Z with Z ~ N(0, sigma^2 I)
per coordinate, G's row t the sum of the clipped (norm <= 1) contributions of the examples in
step t's batch, the batches drawn by a sampler that does not look at the data, each step's
contributions chosen from the outputs before it. Then, for every sigma' <= sigma / ||C||_2 (the
spectral norm), the release is a post-processing of DP-SGD with noise multiplier sigma' under the
same sampler, so every (epsilon, delta) guarantee of that DP-SGD holds for it, for the same
neighbouring relation. The proof is in the docs; this module computes:

* :func:`spectral_norm_bound`: a certified UPPER bound on ||C||_2 (an a-posteriori eigenvalue
  certificate with floating-point error bounds, a Toeplitz symbol bound, sqrt(||C||_1 ||C||_inf);
  the smallest that applies), never the power-iteration or SVD estimate itself, which can be
  below the truth;
* :func:`reduction`: the guarantee under one batch sampler, from the sampler's own DP-SGD
  accountant at sigma / (that upper bound): Poisson (PLD proven under round-off), cyclic Poisson
  (ceil(n / b) Poisson steps), balls-in-bins (:func:`mfcli.accounting.balls_in_bins.dpsgd_balls_in_bins`)
  and one shuffled epoch (:func:`mfcli.accounting.shuffling.shuffled_dpsgd`);
* :func:`per_step_reduction` (Poisson sampling): the generalisation to per-step noise multipliers
  d_t with ||C diag(d)||_2 <= sigma (certified), DP-SGD whose step t has multiplier d_t; the
  reduction row reports the smaller of the two (``ReductionResult.variant``).

What it cannot do: at equal epsilon its noise is DP-SGD's noise times ||C||_2 after the
factorization, so it never makes a mechanism more accurate than DP-SGD at the same epsilon; it is
a tight report for a mechanism already chosen, not a reason to choose one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from mfcli.accounting.defaults import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.accounting.events import poisson_gaussian_event
from mfcli.accounting.single_pass import check_delta, check_discretization, check_sampling, check_sigma
from mfcli.errors import MfcliError
from mfcli.util.blas import blas_threads

#: Unit roundoff of IEEE double precision.
UNIT_ROUNDOFF = 2.0**-53
#: Largest dimension for which the eigenvalue certificate runs on one BLAS thread.
ONE_THREAD_MAX_N = 1024
#: Largest dimension for which the eigenvalue certificate runs (cost: one eigh and four n x n products).
CERTIFICATE_MAX_N = 2048
#: Grid points per unit of bandwidth (at least 2^16 in all) when bounding a Toeplitz symbol's
#: maximum on the circle.
SYMBOL_GRID = 64
#: A lower-triangular Toeplitz C larger than this uses its symbol bound without the certificate.
TOEPLITZ_CERTIFY_N = 512
#: The batch samplers the reduction accounts.
REDUCTION_SAMPLERS = ("poisson", "cyclic", "balls-in-bins", "shuffle")


def _gamma(k: int) -> float:
    """gamma_k = k u / (1 - k u): the relative error bound of a k-term dot product (Higham, Thm. 3.5),
    valid for any summation order, fused multiply-add or not."""
    ku = k * UNIT_ROUNDOFF
    if ku >= 0.5:
        raise MfcliError(f"a dimension of {k} is too large for the spectral-norm certificate")
    return ku / (1.0 - ku)


def _up(x: float, k: int = 4) -> float:
    """x moved up by k ulps plus a relative 4 k u: covers the rounding of the few scalar operations
    that computed it from sums of non-negative terms (each relative error <= (terms) u, see callers)."""
    y = float(x) * (1.0 + 4 * k * UNIT_ROUNDOFF)
    for _ in range(k):
        y = math.nextafter(y, math.inf)
    return y


@dataclass(frozen=True)
class SpectralNorm:
    """A certified upper bound on ||C||_2 and how it was obtained.

    Attributes:
        upper: the certified upper bound (what the reduction uses).
        estimate: the largest singular value as computed (an estimate, may be below the truth by
            rounding; shown for comparison, never used for a guarantee).
        method: which certificate gave ``upper``.
        candidates: every certified bound computed, by method.
    """

    upper: float
    estimate: float
    method: str
    candidates: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"upper": self.upper, "estimate": self.estimate, "method": self.method,
                "candidates": dict(self.candidates)}


def norm_product_bound(c: np.ndarray) -> float:
    """sqrt(||C||_1 ||C||_inf) >= ||C||_2 (Hoelder), rounded up: the max column and row sums of |C|
    are sums of non-negative terms (relative error <= gamma_{n})."""
    a = np.abs(np.asarray(c, dtype=np.float64))
    m, n = a.shape
    one = float(a.sum(axis=0).max()) * (1.0 + _gamma(m))
    inf = float(a.sum(axis=1).max()) * (1.0 + _gamma(n))
    return _up(math.sqrt(_up(one * inf)))


def toeplitz_coefficients(c: np.ndarray) -> np.ndarray | None:
    """The first column of C when C is square lower-triangular Toeplitz (every diagonal constant,
    exactly), trailing zeros dropped; None otherwise."""
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or c.size == 0:
        return None
    n = c.shape[0]
    if np.any(np.triu(c, 1) != 0):
        return None
    col = c[:, 0]
    nz = np.flatnonzero(col)
    b = int(nz[-1]) + 1 if nz.size else 1
    for k in range(n):  # diagonal by diagonal: no n x n copy
        if np.any(np.diagonal(c, -k) != col[k]):
            return None
    return col[:b].copy()


def toeplitz_symbol_bound(coefficients: np.ndarray | list[float]) -> float:
    """A certified upper bound on sup over |z| = 1 of |c(z)|, c(z) = sum_k c_k z^k: the norm of
    the infinite lower-triangular Toeplitz operator with first column c on l2, hence of every
    finite section C_n (a compression of it), whatever n.

    The maximum over a grid of M >= 2^16 points (by FFT) plus (pi / M) sum_k k |c_k| (|c(e^iw)| is
    Lipschitz in w with that constant, and every w is within pi / M of a grid point); the grid
    values are raised by a bound on the FFT's floating-point error, and the result is never above
    sum |c_k| (the triangle inequality, also certified)."""
    c = np.asarray(coefficients, dtype=np.float64).ravel()
    if c.size == 0 or not np.all(np.isfinite(c)):
        raise MfcliError("the Toeplitz coefficients must be a non-empty finite vector")
    b = c.size
    total = _up(float(np.abs(c).sum()) * (1.0 + _gamma(b)))
    if b == 1:
        return _up(abs(float(c[0])))
    m = 1 << max(16, (SYMBOL_GRID * b - 1).bit_length())
    vals = np.abs(np.fft.fft(c, m))  # c(e^{-iw}) at w = 2 pi k / m; |c| is the same on the conjugate point
    lip = float(np.sum(np.arange(b) * np.abs(c)))
    # the FFT's error is below a few u log2(m) sum |c_k| (a radix-2 bound); 64 u log2(m) covers it
    err = 64.0 * math.log2(m) * UNIT_ROUNDOFF * float(np.abs(c).sum())
    grid = _up(float(vals.max()) + err + math.pi / m * lip * (1.0 + 1e-12))
    return min(total, grid)


def _certified_eig_bound(c: np.ndarray) -> tuple[float, float]:
    """(certified upper bound, estimate) of ||C||_2 from an eigen-decomposition of the Gram matrix.

    A = C^T C (or C C^T, the smaller). With A^ = fl(A) symmetrised, |A^ - A| <= gamma_k |C|^T |C|
    entrywise (k the inner dimension), so lambda_max(A) <= lambda_max(A^) + ||E||_inf with
    ||E||_inf <= gamma_k max_i (|C|^T (|C| 1))_i + (rounding of the symmetrisation).
    For any Q (the computed eigenvectors), S = Q^T A^ Q is congruent to A^; by Ostrowski's theorem
    lambda_max(A^) <= lambda_max(S) / lambda_min(Q^T Q) when lambda_max(A^) > 0. Both are bounded
    by Gershgorin discs of the computed products, widened by their floating-point error
    (gamma_{2n} |Q|^T |A^| |Q| and gamma_n |Q|^T |Q|, row sums by matrix-vector products).
    Nothing here trusts the eigen-solver: a poor Q only gives a looser (still valid) bound.
    """
    c = np.asarray(c, dtype=np.float64)
    m, n = c.shape
    g = c.T if m < n else c  # A = g^T g has the smaller dimension
    k, d = g.shape  # inner dimension k, A is d x d
    a = g.T @ g
    a = 0.5 * (a + a.T)
    ab = np.abs(g)
    e_rows = ab.T @ (ab @ np.ones(d))
    e_a = _gamma(k + 2) * float(e_rows.max()) * (1.0 + _gamma(2 * k + 2))
    w, q = np.linalg.eigh(a)
    estimate = math.sqrt(max(float(w[-1]), 0.0))
    s = q.T @ (a @ q)
    aq = np.abs(q)
    f_rows = _gamma(2 * d + 2) * (aq.T @ (np.abs(a) @ (aq @ np.ones(d)))) * (1.0 + _gamma(3 * d + 3))
    diag = np.diag(s).copy()
    off = np.abs(s).sum(axis=1) - np.abs(diag)
    off = off * (1.0 + _gamma(d + 1))
    lam_s = float(np.max(diag + off + f_rows)) * (1.0 + 4 * UNIT_ROUNDOFF)
    qq = q.T @ q
    qdiag = np.diag(qq).copy()
    qoff = (np.abs(qq).sum(axis=1) - np.abs(qdiag)) * (1.0 + _gamma(d + 1))
    qerr = _gamma(d + 2) * (aq.T @ (aq @ np.ones(d))) * (1.0 + _gamma(2 * d + 2))
    lam_q = float(np.min(qdiag - qoff - qerr)) * (1.0 - 4 * UNIT_ROUNDOFF)
    if not lam_q > 0.5:
        return math.inf, estimate
    lam = max(lam_s, 0.0) / lam_q
    return _up(math.sqrt(_up(lam + e_a))), estimate


def spectral_norm_bound(c: np.ndarray, *, certificate_max_n: int = CERTIFICATE_MAX_N) -> SpectralNorm:
    """A certified upper bound on the spectral norm ||C||_2 (the largest singular value).

    Candidates (each a proven upper bound, the smallest is used): the eigenvalue certificate of
    :func:`_certified_eig_bound` (when the smaller dimension is at most ``certificate_max_n``, and for
    a Toeplitz C only up to :data:`TOEPLITZ_CERTIFY_N`); the
    symbol bound of :func:`toeplitz_symbol_bound` when C is lower-triangular Toeplitz; and
    sqrt(||C||_1 ||C||_inf), which always applies.

    Raises:
        MfcliError: C is not a finite non-zero 2-D matrix.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.size == 0 or not np.all(np.isfinite(c)):
        raise MfcliError("the spectral norm needs a finite, non-empty 2-D matrix C")
    if not np.any(c):
        raise MfcliError("the strategy is all zeros")
    cands: dict[str, float] = {"sqrt(||C||_1 ||C||_inf)": norm_product_bound(c)}
    tz = toeplitz_coefficients(c)
    if tz is not None:
        cands["Toeplitz symbol sup |c(e^iw)|"] = toeplitz_symbol_bound(tz)
    estimate = math.nan
    # A banded Toeplitz C's finite sections approach the symbol's sup from below (within O(1/n^2) for
    # a smooth symbol: 1.4e-6 relative for the 4-banded n = 2048): the eigenvalue certificate, an
    # n x n eigen-decomposition (14 s at n = 2048 on one core), is skipped above TOEPLITZ_CERTIFY_N.
    if min(c.shape) <= certificate_max_n and (tz is None or c.shape[0] <= TOEPLITZ_CERTIFY_N):
        # one BLAS thread up to ONE_THREAD_MAX_N: the certificate's eigh and products are small there,
        # a second thread only spins (up to seconds of CPU under load), and the bound's last bits then
        # do not depend on the machine's thread count (it is certified either way)
        with blas_threads(1 if min(c.shape) <= ONE_THREAD_MAX_N else None, scipy_blas=False):  # numpy.linalg.eigh
            upper, estimate = _certified_eig_bound(c)
        if math.isfinite(upper):
            cands["eigenvalue certificate (Gershgorin on Q^T C^T C Q, Ostrowski)"] = upper
    method = min(cands, key=lambda k: cands[k])
    return SpectralNorm(upper=cands[method], estimate=estimate, method=method, candidates=cands)


#: Candidate shapes of the per-step multipliers: d_t proportional to ||C e_t||^-a for these a
#: (a = 0 is the scalar bound itself, computed separately).
PER_STEP_EXPONENTS = (1.0, 0.5)
#: Levels of the geometric grid the per-step multipliers are rounded DOWN to (the composition is
#: this many self-composed groups at most).
PER_STEP_LEVELS = 8
#: Samplers with a per-step (heterogeneous) DP-SGD accountant: Poisson only. The cyclic, balls-in-bins
#: and shuffled DP-SGD bounds used here are for one noise multiplier in every step.
PER_STEP_SAMPLERS = ("poisson",)
#: Column norms equal within this relative tolerance: every candidate shape is the scalar one, skip.
PER_STEP_EQUAL_RTOL = 1e-9
#: Largest number of columns for the per-step variant: C diag(w) is not Toeplitz, so its certified
#: norm needs the eigenvalue certificate (an n x n eigen-decomposition).
PER_STEP_MAX_N = 1024


@dataclass(frozen=True)
class PerStepResult:
    """The per-step DP-SGD reduction under Poisson sampling (docs/accounting.md, "Per-step noise").

    Attributes:
        epsilon: epsilon of the n Poisson-sampled Gaussians with noise multipliers ``multipliers``
            composed (PLD, pessimistic, proven under round-off).
        multipliers: d_t for every step t (column of C), already rounded down to the grid; ``inf``
            for a zero column (its step is never released).
        shape_exponent: the candidate shape used, d_t proportional to ||C e_t||^-a.
        spectral: the certified bound on ||C diag(w)||_2 that scaled the shape.
        groups: (multiplier, number of steps) of the composition.
    """

    epsilon: float
    multipliers: np.ndarray
    shape_exponent: float
    spectral: SpectralNorm
    groups: tuple[tuple[float, int], ...]
    sampling: float

    def dp_event(self):
        from dp_accounting import dp_event

        return dp_event.ComposedDpEvent([poisson_gaussian_event(self.sampling, m, k) for m, k in self.groups])

    def as_dict(self) -> dict:
        return {"epsilon": self.epsilon, "shape": f"d_t proportional to ||C e_t||^-{self.shape_exponent:g}",
                "spectral_norm_of_C_diag_w": self.spectral.as_dict(),
                "groups": [{"noise_multiplier": m, "steps": k} for m, k in self.groups],
                "min_multiplier": min(m for m, _ in self.groups) if self.groups else math.inf}


def quantise_down(d: np.ndarray, levels: int = PER_STEP_LEVELS) -> np.ndarray:
    """Every finite d_t rounded DOWN to a geometric grid of ``levels`` points from min(d) to max(d)
    (both on it); infinite entries stay infinite. A smaller d_t keeps C D C^T <= sigma^2 I."""
    d = np.asarray(d, dtype=np.float64)
    out = d.copy()
    fin = np.isfinite(d)
    if not np.any(fin):
        return out
    lo, hi = float(d[fin].min()), float(d[fin].max())
    if levels < 2 or hi <= lo:
        out[fin] = lo
        return out
    grid = lo * (hi / lo) ** (np.arange(levels) / (levels - 1))
    grid[0], grid[-1] = lo, hi
    idx = np.searchsorted(grid, d[fin], side="right") - 1
    q = grid[np.clip(idx, 0, levels - 1)]
    out[fin] = np.minimum(q, d[fin])  # never above d_t, whatever the rounding of the grid
    return out


def poisson_heterogeneous_epsilon(groups: list[tuple[float, int]] | tuple[tuple[float, int], ...], *,
                                  sampling: float, delta: float,
                                  value_discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """epsilon of Poisson-sampled Gaussians (rate ``sampling``) with noise multiplier m composed k
    times for every (m, k) in ``groups``, proven under floating point
    (:func:`mfcli.accounting.single_pass.certified_poisson_epsilon`: leaves lifted for round-off,
    the composition's FFT round-off certified): an upper bound for add or remove one example."""
    from mfcli.accounting.single_pass import certified_poisson_epsilon

    return certified_poisson_epsilon(groups, sampling=sampling, delta=delta, value_discretization=value_discretization)


def per_step_reduction(c: np.ndarray, *, sigma: float, sampling: float, delta: float = DEFAULT_DELTA,
                       value_discretization: float = DEFAULT_DISCRETIZATION,
                       exponents: tuple[float, ...] = PER_STEP_EXPONENTS,
                       levels: int = PER_STEP_LEVELS, spectral: SpectralNorm | None = None) -> PerStepResult | None:
    """The per-step reduction under Poisson sampling: for d with ||C diag(d)||_2 <= sigma (certified),
    the release is a post-processing of DP-SGD whose step t has noise multiplier d_t
    (docs/accounting.md, "Per-step noise multipliers"); epsilon of those n Poisson-sampled Gaussians.

    The shapes tried: d_t proportional to ||C e_t||^-a for a in ``exponents``, each scaled to
    sigma / (certified bound on ||C diag(w)||_2) and rounded down to a geometric grid of ``levels``
    points; the smallest epsilon is returned. None when it cannot differ from the scalar bound
    (every column norm equal within :data:`PER_STEP_EQUAL_RTOL`: every shape is the constant one)
    or when C has more than :data:`PER_STEP_MAX_N` columns (cost), and when no shape's RDP epsilon
    (a cheap screen) is below the scalar multiplier's. ``spectral``: the certified ||C||_2, if known.
    """
    c = np.asarray(c, dtype=np.float64)
    n = c.shape[1]
    if n > PER_STEP_MAX_N:
        return None
    norms = np.sqrt(np.einsum("ij,ij->j", c, c))
    pos = norms > 0
    if not np.any(pos):
        return None
    nz = norms[pos]
    if float(nz.max() - nz.min()) <= PER_STEP_EQUAL_RTOL * float(nz.max()) and bool(np.all(pos)):
        return None
    # Screen: the RDP epsilon (cheap, orders composed additively) of every shape and of the scalar
    # multiplier; the PLD (as costly as the scalar bound per group) runs only for the best shape, and
    # only when its RDP epsilon is below the scalar's. Skipping is always safe: the scalar bound holds.
    scalar_sn = spectral if spectral is not None else spectral_norm_bound(c)
    scalar_rdp = _rdp_epsilon(((sigma / scalar_sn.upper, n),), sampling, delta)
    cands = []
    for a in exponents:
        w = np.zeros(n)
        w[pos] = (nz.max() / nz) ** a  # >= 1; zero columns: C diag(w) drops them
        sn = spectral_norm_bound(c * w[None, :])
        scale = sigma / sn.upper
        d = np.full(n, math.inf)
        d[pos] = quantise_down(scale * w[pos], levels)
        vals, counts = np.unique(d[pos], return_counts=True)
        groups = tuple((float(m), int(k)) for m, k in zip(vals, counts, strict=True))
        cands.append((_rdp_epsilon(groups, sampling, delta), float(a), d, sn, groups))
    rdp, a_best, d, sn, groups = min(cands, key=lambda t: t[0])
    if not rdp < scalar_rdp:
        return None
    eps = poisson_heterogeneous_epsilon(groups, sampling=sampling, delta=delta,
                                        value_discretization=value_discretization)
    return PerStepResult(epsilon=eps, multipliers=d, shape_exponent=a_best, spectral=sn, groups=groups,
                         sampling=sampling)


#: The RDP orders of the per-step screen: integers, where the sampled Gaussian's RDP has a closed
#: form (the fractional orders' series can fail to converge at small multipliers).
_RDP_ORDERS = tuple(float(a) for a in range(2, 257))


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    """log A_alpha of the Poisson-sampled Gaussian at an integer order (0 < q < 1): the log of
    sum_i C(alpha, i) q^i (1 - q)^(alpha - i) e^((i^2 - i) / (2 sigma^2)), as dp-accounting's
    ``rdp_privacy_accountant._compute_log_a_int`` forms it: each term's log from ``gammaln`` (on
    an array: scipy's special functions evaluate every element by the same scalar kernel) and the
    same products and sums, then the terms log-added in turn with ``math.log1p``/``math.exp``."""
    i = np.arange(alpha + 1)
    log_comb = special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(alpha - i + 1)
    s = log_comb + i * math.log(q) + (alpha - i) * math.log1p(-q) + (i * i - i) / (2 * (sigma ** 2))
    log_a = -math.inf
    for v in s.tolist():
        a, b = min(log_a, v), max(log_a, v)
        log_a = b if a == -math.inf else math.log1p(math.exp(a - b)) + b
    return log_a


def _poisson_gaussian_rdp(q: float, noise_multiplier: float) -> np.ndarray:
    """The RDP of one Poisson-sampled Gaussian at every order of :data:`_RDP_ORDERS`
    (dp-accounting's ``_compute_rdp_poisson_subsampled_gaussian``)."""
    def one(alpha: float) -> float:
        if q == 0:
            return 0
        if noise_multiplier == 0:
            return math.inf
        if q == 1.0:
            return alpha / (2 * noise_multiplier ** 2)
        return _log_a_int(q, noise_multiplier, int(alpha)) / (alpha - 1)

    return np.array([one(a) for a in np.array(_RDP_ORDERS)])


def _rdp_epsilon(groups: tuple[tuple[float, int], ...], sampling: float, delta: float) -> float:
    """The RDP epsilon of the groups' Poisson-sampled Gaussians composed, as dp-accounting's
    ``RdpAccountant`` at the orders :data:`_RDP_ORDERS` computes it (the RDPs summed per order,
    then its ``compute_epsilon``: the conversion of Canonne, Kamath and Steinke, the smallest over
    the orders), without importing dp-accounting; tests/test_accounting_reduction_rdp.py holds the
    two equal bit for bit. Only a screen (which candidate to account by PLD), never reported."""
    orders = np.array(_RDP_ORDERS)
    rdp = np.zeros_like(orders, dtype=np.float64)
    for m, k in groups:
        rdp += int(k) * _poisson_gaussian_rdp(sampling, float(m))
    eps = []
    for a, r in zip(orders, rdp, strict=True):
        if r < 0:  # round-off of an extreme event: dp-accounting's answer, epsilon 0
            epsilon = 0.0
        elif delta ** 2 + math.expm1(-r) > 0:  # the KL bound already gives delta
            epsilon = 0
        elif a > 1.01:
            epsilon = r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
        else:
            epsilon = math.inf
        eps.append(epsilon)
    return float(max(0, eps[int(np.argmin(eps))]))


@dataclass(frozen=True)
class ReductionResult:
    """The DP-SGD reduction bound under one batch sampler.

    Attributes:
        epsilon: the guarantee: the smaller of ``scalar_epsilon`` (DP-SGD's epsilon under ``sampler`` at
            noise multiplier ``noise_multiplier`` = sigma / ``spectral.upper``) and the per-step
            variant's epsilon (``per_step``, Poisson only); ``variant`` names which.
        sampler: the batch sampler (poisson, cyclic, balls-in-bins, shuffle).
        sigma: the noise standard deviation on C G as given.
        spectral: the certified bound on ||C||_2.
        dpsgd: the DP-SGD result at the reduced noise multiplier (its ``as_dict`` is in the JSON).
        neighbouring: the relation the DP-SGD accountant's guarantee holds for.
        delta: delta.
    """

    epsilon: float
    sampler: str
    sigma: float
    spectral: SpectralNorm
    dpsgd: Any
    neighbouring: str
    delta: float
    steps: int
    per_step: PerStepResult | None = None

    @property
    def scalar_epsilon(self) -> float:
        return float(self.dpsgd.epsilon)

    @property
    def variant(self) -> str:
        """``per-step`` when the per-step multipliers certify less than the scalar bound, else ``scalar``."""
        return "per-step" if self.per_step is not None and self.per_step.epsilon < self.scalar_epsilon else "scalar"

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.spectral.upper

    def dp_event(self):
        """The reduced DP-SGD's dp-accounting event (of the variant that attains ``epsilon``), where its
        accountant has one."""
        if self.variant == "per-step":
            assert self.per_step is not None
            return self.per_step.dp_event()
        ev = getattr(self.dpsgd, "dp_event", None)
        return ev() if callable(ev) else None

    def as_dict(self) -> dict:
        from mfcli.accounting.events import event_to_json, plain_composed, plain_json, plain_poisson_gaussian

        inner = self.dpsgd.as_dict()
        inner_event = inner.pop("dp_event", None)
        d = {
            "setting": "dp-sgd-reduction",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "sigma": self.sigma,
            "sampler": self.sampler,
            "spectral_norm": self.spectral.as_dict(),
            "noise_multiplier": self.noise_multiplier,
            "steps": self.steps,
            "reduced_dpsgd": inner,
            "method": "post-processing of DP-SGD with noise multiplier sigma / ||C||_2 under the same batch sampler "
                      "(draw E ~ N(0, sigma^2 I - sigma'^2 C C^T), output C V + E; docs/accounting.md, 'The DP-SGD "
                      "reduction bound'); ||C||_2 a certified upper bound (" + self.spectral.method + ")",
            "assumptions": _ASSUMPTIONS[self.sampler],
            "variant": self.variant,
            "scalar_epsilon": self.scalar_epsilon,
        }
        if self.per_step is not None:
            d["per_step"] = self.per_step.as_dict()
        if self.variant == "per-step":
            d["method"] += ("; per-step variant: DP-SGD whose step t has noise multiplier d_t, ||C diag(d)||_2 <= "
                            "sigma certified, d_t rounded down to a geometric grid, the Poisson-sampled Gaussians "
                            "composed by PLD with round-off certified (docs/accounting.md, 'Per-step noise multipliers')")
        # event_to_json(self.dp_event()), built without importing dp-accounting where the event is
        # the reduced DP-SGD's (its own as_dict has it) or the per-step groups' Poisson Gaussians
        if self.variant == "per-step":
            assert self.per_step is not None
            d["dp_event"] = plain_json(plain_composed(
                [plain_poisson_gaussian(self.per_step.sampling, m, k) for m, k in self.per_step.groups]))
        elif inner_event is not None:
            d["dp_event"] = inner_event
        else:
            ev = self.dp_event()
            if ev is not None:
                d["dp_event"] = event_to_json(ev)
        return d


_ASSUMPTIONS = {
    "poisson": "C causal (lower-triangular in release order, any signs); Poisson sampling with rate p in "
               "every step; gradients clipped to norm 1, chosen adaptively from earlier outputs; add or remove one "
               "example",
    "cyclic": "C causal (lower-triangular, any signs, any number of bands); examples in b groups, group i mod b "
              "Poisson-sampled at step i; adaptive gradients; add or remove one example",
    "balls-in-bins": "C causal (lower-triangular, any signs); balls-in-bins: every example in exactly one uniformly "
                     "random step of the epoch; an example's contribution is the same vector whichever step it lands "
                     "in, fixed in advance (non-adaptive, as the balls-in-bins DP-SGD bound assumes); add or remove "
                     "one example",
    "shuffle": "C causal (lower-triangular, any signs); one epoch of n steps of batch size 1 in a uniformly random "
               "order (n examples); adaptive gradients; replace-one neighbours (covers zeroing an example out)",
}


def reduced_epsilon(*, sampler: str, noise_multiplier: float, n: int, sampling: float | None, delta: float,
                    schema: Any = None, epochs: int = 1, value_discretization: float = DEFAULT_DISCRETIZATION,
                    on_progress: Any = None) -> Any:
    """DP-SGD under ``sampler`` at ``noise_multiplier`` over ``n`` steps in all: the result object of
    that sampler's accountant. It is the reduction's epsilon for every C with
    sigma / ||C||_2 >= ``noise_multiplier`` (its ``epsilon`` is non-increasing in the multiplier).

    ``epochs`` (balls-in-bins only): the n steps are ``epochs`` epochs of n / epochs steps, each
    example allocated to one uniformly random step of every epoch, independently
    (:func:`mfcli.accounting.balls_in_bins.dpsgd_balls_in_bins` with ``epochs``, the epochs
    composed). Poisson and cyclic Poisson sample every step afresh, so only n matters to them; the
    shuffled bound is for one epoch.

    Raises:
        MfcliError: an unknown sampler, a missing rate or schema (cyclic), ``epochs`` not a positive
            integer dividing n, or several epochs under the shuffle sampler.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1 or n % epochs:
        raise MfcliError(f"the number of epochs must be a positive integer dividing the {n} steps, got {epochs!r}")
    if sampler == "poisson":
        from mfcli.accounting.single_pass import dpsgd

        if sampling is None:
            raise MfcliError("the Poisson reduction needs a sampling rate")
        # the guarantee's value, proven under round-off (not the dp-sgd reference row's arithmetic)
        return dpsgd(sigma=noise_multiplier, sampling=sampling, steps=n, delta=delta,
                     value_discretization=value_discretization, certified=True)
    if sampler == "cyclic":
        from mfcli.accounting.multi import reduced_dpsgd

        if sampling is None or schema is None:
            raise MfcliError("the cyclic-Poisson reduction needs a sampling rate and a participation schema")
        # DP-SGD (C = I: one band, unit column norm) under the schema's cyclic Poisson sampling
        return reduced_dpsgd(bands=1, column_norm=1.0, n=n, schema=schema, sigma=noise_multiplier,
                             sampling=sampling, delta=delta, value_discretization=value_discretization)
    if sampler == "balls-in-bins":
        from mfcli.accounting.balls_in_bins import dpsgd_balls_in_bins

        return dpsgd_balls_in_bins(n=n // int(epochs), sigma=noise_multiplier, delta=delta, epochs=int(epochs),
                                   on_progress=on_progress)
    if sampler == "shuffle":
        from mfcli.accounting.shuffling import shuffled_dpsgd

        if epochs != 1:
            raise MfcliError("the shuffled DP-SGD bound is for one epoch")
        return shuffled_dpsgd(n=n, sigma=noise_multiplier, delta=delta)
    raise MfcliError(f"the DP-SGD reduction has no accountant for the batch sampler {sampler!r}; "
                     f"choose from {', '.join(REDUCTION_SAMPLERS)}")


def reduction(c: np.ndarray, *, sigma: float, sampler: str, sampling: float | None = None,
              delta: float = DEFAULT_DELTA, schema: Any = None,
              value_discretization: float = DEFAULT_DISCRETIZATION, spectral: SpectralNorm | None = None,
              release_steps: np.ndarray | None = None, epochs: int = 1, on_progress: Any = None,
              per_step: bool = True) -> ReductionResult:
    """epsilon of C G + Z (noise sigma per coordinate) under ``sampler``: DP-SGD's epsilon under the
    same sampler at noise multiplier sigma / ||C||_2 (a certified upper bound on the norm).

    Formal guarantee (docs/accounting.md, "The DP-SGD reduction bound"): for any causal C, any batch
    sampler that does not look at the data, and the neighbouring relation and gradient model of
    the sampler's DP-SGD accountant, ``epsilon`` is a valid (epsilon, delta) bound.
    ``spectral`` reuses a bound computed before (the same C). ``release_steps``: t(r) for every row
    r of C (default: row t at step t, C square); C must be causal in that order. ``epochs``: the
    balls-in-bins epochs C's columns split into (:func:`reduced_epsilon`). ``per_step`` (Poisson
    only): also try per-step noise multipliers (:func:`per_step_reduction`) and report the smaller.

    Raises:
        MfcliError: C not causal in release order, or a parameter out of range.
    """
    from mfcli.accounting.mmcc import check_causal

    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.size == 0:
        raise MfcliError("the DP-SGD reduction needs a 2-D matrix C")
    if release_steps is None:
        if c.shape[0] != c.shape[1]:
            raise MfcliError("the DP-SGD reduction needs the release step of every row of a non-square C")
        release_steps = np.arange(c.shape[0])
    check_causal(c, np.asarray(release_steps), what="the DP-SGD reduction")
    sigma = check_sigma(sigma)
    delta = check_delta(delta)
    value_discretization = check_discretization(value_discretization)
    if sampling is not None:
        sampling = check_sampling(sampling)
    sn = spectral if spectral is not None else spectral_norm_bound(c)
    n = c.shape[1]
    nm = sigma / sn.upper
    res = reduced_epsilon(sampler=sampler, noise_multiplier=nm, n=n, sampling=sampling, delta=delta, schema=schema,
                          epochs=epochs, value_discretization=value_discretization, on_progress=on_progress)
    neighbouring = "replace-one" if sampler == "shuffle" else "add-remove"
    ps = None
    if per_step and sampler in PER_STEP_SAMPLERS and sampling is not None:
        ps = per_step_reduction(c, sigma=sigma, sampling=sampling, delta=delta,
                                value_discretization=value_discretization, spectral=sn)
    eps = float(res.epsilon) if ps is None else min(float(res.epsilon), ps.epsilon)
    return ReductionResult(epsilon=eps, sampler=sampler, sigma=sigma, spectral=sn, dpsgd=res,
                           neighbouring=neighbouring, delta=delta, steps=n, per_step=ps)


__all__ = [
    "CERTIFICATE_MAX_N",
    "PER_STEP_SAMPLERS",
    "REDUCTION_SAMPLERS",
    "PerStepResult",
    "ReductionResult",
    "SpectralNorm",
    "norm_product_bound",
    "per_step_reduction",
    "poisson_heterogeneous_epsilon",
    "quantise_down",
    "reduced_epsilon",
    "reduction",
    "spectral_norm_bound",
    "toeplitz_coefficients",
    "toeplitz_symbol_bound",
]
