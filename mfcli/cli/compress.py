"""``mfcli compress``: banded plus low-rank decoder for streaming noise, written as a new artifact."""
from __future__ import annotations

from pathlib import Path

import typer

from mfcli.cli.common import command_line, emit_json, key_value_table, log, refuse_unless, stdout, usage_error
from mfcli.cli.options import (
    ParticipationOptions,
    artifact_argument,
    in_range,
    library_check,
    option_group,
    refuse_structured,
)
from mfcli.cli.rounding import pessimistic
from mfcli.errors import MfcliError
from mfcli.io.artifact import is_shipped_artifact
from mfcli.services.compress import (
    DEFAULT_MAX_ITER,
    Evaluation,
    compress_artifact,
    default_output_path,
    percent,
)

# K <= n and R <= n - K are checked against the artifact's n (exit 1); alone: K >= 1, R >= 0.
BAND_CHECK = in_range(library_check("mfcli.util.validation", "step_count", name="band K"))
RANK_CHECK = in_range(library_check("mfcli.util.validation", "step_count", name="rank R", minimum=0))
MAX_BAND_CHECK = in_range(library_check("mfcli.util.validation", "step_count", name="the largest band K tried"))
MAX_RANK_CHECK = in_range(library_check("mfcli.util.validation", "step_count", name="the largest rank R tried",
                                        minimum=0))
BUDGET_RANGE = in_range(library_check("mfcli.services.compress", "check_max_loss_increase"))
ALS_ITERATIONS_RANGE = in_range(library_check("mfcli.services.compress", "check_als_iterations"))


