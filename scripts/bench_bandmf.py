#!/usr/bin/env python
"""One BandMF solve, band or dense storage, with its CPU time and Newton-CG count (the rows of
docs/performance.md, "Band storage for BandMF").

Usage:
    python scripts/bench_bandmf.py momentum 1024 64 banded [--threads 1] [--tol 1e-6]

Prints one JSON line: iterations, CG steps (band storage), certificates, CPU seconds
(``time.process_time`` of this process), wall seconds, certified gap, loss, method, and the
1-minute load average at the end (``threads`` is the BLAS thread limit the solver sets with
threadpoolctl).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import scipy.linalg  # noqa: F401  (loaded before any BLAS thread limit, see mfcli.optimize.dense.blas_threads)

import mfcli.optimize.multi_banded as mb
from mfcli.model.participation import MinSeparation
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.multi_solver import multi_participation_factorization


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=["prefix", "momentum"])
    ap.add_argument("n", type=int)
    ap.add_argument("bands", type=int)
    ap.add_argument("storage", choices=["auto", "banded", "dense"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-6)
    args = ap.parse_args()
    a = prefix_workload(args.n).matrix if args.workload == "prefix" else momentum_workload(args.n, beta=0.9).matrix
    cg = [0]
    pcg = mb.pcg

    def counted(*args, **kwargs):  # the CG steps of every Newton direction (either operator set)
        res = pcg(*args, **kwargs)
        cg[0] += res.steps
        return res

    mb.pcg = counted  # type: ignore[assignment]
    wall, cpu = time.perf_counter(), time.process_time()
    res = multi_participation_factorization(a, MinSeparation(separation=args.bands), tol=args.tol,
                                            storage=args.storage, threads=args.threads)
    print(json.dumps({
        "workload": args.workload, "n": args.n, "bands": args.bands, "storage": args.storage,
        "threads": args.threads, "iterations": res.iterations, "cg_steps": cg[0],
        "certificates": len(res.history), "cpu_s": round(time.process_time() - cpu, 2),
        "wall_s": round(time.perf_counter() - wall, 2), "gap": res.gap, "loss": res.loss_total,
        "method": res.certificate()["method"], "load_1min": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
