"""Presentation for the command line: option parsing, text tables and plots of library results.

The library computes :class:`~mfcli.compare.Comparison` tables and
:class:`~mfcli.inspection.InspectionReport` checks; this module turns them into what a user reads
(Markdown, CSV, a terminal table, PNG plots) and parses the comma-separated lists the options
accept. Messages here may name flags; the library's
never do.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from rich import box
from rich.table import Table

from mfcli.artifact import atomic_path, check_output_path
from mfcli.compare import COLUMNS, Comparison
from mfcli.errors import MfcliError
from mfcli.inspection import InspectionReport
from mfcli.strategies import STRATEGY_NAMES

#: Compact headers for the terminal; the caption says what they mean.
SHORT_HEADERS = ("strategy", "causal", "sens", "total", "mean", "RMSE", "max step", "ratio")

MATPLOTLIB_MISSING = (
    "--plot needs matplotlib, which is not installed; install the plot extra: pip install 'mfcli[plot]'"
)


def parse_strategy_names(values: Iterable[str] | None) -> tuple[str, ...]:
    """Split the comma-separated ``--strategies`` values, drop duplicates (keeping order), reject
    unknown ones. None or nothing means all of :data:`~mfcli.strategies.STRATEGY_NAMES`."""
    names: list[str] = []
    for value in values or ():
        for part in str(value).split(","):
            name = part.strip()
            if not name:
                continue
            if name not in STRATEGY_NAMES:
                raise MfcliError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}")
            if name not in names:
                names.append(name)
    if not names and values:
        raise MfcliError("--strategies is empty; choose from " + ", ".join(STRATEGY_NAMES))
    return tuple(names) if names else STRATEGY_NAMES


def _num(v: Any, digits: int = 6) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v == 0 or 1e-3 <= abs(v) < 1e7:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 2, 1)}e}"


def table_cells(table: Comparison) -> list[list[str]]:
    """Rows of display strings, in :data:`~mfcli.compare.COLUMNS` order."""
    return [
        [
            r.name,
            "yes" if r.causal else "no",
            _num(r.sensitivity),
            _num(r.loss_total),
            _num(r.loss_mean),
            _num(r.rmse),
            _num(r.loss_max),
            _num(r.ratio, 4),
        ]
        for r in table.rows
    ]


def title(table: Comparison) -> str:
    """``<workload> workload, n = N (params)``: the caption of every rendering."""
    params = ", ".join(f"{k}={v}" for k, v in sorted(table.workload_params.items()))
    return f"{table.workload_name} workload, n = {table.n}" + (f" ({params})" if params else "")


def render_markdown(table: Comparison) -> str:
    """A GitHub-flavoured Markdown table with a caption line."""
    head = [h for _, h in COLUMNS]
    lines = [
        f"**{title(table)}**; single participation, noise multiplier 1, clip norm 1",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    for cells in table_cells(table):
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_csv(table: Comparison) -> str:
    """CSV with full-precision numbers (repr of the floats), one row per strategy."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([key for key, _ in COLUMNS] + ["m", "description"])
    for r in table.rows:
        w.writerow(
            [
                r.name, str(r.causal).lower(), repr(r.sensitivity), repr(r.loss_total), repr(r.loss_mean),
                repr(r.rmse), repr(r.loss_max), "" if math.isnan(r.ratio) else repr(r.ratio), r.m, r.description,
            ]
        )
    return buf.getvalue()


