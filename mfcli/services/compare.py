"""Error tables: every strategy's sensitivity and error on one workload.

This module computes the numbers; :mod:`mfcli.cli.render` turns a :class:`Comparison` into
Markdown, CSV, a terminal table or a plot.

All numbers are for noise multiplier 1 and clip norm 1, recomputed from each strategy's B and C,
under a participation schema (default single participation, :mod:`mfcli.model.participation`):

* ``sensitivity`` = :func:`mfcli.model.participation.sensitivity` of C under the schema (max_j
  ||C[:, j]||_2 for single participation); ``sensitivity_exact`` says whether it is attained or
  only an upper bound (then every loss below is an upper bound too);
* ``loss_total`` = sens^2 ||B||_F^2 (total squared error over the n released steps);
* ``loss_mean`` = loss_total / n and ``rmse`` = sqrt(loss_mean);
* ``loss_max`` = sens^2 max_t ||B[t, :]||^2 (the worst step's expected squared error);
* ``ratio`` = loss_total / (smallest loss_total among the causal strategies).

At equal privacy (``privacy``, a :class:`PrivacyTarget`): each row's sigma is calibrated to the
target (epsilon, delta) under the best valid accounting for that row (:func:`equal_privacy`), and
its RMSE at that sigma is sigma ||B||_F / sqrt(n).

Example:
    >>> from mfcli.model.workloads import prefix_workload
    >>> table = run_comparison(prefix_workload(4), ["identity", "tree"])
    >>> [(r.name, round(r.loss_total, 9)) for r in table.rows]
    [('identity', 10.0), ('tree', 15.0)]
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mfcli.errors import MfcliError
from mfcli.io.artifact import strategy_from_artifact
from mfcli.model.kinds import SOLVED
from mfcli.model.participation import Participation, SingleParticipation, declared_or_requested, schema_dict
from mfcli.model.participation import sensitivity as schema_sensitivity
from mfcli.model.workloads import Workload
from mfcli.strategies.baselines import STRATEGY_NAMES, TREE_STRATEGIES, Strategy, build_strategy
from mfcli.util.progress import ProgressCallback, ProgressEvent

#: Columns of the table, in order, with the header a reader sees.
COLUMNS = (
    ("name", "strategy"),
    ("causal", "causal"),
    ("sensitivity", "sensitivity"),
    ("loss_total", "total sq. error"),
    ("loss_mean", "mean sq. error"),
    ("rmse", "RMSE"),
    ("loss_max", "worst step sq. error"),
    ("ratio", "ratio to best causal"),
)


@dataclass(frozen=True, eq=False)
class ComparisonRow:
    """One strategy's numbers (recomputed from its B and C) and its per-step RMSE curve."""

    name: str
    description: str
    causal: bool
    m: int
    sensitivity: float
    loss_total: float
    loss_mean: float
    rmse: float
    loss_max: float
    ratio: float
    per_step_rmse: np.ndarray
    source: str | None = None
    solver_gap: float | None = None
    sensitivity_exact: bool = True
    privacy: RowPrivacy | None = None

    def as_dict(self, *, curves: bool = False, schema: bool = False) -> dict[str, Any]:
        """JSON-ready numbers; ``schema`` (a non-single participation schema) adds
        ``sensitivity_exact``, so single-participation output keeps its keys."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "causal": self.causal,
            "m": self.m,
            "sensitivity": self.sensitivity,
            "loss_total": self.loss_total,
            "loss_mean": self.loss_mean,
            "rmse": self.rmse,
            "loss_max": self.loss_max,
            "ratio_to_best_causal": None if math.isnan(self.ratio) else self.ratio,
        }
        if schema:
            out["sensitivity_exact"] = self.sensitivity_exact
        if self.source is not None:
            out["artifact"] = self.source
        if self.solver_gap is not None:
            out["solver_gap"] = self.solver_gap
        if curves:
            out["per_step_rmse"] = self.per_step_rmse.tolist()
        if self.privacy is not None:
            out["at_equal_privacy"] = self.privacy.as_dict()
        return out


def schema_numbers(strategy_matrix: np.ndarray, decoder: np.ndarray, schema: Participation) -> dict[str, Any]:
    """Sensitivity and losses of one mechanism (C, B) under ``schema``, recomputed (noise
    multiplier 1, clip norm 1): sensitivity with ``exact``/``lower``/``method`` from
    :func:`mfcli.model.participation.sensitivity`, loss_total = sens^2 ||B||_F^2, loss_mean =
    loss_total / n, loss_max = sens^2 max_t ||B[t, :]||^2 (upper bounds when not exact)."""
    s = schema_sensitivity(np.asarray(strategy_matrix, dtype=np.float64), schema)
    rows = np.sum(np.asarray(decoder, dtype=np.float64) ** 2, axis=1)
    n = int(np.asarray(strategy_matrix).shape[1])
    return {
        "participation": schema_dict(schema, n),
        "sensitivity": s.value, "exact": s.exact, "lower": s.lower, "method": s.method,
        "loss_total": s.value ** 2 * float(np.sum(rows)),
        "loss_mean": s.value ** 2 * float(np.sum(rows)) / n,
        "loss_max": s.value ** 2 * float(np.max(rows)),
    }


def requested_schema(declared: Participation, requested: Participation | None, what: str,
                     n: int | None = None) -> Participation:
    """The schema to evaluate: :func:`mfcli.model.participation.declared_or_requested` (a request that
    contradicts a declared multi-participation schema is refused in one line, the schemas
    described for ``n`` steps when it is given)."""
    return declared_or_requested(declared, requested, what, n)


def comparison_schema(artifacts: Sequence[str | Path], requested: Participation | None) -> Participation:
    """The one schema a comparison table is evaluated under: ``requested``, or the schema the
    artifacts declare when none is requested (single participation when they declare none),
    by :func:`mfcli.model.participation.declared_or_requested`, the rule ``account`` follows: a request
    that contradicts an artifact's declared multi-participation schema is refused, and so are two
    artifacts that declare different ones.

    Raises:
        MfcliError: the contradiction, in one line; an unreadable participation attribute.
    """
    import h5py

    from mfcli.io.artifact import PARTICIPATION_ATTR, read_participation
    from mfcli.util.validation import regular_file

    schema = requested
    for path in artifacts:
        try:
            with h5py.File(regular_file(path, "artifact"), "r") as f:  # a FIFO would block
                raw = f.attrs.get(PARTICIPATION_ATTR)
                shape = getattr(f.get("workload"), "shape", None)
        except OSError as exc:
            raise MfcliError(f"{path} cannot be read (truncated or corrupt?): {exc}") from None
        try:
            declared = read_participation(raw, None)
        except MfcliError as exc:
            raise MfcliError(f"{path}: {exc}") from None
        steps = int(shape[1]) if shape is not None and len(shape) == 2 else None
        chosen = declared_or_requested(declared, schema, str(path), steps)
        if not isinstance(declared, SingleParticipation):
            schema = chosen
    return schema if schema is not None else SingleParticipation()


@dataclass(frozen=True)
class PrivacyTarget:
    """The privacy every row of a comparison at equal privacy is calibrated to.

    Attributes:
        epsilon, delta: the target.
        sampling: the Poisson rate of cyclic Poisson sampling (None: no sampling). The batch
            sampler is then cyclic with b groups, b from the schema (min-sep b, n / K steps per
            epoch, n under single participation): an example's steps then lie in one schema
            pattern, so the deterministic accounting stays valid beside the amplified one.
    """

    epsilon: float
    delta: float
    sampling: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta, "sampling": self.sampling,
                "batch_sampler": "deterministic" if self.sampling is None else "cyclic Poisson"}


@dataclass(frozen=True)
class RowPrivacy:
    """One row at equal privacy: the accounting that gave the smallest calibrated sigma, that
    sigma (noise std in clip-norm units, for C as built), the epsilon achieved there (<= target),
    the resulting RMSE sigma ||B||_F / sqrt(n), and the other valid accountings' sigmas."""

    accounting: str
    sigma: float
    epsilon: float
    rmse: float
    candidates: dict[str, float]
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accounting": self.accounting, "sigma": self.sigma, "achieved_epsilon": self.epsilon,
                               "rmse": self.rmse, "sigma_by_accounting": dict(self.candidates)}
        if self.note:
            out["note"] = self.note
        return out


