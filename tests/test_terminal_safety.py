"""``account``, ``compress`` and ``compare`` show file-supplied strings (an artifact's
``workload_name`` and ``strategy_name``, its path) literally: no control character reaches the
terminal raw and no rich markup from a file is interpreted, in every output format.
(``inspect`` has its own test in tests/test_inspect.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import save_artifact
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.dense import optimal_factorization

runner = CliRunner()

EVIL = "opt\x1b[2J\x07[red]x[/red]"
RAW = ("\x1b", "\x07")


@pytest.fixture(scope="module")
def evil(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("evil") / "evil.h5"
    fact = optimal_factorization(prefix_workload(8).matrix, tol=1e-9).factorization
    save_artifact(path, fact, workload_name="prefix", workload_params={}, strategy_name="optimal")
    with h5py.File(path, "r+") as f:  # root attributes carry no checksum
        f.attrs["strategy_name"] = EVIL
        f.attrs["workload_name"] = "prefix" + EVIL
    return path


def _clean(r) -> None:
    for stream in (r.stdout, r.stderr):
        for bad in RAW:
            assert bad not in stream, (bad, stream)


def test_account_table_shows_names_literally(evil):
    r = runner.invoke(app, ["account", str(evil), "--sigma", "1"])
    assert r.exit_code == 0, r.output
    _clean(r)
    shown = "opt\\x1b[2J\\x07[red]x[/red]"
    assert r.stdout.count(shown) >= 2  # the strategy line and the table title
    assert f"prefix{shown} workload" in r.stdout


def test_account_json_keeps_the_exact_string(evil):
    r = runner.invoke(app, ["account", str(evil), "--sigma", "1", "--json"])
    assert r.exit_code == 0, r.output
    _clean(r)
    assert json.loads(r.stdout)["strategy"] == EVIL


def test_account_write_line_is_literal(evil, tmp_path):
    path = tmp_path / "w[red]x[bold]\x1b[2J.h5"
    path.write_bytes(evil.read_bytes())
    r = runner.invoke(app, ["account", str(path), "--sigma", "1", "--write"])
    assert r.exit_code == 0, r.output
    _clean(r)
    assert "recorded: " in r.stdout and "w[red]x[bold]\\x1b[2J.h5" in r.stdout


@pytest.mark.parametrize("as_json", [False, True])
def test_compress_output_path_is_literal(evil, tmp_path, monkeypatch, as_json):
    monkeypatch.chdir(tmp_path)  # a short relative path: the table cell shows it whole
    out = Path("c[red]x[bold]\x1b[2J\x07.h5")
    r = runner.invoke(app, ["compress", str(evil), "--band", "2", "--rank", "1", "--out", str(out)]
                      + (["--json"] if as_json else []))
    assert r.exit_code == 0, r.output
    _clean(r)
    if as_json:
        assert json.loads(r.stdout)["artifact"] == str(out)
    else:
        assert "c[red]x[bold]\\x1b[2J\\x07.h5" in r.stdout
        assert "c[red]x[bold]\\x1b[2J\\x07.h5" in r.stderr  # "wrote ..."


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_compare_artifact_row_name_is_literal(evil, fmt):
    r = runner.invoke(app, ["compare", "-w", "prefix", "--n", "8", "--artifact", str(evil), "--format", fmt, "-q"])
    assert r.exit_code == 0, r.output
    _clean(r)
    if fmt == "json":
        names = [row["name"] for row in json.loads(r.stdout)["strategies"]]
        assert f"{EVIL} ({evil.name})" in names
    else:
        assert "opt\\x1b[2J\\x07[red]x[/red]" in r.stdout
