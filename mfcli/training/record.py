"""The accounting record a training run follows: which one, whether it verifies, its batch sampler,
its noise (standard deviation and noise multiplier) and the epsilon that holds (docs/training.md).

A record (``accounting/<id>`` of an artifact, written by ``mfcli plan --out`` or ``mfcli account
--write``) accounts one mechanism: the artifact's operator, run for its n steps at noise
standard deviation ``sigma`` on C G (per unit clip norm), with the batches of one sampler at one
rate. Its epsilon describes training only when training runs exactly that, so
:func:`training_record` reads the record, re-verifies its numbers against the operator (as
``mfcli inspect`` does: every stored epsilon is at least the one recomputed from its stored
dp-accounting event and the operator's sensitivity) and hands out what the loop must use.
:func:`check_declared` refuses, in one line, a noise std or noise multiplier, sampler, rate or
batch size that disagrees with it.

Units (as ``mfcli plan`` prints them, docs/plan.md). ``noise_std`` (the record's ``sigma``) is the
standard deviation of the Gaussian noise Z added to C G, per unit clip norm: what 0.2's adapters
called ``noise_multiplier``. The noise multiplier, as Opacus and jax_privacy use it, is
``noise_std / sensitivity``, the sensitivity of the accounted C under the participation the
record's accounting assumes (:func:`accounted_sensitivity`): the largest column norm (one
participation) for a sampled record (Poisson, cyclic Poisson, balls-in-bins, shuffle), the schema
sensitivity for a fixed-order record; for DP-SGD (C = I) the two numbers are equal.
:func:`resolve_noise_std` turns what a caller passes (``noise_std=`` or ``noise_multiplier=``,
with or without a record) into the std to add, and refuses every ambiguous combination.

Samplers. Records that name a batch sampler (``batching``: Poisson, cyclic Poisson, balls-in-bins,
shuffle) get the sampler :func:`mfcli.training.samplers.sampler_for` builds. Records of deterministic
participation (``mfcli plan``'s ``fixed-order`` rows; ``batching`` null) get a
:class:`mfcli.training.samplers.FixedOrderSampler` whose period makes every example take part only in the
steps the record's schema allows (:func:`mfcli.training.samplers.fixed_order_period`).

Epsilon per epoch. The operator is causal (lower triangular), so the model after the first m
steps is post-processing of C[:m, :m] G[:m] + Z[:m]: the same accounting run on that leading block,
under the schema restricted to the epochs done, bounds the privacy of the model released after
each epoch. :meth:`TrainingRecord.epsilon_per_epoch` does that for the DP-SGD, deterministic and
cyclic-Poisson rows (the last epoch is the record's own epsilon); MMCC and the shuffle rows are
given for the whole run only.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from mfcli.errors import MfcliError
from mfcli.services.records import accounted_sensitivity, read_claim
from mfcli.training.noise import AccountedOperator

#: The records' epsilon attribute names and the settings they belong to, for a deterministic
#: record: ``deterministic`` (a multi-participation schema) or ``single-pass`` and, for the binary
#: tree, ``shuffled-tree`` (one participation; the latter is the single-epoch Gaussian bound, valid
#: for any order of the data).
DETERMINISTIC_SETTINGS = ("deterministic", "single-pass", "shuffled-tree")
#: The record's batching attribute as a batch sampler name (deterministic records: fixed order).
FIXED_ORDER = "fixed-order"
#: Relative tolerance for declared numbers (sigma, rate) against the record's: float round-trips only.
RTOL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=RTOL, abs_tol=0.0)


@dataclass(frozen=True)
class TrainingRecord:
    """One verified accounting record, with what training must run to be described by it.

    Attributes:
        artifact: the artifact's path.
        record: the record id (group ``accounting/<id>``).
        sampler: the batch sampler, as ``mfcli plan`` names it (``poisson``, ``cyclic``,
            ``balls-in-bins``, ``shuffle``, ``fixed-order``).
        sigma: the noise std on C G per unit clip norm, as the record stores it (the noise added to
            the summed clipped gradient is sigma * clip * (C^-1 Z)[t]); :attr:`noise_std` names it.
        sensitivity: the sensitivity of the accounted C that :attr:`noise_multiplier` divides by
            (:func:`accounted_sensitivity`).
        delta: the record's delta.
        sampling: the per-step inclusion probability of the Poisson or cyclic sampler (None else).
        n: the steps the artifact covers (and training takes).
        period: the sampler's cycle: the groups b of cyclic Poisson, the fixed-order period, n for
            a one-epoch sampler (balls-in-bins, shuffle); None for Poisson.
        steps_per_epoch: the steps in which the sampler draws N examples in expectation (one
            pass over the data): 1 / rate for Poisson, b / rate for cyclic Poisson, the period
            otherwise; None when that is not a whole number.
        participation: the record's schema (JSON text).
        epsilons: {setting: epsilon} of the record's rows that hold under ``sampler``.
        accounted: the operator the record accounted (its claim's ``operator`` and
            ``strategy_sha256``): the noise stream is built for it (:func:`record_stream`).
        attrs: the record's attributes as stored.
    """

    artifact: Path
    record: str
    sampler: str
    sigma: float
    delta: float
    sampling: float | None
    n: int
    period: int | None
    steps_per_epoch: int | None
    participation: str
    epsilons: dict[str, float]
    sensitivity: float
    accounted: AccountedOperator
    attrs: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def noise_std(self) -> float:
        """The standard deviation of the noise on C G per unit clip norm (the record's ``sigma``;
        0.2's ``noise_multiplier=``): the noise added at step t is noise_std * clip * (C^-1 Z)[t]."""
        return self.sigma

    @property
    def noise_multiplier(self) -> float:
        """noise_std / sensitivity: the noise multiplier as Opacus and jax_privacy use it (what
        ``mfcli plan`` prints as "noise multiplier" for the same row)."""
        return self.sigma / self.sensitivity

    @property
    def epsilon(self) -> float:
        """The smallest epsilon among the rows that hold (each is an upper bound, so the smallest is)."""
        return min(self.epsilons.values())

    @property
    def setting(self) -> str:
        """The accounting row whose epsilon :attr:`epsilon` is."""
        return min(self.epsilons, key=lambda k: self.epsilons[k])

    def epsilon_at(self, delta: float | None = None) -> float:
        """:attr:`epsilon` at ``delta`` (None: the record's). Another delta is refused: the record
        accounts one; re-account with ``mfcli account --delta`` for another."""
        if delta is not None and not _close(delta, self.delta):
            raise MfcliError(f"the accounting record {self.record!r} holds for delta = {self.delta:g}, not {delta!r}; "
                             f"re-account the artifact at that delta (mfcli account --delta ... --write)")
        return self.epsilon

    def epochs(self) -> int | None:
        """Complete passes over the data the n steps make (None when the sampler has no epochs)."""
        if self.steps_per_epoch is None or self.n % self.steps_per_epoch:
            return None
        return self.n // self.steps_per_epoch

    def epsilon_per_epoch(self, delta: float | None = None) -> list[float | None]:
        """Epsilon of the model released after epoch 1, 2, ..., E (upper bounds; see the module
        docstring), at the record's delta. The last entry is :attr:`epsilon`; an entry is None where
        the record's accounting gives no per-epoch number (MMCC, the shuffle rows, or a structured
        artifact too large to materialise). Empty when the sampler has no epochs."""
        self.epsilon_at(delta)
        e = self.epochs()
        if e is None:
            return []
        assert self.steps_per_epoch is not None
        # the operator is read once for all epochs and let go after: a training run keeps the
        # record for its whole length, and a dense C is n x n
        accounted = functools.cache(lambda: _accounted_input_of(self))
        out: list[float | None] = [self._prefix_epsilon(j * self.steps_per_epoch, accounted)
                                   for j in range(1, e)]
        return [*out, self.epsilon]

    def _prefix_epsilon(self, m: int, accounted: Callable[[], Any]) -> float | None:
        """The record's accounting of the first m steps (C[:m, :m], the schema cut to m steps)."""
        from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation, participation_from_json
        from mfcli.services import account as session

        schema = participation_from_json(self.participation)
        if isinstance(schema, FixedEpoch):
            if m % schema.steps_per_epoch(self.n):
                return None
        elif not isinstance(schema, MinSeparation) and not (
                isinstance(schema, SingleParticipation) and self.sampler == "poisson"):
            return None
        import json

        try:
            row = json.loads(session.read_chunked(self.attrs, "results") or "{}")
        except ValueError:
            row = {}
        best: float | None = None
        for setting in self.epsilons:
            disc = float((row.get(setting) or {}).get("value_discretization", session.DEFAULT_DISCRETIZATION)) \
                if isinstance(row, dict) else session.DEFAULT_DISCRETIZATION
            if setting == "dp-sgd":
                eps = _dpsgd_epsilon(self.sigma, float(self.sampling or 0.0), m, self.delta, disc)
            elif setting in ("deterministic", "cyclic-poisson"):
                from mfcli.accounting.prefix import prefix_epsilon

                inp = accounted()
                if inp is None:
                    continue
                # the prefix's own sensitivity under the schema cut to m steps (docs/accounting.md)
                eps = prefix_epsilon(np.asarray(inp.strategy), m=m, setting=setting, sigma=self.sigma, schema=schema,
                                     delta=self.delta, sampling=self.sampling, release_steps=inp.release_steps,
                                     value_discretization=disc).epsilon
            else:
                continue
            best = eps if best is None else min(best, eps)
        return best


def _accounted_input_of(rec: TrainingRecord) -> Any:
    """The operator the record accounted, as a dense StrategyInput; None when it is not available
    as a matrix (a structured artifact above the materialisation limit) or is not the record's
    (its identity hash differs)."""
    from mfcli.io.artifact import load_any_artifact
    from mfcli.services.records import subject_of

    # the artifact's operators by label, as the record verifier reads them: no branch on the kind
    subject = subject_of(load_any_artifact(rec.artifact))
    op = subject.operators.get(str(rec.attrs.get("operator", "dense")))
    if op is None:
        return None
    inp = subject.make_input(op, True)
    if not inp.dense:
        return None
    if inp.operator_sha256 is not None and inp.operator_sha256 != rec.attrs.get("strategy_sha256"):
        return None
    return inp


def _dpsgd_epsilon(sigma: float, sampling: float, steps: int, delta: float, discretization: float) -> float:
    """DP-SGD's epsilon: ``steps`` Poisson-sampled Gaussians, dp-accounting's pessimistic
    ``PLDAccountant`` value bit for bit (:func:`mfcli.accounting.single_pass.dpsgd`, the one DP-SGD
    accountant of ``mfcli account``, without importing dp-accounting)."""
    from mfcli.accounting.single_pass import dpsgd

    return dpsgd(sigma=sigma, sampling=sampling, steps=steps, delta=delta, value_discretization=discretization).epsilon


def _num(v: Any) -> float | None:
    if v in (None, "null"):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _settings(attrs: dict[str, Any]) -> list[str]:
    import json

    raw = attrs.get("settings")
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        parsed = [raw]
    return [str(x) for x in (parsed if isinstance(parsed, list) else [parsed])]


def _pick(path: Path, record: str | None) -> tuple[str, dict[str, Any], tuple[Any, Any] | None]:
    """The record to train under, its attributes and, when picking it verified it, the verifier's
    (check, subject): ``record`` by id; else the newest record that names a batch sampler when the
    records that do all agree (:func:`mfcli.training.samplers.verified_record`, which verifies it), else the
    newest record (deterministic participation)."""
    from mfcli.training.samplers import accounting_records, verified_record

    records = accounting_records(path)
    if not records:
        raise MfcliError(f"{path} has no accounting record; write one with mfcli plan --out or mfcli account --write")
    if record is not None:
        if record not in records:
            raise MfcliError(f"{path} has no accounting record {record!r}; it has {', '.join(records)}")
        return record, records[record], None
    if any(a.get("batching") not in (None, "null") for a in records.values()):
        rid, check, subject = verified_record(path)
        return rid, records[rid], (check, subject)
    rid = list(records)[-1]
    return rid, records[rid], None


def training_record(artifact: str | Path, record: str | None = None, *, verify_record: bool = True) -> TrainingRecord:
    """The record training follows (by id, or :func:`_pick`'s choice), verified against the operator.

    Raises:
        MfcliError: no such record; it does not verify; it holds no epsilon for its sampler; its
            schema has no fixed order (deterministic records).
    """
    from mfcli.io.artifact import load_any_artifact
    from mfcli.model.participation import SingleParticipation, participation_from_json
    from mfcli.training.samplers import (
        HELD_SETTINGS,
        accounted_operator,
        fixed_order_period,
        held_epsilons,
        held_epsilons_of,
        verified_record,
    )

    path = Path(artifact)
    # the record is re-derived once (deeply: MMCC too) and what it gave is reused below
    rid, attrs, verified = _pick(path, record)
    if verify_record and verified is None:
        _, check, subject = verified_record(path, rid)
        verified = (check, subject)
    # the verifier's subject was read from the same file: its n, without opening it again
    n = int(verified[1].n) if verified is not None else int(load_any_artifact(path).n)
    sigma, delta = _num(attrs.get("sigma")), _num(attrs.get("delta"))
    if sigma is None or delta is None:
        raise MfcliError(f"accounting record {rid!r} of {path} stores no sigma or delta")
    participation = str(attrs.get("participation") or '{"kind": "single", "version": 1}')
    schema = participation_from_json(participation)
    batching = attrs.get("batching")
    sampling = _num(attrs.get("sampling"))
    if batching in (None, "null"):
        sampler = FIXED_ORDER
        period = fixed_order_period(schema, n)
        if period is None:
            raise MfcliError(f"accounting record {rid!r} of {path} accounts {schema.describe(n)}, which no fixed order of "
                             "batches realises (a min-separation cap below ceil(n / b))")
        present = set(_settings(attrs))
        names = ("deterministic",) if not isinstance(schema, SingleParticipation) else DETERMINISTIC_SETTINGS
        epsilons = {s: float(v) for s in names
                    if s in present and (v := _num(attrs.get(f"epsilon_{s.replace('-', '_')}"))) is not None}
        sampling = None
    else:
        sampler = str(batching)
        if sampler not in HELD_SETTINGS:
            raise MfcliError(f"accounting record {rid!r} names batch sampler {sampler!r}, which mfcli has no sampler for")
        # held_epsilons verifies the record itself when it has not been verified above
        epsilons = held_epsilons_of(*verified) if verified is not None else held_epsilons(path, rid)[1]
        period = _period(sampler, schema, n)
    if not epsilons:
        raise MfcliError(f"no row of accounting record {rid!r} of {path} holds under its {sampler} batch sampler; "
                         "re-account with the row of that sampler (mfcli account --batching ... --write)")
    # the verifier re-derived the sensitivity with the record; compute it only when it did not run
    derived = verified[0].sensitivity if verified is not None else None
    sensitivity = derived if derived is not None else accounted_sensitivity(
        attrs, verified[1] if verified is not None else None, path)
    if verified is None and sampler == FIXED_ORDER:
        _check_fixed_order_epsilons(epsilons, sigma=sigma, delta=delta, sensitivity=sensitivity,
                                    where=f"accounting record {rid!r} of {path}")
    # the operator of the claim the verifier checked (else the claim as the verifier would read it)
    claim, problems = (verified[0].claim, []) if verified is not None else read_claim(attrs)
    if claim is None:
        raise MfcliError(f"accounting record {rid!r} of {path} is malformed: {problems[0]}")
    return TrainingRecord(artifact=path, record=rid, sampler=sampler, sigma=sigma, delta=delta, sampling=sampling,
                          n=n, period=period, steps_per_epoch=_steps_per_epoch(sampler, period, sampling),
                          participation=participation, epsilons=epsilons, sensitivity=sensitivity,
                          accounted=accounted_operator(rid, claim), attrs=dict(attrs))


def _check_fixed_order_epsilons(epsilons: dict[str, float], *, sigma: float, delta: float, sensitivity: float,
                                where: str) -> None:
    """Refuse a fixed-order record whose stored epsilon is below the one its own sigma gives, when
    the full verification was skipped (``verify_record=False``): a record is never taken at its word.

    Under fixed-order participation every row a training run may use (single-pass, deterministic,
    shuffled-tree: :data:`DETERMINISTIC_SETTINGS`) is the Gaussian mechanism at noise multiplier
    sigma / sensitivity, with the sensitivity re-derived from the operator (the schema's, an upper
    bound where it is not exact; the largest column norm under one participation), so the check
    costs one analytic-Gaussian inversion instead of the full re-derivation. A forged sigma, or a
    forged epsilon, below the accounted one is caught; the sampled records' epsilons are re-derived
    whether or not verification runs (:func:`mfcli.training.samplers.held_epsilons`)."""
    from mfcli.accounting.single_pass import check_delta, gaussian_epsilon

    if not (math.isfinite(sigma) and sigma > 0):
        raise MfcliError(f"{where} stores sigma = {sigma!r}; a record needs a finite positive sigma")
    floor = gaussian_epsilon(check_delta(delta), sensitivity / sigma)
    for name, eps in epsilons.items():
        # the stored value was computed by the same inversion: only float round-trips may separate them
        if not eps >= floor * (1 - 1e-9):
            raise MfcliError(f"{where} claims {name} epsilon {eps!r}, but sigma = {sigma!r} over the operator's "
                             f"re-derived sensitivity {sensitivity!r} gives epsilon {floor!r} at delta {delta!r}: the "
                             "record does not describe this artifact")


#: The one line that refuses ``noise_multiplier=`` without an accounting record.
NO_RECORD_MULTIPLIER = (
    "noise_multiplier= is the noise std divided by the sensitivity of the C that runs, known only from a verified "
    "accounting record: pass record= with it, or pass noise_std= (the std of the noise on C G per unit clip norm, "
    "what mfcli 0.2's noise_multiplier= meant)")


def _check_noise_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or value < 0:
        raise MfcliError(f"{name} must be a finite non-negative number, got {value!r}")
    return float(value)


def resolve_noise_std(*, noise_std: Any = None, noise_multiplier: Any = None, record: TrainingRecord | None = None,
                      required: bool = True) -> float | None:
    """The noise std on C G to add, from what a caller passed (module docstring, "Units").

    =====================  ===============  ============================================
    passed                 record           result
    =====================  ===============  ============================================
    both                   any              refused (one or the other)
    noise_std              none             noise_std
    noise_multiplier       none             refused (:data:`NO_RECORD_MULTIPLIER`)
    neither                none             refused when ``required``, else None
    noise_std              a record         the record's std, if equal (else refused)
    noise_multiplier       a record         the record's std, if the multiplier is the
                                            record's noise_multiplier (else refused)
    neither                a record         the record's noise_std
    =====================  ===============  ============================================

    Raises:
        MfcliError: as the table says; a value that is not a finite non-negative number.
    """
    if noise_std is not None and noise_multiplier is not None:
        raise MfcliError("pass noise_std= or noise_multiplier=, not both (noise_multiplier = noise_std / sensitivity)")
    std = None if noise_std is None else _check_noise_number("noise_std", noise_std)
    mult = None if noise_multiplier is None else _check_noise_number("noise_multiplier", noise_multiplier)
    if record is None:
        if mult is not None:
            raise MfcliError(NO_RECORD_MULTIPLIER)
        if std is None and required:
            raise MfcliError("pass noise_std= (the std of the noise on C G per unit clip norm, what mfcli 0.2's "
                             "noise_multiplier= meant) or an accounting record (record=)")
        return std
    check_noise(record, noise_std=std, noise_multiplier=mult)
    return record.noise_std


def check_noise(rec: TrainingRecord, *, noise_std: float | None = None, noise_multiplier: float | None = None) -> None:
    """Refuse, in one line, a declared noise std or noise multiplier that is not the record's."""
    where = f"accounting record {rec.record!r} of {rec.artifact}"
    if noise_std is not None and noise_multiplier is not None:
        raise MfcliError("pass noise_std= or noise_multiplier=, not both (noise_multiplier = noise_std / sensitivity)")
    if noise_std is not None and not _close(noise_std, rec.noise_std):
        raise MfcliError(f"noise_std={noise_std!r} but {where} accounts noise std {rec.noise_std!r} on C G "
                         f"(noise multiplier {rec.noise_multiplier:.6g} = std / sensitivity {rec.sensitivity:.6g}): the "
                         "epsilon would describe another noise level; omit it to train at the record's")
    if noise_multiplier is not None and not _close(noise_multiplier, rec.noise_multiplier):
        raise MfcliError(f"noise_multiplier={noise_multiplier!r} but {where} accounts noise multiplier "
                         f"{rec.noise_multiplier!r} (noise std {rec.noise_std:.6g} on C G / sensitivity "
                         f"{rec.sensitivity:.6g}): the epsilon would describe another noise level; omit it to train at "
                         "the record's")


def record_stream(rec: TrainingRecord, *, d: int, seed: int, dtype: Any = "float32") -> Any:
    """The gradient noise stream of the operator ``rec`` accounted (:func:`mfcli.training.noise.noise_stream`
    with ``accounted=``): its ``sigma`` scales these rows. ``rec`` comes from
    :func:`training_record`, which verified the record (unless told not to)."""
    from mfcli.training.noise import noise_stream

    return noise_stream(rec.artifact, kind="gradient", d=d, seed=seed, dtype=dtype, accounted=rec.accounted)


def _steps_per_epoch(sampler: str, period: int | None, sampling: float | None) -> int | None:
    if sampler in ("poisson", "cyclic"):
        if not sampling:
            return None
        steps = (period or 1) / sampling if sampler == "cyclic" else 1.0 / sampling
        whole = round(steps)
        return whole if whole >= 1 and abs(steps - whole) <= 1e-9 * steps else None
    return period


def _period(sampler: str, schema: Any, n: int) -> int | None:
    if sampler in ("balls-in-bins", "shuffle"):
        return n
    if sampler == "cyclic":
        from mfcli.accounting.multi import cycle_length

        return cycle_length(schema, n)
    return None


def build_sampler(rec: TrainingRecord, *, examples: int, seed: int, non_adaptive: bool = False) -> Any:
    """The batch sampler ``rec`` accounts, over ``examples`` examples (a :mod:`mfcli.training.samplers` sampler)."""
    from mfcli.training.samplers import FixedOrderSampler, sampler_for

    if rec.sampler == FIXED_ORDER:
        assert rec.period is not None
        return FixedOrderSampler(examples=examples, steps=rec.n, seed=seed, period=rec.period)
    return sampler_for(rec.artifact, examples=examples, seed=seed, record=rec.record, non_adaptive=non_adaptive)


def check_clip_norm(clip_norm: Any) -> float:
    """The per-example clipping norm a trainer declares: a positive finite number (the record's
    noise std is per unit of it)."""
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)) or not math.isfinite(clip_norm) \
            or clip_norm <= 0:
        raise MfcliError(f"clip_norm must be a positive finite number, got {clip_norm!r}")
    return float(clip_norm)


