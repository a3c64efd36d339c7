"""The lower side of the composition certificate (pld_certify.lower_delta_bound, certify_lower)
and balls-in-bins' lower end over several epochs, against an independent truth: the exact
composition of the epoch's optimistic PMF redone by direct convolution in long double (sums of
non-negative products, relative error <= gamma_N with u = 2^-64, no FFT), on a coarse grid
(h = 1e-2), 2 to 8 epochs, deltas 1e-6 and 1e-10, both directions.

Checked: the lower bound on D(eps) <= the exact D(eps) and within 1e-8 of it; the certified
lower epsilon <= the exact epsilon and within 1e-8 relative of it (from the run's value, and from
a start 0.05 above); the run's own lower end (pld_ops' FFT composition of the optimistic PLD, as
balls-in-bins reported it before) above the exact epsilon at delta 1e-10, so the certificate is
needed; deliberately broken lower bounds (the FFT round-off not subtracted: x instead of
x - err; a circular composition shorter than the support read without removing its aliases)
caught by the same comparison. End to end: tree_balls_in_bins / dpsgd_balls_in_bins over several
epochs report a lower end <= the exact epsilon of the composed optimistic PMF, <= the upper end.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from accounting_oracles import direct_power

from mfcli.accounting import balls_in_bins as bib
from mfcli.accounting import pld_certify as pc
from mfcli.accounting import pld_ops

LD = np.longdouble
H = 1e-2
#: |relative error| of the long-double truth: depth x gamma_N(u = 2^-64), N <= 1e5, depth <= 8
TRUTH_REL = 8 * 1e5 * 2.0 ** -64 * 1.1
#: how far below the truth the lower bound on D may be (the leaves' tilt roundings, about
#: 3 theta max|l| u per leaf and copy, and the FFT term relative to the Chernoff bound)
TIGHT_D_REL = 1e-8
TIGHT_EPS_REL = 1e-8


@functools.cache
def epoch_lower(kind: str) -> pld_ops.Pld:
    """One epoch's optimistic PLD at grid 1e-2: the tree on 4 leaves at sigma 2, or DP-SGD over
    3 steps at sigma 1 (odd: the mixture of unequal halves)."""
    if kind == "tree":
        return bib._epoch_plds(bib._root_laws, bib.tree_height(4), sigma=2.0, epochs=1, grid=H, on_progress=None)[1]
    return bib._epoch_plds(bib._allocation_laws, 3, sigma=1.0, epochs=1, grid=H, on_progress=None)[1]


@functools.cache
def truth(kind: str, k: int, direction: str) -> tuple[int, np.ndarray]:
    """(lower loss index, masses) of the exact k-fold composition of the epoch's optimistic PMF
    (its infinity mass is 0: optimistic)."""
    p = pc._direction(epoch_lower(kind), direction)
    assert p.infinity_mass == 0
    return p.lower_loss * k, direct_power(p.probs.astype(LD), k)


def hockey(lower: int, probs: np.ndarray, eps: float) -> float:
    losses = (np.arange(probs.size, dtype=LD) + LD(lower)) * LD(H)
    w = -np.expm1(LD(eps) - losses)
    w[w < 0] = 0
    return float((probs * w).sum())


def exact_epsilon(lower: int, probs: np.ndarray, delta: float) -> float:
    """The largest eps (to double resolution) with D(eps) > delta: the exact epsilon."""
    lo, hi = 0.0, (lower + probs.size) * H
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if hockey(lower, probs, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return lo


@functools.cache
def node(kind: str, k: int) -> pc.Node:
    return pc.self_compose(pc.leaf(epoch_lower(kind)), k)


CASES = [pytest.param(kind, k, dn, delta, id=f"{kind}-k{k}-{dn}-{delta:g}")
         for kind in ("tree", "dpsgd") for k in (2, 3, 8) for dn in pc.DIRECTIONS for delta in (1e-6, 1e-10)]


@pytest.mark.parametrize("kind, k, direction, delta", CASES)
def test_lower_delta_bound_below_and_near_the_long_double_truth(kind: str, k: int, direction: str,
                                                                 delta: float) -> None:
    nd = node(kind, k)
    lower, probs = truth(kind, k, direction)
    eps0 = exact_epsilon(lower, probs, delta)
    theta = pc.chernoff_theta(nd, direction, eps0)
    for eps in (eps0 - 0.3, eps0, eps0 + 0.2):  # also away from the tilt's own point
        d_exact = hockey(lower, probs, eps)
        d_low = pc.lower_delta_bound(nd, eps, theta=theta, direction=direction)
        assert d_low <= d_exact * (1 + TRUTH_REL)
        assert d_low >= d_exact * (1 - TIGHT_D_REL)


@pytest.mark.parametrize("kind, k, delta", [pytest.param(kind, k, delta, id=f"{kind}-k{k}-{delta:g}")
                                            for kind in ("tree", "dpsgd") for k in (2, 3, 8)
                                            for delta in (1e-6, 1e-10)])
def test_certified_lower_epsilon_below_and_near_the_exact_one(kind: str, k: int, delta: float) -> None:
    nd = node(kind, k)
    exact = max(exact_epsilon(*truth(kind, k, dn), delta) for dn in pc.DIRECTIONS)
    run = float(pld_ops.epsilon_for_delta(nd.pld, delta))
    for start in (run, exact + 0.05):
        cert = pc.certify_lower(nd, start, delta)
        assert cert <= start
        assert exact * (1 - TIGHT_EPS_REL) <= cert <= exact
    # a start below the exact epsilon passes at once and is returned
    assert pc.certify_lower(nd, 0.5 * exact, delta) == 0.5 * exact


def test_the_runs_own_lower_end_was_above_the_exact_epsilon() -> None:
    """Why the certificate: the run's composed optimistic PLD (pld_ops' FFT power on its window,
    its 1e-15 tail charged as infinity mass, as dp-accounting does) gives an epsilon above the
    exact composition's at delta 1e-10 (by about 2e-7 relative here), and the old path's check of
    it against its own PMF kept it; the certified one is below."""
    delta = 1e-10
    nd = node("tree", 3)
    exact = max(exact_epsilon(*truth("tree", 3, dn), delta) for dn in pc.DIRECTIONS)
    run = float(pld_ops.epsilon_for_delta(nd.pld, delta))
    old = bib._certified_lower(nd.pld, run, delta)
    assert old > exact
    assert pc.certify_lower(nd, run, delta) <= exact


def test_a_composition_tree_with_pairwise_compositions() -> None:
    """The lower chain also redoes pairwise compositions (uncut): a k-fold composed with the other
    epoch law's leaf, against the long-double truth."""
    a, b = epoch_lower("tree"), epoch_lower("dpsgd")
    nd = pc.compose(pc.self_compose(pc.leaf(a), 2), pc.leaf(b))
    for dn in pc.DIRECTIONS:
        pa, pb = pc._direction(a, dn), pc._direction(b, dn)
        lower = 2 * pa.lower_loss + pb.lower_loss
        probs = np.convolve(direct_power(pa.probs.astype(LD), 2), pb.probs.astype(LD))
        for eps in (1.0, 3.0, 5.0):
            d_exact = hockey(lower, probs, eps)
            d_low = pc.lower_delta_bound(nd, eps, direction=dn)
            assert d_exact * (1 - TIGHT_D_REL) <= d_low <= d_exact * (1 + TRUTH_REL)


