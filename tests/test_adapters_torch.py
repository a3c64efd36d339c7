"""PyTorch adapter: torch's own SGD-with-momentum turns the gradient noise into B Z.

Oracle: with zero gradients, heavy-ball SGD (torch.optim.SGD, momentum beta, dampening 0) applies
the workload A to the noise it is given, so after step t the parameters are
theta_0 - lr * sigma * clip * (A C^-1 Z)[t] = theta_0 - lr * sigma * clip * (B Z)[t], with B (or
B^ for a compressed artifact) and Z built in this file, independently of mfcli.training.noise.
"""
from __future__ import annotations

import io

import h5py
import numpy as np
import pytest
import scipy.linalg

torch = pytest.importorskip("torch")

from mfcli.adapters.torch import CorrelatedNoiseOptimizer  # noqa: E402
from mfcli.errors import MfcliError  # noqa: E402
from mfcli.training.noise import noise_stream  # noqa: E402
from mfcli.training.smoothing import LaplacianSmoother, smoothing_matrix  # noqa: E402

from noise_oracles import philox_z, save_truncated_svd_compression, torch_z  # noqa: E402

SEED = 424242
BETA = 0.9
N = 16




@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """Momentum optimum with a compressed group (K = 3, R = 2: band plus truncated SVD)."""
    return save_truncated_svd_compression(tmp_path_factory.mktemp("torch") / "momentum.h5",
                                          n=N, beta=BETA, band=3, rank=2)


def model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).to(dtype)  # d = 11


def flat_params(m: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).double().numpy()


@pytest.mark.parametrize("variant", ["dense", "compressed"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_momentum_sgd_releases_decoder_noise(artifact, variant, dtype, tol):
    path, _a, fact, b_hat = artifact
    net = model(dtype)
    theta0 = flat_params(net)
    lr, sigma, clip = 0.05, 1.3, 0.7
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=lr, momentum=BETA),
                                   artifact=path, seed=SEED, noise_std=sigma, clip_norm=clip,
                                   variant=variant)
    d = theta0.size
    np_dtype = "float64" if dtype == torch.float64 else "float32"
    assert opt.stream.dtype == np.dtype(np_dtype) and opt.stream.d == d == 11
    z = philox_z(SEED, N, d, np_dtype).astype(np.float64)
    decoder = fact.decoder if variant == "dense" else b_hat
    want = theta0[None, :] - lr * sigma * clip * (decoder @ z)
    for t in range(N):
        opt.zero_grad()
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        err = np.max(np.abs(flat_params(net) - want[t])) / np.max(np.abs(want - theta0))
        assert err <= tol, f"step {t}: {err:.2e}"
    assert opt.steps_taken == N
    before = flat_params(net)
    with pytest.raises(MfcliError, match="exhausted"):
        opt.step()
    np.testing.assert_array_equal(flat_params(net), before)   # nothing applied past the end


