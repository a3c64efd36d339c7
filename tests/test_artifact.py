"""Artifact format v1: round trip, verification, tamper detection, atomic writes."""
from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import (
    FORMAT,
    append_group,
    check_datasets,
    load_artifact,
    save_artifact,
    shipped_artifact,
)
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization


@pytest.fixture(scope="module")
def solved():
    w = momentum_workload(24, beta=0.9)
    return w, optimal_factorization(w.matrix, tol=1e-9)


@pytest.fixture
def artifact(tmp_path, solved):
    w, res = solved
    path = tmp_path / "m.h5"
    save_artifact(path, res.factorization, workload_name=w.name, workload_params=w.params,
                  strategy_name="optimal", solver=res.certificate(), command="test",
                  dual_weights=res.dual_weights)
    return path


def test_round_trip_readable_by_plain_h5py(artifact, solved):
    _w, res = solved
    with h5py.File(artifact) as f:
        assert f.attrs["format"] == FORMAT and f.attrs["format_version"] == 1
        c = f["strategy"][...]
        b = f["decoder"][...]
        a = f["workload"][...]
        assert f["strategy"].dtype == np.float64
        # Independent recomputation with plain numpy from what h5py reads.
        assert f.attrs["sensitivity"] == pytest.approx(np.sqrt(np.max((c**2).sum(axis=0))), rel=1e-12)
        assert f.attrs["loss_total"] == pytest.approx(f.attrs["sensitivity"] ** 2 * (b**2).sum(), rel=1e-12)
        np.testing.assert_allclose(b @ c, a, atol=1e-10)
        for key in ("n", "workload_name", "workload_params", "strategy_name", "loss_mean", "causal",
                    "solver", "created_by", "created_utc", "command"):
            assert key in f.attrs
    art = load_artifact(artifact)
    np.testing.assert_array_equal(art.factorization.strategy, res.factorization.strategy)
    assert art.attrs["workload_params"]["beta"] == 0.9
    assert art.attrs["solver"]["gap"] <= 1e-9
    assert art.factorization.causal
    assert all(ok for _, ok in check_datasets(artifact))


def _flip_byte_in_dataset(path, name, index=5):
    with h5py.File(path, "r") as f:
        offset = f[name].id.get_offset()
    assert offset is not None
    with open(path, "r+b") as fh:
        fh.seek(offset + index)
        byte = fh.read(1)
        fh.seek(offset + index)
        fh.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("name", ["workload", "strategy", "decoder", "dual_weights"])
def test_flipped_byte_is_detected(artifact, name):
    _flip_byte_in_dataset(artifact, name)
    with pytest.raises(ArtifactError, match=f"checksum mismatch in dataset '{name}'"):
        load_artifact(artifact)
    assert dict(check_datasets(artifact))[name] is False


@pytest.mark.parametrize("key, value", [("sensitivity", 0.5), ("loss_total", 1.0)])
def test_tampered_attribute_is_detected(artifact, key, value):
    with h5py.File(artifact, "r+") as f:
        f.attrs[key] = value
    with pytest.raises(ArtifactError, match=f"stored {key}"):
        load_artifact(artifact)


def test_consistently_tampered_matrix_fails_reconstruction(artifact):
    """Someone rewrites C and its checksum: A = B C no longer holds."""
    from mfcli.io.artifact import dataset_sha256

    with h5py.File(artifact, "r+") as f:
        c = f["strategy"][...]
        c[3, 1] += 0.1
        c /= np.sqrt(np.max((c**2).sum(axis=0)))
        f["strategy"][...] = c
        f["strategy"].attrs["sha256"] = dataset_sha256(c)
        b = f["decoder"][...]
        f.attrs["sensitivity"] = 1.0
        f.attrs["loss_total"] = float((b**2).sum())
    with pytest.raises(ArtifactError, match="A != B C"):
        load_artifact(artifact)


def test_truncated_and_foreign_files(tmp_path, artifact):
    trunc = tmp_path / "t.h5"
    data = artifact.read_bytes()
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="truncated or corrupt"):
        load_artifact(trunc)
    junk = tmp_path / "junk.h5"
    junk.write_text("not hdf5")
    with pytest.raises(ArtifactError, match="not a readable HDF5"):
        load_artifact(junk)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(ArtifactError, match="not an mfcli artifact"):
        load_artifact(other)
    with pytest.raises(ArtifactError, match="does not exist"):
        load_artifact(tmp_path / "missing.h5")
    with h5py.File(artifact, "r+") as f:
        f.attrs["format_version"] = 99
    with pytest.raises(ArtifactError, match="format_version"):
        load_artifact(artifact)


