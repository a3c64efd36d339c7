"""The elementary-function assumption of mfcli.util.floating (ELEMENTARY_ULPS) against mpmath:
numpy's exp, log, expm1, log1p, cos, sin, hypot, arctan2 and the complex exp of an imaginary
argument (MMCC's FFT law of W forms its factors with it) within ELEMENTARY_ULPS units of roundoff
of the exact value, on random arguments over the ranges the accounting uses (fixed seed). Not a
proof -- the model is an assumption -- but a platform whose libm broke it would fail here
(measured on glibc: at most 1.2 u)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mfcli.util.floating import ELEMENTARY_ULPS, UNIT_ROUNDOFF

mp = pytest.importorskip("mpmath")
N = 800


def _rel_u(got: float, exact) -> float:
    """|got - exact| / (u |exact|), exact an mpmath number (not 0)."""
    return float(abs(mp.mpf(float(got)) - exact) / (abs(exact) * UNIT_ROUNDOFF))


rng = np.random.default_rng(20261202)
UNARY = [
    ("exp", np.exp, mp.exp, rng.uniform(-700.0, 700.0, N)),
    ("log", np.log, mp.log, np.exp(rng.uniform(-700.0, 700.0, N))),
    ("expm1", np.expm1, mp.expm1, rng.uniform(-40.0, 40.0, N)),
    ("log1p", np.log1p, mp.log1p, np.concatenate([rng.uniform(-0.999, 10.0, N // 2), rng.uniform(-1e-8, 1e-8, N // 2)])),
    ("cos", np.cos, mp.cos, rng.uniform(0.0, 2 * math.pi * 300, N)),
    ("sin", np.sin, mp.sin, rng.uniform(0.0, 2 * math.pi * 300, N)),
]


@pytest.mark.parametrize("name, ours, exact, xs", UNARY, ids=[c[0] for c in UNARY])
def test_unary_functions_within_the_model(name: str, ours, exact, xs: np.ndarray) -> None:
    mp.mp.prec = 120
    got = ours(xs)
    worst = max(_rel_u(g, exact(mp.mpf(float(x)))) for g, x in zip(got, xs, strict=True))
    assert worst <= ELEMENTARY_ULPS, (name, worst)


def test_hypot_arctan2_and_imaginary_exp_within_the_model() -> None:
    mp.mp.prec = 120
    a, b = rng.uniform(-1.0, 1.0, N), rng.uniform(-1.0, 1.0, N)
    h, t = np.hypot(a, b), np.arctan2(b, a)
    for hv, tv, x, y in zip(h, t, a, b, strict=True):
        xm, ym = mp.mpf(float(x)), mp.mpf(float(y))
        assert _rel_u(hv, mp.sqrt(xm * xm + ym * ym)) <= ELEMENTARY_ULPS
        assert _rel_u(tv, mp.atan2(ym, xm)) <= ELEMENTARY_ULPS
    th = rng.uniform(0.0, 2 * math.pi * 300, N)
    z = np.exp(-1j * th)
    for zv, t_ in zip(z, th, strict=True):
        tm = mp.mpf(float(t_))
        assert _rel_u(zv.real, mp.cos(tm)) <= ELEMENTARY_ULPS
        assert _rel_u(zv.imag, -mp.sin(tm)) <= ELEMENTARY_ULPS
