"""Batch samplers that match mfcli's accounting: which examples a trainer puts in the batch of step t
(docs/samplers.md).

Amplification by sampling is part of the privacy claim: an epsilon accounted under Poisson sampling
holds only if the batches are really drawn that way. Each sampler here draws exactly the batches
one accounting setting assumes (:mod:`mfcli.accounting`):

* :class:`PoissonSampler` (``poisson``: DP-SGD and MMCC rows): at every step t < n, every example
  is in the batch independently with probability ``rate``.
* :class:`CyclicPoissonSampler` (``cyclic``: the cyclic-Poisson row, 2306.08153 Alg. 2): every
  example's group is uniform over the b groups and independent of the other examples; at step t
  every member of group ``t mod b`` is in the batch independently with probability ``rate``, and
  nobody else is. An example can take part only at steps congruent to its group mod b, each
  time independently with probability ``rate``: the setting of Thm. 3 for every fixed group,
  whatever the group sizes (which are random).
* :class:`BallsInBinsSampler` (``balls-in-bins``: the balls-in-bins tree row): one epoch of n
  steps; every example is placed in exactly one step, chosen uniformly at random and independently
  of the other examples. Its tree row assumes contributions fixed in advance (non-adaptive):
  :func:`sampler_for` hands it out only with ``non_adaptive=True``.
* :class:`ShuffleSampler` (``shuffle``: single-pass, shuffled tree and shuffled DP-SGD rows): one
  epoch of n steps; a uniform permutation of the examples cut into n consecutive near-equal
  batches. With ``examples == n`` that is the batch-size-1 shuffled epoch of
  Feldman-McMillan-Talwar. A permutation depends on N: its rows hold for a fixed, public N and
  zero-out (or, shuffled DP-SGD, replace-one) neighbours, not add-remove.
* :class:`FixedOrderSampler` (``mfcli plan``'s ``fixed-order``; records with no batch sampler,
  deterministic participation): every example gets one uniform slot of ``period``, independent
  of the others; slot ``t mod period`` at step t, so every example takes part exactly at the
  steps a fixed-epoch, min-separation or single-participation schema allows
  (:func:`fixed_order_period`). No amplification is claimed for it.

Neighbouring datasets. Poisson, cyclic, balls-in-bins and fixed-order batches are drawn per
example: whether example i is in batch t is a pure function of (seed, t, i), so adding or
removing one example changes no other example's batches. Then for every fixed value of the new
example's own randomness (its group or slot) the accounting row's argument applies, and the run
is a mixture over that randomness, which is at least as private as its worst component (joint
convexity of the hockey-stick divergence; docs/samplers.md). Those rows hold for add-remove
neighbours (``neighbouring`` on every sampler says which relation it serves).

Randomness. Every batch is a pure function of ``(seed, step)``: numpy's counter-based Philox
generator keyed by a SHA-256 of the seed, the sampler kind and the purpose (group or slot
allocation, permutation, step draw), with the step in the counter. So ``batch(t)`` is random
access (resume at any step without replay), iteration and random access agree, and a sampler
never shares random bits with a noise stream (:mod:`mfcli.training.noise`) even when the same seed is
passed to both. The seed is a secret like the noise seed: the amplification assumes nobody but
the trainer knows who was in which batch; draw it with ``secrets.randbits(128)``.

Resuming mirrors :mod:`mfcli.training.noise`: :meth:`state_dict` is a checkpoint of the next step to draw
(with the sampler's identity and an HMAC tag keyed by the seed), :meth:`load_state_dict` checks it
fits this sampler and returns that step. A step t >= n is refused: drawing batches past the end
means training past what was accounted.

:func:`sampler_for` builds the sampler that an artifact's accounting record (``mfcli account
--write``, ``mfcli plan --out``) names, with its rate, groups and step count, after re-deriving
the record from the artifact (:func:`verified_record`; a record that does not verify is refused).

Example:
    >>> s = PoissonSampler(examples=1000, rate=0.01, steps=4, seed=7)
    >>> b = s.batch(2)                       # sorted int64 indices of the examples in step 2
    >>> bool(((0 <= b) & (b < 1000)).all()) and bool((b == s.batch(2)).all())
    True
    >>> [len(x) for x in s] == [len(s.batch(t)) for t in range(4)]
    True
    >>> c = CyclicPoissonSampler(examples=10, groups=4, rate=1.0, steps=8, seed=1)
    >>> all((c.batch(t) == c.group(t % 4)).all() for t in range(8))   # rate 1: group t mod 4 whole
    True
    >>> c.load_state_dict(c.state_dict(5))   # resume: the next step to draw
    5
"""
from __future__ import annotations

