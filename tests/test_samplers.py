"""Batch samplers (mfcli.training.samplers) against the definitions the accounting uses.

Statistical checks use fixed seeds and two-sided binomial acceptance regions whose total failure
probability (Bonferroni over every count checked in a test) is at most 1e-6 for a correct
sampler, so a pass is not luck and a failure is a bug. The record round trip writes real
accounting records with ``mfcli account --write`` (CliRunner) on tiny artifacts."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom
from training_cases import prefix_artifact
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.io.artifact import save_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation
from mfcli.strategies.baselines import tree_decoder, tree_strategy_matrix
from mfcli.training.samplers import (
    HELD_SETTINGS,
    BallsInBinsSampler,
    BatchSampler,
    CyclicPoissonSampler,
    FixedOrderSampler,
    PoissonSampler,
    ShuffleSampler,
    accounting_records,
    fixed_order_period,
    held_epsilons,
    load_training_state,
    sampler_for,
    training_state_dict,
)

FAIL = 1e-6


def binomial_region(trials: np.ndarray | int, p: float, checks: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] with P(X < lo) + P(X > hi) <= FAIL / checks for X ~ Bin(trials, p)."""
    a = FAIL / checks / 2
    return binom.ppf(a, trials, p), binom.isf(a, trials, p)


def assert_binomial(counts: np.ndarray, trials: np.ndarray | int, p: float, checks: int | None = None) -> None:
    counts = np.atleast_1d(counts)
    lo, hi = binomial_region(trials, p, checks or counts.size)
    bad = np.flatnonzero((counts < lo) | (counts > hi))
    assert bad.size == 0, f"counts {counts[bad][:5]} outside [{np.atleast_1d(lo)[0]}, {np.atleast_1d(hi)[0]}]"


def membership(sampler: BatchSampler) -> np.ndarray:
    """steps x examples 0/1 matrix of who is in which batch."""
    m = np.zeros((sampler.steps, sampler.examples), dtype=np.int64)
    for t, b in enumerate(sampler):
        assert b.dtype == np.int64 and np.all(np.diff(b) > 0)   # sorted, no repeats
        m[t, b] = 1
    return m


# ---------------------------------------------------------------------------------------------
# distributions


def test_poisson_participation_counts() -> None:
    n_ex, steps, p = 300, 60, 0.1
    m = membership(PoissonSampler(examples=n_ex, rate=p, steps=steps, seed=11))
    # every example's count over the steps, every step's batch size, and the grand total
    assert_binomial(m.sum(axis=0), steps, p, checks=n_ex + steps + 1)
    assert_binomial(m.sum(axis=1), n_ex, p, checks=n_ex + steps + 1)
    assert_binomial(m.sum(), n_ex * steps, p, checks=n_ex + steps + 1)
    assert PoissonSampler(examples=n_ex, rate=p, steps=steps, seed=11).expected_batch_size(3) == pytest.approx(30)


def test_poisson_pairs_are_independent() -> None:
    """Two fixed examples are together in a batch with probability p^2 (independent inclusion)."""
    n_ex, steps, p = 40, 400, 0.3
    m = membership(PoissonSampler(examples=n_ex, rate=p, steps=steps, seed=5))
    both = (m[:, 0] & m[:, 1]).sum() + (m[:, 2] & m[:, 3]).sum()
    assert_binomial(both, 2 * steps, p * p, checks=1)


@pytest.mark.parametrize("n_ex, b, p, steps", [(103, 4, 0.3, 40), (9, 9, 0.5, 45), (50, 1, 0.2, 30)],
                         ids=["ragged", "one-each", "one-group"])
