"""The console script's entry point: what must happen before the command framework and numpy load.

Why a module of its own: importing :mod:`mfcli.cli.app` loads Typer, Click and rich (about 0.1 s
of CPU), which a version query does not need, and numpy's BLAS reads its thread count from the
environment once, when numpy is imported. So:

* ``mfcli --version`` is answered here, before anything heavy loads (``tests/test_packaging.py``
  holds it to the Typer option's output);
* ``mfcli account`` starts with ONE BLAS thread when the user has set none of the thread
  variables (:data:`THREAD_VARIABLES`), see :func:`account_blas_environment`; a user's setting
  wins; and numpy's tooling packages that scipy.special loads unused (:data:`DEFERRED_MODULES`)
  are imported lazily for it;
* every command line then goes to :func:`mfcli.cli.app.main` unchanged.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

#: Environment variables that set a BLAS or OpenMP thread count: OpenBLAS reads the first three
#: (in this order), MKL, BLIS and Apple's Accelerate their own. A user who set any of them chose the
#: threads, and :func:`account_blas_environment` then changes nothing.
THREAD_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

#: Commands that start with one BLAS thread unless the user set the threads.
ONE_BLAS_THREAD_COMMANDS = ("account",)


def account_blas_environment(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The thread variables to set (each to ``"1"``) before numpy loads, for the command line
    ``argv`` (without the program name); empty when the command is not ``account`` or the user set
    any of :data:`THREAD_VARIABLES` to a non-empty value (their setting wins, all of it).

    Why one thread: the accounting's products are small (MMCC and the reduction's certificate up to
    n = 1024 limit BLAS to one thread while they run anyway), but the OpenBLAS libraries of numpy
    and of scipy each start one worker thread per CPU beyond the first when they load, and a worker
    spins after start-up and after each call it takes part in: on a 2-core machine that cost
    ``mfcli account --sigma 4 --sampling 0.01`` 0.1 to 0.7 s of CPU (medians, by load) for the same
    digits, and under load the second thread made large eigendecompositions slower in wall time.
    threadpoolctl limits a pool only after it started; the environment is read before. The blocks
    written for the machine's threads still get them (:func:`set_account_blas_threads`).
    docs/performance.md has the measurements.
    """
    if not argv or argv[0] not in ONE_BLAS_THREAD_COMMANDS:
        return {}
    if any(environ.get(name, "").strip() for name in THREAD_VARIABLES):
        return {}
    return dict.fromkeys(THREAD_VARIABLES, "1")


def set_account_blas_threads(argv: Sequence[str], environ: MutableMapping[str, str] | None = None) -> None:
    """Apply :func:`account_blas_environment` to ``environ`` (default: ``os.environ``; child
    processes of the command inherit the setting). Where it sets the threads to one, a block that
    asks for the BLAS threads as they are (``mfcli.util.blas.blas_threads(None)``: the dense solver
    of ``--strategy optimal``, the reduction's eigenvalue certificate above n = 1024) gets the
    machine's count for its duration, as without the rule."""
    env = os.environ if environ is None else environ
    one = account_blas_environment(argv, env)
    env.update(one)
    if one and environ is None:
        from mfcli.util.blas import machine_threads, set_unlimited_threads

        set_unlimited_threads(machine_threads())


#: numpy's tooling packages that ``import scipy.special`` loads without using them: scipy's
#: array-API layer copies numpy's namespace by reading every name in ``dir(numpy)``, and numpy
#: imports its lazily loaded submodules on that first read (numpy.f2py's Fortran parser and
#: numpy.testing with unittest: 0.06 to 0.1 s of CPU of ``mfcli account``). Deferred for ``account``
#: by :func:`defer_numpy_tooling`.
DEFERRED_MODULES = ("numpy.f2py", "numpy.testing")


class _DeferredImport(importlib.abc.MetaPathFinder):
    """Import finder for :data:`DEFERRED_MODULES`: the module is found as usual and executed on the
    first access to one of its attributes (``importlib.util.LazyLoader``), not at import."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in DEFERRED_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def defer_numpy_tooling(argv: Sequence[str]) -> None:
    """For ``mfcli account`` (``argv`` without the program name): import :data:`DEFERRED_MODULES`
    lazily, so they load only if something uses them. Nothing the command computes uses them; its
    output is the same digits (``scripts/bench_account.py --headline --before`` compares)."""
    if argv and argv[0] in ONE_BLAS_THREAD_COMMANDS and not any(isinstance(f, _DeferredImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferredImport())


def main() -> None:
    """Run ``mfcli`` with the process's arguments."""
    if sys.argv[1:] == ["--version"]:
        from mfcli.version import __version__

        sys.stdout.write(f"mfcli {__version__}\n")
        sys.stdout.flush()
        # The same exit as every other command (run_cli ends the process without interpreter teardown).
        os._exit(0)
    # before anything imports numpy (mfcli.cli.app does not; the command modules do)
    set_account_blas_threads(sys.argv[1:])
    defer_numpy_tooling(sys.argv[1:])
    from mfcli.cli.app import main as app_main

    app_main()
