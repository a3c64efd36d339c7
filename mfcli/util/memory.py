"""Memory limits for long computations: the default limit, size parsing and formatting, and the
error raised when a computation's estimated peak memory would exceed the limit.

A run that would not fit is refused up front with its estimate (or, where the size depends on the
data, as soon as the growing part crosses the limit) instead of growing until the kernel kills it."""
from __future__ import annotations

import os
import re

from mfcli.errors import MfcliError

#: Share of the machine's physical memory a computation may use by default.
DEFAULT_SHARE = 0.5

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class MemoryLimitError(MfcliError):
    """A computation's estimated memory exceeds the limit it was given."""


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def default_max_memory() -> int | None:
    """:data:`DEFAULT_SHARE` of physical memory (None: unknown, no limit)."""
    total = physical_memory()
    return None if total is None else int(total * DEFAULT_SHARE)


def address_space_in_use() -> int:
    """Bytes of address space this process has mapped now (Linux: /proc/self/statm), 0 where
    unknown."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def memory_left() -> int | None:
    """The memory a computation may still use: :func:`default_max_memory`, or what the process's
    address-space limit (``ulimit -v``) leaves beyond what is mapped already, where that is lower
    (None: no limit known)."""
    import resource

    limit = default_max_memory()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        left = max(0, soft - address_space_in_use())
        limit = left if limit is None else min(limit, left)
    return limit


def parse_size(text: str) -> int:
    """Bytes from ``512M``, ``4G``, ``1.5GiB``, ``1000000`` (binary units; case-insensitive)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if m is None or float(m.group(1)) <= 0:
        raise MfcliError(f"a memory size must be a positive number with an optional unit K, M, G or T, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(nbytes: float) -> str:
    """``1.5 GiB``: a size for messages, rounded up at 3 significant digits (an estimate shown
    next to a limit must not look smaller than it is)."""
    import math

    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            v = nbytes / scale
            digits = max(0, 2 - math.floor(math.log10(v)))
            return f"{math.ceil(v * 10**digits) / 10**digits:.{digits}f} {unit}"
    return f"{math.ceil(nbytes)} B"


def check_memory(estimate: float, limit: int | None, *, what: str, way_forward: str) -> None:
    """Raise :class:`MemoryLimitError` when ``estimate`` bytes exceed ``limit`` (None: no limit)."""
    if limit is not None and estimate > limit:
        raise MemoryLimitError(
            f"{what} needs about {format_size(estimate)} of memory, over the limit of {format_size(limit)}; {way_forward}"
        )
