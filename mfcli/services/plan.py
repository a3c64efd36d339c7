"""From a training setup to a ranked list of mechanisms, each calibrated to the privacy target
(docs/plan.md; ``mfcli plan`` renders it).

A trainer states the data (``examples``), the batch size, the epochs (or steps), the workload the
optimizer applies to the noisy gradients (prefix sums for SGD, momentum), the target (epsilon,
delta) and the batch samplers the training loop can run. :func:`enumerate_candidates` lists every
mechanism whose accounting applies to an allowed sampler (and says why the others are skipped);
:func:`evaluate` builds one candidate's operator, calibrates sigma under its accounting and
measures its error; :func:`run_plan` evaluates them all on an executor (a process pool over the
local cores, or a Dask cluster) and :func:`rank` orders them.

Setup: n = epochs * s steps, s = ceil(examples / batch) steps per epoch, sampling rate
q = batch / examples.

Units. sigma (``noise_std``) is the standard deviation of the Gaussian noise Z added to C G (G the
clipped gradients, clip norm 1), for C as built. The noise multiplier (the primary number, as
Opacus and jax_privacy use it) is sigma / sensitivity, the sensitivity of that C under the
participation the row's accounting assumes: the largest column norm (one participation) for the
sampled rows (DP-SGD, BandMF under cyclic Poisson, the balls-in-bins rows), the fixed-epoch schema
sensitivity for the fixed-order rows; for DP-SGD (C = I) both are sigma. The
released iterates are A G + B Z with B = A C^-1 (the tree: its decoder), so the noise of the
iterate at step t has standard deviation sigma ||B[t, :]|| per coordinate. ``rmse_mean`` is the
root mean square of that over the n steps, sqrt(mean_t sigma^2 ||B[t, :]||^2), and ``rmse_max``
its largest value; both are computed from the operator that runs (the dense B, the Toeplitz
decoder's first column for the structured strategies, the closed form of the tree restarted every
epoch for the tree and Honaker rows: its mechanism's ``loss``, at any n).

Training cost, of the noise stream the written artifact actually runs (mfcli.training.noise; the same
recursion in numpy, torch and optax): ``memory_floats`` is the floats it keeps between steps per
model parameter (identity 0, b-banded Toeplitz b - 1, BLT one per buffer, and every artifact
written dense, the dense optimum and the tree, all n noise rows, since row t of a general C^-1 Z
needs every earlier row of Z); ``memory_bytes`` is that times ``params`` in float32.
``noise_madds`` is the multiply-adds of d floats per step, averaged over the n steps (identity 0,
b-banded b - 1, BLT 2 per buffer: one to read each buffer, one to update it; dense (n - 1) / 2),
on top of the one Gaussian row every mechanism draws.

Results are a pure function of the setup and the candidate (seeded optimisers, BLAS pinned to
one thread), so every executor returns the same numbers; only ``seconds`` differs.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mfcli.accounting.calibrate import SIGMA_MAX, SIGMA_MIN, Calibration, TargetMetWithoutNoiseError, calibrate_sigma
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, SingleParticipation
from mfcli.util.limits import PLAN_DENSE_ARTIFACT_MAX_N, PLAN_DENSE_SOLVE_MAX_N, PLAN_MAX_N
from mfcli.util.validation import positive_int

#: Batch samplers a trainer can allow (``--batching``).
SAMPLERS = ("poisson", "cyclic", "balls-in-bins", "shuffle", "fixed-order")
#: The samplers plan evaluates unless told otherwise: all but balls-in-bins. Its rows are never
#: recommended (their guarantees assume contributions fixed in advance) and DP-SGD's balls-in-bins
#: calibration costs about 13 s of CPU per evaluation at 235 steps per epoch x 20 epochs (minutes
#: per plan), so they are computed when asked for (``batching`` naming it).
DEFAULT_SAMPLERS = ("poisson", "cyclic", "shuffle", "fixed-order")


def check_sampler(name: str) -> str:
    """``name`` if it is one of :data:`SAMPLERS`; else MfcliError naming the choices."""
    if name not in SAMPLERS:
        raise MfcliError(f"unknown batch sampler {name!r}; choose from {', '.join(SAMPLERS)}")
    return name


#: What each sampler does, in words (the table and the record name it).
SAMPLER_TEXT = {
    "poisson": "Poisson: every example in every step with probability q = batch / examples",
    "cyclic": "cyclic Poisson: each example in one of b groups (uniform, independent), group i mod b sampled at "
              "rate b q at step i",
    "balls-in-bins": "balls-in-bins: every epoch, each example in exactly one uniformly random step",
    "shuffle": "one shuffled epoch of batch size 1",
    "fixed-order": "fixed order: each example in one of s slots (uniform, independent), slot i mod s at step i "
                   "(every epoch the same)",
}
#: DP-SGD's participation (no schema: Poisson sampling in every step), as the accounting rows name it.
POISSON_PARTICIPATION = {"kind": "poisson", "description": "any number of participations (Poisson sampling in every step)"}
#: Workloads plan supports: the Toeplitz ones (structured strategies run at any n).
WORKLOADS = ("prefix", "momentum")
#: Default band counts (kept where they fit the setup) and BLT buffer counts.
DEFAULT_BANDS = (2, 4, 8, 16, 32, 64)
DEFAULT_BUFFERS = (2, 4)
#: Relative width of the final sigma bracket of every calibration.
REL_TOL = 1e-3
#: PLD value discretization of the Poisson accountings (DP-SGD, cyclic Poisson). dp-accounting's
#: pessimistic PLD is an upper bound at any discretization; 1e-3 instead of the default 1e-4 makes
#: one evaluation at n = 4700 steps about 50 times faster for an epsilon about 0.2 % larger. The
#: record stores it, so ``mfcli account --value-discretization 1e-3`` re-accounts the same way.
PLD_DISCRETIZATION = 1e-3
#: Relative difference of mean RMSE within which two candidates are a near-tie: the cheaper noise
#: stream (fewer multiply-adds per step, then less memory) ranks first, since a 0.5 % error
#: difference is below what seed noise shows in training while a dense stream costs O(n d) per step.
TIE_RTOL = 5e-3




def check_epochs(epochs: Any) -> int:
    """A number of training epochs: a positive integer."""
    if isinstance(epochs, (int, np.integer)) and not isinstance(epochs, bool) and epochs == 0:
        raise MfcliError("zero epochs train nothing; give at least 1 epoch")
    return positive_int(epochs, "the number of epochs")


@dataclass(frozen=True)
class TrainingSetup:
    """What the trainer knows. Give ``epochs`` or ``steps`` (a multiple of the steps per epoch).

    Raises:
        MfcliError: in one line, with what would work instead.
    """

    examples: int
    batch: int
    epsilon: float
    epochs: int | None = None
    steps: int | None = None
    delta: float = 1e-6
    workload: str = "prefix"
    beta: float = 0.9
    params: int = 1
    batching: tuple[str, ...] = DEFAULT_SAMPLERS
    bands: tuple[int, ...] | None = None
    buffers: tuple[int, ...] = DEFAULT_BUFFERS
    curve: tuple[float, ...] = ()
    max_stream_bytes: int | None = None
    #: bytes one accounting run may use (None: :func:`mfcli.util.memory.memory_left` when plan runs);
    #: a row whose calibration needs more at the least is skipped (:func:`pld_memory_refusal`)
    max_memory: int | None = None

    def __post_init__(self) -> None:
        from mfcli.accounting.single_pass import check_delta
        from mfcli.model.workloads import check_beta
        from mfcli.util.validation import positive_number

        ex = positive_int(self.examples, "the number of examples")
        b = positive_int(self.batch, "the batch size")
        if b > ex:
            raise MfcliError(f"the batch ({b}) is larger than the data set ({ex} examples); use a batch of at most {ex}")
        s = math.ceil(ex / b)
        if (self.epochs is None) == (self.steps is None):
            raise MfcliError("give the number of epochs or the number of steps (one of them)")
        if self.epochs is not None:
            epochs = check_epochs(self.epochs)
        else:
            steps = positive_int(self.steps, "the number of steps")
            if steps % s:
                raise MfcliError(f"{steps} steps is not a whole number of epochs of {s} steps; give a multiple of {s} "
                                 f"(e.g. {max(1, round(steps / s)) * s}) or a number of epochs")
            epochs = steps // s
        if epochs * s > PLAN_MAX_N:
            raise MfcliError(f"{epochs} epochs of {s} steps is n = {epochs * s} steps, over plan's limit of "
                             f"{PLAN_MAX_N} (its evaluation grows faster than n: minutes per candidate at n = 10^5); "
                             + (f"train at most {PLAN_MAX_N // s} epochs of {s} steps, or use larger batches"
                                if s <= PLAN_MAX_N else f"use batches of at least {math.ceil(ex / PLAN_MAX_N)}"))
        object.__setattr__(self, "epochs", epochs)
        object.__setattr__(self, "steps", None)
        object.__setattr__(self, "epsilon", positive_number(self.epsilon, "the target epsilon"))
        object.__setattr__(self, "delta", check_delta(self.delta))
        if self.workload not in WORKLOADS:
            raise MfcliError(f"plan supports the Toeplitz workloads {', '.join(WORKLOADS)}, not {self.workload!r}")
        object.__setattr__(self, "beta", check_beta(self.beta))
        positive_int(self.params, "the number of parameters")
        batching = tuple(dict.fromkeys(self.batching))
        for name in batching:
            check_sampler(name)
        if not batching:
            raise MfcliError(f"allow at least one batch sampler: {', '.join(SAMPLERS)}")
        object.__setattr__(self, "batching", batching)
        if self.bands is not None:
            object.__setattr__(self, "bands", tuple(sorted({positive_int(k, "a band count") for k in self.bands})))
        object.__setattr__(self, "buffers", tuple(sorted({positive_int(k, "a buffer count") for k in self.buffers})))
        object.__setattr__(self, "curve", tuple(positive_number(e, "a plot epsilon") for e in self.curve))
        if self.max_stream_bytes is not None:
            object.__setattr__(self, "max_stream_bytes", positive_int(self.max_stream_bytes, "the stream memory budget"))
        if self.max_memory is not None:
            object.__setattr__(self, "max_memory", positive_int(self.max_memory, "the memory budget"))

    @property
    def steps_per_epoch(self) -> int:
        """s = ceil(examples / batch)."""
        return math.ceil(self.examples / self.batch)

    @property
    def n(self) -> int:
        """Total steps: epochs * steps per epoch."""
        assert self.epochs is not None
        return self.epochs * self.steps_per_epoch

    @property
    def sampling(self) -> float:
        """q = batch / examples (Poisson rate of DP-SGD)."""
        return self.batch / self.examples

    @property
    def max_groups(self) -> int:
        """The most groups cyclic Poisson can use: b q <= 1, b <= steps per epoch."""
        return min(self.examples // self.batch, self.steps_per_epoch)

    def band_counts(self) -> tuple[int, ...]:
        """The band counts tried: ``bands`` or the defaults, each at most n."""
        return tuple(k for k in (self.bands or DEFAULT_BANDS) if k <= self.n)

    def bands_over_n(self) -> tuple[int, ...]:
        """The band counts the trainer named (``bands``) that exceed n: listed as skipped with the
        reason, as a buffer count that does not fit is (the defaults above n are simply not tried)."""
        return tuple(k for k in (self.bands or ()) if k > self.n)

    def as_dict(self) -> dict[str, Any]:
        return {"examples": self.examples, "batch": self.batch, "epochs": self.epochs,
                "steps_per_epoch": self.steps_per_epoch, "n": self.n, "sampling_rate": self.sampling,
                "epsilon": self.epsilon, "delta": self.delta, "workload": self.workload,
                "beta": self.beta if self.workload == "momentum" else None, "params": self.params,
                "batching": list(self.batching), "max_stream_bytes": self.max_stream_bytes}


@dataclass(frozen=True)
class Candidate:
    """One mechanism to evaluate: ``kind`` (dp-sgd, bandmf, dense, banded, blt, tree, honaker),
    the batch sampler it is accounted under and its size parameter (bands, buffers)."""

    key: str
    kind: str
    sampler: str
    size: int | None = None


#: A candidate a family offers, with the reason it is skipped (None: it is evaluated).
Offer = tuple[Candidate, "str | None"]


@dataclass(frozen=True)
class Skipped:
    """A candidate that is not evaluated (or failed to calibrate), with the reason."""

    key: str
    sampler: str
    reason: str
    #: the calibration found the target met even at the smallest sigma searched
    met_without_noise: bool = False
    #: not calibrated: its accounting would need more memory than the budget (:func:`pld_memory_refusal`)
    over_memory: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.key, "batch_sampler": self.sampler, "reason": self.reason}


@dataclass(frozen=True)
class CandidateResult:
    """One calibrated candidate (units: module docstring)."""

    key: str
    kind: str
    size: int | None
    mechanism: str
    strategy: str
    participation: Participation
    sampler: str
    accounting: str
    sigma: float
    epsilon: float
    sensitivity: float
    sampling: float | None
    rmse_mean: float
    rmse_max: float
    memory_floats: int
    memory_bytes: int
    calibration: Calibration
    seconds: float
    adaptive: bool = True
    note: str = ""
    curve: tuple[tuple[float, float | None], ...] = ()
    noise_madds: float = 0.0
    #: every guarantee computed for this row at ``sigma``, (accounting, epsilon); ``accounting`` is the
    #: smallest (the balls-in-bins tree has two: its own bound and the DP-SGD reduction)
    guarantees: tuple[tuple[str, float], ...] = ()
    #: a certified upper bound on ||C||_2 of the C that runs (the DP-SGD reduction divides sigma by it)
    spectral_norm: float | None = None

    @property
    def noise_multiplier(self) -> float:
        """sigma / sensitivity: the noise multiplier as Opacus and jax_privacy use it (the noise std
        per unit of the C's sensitivity under the participation the row's accounting assumes)."""
        return self.sigma / self.sensitivity

    @property
    def reduction_row(self) -> bool:
        """A strategy other than DP-SGD and the tree accounted under balls-in-bins through the DP-SGD
        reduction only (hidden from the default table: it never beats DP-SGD's own balls-in-bins row
        at equal epsilon, docs/plan.md)."""
        return self.sampler == "balls-in-bins" and not family(self.kind).own_balls_in_bins

    def participation_text(self, n: int) -> str:
        """The participation the accounting assumes, in words."""
        return POISSON_PARTICIPATION["description"] if self.sampler == "poisson" else self.participation.describe(n)

    def neighbouring(self) -> str:
        """The neighbouring relation the row's epsilon holds for (add-remove, or zero-out /
        replace-one under the shuffle; :func:`mfcli.services.account.neighbouring_of`)."""
        from mfcli.services.account import neighbouring_of

        shuffled_dpsgd = (self.accounting, self.sampler) == ("dp-sgd", "shuffle")
        return neighbouring_of("shuffled-dp-sgd" if shuffled_dpsgd else self.accounting, self.sampler)

    def reduced_noise_multiplier(self) -> float | None:
        """sigma / ||C||_2 (certified upper bound): the noise multiplier of the DP-SGD the reduction
        accounts (None without a spectral bound)."""
        return None if self.spectral_norm is None else self.sigma / self.spectral_norm

    def numbers(self) -> tuple:
        """Everything but the wall time (what must agree between executors)."""
        d = dict(self.__dict__)
        d.pop("seconds")
        return tuple(sorted((k, repr(v)) for k, v in d.items()))

    def as_dict(self, n: int) -> dict[str, Any]:
        from mfcli.model.participation import schema_dict

        part = (POISSON_PARTICIPATION if self.sampler == "poisson" else schema_dict(self.participation, n))
        out: dict[str, Any] = {
            "candidate": self.key, "mechanism": self.mechanism, "strategy": self.strategy,
            "participation": part, "batch_sampler": self.sampler,
            "batch_sampler_text": SAMPLER_TEXT[self.sampler], "accounting": self.accounting,
            "neighbouring": self.neighbouring(),
            "noise_multiplier": self.noise_multiplier, "epsilon": self.epsilon, "noise_std": self.sigma,
            "sensitivity": self.sensitivity, "sampling": self.sampling,
            "guarantees": [{"accounting": a, "epsilon": e} for a, e in self.guarantees],
            "spectral_norm_upper": self.spectral_norm, "reduced_noise_multiplier": self.reduced_noise_multiplier(),
            "rmse_mean": self.rmse_mean, "rmse_max": self.rmse_max,
            "stream_floats_per_param": self.memory_floats, "stream_bytes": self.memory_bytes,
            "noise_madds_per_step": self.noise_madds,
            "seconds": self.seconds, "adaptive": self.adaptive,
            "calibration": self.calibration.as_dict(),
        }
        if self.note:
            out["note"] = self.note
        if self.curve:
            out["curve"] = [{"epsilon": e, "rmse_mean": r} for e, r in self.curve]
        return out


# ---------------------------------------------------------------------------------------------
# Candidates


def _pow2(k: int) -> bool:
    return k >= 2 and k & (k - 1) == 0


def _dpsgd_offers(setup: TrainingSetup, kind: str) -> list[Offer]:
    e = setup.epochs
    return [(Candidate("dp-sgd", kind, "poisson"), None),
            (Candidate("dp-sgd (balls-in-bins)", kind, "balls-in-bins"), None),
            (Candidate("dp-sgd (shuffle)", kind, "shuffle"),
             "the shuffled DP-SGD bound (Feldman-McMillan-Talwar) covers one epoch of batch size 1 with "
             f"replace-one neighbours; this setup has batch {setup.batch} and {e} epoch{'s' if e != 1 else ''}, and the "
             "other rows are add-or-remove, so no shuffle row is shown")]


def _bands_over_n(setup: TrainingSetup, k: int) -> str | None:
    """Why ``k`` bands are not tried (None: they are): a banded C of n steps has at most n bands."""
    return None if k <= setup.n else f"{k} bands exceed the n = {setup.n} steps of this setup; at most {setup.n} bands"


def _bandmf_offers(setup: TrainingSetup, kind: str) -> list[Offer]:
    out: list[Offer] = []
    for k in setup.band_counts():
        why = None
        if k > setup.max_groups:
            why = (f"{k} bands need {k} groups at rate {k} q = {k * setup.sampling:.3g} > 1 or more groups than the "
                   f"{setup.steps_per_epoch} steps per epoch; at most {setup.max_groups} bands")
        out.append((Candidate(f"{kind}-{k}", kind, "cyclic", k), why))
    out += [(Candidate(f"{kind}-{k}", kind, "cyclic", k), _bands_over_n(setup, k)) for k in setup.bands_over_n()]
    return out


def _dense_solve_refusal(setup: TrainingSetup) -> str | None:
    """Why the dense multi-epoch optimum is not solved for this setup (None: it is)."""
    n = setup.n
    return None if n <= PLAN_DENSE_SOLVE_MAX_N else f"n = {n} > {PLAN_DENSE_SOLVE_MAX_N}: the dense multi-epoch solve is too slow"


def _dense_offers(setup: TrainingSetup, kind: str) -> list[Offer]:
    why = _dense_solve_refusal(setup)
    return [(Candidate(kind, kind, "fixed-order"),
             None if why is None else why + " (n^3 per iteration); the banded Toeplitz and BLT rows stand in for it")]


def _banded_offers(setup: TrainingSetup, kind: str) -> list[Offer]:
    return [(Candidate(f"{kind}-{k}", kind, "fixed-order", k), _bands_over_n(setup, k))
            for k in setup.band_counts() + setup.bands_over_n()]


def _blt_offers(setup: TrainingSetup, kind: str) -> list[Offer]:
    return [(Candidate(f"{kind}-{k}", kind, "fixed-order", k), None if setup.n >= 2 else "a BLT needs n >= 2 steps")
            for k in setup.buffers]


def _tree_offers(setup: TrainingSetup, kind: str) -> list[Offer]:
    s = setup.steps_per_epoch
    if s < 2:
        return [(Candidate(kind, kind, smp), "a tree needs at least 2 steps per epoch")
                for smp in ("balls-in-bins", "fixed-order")]
    # the tree's own balls-in-bins bound is for 2^L leaves (DP-SGD's, and so the reduction rows', for any s)
    return [(Candidate(f"{kind} (balls-in-bins)", kind, "balls-in-bins"),
             None if _pow2(s) else f"the tree's balls-in-bins bound is for 2^L leaves; {s} steps per epoch "
                                   "is not a power of 2"),
            (Candidate(kind, kind, "fixed-order"), None)]


def enumerate_candidates(setup: TrainingSetup) -> tuple[list[Candidate], list[Skipped]]:
    """Every candidate whose accounting applies to an allowed sampler, and the skipped ones with
    the reason. A candidate is never listed under a sampler the trainer did not allow. Each family
    (:data:`FAMILIES`, in order) offers its own candidates; under balls-in-bins every family without
    a balls-in-bins bound of its own is offered again, accounted by the DP-SGD reduction."""
    allowed = set(setup.batching)
    out: list[Candidate] = []
    skip: list[Skipped] = []

    def offer(c: Candidate, why_not: str | None = None) -> None:
        if c.sampler not in allowed:
            return
        if why_not is None:
            out.append(c)
        else:
            skip.append(Skipped(c.key, c.sampler, why_not))

    for fam in FAMILIES.values():
        for c, why in fam.offers(setup, fam.kind):
            offer(c, why)
    if "balls-in-bins" in allowed:
        # every other strategy under balls-in-bins, by the DP-SGD reduction: its C as built for its own
        # sampler (BandMF for min-sep b, the others for the fixed-epoch schema)
        for fam in FAMILIES.values():
            if fam.own_balls_in_bins:
                continue
            for k in fam.sizes(setup) + (setup.bands_over_n() if fam.banded else ()):
                key = fam.kind if k is None else f"{fam.kind}-{k}"
                why = fam.solve_refusal(setup) or (_bands_over_n(setup, k) if fam.banded and k is not None else None)
                offer(Candidate(f"{key} (balls-in-bins)", fam.kind, "balls-in-bins", k), why)
    if not out:
        raise MfcliError(f"no candidate has a valid accounting under the allowed batch sampler(s) "
                         f"{', '.join(setup.batching)}: " + "; ".join(f"{x.key}: {x.reason}" for x in skip)
                         + "; allow poisson or fixed-order, whose accountings apply to every setup")
    return out, skip


# ---------------------------------------------------------------------------------------------
# Evaluation


def toeplitz_of(setup: TrainingSetup) -> Any:
    """The Toeplitz form of the setup's workload."""
    from mfcli.strategies.toeplitz import toeplitz_workload

    return toeplitz_workload(setup.workload, beta=setup.beta)


