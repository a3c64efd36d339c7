"""The smallest integer at which a monotone predicate holds, by bisection (with an optional
starting guess): MMCC's tail cut and compress's smallest band and rank ask the same question."""
from __future__ import annotations

from collections.abc import Callable


def smallest_true(holds: Callable[[int], bool], lo: int, hi: int, *, guess: int | None = None) -> int:
    """The smallest c in [lo, hi] with ``holds(c)``, for ``holds`` monotone (false, then true) and
    true at ``hi`` (not evaluated there).

    Plain bisection over [lo, hi], evaluating only midpoints. With ``guess``, it is evaluated first
    (clamped into [lo, hi]): where it holds and ``guess - 1`` does not, two evaluations settle it;
    otherwise the bisection goes on in the half the guess leaves, and returns what the plain
    bisection returns.

    >>> smallest_true(lambda c: c * c >= 50, 0, 10)
    8
    >>> smallest_true(lambda c: c * c >= 50, 0, 10, guess=8)
    8
    """
    if guess is not None:
        c = min(max(guess, lo), hi)
        if holds(c):
            if c == lo or not holds(c - 1):
                return c
            hi = c - 1
        else:
            lo = c + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


__all__ = ["smallest_true"]
