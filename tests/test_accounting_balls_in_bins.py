"""The binary tree under balls-in-bins batching: the grid bracket against oracles that do not
use its recursion.

Oracles: the plain Gaussian closed form (n = 1); for n = 2 a quadrature of the exact likelihood
ratio computed from the tree matrix C (the root row, common to every column, integrated in closed
form, the other two rows by Gauss-Hermite); for n = 4 and 8 a Monte Carlo of the same exact ratio
with error bars. Both directions are hockey-stick divergences under Q only, so the P-laws of the
recursion are checked too.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special

from mfcli.accounting.balls_in_bins import tree_balls_in_bins, tree_delta_bracket, tree_height
from mfcli.accounting.single_pass import gaussian_delta, gaussian_epsilon
from mfcli.errors import MfcliError
from mfcli.strategies.baselines import tree_strategy_matrix


def _split_root(n: int) -> tuple[np.ndarray, np.ndarray]:
    """C of the tree without its all-ones root row, and the column norms^2 of the full C."""
    c = tree_strategy_matrix(n) if n > 1 else np.ones((1, 1))
    root = np.flatnonzero(np.all(c == 1.0, axis=1))
    assert root.size == 1
    rest = np.delete(c, root[0], axis=0)
    return rest, np.sum(c * c, axis=0)


def _inner(logm: np.ndarray, eps: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """E over the root's noise of the two hockey-stick integrands, given M (the rest of the ratio).

    With the root output y0 ~ N(0, sigma^2) the ratio is M e^G, G = y0/sigma^2 - 1/(2 sigma^2)
    ~ N(-s^2/2, s^2), s = 1/sigma: remove E[(M e^G - e^eps)_+] = M Phi(d1) - e^eps Phi(d2) with
    d2 = (log M - eps - s^2/2)/s, d1 = d2 + s; add E[(1 - e^eps M e^G)_+] = Phi(e1) - e^eps M Phi(e1 - s)
    with e1 = (-log M - eps + s^2/2)/s.
    """
    s = 1.0 / sigma
    d2 = (logm - eps - s * s / 2) / s
    d1 = d2 + s
    e1 = (-logm - eps + s * s / 2) / s
    m = np.exp(logm)
    remove = m * special.ndtr(d1) - math.exp(eps) * special.ndtr(d2)
    add = special.ndtr(e1) - math.exp(eps) * m * special.ndtr(e1 - s)
    return np.maximum(remove, 0.0), np.maximum(add, 0.0)


def _log_m(y: np.ndarray, n: int, sigma: float) -> np.ndarray:
    """log of (1/n) sum_i exp(<C' e_i, y>/sigma^2 - ||C e_i||^2/(2 sigma^2)) + 1/(2 sigma^2), the
    exact ratio with the root's factor taken out (y: outputs of the non-root rows, rows x samples)."""
    rest, norms2 = _split_root(n)
    expo = (rest.T @ y) / sigma**2 - (norms2[:, None] - 1.0) / (2 * sigma**2)
    return special.logsumexp(expo, axis=0) - math.log(n)


def _quadrature_deltas(n: int, sigma: float, eps: float, points: int = 120) -> tuple[float, float]:
    """(remove, add) delta of the exact pair by Gauss-Hermite over the non-root outputs (n = 2)."""
    x, w = np.polynomial.hermite_e.hermegauss(points)
    w = w / w.sum()
    rows = 2 * n - 2
    grids = np.meshgrid(*([x] * rows), indexing="ij")
    y = np.stack([g.ravel() for g in grids]) * sigma
    wt = np.ones(1)
    for _ in range(rows):
        wt = np.multiply.outer(wt, w)
    wt = wt.ravel()
    r, a = _inner(_log_m(y, n, sigma), eps, sigma)
    return float(wt @ r), float(wt @ a)


def _monte_carlo_deltas(n: int, sigma: float, eps: float, samples: int, seed: int) -> tuple[float, float]:
    """max over directions of the Monte Carlo delta and its standard error."""
    rng = np.random.default_rng(seed)
    rows = 2 * n - 2
    y = rng.standard_normal((rows, samples)) * sigma
    r, a = _inner(_log_m(y, n, sigma), eps, sigma)
    means = [r.mean(), a.mean()]
    ses = [r.std(ddof=1) / math.sqrt(samples), a.std(ddof=1) / math.sqrt(samples)]
    k = int(np.argmax(means))
    return float(means[k]), float(ses[k])


@pytest.mark.parametrize("sigma, delta", [(0.7, 1e-3), (1.0, 1e-5), (4.0, 1e-6)])
def test_one_step_is_the_gaussian(sigma: float, delta: float) -> None:
    r = tree_balls_in_bins(n=1, sigma=sigma, delta=delta)
    exact = gaussian_epsilon(delta, 1.0 / sigma)
    assert r.lower <= exact <= r.epsilon
    assert r.epsilon - r.lower < 0.01


@pytest.mark.parametrize("epochs", [3, 10])
def test_epochs_of_one_step_compose_to_the_gaussian(epochs: int) -> None:
    r = tree_balls_in_bins(n=1, sigma=2.0, delta=1e-5, epochs=epochs)
    exact = gaussian_epsilon(1e-5, math.sqrt(epochs) / 2.0)
    assert r.lower <= exact <= r.epsilon
    assert r.epsilon < 1.02 * exact


@pytest.mark.parametrize("sigma, eps", [(0.8, 2.0), (1.0, 1.0), (1.5, 0.5), (2.0, 1.5)])
def test_two_leaves_against_quadrature(sigma: float, eps: float) -> None:
    truth = max(_quadrature_deltas(2, sigma, eps))
    lo, hi = tree_delta_bracket(n=2, sigma=sigma, epsilon=eps)
    assert lo <= truth <= hi
    assert hi <= 1.05 * truth + 1e-9  # the bracket is tight enough for the check to mean something


def test_quadrature_is_converged() -> None:
    a = _quadrature_deltas(2, 1.0, 1.0, points=80)
    b = _quadrature_deltas(2, 1.0, 1.0, points=140)
    assert abs(a[0] - b[0]) < 1e-9 and abs(a[1] - b[1]) < 1e-9


@pytest.mark.parametrize("n, sigma, eps, seed", [(4, 1.0, 1.0, 1), (4, 1.5, 0.6, 2), (8, 1.0, 1.2, 3),
                                                 (8, 1.2, 0.8, 4)])
def test_small_trees_against_monte_carlo(n: int, sigma: float, eps: float, seed: int) -> None:
    mc, se = _monte_carlo_deltas(n, sigma, eps, samples=200_000, seed=seed)
    assert se < 0.02 * mc  # a meaningful estimate
    lo, hi = tree_delta_bracket(n=n, sigma=sigma, epsilon=eps)
    assert lo <= mc + 4 * se
    assert hi >= mc - 4 * se
    assert hi <= mc + 4 * se + 0.05 * mc  # not vacuous


@pytest.mark.parametrize("n", [2, 16, 64])
def test_between_one_node_and_the_unamplified_tree(n: int) -> None:
    sigma, delta = 2.0, 1e-6
    r = tree_balls_in_bins(n=n, sigma=sigma, delta=delta)
    # post-processing: the root node alone is a Gaussian with sensitivity 1, so the truth is at
    # least its epsilon; and shuffling nothing (every step known) gives the sqrt(L + 1) Gaussian
    assert r.epsilon >= gaussian_epsilon(delta, 1.0 / sigma)
    assert r.lower <= gaussian_epsilon(delta, math.sqrt(tree_height(n) + 1) / sigma)
    assert r.lower <= r.epsilon <= 1.05 * r.lower


def test_monotone_in_sigma() -> None:
    sigmas = [1.0, 1.5, 2.5, 4.0]
    res = [tree_balls_in_bins(n=16, sigma=s, delta=1e-6) for s in sigmas]
    ups = [r.epsilon for r in res]
    los = [r.lower for r in res]
    assert all(a > b for a, b in itertools.pairwise(ups))
    assert all(a > b for a, b in itertools.pairwise(los))


def test_gaussian_delta_oracle_sanity() -> None:
    # the closed form the n = 1 tests rely on, against the inner closed form of this file
    r, a = _inner(np.zeros(1), 0.5, 1.5)
    assert r[0] == pytest.approx(float(gaussian_delta(0.5, 1 / 1.5)), rel=1e-12)
    assert a[0] == pytest.approx(float(gaussian_delta(0.5, 1 / 1.5)), rel=1e-12)


@pytest.mark.parametrize("n", [3, 6, 1000, 0, -4])
def test_refuses_other_n(n: int) -> None:
    with pytest.raises(MfcliError, match=r"power of two|positive integer"):
        tree_balls_in_bins(n=n, sigma=1.0)


@pytest.mark.parametrize("kw", [{"sigma": 0.0}, {"sigma": -1.0}, {"delta": 0.0}, {"delta": 1.0}, {"epochs": 0},
                                {"grid": 0.0}, {"grid": 0.5}])
def test_refuses_bad_parameters(kw: dict) -> None:
    args = {"n": 4, "sigma": 1.0, **kw}
    with pytest.raises(MfcliError):
        tree_balls_in_bins(**args)


@pytest.mark.parametrize("n, sigma, eps", [(2, 1.0, 0.5), (2, 0.8, 1.5), (4, 1.2, 0.4)])
def test_each_direction_separately(n: int, sigma: float, eps: float) -> None:
    # the max over directions could hide an error in the weaker (add) direction: check both
    from mfcli.accounting.balls_in_bins import tree_plds

    if n == 2:
        remove, add = _quadrature_deltas(n, sigma, eps)
        tol_r = tol_a = 1e-9
    else:
        rng = np.random.default_rng(7)
        y = rng.standard_normal((2 * n - 2, 200_000)) * sigma
        r, a = _inner(_log_m(y, n, sigma), eps, sigma)
        remove, add = float(r.mean()), float(a.mean())
        tol_r, tol_a = 4 * r.std() / math.sqrt(r.size), 4 * a.std() / math.sqrt(a.size)
    upper, lower = tree_plds(n=n, sigma=sigma, grid=1e-3)
    for pmf_name, truth, tol in (("_pmf_remove", remove, tol_r), ("_pmf_add", add, tol_a)):
        hi = getattr(upper.to_dp_accounting(), pmf_name).get_delta_for_epsilon(eps)
        lo = getattr(lower.to_dp_accounting(), pmf_name).get_delta_for_epsilon(eps)
        assert lo - tol <= truth <= hi + tol, pmf_name
        assert hi <= 1.05 * truth + tol, pmf_name
