import os

from hypothesis import HealthCheck, settings

# Keep BLAS from oversubscribing the two CI cores when pytest runs many small problems.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

settings.register_profile(
    "mfcli", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("mfcli")
