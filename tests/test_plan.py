"""``mfcli plan`` (mfcli/services/plan.py, mfcli/cli/plan.py): every recommended sigma re-accounted
independently (``mfcli account`` on the written artifact with the recorded options, and an
oracle computed here: brute-force schema sensitivity and the closed-form analytic Gaussian, or
dp-accounting composed in the test for the Poisson samplers), the error recomputed from the
written B, ranking, executors giving identical numbers, bad input. Setups are small (n = 20)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from accounting_oracles import gaussian_delta
from sensitivity_oracle import brute_sensitivity
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch
from mfcli.schemas import load_schema, validate
from mfcli.services.plan import (
    SAMPLERS,
    CandidateResult,
    TrainingSetup,
    enumerate_candidates,
    evaluate,
    make_plan,
    rank,
    run_plan,
)

SMALL = {"examples": 1000, "batch": 100, "epochs": 2, "epsilon": 2.0, "workload": "momentum"}
CLI = [sys.executable, "-m", "mfcli"]


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _read(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    with h5py.File(path, "r") as f:
        c, b = np.asarray(f["strategy"]), np.asarray(f["decoder"])
        rec = dict(f["accounting"][next(iter(f["accounting"]))].attrs)
    return c, b, rec


# ---------------------------------------------------------------------------------------------
# Setup validation and candidate enumeration (no evaluation: cheap)


@pytest.mark.parametrize("kwargs, message", [
    ({**SMALL, "batch": 2000}, "larger than the data set"),
    ({**SMALL, "epochs": 0}, "zero epochs"),
    ({**SMALL, "epochs": None, "steps": 25}, "multiple of 10"),
    ({**SMALL, "epochs": None}, "epochs or the number of steps"),
    ({**SMALL, "batching": ("bogus",)}, "unknown batch sampler"),
    ({**SMALL, "workload": "custom"}, "Toeplitz workloads"),
    ({**SMALL, "epsilon": -1.0}, "epsilon"),
    ({**SMALL, "delta": 2.0}, "delta"),
])
def test_bad_setups_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(MfcliError, match=message):
        TrainingSetup(**kwargs)


def test_setup_numbers() -> None:
    s = TrainingSetup(examples=60000, batch=256, epochs=20, epsilon=8.0)
    assert (s.steps_per_epoch, s.n, s.max_groups) == (235, 4700, 234)
    assert s.sampling == 256 / 60000
    assert TrainingSetup(examples=1000, batch=100, steps=40, epsilon=1.0).epochs == 4


@pytest.mark.parametrize("allowed", [(s,) for s in SAMPLERS] + [("poisson", "cyclic"), ("fixed-order", "shuffle")])
def test_no_candidate_under_a_sampler_not_allowed(allowed: tuple[str, ...]) -> None:
    setup = TrainingSetup(**{**SMALL, "examples": 1600, "batching": allowed})  # 16 steps per epoch: 2^4 leaves
    try:
        cands, skipped = enumerate_candidates(setup)
    except MfcliError as exc:
        assert allowed == ("shuffle",) and "no candidate has a valid accounting" in str(exc)
        return
    assert {c.sampler for c in cands} <= set(allowed)
    assert {s.sampler for s in skipped} <= set(allowed)
    if "cyclic" in allowed:  # bands beyond the groups the sampler can form are skipped, with the reason
        assert all(c.size <= setup.max_groups for c in cands if c.kind == "bandmf")
        assert any("bands need" in s.reason for s in skipped)
    if "balls-in-bins" in allowed:
        # DP-SGD, the tree and Honaker by their own bounds, every other strategy by the DP-SGD reduction
        assert {c.kind for c in cands if c.sampler == "balls-in-bins"} == {"tree", "honaker", "dp-sgd", "bandmf",
                                                                          "dense", "banded", "blt"}


def test_balls_in_bins_tree_needs_a_power_of_two_epoch() -> None:
    """10 steps per epoch: the tree's balls-in-bins bound (2^L leaves) does not apply, DP-SGD's
    (any number of steps) does, and with it the reduction row of every other strategy."""
    cands, skipped = enumerate_candidates(TrainingSetup(**{**SMALL, "batching": ("balls-in-bins",)}))
    assert {c.kind for c in cands} == {"dp-sgd", "bandmf", "dense", "banded", "blt"}
    assert {s.key for s in skipped if "not a power of 2" in s.reason} == {"tree (balls-in-bins)",
                                                                          "honaker (balls-in-bins)"}


def _result(key: str, rmse: float, mem: int) -> CandidateResult:
    from mfcli.accounting.calibrate import Calibration
    from mfcli.model.participation import SingleParticipation

    return CandidateResult(key=key, kind="banded", size=None, mechanism=key, strategy=key,
                           participation=SingleParticipation(), sampler="fixed-order", accounting="single-pass",
                           sigma=1.0, epsilon=1.0, sensitivity=1.0, sampling=None, rmse_mean=rmse, rmse_max=rmse,
                           memory_floats=mem, memory_bytes=4 * mem, calibration=Calibration(1.0, 1.0, 1.0, 0.9, 1),
                           seconds=0.0)


def test_rank_lowest_error_first_ties_to_the_cheaper_stream() -> None:
    rows = [_result("a", 3.0, 1), _result("b", 1.0, 50), _result("c", 1.0 * (1 + 1e-12), 2), _result("d", 2.0, 0)]
    assert [r.key for r in rank(rows)] == ["c", "b", "d", "a"]


# ---------------------------------------------------------------------------------------------
# Evaluation against independent oracles


def test_fixed_order_candidates_meet_the_target_by_brute_force() -> None:
    """Every fixed-order candidate: sigma meets (epsilon, delta) at the brute-force schema
    sensitivity of its dense C (closed-form Gaussian), and its RMSE is sigma ||B[t,:]||."""
    from mfcli.services.plan import _dense_strategy

    setup = TrainingSetup(**{**SMALL, "batching": ("fixed-order",), "bands": (2, 8), "buffers": (2,)})
    plan = make_plan(setup, workers=0)
    assert {r.key for r in plan.ranked} == {"dense", "banded-2", "banded-8", "blt-2", "tree", "honaker"}
    schema = FixedEpoch(epochs=2)
    for r in plan.ranked:
        if r.kind in ("tree", "honaker"):
            from tree_oracles import restarted_tree

            ce, me, _ = restarted_tree(setup, r.kind)
            c = np.kron(np.eye(2), ce)  # one tree per epoch
            b = dense_workload_matrix(setup) @ np.kron(np.eye(2), me)
        else:
            st = _dense_strategy(setup, r)
            f = st[0] if isinstance(st, tuple) else st.factorization
            c, b = np.asarray(f.strategy), np.asarray(f.decoder)
            np.testing.assert_allclose(b @ c, dense_workload_matrix(setup), atol=1e-8)
        sens = brute_sensitivity(c, schema)
        assert gaussian_delta(setup.epsilon, sens, r.sigma) <= setup.delta * (1 + 1e-9), r.key
        assert gaussian_delta(setup.epsilon, sens, r.sigma * 0.99) > setup.delta, r.key  # calibrated, not loose
        per_step = r.sigma * np.linalg.norm(b, axis=1)
        assert r.rmse_mean == pytest.approx(math.sqrt(float(np.mean(per_step ** 2))), rel=1e-6), r.key
        assert r.rmse_max == pytest.approx(float(per_step.max()), rel=1e-6), r.key
    honaker, tree = (next(r for r in plan.ranked if r.kind == k) for k in ("honaker", "tree"))
    assert honaker.sigma == tree.sigma and honaker.rmse_mean < tree.rmse_mean  # post-processing: same privacy


def dense_workload_matrix(setup: TrainingSetup) -> np.ndarray:
    """A built here from its definition: momentum a_t = sum_{u<=t} beta^u, lower-triangular Toeplitz."""
    n, beta = setup.n, setup.beta
    col = np.cumsum(beta ** np.arange(n))
    i, j = np.indices((n, n))
    return np.where(i >= j, col[np.clip(i - j, 0, None)], 0.0)


def test_poisson_samplers_meet_the_target_by_dp_accounting() -> None:
    """DP-SGD and BandMF: epsilon recomputed here with dp-accounting from the event the theorem
    names (n Poisson-sampled Gaussians; ceil(n / b) at rate b q and sigma / max column norm, the
    bands and column norm counted on the dense C)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from mfcli.services.plan import PLD_DISCRETIZATION, _dense_strategy

    setup = TrainingSetup(**{**SMALL, "batching": ("poisson", "cyclic"), "bands": (4,)})
    for cand in enumerate_candidates(setup)[0]:
        r = evaluate(setup, cand)
        assert isinstance(r, CandidateResult)
        if r.kind == "dp-sgd":
            nm, rate, steps = r.sigma, setup.sampling, setup.n
        else:
            c = _dense_strategy(setup, r).factorization.strategy
            rows, cols = np.nonzero(np.abs(c) > 0)
            bands = int((rows - cols).max()) + 1
            assert bands <= 4 and not np.any(np.triu(c, 1))
            nm, rate, steps = r.sigma / float(np.linalg.norm(c, axis=0).max()), 4 * setup.sampling, math.ceil(setup.n / 4)
        for mult, ok in ((1.0, True), (0.98, False)):
            acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
            acc.compose(dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(nm * mult)), steps))
            assert (acc.get_epsilon(setup.delta) <= setup.epsilon) is ok, (r.key, mult)


