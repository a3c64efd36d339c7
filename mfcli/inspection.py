"""Inspect an artifact: every stored number next to its recomputation, and every checksum.

:func:`mfcli.artifact.load_artifact` stops at the first problem; :func:`inspect_artifact` keeps
going and reports them all, so a user (or ``mfcli inspect``) sees what a file claims, what its
matrices actually imply, and exactly which parts disagree:

* format version and provenance (who made it, when, with which command);
* workload and strategy, n, causality (stored flag and lower-triangularity of the matrices);
* sensitivity sens(C) = max_j ||C[:, j]||_2 and the losses sens(C)^2 ||B||_F^2 (total, mean,
  worst step), stored next to recomputed; A = B C;
* the solver certificate: the stored duality gap, and a lower bound on the optimal loss
  recomputed from the stored dual weights (one eigendecomposition), giving a certified gap that
  does not trust the stored one;
* the ``compressed`` group: B^ rebuilt from ``band``, ``u``, ``v``, sens(C^) with C^ = B^-1 A and
  the compressed loss recomputed next to the stored values;
* accounting records (groups ``accounting/<id>``, written by ``mfcli account --write``);
* the SHA-256 of every dataset (:func:`mfcli.artifact.check_datasets`).

Formal guarantees: every "recomputed" value is derived from the matrices in the file, never
from another stored attribute. A report is ``ok`` only if every checksum matches and every stored
number matches its recomputation (relative tolerance 1e-9).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import numpy as np

from mfcli.artifact import (
    FORMAT,
    FORMAT_VERSION,
    check_datasets,
    dataset_sha256,
    file_sha256,
    open_artifact_file,
)
from mfcli.errors import ArtifactError, MfcliError
from mfcli.factorization import RECONSTRUCTION_RTOL, Factorization, is_lower_triangular

#: Relative tolerance for stored numbers against their recomputation (as load_artifact).
RTOL = 1e-9


class NumberCheck(NamedTuple):
    """A stored number next to the value recomputed from the matrices."""

    name: str
    stored: Any
    recomputed: Any
    ok: bool


def _close(stored: Any, recomputed: float, *, rtol: float = RTOL, atol: float = 0.0) -> bool:
    if isinstance(stored, bool) or not isinstance(stored, (int, float)):
        return False
    return bool(np.isclose(float(stored), recomputed, rtol=rtol, atol=atol))


def _decode(value: Any) -> Any:
    """HDF5 attribute to a Python value: bytes to str, JSON objects/lists parsed, numpy scalars."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        if value == "null":
            return None
        if value[:1] in "{[":
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


@dataclass(frozen=True, eq=False)
class InspectionReport:
    """Everything ``mfcli inspect`` shows about one artifact.

    Attributes:
        path, file_sha256: the file and the SHA-256 of its bytes.
        format_version: stored ``format_version``.
        attrs: root attributes, decoded.
        provenance: created_by, created_utc, command.
        n, m: from the matrices (None if they cannot be read).
        causal_stored, causal_recomputed: the stored flag; lower-triangularity of square B and C.
        numbers: stored versus recomputed sensitivity and losses, and A = B C.
        solver: the stored solver record (empty if none).
        certificate: the recomputed lower bound and certified gap (empty if not computed).
        compression: summary of the ``compressed`` group (empty if none).
        compression_numbers: its stored versus recomputed numbers.
        accounting: one dict per ``accounting/<id>`` group: id, attrs, datasets.
        checksums: (dataset, OK) for every dataset; OK is None if it cannot be read.
        problems: one line per failed check.
        factorization, compressed: the matrices (for plots); not part of :meth:`to_dict`.
    """

    path: Path
    file_sha256: str
    format_version: Any
    attrs: Mapping[str, Any]
    provenance: Mapping[str, Any]
    n: int | None
    m: int | None
    causal_stored: Any
    causal_recomputed: bool | None
    numbers: tuple[NumberCheck, ...]
    solver: Mapping[str, Any]
    certificate: Mapping[str, Any]
    compression: Mapping[str, Any]
    compression_numbers: tuple[NumberCheck, ...]
    accounting: tuple[Mapping[str, Any], ...]
    other_groups: tuple[str, ...]
    checksums: tuple[tuple[str, bool | None], ...]
    problems: tuple[str, ...]
    factorization: Factorization | None = field(default=None, repr=False)
    compressed: Any = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """True when every checksum and every stored number checks out."""
        return not self.problems

    def to_dict(self) -> dict:
        """JSON-ready report (the matrices are left out)."""

        def nums(items: tuple[NumberCheck, ...]) -> dict:
            return {c.name: {"stored": c.stored, "recomputed": c.recomputed, "ok": c.ok} for c in items}

        return {
            "path": str(self.path),
            "file_sha256": self.file_sha256,
            "ok": self.ok,
            "problems": list(self.problems),
            "format": self.attrs.get("format"),
            "format_version": self.format_version,
            "provenance": dict(self.provenance),
            "workload": {"name": self.attrs.get("workload_name"), "params": self.attrs.get("workload_params")},
            "strategy": self.attrs.get("strategy_name"),
            "n": self.n,
            "m": self.m,
            "causal": {"stored": self.causal_stored, "recomputed": self.causal_recomputed},
            "numbers": nums(self.numbers),
            "solver": dict(self.solver),
            "certificate": dict(self.certificate),
            "compression": dict(self.compression) if self.compression else None,
            "compression_numbers": nums(self.compression_numbers),
            "accounting": [dict(a) for a in self.accounting],
            "other_groups": list(self.other_groups),
            "checksums": {name: ok for name, ok in self.checksums},
        }


