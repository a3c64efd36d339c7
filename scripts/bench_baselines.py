#!/usr/bin/env python
"""Benchmark of the baselines' mechanisms of any n (docs/performance.md, "Baselines at any n").

For each baseline (identity, tree, honaker-online, honaker-full, sqrt) on the prefix workload:
CPU seconds (time.process_time) of ``baseline_mechanism(name, workload, n).loss()`` (what
``mfcli compare`` computes per row above the dense limit), median of ``--repeats`` runs, at
n = 4096 side by side with the dense path it replaces there (``build_strategy`` + the decoder's row
norms, what ``compare`` runs below the limit), and at n = 65536 and 10^6 alone (no dense path
exists there), with the largest relative difference of the per-step errors where both ran.
Also the tree's noise stream at n = 10^6: CPU seconds per step for d = 10^5 parameters (float32)
and the floats its state holds.

Run:  OPENBLAS_NUM_THREADS=1 nice python scripts/bench_baselines.py [--repeats 3]
The machine is shared: the load average and the BLAS threads (threadpoolctl) are printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

BASELINES = ("identity", "tree", "honaker-online", "honaker-full", "sqrt")


def cpu(f, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.process_time()
        out = f()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from threadpoolctl import threadpool_info

    from mfcli.strategies.baseline_mechanisms import baseline_mechanism
    from mfcli.strategies.baselines import build_strategy
    from mfcli.strategies.toeplitz import materialize, toeplitz_workload
    from mfcli.training.noise import _stream_of

    print(f"load average {os.getloadavg()}, BLAS threads {[i.get('num_threads') for i in threadpool_info()]}")
    w = toeplitz_workload("prefix")
    print("| n | strategy | mechanism loss (s) | dense path (s) | max rel. diff | RMSE |")
    print("|---|---|---|---|---|---|")
    for n in (4096, 65536, 10**6):
        for name in BASELINES:
            t_mech, loss = cpu(lambda: baseline_mechanism(name, w, n).loss(), args.repeats)  # noqa: B023
            dense_t, diff = "-", "-"
            if n <= 4096:
                t_dense, fact = cpu(lambda: build_strategy(name, materialize(w.coefs(n), n)).factorization,  # noqa: B023
                                    args.repeats)
                per_step = fact.per_step_error  # type: ignore[attr-defined]
                dense_t = f"{t_dense:.3f}"
                diff = f"{float(np.max(np.abs(loss.per_step - per_step) / per_step)):.1e}"  # type: ignore[attr-defined]
            rmse = float(np.sqrt(np.mean(loss.per_step)))  # type: ignore[attr-defined]
            print(f"| {n} | {name} | {t_mech:.3f} | {dense_t} | {diff} | {rmse:.6g} |")
    n, d = 10**6, 10**5
    s = _stream_of(baseline_mechanism("tree", w, n), kind="iterate", d=d, seed=1, dtype=np.dtype("float32"),
                   threads=1, max_memory=None, where="bench", workload_name="prefix", workload_params={})
    state = s.init()
    steps = 2000
    t0 = time.process_time()
    for _ in range(steps):
        _, state = s.next(state)
    per = (time.process_time() - t0) / steps
    print(f"\ntree noise stream, n = {n}, d = {d}, float32: {per * 1e3:.3f} ms CPU per step (mean of {steps}), "
          f"state {s.memory_floats()} floats ({s.rank} rows of d besides the output row)")


if __name__ == "__main__":
    main()
