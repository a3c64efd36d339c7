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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import special

from mfcli.accounting import pld_ops
from mfcli.accounting.defaults import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.accounting.events import plain_gaussian, plain_json, plain_poisson_gaussian, poisson_gaussian_event
from mfcli.errors import MfcliError
from mfcli.util.rows import fields_of
from mfcli.util.validation import positive_number, step_count


def check_sigma(sigma: float) -> float:
    """sigma must be a positive finite number."""
    return positive_number(sigma, "sigma (the noise std)")


#: The largest noise multiplier (noise std over sensitivity) at which the sampled accountants (MMCC,
#: the DP-SGD rows and reduction, cyclic Poisson, balls-in-bins: privacy loss distributions on a
#: grid) are run. Above it the privacy loss of one step is so narrow that the grids degenerate:
#: MMCC reports inf from 1e6 on and the DP-SGD reduction from 1e7 (momentum n = 256, p = 0.01), and
#: at 1e10 the accounting did not finish in 100 s, for an epsilon below 1e-4 (9.6e-5 at 1e6).
#: There is no lower limit: a small multiplier makes the grids wide, which costs time and memory
#: (identity n = 64, p = 0.01: 35 s and 1.7 GB at 0.1, epsilon 339) and ends, where it does not
#: fit, in one out-of-memory line. The exact settings (single pass, deterministic) and the shuffle's
#: closed forms run at any sigma.
SAMPLED_NOISE_MULTIPLIER_MAX = 1e6


def check_sampled_noise_multiplier(multiplier: float, what: str) -> float:
    """Refuse, in one line, a noise multiplier above :data:`SAMPLED_NOISE_MULTIPLIER_MAX` (or not
    finite) for a sampled accountant; ``what`` names the quantity (e.g. ``sigma / sens``)."""
    if not multiplier <= SAMPLED_NOISE_MULTIPLIER_MAX:
        raise MfcliError(f"{what} = {multiplier:.6g} is above {SAMPLED_NOISE_MULTIPLIER_MAX:g}, the largest the sampled "
                         "accountants run at (their privacy-loss grids degenerate there, for an epsilon below 1e-4); "
                         "without a sampler the single-pass and deterministic settings run at any sigma")
    return multiplier


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
            dp_event=plain_json(plain_gaussian(self.noise_multiplier)),  # event_to_json(self.dp_event())
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
        # from mu, not sensitivity**2 / (2 sigma^2): a float power raises past 1e308, a product goes to inf
        rho_zcdp=0.5 * mu * mu,
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
            # event_to_json(self.dp_event()), without importing dp-accounting
            dp_event=plain_json(plain_poisson_gaussian(self.sampling, self.sigma, self.steps)),
        )


def dpsgd(
    *,
    sigma: float,
    sampling: float,
    steps: int,
    delta: float = DEFAULT_DELTA,
    value_discretization: float = DEFAULT_DISCRETIZATION,
    certified: bool = False,
) -> DpSgdResult:
    """Epsilon of DP-SGD with noise multiplier sigma, Poisson rate p and n steps: dp-accounting's
    ``PLDAccountant(value_discretization)`` value, bit for bit, computed without importing it
    (:func:`_poisson_gaussian_epsilon`) -- the DP-SGD reference row. ``certified``: instead the
    value proven under floating point (:func:`certified_poisson_epsilon`, a
    :class:`CertifiedDpSgdResult`), for guarantees built on DP-SGD (the DP-SGD reduction).

    Formal guarantees: dp-accounting's pessimistic PLD estimate; an upper bound on epsilon for add
    or remove one example (``certified``: proven for the exact composition of pessimistic PMFs
    under the FFT model of :mod:`mfcli.accounting.pld_certify`).

    Raises:
        MfcliError: a parameter out of range, or the FFT self-composition would not fit in memory
            (a noise multiplier too small for the discretization).
    """
    sigma, sampling, delta, value_discretization = check_pld_inputs(sigma, sampling, delta, value_discretization)
    steps = step_count(steps, name="the number of steps")
    if certified:
        epsilon = certified_poisson_epsilon(((sigma, int(steps)),), sampling=sampling, delta=delta,
                                            value_discretization=value_discretization)
        return CertifiedDpSgdResult(epsilon=float(epsilon), delta=delta, sigma=sigma, sampling=sampling,
                                    steps=int(steps), value_discretization=value_discretization)
    epsilon = _poisson_gaussian_epsilon(sigma, sampling, int(steps), delta, value_discretization)
    return DpSgdResult(
        epsilon=float(epsilon), delta=delta, sigma=sigma, sampling=sampling,
        steps=int(steps), value_discretization=value_discretization,
    )


