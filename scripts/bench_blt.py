#!/usr/bin/env python
"""Benchmark of mfcli's BLT library (mfcli/strategies/blt.py), side by side with jax_privacy 2.0 when installed.

Every loss in the table is evaluated by mfcli's O(n d) evaluator (``BufferedToeplitz.loss``) from
the returned parameters, for both libraries, so the columns compare strategies, not evaluators.

Sections:

1. accuracy against the certified dense optimum (mfcli.optimize.dense, prefix sums, single participation,
   n = 2048, mean error; the dense optimum minimises mean loss, so it is the reference there);
2. max-error gates: sqrt(max loss) / (1 + ln(n) / pi) at n = 10^4 (4 buffers, gate 1.03) and
   n = 10^6 (5 buffers, gate 1.05), the bounds jax_privacy's own tests enforce;
3. optimisation wall time (median of repeats) at n = 10^5 (4 buffers, gate 10 s) and 10^6
   (5 buffers, gate 60 s), single participation, max error;
4. the gradient noise stream at d = 10^6 with 4 buffers (gate 50 steps/s);
5. optimisation CPU time by objective: max error, mean error with the closed forms (O(d^2) per
   evaluation; O(epochs d^2) under fixed epochs), and mean error with the O(n d) evaluator the
   optimiser used before (``--direct``-style switch ``mfcli.strategies.blt._FORCE_DIRECT_OBJECTIVE``), side by
   side in one run, with the losses reached (gate: mean at most 2x max).

Section 5 alone: ``python scripts/bench_blt.py --objective-only [--direct-max-n N]`` (the O(n d)
mean-error run at n = 10^6 takes about ten minutes; by default it runs up to n = 10^5).

Run with jax_privacy (its venv has numpy, scipy, h5py and threadpoolctl; mfcli comes from the path):
    PYTHONPATH=$PWD /work/jpvenv/bin/python scripts/bench_blt.py
Without it (jax_privacy columns say "n/a"):
    python scripts/bench_blt.py [--quick]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

from mfcli.strategies.blt import BufferedToeplitz, optimize_blt


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _jax_privacy():
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        from jax_privacy.matrix_factorization import buffered_toeplitz as bt
    except ImportError:
        return None
    return bt


def _jp_optimize(bt, n: int, buffers: int, error: str) -> tuple[BufferedToeplitz, float]:
    t0 = time.perf_counter()
    blt = bt.optimize(n=n, error=error, min_buffers=buffers, max_buffers=buffers)
    secs = time.perf_counter() - t0
    return BufferedToeplitz(theta=np.asarray(blt.buf_decay), omega=np.asarray(blt.output_scale)), secs


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jp-repeats", type=int, default=1, help="timed runs of jax_privacy (slow on CPU)")
    parser.add_argument("--quick", action="store_true", help="skip n = 10^6 and the dense n = 2048 solve")
    parser.add_argument("--stream-only", action="store_true", help="section 4 only")
    parser.add_argument("--objective-only", action="store_true", help="section 5 only")
    parser.add_argument("--direct-max-n", type=int, default=10**5,
                        help="largest n at which section 5 also times the O(n d) objective")
    args = parser.parse_args()
    bt = _jax_privacy()
    pools = sorted({(i["internal_api"], i["num_threads"]) for i in threadpool_info()})
    print(f"load {_load()}, {os.cpu_count()} CPUs, BLAS (threadpoolctl) {pools}, "
          f"jax_privacy {'installed' if bt else 'not installed'}\n")

    if args.objective_only:
        objective_section(args)
        return
    if not args.stream_only:
        optimisation(args, bt)
    stream_section()
    if not args.stream_only:
        objective_section(args)


def objective_section(args: argparse.Namespace) -> None:
    import mfcli.strategies.blt as blt_module
    from mfcli.model.participation import FixedEpoch

    print(f"\n## 5. Optimisation CPU time by objective (median of {args.repeats}; O(n d) objective once)\n")
    print("| n | buffers | schema | workload | max error (s) | mean, closed form (s) | mean / max | "
          "mean, O(n d) objective (s) | speed-up | mean loss closed | mean loss O(n d) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [(10**4, 4, None, "prefix"), (10**5, 4, None, "prefix"), (10**5, 4, None, "momentum"),
             (10**5, 4, 10, "prefix"), (10**5, 4, 10, "momentum")]
    if not args.quick:
        cases.append((10**6, 5, None, "prefix"))
    for n, buffers, epochs, workload in cases:
        schema = FixedEpoch(epochs=epochs) if epochs else None
        kw = dict(n=n, buffers=buffers, schema=schema, workload=workload)

        def run(error: str, kw: dict = kw) -> float:
            return optimize_blt(error=error, **kw).loss

        t_max = statistics.median(_cpu(lambda: run("max")) for _ in range(args.repeats))
        t_mean = statistics.median(_cpu(lambda: run("mean")) for _ in range(args.repeats))
        loss = run("mean")
        if n <= args.direct_max_n:
            blt_module._FORCE_DIRECT_OBJECTIVE = True
            try:
                got: list[float] = []
                t_direct = _cpu(lambda got=got: got.append(run("mean")))
            finally:
                blt_module._FORCE_DIRECT_OBJECTIVE = False
            dcols = f"{t_direct:.2f} | {t_direct / t_mean:.0f}x | {loss:.9g} | {got[0]:.9g}"
        else:
            dcols = f"not run (n > {args.direct_max_n}) | | {loss:.9g} | "
        where = f"{epochs} epochs" if epochs else "single"
        print(f"| {n} | {buffers} | {where} | {workload} | {t_max:.2f} | {t_mean:.2f} | {t_mean / t_max:.2f} | {dcols} |")
    print(f"\nload at the end: {_load()}")


def optimisation(args: argparse.Namespace, bt) -> None:
    print("## 1. Mean loss against the certified dense optimum (prefix, single participation)\n")
    print("| n | buffers | dense optimum (gap) | mfcli BLT | ratio | jax_privacy BLT | ratio |")
    print("|---|---|---|---|---|---|---|")
    n = 512 if args.quick else 2048
    from mfcli.model.workloads import prefix_workload
    from mfcli.optimize.dense import optimal_factorization

    res = optimal_factorization(prefix_workload(n).matrix, tol=1e-8)
    dense = res.factorization.loss_mean
    for buffers in (3, 5):
        ours = optimize_blt(n=n, buffers=buffers, error="mean").loss
        if bt:
            jp, _ = _jp_optimize(bt, n, buffers, "mean")
            jpl = jp.loss(n, error="mean")
            jcol = f"{jpl:.9g} | {jpl / dense:.5f}"
        else:
            jcol = "n/a | n/a"
        print(f"| {n} | {buffers} | {dense:.9g} ({res.gap:.1e}) | {ours:.9g} | {ours / dense:.5f} | {jcol} |")

    print("\n## 2. Max-loss gates: sqrt(max loss) / (1 + ln(n)/pi)\n")
    print("| n | buffers | gate | mfcli | jax_privacy |")
    print("|---|---|---|---|---|")
    cases = [(10**4, 4, 1.03)] + ([] if args.quick else [(10**6, 5, 1.05)])
    for n, buffers, gate in cases:
        ref = 1 + math.log(n) / math.pi
        ours = math.sqrt(optimize_blt(n=n, buffers=buffers).loss) / ref
        if bt:
            jp, _ = _jp_optimize(bt, n, buffers, "max")
            jcol = f"{math.sqrt(jp.loss(n)) / ref:.4f}"
        else:
            jcol = "n/a"
        print(f"| {n} | {buffers} | {gate} | {ours:.4f} | {jcol} |")

    print(f"\n## 3. Optimisation wall time, max error (median of {args.repeats}; jax_privacy {args.jp_repeats})\n")
    print("| n | buffers | gate (s) | mfcli wall (s) | mfcli CPU (s) | jax_privacy wall (s) |")
    print("|---|---|---|---|---|---|")
    cases = [(10**5, 4, 10)] + ([] if args.quick else [(10**6, 5, 60)])
    for n, buffers, gate in cases:
        def run(n: int = n, buffers: int = buffers) -> None:
            optimize_blt(n=n, buffers=buffers)

        ours = statistics.median(_timed(run) for _ in range(args.repeats))
        cpu = statistics.median(_cpu(run) for _ in range(args.repeats))
        jcol = f"{statistics.median(_jp_optimize(bt, n, buffers, 'max')[1] for _ in range(args.jp_repeats)):.2f}" if bt else "n/a"
        print(f"| {n} | {buffers} | {gate} | {ours:.2f} | {cpu:.2f} | {jcol} |")



def stream_section() -> None:
    from mfcli.training.noise import noise_row, strategy_stream

    print("\n## 4. Gradient noise stream C^-1 Z, d = 10^6, 4 buffers\n")
    blt = optimize_blt(n=10**4, buffers=4).blt
    rates = []
    for dtype, threads in (("float64", 1), ("float64", 2), ("float32", 1), ("float32", 2)):
        stream = strategy_stream(blt, n=10**4, seed=1, d=10**6, threads=threads, dtype=dtype)
        _, state = stream.next(stream.init())
        walls, cpus = [], []
        for _ in range(30):
            t0, c0 = time.perf_counter(), time.process_time()
            _, state = stream.next(state)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        rates.append((dtype, threads, 1 / statistics.median(walls), 1 / statistics.median(cpus),
                      stream.memory_floats() * np.dtype(dtype).itemsize / 2**20))
    # On a shared machine wall time measures the load; CPU seconds (all threads of this process)
    # are what one step costs.
    for dtype in ("float64", "float32"):  # the ceiling: drawing Z's row alone (Philox normals)
        walls, cpus = [], []
        for j in range(30):
            t0, c0 = time.perf_counter(), time.process_time()
            noise_row(1, j, 10**6, dtype)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        mib = 10**6 * np.dtype(dtype).itemsize / 2**20
        rates.append((f"{dtype} (Z row only)", 1, 1 / statistics.median(walls), 1 / statistics.median(cpus), mib))
    print("| dtype | threads | steps/s (wall, median) | steps per CPU second (median) | gate | memory (MiB) |")
    print("|---|---|---|---|---|---|")
    for dtype, threads, rate, cpu_rate, mib in rates:
        print(f"| {dtype} | {threads} | {rate:.1f} | {cpu_rate:.1f} | 50 | {mib:.0f} |")
    print(f"\nload at the end: {_load()}")

if __name__ == "__main__":
    main()
