#!/usr/bin/env python
"""Benchmark: noise streams at d = 10^6 float32, per kind and framework, beside raw Gaussians.

Side by side in one run (docs/performance.md, "Noise streams: cost per step flat in t"):

* raw Gaussian generation of one d-row, the floor under every stream: numpy Philox (mfcli's
  reference Z, 1 and 2 threads), numpy PCG64 and SFC64 (the faster bit generators, seeded per
  block by SeedSequence spawn keys: what the reference would cost on them), ``torch.randn``
  (CPU), ``jax.random.normal`` (jitted);
* steps/s of BLT-4 and banded Toeplitz with 8 bands (n = 10^5) in numpy (1 and 2 threads), torch
  (``TorchStream`` on the CPU) and optax (the jitted ``correlated_noise`` update on zero grads);
* per-step time at step 10 against step n - 1 (median of 11 steps around each; the late steps are
  reached by loading a checkpoint at n - 12, as a resumed run would) for every structured and
  compressed kind: BLT-4, banded Toeplitz 8, BandMF (a dense artifact with a banded C, 8 bands),
  compressed (band 4 + rank 4), in torch and optax (and numpy);
* dense C^-1 (kept rows of Z, n = 64): step n - 1 against t + 1 plain multiply-adds of d floats
  plus one raw Gaussian row of the same framework;
* with ``--baseline DIR`` (a checkout of the previous mfcli, e.g. /work/main), the previous numpy
  and torch (CPU) streams of BLT-4 and banded-8 on the same artifacts, in a subprocess of the same
  run: the CPU reference path must not get slower.

Medians of process CPU time per step (what one dedicated core takes: on a shared machine
wall-clock also counts waiting for a core; with 2 threads CPU time adds both up), BLAS threads
pinned to 1 with threadpoolctl and torch's intra-op threads to 1, both reported; load average
printed before and after. The previous streams (``--baseline``) are timed twice, before and
after the current ones, so that a change in the machine's load shows.

Usage:
    python scripts/bench_streams.py                  # d = 10^6 (a few minutes)
    python scripts/bench_streams.py --d 100000 --reps 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from mfcli.io.artifact import save_artifact, save_structured_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.workloads import prefix_workload
from mfcli.strategies.blt import BufferedToeplitz
from mfcli.strategies.toeplitz import BandedToeplitz, toeplitz_workload
from mfcli.training.noise import BLOCK, NUMPY_GENERATOR, noise_row, noise_stream

SEED = 0x5EED_2024


def median_time(fn, reps: int) -> float:
    """Median process CPU seconds of ``fn`` (after a warm-up call: allocations, jit)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def build(tmp: Path, n_struct: int, n_dense: int) -> dict[str, Path]:
    w = toeplitz_workload("prefix")
    out = {}
    blt = BufferedToeplitz(theta=[0.999, 0.99, 0.9, 0.5], omega=[0.02, 0.05, 0.1, 0.2])
    save_structured_artifact(tmp / "blt4.h5", blt, workload=w, n=n_struct)
    out["blt-4"] = tmp / "blt4.h5"
    coefs = np.array([1.0, 0.5, 0.3, 0.2, 0.12, 0.08, 0.05, 0.03])
    save_structured_artifact(tmp / "bt8.h5", BandedToeplitz(coefs), workload=w, n=n_struct)
    out["banded-toeplitz-8"] = tmp / "bt8.h5"
    a = prefix_workload(n_dense).matrix
    rng = np.random.default_rng(1)
    c = np.tril(rng.uniform(-0.05, 0.05, (n_dense, n_dense)))
    c[np.diag_indices(n_dense)] = 1.0
    banded = c.copy()
    banded[np.tril_indices(n_dense, -8)] = 0.0
    for name, cc in (("bandmf-8", banded), ("dense", c)):
        fact = Factorization(workload=a, strategy=cc, decoder=a @ np.linalg.inv(cc), causal=True)
        save_artifact(tmp / f"{name}.h5", fact, workload_name="prefix", strategy_name=name)
        out[name] = tmp / f"{name}.h5"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from noise_oracles import save_truncated_svd_compression

    save_truncated_svd_compression(tmp / "comp.h5", n=n_dense, beta=0.9, band=4, rank=4)
    out["compressed-4+4"] = tmp / "comp.h5"
    return out


