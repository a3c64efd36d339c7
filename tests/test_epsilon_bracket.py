"""mfcli.accounting.mmcc_lower.epsilon_bracket, the one bisection of the linear-statistic and the
banded Poisson accounting, against roots found independently (closed forms, scipy's brentq on the
Gaussian mechanism's exact hockey-stick curve)."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import optimize
from scipy.stats import norm

from mfcli.accounting.mmcc_lower import epsilon_bracket


def gaussian_curve(sigma: float) -> Callable[[float], float]:
    """delta(eps) of the Gaussian mechanism with sensitivity 1 and noise sigma (Balle and Wang 2018)."""
    return lambda e: float(norm.cdf(0.5 / sigma - e * sigma) - math.exp(e) * norm.cdf(-0.5 / sigma - e * sigma))


CASES = [
    # (curve, delta, the root by an independent method, rel_tol, max_steps)
    (lambda e: math.exp(-e), 1e-3, -math.log(1e-3), 1e-9, 60),
    (lambda e: math.exp(-e), 0.9, -math.log(0.9), 1e-7, 100),  # root below the first doubling point
    (gaussian_curve(1.0), 1e-5, optimize.brentq(lambda e: gaussian_curve(1.0)(e) - 1e-5, 0, 50, xtol=1e-14), 1e-6, 80),
    (gaussian_curve(0.3), 1e-6, optimize.brentq(lambda e: gaussian_curve(0.3)(e) - 1e-6, 0, 200, xtol=1e-14), 1e-9, 60),
]


@pytest.mark.parametrize(("curve", "delta", "root", "rel_tol", "max_steps"), CASES)
def test_bracket_holds_the_root_within_the_tolerance(curve, delta, root, rel_tol, max_steps) -> None:
    lo, hi = epsilon_bracket(curve, delta, rel_tol=rel_tol, max_steps=max_steps, eps_max=1e4)
    assert curve(lo) > delta >= curve(hi)
    assert lo <= root <= hi
    assert hi - lo <= rel_tol * (1 + hi)


@pytest.mark.parametrize(("curve", "delta", "eps_max", "expected"), [
    (lambda e: 0.5 * math.exp(-e), 0.5, 1e4, (0.0, 0.0)),       # already at delta at eps = 0
    (lambda e: 1.0, 0.5, 1e4, (8192.0, math.inf)),              # never falls: last doubling point below the cap
    (lambda e: 1.0, 0.5, 1e6, (524288.0, math.inf)),
    (lambda e: math.exp(-e), 1e-3, 4.0, (4.0, math.inf)),       # the root 6.9 lies past the cap
])
def test_edges(curve, delta, eps_max, expected) -> None:
    assert epsilon_bracket(curve, delta, rel_tol=1e-9, max_steps=60, eps_max=eps_max) == expected


def test_max_steps_stops_the_bisection() -> None:
    """With no bisection step the bracket is the doubling bracket [4, 8] around -log(1e-3) = 6.9."""
    assert epsilon_bracket(lambda e: float(np.exp(-e)), 1e-3, rel_tol=1e-9, max_steps=0, eps_max=1e4) == (4.0, 8.0)
