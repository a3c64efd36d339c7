"""Forged, edited and transplanted accounting records are refused by every reader of records.

Records are written by the real writers (``mfcli account --write``, ``mfcli plan --out``) on
small artifacts of every kind (dense, compressed, structured), then tampered with h5py. Each
forgery must be reported unverified by ``inspect`` (library and CLI: exit 1, one ``error:`` line
naming the record) and refused by ``held_epsilons`` and ``sampler_for`` with one clear error; the
untouched record verifies, and its re-derived epsilons agree with dp-accounting composed here.
MMCC runs on n <= 8 at a coarse PLD grid (1e-2: still a bound), so every re-derivation is cheap."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.errors import MfcliError
from mfcli.io.artifact import load_any_artifact, save_artifact, save_structured_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.participation import FixedEpoch
from mfcli.schemas import load_schema, validate
from mfcli.services import records
from mfcli.services.inspect import inspect_artifact
from mfcli.services.records import NOT_REDERIVED, UNVERIFIED, VERIFIED, read_records, subject_of, verify_record
from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz
from mfcli.training.samplers import FixedOrderSampler, PoissonSampler, held_epsilons, sampler_for

dp_accounting = pytest.importorskip("dp_accounting")
runner = CliRunner()
N = 8
SIGMA, RATE = 1.3, 0.05
COARSE = ["--value-discretization", "1e-2"]


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def write_record(path: Path, *args: object) -> str:
    """``mfcli account PATH ARGS --write``; returns the new record's id."""
    before = set(read_records(path))
    r = cli("account", path, *args, "--write", "-q")
    assert r.exit_code == 0, r.output
    (rid,) = set(read_records(path)) - before
    return rid


def dense(path: Path, c: np.ndarray, name: str) -> Path:
    a = np.tril(np.ones((c.shape[0], c.shape[0])))
    save_artifact(path, Factorization(workload=a, strategy=c, decoder=a @ np.linalg.inv(c), causal=True),
                  workload_name="prefix", strategy_name=name)
    return path


def banded(n: int, b: float) -> np.ndarray:
    return np.eye(n) + b * np.eye(n, k=-1) + 0.25 * b * np.eye(n, k=-2)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """name -> (artifact, record id), one record each, written by the real writers."""
    base = tmp_path_factory.mktemp("forgery")
    out: dict[str, tuple[Path, str]] = {}
    # Poisson: single-pass, DP-SGD and MMCC rows of a banded C (the MMCC record)
    p = dense(base / "poisson.h5", banded(N, 0.5), "banded")
    out["poisson"] = (p, write_record(p, "--sigma", SIGMA, "--sampling", RATE, *COARSE))
    # the same record's twin on another C (same n, same sigma and rate): the transplant's donor
    q = dense(base / "other.h5", banded(N, 0.9), "banded")
    out["other"] = (q, write_record(q, "--sigma", SIGMA, "--sampling", RATE, *COARSE))
    # single pass, no sampler (the fixed order)
    s = dense(base / "single.h5", banded(N, 0.5), "banded")
    out["single"] = (s, write_record(s, "--sigma", 2))
    # calibrated to a target (account --epsilon): the record claims its sigma meets it
    k = dense(base / "calibrated.h5", banded(N, 0.5), "banded")
    out["calibrated"] = (k, write_record(k, "--epsilon", 2))
    # a structured BLT with a Poisson record (its MMCC on the materialised C)
    from mfcli.strategies.blt import BufferedToeplitz

    t = base / "blt.h5"
    save_structured_artifact(t, BufferedToeplitz(theta=np.array([0.9, 0.4]), omega=np.array([0.2, 0.1])),
                             workload=TOEPLITZ_PREFIX, n=N)
    out["structured"] = (t, write_record(t, "--sigma", SIGMA, "--sampling", RATE, *COARSE))
    # a structured banded Toeplitz under cyclic Poisson (2 epochs)
    u = base / "cyclic.h5"
    save_structured_artifact(u, BandedToeplitz(np.array([1.0, 0.5])), workload=TOEPLITZ_PREFIX, n=N,
                             participation=FixedEpoch(epochs=2))
    out["cyclic"] = (u, write_record(u, "--sigma", 2, "--sampling", 0.5, "--batching", "cyclic"))
    # a compressed artifact and its record of C^ (single pass)
    from mfcli.model.workloads import momentum_workload
    from mfcli.optimize.dense import optimal_factorization
    from mfcli.services.compress import compress_artifact

    d = base / "momentum.h5"
    fact = optimal_factorization(momentum_workload(16, beta=0.9).matrix, tol=1e-9).factorization
    save_artifact(d, fact, workload_name="momentum", workload_params={"beta": 0.9}, strategy_name="optimal")
    cpath = compress_artifact(d, band=3, rank=1, out=base / "compressed.h5").path
    out["compressed"] = (cpath, write_record(cpath, "--sigma", 1.5))
    # the identity under Poisson sampling: DP-SGD, for the dp-accounting cross-check
    i = dense(base / "identity.h5", np.eye(N), "identity")
    out["identity"] = (i, write_record(i, "--sigma", 1.0, "--sampling", 0.1, *COARSE))
    return out


