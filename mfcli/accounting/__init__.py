"""Privacy accounting for matrix mechanisms (docs/accounting.md).

Settings (each function returns a frozen result with ``as_dict()`` and, where it applies, the
dp-accounting event it composed):

* ``single_pass.single_pass`` - one Gaussian mechanism with noise multiplier sigma / sens(C);
* ``single_pass.dpsgd`` - DP-SGD reference, Poisson-sampled Gaussian composed n times;
* ``mmcc.mmcc`` - Poisson sampling in every step, any non-negative causal C (docs/accounting.md,
  "MMCC"), with the bracket ``mmcc.lower_bound`` and the sanity bound ``mmcc.full_participation``;
* ``shuffled_tree.shuffled_tree`` - the binary tree over one shuffled epoch;
* ``balls_in_bins.tree_balls_in_bins`` - the binary tree under balls-in-bins batching (bracket);
* ``shuffling.shuffled_dpsgd`` - DP-SGD over one shuffled epoch (Feldman-McMillan-Talwar);
* ``calibrate.calibrate_sigma`` - the smallest sigma meeting a target epsilon, for any epsilon(sigma);
* ``calibrate_strategy`` (from :mod:`mfcli.services.account`) - the same for a strategy matrix C
  in one setting (what ``mfcli account --epsilon`` computes).

This package is the mathematics only (layer 2 of docs/architecture.md); what ``mfcli account``
runs for a strategy of any kind (strategy resolution, all settings, ``--write``, every number from
the strategy's :class:`mfcli.strategies.operators.Mechanism`) is :mod:`mfcli.services.account`.

The functions named like their modules are not re-exported here, so that
``import mfcli.accounting.mmcc`` keeps meaning the module.

dp-accounting's pessimistic PLD machinery is the engine; :mod:`mfcli.accounting.mog_pld` builds
the mixture-of-Gaussians PLDs that MMCC needs with array operations (same numbers as
dp-accounting's own builder, tested against it).
"""
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time see __getattr__ below
    from mfcli.accounting.balls_in_bins import BallsInBinsTreeResult
    from mfcli.accounting.calibrate import Calibration, calibrate_sigma
    from mfcli.accounting.defaults import DEFAULT_DELTA, DEFAULT_DISCRETIZATION
    from mfcli.accounting.events import event_from_json, event_to_json
    from mfcli.accounting.mmcc import (
        FullParticipationResult,
        LowerBoundResult,
        MMCCResult,
        full_participation,
        lower_bound,
        prepare_strategy,
    )
    from mfcli.accounting.shuffled_tree import ShuffledTreeResult
    from mfcli.accounting.shuffling import ShuffledDpSgdResult
    from mfcli.accounting.single_pass import (
        DpSgdResult,
        SinglePassResult,
        dpsgd,
        gaussian_delta,
        gaussian_epsilon,
    )
    from mfcli.services.account import calibrate_strategy

#: Public name -> module. Imported on first use (PEP 562): scipy.stats and dp-accounting cost
#: about a second of start-up, which commands that do not account should not pay.
_EXPORTS = {
    "Calibration": "calibrate", "calibrate_sigma": "calibrate", "calibrate_strategy": "mfcli.services.account",
    "event_from_json": "events", "event_to_json": "events",
    "FullParticipationResult": "mmcc", "LowerBoundResult": "mmcc", "MMCCResult": "mmcc",
    "full_participation": "mmcc", "lower_bound": "mmcc", "prepare_strategy": "mmcc",
    "ShuffledTreeResult": "shuffled_tree",
    "BallsInBinsTreeResult": "balls_in_bins", "ShuffledDpSgdResult": "shuffling",
    "DEFAULT_DELTA": "defaults", "DEFAULT_DISCRETIZATION": "defaults", "DpSgdResult": "single_pass",
    "SinglePassResult": "single_pass", "dpsgd": "single_pass", "gaussian_delta": "single_pass",
    "gaussian_epsilon": "single_pass",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mfcli.accounting' has no attribute {name!r}")
    import importlib

    # a full module name (the one export from above this package), else a module of the package
    value = getattr(importlib.import_module(module if "." in module else f"mfcli.accounting.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_DELTA", "DEFAULT_DISCRETIZATION", "BallsInBinsTreeResult",
    "Calibration", "DpSgdResult", "FullParticipationResult", "LowerBoundResult",
    "MMCCResult", "ShuffledDpSgdResult", "ShuffledTreeResult",
    "SinglePassResult", "calibrate_sigma", "calibrate_strategy", "dpsgd",
    "event_from_json", "event_to_json", "full_participation", "gaussian_delta", "gaussian_epsilon", "lower_bound",
    "prepare_strategy",
]
