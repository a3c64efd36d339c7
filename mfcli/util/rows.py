"""The JSON row of a result object, written once: its attributes by name, in a fixed order, then
the values computed for the row (``as_dict`` of the accounting results, the factorization's
summary, the account report). Standard library only (layer 0 of docs/architecture.md)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def fields_of(obj: Any, *names: str, first: Mapping[str, Any] | None = None, **computed: Any) -> dict[str, Any]:
    """``first`` (keys that lead the row: a setting's name), then {name: obj.name} for each of
    ``names`` in that order, then ``computed`` in keyword order (a renamed or derived value, a
    method text). ``fields_of(r, "epsilon", "delta", first={"setting": "x"}, method="m")`` is
    ``{"setting": "x", "epsilon": r.epsilon, "delta": r.delta, "method": "m"}``."""
    return {**(first or {}), **{name: getattr(obj, name) for name in names}, **computed}


__all__ = ["fields_of"]
