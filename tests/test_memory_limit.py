"""MMCC's memory estimate and the --max-memory refusal (issue 15, item 4).

The estimate is checked against an independent measurement (tracemalloc's peak of the
allocations actually made, numpy's included), and the limit against real runs: a run under the
limit gives the same epsilon as an unlimited one, a run over it is refused with the estimate."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.accounting.mmcc import (
    _MEMORY_SLACK,
    _bytes_per_distinct,
    collect_tail_pairs,
    mmcc,
    prepare_strategy,
    tail_pairs_memory,
)
from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.model.workloads import build_workload
from mfcli.strategies.baselines import build_strategy
from mfcli.util.memory import MemoryLimitError, default_max_memory, format_size, parse_size, physical_memory


@pytest.mark.parametrize("text, expected", [
    ("1000", 1000), ("512K", 512 * 2**10), ("4G", 4 * 2**30), ("1.5GiB", 3 * 2**29), ("2gb", 2 * 2**30),
    (" 3 M ", 3 * 2**20), ("1T", 2**40),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-1G", "1Q", "G", "1.2.3M", "nan"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(MfcliError, match="memory size"):
        parse_size(text)


@pytest.mark.parametrize("nbytes, shown", [
    (2**30, "1.00 GiB"), (2**30 + 1, "1.01 GiB"), (1.234 * 2**20, "1.24 MiB"), (999, "999 B"), (123.4 * 2**30, "124 GiB"),
])
def test_format_size_rounds_up(nbytes: float, shown: str) -> None:
    assert format_size(nbytes) == shown


def test_default_limit_is_half_of_physical_memory() -> None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        pytest.skip("no /proc/meminfo to check against")
    kib = int(next(ln for ln in meminfo.read_text().splitlines() if ln.startswith("MemTotal:")).split()[1])
    total = physical_memory()
    assert total is not None and abs(total - kib * 1024) <= 0.01 * kib * 1024
    assert default_max_memory() == int(total * 0.5)


def _strategy(name: str, n: int) -> np.ndarray:
    c = np.asarray(build_strategy(name, build_workload("prefix", n)).factorization.strategy)
    return np.tril(np.abs(c))


CASES = [("optimal", 16, 401), ("optimal", 64, 401), ("optimal", 64, 20), ("optimal", 128, 20), ("identity", 64, 400),
         ("sqrt", 48, 100)]


@pytest.mark.parametrize("name, n, resolution", CASES)
def test_estimate_bounds_the_measured_peak(name: str, n: int, resolution: int) -> None:
    c = _strategy(name, n)
    tracemalloc.start()
    try:
        prep = prepare_strategy(c)
        pairs = collect_tail_pairs(prep, resolution=resolution)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    fixed, worst = tail_pairs_memory(prep, resolution=resolution)
    distinct = pairs.counts.shape[0]
    estimate = fixed + distinct * int(_MEMORY_SLACK[0] * _bytes_per_distinct(resolution + 2))
    assert peak <= estimate <= worst
    if pairs.count == distinct:
        assert estimate == pytest.approx(worst, rel=1e-3)  # every pair distinct: the worst case is reached
    if n >= 64 and name == "optimal":
        assert estimate <= 1.6 * peak  # an estimate, not a wild overstatement
    # G and C dominate the fixed part: it grows like n^2.
    assert fixed >= 3 * 8 * n * n


def test_mmcc_refuses_before_allocating_and_runs_under_the_limit() -> None:
    c = _strategy("optimal", 48)
    prep = prepare_strategy(c)
    free = mmcc(prep, sigma=1.0, sampling=0.1)
    fixed, worst = tail_pairs_memory(prep, resolution=free.tail_resolution)
    # Below the fixed part: refused before anything is allocated.
    with pytest.raises(MemoryLimitError,
                       match=rf"needs about {format_size(fixed)} of memory, over the limit of {format_size(fixed // 2)}"):
        mmcc(prep, sigma=1.0, sampling=0.1, max_memory=fixed // 2)
    # Between the fixed part and the worst case: refused while the distinct problems are collected.
    with pytest.raises(MemoryLimitError, match="distinct tail problems by row"):
        mmcc(prep, sigma=1.0, sampling=0.1, max_memory=(fixed + worst) // 2)
    limited = mmcc(prep, sigma=1.0, sampling=0.1, max_memory=worst)
    assert limited.epsilon == free.epsilon


def test_mmcc_states_its_estimate_up_front() -> None:
    lines: list[str] = []
    mmcc(_strategy("optimal", 16), sigma=1.0, sampling=0.1, progress=lines.append, max_memory=2**30)
    assert "memory" in lines[0] and "limit 1.00 GiB" in lines[0]


def test_cli_refuses_with_the_estimate_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["account", "-s", "optimal", "-n", "32", "--sigma", "1", "--sampling", "0.1",
                                 "--max-memory", "256K", "-q"])
    assert r.exit_code == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: collecting MMCC's tail events")
    assert "over the limit of 256 KiB" in lines[0]
    assert "raise the memory limit" in lines[0] and "Traceback" not in r.stderr and r.stdout == ""
    ok = CliRunner().invoke(app, ["account", "-s", "optimal", "-n", "32", "--sigma", "1", "--sampling", "0.1",
                                  "--max-memory", "1G", "-q", "--json"])
    assert ok.exit_code == 0, ok.stderr


@pytest.mark.parametrize("args, code, message", [
    (["--max-memory", "2G"], 2, "--max-memory applies to MMCC only, which needs --sampling"),
    (["--sampling", "0.1", "--max-memory", "lots"], 2, "--max-memory: a memory size must be"),  # its own range: usage
])
def test_cli_max_memory_usage(args: list[str], code: int, message: str) -> None:
    r = CliRunner().invoke(app, ["account", "-s", "tree", "-n", "8", "--sigma", "2", *args, "-q"])
    assert r.exit_code == code and message in r.stderr, r.stderr
