"""Single-pass Gaussian accounting and the DP-SGD reference (docs/accounting.md).

Single pass: each example takes part in at most one step, so the matrix mechanism C G + Z is one
Gaussian mechanism with L2 sensitivity sens(C) = max_j ||C[:, j]||_2 (in units of the clip norm)
and noise standard deviation sigma (noise multiplier x clip norm). Its privacy profile is that of
a Gaussian with effective noise multiplier sigma / sens(C), i.e. mu = sens(C) / sigma:

* (eps, delta): the exact analytic Gaussian curve (Balle and Wang 2018),
  delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), inverted by bracketing;
* rho-zCDP with rho = sens^2 / (2 sigma^2);
* mu-GDP with mu = sens / sigma.

DP-SGD reference: C = I with Poisson sampling at rate p for n steps, i.e. dp-accounting's
PoissonSampledDpEvent(p, GaussianDpEvent(sigma)) self-composed n times in the pessimistic PLD
accountant (add or remove one example).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from mfcli.accounting.defaults import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.accounting.events import event_to_json as event_json
from mfcli.validation import positive_number, step_count


def check_sigma(sigma: float) -> float:
    """sigma must be a positive finite number."""
    return positive_number(sigma, "sigma (noise multiplier)")


def check_delta(delta: float) -> float:
    """delta must lie in the open interval (0, 1)."""
    return positive_number(delta, "delta", upper=1.0)


def check_sampling(p: float) -> float:
    """A Poisson sampling rate must lie in (0, 1]."""
    return positive_number(p, "the sampling rate p", upper=1.0, upper_closed=True)


def check_discretization(d: float) -> float:
    """The PLD value discretization interval must lie in (0, 0.1]."""
    return positive_number(d, "the PLD value discretization", upper=0.1, upper_closed=True)


def gaussian_delta(epsilon: float | np.ndarray, mu: float) -> np.ndarray | float:
    """Exact hockey-stick divergence of N(mu, 1) against N(0, 1) at epsilon (Balle-Wang).

    Both directions are equal for a Gaussian, so this is the delta of (eps, delta)-DP.
    """
    eps = np.asarray(epsilon, dtype=np.float64)
    if mu <= 0:
        return np.zeros_like(eps) if eps.ndim else 0.0
    a = special.ndtr(mu / 2 - eps / mu)
    # e^eps Phi(-mu/2 - eps/mu) computed in logs: it underflows long before e^eps overflows
    b = np.exp(eps + special.log_ndtr(-mu / 2 - eps / mu))
    out = np.clip(a - b, 0.0, 1.0)
    return out if eps.ndim else float(out)


def gaussian_epsilon(delta: float, mu: float, *, tol: float = 1e-12) -> float:
    """Smallest eps >= 0 with gaussian_delta(eps, mu) <= delta, by bracketing and bisection.

    Formal guarantees: the returned eps satisfies delta(eps) <= delta (it is the upper end of the
    final bracket, whose width is at most tol (1 + eps)).
    """
    delta = check_delta(delta)
    if mu <= 0:
        return 0.0
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, mu) > delta:
        lo, hi = hi, 2 * hi
        if hi > 1e8:
            return math.inf
    while hi - lo > tol * (1 + hi):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class SinglePassResult:
    """Single-participation Gaussian accounting.

    Attributes:
        epsilon: eps at ``delta`` (exact analytic Gaussian; an upper bound to 1e-12).
        delta: the delta asked for.
        sigma: noise multiplier (noise std in units of the clip norm) as given.
        sensitivity: sens(C) in clip-norm units.
        noise_multiplier: sigma / sensitivity (per unit sensitivity).
        rho_zcdp: sens^2 / (2 sigma^2).
        mu_gdp: sens / sigma.
    """

    epsilon: float
    delta: float
    sigma: float
    sensitivity: float
    noise_multiplier: float
    rho_zcdp: float
    mu_gdp: float

    def dp_event(self):
        """The dp-accounting event: one Gaussian with noise multiplier sigma / sens."""
        from dp_accounting import dp_event

        return dp_event.GaussianDpEvent(self.noise_multiplier)

    def as_dict(self) -> dict:
        return {
            "setting": "single-pass",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "noise_multiplier": self.noise_multiplier,
            "rho_zcdp": self.rho_zcdp,
            "mu_gdp": self.mu_gdp,
            "method": "exact analytic Gaussian (Balle-Wang 2018), bisection to 1e-12",
            "assumptions": "each example in at most one step (single participation); add or remove one "
                           "example; no sampling amplification",
            "dp_event": event_json(self.dp_event()),
        }


def single_pass(*, sigma: float, sensitivity: float, delta: float = DEFAULT_DELTA) -> SinglePassResult:
    """Single-pass guarantee of C G + Z, Z ~ N(0, sigma^2), for a C of sensitivity ``sensitivity``.

    Formal guarantees: (epsilon, delta)-DP, rho-zCDP and mu-GDP hold for add or remove one example
    when every example contributes to at most one step (gradient clipped to norm 1).
    """
    sigma = check_sigma(sigma)
    delta = check_delta(delta)
    sensitivity = positive_number(sensitivity, "sensitivity")
    mu = sensitivity / sigma
    return SinglePassResult(
        epsilon=gaussian_epsilon(delta, mu),
        delta=delta,
        sigma=sigma,
        sensitivity=float(sensitivity),
        noise_multiplier=sigma / sensitivity,
        rho_zcdp=sensitivity**2 / (2 * sigma**2),
        mu_gdp=mu,
    )


@dataclass(frozen=True)
class DpSgdResult:
    """DP-SGD reference: Poisson-sampled Gaussian composed n times (PLD, pessimistic)."""

    epsilon: float
    delta: float
    sigma: float
    sampling: float
    steps: int
    value_discretization: float

    def dp_event(self):
        from dp_accounting import dp_event

        return dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(self.sampling, dp_event.GaussianDpEvent(self.sigma)), self.steps
        )

    def as_dict(self) -> dict:
        return {
            "setting": "dp-sgd",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "sigma": self.sigma,
            "sampling": self.sampling,
            "steps": self.steps,
            "value_discretization": self.value_discretization,
            "method": "dp-accounting PLDAccountant (pessimistic connect-the-dots)",
            "assumptions": "C = I (independent noise); Poisson sampling with rate p in every step; add or "
                           "remove one example",
            "dp_event": event_json(self.dp_event()),
        }


def dpsgd(
    *,
    sigma: float,
    sampling: float,
    steps: int,
    delta: float = DEFAULT_DELTA,
    value_discretization: float = DEFAULT_DISCRETIZATION,
) -> DpSgdResult:
    """Epsilon of DP-SGD with noise multiplier sigma, Poisson rate p and n steps (dp-accounting).

    Formal guarantees: dp-accounting's pessimistic PLD estimate; an upper bound on epsilon for add
    or remove one example.
    """
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    sigma = check_sigma(sigma)
    sampling = check_sampling(sampling)
    delta = check_delta(delta)
    value_discretization = check_discretization(value_discretization)
    steps = step_count(steps, name="the number of steps")
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=value_discretization)
    acc.compose(dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sampling, dp_event.GaussianDpEvent(sigma)), int(steps)
    ))
    return DpSgdResult(
        epsilon=float(acc.get_epsilon(delta)), delta=delta, sigma=sigma, sampling=sampling,
        steps=int(steps), value_discretization=value_discretization,
    )
