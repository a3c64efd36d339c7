"""Epsilon per prefix: the privacy of the model released after each epoch of a deterministic
(fixed-order) or cyclic-Poisson run (docs/accounting.md, "Epsilon per prefix").

Why a prefix is accounted by its own sensitivity. C is causal: the outputs released in the first
m steps (rows r with release step t(r) < m) depend only on the gradients of steps 0..m-1, so the
model after m steps is a post-processing of C_m G_m + Z_m, C_m = C[{r : t(r) < m}, :m] (the
entries of those rows beyond column m - 1 are zero). That is the same mechanism on m steps, with
every example's participation the schema's restricted to the first m steps:

* fixed-epoch K x b (steps i, i + b, ...): after j epochs, fixed-epoch j x b on m = j b steps;
* min-separation b (at most k times): the same schema on m steps (a pattern cut to a prefix is
  still b-separated with at most k steps, and every such pattern on m steps is a prefix's);
* single participation: single participation on m steps.

So the epsilon after j epochs is the Gaussian at the prefix's schema sensitivity
(:func:`mfcli.accounting.multi.deterministic` on C_m) for fixed-order runs, and the cyclic-Poisson
reduction (2306.08153 Thm. 3: DP-SGD with ceil(m / b) = j steps at noise multiplier sigma / the
max column norm of C_m) for cyclic Poisson. The last epoch's epsilon is the whole run's. Each
number is a guarantee for the model at that point of the run: a bound for the prefix is the
full run's bound only at the last epoch; earlier prefixes are never larger (fewer steps, a
compression of C), which the tests check as a consequence, not an assumption.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mfcli.accounting.defaults import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.accounting.multi import cyclic_poisson, deterministic
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, SingleParticipation, sensitivity
from mfcli.util.validation import step_count

#: The settings whose epsilon this module gives per prefix.
PREFIX_SETTINGS = ("deterministic", "cyclic-poisson")


@dataclass(frozen=True)
class PrefixEpsilon:
    """The epsilon of the model released after the first ``steps`` steps.

    Attributes:
        steps: m, the steps run so far.
        epsilon: the guarantee for the model after m steps (rounded as the row's accountant does).
        epsilon_lower: where the prefix's sensitivity is only bounded (deterministic): the epsilon
            at its witnessed sensitivity (the truth lies in [epsilon_lower, epsilon]); else epsilon.
        setting: ``deterministic`` or ``cyclic-poisson``.
        schema: the participation schema restricted to the m steps.
        sensitivity: the prefix's schema sensitivity (deterministic) or max column norm (cyclic).
    """

    steps: int
    epsilon: float
    epsilon_lower: float
    setting: str
    schema: Participation
    sensitivity: float

    def as_dict(self) -> dict:
        return {"steps": self.steps, "epsilon": self.epsilon, "epsilon_lower": self.epsilon_lower,
                "setting": self.setting, "participation": self.schema.describe(self.steps),
                "sensitivity": self.sensitivity}


def prefix_schema(schema: Participation, n: int, m: int) -> Participation:
    """The schema of an n-step run restricted to its first m steps (see the module docstring).

    Raises:
        MfcliError: m out of 1..n, or (fixed-epoch) m not a whole number of epochs.
    """
    n = step_count(n)
    m = step_count(m, name="the prefix length")
    if m > n:
        raise MfcliError(f"the prefix length must be at most the n = {n} steps, got {m}")
    if isinstance(schema, FixedEpoch):
        per = schema.steps_per_epoch(n)
        if m % per:
            raise MfcliError(f"a fixed-epoch prefix must be a whole number of epochs of {per} steps, got {m} steps")
        return FixedEpoch(epochs=m // per)
    if isinstance(schema, (MinSeparation, SingleParticipation)):
        return schema
    raise TypeError(f"schema must be a participation schema, got {type(schema).__name__}")


def prefix_strategy(c: np.ndarray, m: int, release_steps: np.ndarray | None = None) -> np.ndarray:
    """C_m: the rows of C released before step m, columns 0..m-1.

    Raises:
        MfcliError: C not causal in release order (a released row reads a later step), or m out of range.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.size == 0:
        raise MfcliError(f"the strategy must be a non-empty 2-D matrix, got shape {c.shape}")
    n = c.shape[1]
    m = step_count(m, name="the prefix length")
    if m > n:
        raise MfcliError(f"the prefix length must be at most the n = {n} steps, got {m}")
    t = np.arange(c.shape[0]) if release_steps is None else np.asarray(release_steps)
    if t.shape != (c.shape[0],):
        raise MfcliError(f"release_steps must give one step per row of C ({c.shape[0]}), got shape {t.shape}")
    rows = t < m
    if np.any(c[rows, m:]):
        raise MfcliError("the strategy is not causal: a row released before step "
                         f"{m} reads a gradient of a later step")
    return c[rows, :m]


def prefix_epsilon(c: np.ndarray, *, m: int, setting: str, sigma: float, schema: Participation,
                   delta: float = DEFAULT_DELTA, sampling: float | None = None,
                   release_steps: np.ndarray | None = None,
                   value_discretization: float = DEFAULT_DISCRETIZATION) -> PrefixEpsilon:
    """Epsilon of the model after the first m steps of C (noise sigma per coordinate) under
    ``setting``: ``deterministic`` (fixed-order participation as ``schema`` allows) or
    ``cyclic-poisson`` (cyclic Poisson sampling at rate ``sampling`` per group).

    Formal guarantee (module docstring): a valid (epsilon, delta) bound for add or remove one
    example for the model released after m steps, under the assumptions of the full run's row.

    Raises:
        MfcliError: an unknown setting, a missing rate, a prefix that is not a whole number of
            epochs (fixed-epoch), or the setting's own refusals (e.g. more bands than the cycle).
    """
    if setting not in PREFIX_SETTINGS:
        raise MfcliError(f"epsilon per prefix is given for {', '.join(PREFIX_SETTINGS)}, not {setting!r}")
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2:
        raise MfcliError(f"the strategy must be a 2-D matrix, got shape {c.shape}")
    sub_schema = prefix_schema(schema, c.shape[1], m)
    cm = prefix_strategy(c, m, release_steps)
    if setting == "deterministic":
        sens = sensitivity(cm, sub_schema)
        det = deterministic(sigma=sigma, sensitivity=sens, n=m, delta=delta)
        return PrefixEpsilon(steps=m, epsilon=det.epsilon, epsilon_lower=det.epsilon_lower, setting=setting,
                             schema=sub_schema, sensitivity=sens.value)
    if sampling is None:
        raise MfcliError("cyclic-Poisson accounting of a prefix needs the sampling rate")
    if cm.shape[0] != m:
        raise MfcliError("cyclic-Poisson accounting needs a square C (one release per step)")
    cyc = cyclic_poisson(cm, schema=sub_schema, sigma=sigma, sampling=sampling, delta=delta,
                         value_discretization=value_discretization)
    return PrefixEpsilon(steps=m, epsilon=cyc.epsilon, epsilon_lower=cyc.epsilon, setting=setting,
                         schema=sub_schema, sensitivity=cyc.column_norm)


def prefix_epsilons(c: np.ndarray, *, steps_per_epoch: int, setting: str, sigma: float, schema: Participation,
                    delta: float = DEFAULT_DELTA, sampling: float | None = None,
                    release_steps: np.ndarray | None = None,
                    value_discretization: float = DEFAULT_DISCRETIZATION) -> list[PrefixEpsilon]:
    """:func:`prefix_epsilon` after each epoch of ``steps_per_epoch`` steps: m = e, 2e, ..., n
    (the last prefix is the whole run; n must be a whole number of epochs).

    Raises:
        MfcliError: n not a multiple of ``steps_per_epoch``, or as :func:`prefix_epsilon`.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.size == 0:
        raise MfcliError(f"the strategy must be a non-empty 2-D matrix, got shape {c.shape}")
    n = c.shape[1]
    e = step_count(steps_per_epoch, name="steps_per_epoch")
    if n % e:
        raise MfcliError(f"the n = {n} steps are not a whole number of epochs of {e} steps")
    return [prefix_epsilon(c, m=j * e, setting=setting, sigma=sigma, schema=schema, delta=delta, sampling=sampling,
                           release_steps=release_steps, value_discretization=value_discretization)
            for j in range(1, math.ceil(n / e) + 1)]


__all__ = ["PREFIX_SETTINGS", "PrefixEpsilon", "prefix_epsilon", "prefix_epsilons", "prefix_schema", "prefix_strategy"]
