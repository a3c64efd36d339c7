"""``mfcli plan``: from a training setup to a ranked list of calibrated mechanisms, a
recommendation and its artifact (library: :mod:`mfcli.services.plan`; docs/plan.md)."""
from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from mfcli.cli.common import command_line, emit_json, log, refuse_unless, safe
from mfcli.cli.options import (
    BANDS_RANGE,
    BETA_RANGE,
    BUFFERS_RANGE,
    DELTA_RANGE,
    EPSILON_RANGE,
    in_range,
    library_check,
)
from mfcli.cli.rounding import pessimistic
from mfcli.errors import MfcliError


def _split(values: list[str] | None) -> tuple[str, ...] | None:
    """The comma-separated or repeated values; None when the option is not given, () when it names
    nothing (``--batching ,``, which :data:`BATCHING_NAMES` refuses at parse time, exit 2)."""
    if not values:
        return None
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


def _sampler_names(value: str) -> None:
    from mfcli.services.plan import SAMPLERS, check_sampler

    names = _split([value])
    if not names:  # '', ',': no sampler at all, not "every sampler"
        raise MfcliError(f"allow at least one batch sampler: {', '.join(SAMPLERS)}")
    for name in names:
        check_sampler(name)


#: An unknown sampler name needs no other option to be refused: a usage error at parse time.
BATCHING_NAMES = in_range(_sampler_names)


def _plan_workload(v: str) -> None:
    from mfcli.services.plan import WORKLOADS  # mfcli.services.plan loads numpy: imported only when the option is given
    from mfcli.util.validation import one_of

    one_of(v, WORKLOADS, "plan workload")


EXAMPLES_CHECK = in_range(library_check("mfcli.util.validation", "positive_int", "the number of examples"))
BATCH_CHECK = in_range(library_check("mfcli.util.validation", "positive_int", "the batch size"))
PARAMS_CHECK = in_range(library_check("mfcli.util.validation", "positive_int", "the number of parameters"))
PLAN_WORKLOAD_CHECK = in_range(_plan_workload)


