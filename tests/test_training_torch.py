"""mfcli.training.torch and mfcli.training.record: record-driven private training in PyTorch.

Independent derivations: the clipped gradient against a hand loop of per-example ``backward``
calls; the epsilons against dp-accounting composed here (DP-SGD) and the analytic Gaussian
mechanism solved here with scipy (deterministic participation of C = I: sensitivity sqrt(epochs));
the DataLoader's batches against the definitions of the samplers (binomial acceptance region,
exact partition); a 2-process data-parallel run against the single-process run.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binom, norm
from training_cases import make_arts, prefix_artifact
from training_torch_cases import Indexed, _model, _setup

from mfcli.errors import MfcliError
from mfcli.training.record import training_record
from mfcli.training.torch import make_private, make_private_with_epsilon

F = torch.nn.functional


@pytest.fixture(scope="module")
def arts(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    return make_arts(tmp_path_factory.mktemp("training"))


# ---------------------------------------------------------------------------------------------
# clipping


def test_clipping_matches_a_hand_loop_of_per_example_gradients(arts) -> None:
    model, opt, loader = _setup(arts, "poisson", clip_norm=1.07)
    reference = _model()   # same initial weights
    x, y = next(iter(loader))
    assert len(y) > 3
    opt.zero_grad()
    losses = opt.clipped_backward(x, y)
    total = [torch.zeros_like(p) for p in reference.parameters()]
    clipped = 0
    for i in range(len(y)):
        reference.zero_grad()
        loss = F.cross_entropy(reference(x[i:i + 1]), y[i:i + 1])
        loss.backward()
        assert losses[i].item() == pytest.approx(loss.item(), rel=1e-12)
        g = [p.grad.clone() for p in reference.parameters()]
        nrm = math.sqrt(sum(float((gi * gi).sum()) for gi in g))
        scale = min(1.0, 1.07 / nrm)
        clipped += scale < 1
        for t, gi in zip(total, g, strict=True):
            t += scale * gi
    assert 0 < clipped < len(y)   # the table has both cases
    for p, t in zip(model.parameters(), total, strict=True):
        torch.testing.assert_close(p.grad, t / opt.expected_batch_size, rtol=1e-10, atol=1e-12)
    assert opt.expected_batch_size == 20   # 40 examples at rate 0.5


def test_chunked_per_example_gradients_equal_one_pass(arts) -> None:
    _, a, loader = _setup(arts, "poisson")
    _, b, _ = _setup(arts, "poisson", max_physical_batch_size=3)
    x, y = next(iter(loader))
    for o in (a, b):
        o.zero_grad()
        o.clipped_backward(x, y)
    for p, q in zip(a._params, b._params, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-14)


def test_step_refuses_gradients_clipped_backward_did_not_produce(arts) -> None:
    model, opt, loader = _setup(arts, "poisson")
    x, y = next(iter(loader))
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(MfcliError, match="not produced by clipped_backward"):
        opt.step()
    opt.zero_grad()
    opt.clipped_backward(x, y)
    F.cross_entropy(model(x), y).backward()   # accumulates unclipped gradients on top
    with pytest.raises(MfcliError, match="not produced by clipped_backward"):
        opt.step()
    opt.zero_grad()
    opt.clipped_backward(x, y)
    opt.step()
    assert opt.steps_taken == 1
    with pytest.raises(MfcliError, match="not produced by clipped_backward"):
        opt.step()   # the same gradients twice


# ---------------------------------------------------------------------------------------------
# the DataLoader draws the record's batches


def test_loader_yields_the_record_samplers_batches_and_an_empty_batch_is_a_step(arts) -> None:
    for kind in arts:
        _, opt, loader = _setup(arts, kind, examples=7)
        ds = loader.dataset
        got = list(loader)
        assert len(got) == len(loader) == opt.record.n == 6
        for t, (x, y) in enumerate(got):
            idx = opt.sampler.batch(t)
            torch.testing.assert_close(x, ds.x[idx]) if len(idx) else None
            assert x.shape == (len(idx), 3) and y.shape == (len(idx),)


def test_poisson_batches_have_the_records_rate(arts) -> None:
    """Total batch size over the 6 steps is Binomial(6 N, 0.5): inside its two-sided 1e-6 region."""
    n_ex = 500
    _, opt, loader = _setup(arts, "poisson", examples=n_ex)
    total = sum(len(y) for _, y in loader)
    lo, hi = binom.ppf(5e-7, 6 * n_ex, 0.5), binom.isf(5e-7, 6 * n_ex, 0.5)
    assert lo <= total <= hi
    assert opt.record.sampler == "poisson" and opt.sampler.rate == 0.5


def test_fixed_order_batches_partition_the_data_every_epoch(arts) -> None:
    _, opt, _ = _setup(arts, "fixed-order", examples=31)
    idx = [opt.sampler.batch(t) for t in range(6)]
    for e in range(3):
        epoch = np.concatenate(idx[2 * e:2 * e + 2])
        assert sorted(epoch.tolist()) == list(range(31))   # each example exactly once per epoch
    assert [i.tolist() for i in idx[:2]] == [i.tolist() for i in idx[2:4]] == [i.tolist() for i in idx[4:]]
    assert opt.record.period == 2 and opt.record.epochs() == 3


def test_cyclic_batches_stay_in_their_group(arts) -> None:
    _, opt, loader = _setup(arts, "cyclic", examples=60)
    groups = opt.sampler.group_of()
    for t, _batch in enumerate(loader):
        members = opt.sampler.batch(t)
        assert set(groups[members].tolist()) <= {t % 2}


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(arts, tmp_path: Path) -> None:
    """The loader starts at the optimizer's next step, so after load_state_dict the batches and
    the noise rows resume together."""
    def run(stop: int | None, state: dict | None = None) -> tuple[list, dict]:
        model, opt, loader = _setup(arts, "fixed-order", examples=30, seed=5)
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        assert len(loader) == 6 - opt.steps_taken
        for x, y in loader:
            if stop is not None and opt.steps_taken == stop:
                break
            opt.zero_grad()
            opt.clipped_backward(x, y)
            opt.step()
        return [p.detach().clone() for p in model.parameters()], {"model": model.state_dict(), "opt": opt.state_dict()}

    whole, _ = run(None)
    _, half = run(3)
    torch.save(half, tmp_path / "ckpt.pt")
    resumed, _ = run(None, torch.load(tmp_path / "ckpt.pt", weights_only=True))
    for a, b in zip(whole, resumed, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize("kind, kw, msg", [
    ("poisson", {"noise_std": 1.0}, r"noise_std=1.0 but accounting record .* accounts noise std 2.0"),
    ("poisson", {"noise_multiplier": 1.0}, r"noise_multiplier=1.0 but accounting record .* accounts noise multiplier 2.0"),
    # fixed order, C = I, 3 epochs: std 2, sensitivity sqrt(3); 0.2's noise_multiplier=std is refused
    ("fixed-order", {"noise_multiplier": 2.0}, r"noise_multiplier=2.0 but .* accounts noise multiplier 1.1547"),
    ("fixed-order", {"noise_std": 2.0, "noise_multiplier": 2 / 3 ** 0.5}, r"pass noise_std= or noise_multiplier=, not both"),
    ("poisson", {"sample_rate": 0.25}, r"sample_rate=0.25 but .* accounts rate 0.5"),
    ("poisson", {"batch_size": 10}, r"batch_size=10 over 40 examples is Poisson rate 0.25, but .* rate 0.5"),
    ("poisson", {"sampler": "cyclic"}, r"sampler='cyclic' but .* accounts the poisson batch sampler"),
    ("cyclic", {"batch_size": 5}, r"batch_size=5 over 40 examples in 2 groups is rate 0.25 .* rate 0.5"),
    ("fixed-order", {"batch_size": 5}, r"batch_size=5 over 40 examples makes 8 batches per pass, but .* 2"),
    ("fixed-order", {"sample_rate": 0.5}, r"accounts fixed-order batches, which have no sampling rate"),
    ("poisson", {"clip_norm": 0.0}, r"clip_norm must be a positive finite number"),
    ("poisson", {"seed": -1}, r"seed"),
])
def test_refusals(arts, kind: str, kw: dict, msg: str) -> None:
    with pytest.raises(MfcliError, match=msg):
        _setup(arts, kind, **kw)


def test_declarations_that_agree_are_accepted(arts) -> None:
    _setup(arts, "poisson", noise_multiplier=2.0, sample_rate=0.5, batch_size=20, sampler="poisson")
    _setup(arts, "poisson", noise_std=2.0)
    _setup(arts, "fixed-order", batch_size=20, noise_std=2.0)
    _setup(arts, "fixed-order", noise_multiplier=2.0 / 3 ** 0.5)   # std / sqrt(3 epochs)
    _setup(arts, "cyclic", batch_size=10)


def test_wiring_refusals(arts, tmp_path: Path) -> None:
    path, _ = arts["poisson"]
    model = _model()
    with pytest.raises(MfcliError, match="exactly the module's trainable parameters"):
        make_private(model, torch.optim.SGD(list(model.parameters())[:2], lr=0.1), Indexed(10), artifact=path,
                     seed=1, clip_norm=1.0, loss_fn=F.cross_entropy)
    bn = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(MfcliError, match="batch norm, which mixes the examples"):
        make_private(bn, torch.optim.SGD(bn.parameters(), lr=0.1), Indexed(10), artifact=path, seed=1, clip_norm=1.0,
                     loss_fn=F.cross_entropy)
    _, opt, _ = _setup(arts, "poisson")
    with pytest.raises(MfcliError, match="cannot add a parameter group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    with pytest.raises(MfcliError, match="has no accounting record 'nope'"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), Indexed(10), artifact=path, record="nope",
                     seed=1, clip_norm=1.0, loss_fn=F.cross_entropy)
    bare = prefix_artifact(tmp_path / "bare.h5", np.eye(4), "identity")
    with pytest.raises(MfcliError, match="has no accounting record; write one"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), Indexed(10), artifact=bare, seed=1,
                     clip_norm=1.0, loss_fn=F.cross_entropy)


def test_a_tampered_record_is_refused(arts, tmp_path: Path) -> None:
    """An epsilon edited below what its stored event gives fails verification before training."""
    import shutil

    src, rid = arts["poisson"]
    path = tmp_path / "tampered.h5"
    shutil.copy(src, path)
    with h5py.File(path, "r+") as f:
        f[f"accounting/{rid}"].attrs["epsilon_dp_sgd"] = 0.5
    with pytest.raises(MfcliError, match=r"does not verify against the artifact it sits in.*dp-sgd: stored epsilon 0.5 is below"):
        make_private(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), Indexed(10), artifact=path,
                     seed=1, clip_norm=1.0, loss_fn=F.cross_entropy)


# ---------------------------------------------------------------------------------------------
# epsilon


def _dpsgd_truth(sigma: float, q: float, steps: int, delta: float) -> float:
    import dp_accounting

    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(delta))


def _analytic_gaussian(mu: float, delta: float) -> float:
    """Balle-Wang: the smallest eps with Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) <= delta."""
    def excess(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta
    return brentq(excess, 0.0, 100.0, xtol=1e-12)


def test_epsilon_is_the_verified_records_and_dp_accountings_for_dpsgd(arts) -> None:
    path, rid = arts["poisson"]
    _, opt, _ = _setup(arts, "poisson")
    with h5py.File(path, "r") as f:
        stored = float(f[f"accounting/{rid}"].attrs["epsilon_dp_sgd"])
    assert opt.epsilon() == stored == opt.epsilon(1e-5)
    per = opt.epsilon_per_epoch()
    truths = [_dpsgd_truth(2.0, 0.5, 2 * e, 1e-5) for e in (1, 2, 3)]
    assert len(per) == 3 and per[-1] == stored
    for got, truth in zip(per, truths, strict=True):
        assert got is not None and truth * (1 - 1e-3) <= got <= truth * 1.02   # both PLD upper bounds
    assert per[0] < per[1] < per[2]
    with pytest.raises(MfcliError, match="holds for delta = 1e-05, not 1e-06; re-account"):
        opt.epsilon(1e-6)


def test_deterministic_epsilon_per_epoch_is_the_analytic_gaussian(arts) -> None:
    """C = I, 3 epochs of 2 steps: after e epochs the sensitivity is sqrt(e), the mechanism a
    Gaussian with mu = sqrt(e) / sigma."""
    _, opt, _ = _setup(arts, "fixed-order")
    per = opt.epsilon_per_epoch()
    assert opt.record.setting == "deterministic"
    for e, got in enumerate(per, start=1):
        truth = _analytic_gaussian(math.sqrt(e) / 2.0, 1e-5)
        assert got is not None and truth <= got <= truth * (1 + 1e-6) + 1e-9
    assert per[-1] == opt.epsilon()


def test_epsilon_per_epoch_reads_the_operator_once_and_keeps_nothing(arts, monkeypatch) -> None:
    """The per-epoch accounting reads the artifact once for all its epochs (it read it once per
    epoch and setting), and the record keeps no operator between calls (a training run holds the
    record for its whole length; a dense C is n x n)."""
    import mfcli.io.artifact as artifact_io

    _, opt, _ = _setup(arts, "fixed-order")
    reads: list[object] = []
    real = artifact_io.load_any_artifact

    def counted(*args: object, **kwargs: object) -> object:
        reads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(artifact_io, "load_any_artifact", counted)
    per = opt.epsilon_per_epoch()
    assert len(per) == 3 and all(e is not None for e in per) and per[-1] == opt.epsilon()
    assert len(reads) == 1
    assert not any(isinstance(v, np.ndarray) and v.size > 1 for v in vars(opt.record).values())


def test_a_tree_record_calibrated_to_the_shuffled_tree_trains_in_fixed_order(tmp_path: Path) -> None:
    """`account --setting shuffled-tree` without a sampler reports the tree's single-epoch Gaussian
    bound as its guarantee; the trainer holds the same row (it refused the record: no row held)."""
    from typer.testing import CliRunner

    from mfcli.cli.app import app

    path = tmp_path / "tree.h5"
    runner = CliRunner()
    r = runner.invoke(app, ["compare", "--n", "37", "--strategies", "tree", "--save-strategy", "tree", "--out", str(path),
                            "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["account", str(path), "--epsilon", "2", "--setting", "shuffled-tree", "--write", "--json",
                            "-q"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)["report"]
    rec = training_record(path)
    assert rec.sampler == "fixed-order" and rec.setting == "shuffled-tree"
    assert rec.epsilon == report["epsilon"] <= 2.0


# ---------------------------------------------------------------------------------------------
# make_private_with_epsilon: plan's library path


def test_make_private_with_epsilon_plans_writes_and_trains(tmp_path: Path) -> None:
    path = tmp_path / "planned.h5"
    model = _model()
    model, opt, loader = make_private_with_epsilon(
        model, torch.optim.SGD(model.parameters(), lr=0.1), Indexed(40), epsilon=4.0, delta=1e-5, epochs=2,
        batch_size=10, artifact=path, seed=9, clip_norm=1.0, loss_fn=F.cross_entropy, batching=["fixed-order"],
        bands=[2])
    rec = training_record(path)   # written with its record, which verifies
    assert rec.record == opt.record.record and rec.sampler == "fixed-order" and rec.n == 8
    assert opt.epsilon() == rec.epsilon <= 4.0
    assert opt.record.sigma == pytest.approx(opt.plan.recommended.sigma, rel=1e-12)
    for x, y in loader:
        opt.zero_grad()
        opt.clipped_backward(x, y)
        opt.step()
    assert opt.steps_taken == 8
    with pytest.raises(MfcliError, match="exists"):
        make_private_with_epsilon(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), Indexed(40),
                                  epsilon=4.0, delta=1e-5, epochs=2, batch_size=10, artifact=path, seed=9,
                                  clip_norm=1.0, loss_fn=F.cross_entropy, batching=["fixed-order"], bands=[2])


def test_workload_comes_from_the_optimizer() -> None:
    from mfcli.training.torch import workload_of

    p = [torch.nn.Parameter(torch.zeros(2))]
    assert workload_of(torch.optim.SGD(p, lr=0.1)) == ("prefix", 0.9)
    assert workload_of(torch.optim.SGD(p, lr=0.1, momentum=0.8)) == ("momentum", 0.8)
    with pytest.raises(MfcliError, match="cannot tell which workload a Adam computes"):
        workload_of(torch.optim.Adam(p))


# ---------------------------------------------------------------------------------------------
# data parallel


def _train(path: Path, rid: str, steps_out: Path, rank: int = 0) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.0)
    model, opt, loader = make_private(model, opt, Indexed(50), artifact=path, record=rid, seed=11, clip_norm=0.5,
                                      loss_fn=F.cross_entropy, verify=rank == 0)
    sizes = []
    for x, y in loader:
        sizes.append(len(y))
        opt.zero_grad()
        opt.clipped_backward(x, y)
        opt.step()
    torch.save({"params": [p.detach() for p in model.parameters()], "sizes": sizes}, steps_out)


def _ddp_worker(rank: int, world: int, init: str, path: str, rid: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        _train(Path(path), rid, Path(out) / f"rank{rank}.pt", rank)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("kind", ["poisson", "fixed-order"])
def test_two_process_data_parallel_equals_one_process(arts, tmp_path: Path, kind: str) -> None:
    import torch.multiprocessing as mp

    path, rid = arts[kind]
    _train(path, rid, tmp_path / "single.pt")
    mp.spawn(_ddp_worker, args=(2, f"file://{tmp_path / 'rendezvous'}", str(path), rid, str(tmp_path)), nprocs=2,
             join=True)
    single = torch.load(tmp_path / "single.pt")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # the ranks' shares add up to the accounted batches
    assert [a + b for a, b in zip(ranks[0]["sizes"], ranks[1]["sizes"], strict=True)] == single["sizes"]
    assert sum(single["sizes"]) > 0
    for r in ranks:
        for p, q in zip(r["params"], single["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
    start = [p.detach() for p in _model().parameters()]
    moved = sum(float((p - q).abs().sum()) for p, q in zip(single["params"], start, strict=True))
    assert moved > 0
