#!/usr/bin/env python
"""Benchmark of ``mfcli account``'s MMCC: time and epsilon next to DP-SGD (docs/accounting.md).

Strategies: identity, 2-, 8- and 32-banded (the first b coefficients of S^1/2) and dense S^1/2, at
n = 64, 256, 1024, 2048 with sigma = 4, p = 0.01, delta = 1e-6 (sigma per unit sensitivity: every
C is used at its own scale, and the accounting divides sigma by sens(C)). Each cell is the median of
``--repeats`` runs (cells slower than ``--single-above`` seconds run once); cells whose estimated
time exceeds ``--max-seconds`` are reported as not run, with the estimate.

A second table times the alternatives of the MMCC pipeline side by side on one strategy: the
default (FFT tail law, vectorised PLD builder, grid budget), the exact direct-convolution tail law,
no grid budget, and dp-accounting's own MixtureOfGaussians PLD builder.

Run:  OPENBLAS_NUM_THREADS=1 python scripts/bench_account.py [--quick]
The machine is shared with other jobs: the load average is printed with the tables.

``--headline [--before TREE]``: instead, the README's headline ``mfcli account --sigma 4 --sampling
0.01`` as a subprocess, CPU seconds (user + system, getrusage of the children) per run, median of
``--repeats``, next to dp-accounting's own DP-SGD computation at the same settings (its
PLDAccountant, sigma 4, p 0.01, 256 steps, delta 1e-6, grid 1e-4, in a subprocess that imports
only dp-accounting) in the same run; with ``--before``, the same command from another checkout
(e.g. the main one before the speed work), runs alternating so that all see the same load, and the
outputs (table and ``--json``, once each, JSON with the ``seconds`` fields dropped) compared with
this tree's, every differing JSON value listed with its relative change. ``--blas`` default, one or
both (default both): the children with no thread variables set, and/or limited to one thread
(``OPENBLAS_NUM_THREADS=1``, OMP, MKL), one CPU table each. The BLAS threads of the children are
reported (threadpoolctl, see below). ``--phases`` adds, first, the CPU seconds
of each phase (imports, the DP-SGD rows, MMCC's steps, the reduction's eigenvalue certificate),
timed inside the command by wrapping the library functions it calls, median of ``--repeats`` per
tree, alternating. ``--precompile`` compiles each tree's mfcli to bytecode first, as an installed
package is (where PYTHONDONTWRITEBYTECODE is set, every run otherwise compiles what it imports).
In the table "no thread variables set", the console entry point of a tree that has the rule
(mfcli.cli.entry.account_blas_environment) starts ``account`` with one BLAS thread; an older tree
runs with the BLAS default. The BLAS threads the command starts with are read in a child that
does what the tree's entry point does first, then loads numpy and scipy.special (whose OpenBLAS
is a second library) as the command does; ``--phases`` children start the same way.

``--paths``: the account command lines that do real BLAS work (the solver of ``-s optimal``, the
reduction's eigenvalue certificate at n = 2048, multi-participation sensitivity, balls-in-bins,
MMCC on a banded n = 2048, the calibration of ``--epsilon``), each run under the entry point's rule
(no thread variables set) and with the BLAS default thread count set explicitly
(``OPENBLAS_NUM_THREADS`` = the count OpenBLAS picks by itself, which bypasses the rule), runs
alternating, CPU and wall seconds (medians of ``--repeats``), and whether the ``--json`` numbers
are identical under both (timing fields dropped). ``--path-filter WORD`` keeps the command lines
that contain WORD.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def strategy(name: str, n: int) -> np.ndarray:
    from mfcli.strategies.baselines import sqrt_strategy_matrix

    if name == "identity":
        return np.eye(n)
    c = sqrt_strategy_matrix(n)
    if name == "sqrt (dense)":
        return c
    b = int(name.split("-")[0])
    return np.tril(np.triu(c, -(b - 1)))


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def header() -> str:
    from threadpoolctl import threadpool_info

    blas = ", ".join(f"{i.get('internal_api')}={i.get('num_threads')}" for i in threadpool_info()) or "none"
    load = os.getloadavg()
    from mfcli import __version__

    return (f"mfcli {__version__}, Python {platform.python_version()}, numpy {np.__version__}, "
            f"{os.cpu_count()} CPUs, BLAS threads: {blas}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 64 and 256 only")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--single-above", type=float, default=20.0)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--headline", action="store_true", help="time the README's headline command only")
    ap.add_argument("--before", type=Path, default=None, help="with --headline: another checkout to compare with")
    ap.add_argument("--blas", choices=("default", "one", "both"), default="both",
                    help="with --headline: BLAS threads of the children (default: no thread variables set; one: "
                         "OPENBLAS_NUM_THREADS=1 etc.; or both, one table each)")
    ap.add_argument("--phases", action="store_true",
                    help="with --headline: also the CPU seconds of each phase, timed inside the command")
    ap.add_argument("--paths", action="store_true",
                    help="time the account paths that do BLAS work under the entry point's rule and with the "
                         "BLAS default threads")
    ap.add_argument("--path-filter", default=None, help="with --paths: only the command lines containing this")
    ap.add_argument("--precompile", action="store_true",
                    help="with --headline: compile each tree's mfcli to bytecode first (python -m compileall), as an "
                         "installed package is; without it, where PYTHONDONTWRITEBYTECODE is set, every run compiles "
                         "the ~50 modules it imports (~0.15 s of CPU)")
    args = ap.parse_args(argv)
    if args.headline:
        return headline(args)
    if args.paths:
        return paths(args)

    import mfcli.accounting.mmcc as M
    from mfcli.accounting.single_pass import dpsgd

    sigma, p, delta = 4.0, 0.01, 1e-6
    ns = (64, 256) if args.quick else (64, 256, 1024, 2048)
    names = ("identity", "2-banded", "8-banded", "32-banded", "sqrt (dense)")
    print(header())
    print()
    print(f"MMCC, sigma = {sigma:g}, p = {p:g}, delta = {delta:g}; time = median of repeats (s); "
          "epsilon = MMCC upper bound [lower bound]")
    print()
    print("| strategy | n | MMCC time (s) | runs | MMCC epsilon | lower bound | DP-SGD epsilon | distinct rows | PLD grid |")
    print("|---|---|---|---|---|---|---|---|---|")
    last_time: dict[str, tuple[int, float]] = {}
    for name in names:
        for n in ns:
            if name == "32-banded" and n < 64:
                continue
            c = strategy(name, n)
            # dense cost grows like n^3 (tail problems x their length) and rows like n: estimate
            if name in last_time:
                n0, t0 = last_time[name]
                est = t0 * (n / n0) ** (3 if name == "sqrt (dense)" else 1)
                if est > args.max_seconds:
                    print(f"| {name} | {n} | not run (estimated {est:.0f} s > {args.max_seconds:.0f} s) | | | | | | |")
                    sys.stdout.flush()
                    continue
            run = lambda c=c: M.mmcc(c, sigma=sigma, sampling=p, delta=delta)  # noqa: E731
            t, r = timed(run, 1)
            runs = 1
            if t < args.single_above and args.repeats > 1:
                t2, r = timed(run, args.repeats - 1)
                t = statistics.median([t, t2] if args.repeats == 2 else [t] + [t2] * (args.repeats - 1))
                runs = args.repeats
            last_time[name] = (n, t)
            lb = M.lower_bound(c, sigma=sigma, sampling=p, delta=delta).epsilon
            sgd = dpsgd(sigma=sigma, sampling=p, steps=n, delta=delta).epsilon
            print(f"| {name} | {n} | {t:.2f} | {runs} | {r.epsilon:.4g} | {lb:.4g} | {sgd:.4g} | "
                  f"{r.distinct_rows} of {r.rows} | {r.value_discretization:g} |")
            sys.stdout.flush()

    if not args.no_ablation:
        print()
        n, name = 256, "8-banded"
        c = strategy(name, n)
        print(f"Alternatives side by side: {name}, n = {n}, sigma = {sigma:g}, p = {p:g} (one run each)")
        print()
        print("| variant | time (s) | epsilon |")
        print("|---|---|---|")
        variants = [
            ("default: FFT tail law, vectorised PLD builder, grid budget", dict()),
            ("exact direct-convolution tail law", dict(tail_method="direct")),
            ("no grid budget (every row PLD at 1e-4)", dict(pld_work_budget=None)),
            ("dp-accounting's MixtureOfGaussians PLD builder (PLDAccountant, 1e-4)", dict(engine="dp-accounting")),
        ]
        for label, kw in variants:
            t, r = timed(lambda kw=kw: M.mmcc(c, sigma=sigma, sampling=p, delta=delta, **kw), 1)
            print(f"| {label} | {t:.2f} | {r.epsilon:.6g} |")
            sys.stdout.flush()
    print()
    print(header())
    return 0


HEADLINE = ["account", "--sigma", "4", "--sampling", "0.01"]


def _strip_seconds(obj: object) -> object:
    """Timings dropped (``seconds``, ``seconds_per_run``, ...): everything else must be identical."""
    if isinstance(obj, dict):
        return {k: _strip_seconds(v) for k, v in obj.items() if not str(k).startswith("seconds")}
    if isinstance(obj, list):
        return [_strip_seconds(v) for v in obj]
    return obj


def _json_differences(before: object, after: object, path: str = "") -> list[str]:
    """Every leaf that differs between two JSON documents, as 'path: before -> after' (floats with
    their relative difference)."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for k in list(before) + [k for k in after if k not in before]:
            out += _json_differences(before.get(k), after.get(k), f"{path}/{k}")
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (a, b) in enumerate(zip(before, after, strict=True))
                for d in _json_differences(a, b, f"{path}[{i}]")]
    if before == after:
        return []
    if isinstance(before, float) and isinstance(after, float) and before:
        return [f"{path}: {before!r} -> {after!r} (relative {(after - before) / abs(before):+.2e})"]
    return [f"{path}: {before!r} -> {after!r}"]