def rich_table(table: Comparison) -> Table:
    """The terminal table (compact headers, a caption with the units)."""
    t = Table(
        title=title(table),
        caption="squared errors (total, mean per step, worst step), single participation, noise multiplier 1, "
        "clip norm 1; ratio = total / best causal total",
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for i, head in enumerate(SHORT_HEADERS):
        t.add_column(head, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for cells in table_cells(table):
        t.add_row(*cells)
    return t


def check_plot_target(path: str | Path, *, force: bool = False) -> Path:
    """Refuse a plot target before any work is done: matplotlib missing, a name not ending in
    .png, or an existing file without ``force``."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MfcliError(MATPLOTLIB_MISSING) from None
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise MfcliError(f"the plot is written as PNG; give a file name ending in .png, not {target.name}")
    return check_output_path(target, force=force)


def plot_per_step(table: Comparison, path: str | Path, *, force: bool = False) -> Path:
    """Per-step RMSE curves of every row (log scale), written atomically as a PNG.

    Raises:
        MfcliError: matplotlib is missing (install the ``plot`` extra), the name does not end in
            .png, or ``path`` exists and ``force`` is not set.
    """
    target = check_plot_target(path, force=force)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5), dpi=120)
    steps = np.arange(1, table.n + 1)
    width = 1.3 if table.n <= 256 else 0.7  # tree curves jump at every step; keep them legible
    for r in table.rows:
        style = "-" if r.causal else "--"
        ax.plot(steps, r.per_step_rmse, style, label=f"{r.name} (RMSE {_num(r.rmse, 4)})", linewidth=width)
    ax.set_yscale("log")
    ax.set_xlabel("step t")
    ax.set_ylabel("per-step RMSE  sens(C) ||B[t, :]||")
    ax.set_title(title(table) + "\nsingle participation, noise multiplier 1; dashed = not causal", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    try:
        with atomic_path(target, force=force) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return target


def plot_report(report: InspectionReport, out: str | Path, *, force: bool = False) -> Path:
    """Write a PNG: |C| and |B| as heatmaps on a log colour scale, and the expected squared error
    of every step, sens(C)^2 ||B[t, :]||^2 (and of the compressed decoder, if any).

    Written atomically. Needs matplotlib (``pip install 'mfcli[plot]'``).

    Raises:
        MfcliError: matplotlib missing, or no readable matrices to plot.
    """
    try:
        from matplotlib.colors import LogNorm
        from matplotlib.figure import Figure
    except ImportError:
        raise MfcliError("--plot needs matplotlib: pip install 'mfcli[plot]'") from None
    fact = report.factorization
    if fact is None:
        raise MfcliError(f"{report.path}: no readable matrices to plot")
    target = Path(out)
    if target.suffix.lower() != ".png":
        raise MfcliError(f"the plot file must end in .png, got {target.name}")

    fig = Figure(figsize=(15, 4.6), constrained_layout=True)
    axes = fig.subplots(1, 3)
    for ax, mat, title in (
        (axes[0], fact.strategy, "|C| (strategy)"),
        (axes[1], fact.decoder, "|B| (decoder)"),
    ):
        absm = np.abs(mat)
        positive = absm[absm > 0]
        if positive.size:
            vmax = float(positive.max())
            vmin = max(float(positive.min()), vmax * 1e-12)
            shown = np.ma.masked_less_equal(absm, 0)
            im = ax.imshow(shown, norm=LogNorm(vmin=vmin, vmax=vmax), cmap="viridis", interpolation="nearest")
            fig.colorbar(im, ax=ax, shrink=0.85)
        ax.set_title(f"{title}, log scale")
        ax.set_xlabel("column j")
        ax.set_ylabel("row t")
    steps = np.arange(fact.n)
    axes[2].plot(steps, fact.per_step_error, label=f"dense: sens(C)^2 ||B[t]||^2, total {fact.loss_total:.6g}")
    if report.compressed is not None:
        comp = report.compressed
        axes[2].plot(
            steps, comp.factorization.per_step_error, "--",
            label=f"compressed K={comp.band} R={comp.rank}: total {comp.loss_total:.6g}",
        )
    axes[2].set_title("expected squared error per step")
    axes[2].set_xlabel("step t")
    axes[2].set_ylabel("squared error (noise multiplier 1, clip 1)")
    axes[2].legend(fontsize=8)
    name = report.attrs.get("workload_name", "?")
    fig.suptitle(f"{report.path.name}: {name}, {report.attrs.get('strategy_name', '?')}, n = {fact.n}")
    with atomic_path(target, force=force) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    return target
