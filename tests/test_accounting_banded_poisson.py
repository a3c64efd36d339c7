"""Banded C under Poisson sampling (mfcli/accounting/banded_poisson.py): the forward recursion
against brute force over all 2^n participation patterns, the importance-sampled ESTIMATE against
dp-accounting (b = 1) and the Monte Carlo truth of docs/accounting.md's exact small cases, and the
disjoint-rows lower bound against DP-SGD (C = I), the truth and the MMCC upper bound."""
from __future__ import annotations

import math

import numpy as np
import pytest
from accounting_oracles import banded, sqrt_toeplitz, unit
from hypothesis import given, settings
from hypothesis import strategies as st

from mfcli.accounting import banded_poisson as B
from mfcli.accounting import mmcc as M
from mfcli.errors import MfcliError


def brute_log_l(y: np.ndarray, c: np.ndarray, p: float, sigma: float) -> np.ndarray:
    """Independent oracle: log sum over all 2^n patterns x of Pr(x) N(y; C x) / N(y; 0)."""
    n = c.shape[1]
    out = []
    for row in np.atleast_2d(y):
        terms = []
        for bits in range(1 << n):
            x = np.array([(bits >> j) & 1 for j in range(n)], dtype=float)
            mu = c @ x
            k = x.sum()
            terms.append(k * math.log(p) + (n - k) * math.log1p(-p) + (row @ mu - mu @ mu / 2) / sigma**2)
        m = max(terms)
        out.append(m + math.log(sum(math.exp(t - m) for t in terms)))
    return np.array(out)


# ---------------------------------------------------------------------------------------------
# 1. the recursion


@pytest.mark.parametrize("n,b", [(6, 1), (8, 2), (9, 3), (10, 4), (7, 7)])
@pytest.mark.parametrize("source", ["P", "Q", "tilted"])
def test_recursion_equals_brute_force(n: int, b: int, source: str) -> None:
    rng = np.random.default_rng(n * 10 + b)
    c = unit(banded(n, b) * (1 + rng.random((n, n))))  # not Toeplitz: every row its own weights
    p, sigma = 0.15, 0.8
    if source == "P":
        y = sigma * rng.standard_normal((12, n))
    elif source == "Q":
        y = B.sample_mixture(rng, c, sampling=p, sigma=sigma, size=12)
    else:
        y = B.sample_mixture(rng, c, sampling=0.6, sigma=sigma, size=12, scale=-1.5)
    got = B.log_likelihood_ratio(y, c, sampling=p, sigma=sigma)
    assert B.bandwidth(c) == b
    np.testing.assert_allclose(got, brute_log_l(y, c, p, sigma), rtol=0, atol=1e-10)
    # a negative strategy (the remove proposal) too
    got_neg = B.log_likelihood_ratio(y, -c, sampling=0.4, sigma=sigma)
    np.testing.assert_allclose(got_neg, brute_log_l(y, -c, 0.4, sigma), rtol=0, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 8), b=st.integers(1, 4), p=st.floats(0.01, 0.9), sigma=st.floats(0.3, 5.0),
       seed=st.integers(0, 10**6))
def test_recursion_property(n: int, b: int, p: float, sigma: float, seed: int) -> None:
    b = min(b, n)
    rng = np.random.default_rng(seed)
    c = banded(n, b) * rng.random((n, n))
    c[np.arange(n), np.arange(n)] += 0.1
    y = B.sample_mixture(rng, c, sampling=p, sigma=sigma, size=4, scale=2.0)
    got = B.log_likelihood_ratio(y, c, sampling=p, sigma=sigma, band=b)
    np.testing.assert_allclose(got, B.log_likelihood_ratio_brute_force(y, c, sampling=p, sigma=sigma),
                               rtol=1e-12, atol=1e-9)


def test_bandwidth() -> None:
    assert B.bandwidth(np.eye(5)) == 1
    assert B.bandwidth(banded(9, 3)) == 3
    assert B.bandwidth(np.tril(np.ones((4, 4)))) == 4
    assert B.bandwidth(np.ones((3, 3))) is None  # not lower-triangular
    assert B.bandwidth(np.ones((3, 4))) is None


# ---------------------------------------------------------------------------------------------
# 2. the estimate


