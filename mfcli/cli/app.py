"""The Typer application. Each subcommand lives in its own module under mfcli/cli/.

Subcommands are registered lazily: ``mfcli --help`` and ``mfcli --version`` import none of them,
and ``mfcli inspect`` imports only :mod:`mfcli.cli.inspect` (not the accounting stack with scipy
and dp-accounting). A subcommand is one row of :data:`COMMANDS`. Help is plain Click help.

Usage errors (a value the parser cannot read, an unknown or missing option or argument, and,
raised by the commands through :func:`mfcli.cli.common.usage_error`, an option that does not apply
to the chosen mode) print one ``error:`` line, for the parser's errors followed by a
``try '... --help'`` hint, and exit 2; see :meth:`LazyGroup.main`.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from mfcli.cli.common import fail, guarded, run_cli
from mfcli.cli.options import bound_integer_options
from mfcli.version import __version__

#: name -> (module under mfcli.cli, function, one-line help shown by ``mfcli --help``).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "optimize": ("optimize", "optimize", "Solve for the optimal factorization A = B C and write it as an artifact."),
    "compare": ("compare", "compare", "Tabulate error and sensitivity of baseline strategies against the optimum."),
    "compress": ("compress", "compress", "Compress the decoder to banded plus low rank for streaming noise."),
    "inspect": ("inspect", "inspect", "Show an artifact's stored numbers next to their recomputation."),
    "account": (
        "account", "account", "Epsilon of a strategy (single pass, DP-SGD, MMCC, shuffled tree) or the sigma for a target."
    ),
    "plan": ("plan", "plan", "Rank the mechanisms for a training setup at a privacy target; write the best with its sigma."),
}

#: Exit status of a usage error (bad or inapplicable options), as Click and POSIX tools use.
USAGE_EXIT = 2


def _click_exceptions() -> Any:
    # Recent Typer versions vendor Click as typer._click; older ones use Click itself.
    try:
        from typer._click import exceptions as exc
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click import exceptions as exc  # type: ignore[no-redef,import-not-found,unused-ignore]
    return exc


class LazyGroup(TyperGroup):
    """A Typer group that imports a subcommand's module only when that subcommand is needed, and
    renders usage errors as one plain line instead of Typer's boxed panel. Each subcommand it builds
    runs under :func:`mfcli.cli.common.guarded` and :func:`mfcli.cli.options.bound_integer_options`."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        module, attr, short = COMMANDS[cmd_name]
        if self._listing:
            # The group's help needs only names and one-line help: no import.
            return TyperCommand(name=cmd_name, short_help=short, help=short, rich_markup_mode=None)
        fn = getattr(importlib.import_module(f"mfcli.cli.{module}"), attr)
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
        # Every subcommand ends through guarded (one error: line and an exit status), set here once
        # rather than by each module, so a command added later is covered too.
        single.command(cmd_name, short_help=short)(guarded(fn))
        return bound_integer_options(typer.main.get_command(single))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        ce = _click_exceptions()
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ce.NoArgsIsHelpError as exc:
            print(exc.format_message(), file=sys.stderr)
            sys.exit(USAGE_EXIT)
        except ce.UsageError as exc:
            fail(exc.format_message(), code=USAGE_EXIT)  # one sanitized line, as every other error
            if not getattr(exc, "mfcli_refusal", False):
                path = exc.ctx.command_path if exc.ctx is not None else _command_path(args, prog_name)
                print(f"try '{path} --help'", file=sys.stderr)
            sys.exit(USAGE_EXIT)
        except ce.ClickException as exc:
            fail(exc.format_message(), code=exc.exit_code)
            sys.exit(exc.exit_code)
        except typer.Abort:
            print("error: aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _command_path(args: Sequence[str] | None, prog_name: str | None) -> str:
    """``mfcli <command>`` for a parser error raised without a context (an option missing its
    value: the parser fails before the subcommand's context exists), from the command line itself."""
    words = list(sys.argv[1:] if args is None else args)
    command = next((w for w in words if w in COMMANDS), None)
    return " ".join(p for p in (prog_name or "mfcli", command) if p)


app = typer.Typer(
    name="mfcli",
    cls=LazyGroup,
    help="Matrix-factorization mechanisms for private training: plan, optimize, compress, account, inspect, compare.",
    no_args_is_help=True,
    # Typer's --install-completion / --show-completion (bash, zsh, fish, PowerShell); completion
    # itself runs through Click's _MFCLI_COMPLETE protocol and the lazy group above.
    add_completion=True,
    # Plain Click help: Typer's rich panels import rich.markdown and rich.traceback (~0.15 s of
    # CPU on every --help) and box usage errors, which main() renders as one line instead.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        print(f"mfcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Show the version."),
) -> None:
    """mfcli: optimal matrix factorizations, baselines, compression and accounting for DP training."""


def main() -> None:
    run_cli(app)
