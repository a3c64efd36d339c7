"""The validation rules several modules share, each written once: a number of steps, a positive
number in an interval (sigma, delta, a sampling rate, a discretization, a sensitivity, a target
epsilon), a positive integer count, and a name from a fixed set of choices.

Messages name the parameter as the library knows it (``n``, ``sigma``, ``delta``); the CLI maps a
parameter to its flag where the user needs that. Wrong types (a string, None, a bool for a count)
are ``TypeError``; a value of the right type out of range is :class:`~mfcli.errors.MfcliError`
(a ``ValueError``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from mfcli.errors import MfcliError


def step_count(n: Any, *, name: str = "n", minimum: int = 1, too_few: str | None = None) -> int:
    """A number of steps: an int (or an integral float) of at least ``minimum``.

    ``too_few`` replaces the message for a value below ``minimum`` (``", got n = N"`` is appended).

    Raises:
        TypeError: a bool or a non-number.
        MfcliError: not integral (2.5, NaN, inf) or below ``minimum``.
    """
    if isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be an integer, got {type(n).__name__}")
    if not math.isfinite(float(n)) or int(n) != n:
        raise MfcliError(f"{name} must be an integer, got {n!r}")
    count = int(n)
    if count < minimum:
        raise MfcliError(f"{too_few}, got {name} = {count}" if too_few else f"{name} must be at least {minimum}, got {count}")
    return count


def positive_int(value: Any, what: str) -> int:
    """``value`` as an int if it is a positive integer (a bool is not); else MfcliError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise MfcliError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def positive_number(value: Any, what: str, *, upper: float = math.inf, upper_closed: bool = False) -> float:
    """A finite number in (0, upper) (``upper_closed``: (0, upper]), as a float.

    Raises:
        MfcliError: not a number, not finite, or outside the interval (the message shows it).
    """
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise MfcliError(f"{what} must be a number, got {value!r}") from None
    inside = x > 0 and math.isfinite(x) and (x <= upper if upper_closed else x < upper)
    if not inside:
        if math.isinf(upper):
            raise MfcliError(f"{what} must be positive and finite, got {value!r}")
        raise MfcliError(f"{what} must be in (0, {upper:g}{']' if upper_closed else ')'}, got {value!r}")
    return x


__all__ = ["positive_number", "step_count"]


def one_of(value: Any, choices: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``choices``; else MfcliError ``unknown <what> 'x'; choose from ...``."""
    if value not in choices:
        raise MfcliError(f"unknown {what} {value!r}; choose from {', '.join(choices)}")
    return str(value)