def dense_workload(setup: TrainingSetup) -> Any:
    """The dense workload (:mod:`mfcli.model.workloads`) of n steps."""
    from mfcli.model.workloads import build_workload

    return build_workload(setup.workload, setup.n, beta=setup.beta)


def fixed_schema(setup: TrainingSetup) -> Participation:
    """The deterministic schema of the fixed-order sampler: fixed-epoch (single participation for one epoch)."""
    return SingleParticipation() if setup.epochs == 1 else FixedEpoch(epochs=int(setup.epochs or 1))


def _gaussian_unit(setup: TrainingSetup, target: float) -> Calibration:
    """Calibration of the Gaussian at sensitivity 1 (scale sigma by the sensitivity)."""
    from mfcli.accounting.single_pass import gaussian_epsilon

    return calibrate_sigma(lambda s: gaussian_epsilon(setup.delta, 1.0 / s), target_epsilon=target, rel_tol=REL_TOL)


def _scaled(cal: Calibration, factor: float) -> Calibration:
    return replace(cal, sigma=cal.sigma * factor, sigma_lower=cal.sigma_lower * factor)


#: Samplers whose rows are accounted on a privacy loss distribution discretized at
#: :data:`PLD_DISCRETIZATION` (DP-SGD under Poisson, BandMF under cyclic Poisson), whose memory
#: grows with the epsilon it resolves (:func:`pld_memory_floor`).
PLD_SAMPLERS = ("poisson", "cyclic")


