"""The size limits of mfcli in one place: every largest n (number of steps) a computation accepts,
each a named constant with the reason for its value.

The limits differ because the computations differ in cost: what is O(n^3) time or O(n^2) memory
stops in the thousands, what is O(n) runs to millions. A module that enforces a limit imports it
from here; the messages name the value. Layer 0: this module imports nothing.
"""
from __future__ import annotations

#: Largest n of a dense strategy (the dense solver, a workload matrix, an n x n artifact). The
#: dense solver keeps about eight n x n float64 matrices alive (n = 8192: about 4 GiB), which is
#: what a 24 GiB machine can hold next to other work.
DENSE_MAX_N = 8192

#: Largest n for which a structured strategy (banded Toeplitz, BLT) builds its dense n x n
#: matrices (C, B, the dense operator, a dense accounting input): one n x n float64 matrix is
#: 512 MiB at n = 8192, the same memory bound as :data:`DENSE_MAX_N`. Above it a structured
#: artifact is used through its parameters only (O(n) per vector).
STRUCTURED_DENSE_MAX_N = DENSE_MAX_N

#: Largest n a structured strategy is evaluated, optimised or stored for: its routines keep a few
#: float64 vectors of length n (O(n order) time per evaluation), 80 MB each at this n.
STRUCTURED_MAX_N = 10_000_000

#: Largest n the BLT routines of :mod:`mfcli.strategies.blt` accept (their O(n) routines keep a few float64
#: vectors of length n, 800 MB each at this n; the closed forms need O(buffers) memory).
BLT_MAX_N = 10**8

#: Largest n for which ``mfcli plan`` solves the dense multi-epoch optimum (the ``dense``
#: candidate). A time limit, not a memory limit: the solver's cost grows as n^3 per iteration
#: (docs/performance.md; n = 256 took 4.7 s, 8x that per doubling, so n = 512 about 40 s), so larger
#: setups use the structured strategies, whose optimisers cost O(n b) per evaluation.
PLAN_DENSE_SOLVE_MAX_N = 512

#: Largest n for which ``mfcli plan --out`` writes a dense artifact, for the candidates that have
#: no structured form (the dense optimum, the tree, Honaker) and for DP-SGD's identity; a candidate
#: with a structured form (BandMF, banded Toeplitz, BLT) is written structured at every n, so that
#: its noise stream runs its recursion (O(b d) per step) rather than a dense history (O(t d)).
#: Why 1024: a dense artifact's stream keeps every row of Z, n floats per parameter (4 GiB for
#: 10^6 parameters at n = 1024), and costs (n - 1) / 2 multiply-adds of d floats per step.
PLAN_DENSE_ARTIFACT_MAX_N = 1024

#: Largest number of steps n = epochs x steps per epoch that ``mfcli plan`` evaluates. The cost
#: grows faster than n: at n = 10^5 (momentum, 1000 examples, batch 100) one BLT candidate's
#: optimisation took 128 s of CPU and BandMF's Poisson accounting 9 s and 0.7 GB (docs/plan.md,
#: "Limits"), so n = 10^6 already takes hours; a larger setup is refused up front.
PLAN_MAX_N = 10**6

__all__ = [
    "BLT_MAX_N",
    "DENSE_MAX_N",
    "PLAN_DENSE_ARTIFACT_MAX_N",
    "PLAN_DENSE_SOLVE_MAX_N",
    "PLAN_MAX_N",
    "STRUCTURED_DENSE_MAX_N",
    "STRUCTURED_MAX_N",
]
