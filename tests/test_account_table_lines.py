"""``mfcli account``'s table and its JSON say the same: the line below the table for each setting
with one row is the setting's name and the assumptions its JSON row states (the neighbouring
relation of the batch sampler included), for every batch sampler and schema."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app

runner = CliRunner()

#: The one-row settings and the name their line below the table begins with.
NAMES = {
    "single-pass": "single pass",
    "dp-sgd": "DP-SGD",
    "shuffled-tree": "shuffled tree",
    "deterministic": "deterministic",
    "balls-in-bins-tree": "balls-in-bins tree",
    "dp-sgd-reduction": "DP-SGD reduction",
    "balls-in-bins-dp-sgd": "balls-in-bins DP-SGD (reference)",
}

CASES = [
    ["--strategy", "tree", "--n", "8", "--sigma", "2"],  # no sampling: single pass, the shuffled tree
    ["--strategy", "tree", "--n", "8", "--sigma", "2", "--epochs", "2"],  # deterministic
    ["--strategy", "tree", "--n", "8", "--sigma", "2", "--sampling", "0.1"],  # DP-SGD reference (MMCC its own)
    ["--strategy", "tree", "--n", "8", "--sigma", "2", "--batching", "balls-in-bins"],
    ["--strategy", "tree", "--n", "8", "--sigma", "2", "--batching", "shuffle"],  # zero-out / replace-one
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(a[4:]) or "none" for a in CASES])
def test_each_line_states_the_json_rows_assumptions(args: list[str]) -> None:
    js = runner.invoke(app, ["account", *args, "--json", "-q"])
    assert js.exit_code == 0, js.output
    settings = json.loads(js.stdout)["settings"]
    table = runner.invoke(app, ["account", *args, "-q"], env={"COLUMNS": "5000"})
    assert table.exit_code == 0, table.output
    lines = [line.strip()[2:] for line in table.stdout.splitlines() if line.startswith("  - ")]
    shown = [s for s in settings if s in NAMES]
    assert shown, "the case shows no one-row setting"
    for setting in shown:
        assert f"{NAMES[setting]}: {settings[setting]['assumptions']}" in lines, setting
