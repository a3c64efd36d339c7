"""``mfcli optimize``: solve for the optimal factorization and write it as an artifact."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from mfcli.cli.common import (
    command_line,
    emit_json,
    key_value_table,
    log,
    refuse_unless,
    solver_stop,
    stdout,
    with_schema_suffix,
)
from mfcli.cli.display import SolverDisplay
from mfcli.cli.options import (
    BANDS_RANGE,
    BUFFERS_RANGE,
    ProblemOptions,
    artifact_argument,
    option_group,
    refuse_structured,
)
from mfcli.io.artifact import (
    check_output_path,
    default_artifact_path,
    load_artifact,
    refuse_input_as_output,
    save_artifact,
)
from mfcli.model.participation import Participation, SingleParticipation, schema_dict
from mfcli.model.workloads import Workload, build_workload, default_artifact_stem, learning_rate_file
from mfcli.optimize.dense import (
    DEFAULT_MAX_ITER,
    DEFAULT_METHOD,
    DEFAULT_TOL,
    METHODS,
    optimal_factorization,
    warm_start_weights,
)
from mfcli.optimize.multi_solver import multi_participation_factorization


@option_group(ProblemOptions, into="problem")
def optimize(
    *,
    problem: ProblemOptions,
    tol: float | None = typer.Option(
        None, "--tol", show_default=False,
        help=f"Stop at this relative duality gap (default {DEFAULT_TOL:g}). Dense optimal strategy only: "
        "banded-toeplitz and blt have no duality gap.",
    ),
    max_iter: int | None = typer.Option(
        None, "--max-iter", show_default=False,
        help=f"Maximum solver iterations (default {DEFAULT_MAX_ITER}): eigendecompositions for single "
        "participation; with --epochs, Newton steps of the dual solver (then L-BFGS iterations if it falls "
        "back); with --min-sep, L-BFGS iterations; with --strategy banded-toeplitz or blt, L-BFGS-B "
        "iterations (per start for blt).",
    ),
    method: str | None = typer.Option(
        None, "--method", show_default=False,
        help=f"Solver: {', '.join(METHODS)} (default {DEFAULT_METHOD}; fixed-point is the plain iteration of "
        "Denisov et al. 2022). All are certified by the same gap. Dense single participation only.",
    ),
    warm_start: Path | None = typer.Option(
        None, "--warm-start", help="Start from an existing artifact (any n; a file or a shipped name such as prefix-n256)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help="Output artifact (default artifacts/<workload>-n<N>.h5, <workload>-<schedule>-n<N>.h5 for --lr step-decay "
        "or cooldown, <workload>-lr-<file stem>-n<N>.h5 for --lr FILE, or <workload>-<strategy>-<bands|buffers>-n<N>.h5 "
        "for a structured strategy; with -epochs<K> or -minsep<B>-k<K> for a schema).",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object on stdout."),
    strategy: str = typer.Option(
        "optimal", "--strategy",
        help="optimal (dense, certified), banded-toeplitz (needs --bands) or blt (needs --buffers); the last two "
        "build no n x n matrix (n up to 10^7).",
    ),
    bands: int | None = typer.Option(None, "--bands", callback=BANDS_RANGE, help="banded-toeplitz only: number of bands b."),
    buffers: int | None = typer.Option(None, "--buffers", callback=BUFFERS_RANGE, help="blt only: number of buffers (1 to 32)."),
    error: str = typer.Option("mean", "--error", help="banded-toeplitz and blt only: minimise the mean or max error."),
) -> None:
    """Solve for the optimal lower-triangular factorization A = B C, certified by a duality gap,
    and write it as an HDF5 artifact. With --epochs K: the optimal factorization orthogonal across
    the K epochs (sensitivity 1); with --min-sep B: the optimal B-banded one with equal column
    norms (BandMF, sensitivity sqrt(K)). Or optimise a structured strategy (--strategy
    banded-toeplitz or blt) that never builds an n x n matrix."""
    workload, n, beta, lr = problem.workload, problem.n, problem.beta, problem.lr
    lr_factor, lr_final, lr_last, matrix = (problem.lr_factor, problem.lr_final,
                                            problem.lr_last, problem.matrix)
    if strategy != "optimal":
        refuse_unless(strategy in STRUCTURED_STRATEGIES,
                      f"--strategy must be optimal or one of {', '.join(STRUCTURED_STRATEGIES)}, not {strategy}")
        refuse_unless(lr is None or lr == "constant" or workload == "custom",
                      f"--strategy {strategy} needs a Toeplitz workload: --lr {lr} scales A's columns, so A is not Toeplitz")
        refuse_unless(all(v is None for v in (lr_factor, lr_final, lr_last, matrix, warm_start)),
                      f"--strategy {strategy} takes no --lr-*, --matrix or --warm-start")
        refuse_unless(error in ("mean", "max"), f"--error must be mean or max, not {error}")
        # the structured optimisers are L-BFGS-B searches with no duality gap and no choice of method:
        # an option they cannot honour is refused rather than silently dropped
        refuse_unless(method is None, f"--method applies to the dense optimal strategy only, not --strategy {strategy}")
        refuse_unless(tol is None, f"--tol is a duality-gap target and --strategy {strategy} has no duality gap "
                      "(its loss is recomputed exactly); bound its work with --max-iter")
        optimize_structured(strategy=strategy, workload=workload, n=n, beta=beta, lr=lr, bands=bands, error=error,
                            schema=problem.schema(), out=out, force=force,
                            quiet=quiet, as_json=as_json, buffers=buffers, max_iter=max_iter)
        return
    method_given = method is not None
    method = DEFAULT_METHOD if method is None else method
    refuse_unless(bands is None and buffers is None and error == "mean",
                  "--bands, --buffers and --error apply to --strategy banded-toeplitz or blt only")
    schema = problem.schema()
    workload_opts = problem.build_kwargs()
    refuse_unless(method in METHODS, f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    tol, max_iter = solver_stop(tol, max_iter)
    w = build_workload(workload, n, **workload_opts)
    schema.check(w.n)
    # One participation at most (--epochs 1, --min-sep n, --max-participations 1): the problem is
    # the single-participation one, solved by its own (faster) solver; the schema is still recorded.
    multi = schema.participations(w.n) > 1
    if multi:
        refuse_unless(warm_start is None, "--warm-start applies to single participation only")
        refuse_unless(not method_given, "--method applies to single participation only")
    if out is None:
        out = with_schema_suffix(default_artifact_path(default_artifact_stem(w), w.n), schema, w.n)
    if warm_start is not None:
        warm_start = artifact_argument(warm_start)
    # the files read (even --force must not replace one with the result, as compress refuses its input)
    inputs = [(path, noun) for path, noun in ((warm_start, "artifact"), (matrix, "file"), (learning_rate_file(lr), "file"))
              if path is not None]
    refuse_input_as_output(out, inputs, what="optimization")
    check_output_path(out, force=force)
    if warm_start is not None:
        refuse_structured(warm_start, "--warm-start")
    v0 = None if warm_start is None else warm_start_weights(load_artifact(warm_start), w.matrix)

    if multi:
        _optimize_multi(w, schema, out=out, tol=tol, max_iter=max_iter, force=force, quiet=quiet, as_json=as_json)
        return
    title = f"mfcli optimize: {w.name} n={w.n} ({method}, tol {tol:g})"
    with SolverDisplay(quiet=quiet, title=title) as display:
        res = optimal_factorization(w.matrix, tol=tol, max_iter=max_iter, method=method, v0=v0, callback=display)
    fact = res.factorization
    digest = save_artifact(
        out, fact, workload_name=w.name, workload_params=w.params, strategy_name="optimal",
        solver=res.certificate(), command=command_line(), dual_weights=res.dual_weights, force=force,
        participation=None if isinstance(schema, SingleParticipation) else schema,
    )
    if not res.converged and not quiet:
        log(f"warning: stopped after {res.iterations} iterations at gap {res.gap:.3e} > tol {tol:g}")
    if not quiet and not as_json:
        log(f"wrote {out}")
    loss = {"total": fact.loss_total, "mean": fact.loss_mean, "rmse": fact.rmse, "max": fact.loss_max}
    _render(w, res, method=method, tol=tol, schema=schema, loss=loss, sensitivity=fact.sensitivity, out=out,
            digest=digest, as_json=as_json, title=f"optimal factorization: {w.name}, n = {w.n}, {schema.describe(w.n)}",
            rows=[("loss total (sum of squared errors)", f"{fact.loss_total:.10g}")],
            sensitivity_label="sensitivity (exact, this schema)")


def _render(w: Workload, res: Any, *, method: str, tol: float, schema: Participation, loss: dict[str, float],
            sensitivity: float, out: Path, digest: str, as_json: bool, title: str,
            rows: list[tuple[str, Any]], sensitivity_label: str, extra: dict[str, Any] | None = None) -> None:
    """The result of a certified solve on stdout: the versioned ``--json`` object or a table.
    ``res`` is a single- or multi-participation solve result (gap, primal, dual, converged,
    iterations, seconds); ``rows`` are the table's first, solver-specific rows."""
    summary = {
        "workload": w.name,
        "workload_params": dict(w.params),
        "n": w.n,
        "method": method,
        "tol": tol,
        "participation": schema_dict(schema, w.n),
        **(extra or {}),
        "loss": loss,
        "sensitivity": sensitivity,
        # Both solvers return an exact sensitivity or refuse (single participation: the largest
        # column norm; a schema: mfcli.optimize.multi_solver._result raises unless Sensitivity.exact).
        "sensitivity_exact": True,
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
        emit_json("optimize", summary)
        return
    stdout().print(
        key_value_table(
            title,
            [
                *rows,
                ("loss mean (per step)", f"{loss['mean']:.10g}"),
                ("RMSE", f"{loss['rmse']:.10g}"),
                ("max (worst step)", f"{loss['max']:.10g}"),
                (sensitivity_label, f"{sensitivity:.12g}"),
                ("dual bound", f"{res.dual:.10g}"),
                ("relative gap", f"{res.gap:.3e}"),
                ("iterations", res.iterations),
                ("seconds", round(res.seconds, 2)),
                ("artifact", str(out)),
                ("sha256", digest[:16] + "..."),
            ],
        )
    )


def _optimize_multi(
    w: Workload, schema: Participation, *, out: Path, tol: float, max_iter: int, force: bool, quiet: bool,
    as_json: bool,
) -> None:
    """The certified optimum for a fixed-epoch or min-separation schema (mfcli.optimize.multi_solver)."""
    described = schema.describe(w.n)
    title = f"mfcli optimize: {w.name} n={w.n} ({described}, tol {tol:g})"
    with SolverDisplay(quiet=quiet, title=title) as display:
        res = multi_participation_factorization(w.matrix, schema, tol=tol, max_iter=max_iter, callback=display)
    fact = res.factorization
    name = "optimal-fixed-epoch" if res.structure == "fixed-epoch" else "bandmf"
    digest = save_artifact(
        out, fact, workload_name=w.name, workload_params=w.params, strategy_name=name,
        solver=res.certificate(), command=command_line(), participation=schema, force=force,
    )
    if not res.converged and not quiet:
        log(f"warning: stopped after {res.iterations} iterations at gap {res.gap:.3e} > tol {tol:g}")
    if not quiet and not as_json:
        log(f"wrote {out}")
    worst = float(res.per_step_error.max())
    loss = {"total": res.loss_total, "mean": res.loss_mean, "rmse": res.loss_mean**0.5, "max": worst}
    structure = ("orthogonal across epochs" if res.structure == "fixed-epoch" else
                 f"{schema.separation}-banded, equal column norms (BandMF)")  # type: ignore[union-attr]
    _render(w, res, method=res.certificate()["method"], tol=tol, schema=schema, loss=loss,
            sensitivity=res.sensitivity, out=out, digest=digest, as_json=as_json,
            title=f"optimal factorization: {w.name}, n = {w.n}, {described}",
            rows=[("structure", structure), ("loss total (sens^2 ||B||_F^2)", f"{res.loss_total:.10g}")],
            sensitivity_label="sensitivity (exact, this schema)", extra={"structure": res.structure})


#: ``--strategy`` values of ``mfcli optimize`` besides ``optimal`` (the dense certified solver).
STRUCTURED_STRATEGIES = ("banded-toeplitz", "blt")


def structured_path(workload: str, kind: str, size: int, n: int) -> Path:
    """The default artifact path of a structured strategy."""
    return Path("artifacts") / f"{workload}-{kind}-{size}-n{n}.h5"


def optimize_structured(
    *,
    strategy: str,
    workload: str,
    n: int | None,
    beta: float | None,
    lr: str | None,
    bands: int | None,
    error: str,
    schema: Participation,
    out: Path | None,
    force: bool,
    quiet: bool,
    as_json: bool,
    buffers: int | None = None,
    max_iter: int | None = None,
) -> None:
    """Optimise a structured strategy, write its artifact, print the recomputed numbers.
    ``max_iter`` bounds the L-BFGS-B iterations (per start for blt); None keeps the optimiser's default."""
    from mfcli.cli.structured_render import render_structured
    from mfcli.io.artifact import check_output_path, load_structured_artifact, save_structured_artifact
    from mfcli.strategies.blt import check_buffers
    from mfcli.strategies.toeplitz import check_bands, check_n, optimize_banded_toeplitz, toeplitz_workload

    refuse_unless(n is not None, f"--strategy {strategy} needs --n")
    if strategy == "blt":
        refuse_unless(buffers is not None, "--strategy blt needs --buffers")
        refuse_unless(bands is None, "--bands applies to --strategy banded-toeplitz, not blt (give --buffers)")
    else:
        refuse_unless(bands is not None, f"--strategy {strategy} needs --bands")
        refuse_unless(buffers is None, f"--buffers applies to --strategy blt, not {strategy} (give --bands)")
    assert n is not None
    refuse_unless(max_iter is None or max_iter >= 1, f"--max-iter must be at least 1, got {max_iter}")
    refuse_unless(beta is None or workload == "momentum", f"--beta applies to --workload momentum only, not {workload}")
    w = toeplitz_workload(workload, beta=0.9 if beta is None else beta, lr=lr or "constant")
    n = check_n(n)
    if strategy == "blt":
        size, what = check_buffers(buffers, n), "buffers"
    else:
        size, what = check_bands(bands, n), "bands"
    schema.check(n)
    if out is None:
        out = with_schema_suffix(structured_path(workload, strategy, size, n), schema, n)
    check_output_path(out, force=force)
    if not quiet and not as_json:
        shape = f"{size}-buffer BLT" if strategy == "blt" else f"{size}-band Toeplitz"
        log(f"optimising a {shape} strategy for the {w.describe()}, n = {n}, {error} error, {schema.describe(n)}")
    start = time.perf_counter()
    if strategy == "blt":
        from mfcli.strategies.blt import optimize_blt

        opt = optimize_blt(n=n, buffers=size, workload=w.name, beta=w.beta if w.name == "momentum" else None,
                           error=error, schema=schema, **({} if max_iter is None else {"max_iter": max_iter}))
        strat: Any = opt.blt
        stats: dict[str, Any] = {"starts": len(opt.start_losses)}
    else:
        cap: dict[str, Any] = {} if max_iter is None else {"max_iterations": max_iter}
        res = optimize_banded_toeplitz(n, size, workload=w, schema=schema, error=error, **cap)
        strat = res.strategy
        stats = {"iterations": res.iterations, "converged": res.converged}
    seconds = time.perf_counter() - start
    participation = None if isinstance(schema, SingleParticipation) else schema
    digest = save_structured_artifact(
        out, strat, workload=w, n=n, participation=participation, command=command_line(), force=force,
        solver={"method": "L-BFGS-B", "error": error, **stats, "seconds": seconds},
    )
    art = load_structured_artifact(out)  # the numbers printed are the ones a reader recomputes
    if not quiet and not as_json:
        log(f"wrote {out}")
    render_structured(art, title=f"{strategy}: {w.name}, n = {n}, {size} {what}", as_json=as_json, command="optimize",
                      extra={**stats, "seconds": round(seconds, 3), "artifact": str(out), "artifact_sha256": digest})