class RecordOptions(TypedDict, total=False):
    """Which accounting record a trainer's ``make_private`` (:func:`mfcli.training.torch.make_private`,
    :func:`mfcli.training.jax.make_private`) trains under, and the numbers its caller declares about
    it: the keyword options of :func:`declared_batches`, which both pass on unchanged, so that the
    defaults stay there alone (mypy checks the two agree).

    Keys:
        record: the record id; None (default) picks as :func:`training_record`.
        noise_std, noise_multiplier, sampler, sample_rate, batch_size: optional declarations, each
            checked against the record (:func:`check_declared`): ``noise_std`` is the std of the
            noise on C G per unit clip norm (the record's ``noise_std``), ``noise_multiplier`` that
            over the record's accounted sensitivity (its ``noise_multiplier``, as Opacus and
            jax_privacy count it); pass at most one.
        non_adaptive: allow a balls-in-bins record (its tree row assumes contributions fixed in
            advance); default False.
        verify: re-verify the record against the operator first (default True; seconds for n ~ 10^3).
            False skips the full re-derivation only: a sampled record's epsilons are re-derived
            anyway, and a fixed-order record's against its sigma and the re-derived sensitivity.
    """

    record: str | None
    noise_std: float | None
    noise_multiplier: float | None
    sampler: str | None
    sample_rate: float | None
    batch_size: int | None
    non_adaptive: bool
    verify: bool


