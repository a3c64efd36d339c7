"""Noise units (issue 27 item 4): ``noise_std`` (the std of the noise on C G per unit clip norm,
what 0.2's ``noise_multiplier=`` meant) and ``noise_multiplier`` (noise_std / the accounted
sensitivity, as Opacus and jax_privacy count it), in TrainingRecord and every adapter.

Independent derivations: the sensitivity each record divides by is recomputed here from the dense
C of small n (the largest column norm for a sampled record; for a fixed-order record the largest
sum of |C^T C| over the rows and columns of one example's steps, brute force over the examples of
the fixed period, exact here since C^T C >= 0). The noise actually added is measured on zero
gradients: at step 0 (C^-1 Z)[0] = Z[0] / C[0, 0] with C[0, 0] = 1, so the added vector of
d = 20000 entries has sample standard deviation within 3% of the expected std
(multiplier x sensitivity), which separates the two readings of 0.2's argument (they differ by a
factor of the sensitivity: 1.118 for the cyclic record, 2.208 for the banded fixed-order one).
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from training_cases import _record, make_arts, prefix_artifact

from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch
from mfcli.training.record import NO_RECORD_MULTIPLIER, resolve_noise_std, training_record

D = 20000
SEED = 7
BAND = np.eye(6) + 0.5 * np.eye(6, k=-1) + 0.25 * np.eye(6, k=-2)


@pytest.fixture(scope="module")
def arts(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    d = tmp_path_factory.mktemp("units")
    out = make_arts(d)
    banded = prefix_artifact(d / "band6f.h5", BAND, "banded3")
    out["banded-fixed"] = (banded, _record(banded, sigma=3.0, settings=["deterministic"], schema=FixedEpoch(epochs=3)))
    return out


def independent_sensitivity(kind: str) -> float:
    """From the dense C: largest column norm (sampled records) or the fixed-order brute force."""
    c = {"poisson": np.eye(6), "cyclic": np.eye(6) + 0.5 * np.eye(6, k=-1), "fixed-order": np.eye(6),
         "banded-fixed": BAND}[kind]
    if kind in ("poisson", "cyclic"):
        return float(np.sqrt((c * c).sum(axis=0)).max())
    x = np.abs(c.T @ c)
    period = 2   # 3 epochs of n = 6 steps: example j takes part at steps j, j + 2, j + 4
    best = 0.0
    for j in range(period):
        steps = list(range(j, 6, period))
        best = max(best, sum(x[a, b] for a, b in itertools.product(steps, steps)))
    return math.sqrt(best)


@pytest.mark.parametrize("kind, std", [("poisson", 2.0), ("cyclic", 2.0), ("fixed-order", 2.0),
                                       ("banded-fixed", 3.0)])
def test_record_noise_std_multiplier_and_sensitivity(arts, kind: str, std: float) -> None:
    rec = training_record(*arts[kind])
    sens = independent_sensitivity(kind)
    assert rec.noise_std == rec.sigma == std
    assert rec.sensitivity == pytest.approx(sens, rel=1e-12)
    assert rec.noise_multiplier == pytest.approx(std / sens, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# the table: (record, arguments) -> refused, or the noise std actually added


def _cases():
    # each: id, record kind (None: no record), kwargs builder(sens, std) -> kwargs, refusal regex or None
    return [
        ("std-no-record", None, lambda s, x: {"noise_std": 1.5}, None),
        ("multiplier-no-record", None, lambda s, x: {"noise_multiplier": 1.5}, "known only from a verified accounting"),
        ("neither-no-record", None, lambda s, x: {}, r"pass noise_std= .* or an accounting record"),
        ("both-no-record", None, lambda s, x: {"noise_std": 1.5, "noise_multiplier": 1.5}, "not both"),
        ("record-alone", "banded-fixed", lambda s, x: {}, None),
        ("record-std", "banded-fixed", lambda s, x: {"noise_std": x}, None),
        ("record-multiplier", "banded-fixed", lambda s, x: {"noise_multiplier": x / s}, None),
        # 0.2's call with a record: the std passed as the multiplier is refused, not reinterpreted
        ("record-0.2-style", "banded-fixed", lambda s, x: {"noise_multiplier": x}, r"accounts noise multiplier"),
        ("record-other-std", "banded-fixed", lambda s, x: {"noise_std": x / s}, r"accounts noise std 3.0"),
        ("record-both", "banded-fixed", lambda s, x: {"noise_std": x, "noise_multiplier": x / s}, "not both"),
        ("cyclic-multiplier", "cyclic", lambda s, x: {"noise_multiplier": x / s}, None),
        ("cyclic-0.2-style", "cyclic", lambda s, x: {"noise_multiplier": x}, r"accounts noise multiplier"),
    ]


CASES = _cases()


def _expected(arts, kind: str | None) -> tuple[object, float, float]:
    """(record, independent sensitivity, record std) for a case; no record: (None, nan, 1.5)."""
    if kind is None:
        return None, math.nan, 1.5
    rec = training_record(*arts[kind])
    return rec, independent_sensitivity(kind), rec.noise_std


@pytest.mark.parametrize("case, kind, make, refusal", CASES, ids=[c[0] for c in CASES])
def test_resolve_noise_std_table(arts, case, kind, make, refusal) -> None:
    rec, sens, std = _expected(arts, kind)
    kw = make(sens, std)
    if refusal:
        with pytest.raises(MfcliError, match=refusal):
            resolve_noise_std(record=rec, **kw)
    else:
        assert resolve_noise_std(record=rec, **kw) == pytest.approx(std, rel=1e-12)


def _measured_std(noise: np.ndarray) -> float:
    return float(np.std(noise))


@pytest.mark.parametrize("case, kind, make, refusal", CASES, ids=[c[0] for c in CASES])
def test_torch_optimizer_adds_the_resolved_std(arts, case, kind, make, refusal) -> None:
    torch = pytest.importorskip("torch")
    from mfcli.adapters.torch import CorrelatedNoiseOptimizer

    rec, sens, std = _expected(arts, kind)
    kw = make(sens, std)
    w = torch.nn.Parameter(torch.zeros(D, dtype=torch.float64))
    where = {"record": rec} if rec is not None else {"artifact": arts["cyclic"][0]}

    def build():
        return CorrelatedNoiseOptimizer(torch.optim.SGD([w], lr=1.0), seed=SEED, clip_norm=1.0, **where, **kw)

    if refusal:
        with pytest.raises(MfcliError, match=refusal):
            build()
        return
    opt = build()
    assert opt.noise_std == pytest.approx(std, rel=1e-12)
    if rec is None:
        assert opt.noise_multiplier is None
    else:
        assert opt.noise_multiplier == pytest.approx(std / sens, rel=1e-12)
    opt.zero_grad()
    opt.step()   # zero gradient: w = -(noise std) * (C^-1 Z)[0], and C[0, 0] = 1
    added = -w.detach().numpy()
    assert _measured_std(added) == pytest.approx(std, rel=0.03)


def test_record_and_artifact_together_are_refused(arts) -> None:
    torch = pytest.importorskip("torch")
    from mfcli.adapters.torch import CorrelatedNoiseOptimizer

    rec = training_record(*arts["cyclic"])
    w = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(MfcliError, match="pass record= or artifact=, not both"):
        CorrelatedNoiseOptimizer(torch.optim.SGD([w], lr=1.0), record=rec, artifact=arts["cyclic"][0], seed=1,
                                 clip_norm=1.0)


@pytest.mark.parametrize("case, kind, make, refusal", CASES, ids=[c[0] for c in CASES])
def test_optax_transformation_adds_the_resolved_std(arts, case, kind, make, refusal) -> None:
    pytest.importorskip("optax")
    import jax.numpy as jnp

    from mfcli.adapters.optax import correlated_noise
    from mfcli.training.noise import noise_stream
    from mfcli.training.record import record_stream

    rec, sens, std = _expected(arts, kind)
    kw = make(sens, std)
    stream = record_stream(rec, d=D, seed=SEED) if rec is not None else \
        noise_stream(arts["cyclic"][0], kind="gradient", d=D, seed=SEED)
    if refusal:
        with pytest.raises(MfcliError, match=refusal):
            correlated_noise(stream, record=rec, clip_norm=1.0, **kw)
        return
    tx = correlated_noise(stream, record=rec, clip_norm=1.0, **kw)
    zeros = jnp.zeros(D, dtype=jnp.float32)
    noise, _ = tx.update(zeros, tx.init(zeros))
    assert _measured_std(np.asarray(noise, dtype=np.float64)) == pytest.approx(std, rel=0.03)


def test_the_no_record_refusal_is_one_line_naming_noise_std() -> None:
    assert "\n" not in NO_RECORD_MULTIPLIER and "noise_std=" in NO_RECORD_MULTIPLIER


@pytest.mark.parametrize("kw, refusal", [
    ({"noise_multiplier": 2.0 / math.sqrt(3)}, None),   # fixed order, C = I, 3 epochs: std 2 / sqrt(3)
    ({"noise_std": 2.0}, None),
    ({"noise_multiplier": 2.0}, r"accounts noise multiplier 1.1547"),   # 0.2's call, std as the multiplier
])
def test_opacus_bridge_with_a_record(arts, kw: dict, refusal: str | None) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("opacus")
    from torch.utils.data import DataLoader
    from training_torch_cases import Indexed, _model

    from mfcli.adapters.opacus import make_private

    path, rid = arts["fixed-order"]
    model = _model()

    def build():
        return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(Indexed(40), batch_size=20),
                            artifact=path, record=rid, seed=3, clip_norm=0.5, **kw)

    if refusal:
        with pytest.raises(MfcliError, match=refusal):
            build()
        return
    _, opt, _ = build()
    assert opt.noise_std == 2.0
    assert opt.noise_multiplier == pytest.approx(2.0 / math.sqrt(3), rel=1e-12)
