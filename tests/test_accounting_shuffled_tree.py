"""The binary tree over one shuffled epoch: the valid single-epoch bound against a closed form and
a Monte Carlo estimate of the true (shuffled) privacy loss on small trees."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mfcli.accounting.shuffled_tree import AMPLIFIED_NOT_REPORTED, fmt_min_reports, shuffled_tree, tree_levels
from mfcli.errors import MfcliError


@pytest.mark.parametrize("n,levels", [(1, 1), (2, 2), (4, 3), (5, 4), (16, 5), (1000, 11), (1024, 11), (1025, 12)])
def test_bound_is_gaussian_with_sqrt_levels(n: int, levels: int) -> None:
    import dp_accounting

    r = shuffled_tree(n=n, sigma=3.0, delta=1e-6)
    assert r.levels == levels == tree_levels(n) + 1
    assert r.sensitivity == pytest.approx(math.sqrt(levels))
    assert r.epsilon == pytest.approx(dp_accounting.get_epsilon_gaussian(3.0 / math.sqrt(levels), 1e-6), abs=1e-6)
    assert r.amplified is None and r.amplified_note == AMPLIFIED_NOT_REPORTED


def test_monotone_in_sigma() -> None:
    eps = [shuffled_tree(n=256, sigma=s).epsilon for s in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert all(a > b for a, b in itertools.pairwise(eps))


def test_fmt_condition_closed_form() -> None:
    # eps0 <= log(M / (16 log(4/delta)))  <=>  M >= 16 log(4/delta) e^eps0
    m = fmt_min_reports(1.0, 1e-6)
    assert math.log(m / (16 * math.log(4 / 1e-6))) == pytest.approx(1.0)


@pytest.mark.parametrize("leaves", [2, 4])
def test_bound_is_above_a_monte_carlo_estimate(leaves: int) -> None:
    """True pair for one example at a uniformly random leaf of a small tree (other examples
    contribute known amounts): P = N(0, sigma^2 I), Q = mean_j N(c_j, sigma^2 I) with c_j the
    column of the 0/1 tree. Estimate H_eps at the bound's eps in both directions by Monte Carlo;
    it must not exceed delta (plus 4 standard errors)."""
    rng = np.random.default_rng(11)
    sigma, delta = 1.0, 0.05
    k = int(math.log2(leaves))
    rows = []
    for level in range(k + 1):
        size = 2**level
        for start in range(0, leaves, size):
            r = np.zeros(leaves)
            r[start:start + size] = 1
            rows.append(r)
    c = np.array(rows)  # (2 leaves - 1) x leaves
    eps = shuffled_tree(n=leaves, sigma=sigma, delta=delta).epsilon
    trials = 400_000

    def log_lr(y: np.ndarray) -> np.ndarray:  # log q(y) / p(y)
        a = (y @ c - 0.5 * (c * c).sum(axis=0)) / sigma**2  # (trials, leaves)
        return np.logaddexp.reduce(a, axis=1) - math.log(leaves)

    y_p = sigma * rng.standard_normal((trials, c.shape[0]))
    j = rng.integers(0, leaves, trials)
    y_q = c[:, j].T + sigma * rng.standard_normal((trials, c.shape[0]))
    l_q, l_p = log_lr(y_q), log_lr(y_p)
    h_remove = np.mean(np.maximum(0.0, 1 - np.exp(eps - l_q)))       # H_eps(Q || P) = E_Q[(1 - e^(eps - L))_+]
    h_add = np.mean(np.maximum(0.0, 1 - np.exp(eps + l_p)))          # H_eps(P || Q) = E_P[(1 - e^(eps + L))_+]
    se = math.sqrt(delta / trials)
    assert h_remove <= delta + 4 * se
    assert h_add <= delta + 4 * se
    # and the shuffle really helps at this size: the true curve is well below delta at eps
    assert min(h_remove, h_add) < delta


@pytest.mark.parametrize("kwargs", [dict(n=0, sigma=1.0), dict(n=4, sigma=0.0), dict(n=4, sigma=1.0, delta=2.0)])
def test_bad_input(kwargs) -> None:
    with pytest.raises(MfcliError):
        shuffled_tree(**kwargs)


@pytest.mark.parametrize("eps0", [705.0, 709.0, 800.0, 1e6])
def test_fmt_report_count_is_infinite_where_e_to_the_eps0_overflows(eps0) -> None:
    """16 log(4/delta) e^eps0 is beyond any float for these eps0 (e^eps0 alone from 709.79 on: it
    raised OverflowError, a traceback at tiny noise); within the range the closed form is unchanged."""
    assert fmt_min_reports(eps0, 1e-6) == math.inf
    assert fmt_min_reports(1.0, 1e-6) == 16.0 * math.log(4e6) * math.e
    assert fmt_min_reports(700.5, 1e-6) == 16.0 * math.log(4e6) * math.exp(700.5) < math.inf
