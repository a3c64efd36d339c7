"""Option groups (mfcli.cli.options.option_group): options several commands share are declared once
and reach each command as one object; Typer sees them as ordinary options."""
from __future__ import annotations

import importlib
from typing import Any

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from mfcli.cli.app import COMMANDS
from mfcli.cli.options import ParticipationOptions, ProblemOptions, WorkloadOptions, option_group

PARTICIPATION_FLAGS = {"--epochs", "--min-sep", "--max-participations"}
WORKLOAD_FLAGS = {"--workload", "--beta", "--lr", "--lr-factor", "--lr-final", "--lr-last", "--matrix", "--n"}


def _flags(command: str) -> list[str]:
    module, function, _ = COMMANDS[command]
    app = typer.Typer()
    app.command()(getattr(importlib.import_module(f"mfcli.cli.{module}"), function))
    return [opt for p in get_command(app).params for opt in p.opts if opt.startswith("--")]


@pytest.mark.parametrize(
    "command, groups",
    [
        ("optimize", PARTICIPATION_FLAGS | WORKLOAD_FLAGS),
        ("compare", PARTICIPATION_FLAGS | WORKLOAD_FLAGS),
        ("account", PARTICIPATION_FLAGS),
        ("compress", PARTICIPATION_FLAGS),
        ("inspect", PARTICIPATION_FLAGS),
    ],
)
def test_each_command_offers_its_groups_once(command: str, groups: set[str]) -> None:
    flags = _flags(command)
    assert len(flags) == len(set(flags)), flags
    assert groups <= set(flags)


def _toy() -> tuple[typer.Typer, list[Any]]:
    seen: list[Any] = []
    app = typer.Typer()

    @app.command()
    @option_group(WorkloadOptions, into="workload")
    @option_group(ParticipationOptions, into="participation")
    def toy(*, workload: WorkloadOptions, count: int = typer.Option(1, "--count"),
            participation: ParticipationOptions) -> None:
        seen.append((workload, count, participation))

    return app, seen


@pytest.mark.parametrize(
    "args, workload, count, participation",
    [
        ([], WorkloadOptions(), 1, ParticipationOptions()),
        (["-w", "momentum", "--beta", "0.5", "--count", "3"], WorkloadOptions(workload="momentum", beta=0.5), 3,
         ParticipationOptions()),
        (["--min-sep", "4", "--max-participations", "2", "--lr", "cooldown", "--lr-final", "0.1"],
         WorkloadOptions(lr="cooldown", lr_final=0.1), 1, ParticipationOptions(min_sep=4, max_participations=2)),
    ],
)
def test_a_group_arrives_as_one_object(args: list[str], workload: WorkloadOptions, count: int,
                                       participation: ParticipationOptions) -> None:
    app, seen = _toy()
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert seen == [(workload, count, participation)]


def test_the_problem_group_is_the_workload_then_the_schema() -> None:
    """optimize and compare take both groups as one: the workload's options (with --n), then the
    schema's, in that order on the command line and in --help, and each group's methods answer."""
    app = typer.Typer(add_completion=False)
    seen: list[ProblemOptions] = []

    @app.command()
    @option_group(ProblemOptions, into="problem")
    def toy(*, problem: ProblemOptions) -> None:
        seen.append(problem)

    flags = [opt for p in get_command(app).params for opt in p.opts if opt.startswith("--")]
    assert flags == ["--workload", "--beta", "--lr", "--lr-factor", "--lr-final", "--lr-last", "--matrix", "--n",
                     "--epochs", "--min-sep", "--max-participations"]
    res = CliRunner().invoke(app, ["-w", "momentum", "--beta", "0.5", "--n", "8", "--min-sep", "2"])
    assert res.exit_code == 0, res.output
    assert seen == [ProblemOptions(workload="momentum", beta=0.5, n=8, min_sep=2)]
    assert seen[0].build_kwargs() == {"beta": 0.5}
    assert type(seen[0].schema()).__name__ == "MinSeparation" and seen[0].given


@pytest.mark.parametrize(
    "options, schema",
    [
        (ParticipationOptions(), "SingleParticipation"),
        (ParticipationOptions(epochs=4), "FixedEpoch"),
        (ParticipationOptions(min_sep=3, max_participations=2), "MinSeparation"),
    ],
)
def test_participation_options_name_their_schema(options: ParticipationOptions, schema: str) -> None:
    assert type(options.schema()).__name__ == schema
    assert (options.requested() is None) == (schema == "SingleParticipation")


@pytest.mark.parametrize(
    "options",
    [ParticipationOptions(epochs=2, min_sep=3), ParticipationOptions(max_participations=2),
     ParticipationOptions(epochs=2, max_participations=2)],
)
def test_conflicting_participation_options_are_usage_errors(options: ParticipationOptions) -> None:
    with pytest.raises(Exception, match="--") as info:
        options.requested()
    assert getattr(info.value, "mfcli_refusal", False)


def test_the_group_must_replace_a_keyword_only_parameter() -> None:
    def command(participation: ParticipationOptions) -> None:
        pass

    with pytest.raises(TypeError, match="keyword-only"):
        option_group(ParticipationOptions, into="participation")(command)
