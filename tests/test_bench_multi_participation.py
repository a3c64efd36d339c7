"""scripts/bench_multi_participation.py: its scoring against closed forms, the merge of jax_privacy
rows saved by one run into the table of another (pairing by problem, missing rows), and, where
jax_privacy is installed, a jax_privacy solve stopped by its CPU budget at n = 16."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mfcli.model.participation import FixedEpoch, MinSeparation
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.multi_solver import multi_participation_factorization

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_multi_participation.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_multi_participation", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# n = 16, prefix (||A||_F^2 = n (n + 1) / 2 = 136), 4 epochs / min-sep 4 (k = 4 either way).
# C = c I: X = c^2 I, sens^2 = 4 c^2, loss = sens^2 * 136 / c^2 / 16 = 34 for every c.
# C = A (prefix): B = I, loss = sens^2; fixed-epoch sens^2 = b k (k + 1) (2k + 1) / 6 = 120, and
# min-sep 4 (X_il = n - max(i, l) >= 0, largest on the earliest pattern 0, 4, 8, 12): 16 + 12 + 8
# + 4 + 2 (12 + 8 + 4 + 8 + 4 + 4) = 120 too.
@pytest.mark.parametrize(("c_name", "schema", "sens2", "loss"), [
    ("identity", FixedEpoch(epochs=4), 4.0, 34.0),
    ("2 identity", FixedEpoch(epochs=4), 16.0, 34.0),
    ("identity", MinSeparation(separation=4), 4.0, 34.0),
    ("prefix", FixedEpoch(epochs=4), 120.0, 120.0),
    ("prefix", MinSeparation(separation=4), 120.0, 120.0),
])
def test_score_closed_forms(bench, c_name, schema, sens2, loss):
    a = prefix_workload(16).matrix
    c = {"identity": np.eye(16), "2 identity": 2 * np.eye(16), "prefix": a}[c_name]
    sens, exact, got = bench._score(a, c, schema)
    assert exact
    assert sens**2 == pytest.approx(sens2, rel=1e-12)
    assert got == pytest.approx(loss, rel=1e-12)


def _table(text: str) -> list[list[str]]:
    """The rows of the first markdown table in ``text``, cells stripped."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        if not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]


FE = {"epochs": 4, "kind": "fixed-epoch", "version": 1}
MS = {"kind": "min-sep", "max_participations": None, "separation": 4, "version": 1}


def _jax_row(schema, solver, **kw):
    row = {"workload": "prefix", "n": 16, "schema": schema, "solver": solver, "status": "ok", "exact": True,
           "cpu_seconds": 12.0, "seconds": 30.0, "steps": 7, "stop": "CPU budget", "threads": "1 core",
           "load": 3.0}
    row.update(kw)
    return row


