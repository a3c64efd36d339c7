"""The layout of an accounting record (a group ``accounting/<id>`` of an artifact;
docs/accounting.md) that its writer and its reader share, without any file I/O: the record's
``format`` name and the rule for an attribute too long for one HDF5 attribute (stored in parts).

The writer (:func:`mfcli.services.account.record_to_artifact`) and the one reader and verifier
(:mod:`mfcli.services.records`, which re-derives a record through ``account``) both import it
from here, so neither imports the other for the layout (layer 1 of docs/architecture.md, beside
:mod:`mfcli.model.artifact_format`). Standard library only.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any

#: ``format`` attribute of an accounting record (groups of another format are listed, not verified).
RECORD_FORMAT = "mfcli.accounting"

#: HDF5 attributes above this many characters are stored in parts (HDF5's 64 KiB header limit).
ATTR_CHUNK = 60_000


def write_chunked(attrs: MutableMapping[str, Any], name: str, text: str) -> None:
    """Store ``text`` as attribute ``name``, or, above :data:`ATTR_CHUNK` characters, as parts
    ``name_000``, ``name_001``, ... with their count in ``name_parts``."""
    if len(text) <= ATTR_CHUNK:
        attrs[name] = text
        return
    parts = [text[i:i + ATTR_CHUNK] for i in range(0, len(text), ATTR_CHUNK)]
    attrs[f"{name}_parts"] = len(parts)
    for i, part in enumerate(parts):
        attrs[f"{name}_{i:03d}"] = part


def read_chunked(attrs: Mapping[str, Any], name: str) -> str | None:
    """Reassemble an attribute written by :func:`write_chunked` (whole or in parts); None when
    neither is there."""
    if name in attrs:
        v = attrs[name]
        return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    k = attrs.get(f"{name}_parts")
    if k is None:
        return None
    return "".join(attrs[f"{name}_{i:03d}"] for i in range(int(k)))


__all__ = ["ATTR_CHUNK", "RECORD_FORMAT", "read_chunked", "write_chunked"]
