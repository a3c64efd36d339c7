"""The Opacus bridge under an accounting record (mfcli.adapters.opacus.make_private(record=...)).

Independent derivation: Opacus clips per example (GradSampleModule hooks) and mfcli's torch.func
path clips by vmap(grad); the two noisy gradients of one step agree (to Opacus's 1e-6 guard in
its clip factor). Batches are checked against the record's sampler drawn separately."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("opacus")

from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader
from training_cases import make_arts
from training_torch_cases import Indexed, _model, _setup

from mfcli.adapters.opacus import make_private
from mfcli.errors import MfcliError
from mfcli.training.record import build_sampler, training_record

F = torch.nn.functional
pytestmark = [pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning"),
              pytest.mark.filterwarnings("ignore:Secure RNG turned off:UserWarning")]


@pytest.fixture(scope="module")
def arts(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    return make_arts(tmp_path_factory.mktemp("training-opacus"))


def _bridge(arts, kind: str, examples: int = 40, batch: int | None = None, **kw):
    path, rid = arts[kind]
    model = _model()
    kw.setdefault("seed", 3)
    kw.setdefault("clip_norm", 0.5)
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(Indexed(examples), batch_size=batch),
                        artifact=path, record=rid, **kw)


@pytest.mark.parametrize("kind", ["poisson", "cyclic", "fixed-order"])
def test_record_selects_sampler_sigma_and_epsilon(arts, kind: str) -> None:
    path, rid = arts[kind]
    _, opt, loader = _bridge(arts, kind)
    rec = training_record(path, rid)
    expect = build_sampler(rec, examples=40, seed=3)
    ds = loader.dataset
    batches = list(loader)
    assert len(batches) == rec.n == opt.n
    for t, (x, _y) in enumerate(batches):
        idx = expect.batch(t)
        assert x.shape[0] == len(idx)
        if len(idx):
            torch.testing.assert_close(x, ds.x[idx])
    assert opt.noise_std == rec.noise_std == rec.sigma
    assert opt.noise_multiplier == rec.noise_multiplier
    assert opt.epsilon() == rec.epsilon
    per = opt.epsilon_per_epoch()
    # cyclic: 2 groups at rate 0.5 pass over the data in 4 steps, which do not divide n = 6
    assert per == [] if kind == "cyclic" else per[-1] == rec.epsilon
    with pytest.raises(MfcliError, match="its epsilon is the record's"):
        opt.account()


def test_opacus_and_torch_func_clip_to_the_same_noisy_gradient(arts) -> None:
    """One step of each path from the same weights, batch and seed: (clipped sum + noise) / B."""
    gs, dp_opt, loader = _bridge(arts, "fixed-order")
    _, mine, loader2 = _setup(arts, "fixed-order")
    x, y = next(iter(loader))
    x2, y2 = next(iter(loader2))
    assert torch.equal(x, x2)
    dp_opt.zero_grad()
    F.cross_entropy(gs(x), y, reduction="mean").backward()
    dp_opt.step()
    mine.zero_grad()
    mine.clipped_backward(x2, y2)
    ref = [p.grad.clone() for p in mine._params]
    mine.step()   # adds the noise to .grad in place, then the inner step
    got = [p.grad for p in dp_opt.params]
    for a, b in zip(got, [p.grad for p in mine._params], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert any(float((a - r).abs().max()) > 1e-3 for a, r in zip(got, ref, strict=True))   # the noise is there


@pytest.mark.parametrize("kind, loader_kw, kw, msg", [
    ("poisson", {}, {"noise_multiplier": 1.0}, r"noise_multiplier=1.0 but .* accounts noise multiplier 2.0"),
    ("poisson", {}, {"noise_std": 1.0}, r"noise_std=1.0 but .* accounts noise std 2.0"),
    ("fixed-order", {"batch": 20}, {"noise_multiplier": 2.0}, r"noise_multiplier=2.0 but .* noise multiplier 1.1547"),
    ("poisson", {"batch": 10}, {}, r"batch_size=10 over 40 examples is Poisson rate 0.25, but .* rate 0.5"),
    ("fixed-order", {"batch": 5}, {}, r"makes 8 batches per pass, but .* 2 \(fixed-order\)"),
    ("cyclic", {}, {"sampling": 0.25}, r"sample_rate=0.25 but .* accounts rate 0.5"),
    ("poisson", {}, {"variant": "dense"}, r"record= trains the operator the record accounted"),
])
def test_mismatched_wiring_is_refused(arts, kind: str, loader_kw: dict, kw: dict, msg: str) -> None:
    with pytest.raises(MfcliError, match=msg):
        _bridge(arts, kind, **loader_kw, **kw)


def test_a_poisson_loader_with_a_non_poisson_record_is_refused(arts) -> None:
    path, rid = arts["fixed-order"]
    model = _model()
    dl = DPDataLoader.from_data_loader(DataLoader(Indexed(40), batch_size=20))
    with pytest.raises(MfcliError, match=r"Poisson DPDataLoader, but accounting record .* accounts fixed-order"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), dl, artifact=path, record=rid, seed=1,
                     clip_norm=1.0)


def test_add_param_group_after_the_bridge_is_refused(arts) -> None:
    _, opt, _ = _bridge(arts, "poisson")
    with pytest.raises(MfcliError, match=r"cannot add a parameter group after mfcli.adapters.opacus.make_private"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    path, _ = arts["poisson"]
    model = _model()
    _, plain, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(Indexed(40), batch_size=20),
                               artifact=path, seed=1, noise_std=2.0, clip_norm=1.0)
    with pytest.raises(MfcliError, match="cannot add a parameter group"):
        plain.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})


@pytest.mark.parametrize("kw, msg", [
    ({}, r"pass noise_std= .* or an accounting record \(record=\)"),
    # 0.2's noise_multiplier= (the std) is refused without a record, never reinterpreted
    ({"noise_multiplier": 2.0}, r"noise_multiplier= is the noise std divided by the sensitivity .* pass noise_std="),
    ({"noise_std": 2.0, "noise_multiplier": 2.0}, r"not both"),
])
def test_without_record_the_noise_std_is_required(arts, kw: dict, msg: str) -> None:
    path, _ = arts["poisson"]
    model = _model()
    with pytest.raises(MfcliError, match=msg):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(Indexed(40), batch_size=20),
                     artifact=path, seed=1, clip_norm=1.0, **kw)
