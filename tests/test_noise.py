"""Noise streams: every row against an independent dense computation from the same Z.

Oracles: Z is drawn here directly with numpy's Philox (key = seed, counter = (0, 0, j, 0)), not
through mfcli; the operators are built here from the matrices (C^-1 Z by a triangular solve,
B Z and B^ Z by a product with a decoder assembled entry by entry from band, u, v, and
C^^-1 Z = A^-1 (B^ Z) by a second triangular solve).
"""
from __future__ import annotations

import os
import pickle
import re
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.linalg
from hypothesis import given
from hypothesis import strategies as st

from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import save_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.workloads import learning_rates, momentum_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.training.noise import (
    AccountedOperator,
    NoiseState,
    StaleNoiseStateWarning,
    noise_matrix,
    noise_row,
    noise_stream,
)
from mfcli.training.samplers import record_noise_stream

from noise_oracles import decoder_from_layout, philox_z

SEED = 20240531


# ---------------------------------------------------------------------------------------------
# Independent helpers




def layout_for(decoder: np.ndarray, k: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Band of the exact decoder plus a rank-r truncated SVD of its part outside the band."""
    n = decoder.shape[0]
    band = np.zeros((n, k))
    for i in range(k):
        band[i:, i] = np.diagonal(decoder, -i)
    outside = np.tril(decoder, -k)
    left, s, right = np.linalg.svd(outside)
    return band, left[:, :r] * s[:r], right[:r].T.copy()


def dense_loss(fact: Factorization) -> float:
    """sens(C)^2 ||B||_F^2 of the dense root, from the matrices."""
    return float(np.max(np.sum(fact.strategy**2, axis=0)) * np.sum(fact.decoder**2))


def compressed_group(
    workload: np.ndarray, decoder: np.ndarray, k: int, r: int, *, dense_loss: float, sens_factor: float = 1.0
) -> dict:
    band, u, v = layout_for(decoder, k, r)
    b_hat = decoder_from_layout(band, u, v)
    c_hat = scipy.linalg.solve_triangular(b_hat, workload, lower=True)
    sens = float(np.sqrt(np.max(np.sum(c_hat**2, axis=0))))
    return {
        "datasets": {"band": band, "u": u, "v": v},
        "attrs": {
            "band": k,
            "rank": r,
            "sensitivity": sens * sens_factor,
            "loss_total": sens**2 * float(np.sum(b_hat**2)),
            "loss_increase": sens**2 * float(np.sum(b_hat**2)) / dense_loss - 1.0,
        },
    }


def lower_random(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.tril(rng.uniform(0.2, 1.0, (n, n)))
    a[np.diag_indices(n)] += 1.0
    return a


WORKLOADS = {
    # name: (workload matrix, expected sub-diagonals of A^-1, or None if A^-1 is not banded)
    "momentum": (momentum_workload(20, beta=0.9).matrix, 2),
    "prefix": (prefix_workload(18).matrix, 1),
    "momentum-cooldown": (momentum_workload(16, beta=0.8, lr=learning_rates(16, "cooldown", final=0.05, last=6)).matrix, 2),
    "custom": (lower_random(14, 3), None),
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """name -> (path, workload, factorization, (K, R)) with a compressed group."""
    out = {}
    base = tmp_path_factory.mktemp("noise")
    for name, (a, _) in WORKLOADS.items():
        fact = optimal_factorization(a, tol=1e-9).factorization
        k, r = (3, 2) if name != "custom" else (2, 3)
        path = base / f"{name}.h5"
        save_artifact(path, fact, workload_name=name if name in ("prefix", "momentum") else "custom",
                      workload_params={"beta": 0.9} if name == "momentum" else {},
                      strategy_name="optimal",
                      groups={"compressed": compressed_group(a, fact.decoder, k, r, dense_loss=dense_loss(fact))})
        out[name] = (path, a, fact, (k, r))
    return out


def expected_noise(kind: str, variant: str, a: np.ndarray, fact: Factorization, path, z: np.ndarray) -> np.ndarray:
    if variant == "dense":
        if kind == "gradient":
            return scipy.linalg.solve_triangular(fact.strategy, z, lower=True)
        return fact.decoder @ z
    with h5py.File(path) as f:
        g = f["compressed"]
        b_hat = decoder_from_layout(g["band"][...], g["u"][...], g["v"][...])
    if kind == "iterate":
        return b_hat @ z
    return scipy.linalg.solve_triangular(a, b_hat @ z, lower=True)


def run(stream, state=None, steps=None):
    state = stream.init() if state is None else state
    rows = []
    for _ in range(stream.n - state.t if steps is None else steps):
        row, state = stream.next(state)
        rows.append(row)
    return np.array(rows), state


# ---------------------------------------------------------------------------------------------
# The stream equals the dense computation, every row


@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.parametrize("kind", ["gradient", "iterate"])
@pytest.mark.parametrize("variant", ["dense", "compressed"])
@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-11), ("float32", 3e-6)])
def test_stream_equals_dense_computation(artifacts, name, kind, variant, dtype, rtol):
    path, a, fact, _ = artifacts[name]
    d = 7
    stream = noise_stream(path, kind=kind, d=d, seed=SEED, dtype=dtype, variant=variant)
    z = philox_z(SEED, fact.n, d, dtype).astype(np.float64)
    want = expected_noise(kind, variant, a, fact, path, z)
    got, end = run(stream)
    assert got.dtype == np.dtype(dtype) and got.shape == (fact.n, d)
    assert end.t == fact.n
    scale = np.max(np.abs(want))
    for t in range(fact.n):  # row by row, so a failure names the step
        err = np.max(np.abs(got[t] - want[t])) / scale
        assert err <= rtol, f"step {t}: relative error {err:.2e}"


@pytest.mark.parametrize(
    "name,kind,variant,method,width",
    [
        ("momentum", "iterate", "compressed", "banded-low-rank", 3),      # W = K
        ("momentum", "gradient", "compressed", "banded-low-rank", 3 + 2),  # W = K + p, p = 2
        ("momentum-cooldown", "gradient", "compressed", "banded-low-rank", 3 + 2),
        ("prefix", "gradient", "compressed", "banded-low-rank", 3 + 1),    # p = 1
        ("custom", "gradient", "compressed", "history", 14),               # A^-1 not banded: keeps Z
        ("custom", "iterate", "compressed", "banded-low-rank", 2),
        ("momentum", "gradient", "dense", "history", 20),                  # a dense C^-1: all n rows of Z
        ("prefix", "iterate", "dense", "history", 18),
    ],
)
def test_method_and_band_width(artifacts, name, kind, variant, method, width):
    path, _, _, (_k, r) = artifacts[name]
    stream = noise_stream(path, kind=kind, d=3, seed=1, variant=variant)
    assert stream.method == method
    assert stream.width == width
    assert stream.rank == (r if method == "banded-low-rank" else 0)
    assert stream.memory_floats() == (width + stream.rank + 1) * 3
    expected_p = WORKLOADS[name][1]
    if variant == "compressed" and kind == "gradient" and expected_p is not None:
        assert stream.inverse_bandwidth == expected_p
    if method == "banded-low-rank":
        assert stream.memory_floats() == (width + r + 1) * 3


def test_operator_names_say_which_operator(artifacts):
    path = artifacts["momentum"][0]
    grad = noise_stream(path, kind="gradient", d=2, seed=1, variant="dense")
    it = noise_stream(path, kind="iterate", d=2, seed=1, variant="dense")
    assert grad.operator_name.startswith("C^-1") and "gradient" in grad.operator_name
    assert it.operator_name.startswith("B ") and "iterate" in it.operator_name
    comp = noise_stream(path, kind="gradient", d=2, seed=1)  # auto picks the compressed decoder
    assert comp.variant == "compressed" and comp.operator_name.startswith("C^^-1")
    summary = comp.describe()
    assert summary["kind"] == "gradient" and "seed" not in summary


def test_sensitivity_is_the_mechanisms(artifacts):
    path, a, fact, _ = artifacts["momentum"]
    dense = noise_stream(path, kind="gradient", d=2, seed=1, variant="dense")
    comp = noise_stream(path, kind="gradient", d=2, seed=1, variant="compressed")
    assert dense.sensitivity == pytest.approx(np.sqrt(np.max(np.sum(fact.strategy**2, axis=0))), rel=1e-12)
    with h5py.File(path) as f:
        g = f["compressed"]
        b_hat = decoder_from_layout(g["band"][...], g["u"][...], g["v"][...])
    c_hat = np.linalg.inv(b_hat) @ a  # a different route from the stream's triangular solve
    assert comp.sensitivity == pytest.approx(np.sqrt(np.max(np.sum(c_hat**2, axis=0))), rel=1e-9)
    assert comp.sensitivity != pytest.approx(dense.sensitivity, rel=1e-6)


def test_z_rows_are_philox_rows_and_independent_normals():
    d = 6
    for dtype in ("float64", "float32"):
        np.testing.assert_array_equal(noise_matrix(SEED, 5, d, dtype), philox_z(SEED, 5, d, dtype))
    # Rows for different j and different seeds are distinct draws: E[Z Z^T] / d = I.
    big = noise_matrix(7, 12, 40_000)
    gram = big @ big.T / big.shape[1]
    assert np.max(np.abs(gram - np.eye(12))) < 6 / np.sqrt(big.shape[1])
    other = noise_matrix(8, 12, 40_000)
    assert np.max(np.abs(big @ other.T / big.shape[1])) < 6 / np.sqrt(big.shape[1])
    assert abs(float(big.mean())) < 6 / np.sqrt(big.size)


@pytest.mark.parametrize("variant", ["dense", "compressed"])
def test_blocks_and_threads(artifacts, variant):
    """d spanning three blocks: rows are the block-wise Philox draws, whatever the thread count."""
    path, a, fact, _ = artifacts["prefix"]
    d = 2 * 65536 + 7
    z = philox_z(SEED, fact.n, d, "float32")
    np.testing.assert_array_equal(noise_row(SEED, 7, d, "float32", threads=3), z[7])
    rows = {}
    for threads in (1, 3):
        stream = noise_stream(path, kind="iterate", d=d, seed=SEED, variant=variant, threads=threads)
        rows[threads], _ = run(stream, steps=8)
    np.testing.assert_array_equal(rows[1], rows[3])
    want = expected_noise("iterate", variant, a, fact, path, z.astype(np.float64))[:8]
    np.testing.assert_allclose(rows[1], want, rtol=0, atol=3e-6 * np.max(np.abs(want)))


def test_gradient_noise_times_workload_is_iterate_noise(artifacts):
    """A (C^-1 Z) = B Z: the two operators, streamed separately, agree after applying A."""
    path, a, _fact, _ = artifacts["momentum"]
    for variant in ("dense", "compressed"):
        grad, _ = run(noise_stream(path, kind="gradient", d=4, seed=5, dtype="float64", variant=variant))
        it, _ = run(noise_stream(path, kind="iterate", d=4, seed=5, dtype="float64", variant=variant))
        np.testing.assert_allclose(a @ grad, it, rtol=0, atol=1e-10 * np.max(np.abs(it)))


def test_non_square_strategy_streams_iterate_noise_only(tmp_path):
    n = 6
    a = prefix_workload(n).matrix
    c = np.vstack([np.eye(n), np.eye(n)])              # m = 2n rows: every gradient sent twice
    b = np.hstack([a / 2.0, a / 2.0])                  # B C = A
    fact = Factorization(workload=a, strategy=c, decoder=b, causal=True)
    path = tmp_path / "twice.h5"
    save_artifact(path, fact, workload_name="prefix", strategy_name="twice")
    stream = noise_stream(path, kind="iterate", d=3, seed=2, dtype="float64")
    got, _ = run(stream)
    np.testing.assert_allclose(got, b @ philox_z(2, 2 * n, 3), atol=1e-12)
    with pytest.raises(MfcliError, match="square strategy"):
        noise_stream(path, kind="gradient", d=3, seed=2)


def test_non_causal_artifact_is_refused(tmp_path):
    n = 5
    a = prefix_workload(n).matrix
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    fact = Factorization(workload=a, strategy=q.T, decoder=a @ q)
    assert not fact.causal
    path = tmp_path / "offline.h5"
    save_artifact(path, fact, workload_name="prefix", strategy_name="rotated")
    with pytest.raises(MfcliError, match="not causal"):
        noise_stream(path, kind="iterate", d=2, seed=1)


def test_stream_of_an_mfcli_compress_artifact(tmp_path):
    """The layout contract with mfcli.services.compress: its artifact streams as B^ Z and A^-1 B^ Z."""
    from mfcli.services.compress import compress_artifact

    w = momentum_workload(24, beta=0.9)
    fact = optimal_factorization(w.matrix, tol=1e-9).factorization
    src = tmp_path / "m.h5"
    save_artifact(src, fact, workload_name="momentum", workload_params=w.params, strategy_name="optimal")
    made = compress_artifact(src, band=4, rank=2, out=tmp_path / "m-k4r2.h5")
    with h5py.File(made.path) as f:
        g = f["compressed"]
        b_hat = decoder_from_layout(g["band"][...], g["u"][...], g["v"][...])
        stored_sens = float(g.attrs["sensitivity"])
    np.testing.assert_allclose(b_hat, made.compression.decoder, atol=1e-12)
    z = philox_z(SEED, 24, 5)
    for kind, want in (("iterate", b_hat @ z),
                       ("gradient", scipy.linalg.solve_triangular(w.matrix, b_hat @ z, lower=True))):
        stream = noise_stream(made.path, kind=kind, d=5, seed=SEED, dtype="float64")
        assert stream.variant == "compressed" and stream.method == "banded-low-rank"
        got, _ = run(stream)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-11 * np.max(np.abs(want)))
        assert stream.sensitivity == pytest.approx(stored_sens, rel=1e-9)


def _write_record(path: Path, *args: str) -> str:
    """Write one accounting record with ``mfcli account --write``; its id."""
    from typer.testing import CliRunner

    from mfcli.cli.app import app
    from mfcli.training.samplers import accounting_records

    before = set(accounting_records(path))
    r = CliRunner().invoke(app, ["account", str(path), *args, "--write", "-q"])
    assert r.exit_code == 0, r.output
    (rid,) = set(accounting_records(path)) - before
    return rid


def test_stream_of_a_record_is_the_operator_it_accounted(tmp_path, artifacts):
    """The reviewer's case: a record that accounted the dense C of a compressed artifact. auto
    would stream the compressed C^ (another sensitivity); record= streams C and refuses the other."""
    import shutil

    src, _a, fact, _ = artifacts["momentum"]
    path = tmp_path / "k.h5"
    shutil.copy(src, path)
    dense_rid = _write_record(path, "--operator", "dense", "--sigma", "4")
    comp_rid = _write_record(path, "--operator", "compressed", "--sigma", "4")
    assert noise_stream(path, kind="gradient", d=2, seed=1).variant == "compressed"   # auto, no record
    for rid, variant, label in ((dense_rid, "dense", "dense"), (comp_rid, "compressed", "compressed")):
        for kind in ("gradient", "iterate"):
            s = record_noise_stream(path, rid, kind=kind, d=2, seed=1)
            assert s.variant == variant and s.accounted_operator.startswith(label)
            assert s.fingerprint == noise_stream(path, kind=kind, d=2, seed=1, variant=variant).fingerprint
        assert record_noise_stream(path, rid, kind="gradient", d=2, seed=1, variant=variant).variant == variant
    dense = record_noise_stream(path, dense_rid, kind="gradient", d=2, seed=1)
    assert dense.sensitivity == pytest.approx(np.sqrt(np.max(np.sum(fact.strategy**2, axis=0))), rel=1e-12)
    with pytest.raises(MfcliError, match=f"record {dense_rid!r} accounted the dense operator; a compressed noise"):
        record_noise_stream(path, dense_rid, kind="gradient", d=2, seed=1, variant="compressed")
    with pytest.raises(MfcliError, match=r"accounted the compressed \(band 3, rank 2\) operator; a dense"):
        record_noise_stream(path, comp_rid, kind="gradient", d=2, seed=1, variant="dense")
    with pytest.raises(MfcliError, match="has no accounting record 'nope'"):
        record_noise_stream(path, "nope", kind="gradient", d=2, seed=1)


def test_record_stream_passes_every_stream_option_on(tmp_path, artifacts):
    """record_noise_stream takes noise_stream's options (StreamOptions) with noise_stream's defaults:
    each one given reaches the stream, each one left out is noise_stream's documented default
    (float32, one thread, a memory budget)."""
    import shutil

    from mfcli.util.memory import MemoryLimitError

    src, _a, _fact, _ = artifacts["momentum"]
    path = tmp_path / "k.h5"
    shutil.copy(src, path)
    rid = _write_record(path, "--operator", "dense", "--sigma", "4")
    default = record_noise_stream(path, rid, kind="gradient", d=2, seed=1)
    assert (default.dtype, default.threads, default.variant) == (np.dtype(np.float32), 1, "dense")
    given = record_noise_stream(path, rid, kind="gradient", d=2, seed=1, dtype="float64", threads=2, max_memory=None)
    assert (given.dtype, given.threads) == (np.dtype(np.float64), 2)
    with pytest.raises(MemoryLimitError):
        record_noise_stream(path, rid, kind="gradient", d=2, seed=1, max_memory=8)
    with pytest.raises(TypeError, match="accounted"):   # the record names the operator; a caller cannot
        record_noise_stream(path, rid, kind="gradient", d=2, seed=1, accounted=None)


def test_record_of_another_strategy_is_refused(tmp_path, artifacts):
    """A record whose strategy checksum is not this artifact's operator's (copied from another
    artifact, or the artifact's matrices replaced) names noise that is not this stream's: the
    record does not verify, and the stream's own identity check refuses the operator too."""
    import shutil

    path = tmp_path / "p.h5"
    shutil.copy(artifacts["prefix"][0], path)
    rid = _write_record(path, "--operator", "dense", "--sigma", "3")
    with h5py.File(path, "r+") as f:
        f[f"accounting/{rid}"].attrs["strategy_sha256"] = "0" * 64
    with pytest.raises(MfcliError, match=f"record {rid!r} .*does not verify"):
        record_noise_stream(path, rid, kind="gradient", d=2, seed=1)
    with pytest.raises(MfcliError, match=f"record {rid!r} accounted operator 'dense'.*is not for this noise"):
        noise_stream(path, kind="gradient", d=2, seed=1, accounted=AccountedOperator("dense", "0" * 64, rid))
    with pytest.raises(MfcliError, match="AccountedOperator"):
        noise_stream(path, kind="gradient", d=2, seed=1, accounted=("dense", "0" * 64))  # type: ignore[arg-type]


@pytest.mark.parametrize(("attr", "value"), [("sigma", 30.0), ("epsilon_single_pass", 1e-3)])
def test_a_record_is_fully_verified_before_its_stream(tmp_path, artifacts, attr, value):
    """Issue 26: a record whose operator checksum is right but whose numbers were edited (a
    larger sigma, a smaller epsilon) is refused before any noise is streamed for it; the operator
    check alone would have let it through."""
    import shutil

    path = tmp_path / "q.h5"
    shutil.copy(artifacts["prefix"][0], path)
    rid = _write_record(path, "--operator", "dense", "--sigma", "3")
    with h5py.File(path, "r") as f:
        attrs = dict(f[f"accounting/{rid}"].attrs)
    assert attr in attrs, sorted(attrs)
    with h5py.File(path, "r+") as f:
        f[f"accounting/{rid}"].attrs[attr] = value
    # the operator it names is still this artifact's: the identity check alone passes
    assert noise_stream(path, kind="gradient", d=2, seed=1,
                        accounted=AccountedOperator(str(attrs.get("operator") or "dense"),
                                                    str(attrs["strategy_sha256"]), rid)).variant == "dense"
    with pytest.raises(MfcliError, match=f"record {rid!r} of .* does not verify"):
        record_noise_stream(path, rid, kind="gradient", d=2, seed=1)


# ---------------------------------------------------------------------------------------------
# End of stream, resume, purity


@pytest.mark.parametrize("variant", ["dense", "compressed"])
def test_hard_error_at_t_ge_n(artifacts, variant):
    path, _, fact, _ = artifacts["prefix"]
    stream = noise_stream(path, kind="gradient", d=2, seed=3, variant=variant)
    _, state = run(stream)
    assert state.t == fact.n
    with pytest.raises(MfcliError, match=rf"exhausted: step {fact.n} >= n = {fact.n}"):
        stream.next(state)
    with pytest.raises(MfcliError, match="exhausted"):
        stream.next(stream.state_at(fact.n))
    with pytest.raises(MfcliError, match="step must be"):
        stream.state_at(fact.n + 1)
    # The end state can be checkpointed, and what it loads is still exhausted.
    end = stream.load_state_dict(stream.state_dict(state))
    with pytest.raises(MfcliError, match="exhausted"):
        stream.next(end)


@pytest.mark.parametrize("name", ["momentum", "custom"])
@pytest.mark.parametrize("kind", ["gradient", "iterate"])
@pytest.mark.parametrize("variant", ["dense", "compressed"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_resume_gives_identical_continuation(artifacts, name, kind, variant, dtype):
    path, _, fact, (k, _) = artifacts[name]
    n = fact.n
    stream = noise_stream(path, kind=kind, d=5, seed=SEED, dtype=dtype, variant=variant)
    full, _ = run(stream)
    for t0 in sorted({0, 1, k - 1, k, k + 1, k + 3, n // 2, n - 1}):
        _, state = run(stream, steps=t0)
        blob = pickle.dumps(stream.state_dict(state))            # a checkpoint on disk
        fresh = noise_stream(path, kind=kind, d=5, seed=SEED, dtype=dtype, variant=variant)
        resumed = fresh.load_state_dict(pickle.loads(blob))
        assert resumed.t == t0
        rest, _ = run(fresh, resumed)
        np.testing.assert_array_equal(rest, full[t0:], err_msg=f"resume at t = {t0}")


def test_resume_through_npz(artifacts, tmp_path):
    path = artifacts["momentum"][0]
    stream = noise_stream(path, kind="gradient", d=9, seed=11)
    full, _ = run(stream)
    _, state = run(stream, steps=7)
    np.savez(tmp_path / "ckpt.npz", **stream.state_dict(state))
    with np.load(tmp_path / "ckpt.npz") as data:
        rest, _ = run(stream, stream.load_state_dict(dict(data)))
    np.testing.assert_array_equal(rest, full[7:])


def test_next_is_pure_even_for_an_older_state(artifacts):
    path = artifacts["momentum"][0]
    stream = noise_stream(path, kind="gradient", d=4, seed=9, dtype="float64")
    full, _ = run(stream)
    _, s5 = run(stream, steps=5)
    r5, s6 = stream.next(s5)
    np.testing.assert_array_equal(r5, full[5])
    r6, _ = stream.next(s6)
    with pytest.warns(StaleNoiseStateWarning):
        again, s6b = stream.next(s5)          # s5's buffers moved on: rebuilt, same answer
    np.testing.assert_array_equal(again, full[5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r6b, _ = stream.next(s6b)
    np.testing.assert_array_equal(r6b, full[6])
    np.testing.assert_array_equal(r6, full[6])
    np.testing.assert_array_equal(stream.next(stream.state_at(11))[0], full[11])
    assert s5.t == 5 and isinstance(s5, NoiseState)
    with pytest.raises(AttributeError):
        s5.t = 3  # frozen


# ---------------------------------------------------------------------------------------------
# Mismatches and bad input


@pytest.fixture(scope="module")
def checkpoint(artifacts):
    path = artifacts["momentum"][0]
    stream = noise_stream(path, kind="gradient", d=6, seed=SEED)
    _, state = run(stream, steps=6)
    return path, stream.state_dict(state)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"seed": SEED + 1}, "different seed"),
        ({"d": 7}, "d is 6, the stream has 7"),
        ({"dtype": "float64"}, "dtype is 'float32'"),
        ({"kind": "iterate"}, "kind is 'gradient'"),
        ({"variant": "dense"}, "variant is 'compressed'"),
    ],
)
def test_checkpoint_mismatch_is_refused(checkpoint, change, message):
    path, sd = checkpoint
    options = {"kind": "gradient", "d": 6, "seed": SEED, "dtype": "float32", "variant": "auto"}
    options.update(change)
    stream = noise_stream(path, **options)
    with pytest.raises(MfcliError, match=message):
        stream.load_state_dict(sd)


def test_checkpoint_of_another_artifact_is_refused(checkpoint, artifacts):
    _, sd = checkpoint
    other = noise_stream(artifacts["momentum-cooldown"][0], kind="gradient", d=6, seed=SEED)
    with pytest.raises(MfcliError, match="operator"):
        other.load_state_dict({**sd, "n": other.n})


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda sd: {**sd, "format": "x"}, "not an mfcli noise-stream checkpoint"),
        (lambda sd: {**sd, "format_version": 99}, "format_version"),
        (lambda sd: {**sd, "t": 10**6}, "out of range"),
        (lambda sd: {**sd, "t": -1}, "out of range"),
        (lambda sd: {**sd, "running": sd["running"][:, :3]}, "running sums have shape"),
        (lambda sd: {**sd, "running": sd["running"] * np.nan}, "NaN"),
        (lambda sd: {**sd, "generator_check": "0" * 64}, "authentication tag"),
        (lambda sd: [1, 2], "not an mfcli noise-stream checkpoint"),
    ],
)
def test_malformed_checkpoint_is_refused(checkpoint, edit, message):
    path, sd = checkpoint
    stream = noise_stream(path, kind="gradient", d=6, seed=SEED)
    with pytest.raises(MfcliError, match=message):
        stream.load_state_dict(edit(sd))


@pytest.mark.parametrize(
    "edit",
    [
        lambda sd: {**sd, "running": np.zeros_like(sd["running"])},          # running sums zeroed
        lambda sd: {**sd, "running": sd["running"] * np.float32(1.0001)},   # slightly scaled
        lambda sd: {**sd, "t": sd["t"] - 1},                                 # step moved back
        lambda sd: {**sd, "t": sd["t"] + 1},                                 # step moved on
        lambda sd: {**sd, "tag": "0" * 64},
        lambda sd: {k: v for k, v in sd.items() if k != "tag"},
    ],
    ids=["running-zeroed", "running-scaled", "t-back", "t-forward", "tag-zeroed", "tag-removed"],
)
def test_edited_checkpoint_fails_its_tag(checkpoint, edit):
    path, sd = checkpoint
    stream = noise_stream(path, kind="gradient", d=6, seed=SEED)
    assert stream.method == "banded-low-rank" and stream.rank > 0 and np.any(sd["running"])
    with pytest.raises(MfcliError, match="authentication tag"):
        stream.load_state_dict(edit(sd))


def test_checkpoint_round_trips_through_npz_and_holds_no_seed(checkpoint, tmp_path):
    path, sd = checkpoint
    f = tmp_path / "ck.npz"
    np.savez(f, **sd)
    loaded = dict(np.load(f))
    stream = noise_stream(path, kind="gradient", d=6, seed=SEED)
    state = stream.load_state_dict(loaded)
    # The resumed stream continues exactly as an uninterrupted one.
    _, ref = run(stream, steps=6)
    np.testing.assert_array_equal(stream.next(state)[0], stream.next(ref)[0])
    # No field holds the seed, in decimal or as bytes.
    text = repr({k: v for k, v in sd.items() if k != "running"})
    assert str(SEED) not in text and SEED.to_bytes(16, "big").hex() not in text


def test_checkpoint_tag_needs_the_seed(checkpoint):
    """A forger without the seed cannot re-sign: another seed's stream signs differently."""
    path, sd = checkpoint
    other = noise_stream(path, kind="gradient", d=6, seed=SEED + 1)
    assert other._checkpoint_tag(sd, sd["running"]) != sd["tag"]


def test_checkpoint_from_another_numpy_generator_is_refused(checkpoint, monkeypatch):
    """A genuine checkpoint read where (seed, row) draws other noise (simulated)."""
    from mfcli.training.noise import NoiseStream

    path, sd = checkpoint
    stream = noise_stream(path, kind="gradient", d=6, seed=SEED)
    monkeypatch.setattr(NoiseStream, "_generator_check", lambda self, t: "0" * 64)
    with pytest.raises(MfcliError, match="draws different noise"):
        stream.load_state_dict(sd)


def test_state_of_another_stream_is_refused(artifacts):
    path = artifacts["momentum"][0]
    a = noise_stream(path, kind="gradient", d=4, seed=1)
    b = noise_stream(path, kind="gradient", d=4, seed=2)
    with pytest.raises(MfcliError, match="another stream"):
        b.next(a.init())
    with pytest.raises(MfcliError, match="expected a NoiseState"):
        a.next({"t": 0})


@pytest.mark.parametrize(
    "options,message",
    [
        ({"seed": -1}, "seed"),
        ({"seed": 2**128}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"d": 0}, "positive integer"),
        ({"d": 2.0}, "positive integer"),
        ({"dtype": "float16"}, "float32 or float64"),
        ({"dtype": "nonsense"}, "float32 or float64"),
        ({"kind": "noise"}, "'gradient' \\(C\\^-1 Z\\) or 'iterate' \\(B Z\\)"),
        ({"variant": "sparse"}, "variant"),
        ({"threads": 0}, "threads"),
    ],
)
def test_bad_options(artifacts, options, message):
    kwargs = {"kind": "gradient", "d": 3, "seed": 1, **options}
    with pytest.raises(MfcliError, match=message):
        noise_stream(artifacts["prefix"][0], **kwargs)