def pld_memory_floor(target: float) -> int:
    """Bytes that calibrating a privacy-loss-distribution accounting (:data:`PLD_SAMPLERS`) to the
    epsilon ``target`` needs at the least, before any run.

    Why: the calibration brackets the target, so it runs the accounting at a sigma whose epsilon
    exceeds ``target``; that epsilon is read off the composed PLD's grid of losses, which runs from
    below 0 (a PLD has losses <= 0) past it in steps of :data:`PLD_DISCRETIZATION`, so the FFT that
    composes it has more than target / discretization points, at the bytes per point that
    :func:`mfcli.accounting.pld_ops.self_compose` checks before it allocates. A lower bound: a run
    also holds the uncomposed PLDs and its tails (the measured peak is 1.3 to 2 times this at
    n = 20 to 100 steps). For a huge target (tiny sigma) it is what the walk down to that sigma
    would end in: minutes of runs, each 4 times the memory of the last, and then out of memory.

    >>> pld_memory_floor(2.0) / 2**20, pld_memory_floor(1e6) / 2**30
    (0.18310546875, 89.40696716308594)
    """
    from mfcli.accounting import pld_ops

    # pld_ops' own per-point figure of the composing FFT (measured there), so the two cannot drift
    return math.ceil(target / PLD_DISCRETIZATION) * int(pld_ops._FFT_BYTES_PER_POINT)


def memory_budget(setup: TrainingSetup) -> int | None:
    """Bytes one accounting run may use: ``setup.max_memory``, or what
    :func:`mfcli.util.memory.memory_left` allows this process (half of physical memory, or what
    ``ulimit -v`` leaves); None: no limit known."""
    from mfcli.util.memory import memory_left

    return setup.max_memory if setup.max_memory is not None else memory_left()


def pld_memory_refusal(setup: TrainingSetup, sampler: str, target: float) -> str | None:
    """Why a row under ``sampler`` is not calibrated to ``target``: its privacy-loss-distribution
    accounting needs more than :func:`memory_budget` at the least (:func:`pld_memory_floor`); None
    when it may run (or is not a PLD row)."""
    from mfcli.util.memory import format_size

    if sampler not in PLD_SAMPLERS:
        return None
    need, budget = pld_memory_floor(target), memory_budget(setup)
    if budget is None or need <= budget:
        return None
    return (f"calibrating its privacy loss distribution to epsilon {target:g} needs at least {format_size(need)} of "
            f"memory (a grid of losses past {target:g} in steps of {PLD_DISCRETIZATION:g}), over the memory budget "
            f"of {format_size(budget)}")


def _dpsgd_eps(setup: TrainingSetup, *, sampling: float, steps: int) -> Callable[[float], float]:
    from mfcli.accounting.single_pass import dpsgd

    return lambda s: dpsgd(sigma=s, sampling=sampling, steps=steps, delta=setup.delta,
                           value_discretization=PLD_DISCRETIZATION).epsilon


@dataclass
class _Built:
    """A candidate's operator: its per-step squared noise row norms ||B[t, :]||^2 and the function
    epsilon(sigma) of its accounting (``unit``: epsilon depends on sigma / sensitivity only)."""

    mechanism: str
    strategy: str
    participation: Participation
    accounting: str
    row_sq: np.ndarray
    memory_floats: int
    sensitivity: float
    sampling: float | None = None
    eps_of_sigma: Callable[[float], float] | None = None
    gaussian: bool = False
    adaptive: bool = True
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: set when DP-SGD under balls-in-bins at noise multiplier sigma / bib_norm is a guarantee of this
    #: row (1 for DP-SGD itself; the certified ||C||_2 for the DP-SGD reduction)
    bib_norm: float | None = None
    #: a certified upper bound on ||C||_2 (:func:`spectral_upper`)
    spectral: float | None = None
    #: the candidate's kind (set by :func:`_build_any`)
    kind: str = ""


def bib_accounting(kind: str) -> str:
    """The name of DP-SGD's balls-in-bins bound as a guarantee of a ``kind`` row: DP-SGD's own
    bound (``balls-in-bins-dp-sgd``) for DP-SGD, whose C is I; the DP-SGD reduction
    (``dp-sgd-reduction``, the same bound at sigma / ||C||_2) for every other C."""
    return "balls-in-bins-dp-sgd" if family(kind).identity else "dp-sgd-reduction"


def banded_coefs(setup: TrainingSetup, k: int, schema: Participation) -> np.ndarray:
    """Banded Toeplitz coefficients with k bands optimised for the workload under ``schema``
    (mean loss; :func:`mfcli.strategies.toeplitz.optimize_banded_toeplitz`)."""
    from mfcli.strategies.toeplitz import optimize_banded_toeplitz

    return np.asarray(optimize_banded_toeplitz(setup.n, k, workload=toeplitz_of(setup), schema=schema).strategy.coefs)


def blt_of(setup: TrainingSetup, k: int) -> Any:
    """The BLT with k buffers optimised for the workload under the fixed-order schema (mean loss)."""
    from mfcli.strategies.blt import optimize_blt

    beta = setup.beta if setup.workload == "momentum" else None
    return optimize_blt(n=setup.n, buffers=k, workload=setup.workload, beta=beta, error="mean",
                        schema=fixed_schema(setup)).blt


def _dpsgd_built(setup: TrainingSetup, cand: Candidate) -> _Built:
    n, e = setup.n, setup.epochs
    assert e is not None
    a = toeplitz_of(setup).coefs(n)
    if cand.sampler == "balls-in-bins":
        return _Built(family(cand.kind).mechanism, "identity (C = I)", SingleParticipation() if e == 1 else FixedEpoch(epochs=e),
                      "balls-in-bins-dp-sgd", np.cumsum(a * a), 0, 1.0, bib_norm=1.0, spectral=1.0,
                      adaptive=False,
                      note="the balls-in-bins DP-SGD bound assumes non-adaptive contributions (docs/accounting.md); "
                           "not recommended for training")
    return _Built(family(cand.kind).mechanism, "identity (C = I)", MinSeparation(separation=1), "dp-sgd",
                  np.cumsum(a * a), 0, 1.0, sampling=setup.sampling, spectral=1.0,
                  eps_of_sigma=_dpsgd_eps(setup, sampling=setup.sampling, steps=n))


def _bandmf_built(setup: TrainingSetup, cand: Candidate) -> _Built:
    from mfcli.accounting.multi import reduced_dpsgd
    from mfcli.strategies.structured import banded_numbers
    from mfcli.strategies.toeplitz import BandedToeplitz, decoder_coefs

    n = setup.n
    k = int(cand.size or 1)
    sep = MinSeparation(separation=k)
    coefs = banded_coefs(setup, k, sep)
    # the two numbers 2306.08153 Thm. 3 needs, counted as `mfcli account` counts them on the artifact
    bands, col = banded_numbers(BandedToeplitz(coefs), n)
    p = k * setup.sampling
    beta = decoder_coefs(coefs, toeplitz_of(setup), n)

    def cyclic_eps(sg: float) -> float:
        return reduced_dpsgd(bands=bands, column_norm=col, n=n, schema=sep, sigma=sg, sampling=p,
                             delta=setup.delta, value_discretization=PLD_DISCRETIZATION).epsilon

    return _Built(family(cand.kind).mechanism, f"banded Toeplitz, {k} bands (optimised for min-sep {k})", sep, "cyclic-poisson",
                  np.cumsum(beta * beta), k - 1, col, sampling=p, eps_of_sigma=cyclic_eps,
                  extra={"coefs": coefs})


def _fixed_order(setup: TrainingSetup) -> tuple[Participation, str]:
    """The fixed-order schema and the accounting of a Gaussian at its sensitivity."""
    schema = fixed_schema(setup)
    return schema, "single-pass" if isinstance(schema, SingleParticipation) else "deterministic"


def _banded_built(setup: TrainingSetup, cand: Candidate) -> _Built:
    from mfcli.strategies.toeplitz import decoder_coefs, toeplitz_sensitivity

    n = setup.n
    schema, acc = _fixed_order(setup)
    k = int(cand.size or 1)
    coefs = banded_coefs(setup, k, schema)
    sens = toeplitz_sensitivity(coefs, n, schema)
    beta = decoder_coefs(coefs, toeplitz_of(setup), n)
    return _Built(family(cand.kind).mechanism, f"banded Toeplitz, {k} bands (optimised for {schema.describe(n)})", schema,
                  acc, np.cumsum(beta * beta), k - 1, sens.value, gaussian=True,
                  note="" if sens.exact else "schema sensitivity is an upper bound", extra={"coefs": coefs})


