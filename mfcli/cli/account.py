"""``mfcli account``: epsilon of a strategy under single-pass, DP-SGD, MMCC and the shuffled tree,
or the sigma that meets a target epsilon (docs/accounting.md)."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

# Only the defaults at module level: the accounting stack (scipy.stats, dp-accounting) is imported
# when the command runs, so `mfcli account --help` does not pay for it (docs/performance.md).
from mfcli.accounting.defaults import (
    BATCHING_SETTINGS,
    BATCHINGS,
    BUILTIN,
    DEFAULT_ARTIFACT,
    DEFAULT_DELTA,
    DEFAULT_DISCRETIZATION,
    REFERENCE_SETTINGS,
    SAMPLED_BATCHINGS,
    SETTINGS,
)
from mfcli.cli.common import command_line, emit_json, key_value_table, log, refuse_unless, safe_markup, stdout
from mfcli.cli.display import ProgressDisplay, describe_estimate
from mfcli.cli.options import (
    BETA_RANGE,
    DELTA_RANGE,
    EPSILON_RANGE,
    SAMPLING_RANGE,
    SIGMA_RANGE,
    ParticipationOptions,
    artifact_argument,
    in_range,
    library_check,
    option_group,
    positive_n,
)
from mfcli.cli.rounding import pessimistic
from mfcli.errors import MfcliError
from mfcli.util.limits import DENSE_MAX_N

if TYPE_CHECKING:
    from mfcli.services.account import AccountingReport
    from mfcli.services.cost import CalibrationEstimate


#: How the table names the lower bound's statistic (mfcli.accounting.mmcc_lower.STATISTICS).
_LOWER_STAT = {"ones": "1^T C^+ y", "score": "(C 1)^T y", "score2": "(C C^T C 1)^T y"}


def _text(result: Any, key: str) -> str:
    """A result's descriptive text (assumptions, method), which lives with its JSON form."""
    from mfcli.accounting.mmcc import MMCCResult

    d = result.as_dict(include_event=False) if isinstance(result, MMCCResult) else result.as_dict()
    return str(d[key])


def _is_identity(inp: Any) -> bool:
    """Whether the accounted C is the identity (DP-SGD's own strategy), so a DP-SGD sigma is its sigma."""
    import numpy as np

    c = np.asarray(inp.strategy)
    return bool(inp.has_matrix and c.shape[0] == c.shape[1] and np.array_equal(c, np.eye(c.shape[0])))


def _rows_table(report: AccountingReport, details: bool = False) -> tuple[Table, list[str]]:
    """The rows table (setting, epsilon, what it assumes; with ``details`` each row's method and
    numbers) and the assumption lines printed after it: the rows of each setting that ran, in the
    order of :data:`_ROWS`, each with the participation schema and batch sampler it assumes."""
    # The strategy name comes from the file: shown literally (safe_markup), never as markup.
    # Only the DP-SGD reference row: its epsilon (and a sigma calibrated for it) is for C = I, not this C.
    reference_only = set(report.results) == {"dp-sgd"} and not _is_identity(report.strategy)
    t = Table(title=("DP-SGD reference (C = I, not this C) for " if reference_only else "privacy of ")
                    + f"{safe_markup(report.strategy.name)} (n = {report.strategy.n}, operator "
                    f"{safe_markup(report.strategy.operator)}), noise multiplier "
                    f"{pessimistic(float(report.noise_multiplier))} (noise std sigma = "
                    f"{pessimistic(float(report.sigma))} on C G / sensitivity {pessimistic(report.noise_sensitivity)}), "
                    f"delta = {report.delta:g}", title_justify="left", show_lines=True)
    t.add_column("setting", style="bold")
    t.add_column("epsilon", justify="right")
    t.add_column("participation; batch sampler")
    if details:
        t.add_column("details")
    notes: list[str] = []

    def row(setting: str, label: str, epsilon: str, detail: str) -> None:
        # the details cell only with --details (the JSON always has them)
        schema, sampler = report.row_labels(setting)
        cells = (label, epsilon, safe_markup(f"{schema['description']}; {sampler}"), detail)
        t.add_row(*(cells if details else cells[:3]))

    results = report.results
    json_rows = report.row_dicts(include_events=False)
    for setting, (name, build) in _ROWS.items():
        if setting in results:
            built_rows, own_notes = build(report, results[setting])
            for cells in built_rows:
                row(setting, *cells)
            if name is not None:  # the assumptions as the JSON states them (neighbouring relation included)
                notes.append(f"{name}: {json_rows[setting]['assumptions']}")
            notes.extend(own_notes)
        if setting == "mmcc":  # after MMCC's rows (or in their place): its refusal and the report's notes
            if "mmcc" in report.refused:
                row("mmcc", "MMCC (Poisson)", "not run",
                    "its assumptions fail for this C (see below); no amplified bound is claimed")
            # The library says which bound holds; the flag that asks for it is the CLI's to name.
            hint = "mmcc" in report.refused and report.deterministic is None
            notes.extend(line + (" (add --min-sep 1 for that row)" if hint and line.startswith("MMCC: not run") else "")
                         for line in report.notes)
    return t, notes


