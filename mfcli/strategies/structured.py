"""Structured (Toeplitz) strategies as first-class mechanisms: the kind registry, the artifact
group ``structured``, the noise operator and the streamed recursion (docs/artifact-format.md,
docs/noise-streams.md).

A structured strategy stores parameters, never an n x n matrix. Every kind is a frozen dataclass
with ``kind``, ``strategy_coefs(n)``, ``noising_coefs(n)``, ``parameters()``,
``from_parameters(params)``, ``sensitivity(n, schema)`` and ``rational()`` (C^-1 as a rational
filter, so that noise streams in O(order x d)); :data:`KINDS` maps the kind name to the class.
:func:`strategy_class` maps ``banded-toeplitz`` to :class:`mfcli.strategies.toeplitz.BandedToeplitz` and ``blt``
to :class:`mfcli.strategies.blt.BufferedToeplitz` (datasets ``theta`` and ``omega``).

An artifact of a structured strategy has the root attributes of every artifact (``format``,
``n``, ``workload_name``, ``sensitivity``, ``loss_*`` at single participation, ``participation``)
and no root datasets; group ``structured`` has attribute ``kind``, one checksummed dataset per
parameter, and the schema's sensitivity and losses (``schema_sensitivity``, ``schema_loss_mean``,
``schema_loss_max``), all recomputed from the parameters on load and compared. The reader and
writer of that file are the artifact module's (:func:`mfcli.io.artifact.load_structured_artifact`,
:func:`mfcli.io.artifact.save_structured_artifact`, :func:`mfcli.io.artifact.load_any_artifact`).

Noise: with C^-1 = num(z) / den(z) (banded Toeplitz: num = 1, den = c), gradient noise x = C^-1 Z
and iterate noise B Z = A C^-1 Z (den multiplied by the workload's denominator) are the IIR
recursions den_0 x_t = sum_k num_k z_{t-k} - sum_{k>=1} den_k x_{t-k}: O((len num + len den) d)
memory and time per step.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mfcli.errors import ArtifactError, MfcliError
from mfcli.model.participation import Participation, Sensitivity, SingleParticipation
from mfcli.strategies.blt import BltRecursion, BufferedToeplitz
from mfcli.strategies.operators import MATRIX_FREE_SETTINGS, WorkloadLoss
from mfcli.strategies.toeplitz import (
    MAX_BANDS,
    BandedToeplitz,
    Loss,
    RationalToeplitz,
    ToeplitzWorkload,
    check_n,
    loss_from_decoder,
    materialize,
)
from mfcli.util.limits import STRUCTURED_DENSE_MAX_N

#: The most values a parameter dataset of any structured kind holds (a banded Toeplitz strategy's
#: MAX_BANDS coefficients; a BLT has at most 32 buffers): the loader refuses a larger declaration
#: before reading it.
MAX_PARAMETER_VALUES = MAX_BANDS

GROUP = "structured"
ATTR_RTOL = 1e-9
VARIANT = "structured"
IDENTITY_TAG = "mfcli.operator.structured.v1"


def strategy_class(kind: str) -> Any:
    """The class of a structured kind; :class:`MfcliError` for an unknown one."""
    # each class names its own kind (tests/test_kinds.py checks them against mfcli.model.kinds.STRUCTURED)
    kinds: dict[str, Any] = {cls.kind: cls for cls in (BandedToeplitz, BufferedToeplitz)}
    if kind not in kinds:
        raise MfcliError(f"structured kind must be one of {', '.join(kinds)}, got {kind!r}")
    return kinds[kind]


def rational(strategy: Any) -> tuple[np.ndarray, np.ndarray]:
    """C^-1 as num(z) / den(z), as the strategy's kind gives it (``rational()``)."""
    num, den = strategy.rational()
    return np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)