def test_compressed_needs_a_group(tmp_path, artifacts):
    _, _a, fact, _ = artifacts["prefix"]
    path = tmp_path / "plain.h5"
    save_artifact(path, fact, workload_name="prefix", strategy_name="optimal")
    assert noise_stream(path, kind="gradient", d=2, seed=1).variant == "dense"
    with pytest.raises(MfcliError, match="no compressed decoder"):
        noise_stream(path, kind="gradient", d=2, seed=1, variant="compressed")


def test_tampered_compressed_sensitivity_is_refused(tmp_path, artifacts):
    _, a, fact, _ = artifacts["momentum"]
    path = tmp_path / "tampered.h5"
    save_artifact(path, fact, workload_name="momentum", strategy_name="optimal",
                  groups={"compressed": compressed_group(a, fact.decoder, 3, 2, dense_loss=dense_loss(fact), sens_factor=0.97)})
    with pytest.raises(ArtifactError, match="compressed/sensitivity"):
        noise_stream(path, kind="iterate", d=2, seed=1)


def test_compressed_group_shapes_must_match_attributes(tmp_path, artifacts):
    _, a, fact, _ = artifacts["momentum"]
    group = compressed_group(a, fact.decoder, 3, 2, dense_loss=dense_loss(fact))
    group["attrs"]["band"] = 4
    path = tmp_path / "bad-band.h5"
    save_artifact(path, fact, workload_name="momentum", strategy_name="optimal", groups={"compressed": group})
    with pytest.raises(ArtifactError, match="compressed band has shape"):
        noise_stream(path, kind="iterate", d=2, seed=1)


