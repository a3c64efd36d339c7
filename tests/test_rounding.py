"""Printed privacy numbers (mfcli.cli.rounding.pessimistic): never on the optimistic side of the
computed float (the printed decimal, read back as a float, is >= it when rounding up, <= when
rounding down), at most one unit in the last printed digit away, and a float that has at most 6
significant digits prints as itself. Oracle: the printed text read back (float and Decimal)."""
from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mfcli.cli.rounding import pessimistic


@pytest.mark.parametrize("value, down, expected", [
    (0.1, False, "0.1"),
    (4.0, True, "4"),
    (1.0, False, "1"),
    (1.0000000000000002, False, "1.00001"),   # just above 1: rounding up must show it
    (0.9999999999999999, True, "0.999999"),   # just below 1: rounding down must show it
    (3.999991277791487, False, "4"),
    (3.999991277791487, True, "3.99999"),
    (7.993431, False, "7.99344"),
    (123456.5, False, "123457"),
    (999999999999.998, True, "9.99999e+11"),   # log10 rounds to 12.0 here: still 6 digits
])
def test_table(value: float, down: bool, expected: str) -> None:
    assert pessimistic(value, down=down) == expected


@given(st.floats(min_value=1e-12, max_value=1e12, allow_nan=False), st.booleans())
def test_never_optimistic_and_tight(value: float, down: bool) -> None:
    text = pessimistic(value, down=down)
    assert (float(text) <= value) if down else (float(text) >= value)
    # at most one unit in the sixth significant digit away (plus the float's own representation error)
    printed, exact = Decimal(text), Decimal(value)
    unit = Decimal(10) ** (exact.adjusted() - 5)
    assert abs(printed - exact) <= unit * Decimal("1.000001")
    if float(f"{value:.6g}") == value:
        assert float(text) == value