@pytest.mark.parametrize("variant", ["dense", "compressed"])
def test_torch_generator_on_the_device_releases_decoder_noise(artifact, variant):
    """generator="torch": Z from a torch.Generator on the parameters' device (the default on an
    accelerator), the recursion on device tensors; the oracle draws that Z by the documented
    contract. Checkpoint/resume through state_dict continues bit-identically."""
    path, _a, fact, b_hat = artifact
    net = model(torch.float64)
    theta0 = flat_params(net)
    lr = 0.05
    make = lambda m: CorrelatedNoiseOptimizer(  # noqa: E731
        torch.optim.SGD(m.parameters(), lr=lr, momentum=BETA), artifact=path, seed=SEED, noise_std=1.0,
        clip_norm=1.0, variant=variant, generator="torch")
    opt = make(net)
    assert opt.generator == "torch-cpu"
    decoder = fact.decoder if variant == "dense" else b_hat
    want = theta0[None, :] - lr * (decoder @ torch_z(SEED, N, 11, "float64"))
    saved = None
    for t in range(N):
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        np.testing.assert_allclose(flat_params(net), want[t], rtol=0, atol=1e-10 * np.max(np.abs(want)))
        if t == 6:
            saved = (io.BytesIO(), [p.detach().clone() for p in net.parameters()])
            torch.save(opt.state_dict(), saved[0])
    net2 = model(torch.float64)
    with torch.no_grad():
        for p, q in zip(net2.parameters(), saved[1], strict=True):
            p.copy_(q)
    opt2 = make(net2)
    saved[0].seek(0)
    opt2.load_state_dict(torch.load(saved[0], weights_only=True))
    for _ in range(7, N):
        for p in net2.parameters():
            p.grad = torch.zeros_like(p)
        opt2.step()
    np.testing.assert_array_equal(flat_params(net2), flat_params(net))
    numpy_opt = CorrelatedNoiseOptimizer(torch.optim.SGD(model(torch.float64).parameters(), lr=lr), artifact=path,
                                         seed=SEED, noise_std=1.0, clip_norm=1.0, variant=variant,
                                         generator="numpy")
    with pytest.raises(MfcliError, match="generator"):   # a torch-generator checkpoint is not a numpy one
        numpy_opt.load_state_dict({"optimizer": numpy_opt.optimizer.state_dict(), "noise": opt.state_dict()["noise"]})
    with pytest.raises(MfcliError, match="generator must be one of"):
        CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=lr), artifact=path, seed=SEED,
                                 noise_std=1.0, clip_norm=1.0, generator="cuda")


def test_noise_is_added_to_the_gradient(artifact):
    path, _a, fact, _ = artifact
    net = model(torch.float64)
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.0), check_workload=False, artifact=path, seed=SEED,
                                   noise_std=2.0, clip_norm=0.5, batch_size=4, variant="dense")
    g = [torch.full_like(p, 0.25) for p in net.parameters()]
    z = philox_z(SEED, N, 11, "float64")
    grad_noise = scipy.linalg.solve_triangular(fact.strategy, z, lower=True)  # C^-1 Z
    for t in range(3):
        for p, gi in zip(net.parameters(), g, strict=True):
            p.grad = gi.clone()
        opt.step()
        got = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy()
        np.testing.assert_allclose(got, 0.25 + 2.0 * 0.5 / 4 * grad_noise[t], rtol=0, atol=1e-12)


def test_parameter_without_grad_still_gets_noise(artifact):
    path, _, fact, _ = artifact
    net = model(torch.float64)
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.0), check_workload=False, artifact=path, seed=1,
                                   noise_std=1.0, clip_norm=1.0, variant="dense")
    opt.zero_grad()
    opt.step()
    got = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy()
    want = scipy.linalg.solve_triangular(fact.strategy, philox_z(1, N, 11, "float64"), lower=True)[0]
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_postprocess_hook_sees_the_flat_noisy_gradient(artifact):
    path, _, fact, _ = artifact
    net = model(torch.float64)
    smoother = LaplacianSmoother(0.7)
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.0), check_workload=False, artifact=path, seed=3,
                                   noise_std=1.0, clip_norm=1.0, variant="dense", postprocess=smoother)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    noisy = 1.0 + scipy.linalg.solve_triangular(fact.strategy, philox_z(3, N, 11, "float64"), lower=True)[0]
    want = np.linalg.solve(smoothing_matrix(11, s=0.7), noisy)   # dense solve of (I - s L) u = v
    got = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy()
    np.testing.assert_allclose(got, want, atol=1e-12)
    bad = CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=0.0), check_workload=False, artifact=path, seed=3,
                                   noise_std=1.0, clip_norm=1.0, postprocess=lambda x: x[:3])
    with pytest.raises(MfcliError, match="postprocess must return"):
        bad.step()


