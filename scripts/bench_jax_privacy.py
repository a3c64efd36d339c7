"""Cost per step of the jax_privacy exports (docs/frameworks.md, "JAX and jax_privacy").

Runs where jax_privacy is installed. For an optimal momentum artifact with a compressed group
(``mfcli compress``), times one jitted privatizer update at step t (median over repeats, after
compilation) for: mfcli's optax adapter (noise drawn on the host), jax_privacy's streaming
privatizer with the exported compressed operator (W + R rows of state), with the exported dense
operator (n rows of state), mfcli's guarded dense privatizer and jax_privacy's own dense
privatizer (both regenerate t + 1 noise rows). Usage::

    python scripts/bench_jax_privacy.py --artifact momentum-n256-compressed.h5 --d 100000 --t 200
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jax_privacy import noise_addition

from mfcli.adapters import jax_privacy as bridge
from mfcli.adapters.optax import correlated_noise
from mfcli.strategies.operators import select_operator
from mfcli.training.noise import noise_stream


def time_update(tx, d: int, t: int, repeats: int) -> float:
    """Median seconds of one jitted update at step t (state advanced eagerly to t first)."""
    zero = jnp.zeros(d, dtype=jnp.float32)
    update = jax.jit(tx.update)
    state = tx.init(zero)
    for _ in range(t):
        _, state = update(zero, state)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(update(zero, state))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--d", type=int, default=100_000)
    ap.add_argument("--t", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    from mfcli.io.artifact import load_artifact

    art = load_artifact(args.artifact)
    comp = select_operator(art, "compressed")
    key = jax.random.key(0)
    settings = {
        "mfcli optax adapter (compressed)": correlated_noise(
            noise_stream(args.artifact, kind="gradient", d=args.d, seed=1, dtype="float32"),
            noise_std=1.0, clip_norm=1.0),
        f"streaming export, {comp.label}": noise_addition.matrix_factorization_privatizer(
            bridge.streaming_matrix(art, variant="compressed"), stddev=1.0, prng_key=key),
        "streaming export, dense (n rows of state)": noise_addition.matrix_factorization_privatizer(
            bridge.streaming_matrix(art, variant="dense"), stddev=1.0, prng_key=key),
        "mfcli dense_privatizer (guarded)": bridge.dense_privatizer(art, stddev=1.0, prng_key=key, variant="dense"),
        "jax_privacy dense privatizer (no stop at n)": noise_addition.matrix_factorization_privatizer(
            select_operator(art, "dense").streaming("gradient").matrix.dense(), stddev=1.0, prng_key=key),
    }
    print(f"n = {art.n}, d = {args.d}, step t = {args.t}, jax {jax.__version__}, device {jax.devices()[0]}")
    for name, tx in settings.items():
        print(f"{name:52s} {time_update(tx, args.d, args.t, args.repeats) * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
