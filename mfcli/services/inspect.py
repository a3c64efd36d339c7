"""Inspect an artifact: every stored number next to its recomputation, and every checksum.

:func:`mfcli.io.artifact.load_artifact` stops at the first problem; :func:`inspect_artifact` keeps
going and reports them all, so a user (or ``mfcli inspect``) sees what a file claims, what its
matrices actually imply, and exactly which parts disagree:

* format version and provenance (who made it, when, with which command);
* workload and strategy, n, causality (stored flag and lower-triangularity of the matrices);
* sensitivity sens(C) = max_j ||C[:, j]||_2 and the losses sens(C)^2 ||B||_F^2 (total, mean,
  worst step), stored next to recomputed; A = B C;
* the participation schema (attribute ``participation``; absent: single participation) and,
  for another schema, the sensitivity under it (:func:`mfcli.model.participation.sensitivity`, exact
  or an upper bound) and the losses sens^2 ||B||_F^2 etc. under it; a malformed attribute is a
  problem;
* the solver certificate: the stored duality gap, and a lower bound on the optimal loss
  recomputed from the stored dual weights (one eigendecomposition), giving a certified gap that
  does not trust the stored one;
* the ``compressed`` group: B^ rebuilt from ``band``, ``u``, ``v``, sens(C^) with C^ = B^-1 A and
  the compressed loss recomputed next to the stored values;
* accounting records (groups ``accounting/<id>``, written by ``mfcli account --write`` and
  ``mfcli plan --out``), each re-derived from the operator it claims by the one verifier of every
  kind (:func:`mfcli.services.records.verify_record`); MMCC rows above
  :data:`~mfcli.services.records.MMCC_REDERIVE_MAX_N` steps only with ``deep``;
* a structured artifact (banded Toeplitz, BLT: group ``structured``, no matrices): its
  parameters, read by the one structured reader, and its stored numbers (root and group) next to
  their recomputation from the parameters; what the kind lacks (certificate, compression,
  matrices) is in ``not_available`` with the reason;
* for every kind, through its :class:`~mfcli.strategies.operators.Mechanism`: the sensitivity
  under the declared schema (exact or an upper bound), the single-participation sensitivity and
  the losses under the schema (:attr:`InspectionReport.mechanism`);
* a root that declares a compressed decoder without a ``compressed`` group;
* the SHA-256 of every dataset; a dataset that is unreadable, not numeric or has no checksum
  is a problem;
* the file's structure (:func:`mfcli.io.artifact.structure_problems`): links are reported, never
  followed.

Formal guarantees: every "recomputed" value is derived from the matrices (or parameters) in the file, never
from another stored attribute. A report is ``ok`` only if every checksum matches and every stored
number matches its recomputation (relative tolerance 1e-9).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import (
    FORMAT,
    FORMAT_VERSION,
    PARTICIPATION_ATTR,
    dataset_problem,
    dataset_sha256,
    file_sha256,
    open_artifact_file,
    read_participation,
    structure_problems,
)
from mfcli.model.factorization import RECONSTRUCTION_RTOL, Factorization, is_lower_triangular
from mfcli.model.participation import Participation, SingleParticipation

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
        accounting: one dict per ``accounting/<id>`` group: id, attrs, datasets, and its
            verification (:meth:`mfcli.services.records.RecordCheck.as_dict`: status,
            verified, problems, setting_checks).
        checksums: (dataset, OK) for every dataset; OK is None if it cannot be read.
        participation: the declared schema (None when the attribute is malformed).
        participation_declared: whether the attribute is present.
        participation_numbers: under a schema other than single participation, its sensitivity
            (``sensitivity``, ``exact``, ``lower``, ``method``) and the losses under it
            (``loss_total``, ``loss_mean``, ``loss_max``); empty otherwise.
        mechanism: what every kind reports through its
            :class:`~mfcli.strategies.operators.Mechanism` (empty when the strategy cannot be
            read): ``kind``, ``operators`` (the label of each operator the file has, the one that
            runs by default first), ``sensitivity`` under the declared schema with
            ``sensitivity_exact`` and ``sensitivity_method``, ``sensitivity_single`` and ``loss``
            (total, mean, max) under the declared schema.
        structure, structure_numbers: a structured strategy's parameters and its group's stored
            numbers against their recomputation (None and empty for a dense artifact).
        records: one summary per accounting record (settings, epsilons, sigma, noise multiplier,
            sensitivity, delta, sampler, verification), for every kind.
        not_available: {field: why} for the parts of the report this kind of artifact does not
            have (a structured artifact has no matrices, so no certificate and no compression).
        problems: one line per failed check.
        factorization, compressed, operators: the matrices (for plots) and the mechanisms; not
            part of :meth:`to_dict`.
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
    participation: Participation | None = field(default_factory=SingleParticipation)
    participation_declared: bool = False
    participation_numbers: Mapping[str, Any] = field(default_factory=dict)
    mechanism: Mapping[str, Any] = field(default_factory=dict)
    structure: Mapping[str, Any] | None = None
    structure_numbers: tuple[NumberCheck, ...] = ()
    records: tuple[Mapping[str, Any], ...] = ()
    not_available: Mapping[str, str] = field(default_factory=dict)
    factorization: Factorization | None = field(default=None, repr=False)
    compressed: Any = field(default=None, repr=False)
    operators: tuple[Any, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        """True when every checksum and every stored number checks out (a record that was not
        re-derived is not a problem, but it is not verified either: :attr:`not_rederived`)."""
        return not self.problems

    @property
    def not_rederived(self) -> tuple[str, ...]:
        """Ids of the accounting records that were not re-derived (MMCC above the default limit:
        ``inspect_artifact(..., deep=True)`` re-derives them)."""
        from mfcli.services.records import NOT_REDERIVED

        return tuple(str(a["id"]) for a in self.accounting if a.get("status") == NOT_REDERIVED)

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
            "participation": self._participation_dict(),
            "numbers": nums(self.numbers),
            "solver": dict(self.solver),
            "certificate": dict(self.certificate),
            "compression": dict(self.compression) if self.compression else None,
            "compression_numbers": nums(self.compression_numbers),
            "accounting": [dict(a) for a in self.accounting],
            "accounting_not_rederived": list(self.not_rederived),
            "other_groups": list(self.other_groups),
            "checksums": {name: ok for name, ok in self.checksums},
            **dict(self.mechanism),
            "structure": dict(self.structure) if self.structure is not None else None,
            "structure_numbers": nums(self.structure_numbers),
            "accounting_records": [dict(r) for r in self.records],
            "not_available": dict(self.not_available),
        }


    def _participation_dict(self) -> dict[str, Any] | None:
        if self.participation is None:
            return None
        from mfcli.model.participation import schema_dict

        return {
            **schema_dict(self.participation, self.n),
            "declared": self.participation_declared,
            **({"under_schema": dict(self.participation_numbers)} if self.participation_numbers else {}),
        }


def _plain(f: Any, name: str) -> Any:
    """The object at ``name`` if it is reached by a hard link; None for a missing name or a soft
    or external link, which is never followed (the structure check reports it)."""
    import h5py

    try:
        link = f.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            return None
        return f[name]
    except (OSError, KeyError, ValueError, RuntimeError, TypeError):
        return None


def _check_datasets(f: Any) -> tuple[list[tuple[str, bool | None]], list[str]]:
    """(dataset, checksum OK or None if unreadable) for every dataset reached by hard links, and
    one problem per dataset that is unreadable, not numeric, unhashed or modified."""
    import h5py

    names: list[str] = []
    try:
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        return [], [f"the file's objects cannot be listed (corrupt?): {exc}"]
    out: list[tuple[str, bool | None]] = []
    problems: list[str] = []
    for name in names:
        try:
            problem = dataset_problem(f[name])
        except (OSError, KeyError, ValueError, RuntimeError, TypeError):
            problem = None  # the read below reports it
        if problem is not None:  # judged from its header: the data is not read
            out.append((name, None))
            problems.append(f"dataset {name!r} {problem}")
            continue
        try:
            data = f[name][...]
            stored = _decode(f[name].attrs.get("sha256"))
        except (OSError, KeyError, ValueError, RuntimeError, TypeError):
            out.append((name, None))
            problems.append(f"dataset {name!r} cannot be read (corrupt)")
            continue
        if not isinstance(data, np.ndarray) or data.dtype.kind not in "fiu":
            problems.append(f"dataset {name!r} is not numeric (dtype {getattr(data, 'dtype', type(data).__name__)})")
        if stored is None:
            out.append((name, False))
            problems.append(f"dataset {name!r} has no sha256 checksum")
            continue
        ok = stored == dataset_sha256(np.asarray(data))
        out.append((name, ok))
        if not ok:
            problems.append(f"checksum mismatch in dataset {name!r} (file modified or corrupt)")
    return out, problems


def _read(f: Any, name: str) -> np.ndarray | None:
    obj = _plain(f, name)
    if obj is None or dataset_problem(obj) is not None:  # not read: _check_datasets reports why
        return None
    try:
        data = obj[...]
        if not isinstance(data, np.ndarray) or data.dtype.kind not in "fiu":
            return None
        return np.asarray(data, dtype=np.float64)
    except (OSError, KeyError, ValueError, RuntimeError, TypeError):
        return None


def _group(f: Any, name: str) -> dict[str, Any] | None:
    import h5py

    g = _plain(f, name)
    if not isinstance(g, h5py.Group):
        return None
    out: dict[str, Any] = {"attrs": {k: _decode(v) for k, v in g.attrs.items()}, "datasets": {}}
    for dname in g:
        obj = _plain(g, dname)
        if isinstance(obj, h5py.Dataset):
            data = _read(g, dname)
            if data is not None:
                out["datasets"][dname] = data
    return out


def recompute_certificate(fact: Factorization, dual_weights: np.ndarray) -> dict[str, Any]:
    """Lower bound on the optimal loss from the stored dual weights v, and the gap it certifies.

    Every v > 0 gives L(v) = sum(s)^2 / sum(v) <= OPT, with s the square roots of the eigenvalues
    of D^1/2 A^T A D^1/2 (docs/concepts.md). So (loss - L(v)) / loss bounds how far the stored
    factorization's loss is above optimal, whatever the stored ``gap`` claims.
    """
    from mfcli.optimize.dense import evaluate

    problem = dual_weights_problem(dual_weights, fact.n)
    if problem is not None:
        raise MfcliError(problem)
    v = np.asarray(dual_weights, dtype=np.float64).ravel()
    a = fact.workload
    bound = evaluate(a.T @ a, v).dual
    loss = fact.loss_total
    return {"dual_bound": bound, "loss_total": loss, "certified_gap": (loss - bound) / loss}


def _read_compression(fact: Factorization, group: Mapping[str, Any]) -> tuple[Any, list[NumberCheck], list[str]]:
    """The ``compressed`` group through the one strict reader (:func:`mfcli.strategies.operators.check_compressed`):
    (operator or None, stored versus recomputed numbers, problems)."""
    from mfcli.strategies.operators import check_compressed

    reading = check_compressed(fact, group)
    numbers = [NumberCheck(c.name, c.stored, c.recomputed, c.ok) for c in reading.checks]
    return reading.operator, numbers, reading.failures()


def _check_accounting_records(
    records: list[dict[str, Any]], operators: list[Any], declared: Participation | None, *, path: Path,
    why: str = "", strategy_name: str = "artifact", deep: bool = False,
) -> tuple[list[str], list[dict[str, Any]]]:
    """Each ``mfcli.accounting`` record re-derived from the mechanisms this artifact really has
    (``operators``: the root's, and the compressed operator when its group verifies) by the one
    verifier of every kind of artifact (:func:`mfcli.services.records.verify_record`):
    ``status``, ``verified``, ``problems`` and ``setting_checks`` are added to each record.
    ``deep`` re-derives MMCC rows at every n; ``why`` says why nothing can be re-derived (no
    readable strategy). Groups of another format are listed only. Returns the problems and one
    summary per record (:func:`record_summary`)."""
    if not records:
        return [], []  # the accounting stack (scipy.stats, dp-accounting) is imported only when needed
    from mfcli.services.records import record_subject, verify_records

    subject = None
    if not why and declared is None:
        why = "cannot be checked: the artifact's participation attribute is malformed"
    elif not why and declared is not None:
        subject = record_subject(path, operators, declared=declared, strategy_name=strategy_name)
    checks = verify_records([(r["id"], r.pop("raw")) for r in records], subject, deep=deep, why_unchecked=why)
    problems: list[str] = []
    for rec, (rid, check) in zip(records, checks, strict=True):
        rec.update(check.as_dict())
        problems.extend(f"accounting record {rid!r}: {p}" for p in check.problems)
    return problems, [record_summary(rid, check) for rid, check in checks]


def record_summary(rid: str, check: Any) -> dict[str, Any]:
    """What a trainer re-accounting or building a sampler needs from a record: its settings and
    their epsilons, sigma (the noise std on C G) with its noise multiplier and the sensitivity it
    divides by (re-derived), delta, the batch sampler and sampling rate (null: deterministic
    participation), and the verification (``verified``, ``status``). Numbers come from the
    strictly read claim (:class:`mfcli.services.records.RecordClaim`), never converted from text."""
    c = check.claim
    base = {"id": rid, "verified": check.verified, "status": check.status}
    if c is None:
        return {**base, "settings": [], "sigma": None, "noise_multiplier": None, "sensitivity": None, "delta": None,
                "batching": None, "sampling": None, "epsilon": {}}
    return {**base, "settings": list(c.settings), "sigma": c.sigma, "noise_multiplier": check.noise_multiplier,
            "sensitivity": check.sensitivity, "delta": c.delta, "batching": c.batching, "sampling": c.sampling,
            "epsilon": dict(c.epsilons)}


def _compression_declared_problem(attrs: Mapping[str, Any], comp_group: dict[str, Any] | None) -> str | None:
    """:func:`mfcli.model.artifact_format.compression_declared_problem` (the one rule, which
    ``select_operator`` also enforces)."""
    from mfcli.model.artifact_format import compression_declared_problem

    return compression_declared_problem(attrs, comp_group is not None)


def dual_weights_problem(dual_weights: np.ndarray, n: int) -> str | None:
    """Why stored dual weights cannot certify anything (None if they can): they must be n
    positive finite numbers, one per step."""
    v = np.asarray(dual_weights)
    if v.ndim != 1 or v.shape[0] != n:
        return f"the stored dual weights have shape {v.shape}, expected ({n},)"
    if not np.all(np.isfinite(v)):
        return "the stored dual weights are not all finite (NaN or infinity)"
    if np.any(v <= 0):
        return "the stored dual weights are not all positive"
    return None


#: A stored solver gap may be below the recomputed certified gap by floating-point noise only
#: (measured: under 5e-13 on the shipped n = 256 artifacts).
GAP_ATOL = 1e-10


def _read_header(p: Path, f: Any) -> tuple[dict[str, Any], Any]:
    """Root attributes and format version; ArtifactError if this is not an artifact v1 at all."""
    try:
        attrs = {k: _decode(v) for k, v in f.attrs.items()}
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"{p}: cannot read the root attributes (corrupt?): {exc}") from None
    if attrs.get("format") != FORMAT:
        raise ArtifactError(f"{p} is not an mfcli artifact (format attribute is {attrs.get('format')!r})")
    version = attrs.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{p} has format_version {version!r}; this mfcli reads version {FORMAT_VERSION}")
    return attrs, version


def _read_root(f: Any) -> tuple[dict[str, np.ndarray | None], np.ndarray | None, list[str]]:
    """The three root matrices (None where unreadable) and the raw dual weights."""
    problems: list[str] = []
    mats: dict[str, np.ndarray | None] = {}
    # Each matrix is judged from its header before it is read (_read: dtype, stored in full,
    # memory); its shape against the attribute n is one of the reported checks (_check_root), so
    # a forged n is reported as such rather than hiding the matrices.
    for name in ("workload", "strategy", "decoder"):
        if name not in f:
            problems.append(f"no {name!r} dataset")
        else:
            mats[name] = _read(f, name)
            if mats[name] is None:
                problems.append(f"dataset {name!r} is not a readable numeric matrix")
    dual = None
    if "dual_weights" in f:
        dual = _read(f, "dual_weights")
        if dual is None:
            problems.append("dataset 'dual_weights' is not a readable numeric vector")
    return mats, dual, problems


def _collect_groups(f: Any, comp_name: str, *, skip: tuple[str, ...] = ()
                    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str], list[str]]:
    """The compressed group, the accounting records and the names of other groups (but those in
    ``skip``: the strategy's own group, read with the root)."""
    import h5py

    problems: list[str] = []
    comp_group = None
    accounting: list[dict[str, Any]] = []
    other: list[str] = []
    for gname in f:
        obj = _plain(f, gname)
        if obj is None:
            continue  # a link: reported by the structure check, never followed
        if not isinstance(obj, h5py.Group) or gname in skip:
            continue
        if gname == comp_name:
            comp_group = _group(f, gname)
        elif gname == "accounting":
            accounting = _collect_accounting(obj)
        else:
            other.append(gname)
    return comp_group, accounting, other, problems


def _collect_accounting(obj: Any) -> list[dict[str, Any]]:
    """Every group under ``accounting`` through the one record reader
    (:func:`mfcli.services.records.records_in`): id, attributes decoded for display, the raw
    attributes for the verifier (``raw``, removed once verified) and its dataset names."""
    from mfcli.services.records import records_in

    accounting: list[dict[str, Any]] = []
    for rid, raw in records_in(obj):
        rec = _group(obj, rid)
        accounting.append({"id": rid, "attrs": {k: _decode(v) for k, v in raw.items()}, "raw": raw,
                           "datasets": sorted(rec["datasets"]) if rec is not None else []})
    return accounting


def _check_root(
    attrs: Mapping[str, Any], mats: Mapping[str, np.ndarray | None]
) -> tuple[Factorization | None, list[NumberCheck], bool | None, list[str]]:
    """The factorization, its stored numbers next to their recomputation, and causality."""
    problems: list[str] = []
    fact: Factorization | None = None
    if all(mats.get(k) is not None for k in ("workload", "strategy", "decoder")):
        try:
            fact = Factorization(
                workload=mats["workload"], strategy=mats["strategy"], decoder=mats["decoder"],  # type: ignore[arg-type]
                causal=bool(attrs.get("causal", False)),
            )
        except MfcliError as exc:
            problems.append(f"the matrices do not form a factorization: {exc}")
    numbers: list[NumberCheck] = []
    causal_recomputed: bool | None = None
    if fact is None:
        return None, numbers, None, problems
    numbers.append(NumberCheck("n", attrs.get("n"), fact.n, _same_int(attrs.get("n"), fact.n)))
    if "m" in attrs:
        numbers.append(NumberCheck("m", attrs.get("m"), fact.m, _same_int(attrs.get("m"), fact.m)))
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
    return fact, numbers, causal_recomputed, problems


def _same_int(stored: Any, value: int) -> bool:
    return not isinstance(stored, bool) and isinstance(stored, int) and stored == value


def _check_solver(
    attrs: Mapping[str, Any], fact: Factorization | None, dual: np.ndarray | None, *, certificate: bool,
    schema_loss: float | None = None, schema_numbers: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The stored solver record against the loss and the dual bound recomputed from the stored
    dual weights: the stored gap may not claim more than the recomputation certifies. A
    multi-participation solver record (it names a ``structure``, :mod:`mfcli.optimize.multi_solver`)
    stores as primal the loss under the artifact's schema (``schema_loss``, sens^2 ||B||_F^2
    with the schema sensitivity) and that sensitivity, which must lie in the bracket [lower,
    sensitivity] recomputed from C under the declared schema (``schema_numbers``); a single-
    participation record's sensitivity must be max_j ||C[:, j]||."""
    problems: list[str] = []
    raw = attrs.get("solver")
    solver: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if raw is not None and not isinstance(raw, dict):
        problems.append(f"the solver attribute is not a JSON object: {str(raw)[:80]!r}")
    if dual is not None and fact is not None:
        problem = dual_weights_problem(dual, fact.n)
        if problem is not None:
            problems.append(problem)
    cert: dict[str, Any] = {}
    if fact is not None and "sensitivity" in solver:
        problems.extend(_solver_sensitivity_problems(solver, fact, schema_numbers or {}))
    if fact is not None and solver and isinstance(solver.get("primal"), (int, float)):
        expected = schema_loss if "structure" in solver and schema_loss is not None else fact.loss_total
        primal_ok = _close(solver["primal"], expected)
        cert["stored_primal_matches_loss"] = primal_ok
        if not primal_ok:
            problems.append(
                f"solver primal {solver['primal']!r} does not match the loss recomputed from the matrices ({expected!r})"
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
            gap = solver.get("gap")
            if "gap" in solver and (isinstance(gap, bool) or not isinstance(gap, (int, float)) or not np.isfinite(gap)):
                problems.append(f"the stored solver gap {gap!r} is not a number")
            elif isinstance(gap, (int, float)) and cert["certified_gap"] > float(gap) + GAP_ATOL:
                problems.append(
                    f"the stored solver gap {gap!r} is below the gap certified by the stored dual weights "
                    f"({cert['certified_gap']:.3e}): the certificate does not hold"
                )
    return solver, cert, problems


def _solver_sensitivity_problems(solver: Mapping[str, Any], fact: Factorization,
                                 schema_numbers: Mapping[str, Any]) -> list[str]:
    """The solver record's ``sensitivity`` against the one recomputed from C: under the declared
    schema for a multi-participation record (within its bracket [lower, upper]; a record whose
    schema the root no longer declares is a problem), max column norm otherwise."""
    stored = solver.get("sensitivity")
    if isinstance(stored, bool) or not isinstance(stored, (int, float)) or not np.isfinite(stored):
        return [f"the solver sensitivity {stored!r} is not a number"]
    if "structure" in solver:
        if not schema_numbers:
            return [f"the solver record optimised for {solver['structure']!r} participation, but the artifact "
                    "declares single participation"]
        upper = float(schema_numbers["sensitivity"])
        lower = float(schema_numbers.get("lower") or upper)
        if stored < lower * (1 - RTOL) or stored > upper * (1 + RTOL):
            return [f"the solver sensitivity {stored!r} is not the sensitivity recomputed from C under the declared "
                    f"schema ({lower!r}" + (f" .. {upper!r})" if lower != upper else ")")]
        return []
    if not _close(stored, fact.sensitivity):
        return [f"the solver sensitivity {stored!r} does not match max column norm of C ({fact.sensitivity!r})"]
    return []


def _check_compression(
    attrs: Mapping[str, Any], fact: Factorization | None, comp_group: dict[str, Any] | None
) -> tuple[dict[str, Any], list[NumberCheck], Any, list[str]]:
    """The ``compressed`` group: its summary, stored numbers against recomputation from band,
    u and v (through the strict reader :func:`mfcli.strategies.operators.check_compressed`), and the operator object."""
    from mfcli.strategies.operators import GROUP

    problems: list[str] = []
    compression: dict[str, Any] = {}
    comp_numbers: list[NumberCheck] = []
    comp_obj = None
    if comp_group is None:
        return compression, comp_numbers, comp_obj, problems
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
        comp_obj, comp_numbers, found = _read_compression(fact, comp_group)
        problems.extend(found)
        if comp_obj is not None:
            compression["loss_mean"] = comp_obj.factorization.loss_mean
            compression["loss_max"] = comp_obj.factorization.loss_max
    return compression, comp_numbers, comp_obj, problems


def _check_compressed_schema(compression: dict[str, Any], comp_numbers: list[NumberCheck],
                             comp_group: dict[str, Any] | None, comp_obj: Any, schema: Participation | None) -> list[str]:
    """Under a multi-participation schema, the compressed operator's sensitivity under it,
    recomputed from C^ (:func:`mfcli.services.compress.schema_sensitivity_attrs`), put in ``compression``
    and checked against the stored ``schema_sensitivity`` attributes when present (a file
    compressed before they were stored has none: shown, not a problem). Returns the problems."""
    if comp_obj is None or comp_group is None or schema is None or isinstance(schema, SingleParticipation):
        return []
    from mfcli.services.compress import SCHEMA_ATTRS, schema_sensitivity_attrs
    from mfcli.strategies.operators import GROUP

    recomputed = schema_sensitivity_attrs(comp_obj.factorization.strategy, schema)
    compression.update(recomputed)
    cattrs = comp_group["attrs"]
    if all(name not in cattrs for name in SCHEMA_ATTRS):
        compression["schema_sensitivity_stored"] = False
        return []
    compression["schema_sensitivity_stored"] = True
    value, exact = recomputed["schema_sensitivity"], recomputed["schema_sensitivity_exact"]
    stored, stored_exact = cattrs.get("schema_sensitivity"), cattrs.get("schema_sensitivity_exact")
    checks = [NumberCheck("schema_sensitivity", stored, value, _close(stored, value)),
              NumberCheck("schema_sensitivity_exact", stored_exact, exact,
                          isinstance(stored_exact, (bool, np.bool_)) and bool(stored_exact) == exact)]
    comp_numbers.extend(checks)
    return [f"{GROUP}/{c.name} is {c.stored!r}, recomputed {c.recomputed!r} under {schema.describe()}"
            for c in checks if not c.ok]


def _check_participation(
    raw: Any, root: _Root
) -> tuple[Participation | None, dict[str, Any], dict[str, Any], list[str]]:
    """The declared schema (strictly parsed; None and a problem when malformed), the numbers
    every kind reports through its mechanism (:attr:`InspectionReport.mechanism`) and, for a
    schema other than single participation, the sensitivity and losses under it
    (:attr:`InspectionReport.participation_numbers`): sens = the mechanism's schema
    sensitivity, losses from the kind's decoder (``root.losses``), loss_total = sens^2
    ||B||_F^2, loss_mean = loss_total / n, loss_max = sens^2 max_t ||B[t, :]||^2."""
    try:
        schema = read_participation(raw, root.n)
    except MfcliError as exc:
        return None, {}, {}, [str(exc)]
    mech = root.mechanism
    if mech is None:
        return schema, {}, {}, []
    s = mech.schema_sensitivity(schema)
    loss = root.losses(schema, s.value)
    summary = {
        "kind": mech.kind, "operators": [op.label for op in root.operators],
        "sensitivity": s.value, "sensitivity_exact": s.exact, "sensitivity_method": s.method,
        "sensitivity_single": mech.sensitivity, "loss": loss,
    }
    if isinstance(schema, SingleParticipation):
        return schema, summary, {}, []
    numbers = {"sensitivity": s.value, "exact": s.exact, "lower": s.lower, "method": s.method,
               "loss_total": loss["total"], "loss_mean": loss["mean"], "loss_max": loss["max"]}
    return schema, summary, numbers, []


@dataclass
class _Root:
    """The strategy an artifact stores, read without trusting it: its mechanism (None when it
    cannot be read), its stored root numbers next to their recomputation, and how the kind
    computes its losses at a sensitivity. The one place the report depends on the layout of the
    file (matrices at the root, or a structured strategy's parameters): everything after it goes
    through the mechanism."""

    n: int | None = None
    m: int | None = None
    mechanism: Any = None
    factorization: Factorization | None = None
    numbers: list[NumberCheck] = field(default_factory=list)
    causal_recomputed: bool | None = None
    structure: dict[str, Any] | None = None
    structure_numbers: list[NumberCheck] = field(default_factory=list)
    compressed: Any = None
    not_available: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: (schema, its sensitivity) -> {"total", "mean", "max"}: the losses under that schema.
    losses: Any = None

    @property
    def operators(self) -> list[Any]:
        """The mechanisms the file has, the one that runs by default (``select_operator``'s
        ``auto``: the compressed one where it verifies) first."""
        ops = [self.mechanism] if self.mechanism is not None else []
        return [self.compressed, *ops] if self.compressed is not None else ops


def _dense_root(attrs: Mapping[str, Any], mats: Mapping[str, np.ndarray | None]) -> _Root:
    """A dense artifact's root: the matrices, their numbers (:func:`_check_root`), its
    :class:`~mfcli.strategies.operators.DenseOperator`; losses from the rows of B."""
    fact, numbers, causal, problems = _check_root(attrs, mats)
    root = _Root(numbers=numbers, causal_recomputed=causal, problems=problems, factorization=fact,
                 not_available={"structure": "a dense artifact stores its matrices, not a structured strategy's "
                                             "parameters"})
    if fact is None:
        return root
    from mfcli.strategies.operators import DenseOperator

    rows = np.sum(np.asarray(fact.decoder, dtype=np.float64) ** 2, axis=1)

    def losses(schema: Participation, sens: float) -> dict[str, float]:
        if isinstance(schema, SingleParticipation) and sens == fact.sensitivity:
            return {"total": fact.loss_total, "mean": fact.loss_mean, "max": fact.loss_max}
        return {"total": sens**2 * float(np.sum(rows)), "mean": sens**2 * float(np.sum(rows)) / fact.n,
                "max": sens**2 * float(np.max(rows))}

    root.n, root.m, root.mechanism, root.losses = fact.n, fact.m, DenseOperator(fact), losses
    return root


def _structured_root(p: Path, attrs: Mapping[str, Any]) -> _Root:
    """A structured artifact's root (banded Toeplitz, BLT: parameters in group ``structured``, no
    matrices): read by the one structured reader (:func:`mfcli.io.artifact.load_structured_artifact`,
    every stored number recomputed from the parameters; what it refuses is a problem here), its
    :class:`~mfcli.strategies.structured.StructuredOperator`; losses from the parameters."""
    from mfcli.io.artifact import load_structured_artifact
    from mfcli.strategies.structured import GROUP

    none = "a structured artifact stores parameters, not matrices: "
    root = _Root(not_available={
        "certificate": none + "no dual weights to certify a gap from",
        "compression": none + "no dense decoder to compress",
        "matrices": none + "no matrices to draw (plot) or to evaluate under another schema",
    })
    try:
        art = load_structured_artifact(p)
    except ArtifactError as exc:
        root.problems.append(str(exc).replace(f"{p}: ", "", 1))
        return root
    gattrs = art.groups[GROUP]["attrs"]
    root.n, root.m, root.mechanism, root.causal_recomputed = art.n, art.n, art.operator(), True
    checks = (("n", attrs.get("n"), art.n), ("m", attrs.get("m"), art.n))
    root.numbers = [NumberCheck(k, stored, value, _same_int(stored, value)) for k, stored, value in checks]
    for key, value in (("sensitivity", art.sensitivity.value), ("loss_total", art.loss.total),
                       ("loss_mean", art.loss.mean), ("loss_max", art.loss.max)):
        root.numbers.append(NumberCheck(key, attrs.get(key), value, _close(attrs.get(key), value)))
    for key, value in (("schema_sensitivity", art.schema_sensitivity.value),
                       ("schema_loss_mean", art.schema_loss.mean), ("schema_loss_max", art.schema_loss.max)):
        root.structure_numbers.append(NumberCheck(key, gattrs.get(key), value, _close(gattrs.get(key), value)))
    root.structure = {"kind": art.kind, "parameters": {k: v.tolist() for k, v in art.strategy.parameters().items()}}

    def losses(schema: Participation, sens: float) -> dict[str, float]:
        # the loader computed them under the declared schema, the only one inspect reads
        loss = art.schema_loss if sens == art.schema_sensitivity.value else art.loss
        return {"total": loss.total, "mean": loss.mean, "max": loss.max}

    root.losses = losses
    return root


def inspect_artifact(path: str | Path, *, certificate: bool = True, deep: bool = False) -> InspectionReport:
    """Read an artifact without trusting it and report every check.

    Args:
        path: the artifact.
        certificate: recompute the dual lower bound from stored dual weights (one n x n
            eigendecomposition; seconds at n = 2048).
        deep: re-derive the MMCC rows of accounting records at every n (one MMCC run each);
            without it, above :data:`mfcli.services.records.MMCC_REDERIVE_MAX_N` steps such a
            record is "not re-derived" (never verified; not a problem either).

    Raises:
        ArtifactError: only when the file cannot be interpreted at all: missing, a directory,
            not HDF5 (truncated or corrupt), not an mfcli artifact, or an unknown format version.
            Everything else is reported in :attr:`InspectionReport.problems`.
    """
    from mfcli.strategies.operators import GROUP
    from mfcli.strategies.structured import GROUP as STRUCTURED

    p = Path(path)
    f = open_artifact_file(p)
    with f:
        attrs, version = _read_header(p, f)
        problems = structure_problems(f)
        checksums, found = _check_datasets(f)
        problems += found
        # The one branch on the layout (artifact I/O, as mfcli.io.artifact.is_structured_file): a
        # structured strategy's parameters, or the matrices at the root; the rest reads the mechanism.
        structured = STRUCTURED in f and "strategy" not in f
        mats: dict[str, np.ndarray | None] = {}
        dual = None
        if not structured:
            mats, dual, found = _read_root(f)
            problems += found
        comp_group, accounting, other, found = _collect_groups(f, GROUP, skip=(STRUCTURED,) if structured else ())
        problems += found
        try:
            raw_participation = f.attrs.get(PARTICIPATION_ATTR)
        except (OSError, KeyError, ValueError, RuntimeError) as exc:
            raw_participation = None
            problems.append(f"attribute {PARTICIPATION_ATTR} cannot be read (corrupt?): {exc}")
    root = _structured_root(p, attrs) if structured else _dense_root(attrs, mats)
    problems += root.problems
    fact = root.factorization
    compression, comp_numbers, comp_obj, found = _check_compression(attrs, fact, comp_group)
    problems += found
    root.compressed = comp_obj
    schema, summary, schema_numbers, found = _check_participation(raw_participation, root)
    problems += found
    solver, cert, found = _check_solver(attrs, fact, dual, certificate=certificate,
                                        schema_loss=schema_numbers.get("loss_total") if schema_numbers else None,
                                        schema_numbers=schema_numbers)
    problems += found
    found = _check_compressed_schema(compression, comp_numbers, comp_group, comp_obj, schema)
    problems += found
    found_compression = _compression_declared_problem(attrs, comp_group)
    if found_compression:
        problems.append(found_compression)
    why = "" if root.mechanism is not None else "cannot be checked without a readable strategy (matrices or parameters)"
    found, records = _check_accounting_records(
        accounting, root.operators[::-1], schema, path=p, why=why, deep=deep,
        strategy_name=str(attrs.get("strategy_name", root.mechanism.kind if root.mechanism is not None else "artifact")))
    problems += found

    return InspectionReport(
        path=p,
        file_sha256=file_sha256(p),
        format_version=version,
        attrs=attrs,
        provenance={k: attrs.get(k) for k in ("created_by", "created_utc", "command")},
        n=root.n,
        m=root.m,
        causal_stored=attrs.get("causal"),
        causal_recomputed=root.causal_recomputed,
        numbers=tuple(root.numbers),
        solver=solver,
        certificate=cert,
        compression=compression,
        compression_numbers=tuple(comp_numbers),
        accounting=tuple(accounting),
        other_groups=tuple(other),
        checksums=tuple(checksums),
        problems=tuple(problems),
        participation=schema,
        participation_declared=raw_participation is not None,
        participation_numbers=schema_numbers,
        mechanism=summary,
        structure=root.structure,
        structure_numbers=tuple(root.structure_numbers),
        records=tuple(records),
        not_available=root.not_available,
        factorization=fact,
        compressed=comp_obj,
        operators=tuple(root.operators),
    )
