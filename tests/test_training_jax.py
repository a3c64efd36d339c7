"""mfcli.training.jax: the record's batches padded to a few fixed shapes with masks, the clipped
gradient (against a hand loop of per-example jax.grad), padding that contributes exactly zero,
a bounded number of compilations, and the record's epsilon."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402
from training_cases import make_arts  # noqa: E402

from mfcli.errors import MfcliError  # noqa: E402
from mfcli.training.jax import make_private, pad_to, padded_shapes  # noqa: E402
from mfcli.training.record import build_sampler, training_record  # noqa: E402


@pytest.fixture(scope="module")
def arts(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    return make_arts(tmp_path_factory.mktemp("training-jax"))


def _data(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _params() -> dict:
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w1": jax.random.normal(k1, (3, 4)), "b1": jnp.zeros(4), "w2": jax.random.normal(k2, (4, 2)),
            "b2": jnp.zeros(2)}


def loss_one(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return optax.softmax_cross_entropy_with_integer_labels((h @ params["w2"] + params["b2"])[None], y[None])[0]


def _priv(arts, kind: str, n: int = 40, **kw):
    path, rid = arts[kind]
    kw.setdefault("seed", 3)
    kw.setdefault("clip_norm", 0.8)
    return make_private(_params(), optax.sgd(0.1), _data(n), artifact=path, record=rid, loss_fn=loss_one, **kw)


def test_padded_shapes_are_few_and_hold_any_batch() -> None:
    assert padded_shapes(20, 40) == (10, 15, 20, 25, 30, 40)
    assert padded_shapes(100, 4000)[-1] == 4000 and len(padded_shapes(100, 4000)) <= 12
    assert pad_to((10, 20), 11) == 20 and pad_to((10, 20), 0) == 10
    with pytest.raises(MfcliError, match="exceeds every padded size"):
        pad_to((10, 20), 21)


@pytest.mark.parametrize("kind", ["poisson", "cyclic", "fixed-order"])
def test_batches_are_the_records_padded_and_masked(arts, kind: str) -> None:
    priv = _priv(arts, kind, n=57)
    x, y = _data(57)
    expect = build_sampler(training_record(*arts[kind]), examples=57, seed=3)
    seen = set()
    for t, (xb, yb, mask) in enumerate(priv.batches()):
        idx = expect.batch(t)
        k = len(idx)
        assert xb.shape[0] in priv.shapes and mask.sum() == k and (mask[:k] == 1).all() and (mask[k:] == 0).all()
        np.testing.assert_array_equal(xb[:k], x[idx])
        np.testing.assert_array_equal(yb[:k], y[idx])
        seen.add(xb.shape[0])
    assert len(seen) <= len(priv.shapes)
    assert priv.epsilon() == training_record(*arts[kind]).epsilon


def test_clipped_grad_matches_a_hand_loop_and_padding_adds_nothing(arts) -> None:
    priv = _priv(arts, "poisson")
    params = _params()
    xb, yb, mask = next(iter(priv.batches()))
    k = int(mask.sum())
    assert 3 < k < len(mask)   # some padding
    got = jax.jit(priv.clipped_grad)(params, xb, yb, mask)
    clipped = 0
    total = jax.tree_util.tree_map(jnp.zeros_like, params)
    for i in range(k):
        g = jax.grad(loss_one)(params, xb[i], yb[i])
        nrm = float(np.sqrt(sum(float(jnp.sum(v ** 2)) for v in jax.tree_util.tree_leaves(g))))
        s = min(1.0, 0.8 / nrm)
        clipped += s < 1
        total = jax.tree_util.tree_map(lambda a, b, s=s: a + s * b, total, g)
    assert 0 < clipped < k
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(total), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b) / priv.expected_batch_size, rtol=2e-5, atol=1e-6)


def test_training_runs_n_steps_with_few_compilations(arts) -> None:
    priv = _priv(arts, "poisson", n=57)
    params = _params()
    opt_state = priv.tx.init(params)
    traces = []

    def step(params, opt_state, x, y, mask):
        traces.append(x.shape[0])   # runs once per compilation
        updates, opt_state = priv.tx.update(priv.clipped_grad(params, x, y, mask), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    jstep = jax.jit(step)
    steps = 0
    for x, y, mask in priv.batches():
        params, opt_state = jstep(params, opt_state, x, y, mask)
        steps += 1
    assert steps == priv.n == 6
    assert len(traces) == len(set(traces)) <= len(priv.shapes)
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree_util.tree_leaves(params))


@pytest.mark.parametrize("kw, msg", [
    ({"noise_multiplier": 1.5}, r"noise_multiplier=1.5 but .* accounts noise multiplier 2.0"),
    ({"noise_std": 1.5}, r"noise_std=1.5 but .* accounts noise std 2.0"),
    ({"batch_size": 10}, r"is Poisson rate 0.25, but .* rate 0.5"),
    ({"sampler": "cyclic"}, r"sampler='cyclic' but .* accounts the poisson batch sampler"),
    ({"sample_rate": 0.25}, r"sample_rate=0.25 but .* accounts rate 0.5"),
    ({"clip_norm": -1.0}, r"clip_norm must be a positive finite number"),
])
def test_refusals(arts, kw: dict, msg: str) -> None:
    with pytest.raises(MfcliError, match=msg):
        _priv(arts, "poisson", **kw)


def test_record_options_reach_the_record(tmp_path: Path) -> None:
    """make_private passes its record options (RecordOptions) on unchanged: a balls-in-bins record
    is refused unless non_adaptive=True, a misspelt option is a TypeError, not silently dropped."""
    from training_cases import prefix_artifact
    from typer.testing import CliRunner

    from mfcli.cli.app import app

    n = 8
    path = prefix_artifact(tmp_path / "id8.h5", np.eye(n), "identity")
    r = CliRunner().invoke(app, ["account", str(path), "--sigma", "2", "--batching", "balls-in-bins", "--write", "-q"])
    assert r.exit_code == 0, r.output
    common = {"artifact": path, "seed": 3, "clip_norm": 0.8, "loss_fn": loss_one}
    with pytest.raises(MfcliError, match=r"non-adaptive.*non_adaptive=True"):
        make_private(_params(), optax.sgd(0.1), _data(32), **common)
    priv = make_private(_params(), optax.sgd(0.1), _data(32), non_adaptive=True, batch_size=4, **common)
    assert priv.n == n and priv.record.sampler == "balls-in-bins"
    with pytest.raises(TypeError, match="non_adaptiv"):
        make_private(_params(), optax.sgd(0.1), _data(32), non_adaptiv=True, **common)
