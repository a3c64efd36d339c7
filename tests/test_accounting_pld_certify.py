"""The tilted-FFT certificate of PLD composition (mfcli.accounting.pld_certify) against an
independent truth: every composition redone by direct convolution in long double (sums of
non-negative products, relative error <= gamma_N with u = 2^-64, no FFT), on small grids
(d = 1e-2), k up to 64, deltas 1e-6 and 1e-10, both directions.

Checked: D_cert(eps) >= the exact D(eps) and within a few 1e-15 of it (the run's 1e-15 tail
charge plus round-off), the certified epsilon >= the exact one and within 1e-6 relative, the
l1 error bound of the tilted FFT power and the FFT model's bounds against measured errors; and
deliberately broken certificates (no tilt, no tail charge) caught by those same checks (a dropped
FFT error term alone is not: the other allowances already exceed the measured FFT error). End to
end: `mfcli account` reports MMCC's certified epsilon, >= the long-double replay's. The same
truth checks the DP-SGD reduction's certified path (single_pass.certified_poisson_epsilon: its
leaves against the Poisson-sampled Gaussian's closed-form curve, its epsilon against the exact
composition) and balls-in-bins' epochs (the upper end's certified composition).
"""
from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
from accounting_oracles import direct_power
from typer.testing import CliRunner

from mfcli.accounting import pld_certify as pc
from mfcli.accounting import pld_ops, single_pass
from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.util.floating import gamma, integer_power, integer_power_rounding, integer_power_underflow

LD = np.longdouble
D = 1e-2
#: |relative error| of the long-double truth: depth x gamma_N(u = 2^-64), N <= 1e5, depth <= 8
TRUTH_REL = 8 * 1e5 * 2.0 ** -64 * 1.1
#: D_cert - D_exact may be the 1e-15 tail charge of a self-composition and the round-off part
#: (relative to the Chernoff bound, so to D where eps is far below the tilt's aim)
TIGHT_D, TIGHT_D_REL = 5e-15, 1e-9
TIGHT_EPS_REL = 1e-6
#: |eps_run - eps_exact| / eps_exact: the run's FFT round-off (measured up to 3e-6 at delta 1e-10)
RUN_EPS_REL = 1e-5

SELF_CASES = [(1.0, 0.1, 64), (1.0, 0.1, 8), (0.8, 0.3, 16)]


@functools.cache
def dpsgd(sigma: float, p: float) -> pld_ops.Pld:
    return single_pass._poisson_gaussian_pld(sigma, p, D)


# ---------------------------------------------------------------------------------------------
# The truth: the tree redone from its leaves in long double, directly


def truth(node: pc.Node, direction: str) -> tuple[int, np.ndarray, LD, LD]:
    """(lower loss index, masses, infinity mass, total mass) of the exact composition."""
    if node.kind == "leaf":
        p = pc._direction(node.pld, direction)
        probs = p.probs.astype(LD)
        inf = LD(p.infinity_mass)
        return p.lower_loss, probs, inf, probs.sum() + inf
    if node.kind == "self":
        lower, probs, inf, total = truth(node.children[0], direction)
        k = node.times
        return lower * k, direct_power(probs, k), total ** k - (total - inf) ** k, total ** k
    la, pa, ia, ta = truth(node.children[0], direction)
    lb, pb, ib, tb = truth(node.children[1], direction)
    return la + lb, np.convolve(pa, pb), ta * tb - (ta - ia) * (tb - ib), ta * tb


def hockey(lower: int, probs: np.ndarray, inf: LD, eps: float) -> LD:
    losses = (np.arange(probs.size, dtype=LD) + LD(lower)) * LD(D)
    w = -np.expm1(LD(eps) - losses)
    w[w < 0] = 0
    return (probs * w).sum() + inf


