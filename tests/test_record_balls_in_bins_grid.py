"""A balls-in-bins tree record is re-derived on the grid it was computed on: any grid gives a valid
bracket, and the automatic choice may change between versions (it did when the floating-point
slack became a proven relative bound), so re-deriving on today's automatic grid could fail a sound
record that was computed on a finer one."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.accounting.balls_in_bins import AUTO_FINEST, tree_balls_in_bins
from mfcli.cli.app import app
from mfcli.io.artifact import load_any_artifact, save_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.record_format import read_chunked
from mfcli.services.records import VERIFIED, subject_of, verify_record
from mfcli.strategies.baselines import tree_decoder, tree_strategy_matrix
from mfcli.training.samplers import accounting_records


@pytest.fixture(scope="module")
def tree_record(tmp_path_factory) -> tuple[Path, dict]:
    n = 8
    path = tmp_path_factory.mktemp("bib") / "tree8.h5"
    fact = Factorization(workload=np.tril(np.ones((n, n))), strategy=tree_strategy_matrix(n), decoder=tree_decoder(n),
                         causal=True)
    save_artifact(path, fact, workload_name="prefix", strategy_name="tree")
    r = CliRunner().invoke(app, ["account", str(path), "--sigma", "2", "--batching", "balls-in-bins", "--write", "-q"])
    assert r.exit_code == 0, r.output
    (attrs,) = [a for a in accounting_records(path).values() if a["batching"] == "balls-in-bins"]
    return path, dict(attrs)


def _with_row(attrs: dict, **changes) -> dict:
    """The record with its balls-in-bins tree row (and its epsilon) changed, written whole."""
    results = json.loads(read_chunked(attrs, "results"))
    results["balls-in-bins-tree"].update(changes)
    out = {k: v for k, v in attrs.items() if not k.startswith("results")}
    out["results"] = json.dumps(results)
    if "epsilon" in changes:
        out["epsilon_balls_in_bins_tree"] = changes["epsilon"]
    return out


def _tree_check(path: Path, attrs: dict):
    check = verify_record(attrs, subject_of(load_any_artifact(path)))
    return check, next((c for c in check.settings if c.setting == "balls-in-bins-tree"), None)


def test_record_is_re_derived_on_its_own_grid(tree_record) -> None:
    path, attrs = tree_record
    check, row_check = _tree_check(path, attrs)
    assert check.status == VERIFIED, check.problems
    row = json.loads(read_chunked(attrs, "results"))["balls-in-bins-tree"]
    # the record as an account run on the finest grid would have written it: a smaller, valid epsilon
    fine = tree_balls_in_bins(n=8, sigma=row["sigma"], delta=row["delta"], grid=AUTO_FINEST)
    assert fine.epsilon < row["epsilon"] * (1 - 1e-6)  # on the automatic grid it would fail
    check, row_check = _tree_check(path, _with_row(attrs, grid=AUTO_FINEST, epsilon=fine.epsilon, lower_bound=fine.lower,
                                                   bracket=[fine.lower, fine.epsilon]))
    assert check.status == VERIFIED, check.problems
    assert row_check is not None and row_check.rederived == fine.epsilon


@pytest.mark.parametrize("grid, message", [
    (AUTO_FINEST / 10, "finer than"),
    ("0.001", "is not a number"),
    (2.0, "is not a number in"),
])
def test_a_forged_grid_is_refused(tree_record, grid, message) -> None:
    path, attrs = tree_record
    check, _ = _tree_check(path, _with_row(attrs, grid=grid))
    assert check.status != VERIFIED
    assert any(message in p for p in check.problems), check.problems
