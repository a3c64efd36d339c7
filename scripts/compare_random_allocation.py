"""Side by side: mfcli's balls-in-bins DP-SGD bracket against the `random-allocation` package's
proven `combined` bound (Feldman and Shenfeld, arXiv 2502.08202), docs/accounting.md, "DP-SGD
under balls-in-bins".

The package is a measurement oracle only (it pins numpy < 2.2 and needs numba; it imports pandas
without declaring it), so it runs in its own virtual environment, never in the project's:

    python3 -m venv /tmp/ra-venv && /tmp/ra-venv/bin/pip install random-allocation pandas 'numpy<2.2'
    python scripts/compare_random_allocation.py --ra-python /tmp/ra-venv/bin/python

Its epsilon is for both directions (add and remove), the smallest of its local, analytic, direct
(Renyi orders 2..60), recursive and decomposition bounds per direction. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time

CASES = [(4.0, 16, 1e-6), (4.0, 256, 1e-6), (4.0, 1024, 1e-6), (2.0, 64, 1e-5), (2.0, 1024, 1e-5),
         (1.0, 64, 1e-5), (1.0, 100, 1e-5), (1.0, 256, 1e-5), (1.0, 1024, 1e-6), (0.7, 128, 1e-5),
         (8.0, 1024, 1e-6)]

_RA = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
from random_allocation.comparisons.definitions import PrivacyParams, SchemeConfig, Direction, Verbosity
from random_allocation.random_allocation_scheme.combined import allocation_epsilon_combined
for sigma, n, delta in json.loads(sys.argv[1]):
    p = PrivacyParams(sigma=sigma, num_steps=n, num_selected=1, num_epochs=1, delta=delta)
    cfg = SchemeConfig(verbosity=Verbosity.NONE, allocation_direct_alpha_orders=list(range(2, 61)))
    print(json.dumps(allocation_epsilon_combined(p, cfg, Direction.BOTH)), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ra-python", required=True, help="python of the venv that has random-allocation")
    args = ap.parse_args()
    from mfcli.accounting.balls_in_bins import dpsgd_balls_in_bins

    ra = subprocess.run([args.ra_python, "-c", _RA, json.dumps(CASES)], check=True, capture_output=True, text=True)
    theirs = [float(line) for line in ra.stdout.split()]
    print("| sigma | n | delta | mfcli [lower, guarantee] | grid | s | random-allocation combined | ours / theirs |")
    print("|---|---|---|---|---|---|---|---|")
    for (sigma, n, delta), their in zip(CASES, theirs, strict=True):
        t = time.perf_counter()
        r = dpsgd_balls_in_bins(n=n, sigma=sigma, delta=delta)
        dt = time.perf_counter() - t
        print(f"| {sigma:g} | {n} | {delta:g} | [{r.lower:.5g}, {r.epsilon:.5g}] | {r.grid:.2g} | {dt:.1f} | "
              f"{their:.5g} | {r.epsilon / their:.3f} |")


if __name__ == "__main__":
    main()
