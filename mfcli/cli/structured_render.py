"""CLI code shared by the commands that show a structured artifact (banded Toeplitz, BLT;
:mod:`mfcli.strategies.structured`): ``optimize --strategy banded-toeplitz|blt`` prints the numbers of the
artifact it wrote through :func:`render_structured` (``inspect`` reports every kind through
:func:`mfcli.services.inspect.inspect_artifact`); ``compare`` and ``optimize`` check ``--buffers`` with
:func:`check_buffers`. A shared module, not a command: the command modules import it, never
each other."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mfcli.cli.common import emit_json, key_value_table, stdout
from mfcli.cli.rounding import pessimistic
from mfcli.model.participation import schema_dict

if TYPE_CHECKING:
    from mfcli.io.artifact import StructuredArtifact


def check_buffers(buffers: Any, n: int | None = None) -> int:
    """:func:`mfcli.strategies.blt.check_buffers` (the one buffer-count validator), imported on call so
    parsing loads no numpy."""
    from mfcli.strategies.blt import check_buffers as check

    return check(buffers, n)


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
        emit_json(command, summary)
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


def _record_line(r: dict[str, Any]) -> str:
    from mfcli.services.records import DEEP_HINT, NOT_REDERIVED, VERIFIED

    status = {VERIFIED: "verified (re-derived from the parameters)", NOT_REDERIVED: DEEP_HINT}.get(
        r["status"], "not an mfcli.accounting record")
    eps = ", ".join(f"{k} epsilon {pessimistic(v)}" for k, v in r["epsilon"].items())
    sampler = (f"batch sampler {r['batching']}, sampling rate {r['sampling']!r}" if r["batching"]
               else "deterministic participation (fixed order, no sampler)")
    return f"{eps}; sigma {r['sigma']!r}, delta {r['delta']!r}; {sampler}: {status}"
