"""One rule per validated concept (mfcli/util/validation.py), and every caller applies the same one."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mfcli.accounting.calibrate import calibrate_sigma
from mfcli.accounting.shuffled_tree import tree_levels
from mfcli.accounting.single_pass import check_delta, check_discretization, check_sampling, check_sigma, dpsgd
from mfcli.errors import MfcliError
from mfcli.model.workloads import check_n
from mfcli.strategies.baselines import tree_nodes
from mfcli.util.validation import positive_number, step_count

BAD_TYPES = ["4", None, True, [3]]
NOT_INTEGRAL = [2.5, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("value, expected", [(1, 1), (7, 7), (3.0, 3), (np.int64(5), 5), (np.float32(2.0), 2)])
def test_step_count_accepts_integral_values(value, expected):
    got = step_count(value)
    assert got == expected and type(got) is int


@pytest.mark.parametrize("value", BAD_TYPES)
def test_step_count_wrong_types_are_type_errors(value):
    with pytest.raises(TypeError, match="n must be an integer"):
        step_count(value)


@pytest.mark.parametrize("value", [*NOT_INTEGRAL, 0, -3])
def test_step_count_bad_values_are_mfcli_errors(value):
    with pytest.raises(MfcliError, match="n must be"):
        step_count(value)


# Every caller that takes a number of steps refuses what step_count refuses (and the tree also n = 1).
STEP_CALLERS = {
    "check_n": check_n,
    "tree_nodes": tree_nodes,
    "tree_levels": tree_levels,
    "dpsgd": lambda n: dpsgd(sigma=1.0, sampling=0.1, steps=n),
}


@pytest.mark.parametrize("caller", sorted(STEP_CALLERS))
@pytest.mark.parametrize("value", [*NOT_INTEGRAL, 0, -1])
def test_every_step_count_caller_refuses_the_same_values(caller, value):
    with pytest.raises(MfcliError):
        STEP_CALLERS[caller](value)


@pytest.mark.parametrize("caller", sorted(STEP_CALLERS))
@pytest.mark.parametrize("value", BAD_TYPES)
def test_every_step_count_caller_refuses_the_same_types(caller, value):
    with pytest.raises(TypeError):
        STEP_CALLERS[caller](value)


def test_tree_needs_two_steps():
    with pytest.raises(MfcliError, match=r"binary tree needs n >= 2 steps .*, got n = 1"):
        tree_nodes(1)
    assert tree_levels(1) == 0 and tree_levels(5) == 3


# (check, upper, upper closed)
INTERVALS = [
    (check_sigma, math.inf, False),
    (check_delta, 1.0, False),
    (check_sampling, 1.0, True),
    (check_discretization, 0.1, True),
]


@pytest.mark.parametrize("check, upper, closed", INTERVALS)
@given(x=st.floats(allow_nan=True, allow_infinity=True))
def test_interval_checks_accept_exactly_their_interval(check, upper, closed, x):
    inside = x > 0 and math.isfinite(x) and (x <= upper if closed else x < upper)
    if inside:
        assert check(x) == x
    else:
        with pytest.raises(MfcliError):
            check(x)


@pytest.mark.parametrize("check, upper, closed", INTERVALS)
@pytest.mark.parametrize("value", ["abc", None, [1.0]])
def test_interval_checks_refuse_non_numbers(check, upper, closed, value):
    with pytest.raises(MfcliError, match="must be a number"):
        check(value)


@pytest.mark.parametrize(
    "upper, closed, value, message",
    [
        (math.inf, False, 0.0, "x must be positive and finite, got 0.0"),
        (1.0, False, 1.0, r"x must be in \(0, 1\), got 1.0"),
        (1.0, True, 1.5, r"x must be in \(0, 1\], got 1.5"),
        (0.1, True, -0.1, r"x must be in \(0, 0.1\], got -0.1"),
    ],
)
def test_positive_number_messages_show_the_interval(upper, closed, value, message):
    with pytest.raises(MfcliError, match=message):
        positive_number(value, "x", upper=upper, upper_closed=closed)


def test_target_epsilon_uses_the_same_rule():
    for bad in (0.0, -1.0, math.inf, math.nan, "x"):
        with pytest.raises(MfcliError, match="the target epsilon must be"):
            calibrate_sigma(lambda s: 1.0 / s, target_epsilon=bad)
