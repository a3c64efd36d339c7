"""Links refused: only plain datasets and groups, each at one path, data inside the file.

Every kind of HDF5 indirection (soft, external, hard link, dangling link inside a group, a
virtual dataset) is built with h5py in a temporary directory; the loader, every subcommand that
reads an artifact, and ``inspect`` must refuse it with one ``error:`` line. Before, every command
raised a KeyError traceback, and ``inspect`` passed a decoder that was an external link to an
unhashed file.
"""
from __future__ import annotations

import json

import h5py
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import ArtifactError
from mfcli.io.artifact import dataset_sha256, load_artifact, save_artifact
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.inspect import inspect_artifact

runner = CliRunner()


@pytest.fixture(scope="module")
def fact():
    return optimal_factorization(prefix_workload(8).matrix, tol=1e-10).factorization


@pytest.fixture
def artifact(tmp_path, fact):
    path = tmp_path / "a.h5"
    save_artifact(path, fact, workload_name="prefix", workload_params={}, strategy_name="optimal")
    return path


def _soft(f, tmp_path):
    f.move("decoder", "decoder_data")
    f["decoder"] = h5py.SoftLink("/decoder_data")


def _external(f, tmp_path):
    # The decoder lives in another file, with a valid checksum there: nothing in this file hashes it.
    data = f["decoder"][...]
    with h5py.File(tmp_path / "ext.h5", "w") as g:
        g["decoder"] = data
        g["decoder"].attrs["sha256"] = dataset_sha256(data)
    del f["decoder"]
    f["decoder"] = h5py.ExternalLink(str(tmp_path / "ext.h5"), "/decoder")


def _hard(f, tmp_path):
    f["strategy_copy"] = f["strategy"]  # one object, two names


def _dangling_in_group(f, tmp_path):
    f.create_group("accounting")
    f["accounting/r1"] = h5py.SoftLink("/nowhere")


def _virtual(f, tmp_path):
    data = f["decoder"][...]
    with h5py.File(tmp_path / "src.h5", "w") as g:
        g["d"] = data
    layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
    layout[...] = h5py.VirtualSource(str(tmp_path / "src.h5"), "d", shape=data.shape)
    del f["decoder"]
    f.create_virtual_dataset("decoder", layout)
    f["decoder"].attrs["sha256"] = dataset_sha256(data)


LINKS = [
    (_soft, "'decoder' is a soft link to '/decoder_data'"),
    (_external, "'decoder' is an external link to '/decoder' in file"),
    (_hard, "is a hard link: the same object is reachable by 2 paths"),
    (_dangling_in_group, "'accounting/r1' is a soft link to '/nowhere'"),
    (_virtual, "'decoder' is a virtual dataset"),
]


def _make(path, tmp_path, how):
    with h5py.File(path, "r+") as f:
        how(f, tmp_path)


@pytest.mark.parametrize("how,needle", LINKS, ids=[h.__name__.strip("_") for h, _ in LINKS])
def test_loader_refuses(artifact, tmp_path, how, needle):
    _make(artifact, tmp_path, how)
    with pytest.raises(ArtifactError, match="an artifact holds only plain datasets and groups") as err:
        load_artifact(artifact)
    assert needle in str(err.value)


@pytest.mark.parametrize("how,needle", LINKS, ids=[h.__name__.strip("_") for h, _ in LINKS])
def test_inspect_reports_and_fails(artifact, tmp_path, how, needle):
    _make(artifact, tmp_path, how)
    rep = inspect_artifact(artifact)
    assert not rep.ok and any(needle in p for p in rep.problems), rep.problems
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert r.exit_code == 1 and "all checks passed" not in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error:")
    r = runner.invoke(app, ["inspect", str(artifact), "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["ok"] is False


@pytest.mark.parametrize("args", [
    ["account", "{a}", "--sigma", "3"],
    ["account", "{a}", "--sigma", "3", "--write"],
    ["compress", "{a}", "-k", "2", "-r", "1", "--out", "{d}/c.h5"],
    ["optimize", "-w", "prefix", "--n", "8", "--warm-start", "{a}", "--out", "{d}/o.h5", "-q"],
    ["optimize", "-w", "custom", "--matrix", "{a}", "--out", "{d}/o.h5", "-q"],
], ids=["account", "account-write", "compress", "warm-start", "custom-matrix"])
@pytest.mark.parametrize("how,needle", LINKS[:3], ids=["soft", "external", "hard"])
def test_every_reader_refuses_with_one_line(artifact, tmp_path, how, needle, args):
    _make(artifact, tmp_path, how)
    before = artifact.read_bytes()
    r = runner.invoke(app, [a.format(a=artifact, d=tmp_path) for a in args])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output
    assert artifact.read_bytes() == before
    assert not (tmp_path / "c.h5").exists() and not (tmp_path / "o.h5").exists()


def test_plain_artifact_has_no_structure_problems(artifact):
    from mfcli.io.artifact import structure_problems

    with h5py.File(artifact, "r") as f:
        assert structure_problems(f) == []
    assert inspect_artifact(artifact).ok
