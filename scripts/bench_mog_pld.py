"""CPU of the MMCC row PLDs (mfcli.accounting.mog_pld.mixture_pld) on the headline's rows: the
mixtures ``mfcli account --sigma 4 --sampling 0.01`` builds (257 calls: 256 rows and the DP-SGD
reference), collected by running the CLI in-process once, then every call timed for each source
tree given (a subprocess per tree and repeat, interleaved; time.process_time around the loop over
all rows only, one BLAS thread), medians of ``--repeat``. With ``--whole``: the CPU of the whole
headline command too (a subprocess per run, RUSAGE_CHILDREN), per tree. With ``--profile``: a
cProfile of the row loop in this tree (top functions by own time).

Usage: python scripts/bench_mog_pld.py [--trees /path/to/old/tree .] [--repeat 5] [--whole] [--profile]
"""
from __future__ import annotations

import argparse
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HEADLINE = ["account", "--sigma", "4", "--sampling", "0.01"]


def collect(path: str) -> None:
    """Run the headline in this process, writing the arguments of every mixture_pld call to ``path``
    (the CLI ends with os._exit: the calls are written before it)."""
    import contextlib
    import io

    from mfcli.accounting import mog_pld

    calls: list = []
    orig = mog_pld.mixture_pld

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return orig(*args, **kwargs)

    def dump() -> None:
        with open(path, "wb") as f:
            pickle.dump(calls, f)

    mog_pld.mixture_pld = spy
    real_exit = os._exit

    def exit_(code: int) -> None:
        dump()
        real_exit(0)

    os._exit = exit_  # type: ignore[assignment]
    from mfcli.cli.entry import main

    sys.argv = ["mfcli", *HEADLINE]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main()
        except SystemExit:
            pass
    dump()


def work(path: str, profile: bool) -> None:
    """Time mixture_pld over the collected calls (one pass), print the CPU seconds."""
    from threadpoolctl import threadpool_limits

    from mfcli.accounting import mog_pld

    with open(path, "rb") as f:
        calls = pickle.load(f)
    with threadpool_limits(1):
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for args, kwargs in calls:
                mog_pld.mixture_pld(*args, **kwargs)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return
        t0 = time.process_time()
        for args, kwargs in calls:
            mog_pld.mixture_pld(*args, **kwargs)
        print(time.process_time() - t0)


def _env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.path.abspath(tree), "OPENBLAS_NUM_THREADS": "1"}


def whole(tree: str) -> float:
    """CPU seconds (user + system, children) of one headline run from ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = f"import sys; from mfcli.cli.entry import main; sys.argv[1:] = {HEADLINE!r}; main()"
    subprocess.run([sys.executable, "-c", code], env=_env(tree), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", default=["."])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--whole", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--collect", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.collect:
        collect(a.collect)
        return
    if a.work:
        work(a.work, a.profile)
        return
    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as tmp:
        rows = os.path.join(tmp, "rows.pkl")
        subprocess.run([sys.executable, me, "--collect", rows], env=_env(a.trees[0]), check=True)
        with open(rows, "rb") as f:
            print(f"{len(pickle.load(f))} mixture_pld calls collected from the headline")
        if a.profile:
            subprocess.run([sys.executable, me, "--work", rows, "--profile"], env=_env(a.trees[0]), check=True)
            return
        rows_cpu: dict[str, list[float]] = {t: [] for t in a.trees}
        whole_cpu: dict[str, list[float]] = {t: [] for t in a.trees}
        for _ in range(a.repeat):
            for t in a.trees:
                out = subprocess.run([sys.executable, me, "--work", rows], env=_env(t), check=True,
                                     capture_output=True, text=True).stdout
                rows_cpu[t].append(float(out.split()[-1]))
                if a.whole:
                    whole_cpu[t].append(whole(t))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for t in a.trees:
        line = f"{t}: rows {statistics.median(rows_cpu[t]):.3f} s CPU (median of {a.repeat}: "
        line += " ".join(f"{v:.3f}" for v in rows_cpu[t]) + ")"
        if a.whole:
            line += f"; whole headline {statistics.median(whole_cpu[t]):.3f} s"
        print(line)


if __name__ == "__main__":
    main()
