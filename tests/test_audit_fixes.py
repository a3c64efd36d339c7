"""Fixes from an independent privacy audit (2026-12-01): each test fails on the code before its fix.

Oracles are independent of the code under test: brute force over every participation pattern and
sign vector at small n, closed-form column norms, the artifact's own stored records.
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import save_artifact
from mfcli.model.participation import FixedEpoch, MinSeparation
from mfcli.model.workloads import prefix_workload
from mfcli.services.account import account, resolve_strategy
from mfcli.strategies.baselines import build_strategy

runner = CliRunner()


def _neg_c(n: int = 6, seed: int = 3) -> np.ndarray:
    """A random lower-triangular C with negative entries, max column norm 1."""
    rng = np.random.default_rng(seed)
    c = np.tril(rng.normal(size=(n, n)))
    c[np.diag_indices(n)] = np.abs(c[np.diag_indices(n)]) + 1.0
    return c / np.linalg.norm(c, axis=0).max()


def _sign_pattern_max(c: np.ndarray) -> float:
    """max over every non-empty subset S of steps and signs u in {-1, 1}^S of ||C u|| (a lower
    bound on the sensitivity over every participation pattern; brute force)."""
    n = c.shape[1]
    best = 0.0
    for signs in itertools.product((-1.0, 0.0, 1.0), repeat=n):
        best = max(best, float(np.linalg.norm(c @ np.array(signs))))
    return best


# --- finding 1: MMCC's refusal of a C with negative entries ----------------------------------------


def test_negative_c_refusal_advises_a_bound_valid_under_poisson(tmp_path):
    c = _neg_c()
    path = tmp_path / "neg.npy"
    np.save(path, c)
    # The old advice ("use the single-pass bound") is unsafe: under Poisson sampling an example
    # may take part in every step, and ||C 1|| already exceeds the single-pass sensitivity 1.
    assert np.linalg.norm(c @ np.ones(c.shape[1])) > 1.0 + 1e-6
    r = runner.invoke(app, ["account", str(path), "--sampling", "0.1", "--sigma", "2", "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert "dp-sgd" in out["settings"] and "mmcc" not in out["settings"]
    why = out["refused"]["mmcc"]
    assert "single-pass bound for this C" not in why and "minimum separation 1" in why
    assert "--" not in why  # the library names no CLI flag
    assert any(line.startswith("MMCC: not run") for line in out["notes"])
    # the advised bound: deterministic at min-sep 1 covers every pattern (brute force)
    inp = resolve_strategy(path)
    rep = account(inp, sigma=2.0, sampling=None, participation=MinSeparation(separation=1))
    assert rep.deterministic is not None
    assert rep.deterministic.sensitivity.value >= _sign_pattern_max(c) - 1e-12
    # the table names the refused row and the flag that asks for the valid bound
    r = runner.invoke(app, ["account", str(path), "--sampling", "0.1", "--sigma", "2", "-q"])
    assert r.exit_code == 0 and "not run" in r.stdout and "add --min-sep 1 for that row" in r.stdout
    r = runner.invoke(app, ["account", str(path), "--sampling", "0.1", "--sigma", "2", "--epochs", "2", "-q"])
    assert r.exit_code == 0 and "MMCC: not run" in r.stdout and "deterministic" in r.stdout


def test_negative_c_mmcc_calibration_refused_in_one_line(tmp_path):
    path = tmp_path / "neg.npy"
    np.save(path, _neg_c())
    r = runner.invoke(app, ["account", str(path), "--sampling", "0.1", "--epsilon", "2", "-q"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the mmcc setting does not apply")
    assert "use the single-pass bound" not in lines[0] and "--min-sep 1" in lines[0]


# --- finding 2: compare -a follows the schema the artifact declares (account's rule) -------------


def _declared(tmp_path, schema, n: int = 8):
    path = tmp_path / "declared.h5"
    fact = build_strategy("sqrt", prefix_workload(n)).factorization
    save_artifact(path, fact, workload_name="prefix", strategy_name="sqrt", participation=schema)
    return path, fact


def _brute_sensitivity_fixed_epoch(c: np.ndarray, epochs: int) -> float:
    """max over i in an epoch and signs of ||sum_k s_k C[:, i + k b]|| (the same order every epoch)."""
    n = c.shape[1]
    b = n // epochs
    best = 0.0
    for i in range(b):
        cols = c[:, [i + k * b for k in range(epochs)]]
        for signs in itertools.product((-1.0, 1.0), repeat=epochs):
            best = max(best, float(np.linalg.norm(cols @ np.array(signs))))
    return best


def test_compare_adopts_the_declared_schema_and_refuses_another(tmp_path):
    path, fact = _declared(tmp_path, FixedEpoch(epochs=2))
    r = runner.invoke(app, ["compare", "--n", "8", "-a", str(path), "-s", "identity", "--json", "-q"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["participation"]["kind"] == "fixed-epoch" and out["participation"]["epochs"] == 2
    row = next(x for x in out["strategies"] if "declared.h5" in x["name"])
    assert row["sensitivity"] >= _brute_sensitivity_fixed_epoch(fact.strategy, 2) - 1e-9
    assert row["sensitivity"] > float(np.linalg.norm(fact.strategy, axis=0).max()) + 1e-6  # not single participation
    for other in (["--epochs", "4"], ["--min-sep", "2"]):
        r = runner.invoke(app, ["compare", "--n", "8", "-a", str(path), "-s", "identity", "-q", *other])
        assert r.exit_code == 1 and "Traceback" not in r.output
        lines = r.stderr.strip().splitlines()
        assert "declares fixed-epoch: 2 epochs" in lines[-1] and "refused" in lines[-1]
        assert r.stdout == ""
    r = runner.invoke(app, ["compare", "--n", "8", "-a", str(path), "-s", "identity", "-q", "--epochs", "2"])
    assert r.exit_code == 0, r.output


# --- findings 4 and 9: inspect cross-checks the root schema against the records, and the solver's
# --- sensitivity against C ---------------------------------------------------------------------


def _set_root_participation(path, schema) -> None:
    import h5py

    with h5py.File(path, "r+") as f:
        f.attrs["participation"] = schema.to_json()


def _inspect(path):
    return runner.invoke(app, ["inspect", str(path)])


@pytest.mark.parametrize("kind", ["dense", "structured"])
def test_inspect_catches_an_edited_root_participation(tmp_path, kind):
    """An artifact without solver record whose record accounted min-sep 2: setting the root
    attribute to min-sep 4 afterwards (which would make account report fewer participations) is
    caught by inspect, by the record's own schema."""
    path = tmp_path / "a.h5"
    if kind == "dense":
        fact = build_strategy("sqrt", prefix_workload(8)).factorization
        save_artifact(path, fact, workload_name="prefix", strategy_name="sqrt", participation=MinSeparation(separation=2))
    else:
        from mfcli.io.artifact import save_structured_artifact
        from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz

        save_structured_artifact(path, BandedToeplitz.sqrt_init(2), workload=TOEPLITZ_PREFIX, n=8,
                                 participation=MinSeparation(separation=2))
    r = runner.invoke(app, ["account", str(path), "--sigma", "2", "--write", "-q"])
    assert r.exit_code == 0, r.output
    assert _inspect(path).exit_code == 0
    _set_root_participation(path, MinSeparation(separation=4))
    if kind == "structured":  # a careful edit also fixes the numbers derived from the schema
        import h5py

        from mfcli.io.artifact import load_structured_artifact

        with h5py.File(path, "r") as f:
            derived = {k: f["structured"].attrs[k] for k in f["structured"].attrs if k.startswith("schema_")}
        with pytest.raises(Exception, match="schema_"):
            load_structured_artifact(path)
        strategy = BandedToeplitz.sqrt_init(2)
        sens = strategy.sensitivity(8, MinSeparation(separation=4))
        with h5py.File(path, "r+") as f:
            f["structured"].attrs["schema_sensitivity"] = sens.value
            if "schema_sensitivity_exact" in derived:
                f["structured"].attrs["schema_sensitivity_exact"] = sens.exact
            for key in (k for k in derived if k.startswith("schema_loss")):
                f["structured"].attrs[key] = derived[key] * (sens.value / derived["schema_sensitivity"]) ** 2
    r = _inspect(path)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "accounted min-separation" in r.stderr and "at least 2 steps apart" in r.stderr
    assert "declares min-separation" in r.stderr and "at least 4 steps apart" in r.stderr