import hashlib
import hmac
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from mfcli.errors import MfcliError
from mfcli.training.noise import AccountedOperator, NoiseStream, StreamOptions, check_seed, noise_stream
from mfcli.util.validation import positive_int

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11; annotations only, so no runtime dependency

STATE_FORMAT = "mfcli.sampler_state"
STATE_FORMAT_VERSION = 1
#: The batch samplers of the accounting (``mfcli account --batching``) that have a sampler here.
KINDS = ("poisson", "cyclic", "balls-in-bins", "shuffle")


@runtime_checkable
class BatchSampler(Protocol):
    """What a training loop needs from a batch sampler: ``batch(t)`` for the steps 0..n-1."""

    kind: ClassVar[str]
    neighbouring: ClassVar[str]

    @property
    def examples(self) -> int:
        """The number of examples N (indices 0..N-1)."""
        ...

    @property
    def steps(self) -> int:
        """The number of steps n the sampler covers (the accounted steps)."""
        ...

    def batch(self, step: int) -> np.ndarray:
        """Sorted int64 indices (into 0..examples-1) of the examples in the batch of ``step``."""
        ...

    def batches(self, start: int = 0) -> Iterator[np.ndarray]:
        """``batch(t)`` for t = start, ..., steps - 1."""
        ...

    def expected_batch_size(self, step: int) -> float:
        """E|batch(step)| over the sampler's randomness, from N (a divisor only if N is public)."""
        ...

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (no seed)."""
        ...

    def state_dict(self, step: int) -> dict[str, Any]:
        """A checkpoint saying the next step to draw is ``step``."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> int:
        """The next step to draw, from a checkpoint of this sampler."""
        ...




def _check_rate(rate: Any) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
        raise MfcliError(f"the sampling rate must be a number in (0, 1], got {rate!r}")
    r = float(rate)
    if not (0.0 < r <= 1.0):   # also refuses NaN
        raise MfcliError(f"the sampling rate must be in (0, 1], got {rate!r}")
    return r


def _generator(key: int, counter: int) -> np.random.Generator:
    """Philox keyed by ``key`` (128 bits) at counter (0, 0, counter, 0): independent streams per
    counter value, as in :mod:`mfcli.training.noise`."""
    bg = np.random.Philox(key=key, counter=[0, 0, counter, 0])
    return np.random.Generator(bg)


