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

The Honaker estimators on the same encoder (prefix sums, :func:`honaker_row_norms`), from the
variances a_u of the bottom-up estimates (leaves 1; a node whose children's estimates have
variances summing to V: a_u = V / (1 + V), :func:`honaker_level_weights`):

* online: the nodes closed by step t are the complete subtrees under the minimal dyadic
  decomposition dec(t) of [0, t] (at the last step, the whole truncated tree), whose estimates are
  independent, so ||B_S[t, :]||^2 = sum_{u in dec(t)} a_u (a_root at t = n - 1).
* full (B_S = S C^+): the final estimate of a child c of p is x_c = z_c + (a_c / V_p)(x_p - z_c1 - z_c2)
  (Honaker's top-down pass). Its error is f_c = (a_c / V_p) f_p +- r_p, where r_p = e_c1 - (a_c1 / V_p)
  (e_c1 + e_c2) (e the bottom-up errors) is uncorrelated with e_c1 + e_c2, hence (Gaussian, and x_p
  uses p's subtree only through z_p) independent of f_p and of every other r: Var r_p =
  a_c1 a_c2 / V_p, f_root has variance a_root. The error of the prefix [0, t] is a sum along the path
  from leaf t to the root: walking up, E = mu f_p + R with mu = 1 at the leaf; at a parent, from a
  left child mu <- mu a_c1 / V_p and R gains mu r_p, from a right child mu <- (a_c1 + mu a_c2) / V_p
  and R gains (1 - mu) r_p (the prefix holds the whole left sibling). So ||B_S[t, :]||^2 = mu^2 a_root
  + sum over the path of (coefficient)^2 Var r_p: O(n log n), no matrix.

Under fixed-epoch participation (k epochs of b steps, pattern P_j = {j, j + b, ...}) C >= 0, so
all-plus gradients attain the sensitivity (every entry of C^T C is >= 0) and sens^2 = max_j sum_u
|u cap P_j|^2 over the nodes u, exactly, in integers (:func:`tree_fixed_epoch_sensitivity`).
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
    from mfcli.util.directed import sqrt_up

    return sqrt_up(float(tree_height(n) + 1))


def tree_rows(n: int) -> int:
    """Rows of the tree encoder restricted to n columns: sum over levels of ceil(n / 2^l)."""
    return sum(-(-n // (1 << lvl)) for lvl in range(tree_height(n) + 1))


def pole(workload: ToeplitzWorkload) -> float:
    """beta with A S^-1 = 1 / (1 - beta z), checked against the workload's filter."""
    beta = 0.0 if workload.name == "prefix" else float(workload.beta)
    # Trailing zero coefficients do not change a filter (momentum with beta = 0 is the prefix sum,
    # its denominator (1, -1, 0)): compare the filters, not the lengths of their arrays.
    den = np.trim_zeros(np.convolve([1.0, -1.0], [1.0, -beta]), "b")
    given = np.trim_zeros(np.asarray(workload.denominator, dtype=np.float64), "b")
    if (tuple(workload.numerator) != (1.0,) or given.shape != den.shape
            or not np.allclose(given, den, rtol=0, atol=1e-15)):
        raise MfcliError(f"the tree's closed-form error covers the prefix and momentum workloads, not {workload.name!r}")
    return beta


def tree_row_norms(workload: ToeplitzWorkload, n: int) -> np.ndarray:
    """||B[t, :]||^2 for t = 0 .. n-1 (the per-step error at unit sensitivity), O(n log n)."""
    import scipy.signal

    k_levels = tree_height(n)
    beta = pole(workload)
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


def honaker_level_weights(n: int) -> list[np.ndarray]:
    """a_u per level (left to right, level 0 = leaves) of the tree restricted to n columns: the
    variance of each node's bottom-up minimum-norm estimate of its total (unit noise). A leaf's is
    1; a node whose children's variances sum to V combines its own observation with their sum:
    a = V / (1 + V) (a node with one child, truncated by the end, included)."""
    a = [np.ones(n)]
    for _ in range(tree_height(n)):
        v = a[-1]
        if v.size % 2:
            v = np.append(v, 0.0)
        big_v = v.reshape(-1, 2).sum(axis=1)
        a.append(big_v / (1.0 + big_v))
    return a


def honaker_row_norms(n: int, *, online: bool) -> np.ndarray:
    """||B_S[t, :]||^2 for t = 0 .. n-1 of the Honaker estimators of the prefix sums (module
    docstring), O(n log n): ``online`` the streaming estimator (nodes closed by step t), else the
    full one (B_S = S C^+)."""
    a = honaker_level_weights(n)
    t = np.arange(n, dtype=np.int64)
    t1 = t + 1
    if online:
        out = np.zeros(n)
        for lvl in range(len(a)):
            has = ((t1 >> lvl) & 1) == 1
            pos = ((t1[has] >> (lvl + 1)) << (lvl + 1)) >> lvl
            out[has] += a[lvl][pos]
        out[-1] = a[-1][0]  # the last step closes the whole (truncated) tree
        return out
    mu = np.ones(n)
    acc = np.zeros(n)
    for lvl in range(1, len(a)):
        child = a[lvl - 1]
        parent = t >> lvl
        left = 2 * parent
        a1 = child[left]
        has2 = left + 1 < child.size
        a2 = np.where(has2, child[np.minimum(left + 1, child.size - 1)], 0.0)
        big_v = a1 + a2
        var_r = a1 * a2 / big_v
        right = ((t >> (lvl - 1)) & 1) == 1
        coef = np.where(right, 1.0 - mu, mu)
        acc += coef * coef * var_r
        mu = np.where(right, (a1 + mu * a2) / big_v, mu * a1 / big_v)
    return mu * mu * a[-1][0] + acc


def tree_fixed_epoch_sensitivity(n: int, epochs: int, *, period: int | None = None) -> tuple[int, int]:
    """(sens^2, j): the tree encoder's squared sensitivity under ``epochs`` epochs of b = n / epochs
    steps, exactly (an integer), and the first pattern P_j = {j, j + b, ...} attaining it.
    ``period``: the tree restarted every ``period`` steps (C = blockdiag of the encoder on
    ``period`` leaves, n / period blocks); None: one tree on n leaves.

    C has 0/1 entries, so C^T C >= 0 and all-plus gradient rows on a pattern give its largest value
    (mfcli.model.participation, fact 3): ||C 1_P||^2 = sum over nodes of |node cap P|^2. At level l
    the node of column p is p >> l (restarted: the block p // period, then (p mod period) >> l),
    and a pattern's columns are increasing, so its nodes at that level come in runs; a run of r
    columns adds r^2 = sum_{i<r} (2i + 1). O(n log n) integers."""
    leaves = n if period is None else period
    levels = tree_height(leaves)  # checks n >= 2
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1 or n % epochs:
        raise MfcliError(f"the number of steps n = {n} is not divisible by epochs = {epochs}")
    if n % leaves:
        raise MfcliError(f"the number of steps n = {n} is not a whole number of trees of {leaves} leaves")
    b = n // epochs
    cols = np.arange(b, dtype=np.int64)[:, None] + b * np.arange(epochs, dtype=np.int64)[None, :]
    block, within = cols // leaves, cols % leaves
    total = np.zeros(b, dtype=np.int64)
    pos = np.arange(epochs, dtype=np.int64)[None, :]
    for lvl in range(levels + 1):
        ids = block * leaves + (within >> lvl)  # node ids of distinct blocks never meet
        start = np.ones(ids.shape, dtype=bool)
        start[:, 1:] = ids[:, 1:] != ids[:, :-1]
        first = np.maximum.accumulate(np.where(start, pos, 0), axis=1)  # where each column's run starts
        total += np.sum(2 * (pos - first) + 1, axis=1)
    j = int(np.argmax(total))
    return int(total[j]), j


def tree_gram_row_sum(n: int) -> int:
    """max_i (C^T C 1)_i = max over columns i of sum_{nodes u containing i} |u| (|u| the columns of
    u, the tree truncated to n), an integer. C^T C is symmetric with non-negative entries, so its
    largest eigenvalue ||C||_2^2 is at most its largest row sum (every induced norm bounds the
    spectral radius): sqrt of this is a certified upper bound on ||C||_2 without the matrix, equal
    to it for n = 2^K (the row sums are all 2^(K+1) - 1, so 1 is the Perron vector). O(n log n)."""
    levels = tree_height(n)
    cols = np.arange(n, dtype=np.int64)
    total = np.zeros(n, dtype=np.int64)
    for lvl in range(levels + 1):
        start = (cols >> lvl) << lvl
        total += np.minimum(start + (1 << lvl), n) - start
    return int(total.max())


def tree_last_cross(n: int, beta: float) -> float:
    """sum_{t < n} beta^(n-1-t) <B_S[t, :], B_S[n-1, :]> for the tree's prefix decoder B_S: the
    inner product of row n - 1 of the momentum decoder (A S^-1 B_S, A S^-1 = 1 / (1 - beta z))
    with row n - 1 of B_S. <B_S[t], B_S[n-1]> counts the nodes the two decompositions share: at
    level l, bit l of n set and (t + 1) >> l == n >> l (module docstring: a node serves one run
    of steps). O(n log n)."""
    levels = tree_height(n)
    t1 = np.arange(1, n + 1, dtype=np.int64)
    shared = np.zeros(n)
    for lvl in range(levels + 1):
        if (n >> lvl) & 1:
            shared += (t1 >> lvl) == (n >> lvl)
    return float(np.sum(beta ** (n - t1).astype(np.float64) * shared))


def restarted_row_norms(single: np.ndarray, last: float, cross: float, beta: float, epochs: int) -> np.ndarray:
    """||B[t, :]||^2 of a tree (or a Honaker estimator) on s leaves restarted every s steps, for
    ``epochs`` epochs (n = epochs s), on the workload A = P S with P = 1 / (1 - beta z) (prefix
    sums: beta = 0). O(n).

    With B_e the prefix decoder of one tree (s x m) and D = P_s B_e the same tree's decoder for the
    workload, C = blockdiag(C_e) and B = A blockdiag(S_s^-1 B_e). Row t = E s + tau: the block of
    its own epoch E is D[tau]; the block of an earlier epoch, j = t - (ep + 1) s >= 0 steps after
    that epoch ended, is beta^(j+1) D[s-1] + g_j B_e[s-1] (g_j = sum_{k<=j} beta^k: S then holds
    the epoch's whole total, which P keeps decaying). Blocks are orthogonal (disjoint nodes), so
    ||B[t]||^2 = single[tau] + sum_{i<E} tail(tau + i s), tail(j) = beta^(2j+2) last_D
    + 2 beta^(j+1) g_j cross + g_j^2 last, from the three numbers of one tree: ``single`` =
    ||D[tau]||^2, ``last`` = ||B_e[s-1]||^2, ``cross`` = <D[s-1], B_e[s-1]> (last_D = single[-1])."""
    single = np.asarray(single, dtype=np.float64)
    s = single.size
    out = np.tile(single, epochs)
    if epochs > 1:
        j1 = np.arange(1, (epochs - 1) * s + 1, dtype=np.float64)  # j + 1
        if beta == 0.0:
            tail = np.full(j1.size, float(last))
        else:
            p = beta ** j1
            g = (1.0 - p) / (1.0 - beta)
            tail = p * p * single[-1] + 2.0 * p * g * cross + g * g * last
        out[s:] += np.cumsum(tail.reshape(epochs - 1, s), axis=0).ravel()
    return out


__all__ = ["honaker_level_weights", "honaker_row_norms", "pole", "restarted_row_norms", "tree_fixed_epoch_sensitivity",
           "tree_gram_row_sum", "tree_height", "tree_last_cross", "tree_row_norms", "tree_rows", "tree_sensitivity"]
