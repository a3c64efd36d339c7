"""HDF5 artifact format v1: write atomically, read, verify (docs/artifact-format.md).

An artifact holds one factorization and everything needed to trust it: the matrices, how they
were made, the numbers a user relies on, and a SHA-256 of every dataset. The format needs nothing
but h5py to read::

    import h5py
    with h5py.File(path) as f:        # e.g. path = mfcli.shipped_artifact("momentum-n256")
        C = f["strategy"][...]        # encoder, lower-triangular, unit column norms
        B = f["decoder"][...]         # B = A C^-1
        sens = f.attrs["sensitivity"]

:func:`load_artifact` refuses a file whose checksums, shapes, sensitivity or A = B C do not hold,
naming what failed.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from mfcli.errors import ArtifactError, MfcliError
from mfcli.factorization import Factorization, sensitivity

FORMAT = "mfcli.factorization"
FORMAT_VERSION = 1
#: Relative tolerance for stored numbers against their recomputation.
ATTR_RTOL = 1e-9

ROOT_DATASETS = ("workload", "strategy", "decoder")


def dataset_sha256(arr: np.ndarray) -> str:
    """SHA-256 of an array's little-endian C-order bytes, prefixed by its dtype and shape."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _version() -> str:
    from mfcli import __version__

    return __version__


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def check_output_path(path: str | Path, *, force: bool = False) -> Path:
    """Refuse an output path that is a symlink, a directory, a device/pipe/socket, or an existing
    file without ``force``; return it as a Path. Call it before expensive work."""
    target = Path(path)
    if target.is_symlink():
        raise MfcliError(f"{target} is a symbolic link; give the path of a regular file")
    if target.exists() and target.is_dir():
        raise MfcliError(f"{target} is a directory")
    if target.exists() and not target.is_file():
        raise MfcliError(f"{target} is not a regular file (a device, pipe or socket)")
    if target.exists() and not force:
        raise MfcliError(f"{target} already exists (use --force to overwrite)")
    return target