def _slots(key: int, count: int, examples: int) -> np.ndarray:
    """Every example's slot in 0..count-1: uniform, independent across examples, and a pure
    function of (key, index): numpy draws bounded integers one after the other from one Philox
    stream (Lemire's method, rejections included), so the first N draws of N + 1 examples are the
    draws of N examples. Adding example N therefore moves nobody else (tested directly)."""
    return _generator(key, 0).integers(0, count, size=examples, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class _Sampler(ABC):
    """Shared checks, random access, iteration and checkpoints; subclasses draw one step."""

    kind: ClassVar[str] = ""
    #: The neighbouring relation under which the accounting rows this sampler serves hold
    #: (docs/samplers.md, "Neighbouring datasets"): ``add-remove`` when every example's batches
    #: are a function of the seed and its own index only, so that adding or removing one example
    #: leaves everyone else's batches unchanged; ``zero-out`` when the batches depend on N (a
    #: permutation), which must then be fixed and public.
    neighbouring: ClassVar[str] = "add-remove"
    examples: int
    steps: int
    seed: int = field(repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "examples", check_examples(self.examples))
        object.__setattr__(self, "steps", positive_int(self.steps, "the number of steps"))
        object.__setattr__(self, "seed", check_seed(self.seed, what="sampler seed"))

    # ------------------------------------------------------------------ randomness

    def _key(self, purpose: str) -> int:
        """A 128-bit Philox key for one purpose, derived from the seed (never the seed itself, so
        no sampler draws the bits of a noise stream with the same seed)."""
        h = hashlib.sha256(f"mfcli-sampler|{self.kind}|{purpose}|{self.seed}".encode()).digest()
        return int.from_bytes(h[:16], "little")

    def _step_generator(self, step: int) -> np.random.Generator:
        return _generator(self._key("step"), step)

    @abstractmethod
    def _draw(self, step: int) -> np.ndarray:
        """The batch of a checked step (each sampler's definition)."""

    @abstractmethod
    def _expected(self, step: int) -> float:
        """E|batch(step)| of a checked step."""

    def expected_batch_size(self, step: int) -> float:
        """E|batch(step)| over the sampler's randomness (the seed), computed from ``examples``.

        Dividing the noisy gradient sum by it keeps the sensitivity only if it is a constant fixed
        in advance: under add-remove neighbours N itself is private, so use it only when N is
        public (fixed before training); otherwise divide by a public constant of your own."""
        return self._expected(self._check_step(step))

    # ------------------------------------------------------------------ public interface

    def _check_step(self, step: Any, *, allow_end: bool = False) -> int:
        top = self.steps if allow_end else self.steps - 1
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= int(step) <= top:
            raise MfcliError(f"step must be an integer in [0, {top}] (the sampler covers {self.steps} steps), "
                             f"got {step!r}")
        return int(step)

    def batch(self, step: int) -> np.ndarray:
        """Sorted int64 indices of the examples in the batch of ``step`` (a new array). The same
        (seed, step) always gives the same batch. Step >= steps is refused: it was not accounted."""
        out = self._draw(self._check_step(step))
        return np.asarray(out, dtype=np.int64)

    def batches(self, start: int = 0) -> Iterator[np.ndarray]:
        """``batch(t)`` for t = start, ..., steps - 1 (resume with ``start``)."""
        start = self._check_step(start, allow_end=True)
        for t in range(start, self.steps):
            yield self.batch(t)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.batches(0)

    def __len__(self) -> int:
        return self.steps

    def _params(self) -> dict[str, Any]:
        return {}

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (no seed): kind, examples, steps and the kind's parameters."""
        return {"kind": self.kind, "examples": self.examples, "steps": self.steps, **self._params()}

    # ------------------------------------------------------------------ checkpoints

    def _identity(self) -> str:
        return json.dumps(self.describe(), sort_keys=True)

    def _seed_hash(self) -> str:
        return hashlib.sha256(f"mfcli-sampler-seed|{self.seed}|{self._identity()}".encode()).hexdigest()

    def _tag(self, step: int) -> str:
        key = hashlib.sha256(f"mfcli-sampler-checkpoint-key|{self.seed}".encode()).digest()
        return hmac.new(key, f"{self._identity()}|{step}".encode(), hashlib.sha256).hexdigest()

    def state_dict(self, step: int) -> dict[str, Any]:
        """A checkpoint: the next step to draw is ``step`` (0..steps). Holds the sampler's
        description, a one-way hash of the seed and an HMAC-SHA256 tag keyed by the seed, so a
        checkpoint edited (step rewound) or written by another sampler is refused on load."""
        t = self._check_step(step, allow_end=True)
        return {"format": STATE_FORMAT, "format_version": STATE_FORMAT_VERSION, "step": t,
                "sampler": self._identity(), "seed_sha256": self._seed_hash(), "tag": self._tag(t)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> int:
        """The next step to draw, after checking the checkpoint was written by this sampler (same
        kind, parameters and seed) and not edited. Raises MfcliError naming the mismatch."""
        if not isinstance(state_dict, Mapping):
            raise MfcliError("not an mfcli sampler checkpoint (expected a mapping)")
        sd = {k: (v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v) for k, v in state_dict.items()}
        if sd.get("format") != STATE_FORMAT:
            raise MfcliError(f"not an mfcli sampler checkpoint (format is not {STATE_FORMAT})")
        if sd.get("format_version") != STATE_FORMAT_VERSION:
            raise MfcliError(f"sampler checkpoint format_version {sd.get('format_version')!r} is not supported")
        if sd.get("sampler") != self._identity():
            raise MfcliError(f"sampler checkpoint does not fit this sampler: it was written by {sd.get('sampler')}, "
                             f"this sampler is {self._identity()}")
        if sd.get("seed_sha256") != self._seed_hash():
            raise MfcliError("sampler checkpoint was written with a different seed than this sampler's")
        t = self._check_step(sd.get("step"), allow_end=True)
        tag = sd.get("tag")
        if not isinstance(tag, str) or not hmac.compare_digest(tag, self._tag(t)):
            raise MfcliError("sampler checkpoint failed its authentication tag: it was edited or not written "
                             "by this sampler")
        return t


@dataclass(frozen=True, kw_only=True)
class PoissonSampler(_Sampler):
    """Poisson sampling: at every step, every example independently with probability ``rate``.

    The batch size is Binomial(examples, rate) (it varies; do not pad or truncate batches: the
    accounting assumes the sampled set as drawn). One uniform per example per step: O(examples).
    """

    kind: ClassVar[str] = "poisson"
    rate: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "rate", _check_rate(self.rate))

    def _params(self) -> dict[str, Any]:
        return {"rate": self.rate}

    def _draw(self, step: int) -> np.ndarray:
        u = self._step_generator(step).random(self.examples)
        return np.flatnonzero(u < self.rate)

    def _expected(self, step: int) -> float:
        return self.examples * self.rate


@dataclass(frozen=True, kw_only=True)
class CyclicPoissonSampler(_Sampler):
    """Cyclic Poisson sampling (2306.08153 Alg. 2) with independent groups: every example's group
    is uniform over the ``groups`` = b groups, drawn once and independently of the other examples
    (a pure function of the seed and the example's index, :func:`_slots`); at step t, every member
    of group ``t mod b`` independently with probability ``rate`` (one uniform per example and step,
    again a pure function of the seed, the step and the index), nobody else.

    Adding or removing one example leaves every other example's group and draws unchanged, which
    is what the add-remove guarantee of the cyclic-Poisson row needs (docs/samplers.md). Group
    sizes are therefore random (multinomial); a group may be empty.
    """

    kind: ClassVar[str] = "cyclic"
    neighbouring: ClassVar[str] = "add-remove"
    groups: int = 1
    rate: float = 0.0
    _group: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        b = positive_int(self.groups, "the number of groups")
        object.__setattr__(self, "groups", b)
        object.__setattr__(self, "rate", _check_rate(self.rate))
        object.__setattr__(self, "_group", _slots(self._key("groups"), b, self.examples))

    def _params(self) -> dict[str, Any]:
        return {"groups": self.groups, "rate": self.rate}

    def group(self, g: int) -> np.ndarray:
        """The sorted members of group ``g`` (0..b-1): sampled at the steps t with t mod b = g."""
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or not 0 <= int(g) < self.groups:
            raise MfcliError(f"group must be an integer in [0, {self.groups - 1}], got {g!r}")
        return np.flatnonzero(self._group == int(g))

    def group_of(self) -> np.ndarray:
        """For every example, its group (an int64 array of length ``examples``)."""
        return self._group.copy()

    def _expected(self, step: int) -> float:
        return self.examples * self.rate / self.groups

    def _draw(self, step: int) -> np.ndarray:
        # One uniform per example (not per member): example i's draw is the i-th of the step's
        # stream, so it does not depend on who else exists.
        u = self._step_generator(step).random(self.examples)
        return np.flatnonzero((self._group == step % self.groups) & (u < self.rate))


@dataclass(frozen=True, kw_only=True)
class BallsInBinsSampler(_Sampler):
    """Balls-in-bins (random allocation) over one epoch of ``steps`` steps: every example in exactly
    one step, uniform and independent of the others. Batch sizes are Binomial(examples, 1/steps)
    jointly multinomial; some batches may be empty."""

    kind: ClassVar[str] = "balls-in-bins"
    _order: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False, compare=False)
    _starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False,
                                compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        bins = _slots(self._key("allocation"), self.steps, self.examples)
        order = np.argsort(bins, kind="stable")   # examples by step, ascending within a step
        object.__setattr__(self, "_order", order.astype(np.int64))
        object.__setattr__(self, "_starts", np.searchsorted(bins[order], np.arange(self.steps + 1)))

    def step_of(self) -> np.ndarray:
        """For every example, the one step it is placed in (an int64 array of length ``examples``)."""
        out = np.empty(self.examples, dtype=np.int64)
        for t in range(self.steps):
            out[self._order[self._starts[t]:self._starts[t + 1]]] = t
        return out

    def _draw(self, step: int) -> np.ndarray:
        return self._order[self._starts[step]:self._starts[step + 1]].copy()

    def _expected(self, step: int) -> float:
        return self.examples / self.steps


