"""CLI ecosystem conventions (issue 15, item 4): shell completion, boolean flags shown as flags,
versioned JSON with a shipped schema per command, and cost estimates with a memory limit."""
from __future__ import annotations

import importlib
import stat
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mfcli.cli.app import COMMANDS, LazyGroup, app

ROOT = Path(__file__).resolve().parent.parent


def _mfcli_on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has an ``mfcli`` that runs this checkout, as an installed
    console script would (its program name is ``mfcli``)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "mfcli"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; sys.argv[0] = \'mfcli\'; '
                      f'from mfcli.cli.app import main; main()" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bindir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "SHELL": "/bin/bash", "HOME": str(tmp_path)}


def test_help_offers_completion() -> None:
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout


@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")
def test_bash_completion_script_completes_commands_and_options(tmp_path: Path) -> None:
    """The script --show-completion prints, sourced into bash, completes a command name and then
    an option of that (lazily imported) command."""
    env = _mfcli_on_path(tmp_path)
    shown = subprocess.run(["/bin/bash", "-c", "mfcli --show-completion"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _mfcli_completion mfcli" in shown.stdout
    probe = (
        'eval "$(mfcli --show-completion)"\n'
        "COMP_WORDS=(mfcli acc); COMP_CWORD=1; _mfcli_completion mfcli; echo \"1:${COMPREPLY[*]}\"\n"
        "COMP_WORDS=(mfcli account --tail-f); COMP_CWORD=2; _mfcli_completion mfcli; echo \"2:${COMPREPLY[*]}\"\n"
        "COMP_WORDS=(mfcli inspect --no-c); COMP_CWORD=2; _mfcli_completion mfcli; echo \"3:${COMPREPLY[*]}\"\n"
    )
    res = subprocess.run(["/bin/bash", "-c", probe], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["1:account", "2:--tail-fraction", "3:--no-certificate"], res.stdout + res.stderr


def test_install_completion_writes_the_bash_script(tmp_path: Path) -> None:
    env = _mfcli_on_path(tmp_path)
    res = subprocess.run(["/bin/bash", "-c", "mfcli --install-completion"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "bash completion installed" in res.stdout
    installed = list((tmp_path / ".bash_completions").glob("mfcli*"))
    assert installed and "_mfcli_completion" in installed[0].read_text()
    assert "mfcli" in (tmp_path / ".bashrc").read_text()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_boolean_options_are_flags(name: str) -> None:
    """Every boolean option is a flag (``--json``, ``--certificate/--no-certificate``), never an
    option that takes a value, and --help shows no boolean metavar."""
    module, attr, _ = COMMANDS[name]
    hints = typing.get_type_hints(getattr(importlib.import_module(f"mfcli.cli.{module}"), attr))
    bools = {k for k, t in hints.items() if t is bool or t == bool | None}
    assert "as_json" in bools, "every command has --json"
    params = {p.name: p for p in LazyGroup().get_command(None, name).params}
    for k in bools:
        assert params[k].is_flag and params[k].is_bool_flag, (name, k)
    r = CliRunner().invoke(app, [name, "--help"])
    assert r.exit_code == 0
    for bad in ("BOOLEAN", "<bool>", "[true|false]"):
        assert bad not in r.stdout, (name, bad)