@contextmanager
def atomic_path(path: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds.

    Nothing is left behind on error or Ctrl-C: the temporary file is removed.
    """
    target = check_output_path(path, force=force)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MfcliError(f"cannot create directory {parent}: {exc.strerror or exc}") from None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        # mkstemp creates 0600; give the artifact the permissions a normal file would get.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _to_attr(value: Any) -> Any:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value is None:
        return "null"
    return value


def _write_dataset(group: Any, name: str, data: np.ndarray) -> None:
    arr = np.ascontiguousarray(np.asarray(data, dtype=np.float64))
    ds = group.create_dataset(name, data=arr)
    ds.attrs["sha256"] = dataset_sha256(arr)


@dataclass(frozen=True, eq=False)
class Artifact:
    """A loaded, verified artifact: its factorization, attributes and optional parts.

    Attributes:
        path: where it was read from.
        factorization: A, B, C (verified).
        attrs: root attributes, JSON strings decoded.
        dual_weights: solver state for warm starts, if stored.
        groups: other groups (``compressed``, ``accounting``) as dicts of datasets and attrs.
    """

    path: Path
    factorization: Factorization
    attrs: Mapping[str, Any]
    dual_weights: np.ndarray | None = None
    groups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.factorization.n

    @property
    def workload_name(self) -> str:
        return str(self.attrs.get("workload_name", "custom"))

    @property
    def strategy_name(self) -> str:
        return str(self.attrs.get("strategy_name", "unknown"))


def save_artifact(
    path: str | Path,
    factorization: Factorization,
    *,
    workload_name: str,
    workload_params: Mapping[str, Any] | None = None,
    strategy_name: str,
    solver: Mapping[str, Any] | None = None,
    command: str = "",
    dual_weights: np.ndarray | None = None,
    extra_attrs: Mapping[str, Any] | None = None,
    groups: Mapping[str, Mapping[str, Any]] | None = None,
    force: bool = False,
) -> str:
    """Verify ``factorization`` and write it as a format-v1 artifact, atomically.

    ``groups`` maps a group name to ``{"datasets": {name: array}, "attrs": {name: value}}``.
    Returns the SHA-256 of the written file.
    """
    import h5py

    factorization.verify()
    with atomic_path(path, force=force) as tmp:
        with h5py.File(tmp, "w") as f:
            for name, data in (
                ("workload", factorization.workload),
                ("strategy", factorization.strategy),
                ("decoder", factorization.decoder),
            ):
                _write_dataset(f, name, data)
            if dual_weights is not None:
                _write_dataset(f, "dual_weights", dual_weights)
            attrs: dict[str, Any] = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "n": factorization.n,
                "m": factorization.m,
                "workload_name": workload_name,
                "workload_params": dict(workload_params or {}),
                "strategy_name": strategy_name,
                "sensitivity": factorization.sensitivity,
                "loss_total": factorization.loss_total,
                "loss_mean": factorization.loss_mean,
                "loss_max": factorization.loss_max,
                "causal": factorization.causal,
                "noise_operator": "C^-1 (gradient noise) and B (iterate noise)",
                "solver": dict(solver) if solver is not None else {},
                "created_by": f"mfcli {_version()}",
                "created_utc": utc_now(),
                "command": command,
            }
            attrs.update(extra_attrs or {})
            for k, val in attrs.items():
                f.attrs[k] = _to_attr(val)
            for gname, content in (groups or {}).items():
                g = f.create_group(gname)
                for dname, data in content.get("datasets", {}).items():
                    _write_dataset(g, dname, data)
                for k, val in content.get("attrs", {}).items():
                    g.attrs[k] = _to_attr(val)
        digest = file_sha256(tmp)
    return digest


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and value[:1] in "{[" or value == "null":
        try:
            return json.loads(value)
        except (ValueError, TypeError):
            return value
    if isinstance(value, np.generic):
        return value.item()
    return value


def check_datasets(path: str | Path) -> list[tuple[str, bool]]:
    """(dataset name, checksum OK) for every dataset in the file, without further checks."""
    import h5py

    out: list[tuple[str, bool]] = []
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                stored = obj.attrs.get("sha256")
                stored = stored.decode() if isinstance(stored, bytes) else stored
                out.append((name, stored == dataset_sha256(obj[...])))

        f.visititems(visit)
    return out


def open_artifact_file(path: str | Path) -> Any:
    """Open an artifact read-only as an ``h5py.File``, or raise ArtifactError saying why not
    (missing, a directory, not HDF5: truncated or corrupt). The caller closes it."""
    import h5py

    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"artifact {p} does not exist")
    if p.is_dir():
        raise ArtifactError(f"artifact {p} is a directory")
    try:
        return h5py.File(p, "r")
    except OSError as exc:
        raise ArtifactError(f"{p} is not a readable HDF5 artifact (truncated or corrupt?): {exc}") from None


def load_artifact(path: str | Path, *, verify: bool = True) -> Artifact:
    """Read an artifact and verify it.

    Checks, in order: the file opens as HDF5; ``format`` and ``format_version``; the three root
    datasets exist with consistent shapes; every dataset's SHA-256; the stored sensitivity and
    loss against their recomputation; A = B C; causality of square causal factors.

    Raises:
        ArtifactError: naming the first check that fails.
    """
    import h5py

    p = Path(path)
    f = open_artifact_file(p)
    try:
        with f:
            fmt = _decode(f.attrs.get("format"))
            if fmt != FORMAT:
                raise ArtifactError(f"{p} is not an mfcli artifact (format attribute is {fmt!r})")
            version = _decode(f.attrs.get("format_version"))
            if version != FORMAT_VERSION:
                raise ArtifactError(
                    f"{p} has format_version {version!r}; this mfcli reads version {FORMAT_VERSION}"
                )
            for name in ROOT_DATASETS:
                if name not in f or not isinstance(f[name], h5py.Dataset):
                    raise ArtifactError(f"{p} has no {name!r} dataset")
            datasets: dict[str, np.ndarray] = {}
            groups: dict[str, dict[str, Any]] = {}

            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    data = obj[...]
                    if verify:
                        stored = _decode(obj.attrs.get("sha256"))
                        if stored is None:
                            raise ArtifactError(f"{p}: dataset {name!r} has no sha256 checksum")
                        if stored != dataset_sha256(data):
                            raise ArtifactError(f"{p}: checksum mismatch in dataset {name!r} (file modified or corrupt)")
                    datasets[name] = data
                elif isinstance(obj, h5py.Group):
                    groups[name] = {"attrs": {k: _decode(v) for k, v in obj.attrs.items()}, "datasets": {}}

            try:
                f.visititems(visit)
            except ArtifactError:
                raise
            except (OSError, KeyError, ValueError, RuntimeError) as exc:
                raise ArtifactError(f"{p} cannot be read (truncated or corrupt?): {exc}") from None
            attrs = {k: _decode(v) for k, v in f.attrs.items()}
    except ArtifactError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"{p} cannot be read (truncated or corrupt?): {exc}") from None

    for name in ROOT_DATASETS:
        data = datasets[name]
        if data.dtype.kind not in "fiu" or data.ndim != 2:
            raise ArtifactError(
                f"{p}: dataset {name!r} must be a 2-D real matrix, got dtype {data.dtype} with shape {data.shape}"
            )
    for name, data in datasets.items():
        if "/" in name:
            gname, dname = name.rsplit("/", 1)
            groups.setdefault(gname, {"attrs": {}, "datasets": {}})["datasets"][dname] = data
    try:
        fact = Factorization(
            workload=datasets["workload"],
            strategy=datasets["strategy"],
            decoder=datasets["decoder"],
            causal=bool(attrs.get("causal", False)),
        )
    except MfcliError as exc:
        raise ArtifactError(f"{p}: {exc}") from None
    n = fact.n
    if attrs.get("n") != n:
        raise ArtifactError(f"{p}: attribute n = {attrs.get('n')!r} but the workload is {n} x {n}")
    if verify:
        for key, recomputed in (
            ("sensitivity", sensitivity(fact.strategy)),
            ("loss_total", fact.loss_total),
        ):
            stored = attrs.get(key)
            if not isinstance(stored, (int, float)) or not np.isclose(stored, recomputed, rtol=ATTR_RTOL, atol=0):
                raise ArtifactError(
                    f"{p}: stored {key} {stored!r} does not match the value recomputed from the matrices ({recomputed!r})"
                )
        try:
            fact.verify()
        except MfcliError as exc:
            raise ArtifactError(f"{p}: {exc}") from None
    dual = datasets.get("dual_weights")
    return Artifact(path=p, factorization=fact, attrs=attrs, dual_weights=dual, groups=groups)


def default_artifact_path(workload_name: str, n: int, directory: str | Path = "artifacts") -> Path:
    """``artifacts/<workload>-n<N>.h5``."""
    return Path(directory) / f"{workload_name}-n{n}.h5"


#: Ready-made artifacts shipped as package data in ``mfcli/data/`` (name -> file name).
SHIPPED = {
    "prefix-n256": "prefix-n256.h5",
    "momentum-n256": "momentum-n256.h5",
}


def _shipped_path(file_name: str) -> Path:
    # importlib.resources finds package data wherever the package is installed (checkout, wheel,
    # --target), unlike a path computed from the source tree.
    from importlib.resources import files

    res = files("mfcli") / "data" / file_name
    if not isinstance(res, Path):
        raise MfcliError(f"the shipped artifact {file_name} is inside a zipped install; install mfcli unpacked")
    return res


def shipped_artifact(name: str = "momentum-n256") -> Path:
    """Path of a ready-made artifact shipped as package data (``mfcli/data/<name>.h5``).

    ``name`` is a key of :data:`SHIPPED`. Treat the file as read-only: copy it before modifying.
    """
    if name not in SHIPPED:
        raise MfcliError(f"no shipped artifact {name!r}; available: {', '.join(SHIPPED)}")
    here = _shipped_path(SHIPPED[name])
    if here.is_file():
        return here
    raise MfcliError(f"the shipped artifact {SHIPPED[name]} is not installed (expected at {here})")


def append_group(
    path: str | Path,
    group: str,
    *,
    attrs: Mapping[str, Any],
    datasets: Mapping[str, np.ndarray] | None = None,
    replace: bool = False,
) -> None:
    """Add a group (e.g. ``accounting/<id>``) to an existing artifact, atomically.

    The file is verified, copied byte for byte to a temporary file beside it, the group is added
    to the copy (datasets with their SHA-256), and the copy is renamed over the original: the
    matrices are never re-encoded and a crash leaves the original untouched.
    """
    import shutil

    import h5py

    p = Path(path)
    load_artifact(p)
    with atomic_path(p, force=True) as tmp:
        shutil.copyfile(p, tmp)
        with h5py.File(tmp, "r+") as f:
            if group in f:
                if not replace:
                    raise MfcliError(f"{p} already has a group {group!r}")
                del f[group]
            g = f.require_group(group)
            for k, val in attrs.items():
                g.attrs[k] = _to_attr(val)
            for dname, data in (datasets or {}).items():
                _write_dataset(g, dname, data)


def is_shipped_artifact(path: str | Path) -> bool:
    """Whether ``path`` is one of the ready-made artifacts shipped as package data (which
    commands that modify artifacts in place must refuse)."""
    try:
        target = Path(path).resolve()
    except OSError:
        return False
    for file_name in SHIPPED.values():
        try:
            shipped = _shipped_path(file_name)
            if target == shipped.resolve() or (target.exists() and shipped.exists() and target.samefile(shipped)):
                return True
        except (OSError, MfcliError):
            continue
    return False
