"""CPU seconds of the balls-in-bins brackets at FIXED grids in two checkouts, side by side: the
floating-point bound (relative error bounds, window sums by a doubling table, certified ends)
against the checkout before it (prefix-difference windows, 1e-10 added to delta).

Each run is a fresh child (``python -c``, the checkout first on sys.path, BLAS limited to one
thread by threadpoolctl) that times ``tree_balls_in_bins(n, sigma, grid=h)`` /
``dpsgd_balls_in_bins(n, sigma, grid=h)`` with ``time.process_time()`` after a warm-up import,
and prints the bracket. The checkouts alternate (old, new, old, new, ...) so both see the same
load; medians of ``--runs`` with min and max, and the load average, are printed.

    python scripts/bench_balls_in_bins_float.py --old /work/main --new . [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = [("tree", 1024, 4.0, 1.3e-3), ("tree", 64, 2.0, 1e-3), ("dpsgd", 1024, 4.0, 2.5e-4),
         ("dpsgd", 100, 1.0, 1e-3)]

_CHILD = """
import json, sys, time
from threadpoolctl import threadpool_limits
from mfcli.accounting.balls_in_bins import dpsgd_balls_in_bins, tree_balls_in_bins
kind, n, sigma, h = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
fn = tree_balls_in_bins if kind == "tree" else dpsgd_balls_in_bins
with threadpool_limits(limits=1):
    t0 = time.process_time()
    r = fn(n=n, sigma=sigma, grid=h, delta=1e-6)
    cpu = time.process_time() - t0
print(json.dumps({"cpu": cpu, "bracket": [r.lower, r.epsilon]}))
"""


def run(checkout: str, case: tuple) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _CHILD, *map(str, case)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    print("| case | old CPU s (median [min, max]) | new CPU s | old bracket | new bracket |")
    print("|---|---|---|---|---|")
    for case in CASES:
        times: dict[str, list[float]] = {"old": [], "new": []}
        brackets = {}
        for _ in range(args.runs):
            for name in ("old", "new"):
                r = run(getattr(args, name), case)
                times[name].append(r["cpu"])
                brackets[name] = r["bracket"]

        def fmt(v: list[float]) -> str:
            return f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]"

        label = f"{case[0]} n={case[1]} sigma={case[2]} h={case[3]:g}"
        print(f"| {label} | {fmt(times['old'])} | {fmt(times['new'])} | "
              f"[{brackets['old'][0]:.6f}, {brackets['old'][1]:.6f}] | [{brackets['new'][0]:.6f}, {brackets['new'][1]:.6f}] |",
              flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
