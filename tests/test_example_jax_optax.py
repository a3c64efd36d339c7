"""examples/jax_optax_digits.py in quick mode (optional: needs jax, optax and scikit-learn).

Oracles: the epsilon it reports against dp-accounting's PLD accountant for one Gaussian with noise
multiplier sigma / sens(C), sens(C) recomputed here as the largest column norm of the artifact's
strategy; training with sigma = 0 must learn (test accuracy far above chance, 0.1) and a huge
sigma must destroy it, which shows the noise really reaches the parameters; step n is refused
with mfcli's own error.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "jax_optax_digits.py"
REFUSAL = "noise stream exhausted: step 16 >= n = 16; the artifact covers steps 0..15"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("jax_optax_digits", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, example) -> Path:
    return example.optimize(16, 0.9, tmp_path_factory.mktemp("digits"))


def test_script_runs_end_to_end_from_mfcli_optimize(tmp_path: Path) -> None:
    """The script as a user runs it: mfcli optimize first, then training; one JSON line out."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    res = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", "--sigma", "2"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr   # the refusal at step n is caught, and not logged by JAX either
    out = json.loads(res.stdout)
    assert out["n"] == 16 and out["batch"] == 1437 // 16 and out["step_n_refused"].startswith(REFUSAL)
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
    acc.compose(dp_event.GaussianDpEvent(2.0 / out["sensitivity"]))
    eps = acc.get_epsilon(1e-5)
    assert out["epsilon"] >= eps * (1 - 1e-3)           # an upper bound (PLD is itself pessimistic)
    assert out["epsilon"] == pytest.approx(eps, rel=2e-3)


def test_sensitivity_is_the_artifacts(example, artifact) -> None:
    from mfcli.io.artifact import load_artifact

    out = example.main(["--artifact", str(artifact), "--quick", "--json", "--sigma", "1"])
    c = load_artifact(artifact).factorization.strategy
    assert out["sensitivity"] == pytest.approx(float(np.max(np.linalg.norm(c, axis=0))), rel=1e-12)


@pytest.mark.parametrize("sigma, low, high", [(0.0, 0.6, 1.0), (1e4, 0.0, 0.3)], ids=["no-noise", "huge-noise"])
def test_noise_reaches_the_parameters(example, artifact, sigma: float, low: float, high: float) -> None:
    out = example.main(["--artifact", str(artifact), "--quick", "--json", "--sigma", str(sigma)])
    assert low <= out["test_accuracy"] <= high
    assert out["step_n_refused"].startswith(REFUSAL)
    assert (out["epsilon"] is None) == (sigma == 0)


def test_non_momentum_artifact_is_refused(example, tmp_path: Path) -> None:
    from mfcli.io.artifact import shipped_artifact

    with pytest.raises(SystemExit, match="momentum artifact"):
        example.main(["--artifact", str(shipped_artifact("prefix-n256")), "--quick"])
