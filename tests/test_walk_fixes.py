"""Fixes from a fresh user's walkthrough of the CLI (options that were silently ignored,
labels that said the wrong thing, exit codes, loaders, JSON shapes). Each case failed before its
fix; all run at small n through the real CLI (CliRunner)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app

runner = CliRunner()


def _run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


# --- finding 2: optimize --strategy banded-toeplitz|blt honours or refuses --tol/--max-iter/--method --------

@pytest.mark.parametrize("strategy", [["--strategy", "blt", "--buffers", "2"],
                                      ["--strategy", "banded-toeplitz", "--bands", "4"]])
@pytest.mark.parametrize("extra,needle", [
    (["--method", "anderson"], "--method applies to the dense optimal strategy only"),
    (["--tol", "1e-3"], "--tol is a duality-gap target"),
    (["--max-iter", "0"], "--max-iter must be at least 1"),
])
def test_structured_refuses_options_it_cannot_honour(tmp_path: Path, strategy: list[str], extra: list[str],
                                                     needle: str) -> None:
    out = tmp_path / "x.h5"
    code, stdout, stderr = _run("optimize", "--n", "32", *strategy, *extra, "-o", str(out), "-q")
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert not out.exists() and stdout == ""


def _structured_json(tmp_path: Path, *args: str) -> dict:
    code, stdout, stderr = _run("optimize", "--n", "64", *args, "-o", str(tmp_path / "x.h5"), "--force", "--json")
    assert code == 0, stderr
    return json.loads(stdout)


def test_banded_toeplitz_max_iter_bounds_lbfgs_iterations(tmp_path: Path) -> None:
    free = _structured_json(tmp_path, "--strategy", "banded-toeplitz", "--bands", "4")
    capped = _structured_json(tmp_path, "--strategy", "banded-toeplitz", "--bands", "4", "--max-iter", "2")
    assert free["iterations"] > 2  # so the cap below is what stopped it
    assert capped["iterations"] == 2 and capped["converged"] is False
    assert capped["loss"]["mean"] > free["loss"]["mean"]


def test_blt_max_iter_reaches_the_optimiser(tmp_path: Path) -> None:
    free = _structured_json(tmp_path, "--strategy", "blt", "--buffers", "2")
    capped = _structured_json(tmp_path, "--strategy", "blt", "--buffers", "2", "--max-iter", "1")
    # one L-BFGS-B step per start cannot reach the optimum the default budget finds
    assert capped["loss"]["mean"] > free["loss"]["mean"] * (1 + 1e-6)
