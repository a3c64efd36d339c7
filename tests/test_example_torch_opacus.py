"""examples/torch_opacus/train_digits.py, end to end as a user runs it: ``mfcli optimize`` writes
the artifact, the script trains on scikit-learn's digits with Opacus + mfcli in its quick mode,
and the epsilon it reports is the one ``mfcli account`` prints for the same artifact, sigma and
the Poisson rate the loader used (batch / examples)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "torch_opacus" / "train_digits.py"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_quick_mode_from_optimize_output(tmp_path):
    made = run("-m", "mfcli", "optimize", "--workload", "momentum", "--n", "32", "--out", "digits.h5", "--quiet",
               cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    res = run(str(SCRIPT), "digits.h5", "--quick", "--sigma", "4", "--batch", "50", "--seed", "11", "--json",
              cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "error" not in res.stderr
    out = json.loads(res.stdout)
    assert out["steps"] == 32 and out["workload"] == "momentum" and out["train_examples"] == 500
    assert out["sampling"] == 50 / 500           # DataLoader(batch_size=50) over 500 -> Poisson rate 1/10
    acct = run("-m", "mfcli", "account", "digits.h5", "--sigma", "4", "--sampling", "0.1", "--delta", "1e-6",
               "--json", "-q", cwd=tmp_path)
    assert acct.returncode == 0, acct.stderr
    assert out["epsilon"] == json.loads(acct.stdout)["settings"]["mmcc"]["epsilon"]


def test_bad_artifact_is_one_error_line(tmp_path):
    res = run(str(SCRIPT), "missing.h5", "--quick", cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == ["error: artifact missing.h5 does not exist"]
