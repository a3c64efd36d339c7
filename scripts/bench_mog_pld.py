"""CPU of the MMCC row PLDs (mfcli.accounting.mog_pld) on the headline's rows: the mixtures
``mfcli account --sigma 4 --sampling 0.01`` builds (256 rows, built together by ``mixture_plds``,
and the DP-SGD reduction's leaf), collected by running the CLI in-process once, then timed for
each source tree given (a subprocess per tree and repeat, interleaved; time.process_time around
the loop only, one BLAS thread), medians of ``--repeat``, two ways: ``together`` (the calls as the
headline makes them) and ``alone`` (one ``mixture_pld`` call per mixture, as trees before
``mixture_plds`` built them; the only way such a tree is timed). With ``--whole``: the CPU of the
whole headline command too (a subprocess per run, RUSAGE_CHILDREN), per tree. With ``--profile``: a
cProfile of the ``together`` loop in this tree (top functions by own time).

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
    """Run the headline in this process, writing (sigma, mixtures, keywords) of every
    ``mixture_plds`` call (``mixture_pld`` is one of one mixture) to ``path`` (the CLI ends with
    os._exit: the calls are written before it)."""
    import contextlib
    import io

    from mfcli.accounting import mog_pld

    calls: list = []
    orig = mog_pld.mixture_plds

    def spy(sigma, mixtures, **kwargs):
        calls.append((sigma, [(list(map(float, s)), list(map(float, q)), float(e)) for s, q, e in mixtures], kwargs))
        return orig(sigma, mixtures, **kwargs)

    def dump() -> None:
        with open(path, "wb") as f:
            pickle.dump(calls, f)

    mog_pld.mixture_plds = spy  # type: ignore[assignment]
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


def work(path: str, profile: bool, mode: str) -> None:
    """Time the collected calls (one pass) ``together`` or ``alone``, print the CPU seconds."""
    from threadpoolctl import threadpool_limits

    from mfcli.accounting import mog_pld

    with open(path, "rb") as f:
        calls = pickle.load(f)
    together = mode == "together" and hasattr(mog_pld, "mixture_plds")

    def run() -> None:
        for sigma, mixtures, kwargs in calls:
            if together:
                mog_pld.mixture_plds(sigma, mixtures, **kwargs)
            else:
                for s, q, e in mixtures:
                    mog_pld.mixture_pld(sigma, s, q, probability_error=e, **kwargs)

    with threadpool_limits(1):
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            run()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return
        t0 = time.process_time()
        run()
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
    ap.add_argument("--mode", default="together", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.collect:
        collect(a.collect)
        return
    if a.work:
        work(a.work, a.profile, a.mode)
        return
    me = os.path.abspath(__file__)
    modes = ("together", "alone")
    with tempfile.TemporaryDirectory() as tmp:
        rows = os.path.join(tmp, "rows.pkl")
        subprocess.run([sys.executable, me, "--collect", rows], env=_env(a.trees[0]), check=True)
        with open(rows, "rb") as f:
            got = pickle.load(f)
        print(f"{len(got)} mixture_plds calls ({sum(len(m) for _, m, _ in got)} mixtures) collected from the headline")
        if a.profile:
            subprocess.run([sys.executable, me, "--work", rows, "--profile"], env=_env(a.trees[0]), check=True)
            return
        cpu: dict[tuple[str, str], list[float]] = {(t, m): [] for t in a.trees for m in modes}
        whole_cpu: dict[str, list[float]] = {t: [] for t in a.trees}
        for _ in range(a.repeat):
            for t in a.trees:
                for m in modes:
                    out = subprocess.run([sys.executable, me, "--work", rows, "--mode", m], env=_env(t), check=True,
                                         capture_output=True, text=True).stdout
                    cpu[(t, m)].append(float(out.split()[-1]))
                if a.whole:
                    whole_cpu[t].append(whole(t))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for t in a.trees:
        line = f"{t}:"
        for m in modes:
            line += f" {m} {statistics.median(cpu[(t, m)]):.3f} s CPU (median of {a.repeat}: "
            line += " ".join(f"{v:.3f}" for v in cpu[(t, m)]) + ");"
        if a.whole:
            line += f" whole headline {statistics.median(whole_cpu[t]):.3f} s"
        print(line)


if __name__ == "__main__":
    main()
