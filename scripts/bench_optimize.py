#!/usr/bin/env python
"""Benchmark of the optimal-factorization solver: plain fixed point vs Anderson vs Newton.

Runs every (workload, n, method) case in a fresh subprocess (so that peak memory, ru_maxrss,
belongs to that one solve), repeats it, and prints one Markdown table with

* iterations: full-size eigendecompositions (load-independent), plus the coarse-level work of
  the Newton method's multilevel start as full-size equivalents (sum of evals * (m / n)^3);
* wall seconds (median over repeats) and CPU seconds of the solver process (median);
* peak resident memory of the solving process and the peak of numpy allocations (tracemalloc);
* the certified relative gap reached, and whether the run was capped.

The plain fixed point is capped at a number of iterations per n (``--fp-cap``); a capped run
reports the certified gap it reached at the cap, not a time to 1e-6. The machine this runs on
may be shared: the BLAS thread count and load average are printed with the table; compare
iteration counts when timings look noisy.

Usage:
    python scripts/bench_optimize.py                       # the full table (about 20 minutes)
    python scripts/bench_optimize.py --sizes 256 --repeats 1 --no-4096   # a quick look
    python scripts/bench_optimize.py --json bench.json     # also write the raw records
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_SIZES = (256, 1024, 2048)
DEFAULT_METHODS = ("fixed-point", "anderson", "newton")
FP_CAP = {256: 3000, 1024: 150, 2048: 30}


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def child(spec: dict) -> dict:
    """Run one solve in this (fresh) process and return its measurements."""
    import resource
    import tracemalloc

    import numpy as np
    from threadpoolctl import threadpool_info

    from mfcli.model.workloads import build_workload
    from mfcli.optimize.dense import optimal_factorization

    kwargs = {"beta": spec["beta"]} if spec["workload"] == "momentum" else {}
    a = build_workload(spec["workload"], spec["n"], **kwargs).matrix
    tracemalloc.start()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    threads = spec.get("threads", "auto")
    threads = int(threads) if threads not in ("auto", "default") else (None if threads == "default" else "auto")
    res = optimal_factorization(a, tol=spec["tol"], method=spec["method"], max_iter=spec["max_iter"],
                                threads=threads)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = spec["n"]
    coarse_equiv = sum(evals * (m / n) ** 3 for m, evals in res.coarse_iterations)
    pools = sorted({(i["internal_api"], i["num_threads"]) for i in threadpool_info()})
    return {
        **spec,
        "iterations": res.iterations,
        "coarse_iterations": [list(x) for x in res.coarse_iterations],
        "coarse_equivalent": coarse_equiv,
        "converged": res.converged,
        "gap": res.gap,
        "primal": res.primal,
        "dual": res.dual,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "peak_traced_mib": traced / 2**20,
        "input_mib": a.nbytes / 2**20,
        "blas_threads": pools,
        "solver_threads": res.threads,  # the limit threads="auto" chose (None: BLAS default)
        "load_after": _load(),
        "capped": (not res.converged) and res.iterations >= spec["max_iter"],
        "finite": bool(np.isfinite(res.gap)),
    }


def run_case(spec: dict, repeats: int) -> dict:
    records = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True, text=True, check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"benchmark child failed for {spec}:\n{out.stderr}")
        records.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first = records[0]
    return {
        **first,
        "repeats": repeats,
        "wall_s": statistics.median(r["wall_s"] for r in records),
        "wall_all": [round(r["wall_s"], 2) for r in records],
        "cpu_s": statistics.median(r["cpu_s"] for r in records),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in records),
        "peak_traced_mib": max(r["peak_traced_mib"] for r in records),
        "iterations_all": sorted({r["iterations"] for r in records}),
        "load_after": records[-1]["load_after"],
        "threads_used": "/".join(sorted({str(r["solver_threads"] or r["blas_threads"][0][1]) for r in records})),
    }


def _row(r: dict) -> str:
    its = str(r["iterations"])
    if len(r["iterations_all"]) > 1:
        its = "/".join(map(str, r["iterations_all"]))
    if r["capped"]:
        its = f"{its} (cap)"
    coarse = f"{r['coarse_equivalent']:.2f}" if r["coarse_iterations"] else "-"
    return (
        f"| {r['workload']} | {r['n']} | {r['method']} | {its} | {coarse} | {r['gap']:.1e} | "
        f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['peak_rss_mib']:.0f} | {r['peak_traced_mib']:.0f} | "
        f"{r['threads_used']} | {r['repeats']} | {r['load_after']} |"
    )


HEADER = (
    "| workload | n | method | iterations | coarse (full-size equiv.) | certified gap | wall s (median) "
    "| CPU s | peak RSS MiB | peak numpy MiB | BLAS threads | runs | load after |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    p.add_argument("--workloads", default="prefix,momentum")
    p.add_argument("--beta", type=float, default=0.9)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=3, help="repeats for newton (fewer for slow baselines)")
    p.add_argument("--fp-cap", default=",".join(f"{k}:{v}" for k, v in FP_CAP.items()),
                   help="fixed-point iteration cap per n, as n:cap,...")
    p.add_argument("--no-4096", action="store_true", help="skip the n = 4096 momentum run")
    p.add_argument("--threads", default="auto",
                   help="solver BLAS threads: auto (1 on a busy machine), default, or a number")
    p.add_argument("--json", type=Path, help="write the raw records here")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    import numpy as np
    import scipy
    from threadpoolctl import threadpool_info

    caps = {int(k): int(v) for k, v in (x.split(":") for x in args.fp_cap.split(","))}
    sizes = [int(x) for x in args.sizes.split(",")]
    methods = args.methods.split(",")
    info = sorted({(i["internal_api"], i["num_threads"], i.get("architecture")) for i in threadpool_info()})
    print(f"# bench_optimize  {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
          f"{os.cpu_count()} CPUs, BLAS (threadpoolctl) {info}")
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}  "
          f"load average at start: {_load()}  tol={args.tol:g}  beta={args.beta}  solver threads={args.threads}")
    print()
    print(HEADER, flush=True)
    rows = []
    cases = [(w, n, m) for n in sizes for w in args.workloads.split(",") for m in methods]
    if not args.no_4096:
        cases.append(("momentum", 4096, "newton"))
    for w, n, m in cases:
        if m == "fixed-point":
            max_iter, reps = caps.get(n, 1000), 1
        elif m == "anderson":
            max_iter, reps = 1000, (args.repeats if n <= 1024 else 1)
        else:
            max_iter, reps = 1000, (args.repeats if n <= 2048 else 1)
        spec = {"workload": w, "n": n, "method": m, "beta": args.beta, "tol": args.tol, "max_iter": max_iter,
                "threads": args.threads}
        r = run_case(spec, reps)
        rows.append(r)
        print(_row(r), flush=True)
    print()
    print(f"load average at end: {_load()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
