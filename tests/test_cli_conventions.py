"""CLI conventions: usage errors are one plain ``error:`` line (and at most a hint), exit 2.

A usage error is a command line that is wrong as a whole: a value the parser cannot read, an
unknown or missing option or argument, or an option given where it does not apply to the chosen
mode (it would otherwise be silently ignored). "Given" means given at all: an option that applies
to one mode only defaults to None, so giving it with its default value is refused too. Errors in
the input itself (a bad value for the mode, a missing file) exit 1 (tests elsewhere).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import COMMANDS, app


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty directory, so a refusal that failed to trigger cannot write into the checkout."""
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "m.npy", np.tril(np.ones((4, 4))))
    return tmp_path


def _check_usage_error(exit_code: int, stderr: str, stdout: str, expected: str) -> None:
    # The parser's errors add a hint line ("try 'mfcli CMD --help'"); refusals name the options
    # in their one line.
    assert exit_code == 2, (exit_code, stderr, stdout)
    lines = stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, stderr
    assert lines[0].startswith("error: ") and expected in lines[0], stderr
    if len(lines) == 2:
        assert lines[1].startswith("try '") and lines[1].endswith(" --help'"), stderr
    for junk in ("Traceback", "╭", "│", "Usage:"):
        assert junk not in stderr, stderr
    assert stdout == ""


W8 = ["-w", "prefix", "--n", "8"]
M8 = ["-w", "momentum", "--n", "8"]

