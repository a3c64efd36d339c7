"""Progress displays on stderr: the solver's duality-gap panel (optimize, compare) and the
progress bars of long accounting computations (account: MMCC, calibration)."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from rich.live import Live
from rich.markup import escape
from rich.table import Table

from mfcli.cli.common import log, stderr

if TYPE_CHECKING:
    from mfcli.optimize.dense import Progress
    from mfcli.services.cost import CalibrationEstimate
    from mfcli.util.progress import ProgressEvent


class SolverDisplay:
    """Live duality-gap panel on a terminal; a plain stderr line every few seconds otherwise.

    A coarse-level step (:class:`~mfcli.optimize.dense.Progress` with ``stage`` set, before the first
    full-size iteration of a coarse-to-fine solve) is shown as its stage line alone, with no
    primal, dual or gap: a coarse problem certifies nothing about the real one."""

    def __init__(self, *, quiet: bool, title: str, interval: float = 2.0) -> None:
        self.quiet = quiet
        self.title = title
        self.interval = interval
        self.tty = sys.stderr.isatty()
        self._live: Live | None = None
        self._last = -float("inf")
        self._prev: Progress | None = None
        self._stage = ""

    def __enter__(self) -> SolverDisplay:
        if not self.quiet and self.tty:
            self._live = Live(self._panel(None), console=stderr(), refresh_per_second=8, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _rate(self, p: Progress) -> float:
        return p.iteration / p.seconds if p.seconds > 0 else float("nan")

    def _panel(self, p: Progress | None) -> Table:
        t = Table(title=self.title, title_justify="left")
        for col in ("iter", "primal (loss)", "dual bound", "rel. gap", "it/s", "elapsed"):
            t.add_column(col, justify="right")
        if p is not None and p.stage:
            t.caption = escape(f"{p.stage}; step {p.iteration}, {p.seconds:.1f}s")
            t.caption_justify = "left"
        elif p is not None:
            t.add_row(
                str(p.iteration), f"{p.primal:.10g}", f"{p.dual:.10g}", f"{p.gap:.3e}",
                f"{self._rate(p):.2f}", f"{p.seconds:.1f}s",
            )
        return t

    def __call__(self, p: Progress) -> None:
        if self.quiet:
            return
        if self._live is not None:
            self._live.update(self._panel(p))
            return
        now = time.monotonic()
        if p.stage:
            level = p.stage.split(":", 1)[0]
            if now - self._last >= self.interval or level != self._stage:
                self._last, self._stage = now, level
                log(f"{p.stage}; step {p.iteration}, {p.seconds:.1f}s")
            return
        if now - self._last >= self.interval or p.iteration == 1:
            self._last = now
            log(
                f"iter {p.iteration:5d}  primal {p.primal:.10g}  dual {p.dual:.10g}  "
                f"gap {p.gap:.3e}  {self._rate(p):.2f} it/s  {p.seconds:.1f}s"
            )


class ProgressDisplay:
    """Renders :class:`mfcli.util.progress.ProgressEvent` on stderr: on a terminal, a rich progress
    bar per phase with percentage, elapsed time and ETA; elsewhere (a log file, a pipe) a plain
    line at a few milestones of a phase that has run for a while, so a log never floods: only
    the calibration's own phase while one runs (its accounting runs repeat the inner phases),
    and each other phase only the first time it runs. Stage messages (:meth:`log`) go above the
    bars on a terminal and are plain lines elsewhere. Nothing is written to stdout."""

    #: Fractions at which a non-terminal gets a line, once the phase has run ``after`` seconds.
    MILESTONES = (0.25, 0.5, 0.75)

    def __init__(self, *, quiet: bool, tty: bool | None = None, after: float = 2.0) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.after = after
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._started: dict[str, float] = {}
        self._next: dict[str, int] = {}
        self._finished: set[str] = set()
        self._calibrating = False

    def __enter__(self) -> ProgressDisplay:
        if not self.quiet and self.tty:
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                TextColumn("{task.completed:.0f}/{task.total:.0f} {task.fields[unit]}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=stderr(), transient=False, refresh_per_second=8,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def log(self, message: str) -> None:
        """A stage message: above the bars on a terminal, a plain stderr line otherwise."""
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False)
        else:
            log(message)

    def __call__(self, event: ProgressEvent) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._bar(event)
        else:
            self._plain(event)

    def _bar(self, e: ProgressEvent) -> None:
        p = self._progress
        task = self._tasks.get(e.phase)
        if task is None:
            task = self._tasks[e.phase] = p.add_task(e.phase, total=e.total, unit=e.unit)
        elif e.done == 0:  # the phase runs again (the next accounting run of a calibration)
            p.reset(task, total=e.total)
        p.update(task, completed=e.done, total=e.total)

    def _plain(self, e: ProgressEvent) -> None:
        now = time.monotonic()
        if e.phase == "calibration":
            self._calibrating = e.done < e.total
        elif self._calibrating or e.phase in self._finished:
            return
        if e.phase not in self._started:
            self._started[e.phase] = now
            self._next[e.phase] = 0
        if e.done >= e.total:
            self._finished.add(e.phase)
        elapsed = now - self._started[e.phase]
        i = self._next[e.phase]
        crossed = i
        while crossed < len(self.MILESTONES) and e.fraction >= self.MILESTONES[crossed]:
            crossed += 1
        if crossed == i:
            return
        self._next[e.phase] = crossed
        if elapsed < self.after or e.done >= e.total:
            return
        eta = elapsed * (1 - e.fraction) / e.fraction
        log(f"{e.phase}: {e.fraction:.0%} ({e.done}/{e.total} {e.unit}), {elapsed:.0f} s elapsed, ETA {eta:.0f} s")


def _duration(seconds: float) -> str:
    # an estimate: rounded up, never shown smaller than it is
    import math

    if seconds < 60:
        return f"{math.ceil(seconds * 10) / 10:.1f} s"
    if seconds < 3600:
        return f"{math.ceil(seconds / 6) / 10:.1f} min"
    return f"{math.ceil(seconds / 360) / 10:.1f} h"


#: The estimate's duration as text, rounded up (shared by the commands that print estimates).
duration_text = _duration


def describe_estimate(est: CalibrationEstimate) -> str:
    """One stderr line: the measured first run, the runs expected and their time, and the memory
    of one run next to the limit."""
    from mfcli.util.memory import format_size

    limit = "no limit" if est.memory_limit is None else f"limit {format_size(est.memory_limit)}"
    if est.memory is None or est.memory_most is None:
        memory = f"memory: no table that grows with C ({limit})"
    else:
        memory = (f"memory per run about {format_size(est.memory)}, up to {format_size(est.memory_most)} if every "
                  f"tail problem is distinct ({limit})")
    return (f"estimate: first run {_duration(est.seconds_per_run)} (sigma {est.sigma:g} -> epsilon {est.epsilon:.4g}); "
            f"about {est.runs_expected} runs and the report, {_duration(est.seconds_expected)} in all "
            f"(at most {est.runs_most} runs, {_duration(est.seconds_most)}); {memory}")
