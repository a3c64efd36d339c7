"""``mfcli plan --out`` above the dense-artifact limit writes a structured artifact (banded
Toeplitz for BandMF, BLT); ``mfcli account`` with the options recorded in it re-accounts it to
epsilon <= target, ``mfcli inspect`` re-verifies the record, and an oracle computed here agrees:
dp-accounting composed from the stored coefficients (cyclic Poisson), or the closed-form analytic
Gaussian at the fixed-epoch sensitivity of the dense C materialised here (fixed order). Setups:
n = 103 epochs x 10 steps = 1030 > PLAN_DENSE_ARTIFACT_MAX_N, a few seconds each."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.model.participation import FixedEpoch, SingleParticipation
from mfcli.services.plan import TrainingSetup, enumerate_candidates, evaluate, writable
from mfcli.util.limits import PLAN_DENSE_ARTIFACT_MAX_N

CLI = [sys.executable, "-m", "mfcli"]
SETUP = ["--examples", "10000", "--batch", "1000", "--epochs", "103", "--epsilon", "4", "--bands", "2",
         "--buffers", "2", "--workers", "0"]
N, EPOCHS, S, Q, TARGET, DELTA = 1030, 103, 10, 0.1, 4.0, 1e-6


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _run(*args: str) -> dict:
    p = subprocess.run([*CLI, *args], capture_output=True, text=True, env=_env(), timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _first_column(path: Path) -> np.ndarray:
    """The first column c of the Toeplitz C stored in the artifact, cut at n (banded: the
    coefficients; BLT: c_0 = 1, c_t = sum_i omega_i theta_i^(t - 1), its definition)."""
    with h5py.File(path, "r") as f:
        g = f["structured"]
        if "coefs" in g:
            c = np.zeros(N)
            coefs = np.asarray(g["coefs"])
            c[:len(coefs)] = coefs
            return c
        theta, omega = np.asarray(g["theta"]), np.asarray(g["omega"])
    t = np.arange(1, N)
    return np.concatenate([[1.0], (omega[None, :] * theta[None, :] ** (t[:, None] - 1)).sum(axis=1)])


@pytest.mark.parametrize("batching, kind, setting", [
    ("cyclic", "banded-toeplitz", "cyclic-poisson"),
    ("fixed-order", "blt", "deterministic"),
])
def test_structured_recommendation_is_reaccounted_by_account_and_verified_by_inspect(
        tmp_path: Path, batching: str, kind: str, setting: str) -> None:
    out = tmp_path / "rec.h5"
    # plan in process (the same typer app), account and inspect as real subprocesses
    res = CliRunner().invoke(app, ["plan", *SETUP, "--batching", batching, "--out", str(out), "--json", "-q"])
    assert res.exit_code == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["setup"]["n"] == N > PLAN_DENSE_ARTIFACT_MAX_N and plan["saved"]["setting"] == setting
    with h5py.File(out, "r") as f:
        assert "strategy" not in f and "structured" in f  # parameters only, no dense C
        (rec_id,) = list(f["accounting"])
        rec = dict(f["accounting"][rec_id].attrs)
    sigma, delta = float(rec["sigma"]), float(rec["delta"])
    assert sigma == plan["saved"]["noise_std"] and delta == DELTA
    # `mfcli account ART --sigma S <the recorded options>`
    opts = ["--sigma", repr(sigma), "--delta", repr(delta)]
    if batching == "cyclic":
        vd = json.loads(rec["results"])[setting]["value_discretization"]
        opts += ["--sampling", repr(float(rec["sampling"])), "--batching", "cyclic", "--value-discretization", repr(vd)]
    acc = _run("account", str(out), *opts, "--json", "-q")
    eps = acc["settings"][setting]["epsilon"]
    assert eps <= TARGET and eps == pytest.approx(float(rec[f"epsilon_{setting.replace('-', '_')}"]), rel=1e-12)
    ins = _run("inspect", str(out), "--json")
    assert ins["kind"] == kind and [r["verified"] for r in ins["accounting_records"]] == [True]
    # an oracle computed here from the stored parameters
    c = _first_column(out)
    if batching == "cyclic":
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        bands = int(np.nonzero(c)[0].max()) + 1
        assert bands <= 2 and float(rec["sampling"]) == pytest.approx(2 * Q)
        pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=vd)
        pld.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(
            2 * Q, dp_event.GaussianDpEvent(sigma / float(np.linalg.norm(c)))), math.ceil(N / 2)))
        oracle = pld.get_epsilon(delta)
        # the account's PLD is certified under round-off (within 1e-6 of dp-accounting's; measured 1.8e-9)
        assert oracle <= TARGET and oracle == pytest.approx(eps, rel=1e-6)
    else:
        i, j = np.indices((N, N))
        dense = np.where(i >= j, c[np.clip(i - j, 0, None)], 0.0)
        gram = dense.T @ dense
        # with a non-negative Gram matrix the worst sign pattern is all +1, so the fixed-epoch
        # sensitivity is the largest sum of the Gram block over one residue class mod s
        assert gram.min() >= -1e-12
        sens = math.sqrt(max(gram[r::S, r::S].sum() for r in range(S)))
        mu = sens / sigma
        assert norm.cdf(-TARGET / mu + mu / 2) - math.exp(TARGET) * norm.cdf(-TARGET / mu - mu / 2) <= DELTA * (1 + 1e-9)


def test_writable_at_large_n() -> None:
    """A tree has no structured form (dense artifact at n <= PLAN_DENSE_ARTIFACT_MAX_N only), so above
    that limit it is not offered for --out; DP-SGD (its Poisson accounting needs no C), the
    Toeplitz and BLT candidates are at any n."""
    from mfcli.util.limits import STRUCTURED_DENSE_MAX_N

    setup = TrainingSetup(examples=100, batch=10, epochs=1, epsilon=2.0, bands=(2,), buffers=(2,))
    results = {c.key: evaluate(setup, c) for c in enumerate_candidates(setup)[0]
               if c.key in ("dp-sgd", "tree", "banded-2", "blt-2")}
    assert isinstance(results["tree"].participation, SingleParticipation)
    table = [("tree", PLAN_DENSE_ARTIFACT_MAX_N, True), ("tree", PLAN_DENSE_ARTIFACT_MAX_N + 1, False),
             ("dp-sgd", STRUCTURED_DENSE_MAX_N, True), ("dp-sgd", STRUCTURED_DENSE_MAX_N + 1, True),
             ("banded-2", 10 ** 6, True), ("blt-2", 10 ** 6, True)]
    for key, n, ok in table:
        assert writable(results[key], n)[0] is ok, (key, n)  # type: ignore[arg-type]
    # a multi-epoch tree never is (one tree per epoch)
    multi = dataclasses.replace(results["tree"], participation=FixedEpoch(epochs=2))  # type: ignore[arg-type]
    assert not writable(multi, 20)[0]


@pytest.mark.parametrize("args, message, code", [
    (["--batching", ","], "allow at least one batch sampler", 2),  # the option's own range: a usage error
    (["--scheduler", "not-an-address"], "cannot reach the Dask scheduler at not-an-address", 1),
])
def test_bad_option_values_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                          message: str, code: int) -> None:
    """An empty sampler list is refused (not read as "all samplers"); a malformed scheduler
    address is one error line, not a traceback."""
    if "--scheduler" in args:
        pytest.importorskip("distributed")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["plan", "--examples", "100", "--batch", "10", "--epochs", "1", "--epsilon", "1",
                                 *args, "--out", "x.h5", "-q"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == code and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_text_says_why_better_rows_are_not_recommended() -> None:
    """Rows ranked above the recommendation are listed with the reason they are passed over."""
    from mfcli.cli.plan import render_text
    from mfcli.services.plan import Plan, recommend

    setup = TrainingSetup(examples=800, batch=100, epochs=2, epsilon=2.0, batching=("balls-in-bins", "fixed-order"),
                          bands=(2,), buffers=(2,))
    res = {c.key: evaluate(setup, c) for c in enumerate_candidates(setup)[0]
           if c.key in ("honaker (balls-in-bins)", "tree", "blt-2")}
    ranked = (res["honaker (balls-in-bins)"], res["tree"], res["blt-2"])
    rec = recommend(ranked, setup.n)  # type: ignore[arg-type]
    assert rec is res["blt-2"]
    text = render_text(Plan(setup, ranked, (), rec, 0.0), None)  # type: ignore[arg-type]
    assert ("not recommended: honaker (balls-in-bins) (balls-in-bins): its bound assumes non-adaptive "
            "contributions") in text
    assert "not recommended: tree (fixed-order): a tree restarted every epoch has no single-artifact form" in text
    assert "not recommended: blt-2" not in text and "recommended: blt-2" in text
