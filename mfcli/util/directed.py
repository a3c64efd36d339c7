"""Square roots rounded in a chosen direction, for the numbers a guarantee rests on.

``math.sqrt`` rounds to nearest, so sqrt(x) of a squared sensitivity can land half an ulp below
the true root; a sensitivity that is a proven upper bound must round up (an upper bound on
epsilon follows), a lower bound down. Both decide by exact integer arithmetic on the floats'
ratios, so they are right for every finite x >= 0.

>>> sqrt_up(12.0) ** 2 >= 12.0, sqrt_down(12.0) ** 2 <= 12.0
(True, True)
"""
from __future__ import annotations

import math

from mfcli.errors import MfcliError


def sqrt_up(x: float) -> float:
    """The smallest float whose square is >= x (x >= 0).

    Raises:
        MfcliError: x is not finite (a sensitivity that overflows is no sensitivity)."""
    if not math.isfinite(x):
        raise MfcliError(f"the sensitivity overflows a float (its square is {x!r}): the strategy's coefficients are too large")
    r = math.sqrt(x)
    a, b = r.as_integer_ratio()
    xa, xb = x.as_integer_ratio()
    return math.nextafter(r, math.inf) if a * a * xb < xa * b * b else r


def sqrt_down(x: float) -> float:
    """The largest float whose square is <= x (x >= 0)."""
    r = math.sqrt(x)
    a, b = r.as_integer_ratio()
    xa, xb = x.as_integer_ratio()
    return math.nextafter(r, -math.inf) if a * a * xb > xa * b * b else r


__all__ = ["sqrt_down", "sqrt_up"]
