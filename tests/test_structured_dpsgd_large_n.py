"""DP-SGD of a structured artifact above STRUCTURED_DENSE_MAX_N (one accounting path of every kind, mfcli/services/account.py):
it is n Poisson-subsampled Gaussian steps at sigma and needs no C, so account, --epsilon
calibration, --write and inspect's re-verification run at any n, checked against dp-accounting's
PLD accountant called directly; MMCC (which needs C) is left out with a note, or refused in one
line when it is what was asked for. Also mfcli plan writes the DP-SGD candidate there."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from accounting_oracles import dpsgd_epsilon
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import save_structured_artifact
from mfcli.schemas import load_schema, validate
from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz
from mfcli.util.limits import STRUCTURED_DENSE_MAX_N

dp_accounting = pytest.importorskip("dp_accounting")
runner = CliRunner()
N = STRUCTURED_DENSE_MAX_N + 1
P = 0.002


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(r, match):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], r.stderr
    assert "Traceback" not in r.output


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    p = tmp_path_factory.mktemp("big") / "big.h5"
    save_structured_artifact(p, BandedToeplitz(np.array([1.0, 0.5, 0.375])), workload=TOEPLITZ_PREFIX, n=N)
    return p


def test_account_dpsgd_above_limit(big) -> None:
    r = run("account", big, "--sigma", "3", "--sampling", P, "--json", "-q")
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    assert validate(js, load_schema("account")) == []
    assert set(js["settings"]) == {"dp-sgd"}
    assert js["settings"]["dp-sgd"]["epsilon"] == pytest.approx(dpsgd_epsilon(3.0, P, N), rel=1e-9)
    assert len(js["notes"]) == 1 and js["notes"][0].startswith("MMCC: not run") and f"n <= {STRUCTURED_DENSE_MAX_N}" \
        in js["notes"][0]
    text = run("account", big, "--sigma", "3", "--sampling", P, "-q")
    assert text.exit_code == 0 and "MMCC: not run" in text.stdout


def test_calibrate_write_and_inspect_above_limit(tmp_path, big) -> None:
    import shutil

    p = tmp_path / "b.h5"
    shutil.copy(big, p)
    # p = 0.01, epsilon 1: sigma near 4, where each PLD run is cheap
    r = run("account", p, "--epsilon", "1", "--sampling", "0.01", "--setting", "dp-sgd", "--write", "--json", "-q")
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    sigma = js["calibration"]["sigma"]
    assert dpsgd_epsilon(sigma, 0.01, N) <= 1.0 < dpsgd_epsilon(sigma * 0.995, 0.01, N)  # meets the target, tightly
    ins = run("inspect", p, "--json")
    assert ins.exit_code == 0, ins.output
    recs = json.loads(ins.stdout)["accounting_records"]
    assert len(recs) == 1 and recs[0]["verified"] is True
    with h5py.File(p, "r+") as f:
        f[js["written"]["group"]].attrs["sigma"] = sigma * 1.5  # the stored event no longer matches
    one_error_line(run("inspect", p), "dp-sgd")


@pytest.mark.parametrize("args", [
    ["--epsilon", "1", "--sampling", str(P)],  # calibrates MMCC by default
    ["--epsilon", "1", "--sampling", str(P), "--setting", "mmcc"],
])
def test_mmcc_still_refused_above_limit(big, args) -> None:
    one_error_line(run("account", big, *args, "-q"), f"n <= {STRUCTURED_DENSE_MAX_N} only (this one has n = {N})")


def test_plan_writes_dpsgd_above_limit(tmp_path) -> None:
    from mfcli.services.plan import PLD_DISCRETIZATION, Candidate, TrainingSetup, evaluate, write_artifact

    setup = TrainingSetup(examples=10 * N, batch=10, epochs=1, epsilon=0.3)  # sigma near 1: cheap PLDs
    assert setup.n == N
    r = evaluate(setup, Candidate("dp-sgd", "dp-sgd", "poisson"))
    out = tmp_path / "plan.h5"
    written = write_artifact(setup, r, out)
    assert written["epsilon"] <= 0.3
    assert dpsgd_epsilon(r.sigma, 1 / N, N, setup.delta, PLD_DISCRETIZATION) == pytest.approx(written["epsilon"], rel=1e-9)
    ins = run("inspect", out, "--json")
    assert ins.exit_code == 0, ins.output
    assert [rec["verified"] for rec in json.loads(ins.stdout)["accounting_records"]] == [True]


@pytest.mark.parametrize("option", [["--banded-estimate"], ["--tail-fraction", "0.5"], ["--mixture-grid", "0.01"],
                                    ["--max-memory", "1G"]])
def test_mmcc_options_refused_above_limit(big, option) -> None:
    """MMCC does not run on a structured artifact above the limit, so its options are refused in
    one line (usage error) instead of being accepted without effect."""
    r = run("account", big, "--sigma", "4", "--sampling", str(P), *option, "-q")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert option[0] in lines[0] and f"this one has n = {N}" in lines[0]
