"""``mfcli inspect``: what an artifact claims next to what its matrices imply, and its checksums."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from mfcli.cli.common import emit_json, fail, fmt, key_value_table, log, refuse_unless, safe_markup, stdout
from mfcli.cli.options import ParticipationOptions, artifact_argument, option_group
from mfcli.cli.plots import check_plot_target, plot_report
from mfcli.cli.rounding import pessimistic
from mfcli.errors import MfcliError
from mfcli.services.inspect import InspectionReport, NumberCheck, inspect_artifact
from mfcli.services.records import DEEP_HINT, MMCC_REDERIVE_MAX_N, NOT_REDERIVED, UNVERIFIED, VERIFIED

#: Layout version of ``inspect --json`` (mfcli/schemas/inspect.json). 3: one layout for every kind
#: of artifact: a structured artifact's ``workload`` became ``{name, params}`` and its
#: ``parameters`` moved to ``structure.parameters`` (``workload_params``, ``created_by``,
#: ``created_with`` and ``checks`` are gone); every report gained ``not_available``.
INSPECT_JSON_SCHEMA_VERSION = 3

def _precise(v: Any) -> str:
    # Enough digits that a stored value and its recomputation visibly differ when they do.
    if isinstance(v, float):
        return f"{v:.15g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.10e}"
    return fmt(v)


def _numbers_table(title: str, numbers: tuple[NumberCheck, ...]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("quantity", "stored", "recomputed", "check"):
        t.add_column(col, justify="right" if col != "quantity" else "left")
    for c in numbers:
        t.add_row(
            safe_markup(c.name), safe_markup(_precise(c.stored)), safe_markup(_precise(c.recomputed)),
            "ok" if c.ok else "[bold red]MISMATCH[/]",
        )
    return t


def _kv(title: str, rows: list[tuple[str, Any]]) -> Table:
    # Values come from the file; key_value_table shows them literally (no markup, no controls).
    return key_value_table(title, [(k, fmt(v)) for k, v in rows])


def _render_participation(report: InspectionReport) -> None:
    """The declared schema and, for one other than single participation, the sensitivity and
    losses under it, labelled exact or upper bound (an upper bound rounded up)."""
    schema = report.participation
    if schema is None:
        return  # malformed: listed among the problems
    where = "attribute participation" if report.participation_declared else "no participation attribute"
    described = schema.describe(report.n) if report.n is not None else schema.describe()
    rows: list[tuple[str, Any]] = [("schema", f"{described} ({where})")]
    nums = report.participation_numbers
    if nums:
        label = "exact" if nums["exact"] else "upper bound"
        show = _precise if nums["exact"] else pessimistic
        rows.append((f"sensitivity ({label})", show(nums["sensitivity"])))
        if not nums["exact"]:
            rows.append(("sensitivity lower bound (an explicit pair of inputs)", pessimistic(nums["lower"], down=True)))
        rows += [
            ("method", nums["method"]),
            (f"total sq. error sens^2 ||B||_F^2 ({label})", show(nums["loss_total"])),
            (f"mean sq. error ({label})", show(nums["loss_mean"])),
            (f"worst step sq. error ({label})", show(nums["loss_max"])),
        ]
    out = stdout()
    out.print(key_value_table("participation (clip 1, noise multiplier 1)", [(k, fmt(v)) for k, v in rows]))


def _compressed_schema_rows(report: InspectionReport) -> list[tuple[str, Any]]:
    """The compressed operator's sensitivity under a multi-participation schema (recomputed from
    C^; an upper bound rounded up), and whether the file stores it."""
    comp = report.compression
    if "schema_sensitivity" not in comp or report.participation is None:
        return []
    exact = bool(comp["schema_sensitivity_exact"])
    value = _precise(comp["schema_sensitivity"]) if exact else pessimistic(comp["schema_sensitivity"])
    stored = "stored and checked" if comp.get("schema_sensitivity_stored") else "not stored in this file"
    return [(f"sensitivity of C^ under {report.participation.describe(report.n)} "
             f"({'exact' if exact else 'upper bound'}; {stored})", value)]


def _render(report: InspectionReport) -> None:
    out = stdout()
    a = report.attrs
    out.print(_kv(f"artifact {report.path}", [
        ("format", f"{a.get('format')} v{report.format_version}"),
        ("file sha256", report.file_sha256),
        ("created by", report.provenance.get("created_by")),
        ("created (UTC)", report.provenance.get("created_utc")),
        ("command", report.provenance.get("command")),
        ("workload", a.get("workload_name")),
        ("workload params", a.get("workload_params")),
        ("strategy", a.get("strategy_name")),
        ("n x m", f"{report.n} x {report.m}"),
        ("causal (stored / recomputed)", f"{fmt(report.causal_stored)} / {fmt(report.causal_recomputed)}"),
        ("noise operator", a.get("noise_operator")),
    ]))
    if report.numbers:
        out.print(_numbers_table("sensitivity and loss (single participation, clip 1, noise multiplier 1)", report.numbers))
    _render_participation(report)
    if report.structure is not None:
        params = report.structure["parameters"]
        out.print(_kv(f"structured strategy (group structured, kind {report.structure['kind']})", [
            *((f"parameter {k} ({len(v)} values)", ", ".join(_precise(float(x)) for x in v)) for k, v in params.items()),
            *((f"not available: {k}", why) for k, why in report.not_available.items()),
        ]))
        if report.structure_numbers:
            out.print(_numbers_table("under the declared schema (group structured; clip 1, noise multiplier 1)",
                                     report.structure_numbers))
    if report.solver or report.certificate:
        rows: list[tuple[str, Any]] = [(f"stored {k}", v) for k, v in report.solver.items()]
        c = report.certificate
        if "dual_bound" in c:
            rows += [
                ("dual bound from stored weights (recomputed)", c["dual_bound"]),
                ("certified gap (recomputed)", f"{c['certified_gap']:.3e}"),
            ]
        if "error" in c:
            rows.append(("certificate", f"not recomputed: {c['error']}"))
        if "stored_primal_matches_loss" in c:
            rows.append(("stored primal = recomputed loss", c["stored_primal_matches_loss"]))
        out.print(_kv("solver certificate", rows))
    if report.compression:
        comp = report.compression
        out.print(_kv("compression (group compressed)", [
            ("band K / rank R", f"{comp.get('band')} / {comp.get('rank')}"),
            ("per-step streaming cost K + R", comp.get("stream_cost")),
            ("||B - B^||_F / ||B||_F", comp.get("fit_relative_error")),
            ("compressed loss mean / max", f"{fmt(comp.get('loss_mean'))} / {fmt(comp.get('loss_max'))}"),
            ("source", f"{comp.get('source_file')} ({str(comp.get('source_sha256'))[:16]}...)"),
            *_compressed_schema_rows(report),
        ]))
        if report.compression_numbers:
            out.print(_numbers_table("compressed mechanism C^ = B^-1 A", report.compression_numbers))
    if report.accounting:
        t = Table(title="accounting records (accounting/<id>), re-derived from the artifact", title_justify="left")
        t.add_column("id")
        t.add_column("verification")
        t.add_column("noise (re-derived)")
        t.add_column("fields")
        for rec in report.accounting:
            # Scalars in full; nested records (full detail in --json) by their keys only.
            fields = ", ".join(
                f"{k}={{{', '.join(map(str, v))}}}" if isinstance(v, dict)
                else f"{k}={', '.join(map(fmt, v))}" if isinstance(v, list)
                else f"{k}={fmt(v)}"
                for k, v in sorted(rec["attrs"].items())
            )
            t.add_row(safe_markup(rec["id"]), _record_status(rec), _record_noise(rec), safe_markup(fields))
        out.print(t)
    if report.other_groups:
        out.print(safe_markup(f"other groups: {', '.join(report.other_groups)}"))
    t = Table(title="checksums (SHA-256 of every dataset)", title_justify="left")
    t.add_column("dataset")
    t.add_column("check")
    for name, ok in report.checksums:
        t.add_row(safe_markup(name), "ok" if ok else ("[bold red]UNREADABLE[/]" if ok is None else "[bold red]MISMATCH[/]"))
    out.print(t)
    if report.ok and report.not_rederived:
        out.print(f"[bold yellow]all checks passed, but {len(report.not_rederived)} accounting record(s) were not "
                  f"re-derived (MMCC above n = {MMCC_REDERIVE_MAX_N}) and are NOT verified: run mfcli inspect --deep[/]")
    elif report.ok:
        out.print("[bold green]all checks passed[/]")
    else:
        out.print(f"[bold red]{len(report.problems)} check(s) failed[/]")
        for p in report.problems:
            out.print(f"  - {safe_markup(p)}")


def _record_noise(rec: Mapping[str, Any]) -> str:
    """The record's noise multiplier beside its sigma (the noise std on C G) and the sensitivity
    it divides by, as the verifier re-derived them from the operator (docs/accounting.md, "Noise
    convention"); records of 0.1 and 0.2, which store neither, get them too."""
    mult, sens, std = rec.get("noise_multiplier"), rec.get("sensitivity"), rec.get("noise_std")
    if mult is None or sens is None or std is None:
        return "-"
    return (f"noise multiplier {pessimistic(float(mult), down=True)} = sigma {fmt(std)} (noise std on C G) / "
            f"sensitivity {pessimistic(float(sens))}")


def _record_status(rec: Mapping[str, Any]) -> str:
    """A record's verification in the table: verified, not re-derived (with the --deep hint),
    UNVERIFIED (its problems are listed below the tables), or not an mfcli record."""
    status = rec.get("status")
    if status == VERIFIED:
        return "[green]verified (re-derived)[/]"
    if status == NOT_REDERIVED:
        return f"[yellow]{DEEP_HINT}[/]"
    if status == UNVERIFIED:
        return "[bold red]UNVERIFIED[/]"
    return "not an mfcli.accounting record"


def _under_requested(artifact: Path, report: InspectionReport, requested: Any) -> dict[str, Any]:
    """Sensitivity and losses of the artifact's operator that runs (and the dense one when that is
    the compressed one) under the requested schema; the contradiction with a declared schema, or a
    schema that does not fit n, is refused before anything is printed or written."""
    from mfcli.io.artifact import load_artifact
    from mfcli.services.compare import requested_schema, schema_numbers
    from mfcli.strategies.operators import select_operator

    if report.participation is None:
        raise MfcliError(f"{artifact}: its participation attribute is malformed; no schema can be evaluated")
    schema = requested_schema(report.participation, requested, str(artifact))
    art = load_artifact(artifact)
    schema.check(art.n)
    out: dict[str, Any] = {"dense": schema_numbers(art.factorization.strategy, art.factorization.decoder, schema)}
    chosen = select_operator(art, "auto")
    if chosen.label != "dense":
        f = chosen.factorization
        out[chosen.label] = schema_numbers(f.strategy, f.decoder, schema)
    return out


def _render_under(under: dict[str, Any]) -> None:
    rows: list[tuple[str, Any]] = []
    for label, nums in under.items():
        kind = "exact" if nums["exact"] else "upper bound, rounded up"
        rows += [
            (f"{label}: sensitivity ({kind})", pessimistic(nums["sensitivity"])),
            (f"{label}: total sq. error sens^2 ||B||_F^2 ({kind})", pessimistic(nums["loss_total"])),
            (f"{label}: mean sq. error ({kind})", pessimistic(nums["loss_mean"])),
        ]
    desc = next(iter(under.values()))["participation"]["description"]
    stdout().print(key_value_table(f"under the requested schema: {safe_markup(desc)} (clip 1, noise multiplier 1)",
                                   [(k, fmt(v)) for k, v in rows]))


@option_group(ParticipationOptions, into="participation")
def inspect(
    artifact: Path = typer.Argument(..., help="The artifact to inspect: a file, or a shipped name such as prefix-n256."),
    plot: Path | None = typer.Option(
        None, "--plot", help="Write heatmaps of C and B (log scale) and the per-step error to FILE.png."
    ),
    certificate: bool = typer.Option(
        True, "--certificate/--no-certificate",
        help="Recompute the dual bound from the stored dual weights (one eigendecomposition).",
    ),
    force: bool = typer.Option(False, "--force", help="With --plot: overwrite an existing plot file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON report object on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Nothing on stderr but errors (the --plot 'wrote' line)."),
    deep: bool = typer.Option(
        False, "--deep",
        help="Re-derive the MMCC rows of accounting records at every n (one MMCC run each: tens of seconds at "
             "n = 256, growing with n). Without it, MMCC rows above n = 256 are shown as not re-derived (not "
             "verified).",
    ),
    *,
    participation: ParticipationOptions,
) -> None:
    """Show an artifact's format, provenance, workload and strategy, and every stored number next
    to its recomputation from the matrices, or from a structured artifact's parameters (sensitivity,
    losses, solver certificate, compression), accounting records (each re-derived from the
    artifact; --deep for MMCC rows above n = 256) and checksums. Exits 1 if any check fails. With
    --epochs or --min-sep: also the sensitivity and losses of the operator that runs under that
    schema (refused when the artifact declares another multi-participation schema, or has no
    matrices)."""
    refuse_unless(not force or plot is not None, "--force overwrites the --plot file; it does not apply without --plot")
    artifact = artifact_argument(artifact)
    if plot is not None:
        # the name (.png), what the path is (not a directory) and whether it exists, before any work
        check_plot_target(plot, force=force)
    requested = participation.requested()
    report = inspect_artifact(artifact, certificate=certificate, deep=deep)
    # what this kind of artifact lacks is said by the report, for every kind, before anything is written
    for option, given in (("--plot", plot is not None), ("--epochs/--min-sep", requested is not None)):
        refuse_unless(not given or "matrices" not in report.not_available,
                      f"{option} needs the artifact's matrices; {report.not_available.get('matrices')}")
    under = _under_requested(artifact, report, requested) if requested is not None else None
    written = None
    if plot is not None:
        written = plot_report(report, plot, force=force)
    if as_json:
        payload = report.to_dict()
        if written is not None:
            payload["plot"] = str(written)
        if under is not None:
            payload["under_requested_schema"] = under
        emit_json("inspect", payload, schema_version=INSPECT_JSON_SCHEMA_VERSION)
    else:
        _render(report)
        if under is not None:
            _render_under(under)
        if written is not None and not quiet:
            log(f"wrote {written}")
    if not report.ok:
        raise fail(f"{artifact}: {len(report.problems)} check(s) failed: {report.problems[0]}")
    if report.not_rederived and not quiet:
        log(f"accounting record(s) {', '.join(report.not_rederived)}: {DEEP_HINT} (MMCC above n = "
            f"{MMCC_REDERIVE_MAX_N}); they are not verified")