@dataclass(frozen=True, kw_only=True)
class ShuffleSampler(_Sampler):
    """One shuffled epoch: a uniform permutation cut into ``steps`` consecutive near-equal batches
    (``numpy.array_split``); batch size 1 when ``examples == steps``. Needs examples >= steps.

    A permutation of N deals every example's batch from N: adding one example re-deals all of
    them. The shuffle rows therefore hold for a fixed, public N and neighbours of the same size:
    zeroing out one example's contribution (single pass, shuffled tree) or replacing it (shuffled
    DP-SGD, batch size 1) -- not for adding or removing one (docs/samplers.md)."""

    kind: ClassVar[str] = "shuffle"
    neighbouring: ClassVar[str] = "zero-out"
    _perm: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.examples < self.steps:
            raise MfcliError(f"a shuffled epoch of {self.steps} steps needs at least {self.steps} examples, "
                             f"got {self.examples}")
        object.__setattr__(self, "_perm", _generator(self._key("permutation"), 0).permutation(self.examples))

    def _expected(self, step: int) -> float:
        q, r = divmod(self.examples, self.steps)
        return float(q + (1 if step < r else 0))

    def _draw(self, step: int) -> np.ndarray:
        q, r = divmod(self.examples, self.steps)
        start = step * q + min(step, r)
        return np.sort(self._perm[start:start + q + (1 if step < r else 0)])


