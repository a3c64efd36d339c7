#!/usr/bin/env python
"""Benchmark of the multi-participation solver (mfcli.multi_solver) next to jax_privacy 2.0.

For each workload (prefix, momentum beta 0.9) and n, two problems:

* fixed-epoch, k epochs: ``multi_participation_factorization(A, FixedEpoch(epochs=k))`` and
  ``jax_privacy.matrix_factorization.dense.optimize(n, epochs=k, A=A)``;
* BandMF, b bands / min-separation b: ``MinSeparation(separation=b)`` next to
  ``dense.optimize(n, bands=b, equal_norm=True, A=A)`` and ``banded.optimize(n, bands=b, A=...)``
  (column-normalised banded C, the workload as jax_privacy's own streaming matrix).

Both strategies are scored the same way, in float64 by mfcli: the schema sensitivity of C
(:func:`mfcli.participation.sensitivity`, exact or an upper bound) and the loss sens^2
||A C^-1||_F^2 / n (mean), so jax_privacy's float32 output is judged by the numbers that would
be printed for it. mfcli's certified gap is reported; jax_privacy has no certificate, so its
distance to mfcli's dual bound is reported instead ("gap vs mfcli dual").

jax_privacy is optional: run this under an interpreter that has it (e.g. the separate venv
``/work/jpvenv/bin/python`` with ``PYTHONPATH=$PWD``), otherwise its rows say "not installed".
Each jax_privacy solve runs in a child process, stopped after ``--jax-timeout`` seconds (its row
then says so); sizes above ``--jax-max-n`` are not run. The machine may be shared: CPU seconds
(``time.process_time`` of the solving process) are printed next to wall seconds, with the BLAS
thread count (threadpoolctl; mfcli runs with ``--threads``, default 1) and the load average;
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


def _mfcli(a: np.ndarray, schema: Participation, tol: float, repeats: int, threads: int) -> dict:
    times, cpu, res = [], [], None
    for _ in range(repeats):
        start, wall = time.process_time(), time.perf_counter()
        res = multi_participation_factorization(a, schema, tol=tol, max_iter=20000, threads=threads)
        cpu.append(time.process_time() - start)
        times.append(time.perf_counter() - wall)
    assert res is not None
    sens, exact, loss = _score(a, res.factorization.strategy, schema)
    return {"sensitivity": sens, "exact": exact, "loss_mean": loss, "seconds": statistics.median(times),
            "cpu_seconds": statistics.median(cpu), "gap": res.gap, "dual_mean": res.dual / a.shape[0],
            "iterations": res.iterations,
            "threads": res.threads, "newton_steps": sum(p.method.startswith("newton-") for p in res.history),
            "method": res.certificate()["method"]}


def _jax_child(spec: dict) -> None:
    """In a child process: one jax_privacy solve; C saved as .npy, times printed as JSON."""
    import jax.numpy as jnp
    from jax_privacy.matrix_factorization import banded, dense, streaming_matrix

    n, kind, param, steps = spec["n"], spec["kind"], spec["param"], spec["steps"]
    a = _workload(spec["workload"], n)
    cpu, wall = time.process_time(), time.perf_counter()
    if kind == "dense-epochs":
        c = dense.optimize(n, epochs=param, A=jnp.asarray(a), max_optimizer_steps=steps)
    elif kind == "dense-bands":
        c = dense.optimize(n, bands=param, equal_norm=True, A=jnp.asarray(a), max_optimizer_steps=steps)
    else:  # banded.optimize: column-normalised banded C, the workload as a streaming matrix
        sa = streaming_matrix.prefix_sum() if spec["workload"] == "prefix" else streaming_matrix.momentum_sgd_matrix(0.9)
        c = banded.optimize(n, bands=param, A=sa, max_optimizer_steps=steps).materialize()
    c = np.asarray(c, dtype=np.float64)
    out = {"cpu_seconds": time.process_time() - cpu, "seconds": time.perf_counter() - wall}
    np.save(spec["out"], c)
    print(json.dumps(out))


def _jax(wname: str, a: np.ndarray, schema: Participation, kind: str, args: argparse.Namespace) -> dict:
    """One jax_privacy optimizer in a child process (so that a slow one can be stopped at
    --jax-timeout); a dict with ``status`` and, when it ran, the scores."""
    import subprocess
    import tempfile

    n = a.shape[0]
    if n > args.jax_max_n:
        return {"status": f"not run (n > {args.jax_max_n})"}
    param = schema.epochs if isinstance(schema, FixedEpoch) else schema.separation
    times, cpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "c.npy")
        spec = {"n": n, "kind": kind, "param": param, "steps": args.jax_steps, "workload": wname, "out": out}
        for _ in range(args.repeats):
            try:
                proc = subprocess.run([sys.executable, __file__, "--jax-child", json.dumps(spec)], capture_output=True,
                                      text=True, timeout=args.jax_timeout, env=os.environ.copy())
            except subprocess.TimeoutExpired:
                return {"status": f"stopped at {args.jax_timeout:.0f} s"}
            if proc.returncode != 0:
                return {"status": "failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:80]}
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
            times.append(rec["seconds"])
            cpu.append(rec["cpu_seconds"])
        c = np.load(out)
    sens, exact, loss = _score(a, c, schema)
    return {"status": "ok", "sensitivity": sens, "exact": exact, "loss_mean": loss,
            "seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu)}


def _has_jax() -> bool:
    import importlib.util

    return importlib.util.find_spec("jax_privacy") is not None


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
    p.add_argument("--threads", type=int, default=1, help="BLAS threads for the mfcli solves")
    p.add_argument("--jax-steps", type=int, default=10000, help="jax_privacy max_optimizer_steps")
    p.add_argument("--jax-timeout", type=float, default=600.0, help="stop a jax_privacy solve after this many s")
    p.add_argument("--jax-max-n", type=int, default=1024, help="do not run jax_privacy above this n")
    p.add_argument("--no-jax", action="store_true")
    p.add_argument("--only", choices=["epochs", "bands"], default=None)
    p.add_argument("--json", default=None, help="also append the raw records (JSON lines) here")
    p.add_argument("--jax-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jax_child:
        _jax_child(json.loads(args.jax_child))
        return 0
    jax_state = "disabled (--no-jax)" if args.no_jax else ("" if _has_jax() else "not installed")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"BLAS threads at start {_blas_threads()}", file=sys.stderr)
    # Warm-up: scipy's import and LAPACK's first call are not part of any solve's time.
    multi_participation_factorization(prefix_workload(8).matrix, FixedEpoch(epochs=2))
    head = ("| workload | n | schema | solver | sensitivity | mean loss | loss / mfcli | CPU s | wall s "
            "| gap (mfcli: certified; jax: vs mfcli dual) | BLAS threads | load (1 min) |")
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
                mine = _mfcli(a, schema, args.tol, args.repeats, args.threads)
                label = (f"{args.epochs} epochs" if isinstance(schema, FixedEpoch)
                         else f"min-sep {args.bands} (k = {schema.participations(n)})")
                load = f"{os.getloadavg()[0]:.1f}"
                print(f"| {wname} | {n} | {label} | mfcli ({mine['method']}) | {mine['sensitivity']:.9g} "
                      f"| {mine['loss_mean']:.9g} | 1 | {mine['cpu_seconds']:.1f} | {mine['seconds']:.1f} "
                      f"| {mine['gap']:.1e} | {mine['threads']} | {load} |", flush=True)
                kinds = ["dense-epochs"] if isinstance(schema, FixedEpoch) else ["dense-bands", "banded"]
                theirs_all = {}
                for kind in kinds:
                    name = f"jax_privacy {'dense' if kind.startswith('dense') else 'banded'}.optimize"
                    theirs = {"status": jax_state} if jax_state else _jax(wname, a, schema, kind, args)
                    theirs_all[kind] = theirs
                    if theirs["status"] != "ok":
                        print(f"| {wname} | {n} | {label} | {name} | {theirs['status']} | | | | | | | |", flush=True)
                        continue
                    jgap = (theirs["loss_mean"] - mine["dual_mean"]) / theirs["loss_mean"]
                    sens = f"{theirs['sensitivity']:.9g}" + ("" if theirs["exact"] else " (bound)")
                    print(f"| {wname} | {n} | {label} | {name} | {sens} | {theirs['loss_mean']:.9g} "
                          f"| {theirs['loss_mean'] / mine['loss_mean']:.7f} | {theirs['cpu_seconds']:.1f} "
                          f"| {theirs['seconds']:.1f} | {jgap:.1e} | {_jax_threads()} | {os.getloadavg()[0]:.1f} |",
                          flush=True)
                if args.json:
                    with open(args.json, "a") as fh:
                        fh.write(json.dumps({"workload": wname, "n": n, "schema": json.loads(schema.to_json()),
                                             "mfcli": mine, "jax_privacy": theirs_all}) + "\n")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; BLAS threads at end {_blas_threads()}",
          file=sys.stderr)
    return 0


def _jax_threads() -> str:
    """jax on CPU: XLA's own thread pool (all cores unless XLA_FLAGS limits it)."""
    return "XLA default" if "XLA_FLAGS" not in os.environ else os.environ["XLA_FLAGS"]


if __name__ == "__main__":
    sys.exit(main())