def _checksums(path: Path, f: Any) -> list[tuple[str, bool | None]]:
    """Checksums via check_datasets; if a dataset cannot even be read, fall back to checking
    each one separately so the others are still reported."""
    try:
        return [(name, bool(ok)) for name, ok in check_datasets(path)]
    except (OSError, KeyError, ValueError, RuntimeError, TypeError):
        pass
    import h5py

    names: list[str] = []
    f.visit(lambda name: names.append(name))
    out: list[tuple[str, bool | None]] = []
    for name in names:
        try:
            obj = f[name]
            if not isinstance(obj, h5py.Dataset):
                continue
            stored = _decode(obj.attrs.get("sha256"))
            out.append((name, stored == dataset_sha256(obj[...])))
        except (OSError, KeyError, ValueError, RuntimeError, TypeError):
            out.append((name, None))
    return out


def _read(f: Any, name: str) -> np.ndarray | None:
    try:
        return np.asarray(f[name][...], dtype=np.float64)
    except (OSError, KeyError, ValueError, RuntimeError, TypeError):
        return None


def _group(f: Any, name: str) -> dict[str, Any] | None:
    import h5py

    g = f[name]
    if not isinstance(g, h5py.Group):
        return None
    out: dict[str, Any] = {"attrs": {k: _decode(v) for k, v in g.attrs.items()}, "datasets": {}}
    for dname, obj in g.items():
        if isinstance(obj, h5py.Dataset):
            data = _read(g, dname)
            if data is not None:
                out["datasets"][dname] = data
    return out


def recompute_certificate(fact: Factorization, dual_weights: np.ndarray) -> dict[str, Any]:
    """Lower bound on the optimal loss from the stored dual weights v, and the gap it certifies.

    Every v > 0 gives L(v) = sum(s)^2 / sum(v) <= OPT, with s the square roots of the eigenvalues
    of D^1/2 A^T A D^1/2 (BRIEF section 4). So (loss - L(v)) / loss bounds how far the stored
    factorization's loss is above optimal, whatever the stored ``gap`` claims.
    """
    from mfcli.solver import evaluate

    v = np.asarray(dual_weights, dtype=np.float64).ravel()
    if v.shape[0] != fact.n or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise MfcliError("the stored dual weights are not n positive finite numbers")
    a = fact.workload
    bound = evaluate(a.T @ a, v).dual
    loss = fact.loss_total
    return {"dual_bound": bound, "loss_total": loss, "certified_gap": (loss - bound) / loss}


def _check_compression(fact: Factorization, group: Mapping[str, Any]) -> tuple[Any, list[NumberCheck], list[str]]:
    """The ``compressed`` group through the one strict reader (:func:`mfcli.operators.check_compressed`):
    (operator or None, stored versus recomputed numbers, problems)."""
    from mfcli.operators import check_compressed

    reading = check_compressed(fact, group)
    numbers = [NumberCheck(c.name, c.stored, c.recomputed, c.ok) for c in reading.checks]
    return reading.operator, numbers, reading.failures()


