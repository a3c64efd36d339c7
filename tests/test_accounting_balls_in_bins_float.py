"""Floating-point error of the balls-in-bins laws (mfcli.accounting.balls_in_bins), against an
independent high-precision derivation.

Each law carries ``rho`` (every mass within relative rho of the law exact arithmetic gives from
the same discrete choices) and ``dropped`` (an upper bound on that law's missing mass). The oracle
redoes the operations in mpmath at 600 bits (relative error 1e-180 per operation, so "exact"
against double precision) by plain double loops, not by the code's window sums: the pair step
over all (i, j), the convolution term by term, the tail cuts by exact cumulative sums. It checks,
bin by bin, |float - exact| <= rho exact; the dropped bound; the hockey-stick divergences and the
epsilon bracket at delta 1e-12 of the final PLDs against the exact laws'; and that the bound is
not loose by orders of magnitude where the arithmetic really errs (the kernel). A difference of
prefix sums (the code before) fails the same check: the test can fail. ndtr's accuracy, the one
assumption, is checked against mpmath. ``mfcli account`` at --delta 1e-10 and 1e-12 gives finite
brackets (it printed inf below 1e-10 when 1e-10 was added to delta)."""
from __future__ import annotations

import json
import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special
from typer.testing import CliRunner

from mfcli.accounting import balls_in_bins as bib
from mfcli.cli.app import app

CTX = mp.MPContext()
CTX.prec = 600
#: 160 bits (relative 1e-48) for Phi, far below double's 1e-16 and faster than 600 bits
PHI = mp.MPContext()
PHI.prec = 160
_KERNEL = bib._g_kernel


def _mp(x: float):
    return CTX.mpf(float(x))


# ---------------------------------------------------------------------------------------------
# The one assumption: ndtr's accuracy


def test_ndtr_within_its_assumed_allowance() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-14, 14, 4000), np.linspace(-14, 14, 2001)])
    got = special.ndtr(x)
    allowed = (bib.NDTR_ULPS_0 + bib.NDTR_ULPS_2 * x * x) * bib.UNIT_ROUNDOFF
    worst = 0.0
    for xi, gi, ai in zip(x.tolist(), got.tolist(), allowed.tolist(), strict=True):
        exact = PHI.ncdf(PHI.mpf(xi))
        worst = max(worst, float(abs(PHI.mpf(gi) / exact - 1)) / ai)
    assert worst <= 1.0
    assert worst > 0.05  # the allowance is not far above what ndtr really does


# ---------------------------------------------------------------------------------------------
# The noise kernel against mpmath at the exact grid boundaries


@pytest.mark.parametrize("sigma, h", [(1.0, 0.01), (4.0, 2.5e-3), (0.7, 0.05), (8.0, 2e-3)])
@pytest.mark.parametrize("up", [True, False])
def test_kernel_within_its_bound(sigma: float, h: float, up: bool) -> None:
    mean = (0.5 / sigma**2) * (1 if up else -1)  # both signs of the mean, through up and down
    sd = 1.0 / sigma
    k = bib._g_kernel(mean, sd, h, up)
    # the exact pair: sigma (a float) and h (a float) as real numbers; the kernel's own formulas
    s, hh = PHI.mpf(sigma), PHI.mpf(h)
    mu, sde = (1 / (2 * s * s)) * (1 if up else -1), 1 / s
    worst = 0.0
    for idx in range(k.p.size):
        m = k.lo + idx
        lo_t, hi_t = ((m - 1) * hh, m * hh) if up else (m * hh, (m + 1) * hh)
        a, b = (lo_t - mu) / sde, (hi_t - mu) / sde
        if up and idx == 0:
            exact = PHI.ncdf(b)
        elif not up and idx == k.p.size - 1:
            exact = 1 - PHI.ncdf(a)
        else:
            exact = PHI.ncdf(-a) - PHI.ncdf(-b) if a > 0 else PHI.ncdf(b) - PHI.ncdf(a)
        rel = float(abs(PHI.mpf(float(k.p[idx])) / exact - 1))
        assert rel <= k.rho, (idx, rel, k.rho)
        worst = max(worst, rel)
    top = (k.lo + k.p.size - 1) * hh if up else k.lo * hh
    tail = 1 - PHI.ncdf((top - mu) / sde) if up else PHI.ncdf((top - mu) / sde)
    assert tail <= k.dropped
    # the bound is the kernel's real error scale (ndtr's error amplified by the tail-difference)
    assert worst > 1e-3 * k.rho, (worst, k.rho)


