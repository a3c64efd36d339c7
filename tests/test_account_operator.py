"""``mfcli account`` accounts the operator that runs (the one noise streams and the adapters stream),
names it, and rounds every privacy number on the safe side.

Oracles: the epsilon printed is compared with one recomputed from the noise stream's own operator
(its dense matrix M, the strategy C = M^-1 it implies, max column norm, then the analytic Gaussian
curve solved with scipy's brentq and dp-accounting's PLD accountant), never with account's output.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from accounting_oracles import gaussian_epsilon
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.cli.rounding import pessimistic
from mfcli.errors import MfcliError
from mfcli.io.artifact import (
    load_artifact,
    save_artifact,
    shipped_artifact,
)
from mfcli.model.workloads import momentum_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.services.account import (
    account,
    calibrate,
    record_to_artifact,
    resolve_strategy,
)
from mfcli.services.compress import compress_artifact
from mfcli.training.noise import noise_stream

runner = CliRunner()
DELTA = 1e-6


def pld_epsilon(sens: float, sigma: float, delta: float = DELTA) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.GaussianDpEvent(noise_multiplier=sigma / sens))
    return acc.get_epsilon(delta)


def stream_sensitivity(path: Path, variant: str = "auto") -> float:
    """sens of the strategy the gradient stream implies: C = M^-1 for M = the streamed C^-1."""
    stream = noise_stream(path, kind="gradient", d=1, seed=7, variant=variant)
    m = stream.operator_matrix()
    c = np.linalg.inv(m)
    return float(np.sqrt(np.max(np.sum(c * c, axis=0))))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("acctop")
    fact = optimal_factorization(momentum_workload(32, beta=0.9).matrix, tol=1e-9).factorization
    dense = base / "m32.h5"
    save_artifact(dense, fact, workload_name="momentum", workload_params={"beta": 0.9}, strategy_name="optimal")
    comp = compress_artifact(dense, band=3, rank=1, out=base / "m32-k3r1.h5").path
    return {"dense": dense, "compressed": comp}


def _json(*args: str) -> dict:
    r = runner.invoke(app, ["account", *args, "--json", "-q"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("which,operator", [("dense", "dense"), ("compressed", "compressed (band 3, rank 1)")])
@pytest.mark.parametrize("sigma", [0.7, 2.0])
def test_single_pass_epsilon_is_the_streamed_operators(artifacts, which, operator, sigma):
    path = artifacts[which]
    out = _json(str(path), "--sigma", str(sigma))
    assert out["operator"] == operator
    sens = stream_sensitivity(path)
    assert out["sensitivity"] == pytest.approx(sens, rel=1e-9)
    eps = out["settings"]["single-pass"]["epsilon"]
    assert eps == pytest.approx(gaussian_epsilon(sens, sigma), rel=1e-8)
    assert eps == pytest.approx(pld_epsilon(sens, sigma), rel=2e-3)


def test_compressed_is_accounted_with_its_larger_sensitivity(artifacts):
    """The bug: the dense C (sensitivity 1) was accounted while C^ was streamed."""
    comp = _json(str(artifacts["compressed"]), "--sigma", "1")
    dense = _json(str(artifacts["compressed"]), "--sigma", "1", "--operator", "dense")
    assert dense["operator"] == "dense"
    assert dense["sensitivity"] == pytest.approx(stream_sensitivity(artifacts["compressed"], "dense"), rel=1e-9)
    assert comp["sensitivity"] != pytest.approx(dense["sensitivity"], rel=1e-6)
    assert comp["settings"]["single-pass"]["epsilon"] == pytest.approx(
        gaussian_epsilon(stream_sensitivity(artifacts["compressed"]), 1.0), rel=1e-8
    )


def test_shipped_momentum_band4_rank2_example(tmp_path):
    """The issue's example: compress momentum-n256 with K = 4, R = 2; at sigma 1 the streamed
    operator has sens 1.053 and epsilon 5.184 (the dense C gives 4.887)."""
    out = compress_artifact(shipped_artifact("momentum-n256"), band=4, rank=2, out=tmp_path / "m.h5").path
    got = _json(str(out), "--sigma", "1")
    sens = stream_sensitivity(out)
    assert sens == pytest.approx(1.0532, abs=1e-4)
    assert got["settings"]["single-pass"]["epsilon"] == pytest.approx(gaussian_epsilon(sens, 1.0), rel=1e-8)
    assert got["settings"]["single-pass"]["epsilon"] == pytest.approx(5.184, abs=1e-3)
    dense = _json(str(out), "--sigma", "1", "--operator", "dense")
    assert dense["settings"]["single-pass"]["epsilon"] == pytest.approx(4.887, abs=1e-3)


def test_table_names_the_operator(artifacts):
    r = runner.invoke(app, ["account", str(artifacts["compressed"]), "--sigma", "1", "-q"])
    assert r.exit_code == 0, r.output
    assert "operator accounted: compressed (band 3, rank 1)" in r.stdout
    r = runner.invoke(app, ["account", str(artifacts["dense"]), "--sigma", "1", "-q"])
    assert "operator accounted: dense" in r.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--operator", "compressed"], "has no compressed decoder"),
        (["--operator", "sparse"], "--operator: operator must be one of auto, dense, compressed"),
    ],
)
def test_operator_choice_refused(artifacts, args, message):
    r = runner.invoke(app, ["account", str(artifacts["dense"]), "--sigma", "1", *args])
    assert r.exit_code != 0
    assert message in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1


def test_compressed_refused_for_builtin_and_npy(tmp_path):
    with pytest.raises(MfcliError, match="needs an artifact with a compressed decoder"):
        resolve_strategy(strategy="identity", n=4, operator="compressed")
    npy = tmp_path / "c.npy"
    np.save(npy, np.eye(4))
    with pytest.raises(MfcliError, match="needs an artifact with a compressed decoder"):
        resolve_strategy(npy, operator="compressed")


def test_mmcc_refused_for_a_compressed_operator_with_negative_entries(artifacts):
    inp = resolve_strategy(artifacts["compressed"])
    assert np.min(inp.strategy) < 0, "the fixture must exercise a C^ with negative entries"
    # the rows that apply are shown; MMCC's is replaced by why it is not run (tests/test_audit_fixes.py)
    report = account(inp, sigma=1.0, sampling=0.1)
    assert report.mmcc is None and report.dp_sgd is not None
    assert re.search(r"mmcc setting does not apply to the compressed \(band 3, rank 1\) operator", report.refused["mmcc"])
    with pytest.raises(MfcliError, match="mmcc setting does not apply"):
        calibrate(inp, "mmcc", target_epsilon=2.0, sampling=0.1)
    r = runner.invoke(app, ["account", str(artifacts["compressed"]), "--sigma", "1", "--sampling", "0.1", "-q"])
    assert r.exit_code == 0 and "MMCC: not run; the mmcc setting does not apply" in r.stdout
    with pytest.raises(MfcliError, match="shuffled-tree setting needs the binary-tree strategy"):
        calibrate(inp, "shuffled-tree", target_epsilon=2.0, sampling=None)


def test_calibration_uses_the_streamed_operator(artifacts):
    """The calibrated sigma meets the target for the streamed operator's sensitivity."""
    path = artifacts["compressed"]
    out = _json(str(path), "--epsilon", "2", "--setting", "single-pass")
    sigma = out["calibration"]["sigma"]
    sens = stream_sensitivity(path)
    assert gaussian_epsilon(sens, sigma) <= 2.0 + 1e-9
    lo = out["calibration"]["sigma_bracket"][0]
    assert gaussian_epsilon(sens, lo) >= 2.0 - 1e-9