def declared_batches(artifact: str | Path, *, examples: int, seed: int, record: str | None = None,
                     noise_std: float | None = None, noise_multiplier: float | None = None, sampler: str | None = None,
                     sample_rate: float | None = None, batch_size: int | None = None, non_adaptive: bool = False,
                     verify: bool = True) -> tuple[TrainingRecord, Any, int]:
    """What a trainer's ``make_private`` (torch, JAX) runs: the record (:func:`training_record`),
    refused unless every declared number is its own (:func:`check_declared`), its batch sampler
    over ``examples`` (:func:`build_sampler`) and the expected batch size (at least 1) that the
    summed clipped gradients and the noise are divided by. The keyword options after ``seed`` are
    :class:`RecordOptions`."""
    rec = training_record(artifact, record, verify_record=verify)
    check_declared(rec, examples=examples, noise_std=noise_std, noise_multiplier=noise_multiplier, sampler=sampler,
                   sample_rate=sample_rate, batch_size=batch_size)
    batches = build_sampler(rec, examples=examples, seed=seed, non_adaptive=non_adaptive)
    return rec, batches, max(1, round(batches.expected_batch_size(0)))


def check_declared(rec: TrainingRecord, *, examples: int, noise_std: float | None = None,
                   noise_multiplier: float | None = None, sampler: str | None = None, sample_rate: float | None = None,
                   batch_size: int | None = None, steps: int | None = None) -> None:
    """Refuse, in one line, a declared number that is not the record's: the epsilon would describe
    another mechanism than the one trained.

    ``batch_size`` is the planned batch: for Poisson it fixes the rate batch / examples, for
    cyclic Poisson the expected batch examples x rate / b, and for the one-pass samplers (fixed
    order, balls-in-bins, shuffle) the steps of a pass, ceil(examples / batch).
    """
    where = f"accounting record {rec.record!r} of {rec.artifact}"
    resolve_noise_std(noise_std=noise_std, noise_multiplier=noise_multiplier, record=rec)
    if sampler is not None and sampler != rec.sampler:
        raise MfcliError(f"sampler={sampler!r} but {where} accounts the {rec.sampler} batch sampler")
    if steps is not None and steps != rec.n:
        raise MfcliError(f"steps={steps!r} but {where} accounts the artifact's n = {rec.n} steps")
    if sample_rate is not None:
        if rec.sampling is None:
            raise MfcliError(f"sample_rate={sample_rate!r} but {where} accounts {rec.sampler} batches, which have no "
                             "sampling rate")
        if not _close(sample_rate, rec.sampling):
            raise MfcliError(f"sample_rate={sample_rate!r} but {where} accounts rate {rec.sampling!r}")
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise MfcliError(f"batch_size must be a positive integer, got {batch_size!r}")
        if rec.sampler == "poisson":
            assert rec.sampling is not None
            if not _close(batch_size / examples, rec.sampling):
                raise MfcliError(f"batch_size={batch_size} over {examples} examples is Poisson rate "
                                 f"{batch_size / examples:.6g}, but {where} accounts rate {rec.sampling:.6g}")
        elif rec.sampler == "cyclic":
            assert rec.sampling is not None and rec.period is not None
            implied = batch_size * rec.period / examples
            if not _close(implied, rec.sampling):
                raise MfcliError(f"batch_size={batch_size} over {examples} examples in {rec.period} groups is rate "
                                 f"{implied:.6g} per group member, but {where} accounts rate {rec.sampling:.6g}")
        elif rec.period is not None and math.ceil(examples / batch_size) != rec.period:
            raise MfcliError(f"batch_size={batch_size} over {examples} examples makes {math.ceil(examples / batch_size)} "
                             f"batches per pass, but {where} accounts {rec.period} ({rec.sampler})")


