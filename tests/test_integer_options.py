"""One parse-time rule for every integer option (mfcli.cli.options.bound_integer_options): a value
past 2^53 (a 400-digit --n, --examples, --epochs, ...) is a usage error, exit 2, one line naming
the flag, before any command code runs; and the library validators refuse such counts by the
same bound instead of overflowing in float(n).

The integer options are discovered from the commands themselves (so an option added later is
covered) and checked against the ones the hostile sweep found crashing."""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import COMMANDS, app
from mfcli.errors import MfcliError
from mfcli.util.validation import MAX_COUNT, positive_int, positive_number, shown_integer, step_count

runner = CliRunner()
BIG = "9" * 400


def _integer_options() -> list[tuple[str, str, bool]]:
    """(command, flag, repeated) for every option whose value is an int or a list of ints."""
    import typer.main

    group = typer.main.get_command(app)
    ctx = group.make_context("mfcli", [next(iter(COMMANDS)), "--help"], resilient_parsing=True)
    found = []
    for name in COMMANDS:
        command = group.get_command(ctx, name)
        for p in command.params:
            ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            ptype = getattr(p, "type", None)
            is_int = ann is int or str(ann) == "list[int]" or type(ptype).__name__ in ("IntParamType", "IntRange")
            if is_int:
                flag = next(o for o in p.opts if o.startswith("--"))
                found.append((name, flag, bool(p.multiple)))
    return found


OPTIONS = _integer_options()
#: The options the hostile sweep found ending in exit 70 or a traceback (issue 26, item 7).
SWEEP = {("optimize", "--n"), ("compare", "--n"), ("account", "--n"), ("plan", "--examples"), ("plan", "--steps"),
         ("plan", "--epochs"), ("account", "--epochs"), ("account", "--min-sep"), ("optimize", "--bands"),
         ("plan", "--bands"), ("compress", "--band"), ("plan", "--params")}


def test_discovery_finds_every_option_the_sweep_named():
    assert SWEEP <= {(c, f) for c, f, _ in OPTIONS}
    assert len(OPTIONS) >= 30  # every command's integer options, not a handful


@pytest.mark.parametrize("sign", ["", "-"], ids=["positive", "negative"])
@pytest.mark.parametrize("command,flag,repeated", OPTIONS, ids=[f"{c} {f}" for c, f, _ in OPTIONS])
def test_a_400_digit_integer_is_a_one_line_usage_error(command, flag, repeated, sign):
    # the huge value comes first, so no other option (a missing required one) is looked at before it
    res = runner.invoke(app, [command, flag, sign + BIG])
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: {flag}: {sign}99999999...9999 (400 digits) is too"), lines
    assert "2^53" in lines[0] and "Traceback" not in res.stderr


@pytest.mark.parametrize("value,ok", [(MAX_COUNT, True), (MAX_COUNT + 1, False)])
def test_the_bound_is_exactly_2_to_the_53(value, ok):
    res = runner.invoke(app, ["plan", "--params", str(value), "--examples", "0"])
    # --params passes the bound (then --examples 0 is refused), or --params itself is refused
    assert res.exit_code == 2
    assert ("--params" not in res.stderr) == ok, res.stderr


def test_a_repeated_option_checks_every_value():
    res = runner.invoke(app, ["plan", "--bands", "2", "--bands", BIG])
    assert res.exit_code == 2 and res.stderr.startswith("error: --bands: 99999999...9999 (400 digits)"), res.stderr


# --- the library: the same bound, no OverflowError -------------------------------------------------


@pytest.mark.parametrize("fn,value", [
    *[(lambda v: step_count(v), v) for v in (10**400, MAX_COUNT + 1, np.uint64(2**63), 1e300)],
    *[(lambda v: step_count(v, name="epochs"), v) for v in (10**400, -(10**400))],
    *[(lambda v: positive_int(v, "the number of examples"), v) for v in (10**400, MAX_COUNT + 1, np.uint64(2**63))],
])
def test_library_counts_refuse_past_the_bound(fn, value):
    with pytest.raises(MfcliError, match=r"too large|must be at least") as err:
        fn(value)
    assert len(str(err.value)) < 200  # the number is abbreviated


def test_library_counts_accept_the_bound_and_numpy_integers():
    assert step_count(MAX_COUNT) == MAX_COUNT
    assert step_count(np.int64(7)) == 7 and step_count(np.float32(8.0)) == 8
    assert positive_int(np.int32(3), "x") == 3


def test_positive_number_of_a_huge_int_is_refused_not_overflowed():
    with pytest.raises(MfcliError, match=r"positive and finite, got 10000000\.\.\.0000 \(401 digits\)"):
        positive_number(10**400, "sigma")
    assert positive_number(10**300, "sigma") == 1e300


@pytest.mark.parametrize("value,shown", [
    (12, "12"), (-(10**19), str(-(10**19))), (10**20 - 1, "9" * 20), (10**20, "10000000...0000 (21 digits)"),
    (-(10**400), "-10000000...0000 (401 digits)"),
])
def test_shown_integer(value, shown):
    assert shown_integer(value) == shown
