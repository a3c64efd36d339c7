#!/usr/bin/env python
"""Benchmark: correlated-noise streams at d = 1,000,000 parameters, n = 2048 steps.

Side by side in one run, for the optimal heavy-ball momentum factorization (beta = 0.9):

* dense regeneration (the artifact's C^-1, every Z[j], j <= t, regenerated each step: O(t d));
* dense with a stored noise history (the alternative: keep Z[0..t] in memory, one
  matrix-vector product per step: O(t d) time and (t + 1) d floats);
* compressed decoders B^ = band_K(B) + mask(U V^T) for several (K, R): banded-low-rank streams,
  O((K + p + R) d) per step (p = 2 sub-diagonals of A^-1 for momentum gradient noise).

Reported per setting: loss increase of the compressed mechanism over the dense optimum
(recomputed here: sens(B^-1 A)^2 ||B^||_F^2), median seconds per step and steps per second for
gradient noise (C^-1 Z) and iterate noise (B Z), and peak memory (tracemalloc, in units of d
floats of the stream dtype) against the target budget (K + R + 4) d.

The dense streams cost O(t d) per step, so they are timed (CPU time) at a few steps t and
summarised by the mean over a full run, sum_t (t + 1) x (cost per noise row) / n.

Timings: median over the timed steps of the process CPU time (what a dedicated core takes) and of
the wall-clock time (which on a shared machine also counts waiting for a core). With threads > 1
the CPU time adds up all threads, so read the wall-clock column for the parallel speed-up.

Usage:
    OPENBLAS_NUM_THREADS=1 python scripts/bench_noise.py                 # full (about 10 min)
    python scripts/bench_noise.py --d 100000 --n 256 --steps 5           # quick look
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.linalg
from threadpoolctl import threadpool_info

from mfcli.io.artifact import load_artifact, save_artifact
from mfcli.model.factorization import sensitivity
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.training.noise import noise_matrix, noise_stream

SEED = 0x5EED_2048


def parse_settings(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        k, r = item.split(":")
        out.append((int(k), int(r)))
    return out


def optimal_artifact(n: int, beta: float, path: Path) -> Path:
    if path.exists():
        art = load_artifact(path)
        if art.n == n and art.workload_name == "momentum":
            return path
        raise SystemExit(f"{path} is not a momentum n = {n} artifact")
    print(f"solving the optimal momentum factorization n = {n} (a few minutes) ...", file=sys.stderr)
    w = momentum_workload(n, beta=beta)
    res = optimal_factorization(w.matrix, tol=1e-6)
    save_artifact(path, res.factorization, workload_name="momentum", workload_params=w.params,
                  strategy_name="optimal", solver=res.certificate(), command="scripts/bench_noise.py")
    return path


def masked_als(decoder: np.ndarray, k: int, r: int, iters: int = 30) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fallback fit when mfcli.services.compress is absent: least squares on the entries j <= t - K."""
    n = decoder.shape[0]
    band = np.zeros((n, k))
    for i in range(k):
        band[i:, i] = np.diagonal(decoder, -i)
    mask = np.tril(np.ones((n, n)), -k)
    target = decoder * mask
    left, s, right = np.linalg.svd(target)
    u, v = left[:, :r] * s[:r], right[:r].T.copy()
    ridge = 1e-12 * max(1.0, float(s[0]) if s.size else 1.0)
    for _ in range(iters):
        for t in range(k, n):
            cols = np.arange(t - k + 1)
            vv = v[cols]
            u[t] = np.linalg.solve(vv.T @ vv + ridge * np.eye(r), vv.T @ target[t, cols])
        for j in range(n - k):
            rows = np.arange(j + k, n)
            uu = u[rows]
            v[j] = np.linalg.solve(uu.T @ uu + ridge * np.eye(r), uu.T @ target[rows, j])
    u[:k] = 0.0
    v[n - k:] = 0.0
    return band, u, v


def compressed_group(fact, k: int, r: int) -> tuple[dict, str]:
    try:
        from mfcli.services.compress import compress_factorization
    except ImportError:
        compress_factorization = None
    if compress_factorization is not None:
        comp = compress_factorization(fact, band=k, rank=r)
        return comp.group(), "mfcli.services.compress (ALS)"
    band, u, v = masked_als(fact.decoder, k, r)
    n = fact.n
    b_hat = np.where(np.tril(np.ones((n, n)), -k) > 0, u @ v.T, np.tril(fact.decoder))
    c_hat = scipy.linalg.solve_triangular(b_hat, fact.workload, lower=True)
    sens = sensitivity(c_hat)
    loss = sens**2 * float(np.sum(b_hat**2))
    attrs = {"band": k, "rank": r, "sensitivity": sens, "loss_total": loss,
             "loss_increase": loss / fact.loss_total - 1.0}
    return {"datasets": {"band": band, "u": u, "v": v}, "attrs": attrs}, "script ALS fallback"