def test_trimmed_tails_cost_nothing_measurable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lower chain cuts each node's tilted tails (TRIM_SHARE of its err1): any cut is valid (a
    lower bound may drop mass; the truth comparisons above run with it); here it shortens the
    8-fold and moves the bound by less than 1e-10 relative against the uncut chain."""
    nd = node("tree", 8)
    lower, probs = truth("tree", 8, "remove")
    eps = exact_epsilon(lower, probs, 1e-10)
    theta = pc.chernoff_theta(nd, "remove", eps)
    cut = pc._LowerChain(theta, "remove", eps)
    t_cut = cut.of(nd)
    monkeypatch.setattr(pc, "TRIM_SHARE", 0.0)
    full = pc._LowerChain(theta, "remove", eps)
    t_full = full.of(nd)
    assert t_full.x.size == probs.size  # uncut: the whole support, no wrap-around
    assert t_cut.x.size < 0.8 * t_full.x.size
    # either may be the larger (the cut chain's smaller norms give a smaller err1 downstream)
    d_cut, d_full = cut.delta_lower(t_cut, eps), full.delta_lower(t_full, eps)
    assert abs(d_cut - d_full) <= 1e-10 * d_full
    assert d_cut <= hockey(lower, probs, eps) * (1 + TRUTH_REL)


# ---------------------------------------------------------------------------------------------
# Broken lower bounds, caught by the same comparison


def _far_tail_violations(monkeypatch: pytest.MonkeyPatch, *, trim: bool = False) -> int:
    """How many of 10 epsilons (8 up the tail, two at the support's end, where the truth falls to
    0) the lower bound exceeds the truth at, untilted (theta = 0), every composition by FFT
    (DIRECT_WORK = 0): legitimate settings, where the FFT's absolute round-off (about 1e-17 per
    position) dwarfs the far tail's true masses. Uncut (TRIM_SHARE = 0) unless ``trim``: the
    default trim drops exactly those positions, so it would hide a mutant of the rest."""
    monkeypatch.setattr(pc, "DIRECT_WORK", 0)
    if not trim:
        monkeypatch.setattr(pc, "TRIM_SHARE", 0.0)
    nd = node("tree", 3)
    lower, probs = truth("tree", 3, "remove")
    top = (lower + probs.size) * H
    bad = 0
    for eps in [*np.linspace(6.0, 24.0, 8), top - 0.5, top + 1.0]:
        d_low = pc.lower_delta_bound(nd, float(eps), theta=0.0, direction="remove")
        bad += d_low > hockey(lower, probs, float(eps)) * (1 + TRUTH_REL)
    return bad


def test_far_tail_untilted_fft_is_still_below_the_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _far_tail_violations(monkeypatch) == 0


def test_mutant_round_off_not_subtracted_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """x instead of x - err: the l1 error of every step set to 0."""
    compose, leaf = pc._LowerChain._compose, pc._LowerChain._leaf
    monkeypatch.setattr(pc._LowerChain, "_compose", lambda self, a, b: dataclasses.replace(compose(self, a, b), err1=0.0))
    monkeypatch.setattr(pc._LowerChain, "_leaf", lambda self, p: dataclasses.replace(leaf(self, p), err1=0.0))
    assert _far_tail_violations(monkeypatch) >= 4


def test_mutant_aliases_not_removed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A circular composition shorter than the support (a third of it), read at every position of
    the support without removing the aliases (position i holds its mass plus those of i +- n,
    i +- 2n): the non-negative aliases inflate the tail's positions with the bulk's mass. Untilted
    (theta = 0, a legitimate choice): with a tilt the aliases from below are damped by
    e^(-theta n d) and those from above land below eps, so at these lengths only theta = 0 shows
    them (the design point: the lower chain has no aliases at all)."""
    def circular(self: pc._LowerChain, a: pc._Tilted, b: pc._Tilted) -> pc._Tilted:
        out = compose(self, a, b)
        n = out.x.size // 3
        folded = np.zeros(n)
        np.add.at(folded, np.arange(out.x.size) % n, out.x)
        return dataclasses.replace(out, x=folded[np.arange(out.x.size) % n], _norms=None)

    compose = pc._LowerChain._compose
    monkeypatch.setattr(pc._LowerChain, "_compose", circular)
    nd = node("tree", 3)
    lower, probs = truth("tree", 3, "remove")
    eps = exact_epsilon(lower, probs, 1e-6)
    assert pc.lower_delta_bound(nd, eps, theta=0.0, direction="remove") > 2 * hockey(lower, probs, eps)


