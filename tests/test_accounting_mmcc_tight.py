"""The tightened MMCC bracket (docs/accounting.md, "Tightening the bracket"): the row mixtures
convolved on a fine grid and rounded up once (upper bound) and the best of a few linear
statistics (lower bound), against independent oracles: enumeration of all participation
patterns, and the exact epsilon of small pairs by numerical integration of the likelihood ratio."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from accounting_oracles import bernoulli_sum_law, sqrt_toeplitz, unit

from mfcli.accounting import mmcc as M
from mfcli.accounting import mmcc_lower as ML
from mfcli.errors import MfcliError


def cdf(law: dict[float, float], t: np.ndarray) -> np.ndarray:
    return np.array([sum(v for s, v in law.items() if s <= x) for x in t])


ROWS = [
    (unit(sqrt_toeplitz(6))[5], np.array([0.05, 0.1, 0.2, 0.3, 0.4, 0.5]), 50, 20),
    (np.array([0.013, 0.021, 0.0333, 0.017, 0.29, 0.7]), np.full(6, 0.3), 50, 20),
    (np.array([0.31, 0.27, 0.49, 0.05]), np.array([0.9, 0.01, 0.5, 0.2]), 10, 7),
]


@pytest.mark.parametrize("row,q,m,r", ROWS)
def test_fine_then_coarse_row_dominates_exact_row(row, q, m, r) -> None:
    """The coarse law is stochastically larger than the exact S (CDF pointwise below), and above
    the exact S shifted by 1/M + k/(M R) (the bound on what the single rounding costs)."""
    k = M._round_up_to_grid(row, m * r)
    support, probs, eta = M.row_mixture(k, q, cut=0.0)
    assert eta == 0.0
    sup, pr = M.coarsen_up(support, probs, r)
    assert pr.sum() == pytest.approx(1.0) and np.all(np.diff(sup) > 0)
    exact = bernoulli_sum_law(row, q)
    grid = np.linspace(-0.01, row.sum() + 0.2, 500)
    coarse_cdf = np.array([pr[sup / m <= t].sum() for t in grid])
    assert np.all(coarse_cdf <= cdf(exact, grid) + 1e-12)
    shift = 1.0 / m + len(row) / (m * r)
    assert np.all(coarse_cdf >= cdf(exact, grid - shift) - 1e-12)


def test_coarse_rounding_is_tighter_than_rounding_every_weight() -> None:
    """Many small weights: rounding each up to 1/M moves the top of the support far more than
    rounding the sum once."""
    row = np.full(40, 0.011)
    q = np.full(40, 0.5)
    s1, _, _ = M.row_mixture(M._round_up_to_grid(row, 50), q, cut=0.0)
    s20, p20, _ = M.row_mixture(M._round_up_to_grid(row, 1000), q, cut=0.0)
    s20, _ = M.coarsen_up(s20, p20, 20)
    assert s1.max() / 50 == pytest.approx(0.8)  # 40 x 0.02
    assert s20.max() / 50 == pytest.approx(0.44)  # ceil(40 x 0.011 x 50) / 50 = 22 / 50


@pytest.mark.parametrize("weights,p,res", [
    (np.array([1.0, 0.5, 0.25, 0.3333, 0.999]), 0.3, 20),
    (np.array([1.0, 1.0, 1.0, 0.2]), 0.05, 200),
    (np.array([0.7, 0.1, 1.0]), 0.9, 3),
])
def test_mean_law_rounds_down(weights, p, res) -> None:
    """The statistic's mean law: stochastically smaller than the exact one, exact when the weights
    lie on the grid."""
    sup, pr = ML.mean_law(weights, p, res)
    exact = bernoulli_sum_law(weights, np.full(weights.size, p))
    grid = np.linspace(-0.01, weights.sum() + 0.1, 400)
    mine = np.array([pr[sup / res <= t].sum() for t in grid])
    assert np.all(mine >= cdf(exact, grid) - 1e-12)
    on_grid = np.floor(weights * res) / res
    exact_on = bernoulli_sum_law(on_grid, np.full(weights.size, p))
    assert np.allclose(mine, cdf(exact_on, grid), atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Exact small pairs by numerical integration


def exact_epsilon(c: np.ndarray, sigma: float, p: float, delta: float, *, h: float) -> float:
    """True epsilon of P = N(0, sigma^2 I) vs Q = E_b N(C b, sigma^2 I) (max of the two
    directions) by a Riemann sum of (mu - e^eps nu)_+ on a grid of spacing h sigma over a box
    that leaves out < 1e-9 of either measure; bisection on eps."""
    m, n = c.shape
    lo = -8.0 * sigma
    hi = c.sum(axis=1).max() + 8.0 * sigma
    axis = np.arange(lo, hi + h * sigma, h * sigma)
    mesh = np.stack(np.meshgrid(*([axis] * m), indexing="ij"), axis=-1).reshape(-1, m)
    vol = (h * sigma) ** m
    logp = -0.5 * (mesh**2).sum(axis=1) / sigma**2
    q = np.zeros(mesh.shape[0])
    for bits in itertools.product((0, 1), repeat=n):
        b = np.array(bits, dtype=float)
        w = float(np.prod(np.where(b == 1, p, 1 - p)))
        mu = c @ b
        q += w * np.exp(-0.5 * ((mesh - mu) ** 2).sum(axis=1) / sigma**2)
    norm = (2 * math.pi * sigma**2) ** (-m / 2)
    pd, qd = norm * np.exp(logp) * vol, norm * q * vol

    def worst(e: float) -> float:
        return max(np.maximum(qd - math.exp(e) * pd, 0).sum(), np.maximum(pd - math.exp(e) * qd, 0).sum())

    a, b = 0.0, 1.0
    while worst(b) > delta:
        a, b = b, 2 * b
    for _ in range(50):
        mid = 0.5 * (a + b)
        a, b = (mid, b) if worst(mid) > delta else (a, mid)
    return 0.5 * (a + b)


EXACT = [
    ("sqrt2", unit(sqrt_toeplitz(2)), 1.0, 0.3, 1e-2),
    ("ones2", unit(np.tril(np.ones((2, 2)))), 0.8, 0.2, 1e-3),
    ("sqrt3", unit(sqrt_toeplitz(3)), 1.0, 0.2, 1e-2),
]


@pytest.mark.parametrize("name,c,sigma,p,delta", EXACT, ids=[e[0] for e in EXACT])
def test_bracket_contains_the_exact_epsilon(name, c, sigma, p, delta) -> None:
    h = 0.05 if c.shape[0] == 2 else 0.2
    truth = exact_epsilon(c, sigma, p, delta, h=h)
    coarse = exact_epsilon(c, sigma, p, delta, h=2 * h)
    err = 2 * abs(truth - coarse) + 1e-4  # integration error allowance from halving the grid
    up = M.mmcc(c, sigma=sigma, sampling=p, delta=delta, value_discretization=1e-3)
    up_old = M.mmcc(c, sigma=sigma, sampling=p, delta=delta, value_discretization=1e-3, mixture_refinement=1)
    lb = M.lower_bound(c, sigma=sigma, sampling=p, delta=delta)
    lb_ones = M.lower_bound(c, sigma=sigma, sampling=p, delta=delta, statistics=("ones",))
    assert up.epsilon >= truth - err
    assert up.epsilon <= up_old.epsilon + 1e-9
    assert lb.epsilon <= truth + err
    assert lb.epsilon >= lb_ones.epsilon


def test_lower_bound_statistics_on_identity_coincide() -> None:
    """C = I: C^T C = I, so every statistic is 1^T y = Bin(n, p) + N(0, n sigma^2)."""
    lb = M.lower_bound(np.eye(12), sigma=1.0, sampling=0.1, delta=1e-4)
    assert len(set(lb.tried.values())) == 1
    assert lb.noise_scale == pytest.approx(math.sqrt(12), rel=1e-8)


def test_lower_bound_score_statistic_by_simulation() -> None:
    """T_v for v = C^T C 1: its noise scale tau^2 = sigma^2 v^T (C^T C)^-1 v equals the variance of
    v^T C^+ z for simulated noise z (an independent route to the same number)."""
    c = unit(sqrt_toeplitz(8))
    g = c.T @ c
    v = ML.statistic_weights(g, "score")
    chol = np.linalg.cholesky(g)
    _, tau = ML.statistic_epsilon(chol, v, sigma_eff=2.0, p=0.1, delta=1e-3)
    rng = np.random.default_rng(1)
    z = 2.0 * rng.standard_normal((200_000, 8))
    t = z @ np.linalg.pinv(c).T @ v
    assert tau == pytest.approx(float(t.std()), rel=0.01)


def test_lower_bound_rejects_unknown_statistic() -> None:
    with pytest.raises(MfcliError, match="statistics"):
        M.lower_bound(np.eye(3), sigma=1.0, sampling=0.1, statistics=("best",))


def test_mixture_refinement_checked() -> None:
    with pytest.raises(MfcliError, match="refinement"):
        M.mmcc(np.eye(3), sigma=1.0, sampling=0.1, mixture_refinement=0)


@pytest.mark.parametrize("u", [1.0, 0.5, 0.1])
def test_tail_allocation_spends_at_most_the_tail_delta(u) -> None:
    """The shares used (each pair at its problem's share) add up to at most 1 (the union bound),
    u = 1 is the uniform split, and with u < 1 the pairs with larger C[r, j] get more."""
    prep = M.prepare_strategy(unit(sqrt_toeplitz(12)))
    pairs = M.collect_tail_pairs(prep, resolution=100)
    share = M.tail_allocation(prep, pairs, u)
    used = share[pairs.key]
    assert used.sum() <= 1.0
    if u == 1.0:
        assert np.allclose(used, 1.0 / pairs.count)
    else:
        w = prep.strategy[pairs.rows, pairs.cols]
        big, small = np.argmax(w), np.argmin(w)
        assert used[big] > used[small]
        assert used.min() >= u / pairs.count * (1 - 1e-9)


@pytest.mark.parametrize("name,c,sigma,p,delta", EXACT, ids=[e[0] for e in EXACT])
def test_nonuniform_tail_split_stays_above_the_exact_epsilon(name, c, sigma, p, delta) -> None:
    truth = exact_epsilon(c, sigma, p, delta, h=0.1 if c.shape[0] == 2 else 0.25)
    up = M.mmcc(c, sigma=sigma, sampling=p, delta=delta, value_discretization=1e-3, tail_uniform_share=0.3)
    assert up.epsilon >= truth - 1e-2
    assert up.tail_uniform_share == 0.3


def test_tail_uniform_share_checked() -> None:
    with pytest.raises(MfcliError, match="uniform share"):
        M.mmcc(np.eye(3), sigma=1.0, sampling=0.1, tail_uniform_share=0.0)


def test_coarsen_down_is_stochastically_smaller() -> None:
    rng = np.random.default_rng(3)
    sup = np.sort(rng.choice(100_000, 3000, replace=False))
    pr = rng.random(3000)
    pr /= pr.sum()
    s2, p2 = ML.coarsen_down(sup, pr, 500)
    assert s2.size <= 500 and p2.sum() == pytest.approx(1.0)
    t = np.linspace(0, 100_000, 997)
    assert np.all(np.array([p2[s2 <= x].sum() for x in t]) >= np.array([pr[sup <= x].sum() for x in t]) - 1e-12)


@pytest.mark.parametrize("nnz,length,r,budget,expected", [
    (10, 100, 20, 1e9, 20),
    (1000, 1000, 20, 1e7, 10),
    (1000, 1000, 20, 2e6, 2),
    (1000, 1000, 20, 1e5, 1),
    (10, 10, 7, 1e9, 7),
    (10, 10, 7, 600, 5),
    (10, 10, 7, 300, 2),
    (10, 10, 1, 1e9, 1),
])
def test_row_refinement_fits_the_budget(nnz, length, r, budget, expected) -> None:
    assert M.row_refinement(nnz, length, r, budget) == expected
