"""Opacus bridge: Opacus clips and Poisson-samples, mfcli adds the correlated noise and accounts it.

Oracles, built here independently of mfcli.training.noise: Z from Philox (tests/noise_oracles.py), C^-1 Z
by a triangular solve and B Z by a product with the matrices read from the artifact; the clipped
sum by an explicit per-example loop; the sampling rate by counting the loader's batches; the
epsilon against ``mfcli account`` run on the same artifact with the rate the loader reports.
"""
from __future__ import annotations

import io
import json

import h5py
import numpy as np
import pytest
import scipy.linalg

torch = pytest.importorskip("torch")
opacus = pytest.importorskip("opacus")
pytest.importorskip("sklearn")   # the digits (scikit-learn comes with the study extra's mlxtend)

from opacus import PrivacyEngine  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from mfcli.adapters.opacus import SUPPORTED_OPACUS, CorrelatedNoiseDPOptimizer, make_private  # noqa: E402
from mfcli.adapters.torch import CorrelatedNoiseOptimizer  # noqa: E402
from mfcli.cli.app import app  # noqa: E402
from mfcli.errors import MfcliError  # noqa: E402
from mfcli.io.artifact import save_artifact  # noqa: E402
from mfcli.model.workloads import momentum_workload  # noqa: E402
from mfcli.optimize.dense import optimal_factorization  # noqa: E402

from noise_oracles import philox_z, save_truncated_svd_compression  # noqa: E402

SEED = 77
BETA = 0.9
N = 32

pytestmark = pytest.mark.filterwarnings(
    # Opacus's own notices, about its noise RNG (unused here) and about inputs without gradients.
    "ignore:Secure RNG turned off:UserWarning",
    "ignore:Full backward hook is firing:UserWarning",
    "ignore:Optimal order is the:UserWarning",
)


def test_installed_opacus_is_a_supported_one():
    assert opacus.__version__ in SUPPORTED_OPACUS


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """A dense momentum optimum over N steps (what ``mfcli optimize --workload momentum`` writes)."""
    path = tmp_path_factory.mktemp("opacus") / "momentum.h5"
    fact = optimal_factorization(momentum_workload(N, beta=BETA).matrix, tol=1e-9).factorization
    save_artifact(path, fact, workload_name="momentum", workload_params={"beta": BETA, "lr": "constant"},
                  strategy_name="optimal")
    with h5py.File(path) as f:
        return path, np.asarray(f["strategy"]), np.asarray(f["decoder"])


def digits(n_train: int = 600):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.long)
    return TensorDataset(x[:n_train], y[:n_train]), x[1400:], y[1400:]


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def flat(m: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).double().numpy()


def loader(dataset, batch_size=40):
    return DataLoader(dataset, batch_size=batch_size, generator=torch.Generator().manual_seed(3))


def batches(dl):
    while True:
        yield from dl


def train(model, optimizer, dl, steps):
    loss_fn = torch.nn.CrossEntropyLoss()
    it = batches(dl)
    for _ in range(steps):
        x, y = next(it)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward() if len(y) else (model(torch.zeros(0, 64)).sum() * 0).backward()
        optimizer.step()


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


# ---------------------------------------------------------------------------------------------
# the supported path


