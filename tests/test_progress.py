"""Progress of long computations (mfcli.util.progress) and the calibration's up-front cost estimate:
the library reports structured events through a callback, the CLI renders them on stderr only
(rich bars on a terminal, a few plain lines elsewhere), stdout stays the result."""
from __future__ import annotations

import itertools
import json
import math
import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.accounting.balls_in_bins import tree_balls_in_bins
from mfcli.accounting.banded_poisson import estimate_epsilon
from mfcli.accounting.calibrate import bisection_steps, calibrate_sigma, expected_runs
from mfcli.accounting.mmcc import mmcc
from mfcli.cli.app import app
from mfcli.schemas import load_schema, validate
from mfcli.util.progress import ProgressEvent, Ticker

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
MFCLI = [sys.executable, "-m", "mfcli"]
# A cheap calibration: deterministic participation (the Gaussian at the schema's sensitivity).
CHEAP_CALIBRATION = ["account", "--strategy", "identity", "--n", "8", "--epochs", "2", "--epsilon", "2"]


def check_protocol(events: list[ProgressEvent], *, complete: bool = True) -> dict[str, list[ProgressEvent]]:
    """Per phase and per run of it (a run restarts at done == 0): done and total never decrease,
    0 <= done <= total, and a completed run ends at done == total."""
    assert events, "no progress events"
    runs: dict[str, list[list[ProgressEvent]]] = {}
    for e in events:
        assert 0 <= e.done <= e.total, e
        phase_runs = runs.setdefault(e.phase, [])
        if not phase_runs or (e.done == 0 and phase_runs[-1][-1].done > 0):
            phase_runs.append([])
        phase_runs[-1].append(e)
    for phase_runs in runs.values():
        for run in phase_runs:
            for a, b in itertools.pairwise(run):
                assert b.done >= a.done and b.total >= a.total and b.fraction >= a.fraction, (a, b)
            if complete:
                assert run[-1].done == run[-1].total, run[-1]
    return {p: [e for r in rs for e in r] for p, rs in runs.items()}


# ---------------------------------------------------------------------------------------------
# The library's events


@pytest.mark.parametrize("total, steps", [(0, 100), (1, 100), (7, 100), (1000, 10), (12345, 100)])
def test_ticker_emits_a_bounded_monotone_sequence_ending_at_total(total: int, steps: int) -> None:
    seen: list[ProgressEvent] = []
    tick = Ticker(seen.append, "p", total, steps=steps)
    for i in range(total):
        tick(i)
    tick.finish()
    check_protocol(seen)
    assert seen[0].done == 0 and seen[-1].done == total
    assert len(seen) <= steps + 3
    Ticker(None, "p", total)(total)  # no callback: a no-op


# epsilon = a / sigma is non-increasing, so the number of runs is known: the bracketing walk
# from sigma_start to the target's bracket, then the bisections of a bracket of width 2.
@pytest.mark.parametrize("a, target, start", [(10.0, 2.0, 1.0), (10.0, 2.0, 4.0), (1.0, 3.0, 1.0), (5.0, 5.0, 1.0),
                                              (100.0, 0.1, 4.0), (1.0, 4.0, 2.0)])
def test_calibration_reports_runs_monotonically_and_ends_at_total(a: float, target: float, start: float) -> None:
    seen: list[ProgressEvent] = []
    cal = calibrate_sigma(lambda s: a / s, target_epsilon=target, sigma_start=start, on_progress=seen.append)
    runs = check_protocol(seen)["calibration"]
    assert runs[-1].done == runs[-1].total == cal.evaluations
    # independent count: the walk doubles (or halves) sigma until the bracket is found
    ratio = a / (target * start)
    walk = max(1, math.ceil(math.log2(ratio))) if ratio > 1 else math.floor(math.log2(1 / ratio)) + 1
    assert cal.evaluations == 1 + walk + bisection_steps(math.log(2), 1e-3)
    assert expected_runs(a / start, target, sigma_start=start)[0] == cal.evaluations
    assert cal.sigma >= a / target >= cal.sigma_lower


def test_bisection_steps_match_the_stopping_rule() -> None:
    # hi / lo - 1 <= rel_tol after k halvings of the log-width: 2^(1/2^k) - 1 <= tol
    for tol in (1e-1, 1e-2, 1e-3, 1e-6):
        k = bisection_steps(math.log(2), tol)
        assert 2 ** (1 / 2**k) - 1 <= tol < 2 ** (1 / 2 ** (k - 1)) - 1


def test_a_probe_run_is_not_repeated() -> None:
    calls: list[float] = []

    def f(s: float) -> float:
        calls.append(s)
        return 10.0 / s

    seen: list[ProgressEvent] = []
    cal = calibrate_sigma(f, target_epsilon=2.0, sigma_start=1.0, known={1.0: 10.0}, on_progress=seen.append)
    assert 1.0 not in calls and cal.evaluations == len(calls) + 1
    assert seen[0].done == 1 and check_protocol(seen)["calibration"][-1].done == cal.evaluations


