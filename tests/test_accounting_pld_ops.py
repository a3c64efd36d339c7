"""``pld_ops``' PLD type and its operations (``compose``, ``self_compose``,
``epsilon_for_delta``, ``identity``) against dp-accounting's own ``PrivacyLossDistribution``
(the independent oracle: the code they replace, run on the same PLD converted with
``to_dp_accounting``), bit for bit, over a table of PLDs: Poisson-sampled Gaussians as the DP-SGD
row builds them (small and large noise, p from 1e-5 to 1, several grids, sparse and dense),
mixtures of Gaussians as MMCC's rows, and compositions of them; steps 1 to 1000; deltas from 1e-12
to 0.5."""
from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from mfcli.accounting import mog_pld, pld_ops
from mfcli.accounting.single_pass import _poisson_gaussian_pld
from mfcli.util import memory


def _gaussian(sigma: float, p: float, d: float):
    return _poisson_gaussian_pld(sigma, p, d)


PLDS = {
    "dpsgd-s4-p0.01": lambda: _gaussian(4.0, 0.01, 1e-4),
    "dpsgd-s0.43-p0.01": lambda: _gaussian(0.4269453212393082, 0.01, 1e-4),
    "dpsgd-s1-p0.1-d1e-3": lambda: _gaussian(1.0, 0.1, 1e-3),
    "dpsgd-s2-p1": lambda: _gaussian(2.0, 1.0, 1e-3),
    "dpsgd-s0.8-p0.001": lambda: _gaussian(0.8, 0.001, 1e-4),
    "dpsgd-s8-p0.001-sparse": lambda: _gaussian(8.0, 0.001, 1e-4),
    "dpsgd-s0.5-p1e-5": lambda: _gaussian(0.5, 1e-5, 1e-4),
    "dpsgd-s50-p0.3-d1e-2-sparse": lambda: _gaussian(50.0, 0.3, 1e-2),
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
    """Our :class:`pld_ops.Pmf` ``a`` holds dp-accounting's PMF ``b``: the same form (sparse or
    dense), grid, probabilities and infinity mass, to the bit."""
    assert a.sparse == isinstance(b, pld_pmf.SparsePLDPmf)
    dense = b.to_dense_pmf() if a.sparse else b
    assert type(dense) is pld_pmf.DensePLDPmf
    assert a.lower_loss == dense._lower_loss
    assert a.discretization == dense._discretization
    assert a.pessimistic == dense._pessimistic_estimate
    assert a.infinity_mass == dense._infinity_mass
    assert a.probs.shape == np.shape(dense._probs)
    assert a.probs.tobytes() == np.asarray(dense._probs, dtype=np.float64).tobytes()


def _same_pld(ours: pld_ops.Pld, theirs) -> None:
    assert ours.symmetric == theirs._symmetric
    _same_pmf(ours.remove, theirs._pmf_remove)
    _same_pmf(ours.add_pmf, theirs._pmf_add)


def test_conversions_round_trip(pld) -> None:
    back = pld_ops.Pld.from_dp_accounting(pld.to_dp_accounting())
    _same_pld(back, pld.to_dp_accounting())
    _same_pld(pld, pld.to_dp_accounting())


@pytest.mark.parametrize("times", [1, 2, 7, 256, 1000])
def test_self_compose_is_dp_accountings_bit_for_bit(pld, times: int) -> None:
    ours = pld_ops.self_compose(pld, times)
    theirs = pld.to_dp_accounting().self_compose(times)
    _same_pld(ours, theirs)


def test_identity_and_compose_are_dp_accountings_bit_for_bit(pld) -> None:
    """The accountant's steps: the identity composed with the PLD, and the PLD with itself and
    with a PLD of another kind (a mixture with a Gaussian, a sparse with a dense one)."""
    d = pld.discretization
    theirs = pld.to_dp_accounting()
    _same_pld(pld_ops.identity(d), pld_lib.identity(value_discretization_interval=d))
    _same_pld(pld_ops.identity(d).compose(pld), pld_lib.identity(value_discretization_interval=d).compose(theirs))
    _same_pld(pld.compose(pld), theirs.compose(theirs))
    other = _gaussian(3.0, 0.02, d)
    _same_pld(pld_ops.compose(pld, other), theirs.compose(other.to_dp_accounting()))
    _same_pld(pld_ops.compose(other, pld, 1e-9), other.to_dp_accounting().compose(theirs, 1e-9))


DELTAS = [1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.1, 0.5]


@pytest.mark.parametrize("times", [1, 64, 256])
def test_epsilon_for_delta_is_dp_accountings_bit_for_bit(pld, times: int) -> None:
    theirs = pld.to_dp_accounting()
    composed = theirs.self_compose(times) if times > 1 else theirs
    ours_pld = pld_ops.Pld.from_dp_accounting(composed)
    for delta in DELTAS:
        ours = pld_ops.epsilon_for_delta(ours_pld, delta)
        expected = composed.get_epsilon_for_delta(delta)
        assert (ours == expected) or (math.isinf(ours) and math.isinf(expected)), (delta, ours, expected)
        assert float(ours).hex() == float(expected).hex()


@pytest.mark.parametrize("times", [1, 64])
def test_epsilon_for_delta_with_numpys_exp_is_within_ulps(pld, times: int) -> None:
    """``bit_for_bit=False`` (numpy's exp: the certificate search's starting point) against
    dp-accounting's value: within 1e-13 max(1, eps)."""
    theirs = pld.to_dp_accounting()
    composed = theirs.self_compose(times) if times > 1 else theirs
    ours_pld = pld_ops.Pld.from_dp_accounting(composed)
    for delta in DELTAS:
        fast = pld_ops.epsilon_for_delta(ours_pld, delta, bit_for_bit=False)
        expected = composed.get_epsilon_for_delta(delta)
        if math.isinf(expected):
            assert math.isinf(fast)
        else:
            assert abs(fast - expected) <= 1e-13 * max(1.0, expected), (delta, fast, expected)


@pytest.mark.parametrize("times", [2, 64, 256])
def test_self_compose_by_real_transforms_is_close(pld, times: int) -> None:
    """``bit_for_bit=False`` (real FFTs, for certified runs): the same window and infinity mass as
    dp-accounting's, every mass within 1e-14 of it (the FFTs' round-off, both about 1e-16 x the
    total mass per position)."""
    ours = pld_ops.self_compose(pld, times, bit_for_bit=False)
    ref = pld_ops.Pld.from_dp_accounting(pld.to_dp_accounting().self_compose(times))
    for a, b in ((ours.remove, ref.remove), (ours.add_pmf, ref.add_pmf)):
        assert (a.lower_loss, a.probs.size, a.infinity_mass) == (b.lower_loss, b.probs.size, b.infinity_mass)
        assert float(np.max(np.abs(a.probs - b.probs))) <= 1e-14


def test_sparse_size_is_dp_accountings() -> None:
    assert pld_ops.MAX_SPARSE_SIZE == pld_pmf._MAX_PMF_SPARSE_SIZE


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

    probs = _gaussian(1.0, 0.1, 1e-3).remove.probs
    expected = common.compute_self_convolve_bounds(probs, 50, 1e-15)
    monkeypatch.setattr(pld_ops, "_U", 1.0)
    assert pld_ops._chernoff_window(probs, 50, 1e-15) == expected


def test_sparse_self_compositions_are_dp_accountings() -> None:
    """A sparse PMF small enough to stay sparse when composed (size^n <= 1000): dp-accounting's
    dictionary products, truncated at the last one only."""
    probs = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625 - 1e-9])
    pmf = pld_ops.Pmf(1e-2, -2, probs, 1e-9, True, True)
    pld = pld_ops.Pld(pmf)
    for times in (1, 2, 3, 4):
        ours = pld_ops.self_compose(pld, times, 1e-4)
        theirs = pld.to_dp_accounting().self_compose(times, 1e-4)
        _same_pld(ours, theirs)
        for delta in DELTAS:
            assert pld_ops.epsilon_for_delta(ours, delta) == theirs.get_epsilon_for_delta(delta)


