"""``plan`` against hostile input (issue 26): a --scheduler peer that is not a Dask scheduler
(local sockets speaking HTTP, silence, garbage, an exabyte length), sizes past plan's limit,
a target epsilon too large to calibrate, a delta at or above 1/examples, an --out path with
terminal controls, and the bound on a noise stream's model dimension. Each case failed before
its fix (a hang, exit 70, a wrong message, raw escape sequences)."""
from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import mfcli.services.plan as plan_module
from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.services.plan import TrainingSetup, probe_scheduler
from mfcli.util.limits import PLAN_MAX_N
from mfcli.util.memory import MemoryLimitError

runner = CliRunner()
TINY = ["plan", "--examples", "100", "--batch", "10", "--epochs", "1", "--workers", "0", "-q"]


# --- --scheduler: a bounded probe that names a non-Dask peer --------------------------------------


@pytest.fixture
def peer() -> Iterator:
    """Start a local TCP server that sends ``reply`` (None: nothing) on every connection and then
    keeps the connection open; yields a function returning its tcp:// address."""
    servers: list[socket.socket] = []
    stop = threading.Event()

    def start(reply: bytes | None) -> str:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        srv.settimeout(0.2)
        servers.append(srv)
        held: list[socket.socket] = []

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except (TimeoutError, OSError):
                    continue
                if reply is not None:
                    conn.sendall(reply)
                held.append(conn)  # kept open, like a server waiting for a request
            for c in held:
                c.close()

        threading.Thread(target=serve, daemon=True).start()
        return f"tcp://127.0.0.1:{srv.getsockname()[1]}"

    yield start
    stop.set()
    for srv in servers:
        srv.close()


HTTP = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
PEERS = {
    "silent (an HTTP server waiting for a request)": (None, "sent no Dask handshake within"),
    "an HTTP reply": (HTTP, "declares 3543824036068086856 bytes"),
    "a 3 EiB length": (struct.pack("<Q", 3 << 60) + b"\0" * 64, "declares 3458764513820540928 bytes"),
    "garbage of a plausible length": (struct.pack("<Q", 40) + b"\x01" * 40, "is not a Dask handshake"),
    "a prelude with a bad map": (struct.pack("<QQQ", 24, 1, 8) + b"\x81\xa1a\x01" + b"\0" * 4, "is not a Dask handshake"),
}


@pytest.mark.parametrize("name", list(PEERS))
def test_probe_names_a_non_dask_peer(peer, name):
    reply, message = PEERS[name]
    with pytest.raises(MfcliError, match="is not a Dask scheduler") as err:
        probe_scheduler(peer(reply), timeout=1.0)
    assert message in str(err.value)


def test_probe_names_a_peer_that_closes_at_once():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    threading.Thread(target=lambda: srv.accept()[0].close(), daemon=True).start()
    with pytest.raises(MfcliError, match="closed the connection without a Dask handshake"):
        probe_scheduler(f"tcp://127.0.0.1:{srv.getsockname()[1]}", timeout=5.0)
    srv.close()


def test_probe_refused_and_malformed_addresses():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    srv.close()  # nothing listens there now
    with pytest.raises(MfcliError, match=f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"):
        probe_scheduler(f"tcp://127.0.0.1:{port}", timeout=1.0)
    with pytest.raises(MfcliError, match="cannot reach the Dask scheduler at nowhere"):
        probe_scheduler("nowhere", timeout=1.0)


def test_probe_accepts_a_real_scheduler():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None) as cl:
        probe_scheduler(cl.scheduler_address, timeout=10.0)  # no exception: a Dask handshake


@pytest.mark.parametrize("name", ["silent (an HTTP server waiting for a request)", "a 3 EiB length"])
def test_plan_scheduler_at_a_non_dask_peer_is_one_error_line(peer, monkeypatch, name):
    pytest.importorskip("distributed")
    monkeypatch.setattr(plan_module, "SCHEDULER_TIMEOUT_S", 1.0)
    res = runner.invoke(app, [*TINY[:-3], "--epsilon", "2", "--scheduler", peer(PEERS[name][0]), "-q"])
    assert res.exit_code == 1, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the peer at tcp://127.0.0.1:"), res.stderr
    assert "is not a Dask scheduler" in lines[0] and "out of memory" not in lines[0]


