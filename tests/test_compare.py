"""`mfcli compare` and the comparison library: closed-form rows, formats, outputs, bad input."""
from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.cli.render import parse_strategy_names, render_csv, render_markdown
from mfcli.io.artifact import load_artifact
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.services.compare import run_comparison
from mfcli.strategies.baselines import STRATEGY_NAMES

runner = CliRunner()


def sqrt_loss(n: int) -> float:
    """sens^2 ||S^1/2||_F^2 with c_k = binom(2k, k) / 4^k, exactly."""
    c = [Fraction(math.comb(2 * k, k), 4**k) for k in range(n)]
    return float(sum(x * x for x in c) * sum((n - k) * x * x for k, x in enumerate(c)))


def tree_loss(k: int) -> float:
    return float((k + 1) * (k * 2 ** (k - 1) + 1))


def invoke(*args: str):
    return runner.invoke(app, ["compare", *args])


# --- library ---------------------------------------------------------------------------------


def test_prefix_rows_match_closed_forms() -> None:
    n = 16
    table = run_comparison(prefix_workload(n), ["identity", "tree", "sqrt", "honaker-full"])
    assert table.row("identity").loss_total == n * (n + 1) / 2
    assert table.row("tree").loss_total == pytest.approx(tree_loss(4), rel=1e-12)
    assert table.row("sqrt").loss_total == pytest.approx(sqrt_loss(n), rel=1e-12)
    assert table.row("tree").loss_max == pytest.approx(5 * 4)  # sens^2 (K+1) x 4 nodes at t = 14
    assert table.best_causal == "sqrt"
    for r in table.rows:
        assert r.ratio == pytest.approx(r.loss_total / sqrt_loss(n), rel=1e-12)
        assert r.loss_mean == pytest.approx(r.loss_total / n)
        assert r.rmse == pytest.approx(math.sqrt(r.loss_total / n))
        assert r.per_step_rmse.shape == (n,)
        assert np.sum(r.per_step_rmse**2) == pytest.approx(r.loss_total)
    # honaker-full beats the tree but is not causal, so the tree stays the reference.
    pair = run_comparison(prefix_workload(n), ["tree", "honaker-full"])
    assert pair.best_causal == "tree"
    assert not pair.row("honaker-full").causal and pair.row("honaker-full").ratio < 1.0


def test_no_causal_rows_means_no_ratio() -> None:
    table = run_comparison(prefix_workload(4), ["honaker-full"])
    assert table.best_causal is None and math.isnan(table.rows[0].ratio)
    assert table.as_dict()["strategies"][0]["ratio_to_best_causal"] is None


def test_momentum_optimal_is_best_causal() -> None:
    table = run_comparison(momentum_workload(32, beta=0.9), None, tol=1e-8)
    assert [r.name for r in table.rows] == list(STRATEGY_NAMES)
    assert table.best_causal == "optimal"
    opt = table.row("optimal")
    assert opt.sensitivity == pytest.approx(1.0)
    assert opt.solver_gap is not None and opt.solver_gap <= 1e-8
    for r in table.rows:
        if r.causal and r.name != "optimal":
            assert r.ratio > 1.0


@pytest.mark.parametrize(
    "values,expected",
    [
        (None, STRATEGY_NAMES),
        (["tree,sqrt"], ("tree", "sqrt")),
        (["tree", "sqrt", "tree"], ("tree", "sqrt")),
        ([" identity , optimal "], ("identity", "optimal")),
    ],
)
def test_parse_strategy_names(values, expected) -> None:
    assert parse_strategy_names(values) == expected


@pytest.mark.parametrize("values,match", [(["tree,trie"], "unknown strategy 'trie'"), ([","], "empty")])
def test_parse_strategy_names_rejects(values, match) -> None:
    with pytest.raises(Exception, match=match) as info:
        parse_strategy_names(values)
    assert getattr(info.value, "exit_code", None) == 2  # a usage error, like every bad option value


