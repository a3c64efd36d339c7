"""CLI side of structured strategies: ``mfcli optimize --strategy banded-toeplitz`` and the rendering
of a structured artifact's numbers (the library is mfcli.toeplitz and mfcli.structured)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mfcli.artifact import check_output_path
from mfcli.cli.common import command_line, emit_json, envelope, key_value_table, log, stdout, with_schema_suffix
from mfcli.cli.rounding import pessimistic
from mfcli.participation import Participation, SingleParticipation, schema_dict
from mfcli.structured import StructuredArtifact, load_structured_artifact, save_structured_artifact
from mfcli.toeplitz import DENSE_MAX_N, check_bands, check_n, optimize_banded_toeplitz, toeplitz_workload

#: ``--strategy`` values of ``mfcli optimize`` (``optimal``: the dense certified solver).
STRUCTURED_STRATEGIES = ("banded-toeplitz", "blt")


def default_path(workload: str, kind: str, size: int, n: int) -> Path:
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
    from mfcli.cli.common import refuse_unless

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
        out = with_schema_suffix(default_path(workload, strategy, size, n), schema, n)
    check_output_path(out, force=force)
    if not quiet and not as_json:
        shape = f"{size}-buffer BLT" if strategy == "blt" else f"{size}-band Toeplitz"
        log(f"optimising a {shape} strategy for the {w.describe()}, n = {n}, {error} error, {schema.describe(n)}")
    start = time.perf_counter()
    if strategy == "blt":
        from mfcli.blt import optimize_blt

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


def check_buffers(buffers: Any, n: int | None = None) -> int:
    """A number of BLT buffers: 1 <= buffers <= MAX_BUFFERS and (given n) buffers < n."""
    from mfcli.blt import MAX_BUFFERS
    from mfcli.errors import MfcliError
    from mfcli.validation import step_count

    k = step_count(buffers, name="buffers")
    if k > MAX_BUFFERS:
        raise MfcliError(f"buffers must be at most {MAX_BUFFERS}, got {k}")
    if n is not None and k >= n:
        raise MfcliError(f"buffers = {k} must be below the number of steps n = {n}")
    return k


def structured_summary(art: StructuredArtifact) -> dict[str, Any]:
    """The recomputed numbers of a structured artifact, JSON-ready."""
    sens = art.schema_sensitivity
    return {
        "kind": art.kind,
        "workload": art.workload.name,
        "workload_params": dict(art.attrs.get("workload_params") or {}),
        "n": art.n,
        "parameters": {k: v.tolist() for k, v in art.strategy.parameters().items()},
        "participation": schema_dict(art.participation, art.n),
        "sensitivity": sens.value,
        "sensitivity_exact": sens.exact,
        "sensitivity_method": sens.method,
        "sensitivity_single": art.sensitivity.value,
        "loss": {"total": art.schema_loss.total, "mean": art.schema_loss.mean, "max": art.schema_loss.max},
    }


def render_structured(art: StructuredArtifact, *, title: str, as_json: bool, command: str,
                      extra: dict[str, Any] | None = None) -> None:
    summary = structured_summary(art) | dict(extra or {})
    if as_json:
        emit_json(envelope(command, **summary))
        return
    sens = art.schema_sensitivity
    bound = "" if sens.exact else " (upper bound)"
    rows: list[tuple[str, Any]] = [
        ("strategy", f"{art.kind}, {', '.join(f'{k} {v.size}' for k, v in art.strategy.parameters().items())}"),
        ("workload", art.workload.describe()),
        ("participation", art.participation.describe(art.n)),
        ("sensitivity" + bound, pessimistic(sens.value, digits=10)),  # printed numbers rounded up
        ("loss total" + bound, pessimistic(art.schema_loss.total, digits=10)),
        ("loss mean (per step)" + bound, pessimistic(art.schema_loss.mean, digits=10)),
        ("max (worst step)" + bound, pessimistic(art.schema_loss.max, digits=10)),
    ]
    rows += [(k, v) for k, v in (extra or {}).items() if k not in ("artifact_sha256", "accounting_records")]
    rows += [(f"accounting/{r['id']}", _record_line(r)) for r in (extra or {}).get("accounting_records", [])]
    stdout().print(key_value_table(title, rows))


def inspect_structured(path: Path, *, as_json: bool, deep: bool = False) -> None:
    """``mfcli inspect`` of a structured artifact: the loader checks every checksum and stored
    number against its recomputation from the parameters and refuses in one line otherwise; every
    accounting record is re-derived from the parameters by the one verifier of every kind
    (:func:`mfcli.accounting.records.verify_record`; ``deep``: MMCC rows at every n) and a record
    that does not verify fails the inspection in one line."""
    from mfcli.accounting.records import NOT_REDERIVED, UNVERIFIED, read_records, structured_subject, verify_records
    from mfcli.artifact import file_sha256
    from mfcli.errors import ArtifactError

    art = load_structured_artifact(path)
    stored = read_records(path)
    checks = verify_records(stored.items(), structured_subject(art), deep=deep) if stored else []
    for rid, check in checks:
        if check.status == UNVERIFIED:  # a record that does not verify fails the inspection, in one line
            raise ArtifactError(f"{path}: accounting record {rid!r}: {check.problems[0]}")
    shallow = [rid for rid, check in checks if check.status == NOT_REDERIVED]
    note = ""
    if checks:
        note = f"; {len(checks) - len(shallow)} accounting record(s) re-derived from the parameters"
    if shallow:
        from mfcli.accounting.records import DEEP_HINT, MMCC_REDERIVE_MAX_N

        note += (f"; {len(shallow)} {DEEP_HINT}, NOT verified (MMCC above n = {MMCC_REDERIVE_MAX_N}): "
                 f"{', '.join(shallow)}")
    extra: dict[str, Any] = {
        "file_sha256": file_sha256(path), "created_by": art.attrs.get("created_by"),
        "created_with": art.attrs.get("command"),
        "checks": "checksums and stored numbers match their recomputation" + note}
    if checks:
        extra["accounting_records"] = [_record_summary(rid, check) for rid, check in checks]
    render_structured(art, title=f"structured artifact {path}", as_json=as_json, command="inspect", extra=extra)
    if shallow:
        log(f"accounting record(s) {', '.join(shallow)}: not re-derived (MMCC above n = 256); run mfcli inspect "
            "--deep to verify them")


def _record_line(r: dict[str, Any]) -> str:
    from mfcli.accounting.records import DEEP_HINT, NOT_REDERIVED, VERIFIED

    status = {VERIFIED: "verified (re-derived from the parameters)", NOT_REDERIVED: DEEP_HINT}.get(
        r["status"], "not an mfcli.accounting record")
    eps = ", ".join(f"{k} epsilon {pessimistic(v)}" for k, v in r["epsilon"].items())
    sampler = (f"batch sampler {r['batching']}, sampling rate {r['sampling']!r}" if r["batching"]
               else "deterministic participation (fixed order, no sampler)")
    return f"{eps}; sigma {r['sigma']!r}, delta {r['delta']!r}; {sampler}: {status}"


def _record_summary(rid: str, check: Any) -> dict[str, Any]:
    """What a trainer re-accounting or building a sampler needs from a record: its settings and
    their epsilons, sigma, delta, the batch sampler and sampling rate (null: deterministic
    participation), and the verification (``verified``, ``status``). Numbers come from the
    strictly read claim (:class:`mfcli.accounting.records.RecordClaim`), never converted from text."""
    c = check.claim
    base = {"id": rid, "verified": check.verified, "status": check.status}
    if c is None:
        return {**base, "settings": [], "sigma": None, "delta": None, "batching": None, "sampling": None,
                "epsilon": {}}
    return {**base, "settings": list(c.settings), "sigma": c.sigma, "delta": c.delta, "batching": c.batching,
            "sampling": c.sampling, "epsilon": dict(c.epsilons)}


def compare_structured(workload: str, n: int, *, beta: float | None, lr: str | None, bands: tuple[int, ...],
                       schema: Participation, fmt: str, out: Path | None, force: bool, quiet: bool,
                       buffers: tuple[int, ...] = (), privacy: Any = None) -> None:
    """``mfcli compare`` above the dense limit: identity, tree (single participation), banded
    Toeplitz and BLT rows, O(n b) each; at equal privacy with ``privacy``."""
    from mfcli.cli.common import refuse_unless
    from mfcli.cli.compare import FORMATS, emit_table
    from mfcli.errors import MfcliError
    from mfcli.structured import structured_comparison

    refuse_unless(beta is None or workload == "momentum", f"--beta applies to --workload momentum only, not {workload}")
    if fmt not in FORMATS:
        raise MfcliError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
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
        single = isinstance(schema, SingleParticipation)
        parts = ["identity", "tree (closed form)"] if single else ["identity"]
        parts += [f"banded Toeplitz ({', '.join(map(str, bands))} bands)"] if bands else []
        parts += [f"BLT ({', '.join(map(str, buffers))} buffers)"] if buffers else []
        log(f"building {', '.join(parts)} for n = {n}"
            + ("" if single else f" (the tree row is built for single participation only above n = {DENSE_MAX_N})"))
    table = structured_comparison(w, n, bands=bands, participation=schema, buffers=buffers, privacy=privacy)
    emit_table(table, fmt, curves=False, saved=None, table_out=out, force=force, progress=None if quiet else log)


__all__ = [
    "STRUCTURED_STRATEGIES",
    "check_buffers",
    "compare_structured",
    "inspect_structured",
    "optimize_structured",
    "render_structured",
    "structured_summary",
]
