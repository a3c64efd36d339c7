"""The DP-SGD reduction bound on the issue's strategies (docs/accounting.md, "The DP-SGD reduction
bound"): the certified spectral norm (time, method, against numpy's SVD) and the reduction's
epsilon under Poisson, balls-in-bins and shuffle at sigma 4, p 0.01, delta 1e-6.

    OPENBLAS_NUM_THREADS=1 python scripts/bench_reduction.py
"""
from __future__ import annotations

import time

import numpy as np


def strategies() -> dict[str, np.ndarray]:
    from mfcli.services.account import resolve_strategy
    from mfcli.strategies.baselines import sqrt_strategy_matrix

    n = 2048
    c4 = np.array([1, 0.5, 0.375, 0.3125]) / np.linalg.norm([1, 0.5, 0.375, 0.3125])
    s = sqrt_strategy_matrix(n)
    return {
        "4-banded (1, .5, .375, .3125), unit column norm, n = 2048":
            np.tril(sum(np.diag(np.full(n - k, v), -k) for k, v in enumerate(c4))),
        "8-banded S^1/2, n = 2048": np.tril(np.triu(s, -7)),
        "momentum-n256 (shipped, dense)": resolve_strategy(None).strategy,
    }


def main() -> None:
    from threadpoolctl import threadpool_info

    from mfcli.accounting.reduction import reduction, spectral_norm_bound
    from mfcli.errors import MfcliError

    print("BLAS:", ", ".join(f"{i['internal_api']}={i['num_threads']}" for i in threadpool_info()))
    print("| C | ||C||_2 (SVD) | certified upper | method | time (s) | Poisson p = 0.01 | balls-in-bins | shuffle |")
    print("|---|---|---|---|---|---|---|---|")
    for name, c in strategies().items():
        exact = float(np.linalg.svd(c, compute_uv=False)[0])
        t0 = time.perf_counter()
        sn = spectral_norm_bound(c)
        dt = time.perf_counter() - t0
        eps = {}
        for sampler in ("poisson", "balls-in-bins", "shuffle"):
            rate = 0.01 if sampler == "poisson" else None
            try:
                eps[sampler] = f"{reduction(c, sigma=4.0, sampler=sampler, sampling=rate, spectral=sn).epsilon:.4g}"
            except MfcliError as exc:  # a sampler whose accountant does not apply is shown as such
                eps[sampler] = f"n/a ({exc})"
        print(f"| {name} | {exact:.8g} | {sn.upper:.8g} | {sn.method} | {dt:.2f} | {eps['poisson']} | "
              f"{eps['balls-in-bins']} | {eps['shuffle']} |", flush=True)


if __name__ == "__main__":
    main()