def copy_of(made, name: str, tmp_path: Path) -> tuple[Path, str]:
    src, rid = made[name]
    path = tmp_path / f"{name}.h5"
    shutil.copy(src, path)
    return path, rid


# ---------------------------------------------------------------------------------------------
# the untouched records verify, and agree with dp-accounting


@pytest.mark.parametrize("name", ["poisson", "single", "calibrated", "structured", "cyclic", "compressed",
                                  "identity"])
def test_untouched_records_verify_everywhere(made, name):
    path, rid = made[name]
    check = verify_record(read_records(path)[rid], subject_of(load_any_artifact(path)))
    assert check.status == VERIFIED, check.problems
    assert all(c.status == VERIFIED and c.rederived is not None and c.stored >= c.rederived * (1 - 1e-9)
               for c in check.settings)
    r = cli("inspect", path)
    assert r.exit_code == 0, r.output
    js = cli("inspect", path, "--json")
    assert js.exit_code == 0 and validate(json.loads(js.stdout), load_schema("inspect")) == []
    assert held_epsilons(path, rid)[0] == rid
    assert sampler_for(path, examples=50, seed=3, record=rid).steps == load_any_artifact(path).n


def test_rederived_epsilons_agree_with_dp_accounting(made):
    """C = I under Poisson sampling is DP-SGD: the re-derived dp-sgd and mmcc rows are
    n self-composed Poisson-subsampled Gaussians, composed here by dp-accounting itself."""
    path, rid = made["identity"]
    check = verify_record(read_records(path)[rid], subject_of(load_any_artifact(path)))
    got = {c.setting: c.rederived for c in check.settings}
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), N)
    truth = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-2).compose(event).get_epsilon(1e-6)
    # an independent upper bound of another kind: dp-accounting's RDP accountant
    rdp = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(1e-6)
    assert got["dp-sgd"] == pytest.approx(truth, rel=1e-9)
    # MMCC of C = I is DP-SGD (no tail events): equal to dp-accounting's PLD at its grid
    assert got["mmcc"] == pytest.approx(truth, rel=1e-3) and got["mmcc"] <= rdp
    # single pass: the exact analytic Gaussian (sens 1, sigma 1)
    from accounting_oracles import gaussian_epsilon

    assert got["single-pass"] == pytest.approx(gaussian_epsilon(1.0, 1.0, 1e-6), rel=1e-6)
    _, held = held_epsilons(path, rid)
    assert set(held) == {"mmcc", "dp-sgd"} and held["dp-sgd"] == pytest.approx(truth, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# the forgeries


def _set(key: str, value):
    def edit(g, f, made):
        g.attrs[key] = value
    return edit


def _scale(key: str, factor: float):
    def edit(g, f, made):
        g.attrs[key] = float(g.attrs[key]) * factor
    return edit


def _forged_mixtures(g, f, made):
    """The MMCC event's mixture probabilities of every positive sensitivity scaled by 0.1 (the mass
    moved to sensitivity 0, so each is still a mixture) and epsilon_mmcc recomputed from the forged
    event (what the previous verifier recomposed and accepted)."""
    from mfcli.accounting import mog_pld

    ev = json.loads(g.attrs["dp_event_mmcc"])
    plds = []
    for sc in ev["events"]:
        mix = sc["event"]
        # a tenth of the mass on every positive sensitivity, the rest moved to sensitivity 0
        probs = [q if s == 0 else 0.1 * q for s, q in zip(mix["sensitivities"], mix["sampling_probs"], strict=True)]
        if 0.0 not in mix["sensitivities"]:
            mix["sensitivities"], probs = [0.0, *mix["sensitivities"]], [0.0, *probs]
        probs[mix["sensitivities"].index(0.0)] += 1.0 - sum(probs)
        mix["sampling_probs"] = probs
        pld = mog_pld.mixture_pld(mix["standard_deviation"], mix["sensitivities"], mix["sampling_probs"],
                                  value_discretization_interval=1e-2)
        plds.append(pld.self_compose(sc["count"]) if sc["count"] > 1 else pld)
    total = plds[0]
    for pld in plds[1:]:
        total = mog_pld.compose(total, pld)
    results = json.loads(g.attrs["results"])
    g.attrs["dp_event_mmcc"] = json.dumps(ev)
    g.attrs["epsilon_mmcc"] = float(total.get_epsilon_for_delta(results["mmcc"]["delta_pld"]))
    assert g.attrs["epsilon_mmcc"] < 0.5 * results["mmcc"]["epsilon"]  # the forgery claims much less


def _transplant(g, f, made):
    """The record of another artifact (same n, sigma, rate), copied in with its strategy_sha256
    rewritten to this artifact's."""
    src, rid = made["other"]
    sha = g.attrs["strategy_sha256"]
    name = g.name
    del f[name]
    with h5py.File(src, "r") as donor:
        donor.copy(donor[f"accounting/{rid}"], f["accounting"], name=name.split("/")[-1])
    f[name].attrs["strategy_sha256"] = sha


def _hand_made(g, f, made):
    """A group made by hand: no event, no checksum, a small epsilon."""
    name = g.name
    del f[name]
    h = f.create_group(name)
    h.attrs.update({"format": "mfcli.accounting", "format_version": 1, "settings": json.dumps(["mmcc"]),
                    "sigma": SIGMA, "sampling": RATE, "batching": "poisson", "delta": 1e-6,
                    "epsilon_mmcc": 0.001, "operator": "dense"})


def _calibration(key: str, value: float):
    def edit(g, f, made):
        cal = json.loads(g.attrs["calibration"])
        cal[key] = value
        g.attrs["calibration"] = json.dumps(cal)
    return edit


def _row(setting: str, key: str, value: float):
    def edit(g, f, made):
        rows = json.loads(g.attrs["results"])
        rows[setting][key] = value
        g.attrs["results"] = json.dumps(rows)
    return edit


def _drop(key: str):
    def edit(g, f, made):
        del g.attrs[key]
    return edit


def _both_noise(factor: float):
    """noise_multiplier and sensitivity edited so that sigma = noise_multiplier x sensitivity still
    holds: consistent with each other, not with the operator."""
    def edit(g, f, made):
        g.attrs["noise_multiplier"] = float(g.attrs["noise_multiplier"]) * factor
        g.attrs["sensitivity"] = float(g.attrs["sensitivity"]) / factor
    return edit


def _dense_sensitivity(g, f, made):
    """The compressed record given the dense C's column norm (another operator's) and its multiplier."""
    c = np.asarray(f["strategy"])
    sens = float(np.sqrt((c * c).sum(axis=0).max()))
    assert not math.isclose(sens, float(g.attrs["sensitivity"]), rel_tol=1e-6)
    g.attrs["sensitivity"] = sens
    g.attrs["noise_multiplier"] = float(g.attrs["sigma"]) / sens


FORGERIES = [
    # (id, artifact, edit, words of the first problem)
    ("rate 0.05 -> 0.5", "poisson", _set("sampling", 0.5), "stored epsilon"),
    ("rate as the string '0.5'", "poisson", _set("sampling", "0.5"), "sampling rate '0.5' is not a number"),
    ("mixture probabilities x0.1, epsilon recomputed", "poisson", _forged_mixtures, "mmcc: stored epsilon"),
    ("mixture probabilities x0.1, structured", "structured", _forged_mixtures, "mmcc: stored epsilon"),
    ("transplanted record, sha rewritten", "poisson", _transplant, "re-derived"),
    ("single pass edited to 4 epochs", "single", _set("participation", FixedEpoch(epochs=4).to_json()),
     "single-pass setting assumes single participation"),
    ("epsilon -1", "poisson", _set("epsilon_mmcc", -1.0), "not a finite non-negative number"),
    ("epsilon NaN", "poisson", _set("epsilon_mmcc", float("nan")), "not a finite non-negative number"),
    ("epsilon inf", "single", _set("epsilon_single_pass", float("inf")), "not a finite non-negative number"),
    ("epsilon as a string", "single", _set("epsilon_single_pass", "0.5"), "not a finite non-negative number"),
    ("sigma x2", "single", _scale("sigma", 2.0), "noise_multiplier"),
    ("event removed", "poisson", _drop("dp_event_mmcc"), "no stored dp-accounting event"),
    ("checksum removed", "single", _drop("strategy_sha256"), "no strategy_sha256"),
    ("hand-made group, no event, no checksum", "poisson", _hand_made, "no strategy_sha256"),
    ("batching poisson -> cyclic", "poisson", _set("batching", "cyclic"), "account computes no"),
    ("structured rate edited", "structured", _scale("sampling", 10.0), "stored epsilon"),
    ("cyclic rate edited", "cyclic", _scale("sampling", 0.2), "cyclic-poisson"),
    ("cyclic schema edited", "cyclic", _set("participation", FixedEpoch(epochs=4).to_json()), "declares"),
    ("compressed record relabelled dense", "compressed", _set("operator", "dense"), "strategy_sha256 is not the hash"),
    ("delta x10, epsilon kept", "poisson", _scale("delta", 10.0), "mmcc"),
    ("PLD grid 1e-12 (a work bomb)", "poisson", _row("dp-sgd", "value_discretization", 1e-12), "finer than"),
    ("mixture grid 1e-9 (a memory bomb)", "poisson", _row("mmcc", "mixture_grid", 1e-9), "finer than"),
    ("calibration target lowered", "calibrated", _calibration("target_epsilon", 0.5), "target was not met"),
    ("calibration sigma edited", "calibrated", _calibration("sigma", 9.0), "calibration's sigma"),
    # the noise convention: sensitivity and noise_multiplier are re-derived from the operator, never trusted
    ("noise_multiplier x0.5", "single", _scale("noise_multiplier", 0.5), "noise_multiplier"),
    ("noise_multiplier x2, Poisson", "poisson", _scale("noise_multiplier", 2.0), "noise_multiplier"),
    ("noise_multiplier as a string", "single", _set("noise_multiplier", "1.0"), "noise_multiplier '1.0'"),
    ("sensitivity x2", "poisson", _scale("sensitivity", 2.0), "sensitivity"),
    ("sensitivity and noise_multiplier edited together", "single", _both_noise(0.5), "sensitivity"),
    ("structured sensitivity x0.5", "structured", _scale("sensitivity", 0.5), "sensitivity"),
    ("cyclic noise_multiplier x0.5", "cyclic", _scale("noise_multiplier", 0.5), "noise_multiplier"),
    ("compressed sensitivity of the dense C", "compressed", _dense_sensitivity, "sensitivity"),
    ("calibration noise_multiplier edited", "calibrated", _calibration("noise_multiplier", 9.0),
     "calibration's noise_multiplier"),
]


@pytest.mark.parametrize("name,edit,needle", [f[1:] for f in FORGERIES], ids=[f[0] for f in FORGERIES])
def test_forged_record_is_refused_by_every_reader(made, tmp_path, name, edit, needle):
    path, rid = copy_of(made, name, tmp_path)
    with h5py.File(path, "r+") as f:
        edit(f[f"accounting/{rid}"], f, made)
    check = verify_record(read_records(path)[rid], subject_of(load_any_artifact(path)), deep=True)
    assert check.status == UNVERIFIED and any(needle in p for p in check.problems), check.problems
    # inspect: the library report and the CLI (exit 1, one error line naming the record)
    if name in ("structured", "cyclic"):
        r = cli("inspect", path)
    else:
        rep = inspect_artifact(path)
        assert not rep.ok and any(rid in p and needle in p for p in rep.problems), rep.problems
        assert [a["status"] for a in rep.accounting] == [UNVERIFIED]
        r = cli("inspect", path)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 1 and len(errors) == 1 and rid in errors[0], r.output
    assert "Traceback" not in r.output
    # the samplers: one clear refusal, whichever way the record is named
    for call in (lambda: held_epsilons(path, rid), lambda: held_epsilons(path),
                 lambda: sampler_for(path, examples=100, seed=1, record=rid),
                 lambda: sampler_for(path, examples=100, seed=1)):
        with pytest.raises(MfcliError, match=f"record '{rid}' of .* does not verify against the artifact"):
            call()


def test_a_larger_stored_epsilon_is_only_pessimistic(made, tmp_path):
    path, rid = copy_of(made, "poisson", tmp_path)
    with h5py.File(path, "r+") as f:
        f[f"accounting/{rid}"].attrs["epsilon_mmcc"] = float(f[f"accounting/{rid}"].attrs["epsilon_mmcc"]) * 1.01
    assert inspect_artifact(path).ok
    assert held_epsilons(path, rid)[1]["mmcc"] > 0


def test_a_group_of_another_format_is_listed_never_used(made, tmp_path):
    path, rid = copy_of(made, "poisson", tmp_path)
    with h5py.File(path, "r+") as f:
        f.create_group("accounting/zz-mine").attrs["epsilon_mmcc"] = 0.001
    rep = inspect_artifact(path)
    assert rep.ok and sorted(a["status"] for a in rep.accounting) == sorted([VERIFIED, records.FOREIGN])
    with pytest.raises(MfcliError, match=r"accounting/zz-mine of .* is not an mfcli\.accounting record"):
        held_epsilons(path, "zz-mine")
    assert held_epsilons(path)[0] == rid  # without an id, only mfcli records are candidates


def test_renamed_compressed_group_fails_inspect(made, tmp_path):
    path, rid = copy_of(made, "compressed", tmp_path)
    with h5py.File(path, "r+") as f:
        f.move("compressed", "compressed_old")
    rep = inspect_artifact(path)
    assert any("declares a compressed decoder" in p and "no 'compressed' group" in p for p in rep.problems)
    assert any("which this artifact does not have" in p for p in rep.problems)  # its record's operator is gone
    r = cli("inspect", path)
    assert r.exit_code == 1 and "declares a compressed decoder" in r.stderr
    with pytest.raises(MfcliError, match="does not verify"):
        held_epsilons(path, rid)


# ---------------------------------------------------------------------------------------------
# MMCC above the default limit: not re-derived (never verified) without --deep


def test_mmcc_not_rederived_without_deep(made, tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MMCC_REDERIVE_MAX_N", N - 1)
    path, rid = copy_of(made, "poisson", tmp_path)
    rep = inspect_artifact(path)
    assert rep.ok and rep.not_rederived == (rid,)
    statuses = {c["setting"]: c["status"] for c in rep.accounting[0]["setting_checks"]}
    assert statuses == {"single-pass": VERIFIED, "dp-sgd": VERIFIED, "mmcc": NOT_REDERIVED}
    assert rep.accounting[0]["verified"] is False
    r = cli("inspect", path)
    assert r.exit_code == 0 and "not re-derived" in r.stdout and "--deep" in r.stdout
    js = json.loads(cli("inspect", path, "--json").stdout)
    assert js["accounting_not_rederived"] == [rid] and validate(js, load_schema("inspect")) == []
    assert "are NOT verified" in " ".join(r.stdout.split())
    assert cli("inspect", path, "--deep").exit_code == 0
    assert inspect_artifact(path, deep=True).accounting[0]["status"] == VERIFIED
    # a forged MMCC row is not passed as verified without --deep, and is caught with it
    with h5py.File(path, "r+") as f:
        _forged_mixtures(f[f"accounting/{rid}"], f, made)
    assert inspect_artifact(path).accounting[0]["status"] == NOT_REDERIVED
    deep = cli("inspect", path, "--deep")
    assert deep.exit_code == 1 and "mmcc" in deep.stderr
    with pytest.raises(MfcliError, match="does not verify"):  # the samplers always re-derive
        sampler_for(path, examples=10, seed=1)


def test_structured_inspect_shows_not_rederived(made, tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MMCC_REDERIVE_MAX_N", N - 1)
    path, _rid = copy_of(made, "structured", tmp_path)
    r = cli("inspect", path, "--json")
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.stdout)["accounting_records"]
    assert rec["status"] == NOT_REDERIVED and rec["verified"] is False
    r = cli("inspect", path, "--deep", "--json")
    assert json.loads(r.stdout)["accounting_records"][0]["status"] == VERIFIED


# ---------------------------------------------------------------------------------------------
# the fixed order: a record without a batch sampler (mfcli plan's fixed-order row)


def test_plan_fixed_order_record_gives_the_fixed_order_sampler(tmp_path):
    out = tmp_path / "plan.h5"
    r = cli("plan", "--examples", 200, "--batch", 20, "--epochs", 2, "--epsilon", 4, "--batching", "fixed-order",
            "--bands", 2, "--buffers", 2, "--workers", 0, "--out", out, "-q")
    assert r.exit_code == 0, r.output
    s = sampler_for(out, examples=200, seed=5)
    assert isinstance(s, FixedOrderSampler) and s.steps == 20 and s.period == 10  # 2 epochs of 10 steps
    _rid, held = held_epsilons(out)
    (only,) = read_records(out).values()
    assert set(held) == {"deterministic"} and held["deterministic"] == only["epsilon_deterministic"] <= 4
    # the plan's record verifies in inspect too
    assert cli("inspect", out).exit_code == 0


def test_single_pass_record_is_one_epoch_of_fixed_order(made):
    path, _rid = made["single"]
    s = sampler_for(path, examples=40, seed=2)
    assert isinstance(s, FixedOrderSampler) and s.period == N
    assert set(held_epsilons(path)[1]) == {"single-pass"}


def test_examples_are_bounded(made):
    path, _rid = made["poisson"]
    with pytest.raises(MfcliError, match="at most 1,000,000,000"):
        sampler_for(path, examples=10**12, seed=1)
    with pytest.raises(MfcliError, match="at most"):
        PoissonSampler(examples=10**12, rate=0.1, steps=4, seed=1)
    assert math.isfinite(held_epsilons(path)[1]["mmcc"])


# ---------------------------------------------------------------------------------------------
# verify_record=False: a fixed-order record is still never taken at its word


def _fixed_order_records(made, tmp_path) -> dict[str, tuple[Path, str, float]]:
    """name -> (artifact, record id, the true epsilon by brute force): single pass (the largest
    column norm) and two fixed epochs (the largest norm of a sum of columns j, j + N/2; C >= 0, so
    the all-ones gradients attain it), each Gaussian at sigma = 2 by the independent oracle."""
    from accounting_oracles import gaussian_epsilon

    c = banded(N, 0.5)
    single, rid = copy_of(made, "single", tmp_path)
    epochs = dense(tmp_path / "epochs.h5", c, "banded")
    rid2 = write_record(epochs, "--sigma", 2, "--epochs", 2)
    half = N // 2
    sens_epochs = max(float(np.linalg.norm(c[:, j] + c[:, j + half])) for j in range(half))
    return {"single": (single, rid, gaussian_epsilon(float(np.linalg.norm(c, axis=0).max()), 2.0)),
            "epochs": (epochs, rid2, gaussian_epsilon(sens_epochs, 2.0))}


@pytest.mark.parametrize("schema", ["single", "epochs"])
@pytest.mark.parametrize("forgery", ["untouched", "sigma halved", "epsilon halved", "sigma zero", "sigma nan"])
def test_unverified_fixed_order_record_is_checked_against_its_sigma(made, tmp_path, schema, forgery):
    from mfcli.training.record import training_record

    path, rid, truth = _fixed_order_records(made, tmp_path)[schema]
    setting = "single-pass" if schema == "single" else "deterministic"
    key = f"epsilon_{setting.replace('-', '_')}"
    with h5py.File(path, "r+") as f:
        g = f[f"accounting/{rid}"]
        if forgery == "sigma halved":
            g.attrs["sigma"] = float(g.attrs["sigma"]) / 2
        elif forgery == "epsilon halved":
            g.attrs[key] = float(g.attrs[key]) / 2
        elif forgery == "sigma zero":
            g.attrs["sigma"] = 0.0
        elif forgery == "sigma nan":
            g.attrs["sigma"] = float("nan")
    if forgery == "untouched":
        rec = training_record(path, rid, verify_record=False)
        assert rec.epsilons[setting] == pytest.approx(truth, rel=1e-9)
        return
    with pytest.raises(MfcliError, match=f"record '{rid}' of .* (does not describe this artifact|finite positive sigma)"
                       "|accounting record cannot be read"):
        training_record(path, rid, verify_record=False)
    with pytest.raises(MfcliError):  # the default, full verification refuses it too
        training_record(path, rid)
