"""Accounting records (groups ``accounting/<id>``, written by ``mfcli account --write`` and
``mfcli plan --out``): the one reader and the one verifier, for every kind of artifact.

A record is a claim: "running this artifact's operator with noise std sigma on C G, batch sampler S
at rate p, under participation schema P, is (epsilon, delta)-DP in each of these settings". A
trainer takes its sigma and its sampler from it (:func:`mfcli.training.samplers.sampler_for`) and reports
its epsilons (:func:`mfcli.training.samplers.held_epsilons`), so a record that is not the derivation of its
own artifact is a privacy bug. :func:`verify_record` therefore RE-DERIVES every record from the
artifact it sits in and trusts none of the record's numbers:

1. its fields are read strictly: sigma > 0, delta in (0, 1), a sampling rate in (0, 1] or none, a
   known batch sampler that fits the rate, a readable participation schema, known settings, and
   for each setting an epsilon that is a finite non-negative number (a string, NaN, infinity or a
   negative number is refused, never converted);
2. the operator it names must be one the artifact really has (dense root, compressed decoder when
   that group verifies, a structured artifact's parameters) and ``strategy_sha256`` must be that
   operator's identity hash;
3. its schema must be one ``account`` would have accounted the artifact under (the schema the
   artifact declares, or any schema for an artifact that declares single participation), and each
   setting must apply to that schema (single-pass and the shuffled tree to single participation,
   deterministic to a multi-participation schema) and to its batch sampler;
4. every setting is accounted again by :func:`mfcli.services.account.account` -- the one
   accounting of every kind, which recomputes C and its sensitivities from the operator -- at the
   record's sigma, rate, delta, schema and batch sampler and its numerical options (PLD grid,
   MMCC's tail fraction and mixture grid: any valid choice of them gives a valid bound, so a
   record cannot gain by editing them); MMCC directly by :func:`mfcli.accounting.mmcc.mmcc`
   (``account`` adds MMCC's lower bound and sanity bound, which a check does not need);
5. the stored dp-accounting event must equal the re-derived one (same structure and counts, every
   number within :data:`EVENT_RTOL`), and the stored epsilon must be at least the re-derived one
   (within :data:`RECORD_RTOL`; a larger one is only pessimistic and is accepted);
6. a stored ``sensitivity`` and ``noise_multiplier`` (written since 0.3, also inside
   ``calibration``) must equal the sensitivity re-derived from the operator
   (:func:`claim_sensitivity`) and sigma / it, within :data:`RECORD_RTOL`; a record without them
   (0.1, 0.2) is checked on the rest.

A record verifies when every setting does. A record whose fields cannot be read, whose operator is
not this artifact's, or whose derivation fails or disagrees is UNVERIFIED, with one line per
problem. MMCC re-derivation costs one MMCC run (tens of seconds at n = 256 on a loaded 2-core
machine, growing with n); above :data:`MMCC_REDERIVE_MAX_N` steps it runs only with ``deep=True``
(``mfcli inspect --deep``), and without it the MMCC row, and so its record, is "not re-derived":
never reported as verified. The samplers (``held_epsilons``, ``sampler_for``) always verify
deeply.

Tolerances. A re-derivation runs the same code on the same stored bytes, so on one machine it
reproduces the record bit for bit; on another, summation order (BLAS, SIMD) may move the last bits
of a sensitivity (~1e-16 relative) and of what follows from it. :data:`RECORD_RTOL` = 1e-9 leaves
six orders of magnitude above that noise and is far below any edit that changes a privacy claim
(the forgeries in tests/test_record_forgery.py move epsilon by 1e-3 relative or more).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mfcli.accounting.defaults import BATCHINGS, DEFAULT_DISCRETIZATION, DEFAULT_MIXTURE_RESOLUTION, SETTINGS
from mfcli.errors import MfcliError
from mfcli.model.participation import Participation, SingleParticipation
from mfcli.model.record_format import RECORD_FORMAT, read_chunked

if TYPE_CHECKING:
    from mfcli.services.account import AccountingOptions, StrategyInput

#: Relative slack between a stored epsilon and its re-derivation (see the module docstring).
RECORD_RTOL = 1e-9
#: Relative slack between a number of a stored event and the re-derived event's.
EVENT_RTOL = 1e-9
#: Above this many steps MMCC rows are re-derived only when asked (``deep``): one MMCC run costs
#: tens of seconds at n = 256 on a loaded 2-core machine and grows about as n^2 to n^3.
MMCC_REDERIVE_MAX_N = 256

#: The finest numerical options a record is re-derived with: a forged record must not turn a
#: small file into hours of work or gigabytes of memory (a PLD grid of 1e-12, a mixture grid of
#: 1e-9). Both are 100x finer than the defaults (1e-4 and 1/50); a record made with finer options
#: is reported unverified with the limit.
MIN_REDERIVE_DISCRETIZATION = 1e-6
MAX_REDERIVE_MIXTURE_RESOLUTION = 5000

#: Status of a record (and of each of its settings).
VERIFIED = "verified"
UNVERIFIED = "unverified"
NOT_REDERIVED = "not re-derived"
FOREIGN = "not an mfcli.accounting record"

#: What ``mfcli inspect`` shows for a record or row that was not re-derived.
DEEP_HINT = "not re-derived (run mfcli inspect --deep)"


# ---------------------------------------------------------------------------------------------
# The one reader


def plain_value(value: Any) -> Any:
    """An HDF5 attribute value as plain Python: bytes to str, numpy scalars and 0-d arrays to
    their item, arrays to lists (of str for string arrays). Strings stay strings (never parsed
    into numbers: a sampling rate stored as the string "0.5" is not a number)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return plain_value(value.item())
        return [plain_value(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def records_in(group: Any) -> list[tuple[str, dict[str, Any]]]:
    """(id, attributes) of every group under the h5py group ``accounting``, in id order (ids start
    with the UTC time of writing, so oldest first). Only groups reached by hard links are read:
    a soft or external link is never followed (the artifact's structure check reports it)."""
    import h5py

    out: list[tuple[str, dict[str, Any]]] = []
    for rid in sorted(group):
        try:
            link = group.get(rid, getlink=True)
            if not isinstance(link, h5py.HardLink):
                continue
            obj = group[rid]
        except (OSError, KeyError, ValueError, RuntimeError, TypeError):
            continue
        if isinstance(obj, h5py.Group):
            out.append((rid, {k: plain_value(v) for k, v in obj.attrs.items()}))
    return out


def read_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """Every group under ``accounting/`` of the file at ``path`` (of any format): {id: attributes},
    oldest first. An artifact without records gives {}.

    Raises:
        MfcliError: the file cannot be read.
    """
    import h5py

    from mfcli.util.validation import regular_file

    p = Path(path)
    try:
        with h5py.File(regular_file(p, "artifact"), "r") as f:  # a FIFO would block the open
            link = f.get("accounting", getlink=True)
            if link is None or not isinstance(link, h5py.HardLink) or not isinstance(f["accounting"], h5py.Group):
                return {}
            return dict(records_in(f["accounting"]))
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        raise MfcliError(f"{p}: cannot read its accounting records: {exc}") from None


# ---------------------------------------------------------------------------------------------
# A record's fields, read strictly


@dataclass(frozen=True)
class RecordClaim:
    """What a record claims, each field checked for type and range (not yet for truth).

    Attributes:
        operator: the operator it accounted (``dense``, ``compressed (band K, rank R)``, or a
            structured artifact's label).
        strategy_sha256: that operator's identity hash, as the record states it.
        sigma, delta: the std of the noise on C G (per unit clip norm) and delta; the noise
            multiplier is sigma / :func:`claim_sensitivity`.
        sampling: the sampling rate, None without one.
        batching: the batch sampler (``poisson``, ``cyclic``, ``balls-in-bins``, ``shuffle``), None
            for deterministic participation (the fixed order of :class:`mfcli.training.samplers.FixedOrderSampler`).
        schema: the participation schema accounted.
        settings: the settings computed.
        epsilons: {setting: stored epsilon}.
        rows: {setting: stored result row (``results``)}.
        events: {setting: stored dp-accounting event JSON} for the settings that store one.
    """

    operator: str
    strategy_sha256: str
    sigma: float
    delta: float
    sampling: float | None
    batching: str | None
    schema: Participation
    settings: tuple[str, ...]
    epsilons: Mapping[str, float]
    rows: Mapping[str, Mapping[str, Any]]
    events: Mapping[str, str]

    @property
    def sampler(self) -> str:
        """The batch sampler a trainer must use: the record's, or ``fixed-order`` without one."""
        return self.batching or "fixed-order"


def _number(value: Any) -> float | None:
    """A real number as float (bool, strings, None and non-finite values are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _json_value(value: Any) -> Any:
    """An attribute holding JSON (text), decoded; an already decoded value as it is."""
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _is_null(value: Any) -> bool:
    return value is None or value == "null"


def _chunked(attrs: Mapping[str, Any], name: str) -> str | None:
    try:
        text = read_chunked(attrs, name)
    except (KeyError, TypeError, ValueError):
        return None
    return text


def read_claim(attrs: Mapping[str, Any]) -> tuple[RecordClaim | None, list[str]]:
    """The record's claim and the problems with its fields (the claim is None when any field is
    missing or malformed: nothing can be re-derived from it).

    Every field is checked for its type and range; numbers must be numbers (a string, even
    "0.5", is refused), finite, and in range; an epsilon must be finite and non-negative."""
    from mfcli.model.participation import participation_from_json
    from mfcli.services.account import check_batching

    problems: list[str] = []
    operator = attrs.get("operator", "dense")  # records without the attribute accounted the dense C
    if not isinstance(operator, str):
        problems.append(f"its operator attribute {operator!r} is not a name")
    sha = attrs.get("strategy_sha256")
    if not isinstance(sha, str) or not sha:
        problems.append("it has no strategy_sha256 (no checksum of the operator it accounted)")
    sigma, delta = _number(attrs.get("sigma")), _number(attrs.get("delta"))
    if sigma is None or sigma <= 0:
        problems.append(f"sigma {attrs.get('sigma')!r} is not a positive finite number")
    if delta is None or not 0 < delta < 1:
        problems.append(f"delta {attrs.get('delta')!r} is not a number in (0, 1)")
    raw_sampling = attrs.get("sampling")
    sampling = None if _is_null(raw_sampling) else _number(raw_sampling)
    if not _is_null(raw_sampling) and (sampling is None or not 0 < sampling <= 1):
        problems.append(f"the sampling rate {raw_sampling!r} is not a number in (0, 1]")
        sampling = None
    if "batching" in attrs:
        raw_batching = attrs.get("batching")
        batching = None if _is_null(raw_batching) else raw_batching
    else:  # records written before the attribute: Poisson with a rate, as account did
        batching = None if sampling is None else "poisson"
    if batching is not None and batching not in BATCHINGS:
        problems.append(f"the batch sampler {batching!r} is not one of {', '.join(BATCHINGS)}")
    elif not problems:
        try:
            check_batching(batching, sampling)
        except MfcliError as exc:
            problems.append(f"its batch sampler and sampling rate do not fit: {exc}")
    schema: Participation = SingleParticipation()
    if "participation" in attrs:
        raw = attrs["participation"]
        try:
            schema = participation_from_json(raw if isinstance(raw, (str, bytes)) else json.dumps(raw))
        except (MfcliError, TypeError, ValueError) as exc:
            problems.append(f"its participation attribute is not readable: {exc}")
    raw_settings = _json_value(attrs.get("settings"))
    settings: list[str] = []
    if isinstance(raw_settings, str):
        raw_settings = [raw_settings]
    if not isinstance(raw_settings, list) or not raw_settings or not all(isinstance(s, str) for s in raw_settings):
        problems.append(f"its settings attribute {attrs.get('settings')!r} is not a list of setting names")
    else:
        settings = list(raw_settings)
        unknown = [s for s in settings if s not in SETTINGS]
        if unknown:
            problems.append(f"it names unknown setting(s) {', '.join(map(repr, unknown))}")
        if len(set(settings)) != len(settings):
            problems.append("it names a setting twice")
    epsilons: dict[str, float] = {}
    for s in settings:
        key = f"epsilon_{s.replace('-', '_')}"
        v = _number(attrs.get(key))
        if v is None or v < 0:
            problems.append(f"{key} {attrs.get(key)!r} is missing or not a finite non-negative number")
        else:
            epsilons[s] = v
    results = _json_value(_chunked(attrs, "results"))
    rows: dict[str, Mapping[str, Any]] = {}
    if not isinstance(results, dict):
        problems.append("its results (the rows the epsilons come from) are missing or not a JSON object")
    else:
        for s in settings:
            row = results.get(s)
            if not isinstance(row, dict):
                problems.append(f"its results have no row for {s}")
            else:
                rows[s] = row
    events = {s: text for s in settings if (text := _chunked(attrs, f"dp_event_{s.replace('-', '_')}")) is not None}
    if problems:
        return None, problems
    assert sigma is not None and delta is not None and isinstance(operator, str) and isinstance(sha, str)
    return RecordClaim(operator=operator, strategy_sha256=sha, sigma=sigma, delta=delta, sampling=sampling,
                       batching=batching, schema=schema, settings=tuple(settings), epsilons=epsilons, rows=rows,
                       events=events), []


def accounting_options(claim: RecordClaim) -> AccountingOptions:
    """The numerical options of the ``account`` run that made the record, from its rows: the PLD
    grid (DP-SGD and cyclic-Poisson rows' ``value_discretization``, MMCC's
    ``requested_discretization``; the rows of one run agree), MMCC's tail fraction and mixture
    grid. Each is checked as ``account`` checks it; any valid value gives a valid bound.

    Raises:
        MfcliError: a malformed option, or rows that disagree on the grid.
    """
    from mfcli.accounting.mmcc import check_tail_fraction
    from mfcli.accounting.single_pass import check_discretization
    from mfcli.services.account import AccountingOptions

    grids = {}
    for s, key in (("dp-sgd", "value_discretization"), ("cyclic-poisson", "value_discretization"),
                   ("mmcc", "requested_discretization")):
        if s in claim.rows:
            v = _number(claim.rows[s].get(key))
            if v is None:
                raise MfcliError(f"the {s} row's {key} {claim.rows[s].get(key)!r} is not a number")
            grids[s] = check_discretization(v)
            if grids[s] < MIN_REDERIVE_DISCRETIZATION:
                raise MfcliError(f"the {s} row's PLD grid {v!r} is finer than {MIN_REDERIVE_DISCRETIZATION:g}, the "
                                 "finest a record is re-derived on")
    if len(set(grids.values())) > 1:
        raise MfcliError(f"its rows were computed on different PLD grids ({grids}): not one account run")
    grid = next(iter(grids.values()), DEFAULT_DISCRETIZATION)
    fractions: tuple[float, ...] = AccountingOptions().tail_fractions
    resolution = DEFAULT_MIXTURE_RESOLUTION
    if "mmcc" in claim.rows:
        row = claim.rows["mmcc"]
        f = _number(row.get("tail_fraction"))
        if f is None:
            raise MfcliError(f"the mmcc row's tail_fraction {row.get('tail_fraction')!r} is not a number")
        if f != 0.0:  # 0: no tail events (or rate 1), where the fraction tried does not matter
            fractions = (check_tail_fraction(f),)
        g = _number(row.get("mixture_grid"))
        if g is None or not 0 < g <= 1:
            raise MfcliError(f"the mmcc row's mixture_grid {row.get('mixture_grid')!r} is not a number in (0, 1]")
        if g < 1.0 / MAX_REDERIVE_MIXTURE_RESOLUTION:
            raise MfcliError(f"the mmcc row's mixture_grid {g!r} is finer than 1/{MAX_REDERIVE_MIXTURE_RESOLUTION}, "
                             "the finest a record is re-derived on")
        resolution = round(1.0 / g)
        if resolution < 1 or abs(1.0 / resolution - g) > 1e-12 * g:
            raise MfcliError(f"the mmcc row's mixture_grid {g!r} is not 1/M for an integer M")
    return AccountingOptions(delta=claim.delta, value_discretization=grid, tail_fractions=fractions,
                             mixture_resolution=resolution, tree_balls_in_bins_grid=_tree_balls_in_bins_grid(claim))


def _tree_balls_in_bins_grid(claim: RecordClaim) -> float | None:
    """The grid the record's balls-in-bins tree row was computed on (None: no such row, or a record
    without the grid: re-derived on the automatic grid). Refused below the automatic choice's
    finest grid, where a forged record would buy quadratically more work."""
    from mfcli.accounting.balls_in_bins import AUTO_FINEST

    row = claim.rows.get("balls-in-bins-tree")
    if row is None or row.get("grid") is None:
        return None
    g = _number(row.get("grid"))
    if g is None or not math.isfinite(g) or not 0 < g <= 1:
        raise MfcliError(f"the balls-in-bins-tree row's grid {row.get('grid')!r} is not a number in (0, 1]")
    if g < AUTO_FINEST * (1 - 1e-9):
        raise MfcliError(f"the balls-in-bins-tree row's grid {g!r} is finer than {AUTO_FINEST:g}, the finest a "
                         "record is re-derived on")
    return g


# ---------------------------------------------------------------------------------------------
# What a record is verified against: the artifact as it really is (each kind builds its own)


@dataclass(frozen=True)
class RecordSubject:
    """The artifact a record sits in, as recomputed from its stored bytes.

    Attributes:
        path: the artifact.
        n: its number of steps.
        declared: the participation schema it declares.
        operators: {label: operator} for the operators it really has (each with ``identity_sha256``).
        make_input: the kind's part: the :class:`~mfcli.services.account.StrategyInput` that
            ``account`` accounts for one of those operators (C and its sensitivities recomputed
            from the operator, never read from an attribute); the flag says whether a dense C is
            needed (settings ``account`` runs on the matrix).
    """

    path: Path
    n: int
    declared: Participation
    operators: Mapping[str, Any]
    make_input: Callable[[Any, bool], StrategyInput]


def record_subject(path: str | Path, operators: Sequence[Any], *, declared: Participation,
                   strategy_name: str = "artifact") -> RecordSubject:
    """The subject of an artifact of any kind: the operators it really has (``operators``, each a
    :class:`mfcli.strategies.operators.Mechanism` rebuilt from the stored arrays or parameters), each
    accounted as ``account`` accounts it (:func:`mfcli.services.account.operator_input`; a
    mechanism that builds C on demand builds it only when a setting needs the matrix)."""
    p = Path(path)
    ops = {op.label: op for op in operators}

    def make(op: Any, dense: bool) -> StrategyInput:
        from mfcli.services.account import operator_input

        return operator_input(p, op, name=strategy_name, participation=declared,
                              source=f"artifact {p}: the {op.label} operator, n = {op.n}", with_matrix=dense)

    return RecordSubject(path=p, n=int(operators[0].n), declared=declared, operators=ops, make_input=make)


def subject_of(art: Any) -> RecordSubject:
    """The subject of a loaded artifact of any kind (:func:`mfcli.io.artifact.load_any_artifact`):
    every operator it has (:func:`mfcli.strategies.operators.operators_of`; a ``compressed`` group is read
    strictly: one that does not verify is an error)."""
    from mfcli.strategies.operators import operators_of

    ops = operators_of(art)
    # the stored name (a structured artifact stores none: its kind names it)
    name = art.attrs.get("strategy_name", getattr(art, "kind", "artifact"))
    return record_subject(art.path, ops, declared=art.participation, strategy_name=str(name))


# ---------------------------------------------------------------------------------------------
# The noise convention: what a record's noise multiplier divides by


def claim_sensitivity(claim: RecordClaim, subject: RecordSubject) -> float:
    """The sensitivity the record's noise multiplier divides by, re-derived from the operator it
    names (:func:`mfcli.services.account.noise_sensitivity`: the schema sensitivity for a
    fixed-order record, ``batching`` null, under a multi-participation schema; the largest column
    norm of C for every other record).

    Raises:
        MfcliError: the record names an operator the artifact does not have.
    """
    from mfcli.services.account import noise_sensitivity

    op = subject.operators.get(claim.operator)
    if op is None:
        raise MfcliError(f"the accounting record names operator {claim.operator!r}, which the artifact does not have")
    # the sensitivities come from the mechanism: no dense C needs building for them
    return noise_sensitivity(subject.make_input(op, False), claim.schema, fixed_order=claim.batching is None)


def accounted_sensitivity(attrs: Any, subject: RecordSubject | None = None,
                          artifact: str | Path | None = None) -> float:
    """The sensitivity a record's noise multiplier divides by (:func:`claim_sensitivity`), from
    its attributes and the artifact it sits in (``subject`` when the caller already has the
    verifier's subject, else rebuilt from ``artifact``): recomputed from the operator, never read
    from the record's ``sensitivity`` attribute.

    Raises:
        MfcliError: the record's fields cannot be read, or it names an operator the artifact lacks.
    """
    claim, problems = read_claim(attrs)
    if claim is None:
        raise MfcliError(f"the accounting record cannot be read: {problems[0] if problems else 'malformed'}")
    if subject is None:
        if artifact is None:
            raise MfcliError("accounted_sensitivity needs the artifact (or the verifier's subject)")
        from mfcli.io.artifact import load_any_artifact

        subject = subject_of(load_any_artifact(Path(artifact)))
    return claim_sensitivity(claim, subject)


def _noise_problems(attrs: Mapping[str, Any], claim: RecordClaim, sensitivity: float) -> list[str]:
    """A stored ``sensitivity`` or ``noise_multiplier`` (records since 0.3; older ones have
    neither) must be the re-derived sensitivity and sigma / it; so must the calibration's."""
    problems = []
    expected = {"sensitivity": sensitivity, "noise_multiplier": claim.sigma / sensitivity}
    cal = _json_value(attrs.get("calibration")) if "calibration" in attrs else None
    for where, fields in (("", attrs), ("its calibration's ", cal if isinstance(cal, dict) else {})):
        for name, want in expected.items():
            if name not in fields:
                continue
            got = _number(fields.get(name))
            if got is None or not math.isclose(got, want, rel_tol=RECORD_RTOL):
                problems.append(f"{where}{name} {fields.get(name)!r} is not the {want!r} re-derived from the artifact's "
                                f"{claim.operator} operator (noise multiplier = sigma / sensitivity)")
    return problems


# ---------------------------------------------------------------------------------------------
# The one verifier


@dataclass(frozen=True)
class SettingCheck:
    """One setting of a record: its status, the stored epsilon, the re-derived one (None when not
    re-derived) and, for a setting that does not verify, why."""

    setting: str
    status: str
    stored: float | None = None
    rederived: float | None = None
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "status": self.status, "stored_epsilon": self.stored,
                "rederived_epsilon": self.rederived, **({"problem": self.problem} if self.problem else {})}


