"""Participation schemas (how often, and when, one example takes part in training) and the L2
sensitivity of a strategy C under each.

A schema says which sets P of steps one example's gradients may occupy (its *participation
patterns*):

* :class:`SingleParticipation`: one step, any step.
* :class:`FixedEpoch` ``(epochs=k)``: n = k b steps in k epochs of b steps; the example takes part
  in steps i, i + b, ..., i + (k - 1) b for one i < b.
* :class:`MinSeparation` ``(separation=b, max_participations=k)``: at most k steps (as many as fit
  when k is None), any two at least b apart.

Adjacent inputs differ in one example: G - G' has rows g_t (one per step, d coordinates each,
||g_t|| <= 1) on some pattern P and zeros elsewhere. With X = C^T C,

    ||C (G - G')||_F^2 = sum_{i, l in P} X_il <g_i, g_l>,

and the sensitivity is the supremum of its square root over the patterns and the rows. Gradients
are d-dimensional, so the supremum is over unit *vectors*, not over signs: for k >= 3 the vector
supremum can exceed every sign vector's value (``X = [[1, -1/2, -1/2], ...]``: signs give 4, three
unit vectors at 120 degrees give 4.5). For one pattern and d >= |P| the exact squared value is the
semidefinite program max <X_P, G> over G PSD with unit diagonal (G_il = <g_i, g_l>). Every result
is an upper bound U valid for every d (sums of |X_il|, and where patterns are enumerated, dual
certificates of that program), together with a witness: unit gradient rows on an explicit
pattern (a pair of adjacent inputs for any d at least their dimension) whose value is a lower
bound. The result is *exact* when the witness attains U to 1e-10; the proofs are in
:func:`sensitivity` and in docs/concepts.md ("Participation and sensitivity").

Example (the prefix sum over 2 epochs of 4 steps: sens^2 = b k (k + 1) (2k + 1) / 6 = 20):
    >>> import numpy as np
    >>> from mfcli.model.participation import FixedEpoch, sensitivity
    >>> s = sensitivity(np.tril(np.ones((8, 8))), FixedEpoch(epochs=2))
    >>> round(s.value ** 2, 9), s.exact
    (20.0, True)
    >>> FixedEpoch(epochs=2).describe(8)
    'fixed-epoch: 2 epochs of 4 steps'
"""
from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import numpy as np

from mfcli.errors import MfcliError
from mfcli.util.validation import step_count

#: The version of the JSON written by ``to_json``; :func:`participation_from_json` reads it.
JSON_VERSION = 1

#: Relative tolerance within which a witness is taken to attain the upper bound (the two are sums
#: of the same entries of X in different orders, so they differ by rounding only).
EXACT_RTOL = 1e-10

#: At most this many min-separation patterns are enumerated to tighten the bound on small n.
ENUMERATION_LIMIT = 200_000

#: At most this many patterns get a semidefinite dual certificate (the ones with the largest
#: cheap bounds first); the rest keep their cheap bound, so the result stays an upper bound.
CERTIFY_LIMIT = 4096

#: Iterations of the vector ascent (generalized power method) per batch of patterns: a rough
#: pass over every candidate pattern, then a full one on those that may hold the maximum.
ROUGH_ITERATIONS = 40
ASCENT_ITERATIONS = 3000

#: The weights lam of the row-wise bound beyond ENUMERATION_LIMIT (:func:`_row_bounds`): each pair
#: of a pattern charged 2 lam to its later step and 2 (1 - lam) to its earlier one; every lam gives
#: a valid bound and the smallest is kept.
SPLIT_WEIGHTS = (0.0, 0.25, 0.75, 1.0)

#: Patterns the branch and bound beyond ENUMERATION_LIMIT bounds before it stops (its bound is
#: valid whenever it stops; about 10 microseconds each).
BRANCH_NODES = 100_000

#: The ascent on the one pattern that the large-n dynamic program picks (a lower bound only:
#: it needs no convergence, and large-n calls stay fast).
WITNESS_ITERATIONS = 300

_EPS = float(np.finfo(np.float64).eps)

#: ``patterns(n)`` lists patterns for tests and brute force only; beyond this n it refuses.
PATTERNS_MAX_N = 24


@dataclass(frozen=True, kw_only=True)
class SingleParticipation:
    """Every example takes part in exactly one step (the default everywhere in mfcli)."""

    kind: ClassVar[str] = "single"

    def participations(self, n: int) -> int:
        """The most steps one example takes part in over n steps: 1."""
        step_count(n)
        return 1

    def spacing(self, n: int) -> int:
        """s = n: the one participation of the earliest pattern {0} (see :func:`cyclic_period`)."""
        return step_count(n)

    def check(self, n: int) -> None:
        """Raise :class:`MfcliError` if the schema does not fit n steps (it always fits)."""
        step_count(n)

    def describe(self, n: int | None = None) -> str:
        """One human line: ``single participation``."""
        return "single participation"

    def to_json(self) -> str:
        """The schema as versioned JSON (the future artifact attribute ``participation``)."""
        return json.dumps({"version": JSON_VERSION, "kind": self.kind}, sort_keys=True)

    def patterns(self, n: int) -> list[tuple[int, ...]]:
        """Every participation pattern over n steps (small n; tests and brute force)."""
        _check_enumerable(n)
        return [(i,) for i in range(n)]