def test_estimate_covers_dpsgd_at_b1() -> None:
    """C = I is DP-SGD: the interval must cover dp-accounting's PLD value (pessimistic and
    optimistic PLD bracket the truth; both must lie in the interval or overlap it)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    n, sigma, p, delta = 64, 1.0, 0.05, 1e-6
    vals = []
    for pess in (True, False):
        from dp_accounting.pld import privacy_loss_distribution as pl
        pld = pl.from_gaussian_mechanism(sigma, sampling_prob=p, pessimistic_estimate=pess,
                                         value_discretization_interval=1e-4).self_compose(n)
        vals.append(pld.get_epsilon_for_delta(delta))
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(sigma)), n)
    assert acc.get_epsilon(delta) == pytest.approx(vals[0], rel=1e-6)
    est = B.estimate_epsilon(np.eye(n), sigma=sigma, sampling=p, delta=delta, samples=5_000, seed=3)
    assert est.band == 1
    assert est.low <= vals[0] and est.high >= vals[1], (est, vals)
    assert est.high - est.low < 0.1 * est.epsilon  # importance sampling makes delta = 1e-6 cheap


@pytest.mark.parametrize("name,make,sigma,p,delta,lo,hi", [
    ("band2", lambda: unit(banded(8, 2)), 2.0, 0.05, 1e-2, 0.0990, 0.0999),
    ("ones", lambda: unit(np.tril(np.ones((8, 8)))), 2.0, 0.05, 1e-3, 0.4109, 0.4166),
])
def test_estimate_matches_exact_small_cases(name, make, sigma, p, delta, lo, hi) -> None:
    """The truth of docs/accounting.md's exact small cases (2e6 plain Monte Carlo samples a
    direction, 3 standard errors): the intervals must overlap."""
    est = B.estimate_epsilon(make(), sigma=sigma, sampling=p, delta=delta, samples=2_000, seed=1)
    assert est.low <= hi and est.high >= lo, (est.low, est.high, lo, hi)
    assert "ESTIMATE" in est.as_dict()["kind"]


def test_estimate_refuses() -> None:
    with pytest.raises(MfcliError, match="bandwidth 12"):
        B.estimate_epsilon(np.tril(np.ones((12, 12))), sigma=1.0, sampling=0.1, delta=1e-5)
    with pytest.raises(MfcliError, match="negative"):
        B.estimate_epsilon(-np.eye(3), sigma=1.0, sampling=0.1, delta=1e-5)


# ---------------------------------------------------------------------------------------------
# 3. the lower bound


def test_row_law_brute_force() -> None:
    w = np.array([0.5, 0.25, 0.5])
    sup, pr = B.row_law(w, 0.3)
    want: dict[float, float] = {}
    for bits in range(8):
        x = [(bits >> j) & 1 for j in range(3)]
        k = sum(x)
        v = float(np.dot(w, x))
        want[v] = want.get(v, 0.0) + 0.3**k * 0.7 ** (3 - k)
    assert sorted(want) == pytest.approx(list(sup))
    assert [want[k] for k in sorted(want)] == pytest.approx(list(pr))


def test_lower_bound_identity_is_dpsgd() -> None:
    """C = I: every row is kept, the bound is DP-SGD's epsilon from below (optimistic PLD)."""
    from dp_accounting.pld import privacy_loss_distribution as pl

    n, sigma, p, delta = 64, 4.0, 0.01, 1e-6
    opt = pl.from_gaussian_mechanism(sigma, sampling_prob=p, pessimistic_estimate=False,
                                     value_discretization_interval=1e-5).self_compose(n).get_epsilon_for_delta(delta)
    pess = pl.from_gaussian_mechanism(sigma, sampling_prob=p, value_discretization_interval=1e-5
                                      ).self_compose(n).get_epsilon_for_delta(delta)
    lb = B.disjoint_rows_lower_bound(np.eye(n), sigma=sigma, sampling=p, delta=delta, grid=1e-5)
    assert lb.rows_used == n
    assert lb.epsilon <= pess
    assert lb.epsilon >= 0.97 * opt


@pytest.mark.parametrize("name,make,sigma,p,delta,lo,hi", [
    ("band2", lambda: unit(banded(8, 2)), 2.0, 0.05, 1e-2, 0.0990, 0.0999),
    ("sqrtS", lambda: unit(sqrt_toeplitz(6)), 1.0, 0.2, 1e-2, 3.0725, 3.1017),
    ("ones", lambda: unit(np.tril(np.ones((8, 8)))), 2.0, 0.05, 1e-3, 0.4109, 0.4166),
])
def test_lower_bound_below_truth_and_upper(name, make, sigma, p, delta, lo, hi) -> None:
    c = make()
    lb = B.disjoint_rows_lower_bound(c, sigma=sigma, sampling=p, delta=delta, grid=1e-3)
    assert 0 < lb.epsilon <= lo
    assert lb.epsilon <= M.mmcc(c, sigma=sigma, sampling=p, delta=delta).epsilon


def test_lower_bound_beats_scalar_statistic_near_diagonal() -> None:
    """For a C close to the identity the kept rows carry more than the one statistic
    1^T C^+ y (which hides every step's participation in one sum)."""
    c = np.eye(128) + 0.3 * np.eye(128, k=-1)
    old = M.lower_bound(c, sigma=1.0, sampling=0.02, delta=1e-6).epsilon
    new = B.disjoint_rows_lower_bound(c, sigma=1.0, sampling=0.02, delta=1e-6).epsilon
    assert new > 1.05 * old


def test_lower_bound_brute_force_hockey_stick() -> None:
    """One kept row (n = b = 2): the bound is below the hockey-stick divergence of the 2-D pair
    computed by numerical integration on a grid (both directions)."""
    from scipy import stats

    c = unit(banded(2, 2))
    sigma, p, delta = 0.7, 0.3, 1e-2
    g = np.linspace(-8, 10, 1201)
    h = g[1] - g[0]
    y1, y2 = np.meshgrid(g, g, indexing="ij")
    y = np.stack([y1.ravel(), y2.ravel()], axis=1)
    logl = B.log_likelihood_ratio_brute_force(y, c, sampling=p, sigma=sigma)
    pdf_p = stats.norm.pdf(y[:, 0], scale=sigma) * stats.norm.pdf(y[:, 1], scale=sigma) * h * h

    def true_delta(e: float) -> float:
        add = np.sum(pdf_p * np.maximum(np.exp(logl) - math.exp(e), 0))
        rem = np.sum(pdf_p * np.maximum(1 - math.exp(e) * np.exp(logl), 0))
        return max(add, rem)

    lb = B.disjoint_rows_lower_bound(c, sigma=sigma, sampling=p, delta=delta)
    assert true_delta(lb.epsilon) >= delta * 0.999  # eps below the true epsilon
