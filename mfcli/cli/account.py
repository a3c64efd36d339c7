"""``mfcli account``: epsilon of a strategy under single-pass, DP-SGD, MMCC and the shuffled tree,
or the sigma that meets a target epsilon (docs/accounting.md)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.table import Table

from mfcli.accounting.report import (
    DEFAULT_ARTIFACT,
    SETTINGS,
    AccountingOptions,
    account as run_account,
    calibrate as run_calibrate,
    record_to_artifact,
    resolve_strategy,
)
from mfcli.accounting.single_pass import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.artifact import is_shipped_artifact
from mfcli.cli.common import (
    artifact_argument,
    command_line,
    emit_json,
    envelope,
    guarded,
    key_value_table,
    log,
    refuse_unless,
    stdout,
)
from mfcli.errors import MfcliError


def _e(v: Any, *, down: bool = False) -> str:
    """Six significant digits, rounded UP (upper bounds, calibrated sigma) or DOWN (lower bounds),
    so that a printed privacy number is never on the optimistic side of the computed one."""
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v) or v == 0:
            return "inf" if v == float("inf") else f"{v:g}"
        scale = 10.0 ** (math.floor(math.log10(abs(v))) - 5)
        r = (math.floor if down else math.ceil)(v / scale) * scale
        return f"{r:.6g}"
    return str(v)


def _rows_table(report: Any) -> tuple[Table, list[str]]:
    t = Table(title=f"privacy of {report.strategy.name} (n = {report.strategy.n}), sigma = {_e(float(report.sigma))}, "
                    f"delta = {report.delta:g}", title_justify="left", show_lines=True)
    t.add_column("setting", style="bold")
    t.add_column("epsilon", justify="right")
    t.add_column("details")
    notes: list[str] = []
    r = report.rows
    if "single-pass" in r:
        d = r["single-pass"]
        t.add_row("single pass", _e(d["epsilon"]),
                  f"rho-zCDP {d['rho_zcdp']:.6g}, mu-GDP {d['mu_gdp']:.6g}; sens(C) {d['sensitivity']:.6g}, "
                  f"noise multiplier sigma/sens {d['noise_multiplier']:.6g}; exact analytic Gaussian")
        notes.append(f"single pass: {d['assumptions']}")
    if "dp-sgd" in r:
        d = r["dp-sgd"]
        t.add_row("DP-SGD (reference)", _e(d["epsilon"]),
                  f"C = I with noise multiplier sigma = {report.sigma:g} (the same noise per step, not sigma/sens), "
                  f"p = {d['sampling']:g}, n = {d['steps']}; PLD, discretization {d['value_discretization']:g}")
        notes.append(f"DP-SGD: {d['assumptions']}")
    if "mmcc" in r:
        d = r["mmcc"]
        fp = d["full_participation"]
        t.add_row(
            "MMCC (Poisson)\n[lower, upper]",
            f"[{_e(d['lower_bound'], down=True)}, {_e(d['epsilon'])}]",
            f"delta = {d['delta_pld']:.3g} (PLD) + {d['delta_tail']:.3g} (tail, f = {d['tail_fraction']:g}) + "
            f"{d['delta_trunc']:.2g} (cut mixture tails); K = {d['tail_events_K']} tail events, max p~ = "
            f"{d['max_p_tilde']:.4g}; {d['distinct_rows']} distinct of {d['rows']} rows; PLD grid "
            f"{d['value_discretization']:g}, mixture grid {d['mixture_grid']:g}; "
            f"example in every step (sanity bound): {fp['epsilon']:.6g}",
        )
        notes.append(f"MMCC: {d['assumptions']}. {d['method']}. Lower bound: exact epsilon of the "
                     "post-processed statistic 1^T C^+ y")
    if "shuffled-tree" in r:
        d = r["shuffled-tree"]
        t.add_row("binary tree, one shuffled epoch", _e(d["epsilon"]),
                  f"valid single-epoch bound (Gaussian, sensitivity sqrt(L + 1) = {d['sensitivity']:.6g}); "
                  f"amplified bound {d['amplified_note']}")
        notes.append(f"shuffled tree: {d['assumptions']}")
    return t, notes


@guarded
def account(
    source: Optional[Path] = typer.Argument(
        None, help="mfcli artifact (.h5), a shipped artifact's name (prefix-n256, momentum-n256) or strategy matrix "
        f"C (.npy). Default: the shipped artifact {DEFAULT_ARTIFACT}.",
        show_default=False,
    ),
    strategy: Optional[str] = typer.Option(None, "--strategy", "-s", help="Built-in strategy: identity, tree, sqrt or optimal (with --n)."),
    n: Optional[int] = typer.Option(None, "--n", "-n", help="Number of steps for --strategy."),
    workload: Optional[str] = typer.Option(
        None, "--workload", "-w", help="With --strategy: the workload it is built for, prefix (default) or momentum."
    ),
    beta: Optional[float] = typer.Option(None, "--beta", help="Momentum coefficient for --workload momentum (default 0.9)."),
    sigma: Optional[float] = typer.Option(None, "--sigma", help="Noise multiplier: noise std in units of the clip norm, for C as given."),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Target epsilon: find the smallest sigma meeting it (instead of --sigma)."),
    sampling: Optional[float] = typer.Option(None, "--sampling", "-p", help="Poisson sampling rate p in (0, 1] for DP-SGD and MMCC."),
    delta: float = typer.Option(DEFAULT_DELTA, "--delta", help="delta in (0, 1)."),
    setting: Optional[str] = typer.Option(
        None, "--setting", help=f"Setting to calibrate with --epsilon: {', '.join(SETTINGS)} (default: mmcc with --sampling, else single-pass)."
    ),
    value_discretization: Optional[float] = typer.Option(
        None, "--value-discretization",
        help=f"DP-SGD and MMCC (with --sampling): PLD value discretization (default {DEFAULT_DISCRETIZATION:g}; MMCC may "
        "coarsen it to fit its work budget; the grid used is printed).",
    ),
    tail_fraction: Optional[List[float]] = typer.Option(None, "--tail-fraction", help="MMCC only (with --sampling): share f of delta for the tail events (repeat to try several; the best is reported)."),
    mixture_grid: Optional[float] = typer.Option(
        None, "--mixture-grid",
        help="MMCC only (with --sampling): row sensitivities are rounded up to multiples of 1/ceil(1/grid) (default 0.02).",
    ),
    write: bool = typer.Option(False, "--write", help="Record the result in the input artifact (group accounting/<id>); matrices untouched."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Epsilon of a strategy under single-pass, DP-SGD (reference), MMCC (Poisson sampling) and the
    shuffled binary tree -- or, with --epsilon, the smallest sigma that meets a target."""
    say = (lambda s: None) if quiet else log
    # Usage errors (exit 2): options that conflict, or that do not apply to what this run does.
    refuse_unless((sigma is None) != (epsilon is None), "give exactly one of --sigma (to account) or --epsilon (to calibrate sigma)")
    refuse_unless(setting is None or epsilon is not None,
                  "--setting selects what --epsilon calibrates; without --epsilon every setting is shown")
    refuse_unless(n is None or strategy is not None, "--n applies to a built-in --strategy; an artifact or .npy strategy has its own n")
    refuse_unless(workload is None or strategy is not None,
                  "--workload applies to a built-in --strategy; an artifact or .npy strategy has its own workload")
    refuse_unless(beta is None or workload == "momentum", "--beta applies to --workload momentum only")
    calibrated = None if epsilon is None else (setting or ("mmcc" if sampling is not None else "single-pass"))
    refuse_unless(sampling is None or calibrated in (None, "dp-sgd", "mmcc"),
                  f"--sampling does not apply to calibrating {calibrated} (only dp-sgd and mmcc use it)")
    runs_pld = sampling is not None and calibrated in (None, "dp-sgd", "mmcc")
    runs_mmcc = sampling is not None and calibrated in (None, "mmcc")
    why = "needs --sampling" if sampling is None else f"not calibrated here ({calibrated})"
    refuse_unless(value_discretization is None or runs_pld,
                  f"--value-discretization applies to the PLD accounting of DP-SGD and MMCC, which {why}")
    refuse_unless(tail_fraction is None or runs_mmcc, f"--tail-fraction applies to MMCC only, which {why}")
    refuse_unless(mixture_grid is None or runs_mmcc, f"--mixture-grid applies to MMCC only, which {why}")
    defaults = AccountingOptions()
    if value_discretization is None:
        value_discretization = defaults.value_discretization
    if mixture_grid is not None and not (mixture_grid > 0 and mixture_grid <= 1):
        raise MfcliError(f"--mixture-grid must lie in (0, 1], got {mixture_grid!r}")
    import math

    from mfcli.accounting.single_pass import check_sampling, check_sigma

    if sigma is not None:
        check_sigma(sigma)
    if sampling is not None:
        check_sampling(sampling)
    opts = AccountingOptions(
        delta=delta, value_discretization=value_discretization,
        tail_fractions=tuple(tail_fraction) if tail_fraction else defaults.tail_fractions,
        mixture_resolution=defaults.mixture_resolution if mixture_grid is None else int(math.ceil(1.0 / mixture_grid - 1e-9)),
    ).checked()
    built_for: dict[str, Any] = {k: v for k, v in (("workload", workload), ("beta", beta)) if v is not None}
    inp = resolve_strategy(artifact_argument(source) if source is not None else None, strategy=strategy, n=n,
                           progress=say, **built_for)
    if source is None and strategy is None:
        say(f"no strategy given: using the shipped artifact {DEFAULT_ARTIFACT} ({inp.artifact})")
    if write and inp.artifact is None:
        raise MfcliError("--write needs an artifact as input (not a .npy file or a built-in strategy)")
    if write and (source is None or is_shipped_artifact(inp.artifact)):
        raise MfcliError("--write would modify a shipped artifact; copy it and pass the copy")

    calibration = None
    chosen = None
    if epsilon is not None:
        chosen = setting or ("mmcc" if sampling is not None else "single-pass")
        say(f"calibrating sigma for {chosen} at epsilon {epsilon:g}, delta {delta:g}")
        calibration = run_calibrate(inp, chosen, target_epsilon=epsilon, sampling=sampling, options=opts, progress=say)
        sigma = calibration.sigma
        report = run_account(inp, sigma=sigma, sampling=sampling, options=opts, settings=(chosen,), progress=say)
    else:
        report = run_account(inp, sigma=sigma, sampling=sampling, options=opts, progress=say)

    group = None
    if write:
        group = record_to_artifact(report, calibration=calibration, calibrated_setting=chosen, command=command_line())
        say(f"recorded in {inp.artifact} as group {group}")

    if as_json:
        payload = report.as_dict()
        if calibration is not None:
            payload["calibration"] = {"setting": chosen, **calibration.as_dict()}
        if group is not None:
            payload["written"] = {"artifact": str(inp.artifact), "group": group}
        emit_json(envelope("account", **payload))
        return
    out = stdout()
    out.print(f"strategy: {inp.source}")
    if calibration is not None:
        out.print(key_value_table(f"calibration: {chosen}", [
            ("target epsilon", calibration.target_epsilon),
            ("delta", delta),
            ("sigma (smallest found, rounded up)", _e(float(calibration.sigma))),
            ("achieved epsilon at that sigma", _e(float(calibration.epsilon))),
            ("bracket", f"[{calibration.sigma_lower:.6g}, {calibration.sigma:.6g}] (relative width <= 1e-3)"),
            ("accounting runs", calibration.evaluations),
        ]))
    table, notes = _rows_table(report)
    out.print(table)
    out.print("assumptions:")
    for line in notes:
        out.print(f"  - {line}")
    if group is not None:
        out.print(f"recorded: {inp.artifact} group {group}")