@pytest.mark.parametrize("variant", ["dense", "compressed"])
def test_checkpoint_resume_is_identical(artifact, variant):
    path = artifact[0]

    def make(net):
        return CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA),
                                        artifact=path, seed=SEED, noise_std=1.0, clip_norm=1.0,
                                        variant=variant)

    def train(net, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            loss = net(torch.ones(4, 3)).pow(2).sum()
            loss.backward()
            opt.step()

    ref_net = model()
    ref = make(ref_net)
    train(ref_net, ref, N)

    net = model()
    opt = make(net)
    train(net, opt, 6)
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)      # plain tensors and values only
    net2 = model()
    net2.load_state_dict(ckpt["model"])
    opt2 = make(net2)
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.steps_taken == 6
    train(net2, opt2, N - 6)
    np.testing.assert_array_equal(flat_params(net2), flat_params(ref_net))


def test_checkpoint_with_another_seed_is_refused(artifact):
    path = artifact[0]
    net = model()
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), artifact=path, seed=1,
                                   noise_std=1.0, clip_norm=1.0)
    other = CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=0.1, momentum=BETA), artifact=path, seed=2,
                                     noise_std=1.0, clip_norm=1.0)
    with pytest.raises(MfcliError, match="different seed"):
        other.load_state_dict(opt.state_dict())
    with pytest.raises(MfcliError, match="needs 'optimizer' and 'noise'"):
        other.load_state_dict({"optimizer": {}})


@pytest.mark.parametrize(
    "edit",
    [
        lambda n: n.update(running=torch.zeros_like(n["running"])),
        lambda n: n.update(t=n["t"] - 1),
        lambda n: n.update(tag="0" * 64),
    ],
    ids=["running-zeroed", "step-changed", "tag-zeroed"],
)
def test_edited_checkpoint_is_refused(artifact, edit):
    """A saved checkpoint with its running sums zeroed or its step moved fails its HMAC tag."""
    path = artifact[0]
    net = model()
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), artifact=path, seed=1,
                                   noise_std=1.0, clip_norm=1.0)
    assert opt.stream.rank > 0
    for _ in range(9):
        opt.zero_grad()
        net(torch.ones(4, 3)).pow(2).sum().backward()
        opt.step()
    assert torch.count_nonzero(opt.state_dict()["noise"]["running"]) > 0
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    edit(ckpt["noise"])
    fresh = CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=0.1, momentum=BETA), artifact=path,
                                     seed=1, noise_std=1.0, clip_norm=1.0)
    with pytest.raises(MfcliError, match="authentication tag"):
        fresh.load_state_dict(ckpt)
    assert fresh.steps_taken == 0


@pytest.mark.parametrize("variant", ["auto", "dense"])
def test_accounted_operator_is_what_account_uses(artifact, variant):
    from mfcli.services.account import resolve_strategy

    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), artifact=artifact[0], seed=1,
                                   noise_std=1.0, clip_norm=1.0, variant=variant, check_workload=False)
    inp = resolve_strategy(artifact[0], operator=variant)
    assert opt.accounted_operator == inp.operator
    assert opt.sensitivity == pytest.approx(float(np.sqrt(np.max(np.sum(inp.strategy**2, axis=0)))), rel=1e-9)


def test_bad_construction(artifact):
    path = artifact[0]
    params = list(model().parameters())
    sgd = torch.optim.SGD(params, lr=0.1, momentum=BETA)
    common = {"noise_std": 1.0, "clip_norm": 1.0}
    with pytest.raises(MfcliError, match="kind='gradient'"):
        CorrelatedNoiseOptimizer(sgd, stream=noise_stream(path, kind="iterate", d=11, seed=1), **common)
    with pytest.raises(MfcliError, match="d = 12 but the optimizer has 11"):
        CorrelatedNoiseOptimizer(sgd, stream=noise_stream(path, kind="gradient", d=12, seed=1), **common)
    with pytest.raises(MfcliError, match="artifact= and seed="):
        CorrelatedNoiseOptimizer(sgd, artifact=path, **common)
    with pytest.raises(MfcliError, match="noise_std"):
        CorrelatedNoiseOptimizer(sgd, artifact=path, seed=1, noise_std=-1.0, clip_norm=1.0)
    with pytest.raises(MfcliError, match="batch_size"):
        CorrelatedNoiseOptimizer(sgd, artifact=path, seed=1, batch_size=0, **common)
    with pytest.raises(MfcliError, match=r"torch\.optim\.Optimizer"):
        CorrelatedNoiseOptimizer(object(), artifact=path, seed=1, **common)
    with pytest.raises(MfcliError, match="seed"):
        CorrelatedNoiseOptimizer(sgd, artifact=path, seed=-5, **common)


