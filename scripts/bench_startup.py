"""Start-up cost of the mfcli command line: CPU seconds per invocation and the top imports.

Every case runs in a fresh child process ``python -m mfcli ...``; its CPU time (user + system) is
read with ``resource.getrusage(RUSAGE_CHILDREN)`` around the child, so the figure does not depend
on how loaded the machine is the way wall time does. The median over ``--runs`` runs is reported,
then the slowest imports of each case from ``python -X importtime`` (cumulative microseconds).

    python scripts/bench_startup.py                      # this checkout
    python scripts/bench_startup.py --root /other/checkout --label before

``--root`` puts another checkout first on PYTHONPATH, to measure before and after a change with
the same interpreter and libraries.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def cpu_seconds(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """CPU time (user + system) of one child process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def top_imports(argv: list[str], env: dict[str, str], cwd: str, k: int) -> list[tuple[int, str]]:
    """The k imports with the largest cumulative time (microseconds), outermost first."""
    res = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )
    rows = []
    for line in res.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        rows.append((int(parts[1]), parts[2].strip()))
    rows.sort(reverse=True)
    return rows[:k]


def blas_threads() -> str:
    try:
        import numpy  # noqa: F401
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    info = [f"{p.get('internal_api')} {p.get('version')}: {p.get('num_threads')} threads" for p in threadpool_info()]
    return "; ".join(info) or "none loaded"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=HERE, help="checkout to measure (default: this one)")
    p.add_argument("--label", default="", help="label for the table's column")
    p.add_argument("--runs", type=int, default=7, help="runs per case (median reported)")
    p.add_argument("--top", type=int, default=5, help="slowest imports shown per case")
    args = p.parse_args()
    env = _env(args.root.resolve())
    py = sys.executable

    # Children run in a scratch directory: `python -m` puts the working directory first on
    # sys.path, which would shadow --root with whatever checkout the script is started from.
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "prefix-n16.h5"
        subprocess.run([py, "-m", "mfcli", "optimize", "-w", "prefix", "--n", "16", "--out", str(small), "-q"],
                       env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        cases = {
            "mfcli --help": ["--help"],
            "mfcli --version": ["--version"],
            "mfcli inspect (n = 16)": ["inspect", str(small)],
            "mfcli inspect --no-certificate (n = 16)": ["inspect", str(small), "--no-certificate"],
            "mfcli account --help": ["account", "--help"],
            "mfcli optimize --help": ["optimize", "--help"],
            "mfcli compare --help": ["compare", "--help"],
        }
        load = os.getloadavg()
        print(f"# {args.label or args.root}: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
              f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; BLAS: {blas_threads()}")
        print(f"\n| command | CPU s (median of {args.runs}) | min | max |\n|---|---|---|---|")
        offenders: dict[str, list[tuple[int, str]]] = {}
        for name, rest in cases.items():
            argv = [py, "-m", "mfcli", *rest]
            times = [cpu_seconds(argv, env, tmp) for _ in range(args.runs)]
            print(f"| `{name}` | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} |")
            offenders[name] = top_imports(argv, env, tmp, args.top)
        print("\nSlowest imports (cumulative ms, `python -X importtime`):\n")
        for name, rows in offenders.items():
            print(f"- `{name}`: " + ", ".join(f"{mod} {us / 1000:.0f}" for us, mod in rows))
        load = os.getloadavg()
        print(f"\nload average at the end: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")


if __name__ == "__main__":
    main()
