"""Workload matrices A: what the trainer's linear optimizer computes from the gradient stream.

A workload is an n x n lower-triangular matrix; row t says how the released quantity at step t
depends on the gradients of steps 0..t. mfcli ships:

* ``prefix``: S, the lower-triangular ones matrix (SGD with constant learning rate).
* ``momentum``: A = M_eta M_beta with M_eta[i, j] = eta_j and M_beta[i, j] = beta^(i-j) (i >= j);
  heavy-ball momentum m_i = beta m_{i-1} + g_i, theta_i = theta_{i-1} - eta_i m_i.
* learning-rate schedules (constant, step decay, linear cooldown, or a per-step vector from a
  file) folded into either.
* ``custom``: any full-rank lower-triangular matrix from .npy, .csv or an mfcli artifact.

Example:
    >>> from mfcli.model.workloads import momentum_workload
    >>> w = momentum_workload(n=4, beta=0.5)
    >>> float(w.matrix[3, 0])
    1.875
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mfcli.errors import MfcliError
from mfcli.util.limits import DENSE_MAX_N
from mfcli.util.validation import step_count

WORKLOAD_NAMES = ("prefix", "momentum", "custom")
SCHEDULE_NAMES = ("constant", "step-decay", "cooldown")


@dataclass(frozen=True)
class Workload:
    """A named workload matrix with the parameters that built it.

    Attributes:
        name: ``prefix``, ``momentum`` or ``custom``.
        matrix: the n x n lower-triangular workload A (float64, read-only).
        params: JSON-serialisable parameters (beta, schedule, source file, ...).
    """

    name: str
    matrix: np.ndarray
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    def params_json(self) -> str:
        return json.dumps(dict(self.params), sort_keys=True)


def check_n(n: int) -> int:
    """Validate a step count for a workload: :func:`mfcli.util.validation.step_count`, and n <= DENSE_MAX_N
    (the dense solver's memory)."""
    n = step_count(n)
    if n > DENSE_MAX_N:
        raise MfcliError(
            f"n = {n} is too large: the dense solver needs about {8 * 8 * n * n / 2**30:.0f} GiB; "
            f"the limit is n <= {DENSE_MAX_N}"
        )
    return n


def check_workload_matrix(a: Any, *, what: str = "workload") -> np.ndarray:
    """Return ``a`` as a float64 array if it is a finite, full-rank, lower-triangular square matrix.

    Raises:
        MfcliError: naming the first property that fails.
    """
    try:
        arr = np.array(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise MfcliError(f"{what} is not a numeric matrix: {exc}") from None
    if arr.ndim != 2:
        raise MfcliError(f"{what} must be a 2-D matrix, got an array with shape {arr.shape}")
    if arr.shape[0] != arr.shape[1]:
        raise MfcliError(f"{what} must be square, got shape {arr.shape[0]} x {arr.shape[1]}")
    if arr.shape[0] == 0:
        raise MfcliError(f"{what} is empty")
    check_n(arr.shape[0])
    if not np.all(np.isfinite(arr)):
        raise MfcliError(f"{what} contains NaN or inf")
    upper = np.triu(arr, 1)
    if np.any(upper != 0):
        i, j = np.argwhere(upper != 0)[0]
        raise MfcliError(
            f"{what} is not lower-triangular: entry ({i}, {j}) above the diagonal is {arr[i, j]:g}"
        )
    diag = np.abs(np.diag(arr))
    scale = np.max(np.abs(arr))
    if scale == 0 or np.min(diag) <= 1e-12 * scale:
        k = int(np.argmin(diag))
        raise MfcliError(f"{what} is singular: diagonal entry {k} is {arr[k, k]:g}")
    arr.setflags(write=False)
    return arr


# ---------------------------------------------------------------------------------------------
# Learning-rate schedules


def learning_rates(
    n: int,
    schedule: str = "constant",
    *,
    factor: float = 0.15,
    final: float = 0.05,
    last: int | None = None,
) -> np.ndarray:
    """Per-step learning rates eta_0..eta_{n-1} for a named schedule (peak 1.0).

    Args:
        n: number of steps.
        schedule: ``constant``; ``step-decay`` (eta = ``factor`` for the last ``last`` steps);
            ``cooldown`` (linear from 1.0 to ``final`` over the last ``last`` steps).
        last: steps the decay covers; default n // 4 (512 of 2048 as in Denisov et al. 2022).
    """
    n = check_n(n)
    if schedule not in SCHEDULE_NAMES:
        raise MfcliError(
            f"unknown learning-rate schedule {schedule!r}; choose one of {', '.join(SCHEDULE_NAMES)} "
            "or give a file"
        )
    k = n // 4 if last is None else check_lr_last(last)
    if schedule != "constant" and not 0 <= k <= n:
        raise MfcliError(f"the decay length must be between 0 and n = {n}, got {k}")
    eta = np.ones(n)
    if schedule == "step-decay":
        factor = check_lr_factor(factor)
        if k:
            eta[n - k:] = factor
    elif schedule == "cooldown":
        final = check_lr_final(final)
        if k:
            # Linear from 1.0 at the first cooldown step to `final` at the last one.
            eta[n - k:] = np.linspace(1.0, final, k + 1)[1:] if k > 1 else final
    return eta


def _positive_rate(value: Any, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise MfcliError(f"{what} must be a number, got {value!r}") from None
    if not (v > 0 and np.isfinite(v)):
        raise MfcliError(f"{what} must be a finite number > 0, got {value}")
    return v


def check_lr_factor(factor: Any) -> float:
    """The step-decay factor: a finite learning rate > 0 (0 would stop training; a rate is never
    negative). Needs no n, so the CLI refuses it while parsing (mfcli.cli.options)."""
    return _positive_rate(factor, "the step-decay factor")


def check_lr_final(final: Any) -> float:
    """The cooldown's final learning rate: a finite number > 0, like :func:`check_lr_factor`."""
    return _positive_rate(final, "the cooldown final learning rate")


def check_lr_last(last: Any) -> int:
    """The number of steps a decay or cooldown covers, on its own: an integer >= 0 (that it is
    at most n is checked with n, by :func:`learning_rates`)."""
    return step_count(last, name="the decay length", minimum=0)


def check_lr(lr: Any) -> str:
    """``lr`` as given to :func:`build_workload`, on its own: a schedule name or a non-empty file
    path (an empty one would be read as the current directory). Whether the file exists and holds
    n rates is checked when the workload is built."""
    if not isinstance(lr, (str, Path)):
        raise MfcliError(f"lr must be a schedule name or a file path, got {lr!r}")
    if isinstance(lr, str) and not lr.strip():
        raise MfcliError(f"the learning-rate schedule or file is empty; give one of {', '.join(SCHEDULE_NAMES)} "
                         "or a .npy/.csv file of n rates")
    return str(lr)


def learning_rate_file(lr: str | Path | None) -> Path | None:
    """The file of per-step rates ``lr`` names (as :func:`build_workload` reads it), or None for a
    schedule name or no ``lr``: the input file a command must not overwrite with its output."""
    return None if lr is None or lr in SCHEDULE_NAMES else Path(lr)


def load_learning_rates(path: str | Path, n: int) -> np.ndarray:
    """Read a per-step learning-rate vector of length n from .npy, .csv or a text file."""
    vec = _read_array(path, what="learning-rate file").reshape(-1)
    if vec.shape[0] != n:
        raise MfcliError(f"learning-rate file {path} has {vec.shape[0]} entries, expected n = {n}")
    if not np.all(np.isfinite(vec)):
        raise MfcliError(f"learning-rate file {path} contains NaN or inf")
    if np.any(vec <= 0):
        raise MfcliError(f"learning-rate file {path} has a non-positive learning rate")
    return vec


# ---------------------------------------------------------------------------------------------
# Workload constructors


def _lower_ones(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n)))


def momentum_matrix(n: int, beta: float) -> np.ndarray:
    """M_beta[i, j] = beta^(i - j) for i >= j."""
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    with np.errstate(under="ignore"):
        out = np.where(diff >= 0, np.power(float(beta), np.clip(diff, 0, None)), 0.0)
    return out


def prefix_workload(n: int, *, lr: np.ndarray | None = None, lr_name: str = "constant") -> Workload:
    """Prefix sums S (times a learning-rate schedule, A[i, j] = eta_j for i >= j)."""
    n = check_n(n)
    a = _lower_ones(n)
    if lr is not None:
        a = a * np.asarray(lr, dtype=np.float64)[None, :]
    a.setflags(write=False)
    return Workload("prefix", a, {"lr": lr_name})


def check_beta(beta: Any) -> float:
    """A momentum coefficient: a finite number in [0, 1) (beta = 1 never forgets a gradient)."""
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise MfcliError(f"beta must be a number, got {beta!r}") from None
    if not (0.0 <= b < 1.0) or not np.isfinite(b):
        raise MfcliError(f"beta must be in [0, 1), got {beta}")
    return b


def momentum_workload(
    n: int, *, beta: float = 0.9, lr: np.ndarray | None = None, lr_name: str = "constant"
) -> Workload:
    """Heavy-ball momentum with learning rates: A = M_eta M_beta."""
    n = check_n(n)
    beta = check_beta(beta)
    eta = np.ones(n) if lr is None else np.asarray(lr, dtype=np.float64)
    a = (_lower_ones(n) * eta[None, :]) @ momentum_matrix(n, beta)
    a = np.tril(a)
    a.setflags(write=False)
    return Workload("momentum", a, {"beta": float(beta), "lr": lr_name})


def custom_workload(path: str | Path, *, matrix: np.ndarray | None = None) -> Workload:
    """A workload read from .npy or .csv, or the ``matrix`` its caller already read from ``path``
    (an mfcli artifact's ``workload`` dataset: :func:`mfcli.io.artifact.load_workload_matrix`; this
    layer opens no artifact)."""
    arr = _read_array(path, what="custom workload file") if matrix is None else np.asarray(matrix, dtype=np.float64)
    a = check_workload_matrix(arr, what=f"custom workload {Path(path).name}")
    return Workload("custom", a, {"source": str(path)})


def build_workload(
    name: str,
    n: int | None = None,
    *,
    beta: float = 0.9,
    lr: str = "constant",
    lr_factor: float = 0.15,
    lr_final: float = 0.05,
    lr_last: int | None = None,
    matrix_file: str | Path | None = None,
    matrix: np.ndarray | None = None,
) -> Workload:
    """Build a named workload: ``prefix`` or ``momentum`` with n steps, or ``custom`` from a file.

    ``lr`` is a schedule name (``constant``, ``step-decay``, ``cooldown``) or a path to a file
    with n per-step learning rates; ``lr_factor``, ``lr_final`` and ``lr_last`` shape the named
    schedules (:func:`learning_rates`). ``matrix_file`` is the custom workload's matrix (.npy or
    .csv; for an mfcli artifact its caller reads the matrix, :func:`mfcli.io.artifact.load_workload_matrix`,
    and passes it as ``matrix``, ``matrix_file`` naming its source); for it ``n`` is optional and,
    if given, must match.

    Raises:
        MfcliError: naming the parameter that is wrong or missing.
    """
    if name not in WORKLOAD_NAMES:
        raise MfcliError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOAD_NAMES)}")
    if name == "custom":
        if matrix_file is None:
            raise MfcliError("the custom workload needs a matrix file (matrix_file)")
        w = custom_workload(matrix_file, matrix=matrix)
        if n is not None and n != w.n:
            raise MfcliError(f"n = {n} does not match the custom matrix, which has n = {w.n}")
        return w
    if matrix_file is not None or matrix is not None:
        raise MfcliError(f"a matrix file (matrix_file) applies to the custom workload only, not {name}")
    if n is None:
        raise MfcliError(f"the {name} workload needs n (the number of steps)")
    n = check_n(n)
    lr = check_lr(lr)
    if lr in SCHEDULE_NAMES:
        eta = learning_rates(n, lr, factor=lr_factor, final=lr_final, last=lr_last)
        lr_desc: Any = lr
        if lr != "constant":
            k = n // 4 if lr_last is None else lr_last
            lr_desc = {"schedule": lr, "last": k}
            lr_desc["factor" if lr == "step-decay" else "final"] = (
                lr_factor if lr == "step-decay" else lr_final
            )
    else:
        if not Path(lr).exists():
            raise MfcliError(
                f"lr {lr!r} is neither a schedule ({', '.join(SCHEDULE_NAMES)}) nor an existing file"
            )
        eta = load_learning_rates(lr, n)
        lr_desc = {"file": str(lr)}
    w = (
        prefix_workload(n, lr=eta)
        if name == "prefix"
        else momentum_workload(n, beta=beta, lr=eta)
    )
    params = dict(w.params)
    params["lr"] = lr_desc
    return Workload(w.name, w.matrix, params)


