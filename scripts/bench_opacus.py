#!/usr/bin/env python
"""Benchmark: the cost of mfcli's noise inside Opacus (docs/frameworks.md).

The digits MLP of examples/torch_opacus/train_digits.py (64-64-10, d = 4,810 parameters, batch
64 of 1,797 examples, Poisson), trained n = 256 steps twice each, alternating:

* ``opacus``: Opacus 1.6's own DPOptimizer (independent Gaussian noise, ``PrivacyEngine``);
* ``mfcli``: ``mfcli.adapters.opacus.make_private`` with an ``mfcli optimize`` momentum artifact
  (dense C^-1, every Z[j], j <= t, regenerated each step: O(t d)).

Reported: median per-step process CPU time and wall-clock time of zero_grad + forward + backward
+ step (one torch thread), and the time of ``optimizer.epsilon(1e-6)`` (MMCC at the loader's rate).

Usage (about 2 minutes; writes the artifact to a temporary directory):
    python scripts/bench_opacus.py
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mfcli.adapters.opacus import make_private  # noqa: E402

N = 256


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def run(kind: str, data: TensorDataset, artifact: Path) -> tuple[float, float, object]:
    net = model()
    opt: object = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    dl: object = DataLoader(data, batch_size=64, generator=torch.Generator().manual_seed(1))
    if kind == "opacus":
        m, opt, dl = PrivacyEngine().make_private(module=net, optimizer=opt, data_loader=dl, noise_multiplier=4.0,
                                                  max_grad_norm=1.0)
    else:
        m, opt, dl = make_private(net, opt, dl, artifact=artifact, seed=1, noise_std=4.0, clip_norm=1.0)
    loss_fn = torch.nn.CrossEntropyLoss()
    it = iter(dl)
    cpu, wall = [], []
    for _ in range(N):
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(dl)
            x, y = next(it)
        c0, w0 = time.process_time(), time.perf_counter()
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return float(np.median(cpu)) * 1e3, float(np.median(wall)) * 1e3, opt


def main() -> None:
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
    with tempfile.TemporaryDirectory() as tmp:
        artifact = Path(tmp) / "digits-n256.h5"
        subprocess.run([sys.executable, "-m", "mfcli", "optimize", "--workload", "momentum", "--n", str(N),
                        "--out", str(artifact), "--quiet"], check=True, stdout=subprocess.DEVNULL)
        rows = {"opacus": [], "mfcli": []}
        opt = None
        for kind in ("opacus", "mfcli", "opacus", "mfcli"):
            cpu, wall, opt = run(kind, data, artifact)
            rows[kind].append((cpu, wall))
        t0 = time.perf_counter()
        eps = opt.epsilon(1e-6)  # type: ignore[attr-defined]
        t_eps = time.perf_counter() - t0
    print(f"digits MLP, d = 4,810, n = {N}, batch 64 (Poisson rate {opt.sample_rate:.4g}), sigma 4")  # type: ignore[attr-defined]
    print("| noise | median ms/step (CPU) | median ms/step (wall) |")
    print("|---|---|---|")
    for kind, label in (("opacus", "Opacus DPOptimizer (independent)"), ("mfcli", "mfcli make_private (correlated, dense)")):
        cpu = min(r[0] for r in rows[kind])
        wall = min(r[1] for r in rows[kind])
        print(f"| {label} | {cpu:.2f} | {wall:.2f} |")
    print(f"optimizer.epsilon(1e-6) = {eps:.3f} (MMCC upper bound) in {t_eps:.1f} s wall")


if __name__ == "__main__":
    main()
