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
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from mfcli.accounting import pld_ops
from mfcli.accounting.defaults import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.accounting.events import event_to_json as event_json
from mfcli.accounting.events import poisson_gaussian_event
from mfcli.util.rows import fields_of
from mfcli.util.validation import positive_number, step_count


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


def check_pld_inputs(sigma: float, sampling: float, delta: float,
                     value_discretization: float) -> tuple[float, float, float, float]:
    """(sigma, sampling, delta, value_discretization) of a Poisson-sampled Gaussian accounted
    with dp-accounting's PLD (DP-SGD and each setting reduced to it), each checked in this order
    (:func:`check_sigma`, :func:`check_sampling`, :func:`check_delta`, :func:`check_discretization`)."""
    return check_sigma(sigma), check_sampling(sampling), check_delta(delta), check_discretization(value_discretization)


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
        return fields_of(
            self, "epsilon", "delta", "sigma", "sensitivity", "noise_multiplier", "rho_zcdp", "mu_gdp",
            first={"setting": "single-pass"},
            method="exact analytic Gaussian (Balle-Wang 2018), bisection to 1e-12",
            assumptions="each example in at most one step (single participation); add or remove one "
                        "example; no sampling amplification",
            dp_event=event_json(self.dp_event()),
        )


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
        return poisson_gaussian_event(self.sampling, self.sigma, self.steps)

    def as_dict(self) -> dict:
        return fields_of(
            self, "epsilon", "delta", "sigma", "sampling", "steps", "value_discretization", first={"setting": "dp-sgd"},
            method="dp-accounting PLDAccountant (pessimistic connect-the-dots)",
            assumptions="C = I (independent noise); Poisson sampling with rate p in every step; add or "
                        "remove one example",
            dp_event=event_json(self.dp_event()),
        )


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
    from dp_accounting.pld import pld_privacy_accountant

    sigma, sampling, delta, value_discretization = check_pld_inputs(sigma, sampling, delta, value_discretization)
    steps = step_count(steps, name="the number of steps")
    try:
        epsilon = _poisson_gaussian_epsilon(sigma, sampling, int(steps), delta, value_discretization)
    except _NoFastPath:
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=value_discretization)
        acc.compose(poisson_gaussian_event(sampling, sigma, int(steps)))
        epsilon = acc.get_epsilon(delta)
    return DpSgdResult(
        epsilon=float(epsilon), delta=delta, sigma=sigma, sampling=sampling,
        steps=int(steps), value_discretization=value_discretization,
    )


class _NoFastPath(Exception):
    """The installed dp-accounting lacks what :func:`_poisson_gaussian_epsilon` builds on, or the
    array inverse disagreed with its own: run its PLDAccountant instead."""


#: Points of the eps grid at which :func:`_array_gaussian_loss` checks the array inverse against
#: dp-accounting's own scalar inverse (evenly spaced, both ends included) before using it.
_INVERSE_CHECKS = 64