# ---------------------------------------------------------------------------------------------
# End to end: the balls-in-bins brackets over several epochs


@pytest.mark.parametrize("kind, epochs, delta", [("tree", 3, 1e-10), ("tree", 8, 1e-6), ("dpsgd", 4, 1e-6)])
def test_balls_in_bins_lower_end_is_certified(kind: str, epochs: int, delta: float) -> None:
    if kind == "tree":
        res = bib.tree_balls_in_bins(n=4, sigma=2.0, epochs=epochs, delta=delta, grid=H)
    else:
        res = bib.dpsgd_balls_in_bins(n=3, sigma=1.0, epochs=epochs, delta=delta, grid=H)
    exact = max(exact_epsilon(*truth(kind, epochs, dn), delta) for dn in pc.DIRECTIONS)
    assert exact * (1 - TIGHT_EPS_REL) <= res.lower <= exact
    assert res.lower <= res.epsilon
    row = res.as_dict()
    assert row["bracket"] == [res.lower, res.epsilon]
    assert "the lower end's from below" in row["method"]


def test_below_the_runs_infinity_mass() -> None:
    """At delta 1e-18 the run's composed PLDs charge 1e-15 as infinity mass (both epsilons inf);
    the certified lower end starts from the composition's largest loss, tilts again on its way
    down, and lands within TIGHT_EPS_REL below the exact epsilon."""
    delta = 1e-18
    exact = max(exact_epsilon(*truth("tree", 3, dn), delta) for dn in pc.DIRECTIONS)
    assert exact * (1 - TIGHT_EPS_REL) <= pc.certify_lower(node("tree", 3), float("inf"), delta) <= exact
    res = bib.tree_balls_in_bins(n=4, sigma=2.0, epochs=3, delta=delta, grid=H)
    assert exact * (1 - TIGHT_EPS_REL) <= res.lower <= exact <= res.epsilon


