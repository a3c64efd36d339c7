"""``plan`` at the edges of what it can compute (a user walkthrough): a target epsilon so large
that calibrating a privacy-loss-distribution row would need more memory than the budget (it ran
for minutes and was OOM-killed), a pool worker that dies (it surfaced as exit 70 with a
traceback), band counts above n (the rows vanished without a word) and option values that are
out of range on their own (--steps 0, --batching '': exit 1 instead of a usage error). Each test
fails on the code before its fix; all run in seconds and allocate little."""
from __future__ import annotations

import json
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.services import plan as plan_module
from mfcli.services.plan import PLD_DISCRETIZATION, TrainingSetup, enumerate_candidates, pld_memory_floor

runner = CliRunner()
SMALL = ["plan", "--examples", "100", "--batch", "10", "--epochs", "1", "--workers", "0", "-q"]


def one_error_line(res: Any) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


# --- item 1: a huge target epsilon and the memory budget -------------------------------------------


@pytest.mark.parametrize("certified", [False, True])
@pytest.mark.parametrize("sigma, sampling, steps", [(0.25, 0.1, 20), (0.5, 0.2, 10), (1.0, 0.05, 40)])
def test_memory_floor_is_below_what_the_accounting_allocates(monkeypatch: pytest.MonkeyPatch, certified: bool,
                                                             sigma: float, sampling: float, steps: int) -> None:
    """The floor plan refuses on is a lower bound: the FFT that a DP-SGD accounting run really
    composes (the size pld_ops checks before it allocates, spied here) is at least
    pld_memory_floor(the run's own epsilon), for the reference and the certified path alike. So a
    run whose epsilon exceeds a target (which calibration needs) needs at least the floor of it."""
    from mfcli.accounting.single_pass import dpsgd
    from mfcli.util import memory

    seen: list[float] = []
    real = memory.check_memory

    def spy(estimate: float, limit: Any, **kw: Any) -> None:
        seen.append(estimate)
        real(estimate, limit, **kw)

    monkeypatch.setattr(memory, "check_memory", spy)
    eps = dpsgd(sigma=sigma, sampling=sampling, steps=steps, delta=1e-6, value_discretization=PLD_DISCRETIZATION,
                certified=certified).epsilon
    assert seen, "the accounting no longer checks its FFT's memory: the floor's premise needs a new look"
    assert max(seen) >= pld_memory_floor(eps) > 0, (max(seen), pld_memory_floor(eps), eps)


def test_floor_closed_form() -> None:
    """target / d points of 96 bytes (pld_ops' figure), rounded up: 1e6 at d = 1e-3 is 96e9 bytes."""
    assert pld_memory_floor(1e6) == 96 * 10 ** 9
    assert pld_memory_floor(2.0) == 96 * 2000
    assert pld_memory_floor(2.0000001) == 96 * 2001


