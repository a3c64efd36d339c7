"""Brute-force schema sensitivity, the oracle several test modules share (not a test module).

max over the schema's participation patterns P and sign vectors s of ||C s_P||: the sensitivity
over d = 1 inputs, which is the schema's sensitivity where its bound is attained (a lower bound
in general). Exponential in the pattern size: small n only.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from mfcli.participation import Participation


def brute_sensitivity_squared(c: np.ndarray, schema: Participation) -> float:
    """max over patterns and sign vectors of ||C s||^2, from C itself (no Gram matrix formed)."""
    best = 0.0
    for pattern in schema.patterns(c.shape[1]):
        for signs in itertools.product((1.0, -1.0), repeat=len(pattern)):
            v = np.zeros(c.shape[1])
            v[list(pattern)] = signs
            best = max(best, float(np.sum((c @ v) ** 2)))
    return best


def brute_sensitivity(c: np.ndarray, schema: Participation) -> float:
    """max over patterns and sign vectors of ||C s||."""
    return math.sqrt(brute_sensitivity_squared(c, schema))