#: dp-accounting's default ``log_mass_truncation_bound`` of a Gaussian: ln of the noise mass its
#: PLD may leave out of each tail (the connect-the-dots range is the loss at e^-50 / 2 of mass).
_LOG_MASS_TRUNCATION_BOUND = -50

#: Points of the eps grid at which :meth:`_PoissonGaussianLoss.deltas` checks the array inverse
#: against the scalar one (evenly spaced, both ends included) before using it.
_INVERSE_CHECKS = 64


def _log_add(a: Any, b: Any) -> Any:
    """log(e^a + e^b), as dp-accounting's ``common._log_add`` forms it (numpy scalar calls)."""
    mn, mx = min(a, b), max(a, b)
    return mx + np.log1p(np.exp(mn - mx))


def _log_sub(a: Any, b: Any) -> Any:
    """log(e^a - e^b) for b < a, as dp-accounting's ``common._log_sub`` forms it."""
    if b >= a:
        raise MfcliError(f"log(e^a - e^b) needs a > b, got a = {a!r}, b = {b!r}")
    return a + np.log1p(-np.exp(b - a))


def _log_a_times_exp_b_plus_c(a: float, b: Any, c: float) -> Any:
    """log(a e^b + c) for a > 0 and c != 0, as dp-accounting's ``common.log_a_times_exp_b_plus_c``
    forms it (numpy scalar calls, whose last bits can differ from the math module's)."""
    if b == 0:
        return np.log(a + c)
    d = b + np.log(a)
    return _log_sub(d, np.log(-c)) if c < 0 else _log_add(d, np.log(c))