def loss_increase_recomputed(stream, fact) -> float:
    """sens(C^)^2 ||B^||_F^2 / loss(dense) - 1 from the stream's own B^ (iterate operator)."""
    b_hat = stream.operator_matrix()
    c_hat = scipy.linalg.solve_triangular(b_hat, fact.workload, lower=True)
    return sensitivity(c_hat) ** 2 * float(np.sum(b_hat**2)) / fact.loss_total - 1.0


def time_steps(stream, warm: int, steps: int) -> tuple[float, float]:
    """Median wall-clock and median process CPU seconds per step (CPU time is what a dedicated
    core would take; on a shared machine wall time also counts waiting for a core)."""
    state = stream.init()
    for _ in range(warm):
        _, state = stream.next(state)
    wall, cpu = [], []
    for _ in range(steps):
        c0, t0 = time.process_time(), time.perf_counter()
        row, state = stream.next(state)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        del row
    return statistics.median(wall), statistics.median(cpu)


def peak_memory_floats(stream, steps: int) -> float:
    """tracemalloc peak (numpy reports its buffers to it) over init + steps, in d floats."""
    gc.collect()
    tracemalloc.start()
    try:
        state = stream.init()
        row = None
        for _ in range(steps):
            row, state = stream.next(state)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del row, state
    return peak / (stream.d * stream.dtype.itemsize)


