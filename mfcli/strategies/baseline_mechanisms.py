"""The baselines (identity, the binary tree, Honaker online and full, sqrt) as mechanisms of any n:
the :class:`~mfcli.strategies.operators.Mechanism` protocol without n x n matrices, for the
prefix-sum and momentum workloads (Toeplitz, :class:`~mfcli.strategies.toeplitz.ToeplitzWorkload`).
:mod:`mfcli.strategies.baselines` builds the same strategies as dense matrices (n <= the dense
limit, any workload); this module is what ``compare`` runs above that limit, from
:func:`baseline_mechanism`. Each kind is its own class and answers for itself (no switch on its
name): :class:`IdentityBaseline` and :class:`SqrtBaseline` (strategies of
:class:`ToeplitzBaselineMechanism`), :class:`TreeMechanism` and :class:`HonakerMechanism`
(``online`` a constructor flag: the online and the full estimator differ in that parameter, not
in their class), both on :class:`TreeEncoderMechanism`.

* identity, sqrt: a lower-triangular Toeplitz C. Sensitivity under every schema from the first
  column (:func:`~mfcli.strategies.toeplitz.toeplitz_sensitivity`; exact, the coefficients are
  non-negative and non-increasing); per-step error from the first column of B = A S^-1 B_S, O(n);
  noise: identity's C^-1 = I by recursion, sqrt's dense operator (n <= the dense limit).
* tree: sensitivity sqrt(K + 1) under single participation, exact in integers under fixed
  epochs (:func:`~mfcli.strategies.tree_error.tree_fixed_epoch_sensitivity`), from the dense C
  under min-separation (n <= the dense limit); per-step error
  :func:`~mfcli.strategies.tree_error.tree_row_norms` (prefix and momentum), O(n log n); iterate
  noise B Z with O(log n) rows of state per parameter (:class:`TreeStream`).
* honaker-online, honaker-full: the tree's C and sensitivity; per-step error on prefix sums
  :func:`~mfcli.strategies.tree_error.honaker_row_norms`, O(n log n), on momentum from the dense
  B (n <= the dense limit); noise from the dense decoder (online only, n <= the dense limit).

What has no exact or certified number at some n (the tree under min-separation, the Honaker
estimators' error on a momentum workload, the sqrt noise stream) is refused above
:data:`mfcli.util.limits.STRUCTURED_DENSE_MAX_N` in one line naming the limit; below it the
number comes from the dense matrices.

Tested against independent derivations: the dense matrices of :mod:`mfcli.strategies.baselines`
with :func:`mfcli.model.participation.sensitivity` (n in {2, 3, 7, 8, 64, 1000}), the tree's total
variance in closed form for n = 2^k, and the noise of the dense tree decoder drawn from the same
Philox rows (tests/test_baseline_mechanisms.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from mfcli.errors import MfcliError
from mfcli.model.factorization import Factorization
from mfcli.model.kinds import ANY_N_BASELINES, DESCRIPTIONS
from mfcli.model.participation import (
    FixedEpoch,
    MinSeparation,
    Participation,
    Sensitivity,
    SingleParticipation,
    Witness,
)
from mfcli.strategies.baselines import (
    build_strategy,
    sqrt_coefficients,
    tree_decoder,
    tree_release_steps,
    tree_strategy_matrix,
)
from mfcli.strategies.operators import (
    MATRIX_FREE_SETTINGS,
    ArrayOps,
    BoundedState,
    DenseLowerTriangular,
    Streaming,
    StreamState,
    WorkloadLoss,
)
from mfcli.strategies.structured import DenseUpToLimit, StructuredOperator
from mfcli.strategies.toeplitz import (
    RationalToeplitz,
    ToeplitzWorkload,
    check_n,
    materialize,
    rational_recursion,
    sqrt_down,
    sqrt_up,
    toeplitz_sensitivity,
)
from mfcli.strategies.tree_error import (
    honaker_row_norms,
    pole,
    restarted_row_norms,
    tree_fixed_epoch_sensitivity,
    tree_height,
    tree_last_cross,
    tree_row_norms,
    tree_rows,
    tree_sensitivity,
)
from mfcli.util.limits import STRUCTURED_DENSE_MAX_N

#: The baselines on a lower-triangular Toeplitz C (their classes below answer for them).
TOEPLITZ_BASELINES = ("identity", "sqrt")


def _impulse(n: int) -> np.ndarray:
    out = np.zeros(n)
    out[0] = 1.0
    return out


def _over_prefix(workload: ToeplitzWorkload) -> np.ndarray:
    """q(z) = den(z) / (1 - z): A S^-1 = num / q for the workloads built on prefix sums (prefix:
    q = 1, momentum: q = 1 - beta z); :class:`MfcliError` if den has no factor 1 - z."""
    den = np.asarray(workload.denominator, dtype=np.float64)
    q = np.cumsum(den)[:-1]  # den_k = q_k - q_{k-1}
    if q.size == 0 or abs(float(np.sum(den))) > 1e-12:
        raise MfcliError(f"the {workload.name} workload is not a post-processing of the prefix sums")
    return q


def closed_form_description(name: str, workload: ToeplitzWorkload) -> str:
    """What the baseline ``name`` is, in words, as a row of any n names it (compare): the kind's
    description, the post-processing for a workload other than the prefix sums."""
    post = "" if workload.name == "prefix" else "; post-processed B = A S^-1 B_S"
    return DESCRIPTIONS[name] + post + " (closed form, no dense matrix)"


@dataclass(frozen=True)
class ToeplitzBaseline(ABC):
    """A baseline on a lower-triangular Toeplitz C as the strategy interface
    :class:`~mfcli.strategies.structured.StructuredOperator` runs (no stored parameters). Each
    kind is a subclass (:class:`IdentityBaseline`, :class:`SqrtBaseline`) that answers for its
    own coefficients, decoder and noise operator; what they share is here."""

    #: The kind's name in the registry (:mod:`mfcli.model.kinds`).
    kind: ClassVar[str]

    @abstractmethod
    def description(self, workload: ToeplitzWorkload) -> str:
        """In words, as a compare row describes it."""

    @abstractmethod
    def strategy_coefs(self, n: int) -> np.ndarray:
        """First column of C, length n."""

    @abstractmethod
    def noising_coefs(self, n: int) -> np.ndarray:
        """First column of C^-1, length n."""

    @abstractmethod
    def workload_decoder(self, workload: ToeplitzWorkload, n: int) -> np.ndarray:
        """First column of B = A S^-1 B_S (B_S = C), length n."""

    @abstractmethod
    def rational(self) -> tuple[np.ndarray, np.ndarray]:
        """C^-1 as a rational filter (numerator, denominator); :class:`MfcliError` where it has none."""

    @abstractmethod
    def recursion(self, workload: ToeplitzWorkload, kind: str, n: int) -> Any:
        """The streamed operator of C^-1 (``kind`` gradient) or B (iterate)."""

    def _sensitivity_coefs(self, n: int) -> np.ndarray:
        """The first column of C that the sensitivity is computed from (n already checked)."""
        return self.strategy_coefs(n)

    def is_identity(self, n: int) -> bool:
        """C (n x n) == I: its first column is the unit impulse (identity at any n; sqrt at n = 1)."""
        return bool(np.array_equal(self.strategy_coefs(n), _impulse(n)))

    def sensitivity(self, n: int, schema: Participation) -> Sensitivity:
        """:func:`mfcli.strategies.toeplitz.toeplitz_sensitivity` of the first column (exact under
        every schema: the coefficients are non-negative and non-increasing)."""
        return toeplitz_sensitivity(self._sensitivity_coefs(check_n(n)), n, schema)

    def parameters(self) -> dict[str, np.ndarray]:
        return {}


@dataclass(frozen=True)
class IdentityBaseline(ToeplitzBaseline):
    """C = I (a 1-band Toeplitz C), B = A for every workload: DP-SGD's independent noise, streamed
    by the recursion C^-1 = 1 / 1 at any n."""

    kind: ClassVar[str] = "identity"

    def description(self, workload: ToeplitzWorkload) -> str:
        """In words (C = I and B = A for every workload, nothing post-processed)."""
        return "C = I (1-band Toeplitz), B = A"

    def strategy_coefs(self, n: int) -> np.ndarray:
        return _impulse(check_n(n))

    def _sensitivity_coefs(self, n: int) -> np.ndarray:
        # the one non-zero coefficient: the schema sensitivity of I without an n-long column
        return np.array([1.0])

    def noising_coefs(self, n: int) -> np.ndarray:
        """1: C^-1 = I."""
        return _impulse(check_n(n))

    def workload_decoder(self, workload: ToeplitzWorkload, n: int) -> np.ndarray:
        """A itself."""
        return workload.coefs(check_n(n))

    def rational(self) -> tuple[np.ndarray, np.ndarray]:
        """C^-1 = 1 / 1."""
        return np.array([1.0]), np.array([1.0])

    def recursion(self, workload: ToeplitzWorkload, kind: str, n: int) -> RationalToeplitz:
        """The streamed operator of the rational form."""
        return rational_recursion(*self.rational(), workload, kind, n)


@dataclass(frozen=True)
class SqrtBaseline(ToeplitzBaseline):
    """C = S^1/2, lower-triangular Toeplitz with coefficients binom(2k, k) / 4^k. C^-1 =
    (1 - z)^(1/2) is no rational filter: its noise is streamed from the dense operator, for n <=
    the dense limit only."""

    kind: ClassVar[str] = "sqrt"

    def description(self, workload: ToeplitzWorkload) -> str:
        return closed_form_description(self.kind, workload)

    def strategy_coefs(self, n: int) -> np.ndarray:
        return sqrt_coefficients(check_n(n))

    def noising_coefs(self, n: int) -> np.ndarray:
        """(1 - z)^(1/2): d_k = d_{k-1} (2k - 3) / (2k)."""
        n = check_n(n)
        k = np.arange(1, n)
        return np.concatenate([[1.0], np.cumprod((2 * k - 3) / (2 * k))])

    def workload_decoder(self, workload: ToeplitzWorkload, n: int) -> np.ndarray:
        """The filter num / q applied to the coefficients of S^1/2 (q = den / (1 - z)), which for
        prefix sums is S^1/2 exactly, with no cancelling sum."""
        import scipy.signal

        n = check_n(n)
        return scipy.signal.lfilter(np.asarray(workload.numerator), _over_prefix(workload), sqrt_coefficients(n))

    def rational(self) -> tuple[np.ndarray, np.ndarray]:
        """None: (1 - z)^(1/2) has no rational form (raises)."""
        raise MfcliError("the sqrt strategy's noise C^-1 = (1 - z)^(1/2) is no rational filter: no recursion streams "
                         f"it; its dense operator is streamed for n <= {STRUCTURED_DENSE_MAX_N} only")

    def recursion(self, workload: ToeplitzWorkload, kind: str, n: int) -> DenseLowerTriangular:
        """No recursion: the dense operator of C^-1 (gradient) or B (iterate), n <= the dense
        limit (above it, the refusal of :meth:`rational`)."""
        if n > STRUCTURED_DENSE_MAX_N:
            self.rational()  # raises: the sqrt noise has no recursion
        coefs = self.noising_coefs(n) if kind == "gradient" else self.workload_decoder(workload, n)
        return DenseLowerTriangular(materialize(coefs, n))


@dataclass(frozen=True, eq=False)
class ToeplitzBaselineMechanism(StructuredOperator):
    """identity or sqrt as a :class:`~mfcli.strategies.operators.Mechanism` of any n: the structured
    operator of a :class:`ToeplitzBaseline` (numbers from the first column, noise from its
    ``recursion``), with no artifact group."""

    matrix_name = "the dense strategy C of a built-in baseline, which is built"

    @property
    def description(self) -> str:
        """What it is, in words (a compare row's description)."""
        return str(self.strategy.description(self.workload))

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict | None:
        """None: a baseline is rebuilt from its name and n; it stores no group."""
        return None


def _dense_workload(workload: ToeplitzWorkload, n: int) -> np.ndarray:
    return materialize(workload.coefs(n), n)


def _prefix_decoder(name: str, s: int) -> np.ndarray:
    """B_S of the tree kind ``name`` on s leaves for the prefix sums (dense, s <= the dense limit)."""
    return np.asarray(build_strategy(name, np.tril(np.ones((s, s)))).factorization.decoder)


def _no_dense(what: str, n: int) -> MfcliError:
    return MfcliError(f"{what} is built from the dense matrices for n <= {STRUCTURED_DENSE_MAX_N} only, got n = {n}")


@dataclass(frozen=True, eq=False)
class TreeEncoderMechanism(DenseUpToLimit):
    """A strategy on the binary-tree encoder as a :class:`~mfcli.strategies.operators.Mechanism`
    of any n (module docstring): C is the tree encoder restricted to n columns (m =
    :func:`tree_rows` rows, released as the nodes close), B the kind's decoder post-processed for
    the workload (B = A S^-1 B_S). What the kinds share (C, its sensitivity, the restarted
    blocks) is here; each kind (:class:`TreeMechanism`, :class:`HonakerMechanism`) answers for its
    decoder: its errors, its causality and its noise stream.

    ``epochs`` > 1: the tree restarted every epoch (``mfcli plan``'s tree rows): one tree on
    s = n / epochs leaves per epoch, C = blockdiag of its encoder, B = A blockdiag(S_s^-1 B_e);
    every number is that C's (sensitivity, losses by
    :func:`~mfcli.strategies.tree_error.restarted_row_norms`); it has no noise stream (one tree
    per epoch is one artifact per epoch) and is not the tree encoder on n leaves, so the tree's own
    settings (``is_tree``) do not apply to it."""

    workload: ToeplitzWorkload
    size: int
    epochs: int = 1

    #: The operator it streams is that of the dense root of a tree artifact (B Z), without the matrix.
    variant = "dense"
    identity_sha256 = None
    matrix_name = "the dense tree encoder C, which is built"
    #: The largest n of the kind's own noise stream (None: any n).
    stream_max_n: ClassVar[int | None] = None

    def __post_init__(self) -> None:
        check_n(self.size)
        e = self.epochs
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 1 or self.size % e:
            raise MfcliError(f"a tree restarted every epoch needs a number of epochs dividing n = {self.size}, "
                             f"got {e!r}")
        tree_height(self.leaves)  # n / epochs >= 2, within the structured limit

    @property
    @abstractmethod
    def name(self) -> str:
        """The kind's name in the registry (:mod:`mfcli.model.kinds`)."""

    @property
    @abstractmethod
    def causal(self) -> bool:
        """B uses only the nodes closed by each step."""

    @abstractmethod
    def _unit(self, wl: ToeplitzWorkload) -> tuple[np.ndarray, str]:
        """(||B[t, :]||^2 at sensitivity 1, method) of one tree on n leaves for the workload ``wl``."""

    @abstractmethod
    def _one_tree(self, wl: ToeplitzWorkload, beta: float) -> tuple[np.ndarray, float, float, str]:
        """(single, last, cross, method) of one tree on s leaves, as
        :func:`~mfcli.strategies.tree_error.restarted_row_norms` takes them (``beta`` the workload's pole)."""

    @abstractmethod
    def _iterate_stream(self, where: str) -> Streaming:
        """The iterate noise B Z of one tree on n leaves."""

    @property
    def description(self) -> str:
        """What it is, in words (a compare row's description)."""
        return closed_form_description(self.name, self.workload)

    @property
    def leaves(self) -> int:
        """s = n / epochs, the leaves of each tree."""
        return self.size // self.epochs

    @property
    def kind(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        return self.name if self.epochs == 1 else f"{self.name} (restarted every {self.leaves} steps)"

    @property
    def n(self) -> int:
        return self.size

    @property
    def is_tree(self) -> bool:
        """C is the tree encoder on n leaves (not when restarted: blocks of a smaller tree)."""
        return self.epochs == 1

    #: The tree has s >= 2 leaves: C has more rows than columns, never I.
    is_identity = False

    @property
    def matrix_free_settings(self) -> tuple[str, ...]:
        """Every mechanism's (:data:`~mfcli.strategies.operators.MATRIX_FREE_SETTINGS`) and, for one
        tree on n leaves, its own bounds: the shuffled tree and the balls-in-bins tree account the
        0/1 encoder on n leaves from n and sigma alone (:mod:`mfcli.accounting.shuffled_tree`,
        :func:`mfcli.accounting.balls_in_bins.tree_balls_in_bins`), which is exactly this C, so
        they run at any n (the balls-in-bins bound for n = 2^L only, as below the limit)."""
        own = ("shuffled-tree", "balls-in-bins-tree") if self.is_tree else ()
        return (*MATRIX_FREE_SETTINGS, *own)

    @property
    def rows(self) -> int:
        return self.epochs * tree_rows(self.leaves)

    @cached_property
    def release_steps(self) -> np.ndarray:
        one = tree_release_steps(self.leaves)
        return np.concatenate([one + ep * self.leaves for ep in range(self.epochs)])

    @property
    def max_n(self) -> Mapping[str, int | None]:
        stream = 0 if self.epochs > 1 else self.stream_max_n
        return {"matrix": STRUCTURED_DENSE_MAX_N, "sensitivity": None, "cyclic": None, "stream": stream}

    @property
    def sensitivity(self) -> float:
        return tree_sensitivity(self.leaves)

    def schema_sensitivity(self, schema: Participation) -> Sensitivity:
        """Single participation: sqrt(K + 1) (every column lies in K + 1 nodes, K = ceil(log2 s) for
        trees of s leaves); fixed-epoch: exact (:func:`tree_fixed_epoch_sensitivity`, restarted
        trees included); min-separation: from the dense C (:func:`mfcli.model.participation.sensitivity`),
        for n <= the dense limit only."""
        n = self.size
        if isinstance(schema, SingleParticipation):
            levels = tree_height(self.leaves) + 1
            return Sensitivity(value=tree_sensitivity(self.leaves), exact=True, lower=sqrt_down(float(levels)),
                               method="every column lies in K + 1 nodes", schema=schema)
        if isinstance(schema, FixedEpoch):
            schema.check(n)
            sens2, j = tree_fixed_epoch_sensitivity(n, schema.epochs, period=self.leaves)
            b = n // schema.epochs
            return Sensitivity(value=sqrt_up(float(sens2)), exact=True, lower=sqrt_down(float(sens2)),
                               method="fixed-epoch: sum over the nodes of |node cap P_j|^2 (all-plus, C >= 0), attained",
                               schema=schema, witness=Witness(pattern=tuple(range(j, n, b)),
                                                              gradients=np.ones((schema.epochs, 1))))
        if isinstance(schema, MinSeparation):
            if n > STRUCTURED_DENSE_MAX_N:
                raise MfcliError(f"the binary tree's sensitivity under {schema.describe(n)} has no closed form: it is "
                                 f"computed from its dense C, for n <= {STRUCTURED_DENSE_MAX_N} only (got n = {n})")
            from mfcli.model.participation import sensitivity

            return sensitivity(self.dense_strategy(), schema)
        raise TypeError(f"schema must be a participation schema, got {type(schema).__name__}")

    def cyclic_numbers(self, schema: Participation) -> tuple[int, float]:
        raise MfcliError(f"cyclic Poisson accounting needs a square lower-triangular C, got shape "
                         f"({self.rows}, {self.size})")

    def check_causal(self, what: str) -> None:
        """The tree encoder is causal in release order by construction (a node is released when
        its interval closes)."""

    def dense_strategy(self) -> np.ndarray:
        one = tree_strategy_matrix(self.leaves)
        return one if self.epochs == 1 else np.kron(np.eye(self.epochs), one)

    def matrix_refusal(self, what: str) -> str:
        return f"{what} needs {self.no_matrix_reason or 'the dense tree encoder C'}"

    @property
    def factorization(self) -> Factorization:
        if self.size > STRUCTURED_DENSE_MAX_N:
            raise _no_dense(f"the {self.name} factorization", self.size)
        a = _dense_workload(self.workload, self.size)
        if self.epochs == 1:
            return build_strategy(self.name, a).factorization
        b_e = _prefix_decoder(self.name, self.leaves)
        m = np.vstack([b_e[:1], np.diff(b_e, axis=0)])  # S_s^-1 B_e: each step's gradient estimate
        return Factorization(workload=a, strategy=self.dense_strategy(), decoder=a @ np.kron(np.eye(self.epochs), m),
                             causal=self.causal)

    def dense(self) -> np.ndarray:
        return np.array(self.factorization.decoder)

    def loss(self, workload: ToeplitzWorkload | None = None, *, schema: Participation | None = None) -> WorkloadLoss:
        """The errors on ``workload`` (None: its own) under ``schema``: the kind's per-step errors
        (restarted: :func:`~mfcli.strategies.tree_error.restarted_row_norms` of one tree's), scaled
        by :meth:`schema_sensitivity`."""
        wl = workload or self.workload
        sens = self.schema_sensitivity(schema or SingleParticipation())
        if self.epochs > 1:
            return WorkloadLoss.scaled(sens, *self._restarted_unit(wl))
        return WorkloadLoss.scaled(sens, *self._unit(wl))

    def _restarted_unit(self, wl: ToeplitzWorkload) -> tuple[np.ndarray, str]:
        """(||B[t, :]||^2, method) of the tree restarted every epoch
        (:func:`~mfcli.strategies.tree_error.restarted_row_norms`), from three numbers of one tree
        on s leaves (:meth:`_one_tree`)."""
        beta = pole(wl)  # refuses a workload that is not prefix sums post-processed by 1 / (1 - beta z)
        single, last, cross, method = self._one_tree(wl, beta)
        return restarted_row_norms(single, last, cross, beta, self.epochs), method

    def streaming(self, kind: str, *, where: str = "artifact") -> Streaming:
        """Iterate noise B Z (C is not square: there is no gradient noise C^-1 Z), the kind's own
        (:meth:`_iterate_stream`). A tree restarted every epoch has none (one tree per epoch is one
        artifact per epoch)."""
        if self.epochs > 1:
            raise MfcliError(f"{where}: the {self.label} has no noise stream of its own: one tree per epoch is one "
                             "artifact (and one stream) per epoch")
        if kind == "gradient":
            raise MfcliError(f"{where}: the {self.name} strategy is {self.rows} x {self.size}: gradient noise C^-1 Z "
                             "needs a square strategy (use kind='iterate' for B Z)")
        if kind != "iterate":
            raise MfcliError(f"noise kind must be 'gradient' (C^-1 Z) or 'iterate' (B Z), got {kind!r}")
        return self._iterate_stream(where)

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict | None:
        """None: a baseline is rebuilt from its name and n; it stores no group."""
        return None


@dataclass(frozen=True, eq=False)
class TreeMechanism(TreeEncoderMechanism):
    """The binary tree (each prefix sum from its minimal dyadic decomposition) as a mechanism of
    any n: per-step errors :func:`~mfcli.strategies.tree_error.tree_row_norms` (prefix and
    momentum) in O(n log n), iterate noise B Z with O(log n) rows of state per parameter
    (:class:`TreeStream`) at any n."""

    #: Causal: row t of B uses the nodes closed by step t.
    causal = True

    @property
    def name(self) -> str:
        return "tree"

    def _unit(self, wl: ToeplitzWorkload) -> tuple[np.ndarray, str]:
        return tree_row_norms(wl, self.size), "closed form, O(n log n)"

    def _one_tree(self, wl: ToeplitzWorkload, beta: float) -> tuple[np.ndarray, float, float, str]:
        s = self.leaves
        last = float(bin(s).count("1"))  # row s - 1 of B_S: one node per set bit of s
        cross = tree_last_cross(s, beta) if beta else last
        return tree_row_norms(wl, s), last, cross, "closed form per tree, O(n log n)"

    def _iterate_stream(self, where: str) -> Streaming:
        return Streaming(TreeStream.of(self.workload, self.size), None)


@dataclass(frozen=True, eq=False)
class HonakerMechanism(TreeEncoderMechanism):
    """A Honaker estimator on the tree's encoder as a mechanism of any n: ``online`` (the
    minimum-norm estimate over the nodes closed so far, causal) or the full, offline one (B = S C^+
    over all nodes, not causal). Per-step errors on prefix sums
    :func:`~mfcli.strategies.tree_error.honaker_row_norms` in O(n log n), on another workload from
    the dense B (n <= the dense limit); noise from the dense decoder (online only, n <= the dense
    limit)."""

    online: bool = True

    stream_max_n = STRUCTURED_DENSE_MAX_N

    @property
    def name(self) -> str:
        return "honaker-online" if self.online else "honaker-full"

    @property
    def causal(self) -> bool:
        """The offline estimator's B uses nodes that close later."""
        return bool(self.online)

    def _unit(self, wl: ToeplitzWorkload) -> tuple[np.ndarray, str]:
        if wl.name == "prefix":
            return honaker_row_norms(self.size, online=self.online), "closed form, O(n log n)"
        if self.size > STRUCTURED_DENSE_MAX_N:
            raise MfcliError(f"the {self.name} error has a closed form for the prefix workload only; on the "
                             f"{wl.name} workload it is computed from the dense decoder, for n <= "
                             f"{STRUCTURED_DENSE_MAX_N} only (got n = {self.size})")
        b = build_strategy(self.name, _dense_workload(wl, self.size)).factorization.decoder
        return np.einsum("ij,ij->i", b, b), "dense B"

    def _one_tree(self, wl: ToeplitzWorkload, beta: float) -> tuple[np.ndarray, float, float, str]:
        s = self.leaves
        if beta == 0.0:
            single = honaker_row_norms(s, online=self.online)
            return single, float(single[-1]), float(single[-1]), "closed form per tree, O(n log n)"
        if s > STRUCTURED_DENSE_MAX_N:
            raise MfcliError(f"the {self.name} error has a closed form for the prefix workload only; on the "
                             f"{wl.name} workload it is computed from one tree's dense decoder, for trees of at "
                             f"most {STRUCTURED_DENSE_MAX_N} leaves (got {s} steps per tree)")
        import scipy.signal

        b_e = _prefix_decoder(self.name, s)
        d = scipy.signal.lfilter([1.0], [1.0, -beta], b_e, axis=0)  # D = P_s B_e
        return np.einsum("ij,ij->i", d, d), float(b_e[-1] @ b_e[-1]), float(d[-1] @ b_e[-1]), \
            "dense B of one tree, O(n + s^2)"

    def _iterate_stream(self, where: str) -> Streaming:
        if not self.online:
            raise MfcliError(f"{where}: honaker-full is not causal (an offline-only strategy): it cannot be streamed")
        if self.size > STRUCTURED_DENSE_MAX_N:
            raise _no_dense("the honaker-online noise stream", self.size)
        return Streaming(DenseLowerTriangular(self.dense()), None)


# ---------------------------------------------------------------------------------------------
# The tree's noise stream


@dataclass(frozen=True, eq=False)
class TreeStream(BoundedState):
    """B Z for the binary tree (B = A S^-1 B_S), streamed with one row of state per level.

    Z has one row per node, in release order (the row index of a node in the tree encoder, as the
    dense decoder's stream draws it). Step t draws the level-L node that closes at t (L the lowest
    set bit of t + 1; its row is R(t) + L with R(t) = sum_l floor(t / 2^l) the nodes closed before
    t), keeps it in slot L and clears the slots below: slot l then holds the node of the minimal
    dyadic decomposition of [0, t] at level l, or zero, and their sum is B_S Z at step t. A
    workload post = A S^-1 = 1 / q(z) (prefix: q = 1; momentum: q = 1 - beta z) runs on that sum:
    y_t = s_t - sum_{k>=1} q_k y_{t-k}, len(q) - 1 more rows of state. State: K + 1 + len(q) - 1
    rows of d floats, nothing redrawn (``width`` 0).
    """

    n: int
    post: np.ndarray

    method = "binary-tree"
    #: No rows of Z are kept (nothing is redrawn on resume).
    width = 0

    @classmethod
    def of(cls, workload: ToeplitzWorkload, n: int) -> TreeStream:
        return cls(int(n), np.asarray(_over_prefix(workload), dtype=np.float64))

    @property
    def levels(self) -> int:
        return tree_height(self.n) + 1

    @property
    def rank(self) -> int:
        return self.levels + int(self.post.size - 1)

    def _low(self) -> np.ndarray:
        t1 = np.arange(1, self.n + 1, dtype=np.int64)
        return np.log2(t1 & -t1).astype(np.int64)

    def _draw_rows(self) -> np.ndarray:
        t = np.arange(self.n, dtype=np.int64)
        closed = np.zeros(self.n, dtype=np.int64)
        for lvl in range(self.levels):
            closed += t >> lvl
        return closed + self._low()

    def dense(self) -> np.ndarray:
        """The n x m operator (the tree decoder B), for tests and the dense check of its rows."""
        import scipy.signal

        b = tree_decoder(self.n)
        return scipy.signal.lfilter([1.0], self.post, b, axis=0)

    def fingerprint_arrays(self) -> tuple[np.ndarray, ...]:
        return (self.post, np.array([float(self.n)]))

    def tables(self) -> dict[str, np.ndarray]:
        lv = self.levels
        idx = np.arange(lv)
        keep = (idx[None, :] > idx[:, None]).astype(np.float64)  # keep[L, l]: slot l survives a close at level L
        onehot = np.eye(lv)
        r = self.post.size - 1
        extra = np.zeros((lv, r))
        out = np.concatenate([np.ones(lv), -self.post[1:]])
        return {"low": self._low(), "draw": self._draw_rows(),
                "keep": np.hstack([keep, np.ones((lv, r))]) if r else keep,
                "put": np.hstack([onehot, extra]) if r else onehot, "out": out}

    def step(self, t: Any, draw: Callable[[Any], Any], state: StreamState, tab: Mapping[str, Any],
             xp: ArrayOps) -> tuple[Any, StreamState]:
        ring, carry = state
        z = draw(tab["draw"][t])
        low = tab["low"][t]
        carry = xp.scale_add(carry, tab["keep"][low], 0.0 * z)
        carry = xp.add_outer(carry, tab["put"][low], z)
        y = xp.matvec(tab["out"], carry)
        r = self.post.size - 1
        if r:
            lv = self.levels
            if r > 1:
                carry = xp.set_rows(carry, lv + 1, carry[lv:lv + r - 1])
            carry = xp.set_row(carry, lv, y)
        return y, (ring, carry)

    def kept_rows(self, t: int) -> list[tuple[int, int]]:
        return []

    def abs_row_sums(self) -> np.ndarray:
        """sum_u |B[t, u]|: B >= 0 (prefix and momentum), so the filter of popcount(t + 1)."""
        import scipy.signal

        t1 = np.arange(1, self.n + 1, dtype=np.int64)
        count = np.zeros(self.n)
        for lvl in range(self.levels):
            count += (t1 >> lvl) & 1
        return np.abs(scipy.signal.lfilter([1.0], self.post, count))


# ---------------------------------------------------------------------------------------------
# The one constructor


def _toeplitz(strategy: ToeplitzBaseline) -> Callable[[ToeplitzWorkload, int, int], ToeplitzBaselineMechanism]:
    """The constructor of a Toeplitz baseline's mechanism: one strategy over all n steps."""

    def build(workload: ToeplitzWorkload, n: int, epochs: int) -> ToeplitzBaselineMechanism:
        if epochs != 1:
            raise MfcliError(f"{strategy.kind} is one Toeplitz strategy over all n steps; it is not restarted per epoch")
        return ToeplitzBaselineMechanism(strategy, workload, n)

    return build


def _honaker(online: bool) -> Callable[[ToeplitzWorkload, int, int], HonakerMechanism]:
    return lambda workload, n, epochs: HonakerMechanism(workload, n, epochs, online=online)


#: {name: constructor (workload, n, epochs)} of every baseline with a form of any n
#: (:data:`mfcli.model.kinds.ANY_N_BASELINES`; tests/test_kind_answers.py checks the keys).
ANY_N_CONSTRUCTORS: dict[str, Callable[[ToeplitzWorkload, int, int], ToeplitzBaselineMechanism | TreeEncoderMechanism]] = {
    "identity": _toeplitz(IdentityBaseline()),
    "tree": TreeMechanism,
    "honaker-online": _honaker(True),
    "honaker-full": _honaker(False),
    "sqrt": _toeplitz(SqrtBaseline()),
}


def baseline_mechanism(name: str, workload: ToeplitzWorkload, n: int, *,
                       epochs: int = 1) -> ToeplitzBaselineMechanism | TreeEncoderMechanism:
    """The baseline ``name`` (identity, tree, honaker-online, honaker-full, sqrt) for the Toeplitz
    ``workload`` over n steps, as a mechanism of any n (its constructor in
    :data:`ANY_N_CONSTRUCTORS`); ``epochs`` > 1 (tree kinds only): the tree restarted every n /
    epochs steps (:class:`TreeEncoderMechanism`).

    Raises:
        MfcliError: ``optimal`` or an unknown name (the certified optimum is a dense solve), n out
            of range, a tree for n < 2 (or fewer than 2 steps per epoch), ``epochs`` for a
            Toeplitz baseline.
    """
    if name not in ANY_N_BASELINES:
        raise MfcliError(f"{name!r} is no baseline with a form of any n; choose from {', '.join(ANY_N_BASELINES)}")
    return ANY_N_CONSTRUCTORS[name](workload, check_n(n), epochs)


__all__ = ["ANY_N_CONSTRUCTORS", "TOEPLITZ_BASELINES", "HonakerMechanism", "IdentityBaseline", "SqrtBaseline",
           "ToeplitzBaseline", "ToeplitzBaselineMechanism", "TreeEncoderMechanism", "TreeMechanism", "TreeStream",
           "baseline_mechanism"]
