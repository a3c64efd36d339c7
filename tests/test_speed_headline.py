"""The headline account's speed work (docs/performance.md, "The headline account, sixth round")
against independent computations: the privacy-loss inversion's early stop (Halley steps with an
error bound) against mpmath's root at 40 digits, and the FFT law of W with its phase written in
place against the complex expression it replaces, bit for bit."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
from mog_cases import MMCC_LIKE_ROWS, inversion_problem

from mfcli.accounting import mmcc as M
from mfcli.accounting import mog_pld

_ROWS = [*MMCC_LIKE_ROWS, (0.7, [0.0, 0.3, 1.0], [0.5, 0.3, 0.2])]


@pytest.mark.parametrize("sigma,sens,probs", _ROWS)
@pytest.mark.parametrize("remove", [True, False])
def test_inversion_stops_within_a_few_ulps_of_the_exact_root(sigma, sens, probs, remove) -> None:
    """``_invert`` stops as soon as its error estimate allows (one evaluation for most points):
    every root lies within 1e-13 (1 + |x|) of the root mpmath finds at 40 digits where the loss is
    not flat (|dL/dx| > 1e-4), over the PLD's whole eps range (a stop at an estimated error of
    1e-9 (1 + |x|) instead of 1e-14 fails this)."""
    loss, lower_x, upper_x, eps = inversion_problem(sigma, sens, probs, remove, 61)
    s, q = loss.s, loss.q
    ours = mog_pld._invert(loss, eps, lower_x, upper_x)
    _, slope, _ = loss.value_slope_curvature(ours)
    steep = np.abs(slope) > 1e-4
    assert steep.sum() > 10
    mpmath.mp.dps = 40
    v = mpmath.mpf(float(sigma)) ** 2
    sign = -1 if remove else 1
    terms = [(mpmath.mpf(float(si)), mpmath.mpf(float(qi))) for si, qi in zip(s, q, strict=True)]

    def loss_mp(x):
        lse = mpmath.log(mpmath.fsum(qi * mpmath.exp((sign * si * x - si * si / 2) / v) for si, qi in terms))
        return lse if remove else -lse

    for x, e in zip(ours[steep], eps[steep], strict=True):
        root = mpmath.findroot(lambda t, e=e: loss_mp(t) - mpmath.mpf(float(e)), mpmath.mpf(float(x)))
        assert abs(float(root) - x) <= 1e-13 * (1 + abs(x))


@pytest.mark.parametrize("p,length", [(0.01, 256), (0.3, 512), (0.9, 64)])
def test_w_pmf_fft_equals_the_complex_expression(p: float, length: int) -> None:
    """The law of W by FFT, its phase e^re (cos im + i sin im) written into the real and imaginary
    parts in place, equals the complex expression exp(re) * (cos(im) + 1j * sin(im)) bit for bit."""
    rng = np.random.default_rng(4)
    counts = rng.integers(0, 6, size=(300, 22))
    counts[:, 0] = 0
    logmag, ang = M._fft_factors(counts.shape[1], p, length)
    cf = counts.astype(np.float64)
    re, im = cf @ logmag, cf @ ang
    want = np.fft.irfft(np.exp(re) * (np.cos(im) + 1j * np.sin(im)), n=length, axis=1)
    np.maximum(want, 0.0, out=want)
    assert M._w_pmf_fft(counts, p, length).tobytes() == want.tobytes()


def _tails_mp(y: float, s: np.ndarray, q: np.ndarray, sigma: float) -> tuple[float, float]:
    cdf = mpmath.fsum(mpmath.mpf(float(qi)) * mpmath.ncdf((mpmath.mpf(float(y)) + mpmath.mpf(float(si)))
                                                        / mpmath.mpf(sigma)) for si, qi in zip(s, q, strict=True))
    sf = mpmath.fsum(mpmath.mpf(float(qi)) * mpmath.ncdf(-(mpmath.mpf(float(y)) + mpmath.mpf(float(si)))
                                                       / mpmath.mpf(sigma)) for si, qi in zip(s, q, strict=True))
    return float(cdf), float(sf)


#: _ROWS and a mixture with a gap of many sigma between its atoms and a tiny upper atom: between
#: them both sums are small although a q-mass lies on each side of the split.
_GAPPED = [*_ROWS, (0.5, np.array([0.0, 5.0]), np.array([1 - 1e-12, 1e-12])),
           (0.5, np.array([0.0, 0.1, 6.0, 6.2]), np.array([0.6, 0.4 - 3e-11, 1e-11, 2e-11]))]


@pytest.mark.parametrize("sigma,sens,probs", _GAPPED)
def test_mixture_tails_have_full_relative_precision(sigma, sens, probs) -> None:
    """Both mixture tails of ``_paired_deltas`` (one erfc per entry, running sums split at the sign
    change of t) against mpmath at 30 digits, to 1e-13 relative, at points y where either is tiny
    (every t of one sign), where only the last atoms are on the upper side, in a gap of many sigma
    below a tiny upper atom (both sums ~1e-12), and in between. Forming the q-mass above the split
    as 1 minus the mass below fails this (its error is absolute, ~1e-16)."""
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    mpmath.mp.dps = 30
    ys = np.concatenate([
        np.linspace(-s.max() - 8 * sigma, 8 * sigma, 23),
        -(s[-3:] - 1e-3),  # just below the last atoms: only they have t >= 0
        -(s[:3] + 1e-3),  # just above the first atoms: only they have t < 0
        -(s[-1] - 0.1 * sigma) + np.zeros(1),  # in a gap below the last atom (_GAPPED)
    ])
    cdf, sf, _, _ = mog_pld._mixture_tails(ys, s, q, float(sigma))
    for y, c, f in zip(ys, cdf, sf, strict=True):
        want_c, want_f = _tails_mp(y, s, q, float(sigma))
        assert c == pytest.approx(want_c, rel=1e-13, abs=1e-300)
        assert f == pytest.approx(want_f, rel=1e-13, abs=1e-300)