#: What one setting adds to the rows table: its rows (label, epsilon, details) and its lines below the table.
_Rows = tuple[list[tuple[str, str, str]], list[str]]


def _bracket(r: Any) -> str:
    """A guarantee with the lower end of its bracket."""
    return f"{pessimistic(r.epsilon)} [{pessimistic(r.lower, down=True)}, {pessimistic(r.epsilon)}]"


def _single_pass_rows(report: AccountingReport, sp: Any) -> _Rows:
    return [("single pass", pessimistic(sp.epsilon),
             f"rho-zCDP {pessimistic(sp.rho_zcdp)}, mu-GDP {pessimistic(sp.mu_gdp)}; sens(C) {pessimistic(sp.sensitivity)} "
             f"({safe_markup(report.strategy.operator)} operator), "
             f"noise multiplier sigma/sens {pessimistic(sp.noise_multiplier, down=True)}; exact analytic Gaussian")], []


def _dp_sgd_rows(report: AccountingReport, dp: Any) -> _Rows:
    return [("DP-SGD (reference)", pessimistic(dp.epsilon),
             f"C = I with noise multiplier sigma = {report.sigma:g} (the same noise per step, not sigma/sens), "
             f"p = {dp.sampling:g}, n = {dp.steps}; PLD, discretization {dp.value_discretization:g}")], []


def _mmcc_rows(report: AccountingReport, br: Any) -> _Rows:
    from mfcli.services.account import ESTIMATE_NOT_REQUESTED

    u = br.upper
    rows = [(
        "MMCC (Poisson) [lower, upper]",
        f"[{pessimistic(br.lower_epsilon, down=True)}, {pessimistic(u.epsilon)}]",
        f"delta = {pessimistic(u.delta_pld, digits=3)} (PLD) + {pessimistic(u.delta_tail, digits=3)} "
        f"(tail, f = {u.tail_fraction:g}) + "
        f"{pessimistic(u.delta_trunc, digits=2)} (cut mixture tails); K = {u.pairs} tail events, max p~ = "
        f"{pessimistic(u.max_p_tilde, digits=4)}; {u.distinct_rows} distinct of {u.rows} rows; PLD grid "
        f"{u.value_discretization:g}, mixture grid {1.0 / u.mixture_resolution:g} (rows convolved on "
        f"{1.0 / (u.mixture_resolution * u.mixture_refinement):g}); "
        f"example in every step (sanity bound): {pessimistic(br.full.epsilon)}",
    )]
    notes = [f"MMCC: {_text(u, 'assumptions')}. {_text(u, 'method')}. Lower bound: exact epsilon of the "
             f"post-processed statistic {_LOWER_STAT.get(br.lower.statistic, 'v^T C^+ y')} (the best of "
             "1^T C^+ y, (C 1)^T y, (C C^T C 1)^T y)"
             + (", or of the rows with disjoint windows (banded C)" if br.lower_rows is not None else "")]
    est = br.estimate
    if est is not None:
        rows.append((
            "MMCC pair (Poisson) ESTIMATE, not a bound",
            f"~{est.epsilon:.4g} [{pessimistic(est.low, down=True)}, {pessimistic(est.high)}]",
            f"Monte Carlo estimate of the exact pair's epsilon (banded C, b = {est.band}): exact likelihood "
            f"ratio by forward recursion, importance sampling ({est.add.samples} samples a direction, seed "
            f"{est.seed}); interval = +-{est.z:g} standard errors on delta. Never used to calibrate.",
        ))
    elif br.banded_note == ESTIMATE_NOT_REQUESTED and br.lower_rows is not None:
        notes.append(f"MMCC estimate: not computed; --banded-estimate adds an importance-sampled ESTIMATE of the "
                     f"exact pair's epsilon for this banded C (b = {br.lower_rows.band}; seconds of CPU; never a "
                     "bound, never used to calibrate)")
    elif br.banded_note is not None:
        notes.append(f"MMCC estimate: {br.banded_note}")
    return rows, notes


