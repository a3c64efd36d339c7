"""CPU seconds of balls-in-bins accounting in two checkouts, side by side: the whole
``mfcli account ... --batching balls-in-bins`` command, and the library brackets alone.

* command: a fresh ``python -m mfcli account ...`` per run (stdout and stderr discarded), its CPU
  time (user + system) from ``resource.getrusage(RUSAGE_CHILDREN)`` around it
  (``bench_account_imports.cpu_seconds``);
* library: a fresh child per run that imports mfcli.accounting.balls_in_bins and dp-accounting
  (both checkouts, so that neither pays the import inside the timed part) and times
  ``tree_balls_in_bins(n, sigma)`` and ``dpsgd_balls_in_bins(n, sigma)`` (the CLI's automatic
  grid) with ``time.process_time()``, printing the brackets too (they must be equal).

The checkouts alternate (old, new, old, new, ...) so both see the same load; medians of
``--runs`` are reported with min and max, the load average before and after and the children's
BLAS threads (threadpoolctl; ``--blas-threads`` limits them in the library children).

    python scripts/bench_balls_in_bins.py --old /work/main --new . [--runs 5] [--n 64 --sigma 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# the child's CPU seconds, its environment and BLAS threads are measured as the import bench does
from bench_account_imports import _env, blas_threads, cpu_seconds

_LIBRARY = """
import json, sys, time
from threadpoolctl import threadpool_limits
import dp_accounting.pld.privacy_loss_distribution  # noqa: F401  (both checkouts: not timed)
from mfcli.accounting.balls_in_bins import dpsgd_balls_in_bins, tree_balls_in_bins
n, sigma, threads = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
out = {}
with threadpool_limits(limits=None if threads == "default" else int(threads)):
    for name, fn in (("tree", tree_balls_in_bins), ("dpsgd", dpsgd_balls_in_bins)):
        t0 = time.process_time()
        res = fn(n=n, sigma=sigma)
        out[name] = [time.process_time() - t0, res.lower, res.epsilon, res.grid]
print(json.dumps(out))
"""


def library_cpu(n: int, sigma: float, threads: str, root: Path) -> dict[str, list[float]]:
    res = subprocess.run([sys.executable, "-c", _LIBRARY, str(n), str(sigma), threads], env=_env(root), cwd=root,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def _cell(t: list[float]) -> str:
    return f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="checkout before the change")
    p.add_argument("--new", type=Path, default=Path(__file__).resolve().parent.parent, help="checkout after it")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--sigma", type=float, default=2.0)
    p.add_argument("--blas-threads", default="default", help="BLAS threads in the library children (or 'default')")
    a = p.parse_args()
    roots = {"old": a.old.resolve(), "new": a.new.resolve()}
    args = ["account", "--strategy", "tree", "--n", str(a.n), "--sigma", str(a.sigma), "--batching", "balls-in-bins",
            "-q"]
    load0 = os.getloadavg()
    cmd: dict[str, list[float]] = {k: [] for k in roots}
    lib: dict[str, dict[str, list[float]]] = {k: {"tree": [], "dpsgd": []} for k in roots}
    brackets: dict[str, set[str]] = {k: set() for k in roots}
    for _ in range(a.runs):
        for k, root in roots.items():
            cmd[k].append(cpu_seconds([sys.executable, "-m", "mfcli", *args], root))
            for name, (t, *bracket) in library_cpu(a.n, a.sigma, a.blas_threads, root).items():
                lib[k][name].append(t)
                brackets[k].add(f"{name} {bracket}")
    load1 = os.getloadavg()
    print(f"{a.runs} runs each, alternating; load average {load0[0]:.2f} before, {load1[0]:.2f} after; "
          f"{os.cpu_count()} CPUs; BLAS: {blas_threads(roots['new'])} (library children: {a.blas_threads})\n")
    print(f"| checkout | `mfcli {' '.join(args)}` CPU s | tree_balls_in_bins CPU s | dpsgd_balls_in_bins CPU s |")
    print("|---|---|---|---|")
    for k, root in roots.items():
        print(f"| {k} ({root}) | {_cell(cmd[k])} | {_cell(lib[k]['tree'])} | {_cell(lib[k]['dpsgd'])} |")
    print("\nbrackets [lower, upper, grid] (equal in both checkouts: "
          f"{brackets['old'] == brackets['new']}): " + "; ".join(sorted(brackets["new"])))
    print("all runs (CPU s): " + "; ".join(
        f"{k}: command " + ", ".join(f"{x:.2f}" for x in cmd[k]) + ", tree " + ", ".join(
            f"{x:.2f}" for x in lib[k]["tree"]) + ", dpsgd " + ", ".join(f"{x:.2f}" for x in lib[k]["dpsgd"])
        for k in roots))


if __name__ == "__main__":
    main()