# ---------------------------------------------------------------------------------------------
# The operations, one at a time, against double loops in mpmath


def _exact_pair(pa: list, pb: list, c_a: np.ndarray, c_b: np.ndarray, shift_min: int) -> list:
    """Every (i, j): A at i, B at j; the index max(i, j) + c_{|i - j|}, c_a where A is the max (ties
    with A), c_b where B is."""
    out = [CTX.mpf(0)] * (len(pa) - shift_min)
    for i, x in enumerate(pa):
        if not x:
            continue
        for j, y in enumerate(pb):
            if not y:
                continue
            k = i + int(c_a[i - j]) if i >= j else j + int(c_b[j - i])
            out[k - shift_min] += x * y
    return out


def _common(a: bib._Law, b: bib._Law) -> tuple[int, list, list]:
    lo, hi = min(a.lo, b.lo), max(a.hi, b.hi)
    pa = [CTX.mpf(0)] * (hi - lo + 1)
    pb = list(pa)
    for k, v in enumerate(a.p.tolist()):
        pa[a.lo - lo + k] = _mp(v)
    for k, v in enumerate(b.p.tolist()):
        pb[b.lo - lo + k] = _mp(v)
    return lo, pa, pb


def _pair_ref(a: bib._Law, b: bib._Law, h: float, up: bool, alpha: float) -> tuple[int, list]:
    lo, pa, pb = _common(a, b)
    size = len(pa)
    c_a = bib._phi_index(size - 1, h, up, alpha)
    c_b = c_a if alpha == 0.5 else bib._phi_index(size - 1, h, up, 1.0 - alpha)
    shift_min = int(min(c_a.min(), c_b.min()))
    return lo + shift_min, _exact_pair(pa, pb, c_a, c_b, shift_min)


def _max_rel(law: bib._Law, lo: int, exact: list) -> float:
    """The largest |float - exact| / exact over the bins (inf where exact is 0 but float is not),
    the law first aligned with the exact list; entries the float law dropped (below FLOOR) skip."""
    worst = 0.0
    assert law.lo >= lo and law.hi <= lo + len(exact) - 1
    for k, e in enumerate(exact):
        idx = lo + k - law.lo
        got = float(law.p[idx]) if 0 <= idx < law.p.size else 0.0
        if got == 0.0 and e < bib.FLOOR:
            continue
        worst = max(worst, math.inf if e == 0 else float(abs(_mp(got) / e - 1)))
    return worst


def _random_law(rng: np.random.Generator, size: int, span: float, zeros: float) -> bib._Law:
    """Masses over many orders of magnitude (10^-span..1), some exact zeros, total below 1."""
    p = 10.0 ** rng.uniform(-span, 0, size)
    p[rng.random(size) < zeros] = 0.0
    p[0] = max(p[0], 1e-3)
    return bib._Law(int(rng.integers(-40, 40)), p / (1.5 * p.sum()))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), size_a=st.integers(1, 45), size_b=st.integers(1, 45),
       h=st.sampled_from([0.1, 0.05, 0.02]), up=st.booleans(), alpha=st.sampled_from([0.5, 2 / 3, 3 / 5, 4 / 7]),
       span=st.sampled_from([3.0, 40.0, 140.0]))
def test_pair_within_its_bound(seed: int, size_a: int, size_b: int, h: float, up: bool, alpha: float,
                               span: float) -> None:
    rng = np.random.default_rng(seed)
    a, b = _random_law(rng, size_a, span, 0.2), _random_law(rng, size_b, span, 0.2)
    got = bib._pair(a, b, h, up, alpha)
    lo, exact = _pair_ref(a, b, h, up, alpha)
    assert _max_rel(got, lo, exact) <= got.rho
    assert got.rho < 1e-12


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), size_a=st.integers(1, 60), size_k=st.integers(1, 60),
       span=st.sampled_from([3.0, 40.0, 140.0]))