def test_atomic_write_leaves_nothing_on_failure(tmp_path, solved, monkeypatch):
    _w, res = solved
    target = tmp_path / "out.h5"

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("mfcli.io.artifact.write_bytes_to", boom)
    with pytest.raises(KeyboardInterrupt):
        save_artifact(target, res.factorization, workload_name="momentum", strategy_name="optimal")
    assert list(tmp_path.iterdir()) == []


def test_refuses_overwrite_without_force(artifact, solved):
    _w, res = solved
    with pytest.raises(MfcliError, match="already exists"):
        save_artifact(artifact, res.factorization, workload_name="m", strategy_name="optimal")
    save_artifact(artifact, res.factorization, workload_name="m", strategy_name="optimal", force=True)
    assert load_artifact(artifact).workload_name == "m"


def test_append_group_keeps_matrices_and_checksums(artifact):
    before = {k: v for k, v in check_datasets(artifact)}
    with h5py.File(artifact) as f:
        c_before = f["strategy"][...]
    append_group(artifact, "accounting/0", attrs={"epsilon": 1.5, "event": {"name": "x"}})
    art = load_artifact(artifact)
    assert art.groups["accounting/0"]["attrs"]["epsilon"] == 1.5
    assert art.groups["accounting/0"]["attrs"]["event"] == {"name": "x"}
    np.testing.assert_array_equal(art.factorization.strategy, c_before)
    assert {k: v for k, v in check_datasets(artifact)} == before
    with pytest.raises(MfcliError, match="already has a group"):
        append_group(artifact, "accounting/0", attrs={})


@pytest.mark.parametrize("name, n, workload", [("prefix-n256", 256, "prefix"), ("momentum-n256", 256, "momentum")])
def test_shipped_artifacts_load_and_are_optimal(name, n, workload):
    art = load_artifact(shipped_artifact(name))
    assert art.n == n and art.workload_name == workload and art.factorization.causal
    assert art.attrs["solver"]["gap"] <= 1e-6
    # The shipped workload is the one its name says.
    expected = prefix_workload(n) if workload == "prefix" else momentum_workload(n, beta=0.9)
    np.testing.assert_allclose(art.factorization.workload, expected.matrix, rtol=1e-12)
    # Independent check of near-optimality: the dual bound at the stored weights.
    v = art.dual_weights
    gram = art.factorization.workload.T @ art.factorization.workload
    s = np.sqrt(np.linalg.eigvalsh(np.sqrt(v)[:, None] * gram * np.sqrt(v)[None, :]).clip(0))
    dual = s.sum() ** 2 / v.sum()
    assert dual <= art.factorization.loss_total <= dual * (1 + 1e-6)


def test_copy_of_artifact_still_loads(tmp_path, artifact):
    dst = tmp_path / "copy.h5"
    shutil.copy(artifact, dst)
    assert load_artifact(dst).n == 24


def test_non_numeric_dataset_with_valid_checksum_is_refused(artifact):
    from mfcli.io.artifact import dataset_sha256

    with h5py.File(artifact, "r+") as f:
        del f["strategy"]
        bad = np.array([b"a", b"b"], dtype="S1")
        f["strategy"] = bad
        f["strategy"].attrs["sha256"] = dataset_sha256(bad)
    with pytest.raises(ArtifactError, match="'strategy' must be a 2-D real matrix"):
        load_artifact(artifact)


def test_signal_inside_atomic_write_abandons_it_and_is_delivered(tmp_path):
    import signal

    from mfcli.io.artifact import atomic_path

    target = tmp_path / "out.txt"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text("complete")
            signal.raise_signal(signal.SIGINT)  # held until the write is abandoned
            tmp.write_text("still running after the signal")
    assert list(tmp_path.iterdir()) == []


def test_signal_with_a_handler_that_does_not_raise_still_fails_the_write(tmp_path):
    import signal

    from mfcli.io.artifact import atomic_path

    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with pytest.raises(MfcliError, match="was not written: interrupted by a signal"):
            with atomic_path(tmp_path / "out.txt") as tmp:
                tmp.write_text("x")
                signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM] and list(tmp_path.iterdir()) == []