def _shuffled_tree_rows(report: AccountingReport, st: Any) -> _Rows:
    return [("binary tree, one shuffled epoch", pessimistic(st.epsilon),
             f"valid single-epoch bound (Gaussian, sensitivity sqrt(L + 1) = {pessimistic(st.sensitivity)}); "
             f"amplified bound {st.amplified_note}")], []


def _deterministic_rows(report: AccountingReport, det: Any) -> _Rows:
    s = det.sensitivity
    if s.exact:
        eps_text = pessimistic(det.epsilon)
        sens_text = f"sensitivity {pessimistic(s.value)} (exact: {safe_markup(s.method)})"
    else:
        low = pessimistic(det.epsilon_lower, down=True)
        eps_text = f"{pessimistic(det.epsilon)} (true in [{low}, {pessimistic(det.epsilon)}])"
        sens_text = (f"sensitivity <= {pessimistic(s.value)} (an upper bound: {safe_markup(s.method)}; a witness "
                     f"attains {pessimistic(s.lower, down=True)}); the epsilon at the bound is still a guarantee")
    # shown without --details too: the row's sensitivity is only bounded
    notes = [] if s.exact else [f"deterministic: {sens_text}"]
    return [("deterministic participation", eps_text,
             f"{sens_text}; noise multiplier sigma/sens {pessimistic(det.noise_multiplier, down=True)}; "
             f"rho-zCDP {pessimistic(det.rho_zcdp)}; exact analytic Gaussian")], notes


def _cyclic_poisson_rows(report: AccountingReport, cyc: Any) -> _Rows:
    # the rate's meaning stays in the default output (it is easy to pass batch / examples instead)
    note = (f"cyclic Poisson: p = {cyc.sampling:g} is the rate per group (per group: each example's group is "
            f"sampled with probability p at its group's steps; expected batch p / b = "
            f"{cyc.sampling / cyc.cycle:.6g} of the examples). {_text(cyc, 'assumptions')}. "
            f"{_text(cyc, 'method')}")
    return [("cyclic Poisson (banded C)", pessimistic(cyc.epsilon),
             f"as DP-SGD with {cyc.steps} steps at p = {cyc.sampling:g} (per group: each example's group is sampled "
             f"with probability p at its group's steps; expected batch p / b = {cyc.sampling / cyc.cycle:.6g} "
             f"of the examples), noise multiplier sigma / max column norm "
             f"{pessimistic(cyc.noise_multiplier, down=True)}; C has {cyc.bands} bands <= b = {cyc.cycle}; PLD, "
             f"discretization {cyc.value_discretization:g}")], [note]


def _balls_in_bins_tree_rows(report: AccountingReport, bib: Any) -> _Rows:
    return [("binary tree, balls-in-bins: guarantee [lower, upper]", _bracket(bib),
             f"batch sampler: balls-in-bins (every example in one uniformly random step); "
             f"exact law of the tree's likelihood ratio on a grid of {bib.grid:g}, rounded up (guarantee) and down "
             f"(lower bound); {bib.epochs} epoch(s); not valid for shuffling or Poisson sampling")], []


def _reduction_rows(report: AccountingReport, red: Any) -> _Rows:
    sn = red.spectral
    ps = red.per_step
    if red.variant == "per-step" and ps is not None:
        row = ("DP-SGD reduction (any causal C), per-step", pessimistic(red.epsilon),
               f"DP-SGD's epsilon under Poisson sampling with per-step noise multipliers d_t "
               f"({len(ps.groups)} groups, smallest {pessimistic(min(d for d, _ in ps.groups), down=True)}), "
               f"||C diag(d)||_2 <= sigma certified; below the scalar bound {pessimistic(red.scalar_epsilon)}; "
               "a post-processing of that DP-SGD run (docs/accounting.md)")
    else:
        row = ("DP-SGD reduction (any causal C)", pessimistic(red.epsilon),
               f"DP-SGD's epsilon under the same batch sampler at noise multiplier sigma / ||C||_2 = "
               f"{pessimistic(red.noise_multiplier, down=True)}; ||C||_2 <= {pessimistic(sn.upper)} "
               f"({safe_markup(sn.method)}); a post-processing of that DP-SGD run (docs/accounting.md)")
    return [row], []


def _balls_in_bins_dp_sgd_rows(report: AccountingReport, bdp: Any) -> _Rows:
    return [("DP-SGD, balls-in-bins (reference)", _bracket(bdp),
             f"another mechanism: C = I with noise multiplier sigma = {report.sigma:g}, n = {bdp.steps}; exact "
             f"law of the random-allocation pair on a grid of {bdp.grid:g}, rounded up and down")], []