@functools.cache
def _tree_truths(k: int) -> dict:
    """(lower, masses, infinity mass) per (side, direction) of the exact k-fold composition of the
    tree's (n 4, sigma 2, grid 1e-2) epoch PLDs, pessimistic and optimistic, in long double."""
    upper, lower = bib._epoch_plds(bib._root_laws, bib.tree_height(4), sigma=2.0, epochs=1, grid=H, on_progress=None)
    out = {}
    for side, pld in (("upper", upper), ("lower", lower)):
        for dn in pc.DIRECTIONS:
            p = pc._direction(pld, dn)
            total = LD(p.probs.astype(LD).sum()) + LD(p.infinity_mass)
            inf = total ** k - (total - LD(p.infinity_mass)) ** k
            out[side, dn] = (p.lower_loss * k, direct_power(p.probs.astype(LD), k), float(inf))
    return out


@pytest.mark.parametrize("epochs, eps", [(3, 11.0), (3, 12.0), (3, 6.0), (2, 4.0), (1, 4.0)])
def test_tree_delta_bracket_holds_the_exact_composition(epochs: int, eps: float) -> None:
    """tree_delta_bracket's [lower, upper] holds the exact compositions' deltas: lower <= the
    optimistic composition's, upper >= the pessimistic one's (reviewer's case: 3 epochs, eps 11,
    where the run's composed optimistic PLD said 1.3e-15 and the exact one is 2e-18)."""
    lo, hi = bib.tree_delta_bracket(n=4, sigma=2.0, epsilon=eps, epochs=epochs, grid=H)
    tr = _tree_truths(epochs)
    exact_low = max(hockey(*tr["lower", dn][:2], eps) for dn in pc.DIRECTIONS)
    exact_up = max(hockey(*tr["upper", dn][:2], eps) + tr["upper", dn][2] for dn in pc.DIRECTIONS)
    assert 0.0 <= lo <= exact_low * (1 + TRUTH_REL)
    assert hi >= exact_up * (1 - TRUTH_REL)
    assert lo <= hi


def test_far_tail_with_the_trim_is_below_the_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _far_tail_violations(monkeypatch, trim=True) == 0


def test_mutant_trim_forgets_the_round_off_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trim that drops the node's err1 (reviewer's mutant, not caught before): 4 of 10 fail."""
    orig = pc._trimmed
    monkeypatch.setattr(pc, "_trimmed", lambda t: dataclasses.replace(orig(t), err1=0.0))
    assert _far_tail_violations(monkeypatch, trim=True) > 0
