"""An operator's identity (``identity_sha256``, stored as an accounting record's ``strategy_sha256``)
is a hash of the stored bytes that define it, never of a matrix computed from them.

Oracle: the identity is rebuilt here from the ``sha256`` attributes h5py reads from the file and the
definition in docs/artifact-format.md, independently of mfcli's code.
"""
from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from mfcli.io.artifact import dataset_sha256, load_artifact, save_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.account import account, record_to_artifact, resolve_strategy
from mfcli.services.compress import compress_artifact
from mfcli.services.inspect import inspect_artifact
from mfcli.strategies.operators import DenseOperator, select_operator

COMPRESSED_PARTS = ("workload", "compressed/band", "compressed/u", "compressed/v")


def stored_identity(path: Path, variant: str) -> str:
    """The documented identity, from the checksums stored in the file."""
    with h5py.File(path, "r") as f:
        if variant == "dense":
            return str(f["strategy"].attrs["sha256"])
        parts = [f"{name}={f[name].attrs['sha256']}" for name in COMPRESSED_PARTS]
    return hashlib.sha256(" ".join(["mfcli.operator.compressed.v1", *parts]).encode("ascii")).hexdigest()


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("identity")
    fact = optimal_factorization(momentum_workload(20, beta=0.9).matrix, tol=1e-9).factorization
    dense = base / "dense.h5"
    save_artifact(dense, fact, workload_name="momentum", workload_params={"beta": 0.9}, strategy_name="optimal")
    made = compress_artifact(dense, band=3, rank=1, out=base / "comp.h5")
    return {"dense": dense, "compressed": made.path, "built": made.compression}


@pytest.mark.parametrize("variant", ["dense", "compressed"])
def test_identity_is_the_documented_hash_of_stored_checksums(pair, variant):
    op = select_operator(load_artifact(pair["compressed"]), variant)
    assert op.identity_sha256 == stored_identity(pair["compressed"], variant)


def test_identity_does_not_depend_on_the_computed_strategy(pair):
    """C^ = B^-1 A comes from a triangular solve; a last-bit difference in it (another LAPACK)
    leaves the identity unchanged, and the operator built by compress has the identity of the
    operator read back from the file."""
    built = pair["built"]
    read = select_operator(load_artifact(pair["compressed"]), "compressed")
    assert built.identity_sha256 == read.identity_sha256
    f = read.factorization
    nudged_c = np.nextafter(f.strategy, np.inf) * (f.strategy != 0)
    assert dataset_sha256(nudged_c) != dataset_sha256(f.strategy)
    nudged = dataclasses.replace(
        read, factorization=Factorization(workload=f.workload, strategy=nudged_c, decoder=f.decoder, causal=True)
    )
    assert nudged.identity_sha256 == read.identity_sha256
    # The dense and compressed operators of one artifact never share an identity.
    assert DenseOperator(f).identity_sha256 != read.identity_sha256


@pytest.mark.parametrize("operator", ["auto", "dense"])
def test_record_written_then_verified(pair, tmp_path, operator):
    path = tmp_path / "rec.h5"
    shutil.copy(pair["compressed"], path)
    group = record_to_artifact(account(resolve_strategy(path, operator=operator), sigma=1.2, sampling=None))
    with h5py.File(path, "r") as f:
        recorded = f[group].attrs["strategy_sha256"]
    assert recorded == stored_identity(path, "compressed" if operator == "auto" else "dense")
    rep = inspect_artifact(path)
    assert rep.ok, rep.problems
    assert [r["verified"] for r in rep.accounting] == [True]


@pytest.mark.parametrize("operator,other", [("auto", "dense"), ("dense", "compressed")])
def test_a_record_with_the_other_operators_hash_fails(pair, tmp_path, operator, other):
    path = tmp_path / "swap.h5"
    shutil.copy(pair["compressed"], path)
    group = record_to_artifact(account(resolve_strategy(path, operator=operator), sigma=1.2, sampling=None))
    with h5py.File(path, "r+") as f:
        f[group].attrs["strategy_sha256"] = stored_identity(path, other)
    rep = inspect_artifact(path)
    assert not rep.ok
    assert any("strategy_sha256 is not the hash of the" in p for p in rep.problems), rep.problems


def test_one_byte_of_u_changes_the_identity(pair, tmp_path):
    """Flip the last mantissa bit of one entry of compressed/u and update its checksum: the artifact
    still loads (the stored sensitivity agrees to 1e-9), the identity changes, and a record made
    before the edit no longer verifies."""
    path = tmp_path / "u.h5"
    shutil.copy(pair["compressed"], path)
    group = record_to_artifact(account(resolve_strategy(path), sigma=1.2, sampling=None))
    before = select_operator(load_artifact(path)).identity_sha256
    with h5py.File(path, "r+") as f:
        u = f["compressed/u"][...]
        raw = np.ascontiguousarray(u).view(np.uint8).ravel().copy()
        raw[8 * 5] ^= 1  # the lowest byte of u[5, 0] (little-endian float64)
        edited = raw.view(np.float64).reshape(u.shape)
        assert np.count_nonzero(edited != u) == 1
        del f["compressed/u"]
        f["compressed"].create_dataset("u", data=edited).attrs["sha256"] = dataset_sha256(edited)
    after = select_operator(load_artifact(path)).identity_sha256
    assert after != before
    assert after == stored_identity(path, "compressed")
    rep = inspect_artifact(path)
    assert any(f"accounting record {group.split('/')[-1]!r}" in p and "strategy_sha256" in p for p in rep.problems), rep.problems
