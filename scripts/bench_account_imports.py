"""CPU seconds of ``mfcli account --sigma 4 --sampling 0.01`` in two checkouts, side by side, and
what each imports: dp-accounting or not, and the cumulative import time of the heavy modules.

Every run is a fresh child process (``python -m mfcli account ...``, stdout and stderr discarded);
its CPU time (user + system) is read with ``resource.getrusage(RUSAGE_CHILDREN)`` around it, so the
figure depends less on the machine's load than wall time does. The two checkouts run alternately
(old, new, old, new, ...) so that both see the same load; the median of ``--runs`` is reported per
checkout, with the load average before and after and the children's BLAS threads (threadpoolctl).
Then, once per checkout: whether ``dp_accounting`` is in ``sys.modules`` when the command ends (the
CLI ends with ``os._exit``, patched in the child to report first), and ``python -X importtime``'s
cumulative microseconds (wall time, so load-dependent) of dp_accounting, scipy.signal, scipy.stats
and scipy.optimize where they are imported at the top of an import chain.

    python scripts/bench_account_imports.py --old /work/main --new . [--runs 7] [--args "..."]
"""
from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HEAVY = ("dp_accounting", "scipy.signal", "scipy.stats", "scipy.optimize")

_PROBE = """
import os, sys
_exit = os._exit
def _report(code):
    sys.stdout.flush()
    sys.stderr.write("\\nDP_ACCOUNTING_IMPORTED=%s\\n" % ("dp_accounting" in sys.modules))
    _exit(code)
os._exit = _report
sys.argv = ["mfcli", *sys.argv[1:]]
from mfcli.cli.entry import main
main()
"""


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    return env


def cpu_seconds(argv: list[str], root: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=_env(root), cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def imports_dp_accounting(args: list[str], root: Path) -> bool:
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], env=_env(root), cwd=root, capture_output=True,
                         text=True, check=True)
    return res.stderr.strip().splitlines()[-1].endswith("True")


def heavy_imports(args: list[str], root: Path) -> dict[str, int]:
    """Cumulative microseconds of each HEAVY module at its first (outermost) import."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "mfcli", *args], env=_env(root), cwd=root,
                         capture_output=True, text=True, check=True)
    out: dict[str, int] = {}
    for line in res.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].strip()
        if name in HEAVY and name not in out:
            out[name] = int(parts[1])
    return out


def blas_threads(root: Path) -> str:
    code = ("import numpy, scipy.linalg\nfrom threadpoolctl import threadpool_info\n"
            "print('; '.join(f\"{p.get('internal_api')}: {p.get('num_threads')} threads\" for p in threadpool_info()))")
    res = subprocess.run([sys.executable, "-c", code], env=_env(root), capture_output=True, text=True, check=False)
    return res.stdout.strip() or res.stderr.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="checkout before the change")
    p.add_argument("--new", type=Path, default=Path(__file__).resolve().parent.parent, help="checkout after it")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--args", default="account --sigma 4 --sampling 0.01 -q", help="the mfcli command line")
    a = p.parse_args()
    args = shlex.split(a.args)
    roots = {"old": a.old.resolve(), "new": a.new.resolve()}
    argv = [sys.executable, "-m", "mfcli", *args]
    load0 = os.getloadavg()
    times: dict[str, list[float]] = {k: [] for k in roots}
    for _ in range(a.runs):
        for k, root in roots.items():
            times[k].append(cpu_seconds(argv, root))
    load1 = os.getloadavg()
    print(f"`mfcli {a.args}`, {a.runs} runs each, alternating; load average {load0[0]:.2f} before, "
          f"{load1[0]:.2f} after; {os.cpu_count()} CPUs; BLAS: {blas_threads(roots['new'])}\n")
    print("| checkout | CPU s median | min | max | imports dp_accounting | " + " | ".join(
        f"{m} (ms, -X importtime)" for m in HEAVY) + " |")
    print("|---|---|---|---|---|" + "---|" * len(HEAVY))
    for k, root in roots.items():
        t = times[k]
        heavy = heavy_imports(args, root)
        cells = " | ".join(f"{heavy[m] / 1000:.0f}" if m in heavy else "not imported" for m in HEAVY)
        print(f"| {k} ({root}) | {statistics.median(t):.2f} | {min(t):.2f} | {max(t):.2f} | "
              f"{imports_dp_accounting(args, root)} | {cells} |")
    print("\nall runs (CPU s): " + "; ".join(f"{k}: " + ", ".join(f"{x:.2f}" for x in v) for k, v in times.items()))


if __name__ == "__main__":
    main()