def exact_epsilon(lower: int, probs: np.ndarray, inf: LD, delta: float) -> float:
    lo, hi = 0.0, (lower + probs.size) * D
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if hockey(lower, probs, inf, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


@functools.cache
def self_case(sigma: float, p: float, k: int) -> tuple[pc.Node, dict]:
    node = pc.self_compose(pc.leaf(dpsgd(sigma, p)), k)
    return node, {dn: truth(node, dn) for dn in pc.DIRECTIONS}


@functools.cache
def tree_case() -> tuple[pc.Node, dict]:
    """Windowed self-compositions (dense), a sparse one (pairwise products), FFT compositions."""
    a = pc.self_compose(pc.leaf(dpsgd(1.0, 0.1)), 16)
    b = pc.self_compose(pc.leaf(dpsgd(0.8, 0.3)), 8)
    small = pld_ops.from_rounded_probability({-3: 0.2, 0: 0.5, 5: 0.3}, 0.0, D)
    assert small.remove.sparse
    s = pc.self_compose(pc.leaf(small), 3)
    assert s.pld.remove.sparse  # dp-accounting's dictionary path
    node = pc.compose(a, pc.compose(b, pc.compose(s, pc.leaf(dpsgd(2.0, 0.5)))))
    return node, {dn: truth(node, dn) for dn in pc.DIRECTIONS}


def check_d(d_cert: float, d_exact: LD) -> None:
    """The certificate's two claims: above the truth (beyond its own error), and tight."""
    assert d_cert >= float(d_exact) * (1 + TRUTH_REL)
    assert d_cert - float(d_exact) <= TIGHT_D + TIGHT_D_REL * float(d_exact)


def cases():
    for sigma, p, k in SELF_CASES:
        for dn in pc.DIRECTIONS:
            for delta in (1e-6, 1e-10):
                yield pytest.param(("self", sigma, p, k), dn, delta, id=f"s{sigma}-p{p}-k{k}-{dn}-{delta:g}")
    for dn in pc.DIRECTIONS:
        for delta in (1e-6, 1e-10):
            yield pytest.param(("tree",), dn, delta, id=f"tree-{dn}-{delta:g}")


def get(case: tuple) -> tuple[pc.Node, dict]:
    return tree_case() if case[0] == "tree" else self_case(*case[1:])


@pytest.mark.parametrize("case, direction, delta", list(cases()))
def test_certified_delta_and_epsilon_against_long_double_truth(case: tuple, direction: str, delta: float) -> None:
    node, truths = get(case)
    lower, probs, inf, _ = truths[direction]
    pmf = pc._direction(node.pld, direction)
    eps = float(pld_ops._pmf_epsilon(pmf, delta))  # the run's epsilon of this direction
    check_d(pc.delta_bound(node, eps, direction=direction), hockey(lower, probs, inf, eps))
    for shift in (-0.3, 0.2):  # also away from the tilt's own point
        if eps + shift > 0:
            check_d(pc.delta_bound(node, eps + shift, direction=direction), hockey(lower, probs, inf, eps + shift))
    exact = exact_epsilon(lower, probs, inf, delta)
    cert = pc.certify(node, eps, delta) if node.pld.symmetric else _certify_one(node, eps, delta, direction)
    assert cert >= exact
    # the run's own epsilon carries the FFT's round-off, either side of the exact one (about 3e-6
    # relative at delta 1e-10 with scipy 1.17's pocketfft; docs/performance.md); the certificate
    # searches down from it as well as up, so it does not inherit that noise: within
    # TIGHT_EPS_REL of the exact epsilon whichever side the run fell on
    assert abs(eps - exact) <= RUN_EPS_REL * exact
    assert cert - exact <= TIGHT_EPS_REL * exact
    # the same answer (to the search's resolution) from a start below and from one above
    for start in (max(0.0, exact - 0.05), exact + 0.05):
        other = _certify_one(node, start, delta, direction)
        assert exact <= other <= exact * (1 + TIGHT_EPS_REL)
        assert abs(other - cert) <= 2e-10 * max(1.0, cert)


def _certify_one(node: pc.Node, eps: float, delta: float, direction: str) -> float:
    return pc.certify(node, eps, delta, direction=direction)


@pytest.mark.parametrize("case, delta", [(("self", 1.0, 0.1, 64), 1e-10), (("self", 1.0, 0.1, 64), 1e-6), (("tree",), 1e-6)])
def test_ladder_returns_the_first_passing_eps_within_its_resolution(case: tuple, delta: float) -> None:
    """certify's ladder (its first rung placed by a Newton step) against the claim itself,
    checked here on the certificate's own curve: D_cert passes at the returned eps in both
    directions and fails 2e-10 relative below it, from the run's epsilon and from starts above and
    below it (the downward search by tangents and chords, the upward one by a Newton-placed
    ladder), so neither skips past the crossing nor returns a failing eps; and it is above the
    long-double truth."""
    node, truths = get(case)
    eps = float(pld_ops.epsilon_for_delta(node.pld, delta))
    bound = pc.certificate(node, eps).bound
    exact = max(exact_epsilon(*truths[dn][:3], delta) for dn in pc.DIRECTIONS)
    for start in (eps, eps * (1 + 1e-4), eps * (1 - 1e-4)):
        cert = pc.certify(node, start, delta)
        assert bound(cert) <= delta
        assert bound(cert - 2e-10 * max(1.0, cert)) > delta
        assert cert >= exact


def test_certified_epsilon_is_the_larger_direction() -> None:
    node, truths = self_case(1.0, 0.1, 8)
    delta = 1e-6
    exact = max(exact_epsilon(*truths[dn][:3], delta) for dn in pc.DIRECTIONS)
    cert = pc.certified_epsilon(node, delta)
    assert exact <= cert <= exact * (1 + TIGHT_EPS_REL)


# ---------------------------------------------------------------------------------------------
# The l1 error bound of the tilted FFT power, against its measured error


def _tilted_truth(node: pc.Node, direction: str, chain: pc._Chain) -> np.ndarray:
    """The exact arithmetic's tilted values on the chain's window: the truth tilted by the
    chain's theta and folded modulo its circular length (the exact aliases)."""
    child = node.children[0]
    p = pc._direction(child.pld, direction)
    out = pc._direction(node.pld, direction)
    k = node.times
    lower, probs, _, _ = truths_of(node)[direction]
    t = chain.of(node)
    lo = out.lower_loss - p.lower_loss * k
    n = chain._circular_length(p, k, lo, out.size, node.tail)
    losses = (np.arange(probs.size, dtype=LD) + LD(lower)) * LD(D)
    tilted = probs * np.exp(LD(chain.theta) * losses - LD(t.s))
    pos = (np.arange(probs.size) - lo) % n
    folded = np.zeros(n, dtype=LD)
    np.add.at(folded, pos, tilted)
    return folded[:out.size]


def truths_of(node: pc.Node) -> dict:
    for sigma, p, k in SELF_CASES:
        if self_case(sigma, p, k)[0] is node:
            return self_case(sigma, p, k)[1]
    raise AssertionError


def tilted_error(node: pc.Node, direction: str, theta: float) -> tuple[float, float]:
    """(measured sum |x - x*| of the chain's tilted k-fold power, its bound err1)."""
    chain = pc._Chain(theta, direction)
    t = chain.of(node)
    exact = _tilted_truth(node, direction, chain)
    return float(np.abs(t.x.astype(LD) - exact).sum()), t.err1


@pytest.mark.parametrize("k", [64, 8])
def test_tilted_error_bound_holds(k: int) -> None:
    node, _ = self_case(1.0, 0.1, k)
    for direction in pc.DIRECTIONS:
        theta = pc.chernoff_theta(node, direction, float(pld_ops._pmf_epsilon(pc._direction(node.pld, direction), 1e-6)))
        measured, bound = tilted_error(node, direction, theta)
        assert 0 < measured <= bound


def _pmf_like(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        x = rng.random(size)
    elif kind == "gauss":
        t = np.arange(size)
        x = np.exp(-0.5 * ((t - size / 3) / (size / 20)) ** 2)
    else:
        x = np.zeros(size)
        x[rng.integers(0, size, 6)] = rng.random(6)
        x[0] = 1.0
    return x / x.sum()


@pytest.mark.parametrize("transform", ["real", "complex"])
@pytest.mark.parametrize("kind", ["uniform", "gauss", "spiky"])
@pytest.mark.parametrize("size, k", [(300, 16), (300, 64), (300, 150), (100, 256), (3000, 4)])
def test_fft_power_bound_holds(kind: str, size: int, k: int, transform: str) -> None:
    """The 2-norm bound of the FFT power (the assumed FFT model, the proven square-and-multiply
    power) against its measured error, the truth by direct long-double powering; the bound left
    out (0) would be caught. The chain's arithmetic (real transforms) and the complex one."""
    from scipy import fft

    x = _pmf_like(kind, size, np.random.default_rng(size + k))
    n = fft.next_fast_len(k * (size - 1) + 1, transform == "real")
    if transform == "real":
        y = fft.irfft(integer_power(fft.rfft(x, n), k), n)
    else:
        y = np.real(fft.ifft(integer_power(fft.fft(x, n), k)))
    exact = np.zeros(n, dtype=LD)
    exact[:k * (size - 1) + 1] = direct_power(x.astype(LD), k)
    measured = float(np.sqrt(((y.astype(LD) - exact) ** 2).sum()))
    assert 0 < measured <= pc._fft_power_bound(*pc._norms(x), k, n)


@pytest.mark.parametrize("k", [2, 3, 9, 16, 64, 99, 100, 150, 256, 1000, 4095])
def test_integer_power_rounding_holds(k: int) -> None:
    """integer_power's y^k within integer_power_rounding(k) relative of the exact power, on random
    y of modulus 0.9 to 1; truth exp(k log y) in long double (its own error about k 1e-19,
    allowed). Counting each product once, (1 + sqrt2 gamma_2)^(2 ceil(log2 k) + 1) - 1, fails at k = 64
    (measured 6.9e-15 against 2.9e-15)."""
    rng = np.random.default_rng(k)
    y = np.exp(1j * rng.uniform(0, 2 * np.pi, 100_000)) * rng.uniform(0.9, 1.0, 100_000)
    exact = np.exp(LD(k) * np.log(y.astype(np.clongdouble)))
    got = integer_power(y, k)
    rel = np.abs(got.astype(np.clongdouble) - exact) / np.abs(exact)
    assert 0 < float(rel.max()) + 1e-17 * k <= integer_power_rounding(k)
    if k >= 64:
        once = (1 + math.sqrt(2) * gamma(2)) ** (2 * math.ceil(math.log2(k)) + 1) - 1
        assert float(rel.max()) > once


@pytest.mark.parametrize("k", [3, 256, 1000])
def test_integer_power_underflow_holds(k: int) -> None:
    """Where the powers underflow (moduli near 2^(-1074 / k)) the relative model fails and the
    absolute allowance must cover the difference from the exact power (long double, whose range
    reaches 2^-16445): |computed - exact| <= rel |exact| + integer_power_underflow(k, m)."""
    rng = np.random.default_rng(k + 7)
    mod = np.exp2(rng.uniform(-1100.0, -1000.0, 50_000) / k)
    y = np.exp(1j * rng.uniform(0, 2 * np.pi, mod.size)) * mod
    exact = np.exp(LD(k) * np.log(y.astype(np.clongdouble)))
    got = integer_power(y, k).astype(np.clongdouble)
    err = np.abs(got - exact)
    allowed = integer_power_rounding(k) * np.abs(exact) + integer_power_underflow(k, float(mod.max()))
    assert np.all(err <= allowed)
    assert float((err - integer_power_rounding(k) * np.abs(exact)).max()) > 0  # the absolute part is needed


def test_integer_power_refuses_bad_exponents() -> None:
    for k in (0, -1, 2.0, True):
        with pytest.raises(MfcliError):
            integer_power(np.ones(3, dtype=complex), k)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["uniform", "gauss", "spiky"])
def test_fft_convolution_bound_holds(kind: str) -> None:
    from scipy import fft

    rng = np.random.default_rng(7)
    a, b = _pmf_like(kind, 2500, rng), _pmf_like("gauss", 1700, rng)
    shape = a.size + b.size - 1
    n = fft.next_fast_len(shape, True)
    y = fft.irfft(fft.rfft(a, n) * fft.rfft(b, n), n)[:shape]
    measured = float(np.sqrt(((y.astype(LD) - np.convolve(a.astype(LD), b.astype(LD))) ** 2).sum()))
    assert 0 < measured <= pc._fft_conv_bound(*pc._norms(a), *pc._norms(b), n)


# ---------------------------------------------------------------------------------------------
# Broken certificates are caught


def test_untilted_certificate_is_caught() -> None:
    """theta = 0 (the FFT's error relative to the bulk, not to D): valid but loose, and the
    tightness check fails."""
    node, truths = self_case(1.0, 0.1, 64)
    lower, probs, inf, _ = truths["remove"]
    eps = float(pld_ops._pmf_epsilon(node.pld.remove, 1e-10))
    loose = pc.delta_bound(node, eps, theta=0.0, direction="remove")
    with pytest.raises(AssertionError):
        check_d(loose, hockey(lower, probs, inf, eps))


def test_dropped_tail_charge_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the window's tail charge the certificate falls below the truth somewhere."""
    node, truths = self_case(1.0, 0.1, 8)
    import dataclasses

    no_tail = dataclasses.replace(node, tail=0.0)
    failures = 0
    for direction in pc.DIRECTIONS:
        lower, probs, inf, _ = truths[direction]
        for delta in (1e-6, 1e-10):
            eps = float(pld_ops._pmf_epsilon(pc._direction(node.pld, direction), delta))
            for e in (eps, eps + 1.0, eps + 3.0):
                try:
                    check_d(pc.delta_bound(no_tail, e, direction=direction), hockey(lower, probs, inf, e))
                except AssertionError:
                    failures += 1
    assert failures > 0


# ---------------------------------------------------------------------------------------------
# The recorded tree and the end-to-end MMCC path


def test_self_composition_of_a_computed_pld_is_refused() -> None:
    from mfcli.errors import MfcliError

    node = pc.compose(pc.leaf(dpsgd(1.0, 0.1)), pc.leaf(dpsgd(0.8, 0.3)))
    with pytest.raises(MfcliError, match="input PLDs only"):
        pc.self_compose(node, 4)
    with pytest.raises(MfcliError, match="direction"):
        pc.delta_bound(node, 1.0, direction="sideways")


def test_recording_keeps_pld_ops_arithmetic() -> None:
    """The recorded operations are pld_ops' own: compositions bit for bit dp-accounting's (tested
    there), self-compositions its real-FFT variant (the run's answer is certified, so its
    arithmetic need not be dp-accounting's)."""
    a, b = dpsgd(1.0, 0.1), dpsgd(0.8, 0.3)
    node = pc.compose(pc.self_compose(pc.leaf(a), 8), pc.leaf(b))
    ref = pld_ops.compose(pld_ops.self_compose(a, 8, bit_for_bit=False), b)
    for dn in pc.DIRECTIONS:
        x, y = pc._direction(node.pld, dn), pc._direction(ref, dn)
        assert x.lower_loss == y.lower_loss and x.infinity_mass == y.infinity_mass
        np.testing.assert_array_equal(x.probs, y.probs)


def test_mmcc_cli_reports_the_certified_epsilon(monkeypatch: pytest.MonkeyPatch) -> None:
    """`mfcli account` (MMCC, identity, 16 steps, grid 1e-2): the epsilon reported is the
    certified one, >= the long-double replay's exact epsilon of the composed rows."""
    seen: list = []
    orig = pc.certified_epsilon

    def spy(node: pc.Node, delta: float) -> float:
        out = orig(node, delta)
        seen.append((node, delta, out))
        return out

    monkeypatch.setattr(pc, "certified_epsilon", spy)
    r = CliRunner().invoke(app, ["account", "--json", "--strategy", "identity", "--n", "16", "--sigma", "0.8",
                                 "--sampling", "0.3", "--delta", "1e-10", "--value-discretization", "1e-2"])
    assert r.exit_code == 0, r.output
    reported = json.loads(r.stdout)["settings"]["mmcc"]["epsilon"]
    # MMCC's certificate and, since the DP-SGD reduction is certified too, the reduction row's
    mine = [s for s in seen if s[2] == reported]
    assert 1 <= len(seen) <= 2 and mine
    node, delta, _ = mine[0]
    assert node.kind == "self" and node.times == 16
    exact = max(exact_epsilon(*truth(node, dn)[:3], delta) for dn in pc.DIRECTIONS)
    assert exact <= reported <= exact * (1 + TIGHT_EPS_REL)
    assert math.isfinite(reported)


# ---------------------------------------------------------------------------------------------
# The DP-SGD reduction's certified path (single_pass.certified_poisson_epsilon)

REDUCTION_GROUPS = [((1.0, 16),), ((1.0, 8), (0.8, 4), (2.0, 3))]


def _reduction_leaf(sigma: float, p: float) -> pld_ops.Pld:
    return single_pass._certified_poisson_gaussian_pld(sigma, p, D)


@pytest.mark.parametrize("sigma, p", [(1.0, 0.1), (0.8, 0.3), (2.0, 1.0)])
def test_reduction_leaf_dominates_the_poisson_gaussian_curve(sigma: float, p: float) -> None:
    """The reduction's leaf is the Poisson-sampled Gaussian's pair in both directions (not its
    mirror): its hockey-stick curve is above the exact curve of each direction (the closed form in
    Gaussian CDFs, single_pass._PoissonGaussianLoss, dp-accounting's formulas), and close to it.
    Caught: the mixture's probabilities swapped, or the directions exchanged."""
    pld = _reduction_leaf(sigma, p)
    for direction, remove in (("remove", True), ("add", False)):
        pmf = pc._direction(pld, direction)
        eps = np.linspace(0.0, 3.0, 31)
        exact = single_pass._PoissonGaussianLoss(sigma, p, remove).deltas(eps)
        probs = pmf.probs.astype(LD)
        ours = np.array([float(hockey(pmf.lower_loss, probs, LD(pmf.infinity_mass), e)) for e in eps])
        assert np.all(ours >= exact * (1 - 1e-12))
        assert np.all(ours - exact <= 0.02 * exact + 1e-12)  # the grid's (d = 1e-2) pessimism only


def _groups_truth(groups, p: float, direction: str) -> tuple[int, np.ndarray, LD]:
    """The exact composition of the groups' leaves (each k times), in long double, directly."""
    lower, probs, inf, total = 0, np.ones(1, dtype=LD), LD(0), LD(1)
    for m, k in groups:
        node = pc.self_compose(pc.leaf(_reduction_leaf(m, p)), k) if k > 1 else pc.leaf(_reduction_leaf(m, p))
        lo, pr, i, t = truth(node, direction)
        lower, probs = lower + lo, np.convolve(probs, pr)
        inf, total = total * t - (total - inf) * (t - i), total * t
    return lower, probs, inf


@pytest.mark.parametrize("groups", REDUCTION_GROUPS)
@pytest.mark.parametrize("delta", [1e-6, 1e-10])
def test_reduction_epsilon_against_long_double_truth(groups, delta: float) -> None:
    """The reduction's epsilon (per-step groups, or one group: the scalar bound) is above the exact
    composition of its leaves' PMFs (both directions' larger) and within 1e-5 relative of it (three
    self-compositions' tail charges of 1e-15 each are 3e-5 of delta 1e-10: measured 1.3e-6 there)."""
    p = 0.1
    exact = max(exact_epsilon(*_groups_truth(groups, p, dn), delta) for dn in pc.DIRECTIONS)
    got = single_pass.certified_poisson_epsilon(groups, sampling=p, delta=delta, value_discretization=D)
    assert exact <= got <= exact * (1 + 1e-5)


def test_reduction_goes_through_the_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reduction's Poisson epsilon (scalar and per-step) and the cyclic-Poisson row's are
    pld_certify's certified ones: a certificate that adds 1 shows in each (a path that skipped it
    would not)."""
    from mfcli.accounting import reduction

    before = single_pass.dpsgd(sigma=1.0, sampling=0.1, steps=8, value_discretization=D, certified=True).epsilon
    het = reduction.poisson_heterogeneous_epsilon([(1.0, 4), (2.0, 4)], sampling=0.1, delta=1e-6,
                                                  value_discretization=D)
    from mfcli.accounting.multi import reduced_dpsgd
    from mfcli.model.participation import MinSeparation

    def cyclic() -> float:
        return reduced_dpsgd(bands=2, column_norm=1.0, n=16, schema=MinSeparation(separation=2), sigma=1.0,
                             sampling=0.1, delta=1e-6, value_discretization=D).epsilon

    cyc = cyclic()
    assert cyc == before  # ceil(16 / 2) = 8 steps at multiplier 1: the same DP-SGD
    real = pc.certified_epsilon
    monkeypatch.setattr(pc, "certified_epsilon", lambda node, delta: real(node, delta) + 1.0)
    assert cyclic() == cyc + 1.0
    r = reduction.reduced_epsilon(sampler="poisson", noise_multiplier=1.0, n=8, sampling=0.1, delta=1e-6,
                                  value_discretization=D)
    assert r.epsilon == before + 1.0
    assert "pld_certify" in r.as_dict()["method"]
    assert reduction.poisson_heterogeneous_epsilon([(1.0, 4), (2.0, 4)], sampling=0.1, delta=1e-6,
                                                   value_discretization=D) == het + 1.0


# ---------------------------------------------------------------------------------------------
# Balls-in-bins: the epochs' composition (upper end certified)


@pytest.mark.parametrize("which", ["tree", "dpsgd"])
@pytest.mark.parametrize("delta", [1e-6, 1e-10])
def test_balls_in_bins_epochs_against_long_double_truth(which: str, delta: float) -> None:
    """The upper end over 4 epochs (grid 1e-2) is above the exact composition of the epoch's
    pessimistic PLD (long double, direct) and within 1e-6 relative of it."""
    from mfcli.accounting import balls_in_bins as bib

    if which == "tree":
        r = bib.tree_balls_in_bins(n=8, sigma=1.0, epochs=4, delta=delta, grid=D)
        one, _ = bib.tree_plds(n=8, sigma=1.0, epochs=1, grid=D)
    else:
        r = bib.dpsgd_balls_in_bins(n=6, sigma=0.8, epochs=4, delta=delta, grid=D)
        one, _ = bib.dpsgd_plds(n=6, sigma=0.8, epochs=1, grid=D)
    node = pc.self_compose(pc.leaf(one), 4)
    exact = max(exact_epsilon(*truth(node, dn)[:3], delta) for dn in pc.DIRECTIONS)
    assert exact <= r.epsilon <= exact * (1 + TIGHT_EPS_REL)
    assert r.lower <= r.epsilon


def test_balls_in_bins_epochs_go_through_the_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several epochs: the upper end is pld_certify's (a certificate that adds 1 shows); one epoch:
    not used (its PMF is the leaf, checked by the direct hockey-stick bound)."""
    from mfcli.accounting import balls_in_bins as bib

    four = bib.tree_balls_in_bins(n=8, sigma=1.0, epochs=4, grid=D).epsilon
    one = bib.tree_balls_in_bins(n=8, sigma=1.0, epochs=1, grid=D).epsilon
    real = pc.certify
    monkeypatch.setattr(pc, "certify", lambda node, eps, delta, **kw: real(node, eps, delta, **kw) + 1.0)
    assert bib.tree_balls_in_bins(n=8, sigma=1.0, epochs=4, grid=D).epsilon == four + 1.0
    assert bib.tree_balls_in_bins(n=8, sigma=1.0, epochs=1, grid=D).epsilon == one