@dataclass(frozen=True, kw_only=True)
class FixedOrderSampler(_Sampler):
    """Fixed order (``mfcli plan``'s ``fixed-order``): every example gets one slot, uniform over
    ``period`` slots and independent of the other examples (a pure function of the seed and its
    index, :func:`_slots`); step t uses the examples of slot ``t mod period``.

    No amplification: it is for the deterministic-participation accounting, where every example
    must take part only in steps its schema allows. Slot j is used at steps j, j + period, ...:
    with period = n / k that is fixed-epoch with k epochs, with period = b min-separation b (at
    most ceil(n / b) participations), with period = n single participation
    (:func:`fixed_order_period`). Adding or removing one example leaves every other example's
    slot unchanged (the add-remove guarantee needs that, docs/samplers.md); batch sizes are
    therefore random (multinomial) and a batch may be empty.
    """

    kind: ClassVar[str] = "fixed-order"
    neighbouring: ClassVar[str] = "add-remove"
    period: int = 1
    _slot: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False, compare=False)
    _order: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False, compare=False)
    _starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False,
                                compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        b = positive_int(self.period, "the period (batches per cycle)")
        object.__setattr__(self, "period", b)
        slot = _slots(self._key("slots"), b, self.examples)
        order = np.argsort(slot, kind="stable")   # examples by slot, ascending within a slot
        object.__setattr__(self, "_slot", slot)
        object.__setattr__(self, "_order", order.astype(np.int64))
        object.__setattr__(self, "_starts", np.searchsorted(slot[order], np.arange(b + 1)))

    def _params(self) -> dict[str, Any]:
        return {"period": self.period}

    def slot_of(self) -> np.ndarray:
        """For every example, its slot (an int64 array of length ``examples``)."""
        return self._slot.copy()

    def _expected(self, step: int) -> float:
        return self.examples / self.period

    def _draw(self, step: int) -> np.ndarray:
        j = step % self.period
        return self._order[self._starts[j]:self._starts[j + 1]].copy()


TRAINING_STATE_FORMAT = "mfcli.training_state"


def training_state_dict(sampler: BatchSampler, stream: Any, state: Any) -> dict[str, Any]:
    """One checkpoint of a training loop's sampler and noise stream at the same step: the next
    step to draw is ``state.t`` for both. ``stream`` is a :class:`mfcli.training.noise.NoiseStream` and
    ``state`` its :class:`~mfcli.training.noise.NoiseState` after the last step taken.

    Save it in the same write as the model's parameters and optimizer state, and resume only from
    the latest such checkpoint: resuming the noise at an earlier step than the model adds the same
    noise rows again to different gradients, which the accounting does not cover (no checkpoint
    format can detect an older checkpoint of the same run).

    Raises:
        MfcliError: the sampler and the stream cover different numbers of steps.
    """
    if sampler.steps != stream.n:
        raise MfcliError(f"the sampler covers {sampler.steps} steps and the noise stream {stream.n}: they are "
                         "not from the same artifact")
    noise = stream.state_dict(state)
    t = int(noise["t"])
    return {"format": TRAINING_STATE_FORMAT, "step": t, "sampler": sampler.state_dict(t), "noise": noise}


def load_training_state(sampler: BatchSampler, stream: Any, checkpoint: Mapping[str, Any]) -> tuple[int, Any]:
    """(next step, noise state) from a :func:`training_state_dict` checkpoint, after each part is
    checked by its own ``load_state_dict`` (identity, seed, authentication tag) and the two steps
    are checked to be the same: a sampler resumed at another step than the noise would pair
    batches with noise rows other than the ones accounted, or replay noise rows.

    Raises:
        MfcliError: not such a checkpoint, either part refused, or the two steps differ.
    """
    if not isinstance(checkpoint, Mapping) or checkpoint.get("format") != TRAINING_STATE_FORMAT:
        raise MfcliError(f"not an mfcli training checkpoint (format is not {TRAINING_STATE_FORMAT})")
    step = sampler.load_state_dict(checkpoint.get("sampler"))   # type: ignore[arg-type]
    state = stream.load_state_dict(checkpoint.get("noise"))
    if step != state.t:
        raise MfcliError(f"training checkpoint pairs sampler step {step} with noise step {state.t}: resuming would "
                         "put noise rows on other batches than accounted (or replay them); refusing")
    return step, state


def fixed_order_period(schema: Any, n: int) -> int | None:
    """The period of a :class:`FixedOrderSampler` whose every example's steps a deterministic
    participation schema allows over n steps, or None when there is none
    (:func:`mfcli.model.participation.cyclic_period`): n for single participation, n / k for k
    fixed epochs, b for min-separation b (if a cap k on the participations is met: ceil(n / b) <= k)."""
    from mfcli.model.participation import cyclic_period

    return cyclic_period(schema, n)


# ---------------------------------------------------------------------------------------------
# The sampler an accounting record names


