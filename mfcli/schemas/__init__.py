"""JSON Schemas of the objects that ``mfcli <command> --json`` prints, shipped with the package.

``mfcli/schemas/<command>.json`` describes one command's object (draft 2020-12 keywords). Every
object carries ``schema_version`` (the layout version, :data:`mfcli.cli.common.JSON_SCHEMA_VERSION`)
and ``mfcli_version``. A consumer can validate with any JSON Schema implementation; mfcli itself
needs none: :func:`validate` checks the subset of keywords these schemas use, and refuses a schema
that uses any other keyword (so a keyword cannot be silently ignored).
"""
from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

#: Keywords :func:`validate` enforces; annotations (titles, descriptions, ids) are allowed too.
SUPPORTED = frozenset({
    "type", "const", "enum", "required", "properties", "additionalProperties", "items", "minItems",
    "minimum", "pattern", "anyOf", "allOf", "$ref", "$defs",
})
ANNOTATIONS = frozenset({"$schema", "$id", "title", "description"})

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    # JSON has one number type: true and false are not numbers, 1.0 is an integer.
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def commands() -> list[str]:
    """The commands that have a schema."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


def load_schema(command: str) -> dict[str, Any]:
    """The schema of ``mfcli <command> --json``, read from the installed package."""
    if command not in commands():
        raise KeyError(f"no JSON schema for command {command!r}; known: {', '.join(commands())}")
    return json.loads(resources.files(__name__).joinpath(f"{command}.json").read_text(encoding="utf-8"))


def _equal(a: Any, b: Any) -> bool:
    # JSON equality: 1 == 1.0, but true is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def validate(instance: Any, schema: dict[str, Any]) -> list[str]:
    """The ways ``instance`` violates ``schema``, as ``path: problem`` strings (empty: valid).

    Raises ValueError when the schema uses a keyword outside :data:`SUPPORTED`."""
    errors: list[str] = []
    _check(instance, schema, schema, "$", errors)
    return errors


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"only local references are supported, not {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _check(v: Any, s: Any, root: dict[str, Any], path: str, errors: list[str]) -> None:
    if s is True or s == {}:
        return
    if s is False:
        errors.append(f"{path}: not allowed")
        return
    unknown = set(s) - SUPPORTED - ANNOTATIONS
    if unknown:
        raise ValueError(f"unsupported schema keywords at {path}: {sorted(unknown)}")
    if "$ref" in s:
        _check(v, _resolve(s["$ref"], root), root, path, errors)
    if "type" in s:
        types = [s["type"]] if isinstance(s["type"], str) else s["type"]
        if not any(_TYPES[t](v) for t in types):
            errors.append(f"{path}: {json.dumps(v)[:60]} is not of type {' or '.join(types)}")
            return
    if "const" in s and not _equal(v, s["const"]):
        errors.append(f"{path}: {json.dumps(v)[:60]} is not {json.dumps(s['const'])}")
    if "enum" in s and not any(_equal(v, e) for e in s["enum"]):
        errors.append(f"{path}: {json.dumps(v)[:60]} is not one of {json.dumps(s['enum'])}")
    if "minimum" in s and _TYPES["number"](v) and v < s["minimum"]:
        errors.append(f"{path}: {v} is less than {s['minimum']}")
    if "pattern" in s and isinstance(v, str) and re.search(s["pattern"], v) is None:
        errors.append(f"{path}: {v!r} does not match {s['pattern']!r}")
    if isinstance(v, list):
        if "minItems" in s and len(v) < s["minItems"]:
            errors.append(f"{path}: fewer than {s['minItems']} items")
        if "items" in s:
            for i, item in enumerate(v):
                _check(item, s["items"], root, f"{path}[{i}]", errors)
    if isinstance(v, dict):
        for key in s.get("required", []):
            if key not in v:
                errors.append(f"{path}: missing required {key!r}")
        props = s.get("properties", {})
        for key, item in v.items():
            if key in props:
                _check(item, props[key], root, f"{path}.{key}", errors)
            elif "additionalProperties" in s:
                _check(item, s["additionalProperties"], root, f"{path}.{key}", errors)
    for sub in s.get("allOf", []):
        _check(v, sub, root, path, errors)
    if "anyOf" in s:
        branches = []
        for sub in s["anyOf"]:
            errs: list[str] = []
            _check(v, sub, root, path, errs)
            if not errs:
                break
            branches.append(errs)
        else:
            best = min(branches, key=len)
            errors.append(f"{path}: matches none of {len(branches)} alternatives (closest: {'; '.join(best)})")