def test_momentum_sgd_releases_decoder_noise(artifact):
    """Zero gradients: the parameters after step t are theta_0 - lr sigma clip / E[B] (B Z)[t]."""
    path, _c, b = artifact
    data, _, _ = digits(200)
    net = mlp()
    theta0 = flat(net)
    lr, sigma, clip = 0.05, 1.7, 0.6
    model, opt, dl = make_private(net, torch.optim.SGD(net.parameters(), lr=lr, momentum=BETA), loader(data),
                                  artifact=path, seed=SEED, noise_std=sigma, clip_norm=clip)
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt, DPOptimizer)
    assert opt.expected_batch_size == 200 * 1 // 5 and opt.sample_rate == pytest.approx(1 / 5)
    z = philox_z(SEED, N, theta0.size, "float32").astype(np.float64)
    want = theta0[None, :] - lr * sigma * clip / opt.expected_batch_size * (b @ z)
    it = batches(dl)
    for t in range(N):
        x, _ = next(it)
        opt.zero_grad()
        (model(x).sum() * 0.0).backward()
        opt.step()
        err = np.max(np.abs(flat(net) - want[t])) / np.max(np.abs(want - theta0))
        assert err <= 2e-5, f"step {t}: {err:.2e}"
    assert opt.steps_taken == N
    before = flat(net)
    x, _ = next(it)
    opt.zero_grad()
    (model(x).sum() * 0.0).backward()
    with pytest.raises(MfcliError, match="exhausted"):
        opt.step()
    np.testing.assert_array_equal(flat(net), before)


def test_gradient_is_clipped_sum_plus_correlated_noise(artifact):
    """loss_reduction='sum': .grad = sum_i clip_i(g_i) + sigma clip (C^-1 Z)[t], per-example loop."""
    path, c, _b = artifact
    data, _, _ = digits(120)
    net = mlp()
    sigma, clip = 0.8, 0.3
    model, opt, dl = make_private(net, torch.optim.SGD(net.parameters(), lr=0.0), dl_in := loader(data, 30),
                                  artifact=path, seed=SEED, noise_std=sigma, clip_norm=clip,
                                  loss_reduction="sum", sampling=1 / len(dl_in))
    grad_noise = scipy.linalg.solve_triangular(c, philox_z(SEED, N, flat(net).size, "float32").astype(np.float64), lower=True)
    ref = mlp()
    it = batches(dl)
    for t in range(3):
        x, y = next(it)
        want = np.zeros_like(flat(net))
        for i in range(len(y)):       # the clipped sum, one example at a time
            ref.zero_grad()
            torch.nn.functional.cross_entropy(ref(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
            g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()]).double().numpy()
            want += g * min(1.0, clip / (np.linalg.norm(g) + 1e-6))
        want += sigma * clip * grad_noise[t]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
        opt.step()
        got = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).double().numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, np.max(np.abs(want))))


def test_huge_sigma_destroys_training_and_the_wrong_order_raises(artifact):
    """The noise really lands: sigma = 1e6 leaves digits at chance, a tiny sigma learns them; the
    order that lost all noise (mfcli around a noising Opacus optimizer, issue 15) is refused."""
    path = artifact[0]
    data, x_test, y_test = digits()
    acc = {}
    for sigma in (1e-3, 1e6):
        net = mlp()
        model, opt, dl = make_private(net, torch.optim.SGD(net.parameters(), lr=0.5, momentum=BETA), loader(data),
                                      artifact=path, seed=SEED, noise_std=sigma, clip_norm=1.0)
        train(model, opt, dl, N)
        acc[sigma] = accuracy(model, x_test, y_test)
    assert acc[1e-3] >= 0.6, acc          # 0.79 measured at 32 steps
    assert acc[1e6] <= 0.3, acc          # 10 classes: chance is about 0.1

    net = mlp()
    model, dp_opt, dl = PrivacyEngine().make_private(module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
                                                     data_loader=loader(data), noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(MfcliError, match=r"overwrites \.grad.*silently lost.*make_private"):
        CorrelatedNoiseOptimizer(dp_opt, artifact=path, seed=SEED, noise_std=1e6, clip_norm=1.0)
    dp_opt.noise_multiplier = 0.0    # even without Opacus noise the order drops mfcli's noise
    with pytest.raises(MfcliError, match="silently lost"):
        CorrelatedNoiseOptimizer(dp_opt, artifact=path, seed=SEED, noise_std=1e6, clip_norm=1.0)


def test_privacy_engine_optimizer_without_noise_is_accepted(artifact):
    """PrivacyEngine.make_private(noise_multiplier=0) output carries mfcli's noise once converted."""
    path = artifact[0]
    data, _, _ = digits(200)
    net = mlp()
    model, dp_opt, dl = PrivacyEngine().make_private(module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.0),
                                                     data_loader=loader(data), noise_multiplier=0.0, max_grad_norm=0.5)
    model2, opt, dl2 = make_private(model, dp_opt, dl, artifact=path, seed=SEED, noise_std=2.0, clip_norm=0.5)
    assert model2 is model and dl2 is dl and opt.original_optimizer is dp_opt.original_optimizer
    x, _ = next(iter(dl2))
    opt.zero_grad()
    (model2(x).sum() * 0.0).backward()
    opt.step()
    got = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).double().numpy()
    z = philox_z(SEED, N, got.size, "float32").astype(np.float64)
    want = 2.0 * 0.5 / opt.expected_batch_size * scipy.linalg.solve_triangular(artifact[1], z, lower=True)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.max(np.abs(want)))


