"""``pld_ops.self_compose`` and ``pld_ops.epsilon_for_delta`` against dp-accounting's own
``PrivacyLossDistribution.self_compose`` / ``get_epsilon_for_delta`` (the independent oracle: the
code they replace), bit for bit, over a table of PLDs: Poisson-sampled Gaussians as the DP-SGD row
builds them (small and large noise, p from 1e-3 to 1, several grids), mixtures of Gaussians as
MMCC's rows, and compositions of them; deltas from 1e-12 to 0.5."""
from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from mfcli.accounting import mog_pld, pld_ops
from mfcli.accounting.single_pass import _poisson_gaussian_pld


def _gaussian(sigma: float, p: float, d: float):
    return _poisson_gaussian_pld(sigma, p, d)


PLDS = {
    "dpsgd-s4-p0.01": lambda: _gaussian(4.0, 0.01, 1e-4),
    "dpsgd-s0.43-p0.01": lambda: _gaussian(0.4269453212393082, 0.01, 1e-4),
    "dpsgd-s1-p0.1-d1e-3": lambda: _gaussian(1.0, 0.1, 1e-3),
    "dpsgd-s2-p1": lambda: _gaussian(2.0, 1.0, 1e-3),
    "dpsgd-s0.8-p0.001": lambda: _gaussian(0.8, 0.001, 1e-4),
    "mog-3": lambda: mog_pld.mixture_pld(1.5, [0.0, 0.4, 1.0], [0.6, 0.3, 0.1], value_discretization_interval=1e-3),
    "mog-wide": lambda: mog_pld.mixture_pld(0.5, np.linspace(0, 2, 21), np.full(21, 1 / 21),
                                            value_discretization_interval=1e-3),
    "mog-composed": lambda: mog_pld.compose(
        mog_pld.mixture_pld(1.0, [0.0, 1.0], [0.9, 0.1], value_discretization_interval=1e-3),
        _gaussian(1.2, 0.05, 1e-3)),
}


@pytest.fixture(scope="module", params=sorted(PLDS))
def pld(request: pytest.FixtureRequest):
    return PLDS[request.param]()


def _same_pmf(a, b) -> None:
    assert type(a) is type(b) is pld_pmf.DensePLDPmf
    assert a._lower_loss == b._lower_loss
    assert a._discretization == b._discretization
    assert a._pessimistic_estimate == b._pessimistic_estimate
    assert a._infinity_mass == b._infinity_mass
    assert a._probs.shape == b._probs.shape
    assert a._probs.tobytes() == b._probs.tobytes()


@pytest.mark.parametrize("times", [1, 2, 7, 256, 1000])
def test_self_compose_is_dp_accountings_bit_for_bit(pld, times: int) -> None:
    ours = pld_ops.self_compose(pld, times)
    theirs = pld.self_compose(times)
    assert ours._symmetric == theirs._symmetric
    _same_pmf(ours._pmf_remove, theirs._pmf_remove)
    _same_pmf(ours._pmf_add, theirs._pmf_add)


DELTAS = [1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.1, 0.5]


@pytest.mark.parametrize("times", [1, 64, 256])
def test_epsilon_for_delta_is_dp_accountings_bit_for_bit(pld, times: int) -> None:
    composed = pld.self_compose(times) if times > 1 else pld
    for delta in DELTAS:
        ours = pld_ops.epsilon_for_delta(composed, delta)
        theirs = composed.get_epsilon_for_delta(delta)
        assert (ours == theirs) or (math.isinf(ours) and math.isinf(theirs)), (delta, ours, theirs)
        assert float(ours).hex() == float(theirs).hex()


def test_chernoff_window_is_dp_accountings() -> None:
    """The window alone, on random PMFs (where a bound may fall near an integer), many lengths and
    n: equal to dp-accounting's ``compute_self_convolve_bounds``."""
    from dp_accounting.pld import common

    rng = np.random.default_rng(7)
    for _ in range(60):
        size = int(rng.integers(2, 3000))
        probs = rng.random(size) ** rng.uniform(1, 30)
        probs /= probs.sum()
        n = int(rng.integers(1, 500))
        tail = float(10.0 ** rng.uniform(-18, -3))
        assert pld_ops._chernoff_window(probs, n, tail) == common.compute_self_convolve_bounds(probs, n, tail)


