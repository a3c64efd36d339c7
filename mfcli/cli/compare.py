"""``mfcli compare``: error table of baseline strategies and the optimum on one workload."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mfcli.artifact import atomic_path
from mfcli.cli.common import (
    BetaOpt,
    LrFactorOpt,
    LrFinalOpt,
    LrLastOpt,
    LrOpt,
    MatrixOpt,
    NOpt,
    WorkloadOpt,
    artifact_argument,
    command_line,
    envelope,
    guarded,
    log,
    refuse_unless,
    stdout,
    workload_kwargs,
)
from mfcli.cli.optimize import SolverDisplay
from mfcli.compare import (
    Comparison,
    parse_strategy_names,
    plot_per_step,
    render_csv,
    render_markdown,
    run_comparison,
    table_cells,
    title,
)
from mfcli.errors import MfcliError
from mfcli.strategies import STRATEGY_NAMES, save_strategy
from mfcli.workloads import build_workload

FORMATS = ("table", "markdown", "csv", "json")


#: Compact headers for the terminal; the caption says what they mean.
SHORT_HEADERS = ("strategy", "causal", "sens", "total", "mean", "RMSE", "max step", "ratio")


def rich_table(table: Comparison) -> Table:
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


def render(table: Comparison, fmt: str, *, curves: bool, saved: dict | None) -> str:
    if fmt == "markdown":
        return render_markdown(table)
    if fmt == "csv":
        return render_csv(table)
    if fmt == "json":
        payload = table.as_dict(curves=curves)
        if saved is not None:
            payload["saved"] = saved
        return json.dumps(envelope("compare", **payload), indent=2) + "\n"
    buf = io.StringIO()
    Console(file=buf, width=160, color_system=None, soft_wrap=True).print(rich_table(table))
    return buf.getvalue()


@guarded
def compare(
    workload: WorkloadOpt = "prefix",
    n: NOpt = None,
    beta: BetaOpt = None,
    lr: LrOpt = None,
    lr_factor: LrFactorOpt = None,
    lr_final: LrFinalOpt = None,
    lr_last: LrLastOpt = None,
    matrix: MatrixOpt = None,
    strategies: Optional[List[str]] = typer.Option(
        None, "--strategies", "-s",
        help=f"Strategies to compare, comma-separated or repeated (default all: {','.join(STRATEGY_NAMES)}).",
    ),
    artifact: Optional[List[Path]] = typer.Option(
        None, "--artifact", "-a",
        help="Use this artifact (from mfcli optimize, or a saved baseline) instead of solving for optimal; repeatable. Must match the workload.",
    ),
    tol: Optional[float] = typer.Option(
        None, "--tol", help="Relative duality gap for the optimal strategy's solve (default 1e-6); only when optimal is solved."
    ),
    max_iter: Optional[int] = typer.Option(
        None, "--max-iter", help="Maximum solver iterations for optimal (default 1000); only when optimal is solved."
    ),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help="Output format: table (default), markdown, csv or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    curves: bool = typer.Option(False, "--curves", help="json output only: include each strategy's per-step RMSE."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o",
        help="Write the table here instead of stdout. With --save-strategy: the artifact path instead "
        "(default artifacts/<workload>-<strategy>-n<N>.h5), and the table goes to stdout.",
    ),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write per-step RMSE curves to this PNG (needs matplotlib)."),
    save: Optional[str] = typer.Option(
        None, "--save-strategy",
        help="Write this strategy for the workload as an artifact (path from --out) to train with or account.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Tabulate sensitivity and error of the baseline strategies (identity, tree, Honaker online
    and full, sqrt) against the optimal factorization on one workload.

    Errors are for single participation, noise multiplier 1 and clip norm 1: total squared error
    sens(C)^2 ||B||_F^2, its mean over the n steps, RMSE, the worst step, and the ratio to the best
    causal strategy. For workloads other than prefix, the prefix-sum baselines are post-processed
    (B = A S^-1 B_S).
    """
    workload_opts = workload_kwargs(
        workload, beta=beta, lr=lr, lr_factor=lr_factor, lr_final=lr_final, lr_last=lr_last, matrix=matrix
    )
    refuse_unless(not as_json or fmt in (None, "json"), f"--json conflicts with --format {fmt}")
    fmt = "json" if as_json else (fmt or "table")
    refuse_unless(not curves or fmt == "json", f"--curves adds per-step curves to json output; no curves in {fmt} output")
    refuse_unless(not force or out is not None or plot is not None or save is not None,
                  "--force applies to a file written with --out, --plot or --save-strategy; none is given")
    if fmt not in FORMATS:
        raise MfcliError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    names = parse_strategy_names(strategies)
    if save is not None and save not in STRATEGY_NAMES:
        raise MfcliError(f"unknown strategy {save!r} for --save-strategy; choose from {', '.join(STRATEGY_NAMES)}")
    if artifact and "optimal" not in names and strategies:
        log("note: --artifact rows are added to the table in place of the optimal solve")
    artifact = [artifact_argument(path) for path in artifact or ()]
    solves = ("optimal" in names or save == "optimal") and not artifact
    refuse_unless(solves or (tol is None and max_iter is None),
                  "--tol and --max-iter apply to the optimal solve, which this command does not run"
                  + (" (--artifact replaces it)" if artifact else ""))
    tol = 1e-6 if tol is None else tol
    max_iter = 1000 if max_iter is None else max_iter
    w = build_workload(workload, n, **workload_opts)
    for path in artifact or ():
        if not path.exists():
            raise MfcliError(f"artifact {path} does not exist")

    table_out: Path | None = None
    artifact_out: Path | None = None
    if save is not None:
        artifact_out = out if out is not None else Path("artifacts") / f"{w.name}-{save}-n{w.n}.h5"
    else:
        table_out = out
    # Refuse existing outputs and a missing matplotlib before any work is done.
    for target in (table_out, artifact_out, plot):
        if target is not None and target.exists() and not force:
            raise MfcliError(f"{target} already exists (use --force to overwrite)")
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MfcliError(
                "--plot needs matplotlib, which is not installed; install the plot extra: pip install 'mfcli[plot]'"
            ) from None
        if plot.suffix.lower() != ".png":
            raise MfcliError(f"the plot is written as PNG; give a file name ending in .png, not {plot.name}")

    progress = None if quiet else log
    display_title = f"mfcli compare: optimal for {w.name} n={w.n} (tol {tol:g})"
    with SolverDisplay(quiet=quiet or not solves, title=display_title) as display:
        table = run_comparison(
            w, names, artifacts=list(artifact or ()), tol=tol, max_iter=max_iter, progress=progress,
            solver_callback=display if solves else None, keep=save,
        )

    saved = None
    if save is not None and artifact_out is not None:
        assert table.kept is not None
        digest = save_strategy(
            artifact_out, table.kept, workload_name=w.name, workload_params=w.params,
            command=command_line(), force=force,
        )
        saved = {"strategy": table.kept.name, "artifact": str(artifact_out), "artifact_sha256": digest}
        if progress:
            log(f"wrote {artifact_out} ({table.kept.name})")
    if plot is not None:
        plot_per_step(table, plot, force=force)
        if progress:
            log(f"wrote {plot}")

    text = render(table, fmt, curves=curves, saved=saved)
    if table_out is not None:
        with atomic_path(table_out, force=force) as tmp:
            tmp.write_text(text, encoding="utf-8")
        if progress:
            log(f"wrote {table_out}")
        return
    if fmt == "table":
        # A pipe or file has no width; do not squeeze the numbers into 80 columns there.
        console = stdout() if sys.stdout.isatty() else Console(file=sys.stdout, width=120, color_system=None)
        console.print(rich_table(table))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
