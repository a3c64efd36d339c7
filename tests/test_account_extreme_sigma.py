"""`mfcli account` at extreme sigma: the exact settings give a number at any sigma (never an
OverflowError or ZeroDivisionError, exit 70), and the sampled accountants refuse a noise multiplier
outside the range they run at in one line (exit 1), instead of crashing, hanging or reporting inf."""
from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from mfcli.accounting.single_pass import SAMPLED_NOISE_MULTIPLIER_RANGE, check_sampled_noise_multiplier
from mfcli.cli.app import app
from mfcli.errors import MfcliError

runner = CliRunner()


def account(*args: str):
    return runner.invoke(app, ["account", *args])


@pytest.mark.parametrize("args, setting, epsilon, rho", [
    # mu = sens / sigma: 1e-308 -> epsilon 0, rho underflows to 0; 1e300 -> epsilon and rho inf
    (["--strategy", "sqrt", "--n", "16", "--sigma", "1e308"], "single-pass", 0.0, 0.0),
    (["--strategy", "sqrt", "--n", "16", "--sigma", "1e-300"], "single-pass", math.inf, math.inf),
    (["--strategy", "sqrt", "--n", "16", "--sigma", "1e308", "--epochs", "2"], "deterministic", 0.0, 0.0),
    (["--strategy", "sqrt", "--n", "16", "--sigma", "1e-300", "--epochs", "2"], "deterministic", math.inf, math.inf),
], ids=["single-huge", "single-tiny", "epochs-huge", "epochs-tiny"])
def test_exact_settings_give_a_number_at_any_sigma(args, setting, epsilon, rho) -> None:
    table = account(*args)
    assert table.exit_code == 0, table.output
    assert "Traceback" not in table.output
    r = account(*args, "--json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["settings"][setting]
    # --json writes a non-finite number as a string ("inf"): JSON has no infinity
    assert float(row["epsilon"]) == epsilon and float(row["rho_zcdp"]) == rho


@pytest.mark.parametrize("args, needle", [
    (["--sigma", "0.05", "--sampling", "0.1"], "sigma / sens = 0.05 is outside [0.1, 1e5]"),
    (["--sigma", "1e-300", "--sampling", "0.1"], "sigma / sens = 1e-300 is outside [0.1, 1e5]"),
    (["--sigma", "1e6", "--sampling", "0.1"], "sigma / sens = 1e+06 is outside [0.1, 1e5]"),
    (["--sigma", "1e308", "--sampling", "0.1", "--batching", "cyclic"], "is outside [0.1, 1e5]"),
    (["--sigma", "1e-8", "--batching", "balls-in-bins"], "is outside [0.1, 1e5]"),
], ids=["below", "far-below", "above", "cyclic", "balls-in-bins"])
def test_sampled_accountants_refuse_a_multiplier_out_of_range(args, needle) -> None:
    r = account("--strategy", "identity", "--n", "8", *args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output


def test_the_range_ends_are_accepted() -> None:
    lo, hi = SAMPLED_NOISE_MULTIPLIER_RANGE
    assert (lo, hi) == (0.1, 1e5)  # the message names them: change both together
    for m in (lo, 1.0, hi):
        assert check_sampled_noise_multiplier(m, "m") == m
    for m in (math.nextafter(lo, 0.0), math.nextafter(hi, math.inf), math.nan, math.inf, 0.0):
        with pytest.raises(MfcliError, match=r"outside \[0\.1, 1e5\]"):
            check_sampled_noise_multiplier(m, "m")
    r = account("--strategy", "identity", "--n", "8", "--sigma", "1e5", "--sampling", "0.1", "--json")
    assert r.exit_code == 0, r.output
    assert 0.0 < json.loads(r.stdout)["report"]["epsilon"] < 1e-3


def test_shuffle_rows_are_closed_forms_and_run_at_small_sigma() -> None:
    r = account("--strategy", "identity", "--n", "16", "--sigma", "0.05", "--batching", "shuffle", "--json")
    assert r.exit_code == 0, r.output