def test_cyclic_groups_and_counts(n_ex: int, b: int, p: float, steps: int) -> None:
    s = CyclicPoissonSampler(examples=n_ex, groups=b, rate=p, steps=steps, seed=3)
    group = s.group_of()
    # a partition: every example in exactly one group, group sizes Bin(N, 1/b) (independent uniform groups)
    sizes = np.bincount(group, minlength=b)
    assert sizes.sum() == n_ex and np.all((0 <= group) & (group < b))
    assert all(np.array_equal(s.group(g), np.flatnonzero(group == g)) for g in range(b))
    m = membership(s)
    rows, cols = np.nonzero(m)
    assert np.all(rows % b == group[cols])       # only at steps congruent to the example's group
    per_group_steps = np.array([len(range(g, steps, b)) for g in range(b)])
    checks = n_ex + 2 * b
    assert_binomial(sizes, n_ex, 1 / b, checks=checks)
    assert_binomial(m.sum(axis=0), per_group_steps[group], p, checks=checks)
    sums = np.array([m[g::b].sum() for g in range(b)])
    assert_binomial(sums, sizes * per_group_steps, p, checks=checks)
    # E|batch(t)| = N p / b: over the groups (uniform) and the draws, a constant
    assert [s.expected_batch_size(t) for t in range(steps)] == pytest.approx([n_ex * p / b] * steps)


def test_cyclic_rate_one_is_the_whole_group() -> None:
    s = CyclicPoissonSampler(examples=10, groups=3, rate=1.0, steps=7, seed=2)
    for t in range(7):
        assert np.array_equal(s.batch(t), s.group(t % 3))


@pytest.mark.parametrize("make, of, k", [
    (lambda seed: CyclicPoissonSampler(examples=5, groups=3, rate=0.5, steps=3, seed=seed).group_of(), "group", 3),
    (lambda seed: FixedOrderSampler(examples=5, period=3, steps=6, seed=seed).slot_of(), "slot", 3),
], ids=["cyclic-group", "fixed-order-slot"])
def test_group_and_slot_are_uniform_and_independent_over_seeds(make, of: str, k: int) -> None:
    """Over seeds, example 0's group (slot) is uniform over the k values, and the pair (example 0,
    example 1) is uniform over the k^2 pairs: independent uniform draws per example."""
    seeds = 3000
    draws = np.array([make(s)[:2] for s in range(seeds)])
    assert_binomial(np.bincount(draws[:, 0], minlength=k), seeds, 1 / k, checks=k + k * k)
    pairs = np.bincount(draws[:, 0] * k + draws[:, 1], minlength=k * k)
    assert_binomial(pairs, seeds, 1 / (k * k), checks=k + k * k)


def test_balls_in_bins_one_uniform_step_each() -> None:
    n_ex, steps = 500, 20
    s = BallsInBinsSampler(examples=n_ex, steps=steps, seed=4)
    m = membership(s)
    assert np.all(m.sum(axis=0) == 1)            # every example in exactly one step
    assert np.array_equal(np.argmax(m, axis=0), s.step_of())
    assert_binomial(m.sum(axis=1), n_ex, 1 / steps)
    assert s.expected_batch_size(0) == n_ex / steps
    # the step of example 0 over many seeds is uniform: the count in each step is Bin(seeds, 1/steps)
    seeds, k = 2000, 4
    firsts = np.bincount([BallsInBinsSampler(examples=3, steps=k, seed=s).step_of()[0] for s in range(seeds)],
                         minlength=k)
    assert_binomial(firsts, seeds, 1 / k)


@pytest.mark.parametrize("n_ex, steps", [(16, 16), (23, 5)], ids=["batch-1", "ragged"])
def test_shuffle_one_epoch(n_ex: int, steps: int) -> None:
    s = ShuffleSampler(examples=n_ex, steps=steps, seed=9)
    m = membership(s)
    assert np.all(m.sum(axis=0) == 1)
    assert list(m.sum(axis=1)) == [len(g) for g in np.array_split(np.arange(n_ex), steps)]
    assert [s.expected_batch_size(t) for t in range(steps)] == list(m.sum(axis=1))


def test_shuffle_position_is_uniform_over_seeds() -> None:
    seeds, k = 1000, 4
    firsts = np.bincount([int(np.argmax(membership(ShuffleSampler(examples=k, steps=k, seed=s))[:, 0]))
                          for s in range(seeds)], minlength=k)
    assert_binomial(firsts, seeds, 1 / k)


