"""How many threads the BLAS libraries may use while a computation runs (threadpoolctl)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any


@contextmanager
def blas_threads(limit: int | None, *, scipy_blas: bool = True) -> Iterator[None]:
    """Limit the BLAS thread pools to ``limit`` threads while the block runs (None: as they are).

    Why: the accounting's and the solvers' small products gain little from a second thread, which
    spins between calls and stalls under load (it doubled the CPU time of ``mfcli account`` on a
    loaded 2-core machine). threadpoolctl limits only the BLAS libraries already loaded, so
    scipy.linalg (its own OpenBLAS in the wheels) is imported first, unless ``scipy_blas`` is False
    (code that uses numpy's BLAS only, as the accounting: importing scipy.linalg for it cost ~0.06 s
    of ``mfcli account``'s start-up). Where threadpoolctl cannot act, the block runs as is.
    """
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
