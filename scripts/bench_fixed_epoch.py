"""Fixed-epoch solver timings: Newton on the dual (default) against the primal solver.

Each solve runs in this process with one BLAS thread (``threads=1``) and reports CPU seconds
(``time.process_time``, the comparable number on a shared machine), wall seconds, full-size
iterations, the coarse levels of the dual method and the certified gap. Table in
docs/performance.md ("Fixed-epoch: Newton on the dual").

    python scripts/bench_fixed_epoch.py --sizes 256 512 1024 2048 --epochs 16
    python scripts/bench_fixed_epoch.py --sizes 256 512 --methods dual primal
"""
from __future__ import annotations

import argparse
import json
import os
import time

import scipy.linalg  # noqa: F401  (loaded before the BLAS thread limit is applied)

from mfcli.model.participation import FixedEpoch
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.multi_solver import multi_participation_factorization


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--workloads", nargs="+", default=["prefix", "momentum"])
    parser.add_argument("--methods", nargs="+", default=["dual"], choices=["dual", "primal"])
    parser.add_argument("--tol", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="append one JSON object per row to this file")
    args = parser.parse_args()
    print("| workload | n | epochs | method | iterations (coarse levels: n x evals) | CPU s | wall s "
          "| certified gap | loss / n | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.workloads:
        for n in args.sizes:
            a = prefix_workload(n).matrix if name == "prefix" else momentum_workload(n, beta=0.9).matrix
            for method in args.methods:
                cpu, wall = time.process_time(), time.perf_counter()
                res = multi_participation_factorization(a, FixedEpoch(epochs=args.epochs), tol=args.tol,
                                                        max_iter=20000, threads=args.threads, method=method)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                cert = res.certificate()
                coarse = " ".join(f"{m}x{e}" for m, e in cert.get("coarse_iterations", []))
                load = os.getloadavg()[0]
                print(f"| {name} | {n} | {args.epochs} | {cert['method']} | {res.iterations}"
                      f"{f' ({coarse})' if coarse else ''} | {cpu:.1f} | {wall:.1f} | {res.gap:.1e} | "
                      f"{res.loss_mean:.9g} | {load:.1f} |", flush=True)
                if args.json:
                    with open(args.json, "a") as fh:
                        fh.write(json.dumps({"workload": name, "n": n, "epochs": args.epochs, "method": cert["method"],
                                             "iterations": res.iterations, "cpu_seconds": cpu, "wall_seconds": wall,
                                             "gap": res.gap, "loss_mean": res.loss_mean, "load": load,
                                             "coarse_iterations": cert.get("coarse_iterations", [])}) + "\n")


if __name__ == "__main__":
    main()