def test_convolution_within_its_bound(seed: int, size_a: int, size_k: int, span: float) -> None:
    rng = np.random.default_rng(seed)
    a, k = _random_law(rng, size_a, span, 0.1), _random_law(rng, size_k, span, 0.1)
    got = bib._convolve(a, k)
    exact = [CTX.mpf(0)] * (size_a + size_k - 1)
    for i, x in enumerate(a.p.tolist()):
        for j, y in enumerate(k.p.tolist()):
            exact[i + j] += _mp(x) * _mp(y)
    assert _max_rel(got, a.lo + k.lo, exact) <= got.rho


def _old_window_pair(a: bib._Law, b: bib._Law, h: float, up: bool) -> bib._Law:
    """The pair step as it was: window sums as differences of prefix sums (np.cumsum)."""
    lo, hi = min(a.lo, b.lo), max(a.hi, b.hi)
    size = hi - lo + 1
    pa, pb = np.zeros(size), np.zeros(size)
    pa[a.lo - lo:a.lo - lo + a.p.size] = a.p
    pb[b.lo - lo:b.lo - lo + b.p.size] = b.p
    c = bib._phi_index(size - 1, h, up)
    shift_min = int(c.min())
    out = np.zeros(size - shift_min)
    for px, py, d_start in ((pa, pb, 0), (pb, pa, 1)):
        cy = np.concatenate(([0.0], np.cumsum(py)))
        for d1, d2 in bib._runs(c, d_start):
            w = cy[1:size - d1 + 1].copy()
            if d2 - 1 - d1 < w.size:
                w[d2 - 1 - d1:] -= cy[:size - d2 + 1]
            k0 = int(c[d1]) - shift_min + d1
            out[k0:k0 + w.size] += px[d1:] * w
    return bib._Law(lo + shift_min, out)


def test_prefix_differences_fail_the_check() -> None:
    """A Gaussian-like law with a tail far below 1e-16: the new window sums keep every mass within
    rho; differences of prefix sums (the code before) miss the tail's masses entirely."""
    x = np.arange(-110, 111) * 0.1  # masses down to 1e-27
    p = np.exp(-x**2 / 2)
    law = bib._Law(-110, p / p.sum())
    new = bib._pair(law, law, 0.1, True)
    lo, exact = _pair_ref(law, law, 0.1, True, 0.5)
    assert _max_rel(new, lo, exact) <= new.rho
    old = _old_window_pair(law, law, 0.1, True)
    assert _max_rel(old, lo, exact) > 1e-3


# ---------------------------------------------------------------------------------------------
# Whole propagations against the same propagation in mpmath


def _ref_trim(lo: int, p: list, up: bool, tail: float) -> tuple[int, list, object]:
    """bib._trim and bib._floor in exact arithmetic; returns (lo, masses, dropped mass)."""
    c = list(np.cumsum(np.array(p, dtype=object)))
    rc = list(np.cumsum(np.array(p[::-1], dtype=object)))
    if not any(v > 0 for v in p):
        return lo, [CTX.mpf(0)], CTX.mpf(0)
    lo_k = next((k for k, v in enumerate(c) if v > tail), len(p))
    hi_k = len(p) - 1 - next((k for k, v in enumerate(rc) if v > tail), len(p))
    lo_k = min(lo_k, len(p) - 1)
    hi_k = max(hi_k, lo_k)
    q = list(p[lo_k:hi_k + 1])
    dropped = CTX.mpf(0)
    if up:
        if lo_k > 0:
            q[0] += c[lo_k - 1]
        if hi_k < len(p) - 1:
            dropped += rc[len(p) - 2 - hi_k]
    else:
        if hi_k < len(p) - 1:
            q[-1] += rc[len(p) - 2 - hi_k]
        if lo_k > 0:
            dropped += c[lo_k - 1]
    lo2, q2, d2 = _ref_floor(lo + lo_k, q)
    return lo2, q2, dropped + d2