def decoder_coefs(strategy: Any, workload: ToeplitzWorkload, n: int) -> np.ndarray:
    """First column of B = A C^-1 for any kind, as the kind computes it (``workload_decoder``: the
    rational form for banded Toeplitz, the exponential-sum form of C^-1 for a BLT, closed forms for
    the baselines)."""
    return np.asarray(strategy.workload_decoder(workload, check_n(n)), dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The numbers an artifact stores (recomputed by mfcli.io.artifact's reader and writer)


def workload_params(workload: ToeplitzWorkload) -> dict[str, Any]:
    return {"lr": "constant"} | ({"beta": workload.beta} if workload.name == "momentum" else {})


def evaluate(strategy: Any, workload: ToeplitzWorkload, n: int,
             schema: Participation) -> tuple[Sensitivity, Sensitivity, Loss, Loss]:
    """Single and schema sensitivity and loss, recomputed from the parameters in O(n order).

    Raises:
        ArtifactError: a derived number is not finite (:func:`check_finite_numbers`).
    """
    single = strategy.sensitivity(n, SingleParticipation())
    sens = strategy.sensitivity(n, schema)
    with np.errstate(over="ignore", invalid="ignore"):
        beta = decoder_coefs(strategy, workload, n)
        out = single, sens, loss_from_decoder(beta, single.value), loss_from_decoder(beta, sens.value)
    check_finite_numbers(*out, n=n)
    return out


def check_finite_numbers(single: Sensitivity, sens: Sensitivity, loss: Loss, sloss: Loss, *, n: int) -> None:
    """Refuse a strategy whose sensitivities or losses over n steps are not finite numbers.

    An infinite or NaN loss means the decoder B = A C^-1 (and with it the noise C^-1 Z the
    trainer adds) overflows within n steps: e.g. banded coefficients (1, 2), whose noising
    coefficients grow as 2^t, or (1e-300, 1), whose first is 1e300. Such a file would compare
    inf with inf and pass; it is refused on write and on read instead.

    Raises:
        ArtifactError: naming the first non-finite number.
    """
    import math

    named = [("sensitivity", single.value), ("schema_sensitivity", sens.value), ("loss_total", loss.total),
             ("loss_mean", loss.mean), ("loss_max", loss.max), ("schema_loss_total", sloss.total),
             ("schema_loss_mean", sloss.mean), ("schema_loss_max", sloss.max)]
    for name, value in named:
        if not math.isfinite(value):
            raise ArtifactError(f"the strategy's {name} over n = {n} steps is {value!r}, not a finite number "
                                "(its noise C^-1 Z or decoder B = A C^-1 overflows): refused")


def banded_numbers(strategy: Any, n: int) -> tuple[int, float]:
    """(bands, max column norm) of a lower-triangular Toeplitz C from its first column c (cut at
    n), all 2306.08153 Thm. 3 needs: the band count is 1 + the last non-zero index of c and the
    longest column is the first, ||c||_2. O(n). (A BLT's C has non-zero entries all the way down,
    so it meets the theorem's condition only with one cycle of n groups.)

    Raises:
        MfcliError: an all-zero C.
    """
    c = np.asarray(strategy.strategy_coefs(n), dtype=np.float64)
    nz = np.nonzero(c)[0]
    if nz.size == 0:
        raise MfcliError("the strategy is all zeros")
    # the certified single-participation sensitivity (never below ||c||; issue 26 item 1)
    return int(nz[-1]) + 1, float(strategy.sensitivity(n, SingleParticipation()).value)


def single_pass_epsilon(art: Any, *, sigma: float, delta: float) -> Any:
    """The deterministic-participation guarantee of a structured artifact: C G + sigma Z is a
    Gaussian mechanism with L2 sensitivity S, the schema sensitivity (an upper bound over every
    pair of adjacent inputs the schema allows, for any gradient dimension), so it is mu-GDP with
    mu = S / sigma whatever the participation pattern (no sampling amplification). O(n) time.
    Returns :class:`mfcli.accounting.single_pass.SinglePassResult`."""
    from mfcli.accounting.single_pass import single_pass

    return single_pass(sigma=sigma, sensitivity=art.schema_sensitivity.value, delta=delta)


# ---------------------------------------------------------------------------------------------
# Noise operator


class DenseUpToLimit(ABC):
    """The dense C of a mechanism known by its parameters, for n <= STRUCTURED_DENSE_MAX_N only
    (n^2 doubles, 512 MiB there): :meth:`accounting_matrix` and ``no_matrix_reason`` of the
    Mechanism protocol, from ``size``, :meth:`dense_strategy` and ``matrix_name`` (what the
    dense C is, in words)."""

    size: int
    matrix_name = "the dense strategy C, which is materialised from a structured artifact"

    @property
    def matrix_free_settings(self) -> tuple[str, ...]:
        """The settings run without C above the limit (a kind adds those its structure gives)."""
        return MATRIX_FREE_SETTINGS

    @abstractmethod
    def dense_strategy(self) -> np.ndarray:
        """C as a dense matrix; each kind builds it from its own parameters."""

    def accounting_matrix(self) -> np.ndarray | None:
        return None if self.size > STRUCTURED_DENSE_MAX_N else self.dense_strategy()

    @property
    def no_matrix_reason(self) -> str | None:
        """Why :meth:`accounting_matrix` is None (None when it is not)."""
        if self.size <= STRUCTURED_DENSE_MAX_N:
            return None
        return f"{self.matrix_name} for n <= {STRUCTURED_DENSE_MAX_N} only (this one has n = {self.size})"


@dataclass(frozen=True, eq=False)
class StructuredOperator(DenseUpToLimit):
    """A structured mechanism as it runs: the Mechanism protocol without n x n matrices
    (``factorization`` and ``dense`` only for n <= STRUCTURED_DENSE_MAX_N), of any kind whose
    strategy gives ``strategy_coefs(n)``, ``sensitivity(n, schema)``, ``parameters()``, C^-1
    (``rational()`` or ``noising_coefs(n)``) and optionally B (``workload_decoder``): banded
    Toeplitz, BLT, and the Toeplitz baselines identity and sqrt
    (:mod:`mfcli.strategies.baseline_mechanisms`)."""

    strategy: Any
    workload: ToeplitzWorkload
    size: int

    variant = VARIANT

    @property
    def kind(self) -> str:
        return str(self.strategy.kind)

    @property
    def label(self) -> str:
        params = ", ".join(f"{k} {v.size}" for k, v in self.strategy.parameters().items())
        return f"{self.strategy.kind} ({params})" if params else str(self.strategy.kind)

    @property
    def n(self) -> int:
        return self.size

    @property
    def sensitivity(self) -> float:
        """Single participation, like every operator's ``sensitivity``."""
        return float(self.strategy.sensitivity(self.size, SingleParticipation()).value)

    # -- accounting (the Mechanism protocol): from the parameters at any n; the dense C only up
    # to STRUCTURED_DENSE_MAX_N (n^2 doubles, 512 MiB there), for the settings that need the matrix

    @property
    def max_n(self) -> Mapping[str, int | None]:
        return {"matrix": STRUCTURED_DENSE_MAX_N, "sensitivity": None, "cyclic": None, "stream": None}

    @property
    def release_steps(self) -> np.ndarray:
        return np.arange(self.size)

    def schema_sensitivity(self, schema: Participation) -> Sensitivity:
        return self.strategy.sensitivity(self.size, schema)

    def cyclic_numbers(self, schema: Participation) -> tuple[int, float]:
        # the cycle length is checked against the band count by accounting.multi.reduced_dpsgd
        return banded_numbers(self.strategy, self.size)

    #: A Toeplitz C is square: never the binary tree.
    is_tree = False

    @property
    def is_identity(self) -> bool:
        """C == I exactly, as its kind answers from its parameters (``is_identity(n)``)."""
        return bool(self.strategy.is_identity(self.size))
    #: C and B = A C^-1 are lower-triangular Toeplitz.
    causal = True

    @property
    def rows(self) -> int:
        return self.size

    def check_causal(self, what: str) -> None:
        """A Toeplitz C is lower-triangular by construction and released row by row."""

    def dense_strategy(self) -> np.ndarray:
        return materialize(self.strategy.strategy_coefs(self.size), self.size)

    def matrix_refusal(self, what: str) -> str:
        return (f"{what} needs {self.matrix_name} for "
                f"n <= {STRUCTURED_DENSE_MAX_N} only (this one has n = {self.size}); above that, it is "
                "accounted without sampling (Gaussian at the schema sensitivity), under Poisson sampling by DP-SGD "
                "only (it needs no C) or, for banded Toeplitz, under cyclic Poisson sampling")

    @property
    def identity_sha256(self) -> str:
        """SHA-256 over the tag, the kind, n, the workload and each parameter's dataset_sha256."""
        from mfcli.model.artifact_format import dataset_sha256

        h = hashlib.sha256()
        h.update(f"{IDENTITY_TAG}|{self.strategy.kind}|{self.size}|{self.workload.name}|{self.workload.beta!r}".encode())
        for name, arr in sorted(self.strategy.parameters().items()):
            h.update(f"|{name}|{dataset_sha256(np.asarray(arr, dtype=np.float64))}".encode())
        return h.hexdigest()

    def _check_dense(self) -> None:
        if self.size > STRUCTURED_DENSE_MAX_N:
            raise MfcliError(f"a dense matrix of a structured strategy is built for n <= {STRUCTURED_DENSE_MAX_N} only, "
                             f"got n = {self.size}")

    @property
    def factorization(self) -> Any:
        from mfcli.model.factorization import Factorization

        self._check_dense()
        c = materialize(self.strategy.strategy_coefs(self.size), self.size)
        a = materialize(self.workload.coefs(self.size), self.size)
        b = materialize(decoder_coefs(self.strategy, self.workload, self.size), self.size)
        return Factorization(workload=a, strategy=c, decoder=b, causal=True)

    def dense(self) -> np.ndarray:
        self._check_dense()
        return materialize(decoder_coefs(self.strategy, self.workload, self.size), self.size)

    def streaming(self, kind: str, *, where: str = "artifact") -> Any:
        from mfcli.strategies.operators import Streaming

        if kind not in ("gradient", "iterate"):
            raise MfcliError(f"noise kind must be 'gradient' (C^-1 Z) or 'iterate' (B Z), got {kind!r}")
        # each kind streams its own recursion (banded Toeplitz: 1 / c(z); BLT: its buffers)
        return Streaming(self.strategy.recursion(self.workload, kind, self.size), None)

    def group(self, *, source: Mapping[str, Any] | None = None) -> dict | None:
        return {"datasets": self.strategy.parameters(), "attrs": {"kind": self.strategy.kind}}

    def loss(self, workload: ToeplitzWorkload | None = None, *, schema: Participation | None = None) -> WorkloadLoss:
        """The errors on ``workload`` (None: its own; any Toeplitz workload) under ``schema`` from
        the parameters in O(n order): sens from :meth:`schema_sensitivity`, ||B[t, :]||^2 the
        running sum of the squared first column of B = A C^-1 (B is Toeplitz)."""
        sens = self.strategy.sensitivity(self.size, schema or SingleParticipation())
        beta = decoder_coefs(self.strategy, workload or self.workload, self.size)
        unit = np.cumsum(beta * beta)
        return WorkloadLoss(sens, unit, sens.value**2 * unit, "first column of the Toeplitz B")



__all__ = [
    "GROUP",
    "BltRecursion",
    "RationalToeplitz",
    "StructuredOperator",
    "banded_numbers",
    "check_finite_numbers",
    "decoder_coefs",
    "evaluate",
    "single_pass_epsilon",
    "strategy_class",
]