# --- sizes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"examples": 100, "batch": 10, "epochs": 1_000_000}, f"n = 10000000 steps, over plan's limit of {PLAN_MAX_N}"),
    ({"examples": 100, "batch": 10, "epochs": 100_001}, "train at most 100000 epochs of 10 steps"),
    ({"examples": 2**53, "batch": 1, "epochs": 1}, f"use batches of at least {2**53 // PLAN_MAX_N + 1}"),
    ({"examples": 100, "batch": 10, "steps": 2**53 - 2**53 % 10}, "over plan's limit"),
])
def test_plan_refuses_sizes_past_its_limit(kwargs, message):
    with pytest.raises(MfcliError, match="over plan's limit") as err:
        TrainingSetup(epsilon=1.0, **kwargs)
    assert message in str(err.value)


def test_plan_limit_is_inclusive():
    assert TrainingSetup(examples=100, batch=10, epochs=PLAN_MAX_N // 10, epsilon=1.0).n == PLAN_MAX_N


def test_cli_refuses_an_absurd_epoch_count_up_front():
    res = runner.invoke(app, [*TINY[:5], "--epochs", "1000000", "--epsilon", "2", "-q"])
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [res.stderr.strip()] and "over plan's limit" in res.stderr


# --- messages ---------------------------------------------------------------------------------------


def test_a_huge_target_epsilon_is_not_told_to_raise_the_target():
    res = runner.invoke(app, [*TINY, "--epsilon", "1e9", "--batching", "fixed-order", "--bands", "2",
                              "--buffers", "2"])
    assert res.exit_code == 1
    line = res.stderr.strip()
    assert "raise the target" not in line and "give a smaller epsilon" in line, line


@pytest.mark.parametrize("delta, warned", [(0.01, True), (0.1, True), (1e-3, False), (0.0099, False)])
def test_delta_at_or_above_one_over_examples_warns(delta, warned, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*TINY, "--epsilon", "4", "--delta", str(delta), "--batching", "fixed-order",
                              "--bands", "2", "--buffers", "2"])
    assert res.exit_code == 0, res.stderr
    assert ("warning: delta" in res.stderr) == warned, res.stderr
    if warned:
        assert "1/examples = 0.01" in res.stderr


def test_out_path_with_terminal_controls_is_shown_escaped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "run\x1b[2J\u202eevil.h5"
    res = runner.invoke(app, [*TINY, "--epsilon", "4", "--batching", "fixed-order", "--bands", "2", "--buffers", "2",
                              "--out", name])
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / name).is_file()
    assert "\x1b" not in res.stdout and "\u202e" not in res.stdout
    assert "wrote run\\x1b[2J\\u202eevil.h5 with accounting record" in res.stdout


# --- a noise stream's model dimension (noise.check_dimension, then the stream's memory budget) -------


@pytest.mark.parametrize("d, ok", [
    (10**13, False),          # the state alone: about 110 TiB
    (10**6, True),
])
def test_model_dimension_bound(d, ok):
    from mfcli.io.artifact import shipped_artifact
    from mfcli.training.noise import noise_stream

    if ok:
        assert noise_stream(shipped_artifact("prefix-n256"), kind="gradient", d=d, seed=1).d == d
    else:
        with pytest.raises(MemoryLimitError, match="needs about"):
            noise_stream(shipped_artifact("prefix-n256"), kind="gradient", d=d, seed=1)


@pytest.mark.parametrize("d", [0, -1, 2.5, "7", True, 10**400])
def test_model_dimension_type_and_range(d):
    from mfcli.training.noise import check_dimension

    with pytest.raises(MfcliError, match=r"d \(the number of model parameters\)"):
        check_dimension(d)
