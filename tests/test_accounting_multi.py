"""``mfcli account`` under multiple participations: the deterministic Gaussian at the schema's
sensitivity and cyclic Poisson for banded C (2306.08153 Thm. 3), checked against independent
oracles: brute force over participation patterns and sign vectors, the closed-form Gaussian
(Balle-Wang, solved here with scipy), and dp-accounting's own DP-SGD numbers (PLD and RDP)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from accounting_oracles import dpsgd_epsilon, gaussian_epsilon
from sensitivity_oracle import brute_sensitivity
from typer.testing import CliRunner

from mfcli.accounting.multi import band_count, cyclic_poisson
from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.io.artifact import save_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation
from mfcli.services.inspect import inspect_artifact

runner = CliRunner()
DELTA = 1e-6
UNIT = np.array([[1, 0, 0, 0], [2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, -6]], dtype=float)


def banded(n: int, bands: int, seed: int = 0) -> np.ndarray:
    """A lower-triangular C with exactly ``bands`` bands and positive diagonal."""
    rng = np.random.default_rng(seed)
    c = np.zeros((n, n))
    for k in range(bands):
        c += np.diag(rng.uniform(0.2, 1.0, n - k), -k)
    return c


def run(*args: str) -> dict:
    r = runner.invoke(app, ["account", *args, "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def npy(tmp_path: Path, c: np.ndarray, name: str = "c.npy") -> str:
    path = tmp_path / name
    np.save(path, c)
    return str(path)


def one_error_line(stderr: str, *needles: str) -> None:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ---------------------------------------------------------------------------------------------
# deterministic participation


@pytest.mark.parametrize("c, options, schema", [
    (UNIT, ["--min-sep", "2"], MinSeparation(separation=2)),
    (UNIT, ["--epochs", "2"], FixedEpoch(epochs=2)),
    (np.tril(np.ones((6, 6))), ["--epochs", "3"], FixedEpoch(epochs=3)),
    (np.tril(np.ones((6, 6))), ["--min-sep", "2", "--max-participations", "2"],
     MinSeparation(separation=2, max_participations=2)),
    (banded(8, 3, seed=1), ["--min-sep", "3"], MinSeparation(separation=3)),
    (banded(8, 5, seed=2) * np.where(np.arange(8) % 2, -1.0, 1.0)[:, None], ["--min-sep", "2"],
     MinSeparation(separation=2)),
], ids=["unit-minsep", "unit-epochs", "prefix-epochs", "prefix-minsep-k2", "banded-minsep", "signed-minsep"])
def test_deterministic_row_against_brute_force(tmp_path, c, options, schema):
    sigma = 3.0
    out = run(npy(tmp_path, c), "--sigma", str(sigma), *options)
    assert set(out["settings"]) == {"deterministic"}
    row = out["settings"]["deterministic"]
    witness = brute_sensitivity(c, schema)
    # the bound is valid: never below what an actual pair of adjacent inputs attains
    assert row["sensitivity"] >= witness * (1 - 1e-12)
    assert row["sensitivity_lower"] <= witness * (1 + 1e-12)
    if row["sensitivity_exact"]:
        assert row["sensitivity"] == pytest.approx(witness, rel=1e-10)
    assert row["epsilon"] == pytest.approx(gaussian_epsilon(row["sensitivity"], sigma), rel=1e-8)
    assert row["epsilon_lower"] == pytest.approx(gaussian_epsilon(row["sensitivity_lower"], sigma), rel=1e-8)
    assert row["epsilon_lower"] <= row["epsilon"]
    assert row["participation"]["kind"] == schema.kind and row["batch_sampler"] == "deterministic"
    assert out["participation"]["description"] == schema.describe(c.shape[1])


def test_unit_case_min_sep_2_is_sqrt_41(tmp_path):
    out = run(npy(tmp_path, UNIT), "--sigma", "2", "--min-sep", "2")
    row = out["settings"]["deterministic"]
    assert row["sensitivity"] == pytest.approx(math.sqrt(41), rel=1e-12)
    assert row["epsilon"] == pytest.approx(gaussian_epsilon(math.sqrt(41), 2.0), rel=1e-8)
    single = run(npy(tmp_path, UNIT), "--sigma", "2")["settings"]
    assert set(single) == {"single-pass"} and single["single-pass"]["sensitivity"] == pytest.approx(6.0)


def test_upper_bound_is_labelled_and_bracketed(tmp_path):
    """X = [[1, -1/2, -1/2], ...]: three unit vectors at 120 degrees beat every sign vector (4.5
    against 4), and the semidefinite certificate makes 4.5 exact. Beyond enumeration (every set
    of 20 steps under min-sep 1, 2^20 patterns, a C with negative entries) the schema's sensitivity is only
    bounded; the table says so and prints the bracket."""
    x = np.array([[1, -0.5, -0.5], [-0.5, 1, -0.5], [-0.5, -0.5, 1]])
    # causal: C = P L^T P (P the reversal) is lower-triangular with C^T C = P X P = X (X is reversal-symmetric)
    c = np.linalg.cholesky(x + 1e-12 * np.eye(3)).T[::-1, ::-1]
    assert not np.any(np.triu(c, 1)) and np.allclose(c.T @ c, x, atol=1e-9)
    out = run(npy(tmp_path, c), "--sigma", "2", "--min-sep", "1")["settings"]["deterministic"]
    assert out["sensitivity_exact"] is True and out["sensitivity"] == pytest.approx(math.sqrt(4.5), rel=1e-9)
    c = np.tril(np.random.default_rng(5).normal(size=(20, 20)))
    r = runner.invoke(app, ["account", npy(tmp_path, c), "--sigma", "2", "--min-sep", "1"], env={"COLUMNS": "600"})
    assert r.exit_code == 0, r.stderr
    out = run(npy(tmp_path, c), "--sigma", "2", "--min-sep", "1")["settings"]["deterministic"]
    assert out["sensitivity_exact"] is False
    assert out["epsilon_lower"] < out["epsilon"]
    assert "upper bound" in r.stdout and "true in [" in r.stdout and "still a guarantee" in r.stdout


# ---------------------------------------------------------------------------------------------
# cyclic Poisson


@pytest.mark.parametrize("n, bands, options, b", [
    (12, 1, ["--min-sep", "4"], 4),
    (12, 3, ["--min-sep", "3"], 3),
    (12, 3, ["--epochs", "3"], 4),
    (10, 2, ["--min-sep", "4"], 4),   # ceil(10 / 4) = 3 steps
    (10, 2, ["--min-sep", "4", "--max-participations", "3"], 4),   # a cap the cycle never reaches
    (6, 6, [], 6),                    # single participation: one epoch, b = n, one sampled step
], ids=["identity", "b3", "epochs", "ragged", "ragged-cap-not-binding", "single"])
def test_cyclic_poisson_is_dp_accountings_dpsgd(tmp_path, n, bands, options, b):
    c = banded(n, bands, seed=n + bands)
    sigma, p = 1.3, 0.2
    out = run(npy(tmp_path, c), "--sigma", str(sigma), "--sampling", str(p), "--batching", "cyclic", *options)
    assert set(out["settings"]) == {"deterministic" if options else "single-pass", "cyclic-poisson", "dp-sgd-reduction"}
    # the reduction (sigma / ||C||_2, same steps) is never below the banded theorem (sigma / max column norm)
    assert out["settings"]["dp-sgd-reduction"]["epsilon"] >= out["settings"]["cyclic-poisson"]["epsilon"] * (1 - 1e-9)
    row = out["settings"]["cyclic-poisson"]
    col = float(np.linalg.norm(c, axis=0).max())
    steps = -(-n // b)
    assert (row["steps"], row["cycle"], row["bands"]) == (steps, b, bands)
    assert row["epsilon"] == pytest.approx(dpsgd_epsilon(sigma / col, p, steps), rel=1e-9)
    # a second accountant (RDP) is looser, never tighter, than the PLD number reported
    assert row["epsilon"] <= dpsgd_epsilon(sigma / col, p, steps, rdp=True) * (1 + 1e-9)
    assert out["batching"] == "cyclic" and row["batch_sampler"].startswith("cyclic Poisson")


def test_cyclic_at_rate_one_is_the_deterministic_gaussian():
    """p = 1 removes the sampling: ceil(n/b) Gaussians at sigma / col compose to one Gaussian at
    sqrt(ceil(n/b)) col / sigma, which is the min-sep sensitivity of a banded C with equal
    column norms (closed form)."""
    n, b = 12, 4
    c = np.eye(n) + 0.5 * np.eye(n, k=-1)
    c[-1, -1] = math.sqrt(1.25)  # equal column norms sqrt(1.25)
    sigma = 2.0
    got = cyclic_poisson(c, schema=MinSeparation(separation=b), sigma=sigma, sampling=1.0, delta=DELTA)
    closed = gaussian_epsilon(math.sqrt(n // b * 1.25), sigma)
    assert got.epsilon >= closed * (1 - 1e-9)  # pessimistic PLD: never below the truth
    assert got.epsilon == pytest.approx(closed, rel=2e-3)


def test_cyclic_beats_deterministic_and_dpsgd_at_small_rate(tmp_path):
    c = banded(16, 2, seed=3)
    out = run(npy(tmp_path, c), "--sigma", "1", "--sampling", "0.05", "--batching", "cyclic", "--min-sep", "4")
    s = out["settings"]
    assert s["cyclic-poisson"]["epsilon"] < s["deterministic"]["epsilon"]


@pytest.mark.parametrize("options", [["--min-sep", "4"], ["--epochs", "2"]])
def test_cyclic_with_more_bands_than_groups_is_accounted_by_the_reduction(options):
    """More bands than groups: the banded theorem does not apply (its row is refused, with the
    reason); the DP-SGD reduction accounts the C under the same cyclic sampler: DP-SGD with
    ceil(n / b) Poisson steps at sigma / ||C||_2, composed here with dp-accounting."""
    out = run("--strategy", "sqrt", "--n", "8", "--sigma", "1", "--sampling", "0.1", "--batching", "cyclic", *options)
    assert "cyclic-poisson" not in out["settings"] and "at most b = 4 bands" in out["refused"]["cyclic-poisson"]
    red = out["settings"]["dp-sgd-reduction"]
    from mfcli.strategies.baselines import sqrt_strategy_matrix

    norm = float(np.linalg.svd(sqrt_strategy_matrix(8), compute_uv=False)[0])
    assert red["epsilon"] == pytest.approx(dpsgd_epsilon(1.0 / norm, 0.1, 2), rel=1e-6)
    assert out["report"]["setting"] == "dp-sgd-reduction"


@pytest.mark.parametrize("args, needles", [
    (["--strategy", "identity", "--n", "8", "--sigma", "1", "--batching", "cyclic", "--min-sep", "4"],
     ["--batching", "--sampling"]),
    (["--strategy", "identity", "--n", "8", "--sigma", "1", "--sampling", "0.1", "--batching", "uniform"],
     ["--batching must be one of poisson, cyclic"]),
    (["--strategy", "identity", "--n", "8", "--sigma", "1", "--sampling", "0.1", "--batching", "cyclic",
      "--min-sep", "4", "--max-participations", "1"], ["cannot cap the number of participations"]),
    (["--strategy", "identity", "--n", "8", "--epsilon", "1", "--setting", "single-pass", "--epochs", "2"],
     ["single-pass setting assumes single participation"]),
    (["--strategy", "identity", "--n", "8", "--epsilon", "1", "--setting", "deterministic"],
     ["needs a multi-participation schema"]),
    (["--strategy", "identity", "--n", "8", "--sigma", "1", "--epochs", "3"], ["not divisible by epochs = 3"]),
    (["--strategy", "identity", "--n", "8", "--sigma", "1", "--epochs", "2", "--min-sep", "2"], ["give one"]),
    (["--strategy", "identity", "--n", "8", "--epsilon", "1", "--setting", "mmcc", "--sampling", "0.1",
      "--batching", "cyclic", "--min-sep", "4"], ["does not apply to calibrating mmcc"]),
])
def test_refusals_are_one_line(args, needles):
    r = runner.invoke(app, ["account", *args])
    assert r.exit_code != 0
    one_error_line(r.stderr, *needles)
    assert r.stdout == ""


def test_cyclic_refuses_upper_triangular_and_non_square(tmp_path):
    with pytest.raises(MfcliError, match="lower-triangular"):
        cyclic_poisson(np.eye(4) + np.eye(4, k=1), schema=MinSeparation(separation=2), sigma=1, sampling=0.1)
    with pytest.raises(MfcliError, match="square"):
        cyclic_poisson(np.ones((3, 4)), schema=MinSeparation(separation=2), sigma=1, sampling=0.1)
    assert band_count(banded(6, 3)) == 3


# ---------------------------------------------------------------------------------------------
# calibration, --write and inspect


@pytest.mark.parametrize("options, setting", [
    (["--epochs", "2"], "deterministic"),
    (["--min-sep", "4", "--sampling", "0.2", "--batching", "cyclic"], "cyclic-poisson"),
])
def test_epsilon_calibration(tmp_path, options, setting):
    c = banded(8, 2, seed=5)
    out = run(npy(tmp_path, c), "--epsilon", "2", *options)
    cal = out["calibration"]
    assert cal["setting"] == setting and set(out["settings"]) == {setting}
    assert cal["achieved_epsilon"] <= 2.0
    lo, hi = cal["sigma_bracket"]
    assert hi / lo - 1 <= 1e-3
    col = float(np.linalg.norm(c, axis=0).max())
    if setting == "deterministic":
        sens = out["settings"][setting]["sensitivity"]
        assert gaussian_epsilon(sens, hi) <= 2.0 < gaussian_epsilon(sens, lo)
    else:
        assert dpsgd_epsilon(hi / col, 0.2, 2) <= 2.0 * (1 + 1e-9) and dpsgd_epsilon(lo / col, 0.2, 2) > 2.0


def _artifact(tmp_path: Path, c: np.ndarray, schema: Participation | None = None) -> Path:
    path = tmp_path / "a.h5"
    n = c.shape[1]
    a = np.tril(np.ones((n, n)))
    save_artifact(path, Factorization(workload=a, decoder=a @ np.linalg.inv(c), strategy=c), workload_name="prefix",
                  strategy_name="banded", participation=schema)
    return path


@pytest.mark.parametrize("schema, extra", [
    (MinSeparation(separation=4), ["--sampling", "0.1", "--batching", "cyclic"]),
    (FixedEpoch(epochs=2), []),
])
def test_write_records_schema_and_batching_and_verifies(tmp_path, schema, extra):
    path = _artifact(tmp_path, banded(8, 2, seed=7), schema)
    out = run(str(path), "--sigma", "1.5", *extra, "--write")
    group = out["written"]["group"]
    with h5py.File(path) as f:
        attrs = dict(f[group].attrs)
    assert json.loads(attrs["participation"])["kind"] == schema.kind
    assert attrs["batching"] == ("cyclic" if extra else "null")
    rep = inspect_artifact(path)
    assert rep.ok, rep.problems
    # a stored epsilon below the recomputation is caught
    key = "epsilon_cyclic_poisson" if extra else "epsilon_deterministic"
    with h5py.File(path, "r+") as f:
        f[group].attrs[key] = float(f[group].attrs[key]) * 0.99
    assert any("stored epsilon" in p for p in inspect_artifact(path).problems)


def test_declared_schema_is_the_default_and_an_option_may_not_contradict_it(tmp_path):
    path = _artifact(tmp_path, banded(8, 2, seed=8), MinSeparation(separation=4))
    out = run(str(path), "--sigma", "2")
    assert set(out["settings"]) == {"deterministic"}
    assert out["participation"]["kind"] == "min-sep"
    before = path.read_bytes()
    r = runner.invoke(app, ["account", str(path), "--sigma", "2", "--epochs", "2", "--write"])
    assert r.exit_code == 1
    one_error_line(r.stderr, "declares min-separation", "refused")
    assert path.read_bytes() == before


def test_poisson_rows_name_their_sampler_under_a_schema(tmp_path):
    out = run("--strategy", "identity", "--n", "8", "--sigma", "2", "--sampling", "0.1", "--epochs", "2")
    s = out["settings"]
    assert set(s) == {"deterministic", "dp-sgd", "mmcc", "dp-sgd-reduction"}
    for name in ("dp-sgd", "mmcc", "dp-sgd-reduction"):
        assert s[name]["participation"]["kind"] == "poisson" and s[name]["batch_sampler"].startswith("Poisson")
    assert s["deterministic"]["participation"]["kind"] == "fixed-epoch"


# ---------------------------------------------------------------------------------------------
# compress and inspect under a schema


def _momentum_artifact(tmp_path: Path, schema: Participation | None = None) -> Path:
    from mfcli.model.workloads import momentum_workload
    from mfcli.strategies.baselines import build_strategy

    path = tmp_path / "m.h5"
    fact = build_strategy("optimal", momentum_workload(8)).factorization
    save_artifact(path, fact, workload_name="momentum", strategy_name="optimal", participation=schema)
    return path


def _brute_loss(c: np.ndarray, b: np.ndarray, schema: Participation) -> tuple[float, float]:
    s = brute_sensitivity(c, schema)
    return s, s * s * float(np.sum(b * b))


def test_compress_reports_the_schema_sensitivity(tmp_path):
    from mfcli.io.artifact import load_artifact
    from mfcli.strategies.operators import select_operator

    src = _momentum_artifact(tmp_path)
    out = tmp_path / "c.h5"
    r = runner.invoke(app, ["compress", str(src), "--band", "2", "--rank", "1", "--epochs", "2", "-o", str(out),
                            "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    under = json.loads(r.stdout)["under_schema"]
    comp = select_operator(load_artifact(out), "compressed").factorization
    schema = FixedEpoch(epochs=2)
    s, loss = _brute_loss(comp.strategy, comp.decoder, schema)
    got = under["compressed"]
    assert got["sensitivity"] >= s * (1 - 1e-12)  # fixed-epoch pairs: k = 2, so exact, and sign vectors attain it
    assert got["sensitivity"] == pytest.approx(s, rel=1e-10) and got["loss_total"] == pytest.approx(loss, rel=1e-10)
    dense = load_artifact(src).factorization
    assert under["dense"]["sensitivity"] == pytest.approx(brute_sensitivity(dense.strategy, schema), rel=1e-10)


def test_compress_and_inspect_refuse_a_contradicting_schema(tmp_path):
    src = _momentum_artifact(tmp_path, FixedEpoch(epochs=2))
    before = sorted(p.name for p in tmp_path.iterdir())
    for cmd in (["compress", str(src), "--band", "2", "--rank", "1", "--min-sep", "2", "-o", str(tmp_path / "c.h5")],
                ["inspect", str(src), "--epochs", "4"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 1, r.stdout
        one_error_line(r.stderr, "declares fixed-epoch", "refused")
        assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_inspect_shows_a_requested_schema(tmp_path):
    from mfcli.io.artifact import load_artifact

    src = _momentum_artifact(tmp_path)
    r = runner.invoke(app, ["inspect", str(src), "--min-sep", "3", "--json", "--no-certificate"])
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)["under_requested_schema"]["dense"]
    f = load_artifact(src).factorization
    s, loss = _brute_loss(f.strategy, f.decoder, MinSeparation(separation=3))
    assert got["sensitivity"] >= s * (1 - 1e-12)
    if got["exact"]:
        assert got["sensitivity"] == pytest.approx(s, rel=1e-10) and got["loss_total"] == pytest.approx(loss, rel=1e-10)
    assert got["participation"]["kind"] == "min-sep"
