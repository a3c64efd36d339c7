"""The ``>>>`` examples in mfcli's docstrings are run, module by module, so a stale example fails
the suite (the equivalent of ``pytest --doctest-modules mfcli`` inside ``testpaths = tests``).

A module of an optional extra (mfcli.adapters.torch needs torch, mfcli.adapters.opacus opacus, mfcli.adapters.optax jax
and optax) is skipped, with the reason, when its extra is not installed; CI installs every extra."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import mfcli

# The third-party packages behind mfcli's extras: a module that fails to import because one of
# these is missing is skipped; any other import error fails the test.
OPTIONAL = {"torch", "jax", "jaxlib", "optax", "matplotlib", "mlxtend", "opacus"}

# mfcli.__main__ is left out: importing it runs the command line.
MODULES = sorted(
    [mfcli.__name__]
    + [m.name for m in pkgutil.walk_packages(mfcli.__path__, prefix=mfcli.__name__ + ".") if not m.name.endswith("__main__")]
)


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs the optional package {exc.name}")
        raise


def _examples(module) -> list[doctest.DocTest]:
    return [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, module.__name__) if t.examples]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = _import(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in _examples(module):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in {name} failed (output above)"


def test_the_examples_are_found() -> None:
    """The finder sees every example the package's source holds: a module whose examples silently
    stopped being collected would otherwise pass as 'no examples'. Which modules hold examples is
    read from the source text (a line that starts with ``>>>``), not from the finder itself."""
    import importlib.util
    import re
    from pathlib import Path

    in_source = set()
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        if re.search(r"^\s*>>> ", Path(spec.origin).read_text(encoding="utf-8"), flags=re.MULTILINE):
            in_source.add(name)
    found = {name for name in in_source if "adapters" not in name and _examples(_import(name))}
    assert found == {name for name in in_source if "adapters" not in name}
    assert len(found) >= 18  # the count when this check was written: it must not fall to a vacuous 0
