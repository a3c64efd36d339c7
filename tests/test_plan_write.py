"""``mfcli.services.plan.write_artifact`` commits like every other artifact writer (mfcli.io.artifact.atomic_path):
the precondition is checked again at the commit, the file is fsynced before the rename, and a
refused or failed write leaves nothing behind (no temporary file either)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import h5py
import pytest

import mfcli.io.artifact
from mfcli.errors import MfcliError
from mfcli.services import account as session
from mfcli.services.plan import TrainingSetup, enumerate_candidates, evaluate, write_artifact

SETUP = TrainingSetup(examples=1000, batch=100, epochs=2, epsilon=2.0, workload="momentum",
                      batching=("fixed-order",), bands=(2,), buffers=())


@pytest.fixture(scope="module")
def banded():
    cands, _ = enumerate_candidates(SETUP)
    cand = next(c for c in cands if c.key == "banded-2")
    return evaluate(SETUP, cand)


def test_write_fsyncs_then_renames_and_refuses_an_existing_target(tmp_path: Path, banded,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = mfcli.io.artifact._fsync_file
    monkeypatch.setattr(mfcli.io.artifact, "_fsync_file", lambda p: (synced.append(Path(p).name), real(p)))
    out = tmp_path / "plan.h5"
    info = write_artifact(SETUP, banded, out)
    assert info["epsilon"] <= SETUP.epsilon and out.exists()
    assert synced, "the committed file was not fsynced"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.h5"]
    with pytest.raises(MfcliError, match="exists"):
        write_artifact(SETUP, banded, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.h5"]
    write_artifact(SETUP, banded, out, force=True)
    with h5py.File(out, "r") as f:
        assert "accounting" in f


def test_a_writer_that_finishes_first_wins_and_nothing_is_left(tmp_path: Path, banded,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process creates the target while this one is accounting: the commit refuses
    (without force), the other file is untouched and no temporary file remains."""
    out = tmp_path / "plan.h5"
    real = session.account

    def racing(*args, **kwargs):
        out.write_bytes(b"the other writer's artifact")
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "account", racing)
    with pytest.raises(MfcliError, match="exists"):
        write_artifact(SETUP, banded, out)
    assert out.read_bytes() == b"the other writer's artifact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.h5"]


def test_the_commit_waits_for_a_concurrent_writer_then_refuses(tmp_path: Path, banded,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A concurrent writer holds the directory lock (as every mfcli writer does from its check to
    its rename) when this one commits: the commit waits, then sees the file and refuses. Without
    the lock both would report success and one artifact would silently replace the other."""
    out = tmp_path / "plan.h5"
    real = session.record_to_artifact
    holding = threading.Event()

    def other_writer() -> None:
        with mfcli.io.artifact.atomic_path(out) as t:
            holding.set()
            time.sleep(1.0)
            t.write_bytes(b"the other writer's artifact")

    def racing(*args, **kwargs):
        group = real(*args, **kwargs)
        thread.start()
        holding.wait()
        return group

    thread = threading.Thread(target=other_writer)
    monkeypatch.setattr(session, "record_to_artifact", racing)
    try:
        with pytest.raises(MfcliError, match="exists"):
            write_artifact(SETUP, banded, out)
    finally:
        thread.join()
    assert out.read_bytes() == b"the other writer's artifact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.h5"]
