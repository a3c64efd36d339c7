#!/usr/bin/env python
"""Benchmark of the multi-participation solver (mfcli.optimize.multi_solver) next to jax_privacy 2.0.

For each workload (prefix, momentum beta 0.9) and n, two problems:

* fixed-epoch, k epochs: ``multi_participation_factorization(A, FixedEpoch(epochs=k))`` and
  ``jax_privacy.matrix_factorization.dense.optimize(n, epochs=k, A=A)`` (kind ``dense-epochs``);
* BandMF, b bands / min-separation b: ``MinSeparation(separation=b)`` next to
  ``dense.optimize(n, bands=b, equal_norm=True, A=A)`` (``dense-bands``) and
  ``banded.optimize(n, bands=b, A=...)`` (``banded``: column-normalised banded C, the workload as
  jax_privacy's own streaming matrix).

Both strategies are scored the same way, in float64 by mfcli: the schema sensitivity of C
(:func:`mfcli.model.participation.sensitivity`, exact or an upper bound) and the loss sens^2
||A C^-1||_F^2 / n (mean). mfcli's certified gap is reported; jax_privacy has no certificate, so
its distance to mfcli's dual bound is reported instead ("gap vs mfcli dual").

**jax_privacy is stopped by a CPU-seconds budget, not killed.** Each jax_privacy solve runs in a
child process with one XLA thread and one BLAS thread (``JAX_ENV``) and float64 (``jax_enable_x64``,
so that its returned X and its Cholesky factor C are float64 too; without it, ``dense.optimize``
iterates in float64 but returns float32). The optimizer's ``callback`` stops it when its own rule
fires (``dense.pg_tol_termination_fn``: projected gradient <= 1e-3; ``banded.optimize`` has none
besides its step limit) or when the child's ``time.process_time`` passes the budget (default 120
CPU s for n <= 512, 300 above; ``--jax-budget``). The strategy at the stop is what
``dense.optimize`` / ``banded.optimize`` return (their own path from the last iterate), scored
as above, with the steps taken, CPU s and wall s. The iterate is also kept at CPU-time marks
(``--jax-marks``) and scored, giving a loss trajectory. A wall-clock backstop
(``--jax-wall-limit``) kills a child whose single step never returns; that row then has no numbers.

The two sides can run at different times (the machine is shared):

* ``--only-jax --json F`` runs the jax_privacy rows and saves them in F (JSON, merged with the
  rows already there, replaced per (workload, n, schema, solver));
* ``--no-jax --jax-json F`` runs the mfcli rows and renders the combined markdown tables with the
  jax_privacy rows saved in F; a jax row missing from F renders as "not run".

Without jax_privacy installed (and without ``--jax-json``) its rows say "not installed". CPU
seconds (``time.process_time`` of the solving process) are the comparable column; wall seconds,
BLAS threads (threadpoolctl; mfcli runs with ``--threads``, default 1) and the 1-minute load
average are recorded next to them.

Usage:
    PYTHONPATH=$PWD /work/jpvenv/bin/python scripts/bench_multi_participation.py --only-jax \\
        --sizes 2048 1024 512 256 --json /tmp/jax_rows.json
    PYTHONPATH=$PWD python scripts/bench_multi_participation.py --no-jax --jax-json /tmp/jax_rows.json \\
        --json /tmp/mfcli_rows.json
    python scripts/bench_multi_participation.py --render --json /tmp/mfcli_rows.json --jax-json /tmp/jax_rows.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, participation_from_json, sensitivity
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.multi_solver import multi_participation_factorization

#: Environment of each jax_privacy child: one XLA CPU thread, one BLAS thread (jaxlib's LAPACK
#: calls go through scipy's OpenBLAS), so that its CPU seconds compare with mfcli's threads=1.
JAX_ENV = {
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "JAX_PLATFORMS": "cpu",
}

JAX_KINDS = ("dense-epochs", "dense-bands", "banded")
SOLVER_NAMES = {"mfcli": "mfcli", "dense-epochs": "jax_privacy dense.optimize",
                "dense-bands": "jax_privacy dense.optimize", "banded": "jax_privacy banded.optimize"}
#: jax_privacy's own default step limits (dense.optimize: 10000, banded.optimize: 100).
JAX_DEFAULT_STEPS = {"dense-epochs": 10000, "dense-bands": 10000, "banded": 100}


def _workload(name: str, n: int) -> np.ndarray:
    return prefix_workload(n).matrix if name == "prefix" else momentum_workload(n, beta=0.9).matrix


def _score(a: np.ndarray, c: np.ndarray, schema: Participation) -> tuple[float, bool, float]:
    """(schema sensitivity, exact?, mean loss sens^2 ||A C^-1||_F^2 / n) in float64."""
    import scipy.linalg

    c = np.tril(np.asarray(c, dtype=np.float64))
    sens = sensitivity(c, schema)
    bt = scipy.linalg.solve_triangular(c, a.T, lower=True, trans="T")
    return sens.value, sens.exact, sens.value**2 * float(np.sum(bt * bt)) / a.shape[0]


def _schemas(n: int, args: argparse.Namespace) -> list[Participation]:
    out: list[Participation] = []
    if args.only in (None, "epochs") and n % args.epochs == 0:
        out.append(FixedEpoch(epochs=args.epochs))
    if args.only in (None, "bands") and args.bands <= n:
        out.append(MinSeparation(separation=args.bands))
    return out


def _kinds(schema: Participation, args: argparse.Namespace) -> list[str]:
    mine = ["dense-epochs"] if isinstance(schema, FixedEpoch) else ["dense-bands", "banded"]
    return [k for k in mine if k in args.jax_kinds]


def _key(row: dict[str, Any]) -> tuple[str, int, str, str]:
    return (row["workload"], int(row["n"]), json.dumps(row["schema"], sort_keys=True), row["solver"])


def _label(schema: Participation, n: int) -> str:
    if isinstance(schema, FixedEpoch):
        return f"{schema.epochs} epochs"
    assert isinstance(schema, MinSeparation)
    return f"min-sep {schema.separation} (k = {schema.participations(n)})"


def _conditions() -> dict[str, Any]:
    return {"load": round(os.getloadavg()[0], 2),
            "at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _mfcli(wname: str, a: np.ndarray, schema: Participation, args: argparse.Namespace) -> dict[str, Any]:
    times, cpu, res = [], [], None
    for _ in range(args.repeats):
        start, wall = time.process_time(), time.perf_counter()
        res = multi_participation_factorization(a, schema, tol=args.tol, max_iter=20000, threads=args.threads)
        cpu.append(time.process_time() - start)
        times.append(time.perf_counter() - wall)
    assert res is not None
    sens, exact, loss = _score(a, res.factorization.strategy, schema)
    return {"workload": wname, "n": a.shape[0], "schema": json.loads(schema.to_json()), "solver": "mfcli",
            "status": "ok", "sensitivity": sens, "exact": exact, "loss_mean": loss,
            "seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu), "gap": res.gap,
            "dual_mean": res.dual / a.shape[0], "iterations": res.iterations, "threads": f"BLAS {res.threads}",
            "newton_steps": sum(p.method.startswith("newton-") for p in res.history),
            "method": res.certificate()["method"], **_conditions()}


def _jax_child(spec: dict[str, Any]) -> None:
    """In a child process: one jax_privacy solve stopped by its own rule or the CPU budget.

    Saves the returned C and the iterates at the CPU marks (``.npz``) and prints the times as one
    JSON line. Scoring is left to the parent (it is not part of jax_privacy's time).
    """
    if hasattr(os, "sched_setaffinity"):
        # One core: XLA sizes its CPU thread pools from the affinity mask, and XLA_FLAGS alone still
        # leaves two busy Eigen threads; pinned, the process can never use more than one core.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax_privacy.matrix_factorization import banded, dense, streaming_matrix  # type: ignore[import-untyped]

    n, kind, param, wname = spec["n"], spec["kind"], spec["param"], spec["workload"]
    budget = float(spec["budget"])
    marks = sorted(float(m) for m in spec["marks"] if m < budget)
    own_rule = dense.pg_tol_termination_fn if kind.startswith("dense") else None
    state: dict[str, Any] = {"stop": "step limit", "steps": 0, "first_step_cpu": None}
    snaps: list[tuple[float, float, int, float, np.ndarray]] = []
    a = _workload(wname, n)
    start, wall = time.process_time(), time.perf_counter()

    def callback(info: Any) -> bool:
        cpu = time.process_time() - start
        state["steps"] = info.step + 1
        if state["first_step_cpu"] is None:
            state["first_step_cpu"] = cpu
        params = info.params.params if kind == "banded" else info.params
        while marks and cpu >= marks[0]:
            snaps.append((marks.pop(0), cpu, info.step + 1, float(info.loss), np.array(params)))
        if own_rule is not None and own_rule(info):
            state["stop"] = "own rule"
            return True
        if cpu >= budget:
            state["stop"] = "CPU budget"
            return True
        return False

    steps = spec["steps"]
    if kind == "dense-epochs":
        c = dense.optimize(n, epochs=param, A=jnp.asarray(a), max_optimizer_steps=steps, callback=callback)
    elif kind == "dense-bands":
        c = dense.optimize(n, bands=param, equal_norm=True, A=jnp.asarray(a), max_optimizer_steps=steps,
                           callback=callback)
    else:
        sa = streaming_matrix.prefix_sum() if wname == "prefix" else streaming_matrix.momentum_sgd_matrix(0.9)
        c = banded.optimize(n, bands=param, A=sa, max_optimizer_steps=steps, callback=callback).materialize()
    c = np.asarray(c)
    out = {"cpu_seconds": time.process_time() - start, "seconds": time.perf_counter() - wall,
           "steps": state["steps"], "stop": state["stop"], "first_step_cpu": state["first_step_cpu"],
           "dtype": str(c.dtype), "jax": jax.__version__, "cpus": sorted(os.sched_getaffinity(0)),
           "x64": bool(jax.config.read("jax_enable_x64")),
           "marks": [[m, cpu, step, loss] for m, cpu, step, loss, _ in snaps]}
    # The iterates at the marks become strategies by jax_privacy's own path (after the timing).
    strategies = [np.asarray(banded.ColumnNormalizedBanded(params=jnp.asarray(p)).materialize()) if kind == "banded"
                  else np.asarray(dense.strategy_from_X(jnp.asarray(p))) for *_, p in snaps]
    arrays: dict[str, Any] = {"c": c, **{f"mark_{i}": s for i, s in enumerate(strategies)}}
    np.savez(spec["out"], **arrays)
    print(json.dumps(out))


def _jax(wname: str, a: np.ndarray, schema: Participation, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One jax_privacy optimizer in a child process: a row with ``status`` and, when it ran, the
    scores of its strategy at the stop and at the CPU marks."""
    import subprocess
    import tempfile

    n = a.shape[0]
    row: dict[str, Any] = {"workload": wname, "n": n, "schema": json.loads(schema.to_json()), "solver": kind}
    if n > args.jax_max_n:
        return {**row, "status": f"not run (n > {args.jax_max_n})"}
    budget = args.jax_budget if args.jax_budget is not None else (120.0 if n <= 512 else 300.0)
    wall_limit = args.jax_wall_limit if args.jax_wall_limit is not None else 6 * budget + 600
    param = schema.epochs if isinstance(schema, FixedEpoch) else schema.separation  # type: ignore[union-attr]
    steps = args.jax_steps if args.jax_steps is not None else JAX_DEFAULT_STEPS[kind]
    env = {**os.environ, **JAX_ENV}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "c.npz")
        spec = {"n": n, "kind": kind, "param": param, "steps": steps, "workload": wname, "out": out,
                "budget": budget, "marks": args.jax_marks}
        cond = _conditions()
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--jax-child", json.dumps(spec)],
                                  capture_output=True, text=True, timeout=wall_limit, env=env)
        except subprocess.TimeoutExpired:
            return {**row, "status": f"killed at {wall_limit:.0f} s wall (a single step did not return)",
                    "budget_cpu_seconds": budget, **cond}
        if proc.returncode != 0:
            return {**row, "status": "failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:120], **cond}
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(out) as data:
            c = data["c"]
            snaps = [data[f"mark_{i}"] for i in range(len(rec["marks"]))]
    sens, exact, loss = _score(a, c, schema)
    trajectory = []
    for (mark, cpu, step, own_loss), cs in zip(rec["marks"], snaps, strict=True):
        s_sens, s_exact, s_loss = _score(a, cs, schema)
        trajectory.append({"mark": mark, "cpu_seconds": cpu, "steps": step, "loss_mean": s_loss,
                           "sensitivity": s_sens, "exact": s_exact, "own_loss": own_loss})
    return {**row, "status": "ok", "sensitivity": sens, "exact": exact, "loss_mean": loss,
            "cpu_seconds": rec["cpu_seconds"], "seconds": rec["seconds"], "steps": rec["steps"],
            "max_steps": steps, "stop": rec["stop"], "budget_cpu_seconds": budget,
            "first_step_cpu_seconds": rec["first_step_cpu"], "dtype": rec["dtype"], "x64": rec["x64"],
            "jax": rec["jax"], "threads": f"1 core (pinned {rec['cpus']})", "trajectory": trajectory, **cond}


def _has_jax() -> bool:
    import importlib.util

    return importlib.util.find_spec("jax_privacy") is not None


def _blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ", ".join(f"{p['internal_api']}:{p['num_threads']}" for p in threadpool_info())
    except Exception:  # threadpoolctl missing
        return "unknown"


def load_rows(path: str | None) -> list[dict[str, Any]]:
    """The rows saved in ``path`` by ``--json`` (none when it is None or does not exist yet)."""
    if path is None or not os.path.exists(path):
        return []
    with open(path) as fh:
        return list(json.load(fh)["rows"])


def save_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """Merge ``rows`` into the JSON file ``path`` (same key replaced), written atomically."""
    merged = {_key(r): r for r in load_rows(path)}
    merged.update({_key(r): r for r in rows})
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"rows": list(merged.values())}, fh, indent=1)
    os.replace(tmp, path)