def equal_privacy(strategy_matrix: np.ndarray, decoder: np.ndarray, schema: Participation, target: PrivacyTarget,
                  *, rel_tol: float = 1e-4, on_progress: ProgressCallback | None = None,
                  phase: str = "calibration") -> RowPrivacy:
    """Calibrate sigma for one strategy at ``target`` under every valid accounting and keep the
    smallest, with the RMSE sigma ||B||_F / sqrt(n) at it.

    Valid accountings (docs/compare.md, "At equal privacy"): always the Gaussian at the schema's
    sensitivity (``single-pass`` under single participation, else ``deterministic``); with a
    sampling rate also ``cyclic-poisson`` (2306.08153 Thm. 3) when C is square, lower-triangular
    and has at most b bands. Each is a guarantee for the same training run (cyclic Poisson
    sampling keeps every example inside one schema pattern), so the smallest sigma is valid.

    Formal guarantee: the reported sigma meets (epsilon, delta) under the named accounting (the
    accounting was run at that sigma, :func:`mfcli.accounting.calibrate.calibrate_sigma`).

    ``on_progress`` receives the row's accounting runs as one ``phase`` (:class:`RowProgress`).
    """
    from mfcli.accounting.multi import band_count, check_cyclic, cycle_length

    c = np.asarray(strategy_matrix, dtype=np.float64)
    n = c.shape[1]
    sens = schema_sensitivity(c, schema).value
    cyclic: tuple[int, float] | str = ""
    if target.sampling is not None:
        try:
            check_cyclic(c, cycle_length(schema, n))
        except MfcliError as exc:
            cyclic = str(exc)
        else:
            cyclic = (band_count(c), float(np.sqrt(np.max(np.sum(c * c, axis=0)))))
    frob = float(np.sum(np.asarray(decoder, dtype=np.float64) ** 2))
    return equal_privacy_from(sens, frob, n, schema, target, cyclic=cyclic, rel_tol=rel_tol, on_progress=on_progress,
                              phase=phase)