def test_near_integer_bounds_use_scipys_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the margin forced wide (u = 1), every order takes dp-accounting's own logsumexp: the
    same window, so the fallback path is the oracle's arithmetic."""
    from dp_accounting.pld import common

    probs = _gaussian(1.0, 0.1, 1e-3)._pmf_remove._probs
    expected = common.compute_self_convolve_bounds(probs, 50, 1e-15)
    monkeypatch.setattr(pld_ops, "_U", 1.0)
    assert pld_ops._chernoff_window(probs, 50, 1e-15) == expected


def test_non_dense_pmfs_go_to_dp_accounting() -> None:
    ident = pld_lib.identity(value_discretization_interval=1e-3)
    assert pld_ops.epsilon_for_delta(ident, 1e-6) == ident.get_epsilon_for_delta(1e-6)
    composed = pld_ops.self_compose(ident, 5)
    assert composed.get_epsilon_for_delta(1e-6) == ident.self_compose(5).get_epsilon_for_delta(1e-6)


def _hockey_stick_delta(pmf, eps: float) -> float:
    """delta(eps) of one direction, summed straight from its definition (the independent side):
    infinity mass + sum over losses l > eps of p (1 - e^(eps - l))."""
    losses = (pmf._lower_loss + np.arange(pmf._probs.size)) * pmf._discretization
    keep = losses > eps
    return float(pmf._infinity_mass + np.sum(pmf._probs[keep] * -np.expm1(eps - losses[keep])))


# (probabilities of the losses 5 + k d for k = 0, -1, ... down past -709, the delta asked):
# most of the mass far below -709, where math.exp(-l) overflows and dp-accounting's own loop
# raises OverflowError (a tiny noise multiplier leads there: tree, n = 8, sigma 0.1, rate 0.5).
_DEEP_CASES = [
    pytest.param(1e-6, 0.5, id="delta-above-top-mass"),
    pytest.param(1e-12, 1e-3, id="tiny-top-mass"),
    pytest.param(0.3, 0.31, id="top-mass-just-below-delta"),
]


@pytest.mark.parametrize("top, delta", _DEEP_CASES)
def test_epsilon_for_delta_past_the_float_range_is_zero_where_it_is(top: float, delta: float) -> None:
    d = 0.5
    losses = 5.0 - d * np.arange(0, 2000)  # 5 down to -994.5
    probs = np.zeros(losses.size)
    probs[0] = top
    probs[-1] = 1.0 - top  # at loss -994.5
    pmf = pld_pmf.DensePLDPmf(d, round(losses[-1] / d), np.flip(probs), 0.0, True)
    with pytest.raises(OverflowError):
        pmf.get_epsilon_for_delta(delta)  # what the fallback used to call
    pld = pld_lib.PrivacyLossDistribution(pmf)
    eps = pld_ops.epsilon_for_delta(pld, delta)
    assert eps == 0
    assert _hockey_stick_delta(pmf, 0.0) <= delta


def test_epsilon_for_delta_stopping_above_the_float_range_is_dp_accountings() -> None:
    # the same kind of PMF with a delta the top mass does not meet: the loop stops at a positive
    # loss, before the overflow, and both give the same epsilon bit for bit
    d = 0.5
    n = 2000
    probs = np.zeros(n)
    probs[0], probs[1], probs[-1] = 1e-3, 1e-3, 1.0 - 2e-3
    pmf = pld_pmf.DensePLDPmf(d, round((5.0 - d * (n - 1)) / d), np.flip(probs), 0.0, True)
    eps_theirs = pmf.get_epsilon_for_delta(1e-4)
    eps_ours = pld_ops.epsilon_for_delta(pld_lib.PrivacyLossDistribution(pmf), 1e-4)
    assert eps_ours == eps_theirs > 0
    assert _hockey_stick_delta(pmf, eps_ours) <= 1e-4 * (1 + 1e-12)
