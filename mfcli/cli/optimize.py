"""``mfcli optimize``: solve for the optimal factorization and write it as an artifact."""
from __future__ import annotations

from pathlib import Path

import typer

from mfcli.artifact import check_output_path, default_artifact_path, save_artifact
from mfcli.cli.common import (
    BetaOpt,
    EpochsOpt,
    LrFactorOpt,
    LrFinalOpt,
    LrLastOpt,
    LrOpt,
    MatrixOpt,
    MaxParticipationsOpt,
    MinSepOpt,
    NOpt,
    WorkloadOpt,
    artifact_argument,
    command_line,
    emit_json,
    envelope,
    guarded,
    key_value_table,
    log,
    participation_options,
    refuse_unless,
    stdout,
    workload_kwargs,
)
from mfcli.cli.display import SolverDisplay
from mfcli.cli.structured import STRUCTURED_STRATEGIES, optimize_structured
from mfcli.errors import MfcliError
from mfcli.solver import (
    DEFAULT_METHOD,
    METHODS,
    optimal_factorization,
    warm_start_weights,
)
from mfcli.workloads import build_workload, default_artifact_stem


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
        help=f"Solver: {', '.join(METHODS)} (fixed-point is the plain iteration of Denisov et al. 2022). "
        "All are certified by the same gap.",
    ),
    warm_start: Path | None = typer.Option(
        None, "--warm-start", help="Start from an existing artifact (any n; a file or a shipped name such as prefix-n256)."
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output artifact (default artifacts/<workload>-n<N>.h5)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object on stdout."),
    strategy: str = typer.Option(
        "optimal", "--strategy",
        help="optimal (dense, certified) or banded-toeplitz (no n x n matrix; n up to 10^7; needs --bands).",
    ),
    bands: int | None = typer.Option(None, "--bands", help="banded-toeplitz only: number of bands b."),
    error: str = typer.Option("mean", "--error", help="banded-toeplitz only: minimise the mean or max error."),
    epochs: EpochsOpt = None,
    min_sep: MinSepOpt = None,
    max_participations: MaxParticipationsOpt = None,
) -> None:
    """Solve for the optimal lower-triangular factorization A = B C, certified by a duality gap,
    and write it as an HDF5 artifact; or optimise a structured strategy (--strategy banded-toeplitz)."""
    if strategy != "optimal":
        refuse_unless(strategy in STRUCTURED_STRATEGIES,
                      f"--strategy must be optimal or one of {', '.join(STRUCTURED_STRATEGIES)}, not {strategy}")
        refuse_unless(lr is None or lr == "constant" or workload == "custom",
                      f"--strategy {strategy} needs a Toeplitz workload: --lr {lr} scales A's columns, so A is not Toeplitz")
        refuse_unless(all(v is None for v in (lr_factor, lr_final, lr_last, matrix, warm_start)),
                      f"--strategy {strategy} takes no --lr-*, --matrix or --warm-start")
        refuse_unless(error in ("mean", "max"), f"--error must be mean or max, not {error}")
        optimize_structured(strategy=strategy, workload=workload, n=n, beta=beta, lr=lr, bands=bands, error=error,
                            schema=participation_options(epochs, min_sep, max_participations), out=out, force=force,
                            quiet=quiet, as_json=as_json)
        return
    refuse_unless(bands is None and error == "mean", "--bands and --error apply to --strategy banded-toeplitz only")
    refuse_unless(epochs is None and min_sep is None and max_participations is None,
                  "--epochs/--min-sep apply to --strategy banded-toeplitz here")
    workload_opts = workload_kwargs(
        workload, beta=beta, lr=lr, lr_factor=lr_factor, lr_final=lr_final, lr_last=lr_last, matrix=matrix
    )
    if method not in METHODS:
        raise MfcliError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    w = build_workload(workload, n, **workload_opts)
    if out is None:
        out = default_artifact_path(default_artifact_stem(w), w.n)
    check_output_path(out, force=force)
    v0 = None if warm_start is None else warm_start_weights(artifact_argument(warm_start), w.matrix)

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
