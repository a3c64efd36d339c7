"""The console script's entry point: ``mfcli --version`` is answered before the command framework loads.

Why a module of its own: importing :mod:`mfcli.cli.app` loads Typer, Click and rich (about 0.1 s
of CPU), which a version query does not need. Every other command line goes to
:func:`mfcli.cli.app.main` unchanged, so ``mfcli --version`` prints what the Typer option prints
(``tests/test_cli_entry.py`` holds the two to the same output).
"""
from __future__ import annotations

import os
import sys


def main() -> None:
    """Run ``mfcli`` with the process's arguments."""
    if sys.argv[1:] == ["--version"]:
        from mfcli.version import __version__

        sys.stdout.write(f"mfcli {__version__}\n")
        sys.stdout.flush()
        # The same exit as every other command (run_cli ends the process without interpreter teardown).
        os._exit(0)
    from mfcli.cli.app import main as app_main

    app_main()
