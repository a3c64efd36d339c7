"""A training record's DP-SGD epsilons (the per-epoch ones the record path recomputes, and the
record's own) are dp-accounting's ``PLDAccountant`` value bit for bit: the oracle is the
accountant itself, composing ``steps`` Poisson-sampled Gaussians at the record's value
discretization. The record path computes them with mfcli.accounting.single_pass.dpsgd (the one
DP-SGD accountant, without importing dp-accounting)."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from training_cases import _record, prefix_artifact

from mfcli.training.record import _dpsgd_epsilon, training_record


def _accountant(sigma: float, q: float, steps: int, delta: float, discretization: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("sigma, q, steps, delta, disc", [
    (2.0, 0.5, 2, 1e-5, 1e-4),
    (1.0, 0.01, 1000, 1e-6, 1e-4),
    (0.8, 0.1, 50, 1e-8, 1e-3),
    (4.0, 0.001, 100, 1e-5, 1e-4),  # a PLD of about a hundred points: dp-accounting's sparse form
    (1.5, 1.0, 10, 1e-6, 1e-4),  # q = 1: the plain Gaussian
    (0.6, 0.2, 7, 1e-10, 2e-4),
])
def test_record_dpsgd_epsilon_is_the_accountants(sigma: float, q: float, steps: int, delta: float,
                                                 disc: float) -> None:
    assert _dpsgd_epsilon(sigma, q, steps, delta, disc) == _accountant(sigma, q, steps, delta, disc)


def test_epsilon_per_epoch_of_a_dpsgd_record_is_the_accountants(tmp_path) -> None:
    """C = I, n = 8 steps at q = 0.25 (4 steps an epoch, 2 epochs), the record written by the
    accounting session: after e epochs, 4 e Poisson-sampled Gaussians at the record's grid."""
    path = prefix_artifact(tmp_path / "id8.h5", np.eye(8), "identity")
    rid = _record(path, sigma=1.3, sampling=0.25, settings=["dp-sgd"], batching="poisson", delta=1e-6)
    rec = training_record(path, rid)
    with h5py.File(path, "r") as f:
        results = json.loads(f[f"accounting/{rid}"].attrs["results"])
    disc = float(results["dp-sgd"]["value_discretization"])
    per = rec.epsilon_per_epoch()
    assert rec.setting == "dp-sgd" and len(per) == 2
    truths = [_accountant(1.3, 0.25, 4 * e, 1e-6, disc) for e in (1, 2)]
    assert per == truths
    assert per[0] < per[1] == rec.epsilon
