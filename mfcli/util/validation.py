"""The validation rules several modules share, each written once: a number of steps, a positive
number in an interval (sigma, delta, a sampling rate, a discretization, a sensitivity, a target
epsilon), a positive integer count, and a name from a fixed set of choices.

Messages name the parameter as the library knows it (``n``, ``sigma``, ``delta``); the CLI maps a
parameter to its flag where the user needs that. Wrong types (a string, None, a bool for a count)
are ``TypeError``; a value of the right type out of range is :class:`~mfcli.errors.MfcliError`
(a ``ValueError``).

numpy scalars are numbers (``numbers.Integral``, ``numbers.Real``), so this module needs no numpy
and the CLI's option parsing can use it without loading numpy.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

from mfcli.errors import MfcliError

#: The largest count (steps, epochs, bands, examples, parameters) mfcli accepts: 2^53, the largest
#: integer up to which every integer is a float. Counts enter float arithmetic (n / b, q = batch /
#: examples, sqrt(k)); past 2^53 that arithmetic is inexact and past about 10^308 it raises
#: OverflowError, so a larger count is refused here, by one rule, before any arithmetic.
MAX_COUNT = 2**53


def shown_integer(value: int) -> str:
    """``value`` for a message: in full up to 20 digits, else its first and last digits and its
    length (a 400-digit number must not fill the terminal)."""
    digits = str(abs(value))
    sign = "-" if value < 0 else ""
    return sign + (digits if len(digits) <= 20 else f"{digits[:8]}...{digits[-4:]} ({len(digits)} digits)")


def _shown(value: Any) -> str:
    return shown_integer(int(value)) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else repr(value)


def check_count_size(value: int, what: str) -> int:
    """``value`` if its magnitude is at most :data:`MAX_COUNT`; else MfcliError naming ``what``."""
    if abs(int(value)) > MAX_COUNT:
        raise MfcliError(f"{what} = {shown_integer(int(value))} is too large; counts are at most 2^53 = {MAX_COUNT}")
    return int(value)


def step_count(n: Any, *, name: str = "n", minimum: int = 1, too_few: str | None = None) -> int:
    """A number of steps: an int (or an integral float) of at least ``minimum``.

    ``too_few`` replaces the message for a value below ``minimum`` (``", got n = N"`` is appended).

    Raises:
        TypeError: a bool or a non-number.
        MfcliError: not integral (2.5, NaN, inf), below ``minimum`` or above :data:`MAX_COUNT`.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(f"{name} must be an integer, got {type(n).__name__}")
    # an int is checked as an int: float() of one past 10^308 raises OverflowError
    value: Any = n  # a numbers.Real: int() and float() apply (typeshed's Real has no __int__)
    if not isinstance(value, numbers.Integral) and (not math.isfinite(float(value)) or int(value) != value):
        raise MfcliError(f"{name} must be an integer, got {n!r}")
    count = check_count_size(int(value), name)
    if count < minimum:
        raise MfcliError(f"{too_few}, got {name} = {count}" if too_few else f"{name} must be at least {minimum}, got {count}")
    return count


def positive_int(value: Any, what: str) -> int:
    """``value`` as an int if it is a positive integer (a bool is not) of at most :data:`MAX_COUNT`;
    else MfcliError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise MfcliError(f"{what} must be a positive integer, got {_shown(value)}")
    return check_count_size(int(value), what)


def positive_number(value: Any, what: str, *, upper: float = math.inf, upper_closed: bool = False) -> float:
    """A finite number in (0, upper) (``upper_closed``: (0, upper]), as a float.

    Raises:
        MfcliError: not a number, not finite, or outside the interval (the message shows it).
    """
    try:
        x = float(value)
    except OverflowError:  # an int past float range (10**400)
        x = math.inf
    except (TypeError, ValueError):
        raise MfcliError(f"{what} must be a number, got {value!r}") from None
    inside = x > 0 and math.isfinite(x) and (x <= upper if upper_closed else x < upper)
    if not inside:
        if math.isinf(upper):
            raise MfcliError(f"{what} must be positive and finite, got {_shown(value)}")
        raise MfcliError(f"{what} must be in (0, {upper:g}{']' if upper_closed else ')'}, got {_shown(value)}")
    return x




def one_of(value: Any, choices: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``choices``; else MfcliError ``unknown <what> 'x'; choose from ...``."""
    if value not in choices:
        raise MfcliError(f"unknown {what} {value!r}; choose from {', '.join(choices)}")
    return str(value)


def regular_file(path: Any, what: str = "file") -> Any:
    """``path`` as a :class:`pathlib.Path` if it names a regular file (a symbolic link to one
    resolves as usual); else :class:`~mfcli.errors.ArtifactError` saying what it is instead.

    Why: opening a FIFO blocks until some writer opens it (every reader hung on one), and a
    character device such as /dev/zero or /dev/urandom never ends. The check is an ``os.stat``,
    which neither opens nor blocks. Every reader of a file named by a user calls this before
    opening it (the artifact readers, the checkpoint and matrix readers).

    Raises:
        ArtifactError: the path does not exist, is a directory, or is not a regular file.
    """
    import os
    import stat
    from pathlib import Path

    from mfcli.errors import ArtifactError

    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise ArtifactError(f"{what} {p} does not exist") from None
    except OSError as exc:
        raise ArtifactError(f"{what} {p} cannot be examined: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return p
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "not a regular file")
    raise ArtifactError(f"{what} {p} is {kind}; give a regular file")



__all__ = ["MAX_COUNT", "check_count_size", "one_of", "positive_int", "positive_number",
           "regular_file", "shown_integer", "step_count"]
