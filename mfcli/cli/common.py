"""Shared CLI plumbing: error handling, JSON envelopes, stderr logging and tables."""
from __future__ import annotations

import functools
import json
import math
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mfcli.errors import MfcliError, OutputExistsError

#: Version of the JSON objects printed by ``--json``; bump when a field changes meaning.
JSON_SCHEMA_VERSION = 2

F = TypeVar("F", bound=Callable[..., Any])


class _SafeConsole(Console):
    """A rich Console that passes every string it renders (prints, table titles and cells)
    through :func:`safe`, so no command can forget to: control characters from a file are shown
    escaped whatever the renderer. Rich markup written by mfcli still works; values from files
    should also go through :func:`safe_markup` so their brackets are not read as markup."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        return super().render_str(safe(text), **kwargs)


def stdout() -> Console:
    # Created per call so CliRunner's captured streams are honoured.
    return _SafeConsole(file=sys.stdout, soft_wrap=True, highlight=False)


def stderr() -> Console:
    return _SafeConsole(file=sys.stderr, soft_wrap=True, highlight=False)


#: Exit statuses (README.md, "Exit codes"). 2 is click's usage error; 128 + N for signal N.
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_BUG = 70  # EX_SOFTWARE: an internal error, printed with its traceback
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

# C0 and C1 control characters, DEL, and the Unicode bidirectional overrides and isolates that
# can reorder what a terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def safe(text: Any) -> str:
    """``text`` as a string a terminal shows literally: every control character (ESC, CR, BEL,
    newline, C1 controls such as CSI) and bidi override is replaced by its escape (``\\x1b``).

    Applied at the rendering boundary to every string that may come from a file (attributes,
    group names, workload parameters, paths, messages quoting them), so an artifact cannot clear
    the screen, rewrite a line or spoof a result. Rich markup is escaped separately
    (:func:`safe_markup`)."""
    return _UNSAFE.sub(lambda m: ascii(m.group())[1:-1], str(text))


def safe_markup(text: Any) -> str:
    """:func:`safe`, then rich markup escaped: for values placed in rich tables and prints, so
    ``[red]x[/red]`` read from a file is shown as written, not as red."""
    return escape(safe(text))


def log(message: str) -> None:
    """A progress or log line on stderr."""
    print(safe(message), file=sys.stderr, flush=True)


def fail(message: str, code: int = EXIT_ERROR) -> typer.Exit:
    """Print one error line on stderr and return the Exit to raise."""
    # Only real line breaks join with "; "; any other control character (a CR in a file name)
    # is shown escaped by safe().
    one_line = "; ".join(part.strip() for part in str(message).split("\n") if part.strip())
    print(f"error: {safe(one_line)}", file=sys.stderr, flush=True)
    _reported.append(code)
    return typer.Exit(code)


#: Exit codes whose error line :func:`fail` has printed in this process (the CLI entry reports a
#: signal that Typer turned into a bare exit status, and must not report it twice).
_reported: list[int] = []


_SIGINT_LINE = "interrupted (SIGINT); no partial file was left"
_SIGTERM_LINE = "terminated (SIGTERM); no partial file was left"


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that no ``except Exception``
    on the way up swallows it; :func:`guarded` turns it into exit status 143."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    # Python's default for SIGTERM is to die at once, skipping every cleanup (temporary files
    # were left behind). While a command runs, SIGTERM raises instead, like SIGINT does.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def guarded(fn: F) -> F:
    """Run a command and map how it ends to one ``error:`` line and an exit status.

    1: bad input, an invalid file, an I/O error (a full disk), a numerical failure of the input
    (LinAlgError, or a FloatingPointError raised on purpose by the numerics); 130: SIGINT;
    143: SIGTERM; 70: anything else, which is a bug in mfcli and is printed with its traceback.
    Writers leave no partial file in any of these cases (:func:`mfcli.io.artifact.atomic_path`).
    Applied to every subcommand where :class:`mfcli.cli.app.LazyGroup` registers it.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _sigterm_raises():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except OutputExistsError as exc:
            raise fail(f"{exc} (use --force to overwrite)") from None
        except MfcliError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise fail(_SIGINT_LINE, code=EXIT_SIGINT) from None
        except Terminated:
            raise fail(_SIGTERM_LINE, code=EXIT_SIGTERM) from None
        except MemoryError as exc:
            raise fail(out_of_memory_line(exc)) from None
        except EOFError:
            raise fail("unexpected end of file: an input file is empty or truncated") from None
        except (_linalg_error(), FloatingPointError) as exc:
            raise fail(
                f"numerical failure ({type(exc).__name__}: {exc}); the input is out of the range mfcli can handle"
            ) from None
        except ValueError as exc:  # after LinAlgError, a subclass of ValueError
            if not is_allocation_size_error(exc):
                raise _internal_error(exc) from None
            raise fail(out_of_memory_line(MemoryError(str(exc)))) from None
        except OSError as exc:
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            raise fail(f"I/O error{where}: {exc.strerror or exc}") from None
        except Exception as exc:
            raise _internal_error(exc) from None

    return wrapper  # type: ignore[return-value]