def _blt_built(setup: TrainingSetup, cand: Candidate) -> _Built:
    n = setup.n
    schema, acc = _fixed_order(setup)
    k = int(cand.size or 1)
    blt = blt_of(setup, k)
    sens = blt.sensitivity(n, schema)
    beta = blt.decoder_coefs(n, setup.workload, beta=setup.beta if setup.workload == "momentum" else None)
    return _Built(family(cand.kind).mechanism, f"buffered linear Toeplitz, {k} buffers", schema, acc, np.cumsum(beta * beta), k,
                  sens.value, gaussian=True, note="" if sens.exact else "schema sensitivity is an upper bound",
                  extra={"blt": blt})


def _dense_built(setup: TrainingSetup, cand: Candidate) -> _Built:
    from mfcli.model.participation import sensitivity as schema_sensitivity
    from mfcli.optimize.multi_solver import multi_participation_factorization

    n, e = setup.n, int(setup.epochs or 1)
    schema, acc = _fixed_order(setup)
    w = dense_workload(setup)
    res = multi_participation_factorization(w.matrix, FixedEpoch(epochs=e), threads=1)
    f = res.factorization
    sens = schema_sensitivity(f.strategy, schema)
    return _Built(family(cand.kind).mechanism, f"dense optimum for {FixedEpoch(epochs=e).describe(n)}", schema, acc,
                  np.sum(np.asarray(f.decoder) ** 2, axis=1), n - 1, sens.value, gaussian=True,
                  extra={"factorization": f})


def _build(setup: TrainingSetup, cand: Candidate) -> _Built:
    """The candidate's operator as its family builds it (:data:`FAMILIES`)."""
    return family(cand.kind).build(setup, cand)


def evaluate(setup: TrainingSetup, cand: Candidate) -> CandidateResult | Skipped:
    """Build ``cand``'s operator, calibrate sigma under its accounting to the target, and measure
    the error of the released iterates (module docstring). A calibration that fails (no sigma up
    to 1e4) comes back as :class:`Skipped` with the reason."""
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    with threadpool_limits(1):
        try:
            b = _build_any(setup, cand)
            accounting, cal = _calibrate(setup, b, setup.epsilon)
            guarantees = [(accounting, cal.epsilon)]
            if b.bib_norm is not None and b.eps_of_sigma is not None:  # two guarantees: the other one at sigma
                bib = bib_accounting(b.kind)
                other = b.accounting if accounting == bib else bib
                guarantees.append((other, _guarantee_at(setup, b, other, cal.sigma)))
        except MfcliError as exc:
            return Skipped(cand.key, cand.sampler, str(exc), met_without_noise=isinstance(exc, TargetMetWithoutNoiseError))
        except MemoryError as exc:  # an allocation the accounting's own checks did not foresee
            return Skipped(cand.key, cand.sampler, f"ran out of memory while calibrating ({exc or 'MemoryError'})",
                           over_memory=True)
        curve: list[tuple[float, float | None]] = []
        for eps in setup.curve:
            if pld_memory_refusal(setup, cand.sampler, eps) is not None:
                curve.append((eps, None))
                continue
            try:
                # epsilon falls roughly as 1 / sigma: start the search near the answer
                c2 = cal if eps == setup.epsilon else _calibrate(setup, b, eps, start=cal.sigma * setup.epsilon / eps)[1]
                curve.append((eps, c2.sigma * math.sqrt(float(np.mean(b.row_sq)))))
            except (MfcliError, MemoryError):
                curve.append((eps, None))
    sigma = cal.sigma
    rows = np.sqrt(b.row_sq) * sigma
    floats, madds = stream_cost(cand.kind, b.memory_floats, setup.n)
    return CandidateResult(
        key=cand.key, kind=cand.kind, size=cand.size, mechanism=b.mechanism, strategy=b.strategy,
        participation=b.participation, sampler=cand.sampler, accounting=accounting, sigma=sigma, epsilon=cal.epsilon,
        sensitivity=b.sensitivity, sampling=b.sampling,
        rmse_mean=float(sigma * math.sqrt(float(np.mean(b.row_sq)))), rmse_max=float(np.max(rows)),
        memory_floats=floats, memory_bytes=4 * floats * setup.params, calibration=cal,
        seconds=time.perf_counter() - t0, adaptive=b.adaptive, note=b.note, curve=tuple(curve), noise_madds=madds,
        guarantees=tuple(guarantees), spectral_norm=b.spectral,
    )


def stream_cost(kind: str, kept_floats: int, n: int) -> tuple[int, float]:
    """(floats kept per parameter, multiply-adds of d floats per step averaged over n steps) of
    the noise stream that runs the candidate's artifact (module docstring, "Training cost").

    >>> stream_cost("blt", 4, 1000), stream_cost("bandmf", 31, 1000), stream_cost("dense", 999, 1000)
    ((4, 8.0), (31, 31.0), (1000, 499.5))
    """
    fam = family(kind)
    if fam.dense_stream:
        return n, (n - 1) / 2
    return kept_floats, fam.madds_per_float * kept_floats


def _calibrate(setup: TrainingSetup, b: _Built, target: float, start: float = 1.0) -> tuple[str, Calibration]:
    """(accounting, calibration): the smallest sigma at which one of the row's guarantees meets
    ``target``. With several guarantees (the balls-in-bins tree: its own bound and the DP-SGD
    reduction) each is calibrated on its own: each epsilon(sigma) is non-increasing, so the
    smallest sigma where their minimum meets the target is the smallest of their calibrated
    sigmas. Only guarantees (upper bounds) are calibrated on, never a bracket's lower end."""
    cals: list[tuple[str, Calibration]] = []
    errors: list[MfcliError] = []
    if b.gaussian:
        cals.append((b.accounting, _scaled(_gaussian_unit(setup, target), b.sensitivity)))
    elif b.eps_of_sigma is not None:
        try:
            cals.append((b.accounting, calibrate_sigma(b.eps_of_sigma, target_epsilon=target, rel_tol=REL_TOL,
                                                       sigma_start=start)))
        except MfcliError as exc:
            errors.append(exc)
    if b.bib_norm is not None:
        try:
            cals.append((bib_accounting(b.kind), _scaled(bib_dpsgd_calibration(setup.steps_per_epoch,
                                                                               int(setup.epochs or 1), setup.delta,
                                                                               target), b.bib_norm)))
        except MfcliError as exc:
            errors.append(exc)
    if not cals:
        raise errors[0]
    return min(cals, key=lambda x: x[1].sigma)


@functools.lru_cache(maxsize=32)
def bib_dpsgd_calibration(steps: int, epochs: int, delta: float, target: float) -> Calibration:
    """The noise multiplier of DP-SGD under balls-in-bins (``steps`` per epoch, any number,
    ``epochs`` composed) that meets ``target``, calibrated on the guarantee of
    :func:`mfcli.accounting.reduction.reduced_epsilon` (the upper end of DP-SGD's balls-in-bins
    bracket). The DP-SGD reduction's epsilon depends on sigma / ||C||_2 only, so every strategy's
    balls-in-bins row is this calibration scaled by its ||C||_2 bound: cached per process, so a
    worker calibrates it once per target."""
    return calibrate_sigma(lambda nm: bib_dpsgd_epsilon(steps, epochs, delta, nm), target_epsilon=target,
                           rel_tol=REL_TOL)


def bib_dpsgd_epsilon(steps: int, epochs: int, delta: float, noise_multiplier: float) -> float:
    """DP-SGD's balls-in-bins guarantee at ``noise_multiplier`` (``steps`` per epoch, ``epochs``
    epochs): the DP-SGD reduction's epsilon of every C with sigma / ||C||_2 at least that
    (:func:`mfcli.accounting.reduction.reduced_epsilon`)."""
    from mfcli.accounting.reduction import reduced_epsilon

    return float(reduced_epsilon(sampler="balls-in-bins", noise_multiplier=noise_multiplier, n=steps * epochs,
                                 sampling=None, delta=delta, epochs=epochs).epsilon)


def _guarantee_at(setup: TrainingSetup, b: _Built, name: str, sigma: float) -> float:
    """The epsilon of the row's guarantee ``name`` at ``sigma`` (for the JSON's ``guarantees``)."""
    if name == bib_accounting(b.kind):
        assert b.bib_norm is not None
        return bib_dpsgd_epsilon(setup.steps_per_epoch, int(setup.epochs or 1), setup.delta, sigma / b.bib_norm)
    assert b.eps_of_sigma is not None
    return float(b.eps_of_sigma(sigma))


def tree_mechanism(setup: TrainingSetup, kind: str) -> Any:
    """The tree or Honaker (online) candidate as the mechanism of any n that ``compare`` and
    ``account`` use: one tree on s leaves per epoch (``epochs`` trees, restarted every epoch;
    :class:`mfcli.strategies.baseline_mechanisms.TreeMechanism`)."""
    from mfcli.strategies.baseline_mechanisms import baseline_mechanism

    return baseline_mechanism(str(family(kind).baseline), toeplitz_of(setup), setup.n,
                              epochs=int(setup.epochs or 1))


def tree_spectral_upper(mech: Any) -> float:
    """A certified upper bound on ||C||_2 of a tree restarted every epoch (C = blockdiag of one
    tree's encoder C_e, the same norm): :func:`mfcli.accounting.reduction.spectral_norm_bound` of
    the dense C_e for s <= the dense limit; above it, without the matrix, sqrt of the largest row
    sum of C_e^T C_e (:func:`mfcli.strategies.tree_error.tree_gram_row_sum`), rounded up."""
    from mfcli.accounting.reduction import spectral_norm_bound
    from mfcli.strategies.baselines import tree_strategy_matrix
    from mfcli.strategies.tree_error import tree_gram_row_sum
    from mfcli.util.directed import sqrt_up
    from mfcli.util.limits import STRUCTURED_DENSE_MAX_N

    s = int(mech.leaves)
    if s <= STRUCTURED_DENSE_MAX_N:
        return float(spectral_norm_bound(tree_strategy_matrix(s)).upper)
    return sqrt_up(float(tree_gram_row_sum(s)))


def _tree_built(setup: TrainingSetup, cand: Candidate) -> _Built:
    """The tree or Honaker (online decoder) on s leaves, restarted every epoch, from its mechanism
    of any n (:func:`tree_mechanism`: errors from its ``loss``, sensitivities from it). Honaker
    post-processes the same noisy nodes, so its privacy is the tree's; only the error differs."""
    from mfcli.accounting.balls_in_bins import tree_balls_in_bins
    from mfcli.strategies.tree_error import tree_height

    e, s = setup.epochs, setup.steps_per_epoch
    assert e is not None
    mech = tree_mechanism(setup, cand.kind)
    levels = tree_height(s) + 1  # nodes per leaf: the squared column norm of the 0/1 encoder
    fam = family(cand.kind)
    name = fam.mechanism
    what = f"binary tree on {s} leaves, restarted every epoch{fam.decoder_words}"
    if cand.sampler == "balls-in-bins":
        loss = mech.loss(schema=SingleParticipation())  # one participation per epoch: the column norm
        return _Built(name, what, SingleParticipation() if e == 1 else FixedEpoch(epochs=e), "balls-in-bins-tree",
                      loss.unit, levels, loss.sensitivity.value,
                      eps_of_sigma=lambda sg: tree_balls_in_bins(n=s, sigma=sg, delta=setup.delta, epochs=e).epsilon,
                      adaptive=False, bib_norm=tree_spectral_upper(mech), extra={"mechanism": mech},
                      note="the balls-in-bins bound assumes non-adaptive contributions (docs/accounting.md); not "
                           "recommended for training")
    # fixed order: the schema sensitivity of the restarted tree (epoch blocks have disjoint rows:
    # sqrt(e (K + 1)), exact, from the mechanism)
    schema = fixed_schema(setup)
    loss = mech.loss(schema=schema)
    return _Built(name, what, schema, "single-pass" if e == 1 else "deterministic", loss.unit, levels,
                  loss.sensitivity.value, gaussian=True, extra={"mechanism": mech})


