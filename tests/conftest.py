import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings

# Keep BLAS (and torch's OpenMP pool) from oversubscribing the CI cores: pytest runs one xdist
# worker per core (addopts in pyproject.toml), each with its own thread pools, and the CLI
# subprocesses the tests start inherit these variables. Set before numpy/torch are imported
# (conftest is imported before any test module); a value set by the caller wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# Parent "default": hypothesis's own settings, not the "ci" profile it loads by itself whenever a CI
# variable exists, so the rule below alone decides.
settings.register_profile(
    "mfcli", settings.get_profile("default"), max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Under CI the examples are derived from each test's name (the same inputs on every run, no example
# database), so a CI failure reproduces on rerun and a pass does not hang on a lucky draw; print_blob
# prints the reproduction decorator of a failing example.
settings.register_profile("mfcli-ci", settings.get_profile("mfcli"), derandomize=True, database=None, print_blob=True)


def _ci(environ: Mapping[str, str]) -> bool:
    return any(environ.get(k, "").strip().lower() not in ("", "0", "false", "no") for k in ("MFCLI_CI", "CI"))


settings.load_profile("mfcli-ci" if _ci(os.environ) else "mfcli")


# The slowest modules (CPU seconds, docs/performance.md "Test suite"), longest first. Under
# --dist loadfile each module is one unit of work; xdist hands them out in collection order
# (--no-loadscope-reorder), so these start first and no long module is left to start last.
_SLOW_FIRST = (
    "test_train_multi_epoch.py", "test_accounting_multi.py", "test_inspect_records.py", "test_compare_equal_privacy.py",
    "test_example_torch_opacus.py", "test_json_schemas.py", "test_packaging.py", "test_accounting_cli.py",
    "test_adapters_jax_privacy.py", "test_blt.py", "test_signals.py", "test_example_jax_optax.py",
)


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(_SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