@dataclass(frozen=True)
class RecordCheck:
    """The verdict on one record.

    Attributes:
        status: :data:`VERIFIED` (every setting re-derived and agrees), :data:`UNVERIFIED` (a
            problem), :data:`NOT_REDERIVED` (no problem, but an MMCC row was not re-derived:
            run with ``deep``) or :data:`FOREIGN` (a group of another format: listed only).
        problems: one line per problem (empty unless unverified).
        settings: one :class:`SettingCheck` per setting (empty when the fields cannot be read).
        claim: the record's fields (None when they cannot be read).
        sensitivity: the sensitivity its noise multiplier divides by, re-derived from the operator
            (:func:`claim_sensitivity`; None when it could not be).
    """

    status: str
    problems: tuple[str, ...] = ()
    settings: tuple[SettingCheck, ...] = ()
    claim: RecordClaim | None = None
    sensitivity: float | None = None

    @property
    def verified(self) -> bool:
        return self.status == VERIFIED

    @property
    def noise_multiplier(self) -> float | None:
        """The record's sigma / the re-derived :attr:`sensitivity` (None without either)."""
        if self.claim is None or self.sensitivity is None:
            return None
        return self.claim.sigma / self.sensitivity

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "verified": self.verified, "problems": list(self.problems),
                "setting_checks": [s.as_dict() for s in self.settings],
                # the noise convention, re-derived (never the stored attributes): sigma is the noise
                # std on C G, the noise multiplier sigma / sensitivity
                "noise_multiplier": self.noise_multiplier, "sensitivity": self.sensitivity,
                "noise_std": None if self.claim is None else self.claim.sigma}


