#!/usr/bin/env python3
"""Rewrite a dense artifact whose C is banded Toeplitz (``mfcli plan --out``'s BandMF and banded
rows at n <= 1024) as the equivalent structured artifact, with its newest accounting record
re-accounted on the written file by the accounting session (docs/training.md, "Measured").

Why: the dense artifact's noise stream regenerates every past noise row at each step (O(t d));
the structured one runs the band recursion (O(bands x d)). The mechanism and its epsilon are
the same (checked: C materialised from the coefficients equals the stored C to 1e-12, and the
re-accounted epsilon is printed beside the stored one). Usage::

    python scripts/banded_to_structured.py run.h5 run-structured.h5
    python examples/plan_to_torch.py --dataset mnist5k --artifact run-structured.h5 ...
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from mfcli.accounting import session  # noqa: E402
from mfcli.errors import MfcliError  # noqa: E402
from mfcli.io.artifact import load_artifact, save_structured_artifact  # noqa: E402
from mfcli.model.participation import participation_from_json  # noqa: E402
from mfcli.strategies.toeplitz import BandedToeplitz, materialize, toeplitz_workload  # noqa: E402
from mfcli.training.samplers import accounting_records  # noqa: E402


def convert(src: Path, dst: Path) -> dict:
    art = load_artifact(src)
    c = np.asarray(art.factorization.strategy, dtype=np.float64)
    n = c.shape[0]
    records = accounting_records(src)
    if not records:
        raise MfcliError(f"{src} has no accounting record")
    rid, rec = list(records.items())[-1]
    setting = str(rec.get("calibrated_setting") or "")
    batching = rec.get("batching")
    batching = None if batching in (None, "null") else str(batching)
    sampling = None if rec.get("sampling") in (None, "null") else float(rec["sampling"])
    schema = participation_from_json(str(rec["participation"]))
    bands = int(np.max(np.nonzero(c[:, 0])[0])) + 1
    coefs = c[:bands, 0].copy()
    if not np.allclose(materialize(coefs, n), c, rtol=0, atol=1e-12):
        raise MfcliError(f"{src}: C is not banded Toeplitz")
    params = dict(art.attrs.get("workload_params") or {})
    workload = toeplitz_workload(art.workload_name, **({"beta": float(params["beta"])} if "beta" in params else {}))
    save_structured_artifact(dst, BandedToeplitz(coefs), workload=workload, n=n, participation=schema,
                             command=f"scripts/banded_to_structured.py {src} {dst}", force=True)
    inp = session.resolve_strategy(dst)
    results = session.read_chunked(rec, "results") or "{}"
    disc = float(json.loads(results).get(setting, {}).get("value_discretization", 1e-3))
    report = session.account(inp, sigma=float(rec["sigma"]), sampling=sampling, settings=[setting],
                             options=session.AccountingOptions(delta=float(rec["delta"]), value_discretization=disc),
                             participation=schema, batching=batching)
    group = session.record_to_artifact(report, command=f"scripts/banded_to_structured.py {src} {dst}")
    return {"record": group, "setting": setting, "bands": bands,
            "epsilon": float(report.rows[setting]["epsilon"]),
            "stored_epsilon": float(rec[f"epsilon_{setting.replace('-', '_')}"]), "source_record": rid}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: banded_to_structured.py DENSE.h5 STRUCTURED.h5", file=sys.stderr)
        sys.exit(2)
    try:
        print(convert(Path(sys.argv[1]), Path(sys.argv[2])))
    except MfcliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
