"""Printing privacy numbers on the safe side (shared by the command modules that print them)."""
from __future__ import annotations

import math
from typing import Any


def pessimistic(v: Any, *, down: bool = False, digits: int = 6) -> str:
    """``digits`` significant digits, rounded UP (upper bounds: epsilon, rho-zCDP, mu-GDP, delta
    parts, sensitivity, calibrated sigma) or DOWN (lower bounds: the MMCC lower bound, the lower
    end of a calibration bracket, the noise multiplier sigma/sens), so that a printed privacy
    number is never on the optimistic side of the computed one."""
    if v is None:
        return "-"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = float(v)
        if not math.isfinite(v) or v == 0:
            return "inf" if v == float("inf") else f"{v:g}"
        text = f"{v:.{digits}g}"
        if float(text) == v:  # v has at most ``digits`` significant digits: it prints as itself
            return text
        exponent = math.floor(math.log10(abs(v)))
        if 10.0**exponent > abs(v):  # log10 rounded up across a power of ten (999999999999.998)
            exponent -= 1
        scale = 10.0 ** (exponent - (digits - 1))
        r = (math.floor if down else math.ceil)(v / scale) * scale
        # The printed decimal must stay on the safe side of v after float formatting too.
        text = f"{r:.{digits}g}"
        step = (-1 if down else 1) * scale
        while (float(text) < v) if not down else (float(text) > v):
            r += step
            text = f"{r:.{digits}g}"
        return text
    return str(v)