def test_noise_row_rejects_bad_index():
    with pytest.raises(MfcliError, match="non-negative integer"):
        noise_row(1, -1, 3)
    with pytest.raises(MfcliError, match="positive integer"):
        noise_row(1, 0, 0)


# ---------------------------------------------------------------------------------------------
# Property: any band and rank of a small random decoder streams exactly


@given(
    n=st.integers(2, 12),
    k_frac=st.floats(0.0, 1.0),
    r=st.integers(0, 3),
    seed=st.integers(0, 2**128 - 1),
    d=st.integers(1, 4),
    mat_seed=st.integers(0, 1000),
)
def test_property_banded_low_rank_streams_exactly(tmp_path_factory, n, k_frac, r, seed, d, mat_seed):
    k = 1 + int(k_frac * (n - 1))
    r = min(r, n - k)
    a = lower_random(n, mat_seed)
    c = np.eye(n)
    fact = Factorization(workload=a, strategy=c, decoder=a)
    path = tmp_path_factory.mktemp("prop") / "p.h5"
    save_artifact(path, fact, workload_name="custom", strategy_name="identity",
                  groups={"compressed": compressed_group(a, a, k, r, dense_loss=dense_loss(fact))})
    with h5py.File(path) as f:
        g = f["compressed"]
        b_hat = decoder_from_layout(g["band"][...], g["u"][...], g["v"][...])
    for kind in ("iterate", "gradient"):
        stream = noise_stream(path, kind=kind, d=d, seed=seed, dtype="float64", variant="compressed")
        got, _ = run(stream)
        z = philox_z(seed, n, d)
        want = b_hat @ z if kind == "iterate" else scipy.linalg.solve_triangular(a, b_hat @ z, lower=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * max(1.0, np.max(np.abs(want))))