def _bytes(b: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024  # type: ignore[assignment]
    return f"{b} B"  # pragma: no cover


#: Layout version of ``plan --json`` (mfcli/schemas/plan.json). 3: each candidate's ``sigma`` became
#: ``noise_std`` beside the new primary ``noise_multiplier`` (as in ``saved`` and ``report``); rows
#: gained ``guarantees``, ``spectral_norm_upper`` and ``reduced_noise_multiplier``; the report
#: gained ``other_samplers``; the accountings ``balls-in-bins-dp-sgd`` and ``dp-sgd-reduction``.
PLAN_JSON_SCHEMA_VERSION = 3


def shown_rows(plan: Any, all_rows: bool) -> list[tuple[int, Any]]:
    """(rank, row) of the rows the table shows: every row with ``all_rows``, else all but the
    strategies accounted under balls-in-bins by the DP-SGD reduction only (none of them can beat
    DP-SGD's own balls-in-bins row at equal epsilon; docs/plan.md)."""
    return [(i, r) for i, r in enumerate(plan.ranked, 1) if all_rows or not r.reduction_row]


def rich_plan(plan: Any, all_rows: bool = False) -> Table:
    """The ranked table: the noise multiplier and epsilon rounded up (more noise and a larger
    epsilon are the safe side), errors to 4 significant digits; ``all_rows`` adds the hidden
    balls-in-bins reduction rows and the noise std column."""
    s = plan.setup
    title = (f"mfcli plan: {s.examples} examples, batch {s.batch}, {s.epochs} epoch{'s' if s.epochs != 1 else ''} "
             f"(n = {s.n}, {s.steps_per_epoch} steps/epoch, q = {s.sampling:.4g}), {s.workload}"
             f"{f' beta {s.beta:g}' if s.workload == 'momentum' else ''}; target epsilon {s.epsilon:g}, delta {s.delta:g}")
    relations = sorted({r.neighbouring() for r in plan.ranked})
    neighbours = (f"epsilon for {relations[0]} neighbours" if len(relations) == 1
                  else f"epsilon for each row's neighbouring relation ({', '.join(relations)}; --json names it)")
    t = Table(title=title, caption="RMSE: noise std of the released iterates per coordinate, clip norm 1 (mean = root "
              "mean square over steps); stream memory: float32 state of the noise stream the artifact runs, for "
              f"{s.params} parameter{'s' if s.params != 1 else ''}; noise cost: multiply-adds per parameter and step "
              f"(mean over the run) beside one Gaussian draw; {neighbours}; noise mult.: noise std on C G / "
              "the C's sensitivity (the noise multiplier of Opacus and jax_privacy)"
              + ("; noise std: on C G for C as built" if all_rows else "") + "; * = recommended")
    cols = ["#", "candidate", "mechanism", "batch sampler", "accounting", "noise mult."] + (
        ["noise std"] if all_rows else []) + ["epsilon", "RMSE mean", "RMSE max", "stream memory", "noise cost", "seconds"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("candidate", "mechanism", "batch sampler", "accounting",
                                                    "stream memory") else "right")
    for i, r in shown_rows(plan, all_rows):
        mark = "*" if plan.recommended is not None and r.key == plan.recommended.key else ""
        std = [pessimistic(r.sigma, digits=5)] if all_rows else []
        t.add_row(f"{i}{mark}", r.key + (" (non-adaptive)" if not r.adaptive else ""), r.mechanism, r.sampler,
                  r.accounting, pessimistic(r.noise_multiplier, digits=5), *std, pessimistic(r.epsilon, digits=5),
                  f"{r.rmse_mean:.4g}", f"{r.rmse_max:.4g}", _bytes(r.memory_bytes), f"{r.noise_madds:.4g}",
                  f"{r.seconds:.1f}")
    return t


def render_text(plan: Any, saved: dict | None, all_rows: bool = False) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None, soft_wrap=True).print(rich_plan(plan, all_rows))
    lines = [buf.getvalue().rstrip("\n")]
    hidden = [r for r in plan.ranked if r.reduction_row]
    if hidden and not all_rows:
        best = hidden[0]
        lines.append(f"hidden: {len(hidden)} balls-in-bins row{'s' if len(hidden) != 1 else ''} of the other strategies "
                     f"by the DP-SGD reduction (best: {best.key}, RMSE mean {best.rmse_mean:.4g}); at equal epsilon the "
                     "reduction never beats DP-SGD's own balls-in-bins row (docs/plan.md); --all-rows shows them, "
                     "--json lists every row")
    for sk in plan.skipped:
        lines.append(f"skipped {sk.key} ({sk.sampler}): {sk.reason}")
    from mfcli.services.plan import not_recommended

    for r in plan.ranked:
        if plan.recommended is not None and r.key == plan.recommended.key:
            break
        why = not_recommended(r, plan.setup.n, max_stream_bytes=plan.setup.max_stream_bytes)
        lines.append(f"not recommended: {r.key} ({r.sampler}): {why}")
    if plan.recommended is not None:
        r = plan.recommended
        rate = "" if r.sampling is None else f" at sampling rate {r.sampling!r}"
        lines.append(f"recommended: {r.key} ({r.strategy}); batch sampler {r.sampler}{rate}; {r.accounting} accounting "
                     f"under {r.participation_text(plan.setup.n)}; noise multiplier {pessimistic(r.noise_multiplier)} "
                     f"(noise std {pessimistic(r.sigma)} on C G, sensitivity {r.sensitivity:.6g}; epsilon "
                     f"{pessimistic(r.epsilon)} <= {plan.setup.epsilon:g})")
    else:
        lines.append("recommended: none (no candidate's guarantee covers adaptive training with an artifact)")
    if saved is not None:
        lines.append(f"wrote {safe(saved['artifact'])} with accounting record {saved['record']} "
                     f"(epsilon {pessimistic(saved['epsilon'])} re-accounted on the artifact)")
    rep = plan.report()
    lines += other_sampler_lines(rep)
    lines.append(plan_report_line(rep))
    return "\n".join(lines) + "\n"


def other_sampler_lines(rep: dict) -> list[str]:
    """One line per other allowed batch sampler that certifies a smaller epsilon for the
    recommended artifact at the same noise (``report.other_samplers``), epsilon rounded up."""
    lines = []
    for o in rep.get("other_samplers", []):
        if o["smaller"]:
            caveat = "" if o["adaptive"] else ", non-adaptive contributions only"
            lines.append(f"another batch sampler certifies less for this artifact at the same noise: {o['batch_sampler']} "
                         f"({o['accounting']}, {o['participation']}{caveat}): epsilon <= {pessimistic(float(o['epsilon']))}")
    return lines


def plan_report_line(rep: dict) -> str:
    """``report: epsilon <= X (delta, candidate and accounting, batch sampler, participation,
    neighbouring relation)`` for the recommended candidate, epsilon rounded up."""
    from mfcli.cli.render import NEIGHBOURING_WORDS

    if rep.get("epsilon") is None:
        return "report: none (no candidate is recommended)"
    rate = "" if rep.get("sampling") is None else f" at rate {rep['sampling']:g}"
    rel = NEIGHBOURING_WORDS.get(str(rep["neighbouring"]), str(rep["neighbouring"]))
    return (f"report: epsilon <= {pessimistic(float(rep['epsilon']))} (delta = {float(rep['delta']):g}, "
            f"{rep['candidate']} with {rep['accounting']} accounting, batch sampler {rep['batch_sampler']}{rate}, "
            f"{rep['participation']}, {rel}, noise multiplier {pessimistic(float(rep['noise_multiplier']))})")