def default_artifact_stem(workload: Workload, strategy: str | None = None) -> str:
    """The file stem mfcli names an artifact of ``workload`` by when no path is given.

    For the optimum, ``<workload>`` with the learning-rate schedule appended when it is not
    constant: its name (``momentum-cooldown``), or ``lr-<file stem>`` for rates read from a file
    (``prefix-lr-rates`` for ``rates.npy``), so optima for different schedules do not overwrite
    each other. For a baseline ``strategy`` saved instead, ``<workload>-<strategy>``. The step
    count is added by :func:`mfcli.io.artifact.default_artifact_path`.
    """
    if strategy is not None:
        return f"{workload.name}-{strategy}"
    lr_param = workload.params.get("lr")
    if isinstance(lr_param, dict) and "schedule" in lr_param:
        return f"{workload.name}-{lr_param['schedule']}"
    if isinstance(lr_param, dict) and "file" in lr_param:
        # the stem in characters any file system and shell take as they are; the rest become "_"
        stem = re.sub(r"[^A-Za-z0-9._+-]+", "_", Path(str(lr_param["file"])).stem).strip("._") or "file"
        return f"{workload.name}-lr-{stem}"
    return workload.name


def _read_array(path: str | Path, *, what: str) -> np.ndarray:
    p = Path(path)
    if not p.exists():
        raise MfcliError(f"{what} {p} does not exist")
    if p.is_dir():
        raise MfcliError(f"{what} {p} is a directory")
    suffix = p.suffix.lower()
    try:
        if p.stat().st_size == 0:
            raise MfcliError(f"{what} {p} is empty")
        if suffix == ".npy":
            raw = np.load(p, allow_pickle=False)
            if np.iscomplexobj(raw):
                raise MfcliError(f"{what} {p} holds complex numbers; a real matrix is needed")
            return np.asarray(raw, dtype=np.float64)
        if suffix in (".h5", ".hdf5"):
            raise MfcliError(f"{what} {p} is an HDF5 file: read an mfcli artifact's workload with "
                             "mfcli.io.artifact.load_workload_matrix and pass it as matrix")
        # CSV or whitespace-separated text.
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
        if not text.strip():
            raise MfcliError(f"{what} {p} is empty")
        delim = "," if "," in text else None
        return np.loadtxt(p, delimiter=delim, dtype=np.float64, ndmin=2)
    except MfcliError:
        raise
    except (ValueError, OSError, EOFError, UnicodeDecodeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MfcliError(f"cannot read {what} {p}: {msg}") from None