def test_csv_and_markdown_carry_the_numbers() -> None:
    table = run_comparison(prefix_workload(8), ["identity", "tree"])
    rows = list(csv.DictReader(io.StringIO(render_csv(table))))
    assert [r["name"] for r in rows] == ["identity", "tree"]
    assert float(rows[0]["loss_total"]) == 36.0 and float(rows[1]["loss_total"]) == tree_loss(3)
    assert float(rows[1]["ratio"]) == pytest.approx(52 / 36)
    md = render_markdown(table)
    assert "| strategy | causal |" in md and "| tree | yes | 2 | 52 |" in md


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_json_envelope() -> None:
    res = invoke("--workload", "prefix", "--n", "8", "-s", "identity,tree", "--json", "--curves", "-q")
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["command"] == "compare" and obj["schema_version"] == 2 and obj["n"] == 8
    by = {s["name"]: s for s in obj["strategies"]}
    assert by["identity"]["loss_total"] == 36.0
    assert by["tree"]["sensitivity"] == pytest.approx(2.0)
    assert len(by["tree"]["per_step_rmse"]) == 8
    assert by["tree"]["per_step_rmse"][0] == pytest.approx(2.0)  # one leaf, sens 2


def test_cli_table_and_out_file(tmp_path) -> None:
    res = invoke("-w", "momentum", "--n", "16", "--beta", "0.5", "-s", "tree", "-s", "sqrt", "-q")
    assert res.exit_code == 0, res.output
    assert "honaker-online" in res.stdout or "tree" in res.stdout
    assert "beta=0.5" in res.stdout
    out = tmp_path / "t.md"
    res = invoke("-w", "prefix", "--n", "8", "-s", "identity", "--format", "markdown", "--out", str(out), "-q")
    assert res.exit_code == 0, res.output
    assert res.stdout == ""
    assert "| identity | yes | 1 | 36 |" in out.read_text()
    res = invoke("-w", "prefix", "--n", "8", "-s", "identity", "--out", str(out), "-q")
    assert res.exit_code != 0 and "already exists" in res.stderr
    res = invoke("-w", "prefix", "--n", "8", "-s", "identity", "--out", str(out), "--force", "--format", "csv", "-q")
    assert res.exit_code == 0 and out.read_text().startswith("name,causal")


def test_cli_plot(tmp_path) -> None:
    png = tmp_path / "curves.png"
    res = invoke("-w", "prefix", "--n", "16", "-s", "identity,tree,honaker-full", "--plot", str(png), "-q")
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = invoke("-w", "prefix", "--n", "16", "-s", "tree", "--plot", str(tmp_path / "c.pdf"), "-q")
    assert res.exit_code != 0 and "ending in .png" in res.stderr


