"""Calibration: the smallest noise std sigma (of the noise on C G, per unit clip norm) meeting a
target (epsilon, delta); its noise multiplier is sigma / the sensitivity of C
(:func:`mfcli.services.account.noise_sensitivity`, docs/accounting.md "Noise convention").

epsilon(sigma) is non-increasing for every setting mfcli accounts (more noise is a post-processing
of less noise: add independent Gaussian noise). The search brackets the target (doubling/halving
sigma) and then bisects in log sigma until the bracket is within ``rel_tol``; it returns the upper
end of the final bracket, where the accounting was actually run and met the target. So the
reported achieved epsilon is a computed guarantee at the returned sigma (never an interpolation),
and it is at most the target. This is the bracketing that dp-accounting's
``calibrate_dp_mechanism`` does, applied to any epsilon function (MMCC is not a DpEvent that its
accountants can build).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mfcli.errors import MfcliError
from mfcli.util.progress import ProgressCallback, ProgressEvent
from mfcli.util.validation import positive_number


class TargetMetWithoutNoiseError(MfcliError):
    """The target epsilon holds even at the smallest sigma searched: there is nothing to calibrate
    (the target promises no meaningful privacy). A type of its own so that callers can tell it from
    a target that cannot be met, without reading the message."""


SIGMA_MIN = 1e-3
SIGMA_MAX = 1e4


@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate_sigma`.

    Attributes:
        sigma: the calibrated std of the noise on C G, per unit clip norm (upper end of the final
            bracket): what ``noise_std`` names in the JSON.
        epsilon: the epsilon computed at ``sigma`` (<= target).
        target_epsilon: the target.
        sigma_lower: the lower end of the final bracket (epsilon there exceeds the target).
        evaluations: how many times the accounting ran.
        sensitivity: the sensitivity the noise multiplier divides by
            (:func:`mfcli.services.account.noise_sensitivity`), None when the caller calibrated
            an epsilon function without a strategy.
    """

    sigma: float
    epsilon: float
    target_epsilon: float
    sigma_lower: float
    evaluations: int
    sensitivity: float | None = None

    @property
    def noise_std(self) -> float:
        """The calibrated std of the noise on C G (``sigma``)."""
        return self.sigma

    @property
    def noise_multiplier(self) -> float | None:
        """``sigma`` / ``sensitivity``: the noise multiplier as Opacus and jax_privacy use it (None
        without a sensitivity)."""
        return None if self.sensitivity is None else self.sigma / self.sensitivity

    def as_dict(self) -> dict:
        noise = {} if self.sensitivity is None else {
            "noise_multiplier": self.noise_multiplier,
            "noise_std": self.sigma,
            "sensitivity": self.sensitivity,
            "noise_multiplier_bracket": [self.sigma_lower / self.sensitivity, self.sigma / self.sensitivity],
        }
        return {
            **noise,
            "sigma": self.sigma,
            "achieved_epsilon": self.epsilon,
            "target_epsilon": self.target_epsilon,
            "sigma_bracket": [self.sigma_lower, self.sigma],
            "evaluations": self.evaluations,
            "method": "bracketing on the non-increasing epsilon(sigma), bisection in log sigma; the "
                      "returned sigma is where the target was met",
        }


def bisection_steps(log_width: float, rel_tol: float) -> int:
    """Bisections in log sigma that shrink a bracket of log-width ``log_width`` until
    hi / lo - 1 <= ``rel_tol`` (the stopping rule of :func:`calibrate_sigma`)."""
    steps = 0
    while math.expm1(log_width) > rel_tol:
        log_width /= 2
        steps += 1
    return steps