def test_pld_rows_over_the_budget_are_skipped_with_the_reason_before_any_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-memory below the floor of --epsilon: DP-SGD and BandMF (PLD accountings) are listed
    in ``skipped`` with the reason and never evaluated; the fixed-order rows are ranked as before.
    Above the floor the same rows are calibrated."""
    evaluated: list[str] = []
    real = plan_module.evaluate

    def spy(setup: Any, cand: Any) -> Any:
        evaluated.append(cand.key)
        return real(setup, cand)

    monkeypatch.setattr(plan_module, "evaluate", spy)
    args = [*SMALL, "--epsilon", "20", "--batching", "poisson,cyclic,fixed-order", "--bands", "2", "--buffers", "2",
            "--json"]
    # floor(20) = 20000 points x 96 B = 1.83 MiB
    res = runner.invoke(app, [*args, "--max-memory", "1M"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    heavy = {s["candidate"]: s["reason"] for s in out["skipped"] if "memory budget" in s["reason"]}
    assert set(heavy) == {"dp-sgd", "bandmf-2"}, out["skipped"]
    assert "1.84 MiB" in heavy["dp-sgd"] and "1.00 MiB" in heavy["dp-sgd"], heavy
    assert not {"dp-sgd", "bandmf-2"} & set(evaluated)
    assert {"banded-2", "blt-2", "tree"} <= {c["candidate"] for c in out["candidates"]}
    evaluated.clear()
    res = runner.invoke(app, [*args, "--max-memory", "4M"])
    assert res.exit_code == 0, res.output
    ranked = {c["candidate"] for c in json.loads(res.stdout)["candidates"]}
    assert {"dp-sgd", "bandmf-2"} <= ranked and not any("memory" in s["reason"] for s in json.loads(res.stdout)["skipped"])


def test_nothing_calibratable_within_the_budget_is_one_error_line() -> None:
    """Only PLD rows allowed, all over the budget: one error line (exit 1) naming the budget, not
    an IndexError (no row failed) nor 'raise the target'."""
    res = runner.invoke(app, [*SMALL, "--epsilon", "20", "--batching", "poisson", "--max-memory", "1M"])
    assert res.exit_code == 1
    line = one_error_line(res)
    assert "cannot be calibrated within the memory budget by dp-sgd" in line and "raise the target" not in line, line


def test_huge_epsilon_at_the_default_budget_is_refused_without_a_pld_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walkthrough's --epsilon 1e6 (floor 89.4 GiB), here with a budget the test fixes at 8 GiB
    so that the machine's memory does not matter: no PLD accounting runs at all (spied) and the
    plan ends in one line saying why, exit 1."""
    import mfcli.util.memory as memory

    monkeypatch.setattr(memory, "memory_left", lambda: 8 * 2 ** 30)
    import mfcli.accounting.multi as multi
    import mfcli.accounting.single_pass as sp

    ran: list[float] = []

    def no_pld_run(**kw: Any) -> Any:  # records, and never allocates (a mutant must not use gigabytes)
        ran.append(kw["sigma"])
        raise MfcliError("a PLD accounting ran")

    monkeypatch.setattr(sp, "dpsgd", no_pld_run)
    monkeypatch.setattr(multi, "dpsgd", no_pld_run)
    res = runner.invoke(app, [*SMALL, "--epsilon", "1e6", "--batching", "poisson,cyclic,fixed-order", "--bands", "2",
                              "--buffers", "2"])
    assert res.exit_code == 1 and ran == []
    line = one_error_line(res)
    assert "89.5 GiB" in line and "8.00 GiB" in line and "give a smaller epsilon" in line, line


def test_an_allocation_that_fails_skips_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MemoryError inside one evaluation (an allocation no estimate foresaw) skips that row
    with the reason; it does not end the plan."""
    def oom(setup: Any, cand: Any) -> Any:
        raise MemoryError("Unable to allocate 12.0 GiB for an array")

    monkeypatch.setattr(plan_module, "_build_any", oom)
    setup = TrainingSetup(examples=100, batch=10, epochs=1, epsilon=2.0, bands=(2,), batching=("fixed-order",))
    r = plan_module.evaluate(setup, plan_module.Candidate("banded-2", "banded", "fixed-order", 2))
    assert isinstance(r, plan_module.Skipped) and r.over_memory
    assert r.reason == "ran out of memory while calibrating (Unable to allocate 12.0 GiB for an array)"


def test_an_other_sampler_reduction_out_of_memory_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recommended row's Poisson entry (the DP-SGD reduction at sigma / ||C||_2: at a huge target
    a tiny multiplier, whose PLD ran out of memory after every row was calibrated, --epsilon 1e4)
    is left out like an accounting that does not apply, instead of ending the plan."""
    import mfcli.accounting.reduction as reduction

    setup = TrainingSetup(examples=100, batch=10, epochs=1, epsilon=2.0, bands=(2,), buffers=(2,),
                          batching=("poisson", "fixed-order"))
    r = plan_module.evaluate(setup, plan_module.Candidate("banded-2", "banded", "fixed-order", 2))
    assert isinstance(r, plan_module.CandidateResult)
    assert [o["batch_sampler"] for o in plan_module.other_sampler_guarantees(setup, r)] == ["poisson"]

    def oom(**kw: Any) -> Any:
        raise MemoryError("Unable to allocate 1.16 GiB for an array with shape (5, 31129183)")

    monkeypatch.setattr(reduction, "reduced_epsilon", oom)
    assert plan_module.other_sampler_guarantees(setup, r) == []


