"""Preconditioned conjugate gradients for the truncated Newton steps of the solvers.

One loop, shared by the Newton directions of the multi-participation solvers
(:mod:`mfcli.optimize.multi_solver`, :mod:`mfcli.optimize.multi_fixed_epoch`,
:mod:`mfcli.optimize.multi_banded`): the operator, the preconditioner and
the inner product are the caller's (a projected Hessian, an approximate inverse of it, the
Frobenius or a band-weighted product), so the loop itself never sees the matrix structure.

It is truncated-Newton CG: it stops on a small preconditioned residual, on a non-positive
curvature (the operator is not positive definite along the search direction, so the Newton
model has no minimiser there) or at a step cap, and it returns the iterate reached. If it stops
before its first update, it returns the preconditioned right-hand side M b instead of zero: the
first search direction, a descent direction for a Newton caller whenever M is positive definite.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: Why :func:`pcg` stopped: ``"converged"`` the preconditioned residual norm reached ``rtol`` times
#: the initial one; ``"curvature"`` <p, A p> was not positive (or not a number); ``"breakdown"``
#: <r, M r> was negative (M not positive definite on the residual); ``"max_steps"`` the cap (the
#: residual after the last allowed step is not computed: it could only change this label).
Stop = Literal["converged", "curvature", "breakdown", "max_steps"]


def _frobenius(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.vdot(p, q))


@dataclass(frozen=True)
class PcgResult:
    """What :func:`pcg` returns: the approximate solution, the operator applications made (one
    per CG step started; the last one may have been stopped by its curvature) and why it stopped."""

    solution: np.ndarray
    steps: int
    stopped: Stop


def pcg(
    apply: Callable[[np.ndarray], np.ndarray],
    precondition: Callable[[np.ndarray], np.ndarray],
    rhs: np.ndarray,
    *,
    rtol: float,
    max_steps: int,
    dot: Callable[[np.ndarray, np.ndarray], float] = _frobenius,
) -> PcgResult:
    """Solve A x = ``rhs`` approximately by conjugate gradients preconditioned with M, from x = 0.

    Args:
        apply: x -> A x, self-adjoint under ``dot`` (positive definite where CG is to converge).
        precondition: r -> M r, M ~ A^-1, self-adjoint and positive definite under ``dot``.
        rhs: the right-hand side b (not modified); any array shape the callables accept.
        rtol: stop once the preconditioned residual norm sqrt(<r, M r>) is at most ``rtol``
            times its value at x = 0 (``rtol`` = 0: never, up to the cap).
        max_steps: CG steps (operator applications) at most.
        dot: the inner product <p, q> of the space (default the Frobenius product np.vdot).

    The iterates are those of textbook PCG (Nocedal and Wright, Algorithm 5.3); a non-positive
    curvature <p, A p> stops the loop before the step along p (truncated Newton, as in
    Steihaug's CG). Without any update the solution is M b (see the module docstring).

    >>> a = np.array([[4.0, 1.0], [1.0, 3.0]])
    >>> res = pcg(lambda x: a @ x, lambda r: r / np.diag(a), np.array([1.0, 2.0]), rtol=1e-12, max_steps=10)
    >>> res.stopped, res.steps, np.allclose(a @ res.solution, [1.0, 2.0])
    ('converged', 2, True)
    """
    if not rtol >= 0.0:
        raise ValueError(f"rtol must be non-negative, got {rtol}")
    if max_steps < 0:
        raise ValueError(f"max_steps must be non-negative, got {max_steps}")
    x = np.zeros_like(rhs)
    r = rhs.copy()
    first = precondition(r)
    rz = dot(r, first)
    if rz <= 0.0:  # M b = 0 (b = 0 included), or M is indefinite on b: no CG step is possible
        return PcgResult(first, 0, "converged" if rz == 0.0 else "breakdown")
    stop = rtol * math.sqrt(rz)
    p = first.copy()
    steps = 0
    stopped: Stop = "max_steps"
    while steps < max_steps:
        steps += 1
        ap = apply(p)
        curv = dot(p, ap)
        if not curv > 0.0:
            stopped = "curvature"
            break
        alpha = rz / curv
        x += alpha * p
        if steps == max_steps:  # the residual would only decide the label
            break
        r -= alpha * ap
        z = precondition(r)
        rz_new = dot(r, z)
        if rz_new <= 0.0 or math.sqrt(rz_new) <= stop:
            stopped = "converged" if rz_new >= 0.0 else "breakdown"
            break
        p = z + (rz_new / rz) * p
        rz = rz_new
    if steps - (stopped == "curvature") == 0:  # no update made
        x = first
    return PcgResult(x, steps, stopped)
