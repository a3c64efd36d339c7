"""`mfcli optimize` end to end: CliRunner and real subprocesses."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import load_artifact

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_optimize_json_and_artifact(tmp_path):
    out = tmp_path / "p.h5"
    r = run("optimize", "--workload", "prefix", "--n", "2", "--tol", "1e-12", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["schema_version"] == 2 and obj["command"] == "optimize"
    assert obj["loss"]["total"] == pytest.approx(((1 + math.sqrt(5)) / 2) ** 2, rel=1e-11)
    assert obj["loss"]["mean"] == pytest.approx(obj["loss"]["total"] / 2)
    assert obj["loss"]["rmse"] == pytest.approx(math.sqrt(obj["loss"]["total"] / 2))
    for key in ("sensitivity", "gap", "iterations", "seconds", "artifact", "artifact_sha256", "workload_params"):
        assert key in obj
    art = load_artifact(out)
    assert art.attrs["command"].startswith("mfcli ")
    import hashlib

    assert hashlib.sha256(out.read_bytes()).hexdigest() == obj["artifact_sha256"]


def test_optimize_table_and_plain_progress(tmp_path):
    out = tmp_path / "m.h5"
    r = run("optimize", "-w", "momentum", "--n", "32", "--beta", "0.5", "--lr", "cooldown", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "loss total" in r.stdout and "relative gap" in r.stdout
    assert "iter" in r.stderr  # plain progress lines, not a live display, when not a terminal
    art = load_artifact(out)
    assert art.attrs["workload_params"]["beta"] == 0.5
    assert art.attrs["workload_params"]["lr"]["schedule"] == "cooldown"


def test_quiet_prints_no_progress(tmp_path):
    r = run("optimize", "--n", "8", "--out", str(tmp_path / "q.h5"), "--quiet", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    json.loads(r.stdout)


def test_custom_workload_and_warm_start(tmp_path):
    rng = np.random.default_rng(1)
    a = np.tril(rng.uniform(0.1, 1, size=(12, 12))) + np.eye(12)
    np.save(tmp_path / "a.npy", a)
    np.savetxt(tmp_path / "a.csv", a, delimiter=",")
    r1 = run("optimize", "-w", "custom", "--matrix", str(tmp_path / "a.npy"), "--out", str(tmp_path / "c1.h5"), "--json", "-q")
    r2 = run("optimize", "-w", "custom", "--matrix", str(tmp_path / "a.csv"), "--out", str(tmp_path / "c2.h5"), "--json", "-q")
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    l1, l2 = (json.loads(r.stdout)["loss"]["total"] for r in (r1, r2))
    assert l1 == pytest.approx(l2, rel=1e-6)
    r3 = run("optimize", "-w", "custom", "--matrix", str(tmp_path / "c1.h5"), "--warm-start", str(tmp_path / "c1.h5"),
             "--out", str(tmp_path / "c3.h5"), "--json", "-q", "--tol", "1e-6")
    assert r3.exit_code == 0, r3.output
    assert json.loads(r3.stdout)["iterations"] <= 2


def test_default_output_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("optimize", "-w", "momentum", "--n", "16", "-q")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "artifacts" / "momentum-n16.h5").exists()
    r = run("optimize", "-w", "momentum", "--n", "16", "-q")
    assert r.exit_code == 1 and "already exists" in r.stderr
    assert run("optimize", "-w", "momentum", "--n", "16", "-q", "--force").exit_code == 0


def _bad_files(tmp_path):
    np.save(tmp_path / "rect.npy", np.ones((3, 4)))
    np.save(tmp_path / "upper.npy", np.ones((3, 3)))
    np.save(tmp_path / "sing.npy", np.diag([1.0, 0.0, 2.0]))
    nan = np.eye(3)
    nan[2, 0] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    (tmp_path / "garbage.npy").write_bytes(b"\x00\x01garbage")
    (tmp_path / "text.csv").write_text("a,b\nc,d\n")
    np.save(tmp_path / "lr5.npy", np.ones(5))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--n", "0"], "n must be at least 1"),
        (["--n", "100000"], "too large"),
        (["-w", "momentum", "--n", "8", "--beta", "1.0"], "beta must be in [0, 1)"),
        (["-w", "adam", "--n", "8"], "--workload must be one of prefix, momentum, custom"),
        (["-w", "prefix"], "needs n (the number of steps)"),
        (["--n", "8", "--lr", "{tmp}/lr5.npy"], "has 5 entries, expected n = 8"),
        (["--n", "8", "--lr", "warmup"], "neither a schedule"),
        (["-w", "custom", "--matrix", "{tmp}/rect.npy"], "must be square"),
        (["-w", "custom", "--matrix", "{tmp}/upper.npy"], "not lower-triangular"),
        (["-w", "custom", "--matrix", "{tmp}/sing.npy"], "singular"),
        (["-w", "custom", "--matrix", "{tmp}/nan.npy"], "NaN or inf"),
        (["-w", "custom", "--matrix", "{tmp}/garbage.npy"], "cannot read"),
        (["-w", "custom", "--matrix", "{tmp}/text.csv"], "cannot read"),
        (["-w", "custom", "--matrix", "{tmp}/missing.npy"], "does not exist"),
        (["-w", "custom"], "--workload custom needs --matrix FILE"),
        (["-w", "prefix", "--n", "8", "--matrix", "{tmp}/sing.npy"], "--matrix applies to --workload custom only"),
        (["--n", "8", "--tol", "0"], "tol must be in (0, 1)"),
        (["--n", "8", "--method", "magic"], "unknown method"),
        (["--n", "8", "--warm-start", "{tmp}/garbage.npy"], "not a readable HDF5"),
    ],
)
def test_bad_input_one_line_no_file(tmp_path, args, message):
    _bad_files(tmp_path)
    out = tmp_path / "out.h5"
    args = [a.format(tmp=tmp_path) for a in args]
    r = run("optimize", *args, "--out", str(out))
    assert r.exit_code != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error: "), r.stderr
    assert message in lines[0]
    assert "Traceback" not in r.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.h5")]


def test_interrupt_leaves_no_artifact(tmp_path, monkeypatch):
    from mfcli.cli import optimize as opt

    def interrupt(self, progress):
        if progress.iteration == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(opt.SolverDisplay, "__call__", interrupt)
    out = tmp_path / "x.h5"
    r = run("optimize", "-w", "momentum", "--n", "64", "--out", str(out))
    assert r.exit_code == 130 and "interrupted" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_python_dash_m_and_sigint_subprocess(tmp_path):
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "mfcli", "optimize", "--n", "16", "--out", str(tmp_path / "a.h5"), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n"] == 16
    out = tmp_path / "big.h5"
    proc = subprocess.Popen([sys.executable, "-m", "mfcli", "optimize", "-w", "momentum", "--n", "1500",
                             "--method", "fixed-point", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    line = ""
    while time.time() < deadline and "iter" not in line:
        line = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: np.save(d / "c.npy", np.eye(3) + 0j), "complex"),
        (lambda d: (d / "c.npy").write_bytes(b""), "is empty"),
        (lambda d: np.save(d / "c.npy", np.tril(np.ones((8, 8))) * 1e300), "numerical failure"),
    ],
)
def test_more_bad_matrices_one_line(tmp_path, make, message):
    make(tmp_path)
    r = run("optimize", "-w", "custom", "--matrix", str(tmp_path / "c.npy"), "--out", str(tmp_path / "o.h5"))
    assert r.exit_code != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert not (tmp_path / "o.h5").exists()


def test_refuses_special_and_symlinked_outputs(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run("optimize", "--n", "4", "--out", str(fifo), "--force", "-q")
    assert r.exit_code == 1 and "not a regular file" in r.stderr
    assert fifo.is_fifo()
    real = tmp_path / "real.h5"
    real.write_text("keep")
    link = tmp_path / "link.h5"
    link.symlink_to(real)
    r = run("optimize", "--n", "4", "--out", str(link), "--force", "-q")
    assert r.exit_code == 1 and "symbolic link" in r.stderr
    assert link.is_symlink() and real.read_text() == "keep"
