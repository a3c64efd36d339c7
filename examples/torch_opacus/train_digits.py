#!/usr/bin/env python3
"""Private training of an MLP on scikit-learn's digits with PyTorch + Opacus + mfcli.

Opacus computes and clips per-example gradients and Poisson-samples the batches; mfcli adds the
correlated noise of an artifact made by ``mfcli optimize`` and reports the epsilon (MMCC at the
loader's sampling rate). Usage::

    mfcli optimize --workload momentum --n 256 --out digits-n256.h5
    python examples/torch_opacus/train_digits.py digits-n256.h5 --sigma 4 --clip 1 --batch 64

The artifact fixes the number of steps (n) and the optimizer (its workload: ``momentum`` with
beta -> SGD with that momentum, ``prefix`` -> plain SGD). ``--quick`` (what the test suite runs)
trains on 500 examples with a smaller network and skips nothing else. ``--json`` prints one JSON
object (accuracy, epsilon, sampling rate, steps) instead of the summary lines. Needs
``pip install mfcli[torch,opacus] scikit-learn``; the digits ship inside scikit-learn, nothing is
downloaded. The noise seed comes from ``secrets`` unless ``--seed`` is given (tests only: a
published seed gives no privacy).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import secrets
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:  # mfcli from a checkout without installing
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from mfcli.adapters.opacus import make_private  # noqa: E402
from mfcli.errors import MfcliError  # noqa: E402
from mfcli.io.artifact import load_artifact  # noqa: E402


def digits(quick: bool) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """(train set, test inputs, test labels): a fixed 80/20 split of the 1,797 8x8 digits."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.long)
    cut = int(0.8 * len(y))
    n_train = 500 if quick else cut
    return TensorDataset(x[:n_train], y[:n_train]), x[cut:], y[cut:]


def inner_optimizer(workload: str, params: dict, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """The optimizer that computes the artifact's workload A, so the noise is B Z as optimised."""
    if workload == "momentum":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=float(params["beta"]), dampening=0.0)
    if workload == "prefix":
        return torch.optim.SGD(model.parameters(), lr=lr)
    raise MfcliError(f"this example trains prefix or momentum artifacts, not {workload!r}")


def train(artifact: str, *, sigma: float, clip: float, batch: int, lr: float, delta: float, seed: int,
          quick: bool) -> dict:
    torch.manual_seed(0)
    art = load_artifact(Path(artifact))
    train_set, x_test, y_test = digits(quick)
    hidden = 16 if quick else 64
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    optimizer = inner_optimizer(art.workload_name, dict(art.attrs.get("workload_params") or {}), model, lr)
    loader = DataLoader(train_set, batch_size=batch, generator=torch.Generator().manual_seed(1))
    model, optimizer, loader = make_private(model, optimizer, loader, artifact=artifact, seed=seed,
                                            noise_std=sigma, clip_norm=clip, variant="dense")
    loss_fn = torch.nn.CrossEntropyLoss()
    # Each Poisson batch is one step; the loader is restarted as often as the n steps need.
    batches = itertools.chain.from_iterable(iter(loader) for _ in itertools.count())
    for _ in range(optimizer.n):
        x, y = next(batches)
        optimizer.zero_grad()
        if len(y):
            loss_fn(model(x), y).backward()
        else:  # an empty Poisson batch: zero per-example gradients, the step still gets its noise
            (model(torch.zeros(0, 64)).sum() * 0.0).backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(dim=1) == y_test).float().mean())
    return {
        "artifact": str(artifact), "workload": art.workload_name, "steps": optimizer.steps_taken,
        "sigma": sigma, "clip": clip, "sampling": optimizer.sample_rate, "delta": delta,
        "epsilon": optimizer.epsilon(delta=delta), "test_accuracy": accuracy, "train_examples": len(train_set),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", help="an artifact from `mfcli optimize` (prefix or momentum workload)")
    ap.add_argument("--sigma", type=float, default=4.0, help="noise multiplier (as in `mfcli account --sigma`)")
    ap.add_argument("--clip", type=float, default=1.0, help="per-example clipping norm")
    ap.add_argument("--batch", type=int, default=64, help="expected batch size (Poisson rate = batch / examples)")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=None, help="noise seed (tests only; default: secrets.randbits(128))")
    ap.add_argument("--quick", action="store_true", help="500 examples and a small network (the tests' mode)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    # Opacus's notices: its own noise RNG is not secure (it is not used: mfcli draws the noise),
    # and torch's note that the inputs need no gradient (only the parameters do).
    warnings.filterwarnings("ignore", message="Secure RNG turned off", category=UserWarning)
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    try:
        out = train(args.artifact, sigma=args.sigma, clip=args.clip, batch=args.batch, lr=args.lr, delta=args.delta,
                    seed=secrets.randbits(128) if args.seed is None else args.seed, quick=args.quick)
    except MfcliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    else:
        eps = math.ceil(out["epsilon"] * 1000) / 1000   # an upper bound: rounded up
        print(f"{out['steps']} steps of {out['workload']} SGD, Poisson rate {out['sampling']:.4g}, sigma {out['sigma']:g}")
        print(f"test accuracy {out['test_accuracy']:.3f}; ({eps:.3f}, {out['delta']:g})-DP (MMCC upper bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
