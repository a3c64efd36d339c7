"""optax adapter (optional: runs where jax and optax install).

Oracles as for the torch adapter: the transformation's output on zero updates is
sigma * clip * (C^-1 Z)[t] computed here by triangular solves from Z drawn straight from
jax.random by the documented contract (noise_oracles.jax_z), and optax.sgd with momentum beta
turns it into theta_0 - lr sigma clip (B Z)[t].
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

from mfcli.adapters import optax as optax_adapter  # noqa: E402
from mfcli.adapters.optax import CorrelatedNoiseState, correlated_noise  # noqa: E402
from mfcli.errors import MfcliError, NoiseStreamExhaustedError  # noqa: E402
from mfcli.training.noise import noise_stream  # noqa: E402

from noise_oracles import jax_z, save_truncated_svd_compression  # noqa: E402

SEED = 77
BETA = 0.9
N = 14
PARAMS = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}   # d = 9
D = 9




@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """Momentum optimum with a compressed group (K = 2, R = 2: band plus truncated SVD)."""
    return save_truncated_svd_compression(tmp_path_factory.mktemp("optax") / "momentum.h5",
                                          n=N, beta=BETA, band=2, rank=2)


def flat(tree) -> np.ndarray:
    return np.asarray(ravel_pytree(tree)[0], dtype=np.float64)


def zeros():
    return jax.tree_util.tree_map(jnp.zeros_like, PARAMS)


@pytest.mark.parametrize("variant", ["dense", "compressed"])
@pytest.mark.parametrize("jit", [False, True])
def test_updates_are_scaled_gradient_noise(artifact, variant, jit):
    path, a, fact, b_hat = artifact
    stream = noise_stream(path, kind="gradient", d=D, seed=SEED, variant=variant)
    tx = correlated_noise(stream, noise_std=1.5, clip_norm=2.0, batch_size=3)
    update = jax.jit(tx.update) if jit else tx.update
    state = tx.init(PARAMS)
    z = jax_z(SEED, N, D, "float32").astype(np.float64)
    decoder = fact.decoder if variant == "dense" else b_hat
    want = 1.5 * 2.0 / 3 * scipy.linalg.solve_triangular(a, decoder @ z, lower=True)  # C^-1 Z = A^-1 B Z
    for t in range(N):
        upd, state = update(zeros(), state)
        np.testing.assert_allclose(flat(upd), want[t], rtol=0, atol=3e-6 * np.max(np.abs(want)), err_msg=f"t={t}")
    assert int(state.step) == N
    if jit:   # no host callback: the refused step's noise is NaN, and checked() raises
        upd, after = update(zeros(), state)
        assert np.all(np.isnan(flat(upd))) and int(after.step) == N and int(after.status) == optax_adapter.EXHAUSTED
        with pytest.raises(NoiseStreamExhaustedError):   # a refused state cannot be checkpointed
            optax_adapter.state_dict(stream, after)
        with pytest.raises(NoiseStreamExhaustedError, match=f"^noise stream exhausted: step {N} >= n = {N};"):
            optax_adapter.checked(update)(zeros(), state)
    else:
        with pytest.raises(NoiseStreamExhaustedError, match="exhausted"):
            update(zeros(), state)


def test_checked_jitted_train_step_raises_mfcli_errors(artifact):
    """A whole jitted step (noise + momentum SGD) under checked(): step n raises the mfcli error
    with its one-line message; a state from another stream raises MfcliError; other errors pass."""
    path, *_ = artifact
    stream = noise_stream(path, kind="gradient", d=D, seed=SEED)
    tx = optax.chain(correlated_noise(stream, noise_std=1.0, clip_norm=1.0), optax.sgd(0.1, momentum=BETA))

    def train_step(params, opt_state):
        upd, opt_state = tx.update(zeros(), opt_state, params)
        return optax.apply_updates(params, upd), opt_state

    step = optax_adapter.checked(jax.jit(train_step))
    params, opt_state = PARAMS, tx.init(PARAMS)
    for _ in range(N):
        params, opt_state = step(params, opt_state)
    with pytest.raises(NoiseStreamExhaustedError) as info:
        step(params, opt_state)
    assert str(info.value) == (f"noise stream exhausted: step {N} >= n = {N}; the artifact covers steps 0..{N - 1} "
                               "and running past the end would break the privacy guarantee")
    other = noise_stream(path, kind="gradient", d=D, seed=SEED + 1)
    foreign = correlated_noise(other, noise_std=1.0, clip_norm=1.0).init(PARAMS)
    with pytest.raises(MfcliError, match="belongs to another noise stream"):
        step(params, (foreign, opt_state[1]))
    with pytest.raises(TypeError):
        optax_adapter.checked(jax.jit(lambda x: x + "a"))(1.0)


@pytest.mark.parametrize("text, want", [
    ("INTERNAL: CpuCallback error calling callback: Traceback (most recent call last):\n  File ...\n"
     "NoiseStreamExhaustedError: noise stream exhausted: step 3 >= n = 3; more", NoiseStreamExhaustedError),
    ("INTERNAL: CpuCallback error: Traceback\nmfcli.errors.MfcliError: this optax state belongs to another", MfcliError),
    ("INTERNAL: CpuCallback error: Traceback\nZeroDivisionError: division by zero", None),
    ("something else entirely", None),
])
def test_mfcli_error_from_reads_the_last_error_line(text, want):
    err = optax_adapter.mfcli_error_from(ValueError(text))
    if want is None:
        assert err is None
    else:
        assert type(err) is want and "\n" not in str(err) and not str(err).startswith(("INTERNAL", "Traceback"))


def test_chained_momentum_sgd_releases_decoder_noise(artifact):
    path, _a, _fact, b_hat = artifact
    stream = noise_stream(path, kind="gradient", d=D, seed=SEED)  # compressed
    lr = 0.1
    tx = optax.chain(correlated_noise(stream, noise_std=1.0, clip_norm=1.0), optax.sgd(lr, momentum=BETA))
    state = tx.init(PARAMS)
    params = PARAMS

    @jax.jit
    def step(params, state):
        upd, state = tx.update(zeros(), state, params)
        return optax.apply_updates(params, upd), state

    want = -lr * (b_hat @ jax_z(SEED, N, D, "float32").astype(np.float64))
    for t in range(N):
        params, state = step(params, state)
        np.testing.assert_allclose(flat(params), want[t], rtol=0, atol=3e-6 * np.max(np.abs(want)))


def test_state_round_trip_resumes_identically(artifact):
    path = artifact[0]
    stream = noise_stream(path, kind="gradient", d=D, seed=SEED)
    tx = correlated_noise(stream, noise_std=1.0, clip_norm=1.0)
    update = jax.jit(tx.update)
    state = tx.init(PARAMS)
    outs = []
    saved = None
    for t in range(N):
        if t == 5:
            saved = {k: np.asarray(v) for k, v in state._asdict().items()}   # a checkpoint
        upd, state = update(zeros(), state)
        outs.append(flat(upd))
    restored = CorrelatedNoiseState(**{k: jnp.asarray(v) for k, v in saved.items()})
    fresh = correlated_noise(noise_stream(path, kind="gradient", d=D, seed=SEED), noise_std=1.0, clip_norm=1.0)
    state = restored
    for t in range(5, N):
        upd, state = jax.jit(fresh.update)(zeros(), state)
        np.testing.assert_array_equal(flat(upd), outs[t])


def _run_to(tx, steps):
    update = jax.jit(tx.update)
    state = tx.init(PARAMS)
    outs = []
    for _ in range(steps):
        upd, state = update(zeros(), state)
        outs.append(flat(upd))
    return outs, state


def test_authenticated_checkpoint_resumes_identically(artifact, tmp_path):
    path = artifact[0]
    stream = noise_stream(path, kind="gradient", d=D, seed=SEED)
    tx = correlated_noise(stream, noise_std=1.0, clip_norm=1.0)
    ref, _ = _run_to(tx, N)
    _, state = _run_to(tx, 9)
    ck = optax_adapter.state_dict(stream, state)
    np.savez(tmp_path / "ck.npz", **ck)
    fresh_stream = noise_stream(path, kind="gradient", d=D, seed=SEED)
    fresh = correlated_noise(fresh_stream, noise_std=1.0, clip_norm=1.0)
    state = optax_adapter.load_state_dict(fresh_stream, dict(np.load(tmp_path / "ck.npz")))
    for t in range(9, N):
        upd, state = jax.jit(fresh.update)(zeros(), state)
        np.testing.assert_array_equal(flat(upd), ref[t])


@pytest.mark.parametrize(
    "edit",
    [
        lambda ck: {**ck, "running": np.zeros_like(ck["running"])},
        lambda ck: {**ck, "t": ck["t"] + 2},
        lambda ck: {**ck, "tag": "0" * 64},
    ],
    ids=["running-zeroed", "step-changed", "tag-zeroed"],
)
def test_edited_checkpoint_is_refused(artifact, edit):
    path = artifact[0]
    stream = noise_stream(path, kind="gradient", d=D, seed=SEED)
    _, state = _run_to(correlated_noise(stream, noise_std=1.0, clip_norm=1.0), 9)
    ck = optax_adapter.state_dict(stream, state)
    assert np.any(ck["running"])
    with pytest.raises(MfcliError, match="authentication tag"):
        optax_adapter.load_state_dict(noise_stream(path, kind="gradient", d=D, seed=SEED), edit(ck))
    with pytest.raises(MfcliError, match="different seed"):
        optax_adapter.load_state_dict(noise_stream(path, kind="gradient", d=D, seed=SEED + 1), ck)


def test_state_of_another_seed_is_refused(artifact):
    path = artifact[0]
    tx1 = correlated_noise(noise_stream(path, kind="gradient", d=D, seed=1), noise_std=1.0, clip_norm=1.0)
    tx2 = correlated_noise(noise_stream(path, kind="gradient", d=D, seed=2), noise_std=1.0, clip_norm=1.0)
    with pytest.raises(MfcliError, match="another noise stream"):
        tx2.update(zeros(), tx1.init(PARAMS))


def test_bad_construction(artifact):
    path = artifact[0]
    with pytest.raises(MfcliError, match="kind='gradient'"):
        correlated_noise(noise_stream(path, kind="iterate", d=D, seed=1), noise_std=1.0, clip_norm=1.0)
    tx = correlated_noise(noise_stream(path, kind="gradient", d=D + 1, seed=1), noise_std=1.0, clip_norm=1.0)
    with pytest.raises(MfcliError, match="d = 10 but the parameters have 9"):
        tx.init(PARAMS)
    with pytest.raises(MfcliError, match="clip_norm"):
        correlated_noise(noise_stream(path, kind="gradient", d=D, seed=1), noise_std=1.0, clip_norm=float("nan"))
    if not jax.config.jax_enable_x64:
        with pytest.raises(MfcliError, match="jax_enable_x64"):
            correlated_noise(noise_stream(path, kind="gradient", d=D, seed=1, dtype="float64"),
                             noise_std=1.0, clip_norm=1.0)


def test_postprocess_hook(artifact):
    path, _a, fact, _ = artifact
    stream = noise_stream(path, kind="gradient", d=D, seed=SEED, variant="dense")
    tx = correlated_noise(stream, noise_std=1.0, clip_norm=1.0, postprocess=lambda g: 0.5 * jnp.roll(g, 1))
    upd, _ = jax.jit(tx.update)(zeros(), tx.init(PARAMS))
    z = jax_z(SEED, N, D, "float32").astype(float)
    want = 0.5 * np.roll(scipy.linalg.solve_triangular(fact.strategy, z, lower=True)[0], 1)
    np.testing.assert_allclose(flat(upd), want, atol=1e-5)


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


def test_doc_example_optax(tmp_path):
    ns = run_doc_example("optax", tmp_path)
    assert int(ns["opt_state"][0].step) == ns["stream"].n == 256
    assert np.all(np.isfinite(flat(ns["params"])))
