#!/usr/bin/env python
"""Benchmark of the multi-participation solver (mfcli.multi_solver) next to jax_privacy 2.0.

For each workload (prefix, momentum beta 0.9) and n, two problems:

* fixed-epoch, k epochs: ``multi_participation_factorization(A, FixedEpoch(epochs=k))`` and
  ``jax_privacy.matrix_factorization.dense.optimize(n, epochs=k, A=A)``;
* BandMF, b bands / min-separation b: ``MinSeparation(separation=b)`` and
  ``dense.optimize(n, bands=b, equal_norm=True, A=A)``.

Both strategies are scored the same way, in float64 by mfcli: the schema sensitivity of C
(:func:`mfcli.participation.sensitivity`, exact or an upper bound) and the loss sens^2
||A C^-1||_F^2 / n (mean), so jax_privacy's float32 output is judged by the numbers that would
be printed for it. mfcli's certified gap is reported; jax_privacy has no certificate, so its
distance to mfcli's dual bound is reported instead ("gap vs mfcli dual").

jax_privacy is optional: run this under an interpreter that has it (e.g. the separate venv
``/work/jpvenv/bin/python`` with ``PYTHONPATH=$PWD``), otherwise its columns are blank. The
machine may be shared: the BLAS thread counts (threadpoolctl) and the load average are printed;
times are medians over ``--repeats``.

Usage:
    PYTHONPATH=$PWD /work/jpvenv/bin/python scripts/bench_multi_participation.py --sizes 256 512
    python scripts/bench_multi_participation.py --sizes 2048 --epochs 16 --bands 64 --no-jax
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from mfcli.multi_solver import multi_participation_factorization
from mfcli.participation import FixedEpoch, MinSeparation, Participation, sensitivity
from mfcli.workloads import momentum_workload, prefix_workload


def _workload(name: str, n: int) -> np.ndarray:
    return prefix_workload(n).matrix if name == "prefix" else momentum_workload(n, beta=0.9).matrix


def _score(a: np.ndarray, c: np.ndarray, schema: Participation) -> tuple[float, bool, float]:
    """(schema sensitivity, exact?, mean loss sens^2 ||A C^-1||_F^2 / n) in float64."""
    import scipy.linalg

    c = np.tril(np.asarray(c, dtype=np.float64))
    sens = sensitivity(c, schema)
    bt = scipy.linalg.solve_triangular(c, a.T, lower=True, trans="T")
    return sens.value, sens.exact, sens.value**2 * float(np.sum(bt * bt)) / a.shape[0]


def _mfcli(a: np.ndarray, schema: Participation, tol: float, repeats: int) -> dict:
    times, cpu, res = [], [], None
    for _ in range(repeats):
        start = time.process_time()
        res = multi_participation_factorization(a, schema, tol=tol, max_iter=20000)
        cpu.append(time.process_time() - start)
        times.append(res.seconds)
    assert res is not None
    sens, exact, loss = _score(a, res.factorization.strategy, schema)
    return {"sensitivity": sens, "exact": exact, "loss_mean": loss, "seconds": statistics.median(times),
            "cpu_seconds": statistics.median(cpu), "gap": res.gap, "dual_mean": res.dual / a.shape[0],
            "iterations": res.iterations,
            "threads": res.threads, "newton_steps": sum(p.method.startswith("newton-") for p in res.history)}


def _jax(a: np.ndarray, schema: Participation, repeats: int, steps: int) -> dict | None:
    try:
        import jax.numpy as jnp
        from jax_privacy.matrix_factorization import dense
    except ImportError:
        return None
    n = a.shape[0]
    times, c = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        if isinstance(schema, FixedEpoch):
            c = dense.optimize(n, epochs=schema.epochs, A=jnp.asarray(a), max_optimizer_steps=steps)
        else:
            assert isinstance(schema, MinSeparation)
            c = dense.optimize(n, bands=schema.separation, equal_norm=True, A=jnp.asarray(a),
                               max_optimizer_steps=steps)
        c = np.asarray(c)
        times.append(time.perf_counter() - start)
    sens, exact, loss = _score(a, c, schema)
    return {"sensitivity": sens, "exact": exact, "loss_mean": loss, "seconds": statistics.median(times)}


def _blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ", ".join(f"{p['internal_api']}:{p['num_threads']}" for p in threadpool_info())
    except Exception:  # threadpoolctl missing
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--workloads", nargs="+", default=["prefix", "momentum"], choices=["prefix", "momentum"])
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--bands", type=int, default=64)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--jax-steps", type=int, default=10000, help="jax_privacy max_optimizer_steps")
    p.add_argument("--no-jax", action="store_true")
    p.add_argument("--only", choices=["epochs", "bands"], default=None)
    p.add_argument("--json", default=None, help="also append the raw records (JSON lines) here")
    args = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; BLAS threads at start {_blas_threads()}",
          file=sys.stderr)
    # Warm-up: scipy's import and LAPACK's first call are not part of any solve's time.
    multi_participation_factorization(prefix_workload(8).matrix, FixedEpoch(epochs=2))
    head = ("| workload | n | schema | sens mfcli | sens jax | loss mfcli | loss jax | mfcli s | jax s "
            "| mfcli gap | jax gap vs mfcli dual |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for wname in args.workloads:
        for n in args.sizes:
            schemas: list[Participation] = []
            if args.only in (None, "epochs") and n % args.epochs == 0:
                schemas.append(FixedEpoch(epochs=args.epochs))
            if args.only in (None, "bands") and args.bands <= n:
                schemas.append(MinSeparation(separation=args.bands))
            a = _workload(wname, n)
            for schema in schemas:
                mine = _mfcli(a, schema, args.tol, args.repeats)
                theirs = None if args.no_jax else _jax(a, schema, args.repeats, args.jax_steps)
                label = (f"{args.epochs} epochs" if isinstance(schema, FixedEpoch)
                         else f"min-sep {args.bands} (k = {schema.participations(n)})")
                fmt = lambda r, key, f: "" if r is None else format(r[key], f)  # noqa: E731
                jgap = "" if theirs is None else f"{(theirs['loss_mean'] - mine['dual_mean']) / theirs['loss_mean']:.2e}"
                print(f"| {wname} | {n} | {label} | {mine['sensitivity']:.9g} | {fmt(theirs, 'sensitivity', '.9g')} "
                      f"| {mine['loss_mean']:.9g} | {fmt(theirs, 'loss_mean', '.9g')} | {mine['seconds']:.1f} "
                      f"| {fmt(theirs, 'seconds', '.1f')} | {mine['gap']:.1e} | {jgap} |", flush=True)
                if args.json:
                    with open(args.json, "a") as fh:
                        fh.write(json.dumps({"workload": wname, "n": n, "schema": json.loads(schema.to_json()),
                                             "mfcli": mine, "jax_privacy": theirs}) + "\n")
    print(f"load average {os.getloadavg()[0]:.1f}; BLAS threads at end {_blas_threads()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
