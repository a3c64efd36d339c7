"""Epsilon per prefix (mfcli.accounting.prefix) against independent computations: the prefix's
sensitivity by brute force over its participation patterns (non-negative C, where the all-plus
gradient attains every pattern's value), the Gaussian's epsilon by dp-accounting's PLD, and the
cyclic-Poisson reduction as dp-accounting's Poisson-sampled Gaussian composed once per epoch."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mfcli.accounting.prefix import prefix_epsilon, prefix_epsilons, prefix_schema, prefix_strategy
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation


def _patterns(m: int, schema) -> list[tuple[int, ...]]:
    """Every participation pattern on m steps, listed from the definitions (not the library)."""
    if isinstance(schema, SingleParticipation):
        return [(i,) for i in range(m)]
    if isinstance(schema, FixedEpoch):
        b = m // schema.epochs
        return [tuple(range(i, m, b)) for i in range(b)]
    k = schema.max_participations or m
    return [p for r in range(1, k + 1) for p in itertools.combinations(range(m), r)
            if all(q - p_ >= schema.separation for p_, q in itertools.pairwise(p))]


def _brute_sensitivity(c: np.ndarray, m: int, schema) -> float:
    """sqrt(max over patterns of ||sum of C_m's columns on the pattern||^2), C >= 0 (all-plus is optimal)."""
    cm = c[:m, :m]
    return max(math.sqrt(float(np.sum(cm[:, list(p)].sum(axis=1) ** 2))) for p in _patterns(m, schema))


def _pld_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    from dp_accounting.pld import privacy_loss_distribution as pld

    return float(pld.from_gaussian_mechanism(noise_multiplier, value_discretization_interval=1e-5)
                 .get_epsilon_for_delta(delta))


def _random_causal(rng: np.random.Generator, n: int, bands: int | None = None) -> np.ndarray:
    c = np.tril(rng.uniform(0.0, 1.0, (n, n)))
    if bands is not None:
        c = np.triu(c, -(bands - 1))
    return c


@pytest.mark.parametrize("schema, n, per", [
    (FixedEpoch(epochs=4), 12, 3),
    (FixedEpoch(epochs=3), 12, 4),
    (MinSeparation(separation=3), 12, 3),
    (MinSeparation(separation=2, max_participations=2), 8, 4),
    (SingleParticipation(), 8, 4),
])
def test_deterministic_prefixes_against_brute_force(schema, n: int, per: int) -> None:
    rng = np.random.default_rng(n * 7 + per)
    c = _random_causal(rng, n)
    sigma, delta = 3.0, 1e-6
    got = prefix_epsilons(c, steps_per_epoch=per, setting="deterministic", sigma=sigma, schema=schema, delta=delta)
    assert [g.steps for g in got] == list(range(per, n + 1, per))
    for g in got:
        sub = FixedEpoch(epochs=g.steps // per) if isinstance(schema, FixedEpoch) else schema
        sens = _brute_sensitivity(c, g.steps, sub)
        assert g.sensitivity == pytest.approx(sens, rel=1e-9)
        # the analytic Gaussian is exact; dp-accounting's PLD is pessimistic by its discretization
        oracle = _pld_gaussian_epsilon(sigma / sens, delta)
        assert g.epsilon <= oracle + 1e-9
        assert g.epsilon >= oracle - 2e-4
    eps = [g.epsilon for g in got]
    assert eps == sorted(eps)  # a consequence (fewer steps), not used by the bound


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), epochs=st.integers(1, 4), per=st.integers(1, 4))
def test_fixed_epoch_prefix_sensitivity_hypothesis(seed: int, epochs: int, per: int) -> None:
    n = epochs * per
    c = _random_causal(np.random.default_rng(seed), n)
    got = prefix_epsilons(c, steps_per_epoch=per, setting="deterministic", sigma=2.0,
                          schema=FixedEpoch(epochs=epochs), delta=1e-5)
    for j, g in enumerate(got, start=1):
        assert g.sensitivity == pytest.approx(_brute_sensitivity(c, j * per, FixedEpoch(epochs=j)), rel=1e-9)


@pytest.mark.parametrize("b, epochs", [(4, 3), (2, 5)])
def test_cyclic_prefixes_against_dp_accounting(b: int, epochs: int) -> None:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    n = b * epochs
    c = _random_causal(np.random.default_rng(b), n, bands=b)
    sigma, p, delta = 2.5, 0.05, 1e-6
    got = prefix_epsilons(c, steps_per_epoch=b, setting="cyclic-poisson", sigma=sigma,
                          schema=FixedEpoch(epochs=epochs), delta=delta, sampling=p)
    for j, g in enumerate(got, start=1):
        col = max(math.sqrt(sum(c[i, t] ** 2 for i in range(j * b))) for t in range(j * b))
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        acc.compose(dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(sigma / col)), j)
        assert g.sensitivity == pytest.approx(col, rel=1e-12)
        assert g.epsilon == pytest.approx(float(acc.get_epsilon(delta)), rel=1e-9)


def test_last_prefix_is_the_whole_run() -> None:
    from mfcli.accounting.multi import deterministic
    from mfcli.model.participation import sensitivity

    c = _random_causal(np.random.default_rng(5), 9)
    got = prefix_epsilons(c, steps_per_epoch=3, setting="deterministic", sigma=2.0, schema=FixedEpoch(epochs=3))
    whole = deterministic(sigma=2.0, sensitivity=sensitivity(c, FixedEpoch(epochs=3)), n=9)
    assert got[-1].epsilon == whole.epsilon


def test_release_steps_pick_the_rows_released_so_far() -> None:
    # two releases per step: rows 2t and 2t + 1 at step t
    c = np.tril(np.ones((4, 4)))
    c2 = np.repeat(c, 2, axis=0)
    sub = prefix_strategy(c2, 2, release_steps=np.repeat(np.arange(4), 2))
    assert sub.shape == (4, 2) and np.array_equal(sub, np.repeat(c[:2, :2], 2, axis=0))


def test_refusals() -> None:
    c = np.tril(np.ones((6, 6)))
    with pytest.raises(MfcliError, match="whole number of epochs"):
        prefix_schema(FixedEpoch(epochs=3), 6, 3)
    with pytest.raises(MfcliError, match="at most"):
        prefix_strategy(c, 7)
    with pytest.raises(MfcliError, match="not causal"):
        prefix_strategy(np.ones((3, 3)), 2)
    with pytest.raises(MfcliError, match="sampling rate"):
        prefix_epsilon(c, m=2, setting="cyclic-poisson", sigma=1.0, schema=FixedEpoch(epochs=3))
    with pytest.raises(MfcliError, match="not 'mmcc'"):
        prefix_epsilon(c, m=2, setting="mmcc", sigma=1.0, schema=FixedEpoch(epochs=3))
    with pytest.raises(MfcliError, match="whole number of epochs of 4"):
        prefix_epsilons(c, steps_per_epoch=4, setting="deterministic", sigma=1.0, schema=SingleParticipation())
