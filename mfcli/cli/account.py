"""``mfcli account``: epsilon of a strategy under single-pass, DP-SGD, MMCC and the shuffled tree,
or the sigma that meets a target epsilon (docs/accounting.md)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.table import Table

from mfcli.accounting.mmcc import MMCCResult
from mfcli.accounting.session import (
    DEFAULT_ARTIFACT,
    SETTINGS,
    AccountingOptions,
    AccountingReport,
    account as run_account,
    calibrate as run_calibrate,
    record_to_artifact,
    resolve_strategy,
)
from mfcli.accounting.single_pass import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
from mfcli.artifact import is_shipped_artifact
from mfcli.cli.common import command_line, emit_json, envelope, guarded, key_value_table, log, stdout
from mfcli.cli.rounding import safe as _e
from mfcli.errors import MfcliError


def _text(result: Any, key: str) -> str:
    """A result's descriptive text (assumptions, method), which lives with its JSON form."""
    d = result.as_dict(include_event=False) if isinstance(result, MMCCResult) else result.as_dict()
    return str(d[key])


def _rows_table(report: AccountingReport) -> tuple[Table, list[str]]:
    t = Table(title=f"privacy of {report.strategy.name} (n = {report.strategy.n}, operator "
                    f"{report.strategy.operator}), sigma = {_e(float(report.sigma))}, "
                    f"delta = {report.delta:g}", title_justify="left", show_lines=True)
    t.add_column("setting", style="bold")
    t.add_column("epsilon", justify="right")
    t.add_column("details")
    notes: list[str] = []
    sp = report.single_pass
    if sp is not None:
        t.add_row("single pass", _e(sp.epsilon),
                  f"rho-zCDP {_e(sp.rho_zcdp)}, mu-GDP {_e(sp.mu_gdp)}; sens(C) {_e(sp.sensitivity)} "
                  f"({report.strategy.operator} operator), "
                  f"noise multiplier sigma/sens {_e(sp.noise_multiplier, down=True)}; exact analytic Gaussian")
        notes.append(f"single pass: {_text(sp, 'assumptions')}")
    dp = report.dp_sgd
    if dp is not None:
        t.add_row("DP-SGD (reference)", _e(dp.epsilon),
                  f"C = I with noise multiplier sigma = {report.sigma:g} (the same noise per step, not sigma/sens), "
                  f"p = {dp.sampling:g}, n = {dp.steps}; PLD, discretization {dp.value_discretization:g}")
        notes.append(f"DP-SGD: {_text(dp, 'assumptions')}")
    br = report.mmcc
    if br is not None:
        u = br.upper
        t.add_row(
            "MMCC (Poisson)\n[lower, upper]",
            f"[{_e(br.lower.epsilon, down=True)}, {_e(u.epsilon)}]",
            f"delta = {_e(u.delta_pld, digits=3)} (PLD) + {_e(u.delta_tail, digits=3)} (tail, f = {u.tail_fraction:g}) + "
            f"{_e(u.delta_trunc, digits=2)} (cut mixture tails); K = {u.pairs} tail events, max p~ = "
            f"{_e(u.max_p_tilde, digits=4)}; {u.distinct_rows} distinct of {u.rows} rows; PLD grid "
            f"{u.value_discretization:g}, mixture grid {1.0 / u.mixture_resolution:g}; "
            f"example in every step (sanity bound): {_e(br.full.epsilon)}",
        )
        notes.append(f"MMCC: {_text(u, 'assumptions')}. {_text(u, 'method')}. Lower bound: exact epsilon of the "
                     "post-processed statistic 1^T C^+ y")
    st = report.shuffled_tree
    if st is not None:
        t.add_row("binary tree, one shuffled epoch", _e(st.epsilon),
                  f"valid single-epoch bound (Gaussian, sensitivity sqrt(L + 1) = {_e(st.sensitivity)}); "
                  f"amplified bound {st.amplified_note}")
        notes.append(f"shuffled tree: {_text(st, 'assumptions')}")
    return t, notes


