"""The error hierarchy: bad input is a ValueError (MfcliError), a wrong argument type a TypeError.

The CLI contract (one ``error:`` line, non-zero exit) rests on MfcliError; library users rely on
the built-in classes. Each row calls a real library function with real bad input.
"""
from __future__ import annotations

import numpy as np
import pytest

from mfcli import ArtifactError, MfcliError
from mfcli.model.workloads import build_workload, check_n, check_workload_matrix
from mfcli.optimize.dense import optimal_factorization
from mfcli.strategies.baselines import tree_nodes


def test_hierarchy():
    assert issubclass(MfcliError, ValueError)
    assert issubclass(ArtifactError, MfcliError)
    assert not issubclass(MfcliError, TypeError)


@pytest.mark.parametrize("call, match", [
    (lambda: check_n(0), "at least 1"),
    (lambda: check_n(2.5), "must be an integer"),
    (lambda: tree_nodes(1), "n >= 2"),
    (lambda: check_workload_matrix(np.triu(np.ones((3, 3)))), "not lower-triangular"),
    (lambda: build_workload("prefix"), "needs n"),
    (lambda: optimal_factorization(np.eye(3), tol=2.0), "tol"),
    (lambda: optimal_factorization(np.eye(3), threads=0), "threads"),
])
def test_bad_values_are_value_errors(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert isinstance(info.value, MfcliError)


@pytest.mark.parametrize("call, match", [
    (lambda: check_n("8"), "n must be an integer, got str"),
    (lambda: check_n(None), "n must be an integer, got NoneType"),
    (lambda: tree_nodes("4"), "n must be an integer, got str"),
    (lambda: optimal_factorization(np.eye(3), threads="4"), "threads"),
])
def test_wrong_types_are_type_errors(call, match):
    with pytest.raises(TypeError, match=match) as info:
        call()
    assert not isinstance(info.value, MfcliError)


def test_artifact_error_is_caught_as_value_error(tmp_path):
    from mfcli.io.artifact import load_artifact

    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5 at all")
    with pytest.raises(ValueError) as info:
        load_artifact(bad)
    assert isinstance(info.value, ArtifactError)