@dataclass(frozen=True, kw_only=True)
class FixedEpoch:
    """k epochs of b = n / k steps: an example takes part in steps i, i + b, ..., i + (k - 1) b."""

    epochs: int
    kind: ClassVar[str] = "fixed-epoch"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epochs", step_count(self.epochs, name="epochs"))

    def steps_per_epoch(self, n: int) -> int:
        """b = n / k; :class:`MfcliError` naming n and epochs if k does not divide n."""
        n = step_count(n)
        if n % self.epochs:
            raise MfcliError(f"the number of steps n = {n} is not divisible by epochs = {self.epochs}")
        return n // self.epochs

    def participations(self, n: int) -> int:
        """The most steps one example takes part in over n steps: k."""
        self.steps_per_epoch(n)
        return self.epochs

    def spacing(self, n: int) -> int:
        """s = n / k: the earliest pattern is {0, s, ..., (k - 1) s} (see :func:`cyclic_period`)."""
        return self.steps_per_epoch(n)

    def check(self, n: int) -> None:
        """Raise :class:`MfcliError` if k does not divide n."""
        self.steps_per_epoch(n)

    def describe(self, n: int | None = None) -> str:
        """One human line, e.g. ``fixed-epoch: 4 epochs of 256 steps``."""
        unit = "epoch" if self.epochs == 1 else "epochs"
        if n is None:
            return f"fixed-epoch: {self.epochs} {unit}"
        b = self.steps_per_epoch(n)
        return f"fixed-epoch: {self.epochs} {unit} of {b} step{'s' if b != 1 else ''}"

    def to_json(self) -> str:
        """The schema as versioned JSON (the future artifact attribute ``participation``)."""
        return json.dumps({"version": JSON_VERSION, "kind": self.kind, "epochs": self.epochs}, sort_keys=True)

    def patterns(self, n: int) -> list[tuple[int, ...]]:
        """Every participation pattern over n steps (small n; tests and brute force)."""
        _check_enumerable(n)
        b = self.steps_per_epoch(n)
        return [tuple(range(i, n, b)) for i in range(b)]


