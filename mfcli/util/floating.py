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

Used by the balls-in-bins laws (:mod:`mfcli.accounting.balls_in_bins`) and by the certified
connect-the-dots PMFs of the mixture-of-Gaussians rows (:mod:`mfcli.accounting.mog_pld`).
"""
from __future__ import annotations

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
