#!/usr/bin/env python
"""Benchmark: banded Toeplitz strategies (mfcli.strategies.toeplitz) at long horizons, side by side with
jax_privacy 2.0 where it is importable (run under a venv that has it, e.g. /work/jpvenv, with
PYTHONPATH pointing at this checkout).

Reported:

* optimisation time (process CPU and wall clock) of ``optimize_banded_toeplitz`` for prefix sums,
  single participation, mean error, at n = 10^4 and 10^5 (b = 64; target <= 60 s at 10^5);
* at n = 2048: the ratio of the banded Toeplitz mean loss to the certified dense optimum (the
  dense solver's primal; its dual bound is printed too), for b = 32 and 256, and the same for
  jax_privacy's ``toeplitz.optimize_banded_toeplitz`` (its coefficients re-evaluated by mfcli's
  loss, so both are measured by one ruler): mfcli must never be worse;
* a gradient noise stream (C^-1 Z by recursion, b = 64) at d = 10^6: steps per second.

Usage:
    PYTHONPATH=$PWD /work/jpvenv/bin/python scripts/bench_structured.py          # with jax_privacy
    PYTHONPATH=$PWD python scripts/bench_structured.py --quick                   # small sizes
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from mfcli.io.artifact import save_structured_artifact
from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz, optimize_banded_toeplitz
from mfcli.training.noise import noise_stream


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def jax_optimize(n: int, bands: int):
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        from jax_privacy.matrix_factorization import toeplitz
    except ImportError:
        return None
    coefs, cpu, wall = timed(lambda: np.asarray(toeplitz.optimize_banded_toeplitz(n, bands), dtype=np.float64))
    return BandedToeplitz(coefs / coefs[0]), cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--d", type=int, default=1_000_000)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--jax-large", action="store_true", help="also time jax_privacy at n = 10^5 (very slow)")
    ap.add_argument("--skip-jax-speed", action="store_true", help="time jax_privacy at no n (accuracy rows only)")
    args = ap.parse_args()
    out: dict = {"speed": [], "accuracy": [], "stream": {}}

    for n in ([10_000] if args.quick else [10_000, 100_000]):
        res, cpu, wall = timed(lambda n=n: optimize_banded_toeplitz(n, 64))
        row = {"n": n, "bands": 64, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "iterations": res.iterations,
               "loss_mean": res.loss.mean}
        # jax_privacy takes minutes at 10^4 on 2 cores (531 s wall on a loaded machine): timed there only
        jx = None if args.quick or args.skip_jax_speed or (n > 10_000 and not args.jax_large) else jax_optimize(n, 64)
        if jx is not None:
            row |= {"jax_cpu_s": round(jx[1], 2), "jax_wall_s": round(jx[2], 2),
                    "jax_loss_mean": jx[0].loss(n, TOEPLITZ_PREFIX).mean}
        out["speed"].append(row)
        print(json.dumps(row), flush=True)

    n = 512 if args.quick else 2048
    from mfcli.model.workloads import prefix_workload
    from mfcli.optimize.dense import optimal_factorization

    dense = optimal_factorization(prefix_workload(n).matrix, tol=1e-6)
    opt_mean = dense.primal / n
    for bands in (32, 256):
        res, cpu, _ = timed(lambda bands=bands: optimize_banded_toeplitz(n, bands))
        row = {"n": n, "bands": bands, "dense_optimum_mean": opt_mean, "dense_dual_mean": dense.dual / n,
               "mfcli_ratio": res.loss.mean / opt_mean, "mfcli_cpu_s": round(cpu, 2)}
        jx = jax_optimize(n, bands)
        if jx is not None:
            theirs = jx[0].loss(n, TOEPLITZ_PREFIX).mean
            row |= {"jax_ratio": theirs / opt_mean, "jax_cpu_s": round(jx[1], 2),
                    "mfcli_not_worse": bool(res.loss.mean <= theirs * (1 + 1e-9))}
        out["accuracy"].append(row)
        print(json.dumps(row), flush=True)

    d = 10_000 if args.quick else args.d
    strat = optimize_banded_toeplitz(4096, 64).strategy
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bt.h5"
        save_structured_artifact(path, strat, workload=TOEPLITZ_PREFIX, n=4096)
        stream = noise_stream(path, kind="gradient", d=d, seed=1, dtype="float32")
        state = stream.init()
        for _ in range(70):  # past the band: every step does the full recursion
            _, state = stream.next(state)
        steps = 20
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            _, state = stream.next(state)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    out["stream"] = {"d": d, "bands": 64, "dtype": "float32", "steps_per_s_cpu": round(steps / cpu, 1),
                     "steps_per_s_wall": round(steps / wall, 1), "memory_floats_per_d": stream.memory_floats() / d}
    print(json.dumps(out["stream"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