def equal_privacy_from(sensitivity: float, frob: float, n: int, schema: Participation, target: PrivacyTarget, *,
                       cyclic: tuple[int, float] | str = "", rel_tol: float = 1e-4,
                       on_progress: ProgressCallback | None = None, phase: str = "calibration") -> RowPrivacy:
    """:func:`equal_privacy` from the numbers it needs, so a strategy known by its parameters
    (structured rows at any n, :func:`structured_rows`) is calibrated without a
    dense matrix: the schema sensitivity, ||B||_F^2 at unit sensitivity, n, and for cyclic
    Poisson either (bands, max column norm) of C (2306.08153 Thm. 3 needs nothing else) or the
    reason it does not apply. ``on_progress`` as in :func:`equal_privacy`."""
    from mfcli.accounting.calibrate import bisection_steps, calibrate_sigma
    from mfcli.accounting.multi import reduced_dpsgd
    from mfcli.accounting.single_pass import gaussian_epsilon

    sens = float(sensitivity)
    base = "single-pass" if isinstance(schema, SingleParticipation) else "deterministic"
    note = ""
    amplified: tuple[int, float] | None = None
    if target.sampling is not None:
        # decided before any calibration, so the row's progress knows how many calibrations run
        if isinstance(cyclic, str):
            note = f"cyclic Poisson does not apply: {cyclic}"
        else:
            try:
                # only whether it raises matters; at a large noise multiplier the run is cheap
                reduced_dpsgd(bands=cyclic[0], column_norm=cyclic[1], n=n, schema=schema, sigma=100.0 * cyclic[1],
                              sampling=target.sampling, delta=target.delta)
            except MfcliError as exc:
                note = f"cyclic Poisson does not apply: {exc}"
            else:
                amplified = cyclic
    row = RowProgress(on_progress, phase, calibrations=1 if amplified is None else 2,
                      at_least=1 + bisection_steps(math.log(2.0), rel_tol))
    # the Gaussian's epsilon depends on sigma / sens only: calibrate at unit sensitivity, scale
    unit = calibrate_sigma(lambda s: gaussian_epsilon(target.delta, 1.0 / s), target_epsilon=target.epsilon,
                           rel_tol=rel_tol, on_progress=row.next())
    found = {base: (unit.sigma * sens, unit.epsilon)}
    if amplified is not None:
        bands, col = amplified
        p = target.sampling
        assert p is not None  # amplified only with a sampling rate
        cal = calibrate_sigma(
            lambda s: reduced_dpsgd(bands=bands, column_norm=col, n=n, schema=schema, sigma=s, sampling=p,
                                    delta=target.delta).epsilon,
            target_epsilon=target.epsilon, rel_tol=rel_tol, sigma_start=cyclic_start(unit.sigma * sens),
            on_progress=row.next())
        found["cyclic-poisson"] = (cal.sigma, cal.epsilon)
    best = min(found, key=lambda k: found[k][0])
    sigma, eps = found[best]
    return RowPrivacy(accounting=best, sigma=sigma, epsilon=eps, rmse=sigma * math.sqrt(frob / n),
                      candidates={k: v[0] for k, v in found.items()}, note=note)


def cyclic_start(gaussian_sigma: float) -> float:
    """Where a row's cyclic Poisson calibration starts: amplification lowers sigma, so a quarter of
    the row's Gaussian sigma (kept away from the search's floor)."""
    return max(gaussian_sigma / 4, 1e-2)


class RowProgress:
    """One row's calibrations (the Gaussian, then cyclic Poisson where it applies) reported as one
    ``phase`` counting accounting runs: each calibration's ``calibration`` events are shifted by
    the runs of those before it, and every calibration still to come counts ``at_least`` runs
    (the total a :func:`mfcli.accounting.calibrate.calibrate_sigma` reports first and never goes
    below), so the row reaches ``done == total`` only when its last calibration ends and ``done``
    and ``total`` never decrease (the protocol of :mod:`mfcli.util.progress`)."""

    def __init__(self, callback: ProgressCallback | None, phase: str, *, calibrations: int, at_least: int = 1) -> None:
        self.callback = callback
        self.phase = phase
        self.at_least = at_least
        self._left = calibrations
        self._offset = 0
        self._total = 0

    def next(self) -> ProgressCallback | None:
        """The callback for the next calibration (None without a callback)."""
        if self.callback is None:
            return None
        self._offset += self._total
        self._total = 0
        self._left -= 1
        callback, offset, later = self.callback, self._offset, self._left * self.at_least

        def forward(event: ProgressEvent) -> None:
            self._total = max(self._total, event.total)
            callback(ProgressEvent(self.phase, offset + event.done, offset + event.total + later, event.unit))

        return forward