@pytest.mark.parametrize("schema, n, period", [
    (SingleParticipation(), 6, 6),
    (FixedEpoch(epochs=3), 6, 2),
    (MinSeparation(separation=4), 9, 4),
    (MinSeparation(separation=2, max_participations=3), 6, 2),
    (MinSeparation(separation=2, max_participations=2), 6, None),   # 3 participations would exceed the cap
], ids=["single", "fixed-epoch", "min-sep", "min-sep-cap", "cap-too-small"])
def test_fixed_order_follows_the_schema(schema, n: int, period: int | None) -> None:
    assert fixed_order_period(schema, n) == period
    if period is None:
        return
    s = FixedOrderSampler(examples=11, period=period, steps=n, seed=6)
    m = membership(s)
    allowed = set(schema.patterns(n))   # from the schema's own definition
    for e in range(11):
        assert tuple(np.flatnonzero(m[:, e])) in allowed
    assert np.array_equal(np.flatnonzero(m[:, 0]) % period, [s.slot_of()[0]] * int(m[:, 0].sum()))
    assert [s.expected_batch_size(t) for t in range(n)] == pytest.approx([11 / period] * n)


@settings(max_examples=40, deadline=None)
@given(n_ex=st.integers(1, 40), b=st.integers(1, 40), steps=st.integers(1, 30), seed=st.integers(0, 2**128 - 1),
       rate=st.floats(0.01, 1.0))
def test_structure_for_any_sizes(n_ex: int, b: int, steps: int, seed: int, rate: float) -> None:
    """Who can be in which batch, for any sizes: cyclic members only at their group's steps, a
    shuffled or balls-in-bins epoch uses every example exactly once, a fixed order repeats with
    its period; batches are sorted indices in range."""
    cyc = CyclicPoissonSampler(examples=n_ex, groups=b, rate=rate, steps=steps, seed=seed)
    group = cyc.group_of()
    assert group.shape == (n_ex,) and np.all((0 <= group) & (group < b))
    rows, cols = np.nonzero(membership(cyc))
    assert np.all(rows % b == group[cols])
    assert np.all(membership(BallsInBinsSampler(examples=n_ex, steps=steps, seed=seed)).sum(axis=0) == 1)
    if n_ex >= steps:
        assert np.all(membership(ShuffleSampler(examples=n_ex, steps=steps, seed=seed)).sum(axis=0) == 1)
    fixed = membership(FixedOrderSampler(examples=n_ex, period=b, steps=steps, seed=seed))
    if steps > b:
        assert np.array_equal(fixed[b:], fixed[:-b])
    if steps >= b:
        assert np.all(fixed[:b].sum(axis=0) == 1)   # one cycle uses every example once


# ---------------------------------------------------------------------------------------------
# neighbouring datasets

#: Every sampler, built for N examples at one seed (rate 1 where a rate exists would hide the draws).
BUILD = {
    "poisson": lambda n_ex, seed: PoissonSampler(examples=n_ex, rate=0.3, steps=9, seed=seed),
    "cyclic": lambda n_ex, seed: CyclicPoissonSampler(examples=n_ex, groups=4, rate=0.5, steps=9, seed=seed),
    "balls-in-bins": lambda n_ex, seed: BallsInBinsSampler(examples=n_ex, steps=9, seed=seed),
    "shuffle": lambda n_ex, seed: ShuffleSampler(examples=n_ex, steps=9, seed=seed),
    "fixed-order": lambda n_ex, seed: FixedOrderSampler(examples=n_ex, period=3, steps=9, seed=seed),
}
CLAIMS = {"poisson": "add-remove", "cyclic": "add-remove", "balls-in-bins": "add-remove", "shuffle": "zero-out",
          "fixed-order": "add-remove"}


@pytest.mark.parametrize("kind", list(BUILD))
def test_adding_one_example_moves_nobody_else(kind: str) -> None:
    """The reviewer's neighbouring pair as a deterministic check: D has N examples, D + x has x as
    example N. A sampler that claims add-remove must give every other example exactly the same
    steps in both (then x's own randomness is the only difference, the mixture argument of
    docs/samplers.md). A sampler that does not (the shuffle: a permutation of N) must say so, and
    the test shows that its claim is needed: there the others do move."""
    s0 = BUILD[kind](10, 1)
    assert s0.neighbouring == CLAIMS[kind]
    moved = False
    for n_ex in (1, 9, 10, 37, 200):
        for seed in (1, 2**127 + 5):
            if kind == "shuffle" and n_ex < 9:
                continue
            d, dx = BUILD[kind](n_ex, seed), BUILD[kind](n_ex + 1, seed)
            for t in range(d.steps):
                with_x = dx.batch(t)
                others = with_x[with_x != n_ex]
                same = np.array_equal(others, d.batch(t))
                if s0.neighbouring == "add-remove":
                    assert same, f"{kind}: step {t} of N = {n_ex} changes when example {n_ex} is added"
                moved |= not same
    assert moved == (s0.neighbouring != "add-remove")