# command line -> substring of the one error line. Every pair of an option and a mode where the
# option would not apply, for every subcommand, plus the parser's own usage errors.
USAGE_ERRORS: list[tuple[list[str], str]] = [
    # The parser: unreadable value, unknown option, missing value, missing argument, unknown command.
    (["optimize", "--n", "abc"], "Invalid value for '--n'"),
    (["optimize", "--bogus"], "No such option: --bogus"),
    (["optimize", "--n"], "requires an argument"),
    (["inspect"], "Missing argument"),
    (["compress"], "Missing argument"),
    (["account", "--sigma", "four"], "Invalid value for '--sigma'"),
    (["compare", "--n", "8", "--strategies"], "requires an argument"),
    (["no-such-command"], "No such command"),
    # optimize: workload and schedule options outside their mode (also at their default values).
    (["optimize", *W8, "--beta", "0.9"], "--beta applies to --workload momentum only"),
    (["optimize", "-w", "custom", "--matrix", "m.npy", "--beta", "0.5"], "--beta applies to --workload momentum only"),
    (["optimize", *W8, "--matrix", "m.npy"], "--matrix applies to --workload custom only"),
    (["optimize", "-w", "custom", "--matrix", "m.npy", "--lr", "constant"], "--lr does not apply to --workload custom"),
    (["optimize", *M8, "--lr-factor", "0.15"], "--lr-factor applies to --lr step-decay only"),
    (["optimize", *M8, "--lr", "cooldown", "--lr-factor", "0.2"], "--lr-factor applies to --lr step-decay only"),
    (["optimize", *M8, "--lr", "step-decay", "--lr-final", "0.05"], "--lr-final applies to --lr cooldown only"),
    (["optimize", *W8, "--lr-final", "0.1"], "--lr-final applies to --lr cooldown only"),
    (["optimize", *W8, "--lr-last", "2"], "--lr-last applies to --lr step-decay or cooldown only"),
    (["optimize", *W8, "--lr", "rates.npy", "--lr-last", "2"], "--lr-last applies to --lr step-decay or cooldown only"),
    (["optimize", *W8, "--lr", "rates.npy", "--lr-factor", "0.2"], "--lr-factor applies to --lr step-decay only"),
    # compare: the same workload options, and output options without the output they shape.
    (["compare", *W8, "--beta", "0.9"], "--beta applies to --workload momentum only"),
    (["compare", *M8, "--lr-factor", "0.3"], "--lr-factor applies to --lr step-decay only"),
    (["compare", *M8, "--lr-last", "3"], "--lr-last applies"),
    (["compare", "-w", "custom", "--matrix", "m.npy", "--lr", "cooldown"], "--lr does not apply to --workload custom"),
    (["compare", *W8, "--curves"], "--curves adds per-step curves to json output"),
    (["compare", *W8, "--curves", "--format", "csv"], "no curves in csv output"),
    (["compare", *W8, "--json", "--format", "markdown"], "--json conflicts with --format markdown"),
    (["compare", *W8, "--force"], "--force applies to a file written with --out, --plot or --save-strategy"),
    (["compare", *W8, "-s", "tree", "--tol", "1e-6"], "--tol and --max-iter apply to the optimal solve"),
    (["compare", *W8, "-s", "identity,sqrt", "--max-iter", "1000"], "--tol and --max-iter apply to the optimal solve"),
    (["compare", *W8, "--artifact", "prefix-n256", "--tol", "1e-8"], "(--artifact replaces it)"),
    (["compare", *W8, "--max-participations", "2"], "--max-participations applies to --min-sep only"),
    (["compare", *W8, "--epochs", "2", "--max-participations", "2"], "--max-participations applies to --min-sep only"),
    (["compare", *W8, "--epochs", "2", "--min-sep", "2"], "--epochs and --min-sep are different participation schemas"),
    # compress: search limits with the dimension fixed, and no way to choose K and R.
    (["compress", "momentum-n256", "--band", "4", "--rank", "2", "--max-band", "8"], "--max-band limits the search for K"),
    (["compress", "momentum-n256", "--band", "4", "--rank", "2", "--max-rank", "8"], "--max-rank limits the search for R"),
    (["compress", "momentum-n256", "--band", "4", "--max-loss-increase", "0.01", "--max-band", "8"], "--max-band"),
    (["compress", "momentum-n256", "--rank", "2", "--max-loss-increase", "0.01", "--max-rank", "8"], "--max-rank"),
    (["compress", "momentum-n256", "--band", "4"], "give both --band and --rank, or --max-loss-increase"),
    (["compress", "momentum-n256", "--max-loss-increase", "0.01"], "give --out (its folder is package data)"),
    # a lone --max-participations is refused, not ignored, by every command that reads an artifact's schema
    (["compress", "momentum-n256", "--band", "4", "--rank", "2", "--max-participations", "2"],
     "--max-participations applies to --min-sep only"),
    (["inspect", "prefix-n256", "--max-participations", "2"], "--max-participations applies to --min-sep only"),
    (["account", "--sigma", "4", "--max-participations", "2"], "--max-participations applies to --min-sep only"),
    # inspect
    (["inspect", "prefix-n256", "--force"], "--force overwrites the --plot file"),
    # account: MMCC- and PLD-only options without the setting that uses them, calibration options
    # without calibration, strategy-building options without a built-in strategy.
    (["account", "--sigma", "4", "--tail-fraction", "0.5"], "--tail-fraction applies to MMCC only, which needs --sampling"),
    (["account", "--sigma", "4", "--mixture-grid", "0.02"], "--mixture-grid applies to MMCC only"),
    (["account", "--sigma", "4", "--value-discretization", "1e-4"], "--value-discretization applies to the PLD"),
    (["account", "--epsilon", "2", "--setting", "dp-sgd", "--sampling", "0.1", "--tail-fraction", "0.5"],
     "--tail-fraction applies to MMCC only, which not calibrated here (dp-sgd)"),
    (["account", "--epsilon", "2", "--setting", "dp-sgd", "--sampling", "0.1", "--mixture-grid", "0.1"],
     "--mixture-grid applies to MMCC only"),
    (["account", "--epsilon", "2", "--setting", "single-pass", "--sampling", "0.1"],
     "--sampling does not apply to calibrating single-pass"),
    (["account", "--strategy", "tree", "--n", "8", "--epsilon", "2", "--setting", "shuffled-tree", "--sampling", "0.1"],
     "--sampling does not apply to calibrating shuffled-tree"),
    (["account", "--epsilon", "2", "--value-discretization", "1e-4"], "--value-discretization applies to the PLD"),
    (["account", "--sigma", "4", "--setting", "mmcc"], "--setting selects what --epsilon calibrates"),
    (["account", "--sigma", "4", "--epsilon", "2"], "give exactly one of --sigma"),
    (["account"], "give exactly one of --sigma"),
    (["account", "--sigma", "4", "--n", "8"], "--n applies to a built-in --strategy"),
    (["account", "--sigma", "4", "--workload", "prefix"], "--workload applies to a built-in --strategy"),
    (["account", "prefix-n256", "--sigma", "4", "-w", "momentum"], "--workload applies to a built-in --strategy"),
    (["account", "--strategy", "tree", "--n", "8", "--sigma", "4", "--beta", "0.9"],
     "--beta applies to --workload momentum only"),
    (["account", "--strategy", "tree", "--n", "8", "-w", "prefix", "--sigma", "4", "--beta", "0.5"], "--beta"),
    # values outside an option's own range or choices, refused while parsing (before any work)
    (["account", "--sigma", "4", "--sampling", "0.1", "--tail-fraction", "2"], "--tail-fraction: tail fractions must lie"),
    (["account", "--sigma", "4", "--sampling", "0.1", "--value-discretization", "-1"], "--value-discretization: "),
    (["account", "--sigma", "4", "--sampling", "0.1", "--mixture-grid", "0"], "--mixture-grid: the mixture grid"),
    (["account", "--sigma", "4", "--sampling", "0.1", "--max-memory", "foo"], "--max-memory: a memory size"),
    (["account", "--sigma", "4", "--operator", "foo"], "--operator: operator must be one of"),
    (["account", "--epsilon", "4", "--setting", "foo"], "--setting: unknown setting 'foo'"),
    (["account", "--strategy", "foo", "--n", "8", "--sigma", "4"], "--strategy: unknown strategy 'foo'"),
    (["account", "--strategy", "tree", "--n", "8", "-w", "foo", "--sigma", "4"], "--workload: unknown workload 'foo'"),
    (["plan", "--examples", "0", "--batch", "10", "--epochs", "1", "--epsilon", "2"], "--examples: the number of examples"),
    (["plan", "--examples", "100", "--batch", "0", "--epochs", "1", "--epsilon", "2"], "--batch: the batch size"),
    (["plan", "--examples", "100", "--batch", "10", "--epochs", "1", "--epsilon", "2", "--params", "0"], "--params: "),
    (["plan", "--examples", "100", "--batch", "10", "--epochs", "1", "--epsilon", "2", "-w", "custom"],
     "--workload: unknown plan workload 'custom'"),
    (["compare", "--n", "8", "--format", "foo"], "--format must be one of"),
    # (--max-participations with --sampling is no usage error: a cap the cycle never reaches is accepted, one
    # that binds depends on n and is refused with exit 1: tests/test_compare_equal_privacy.py)
]