def accounting_records(artifact: str | Path) -> dict[str, dict[str, Any]]:
    """The ``mfcli.accounting`` records of an artifact as stored: {record id: its attributes},
    oldest first (ids start with the UTC time of writing), read by the one record reader
    (:func:`mfcli.services.records.read_records`). NOT verified: :func:`verified_record`
    re-derives one from the artifact before anything here uses it.

    Raises:
        MfcliError: an unreadable file.
    """
    from mfcli.services.records import RECORD_FORMAT, read_records

    return {rid: a for rid, a in read_records(artifact).items() if a.get("format") == RECORD_FORMAT}


def _claimed_sampler(attrs: Mapping[str, Any]) -> tuple[str, str, str]:
    """(batch sampler, rate, schema) as a record states them, as text: only to pick a record (the
    one picked is then verified before any of its numbers is used)."""
    batching, sampling = attrs.get("batching"), attrs.get("sampling")
    if "batching" not in attrs:
        batching = None if sampling in (None, "null") else "poisson"
    kind = "fixed-order" if batching in (None, "null") else str(batching)
    return kind, repr(sampling), str(attrs.get("participation") or "")


def verified_record(artifact: str | Path, record: str | None = None) -> tuple[str, Any, Any]:
    """The accounting record that :func:`sampler_for` and :func:`held_epsilons` use, verified:
    (id, :class:`mfcli.services.records.RecordCheck`, :class:`~mfcli.services.records.RecordSubject`).

    ``record`` picks one by id; without it the artifact's records must all name the same batch
    sampler, rate and schema (a record without a sampler names the fixed order), and the newest
    is taken. The record is then re-derived from the artifact it sits in by the one verifier of
    every kind (:func:`mfcli.services.records.verify_record`), DEEPLY: MMCC rows at every n (one
    MMCC run: tens of seconds at n = 256, longer above), since a trainer takes its sigma, its
    sampler and its epsilons from it. A record that does not verify, or cannot be re-derived, is
    refused; nothing of it is used.

    Raises:
        MfcliError: no record; records that disagree; an unknown id or a group that is not an
            mfcli.accounting record; a record that does not verify (one line with its first
            problem; ``mfcli inspect`` lists all).
    """
    from mfcli.io.artifact import load_any_artifact
    from mfcli.services.records import RECORD_FORMAT, read_records, subject_of, verify_record

    path = Path(artifact)
    every = read_records(path)
    ours = {rid: a for rid, a in every.items() if a.get("format") == RECORD_FORMAT}
    if record is not None:
        if not isinstance(record, str):
            raise MfcliError(f"record must be an accounting record id (a string), got {record!r}")
        if record not in every:
            raise MfcliError(f"{path} has no accounting record {record!r}; it has {', '.join(ours) or 'none'}")
        if record not in ours:
            raise MfcliError(f"accounting/{record} of {path} is not an mfcli.accounting record (its format "
                             f"attribute is {every[record].get('format')!r}); it cannot be used")
        rid = record
    else:
        if not ours:
            raise MfcliError(f"{path} has no accounting record; write one with mfcli account --write (or plan --out)")
        if len({_claimed_sampler(a) for a in ours.values()}) > 1:
            raise MfcliError(f"the accounting records of {path} name different batch samplers; pick one of "
                             f"{', '.join(ours)} by its id")
        rid = list(ours)[-1]
    subject = subject_of(load_any_artifact(path))
    check = verify_record(ours[rid], subject, deep=True)
    if not check.verified:
        why = check.problems[0] if check.problems else check.status
        raise MfcliError(f"accounting record {rid!r} of {path} does not verify against the artifact it sits in, so "
                         f"it is not used: {why} (mfcli inspect lists every problem)")
    return rid, check, subject


def sampler_record(artifact: str | Path, record: str | None = None) -> tuple[str, dict[str, Any]]:
    """The verified accounting record whose batch sampler :func:`sampler_for` uses: (id, its
    stored attributes), picked and verified by :func:`verified_record`. Its ``sigma`` is the noise
    std on C G to train with, per unit clip norm (the noise added is sigma * clip * row; rows are
    per unit std), NOT the noise multiplier of Opacus and jax_privacy, which is sigma divided by the
    accounted sensitivity (:attr:`mfcli.training.record.TrainingRecord.noise_multiplier`); with the noise stream
    of the operator it accounted (:func:`record_noise_stream`); which of its epsilons hold
    under its sampler: :func:`held_epsilons`.

    Raises:
        MfcliError: as :func:`verified_record`.
    """
    rid, _check, _subject = verified_record(artifact, record)
    return rid, accounting_records(artifact)[rid]


def accounted_operator(record: str, claim: Any) -> AccountedOperator:
    """The :class:`mfcli.training.noise.AccountedOperator` of accounting record ``record``, from its
    claim (a :class:`mfcli.services.records.RecordClaim`, which its caller has verified: its
    ``operator`` and ``strategy_sha256``): the operator whose noise training with it must add. The
    one place a record's operator becomes a stream's (:func:`record_noise_stream`,
    :func:`mfcli.training.record.record_stream`)."""
    return AccountedOperator(label=claim.operator, strategy_sha256=claim.strategy_sha256, record=record)