# --- drivers: each returns (step(), jump_to(t)) over one stream --------------------------------


def numpy_driver(stream):
    box = {"state": stream.init()}

    def step():
        _row, box["state"] = stream.next(box["state"])

    def jump(t):
        ck = stream.checkpoint(t, np.zeros((stream.rank, stream.d), stream.dtype), generator=NUMPY_GENERATOR,
                               generator_check=stream._generator_check(t))
        box["state"] = stream.load_state_dict(ck)

    return step, jump


def torch_driver(stream):
    from mfcli.adapters.torch import TorchStream

    ts = TorchStream(stream, "cpu")

    def jump(t):
        ck = stream.checkpoint(t, np.zeros((stream.rank, stream.d), stream.dtype), generator=ts.generator_name,
                               generator_check=ts.generator_check(t))
        ts.load_state_dict(ck)

    return ts.next, jump


def optax_driver(stream):
    import jax
    import jax.numpy as jnp

    from mfcli.adapters import optax as ad

    tx = ad.correlated_noise(stream, noise_std=1.0, clip_norm=1.0)
    update = jax.jit(tx.update, donate_argnums=(1,))
    zeros = jnp.zeros(stream.d, dtype=stream.dtype)
    box = {"state": tx.init(zeros)}

    def step():
        upd, box["state"] = update(zeros, box["state"])
        jax.block_until_ready(upd)

    def jump(t):
        ck = stream.checkpoint(t, np.zeros((stream.rank, stream.d), stream.dtype), generator=ad.JAX_GENERATOR,
                               generator_check=ad.JaxStream(stream).generator_check(t))
        box["state"] = ad.load_state_dict(stream, ck)

    return step, jump


def unfused_torch_driver(stream):
    """The torch stream with the previous unfused array operations (a product row, then a sum
    into a new row; a BLT's buffers scaled, then added to in a second pass): the same recursion
    and noise, to time what the fused operations save in the same process."""
    import torch

    from mfcli.adapters.torch import TorchOps, TorchStream

    class Unfused(TorchOps):
        def addmv(self, x, coef, rows, alpha):
            return x + alpha * (coef @ rows)

        def scale_add(self, a, scale, row):
            return a.mul_(scale[:, None]).add_(row[None, :])

    ts = TorchStream(stream, "cpu")
    ts.ops = Unfused(torch.device("cpu"), ts.dtype)
    return ts.next, None


DRIVERS = {"numpy": numpy_driver, "torch": torch_driver, "optax": optax_driver}
#: The previous checkout's streams timed with ``--baseline`` (framework, numpy threads).
PREVIOUS = (("numpy", 1), ("numpy", 2), ("torch", 1))


def per_step(step, jump, start: int, count: int) -> float:
    """Median process CPU seconds of ``count`` steps from ``start`` (after one warm-up step before
    it). CPU time, not wall-clock: on this shared machine a step also waits for a core, which
    wall-clock counts and CPU time does not (with threads > 1, CPU time adds the threads up)."""
    jump(max(start - 1, 0))
    step()
    times = []
    for _ in range(count):
        t0 = time.process_time()
        step()
        times.append(time.process_time() - t0)
    return statistics.median(times)


BASELINE = """
import statistics, sys, time
from mfcli.training.noise import noise_stream
path, d, threads, reps, framework = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
stream = noise_stream(path, kind="gradient", d=d, seed=1, dtype="float32", threads=threads)
if framework == "torch":
    import torch
    from mfcli.adapters.torch import TorchStream
    torch.set_num_threads(1)
    step = TorchStream(stream, "cpu").next
else:
    box = {"state": stream.init()}
    def step():
        _, box["state"] = stream.next(box["state"])
for _ in range(11):
    step()
times = []
for _ in range(reps):
    t0 = time.process_time()
    step()
    times.append(time.process_time() - t0)
print(statistics.median(times))
"""