def expected_runs(epsilon_start: float, target_epsilon: float, *, rel_tol: float = 1e-3,
                  sigma_start: float = 1.0) -> tuple[int, int]:
    """(expected, most) accounting runs of :func:`calibrate_sigma` after a first run at
    ``sigma_start`` returned ``epsilon_start``, the first run included.

    The expected count models epsilon as roughly proportional to 1 / sigma (the Gaussian's
    behaviour at moderate epsilon) to guess the doublings or halvings that bracket the target;
    the most is the bracketing walk to the search's end (SIGMA_MAX or SIGMA_MIN)."""
    b = bisection_steps(math.log(2.0), rel_tol)
    if not math.isfinite(epsilon_start) or epsilon_start <= 0:
        guess = 1
    elif epsilon_start > target_epsilon:  # doublings until epsilon <= target
        guess = max(1, math.ceil(math.log2(epsilon_start / target_epsilon)))
    else:  # halvings until epsilon > target
        guess = math.floor(math.log2(target_epsilon / epsilon_start)) + 1
    limit = SIGMA_MAX / sigma_start if epsilon_start > target_epsilon else sigma_start / SIGMA_MIN
    most = max(1, math.ceil(math.log2(max(limit, 2.0))))
    return 1 + min(guess, most) + b, 1 + most + b


def calibrate_sigma(
    epsilon_of_sigma: Callable[[float], float],
    *,
    target_epsilon: float,
    rel_tol: float = 1e-3,
    sigma_start: float = 1.0,
    progress: Callable[[str], None] | None = None,
    on_progress: ProgressCallback | None = None,
    known: Mapping[float, float] | None = None,
) -> Calibration:
    """Smallest sigma (to a relative ``rel_tol``) with epsilon_of_sigma(sigma) <= target_epsilon.

    ``on_progress`` receives phase ``calibration`` events counting accounting runs: while the
    target is being bracketed the total is the runs so far (at least one) and the bisections a
    bracket of width 2 needs; once it is bracketed the total is exact. ``known`` holds
    {sigma: epsilon} already computed (a probe run, :func:`mfcli.services.account.estimate_calibration`);
    they count as runs made.

    Raises:
        MfcliError: a target that is not a positive finite number, or one that no sigma up to
            1e4 meets (e.g. a delta split that leaves no room).
    """
    target = positive_number(target_epsilon, "the target epsilon")
    if not (0 < rel_tol < 1):
        raise MfcliError("the calibration tolerance must lie in (0, 1)")
    say = progress or (lambda s: None)
    cache: dict[float, float] = {float(k): float(v) for k, v in (known or {}).items()}
    evals = len(cache)
    bisect_total = bisection_steps(math.log(2.0), rel_tol)
    total = 0
    bracketed = False

    def report() -> None:
        nonlocal total
        if on_progress is None:
            return
        # bracketing: the latest run may have closed the bracket (then the bisections of a
        # bracket of width 2 follow); if it did not, the total grows by one per run
        total = max(total, evals if bracketed else max(evals, 1) + bisect_total)
        on_progress(ProgressEvent("calibration", min(evals, total), total, "accounting runs"))

    def eps(s: float) -> float:
        nonlocal evals
        if s not in cache:
            evals += 1
            cache[s] = float(epsilon_of_sigma(s))
            say(f"calibrate: sigma {s:.6g} -> epsilon {cache[s]:.6g}")
            report()
        return cache[s]

    report()

    s = float(sigma_start)
    if eps(s) <= target:
        hi = s
        lo = s / 2
        while eps(lo) <= target:
            hi, lo = lo, lo / 2
            if lo < SIGMA_MIN:
                raise TargetMetWithoutNoiseError(
                    f"epsilon stays below {target:g} even at sigma = {hi:.3g}; no calibration needed "
                    "(any sigma >= that works)"
                )
    else:
        lo = s
        hi = 2 * s
        while eps(hi) > target:
            lo, hi = hi, 2 * hi
            if hi > SIGMA_MAX:
                raise MfcliError(
                    f"no sigma up to {SIGMA_MAX:g} meets epsilon {target:g} at this delta "
                    f"(epsilon at sigma = {lo:.3g} is {eps(lo):.4g}); raise the target or delta"
                )
    if on_progress is not None:
        bracketed = True
        total = max(total, evals + bisection_steps(math.log(hi / lo), rel_tol))
        report()
    while hi / lo - 1 > rel_tol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    result = Calibration(sigma=hi, epsilon=eps(hi), target_epsilon=target, sigma_lower=lo, evaluations=evals)
    if on_progress is not None:
        total = max(total, evals)
        on_progress(ProgressEvent("calibration", total, total, "accounting runs"))
    return result