@settings(max_examples=30, deadline=None)
@given(n_ex=st.integers(1, 60), extra=st.integers(1, 5), seed=st.integers(0, 2**128 - 1), kind=st.sampled_from(
    [k for k, v in CLAIMS.items() if v == "add-remove"]))
def test_add_remove_coupling_for_any_sizes(n_ex: int, extra: int, seed: int, kind: str) -> None:
    """Adding several examples at once leaves the first N examples' batches unchanged, for any N."""
    d, dx = BUILD[kind](n_ex, seed), BUILD[kind](n_ex + extra, seed)
    for t in range(d.steps):
        b = dx.batch(t)
        assert np.array_equal(b[b < n_ex], d.batch(t))


# ---------------------------------------------------------------------------------------------
# determinism, random access, resume


SAMPLERS = [
    lambda seed: PoissonSampler(examples=50, rate=0.2, steps=12, seed=seed),
    lambda seed: CyclicPoissonSampler(examples=50, groups=3, rate=0.4, steps=12, seed=seed),
    lambda seed: BallsInBinsSampler(examples=50, steps=12, seed=seed),
    lambda seed: ShuffleSampler(examples=50, steps=12, seed=seed),
    lambda seed: FixedOrderSampler(examples=50, period=5, steps=12, seed=seed),
]


@pytest.mark.parametrize("make", SAMPLERS, ids=["poisson", "cyclic", "balls-in-bins", "shuffle", "fixed-order"])
def test_deterministic_random_access_and_resume(make) -> None:
    a, b, other = make(2**127 + 1), make(2**127 + 1), make(2)
    assert isinstance(a, BatchSampler)
    run = [x.tolist() for x in a]
    assert run == [x.tolist() for x in b] == [a.batch(t).tolist() for t in range(a.steps)]
    assert run != [x.tolist() for x in other]
    assert [x.tolist() for x in a.batches(5)] == run[5:]
    sd = a.state_dict(7)
    assert b.load_state_dict(sd) == 7 and [x.tolist() for x in b.batches(b.load_state_dict(sd))] == run[7:]
    assert a.load_state_dict(a.state_dict(a.steps)) == a.steps and list(a.batches(a.steps)) == []
    with pytest.raises(MfcliError, match="authentication tag"):
        a.load_state_dict({**sd, "step": 3})
    with pytest.raises(MfcliError, match="different seed"):
        other.load_state_dict(sd)
    with pytest.raises(MfcliError, match="does not fit this sampler"):
        (SAMPLERS[0] if a.kind != "poisson" else SAMPLERS[1])(2**127 + 1).load_state_dict(sd)
    with pytest.raises(MfcliError, match="not an mfcli sampler checkpoint"):
        a.load_state_dict({"format": "mfcli.noise_state"})
    with pytest.raises(MfcliError, match=r"step must be an integer in \[0, 11\]"):
        a.batch(a.steps)                          # past the accounted steps


def test_sampler_bits_are_not_the_noise_bits() -> None:
    """Same seed for noise and sampler: the sampler does not draw from the Philox stream (key = seed,
    counter (0, 0, 0, 0)) that noise row 0 is drawn from (mfcli.training.noise), which would correlate them."""
    seed = 123
    naive = np.flatnonzero(np.random.Generator(np.random.Philox(key=seed, counter=[0, 0, 0, 0])).random(64) < 0.5)
    got = PoissonSampler(examples=64, rate=0.5, steps=1, seed=seed).batch(0)
    assert not np.array_equal(got, naive)


