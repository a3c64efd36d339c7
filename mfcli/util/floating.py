"""The floating-point model that mfcli's proven error bounds use, stated once.

IEEE double precision, round to nearest: fl(x op y) = (x op y)(1 + e) with |e| <= u =
:data:`UNIT_ROUNDOFF` while the result is a normal number (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2.2). A sum of non-negative terms in which no term meets more than k
roundings has relative error at most gamma_k = k u / (1 - k u), whatever the order (:func:`gamma`;
Higham 3.1). Two library functions are *assumed*, not proven, to be accurate to a stated
number of units of roundoff, and tests check the assumption against mpmath:

* scipy.special's ``ndtr(x)`` and ``erfc(z)`` (Cephes): within (:data:`NDTR_ULPS_0` +
  :data:`NDTR_ULPS_2` t^2) u relatively, t the standard normal argument (t = x for ndtr,
  t = sqrt(2) z for erfc): their error grows with t^2 through exp(-t^2 / 2)
  (tests/test_accounting_balls_in_bins_float.py and tests/test_accounting_mog_pld_roundoff.py).
  Where the value is below the smallest normal number (2^-1022) they have no relative accuracy
  (measured: up to 1e-310 absolute); callers treat such values as known to 2^-1022 absolute;
* numpy's ``exp``, ``log``, ``expm1``, ``log1p``, ``cos``, ``sin``, ``hypot``, ``arctan2`` and the
  complex ``exp`` of an imaginary argument: within :data:`ELEMENTARY_ULPS` u (glibc's are within
  2; measured at most 1.2 u against mpmath, tests/test_util_floating.py).

One computation with a proven bound lives here too: :func:`integer_power`, y^k by square-and-multiply,
within :func:`integer_power_rounding` relative plus :func:`integer_power_underflow` absolute (no
assumption beyond the model above: numpy's own complex ``**`` calls cpow for k >= 100).

Used by the balls-in-bins laws (:mod:`mfcli.accounting.balls_in_bins`), the certified
connect-the-dots PMFs of the mixture-of-Gaussians rows (:mod:`mfcli.accounting.mog_pld`), MMCC's
tail bounds (:mod:`mfcli.accounting.mmcc`) and the composition certificate
(:mod:`mfcli.accounting.pld_certify`, whose FFT model is its own assumption).
"""
from __future__ import annotations

import math

import numpy as np

from mfcli.errors import MfcliError

#: Unit roundoff of IEEE double precision, round to nearest.
UNIT_ROUNDOFF = 2.0**-53

#: scipy.special.ndtr / erfc assumed within (NDTR_ULPS_0 + NDTR_ULPS_2 t^2) units of roundoff,
#: relatively, t the standard normal argument: an assumption, not a theorem (Cephes' erf/erfc),
#: checked against mpmath by the tests named in the module docstring.
NDTR_ULPS_0, NDTR_ULPS_2 = 32.0, 8.0

#: numpy's exp, log, expm1, log1p, cos, sin, hypot, arctan2 (and exp of an imaginary argument)
#: assumed within this many units of roundoff (glibc: 2; tests/test_util_floating.py).
ELEMENTARY_ULPS = 4.0


def gamma(k: int) -> float:
    """gamma_k = k u / (1 - k u): a sum of k + 1 non-negative terms, in any order, or a chain of
    k roundings, has relative error at most gamma_k (Higham, Accuracy and Stability, 3.1).

    >>> gamma(0)
    0.0
    >>> 0 < gamma(10) < 1.2e-15
    True
    """
    ku = k * UNIT_ROUNDOFF
    if ku >= 0.5:
        raise MfcliError("a floating-point error bound was asked for a computation too large for it")
    return ku / (1.0 - ku)


#: An absolute bound on the error of one complex product whose parts underflow: each of its four
#: real products is within 2^-1075 of exact when its result is subnormal, and the sums of
#: subnormal numbers are exact, so |fl(a b) - a b (1 + e)| <= sqrt2 2 2^-1075 < 2^-1072.
PRODUCT_UNDERFLOW = 2.0**-1072


