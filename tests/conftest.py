import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings

# Keep BLAS from oversubscribing the two CI cores when pytest runs many small problems.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

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