@pytest.mark.parametrize("make, msg", [
    (lambda: PoissonSampler(examples=10, rate=0.0, steps=3, seed=1), r"rate must be in \(0, 1\]"),
    (lambda: PoissonSampler(examples=10, rate=1.5, steps=3, seed=1), r"rate must be in \(0, 1\]"),
    (lambda: PoissonSampler(examples=10, rate=math.nan, steps=3, seed=1), r"rate must be in \(0, 1\]"),
    (lambda: PoissonSampler(examples=10, rate=True, steps=3, seed=1), "rate must be a number"),
    (lambda: PoissonSampler(examples=0, rate=0.1, steps=3, seed=1), "number of examples must be a positive"),
    (lambda: PoissonSampler(examples=10, rate=0.1, steps=2.0, seed=1), "number of steps must be a positive"),
    (lambda: PoissonSampler(examples=10, rate=0.1, steps=3, seed=-1), r"seed must be an integer in \[0, 2\^128\)"),
    (lambda: PoissonSampler(examples=10, rate=0.1, steps=3, seed=2**128), r"seed must be an integer"),
    (lambda: CyclicPoissonSampler(examples=3, groups=0, rate=0.1, steps=3, seed=1), "number of groups"),
    (lambda: ShuffleSampler(examples=3, steps=4, seed=1), "needs at least 4 examples"),
    (lambda: FixedOrderSampler(examples=3, period=0, steps=8, seed=1), "the period"),
    (lambda: PoissonSampler(examples=10, rate=0.1, steps=3, seed=1).batch(-1), "step must be an integer"),
    (lambda: CyclicPoissonSampler(examples=10, groups=2, rate=0.1, steps=3, seed=1).group(2), "group must be"),
])
def test_bad_input(make, msg: str) -> None:
    with pytest.raises(MfcliError, match=msg):
        make()


# ---------------------------------------------------------------------------------------------
# the sampler an accounting record names

runner = CliRunner()


def _account(*args: str) -> None:
    r = runner.invoke(app, ["account", *args, "--write", "-q"])
    assert r.exit_code == 0, r.output


@pytest.fixture(scope="module")
def banded6(tmp_path_factory) -> Path:
    """A 2-banded C at n = 6 with a cyclic record (3 groups, rate 0.25) and a Poisson one (0.1)."""
    c = np.eye(6) + 0.5 * np.eye(6, k=-1)
    path = prefix_artifact(tmp_path_factory.mktemp("samplers") / "banded6.h5", c, "banded2")
    _account(str(path), "--sigma", "2", "--sampling", "0.25", "--batching", "cyclic", "--min-sep", "3")
    _account(str(path), "--sigma", "2", "--sampling", "0.1", "--value-discretization", "1e-2")  # coarse: fast, still a bound
    return path


def _record_of(path: Path, batching: str) -> str:
    return next(rid for rid, a in accounting_records(path).items() if a["batching"] == batching)


def test_record_round_trip_cyclic_and_poisson(banded6: Path) -> None:
    with pytest.raises(MfcliError, match="name different batch samplers; pick one of"):
        sampler_for(banded6, examples=100, seed=1)
    cyc = sampler_for(banded6, examples=100, seed=1, record=_record_of(banded6, "cyclic"))
    assert isinstance(cyc, CyclicPoissonSampler)
    assert cyc.describe() == {"kind": "cyclic", "examples": 100, "steps": 6, "groups": 3, "rate": 0.25}
    poi = sampler_for(banded6, examples=100, seed=1, record=_record_of(banded6, "poisson"))
    assert isinstance(poi, PoissonSampler)
    assert poi.describe() == {"kind": "poisson", "examples": 100, "steps": 6, "rate": 0.1}
    # fewer examples than groups is a setting like any other (groups are independent per example)
    assert sampler_for(banded6, examples=2, seed=1, record=_record_of(banded6, "cyclic")).groups == 3
    with pytest.raises(MfcliError, match="has no accounting record 'nope'"):
        sampler_for(banded6, examples=100, seed=1, record="nope")