def test_self_compose_refuses_an_fft_beyond_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FFT's size is checked before it is allocated: an error naming the points and the
    cause, not an out-of-memory kill."""
    from mfcli.util.memory import MemoryLimitError

    monkeypatch.setattr(memory, "memory_left", lambda: 10 * 2 ** 20)
    with pytest.raises(MemoryLimitError, match="noise multiplier is this small"):
        pld_ops.self_compose(_gaussian(0.4, 0.5, 1e-4), 100)


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
    pld = pld_ops.Pld.from_dp_accounting(pld_lib.PrivacyLossDistribution(pmf))
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
    eps_ours = pld_ops.epsilon_for_delta(pld_ops.Pld.from_dp_accounting(pld_lib.PrivacyLossDistribution(pmf)), 1e-4)
    assert eps_ours == eps_theirs > 0
    assert _hockey_stick_delta(pmf, eps_ours) <= 1e-4 * (1 + 1e-12)


@pytest.mark.parametrize("base", [0, 1, 2, 3, 10, 31, 32, 999, 1000, 1001])
@pytest.mark.parametrize("exponent", [1, 2, 3, 7, 1000])
def test_sparse_size_test_is_the_power(base: int, exponent: int) -> None:
    """When a sparse PMF goes dense: dp-accounting's size**n > 1000, without the big power."""
    assert pld_ops._power_exceeds(base, exponent, pld_ops.MAX_SPARSE_SIZE) == (base ** exponent > 1000)


@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize("sparse", [True, False])
def test_composition_cuts_tails_on_the_pmfs_own_side(pessimistic: bool, sparse: bool) -> None:
    """A pessimistic PMF's cut prefix goes to its first kept point and the suffix to +inf; an
    optimistic one's prefix is dropped and its suffix put on the last kept point: dp-accounting's
    compose, bit for bit, for PMFs whose tails are cut (mass far below 1e-15 at both ends)."""
    rng = np.random.default_rng(3)
    probs = np.concatenate(([1e-18, 3e-17], rng.random(20), [2e-17, 1e-18]))
    probs /= probs.sum()
    size = 24 if sparse else 1200
    if not sparse:
        probs = np.concatenate(([1e-19] * 600, probs, [1e-19] * (size - 600 - probs.size)))
        probs /= probs.sum()
    a = pld_ops.Pmf(1e-2, -7, probs, 1e-9 if pessimistic else 0.0, pessimistic, size <= pld_ops.MAX_SPARSE_SIZE)
    ours = pld_ops.compose_pmfs(a, a)
    theirs = a.to_dp_accounting().compose(a.to_dp_accounting(), tail_mass_truncation=pld_ops.TAIL_MASS_TRUNCATION)
    theirs = theirs.to_dense_pmf() if hasattr(theirs, "_loss_probs") else theirs
    assert ours.probs.size < 2 * a.size - 1  # tails were cut
    assert ours.probs.tobytes() == np.asarray(theirs._probs).tobytes()
    assert (ours.lower_loss, ours.infinity_mass) == (theirs._lower_loss, theirs._infinity_mass)