def _ref_floor(lo: int, p: list) -> tuple[int, list, object]:
    gone = sum((v for v in p if 0 < v < bib.FLOOR), CTX.mpf(0))
    return lo, [CTX.mpf(0) if 0 < v < bib.FLOOR else v for v in p], gone


class _Ref:
    """A law in mpmath: (lo, masses, exact missing mass)."""

    def __init__(self, lo: int, p: list, missing) -> None:
        self.lo, self.p, self.missing = lo, p, missing

    @classmethod
    def of(cls, law: bib._Law) -> _Ref:
        return cls(law.lo, [_mp(v) for v in law.p.tolist()], _mp(law.dropped))


def _ref_pair(a: _Ref, b: _Ref, h: float, up: bool, alpha: float) -> _Ref:
    lo, out = _pair_exact_laws(a, b, h, up, alpha)
    lo, out, gone = _ref_floor(lo, out)
    return _Ref(lo, out, 1 - (1 - a.missing) * (1 - b.missing) + gone)


def _pair_exact_laws(a: _Ref, b: _Ref, h: float, up: bool, alpha: float) -> tuple[int, list]:
    lo, hi = min(a.lo, b.lo), max(a.lo + len(a.p), b.lo + len(b.p)) - 1
    pa = [CTX.mpf(0)] * (hi - lo + 1)
    pb = list(pa)
    pa[a.lo - lo:a.lo - lo + len(a.p)] = a.p
    pb[b.lo - lo:b.lo - lo + len(b.p)] = b.p
    c_a = bib._phi_index(len(pa) - 1, h, up, alpha)
    c_b = c_a if alpha == 0.5 else bib._phi_index(len(pa) - 1, h, up, 1.0 - alpha)
    shift_min = int(min(c_a.min(), c_b.min()))
    return lo + shift_min, _exact_pair(pa, pb, c_a, c_b, shift_min)


def _ref_conv(a: _Ref, k: _Ref) -> _Ref:
    out = [CTX.mpf(0)] * (len(a.p) + len(k.p) - 1)
    for i, x in enumerate(a.p):
        if x:
            for j, y in enumerate(k.p):
                out[i + j] += x * y
    return _Ref(a.lo + k.lo, out, 1 - (1 - a.missing) * (1 - k.missing))


def _ref_trim_law(x: _Ref, up: bool) -> _Ref:
    lo, p, gone = _ref_trim(x.lo, x.p, up, bib.TAIL_CUT)
    return _Ref(lo, p, x.missing + gone)


def _ref_tree(height: int, sigma: float, h: float) -> dict:
    sd, m = 1.0 / sigma, 0.5 / sigma**2
    laws = {}
    for up in (True, False):
        kq, kp = _Ref.of(_exact_kernel(-m, sd, h, up)), _Ref.of(_exact_kernel(m, sd, h, up))
        q, p = _ref_trim_law(kq, up), _ref_trim_law(kp, up)
        for _ in range(height):
            pq, qq = _ref_pair(p, q, h, up, 0.5), _ref_pair(q, q, h, up, 0.5)
            p, q = _ref_trim_law(_ref_conv(pq, kp), up), _ref_trim_law(_ref_conv(qq, kq), up)
        laws[up] = (p, q)
    return {"p_up": laws[True][0], "q_up": laws[True][1], "p_down": laws[False][0], "q_down": laws[False][1]}