class _PoissonGaussianLoss:
    """The privacy loss of one direction of the Poisson-sampled Gaussian (noise multiplier
    ``sigma``, sensitivity 1, rate ``q``): dp-accounting's ``GaussianPrivacyLoss(sigma,
    sampling_prob=q, adjacency_type=REMOVE or ADD)`` with its defaults, the same formulas in the
    same floating-point operations (its Gaussian CDFs are scipy.stats' ``norm(scale=sigma)``,
    which evaluate ``scipy.special.ndtr`` / ``log_ndtr`` / ``ndtri`` of (x - 0) / sigma, called
    here directly). tests/test_accounting_single_pass.py compares the PLD built from it with
    dp-accounting's, bit for bit.

    REMOVE: mu_upper = (1 - q) N(0, sigma^2) + q N(-1, sigma^2), mu_lower = N(0, sigma^2);
    ADD: mu_upper = N(0, sigma^2), mu_lower = (1 - q) N(0, sigma^2) + q N(1, sigma^2);
    loss(x) = log(mu_upper(x) / mu_lower(x)), decreasing in x."""

    def __init__(self, sigma: float, q: float, remove: bool) -> None:
        self.sigma = sigma
        self.q = q
        self.remove = remove

    # the loss and its inverse at one point (dp-accounting's scalar path)
    def _loss_remove(self, x: Any) -> Any:
        without = 1 * (-0.5 * 1 - x) / (self.sigma ** 2)
        if self.q == 1.0:
            return without
        return _log_a_times_exp_b_plus_c(self.q, without, 1 - self.q)

    def privacy_loss(self, x: Any) -> Any:
        return self._loss_remove(x) if self.remove else -self._loss_remove(-x)

    def _inverse_without_sampling(self, loss: float) -> float:
        x = -0.5 * 1 - loss * (self.sigma ** 2) / 1
        return x if self.remove else 1 + x

    def inverse_privacy_loss(self, loss: float) -> float:
        """The largest x with privacy_loss(x) >= loss (dp-accounting's ``inverse_privacy_loss``)."""
        q = self.q
        if q == 1.0:
            return self._inverse_without_sampling(loss)
        limit = math.log(1 - q) if self.remove else -math.log(1 - q)
        if math.isclose(loss, limit):
            return self._inverse_without_sampling(-math.inf if self.remove else math.inf)
        if (loss <= limit) if self.remove else (loss > limit):
            raise MfcliError(f"privacy loss {loss!r} outside the range of the sampled Gaussian's (limit {limit!r})")
        if self.remove:
            return self._inverse_without_sampling(_log_a_times_exp_b_plus_c(1 / q, loss, 1 - 1 / q))
        return self._inverse_without_sampling(-_log_a_times_exp_b_plus_c(1 / q, -loss, 1 - 1 / q))

    def _inverse_array(self, eps: np.ndarray) -> np.ndarray:
        """:meth:`inverse_privacy_loss` on an array: the same floating-point operations in the same
        order (its scalar ``np.log``/``np.exp``/``np.log1p`` run numpy's own loops, as these array
        calls do), NaN where the scalar path takes another branch (eps = 0, eps within rounding of
        log(1 - q), out of range): those are left to it.

        Why: the connect-the-dots PLD evaluates the inverse at every grid point, one Python call
        each (~6 us); at a small noise multiplier that is 10^5 points per direction."""
        q = self.q
        remove = self.remove
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
            x = -0.5 * 1 - pl * (self.sigma ** 2) / 1
            if not remove:
                x = 1 + x
        return np.where(ok & np.isfinite(x), x, np.nan)

    # the distributions (arrays)
    def mu_upper_cdf(self, x: np.ndarray) -> np.ndarray:
        s = self.sigma
        if not self.remove:
            return special.ndtr(x / s)
        if self.q == 1.0:
            return special.ndtr(np.add(x, 1) / s)
        return (1 - self.q) * special.ndtr(x / s) + self.q * special.ndtr(np.add(x, 1) / s)

    def mu_lower_log_cdf(self, x: np.ndarray) -> np.ndarray:
        s = self.sigma
        if self.remove:
            return special.log_ndtr(x / s)
        if self.q == 1.0:
            return special.log_ndtr(np.add(x, -1) / s)
        return np.logaddexp(np.log1p(-self.q) + special.log_ndtr(x / s),
                            np.log(self.q) + special.log_ndtr(np.add(x, -1) / s))

    def connect_dots_bounds(self) -> tuple[Any, Any]:
        """(epsilon_upper, epsilon_lower): the loss at the two truncation points of mu_upper
        (dp-accounting's ``privacy_loss_tail``: the e^-50 / 2 quantile of N(0, sigma^2) and its
        negation, the lower one moved by -1 (REMOVE) or the upper by +1 (ADD))."""
        lower_x = special.ndtri(np.asarray([0.5 * math.exp(_LOG_MASS_TRUNCATION_BOUND)]))[0] * self.sigma + 0
        upper_x = -lower_x
        if self.remove:
            lower_x -= 1
        else:
            upper_x += 1
        return self.privacy_loss(lower_x), self.privacy_loss(upper_x)

    def deltas(self, eps: np.ndarray) -> np.ndarray:
        """The hockey-stick divergence at every eps (dp-accounting's ``get_delta_for_epsilon`` on
        an array): 1 - e^eps below the loss range (REMOVE), mu_upper_cdf(x) - e^eps mu_lower_cdf(x)
        at x = the inverse loss inside it, clipped to [0, 1]. The inverse is taken on the array
        (:meth:`_inverse_array`), checked against the scalar path at :data:`_INVERSE_CHECKS`
        points; on any difference every point takes the scalar path."""
        eps = np.asarray(eps, dtype=np.float64)
        deltas = np.zeros_like(eps, dtype=float)
        q = self.q
        if q == 1.0:
            inside = np.full_like(eps, True, dtype=bool)
        elif self.remove:
            inside = eps > math.log1p(-q)
            other = np.logical_not(inside)
            deltas[other] = -np.expm1(eps[other])
        else:
            inside = eps < -math.log1p(-q)
        e_in = eps[inside]
        x = self._inverse_array(e_in)
        known = np.flatnonzero(~np.isnan(x))
        checks = known[np.linspace(0, known.size - 1, min(known.size, _INVERSE_CHECKS)).astype(np.int64)]
        if any(self.inverse_privacy_loss(e_in[i]) != x[i] for i in checks.tolist()):
            x = np.full(e_in.shape, np.nan)  # numpy's array and scalar loops differ here: scalar everywhere
        for i in np.flatnonzero(np.isnan(x)).tolist():  # the scalar path's other branches
            x[i] = self.inverse_privacy_loss(e_in[i])
        deltas[inside] = self.mu_upper_cdf(x) - np.exp(e_in + self.mu_lower_log_cdf(x))
        return np.clip(deltas, 0, 1)


