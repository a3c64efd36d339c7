"""Timings for `mfcli compare`: each strategy's construction, and the structured Honaker
constructions against the explicit pseudo-inverses they replace, side by side in one run.

Usage: python scripts/bench_compare.py [--repeats 3] [--quick]

Prints medians of repeated runs, the BLAS thread count (threadpoolctl) and the load average
before and after: the machine may be shared with other work, which inflates wall-clock times.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info

from mfcli.model.workloads import build_workload
from mfcli.strategies.baselines import (
    STRATEGY_NAMES,
    build_strategy,
    honaker_full_decoder,
    honaker_online_decoder,
    tree_release_steps,
    tree_strategy_matrix,
)


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def online_by_pinv(n: int) -> np.ndarray:
    """The definition: row t = S_t C_t^+ over the rows released by step t (n pseudo-inverses)."""
    c = tree_strategy_matrix(n)
    r = tree_release_steps(n)
    b = np.zeros((n, c.shape[0]))
    for t in range(n):
        closed = r <= t
        ones = np.zeros(n)
        ones[: t + 1] = 1.0
        b[t, closed] = ones @ np.linalg.pinv(c[closed])
    return b


def full_by_pinv(n: int) -> np.ndarray:
    c = tree_strategy_matrix(n)
    return np.tril(np.ones((n, n))) @ np.linalg.pinv(c)


def full_by_normal_equations(n: int) -> np.ndarray:
    import scipy.linalg

    c = tree_strategy_matrix(n)
    g = c.T @ c
    x = scipy.linalg.cho_solve(scipy.linalg.cho_factor(g), c.T)  # C^+ = (C^T C)^-1 C^T
    return np.cumsum(x, axis=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    args = ap.parse_args()
    blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info()]
    print(f"BLAS: {blas}; load average before: {os.getloadavg()}; cpus: {os.cpu_count()}")

    print("\n## Honaker constructions: structured vs explicit pseudo-inverses (median seconds)")
    print("(n pinvs only for n <= 128 and the SVD pinv only for n <= 512: they take minutes beyond)")
    print("| n | online: closed form | online: n pinvs | max abs diff "
          "| full: two-pass | full: pinv (SVD) | full: normal eq. | max abs diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in ((32, 64) if args.quick else (64, 128, 512, 2048)):
        t_on, b_on = median_time(lambda n=n: honaker_online_decoder(n), args.repeats)
        if n <= 128:
            t_on_p, b_on_p = median_time(lambda n=n: online_by_pinv(n), 1)
            d_on = f"{np.max(np.abs(b_on - b_on_p)):.1e}"
            t_on_p_s = f"{t_on_p:.3f}"
        else:
            t_on_p_s, d_on = "(skipped)", "-"
        t_full, b_full = median_time(lambda n=n: honaker_full_decoder(n), args.repeats)
        t_ne, b_ne = median_time(lambda n=n: full_by_normal_equations(n), args.repeats)
        d_full = np.max(np.abs(b_full - b_ne))
        if n <= 512:
            t_pinv, b_pinv = median_time(lambda n=n: full_by_pinv(n), 1)
            d_full = max(d_full, np.max(np.abs(b_full - b_pinv)))
            t_pinv_s = f"{t_pinv:.3f}"
        else:
            t_pinv_s = "(skipped)"
        print(
            f"| {n} | {t_on:.4f} | {t_on_p_s} | {d_on} | {t_full:.4f} | {t_pinv_s} | {t_ne:.3f} | {d_full:.1e} |"
        )

    print("\n## Building each strategy for the compare tables (median seconds; optimal: one run)")
    print("| workload | n | " + " | ".join(STRATEGY_NAMES) + " |")
    print("|---|---:|" + "---:|" * len(STRATEGY_NAMES))
    cases = (("prefix", 256), ("momentum", 128)) if args.quick else (("prefix", 2048), ("momentum", 1024))
    for wname, n in cases:
        w = build_workload(wname, n)
        cells = []
        for name in STRATEGY_NAMES:
            reps = 1 if name == "optimal" else args.repeats
            t, _ = median_time(lambda name=name, w=w: build_strategy(name, w), reps)
            cells.append(f"{t:.2f}")
        print(f"| {wname} | {n} | " + " | ".join(cells) + " |")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