def _inverse_privacy_loss_array(loss, eps: np.ndarray) -> np.ndarray:
    """dp-accounting's ``inverse_privacy_loss`` of a (sub)sampled Gaussian (sensitivity 1) on an
    array of eps: the same floating-point operations, in the same order, as its scalar path
    (``AdditiveNoisePrivacyLoss._inverse_privacy_loss_{add,remove}`` through
    ``common.log_a_times_exp_b_plus_c`` and ``_log_sub``, whose scalar ``np.log``/``np.exp``/
    ``np.log1p`` run numpy's own loops, as these array calls do), NaN where the scalar path takes
    another branch (eps = 0, eps within rounding of log(1 - q), out of range): those are left to it.

    Why: the connect-the-dots PLD evaluates the inverse at every grid point, one Python call each
    (~6 us); at a small noise multiplier that is 10^5 points per direction, most of a second."""
    q = loss.sampling_prob
    sens = loss.sensitivity
    var = loss.standard_deviation ** 2
    remove = loss.adjacency_type.name == "REMOVE"
    with np.errstate(all="ignore"):
        if q == 1.0:
            pl = eps
            ok = np.ones(eps.shape, dtype=bool)
        else:
            a = 1 / q
            c = 1 - 1 / q
            log_a, log_c = np.log(a), np.log(-c)
            limit = math.log(1 - q)
            b = eps if remove else -eps
            d = b + log_a
            # log(a e^b + c) for c < 0, through _log_sub(d, log(-c)), which needs log(-c) < d
            pl = d + np.log1p(-np.exp(log_c - d))
            if remove:
                in_range = eps > limit
            else:
                pl = -pl
                limit = -limit
                in_range = eps <= limit
            diff = np.abs(limit - eps)  # math.isclose(eps, limit) at its default rel_tol 1e-9
            close = (diff <= np.abs(1e-09 * limit)) | (diff <= np.abs(1e-09 * eps))
            ok = in_range & (b != 0) & (log_c < d) & ~close
        x = -0.5 * sens - pl * var / sens
        if not remove:
            x = sens + x
    return np.where(ok & np.isfinite(x), x, np.nan)


def _array_gaussian_loss(sigma: float, sampling: float, adjacency: Any):
    """A dp-accounting ``GaussianPrivacyLoss`` whose ``get_delta_for_epsilon`` (the hockey-stick
    divergence at every point of the connect-the-dots grid) takes the inverse privacy loss from
    :func:`_inverse_privacy_loss_array`, checked against dp-accounting's scalar inverse at
    :data:`_INVERSE_CHECKS` points, instead of one scalar call per point; the rest is the base
    method's arithmetic (its CDFs are dp-accounting's own)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    class _ArrayInverse(plm.GaussianPrivacyLoss):
        def get_delta_for_epsilon(self, epsilon):
            if isinstance(epsilon, numbers.Number):
                return super().get_delta_for_epsilon(epsilon)
            eps = np.asarray(epsilon)
            deltas = np.zeros_like(eps, dtype=float)
            q = self.sampling_prob
            # which points need the inverse, as the base method decides it
            if q == 1.0:
                inside = np.full_like(eps, True, dtype=bool)
            elif self.adjacency_type == plm.AdjacencyType.ADD:
                inside = eps < -math.log1p(-q)
            elif self.adjacency_type == plm.AdjacencyType.REMOVE:
                inside = eps > math.log1p(-q)
                other = np.logical_not(inside)
                deltas[other] = -np.expm1(eps[other])
            else:
                return super().get_delta_for_epsilon(epsilon)
            e_in = eps[inside]
            x = _inverse_privacy_loss_array(self, np.asarray(e_in, dtype=np.float64))
            known = np.flatnonzero(~np.isnan(x))
            for i in known[np.linspace(0, known.size - 1, min(known.size, _INVERSE_CHECKS)).astype(np.int64)]:
                if super().inverse_privacy_loss(e_in[i]) != x[i]:
                    raise _NoFastPath(f"the array inverse privacy loss differs at eps = {e_in[i]!r}")
            for i in np.flatnonzero(np.isnan(x)):  # the scalar path's other branches
                x[i] = super().inverse_privacy_loss(e_in[i])
            deltas[inside] = self.mu_upper_cdf(x) - np.exp(e_in + self.mu_lower_log_cdf(x))
            return np.clip(deltas, 0, 1)

    return _ArrayInverse(sigma, sampling_prob=sampling, adjacency_type=adjacency)


def _poisson_gaussian_epsilon(sigma: float, sampling: float, steps: int, delta: float, d: float) -> float:
    """What dp-accounting's ``PLDAccountant(d)`` returns for the Poisson-sampled Gaussian composed
    ``steps`` times, built as it builds it (``from_gaussian_mechanism``: the pessimistic
    connect-the-dots PMF of each direction, ``self_compose``, composed onto the identity), with the
    inverse privacy loss evaluated on arrays (:func:`_array_gaussian_loss`). Bit for bit the accountant's
    epsilon (tests/test_accounting_single_pass.py compares them over a table of settings).

    Raises:
        _NoFastPath: the installed dp-accounting lacks a function used here, or the array
            disagreed with the scalar inverse.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pld = _poisson_gaussian_pld(sigma, sampling, d)
    total = pld_lib.identity(value_discretization_interval=d).compose(pld_ops.self_compose(pld, steps))
    return float(pld_ops.epsilon_for_delta(total, delta))


