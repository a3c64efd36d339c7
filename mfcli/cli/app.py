"""The Typer application. Each subcommand lives in its own module under mfcli/cli/."""
from __future__ import annotations

import typer

from mfcli import __version__
from mfcli.cli import account as _account
from mfcli.cli import compare as _compare
from mfcli.cli import compress as _compress
from mfcli.cli import inspect as _inspect
from mfcli.cli import optimize as _optimize

app = typer.Typer(
    name="mfcli",
    help="Matrix-factorization mechanisms for private training: optimize, compress, account, inspect, compare.",
    no_args_is_help=True,
    add_completion=False,
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


app.command("optimize")(_optimize.optimize)
# Further subcommands register below, one line each.
app.command("compare")(_compare.compare)
app.command("compress")(_compress.compress)
app.command("inspect")(_inspect.inspect)
app.command("account")(_account.account)


def main() -> None:
    from mfcli.cli.common import run_cli

    run_cli(app)
