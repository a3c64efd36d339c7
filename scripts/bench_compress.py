"""Benchmark ``mfcli compress``: loss increase over a (K, R) grid, ALS variants side by side,
the automatic search against the grid's brute-force optimum, and timings (docs/compress.md).

Usage::

    python scripts/bench_compress.py --artifact /tmp/momentum-n2048.h5      # an existing artifact
    python scripts/bench_compress.py --n 2048 --beta 0.9                     # solve first (~1-2 min)
    python scripts/bench_compress.py --quick                                 # n = 256, small grid

Prints markdown tables on stdout. Timings are medians of ``--repeats`` runs. The machine is
shared with other jobs: the BLAS thread count and the load average are printed with the numbers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.linalg
from threadpoolctl import threadpool_info

from mfcli.io.artifact import load_artifact, shipped_artifact
from mfcli.model.factorization import Factorization, sensitivity
from mfcli.services.compress import (
    _embed,
    als_iterates,
    compress_factorization,
    masked_block,
    search_compression,
)
from mfcli.strategies.operators import BandedLowRank, CompressedOperator, band_values, strategy_for_decoder


def environment() -> str:
    threads = ", ".join(f"{i['internal_api']} {i['num_threads']} thread(s)" for i in threadpool_info())
    load = os.getloadavg()
    loads = f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    return f"BLAS: {threads or 'none found'}; load average {loads}; {os.cpu_count()} CPUs (shared)"


def get_factorization(args: argparse.Namespace) -> tuple[Factorization, str]:
    if args.quick:
        return load_artifact(shipped_artifact("momentum-n256")).factorization, "shipped momentum-n256"
    if args.artifact and Path(args.artifact).exists():
        return load_artifact(args.artifact).factorization, str(args.artifact)
    from mfcli.model.workloads import momentum_workload
    from mfcli.optimize.dense import optimal_factorization

    print(f"solving momentum n = {args.n}, beta = {args.beta} ...", file=sys.stderr, flush=True)
    res = optimal_factorization(momentum_workload(args.n, beta=args.beta).matrix, tol=1e-6)
    return res.factorization, f"momentum n={args.n} beta={args.beta} solved here (gap {res.gap:.1e})"


def loss_of(a: np.ndarray, b_hat: np.ndarray) -> float:
    c = strategy_for_decoder(a, b_hat)
    return sensitivity(c) ** 2 * float(np.sum(b_hat * b_hat))


def variants(fact: Factorization, k: int, r: int, iters: int) -> dict[str, float]:
    """Loss increase of three ways to get U, V: the SVD start only, ALS run for ``iters``
    iterations (Frobenius fit), and mfcli's loss-selected ALS iterate."""
    n = fact.n
    base = fact.loss_total
    bv = band_values(fact.decoder, k)
    out: dict[str, float] = {}
    block = masked_block(fact.decoder, k)
    last = None
    for it, u, v in als_iterates(block, r, max_iter=iters):
        if it == 0:
            uf, vf = _embed(u, v, n, k)
            out["svd start"] = loss_of(fact.workload, BandedLowRank(band=bv, u=uf, v=vf).dense()) / base - 1
        last = (u, v)
    uf, vf = _embed(*last, n, k)
    out[f"ALS {iters} it"] = loss_of(fact.workload, BandedLowRank(band=bv, u=uf, v=vf).dense()) / base - 1
    comp = compress_factorization(fact, band=k, rank=r)
    out["loss-selected (mfcli)"] = comp.loss_increase
    out["iterations kept"] = comp.als_iterations
    return out