#: Environment of a child limited to one BLAS (and OpenMP) thread.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run_child(argv: list[str], tree: Path, extra_env: dict | None = None) -> tuple[float, float, str]:
    """(CPU seconds of the child, wall seconds, stdout) of ``python argv`` run from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree), **(extra_env or {}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, *argv], env=env, cwd=tree, capture_output=True, text=True,
                         check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, out


def _run_cli(tree: Path, extra: list[str], extra_env: dict | None = None) -> tuple[float, float, str]:
    """(CPU seconds of the child, wall seconds, stdout) of ``mfcli`` + HEADLINE + extra from ``tree``."""
    cpu, wall, out = _run_child(["-m", "mfcli", *HEADLINE, *extra], tree, extra_env)
    # the shipped artifact's path names the checkout: the one difference allowed
    return cpu, wall, out.replace(str(tree), "<tree>")


#: dp-accounting alone on the headline's DP-SGD row: the cost of the reference computation.
DPSGD_CHILD = (
    "from dp_accounting import dp_event\n"
    "from dp_accounting.pld import pld_privacy_accountant\n"
    "acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)\n"
    "acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.01, "
    "dp_event.GaussianDpEvent(4.0)), 256))\n"
    "print(repr(acc.get_epsilon(1e-6)))\n"
)

#: The start of ``mfcli account`` in a tree: what the entry point does before numpy loads, where
#: the tree has it (the thread rule, numpy's tooling imported lazily).
ENTRY_RULE = (
    "import mfcli.cli.entry as _entry\n"
    "for _step in ('set_account_blas_threads', 'defer_numpy_tooling'):\n"
    "    if hasattr(_entry, _step):  # an older tree lacks it\n"
    "        getattr(_entry, _step)(['account'])\n"
)

#: The BLAS libraries and their thread counts as ``mfcli account`` starts with them (threadpoolctl).
BLAS_CHILD = ENTRY_RULE + (
    "import numpy, scipy.special\n"
    "from threadpoolctl import threadpool_info\n"
    "print(', '.join(f\"{i['filepath'].rsplit('/', 1)[-1].split('-')[0]}={i.get('num_threads')}\" "
    "for i in threadpool_info()) or 'none')\n"
)


#: The headline run in a child that times its phases (CPU seconds, ``time.process_time``) by wrapping
#: the library functions the service calls; prints one JSON object {phase: seconds} on stderr. A
#: function the tree lacks is skipped (the other checkout may predate it).
PHASES_CHILD = ENTRY_RULE + r"""
import collections, functools, json, sys, time
t0 = time.process_time()
from mfcli.cli.app import app
import mfcli.services.account as sa
imports = time.process_time() - t0
from mfcli.accounting import mmcc, reduction
acc = collections.defaultdict(float)
def wrap(mod, name, label):
    f = getattr(mod, name, None)
    if f is None:
        return
    @functools.wraps(f)
    def w(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.process_time() - t
    setattr(mod, name, w)
wrap(mmcc, "collect_tail_pairs", "MMCC: tail events collected")
wrap(mmcc, "tail_epsilons", "MMCC: tail epsilons")
wrap(mmcc, "build_row_groups", "MMCC: row mixtures")
wrap(mmcc, "choose_discretization", "MMCC: PLD grid choice")
wrap(mmcc, "_compose", "MMCC: row PLDs built and composed")
wrap(sa, "lower_bound", "MMCC: lower bound")
wrap(sa, "dpsgd", "DP-SGD reference row")
wrap(reduction, "_certified_eig_bound", "reduction: eigenvalue certificate")
wrap(sa, "reduction", "reduction row, all of it")
wrap(sa, "account", "services.account, all of it")
try:
    app(["account", "--sigma", "4", "--sampling", "0.01", "-q"])
except SystemExit:
    pass
acc["imports (CLI, services)"] = imports
acc["whole process"] = time.process_time() - t0
print(json.dumps(acc), file=sys.stderr)
"""


def phases(trees: list[tuple[str, Path]], repeats: int) -> None:
    """Median CPU seconds per phase of the headline in each tree (runs alternating)."""
    runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
    for _ in range(repeats):
        for label, tree in trees:
            env = dict(os.environ, PYTHONPATH=str(tree))
            err = subprocess.run([sys.executable, "-c", PHASES_CHILD], env=env, cwd=tree, capture_output=True,
                                 text=True, check=True).stderr
            runs[label].append(json.loads(err.strip().splitlines()[-1]))
    keys: list[str] = []
    for label, _ in trees:
        for r in runs[label]:
            keys += [k for k in r if k not in keys]
    print(f"CPU seconds per phase (time.process_time inside the command), median of {repeats} runs, "
          f"alternating; load average after: {os.getloadavg()[0]:.1f}")
    print()
    print("| phase | " + " | ".join(label for label, _ in trees) + " | runs (" +
          "; ".join(label for label, _ in trees) + ") |")
    print("|---|" + "---|" * len(trees) + "---|")
    for k in keys:
        cells = [statistics.median([r.get(k, 0.0) for r in runs[label]]) for label, _ in trees]
        alls = "; ".join(", ".join(f"{r.get(k, 0.0):.2f}" for r in runs[label]) for label, _ in trees)
        print(f"| {k} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {alls} |")
    print()


def headline(args: argparse.Namespace) -> int:
    here = Path(__file__).resolve().parent.parent
    trees = [("this tree", here)] + ([("before", args.before.resolve())] if args.before else [])
    if args.precompile:
        for _, tree in trees:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "mfcli")], check=True,
                           capture_output=True)
    print(header())
    print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; mfcli compiled to bytecode "
          f"beforehand: {'yes' if args.precompile else 'no (what the trees hold in __pycache__ is used)'}")
    for label, tree in trees:
        for mode, env in (("no thread variables set", None), ("OPENBLAS_NUM_THREADS=1 etc.", ONE_THREAD)):
            print(f"BLAS threads `mfcli account` starts with, {label}, {mode}: "
                  f"{_run_child(['-c', BLAS_CHILD], tree, env)[2].strip()}")
    print()
    if args.phases:
        phases(trees, args.repeats)
    unset = "no thread variables set (the entry point's rule where the tree has it, else the BLAS default)"
    modes = {"default": [(unset, None)], "one": [("one BLAS thread (OPENBLAS_NUM_THREADS=1 etc.)", ONE_THREAD)],
             "both": [(unset, None), ("one BLAS thread (OPENBLAS_NUM_THREADS=1 etc.)", ONE_THREAD)]}[args.blas]
    for mode, env in modes:
        cpu: dict[str, list[float]] = {label: [] for label, _ in [*trees, ("dp-accounting", here)]}
        wall: dict[str, list[float]] = {label: [] for label in cpu}
        dp_eps = ""
        for _ in range(args.repeats):
            for label, tree in trees:  # alternating, so all see the same load
                c, w, _ = _run_cli(tree, [], env)
                cpu[label].append(c)
                wall[label].append(w)
            c, w, dp_eps = _run_child(["-c", DPSGD_CHILD], here, env)
            cpu["dp-accounting"].append(c)
            wall["dp-accounting"].append(w)
        print(f"`mfcli {' '.join(HEADLINE)}` and dp-accounting's DP-SGD at the same settings, {mode}: CPU "
              f"seconds (user + system) per run, {args.repeats} runs each, alternating; load average after: "
              f"{os.getloadavg()[0]:.1f}")
        print()
        print("| code | CPU s (median) | CPU s (all runs) | wall s (median) |")
        print("|---|---|---|---|")
        rows = [*trees, ("dp-accounting", here)]
        for label, tree in rows:
            what = ("PLDAccountant, Poisson-sampled Gaussian x 256, epsilon " + dp_eps.strip()
                    if label == "dp-accounting" else f"{label} ({tree})")
            runs = ", ".join(f"{v:.2f}" for v in cpu[label])
            print(f"| {what} | {statistics.median(cpu[label]):.2f} | {runs} | {statistics.median(wall[label]):.1f} |")
        print()
    if args.before:
        outputs = {}
        for label, tree in trees:
            table = _run_cli(tree, [])[2]
            js = _strip_seconds(json.loads(_run_cli(tree, ["--json"])[2]))
            outputs[label] = (table, js)
        same_table = outputs["this tree"][0] == outputs["before"][0]
        same_json = outputs["this tree"][1] == outputs["before"][1]
        print()
        print(f"table output identical: {same_table}; --json identical (timing fields dropped): {same_json} "
              "(the checkout's path in the source line replaced by <tree>)")
        for line in _json_differences(outputs["before"][1], outputs["this tree"][1]):
            print(f"  --json differs: {line}")
        if not same_table:
            import difflib

            print("\n".join(difflib.unified_diff(outputs["before"][0].splitlines(),
                                                outputs["this tree"][0].splitlines(), lineterm="")))
    print()
    print(header())
    return 0


#: Account command lines that do real BLAS work ({dir}: the inputs written by _path_inputs).
#: sqrtvar: S^1/2 with rows scaled by 1 + 0.1 cos(t), so no Toeplitz shortcut skips the reduction's
#: eigenvalue certificate (a dense n x n eigendecomposition above the one-thread limit n = 1024).
ACCOUNT_PATHS = (
    "account --sigma 4 --sampling 0.01",
    "account -s optimal --n 1024 --sigma 4",
    "account -s optimal --n 2048 --sigma 4",
    "account {dir}/sqrtvar2048.npy --sigma 4 --batching balls-in-bins",
    "account {dir}/sqrtvar2048.npy --sigma 4 --epochs 4",
    "account {dir}/sqrtvar2048.npy --sigma 4 --min-sep 128",
    "account {dir}/band8_2048.npy --sigma 4 --sampling 0.01",
    "account -s tree --n 2048 --sigma 4 --batching balls-in-bins",
    "account --epsilon 8 --sampling 0.01",
)


def _path_inputs(directory: Path) -> None:
    """The .npy strategies of ACCOUNT_PATHS, written once."""
    from mfcli.strategies.baselines import sqrt_strategy_matrix

    s = sqrt_strategy_matrix(2048)
    if not (directory / "sqrtvar2048.npy").exists():
        np.save(directory / "sqrtvar2048.npy", s * (1 + 0.1 * np.cos(np.arange(2048)))[:, None])
    if not (directory / "band8_2048.npy").exists():
        np.save(directory / "band8_2048.npy", np.tril(np.triu(s, -7)))


def _default_blas_threads(tree: Path) -> int:
    """The thread count the BLAS picks by itself (numpy's OpenBLAS, no thread variables set)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                                                          "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    child = "import numpy\nfrom threadpoolctl import threadpool_info\nprint(max(i['num_threads'] for i in threadpool_info()))"
    out = subprocess.run([sys.executable, "-c", child], env=dict(env, PYTHONPATH=str(tree)), cwd=tree,
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def paths(args: argparse.Namespace) -> int:
    """Each account path under the entry point's rule and with the BLAS default threads, side by side."""
    import tempfile

    here = Path(__file__).resolve().parent.parent
    if args.precompile:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(here / "mfcli")], check=True, capture_output=True)
    threads = _default_blas_threads(here)
    modes = [("rule (no thread variables set)", None),
             (f"BLAS default (OPENBLAS_NUM_THREADS={threads})", {"OPENBLAS_NUM_THREADS": str(threads)})]
    print(header())
    for label, env in modes:
        print(f"BLAS threads `mfcli account` starts with, {label}: "
              f"{_run_child(['-c', BLAS_CHILD], here, env)[2].strip()}")
    print()
    print(f"`mfcli account` paths, CPU and wall seconds (medians of {args.repeats} runs, the two settings "
          "alternating); numbers: --json under both settings, timing fields dropped")
    print()
    print("| command | CPU s, rule | CPU s, BLAS default | wall s, rule | wall s, BLAS default | load before | "
          "--json identical |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench_account_") as tmp:
        _path_inputs(Path(tmp))
        for line in ACCOUNT_PATHS:
            if args.path_filter and args.path_filter not in line:
                continue
            argv = line.format(dir=tmp).split()
            cpu: dict[str, list[float]] = {label: [] for label, _ in modes}
            wall: dict[str, list[float]] = {label: [] for label, _ in modes}
            load = os.getloadavg()[0]
            for _ in range(args.repeats):
                for label, env in modes:
                    c, w, _ = _run_child(["-m", "mfcli", *argv, "-q"], here, env)
                    cpu[label].append(c)
                    wall[label].append(w)
            outs = [_strip_seconds(json.loads(_run_child(["-m", "mfcli", *argv, "-q", "--json"], here, env)[2]))
                    for _, env in modes]
            same = outs[0] == outs[1]
            diffs = "" if same else "; ".join(_json_differences(outs[1], outs[0])[:3])
            cells = [f"{statistics.median(d[label]):.2f}" for d in (cpu, wall) for label, _ in modes]
            shown = line.format(dir="<tmp>")
            print(f"| `{shown}` | " + " | ".join(cells) + f" | {load:.1f} | {'yes' if same else 'NO: ' + diffs} |")
            sys.stdout.flush()
    print()
    print(header())
    return 0


if __name__ == "__main__":
    sys.exit(main())
