"""Workload matrices against their definitions (docs/concepts.md, "Workloads")."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mfcli.errors import MfcliError
from mfcli.model.workloads import (
    build_workload,
    check_workload_matrix,
    learning_rates,
    momentum_workload,
    prefix_workload,
)
from mfcli.util.limits import DENSE_MAX_N


def _momentum_by_recursion(n, beta, eta):
    """Column j of A is the parameter change caused by a unit gradient at step j, by running
    heavy-ball momentum m_i = beta m_{i-1} + g_i, theta_i = theta_{i-1} + eta_i m_i."""
    a = np.zeros((n, n))
    for j in range(n):
        m = theta = 0.0
        for i in range(n):
            m = beta * m + (1.0 if i == j else 0.0)
            theta = theta + eta[i] * m
            a[i, j] = theta
    return a


@given(n=st.integers(1, 12), beta=st.floats(0.0, 0.99))
def test_momentum_matches_the_optimizer_recursion_constant_lr(n, beta):
    np.testing.assert_allclose(
        momentum_workload(n, beta=beta).matrix, _momentum_by_recursion(n, beta, np.ones(n)), atol=1e-12
    )


def test_momentum_with_schedule_matches_recursion():
    n = 16
    eta = learning_rates(n, "cooldown", final=0.05, last=4)
    w = momentum_workload(n, beta=0.9, lr=eta)
    np.testing.assert_allclose(w.matrix, _momentum_by_recursion(n, 0.9, eta), atol=1e-12)


def test_prefix_is_lower_ones_and_beta_zero_momentum():
    n = 7
    np.testing.assert_array_equal(prefix_workload(n).matrix, np.tril(np.ones((n, n))))
    np.testing.assert_allclose(momentum_workload(n, beta=0.0).matrix, np.tril(np.ones((n, n))))


@pytest.mark.parametrize(
    "schedule, kwargs, expected_tail",
    [
        ("constant", {}, [1.0, 1.0, 1.0, 1.0]),
        ("step-decay", {"factor": 0.15, "last": 2}, [1.0, 1.0, 0.15, 0.15]),
        ("cooldown", {"final": 0.05, "last": 2}, [1.0, 1.0, 0.525, 0.05]),
    ],
)
def test_schedules(schedule, kwargs, expected_tail):
    np.testing.assert_allclose(learning_rates(4, schedule, **kwargs), expected_tail)


def test_seed_paper_schedules_at_2048():
    step = learning_rates(2048, "step-decay")
    assert np.all(step[:1536] == 1.0) and np.all(step[1536:] == 0.15)
    cool = learning_rates(2048, "cooldown")
    assert cool[1535] == 1.0 and cool[-1] == pytest.approx(0.05)
    assert np.all(np.diff(cool[1536:]) < 0)


def test_lr_file(tmp_path):
    eta = np.linspace(1, 0.5, 6)
    f = tmp_path / "lr.npy"
    np.save(f, eta)
    w = build_workload("prefix", 6, lr=str(f))
    np.testing.assert_allclose(w.matrix, np.tril(np.ones((6, 6))) * eta[None, :])
    csv = tmp_path / "lr.csv"
    csv.write_text("\n".join(str(x) for x in eta))
    np.testing.assert_allclose(build_workload("prefix", 6, lr=str(csv)).matrix, w.matrix)
    with pytest.raises(MfcliError, match="has 6 entries, expected n = 7"):
        build_workload("prefix", 7, lr=str(f))


@pytest.mark.parametrize(
    "matrix, message",
    [
        (np.ones((2, 3)), "square"),
        (np.ones((3, 3)), "not lower-triangular"),
        (np.diag([1.0, 0.0, 1.0]), "singular"),
        (np.array([[1.0, 0], [np.nan, 1]]), "NaN or inf"),
        (np.array([[1.0, 0], [np.inf, 1]]), "NaN or inf"),
        (np.ones(3), "2-D"),
        (np.zeros((0, 0)), "empty"),
    ],
)
def test_bad_custom_matrices(matrix, message):
    with pytest.raises(MfcliError, match=message):
        check_workload_matrix(matrix)


@pytest.mark.parametrize(
    "args, message",
    [
        (("momentum", 10), {"beta": 1.0}),
        (("momentum", 10), {"beta": -0.1}),
    ],
)
def test_bad_beta(args, message):
    with pytest.raises(MfcliError, match="beta"):
        build_workload(*args, **message)


@pytest.mark.parametrize("n, message", [(0, "at least 1"), (-5, "at least 1"), (DENSE_MAX_N + 1, "too large")])
def test_bad_n(n, message):
    with pytest.raises(MfcliError, match=message):
        build_workload("prefix", n)


def test_unknown_workload_and_schedule():
    with pytest.raises(MfcliError, match="unknown workload"):
        build_workload("adam", 4)
    with pytest.raises(MfcliError, match="neither a schedule"):
        build_workload("prefix", 4, lr="exponential")


def test_an_artifacts_workload_is_read_by_the_artifact_layer(tmp_path):
    """The workload layer opens no artifact: an .h5 matrix file is read by
    artifact.load_workload_matrix (checksums verified) and passed in as ``matrix``; the workload
    is the stored A, and its source is still the file."""
    from mfcli.io.artifact import load_workload_matrix, save_artifact
    from mfcli.model.workloads import build_workload, momentum_workload
    from mfcli.optimize.dense import optimal_factorization

    w = momentum_workload(6, beta=0.5)
    path = tmp_path / "m.h5"
    save_artifact(path, optimal_factorization(w.matrix, tol=1e-6).factorization, workload_name=w.name,
                  strategy_name="optimal")
    a = load_workload_matrix(path)
    np.testing.assert_array_equal(a, w.matrix)
    custom = build_workload("custom", matrix_file=path, matrix=a)
    np.testing.assert_array_equal(custom.matrix, w.matrix)
    assert custom.params == {"source": str(path)}
    with pytest.raises(MfcliError, match="load_workload_matrix"):
        build_workload("custom", matrix_file=path)
    with pytest.raises(MfcliError, match="custom workload only"):
        build_workload("prefix", 6, matrix=a)
