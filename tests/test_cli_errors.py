"""How a command ends, mapped by ``guarded`` to one ``error:`` line and an exit status: bad input
1, usage 2, a bug 70 (with its traceback), SIGINT 130, SIGTERM 143. And the one sanitizer that
every rendered file-supplied string goes through."""
from __future__ import annotations

import io

import numpy as np
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from mfcli.cli.common import Terminated, guarded, safe, safe_markup
from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import OutputExistsError

runner = CliRunner()


def _app(exc: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @guarded
    def cmd() -> None:
        raise exc

    return app


@pytest.mark.parametrize("exc,code,line", [
    (MfcliError("bad input"), 1, "error: bad input"),
    (ArtifactError("x.h5: checksum mismatch"), 1, "error: x.h5: checksum mismatch"),
    (OutputExistsError("x.h5 already exists"), 1, "error: x.h5 already exists (use --force to overwrite)"),
    (np.linalg.LinAlgError("singular"), 1,
     "error: numerical failure (LinAlgError: singular); the input is out of the range mfcli can handle"),
    (FloatingPointError("overflow"), 1,
     "error: numerical failure (FloatingPointError: overflow); the input is out of the range mfcli can handle"),
    (FileNotFoundError(2, "No such file or directory", "in.npy"), 1, "error: I/O error in.npy: No such file or directory"),
    (MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000000000,) and data type float64"), 1,
     "error: out of memory: unable to allocate 7.45 GiB for an array with shape (1000000000,) and data type float64; "
     "the computation this input asks for does not fit in this machine's memory"),
    (MemoryError(), 1, "error: out of memory; the computation this input asks for does not fit in this machine's memory"),
    (KeyboardInterrupt(), 130, "error: interrupted (SIGINT); no partial file was left"),
    (Terminated(), 143, "error: terminated (SIGTERM); no partial file was left"),
])
def test_expected_endings_one_line(exc, code, line):
    r = runner.invoke(_app(exc), [])
    assert r.exit_code == code
    assert r.stderr.splitlines() == [line]


@pytest.mark.parametrize("exc", [ZeroDivisionError("division by zero"), OverflowError("x"), KeyError("k"),
                                 TypeError("t"), AttributeError("a")])
def test_a_bug_shows_its_traceback_and_exits_70(exc):
    r = runner.invoke(_app(exc), [])
    assert r.exit_code == 70
    assert "Traceback (most recent call last)" in r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"error: internal error ({type(exc).__name__}); this is a bug in mfcli")
    assert "out of the range" not in r.stderr


def test_usage_errors_pass_through_as_2():
    r = runner.invoke(_app(typer.BadParameter("nope")), [])
    assert r.exit_code == 2


@pytest.mark.parametrize("raw,shown", [
    ("\x1b[2Jclear", "\\x1b[2Jclear"),
    ("a\rb", "a\\rb"),
    ("bell\x07", "bell\\x07"),
    ("line\nbreak", "line\\nbreak"),
    ("csi\x9b31m", "csi\\x9b31m"),
    ("del\x7f", "del\\x7f"),
    ("bidi\u202eevil", "bidi\\u202eevil"),
    ("plain [red]x[/red] é", "plain [red]x[/red] é"),
])
def test_safe_shows_controls_literally(raw, shown):
    assert safe(raw) == shown


def test_safe_markup_escapes_rich_markup():
    # A real terminal console, as the CLI's (highlight off): the markup is printed as text, not
    # turned into a colour, and the file's ESC arrives escaped.
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system="truecolor", highlight=False).print(
        safe_markup("[red]x[/red]\x1b[2J"))
    text = buf.getvalue()
    assert "[red]x[/red]\\x1b[2J" in text and "\x1b[2J" not in text and "\x1b[31m" not in text


def test_every_console_string_is_sanitized():
    """Through the CLI's console, a string printed directly, a table title and a table cell are
    all shown with controls escaped, even by a renderer that forgot to call safe()."""
    from rich.table import Table

    from mfcli.cli import common

    buf = io.StringIO()
    orig = common.sys.stdout
    try:
        common.sys.stdout = buf
        out = common.stdout()
        t = Table(title="title \x1b[2J")
        t.add_column("c")
        t.add_row("cell \r\x07")
        out.print("direct \x1b]0;x\x07")
        out.print(t)
    finally:
        common.sys.stdout = orig
    text = buf.getvalue()
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "title \\x1b[2J" in text and "cell \\r\\x07" in text and "direct \\x1b]0;x\\x07" in text
