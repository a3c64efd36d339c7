"""No command module of the CLI imports another command module (docs/architecture.md: shared CLI
code lives in the shared modules; only ``mfcli/cli/app.py`` names the commands). Every import is
read with ast, those inside functions and ``if TYPE_CHECKING`` blocks included, because a
function-level import is how the last cycle between two commands (compare <-> structured) got in."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mfcli.cli

CLI = Path(mfcli.cli.__file__).parent
COMMANDS = ("account", "compare", "compress", "inspect", "optimize", "plan")


def imported_modules(source: str, module: str) -> set[str]:
    """The dotted names every import statement of ``source`` (the module ``module``) brings in:
    ``import a.b`` gives a.b; ``from a import b`` gives a and a.b (b may be a submodule); relative
    imports are resolved against ``module``'s package."""
    names: set[str] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def command_imports(path: Path) -> set[str]:
    """The command modules ``path`` imports (itself excluded)."""
    module = f"mfcli.cli.{path.stem}"
    targets = {f"mfcli.cli.{c}" for c in COMMANDS} - {module}
    return imported_modules(path.read_text(encoding="utf-8"), module) & targets


def test_the_reader_sees_every_kind_of_import() -> None:
    """The reader itself, on imports written the ways a command could be reached."""
    source = (
        "import mfcli.cli.plan\n"
        "from mfcli.cli import account\n"
        "def f():\n"
        "    from mfcli.cli.compare import FORMATS\n"
        "    from .inspect import x\n"
        "if TYPE_CHECKING:\n"
        "    from . import compress\n"
    )
    found = imported_modules(source, "mfcli.cli.render")
    expected = {"mfcli.cli.plan", "mfcli.cli.account", "mfcli.cli.compare", "mfcli.cli.inspect", "mfcli.cli.compress"}
    assert expected <= found


@pytest.mark.parametrize("path", sorted(p for p in CLI.glob("*.py") if p.name != "app.py"), ids=lambda p: p.name)
def test_no_cli_module_imports_a_command(path: Path) -> None:
    assert command_imports(path) == set(), f"{path.name} imports command module(s); move the shared code to a shared module"


def test_the_commands_exist() -> None:
    """The list above names real modules (a renamed command would make the test vacuous)."""
    assert {p.stem for p in CLI.glob("*.py")} >= set(COMMANDS)