def test_no_jax_run_pairs_saved_jax_rows(bench, tmp_path):
    """--no-jax --jax-json: each saved jax_privacy row sits under the mfcli row of its problem, its
    ratio and gap are computed from that mfcli row; absent rows say "not run"."""
    saved = tmp_path / "jax.json"
    bench.save_rows(str(saved), [
        _jax_row(FE, "dense-epochs", sensitivity=1.0, loss_mean=50.0,
                 trajectory=[{"mark": 10.0, "cpu_seconds": 10.2, "steps": 3, "loss_mean": 60.0,
                              "sensitivity": 1.0, "exact": True, "own_loss": 60.0}]),
        {"workload": "prefix", "n": 16, "schema": MS, "solver": "dense-bands",
         "status": "killed at 600 s wall (a single step did not return)"},
        # A problem this run does not solve (n = 32): its mfcli row says "not run".
        _jax_row({"epochs": 4, "kind": "fixed-epoch", "version": 1}, "dense-epochs", n=32, sensitivity=1.0,
                 loss_mean=70.0),
    ])
    mine = tmp_path / "mfcli.json"
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--no-jax", "--jax-json", str(saved), "--json", str(mine),
                           "--sizes", "16", "--epochs", "4", "--bands", "4", "--workloads", "prefix"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    mf = {r["schema"]["kind"]: r for r in bench.load_rows(str(mine))}
    assert {r["solver"] for r in bench.load_rows(str(mine))} == {"mfcli"}  # jax rows are not copied in
    fe = mf["fixed-epoch"]
    assert fe["sensitivity"] == pytest.approx(1.0, abs=1e-9)
    rows = _table(proc.stdout)
    cells = [(r[0], r[1], r[2], r[3].split(" (")[0], r[4]) for r in rows]
    assert cells == [
        ("prefix", "16", "4 epochs", "mfcli", "certified"),
        ("prefix", "16", "4 epochs", "jax_privacy dense.optimize", "CPU budget"),
        ("prefix", "16", "min-sep 4 (k = 4)", "mfcli", "certified"),
        ("prefix", "16", "min-sep 4 (k = 4)", "jax_privacy dense.optimize",
         "killed at 600 s wall (a single step did not return)"),
        ("prefix", "16", "min-sep 4 (k = 4)", "jax_privacy banded.optimize", "not run"),
        ("prefix", "32", "4 epochs", "mfcli", "not run"),
        ("prefix", "32", "4 epochs", "jax_privacy dense.optimize", "CPU budget"),
    ]
    jrow = rows[1]
    assert float(jrow[7]) == 50.0
    assert float(jrow[8]) == pytest.approx(50.0 / fe["loss_mean"], rel=1e-6)
    assert float(jrow[11]) == pytest.approx((50.0 - fe["dual_mean"]) / 50.0, rel=0.06)
    assert rows[6][8] == ""  # no mfcli row of n = 32 to divide by
    # The trajectory table: the loss and its gap to mfcli's dual at the 10 s mark and at the stop;
    # without an mfcli row (n = 32) the loss alone.
    traj = _table(proc.stdout.split("\n\n", 1)[1])
    assert [t[:4] for t in traj] == [["prefix", "16", "4 epochs", "jax_privacy dense.optimize"],
                                     ["prefix", "32", "4 epochs", "jax_privacy dense.optimize"]]
    loss, gap = traj[0][4].split()
    assert float(loss) == 60.0
    assert float(gap.strip("()")) == pytest.approx((60.0 - fe["dual_mean"]) / 60.0, rel=0.06)
    assert traj[0][5].split()[0] == "50" and traj[0][5].endswith("at 12")
    assert traj[1][4:] == ["", "70 at 12", "not run"]
    # --render pairs the same files the same way, without solving.
    again = subprocess.run([sys.executable, str(SCRIPT), "--render", "--json", str(mine), "--jax-json", str(saved)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and _table(again.stdout) == rows


def test_without_jax_privacy_rows_say_not_installed(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_has_jax", lambda: False)
    assert bench.main(["--sizes", "16", "--epochs", "4", "--bands", "4", "--workloads", "prefix"]) == 0
    rows = _table(capsys.readouterr().out)
    assert [r[4] for r in rows if r[3].startswith("jax_privacy")] == ["not installed"] * 3
    assert bench.main(["--only-jax", "--sizes", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --only-jax needs jax_privacy installed in this interpreter"]


def test_budget_stopped_jax_run_is_scored(bench):
    """One child process (jax's import and compilation dominate: a few CPU s)."""
    pytest.importorskip("jax_privacy")
    a = prefix_workload(16).matrix
    schema = FixedEpoch(epochs=4)
    sens = 1.0  # dense.optimize keeps X orthogonal across epochs, each residue's diagonal sum 1
    args = argparse.Namespace(jax_max_n=2048, jax_budget=0.5, jax_wall_limit=240.0, jax_steps=None,
                              jax_marks=[0.0])
    row = bench._jax("prefix", a, schema, "dense-epochs", args)
    assert row["status"] == "ok", row["status"]
    # The first step (with its compilation) outlasts 0.5 CPU s: stopped by the budget after it.
    assert (row["stop"], row["steps"]) == ("CPU budget", 1)
    assert row["cpu_seconds"] >= 0.5
    assert row["x64"] and row["dtype"] == "float64"
    assert row["exact"] and row["sensitivity"] == pytest.approx(sens, rel=1e-9)
    [mark] = row["trajectory"]
    assert mark["steps"] == 1 and mark["sensitivity"] == pytest.approx(sens, rel=1e-9)
    # One step from the identity cannot beat mfcli's certified lower bound on the optimum.
    res = multi_participation_factorization(a, schema, tol=1e-8)
    assert row["loss_mean"] >= res.dual / 16 * (1 - 1e-12)
    assert row["loss_mean"] > res.loss_total / 16 * (1 + 1e-6)
    assert json.loads(json.dumps(row)) == row  # the row is what --json saves
