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

from typing import TYPE_CHECKING, Any

from mfcli.version import __version__ as __version__  # re-exported: mfcli.__version__

if TYPE_CHECKING:  # for type checkers and IDEs; at run time see __getattr__ below
    from mfcli.errors import ArtifactError, MfcliError
    from mfcli.io.artifact import Artifact, StructuredArtifact, load_any_artifact, load_artifact, save_artifact, shipped_artifact
    from mfcli.model.factorization import Factorization, sensitivity, total_loss
    from mfcli.model.participation import (
        FixedEpoch,
        MinSeparation,
        Participation,
        Sensitivity,
        SingleParticipation,
        participation_from_json,
    )
    from mfcli.model.workloads import (
        Workload,
        build_workload,
        momentum_workload,
        prefix_workload,
    )
    from mfcli.optimize.dense import SolveResult, optimal_factorization
    from mfcli.strategies.blt import BufferedToeplitz
    from mfcli.strategies.toeplitz import BandedToeplitz
    from mfcli.training.samplers import CyclicPoissonSampler, PoissonSampler, sampler_for

#: Public name -> module it is defined in. Imported on first use (PEP 562), so that
#: ``import mfcli`` and ``mfcli --version`` do not pay for numpy, scipy and h5py.
_EXPORTS = {
    "Artifact": "mfcli.io.artifact",
    "load_artifact": "mfcli.io.artifact",
    "load_any_artifact": "mfcli.io.artifact",
    "StructuredArtifact": "mfcli.io.artifact",
    "save_artifact": "mfcli.io.artifact",
    "shipped_artifact": "mfcli.io.artifact",
    "BufferedToeplitz": "mfcli.strategies.blt",
    "ArtifactError": "mfcli.errors",
    "MfcliError": "mfcli.errors",
    "Factorization": "mfcli.model.factorization",
    "sensitivity": "mfcli.model.factorization",
    "total_loss": "mfcli.model.factorization",
    "FixedEpoch": "mfcli.model.participation",
    "MinSeparation": "mfcli.model.participation",
    "Participation": "mfcli.model.participation",
    "Sensitivity": "mfcli.model.participation",
    "SingleParticipation": "mfcli.model.participation",
    "participation_from_json": "mfcli.model.participation",
    "CyclicPoissonSampler": "mfcli.training.samplers",
    "PoissonSampler": "mfcli.training.samplers",
    "sampler_for": "mfcli.training.samplers",
    "SolveResult": "mfcli.optimize.dense",
    "optimal_factorization": "mfcli.optimize.dense",
    "BandedToeplitz": "mfcli.strategies.toeplitz",
    "Workload": "mfcli.model.workloads",
    "build_workload": "mfcli.model.workloads",
    "momentum_workload": "mfcli.model.workloads",
    "prefix_workload": "mfcli.model.workloads",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mfcli' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "Artifact",
    "ArtifactError",
    "BandedToeplitz",
    "BufferedToeplitz",
    "CyclicPoissonSampler",
    "Factorization",
    "FixedEpoch",
    "MfcliError",
    "MinSeparation",
    "Participation",
    "PoissonSampler",
    "Sensitivity",
    "SingleParticipation",
    "SolveResult",
    "StructuredArtifact",
    "Workload",
    "build_workload",
    "load_any_artifact",
    "load_artifact",
    "momentum_workload",
    "optimal_factorization",
    "participation_from_json",
    "prefix_workload",
    "sampler_for",
    "save_artifact",
    "sensitivity",
    "shipped_artifact",
    "total_loss",
]
