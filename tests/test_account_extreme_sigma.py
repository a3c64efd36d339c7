"""`mfcli account` at extreme sigma: the exact settings give a number at any sigma (never an
OverflowError or ZeroDivisionError, exit 70); the sampled accountants refuse a noise multiplier
above the largest they run at in one line (exit 1), instead of hanging or reporting inf; a sigma so
small that the grids cannot even be allocated is one out-of-memory line (exit 1), not a crash."""
from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from mfcli.accounting.single_pass import SAMPLED_NOISE_MULTIPLIER_MAX, check_sampled_noise_multiplier
from mfcli.cli.app import app
from mfcli.cli.common import is_allocation_size_error
from mfcli.errors import MfcliError

runner = CliRunner()


def account(*args: str):
    return runner.invoke(app, ["account", *args])


def one_error_line(r, needle: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output


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
    (["--sigma", "2e6", "--sampling", "0.1"], "sigma / sens = 2e+06 is above 1e+06"),
    (["--sigma", "1e308", "--sampling", "0.1", "--batching", "cyclic"], "sigma / sens = 1e+308 is above 1e+06"),
    (["--sigma", "1e10", "--batching", "balls-in-bins"], "is above 1e+06"),
], ids=["poisson", "cyclic", "balls-in-bins"])
def test_sampled_accountants_refuse_a_multiplier_above_their_range(args, needle) -> None:
    one_error_line(account("--strategy", "identity", "--n", "8", *args), needle)


def test_a_tiny_sampled_sigma_is_one_out_of_memory_line() -> None:
    # the privacy-loss grid at noise multiplier 1e-8 has more points than an array can index
    one_error_line(account("--strategy", "identity", "--n", "8", "--sigma", "1e-8", "--sampling", "0.1"),
                   "out of memory")


def test_the_largest_multiplier_is_accepted() -> None:
    assert SAMPLED_NOISE_MULTIPLIER_MAX == 1e6  # the messages print it with :g
    for m in (0.001, 1.0, SAMPLED_NOISE_MULTIPLIER_MAX):
        assert check_sampled_noise_multiplier(m, "m") == m
    for m in (math.nextafter(SAMPLED_NOISE_MULTIPLIER_MAX, math.inf), math.nan, math.inf):
        with pytest.raises(MfcliError, match=r"m = \S+ is above 1e\+06"):
            check_sampled_noise_multiplier(m, "m")
    r = account("--strategy", "identity", "--n", "8", "--sigma", "1e6", "--sampling", "0.1", "--json")
    assert r.exit_code == 0, r.output
    assert 0.0 <= json.loads(r.stdout)["report"]["epsilon"] < 1e-4


def test_shuffle_rows_are_closed_forms_and_run_at_any_sigma() -> None:
    for sigma in ("0.05", "1e10"):
        r = account("--strategy", "identity", "--n", "16", "--sigma", sigma, "--batching", "shuffle", "--json")
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize("message, expected", [
    ("Maximum allowed size exceeded", True),
    ("array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size.", True),
    ("math domain error", False),
    ("could not convert string to float: 'x'", False),
])
def test_allocation_size_errors_are_recognised(message: str, expected: bool) -> None:
    assert is_allocation_size_error(ValueError(message)) is expected
    assert not is_allocation_size_error(RuntimeError(message))
    # the messages are numpy's own: a request numpy refuses before allocating
    import numpy as np

    with pytest.raises(ValueError) as info:
        np.arange(0.0, 1e300, 1.0)
    assert is_allocation_size_error(info.value)