# ---------------------------------------------------------------------------------------------
# accounting


def test_epsilon_is_mfcli_accounts_at_the_loaders_rate(artifact):
    path, c, _ = artifact
    data, _, _ = digits(300)
    net = mlp()
    _, opt, dl = make_private(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), loader(data, 50),
                              artifact=path, seed=SEED, noise_std=3.0, clip_norm=1.0)
    assert opt.sample_rate == 1 / 6 == dl.sample_rate
    # The rate is the sampler's: count inclusions over many Poisson batches (binomial, 6 sd).
    sizes = [len(y) for _, (_, y) in zip(range(400), batches(dl), strict=False)]
    mean = np.mean(sizes) / 300
    assert abs(mean - 1 / 6) <= 6 * np.sqrt((1 / 6) * (5 / 6) / 300 / 400)
    # The accounted matrix is the artifact's C as stored (the dense operator that runs).
    np.testing.assert_array_equal(opt.accounted.strategy, c)
    eps = opt.epsilon(delta=1e-6)
    r = CliRunner().invoke(app, ["account", str(path), "--sigma", "3", "--sampling", repr(opt.sample_rate),
                                 "--delta", "1e-6", "--json", "-q"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["settings"]["mmcc"]
    assert eps == row["epsilon"]
    rep = opt.account(delta=1e-6).mmcc
    assert rep is not None and rep.lower.epsilon <= eps <= rep.full.epsilon


def test_attaching_an_opacus_accountant_is_refused(artifact):
    data, _, _ = digits(100)
    net = mlp()
    _, opt, dl = make_private(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), loader(data),
                              artifact=artifact[0], seed=SEED, noise_std=3.0, clip_norm=1.0)
    acc = opacus.accountants.RDPAccountant()
    with pytest.raises(MfcliError, match=r"independent Gaussian noise.*optimizer\.epsilon"):
        opt.attach_step_hook(acc.get_optimizer_hook_fn(sample_rate=dl.sample_rate))


# ---------------------------------------------------------------------------------------------
# refusals


def _dp_optimizer(net, **kw):
    args = {"noise_multiplier": 0.0, "max_grad_norm": 1.0, "expected_batch_size": 40} | kw
    return DPOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), **args)