def plan_and_write(*, examples: int, batch_size: int, epochs: int, epsilon: float, delta: float, workload: str,
                   beta: float | None, params: int, artifact: str | Path, batching: Sequence[str] | None = None,
                   bands: Sequence[int] | None = None, workers: int | None = 0, force: bool = False,
                   candidate: str | None = None, command: str = "",
                   progress: Callable[[str], None] | None = None) -> tuple[Any, str]:
    """``mfcli plan``'s library path: plan the setup (:func:`mfcli.services.plan.make_plan`), write the
    recommended candidate (or the ranked one named ``candidate``, e.g. ``dp-sgd``) with its
    accounting record (:func:`mfcli.services.plan.write_artifact`, which re-accounts it on the written
    file). ``batching`` defaults to every sampler whose rows hold for adaptive training.

    Returns:
        (the :class:`mfcli.services.plan.Plan`, the written record's id).

    Raises:
        MfcliError: as ``mfcli plan``; no recommendation; no ranked candidate ``candidate``.
    """
    from mfcli.services.plan import SAMPLERS, TrainingSetup, make_plan, write_artifact

    allowed = tuple(batching) if batching is not None else tuple(s for s in SAMPLERS if s != "balls-in-bins")
    setup = TrainingSetup(examples=examples, batch=batch_size, epsilon=epsilon, epochs=epochs, delta=delta,
                          workload=workload, beta=0.9 if beta is None else beta, params=max(params, 1),
                          batching=allowed, bands=tuple(bands) if bands is not None else None)
    plan = make_plan(setup, workers=workers, progress=progress)
    if candidate is None:
        chosen = plan.recommended
        if chosen is None:
            raise MfcliError(f"mfcli plan recommends no candidate for this setup (none holds for adaptive training at "
                             f"n = {setup.n}); allow other batch samplers")
    else:
        found = [r for r in plan.ranked if r.key == candidate]
        if not found:
            raise MfcliError(f"the plan has no candidate {candidate!r}; it ranked {', '.join(r.key for r in plan.ranked)}")
        chosen = found[0]
    written = write_artifact(setup, chosen, artifact, force=force, command=command)
    return plan, str(written["record"]).rsplit("/", 1)[-1]


__all__ = ["FIXED_ORDER", "NO_RECORD_MULTIPLIER", "RecordOptions", "TrainingRecord", "accounted_sensitivity", "build_sampler",
           "check_declared", "check_noise", "plan_and_write", "resolve_noise_std", "training_record"]