def test_record_round_trip_tree_batchings(tmp_path: Path) -> None:
    n = 8
    path = tmp_path / "tree8.h5"
    fact = Factorization(workload=np.tril(np.ones((n, n))), strategy=tree_strategy_matrix(n), decoder=tree_decoder(n),
                         causal=True)
    save_artifact(path, fact, workload_name="prefix", strategy_name="tree")
    _account(str(path), "--sigma", "3", "--batching", "shuffle")
    s = sampler_for(path, examples=8, seed=4)      # the only record: no id needed
    assert isinstance(s, ShuffleSampler) and s.steps == 8 and all(len(b) == 1 for b in s)
    assert s.neighbouring == "zero-out"
    # the C = I shuffled DP-SGD reference row does not constrain the tree's sampler: N >= n
    big = sampler_for(path, examples=80, seed=4)
    assert isinstance(big, ShuffleSampler) and sorted(len(b) for b in big) == [10] * 8
    with pytest.raises(MfcliError, match="7 examples cannot fill them"):
        sampler_for(path, examples=7, seed=4)
    rid, held = held_epsilons(path)
    rec = accounting_records(path)[rid]
    assert held == {"single-pass": rec["epsilon_single_pass"], "shuffled-tree": rec["epsilon_shuffled_tree"]}
    _account(str(path), "--sigma", "2", "--batching", "balls-in-bins")
    rid = _record_of(path, "balls-in-bins")
    with pytest.raises(MfcliError, match=r"assumes contributions fixed in advance \(non-adaptive\).*non_adaptive=True"):
        sampler_for(path, examples=30, seed=4, record=rid)
    bib = sampler_for(path, examples=30, seed=4, record=rid, non_adaptive=True)
    assert isinstance(bib, BallsInBinsSampler) and bib.describe() == {"kind": "balls-in-bins", "examples": 30,
                                                                      "steps": 8}
    assert set(held_epsilons(path, rid)[1]) == {"single-pass", "balls-in-bins-tree"}


def test_held_epsilons_name_the_rows_each_sampler_serves(banded6: Path) -> None:
    """Poisson: only MMCC (single pass assumes one step per example, DP-SGD is the C = I reference);
    cyclic: only the cyclic-Poisson row. The numbers are the record's own."""
    for batching, rows in (("poisson", {"mmcc"}), ("cyclic", {"cyclic-poisson"})):
        rid = _record_of(banded6, batching)
        got_rid, held = held_epsilons(banded6, rid)
        rec = accounting_records(banded6)[rid]
        assert got_rid == rid and set(held) == rows
        assert all(held[k] == rec[f"epsilon_{k.replace('-', '_')}"] for k in rows)
        assert rows == set(HELD_SETTINGS[batching]) & set(json.loads(rec["settings"]) if isinstance(rec["settings"], str)
                                                             else [str(x) for x in rec["settings"]])


def test_dpsgd_row_holds_for_an_identity_strategy_only(tmp_path: Path) -> None:
    """Under Poisson sampling the dp-sgd row is the C = I reference: it holds for an artifact whose
    C is exactly the identity (then the mechanism is DP-SGD; epsilon checked against dp-accounting
    composed here) and for no other C, however close."""
    import dp_accounting

    n, sigma, q, delta = 6, 2.0, 0.1, 1e-6
    ident = prefix_artifact(tmp_path / "id6.h5", np.eye(n), "identity")
    near = prefix_artifact(tmp_path / "near6.h5", np.eye(n) + 1e-9 * np.eye(n, k=-1), "near-identity")
    for path in (ident, near):
        _account(str(path), "--sigma", str(sigma), "--sampling", str(q), "--delta", str(delta),
                 "--value-discretization", "1e-2")  # coarse MMCC: fast, still a bound
    _rid, held = held_epsilons(ident)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), n)
    truth = dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(delta)
    assert set(held) == {"mmcc", "dp-sgd"} and held["dp-sgd"] >= truth * (1 - 1e-3)
    assert held["dp-sgd"] == pytest.approx(truth, rel=2e-2)
    assert set(held_epsilons(near)[1]) == {"mmcc"}


