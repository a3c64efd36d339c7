"""Accounting under multiple participations (docs/accounting.md, "Multiple participations").

Two settings, each a proven guarantee under stated conditions:

* **deterministic** (:func:`deterministic`): every example takes part in the steps a participation
  schema allows (fixed-epoch or min-separation, :mod:`mfcli.model.participation`), with no sampling.
  Then C G + Z is one Gaussian mechanism whose L2 sensitivity is the schema's sensitivity of C
  (:func:`mfcli.model.participation.sensitivity`); gradients chosen adaptively from earlier outputs do
  not change this for a causal C (Denisov et al. 2022, Thm. 2.1; Choquette-Choo et al. 2023,
  arXiv 2211.06530, Sec. 2). When the sensitivity is only an upper bound U (``exact`` False) the
  epsilon at U is still a guarantee; the epsilon at the witnessed lower value is reported beside it,
  so the true epsilon of the mechanism lies in that bracket.
* **cyclic Poisson** (:func:`cyclic_poisson`): examples are split into b groups and at step i the
  group i mod b is Poisson-sampled with rate p. Choquette-Choo et al. 2023, *(Amplified) banded
  matrix factorizations* (arXiv 2306.08153, Alg. 2, Thm. 3): a lower-triangular C with at most b
  bands (C_ij = 0 for i - j >= b) is then at least as private as DP-SGD with noise multiplier
  sigma / max_j ||C[:, j]||, sampling rate p and ceil(n / b) steps. The reduced DP-SGD is accounted
  by dp-accounting's PLD accountant.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mfcli.accounting.defaults import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.accounting.events import plain_gaussian, plain_json, plain_poisson_gaussian, poisson_gaussian_event
from mfcli.accounting.single_pass import check_delta, check_pld_inputs, check_sigma, dpsgd, gaussian_epsilon
from mfcli.errors import MfcliError
from mfcli.model.participation import (
    FixedEpoch,
    Participation,
    Sensitivity,
    cyclic_period,
    schema_dict,
)
from mfcli.util.rows import fields_of


@dataclass(frozen=True)
class DeterministicResult:
    """The Gaussian mechanism at a participation schema's sensitivity (no sampling).

    Attributes:
        epsilon: the guarantee: epsilon of the Gaussian at sensitivity ``sensitivity.value``.
        epsilon_lower: epsilon at the witnessed sensitivity ``sensitivity.lower``; equals
            ``epsilon`` when the sensitivity is exact. The mechanism's true epsilon lies in
            [epsilon_lower, epsilon].
        delta, sigma: as given.
        sensitivity: the schema's sensitivity of C (value, exact, lower, method, schema).
        n: the number of steps (columns of C).
    """

    epsilon: float
    epsilon_lower: float
    delta: float
    sigma: float
    sensitivity: Sensitivity
    n: int

    @property
    def noise_multiplier(self) -> float:
        """sigma / sens (per unit of the schema's sensitivity bound)."""
        return self.sigma / self.sensitivity.value

    @property
    def mu_gdp(self) -> float:
        """mu = sens / sigma: the mechanism is mu-GDP (at the schema's sensitivity bound)."""
        return self.sensitivity.value / self.sigma

    @property
    def rho_zcdp(self) -> float:
        """rho = mu^2 / 2: the mechanism is rho-zCDP (a product, not a float power, so that an
        extreme sigma gives inf or 0 instead of an OverflowError)."""
        return 0.5 * self.mu_gdp * self.mu_gdp

    def dp_event(self):
        """One Gaussian with noise multiplier sigma / sens (the schema's sensitivity bound)."""
        from dp_accounting import dp_event

        return dp_event.GaussianDpEvent(self.noise_multiplier)

    def as_dict(self) -> dict:
        s = self.sensitivity
        return {
            "setting": "deterministic",
            "epsilon": self.epsilon,
            "epsilon_lower": self.epsilon_lower,
            "bracket": [self.epsilon_lower, self.epsilon],
            "delta": self.delta,
            "sigma": self.sigma,
            "sensitivity": s.value,
            "sensitivity_lower": s.lower,
            "sensitivity_exact": s.exact,
            "sensitivity_method": s.method,
            "noise_multiplier": self.noise_multiplier,
            "rho_zcdp": self.rho_zcdp,
            "mu_gdp": self.mu_gdp,
            "participation": schema_dict(s.schema, self.n),
            "batch_sampler": "deterministic",
            "method": "exact analytic Gaussian (Balle-Wang 2018) at the schema's sensitivity"
                      + ("" if s.exact else " (an upper bound on the sensitivity, so epsilon is still a guarantee)"),
            "assumptions": f"every example takes part in the steps the schema allows ({s.schema.describe(self.n)}), "
                           f"no sampling{same_order_assumption(s.schema)}; adaptive gradients, C causal; add or remove "
                           "one example",
            "dp_event": plain_json(plain_gaussian(self.noise_multiplier)),  # event_to_json(self.dp_event())
        }


def same_order_assumption(schema: Participation) -> str:
    """What fixed-epoch participation assumes about the data order, as a clause of an assumption
    line ("" for other schemas): the same order in every epoch, so an example's steps are
    {i, i + b, ...}. With the data reshuffled between epochs an example takes part at most once
    per epoch but at any gap; min-separation 1 with at most K participations contains every such
    pattern (any K steps), so its bound holds there."""
    if not isinstance(schema, FixedEpoch):
        return ""
    return ("; the same data order in every epoch (steps i, i + b, ...; not reshuffled between epochs: with "
            f"reshuffling, min-separation 1 with at most {schema.epochs} participations holds)")


def deterministic(*, sigma: float, sensitivity: Sensitivity, n: int, delta: float = DEFAULT_DELTA) -> DeterministicResult:
    """Epsilon of C G + Z under deterministic participation, from the schema's sensitivity.

    Formal guarantee: (epsilon, delta)-DP for add or remove one example, when every example takes
    part only in steps the schema allows; ``epsilon`` is exact for sensitivity ``sensitivity.value``
    and so a guarantee whenever that value bounds the true sensitivity (it always does).
    """
    sigma = check_sigma(sigma)
    delta = check_delta(delta)
    if sensitivity.value <= 0:
        raise MfcliError("the strategy has zero sensitivity under the schema (an all-zero C)")
    eps = gaussian_epsilon(delta, sensitivity.value / sigma)
    low = eps if sensitivity.exact else gaussian_epsilon(delta, sensitivity.lower / sigma)
    return DeterministicResult(epsilon=eps, epsilon_lower=low, delta=delta, sigma=sigma, sensitivity=sensitivity, n=n)


def cycle_length(schema: Participation, n: int) -> int:
    """b, the number of groups of cyclic Poisson sampling: the period of the cyclic order the
    schema allows (:func:`mfcli.model.participation.cyclic_period`): the separation of a min-sep
    schema, the steps per epoch n / K of a fixed-epoch schema, or n under single participation (one
    epoch: n groups, each sampled at its one step; every causal C has <= n bands).

    Raises:
        MfcliError: a min-sep schema whose cap on the participations binds (cyclic Poisson sampling
            cannot enforce one), or a schema that does not fit n.
    """
    b = cyclic_period(schema, n)
    if b is None:
        s = schema.spacing(n)
        reach, cap = -(-n // s), schema.participations(n)
        raise MfcliError(f"cyclic Poisson sampling cannot cap the number of participations: with {s} groups over {n} "
                         f"steps an example takes part up to {reach} times, above the maximum of {cap}; leave the "
                         f"maximum out or raise it to {reach}")
    return b


def band_count(c: np.ndarray) -> int:
    """The number of bands of a lower-triangular C: 1 + the largest i - j with C_ij != 0."""
    rows, cols = np.nonzero(c)
    return int((rows - cols).max()) + 1 if rows.size else 0


def check_cyclic(c: np.ndarray, b: int) -> None:
    """Refuse a C that does not meet 2306.08153 Thm. 3's conditions for cycle length b: square,
    lower-triangular, at most b bands, not all zero.

    Raises:
        MfcliError: naming the failed condition.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise MfcliError(f"cyclic Poisson accounting needs a square lower-triangular C, got shape {c.shape}")
    if np.any(np.triu(c, 1)):
        raise MfcliError("cyclic Poisson accounting needs a lower-triangular (causal) C; this C has entries above the diagonal")
    bands = band_count(c)
    if bands == 0:
        raise MfcliError("the strategy is all zeros")
    if bands > b:
        raise MfcliError(f"cyclic Poisson accounting needs at most b = {b} bands (the cycle length); this C has {bands}")


@dataclass(frozen=True)
class CyclicPoissonResult:
    """A b-banded C under cyclic Poisson sampling, reduced to DP-SGD (2306.08153 Thm. 3)."""

    epsilon: float
    delta: float
    sigma: float
    sampling: float
    cycle: int
    bands: int
    column_norm: float
    steps: int
    n: int
    schema: Participation
    value_discretization: float

    @property
    def noise_multiplier(self) -> float:
        """sigma / max column norm: the reduced DP-SGD's noise multiplier."""
        return self.sigma / self.column_norm

    def dp_event(self):
        """ceil(n / b) self-composed Poisson-sampled Gaussians at noise multiplier sigma / max column norm."""
        return poisson_gaussian_event(self.sampling, self.noise_multiplier, self.steps)

    def as_dict(self) -> dict:
        return fields_of(
            self, "epsilon", "delta", "sigma", "sampling", "cycle", "bands", first={"setting": "cyclic-poisson"},
            max_column_norm=self.column_norm, noise_multiplier=self.noise_multiplier, steps=self.steps,
            value_discretization=self.value_discretization, participation=schema_dict(self.schema, self.n),
            batch_sampler=f"cyclic Poisson: {self.cycle} groups, group i mod {self.cycle} sampled at rate "
                          f"{self.sampling:g} at step i",
            method="2306.08153 Thm. 3: at least as private as DP-SGD with ceil(n / b) steps at rate p and noise "
                   "multiplier sigma / max column norm; its PLD (pessimistic) proven under round-off (mog_pld leaves, "
                   "pld_certify)",
            assumptions=f"C lower-triangular with at most b = {self.cycle} bands; examples split into b groups, "
                        "group i mod b Poisson-sampled at step i; adaptive gradients; add or remove one example",
            dp_event=plain_json(plain_poisson_gaussian(self.sampling, self.noise_multiplier, self.steps)),
        )


def cyclic_poisson(
    c: np.ndarray,
    *,
    schema: Participation,
    sigma: float,
    sampling: float,
    delta: float = DEFAULT_DELTA,
    value_discretization: float = DEFAULT_DISCRETIZATION,
) -> CyclicPoissonResult:
    """Epsilon of a b-banded C under cyclic Poisson sampling (b from ``schema``, :func:`cycle_length`).

    Formal guarantee (2306.08153 Thm. 3, conditions checked by :func:`check_cyclic`): the
    mechanism is at least as private as DP-SGD with ceil(n / b) steps, rate p and noise multiplier
    sigma / max_j ||C[:, j]||; the epsilon is that DP-SGD's pessimistic PLD bound, proven under round-off
    (:func:`mfcli.accounting.single_pass.dpsgd` with ``certified``).

    Raises:
        MfcliError: the conditions fail, or a parameter is out of range.
    """
    sigma, sampling, delta, value_discretization = check_pld_inputs(sigma, sampling, delta, value_discretization)
    c = np.asarray(c, dtype=np.float64)
    n = c.shape[1] if c.ndim == 2 else 0
    b = cycle_length(schema, n)
    check_cyclic(c, b)
    col = float(np.sqrt(np.max(np.sum(c * c, axis=0))))
    return reduced_dpsgd(bands=band_count(c), column_norm=col, n=n, schema=schema, sigma=sigma, sampling=sampling,
                         delta=delta, value_discretization=value_discretization)


def reduced_dpsgd(*, bands: int, column_norm: float, n: int, schema: Participation, sigma: float, sampling: float,
                  delta: float = DEFAULT_DELTA, value_discretization: float = DEFAULT_DISCRETIZATION,
                  ) -> CyclicPoissonResult:
    """The cyclic-Poisson epsilon from the two numbers 2306.08153 Thm. 3 needs (the band count and
    the max column norm of C), so a C known only by its parameters (a banded Toeplitz C at any n:
    max column norm ||c||_2, bands len(c)) is accounted without forming it.

    Raises:
        MfcliError: more bands than the cycle length b, or a parameter out of range.
    """
    sigma, sampling, delta, value_discretization = check_pld_inputs(sigma, sampling, delta, value_discretization)
    b = cycle_length(schema, n)
    if bands > b:
        raise MfcliError(f"cyclic Poisson accounting needs at most b = {b} bands (the cycle length); this C has {bands}")
    if not column_norm > 0:
        raise MfcliError("the strategy is all zeros")
    steps = math.ceil(n / b)
    # Thm. 3's DP-SGD is accounted by the one DP-SGD accountant (its event is this result's dp_event),
    # as a guarantee: its value proven under round-off (single_pass.certified_poisson_epsilon)
    reduced = dpsgd(sigma=sigma / float(column_norm), sampling=sampling, steps=steps, delta=delta,
                    value_discretization=value_discretization, certified=True)
    return CyclicPoissonResult(epsilon=reduced.epsilon, delta=delta, sigma=sigma, sampling=sampling, cycle=b,
                               bands=bands, column_norm=float(column_norm), steps=steps, n=n, schema=schema,
                               value_discretization=value_discretization)


__all__ = [
    "CyclicPoissonResult",
    "DeterministicResult",
    "band_count",
    "check_cyclic",
    "cycle_length",
    "cyclic_poisson",
    "deterministic",
    "reduced_dpsgd",
    "schema_dict",
]
