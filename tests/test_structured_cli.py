"""`mfcli optimize --strategy banded-toeplitz`, `inspect` and `account` of structured artifacts, end to
end (CliRunner and a real subprocess); numbers checked against dense oracles and dp-accounting."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import load_structured_artifact
from mfcli.model.participation import MinSeparation, sensitivity
from mfcli.strategies.toeplitz import materialize

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_optimize_inspect_account_minsep(tmp_path):
    out = tmp_path / "m.h5"
    r = run("optimize", "--workload", "momentum", "--beta", "0.8", "--n", "48", "--strategy", "banded-toeplitz",
            "--bands", "4", "--min-sep", "12", "-o", str(out), "--json", "-q")
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    c = np.array(js["parameters"]["coefs"])
    dense = sensitivity(materialize(c, 48), MinSeparation(separation=12))
    assert js["sensitivity"] == pytest.approx(dense.value, rel=1e-12) and js["sensitivity_exact"]
    a = np.tril(np.ones((48, 48))) @ (0.8 ** np.maximum(np.subtract.outer(np.arange(48), np.arange(48)), 0)
                                       * np.tri(48))
    b = a @ np.linalg.inv(materialize(c, 48))
    assert js["loss"]["mean"] == pytest.approx(dense.value**2 * np.sum(b * b) / 48, rel=1e-10)
    r = run("inspect", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sensitivity"] == js["sensitivity"]
    r = run("account", str(out), "--sigma", "7", "--json")
    assert r.exit_code == 0, r.output
    acc = json.loads(r.stdout)
    dp_accounting = pytest.importorskip("dp_accounting")
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=7 / dense.value))
    eps = acc["settings"]["deterministic"]["epsilon"]  # the declared min-sep schema, no sampling
    assert eps == pytest.approx(pld.get_epsilon(1e-6), rel=1e-3)
    assert eps <= pld.get_epsilon(1e-6) * (1 + 1e-3)


@pytest.mark.parametrize("args,match", [
    (["--n", "100", "--bands", "101"], "exceeds the number of steps"),
    (["--n", "100", "--bands", "0"], "bands must be at least 1"),
    (["--n", "20000000", "--bands", "4"], "at most"),
    (["--n", "100", "--bands", "4", "--lr", "cooldown"], "not Toeplitz"),
    (["--n", "100", "--bands", "4", "--workload", "custom"], "custom"),
    (["--n", "100"], "needs --bands"),
    (["--n", "100", "--bands", "4", "--epochs", "3"], "not divisible"),
    (["--n", "100", "--bands", "4", "--error", "median"], "--error must be mean or max"),
])
def test_optimize_bad_input_is_one_line_and_writes_nothing(tmp_path, args, match):
    out = tmp_path / "x.h5"
    r = run("optimize", "--strategy", "banded-toeplitz", *args, "-o", str(out))
    assert r.exit_code in (1, 2), r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_inspect_and_account_refuse_tampered_structured_artifact(tmp_path):
    out = tmp_path / "p.h5"
    assert run("optimize", "--n", "64", "--strategy", "banded-toeplitz", "--bands", "4", "-o", str(out), "-q").exit_code == 0
    with h5py.File(out, "r+") as f:
        f["structured/coefs"][2] = 0.9
    for args in (["inspect", str(out)], ["account", str(out), "--sigma", "3"]):
        r = run(*args)
        assert r.exit_code == 1
        assert r.stderr.strip().startswith("error:") and "checksum mismatch" in r.stderr and "Traceback" not in r.stderr


def test_account_refuses_what_needs_dense_c(tmp_path):
    # above the materialisation limit (tests/test_structured_accounting.py covers the rest)
    from mfcli.io.artifact import save_structured_artifact
    from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz

    out = tmp_path / "p.h5"
    save_structured_artifact(out, BandedToeplitz.sqrt_init(4), workload=TOEPLITZ_PREFIX, n=8193)
    r = run("account", str(out), "--epsilon", "3", "--sampling", "0.1")  # calibrates MMCC by default
    assert r.exit_code == 1 and "needs the dense strategy C" in r.stderr and "n <= 8192" in r.stderr


def test_subprocess_large_n_writes_parameters_only(tmp_path):
    out = tmp_path / "big.h5"
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "mfcli", "optimize", "--n", "100000", "--strategy", "banded-toeplitz",
                           "--bands", "8", "-o", str(out), "--json", "-q"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    js = json.loads(proc.stdout)
    assert os.path.getsize(out) < 100_000  # parameters, not a 10^5 x 10^5 matrix
    art = load_structured_artifact(out)
    assert art.n == 100_000 and art.strategy.bands == 8
    assert js["loss"]["mean"] == pytest.approx(art.schema_loss.mean, rel=1e-12)
    # the sqrt start truncated to 8 bands is feasible: the optimum cannot be worse
    from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz

    assert art.schema_loss.mean <= BandedToeplitz.sqrt_init(8).loss(100_000, TOEPLITZ_PREFIX).mean


def test_compare_large_n_structured_rows_with_closed_form_identity():
    n = 100_000
    r = run("compare", "--n", str(n), "--workload", "momentum", "--beta", "0.5", "--bands", "4", "--format", "json", "-q")
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    rows = {s["name"]: s for s in js["strategies"]}
    a = (1 - 0.5 ** np.arange(1, n + 1)) / 0.5  # first column of the momentum workload
    identity_total = float(np.dot(np.arange(n, 0, -1), a * a))  # sum_t ||A[t]||^2, A Toeplitz
    assert rows["identity"]["loss_total"] == pytest.approx(identity_total, rel=1e-12)
    assert rows["banded-toeplitz-4"]["loss_total"] < identity_total
    assert js["best_causal"] == min(rows, key=lambda k: rows[k]["loss_total"])  # the tree (closed form) here


def test_compare_small_n_adds_banded_rows_next_to_the_certified_optimum():
    r = run("compare", "--n", "128", "--bands", "8", "--bands", "128", "--strategies", "identity,optimal",
            "--format", "json", "-q")
    assert r.exit_code == 0, r.output
    rows = {s["name"]: s for s in json.loads(r.stdout)["strategies"]}
    opt = rows["optimal"]["loss_total"]
    assert opt <= rows["banded-toeplitz-128"]["loss_total"] <= rows["banded-toeplitz-8"]["loss_total"] * (1 + 1e-9)
    assert rows["banded-toeplitz-128"]["ratio_to_best_causal"] == pytest.approx(rows["banded-toeplitz-128"]["loss_total"] / opt)


def test_compare_large_n_refuses_dense_options():
    r = run("compare", "--n", "100000", "--strategies", "optimal")
    assert r.exit_code == 2 and "needs" not in r.stderr and r.stderr.strip().startswith("error:")
    r = run("compare", "--n", "100000", "--artifact", "x.h5")
    assert r.exit_code == 2 and "dense options do not apply" in r.stderr
