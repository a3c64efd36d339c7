"""Private training in JAX/optax with correlated noise from an ``mfcli optimize`` artifact.

A one-hidden-layer MLP on scikit-learn's digits (1,797 8x8 images shipped inside scikit-learn; no
download), trained for the artifact's n steps with heavy-ball momentum SGD, the workload the
artifact was optimized for. Each step clips per-example gradients, sums them and lets
``mfcli.adapters.optax.correlated_noise`` add sigma * clip * (C^-1 Z)[t]; optax's SGD with
momentum beta then releases A G + B Z. One pass over the training set (each example in at most one
step), so the guarantee is the single-pass Gaussian mechanism with sensitivity sens(C), computed
by :func:`mfcli.accounting.single_pass.single_pass`. Step n is refused: the script shows it.

Usage::

    python examples/jax_optax_digits.py                       # runs mfcli optimize (n = 64) first
    python examples/jax_optax_digits.py --artifact momentum.h5 --sigma 2
    python examples/jax_optax_digits.py --quick --json        # n = 16, what the tests run

Needs ``pip install 'mfcli[jax,study]'`` (jax, optax; scikit-learn comes with the study extra).
"""
from __future__ import annotations

import argparse
import json
import math
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

from mfcli.accounting.single_pass import single_pass
from mfcli.adapters.optax import checked, correlated_noise
from mfcli.errors import NoiseStreamExhaustedError
from mfcli.io.artifact import load_artifact
from mfcli.training.noise import noise_stream


def optimize(n: int, beta: float, directory: Path) -> Path:
    """``mfcli optimize`` for heavy-ball momentum with n steps: the artifact training starts from."""
    out = directory / f"momentum-n{n}.h5"
    subprocess.run(
        [sys.executable, "-m", "mfcli", "optimize", "--workload", "momentum", "--n", str(n), "--beta", str(beta),
         "--out", str(out), "--quiet"],
        check=True, stdout=subprocess.DEVNULL,
    )
    return out


def digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train (80%) and test (20%) split of the digits, pixels scaled to [0, 1]."""
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def init_params(key: jax.Array, hidden: int) -> dict:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (64, hidden)) / 8.0, "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, 10)) / math.sqrt(hidden), "b2": jnp.zeros(10),
    }


def logits(params: dict, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_one(params: dict, x: jax.Array, label: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x[None]), label[None])[0]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, help="mfcli optimize artifact (momentum workload); default: optimize one")
    ap.add_argument("--quick", action="store_true", help="n = 16 steps, small MLP (the tests' mode)")
    ap.add_argument("--sigma", type=float, default=1.0, help="noise multiplier (noise std in clip-norm units)")
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=0.5, help="learning rate (on the mean clipped gradient)")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0, help="data order and initialization (the noise seed is secret)")
    ap.add_argument("--json", action="store_true", help="print one JSON summary on stdout")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.artifact or optimize(16 if args.quick else 64, 0.9, Path(tmp))
        art = load_artifact(path)
        params_json = art.attrs.get("workload_params", {})
        if art.workload_name != "momentum" or params_json.get("lr") not in ("constant", None):
            raise SystemExit("error: this example trains with constant-lr momentum SGD: use a momentum artifact")
        beta = float(params_json["beta"])
        x_tr, y_tr, x_te, y_te = digits(args.seed)
        n = art.n
        batch = len(y_tr) // n
        if batch < 1:
            raise SystemExit(f"error: n = {n} steps need at least {n} training examples for one pass")
        params = init_params(jax.random.key(args.seed), 16 if args.quick else 32)
        d = sum(int(v.size) for v in jax.tree_util.tree_leaves(params))
        stream = noise_stream(path, kind="gradient", d=d, seed=secrets.randbits(128))
        tx = optax.chain(
            correlated_noise(stream, noise_std=args.sigma, clip_norm=args.clip, batch_size=batch),
            optax.sgd(args.lr, momentum=beta),            # the artifact's A: heavy ball, constant lr
        )
        opt_state = tx.init(params)

        def train_step(params, opt_state, xb, yb):
            losses, g = jax.vmap(jax.value_and_grad(loss_one), in_axes=(None, 0, 0))(params, xb, yb)
            norms = jnp.sqrt(sum(jnp.sum(v.reshape(batch, -1) ** 2, axis=1) for v in jax.tree_util.tree_leaves(g)))
            factor = jnp.minimum(1.0, args.clip / jnp.maximum(norms, 1e-12))
            g = jax.tree_util.tree_map(lambda v: jnp.mean(v * factor.reshape((-1,) + (1,) * (v.ndim - 1)), axis=0), g)
            updates, opt_state = tx.update(g, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, jnp.mean(losses)

        step = checked(jax.jit(train_step, donate_argnums=(1,)))   # step n: NoiseStreamExhaustedError; state in place
        losses = []
        for t in range(n):
            sl = slice(batch * t, batch * (t + 1))
            params, opt_state, loss = step(params, opt_state, x_tr[sl], y_tr[sl])
            losses.append(float(loss))
        try:
            step(params, opt_state, x_tr[:batch], y_tr[:batch])
            refused = None
        except NoiseStreamExhaustedError as exc:
            refused = str(exc)
        accuracy = float(np.mean(np.argmax(np.asarray(logits(params, jnp.asarray(x_te))), axis=1) == y_te))
        privacy = single_pass(sigma=args.sigma, sensitivity=stream.sensitivity, delta=args.delta) if args.sigma > 0 else None
        out = {
            "artifact": str(path if args.artifact else f"mfcli optimize --workload momentum --n {n} --beta 0.9"),
            "n": n, "d": d, "batch": batch, "beta": beta, "sigma": args.sigma, "clip": args.clip,
            "sensitivity": stream.sensitivity, "delta": args.delta,
            # printed upper bound: rounded up
            "epsilon": None if privacy is None else math.ceil(privacy.epsilon * 1e4) / 1e4,
            "first_loss": losses[0], "last_loss": losses[-1], "test_accuracy": accuracy,
            "step_n_refused": refused,
        }
    if args.json:
        print(json.dumps(out))
    else:
        eps = "infinite (sigma = 0: not private)" if out["epsilon"] is None else f"<= {out['epsilon']} (delta {args.delta:g})"
        print(f"{n} steps of {batch} examples, d = {d}, sigma = {args.sigma}, sens(C) = {stream.sensitivity:.4f}")
        print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; test accuracy {accuracy:.3f}; epsilon {eps}")
        print(f"step {n} refused: {refused}")
    return out


if __name__ == "__main__":
    main()
