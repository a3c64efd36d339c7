"""``mfcli optimize``: solve for the optimal factorization and write it as an artifact."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.live import Live
from rich.table import Table

from mfcli.artifact import check_output_path, default_artifact_path, load_artifact, save_artifact
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
    emit_json,
    envelope,
    guarded,
    key_value_table,
    log,
    stderr,
    stdout,
    workload_kwargs,
)
from mfcli.errors import MfcliError
from mfcli.solver import DEFAULT_METHOD, METHODS, Progress, dual_weights_from_strategy, optimal_factorization
from mfcli.workloads import build_workload


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

    def __enter__(self) -> "SolverDisplay":
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


@guarded
def optimize(
    workload: WorkloadOpt = "prefix",
    n: NOpt = None,
    beta: BetaOpt = None,
    lr: LrOpt = None,
    lr_factor: LrFactorOpt = None,
    lr_final: LrFinalOpt = None,
    lr_last: LrLastOpt = None,
    matrix: MatrixOpt = None,
    tol: float = typer.Option(1e-6, "--tol", help="Stop at this relative duality gap."),
    max_iter: int = typer.Option(1000, "--max-iter", help="Maximum solver iterations (eigendecompositions)."),
    method: str = typer.Option(
        DEFAULT_METHOD, "--method",
        help=f"Solver: {', '.join(METHODS)} (fixed-point is the seed paper's plain iteration). All are certified by the same gap.",
    ),
    warm_start: Optional[Path] = typer.Option(None, "--warm-start", help="Start from an existing artifact (any n; a file or a shipped name such as prefix-n256)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output artifact (default artifacts/<workload>-n<N>.h5)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object on stdout."),
) -> None:
    """Solve for the optimal lower-triangular factorization A = B C, certified by a duality gap,
    and write it as an HDF5 artifact."""
    workload_opts = workload_kwargs(
        workload, beta=beta, lr=lr, lr_factor=lr_factor, lr_final=lr_final, lr_last=lr_last, matrix=matrix
    )
    if method not in METHODS:
        raise MfcliError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    w = build_workload(workload, n, **workload_opts)
    if out is None:
        name = w.name
        lr_param = w.params.get("lr")
        if isinstance(lr_param, dict) and "schedule" in lr_param:
            name = f"{name}-{lr_param['schedule']}"
        out = default_artifact_path(name, w.n)
    check_output_path(out, force=force)
    v0 = None
    if warm_start is not None:
        prior = load_artifact(artifact_argument(warm_start))
        v0 = prior.dual_weights
        if v0 is None:
            if prior.n != w.n:
                raise MfcliError("warm start from an artifact without dual weights needs the same n")
            v0 = dual_weights_from_strategy(w.matrix, prior.factorization.strategy)

    title = f"mfcli optimize: {w.name} n={w.n} ({method}, tol {tol:g})"
    with SolverDisplay(quiet=quiet, title=title) as display:
        res = optimal_factorization(w.matrix, tol=tol, max_iter=max_iter, method=method, v0=v0, callback=display)
    fact = res.factorization
    digest = save_artifact(
        out, fact, workload_name=w.name, workload_params=w.params, strategy_name="optimal",
        solver=res.certificate(), command=command_line(), dual_weights=res.dual_weights, force=force,
    )
    if not res.converged and not quiet:
        log(f"warning: stopped after {res.iterations} iterations at gap {res.gap:.3e} > tol {tol:g}")
    if not quiet and not as_json:
        log(f"wrote {out}")
    summary = {
        "workload": w.name,
        "workload_params": dict(w.params),
        "n": w.n,
        "method": method,
        "tol": tol,
        "loss": {"total": fact.loss_total, "mean": fact.loss_mean, "rmse": fact.rmse, "max": fact.loss_max},
        "sensitivity": fact.sensitivity,
        "gap": res.gap,
        "primal": res.primal,
        "dual": res.dual,
        "converged": res.converged,
        "iterations": res.iterations,
        "seconds": res.seconds,
        "artifact": str(out),
        "artifact_sha256": digest,
    }
    if as_json:
        emit_json(envelope("optimize", **summary))
        return
    stdout().print(
        key_value_table(
            f"optimal factorization: {w.name}, n = {w.n}",
            [
                ("loss total (sum of squared errors)", f"{fact.loss_total:.10g}"),
                ("loss mean (per step)", f"{fact.loss_mean:.10g}"),
                ("RMSE", f"{fact.rmse:.10g}"),
                ("max (worst step)", f"{fact.loss_max:.10g}"),
                ("sensitivity", f"{fact.sensitivity:.12g}"),
                ("dual bound", f"{res.dual:.10g}"),
                ("relative gap", f"{res.gap:.3e}"),
                ("iterations", res.iterations),
                ("seconds", round(res.seconds, 2)),
                ("artifact", str(out)),
                ("sha256", digest[:16] + "..."),
            ],
        )
    )
