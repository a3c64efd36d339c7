"""Baseline strategies and the optimum as first-class objects (docs/concepts.md, docs/compare.md).

Each strategy is a factorization A = B C of the workload A, where C (the encoder, m x n) is what the
mechanism privatises (C G + Z) and B (the decoder, n x m) turns the noisy encodings into the
released quantities A G + B Z.

========================  ======================================================  ========
name                      construction                                            causal
========================  ======================================================  ========
``identity``              C = I, B = A (DP-SGD's independent noise)                yes
``tree``                  C = binary-tree encoder, B_S row t = minimal dyadic      yes
                          decomposition of [0, t]
``honaker-online``        tree encoder; B_S row t = minimum-norm solution of       yes
                          B_t C = S_t over the nodes closed by step t
``honaker-full``          tree encoder; B_S = S C^+ (uses nodes that close later)  no
``sqrt``                  C = B_S = S^1/2, Toeplitz coefficients binom(2k,k)/4^k   yes
``optimal``               the certified solver, or a stored artifact               yes
========================  ======================================================  ========

The prefix-sum strategies (all but ``identity`` and ``optimal``) factor the prefix-sum matrix S as
S = B_S C_S. For any other workload A they are applied by post-processing the prefix sums:
B = A S^-1 B_S, so that B C_S = A S^-1 S = A; the optimal direct factorization of A must beat them.

Tree layout. For n steps the tree is built on n' = 2^K >= n leaves (K = ceil(log2 n)) and restricted
to the first n columns; nodes whose interval starts at or after n are dropped, and a node whose
interval runs past the end is truncated to [start, n - 1] (it still counts towards the sensitivity,
which is K + 1 for every n). The rows of C are in RELEASE ORDER: a node is released at the step at
which its (truncated) interval closes; at each step the leaf comes first, then the ancestors that
close at the same step, bottom-up. ``release_steps[i]`` is the step at which row i is released;
truncated nodes close at the last step n - 1. Causality means C[i, j] = 0 for j > release_steps[i]
and B[t, i] = 0 for release_steps[i] > t.

Example:
    >>> s = build_strategy("tree", np.tril(np.ones((4, 4))))
    >>> round(s.factorization.loss_total, 9)   # (k+1)(k 2^(k-1) + 1) for n = 2^k, k = 2
    15.0
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse

from mfcli.errors import MfcliError
from mfcli.model.factorization import RECONSTRUCTION_RTOL, Factorization
from mfcli.model.kinds import BASELINES, TREE_BASELINES
from mfcli.model.kinds import DESCRIPTIONS as KIND_DESCRIPTIONS
from mfcli.model.workloads import Workload, check_workload_matrix
from mfcli.util.validation import step_count

#: The baseline names (:data:`mfcli.model.kinds.BASELINES`, the one registry).
STRATEGY_NAMES = BASELINES

#: Strategies built on the binary tree (m = 2n' - 1 rows at most, non-square C).
TREE_STRATEGIES = TREE_BASELINES

#: {name: description} of the baselines, from the registry.
DESCRIPTIONS = {name: KIND_DESCRIPTIONS[name] for name in BASELINES}


@dataclass(frozen=True, eq=False)
class Strategy:
    """A named factorization of a workload.

    Attributes:
        name: one of :data:`STRATEGY_NAMES` (or the stored name of an artifact's strategy).
        factorization: A = B C with A the workload the strategy was built for.
        causal: whether B and C are lower-triangular in release order (streamable).
        description: one line saying how it was built.
        release_steps: length m; row i of C is released at step release_steps[i].
        source: the artifact a stored strategy was read from, else None.
        solver: the solver certificate (gap, iterations, ...) for ``optimal``, else None.
        is_tree: C is the binary-tree encoder (the tree kinds' builders say so; a stored strategy
            does not claim it, the safe side: the tree's own accounting settings then do not apply).
    """

    name: str
    factorization: Factorization
    causal: bool
    description: str
    release_steps: np.ndarray | None = None
    source: str | None = None
    solver: Mapping[str, Any] | None = field(default=None, repr=False)
    is_tree: bool = False

    def __post_init__(self) -> None:
        r = self.release_steps
        if r is None:
            if self.factorization.m != self.factorization.n:
                raise MfcliError(f"strategy {self.name!r} has a non-square C and needs release steps")
            r = np.arange(self.factorization.n)
        r = np.array(r, dtype=np.int64)
        if r.shape != (self.factorization.m,):
            raise MfcliError(f"strategy {self.name!r}: {r.shape[0]} release steps for {self.factorization.m} rows")
        r.setflags(write=False)
        object.__setattr__(self, "release_steps", r)


# ---------------------------------------------------------------------------------------------
# The binary tree


class TreeNodes(NamedTuple):
    """The nodes of the padded binary tree restricted to n columns, in release order.

    All arrays have one entry per node (row of C). ``start`` and ``end`` are the first and last
    column of the node's truncated interval, ``end`` is also its release step; ``parent`` is the
    row index of the parent node (-1 at the root); ``by_level[l]`` lists the rows of level l in
    left-to-right order (the children of by_level[l][q] are by_level[l-1][2q] and [2q+1]).
    """

    level: np.ndarray
    start: np.ndarray
    end: np.ndarray
    complete: np.ndarray
    parent: np.ndarray
    by_level: tuple[np.ndarray, ...]


def _check_tree_n(n: int) -> int:
    return step_count(
        n, minimum=2, too_few="a binary tree needs n >= 2 steps (with one step the tree is the identity strategy)"
    )


def tree_nodes(n: int) -> TreeNodes:
    """Nodes of the binary tree on n' = 2^ceil(log2 n) leaves, restricted to the first n columns,
    in release order (sorted by release step, then bottom-up). Raises MfcliError for n < 2."""
    n = _check_tree_n(n)
    k = (n - 1).bit_length()  # n' = 2^k >= n
    levels, starts, ends, full = [], [], [], []
    for lvl in range(k + 1):
        width = 1 << lvl
        count = -(-n // width)  # nodes at this level whose interval starts before n
        p = np.arange(count)
        s = p * width
        e_full = s + width - 1
        levels.append(np.full(count, lvl))
        starts.append(s)
        ends.append(np.minimum(e_full, n - 1))
        full.append(e_full <= n - 1)
    level = np.concatenate(levels)
    start = np.concatenate(starts)
    end = np.concatenate(ends)
    complete = np.concatenate(full)
    order = np.lexsort((level, end))  # by release step, then bottom-up
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    # Row indices of each level in left-to-right order.
    offsets = np.cumsum([0] + [len(x) for x in levels])
    by_level = tuple(rank[offsets[lvl]:offsets[lvl + 1]] for lvl in range(k + 1))
    parent = np.full(order.size, -1, dtype=np.int64)
    for lvl in range(k):
        child_rows = by_level[lvl]
        parent[child_rows] = by_level[lvl + 1][np.arange(child_rows.size) // 2]
    level, start, end, complete = level[order], start[order], end[order], complete[order]
    for arr in (level, start, end, complete, parent, *by_level):
        arr.setflags(write=False)
    return TreeNodes(level, start, end, complete, parent, by_level)


def tree_release_steps(n: int) -> np.ndarray:
    """Release step of each row of :func:`tree_strategy_matrix` (its last column)."""
    return tree_nodes(n).end.copy()


def tree_strategy_matrix(n: int) -> np.ndarray:
    """The binary-tree encoder C: one 0/1 row per node, C[i, j] = 1 if column j lies in node i.

    Built on n' = 2^ceil(log2 n) leaves (2n' - 1 nodes) and restricted to the first n columns;
    rows that become all zero are dropped, rows of nodes that run past the end are kept truncated.

    Row order is the RELEASE ORDER: node i is released at the step its interval closes
    (:func:`tree_release_steps`); within a step the leaf comes first, then its ancestors that close
    at the same step, bottom-up. So C is "lower-triangular in release order": row i uses only
    columns up to its release step. For n = 2 the rows are [1, 0], [0, 1], [1, 1].

    Formal guarantees: every column has exactly K + 1 ones (K = ceil(log2 n)), so the
    single-participation sensitivity is sqrt(K + 1).
    """
    nodes = tree_nodes(n)
    cols = np.arange(n)
    c = (cols[None, :] >= nodes.start[:, None]) & (cols[None, :] <= nodes.end[:, None])
    return c.astype(np.float64)


def _tree_sparse(nodes: TreeNodes, n: int) -> scipy.sparse.csr_matrix:
    lengths = nodes.end - nodes.start + 1
    rows = np.repeat(np.arange(nodes.start.size), lengths)
    cols = np.concatenate([np.arange(s, e + 1) for s, e in zip(nodes.start, nodes.end, strict=True)])
    import scipy.sparse  # here: `mfcli compare --help` imports this module and needs no scipy

    return scipy.sparse.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(nodes.start.size, n))


def tree_decoder(n: int) -> np.ndarray:
    """B_S for the plain tree: row t is the indicator of the minimal dyadic decomposition of [0, t]
    into complete nodes (one node per set bit of t + 1), so B_S C = S with C from
    :func:`tree_strategy_matrix`. Truncated nodes are never used."""
    nodes = tree_nodes(n)
    b = np.zeros((n, nodes.start.size))
    t1 = np.arange(1, n + 1)
    for lvl, rows in enumerate(nodes.by_level):
        has = (t1 >> lvl) & 1 == 1
        # The level-lvl block of t + 1 starts at (t + 1) with bits 0..lvl cleared.
        pos = ((t1[has] >> (lvl + 1)) << (lvl + 1)) >> lvl
        b[np.nonzero(has)[0], rows[pos]] = 1.0
    return b


def _honaker_weights(nodes: TreeNodes) -> np.ndarray:
    """Bottom-up variances of the minimum-norm estimate of each node's total from its subtree.

    A leaf's estimate is its own observation (variance 1). A node with children of estimate
    variances v_c combines its observation (variance 1) with the sum of the children's estimates
    (variance V = sum v_c); the minimum-norm weight on its own observation is a = V / (1 + V), and
    the combined variance is a^2 + (1 - a)^2 V = V / (1 + V) = a. So one array holds both.
    """
    a = np.ones(nodes.start.size)
    for lvl in range(1, len(nodes.by_level)):
        child = nodes.by_level[lvl - 1]
        v = a[child]
        if v.size % 2:
            v = np.append(v, 0.0)
        big_v = v.reshape(-1, 2).sum(axis=1)
        a[nodes.by_level[lvl]] = big_v / (1.0 + big_v)
    return a


def honaker_online_decoder(n: int) -> np.ndarray:
    """B_S for streaming Honaker: row t is the minimum-norm b with b C = S_t using only the nodes
    closed by step t (the constrained pseudo-inverse, S_t C_t^+ with C_t the closed rows).

    The closed nodes at step t form complete subtrees rooted at the minimal dyadic decomposition of
    [0, t] (at the last step, the whole truncated tree). The minimum-norm estimate of a subtree's
    total is the bottom-up recursion of :func:`_honaker_weights`: node u gets weight a_u times
    (1 - a_w) for every ancestor w inside the subtree. Hence, in closed form,

        B_S[t, u] = a_u * prod_{w strict ancestor of u, w closed by t} (1 - a_w)   (u closed by t)

    which is computed for all t at once as a cumulative product down the rows: O(n m) time and
    memory, no pseudo-inverse.
    """
    nodes = tree_nodes(n)
    a = _honaker_weights(nodes)
    m = a.size
    cols = np.arange(m)
    factors = np.ones((n, m))
    factors[nodes.end, cols] = a
    anc = nodes.parent.copy()
    while np.any(anc >= 0):
        has = anc >= 0
        factors[nodes.end[anc[has]], cols[has]] *= 1.0 - a[anc[has]]
        anc = np.where(has, nodes.parent[np.maximum(anc, 0)], -1)
    b = np.cumprod(factors, axis=0)
    b[np.arange(n)[:, None] < nodes.end[None, :]] = 0.0
    return b


def honaker_full_pinv(n: int) -> np.ndarray:
    """C^+ for the tree encoder (n x m), the least-squares leaf estimates, by Honaker's two passes.

    Bottom-up, z_u = a_u y_u + (1 - a_u) sum_c z_c estimates node u's total from its subtree with
    variance a_u. Top-down, the root's estimate is final and each child's estimate is corrected by
    its share of the parent's residual: x_c = z_c + (a_c / V_p) (x_p - sum_c' z_c'), with V_p the
    sum of the children's variances. Both passes are applied to all m unit observations at once
    (rows of an m x m array), O(m^2) work; the leaves' rows, in column order, are C^+.
    """
    nodes = tree_nodes(n)
    a = _honaker_weights(nodes)
    m = a.size
    z = np.zeros((m, m))
    z[nodes.by_level[0], nodes.by_level[0]] = 1.0

    def child_sum(lvl: int) -> np.ndarray:
        zc = z[nodes.by_level[lvl - 1]]
        if zc.shape[0] % 2:
            zc = np.vstack([zc, np.zeros((1, m))])
        return zc.reshape(-1, 2, m).sum(axis=1)

    def child_var(lvl: int) -> np.ndarray:
        v = a[nodes.by_level[lvl - 1]]
        if v.size % 2:
            v = np.append(v, 0.0)
        return v.reshape(-1, 2).sum(axis=1)

    top = len(nodes.by_level) - 1
    for lvl in range(1, top + 1):
        rows = nodes.by_level[lvl]
        z[rows] = (1.0 - a[rows])[:, None] * child_sum(lvl)
        z[rows, rows] += a[rows]
    # Top-down: overwrite z with the final estimates, level by level.
    for lvl in range(top, 0, -1):
        resid = z[nodes.by_level[lvl]] - child_sum(lvl)
        big_v = child_var(lvl)
        child = nodes.by_level[lvl - 1]
        par = np.arange(child.size) // 2
        z[child] += (a[child] / big_v[par])[:, None] * resid[par]
    return z[nodes.by_level[0]].copy()


def honaker_full_decoder(n: int) -> np.ndarray:
    """B_S = S C^+ for the tree encoder (offline: row t uses nodes that close after t)."""
    return np.cumsum(honaker_full_pinv(n), axis=0)


# ---------------------------------------------------------------------------------------------
# The square root of the prefix-sum matrix


def sqrt_coefficients(n: int) -> np.ndarray:
    """c_k = binom(2k, k) / 4^k for k < n, by the recurrence c_k = c_{k-1} (2k - 1) / (2k).

    These are the Taylor coefficients of (1 - x)^(-1/2), so the Toeplitz matrix they generate
    squares to S. The recurrence never forms a factorial (no overflow, relative error O(k eps)).
    """
    if n < 1:
        raise MfcliError(f"n must be at least 1, got {n}")
    k = np.arange(1, n)
    ratios = (2 * k - 1) / (2 * k)
    return np.concatenate([[1.0], np.cumprod(ratios)])


def sqrt_strategy_matrix(n: int) -> np.ndarray:
    """S^1/2: lower-triangular Toeplitz matrix with first column :func:`sqrt_coefficients`.

    Formal guarantees: sens^2 = sum_k c_k^2 (the first column is the longest), and
    S^1/2 S^1/2 = S.
    """
    c = sqrt_coefficients(n)
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return np.where(diff >= 0, c[np.clip(diff, 0, None)], 0.0)


# ---------------------------------------------------------------------------------------------
# Building strategies for a workload


def prefix_postprocessor(workload: np.ndarray) -> np.ndarray | None:
    """M = A S^-1 (column differences of A), or None when A is exactly S (M = I)."""
    a = np.asarray(workload, dtype=np.float64)
    n = a.shape[0]
    if np.array_equal(a, np.tril(np.ones((n, n)))):
        return None
    m = a.copy()
    m[:, :-1] -= a[:, 1:]
    return m


def is_causal_in_release_order(*, strategy: np.ndarray, decoder: np.ndarray, release_steps: np.ndarray) -> bool:
    """True if row i of C uses only columns <= release_steps[i] and row t of B uses only rows of C
    released by step t: the mechanism can then be run as a stream."""
    c = np.asarray(strategy)
    b = np.asarray(decoder)
    r = np.asarray(release_steps)
    cols = np.arange(c.shape[1])
    steps = np.arange(b.shape[0])
    future_cols = cols[None, :] > r[:, None]
    future_rows = r[None, :] > steps[:, None]
    return not (np.any(c[future_cols] != 0) or np.any(b[future_rows] != 0))


def _check_reconstruction(a: np.ndarray, b: np.ndarray, c: np.ndarray | scipy.sparse.spmatrix, name: str) -> None:
    import scipy.sparse

    bc = (c.T @ b.T).T if scipy.sparse.issparse(c) else b @ c
    err = float(np.linalg.norm(a - bc) / np.linalg.norm(a))
    if not err <= RECONSTRUCTION_RTOL:
        raise MfcliError(f"strategy {name}: A != B C (relative error {err:.3e}); the workload is too ill-conditioned")


def _as_workload(workload: Workload | np.ndarray) -> np.ndarray:
    if isinstance(workload, Workload):
        return workload.matrix
    return check_workload_matrix(workload)


class _Encoded(NamedTuple):
    """What a prefix-sum strategy gives before post-processing: C, C as its reconstruction check
    takes it (sparse for the tree), the release steps, B_S, whether it is causal and whether C is
    the binary-tree encoder."""

    c: np.ndarray
    c_check: Any
    release: np.ndarray
    b_s: np.ndarray
    causal: bool
    is_tree: bool


#: A builder: (name, A, tol, max_iter, callback) -> the verified Strategy.
_Builder = Callable[[str, np.ndarray, float, int, "Callable[[Any], None] | None"], Strategy]


def _optimal(name: str, a: np.ndarray, tol: float, max_iter: int, callback: Callable[[Any], None] | None) -> Strategy:
    """The certified solution (:func:`mfcli.optimize.dense.optimal_factorization`)."""
    from mfcli.optimize.dense import optimal_factorization

    res = optimal_factorization(a, tol=tol, max_iter=max_iter, callback=callback)
    desc = DESCRIPTIONS[name] + f" (gap {res.gap:.1e})"
    return Strategy(name, res.factorization, True, desc, solver=res.certificate())


def _identity(name: str, a: np.ndarray, tol: float, max_iter: int, callback: Callable[[Any], None] | None) -> Strategy:
    """C = I, B = A (checked against the sparse identity)."""
    import scipy.sparse

    n = a.shape[0]
    fact = Factorization(workload=a, strategy=np.eye(n), decoder=a.copy(), causal=True)
    _check_reconstruction(a, fact.decoder, scipy.sparse.identity(n, format="csr"), name)
    return Strategy(name, fact, True, DESCRIPTIONS[name])


def _sqrt_encoded(n: int) -> _Encoded:
    c = sqrt_strategy_matrix(n)
    return _Encoded(c, c, np.arange(n), c.copy(), causal=True, is_tree=False)


def _tree_encoded(decoder: Callable[[int], np.ndarray], *, causal: bool) -> Callable[[int], _Encoded]:
    """The tree encoder on n leaves with the kind's ``decoder`` B_S."""

    def encoded(n: int) -> _Encoded:
        nodes = tree_nodes(n)
        return _Encoded(tree_strategy_matrix(n), _tree_sparse(nodes, n), nodes.end, decoder(n), causal=causal,
                        is_tree=True)

    return encoded


def _post_processed(encoded: Callable[[int], _Encoded]) -> _Builder:
    """The builder of a prefix-sum strategy: B = A S^-1 B_S, exact zeros where causality demands
    them, causality in release order and A = B C checked."""

    def build(name: str, a: np.ndarray, tol: float, max_iter: int,
              callback: Callable[[Any], None] | None) -> Strategy:
        n = a.shape[0]
        post = prefix_postprocessor(a)
        e = encoded(n)
        b = e.b_s if post is None else post @ e.b_s
        if e.causal:
            b[np.arange(n)[:, None] < e.release[None, :]] = 0.0  # exact zeros where causality demands them
            if not is_causal_in_release_order(strategy=e.c, decoder=b, release_steps=e.release):
                raise MfcliError(f"strategy {name} is not causal in release order")  # pragma: no cover
        _check_reconstruction(a, b, e.c_check, name)
        fact = Factorization(workload=a, strategy=e.c, decoder=b, causal=e.causal)
        desc = DESCRIPTIONS[name] + ("" if post is None else "; post-processed B = A S^-1 B_S")
        return Strategy(name, fact, e.causal, desc, release_steps=e.release, is_tree=e.is_tree)

    return build


#: {name: builder} of every baseline (:data:`STRATEGY_NAMES`; tests/test_kind_answers.py checks the
#: keys): each kind's construction is its entry; :func:`build_strategy` only looks it up.
BUILDERS: dict[str, _Builder] = {
    "identity": _identity,
    "tree": _post_processed(_tree_encoded(tree_decoder, causal=True)),
    "honaker-online": _post_processed(_tree_encoded(honaker_online_decoder, causal=True)),
    "honaker-full": _post_processed(_tree_encoded(honaker_full_decoder, causal=False)),
    "sqrt": _post_processed(_sqrt_encoded),
    "optimal": _optimal,
}


def build_strategy(
    name: str,
    workload: Workload | np.ndarray,
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
    callback: Callable[[Any], None] | None = None,
) -> Strategy:
    """Build strategy ``name`` for ``workload`` (A), as a verified factorization A = B C, by its
    entry in :data:`BUILDERS`.

    Args:
        name: one of :data:`STRATEGY_NAMES`.
        workload: a :class:`~mfcli.model.workloads.Workload` or an n x n lower-triangular matrix.
        tol, max_iter, callback: passed to the solver for ``optimal``.

    Formal guarantees: A = B C to relative Frobenius error 1e-8 (checked here), and a strategy
    marked causal is lower-triangular in release order (checked here). Sensitivity and losses are
    recomputed from B and C by :class:`~mfcli.model.factorization.Factorization`.

    Raises:
        MfcliError: unknown name, a tree strategy for n < 2. (A stored optimum is read by
            :func:`mfcli.io.artifact.strategy_from_artifact`.)
    """
    if name not in STRATEGY_NAMES:
        raise MfcliError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}")
    return BUILDERS[name](name, _as_workload(workload), tol, max_iter, callback)
