"""Privacy accounting for matrix mechanisms (BRIEF section 8, MMCC.md).

Settings (each function returns a frozen result with ``as_dict()`` and, where it applies, the
dp-accounting event it composed):

* :func:`single_pass` - one Gaussian mechanism with noise multiplier sigma / sens(C);
* :func:`dpsgd` - DP-SGD reference, Poisson-sampled Gaussian composed n times;
* :func:`mmcc` - Poisson sampling in every step, any non-negative causal C (MMCC.md), with the
  bracket :func:`lower_bound` and the sanity bound :func:`full_participation`;
* :func:`shuffled_tree` - the binary tree over one shuffled epoch;
* :func:`calibrate_sigma` - the smallest sigma meeting a target epsilon.

dp-accounting's pessimistic PLD machinery is the engine; :mod:`mfcli.accounting.mog_pld` builds
the mixture-of-Gaussians PLDs that MMCC needs with array operations (same numbers as
dp-accounting's own builder, tested against it).
"""
from mfcli.accounting.calibrate import Calibration, calibrate_sigma
from mfcli.accounting.events import event_from_json, event_to_json
from mfcli.accounting.mmcc import (
    FullParticipationResult,
    LowerBoundResult,
    MMCCResult,
    full_participation,
    lower_bound,
    mmcc,
    prepare_strategy,
)
from mfcli.accounting.shuffled_tree import ShuffledTreeResult, shuffled_tree
from mfcli.accounting.single_pass import (
    DEFAULT_DELTA,
    DEFAULT_DISCRETIZATION,
    DpSgdResult,
    SinglePassResult,
    dpsgd,
    gaussian_delta,
    gaussian_epsilon,
    single_pass,
)

__all__ = [
    "Calibration", "calibrate_sigma", "event_from_json", "event_to_json", "FullParticipationResult",
    "LowerBoundResult", "MMCCResult", "full_participation", "lower_bound", "mmcc", "prepare_strategy",
    "ShuffledTreeResult", "shuffled_tree", "DEFAULT_DELTA", "DEFAULT_DISCRETIZATION", "DpSgdResult",
    "SinglePassResult", "dpsgd", "gaussian_delta", "gaussian_epsilon", "single_pass",
]