@dataclass(frozen=True)
class PrivacyEstimate:
    """Up-front cost of calibrating the rows of a comparison at equal privacy.

    ``estimates`` holds one :class:`mfcli.services.cost.CalibrationEstimate` per accounting
    (the Gaussian, then cyclic Poisson where some row can use it), each measured on the identity
    row; ``calibrations[i]`` is how many rows run ``estimates[i]``'s calibration (every row the
    Gaussian's; cyclic Poisson's only the rows whose C has at most b bands, see
    :func:`row_band_counts`). The model is time = sum of calibrations x runs expected x seconds of
    one run. Why it holds to about 2x: a row's cyclic Poisson calibration ends at the same noise
    multiplier sigma / max column norm whatever the row (the reduced DP-SGD depends on nothing
    else), the identity row starts near it, and a run's cost depends on that noise multiplier
    (a run at a quarter of it costs several times more), so the probe runs where the identity row's
    calibration starts, after a warm-up run that takes the one-time import and set-up out of the
    timing."""

    estimates: tuple[Any, ...]
    calibrations: tuple[int, ...]

    def seconds(self) -> tuple[float, float]:
        """(expected, most) seconds of all the rows' calibrations (no report run: the calibrated
        sigma's epsilon is the search's own last run)."""
        pairs = list(zip(self.estimates, self.calibrations, strict=True))
        return (sum(k * e.runs_expected * e.seconds_per_run for e, k in pairs),
                sum(k * e.runs_most * e.seconds_per_run for e, k in pairs))


def row_band_counts(names: Sequence[str], n: int, *, artifacts: int = 0, bands: Sequence[int] = (),
                    buffers: Sequence[int] = ()) -> list[int | None]:
    """The band count of each row's C, as cyclic Poisson accounting (2306.08153 Thm. 3) sees it,
    before any row is built: identity 1; the tree strategies None (C is not square, so cyclic
    Poisson never applies); sqrt, optimal and a BLT n (their C is lower-triangular with non-zero
    entries all the way down). An artifact and a banded Toeplitz row count as 1: an artifact's C
    is unknown until loaded, and a row asked for B bands may have fewer (its optimiser sets the
    coefficients a min-separation schema penalises to zero), so both are counted as banded within
    the cycle and the estimate errs high, never low. Used only to estimate cost
    (:func:`estimate_equal_privacy`); each row's own accounting checks its C
    (:func:`equal_privacy`)."""
    known: dict[str, int | None] = {"identity": 1, **dict.fromkeys(TREE_STRATEGIES), "sqrt": n, "optimal": n}
    return [*(known[name] for name in names), *([1] * (artifacts + len(bands))), *([n] * len(buffers))]


def run_cost_ratio(z1: float, eps1: float, t1: float, z2: float, eps2: float, t2: float, target: float) -> float:
    """How much more (or less) one accounting run costs at the noise multiplier that meets
    ``target`` than at ``z1``, from two timed runs (z1: epsilon eps1, t1 seconds; z2 != z1 likewise,
    best on the target's side of z1, so that the target's z is interpolated, not extrapolated).

    A cyclic Poisson run's cost is the PLD of one Poisson-sampled Gaussian, whose support grows as
    the noise multiplier z falls (measured, 1 thread: about z^-1.5 to z^-2 for z in [0.3, 5]),
    and epsilon falls as z rises. Both are modelled as power laws through the two runs, epsilon ~
    z^-s and seconds ~ z^-a; the target's z is where the first meets ``target``, and the ratio is
    (z1 / z_target)^a. ``a`` is clamped to [0, 3] (timing noise), and a pair from which no law
    follows (epsilon not falling, a zero time) gives 1: the first run's cost."""
    try:
        span = math.log(z2 / z1)
        s = math.log(eps1 / eps2) / span
        a = min(max(math.log(t1 / t2) / span, 0.0), 3.0)
    except (ValueError, ZeroDivisionError):
        return 1.0
    if not (s > 0 and math.isfinite(s) and math.isfinite(a)):
        return 1.0
    z_target = z1 * (eps1 / target) ** (1.0 / s)
    return (z1 / z_target) ** a


