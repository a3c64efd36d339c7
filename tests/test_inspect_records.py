"""``mfcli inspect`` verifies ``accounting/<id>`` records by re-deriving them from the operator the
record claims (mfcli.services.records): the operator's identity hash, every stored event against
the re-derived event, every stored epsilon against the re-derived epsilon. (The forgery table for
every reader of records: tests/test_record_forgery.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import save_artifact
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.account import AccountingOptions, account, record_to_artifact, resolve_strategy
from mfcli.services.compress import compress_artifact
from mfcli.services.inspect import inspect_artifact

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """name -> (artifact with one record, group name)."""
    base = tmp_path_factory.mktemp("records")
    fact = optimal_factorization(momentum_workload(24, beta=0.9).matrix, tol=1e-9).factorization
    dense = base / "dense.h5"
    save_artifact(dense, fact, workload_name="momentum", workload_params={"beta": 0.9}, strategy_name="optimal")
    comp = compress_artifact(dense, band=3, rank=1, out=base / "comp.h5").path
    out = {}
    for name, src, sampling, operator in (
        ("dense-all", dense, 0.05, "auto"),            # single-pass, dp-sgd, mmcc
        ("compressed", comp, None, "auto"),            # single-pass on C^
        ("compressed-as-dense", comp, None, "dense"),  # the dense root of a compressed artifact
    ):
        path = base / f"{name}.h5"
        shutil.copy(src, path)
        inp = resolve_strategy(path, operator=operator)
        # a coarse PLD grid keeps MMCC's re-derivation cheap (still a bound)
        group = record_to_artifact(account(inp, sigma=1.3, sampling=sampling,
                                           options=AccountingOptions(value_discretization=1e-2)))
        out[name] = (path, group)
    return out


def _edited(recorded, name: str, tmp_path: Path, edit) -> Path:
    src, group = recorded[name]
    path = tmp_path / f"{name}-edited.h5"
    shutil.copy(src, path)
    with h5py.File(path, "r+") as f:
        edit(f[group].attrs)
    return path


@pytest.mark.parametrize("name", ["dense-all", "compressed", "compressed-as-dense"])
def test_genuine_records_verify(recorded, name):
    path, _ = recorded[name]
    rep = inspect_artifact(path)
    assert rep.ok, rep.problems
    assert [r["verified"] for r in rep.accounting] == [True]
    assert [r["status"] for r in rep.accounting] == ["verified"]
    assert all(c["status"] == "verified" for c in rep.accounting[0]["setting_checks"])


def _scale(key: str, factor: float):
    def edit(attrs):
        attrs[key] = float(attrs[key]) * factor
    return edit


def _set(key: str, value):
    def edit(attrs):
        attrs[key] = value
    return edit


def _event_noise(factor: float):
    def edit(attrs):
        ev = json.loads(attrs["dp_event_single_pass"])
        ev["noise_multiplier"] *= factor
        attrs["dp_event_single_pass"] = json.dumps(ev)
    return edit


@pytest.mark.parametrize(
    "name,edit,needle",
    [
        # the example: epsilon divided by 100 and a zeroed hash
        ("dense-all", lambda a: (_scale("epsilon_single_pass", 0.01)(a), _set("strategy_sha256", "0" * 64)(a)),
         "single-pass: stored epsilon"),
        ("dense-all", _set("strategy_sha256", "0" * 64), "strategy_sha256 is not the hash of the dense"),
        ("dense-all", _scale("epsilon_dp_sgd", 0.5), "dp-sgd: stored epsilon"),
        ("dense-all", _scale("epsilon_mmcc", 0.9), "mmcc: stored epsilon"),
        ("dense-all", _scale("sigma", 2.0), "noise_multiplier"),
        ("compressed", _scale("epsilon_single_pass", 0.999), "single-pass: stored epsilon"),
        # a record of C^ relabelled as dense: its hash is not the dense C's
        ("compressed", _set("operator", "dense"), "strategy_sha256 is not the hash of the dense"),
        # the dense record relabelled as compressed: hash and noise multiplier both fail
        ("compressed-as-dense", _set("operator", "compressed (band 3, rank 1)"), "strategy_sha256 is not the hash"),
        ("dense-all", _set("operator", "compressed (band 3, rank 1)"), "which this artifact does not have"),
        ("compressed", _event_noise(1.5), "noise_multiplier"),
        ("compressed", _set("dp_event_single_pass", "{}"), "stored dp-accounting event is not the one re-derived"),
        ("compressed", _set("dp_event_single_pass", "not json"), "not readable JSON"),
    ],
)
def test_forged_records_fail(recorded, tmp_path, name, edit, needle):
    path = _edited(recorded, name, tmp_path, edit)
    rep = inspect_artifact(path)
    assert not rep.ok
    assert any(needle in p for p in rep.problems), rep.problems
    assert [r["verified"] for r in rep.accounting] == [False]
    assert [r["status"] for r in rep.accounting] == ["unverified"]
    r = runner.invoke(app, ["inspect", str(path)])
    assert r.exit_code == 1 and "error:" in r.stderr and "UNVERIFIED" in r.stdout


def test_a_record_above_the_recomputed_epsilon_is_accepted(recorded, tmp_path):
    """Stating a larger (more pessimistic) epsilon than the event gives is not a forgery."""
    path = _edited(recorded, "compressed", tmp_path, _scale("epsilon_single_pass", 1.01))
    assert inspect_artifact(path).ok


def test_foreign_groups_are_listed_unverified(recorded, tmp_path):
    from mfcli.io.artifact import append_group

    path = tmp_path / "foreign.h5"
    shutil.copy(recorded["compressed"][0], path)
    append_group(path, "accounting/other", attrs={"epsilon": 0.001})
    rep = inspect_artifact(path)
    assert rep.ok, rep.problems
    assert sorted(r["verified"] for r in rep.accounting) == [False, True]
