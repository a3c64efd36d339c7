"""``mfcli account --batching balls-in-bins|shuffle`` end to end: the rows shown name their batch
sampler and only that one, JSON at full precision equals the library, calibration on the
guarantee, refusals as one error line, records that verify, and one real subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.accounting.balls_in_bins import tree_balls_in_bins
from mfcli.accounting.shuffling import shuffled_dpsgd
from mfcli.cli.app import app
from mfcli.io.artifact import save_artifact
from mfcli.model.factorization import Factorization
from mfcli.strategies.baselines import tree_decoder, tree_strategy_matrix

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["account", *args])


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_balls_in_bins_rows_and_json() -> None:
    out = _json(run("--strategy", "tree", "--n", "8", "--sigma", "2", "--batching", "balls-in-bins", "--json", "-q"))
    assert out["batching"] == "balls-in-bins"
    # no shuffled or Poisson row; the DP-SGD reduction and the balls-in-bins DP-SGD reference assume balls-in-bins too
    assert set(out["settings"]) == {"single-pass", "balls-in-bins-tree", "dp-sgd-reduction", "balls-in-bins-dp-sgd"}
    assert out["settings"]["balls-in-bins-dp-sgd"]["reference"] is True
    assert out["settings"]["balls-in-bins-tree"]["reference"] is False
    rep = out["report"]
    assert rep["epsilon"] == min(out["settings"][k]["epsilon"] for k in ("single-pass", "balls-in-bins-tree",
                                                                          "dp-sgd-reduction"))
    assert rep["setting"] == "balls-in-bins-tree" and rep["line"].startswith("report: epsilon <= ")
    row = out["settings"]["balls-in-bins-tree"]
    lib = tree_balls_in_bins(n=8, sigma=2.0, delta=1e-6)
    assert row["epsilon"] == lib.epsilon and row["bracket"] == [lib.lower, lib.epsilon]  # full precision
    assert row["lower_bound"] <= row["epsilon"] <= out["settings"]["single-pass"]["epsilon"]
    assert row["batching"] == "balls-in-bins"
    table = run("--strategy", "tree", "--n", "8", "--sigma", "2", "--batching", "balls-in-bins", "-q")
    assert table.exit_code == 0, table.output
    assert "balls-in-bins" in table.stdout and "shuffled" not in table.stdout and "Poisson)" not in table.stdout


def test_tree_scaled_by_a_constant(tmp_path: Path) -> None:
    p = tmp_path / "tree3.npy"
    np.save(p, 3.0 * tree_strategy_matrix(8))
    out = _json(run(str(p), "--sigma", "6", "--batching", "balls-in-bins", "--json", "-q"))
    assert out["settings"]["balls-in-bins-tree"]["epsilon"] == tree_balls_in_bins(n=8, sigma=2.0).epsilon


def test_shuffle_rows() -> None:
    out = _json(run("--strategy", "tree", "--n", "16", "--sigma", "4", "--batching", "shuffle", "--json", "-q"))
    assert out["batching"] == "shuffle"
    assert set(out["settings"]) == {"single-pass", "shuffled-tree", "shuffled-dp-sgd", "dp-sgd-reduction"}
    row = out["settings"]["shuffled-dp-sgd"]
    assert row["epsilon"] == shuffled_dpsgd(n=16, sigma=4.0, delta=1e-6).epsilon
    assert row["batching"] == "shuffle"
    # a strategy other than the tree: only the bounds that hold for any order
    other = _json(run("--strategy", "identity", "--n", "16", "--sigma", "4", "--batching", "shuffle", "--json", "-q"))
    assert set(other["settings"]) == {"single-pass", "shuffled-dp-sgd", "dp-sgd-reduction"}
    # C = I: the reduction is the shuffled DP-SGD bound itself (||I||_2 = 1, certified to a few ulps)
    assert other["settings"]["dp-sgd-reduction"]["epsilon"] == pytest.approx(
        other["settings"]["shuffled-dp-sgd"]["epsilon"], rel=1e-6)
    assert other["settings"]["dp-sgd-reduction"]["neighbouring"] == "replace-one"
    table = run("--strategy", "tree", "--n", "16", "--sigma", "4", "--batching", "shuffle", "-q")
    assert table.exit_code == 0 and "balls-in-bins" not in table.stdout and "shuffled epoch" in table.stdout
    # every shuffle row's assumption line says the relation it holds for, as the JSON does
    assert "single pass: " in table.stdout and "add or remove one example" not in table.stdout.split("assumptions:")[1]
    assert table.stdout.strip().splitlines()[-1].startswith("report: epsilon <=")


def test_poisson_rows_unchanged_without_batching() -> None:
    out = _json(run("--strategy", "tree", "--n", "8", "--sigma", "2", "--json", "-q"))
    assert set(out["settings"]) == {"single-pass", "shuffled-tree"}
    assert out["batching"] is None


def test_calibration_on_the_guarantee() -> None:
    out = _json(run("--strategy", "tree", "--n", "4", "--batching", "balls-in-bins", "--epsilon", "2", "--json", "-q"))
    cal = out["calibration"]
    assert cal["setting"] == "balls-in-bins-tree"
    assert out["settings"]["balls-in-bins-tree"]["epsilon"] <= 2.0
    # the guarantee at the lower end of the sigma bracket misses the target
    assert tree_balls_in_bins(n=4, sigma=cal["sigma_bracket"][0]).epsilon > 2.0


def test_balls_in_bins_any_strategy_by_the_reduction() -> None:
    """A C other than the tree gets a balls-in-bins guarantee: the DP-SGD reduction (no tree row)."""
    out = _json(run("--strategy", "sqrt", "--n", "8", "--sigma", "2", "--batching", "balls-in-bins", "--json", "-q"))
    assert set(out["settings"]) == {"single-pass", "dp-sgd-reduction", "balls-in-bins-dp-sgd"}
    red = out["settings"]["dp-sgd-reduction"]
    assert red["sampler"] == "balls-in-bins" and red["neighbouring"] == "add-remove"
    assert out["report"]["setting"] in ("single-pass", "dp-sgd-reduction")
    # n not a power of two: the balls-in-bins DP-SGD bound splits each block into ceil/floor halves, so
    # the reduction applies at any n (its numbers: tests/test_accounting_balls_in_bins_dpsgd.py)
    odd = _json(run("--strategy", "sqrt", "--n", "6", "--sigma", "2", "--batching", "balls-in-bins", "--json", "-q"))
    assert set(odd["settings"]) == {"single-pass", "dp-sgd-reduction", "balls-in-bins-dp-sgd"}
    assert not any("power of two" in s for s in odd.get("notes", []))


BAD = [
    (["--strategy", "tree", "--n", "6", "--sigma", "2", "--batching", "balls-in-bins"], "power of two"),
    (["--strategy", "tree", "--n", "8", "--sigma", "2", "--batching", "shuffle", "--sampling", "0.1"],
     "--batching shuffle does not sample"),
    (["--strategy", "tree", "--n", "8", "--sigma", "2", "--batching", "cyclic-ish"], "--batching must be"),
    (["--strategy", "tree", "--n", "8", "--epsilon", "1", "--batching", "shuffle", "--setting", "mmcc"],
     "does not assume --batching shuffle"),
    (["--strategy", "tree", "--n", "8", "--epsilon", "1", "--setting", "balls-in-bins-tree"], "needs the matching --batching"),
    (["--strategy", "sqrt", "--n", "8", "--epsilon", "1", "--batching", "balls-in-bins", "--setting", "dp-sgd-reduction"],
     "cannot be calibrated yet"),
    (["--strategy", "identity", "--n", "8", "--epsilon", "1", "--batching", "shuffle", "--setting", "shuffled-tree"],
     "needs the binary-tree strategy"),
]


@pytest.mark.parametrize("args,msg", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_error_line(args, msg) -> None:
    r = run(*args)
    assert r.exit_code != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and msg in lines[0], r.stderr
    assert "Traceback" not in r.output


def test_write_and_verify(tmp_path: Path) -> None:
    n = 8
    path = tmp_path / "tree8.h5"
    fact = Factorization(workload=np.tril(np.ones((n, n))), strategy=tree_strategy_matrix(n), decoder=tree_decoder(n),
                         causal=True)
    save_artifact(path, fact, workload_name="prefix", strategy_name="tree")
    r = run(str(path), "--sigma", "2", "--batching", "balls-in-bins", "--write", "-q")
    assert r.exit_code == 0, r.output
    r = run(str(path), "--sigma", "3", "--batching", "shuffle", "--write", "-q")
    assert r.exit_code == 0, r.output
    insp = runner.invoke(app, ["inspect", str(path)])
    assert insp.exit_code == 0, insp.output


def test_subprocess_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mfcli", "account", "--strategy", "tree", "--n", "4", "--sigma", "2",
         "--batching", "balls-in-bins", "--json", "-q"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["settings"]["balls-in-bins-tree"]["epsilon"] == tree_balls_in_bins(n=4, sigma=2.0).epsilon


def test_calibrating_the_shuffled_tree_without_a_sampler_reports_its_guarantee() -> None:
    """The shuffled tree's number is the single-epoch Gaussian bound, valid for any order: asked
    for without --batching it is the reported guarantee (it was shown, then "no guarantee"), and
    it is the Gaussian mechanism's epsilon at sensitivity sqrt(L + 1) (Balle-Wang, by bisection here)."""
    import math

    from scipy.optimize import brentq
    from scipy.stats import norm

    out = _json(run("--strategy", "tree", "--n", "64", "--epsilon", "2", "--setting", "shuffled-tree", "--json", "-q"))
    rep, sigma = out["report"], out["calibration"]["sigma"]
    assert rep["setting"] == "shuffled-tree" and rep["batching"] is None and rep["epsilon"] <= 2.0
    mu = math.sqrt(7) / sigma   # 64 leaves: every column in L + 1 = 7 nodes

    def excess(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - 1e-6
    assert rep["epsilon"] == pytest.approx(brentq(excess, 0.0, 50.0, xtol=1e-12), rel=1e-6)
