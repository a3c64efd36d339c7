"""BLT as the structured kind ``blt``: artifact round trip, tampering, noise streams and adapters
(mfcli.strategies.structured), and ``mfcli optimize --strategy blt`` / ``inspect`` / ``account`` / ``compare
--buffers`` end to end. Oracles: C materialised here from theta and omega by the defining formula
c_t = sum_i omega_i theta_i^(t-1), numpy inverses at small n, dense sensitivities
(mfcli.model.participation.sensitivity on the dense C), Z straight from Philox, dp-accounting."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from structured_oracles import blt_coefs, blt_dense, dense_workload
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import (
    StructuredArtifact,
    dataset_sha256,
    load_any_artifact,
    load_structured_artifact,
    save_structured_artifact,
)
from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation, sensitivity
from mfcli.strategies.blt import optimize_blt
from mfcli.strategies.toeplitz import toeplitz_workload
from mfcli.training.noise import noise_stream

from noise_oracles import philox_z

N = 24
SEED = 7
runner = CliRunner()


@pytest.fixture(scope="module", params=[("prefix", SingleParticipation(), "max"),
                                        ("momentum", MinSeparation(separation=6), "mean"),
                                        ("prefix", FixedEpoch(epochs=3), "mean")],
                ids=["prefix-single", "momentum-minsep", "prefix-epochs"])
def saved(request, tmp_path_factory):
    name, schema, error = request.param
    w = toeplitz_workload(name, beta=0.9)
    blt = optimize_blt(n=N, buffers=3, workload=name, error=error, schema=schema).blt
    path = tmp_path_factory.mktemp("blt") / f"{name}.h5"
    save_structured_artifact(path, blt, workload=w, n=N,
                             participation=None if isinstance(schema, SingleParticipation) else schema)
    return path, blt, w, schema


def test_round_trip_recomputes_numbers_against_dense(saved):
    path, blt, w, schema = saved
    art = load_any_artifact(path)
    assert isinstance(art, StructuredArtifact) and art.kind == "blt"
    assert np.array_equal(art.strategy.theta, blt.theta) and np.array_equal(art.strategy.omega, blt.omega)
    c = blt_dense(blt.theta, blt.omega, N)
    b = dense_workload(w, N) @ np.linalg.inv(c)
    dense = sensitivity(c, schema)
    assert art.schema_sensitivity.value == pytest.approx(dense.value, rel=1e-10)
    assert art.schema_sensitivity.value >= dense.value * (1 - 1e-12)  # an upper bound, never below
    assert art.sensitivity.value == pytest.approx(np.linalg.norm(c, axis=0).max(), rel=1e-12)
    assert art.schema_loss.mean == pytest.approx(dense.value**2 * np.sum(b * b) / N, rel=1e-9)
    assert art.schema_loss.max == pytest.approx(dense.value**2 * np.max(np.sum(b * b, axis=1)), rel=1e-9)
    with h5py.File(path) as f:  # parameters only
        assert [k for k in f] == ["structured"]
        assert f["structured"].attrs["kind"] == "blt"
        assert sorted(f["structured"]) == ["omega", "theta"] and f["structured/theta"].shape == (3,)


def test_rational_form_is_the_inverse_of_c():
    blt = optimize_blt(n=2000, buffers=4, error="mean").blt
    num, den = blt.rational()
    assert num.shape == den.shape == (5,) and den[0] == 1.0
    import scipy.signal

    x = np.zeros(N)
    x[0] = 1.0
    inv = np.linalg.inv(blt_dense(blt.theta, blt.omega, N))
    assert np.allclose(scipy.signal.lfilter(num, den, x), inv[:, 0], atol=1e-12)
    # C(z) = den / num: the impulse response of den / num is c itself, at long horizons too
    x = np.zeros(2000)
    x[0] = 1.0
    assert np.allclose(scipy.signal.lfilter(den, num, x), blt_coefs(blt.theta, blt.omega, 2000), atol=1e-9)


def _rewrite(f, name, data):
    """Replace a parameter with a valid checksum, so that only the recomputation can catch it."""
    if name in f:
        del f[name]
    ds = f.create_dataset(name, data=np.asarray(data, dtype=np.float64))
    ds.attrs["sha256"] = dataset_sha256(ds[...])


@pytest.mark.parametrize("tamper,match", [
    (lambda f: f["structured/theta"].__setitem__(0, 0.5), "checksum mismatch"),
    (lambda f: _rewrite(f, "structured/omega", f["structured/omega"][...] * 1.01), "stored sensitivity"),
    (lambda f: _rewrite(f, "structured/theta", [0.2, 0.5, 1.0]), r"theta must be in \(-1, 1\)"),
    (lambda f: _rewrite(f, "structured/theta", [0.2, 0.5, 0.5]), "distinct"),
    (lambda f: _rewrite(f, "structured/theta", [0.2, 0.5]), "same length"),
    (lambda f: f.__delitem__("structured/omega"), "exactly theta and omega"),
    (lambda f: _rewrite(f, "structured/coefs", [1.0]), "exactly theta and omega"),
    (lambda f: f["structured"].attrs.__setitem__("kind", "banded-toeplitz"), r"exactly \['coefs'\]"),
    (lambda f: f["structured"].attrs.__setitem__("schema_loss_max", 1.0), "stored schema_loss_max"),
])
def test_tampered_blt_artifacts_are_refused(saved, tmp_path, tamper, match):
    path = tmp_path / "t.h5"
    path.write_bytes(saved[0].read_bytes())
    with h5py.File(path, "r+") as f:
        tamper(f)
    with pytest.raises(ArtifactError, match=match):
        load_structured_artifact(path)


@pytest.mark.parametrize("kind", ["gradient", "iterate"])
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-11), ("float32", 1e-5)])
def test_noise_stream_matches_dense_and_resumes(saved, kind, dtype, tol):
    path, blt, w, _ = saved
    d = 5
    stream = noise_stream(path, kind=kind, d=d, seed=SEED, dtype=dtype)
    assert stream.method == "recursion" and stream.variant == "structured"
    assert stream.memory_floats() <= (2 * blt.buffers + 3 + 1) * d  # O(buffers d), independent of n
    inv = np.linalg.inv(blt_dense(blt.theta, blt.omega, N))
    m = inv if kind == "gradient" else dense_workload(w, N) @ inv
    expected = m @ philox_z(SEED, N, d, dtype).astype(np.float64)
    state = stream.init()
    rows, checkpoint = [], None
    for t in range(N):
        row, state = stream.next(state)
        rows.append(row)
        if t == 9:
            checkpoint = stream.state_dict(state)
    got = np.array(rows, dtype=np.float64)
    assert np.max(np.abs(got - expected)) <= tol * np.max(np.abs(expected))
    with pytest.raises(MfcliError, match="exhausted"):
        stream.next(state)
    again = noise_stream(path, kind=kind, d=d, seed=SEED, dtype=dtype)
    resumed = again.load_state_dict(checkpoint)
    for t in range(10, N):
        row, resumed = again.next(resumed)
        assert np.array_equal(row, rows[t])


def test_torch_adapter_streams_blt_noise(saved):
    torch = pytest.importorskip("torch")
    from mfcli.adapters.torch import CorrelatedNoiseOptimizer

    path, blt, w, _ = saved
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2).double()  # d = 8
    theta0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy().copy()
    lr, sigma, clip = 0.1, 1.5, 0.5
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=lr, momentum=w.beta), artifact=path,
                                   seed=SEED, noise_std=sigma, clip_norm=clip)
    decoder = dense_workload(w, N) @ np.linalg.inv(blt_dense(blt.theta, blt.omega, N))
    want = theta0[None, :] - lr * sigma * clip * (decoder @ philox_z(SEED, N, 8, "float64"))
    for t in range(N):
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        got = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
        assert np.max(np.abs(got - want[t])) <= 1e-9 * np.max(np.abs(want - theta0))
    with pytest.raises(MfcliError, match="exhausted"):
        opt.step()


def test_optax_adapter_streams_blt_noise(saved):
    pytest.importorskip("optax")
    import jax.numpy as jnp

    from mfcli.adapters.optax import correlated_noise

    from noise_oracles import jax_z

    path, blt, _w, _ = saved
    stream = noise_stream(path, kind="gradient", d=4, seed=SEED, dtype="float32")
    tx = correlated_noise(stream, noise_std=1.0, clip_norm=1.0)
    params = {"w": jnp.zeros(4, dtype=jnp.float32)}
    state = tx.init(params)
    inv = np.linalg.inv(blt_dense(blt.theta, blt.omega, N))
    expected = inv @ jax_z(SEED, N, 4, "float32").astype(np.float64)   # the jax stream draws Z with jax.random
    for t in range(3):
        updates, state = tx.update({"w": jnp.zeros(4, dtype=jnp.float32)}, state, params)
        assert np.allclose(np.asarray(updates["w"], dtype=np.float64), expected[t], atol=1e-5)


# ---------------------------------------------------------------------------------------------
# CLI


def run(*args):
    return runner.invoke(app, list(args))


def test_cli_optimize_inspect_account_minsep(tmp_path):
    out = tmp_path / "m.h5"
    r = run("optimize", "--workload", "momentum", "--beta", "0.8", "--n", "48", "--strategy", "blt",
            "--buffers", "2", "--min-sep", "12", "-o", str(out), "--json", "-q")
    assert r.exit_code == 0, r.output
    js = json.loads(r.stdout)
    assert js["kind"] == "blt" and set(js["parameters"]) == {"theta", "omega"}
    c = blt_dense(js["parameters"]["theta"], js["parameters"]["omega"], 48)
    dense = sensitivity(c, MinSeparation(separation=12))
    assert js["sensitivity"] == pytest.approx(dense.value, rel=1e-10)
    b = dense_workload(toeplitz_workload("momentum", beta=0.8), 48) @ np.linalg.inv(c)
    assert js["loss"]["mean"] == pytest.approx(dense.value**2 * np.sum(b * b) / 48, rel=1e-9)
    r = run("inspect", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sensitivity"] == js["sensitivity"]
    r = run("account", str(out), "--sigma", "6", "--json")
    assert r.exit_code == 0, r.output
    acc = json.loads(r.stdout)
    dp_accounting = pytest.importorskip("dp_accounting")
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=6 / dense.value))
    assert acc["settings"]["deterministic"]["epsilon"] == pytest.approx(pld.get_epsilon(1e-6), rel=1e-3)


@pytest.mark.parametrize("args,match", [
    (["--n", "100", "--buffers", "0"], "buffers must be at least 1"),
    (["--n", "100", "--buffers", "33"], "at most 32"),
    (["--n", "3", "--buffers", "3"], "below the number of steps"),
    (["--n", "20000000", "--buffers", "4"], "at most"),
    (["--n", "100", "--buffers", "4", "--lr", "cooldown"], "not Toeplitz"),
    (["--n", "100", "--buffers", "4", "--workload", "custom"], "custom"),
    (["--n", "100"], "needs --buffers"),
    (["--n", "100", "--buffers", "4", "--bands", "4"], "--bands applies to --strategy banded-toeplitz"),
    (["--n", "100", "--buffers", "4", "--epochs", "3"], "not divisible"),
    (["--n", "100", "--buffers", "4", "--error", "median"], "--error must be mean or max"),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, args, match):
    out = tmp_path / "x.h5"
    r = run("optimize", "--strategy", "blt", *args, "-o", str(out))
    assert r.exit_code in (1, 2), r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_cli_buffers_needs_blt():
    r = run("optimize", "--n", "100", "--strategy", "banded-toeplitz", "--bands", "4", "--buffers", "2")
    assert r.exit_code == 2 and "--buffers applies to --strategy blt" in r.stderr
    r = run("optimize", "--n", "16", "--buffers", "2")
    assert r.exit_code == 2 and r.stderr.strip().startswith("error:") and "--buffers" in r.stderr


def test_cli_inspect_and_account_refuse_tampered_blt(tmp_path):
    out = tmp_path / "p.h5"
    assert run("optimize", "--n", "64", "--strategy", "blt", "--buffers", "2", "-o", str(out), "-q").exit_code == 0
    with h5py.File(out, "r+") as f:
        f["structured/omega"][0] = 0.9
    for args in (["inspect", str(out)], ["account", str(out), "--sigma", "3"]):
        r = run(*args)
        assert r.exit_code == 1
        assert r.stderr.strip().startswith("error:") and "checksum mismatch" in r.stderr and "Traceback" not in r.stderr


def test_compare_small_n_blt_rows_next_to_bands_and_optimum():
    r = run("compare", "--n", "128", "--bands", "4", "--buffers", "1", "--buffers", "3",
            "--strategies", "identity,optimal", "--format", "json", "-q")
    assert r.exit_code == 0, r.output
    rows = {s["name"]: s for s in json.loads(r.stdout)["strategies"]}
    assert {"blt-1", "blt-3", "banded-toeplitz-4", "optimal"} <= set(rows)
    opt = rows["optimal"]["loss_total"]
    # the certified optimum is a lower bound for every causal strategy; more buffers never hurt
    assert opt <= rows["blt-3"]["loss_total"] * (1 + 1e-6)
    assert rows["blt-3"]["loss_total"] <= rows["blt-1"]["loss_total"] * (1 + 1e-9)
    assert rows["blt-3"]["ratio_to_best_causal"] == pytest.approx(rows["blt-3"]["loss_total"] / opt, rel=1e-6)


def test_compare_large_n_blt_rows_without_dense_matrices():
    n = 10_000
    r = run("compare", "--n", str(n), "--buffers", "2", "--format", "json", "-q")
    assert r.exit_code == 0, r.output
    rows = {s["name"]: s for s in json.loads(r.stdout)["strategies"]}
    assert set(rows) == {"identity", "tree", "blt-2"}
    assert rows["identity"]["loss_total"] == pytest.approx(n * (n + 1) / 2, rel=1e-12)  # sum_t (t + 1)
    assert rows["blt-2"]["loss_total"] < rows["identity"]["loss_total"] / 100


def test_subprocess_n_1e5_optimize_inspect_account(tmp_path):
    n = 100_000
    out = tmp_path / "blt.h5"

    def mfcli(*args):
        proc = subprocess.run([sys.executable, "-m", "mfcli", *args], capture_output=True, text=True,
                              env=dict(os.environ), timeout=600)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    js = mfcli("optimize", "--workload", "prefix", "--n", str(n), "--strategy", "blt", "--buffers", "4",
               "--error", "max", "-o", str(out), "--json", "-q")
    assert os.path.getsize(out) < 100_000  # parameters, not an n x n matrix
    theta, omega = np.array(js["parameters"]["theta"]), np.array(js["parameters"]["omega"])
    c = blt_coefs(theta, omega, n)
    sens = float(np.linalg.norm(c))  # single participation: the first column is the longest
    assert js["sensitivity"] == pytest.approx(sens, rel=1e-10)
    # max error: ||B e_0||^2 with B's first column = prefix sums of C^-1's (a Toeplitz solve)
    import scipy.signal

    x = np.zeros(n)
    x[0] = 1.0
    beta = np.cumsum(scipy.signal.lfilter([1.0], c[:4000], x)[:4000])  # C^-1's tail decays fast
    assert js["loss"]["max"] >= sens**2 * float(beta @ beta) * (1 - 1e-9)
    # near-optimality gate of jax_privacy's tests at n = 10^4 (4 buffers), here at 10^5:
    assert np.sqrt(js["loss"]["max"]) <= 1.05 * (1 + np.log(n) / np.pi)
    ins = mfcli("inspect", str(out), "--json")
    assert ins["sensitivity"] == js["sensitivity"] and ins["loss"] == js["loss"]
    acc = mfcli("account", str(out), "--sigma", "4", "--json")
    dp_accounting = pytest.importorskip("dp_accounting")
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=4 / sens))
    assert acc["settings"]["single-pass"]["epsilon"] == pytest.approx(pld.get_epsilon(1e-6), rel=1e-3)


def test_blt_noise_stream_and_artifact_stream_are_bit_identical(saved):
    """A BLT in memory and its artifact give the same stream: rows, fingerprint, checkpoints."""
    from mfcli.training.noise import strategy_stream

    path, blt, _w, _ = saved
    own = strategy_stream(blt, n=N, seed=SEED, d=70_000, dtype="float32", threads=2)  # two Philox blocks
    stream = noise_stream(path, kind="gradient", d=70_000, seed=SEED, dtype="float32")
    assert own.fingerprint == stream.fingerprint and own.accounted_operator == stream.accounted_operator
    state, mine = stream.init(), own.init()
    for t in range(N):
        row, state = stream.next(state)
        other, mine = own.next(mine)
        assert np.array_equal(row, other)
        if t == N // 2:  # one checkpoint format: either stream resumes the other's
            assert own.load_state_dict(stream.state_dict(state)).t == t + 1