def dense_regeneration(path: Path, d: int, dtype: str, ts: list[int], n: int) -> dict:
    stream = noise_stream(path, kind="gradient", d=d, seed=SEED, dtype=dtype, variant="dense")
    per_row = []
    detail = {}
    for t in ts:
        state = stream.state_at(t)            # cheap: a regenerating stream has no buffers
        c0 = time.process_time()
        row, _ = stream.next(state)
        dt = time.process_time() - c0
        nnz = int(np.count_nonzero(stream.operator.row(t)))
        per_row.append(dt / nnz)
        detail[t] = dt
        del row
    cost = statistics.median(per_row)
    mean_step = cost * (n + 1) / 2
    gc.collect()
    tracemalloc.start()
    try:
        _row, _ = stream.next(stream.state_at(min(ts)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"per_row_s": cost, "step_s_at": detail, "mean_step_s": mean_step,
            "peak_floats": peak / (d * np.dtype(dtype).itemsize)}


def dense_history(path: Path, d: int, dtype: str, rows: int, n: int, repeats: int) -> dict:
    art = load_artifact(path)
    cinv = art.factorization.noising_matrix().astype(dtype)
    z = noise_matrix(SEED, rows, d, dtype)       # the stored history Z[0..rows-1]
    t = rows - 1
    times = []
    for _ in range(repeats):
        c0 = time.process_time()
        row = cinv[t, :rows] @ z
        times.append(time.process_time() - c0)
        del row
    step = statistics.median(times)
    per_row = step / rows
    return {"rows": rows, "step_s": step, "per_row_s": per_row, "mean_step_s": per_row * (n + 1) / 2,
            "memory_floats_at_end": n + 1}


def blas_threads() -> str:
    info = threadpool_info()
    return ", ".join(f"{i.get('internal_api')}={i.get('num_threads')}" for i in info) or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=1_000_000)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--beta", type=float, default=0.9)
    ap.add_argument("--artifact", type=Path, default=None,
                    help="optimal momentum artifact (solved and written here if missing)")
    ap.add_argument("--settings", default="4:4,8:8,16:8,32:8,16:16", help="K:R pairs")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--threads", default="1,2", help="thread counts for the compressed streams")
    ap.add_argument("--steps", type=int, default=21, help="timed steps per compressed setting")
    ap.add_argument("--dense-ts", default="15,127,255", help="steps t at which dense regeneration is timed")
    ap.add_argument("--history-rows", type=int, default=256, help="stored rows for the history alternative")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    print(f"# bench_noise: d = {args.d:,}, n = {args.n}, momentum beta = {args.beta}")
    print(f"# BLAS threads: {blas_threads()}; load average: {os.getloadavg()}; "
          f"cpus: {os.cpu_count()}; numpy {np.__version__}")
    print("# the machine is shared with other jobs: expect noisy timings (medians reported)")
    work = Path(tempfile.mkdtemp(prefix="bench-noise-"))
    art_path = optimal_artifact(args.n, args.beta, args.artifact or work / f"momentum-n{args.n}.h5")
    fact = load_artifact(art_path).factorization
    dtypes = [x for x in args.dtypes.split(",") if x]
    results: dict = {"d": args.d, "n": args.n, "blas": blas_threads(), "load": os.getloadavg(), "rows": []}

    header = ("| setting | dtype | threads | loss increase | method | W + R | gradient steps/s, CPU (wall) | "
              "iterate steps/s, CPU (wall) | peak memory (d floats) | budget (K+R+4) |")
    lines = [header, "|" + "---|" * 10]
    thread_counts = [int(x) for x in args.threads.split(",") if x]

    for k, r in parse_settings(args.settings):
        t0 = time.perf_counter()
        group, fitter = compressed_group(fact, k, r)
        path = work / f"k{k}r{r}.h5"
        save_artifact(path, fact, workload_name="momentum", workload_params={"beta": args.beta},
                      strategy_name="optimal", groups={"compressed": group}, force=True)
        fit_s = time.perf_counter() - t0
        for dtype, threads in [(dt, th) for dt in dtypes for th in thread_counts]:
            grad = noise_stream(path, kind="gradient", d=args.d, seed=SEED, dtype=dtype, threads=threads)
            it = noise_stream(path, kind="iterate", d=args.d, seed=SEED, dtype=dtype, threads=threads)
            inc = loss_increase_recomputed(it, fact)
            stored = float(group["attrs"]["loss_increase"])
            assert abs(inc - stored) <= 1e-6 * max(1.0, abs(stored)), (inc, stored)
            warm = grad.width + 1
            g_wall, g_cpu = time_steps(grad, warm, args.steps)
            i_wall, i_cpu = time_steps(it, it.width + 1, args.steps)
            peak = peak_memory_floats(grad, grad.width + 3)
            row = {"K": k, "R": r, "dtype": dtype, "threads": threads, "loss_increase": inc, "fitter": fitter,
                   "fit_s": fit_s, "method": grad.method, "W": grad.width,
                   "gradient_step_wall_s": g_wall, "gradient_step_cpu_s": g_cpu,
                   "iterate_step_wall_s": i_wall, "iterate_step_cpu_s": i_cpu,
                   "peak_floats": peak, "budget_floats": k + r + 4, "load": os.getloadavg()}
            results["rows"].append(row)
            lines.append(
                f"| K={k}, R={r} | {dtype} | {threads} | {100 * inc:.2f}% | {grad.method} | {grad.width}+{r} | "
                f"{1 / g_cpu:.1f} ({1 / g_wall:.1f}) | {1 / i_cpu:.1f} ({1 / i_wall:.1f}) | {peak:.3f} | {k + r + 4} |"
            )
            print(lines[-1], flush=True)
            del grad, it
            gc.collect()

    ts = [int(x) for x in args.dense_ts.split(",") if x]
    for dtype in dtypes:
        dense = dense_regeneration(art_path, args.d, dtype, ts, args.n)
        results["rows"].append({"setting": "dense regeneration", "dtype": dtype, **dense})
        at = ", ".join(f"t={t}: {s:.2f} s" for t, s in dense["step_s_at"].items())
        lines.append(
            f"| dense, regenerate Z | {dtype} | 1 | 0 | regenerate | t+1 rows | {1 / dense['mean_step_s']:.3f} (mean; {at}) | "
            f"- | {dense['peak_floats']:.3f} | - |"
        )
        print(lines[-1], flush=True)
        hist = dense_history(art_path, args.d, dtype, args.history_rows, args.n, repeats=5)
        results["rows"].append({"setting": "dense stored history", "dtype": dtype, **hist})
        lines.append(
            f"| dense, stored Z history | {dtype} | 1 | 0 | gemv over t+1 rows | t+1 rows | "
            f"{1 / hist['mean_step_s']:.3f} (mean; t={hist['rows'] - 1}: {hist['step_s']:.3f} s) | - | "
            f"up to {hist['memory_floats_at_end']} | - |"
        )
        print(lines[-1], flush=True)
        gc.collect()

    print()
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