def test_workload_mismatch_warns(artifact):
    path = artifact[0]
    with pytest.warns(UserWarning, match="momentum=0.5"):
        CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=0.1, momentum=0.5),
                                 artifact=path, seed=1, noise_std=1.0, clip_norm=1.0)


def test_sensitivity_and_scale_exposed(artifact):
    path = artifact[0]
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=0.1, momentum=BETA),
                                   artifact=path, seed=1, noise_std=2.0, clip_norm=3.0,
                                   batch_size=2, variant="compressed")
    with h5py.File(path) as f:
        assert opt.sensitivity == pytest.approx(f["compressed"].attrs["sensitivity"], rel=1e-9)
    assert opt.noise_scale == pytest.approx(3.0)
    assert opt.n == N


def run_doc_example(name: str, where) -> dict:
    """Execute the ``# example: <name>`` python block of docs/noise-streams.md in ``where``."""
    import os
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parent.parent / "docs" / "noise-streams.md"
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
              if b.startswith(f"# example: {name}\n")]
    assert len(blocks) == 1
    namespace: dict = {"__name__": f"doc_example_{name}"}
    cwd = os.getcwd()
    os.chdir(where)
    try:
        exec(compile(blocks[0], f"{doc}:{name}", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace


def test_doc_example_torch(tmp_path):
    ns = run_doc_example("torch", tmp_path)
    assert ns["opt"].steps_taken == ns["opt"].n == 256
    ckpt = torch.load(tmp_path / "opt.pt", weights_only=True)
    assert int(ckpt["noise"]["t"]) == 256
    assert all(torch.isfinite(p).all() for p in ns["model"].parameters())


# ---------------------------------------------------------------------------------------------
# torch.optim conventions: schedulers, hooks, zero_grad, the whole training state


def _cosine(t: int, lr0: float, t_max: int, eta_min: float) -> float:
    return eta_min + (lr0 - eta_min) * (1 + np.cos(np.pi * t / t_max)) / 2


SCHEDULES = {
    "step": (lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5), lambda t: 0.2 * 0.5 ** (t // 3)),
    "cosine": (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=N, eta_min=0.01),
               lambda t: _cosine(t, 0.2, N, 0.01)),
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.filterwarnings("error")     # e.g. torch's "lr_scheduler.step() before optimizer.step()"
def test_lr_schedulers_drive_the_inner_learning_rate(artifact, schedule):
    """Zero gradients, plain SGD: theta_t = theta_0 - sigma clip sum_{s <= t} lr_s (C^-1 Z)[s], with
    lr_s in closed form; the scheduler sees a torch.optim.Optimizer and sets the inner lr."""
    path, _, fact, _ = artifact
    net = model(torch.float64)
    theta0 = flat_params(net)
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.2), artifact=path, seed=SEED,
                                   noise_std=1.5, clip_norm=0.5, variant="dense", check_workload=False)
    assert isinstance(opt, torch.optim.Optimizer)
    make, lr_of = SCHEDULES[schedule]
    sched = make(opt)
    grad_noise = scipy.linalg.solve_triangular(fact.strategy, philox_z(SEED, N, 11, "float64"), lower=True)
    want = theta0.copy()
    for t in range(N):
        assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(lr_of(t), rel=1e-12, abs=1e-15)
        opt.zero_grad()
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        sched.step()
        want -= lr_of(t) * 1.5 * 0.5 * grad_noise[t]
        np.testing.assert_allclose(flat_params(net), want, rtol=0, atol=1e-12)


def test_resume_with_a_scheduler_is_bit_identical(artifact):
    path = artifact[0]

    def make(net):
        opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), artifact=path,
                                       seed=SEED, noise_std=1.0, clip_norm=1.0, variant="compressed")
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=N)

    def train(net, opt, sched, steps):
        for _ in range(steps):
            opt.zero_grad()
            net(torch.ones(4, 3)).pow(2).sum().backward()
            opt.step()
            sched.step()

    ref_net = model()
    train(ref_net, *make(ref_net), N)
    net = model()
    opt, sched = make(net)
    train(net, opt, sched, 7)
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    net2 = model()
    net2.load_state_dict(ckpt["model"])
    opt2, sched2 = make(net2)
    opt2.load_state_dict(ckpt["opt"])
    sched2.load_state_dict(ckpt["sched"])
    assert opt2.steps_taken == 7 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    train(net2, opt2, sched2, N - 7)
    np.testing.assert_array_equal(flat_params(net2), flat_params(ref_net))