@pytest.mark.parametrize("direction", pc.DIRECTIONS)
@pytest.mark.parametrize("eps", [0.5, 3.0, 8.0])
def test_chernoff_theta_minimises_the_bound(direction: str, eps: float) -> None:
    """chernoff_theta's Newton root of F' against a grid search of F itself (the log Chernoff
    bound of the exact composition, 64 copies of the DP-SGD leaf, in long double): no grid
    point of 4000 over the range does better by more than 1e-9 |F| (a choice only -- any theta is
    valid -- but the certificate's tightness rests on it)."""
    node, _ = self_case(1.0, 0.1, 64)
    p = pc._direction(node.children[0].pld, direction)
    pos = p.probs > 0
    lg = np.log(p.probs[pos].astype(LD))
    loss = (np.flatnonzero(pos) + p.lower_loss).astype(LD) * LD(p.discretization)

    def F(th: float) -> float:
        v = lg + LD(th) * loss
        top = v.max()
        return float(64 * (top + np.log(np.exp(v - top).sum())) - LD(th) * LD(eps))

    got = pc.chernoff_theta(node, direction, eps)
    grid = np.geomspace(*pc._THETA_RANGE, 4000)
    best = min(F(float(t)) for t in grid)
    assert F(got) <= best + 1e-9 * abs(best)
