"""DP-SGD under balls-in-bins (random allocation) at any n: the grid bracket of
:func:`mfcli.accounting.balls_in_bins.dpsgd_balls_in_bins` against an oracle that does not use its
recursion.

Oracle: both hockey-stick divergences of the pair P = (1/n) sum_i N(e_i, sigma^2 I) vs
Q = N(0, sigma^2 I) are expectations under Q of a function of R = (1/n) sum_i w_i, w_i =
exp(y_i / sigma^2 - 1 / (2 sigma^2)). Given y_1..y_{n-1}, the expectation over y_n is an option
price on the lognormal w_n in closed form (a call for the remove direction, a put for add); the
other n - 1 coordinates (n <= 3) by composite Gauss-Legendre quadrature, checked at two orders
(agreeing to 1e-6) and against the two-step closed form of tests/test_accounting_reduction.py.
Larger n: a Monte Carlo of the same closed form, with error bars.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special

from mfcli.accounting.balls_in_bins import dpsgd_balls_in_bins, dpsgd_plds
from mfcli.accounting.reduction import reduction, spectral_norm_bound
from mfcli.errors import MfcliError


def _option_terms(s: np.ndarray, n: int, sigma: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Given s = w_1 + ... + w_{n-1}, the two integrands in closed form over y_n.

    remove: E[(R - e^eps)_+] = (1/n) E[(w_n - K)_+], K = n e^eps - s;
    add: E[(1 - e^eps R)_+] = (e^eps / n) E[(K' - w_n)_+], K' = n e^-eps - s. Under Q,
    w_n > K iff y_n > t = sigma^2 log K + 1/2, and E_Q[w_n 1{y_n > t}] = P(N(1, sigma^2) > t)."""
    k = n * math.exp(eps) - s
    t = sigma**2 * np.log(np.maximum(k, 1e-300)) + 0.5
    call = np.where(k > 0, special.ndtr(-(t - 1) / sigma) - k * special.ndtr(-t / sigma), 1.0 - k)
    k = n * math.exp(-eps) - s
    t = sigma**2 * np.log(np.maximum(k, 1e-300)) + 0.5
    put = np.where(k > 0, k * special.ndtr(t / sigma) - special.ndtr((t - 1) / sigma), 0.0)
    return np.maximum(call, 0.0) / n, math.exp(eps) / n * np.maximum(put, 0.0)


