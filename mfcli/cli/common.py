"""Shared CLI plumbing: error handling, JSON envelopes, stderr logging and tables."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import re
import signal
import sys
import threading
import traceback
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
        except OSError as exc:
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            raise fail(f"I/O error{where}: {exc.strerror or exc}") from None
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            raise fail(
                f"internal error ({type(exc).__name__}); this is a bug in mfcli, please report it with the traceback above",
                code=EXIT_BUG,
            ) from None

    return wrapper  # type: ignore[return-value]


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


def envelope(command: str, **payload: Any) -> dict:
    """One versioned JSON object: {"schema_version", "command", "mfcli_version", ...payload}.

    ``schema_version`` versions the layout that ``mfcli/schemas/<command>.json`` describes (a
    consumer checks it before reading fields); ``mfcli_version`` says which release computed the
    numbers, which a stored result needs to be reproduced."""
    from mfcli.version import __version__

    return {"schema_version": JSON_SCHEMA_VERSION, "command": command, "mfcli_version": __version__,
            **_jsonable(payload)}


def emit_json(obj: dict) -> None:
    # ensure_ascii escapes every control and non-ASCII character (\u001b), so file-supplied
    # strings reach the terminal inert; the parsed JSON keeps them exactly.
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


# ---------------------------------------------------------------------------------------------
# Workload options shared by every subcommand that builds a workload (optimize, compare).
# Declared once as Annotated types so the flags, defaults and help cannot drift apart.

from pathlib import Path as _Path  # noqa: E402
from typing import Annotated  # noqa: E402

WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="prefix, momentum or custom.")]
def positive_n(value: int | None) -> int | None:
    """--n out of range is a usage error (exit 2, one line), like an unreadable --n."""
    refuse_unless(value is None or value >= 1, f"--n must be at least 1, got {value}")
    return value


NOpt = Annotated[int | None, typer.Option("--n", "-n", callback=positive_n, help="Number of steps (rows of A).")]


def in_range(flag: str, check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An option callback that refuses a value outside the range the option alone allows as a
    usage error (exit 2, one line naming ``flag``), while the command line is parsed, like --n 0.
    ``check`` is the library's own validator of that one value (it raises MfcliError), so the
    range is stated once; ranges that depend on n or on another option stay with the library
    (exit 1). None (not given) passes; a repeated option's values are checked one by one."""

    def callback(value: Any) -> Any:
        for v in value if isinstance(value, list) else () if value is None else (value,):
            try:
                check(v)
            except MfcliError as err:
                raise usage_error(f"{flag}: {err}") from None
        return value

    return callback


def library_check(module: str, function: str, /, *args: Any, **kwargs: Any) -> Callable[[Any], None]:
    """The library validator ``module.function``, called as ``function(value, *args, **kwargs)``, for
    :func:`in_range`. ``module`` is imported only when an option is given, so parsing (and
    ``--help``) loads no numpy or scipy (tests/test_packaging.py)."""

    def check(value: Any) -> None:
        import importlib

        getattr(importlib.import_module(module), function)(value, *args, **kwargs)

    return check


def _flag(param: Any) -> str:
    opts = list(getattr(param, "opts", ()) or ())
    longs = [o for o in opts if o.startswith("--")]
    return (longs or opts or [str(getattr(param, "name", "value"))])[0]


def bound_integer_options(command: Any) -> Any:
    """The one parse-time rule for every integer option and argument of ``command`` (a Click
    command): a value whose magnitude exceeds :data:`mfcli.util.validation.MAX_COUNT` (2^53) is a usage
    error (exit 2, one line naming the flag, the number abbreviated), checked before the option's
    own callback and before any command code, so no later float(n) can overflow. Applied to every
    subcommand by :class:`mfcli.cli.app.LazyGroup`, so an option added later is covered too."""
    for param in getattr(command, "params", ()):
        param.callback = _bounded_callback(param.callback)
    return command


def _bounded_callback(original: Callable[..., Any] | None) -> Callable[..., Any]:
    def callback(ctx: Any, param: Any, value: Any) -> Any:
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 53:
                from mfcli.util.validation import MAX_COUNT, shown_integer  # no numpy: parsing stays light

                if abs(v) > MAX_COUNT:
                    raise usage_error(f"{_flag(param)}: {shown_integer(v)} is too {'large' if v > 0 else 'small'}; "
                                      f"an integer option takes values of magnitude at most 2^53 = {MAX_COUNT}")
        return value if original is None else original(ctx, param, value)

    return callback