def baseline(checkout: Path, path: Path, d: int, threads: int, reps: int, framework: str = "numpy") -> float:
    """Median CPU seconds per step of the previous mfcli's stream (``framework`` numpy or torch)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", BASELINE, str(path), str(d), str(threads), str(reps), framework],
                         env=env, capture_output=True, text=True, check=True, cwd=checkout)
    return float(out.stdout.strip().splitlines()[-1])


def alternate(step_a, step_b, count: int) -> tuple[float, float]:
    """Median CPU seconds of two step functions called in alternation (a load change hits both)."""
    step_a()
    step_b()
    ta, tb = [], []
    for _ in range(count):
        for step, times in ((step_a, ta), (step_b, tb)):
            t0 = time.process_time()
            step()
            times.append(time.process_time() - t0)
    return statistics.median(ta), statistics.median(tb)


def early_late(make, early: int, late: int, count: int) -> tuple[float, float]:
    """Median CPU seconds of steps from ``early`` and from ``late``, on two streams stepped in
    alternation, so that a change in the machine's load during the measurement hits both alike."""
    (step_a, jump_a), (step_b, jump_b) = make(), make()
    jump_a(max(early - 1, 0))
    jump_b(max(late - 1, 0))
    return alternate(step_a, step_b, count)


def other_bit_generator(name: str, d: int) -> Callable[[], None]:
    """One d-row of float32 normals from numpy bit generator ``name``, seeded per (seed, row,
    block) through SeedSequence spawn keys as a random-access stream on it would be (the
    alternative to Philox's counters), in the same blocks of 65,536."""
    out = np.empty(d, dtype=np.float32)
    cls = getattr(np.random, name)

    def row() -> None:
        for c, start in enumerate(range(0, d, BLOCK)):
            gen = np.random.Generator(cls(np.random.SeedSequence(SEED, spawn_key=(3, c))))
            gen.standard_normal(out=out[start:start + BLOCK], dtype=np.float32)

    return row


