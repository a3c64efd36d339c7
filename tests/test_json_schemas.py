"""Every ``--json`` object carries the mfcli version and the schema version, and matches the JSON
Schema shipped for its command (mfcli/schemas/<command>.json), checked on real output of every
mode that prints a different object. The small validator (mfcli.schemas.validate) is tested on
its own first, so a schema check that passes means something."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import mfcli
from mfcli.cli.app import COMMANDS, app
from mfcli.cli.common import JSON_SCHEMA_VERSION
from mfcli.cli.inspect import INSPECT_JSON_SCHEMA_VERSION
from mfcli.schemas import commands, load_schema, validate

# ---------------------------------------------------------------------------------------------
# The validator.

_REF = {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "object",
        "properties": {"n": {"$ref": "#/$defs/pos"}}}
VALIDATOR_CASES: list[tuple[Any, dict, bool]] = [
    (1, {"type": "integer"}, True),
    (1.0, {"type": "integer"}, True),
    (1.5, {"type": "integer"}, False),
    (True, {"type": "integer"}, False),
    (True, {"type": "number"}, False),
    (True, {"type": "boolean"}, True),
    (None, {"type": ["string", "null"]}, True),
    (3, {"type": ["string", "null"]}, False),
    ("x", {"const": "x"}, True),
    ("y", {"const": "x"}, False),
    (1, {"const": True}, False),
    ("inf", {"enum": ["inf", "-inf"]}, True),
    ("nan", {"enum": ["inf", "-inf"]}, False),
    (0, {"minimum": 1}, False),
    (1, {"minimum": 1}, True),
    ("0.1.0", {"pattern": "^[0-9]+\\.[0-9]+"}, True),
    ("v1", {"pattern": "^[0-9]+\\.[0-9]+"}, False),
    ([], {"type": "array", "minItems": 1}, False),
    ([1, "a"], {"type": "array", "items": {"type": "integer"}}, False),
    ([1, 2], {"type": "array", "items": {"type": "integer"}}, True),
    ({"a": 1}, {"type": "object", "required": ["a", "b"]}, False),
    ({"a": 1, "b": 2}, {"type": "object", "required": ["a", "b"]}, True),
    ({"a": "1"}, {"type": "object", "properties": {"a": {"type": "integer"}}}, False),
    ({"z": "1"}, {"type": "object", "additionalProperties": {"type": "integer"}}, False),
    ({"z": 1}, {"type": "object", "additionalProperties": {"type": "integer"}}, True),
    ("inf", {"anyOf": [{"type": "number"}, {"enum": ["inf"]}]}, True),
    ("x", {"anyOf": [{"type": "number"}, {"enum": ["inf"]}]}, False),
    (2, {"allOf": [{"type": "integer"}, {"minimum": 3}]}, False),
    ({"n": 0}, _REF, False),
    ({"n": 2}, _REF, True),
    ({"n": 2}, {"type": "object", "properties": {"n": False}}, False),
]


@pytest.mark.parametrize("instance, schema, ok", VALIDATOR_CASES)
def test_validator(instance: Any, schema: dict, ok: bool) -> None:
    errors = validate(instance, schema)
    assert (errors == []) is ok, errors


@pytest.mark.parametrize("keyword", ["oneOf", "maximum", "patternProperties", "not", "if"])
def test_validator_refuses_keywords_it_does_not_enforce(keyword: str) -> None:
    with pytest.raises(ValueError, match="unsupported schema keywords"):
        validate(1, {keyword: {}})


def test_every_command_has_a_schema_and_each_uses_only_enforced_keywords() -> None:
    assert commands() == sorted(COMMANDS)
    for command in commands():
        schema = load_schema(command)
        assert schema["$defs"]["header"]["properties"]["command"] == {"const": command}
        validate({}, schema)  # raises on a keyword the validator would ignore
    with pytest.raises(KeyError, match="no JSON schema"):
        load_schema("no-such-command")


# ---------------------------------------------------------------------------------------------
# Real output of every command, in each mode whose object differs.

OUTPUTS: list[list[str]] = [
    ["optimize", "-w", "prefix", "--n", "8", "--out", "o.h5"],
    ["optimize", "-w", "momentum", "--n", "16", "--min-sep", "4", "--out", "ms.h5"],
    ["optimize", "--strategy", "banded-toeplitz", "--bands", "3", "-w", "momentum", "--n", "32", "--out", "bt.h5"],
    ["compress", "prefix-n256", "--band", "4", "--rank", "2", "--out", "c.h5"],
    ["inspect", "prefix-n256"],
    ["inspect", "BT"],
    ["compare", "-n", "8", "-s", "tree,optimal"],
    ["compare", "-n", "8", "-s", "identity", "--min-sep", "2", "--curves"],
    ["compare", "-n", "8", "-s", "tree,sqrt", "--epsilon", "2", "--sampling", "0.1"],
    ["account", "-s", "tree", "-n", "8", "--sigma", "2"],
    ["account", "-s", "tree", "-n", "8", "--sigma", "2", "--sampling", "0.2"],
    ["account", "-s", "tree", "-n", "8", "--sigma", "2", "--batching", "shuffle"],
    ["account", "-s", "tree", "-n", "8", "--sigma", "2", "--batching", "balls-in-bins"],
    ["account", "-s", "optimal", "-n", "8", "--epochs", "2", "--sigma", "2"],
    ["account", "-s", "tree", "-n", "8", "--epsilon", "3", "--setting", "shuffled-tree"],
    ["account", "BT", "--sigma", "4"],
    ["account", "O", "--sigma", "4", "--write"],
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("json")
    return d


def _run(args: list[str], workdir: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(workdir)
    runner = CliRunner()
    if "BT" in args and not (workdir / "bt.h5").exists():
        assert runner.invoke(app, [*OUTPUTS[2], "-q"]).exit_code == 0
    if "O" in args:
        assert runner.invoke(app, ["optimize", "-w", "prefix", "--n", "8", "--out", "w.h5", "--force", "-q"]).exit_code == 0
    args = ["bt.h5" if a == "BT" else "w.h5" if a == "O" else a for a in args]
    extra = ["--json"] + (["-q"] if args[0] != "inspect" else []) + (["--force"] if "--out" in args else [])
    r = runner.invoke(app, [*args, *extra])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("args", OUTPUTS, ids=[" ".join(a) for a in OUTPUTS])
def test_json_output_matches_the_shipped_schema(args: list[str], workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    obj = _run(args, workdir, monkeypatch)
    assert obj["command"] == args[0]
    assert obj["mfcli_version"] == mfcli.__version__
    # inspect's layout is at version 3 (one layout for every kind); the others at the common one
    version = INSPECT_JSON_SCHEMA_VERSION if args[0] == "inspect" else JSON_SCHEMA_VERSION
    assert obj["schema_version"] == version
    assert list(obj)[:3] == ["schema_version", "command", "mfcli_version"]
    schema = load_schema(args[0])
    assert validate(obj, schema) == []
    # The schema constrains this object: dropping the version, a required field of its variant,
    # or retyping n each makes it invalid.
    for mutate in (lambda o: o.pop("mfcli_version"), lambda o: o.__setitem__("n", "8"),
                   lambda o: o.__setitem__("schema_version", version + 1)):
        bad = copy.deepcopy(obj)
        mutate(bad)
        assert validate(bad, schema), (args, bad)
