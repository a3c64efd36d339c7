"""PNG plots for the command line: per-step error curves (``compare --plot``) and the artifact
report (``inspect --plot``).

Kept apart from :mod:`mfcli.cli.render` so that ``inspect`` does not import the comparison
machinery (scipy) it never uses; matplotlib is imported only when a plot is drawn.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mfcli.errors import MfcliError
from mfcli.io.artifact import atomic_path, check_output_path

if TYPE_CHECKING:
    from mfcli.services.compare import Comparison
    from mfcli.services.inspect import InspectionReport

MATPLOTLIB_MISSING = (
    "--plot needs matplotlib, which is not installed; install the plot extra: pip install 'mfcli[plot]'"
)


def check_plot_target(path: str | Path, *, force: bool = False) -> Path:
    """Refuse a plot target before any work is done: matplotlib missing, a name not ending in
    .png, or an existing file without ``force``."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MfcliError(MATPLOTLIB_MISSING) from None
    return check_output_path(_png(path), force=force)


def _png(path: str | Path) -> Path:
    """The plot's path, refused in one line unless it ends in .png (the one rule for every plot)."""
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise MfcliError(f"the plot is written as PNG; give a file name ending in .png, not {target.name}")
    return target


def plot_per_step(table: Comparison, path: str | Path, *, force: bool = False) -> Path:
    """Per-step RMSE curves of every row (log scale), written atomically as a PNG.

    Raises:
        MfcliError: matplotlib is missing (install the ``plot`` extra), the name does not end in
            .png, or ``path`` exists and ``force`` is not set.
    """
    from mfcli.cli.render import _num, title

    target = check_plot_target(path, force=force)
    fig, ax = wide_axes()
    steps = np.arange(1, table.n + 1)
    width = 1.3 if table.n <= 256 else 0.7  # tree curves jump at every step; keep them legible
    for r in table.rows:
        style = "-" if r.causal else "--"
        ax.plot(steps, r.per_step_rmse, style, label=f"{r.name} (RMSE {_num(r.rmse, 4)})", linewidth=width)
    ax.set_yscale("log")
    ax.set_xlabel("step t")
    ax.set_ylabel("per-step RMSE  sens(C) ||B[t, :]||")
    # title() names a schema other than single participation itself.
    units = "noise multiplier 1" if table.multi else "single participation, noise multiplier 1"
    ax.set_title(f"{title(table)}\n{units}; dashed = not causal", fontsize=10)
    save_wide(fig, ax, target, force=force)
    return target


def wide_axes() -> tuple[Any, Any]:
    """A 10 x 5 inch pyplot figure and its axes, on the non-interactive Agg backend (a plot is
    written from a command, never shown)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(10, 5), dpi=120)


def save_wide(fig: Any, ax: Any, target: Path, *, force: bool) -> None:
    """Grid, legend outside the axes on the right, then the PNG written atomically (nothing is
    left behind if the write fails); the figure is closed either way."""
    import matplotlib.pyplot as plt

    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    try:
        with atomic_path(target, force=force) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)


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
    target = _png(out)

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
