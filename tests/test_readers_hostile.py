"""Readers against hostile files (issue 26, items 8 and 9): a path that is not a regular file
(a FIFO, a device, a directory) is refused before it is opened, by every reader; a dataset is
checked from its header (dtype, declared size against what the file stores, the declared n, the
kind's limits) before any of its data is read, so a small file declaring a huge dataset costs
neither memory nor time. Memory is measured with tracemalloc (numpy reports its allocations to
it), never wall time."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import (
    check_datasets,
    file_sha256,
    is_structured_file,
    load_any_artifact,
    load_artifact,
    load_structured_artifact,
    save_artifact,
    save_structured_artifact,
)
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.inspect import inspect_artifact
from mfcli.strategies.toeplitz import MAX_BANDS, BandedToeplitz, toeplitz_workload
from mfcli.training.samplers import accounting_records
from mfcli.util.validation import regular_file

ROOT = Path(__file__).resolve().parent.parent
#: Peak traced memory a refusal may take: far below what the declared datasets would need (the
#: smallest declaration below is 80 MB; most are gigabytes).
CHEAP = 20 * 2**20


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Path:
    w = prefix_workload(8)
    path = tmp_path_factory.mktemp("dense") / "p8.h5"
    save_artifact(path, optimal_factorization(w.matrix, tol=1e-10).factorization,
                  workload_name=w.name, workload_params=w.params, strategy_name="optimal")
    return path


@pytest.fixture(scope="module")
def structured(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("structured") / "banded.h5"
    save_structured_artifact(path, BandedToeplitz(np.array([1.0, 0.4, 0.2])), workload=toeplitz_workload("prefix"),
                             n=64)
    return path


def _within(fn: Callable[[], Any], seconds: float = 60) -> Any:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it has not returned after
    ``seconds`` (a bound for a loaded machine: a reader blocked on a FIFO never returns)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the reader blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- item 9: not a regular file ---------------------------------------------------------------------

READERS: dict[str, Callable[[Path], Any]] = {
    "load_artifact": load_artifact,
    "load_structured_artifact": load_structured_artifact,
    "load_any_artifact": load_any_artifact,
    "inspect_artifact": inspect_artifact,
    "check_datasets": check_datasets,
    "file_sha256": file_sha256,
    "accounting_records": accounting_records,
}


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe.h5"
    os.mkfifo(path)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_fifo_unopened(fifo, reader):
    with pytest.raises(MfcliError, match=r"is a FIFO \(named pipe\); give a regular file"):
        _within(lambda: READERS[reader](fifo))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_is_structured_file_does_not_block_on_a_fifo(fifo):
    assert _within(lambda: is_structured_file(fifo)) is False


@pytest.mark.parametrize("path, kind", [("/dev/null", "a character device"), ("/dev/zero", "a character device")])
def test_devices_are_refused(path, kind):
    if not os.path.exists(path):
        pytest.skip(f"no {path}")
    with pytest.raises(ArtifactError, match=f"is {kind}"):
        _within(lambda: load_any_artifact(Path(path)))


def test_a_directory_and_a_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="is a directory"):
        load_artifact(tmp_path)
    with pytest.raises(ArtifactError, match="does not exist"):
        load_artifact(tmp_path / "nothing.h5")


def test_a_symlink_to_a_regular_file_still_reads(tmp_path, dense):
    link = tmp_path / "link.h5"
    link.symlink_to(dense)
    assert regular_file(link) == link
    assert load_artifact(link).n == 8


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
@pytest.mark.parametrize("args", [
    ["inspect", "{fifo}"],
    ["account", "{fifo}", "--sigma", "2"],
    ["compress", "{fifo}", "-k", "2", "-r", "1"],
    ["account", "--strategy-file-placeholder"],
])
def test_cli_refuses_a_fifo_with_one_line(tmp_path, fifo, args):
    if args == ["account", "--strategy-file-placeholder"]:
        npy = tmp_path / "c.npy"
        os.mkfifo(npy)
        args = ["account", str(npy), "--sigma", "2"]
        shown = npy
    else:
        args = [a.replace("{fifo}", str(fifo)) for a in args]
        shown = fifo
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "mfcli", *args], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [res.stderr.strip()], res.stderr
    assert f"{shown} is a FIFO (named pipe)" in res.stderr


# --- item 8: sizes checked before reading ---------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(what ``fn`` returned or raised, peak traced bytes while it ran)."""
    tracemalloc.start()
    try:
        try:
            out: Any = fn()
        except Exception as exc:
            out = exc
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _dense_declaring(dense: Path, dst: Path, n: int, *, how: str) -> Path:
    """``dense`` with a workload (and n) of n x n declared but not stored (``how``: unallocated
    contiguous, empty chunked, or gzip-compressed zeros)."""
    path = _copy(dense, dst)
    with h5py.File(path, "r+") as f:
        for name in ("workload", "strategy", "decoder"):  # all three fit the declared n
            del f[name]
            if how == "unallocated":
                f.create_dataset(name, shape=(n, n), dtype="f8")
            elif how == "chunked":
                f.create_dataset(name, shape=(n, n), dtype="f8", chunks=(64, 64))
            else:
                ds = f.create_dataset(name, shape=(n, n), dtype="f8", chunks=(256, 256), compression="gzip")
                ds[:256, :256] = 0.0
        f.attrs["n"] = n
    return path