def _composite_nodes(breaks: np.ndarray, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre points and weights with ``nodes`` points on every piece between consecutive
    ``breaks`` (shape (..., pieces + 1)), broadcast over the leading axes; nodes cluster at the
    ends of each piece, where the integrand turns fastest."""
    x, w = np.polynomial.legendre.leggauss(nodes)
    a, b = breaks[..., :-1, None], breaks[..., 1:, None]
    pts = 0.5 * (b - a) * x + 0.5 * (a + b)
    wts = 0.5 * (b - a) * w
    shape = (*breaks.shape[:-1], -1)
    return pts.reshape(shape), wts.reshape(shape)


def _allocation_deltas(n: int, sigma: float, eps: float, nodes: int = 200) -> tuple[float, float]:
    """(remove, add) delta(eps) of the exact pair for n <= 3: y_1..y_{n-1} by composite
    Gauss-Legendre (nested for n = 3) on [-30 sigma, 30 sigma + 1], split where the closed form
    changes regime (K = 0 or K' = 0: there the integrand turns within a small fraction of sigma)."""
    assert 1 <= n <= 3
    m = 0.5 / sigma**2
    lo, hi = -30 * sigma, 30 * sigma + 1

    def dens(y: np.ndarray) -> np.ndarray:
        return np.exp(-0.5 * (y / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))

    def breaks(s: np.ndarray) -> np.ndarray:
        """Per s: lo, the y with w(y) = n e^eps - s and n e^-eps - s (clipped into [lo, hi]; a
        regime that does not occur gives an empty piece), hi."""
        out = [np.full(s.shape, lo)]
        for v in (n * math.exp(-eps) - s, n * math.exp(eps) - s):
            k = sigma**2 * (np.log(np.maximum(v, 1e-300)) + m)
            out.append(np.clip(np.where(v > 0, k, lo), lo, hi))
        out.append(np.full(s.shape, hi))
        return np.sort(np.stack(out, axis=-1), axis=-1)

    if n == 1:
        r, a = _option_terms(np.zeros(1), 1, sigma, eps)
        return float(r[0]), float(a[0])
    y1, w1 = _composite_nodes(breaks(np.zeros(1)), nodes)  # (1, N)
    wt = w1 * dens(y1)
    s = np.exp(y1 / sigma**2 - m)
    if n == 3:  # the inner variable's pieces depend on the outer point: one row of nodes per outer node
        y2, w2 = _composite_nodes(breaks(s[0]), nodes)  # (N, N)
        wt = wt[0][:, None] * w2 * dens(y2)
        s = s[0][:, None] + np.exp(y2 / sigma**2 - m)
    r, a = _option_terms(s, n, sigma, eps)
    return float(np.sum(wt * r)), float(np.sum(wt * a))


def _monte_carlo_deltas(n: int, sigma: float, eps: float, samples: int, seed: int
                        ) -> tuple[tuple[float, float], tuple[float, float]]:
    """((remove, add), (their standard errors)) by Monte Carlo over y_1..y_{n-1}."""
    rng = np.random.default_rng(seed)
    y = rng.standard_normal((n - 1, samples)) * sigma
    r, a = _option_terms(np.exp(y / sigma**2 - 0.5 / sigma**2).sum(axis=0), n, sigma, eps)
    return (float(r.mean()), float(a.mean())), (float(r.std() / math.sqrt(samples)), float(a.std() / math.sqrt(samples)))


def _allocation_epsilon(n: int, sigma: float, delta: float) -> float:
    return optimize.brentq(lambda e: max(_allocation_deltas(n, sigma, e)) - delta, 1e-6, 30.0, xtol=1e-10)


def test_oracle_against_the_one_step_gaussian() -> None:
    from mfcli.accounting.single_pass import gaussian_delta

    r, a = _allocation_deltas(1, 1.3, 0.7)
    g = float(gaussian_delta(0.7, 1 / 1.3))
    assert r == pytest.approx(g, rel=1e-12) and a == pytest.approx(g, rel=1e-12)
    for n, sigma, eps in ((2, 1.0, 3.0), (3, 0.9, 1.2), (3, 1.0, 3.3)):
        # the quadrature's own error is below 1e-6 relative (120 and 200 points per piece agree to that)
        assert _allocation_deltas(n, sigma, eps, 120) == pytest.approx(_allocation_deltas(n, sigma, eps), rel=2e-6)


def test_oracle_against_the_two_step_closed_form() -> None:
    from test_accounting_reduction import _allocation_epsilon as two_steps

    assert _allocation_epsilon(2, 1.0, 1e-3) == pytest.approx(two_steps(1.0, 1e-3), rel=1e-7)


@pytest.mark.parametrize("n, sigma, eps", [(2, 0.9, 1.0), (3, 1.0, 0.8), (3, 0.8, 1.5), (3, 1.0, 3.3)])
def test_each_direction_brackets_the_exact_pair(n: int, sigma: float, eps: float) -> None:
    remove, add = _allocation_deltas(n, sigma, eps)
    upper, lower = dpsgd_plds(n=n, sigma=sigma, grid=1e-3)
    for pmf_name, truth in (("_pmf_remove", remove), ("_pmf_add", add)):
        hi = getattr(upper.to_dp_accounting(), pmf_name).get_delta_for_epsilon(eps)
        lo = getattr(lower.to_dp_accounting(), pmf_name).get_delta_for_epsilon(eps)
        assert lo <= truth * (1 + 1e-5) and truth <= hi * (1 + 1e-5), pmf_name
        assert hi <= 1.05 * truth, pmf_name


@pytest.mark.parametrize("n, sigma, eps, seed", [(5, 1.2, 0.5, 1), (6, 1.5, 0.3, 2), (7, 0.9, 1.0, 3)])
def test_each_direction_against_monte_carlo(n: int, sigma: float, eps: float, seed: int) -> None:
    (remove, add), (se_r, se_a) = _monte_carlo_deltas(n, sigma, eps, 400_000, seed)
    upper, lower = dpsgd_plds(n=n, sigma=sigma, grid=1e-3)
    for pmf_name, truth, se in (("_pmf_remove", remove, se_r), ("_pmf_add", add, se_a)):
        hi = getattr(upper.to_dp_accounting(), pmf_name).get_delta_for_epsilon(eps)
        lo = getattr(lower.to_dp_accounting(), pmf_name).get_delta_for_epsilon(eps)
        assert lo - 5 * se <= truth <= hi + 5 * se, pmf_name
        assert hi <= 1.05 * truth + 5 * se, pmf_name


@pytest.mark.parametrize("n, sigma, delta", [(3, 1.0, 1e-5), (3, 2.0, 1e-6), (3, 0.8, 1e-3)])
def test_epsilon_brackets_the_exact_pair(n: int, sigma: float, delta: float) -> None:
    truth = _allocation_epsilon(n, sigma, delta)
    r = dpsgd_balls_in_bins(n=n, sigma=sigma, delta=delta)
    assert r.lower <= truth <= r.epsilon
    assert r.epsilon <= truth * 1.01


def test_reduction_under_balls_in_bins_at_any_n() -> None:
    # n = 6 is no power of two: the reduction row is DP-SGD's bracket at sigma / ||C||_2
    c = np.tril(np.ones((6, 6))) / math.sqrt(6)
    red = reduction(c, sigma=3.0, sampler="balls-in-bins", delta=1e-5)
    nm = 3.0 / spectral_norm_bound(c).upper
    assert red.epsilon == dpsgd_balls_in_bins(n=6, sigma=nm, delta=1e-5).epsilon
    assert red.noise_multiplier == nm


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_refuses_bad_n(n: object) -> None:
    with pytest.raises(MfcliError, match="positive integer"):
        dpsgd_balls_in_bins(n=n, sigma=1.0)  # type: ignore[arg-type]


def test_cli_accounts_any_c_at_any_n_under_balls_in_bins() -> None:
    """`account --batching balls-in-bins` on a non-tree C at n = 6 (no power of two): the reduction
    row holds, equal to DP-SGD's bracket at sigma / ||C||_2, and is among the reported guarantees."""
    import json

    from typer.testing import CliRunner

    from mfcli.cli.app import app

    r = CliRunner().invoke(app, ["account", "--strategy", "sqrt", "--n", "6", "--sigma", "3", "--batching",
                                 "balls-in-bins", "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    row = out["settings"]["dp-sgd-reduction"]
    assert row["epsilon"] == dpsgd_balls_in_bins(n=6, sigma=row["noise_multiplier"], delta=row["delta"]).epsilon
    assert "dp-sgd-reduction" in out["report"]["candidates"]
