"""Calibration: the smallest sigma for a target epsilon, against closed forms and round trips."""
from __future__ import annotations

import numpy as np
import pytest

import mfcli.accounting.mmcc as M
from mfcli.accounting.calibrate import calibrate_sigma
from mfcli.accounting.single_pass import gaussian_epsilon
from mfcli.errors import MfcliError
from mfcli.services.account import AccountingOptions, StrategyInput, calibrate


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


# ---------------------------------------------------------------------------------------------
# calibrate_strategy: a strategy matrix in memory, one setting


def _strategies():
    from mfcli.model.workloads import prefix_workload
    from mfcli.strategies.baselines import build_strategy

    rng = np.random.default_rng(3)
    lower = np.tril(rng.uniform(0.1, 1.0, size=(6, 6)))
    tree = build_strategy("tree", prefix_workload(6))
    return [
        ("identity", np.eye(5), None, False),
        ("random lower-triangular", lower, None, False),
        ("tree", tree.factorization.strategy, tree.release_steps, True),
    ]


@pytest.mark.parametrize("name, c, release, is_tree", _strategies(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("target, delta", [(0.5, 1e-5), (4.0, 1e-6)])
def test_calibrate_strategy_single_pass_is_the_gaussian_scaled_by_sens(name, c, release, is_tree, target, delta):
    """Single pass: epsilon depends only on sigma / sens(C); dp-accounting's closed-form Gaussian
    calibration of that multiplier is the independent answer."""
    import dp_accounting

    from mfcli.accounting import calibrate_strategy

    cal = calibrate_strategy(c, epsilon=target, delta=delta, release_steps=release, is_tree=is_tree, name=name,
                             rel_tol=1e-7)
    sens = float(np.max(np.linalg.norm(c, axis=0)))
    assert cal.epsilon <= target
    assert cal.sigma / sens == pytest.approx(dp_accounting.get_sigma_gaussian(target, delta), rel=1e-5)


def test_calibrate_strategy_shuffled_tree_and_dp_sgd_meet_their_targets():
    from mfcli.accounting import calibrate_strategy
    from mfcli.accounting.shuffled_tree import shuffled_tree
    from mfcli.model.workloads import prefix_workload
    from mfcli.strategies.baselines import build_strategy

    tree = build_strategy("tree", prefix_workload(8))
    c = tree.factorization.strategy
    cal = calibrate_strategy(c, epsilon=2.0, delta=1e-5, setting="shuffled-tree", release_steps=tree.release_steps,
                             is_tree=True)
    # the tree encoder has 0/1 entries, so its noise per node is sigma (no rescaling)
    assert cal.epsilon == shuffled_tree(n=8, sigma=cal.sigma, delta=1e-5).epsilon <= 2.0
    assert shuffled_tree(n=8, sigma=cal.sigma_lower, delta=1e-5).epsilon > 2.0

    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    cal = calibrate_strategy(np.eye(8), epsilon=1.0, delta=1e-5, setting="dp-sgd", sampling=0.1)
    acc = PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(cal.sigma)), 8)
    assert acc.get_epsilon(1e-5) == pytest.approx(1.0, rel=1e-2)
    assert cal.epsilon <= 1.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(strategy_matrix=np.ones((3, 2))), "needs its release_steps"),
    (dict(strategy_matrix=np.ones(3)), "must be 2-D"),
    (dict(strategy_matrix=np.eye(4), setting="shuffled-tree"), "binary-tree"),
    (dict(strategy_matrix=np.eye(4), setting="mmcc"), "sampling"),
    (dict(strategy_matrix=np.eye(4), setting="bogus"), "unknown setting"),
])
def test_calibrate_strategy_refusals(kwargs, match):
    from mfcli.accounting import calibrate_strategy

    with pytest.raises(MfcliError, match=match):
        calibrate_strategy(epsilon=1.0, delta=1e-5, **kwargs)
