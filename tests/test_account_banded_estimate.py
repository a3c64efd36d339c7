"""``account``'s importance-sampled ESTIMATE of a banded C's exact Poisson pair is opt-in
(``--banded-estimate``, ``AccountingOptions(banded_estimate=True)``): by default it is not run
(its budget costs seconds of CPU even at n = 8) and a one-line note says how to get it; on
request the MMCC row carries the library's estimate, labelled as one."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.accounting import banded_poisson
from mfcli.cli.app import app
from mfcli.schemas import load_schema, validate
from mfcli.services.account import ESTIMATE_NOT_REQUESTED, AccountingOptions, account, resolve_strategy

runner = CliRunner()
WIDE = {"COLUMNS": "600"}  # table cells on one line each
IDENTITY = ["account", "--strategy", "identity", "--n", "8", "--sigma", "4", "--sampling", "0.01"]


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("the banded estimate ran without being requested")


def test_library_default_runs_no_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(banded_poisson, "estimate_epsilon", _never)
    inp = resolve_strategy(None, strategy="identity", n=8)
    br = account(inp, sigma=4.0, sampling=0.01, options=AccountingOptions()).mmcc
    assert br is not None and br.estimate is None and br.banded_note == ESTIMATE_NOT_REQUESTED
    assert br.lower_rows is not None and br.lower_rows.band == 1  # the certified lower bound still runs
    row = br.as_dict()
    assert "estimate" not in row and row["estimate_note"] == ESTIMATE_NOT_REQUESTED


def test_cli_default_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(banded_poisson, "estimate_epsilon", _never)
    text = runner.invoke(app, [*IDENTITY, "-q"], env=WIDE)
    assert text.exit_code == 0, text.output
    hint = [line for line in text.stdout.splitlines() if "--banded-estimate" in line]
    assert len(hint) == 1 and "MMCC estimate: not computed" in hint[0] and "b = 1" in hint[0]
    assert "ESTIMATE, not a bound" not in text.stdout
    js = runner.invoke(app, [*IDENTITY, "-q", "--json"])
    assert validate(json.loads(js.stdout), load_schema("account")) == []
    mmcc = json.loads(js.stdout)["settings"]["mmcc"]
    assert "estimate" not in mmcc and mmcc["estimate_note"] == ESTIMATE_NOT_REQUESTED
    assert "--" not in ESTIMATE_NOT_REQUESTED  # the library never names a CLI flag


def test_requested_estimate_is_the_librarys(monkeypatch: pytest.MonkeyPatch) -> None:
    """With --banded-estimate the MMCC row carries banded_poisson.estimate_epsilon's estimate for
    the accounted C (here C = I, b = 1, whose exact pair is DP-SGD: the estimate must be near the
    dp-sgd row, dp-accounting's epsilon). The estimator's accuracy is tested in
    tests/test_accounting_banded_poisson.py; the budget is cut to the 500-sample floor here."""
    monkeypatch.setattr(banded_poisson, "ESTIMATE_WORK", 0.0)
    r = runner.invoke(app, [*IDENTITY, "-q", "--json", "--banded-estimate"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert validate(obj, load_schema("account")) == []
    s = obj["settings"]
    est = s["mmcc"]["estimate"]
    bad = json.loads(r.stdout)
    bad["settings"]["mmcc"]["estimate"]["kind"] = "bound"
    assert validate(bad, load_schema("account"))  # the schema insists on the label
    assert "estimate_note" not in s["mmcc"]
    assert est["kind"].startswith("ESTIMATE") and "never used to calibrate" in est["kind"]
    assert est["band"] == 1 and est["directions"]["add"]["samples"] == 500
    lib = banded_poisson.estimate_epsilon(np.eye(8), sigma=4.0, sampling=0.01, samples=500, seed=0).as_dict()
    assert {k: v for k, v in est.items() if k != "seconds"} == {k: v for k, v in lib.items() if k != "seconds"}
    assert 0.5 < est["epsilon"] / s["dp-sgd"]["epsilon"] < 2.0
    text = runner.invoke(app, [*IDENTITY, "-q", "--banded-estimate"], env=WIDE)
    assert "MMCC pair (Poisson) ESTIMATE, not a bound" in text.stdout and f"~{est['epsilon']:.4g}" in text.stdout
    assert "--banded-estimate adds" not in text.stdout


@pytest.mark.parametrize("args,why", [
    (["--strategy", "identity", "--n", "8", "--sigma", "4"], "needs --sampling"),
    (["--strategy", "identity", "--n", "8", "--sigma", "4", "--sampling", "0.01", "--batching", "cyclic",
      "--epochs", "2"], "--batching cyclic does not run"),
])
def test_banded_estimate_applies_to_mmcc_only(args: list[str], why: str) -> None:
    r = runner.invoke(app, ["account", *args, "--banded-estimate"])
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --banded-estimate applies to MMCC only") and why in lines[0]


def test_estimate_directions_are_named_as_dp_accounting_names_them() -> None:
    """The estimate's JSON directions: remove = H(with the example || without), add = the reverse,
    as dp-accounting (AdjacencyType.REMOVE / ADD) and docs/accounting.md name them. For C = I the
    exact pair is DP-SGD's, so each direction's estimate interval must hold dp-accounting's epsilon
    of that direction alone (the two differ by far more than the intervals' width here)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    n, sigma, p, delta = 8, 1.0, 0.2, 1e-3
    est = banded_poisson.estimate_epsilon(np.eye(n), sigma=sigma, sampling=p, delta=delta, samples=20_000).as_dict()
    pld = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=p, value_discretization_interval=1e-4).self_compose(n)
    for name, pmf in (("remove", pld._pmf_remove), ("add", pld._pmf_add)):  # dp-accounting's two directions
        want = pmf.get_epsilon_for_delta(delta)
        lo, hi = est["directions"][name]["interval"]
        assert lo - 0.02 <= want <= hi + 0.02, (name, lo, hi, want)
