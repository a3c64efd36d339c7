"""The suite runs on pytest-xdist workers (pyproject.toml's addopts) without changing what it
checks: under CI the hypothesis examples the workers draw are the same on every run, a failing
property fails again with the same falsifying example and a reproduction blob, and a module's
module-scoped fixture is built once (the module's tests stay on one worker).

Oracles: a throw-away project (this pyproject.toml and tests/conftest.py, two small test modules)
run twice by a real ``pytest -n 2`` subprocess; the workers write what they drew and built to files.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

PROPERTIES = '''
import os
from hypothesis import given, strategies as st

def _log(name, value):
    with open(os.path.join(os.environ["DRAWS"], name + "-" + os.environ["PYTEST_XDIST_WORKER"]), "a") as f:
        f.write(repr(value) + "\\n")

@given(st.integers(-10**9, 10**9), st.floats(-1e6, 1e6))
def test_draws(i, x):
    _log("draws", (i, x))

@given(st.lists(st.integers(0, 10**6), min_size=1))
def test_fails(xs):
    assert sum(xs) % 5 != 3
'''

SHARED = '''
import os
import pytest

@pytest.fixture(scope="module")
def built():
    with open(os.path.join(os.environ["DRAWS"], "built-" + os.environ["PYTEST_XDIST_WORKER"]), "a") as f:
        f.write("built\\n")
    return 1

@pytest.mark.parametrize("k", range(12))
def test_uses_shared(built, k):
    assert built == 1
'''


def _run(tree: Path, draws: Path) -> subprocess.CompletedProcess:
    """The project's own pytest configuration, with two workers whatever the machine's cores."""
    draws.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE", "PYTEST_ADDOPTS")}
    env.update(MFCLI_CI="1", DRAWS=str(draws))
    return subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def _read(draws: Path, prefix: str) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in sorted(draws.glob(prefix + "-*"))}


def test_workers_draw_the_same_examples_and_a_failure_reproduces(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    shutil.copy(TESTS / "conftest.py", tree / "tests" / "conftest.py")
    (tree / "tests" / "test_properties.py").write_text(PROPERTIES)
    (tree / "tests" / "test_shared.py").write_text(SHARED)
    runs = [_run(tree, tmp_path / f"draws{i}") for i in range(2)]
    falsifying = []
    for i, res in enumerate(runs):
        assert res.returncode == 1, res.stdout + res.stderr           # test_fails fails, nothing else
        assert "1 failed, 13 passed" in res.stdout, res.stdout
        # the failing example and the reproduction blob (print_blob of the CI profile)
        falsifying.append((re.findall(r"\bxs=(\[[^\]]*\])", res.stdout),
                           re.findall(r"@reproduce_failure\(('[^']*', b'[^']*')\)", res.stdout)))
        # the module-scoped fixture of test_shared.py was built once, on one worker
        assert sum(len(v) for v in _read(tmp_path / f"draws{i}", "built").values()) == 1
    assert all(len(x) == 1 for x in falsifying[0]) and falsifying[0] == falsifying[1]
    first, second = (sorted(x for v in _read(tmp_path / f"draws{i}", "draws").values() for x in v) for i in range(2))
    assert len(first) >= 25 and first == second