def _connect_dots(loss: _PoissonGaussianLoss, d: float) -> pld_ops.Pmf:
    """dp-accounting's ``_create_pld_pmf_from_monotone_privacy_loss(loss, pessimistic_estimate=True,
    value_discretization_interval=d, use_connect_dots=True)`` for the continuous loss: the grid of
    the connect-the-dots bounds rounded out to multiples of d, the deltas there, the fixed-gap
    formula (:func:`mfcli.accounting.mog_pld.connect_dots_pmf`, dp-accounting's
    ``create_pmf_pessimistic_connect_dots_fixed_gap``), marked sparse where dp-accounting would
    keep it as a dictionary (at most 1000 points).

    Raises:
        MfcliError: the deltas increase by more than dp-accounting's tolerance 1e-12 somewhere
            (where dp-accounting raises ValueError).
    """
    from mfcli.accounting.mog_pld import connect_dots_pmf

    eps_upper, eps_lower = loss.connect_dots_bounds()
    upper = math.ceil(eps_upper / d)
    lower = math.floor(eps_lower / d)
    ks = np.arange(lower, upper + 1)
    deltas = loss.deltas(ks * d)
    if ks.size > 1 and np.any(np.diff(deltas) > _DELTA_DIFF_TOLERANCE):
        raise MfcliError(f"the sampled Gaussian's deltas are not non-increasing on the grid of {d:g} "
                         f"(noise multiplier {loss.sigma!r}, rate {loss.q!r})")
    pmf = connect_dots_pmf(d, ks, deltas)
    return replace(pmf, sparse=pmf.size <= pld_ops.MAX_SPARSE_SIZE)


#: dp-accounting's ``pld_pmf._DELTA_DIFF_TOLERANCE``: how much a connect-the-dots delta may rise.
_DELTA_DIFF_TOLERANCE = 1e-12


def _poisson_gaussian_pld(sigma: float, sampling: float, d: float) -> pld_ops.Pld:
    """The PLD of one Poisson-sampled Gaussian (noise multiplier ``sigma``, rate ``sampling``) as
    dp-accounting's ``PLDAccountant(d)`` builds it (``from_gaussian_mechanism``: the pessimistic
    connect-the-dots PMF of each direction, symmetric when ``sampling`` is 1); also used by the
    per-step reduction (mfcli.accounting.reduction) to compose several multipliers."""
    remove = _connect_dots(_PoissonGaussianLoss(sigma, sampling, True), d)
    if sampling == 1.0:
        return pld_ops.Pld(remove)
    return pld_ops.Pld(remove, _connect_dots(_PoissonGaussianLoss(sigma, sampling, False), d))