def test_nested_writers_in_one_directory_do_not_deadlock(tmp_path):
    from mfcli.io.artifact import atomic_path

    with atomic_path(tmp_path / "a.txt") as a:
        a.write_text("a")
        with atomic_path(tmp_path / "b.txt") as b:
            b.write_text("b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_library_message_names_no_cli_flag(artifact, solved):
    from mfcli.io.artifact import OutputExistsError

    _w, res = solved
    with pytest.raises(OutputExistsError) as err:
        save_artifact(artifact, res.factorization, workload_name="m", strategy_name="optimal")
    assert "--" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# One reader for every kind (issue 23) and no silent fall-back to the dense operator (issue 26)


def test_renamed_compressed_group_is_refused_not_streamed_dense(tmp_path, artifact):
    """A file whose root declares a compressed decoder (compress wrote compression_band/rank and a
    '+compressed' strategy name) but whose 'compressed' group was renamed: select_operator('auto'),
    and with it every noise stream and accounting that picks the operator, refuses in one line
    instead of running the dense root (another operator, another sensitivity); 'dense' given
    explicitly still runs the root, and the intact file picks the compressed operator."""
    from mfcli.services.compress import compress_artifact
    from mfcli.strategies.operators import select_operator
    from mfcli.training.noise import noise_stream

    out = tmp_path / "k.h5"
    compress_artifact(artifact, band=3, rank=2, out=out)
    assert select_operator(load_artifact(out), "auto").variant == "compressed"
    with h5py.File(out, "r+") as f:
        f.move("compressed", "compressed_old")
    art = load_artifact(out)   # the file itself still verifies: checksums, numbers, A = B C
    for call in (lambda: select_operator(art, "auto"), lambda: noise_stream(out, kind="gradient", d=2, seed=1)):
        with pytest.raises(ArtifactError, match=r"declares a compressed decoder \(compression_band, compression_rank, "
                                                r"strategy_name 'optimal\+compressed'\) but the file has no 'compressed' group"):
            call()
    assert select_operator(art, "dense").variant == "dense"
    with pytest.raises(MfcliError, match="has no compressed decoder"):
        select_operator(art, "compressed")


def _structured_file(tmp_path):
    from mfcli.io.artifact import save_structured_artifact
    from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz

    path = tmp_path / "s.h5"
    save_structured_artifact(path, BandedToeplitz(np.array([1.0, 0.5, 0.25])), workload=TOEPLITZ_PREFIX, n=16)
    return path, "structured/coefs"


def _dense_file(tmp_path, artifact):
    return artifact, "strategy"


@pytest.mark.parametrize("make", [_dense_file, _structured_file], ids=["dense", "structured"])
def test_one_header_check_and_checksum_read_for_every_kind(tmp_path, artifact, make):
    """load_any_artifact (mfcli.io.artifact) reads both kinds through the same header check and the
    same checksum-verifying dataset read: the same messages, whichever kind the file is."""
    from mfcli.io.artifact import load_any_artifact

    path, dataset = make(tmp_path, artifact) if make is _dense_file else make(tmp_path)
    assert load_any_artifact(path).n in (16, 24)
    bad = tmp_path / "bad.h5"
    shutil.copy(path, bad)
    with h5py.File(bad, "r+") as f:
        f.attrs["format_version"] = 7
    with pytest.raises(ArtifactError, match="has format_version 7; this mfcli reads version 1"):
        load_any_artifact(bad)
    shutil.copy(path, bad)
    with h5py.File(bad, "r+") as f:
        f.attrs["format"] = "something.else"
    with pytest.raises(ArtifactError, match=r"is not an mfcli artifact \(format attribute is 'something.else'\)"):
        load_any_artifact(bad)
    shutil.copy(path, bad)
    with h5py.File(bad, "r+") as f:
        f[dataset].attrs["sha256"] = "0" * 64
    with pytest.raises(ArtifactError, match=f"checksum mismatch in dataset '{dataset}' \\(file modified or corrupt\\)"):
        load_any_artifact(bad)
    shutil.copy(path, bad)
    with h5py.File(bad, "r+") as f:
        del f[dataset].attrs["sha256"]
    with pytest.raises(ArtifactError, match=f"dataset '{dataset}' has no sha256 checksum"):
        load_any_artifact(bad)


def test_one_attribute_decoder():
    """artifact_format.decode_attr is the decoder the readers share (artifact._decode is it)."""
    from mfcli.io import artifact
    from mfcli.model.artifact_format import decode_attr

    assert artifact._decode is decode_attr
    cases = [(b"abc", "abc"), ('{"a": [1, 2]}', {"a": [1, 2]}), ("[1]", [1]), ("null", None), (np.float64(2.5), 2.5),
             (np.int64(3), 3), ("{not json", "{not json"), ("plain", "plain")]
    for stored, value in cases:
        got = decode_attr(stored)
        assert got == value and type(got) is type(value)