def plot_plan(plan: Any, path: Path, *, force: bool) -> None:
    """Mean RMSE against epsilon for every candidate (log-log), written atomically as a PNG."""
    from mfcli.cli.plots import check_plot_target, save_wide, wide_axes

    target = check_plot_target(path, force=force)
    import matplotlib.pyplot as plt

    fig, ax = wide_axes()
    # line style and marker say the sampler, colour the candidate (20 colours before one repeats)
    styles = {"poisson": ("-", "o"), "cyclic": ("--", "s"), "fixed-order": ("-.", "^"), "balls-in-bins": (":", "v"),
              "shuffle": (":", "x")}
    cmap = plt.get_cmap("tab20")
    colours = [cmap(i) for i in range(20)]
    for i, r in enumerate(plan.ranked):
        pts = [(e, v) for e, v in r.curve if v is not None]
        if pts:
            ls, mk = styles[r.sampler]
            label = r.key if r.key.endswith(f"({r.sampler})") else f"{r.key} ({r.sampler})"  # no sampler twice
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=ls, marker=mk, markersize=3, linewidth=1.2,
                    color=colours[i % len(colours)], label=label)
    ax.axvline(plan.setup.epsilon, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"epsilon (delta = {plan.setup.delta:g})")
    ax.set_ylabel("RMSE of the released iterates (root mean square over steps)")
    s = plan.setup
    ax.set_title(f"mfcli plan: {s.examples} examples, batch {s.batch}, {s.epochs} epochs, {s.workload}; "
                 "sigma calibrated per epsilon", fontsize=10)
    save_wide(fig, ax, target, force=force)



EPOCH_COUNT = in_range(library_check("mfcli.services.plan", "check_epochs"))
#: --steps 0 needs no other option to be refused (whether steps are whole epochs does: exit 1)
STEP_COUNT = in_range(library_check("mfcli.util.validation", "positive_int", "the number of steps"))
MAX_STREAM_MEMORY_CHECK = in_range(library_check("mfcli.util.memory", "parse_size"))