def _ref_allocation(n: int, sigma: float, h: float) -> dict:
    """The average of m leaf ratios as the average of its first ceil(m/2) and last floor(m/2),
    by recursion (memoised per size)."""
    sd, m0 = 1.0 / sigma, 0.5 / sigma**2

    def laws_of(m: int, up: bool, memo: dict) -> tuple:
        if m in memo:
            return memo[m]
        if m == 1:
            memo[m] = tuple(_ref_trim_law(_Ref.of(_exact_kernel(s * m0, sd, h, up)), up) for s in (1, -1))
            return memo[m]
        ml, mr = (m + 1) // 2, m // 2
        (pl, ql), (pr, qr) = laws_of(ml, up, memo), laws_of(mr, up, memo)
        alpha = ml / m  # the float weight decides c_d, as in the code; the mixture takes the exact one
        q = _ref_trim_law(_ref_pair(ql, qr, h, up, alpha), up)
        if ml == mr:
            p = _ref_trim_law(_ref_pair(pl, qr, h, up, 0.5), up)
        else:
            x, y = _ref_pair(pl, qr, h, up, alpha), _ref_pair(ql, pr, h, up, alpha)
            wa, wb = CTX.mpf(ml) / m, CTX.mpf(mr) / m
            lo = min(x.lo, y.lo)
            out = [CTX.mpf(0)] * (max(x.lo + len(x.p), y.lo + len(y.p)) - lo)
            for r, w in ((x, wa), (y, wb)):
                for k, v in enumerate(r.p):
                    out[r.lo - lo + k] += w * v
            p = _ref_trim_law(_Ref(lo, out, wa * x.missing + wb * y.missing), up)
        memo[m] = (p, q)
        return memo[m]

    (pu, qu), (pd, qd) = laws_of(n, True, {}), laws_of(n, False, {})
    return {"p_up": pu, "q_up": qu, "p_down": pd, "q_down": qd}


def _exact_kernel(mean: float, sd: float, h: float, up: bool) -> bib._Law:
    """The code's float kernel, taken as the exact input of both propagations (its own error is
    the kernel test's), so the comparison isolates the propagation's arithmetic."""
    k = _KERNEL(mean, sd, h, up)
    return bib._Law(k.lo, k.p, 0.0, k.dropped)


def _hockey(lo: int, p: list, missing, h: float, sign: int, eps: float):
    """delta(eps) = missing + sum p_k (1 - e^(eps - loss_k))_+, loss_k = sign (lo + k) h."""
    total = CTX.mpf(missing)
    for k, v in enumerate(p):
        loss = sign * (lo + k) * _mp(h)
        if loss > eps:
            total += v * (1 - CTX.exp(eps - loss))
    return total


def _pmf_hockey(pmf, eps: float):
    return _hockey(pmf.lower_loss, [_mp(v) for v in pmf.probs.tolist()], _mp(pmf.infinity_mass),
                   pmf.discretization, +1, eps)


def _ref_epsilon(delta_of, delta: float) -> tuple[float, float]:
    """(lo, hi) around the exact epsilon: delta_of(lo) > delta (or lo = 0), delta_of(hi) <= delta."""
    lo, hi = 0.0, 60.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
    return lo, hi


CASES = [("tree", 2, 2.0, 0.1), ("tree", 4, 4.0, 0.1), ("tree", 8, 4.0, 0.1),
         ("dpsgd", 3, 2.0, 0.1), ("dpsgd", 5, 4.0, 0.1), ("dpsgd", 8, 3.0, 0.1)]