def _check_accounting_records(
    records: list[dict[str, Any]], fact: Factorization | None, compressed: Any
) -> list[str]:
    """Each ``mfcli.accounting`` record against the operators this artifact really has (the dense
    root, and the compressed operator when its group verifies): the strategy hash of the operator
    it claims, and every stored epsilon against the one recomputed from its stored event
    (:func:`mfcli.accounting.session.verify_record`). Groups of another format are listed only."""
    problems: list[str] = []
    if not records:
        return problems  # the accounting stack (scipy.stats, dp-accounting) is imported only when needed
    from mfcli.accounting.session import verify_record

    for rec in records:
        attrs = rec["attrs"]
        if attrs.get("format") != "mfcli.accounting":
            rec["verified"] = False
            continue
        if fact is None:
            problems.append(f"accounting record {rec['id']!r} cannot be checked without readable root matrices")
            continue
        operators = {"dense": fact.strategy}
        if compressed is not None:
            operators[compressed.label] = compressed.strategy
        found = verify_record(attrs, operators)
        rec["verified"] = not found
        problems.extend(f"accounting record {rec['id']!r}: {p}" for p in found)
    return problems


def inspect_artifact(path: str | Path, *, certificate: bool = True) -> InspectionReport:
    """Read an artifact without trusting it and report every check.

    Args:
        path: the artifact.
        certificate: recompute the dual lower bound from stored dual weights (one n x n
            eigendecomposition; seconds at n = 2048).

    Raises:
        ArtifactError: only when the file cannot be interpreted at all: missing, a directory,
            not HDF5 (truncated or corrupt), not an mfcli artifact, or an unknown format version.
            Everything else is reported in :attr:`InspectionReport.problems`.
    """
    import h5py

    from mfcli.operators import GROUP

    p = Path(path)
    f = open_artifact_file(p)
    problems: list[str] = []
    with f:
        try:
            attrs = {k: _decode(v) for k, v in f.attrs.items()}
        except (OSError, KeyError, ValueError, RuntimeError) as exc:
            raise ArtifactError(f"{p}: cannot read the root attributes (corrupt?): {exc}") from None
        if attrs.get("format") != FORMAT:
            raise ArtifactError(f"{p} is not an mfcli artifact (format attribute is {attrs.get('format')!r})")
        version = attrs.get("format_version")
        if version != FORMAT_VERSION:
            raise ArtifactError(f"{p} has format_version {version!r}; this mfcli reads version {FORMAT_VERSION}")

        checksums = _checksums(p, f)
        for name, ok in checksums:
            if ok is None:
                problems.append(f"dataset {name!r} cannot be read (corrupt)")
            elif not ok:
                problems.append(f"checksum mismatch in dataset {name!r} (file modified or corrupt)")

        mats = {}
        for name in ("workload", "strategy", "decoder"):
            if name not in f:
                problems.append(f"no {name!r} dataset")
            else:
                mats[name] = _read(f, name)
        dual = _read(f, "dual_weights") if "dual_weights" in f else None

        comp_group = None
        accounting: list[dict[str, Any]] = []
        other: list[str] = []
        for gname in f:
            try:
                obj = f[gname]
            except (OSError, KeyError, ValueError, RuntimeError):
                problems.append(f"object {gname!r} cannot be read (corrupt)")
                continue
            if not isinstance(obj, h5py.Group):
                continue
            if gname == GROUP:
                comp_group = _group(f, gname)
            elif gname == "accounting":
                for rid in obj:
                    rec = _group(obj, rid)
                    if rec is not None:
                        accounting.append({
                            "id": rid, "attrs": rec["attrs"], "datasets": sorted(rec["datasets"]),
                        })
            else:
                other.append(gname)

    fact: Factorization | None = None
    if all(mats.get(k) is not None for k in ("workload", "strategy", "decoder")):
        try:
            fact = Factorization(
                workload=mats["workload"], strategy=mats["strategy"], decoder=mats["decoder"],
                causal=bool(attrs.get("causal", False)),
            )
        except MfcliError as exc:
            problems.append(f"the matrices do not form a factorization: {exc}")

    numbers: list[NumberCheck] = []
    causal_recomputed: bool | None = None
    n = m = None
    if fact is not None:
        n, m = fact.n, fact.m
        ok_n = attrs.get("n") == n
        numbers.append(NumberCheck("n", attrs.get("n"), n, ok_n))
        for key, value in (
            ("sensitivity", fact.sensitivity),
            ("loss_total", fact.loss_total),
            ("loss_mean", fact.loss_mean),
            ("loss_max", fact.loss_max),
        ):
            numbers.append(NumberCheck(key, attrs.get(key), value, _close(attrs.get(key), value)))
        err = fact.reconstruction_error
        numbers.append(NumberCheck("reconstruction_error", f"<= {RECONSTRUCTION_RTOL:g}", err, err <= RECONSTRUCTION_RTOL))
        if fact.m == fact.n:
            causal_recomputed = is_lower_triangular(fact.strategy) and is_lower_triangular(fact.decoder)
            if attrs.get("causal") and not causal_recomputed:
                problems.append("marked causal but B or C is not lower-triangular")
        for c in numbers:
            if not c.ok:
                problems.append(
                    f"stored {c.name} {c.stored!r} does not match the value recomputed from the matrices ({c.recomputed!r})"
                    if c.name != "reconstruction_error"
                    else f"A != B C: relative reconstruction error {c.recomputed:.3e}"
                )

    solver = attrs.get("solver") if isinstance(attrs.get("solver"), dict) else {}
    cert: dict[str, Any] = {}
    if fact is not None and solver and isinstance(solver.get("primal"), (int, float)):
        primal_ok = _close(solver["primal"], fact.loss_total)
        cert["stored_primal_matches_loss"] = primal_ok
        if not primal_ok:
            problems.append(
                f"solver primal {solver['primal']!r} does not match the loss recomputed from the matrices ({fact.loss_total!r})"
            )
    if certificate and fact is not None and dual is not None and fact.m == fact.n:
        try:
            cert.update(recompute_certificate(fact, dual))
        except (MfcliError, np.linalg.LinAlgError, ValueError) as exc:
            cert["error"] = str(exc)
        else:
            if cert["dual_bound"] > fact.loss_total * (1 + RTOL):
                problems.append(
                    f"the dual bound from the stored weights ({cert['dual_bound']!r}) exceeds the loss: inconsistent file"
                )

    compression: dict[str, Any] = {}
    comp_numbers: list[NumberCheck] = []
    comp_obj = None
    if comp_group is not None:
        cattrs = comp_group["attrs"]
        compression = {
            "band": cattrs.get("band"),
            "rank": cattrs.get("rank"),
            "stream_cost": (cattrs.get("band") or 0) + (cattrs.get("rank") or 0)
            if isinstance(cattrs.get("band"), int) and isinstance(cattrs.get("rank"), int) else None,
            "fit_relative_error": cattrs.get("fit_relative_error"),
            "source_file": cattrs.get("source_file"),
            "source_sha256": cattrs.get("source_sha256"),
        }
        if attrs.get("compression_band") is not None and attrs.get("compression_band") != cattrs.get("band"):
            problems.append(
                f"root attribute compression_band {attrs.get('compression_band')!r} differs from {GROUP}/band {cattrs.get('band')!r}"
            )
        if attrs.get("compression_rank") is not None and attrs.get("compression_rank") != cattrs.get("rank"):
            problems.append(
                f"root attribute compression_rank {attrs.get('compression_rank')!r} differs from {GROUP}/rank {cattrs.get('rank')!r}"
            )
        if fact is None:
            problems.append(f"the {GROUP!r} group cannot be checked without readable root matrices")
        else:
            comp_obj, comp_numbers, found = _check_compression(fact, comp_group)
            problems.extend(found)
            if comp_obj is not None:
                compression["loss_mean"] = comp_obj.factorization.loss_mean
                compression["loss_max"] = comp_obj.factorization.loss_max

    problems.extend(_check_accounting_records(accounting, fact, comp_obj))

    return InspectionReport(
        path=p,
        file_sha256=file_sha256(p),
        format_version=version,
        attrs=attrs,
        provenance={k: attrs.get(k) for k in ("created_by", "created_utc", "command")},
        n=n,
        m=m,
        causal_stored=attrs.get("causal"),
        causal_recomputed=causal_recomputed,
        numbers=tuple(numbers),
        solver=solver,
        certificate=cert,
        compression=compression,
        compression_numbers=tuple(comp_numbers),
        accounting=tuple(accounting),
        other_groups=tuple(other),
        checksums=tuple(checksums),
        problems=tuple(problems),
        factorization=fact,
        compressed=comp_obj,
    )
