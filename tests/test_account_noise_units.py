"""The noise convention of ``mfcli account``, its calibration and its records (docs/accounting.md,
"Noise convention"): the noise multiplier = the noise std sigma on C G / the sensitivity of the C
that runs, each number checked against a derivation made here, not by mfcli:

* the sensitivity in closed form (identity: 1; binary tree of n = 2^K leaves: sqrt(K + 1); the
  square root of the prefix sum: the norm of its first column, binom(2k, k) / 4^k);
* by brute force for a small dense C with mixed signs under a fixed-order two-epoch schema (every
  example's two steps, every sign: exact for two participations);
* the epsilon at the calibrated noise multiplier from the exact analytic Gaussian
  (tests/accounting_oracles.py) and from dp-accounting's PLD accountant;
* records written the old way (without ``noise_multiplier`` and ``sensitivity``, as 0.1 and 0.2
  wrote them) still read and verify, and get the re-derived numbers.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from accounting_oracles import dpsgd_epsilon, gaussian_epsilon, sqrt_toeplitz
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import load_any_artifact, save_artifact
from mfcli.model.factorization import Factorization
from mfcli.schemas import load_schema, validate
from mfcli.services.records import VERIFIED, read_records, subject_of, verify_record
from mfcli.training.record import accounted_sensitivity

runner = CliRunner()


def account_json(*args: object) -> dict:
    r = runner.invoke(app, ["account", *map(str, args), "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert validate(out, load_schema("account")) == []
    return out


def mixed_c(n: int = 4) -> np.ndarray:
    """A small lower-triangular C with mixed signs and unequal columns."""
    rng = np.random.default_rng(7)
    return np.tril(rng.normal(size=(n, n))) + 2 * np.eye(n)


def brute_force_two_epochs(c: np.ndarray) -> float:
    """max ||C x|| over one example's participations in a fixed order of 2 epochs (steps i and
    i + n/2) with gradients of norm 1: the sup of a convex function over [-1, 1]^2 sits at a sign
    vertex, and for two participations scalar signs are also the vector case's maximum."""
    n = c.shape[1]
    b = n // 2
    best = 0.0
    for i in range(b):
        for s in itertools.product((-1.0, 1.0), repeat=2):
            x = np.zeros(n)
            x[i], x[i + b] = s
            best = max(best, float(np.linalg.norm(c @ x)))
    return best


def artifact(path: Path, c: np.ndarray) -> Path:
    a = np.tril(np.ones(c.shape))
    save_artifact(path, Factorization(workload=a, strategy=c, decoder=a @ np.linalg.inv(c), causal=True),
                  workload_name="prefix", strategy_name="mixed")
    return path


@pytest.mark.parametrize("strategy,n,sens", [
    ("identity", 8, 1.0),
    ("tree", 16, math.sqrt(5.0)),  # K = 4 levels above the leaves: sqrt(K + 1)
    ("tree", 8, 2.0),
    ("sqrt", 16, float(np.linalg.norm(sqrt_toeplitz(16)[:, 0]))),
])
def test_account_noise_multiplier_closed_form(strategy, n, sens):
    out = account_json("--strategy", strategy, "--n", n, "--sigma", 3.0)
    assert out["noise_std"] == out["sigma"] == 3.0
    assert out["noise_sensitivity"] == pytest.approx(sens, rel=1e-12)
    assert out["noise_multiplier"] == pytest.approx(3.0 / sens, rel=1e-12)
    # the single-pass epsilon is the Gaussian's at noise multiplier sigma / sens, sensitivity 1
    assert out["settings"]["single-pass"]["epsilon"] == pytest.approx(
        gaussian_epsilon(1.0, out["noise_multiplier"]), rel=1e-6)


def test_calibrated_noise_multiplier_meets_the_target_by_the_analytic_gaussian():
    out = account_json("--strategy", "tree", "--n", 16, "--epsilon", 2)
    cal = out["calibration"]
    assert cal["noise_std"] == cal["sigma"] and cal["sensitivity"] == pytest.approx(math.sqrt(5.0), rel=1e-12)
    assert cal["noise_multiplier"] == pytest.approx(cal["sigma"] / math.sqrt(5.0), rel=1e-12)
    assert out["noise_multiplier"] == pytest.approx(cal["noise_multiplier"], rel=1e-12)
    lo, hi = cal["noise_multiplier_bracket"]
    assert hi == pytest.approx(cal["noise_multiplier"], rel=1e-12)
    assert gaussian_epsilon(1.0, hi) <= 2.0 < gaussian_epsilon(1.0, lo)