def plan(
    examples: int = typer.Option(..., "--examples", callback=EXAMPLES_CHECK, help="Number of training examples."),
    batch: int = typer.Option(..., "--batch", callback=BATCH_CHECK,
                              help="Batch size (expected batch size for the Poisson samplers)."),
    epsilon: float = typer.Option(..., "--epsilon", callback=EPSILON_RANGE, help="Target epsilon."),
    epochs: int | None = typer.Option(None, "--epochs", callback=EPOCH_COUNT, help="Epochs (or give --steps)."),
    steps: int | None = typer.Option(None, "--steps", callback=STEP_COUNT,
                                     help="Steps, a multiple of the steps per epoch (or give --epochs)."),
    delta: float = typer.Option(1e-6, "--delta", callback=DELTA_RANGE, help="Target delta in (0, 1)."),
    workload: str = typer.Option("prefix", "--workload", "-w", callback=PLAN_WORKLOAD_CHECK, help="prefix (SGD) or momentum."),
    beta: float | None = typer.Option(
        None, "--beta", callback=BETA_RANGE, help="momentum only: the momentum parameter (default 0.9)."),
    params: int = typer.Option(1, "--params", callback=PARAMS_CHECK, help="Model parameters D (for the stream memory column)."),
    max_stream_memory: str | None = typer.Option(
        None, "--max-stream-memory", metavar="<size>", callback=MAX_STREAM_MEMORY_CHECK,
        help="Recommend only a mechanism whose noise stream keeps at most this much state for --params "
        "parameters, e.g. 2G (a dense stream keeps n x params floats)."),
    max_memory: str | None = typer.Option(
        None, "--max-memory", metavar="<size>", callback=MAX_STREAM_MEMORY_CHECK,
        help="Memory one accounting run may use, e.g. 4G (default: half of physical memory, or what ulimit -v "
        "leaves). A DP-SGD or BandMF row whose calibration needs more at the least (a huge --epsilon) is skipped "
        "with the reason instead of run."),
    batching: list[str] | None = typer.Option(
        None, "--batching", callback=BATCHING_NAMES,
        help="Batch samplers the training loop can run, comma-separated or repeated: poisson, cyclic, balls-in-bins, "
        "shuffle, fixed-order (default all but balls-in-bins, whose rows are never recommended and cost minutes "
        "at long horizons). No number is shown under a sampler not allowed."),
    bands: list[int] | None = typer.Option(
        None, "--bands", callback=BANDS_RANGE, help="Band counts to try (repeat; default 2,4,...,64 where they fit)."),
    buffers: list[int] | None = typer.Option(
        None, "--buffers", callback=BUFFERS_RANGE, help="BLT buffer counts to try (repeat; default 2 and 4)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the recommended artifact here, with its accounting record."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (mfcli/schemas/plan.json)."),
    all_rows: bool = typer.Option(
        False, "--all-rows", help="Show every row: also the balls-in-bins rows of the strategies accounted by the "
        "DP-SGD reduction, and the noise std column."),
    plot: Path | None = typer.Option(None, "--plot", help="Write RMSE against epsilon for every candidate to this PNG."),
    scheduler: str | None = typer.Option(
        None, "--scheduler", help="Run the calibrations on this Dask scheduler (needs the dask extra)."),
    workers: int | None = typer.Option(None, "--workers", help="Local worker processes (default: all cores; 0: in process)."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Rank the mechanisms valid for a training setup at one privacy target and write the best.

    Every candidate (DP-SGD, BandMF under cyclic Poisson, the dense multi-epoch optimum, banded
    Toeplitz and BLT under a fixed order, the tree and Honaker; under balls-in-bins every one of
    them, by the DP-SGD reduction) is calibrated under the accounting valid for its batch sampler;
    the table shows its noise multiplier (noise std / the C's sensitivity) and is ranked by mean
    RMSE of the released iterates (near-ties within 0.5%: the cheaper noise stream). --out writes
    the recommended one with its accounting record (the account --write format). The output ends
    with the epsilon to report."""
    from mfcli.io.artifact import check_output_path
    from mfcli.services.plan import DEFAULT_SAMPLERS, TrainingSetup, make_plan, write_artifact
    from mfcli.util.memory import parse_size

    refuse_unless((epochs is None) != (steps is None), "give --epochs or --steps (one of them)")
    refuse_unless(beta is None or workload == "momentum", "--beta applies to the momentum workload only")
    refuse_unless(workers is None or scheduler is None, "--workers applies to the local process pool, not --scheduler")
    refuse_unless(workers is None or workers >= 0, "--workers must be 0 or more")
    refuse_unless(not force or out is not None or plot is not None, "--force applies to --out or --plot; none is given")
    setup = TrainingSetup(
        examples=examples, batch=batch, epsilon=epsilon, epochs=epochs, steps=steps, delta=delta, workload=workload,
        beta=0.9 if beta is None else beta, params=params,
        batching=DEFAULT_SAMPLERS if batching is None else (_split(batching) or ()),
        bands=tuple(bands) if bands else None, buffers=tuple(buffers) if buffers else (2, 4),
        curve=tuple(epsilon * f for f in (0.5, 1.0, 2.0)) if plot is not None else (),
        max_stream_bytes=None if max_stream_memory is None else parse_size(max_stream_memory),
        max_memory=None if max_memory is None else parse_size(max_memory),
    )
    if delta >= 1 / examples:
        # (epsilon, delta)-DP with delta >= 1/examples allows publishing one whole random example:
        # a loud warning, not a refusal (DP libraries warn; a researcher may want the row anyway)
        log(f"warning: delta = {delta:g} is at least 1/examples = {1 / examples:.3g}: at such a delta a mechanism "
            "that publishes a random training example outright is (0, delta)-DP, so the guarantee is void; choose "
            "delta well below 1/examples (commonly below 1/examples^1.1)")
    if out is not None:
        check_output_path(out, force=force)
    if plot is not None:
        from mfcli.cli.plots import check_plot_target

        check_plot_target(plot, force=force)
    progress = None if quiet else log
    result = make_plan(setup, scheduler=scheduler, workers=workers, progress=progress)
    saved = None
    if out is not None:
        if result.recommended is None:
            raise MfcliError("no candidate can be recommended for --out (see the table); nothing written")
        if progress:
            progress(f"writing {result.recommended.key} to {out} and re-accounting it")
        saved = write_artifact(setup, result.recommended, out, command=command_line(), force=force)
    if plot is not None:
        plot_plan(result, plot, force=force)
        if progress:
            progress(f"wrote {plot}")
    if as_json:
        payload: dict[str, Any] = result.as_dict()
        if saved is not None:
            payload["saved"] = saved
        rep = payload.pop("report")  # the number to report comes last, with the line the table ends with
        payload["report"] = {**rep, "other_lines": other_sampler_lines(rep), "line": plan_report_line(rep)}
        emit_json("plan", payload, schema_version=PLAN_JSON_SCHEMA_VERSION)
        return
    sys.stdout.write(render_text(result, saved, all_rows))
    sys.stdout.flush()