def _poisson_gaussian_epsilon(sigma: float, sampling: float, steps: int, delta: float, d: float) -> float:
    """What dp-accounting's ``PLDAccountant(d)`` returns for the Poisson-sampled Gaussian composed
    ``steps`` times, built as it builds it (:func:`_poisson_gaussian_pld`, ``self_compose``,
    composed onto the identity), bit for bit (tests/test_accounting_single_pass.py compares them
    over a table of settings)."""
    total = pld_ops.identity(d).compose(pld_ops.self_compose(_poisson_gaussian_pld(sigma, sampling, d), steps))
    return float(pld_ops.epsilon_for_delta(total, delta))


# ---------------------------------------------------------------------------------------------
# The certified path (guarantees other than the dp-sgd reference row: the DP-SGD reduction)


def _certified_poisson_gaussian_pld(sigma: float, sampling: float, d: float) -> Any:
    """The Poisson-sampled Gaussian (noise multiplier ``sigma``, sensitivity 1, rate ``sampling``)
    for :mod:`mfcli.accounting.pld_certify`: the two-point mixture of Gaussians with
    sensitivity 0 (probability 1 - rate) or 1 (rate), whose pair is this class's (REMOVE: mu_upper
    = (1 - q) N(0) + q N(-1) against N(0); ADD: N(0) against (1 - q) N(0) + q N(1)), built by
    :func:`mfcli.accounting.mog_pld.mixture_pld`, whose PMFs are lifted to dominate the exact
    hockey-stick curves under round-off (docs/accounting.md, "Round-off of the row PLDs")."""
    from mfcli.accounting import mog_pld

    return mog_pld.mixture_pld(sigma, [0.0, 1.0], [1.0 - sampling, sampling], value_discretization_interval=d)


def certified_poisson_epsilon(groups: list[tuple[float, int]] | tuple[tuple[float, int], ...], *,
                              sampling: float, delta: float, value_discretization: float) -> float:
    """epsilon of Poisson-sampled Gaussians (rate ``sampling``, sensitivity 1) with noise multiplier
    m composed k times for every (m, k) in ``groups``, proven under floating point: the leaves
    lifted for round-off (:func:`_certified_poisson_gaussian_pld`), each self-composed, composed
    pairwise (:func:`mfcli.accounting.pld_certify.compose_counted`, as MMCC's fast engine), the answer raised by
    :func:`mfcli.accounting.pld_certify.certified_epsilon` to one proven for the exact composition
    under its stated FFT model. An upper bound for add or remove one example; not dp-accounting's
    value bit for bit (:func:`dpsgd` is), within about 1e-6 relative of it (either side: its
    connect-the-dots leaves and its composition onto the identity are not these)."""
    from mfcli.accounting import pld_certify

    node = pld_certify.compose_counted([(_certified_poisson_gaussian_pld(float(m), sampling, value_discretization), int(k))
                                        for m, k in groups if int(k) >= 1])
    return 0.0 if node is None else float(pld_certify.certified_epsilon(node, delta))


@dataclass(frozen=True)
class CertifiedDpSgdResult(DpSgdResult):
    """DP-SGD's epsilon as a guarantee (the DP-SGD reduction's): the PLD of
    :func:`certified_poisson_epsilon`, proven under round-off, not the reference's arithmetic."""

    def as_dict(self) -> dict:
        d = super().as_dict()
        d["method"] = ("PLD of the Poisson-sampled Gaussian as a two-point mixture of Gaussians, lifted for "
                       "round-off (mog_pld), composed with its FFT round-off certified (pld_certify); "
                       "pessimistic, proven under floating point")
        return d