@dataclass(frozen=True, kw_only=True)
class MinSeparation:
    """At most k participations (``None``: as many as fit), any two at least b steps apart."""

    separation: int
    max_participations: int | None = None
    kind: ClassVar[str] = "min-sep"

    def __post_init__(self) -> None:
        object.__setattr__(self, "separation", step_count(self.separation, name="separation"))
        if self.max_participations is not None:
            object.__setattr__(self, "max_participations", step_count(self.max_participations, name="max_participations"))

    def participations(self, n: int) -> int:
        """min(k, ceil(n / b)): the most steps one example can take part in over n steps."""
        self.check(n)
        fit = -(-n // self.separation)
        return fit if self.max_participations is None else min(self.max_participations, fit)

    def spacing(self, n: int) -> int:
        """s = b: the earliest pattern is {0, b, ..., (k - 1) b} (see :func:`cyclic_period`)."""
        self.check(n)
        return self.separation

    def check(self, n: int) -> None:
        """Raise :class:`MfcliError` if the separation b exceeds the number of steps n."""
        n = step_count(n)
        if self.separation > n:
            raise MfcliError(f"separation = {self.separation} exceeds the number of steps n = {n}")

    def describe(self, n: int | None = None) -> str:
        """One human line, e.g. ``min-separation: at most 4 participations, at least 64 steps apart``."""
        apart = f"at least {self.separation} step{'s' if self.separation != 1 else ''} apart"
        if n is not None:
            k = self.participations(n)
            return f"min-separation: at most {k} participation{'s' if k != 1 else ''}, {apart}"
        if self.max_participations is None:
            return f"min-separation: as many participations as fit, {apart}"
        k = self.max_participations
        return f"min-separation: at most {k} participation{'s' if k != 1 else ''}, {apart}"

    def to_json(self) -> str:
        """The schema as versioned JSON (the future artifact attribute ``participation``)."""
        return json.dumps({"version": JSON_VERSION, "kind": self.kind, "separation": self.separation,
                           "max_participations": self.max_participations}, sort_keys=True)

    def patterns(self, n: int) -> list[tuple[int, ...]]:
        """Every non-empty participation pattern over n steps (small n; tests and brute force)."""
        _check_enumerable(n)
        return list(_separated_sets(n, self.separation, self.participations(n)))


#: A participation schema.
Participation = Union[SingleParticipation, FixedEpoch, MinSeparation]  # noqa: UP007 (a runtime alias on 3.10)


def cyclic_period(schema: Participation, n: int) -> int | None:
    """The period s of the cyclic order the schema allows over n steps, or None when it allows none.

    Every schema names its spacing s (``spacing(n)``): its earliest pattern, the one that reaches
    the most participations soonest, is {0, s, ..., (k - 1) s}, k = ``participations(n)``. An
    example that takes part at steps i, i + s, i + 2 s, ... (the fixed-order sampler's cycle, and
    the group of cyclic Poisson sampling) takes part ceil(n / s) times, which the schema allows
    exactly when ceil(n / s) <= k: always for single participation (s = n) and fixed epochs
    (s = n / k); for min-separation b with a cap k, only when the cap does not bind.

    >>> cyclic_period(FixedEpoch(epochs=4), 16), cyclic_period(MinSeparation(separation=3), 10)
    (4, 3)
    >>> cyclic_period(MinSeparation(separation=3, max_participations=2), 10) is None
    True
    """
    s = schema.spacing(n)
    return s if -(-n // s) <= schema.participations(n) else None


def declared_or_requested(declared: Participation, requested: Participation | None, what: str,
                          n: int | None = None) -> Participation:
    """The schema to evaluate a strategy under: ``requested``, or the one it declares when none is
    requested. A request that contradicts a declared multi-participation schema (single
    participation included) is refused: the numbers would describe another training run than the
    one the strategy was made for, and could understate its privacy loss. A strategy that declares
    single participation may be evaluated under any schema (its sensitivity is recomputed for it).
    The one rule for ``account``, ``compare``, ``compress`` and ``inspect``.

    Raises:
        MfcliError: the contradiction, in one line naming ``what`` and both schemas.
    """
    if requested is None or requested == declared or isinstance(declared, SingleParticipation):
        return declared if requested is None else requested
    raise MfcliError(f"{what} declares {declared.describe(n)}; evaluating it under {requested.describe(n)} instead "
                     "is refused (give its own schema or none)")


def participation_from_json(text: str | bytes) -> Participation:
    """The schema written by ``to_json``; :class:`MfcliError` on anything else (unknown version,
    kind or key, or a bad value)."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        raise MfcliError(f"participation is not valid JSON: {text!r}") from None
    if not isinstance(data, dict):
        raise MfcliError(f"participation must be a JSON object, got {text!r}")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version != JSON_VERSION:
        raise MfcliError(f"participation version must be {JSON_VERSION}, got {data.get('version')!r}")
    keys = {"single": set(), "fixed-epoch": {"epochs"}, "min-sep": {"separation", "max_participations"}}
    kind = data.get("kind")
    if kind not in keys:
        raise MfcliError(f"participation kind must be one of {', '.join(keys)}, got {kind!r}")
    extra = set(data) - {"version", "kind"} - keys[kind]
    missing = keys[kind] - set(data)
    if extra or missing:
        expected = sorted(keys[kind] | {"kind", "version"})
        raise MfcliError(f"participation of kind {kind} has keys {sorted(data)}, expected {expected}")
    try:
        if kind == "single":
            return SingleParticipation()
        if kind == "fixed-epoch":
            return FixedEpoch(epochs=data["epochs"])
        return MinSeparation(separation=data["separation"], max_participations=data["max_participations"])
    except TypeError as exc:  # a string or a bool where a count belongs: bad data in a file
        raise MfcliError(f"participation: {exc}") from None


@dataclass(frozen=True, eq=False)
class Witness:
    """An explicit pair of adjacent inputs: unit gradient rows ``gradients`` (|P| x r) at the
    steps ``pattern`` (zeros elsewhere), for gradients with d >= r coordinates (pad with zeros).
    ||C[:, pattern] @ gradients||_F^2 is at least ``Sensitivity.lower`` squared."""

    pattern: tuple[int, ...]
    gradients: np.ndarray


@dataclass(frozen=True, kw_only=True)
class Sensitivity:
    """The L2 sensitivity of a strategy under a participation schema, in units of the clip norm.

    Attributes:
        value: an upper bound on the sensitivity, valid for gradients of any dimension.
        exact: True when ``value`` is attained (``lower`` equals it to 1e-10 relative): by
            gradients with as many coordinates as the witness has columns (any d >= r; r <= 2
            for signs and in the 3-step examples, floor(sqrt(2|P|)) + 2 at most).
        lower: the value of an explicit pair of adjacent inputs (unit gradient vectors on a
            pattern, ``witness``), so the sensitivity lies in [lower, value].
        method: the argument that gave ``value`` and decided ``exact``.
        schema: the participation schema.
        witness: the pair that attains ``lower`` (None where it is not kept, e.g. closed forms).
    """

    value: float
    exact: bool
    lower: float
    method: str
    schema: Participation
    witness: Witness | None = field(default=None, compare=False, repr=False)


def sensitivity(strategy: np.ndarray, schema: Participation) -> Sensitivity:
    """The L2 sensitivity of ``strategy`` (C, m x n) under ``schema``, computed from X = C^T C.

    Notation: P a pattern, |X| the entrywise absolute value, a(P) = sum_{i, l in P} |X_il|,
    SDP(P) = max <X_P, G> over G PSD with diag(G) = 1: the exact squared value of P for gradients
    with d >= |P| coordinates (G is the Gram matrix of the unit rows). The proofs rest on five facts.

    1. *Upper bound.* For unit rows g, sum_{i,l in P} X_il <g_i, g_l> <= a(P), since
       |<g_i, g_l>| <= 1. Any number at least max_P a(P) bounds the squared sensitivity.
    2. *Sign witness.* For a sign vector s on P (one coordinate, d = 1, embeds in any d), s^T X_P s
       is the squared norm of C (G - G') for an actual adjacent pair: a lower bound.
    3. If P's nonzero off-diagonal entries can be signed so that s_i s_l X_il >= 0 for all of
       them (the sign graph is balanced, e.g. X_P >= 0, or X_P diagonal), then s^T X_P s = a(P).
       So when the bound's maximiser is balanced, the bound is attained: exact.
    4. *Vector witness.* For unit rows V (|P| x r), <X_P, V V^T> = ||C_P V||_F^2 is the value of
       an actual adjacent pair with r coordinates: a lower bound (:func:`_vector_ascent` finds V;
       rounding is subtracted, :func:`_rounding_pad`).
    5. *Dual certificate.* For any y and mu <= lambda_min(Diag(y) - X_P), Diag(y - mu) - X_P is
       PSD, so for feasible G, <X_P, G> <= <Diag(y - mu), G> = sum(y) - |P| mu: SDP(P) is at most
       that, whatever y is. mfcli takes y_i = (X_P V V^T)_ii from the ascent (tight at its
       maximiser), mu the computed eigenvalue less an error bound, and adds the rounding bound
       (:func:`_dual_bound`); y = lambda_max(X_P) 1 gives SDP(P) <= |P| lambda_max(X_P). Where the
       patterns are enumerated and signs do not attain max a(P), the bound is the maximum over P
       of min(a(P), |P| lambda_max, certificate) (:func:`_certify`; patterns it leaves out keep
       the bounds they have, so the maximum is a bound whatever the ascent reached).

    Per schema:

    * single: max_j X_jj, the largest column norm squared (``factorization.sensitivity``); exact.
    * fixed-epoch: the b patterns are known, so U = max_j a(P_j) over the b blocks of k x k,
      O(n^2) time, O(n k) extra memory. Exact when a maximising block is balanced (non-negative
      blocks, blocks with zero cross-epoch entries as in the orthogonal strategies of
      Choquette-Choo et al. 2023, every k <= 2). Otherwise the blocks are certified (fact 5) and
      the witness is the best vector witness: exact where the ascent converged.
    * min-sep, X zero beyond the band (X_il = 0 for |i - l| >= b, e.g. C lower-triangular
      banded with at most b bands): on a b-separated pattern the cross terms vanish, so the value
      of P is sum_{i in P} X_ii ||g_i||^2 and the sensitivity squared is the largest sum of at most
      k diagonal entries at b-separated indices: a dynamic program (O(n k)); exact.
    * min-sep otherwise: for each row i, r_i = max over patterns T containing i of sum_{l in T}
      |X_il| (a dynamic program over the steps left of i - b and right of i + b, vectorised over
      rows, O(n^2 k) time, O(n b k) memory; O(n^2) when k is unlimited). For any pattern S,
      a(S) = sum_{i in S} sum_{l in S} |X_il| <= sum_{i in S} r_i, since S itself is one of the
      T containing i; so U = max_S sum_{i in S} r_i (the same dynamic program on r) bounds
      max_S a(S). When at most ``ENUMERATION_LIMIT`` patterns exist, U is tightened to
      max_S a(S) by enumeration and then by certificates as for fixed-epoch. Beyond it the
      witness is the better of signs and a short vector ascent on the dynamic program's pattern.

    Raises:
        MfcliError: C is not a finite 2-D matrix, or the schema does not fit its n columns.
    """
    if not isinstance(schema, (SingleParticipation, FixedEpoch, MinSeparation)):
        raise TypeError(f"schema must be a participation schema, got {type(schema).__name__}")
    c = np.asarray(strategy, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] == 0 or c.shape[0] == 0:
        raise MfcliError(f"the strategy must be a non-empty 2-D matrix, got shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise MfcliError("the strategy has non-finite entries")
    n = c.shape[1]
    schema.check(n)
    if isinstance(schema, SingleParticipation):
        from mfcli.model.factorization import sensitivity as single

        value = single(c)
        j = int(np.argmax(np.sum(c**2, axis=0)))  # the longest column: its step with gradient 1 attains value
        return Sensitivity(value=value, exact=True, lower=value, method="max column norm", schema=schema,
                           witness=Witness(pattern=(j,), gradients=np.ones((1, 1))))
    x = c.T @ c
    x = (x + x.T) / 2  # symmetric to the last bit, so that |X_il| and |X_li| are the same number
    if isinstance(schema, FixedEpoch):
        return _fixed_epoch(x, schema, n, c.shape[0])
    return _min_separation(x, schema, n, c.shape[0])


class _Best:
    """The best explicit pair found so far: its squared value (rounded down) and its witness."""

    def __init__(self) -> None:
        self.value2 = 0.0
        self.witness: Witness | None = None

    def offer(self, value2: float, pattern: Any, gradients: np.ndarray) -> None:
        if value2 > self.value2 or self.witness is None:
            self.value2 = max(value2, 0.0)
            self.witness = Witness(pattern=tuple(int(i) for i in pattern), gradients=np.array(gradients, dtype=np.float64))


def _result(upper2: float, best: _Best, method: str, schema: Participation) -> Sensitivity:
    witness2 = best.value2
    upper2 = max(upper2, witness2)  # never below an explicit pair (they differ by rounding only, if at all)
    exact = witness2 >= upper2 * (1 - EXACT_RTOL)
    suffix = ", attained" if exact else " (upper bound)"
    return Sensitivity(value=math.sqrt(max(upper2, 0.0)), exact=exact, lower=math.sqrt(max(witness2, 0.0)),
                       method=method + suffix, schema=schema, witness=best.witness)


def _fixed_epoch(x: np.ndarray, schema: FixedEpoch, n: int, rows: int) -> Sensitivity:
    k = schema.epochs
    b = n // k
    idx = np.arange(b)
    blocks = x.reshape(k, b, k, b)[:, idx, :, idx]  # (b, k, k): block j is X restricted to P_j
    bounds = np.abs(blocks).sum(axis=(1, 2))
    upper2 = float(bounds.max())
    best = _Best()
    plus = blocks.sum(axis=(1, 2))  # all-plus on every block
    j = int(np.argmax(plus))
    best.offer(float(plus[j]), range(j, n, b), np.ones((k, 1)))
    for j in np.flatnonzero(bounds >= upper2 * (1 - EXACT_RTOL))[:8]:
        value2, signs = _sign_witness(blocks[j])
        best.offer(value2, range(int(j), n, b), signs[:, None])
    shape = f"{b} block{'s' if b != 1 else ''} of {k} x {k}"
    method = f"fixed-epoch: sum of |C^T C| over each epoch-residue block ({shape})"
    if best.value2 < upper2 * (1 - EXACT_RTOL):  # not attained by signs: certify the blocks one by one
        pats = np.arange(b)[:, None] + b * np.arange(k)[None, :]
        upper2 = _certify(x, [pats], [bounds], rows, best)
        method = f"fixed-epoch: semidefinite dual certificate per epoch-residue block ({shape})"
    return _result(upper2, best, method, schema)


def _min_separation(x: np.ndarray, schema: MinSeparation, n: int, rows: int) -> Sensitivity:
    b = schema.separation
    k = schema.participations(n)
    diag = np.diag(x).copy()
    best = _Best()
    j = int(np.argmax(diag))
    best.offer(float(diag[j]), (j,), np.ones((1, 1)))  # one step: a pattern of every min-sep schema
    if not np.any(np.triu(x, b)):
        value2, chosen = _separated_max(diag, b, k)
        if chosen:
            best.offer(float(x[np.ix_(chosen, chosen)].sum()), chosen, np.ones((len(chosen), 1)))
        return _result(value2, best, "min-sep: C^T C is zero beyond the band, sum of separated diagonal entries", schema)
    absx = np.abs(x)
    count = _count_separated(n, b, k)
    if count <= ENUMERATION_LIMIT:
        groups = _pattern_groups(n, b, k)
        sums = [absx[p[:, :, None], p[:, None, :]].sum(axis=(1, 2)) for p in groups]
        upper2 = max(float(s.max()) for s in sums)
        for p, s in zip(groups, sums, strict=True):
            for i in np.flatnonzero(s >= upper2 * (1 - EXACT_RTOL))[:8]:
                value2, signs = _sign_witness(x[np.ix_(p[i], p[i])])
                best.offer(value2, p[i], signs[:, None])
        method = f"min-sep: sum of |C^T C| over each of the {count} patterns"
        if best.value2 < upper2 * (1 - EXACT_RTOL):
            upper2 = _certify(x, groups, sums, rows, best)
            method = f"min-sep: semidefinite dual certificate per pattern ({count} patterns)"
        return _result(upper2, best, method, schema)
    # each split is a valid bound: keep the smallest; the even split's pattern is the witness's start
    upper2, chosen = _separated_max(_row_bounds(absx, b, k), b, k)
    for lam in SPLIT_WEIGHTS:
        upper2 = min(upper2, _separated_max(_row_bounds(absx, b, k, lam), b, k)[0])
    method = "min-sep: row-wise dynamic program over |C^T C|"
    searched, complete, found = _branch_and_bound(absx, b, k, start=chosen)
    if searched < upper2:
        upper2 = searched
        method = ("min-sep: branch and bound over the patterns on |C^T C|" if complete else
                  f"min-sep: branch and bound over the patterns on |C^T C|, stopped after {BRANCH_NODES} patterns")
    if found and found != chosen:
        block = x[np.ix_(found, found)]
        value2, signs = _sign_witness(block)
        best.offer(value2, found, signs[:, None])
    if chosen:
        block = x[np.ix_(chosen, chosen)]
        value2, signs = _sign_witness(block)
        best.offer(value2, chosen, signs[:, None])
        values, vectors = _vector_ascent(block[None], WITNESS_ITERATIONS, start=signs[None])
        best.offer(float(values[0]) - _rounding_pad(block[None], rows, vectors.shape[2])[0], chosen, vectors[0])
    return _result(upper2, best, method, schema)


def _branch_and_bound(absx: np.ndarray, b: int, k: int, start: list[int]) -> tuple[float, bool, list[int]]:
    """An upper bound on max_S a(S) over b-separated patterns S of at most k steps, by a
    depth-first search over the patterns in increasing order of their steps, and (complete) whether
    the search finished, and the best pattern found.

    A node is a pattern S (its last step j); its completions add T, a b-separated set of at most
    k - |S| steps >= j + b. With c_S(l) = sum_{i in S} |X_il| and charging each pair of T to its
    earlier step, a(S + T) = a(S) + sum_{l in T} (2 c_S(l) + |X_ll| + 2 sum_{l' in T, l' > l} |X_ll'|)
    <= a(S) + B_rho(j + b, k - |S|) + 2 (sum of the k - |S| largest c_S(l), l >= j + b), where
    rho_l = |X_ll| + 2 R_l (R_l the row-wise bound on the right, :func:`_left_best`) and
    B_rho(t, c) the largest sum of at most c b-separated rho's at steps >= t (a dynamic program, once).
    A node whose bound is at most the best a(S) found is not expanded. After ``BRANCH_NODES``
    bounded patterns the search stops and the bound is the larger of the best found and every unexpanded node's
    bound: a valid upper bound either way. Sums of non-negative terms, raised by a relative
    (4 n + 16) eps for their rounding."""
    n = absx.shape[0]
    unlimited = k >= -(-n // b)
    kk = -(-n // b) if unlimited else k
    right = _left_best(absx[::-1, ::-1], b, None if unlimited else k)[::-1]
    diag = np.diag(absx)
    rho = diag + 2 * (right if unlimited else right[:, k - 1])
    table = np.zeros((n + b + 1, kk + 1))  # table[t, c]: best sum of <= c separated rho's at steps >= t
    for t in range(n - 1, -1, -1):
        table[t, 1:] = np.maximum(table[t + 1, 1:], rho[t] + table[t + b, :-1])
    best_val = float(absx[np.ix_(start, start)].sum()) if start else float(diag.max())
    best_pat = list(start) if start else [int(np.argmax(diag))]
    # stack entries: (bound, value a(S), c_S, pattern S)
    stack: list[tuple[float, float, np.ndarray, list[int]]] = [(float(table[0, kk]), 0.0, np.zeros(n), [])]
    nodes = 0
    while stack:
        bound, val, cs, pat = stack.pop()
        if bound <= best_val:
            continue
        if nodes > BRANCH_NODES:
            stack.append((bound, val, cs, pat))
            rest = max(e[0] for e in stack)
            return max(best_val, rest) * (1 + (4 * n + 16) * _EPS), False, best_pat
        first = pat[-1] + b if pat else 0
        left = kk - len(pat)
        if first >= n or left <= 0:
            continue
        steps = np.arange(first, n)
        vals = val + 2 * cs[first:] + diag[first:]  # a(S + {l}) for every next step l
        i = int(np.argmax(vals))
        if vals[i] > best_val:
            best_val, best_pat = float(vals[i]), [*pat, int(steps[i])]
        if left == 1:
            continue
        children = []
        nodes += steps.size
        for step, v in zip(steps.tolist(), vals.tolist(), strict=True):
            t = step + b
            if t >= n:
                continue
            c_new = cs + absx[step]
            tail = c_new[t:]
            m = min(left - 1, tail.size)
            top = float(np.partition(tail, tail.size - m)[tail.size - m:].sum()) if m else 0.0
            child_bound = v + float(table[t, left - 1]) + 2 * top
            if child_bound > best_val:
                children.append((child_bound, v, c_new, [*pat, step]))
        children.sort(key=lambda e: e[0])  # the most promising popped first
        stack.extend(children)
    return best_val * (1 + (4 * n + 16) * _EPS), True, best_pat


def _pattern_groups(n: int, b: int, k: int) -> list[np.ndarray]:
    """Every b-separated pattern of at most k steps, as one integer array (count, size) per size,
    each in lexicographic order: the patterns of size s + 1 extend each one of size s by every
    step at least b after its last (vectorised, so that BOUND_ENUMERATION_LIMIT patterns take
    a fraction of a second)."""
    groups = []
    cur = np.arange(n, dtype=np.intp)[:, None]
    while cur.shape[0]:
        groups.append(cur)
        if cur.shape[1] >= k:
            break
        first = cur[:, -1] + b  # the first step each pattern may extend by
        counts = np.maximum(n - first, 0)
        total = int(counts.sum())
        parent = np.repeat(np.arange(cur.shape[0]), counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        cur = np.concatenate([cur[parent], (first[parent] + offsets)[:, None]], axis=1)
    return groups


def _rounding_pad(blocks: np.ndarray, rows: int, rank: int) -> np.ndarray:
    """Per block: a bound on how far a value sum_{i,l} X_il <g_i, g_l> computed here (X = C^T C
    from m = ``rows`` rows in floating point, unit rows g of ``rank`` coordinates normalised in
    floating point) can be from the exact one. Every error term is at most a multiple of
    eps sum_{i,l} ||c_i|| ||c_l|| = eps (sum_i sqrt(X_ii))^2 (|X_il| <= ||c_i|| ||c_l||); the
    multiple, 4 (m + 2 |P| + rank + 16), covers the inner products of length m, the sums of
    |P|^2 terms and the normalisation, with room to spare."""
    size = blocks.shape[1]
    roots = np.sqrt(np.abs(np.diagonal(blocks, axis1=1, axis2=2))).sum(axis=1)
    return 4 * (rows + 2 * size + rank + 16) * _EPS * roots**2


def _eigen_pad(mats: np.ndarray) -> np.ndarray:
    """Per symmetric matrix: a bound on the error of its eigenvalues as computed by LAPACK
    (backward stable: a few |P| eps ||A||_2; 16 |P| eps ||A||_F is generous)."""
    return 16 * mats.shape[1] * _EPS * np.sqrt(np.sum(mats**2, axis=(1, 2)))


def _vector_ascent(blocks: np.ndarray, iterations: int, start: np.ndarray | None = None,
                   vectors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows V (N, p, r), r = min(p, floor(sqrt(2p)) + 2), that (locally) maximise
    <M, V V^T> for each block M (N, p, p) of X, and the values <M, V V^T>.

    The generalized power method: V <- rows of (M - sigma I) V normalised, sigma = the smallest
    eigenvalue of M (clipped at 0), so that M - sigma I is positive semidefinite and the objective
    convex: each step maximises its linearisation, so the value never decreases. The shift
    changes the value by the constant p sigma only. Rank r with r (r + 1) / 2 > p leaves no
    spurious local maxima for generic M (Boumal, Voroninski, Bandeira 2016); the dual
    certificate, not this argument, is what the bounds rest on. Started from ``vectors`` when
    given, else from the top r eigenvectors (``start``, e.g. a sign vector, near the first
    column when given), deterministically. A block stops once its rows are stationary to 1e-13,
    which the dual bound needs (it is first order in their error, the value second order)."""
    count, size, _ = blocks.shape
    if vectors is None:
        rank = min(size, math.isqrt(2 * size) + 2)
        w, u = np.linalg.eigh(blocks)
        v = u[:, :, ::-1][:, :, :rank] * np.sqrt(np.clip(w[:, ::-1][:, :rank], 0.0, None))[:, None, :]
        scale = np.sqrt(np.maximum(np.abs(np.diagonal(blocks, axis1=1, axis2=2)).max(axis=1), 1e-300))
        v = v + 1e-3 * scale[:, None, None] * np.random.default_rng(12345).standard_normal(v.shape)
        if start is not None:
            v *= 1e-6
            v[:, :, 0] += start * scale[:, None]
        v = _unit_rows(v)
        low = w[:, 0]
    else:
        v = vectors.copy()
        low = np.linalg.eigvalsh(blocks)[:, 0]
    shifted = blocks - np.clip(low, 0.0, None)[:, None, None] * np.eye(size)
    active = np.arange(count)
    for it in range(iterations):
        new = _unit_rows(shifted[active] @ v[active])
        if it % 10 == 9:
            moving = np.abs(new - v[active]).max(axis=(1, 2)) > 1e-13
            v[active] = new
            active = active[moving]
            if active.size == 0:
                break
        else:
            v[active] = new
    return np.einsum("nir,nir->n", blocks @ v, v), v


def _unit_rows(v: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    out = np.where(norms > 0, v / np.where(norms > 0, norms, 1.0), 0.0)
    out[..., 0] = np.where(norms[..., 0] > 0, out[..., 0], 1.0)  # a zero row (M's row is zero): any unit vector
    return out


def _dual_bound(blocks: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Per block M: a certified upper bound on max <M, G> over G PSD with unit diagonal.

    Weak duality: for any y and mu <= lambda_min(Diag(y) - M), Diag(y - mu) - M is PSD, so for
    every feasible G, <M, G> <= <Diag(y - mu), G> = sum(y) - p mu. y_i = <(M V)_i, v_i> from
    the ascent (at a maximiser (M V)_i = y_i v_i and the bound is tight); mu is the computed
    smallest eigenvalue less its error bound."""
    size = blocks.shape[1]
    y = np.einsum("nir,nir->ni", blocks @ vectors, vectors)
    a = -blocks.copy()
    a[:, np.arange(size), np.arange(size)] += y
    mu = np.linalg.eigvalsh(a)[:, 0] - _eigen_pad(a)
    total = y.sum(axis=1) + size * _EPS * np.abs(y).sum(axis=1)  # the sum of y, rounded up
    return (total - size * mu) * (1 + 4 * _EPS)


def _certify(x: np.ndarray, groups: list[np.ndarray], bounds: list[np.ndarray], rows: int, best: _Best) -> float:
    """max over the patterns (``groups``: arrays (count, size) of steps, ``bounds`` their a(P)) of
    an upper bound on the pattern's value, each at most a(P); offers the best explicit pair to
    ``best``. Per pattern: e(P) = min(a(P), |P| lambda_max(X_P)) (y = lambda_max 1 is dual
    feasible). Then, in decreasing order of e (at most ``CERTIFY_LIMIT`` patterns): a rough dual
    bound after ``ROUGH_ITERATIONS`` steps of the ascent, and, in decreasing order of that and
    until the next one cannot raise the maximum, the dual bound at convergence. Every pattern
    left out keeps the bound it has, so the maximum is an upper bound whatever converged."""
    blocks = [x[p[:, :, None], p[:, None, :]] for p in groups]
    cheap = []
    for blk, a in zip(blocks, bounds, strict=True):
        top = np.linalg.eigvalsh(blk)[:, -1] + _eigen_pad(blk)
        cheap.append(np.minimum(a, blk.shape[1] * top * (1 + 4 * _EPS) + _rounding_pad(blk, rows, 0)))
    group_of = np.concatenate([np.full(len(e), g) for g, e in enumerate(cheap)])
    index_in = np.concatenate([np.arange(len(e)) for e in cheap])
    every = np.concatenate(cheap)
    order = np.argsort(-every, kind="stable")
    floor = best.value2  # a pattern whose bound is at most a known pair's value cannot raise the maximum
    rough = order[:CERTIFY_LIMIT][every[order[:CERTIFY_LIMIT]] > floor]
    left = float(every[order[CERTIFY_LIMIT]]) if order.size > CERTIFY_LIMIT else 0.0
    starts: dict[int, np.ndarray] = {}
    bound = every.copy()
    for g in np.unique(group_of[rough]):
        mine = rough[group_of[rough] == g]
        blk = blocks[g][index_in[mine]]
        values, vectors = _vector_ascent(blk, ROUGH_ITERATIONS)
        pad = _rounding_pad(blk, rows, vectors.shape[2])
        bound[mine] = np.minimum(every[mine], _dual_bound(blk, vectors) + pad)
        i = int(np.argmax(values - pad))
        best.offer(float(values[i] - pad[i]), groups[g][index_in[mine[i]]], vectors[i])
        starts.update(zip(mine.tolist(), vectors, strict=True))
    rough = rough[np.argsort(-bound[rough], kind="stable")]
    upper2 = max(floor, left)
    done, batch = 0, 4
    while done < rough.size and bound[rough[done]] > upper2:
        take = rough[done:done + batch]
        for g in np.unique(group_of[take]):
            mine = take[group_of[take] == g]
            blk = blocks[g][index_in[mine]]
            values, vectors = _vector_ascent(blk, ASCENT_ITERATIONS, vectors=np.stack([starts[j] for j in mine]))
            pad = _rounding_pad(blk, rows, vectors.shape[2])
            bound[mine] = np.minimum(bound[mine], _dual_bound(blk, vectors) + pad)
            upper2 = max(upper2, float(bound[mine].max()))
            i = int(np.argmax(values - pad))
            best.offer(float(values[i] - pad[i]), groups[g][index_in[mine[i]]], vectors[i])
        done += take.size
        batch *= 2
    if done < rough.size:  # the patterns not converged keep their rough bound
        upper2 = max(upper2, float(bound[rough[done]]))
    return upper2


def _sign_witness(block: np.ndarray) -> tuple[float, np.ndarray]:
    """s^T M s and a sign vector s that makes every significant entry of M non-negative where the
    sign graph allows it (breadth-first search), improved by single flips; a lower bound."""
    m = np.asarray(block)
    size = m.shape[0]
    if size == 0:
        return 0.0, np.zeros(0)
    scale = float(np.abs(m).max())
    strong = np.abs(m) > scale * 1e-13
    signs = np.zeros(size)
    for root in range(size):
        if signs[root]:
            continue
        signs[root] = 1.0
        queue = deque([root])
        while queue:
            i = queue.popleft()
            for j in np.flatnonzero(strong[i] & (signs == 0)):
                signs[j] = signs[i] * (1.0 if m[i, j] >= 0 else -1.0)
                queue.append(int(j))
    for _ in range(min(2 * size, 64)):  # single flips while one improves: each strictly increases s^T M s
        gains = -4 * signs * (m @ signs - np.diag(m) * signs)
        best = int(np.argmax(gains))
        if gains[best] <= scale * 1e-12:
            break
        signs[best] = -signs[best]
    return float(signs @ m @ signs), signs


def _separated_max(values: np.ndarray, b: int, k: int) -> tuple[float, list[int]]:
    """max over sets S of at most k indices, pairwise at least b apart, of sum_{i in S} values_i
    (values >= 0), and a maximising S: O(n k) dynamic program (O(n) when k does not bind)."""
    n = values.shape[0]
    if k >= -(-n // b):  # every b-separated set has at most ceil(n / b) elements: no count limit
        best = np.zeros(n + 1)  # best[i + 1]: indices <= i
        take = np.zeros(n, dtype=bool)
        for i in range(n):
            with_i = values[i] + best[max(i - b + 1, 0)]
            take[i] = with_i > best[i]
            best[i + 1] = with_i if take[i] else best[i]
        chosen, i = [], n - 1
        while i >= 0:
            if take[i]:
                chosen.append(i)
                i -= b
            else:
                i -= 1
        return float(best[n]), sorted(chosen)
    table = np.zeros((n + 1, k + 1))  # table[i + 1, c]: indices <= i, at most c of them
    takes = np.zeros((n, k + 1), dtype=bool)
    for i in range(n):
        with_i = values[i] + table[max(i - b + 1, 0), :-1]
        takes[i, 1:] = with_i > table[i, 1:]
        table[i + 1, 1:] = np.where(takes[i, 1:], with_i, table[i, 1:])
    chosen, i, c = [], n - 1, k
    while i >= 0 and c > 0:
        if takes[i, c]:
            chosen.append(i)
            i -= b
            c -= 1
        else:
            i -= 1
    return float(table[n, k]), sorted(chosen)


def _left_best(a: np.ndarray, b: int, slots: int | None) -> np.ndarray:
    """For every row i: the largest sum of a[i, l] over l <= i - b, the l pairwise at least b
    apart, at most c of them, for c = 0..slots-1 (shape (n, slots)); with ``slots`` None the count
    is unlimited (shape (n,)). The dynamic program runs over the columns for all rows at once."""
    n = a.shape[0]
    width = () if slots is None else (slots,)
    out = np.zeros((n, *width))
    history: deque[np.ndarray] = deque()  # states after columns t - b + 1 .. t, oldest first
    state = np.zeros((n, *width))
    zero = np.zeros((n, *width))
    for t in range(n - b):  # row i = t + b reads the state after column t
        before = history[0] if len(history) == b else zero  # state after column t - b
        col = a[:, t]
        if slots is None:
            state = np.maximum(state, col + before)
        else:
            new = state.copy()
            new[:, 1:] = np.maximum(state[:, 1:], col[:, None] + before[:, :-1])
            state = new
        history.append(state)
        if len(history) > b:
            history.popleft()
        out[t + b] = state[t + b]
    return out


def _row_bounds(absx: np.ndarray, b: int, k: int, lam: float = 0.5) -> np.ndarray:
    """r_i = |X_ii| + max over b-separated patterns T of at most k steps containing i of
    2 lam sum_{l in T, l < i} |X_il| + 2 (1 - lam) sum_{l in T, l > i} |X_il|.

    For every pattern S, a(S) = sum_{i in S} (|X_ii| + 2 lam L_i(S) + 2 (1 - lam) R_i(S)) with
    L_i, R_i the sums over S's steps left and right of i (each unordered pair {i, l} is counted
    2 lam + 2 (1 - lam) = 2 times, once from each end), and S is one of the T containing i, so
    a(S) <= sum_{i in S} r_i for every lam in [0, 1]; lam = 1/2 splits every pair evenly, lam = 1
    charges it to the later step. (The left and right sums are computed once per lam; cheap.)"""
    n = absx.shape[0]
    unlimited = k >= -(-n // b)
    slots = None if unlimited else k  # 0..k-1 further participations on each side
    left = _left_best(absx, b, slots)
    right = _left_best(absx[::-1, ::-1], b, slots)[::-1]
    diag = np.diag(absx)
    if unlimited:
        return diag + 2 * lam * left + 2 * (1 - lam) * right
    # c further steps on the left and k - 1 - c on the right; "at most" makes the split complete
    return diag + np.max(2 * lam * left + 2 * (1 - lam) * right[:, ::-1], axis=1)


def _count_separated(n: int, b: int, k: int) -> int:
    """The number of non-empty sets of at most k indices in [0, n), pairwise at least b apart."""
    ways = [[0] * (k + 1) for _ in range(n + 1)]  # ways[i][c]: sets of exactly c indices < i
    for i in range(n + 1):
        ways[i][0] = 1
    for i in range(1, n + 1):
        for c in range(1, k + 1):
            ways[i][c] = ways[i - 1][c] + ways[max(i - b, 0)][c - 1]
            if ways[i][c] > ENUMERATION_LIMIT:
                return ENUMERATION_LIMIT + 1
    return sum(ways[n][1:])


def _separated_sets(n: int, b: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every non-empty set of at most k indices in [0, n), pairwise at least b apart, in
    lexicographic order."""
    def extend(prefix: tuple[int, ...], start: int) -> Iterator[tuple[int, ...]]:
        for i in range(start, n):
            pattern = (*prefix, i)
            yield pattern
            if len(pattern) < k:
                yield from extend(pattern, i + b)
    yield from extend((), 0)


def _check_enumerable(n: Any) -> None:
    step_count(n)
    if n > PATTERNS_MAX_N:
        raise MfcliError(f"patterns are listed for n <= {PATTERNS_MAX_N} steps only, got n = {n}")


def schema_dict(schema: Participation, n: int | None) -> dict:
    """The schema as it appears in every ``--json`` object (the one representation of a
    participation schema there): its stored JSON fields and one human line, ``describe(n)``
    (``n`` None: the line without the step count)."""
    return {**json.loads(schema.to_json()), "description": schema.describe(n)}


__all__ = [
    "FixedEpoch",
    "MinSeparation",
    "Participation",
    "Sensitivity",
    "SingleParticipation",
    "Witness",
    "cyclic_period",
    "participation_from_json",
    "schema_dict",
    "sensitivity",
]