def test_calibrated_dp_sgd_meets_the_target_by_dp_accounting():
    """C = I under Poisson sampling is DP-SGD: the noise multiplier is its std, and dp-accounting's
    PLD accountant at that multiplier meets the target (and misses it at the bracket's lower end)."""
    pytest.importorskip("dp_accounting")
    out = account_json("--strategy", "identity", "--n", 8, "--epsilon", 2, "--sampling", 0.1, "--setting", "dp-sgd")
    cal = out["calibration"]
    assert cal["sensitivity"] == 1.0 and cal["noise_multiplier"] == cal["noise_std"]
    lo, hi = cal["noise_multiplier_bracket"]
    assert dpsgd_epsilon(hi, 0.1, 8) <= 2.0 * (1 + 1e-9)
    assert dpsgd_epsilon(lo, 0.1, 8) > 2.0


def test_fixed_order_divides_by_the_brute_force_schema_sensitivity(tmp_path):
    c = mixed_c(4)
    sens = brute_force_two_epochs(c)
    col = float(np.sqrt((c * c).sum(axis=0).max()))
    assert not math.isclose(sens, col, rel_tol=1e-3)  # the two definitions differ on this C
    path = artifact(tmp_path / "mixed.h5", c)
    out = account_json(path, "--epochs", 2, "--sigma", 2.0, "--write")
    assert out["noise_sensitivity"] == pytest.approx(sens, rel=1e-9)
    assert out["noise_multiplier"] == pytest.approx(2.0 / sens, rel=1e-9)
    # the deterministic epsilon is the Gaussian's at that noise multiplier
    assert out["settings"]["deterministic"]["epsilon"] == pytest.approx(
        gaussian_epsilon(1.0, out["noise_multiplier"]), rel=1e-6)
    (attrs,) = read_records(path).values()
    assert attrs["sensitivity"] == pytest.approx(sens, rel=1e-9)
    assert attrs["noise_multiplier"] == pytest.approx(2.0 / sens, rel=1e-9)
    check = verify_record(attrs, subject_of(load_any_artifact(path)))
    assert check.status == VERIFIED, check.problems
    assert check.sensitivity == pytest.approx(sens, rel=1e-9)
    assert accounted_sensitivity(attrs, artifact=path) == pytest.approx(sens, rel=1e-9)
    # one participation: the same artifact divides by the largest column norm
    out = account_json(path, "--sigma", 2.0)
    assert out["noise_sensitivity"] == pytest.approx(col, rel=1e-12)


def _write_old_way(path: Path, rid: str) -> None:
    """The record as 0.1 and 0.2 wrote it: no noise_multiplier, no sensitivity (nor in its
    calibration), created by mfcli 0.1.0."""
    with h5py.File(path, "r+") as f:
        g = f[f"accounting/{rid}"]
        for key in ("noise_multiplier", "sensitivity"):
            del g.attrs[key]
        if "calibration" in g.attrs:
            cal = json.loads(g.attrs["calibration"])
            for key in ("noise_multiplier", "noise_std", "sensitivity", "noise_multiplier_bracket"):
                cal.pop(key)
            g.attrs["calibration"] = json.dumps(cal)
        g.attrs["created_by"] = "mfcli 0.1.0"


@pytest.mark.parametrize("args", [("--sigma", 2.0), ("--epsilon", 2.0), ("--epochs", 2, "--sigma", 2.0)],
                         ids=["sigma", "calibrated", "fixed-order"])
def test_records_without_the_noise_fields_still_verify(tmp_path, args):
    c = mixed_c(4)
    path = artifact(tmp_path / "old.h5", c)
    account_json(path, *args, "--write")
    (rid, _), = read_records(path).items()
    _write_old_way(path, rid)
    attrs = read_records(path)[rid]
    assert "noise_multiplier" not in attrs and "sensitivity" not in attrs
    check = verify_record(attrs, subject_of(load_any_artifact(path)))
    assert check.status == VERIFIED, check.problems
    sens = brute_force_two_epochs(c) if "--epochs" in args else float(np.sqrt((c * c).sum(axis=0).max()))
    assert check.sensitivity == pytest.approx(sens, rel=1e-9)
    assert check.noise_multiplier == pytest.approx(float(attrs["sigma"]) / sens, rel=1e-9)
    # inspect verifies it and shows the re-derived noise multiplier beside sigma
    r = runner.invoke(app, ["inspect", str(path)])
    assert r.exit_code == 0, r.output
    assert "noise multiplier" in r.stdout and "verified" in r.stdout
    js = runner.invoke(app, ["inspect", str(path), "--json"])
    rec, = json.loads(js.stdout)["accounting"]
    assert rec["noise_multiplier"] == pytest.approx(check.noise_multiplier, rel=1e-12)
    assert rec["sensitivity"] == pytest.approx(sens, rel=1e-9)