@pytest.mark.parametrize("how", ["unallocated", "chunked", "gzip"])
@pytest.mark.parametrize("reader", ["load_artifact", "inspect_artifact", "check_datasets"])
def test_a_small_file_declaring_a_huge_dense_matrix_is_refused_cheaply(tmp_path, dense, how, reader):
    n = 100_000  # 80 GB declared
    path = _dense_declaring(dense, tmp_path / "bomb.h5", n, how=how)
    assert path.stat().st_size < 2**20
    out, peak = _peak(lambda: READERS[reader](path))
    assert peak < CHEAP, peak
    if reader == "load_artifact":
        assert isinstance(out, ArtifactError) and "the file stores" in str(out), out
    elif reader == "inspect_artifact":
        assert not isinstance(out, Exception), out
        assert any("dataset 'workload' declares" in p and "the file stores" in p for p in out.problems), out.problems
        assert not out.ok
    else:
        assert ("workload", False) in out


def test_a_root_matrix_that_does_not_fit_the_declared_n_is_refused_before_reading(tmp_path, dense):
    path = _copy(dense, tmp_path / "wrong-n.h5")
    with h5py.File(path, "r+") as f:
        f.attrs["n"] = 5
    with pytest.raises(ArtifactError, match=r"dataset 'workload' has shape \(8, 8\), but the artifact declares n = 5"):
        load_artifact(path)
    report = inspect_artifact(path)  # inspect reads the (stored-in-full) matrices and reports the forged n
    assert not report.ok and any("stored n" in p for p in report.problems), report.problems


def test_a_dataset_that_is_not_numbers_is_refused(tmp_path, dense):
    path = _copy(dense, tmp_path / "strings.h5")
    with h5py.File(path, "r+") as f:
        f.create_dataset("extra", data=np.array([b"x" * 100] * 10))
    with pytest.raises(ArtifactError, match=r"dataset 'extra' is not numeric \(dtype \|S100\)"):
        load_artifact(path)


def _structured_declaring(src: Path, dst: Path, *, n: int | None = None, coefs: int | None = None,
                          how: str = "gzip") -> Path:
    path = _copy(src, dst)
    with h5py.File(path, "r+") as f:
        if n is not None:
            f.attrs["n"] = n
        if coefs is not None:
            del f["structured/coefs"]
            if how == "gzip":
                ds = f.create_dataset("structured/coefs", shape=(coefs,), dtype="f8", chunks=(min(coefs, 4096),),
                                      compression="gzip")
                ds[0] = 1.0
            else:
                f.create_dataset("structured/coefs", shape=(coefs,), dtype="f8")
    return path


@pytest.mark.parametrize("case, kwargs, message", [
    # the sweep's case: n = 10^7 and 4,096 coefficients in an 8 KB file (35 s of CPU before)
    ("sweep", {"n": 10**7, "coefs": MAX_BANDS, "how": "gzip"}, "the file stores"),
    ("unallocated", {"coefs": MAX_BANDS, "how": "unallocated"}, "the file stores 0 bytes"),
    ("past the kind's limit", {"coefs": 10**8, "how": "unallocated"}, f"more than the {MAX_BANDS} this kind allows"),
    ("past the structured n", {"n": 10**8}, "n must be at most"),
])
def test_a_structured_file_declaring_too_much_is_refused_cheaply(tmp_path, structured, case, kwargs, message):
    path = _structured_declaring(structured, tmp_path / "bomb.h5", **kwargs)
    assert path.stat().st_size < 64 * 2**10
    out, peak = _peak(lambda: load_structured_artifact(path))
    assert isinstance(out, ArtifactError) and message in str(out), out
    assert peak < CHEAP, peak
    # the CPU: far below the seconds a 10^7-step evaluation takes (a count, not a clock: the
    # refusal reads no dataset, so the loader never reaches the O(n) evaluation)
    calls = []
    import mfcli.strategies.structured as st

    original = st.evaluate
    st.evaluate = lambda *a, **k: calls.append(a) or original(*a, **k)  # type: ignore[assignment]
    try:
        with pytest.raises(ArtifactError):
            load_structured_artifact(path)
    finally:
        st.evaluate = original  # type: ignore[assignment]
    assert calls == []


def test_the_untouched_files_still_load(dense, structured):
    assert load_artifact(dense).n == 8
    assert load_structured_artifact(structured).n == 64
    assert all(ok for _, ok in check_datasets(dense))
    assert inspect_artifact(dense).ok
