"""Concurrent writers: no lost update, no double create.

Real processes run the real CLI (tests/cli_driver.py); a file barrier holds each one just before
it takes the writer's lock until all have arrived, so every process has passed its early checks
(and, for appends, read the artifact) before any writes: exactly the interleaving that lost a
record and let two ``optimize --out X`` both succeed. Oracles: the records and files present
afterwards, read back with h5py and ``load_artifact``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from mfcli.io.artifact import load_artifact, save_artifact
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.dense import optimal_factorization

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "cli_driver.py"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks")


def _run_all(arglists: list[list[str]], cwd: Path, barrier: Path) -> list[subprocess.CompletedProcess]:
    barrier.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               DRIVER_BARRIER=f"{barrier}:{len(arglists)}")
    procs = [subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args in arglists]
    out = []
    for p, args in zip(procs, arglists, strict=True):
        o, e = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(args, p.returncode, o, e))
    return out


def test_parallel_account_writes_keep_every_record(tmp_path):
    path = tmp_path / "a.h5"
    w = prefix_workload(16)
    save_artifact(path, optimal_factorization(w.matrix, tol=1e-10).factorization,
                  workload_name=w.name, workload_params=w.params, strategy_name="optimal")
    sigmas = [2.0, 2.5, 3.0, 3.5, 4.0]
    results = _run_all([["account", str(path), "--sigma", str(s), "--write"] for s in sigmas],
                       tmp_path, tmp_path / "barrier")
    assert [r.returncode for r in results] == [0] * len(sigmas), [r.stderr for r in results]
    load_artifact(path)
    with h5py.File(path, "r") as f:
        recorded = sorted(float(g.attrs["sigma"]) for g in f["accounting"].values())
    assert recorded == sigmas
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_parallel_optimize_same_out_exactly_one_wins(tmp_path):
    out = tmp_path / "x.h5"
    results = _run_all([["optimize", "-w", "prefix", "--n", "16", "--out", str(out), "-q"]] * 2,
                       tmp_path, tmp_path / "barrier")
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 1], [r.stderr for r in results]
    loser = next(r for r in results if r.returncode == 1)
    assert loser.stderr.splitlines() == [f"error: {out} already exists (use --force to overwrite)"]
    assert load_artifact(out).n == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["barrier", "x.h5"]


def test_parallel_optimize_with_force_both_succeed_file_whole(tmp_path):
    out = tmp_path / "x.h5"
    results = _run_all([["optimize", "-w", "prefix", "--n", n, "--out", str(out), "-q", "--force"] for n in ("16", "24")],
                       tmp_path, tmp_path / "barrier")
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert load_artifact(out).n in (16, 24)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["barrier", "x.h5"]
