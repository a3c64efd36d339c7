"""`mfcli inspect`: stored numbers against recomputation, tamper detection, JSON, plot.

Oracles: plain numpy on what h5py reads (column norms, Frobenius norms), the n = 2 prefix optimum
(golden ratio squared) for the recomputed dual bound, and files edited with h5py or at the byte
level in a temporary directory.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.cli.plots import plot_report
from mfcli.errors import ArtifactError, OutputExistsError
from mfcli.io.artifact import append_group, dataset_sha256, save_artifact, shipped_artifact
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.compress import compress_artifact
from mfcli.services.inspect import inspect_artifact

runner = CliRunner()
GOLDEN_SQ = ((1 + math.sqrt(5)) / 2) ** 2


@pytest.fixture(scope="module")
def solved():
    w = momentum_workload(32, beta=0.9)
    return w, optimal_factorization(w.matrix, tol=1e-10)


@pytest.fixture
def artifact(tmp_path, solved):
    w, res = solved
    path = tmp_path / "m.h5"
    save_artifact(path, res.factorization, workload_name=w.name, workload_params=w.params,
                  strategy_name="optimal", solver=res.certificate(), command="mfcli optimize test",
                  dual_weights=res.dual_weights)
    return path


def flip_byte(path, dataset, index=37):
    """Flip one byte inside a dataset's raw data, located through HDF5's own offset."""
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
        nbytes = f[dataset].id.get_storage_size()
    assert offset is not None and index < nbytes
    with open(path, "r+b") as fh:
        fh.seek(offset + index)
        b = fh.read(1)
        fh.seek(offset + index)
        fh.write(bytes([b[0] ^ 0x5A]))


def test_clean_artifact_numbers_match_plain_numpy(artifact):
    rep = inspect_artifact(artifact)
    assert rep.ok, rep.problems
    with h5py.File(artifact) as f:
        c, b, a = f["strategy"][...], f["decoder"][...], f["workload"][...]
    sens = np.sqrt(np.max(np.sum(c**2, axis=0)))
    rows = np.sum(b**2, axis=1)
    nums = {x.name: x for x in rep.numbers}
    assert nums["sensitivity"].recomputed == pytest.approx(sens, rel=1e-12)
    assert nums["loss_total"].recomputed == pytest.approx(sens**2 * rows.sum(), rel=1e-12)
    assert nums["loss_max"].recomputed == pytest.approx(sens**2 * rows.max(), rel=1e-12)
    assert nums["loss_mean"].recomputed == pytest.approx(sens**2 * rows.sum() / 32, rel=1e-12)
    assert nums["reconstruction_error"].recomputed < 1e-12
    assert np.linalg.norm(b @ c - a) < 1e-10
    assert rep.causal_stored is True and rep.causal_recomputed is True
    assert {name for name, ok in rep.checksums if ok} == {"workload", "strategy", "decoder", "dual_weights"}
    assert rep.provenance["command"] == "mfcli optimize test"
    assert rep.solver["gap"] <= 1e-10 and "method" in rep.solver
    cert = rep.certificate
    assert cert["dual_bound"] <= nums["loss_total"].recomputed
    assert 0 <= cert["certified_gap"] <= 1e-8


def test_certificate_recomputed_against_closed_form(tmp_path):
    res = optimal_factorization(prefix_workload(2).matrix, tol=1e-12)
    path = tmp_path / "p2.h5"
    save_artifact(path, res.factorization, workload_name="prefix", strategy_name="optimal",
                  solver=res.certificate(), dual_weights=res.dual_weights, command="test")
    cert = inspect_artifact(path).certificate
    # The recomputed bound is a lower bound on the known optimum, and tight.
    assert cert["dual_bound"] <= GOLDEN_SQ * (1 + 1e-12)
    assert cert["dual_bound"] == pytest.approx(GOLDEN_SQ, rel=1e-9)
    assert cert["loss_total"] == pytest.approx(GOLDEN_SQ, rel=1e-9)


@pytest.mark.parametrize("attr,value,needle", [
    ("sensitivity", 0.9, "stored sensitivity"),
    ("sensitivity", 1.0 + 1e-6, "stored sensitivity"),
    ("loss_total", 1.0, "stored loss_total"),
    ("loss_max", 2.0, "stored loss_max"),
    ("n", 31, "stored n"),
])
def test_modified_attribute_is_flagged(artifact, attr, value, needle):
    with h5py.File(artifact, "r+") as f:
        f.attrs[attr] = value
    rep = inspect_artifact(artifact)
    assert not rep.ok
    assert any(needle in p for p in rep.problems), rep.problems
    assert all(ok for _, ok in rep.checksums), "checksums cover datasets, not attributes"
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert r.exit_code == 1
    assert "MISMATCH" in r.stdout
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


@pytest.mark.parametrize("dataset", ["strategy", "decoder", "workload", "dual_weights"])
def test_flipped_matrix_byte_is_flagged(artifact, dataset):
    flip_byte(artifact, dataset)
    rep = inspect_artifact(artifact)
    assert not rep.ok
    bad = [name for name, ok in rep.checksums if not ok]
    assert bad == [dataset]
    assert any(f"checksum mismatch in dataset {dataset!r}" in p for p in rep.problems)
    r = runner.invoke(app, ["inspect", str(artifact), "--json"])
    assert r.exit_code == 1
    obj = json.loads(r.stdout)
    assert obj["ok"] is False and obj["checksums"][dataset] is False
    assert "checksum mismatch" in r.stderr


def test_compressed_artifact_is_recomputed_and_tamper_flagged(artifact, tmp_path):
    out = compress_artifact(artifact, band=3, rank=2).path
    rep = inspect_artifact(out)
    assert rep.ok, rep.problems
    assert rep.compression["band"] == 3 and rep.compression["rank"] == 2
    assert rep.compression["stream_cost"] == 5
    nums = {c.name: c for c in rep.compression_numbers}
    with h5py.File(out) as f:
        g = f["compressed"]
        band, u, v, a = g["band"][...], g["u"][...], g["v"][...], f["workload"][...]
    n = a.shape[0]
    t, j = np.indices((n, n))
    b_hat = np.zeros((n, n))
    for i in range(3):
        b_hat[t - j == i] = band[i:, i]
    b_hat += np.where(j <= t - 3, u @ v.T, 0.0)
    c = np.linalg.solve(b_hat, a)
    sens = np.sqrt(np.max(np.sum(c**2, axis=0)))
    assert nums["sensitivity"].recomputed == pytest.approx(sens, rel=1e-10)
    assert nums["loss_total"].recomputed == pytest.approx(sens**2 * np.sum(b_hat**2), rel=1e-10)
    assert rep.compressed.loss_total == pytest.approx(sens**2 * np.sum(b_hat**2), rel=1e-10)
    # Root still describes the dense mechanism.
    assert {x.name: x for x in rep.numbers}["sensitivity"].ok
    with h5py.File(out, "r+") as f:
        f["compressed"].attrs["sensitivity"] = 1.0
    rep = inspect_artifact(out)
    assert not rep.ok and any("compressed/sensitivity" in p for p in rep.problems)
    flip_byte(out, "compressed/v", index=3)
    rep = inspect_artifact(out)
    assert any("checksum mismatch in dataset 'compressed/v'" in p for p in rep.problems)


def test_accounting_records_are_listed(artifact):
    append_group(artifact, "accounting/run1", attrs={"epsilon": 2.5, "delta": 1e-6, "noise_multiplier": 1.1})
    rep = inspect_artifact(artifact)
    assert rep.ok
    assert [r["id"] for r in rep.accounting] == ["run1"]
    assert rep.accounting[0]["attrs"]["epsilon"] == 2.5
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert r.exit_code == 0 and "run1" in r.stdout and "epsilon=2.5" in r.stdout


def test_json_report(artifact):
    r = runner.invoke(app, ["inspect", str(artifact), "--json"])
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["schema_version"] == 3 and obj["command"] == "inspect"
    assert obj["ok"] is True and obj["problems"] == []
    assert obj["format_version"] == 1 and obj["n"] == 32 and obj["strategy"] == "optimal"
    assert obj["workload"] == {"name": "momentum", "params": {"beta": 0.9, "lr": "constant"}}
    assert obj["numbers"]["sensitivity"]["ok"] is True
    assert obj["numbers"]["sensitivity"]["stored"] == obj["numbers"]["sensitivity"]["recomputed"]
    assert set(obj["checksums"]) == {"workload", "strategy", "decoder", "dual_weights"}
    assert obj["compression"] is None and obj["accounting"] == []
    assert obj["certificate"]["certified_gap"] <= 1e-8


def test_plot_writes_png(artifact, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    out = compress_artifact(artifact, band=2, rank=2).path
    png = tmp_path / "plot.png"
    r = runner.invoke(app, ["inspect", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(png)
    assert img.shape[0] > 200 and img.shape[1] > 600
    assert img[..., :3].std() > 0.05, "the plot must not be blank"
    r = runner.invoke(app, ["inspect", str(out), "--plot", str(png)])
    assert r.exit_code != 0 and "already exists" in r.stderr
    r = runner.invoke(app, ["inspect", str(out), "--plot", str(tmp_path / "plot.jpg")])
    assert r.exit_code != 0 and ".png" in r.stderr
    assert not (tmp_path / "plot.jpg").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    with pytest.raises(OutputExistsError):
        plot_report(inspect_artifact(out), png)  # exists, no force


@pytest.mark.parametrize("make,needle", [
    (lambda p: p.write_bytes(p.read_bytes()[:4000]), "truncated or corrupt"),
    (lambda p: p.write_bytes(b"not hdf5 at all"), "truncated or corrupt"),
    (lambda p: p.unlink(), "does not exist"),
])
def test_unreadable_file_one_error_line(artifact, make, needle):
    make(artifact)
    with pytest.raises(ArtifactError):
        inspect_artifact(artifact)
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert r.exit_code != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in r.output


def test_not_an_mfcli_file(tmp_path):
    p = tmp_path / "other.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.ones(3)
    r = runner.invoke(app, ["inspect", str(p)])
    assert r.exit_code != 0 and "not an mfcli artifact" in r.stderr


def test_subprocess_inspect_shipped(tmp_path):
    src = tmp_path / "prefix-n256.h5"
    shutil.copy(shipped_artifact("prefix-n256"), src)
    done = subprocess.run([sys.executable, "-m", "mfcli", "inspect", str(src), "--json", "--no-certificate"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    obj = json.loads(done.stdout)
    assert obj["ok"] is True and obj["n"] == 256 and obj["certificate"].get("dual_bound") is None
    with h5py.File(src) as f:
        c = f["strategy"][...]
    assert obj["numbers"]["sensitivity"]["recomputed"] == pytest.approx(np.sqrt(np.max(np.sum(c**2, axis=0))), rel=1e-12)


# ------------------------------------------------------------------ datasets, certificate, records


def _rehash(f, name, data):
    """Replace a dataset by ``data`` with a valid checksum, as a careful forger would."""
    del f[name]
    f[name] = data
    f[name].attrs["sha256"] = dataset_sha256(np.asarray(data))


def _independent_certified_gap(a, c, b, v):
    """(loss - L(v)) / loss with L(v) = (sum sqrt(eig(D^1/2 A^T A D^1/2)))^2 / sum(v), from numpy."""
    sens = np.sqrt(np.max(np.sum(c**2, axis=0)))
    loss = sens**2 * np.sum(b**2)
    d = np.sqrt(v)
    eig = np.clip(np.linalg.eigvalsh(d[:, None] * (a.T @ a) * d[None, :]), 0, None)
    bound = np.sum(np.sqrt(eig)) ** 2 / np.sum(v)
    return (loss - bound) / loss


def test_stored_gap_below_the_certified_gap_fails(artifact):
    rng = np.random.default_rng(0)
    with h5py.File(artifact, "r+") as f:
        v = f["dual_weights"][...] * rng.uniform(0.2, 5.0, size=32)
        _rehash(f, "dual_weights", v)
        solver = json.loads(f.attrs["solver"])
        solver["gap"] = 1e-15
        f.attrs["solver"] = json.dumps(solver)
        a, c, b = f["workload"][...], f["strategy"][...], f["decoder"][...]
    expected = _independent_certified_gap(a, c, b, v)
    assert expected > 1e-3
    rep = inspect_artifact(artifact)
    assert rep.certificate["certified_gap"] == pytest.approx(expected, rel=1e-6)
    assert any("stored solver gap 1e-15 is below the gap certified" in p for p in rep.problems), rep.problems
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert r.exit_code == 1 and "below the gap certified" in r.stderr
    # Without the recomputation there is nothing to compare; the file is otherwise consistent.
    assert inspect_artifact(artifact, certificate=False).ok


def test_honest_gap_passes(artifact):
    with h5py.File(artifact, "r") as f:
        v = f["dual_weights"][...]
        a, c, b = f["workload"][...], f["strategy"][...], f["decoder"][...]
        stored = json.loads(f.attrs["solver"])["gap"]
    assert _independent_certified_gap(a, c, b, v) <= stored + 1e-10
    assert inspect_artifact(artifact).ok


@pytest.mark.parametrize("weights,needle", [
    (lambda v: -v, "not all positive"),
    (lambda v: np.where(np.arange(v.size) == 3, np.nan, v), "not all finite"),
    (lambda v: v[:-1], "shape (31,), expected (32,)"),
    (lambda v: np.stack([v, v]), "shape (2, 32), expected (32,)"),
])
def test_bad_dual_weights_fail(artifact, weights, needle):
    with h5py.File(artifact, "r+") as f:
        _rehash(f, "dual_weights", weights(f["dual_weights"][...]))
    for cert in (True, False):
        rep = inspect_artifact(artifact, certificate=cert)
        assert any(needle in p for p in rep.problems), rep.problems
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert r.exit_code == 1 and needle in r.stderr


@pytest.mark.parametrize("edit,needle", [
    (lambda f: f.attrs.__setitem__("m", 31), "stored m 31"),
    (lambda f: f.attrs.__setitem__("m", "32"), "stored m '32'"),
    (lambda f: f.attrs.__setitem__("solver", "{not json"), "the solver attribute is not a JSON object"),
    (lambda f: f.attrs.__setitem__("solver", "[1, 2]"), "the solver attribute is not a JSON object"),
    (lambda f: f["decoder"].attrs.__delitem__("sha256"), "dataset 'decoder' has no sha256 checksum"),
    (lambda f: f.create_dataset("notes", data="free text"), "dataset 'notes' is not numeric"),
    (lambda f: f.create_dataset("notes", data=np.ones(3)), "dataset 'notes' has no sha256 checksum"),
    (lambda f: f.create_dataset("accounting/r1/events", data=np.array([b"a", b"b"])),
     "dataset 'accounting/r1/events' is not numeric"),
])
def test_other_inconsistencies_fail(artifact, edit, needle):
    with h5py.File(artifact, "r+") as f:
        edit(f)
    rep = inspect_artifact(artifact)
    assert any(needle in p for p in rep.problems), rep.problems
    r = runner.invoke(app, ["inspect", str(artifact), "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["ok"] is False


def test_string_root_matrix_is_reported_not_crashed(artifact):
    with h5py.File(artifact, "r+") as f:
        del f["decoder"]
        f["decoder"] = np.array([b"x"] * 4)
        f["decoder"].attrs["sha256"] = "0" * 64
    rep = inspect_artifact(artifact)
    assert "dataset 'decoder' is not a readable numeric matrix" in rep.problems
    assert rep.factorization is None
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert r.exit_code == 1 and "Traceback" not in r.output


# ------------------------------------------------------------------ terminal safety

EVIL = "\x1b[2J\x1b[31mOK\rall checks passed\x07 [red]x[/red] \x9b2J"


def test_file_strings_cannot_drive_the_terminal(artifact):
    with h5py.File(artifact, "r+") as f:
        f.attrs["workload_name"] = EVIL
        f.attrs["command"] = EVIL
        f.attrs["workload_params"] = json.dumps({"beta": EVIL})
        f.attrs["solver"] = EVIL
        g = f.create_group("accounting").create_group("r\x1b[2J1")
        g.attrs["note"] = EVIL
        f.create_group("extra\x1b]0;title\x07")
    for args in (["inspect", str(artifact)], ["inspect", str(artifact), "--json"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 1
        for stream in (r.stdout, r.stderr):
            for bad in ("\x1b", "\r", "\x07", "\x9b"):
                assert bad not in stream, (args, bad)
    r = runner.invoke(app, ["inspect", str(artifact)])
    assert "[red]x[/red]" in r.stdout and "\\x1b[2J" in r.stdout
    obj = json.loads(runner.invoke(app, ["inspect", str(artifact), "--json"]).stdout)
    assert obj["workload"]["name"] == EVIL and obj["provenance"]["command"] == EVIL  # data kept exact


def test_error_line_is_sanitized(tmp_path):
    missing = tmp_path / "a\x1b[2J\rb.h5"
    r = runner.invoke(app, ["inspect", str(missing)])
    assert r.exit_code == 1 and "\x1b" not in r.stderr and "\r" not in r.stderr
    assert r.stderr.count("\n") == 1 and "\\x1b[2J\\rb.h5" in r.stderr