def test_cli_plot_without_matplotlib(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise
    res = invoke("-w", "prefix", "--n", "8", "-s", "tree", "--plot", str(tmp_path / "p.png"))
    assert res.exit_code != 0
    assert res.stderr.strip().splitlines() == [
        "error: --plot needs matplotlib, which is not installed; install the plot extra: pip install 'mfcli[plot]'"
    ]
    assert not (tmp_path / "p.png").exists()


def test_cli_save_strategy_then_compare_with_artifact(tmp_path) -> None:
    path = tmp_path / "tree16.h5"
    res = invoke(
        "-w", "prefix", "--n", "16", "-s", "identity", "--save-strategy", "tree", "--out", str(path), "--format", "csv", "-q"
    )
    assert res.exit_code == 0, res.output
    # --out named the artifact; the table (which does not list tree) went to stdout.
    assert res.stdout.startswith("name,causal") and "\ntree," not in res.stdout
    art = load_artifact(path)
    assert art.strategy_name == "tree"
    assert art.factorization.loss_total == pytest.approx(tree_loss(4))
    assert art.factorization.strategy.shape == (31, 16)
    np.testing.assert_array_equal(art.groups["baseline"]["datasets"]["release_steps"][:3], [0, 1, 1])
    # The saved baseline is accepted as an artifact row, with the same closed-form loss.
    res = invoke("-w", "prefix", "--n", "16", "-s", "sqrt", "--artifact", str(path), "--json", "-q")
    assert res.exit_code == 0, res.output
    rows = {s["name"]: s for s in json.loads(res.stdout)["strategies"]}
    assert rows["tree (tree16.h5)"]["loss_total"] == pytest.approx(tree_loss(4))
    assert rows["tree (tree16.h5)"]["causal"] is True
    assert json.loads(res.stdout)["best_causal"] == "sqrt"


def test_cli_save_strategy_default_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = invoke("-w", "momentum", "--n", "8", "-s", "identity", "--save-strategy", "sqrt", "-q")
    assert res.exit_code == 0, res.output
    art = load_artifact(tmp_path / "artifacts" / "momentum-sqrt-n8.h5")
    assert art.strategy_name == "sqrt" and art.workload_name == "momentum"


def test_cli_optimal_artifact_from_optimize(tmp_path) -> None:
    opt = tmp_path / "opt.h5"
    res = runner.invoke(app, ["optimize", "-w", "prefix", "--n", "64", "--tol", "1e-8", "--out", str(opt), "-q"])
    assert res.exit_code == 0, res.output
    res = invoke("-w", "prefix", "--n", "64", "-s", "sqrt,optimal", "--artifact", str(opt), "--json", "-q")
    assert res.exit_code == 0, res.output
    rows = {s["name"]: s for s in json.loads(res.stdout)["strategies"]}
    # docs/concepts.md, "Known small cases"
    assert rows["optimal (opt.h5)"]["loss_total"] == pytest.approx(282.2014, abs=1e-3)
    assert rows["sqrt"]["ratio_to_best_causal"] == pytest.approx(sqrt_loss(64) / rows["optimal (opt.h5)"]["loss_total"])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--n", "8", "-s", "tree,bogus"], "unknown strategy 'bogus'"),
        (["--n", "1", "-s", "tree"], "binary tree needs n >= 2"),
        (["--n", "1", "-s", "honaker-online"], "binary tree needs n >= 2"),
        (["--n", "8", "--format", "xml"], "--format must be one of table, markdown, csv, json, got 'xml'"),
        (["--n", "8", "--save-strategy", "bogus"], "--save-strategy: unknown strategy 'bogus' to save"),
        (["--n", "0"], "n must be at least 1"),
        (["-w", "momentum", "--n", "8", "--beta", "1.5"], "beta must be in [0, 1)"),
        (["--n", "8", "--artifact", "nowhere.h5"], "artifact nowhere.h5 does not exist"),
    ],
)
def test_cli_bad_input_one_line(args, message) -> None:
    res = invoke(*args)
    assert res.exit_code != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.output


def test_cli_artifact_for_other_workload_refused(tmp_path) -> None:
    path = tmp_path / "sqrt8.h5"
    assert invoke("--n", "8", "-s", "identity", "--save-strategy", "sqrt", "--out", str(path), "-q").exit_code == 0
    res = invoke("--n", "9", "--artifact", str(path), "-s", "identity")
    assert res.exit_code != 0 and "has n = 8, the table's workload has n = 9" in res.stderr
    res = invoke("-w", "momentum", "--n", "8", "--artifact", str(path), "-s", "identity")
    assert res.exit_code != 0 and "different workload" in res.stderr


def test_subprocess_csv() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mfcli", "compare", "-w", "prefix", "--n", "32", "-s", "identity,tree,sqrt",
         "--format", "csv", "-q"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in csv.DictReader(io.StringIO(proc.stdout))}
    assert float(rows["identity"]["loss_total"]) == 32 * 33 / 2
    assert float(rows["tree"]["loss_total"]) == pytest.approx(tree_loss(5))
    assert float(rows["sqrt"]["loss_total"]) == pytest.approx(sqrt_loss(32), rel=1e-12)
    assert rows["sqrt"]["ratio"] == "1.0"
