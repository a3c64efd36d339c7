"""An accounting session: resolve the strategy (and the operator that runs), account it in every
setting that applies, calibrate sigma, record the result in the artifact and verify records.

Results are typed (:class:`AccountingReport` holds one result object per setting); ``as_dict``
builds the JSON at the boundary. ``mfcli/cli/account.py`` only parses options and renders.

* :func:`resolve_strategy` - an artifact, a .npy C, a built-in strategy, or the documented default
  (the shipped artifact ``momentum-n256``);
* :func:`account` - every setting at one sigma, as an :class:`AccountingReport`;
* :func:`calibrate` - the smallest sigma for one setting at a target epsilon;
* :func:`record_to_artifact` - ``account --write``: a group ``accounting/<id>`` in the artifact
  (layout in docs/accounting.md), matrices untouched.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from mfcli.accounting.calibrate import Calibration, calibrate_sigma
from mfcli.accounting.defaults import (
    BATCHING_SETTINGS,
    BATCHINGS,
    BUILTIN,
    DEFAULT_ARTIFACT,
    GUARANTEE_SETTINGS,
    REFERENCE_SETTINGS,
    SAMPLED_BATCHINGS,
    SETTINGS,
)
from mfcli.accounting.events import event_to_json
from mfcli.accounting.mmcc import (
    DEFAULT_MIXTURE_RESOLUTION,
    DEFAULT_TAIL_FRACTION,
    FullParticipationResult,
    LowerBoundResult,
    MMCCResult,
    full_participation,
    lower_bound,
    mmcc,
    prepare_strategy,
)
from mfcli.accounting.multi import (
    CyclicPoissonResult,
    DeterministicResult,
    deterministic,
    reduced_dpsgd,
    schema_dict,
)
from mfcli.accounting.reduction import ReductionResult, reduction
from mfcli.accounting.single_pass import (
    DEFAULT_DELTA,
    DEFAULT_DISCRETIZATION,
    DpSgdResult,
    SinglePassResult,
    check_delta,
    check_discretization,
    check_sampled_noise_multiplier,
    check_sampling,
    check_sigma,
    dpsgd,
    single_pass,
)
from mfcli.errors import MfcliError
from mfcli.model.participation import Participation, SingleParticipation
from mfcli.model.record_format import ATTR_CHUNK, RECORD_FORMAT, read_chunked, write_chunked
from mfcli.util.progress import ProgressCallback
from mfcli.util.rows import fields_of

if TYPE_CHECKING:  # the balls-in-bins and shuffling accountants are imported where they run: the
    # default Poisson account uses neither
    from mfcli.accounting.balls_in_bins import BallsInBinsDpSgdResult, BallsInBinsTreeResult
    from mfcli.accounting.shuffled_tree import ShuffledTreeResult
    from mfcli.accounting.shuffling import ShuffledDpSgdResult


@dataclass(frozen=True)
class StrategyInput:
    """The strategy being accounted.

    Attributes:
        name: strategy name (identity, tree, sqrt, optimal, the artifact's stored name, or the
            structured kind).
        strategy: C as given (m x n) where it is at hand: the mechanism's
            :meth:`~mfcli.strategies.operators.Mechanism.accounting_matrix`; empty (0 x 0) where the
            mechanism has none (a structured strategy above its dense limit).
        release_steps: t(r) for every row of ``strategy`` (empty with it).
        source: where it came from, in words.
        artifact: the artifact path when the input was one (``--write`` needs it).
        is_tree: C is the binary-tree encoder (the shuffled-tree setting applies).
        operator: which operator of an artifact C belongs to, as :func:`mfcli.strategies.operators.select_operator`
            chose it (the one a noise stream streams): its ``label`` (``"dense"``,
            ``"compressed (band K, rank R)"``, ``"blt (theta 3, omega 3)"``); ``"dense"`` for a
            .npy matrix or a built-in strategy.
        operator_sha256: the operator's ``identity_sha256`` (hash of the stored arrays that define
            it) for an artifact; None for a .npy matrix or a built-in strategy.
        participation: the schema the artifact declares (attribute ``participation``); single
            participation for a v1 artifact, a .npy matrix or a built-in strategy.
        mechanism: the :class:`mfcli.strategies.operators.Mechanism` every number is computed from (its
            sensitivities, cyclic numbers, causality); by default the
            :class:`~mfcli.strategies.operators.MatrixStrategy` of ``strategy``.
    """

    name: str
    strategy: np.ndarray
    release_steps: np.ndarray
    source: str
    artifact: Path | None = None
    is_tree: bool = False
    operator: str = "dense"
    operator_sha256: str | None = None
    participation: Participation = field(default_factory=SingleParticipation)
    mechanism: Any = None

    def __post_init__(self) -> None:
        if self.mechanism is None:
            from mfcli.strategies.operators import MatrixStrategy

            object.__setattr__(self, "mechanism", MatrixStrategy(np.asarray(self.strategy),
                                                                 np.asarray(self.release_steps)))

    @property
    def n(self) -> int:
        return int(self.mechanism.n)

    @property
    def has_matrix(self) -> bool:
        """Whether C is at hand as a matrix, so the settings that need it can run (a capability of
        the mechanism, ``max_n["matrix"]``, not a kind)."""
        return self.strategy.size > 0

    @property
    def dense(self) -> bool:
        """The former name of :attr:`has_matrix`."""
        return self.has_matrix

    @property
    def sensitivity(self) -> float:
        """Single-participation sensitivity (max column norm of C)."""
        return float(self.mechanism.sensitivity)


def noise_sensitivity(inp: StrategyInput, schema: Participation, *, fixed_order: bool) -> float:
    """The sensitivity a noise multiplier divides by: noise_multiplier = noise std on C G / this
    (the convention of Opacus and jax_privacy; docs/accounting.md, "Noise convention"). The one
    definition, for ``account``, its calibration, records and their verifier, and the training
    records (:func:`mfcli.services.records.accounted_sensitivity`):

    * fixed-order (deterministic) participation under a multi-participation schema
      (``fixed_order`` and a schema other than single participation): the schema sensitivity of C
      (:meth:`mfcli.strategies.operators.Mechanism.schema_sensitivity`, an upper bound where it is not
      exact), the number the deterministic accounting scales by;
    * every other setting (one participation, or a batch sampler): the largest column norm of C,
      the number the single-pass, MMCC, DP-SGD-reduction and cyclic-Poisson accountings scale by.
      C = I gives 1: DP-SGD's noise multiplier is its std.

    Computed from the input's mechanism, never read from a stored attribute."""
    if fixed_order and not isinstance(schema, SingleParticipation):
        return float(inp.mechanism.schema_sensitivity(schema).value)
    return float(inp.sensitivity)


def noise_sensitivity_of(schema: Participation, *, fixed_order: bool) -> str:
    """What :func:`noise_sensitivity` is for these arguments, in words (tables and JSON)."""
    if fixed_order and not isinstance(schema, SingleParticipation):
        return "the schema sensitivity of C (fixed-order participation)"
    return "the largest column norm of C"