@guarded
def account(
    source: Optional[Path] = typer.Argument(
        None, help=f"mfcli artifact (.h5) or strategy matrix C (.npy). Default: the shipped artifact {DEFAULT_ARTIFACT}.",
        show_default=False,
    ),
    strategy: Optional[str] = typer.Option(None, "--strategy", "-s", help="Built-in strategy: identity, tree, sqrt or optimal (with --n)."),
    n: Optional[int] = typer.Option(None, "--n", "-n", help="Number of steps for --strategy."),
    workload: str = typer.Option("prefix", "--workload", "-w", help="Workload for --strategy optimal (and post-processing): prefix or momentum."),
    beta: float = typer.Option(0.9, "--beta", help="Momentum coefficient for --workload momentum."),
    sigma: Optional[float] = typer.Option(None, "--sigma", help="Noise multiplier: noise std in units of the clip norm, for C as given."),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Target epsilon: find the smallest sigma meeting it (instead of --sigma)."),
    sampling: Optional[float] = typer.Option(None, "--sampling", "-p", help="Poisson sampling rate p in (0, 1] for DP-SGD and MMCC."),
    delta: float = typer.Option(DEFAULT_DELTA, "--delta", help="delta in (0, 1)."),
    setting: Optional[str] = typer.Option(
        None, "--setting", help=f"Setting to calibrate with --epsilon: {', '.join(SETTINGS)} (default: mmcc with --sampling, else single-pass)."
    ),
    value_discretization: float = typer.Option(DEFAULT_DISCRETIZATION, "--value-discretization", help="PLD value discretization (MMCC may coarsen it to fit its work budget; the grid used is printed)."),
    tail_fraction: Optional[List[float]] = typer.Option(None, "--tail-fraction", help="MMCC: share f of delta for the tail events (repeat to try several; the best is reported)."),
    mixture_grid: float = typer.Option(0.02, "--mixture-grid", help="MMCC: row sensitivities are rounded up to multiples of 1/ceil(1/grid)."),
    operator: str = typer.Option(
        "auto", "--operator",
        help="Operator of an artifact to account: auto (the compressed decoder if the artifact has one, "
        "as noise streams and the adapters stream it; else dense), dense or compressed.",
    ),
    write: bool = typer.Option(False, "--write", help="Record the result in the input artifact (group accounting/<id>); matrices untouched."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Epsilon of a strategy under single-pass, DP-SGD (reference), MMCC (Poisson sampling) and the
    shuffled binary tree -- or, with --epsilon, the smallest sigma that meets a target."""
    say = (lambda s: None) if quiet else log
    if (sigma is None) == (epsilon is None):
        raise MfcliError("give exactly one of --sigma (to account) or --epsilon (to calibrate sigma)")
    if not (mixture_grid > 0 and mixture_grid <= 1):
        raise MfcliError(f"--mixture-grid must lie in (0, 1], got {mixture_grid!r}")
    import math

    from mfcli.accounting.single_pass import check_sampling, check_sigma

    if sigma is not None:
        check_sigma(sigma)
    if sampling is not None:
        check_sampling(sampling)
    opts = AccountingOptions(
        delta=delta, value_discretization=value_discretization,
        tail_fractions=tuple(tail_fraction) if tail_fraction else AccountingOptions().tail_fractions,
        mixture_resolution=int(math.ceil(1.0 / mixture_grid - 1e-9)),
    ).checked()
    if strategy is None and n is not None:
        raise MfcliError("--n applies to a built-in --strategy; an artifact or .npy strategy has its own n")
    if strategy is not None and source is not None:
        raise MfcliError("give either a strategy file or --strategy, not both")
    if strategy is not None and n is None:
        raise MfcliError(f"--strategy {strategy} needs --n (the number of steps)")
    if epsilon is not None and sampling is None and setting in ("mmcc", "dp-sgd"):
        raise MfcliError(f"calibrating {setting} needs --sampling")
    if operator not in ("auto", "dense", "compressed"):
        raise MfcliError(f"--operator must be auto, dense or compressed, got {operator!r}")
    inp = resolve_strategy(source, strategy=strategy, n=n, workload=workload, beta=beta, operator=operator, progress=say)
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
        if setting is not None:
            raise MfcliError("--setting selects what --epsilon calibrates; without --epsilon every setting is shown")
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
    out.print(f"operator accounted: {inp.operator} (the one noise streams and the adapters stream by default)"
              if inp.artifact is not None else f"operator accounted: {inp.operator} (C as given)")
    if calibration is not None:
        out.print(key_value_table(f"calibration: {chosen}", [
            ("target epsilon", calibration.target_epsilon),
            ("delta", delta),
            ("sigma (smallest found, rounded up)", _e(float(calibration.sigma))),
            ("achieved epsilon at that sigma", _e(float(calibration.epsilon))),
            ("bracket", f"[{_e(float(calibration.sigma_lower), down=True)}, {_e(float(calibration.sigma))}] "
                        "(relative width <= 1e-3)"),
            ("accounting runs", calibration.evaluations),
        ]))
    table, notes = _rows_table(report)
    out.print(table)
    out.print("assumptions:")
    for line in notes:
        out.print(f"  - {line}")
    if group is not None:
        out.print(f"recorded: {inp.artifact} group {group}")