def estimate_equal_privacy(n: int, schema: Participation, target: PrivacyTarget, *,
                           row_bands: Sequence[int | None] = (1,), rel_tol: float = 1e-4) -> PrivacyEstimate:
    """Time the first accounting run of each calibration :func:`equal_privacy_from` makes for the
    identity row (the Gaussian at unit sensitivity; cyclic Poisson at one band, from the sigma the
    identity row's calibration starts at, where sampling is given and some row in ``row_bands``,
    the band count of each row's C or None, has at most b bands) and model the rest with
    :func:`mfcli.accounting.calibrate.expected_runs` (:class:`PrivacyEstimate`)."""
    import time

    from mfcli.accounting.calibrate import calibrate_sigma, expected_runs
    from mfcli.accounting.multi import cycle_length, reduced_dpsgd
    from mfcli.accounting.single_pass import gaussian_epsilon
    from mfcli.services.cost import CalibrationEstimate

    def timed(f: Callable[[float], float], sigma: float) -> tuple[float, float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        eps = float(f(sigma))
        return eps, time.perf_counter() - t0, time.process_time() - c0

    def probe(setting: str, f: Callable[[float], float], start: float, *, scaled: bool) -> CalibrationEstimate:
        f(100.0 * start)  # a first call is mostly imports and set-up (and cheap at a large sigma)
        eps, seconds, cpu = timed(f, start)
        if scaled:  # one run's cost near the answer, from a second run where the search goes next
            second = start / 2.0 if eps < target.epsilon else 2.0 * start
            eps2, _, cpu2 = timed(f, second)
            seconds *= run_cost_ratio(start, eps, cpu, second, eps2, cpu2, target.epsilon)
        runs, most = expected_runs(eps, target.epsilon, rel_tol=rel_tol, sigma_start=start)
        return CalibrationEstimate(setting=setting, sigma=start, epsilon=eps, seconds_per_run=seconds,
                                   runs_expected=runs, runs_most=most, memory=None, memory_most=None,
                                   memory_limit=None)

    base = "single-pass" if isinstance(schema, SingleParticipation) else "deterministic"
    out = [probe(base, lambda s: gaussian_epsilon(target.delta, 1.0 / s), 1.0, scaled=False)]
    counts = [len(row_bands)]
    if target.sampling is not None:
        p = target.sampling
        try:
            b = cycle_length(schema, n)
        except MfcliError:
            b = 0  # cyclic Poisson does not apply to this schema; the rows will say why
        cyclic_rows = sum(1 for k in row_bands if k is not None and k <= b)
        if cyclic_rows:
            unit = calibrate_sigma(lambda s: gaussian_epsilon(target.delta, 1.0 / s), target_epsilon=target.epsilon,
                                   rel_tol=rel_tol)
            # the identity row: C = I, sensitivity sqrt(participations), max column norm 1
            start = cyclic_start(unit.sigma * math.sqrt(schema.participations(n)))

            def cyclic_eps(s: float) -> float:
                return reduced_dpsgd(bands=1, column_norm=1.0, n=n, schema=schema, sigma=s, sampling=p,
                                     delta=target.delta).epsilon

            out.append(probe("cyclic-poisson", cyclic_eps, start, scaled=True))
            counts.append(cyclic_rows)
    return PrivacyEstimate(tuple(out), tuple(counts))


@dataclass(frozen=True, eq=False)
class Comparison:
    """The table for one workload. ``best_causal`` names the causal row with the smallest total
    squared error (None if no row is causal, or if that row is ``optimal-single``, which is not
    this schema's optimum); every row's ``ratio`` is relative to that row."""

    workload_name: str
    workload_params: dict[str, Any]
    n: int
    rows: tuple[ComparisonRow, ...]
    best_causal: str | None
    kept: Strategy | None = None
    participation: Participation = field(default_factory=SingleParticipation)
    privacy: PrivacyTarget | None = None

    @property
    def multi(self) -> bool:
        """Whether the schema is other than single participation (the table then says which
        sensitivities are exact and which are upper bounds)."""
        return not isinstance(self.participation, SingleParticipation)

    def units(self) -> str:
        """The conditions every number holds under, e.g. ``single participation, noise
        multiplier 1, clip norm 1``."""
        return f"{self.participation.describe(self.n)}, noise multiplier 1, clip norm 1"

    def best_at_equal_privacy(self) -> str | None:
        """The causal row with the lowest RMSE at the privacy target (None without one)."""
        causal = [r for r in self.rows if r.causal and r.privacy is not None]
        if not causal:
            return None
        best = min(causal, key=lambda r: r.privacy.rmse).name  # type: ignore[union-attr]
        return None if best == SINGLE_OPTIMUM_ROW else best

    def row(self, name: str) -> ComparisonRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def as_dict(self, *, curves: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workload": self.workload_name,
            "workload_params": dict(self.workload_params),
            "n": self.n,
            "units": self.units(),
        }
        if self.multi:
            out["participation"] = schema_dict(self.participation, self.n)
        out["best_causal"] = self.best_causal
        if self.privacy is not None:
            out["at_equal_privacy"] = {**self.privacy.as_dict(), "best_causal": self.best_at_equal_privacy()}
        out["strategies"] = [r.as_dict(curves=curves, schema=self.multi) for r in self.rows]
        return out


def row_for(strategy: Strategy, *, label: str | None = None, participation: Participation | None = None,
            privacy: PrivacyTarget | None = None, on_progress: ProgressCallback | None = None,
            description: str | None = None) -> ComparisonRow:
    """Numbers of one strategy, recomputed from its factorization (ratio filled in later), under
    ``participation`` (None: single participation): the loss of its mechanism
    (:meth:`mfcli.strategies.operators.Mechanism.loss`: sens^2 times the squared row norms of B);
    with ``privacy``, also its sigma and RMSE at that target (:func:`equal_privacy`), its
    calibrations reported to ``on_progress`` as phase :func:`calibration_phase` of the row."""
    from mfcli.strategies.operators import DenseOperator

    f = strategy.factorization
    gap = None
    if strategy.solver and isinstance(strategy.solver.get("gap"), (int, float)):
        gap = float(strategy.solver["gap"])
    return loss_row(
        label or strategy.name, description or strategy.description, DenseOperator(f).loss(schema=participation),
        causal=strategy.causal, m=f.m, source=strategy.source, solver_gap=gap,
        privacy=None if privacy is None else equal_privacy(
            f.strategy, f.decoder, participation or SingleParticipation(), privacy, on_progress=on_progress,
            phase=calibration_phase(label or strategy.name)),
    )


def loss_row(name: str, description: str, loss: Any, *, causal: bool, m: int, privacy: RowPrivacy | None = None,
             source: str | None = None, solver_gap: float | None = None) -> ComparisonRow:
    """The :class:`ComparisonRow` of a mechanism's :class:`~mfcli.strategies.operators.WorkloadLoss`
    (ratio unset): total, mean, RMSE and worst step of its per-step errors, its sensitivity and
    whether that is exact."""
    total = float(np.sum(loss.per_step))
    n = int(loss.per_step.size)
    return ComparisonRow(
        name=name, description=description, causal=causal, m=m, sensitivity=loss.sensitivity.value,
        loss_total=total, loss_mean=total / n, rmse=math.sqrt(total / n), loss_max=float(np.max(loss.per_step)),
        ratio=math.nan, per_step_rmse=np.sqrt(loss.per_step), source=source, solver_gap=solver_gap,
        sensitivity_exact=loss.sensitivity.exact, privacy=privacy,
    )


def mechanism_row(name: str, description: str, mechanism: Any, schema: Participation,
                  privacy: PrivacyTarget | None = None) -> ComparisonRow:
    """The row of any :class:`~mfcli.strategies.operators.Mechanism` from its own numbers, with no
    n x n matrix where its kind needs none: :meth:`~mfcli.strategies.operators.Mechanism.loss`
    under ``schema``, ``causal`` and ``rows`` (m), and with ``privacy`` the calibration :func:`equal_privacy_from` makes from
    the sensitivity, ||B||_F^2 and, for cyclic Poisson sampling, the mechanism's
    :meth:`~mfcli.strategies.operators.Mechanism.cyclic_numbers` (or the reason they do not apply).

    Raises:
        MfcliError: the mechanism has no exact or certified number for this schema, workload or n.
    """
    loss = mechanism.loss(schema=schema)
    row_privacy = None
    if privacy is not None:
        cyclic: tuple[int, float] | str = ""
        if privacy.sampling is not None:
            try:
                cyclic = mechanism.cyclic_numbers(schema)
            except MfcliError as exc:
                cyclic = str(exc)
        row_privacy = equal_privacy_from(loss.sensitivity.value, loss.frobenius, mechanism.n, schema, privacy,
                                         cyclic=cyclic)
    return loss_row(name, description, loss, causal=bool(mechanism.causal), m=int(mechanism.rows), privacy=row_privacy)


def calibration_phase(row: str) -> str:
    """The progress phase of one row's calibrations at equal privacy."""
    return f"calibrating {row}"


#: The row name of the single-participation optimum in a table under a schema with more than one
#: participation: it is optimal for another problem, so it is neither called ``optimal`` nor ranked best.
SINGLE_OPTIMUM_ROW = "optimal-single"


def _with_ratios(rows: Sequence[ComparisonRow]) -> tuple[tuple[ComparisonRow, ...], str | None]:
    """Every row's ratio to the causal row with the lowest total, and that row's name as the best
    causal one, unless it is ``optimal-single``: that row optimises single participation, not the
    table's schema (whose optimum is lower), so it is not called best (None)."""
    causal = [r for r in rows if r.causal]
    if not causal:
        return tuple(rows), None
    best = min(causal, key=lambda r: r.loss_total)
    out = []
    for r in rows:
        d = dict(r.__dict__)
        d["ratio"] = r.loss_total / best.loss_total
        out.append(ComparisonRow(**d))
    return tuple(out), None if best.name == SINGLE_OPTIMUM_ROW else best.name


def check_kept_strategy(keep: Any) -> str:
    """The strategy a comparison keeps to be saved (``keep``, ``--save-strategy``): one of
    :data:`~mfcli.strategies.baselines.STRATEGY_NAMES`."""
    if keep not in STRATEGY_NAMES:
        raise MfcliError(f"unknown strategy {keep!r} to save; choose from {', '.join(STRATEGY_NAMES)}")
    return str(keep)


def run_comparison(
    workload: Workload,
    names: Sequence[str] | None = None,
    *,
    artifacts: Sequence[str | Path] = (),
    tol: float = 1e-6,
    max_iter: int = 1000,
    progress: Callable[[str], None] | None = None,
    solver_callback: Callable[[Any], None] | None = None,
    keep: str | None = None,
    participation: Participation | None = None,
    privacy: PrivacyTarget | None = None,
    on_progress: ProgressCallback | None = None,
) -> Comparison:
    """Build each named strategy for ``workload`` and tabulate its error.

    With ``artifacts``, each artifact becomes a row named ``<stored strategy name> (<file>)`` and
    the solver is not run: the artifacts stand for ``optimal``. Each artifact must have been made
    for this workload (same n and A). Strategies are built one at a time and only their numbers
    are kept, so memory stays at a few n x m matrices.

    With ``keep`` (a strategy name), that strategy object is kept in ``Comparison.kept`` (for
    saving as an artifact), built even if it is not among ``names``; with ``artifacts``,
    ``keep="optimal"`` keeps the first artifact's strategy.

    With ``participation`` (a schema; None means the schema the artifacts declare, else single
    participation: :func:`comparison_schema`, which refuses a contradiction), every row's
    sensitivity and losses are those of its strategy under the schema (:func:`row_for`). The
    strategies themselves are not changed: ``optimal`` is still the single-participation optimum, so
    when the schema allows more than one participation its row is named ``optimal-single``
    (:data:`SINGLE_OPTIMUM_ROW`), described as such and not ranked best; the schema's own optimum
    is a row only from an artifact (``artifacts``) made for that schema.

    With ``privacy``, every row is also calibrated to that (epsilon, delta) (:func:`equal_privacy`);
    ``on_progress`` then receives each row's accounting runs as phase ``calibrating <row>``.

    Formal guarantees: each row is recomputed from a factorization verified A = B C; ``causal``
    is checked in release order by :func:`mfcli.strategies.baselines.build_strategy`.
    """
    names = tuple(names) if names else STRATEGY_NAMES
    schema = comparison_schema(artifacts, participation)
    schema.check(workload.n)
    for name in names:
        if name not in STRATEGY_NAMES:
            raise MfcliError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}")
    if keep is not None:
        check_kept_strategy(keep)
    # The artifacts stand for the solved kind (the certified optimum): its rows come from them, unsolved.
    stand_in = SOLVED if artifacts else ()
    wanted = list(names)
    wanted += [name for name in stand_in if name not in wanted]
    if keep is not None and keep not in wanted:
        wanted.append(keep)
    trees = [name for name in wanted if name in TREE_STRATEGIES]
    if workload.n < 2 and trees:
        raise MfcliError(
            f"a binary tree needs n >= 2 steps, got n = {workload.n}; leave out {', '.join(trees)} "
            "(with one step the tree is the identity strategy)"
        )
    rows: list[ComparisonRow] = []
    kept: Strategy | None = None
    for name in wanted:
        if name in stand_in:
            for path in artifacts:
                if progress:
                    progress(f"loading {path}")
                s = strategy_from_artifact(path, workload)
                rows.append(row_for(s, label=f"{s.name} ({Path(path).name})", participation=schema, privacy=privacy,
                                    on_progress=on_progress))
            if keep == name:
                kept = strategy_from_artifact(artifacts[0], workload)
            continue
        solved = name in SOLVED
        if progress:
            progress(f"building {name}" + (" (solving)" if solved else ""))
        s = build_strategy(name, workload, tol=tol, max_iter=max_iter, callback=solver_callback)
        if name in names:
            if progress and privacy is not None:
                progress(f"calibrating {name} at epsilon {privacy.epsilon:g}")
            single_optimum = solved and schema.participations(workload.n) > 1
            rows.append(row_for(
                s, participation=schema, privacy=privacy, on_progress=on_progress,
                label=SINGLE_OPTIMUM_ROW if single_optimum else None,
                description=f"optimal for single participation, not for {schema.describe(workload.n)} "
                            f"({s.description})" if single_optimum else None))
        if name == keep:
            kept = s
        del s
    table_rows, best = _with_ratios(rows)
    return Comparison(workload.name, dict(workload.params), workload.n, table_rows, best, kept, schema, privacy)