def test_inspect_catches_an_edited_solver_sensitivity(tmp_path):
    import h5py

    r = runner.invoke(app, ["optimize", "--n", "8", "--epochs", "2", "-o", str(tmp_path / "ep2.h5"), "-q"])
    assert r.exit_code == 0, r.output
    path = tmp_path / "ep2.h5"
    assert _inspect(path).exit_code == 0
    with h5py.File(path, "r+") as f:
        solver = json.loads(f.attrs["solver"])
        c = np.asarray(f["strategy"])
        # the stored sensitivity is the 2-epoch one (brute force over the b = 4 patterns and signs)
        assert solver["sensitivity"] == pytest.approx(_brute_sensitivity_fixed_epoch(c, 2), rel=1e-6)
        solver["sensitivity"] = 0.5
        f.attrs["solver"] = json.dumps(solver)
    r = _inspect(path)
    assert r.exit_code == 1 and "solver sensitivity 0.5" in r.stderr


# --- finding 5: a non-causal C is refused where the analysis assumes causality --------------------


@pytest.mark.parametrize("args", [["--sigma", "2"], ["--sigma", "2", "--epochs", "2"], ["--epsilon", "2"],
                                  ["--epsilon", "2", "--min-sep", "3"]])
def test_non_causal_c_refused_in_one_line(tmp_path, args):
    path = tmp_path / "upper.npy"
    np.save(path, np.triu(np.ones((8, 8))) / np.sqrt(8))
    r = runner.invoke(app, ["account", str(path), *args, "-q"])
    assert r.exit_code == 1 and "Traceback" not in r.output and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the strategy C is not causal: row 0") and "column 1" in lines[0]


