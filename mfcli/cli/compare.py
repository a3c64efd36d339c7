"""``mfcli compare``: error table of baseline strategies and the optimum on one workload."""
from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import typer
from rich.console import Console

from mfcli.cli.common import command_line, envelope, log, refuse_unless, solver_stop, stdout
from mfcli.cli.display import ProgressDisplay, SolverDisplay, duration_text
from mfcli.cli.options import (
    BANDS_RANGE,
    BUFFERS_RANGE,
    DELTA_RANGE,
    EPSILON_RANGE,
    SAMPLING_RANGE,
    ProblemOptions,
    artifact_argument,
    in_range,
    library_check,
    option_group,
    refuse_structured,
)
from mfcli.cli.plots import check_plot_target, plot_per_step
from mfcli.cli.render import (
    parse_strategy_names,
    render_csv,
    render_markdown,
    rich_table,
)
from mfcli.errors import MfcliError
from mfcli.io.artifact import (
    atomic_path,
    check_output_path,
    default_artifact_path,
    refuse_input_as_output,
    save_strategy,
)
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation
from mfcli.model.workloads import Workload, build_workload, default_artifact_stem, learning_rate_file
from mfcli.services.compare import (
    Comparison,
    PrivacyEstimate,
    PrivacyTarget,
    estimate_equal_privacy,
    row_band_counts,
    run_comparison,
)
from mfcli.strategies.baselines import STRATEGY_NAMES
from mfcli.util.limits import DENSE_MAX_N

FORMATS = ("table", "markdown", "csv", "json")
SAVE_CHECK = in_range(library_check("mfcli.services.compare", "check_kept_strategy"))
_ALL_STRATEGIES = ",".join(STRATEGY_NAMES)


def render(table: Comparison, fmt: str, *, curves: bool, saved: dict | None) -> str:
    if fmt == "markdown":
        return render_markdown(table)
    if fmt == "csv":
        return render_csv(table)
    if fmt == "json":
        payload = table.as_dict(curves=curves)
        if saved is not None:
            payload["saved"] = saved
        return json.dumps(envelope("compare", payload), indent=2) + "\n"
    buf = io.StringIO()
    Console(file=buf, width=160 if table.privacy is None else 200, color_system=None, soft_wrap=True).print(rich_table(table))
    return buf.getvalue()