def raw_gaussians(d: int, reps: int) -> dict[str, float]:
    out = {"numpy Philox row, 1 thread": median_time(lambda: noise_row(SEED, 3, d, "float32"), reps),
           "numpy Philox row, 2 threads": median_time(lambda: noise_row(SEED, 3, d, "float32", threads=2), reps)}
    # the alternatives to Philox for the reference Z (not used: numpy's ziggurat, not the bits, is the cost)
    for name in ("PCG64", "SFC64"):
        out[f"numpy {name} row (SeedSequence per block)"] = median_time(other_bit_generator(name, d), reps)
    try:
        import torch

        gen = torch.Generator()
        out["torch.randn (CPU)"] = median_time(lambda: (gen.manual_seed(5), torch.randn(d, generator=gen)), reps)
    except ImportError:
        pass
    try:
        import jax

        key = jax.random.key(0)
        draw = jax.jit(lambda k: jax.random.normal(k, (d,), dtype="float32"))
        out["jax.random.normal (CPU, jit)"] = median_time(lambda: jax.block_until_ready(draw(key)), reps)
    except ImportError:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--d", type=int, default=10**6)
    ap.add_argument("--n-struct", type=int, default=10**5)
    ap.add_argument("--n-dense", type=int, default=64)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--baseline", type=Path, help="a checkout of the previous mfcli to time its numpy streams")
    ap.add_argument("--sections", default="raw,throughput,fused,flat,dense", help="comma-separated parts to run")
    args = ap.parse_args()
    d, reps = args.d, args.reps
    want = set(args.sections.split(","))
    load0 = os.getloadavg()
    blas = threadpool_limits(1, "blas")
    info = [(i["internal_api"], i["num_threads"]) for i in threadpool_info()]
    try:
        import torch

        torch.set_num_threads(1)   # two intra-op threads on a loaded 2-core machine spin-wait (100x slower)
        info.append(("torch intra-op", torch.get_num_threads()))
    except ImportError:
        pass
    print(f"d = {d}, float32; BLAS threads {info}; load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{os.cpu_count()} CPUs")
    res: dict = {"d": d, "blas": info, "load_before": load0}
    with tempfile.TemporaryDirectory() as tmpdir:
        arts = build(Path(tmpdir), args.n_struct, args.n_dense)
        res["raw"] = raw = raw_gaussians(d, reps)
        print("\nraw Gaussian row (median CPU time, rows per CPU second):")
        for k, v in raw.items():
            print(f"  {k:44s} {v * 1e3:8.2f} ms  {1 / v:8.1f} /s")

        print(f"\nsteps/s at d = {d} (median over {reps} steps after step 10):")
        res["throughput"] = {}
        for kind in ("blt-4", "banded-toeplitz-8") if "throughput" in want else ():
            if args.baseline:
                for fw, threads in PREVIOUS:
                    s = baseline(args.baseline, arts[kind], d, threads, reps, fw)
                    label = f"{kind} {fw} threads={threads} (previous, before)"
                    res["throughput"][label] = s
                    print(f"  {label:44s} {s * 1e3:8.2f} ms  {1 / s:8.1f} steps/s")
            for fw, threads in (("numpy", 1), ("numpy", 2), ("torch", 1), ("optax", 1)):
                stream = noise_stream(arts[kind], kind="gradient", d=d, seed=SEED, dtype="float32", threads=threads)
                step, jump = DRIVERS[fw](stream)
                s = per_step(step, jump, 10, reps)
                label = f"{kind} {fw}" + (f" threads={threads}" if fw == "numpy" else "")
                res["throughput"][label] = s
                print(f"  {label:44s} {s * 1e3:8.2f} ms  {1 / s:8.1f} steps/s")
            if args.baseline:
                for fw, threads in PREVIOUS:
                    s = baseline(args.baseline, arts[kind], d, threads, reps, fw)
                    label = f"{kind} {fw} threads={threads} (previous, after)"
                    res["throughput"][label] = s
                    print(f"  {label:44s} {s * 1e3:8.2f} ms  {1 / s:8.1f} steps/s")

        print(f"\ntorch, fused against unfused array operations, alternating (median of {reps} steps each):")
        res["fused"] = {}
        for kind in ("blt-4", "banded-toeplitz-8") if "fused" in want else ():
            stream = noise_stream(arts[kind], kind="gradient", d=d, seed=SEED, dtype="float32")
            fused, unfused = alternate(torch_driver(stream)[0], unfused_torch_driver(stream)[0], reps)
            res["fused"][kind] = (fused, unfused)
            print(f"  {kind:18s} fused {fused * 1e3:8.2f} ms ({1 / fused:6.1f} steps/s)   unfused {unfused * 1e3:8.2f} ms "
                  f"({1 / unfused:6.1f} steps/s)   ratio {unfused / fused:5.2f}")

        print(f"\nper-step time at step 10 vs step n - 1 (median of {reps} steps each):")
        res["flat"] = {}
        for kind in ("blt-4", "banded-toeplitz-8", "bandmf-8", "compressed-4+4") if "flat" in want else ():
            for fw in ("numpy", "torch", "optax"):
                stream = noise_stream(arts[kind], kind="gradient", d=d, seed=SEED, dtype="float32")
                early, late = early_late(lambda s=stream, fw=fw: DRIVERS[fw](s), 10, stream.n - reps, reps)
                res["flat"][f"{kind} {fw}"] = (early, late)
                print(f"  {kind:18s} {fw:6s} n={stream.n:<7d} step 10 {early * 1e3:8.2f} ms   step n-1 "
                      f"{late * 1e3:8.2f} ms   ratio {late / early:5.2f}")
                del stream

        print(f"\ndense C^-1 (history of Z, n = {args.n_dense}): step n - 1 vs n plain multiply-adds + one raw row")
        res["dense"] = {}
        n = args.n_dense
        rows = np.random.default_rng(0).standard_normal((n, d), dtype=np.float32)
        coef = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        plain_np = median_time(lambda: coef @ rows, 5)   # n multiply-adds of d floats (BLAS, 1 thread)
        rows = np.empty((0, d), np.float32)   # free the 64 x d block before the streams allocate theirs
        raw_np = raw["numpy Philox row, 1 thread"]
        for fw in ("numpy", "torch", "optax") if "dense" in want else ():
            stream = noise_stream(arts["dense"], kind="gradient", d=d, seed=SEED, dtype="float32")
            early, late = early_late(lambda s=stream, fw=fw: DRIVERS[fw](s), 10, n - 5, 5)
            raw_fw = {"numpy": raw_np, "torch": raw.get("torch.randn (CPU)", raw_np),
                      "optax": raw.get("jax.random.normal (CPU, jit)", raw_np)}[fw]
            ref = plain_np + raw_fw
            res["dense"][fw] = (early, late, ref)
            print(f"  {fw:6s} step 10 {early * 1e3:8.2f} ms  step n-1 {late * 1e3:8.2f} ms  "
                  f"{n} multiply-adds + 1 row {ref * 1e3:8.2f} ms  ratio {late / ref:5.2f}")
            del stream
    blas.restore_original_limits()
    load1 = os.getloadavg()
    res["load_after"] = load1
    print(f"\nload average after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