def _internal_error(exc: BaseException) -> typer.Exit:
    traceback.print_exception(exc, file=sys.stderr)
    return fail(f"internal error ({type(exc).__name__}); this is a bug in mfcli, please report it with the traceback "
                "above", code=EXIT_BUG)


#: What numpy says when an array's size cannot even be represented (np.empty of 10^20 elements,
#: np.arange past the index range): a request for more memory than any machine has, as a
#: MemoryError is for more than this one has.
_ALLOCATION_SIZE_ERRORS = ("Maximum allowed size exceeded", "array is too big", "Maximum allowed dimension exceeded")


def is_allocation_size_error(exc: BaseException) -> bool:
    """True for numpy's ValueError about an array too large to represent (see :data:`_ALLOCATION_SIZE_ERRORS`)."""
    return isinstance(exc, ValueError) and any(m in str(exc) for m in _ALLOCATION_SIZE_ERRORS)


def out_of_memory_line(exc: MemoryError) -> str:
    """The error line for a MemoryError: what could not be allocated, as the allocator said it
    (numpy: "Unable to allocate 7.45 GiB for an array with shape ... and data type float64"),
    without guessing which input caused it (it is not always n)."""
    what = str(exc).strip()
    return (f"out of memory: {what[:1].lower() + what[1:]}" if what else "out of memory") + (
        "; the computation this input asks for does not fit in this machine's memory")


def _late_signal(signum: int, frame: Any) -> None:
    # The command has ended and every file is committed: report the signal, exit with its code.
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sigint = signum == signal.SIGINT
    os.write(2, f"error: {_SIGINT_LINE if sigint else _SIGTERM_LINE}\n".encode())
    os._exit(EXIT_SIGINT if sigint else EXIT_SIGTERM)


def _exit_status(app: Callable[[], Any]) -> int:
    try:
        with _sigterm_raises():
            app()
    except KeyboardInterrupt:
        return fail(_SIGINT_LINE, code=EXIT_SIGINT).exit_code
    except Terminated:
        return fail(_SIGTERM_LINE, code=EXIT_SIGTERM).exit_code
    except SystemExit as exc:
        # Typer turns a KeyboardInterrupt outside the command (while options are parsed or a
        # subcommand's module is imported) into a bare exit status 130, printing nothing.
        if exc.code == EXIT_SIGINT and EXIT_SIGINT not in _reported:
            fail(_SIGINT_LINE, code=EXIT_SIGINT)
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return EXIT_ERROR
    return 0


def run_cli(app: Callable[[], Any]) -> None:
    """The CLI entry point: run ``app`` with SIGTERM raising :class:`Terminated`; give a signal
    that arrives outside any command (while options are parsed, before or after :func:`guarded`)
    the same one line and exit status as inside one; then end the process at once.

    Why ``os._exit``: tearing down the interpreter (numpy, scipy, h5py) takes a noticeable time,
    during which Python has already restored the default signal actions, so a Ctrl-C there killed
    the process silently. Every file is committed and closed by then, and stdout and stderr are
    flushed here."""
    code = _exit_status(app)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, _late_signal)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or EXIT_ERROR  # e.g. stdout closed early by a pipe reader
    os._exit(code)


