"""Progress of ``mfcli compare --epsilon`` (equal-privacy calibration, one per row): the library
reports each row's accounting runs through ``on_progress`` as one phase named after the row, the
CLI renders them on stderr (bars on a terminal, a few plain lines elsewhere, nothing with
--quiet) after an up-front estimate line, and stdout is the same table or JSON as without it."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mfcli.accounting.multi as multi
import mfcli.accounting.single_pass as single_pass
from mfcli.accounting.calibrate import calibrate_sigma
from mfcli.cli.app import app
from mfcli.model.participation import SingleParticipation
from mfcli.model.workloads import prefix_workload
from mfcli.schemas import load_schema, validate
from mfcli.services.compare import (
    PrivacyTarget,
    RowProgress,
    calibration_phase,
    equal_privacy_from,
    estimate_equal_privacy,
    run_comparison,
)
from mfcli.util.progress import ProgressEvent

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
N = 16
CHEAP = ["compare", "--n", str(N), "--strategies", "identity,tree,sqrt", "--epsilon", "2"]


def by_phase(events: list[ProgressEvent]) -> dict[str, list[ProgressEvent]]:
    """Events per phase, each checked against the protocol of mfcli.util.progress for one run of the
    phase: 0 <= done <= total, done and total never decrease, the last has done == total."""
    phases: dict[str, list[ProgressEvent]] = {}
    for e in events:
        assert 0 <= e.done <= e.total and e.unit == "accounting runs", e
        seen = phases.setdefault(e.phase, [])
        if seen:
            assert e.done >= seen[-1].done and e.total >= seen[-1].total, (seen[-1], e)
        seen.append(e)
    for seen in phases.values():
        assert seen[0].done == 0 and seen[-1].done == seen[-1].total, seen
    return phases


class Counting:
    """Counts the calls of a real accounting function (and makes them): the independent count of
    accounting runs the progress must add up to."""

    def __init__(self, f):  # type: ignore[no-untyped-def]
        self.f = f
        self.calls = 0

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.f(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# The library


def test_each_row_reports_its_runs_under_its_own_phase_and_ends_at_the_runs_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = ["identity", "tree", "sqrt"]
    events: list[ProgressEvent] = []
    gauss = Counting(single_pass.gaussian_epsilon)
    monkeypatch.setattr(single_pass, "gaussian_epsilon", gauss)
    calls_at_end: dict[str, int] = {}  # gaussian_epsilon calls when each row first reached its total

    def record(e: ProgressEvent) -> None:
        events.append(e)
        if e.done == e.total and e.done > 0:
            calls_at_end.setdefault(e.phase, gauss.calls)

    table = run_comparison(prefix_workload(N), names, privacy=PrivacyTarget(2.0, 1e-6), on_progress=record)
    phases = by_phase(events)
    assert list(phases) == [calibration_phase(name) for name in names] == [f"calibrating {n}" for n in names]
    # the rows run one after another: each row's final done is the gaussian_epsilon calls it made
    ends = list(calls_at_end.values())
    made = [b - a for a, b in zip([0, *ends], ends, strict=False)]
    assert [phases[p][-1].total for p in phases] == made and all(m > 1 for m in made)
    assert [r.name for r in table.rows] == names and all(r.privacy is not None for r in table.rows)


def test_without_a_callback_the_numbers_are_the_same() -> None:
    target = PrivacyTarget(2.0, 1e-6)
    quiet = run_comparison(prefix_workload(N), ["identity", "sqrt"], privacy=target)
    loud = run_comparison(prefix_workload(N), ["identity", "sqrt"], privacy=target, on_progress=lambda e: None)
    assert [r.privacy for r in quiet.rows] == [r.privacy for r in loud.rows]


def test_a_row_with_two_calibrations_is_one_monotone_phase_counting_both() -> None:
    # the Gaussian then cyclic Poisson (1 band, unit column: the identity at n = 4), each
    # accounting function counted: the phase's final total is every run both calibrations made.
    # A small target keeps sigma large, where each cyclic Poisson run is cheap.
    rel_tol, sampling = 0.3, 0.5
    target = PrivacyTarget(0.3, 1e-6, sampling=sampling)
    events: list[ProgressEvent] = []
    gauss, cyclic = Counting(single_pass.gaussian_epsilon), Counting(multi.reduced_dpsgd)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(single_pass, "gaussian_epsilon", gauss)
        mp.setattr(multi, "reduced_dpsgd", cyclic)
        row = equal_privacy_from(1.0, 4.0, 4, SingleParticipation(), target, cyclic=(1, 1.0), rel_tol=rel_tol,
                                 on_progress=events.append, phase="calibrating identity")
    assert row.accounting in ("single-pass", "cyclic-poisson") and "cyclic-poisson" in row.candidates
    (phase, seen), = by_phase(events).items()
    assert phase == "calibrating identity"
    # one reduced_dpsgd call is the check that cyclic Poisson applies, before any calibration
    assert seen[-1].total == gauss.calls + cyclic.calls - 1
    # complete only when the second calibration ends (its final event may repeat)
    assert all(e.done == seen[-1].total for e in seen if e.done == e.total)


@settings(max_examples=30, deadline=None)
@given(scales=st.lists(st.floats(0.05, 50.0), min_size=1, max_size=3),
       target=st.floats(0.1, 10.0), rel_tol=st.sampled_from([1e-1, 1e-2, 1e-3]))
def test_row_progress_of_real_calibrations_is_monotone_and_ends_at_the_runs_made(
    scales: list[float], target: float, rel_tol: float,
) -> None:
    from mfcli.accounting.calibrate import bisection_steps

    events: list[ProgressEvent] = []
    row = RowProgress(events.append, "row", calibrations=len(scales),
                      at_least=1 + bisection_steps(__import__("math").log(2.0), rel_tol))
    calls = Counter[str]()
    for a in scales:  # epsilon = a / sigma: the Gaussian's shape at moderate epsilon
        def f(s: float, a: float = a) -> float:
            calls["runs"] += 1
            return a / s

        calibrate_sigma(f, target_epsilon=target, rel_tol=rel_tol, sigma_start=1.0, on_progress=row.next())
    (_, seen), = by_phase([ProgressEvent(e.phase, e.done, e.total, "accounting runs") for e in events]).items()
    assert seen[-1].total == calls["runs"]
    assert RowProgress(None, "row", calibrations=2).next() is None


def test_the_estimate_measures_each_accounting_the_rows_use() -> None:
    plain = estimate_equal_privacy(N, SingleParticipation(), PrivacyTarget(2.0, 1e-6))
    assert [e.setting for e in plain.estimates] == ["single-pass"]
    e = plain.estimates[0]
    # the probe is the Gaussian at sigma 1 (unit sensitivity): its epsilon is known independently
    assert e.sigma == 1.0 and e.epsilon == pytest.approx(single_pass.gaussian_epsilon(1e-6, 1.0))
    assert 1 <= e.runs_expected <= e.runs_most and e.seconds_per_run > 0
    assert plain.calibrations == (1,)  # row_bands defaults to one identity row
    expected, most = plain.seconds()
    assert expected == pytest.approx(e.runs_expected * e.seconds_per_run) and most >= expected


# ---------------------------------------------------------------------------------------------
# The CLI


@pytest.mark.parametrize("fmt", [[], ["--json"], ["--format", "csv"]])
def test_stdout_is_the_same_with_and_without_progress(fmt: list[str]) -> None:
    loud = runner.invoke(app, [*CHEAP, *fmt])
    quiet = runner.invoke(app, [*CHEAP, *fmt, "--quiet"])
    assert loud.exit_code == 0 == quiet.exit_code, loud.stderr
    assert loud.stdout == quiet.stdout and quiet.stderr == ""
    lines = loud.stderr.splitlines()
    estimate = [i for i, line in enumerate(lines) if line.startswith("estimate: calibrating 3 rows at equal privacy")]
    calibrating = [i for i, line in enumerate(lines) if line.startswith("calibrating ")]
    assert len(estimate) == 1 and calibrating and estimate[0] < min(calibrating)  # before the calibrations
    assert "\x1b" not in loud.stderr and "\x1b" not in loud.stdout  # CliRunner: not a terminal
    if fmt == ["--json"]:
        obj = json.loads(loud.stdout)
        assert validate(obj, load_schema("compare")) == []
        assert [r["name"] for r in obj["strategies"]] == ["identity", "tree", "sqrt"]


def test_plain_display_shows_a_few_lines_per_row(capsys: pytest.CaptureFixture[str]) -> None:
    from mfcli.cli.display import ProgressDisplay

    with ProgressDisplay(quiet=False, tty=False, after=0.0) as display:
        run_comparison(prefix_workload(N), ["identity", "sqrt"], privacy=PrivacyTarget(2.0, 1e-6),
                       on_progress=display)
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.splitlines()
    assert 2 <= len(lines) <= 6 and "\x1b" not in err.err
    assert {line.split(":")[0] for line in lines} == {"calibrating identity", "calibrating sqrt"}
    assert all("accounting runs" in line and "ETA" in line for line in lines)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color", COLUMNS="120")
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):  # rich's overrides
        env.pop(name, None)
    return env


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_terminal_gets_bars_beside_the_solver_panel_and_stdout_stays_plain() -> None:
    import pty

    cmd = [sys.executable, "-m", "mfcli", "compare", "--n", "8", "--strategies", "identity,optimal",
           "--epsilon", "2", "--json"]
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=secondary, stdin=subprocess.DEVNULL, env=_env(),
                            cwd=ROOT)
    os.close(secondary)
    chunks = []
    while True:
        ready, _, _ = select.select([primary], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(primary, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=120)
    os.close(primary)
    terminal = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, terminal
    assert "calibrating identity" in terminal and "calibrating optimal" in terminal and "100%" in terminal
    assert "estimate: calibrating 2 rows" in terminal
    assert b"\x1b" not in out
    assert validate(json.loads(out), load_schema("compare")) == []
