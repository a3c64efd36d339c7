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
import io
import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import fcntl
except ImportError:  # Windows: writers are not locked against each other
    fcntl = None  # type: ignore[assignment]

import numpy as np

from mfcli.errors import ArtifactError, MfcliError, OutputExistsError
from mfcli.model.artifact_format import FORMAT, FORMAT_VERSION, dataset_sha256, decode_attr
from mfcli.model.factorization import Factorization, sensitivity
from mfcli.model.participation import Participation, Sensitivity, SingleParticipation, participation_from_json

if TYPE_CHECKING:
    from mfcli.strategies.structured import StructuredOperator
    from mfcli.strategies.toeplitz import Loss, ToeplitzWorkload

#: Relative tolerance for stored numbers against their recomputation.
ATTR_RTOL = 1e-9

ROOT_DATASETS = ("workload", "strategy", "decoder")

#: Root attribute holding the participation schema as JSON (absent: single participation).
PARTICIPATION_ATTR = "participation"


def _version() -> str:
    from mfcli.version import __version__

    return __version__


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def check_output_path(path: str | Path, *, force: bool = False) -> Path:
    """Refuse an output path that is a symlink, a directory, a device/pipe/socket, or an existing
    file without ``force``; return it as a Path. Call it before expensive work (the writer checks
    again under its lock, :func:`atomic_path`)."""
    target = Path(path)
    if target.is_symlink():
        raise MfcliError(f"{target} is a symbolic link; give the path of a regular file")
    if target.exists() and target.is_dir():
        raise MfcliError(f"{target} is a directory")
    if target.exists() and not target.is_file():
        raise MfcliError(f"{target} is not a regular file (a device, pipe or socket)")
    if target.exists() and not force:
        raise OutputExistsError(f"{target} already exists")
    _check_parent(target)
    return target


