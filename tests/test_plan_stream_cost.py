"""plan ranks under training cost (issue 24, item 5): the stream memory and noise cost columns
describe the noise stream the written artifact actually runs (recomputed here from
mfcli.training.noise.noise_stream on the written file, not from plan's own numbers), --out writes the
structured form whenever the candidate has one, near-ties (0.5 %) go to the cheaper stream, and
--max-stream-memory passes over a stream that does not fit."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import is_structured_file
from mfcli.services.plan import TIE_RTOL, Candidate, TrainingSetup, evaluate, rank, recommend, write_artifact
from mfcli.training.noise import noise_stream

# n = 4 epochs x 8 steps = 32: every kind is cheap to build and to stream
SETUP = TrainingSetup(examples=800, batch=100, epsilon=4.0, epochs=4, delta=1e-5, workload="momentum", params=1000)


@pytest.mark.parametrize("cand, structured", [
    (Candidate("bandmf-4", "bandmf", "cyclic", 4), True),
    (Candidate("banded-8", "banded", "fixed-order", 8), True),
    (Candidate("blt-2", "blt", "fixed-order", 2), True),
    (Candidate("dense", "dense", "fixed-order"), False),
])
def test_the_columns_describe_the_stream_the_written_artifact_runs(tmp_path: Path, cand: Candidate,
                                                                    structured: bool) -> None:
    r = evaluate(SETUP, cand)
    path = tmp_path / f"{cand.key}.h5"
    write_artifact(SETUP, r, path)
    assert is_structured_file(path) is structured  # structured wherever a structured form exists, at any n
    stream = noise_stream(path, kind="gradient", d=SETUP.params, seed=0)
    op = stream.operator
    kept = op.width + op.rank  # rows of d floats the stream holds between steps
    assert r.memory_floats == kept
    assert r.memory_bytes == 4 * kept * SETUP.params
    # the multiply-adds per step, counted from the operator's own per-step coefficients
    per_step = [len(op.slot_coefficients(t)) if hasattr(op, "slot_coefficients") else None for t in range(SETUP.n)]
    if None not in per_step and not structured:
        # a dense C^-1 keeps the history: step t uses the t earlier rows, (n - 1) / 2 on average
        assert r.noise_madds == pytest.approx((SETUP.n - 1) / 2)
    if cand.kind == "blt":
        assert r.noise_madds == 2 * kept
    elif structured:
        assert r.noise_madds == kept


def _result(key: str, rmse: float, madds: float, floats: int) -> object:
    base = evaluate(SETUP, Candidate("bandmf-2", "bandmf", "cyclic", 2))
    return replace(base, key=key, rmse_mean=rmse, noise_madds=madds, memory_floats=floats,
                   memory_bytes=4 * floats * SETUP.params)


@pytest.mark.parametrize("rel, cheaper_first", [
    (0.0, True), (0.001, True), (TIE_RTOL * 0.99, True), (TIE_RTOL * 1.5, False), (0.05, False),
])
def test_near_ties_go_to_the_cheaper_stream(rel: float, cheaper_first: bool) -> None:
    dense = _result("dense", 100.0, 15.5, 32)
    banded = _result("banded-8", 100.0 * (1 + rel), 7.0, 7)
    order = [r.key for r in rank([dense, banded])]
    assert order == (["banded-8", "dense"] if cheaper_first else ["dense", "banded-8"])


def test_the_stream_memory_budget_passes_over_a_stream_that_does_not_fit() -> None:
    dense = _result("dense", 100.0, 15.5, 32)
    banded = _result("banded-8", 110.0, 7.0, 7)
    ranked = rank([dense, banded])
    assert recommend(ranked, SETUP.n).key == "dense"
    assert recommend(ranked, SETUP.n, max_stream_bytes=4 * 32 * SETUP.params).key == "dense"
    assert recommend(ranked, SETUP.n, max_stream_bytes=4 * 32 * SETUP.params - 1).key == "banded-8"


def test_cli_max_stream_memory_and_noise_cost(tmp_path: Path) -> None:
    args = ["plan", "--examples", "800", "--batch", "100", "--epochs", "4", "--epsilon", "4", "--delta", "1e-5",
            "--workload", "momentum", "--params", "100000", "--batching", "fixed-order", "--workers", "0", "-q"]
    free = CliRunner().invoke(app, [*args, "--json"])
    assert free.exit_code == 0, free.output
    plan = json.loads(free.stdout)
    assert plan["recommended"] == "dense"  # the dense optimum wins on error in this setup
    dense = next(c for c in plan["candidates"] if c["candidate"] == "dense")
    assert dense["stream_bytes"] == 4 * 32 * 100000 and dense["noise_madds_per_step"] == pytest.approx(15.5)
    budget = CliRunner().invoke(app, [*args, "--json", "--max-stream-memory", "10M"])
    assert budget.exit_code == 0, budget.output
    capped = json.loads(budget.stdout)
    best = next(c for c in capped["candidates"] if c["candidate"] == capped["recommended"])
    assert best["stream_bytes"] <= 10 * 2**20
    assert any(p["candidate"] == "dense" and "stream memory budget" in p["reason"]
               for p in capped["report"]["passed_over"])
    table = CliRunner().invoke(app, [*args, "--max-stream-memory", "10M", "--out", str(tmp_path / "p.h5")])
    assert table.exit_code == 0, table.output
    assert "noise cost" in table.stdout and "not recommended: dense" in table.stdout
    assert is_structured_file(tmp_path / "p.h5")
    bad = CliRunner().invoke(app, [*args, "--max-stream-memory", "lots"])
    assert bad.exit_code == 2 and "--max-stream-memory" in bad.output