def resolve_strategy(
    path: str | Path | None = None,
    *,
    strategy: str | None = None,
    n: int | None = None,
    workload: str = "prefix",
    beta: float = 0.9,
    tol: float = 1e-6,
    operator: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> StrategyInput:
    """Find C: an artifact or .npy file, a built-in strategy for the ``workload`` of n steps, or
    (nothing given) the shipped artifact ``momentum-n256``.

    For an artifact, C is the strategy of the operator :func:`mfcli.strategies.operators.select_operator`
    picks for ``operator`` (``auto``: the compressed C^ = B^-1 A when the artifact has a
    ``compressed`` group, as noise streams and the adapters stream it; else the dense C), so
    the epsilon describes the mechanism that runs. ``compressed`` without such a group, or for a
    .npy matrix or built-in strategy, is an error.

    Raises:
        MfcliError: both a file and a built-in strategy, a built-in without n, an unknown name, a file that
            is neither an artifact nor a .npy matrix, a non-square .npy C.
    """
    from mfcli.io.artifact import shipped_artifact
    from mfcli.strategies.operators import check_operator_choice, select_operator

    say = progress or (lambda s: None)
    check_operator_choice(operator)
    if path is not None and strategy is not None:
        raise MfcliError("give either a strategy file (path) or a built-in strategy, not both")
    if operator == "compressed" and (strategy is not None or (path is not None and Path(path).suffix.lower() == ".npy")):
        raise MfcliError(
            "operator 'compressed' needs an artifact with a compressed decoder, not a .npy matrix or a built-in strategy"
        )
    if strategy is not None:
        if strategy not in BUILTIN:
            raise MfcliError(f"unknown strategy {strategy!r}; choose from {', '.join(BUILTIN)}")
        if n is None:
            raise MfcliError(f"the built-in strategy {strategy} needs n (the number of steps)")
        from mfcli.model.kinds import ANY_N_BASELINES, SOLVED
        from mfcli.model.workloads import build_workload
        from mfcli.strategies.baselines import build_strategy
        from mfcli.util.limits import DENSE_MAX_N

        # above the dense limit, a baseline with a form of any n runs that form (the registry says which)
        if strategy in ANY_N_BASELINES and n > DENSE_MAX_N:
            return _any_n_baseline(strategy, n=n, workload=workload, beta=beta)
        w = build_workload(workload, n, beta=beta)
        if strategy in SOLVED:
            say(f"solving for the {strategy} factorization of the {w.name} workload, n = {w.n}")
        st = build_strategy(strategy, w, tol=tol)
        c = np.asarray(st.factorization.strategy, dtype=np.float64)
        return StrategyInput(
            name=strategy, strategy=c, release_steps=np.asarray(st.release_steps),
            source=f"built-in strategy {strategy} for the {w.name} workload, n = {w.n}",
            is_tree=st.is_tree,
        )
    default = path is None
    if path is None:
        path = shipped_artifact(DEFAULT_ARTIFACT)
    p = Path(path)
    if not p.exists():
        raise MfcliError(f"{p} does not exist")
    from mfcli.util.validation import regular_file

    regular_file(p, "strategy file")  # a FIFO would block np.load and h5py
    if p.suffix.lower() == ".npy":
        try:
            c = np.load(p, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            why = str(exc).splitlines()[0] if str(exc) else "empty or truncated file"
            raise MfcliError(f"cannot read {p} as a .npy matrix: {why}") from None
        raw = np.asarray(c)
        if np.iscomplexobj(raw):
            raise MfcliError(f"{p} holds a complex matrix; C must be real")
        if not np.issubdtype(raw.dtype, np.number) or raw.ndim != 2:
            raise MfcliError(f"{p} must hold a 2-D numeric matrix C")
        c = np.asarray(raw, dtype=np.float64)
        if c.size == 0:
            raise MfcliError(f"{p} holds an empty matrix")
        if not np.all(np.isfinite(c)):
            raise MfcliError(f"{p}: C contains NaN or inf")
        from mfcli.strategies.operators import tree_release

        tr = tree_release(c)
        if tr is not None:
            return StrategyInput(name="tree", strategy=c, release_steps=tr, source=f"matrix C from {p} (binary tree)",
                                 is_tree=True)
        if c.shape[0] != c.shape[1]:
            raise MfcliError(
                f"{p}: C is {c.shape[0]} x {c.shape[1]}; a .npy strategy must be square (row t released at step t)"
            )
        return StrategyInput(name="custom", strategy=c, release_steps=np.arange(c.shape[0]), source=f"matrix C from {p}")
    from mfcli.io.artifact import load_any_artifact

    art = load_any_artifact(p)
    chosen = select_operator(art, operator)
    name, source = _artifact_names(art, chosen, f"shipped artifact {DEFAULT_ARTIFACT} ({p})" if default
                                   else f"artifact {p}")
    return operator_input(p, chosen, name=name, participation=art.participation, source=source)


def _artifact_names(art: Any, op: Any, what: str) -> tuple[str, str]:
    """(strategy name, where it came from in words) of a loaded artifact, as account prints them.
    One of the two kind branches outside artifact I/O, because it reads the artifact's stored
    names: the two layouts name their strategy and workload differently (a dense one by stored
    names, a structured one by its kind and workload filter), and these texts are in the JSON."""
    if not hasattr(art, "schema_sensitivity"):  # a dense artifact (mfcli.io.artifact.Artifact)
        return art.strategy_name, f"{what}: {art.strategy_name} strategy for the {art.workload_name} workload, n = {art.n}"
    why = "" if op.no_matrix_reason is None else " (accounted from its parameters: no dense C)"
    return op.kind, f"{what}: {op.label} strategy for the {art.workload.describe()} workload, n = {op.n}{why}"


def operator_input(path: Path, op: Any, *, name: str, participation: Participation, source: str,
                   with_matrix: bool = True) -> StrategyInput:
    """The accounting input of an operator of any kind of the artifact at ``path`` (a
    :class:`mfcli.strategies.operators.Mechanism`: C = its accounting matrix, released row by row or as the
    binary tree's nodes close), as ``mfcli account`` and the record verifier
    (:mod:`mfcli.services.records`) both account it. A mechanism that builds C on demand (a
    structured one, ``max_n["matrix"]`` set) builds it only ``with_matrix`` and where n allows.

    Raises:
        MfcliError: a non-square strategy that is not the binary tree.
    """
    c = op.accounting_matrix() if with_matrix or op.max_n.get("matrix") is None else None
    if c is None:
        c, release = np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
    else:
        try:
            release = np.asarray(op.release_steps)
        except MfcliError as exc:
            raise MfcliError(f"{path}: {exc}") from None
    return StrategyInput(name=name, strategy=c, release_steps=release, source=source, artifact=path,
                         is_tree=bool(op.is_tree), operator=op.label, operator_sha256=op.identity_sha256,
                         participation=participation, mechanism=op)


def resolve_schema(inp: StrategyInput, requested: Participation | None) -> Participation:
    """The participation schema to account: ``requested``, or the one the input declares.

    An artifact that declares a multi-participation schema is accounted under that schema only: a
    different request (single participation included) would describe another training run than
    the one the artifact was made for, and could understate its privacy loss, so it is refused.
    An artifact that declares single participation (or a .npy matrix, a built-in strategy) may be
    accounted under any schema: the sensitivity is recomputed for the schema asked for.

    Raises:
        MfcliError: the request contradicts the artifact's declared schema, or does not fit n.
    """
    from mfcli.model.participation import declared_or_requested

    schema = declared_or_requested(inp.participation, requested, str(inp.artifact or inp.name), inp.n)
    schema.check(inp.n)
    return schema


def check_batching(batching: str | None, sampling: float | None) -> str | None:
    """The batch sampler: None without a sampling rate and without a named sampler; ``poisson``
    by default with a rate; one of ``BATCHINGS`` otherwise (``SAMPLED_BATCHINGS`` need a rate,
    the others refuse one).

    Raises:
        MfcliError: an unknown batch sampler, or one named without a sampling rate.
    """
    if batching is None:
        return None if sampling is None else "poisson"
    if batching not in BATCHINGS:
        raise MfcliError(f"unknown batch sampler {batching!r}; choose from {', '.join(BATCHINGS)}")
    if batching in SAMPLED_BATCHINGS and sampling is None:
        raise MfcliError(f"the {batching} batch sampler needs a sampling rate")
    if batching not in SAMPLED_BATCHINGS and sampling is not None:
        raise MfcliError(f"a sampling rate means Poisson sampling; the {batching} batch sampler does not sample at a rate")
    return batching


def check_setting_applies(inp: StrategyInput, setting: str) -> None:
    """Refuse a setting whose assumptions fail for the operator being accounted, in one line,
    instead of accounting another matrix: MMCC needs a non-negative causal C (the compressed
    C^ = B^-1 A often has negative entries); the shuffled tree needs the binary-tree encoder."""
    from mfcli.accounting.mmcc import prepare_strategy as _prepare

    if setting == "mmcc":
        try:
            _prepare(inp.strategy, inp.release_steps)
        except MfcliError as exc:
            raise MfcliError(f"the mmcc setting does not apply to the {inp.operator} operator of {inp.name}: {exc}") from None
    elif setting in ("shuffled-tree", "balls-in-bins-tree") and not inp.is_tree:
        raise MfcliError(
            f"the {setting} setting needs the binary-tree strategy, not the {inp.operator} operator of {inp.name}"
            + (" (other strategies get their balls-in-bins guarantee from the DP-SGD reduction row)"
               if setting == "balls-in-bins-tree" else "")
        )
    if setting == "balls-in-bins-tree":
        from mfcli.accounting.balls_in_bins import tree_height

        tree_height(inp.n)


@dataclass(frozen=True)
class AccountingOptions:
    """Numerical options shared by all settings (see docs/accounting.md)."""

    delta: float = DEFAULT_DELTA
    value_discretization: float = DEFAULT_DISCRETIZATION
    tail_fractions: tuple = (DEFAULT_TAIL_FRACTION,)
    mixture_resolution: int = DEFAULT_MIXTURE_RESOLUTION
    #: Bytes MMCC's tail-event collection may use (None: no limit); see mfcli.util.memory.
    max_memory: int | None = None
    #: MMCC on a banded C (b <= banded_poisson.MAX_BAND): also run the importance-sampled ESTIMATE
    #: of the exact pair's epsilon. Opt-in: it costs seconds of CPU even at n = 8, and it is an
    #: estimate, never a bound (never used to calibrate); the certified disjoint-rows lower bound
    #: runs either way.
    banded_estimate: bool = False
    #: The grid of the balls-in-bins tree bracket (None: chosen automatically, see
    #: :func:`mfcli.accounting.balls_in_bins.tree_balls_in_bins`). Any grid gives a valid bracket;
    #: a record's re-derivation uses the grid the record was computed on, so that a change of the
    #: automatic choice between versions cannot fail a sound record.
    tree_balls_in_bins_grid: float | None = None

    def checked(self) -> AccountingOptions:
        check_delta(self.delta)
        check_discretization(self.value_discretization)
        return self


@dataclass(frozen=True)
class MMCCBracket:
    """The MMCC row: the upper bound, the lower bound (exact epsilon of a post-processed
    statistic) and the "example in every step" sanity bound."""

    upper: MMCCResult
    lower: LowerBoundResult
    full: FullParticipationResult
    #: banded C only (mfcli.accounting.banded_poisson): a second certified lower bound (rows with
    #: disjoint windows) and, when ``AccountingOptions.banded_estimate`` asks for it, the
    #: importance-sampled ESTIMATE of the exact pair; None otherwise, with ``banded_note`` saying why.
    lower_rows: Any = None
    estimate: Any = None
    banded_note: str | None = None

    @property
    def epsilon(self) -> float:
        """The upper bound (what the setting guarantees)."""
        return self.upper.epsilon

    @property
    def lower_epsilon(self) -> float:
        """The best certified lower bound (the larger of the two statistics' exact epsilons)."""
        rows = self.lower_rows.epsilon if self.lower_rows is not None else 0.0
        return max(self.lower.epsilon, rows)

    def as_dict(self, *, include_event: bool = True) -> dict:
        d = self.upper.as_dict(include_event=include_event)
        d["lower_bound"] = self.lower_epsilon
        d["bracket"] = [self.lower_epsilon, self.upper.epsilon]
        d["lower_bound_detail"] = self.lower.as_dict()
        if self.lower_rows is not None:
            d["lower_bound_disjoint_rows"] = self.lower_rows.as_dict()
        if self.estimate is not None:
            d["estimate"] = self.estimate.as_dict()
        if self.banded_note is not None:
            d["estimate_note"] = self.banded_note
        d["full_participation"] = self.full.as_dict()
        return d


def _zero_out_text(text: str) -> str:
    """A row's assumptions with its neighbouring relation restated for shuffle batching."""
    zero = ("zero out one example of a fixed, public N (a shuffle permutes the N examples, so adding one "
            "re-deals every batch)")
    for phrase in ("add or remove (or zero out) one example", "add or remove one example"):
        if phrase in text:
            return text.replace(phrase, zero)
    return f"{text}; {zero}"


#: The neighbouring relation of a setting whose guarantee is not for adding or removing one
#: example (every other setting's): the shuffled DP-SGD reference bounds replace-one neighbours
#: (Feldman-McMillan-Talwar; the number of steps is fixed).
NEIGHBOURING = {"shuffled-dp-sgd": "replace-one"}
#: Under ``--batching shuffle`` the other rows hold for zero-out neighbours of a fixed, public N: a
#: shuffle is a permutation of the N examples, so adding one re-deals every batch
#: (docs/samplers.md, "Neighbouring datasets").
SHUFFLE_NEIGHBOURING = "zero-out"


def neighbouring_of(setting: str, batching: str | None) -> str:
    """The neighbouring relation a setting's guarantee holds for under a batch sampler:
    ``replace-one`` for the shuffled DP-SGD reference and for the DP-SGD reduction under shuffle
    (it inherits that reference's relation), ``zero-out`` (fixed, public N) for the other rows under
    shuffle batching, else ``add-remove`` one example."""
    if setting == "dp-sgd-reduction" and batching == "shuffle":
        return "replace-one"
    return NEIGHBOURING.get(setting, SHUFFLE_NEIGHBOURING if batching == "shuffle" else "add-remove")


@dataclass(frozen=True)
class Report:
    """The one number to report for the stated batch sampler: the smallest epsilon among the rows
    that are guarantees for this strategy under that sampler (:data:`GUARANTEE_SETTINGS`), and
    which row attains it.

    Attributes:
        epsilon: the number to report (None when no guarantee row ran).
        setting: the row that attains it.
        delta, batching, sampling: as accounted; participation: the schema in words.
        neighbouring: the relation the attaining row holds for.
        candidates: {setting: epsilon} of every guarantee row that ran (the minimum is reported).
        other_samplers: rows of this report that assume ANOTHER batch sampler for the same strategy
            and certify a smaller epsilon: [{setting, batch_sampler, epsilon}].
        references: {setting: epsilon} of rows for another mechanism (DP-SGD, C = I), never this
            strategy's privacy.
    """

    epsilon: float | None
    setting: str | None
    delta: float
    batching: str | None
    sampling: float | None
    participation: str
    neighbouring: str | None
    candidates: dict[str, float]
    other_samplers: list[dict]
    references: dict[str, float]

    def as_dict(self) -> dict:
        return fields_of(self, "epsilon", "setting", "delta", "batching", "sampling", "participation", "neighbouring",
                         candidates=dict(self.candidates), other_samplers=list(self.other_samplers),
                         references=dict(self.references))


def _single_pass_under(sampler: str) -> Callable[[AccountingReport], tuple[dict, str]]:
    return lambda rep: (schema_dict(SingleParticipation(), rep.strategy.n), sampler)


def _poisson_labels(rep: AccountingReport) -> tuple[dict, str]:
    return ({"kind": "poisson", "description": "any number of participations (Poisson sampling in every step)"},
            f"Poisson: every example in every step with probability {rep.sampling:g}")


_BALLS_IN_BINS = "balls-in-bins: each example in exactly one uniformly random step of the epoch"

#: {setting: its row's (participation, batch sampler) as the JSON names them} for the settings that
#: fix both (:meth:`AccountingReport.row_labels`; the others' come from their result).
_ROW_LABELS: dict[str, Callable[[AccountingReport], tuple[dict, str]]] = {
    "single-pass": _single_pass_under("deterministic"),
    "dp-sgd": _poisson_labels,
    "mmcc": _poisson_labels,
    "shuffled-tree": _single_pass_under("one shuffled epoch"),
    "balls-in-bins-tree": _single_pass_under(_BALLS_IN_BINS),
    "shuffled-dp-sgd": _single_pass_under(
        "one shuffled epoch, batch size 1, replace-one neighbours (Feldman-McMillan-Talwar)"),
    "balls-in-bins-dp-sgd": _single_pass_under(_BALLS_IN_BINS),
    "dp-sgd-reduction": lambda rep: rep._reduction_labels(),
}


@dataclass(frozen=True)
class AccountingReport:
    """Every setting that applies for one strategy at one sigma: one typed result per setting
    (None where it was not run)."""

    strategy: StrategyInput
    sigma: float
    sampling: float | None
    delta: float
    single_pass: SinglePassResult | None = None
    dp_sgd: DpSgdResult | None = None
    mmcc: MMCCBracket | None = None
    shuffled_tree: ShuffledTreeResult | None = None
    deterministic: DeterministicResult | None = None
    cyclic_poisson: CyclicPoissonResult | None = None
    participation: Participation = field(default_factory=SingleParticipation)
    batching: str | None = None
    balls_in_bins_tree: BallsInBinsTreeResult | None = None
    shuffled_dp_sgd: ShuffledDpSgdResult | None = None
    #: The DP-SGD reduction bound under ``batching`` (mfcli.accounting.reduction).
    reduction: ReductionResult | None = None
    #: DP-SGD (C = I) under balls-in-bins at sigma: a reference row.
    balls_in_bins_dp_sgd: BallsInBinsDpSgdResult | None = None
    #: One line per requested setting that was left out, and why (a structured artifact above
    #: its dense limit under Poisson sampling: MMCC needs the dense C).
    notes: tuple[str, ...] = ()
    #: {setting: why it was not run} for a requested setting whose assumptions fail for this C
    #: (MMCC on a C with negative entries); its line is also in ``notes``.
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def noise_sensitivity(self) -> float:
        """The sensitivity the noise multiplier divides by (:func:`noise_sensitivity`; the
        deterministic row's schema sensitivity when it ran, the same number)."""
        fixed = self.batching is None
        if fixed and self.deterministic is not None:
            return float(self.deterministic.sensitivity.value)
        return noise_sensitivity(self.strategy, self.participation, fixed_order=fixed)

    @property
    def noise_multiplier(self) -> float:
        """sigma (the noise std on C G) / :attr:`noise_sensitivity`."""
        return self.sigma / self.noise_sensitivity

    @property
    def results(self) -> dict[str, Any]:
        """{setting name: result} for the settings that were run, in display order."""
        pairs = (("single-pass", self.single_pass), ("deterministic", self.deterministic), ("dp-sgd", self.dp_sgd),
                 ("mmcc", self.mmcc), ("cyclic-poisson", self.cyclic_poisson), ("shuffled-tree", self.shuffled_tree),
                 ("balls-in-bins-tree", self.balls_in_bins_tree), ("shuffled-dp-sgd", self.shuffled_dp_sgd),
                 ("dp-sgd-reduction", self.reduction), ("balls-in-bins-dp-sgd", self.balls_in_bins_dp_sgd))
        return {name: r for name, r in pairs if r is not None}

    def report(self) -> Report:
        """The number to report for the stated batch sampler (:class:`Report`): the smallest
        epsilon among the guarantee rows of ``batching``, the row that attains it, the rows of
        other samplers that would certify less, and the reference rows (another mechanism)."""
        res = self.results
        eps = {name: float(r.epsilon) for name, r in res.items() if getattr(r, "epsilon", None) is not None}
        valid = GUARANTEE_SETTINGS.get(self.batching, ())
        cands = {k: v for k, v in eps.items() if k in valid}
        best = min(cands, key=lambda k: cands[k]) if cands else None
        others = []
        if best is not None:
            for name, v in eps.items():
                if name in valid or name in REFERENCE_SETTINGS or v >= cands[best]:
                    continue
                others.append({"setting": name, "batch_sampler": self.row_labels(name)[1], "epsilon": v})
        return Report(epsilon=cands[best] if best is not None else None, setting=best, delta=self.delta,
                      batching=self.batching, sampling=self.sampling,
                      participation=(self.row_labels(best)[0]["description"] if best is not None
                                     else self.participation.describe(self.strategy.n)),
                      neighbouring=neighbouring_of(best, self.batching) if best is not None else None,
                      candidates=cands, other_samplers=others,
                      references={k: v for k, v in eps.items() if k in REFERENCE_SETTINGS})

    def row_labels(self, name: str) -> tuple[dict, str]:
        """(participation, batch sampler) that the row ``name`` assumes, as its JSON names them."""
        labels = _ROW_LABELS.get(name)
        if labels is not None:
            return labels(self)
        row = self.results[name].as_dict()
        return row["participation"], row["batch_sampler"]

    def _reduction_labels(self) -> tuple[dict, str]:
        """The reduction row assumes the batch sampler it was accounted under."""
        n = self.strategy.n
        sampler = self.reduction.sampler if self.reduction is not None else self.batching
        if sampler == "poisson":
            return self.row_labels("dp-sgd")
        if sampler == "cyclic" and self.reduction is not None:
            inner = self.reduction.dpsgd.as_dict()
            return inner["participation"], inner["batch_sampler"]
        if sampler == "balls-in-bins":
            return self.row_labels("balls-in-bins-tree")
        return schema_dict(SingleParticipation(), n), "one shuffled epoch, batch size 1"

    @property
    def rows(self) -> dict[str, dict]:
        """The JSON rows, events included (:meth:`row_dicts`)."""
        return self.row_dicts()

    def row_dicts(self, *, include_events: bool = True) -> dict[str, dict]:
        """The JSON rows (``as_dict()`` of each result; the dp-accounting events only with
        ``include_events``: MMCC's is the composition of every row's mixture, costly to write out, and
        a table shows none of them); every row names the
        participation schema and the batch sampler it assumes, and its neighbouring relation
        (``neighbouring``: ``add-remove`` one example, ``replace-one`` for the shuffled DP-SGD
        reference, ``zero-out`` on a fixed N for the other rows under shuffle batching), since rows
        with different relations can sit side by side."""
        out = {}
        for name, r in self.results.items():
            row = r.as_dict() if include_events or not isinstance(r, MMCCBracket) else r.as_dict(include_event=False)
            if not include_events:
                row.pop("dp_event", None)
            row["participation"], row["batch_sampler"] = self.row_labels(name)
            row["neighbouring"] = neighbouring_of(name, self.batching)
            if row["neighbouring"] == "zero-out" and isinstance(row.get("assumptions"), str):
                # under shuffle batching the guarantee is for zeroing out one of a fixed N (docs/samplers.md)
                row["assumptions"] = _zero_out_text(row["assumptions"])
            # a row for another mechanism (DP-SGD, C = I, at the same sigma) is a reference, not this C's privacy
            row["reference"] = name in REFERENCE_SETTINGS
            out[name] = row
        return out

    def as_dict(self, *, include_events: bool = True) -> dict:
        rows = self.row_dicts(include_events=include_events)
        return {
            "strategy": self.strategy.name,
            "operator": self.strategy.operator,
            "source": self.strategy.source,
            "n": self.strategy.n,
            "rows_of_C": int(self.strategy.mechanism.rows),
            # single participation (max column norm), as in JSON version 1; the same number under the
            # name the other commands use for it (optimize/inspect: ``sensitivity_single``), and the
            # schema's (what optimize calls ``sensitivity``) as ``schema_sensitivity``
            "sensitivity": self.strategy.sensitivity,
            "sensitivity_single": self.strategy.sensitivity,
            **({"schema_sensitivity": self.deterministic.sensitivity.value} if self.deterministic is not None else {}),
            # the noise convention (docs/accounting.md): the noise multiplier is the primary number,
            # sigma the std of the noise on C G (kept under its version-1 name, and as noise_std)
            "noise_multiplier": self.noise_multiplier,
            "noise_std": self.sigma,
            "noise_sensitivity": self.noise_sensitivity,
            "noise_sensitivity_of": noise_sensitivity_of(self.participation, fixed_order=self.batching is None),
            "sigma": self.sigma,
            "sampling": self.sampling,
            "batching": self.batching,
            "participation": schema_dict(self.participation, self.strategy.n),
            "delta": self.delta,
            "settings": rows,
            **({"notes": list(self.notes)} if self.notes else {}),
            **({"refused": dict(self.refused)} if self.refused else {}),
            "report": self.report().as_dict(),
        }


def account(
    inp: StrategyInput,
    *,
    sigma: float,
    sampling: float | None,
    options: AccountingOptions = AccountingOptions(),
    settings: Sequence[str] = SETTINGS,
    progress: Callable[[str], None] | None = None,
    participation: Participation | None = None,
    batching: str | None = None,
    on_progress: ProgressCallback | None = None,
) -> AccountingReport:
    """Run every requested setting that applies.

    Without sampling: single-pass under single participation, else ``deterministic`` (the
    Gaussian at the schema's sensitivity; ``participation`` None means the schema the input
    declares, :func:`resolve_schema`). With a sampling rate and batch sampler ``poisson`` (the
    default): DP-SGD and MMCC (with its lower bound and full-participation sanity bound); with
    ``cyclic``: the cyclic-Poisson reduction of a banded C (refused when its conditions fail).
    The shuffled tree when C is the binary tree and the schema is single participation.

    Without a sampling rate, ``batching`` ``balls-in-bins`` or ``shuffle`` runs only that batch
    sampler's settings (``BATCHING_SETTINGS``, single participation): balls-in-bins, the tree's
    bracket (C must be the tree); shuffle, the shuffled tree (when C is the tree) and the shuffled
    DP-SGD reference.

    ``progress`` receives stage messages; ``on_progress`` the structured progress of the long
    computations (MMCC, the banded estimate, the balls-in-bins tree; :mod:`mfcli.util.progress`).

    Every number comes from the input's mechanism (:class:`mfcli.strategies.operators.Mechanism`): the
    sensitivities, the cyclic numbers and causality of any kind at any n; the settings that need
    the matrix C (MMCC, the DP-SGD reduction, the tree's rows) run where the mechanism has it at
    hand (``inp.has_matrix``). Without it (a structured strategy above its dense limit) Poisson sampling
    shows DP-SGD alone, with a note in the report's ``notes`` when MMCC was asked for, and a
    batch sampler without a rate runs the settings the mechanism runs without C
    (``matrix_free_settings``; the binary tree's own bounds) with a note for each one left out, or
    is refused in one line when none of the sampler's own bounds can run."""
    sigma = check_sigma(sigma)
    batching = check_batching(batching, sampling)
    notes: tuple[str, ...] = ()
    refused: dict[str, str] = {}
    if batching in BATCHING_SETTINGS:
        settings = [s for s in settings if s in BATCHING_SETTINGS[batching]]
        if batching == "balls-in-bins" and "balls-in-bins-tree" in settings:
            if inp.is_tree:
                check_setting_applies(inp, "balls-in-bins-tree")
            else:
                # any other C: the DP-SGD reduction row gives its balls-in-bins guarantee
                settings = [s for s in settings if s != "balls-in-bins-tree"]
    else:
        settings = [s for s in settings if s not in ("balls-in-bins-tree", "shuffled-dp-sgd", "balls-in-bins-dp-sgd")]
        if batching is None:
            settings = [s for s in settings if s != "dp-sgd-reduction"]
    opts = options.checked()
    if sampling is not None:
        sampling = check_sampling(sampling)
    if batching in ("poisson", "cyclic", "balls-in-bins"):
        # these samplers' rows are PLD accountants (the shuffle's are closed forms): the strategy's
        # at sigma over its largest column norm (the reduction's sigma / ||C||_2 is smaller still),
        # and, under Poisson and balls-in-bins, DP-SGD's reference rows at sigma itself
        check_sampled_noise_multiplier(sigma / inp.sensitivity, "the noise multiplier sigma / sens")
        if batching != "cyclic":
            check_sampled_noise_multiplier(sigma, "sigma, DP-SGD's noise multiplier in the reference rows")
    schema = resolve_schema(inp, participation)
    single = isinstance(schema, SingleParticipation)
    if batching in BATCHING_SETTINGS and not single:
        raise MfcliError(f"the {batching} batch sampler is accounted for one epoch (single participation), "
                         f"not under {schema.describe()}")
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise MfcliError(f"unknown setting {unknown[0]!r}; choose from {', '.join(SETTINGS)}")
    mech = inp.mechanism
    if not inp.has_matrix and batching == "poisson":
        return _poisson_without_matrix(inp, sigma=sigma, sampling=sampling, opts=opts, settings=settings,
                                       schema=schema)
    if not inp.has_matrix and batching in BATCHING_SETTINGS:
        settings, notes = _sampler_without_matrix(mech, batching, settings)
    c = inp.strategy
    sp = dp = br = st = det = cyc = None
    cyclic_refusal: MfcliError | None = None
    if ("single-pass" in settings and single) or ("deterministic" in settings and not single):
        mech.check_causal("the single-pass bound" if single else "the deterministic bound")
    if "single-pass" in settings and single:
        sp = single_pass(sigma=sigma, sensitivity=inp.sensitivity, delta=opts.delta)
    if "deterministic" in settings and not single:
        det = deterministic(sigma=sigma, sensitivity=mech.schema_sensitivity(schema), n=inp.n, delta=opts.delta)
    if batching == "cyclic" and "cyclic-poisson" in settings:
        assert sampling is not None  # check_batching: cyclic needs a rate
        try:
            bands, column = mech.cyclic_numbers(schema)
            cyc = reduced_dpsgd(bands=bands, column_norm=column, n=inp.n, schema=schema, sigma=sigma,
                                sampling=sampling, delta=opts.delta, value_discretization=opts.value_discretization)
        except MfcliError as exc:
            # the DP-SGD reduction below still accounts this C under cyclic Poisson sampling (it
            # needs the matrix)
            if "dp-sgd-reduction" not in settings or not inp.has_matrix:
                raise
            cyclic_refusal = exc
            refused["cyclic-poisson"] = str(exc)
            notes = (*notes, f"cyclic Poisson (banded C): not run; {exc}")
    poisson_rate = sampling if batching == "poisson" else None  # DP-SGD and MMCC assume Poisson in every step
    if poisson_rate is not None and "dp-sgd" in settings:
        dp = dpsgd(sigma=sigma, sampling=poisson_rate, steps=inp.n, delta=opts.delta,
                   value_discretization=opts.value_discretization)
    if poisson_rate is not None and "mmcc" in settings:
        try:
            check_setting_applies(inp, "mmcc")
        except MfcliError as exc:
            # Like a structured artifact above the dense limit: the rows that do apply are shown
            # and MMCC's row is replaced by why it is not run (and what holds instead); a run that
            # would show nothing else is refused in one line.
            if dp is None:
                raise
            refused["mmcc"] = str(exc)
            notes = (*notes, f"MMCC: not run; {exc}")
    if poisson_rate is not None and "mmcc" in settings and "mmcc" not in refused:
        prep = prepare_strategy(c, inp.release_steps)
        upper = mmcc(prep, sigma=sigma, sampling=poisson_rate, delta=opts.delta, tail_fractions=opts.tail_fractions,
                     value_discretization=opts.value_discretization, mixture_resolution=opts.mixture_resolution,
                     progress=progress, max_memory=opts.max_memory, on_progress=on_progress)
        br = MMCCBracket(upper=upper, lower=lower_bound(prep, sigma=sigma, sampling=poisson_rate, delta=opts.delta),
                         full=full_participation(prep, sigma=sigma, delta=opts.delta),
                         **_banded_extras(prep, sigma=sigma, sampling=poisson_rate, delta=opts.delta, progress=progress,
                                          on_progress=on_progress, estimate=opts.banded_estimate))
    if inp.is_tree and single and "shuffled-tree" in settings:
        from mfcli.accounting.shuffled_tree import shuffled_tree

        st = shuffled_tree(n=inp.n, sigma=sigma * _tree_unit(c), delta=opts.delta)
    bib = sdp = None
    if "balls-in-bins-tree" in settings:
        if progress is not None:
            progress("balls-in-bins: propagating the tree's likelihood-ratio law level by level")
        from mfcli.accounting.balls_in_bins import tree_balls_in_bins

        bib = tree_balls_in_bins(n=inp.n, sigma=sigma * _tree_unit(c), delta=opts.delta,
                                 grid=opts.tree_balls_in_bins_grid, on_progress=on_progress)
    if "shuffled-dp-sgd" in settings:
        from mfcli.accounting.shuffling import shuffled_dpsgd

        sdp = shuffled_dpsgd(n=inp.n, sigma=sigma, delta=opts.delta)
    bdp = red = None
    if "balls-in-bins-dp-sgd" in settings:
        from mfcli.accounting.balls_in_bins import dpsgd_balls_in_bins

        try:
            bdp = dpsgd_balls_in_bins(n=inp.n, sigma=sigma, delta=opts.delta, on_progress=on_progress)
        except MfcliError as exc:
            notes = (*notes, f"balls-in-bins DP-SGD reference: not run; {exc}")
    # the reduction needs the operator's certified spectral norm, from the matrix: without it the
    # row is not shown (docs/accounting.md, "The DP-SGD reduction bound")
    if "dp-sgd-reduction" in settings and batching is not None and inp.has_matrix:
        try:
            red = reduction(c, sigma=sigma, sampler=batching, sampling=sampling, delta=opts.delta, schema=schema,
                            value_discretization=opts.value_discretization, release_steps=inp.release_steps,
                            on_progress=on_progress)
        except MfcliError as exc:
            if cyclic_refusal is not None:
                raise cyclic_refusal from None
            refused["dp-sgd-reduction"] = str(exc)
            notes = (*notes, f"DP-SGD reduction: not run; {exc}")
    return AccountingReport(strategy=inp, sigma=sigma, sampling=sampling, delta=opts.delta,
                            single_pass=sp, dp_sgd=dp, mmcc=br, shuffled_tree=st, deterministic=det,
                            cyclic_poisson=cyc, participation=schema, batching=batching,
                            balls_in_bins_tree=bib, shuffled_dp_sgd=sdp, reduction=red, balls_in_bins_dp_sgd=bdp,
                            notes=notes, refused=refused)


def _sampler_without_matrix(mech: Any, batching: str, settings: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """A batch sampler without a rate for a mechanism without its matrix C at hand: the settings
    it runs without C (:attr:`~mfcli.strategies.operators.Mechanism.matrix_free_settings`) and a
    note for each one left out. Refused with the mechanism's reason when the sampler's own
    guarantees are asked for (``GUARANTEE_SETTINGS`` besides single-pass, which holds under any
    sampler) and none of them runs without C: a table of single-pass and DP-SGD references would
    answer another question. A request for the references alone runs them."""
    free = mech.matrix_free_settings
    own = [s for s in GUARANTEE_SETTINGS[batching] if s != "single-pass" and s in settings]
    if own and not any(s in free for s in own):
        raise MfcliError(mech.matrix_refusal(f"the {batching} batch sampler (its settings)"))
    notes = tuple(f"{s}: not run; it needs {mech.no_matrix_reason}" for s in settings if s not in free)
    return [s for s in settings if s in free], notes


def _poisson_without_matrix(inp: StrategyInput, *, sigma: float, sampling: float | None, opts: AccountingOptions,
                            settings: Sequence[str], schema: Participation) -> AccountingReport:
    """Poisson sampling for a mechanism without its matrix C at hand: DP-SGD (n Poisson-subsampled
    Gaussian steps at sigma, which needs no C) and a note for MMCC; a run that would compute
    nothing but MMCC is refused with the mechanism's reason."""
    assert sampling is not None  # check_batching: poisson needs a rate
    if "dp-sgd" not in settings:
        raise MfcliError(inp.mechanism.matrix_refusal("the poisson batch sampler (MMCC)"))
    dp = dpsgd(sigma=sigma, sampling=sampling, steps=inp.n, delta=opts.delta,
               value_discretization=opts.value_discretization)
    notes: tuple[str, ...] = ()
    if "mmcc" in settings:
        notes = (f"MMCC: not run; it needs {inp.mechanism.no_matrix_reason}; DP-SGD needs no C and is shown",)
    return AccountingReport(strategy=inp, sigma=sigma, sampling=sampling, delta=opts.delta, dp_sgd=dp,
                            participation=schema, batching="poisson", notes=notes)


def _banded_extras(prep: Any, *, sigma: float, sampling: float, delta: float,
                   progress: Callable[[str], None] | None, on_progress: ProgressCallback | None = None,
                   estimate: bool = False) -> dict:
    """For a banded C (bandwidth <= MAX_BAND): the disjoint-rows lower bound and, with
    ``estimate``, the ESTIMATE of the exact pair (mfcli.accounting.banded_poisson); otherwise a
    note saying why there is none (:data:`ESTIMATE_NOT_REQUESTED` when only the request is missing)."""
    from mfcli.accounting import banded_poisson as bp

    b = bp.bandwidth(prep.strategy) if np.array_equal(prep.release_steps, np.arange(prep.n)) else None
    if b is None:
        return {"banded_note": "no estimate: C is not square lower-triangular released one row per step"}
    if b > bp.MAX_BAND:
        return {"banded_note": f"no estimate: C has bandwidth {b} > {bp.MAX_BAND} (the exact likelihood "
                               f"recursion has 2^(b-1) states)"}
    say = progress or (lambda s: None)
    say(f"banded C (b = {b}): disjoint-rows lower bound" + (" and importance-sampled estimate" if estimate else ""))
    rows = bp.disjoint_rows_lower_bound(prep, sigma=sigma, sampling=sampling, delta=delta, grid=BANDED_LB_GRID)
    if not estimate:
        return {"lower_rows": rows, "banded_note": ESTIMATE_NOT_REQUESTED}
    est = bp.estimate_epsilon(prep, sigma=sigma, sampling=sampling, delta=delta, on_progress=on_progress)
    return {"lower_rows": rows, "estimate": est}


#: ``estimate_note`` of a banded C whose estimate was not requested (AccountingOptions.banded_estimate).
ESTIMATE_NOT_REQUESTED = ("not requested: an importance-sampled ESTIMATE of the exact pair's epsilon is available "
                          "for this banded C on request (seconds of CPU; never a bound)")


#: Loss grid of the disjoint-rows lower bound in ``account`` (losses rounded down to it).
BANDED_LB_GRID = 1e-3


def _any_n_baseline(strategy: str, *, n: int, workload: str, beta: float) -> StrategyInput:
    """A built-in baseline above the dense limit: its mechanism of any n
    (:func:`mfcli.strategies.baseline_mechanisms.baseline_mechanism`), with no matrix, so only the
    settings it runs without C apply (its ``matrix_free_settings``). The workload only names the source (the
    accounting of C does not depend on it) and must be one with a Toeplitz form."""
    from mfcli.strategies.baseline_mechanisms import baseline_mechanism
    from mfcli.strategies.toeplitz import toeplitz_workload

    mech = baseline_mechanism(strategy, toeplitz_workload(workload, beta=beta), n)
    return StrategyInput(
        name=strategy, strategy=np.zeros((0, 0)), release_steps=np.zeros(0, dtype=np.int64),
        source=f"built-in strategy {strategy} for the {workload} workload, n = {n} (its form of any n, no matrix)",
        is_tree=mech.is_tree, operator="form of any n, no matrix", mechanism=mech,
    )


def _tree_unit(c: np.ndarray) -> float:
    """sigma for a 0/1 tree given a multiple of it: the tree's entries are scaled by c.max(); the
    tree of any n (no matrix at hand) is the 0/1 encoder itself."""
    return 1.0 / float(c.max()) if c.size else 1.0


def check_setting_schema(setting: str, schema: Participation, n: int) -> None:
    """Refuse a setting that does not describe ``schema``: single-pass and the shuffled tree
    assume one participation; deterministic needs a multi-participation schema.

    Raises:
        MfcliError: in one line, naming the setting that does apply.
    """
    single = isinstance(schema, SingleParticipation)
    if setting == "single-pass" and not single:
        raise MfcliError(f"the single-pass setting assumes single participation, not {schema.describe(n)}; "
                         "the deterministic setting accounts that schema")
    if setting == "shuffled-tree" and not single:
        raise MfcliError(f"the shuffled-tree setting is one shuffled epoch, not {schema.describe(n)}")
    if setting == "deterministic" and single:
        raise MfcliError("the deterministic setting needs a multi-participation schema; under single "
                         "participation it is the single-pass setting")


def epsilon_function(
    inp: StrategyInput,
    setting: str,
    *,
    sampling: float | None,
    options: AccountingOptions = AccountingOptions(),
    participation: Participation | None = None,
    on_progress: ProgressCallback | None = None,
) -> Callable[[float], float]:
    """epsilon(sigma) of one setting (for calibration), under ``participation`` (None: the
    schema the input declares) for ``deterministic`` and ``cyclic-poisson``. Each evaluation
    passes ``on_progress`` to the long computations (MMCC, the balls-in-bins tree).

    Raises:
        MfcliError: the setting does not apply (``single-pass`` under a multi-participation
            schema, ``deterministic`` under single participation, a sampled setting without a
            rate, a C that fails a setting's conditions).
    """
    opts = options.checked()
    mech = inp.mechanism
    schema = resolve_schema(inp, participation)
    check_setting_schema(setting, schema, inp.n)
    if setting in ("single-pass", "deterministic"):
        mech.check_causal(f"the {setting} bound")
    if setting == "single-pass":
        sens = inp.sensitivity
        return lambda s: single_pass(sigma=s, sensitivity=sens, delta=opts.delta).epsilon
    if setting == "deterministic":
        sch = mech.schema_sensitivity(schema)
        return lambda s: deterministic(sigma=s, sensitivity=sch, n=inp.n, delta=opts.delta).epsilon
    if setting == "cyclic-poisson":
        if sampling is None:
            raise MfcliError("calibrating cyclic-poisson needs a sampling rate")
        p = check_sampling(sampling)
        bands, column = mech.cyclic_numbers(schema)

        def eps(s: float) -> float:
            return reduced_dpsgd(bands=bands, column_norm=column, n=inp.n, schema=schema, sigma=s, sampling=p,
                                 delta=opts.delta, value_discretization=opts.value_discretization).epsilon

        eps(1.0)  # refuse now (more bands than the cycle), not inside the search
        return eps
    # which settings need C is the mechanism's to say (the tree's own bounds need only n and sigma)
    if setting in SETTINGS and setting not in mech.matrix_free_settings and not inp.has_matrix:
        raise MfcliError(mech.matrix_refusal(f"the {setting} setting"))
    c = inp.strategy
    if setting in ("dp-sgd", "mmcc"):
        if sampling is None:
            raise MfcliError(f"calibrating {setting} needs a sampling rate")
        p = check_sampling(sampling)
        if setting == "dp-sgd":
            return lambda s: dpsgd(sigma=s, sampling=p, steps=inp.n, delta=opts.delta,
                                   value_discretization=opts.value_discretization).epsilon
        check_setting_applies(inp, "mmcc")
        prep = prepare_strategy(c, inp.release_steps)
        return lambda s: mmcc(prep, sigma=s, sampling=p, delta=opts.delta, tail_fractions=opts.tail_fractions,
                              value_discretization=opts.value_discretization,
                              mixture_resolution=opts.mixture_resolution, max_memory=opts.max_memory,
                              on_progress=on_progress).epsilon
    if setting == "shuffled-tree":
        check_setting_applies(inp, "shuffled-tree")
        from mfcli.accounting.shuffled_tree import shuffled_tree

        return lambda s: shuffled_tree(n=inp.n, sigma=s * _tree_unit(c), delta=opts.delta).epsilon
    if setting == "balls-in-bins-tree":
        check_setting_applies(inp, "balls-in-bins-tree")
        from mfcli.accounting.balls_in_bins import tree_balls_in_bins

        return lambda s: tree_balls_in_bins(n=inp.n, sigma=s * _tree_unit(c), delta=opts.delta,
                                            grid=opts.tree_balls_in_bins_grid,
                                            on_progress=on_progress).epsilon
    if setting == "shuffled-dp-sgd":
        from mfcli.accounting.shuffling import shuffled_dpsgd

        return lambda s: shuffled_dpsgd(n=inp.n, sigma=s, delta=opts.delta).epsilon
    raise MfcliError(f"unknown setting {setting!r}; choose from {', '.join(SETTINGS)}")


class CalibrationProbe(Protocol):
    """The first run of a calibration made ahead of it (to estimate its cost), which
    :func:`calibrate` takes instead of repeating: what it ran and what it got.
    :class:`mfcli.services.cost.CalibrationEstimate` is one; the protocol is what the
    calibration needs of it, so this module does not import the cost model built on it."""

    @property
    def setting(self) -> str: ...

    @property
    def sigma(self) -> float: ...

    @property
    def epsilon(self) -> float: ...


def calibrate(
    inp: StrategyInput,
    setting: str,
    *,
    target_epsilon: float,
    sampling: float | None,
    options: AccountingOptions = AccountingOptions(),
    rel_tol: float = 1e-3,
    progress: Callable[[str], None] | None = None,
    participation: Participation | None = None,
    on_progress: ProgressCallback | None = None,
    probe: CalibrationProbe | None = None,
) -> Calibration:
    """Smallest sigma meeting (target_epsilon, delta) for ``setting`` (see :mod:`calibrate`).

    ``on_progress`` receives the calibration's runs and each run's own phases; ``probe`` (from
    :func:`mfcli.services.cost.estimate_calibration` for the same input and options) supplies
    the first run, which is then not repeated."""
    f = epsilon_function(inp, setting, sampling=sampling, options=options, participation=participation,
                         on_progress=on_progress)
    start = calibration_start(setting)
    known = None
    if probe is not None:
        if probe.setting != setting or probe.sigma != start:
            raise MfcliError(f"the probe ran {probe.setting} at sigma {probe.sigma:g}, not {setting} at {start:g}")
        known = {probe.sigma: probe.epsilon}
    cal = calibrate_sigma(f, target_epsilon=target_epsilon, rel_tol=rel_tol, sigma_start=start, progress=progress,
                          on_progress=on_progress, known=known)
    # the noise multiplier of the calibrated std: only the deterministic setting is fixed-order
    # under a multi-participation schema (single-pass is one participation)
    schema = resolve_schema(inp, participation)
    return replace(cal, sensitivity=noise_sensitivity(inp, schema, fixed_order=setting == "deterministic"))


def calibration_start(setting: str) -> float:
    """The sigma at which :func:`calibrate` starts its search for ``setting``."""
    return 4.0 if setting in ("mmcc", "dp-sgd", "cyclic-poisson") else 1.0


def calibrate_strategy(
    strategy_matrix: Any,
    *,
    epsilon: float,
    delta: float,
    setting: str = "single-pass",
    sampling: float | None = None,
    release_steps: Any = None,
    is_tree: bool = False,
    name: str = "strategy",
    rel_tol: float = 1e-3,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """The smallest noise multiplier sigma at which strategy C meets (epsilon, delta) in ``setting``.

    What ``mfcli account --epsilon`` computes, for a strategy matrix held in memory: sigma is the
    noise standard deviation per coordinate of Z in units of the clip norm for C as given (the
    equivalent sensitivity-1 Gaussian has noise multiplier sigma / sens(C)). The accounting runs
    at the returned sigma and meets the target (:func:`calibrate_sigma`).

    Args:
        strategy_matrix: C (m x n), non-negative entries for ``mmcc``.
        epsilon, delta: the target.
        setting: ``single-pass`` (every example in one step), ``dp-sgd``, ``mmcc`` (both need
            ``sampling``) or ``shuffled-tree`` (needs ``is_tree``).
        sampling: the Poisson sampling probability of ``dp-sgd`` and ``mmcc``.
        release_steps: the step at which each row of C is released; default 0..n-1 (square C).
        is_tree: C is the binary-tree encoder (the shuffled-tree setting applies).
        name: how the strategy is named in messages.
        rel_tol: relative width of the final sigma bracket.

    Raises:
        MfcliError: a target or setting that cannot be met or does not apply.
    """
    c = np.asarray(strategy_matrix, dtype=np.float64)
    if c.ndim != 2:
        raise MfcliError(f"the strategy matrix must be 2-D, got shape {c.shape}")
    if release_steps is None:
        if c.shape[0] != c.shape[1]:
            raise MfcliError(f"a {c.shape[0]} x {c.shape[1]} strategy needs its release_steps")
        release_steps = np.arange(c.shape[1])
    inp = StrategyInput(
        name=name, strategy=c, release_steps=np.asarray(release_steps), source=f"{name}, n = {c.shape[1]}",
        is_tree=bool(is_tree),
    )
    return calibrate(
        inp, setting, target_epsilon=epsilon, sampling=sampling,
        options=AccountingOptions(delta=delta), rel_tol=rel_tol, progress=progress,
    )



# ---------------------------------------------------------------------------------------------
# --write


#: Rows ``--write`` leaves out of a record: :func:`verify_record` has no recomputation for them
#: yet (the DP-SGD reduction needs the certified spectral norm of the operator; the balls-in-bins
#: DP-SGD reference its grid), so a record holding them would not verify.
NOT_RECORDED = ("dp-sgd-reduction", "balls-in-bins-dp-sgd")


def record_to_artifact(
    report: AccountingReport | None,
    *,
    calibration: Calibration | None = None,
    calibrated_setting: str | None = None,
    command: str = "",
) -> str:
    """Append the result as group ``accounting/<id>`` of the input artifact (atomic, matrices
    untouched, see ``mfcli.io.artifact.append_group``). Returns the group name.

    Layout (docs/accounting.md): attrs ``setting`` list, ``sigma`` (the noise std on C G),
    ``noise_multiplier`` (sigma / ``sensitivity``), ``sensitivity`` (:func:`noise_sensitivity`:
    what the noise multiplier divides by), ``sampling``, ``delta``,
    ``epsilon_<setting>`` for each setting, ``results`` (JSON of every row without the events),
    ``dp_event_<setting>`` (the dp-accounting event as JSON, split into ``_000``, ``_001``, ...
    parts with a ``_parts`` count when longer than 60000 characters), ``operator`` (``dense`` or
    ``compressed (band K, rank R)``), ``participation`` (the accounted schema's JSON),
    ``batching`` (the batch sampler of the sampled rows, or ``null``), ``strategy_sha256`` (the accounted operator's
    ``identity_sha256``: the stored strategy's checksum for the dense operator, a hash of the
    stored checksums of workload, band, u and v for the compressed one), ``created_utc``,
    ``created_by``, ``command``.
    """
    from mfcli.io.artifact import append_group
    from mfcli.version import __version__

    if report is None or report.strategy.artifact is None or report.strategy.operator_sha256 is None:
        raise MfcliError("recording a result needs an artifact as input (not a .npy file or a built-in strategy)")
    target = report.strategy.artifact
    inp = report.strategy
    # rows that `mfcli inspect` cannot yet recompute from a record are not recorded (NOT_RECORDED)
    kept = {name: r for name, r in report.results.items() if name not in NOT_RECORDED}
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    params = json.dumps({"sigma": report.sigma, "sampling": report.sampling, "delta": report.delta,
                         "settings": sorted(kept), "operator": inp.operator,
                         "participation": report.participation.to_json(), "batching": report.batching},
                        sort_keys=True)
    gid = now.strftime("%Y%m%dT%H%M%SZ") + "-" + hashlib.sha256(params.encode()).hexdigest()[:8]
    attrs: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "format_version": 1,
        "settings": sorted(kept),
        "sigma": report.sigma,
        # the noise convention: sigma / the sensitivity of the operator as accounted (re-derived,
        # never trusted, by the verifier; records of 0.1/0.2 have neither and still verify)
        "noise_multiplier": report.noise_multiplier,
        "sensitivity": report.noise_sensitivity,
        "sampling": report.sampling if report.sampling is not None else "null",
        "delta": report.delta,
        "operator": inp.operator,
        "strategy_sha256": inp.operator_sha256,
        "participation": report.participation.to_json(),
        "batching": report.batching if report.batching is not None else "null",
        "created_utc": now.isoformat().replace("+00:00", "Z"),
        "created_by": f"mfcli {__version__}",
        "command": command,
    }
    full_rows = {name: row for name, row in report.rows.items() if name not in NOT_RECORDED}
    rows = {name: {k: v for k, v in row.items() if k != "dp_event"} for name, row in full_rows.items()}
    for name, row in full_rows.items():
        key = name.replace("-", "_")
        attrs[f"epsilon_{key}"] = float(row["epsilon"]) if row.get("epsilon") is not None else "null"
        if "dp_event" in row:
            write_chunked(attrs, f"dp_event_{key}", row["dp_event"])
    write_chunked(attrs, "results", json.dumps(rows, sort_keys=True, default=float))
    if calibration is not None:
        attrs["calibrated_setting"] = calibrated_setting or ""
        attrs["calibration"] = json.dumps(calibration.as_dict(), sort_keys=True)
    group = f"accounting/{gid}"
    append_group(target, group, attrs=attrs)
    return group


def event_of(result: Any) -> str | None:
    """The dp-accounting event of a result as JSON, when it has one."""
    ev = getattr(result, "dp_event", None)
    return event_to_json(ev()) if callable(ev) else None


# Verifying a stored record: the one verifier of every kind of artifact is
# mfcli.services.records.verify_record (it re-derives each record with account above).


__all__ = [
    "ATTR_CHUNK",
    "BATCHINGS",
    "BUILTIN",
    "DEFAULT_ARTIFACT",
    "SETTINGS",
    "AccountingOptions",
    "AccountingReport",
    "CalibrationProbe",
    "MMCCBracket",
    "StrategyInput",
    "account",
    "calibrate",
    "calibrate_strategy",
    "calibration_start",
    "check_batching",
    "check_setting_applies",
    "check_setting_schema",
    "epsilon_function",
    "event_of",
    "noise_sensitivity",
    "noise_sensitivity_of",
    "read_chunked",
    "record_to_artifact",
    "resolve_schema",
    "resolve_strategy",
]
