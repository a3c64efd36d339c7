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
never shares random bits with a noise stream (:mod:`mfcli.noise`) even when the same seed is
passed to both. The seed is a secret like the noise seed: the amplification assumes nobody but
the trainer knows who was in which batch; draw it with ``secrets.randbits(128)``.

Resuming mirrors :mod:`mfcli.noise`: :meth:`state_dict` is a checkpoint of the next step to draw
(with the sampler's identity and an HMAC tag keyed by the seed), :meth:`load_state_dict` checks it
fits this sampler and returns that step. A step t >= n is refused: drawing batches past the end
means training past what was accounted.

:func:`sampler_for` builds the sampler that an artifact's accounting record (``mfcli account
--write``, ``mfcli plan --out``) names, with its rate, groups and step count.

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
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from mfcli.errors import MfcliError
from mfcli.noise import check_seed
from mfcli.validation import positive_int, regular_file

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
    counter value, as in :mod:`mfcli.noise`."""
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
        object.__setattr__(self, "examples", positive_int(self.examples, "the number of examples"))
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
    step to draw is ``state.t`` for both. ``stream`` is a :class:`mfcli.noise.NoiseStream` and
    ``state`` its :class:`~mfcli.noise.NoiseState` after the last step taken.

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
    participation schema allows over n steps, or None when there is none: n for single
    participation, n / k for k fixed epochs, b for min-separation b (if a cap k on the
    participations is met: ceil(n / b) <= k)."""
    from mfcli.participation import FixedEpoch, MinSeparation, SingleParticipation

    if isinstance(schema, SingleParticipation):
        return n
    if isinstance(schema, FixedEpoch):
        return schema.steps_per_epoch(n)
    if isinstance(schema, MinSeparation):
        cap = schema.max_participations
        b = schema.separation
        return b if cap is None or -(-n // b) <= cap else None
    return None


# ---------------------------------------------------------------------------------------------
# The sampler an accounting record names


def _decode(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v


def accounting_records(artifact: str | Path) -> dict[str, dict[str, Any]]:
    """The ``mfcli.accounting`` records of an artifact: {record id: its attributes}, oldest first
    (ids start with the UTC time of writing). Raises MfcliError for an unreadable file."""
    import h5py

    path = Path(artifact)
    try:
        with h5py.File(regular_file(path, "artifact"), "r") as f:  # a FIFO would block
            grp = f.get("accounting")
            out: dict[str, dict[str, Any]] = {}
            if grp is None or not isinstance(grp, h5py.Group):
                return out
            for rid in sorted(grp):
                rec = grp[rid]
                if not isinstance(rec, h5py.Group):
                    continue
                attrs = {k: _decode(v) for k, v in rec.attrs.items()}
                if attrs.get("format") == "mfcli.accounting":
                    out[rid] = attrs
            return out
    except (OSError, KeyError, ValueError) as exc:
        raise MfcliError(f"{path}: cannot read its accounting records: {exc}") from None


def _sampler_params(attrs: Mapping[str, Any]) -> tuple[str | None, float | None, str]:
    batching = attrs.get("batching")
    batching = None if batching in (None, "null") else str(batching)
    stored = attrs.get("sampling")
    try:
        rate = None if stored in (None, "null") else float(stored)
    except (TypeError, ValueError):
        raise MfcliError(f"accounting record has a malformed sampling rate {stored!r}") from None
    return batching, rate, str(attrs.get("participation") or "")


def _settings(value: Any) -> list[str]:
    """The record's ``settings`` attribute (stored as a JSON list, or an array of names)."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return [value]
        return [str(x) for x in parsed] if isinstance(parsed, list) else [str(parsed)]
    return [str(_decode(x)) for x in np.atleast_1d(value)]


def _fixed_hint(path: Path, attrs: Mapping[str, Any]) -> str:
    """', e.g. FixedOrderSampler(period=b)' for a deterministic record, when its schema has one."""
    try:
        from mfcli.participation import participation_from_json
        from mfcli.structured import load_any_artifact

        period = fixed_order_period(participation_from_json(str(attrs.get("participation"))),
                                    int(load_any_artifact(path).n))
    except MfcliError:
        return ""
    return "" if period is None else f", e.g. FixedOrderSampler(period={period})"


def sampler_record(artifact: str | Path, record: str | None = None) -> tuple[str, dict[str, Any]]:
    """The accounting record whose batch sampler :func:`sampler_for` uses: (id, attributes).

    ``record`` picks one by id; without it the artifact's records that name a batch sampler must all
    name the same one (same sampler, rate and schema), and the newest of them is returned. Its
    ``sigma`` is the noise multiplier to train with (noise rows are per unit sigma and clip norm),
    with the noise stream of the operator it accounted (``noise_stream(..., record=id)``); which of
    its epsilons hold under its sampler: :func:`held_epsilons`.

    Raises:
        MfcliError: no record; none naming a batch sampler (deterministic-participation records:
            any order their schema allows); records that disagree; an unknown ``record``.
    """
    path = Path(artifact)
    records = accounting_records(path)
    if not records:
        raise MfcliError(f"{path} has no accounting record; write one with mfcli account --write (or plan --out)")
    if record is not None:
        if record not in records:
            raise MfcliError(f"{path} has no accounting record {record!r}; it has {', '.join(records)}")
        rid, attrs = record, records[record]
        if _sampler_params(attrs)[0] is None:
            raise MfcliError(f"accounting record {rid!r} of {path} names no batch sampler (it accounts "
                             f"deterministic participation: any order its schema allows{_fixed_hint(path, attrs)})")
        return rid, attrs
    chosen = {rid: a for rid, a in records.items() if _sampler_params(a)[0] is not None}
    if not chosen:
        last = records[list(records)[-1]]
        raise MfcliError(f"no accounting record of {path} names a batch sampler (they account deterministic "
                         f"participation: any order its schema allows{_fixed_hint(path, last)})")
    if len({_sampler_params(a) for a in chosen.values()}) > 1:
        raise MfcliError(f"the accounting records of {path} name different batch samplers; pick one of "
                         f"{', '.join(chosen)} by its id")
    rid = list(chosen)[-1]
    return rid, chosen[rid]


#: For each batch sampler of a record, the record's settings whose epsilon holds for training the
#: artifact's own operator with the sampler :func:`sampler_for` returns. The other rows of such a
#: record do not: ``dp-sgd`` and ``shuffled-dp-sgd`` are references for C = I (the latter for
#: N = n and replace-one neighbours), and under Poisson sampling ``single-pass`` assumes each
#: example in at most one step, which Poisson sampling does not keep. One exception, checked on
#: the operator itself by :func:`held_epsilons`: when the artifact's C is the identity (``mfcli
#: plan``'s DP-SGD), the mechanism *is* DP-SGD and ``dp-sgd`` holds under Poisson sampling.
HELD_SETTINGS: dict[str, tuple[str, ...]] = {
    "poisson": ("mmcc",),
    "cyclic": ("cyclic-poisson",),
    "balls-in-bins": ("single-pass", "balls-in-bins-tree"),
    "shuffle": ("single-pass", "shuffled-tree"),
}


def _identity_strategy(artifact: str | Path) -> bool:
    """Whether the artifact's strategy C is exactly the identity (dense: C == I entry by entry;
    structured: a banded Toeplitz C with the one coefficient 1), so that its mechanism is DP-SGD."""
    from mfcli.structured import load_any_artifact
    from mfcli.toeplitz import BandedToeplitz

    art = load_any_artifact(Path(artifact))
    strategy = getattr(art, "strategy", None)
    if isinstance(strategy, BandedToeplitz):
        return strategy.coefs.size == 1 and float(strategy.coefs[0]) == 1.0
    fact = getattr(art, "factorization", None)
    if fact is None:
        return False
    c = np.asarray(fact.strategy)
    return c.shape == (art.n, art.n) and bool(np.array_equal(c, np.eye(art.n)))


def held_epsilons(artifact: str | Path, record: str | None = None) -> tuple[str, dict[str, float]]:
    """(record id, {setting: epsilon}) for the settings of the record :func:`sampler_record` picks
    whose guarantee holds under the sampler :func:`sampler_for` builds from it
    (:data:`HELD_SETTINGS`), at the record's ``sigma`` and ``delta``. Settings the record did not
    compute, or whose epsilon it stores as null (not run), are left out; an empty dict means no
    row of the record holds for this sampler. ``dp-sgd`` holds under Poisson sampling when the
    artifact's C is the identity (checked on the stored operator). The neighbouring relation is the sampler's
    ``neighbouring`` (add-remove, or zero-out for the shuffle)."""
    rid, attrs = sampler_record(artifact, record)
    batching = _sampler_params(attrs)[0]
    out: dict[str, float] = {}
    present = set(_settings(attrs.get("settings")))
    names = HELD_SETTINGS.get(str(batching), ())
    if batching == "poisson" and "dp-sgd" in present and _identity_strategy(artifact):
        names = (*names, "dp-sgd")
    for name in names:
        v = attrs.get(f"epsilon_{name.replace('-', '_')}")
        if name in present and v not in (None, "null"):
            out[name] = float(v)
    return rid, out


def sampler_for(artifact: str | Path, *, examples: int, seed: int, record: str | None = None,
                non_adaptive: bool = False) -> BatchSampler:
    """The batch sampler an artifact's accounting record assumes, for ``examples`` examples.

    Reads the record (:func:`sampler_record`): its batch sampler (``batching``), sampling rate,
    participation schema, and the artifact's n (the steps): ``poisson`` -> :class:`PoissonSampler`
    (n steps at the rate); ``cyclic`` -> :class:`CyclicPoissonSampler` with b groups, b the cycle
    length the accounting used (:func:`mfcli.accounting.multi.cycle_length`: the separation of a
    min-sep schema, n / k for k fixed epochs, n for one epoch); ``balls-in-bins`` ->
    :class:`BallsInBinsSampler` and ``shuffle`` -> :class:`ShuffleSampler`, one epoch of n steps.

    Which of the record's epsilons hold under the returned sampler: :func:`held_epsilons`. The
    Poisson, cyclic and balls-in-bins samplers serve add-remove neighbours (any N); the shuffle
    serves a fixed, public N with zero-out neighbours (its shuffled DP-SGD reference row, C = I:
    N = n and replace-one), as its ``neighbouring`` says.

    The balls-in-bins tree row assumes contributions fixed in advance (non-adaptive), which a
    training loop's gradients are not: a balls-in-bins record is refused unless
    ``non_adaptive=True`` says the contributions are fixed in advance.

    The record's numbers are read, not re-verified: ``mfcli inspect`` verifies them against the
    operator.

    Raises:
        MfcliError: as :func:`sampler_record`; a balls-in-bins record without ``non_adaptive``;
            fewer examples than the n steps of a shuffle record.
    """
    from mfcli.participation import participation_from_json
    from mfcli.structured import load_any_artifact

    examples = positive_int(examples, "the number of examples")
    path = Path(artifact)
    rid, attrs = sampler_record(path, record)
    batching, rate, participation = _sampler_params(attrs)
    art = load_any_artifact(path)
    n = int(art.n)
    if batching in ("poisson", "cyclic") and rate is None:
        raise MfcliError(f"accounting record {rid!r} names the {batching} batch sampler but stores no sampling rate")
    if batching == "poisson":
        assert rate is not None
        return PoissonSampler(examples=examples, rate=rate, steps=n, seed=seed)
    if batching == "cyclic":
        from mfcli.accounting.multi import cycle_length

        assert rate is not None
        b = cycle_length(participation_from_json(participation), n)
        return CyclicPoissonSampler(examples=examples, groups=b, rate=rate, steps=n, seed=seed)
    if batching == "balls-in-bins":
        if not non_adaptive:
            raise MfcliError(f"accounting record {rid!r} is for balls-in-bins batches, whose tree row assumes "
                             "contributions fixed in advance (non-adaptive), which training is not; pass "
                             "non_adaptive=True only if your contributions are fixed before the run")
        return BallsInBinsSampler(examples=examples, steps=n, seed=seed)
    if batching == "shuffle":
        if examples < n:
            raise MfcliError(f"accounting record {rid!r} assumes one shuffled epoch of {n} steps; {examples} "
                             "examples cannot fill them")
        return ShuffleSampler(examples=examples, steps=n, seed=seed)
    raise MfcliError(f"accounting record {rid!r} names batch sampler {batching!r}, which mfcli has no sampler for")


__all__ = [
    "HELD_SETTINGS",
    "KINDS",
    "TRAINING_STATE_FORMAT",
    "BallsInBinsSampler",
    "BatchSampler",
    "CyclicPoissonSampler",
    "FixedOrderSampler",
    "PoissonSampler",
    "ShuffleSampler",
    "accounting_records",
    "fixed_order_period",
    "held_epsilons",
    "load_training_state",
    "sampler_for",
    "sampler_record",
    "training_state_dict",
]
