"""Shared cases of the training tests: tiny artifacts with real accounting records (written by the
accounting session, as ``mfcli account --write`` does), an indexed data set and a small model."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mfcli.io.artifact import save_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.participation import FixedEpoch, MinSeparation
from mfcli.services import account as session


def prefix_artifact(path: Path, c: np.ndarray, name: str) -> Path:
    """A dense prefix-sum artifact of strategy C (decoder A C^-1), written by the real writer."""
    n = c.shape[0]
    a = np.tril(np.ones((n, n)))
    save_artifact(path, Factorization(workload=a, strategy=c, decoder=a @ np.linalg.inv(c), causal=True),
                  workload_name="prefix", strategy_name=name)
    return path


def _record(path: Path, *, sigma: float, settings: list[str], sampling: float | None = None,
            batching: str | None = None, schema: object = None, delta: float = 1e-5) -> str:
    inp = session.resolve_strategy(path)
    rep = session.account(inp, sigma=sigma, sampling=sampling, settings=settings,
                          options=session.AccountingOptions(delta=delta), participation=schema, batching=batching)
    return session.record_to_artifact(rep).rsplit("/", 1)[-1]


def make_arts(d: Path) -> dict[str, tuple[Path, str]]:
    """(artifact, record id) per sampler: C = I with a DP-SGD Poisson record (q = 0.5, so 2 steps
    an epoch, 3 epochs); C = I with a deterministic 3-epoch record (fixed order, period 2); a
    2-banded C with a cyclic-Poisson record (2 groups, rate 0.5)."""
    n = 6
    poisson = prefix_artifact(d / "id6p.h5", np.eye(n), "identity")
    fixed = prefix_artifact(d / "id6f.h5", np.eye(n), "identity")
    cyclic = prefix_artifact(d / "band6.h5", np.eye(n) + 0.5 * np.eye(n, k=-1), "banded2")
    return {
        "poisson": (poisson, _record(poisson, sigma=2.0, sampling=0.5, settings=["dp-sgd"], batching="poisson")),
        "fixed-order": (fixed, _record(fixed, sigma=2.0, settings=["deterministic"], schema=FixedEpoch(epochs=3))),
        "cyclic": (cyclic, _record(cyclic, sigma=2.0, sampling=0.5, settings=["cyclic-poisson"], batching="cyclic",
                                   schema=MinSeparation(separation=2))),
    }


def check_arms_alike(out: dict, *, validation: int, grid: set[str]) -> None:
    """The checks both plan_to_* examples' JSON lines owe (their --quick runs): both arms report
    the noise in the same units, and both chose their learning rate the same way, each the best on
    the validation split (ties: the smaller)."""
    import pytest

    # like with like: both arms report the noise multiplier (std / sensitivity) and the std on C G
    assert out["noise_multiplier"] * out["sensitivity"] == pytest.approx(out["noise_std"], rel=1e-12)
    assert out["dpsgd_noise_multiplier"] == out["dpsgd_noise_std"] > 0   # DP-SGD: C = I, sensitivity 1
    assert "sigma" not in out and "dpsgd_sigma" not in out
    scores = out["validation_accuracy"]
    assert out["validation"] == validation and set(scores) == {"mfcli", "dpsgd"}
    for arm, key in (("mfcli", "lr"), ("dpsgd", "dpsgd_lr")):
        assert set(scores[arm]) == grid
        best = max(scores[arm].values())
        assert out[key] == min(float(r) for r, v in scores[arm].items() if v == best)
