"""``training.record``: the operator a record accounted is found by the record's ``operator`` label
among the artifact's operators (as the record verifier reads them), with no branch on the kind
(issue 23). Checked for every kind of artifact (dense, its compressed operator, banded Toeplitz,
BLT): the input's C is that operator's C (the dense root's stored strategy; the compressed
C^ = B^-1 A; a structured one materialised from its first column, built here by definition),
and a label the artifact does not have, or a hash that is not the operator's, gives None."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mfcli.io.artifact import load_artifact, save_artifact, save_structured_artifact
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.compress import compress_artifact
from mfcli.strategies.blt import BufferedToeplitz
from mfcli.strategies.operators import DenseOperator, read_compressed
from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz
from mfcli.training.record import _accounted_input_of

N = 12


def _toeplitz(first_column: np.ndarray) -> np.ndarray:
    col = np.zeros(N)
    col[: min(N, first_column.size)] = first_column[:N]
    return np.array([[col[i - j] if i >= j else 0.0 for j in range(N)] for i in range(N)])


def _optimum_file(path: Path) -> Path:
    """The certified optimum for the momentum workload of N steps, as a dense artifact."""
    w = momentum_workload(N, beta=0.5)
    res = optimal_factorization(w.matrix, tol=1e-10)
    save_artifact(path, res.factorization, workload_name=w.name, workload_params=w.params, strategy_name="optimal",
                  solver=res.certificate(), dual_weights=res.dual_weights)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("accounted")
    out = {"dense": _optimum_file(d / "dense.h5"), "compressed": d / "compressed.h5",
           "banded": d / "banded.h5", "blt": d / "blt.h5"}
    compress_artifact(out["dense"], band=2, rank=1, out=out["compressed"])
    bt = BandedToeplitz(np.array([1.0, 0.5, 0.25]))
    save_structured_artifact(out["banded"], bt, workload=TOEPLITZ_PREFIX, n=N)
    bl = BufferedToeplitz(theta=np.array([0.9, 0.4]), omega=np.array([0.2, 0.1]))
    save_structured_artifact(out["blt"], bl, workload=TOEPLITZ_PREFIX, n=N)
    t = np.arange(1, N)
    blt_col = np.concatenate([[1.0], (bl.omega[None, :] * bl.theta[None, :] ** (t[:, None] - 1)).sum(axis=1)])
    return out | {"banded_c": _toeplitz(bt.coefs), "blt_c": _toeplitz(blt_col)}


def _rec(path: Path, label: str, sha: str | None) -> SimpleNamespace:
    return SimpleNamespace(artifact=path, attrs={"operator": label, "strategy_sha256": sha})


def test_dense_and_compressed_operators_by_label(files) -> None:
    path = files["compressed"]
    art = load_artifact(path)
    comp = read_compressed(art)
    root = np.asarray(art.factorization.strategy)
    root_sha = DenseOperator(art.factorization).identity_sha256
    for label, sha, want in (("dense", root_sha, root), (comp.label, comp.identity_sha256, np.asarray(comp.strategy))):
        got = _accounted_input_of(_rec(path, label, sha))
        assert got is not None and got.operator == label
        np.testing.assert_array_equal(got.strategy, want)
    assert not np.allclose(root, comp.strategy)  # the two operators really differ
    assert _accounted_input_of(_rec(files["dense"], comp.label, comp.identity_sha256)) is None  # no compressed group
    assert _accounted_input_of(_rec(path, comp.label, "0" * 64)) is None


@pytest.mark.parametrize("kind", ["banded", "blt"])
def test_structured_operator_by_label(files, kind: str) -> None:
    from mfcli.io.artifact import load_any_artifact

    op = load_any_artifact(files[kind]).operator()
    got = _accounted_input_of(_rec(files[kind], op.label, op.identity_sha256))
    assert got is not None and got.operator == op.label
    np.testing.assert_allclose(got.strategy, files[f"{kind}_c"], rtol=0, atol=1e-15)
    assert _accounted_input_of(_rec(files[kind], "dense", None)) is None  # a structured artifact has no dense root
