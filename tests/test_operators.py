"""mfcli.strategies.operators: one representation per operator, one strict reader, one choice of what runs.

Oracles: B^ built entry by entry from its definition, C^ = B^-1 A by numpy's general solver, and
the callers' own outputs (noise streams, account, inspect) compared with each other."""
from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import dataset_sha256, load_artifact, save_artifact
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.account import resolve_strategy
from mfcli.services.compress import compress_artifact
from mfcli.services.inspect import inspect_artifact
from mfcli.strategies.operators import (
    GROUP,
    BandedLowRank,
    CompressedOperator,
    DenseLowerTriangular,
    DenseOperator,
    NoiseOperator,
    StreamingMatrix,
    read_compressed,
    select_operator,
)
from mfcli.training.noise import noise_stream

from noise_oracles import decoder_from_layout

runner = CliRunner()


@given(st.integers(1, 9), st.data())
def test_banded_low_rank_dense_and_row_coefficients(n, data):
    k = data.draw(st.integers(1, n))
    r = data.draw(st.integers(0, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    band = rng.standard_normal((n, k))
    for i in range(k):
        band[:i, i] = 0.0
    u, v = rng.standard_normal((n, r)), rng.standard_normal((n, r))
    op = BandedLowRank(band=band, u=u, v=v)
    m = decoder_from_layout(band, u, v)
    np.testing.assert_allclose(op.dense(), m, atol=1e-12)
    # Row t from the slot coefficients: ring slot j mod K holds Z[j], the R sums hold V^T Z up to t - K.
    z = rng.standard_normal((n, 2))
    table = op.coefficient_table()
    for t in range(n):
        ring = np.zeros((k, 2))
        for j in range(max(0, t - k + 1), t + 1):
            ring[j % k] = z[j]
        sums = v[: max(0, t - k + 1)].T @ z[: max(0, t - k + 1)] if r else np.zeros((0, 2))
        np.testing.assert_allclose(table[t] @ np.vstack([ring, sums]), m[t] @ z, atol=1e-10)


@pytest.mark.parametrize("t,i", [(0, 1), (1, 2), (0, 2)])
def test_band_entries_outside_the_matrix_are_refused(t, i):
    band = np.ones((4, 3))
    for c in range(3):
        band[:c, c] = 0.0
    band[t, i] = 0.5
    with pytest.raises(MfcliError, match="outside the matrix"):
        BandedLowRank(band=band, u=np.zeros((4, 1)), v=np.zeros((4, 1)))


def test_protocols():
    fact = optimal_factorization(momentum_workload(8, beta=0.9).matrix, tol=1e-9).factorization
    dense = DenseOperator(fact)
    assert isinstance(dense, NoiseOperator) and dense.label == "dense"
    for kind in ("gradient", "iterate"):
        assert isinstance(dense.streaming(kind).matrix, StreamingMatrix)
    b = BandedLowRank(band=np.diag(fact.decoder)[:, None], u=np.zeros((8, 0)), v=np.zeros((8, 0)))
    comp = CompressedOperator.build(fact, b)
    assert isinstance(comp, NoiseOperator) and comp.label == "compressed (band 1, rank 0)"
    np.testing.assert_allclose(comp.strategy, np.linalg.solve(np.diag(np.diag(fact.decoder)), fact.workload), atol=1e-12)
    assert isinstance(DenseLowerTriangular(np.eye(3)), StreamingMatrix)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("ops")
    fact = optimal_factorization(momentum_workload(20, beta=0.9).matrix, tol=1e-9).factorization
    dense = base / "d.h5"
    save_artifact(dense, fact, workload_name="momentum", workload_params={"beta": 0.9}, strategy_name="optimal")
    return dense, compress_artifact(dense, band=3, rank=2, out=base / "c.h5").path


def test_select_operator(pair):
    dense, comp = pair
    assert select_operator(load_artifact(dense)).variant == "dense"
    chosen = select_operator(load_artifact(comp))
    assert chosen.label == "compressed (band 3, rank 2)"
    a = load_artifact(comp).factorization.workload
    np.testing.assert_allclose(chosen.factorization.strategy, np.linalg.solve(chosen.dense(), a), atol=1e-9)
    assert select_operator(load_artifact(comp), "dense").variant == "dense"
    with pytest.raises(MfcliError, match="no compressed decoder"):
        select_operator(load_artifact(dense), "compressed")
    with pytest.raises(MfcliError, match="operator must be one of"):
        select_operator(load_artifact(dense), "sparse")


def test_stream_and_account_use_the_same_operator(pair):
    _, comp = pair
    for variant in ("auto", "dense"):
        stream = noise_stream(comp, kind="gradient", d=1, seed=3, variant=variant)
        inp = resolve_strategy(comp, operator=variant)
        assert stream.accounted_operator == inp.operator
        np.testing.assert_allclose(np.linalg.inv(stream.operator_matrix()), inp.strategy, atol=1e-9)


def _forge(src: Path, dst: Path, edit) -> Path:
    """Edit the compressed group with its dataset checksums updated (passes load_artifact)."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        g = f[GROUP]
        data = {k: g[k][...] for k in ("band", "u", "v")}
        edit(data, g.attrs)
        for k, arr in data.items():
            del g[k]
            g.create_dataset(k, data=arr).attrs["sha256"] = dataset_sha256(arr)
    return dst


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda d, a: d["band"].__setitem__((0, 2), 0.25), "outside the matrix"),
        (lambda d, a: d["u"].__setitem__((5, 0), d["u"][5, 0] * 1.5), "does not match"),
        (lambda d, a: a.__setitem__("loss_increase", 0.0), "compressed/loss_increase"),
        (lambda d, a: a.__setitem__("loss_total", a["loss_total"] * 0.9), "compressed/loss_total"),
        (lambda d, a: a.__setitem__("rank", 1), "from its attributes"),
    ],
    ids=["band-outside", "u-edited", "loss-increase", "loss-total", "rank-attr"],
)
def test_every_caller_refuses_the_same_bytes(pair, tmp_path, edit, needle):
    """One reader: noise streams, account, inspect and compress all refuse a forged group."""
    path = _forge(pair[1], tmp_path / "forged.h5", edit)
    art = load_artifact(path)
    with pytest.raises(ArtifactError, match=needle):
        read_compressed(art)
    for kind in ("gradient", "iterate"):
        with pytest.raises(ArtifactError, match=needle):
            noise_stream(path, kind=kind, d=2, seed=1)
    with pytest.raises(ArtifactError, match=needle):
        resolve_strategy(path)
    r = runner.invoke(app, ["account", str(path), "--sigma", "1"])
    assert r.exit_code != 0 and needle.split("/")[-1] in r.stderr and "Traceback" not in r.output
    rep = inspect_artifact(path)
    assert not rep.ok and any(needle in p for p in rep.problems), rep.problems
    # The dense root is still usable when asked for explicitly.
    assert resolve_strategy(path, operator="dense").operator == "dense"