def integer_power(y: np.ndarray, k: int) -> np.ndarray:
    """y^k elementwise (a new array) by square-and-multiply: at most 2 log2 k products per element.

    Why not ``y ** k``: numpy powers a complex array by binary powering only for exponents below
    100 and calls cpow (exp(k log y)) above, about 30 times slower at k = 256 and with an error
    that rests on an assumed model of cexp and clog; this function's error is proven for every k
    (:func:`integer_power_rounding`). The products are numpy's element-wise multiplications.

    >>> import numpy as np
    >>> bool(np.allclose(integer_power(np.array([1j, 2.0]), 5), [1j, 32.0]))
    True
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise MfcliError(f"an integer power needs an exponent k >= 1, got {k!r}")
    k = int(k)
    square = np.array(y, copy=True)
    result: np.ndarray | None = None
    while True:
        if k & 1:
            if result is None:
                result = square.copy()
            else:
                np.multiply(result, square, out=result)
        k >>= 1
        if not k:
            break
        np.multiply(square, square, out=square)
    assert result is not None
    return result


def integer_power_rounding(k: int) -> float:
    """Relative error bound of :func:`integer_power`'s y^k where no product underflows:
    (1 + e)^(k - 1) - 1, e = sqrt2 gamma_2 for complex products (Higham Lemma 3.5; above u, so it
    covers real ones too).

    Why k - 1 and not the number of products: every computed power is y^j (1 + t) with |1 + t| at
    most (1 + e)^(j - 1), by induction over the products: fl(y^i (1 + t_i) y^j (1 + t_j)) = y^(i + j)
    (1 + t_i)(1 + t_j)(1 + e'), |e'| <= e, exponents (i - 1) + (j - 1) + 1 = i + j - 1 (an error
    in an early square is raised by every later squaring). Products whose parts underflow add an
    absolute error: :func:`integer_power_underflow`.

    >>> 0 < integer_power_rounding(256) < 1e-13
    True
    """
    if k < 1:
        raise MfcliError(f"an integer power needs an exponent k >= 1, got {k!r}")
    e = math.sqrt(2) * gamma(2)
    return math.expm1((k - 1) * math.log1p(e)) * 1.01 if k > 1 else 0.0


def integer_power_underflow(k: int, m: float) -> float:
    """An absolute bound on what underflow adds to :func:`integer_power`'s y^k per element, for
    |y| <= m (+inf where the bound is above 2^-600, where its proof below does not hold).

    Why: write every computed power as P_j = y^j (1 + t_j) + E_j, with |y^j (1 + t_j)| <= M^j, M =
    max(1, m) (1 + 1e-6) (the relative errors are below 1e-6, :func:`integer_power_rounding`).
    A product adds at most eta = :data:`PRODUCT_UNDERFLOW` and carries E_i y^j + E_j y^i + E_i E_j
    times 1 + e (e = sqrt2 gamma_2), so by induction over the products |E_j| <= B_j = 2 (j - 1) eta
    (M (1 + e))^(j - 1): the two carried terms give 2 (i + j - 2) eta (M (1 + e))^(i + j - 1), and
    eta + (1 + e) E_i E_j <= 2 eta (M >= 1) when every B is at most 2^-600."""
    if k <= 1:
        return 0.0
    if integer_power_rounding(k) > 1e-6:  # the relative errors no longer fit inside M (k above ~3e9)
        return math.inf
    e = math.sqrt(2) * gamma(2)
    big_m = max(1.0, m) * (1 + 1e-6)
    log2_b = math.log2(2 * (k - 1) * PRODUCT_UNDERFLOW) + (k - 1) * math.log2(big_m * (1 + e))
    if log2_b > -600:
        return math.inf
    return 2.0**log2_b * (1 + 1e-9)