def _build_any(setup: TrainingSetup, cand: Candidate) -> _Built:
    if cand.sampler == "balls-in-bins" and not family(cand.kind).own_balls_in_bins:
        b = _reduction_built(setup, cand)
    else:
        b = _build(setup, cand)
    if b.spectral is None:
        b.spectral = spectral_upper(setup, b)
    b.kind = cand.kind
    return b


def _toeplitz_coefs(setup: TrainingSetup, b: _Built) -> np.ndarray | None:
    """The first n coefficients of a Toeplitz candidate's C (banded or BLT); None for the others."""
    if "coefs" in b.extra:
        return np.asarray(b.extra["coefs"])[:setup.n]
    if "blt" in b.extra:
        return np.asarray(b.extra["blt"].strategy_coefs(setup.n))[:setup.n]
    return None


def spectral_upper(setup: TrainingSetup, b: _Built) -> float:
    """A certified upper bound on ||C||_2 of the candidate's C (:mod:`mfcli.accounting.reduction`):
    a Toeplitz C (banded, BLT) by its symbol, or at n <= TOEPLITZ_CERTIFY_N the smallest of the
    symbol and the eigenvalue certificate on the materialised C; the dense optimum and the tree's
    per-epoch encoder (C = blockdiag of it, same norm) by ``spectral_norm_bound``."""
    from mfcli.accounting.reduction import TOEPLITZ_CERTIFY_N, spectral_norm_bound, toeplitz_symbol_bound
    from mfcli.strategies.toeplitz import materialize

    n = setup.n
    coefs = _toeplitz_coefs(setup, b)
    if coefs is not None:
        if n <= TOEPLITZ_CERTIFY_N:
            return float(spectral_norm_bound(materialize(coefs, n)).upper)
        return float(toeplitz_symbol_bound(coefs))
    if "factorization" in b.extra:
        return float(spectral_norm_bound(np.asarray(b.extra["factorization"].strategy)).upper)
    if "mechanism" in b.extra:
        return tree_spectral_upper(b.extra["mechanism"])
    raise MfcliError("no spectral bound for this candidate")  # pragma: no cover


def column_norm(setup: TrainingSetup, b: _Built) -> float:
    """The largest column norm of the candidate's C: its sensitivity for one participation."""
    coefs = _toeplitz_coefs(setup, b)
    if coefs is not None:
        return float(np.linalg.norm(coefs))  # column j holds coefs[:n - j]: the first is the largest
    c = np.asarray(b.extra["factorization"].strategy)
    return float(np.linalg.norm(c, axis=0).max())


def _reduction_built(setup: TrainingSetup, cand: Candidate) -> _Built:
    """A strategy under balls-in-bins, by the DP-SGD reduction: its C built as for its own sampler
    (BandMF under cyclic Poisson, the others under a fixed order), accounted as DP-SGD under
    balls-in-bins at noise multiplier sigma / ||C||_2 (:mod:`mfcli.accounting.reduction`)."""
    e = int(setup.epochs or 1)
    home = _build(setup, replace(cand, sampler=family(cand.kind).home_sampler))
    norm = spectral_upper(setup, home)
    return _Built(home.mechanism, home.strategy, SingleParticipation() if e == 1 else FixedEpoch(epochs=e),
                  "dp-sgd-reduction", home.row_sq, home.memory_floats, column_norm(setup, home), bib_norm=norm,
                  spectral=norm, adaptive=False, extra=home.extra,
                  note="the DP-SGD reduction under balls-in-bins: DP-SGD's balls-in-bins bound at sigma / ||C||_2, "
                       "which assumes non-adaptive contributions; never more accurate than DP-SGD at equal epsilon "
                       "(docs/plan.md); not recommended for training")


# ---------------------------------------------------------------------------------------------
# Executors and ranking


def _evaluate_star(args: tuple[TrainingSetup, Candidate]) -> CandidateResult | Skipped:
    return evaluate(*args)


def run_plan(
    setup: TrainingSetup,
    candidates: Sequence[Candidate],
    *,
    scheduler: str | Any | None = None,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[CandidateResult | Skipped]:
    """Evaluate every candidate, in the order given, on a process pool over the local cores
    (``workers`` processes, default all cores; 0 runs them in this process) or, with
    ``scheduler`` (an address or a ``distributed.Client``), on a Dask cluster.

    Raises:
        MfcliError: Dask is not installed, or the scheduler cannot be reached.
    """
    import os

    say = progress or (lambda m: None)
    total = len(candidates)
    results: list[CandidateResult | Skipped | None] = [None] * total
    t0 = time.perf_counter()

    def done(i: int, r: CandidateResult | Skipped) -> None:
        results[i] = r
        finished = sum(x is not None for x in results)
        what = f"sigma {r.sigma:.4g}" if isinstance(r, CandidateResult) else "skipped"
        say(f"[{finished}/{total}] {r.key}: {what} ({time.perf_counter() - t0:.0f} s elapsed)")

    if scheduler is not None:
        try:
            from distributed import Client, as_completed
        except ImportError:
            raise MfcliError("a Dask scheduler needs the dask extra: pip install 'mfcli[dask]'") from None
        own = not isinstance(scheduler, Client)
        left = SCHEDULER_TIMEOUT_S
        if own:
            t_connect = time.monotonic()
            probe_scheduler(str(scheduler))
            left = max(1.0, SCHEDULER_TIMEOUT_S - (time.monotonic() - t_connect))
        try:
            client: Any = Client(scheduler, timeout=f"{left:.1f}s") if own else scheduler
        except (OSError, TimeoutError, ValueError) as exc:  # ValueError: a malformed address
            raise MfcliError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        except MemoryError:  # a peer that passed the probe and then declared an absurd message size
            raise MfcliError(f"the peer at {scheduler} is not a Dask scheduler (it sent a message Dask "
                             "could not hold in memory)") from None
        try:
            futures = client.map(evaluate, [setup] * total, list(candidates), pure=False)
            index = {f.key: i for i, f in enumerate(futures)}
            for fut in as_completed(futures):
                done(index[fut.key], fut.result())
        finally:
            if own:
                client.close()
        return [r for r in results if r is not None]
    n_workers = (os.cpu_count() or 1) if workers is None else workers
    if n_workers == 0 or total <= 1:
        for i, c in enumerate(candidates):
            done(i, evaluate(setup, c))
        return [r for r in results if r is not None]
    import concurrent.futures as cf
    import multiprocessing
    from concurrent.futures.process import BrokenProcessPool

    pool = cf.ProcessPoolExecutor(max_workers=min(n_workers, total), mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_worker_init, initargs=(os.getpid(),))
    try:
        futs = {pool.submit(evaluate, setup, c): i for i, c in enumerate(candidates)}
        for fut in cf.as_completed(futs):
            done(futs[fut], fut.result())
    except BrokenProcessPool:
        # A worker ended without returning (the kernel's out-of-memory killer, a signal): every
        # evaluation not finished is lost. One error, naming them, not the pool's traceback.
        _stop_pool(pool)
        raise MfcliError(worker_died_message(setup, [c.key for c, r in zip(candidates, results, strict=True)
                                                     if r is None])) from None
    except BaseException:
        # A signal (KeyboardInterrupt, the CLI's Terminated), an error or a broken pool: the
        # running evaluations are not waited for (one can take many minutes); the workers are
        # stopped and reaped before the exception goes on.
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    return [r for r in results if r is not None]


def worker_died_message(setup: TrainingSetup, unfinished: Sequence[str]) -> str:
    """The error for a pool worker that died (:class:`concurrent.futures.process.BrokenProcessPool`):
    which evaluations were lost, the likely cause (the system's out-of-memory killer) and the
    memory budget a run was held to."""
    from mfcli.util.memory import format_size

    budget = memory_budget(setup)
    held = "no memory budget known" if budget is None else f"a run's memory budget was {format_size(budget)}"
    names = ", ".join(unfinished) if len(unfinished) <= 4 else ", ".join(unfinished[:4]) + f" and {len(unfinished) - 4} more"
    return (f"a worker process died while candidates were being evaluated (unfinished: {names or 'none'}): it was "
            f"killed by the system, most likely for lack of memory ({held}, per worker, with several workers at "
            "once); evaluate fewer candidates at once (fewer workers), lower the memory budget, or give a smaller "
            "target epsilon")


#: Seconds between a pool worker's checks that the process that started it is still alive.
WATCHDOG_S = 1.0


def _worker_init(parent: int) -> None:
    """Initializer of every pool worker: it must never outlive the plan that started it.

    * SIGINT is ignored: a Ctrl-C at the terminal reaches the whole process group, and the parent
      alone answers it (it stops the workers and prints the one error line);
    * on Linux the kernel kills the worker when its parent dies (``PR_SET_PDEATHSIG``), even when
      the parent is killed with SIGKILL and runs no cleanup;
    * everywhere, a daemon thread checks every :data:`WATCHDOG_S` seconds that the parent is still
      its parent and ends the worker at once when it is not (an orphan is re-parented)."""
    import os
    import signal
    import sys
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc symbol: the watchdog below still applies
            pass
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)

    def watchdog() -> None:
        while True:
            time.sleep(WATCHDOG_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watchdog, name="mfcli-plan-watchdog", daemon=True).start()


def _stop_pool(pool: Any) -> None:
    """Stop a process pool now: cancel what has not started, terminate the running workers
    (SIGTERM, then SIGKILL for one still alive after 2 s) and reap them."""
    # ProcessPoolExecutor has no public way to stop running tasks before Python 3.14
    # (terminate_workers); its worker table is _processes, read before shutdown() clears it.
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + 2.0
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
    # The pool's manager thread, seeing its workers gone, closes the pool's queues; once it has
    # ended they are garbage, and collecting them releases their named semaphores now (the CLI
    # ends with os._exit, after which the resource tracker would warn of "leaked" semaphores).
    if manager is not None:
        manager.join(2.0)
    del manager, procs
    import gc

    gc.collect()


#: Seconds that connecting to a Dask scheduler may take in all: the TCP connection, the scheduler's
#: handshake (:func:`probe_scheduler`) and the client's own connection.
SCHEDULER_TIMEOUT_S = 10.0
#: Largest handshake a Dask scheduler sends (distributed 2026.8 sends 58 bytes).
HANDSHAKE_MAX_BYTES = 1 << 16