# ---------------------------------------------------------------------------------------------
# Rows of structured strategies, the tree's in closed form and identity at any n (no dense matrix)


def structured_rows(
    workload: Any,
    n: int,
    *,
    bands: tuple[int, ...] = (),
    identity: bool = False,
    participation: Participation | None = None,
    error: str = "mean",
    buffers: tuple[int, ...] = (),
    tree: bool = False,
    privacy: Any = None,
    baselines: Sequence[str] = (),
    skipped: list[str] | None = None,
) -> list[Any]:
    """:class:`ComparisonRow` objects (ratio unset) of mechanisms known by their parameters, at any
    n with no n x n matrix, each from its :meth:`~mfcli.strategies.operators.Mechanism.loss`
    (:func:`mechanism_row`): the ``baselines`` (and ``identity`` / ``tree``, kept as switches) as
    :func:`mfcli.strategies.baseline_mechanisms.baseline_mechanism`, in registry order; banded
    Toeplitz strategies (``bands``) and BLT strategies (``buffers``) optimised for ``workload``, n
    and the schema, O(n b) or O(n buffers) each.

    With ``privacy`` (a :class:`PrivacyTarget`) every row is calibrated to it as dense rows are
    (:func:`equal_privacy_from`): the Gaussian at the schema sensitivity always, cyclic Poisson
    where C has at most b bands (its band count and max column norm from the parameters, O(n));
    the tree's non-square C gets the Gaussian only.

    A baseline that has no exact or certified number for this schema, workload and n (the tree
    under min-separation, the Honaker estimators on a momentum workload, above the dense limit)
    is refused (:class:`MfcliError`); with ``skipped`` (a list) the ``tree`` switch's row is
    left out instead and the reason appended."""
    from mfcli.model.kinds import ANY_N_BASELINES
    from mfcli.strategies.baseline_mechanisms import baseline_mechanism
    from mfcli.strategies.structured import StructuredOperator
    from mfcli.strategies.toeplitz import check_bands, check_n, optimize_banded_toeplitz

    n = check_n(n)
    schema = participation or SingleParticipation()
    schema.check(n)
    wanted = set(baselines) | ({"identity"} if identity else set()) | ({"tree"} if tree else set())
    # the row the tree switch adds (not named in baselines) may be left out with its reason
    optional = (({"tree"} if tree else set()) - set(baselines)) if skipped is not None else set()
    rows = []
    for name in (k for k in ANY_N_BASELINES if k in wanted):
        mech = baseline_mechanism(name, workload, n)
        try:
            rows.append(mechanism_row(name, mech.description, mech, schema, privacy))
        except MfcliError as exc:
            if skipped is None or name not in optional:
                raise
            skipped.append(f"{name}: {exc}")
    for b in bands:
        b = check_bands(b, n)
        strat = optimize_banded_toeplitz(n, b, workload=workload, schema=schema, error=error).strategy
        # The optimiser may set the last coefficients exactly to 0 (e.g. under min-sep with fewer
        # bands than b): say how many bands C really has, which is what the accounting used.
        nonzero = np.flatnonzero(np.asarray(strat.coefs))
        used = int(nonzero[-1]) + 1 if nonzero.size else 0
        really = "" if used == b else f" ({used} non-zero: the optimiser set the others to 0)"
        rows.append(mechanism_row(f"banded-toeplitz-{b}",
                                  f"banded Toeplitz C, {b} bands{really}, optimised for {error} error",
                                  StructuredOperator(strat, workload, n), schema, privacy))
    for k in buffers:
        from mfcli.strategies.blt import optimize_blt

        opt = optimize_blt(n=n, buffers=k, workload=workload.name,
                           beta=workload.beta if workload.name == "momentum" else None, error=error, schema=schema)
        rows.append(mechanism_row(f"blt-{k}", f"BLT C, {k} buffers, optimised for {error} error",
                                  StructuredOperator(opt.blt, workload, n), schema, privacy))
    return rows