def test_record_without_sampler_is_the_fixed_order(tmp_path: Path) -> None:
    """A record of deterministic participation (no batch sampler: mfcli plan's fixed-order row)
    gives the fixed-order sampler with the period its schema allows, and its deterministic row
    holds under it."""
    path = prefix_artifact(tmp_path / "id4.h5", np.eye(4), "identity")
    with pytest.raises(MfcliError, match="has no accounting record; write one"):
        sampler_for(path, examples=10, seed=1)
    with pytest.raises(MfcliError, match="cannot read its accounting records"):
        sampler_for(tmp_path / "missing.h5", examples=10, seed=1)
    _account(str(path), "--sigma", "2", "--epochs", "2")
    s = sampler_for(path, examples=10, seed=1)
    assert isinstance(s, FixedOrderSampler) and s.describe() == {"kind": "fixed-order", "examples": 10, "steps": 4,
                                                                 "period": 2}
    rid = next(iter(accounting_records(path)))
    assert sampler_for(path, examples=10, seed=1, record=rid).period == 2
    got, held = held_epsilons(path, rid)
    assert got == rid and held == {"deterministic": accounting_records(path)[rid]["epsilon_deterministic"]}
    # a deterministic record next to a sampled one: ambiguous without an id
    _account(str(path), "--sigma", "2", "--sampling", "0.5", "--batching", "cyclic", "--epochs", "2")
    with pytest.raises(MfcliError, match="name different batch samplers; pick one of"):
        sampler_for(path, examples=10, seed=1)


# ---------------------------------------------------------------------------------------------
# sampler and noise stream together


def test_training_checkpoint_pairs_sampler_and_noise_steps(banded6: Path) -> None:
    from mfcli.training.samplers import record_noise_stream

    rid = _record_of(banded6, "cyclic")
    sampler = sampler_for(banded6, examples=40, seed=5, record=rid)
    stream = record_noise_stream(banded6, rid, kind="gradient", d=3, seed=6, dtype="float64")
    state = stream.init()
    rows = []
    for t, _ in enumerate(sampler):
        noise, state = stream.next(state)
        rows.append(noise)
        if t == 2:
            ck = training_state_dict(sampler, stream, state)
    assert ck["step"] == 3
    start, st3 = load_training_state(sampler, stream, ck)
    assert start == st3.t == 3
    # resuming replays exactly the accounted steps 3..n-1 with their own noise rows
    again = [stream.next(st3)[0]]
    assert np.array_equal(again[0], rows[3])
    # a sampler checkpoint of another step next to the noise checkpoint is refused
    mixed = {**ck, "sampler": sampler.state_dict(1)}
    with pytest.raises(MfcliError, match="pairs sampler step 1 with noise step 3"):
        load_training_state(sampler, stream, mixed)
    with pytest.raises(MfcliError, match="not an mfcli training checkpoint"):
        load_training_state(sampler, stream, ck["sampler"])
    other = sampler_for(banded6, examples=40, seed=5, record=_record_of(banded6, "poisson"))
    with pytest.raises(MfcliError, match="does not fit this sampler"):
        load_training_state(other, stream, ck)
    short = PoissonSampler(examples=40, rate=0.1, steps=5, seed=5)
    with pytest.raises(MfcliError, match="sampler covers 5 steps and the noise stream 6"):
        training_state_dict(short, stream, state)


def test_the_documented_training_loop_runs_and_resumes_exactly(tmp_path: Path, monkeypatch, capsys) -> None:
    """docs/samplers.md's loop, run as written on an artifact with one cyclic record: the sampler and
    the stream come from that record, the resumed run equals an uninterrupted one (t restarts at
    the checkpointed step, not at 0), and the printed epsilons are the cyclic-Poisson row."""
    import re

    code = re.search(r"```python\n(.*?)```", (Path(__file__).parents[1] / "docs" / "samplers.md").read_text(),
                     re.S)
    assert code is not None
    c = np.eye(8) + 0.5 * np.eye(8, k=-1)
    path = prefix_artifact(tmp_path / "run.h5", c, "banded2")
    _account(str(path), "--sigma", "2", "--sampling", "0.25", "--batching", "cyclic", "--min-sep", "2")
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "samplers_md"}
    exec(compile(code.group(1), "docs/samplers.md", "exec"), ns)
    assert ns["state"].t == ns["sampler"].steps == 8
    assert isinstance(ns["sampler"], CyclicPoissonSampler) and ns["sampler"].groups == 2
    assert ns["start"] == 4
    straight, _ = ns["train"](np.zeros(5), 0, ns["stream"].init(), stop=8)
    np.testing.assert_array_equal(ns["w"], straight)
    assert "cyclic-poisson" in capsys.readouterr().out
