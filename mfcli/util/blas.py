"""How many threads the BLAS libraries may use while a computation runs (threadpoolctl)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

#: What ``blas_threads(None)`` limits to: None (the pools as they are) unless the console entry
#: point started the BLAS with one thread (``mfcli account``, :mod:`mfcli.cli.entry`) and set it,
#: by :func:`set_unlimited_threads`, to the count the BLAS would have started with, so the blocks
#: written for the machine's threads (the dense solver, the reduction's certificate above n = 1024)
#: still get them.
_UNLIMITED: int | None = None


def machine_threads() -> int:
    """The CPUs this process may run on: the thread count OpenBLAS starts with by default."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_unlimited_threads(threads: int | None) -> None:
    """Make ``blas_threads(None)`` limit the pools to ``threads`` (None: leave them as they are)."""
    global _UNLIMITED
    _UNLIMITED = threads


@contextmanager
def blas_threads(limit: int | None, *, scipy_blas: bool = True) -> Iterator[None]:
    """Limit the BLAS thread pools to ``limit`` threads while the block runs (None: as they are).

    Why: the accounting's and the solvers' small products gain little from a second thread, which
    spins between calls and stalls under load (it doubled the CPU time of ``mfcli account`` on a
    loaded 2-core machine). threadpoolctl limits only the BLAS libraries already loaded, so
    scipy.linalg (its own OpenBLAS in the wheels) is imported first, unless ``scipy_blas`` is False
    (code that uses numpy's BLAS only, as the accounting: importing scipy.linalg for it cost ~0.06 s
    of ``mfcli account``'s start-up). Where threadpoolctl cannot act, the block runs as is.
    ``limit`` None is the machine's count where the process's BLAS was started with one thread by
    the entry point (:func:`set_unlimited_threads`), else the pools as they are.
    """
    if limit is None:
        limit = _UNLIMITED
    if limit is None:
        yield
        return
    try:
        if scipy_blas:
            import scipy.linalg  # noqa: F401
        from threadpoolctl import threadpool_limits

        ctx: Any = threadpool_limits(limits=limit, user_api="blas")
    except Exception:  # threadpoolctl missing or unable to act
        ctx = nullcontext()
    with ctx:
        yield