def refuse_input_as_output(target: str | Path, inputs: Any, *, what: str) -> None:
    """Refuse an output path that names one of the input files ``inputs`` (the same path, or a
    link to the same file): writing it, with ``--force`` too, would replace an input with the
    result. ``inputs``: (path, noun) pairs, the noun saying what the input is (``artifact``);
    ``what`` names the operation (``compression``). Called before any work is done."""
    t = Path(target)
    for source, noun in inputs:
        src = Path(source)
        if _same_file(src, t) or t.resolve() == src.resolve():
            raise MfcliError(f"the output {t} is the input {noun}; {what} never modifies its input")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_parent(target: Path) -> None:
    """Refuse, naming ``target``, an output whose folder cannot be made or written: the nearest
    existing ancestor must be a writable directory (a regular file there would otherwise surface
    as "cannot create directory X: File exists" or as an error naming a temporary file)."""
    ancestor = target.parent if str(target.parent) else Path(".")
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise MfcliError(f"cannot write {target}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise MfcliError(f"cannot write {target}: directory {ancestor} is not writable")


#: Signals held back while a file is being written and committed (see :func:`deferred_signals`).
_DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """Hold SIGINT and SIGTERM for the duration of the block, then deliver them, in order.

    Why: an exception raised by a signal handler while HDF5 is closing or flushing a file is
    printed and swallowed by h5py ("Exception ignored in ..."), so a Ctrl-C there used to be lost
    and the write committed with exit status 0. Inside the block a signal is only recorded; the
    yielded list shows which arrived, so the caller can abandon its work before committing. On
    exit the previous handlers are restored and each recorded signal is raised again, so it is
    never swallowed (KeyboardInterrupt, the CLI's SIGTERM exception, or death by the default
    action, after the caller's cleanup). Only the main thread can handle signals: elsewhere the
    block runs as is.
    """
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    previous: dict[signal.Signals, Any] = {}

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    try:
        for sig in _DEFERRED_SIGNALS:
            old = signal.getsignal(sig)
            if old is None or old == signal.SIG_IGN:
                continue
            previous[sig] = old
            signal.signal(sig, hold)
        yield pending
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


_locks = threading.local()


@contextmanager
def directory_lock(directory: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory`` (waiting for it) for the duration of the block.

    Every mfcli writer takes it around "check the precondition, write, rename" for a file in
    that directory, so two writers cannot both create the same new file and two appends to one
    artifact cannot lose a record: the second waits, then sees the first one's result. Locking
    the directory rather than the file means no lock file is left behind and a file replaced by
    rename is still covered. Re-entrant within a thread. The lock is advisory (other programs
    ignore it) and is skipped where ``fcntl`` is missing (Windows) or the directory cannot be
    opened for reading.
    """
    held: dict[str, int] | None = getattr(_locks, "held", None)
    if held is None:
        held = _locks.held = {}
    key = os.path.realpath(directory)
    if fcntl is None or key in held:
        yield
        return
    try:
        fd = os.open(key, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except PermissionError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held[key] = fd
        try:
            yield
        finally:
            del held[key]
    finally:
        os.close(fd)  # releases the lock


def _fsync_dir(directory: Path) -> None:
    # Make the rename durable; not every platform or file system can fsync a directory.
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds.

    Guarantees (docs/artifact-format.md, "Writing"):

    * the directory lock (:func:`directory_lock`) is held from the precondition check to the
      rename, and the precondition (``path`` absent unless ``force``) is checked again under it;
    * SIGINT/SIGTERM are deferred (:func:`deferred_signals`); one that arrives before the commit
      abandons the write, removes the temporary file and is then delivered;
    * any error (a full disk included) removes the temporary file; the target is either the old
      file or the complete new one, fsynced before the rename.
    """
    target = check_output_path(path, force=force)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MfcliError(f"cannot create directory {parent}: {exc.strerror or exc}") from None
    abandoned = False
    with directory_lock(parent):
        with deferred_signals() as pending:
            check_output_path(target, force=force)
            try:
                fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
            except OSError as exc:  # name the user's target, not the temporary file beside it
                raise MfcliError(f"cannot write {target}: {exc.strerror or exc}") from None
            os.close(fd)
            tmp = Path(tmp_name)
            try:
                # mkstemp creates 0600; give the artifact the permissions a normal file would get.
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
                yield tmp
                if not pending:
                    _fsync_file(tmp)
                if pending:
                    abandoned = True
                    tmp.unlink(missing_ok=True)
                else:
                    os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            if not abandoned:
                _fsync_dir(parent)
        # The held signals were delivered on leaving the block above; a handler that did not
        # raise lands here, and the caller must still learn that nothing was written.
        if abandoned:
            raise MfcliError(f"{target} was not written: interrupted by a signal")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Largest single ``os.write``; a seam for tests that simulate a full disk.
_WRITE_CHUNK = 1 << 24
_os_write = os.write


def write_bytes_to(tmp: Path, data: bytes, *, target: Path) -> None:
    """Write ``data`` to the (temporary) file ``tmp`` with plain ``os.write`` and fsync it.

    A full disk surfaces here as one clean error naming ``target`` (the file the user asked
    for), rather than inside HDF5's close, where it used to crash the interpreter.
    """
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                written = _os_write(fd, view[:_WRITE_CHUNK])
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise MfcliError(f"cannot write {target}: {exc.strerror or exc}; nothing was written") from None


def hdf5_image(build: Callable[[Any], None], base: bytes | None = None) -> bytes:
    """Bytes of an HDF5 file made in memory: ``build(f)`` fills a new file, or edits a copy of
    ``base`` (an existing file's bytes) in place, leaving everything else byte for byte.

    Why in memory: HDF5 writes at close, and a failed write there (a full disk) leaves h5py
    closing a broken file, which crashed the interpreter. Here nothing touches the disk until
    :func:`write_bytes_to`.
    """
    import h5py

    buffer = io.BytesIO(base if base is not None else b"")
    with h5py.File(buffer, "r+" if base is not None else "w") as f:
        build(f)
    return buffer.getvalue()


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
        participation: the participation schema the artifact declares (attribute
            ``participation``); single participation when the attribute is absent.
    """

    path: Path
    factorization: Factorization
    attrs: Mapping[str, Any]
    dual_weights: np.ndarray | None = None
    groups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    participation: Participation = field(default_factory=SingleParticipation)

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
    participation: Participation | None = None,
) -> str:
    """Verify ``factorization`` and write it as a format-v1 artifact, atomically.

    ``groups`` maps a group name to ``{"datasets": {name: array}, "attrs": {name: value}}``.
    ``participation``, when given, is stored as the JSON attribute ``participation`` (it must fit
    n); when None the attribute is left out, which means single participation, so the file is
    the same as one written before schemas existed. Returns the SHA-256 of the written file.
    """
    factorization.verify()
    if participation is not None:
        participation.check(factorization.n)
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
    if participation is not None:
        attrs[PARTICIPATION_ATTR] = participation.to_json()

    def build(f: Any) -> None:
        for name, data in (
            ("workload", factorization.workload),
            ("strategy", factorization.strategy),
            ("decoder", factorization.decoder),
        ):
            _write_dataset(f, name, data)
        if dual_weights is not None:
            _write_dataset(f, "dual_weights", dual_weights)
        for k, val in attrs.items():
            f.attrs[k] = _to_attr(val)
        for gname, content in (groups or {}).items():
            g = f.create_group(gname)
            for dname, data in content.get("datasets", {}).items():
                _write_dataset(g, dname, data)
            for k, val in content.get("attrs", {}).items():
                g.attrs[k] = _to_attr(val)

    with atomic_path(path, force=force) as tmp:
        image = hdf5_image(build)
        write_bytes_to(tmp, image, target=Path(path))
    return hashlib.sha256(image).hexdigest()


def file_sha256(path: str | Path) -> str:
    from mfcli.util.validation import regular_file

    h = hashlib.sha256()
    with open(regular_file(path), "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: The one HDF5 attribute decoder (:func:`mfcli.model.artifact_format.decode_attr`).
_decode = decode_attr


def check_datasets(path: str | Path) -> list[tuple[str, bool]]:
    """(dataset name, checksum OK) for every dataset in the file, without further checks."""
    import h5py

    out: list[tuple[str, bool]] = []
    with open_artifact_file(path) as f:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                if dataset_problem(obj) is not None:
                    out.append((name, False))  # not read: its header already says it is no mfcli dataset
                    return
                stored = obj.attrs.get("sha256")
                stored = stored.decode() if isinstance(stored, bytes) else stored
                out.append((name, stored == dataset_sha256(obj[...])))

        f.visititems(visit)
    return out


# The largest dataset a reader reads: a quarter of physical memory (half the default memory
# limit), so reading it and the copy a checksum or a cast makes still fit. None: memory unknown.
def dataset_read_limit() -> int | None:
    """Bytes above which a dataset is not read (:func:`dataset_problem`)."""
    from mfcli.util.memory import default_max_memory

    limit = default_max_memory()
    return None if limit is None else limit // 2


def dataset_problem(obj: Any, *, max_size: int | None = None) -> str | None:
    """Why the HDF5 dataset ``obj`` must not be read, judged from its header alone (nothing of
    its data is read), or None when it may be.

    An mfcli writer stores every dataset as plain float64 values, contiguous and uncompressed
    (:func:`_write_dataset`), so a dataset read by a reader must be: real numbers of at most 8
    bytes (no strings, compounds or variable-length data); at most ``max_size`` elements when
    given (the kind's limit, e.g. a structured strategy's parameter count); stored in full in the
    file (its storage holds at least its declared bytes: a dataset declaring 10^8 values in an
    8 KB file, unallocated, sparse or compressed, would be conjured into gigabytes of fill
    values); and no larger than :func:`dataset_read_limit`.

    Why here: reading first and checking afterwards let an 8 KB file drive ``inspect`` to 1.6 GB.
    """
    from mfcli.util.memory import format_size

    try:
        dtype = obj.dtype
        shape = tuple(int(x) for x in obj.shape) if obj.shape is not None else None
        stored = int(obj.id.get_storage_size())
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        return f"has an unreadable header (corrupt?): {exc}"
    if shape is None:
        return "has no data space (an empty dataset)"
    if dtype.kind not in "fiu" or dtype.itemsize > 8:
        return f"is not numeric (dtype {dtype}); an artifact stores real numbers (float64)"
    count = 1
    for x in shape:
        count *= x
    declared = count * dtype.itemsize
    if max_size is not None and count > max_size:
        return f"declares {count} values (shape {shape}), more than the {max_size} this kind allows"
    if stored < declared:
        return (f"declares {format_size(declared)} (shape {shape}, {dtype}) but the file stores {stored} bytes of it "
                "(unallocated, sparse or compressed); an artifact stores every dataset in full")
    limit = dataset_read_limit()
    if limit is not None and declared > limit:
        return f"is {format_size(declared)}, more than the {format_size(limit)} a dataset may take in memory here"
    return None


def structure_problems(f: Any) -> list[str]:
    """Everything in an open HDF5 file that is not a plain group or a plain dataset stored in it.

    An artifact holds only groups and datasets whose data lives in the file itself, each
    reachable by exactly one path. Refused, one line each: soft links, external links (the data
    would come from another, unhashed file), hard links (one object under two names, so a check
    of one path vouches for another), virtual datasets and datasets with external raw storage
    (data in other files), and committed datatypes. Links are examined without following them,
    so a dangling or cyclic link is reported, not followed. Shared by :func:`load_artifact`
    (which refuses the first) and :mod:`mfcli.services.inspect` (which reports them all).
    """
    import h5py

    problems: list[str] = []
    plain = "an artifact holds only plain datasets and groups"

    def walk(group: Any, prefix: str) -> None:
        for name in group:
            where = f"{prefix}{name}"
            try:
                link = group.get(name, getlink=True)
            except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
                problems.append(f"object {where!r} cannot be read (corrupt?): {exc}")
                continue
            if isinstance(link, h5py.SoftLink):
                problems.append(f"{where!r} is a soft link to {link.path!r}; {plain}")
                continue
            if isinstance(link, h5py.ExternalLink):
                problems.append(f"{where!r} is an external link to {link.path!r} in file {link.filename!r}; {plain}")
                continue
            try:
                obj = group[name]
                paths = h5py.h5o.get_info(obj.id).rc
            except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
                problems.append(f"object {where!r} cannot be read (corrupt?): {exc}")
                continue
            if paths > 1:
                problems.append(f"{where!r} is a hard link: the same object is reachable by {paths} paths; {plain}")
            if isinstance(obj, h5py.Group):
                walk(obj, f"{where}/")
            elif isinstance(obj, h5py.Dataset):
                if obj.is_virtual:
                    problems.append(f"{where!r} is a virtual dataset (its data lives in other files); {plain}")
                elif obj.id.get_create_plist().get_external_count():
                    problems.append(f"{where!r} stores its data in external files; {plain}")
            else:
                problems.append(f"{where!r} is a {type(obj).__name__}, not a dataset or group; {plain}")

    walk(f, "")
    return problems


def check_structure(f: Any, path: str | Path) -> None:
    """Raise ArtifactError naming the first link or non-plain object (:func:`structure_problems`)."""
    problems = structure_problems(f)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ArtifactError(f"{path}: {problems[0]}{more}")


def open_artifact_file(path: str | Path) -> Any:
    """Open an artifact read-only as an ``h5py.File``, or raise ArtifactError saying why not
    (missing, a directory, not HDF5: truncated or corrupt). The caller closes it."""
    import h5py

    from mfcli.util.validation import regular_file

    p = regular_file(path, "artifact")  # a FIFO or a device would block or never end
    try:
        return h5py.File(p, "r")
    except OSError as exc:
        raise ArtifactError(f"{p} is not a readable HDF5 artifact (truncated or corrupt?): {exc}") from None


def root_shape_problem(name: str, obj: Any, n: Any) -> str | None:
    """Why the root dataset ``name`` (workload, strategy or decoder) does not fit the declared
    ``n`` steps, from its header alone: the workload is n x n, the strategy m x n, the decoder
    n x m (m the strategy's rows). None when it fits, or when ``n`` is not an integer (the
    loaders report the attribute itself)."""
    try:
        shape = tuple(int(x) for x in obj.shape) if obj.shape is not None else ()
    except (OSError, ValueError, RuntimeError, TypeError, AttributeError):
        return f"dataset {name!r} has an unreadable shape (corrupt?)"
    if len(shape) != 2:
        return f"dataset {name!r} must be a 2-D real matrix, got shape {shape}"
    if isinstance(n, bool) or not isinstance(n, int):
        return None
    if name == "workload" and shape != (n, n):
        return f"dataset 'workload' has shape {shape}, but the artifact declares n = {n} (an n x n workload)"
    if name == "strategy" and shape[1] != n:
        return f"dataset 'strategy' has shape {shape}, but the artifact declares n = {n} (an m x n strategy)"
    if name == "decoder" and shape[0] != n:
        return f"dataset 'decoder' has shape {shape}, but the artifact declares n = {n} (an n x m decoder)"
    return None


def check_header(f: Any, p: Path) -> None:
    """The one header check of every kind of artifact: ``format`` and ``format_version``, then a
    plain HDF5 structure (:func:`check_structure`). ArtifactError naming the first problem."""
    fmt = _decode(f.attrs.get("format"))
    if fmt != FORMAT:
        raise ArtifactError(f"{p} is not an mfcli artifact (format attribute is {fmt!r})")
    version = _decode(f.attrs.get("format_version"))
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{p} has format_version {version!r}; this mfcli reads version {FORMAT_VERSION}")
    check_structure(f, p)


def verified_data(obj: Any, p: Path, name: str, *, verify: bool = True) -> np.ndarray:
    """The one checksum-verifying read of a dataset (its size already checked by
    :func:`dataset_problem`): its data, after its stored ``sha256`` is compared with
    :func:`~mfcli.model.artifact_format.dataset_sha256` of what was read (unless ``verify`` is False)."""
    data = obj[...]
    if verify:
        stored = _decode(obj.attrs.get("sha256"))
        if stored is None:
            raise ArtifactError(f"{p}: dataset {name!r} has no sha256 checksum")
        if stored != dataset_sha256(data):
            raise ArtifactError(f"{p}: checksum mismatch in dataset {name!r} (file modified or corrupt)")
    return data


@contextmanager
def reading(p: Path) -> Iterator[Any]:
    """The one opening of an artifact file of any kind: the open HDF5 file, its header checked
    (:func:`check_header`); a failure to read it becomes one :class:`ArtifactError` naming the file."""
    f = open_artifact_file(p)
    try:
        with f:
            check_header(f, p)
            yield f
    except ArtifactError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"{p} cannot be read (truncated or corrupt?): {exc}") from None


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
    with reading(p) as f:
        for name in ROOT_DATASETS:
            if name not in f or not isinstance(f[name], h5py.Dataset):
                structured = " (a structured strategy: read it with mfcli.load_any_artifact)" \
                    if "structured" in f else ""
                raise ArtifactError(f"{p} has no {name!r} dataset{structured}")
        datasets: dict[str, np.ndarray] = {}
        groups: dict[str, dict[str, Any]] = {}

        n_attr = _decode(f.attrs.get("n"))
        for name in ROOT_DATASETS:
            problem = root_shape_problem(name, f[name], n_attr)
            if problem is not None:
                raise ArtifactError(f"{p}: {problem}")

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                problem = dataset_problem(obj)
                if problem is not None:
                    raise ArtifactError(f"{p}: dataset {name!r} {problem}")
                datasets[name] = verified_data(obj, p, name, verify=verify)
            elif isinstance(obj, h5py.Group):
                groups[name] = {"attrs": {k: _decode(v) for k, v in obj.attrs.items()}, "datasets": {}}

        f.visititems(visit)   # a read failure inside becomes reading()'s one ArtifactError
        attrs = {k: _decode(v) for k, v in f.attrs.items()}
        raw_participation = f.attrs.get(PARTICIPATION_ATTR)

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
    try:
        schema = read_participation(raw_participation, n)
    except MfcliError as exc:
        raise ArtifactError(f"{p}: {exc}") from None
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
    return Artifact(path=p, factorization=fact, attrs=attrs, dual_weights=dual, groups=groups, participation=schema)


def read_participation(raw: Any, n: int | None) -> Participation:
    """The schema in a raw ``participation`` attribute (None: absent, single participation),
    parsed strictly and checked against n steps (not checked when n is None: matrices unreadable).

    Raises:
        MfcliError: the attribute is not a string, not the JSON of a schema, or does not fit n.
    """
    if raw is None:
        return SingleParticipation()
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError:
            raise MfcliError(f"attribute {PARTICIPATION_ATTR} is not UTF-8 text") from None
    if not isinstance(raw, str):
        raise MfcliError(f"attribute {PARTICIPATION_ATTR} must be a JSON string, got {type(raw).__name__}")
    try:
        schema = participation_from_json(raw)
    except MfcliError as exc:
        raise MfcliError(f"attribute {exc}") from None
    if n is None:
        return schema
    try:
        schema.check(n)
    except MfcliError as exc:
        raise MfcliError(f"attribute {PARTICIPATION_ATTR} ({schema.to_json()}) does not fit the artifact: {exc}") from None
    return schema


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

    Under the directory lock (:func:`atomic_path`), the file is verified, its bytes are read, the
    group is added to an in-memory copy (datasets with their SHA-256), and the result is written
    beside it and renamed over it: the matrices are never re-encoded, a crash leaves the original
    untouched, and concurrent appends each see the previous one's result, so none is lost.
    """
    p = Path(path)
    with atomic_path(p, force=True) as tmp:
        # Verified under the lock: this is the version the group is added to, including any
        # group another writer added while this one waited.
        load_any_artifact(p)  # dense or structured (a structured one has no n x n datasets); a regular file
        base = p.read_bytes()

        def build(f: Any) -> None:
            if group in f:
                if not replace:
                    raise MfcliError(f"{p} already has a group {group!r}")
                del f[group]
            g = f.require_group(group)
            for k, val in attrs.items():
                g.attrs[k] = _to_attr(val)
            for dname, data in (datasets or {}).items():
                _write_dataset(g, dname, data)

        write_bytes_to(tmp, hdf5_image(build, base), target=p)


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


# ---------------------------------------------------------------------------------------------
# Files the optimisers and workloads are read from or written to (they open none themselves)


def load_workload_matrix(path: str | Path) -> np.ndarray:
    """The workload matrix A stored in a dense mfcli artifact (``--matrix file.h5`` of a custom
    workload), read and verified by :func:`load_artifact`."""
    return np.array(load_artifact(Path(path)).factorization.workload)


def strategy_from_artifact(path: str | Path, workload: Any) -> Any:
    """A stored factorization (``mfcli optimize`` or ``mfcli compare --save-strategy``), checked
    against ``workload`` (a :class:`~mfcli.model.workloads.Workload` or its matrix): same n and the
    same A (relative difference <= 1e-9). Returns a :class:`mfcli.strategies.baselines.Strategy`."""
    from mfcli.model.workloads import Workload
    from mfcli.strategies.baselines import Strategy, is_causal_in_release_order

    art = load_artifact(path)
    a = workload.matrix if isinstance(workload, Workload) else np.asarray(workload, dtype=np.float64)
    n = a.shape[0]
    if art.n != n:
        raise MfcliError(f"artifact {path} has n = {art.n}, the table's workload has n = {n}")
    stored = art.factorization.workload
    diff = float(np.max(np.abs(stored - a)))
    scale = float(np.max(np.abs(a)))
    if not diff <= 1e-9 * scale:
        raise MfcliError(
            f"artifact {path} was made for a different workload ({art.workload_name} "
            f"{art.attrs.get('workload_params', {})}); max |A difference| = {diff:.3g}"
        )
    fact = art.factorization
    release = None
    info = art.groups.get("baseline", {}).get("datasets", {})
    if "release_steps" in info:
        release = np.asarray(info["release_steps"], dtype=np.int64)
    if fact.m != fact.n and release is None:
        raise MfcliError(f"artifact {path} has a non-square strategy but no baseline/release_steps")
    if fact.causal:
        r = np.arange(n) if release is None else release
        if not is_causal_in_release_order(strategy=fact.strategy, decoder=fact.decoder, release_steps=r):
            raise MfcliError(f"artifact {path} is marked causal but is not lower-triangular in release order")
    solver = art.attrs.get("solver") or None
    desc = f"{art.strategy_name} from {Path(path).name}"
    if isinstance(solver, dict) and "gap" in solver:
        desc += f" (gap {solver['gap']:.1e})"
    return Strategy(
        art.strategy_name, fact, bool(fact.causal), desc, release_steps=release, source=str(path),
        solver=solver if isinstance(solver, dict) else None,
    )


def save_strategy(
    path: str | Path,
    strategy: Any,
    *,
    workload_name: str,
    workload_params: Mapping[str, Any] | None = None,
    command: str = "",
    force: bool = False,
    participation: Participation | None = None,
) -> str:
    """Write a strategy as a format-v1 artifact (atomically), so a baseline can be trained with
    and accounted like the optimum. The release order goes into group ``baseline`` (dataset
    ``release_steps``, checksummed); ``participation`` (a schema other than None) is stored as the
    artifact's ``participation`` attribute. Returns the file's SHA-256."""
    groups = {
        "baseline": {
            "datasets": {"release_steps": np.asarray(strategy.release_steps, dtype=np.float64)},
            "attrs": {
                "description": strategy.description,
                "release_order": "row i of C is released at step release_steps[i]; leaf first, then ancestors bottom-up",
            },
        }
    }
    return save_artifact(
        path, strategy.factorization, workload_name=workload_name, workload_params=workload_params,
        strategy_name=strategy.name, solver=strategy.solver, command=command, groups=groups, force=force,
        participation=participation,
    )


# ---------------------------------------------------------------------------------------------
# Structured artifacts (banded Toeplitz, BLT): the same format, header check and checksum-verifying
# read path, with the strategy's parameters in group ``structured`` instead of n x n matrices. The
# kinds (``mfcli.strategies.structured``: each kind's class, its recomputed numbers and its operator) sit
# above this module's file handling and below its readers, so they are imported where used.


@dataclass(frozen=True, eq=False)
class StructuredArtifact:
    """A loaded, verified structured artifact: the strategy, the workload and recomputed numbers.

    Attributes:
        sensitivity: single participation (the root attribute ``sensitivity``).
        schema_sensitivity: under the declared participation schema.
        loss: at single participation; schema_loss: at the schema's sensitivity.
    """

    path: Path
    strategy: Any
    workload: ToeplitzWorkload
    n: int
    attrs: Mapping[str, Any]
    participation: Participation
    sensitivity: Sensitivity
    schema_sensitivity: Sensitivity
    loss: Loss
    schema_loss: Loss
    groups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def workload_name(self) -> str:
        return self.workload.name

    @property
    def strategy_name(self) -> str:
        return str(self.strategy.kind)

    @property
    def kind(self) -> str:
        return str(self.strategy.kind)

    def operator(self) -> StructuredOperator:
        from mfcli.strategies.structured import StructuredOperator

        return StructuredOperator(self.strategy, self.workload, self.n)


def save_structured_artifact(
    path: str | Path,
    strategy: Any,
    *,
    workload: ToeplitzWorkload,
    n: int,
    participation: Participation | None = None,
    command: str = "",
    solver: Mapping[str, Any] | None = None,
    force: bool = False,
) -> str:
    """Write a structured strategy as a format-v1 artifact (no n x n datasets), atomically.
    Returns the SHA-256 of the written file.

    Raises:
        ArtifactError: the numbers the loader recomputes (:func:`mfcli.strategies.structured.evaluate`) are
            not finite or cannot be computed (e.g. a sensitivity that cannot be certified), or the
            file's image does not pass :func:`load_structured_artifact`: nothing is written, so the
            writer never leaves a file its own loader refuses.
    """
    from mfcli.strategies.structured import GROUP, evaluate, workload_params
    from mfcli.strategies.toeplitz import check_n

    n = check_n(n)
    schema = participation or SingleParticipation()
    schema.check(n)
    try:
        # the loader's own recomputation: what it would refuse is not written
        single, sens, loss, sloss = evaluate(strategy, workload, n, schema)
    except ArtifactError:
        raise
    except MfcliError as exc:
        raise ArtifactError(f"cannot write a structured artifact of this strategy: {exc}") from None
    attrs: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "n": n,
        "m": n,
        "workload_name": workload.name,
        "workload_params": workload_params(workload),
        "strategy_name": strategy.kind,
        "sensitivity": single.value,
        "loss_total": loss.total,
        "loss_mean": loss.mean,
        "loss_max": loss.max,
        "causal": True,
        "noise_operator": "C^-1 (gradient noise) and B (iterate noise), streamed by recursion",
        "solver": dict(solver or {}),
        "created_by": f"mfcli {_version()}",
        "created_utc": utc_now(),
        "command": command,
    }
    if participation is not None:
        attrs[PARTICIPATION_ATTR] = participation.to_json()
    gattrs = {"kind": strategy.kind, "schema_sensitivity": sens.value, "schema_sensitivity_exact": sens.exact,
              "schema_loss_mean": sloss.mean, "schema_loss_max": sloss.max}

    def build(f: Any) -> None:
        for k, val in attrs.items():
            f.attrs[k] = _to_attr(val)
        g = f.create_group(GROUP)
        for k, val in gattrs.items():
            g.attrs[k] = _to_attr(val)
        for name, data in strategy.parameters().items():
            _write_dataset(g, name, data)

    # The writer never writes what its own loader refuses: the file's image is read back by
    # load_structured_artifact (every check a reader makes) before the target is touched.
    _verify_image(hdf5_image(build), Path(path))
    with atomic_path(path, force=force) as tmp:
        image = hdf5_image(build)
        write_bytes_to(tmp, image, target=Path(path))
    return hashlib.sha256(image).hexdigest()


def _verify_image(image: bytes, target: Path) -> None:
    """Load the HDF5 ``image`` of a structured artifact as a reader would, from a private
    temporary file (removed after); :class:`ArtifactError` naming ``target`` if it does not load."""
    fd, name = tempfile.mkstemp(prefix="mfcli-verify-", suffix=".h5")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(image)
        load_structured_artifact(name)
    except ArtifactError as exc:
        raise ArtifactError(f"refusing to write {target}: the file would not verify on reading: "
                            f"{str(exc).replace(name + ': ', '')}") from None
    except OSError as exc:
        raise MfcliError(f"cannot verify {target} before writing it: {exc.strerror or exc}") from None
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass


def is_structured_file(path: str | Path) -> bool:
    """Whether the file at ``path`` holds a structured strategy (group ``structured``); False for
    anything unreadable (the regular loader then reports why)."""
    try:
        import h5py

        from mfcli.strategies.structured import GROUP
        from mfcli.util.validation import regular_file

        with h5py.File(regular_file(path), "r") as f:  # a FIFO would block: refused unopened
            return GROUP in f and "strategy" not in f
    except (OSError, ValueError):  # ArtifactError is a ValueError
        return False


def load_structured_artifact(path: str | Path) -> StructuredArtifact:
    """Read and verify a structured artifact: format, plain structure, every dataset's checksum,
    the parameters (strict ``from_parameters``), the workload and schema, and every stored number
    against its recomputation from the parameters.

    Raises:
        ArtifactError: naming the first check that fails.
    """
    import h5py

    from mfcli.strategies.structured import ATTR_RTOL as STRUCTURED_ATTR_RTOL
    from mfcli.strategies.structured import GROUP, MAX_PARAMETER_VALUES, evaluate, strategy_class
    from mfcli.strategies.toeplitz import check_n, toeplitz_workload

    p = Path(path)
    with reading(p) as f:
        if GROUP not in f or not isinstance(f[GROUP], h5py.Group):
            raise ArtifactError(f"{p} has no {GROUP!r} group")
        for name in f:
            if name != GROUP and isinstance(f[name], h5py.Dataset):
                raise ArtifactError(f"{p}: a structured artifact has no root datasets, found {name!r}")
        g = f[GROUP]
        # the declared size first, before any dataset is read: n within the structured
        # limit, and every parameter dataset stored in full and within the largest
        # parameter count any structured kind has (MAX_BANDS coefficients)
        n_attr = _decode(f.attrs.get("n"))
        if isinstance(n_attr, int) and not isinstance(n_attr, bool):  # else reported below, by name
            try:
                check_n(n_attr)
            except MfcliError as exc:
                raise ArtifactError(f"{p}: {exc}") from None
        for name in g:
            obj = g[name]
            if isinstance(obj, h5py.Dataset):
                problem = dataset_problem(obj, max_size=MAX_PARAMETER_VALUES)
                if problem is not None:
                    raise ArtifactError(f"{p}: dataset '{GROUP}/{name}' {problem}")
        params: dict[str, np.ndarray] = {}
        for name in g:
            obj = g[name]
            if not isinstance(obj, h5py.Dataset):
                raise ArtifactError(f"{p}: {GROUP}/{name} is not a dataset")
            params[name] = verified_data(obj, p, f"{GROUP}/{name}")
        gattrs = {k: _decode(v) for k, v in g.attrs.items()}
        attrs = {k: _decode(v) for k, v in f.attrs.items()}
        raw_participation = f.attrs.get(PARTICIPATION_ATTR)
    try:
        cls = strategy_class(str(gattrs.get("kind")))
        strategy = cls.from_parameters(params)
        n = attrs.get("n")
        if isinstance(n, bool) or not isinstance(n, int):
            raise MfcliError(f"attribute n must be an integer, got {n!r}")
        n = check_n(n)
        wparams = attrs.get("workload_params") or {}
        if not isinstance(wparams, dict):
            raise MfcliError(f"attribute workload_params must be a JSON object, got {wparams!r}")
        workload = toeplitz_workload(str(attrs.get("workload_name")), beta=wparams.get("beta", 0.9),
                                     lr=wparams.get("lr", "constant"))
        schema = read_participation(raw_participation, n)
        single, sens, loss, sloss = evaluate(strategy, workload, n, schema)
    except ArtifactError as exc:
        raise ArtifactError(f"{p}: {exc}") from None
    except MfcliError as exc:
        raise ArtifactError(f"{p}: {exc}") from None
    checks = [(attrs, "sensitivity", single.value), (attrs, "loss_total", loss.total), (attrs, "loss_mean", loss.mean),
              (attrs, "loss_max", loss.max), (gattrs, "schema_sensitivity", sens.value),
              (gattrs, "schema_loss_mean", sloss.mean), (gattrs, "schema_loss_max", sloss.max)]
    for where, key, recomputed in checks:
        stored = where.get(key)
        if isinstance(stored, bool) or not isinstance(stored, (int, float)) \
                or not np.isclose(stored, recomputed, rtol=STRUCTURED_ATTR_RTOL, atol=0):
            raise ArtifactError(f"{p}: stored {key} {stored!r} does not match the value recomputed from the "
                                f"parameters ({recomputed!r})")
    return StructuredArtifact(path=p, strategy=strategy, workload=workload, n=n, attrs=attrs, participation=schema,
                              sensitivity=single, schema_sensitivity=sens, loss=loss, schema_loss=sloss,
                              groups={GROUP: {"attrs": gattrs, "datasets": params}})


def load_any_artifact(path: str | Path) -> Artifact | StructuredArtifact:
    """The one reader of every kind: :func:`load_structured_artifact` for a structured file,
    else :func:`load_artifact`."""
    return load_structured_artifact(path) if is_structured_file(path) else load_artifact(path)