def _fmt_sens(r: dict[str, Any]) -> str:
    return f"{r['sensitivity']:.9g}" + ("" if r["exact"] else " (bound)")


def _traj_cell(loss: float, dual: float | None) -> str:
    """The mean loss, and its gap to mfcli's certified lower bound when mfcli has a row."""
    return f"{loss:.7g}" + (f" ({(loss - dual) / loss:.1e})" if dual is not None else "")


def render(rows: list[dict[str, Any]], jax_missing: str) -> str:
    """The markdown tables: one row per (workload, n, schema, solver), each jax_privacy row next
    to the mfcli row of the same problem; then the jax_privacy loss trajectories.

    ``jax_missing`` is what a jax_privacy row absent from ``rows`` says ("not run",
    "not installed", ...).
    """
    by_key = {_key(r): r for r in rows}
    problems: list[tuple[str, int, str]] = []
    for r in rows:
        p = (r["workload"], int(r["n"]), json.dumps(r["schema"], sort_keys=True))
        if p not in problems:
            problems.append(p)
    order = {"prefix": 0, "momentum": 1}
    problems.sort(key=lambda p: (order.get(p[0], 2), p[0], p[1], json.loads(p[2])["kind"] != "fixed-epoch"))
    head = ("| workload | n | schema | solver | stop | steps | sensitivity | mean loss | loss / mfcli "
            "| CPU s | wall s | gap (mfcli: certified; jax: vs mfcli dual) | threads | load |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    traj_lines: list[str] = []
    marks: list[float] = sorted({t["mark"] for r in rows for t in r.get("trajectory", [])})
    for wname, n, sj in problems:
        schema = participation_from_json(sj)
        label = _label(schema, n)
        mine = by_key.get((wname, n, sj, "mfcli"))
        pre = f"| {wname} | {n} | {label} "
        if mine is not None and mine.get("status") == "ok":
            lines.append(pre + f"| mfcli ({mine['method']}) | certified | {mine['iterations']} | {_fmt_sens(mine)} "
                         f"| {mine['loss_mean']:.9g} | 1 | {mine['cpu_seconds']:.1f} | {mine['seconds']:.1f} "
                         f"| {mine['gap']:.1e} | {mine['threads']} | {mine['load']:.1f} |")
        else:
            lines.append(pre + f"| mfcli | {mine['status'] if mine else 'not run'} | | | | | | | | | |")
        kinds = ["dense-epochs"] if isinstance(schema, FixedEpoch) else ["dense-bands", "banded"]
        for kind in kinds:
            theirs = by_key.get((wname, n, sj, kind))
            name = SOLVER_NAMES[kind]
            if theirs is None or theirs["status"] != "ok":
                status = theirs["status"] if theirs else jax_missing
                lines.append(pre + f"| {name} | {status} | | | | | | | | | |")
                continue
            ratio = f"{theirs['loss_mean'] / mine['loss_mean']:.7f}" if mine and mine.get("status") == "ok" else ""
            jgap = (f"{(theirs['loss_mean'] - mine['dual_mean']) / theirs['loss_mean']:.1e}"
                    if mine and mine.get("status") == "ok" else "")
            lines.append(pre + f"| {name} | {theirs['stop']} | {theirs['steps']} | {_fmt_sens(theirs)} "
                         f"| {theirs['loss_mean']:.9g} | {ratio} | {theirs['cpu_seconds']:.1f} "
                         f"| {theirs['seconds']:.1f} | {jgap} | {theirs['threads'].split(' (pinned')[0]} "
                         f"| {theirs['load']:.1f} |")
            dual = mine["dual_mean"] if mine and mine.get("status") == "ok" else None
            cells = {t["mark"]: _traj_cell(t["loss_mean"], dual) for t in theirs.get("trajectory", [])}
            traj_lines.append(pre + f"| {name} | " + " | ".join(cells.get(m, "") for m in marks)
                              + f" | {_traj_cell(theirs['loss_mean'], dual)} at {theirs['cpu_seconds']:.0f} | "
                              + (f"{mine['loss_mean']:.7g} ({mine['gap']:.1e}) at {mine['cpu_seconds']:.1f} |"
                                 if mine and dual is not None else "not run |"))
    out = "\n".join(lines)
    if traj_lines:
        out += ("\n\njax_privacy's iterate at CPU-time marks: mean loss (in parentheses its gap to mfcli's "
                "certified lower bound, (loss - dual) / loss, where mfcli has a row):")
        th = ("| workload | n | schema | solver | " + " | ".join(f"at {m:g} CPU s" for m in marks)
              + " | at the stop, CPU s | mfcli: loss (certified gap) at CPU s |")
        out += "\n\n" + "\n".join([th, "|---" * (th.count("|") - 1) + "|", *traj_lines])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--workloads", nargs="+", default=["prefix", "momentum"], choices=["prefix", "momentum"])
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--bands", type=int, default=64)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=1, help="mfcli solves per row (median time)")
    p.add_argument("--threads", type=int, default=1, help="BLAS threads for the mfcli solves")
    p.add_argument("--jax-steps", type=int, default=None,
                   help="jax_privacy max_optimizer_steps (default: its own, 10000 dense, 100 banded)")
    p.add_argument("--jax-budget", type=float, default=None,
                   help="stop a jax_privacy solve after this many CPU s (default 120 for n <= 512, else 300)")
    p.add_argument("--jax-marks", type=float, nargs="+", default=[10, 30, 60, 120, 300],
                   help="CPU s at which jax_privacy's iterate is kept and scored")
    p.add_argument("--jax-wall-limit", type=float, default=None,
                   help="kill a jax_privacy child after this many wall s (default 6 x budget + 600)")
    p.add_argument("--jax-max-n", type=int, default=2048, help="do not run jax_privacy above this n")
    p.add_argument("--jax-kinds", nargs="+", default=list(JAX_KINDS), choices=JAX_KINDS)
    side = p.add_mutually_exclusive_group()
    side.add_argument("--no-jax", action="store_true", help="mfcli rows only (jax rows from --jax-json)")
    side.add_argument("--only-jax", action="store_true", help="jax_privacy rows only (save them with --json)")
    p.add_argument("--jax-json", default=None, help="jax_privacy rows saved earlier by --only-jax --json")
    p.add_argument("--only", choices=["epochs", "bands"], default=None)
    p.add_argument("--json", default=None, help="save the rows computed here into this JSON file (merged)")
    p.add_argument("--render", action="store_true",
                   help="solve nothing: render the rows saved in --json (mfcli) and --jax-json (jax_privacy)")
    p.add_argument("--jax-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jax_child:
        _jax_child(json.loads(args.jax_child))
        return 0
    if args.render:
        mine = [r for r in load_rows(args.json) if r["solver"] == "mfcli"]
        theirs = [r for r in load_rows(args.jax_json if args.jax_json else args.json) if r["solver"] != "mfcli"]
        print(render(mine + theirs, "not run"))
        return 0
    if args.only_jax and not _has_jax():
        print("error: --only-jax needs jax_privacy installed in this interpreter", file=sys.stderr)
        return 2
    saved = [r for r in load_rows(args.jax_json) if r["solver"] != "mfcli"]
    if args.jax_json is not None:
        jax_missing = "not run"
    elif args.no_jax:
        jax_missing = "not run (--no-jax)"
    else:
        jax_missing = "not installed" if not _has_jax() else "not run"
    run_jax = not args.no_jax and _has_jax()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"BLAS threads at start {_blas_threads()}", file=sys.stderr)
    if not args.only_jax:
        # Warm-up: scipy's import and LAPACK's first call are not part of any solve's time.
        multi_participation_factorization(prefix_workload(8).matrix, FixedEpoch(epochs=2))
    rows: list[dict[str, Any]] = []
    for n in args.sizes:
        for wname in args.workloads:
            a = _workload(wname, n)
            for schema in _schemas(n, args):
                jobs: list[str] = [] if args.only_jax else ["mfcli"]
                if run_jax:
                    jobs += _kinds(schema, args)
                for job in jobs:
                    r = _mfcli(wname, a, schema, args) if job == "mfcli" else _jax(wname, a, schema, job, args)
                    print(json.dumps({k: v for k, v in r.items() if k != "trajectory"}), file=sys.stderr, flush=True)
                    rows.append(r)
                    if args.json:
                        save_rows(args.json, [r])  # after each row, so that a stopped run keeps its rows
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; BLAS threads at end {_blas_threads()}",
          file=sys.stderr)
    if not args.only_jax:
        print(render(saved + rows if not run_jax else rows, jax_missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
