"""Independent accounting oracles shared by the test modules (not a test module; nothing here
calls mfcli's accounting).

* :func:`gaussian_delta`, :func:`gaussian_epsilon`: the Gaussian mechanism's exact curve (Balle
  and Wang 2018, Thm. 8) and its inverse by scipy's brentq.
* :func:`dpsgd_epsilon`: DP-SGD (Poisson-sampled Gaussian, ``steps`` times) by dp-accounting's
  PLD accountant (or its RDP accountant, an upper bound).
* :func:`sqrt_toeplitz`, :func:`banded`, :func:`unit`: the square root of the prefix-sum matrix
  from its closed form binom(2k, k) / 4^k, its band, and a C scaled to unit column norm.
* :func:`bernoulli_sum_law`: the law of sum_j w_j B_j, B_j ~ Bernoulli(p_j), by enumeration.
* :func:`direct_power`: the k-fold self-convolution of a PMF by direct convolutions (no FFT), in
  the array's own precision (long double for the composition certificates' truths).

``delta`` defaults to 1e-6, the delta of most of the tests that share these.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import optimize, stats

DELTA = 1e-6


def gaussian_delta(eps: float, sens: float, sigma: float = 1.0) -> float:
    """delta(eps) of the Gaussian mechanism with sensitivity ``sens`` and noise ``sigma`` (mu =
    sens / sigma): Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
    mu = sens / sigma
    return float(stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu))


def gaussian_epsilon(sens: float, sigma: float = 1.0, delta: float = DELTA) -> float:
    """The eps with :func:`gaussian_delta` (eps, sens, sigma) = delta, by brentq on [0, 500]."""
    return optimize.brentq(lambda e: gaussian_delta(e, sens, sigma) - delta, 0.0, 500.0, xtol=1e-14, rtol=1e-13)


def dpsgd_epsilon(noise: float, p: float, steps: int, delta: float = DELTA, grid: float = 1e-4, *,
                  rdp: bool = False) -> float:
    """dp-accounting's epsilon of ``steps`` Poisson-sampled (rate p) Gaussian steps with noise
    multiplier ``noise``: PLD accountant at value discretisation ``grid``, or with ``rdp`` the RDP
    accountant."""
    from dp_accounting import dp_event
    from dp_accounting import rdp as rdp_lib
    from dp_accounting.pld import pld_privacy_accountant

    ev = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(noise)), steps)
    acc = rdp_lib.RdpAccountant() if rdp else pld_privacy_accountant.PLDAccountant(value_discretization_interval=grid)
    acc.compose(ev)
    return float(acc.get_epsilon(delta))


def sqrt_toeplitz(n: int) -> np.ndarray:
    """S^1/2, the lower-triangular Toeplitz square root of the prefix-sum matrix, from the closed
    form binom(2k, k) / 4^k."""
    c = np.array([math.comb(2 * k, k) / 4**k for k in range(n)])
    i = np.arange(n)
    d = i[:, None] - i[None, :]
    return np.where(d >= 0, c[np.clip(d, 0, None)], 0.0)


def banded(n: int, b: int) -> np.ndarray:
    """The first b bands of :func:`sqrt_toeplitz` (n)."""
    return np.tril(np.triu(sqrt_toeplitz(n), -(b - 1)))


def unit(c: np.ndarray) -> np.ndarray:
    """C scaled so that its largest column norm is 1."""
    return c / np.sqrt((c**2).sum(axis=0)).max()


def bernoulli_sum_law(weights: np.ndarray, probs: float | np.ndarray) -> dict:
    """Law of sum_j weights_j B_j, B_j ~ Bernoulli(probs_j) independent (``probs`` a scalar or one
    per weight), over all 2^k patterns: {value: probability}, the values ints for integer weights."""
    w = np.asarray(weights)
    q = np.broadcast_to(np.asarray(probs, dtype=np.float64), w.shape)
    law: dict = {}
    for bits in itertools.product((0, 1), repeat=w.size):
        b = np.array(bits)
        value = (w @ b).item()
        law[value] = law.get(value, 0.0) + float(np.prod(np.where(b == 1, q, 1 - q)))
    return law


def direct_power(x: np.ndarray, k: int) -> np.ndarray:
    """The k-fold self-convolution of ``x`` (k >= 1) by binary powering of direct ``np.convolve``:
    sums of non-negative products only, in ``x``'s dtype, no FFT (relative error at most
    gamma_N per level for non-negative x)."""
    result = None
    while k:
        if k & 1:
            result = x if result is None else np.convolve(result, x)
        k >>= 1
        if k:
            x = np.convolve(x, x)
    assert result is not None
    return result


def row_mixture_step_by_step(weights, probs, *, cut):
    """mmcc.row_mixture's law of sum_j w_j B_j by the textbook recursion: columns in (weight,
    probability) order, a fresh array (1 - q) pmf + q pmf shifted by w per column, the longest top
    of the law whose running sum from the top stays <= cut / columns removed (and added to eta)."""
    order = np.lexsort((probs, weights))
    weights = np.asarray(weights)[order]
    probs = np.asarray(probs)[order]
    per_step = cut / max(1, weights.size)
    pmf = np.array([1.0])
    eta = 0.0
    for w, q in zip(weights.tolist(), probs.tolist(), strict=True):
        if q <= 0:
            continue
        new = np.zeros(pmf.size + w)
        new[:pmf.size] = pmf * (1 - q)
        new[w:] += pmf * q
        rc = np.cumsum(new[::-1])
        k = int(np.searchsorted(rc, per_step, side="right"))
        if 0 < k < new.size:
            eta += float(rc[k - 1])
            new = new[:new.size - k]
        pmf = new
    support = np.flatnonzero(pmf > 0)
    pr = pmf[support]
    return support, pr / pr.sum(), eta
