"""Progress displays shared by the commands that run the solver (optimize, compare)."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from rich.live import Live
from rich.table import Table

from mfcli.cli.common import log, stderr

if TYPE_CHECKING:
    from mfcli.solver import Progress


class SolverDisplay:
    """Live duality-gap panel on a terminal; a plain stderr line every few seconds otherwise."""

    def __init__(self, *, quiet: bool, title: str, interval: float = 2.0) -> None:
        self.quiet = quiet
        self.title = title
        self.interval = interval
        self.tty = sys.stderr.isatty()
        self._live: Live | None = None
        self._last = -float("inf")
        self._prev: Progress | None = None

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
        if p is not None:
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
        if now - self._last >= self.interval or p.iteration == 1:
            self._last = now
            log(
                f"iter {p.iteration:5d}  primal {p.primal:.10g}  dual {p.dual:.10g}  "
                f"gap {p.gap:.3e}  {self._rate(p):.2f} it/s  {p.seconds:.1f}s"
            )
