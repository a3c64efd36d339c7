"""Findings of a user walkthrough (fresh install): values outside an option's own range are usage
errors (README "Exit codes": one ``error:`` line, exit 2, before any work), messages that were
untrue (an empty path named as ``.``, a plot directory reported as existing, a loss increase shown
as 0.0000% while above a budget of 0), outputs that replaced their own input, and a default
artifact name that two schedules shared.

Oracles: hand-written tables (the range of each option, the exact default names, the expected
percentages), the input file's bytes before and after, and the library's own evaluation of the
one setting whose percentage is printed (the message must state that number, not 0)."""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.io.artifact import save_artifact
from mfcli.model.workloads import (
    build_workload,
    check_lr,
    check_lr_factor,
    check_lr_final,
    check_lr_last,
    default_artifact_stem,
    momentum_workload,
    prefix_workload,
)
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.compare import check_kept_strategy
from mfcli.services.compress import (
    check_als_iterations,
    check_max_loss_increase,
    compress_factorization,
    percent,
)

runner = CliRunner()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with a learning-rate file, a custom matrix and a small artifact."""
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "rates.npy", np.linspace(1.0, 0.1, 16))
    np.save(tmp_path / "m.npy", np.tril(np.ones((16, 16))))
    w = prefix_workload(16)
    res = optimal_factorization(w.matrix, tol=1e-8)
    save_artifact(tmp_path / "in.h5", res.factorization, workload_name=w.name, workload_params=w.params,
                  strategy_name="optimal", solver=res.certificate(), command="test", dual_weights=res.dual_weights)
    return tmp_path


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Values outside the range an option allows on its own: exit 2, one line naming the flag.
# Each command line would run (or fail with exit 1 only later) with an in-range value instead.

RANGE_ERRORS: list[tuple[list[str], str]] = [
    *[(["optimize", "--n", "64", "--lr", "cooldown", "--lr-final", v, "-o", "o.h5"],
       "--lr-final: the cooldown final learning rate must be a finite number > 0")
      for v in ("nan", "-1", "0", "inf", "-inf")],
    *[(["optimize", "--n", "64", "--lr", "step-decay", "--lr-factor", v, "-o", "o.h5"],
       "--lr-factor: the step-decay factor must be a finite number > 0")
      for v in ("0", "inf", "nan", "-0.5")],
    (["optimize", "--n", "64", "--lr", "step-decay", "--lr-last", "-1", "-o", "o.h5"],
     "--lr-last: the decay length must be at least 0"),
    (["compare", "--n", "64", "--lr", "cooldown", "--lr-final", "0", "-s", "tree"], "--lr-final: "),
    *[(["compress", "in.h5", "--max-loss-increase", v, "-o", "c.h5"],
       "--max-loss-increase: the budget on the loss increase must be a finite number >= 0")
      for v in ("nan", "-0.1", "inf", "-inf")],
    (["compress", "momentum-n256", "--max-loss-increase", "nan"], "--max-loss-increase: "),  # before "give --out"
    (["compress", "in.h5", "-k", "2", "-r", "1", "--max-iter", "-1", "-o", "c.h5"],
     "--max-iter: max ALS iterations must be an integer >= 0"),
    (["compress", "in.h5", "--max-loss-increase", "0.1", "--max-band", "0", "-o", "c.h5"], "--max-band: "),
    (["compress", "in.h5", "--max-loss-increase", "0.1", "--max-rank", "-1", "-o", "c.h5"], "--max-rank: "),
    (["compare", "--n", "64", "--save-strategy", "foo", "--out", "x.h5"],
     "--save-strategy: unknown strategy 'foo' to save; choose from identity, tree"),
    # an empty path: said so, not ". is a directory"
    (["optimize", "--n", "8", "-o", ""], "--out: the path is empty"),
    (["optimize", "--n", "8", "--lr", ""], "--lr: the learning-rate schedule or file is empty"),
    (["optimize", "--n", "8", "--lr", "  "], "--lr: the learning-rate schedule or file is empty"),
    (["optimize", "-w", "custom", "--matrix", ""], "--matrix: the path is empty"),
    (["optimize", "--n", "8", "--warm-start", ""], "--warm-start: the path is empty"),
    (["compare", "--n", "8", "-a", "in.h5", "-a", ""], "--artifact: the path is empty"),
    (["compare", "--n", "8", "-s", "tree", "--plot", ""], "--plot: the path is empty"),
    (["inspect", ""], "ARTIFACT: the path is empty"),
    (["inspect", "in.h5", "--plot", ""], "--plot: the path is empty"),
    (["compress", "", "-k", "1", "-r", "0"], "ARTIFACT: the path is empty"),
    (["compress", "in.h5", "-k", "1", "-r", "0", "-o", ""], "--out: the path is empty"),
]


@pytest.mark.parametrize("args, expected", RANGE_ERRORS, ids=[" ".join(a) for a, _ in RANGE_ERRORS])
def test_a_value_outside_the_options_own_range_is_a_usage_error(args: list[str], expected: str, in_tmp: Path) -> None:
    before = _files(in_tmp)
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    line = _one_error_line(r.stderr)
    assert line.startswith(f"error: {expected}") or expected in line, line
    assert ". is a directory" not in line
    assert r.stdout == ""
    assert _files(in_tmp) == before, "a refused command wrote or changed a file"


# The edges of the same ranges, inside them: accepted (a refusal that fired too widely fails here).
ACCEPTED: list[list[str]] = [
    ["optimize", "--n", "8", "--lr", "cooldown", "--lr-final", "2", "--lr-last", "0", "-o", "a.h5"],
    ["optimize", "--n", "8", "--lr", "cooldown", "--lr-final", "1e-300", "-o", "b.h5"],
    ["optimize", "--n", "8", "--lr", "step-decay", "--lr-factor", "1", "--lr-last", "8", "-o", "c.h5"],
    ["compress", "in.h5", "-k", "2", "-r", "1", "--max-iter", "0", "-o", "d.h5"],
    ["compress", "in.h5", "--max-loss-increase", "0.5", "--max-band", "16", "--max-rank", "0", "-o", "e.h5"],
    ["compare", "--n", "8", "-s", "tree", "--save-strategy", "identity", "--out", "f.h5"],
]


@pytest.mark.parametrize("args", ACCEPTED, ids=[" ".join(a) for a in ACCEPTED])
def test_the_edges_of_each_range_are_accepted(args: list[str], in_tmp: Path) -> None:
    r = runner.invoke(app, [*args, "-q"])
    assert r.exit_code == 0, r.stderr


# The library validators the callbacks call: each range stated once, there. Expected by definition.
@pytest.mark.parametrize("check, value, ok", [
    *[(check_lr_factor, v, ok) for v, ok in ((0.15, True), (1e-300, True), (7.0, True), (0.0, False), (-0.0, False),
                                           (-1.0, False), (math.inf, False), (math.nan, False), ("x", False))],
    *[(check_lr_final, v, ok) for v, ok in ((0.05, True), (2.0, True), (0.0, False), (-1, False),
                                          (math.nan, False), (math.inf, False))],
    *[(check_lr_last, v, ok) for v, ok in ((0, True), (5, True), (-1, False), (2.5, False))],
    *[(check_lr, v, ok) for v, ok in (("constant", True), ("rates.npy", True), ("", False), (" ", False),
                                    (None, False))],
    *[(check_max_loss_increase, v, ok) for v, ok in ((0.0, True), (0, True), (0.01, True), (-1e-12, False),
                                                   (math.nan, False), (math.inf, False), (True, False))],
    *[(check_als_iterations, v, ok) for v, ok in ((0, True), (7, True), (-1, False), (1.5, False), (True, False))],
    *[(check_kept_strategy, v, ok) for v, ok in (("tree", True), ("optimal", True), ("foo", False), ("", False))],
])
def test_library_validators(check, value, ok) -> None:
    if ok:
        check(value)
    else:
        with pytest.raises(MfcliError):
            check(value)


def test_build_workload_refuses_an_empty_lr_instead_of_reading_the_current_directory() -> None:
    with pytest.raises(MfcliError, match="empty") as info:
        build_workload("prefix", 8, lr="")
    assert "directory" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# Messages that must be true.

@pytest.mark.parametrize("fraction, text", [
    (0.0125, "1.2500%"), (0.0, "0.0000%"), (-0.5, "-50.0000%"), (1e-4, "0.0100%"),
    (1.54e-8, "1.54e-06%"), (4e-7, "4e-05%"), (-2e-9, "-2e-07%"), (3.55e-15, "3.55e-13%"),
])
def test_percent_never_shows_a_nonzero_fraction_as_zero(fraction: float, text: str) -> None:
    assert percent(fraction) == text


def test_a_budget_of_0_missed_by_a_tiny_increase_says_how_much(tmp_path: Path) -> None:
    # optimal momentum n = 24: K = 1, R = 8 raises the loss by about 1.5e-8 (relative), far above
    # roundoff and far below the 0.00005 that .4% shows as nonzero
    w = momentum_workload(24, beta=0.9)
    res = optimal_factorization(w.matrix, tol=1e-10)
    path = tmp_path / "mom.h5"
    save_artifact(path, res.factorization, workload_name=w.name, workload_params=w.params, strategy_name="optimal",
                  solver=res.certificate(), command="test", dual_weights=res.dual_weights)
    increase = compress_factorization(res.factorization, band=1, rank=8).loss_increase
    assert 1e-12 < increase < 5e-7  # the case this test is about: shown as 0.0000% by four decimals
    r = runner.invoke(app, ["compress", str(path), "-k", "1", "-r", "8", "--max-loss-increase", "0",
                            "-o", str(tmp_path / "c.h5"), "-q"])
    assert r.exit_code == 1
    line = _one_error_line(r.stderr)
    shown = re.search(r"increases the loss by (\S+)%", line)
    assert shown is not None, line
    assert float(shown.group(1)) > 0 and math.isclose(float(shown.group(1)), 100 * increase, rel_tol=0.01), line
    assert not (tmp_path / "c.h5").exists()


@pytest.mark.parametrize("target, force, expected", [
    ("adir", False, "give a file name ending in .png, not adir"),
    ("adir", True, "give a file name ending in .png, not adir"),
    ("adir.png", True, "adir.png is a directory"),
    ("adir.png", False, "adir.png is a directory"),
    ("old.png", False, "old.png already exists (use --force to overwrite)"),
])
def test_inspect_plot_target_is_checked_name_first(target: str, force: bool, expected: str, in_tmp: Path) -> None:
    pytest.importorskip("matplotlib")
    (in_tmp / "adir").mkdir()
    (in_tmp / "adir.png").mkdir()
    (in_tmp / "old.png").write_bytes(b"old")
    r = runner.invoke(app, ["inspect", "in.h5", "--plot", target, *(["--force"] if force else [])])
    assert r.exit_code == 1
    line = _one_error_line(r.stderr)
    assert line.endswith(expected) and "already exists" not in line.replace(expected, ""), line
    assert r.stdout == "", "refused before the report"
    assert (in_tmp / "old.png").read_bytes() == b"old"


# ---------------------------------------------------------------------------------------------
# An output that is one of the command's inputs is refused, --force or not, as compress refuses.

OVERWRITES: list[tuple[list[str], str, str]] = [
    (["compare", "--n", "16", "--artifact", "in.h5", "--save-strategy", "tree", "--out", "in.h5"], "in.h5",
     "the output in.h5 is the input artifact; comparison never modifies its input"),
    (["compare", "--n", "16", "--artifact", "in.h5", "--save-strategy", "tree", "--out", "./in.h5"], "in.h5",
     "the output in.h5 is the input artifact"),
    (["compare", "--n", "16", "--artifact", "in.h5", "--out", "in.h5"], "in.h5", "is the input artifact"),
    (["compare", "-w", "custom", "--matrix", "m.npy", "-s", "tree", "--out", "m.npy"], "m.npy",
     "the output m.npy is the input file"),
    (["optimize", "--n", "16", "--warm-start", "in.h5", "-o", "in.h5"], "in.h5",
     "the output in.h5 is the input artifact; optimization never modifies its input"),
    (["optimize", "--n", "16", "--lr", "rates.npy", "-o", "rates.npy"], "rates.npy", "the output rates.npy is the input file"),
    (["optimize", "-w", "custom", "--matrix", "m.npy", "-o", "m.npy"], "m.npy", "the output m.npy is the input file"),
    (["compress", "in.h5", "-k", "2", "-r", "1", "-o", "in.h5"], "in.h5",
     "the output in.h5 is the input artifact; compression never modifies its input"),
]


@pytest.mark.parametrize("args, victim, expected", OVERWRITES, ids=[" ".join(a) for a, _, _ in OVERWRITES])
def test_an_output_that_is_an_input_is_refused_even_with_force(args: list[str], victim: str, expected: str,
                                                               in_tmp: Path) -> None:
    before = _files(in_tmp)
    r = runner.invoke(app, [*args, "--force", "-q"])
    assert r.exit_code == 1, r.stderr
    assert expected in _one_error_line(r.stderr)
    assert _files(in_tmp) == before, f"{victim} was replaced or a file was written"


# ---------------------------------------------------------------------------------------------
# Default artifact names: one per schedule, so a plain run never lands on a scheduled one.

@pytest.mark.parametrize("workload, lr, stem", [
    ("prefix", "constant", "prefix"),
    ("momentum", "cooldown", "momentum-cooldown"),
    ("prefix", "step-decay", "prefix-step-decay"),
    ("prefix", "rates.npy", "prefix-lr-rates"),
    ("momentum", "sub/my rates;v2.csv", "momentum-lr-my_rates_v2"),
    ("prefix", "v.2.npy", "prefix-lr-v.2"),
])
def test_default_artifact_stem_names_the_schedule(workload: str, lr: str, stem: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    if lr.endswith((".npy", ".csv")):
        Path(lr).parent.mkdir(parents=True, exist_ok=True)
        if lr.endswith(".npy"):
            np.save(lr, np.ones(8))
        else:
            Path(lr).write_text("\n".join(["1"] * 8))
    assert default_artifact_stem(build_workload(workload, 8, lr=lr)) == stem


def test_optimize_with_a_rates_file_and_without_write_different_defaults(in_tmp: Path) -> None:
    first = runner.invoke(app, ["optimize", "--workload", "prefix", "--n", "16", "--lr", "rates.npy", "-q"])
    assert first.exit_code == 0, first.stderr
    plain = runner.invoke(app, ["optimize", "--workload", "prefix", "--n", "16", "-q"])
    assert plain.exit_code == 0, plain.stderr  # no collision: "already exists" before the fix
    epochs = runner.invoke(app, ["optimize", "--n", "16", "--lr", "rates.npy", "--epochs", "2", "-q"])
    assert epochs.exit_code == 0, epochs.stderr
    assert sorted(p.name for p in (in_tmp / "artifacts").iterdir()) == [
        "prefix-lr-rates-n16-epochs2.h5", "prefix-lr-rates-n16.h5", "prefix-n16.h5"]


@pytest.mark.parametrize("args, hint", [
    (["account", "--sigma"], "try 'mfcli account --help'"),         # no context yet: the parser fails first
    (["plan", "--examples", "10", "--epsilon"], "try 'mfcli plan --help'"),
    (["account", "--bogus"], "try 'mfcli account --help'"),
    (["--bogus"], "try 'mfcli --help'"),
], ids=["missing-value", "missing-value-plan", "unknown-option", "top-level"])
def test_parser_errors_end_with_the_help_hint(args, hint) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "mfcli", *args], capture_output=True, text=True, check=False,
                       env={**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[1])})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "", r.stderr
    # under python -m, Click names the program "python -m mfcli" where it has a context
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("try '"), r.stderr
    assert lines[1].endswith(hint.removeprefix("try '")) and lines[1].count("mfcli") == 1, r.stderr