def _linalg_error() -> type[Exception]:
    # numpy is imported lazily: --help and --version must not pay for it.
    import numpy as np

    return np.linalg.LinAlgError


def _jsonable(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


def envelope(command: str, payload: dict[str, Any], *, schema_version: int = JSON_SCHEMA_VERSION) -> dict:
    """One versioned JSON object: {"schema_version", "command", "mfcli_version", ...payload}.

    ``schema_version`` versions the layout that ``mfcli/schemas/<command>.json`` describes (a
    consumer checks it before reading fields; inspect and plan version theirs apart from the
    others'); ``mfcli_version`` says which release computed the numbers, which a stored result
    needs to be reproduced."""
    from mfcli.version import __version__

    return {"schema_version": schema_version, "command": command, "mfcli_version": __version__,
            **_jsonable(payload)}


def emit_json(command: str, payload: dict[str, Any], *, schema_version: int = JSON_SCHEMA_VERSION) -> None:
    """Print ``payload`` on stdout as ``command``'s versioned JSON object (:func:`envelope`), the
    one way a command's ``--json`` output is written."""
    # ensure_ascii escapes every control and non-ASCII character (\u001b), so file-supplied
    # strings reach the terminal inert; the parsed JSON keeps them exactly.
    obj = envelope(command, payload, schema_version=schema_version)
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=True) + "\n")
    sys.stdout.flush()


def key_value_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    """A two-column table; the title and every value are shown literally (:func:`safe_markup`)."""
    table = Table(title=safe_markup(title), show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows:
        table.add_row(safe_markup(k), safe_markup(fmt(v)))
    return table


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0 or (1e-3 <= abs(v) < 1e7):
            return f"{v:.6g}"
        return f"{v:.4e}"
    return str(v)


def command_line() -> str:
    return "mfcli " + " ".join(sys.argv[1:])


def usage_error(message: str) -> Exception:
    """The exception to raise for a command line that is wrong as a whole: options that conflict,
    or an option given where it does not apply. mfcli.cli.app renders it as one ``error:`` line
    (the message names the options, so no hint follows) with exit status 2; it is not an
    MfcliError, so ``guarded`` lets it through."""
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - typer before 0.22 uses Click itself
        from click import exceptions  # type: ignore[no-redef,import-not-found,unused-ignore]
    err = exceptions.UsageError(message)
    err.mfcli_refusal = True  # type: ignore[attr-defined]  # no hint line (mfcli.cli.app)
    return err


def refuse_unless(condition: bool, message: str) -> None:
    """Raise :func:`usage_error` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise usage_error(message)


def solver_stop(tol: float | None, max_iter: int | None) -> tuple[float, int]:
    """The dense solver's stopping rule from --tol and --max-iter: the library's defaults
    (:data:`mfcli.optimize.dense.DEFAULT_TOL`, ``DEFAULT_MAX_ITER``) where not given; a gap
    outside (0, 1) or fewer than one iteration is a usage error."""
    from mfcli.optimize.dense import DEFAULT_MAX_ITER, DEFAULT_TOL

    tol = DEFAULT_TOL if tol is None else tol
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    refuse_unless(0 < tol < 1, f"--tol must be in (0, 1), got {tol:g}")
    refuse_unless(max_iter >= 1, f"--max-iter must be at least 1, got {max_iter}")
    return tol, max_iter


def with_schema_suffix(path: Path, schema: Any, n: int) -> Path:
    """A default output path named for its participation schema: ``-epochs<K>`` for fixed-epoch,
    ``-minsep<B>-k<K>`` for min-separation (K participations at most), unchanged for single
    participation, so artifacts for different schemas never share a default name."""
    from mfcli.model.participation import FixedEpoch, MinSeparation

    if isinstance(schema, FixedEpoch):
        return path.with_name(f"{path.stem}-epochs{schema.epochs}.h5")
    if isinstance(schema, MinSeparation):
        return path.with_name(f"{path.stem}-minsep{schema.separation}-k{schema.participations(n)}.h5")
    return path
