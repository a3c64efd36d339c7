"""Selected inversion for BandMF (mfcli.optimize.selected_inversion) and its use in the band-storage solver.

Oracles: dense numpy inverses (tr(Y^-1), the blocks of Y^-2, the derivative -(Z E Z^2 + Z^2 E Z)),
the dense formulas f = tr(A X^-1 A^T), gradient -X^-1 A^T A X^-1 and Hessian X^-1 D M + M D X^-1,
central differences of f, numpy's dense A^-1 for the banded-inverse detection, and for the solver
the O(n^2 b) band path and the dense solver on the same problem (each certificate bounds the
other's answer).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from banded_cases import random_band_x, workload_matrix
from hypothesis import given, settings
from hypothesis import strategies as hst
from typer.testing import CliRunner

import mfcli.optimize.multi_banded as mb
from mfcli.cli.app import app
from mfcli.model.participation import MinSeparation
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.multi_banded import from_band, to_band
from mfcli.optimize.multi_solver import multi_participation_factorization
from mfcli.optimize.selected_inversion import FastBandObjective, banded_inverse, selinv, square, tangent


def _random_block_tridiagonal(rng: np.random.Generator, nb: int, w: int) -> np.ndarray:
    """A dense SPD block-tridiagonal matrix (N blocks of w), condition number moderate."""
    n = nb * w
    m = rng.standard_normal((n, n))
    y = m @ m.T
    blk = np.arange(n) // w
    y[np.abs(blk[:, None] - blk[None, :]) > 1] = 0.0
    return y + (np.abs(np.linalg.eigvalsh(y)).max() * 0.1 + 1.0) * np.eye(n)


def _blocks(y: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    nb = y.shape[0] // w
    d = np.stack([y[i * w:(i + 1) * w, i * w:(i + 1) * w] for i in range(nb)])
    low = [y[(i + 1) * w:(i + 2) * w, i * w:(i + 1) * w] for i in range(nb - 1)]
    return d, (np.stack(low) if low else np.zeros((0, w, w)))


def _check_kernel(y: np.ndarray, e: np.ndarray, w: int) -> None:
    yd, yl = _blocks(y, w)
    fac = selinv(yd, yl)
    assert fac is not None
    z = np.linalg.inv(y)
    assert fac.trace == pytest.approx(np.trace(z), rel=1e-11)
    d2, l2 = square(fac)
    ref_d2, ref_l2 = _blocks(z @ z, w)
    scale = np.abs(z @ z).max()
    np.testing.assert_allclose(d2, ref_d2, atol=1e-10 * scale, rtol=0)
    np.testing.assert_allclose(l2, ref_l2, atol=1e-10 * scale, rtol=0)
    ed, el = _blocks(e, w)
    dd2, dl2 = tangent(fac, ed, el)
    deriv = -(z @ e @ z @ z + z @ z @ e @ z)  # d(Y^-2)[E]
    ref_dd2, ref_dl2 = _blocks(deriv, w)
    scale = np.abs(deriv).max()
    np.testing.assert_allclose(dd2, ref_dd2, atol=1e-9 * scale, rtol=0)
    np.testing.assert_allclose(dl2, ref_dl2, atol=1e-9 * scale, rtol=0)


@pytest.mark.parametrize(("nb", "w"), [(1, 5), (2, 3), (7, 4), (5, 1)])
def test_kernel_matches_dense_inverse(nb, w):
    rng = np.random.default_rng(nb * 10 + w)
    y = _random_block_tridiagonal(rng, nb, w)
    e = _random_block_tridiagonal(rng, nb, w) - 3 * np.eye(nb * w)  # any symmetric direction
    _check_kernel(y, e, w)


@settings(max_examples=25, deadline=None)
@given(nb=hst.integers(1, 5), w=hst.integers(1, 5), seed=hst.integers(0, 2**32 - 1))
def test_kernel_property_random_spd(nb, w, seed):
    rng = np.random.default_rng(seed)
    y = _random_block_tridiagonal(rng, nb, w)
    e = rng.standard_normal(y.shape)
    e = np.where(y != 0, e + e.T, 0.0)
    _check_kernel(y, e, w)


def test_kernel_refuses_indefinite():
    y = np.diag([1.0, -1.0, 2.0, 3.0])
    assert selinv(*_blocks(y, 2)) is None


@pytest.mark.parametrize(("name", "n", "p"), [("prefix", 30, 1), ("momentum", 30, 2), ("cooldown", 41, 2),
                                              ("prefix", 3, 1)])
def test_banded_inverse_of_builtin_workloads(name, n, p):
    a = workload_matrix(name, n)
    k = banded_inverse(a)
    assert k is not None and k.shape == (p + 1, n)
    dense = np.linalg.inv(a)
    np.testing.assert_allclose(from_band_lower(k), dense, atol=1e-10 * np.abs(dense).max())


def from_band_lower(k: np.ndarray) -> np.ndarray:
    rows, n = k.shape
    out = np.zeros((n, n))
    for d in range(rows):
        out[np.arange(d, n), np.arange(n - d)] = k[d, : n - d]
    return out


def test_banded_inverse_refusals():
    rng = np.random.default_rng(0)
    n = 40
    custom = np.tril(rng.standard_normal((n, n))) + n * np.eye(n)  # inverse not banded
    assert banded_inverse(custom) is None
    eta = np.ones(n)
    eta[7] = 0.0  # a zero learning rate: A is singular
    assert banded_inverse(momentum_workload(n, lr=eta).matrix) is None
    wide = np.linalg.inv(np.eye(n) - sum(0.3 * np.eye(n, k=-d) for d in range(1, 19)))  # 18 bands > 16
    assert banded_inverse(wide) is None


@pytest.mark.parametrize(("name", "n", "b"), [("prefix", 23, 4), ("momentum", 37, 5), ("cooldown", 30, 7),
                                              ("momentum", 9, 3), ("prefix", 16, 16)])
def test_fast_objective_matches_dense_formulas(name, n, b):
    """n not a multiple of w (ragged padding), n below w (one block), b = n."""
    a = workload_matrix(name, n)
    x = random_band_x(n, b, n + b)
    k = banded_inverse(a)
    assert k is not None
    obj = FastBandObjective(k, b, n)
    xb = to_band(x, b)
    f, fac = obj.value(xb)
    assert fac is not None
    xi = np.linalg.inv(x)
    m = xi @ a.T @ a @ xi
    assert f == pytest.approx(np.trace(a @ xi @ a.T), rel=1e-9)  # cond(Y) eps: momentum ~1e-11
    g = obj.gradient(fac)
    # Working through Y = K^T X K costs accuracy: relative round-off ~ cond(Y) eps with cond(Y) up
    # to cond(K)^2 cond(X) (cooldown at n = 30: 3e-8 on the Hessian where the X path has 5e-16).
    # A wrong formula is off by O(1).
    tol = 1e-6
    np.testing.assert_allclose(g, -to_band(m, b), atol=tol * np.abs(m).max())
    rng = np.random.default_rng(n)
    d = to_band(random_band_x(n, b, n + 1) - np.eye(n), b) * rng.uniform(0.5, 1.5)
    dd = from_band(d)
    h = obj.hessian(fac, d)
    href = xi @ dd @ m + m @ dd @ xi
    np.testing.assert_allclose(h, to_band(href, b), atol=tol * np.abs(href).max())
    # Central differences of f along D: <grad, D>_F (each off-diagonal band entry counts twice).
    eps = 1e-3  # f carries ~cond(Y) eps relative round-off (1e-11 on momentum): a wide step
    fp, _ = obj.value(xb + eps * d)
    fm, _ = obj.value(xb - eps * d)
    assert (fp - fm) / (2 * eps) == pytest.approx(float(np.sum(from_band(g) * dd)), rel=1e-5)
    # An indefinite X is refused, not evaluated.
    assert obj.value(xb - 2 * to_band(np.eye(n), b))[1] is None


def _solve(a, schema, fast, monkeypatch, storage="banded"):
    orig = mb.solve_banded

    def patched(*args, **kw):
        kw["fast"] = fast
        return orig(*args, **kw)

    monkeypatch.setattr(mb, "solve_banded", patched)
    return multi_participation_factorization(a, schema, tol=1e-9, storage=storage, threads=1)


@pytest.mark.parametrize(("name", "n", "schema"), [
    ("prefix", 48, MinSeparation(separation=6)),
    ("momentum", 40, MinSeparation(separation=5)),
    ("cooldown", 33, MinSeparation(separation=4, max_participations=3)),
])
def test_fast_path_reaches_the_certified_optimum_of_the_other_paths(name, n, schema, monkeypatch):
    a = workload_matrix(name, n)
    calls = []
    real = mb._FastOps.gradient

    def counting(self, state):
        calls.append(1)
        return real(self, state)

    monkeypatch.setattr(mb._FastOps, "gradient", counting)
    fast = _solve(a, schema, True, monkeypatch)
    assert calls, "the fast path was not taken"
    slow = _solve(a, schema, False, monkeypatch)
    dense = _solve(a, schema, True, monkeypatch, storage="dense")
    for res in (fast, slow, dense):
        assert res.converged and res.gap <= 1e-9
    for one in (fast, slow, dense):
        for other in (fast, slow, dense):
            assert one.dual <= other.loss_total * (1 + 1e-12)
    assert fast.sensitivity == pytest.approx(np.sqrt(schema.participations(n)), rel=1e-12)


def test_custom_workload_without_banded_inverse_uses_the_band_path(monkeypatch):
    rng = np.random.default_rng(3)
    n = 24
    a = np.tril(rng.uniform(0.5, 1.0, (n, n)))
    assert banded_inverse(a) is None
    monkeypatch.setattr(mb._FastOps, "gradient", lambda *_: pytest.fail("fast path on a non-banded inverse"))
    res = multi_participation_factorization(a, MinSeparation(separation=3), tol=1e-8, storage="banded", threads=1)
    dense = multi_participation_factorization(a, MinSeparation(separation=3), tol=1e-8, storage="dense", threads=1)
    assert res.converged and dense.converged
    assert res.dual <= dense.loss_total * (1 + 1e-12) and dense.dual <= res.loss_total * (1 + 1e-12)


def test_cli_band_storage_end_to_end(tmp_path, monkeypatch):
    """`mfcli optimize --min-sep` at n = 256, b = 32 takes band storage (auto: n >= 256, b <= n / 8)
    and the fast path (prefix has a banded inverse); the certified gap is in --json."""
    calls = []
    real = mb._FastOps.gradient
    monkeypatch.setattr(mb._FastOps, "gradient", lambda self, state: calls.append(1) or real(self, state))
    out = tmp_path / "m.h5"
    res = CliRunner().invoke(app, ["optimize", "-w", "prefix", "-n", "256", "--min-sep", "32", "--tol", "1e-6", "-q",
                                   "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert calls, "the fast path was not taken"
    summary = json.loads(res.stdout)
    assert summary["gap"] <= 1e-6
    assert summary["participation"]["separation"] == 32
    assert summary["sensitivity"] == pytest.approx(np.sqrt(8), rel=1e-9)
