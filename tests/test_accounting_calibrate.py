"""Calibration: the smallest sigma for a target epsilon, against closed forms and round trips."""
from __future__ import annotations

import numpy as np
import pytest

import mfcli.accounting.mmcc as M
from mfcli.accounting.calibrate import calibrate_sigma
from mfcli.accounting.session import AccountingOptions, StrategyInput, calibrate
from mfcli.accounting.single_pass import gaussian_epsilon
from mfcli.errors import MfcliError


@pytest.mark.parametrize("target", [0.3, 1.0, 4.0])
def test_gaussian_calibration_matches_dp_accounting(target: float) -> None:
    import dp_accounting

    cal = calibrate_sigma(lambda s: gaussian_epsilon(1e-6, 1.0 / s), target_epsilon=target, rel_tol=1e-6)
    assert cal.epsilon <= target
    assert cal.sigma == pytest.approx(dp_accounting.get_sigma_gaussian(target, 1e-6), rel=2e-6)
    assert cal.sigma_lower < cal.sigma
    assert gaussian_epsilon(1e-6, 1.0 / cal.sigma_lower) > target


def test_mmcc_round_trip() -> None:
    c = np.tril(np.triu(np.ones((12, 12)), -1)) * np.array([1.0] + [0.6] * 11)[None, :]
    inp = StrategyInput(name="custom", strategy=c, release_steps=np.arange(12), source="test")
    opts = AccountingOptions(delta=1e-5, value_discretization=1e-3)
    cal = calibrate(inp, "mmcc", target_epsilon=1.0, sampling=0.05, options=opts, rel_tol=1e-3)
    again = M.mmcc(c, sigma=cal.sigma, sampling=0.05, delta=1e-5, value_discretization=1e-3).epsilon
    assert again == pytest.approx(cal.epsilon, rel=1e-12)  # deterministic: the same number
    assert again <= 1.0
    below = M.mmcc(c, sigma=cal.sigma_lower, sampling=0.05, delta=1e-5, value_discretization=1e-3).epsilon
    assert below > 1.0
    assert cal.sigma / cal.sigma_lower - 1 <= 1e-3
    assert again >= 0.97  # within tolerance of the target, approached from below


def test_dpsgd_round_trip() -> None:
    inp = StrategyInput(name="identity", strategy=np.eye(50), release_steps=np.arange(50), source="test")
    cal = calibrate(inp, "dp-sgd", target_epsilon=0.5, sampling=0.02, options=AccountingOptions(value_discretization=1e-3))
    assert 0.49 <= cal.epsilon <= 0.5


@pytest.mark.parametrize("target", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_target(target: float) -> None:
    with pytest.raises(MfcliError):
        calibrate_sigma(lambda s: 1.0 / s, target_epsilon=target)


def test_unreachable_target() -> None:
    # an epsilon that never falls below 2 (e.g. delta spent elsewhere)
    with pytest.raises(MfcliError, match="no sigma"):
        calibrate_sigma(lambda s: 2.0 + 1.0 / s, target_epsilon=1.0)


def test_setting_needs_sampling() -> None:
    inp = StrategyInput(name="identity", strategy=np.eye(4), release_steps=np.arange(4), source="test")
    with pytest.raises(MfcliError, match="sampling"):
        calibrate(inp, "mmcc", target_epsilon=1.0, sampling=None)
    with pytest.raises(MfcliError, match="tree"):
        calibrate(inp, "shuffled-tree", target_epsilon=1.0, sampling=None)
