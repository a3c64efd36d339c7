"""``mfcli compare --epsilon``: every row calibrated to the same (epsilon, delta) under its best
valid accounting, checked against the closed-form Gaussian and dp-accounting's DP-SGD."""
from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from accounting_oracles import dpsgd_epsilon, gaussian_epsilon
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.model.participation import MinSeparation, SingleParticipation, sensitivity
from mfcli.model.workloads import prefix_workload
from mfcli.strategies.baselines import build_strategy

runner = CliRunner()
DELTA = 1e-6


def compare_json(*args: str) -> dict:
    r = runner.invoke(app, ["compare", *args, "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("options, schema", [
    ([], SingleParticipation()),
    (["--min-sep", "4"], MinSeparation(separation=4)),
], ids=["single", "minsep"])
def test_without_sampling_every_row_is_the_gaussian_at_its_sensitivity(options, schema):
    n, eps = 16, 1.5
    out = compare_json("-n", str(n), "-s", "identity,tree,sqrt", "--epsilon", str(eps), *options)
    assert out["at_equal_privacy"]["batch_sampler"] == "deterministic"
    w = prefix_workload(n)
    for row in out["strategies"]:
        f = build_strategy(row["name"], w).factorization
        sens = sensitivity(f.strategy, schema).value
        got = row["at_equal_privacy"]
        # sigma meets the target (closed form) and is within the calibration tolerance of the smallest
        assert gaussian_epsilon(sens / got["sigma"]) <= eps * (1 + 1e-9)
        assert gaussian_epsilon(sens / (got["sigma"] * (1 - 2e-4))) > eps
        assert got["rmse"] == pytest.approx(got["sigma"] * np.linalg.norm(f.decoder) / math.sqrt(n), rel=1e-12)
        assert got["accounting"] == ("single-pass" if not options else "deterministic")
    # the same noise multiplier for all: the order at equal privacy is the order of the losses
    order = sorted(out["strategies"], key=lambda r: r["at_equal_privacy"]["rmse"])
    assert [r["name"] for r in order] == [r["name"] for r in sorted(out["strategies"], key=lambda r: r["loss_total"])]


def test_with_sampling_banded_rows_use_cyclic_poisson():
    n, b, eps, p = 16, 4, 2.0, 0.1
    out = compare_json("-n", str(n), "-s", "identity,sqrt", "--min-sep", str(b), "--epsilon", str(eps),
                       "--sampling", str(p))
    ident = next(r for r in out["strategies"] if r["name"] == "identity")["at_equal_privacy"]
    assert ident["accounting"] == "cyclic-poisson"
    steps = n // b
    assert dpsgd_epsilon(ident["sigma"], p, steps) <= eps * (1 + 1e-9)
    assert dpsgd_epsilon(ident["sigma"] * (1 - 2e-4), p, steps) > eps
    assert ident["sigma"] < ident["sigma_by_accounting"]["deterministic"]
    sq = next(r for r in out["strategies"] if r["name"] == "sqrt")["at_equal_privacy"]
    assert sq["accounting"] == "deterministic" and "at most b = 4 bands" in sq["note"]
    assert set(sq["sigma_by_accounting"]) == {"deterministic"}
    assert out["at_equal_privacy"]["best_causal"] == "identity"


def test_single_participation_with_sampling_is_one_amplified_step():
    """b = n under single participation: every causal square C qualifies, one sampled step."""
    out = compare_json("-n", "8", "-s", "sqrt", "--epsilon", "1", "--sampling", "0.05")
    row = out["strategies"][0]
    got = row["at_equal_privacy"]
    assert got["accounting"] == "cyclic-poisson"
    assert dpsgd_epsilon(got["sigma"] / row["sensitivity"], 0.05, 1) <= 1 + 1e-9


@pytest.mark.parametrize("fmt", ["csv", "markdown", "table"])
def test_renderings_carry_the_columns(fmt):
    r = runner.invoke(app, ["compare", "-n", "8", "-s", "identity", "--epsilon", "1", "-f", fmt, "-q"])
    assert r.exit_code == 0, r.stderr
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(r.stdout)))
        assert rows[0]["accounting"] == "single-pass" and float(rows[0]["sigma"]) > 0
    else:
        assert "epsilon = 1" in r.stdout and "single-pass" in r.stdout


def test_a_cap_the_cycle_never_reaches_is_accepted(tmp_path):
    """Cyclic Poisson with b = 2 over n = 8 steps gives an example at most ceil(8 / 2) = 4
    participations: a cap of 4 changes nothing (accepted, as account and the fixed-order sampler
    do); a cap of 2 binds and is refused (the case above)."""
    r = runner.invoke(app, ["compare", "-n", "8", "-s", "identity", "--epsilon", "1", "--sampling", "0.1",
                            "--min-sep", "2", "--max-participations", "4", "--json"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, needle", [
    (["--sampling", "0.1"], "give --epsilon"),
    (["--delta", "1e-5"], "give --epsilon"),
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "1", "--delta", "2"], "delta"),
    (["--epsilon", "1", "--sampling", "1.5"], "sampling rate"),
    (["--epsilon", "1", "--sampling", "0.1", "--min-sep", "2", "--max-participations", "2"], "cannot cap"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needle):
    out = tmp_path / "t.md"
    r = runner.invoke(app, ["compare", "-n", "8", "-s", "identity", *args, "--out", str(out)])
    assert r.exit_code != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
