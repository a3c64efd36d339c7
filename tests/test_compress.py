"""`mfcli compress`: banded plus low-rank decoder, recomputed privacy numbers, artifacts, bad input.

Oracles are independent of mfcli.services.compress: explicit double loops for the layout, np.linalg.solve
(LU, not a triangular solve) and plain forward substitution for C^ = B^-1 A, exact recovery of a
decoder that is exactly banded plus masked low-rank, the optimality of the dense solution (no
valid factorization can beat it), and a brute-force search over every (K, R) of small cost.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import ArtifactError, MfcliError
from mfcli.io.artifact import dataset_sha256, load_artifact, save_artifact, shipped_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.compress import (
    compress_artifact,
    compress_factorization,
    default_output_path,
    fit_low_rank,
    search_compression,
)
from mfcli.strategies.operators import GROUP, BandedLowRank, band_values, read_compressed

runner = CliRunner()


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def solved():
    """Certified optimal factorizations (gap <= 1e-10) of small workloads."""
    out = {}
    for name, w in (("prefix", prefix_workload(32)), ("momentum", momentum_workload(40, beta=0.9))):
        res = optimal_factorization(w.matrix, tol=1e-10)
        assert res.gap <= 1e-10
        out[name] = (w, res)
    return out


def write(path, w, res, **kw):
    save_artifact(path, res.factorization, workload_name=w.name, workload_params=w.params,
                  strategy_name="optimal", solver=res.certificate(), command="test",
                  dual_weights=res.dual_weights, **kw)
    return path


@pytest.fixture
def artifact(tmp_path, solved):
    w, res = solved["momentum"]
    return write(tmp_path / "mom.h5", w, res)


def oracle_decoder(band, u, v):
    """B^ by the definition, entry by entry."""
    n, k = band.shape
    out = np.zeros((n, n))
    for t in range(n):
        for j in range(t + 1):
            if t - j < k:
                out[t, j] = band[t, t - j]
            else:
                out[t, j] = sum(u[t, q] * v[j, q] for q in range(u.shape[1]))
    return out


def forward_substitution(b, a):
    """C^ = B^-1 A for lower-triangular B by the textbook loop."""
    n = b.shape[0]
    c = np.zeros_like(a)
    for t in range(n):
        c[t] = (a[t] - b[t, :t] @ c[:t]) / b[t, t]
    return c


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------


@given(st.integers(1, 9), st.data())
def test_layout_matches_definition_and_is_causal(n, data):
    k = data.draw(st.integers(1, n))
    r = data.draw(st.integers(0, 3))
    seed = data.draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    band = rng.standard_normal((n, k))
    for i in range(k):
        band[:i, i] = 0.0  # outside the matrix, as the format requires
    u, v = rng.standard_normal((n, r)), rng.standard_normal((n, r))
    got = BandedLowRank(band=band, u=u, v=v).dense()
    np.testing.assert_allclose(got, oracle_decoder(band, u, v), rtol=0, atol=1e-12)
    assert not np.any(np.triu(got, 1)), "B^ must be lower-triangular"
    # The low-rank part only touches j <= t - K: the band region is exactly the band values.
    for t in range(n):
        for i in range(min(k, t + 1)):
            assert got[t, t - i] == band[t, i]
    # band_values inverts the layout on the band.
    np.testing.assert_array_equal(band_values(got, k), band)


@pytest.mark.parametrize("which", ["prefix", "momentum"])
def test_full_band_keeps_b_exactly(solved, which):
    _w, res = solved[which]
    fact = res.factorization
    comp = compress_factorization(fact, band=fact.n, rank=0)
    np.testing.assert_array_equal(comp.decoder, fact.decoder)
    assert comp.loss_increase == pytest.approx(0.0, abs=1e-12)
    assert comp.sensitivity == pytest.approx(1.0, rel=1e-10)
    assert comp.stream_cost == fact.n


@pytest.mark.parametrize("which,k,r", [
    ("momentum", 1, 1), ("momentum", 2, 3), ("momentum", 4, 0), ("momentum", 5, 5), ("momentum", 1, 8),
    ("prefix", 1, 2), ("prefix", 3, 3), ("prefix", 8, 0),
])
def test_mask_is_causal_and_band_exact(solved, which, k, r):
    fact = solved[which][1].factorization
    comp = compress_factorization(fact, band=k, rank=r)
    b_hat, b = comp.decoder, fact.decoder
    n = fact.n
    assert not np.any(np.triu(b_hat, 1))
    t, j = np.indices((n, n))
    in_band = (t - j >= 0) & (t - j < k)
    np.testing.assert_array_equal(b_hat[in_band], b[in_band])
    low_rank = np.tril(comp.u @ comp.v.T, -k)
    np.testing.assert_allclose(b_hat - np.where(in_band, b, 0.0), low_rank, atol=1e-12)
    assert not np.any(low_rank[t - j < k]), "low-rank part must be zero for j > t - K"
    assert comp.u.shape == (n, r) and comp.v.shape == (n, r) and comp.band_values.shape == (n, k)


# ---------------------------------------------------------------------------------------------
# Privacy numbers against independent derivations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which,k,r", [
    ("momentum", 1, 0), ("momentum", 1, 1), ("momentum", 3, 2), ("momentum", 6, 4), ("prefix", 2, 2), ("prefix", 1, 5),
])
def test_sensitivity_is_max_column_norm_of_b_hat_inverse_a(solved, which, k, r):
    fact = solved[which][1].factorization
    comp = compress_factorization(fact, band=k, rank=r)
    a = fact.workload
    b_hat = oracle_decoder(comp.band_values, comp.u, comp.v)
    c_lu = np.linalg.solve(b_hat, a)  # general LU solve
    c_loop = forward_substitution(b_hat, a)
    sens_lu = np.sqrt(np.max(np.sum(c_lu**2, axis=0)))
    sens_loop = max(np.linalg.norm(c_loop[:, j]) for j in range(a.shape[0]))
    assert comp.sensitivity == pytest.approx(sens_lu, rel=1e-10)
    assert comp.sensitivity == pytest.approx(sens_loop, rel=1e-10)
    assert comp.loss_total == pytest.approx(sens_lu**2 * np.sum(b_hat**2), rel=1e-10)
    assert comp.loss_increase == pytest.approx(sens_lu**2 * np.sum(b_hat**2) / fact.loss_total - 1, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(b_hat @ comp.strategy, a, atol=1e-9 * np.abs(a).max())
    if comp.loss_increase > 1e-6:
        # The trap: the dense sensitivity (1) would understate the compressed mechanism's.
        assert comp.sensitivity > fact.sensitivity


@given(st.sampled_from(["prefix", "momentum"]), st.integers(1, 12), st.integers(0, 6))
def test_no_compression_beats_the_certified_optimum(solved, which, k, r):
    """Every B^ with C^ = B^-1 A is a valid factorization of A, so its loss cannot fall below the
    certified optimum: a sensitivity computed too small would show up as a negative increase."""
    fact = solved[which][1].factorization
    comp = compress_factorization(fact, band=k, rank=r)
    assert comp.loss_increase >= -1e-9


@pytest.mark.parametrize("which", ["prefix", "momentum"])
def test_loss_increase_goes_to_zero_as_k_goes_to_n(solved, which):
    fact = solved[which][1].factorization
    n = fact.n
    ks = [1, n // 8, n // 4, n // 2, n - 4, n - 1, n]
    inc = []
    for k in ks:
        comp = compress_factorization(fact, band=k, rank=0)
        # Independent: the banded decoder and its loss by LU.
        b_k = np.tril(np.triu(fact.decoder, -(k - 1)))
        c = np.linalg.solve(b_k, fact.workload)
        expect = np.max(np.sum(c**2, axis=0)) * np.sum(b_k**2) / fact.loss_total - 1
        assert comp.loss_increase == pytest.approx(expect, rel=1e-8, abs=1e-12)
        inc.append(comp.loss_increase)
    assert inc[-1] == pytest.approx(0.0, abs=1e-12)
    assert inc[-2] < 1e-2 * inc[0]
    assert inc[-2] < inc[2] < inc[0]
    assert all(x >= -1e-9 for x in inc)


@pytest.mark.parametrize("n,k,r,seed", [(20, 1, 1, 0), (24, 2, 3, 1), (30, 4, 2, 2), (40, 3, 5, 3), (30, 1, 3, 5)])
def test_exact_band_plus_low_rank_decoder_is_recovered(n, k, r, seed):
    """A decoder that IS banded plus masked rank-R is reproduced (A = B, C = I)."""
    rng = np.random.default_rng(seed)
    t, j = np.indices((n, n))
    b = np.where((t - j >= 0) & (t - j < k), rng.uniform(0.5, 1.5, (n, n)), 0.0)
    b += np.tril(rng.standard_normal((n, r)) @ rng.standard_normal((n, r)).T, -k)
    b += 2 * np.eye(n)
    fact = Factorization(workload=b, strategy=np.eye(n), decoder=b)
    fit = fit_low_rank(b, band=k, rank=r, iterations=200)
    assert fit.residual <= 1e-6 * fit.target_norm
    comp = compress_factorization(fact, band=k, rank=r, max_iter=200)
    np.testing.assert_allclose(comp.decoder, b, atol=1e-6)
    assert abs(comp.loss_increase) < 1e-5
    assert comp.sensitivity == pytest.approx(1.0, abs=1e-5)


def test_more_rank_fits_better(solved):
    fact = solved["momentum"][1].factorization
    errs = [compress_factorization(fact, band=2, rank=r).fit_relative_error for r in (0, 2, 6)]
    assert errs[0] > errs[1] > errs[2]


# ---------------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which,budget", [("momentum", 0.01), ("momentum", 0.001), ("prefix", 0.01), ("prefix", 0.05)])
def test_search_finds_the_brute_force_cheapest(solved, which, budget):
    fact = solved[which][1].factorization
    n = fact.n
    found = search_compression(fact, max_loss_increase=budget)
    comp = found.compression
    assert comp.loss_increase <= budget
    assert (comp.band, comp.rank) in {(e.band, e.rank) for e in found.evaluations}
    # Brute force over every (K, R) with K + R <= the cost found.
    cheapest = None
    for cost in range(1, comp.stream_cost + 1):
        for r in range(0, cost):
            k = cost - r
            if r > n - k:
                continue
            inc = compress_factorization(fact, band=k, rank=r).loss_increase
            if inc <= budget and (cheapest is None or (cost, inc) < cheapest[:2]):
                cheapest = (cost, inc, k, r)
        if cheapest is not None:
            break
    assert cheapest[0] == comp.stream_cost
    assert comp.loss_increase == pytest.approx(cheapest[1], rel=1e-12)
    assert len(found.evaluations) < n


def test_search_with_fixed_band_or_rank(solved):
    fact = solved["momentum"][1].factorization
    fixed_k = search_compression(fact, max_loss_increase=0.01, band=2)
    assert fixed_k.compression.band == 2 and fixed_k.compression.loss_increase <= 0.01
    r = fixed_k.compression.rank
    if r > 0:
        assert compress_factorization(fact, band=2, rank=r - 1).loss_increase > 0.01
    fixed_r = search_compression(fact, max_loss_increase=0.01, rank=1)
    assert fixed_r.compression.rank == 1 and fixed_r.compression.loss_increase <= 0.01


def test_search_refuses_what_cannot_be_met(solved):
    fact = solved["momentum"][1].factorization
    with pytest.raises(MfcliError, match="no compression"):
        search_compression(fact, max_loss_increase=1e-3, band=1, rank=0)
    with pytest.raises(MfcliError, match="budget on the loss increase"):
        search_compression(fact, max_loss_increase=-0.1)
    with pytest.raises(MfcliError, match="budget on the loss increase"):
        search_compression(fact, max_loss_increase=float("nan"))


# ---------------------------------------------------------------------------------------------
# Artifacts
# ---------------------------------------------------------------------------------------------


def test_compressed_artifact_layout_and_verification(artifact, solved):
    before = sha(artifact)
    res = compress_artifact(artifact, band=3, rank=2, command="mfcli compress test")
    assert sha(artifact) == before, "the input must never be modified"
    assert res.path == artifact.parent / "mom-k3r2.h5" == default_output_path(artifact, 3, 2)
    art = load_artifact(res.path)  # root checks: dense B, C
    fact = solved["momentum"][1].factorization
    np.testing.assert_array_equal(art.factorization.decoder, fact.decoder)
    assert art.attrs["strategy_name"] == "optimal+compressed"
    assert art.attrs["compression_band"] == 3 and art.attrs["compression_rank"] == 2
    assert art.attrs["sensitivity"] == pytest.approx(fact.sensitivity, rel=1e-12)
    with h5py.File(res.path) as f:
        g = f[GROUP]
        band, u, v = g["band"][...], g["u"][...], g["v"][...]
        assert band.shape == (40, 3) and u.shape == (40, 2) and v.shape == (40, 2)
        for name in ("band", "u", "v"):
            assert g[name].attrs["sha256"] == dataset_sha256(g[name][...])
        b_hat = oracle_decoder(band, u, v)
        c = np.linalg.solve(b_hat, f["workload"][...])
        sens = np.sqrt(np.max(np.sum(c**2, axis=0)))
        assert g.attrs["band"] == 3 and g.attrs["rank"] == 2
        assert g.attrs["sensitivity"] == pytest.approx(sens, rel=1e-10)
        assert g.attrs["loss_total"] == pytest.approx(sens**2 * np.sum(b_hat**2), rel=1e-10)
        assert g.attrs["loss_increase"] == pytest.approx(g.attrs["loss_total"] / f.attrs["loss_total"] - 1, rel=1e-9)
        assert g.attrs["source_sha256"] == before
    comp = read_compressed(art)
    np.testing.assert_allclose(comp.decoder, b_hat, atol=1e-13)
    assert comp.loss_total == pytest.approx(res.compression.loss_total, rel=1e-12)


def test_load_compressed_rejects_tampered_group(artifact, tmp_path):
    out = compress_artifact(artifact, band=2, rank=2).path
    # A stored number edited (group attributes carry no checksum: recomputation must catch it).
    edited = tmp_path / "edited.h5"
    shutil.copy(out, edited)
    with h5py.File(edited, "r+") as f:
        f[GROUP].attrs["sensitivity"] = 1.0
    with pytest.raises(ArtifactError, match="compressed/sensitivity"):
        read_compressed(load_artifact(edited))
    # u replaced with its checksum updated too: passes load_artifact, fails the recomputation.
    forged = tmp_path / "forged.h5"
    shutil.copy(out, forged)
    with h5py.File(forged, "r+") as f:
        u = f[GROUP]["u"][...] * 1.01
        del f[GROUP]["u"]
        ds = f[GROUP].create_dataset("u", data=u)
        ds.attrs["sha256"] = dataset_sha256(u)
    art = load_artifact(forged)
    with pytest.raises(ArtifactError, match="does not match"):
        read_compressed(art)
    # And a plain dense artifact has no compressed group.
    with pytest.raises(ArtifactError, match="no 'compressed' group"):
        read_compressed(load_artifact(artifact))


def test_already_compressed_and_non_causal_need_force(artifact, tmp_path, solved):
    out = compress_artifact(artifact, band=2, rank=1).path
    with pytest.raises(MfcliError, match="already compressed"):
        compress_artifact(out, band=2, rank=2)
    again = compress_artifact(out, band=2, rank=2, force=True, out=tmp_path / "again.h5")
    assert again.compression.rank == 2
    # Non-causal square factorization: C = Q^T L (orthogonal Q mixes the steps), B = A C^-1.
    w, res = solved["momentum"]
    n = w.n
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, n)))
    c = q @ res.factorization.strategy
    fact = Factorization(workload=w.matrix, strategy=c, decoder=w.matrix @ np.linalg.inv(c))
    assert not fact.causal
    nc = tmp_path / "noncausal.h5"
    save_artifact(nc, fact, workload_name=w.name, strategy_name="mixed", command="test")
    with pytest.raises(MfcliError, match="not causal"):
        compress_artifact(nc, band=2, rank=2)
    forced = compress_artifact(nc, band=2, rank=2, force=True)
    assert not np.any(np.triu(forced.compression.decoder, 1))
    assert forced.compression.loss_increase >= -1e-9


def test_non_square_strategy_is_refused(tmp_path):
    n = 8
    a = np.tril(np.ones((n, n)))
    c = np.vstack([np.eye(n), np.eye(n)]) / np.sqrt(2)
    b = np.hstack([a, a]) / np.sqrt(2)
    path = tmp_path / "rect.h5"
    save_artifact(path, Factorization(workload=a, strategy=c, decoder=b, causal=True),
                  workload_name="prefix", strategy_name="doubled", command="test")
    with pytest.raises(MfcliError, match="square"):
        compress_artifact(path, band=2, rank=1, force=True)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,message", [
    (["--band", "0", "--rank", "1"], "--band: band K must be at least 1, got 0"),
    (["--band", "41", "--rank", "0"], "band K = 41 is out of range"),
    (["--band", "38", "--rank", "3"], "rank R = 3 is out of range"),
    (["--band", "2", "--rank", "-1"], "--rank: rank R must be at least 0, got -1"),
    (["--band", "2"], "give both --band and --rank"),
    (["--max-loss-increase", "-1"], "--max-loss-increase: the budget on the loss increase must be"),
    (["--max-loss-increase", "nan"], "--max-loss-increase: the budget on the loss increase must be"),
    (["--band", "1", "--rank", "0", "--max-loss-increase", "0.001"], "no compression"),
    (["--max-iter", "-2", "--band", "1", "--rank", "1"], "--max-iter"),
])
def test_cli_bad_input_one_line(artifact, args, message):
    before = sorted(p.name for p in artifact.parent.iterdir())
    r = runner.invoke(app, ["compress", str(artifact), *args])
    assert r.exit_code != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.stderr
    assert "Traceback" not in r.output
    assert sorted(p.name for p in artifact.parent.iterdir()) == before, "nothing may be written"


def test_messages_name_parameters_in_the_library_and_flags_in_the_cli(artifact, tmp_path):
    out = compress_artifact(artifact, band=2, rank=1, out=tmp_path / "once.h5").path
    with pytest.raises(MfcliError, match="pass force=True") as info:
        compress_artifact(out, band=2, rank=2)
    assert "--" not in str(info.value)
    with pytest.raises(MfcliError, match="give both band and rank"):
        compress_artifact(artifact)
    r = runner.invoke(app, ["compress", str(out), "--band", "2", "--rank", "2"])
    assert r.exit_code == 1 and "use --force" in r.stderr and "force=True" not in r.stderr


def test_cli_refuses_tampered_truncated_and_same_output(artifact, tmp_path):
    truncated = tmp_path / "trunc.h5"
    truncated.write_bytes(artifact.read_bytes()[:5000])
    edited = tmp_path / "edited.h5"
    shutil.copy(artifact, edited)
    with h5py.File(edited, "r+") as f:
        f.attrs["sensitivity"] = 0.5
    for path, message in ((truncated, "truncated or corrupt"), (edited, "stored sensitivity"),
                          (tmp_path / "missing.h5", "does not exist")):
        r = runner.invoke(app, ["compress", str(path), "-k", "2", "-r", "1"])
        assert r.exit_code != 0 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = runner.invoke(app, ["compress", str(artifact), "-k", "2", "-r", "1", "--out", str(artifact), "--force"])
    assert r.exit_code != 0 and "is the input artifact" in r.stderr
    r = runner.invoke(app, ["compress", str(artifact), "-k", "2", "-r", "1"])
    assert r.exit_code == 0
    r = runner.invoke(app, ["compress", str(artifact), "-k", "2", "-r", "1"])
    assert r.exit_code != 0 and "already exists" in r.stderr


def test_cli_json_search(artifact):
    r = runner.invoke(app, ["compress", str(artifact), "--max-loss-increase", "0.01", "--json"])
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["schema_version"] == 2 and obj["command"] == "compress"
    assert obj["loss_increase"] <= 0.01 and obj["stream_cost"] == obj["band"] + obj["rank"]
    assert obj["evaluations"] and all("loss_increase" in e for e in obj["evaluations"])
    comp = read_compressed(load_artifact(obj["artifact"]))
    assert comp.sensitivity == pytest.approx(obj["sensitivity"], rel=1e-12)
    assert comp.loss_increase == pytest.approx(obj["loss_increase"], rel=1e-9)


def test_subprocess_compress_shipped_artifact(tmp_path):
    src = tmp_path / "momentum-n256.h5"
    shutil.copy(shipped_artifact("momentum-n256"), src)
    done = subprocess.run([sys.executable, "-m", "mfcli", "compress", str(src), "--band", "4", "--rank", "4"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "loss increase" in done.stdout
    out = tmp_path / "momentum-n256-k4r4.h5"
    comp = read_compressed(load_artifact(out))
    b_hat = comp.decoder
    c = np.linalg.solve(b_hat, comp.factorization.workload)
    assert comp.sensitivity == pytest.approx(np.sqrt(np.max(np.sum(c**2, axis=0))), rel=1e-10)
    assert 0 <= comp.loss_increase < 0.01