# ---------------------------------------------------------------------------------------------
# The examples in docs/noise-streams.md run as written

DOC = Path(__file__).resolve().parent.parent / "docs" / "noise-streams.md"


def doc_examples() -> dict[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    out = {}
    for block in blocks:
        first = block.splitlines()[0]
        assert first.startswith("# example: "), f"python block without an example marker: {first!r}"
        out[first.removeprefix("# example: ").strip()] = block
    return out


def run_doc_example(name: str, where: Path) -> dict:
    code = doc_examples()[name]
    namespace: dict = {"__name__": f"doc_example_{name}"}
    cwd = Path.cwd()
    os.chdir(where)
    try:
        exec(compile(code, f"{DOC}:{name}", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace


def test_every_doc_example_is_run_by_a_test():
    assert set(doc_examples()) == {"numpy", "compressed", "torch", "optax"}


def test_doc_example_numpy(tmp_path, capsys):
    ns = run_doc_example("numpy", tmp_path)
    assert ns["state"].t == ns["stream"].n == 256
    assert (tmp_path / "noise-ckpt.npz").exists()
    out = capsys.readouterr().out
    assert "C^-1 (gradient noise" in out and "NoiseStreamExhaustedError noise stream exhausted" in out
    assert np.all(np.isfinite(ns["theta"]))


def test_doc_example_compressed(tmp_path, capsys):
    ns = run_doc_example("compressed", tmp_path)
    stream = ns["stream"]
    assert (stream.method, stream.width, stream.rank) == ("banded-low-rank", 10, 4)
    assert ns["noise"].shape == (1_000_000,) and ns["noise"].dtype == np.float32
    assert "banded-low-rank 10 4" in capsys.readouterr().out


def test_strategy_stream_is_the_artifact_stream_of_that_strategy(tmp_path):
    """noise.strategy_stream (a structured strategy in memory) and noise_stream (its artifact) are
    one stream: same fingerprint, sensitivity and rows for gradient and iterate noise; the
    iterate rows are B Z with B = A C^-1 formed densely here (an independent solve)."""
    from mfcli.io.artifact import save_structured_artifact
    from mfcli.strategies.toeplitz import BandedToeplitz, materialize, toeplitz_workload
    from mfcli.training.noise import strategy_stream

    n, d = 12, 3
    w = toeplitz_workload("momentum", beta=0.8)
    bt = BandedToeplitz(np.array([1.0, 0.4, 0.1]))
    path = tmp_path / "s.h5"
    save_structured_artifact(path, bt, workload=w, n=n)
    z = noise_matrix(4, n, d, "float64")
    b = materialize(w.coefs(n), n) @ np.linalg.inv(bt.dense(n))
    for kind, expect in (("gradient", np.linalg.solve(bt.dense(n), z)), ("iterate", b @ z)):
        mine = strategy_stream(bt, n=n, d=d, seed=4, kind=kind, workload=w)
        theirs = noise_stream(path, kind=kind, d=d, seed=4, dtype="float64")
        assert (mine.fingerprint, mine.sensitivity, dict(mine.workload_params)) == \
            (theirs.fingerprint, theirs.sensitivity, dict(theirs.workload_params))
        s1, s2, rows = mine.init(), theirs.init(), []
        for _ in range(n):
            r1, s1 = mine.next(s1)
            r2, s2 = theirs.next(s2)
            assert np.array_equal(r1, r2)
            rows.append(r1)
        np.testing.assert_allclose(np.array(rows), expect, rtol=0, atol=1e-12 * np.abs(expect).max())