def test_write_records_the_operator_and_its_hash(artifacts, tmp_path):
    path = tmp_path / "c.h5"
    path.write_bytes(artifacts["compressed"].read_bytes())
    for operator in ("auto", "dense"):
        inp = resolve_strategy(path, operator=operator)
        group = record_to_artifact(account(inp, sigma=1.0, sampling=None))
        with h5py.File(path) as f:
            attrs = dict(f[group].attrs)
        stream = noise_stream(path, kind="gradient", d=1, seed=1, variant=operator)
        c = np.linalg.inv(stream.operator_matrix())
        assert attrs["operator"] == ("compressed (band 3, rank 1)" if operator == "auto" else "dense")
        # The accounted C is (to rounding) the inverse of the streamed C^-1; the hash is the
        # operator's identity, built from the stored checksums (tests/test_operator_identity.py).
        np.testing.assert_allclose(inp.strategy, c, atol=1e-9)
        with h5py.File(path) as f:
            names = ("workload", "strategy", "compressed/band", "compressed/u", "compressed/v")
            stored = {k: f[k].attrs["sha256"] for k in names}
        expected = (stored["strategy"] if operator == "dense" else hashlib.sha256(
            ("mfcli.operator.compressed.v1 " + " ".join(
                f"{k}={stored[k]}" for k in ("workload", "compressed/band", "compressed/u", "compressed/v"))).encode()
        ).hexdigest())
        assert attrs["strategy_sha256"] == expected
        assert attrs["epsilon_single_pass"] == pytest.approx(
            gaussian_epsilon(stream_sensitivity(path, operator), 1.0), rel=1e-8
        )


