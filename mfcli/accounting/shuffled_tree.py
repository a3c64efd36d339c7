"""The binary-tree mechanism over one shuffled epoch (docs/accounting.md, "Binary tree over one
shuffled epoch").

Setting: n steps, one epoch, every example in exactly one step (its position is given by a
uniformly random shuffle); C is the binary-tree encoder (every column has L + 1 ones for 2^L
leaves, so sens(C) = sqrt(L + 1)) and the noise has standard deviation sigma per node.

What is reported:

1. Always, the valid single-epoch bound: a Gaussian mechanism with sensitivity sens(C) =
   sqrt(L + 1) and noise sigma. It holds for ANY order of the data (shuffled or not), so shuffling
   can only make the true epsilon smaller.
2. The amplified bound sketched in section 5 of Choquette-Choo et al. 2024 (arXiv:2310.15526)
   (split level h, top levels as an unamplified Gaussian, lower levels as shuffles of M Gaussian
   local reports bounded by the Feldman-McMillan-Talwar closed form) is NOT reported. Its steps
   have not been checked against their sources (the paper states the tree result without
   constants, and the shuffling bound comes from another paper), and two of them need more than a
   black-box use of the closed form: FMT's theorem is stated for pure eps0-DP randomizers (a
   Gaussian report is only (eps0, delta0)-DP), and a level whose posterior over the example's
   node is merely bounded by e^eta / M is not a uniform shuffle. No formula ships before it is
   checked against its paper; until then mfcli prints the valid bound 1 and says why the
   amplified one is absent.
   An amplified, valid guarantee for the tree is available under Poisson sampling instead:
   ``mfcli account --strategy tree --sampling p`` (MMCC, :mod:`mfcli.accounting.mmcc`).

The Feldman-McMillan-Talwar applicability condition eps0 <= log(M / (16 log(4 / delta))) is
still evaluated and reported (:func:`fmt_min_reports`), so a user can see how far the setting is
from the regime where a shuffling analysis could help at all: for Gaussian reports at the usual
noise levels it needs far more leaves than a training run has steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mfcli.accounting.single_pass import DEFAULT_DELTA, check_delta, check_sigma, gaussian_epsilon
from mfcli.util.directed import sqrt_up
from mfcli.util.rows import fields_of
from mfcli.util.validation import step_count

AMPLIFIED_NOT_REPORTED = (
    "not reported: the shuffled-tree amplification (MMCC paper section 5 with the Feldman-McMillan-"
    "Talwar closed form) could not be checked against its sources; use Poisson sampling (MMCC) for an "
    "amplified tree guarantee"
)


def tree_levels(n: int) -> int:
    """L = ceil(log2 n): the tree on 2^L >= n leaves has L + 1 levels (every column in L + 1 nodes)."""
    n = step_count(n)
    return math.ceil(math.log2(n)) if n > 1 else 0


def fmt_min_reports(eps0: float, delta: float) -> float:
    """Smallest number M of shuffled eps0-DP reports for which the Feldman-McMillan-Talwar closed
    form applies: eps0 <= log(M / (16 log(4 / delta))), i.e. M >= 16 log(4/delta) e^eps0
    (infinite where it exceeds the float range: no number of reports suffices in practice)."""
    try:
        return 16.0 * math.log(4.0 / delta) * math.exp(eps0)  # a product beyond the range is inf
    except OverflowError:  # e^eps0 itself beyond the range
        return math.inf


@dataclass(frozen=True)
class ShuffledTreeResult:
    """Binary tree, one shuffled epoch.

    Attributes:
        epsilon: the valid single-epoch bound (Gaussian with sensitivity sqrt(L + 1)).
        delta: delta.
        sigma: noise standard deviation per node (clip-norm units).
        levels: L + 1 levels; leaves = 2^L.
        sensitivity: sqrt(L + 1).
        amplified: always None (see the module docstring); ``amplified_note`` says why.
        fmt_leaves_needed: leaves a level would need for the FMT closed form to apply to Gaussian
            reports at (eps0, delta) with eps0 their single-report epsilon at delta / n.
    """

    epsilon: float
    delta: float
    sigma: float
    levels: int
    sensitivity: float
    steps: int
    amplified: float | None
    amplified_note: str
    fmt_leaves_needed: float

    def as_dict(self) -> dict:
        return fields_of(
            self, "epsilon", "delta", "sigma", "steps", "levels", "sensitivity", first={"setting": "shuffled-tree"},
            amplified_epsilon=self.amplified, amplified_note=self.amplified_note,
            fmt_leaves_needed=self.fmt_leaves_needed,
            method="valid single-epoch bound: exact analytic Gaussian with sensitivity sqrt(L + 1)",
            assumptions="one epoch, every example in exactly one step (any order, shuffled or not); binary "
                        "tree encoder with 2^L >= n leaves; add or remove (or zero out) one example",
        )


def shuffled_tree(*, n: int, sigma: float, delta: float = DEFAULT_DELTA) -> ShuffledTreeResult:
    """Epsilon of the binary-tree mechanism over one epoch of n steps with noise sigma per node.

    Formal guarantees: ``epsilon`` is a valid (epsilon, delta) bound for add or remove one example
    whatever the order of the data (it ignores the shuffle); no amplified value is claimed.
    """
    sigma = check_sigma(sigma)
    delta = check_delta(delta)
    levels = tree_levels(n) + 1
    sens = sqrt_up(float(levels))   # rounded up: the guarantee's sensitivity
    eps = gaussian_epsilon(delta, sens / sigma)
    # one Gaussian report of sensitivity 1 at delta0 = delta / n (the share a union over n reports
    # would leave each), the usual way to turn it into an eps0-DP-like randomizer
    eps0 = gaussian_epsilon(min(0.5, delta / max(1, n)), 1.0 / sigma)
    return ShuffledTreeResult(
        epsilon=eps, delta=delta, sigma=sigma, levels=levels, sensitivity=sens, steps=int(n),
        amplified=None, amplified_note=AMPLIFIED_NOT_REPORTED, fmt_leaves_needed=fmt_min_reports(eps0, delta),
    )