class _DeadPool:
    """A process pool whose worker has died: every submitted evaluation fails as concurrent.futures
    reports it (BrokenProcessPool), as when the kernel's OOM killer ends a worker."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._processes: dict = {}

    def submit(self, fn: Any, *args: Any) -> Future:
        f: Future = Future()
        f.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly while the future "
                                          "was running or pending."))
        return f

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def test_a_dead_worker_is_one_error_line_not_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies (BrokenProcessPool) ends plan with one line, exit 1, naming the lost
    candidates and the likely cause (memory), not exit 70 with a traceback."""
    import concurrent.futures as cf

    monkeypatch.setattr(cf, "ProcessPoolExecutor", _DeadPool)
    args = [a if a != "0" else "2" for a in SMALL]  # --workers 2: the pool
    res = runner.invoke(app, [*args, "--epsilon", "2", "--batching", "fixed-order", "--bands", "2", "--buffers", "2",
                              "--max-memory", "3G"])
    assert res.exit_code == 1, (res.exit_code, res.stderr)
    line = one_error_line(res)
    assert "worker process died" in line and "lack of memory" in line and "3.00 GiB" in line, line
    assert "banded-2" in line and "Traceback" not in res.stderr


# --- item 2: band counts above n ---------------------------------------------------------------------


def test_bands_above_n_are_skipped_with_the_reason() -> None:
    """--bands above n (n = 10 here) are listed in ``skipped`` with the reason under every allowed
    sampler (BandMF, banded Toeplitz, their balls-in-bins reduction rows), like a buffer count that
    does not fit; the defaults above n are still simply not tried."""
    setup = TrainingSetup(examples=100, batch=10, epochs=1, epsilon=2.0, bands=(2, 1000),
                          batching=("cyclic", "fixed-order", "balls-in-bins"))
    cands, skipped = enumerate_candidates(setup)
    why = {s.key: s.reason for s in skipped}
    for key in ("bandmf-1000", "banded-1000", "bandmf-1000 (balls-in-bins)", "banded-1000 (balls-in-bins)"):
        assert why.get(key) == "1000 bands exceed the n = 10 steps of this setup; at most 10 bands", (key, why)
    assert not any("1000" in c.key for c in cands)
    default = enumerate_candidates(TrainingSetup(examples=100, batch=10, epochs=1, epsilon=2.0,
                                                 batching=("fixed-order",)))[1]
    assert not any("bands exceed" in s.reason for s in default)


def test_bands_above_n_in_the_json() -> None:
    res = runner.invoke(app, [*SMALL, "--epsilon", "2", "--batching", "fixed-order", "--bands", "1000", "--buffers", "2",
                              "--json"])
    assert res.exit_code == 0, res.output
    skipped = {s["candidate"]: s["reason"] for s in json.loads(res.stdout)["skipped"]}
    assert "exceed the n = 10 steps" in skipped.get("banded-1000", ""), skipped


# --- item 3: an option out of its own range is a usage error ----------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--epochs", "1", "--steps", "0"], "--steps: the number of steps must be a positive integer, got 0"),
    (["--steps", "0"], "--steps: the number of steps must be a positive integer, got 0"),
    (["--epochs", "1", "--batching", ""], "--batching: allow at least one batch sampler"),
    (["--epochs", "1", "--batching", ","], "--batching: allow at least one batch sampler"),
    (["--epochs", "1", "--max-memory", "0"], "--max-memory: a memory size must be a positive number"),
])
def test_out_of_range_values_are_usage_errors(args: list[str], message: str) -> None:
    res = runner.invoke(app, ["plan", "--examples", "1000", "--batch", "100", "--epsilon", "2", *args, "--workers", "0",
                              "-q"])
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert message in one_error_line(res)