def _dense_connect_dots(loss: Any, d: float) -> Any:
    """The connect-the-dots PMF dp-accounting's ``_create_pld_pmf_from_monotone_privacy_loss(loss,
    pessimistic_estimate=True, value_discretization_interval=d, use_connect_dots=True)`` returns
    for a continuous loss when it is dense (more than ``pld_pmf._MAX_PMF_SPARSE_SIZE`` grid
    points): the same grid (the loss's connect-the-dots bounds rounded out to multiples of d), the
    same deltas, the same fixed-gap formula (:func:`mfcli.accounting.mog_pld.connect_dots_pmf`),
    built as an array instead of through a dictionary of every grid point and back (two Python
    passes over 2 x 10^5 points per direction for the DP-SGD reduction's row). None where
    dp-accounting would build something else (a sparse PMF, one point, a discrete loss) or raise
    (deltas out of order or out of [0, 1]): the caller then runs dp-accounting's builder."""
    from dp_accounting.pld import pld_pmf

    from mfcli.accounting.mog_pld import connect_dots_pmf

    sparse_max = getattr(pld_pmf, "_MAX_PMF_SPARSE_SIZE", None)
    tolerance = getattr(pld_pmf, "_DELTA_DIFF_TOLERANCE", None)
    if sparse_max is None or tolerance is None or loss.is_discrete:
        return None
    bounds = loss.connect_dots_bounds()
    if bounds.epsilon_upper is None or bounds.epsilon_lower is None:
        return None
    upper = math.ceil(bounds.epsilon_upper / d)
    lower = math.floor(bounds.epsilon_lower / d)
    if upper - lower + 1 <= sparse_max:
        return None
    ks = np.arange(lower, upper + 1)
    deltas = np.asarray(loss.get_delta_for_epsilon(ks * d), dtype=np.float64)
    if np.any(deltas < 0) or np.any(deltas > 1) or np.any(np.diff(deltas) > tolerance):
        return None
    return connect_dots_pmf(d, ks, deltas)


def _poisson_gaussian_pld(sigma: float, sampling: float, d: float) -> Any:
    """The PLD of one Poisson-sampled Gaussian as dp-accounting's ``PLDAccountant(d)`` builds it,
    the inverse privacy loss on arrays (:func:`_array_gaussian_loss`); also used by the per-step
    reduction (mfcli.accounting.reduction) to compose several multipliers.

    Raises:
        _NoFastPath: as :func:`_poisson_gaussian_epsilon`.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.pld import privacy_loss_mechanism as plm

    create = getattr(pld_lib, "_create_pld_pmf_from_monotone_privacy_loss", None)
    if create is None or not hasattr(pld_lib, "identity"):
        raise _NoFastPath("dp-accounting without _create_pld_pmf_from_monotone_privacy_loss")

    def pmf(adjacency: Any) -> Any:
        loss = _array_gaussian_loss(sigma, sampling, adjacency)
        dense = _dense_connect_dots(loss, d)
        if dense is not None:
            return dense
        return create(loss, pessimistic_estimate=True, value_discretization_interval=d, use_connect_dots=True)

    remove = pmf(plm.AdjacencyType.REMOVE)
    return (pld_lib.PrivacyLossDistribution(remove) if sampling == 1.0
            else pld_lib.PrivacyLossDistribution(remove, pmf(plm.AdjacencyType.ADD)))
