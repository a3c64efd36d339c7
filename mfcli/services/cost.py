"""Up-front cost of a calibration: memory from MMCC's memory model before anything runs (a run
over the limit is refused here, with its estimate), time from a measured first accounting run.

A calibration (:func:`mfcli.services.account.calibrate`) repeats one accounting run at
different sigmas: a bracketing walk (doubling or halving sigma) and then bisection in log sigma
(:func:`mfcli.accounting.calibrate.calibrate_sigma`). The cost model is therefore

    time  ~ (runs expected) x (seconds of the first run, measured here),
    memory ~ the largest single run (runs do not overlap),

where the runs expected come from :func:`mfcli.accounting.calibrate.expected_runs` and MMCC's
memory from :func:`mfcli.accounting.mmcc.tail_pairs_memory` (the part known before its tail
events are collected, and the part that grows with the number of distinct tail problems). The
other settings hold no table that grows with C beyond C itself. The first run is the
calibration's own first run: :func:`~mfcli.services.account.calibrate` takes it as ``probe``
and does not repeat it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from mfcli.accounting.calibrate import expected_runs
from mfcli.model.participation import Participation
from mfcli.services.account import (
    AccountingOptions,
    StrategyInput,
    calibration_start,
    check_setting_applies,
    epsilon_function,
)
from mfcli.util.memory import check_memory
from mfcli.util.progress import ProgressCallback

#: What to do instead of a calibration that would not fit (no CLI flag is named here).
WAY_FORWARD = ("raise the memory limit, or calibrate a strategy with fewer steps or fewer nonzeros "
               "(a banded or compressed C), or a setting other than mmcc")


@dataclass(frozen=True)
class CalibrationEstimate:
    """The cost model of one calibration and the first run it is measured from.

    Attributes:
        setting: the setting calibrated.
        sigma, epsilon: the first run (at the search's start) and its epsilon.
        seconds_per_run: wall time of that run.
        runs_expected: runs the search is expected to make, the first included.
        runs_most: runs the search can make at most before it gives up.
        memory: bytes one run needs before MMCC collects its tail events (MMCC only; None for
            the other settings, which hold no table that grows with C).
        memory_most: bytes one MMCC run needs if every tail problem is distinct (None likewise).
        memory_limit: the limit checked (None: no limit).
    """

    setting: str
    sigma: float
    epsilon: float
    seconds_per_run: float
    runs_expected: int
    runs_most: int
    memory: int | None
    memory_most: int | None
    memory_limit: int | None

    @property
    def seconds_expected(self) -> float:
        """The expected runs of the search and one more: the report at the calibrated sigma."""
        return (self.runs_expected + 1) * self.seconds_per_run

    @property
    def seconds_most(self) -> float:
        return (self.runs_most + 1) * self.seconds_per_run

    def as_dict(self) -> dict:
        return {
            "setting": self.setting, "probe_sigma": self.sigma, "probe_epsilon": self.epsilon,
            "seconds_per_run": self.seconds_per_run, "runs_expected": self.runs_expected,
            "runs_most": self.runs_most, "seconds_expected": self.seconds_expected,
            "seconds_most": self.seconds_most, "memory_bytes": self.memory,
            "memory_bytes_most": self.memory_most, "memory_limit_bytes": self.memory_limit,
        }


def calibration_memory(inp: StrategyInput, setting: str, *, sigma: float) -> tuple[int | None, int | None]:
    """(known before the run, most) bytes of one accounting run of ``setting`` at ``sigma``
    (None, None) for the settings without a growing table (everything but MMCC)."""
    if setting != "mmcc":
        return None, None
    from mfcli.accounting.mmcc import default_tail_resolution, prepare_strategy, tail_pairs_memory

    check_setting_applies(inp, "mmcc")
    prep = prepare_strategy(inp.strategy, inp.release_steps)
    return tail_pairs_memory(prep, resolution=default_tail_resolution(sigma / prep.sensitivity))


def estimate_calibration(
    inp: StrategyInput,
    setting: str,
    *,
    target_epsilon: float,
    sampling: float | None,
    options: AccountingOptions | None = None,
    participation: Participation | None = None,
    rel_tol: float = 1e-3,
    on_progress: ProgressCallback | None = None,
) -> CalibrationEstimate:
    """Check the memory model against ``options.max_memory``, then make the calibration's first
    run (timed) and model the rest (module docstring).

    Raises:
        MemoryLimitError: one run's memory estimate exceeds ``options.max_memory``; raised
            before any run, naming the estimate and a way forward.
        MfcliError: the setting does not apply (as :func:`~mfcli.services.account.calibrate`).
    """
    from mfcli.util.validation import positive_number

    target = positive_number(target_epsilon, "the target epsilon")
    options = options if options is not None else AccountingOptions()
    f = epsilon_function(inp, setting, sampling=sampling, options=options, participation=participation,
                         on_progress=on_progress)
    start = calibration_start(setting)
    memory, memory_most = calibration_memory(inp, setting, sigma=start)
    if memory is not None:
        check_memory(memory, options.max_memory, way_forward=WAY_FORWARD,
                     what=f"calibrating mmcc for this {inp.strategy.shape[0]} x {inp.n} strategy (one accounting run)")
    t0 = time.perf_counter()
    eps = float(f(start))
    seconds = time.perf_counter() - t0
    runs, most = expected_runs(eps, target, rel_tol=rel_tol, sigma_start=start)
    return CalibrationEstimate(setting=setting, sigma=start, epsilon=eps, seconds_per_run=seconds,
                               runs_expected=runs, runs_most=most, memory=memory, memory_most=memory_most,
                               memory_limit=options.max_memory)


__all__ = ["WAY_FORWARD", "CalibrationEstimate", "calibration_memory", "estimate_calibration"]