def _event_difference(stored: Any, derived: Any, where: str = "event") -> str | None:
    """Where two events (parsed JSON) differ, in words, or None when they agree: the same classes,
    fields and list lengths, equal strings and counts, numbers within :data:`EVENT_RTOL`."""
    if isinstance(derived, dict):
        if not isinstance(stored, dict) or set(stored) != set(derived):
            got = sorted(stored) if isinstance(stored, dict) else type(stored).__name__
            return f"{where} has fields {got}, the re-derived one {sorted(derived)}"
        for k in derived:
            found = _event_difference(stored[k], derived[k], f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(derived, list):
        if not isinstance(stored, list) or len(stored) != len(derived):
            count = len(stored) if isinstance(stored, list) else type(stored).__name__
            return f"{where} has {count} entries, the re-derived one {len(derived)}"
        for i, (a, b) in enumerate(zip(stored, derived, strict=True)):
            found = _event_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(derived, bool) or not isinstance(derived, (int, float)):
        return None if stored == derived else f"{where} is {stored!r}, re-derived {derived!r}"
    a = _number(stored)
    if a is None or not math.isclose(a, float(derived), rel_tol=EVENT_RTOL, abs_tol=0.0):
        return f"{where} is {stored!r}, re-derived {derived!r}"
    return None


def _schema_problem(claim: RecordClaim, subject: RecordSubject) -> str | None:
    from mfcli.model.participation import declared_or_requested

    try:
        declared_or_requested(subject.declared, claim.schema, "the artifact")
    except MfcliError:
        return (f"it accounted {claim.schema.describe()}, but the artifact declares {subject.declared.describe()} "
                "(account refuses that combination: the root participation attribute or the record was changed)")
    try:
        claim.schema.check(subject.n)
    except MfcliError as exc:
        return f"its participation schema does not fit the artifact's n = {subject.n}: {exc}"
    return None


def _rederive_mmcc(inp: StrategyInput, claim: RecordClaim, opts: AccountingOptions) -> dict[str, Any]:
    """MMCC's row as ``account`` computes its upper bound (the same call), without the lower and
    sanity bounds that ``account`` adds (a check does not need them)."""
    from mfcli.accounting.mmcc import mmcc, prepare_strategy
    from mfcli.services.account import check_setting_applies

    if claim.batching != "poisson" or claim.sampling is None:
        raise MfcliError("MMCC assumes Poisson sampling at a rate; the record's batch sampler is "
                         f"{claim.batching or 'none'}")
    if not inp.has_matrix:
        raise MfcliError(inp.mechanism.matrix_refusal("the mmcc setting"))
    check_setting_applies(inp, "mmcc")
    result = mmcc(prepare_strategy(inp.strategy, inp.release_steps), sigma=claim.sigma, sampling=claim.sampling,
                  delta=opts.delta, tail_fractions=opts.tail_fractions,
                  value_discretization=opts.value_discretization, mixture_resolution=opts.mixture_resolution)
    return result.as_dict()


def _calibration_problem(attrs: Mapping[str, Any], claim: RecordClaim, checks: Mapping[str, SettingCheck]) -> str | None:
    """A record made by calibration (``calibration``, ``calibrated_setting``) claims its sigma meets
    a target: the setting must be one of the record's, its sigma the record's, and the target at
    least the re-derived epsilon of that setting."""
    if "calibration" not in attrs:
        return None
    cal = _json_value(attrs.get("calibration"))
    setting = attrs.get("calibrated_setting")
    if not isinstance(cal, dict) or setting not in claim.settings:
        return f"its calibration (for setting {setting!r}) is not readable or names no setting of the record"
    sigma, target = _number(cal.get("sigma")), _number(cal.get("target_epsilon"))
    if sigma is None or not math.isclose(sigma, claim.sigma, rel_tol=RECORD_RTOL):
        return f"its calibration's sigma {cal.get('sigma')!r} is not the record's sigma {claim.sigma!r}"
    derived = checks[setting].rederived if setting in checks else None
    if target is None or (derived is not None and target < derived * (1 - RECORD_RTOL)):
        return (f"its calibration's target epsilon {cal.get('target_epsilon')!r} is below the {derived!r} "
                f"re-derived for {setting}: the target was not met")
    return None


def _reason(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def verify_record(attrs: Mapping[str, Any], subject: RecordSubject, *, deep: bool = False) -> RecordCheck:
    """Re-derive one stored record from the artifact it sits in (module docstring) and compare.

    Args:
        attrs: the record's attributes (raw from :func:`read_records`, or decoded).
        subject: the artifact (:func:`record_subject`, :func:`subject_of`).
        deep: re-derive MMCC rows at every n (else only up to :data:`MMCC_REDERIVE_MAX_N` steps;
            above, the row and its record are :data:`NOT_REDERIVED`).

    Returns:
        The :class:`RecordCheck`; never raises for a malformed or forged record (that is its verdict).
    """
    from mfcli.services.account import account, check_setting_schema

    if attrs.get("format") != RECORD_FORMAT:
        return RecordCheck(status=FOREIGN)
    claim, problems = read_claim(attrs)
    if claim is None:
        return RecordCheck(status=UNVERIFIED, problems=tuple(problems))
    op = subject.operators.get(claim.operator)
    if op is None:
        return RecordCheck(status=UNVERIFIED, claim=claim, problems=(
            f"it claims operator {claim.operator!r}, which this artifact does not have "
            f"(has: {', '.join(subject.operators)})",))
    if claim.strategy_sha256 != op.identity_sha256:
        problems.append(f"strategy_sha256 is not the hash of the {claim.operator} operator (its identity_sha256): "
                        "the record was made for another operator")
    found = _schema_problem(claim, subject)
    if found:
        return RecordCheck(status=UNVERIFIED, claim=claim, problems=(*problems, found))
    checks: dict[str, SettingCheck] = {}
    for s in claim.settings:
        try:
            check_setting_schema(s, claim.schema, subject.n)
        except MfcliError as exc:
            checks[s] = SettingCheck(s, UNVERIFIED, claim.epsilons[s], None, f"{s}: {exc}")
    try:
        opts = accounting_options(claim)
    except MfcliError as exc:
        return RecordCheck(status=UNVERIFIED, claim=claim, problems=(*problems, f"cannot re-derive it: {exc}"))
    mmcc_skipped = "mmcc" in claim.settings and subject.n > MMCC_REDERIVE_MAX_N and not deep
    rows: dict[str, Any] = {}
    try:
        inp = subject.make_input(op, claim.batching not in (None, "cyclic"))
        report = account(inp, sigma=claim.sigma, sampling=claim.sampling, options=opts,
                         settings=[s for s in claim.settings if s != "mmcc" and s not in checks],
                         participation=claim.schema, batching=claim.batching)
        rows.update(report.rows)
    except (MfcliError, ValueError, TypeError, KeyError) as exc:
        return RecordCheck(status=UNVERIFIED, claim=claim, settings=tuple(checks.values()),
                           problems=(*problems, *(c.problem for c in checks.values() if c.problem),
                                     f"cannot re-derive it from the artifact: {_reason(exc)}"))
    if "mmcc" in claim.settings and "mmcc" not in checks and not mmcc_skipped:
        try:
            rows["mmcc"] = _rederive_mmcc(inp, claim, opts)
        except (MfcliError, ValueError, TypeError, KeyError) as exc:
            checks["mmcc"] = SettingCheck("mmcc", UNVERIFIED, claim.epsilons["mmcc"], None,
                                          f"mmcc: cannot re-derive it from the artifact: {_reason(exc)}")
    for s in claim.settings:
        if s in checks:
            continue
        stored = claim.epsilons[s]
        if s == "mmcc" and mmcc_skipped:
            checks[s] = SettingCheck(s, NOT_REDERIVED, stored)
            continue
        row = rows.get(s)
        if row is None:
            checks[s] = SettingCheck(s, UNVERIFIED, stored, None, (
                f"{s}: account computes no {s} row for this operator under {claim.schema.describe(subject.n)} "
                f"with the {claim.sampler} batch sampler"))
            continue
        derived = _number(row.get("epsilon"))
        problem = None
        if derived is None:
            problem = f"{s}: the re-derived epsilon {row.get('epsilon')!r} is not finite: the row guarantees nothing"
        elif stored < derived * (1 - RECORD_RTOL):
            problem = (f"{s}: stored epsilon {stored!r} is below the {derived!r} re-derived from the artifact's "
                       f"{claim.operator} operator")
        if problem is None and row.get("dp_event") is not None:
            text = claim.events.get(s)
            if text is None:
                problem = f"{s}: no stored dp-accounting event (dp_event_{s.replace('-', '_')})"
            else:
                stored_event = _json_value(text)
                diff = None if stored_event is None else _event_difference(stored_event, json.loads(row["dp_event"]))
                if stored_event is None or diff:
                    problem = (f"{s}: the stored dp-accounting event is not the one re-derived from the artifact "
                               f"({diff or 'not readable JSON'})")
        checks[s] = SettingCheck(s, UNVERIFIED if problem else VERIFIED, stored, derived, problem)
    ordered = tuple(checks[s] for s in claim.settings)
    problems += [c.problem for c in ordered if c.problem]
    found = _calibration_problem(attrs, claim, checks)
    if found:
        problems.append(found)
    sensitivity = None
    try:
        # claim_sensitivity's number: the report accounted the record's operator, schema and
        # sampler, and reuses its deterministic row's schema sensitivity when it has one
        sensitivity = report.noise_sensitivity
        problems += _noise_problems(attrs, claim, sensitivity)
    except (MfcliError, ValueError, TypeError, KeyError) as exc:
        problems.append(f"cannot re-derive its sensitivity from the artifact: {_reason(exc)}")
    if problems:
        return RecordCheck(status=UNVERIFIED, problems=tuple(problems), settings=ordered, claim=claim,
                           sensitivity=sensitivity)
    status = NOT_REDERIVED if any(c.status == NOT_REDERIVED for c in ordered) else VERIFIED
    return RecordCheck(status=status, settings=ordered, claim=claim, sensitivity=sensitivity)


def verify_records(records: Iterable[tuple[str, Mapping[str, Any]]], subject: RecordSubject | None, *,
                   deep: bool = False, why_unchecked: str = "") -> list[tuple[str, RecordCheck]]:
    """:func:`verify_record` for each (id, attributes); with no subject (the artifact's operators
    could not be rebuilt) every mfcli.accounting record is unverified with ``why_unchecked``."""
    out = []
    for rid, attrs in records:
        if subject is None and attrs.get("format") == RECORD_FORMAT:
            out.append((rid, RecordCheck(status=UNVERIFIED, problems=(why_unchecked or "cannot be checked",))))
        else:
            out.append((rid, verify_record(attrs, subject, deep=deep) if subject is not None
                        else RecordCheck(status=FOREIGN)))
    return out


def describe_status(check: RecordCheck) -> str:
    """The status in words, as ``mfcli inspect`` shows it."""
    if check.status == NOT_REDERIVED:
        rows = ", ".join(c.setting for c in check.settings if c.status == NOT_REDERIVED)
        return f"{DEEP_HINT}: {rows} above n = {MMCC_REDERIVE_MAX_N}; the other rows re-derived and agree"
    if check.status == VERIFIED:
        return "verified: every row re-derived from the artifact and agrees"
    if check.status == FOREIGN:
        return FOREIGN
    return f"UNVERIFIED: {check.problems[0]}" if check.problems else "UNVERIFIED"


__all__ = [
    "DEEP_HINT",
    "EVENT_RTOL",
    "FOREIGN",
    "MAX_REDERIVE_MIXTURE_RESOLUTION",
    "MIN_REDERIVE_DISCRETIZATION",
    "MMCC_REDERIVE_MAX_N",
    "NOT_REDERIVED",
    "RECORD_FORMAT",
    "RECORD_RTOL",
    "UNVERIFIED",
    "VERIFIED",
    "RecordCheck",
    "RecordClaim",
    "RecordSubject",
    "SettingCheck",
    "accounted_sensitivity",
    "accounting_options",
    "claim_sensitivity",
    "describe_status",
    "plain_value",
    "read_claim",
    "read_records",
    "record_subject",
    "records_in",
    "subject_of",
    "verify_record",
    "verify_records",
]