def test_subprocess_end_to_end(artifacts):
    res = subprocess.run(
        [sys.executable, "-m", "mfcli", "account", str(artifacts["compressed"]), "--sigma", "1.5", "--json", "-q"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["operator"] == "compressed (band 3, rank 1)"
    assert out["settings"]["single-pass"]["epsilon"] == pytest.approx(
        gaussian_epsilon(stream_sensitivity(artifacts["compressed"]), 1.5), rel=1e-8
    )


# ---------------------------------------------------------------------------------------------
# Safe rounding


@pytest.mark.parametrize(
    "value,down,digits,expected",
    [
        # round-to-nearest would print the first three one unit lower (optimistic for an upper bound)
        (1.0000001, False, 6, "1.00001"),
        (0.55464900001, False, 6, "0.554650"),
        (2.1234561, False, 6, "2.12346"),
        (123456.01, False, 6, "123457"),
        (9.9999991, False, 6, "10"),
        (4.2e-7, False, 3, "4.2e-07"),
        (4.2000001e-7, False, 3, "4.21e-07"),
        # lower bounds and the noise multiplier round down (nearest would round these up)
        (1.9999999, True, 6, "1.99999"),
        (0.94945899, True, 6, "0.949458"),
        (3.0, True, 6, "3"),
        (3.0, False, 6, "3"),
    ],
)
def test_safe_rounding_table(value, down, digits, expected):
    got = pessimistic(value, down=down, digits=digits)
    assert float(got) == float(expected)
    assert (float(got) <= value) if down else (float(got) >= value)


def _details_number(text: str, label: str) -> float:
    m = re.search(rf"{re.escape(label)} ([0-9.e+-]+)", " ".join(text.split()))
    assert m, (label, text)
    return float(m.group(1))


@pytest.mark.parametrize("sigma", ["0.9", "1.3", "3.7"])
def test_printed_zcdp_gdp_and_bracket_are_on_the_safe_side(artifacts, sigma):
    path = str(artifacts["dense"])
    exact = _json(path, "--sigma", sigma)["settings"]["single-pass"]
    r = runner.invoke(app, ["account", path, "--sigma", sigma, "--details", "-q"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert _details_number(r.stdout, "rho-zCDP") >= exact["rho_zcdp"]
    assert _details_number(r.stdout, "mu-GDP") >= exact["mu_gdp"]
    assert _details_number(r.stdout, "sigma/sens") <= exact["noise_multiplier"]
    cal = _json(path, "--epsilon", sigma)["calibration"]
    r = runner.invoke(app, ["account", path, "--epsilon", sigma, "-q"], env={"COLUMNS": "400"})
    m = re.search(r"\[([0-9.e+-]+), ([0-9.e+-]+)\]", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) <= cal["sigma_bracket"][0] and float(m.group(2)) >= cal["sigma_bracket"][1]


def test_dense_sensitivity_of_loaded_artifact_matches(artifacts):
    art = load_artifact(artifacts["dense"])
    inp = resolve_strategy(artifacts["dense"])
    assert inp.operator == "dense"
    np.testing.assert_array_equal(inp.strategy, art.factorization.strategy)


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: resolve_strategy(strategy="identity"), "needs n"),
        (lambda: resolve_strategy("x.npy", strategy="identity", n=4), "not both"),
        (lambda: calibrate(resolve_strategy(strategy="identity", n=4), "mmcc", target_epsilon=1.0, sampling=None),
         "needs a sampling rate"),
        (lambda: record_to_artifact(account(resolve_strategy(strategy="identity", n=4), sigma=1.0, sampling=None)),
         "needs an artifact"),
        (lambda: resolve_strategy(strategy="identity", n=4, operator="sparse"), "operator must be one of"),
    ],
)
def test_library_messages_name_parameters_not_flags(call, needle):
    with pytest.raises(MfcliError, match=needle) as info:
        call()
    assert "--" not in str(info.value)


def test_compress_table_prints_sensitivities_rounded_up(artifacts, tmp_path):
    src = artifacts["dense"]
    args = ["compress", str(src), "--band", "2", "--rank", "1", "-q"]
    js = runner.invoke(app, [*args, "--out", str(tmp_path / "a.h5"), "--json"])
    assert js.exit_code == 0, js.output
    exact = json.loads(js.stdout)["sensitivity"]
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "b.h5")], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    m = re.search(r"compressed sens\(C\^\) \(rounded up\)\s*│?\s*([0-9.e+-]+)", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) >= exact and float(m.group(1)) - exact < 1e-5 * exact
