"""Library pieces the CLI used to hold: warm-start weights from an artifact, default artifact names.

Oracles: the solver's own dual weights for the same workload (the stationarity condition
X D X = A^T A recovers them from C alone), and hand-written file names.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mfcli.errors import MfcliError
from mfcli.io.artifact import load_artifact, save_artifact
from mfcli.model.workloads import (
    build_workload,
    default_artifact_stem,
    momentum_workload,
    prefix_workload,
)
from mfcli.optimize.dense import optimal_factorization, warm_start_weights


@pytest.fixture(scope="module")
def solved():
    w = momentum_workload(12, beta=0.5)
    return w, optimal_factorization(w.matrix, tol=1e-10)


def _save(path: Path, w, res, *, with_dual: bool) -> Path:
    save_artifact(path, res.factorization, workload_name=w.name, strategy_name="optimal",
                  dual_weights=res.dual_weights if with_dual else None)
    return path


def test_stored_dual_weights_are_returned_as_is(tmp_path, solved):
    w, res = solved
    p = _save(tmp_path / "a.h5", w, res, with_dual=True)
    np.testing.assert_array_equal(warm_start_weights(load_artifact(p), w.matrix), res.dual_weights)
    # any n: the solver resamples stored weights, so a 20-step workload takes them too
    np.testing.assert_array_equal(warm_start_weights(load_artifact(str(p)), momentum_workload(20, beta=0.5).matrix),
                                  res.dual_weights)


def test_weights_are_recovered_from_the_strategy_without_stored_ones(tmp_path, solved):
    w, res = solved
    p = _save(tmp_path / "b.h5", w, res, with_dual=False)
    got = warm_start_weights(load_artifact(p), w.matrix)
    # the recovered weights are the solver's, up to the common scale it normalises (the dual weights
    # are determined less sharply than the loss: 3e-4 relative here at a gap of 1e-10)
    ref = res.dual_weights
    np.testing.assert_allclose(got / np.exp(np.mean(np.log(got))), ref / np.exp(np.mean(np.log(ref))), rtol=1e-3)
    warm = optimal_factorization(w.matrix, tol=1e-8, v0=got)
    assert warm.iterations <= 2


def test_warm_start_refusals(tmp_path, solved):
    w, res = solved
    p = _save(tmp_path / "c.h5", w, res, with_dual=False)
    with pytest.raises(MfcliError, match=r"needs the same n .*n = 12.* n = 8"):
        warm_start_weights(load_artifact(p), prefix_workload(8).matrix)
    # a path is opened by the caller, not by the solver
    for not_loaded in (res.factorization, p, str(p)):
        with pytest.raises(TypeError, match="artifact must be a loaded Artifact"):
            warm_start_weights(not_loaded, w.matrix)


@pytest.mark.parametrize("kwargs, strategy, stem", [
    (dict(name="prefix", n=8), None, "prefix"),
    (dict(name="momentum", n=8, lr="cooldown"), None, "momentum-cooldown"),
    (dict(name="momentum", n=8, lr="step-decay"), None, "momentum-step-decay"),
    (dict(name="prefix", n=8, lr="constant"), "tree", "prefix-tree"),
    (dict(name="momentum", n=8, lr="cooldown"), "sqrt", "momentum-sqrt"),
])
def test_default_artifact_stem(kwargs, strategy, stem):
    assert default_artifact_stem(build_workload(**kwargs), strategy) == stem


def test_default_artifact_stem_for_a_learning_rate_file(tmp_path):
    f = tmp_path / "rates.npy"
    np.save(f, np.linspace(1.0, 0.5, 6))
    # the file's stem is in the name, so a run from a rates file never takes the constant-rate run's name
    assert default_artifact_stem(build_workload("prefix", 6, lr=str(f))) == "prefix-lr-rates"
