"""What the composition certificate (mfcli.accounting.pld_certify) costs and changes: per case,
the run's epsilon (pld_ops, dp-accounting's arithmetic) against the certified one, and the CPU
of the certificate against that of the run's own composition (the recorded tree replayed with
pld_ops), medians of ``--repeat``, one BLAS thread (threadpoolctl). With ``--cli DIR ...``: the
CPU of the headline ``mfcli account --sigma 4 --sampling 0.01`` and of a cyclic-Poisson
calibration (:data:`CLI`; a subprocess per run, RUSAGE_CHILDREN) for each source tree given,
interleaved, medians.

Cases (docs/performance.md, "FFT round-off of PLD composition"): a (identity n 64, sigma 0.6,
p 0.3, delta 1e-10), b (the headline's MMCC), c / c10 (DP-SGD sigma 1, p 0.1, 256 steps, grid
1e-4, delta 1e-6 / 1e-10: the tree built here with pld_certify, as single_pass builds it), d (tree
n 64, sigma 8, p 0.05, delta 1e-10).

Usage: python scripts/bench_pld_certify.py [--cases a,b,c,c10,d] [--repeat 3] [--cli /work/main .]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import statistics
import subprocess
import sys
import time

from threadpoolctl import threadpool_limits

from mfcli.accounting import pld_certify as pc
from mfcli.accounting import pld_ops, single_pass

ARGS = {
    "a": ["--strategy", "identity", "--n", "64", "--sigma", "0.6", "--sampling", "0.3", "--delta", "1e-10"],
    "b": ["--sigma", "4", "--sampling", "0.01"],
    "d": ["--strategy", "tree", "--n", "64", "--sigma", "8", "--sampling", "0.05", "--delta", "1e-10"],
}
#: What ``--cli`` times: the headline, and a cyclic-Poisson calibration (every step certifies).
CLI = {
    "headline `account --sigma 4 --sampling 0.01`": ARGS["b"],
    "cyclic calibration `--strategy identity --n 64 --epsilon 4 --sampling 0.3 --batching cyclic --min-sep 4`":
        ["--strategy", "identity", "--n", "64", "--epsilon", "4", "--sampling", "0.3", "--batching", "cyclic",
         "--min-sep", "4"],
}


def record(name: str) -> tuple[pc.Node, float]:
    """The composition tree MMCC certifies (its last one: the reported tail fraction's is among
    them; every case here tries one) and its delta_pld."""
    if name in ("c", "c10"):
        node = pc.self_compose(pc.leaf(single_pass._poisson_gaussian_pld(1.0, 0.1, 1e-4)), 256)
        return node, 1e-6 if name == "c" else 1e-10
    import typer.main

    from mfcli.cli.app import app

    seen: list = []
    orig = pc.certified_epsilon

    def spy(node: pc.Node, delta: float) -> float:
        seen.append((node, delta))
        return orig(node, delta)

    pc.certified_epsilon = spy  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with contextlib.suppress(SystemExit):
                typer.main.get_command(app).main(["account", "--json", *ARGS[name]], standalone_mode=False)
    finally:
        pc.certified_epsilon = orig  # type: ignore[assignment]
    return seen[-1]


def replay(node: pc.Node) -> pld_ops.Pld:
    """The run's composition again (pld_ops), from the recorded leaves."""
    if node.kind == "leaf":
        return node.pld
    if node.kind == "self":
        return pld_ops.self_compose(node.children[0].pld, node.times, node.tail)
    return pld_ops.compose(replay(node.children[0]), replay(node.children[1]), node.tail)


def cpu(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def cli_cpu(trees: list[str], repeat: int, args: list[str]) -> dict[str, float]:
    out: dict[str, list[float]] = {t: [] for t in trees}
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for _ in range(repeat):
        for tree in trees:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "mfcli", "account", *args], cwd=tree, check=True,
                           env=dict(env, PYTHONPATH=os.path.abspath(tree)), capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            out[tree].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {t: statistics.median(v) for t, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="a,b,c,c10,d")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cli", nargs="*", default=[], help="source trees whose headline CLI CPU to compare")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print("| case | delta | eps run | eps certified | certified / run - 1 | theta (remove, add) | "
          "CPU s: run's composition | CPU s: certificate |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    with threadpool_limits(1):
        for name in [c for c in args.cases.split(",") if c]:
            node, delta = record(name)
            eps_run = float(pld_ops.epsilon_for_delta(node.pld, delta))
            eps_cert = pc.certified_epsilon(node, delta)
            thetas = pc.certificate(node, eps_run).thetas
            t_run = cpu(lambda node=node: replay(node), args.repeat)
            t_cert = cpu(lambda node=node, delta=delta: pc.certified_epsilon(node, delta), args.repeat)
            th = ", ".join(f"{v:.3g}" for v in thetas.values())
            print(f"| {name} | {delta:g} | {eps_run:.10g} | {eps_cert:.10g} | {eps_cert / eps_run - 1:.2g} | {th} | "
                  f"{t_run:.3f} | {t_cert:.3f} |", flush=True)
    if args.cli:
        for label, cli_args in CLI.items():
            print(f"\n| source tree | {label}: CPU s (median) |\n|---|---:|")
            for tree, t in cli_cpu(args.cli, args.repeat, cli_args).items():
                print(f"| {tree} | {t:.2f} |", flush=True)


if __name__ == "__main__":
    main()