def record_noise_stream(
    artifact: str | Path,
    record: str | None = None,
    *,
    kind: str,
    d: int,
    seed: int,
    **options: Unpack[StreamOptions],
) -> NoiseStream:
    """The noise stream of the operator an accounting record accounted, after the record is
    verified: :func:`verified_record` re-derives it from the artifact (deeply) and refuses it
    unless it verifies, so its ``sigma`` may be used with this stream; the stream
    (:func:`mfcli.training.noise.noise_stream` with ``accounted=``) is then the operator the record names
    (``operator`` and ``strategy_sha256``), whatever ``auto`` would pick. An explicit ``variant``
    naming another operator is refused. ``record`` picks the record by id (else as
    :func:`verified_record` picks one); ``kind``, ``d``, ``seed`` and the ``options`` (``dtype``,
    ``variant``, ``threads``, ``max_memory``) are :func:`~mfcli.training.noise.noise_stream`'s, with its defaults.

    Raises:
        MfcliError: as :func:`verified_record` and :func:`~mfcli.training.noise.noise_stream`.
    """
    rid, check, _subject = verified_record(artifact, record)
    # the operator named by the claim that was verified, not by a second read of the file
    accounted = accounted_operator(rid, check.claim)
    return noise_stream(artifact, kind=kind, d=d, seed=seed, accounted=accounted, **options)


#: For each batch sampler of a record, the record's settings whose epsilon holds for training the
#: artifact's own operator with the sampler :func:`sampler_for` returns. The other rows of such a
#: record do not: ``dp-sgd`` and ``shuffled-dp-sgd`` are references for C = I (the latter for
#: N = n and replace-one neighbours), and under Poisson sampling ``single-pass`` assumes each
#: example in at most one step, which Poisson sampling does not keep. One exception, checked on
#: the operator itself by :func:`held_epsilons`: when the record's operator is the identity
#: (``mfcli plan``'s DP-SGD), the mechanism *is* DP-SGD and ``dp-sgd`` holds under Poisson
#: sampling. ``fixed-order`` (a record without a batch sampler): every example takes part exactly
#: in the steps its schema allows, so the single-pass (single participation) or deterministic
#: (multi-participation) row holds, and for the binary tree over one epoch the shuffled-tree row
#: (the single-epoch Gaussian bound, which holds for any order of the data).
HELD_SETTINGS: dict[str, tuple[str, ...]] = {
    "poisson": ("mmcc",),
    "cyclic": ("cyclic-poisson",),
    "balls-in-bins": ("single-pass", "balls-in-bins-tree"),
    "shuffle": ("single-pass", "shuffled-tree"),
    "fixed-order": ("single-pass", "deterministic", "shuffled-tree"),
}


def held_epsilons(artifact: str | Path, record: str | None = None) -> tuple[str, dict[str, float]]:
    """(record id, {setting: epsilon}) for the settings of the record :func:`verified_record` picks
    and verifies whose guarantee holds under the sampler :func:`sampler_for` builds from it
    (:data:`HELD_SETTINGS`), at the record's ``sigma`` and ``delta``: the record's own epsilons,
    each at least the one re-derived from the artifact. An empty dict means no row of the record
    holds for this sampler. ``dp-sgd`` holds under Poisson sampling when the record's operator is
    the identity. The neighbouring relation is the sampler's ``neighbouring`` (add-remove, or
    zero-out for the shuffle).

    Raises:
        MfcliError: as :func:`verified_record` (a record that does not verify is refused).
    """
    rid, check, subject = verified_record(artifact, record)
    return rid, held_epsilons_of(check, subject)


def held_epsilons_of(check: Any, subject: Any) -> dict[str, float]:
    """:func:`held_epsilons` of a record :func:`verified_record` has already verified (its check
    and subject), so that a caller holding them does not verify the record again."""
    claim = check.claim
    names = HELD_SETTINGS.get(claim.sampler, ())
    if claim.batching == "poisson" and "dp-sgd" in claim.settings \
            and subject.operators[claim.operator].is_identity:
        names = (*names, "dp-sgd")
    return {name: float(claim.epsilons[name]) for name in names if name in claim.epsilons}


#: The most examples a sampler takes: every sampler holds (or draws, per step) one 8-byte number
#: per example, so above this one step needs more than 8 GB.
MAX_EXAMPLES = 10**9


def check_examples(examples: Any) -> int:
    """A number of examples N: a positive integer up to :data:`MAX_EXAMPLES`."""
    n = positive_int(examples, "the number of examples")
    if n > MAX_EXAMPLES:
        raise MfcliError(f"the number of examples must be at most {MAX_EXAMPLES:,} (every sampler draws one "
                         f"8-byte number per example and step), got {n:,}")
    return n


