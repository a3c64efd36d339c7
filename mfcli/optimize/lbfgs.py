"""The L-BFGS machinery of the certified primal solvers, shared by the dense iterate of
:mod:`mfcli.optimize.multi_solver` and the band storage of :mod:`mfcli.optimize.multi_banded`.

Each solver supplies its own storage through a few callables (the inner product, the initial
inverse Hessian, f on a trial point); what is common is written here once: the two-loop
recursion over the (s, y) memory, the Armijo backtracking line search, and the bookkeeping of
the dual certificates (the best bound so far, the relative gap, the :class:`~mfcli.optimize.dense.Progress`
history and its callback). Nothing here changes the arithmetic of either solver: each operation
is the one both solvers did before they shared it, in the same order.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from mfcli.optimize.dense import Progress

#: L-BFGS history length (pairs of iterates), capped by MEMORY_BYTES. Measured at n = 256
#: (prefix, 16 epochs / 16 bands): 30 pairs took 220 / 140 iterations, 10 pairs 320 / 170.
MEMORY = 30
MEMORY_BYTES = 1.5e9
#: Armijo sufficient-decrease constant.
ARMIJO = 1e-4
#: Step halvings at most in one line search: past them no decrease is possible at this precision.
BACKTRACKS = 60

Dot = Callable[[np.ndarray, np.ndarray], float]
F = TypeVar("F")  # what f leaves for the gradient (factors), None where the point is refused


def memory_size(entries: int) -> int:
    """L-BFGS pairs to keep for an n x n problem of ``entries`` = n^2 matrix entries (two float64
    n x n matrices a pair, at least 5, at most MEMORY)."""
    return max(5, min(MEMORY, int(MEMORY_BYTES / (16 * entries))))


class Memory:
    """The last ``size`` curvature pairs (s, y) = (x_new - x, g_new - g) of an L-BFGS solve under
    the inner product ``dot`` (Frobenius for dense matrices; band storage counts each
    off-diagonal entry twice)."""

    def __init__(self, size: int, dot: Dot) -> None:
        self.size = size
        self.dot = dot
        self.ss: list[np.ndarray] = []
        self.ys: list[np.ndarray] = []

    def clear(self) -> None:
        self.ss.clear()
        self.ys.clear()

    def push(self, s: np.ndarray, y: np.ndarray) -> None:
        """Keep the pair if its curvature <s, y> is positive (else H would lose definiteness)."""
        if self.dot(s, y) > 1e-300:
            self.ss.append(s)
            self.ys.append(y)
            if len(self.ss) > self.size:
                self.ss.pop(0)
                self.ys.pop(0)

    def direction(
        self, g: np.ndarray, h0: Callable[[np.ndarray], np.ndarray], curvature: Callable[[np.ndarray], float],
        gamma0: Callable[[np.ndarray], float],
    ) -> np.ndarray:
        """The L-BFGS direction -H g (two-loop recursion) with the initial inverse Hessian
        gamma h0, gamma = <s, y> / <y, h0(y)> of the newest pair (``curvature(y)`` gives the
        denominator, which a solver may compute more cheaply than h0(y)) or, with no pair yet,
        ``gamma0(h0(q))``."""
        q = g.copy()
        alphas = []
        for s, y in zip(reversed(self.ss), reversed(self.ys), strict=True):
            rho = 1.0 / self.dot(y, s)
            alpha = rho * self.dot(s, q)
            q -= alpha * y
            alphas.append((rho, alpha, s, y))
        r = h0(q)
        gamma = self.dot(self.ss[-1], self.ys[-1]) / curvature(self.ys[-1]) if self.ss else gamma0(r)
        q = r * gamma
        for rho, alpha, s, y in reversed(alphas):
            beta = rho * self.dot(y, q)
            q += (alpha - beta) * s
        return -q


def backtrack(
    value: Callable[[np.ndarray], tuple[float, F | None]], x: np.ndarray, d: np.ndarray, f: float, slope: float,
    armijo: float = ARMIJO,
) -> tuple[np.ndarray, float, F] | None:
    """Armijo backtracking from step 1, halving: the first x + t d where f is defined (``value``
    returns factors, not None) and f(x + t d) <= f + armijo t slope, with f and its factors;
    None after BACKTRACKS halvings (the round-off floor)."""
    step = 1.0
    for _ in range(BACKTRACKS):
        x_new = x + step * d
        f_new, factors = value(x_new)
        if factors is not None and f_new <= f + armijo * step * slope:
            return x_new, f_new, factors
        step *= 0.5
    return None


class Certificates:
    """The certified side of one primal solve: the best dual bound of f so far and the history of
    :class:`~mfcli.optimize.dense.Progress` events, reported in the schema's units (f and the bound
    times ``scale``, the squared sensitivity per unit of the constraint)."""

    def __init__(self, scale: float, callback: Callable[[Progress], None] | None, start: float) -> None:
        self.scale = scale
        self.callback = callback
        self.start = start
        self.best = -math.inf
        self.history: list[Progress] = []

    def add(self, bound: float) -> None:
        """A dual bound that is kept if it is the best, without an event."""
        self.best = max(self.best, bound)

    def record(self, iteration: int, f: float, bound: float, method: str, *, report: bool = True) -> float:
        """Keep ``bound`` if it is the best, append the event (passed to the callback when
        ``report``) and return the relative gap (f - best) / f."""
        self.add(bound)
        gap = (f - self.best) / f
        prog = Progress(iteration, f * self.scale, self.best * self.scale, gap, time.perf_counter() - self.start, method)
        self.history.append(prog)
        if report and self.callback is not None:
            self.callback(prog)
        return gap