@pytest.mark.parametrize("name", ["identity", "tree", "sqrt"])
def test_causal_strategies_square_or_not_still_accounted(name):
    """The tree (2n - 1 rows, released bottom-up) is causal in release order and still accounted."""
    inp = resolve_strategy(strategy=name, n=8)
    rep = account(inp, sigma=2.0, sampling=None)
    assert rep.single_pass is not None
    # single pass: sens = max column norm (the tree: sqrt(log2 n + 1) = 2 ones per column, times its scale)
    assert rep.single_pass.sensitivity == pytest.approx(float(np.linalg.norm(inp.strategy, axis=0).max()), rel=1e-12)
    if name == "tree":
        assert inp.strategy.shape == (15, 8)
        assert rep.single_pass.sensitivity == pytest.approx(2.0 * float(inp.strategy.max()), rel=1e-12)
    rep = account(inp, sigma=2.0, sampling=None, participation=FixedEpoch(epochs=2))
    assert rep.deterministic is not None


# --- finding 3: --epochs says it assumes the same data order every epoch, and what holds otherwise --


def _reshuffled_two_epoch_sensitivity(c: np.ndarray) -> float:
    """Brute force: one step in each half, any pair, any signs (the data reshuffled between epochs)."""
    n = c.shape[1]
    b = n // 2
    return max(float(np.linalg.norm(c[:, i] + s * c[:, j])) for i in range(b) for j in range(b, n) for s in (-1.0, 1.0))


def test_epochs_says_same_order_and_the_advised_schema_covers_reshuffling():
    inp = resolve_strategy(strategy="sqrt", n=8)
    rep = account(inp, sigma=2.0, sampling=None, participation=FixedEpoch(epochs=2))
    text = rep.rows["deterministic"]["assumptions"]
    assert "same data order in every epoch" in text and "min-separation 1 with at most 2 participations" in text
    assert "--" not in text
    reshuffled = _reshuffled_two_epoch_sensitivity(inp.strategy)
    # the same-order schema does not cover reshuffling, the advised one does
    assert rep.deterministic.sensitivity.value < reshuffled - 1e-6
    advised = account(inp, sigma=2.0, sampling=None, participation=MinSeparation(separation=1, max_participations=2))
    assert advised.deterministic.sensitivity.value >= reshuffled - 1e-12
    r = runner.invoke(app, ["account", "--help"])
    assert "same data order" in " ".join(r.stdout.split())


# --- findings 6, 10: labels ---------------------------------------------------------------------


def test_dp_sgd_calibration_on_a_custom_c_is_not_labelled_as_its_sigma(tmp_path):
    path = tmp_path / "neg.npy"
    np.save(path, _neg_c())
    args = ["account", str(path), "--sampling", "0.05", "--setting", "dp-sgd", "--epsilon", "1", "-q"]
    r = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "NOT a sigma for this C" in r.stdout and "privacy of custom" not in r.stdout
    assert "DP-SGD reference (C = I, not this C) for custom" in r.stdout
    out = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert out["calibration"]["for_accounted_strategy"] is False
    out = json.loads(runner.invoke(app, ["account", "--strategy", "identity", "--n", "8", *args[2:], "--json"]).stdout)
    assert out["calibration"]["for_accounted_strategy"] is True


def test_rows_name_their_neighbouring_relation_and_sensitivities_are_named():
    inp = resolve_strategy(strategy="tree", n=8)
    rows = account(inp, sigma=2.0, sampling=None, batching="shuffle").rows
    assert rows["shuffled-dp-sgd"]["neighbouring"] == "replace-one"
    # a shuffle is a permutation of a fixed N: its other rows are for zeroing one example out
    assert {rows[k]["neighbouring"] for k in rows if k not in ("shuffled-dp-sgd", "dp-sgd-reduction")} == {"zero-out"}
    # the DP-SGD reduction inherits the shuffled DP-SGD bound's relation (replace-one covers zero-out)
    assert rows.get("dp-sgd-reduction", {"neighbouring": "replace-one"})["neighbouring"] == "replace-one"
    rows = account(inp, sigma=2.0, sampling=None, batching="balls-in-bins").rows
    assert {r["neighbouring"] for r in rows.values()} == {"add-remove"}
    r = runner.invoke(app, ["account", "--strategy", "sqrt", "--n", "8", "--epochs", "2", "--sigma", "2", "--json", "-q"])
    out = json.loads(r.stdout)
    c = resolve_strategy(strategy="sqrt", n=8).strategy
    assert out["sensitivity_single"] == out["sensitivity"] == pytest.approx(float(np.linalg.norm(c, axis=0).max()))
    assert out["schema_sensitivity"] >= _brute_sensitivity_fixed_epoch(c, 2) - 1e-12
    assert out["settings"]["deterministic"]["neighbouring"] == "add-remove"


def test_banded_row_says_how_many_bands_are_non_zero():
    r = runner.invoke(app, ["compare", "--n", "16", "--min-sep", "4", "--bands", "8", "-s", "identity", "--json", "-q"])
    assert r.exit_code == 0, r.output
    row = next(x for x in json.loads(r.stdout)["strategies"] if x["name"] == "banded-toeplitz-8")
    assert "8 bands (4 non-zero" in row["description"]
