"""``mfcli account`` end to end: CliRunner and one real subprocess."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.accounting.events import event_from_json
from mfcli.cli.app import app
from mfcli.io.artifact import check_datasets, load_artifact, save_artifact, shipped_artifact
from mfcli.model.factorization import Factorization
from mfcli.services.account import read_chunked
from mfcli.strategies.baselines import sqrt_strategy_matrix

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["account", *args])


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture()
def small_artifact(tmp_path: Path) -> Path:
    n = 8
    c = sqrt_strategy_matrix(n)
    s = np.tril(np.ones((n, n)))
    fact = Factorization(workload=s, strategy=c, decoder=c.copy(), causal=True)
    path = tmp_path / "sqrt8.h5"
    save_artifact(path, fact, workload_name="prefix", strategy_name="sqrt")
    return path


def test_identity_mmcc_equals_dpsgd_json() -> None:
    out = _json(run("--strategy", "identity", "--n", "64", "--sigma", "4", "--sampling", "0.01", "--json", "-q"))
    assert out["command"] == "account" and out["schema_version"] == 2
    s = out["settings"]
    assert set(s) == {"single-pass", "dp-sgd", "mmcc", "dp-sgd-reduction"}
    assert s["mmcc"]["epsilon"] == pytest.approx(s["dp-sgd"]["epsilon"], rel=1e-8)
    # C = I: the reduction is DP-SGD itself (||I||_2 = 1 certified to a few ulps)
    assert s["dp-sgd-reduction"]["epsilon"] == pytest.approx(s["dp-sgd"]["epsilon"], rel=1e-6)
    assert s["dp-sgd"]["reference"] is True and s["mmcc"]["reference"] is False
    assert out["report"]["setting"] in ("mmcc", "dp-sgd-reduction")
    assert out["report"]["references"] == {"dp-sgd": s["dp-sgd"]["epsilon"]}
    assert s["dp-sgd"]["epsilon"] == pytest.approx(0.0767230, abs=5e-8)
    lo, hi = s["mmcc"]["bracket"]
    assert lo <= hi
    assert s["mmcc"]["tail_events_K"] == 0


def test_default_is_the_shipped_artifact() -> None:
    r = run("--sigma", "4")
    assert r.exit_code == 0, r.output
    assert "momentum-n256" in r.stdout
    assert "momentum-n256" in r.stderr


def test_tree_table_has_shuffled_row() -> None:
    r = run("--strategy", "tree", "--n", "8", "--sigma", "2", "--sampling", "0.05", "--value-discretization", "1e-2", "-q")
    assert r.exit_code == 0, r.output
    assert "shuffled" in r.stdout and "[" in r.stdout and "assumptions" in r.stdout
    out = _json(run("--strategy", "tree", "--n", "8", "--sigma", "2", "--json", "-q"))
    st = out["settings"]["shuffled-tree"]
    assert st["epsilon"] == pytest.approx(out["settings"]["single-pass"]["epsilon"], rel=1e-12)
    assert st["amplified_epsilon"] is None


def test_npy_input(tmp_path: Path) -> None:
    p = tmp_path / "c.npy"
    np.save(p, sqrt_strategy_matrix(6))
    out = _json(run(str(p), "--sigma", "1", "--sampling", "0.2", "--delta", "1e-2", "--value-discretization", "1e-2",
                    "--json", "-q"))
    assert out["n"] == 6 and out["settings"]["mmcc"]["epsilon"] > out["settings"]["mmcc"]["lower_bound"]


def test_calibration_round_trip() -> None:
    out = _json(run("--strategy", "sqrt", "--n", "8", "--epsilon", "1.5", "--setting", "single-pass", "--json", "-q"))
    cal = out["calibration"]
    assert cal["achieved_epsilon"] <= 1.5 and cal["achieved_epsilon"] >= 1.49
    again = _json(run("--strategy", "sqrt", "--n", "8", "--sigma", repr(cal["sigma"]), "--json", "-q"))
    assert again["settings"]["single-pass"]["epsilon"] == pytest.approx(cal["achieved_epsilon"], rel=1e-12)


def test_write_records_event_without_touching_matrices(small_artifact: Path) -> None:
    before = {name: ok for name, ok in check_datasets(small_artifact)}
    a0 = load_artifact(small_artifact)
    out = _json(run(str(small_artifact), "--sigma", "2", "--sampling", "0.05", "--value-discretization", "1e-2",
                    "--write", "--json", "-q"))
    group = out["written"]["group"]
    art = load_artifact(small_artifact)  # still verifies
    np.testing.assert_array_equal(art.factorization.strategy, a0.factorization.strategy)
    assert {n: ok for n, ok in check_datasets(small_artifact)} == before
    attrs = art.groups[group]["attrs"]
    assert attrs["epsilon_mmcc"] == pytest.approx(out["settings"]["mmcc"]["epsilon"], rel=1e-15)
    assert attrs["sigma"] == 2.0 and attrs["delta"] == 1e-6
    # the recorded event is what was composed: dp-accounting's own accountant agrees
    from dp_accounting.pld import pld_privacy_accountant

    ev = event_from_json(read_chunked(attrs, "dp_event_mmcc"))
    grid = out["settings"]["mmcc"]["value_discretization"]
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=grid)
    acc.compose(ev)
    assert acc.get_epsilon(out["settings"]["mmcc"]["delta_pld"]) == pytest.approx(attrs["epsilon_mmcc"], rel=1e-6)
    ev_sgd = event_from_json(read_chunked(attrs, "dp_event_dp_sgd"))
    assert ev_sgd.count == 8
    results = json.loads(read_chunked(attrs, "results"))
    assert set(results) == {"single-pass", "dp-sgd", "mmcc"}
    # a second record is a second group
    _json(run(str(small_artifact), "--sigma", "3", "--write", "--json", "-q"))
    assert len([g for g in load_artifact(small_artifact).groups if g.startswith("accounting/")]) == 2


def test_write_large_event_in_parts(tmp_path: Path) -> None:
    path = tmp_path / "prefix.h5"
    shutil.copyfile(shipped_artifact("prefix-n256"), path)
    r = run(str(path), "--sigma", "8", "--sampling", "0.002", "--value-discretization", "1e-3", "--write", "--json", "-q")
    out = _json(r)
    attrs = load_artifact(path).groups[out["written"]["group"]]["attrs"]
    assert attrs.get("dp_event_mmcc_parts", 0) >= 2
    ev = event_from_json(read_chunked(attrs, "dp_event_mmcc"))
    assert len(ev.events) == out["settings"]["mmcc"]["distinct_rows"]


BAD = [
    (["--strategy", "identity", "--n", "4", "--sigma", "0"], "sigma"),
    (["--strategy", "identity", "--n", "4", "--sigma", "-1"], "sigma"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--sampling", "0"], "sampling rate"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--sampling", "1.5"], "sampling rate"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--delta", "1"], "delta"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--delta", "0"], "delta"),
    (["--strategy", "identity", "--n", "4"], "exactly one"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--epsilon", "1"], "exactly one"),
    (["--strategy", "identity", "--sigma", "1"], "--n"),
    (["--strategy", "banana", "--n", "4", "--sigma", "1"], "unknown strategy"),
    (["/nonexistent/c.npy", "--sigma", "1"], "does not exist"),
    (["--strategy", "identity", "--n", "4", "--epsilon", "1e-9", "--setting", "dp-sgd", "--sampling", "0.5"], "no sigma"),
    (["--strategy", "identity", "--n", "4", "--epsilon", "1", "--setting", "nope"], "unknown setting"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--write"], "--write needs an artifact"),
    (["--strategy", "identity", "--n", "4", "--epsilon", "1", "--setting", "mmcc"], "calibrating mmcc needs --sampling"),
    (["--strategy", "identity", "--n", "4", "--epsilon", "1", "--setting", "dp-sgd"], "calibrating dp-sgd needs --sampling"),
    (["x.npy", "--strategy", "identity", "--n", "4", "--sigma", "1"], "either a strategy file or --strategy"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--value-discretization", "0"], "discretization"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--sampling", "0.5", "--mixture-grid", "0"],
     r"--mixture-grid: the mixture grid must be in (0, 1], got 0.0"),
    (["--strategy", "identity", "--n", "4", "--sigma", "1", "--sampling", "0.5", "--mixture-grid", "1.5"],
     r"--mixture-grid: the mixture grid must be in (0, 1], got 1.5"),
]


@pytest.mark.parametrize("args,msg", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_error_line(args, msg) -> None:
    r = run(*args)
    assert r.exit_code != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and msg in lines[0], r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize(
    "matrix,msg",
    [(np.array([[1.0, 0.0], [-0.5, 1.0]]), "non-negative"), (np.array([[1.0, 0.3], [0.0, 1.0]]), "not causal"),
     (np.ones((3, 2)), "square")],
)
def test_bad_matrix_for_mmcc(tmp_path: Path, matrix, msg) -> None:
    p = tmp_path / "bad.npy"
    np.save(p, matrix)
    # calibrating MMCC is refused in one line (accounting shows the other rows: tests/test_audit_fixes.py)
    r = run(str(p), "--epsilon", "1", "--sampling", "0.1")
    assert r.exit_code != 0 and msg in r.stderr and "Traceback" not in r.output


def test_write_on_npy_leaves_nothing(tmp_path: Path) -> None:
    p = tmp_path / "c.npy"
    np.save(p, np.eye(3))
    r = run(str(p), "--sigma", "1", "--write")
    assert r.exit_code != 0 and sorted(x.name for x in tmp_path.iterdir()) == ["c.npy"]


def test_subprocess_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mfcli", "account", "--strategy", "identity", "--n", "8", "--sigma", "2",
         "--sampling", "0.1", "--json", "-q"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["settings"]["mmcc"]["epsilon"] == pytest.approx(out["settings"]["dp-sgd"]["epsilon"], rel=1e-8)
    bad = subprocess.run([sys.executable, "-m", "mfcli", "account", "--sigma", "-2"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error:") and "Traceback" not in bad.stderr


def test_n_without_builtin_strategy_is_refused():
    from mfcli.cli.app import app

    r = CliRunner().invoke(app, ["account", "--n", "8", "--sigma", "4"])
    assert r.exit_code == 2  # a usage error (README: exit codes)
    assert r.stderr.strip().splitlines() == [
        "error: --n applies to a built-in --strategy; an artifact or .npy strategy has its own n"
    ]


def test_write_refuses_shipped_artifact_by_path():
    from mfcli.cli.app import app

    before = shipped_artifact("momentum-n256").read_bytes()
    r = CliRunner().invoke(app, ["account", str(shipped_artifact("momentum-n256")), "--sigma", "4", "--write"])
    assert r.exit_code == 1 and "shipped artifact" in r.stderr
    assert shipped_artifact("momentum-n256").read_bytes() == before


def test_default_table_is_short_and_details_add_the_method() -> None:
    """The default table: setting, epsilon, what it assumes; --details adds each row's numbers (the
    JSON always has them); both end with the number to report."""
    base = ["--strategy", "identity", "--n", "16", "--sigma", "4", "--sampling", "0.01", "--value-discretization",
            "1e-3", "-q"]
    short = runner.invoke(app, ["account", *base], env={"COLUMNS": "300"})
    full = runner.invoke(app, ["account", *base, "--details"], env={"COLUMNS": "300"})
    assert short.exit_code == 0 and full.exit_code == 0, short.output + full.output
    assert "details" not in short.stdout.split("assumptions:")[0] and "details" in full.stdout
    assert "sanity bound" in full.stdout and "sanity bound" not in short.stdout
    for out in (short.stdout, full.stdout):
        last = out.strip().splitlines()[-1]
        assert last.startswith("report: epsilon <= ") and "Poisson sampling at rate 0.01" in last
        assert "references, another mechanism" in out  # the DP-SGD row is labelled as a reference


@pytest.mark.parametrize("setting, batching, instead", [
    ("dp-sgd", ["--sampling", "0.01"], "mmcc"),
    ("shuffled-dp-sgd", ["--batching", "shuffle"], "shuffled-tree or single-pass"),
])
def test_a_reference_calibration_says_it_is_not_this_c(setting: str, batching: list[str], instead: str) -> None:
    """Calibrating a DP-SGD reference row (C = I) for another C labels the sigma as the reference's
    (reviewer: shuffled-dp-sgd's box did not)."""
    from typer.testing import CliRunner

    from mfcli.cli.app import app

    res = CliRunner().invoke(app, ["account", "--strategy", "tree", "--n", "64", "--epsilon", "2", "--setting", setting,
                                   *batching])
    assert res.exit_code == 0, res.output
    assert (f"calibration: {setting} (the DP-SGD reference, C = I: NOT a sigma for this C; calibrate {instead} for it)"
            in " ".join(res.stdout.split()))
