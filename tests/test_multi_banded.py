"""The banded BandMF path of the multi-participation solver (mfcli.optimize.multi_banded).

Oracles: the band-storage pieces against plain dense numpy formulas (inverse by np.linalg.solve,
products of the full matrices); the banded solve against the dense solver of mfcli.optimize.multi_solver
(a different iteration: dense iterate, Newton phase) on the same problem, both certified; and
weak duality against random feasible X the solver did not produce.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import mfcli.optimize.multi_solver as ms
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, MinSeparation
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.multi_banded import _Banded, from_band, to_band
from mfcli.optimize.multi_solver import multi_participation_factorization
from mfcli.optimize.multi_structure import Structure


def _band_matrix(n: int, b: int, rng: np.random.Generator) -> np.ndarray:
    """A random symmetric positive definite b-banded matrix with unit diagonal."""
    r = rng.standard_normal((n, n)) * 0.3 / b
    x = np.where(np.abs(np.subtract.outer(np.arange(n), np.arange(n))) < b, r + r.T, 0.0)
    np.fill_diagonal(x, 1.0)
    assert np.linalg.eigvalsh(x).min() > 0
    return x


@pytest.mark.parametrize(("n", "b"), [(12, 3), (13, 4), (33, 8), (10, 10), (7, 2)])
def test_band_pieces_match_dense_formulas(n, b):
    rng = np.random.default_rng(n * 100 + b)
    a = np.tril(rng.standard_normal((n, n))) + 3 * np.eye(n)
    x, q = _band_matrix(n, b, rng), _band_matrix(n, b, rng)
    prob = _Banded(a, b)
    xb, qb = to_band(x, b), to_band(q, b)
    assert np.array_equal(from_band(xb), x)
    f, factors = prob.value(xb)
    assert factors is not None
    assert f == pytest.approx(float(np.trace(a @ np.linalg.solve(x, a.T))), rel=1e-12)
    z = prob.z(factors)[:n]
    assert np.allclose(z, np.linalg.solve(x, a.T), rtol=1e-10, atol=1e-12)
    m = np.linalg.solve(x, a.T) @ a @ np.linalg.inv(x)  # X^-1 A^T A X^-1
    assert np.allclose(prob.band_of_gram(prob.z(factors)), to_band(m, b), rtol=1e-10, atol=1e-10)
    assert np.allclose(prob.metric(prob.blocks(xb), qb), to_band(x @ q @ x, b), rtol=1e-12, atol=1e-12)
    assert prob.dot(xb, qb) == pytest.approx(float(np.sum(x * q)), rel=1e-12)
    # Hessian of f at X in the band direction Q: X^-1 Q M + M Q X^-1 (plain inverses).
    xi = np.linalg.inv(x)
    assert np.allclose(prob.hessian(factors, prob.z(factors), qb), to_band(xi @ q @ m + m @ q @ xi, b),
                       rtol=1e-9, atol=1e-9)
    assert math.isinf(prob.value(to_band(-x, b))[0])  # not positive definite


CASES = [
    ("prefix", 32, MinSeparation(separation=8)),
    ("momentum", 44, MinSeparation(separation=8)),  # n not a multiple of b: padded blocks
    ("prefix", 64, MinSeparation(separation=16, max_participations=3)),
]


@pytest.mark.parametrize(("workload", "n", "schema"), CASES)
def test_banded_path_equals_dense_path(workload, n, schema):
    a = prefix_workload(n).matrix if workload == "prefix" else momentum_workload(n, beta=0.9).matrix
    band = multi_participation_factorization(a, schema, tol=1e-9, storage="banded")
    dense = multi_participation_factorization(a, schema, tol=1e-9, storage="dense")
    assert band.converged and dense.converged
    assert {p.method for p in band.history} <= {"lbfgs-band-storage", "newton-band-storage"}
    assert band.certificate()["method"].endswith("banded-band-storage")
    k = schema.participations(n)
    assert band.sensitivity == pytest.approx(math.sqrt(k), rel=1e-12)
    assert band.loss_total == pytest.approx(dense.loss_total, rel=1e-8)
    # Each certificate bounds the other path's answer.
    assert band.dual <= dense.loss_total * (1 + 1e-12) and dense.dual <= band.loss_total * (1 + 1e-12)
    c = band.factorization.strategy
    assert np.allclose(np.triu(np.tril(c, -schema.separation)), 0.0)  # C has b bands
    st = Structure(n, schema)
    rng = np.random.default_rng(n)
    for _ in range(10):  # every feasible X costs at least the dual bound
        x = _band_matrix(n, schema.separation, rng)
        x = st.normalize(x)
        assert st.scale * float(np.trace(a @ np.linalg.solve(x, a.T))) >= band.dual * (1 - 1e-12)


def test_auto_uses_band_storage_from_the_threshold(monkeypatch):
    a = prefix_workload(32).matrix
    monkeypatch.setattr(ms, "BANDED_MIN_N", 32)
    assert multi_participation_factorization(a, MinSeparation(separation=4)).structure == "banded"
    assert multi_participation_factorization(a, MinSeparation(separation=4)).certificate()["method"].endswith(
        "-band-storage")
    # b > n / 8 and fixed-epoch stay dense
    assert not multi_participation_factorization(a, MinSeparation(separation=8)).certificate()["method"].endswith(
        "-band-storage")
    assert "newton" in multi_participation_factorization(a, FixedEpoch(epochs=4)).certificate()["method"]


@pytest.mark.parametrize(("schema", "storage", "needle"), [
    (FixedEpoch(epochs=4), "banded", "min-separation"),
    (MinSeparation(separation=8, max_participations=1), "banded", "more than one participation"),
    (MinSeparation(separation=8), "sparse", "storage must be"),
])
def test_storage_bad_input(schema, storage, needle):
    with pytest.raises(MfcliError, match=needle):
        multi_participation_factorization(prefix_workload(32).matrix, schema, storage=storage)
