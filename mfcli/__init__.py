"""mfcli: matrix-factorization mechanisms for private training with correlated noise.

The data flows one way: workload -> strategy (solver or baseline) -> factorization -> artifact ->
(compress | account | inspect | noise stream | compare).

Example:
    >>> import mfcli
    >>> w = mfcli.build_workload("prefix", 16)
    >>> res = mfcli.optimal_factorization(w.matrix, tol=1e-8)
    >>> res.factorization.sensitivity   # doctest: +ELLIPSIS
    1.0...
"""
from __future__ import annotations

__version__ = "0.1.0"

from mfcli.artifact import Artifact, load_artifact, save_artifact, shipped_artifact
from mfcli.errors import ArtifactError, MfcliError
from mfcli.factorization import Factorization, sensitivity, total_loss
from mfcli.solver import SolveResult, optimal_factorization
from mfcli.workloads import Workload, build_workload, momentum_workload, prefix_workload

__all__ = [
    "Artifact",
    "ArtifactError",
    "Factorization",
    "MfcliError",
    "SolveResult",
    "Workload",
    "build_workload",
    "load_artifact",
    "momentum_workload",
    "optimal_factorization",
    "prefix_workload",
    "save_artifact",
    "sensitivity",
    "shipped_artifact",
    "total_loss",
]
