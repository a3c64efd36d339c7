"""Structured artifacts, operators and noise streams (mfcli.strategies.structured) against dense oracles:
numpy inverses of the materialised C at small n, Z drawn straight from Philox, and tampering."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
from structured_oracles import dense_workload

from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import (
    StructuredArtifact,
    load_any_artifact,
    load_artifact,
    load_structured_artifact,
    save_structured_artifact,
)
from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation, sensitivity
from mfcli.strategies.operators import select_operator
from mfcli.strategies.toeplitz import BandedToeplitz, materialize, optimize_banded_toeplitz, toeplitz_workload
from mfcli.training.noise import noise_stream

from noise_oracles import philox_z

N = 24
SEED = 99


@pytest.fixture(scope="module", params=[("prefix", SingleParticipation()), ("momentum", MinSeparation(separation=6)),
                                        ("momentum", FixedEpoch(epochs=3))], ids=["prefix", "momentum-minsep", "momentum-epochs"])
def saved(request, tmp_path_factory):
    name, schema = request.param
    w = toeplitz_workload(name, beta=0.9)
    strat = optimize_banded_toeplitz(N, 4, workload=w, schema=schema).strategy
    path = tmp_path_factory.mktemp("structured") / f"{name}.h5"
    save_structured_artifact(path, strat, workload=w, n=N,
                             participation=None if isinstance(schema, SingleParticipation) else schema)
    return path, strat, w, schema


def test_artifact_round_trip_recomputes_numbers_against_dense(saved):
    path, strat, w, schema = saved
    art = load_any_artifact(path)
    assert isinstance(art, StructuredArtifact)
    assert np.array_equal(art.strategy.coefs, strat.coefs) and art.n == N and art.participation == schema
    c = materialize(strat.coefs, N)
    a = dense_workload(w, N)
    b = a @ np.linalg.inv(c)
    dense = sensitivity(c, schema)
    assert art.schema_sensitivity.value == pytest.approx(dense.value, rel=1e-12)
    assert art.sensitivity.value == pytest.approx(np.linalg.norm(c, axis=0).max(), rel=1e-12)
    assert art.schema_loss.mean == pytest.approx(dense.value**2 * np.sum(b * b) / N, rel=1e-10)
    assert art.schema_loss.max == pytest.approx(dense.value**2 * np.max(np.sum(b * b, axis=1)), rel=1e-10)
    with h5py.File(path) as f:  # parameters only, never an n x n matrix
        assert [k for k in f] == ["structured"]
        assert f["structured"].attrs["kind"] == "banded-toeplitz"
        assert f["structured/coefs"].shape == (4,)


def test_regular_loader_refuses_with_one_line(saved):
    path = saved[0]
    with pytest.raises(ArtifactError, match="no 'workload' dataset"):
        load_artifact(path)


@pytest.mark.parametrize("tamper,match", [
    (lambda f: f["structured/coefs"].__setitem__(1, 0.123), "checksum mismatch"),
    (lambda f: f.attrs.__setitem__("loss_mean", 1.0), "stored loss_mean"),
    (lambda f: f["structured"].attrs.__setitem__("schema_sensitivity", 9.0), "stored schema_sensitivity"),
    (lambda f: f["structured"].attrs.__setitem__("kind", "blt-ish"), "structured kind must be one of"),
    (lambda f: f.attrs.__setitem__("n", 10**9), "n must be at most"),
    (lambda f: f.attrs.__setitem__("workload_name", "custom"), "custom"),
    (lambda f: f.attrs.__setitem__("workload_params", '{"lr": "cooldown"}'), "not Toeplitz"),
    (lambda f: f.create_dataset("structured/extra", data=np.ones(2)), "no sha256|exactly"),
])
def test_tampered_artifacts_are_refused(saved, tmp_path, tamper, match):
    path = tmp_path / "t.h5"
    path.write_bytes(saved[0].read_bytes())
    with h5py.File(path, "r+") as f:
        tamper(f)
    with pytest.raises(ArtifactError, match=match):
        load_structured_artifact(path)


def test_select_operator_and_dense_limit(saved, tmp_path):
    path, strat, w, _ = saved
    art = load_any_artifact(path)
    op = select_operator(art)
    assert op.variant == "structured" and op.n == N
    fact = op.factorization
    assert np.allclose(fact.decoder @ fact.strategy, dense_workload(w, N), atol=1e-10)
    with pytest.raises(MfcliError, match="compressed"):
        select_operator(art, "compressed")
    big = tmp_path / "big.h5"
    save_structured_artifact(big, strat, workload=w, n=100_000)
    with pytest.raises(MfcliError, match="n <= 8192 only"):
        select_operator(load_any_artifact(big)).dense()


@pytest.mark.parametrize("kind", ["gradient", "iterate"])
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_noise_stream_matches_dense_operator_and_resumes(saved, kind, dtype, tol):
    path, strat, w, _ = saved
    d = 9
    stream = noise_stream(path, kind=kind, d=d, seed=SEED, dtype=dtype)
    assert stream.method == "recursion" and stream.variant == "structured"
    assert stream.memory_floats() <= (strat.bands + 3 + 1) * d  # O(b d), independent of n
    c = materialize(strat.coefs, N)
    m = np.linalg.inv(c) if kind == "gradient" else dense_workload(w, N) @ np.linalg.inv(c)
    expected = m @ philox_z(SEED, N, d, dtype).astype(np.float64)
    state = stream.init()
    rows, saved_state = [], None
    for t in range(N):
        row, state = stream.next(state)
        rows.append(row)
        if t == 10:
            saved_state = stream.state_dict(state)
    got = np.array(rows, dtype=np.float64)
    assert np.max(np.abs(got - expected)) <= tol * np.max(np.abs(expected))
    with pytest.raises(MfcliError, match="exhausted"):
        stream.next(state)
    again = noise_stream(path, kind=kind, d=d, seed=SEED, dtype=dtype)
    resumed = again.load_state_dict(saved_state)
    for t in range(11, N):
        row, resumed = again.next(resumed)
        assert np.array_equal(row, rows[t])
    rebuilt = stream.state_at(11)  # rebuilt from the seed alone: the same bits
    row, _ = stream.next(rebuilt)
    assert np.array_equal(row, rows[11])
    edited = dict(saved_state)
    edited["running"] = np.zeros_like(saved_state["running"])
    with pytest.raises(MfcliError, match="authentication"):
        again.load_state_dict(edited)


def test_torch_adapter_streams_structured_noise(saved):
    torch = pytest.importorskip("torch")
    from mfcli.adapters.torch import CorrelatedNoiseOptimizer

    path, strat, w, _ = saved
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2).double()  # d = 8
    theta0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy().copy()
    lr, sigma, clip = 0.1, 1.5, 0.5
    beta = w.beta if w.name == "momentum" else 0.0
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD(net.parameters(), lr=lr, momentum=beta), artifact=path, seed=SEED,
                                   noise_std=sigma, clip_norm=clip)
    decoder = dense_workload(w, N) @ np.linalg.inv(materialize(strat.coefs, N))
    want = theta0[None, :] - lr * sigma * clip * (decoder @ philox_z(SEED, N, 8, "float64"))
    for t in range(N):
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        got = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
        assert np.max(np.abs(got - want[t])) <= 1e-10 * np.max(np.abs(want - theta0))
    with pytest.raises(MfcliError, match="exhausted"):
        opt.step()


def test_optax_adapter_streams_structured_noise(saved):
    pytest.importorskip("optax")
    import jax.numpy as jnp

    from mfcli.adapters.optax import correlated_noise

    from noise_oracles import jax_z

    path, strat, _w, _ = saved
    stream = noise_stream(path, kind="gradient", d=4, seed=SEED, dtype="float32")
    tx = correlated_noise(stream, noise_std=1.0, clip_norm=1.0)
    params = {"w": jnp.zeros(4, dtype=jnp.float32)}
    state = tx.init(params)
    # the jax stream draws Z with jax.random (docs/noise-streams.md, "Reproducibility contract")
    expected = np.linalg.inv(materialize(strat.coefs, N)) @ jax_z(SEED, N, 4, "float32").astype(np.float64)
    for t in range(3):
        updates, state = tx.update({"w": jnp.zeros(4, dtype=jnp.float32)}, state, params)
        assert np.allclose(np.asarray(updates["w"], dtype=np.float64), expected[t], atol=1e-5)


def test_save_refuses_bad_input(tmp_path):
    w = toeplitz_workload("prefix")
    with pytest.raises(MfcliError, match="not divisible"):
        save_structured_artifact(tmp_path / "x.h5", BandedToeplitz(np.ones(2)), workload=w, n=10,
                                 participation=FixedEpoch(epochs=3))
    assert not (tmp_path / "x.h5").exists()