@pytest.mark.parametrize(
    "case,match",
    [
        ("noising-dp-optimizer", r"own independent noise \(noise_multiplier=1.0\)"),
        ("clip-mismatch", r"max_grad_norm=2.0 but clip_norm=1.0"),
        ("reduction-mismatch", "loss_reduction='sum' but 'mean'"),
        ("batch-mismatch", r"expected_batch_size=10.*expected batch is 40"),
        ("sampling-mismatch", r"probability 0.2 per step.*sampling=0.1"),
        ("per-layer-optimizer", "DPPerLayerOptimizer"),
        ("mfcli-optimizer", "another CorrelatedNoiseOptimizer"),
        ("not-a-loader", "must be a torch DataLoader"),
        ("sigma-zero", "sigma"),
        ("batchnorm-model", "per-example gradients"),
        ("foreign-parameters", "not the module's"),
    ],
)
def test_wrong_combinations_are_refused(artifact, case, match):
    path = artifact[0]
    data, _, _ = digits(200)
    net = mlp()
    module, dl, kw = net, loader(data), {"noise_std": 1.0, "clip_norm": 1.0}
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA)
    if case == "noising-dp-optimizer":
        opt = _dp_optimizer(net, noise_multiplier=1.0)
    elif case == "clip-mismatch":
        opt = _dp_optimizer(net, max_grad_norm=2.0)
    elif case == "reduction-mismatch":
        opt = _dp_optimizer(net, loss_reduction="sum")
    elif case == "batch-mismatch":
        opt = _dp_optimizer(net, expected_batch_size=10)
    elif case == "sampling-mismatch":
        kw["sampling"] = 0.1
    elif case == "per-layer-optimizer":
        opt = opacus.optimizers.DPPerLayerOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), noise_multiplier=0.0,
                                                    max_grad_norm=[1.0] * 4, expected_batch_size=40)
    elif case == "mfcli-optimizer":
        opt = CorrelatedNoiseOptimizer(opt, artifact=path, seed=SEED, noise_std=1.0, clip_norm=1.0)
    elif case == "not-a-loader":
        dl = list(dl)
    elif case == "sigma-zero":
        kw["noise_std"] = 0.0
    elif case == "batchnorm-model":
        module = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 10))
        opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=BETA)
    elif case == "foreign-parameters":
        opt = torch.optim.SGD(mlp().parameters(), lr=0.1, momentum=BETA)
    with pytest.raises(MfcliError, match=match):
        make_private(module, opt, dl, artifact=path, seed=SEED, **kw)
    assert not hasattr(module, "autograd_grad_sample_hooks")   # the caller's model is left unwrapped


def test_compressed_operator_with_negative_entries_is_refused(tmp_path):
    """MMCC needs C >= 0; a compressed C^ = B^-1 A with a negative entry cannot be accounted."""
    path, a, _fact, b_hat = save_truncated_svd_compression(tmp_path / "c.h5", n=16, beta=BETA, band=3, rank=2)
    c_hat = scipy.linalg.solve_triangular(b_hat, a, lower=True)
    assert c_hat.min() < 0
    data, _, _ = digits(100)
    net = mlp()
    with pytest.raises(MfcliError, match=r"accounted by MMCC.*compressed.*variant='dense'"):
        make_private(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), loader(data),
                     artifact=path, seed=SEED, noise_std=1.0, clip_norm=1.0)
    _, opt, _ = make_private(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=BETA), loader(data),
                             artifact=path, seed=SEED, noise_std=1.0, clip_norm=1.0, variant="dense")
    assert isinstance(opt, CorrelatedNoiseDPOptimizer) and opt.accounted.operator == "dense"


def test_checkpoint_resume_is_identical(artifact):
    """state_dict holds the inner optimizer and the noise position; resume gives the same weights."""
    path = artifact[0]
    data, _, _ = digits(200)

    def build():
        net = mlp()
        return (net, *make_private(net, torch.optim.SGD(net.parameters(), lr=0.3, momentum=BETA), loader(data),
                                   artifact=path, seed=SEED, noise_std=1.0, clip_norm=1.0))

    fixed = next(iter(loader(data)))   # one fixed batch: the Poisson loader's randomness is not under test

    def steps(model, opt, k):
        for _ in range(k):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(fixed[0]), fixed[1]).backward()
            opt.step()

    ref_net, ref_model, ref_opt, _ = build()
    steps(ref_model, ref_opt, 10)
    net, model, opt, _ = build()
    steps(model, opt, 4)
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    net2, model2, opt2, _ = build()
    net2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.steps_taken == 4
    steps(model2, opt2, 6)
    np.testing.assert_array_equal(flat(net2), flat(ref_net))
    with pytest.raises(MfcliError, match="needs 'optimizer' and 'noise'"):
        opt2.load_state_dict(ckpt["opt"]["optimizer"])

