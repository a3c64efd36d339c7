"""The binary-tree strategy's error at any n without an n x n matrix (``mfcli compare`` above the
dense limit): O(n log n) time, O(n) memory.

The tree (:mod:`mfcli.strategies.baselines`, ``tree``): C the binary-tree encoder on n' = 2^K >= n leaves
restricted to n columns (sensitivity sqrt(K + 1) under single participation, every column in K + 1
nodes), B_S row s the indicator of the minimal dyadic decomposition of [0, s], and for a Toeplitz
workload A (prefix or momentum) B = A S^-1 B_S. Here A S^-1 is the Toeplitz matrix of
a(z) (1 - z) = 1 / (1 - beta z) (beta = 0 for prefix sums), so B[t, u] = sum_{s <= t, u in dec(s)}
beta^(t - s).

Which steps use a node. The decomposition of [0, s] uses one level-l node for each set bit l of
s + 1: node u at level l with interval [2q 2^l, (2q + 1) 2^l - 1] (always complete, since it ends
at or before s) is used exactly for s + 1 in [(2q + 1) 2^l, (2q + 2) 2^l - 1]: one
contiguous run of 2^l steps, and the runs of one level are disjoint. So at step t at most one node
per level is *active* (bit l of t + 1 set), with B[t, u] = sum_{i <= k} beta^i, k = (t + 1) mod 2^l;
a node whose run ended at r (t + 2 divisible by 2^(l+1)) keeps B[t, u] = beta^(t - r) B[r, u]. The
per-step squared norm ||B[t, :]||^2 = (active part) + F_t with F_{t+1} = beta^2 (F_t + G_t), G_t
the squares of the nodes whose run ends at t. Prefix sums: ||B[t, :]||^2 = popcount(t + 1).
Tested against the dense tree's B to 1e-9 relative (n = 64 .. 1024, powers of two and not).
"""
from __future__ import annotations

import numpy as np

from mfcli.errors import MfcliError
from mfcli.strategies.toeplitz import ToeplitzWorkload, check_n


def tree_height(n: int) -> int:
    """K = ceil(log2 n): the tree has K + 1 levels and every column lies in K + 1 nodes."""
    n = check_n(n)
    if n < 2:
        raise MfcliError("a binary tree needs n >= 2 steps (with one step the tree is the identity strategy)")
    return (n - 1).bit_length()


def tree_sensitivity(n: int) -> float:
    """Single-participation sensitivity of the tree encoder: sqrt(K + 1) (each column has K + 1
    ones), rounded up so that the float is never below the true value."""
    from mfcli.strategies.toeplitz import sqrt_up

    return sqrt_up(float(tree_height(n) + 1))


def tree_rows(n: int) -> int:
    """Rows of the tree encoder restricted to n columns: sum over levels of ceil(n / 2^l)."""
    return sum(-(-n // (1 << lvl)) for lvl in range(tree_height(n) + 1))


def _pole(workload: ToeplitzWorkload) -> float:
    """beta with A S^-1 = 1 / (1 - beta z), checked against the workload's filter."""
    beta = 0.0 if workload.name == "prefix" else float(workload.beta)
    den = np.convolve([1.0, -1.0], [1.0, -beta]) if beta else np.array([1.0, -1.0])
    if tuple(workload.numerator) != (1.0,) or not np.allclose(np.asarray(workload.denominator), den, rtol=0, atol=1e-15):
        raise MfcliError(f"the tree's closed-form error covers the prefix and momentum workloads, not {workload.name!r}")
    return beta


def tree_row_norms(workload: ToeplitzWorkload, n: int) -> np.ndarray:
    """||B[t, :]||^2 for t = 0 .. n-1 (the per-step error at unit sensitivity), O(n log n)."""
    import scipy.signal

    k_levels = tree_height(n)
    beta = _pole(workload)
    t1 = np.arange(1, n + 1, dtype=np.int64)  # t + 1
    active: np.ndarray = np.zeros(n)
    ending: np.ndarray = np.zeros(n)
    for lvl in range(k_levels + 1):
        on = ((t1 >> lvl) & 1) == 1
        k = t1 & ((1 << lvl) - 1)  # position in the run: k + 1 terms of the geometric sum
        v: np.ndarray
        if beta == 0.0:
            v = np.ones(n)
            full = 1.0
        else:
            v = (1.0 - beta ** (k + 1.0)) / (1.0 - beta)
            full = (1.0 - beta ** float(1 << lvl)) / (1.0 - beta)
        active += np.where(on, v * v, 0.0)
        ends = ((t1 + 1) % (1 << (lvl + 1))) == 0  # the run of this level ends at t
        ending += np.where(ends, full * full, 0.0)
    if beta == 0.0:
        return active
    # F_t = beta^2 (F_{t-1} + G_{t-1}), F_0 = 0
    shifted = np.concatenate([[0.0], ending[:-1]])
    finished = scipy.signal.lfilter([beta * beta], [1.0, -beta * beta], shifted)
    return active + finished


__all__ = ["tree_height", "tree_row_norms", "tree_rows", "tree_sensitivity"]