def probe_scheduler(address: str, timeout: float | None = None) -> None:
    """Check, within ``timeout`` seconds in all (default :data:`SCHEDULER_TIMEOUT_S`), that a Dask
    scheduler answers at ``address``, before a ``distributed.Client`` is pointed at it.

    Why: Dask's client waits for the peer's handshake without a bound, and sizes its read buffer
    from the peer's first 8 bytes; an HTTP server kept ``plan`` waiting for minutes, and another
    peer's first bytes made Dask allocate exabytes. A Dask scheduler sends its handshake as soon as
    a connection is accepted: an 8-byte little-endian length, a frame prelude (frame count, frame
    sizes) and a msgpack map naming ``python`` and ``pickle-protocol``. The probe reads at most
    :data:`HANDSHAKE_MAX_BYTES` of it over a plain socket with a deadline. For ``tls://`` only the
    TCP connection is checked (the handshake is encrypted); other schemes are left to Dask.

    Raises:
        MfcliError: nothing accepts the connection in time, or the peer is not a Dask scheduler.
    """
    import socket
    import struct

    from distributed.comm.addressing import parse_address, parse_host_port

    budget = SCHEDULER_TIMEOUT_S if timeout is None else timeout
    deadline = time.monotonic() + budget
    try:
        scheme, loc = parse_address(address)
        host, port = parse_host_port(loc)
    except (ValueError, TypeError) as exc:
        if "://" in address and not address.startswith(("tcp://", "tls://")):
            return  # inproc://, ucx://: no TCP socket to probe
        raise MfcliError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    if scheme not in ("tcp", "tls"):
        return

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise TimeoutError
        return rest

    def not_dask(why: str) -> MfcliError:
        return MfcliError(f"the peer at {address} is not a Dask scheduler ({why}); give the address of a Dask "
                          "scheduler (tcp://HOST:8786)")

    try:
        sock = socket.create_connection((host, port), timeout=left())
    except TimeoutError:
        raise MfcliError(f"cannot reach the Dask scheduler at {address}: no connection within {budget:g} s") from None
    except OSError as exc:
        raise MfcliError(f"cannot reach the Dask scheduler at {address}: {exc.strerror or exc}") from None
    if scheme == "tls":
        sock.close()
        return

    def read(count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            sock.settimeout(left())
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    try:
        with sock:
            (total,) = struct.unpack("<Q", read(8))
            if not 16 <= total <= HANDSHAKE_MAX_BYTES:
                raise not_dask(f"its first message declares {total} bytes; a Dask handshake is a short message")
            body = read(total)
    except TimeoutError:
        raise not_dask(f"it sent no Dask handshake within {budget:g} s of the connection") from None
    except EOFError:
        raise not_dask("it closed the connection without a Dask handshake") from None
    except OSError as exc:
        raise not_dask(f"the connection failed while reading its handshake: {exc.strerror or exc}") from None
    if not _is_dask_handshake(body):
        raise not_dask("its first message is not a Dask handshake")


def _is_dask_handshake(body: bytes) -> bool:
    """Whether ``body`` is Dask's handshake: a frame prelude whose sizes add up, then a msgpack
    map with the keys ``python`` and ``pickle-protocol``."""
    import struct

    (frames,) = struct.unpack_from("<Q", body)
    if not 1 <= frames <= 16 or len(body) < 8 * (1 + frames):
        return False
    sizes = struct.unpack_from(f"<{frames}Q", body, 8)
    start = 8 * (1 + frames)
    if start + sum(sizes) != len(body):
        return False
    try:
        import msgpack

        info = msgpack.unpackb(body[start:start + sizes[0]], raw=False)
    except Exception:  # any decoding failure means "not a handshake"
        return False
    return isinstance(info, dict) and "python" in info and "pickle-protocol" in info


def _cost_key(r: CandidateResult) -> tuple[float, int, str]:
    return (r.noise_madds, r.memory_floats, r.key)


def rank(results: Sequence[CandidateResult]) -> list[CandidateResult]:
    """Lowest mean RMSE first; errors within a relative :data:`TIE_RTOL` (0.5 %) of a group's
    best are a near-tie, in which the cheaper noise stream (fewer multiply-adds per step, then
    fewer floats kept) ranks first; then the name."""
    ordered = sorted(results, key=lambda r: (r.rmse_mean, r.noise_madds, r.memory_floats, r.key))
    groups: list[list[CandidateResult]] = []
    for r in ordered:
        if groups and abs(r.rmse_mean - groups[-1][0].rmse_mean) <= TIE_RTOL * groups[-1][0].rmse_mean:
            groups[-1].append(r)
        else:
            groups.append([r])
    return [r for g in groups for r in sorted(g, key=_cost_key)]


def recommend(ranked: Sequence[CandidateResult], n: int | None = None, *,
              max_stream_bytes: int | None = None) -> CandidateResult | None:
    """The first ranked candidate whose guarantee holds for adaptive training (the balls-in-bins
    tree's bound assumes non-adaptive contributions) and that has an artifact form at ``n``
    steps (:func:`writable`)."""
    for r in ranked:
        if not not_recommended(r, n, max_stream_bytes=max_stream_bytes):
            return r
    return None


def not_recommended(r: CandidateResult, n: int | None = None, *, max_stream_bytes: int | None = None) -> str:
    """Why :func:`recommend` passes over ``r`` (empty when it does not): its guarantee assumes
    non-adaptive contributions, or it has no artifact form at ``n`` steps (:func:`writable`)."""
    if not r.adaptive:
        return "its bound assumes non-adaptive contributions"
    if max_stream_bytes is not None and r.memory_bytes > max_stream_bytes:
        return f"its noise stream keeps {r.memory_bytes} bytes, over the stream memory budget of {max_stream_bytes}"
    return writable(r, n)[1]


def writable(r: CandidateResult, n: int | None = None) -> tuple[bool, str]:
    """Whether the candidate can be written as one artifact that ``mfcli account`` re-accounts
    at ``n`` steps (None: whatever n): structured (BandMF, banded Toeplitz, BLT) at every n, which
    the accounting session accounts from its parameters; the dense optimum, the tree and Honaker
    dense at n <= PLAN_DENSE_ARTIFACT_MAX_N (DP-SGD's Poisson accounting needs no C, so C = I is
    written and re-accounted at any n)."""
    why = family(r.kind).write_refusal(r, n)
    return not why, why


def _identity_write_refusal(r: CandidateResult, n: int | None) -> str:
    return "the balls-in-bins DP-SGD bound assumes non-adaptive contributions" if r.sampler == "balls-in-bins" else ""


def _reduction_write_refusal(r: CandidateResult, n: int | None) -> str:
    if r.sampler == "balls-in-bins":
        return "its balls-in-bins guarantee (the DP-SGD reduction) assumes non-adaptive contributions"
    return ""


def _tree_write_refusal(r: CandidateResult, n: int | None) -> str:
    if not isinstance(r.participation, SingleParticipation):
        return "a tree restarted every epoch has no single-artifact form (one tree per epoch)"
    if r.sampler != "fixed-order":
        return "the balls-in-bins tree's bound assumes non-adaptive contributions"
    if n is not None and n > PLAN_DENSE_ARTIFACT_MAX_N:
        return (f"a tree has no structured form; it is written as a dense artifact for n <= "
                f"{PLAN_DENSE_ARTIFACT_MAX_N} only (n = {n})")
    return ""


# ---------------------------------------------------------------------------------------------
# The artifact of a candidate, with its accounting record


def _dense_strategy(setup: TrainingSetup, r: CandidateResult) -> Any:
    """The candidate as a dense :class:`mfcli.strategies.baselines.Strategy` (n <= PLAN_DENSE_ARTIFACT_MAX_N);
    the dense optimum as (factorization, ``"optimal"``)."""
    return family(r.kind).dense_strategy(setup, r)


def _baseline_dense(setup: TrainingSetup, r: CandidateResult) -> Any:
    """DP-SGD (the identity) and the tree kinds: the built-in baseline of their name."""
    from mfcli.strategies.baselines import build_strategy

    return build_strategy(str(family(r.kind).baseline), dense_workload(setup))


def _optimum_dense(setup: TrainingSetup, r: CandidateResult) -> Any:
    return _build(setup, Candidate(r.key, r.kind, r.sampler, r.size)).extra["factorization"], "optimal"


def _toeplitz_dense(setup: TrainingSetup, r: CandidateResult) -> Any:
    """A Toeplitz candidate (BandMF, banded, BLT) materialised: C from its first column, B = A C^-1."""
    import scipy.linalg

    from mfcli.model.factorization import Factorization
    from mfcli.strategies.baselines import Strategy
    from mfcli.strategies.toeplitz import materialize

    w = dense_workload(setup)
    b = _build(setup, Candidate(r.key, r.kind, r.sampler, r.size))
    coefs = b.extra["coefs"] if "coefs" in b.extra else b.extra["blt"].strategy_coefs(setup.n)
    c = materialize(coefs, setup.n)
    a = np.asarray(w.matrix)
    dec = scipy.linalg.solve_triangular(c.T, a.T, lower=False).T  # B = A C^-1
    f = Factorization(workload=a, strategy=c, decoder=dec, causal=True)
    return Strategy(family(r.kind).artifact_kind, f, True, r.strategy)


def _structured_strategy(setup: TrainingSetup, r: CandidateResult) -> Any:
    make = family(r.kind).structured_strategy
    if make is None:
        raise MfcliError(f"the {r.mechanism} candidate has no structured form at n = {setup.n}; "
                         f"it is written for n <= {PLAN_DENSE_ARTIFACT_MAX_N}")
    return make(setup, r)


def _identity_structured(setup: TrainingSetup, r: CandidateResult) -> Any:
    from mfcli.strategies.toeplitz import BandedToeplitz

    return BandedToeplitz(np.ones(1))


def _banded_structured(setup: TrainingSetup, r: CandidateResult) -> Any:
    from mfcli.strategies.toeplitz import BandedToeplitz

    return BandedToeplitz(_build(setup, Candidate(r.key, r.kind, r.sampler, r.size)).extra["coefs"])


def _blt_structured(setup: TrainingSetup, r: CandidateResult) -> Any:
    return _build(setup, Candidate(r.key, r.kind, r.sampler, r.size)).extra["blt"]


# ---------------------------------------------------------------------------------------------
# The candidate families: what differs between them, in one table


def _identity_fixed_sensitivity(setup: TrainingSetup, operator: Callable[[], _Built]) -> float:
    return math.sqrt(int(setup.epochs or 1))  # C = I: one unit column per epoch, orthogonal


def _banded_fixed_sensitivity(setup: TrainingSetup, operator: Callable[[], _Built]) -> float:
    from mfcli.strategies.toeplitz import toeplitz_sensitivity

    return float(toeplitz_sensitivity(operator().extra["coefs"], setup.n, fixed_schema(setup)).value)


def _no_refusal(setup: TrainingSetup) -> str | None:
    return None


def _no_sizes(setup: TrainingSetup) -> tuple[int | None, ...]:
    return (None,)


@dataclass(frozen=True)
class PlanFamily:
    """One family of plan candidates (a ``Candidate.kind``) and everything plan does differently
    for it, so that the plan code asks its family instead of testing the kind's name.

    Attributes:
        kind: the candidates' ``kind`` (and key prefix).
        mechanism: its name in the table (the tree kinds; the others' builders name theirs).
        offers: its own candidates for a setup, each with the reason it is skipped (or None).
        build: its operator (:class:`_Built`) for a candidate, at its own sampler.
        home_sampler: the sampler its C is built for; its balls-in-bins row (the DP-SGD
            reduction) reuses that C.
        own_balls_in_bins: it has a balls-in-bins bound of its own (DP-SGD, the tree), so no
            reduction row is offered and its balls-in-bins row is built by ``build``.
        sizes: its size parameters (band or buffer counts; (None,) without one), for the
            reduction rows.
        solve_refusal: why its C is not built for a setup (None: it is), for the reduction rows.
        identity: C = I (DP-SGD): accounted without a schema, DP-SGD's own balls-in-bins bound.
        baseline: the built-in baseline it is (``build_strategy``'s name), or None.
        is_tree: a binary tree restarted every epoch (the baseline's
            :class:`~mfcli.strategies.baseline_mechanisms.TreeMechanism`), with the tree's own
            balls-in-bins bound for 2^L leaves.
        decoder_words: the decoder, in words, after the tree's description.
        dense_stream: its artifact streams the dense history (all n noise rows).
        madds_per_float: multiply-adds per kept float and step of its noise stream otherwise.
        dense_artifact_max_n: the largest n at which --out writes it as a dense artifact (above
            it: its structured form).
        artifact_kind: the structured kind of its artifact (``structured_strategy``'s class).
        dense_strategy: it as a dense ``Strategy`` (n <= PLAN_DENSE_ARTIFACT_MAX_N).
        structured_strategy: its structured strategy (None: it has no structured form).
        write_refusal: why its row cannot be written as an artifact at n steps ("" when it can).
        fixed_order_sensitivity: its C's sensitivity under the fixed order, for the guarantee of
            that sampler beside its own (None: its own sampler is the fixed order).
        cyclic_reaccount: a banded C built for the fixed order, also accounted under cyclic Poisson.
        banded: its size is a band count (at most n; a named count above n is skipped with the reason).
    """

    kind: str
    offers: Callable[[TrainingSetup, str], list[Offer]]
    build: Callable[[TrainingSetup, Candidate], _Built]
    dense_strategy: Callable[[TrainingSetup, CandidateResult], Any]
    write_refusal: Callable[[CandidateResult, int | None], str]
    mechanism: str = ""
    home_sampler: str = "fixed-order"
    own_balls_in_bins: bool = False
    sizes: Callable[[TrainingSetup], tuple[int | None, ...]] = _no_sizes
    solve_refusal: Callable[[TrainingSetup], str | None] = _no_refusal
    identity: bool = False
    baseline: str | None = None
    is_tree: bool = False
    decoder_words: str = ""
    dense_stream: bool = False
    madds_per_float: float = 1.0
    dense_artifact_max_n: int = 0
    artifact_kind: str = "banded-toeplitz"
    structured_strategy: Callable[[TrainingSetup, CandidateResult], Any] | None = None
    fixed_order_sensitivity: Callable[[TrainingSetup, Callable[[], _Built]], float] | None = None
    cyclic_reaccount: bool = False
    banded: bool = False


def _tree_family(kind: str, baseline: str, mechanism: str, decoder_words: str) -> PlanFamily:
    # no structured form: written dense (writable refuses n > PLAN_DENSE_ARTIFACT_MAX_N)
    return PlanFamily(kind, _tree_offers, _tree_built, _baseline_dense, _tree_write_refusal, mechanism=mechanism,
                      own_balls_in_bins=True, baseline=baseline, is_tree=True, decoder_words=decoder_words,
                      dense_stream=True, dense_artifact_max_n=PLAN_MAX_N)


#: Every family of candidates, in the order plan offers (and lists) them.
FAMILIES: dict[str, PlanFamily] = {f.kind: f for f in (
    PlanFamily("dp-sgd", _dpsgd_offers, _dpsgd_built, _baseline_dense, _identity_write_refusal, mechanism="DP-SGD",
               home_sampler="poisson", own_balls_in_bins=True, identity=True, baseline="identity",
               dense_artifact_max_n=PLAN_DENSE_ARTIFACT_MAX_N, structured_strategy=_identity_structured,
               fixed_order_sensitivity=_identity_fixed_sensitivity),
    PlanFamily("bandmf", _bandmf_offers, _bandmf_built, _toeplitz_dense, _reduction_write_refusal, mechanism="BandMF",
               home_sampler="cyclic", sizes=lambda setup: setup.band_counts(), structured_strategy=_banded_structured,
               fixed_order_sensitivity=_banded_fixed_sensitivity, banded=True),
    PlanFamily("dense", _dense_offers, _dense_built, _optimum_dense, _reduction_write_refusal,
               mechanism="multi-epoch optimal", solve_refusal=_dense_solve_refusal, dense_stream=True,
               dense_artifact_max_n=PLAN_MAX_N),
    PlanFamily("banded", _banded_offers, _banded_built, _toeplitz_dense, _reduction_write_refusal,
               mechanism="banded Toeplitz", sizes=lambda setup: setup.band_counts(),
               structured_strategy=_banded_structured, cyclic_reaccount=True, banded=True),
    PlanFamily("blt", _blt_offers, _blt_built, _toeplitz_dense, _reduction_write_refusal, mechanism="BLT",
               sizes=lambda setup: setup.buffers, madds_per_float=2.0, artifact_kind="blt",
               structured_strategy=_blt_structured),
    _tree_family("tree", "tree", "tree", ""),
    _tree_family("honaker", "honaker-online", "Honaker (online)", ", Honaker decoder"),
)}


def family(kind: str) -> PlanFamily:
    """The family of candidates of ``kind``; :class:`MfcliError` for an unknown one."""
    if kind not in FAMILIES:
        raise MfcliError(f"unknown candidate kind {kind!r}; one of {', '.join(FAMILIES)}")
    return FAMILIES[kind]


def _setting_of(r: CandidateResult) -> tuple[str, float | None, str | None]:
    """(accounting setting, sampling rate, batch sampler) as ``mfcli account`` names them."""
    if r.accounting == "dp-sgd":
        return "dp-sgd", r.sampling, "poisson"
    if r.accounting == "cyclic-poisson":
        return "cyclic-poisson", r.sampling, "cyclic"
    return r.accounting, None, None


def write_artifact(setup: TrainingSetup, r: CandidateResult, path: Any, *, command: str = "",
                   force: bool = False) -> dict[str, Any]:
    """Write candidate ``r`` as an artifact at ``path`` with its accounting record inside (the
    ``account --write`` group ``accounting/<id>``): the strategy, the schema it was accounted
    under, sigma, the sampler and epsilon. The artifact is structured (Toeplitz or BLT parameters)
    for every candidate that has that form, at any n, and dense only for the dense optimum, the
    tree and Honaker (and DP-SGD's identity at n <= PLAN_DENSE_ARTIFACT_MAX_N); either way the record
    is what the accounting session computes on the written file, as ``mfcli account`` would (a
    structured one from its parameters), and it must meet the target, or nothing is left behind.

    Returns what was written (path, setting, noise multiplier, noise std (the record's sigma), sampling,
    epsilon, record group).

    Raises:
        MfcliError: the candidate has no artifact form, or re-accounting misses the target.
    """
    import os
    from pathlib import Path

    from threadpoolctl import threadpool_limits

    ok, why = writable(r, setup.n)
    if not ok:
        raise MfcliError(f"{r.key} cannot be written as an artifact: {why}")
    target = Path(path)
    # built beside the target and renamed over it once the record is in and meets the target
    tmp = target.with_name(f".{target.name}.plan-{os.getpid()}.tmp.h5")
    setting, sampling, batching = _setting_of(r)
    # DP-SGD (C = I) is accounted without a schema (Poisson sampling in every step)
    schema = None if isinstance(r.participation, SingleParticipation) or family(r.kind).identity else r.participation
    # rebuilt as evaluate built it (BLAS on one thread), so the written operator is the calibrated one
    with threadpool_limits(1):
        return _write(setup, r, target, tmp, setting, sampling, batching, schema, command, force)


def _write(setup: TrainingSetup, r: CandidateResult, target: Any, tmp: Any, setting: str, sampling: float | None,
           batching: str | None, schema: Participation | None, command: str, force: bool) -> dict[str, Any]:


    try:
        return _write_via(setup, r, target, tmp, setting, sampling, batching, schema, command, force)
    except MfcliError as err:
        # A failure while the temporary file beside the target is written (an unwritable or
        # special folder, a full disk) is the user's target's failure: name the target, as the
        # artifact writers do (mfcli.io.artifact.atomic_path), not plan's temporary file.
        if str(tmp) not in str(err):
            raise
        raise type(err)(str(err).replace(str(tmp), str(target))) from None
    finally:
        tmp.unlink(missing_ok=True)


def _write_via(setup: TrainingSetup, r: CandidateResult, target: Any, tmp: Any, setting: str, sampling: float | None,
               batching: str | None, schema: Participation | None, command: str, force: bool) -> dict[str, Any]:
    """:func:`_write`'s work: the artifact at ``tmp``, its accounting record, then the move to ``target``."""
    import os

    from mfcli.services import account as session

    if setup.n <= family(r.kind).dense_artifact_max_n:
        from mfcli.io.artifact import save_strategy
        from mfcli.strategies.baselines import Strategy

        st = _dense_strategy(setup, r)
        if isinstance(st, tuple):
            st = Strategy(st[1], st[0], True, r.strategy)
        save_strategy(tmp, st, workload_name=setup.workload, workload_params=dict(dense_workload(setup).params),
                      command=command, force=True, participation=schema)
    else:
        from mfcli.io.artifact import save_structured_artifact

        save_structured_artifact(tmp, _structured_strategy(setup, r), workload=toeplitz_of(setup), n=setup.n,
                                 participation=schema, command=command, force=True)
    # the accounting session on the written file, as `mfcli account` runs it (a structured
    # artifact: the session, through its Mechanism, from its parameters)
    inp = session.resolve_strategy(tmp)
    report = session.account(inp, sigma=r.sigma, sampling=sampling, settings=[setting],
                             options=session.AccountingOptions(delta=setup.delta,
                                                               value_discretization=PLD_DISCRETIZATION),
                             participation=schema, batching=batching)
    eps = float(report.rows[setting]["epsilon"])
    if not eps <= setup.epsilon:
        raise MfcliError(f"re-accounting {r.key} on the written artifact gives epsilon {eps!r} > "
                         f"{setup.epsilon:g}; nothing written")
    group = session.record_to_artifact(report, calibration=r.calibration, calibrated_setting=setting,
                                       command=command)
    from mfcli.io.artifact import atomic_path

    # the move into place is the artifact writers' own commit: precondition re-checked under the
    # directory lock (a concurrent writer of the same new file fails), fsync, then rename
    with atomic_path(target, force=force) as final:
        os.replace(tmp, final)
    return {"artifact": str(target), "candidate": r.key, "setting": setting, "noise_multiplier": r.noise_multiplier,
            "noise_std": r.sigma, "sampling": sampling, "batching": batching, "epsilon": eps, "record": group}


def other_sampler_guarantees(setup: TrainingSetup, r: CandidateResult) -> list[dict[str, Any]]:
    """The epsilon that the other allowed batch samplers certify for ``r``'s artifact at the same
    noise std (``r.sigma`` on C G as built), each a guarantee, with ``smaller`` when it is below
    ``r.epsilon``:

    * ``fixed-order`` (no sampling; each example once per epoch in its slot): the analytic Gaussian
      at the C's fixed-epoch schema sensitivity (C = I: sqrt(epochs); BandMF's banded Toeplitz C:
      ``toeplitz_sensitivity``);
    * ``poisson``: the DP-SGD reduction, DP-SGD at sigma / ||C||_2 (certified) with Poisson rate q
      for n steps;
    * ``balls-in-bins`` (any steps per epoch): the DP-SGD reduction under balls-in-bins (and for the
      tree on 2^L leaves its own balls-in-bins bound, the smaller); non-adaptive contributions only;
    * ``cyclic``: a banded C with b <= the groups the setup allows, 2306.08153 Thm. 3 at b groups.

    The shuffle sampler is not accounted here (its bounds need batch size 1). Computed for the
    recommended row only (one accounting each)."""
    from mfcli.accounting.reduction import reduced_epsilon
    from mfcli.accounting.single_pass import gaussian_epsilon

    e, s, n = int(setup.epochs or 1), setup.steps_per_epoch, setup.n
    out: list[dict[str, Any]] = []
    built: list[_Built] = []

    def operator() -> _Built:  # rebuilt as evaluate built it (only when a sampler needs the coefficients)
        if not built:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(1):
                built.append(_build_any(setup, Candidate(r.key, r.kind, r.sampler, r.size)))
        return built[0]

    def add(sampler: str, accounting: str, eps: float, participation: str, adaptive: bool = True) -> None:
        from mfcli.services.account import neighbouring_of

        out.append({"batch_sampler": sampler, "accounting": accounting, "epsilon": float(eps),
                    "participation": participation, "neighbouring": neighbouring_of(accounting, sampler),
                    "adaptive": adaptive, "smaller": bool(eps < r.epsilon)})

    for sampler in setup.batching:
        if sampler in (r.sampler, "shuffle"):
            continue
        try:
            fixed_sens = family(r.kind).fixed_order_sensitivity
            if sampler == "fixed-order" and fixed_sens is not None:
                schema = fixed_schema(setup)
                sens = fixed_sens(setup, operator)
                add(sampler, "single-pass" if e == 1 else "deterministic", gaussian_epsilon(setup.delta, sens / r.sigma),
                    schema.describe(n))
            elif sampler == "poisson" and r.spectral_norm is not None:
                res = reduced_epsilon(sampler="poisson", noise_multiplier=r.sigma / r.spectral_norm, n=n,
                                      sampling=setup.sampling, delta=setup.delta,
                                      value_discretization=PLD_DISCRETIZATION)
                add(sampler, "dp-sgd-reduction", res.epsilon, POISSON_PARTICIPATION["description"])
            elif sampler == "balls-in-bins" and r.spectral_norm is not None:
                from mfcli.accounting.balls_in_bins import tree_balls_in_bins

                words = SingleParticipation().describe(n) if e == 1 else FixedEpoch(epochs=e).describe(n)
                eps = bib_dpsgd_epsilon(s, e, setup.delta, r.sigma / r.spectral_norm)
                name = bib_accounting(r.kind)
                if family(r.kind).is_tree and _pow2(s):  # the tree's own bound: 2^L leaves only
                    tree = tree_balls_in_bins(n=s, sigma=r.sigma, delta=setup.delta, epochs=e).epsilon
                    if tree < eps:
                        eps, name = tree, "balls-in-bins-tree"
                add(sampler, name, eps, words, adaptive=False)
            elif sampler == "cyclic" and family(r.kind).cyclic_reaccount and (r.size or 1) <= setup.max_groups:
                from mfcli.accounting.multi import reduced_dpsgd
                from mfcli.strategies.structured import banded_numbers
                from mfcli.strategies.toeplitz import BandedToeplitz

                k = int(r.size or 1)
                bands, col = banded_numbers(BandedToeplitz(operator().extra["coefs"]), n)
                cyc = reduced_dpsgd(bands=bands, column_norm=col, n=n, schema=MinSeparation(separation=k),
                                    sigma=r.sigma, sampling=k * setup.sampling, delta=setup.delta,
                                    value_discretization=PLD_DISCRETIZATION)
                add(sampler, "cyclic-poisson", cyc.epsilon, MinSeparation(separation=k).describe(n))
        except MfcliError:
            continue  # that sampler's accounting does not apply to this artifact: no entry
        except MemoryError:
            # a reduction at a tiny noise multiplier (sigma / ||C||_2 of a huge-epsilon row) whose PLD
            # does not fit: no entry, as for one that does not apply; the row's own guarantee stands
            continue
    return out


@dataclass(frozen=True)
class Plan:
    """The evaluated setup: ranked results, skipped candidates and the recommendation;
    ``other_samplers``: :func:`other_sampler_guarantees` of the recommendation."""

    setup: TrainingSetup
    ranked: tuple[CandidateResult, ...]
    skipped: tuple[Skipped, ...]
    recommended: CandidateResult | None
    seconds: float
    other_samplers: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        n = self.setup.n
        return {
            "setup": self.setup.as_dict(),
            "units": "noise_multiplier: noise_std / sensitivity (the noise multiplier of Opacus and jax_privacy); "
                     "noise_std (sigma): the standard deviation of the noise on C G for C as built, clip norm 1 "
                     "(calibration.sigma is the same number); sensitivity: of that C under the participation the "
                     "row's accounting assumes (one participation for the sampled rows, the schema's for the "
                     "fixed-order rows); rmse_mean: sqrt(mean over steps of sigma^2 ||B[t,:]||^2), rmse_max: max over "
                     "steps of sigma ||B[t,:]||, the noise of the released iterates per coordinate; stream_bytes: "
                     "float32 floats kept x params",
            "recommended": None if self.recommended is None else self.recommended.key,
            "candidates": [r.as_dict(n) for r in self.ranked],
            "skipped": [s.as_dict() for s in self.skipped],
            "seconds": self.seconds,
            "report": self.report(),
        }

    def report(self) -> dict[str, Any]:
        """The number to report for the recommended candidate: its epsilon, accounting, batch
        sampler, participation and neighbouring relation (epsilon None without a recommendation).
        The rows ranked above it and not recommended are listed with the reason."""
        r = self.recommended
        n = self.setup.n
        passed = []
        for x in self.ranked:
            if r is not None and x.key == r.key:
                break
            passed.append({"candidate": x.key, "epsilon": x.epsilon,
                           "reason": not_recommended(x, n, max_stream_bytes=self.setup.max_stream_bytes)})
        if r is None:
            return {"epsilon": None, "candidate": None, "accounting": None, "batch_sampler": None, "sampling": None,
                    "participation": None, "neighbouring": None, "noise_multiplier": None, "noise_std": None,
                    "delta": self.setup.delta, "passed_over": passed, "other_samplers": []}
        return {"epsilon": r.epsilon, "candidate": r.key, "accounting": r.accounting, "batch_sampler": r.sampler,
                "sampling": r.sampling, "participation": r.participation_text(n), "neighbouring": r.neighbouring(),
                "noise_multiplier": r.noise_multiplier, "noise_std": r.sigma,
                "delta": self.setup.delta, "passed_over": passed, "other_samplers": list(self.other_samplers)}


def make_plan(setup: TrainingSetup, *, scheduler: str | Any | None = None, workers: int | None = None,
              progress: Callable[[str], None] | None = None) -> Plan:
    """Enumerate, evaluate (:func:`run_plan`), rank and recommend.

    Raises:
        MfcliError: no candidate applies to the allowed samplers, or none reaches the target
            (with the largest sigma tried and what to change).
    """
    t0 = time.perf_counter()
    cands, skipped = enumerate_candidates(setup)
    # refused before any run: a PLD row whose calibration cannot fit the memory budget (a huge
    # target: the walk down to a tiny sigma would take minutes and end out of memory)
    heavy = [Skipped(c.key, c.sampler, why, over_memory=True) for c in cands
             if (why := pld_memory_refusal(setup, c.sampler, setup.epsilon)) is not None]
    heavy_keys = {h.key for h in heavy}
    cands = [c for c in cands if c.key not in heavy_keys]
    for h in heavy:
        if progress:
            progress(f"{h.key}: skipped, {h.reason}")
    results = run_plan(setup, cands, scheduler=scheduler, workers=workers, progress=progress) if cands else []
    done = [r for r in results if isinstance(r, CandidateResult)]
    failed = [r for r in results if isinstance(r, Skipped)]
    skipped += heavy
    if not done:
        loose = [f for f in failed if f.met_without_noise]
        if len(loose) == len(failed) and (loose or heavy):
            reasons: list[str] = []
            if loose:
                reasons.append(f"is met by every {'other ' if heavy else ''}candidate even with almost no noise (the "
                           f"calibration's smallest sigma is {SIGMA_MIN:g}; {loose[0].key}: {loose[0].reason})")
            if heavy:
                reasons.append(f"cannot be calibrated within the memory budget by {', '.join(h.key for h in heavy)} "
                           f"({heavy[0].reason})")
            raise MfcliError(f"epsilon {setup.epsilon:g} " + "; it ".join(reasons) + "; such a target promises no "
                             "meaningful privacy: give a smaller epsilon (DP training targets are typically 1 to 10)"
                             + (", or a larger memory budget" if heavy else ""))
        raise MfcliError(f"no candidate reaches epsilon {setup.epsilon:g} at delta {setup.delta:g} with sigma up to "
                         f"{SIGMA_MAX:g} ({failed[0].key}: {failed[0].reason}); raise the target epsilon or delta, or "
                         "train fewer epochs")
    ranked = rank(done)
    best = recommend(ranked, setup.n, max_stream_bytes=setup.max_stream_bytes)
    others = () if best is None else tuple(other_sampler_guarantees(setup, best))
    return Plan(setup, tuple(ranked), tuple(skipped + failed), best, time.perf_counter() - t0, others)


__all__ = [
    "DEFAULT_SAMPLERS",
    "SAMPLERS",
    "Candidate",
    "CandidateResult",
    "Plan",
    "Skipped",
    "TrainingSetup",
    "enumerate_candidates",
    "evaluate",
    "make_plan",
    "memory_budget",
    "not_recommended",
    "other_sampler_guarantees",
    "pld_memory_floor",
    "pld_memory_refusal",
    "rank",
    "recommend",
    "run_plan",
    "worker_died_message",
]