def sampler_for(artifact: str | Path, *, examples: int, seed: int, record: str | None = None,
                non_adaptive: bool = False) -> BatchSampler:
    """The batch sampler an artifact's accounting record assumes, for ``examples`` examples.

    The record is picked and re-derived from the artifact by :func:`verified_record` (deeply:
    MMCC rows too) and refused unless it verifies. Then its batch sampler, sampling rate and
    participation schema, and the artifact's n (the steps): ``poisson`` -> :class:`PoissonSampler`
    (n steps at the rate); ``cyclic`` -> :class:`CyclicPoissonSampler` with b groups, b the cycle
    length the accounting used (:func:`mfcli.accounting.multi.cycle_length`: the separation of a
    min-sep schema, n / k for k fixed epochs, n for one epoch); ``balls-in-bins`` ->
    :class:`BallsInBinsSampler` and ``shuffle`` -> :class:`ShuffleSampler`, one epoch of n steps;
    no batch sampler (deterministic participation, ``mfcli plan``'s ``fixed-order``) ->
    :class:`FixedOrderSampler` with the period its schema allows (:func:`fixed_order_period`).

    Which of the record's epsilons hold under the returned sampler: :func:`held_epsilons`. The
    Poisson, cyclic, balls-in-bins and fixed-order samplers serve add-remove neighbours (any N);
    the shuffle serves a fixed, public N with zero-out neighbours (its shuffled DP-SGD reference
    row, C = I: N = n and replace-one), as its ``neighbouring`` says.

    The balls-in-bins tree row assumes contributions fixed in advance (non-adaptive), which a
    training loop's gradients are not: a balls-in-bins record is refused unless
    ``non_adaptive=True`` says the contributions are fixed in advance.

    Raises:
        MfcliError: as :func:`verified_record`; more than :data:`MAX_EXAMPLES` examples; a
            balls-in-bins record without ``non_adaptive``; fewer examples than the n steps of a
            shuffle record; a deterministic schema that no fixed order realises.
    """
    from mfcli.model.participation import MinSeparation

    examples = check_examples(examples)
    seed = check_seed(seed, what="sampler seed")
    rid, check, subject = verified_record(artifact, record)
    claim = check.claim
    n, kind = subject.n, claim.sampler
    if kind == "poisson":
        return PoissonSampler(examples=examples, rate=claim.sampling, steps=n, seed=seed)
    if kind == "cyclic":
        from mfcli.accounting.multi import cycle_length

        b = cycle_length(claim.schema, n)
        return CyclicPoissonSampler(examples=examples, groups=b, rate=claim.sampling, steps=n, seed=seed)
    if kind == "balls-in-bins":
        if not non_adaptive:
            raise MfcliError(f"accounting record {rid!r} is for balls-in-bins batches, whose tree row assumes "
                             "contributions fixed in advance (non-adaptive), which training is not; pass "
                             "non_adaptive=True only if your contributions are fixed before the run")
        return BallsInBinsSampler(examples=examples, steps=n, seed=seed)
    if kind == "shuffle":
        if examples < n:
            raise MfcliError(f"accounting record {rid!r} assumes one shuffled epoch of {n} steps; {examples} "
                             "examples cannot fill them")
        return ShuffleSampler(examples=examples, steps=n, seed=seed)
    if kind == "fixed-order":
        period = fixed_order_period(claim.schema, n)
        if period is None:
            cap = claim.schema.max_participations if isinstance(claim.schema, MinSeparation) else None
            raise MfcliError(f"accounting record {rid!r} accounts {claim.schema.describe(n)}, which no fixed order "
                             "of period b realises over these n steps" + (
                                 f" (period {claim.schema.separation} gives ceil(n / b) participations, more "
                                 f"than the cap {cap})" if cap is not None else ""))
        return FixedOrderSampler(examples=examples, period=period, steps=n, seed=seed)
    raise MfcliError(f"accounting record {rid!r} names batch sampler {kind!r}, which mfcli has no sampler for")


__all__ = [
    "HELD_SETTINGS",
    "KINDS",
    "MAX_EXAMPLES",
    "TRAINING_STATE_FORMAT",
    "BallsInBinsSampler",
    "BatchSampler",
    "CyclicPoissonSampler",
    "FixedOrderSampler",
    "PoissonSampler",
    "ShuffleSampler",
    "accounted_operator",
    "accounting_records",
    "check_examples",
    "fixed_order_period",
    "held_epsilons",
    "held_epsilons_of",
    "load_training_state",
    "record_noise_stream",
    "sampler_for",
    "sampler_record",
    "training_state_dict",
    "verified_record",
]
