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

from mfcli.participation import FixedEpoch, MinSeparation, Participation, SingleParticipation


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
