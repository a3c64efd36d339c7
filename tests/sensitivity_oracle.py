"""Brute-force schema sensitivity, the oracle the test modules share (not a test module).

For a strategy C and a participation schema, by enumeration (small n only: exponential in the
pattern size):

* the attained value: max over the schema's participation patterns P and sign vectors s on P of
  ||C s||^2, the squared sensitivity over d = 1 inputs (an explicit adjacent pair, so a lower
  bound on the sensitivity for every d, and the sensitivity where a bound attains it);
* the upper bound: max over P of sum_{i, l in P} |X_il| with X = C^T C, valid for every d
  (|sum X_il <g_i, g_l>| <= sum |X_il| for unit rows g).

It is independent of mfcli's sensitivity code: the patterns come from each schema's definition
(:func:`schema_patterns`, not ``schema.patterns``) and the values straight from C.
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, SingleParticipation


def schema_patterns(n: int, schema: Participation) -> list[tuple[int, ...]]:
    """Every participation pattern of ``schema`` over n steps, from the schema's definition:
    single, one step; fixed-epoch (k epochs of b = n / k steps), i, i + b, ..., i + (k - 1) b;
    min-separation (b, k), every non-empty set of at most k steps pairwise at least b apart."""
    if isinstance(schema, SingleParticipation):
        return [(i,) for i in range(n)]
    if isinstance(schema, FixedEpoch):
        assert n % schema.epochs == 0, (n, schema)
        b = n // schema.epochs
        return [tuple(i + e * b for e in range(schema.epochs)) for i in range(b)]
    assert isinstance(schema, MinSeparation), schema
    # at most ceil(n / b) steps fit pairwise b apart: larger sets need not be listed and filtered
    k = min(schema.max_participations or n, -(-n // schema.separation))
    return [p for size in range(1, k + 1) for p in itertools.combinations(range(n), size)
            if all(q - r >= schema.separation for r, q in itertools.pairwise(p))]


@functools.cache
def _sign_vectors(size: int) -> np.ndarray:
    """Every sign vector of length ``size`` with first entry +1, one a row (s and -s give the
    same ||C s||, so the other half adds nothing)."""
    rest = np.array(list(itertools.product((1.0, -1.0), repeat=size - 1))).reshape(2 ** (size - 1), size - 1)
    return np.hstack([np.ones((rest.shape[0], 1)), rest])


def brute_bounds_squared(c: np.ndarray, schema: Participation) -> tuple[float, float]:
    """(attained, upper): max over patterns and sign vectors of ||C s||^2 (from C itself, no Gram
    matrix), and max over patterns of sum |X_P| (X = C^T C). attained <= sens^2 <= upper."""
    c = np.asarray(c, dtype=np.float64)
    x = c.T @ c
    attained = upper = 0.0
    for pattern in schema_patterns(c.shape[1], schema):
        cols = c[:, list(pattern)]
        attained = max(attained, float(np.max(np.sum((_sign_vectors(len(pattern)) @ cols.T) ** 2, axis=1))))
        upper = max(upper, float(np.abs(x[np.ix_(pattern, pattern)]).sum()))
    return attained, upper


def brute_sensitivity_squared(c: np.ndarray, schema: Participation) -> float:
    """max over patterns and sign vectors of ||C s||^2."""
    return brute_bounds_squared(c, schema)[0]


def brute_sensitivity(c: np.ndarray, schema: Participation) -> float:
    """max over patterns and sign vectors of ||C s||."""
    return math.sqrt(brute_sensitivity_squared(c, schema))


def _vector_ascent_from_c(cols: np.ndarray, starts: np.ndarray, sweeps: int) -> np.ndarray:
    """Gauss-Seidel ascent of ||C_P V||_F^2 over unit rows v_i (the mixing method), from the
    random ``starts`` (batch, |P|, r), computed from the columns C_P (batch, m, |P|) alone:
    v_i <- normalise(C_i^T (C_P V) - ||C_i||^2 v_i) maximises the value over v_i with the others
    fixed, so it never decreases."""
    v = starts / np.linalg.norm(starts, axis=2, keepdims=True)
    w = cols @ v  # C_P V, kept up to date
    col2 = np.sum(cols**2, axis=1)
    last = np.sum(w**2, axis=(1, 2))
    for sweep in range(sweeps):
        for i in range(v.shape[1]):
            g = np.einsum("bm,bmr->br", cols[:, :, i], w) - col2[:, i, None] * v[:, i]
            norm = np.linalg.norm(g, axis=1, keepdims=True)
            new = np.where(norm > 1e-300, g / np.where(norm > 1e-300, norm, 1.0), v[:, i])
            w += cols[:, :, i, None] * (new - v[:, i])[:, None, :]
            v[:, i] = new
        if sweep % 20 == 19:
            w = cols @ v  # no drift from the updates
            value = np.sum(w**2, axis=(1, 2))
            if np.all(value - last <= 1e-15 * np.abs(value)):
                break
            last = value
    return v


def brute_vector_bounds_squared(c: np.ndarray, schema: Participation, restarts: int = 3,
                                sweeps: int = 3000, seed: int = 0) -> tuple[float, float]:
    """(attained, certified) for gradients of any dimension d: attained = the best ||C_P V||_F^2
    over the schema's patterns P (from :func:`schema_patterns`) and unit rows V (|P| x |P|),
    found by ``restarts`` random starts of a Gauss-Seidel ascent per pattern, an explicit pair,
    so <= sens^2; certified = max over P of a dual bound sum(y) - |P| lambda_min(Diag(y) - X_P)
    (y_i = (X_P V V^T)_ii from the best start; weak duality), so >= sens^2. The two meet where
    the ascent found each pattern's maximum. Independent of mfcli's code: other starts, another
    ascent, values from C itself, and scipy's eigenvalue routine."""
    import scipy.linalg

    c = np.asarray(c, dtype=np.float64)
    rng = np.random.default_rng(seed)
    by_size: dict[int, list[tuple[int, ...]]] = {}
    for pattern in schema_patterns(c.shape[1], schema):
        by_size.setdefault(len(pattern), []).append(pattern)
    attained = certified = 0.0
    for size, pats in by_size.items():
        cols = np.stack([c[:, list(p)] for p in pats])  # (N, m, size)
        batch = np.repeat(cols, restarts, axis=0)
        v = _vector_ascent_from_c(batch, rng.standard_normal((batch.shape[0], size, size)), sweeps)
        values = np.sum((batch @ v) ** 2, axis=(1, 2)).reshape(len(pats), restarts)
        pick = np.argmax(values, axis=1)
        attained = max(attained, float(values.max()))
        v = v.reshape(len(pats), restarts, size, size)[np.arange(len(pats)), pick]
        for p_cols, p_v in zip(cols, v, strict=True):
            x = p_cols.T @ p_cols
            y = np.einsum("ir,ir->i", x @ p_v, p_v)
            lam = scipy.linalg.eigh(np.diag(y) - x, eigvals_only=True, driver="ev")[0]
            scale = float(np.abs(x).sum())
            certified = max(certified, float(y.sum() - size * lam) + 1e-12 * scale)
    return attained, certified
