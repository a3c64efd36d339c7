#!/usr/bin/env python
"""Benchmark: test accuracy of mfcli's private training beside DP-SGD at the same epsilon, under one
learning-rate protocol for both arms (docs/training.md, "Measured"), several seeds, one command.

Protocol, the same for every arm, framework, epsilon and seed:

1. the training split (``--examples``, 4,000 of MNIST-5k) is cut into its first N - V examples
   and a validation split of its last V (``--validation``, 500); the 1,000 test examples are not
   looked at until step 3;
2. each arm is trained on the N - V examples at every rate of ``--lr-grid`` (same grid for both
   arms) with this seed and scored on the V; it takes the rate with the best validation accuracy
   (ties: the smaller rate). Every seed tunes afresh (no rate carried over from another seed);
3. each arm is trained on all N examples at its rate with this seed and scored on the test set.

The mfcli arm is ``examples/plan_to_torch.py`` (``make_private_with_epsilon``: plan's
recommendation, or the row ``--batching``/``--bands`` leave it) or ``examples/plan_to_jax.py``
(``plan_and_write`` + ``mfcli.training.jax.make_private``); the DP-SGD arm is Opacus's
``make_private_with_epsilon`` (PRV accountant) or jax_privacy 2.0's DP-SGD (its PLD calibration).
A seed fixes the model initialisation, the batches and the noise of both arms. Plans are
seed-independent and computed once per (framework, epsilon, training-set size).

Each run prints one JSON line (the example's object plus ``framework``) on stdout and appends it
to ``--out``; ``--summarize FILE...`` prints the Markdown tables of the runs and of the means (sample standard
deviation) over seeds and the medians of CPU seconds per epoch of the final runs. Runs already in
``--out`` are skipped, so an interrupted benchmark resumes.

Usage (about 3 CPU minutes per seed and epsilon in PyTorch, 6 in JAX, on MNIST-5k):
    OMP_NUM_THREADS=1 nice -n 5 python scripts/bench_accuracy.py --frameworks torch --epsilons 4,8 \\
        --seeds 0,1,2 --out /tmp/accuracy.jsonl
    python scripts/bench_accuracy.py --summarize /tmp/accuracy.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

GRID = "0.25,0.35,0.5,0.7,1,1.4"


def _config(batching: str | None, bands: str | None, momentum: float = 0.0) -> str:
    base = "plan" if not (batching or bands) else f"batching={batching or '*'} bands={bands or '*'}"
    return base + (f" momentum={momentum:g}" if momentum else "")


def _key(row: dict) -> tuple:
    return row["framework"], float(row["target_epsilon"]), int(row["seed"]), row.get("config", "plan"), \
        bool(row.get("dpsgd_accuracy") is None)


def _example_args(module: Any, fw: str, bench: argparse.Namespace, epsilon: float, seed: int) -> argparse.Namespace:
    argv = ["--dataset", bench.dataset, "--examples", str(bench.examples), "--batch", str(bench.batch),
            "--epochs", str(bench.epochs), "--epsilon", str(epsilon), "--delta", str(bench.delta),
            "--seed", str(seed), "--lr-grid", bench.lr_grid, "--validation", str(bench.validation)]
    argv += ["--batching", bench.batching] if bench.batching else []
    argv += ["--bands", bench.bands] if bench.bands else []
    argv += ["--no-dpsgd"] if bench.no_dpsgd else []
    argv += ["--threads", str(bench.threads)] if fw == "torch" else []
    argv += ["--momentum", str(bench.momentum)] if bench.momentum else []
    return module.finish_args(module.parser().parse_args(argv))


def bench(args: argparse.Namespace) -> int:
    done = set()
    if args.out and Path(args.out).exists():
        done = {_key(json.loads(line)) for line in Path(args.out).read_text().splitlines() if line.strip()}
    config = _config(args.batching, args.bands, args.momentum)
    if args.momentum and "jax" in args.frameworks.split(","):
        print("error: --momentum is an option of the PyTorch example only", file=sys.stderr)
        return 2
    for fw in args.frameworks.split(","):
        if fw == "torch":
            import plan_to_torch as example
            import torch

            torch.set_num_threads(args.threads)
            example.quiet()
        else:
            import plan_to_jax as example  # type: ignore[no-redef]
        for eps in (float(e) for e in args.epsilons.split(",")):
            with tempfile.TemporaryDirectory() as workdir:   # this setup's plans, shared by the seeds
                for seed in (int(s) for s in args.seeds.split(",")):
                    if (fw, eps, seed, config, bool(args.no_dpsgd)) in done:
                        print(f"skipping {fw} epsilon {eps} seed {seed} ({config}): in {args.out}", file=sys.stderr)
                        continue
                    row = {"framework": fw, "config": config,
                           **example.run(_example_args(example, fw, args, eps, seed), Path(workdir))}
                    line = json.dumps(row)
                    print(line, flush=True)
                    if args.out:
                        with open(args.out, "a") as f:
                            f.write(line + "\n")
    return 0


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f} (one seed)"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def summarize(paths: list[str]) -> int:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["framework"], r["target_epsilon"], r.get("config", "plan")), []).append(r)
    print("| framework | epsilon | mfcli mechanism (config) | seed | lr mfcli / DP-SGD | mfcli accuracy | DP-SGD accuracy "
          "| mfcli epsilon / DP-SGD epsilon | mfcli CPU s/epoch | DP-SGD CPU s/epoch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["framework"], r["target_epsilon"], r.get("config", "plan"), r["seed"])):
        ref = r["dpsgd_accuracy"] is not None
        print(f"| {r['framework']} | {r['target_epsilon']:g} | {r['mechanism'].split(' (')[0]} ({r.get('config', 'plan')}) "
              f"| {r['seed']} | {r['lr']:g} / {r['dpsgd_lr']:g} | {r['accuracy']:.3f} | {r['dpsgd_accuracy']:.3f} "
              f"| {r['epsilon']:.4f} / {r['dpsgd_epsilon']:.4f} | {r['cpu_seconds_per_epoch']:.2f} "
              f"| {r['dpsgd_cpu_seconds_per_epoch']:.2f} |" if ref else
              f"| {r['framework']} | {r['target_epsilon']:g} | {r['mechanism'].split(' (')[0]} ({r.get('config', 'plan')}) "
              f"| {r['seed']} | {r['lr']:g} / - | {r['accuracy']:.3f} | - | {r['epsilon']:.4f} / - "
              f"| {r['cpu_seconds_per_epoch']:.2f} | - |")
    print()
    print("| framework | epsilon | mfcli mechanism (config) | seeds | lr mfcli / DP-SGD (per seed) | mfcli accuracy "
          "| DP-SGD accuracy | difference (points) | mfcli CPU s/epoch | DP-SGD CPU s/epoch | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (fw, eps, config), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["seed"])
        mine = [r["accuracy"] for r in rs]
        ref = [r["dpsgd_accuracy"] for r in rs if r["dpsgd_accuracy"] is not None]
        cpu = statistics.median(r["cpu_seconds_per_epoch"] for r in rs)
        ref_cpu = statistics.median(r["dpsgd_cpu_seconds_per_epoch"] for r in rs) if ref else None
        lrs = ", ".join(f"{r['lr']:g}/{r['dpsgd_lr']:g}" if r["dpsgd_lr"] is not None else f"{r['lr']:g}/-"
                        for r in rs)
        diff = f"{100 * (statistics.fmean(mine) - statistics.fmean(ref)):+.2f}" if len(ref) == len(mine) else "-"
        mech = rs[0]["mechanism"].split(" (")[0] + f" ({rs[0]['batch_sampler']})"
        print(f"| {fw} | {eps:g} | {mech} ({config}) | {','.join(str(r['seed']) for r in rs)} | {lrs} "
              f"| {_mean_std(mine)} | {_mean_std(ref) if ref else '-'} | {diff} | {cpu:.2f} "
              f"| {'-' if ref_cpu is None else f'{ref_cpu:.2f}'} | {'-' if ref_cpu is None else f'{cpu / ref_cpu:.2f}'} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frameworks", default="torch,jax", help="comma-separated: torch, jax")
    ap.add_argument("--epsilons", default="4,8")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lr-grid", default=GRID, help=f"learning rates both arms choose from (default {GRID})")
    ap.add_argument("--validation", type=int, default=500, help="validation examples (from the training split)")
    ap.add_argument("--dataset", choices=("digits", "mnist5k"), default="mnist5k")
    ap.add_argument("--examples", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--batching", default=None, help="samplers plan may use (default: plan's; a candidate study)")
    ap.add_argument("--bands", default=None, help="band counts plan may try (default: plan's)")
    ap.add_argument("--momentum", type=float, default=0.0,
                    help="SGD momentum of both arms (mfcli plans for the momentum workload)")
    ap.add_argument("--no-dpsgd", action="store_true", help="the mfcli arm only (e.g. another candidate)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads; JAX: one XLA thread if 1")
    ap.add_argument("--out", default=None, help="append each run's JSON line here; runs already in it are skipped")
    ap.add_argument("--summarize", nargs="+", default=None, metavar="FILE", help="print the table of these files")
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    if args.threads == 1 and "jax" in args.frameworks.split(","):   # before jax is imported
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