# ---------------------------------------------------------------------------------------------
# Executors


def test_process_pool_and_dask_give_identical_results() -> None:
    """The same numbers (all but the wall time) in process, on a process pool and on a Dask
    LocalCluster reached by its address; an optimised banded Toeplitz and a tree candidate."""
    distributed = pytest.importorskip("distributed")
    setup = TrainingSetup(**{**SMALL, "batching": ("fixed-order",), "bands": (4,), "buffers": (2,)})
    cands = [c for c in enumerate_candidates(setup)[0] if c.key in ("banded-4", "tree")]
    assert len(cands) == 2
    inline = run_plan(setup, cands, workers=0)
    pool = run_plan(setup, cands, workers=2)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
        dask = run_plan(setup, cands, scheduler=cl.scheduler_address)
    assert all(isinstance(r, CandidateResult) for r in inline)
    for other in (pool, dask):
        assert [r.numbers() for r in other] == [r.numbers() for r in inline]  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# CLI end to end


def test_cli_end_to_end_writes_the_recommended_artifact_and_account_reaccounts_it(tmp_path: Path) -> None:
    """A real subprocess: --json validates, --out holds the record, ``mfcli account`` on the
    artifact with the recorded options gives epsilon <= target, and the closed-form Gaussian at
    the brute-force sensitivity of the stored C agrees."""
    out, plot = tmp_path / "rec.h5", tmp_path / "curve.png"
    args = ["plan", "--examples", "1000", "--batch", "100", "--epochs", "2", "--epsilon", "2", "-w", "momentum",
            "--batching", "fixed-order", "--bands", "4", "--buffers", "2", "--workers", "0", "--json", "--out", str(out)]
    try:
        import matplotlib  # noqa: F401

        args += ["--plot", str(plot)]
    except ImportError:
        plot = None  # type: ignore[assignment]
    p = subprocess.run([*CLI, *args], capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "[1/" in p.stderr  # progress on stderr
    obj = json.loads(p.stdout)
    assert validate(obj, load_schema("plan")) == []
    bad = json.loads(p.stdout)
    assert obj["schema_version"] == 3  # plan's layout 3: noise_multiplier primary, noise_std secondary
    bad["candidates"][0]["noise_multiplier"] = "big"
    assert validate(bad, load_schema("plan")) != []
    rmse = [c["rmse_mean"] for c in obj["candidates"]]
    assert rmse == sorted(rmse)
    rec = obj["candidates"][0]
    assert obj["recommended"] == rec["candidate"] == "dense" and obj["saved"]["artifact"] == str(out)
    if plot is not None:
        assert plot.read_bytes()[:4] == b"\x89PNG"
    c, b, record = _read(out)
    assert record["calibrated_setting"] == "deterministic" and float(record["sigma"]) == rec["noise_std"]
    q = subprocess.run([*CLI, "account", str(out), "--sigma", repr(rec["noise_std"]),
                        "--delta", repr(float(record["delta"])), "--json", "-q"],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert q.returncode == 0, q.stderr
    acc = json.loads(q.stdout)["settings"]["deterministic"]
    eps = acc["epsilon"]
    assert eps <= 2.0
    # the plan row names the relation its epsilon holds for, as account does for the same setting
    assert rec["neighbouring"] == acc["neighbouring"] == "add-remove"
    sens = brute_sensitivity(c, FixedEpoch(epochs=2))
    assert gaussian_delta(2.0, sens, rec["noise_std"]) <= 1e-6 * (1 + 1e-9)
    assert rec["noise_multiplier"] == pytest.approx(rec["noise_std"] / sens, rel=1e-9)  # the schema sensitivity of C
    assert rec["rmse_mean"] == pytest.approx(rec["noise_std"] * math.sqrt(float(np.mean(np.sum(b * b, axis=1)))), rel=1e-6)


def test_cli_cyclic_artifact_reaccounted_by_account(tmp_path: Path) -> None:
    out = tmp_path / "band.h5"
    r = CliRunner().invoke(app, ["plan", "--examples", "1000", "--batch", "100", "--epochs", "2", "--epsilon", "2",
                                 "--batching", "cyclic", "--bands", "2", "--workers", "0", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    assert "recommended: bandmf-2" in r.stdout
    from mfcli.io.artifact import is_structured_file

    assert is_structured_file(out)  # BandMF has a structured form: written as such at any n
    with h5py.File(out, "r") as f:
        record = dict(f["accounting"][next(iter(f["accounting"]))].attrs)
    rows = json.loads(record["results"])["cyclic-poisson"]
    p = subprocess.run([*CLI, "account", str(out), "--sigma", repr(float(record["sigma"])), "--sampling",
                        repr(float(record["sampling"])), "--batching", "cyclic",
                        "--value-discretization", repr(rows["value_discretization"]), "--json", "-q"],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["settings"]["cyclic-poisson"]["epsilon"] <= 2.0


@pytest.mark.parametrize("args, message, code", [
    (["--examples", "100", "--batch", "200", "--epochs", "1", "--epsilon", "1"], "larger than the data set", 1),
    # out of the option's own range: a usage error, refused while parsing (README, exit codes)
    (["--examples", "100", "--batch", "10", "--epochs", "0", "--epsilon", "1"], "zero epochs", 2),
    (["--examples", "100", "--batch", "10", "--epochs", "1", "--epsilon", "1", "--batching", "poisson,foo"],
     "--batching: unknown batch sampler 'foo'", 2),
    # a missing or doubled option is a usage error too (README, exit codes)
    (["--examples", "100", "--batch", "10", "--epsilon", "1"], "give --epochs or --steps", 2),
    (["--examples", "100", "--batch", "10", "--epochs", "1", "--steps", "10", "--epsilon", "1"],
     "give --epochs or --steps", 2),
    (["--examples", "100", "--batch", "10", "--epochs", "1", "--epsilon", "1", "--batching", "shuffle"],
     "allow poisson or fixed-order", 1),
    (["--examples", "100", "--batch", "10", "--epochs", "2", "--epsilon", "1e-9", "--batching", "fixed-order",
      "--bands", "2", "--buffers", "2"], "no sigma up to", 1),
])
def test_bad_input_one_error_line_nothing_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  args: list[str], message: str, code: int) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["plan", *args, "--workers", "0", "--out", "x.h5", "-q"])
    assert r.exit_code == code
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []

