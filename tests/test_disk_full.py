"""A full disk at any point of a write: one ``error:`` line, exit 1, no file (or the original
untouched), no temporary file, no crash.

Two ways: fault injection (the writer's ``os.write``/``fsync`` raise ENOSPC at a chosen call, in
process and through the CLI), and a real 200 KiB tmpfs filled to different levels, driven by
real subprocesses (skipped, saying why, where the machine does not allow mounting one).
Oracles: the directory listing, the original bytes, ``load_artifact`` on what was written.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import mfcli.io.artifact as art
from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.io.artifact import append_group, load_artifact, save_artifact
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.dense import optimal_factorization

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def fact():
    return optimal_factorization(prefix_workload(16).matrix, tol=1e-10).factorization


@pytest.fixture
def artifact(tmp_path, fact):
    path = tmp_path / "a.h5"
    save_artifact(path, fact, workload_name="prefix", workload_params={}, strategy_name="optimal")
    return path


def _enospc_after(monkeypatch, calls: int, where: str = "_os_write") -> None:
    """Let ``calls`` calls through, then fail every later one with ENOSPC."""
    count = {"n": 0}
    real = getattr(art, where) if where == "_os_write" else os.fsync

    def failing(*args):  # type: ignore[no-untyped-def]
        count["n"] += 1
        if count["n"] > calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args)

    if where == "_os_write":
        monkeypatch.setattr(art, "_os_write", failing)
        monkeypatch.setattr(art, "_WRITE_CHUNK", 4096)  # several writes, so a failure can land mid-file
    else:
        monkeypatch.setattr(art.os, "fsync", failing)


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("where,calls", [("_os_write", 0), ("_os_write", 1), ("_os_write", 3), ("fsync", 0)])
def test_save_on_full_disk_leaves_nothing(tmp_path, fact, monkeypatch, where, calls):
    _enospc_after(monkeypatch, calls, where)
    with pytest.raises(MfcliError, match="No space left on device"):
        save_artifact(tmp_path / "x.h5", fact, workload_name="prefix", strategy_name="optimal")
    assert _files(tmp_path) == []


@pytest.mark.parametrize("where,calls", [("_os_write", 0), ("_os_write", 2), ("fsync", 0)])
def test_append_on_full_disk_keeps_the_original(artifact, monkeypatch, where, calls):
    before = artifact.read_bytes()
    _enospc_after(monkeypatch, calls, where)
    with pytest.raises(MfcliError, match="No space left on device"):
        append_group(artifact, "accounting/r1", attrs={"epsilon": 1.0})
    assert artifact.read_bytes() == before
    assert _files(artifact.parent) == ["a.h5"]


@pytest.mark.parametrize("calls", [0, 2])
def test_cli_full_disk_one_line_exit_1(tmp_path, monkeypatch, calls):
    _enospc_after(monkeypatch, calls)
    out = tmp_path / "o.h5"
    r = runner.invoke(app, ["optimize", "-w", "prefix", "--n", "16", "--out", str(out), "-q"])
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [f"error: cannot write {out}: No space left on device; nothing was written"]
    assert _files(tmp_path) == []


def test_cli_account_write_full_disk(artifact, monkeypatch):
    before = artifact.read_bytes()
    _enospc_after(monkeypatch, 1)
    r = runner.invoke(app, ["account", str(artifact), "--sigma", "3", "--write"])
    assert r.exit_code == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: cannot write") and r.stderr.count("error:") == 1
    assert "Traceback" not in r.stderr
    assert artifact.read_bytes() == before and _files(artifact.parent) == ["a.h5"]


# ----------------------------------------------------------------------------- a real tmpfs

@pytest.fixture
def small_fs(tmp_path):
    """A 200 KiB tmpfs (root or CAP_SYS_ADMIN needed; skipped otherwise, with the reason)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if not shutil.which("mount"):
        pytest.skip("no mount command on this machine")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "mfcli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _fill(mnt: Path, leave: int) -> None:
    """Fill the file system so that about ``leave`` bytes stay free."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    size = max(free - leave, 0)
    with open(mnt / "filler", "wb") as fh:
        try:
            fh.write(b"\0" * size)
        except OSError:
            pass


@pytest.mark.parametrize("leave", [0, 8 << 10, 40 << 10, 90 << 10, 120 << 10])
def test_tmpfs_optimize_at_every_fill_level(small_fs, tmp_path, leave):
    _fill(small_fs, leave)
    out = small_fs / "x.h5"
    r = _cli("optimize", "-w", "prefix", "--n", "96", "--out", str(out), "-q", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert sorted(p.name for p in small_fs.iterdir() if p.name != "filler") == (["x.h5"] if r.returncode == 0 else [])
    if r.returncode == 0:
        assert load_artifact(out).n == 96
    else:
        assert r.stderr.splitlines() == [f"error: cannot write {out}: No space left on device; nothing was written"]


def test_tmpfs_account_write_keeps_the_original(small_fs, tmp_path, fact):
    path = small_fs / "a.h5"
    save_artifact(path, optimal_factorization(prefix_workload(64).matrix, tol=1e-8).factorization,
                  workload_name="prefix", workload_params={}, strategy_name="optimal")
    before = path.read_bytes()
    _fill(small_fs, 16 << 10)
    r = _cli("account", str(path), "--sigma", "3", "--write", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "No space left on device" in r.stderr, r.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in small_fs.iterdir()) == ["a.h5", "filler"]


def test_tmpfs_compare_table_full_disk(small_fs, tmp_path):
    _fill(small_fs, 0)
    out = small_fs / "t.csv"
    r = _cli("compare", "-w", "prefix", "--n", "8", "-s", "identity", "--out", str(out), "--format", "csv", "-q",
             cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]
