"""`mfcli inspect`: one report for every kind of artifact (dense, compressed, banded Toeplitz,
BLT), its numbers read through the kind's Mechanism (issue 23).

Oracles: plain numpy on matrices built here from their definitions (the Toeplitz C from its
coefficients, the BLT C from theta and omega by its recursion; column norms, ||B||_F^2 with
B = A C^-1), and files edited with h5py in a temporary directory.
"""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import save_artifact, save_structured_artifact
from mfcli.model.participation import MinSeparation
from mfcli.model.workloads import prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.schemas import load_schema, validate
from mfcli.services.compress import compress_artifact
from mfcli.services.inspect import inspect_artifact
from mfcli.strategies.blt import BufferedToeplitz
from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz

runner = CliRunner()
N = 16


def _toeplitz_c(first_column: np.ndarray, n: int) -> np.ndarray:
    """The lower-triangular Toeplitz matrix with this first column (by definition)."""
    c = np.zeros((n, n))
    col = np.zeros(n)
    col[: min(n, first_column.size)] = first_column[:n]
    for i in range(n):
        c[i:, i] = col[: n - i]
    return c


def _blt_column(theta: np.ndarray, omega: np.ndarray, n: int) -> np.ndarray:
    """First column of a BLT strategy: c_0 = 1, c_t = sum_j omega_j theta_j^(t-1) (t >= 1)."""
    t = np.arange(1, n)
    return np.concatenate([[1.0], (omega[None, :] * theta[None, :] ** (t[:, None] - 1)).sum(axis=1)])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds")
    w = prefix_workload(N)
    res = optimal_factorization(w.matrix, tol=1e-10)
    dense = d / "dense.h5"
    save_artifact(dense, res.factorization, workload_name=w.name, workload_params=w.params, strategy_name="optimal",
                  solver=res.certificate(), dual_weights=res.dual_weights)
    compressed = d / "compressed.h5"
    compress_artifact(dense, band=3, rank=1, out=compressed)
    bt = BandedToeplitz.sqrt_init(3)
    banded = d / "banded.h5"
    save_structured_artifact(banded, bt, workload=TOEPLITZ_PREFIX, n=N)
    blt = BufferedToeplitz(theta=np.array([0.9, 0.4]), omega=np.array([0.2, 0.1]))
    bltf = d / "blt.h5"
    save_structured_artifact(bltf, blt, workload=TOEPLITZ_PREFIX, n=N, participation=MinSeparation(separation=4))
    columns = {"banded": np.asarray(bt.coefs, dtype=float), "blt": _blt_column(blt.theta, blt.omega, N)}
    return {"dense": dense, "compressed": compressed, "banded": banded, "blt": bltf}, columns


def test_every_kind_has_the_same_report_shape(files):
    """The same top-level fields for every kind, valid against the one JSON schema; what a kind
    lacks is null or empty, with the reason in not_available."""
    paths, _ = files
    reports = {k: inspect_artifact(p) for k, p in paths.items()}
    keys = {k: set(r.to_dict()) for k, r in reports.items()}
    assert all(r.ok for r in reports.values()), {k: r.problems for k, r in reports.items()}
    assert len({frozenset(v) for v in keys.values()}) == 1, keys
    schema = load_schema("inspect")
    for kind in paths:
        r = runner.invoke(app, ["inspect", str(paths[kind]), "--json"])
        assert r.exit_code == 0, r.output
        obj = json.loads(r.stdout)
        assert validate(obj, schema) == [], kind
        assert obj["kind"] == {"dense": "dense", "compressed": "dense", "banded": "banded-toeplitz", "blt": "blt"}[kind]
    for kind in ("banded", "blt"):
        d = reports[kind].to_dict()
        assert d["certificate"] == {} and d["compression"] is None and d["structure"] is not None
        assert {"certificate", "compression", "matrices"} <= set(d["not_available"])
    assert reports["dense"].to_dict()["structure"] is None and "structure" in reports["dense"].not_available
    assert reports["compressed"].to_dict()["operators"][0].startswith("compressed")


@pytest.mark.parametrize("kind", ["dense", "banded", "blt"])
def test_mechanism_numbers_match_plain_numpy(files, kind):
    """sensitivity_single = max column norm of C; under single participation the loss is
    sens^2 ||B||_F^2 with B = A C^-1 (A the prefix sum), all from matrices built here."""
    paths, columns = files
    rep = inspect_artifact(paths[kind])
    if kind == "dense":
        with h5py.File(paths[kind], "r") as f:
            c, b = f["strategy"][...], f["decoder"][...]
    else:
        c = _toeplitz_c(columns[kind], N)
        b = np.tril(np.ones((N, N))) @ np.linalg.inv(c)
    sens = float(np.max(np.linalg.norm(c, axis=0)))
    m = rep.mechanism
    assert m["sensitivity_single"] == pytest.approx(sens, rel=1e-12)
    if kind != "blt":  # single participation: the loss at the column norm
        assert m["sensitivity"] == pytest.approx(sens, rel=1e-12) and m["sensitivity_exact"]
        assert m["loss"]["total"] == pytest.approx(sens**2 * np.sum(b * b), rel=1e-9)
        assert m["loss"]["max"] == pytest.approx(sens**2 * np.max(np.sum(b * b, axis=1)), rel=1e-9)
    else:  # min-separation 4: at least the column norm, losses at that sensitivity
        assert m["sensitivity"] >= sens * (1 - 1e-12)
        assert m["loss"]["total"] == pytest.approx(m["sensitivity"] ** 2 * np.sum(b * b), rel=1e-9)
        assert rep.participation_numbers["sensitivity"] == m["sensitivity"]


def test_structured_tampering_is_a_problem_not_a_refusal(files, tmp_path):
    """A stored number that disagrees with the parameters is reported like a dense artifact's
    (the report is built, exit 1 with one error line naming it), not a different code path."""
    paths, _ = files
    p = tmp_path / "t.h5"
    p.write_bytes(paths["banded"].read_bytes())
    with h5py.File(p, "r+") as f:
        f.attrs["loss_total"] = 1.0
    rep = inspect_artifact(p)
    assert not rep.ok and any("loss_total" in x for x in rep.problems)
    assert rep.to_dict()["checksums"] == {"structured/coefs": True}
    r = runner.invoke(app, ["inspect", str(p)])
    assert r.exit_code == 1 and "check(s) failed" in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "loss_total" in lines[0]


@pytest.mark.parametrize("args", [["--plot", "x.png"], ["--epochs", "2"]])
def test_what_a_structured_artifact_lacks_is_refused_in_one_line(files, tmp_path, args):
    paths, _ = files
    a = [str(tmp_path / x) if x.endswith(".png") else x for x in args]
    r = runner.invoke(app, ["inspect", str(paths["banded"]), *a])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "matrices" in lines[0], r.stderr
    assert not (tmp_path / "x.png").exists()
