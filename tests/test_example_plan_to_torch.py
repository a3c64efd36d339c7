"""examples/plan_to_torch.py --quick end to end (a subprocess, as a user runs it): one JSON line
with the keys the docs promise, an epsilon at most the target, and both arms trained."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("opacus")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"epsilon", "delta", "mechanism", "accuracy", "seconds_per_epoch", "dpsgd_accuracy", "dpsgd_seconds_per_epoch"}


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "examples" / "plan_to_torch.py"), *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_quick_run_prints_one_json_line() -> None:
    r = _run("--quick", "--epsilon", "4", "--delta", "1e-5", "--seed", "1", "--lr-grid", "0.5,2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert KEYS <= set(out)
    assert 0 < out["epsilon"] <= 4.0 and out["delta"] == 1e-5
    assert out["epsilon_per_epoch"][-1] == out["epsilon"] and len(out["epsilon_per_epoch"]) == 2
    assert out["dpsgd_epsilon"] <= 4.0 + 1e-6
    for k in ("accuracy", "dpsgd_accuracy"):
        assert 0.0 <= out[k] <= 1.0
    assert out["accuracy"] > 0.2   # better than chance (0.1) after 2 epochs, far from flaky
    assert out["seconds_per_epoch"] > 0 and out["dpsgd_seconds_per_epoch"] > 0
    assert out["steps"] == 20 and out["batch_sampler"] == "fixed-order"
    # like with like: both arms report the noise multiplier (std / sensitivity) and the std on C G
    assert out["noise_multiplier"] * out["sensitivity"] == pytest.approx(out["noise_std"], rel=1e-12)
    assert out["dpsgd_noise_multiplier"] == out["dpsgd_noise_std"] > 0   # DP-SGD: C = I, sensitivity 1
    assert "sigma" not in out and "dpsgd_sigma" not in out
    # the same grid for both arms, each arm's rate the best on the validation split (ties: the smaller)
    scores = out["validation_accuracy"]
    assert out["validation"] == 300 // 8 and set(scores) == {"mfcli", "dpsgd"}
    for arm, key in (("mfcli", "lr"), ("dpsgd", "dpsgd_lr")):
        assert set(scores[arm]) == {"0.5", "2.0"}
        best = max(scores[arm].values())
        assert out[key] == min(float(r) for r, v in scores[arm].items() if v == best)


def test_bad_input_is_one_error_line() -> None:
    r = _run("--dataset", "digits", "--examples", "1700")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: --examples must be in [1, 1497] for digits (at least 300 test "
                                             "examples)"]


def test_tuning_needs_its_own_plan() -> None:
    r = _run("--artifact", "missing.h5", "--lr-grid", "0.5,1")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: --lr-grid trains on the training split minus the validation "
                                             "examples, which needs its own plan; it cannot be combined with --artifact"]
