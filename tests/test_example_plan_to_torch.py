"""examples/plan_to_torch.py --quick end to end (a subprocess, as a user runs it): one JSON line
with the keys the docs promise, an epsilon at most the target, and both arms trained."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from training_cases import check_arms_alike

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
    # the same noise units and the same learning-rate grid for both arms
    check_arms_alike(out, validation=300 // 8, grid={"0.5", "2.0"})


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


# --- the learning-rate protocol both examples share (examples/offline_data.py::tune) -------------

def _offline_data():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import offline_data
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return offline_data


@pytest.mark.parametrize(("validation", "n", "held"), [(None, 80, 10), (None, 7, 1), (3, 80, 3), (79, 80, 79)])
def test_tune_scores_every_arm_on_the_same_grid_and_the_last_examples(validation, n, held) -> None:
    import argparse

    import numpy as np

    od = _offline_data()
    x, y = np.arange(n) * 10, np.arange(n)
    # a table of validation accuracies with a tie at the top for "b" (0.5 and 2 both 0.9)
    table = {"a": {0.5: 0.7, 1.0: 0.8, 2.0: 0.6}, "b": {0.5: 0.9, 1.0: 0.1, 2.0: 0.9}}
    calls = []

    def score(arm, lr, fit, val):
        calls.append((arm, lr))
        # fit is the first n - held examples, val the last held, in order, nothing dropped or repeated
        assert [list(a) for a in fit] == [list(x[:n - held]), list(y[:n - held])]
        assert [list(a) for a in val] == [list(x[n - held:]), list(y[n - held:])]
        return table[arm][lr]

    args = argparse.Namespace(validation=validation, lr_grid="0.5,1,2")
    best, scores = od.tune(args, (x, y), score, ("a", "b"))
    assert sorted(calls) == sorted((arm, lr) for arm in "ab" for lr in (0.5, 1.0, 2.0))
    assert best == {"a": 1.0, "b": 0.5}   # the argmax; a tie goes to the smaller rate
    assert scores == table and args.validation == held


@pytest.mark.parametrize("validation", [0, 80, -1])
def test_tune_refuses_a_validation_split_outside_the_training_split(validation) -> None:
    import argparse

    import numpy as np

    from mfcli.errors import MfcliError

    od = _offline_data()
    args = argparse.Namespace(validation=validation, lr_grid="1")
    with pytest.raises(MfcliError, match=r"--validation must be in \[1, 79\]"):
        od.tune(args, (np.zeros(80), np.zeros(80)), lambda *a: 0.0, ("a",))
