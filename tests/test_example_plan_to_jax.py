"""examples/plan_to_jax.py --quick end to end (a subprocess): one JSON line with the documented
keys, both arms at most the target epsilon and trained."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"epsilon", "delta", "mechanism", "accuracy", "seconds_per_epoch", "dpsgd_accuracy", "dpsgd_seconds_per_epoch"}


def test_quick_run_prints_one_json_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "plan_to_jax.py"), "--quick", "--seed", "1"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert KEYS <= set(out)
    assert 0 < out["epsilon"] <= 4.0 and 0 < out["dpsgd_epsilon"] <= 4.0
    assert out["steps"] == 20 and out["epsilon_per_epoch"][-1] == out["epsilon"]
    assert out["accuracy"] > 0.2 and out["dpsgd_accuracy"] > 0.2   # chance is 0.1