@option_group(ProblemOptions, into="problem")
def compare(
    *,
    problem: ProblemOptions,
    epsilon: float | None = typer.Option(
        None, "--epsilon", callback=EPSILON_RANGE,
        help="Compare at equal privacy: calibrate each row's sigma to this epsilon under its best valid accounting "
        "and report the RMSE at that sigma.",
    ),
    sampling: float | None = typer.Option(
        None, "--sampling", "-p", callback=SAMPLING_RANGE,
        help="With --epsilon: cyclic Poisson sampling at this per-group rate P: each example's group is sampled "
        "with probability P at its group's steps; P = b x batch / examples (b groups, b from --min-sep, n/--epochs, "
        "or n). Not the per-step Poisson rate of account's default --batching poisson. Banded rows may then be "
        "amplified.",
    ),
    delta: float | None = typer.Option(
        None, "--delta", callback=DELTA_RANGE, help="With --epsilon: delta in (0, 1) (default 1e-6)."
    ),
    strategies: list[str] | None = typer.Option(
        None, "--strategies", "-s",
        help=f"Strategies to compare, comma-separated or repeated (default all: {_ALL_STRATEGIES}). "
        f"Above n = {DENSE_MAX_N} every baseline but optimal, from closed forms (default identity,tree). "
        "(In mfcli account, -s is --strategy, one strategy.)",
    ),
    artifact: list[Path] | None = typer.Option(
        None, "--artifact", "-a",
        help="Use this artifact (from mfcli optimize, or a saved baseline) instead of solving for optimal; repeatable. "
        "Must match the workload.",
    ),
    tol: float | None = typer.Option(
        None, "--tol", help="Relative duality gap for the optimal strategy's solve (default 1e-6); only when optimal is solved."
    ),
    max_iter: int | None = typer.Option(
        None, "--max-iter", help="Maximum solver iterations for optimal (default 1000); only when optimal is solved."
    ),
    fmt: str | None = typer.Option(None, "--format", "-f", help="Output format: table (default), markdown, csv or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    curves: bool = typer.Option(False, "--curves", help="json output only: include each strategy's per-step RMSE."),
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help="Write the table here instead of stdout. With --save-strategy: the artifact path instead "
        "(default artifacts/<workload>-<strategy>-n<N>.h5), and the table goes to stdout.",
    ),
    plot: Path | None = typer.Option(None, "--plot", help="Write per-step RMSE curves to this PNG (needs matplotlib)."),
    save: str | None = typer.Option(
        None, "--save-strategy", callback=SAVE_CHECK,
        help="Write this strategy for the workload as an artifact (path from --out) to train with or account.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
    bands: list[int] | None = typer.Option(
        None, "--bands", callback=BANDS_RANGE,
        help="Add a banded Toeplitz row with B bands, optimised for the workload and schema (repeat for several). "
        f"Above n = {DENSE_MAX_N} no dense matrix is built: the baselines but optimal (closed forms; the tree under "
        "--min-sep and Honaker on momentum are refused there) and banded Toeplitz / BLT rows; with --epsilon too.",
    ),
    buffers: list[int] | None = typer.Option(
        None, "--buffers", callback=BUFFERS_RANGE,
        help="Add a BLT row with K buffers, optimised for the workload and schema (repeat for several); "
        f"like --bands, also above n = {DENSE_MAX_N}.",
    ),
) -> None:
    """Tabulate sensitivity and error of the baseline strategies (identity, tree, Honaker online
    and full, sqrt) against the optimal factorization on one workload.

    Errors are for noise multiplier 1 and clip norm 1: total squared error sens(C)^2 ||B||_F^2,
    its mean over the n steps, RMSE, the worst step, and the ratio to the best causal strategy.
    sens(C) is for single participation unless --epochs or --min-sep names another schema; the
    strategies are the same either way (optimal is then the single-participation optimum, row
    optimal-single, not ranked best: add the schema's optimum from mfcli optimize with -a), and a
    column says whether each sensitivity is exact or an upper bound. For workloads other than
    prefix, the prefix-sum baselines are post-processed (B = A S^-1 B_S).
    """
    workload_opts = problem.build_kwargs()
    workload, n, beta, lr, matrix = problem.workload, problem.n, problem.beta, problem.lr, problem.matrix
    schema = problem.schema()
    refuse_unless(epsilon is not None or (sampling is None and delta is None),
                  "--sampling and --delta apply to the comparison at equal privacy; give --epsilon")
    privacy = None
    if epsilon is not None:
        from mfcli.accounting.defaults import DEFAULT_DELTA
        from mfcli.accounting.multi import cycle_length
        from mfcli.accounting.single_pass import check_delta, check_sampling
        from mfcli.services.compare import PrivacyTarget
        from mfcli.util.validation import positive_number

        privacy = PrivacyTarget(
            epsilon=positive_number(epsilon, "--epsilon"),
            delta=check_delta(DEFAULT_DELTA if delta is None else delta),
            sampling=None if sampling is None else check_sampling(sampling),
        )
    refuse_unless(fmt is None or fmt in FORMATS, f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if n is not None and n > DENSE_MAX_N:
        refuse_unless(not (artifact or save or plot or curves or matrix or tol or max_iter),
                      f"n = {n} > {DENSE_MAX_N}: only the baselines without optimal (closed forms) and --bands/--buffers "
                      "rows are compared; dense options do not apply")
        from mfcli.model.kinds import ANY_N_BASELINES

        names = parse_strategy_names(strategies) if strategies else ()
        dense_only = [name for name in names if name not in ANY_N_BASELINES]
        refuse_unless(not dense_only,
                      f"n = {n} > {DENSE_MAX_N}: {', '.join(dense_only)} is a dense solve (n <= {DENSE_MAX_N}); compare "
                      f"{', '.join(ANY_N_BASELINES)}, --bands or --buffers")
        compare_structured(workload, n, beta=beta, lr=lr, bands=tuple(bands or ()), buffers=tuple(buffers or ()),
                           schema=schema,
                           fmt="json" if as_json else (fmt or "table"), out=out, force=force, quiet=quiet,
                           privacy=privacy, baselines=names)
        return
    refuse_unless(not as_json or fmt in (None, "json"), f"--json conflicts with --format {fmt}")
    fmt = "json" if as_json else (fmt or "table")
    refuse_unless(not curves or fmt == "json", f"--curves adds per-step curves to json output; no curves in {fmt} output")
    refuse_unless(not force or out is not None or plot is not None or save is not None,
                  "--force applies to a file written with --out, --plot or --save-strategy; none is given")
    names = parse_strategy_names(strategies)
    if artifact and "optimal" not in names and strategies:
        log("note: --artifact rows are added to the table in place of the optimal solve")
    artifact = [artifact_argument(path) for path in artifact or ()]
    for path in artifact:
        refuse_structured(path, "--artifact")
    solves = ("optimal" in names or save == "optimal") and not artifact
    refuse_unless(solves or (tol is None and max_iter is None),
                  "--tol and --max-iter apply to the optimal solve, which this command does not run"
                  + (" (--artifact replaces it)" if artifact else ""))
    tol, max_iter = solver_stop(tol, max_iter)
    w = build_workload(workload, n, **workload_opts)
    for path in artifact or ():
        if not path.exists():
            raise MfcliError(f"artifact {path} does not exist")
    if artifact:
        from mfcli.services.compare import comparison_schema

        # account's rule: the schema the artifacts declare unless one is given; a contradiction is refused
        schema = comparison_schema(artifact, schema if problem.given else None)
    schema.check(w.n)
    if privacy is not None and privacy.sampling is not None:
        cycle_length(schema, w.n)  # refuse a schema cyclic sampling cannot run before any work
    inputs = [(path, "artifact") for path in artifact] + [(p, "file") for p in (matrix, learning_rate_file(lr)) if p is not None]
    outputs = plan_outputs(w, save=save, out=out, plot=plot, force=force, inputs=inputs)
    if "optimal" in names and not artifact and schema.participations(w.n) > 1:
        log(f"note: row optimal-single is the optimum for single participation, not for {schema.describe(w.n)}; "
            f"for this schema's optimum run mfcli optimize with the same workload options and "
            f"{_schema_options(schema)}, and add its artifact with -a FILE")
    progress = None if quiet else log
    if privacy is not None and not quiet:
        row_bands = row_band_counts([s for s in names if not (s == "optimal" and artifact)], w.n,
                                    artifacts=len(artifact or ()), bands=bands or (), buffers=buffers or ())
        log(describe_privacy_estimate(estimate_equal_privacy(w.n, schema, privacy, row_bands=row_bands)))
    table = build_table(
        w, names, artifacts=list(artifact or ()), tol=tol, max_iter=max_iter, save=save, quiet=quiet, participation=schema,
        privacy=privacy,
    )
    if bands or buffers:
        from mfcli.cli.structured_render import check_buffers
        from mfcli.services.compare import extend_comparison, structured_rows
        from mfcli.strategies.toeplitz import toeplitz_workload

        tw = toeplitz_workload(w.name, beta=float(w.params.get("beta", 0.9)), lr=lr or "constant")
        table = extend_comparison(table, structured_rows(tw, w.n, bands=tuple(bands or ()), participation=schema,
                                                         buffers=tuple(check_buffers(k, w.n) for k in buffers or ()),
                                                         privacy=privacy))
    saved = write_strategy(table, w, outputs.artifact, force=force, progress=progress)
    if plot is not None:
        plot_per_step(table, plot, force=force)
        if progress:
            log(f"wrote {plot}")
    emit_table(table, fmt, curves=curves, saved=saved, table_out=outputs.table, force=force, progress=progress)


def _schema_options(schema: Participation) -> str:
    """The command-line options that name ``schema`` (a fixed-epoch or min-separation one)."""
    if isinstance(schema, FixedEpoch):
        return f"--epochs {schema.epochs}"
    assert isinstance(schema, MinSeparation)
    cap = "" if schema.max_participations is None else f" --max-participations {schema.max_participations}"
    return f"--min-sep {schema.separation}{cap}"


class Outputs(NamedTuple):
    """Where ``compare`` writes: the table (None: stdout) and the saved strategy's artifact."""

    table: Path | None
    artifact: Path | None


def plan_outputs(w: Workload, *, save: str | None, out: Path | None, plot: Path | None, force: bool,
                 inputs: list[tuple[Path, str]] | None = None) -> Outputs:
    """Decide the output files and refuse unusable ones before any work is done: among them one
    that is an input file (``inputs``: (path, noun) pairs, an ``--artifact``, ``--matrix`` or
    ``--lr`` file), which even ``--force`` does not replace, as ``compress`` refuses its input.

    With ``--save-strategy``, ``--out`` names the artifact (default
    ``artifacts/<workload>-<strategy>-n<N>.h5``) and the table goes to stdout.
    """
    if save is not None:
        outputs = Outputs(None, out if out is not None else default_artifact_path(default_artifact_stem(w, save), w.n))
    else:
        outputs = Outputs(out, None)
    for target in (*outputs, plot):
        if target is not None:
            refuse_input_as_output(target, inputs or (), what="comparison")
    for target in outputs:
        if target is not None:
            check_output_path(target, force=force)
    if plot is not None:
        check_plot_target(plot, force=force)
    return outputs


def build_table(
    w: Workload, names: tuple[str, ...], *, artifacts: list[Path], tol: float, max_iter: int,
    save: str | None, quiet: bool, participation: Participation | None = None, privacy: PrivacyTarget | None = None,
) -> Comparison:
    """Run the comparison, with the solver's live display when the optimum is solved for and, at
    equal privacy, each row's calibration progress (:class:`ProgressDisplay`)."""
    from contextlib import ExitStack

    from rich.errors import LiveError

    solves = ("optimal" in names or save == "optimal") and not artifacts
    display_title = f"mfcli compare: optimal for {w.name} n={w.n} (tol {tol:g})"
    with ExitStack() as stack:
        display = stack.enter_context(SolverDisplay(quiet=quiet or not solves, title=display_title))
        bars = ProgressDisplay(quiet=quiet or privacy is None)
        try:
            stack.enter_context(bars)
        except LiveError:  # a rich without nested live displays, beside the solver's panel: plain lines
            bars = stack.enter_context(ProgressDisplay(quiet=quiet, tty=False))
        return run_comparison(
            w, names, artifacts=artifacts, tol=tol, max_iter=max_iter, progress=None if quiet else bars.log,
            solver_callback=display if solves else None, keep=save, participation=participation, privacy=privacy,
            on_progress=None if privacy is None or quiet else bars,
        )


def describe_privacy_estimate(est: PrivacyEstimate) -> str:
    """One stderr line before the calibrations at equal privacy: for each accounting the rows that
    run it, its measured run and the runs expected per row, and the time for all rows (rounded up)."""
    rows = est.calibrations[0]
    parts = [f"{e.setting} on {k} row{'s' if k != 1 else ''} (probe sigma {e.sigma:.4g} -> epsilon {e.epsilon:.4g}), "
             f"about {e.runs_expected} runs per row (at most {e.runs_most}) of about {duration_text(e.seconds_per_run)}"
             for e, k in zip(est.estimates, est.calibrations, strict=True)]
    expected, most = est.seconds()
    return (f"estimate: calibrating {rows} row{'s' if rows != 1 else ''} at equal privacy: "
            f"{'; '.join(parts)}; about {duration_text(expected)} in all (at most {duration_text(most)})")


def write_strategy(
    table: Comparison, w: Workload, target: Path | None, *, force: bool, progress: Callable[[str], None] | None
) -> dict | None:
    """Save the strategy kept by ``--save-strategy``; the summary that goes into the JSON output."""
    if target is None:
        return None
    assert table.kept is not None
    digest = save_strategy(
        target, table.kept, workload_name=w.name, workload_params=w.params, command=command_line(), force=force,
        participation=table.participation if table.multi else None,
    )
    if progress:
        progress(f"wrote {target} ({table.kept.name})")
    return {"strategy": table.kept.name, "artifact": str(target), "artifact_sha256": digest}


def emit_table(
    table: Comparison, fmt: str, *, curves: bool, saved: dict | None, table_out: Path | None, force: bool,
    progress: Callable[[str], None] | None,
) -> None:
    """Write the table to ``table_out`` (atomically) or stdout."""
    text = render(table, fmt, curves=curves, saved=saved)
    if table_out is not None:
        with atomic_path(table_out, force=force) as tmp:
            tmp.write_text(text, encoding="utf-8")
        if progress:
            progress(f"wrote {table_out}")
        return
    if fmt == "table":
        # A pipe or file has no width; do not squeeze the numbers into 80 columns there.
        width = 120 if table.privacy is None else 170  # three more columns at equal privacy
        console = stdout() if sys.stdout.isatty() else Console(file=sys.stdout, width=width, color_system=None)
        console.print(rich_table(table))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def compare_structured(workload: str, n: int, *, beta: float | None, lr: str | None, bands: tuple[int, ...],
                       schema: Participation, fmt: str, out: Path | None, force: bool, quiet: bool,
                       buffers: tuple[int, ...] = (), privacy: PrivacyTarget | None = None,
                       baselines: tuple[str, ...] = ()) -> None:
    """``mfcli compare`` above the dense limit: the ``baselines`` (default identity and the tree,
    the tree left out where the schema has no closed form for it), banded Toeplitz and BLT rows,
    each from its mechanism's closed-form loss; at equal privacy with ``privacy``. ``fmt``: one of
    :data:`FORMATS`, checked by :func:`compare`."""
    from mfcli.cli.structured_render import check_buffers
    from mfcli.services.compare import structured_comparison
    from mfcli.strategies.toeplitz import check_bands, toeplitz_workload

    refuse_unless(beta is None or workload == "momentum", f"--beta applies to --workload momentum only, not {workload}")
    w = toeplitz_workload(workload, beta=0.9 if beta is None else beta, lr=lr or "constant")
    for b in bands:
        check_bands(b, n)
    for k in buffers:
        check_buffers(k, n)
    if privacy is not None and privacy.sampling is not None:
        from mfcli.accounting.multi import cycle_length

        cycle_length(schema, n)  # refuse a schema cyclic sampling cannot run before any work
    if out is not None:
        check_output_path(out, force=force)
    if not quiet:
        parts = list(baselines) or ["identity", "tree (closed form)"]
        parts += [f"banded Toeplitz ({', '.join(map(str, bands))} bands)"] if bands else []
        parts += [f"BLT ({', '.join(map(str, buffers))} buffers)"] if buffers else []
        log(f"building {', '.join(parts)} for n = {n}")
    skipped: list[str] = []
    table = structured_comparison(w, n, bands=bands, participation=schema, buffers=buffers, privacy=privacy,
                                  baselines=baselines, skipped=skipped)
    for why in skipped:
        log(f"note: row left out: {why}")
    emit_table(table, fmt, curves=False, saved=None, table_out=out, force=force, progress=None if quiet else log)