def tree_row(workload: Any, n: int) -> Any:
    """The binary tree's :class:`ComparisonRow` (single participation) without a dense matrix:
    sens^2 = K + 1 times ||B[t, :]||^2 from :func:`mfcli.strategies.tree_error.tree_row_norms`."""
    return structured_rows(workload, n, tree=True)[0]


def extend_comparison(table: Any, rows: list[Any]) -> Any:
    """``table`` (a :class:`Comparison`) with ``rows`` added and every ratio recomputed
    against the best causal row."""
    all_rows, best = _with_ratios([*table.rows, *rows])
    return Comparison(table.workload_name, table.workload_params, table.n, all_rows, best, table.kept,
                      table.participation, table.privacy)


def structured_comparison(workload: Any, n: int, *, bands: tuple[int, ...],
                          participation: Participation | None = None, error: str = "mean",
                          buffers: tuple[int, ...] = (), privacy: Any = None, baselines: Sequence[str] = (),
                          skipped: list[str] | None = None) -> Any:
    """A :class:`Comparison` at any n (no n x n matrix: O(n log n) time, O(n) memory per row) of
    the ``baselines`` (by default identity and the binary tree, which is left out with its reason
    in ``skipped`` where the schema has no exact number for it), banded Toeplitz and BLT
    strategies, calibrated to ``privacy`` (a :class:`PrivacyTarget`) when given
    (:func:`structured_rows`)."""
    from mfcli.strategies.structured import workload_params
    from mfcli.strategies.toeplitz import check_n

    schema = participation or SingleParticipation()
    default = not baselines
    rows = structured_rows(workload, n, bands=bands, identity=default, participation=schema, error=error,
                           buffers=buffers, tree=default and n >= 2, privacy=privacy, baselines=baselines,
                           skipped=skipped if skipped is not None else [])
    empty = Comparison(workload.name, workload_params(workload), check_n(n), (), None, None, schema, privacy)
    return extend_comparison(empty, rows)