def _shuffled_dp_sgd_rows(report: AccountingReport, sdp: Any) -> _Rows:
    amp = "none applies" if sdp.amplified is None else pessimistic(sdp.amplified)
    row = ("DP-SGD, one shuffled epoch (reference)", pessimistic(sdp.epsilon),
           f"batch sampler: shuffle; C = I, batch size 1, noise multiplier sigma = {report.sigma:g}; "
           f"FMT amplified {amp}"
           + ("" if sdp.eps0 is None else f" (eps0 {pessimistic(sdp.eps0)}, delta0 {sdp.delta0:.3g})")
           + f", unamplified {pessimistic(sdp.unamplified)}; replace-one neighbours")
    return [row], [f"shuffled DP-SGD: {_text(sdp, 'assumptions')}. {_text(sdp, 'method')}"]


#: The table's settings in display order: the name that begins the setting's line below the table
#: (followed by the assumptions its JSON row states; None: the setting writes its lines itself),
#: and its rows and further lines, built from the report and the setting's result.
_ROWS: dict[str, tuple[str | None, Callable[[AccountingReport, Any], _Rows]]] = {
    "single-pass": ("single pass", _single_pass_rows),
    "dp-sgd": ("DP-SGD", _dp_sgd_rows),
    "mmcc": (None, _mmcc_rows),
    "shuffled-tree": ("shuffled tree", _shuffled_tree_rows),
    "deterministic": ("deterministic", _deterministic_rows),
    "cyclic-poisson": (None, _cyclic_poisson_rows),
    "balls-in-bins-tree": ("balls-in-bins tree", _balls_in_bins_tree_rows),
    "dp-sgd-reduction": ("DP-SGD reduction", _reduction_rows),
    "balls-in-bins-dp-sgd": ("balls-in-bins DP-SGD (reference)", _balls_in_bins_dp_sgd_rows),
    "shuffled-dp-sgd": (None, _shuffled_dp_sgd_rows),
}


def _estimate(*args: Any, **kwargs: Any) -> CalibrationEstimate:
    """The calibration's cost estimate (:func:`mfcli.services.cost.estimate_calibration`); a
    memory refusal names the flag that raises the limit."""
    from mfcli.services.cost import estimate_calibration
    from mfcli.util.memory import MemoryLimitError

    try:
        return estimate_calibration(*args, **kwargs)
    except MemoryLimitError as exc:
        raise MemoryLimitError(str(exc).replace("raise the memory limit", "raise --max-memory")) from None


#: Parse-time checks (exit 2) of the options whose range or choices need no other option.
STRATEGY_CHECK = in_range(library_check("mfcli.util.validation", "one_of", BUILTIN, "strategy"))
WORKLOAD_CHECK = in_range(library_check("mfcli.util.validation", "one_of", ("prefix", "momentum"), "workload"))
SETTING_CHECK = in_range(library_check("mfcli.util.validation", "one_of", SETTINGS, "setting"))
VALUE_DISCRETIZATION_CHECK = in_range(library_check("mfcli.accounting.single_pass", "check_discretization"))
TAIL_FRACTION_CHECK = in_range(library_check("mfcli.accounting.mmcc", "check_tail_fraction"))
MIXTURE_GRID_CHECK = in_range(library_check(
    "mfcli.util.validation", "positive_number", "the mixture grid", upper=1.0, upper_closed=True))
OPERATOR_CHECK = in_range(library_check("mfcli.strategies.operators", "check_operator_choice"))
MAX_MEMORY_CHECK = in_range(library_check("mfcli.util.memory", "parse_size"))


