"""What CI runs: README's test command is .ci/run's, which also lints and type-checks; the
hypothesis profile follows the CI environment variables (tests/conftest.py): derandomized under CI
(``.ci/run`` sets MFCLI_CI=1; most CI services set CI=true), random otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PROBE = (
    "import conftest; from hypothesis import settings as s; d = s.default; "
    "print(d.derandomize, d.print_blob, d.database is None, d.deadline)"
)


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "MFCLI_CI", "HYPOTHESIS_PROFILE")}
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=TESTS, env={**clean, **env},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


@pytest.mark.parametrize("env, derandomized", [
    ({}, False),
    ({"MFCLI_CI": "1"}, True),
    ({"CI": "true"}, True),
    ({"CI": "false"}, False),
    ({"MFCLI_CI": "0"}, False),
    ({"CI": ""}, False),
])
def test_profile_follows_ci_variables(env: dict[str, str], derandomized: bool) -> None:
    derandomize, print_blob, no_database, deadline = _probe(**env)
    assert derandomize == str(derandomized)
    assert print_blob == str(derandomized)
    assert no_database == str(derandomized)
    assert deadline == "None"


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split("Run the tests", 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 1, block
    return lines[0]


def test_ci_runs_readme_test_command_then_lint_and_types() -> None:
    steps = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    test_line = _readme_test_command()
    assert test_line in steps
    after = steps[steps.index(test_line) + 1:]
    assert after == ["ruff check mfcli tests scripts examples", "mypy", ".ci/wheel-check"]
    assert steps.index("export MFCLI_CI=1") < steps.index(test_line)


# The distribution names of the core dependencies, as modules (pyproject.toml [project].dependencies).
CORE_MODULES = {"typer", "numpy", "scipy", "h5py", "rich", "dp_accounting", "threadpoolctl", "click"}
#: Imported only under TYPE_CHECKING and shipped with mypy itself (typeshed's stdlib stubs), so
#: installed or not, mypy reads the same stubs.
MYPY_BUNDLED = {"typing_extensions"}


def _third_party_imports() -> set[str]:
    import ast

    found: set[str] = set()
    for path in (ROOT / "mfcli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "mfcli"}


def test_mypy_verdict_cannot_depend_on_installed_extras() -> None:
    """Every optional extra that mfcli imports is never followed by mypy (its names are Any), so CI
    with every extra and a machine with none get the same verdict (issue 23, item 6)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    skipped = {
        module.removesuffix(".*")
        for override in config["tool"]["mypy"]["overrides"]
        if override.get("follow_imports") == "skip"
        for module in override["module"]
    }
    optional = _third_party_imports() - CORE_MODULES - MYPY_BUNDLED
    assert optional, "expected the adapters to import optional extras"
    assert optional <= skipped, f"optional extras that mypy would follow: {sorted(optional - skipped)}"


def test_one_version_and_a_changelog_entry_for_it() -> None:
    """pyproject's version is the package's (mfcli --version, artifacts, --json) and CHANGELOG.md
    has a section for it (issue 23, item 7: the version moves with the public API)."""
    tomllib = pytest.importorskip("tomllib")
    from mfcli.version import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["version"] == __version__
    assert f"## {__version__}" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