#: Callbacks for the options whose range needs no other option (see :func:`in_range`).
BETA_RANGE = in_range("--beta", library_check("mfcli.model.workloads", "check_beta"))
BANDS_RANGE = in_range("--bands", library_check("mfcli.strategies.toeplitz", "check_bands"))
BUFFERS_RANGE = in_range("--buffers", library_check("mfcli.strategies.blt", "check_buffers"))
SIGMA_RANGE = in_range("--sigma", library_check("mfcli.accounting.single_pass", "check_sigma"))
DELTA_RANGE = in_range("--delta", library_check("mfcli.accounting.single_pass", "check_delta"))
SAMPLING_RANGE = in_range("--sampling", library_check("mfcli.accounting.single_pass", "check_sampling"))
EPSILON_RANGE = in_range("--epsilon", library_check("mfcli.util.validation", "positive_number", "the target epsilon"))
# Options that apply to one mode only default to None (not given), so that giving one where it
# does not apply is refused even when its value equals the default (see workload_kwargs).
BetaOpt = Annotated[
    float | None,
    typer.Option("--beta", callback=BETA_RANGE, help="Momentum coefficient in [0, 1), momentum workload only (default 0.9)."),
]
LrOpt = Annotated[
    str | None,
    typer.Option(
        "--lr",
        help="Learning-rate schedule folded into A: constant (default), step-decay, cooldown, or a .npy/.csv "
        "FILE of n rates. Not for the custom workload.",
    ),
]
LrFactorOpt = Annotated[
    float | None, typer.Option("--lr-factor", help="step-decay only: multiplier for the decayed steps (default 0.15).")
]
LrFinalOpt = Annotated[
    float | None, typer.Option("--lr-final", help="cooldown only: final learning rate, linear from 1.0 (default 0.05).")
]
LrLastOpt = Annotated[
    int | None, typer.Option("--lr-last", help="step-decay or cooldown: steps the decay/cooldown covers (default n/4).")
]
MatrixOpt = Annotated[_Path | None, typer.Option("--matrix", help="custom workload only: .npy, .csv or mfcli artifact.")]


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


@dataclass(frozen=True)
class WorkloadOptions:
    """The workload as the command line names it (``--workload`` and its parameters), one option
    group for every command that builds a workload (:func:`option_group`)."""

    workload: WorkloadOpt = "prefix"
    beta: BetaOpt = None
    lr: LrOpt = None
    lr_factor: LrFactorOpt = None
    lr_final: LrFinalOpt = None
    lr_last: LrLastOpt = None
    matrix: MatrixOpt = None

    def build_kwargs(self) -> dict[str, Any]:
        """Refuse workload options that do not apply to the workload and the schedule, and return the
        keyword arguments for :func:`mfcli.model.workloads.build_workload` (only those given: the
        library keeps the defaults)."""
        from mfcli.model.workloads import WORKLOAD_NAMES

        workload, beta, lr, matrix = self.workload, self.beta, self.lr, self.matrix
        lr_factor, lr_final, lr_last = self.lr_factor, self.lr_final, self.lr_last

        # a value outside an option's choices is a usage error (exit 2), as typer treats an unreadable one
        refuse_unless(workload in WORKLOAD_NAMES, f"--workload must be one of {', '.join(WORKLOAD_NAMES)}, not {workload!r}")
        refuse_unless(beta is None or workload == "momentum", f"--beta applies to --workload momentum only, not {workload}")
        refuse_unless(matrix is None or workload == "custom", f"--matrix applies to --workload custom only, not {workload}")
        refuse_unless(matrix is not None or workload != "custom", "--workload custom needs --matrix FILE")
        refuse_unless(lr is None or workload != "custom",
                      "--lr does not apply to --workload custom (its matrix is used as given)")
        schedule = lr if lr is not None else "constant"
        refuse_unless(lr_factor is None or schedule == "step-decay",
                      f"--lr-factor applies to --lr step-decay only, not {schedule}")
        refuse_unless(lr_final is None or schedule == "cooldown", f"--lr-final applies to --lr cooldown only, not {schedule}")
        refuse_unless(
            lr_last is None or schedule in ("step-decay", "cooldown"),
            f"--lr-last applies to --lr step-decay or cooldown only, not {schedule}",
        )
        given: dict[str, Any] = {"beta": beta, "lr": lr, "lr_factor": lr_factor, "lr_final": lr_final, "lr_last": lr_last,
                                 "matrix_file": matrix}
        if matrix is not None and matrix.suffix.lower() in (".h5", ".hdf5") and matrix.is_file() \
                and matrix.stat().st_size > 0:
            # an mfcli artifact: read here, through the one artifact reader (the workload layer opens none)
            from mfcli.io.artifact import load_workload_matrix

            given["matrix"] = load_workload_matrix(matrix)
        return {k: v for k, v in given.items() if v is not None}


def artifact_argument(path: _Path) -> _Path:
    """An artifact named on the command line: the file ``path``, or, when no such file exists and
    ``path`` is the name of a shipped artifact (``prefix-n256``, ``momentum-n256``), that
    artifact's installed path (:func:`mfcli.io.artifact.shipped_artifact`)."""
    from mfcli.io.artifact import SHIPPED, shipped_artifact

    if not path.exists() and str(path) in SHIPPED:
        return shipped_artifact(str(path))
    return path


