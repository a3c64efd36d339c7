"""Progress of long computations, reported as data: the library calls a callback with
:class:`ProgressEvent` objects and never renders; a front end (the CLI's stderr display, a
notebook, a log) decides what to show.

Protocol: for one ``phase`` the events carry ``done`` non-decreasing from 0 and ``total``
non-decreasing, and the last event of a completed phase has ``done == total``. A phase that
starts again (the next accounting run inside a calibration) starts again at ``done == 0``.
Phases nest: a calibration's ``calibration`` events interleave with the phases of each
accounting run it makes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressEvent:
    """``done`` of ``total`` units of ``phase`` are finished.

    Attributes:
        phase: what runs, e.g. ``"MMCC tail events"`` or ``"calibration"``.
        done: units finished (0 <= done <= total).
        total: units in the phase (may grow while the phase runs, e.g. a calibration's
            evaluations before its bracket is known; never shrinks).
        unit: what is counted (``"rows"``, ``"accounting runs"``).
    """

    phase: str
    done: int
    total: int
    unit: str = "steps"

    @property
    def fraction(self) -> float:
        """done / total in [0, 1] (1 for an empty phase)."""
        return 1.0 if self.total <= 0 else min(1.0, self.done / self.total)


#: What library functions accept as ``on_progress``.
ProgressCallback = Callable[[ProgressEvent], None]


class Ticker:
    """Emits a phase's events without flooding the callback: at ``done == 0``, whenever at least
    1/``steps`` of the total has been added since the last event, and at ``done == total``.

    ``Ticker(None, ...)`` does nothing, so a loop can call it unconditionally."""

    def __init__(self, callback: ProgressCallback | None, phase: str, total: int, *, unit: str = "steps",
                 steps: int = 100) -> None:
        self.callback = callback
        self.phase = phase
        self.total = max(0, int(total))
        self.unit = unit
        self._stride = max(1, self.total // max(1, steps))
        self._last = -1
        if callback is not None:
            self._emit(0)

    def _emit(self, done: int) -> None:
        assert self.callback is not None
        self._last = done
        self.callback(ProgressEvent(self.phase, done, self.total, self.unit))

    def __call__(self, done: int) -> None:
        """``done`` units are finished (values above the total are clamped)."""
        if self.callback is None:
            return
        done = min(int(done), self.total)
        if done > self._last and (done - self._last >= self._stride or done == self.total):
            self._emit(done)

    def finish(self) -> None:
        """The phase is complete: the final event with ``done == total`` (once)."""
        if self.callback is not None and self._last != self.total:
            self._emit(self.total)


__all__ = ["ProgressCallback", "ProgressEvent", "Ticker"]