@option_group(ParticipationOptions, into="participation")
def compress(
    artifact: Path = typer.Argument(
        ..., help="Dense causal artifact to compress (never modified): a file, or a shipped name such as momentum-n256."
    ),
    band: int | None = typer.Option(None, "--band", "-k", callback=BAND_CHECK,
                                    help="K: exact diagonals of B kept (1 <= K <= n)."),
    rank: int | None = typer.Option(None, "--rank", "-r", callback=RANK_CHECK,
                                    help="R: rank of the fitted older part (0 <= R <= n - K)."),
    max_loss_increase: float | None = typer.Option(
        None, "--max-loss-increase", callback=BUDGET_RANGE,
        help="Budget on the relative loss increase (0.01 = 1%), under the artifact's participation schema "
        "(or --epochs/--min-sep). Without K and R: pick the cheapest (K + R) setting within it. With both: "
        "fail unless they meet it.",
    ),
    max_band: int | None = typer.Option(None, "--max-band", callback=MAX_BAND_CHECK,
                                        help="Search without --band: largest K tried (default n)."),
    max_rank: int | None = typer.Option(None, "--max-rank", callback=MAX_RANK_CHECK,
                                        help="Search without --rank: largest R tried (default 64)."),
    max_iter: int = typer.Option(DEFAULT_MAX_ITER, "--max-iter", callback=ALS_ITERATIONS_RANGE,
                                 help="Most ALS iterations (0: the randomized-SVD start only)."),
    *,
    participation: ParticipationOptions,
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help="Output artifact (default <input stem>-k<K>r<R>.h5 beside the input; "
        "in the current directory for a shipped artifact).",
    ),
    force: bool = typer.Option(
        False, "--force",
        help="Overwrite the output; compress a non-causal or already compressed artifact anyway.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object on stdout."),
) -> None:
    """Compress the decoder to B^ = band_K(B) + mask(U V^T) so a trainer can stream the noise in
    O((K + R) d) time and O(R d) state per step, and write a new artifact with group
    `compressed`. Its privacy is set by sens(C^) with C^ = B^-1 A, recomputed and stored."""
    refuse_unless(max_loss_increase is not None or (band is not None and rank is not None),
                  "give both --band and --rank, or --max-loss-increase to choose them")
    refuse_unless(max_band is None or band is None, "--max-band limits the search for K; it does not apply with --band")
    refuse_unless(max_rank is None or rank is None, "--max-rank limits the search for R; it does not apply with --rank")
    artifact = artifact_argument(artifact)
    if out is None and is_shipped_artifact(artifact):
        # The shipped artifacts are package data: never write beside them.
        if band is None or rank is None:
            raise usage_error("compressing a shipped artifact with a search: give --out (its folder is package data)")
        out = default_output_path(Path(artifact.name), band, rank)
    requested = participation.requested()
    from mfcli.io.artifact import load_artifact
    from mfcli.model.participation import SingleParticipation
    from mfcli.services.compare import requested_schema, schema_numbers

    if not artifact.exists():
        raise MfcliError(f"{artifact} does not exist")
    refuse_structured(artifact, "compress")
    source_art = load_artifact(artifact)
    # refused before anything is written: a schema that contradicts the artifact's or does not fit n
    schema = requested_schema(source_art.participation, requested, str(artifact), source_art.n)
    schema.check(source_art.n)

    multi = not isinstance(schema, SingleParticipation)

    def progress(e: Evaluation) -> None:
        if not quiet:
            where = " under the schema" if multi else ""
            log(f"K = {e.band:4d}  R = {e.rank:3d}  cost {e.cost:4d}  loss increase{where} {percent(e.loss_increase)}")

    try:
        result = compress_artifact(
            artifact, band=band, rank=rank, max_loss_increase=max_loss_increase, max_band=max_band,
            max_rank=max_rank, out=out, force=force, command=command_line(), max_iter=max_iter,
            progress=progress if max_loss_increase is not None and (band is None or rank is None) else None,
            participation=schema,
        )
    except MfcliError as exc:
        # The library names its parameters; here they are flags.
        text = str(exc).replace("pass force=True", "use --force").replace("Pass force=True", "Use --force")
        raise type(exc)(text) from None
    comp = result.compression
    under = None
    increase_under = 0.0
    if not isinstance(schema, SingleParticipation):
        dense = source_art.factorization
        under = {"compressed": schema_numbers(comp.factorization.strategy, comp.factorization.decoder, schema),
                 "dense": schema_numbers(dense.strategy, dense.decoder, schema)}
        increase_under = float(under["compressed"]["loss_total"] / under["dense"]["loss_total"] - 1.0)
        under["loss_increase"] = increase_under  # type: ignore[assignment]  # a number beside the two dicts
    if not quiet and not as_json:
        log(f"wrote {result.path}")
    summary = {
        "source": str(artifact),
        "artifact": str(result.path),
        "artifact_sha256": result.sha256,
        "n": comp.n,
        **comp.summary(),
    }
    if result.search is not None:
        summary["max_loss_increase"] = result.search.max_loss_increase
        summary["evaluations"] = [
            {"band": e.band, "rank": e.rank, "cost": e.cost, "loss_increase": e.loss_increase,
             "sensitivity": e.sensitivity}
            for e in result.search.evaluations
        ]
    if under is not None:
        summary["participation"] = under["compressed"]["participation"]
        summary["under_schema"] = under
    if as_json:
        emit_json("compress", summary)
        return
    single = " (single participation)" if under is not None else ""
    rows = [
        ("band K (exact diagonals)", comp.band),
        ("rank R (older noise)", comp.rank),
        ("per-step streaming cost K + R", comp.stream_cost),
        (f"sensitivity, dense sens(C){single} (rounded up)", pessimistic(comp.dense_sensitivity)),
        (f"sensitivity, compressed sens(C^){single} (rounded up)", pessimistic(comp.sensitivity)),
        (f"loss total, dense{single}", comp.dense_loss_total),
        (f"loss total, compressed{single}", comp.loss_total),
        (f"loss increase{single}", percent(comp.loss_increase)),
        (f"RMSE, compressed{single}", comp.factorization.rmse),
        ("||B - B^||_F / ||B||_F", comp.fit_relative_error),
        ("ALS iterations", comp.als_iterations),
    ]
    if under is not None:
        for which in ("dense", "compressed"):
            u = under[which]
            label = "exact" if u["exact"] else "upper bound, rounded up"
            rows.append((f"sensitivity under {schema.describe(comp.n)}, {which} ({label})", pessimistic(u["sensitivity"])))
            rows.append((f"loss total under the schema, {which} ({label})", pessimistic(u["loss_total"])))
        rows.append(("loss increase under the schema", percent(increase_under)))
    if result.search is not None:
        rows.append(("settings evaluated", len(result.search.evaluations)))
    rows += [("artifact", str(result.path)), ("sha256", result.sha256[:16] + "...")]
    stdout().print(key_value_table(f"compressed decoder: {artifact.name}", rows))