def refuse_structured(path: _Path, use: str) -> None:
    """Refuse, in CLI terms, a structured artifact (banded Toeplitz, BLT: no n x n matrices) where
    ``use`` needs a dense one; the library's own refusal names a Python reader instead."""
    from mfcli.io.artifact import is_structured_file

    if is_structured_file(path):
        raise MfcliError(f"{path} holds a structured strategy (banded Toeplitz or BLT, no dense matrices); {use} "
                         "needs a dense artifact (mfcli optimize without --strategy, or mfcli compare --save-strategy); "
                         "mfcli inspect, account and the noise streams read structured ones")


# ---------------------------------------------------------------------------------------------
# Participation options (docs/concepts.md, "Participation and sensitivity"); default single.

def _epochs(v: int) -> None:
    from mfcli.model.participation import FixedEpoch

    FixedEpoch(epochs=v)


def _min_sep(v: int) -> None:
    from mfcli.model.participation import MinSeparation

    MinSeparation(separation=v)


def _max_participations(v: int) -> None:
    from mfcli.model.participation import MinSeparation

    MinSeparation(separation=1, max_participations=v)


EpochsOpt = Annotated[
    int | None,
    typer.Option("--epochs", callback=in_range("--epochs", _epochs),
                 help="Fixed-epoch participation: K epochs of n/K steps in the same data order every "
                 "epoch (default: single participation). Reshuffled between epochs: use --min-sep 1 "
                 "--max-participations K instead."),
]
MinSepOpt = Annotated[
    int | None,
    typer.Option("--min-sep", callback=in_range("--min-sep", _min_sep),
                 help="Min-separation participation: any two participations at least B steps apart."),
]
MaxParticipationsOpt = Annotated[
    int | None,
    typer.Option("--max-participations", callback=in_range("--max-participations", _max_participations),
                 help="--min-sep only: at most K participations (default: as many as fit)."),
]


@dataclass(frozen=True)
class ParticipationOptions:
    """The participation schema as the command line names it (``--epochs``, ``--min-sep``,
    ``--max-participations``), one option group for every command that takes one (:func:`option_group`)."""

    epochs: EpochsOpt = None
    min_sep: MinSepOpt = None
    max_participations: MaxParticipationsOpt = None

    def schema(self) -> Any:
        """The participation schema the options name (single participation when none is given);
        conflicting or inapplicable combinations are refused as usage errors."""
        from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation

        refuse_unless(self.epochs is None or self.min_sep is None,
                      "--epochs and --min-sep are different participation schemas; give one")
        refuse_unless(self.max_participations is None or self.min_sep is not None,
                      "--max-participations applies to --min-sep only")
        if self.epochs is not None:
            return FixedEpoch(epochs=self.epochs)
        if self.min_sep is not None:
            return MinSeparation(separation=self.min_sep, max_participations=self.max_participations)
        return SingleParticipation()

    def requested(self) -> Any:
        """The schema requested of a command that reads an artifact, or None when neither --epochs
        nor --min-sep is given (the artifact's own schema applies); what :meth:`schema` refuses is
        refused here too, a lone --max-participations included."""
        schema = self.schema()
        return schema if self.given else None

    @property
    def given(self) -> bool:
        """Whether --epochs or --min-sep names a schema."""
        return (self.epochs, self.min_sep) != (None, None)


def option_group(group: type[Any], *, into: str) -> Callable[[F], F]:
    """Give a command the options of ``group`` in place of its keyword-only parameter ``into``, and
    call it with ``into=group(...)`` built from them.

    ``group`` is a dataclass whose fields are Annotated Typer options with defaults, so a set of
    options that several commands share is declared once (flags, defaults, help, validation) and
    reaches each command as one object. Typer reads the rewritten signature: ``--help`` lists the
    options where ``into`` stands."""
    hints = typing.get_type_hints(group, include_extras=True)
    members = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
               for f in dataclasses.fields(group)]
    names = [p.name for p in members]

    def decorate(command: F) -> F:
        signature = inspect.signature(command)
        command_hints = typing.get_type_hints(command, include_extras=True)
        if signature.parameters[into].kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"{command.__name__}: {into} must be a keyword-only parameter to hold {group.__name__}")
        params: list[inspect.Parameter] = []
        for p in signature.parameters.values():
            params.extend(members if p.name == into else [p.replace(annotation=command_hints.get(p.name, p.annotation))])

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            kwargs[into] = group(**{name: kwargs.pop(name) for name in names if name in kwargs})
            return command(*args, **kwargs)

        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        if "return" in command_hints:
            run.__annotations__["return"] = command_hints["return"]
        return typing.cast(F, run)

    return decorate


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


def with_schema_suffix(path: _Path, schema: Any, n: int) -> _Path:
    """A default output path named for its participation schema: ``-epochs<K>`` for fixed-epoch,
    ``-minsep<B>-k<K>`` for min-separation (K participations at most), unchanged for single
    participation, so artifacts for different schemas never share a default name."""
    from mfcli.model.participation import FixedEpoch, MinSeparation

    if isinstance(schema, FixedEpoch):
        return path.with_name(f"{path.stem}-epochs{schema.epochs}.h5")
    if isinstance(schema, MinSeparation):
        return path.with_name(f"{path.stem}-minsep{schema.separation}-k{schema.participations(n)}.h5")
    return path
