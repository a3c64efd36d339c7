"""Shared cases of the mixture-of-Gaussians privacy-loss inversion tests: mixtures like MMCC's
rows, and the inversion problem of one mixture and direction (its loss, truncation and eps
points strictly inside the loss range, past the flat limit)."""
from __future__ import annotations

import numpy as np
from scipy import stats

from mfcli.accounting import mog_pld

_BINOM = stats.binom.pmf(np.arange(150), 400, 0.01)
#: Rows like MMCC's: grid points 1/50 apart with binomial-like weights, with and without an atom at 0.
MMCC_LIKE_ROWS = [
    (4.0, list(np.arange(150) / 50), list(_BINOM / _BINOM.sum())),
    (2.5, list(np.arange(1, 90) / 50), list(np.full(89, 1 / 89))),  # no atom at 0: no flat limit
]


def inversion_problem(sigma: float, sens, probs, remove: bool, points: int):
    """(loss, lower_x, upper_x, eps): the loss of one direction, its truncation points and
    ``points`` - 2 evenly spaced eps strictly inside the loss range, those on the flat side of the
    flat limit dropped (the inversion's domain)."""
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    loss = mog_pld._Loss(float(sigma), s, q, remove)
    lower_x, upper_x = mog_pld._truncation(loss, mog_pld.LOG_MASS_TRUNCATION_BOUND)
    hi_eps, lo_eps = loss.value(np.array([lower_x, upper_x]))
    eps = np.linspace(lo_eps, hi_eps, points)[1:-1]
    eps = eps[(eps > loss.flat_limit) if remove else (eps < loss.flat_limit)]
    return loss, lower_x, upper_x, eps
