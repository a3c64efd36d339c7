"""The README's headline, ``mfcli account --sigma 4 --sampling 0.01`` (the shipped momentum-n256
artifact), against computations that share no code with mfcli's accounting:

* DP-SGD: dp-accounting's PLDAccountant composing the Poisson-sampled Gaussian itself;
* single pass and full participation: the exact analytic Gaussian (Balle-Wang), solved here with
  scipy's brentq from the sensitivities read off the artifact's C;
* MMCC and its lower bound: the same numbers with BLAS at two threads (the library default) as
  with the one thread ``mmcc`` and ``lower_bound`` now limit themselves to, bit for bit.

The speed work on this command (docs/performance.md, "Headline account") had to leave every
printed digit unchanged; these pin the rows that an independent method can pin exactly.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize, special
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import load_artifact, shipped_artifact

SIGMA, P, DELTA, STEPS = 4.0, 0.01, 1e-6, 256


@pytest.fixture(scope="module")
def headline() -> dict:
    result = CliRunner().invoke(app, ["account", "--sigma", str(SIGMA), "--sampling", str(P), "--json", "-q"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def strategy() -> np.ndarray:
    return np.asarray(load_artifact(shipped_artifact("momentum-n256")).factorization.strategy, dtype=np.float64)


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """The eps with Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) = delta (Balle & Wang 2018)."""
    def gap(eps: float) -> float:
        # e^eps Phi(b) as exp(eps + log Phi(b)): eps runs to ~800 for the full-participation row
        return special.ndtr(mu / 2 - eps / mu) - math.exp(eps + special.log_ndtr(-mu / 2 - eps / mu)) - delta

    hi = 1.0
    while gap(hi) > 0:
        hi *= 2
    return optimize.brentq(gap, 0.0, hi, xtol=1e-15, rtol=1e-14)


def test_dpsgd_row_is_dp_accountings_own(headline) -> None:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(P, dp_event.GaussianDpEvent(SIGMA)), STEPS)
    assert headline["settings"]["dp-sgd"]["epsilon"] == acc.get_epsilon(DELTA)


def test_single_pass_and_full_participation_rows_are_the_analytic_gaussian(headline, strategy) -> None:
    sens = float(np.max(np.linalg.norm(strategy, axis=0)))
    single = headline["settings"]["single-pass"]["epsilon"]
    want = analytic_gaussian_epsilon(sens / SIGMA, DELTA)
    # the bisection returns the upper end of a bracket of width 1e-12 (1 + eps)
    assert want <= single <= want + 2e-12 * (1 + want)
    full = headline["settings"]["mmcc"]["full_participation"]["epsilon"]
    want = analytic_gaussian_epsilon(float(np.linalg.norm((strategy / sens).sum(axis=1))) / (SIGMA / sens), DELTA)
    assert want <= full <= want * (1 + 1e-9)


def test_mmcc_numbers_do_not_depend_on_the_blas_threads(headline, strategy) -> None:
    """``mmcc`` and ``lower_bound`` run with one BLAS thread (less CPU time); run unwrapped under
    two, they give the command's numbers exactly."""
    from threadpoolctl import threadpool_limits

    from mfcli.accounting import mmcc as mmcc_module

    row = headline["settings"]["mmcc"]
    with threadpool_limits(limits=2, user_api="blas"):
        prep = mmcc_module.prepare_strategy(strategy)
        upper = mmcc_module.mmcc.__wrapped__(prep, sigma=SIGMA, sampling=P, delta=DELTA)  # type: ignore[attr-defined]
        lower = mmcc_module.lower_bound.__wrapped__(prep, sigma=SIGMA, sampling=P, delta=DELTA)  # type: ignore[attr-defined]
    assert upper.epsilon == row["epsilon"]
    assert upper.delta_trunc == row["delta_trunc"]
    assert upper.max_p_tilde == row["max_p_tilde"]
    assert lower.epsilon == row["lower_bound"]
    assert lower.tried == row["lower_bound_detail"]["statistics_tried"]