def test_long_computations_report_their_phases() -> None:
    seen: list[ProgressEvent] = []
    c = np.tril(np.ones((4, 4)))
    r = mmcc(c, sigma=4.0, sampling=0.1, on_progress=seen.append)
    assert mmcc(c, sigma=4.0, sampling=0.1).epsilon == r.epsilon  # reporting changes nothing
    phases = check_protocol(seen)
    assert phases["MMCC tail events"][-1].total == 4 and phases["MMCC composition"][-1].total == 1

    seen = []
    tree_balls_in_bins(n=8, sigma=1.0, on_progress=seen.append)
    levels = [p for p in check_protocol(seen) if p.startswith("balls-in-bins tree")]
    assert levels and all(check_protocol(seen)[p][-1].total == 2 * 3 for p in levels)  # two passes of 3 levels

    seen = []
    band = np.eye(8) + 0.5 * np.eye(8, k=-1)
    estimate_epsilon(band, sigma=2.0, sampling=0.01, samples=200, on_progress=seen.append)
    assert check_protocol(seen)["banded estimate"][-1].total == 2 * 4  # 4 sample batches a direction


# ---------------------------------------------------------------------------------------------
# The CLI: stderr only, estimate and memory refusal


def test_cli_calibration_result_on_stdout_progress_and_estimate_on_stderr() -> None:
    r = runner.invoke(app, [*CHEAP_CALIBRATION, "--json"])
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)  # stdout is exactly the JSON object
    assert validate(obj, load_schema("account")) == []
    est = obj["calibration"]["estimate"]
    assert est["runs_expected"] >= 1 and est["seconds_per_run"] > 0 and est["memory_bytes"] is None  # no MMCC
    assert obj["calibration"]["evaluations"] <= est["runs_most"]
    bad = json.loads(r.stdout)
    bad["calibration"]["estimate"]["runs_expected"] = "13"
    assert validate(bad, load_schema("account"))  # the schema constrains the estimate
    assert "estimate: first run" in r.stderr and "about" in r.stderr
    assert "\x1b" not in r.stderr  # not a terminal: no escapes
    q = runner.invoke(app, [*CHEAP_CALIBRATION, "--json", "--quiet"])
    assert q.exit_code == 0 and q.stderr == "" and json.loads(q.stdout)["calibration"]["sigma"] == obj["calibration"]["sigma"]


def test_cli_refuses_a_calibration_over_the_memory_limit_before_running() -> None:
    r = runner.invoke(app, ["account", "--strategy", "sqrt", "--n", "64", "--sampling", "0.1", "--epsilon", "2",
                            "--max-memory", "64K"])
    assert r.exit_code == 1 and r.stdout == ""
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "calibrating mmcc" in err[0] and "needs about" in err[0]
    assert "over the limit of 64.0 KiB" in err[0] and "raise --max-memory" in err[0]
    assert "estimate: first run" not in r.stderr  # refused before the first accounting run


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color", COLUMNS="120")
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):  # rich's overrides
        env.pop(name, None)
    return env


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_terminal_shows_the_percentage_and_a_pipe_gets_no_escapes() -> None:
    import pty

    # On a pseudo-terminal (stderr a tty, stdout a pipe): rich bars with a percentage on stderr.
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([*MFCLI, *CHEAP_CALIBRATION], stdout=subprocess.PIPE, stderr=secondary,
                            stdin=subprocess.DEVNULL, env=_env(), cwd=ROOT)
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
    assert "calibration" in terminal and "100%" in terminal and "\x1b[" in terminal
    assert b"\x1b" not in out and b"calibration: deterministic" in out
    # The same run with stderr a pipe: plain text, no escapes, no bars.
    piped = subprocess.run([*MFCLI, *CHEAP_CALIBRATION], capture_output=True, env=_env(), cwd=ROOT, timeout=120)
    assert piped.returncode == 0
    assert b"\x1b" not in piped.stderr and b"\x1b" not in piped.stdout and b"estimate: first run" in piped.stderr
    assert len(piped.stderr.splitlines()) < 30


def test_plain_display_prints_a_few_milestones_and_nothing_for_repeated_inner_phases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mfcli.cli.display import ProgressDisplay

    display = ProgressDisplay(quiet=False, tty=False, after=0.0)
    with display:
        for run in range(1, 14):  # a calibration of 13 runs, each with an inner MMCC phase
            for row in range(0, 101, 10):
                display(ProgressEvent("MMCC tail events", row, 100, "rows"))
            display(ProgressEvent("calibration", run, 13, "accounting runs"))
        for row in range(0, 101):  # the report after the calibration: its first plain run
            display(ProgressEvent("banded estimate", row, 100, "sample batches"))
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.splitlines()
    # the inner phase's first run (the probe before the search), the calibration's own phase,
    # then a phase not seen before; never the inner phase's repeats
    assert [line.split(":")[0] for line in lines] == (["MMCC tail events"] * 3 + ["calibration"] * 3
                                                      + ["banded estimate"] * 3)
    assert [line.split()[1] for line in lines[3:6]] == ["31%", "54%", "77%"] and "ETA" in lines[3]
    quiet = ProgressDisplay(quiet=True, tty=False, after=0.0)
    quiet(ProgressEvent("calibration", 5, 10))
    quiet.log("x")
    assert capsys.readouterr().err == ""
