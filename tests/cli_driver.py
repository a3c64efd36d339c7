"""Run the mfcli CLI in a subprocess with test seams patched in (used by the signal, disk and
concurrency tests; not a test module). The seams are the artifact writer's own functions, so the
code that runs is the production path, only paused at a chosen point:

* ``DRIVER_PAUSE_AT``: ``build`` (inside HDF5 dataset writing, in memory), ``write`` (inside the
  os.write of the bytes), ``commit`` (after the fsync, before the rename), ``after`` (after the
  rename, while the directory is fsynced); with ``DRIVER_MARKER``: the file created when the
  pause begins, so the test sends its signal exactly there. The pause lasts ``DRIVER_PAUSE_S``.
* ``DRIVER_BARRIER``: ``DIR:COUNT``: before taking the writer's lock, create a file in DIR and
  wait until COUNT processes have done so, so that every process has passed its early checks
  before any of them writes (the race the lock must settle).
* ``DRIVER_READY``: a file created just before the CLI starts (imports done).
* ``DRIVER_SIGINT``: restore Python's SIGINT handler (a shell's background job starts with
  SIGINT ignored, which the CLI, like any program, then keeps).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import mfcli.io.artifact as art
from mfcli.cli.app import main

_paused = False


def _pause() -> None:
    global _paused
    if _paused:
        return
    _paused = True
    Path(os.environ["DRIVER_MARKER"]).touch()
    time.sleep(float(os.environ.get("DRIVER_PAUSE_S", "3")))


stage = os.environ.get("DRIVER_PAUSE_AT")
if stage == "build":
    _orig_wd = art._write_dataset

    def _write_dataset(*a, **k):  # type: ignore[no-untyped-def]
        _pause()
        return _orig_wd(*a, **k)

    art._write_dataset = _write_dataset
elif stage == "write":
    _orig_w = art._os_write

    def _os_write(fd, data):  # type: ignore[no-untyped-def]
        _pause()
        return _orig_w(fd, data)

    art._os_write = _os_write
elif stage == "commit":
    _orig_fs = art._fsync_file

    def _fsync_file(path):  # type: ignore[no-untyped-def]
        _orig_fs(path)
        _pause()

    art._fsync_file = _fsync_file
elif stage == "after":
    _orig_fd = art._fsync_dir

    def _fsync_dir(path):  # type: ignore[no-untyped-def]
        _orig_fd(path)
        _pause()

    art._fsync_dir = _fsync_dir

barrier = os.environ.get("DRIVER_BARRIER")
if barrier:
    bdir, count = barrier.rsplit(":", 1)
    _orig_lock = art.directory_lock

    @contextmanager
    def directory_lock(directory):  # type: ignore[no-untyped-def]
        Path(bdir, str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(os.listdir(bdir)) < int(count) and time.monotonic() < deadline:
            time.sleep(0.02)
        with _orig_lock(directory):
            yield

    art.directory_lock = directory_lock

# Guarded: a command that starts worker processes (plan's pool, spawn start method) re-imports
# this script in each worker as __mp_main__, which must not run the command again.
if __name__ == "__main__":
    if os.environ.get("DRIVER_SIGINT"):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("DRIVER_READY"):
        Path(os.environ["DRIVER_READY"]).touch()
    sys.argv[0] = "mfcli"
    main()