@pytest.mark.parametrize("kind, n, sigma, h", CASES, ids=[f"{c[0]}-n{c[1]}" for c in CASES])
def test_propagation_against_mpmath(kind: str, n: int, sigma: float, h: float, monkeypatch) -> None:
    monkeypatch.setattr(bib, "_g_kernel", lambda *a: _exact_kernel(*a))
    if kind == "tree":
        got, ref = bib._root_laws(bib.tree_height(n), sigma, h), _ref_tree(bib.tree_height(n), sigma, h)
    else:
        got, ref = bib._allocation_laws(n, sigma, h), _ref_allocation(n, sigma, h)
    for name, r in ref.items():
        law = getattr(got, name)
        worst = _max_rel(law, r.lo, r.p)
        assert worst <= law.rho, (name, worst, law.rho)
        assert r.missing <= law.dropped, name
        assert law.rho < 1e-11  # the propagation's own bound, the kernel exact here
        assert law.rho < 1e3 * max(worst, bib.UNIT_ROUNDOFF)  # worst case, but not absurdly above the real error
    # the PLDs: the pessimistic one's divergences >= the exact U/D laws', the optimistic one's <=
    upper, lower = bib._plds(got, h)
    exact_remove_up = lambda e: _hockey(ref["p_up"].lo, ref["p_up"].p, ref["p_up"].missing, h, +1, e)  # noqa: E731
    exact_add_up = lambda e: _hockey(ref["q_down"].lo, ref["q_down"].p, ref["q_down"].missing, h, -1, e)  # noqa: E731
    exact_remove_low = lambda e: _hockey(ref["p_down"].lo, ref["p_down"].p, 0, h, +1, e)  # noqa: E731
    exact_add_low = lambda e: _hockey(ref["q_up"].lo, ref["q_up"].p, 0, h, -1, e)  # noqa: E731
    for eps in np.linspace(0.0, 8.0, 9).tolist():
        assert _pmf_hockey(upper.remove, eps) >= exact_remove_up(eps), eps
        assert _pmf_hockey(upper.add_pmf, eps) >= exact_add_up(eps), eps
        assert _pmf_hockey(lower.remove, eps) <= exact_remove_low(eps), eps
        assert _pmf_hockey(lower.add_pmf, eps) <= exact_add_low(eps), eps
        for pmf in (upper.remove, upper.add_pmf, lower.remove, lower.add_pmf):  # the certified evaluation
            assert bib._hockey_bound(pmf, eps, False) <= _pmf_hockey(pmf, eps) <= bib._hockey_bound(pmf, eps, True)
    # the bracket at delta 1e-12 and 1e-14 around the exact laws' epsilons (both directions), each
    # end certified against the PLD it comes from
    for delta in (1e-12, 1e-14):
        eps_u = bib._certified_upper(upper, max(upper.get_epsilon_for_delta(delta), 0.0), delta)
        eps_l = bib._certified_lower(lower, max(lower.get_epsilon_for_delta(delta), 0.0), delta)
        assert max(_pmf_hockey(upper.remove, eps_u), _pmf_hockey(upper.add_pmf, eps_u)) <= delta
        assert eps_l == 0 or max(_pmf_hockey(lower.remove, eps_l), _pmf_hockey(lower.add_pmf, eps_l)) > delta
        exact_u = max(_ref_epsilon(exact_remove_up, delta)[0], _ref_epsilon(exact_add_up, delta)[0])
        exact_l = max(_ref_epsilon(exact_remove_low, delta)[1], _ref_epsilon(exact_add_low, delta)[1])
        assert math.isfinite(eps_u) and eps_u >= exact_u, (delta, eps_u, exact_u)
        assert eps_l <= exact_l, (delta, eps_l, exact_l)
        assert 0 < eps_l <= eps_u


# ---------------------------------------------------------------------------------------------
# End to end: small deltas give finite brackets


@pytest.mark.parametrize("delta", ["1e-10", "1e-12"])
def test_account_small_delta_is_finite(delta: str) -> None:
    out = CliRunner().invoke(app, ["account", "--strategy", "tree", "--n", "16", "--sigma", "2", "--batching",
                                   "balls-in-bins", "--delta", delta, "--json", "-q"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["settings"]
    for name in ("balls-in-bins-tree", "balls-in-bins-dp-sgd"):
        lower, upper = rows[name]["bracket"]
        assert math.isfinite(upper) and 0 < lower <= upper < 1.05 * lower, (name, lower, upper)
    # the tree's guarantee below the single-pass bound at the same delta (amplification)
    assert rows["balls-in-bins-tree"]["epsilon"] < rows["single-pass"]["epsilon"]


def test_bound_stays_small_in_use() -> None:
    """The bounds at the CLI's grids: relative, far below what would move a printed digit."""
    laws = bib._root_laws(bib.tree_height(1024), 4.0, 1.3e-3)
    assert max(x.rho for x in (laws.p_up, laws.q_up, laws.p_down, laws.q_down)) < 1e-6
    assert max(laws.p_up.dropped, laws.q_down.dropped) < 1e-20
