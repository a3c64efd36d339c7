"""Shared CLI plumbing: error handling, JSON envelopes, stderr logging and tables."""
from __future__ import annotations

import functools
import json
import math
import sys
from typing import Any, Callable, TypeVar

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from mfcli.errors import MfcliError

#: Version of the JSON objects printed by ``--json``; bump when a field changes meaning.
JSON_SCHEMA_VERSION = 1

F = TypeVar("F", bound=Callable[..., Any])


def stdout() -> Console:
    # Created per call so CliRunner's captured streams are honoured.
    return Console(file=sys.stdout, soft_wrap=True, highlight=False)


def stderr() -> Console:
    return Console(file=sys.stderr, soft_wrap=True, highlight=False)


def log(message: str) -> None:
    """A progress or log line on stderr."""
    print(message, file=sys.stderr, flush=True)


def fail(message: str, code: int = 1) -> "typer.Exit":
    """Print one error line on stderr and return the Exit to raise."""
    one_line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"error: {one_line}", file=sys.stderr, flush=True)
    return typer.Exit(code)


def guarded(fn: F) -> F:
    """Turn user errors, I/O errors and Ctrl-C into one error line and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except MfcliError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise fail("interrupted; nothing was written", code=130) from None
        except MemoryError:
            raise fail("out of memory; try a smaller n") from None
        except EOFError:
            raise fail("unexpected end of file: an input file is empty or truncated") from None
        except (np.linalg.LinAlgError, ArithmeticError) as exc:
            raise fail(f"numerical failure ({type(exc).__name__}: {exc}); the input is out of the range mfcli can handle") from None
        except OSError as exc:
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            raise fail(f"I/O error{where}: {exc.strerror or exc}") from None

    return wrapper  # type: ignore[return-value]


def _jsonable(obj: Any) -> Any:
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
    """One versioned JSON object: {"schema_version", "command", ...payload}."""
    return {"schema_version": JSON_SCHEMA_VERSION, "command": command, **_jsonable(payload)}


def emit_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def key_value_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows:
        table.add_row(k, fmt(v))
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
from typing import Annotated, Optional  # noqa: E402

WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="prefix, momentum or custom.")]
NOpt = Annotated[Optional[int], typer.Option("--n", "-n", help="Number of steps (rows of A).")]
# Options that apply to one mode only default to None (not given), so that giving one where it
# does not apply is refused even when its value equals the default (see workload_kwargs).
BetaOpt = Annotated[
    Optional[float], typer.Option("--beta", help="Momentum coefficient in [0, 1), momentum workload only (default 0.9).")
]
LrOpt = Annotated[
    Optional[str],
    typer.Option(
        "--lr",
        help="Learning-rate schedule folded into A: constant (default), step-decay, cooldown, or a .npy/.csv "
        "FILE of n rates. Not for the custom workload.",
    ),
]
LrFactorOpt = Annotated[
    Optional[float], typer.Option("--lr-factor", help="step-decay only: multiplier for the decayed steps (default 0.15).")
]
LrFinalOpt = Annotated[
    Optional[float], typer.Option("--lr-final", help="cooldown only: final learning rate, linear from 1.0 (default 0.05).")
]
LrLastOpt = Annotated[
    Optional[int], typer.Option("--lr-last", help="step-decay or cooldown: steps the decay/cooldown covers (default n/4).")
]
MatrixOpt = Annotated[Optional[_Path], typer.Option("--matrix", help="custom workload only: .npy, .csv or mfcli artifact.")]


def usage_error(message: str) -> Exception:
    """The exception to raise for a command line that is wrong as a whole: options that conflict,
    or an option given where it does not apply. mfcli.cli.app renders it as one ``error:`` line
    (the message names the options, so no hint follows) with exit status 2; it is not an
    MfcliError, so ``guarded`` lets it through."""
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - typer before 0.22 uses Click itself
        from click import exceptions  # type: ignore[no-redef,import-not-found]
    err = exceptions.UsageError(message)
    err.mfcli_refusal = True  # type: ignore[attr-defined]  # no hint line (mfcli.cli.app)
    return err


def refuse_unless(condition: bool, message: str) -> None:
    """Raise :func:`usage_error` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise usage_error(message)


def workload_kwargs(
    workload: str,
    *,
    beta: float | None,
    lr: str | None,
    lr_factor: float | None,
    lr_final: float | None,
    lr_last: int | None,
    matrix: _Path | None,
) -> dict[str, Any]:
    """Refuse workload options that do not apply to ``workload`` and the schedule, and return the
    keyword arguments for :func:`mfcli.workloads.build_workload` (only those given: the library
    keeps the defaults)."""
    refuse_unless(beta is None or workload == "momentum", f"--beta applies to --workload momentum only, not {workload}")
    refuse_unless(matrix is None or workload == "custom", f"--matrix applies to --workload custom only, not {workload}")
    refuse_unless(lr is None or workload != "custom", "--lr does not apply to --workload custom (its matrix is used as given)")
    schedule = lr if lr is not None else "constant"
    refuse_unless(lr_factor is None or schedule == "step-decay", f"--lr-factor applies to --lr step-decay only, not {schedule}")
    refuse_unless(lr_final is None or schedule == "cooldown", f"--lr-final applies to --lr cooldown only, not {schedule}")
    refuse_unless(
        lr_last is None or schedule in ("step-decay", "cooldown"),
        f"--lr-last applies to --lr step-decay or cooldown only, not {schedule}",
    )
    given = {"beta": beta, "lr": lr, "lr_factor": lr_factor, "lr_final": lr_final, "lr_last": lr_last, "matrix_file": matrix}
    return {k: v for k, v in given.items() if v is not None}


def artifact_argument(path: _Path) -> _Path:
    """An artifact named on the command line: the file ``path``, or, when no such file exists and
    ``path`` is the name of a shipped artifact (``prefix-n256``, ``momentum-n256``), that
    artifact's installed path (:func:`mfcli.artifact.shipped_artifact`)."""
    from mfcli.artifact import SHIPPED, shipped_artifact

    if not path.exists() and str(path) in SHIPPED:
        return shipped_artifact(str(path))
    return path