@pytest.mark.parametrize("set_to_none", [True, False, None])
def test_zero_grad_follows_torch(artifact, set_to_none):
    """Default and True: .grad becomes None; False: the same tensors, zeroed in place. The next
    step adds the same noise row either way."""
    path, _, fact, _ = artifact
    net = model(torch.float64)
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.0), artifact=path, seed=SEED,
                                   noise_std=1.0, clip_norm=1.0, variant="dense", check_workload=False)
    net(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    before = [p.grad for p in net.parameters()]
    opt.zero_grad() if set_to_none is None else opt.zero_grad(set_to_none=set_to_none)
    if set_to_none is False:
        for p, g in zip(net.parameters(), before, strict=True):
            assert p.grad is g and torch.count_nonzero(g) == 0
    else:
        assert all(p.grad is None for p in net.parameters())
    opt.step()
    got = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy()
    want = scipy.linalg.solve_triangular(fact.strategy, philox_z(SEED, N, 11, "float64"), lower=True)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_step_hooks_run_around_each_step(artifact):
    net = model()
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), artifact=artifact[0],
                                   seed=1, noise_std=1.0, clip_norm=1.0)
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", o.steps_taken)))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", o.steps_taken)))
    for _ in range(2):
        opt.zero_grad()
        opt.step()
    assert calls == [("pre", 0), ("post", 1), ("pre", 1), ("post", 2)]


def test_parameters_added_after_construction_are_refused(artifact):
    """A parameter the noise rows do not cover would train without noise."""
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA)
    opt = CorrelatedNoiseOptimizer(inner, artifact=artifact[0], seed=1, noise_std=1.0, clip_norm=1.0)
    extra = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(MfcliError, match="cannot add a parameter group"):
        opt.add_param_group({"params": [extra]})
    inner.add_param_group({"params": [extra]})
    extra.grad = torch.zeros(2)
    with pytest.raises(MfcliError, match="parameters changed"):
        opt.step()
    assert opt.steps_taken == 0 and torch.equal(extra.grad, torch.zeros(2))


def test_wrapping_a_noising_optimizer_is_refused(artifact):
    path = artifact[0]
    inner = CorrelatedNoiseOptimizer(torch.optim.SGD(model().parameters(), lr=0.1, momentum=BETA), artifact=path,
                                     seed=1, noise_std=1.0, clip_norm=1.0)
    with pytest.raises(MfcliError, match="added twice"):
        CorrelatedNoiseOptimizer(inner, artifact=path, seed=2, noise_std=1.0, clip_norm=1.0)
