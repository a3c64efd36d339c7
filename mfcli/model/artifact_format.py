"""The definitions of the mfcli artifact format that every reader, writer and operator shares,
without any file I/O (docs/artifact-format.md): the format's name and version, the dataset
checksum, the one HDF5 attribute decoder, and the rule that a file declaring a compressed decoder
must hold its group.

numpy only (layer 1 of docs/architecture.md, beside :mod:`mfcli.model.factorization`, whose name the
format carries), so the operators (which hash their matrices) and the artifact reader (which sits
above the structured kinds it decodes) both import it without a cycle.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

FORMAT = "mfcli.factorization"
FORMAT_VERSION = 1
#: The group of a compressed decoder (``mfcli compress``; :data:`mfcli.strategies.operators.GROUP`).
COMPRESSED_GROUP = "compressed"


def dataset_sha256(arr: np.ndarray) -> str:
    """SHA-256 of an array's little-endian C-order bytes, prefixed by its dtype and shape."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def decode_attr(value: Any) -> Any:
    """An HDF5 attribute as the Python value it was written from: bytes to str, JSON objects,
    lists and ``null`` parsed, numpy scalars to Python numbers; anything else as stored."""
    if isinstance(value, bytes):
        value = value.decode()
    if (isinstance(value, str) and value[:1] in "{[") or value == "null":
        try:
            return json.loads(value)
        except (ValueError, TypeError):
            return value
    if isinstance(value, np.generic):
        return value.item()
    return value


def compression_declared_problem(attrs: Mapping[str, Any], has_group: bool) -> str | None:
    """Why a root that says the artifact is compressed (``compression_band`` /
    ``compression_rank``, a strategy name ending in ``+compressed``) does not fit a file without a
    ``compressed`` group (renamed or deleted: the operator that would run is no longer the one the
    file describes); None when it fits."""
    if has_group:
        return None
    says = [k for k in ("compression_band", "compression_rank") if attrs.get(k) is not None]
    if str(attrs.get("strategy_name", "")).endswith("+compressed"):
        says.append(f"strategy_name {attrs.get('strategy_name')!r}")
    if not says:
        return None
    return (f"the root declares a compressed decoder ({', '.join(says)}) but the file has no {COMPRESSED_GROUP!r} "
            "group (renamed or deleted)")


__all__ = [
    "COMPRESSED_GROUP",
    "FORMAT",
    "FORMAT_VERSION",
    "compression_declared_problem",
    "dataset_sha256",
    "decode_attr",
]