@pytest.mark.parametrize("args, expected", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_usage_errors_are_one_line_and_exit_2(args: list[str], expected: str, in_tmp: Path) -> None:
    r = CliRunner().invoke(app, args)
    _check_usage_error(r.exit_code, r.stderr, r.stdout, expected)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["m.npy"], "a refused command wrote a file"


# The same options where they do apply: accepted (a refusal above that fired everywhere would fail here).
ACCEPTED: list[list[str]] = [
    ["optimize", *M8, "--beta", "0.5", "--lr", "step-decay", "--lr-factor", "0.2", "--lr-last", "2", "--out", "o.h5"],
    ["optimize", *W8, "--lr", "cooldown", "--lr-final", "0.1", "--lr-last", "3", "--out", "o.h5"],
    ["optimize", "-w", "custom", "--matrix", "m.npy", "--out", "o.h5"],
    ["compare", *W8, "-s", "tree", "--json", "--curves"],
    ["compare", *W8, "-s", "identity", "--min-sep", "2", "--max-participations", "2"],
    ["compare", *W8, "-s", "identity", "--epochs", "2"],
    ["compare", *W8, "-s", "tree,optimal", "--tol", "1e-6", "--max-iter", "50", "--format", "csv"],
    ["compare", *W8, "-s", "tree", "--out", "t.md", "--format", "markdown", "--force"],
    ["compress", "prefix-n256", "--band", "4", "--rank", "2"],
    ["compress", "prefix-n256", "--band", "8", "--max-loss-increase", "0.5", "--max-rank", "2", "--out", "s.h5"],
    ["inspect", "prefix-n256", "--no-certificate"],
    ["account", "--strategy", "identity", "--n", "4", "-w", "momentum", "--beta", "0.5", "--sigma", "4",
     "--sampling", "0.5", "--tail-fraction", "0.5", "--mixture-grid", "0.1", "--value-discretization", "1e-2"],
    ["account", "--strategy", "identity", "--n", "4", "--epsilon", "8", "--setting", "dp-sgd", "--sampling", "0.5",
     "--value-discretization", "1e-2"],
]


@pytest.mark.parametrize("args", ACCEPTED, ids=[" ".join(a) for a in ACCEPTED])
def test_options_where_they_apply_are_accepted(args: list[str], in_tmp: Path) -> None:
    r = CliRunner().invoke(app, [*args, "-q"] if args[0] != "inspect" else args)
    assert r.exit_code == 0, r.stderr


def test_compress_of_a_shipped_name_writes_to_the_current_directory(in_tmp: Path) -> None:
    r = CliRunner().invoke(app, ["compress", "prefix-n256", "--band", "4", "--rank", "2", "-q"])
    assert r.exit_code == 0, r.stderr
    assert (in_tmp / "prefix-n256-k4r2.h5").is_file()


@pytest.mark.parametrize(
    "args, expected",
    [(["optimize", "--n", "abc"], "Invalid value for '--n'"),
     (["account", "--sigma", "4", "--tail-fraction", "0.5"], "MMCC only")],
)
def test_usage_errors_in_a_real_process(args: list[str], expected: str, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "mfcli", *args], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent), "PATH": "/usr/bin:/bin"})
    _check_usage_error(res.returncode, res.stderr, res.stdout, expected)


def test_no_arguments_prints_help_and_exits_2() -> None:
    r = CliRunner().invoke(app, [])
    assert r.exit_code == 2
    assert "Usage: mfcli" in r.stderr and "╭" not in r.stderr


def test_help_lists_every_command_and_each_command_has_help() -> None:
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    for name, (_, _, short) in COMMANDS.items():
        assert name in r.stdout
        sub = CliRunner().invoke(app, [name, "--help"])
        assert sub.exit_code == 0 and f"Usage: mfcli {name}" in sub.stdout, sub.stderr
        # The one-line help shown by `mfcli --help` (without importing the command) is also the
        # command's own short help.
        assert " ".join(short.split()[:4]) in " ".join(r.stdout.split())