def median_time(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", default="/tmp/momentum-n2048.h5")
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--beta", type=float, default=0.9)
    p.add_argument("--bands", default="1,2,3,4,6,8,12,16,24,32,48,64")
    p.add_argument("--ranks", default="0,1,2,3,4,6,8,12,16")
    p.add_argument("--budget", type=float, default=0.01, help="loss-increase budget for the search")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="shipped n = 256 artifact, small grid")
    args = p.parse_args()
    if args.quick:
        args.bands, args.ranks, args.repeats = "1,2,4,8,16", "0,1,2,4,8", 1

    fact, source = get_factorization(args)
    n = fact.n
    bands = [int(x) for x in args.bands.split(",") if int(x) <= n]
    ranks = [int(x) for x in args.ranks.split(",")]
    print(f"# bench_compress: {source}\n")
    print(f"- n = {n}, dense loss_total = {fact.loss_total:.10g}, sens(C) = {fact.sensitivity:.12g}")
    print(f"- {environment()}\n")

    # 1. Grid of loss increases.
    t_grid = time.perf_counter()
    grid: dict[tuple[int, int], CompressedOperator] = {}
    for k in bands:
        for r in ranks:
            if r <= n - k:
                grid[(k, r)] = compress_factorization(fact, band=k, rank=r)
                c = grid[(k, r)]
                print(f"  K={k} R={r} increase {c.loss_increase:.4e} sens {c.sensitivity:.6f}", file=sys.stderr, flush=True)
    t_grid = time.perf_counter() - t_grid
    print("## Loss increase (compressed loss / dense loss - 1) for K (rows) x R (columns)\n")
    print("| K \\ R | " + " | ".join(str(r) for r in ranks) + " |")
    print("|---" * (len(ranks) + 1) + "|")
    for k in bands:
        cells = []
        for r in ranks:
            c = grid.get((k, r))
            if c is None:
                cells.append("-")
            else:
                mark = "**" if c.loss_increase <= args.budget else ""
                cells.append(f"{mark}{c.loss_increase:.2e}{mark}")
        print(f"| {k} | " + " | ".join(cells) + " |")
    print(f"\nBold: within the {args.budget:.0%} budget. Grid of {len(grid)} settings took {t_grid:.0f} s.\n")

    feasible = [(k + r, c.loss_increase, k, r) for (k, r), c in grid.items() if c.loss_increase <= args.budget]
    if feasible:
        cost, inc, k, r = min(feasible)
        print(f"Cheapest grid setting within {args.budget:.0%}: K = {k}, R = {r} (cost K + R = {cost}, increase {inc:.3%}).\n")
        print("Within-budget settings by cost (first 10):\n")
        print("| K | R | K + R | loss increase | sens(C^) |")
        print("|---|---|---|---|---|")
        for cost, inc, k, r in sorted(feasible)[:10]:
            print(f"| {k} | {r} | {cost} | {inc:.3e} | {grid[(k, r)].sensitivity:.6f} |")
        print()

    # 2. ALS variants side by side.
    print("## How U, V are chosen: loss increase of three variants\n")
    probe = [(k, r) for (k, r) in ((2, 2), (4, 4), (8, 8), (16, 16), (4, 12), (16, 4)) if r <= n - k]
    names = ["svd start", "ALS 64 it", "loss-selected (mfcli)", "iterations kept"]
    print("| K | R | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for k, r in probe:
        res = variants(fact, k, r, 64)
        print(f"| {k} | {r} | " + " | ".join(
            (f"{res[x]:.3e}" if x != "iterations kept" else str(res[x])) for x in names) + " |")
    print()

    # 3. The search against the grid.
    t = time.perf_counter()
    found = search_compression(fact, max_loss_increase=args.budget)
    t = time.perf_counter() - t
    c = found.compression
    print(f"## Automatic search (--max-loss-increase {args.budget:g})\n")
    print(f"Chose K = {c.band}, R = {c.rank} (cost {c.stream_cost}, increase {c.loss_increase:.3%}) "
          f"after {len(found.evaluations)} evaluations in {t:.0f} s (full grid above: {len(grid)} settings).\n")

    # 4. Timings (medians).
    print(f"## Timings (median of {args.repeats})\n")
    print("| operation | seconds |")
    print("|---|---|")
    b_hat = grid[(bands[min(3, len(bands) - 1)], ranks[min(3, len(ranks) - 1)])].decoder
    full = median_time(lambda: scipy.linalg.solve_triangular(b_hat, fact.workload, lower=True), args.repeats)
    blocked = median_time(lambda: strategy_for_decoder(fact.workload, b_hat), args.repeats)
    print(f"| C^ = B^-1 A, one triangular solve | {full:.3f} |")
    print(f"| C^ = B^-1 A, blocked (mfcli) | {blocked:.3f} |")
    for k, r in ((8, 8), (16, 16)):
        if r <= n - k:
            s = median_time(lambda k=k, r=r: compress_factorization(fact, band=k, rank=r), args.repeats)
            print(f"| compress K = {k}, R = {r} | {s:.2f} |")
    print(f"\n- {environment()}")


if __name__ == "__main__":
    main()
