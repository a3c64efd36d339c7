"""examples/plan_to_jax.py --quick end to end (a subprocess): one JSON line with the documented
keys, both arms at most the target epsilon and trained, each at the rate it chose on the validation split."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from training_cases import check_arms_alike

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("sklearn")
pytest.importorskip("jax_privacy")   # the DP-SGD arm is jax_privacy's own

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"epsilon", "delta", "mechanism", "accuracy", "seconds_per_epoch", "dpsgd_accuracy", "dpsgd_seconds_per_epoch"}


def test_quick_run_prints_one_json_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "plan_to_jax.py"), "--quick", "--seed", "1",
                        "--lr-grid", "0.5,2"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert KEYS <= set(out)
    assert 0 < out["epsilon"] <= 4.0 and 0 < out["dpsgd_epsilon"] <= 4.0
    assert out["steps"] == 20 and out["epsilon_per_epoch"][-1] == out["epsilon"]
    assert out["accuracy"] > 0.2 and out["dpsgd_accuracy"] > 0.2   # chance is 0.1
    assert out["dpsgd_mechanism"] == "jax_privacy dp-sgd"
    # the same noise units and the same learning-rate grid for both arms
    check_arms_alike(out, validation=300 // 8, grid={"0.5", "2.0"})
    # jax_privacy's calibrated sigma, re-accounted by dp-accounting itself: 20 Poisson steps at 30 / 300
    from dp_accounting import NeighboringRelation, dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(out["dpsgd_noise_multiplier"])), 20)
    assert acc.get_epsilon(1e-5) <= 4.0 + 1e-6