@option_group(ParticipationOptions, into="participation")
def account(
    source: Path | None = typer.Argument(
        None, help="mfcli artifact (.h5), a shipped artifact's name (prefix-n256, momentum-n256) or strategy matrix "
        f"C (.npy). Default: the shipped artifact {DEFAULT_ARTIFACT}.",
        show_default=False,
    ),
    strategy: str | None = typer.Option(
        None, "--strategy", "-s", callback=STRATEGY_CHECK,
        help=f"Built-in strategy: identity, tree, sqrt or optimal (with --n). Above n = {DENSE_MAX_N} identity, tree and sqrt "
        "are accounted by their forms of any n, without the matrix C: the settings that need C say so. "
        "(In mfcli compare, -s is --strategies, a list.)"
    ),
    n: int | None = typer.Option(None, "--n", "-n", callback=positive_n, help="Number of steps for --strategy."),
    workload: str | None = typer.Option(
        None, "--workload", "-w", callback=WORKLOAD_CHECK,
        help="With --strategy: the workload it is built for, prefix (default) or momentum."
    ),
    beta: float | None = typer.Option(
        None, "--beta", callback=BETA_RANGE, help="Momentum coefficient for --workload momentum (default 0.9)."
    ),
    sigma: float | None = typer.Option(
        None, "--sigma", callback=SIGMA_RANGE, help="Noise std sigma of the noise on C G, in units of the clip norm, for C "
        "as given (NOT the noise multiplier, which is sigma / the sensitivity of C; both are printed)."
    ),
    epsilon: float | None = typer.Option(
        None, "--epsilon", callback=EPSILON_RANGE, help="Target epsilon: find the smallest noise meeting it (instead of "
        "--sigma); printed as the noise multiplier, with the noise std sigma on C G and the sensitivity it divides by."
    ),
    sampling: float | None = typer.Option(
        None, "--sampling", "-p", callback=SAMPLING_RANGE,
        help="Sampling rate p in (0, 1]. Default --batching poisson (DP-SGD and MMCC): the "
        "per-step rate, every example in every step with probability p, p = batch / examples. --batching cyclic: the per-group "
        "rate, each example's group is sampled with probability p at its group's steps; p = b x batch / examples "
        "(b groups)."
    ),
    batching: str | None = typer.Option(
        None, "--batching",
        help=f"Batch sampler: {', '.join(BATCHINGS)}. With --sampling: poisson (default; every example in every step "
        "with probability p) or cyclic (b groups, group i mod b sampled at step i, b from --min-sep or n/--epochs, banded "
        "C only). Without --sampling: balls-in-bins (every example in one uniformly random step of the epoch) or shuffle "
        "(one shuffled epoch); only the rows valid for the sampler are shown.",
    ),
    *,
    participation: ParticipationOptions,
    delta: float = typer.Option(DEFAULT_DELTA, "--delta", callback=DELTA_RANGE, help="delta in (0, 1)."),
    setting: str | None = typer.Option(
        None, "--setting", callback=SETTING_CHECK,
        help=f"Setting to calibrate with --epsilon: {', '.join(SETTINGS)} (default: mmcc with --sampling, cyclic-poisson "
        "with --batching cyclic, balls-in-bins-tree with --batching balls-in-bins, else single-pass, or deterministic "
        "under --epochs/--min-sep).",
    ),
    value_discretization: float | None = typer.Option(
        None, "--value-discretization", callback=VALUE_DISCRETIZATION_CHECK,
        help=f"DP-SGD and MMCC (with --sampling): PLD value discretization (default {DEFAULT_DISCRETIZATION:g}; MMCC may "
        "coarsen it to fit its work budget; the grid used is printed).",
    ),
    tail_fraction: list[float] | None = typer.Option(
        None, "--tail-fraction", callback=TAIL_FRACTION_CHECK,
        help="MMCC only (with --sampling): share f of delta for the tail events (repeat to try several; the best is reported).",
    ),
    mixture_grid: float | None = typer.Option(
        None, "--mixture-grid", callback=MIXTURE_GRID_CHECK,
        help="MMCC only (with --sampling): row sensitivities are rounded up to multiples of 1/ceil(1/grid) (default 0.02).",
    ),
    operator: str | None = typer.Option(
        None, "--operator", callback=OPERATOR_CHECK,
        help="Operator of an artifact to account: auto (default: the compressed decoder if the artifact has one, "
        "as noise streams and the adapters stream it; else dense), dense or compressed.",
    ),
    write: bool = typer.Option(
        False, "--write", help="Record the result in the input artifact (group accounting/<id>); matrices untouched."
    ),
    max_memory: str | None = typer.Option(
        None, "--max-memory", metavar="<size>", callback=MAX_MEMORY_CHECK,
        help="MMCC (with --sampling): memory the tail events may use, e.g. 2G (default: half of physical memory); "
        "a run that would exceed it is refused with its estimate.",
    ),
    banded_estimate: bool = typer.Option(
        False, "--banded-estimate",
        help="MMCC (with --sampling) on a banded C (at most 10 bands, the identity included): also run the "
        "importance-sampled ESTIMATE of the exact Poisson pair's epsilon, with its interval (Monte Carlo, seconds of "
        "CPU even at small n; never a bound, never used to calibrate).",
    ),
    details: bool = typer.Option(
        False, "--details", help="Add each row's method and numbers (delta split, grids, sensitivities, noise "
        "multipliers) to the table; the JSON always has them."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    events: bool = typer.Option(
        False, "--events",
        help="With --json: include each setting's full dp-accounting event (MMCC's can be megabytes; by default each "
        "setting carries a dp_event_summary, and --write stores the full events in the artifact either way).",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Epsilon of a strategy under single-pass, DP-SGD (reference), MMCC (Poisson sampling), the
    shuffled binary tree and the DP-SGD reduction (any causal C, every batch sampler) -- or, with
    --epsilon, the smallest sigma that meets a target. The output ends with the number to report:
    the smallest guarantee for the stated batch sampler.

    A structured artifact (banded Toeplitz, BLT) is accounted like a dense one up to n = 8192 (C is
    materialised); above, from its parameters: without sampling, with --batching cyclic for a
    banded C, or DP-SGD under --sampling (it needs no C; MMCC needs the dense C and is not run
    there).

    Threads: with none of OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS (or GOTO_, BLIS_,
    VECLIB_MAXIMUM_THREADS) set, the BLAS runs on one thread, except the solver of --strategy
    optimal and eigenvalue certificates above n = 1024, which may use every CPU; set one to choose."""
    from mfcli.io.artifact import is_shipped_artifact
    from mfcli.services.account import (
        AccountingOptions,
        record_to_artifact,
        resolve_strategy,
    )
    from mfcli.services.account import (
        account as run_account,
    )
    from mfcli.services.account import (
        calibrate as run_calibrate,
    )

    say = (lambda s: None) if quiet else log
    requested = participation.requested()
    refuse_unless(not events or as_json, "--events adds the full events to --json output; give --json")
    refuse_unless(batching is None or batching in BATCHINGS,
                  f"--batching must be one of {', '.join(BATCHINGS)}, got {batching!r}")
    refuse_unless(batching not in SAMPLED_BATCHINGS or sampling is not None,
                  f"--batching {batching} chooses the batch sampler of --sampling; give --sampling")
    # Usage errors (exit 2): options that conflict, or that do not apply to what this run does.
    refuse_unless(
        (sigma is None) != (epsilon is None), "give exactly one of --sigma (to account) or --epsilon (to calibrate sigma)"
    )
    refuse_unless(setting is None or epsilon is not None,
                  "--setting selects what --epsilon calibrates; without --epsilon every setting is shown")
    refuse_unless(
        n is None or strategy is not None, "--n applies to a built-in --strategy; an artifact or .npy strategy has its own n"
    )
    refuse_unless(workload is None or strategy is not None,
                  "--workload applies to a built-in --strategy; an artifact or .npy strategy has its own workload")
    refuse_unless(beta is None or workload == "momentum", "--beta applies to --workload momentum only")
    refuse_unless(operator is None or strategy is None,
                  "--operator chooses between the operators of an artifact; a built-in --strategy has only one")
    refuse_unless(strategy is None or source is None, "give either a strategy file or --strategy, not both")
    refuse_unless(strategy is None or n is not None, f"--strategy {strategy} needs --n (the number of steps)")
    if batching is not None and batching not in SAMPLED_BATCHINGS:
        refuse_unless(sampling is None,
                      f"--sampling gives the Poisson sampling rate; --batching {batching} does not sample")
        refuse_unless(setting is None or setting in BATCHING_SETTINGS[batching],
                      f"--setting {setting} does not assume --batching {batching} "
                      f"(choose from {', '.join(BATCHING_SETTINGS[batching])})")
    refuse_unless(setting not in ("dp-sgd-reduction", "balls-in-bins-dp-sgd"),
                  f"--setting {setting} cannot be calibrated yet: calibrate the strategy's own setting (the "
                  "reduction's epsilon is shown, and reported when smaller, at any sigma)")
    refuse_unless(setting not in ("balls-in-bins-tree", "shuffled-dp-sgd") or batching in BATCHING_SETTINGS,
                  f"--setting {setting} needs the matching --batching")
    # shuffle: single-pass is the strategy's guarantee for any order (the shuffled tree's row is the same number)
    batch_default = {"balls-in-bins": "balls-in-bins-tree"}.get(batching or "")
    sampled = ("cyclic-poisson",) if batching == "cyclic" else ("dp-sgd", "mmcc")
    default_sampled = "cyclic-poisson" if batching == "cyclic" else "mmcc"
    calibrated = None if epsilon is None else (
        setting or batch_default or (default_sampled if sampling is not None else "unsampled"))
    refuse_unless(epsilon is None or sampling is not None or calibrated not in ("mmcc", "dp-sgd", "cyclic-poisson"),
                  f"calibrating {calibrated} needs --sampling")
    refuse_unless(sampling is None or calibrated is None or calibrated in sampled,
                  f"--sampling{' --batching cyclic' if batching == 'cyclic' else ''} does not apply to calibrating "
                  f"{calibrated} (only {' and '.join(sampled)} use it)")
    runs_pld = sampling is not None and calibrated in (None, "dp-sgd", "mmcc", "cyclic-poisson")
    runs_mmcc = sampling is not None and batching != "cyclic" and calibrated in (None, "mmcc")
    why = "needs --sampling" if sampling is None else f"not calibrated here ({calibrated})"
    refuse_unless(value_discretization is None or runs_pld,
                  f"--value-discretization applies to the PLD accounting of DP-SGD and MMCC, which {why}")
    refuse_unless(tail_fraction is None or runs_mmcc, f"--tail-fraction applies to MMCC only, which {why}")
    refuse_unless(mixture_grid is None or runs_mmcc, f"--mixture-grid applies to MMCC only, which {why}")
    refuse_unless(max_memory is None or runs_mmcc, f"--max-memory applies to MMCC only, which {why}")
    refuse_unless(not banded_estimate or runs_mmcc, "--banded-estimate applies to MMCC only, which "
                  + ("--batching cyclic does not run" if batching == "cyclic" and sampling is not None else why))
    defaults = AccountingOptions()
    if value_discretization is None:
        value_discretization = defaults.value_discretization
    from mfcli.accounting.single_pass import check_sampling, check_sigma
    from mfcli.util.memory import default_max_memory, parse_size

    if sigma is not None:
        check_sigma(sigma)
    if sampling is not None:
        check_sampling(sampling)
    opts = AccountingOptions(
        delta=delta, value_discretization=value_discretization,
        tail_fractions=tuple(tail_fraction) if tail_fraction else defaults.tail_fractions,
        mixture_resolution=defaults.mixture_resolution if mixture_grid is None else math.ceil(1.0 / mixture_grid - 1e-9),
        max_memory=default_max_memory() if max_memory is None else parse_size(max_memory),
        banded_estimate=banded_estimate,
    ).checked()
    built_for: dict[str, Any] = {k: v for k, v in (("workload", workload), ("beta", beta)) if v is not None}
    inp = resolve_strategy(artifact_argument(source) if source is not None else None, strategy=strategy, n=n,
                           operator=operator or "auto", progress=say, **built_for)
    if not inp.has_matrix:
        # MMCC is not run without the matrix C (a structured artifact above its dense limit), so its
        # options would do nothing
        given = [flag for flag, used in (("--banded-estimate", banded_estimate), ("--tail-fraction", bool(tail_fraction)),
                                         ("--mixture-grid", mixture_grid is not None),
                                         ("--max-memory", max_memory is not None)) if used]
        refuse_unless(not given, inp.mechanism.matrix_refusal(f"{given[0] if given else ''} (an MMCC option)"))
    from mfcli.model.participation import SingleParticipation
    from mfcli.services.account import resolve_schema

    schema = resolve_schema(inp, requested)
    if calibrated == "unsampled":
        calibrated = "single-pass" if isinstance(schema, SingleParticipation) else "deterministic"
    if calibrated is not None:
        from mfcli.services.account import check_setting_applies, check_setting_schema

        check_setting_schema(calibrated, schema, inp.n)
        if calibrated == "mmcc" and inp.has_matrix:
            from mfcli.accounting.mmcc import NEGATIVE_C_ADVICE

            try:
                check_setting_applies(inp, "mmcc")
            except MfcliError as exc:  # the library names the bound; the CLI names the flags that ask for it
                if NEGATIVE_C_ADVICE not in str(exc):
                    raise
                raise MfcliError(f"{exc} (without --sampling, --min-sep 1 calibrates that bound)") from None
    if source is None and strategy is None:
        say(f"no strategy given: using the shipped artifact {DEFAULT_ARTIFACT} ({inp.artifact})")
    if write:
        if inp.artifact is None:
            raise MfcliError("--write needs an artifact as input (not a .npy file or a built-in strategy)")
        if source is None or is_shipped_artifact(inp.artifact):
            raise MfcliError("--write would modify a shipped artifact; copy it and pass the copy")

    calibration = None
    chosen = None
    probe = None
    with ProgressDisplay(quiet=quiet) as display:
        say = display.log
        if epsilon is not None:
            chosen = calibrated
            assert chosen is not None
            say(f"calibrating sigma for {chosen} at epsilon {epsilon:g}, delta {delta:g} ({schema.describe(inp.n)})")
            probe = _estimate(inp, chosen, target_epsilon=epsilon, sampling=sampling, options=opts,
                              participation=schema, on_progress=display)
            say(describe_estimate(probe))
            calibration = run_calibrate(inp, chosen, target_epsilon=epsilon, sampling=sampling, options=opts,
                                        progress=say, participation=schema, on_progress=display, probe=probe)
            sigma = calibration.sigma
            report = run_account(inp, sigma=sigma, sampling=sampling, options=opts, settings=(chosen,), progress=say,
                                 participation=schema, batching=batching, on_progress=display)
        else:
            assert sigma is not None  # refuse_unless above: exactly one of sigma and epsilon is given
            report = run_account(inp, sigma=sigma, sampling=sampling, options=opts, progress=say,
                                 participation=schema, batching=batching, on_progress=display)

    group = None
    if write:
        group = record_to_artifact(report, calibration=calibration, calibrated_setting=chosen, command=command_line())
        say(f"recorded in {inp.artifact} as group {group}")

    if as_json:
        payload = report.as_dict()
        if not events:
            for row in payload["settings"].values():
                if "dp_event" in row:  # kept small: MMCC's event has one entry per distinct row of C
                    text = row.pop("dp_event")  # event_to_json's string
                    row["dp_event_summary"] = {"class_name": json.loads(text)["class_name"], "json_chars": len(text)}
        if calibration is not None:
            assert probe is not None  # set together with calibration above
            payload["calibration"] = {"setting": chosen, **calibration.as_dict(), "estimate": probe.as_dict(),
                                      "for_accounted_strategy": chosen != "dp-sgd" or _is_identity(inp)}
        if group is not None:
            payload["written"] = {"artifact": str(inp.artifact), "group": group}
        # the number to report comes last, with its line as the table prints it (cli.render loads
        # mfcli.services.compare and numpy: imported here so that account --help stays light)
        from mfcli.cli.render import report_line

        rep = payload.pop("report")
        payload["report"] = {**rep, "line": report_line(rep)}
        emit_json("account", payload)
        return
    out = stdout()
    out.print(f"strategy: {safe_markup(inp.source)}")
    stored = "" if requested is None or inp.artifact is None else f" (the artifact declares {inp.participation.describe(inp.n)})"
    out.print(f"participation accounted: {safe_markup(schema.describe(inp.n))}{safe_markup(stored)}")
    operator_line = safe_markup(inp.operator)
    as_given = " (C as given)" if inp.has_matrix else ""
    out.print(f"operator accounted: {operator_line} (the one noise streams and the adapters stream by default)"
              if inp.artifact is not None else f"operator accounted: {operator_line}{as_given}")
    if calibration is not None:
        from mfcli.services.account import noise_sensitivity_of

        assert calibration.sensitivity is not None and calibration.noise_multiplier is not None  # session.calibrate sets it
        sens, mult = calibration.sensitivity, calibration.noise_multiplier
        sens_of = noise_sensitivity_of(schema, fixed_order=chosen == "deterministic")
        for_c = chosen not in REFERENCE_SETTINGS or _is_identity(inp)
        instead = {"dp-sgd": "mmcc", "shuffled-dp-sgd": "shuffled-tree or single-pass"}.get(str(chosen), "a setting of this C")
        out.print(key_value_table(f"calibration: {chosen}" + ("" if for_c else " (the DP-SGD reference, C = I: NOT a "
                                                                             f"sigma for this C; calibrate {instead} for it)"), [
            ("target epsilon", calibration.target_epsilon),
            ("delta", delta),
            ("noise multiplier (smallest found, rounded up)", pessimistic(float(mult))),
            ("noise std sigma on C G (rounded up)", pessimistic(float(calibration.sigma))),
            ("sensitivity it divides by", f"{pessimistic(float(sens))} ({sens_of})"),
            ("achieved epsilon at that noise", pessimistic(float(calibration.epsilon))),
            ("noise multiplier bracket", f"[{pessimistic(float(calibration.sigma_lower) / sens, down=True)}, "
                                         f"{pessimistic(float(mult))}] (relative width <= 1e-3)"),
            ("accounting runs", calibration.evaluations),
        ]))
    table, notes = _rows_table(report, details=details)
    out.print(table)
    out.print("assumptions:")
    for line in notes:
        out.print(f"  - {line}")
    if group is not None:
        out.print(f"recorded: {safe_markup(inp.artifact)} group {safe_markup(group)}")
    from mfcli.cli.render import report_line, report_notes

    rep = report.report().as_dict()
    for line in report_notes(rep):
        out.print(safe_markup(line))
    out.print(safe_markup(report_line(rep)))
