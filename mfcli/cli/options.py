"""How the command line is read: the parse-time range checks (:func:`in_range`), the integer bound
every option obeys (:func:`bound_integer_options`), an argument that names an artifact
(:func:`artifact_argument`), and the option groups (:func:`option_group`) that several commands
share, declared once as Annotated types so that flags, defaults, help and validation cannot drift
apart between commands: the workload, the participation schema and the two together
(:class:`ProblemOptions`)."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, TypeVar

import typer

from mfcli.cli.common import refuse_unless, usage_error
from mfcli.errors import MfcliError

F = TypeVar("F", bound=Callable[..., Any])

# ---------------------------------------------------------------------------------------------
# Range checks and the workload options (optimize, compare).

def positive_n(value: int | None) -> int | None:
    """--n out of range is a usage error (exit 2, one line), like an unreadable --n."""
    refuse_unless(value is None or value >= 1, f"--n must be at least 1, got {value}")
    return value


NOpt = Annotated[int | None, typer.Option("--n", "-n", callback=positive_n, help="Number of steps (rows of A).")]


def in_range(check: Callable[[Any], Any]) -> Callable[..., Any]:
    """An option callback that refuses a value outside the range the option alone allows as a
    usage error (exit 2, one line naming the option by its long flag), while the command line is
    parsed, like --n 0. ``check`` is the library's own validator of that one value (it raises
    MfcliError), so the range is stated once; ranges that depend on n or on another option stay
    with the library (exit 1). None (not given) passes; a repeated option's values are checked one
    by one. The flag is read from the option the callback is attached to, so it is never written
    twice."""

    def callback(param: typer.CallbackParam, value: Any) -> Any:
        for v in value if isinstance(value, list) else () if value is None else (value,):
            try:
                check(v)
            except MfcliError as err:
                raise usage_error(f"{_flag(param)}: {err}") from None
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
    """The parse-time rules for every option and argument of ``command`` (a Click command), applied
    to every subcommand by :class:`mfcli.cli.app.LazyGroup`, so an option added later is covered too:

    * an integer whose magnitude exceeds :data:`mfcli.util.validation.MAX_COUNT` (2^53) is a usage
      error (exit 2, one line naming the flag, the number abbreviated), checked before the option's
      own callback and before any command code, so no later float(n) can overflow;
    * an empty path (``-o ''``) is a usage error saying so: the parser reads it as ``Path('')``,
      which is the current directory, and every later message would name ``.`` instead
      (:func:`_refuse_empty_paths`)."""
    for param in getattr(command, "params", ()):
        param.callback = _bounded_callback(param.callback)
        _refuse_empty_paths(param)
    return command


def _refuse_empty_paths(param: Any) -> None:
    """Make ``param`` refuse an empty string given for a path (its value, or one of a repeated
    option's values, converts to a :class:`pathlib.PurePath`) as a usage error. The raw string is
    seen only before conversion (``Path('')`` and ``Path('.')`` are equal), so the parameter's own
    ``process_value`` is wrapped; a string option (``--lr``) is left to its own callback."""
    original = param.process_value

    def process_value(ctx: Any, value: Any) -> Any:
        result = original(ctx, value)
        raw = list(value) if isinstance(value, (list, tuple)) else [value]
        converted = list(result) if isinstance(result, (list, tuple)) else [result]
        if any(r == "" and isinstance(c, PurePath) for r, c in zip(raw, converted, strict=False)):
            name = _flag(param) if getattr(param, "param_type_name", "") == "option" else str(param.name).upper()
            raise usage_error(f"{name}: the path is empty; give a file name")
        return result

    param.process_value = process_value


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
BETA_RANGE = in_range(library_check("mfcli.model.workloads", "check_beta"))
BANDS_RANGE = in_range(library_check("mfcli.strategies.toeplitz", "check_bands"))
BUFFERS_RANGE = in_range(library_check("mfcli.strategies.blt", "check_buffers"))
SIGMA_RANGE = in_range(library_check("mfcli.accounting.single_pass", "check_sigma"))
DELTA_RANGE = in_range(library_check("mfcli.accounting.single_pass", "check_delta"))
SAMPLING_RANGE = in_range(library_check("mfcli.accounting.single_pass", "check_sampling"))
EPSILON_RANGE = in_range(library_check("mfcli.util.validation", "positive_number", "the target epsilon"))
LR_CHECK = in_range(library_check("mfcli.model.workloads", "check_lr"))
LR_FACTOR_RANGE = in_range(library_check("mfcli.model.workloads", "check_lr_factor"))
LR_FINAL_RANGE = in_range(library_check("mfcli.model.workloads", "check_lr_final"))
LR_LAST_RANGE = in_range(library_check("mfcli.model.workloads", "check_lr_last"))
WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="prefix, momentum or custom.")]

# Options that apply to one mode only default to None (not given), so that giving one where it
# does not apply is refused even when its value equals the default (see WorkloadOptions.build_kwargs).
BetaOpt = Annotated[
    float | None,
    typer.Option("--beta", callback=BETA_RANGE, help="Momentum coefficient in [0, 1), momentum workload only (default 0.9)."),
]
LrOpt = Annotated[
    str | None,
    typer.Option(
        "--lr", callback=LR_CHECK,
        help="Learning-rate schedule folded into A: constant (default), step-decay, cooldown, or a .npy/.csv "
        "FILE of n rates. Not for the custom workload.",
    ),
]
LrFactorOpt = Annotated[
    float | None, typer.Option("--lr-factor", callback=LR_FACTOR_RANGE,
                               help="step-decay only: multiplier (> 0) for the decayed steps (default 0.15).")
]
LrFinalOpt = Annotated[
    float | None, typer.Option("--lr-final", callback=LR_FINAL_RANGE,
                               help="cooldown only: final learning rate (> 0), linear from 1.0 (default 0.05).")
]
LrLastOpt = Annotated[
    int | None, typer.Option("--lr-last", callback=LR_LAST_RANGE,
                             help="step-decay or cooldown: steps the decay/cooldown covers (default n/4).")
]
MatrixOpt = Annotated[Path | None, typer.Option("--matrix", help="custom workload only: .npy, .csv or mfcli artifact.")]


@dataclass(frozen=True)
class WorkloadOptions:
    """The workload as the command line names it (``--workload``, its parameters and its number of
    steps ``--n``), one option group for every command that builds a workload (:func:`option_group`)."""

    workload: WorkloadOpt = "prefix"
    beta: BetaOpt = None
    lr: LrOpt = None
    lr_factor: LrFactorOpt = None
    lr_final: LrFinalOpt = None
    lr_last: LrLastOpt = None
    matrix: MatrixOpt = None
    n: NOpt = None

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


# ---------------------------------------------------------------------------------------------
# Arguments that name an artifact.

def artifact_argument(path: Path) -> Path:
    """An artifact named on the command line: the file ``path``, or, when no such file exists and
    ``path`` is the name of a shipped artifact (``prefix-n256``, ``momentum-n256``), that
    artifact's installed path (:func:`mfcli.io.artifact.shipped_artifact`)."""
    from mfcli.io.artifact import SHIPPED, shipped_artifact

    if not path.exists() and str(path) in SHIPPED:
        return shipped_artifact(str(path))
    return path


def refuse_structured(path: Path, use: str) -> None:
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
    typer.Option("--epochs", callback=in_range(_epochs),
                 help="Fixed-epoch participation: K epochs of n/K steps in the same data order every "
                 "epoch (default: single participation). Reshuffled between epochs: use --min-sep 1 "
                 "--max-participations K instead."),
]
MinSepOpt = Annotated[
    int | None,
    typer.Option("--min-sep", callback=in_range(_min_sep),
                 help="Min-separation participation: any two participations at least B steps apart."),
]
MaxParticipationsOpt = Annotated[
    int | None,
    typer.Option("--max-participations", callback=in_range(_max_participations),
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


@dataclass(frozen=True)
class ProblemOptions(ParticipationOptions, WorkloadOptions):
    """The problem a factorization is made for: the workload of n steps (:class:`WorkloadOptions`)
    under a participation schema (:class:`ParticipationOptions`), one option group for the commands
    that solve or compare factorizations for it (optimize, compare). The options are listed in
    that order: the workload's, then the schema's."""


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


