"""The certified multi-participation solver (mfcli.optimize.multi_solver) and ``mfcli optimize --epochs /
--min-sep``.

Oracles, none of them the solver's own earlier output:

* weak duality both ways: the returned dual bound is below the loss of random *feasible* X (an
  independent primal), and the bound formula at random dual-feasible W is below the returned loss;
* an independent optimiser (scipy SLSQP on the free entries of X, equality constraints explicit)
  at n = 8 reaches the same optimum;
* k = 1: the problem is the single-participation one, so the optimum equals
  :func:`mfcli.optimize.dense.optimal_factorization`'s (a different algorithm, its own certificate);
* sensitivity: brute force over every participation pattern and sign vector (n <= 12) computed
  from C itself, next to :func:`mfcli.model.participation.sensitivity` and the closed forms 1 / sqrt(k);
* the loss is recomputed from the artifact's matrices (sens^2 ||B||_F^2).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from sensitivity_oracle import brute_sensitivity_squared
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import load_artifact
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, sensitivity
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.optimize.multi_solver import (
    NEWTON_GAP,
    _newton_direction,
    multi_participation_factorization,
)
from mfcli.optimize.multi_structure import Structure, dual_bound
from mfcli.services.inspect import inspect_artifact

runner = CliRunner()

SCHEMAS = [
    (8, FixedEpoch(epochs=2)),
    (12, FixedEpoch(epochs=3)),
    (12, FixedEpoch(epochs=4)),
    (8, MinSeparation(separation=2)),
    (12, MinSeparation(separation=4)),
    (12, MinSeparation(separation=3, max_participations=2)),
]


def loss_of(a: np.ndarray, x: np.ndarray) -> float:
    """tr(A X^-1 A^T) by a plain solve (independent of the solver's Cholesky route)."""
    return float(np.trace(a @ np.linalg.solve(x, a.T)))


def random_feasible(n: int, schema: Participation, rng: np.random.Generator) -> np.ndarray:
    """A random X in the feasible set: masked entries zero, diagonal constraints tight."""
    st = Structure(n, schema)
    r = rng.standard_normal((n, n))
    x = r @ r.T / n
    x[st.mask] = 0.0
    x += np.eye(n) * (abs(min(np.linalg.eigvalsh(x).min(), 0.0)) + rng.uniform(0.05, 1.0))
    return st.normalize(x)


@pytest.mark.parametrize(("n", "schema"), SCHEMAS)
@pytest.mark.parametrize("workload", ["prefix", "momentum"])
@pytest.mark.parametrize("newton_gap", [NEWTON_GAP, 0.0], ids=["newton", "lbfgs-only"])
def test_certificate_is_sound_and_tight(n, schema, workload, newton_gap):
    a = prefix_workload(n).matrix if workload == "prefix" else momentum_workload(n, beta=0.9).matrix
    res = multi_participation_factorization(a, schema, tol=1e-8, newton_gap=newton_gap, method="primal")
    assert res.converged and -1e-12 <= res.gap <= 1e-8
    methods = {p.method.split("-")[0] for p in res.history}
    assert ("newton" in methods) == (newton_gap > 0)
    assert res.certificate()["method"] == ("lbfgs-newton-" if newton_gap > 0 else "lbfgs-") + res.structure
    assert res.dual <= res.loss_total * (1 + 1e-12)
    st = Structure(n, schema)
    rng = np.random.default_rng(n)
    for _ in range(20):  # every feasible X costs at least the dual bound
        x = random_feasible(n, schema, rng)
        assert st.scale * loss_of(a, x) >= res.dual * (1 - 1e-12)
    for _ in range(20):  # every dual-feasible W bounds below the returned loss
        z = rng.standard_normal((n, n))
        w = np.where(st.mask, z + z.T, 0.0)
        mu = rng.uniform(0.1, 2.0, size=len(st.count))[st.classes]
        w += np.diag(mu + abs(min(np.linalg.eigvalsh(w).min(), 0.0)) + 0.01)
        diag = np.diag(w)
        assert np.allclose(diag, st.class_mean(diag))
        mass = float(np.sum(np.bincount(st.classes, weights=diag) / st.count))
        assert st.scale * dual_bound(a, w, mass) <= res.loss_total * (1 + 1e-12)


@pytest.mark.parametrize(("n", "schema"), SCHEMAS)
def test_newton_direction_solves_the_projected_newton_system(n, schema):
    """The CG direction d satisfies P(Hess f[d]) = -g, the Hessian taken by central differences
    of the gradient -X^-1 A^T A X^-1 (plain inverses, not the solver's Cholesky route or its
    Hessian formula), and d keeps X feasible (masked entries and class sums unchanged)."""
    import scipy.linalg

    a = momentum_workload(n, beta=0.9).matrix
    st = Structure(n, schema)
    x = random_feasible(n, schema, np.random.default_rng(7 + n))

    def grad(y: np.ndarray) -> np.ndarray:
        yi = np.linalg.inv(y)
        return -yi @ a.T @ a @ yi

    g = st.tangent(grad(x))
    lower = scipy.linalg.cholesky(x, lower=True)
    d = _newton_direction(x, -grad(x), g.copy(), lower, st, gap=1e-24)
    h = 1e-6 / float(np.abs(d).max())
    hd = st.tangent((grad(x + h * d) - grad(x - h * d)) / (2 * h))
    assert np.allclose(hd, -g, rtol=0, atol=1e-5 * float(np.abs(g).max()))
    assert np.all(d[st.mask] == 0.0)
    assert np.allclose(np.bincount(st.classes, weights=np.diag(d)), 0.0, atol=1e-12 * float(np.abs(d).max()))
    assert float(np.vdot(g, d)) < 0  # a descent direction


@pytest.mark.parametrize(("n", "schema"), SCHEMAS)
def test_sensitivity_exact_against_brute_force(n, schema):
    res = multi_participation_factorization(prefix_workload(n).matrix, schema, tol=1e-7)
    c = res.factorization.strategy
    k = schema.participations(n)
    expected2 = 1.0 if isinstance(schema, FixedEpoch) else float(k)
    assert brute_sensitivity_squared(c, schema) == pytest.approx(expected2, rel=1e-9)
    sens = sensitivity(c, schema)
    assert sens.exact and sens.value**2 == pytest.approx(expected2, rel=1e-9)
    assert res.sensitivity == pytest.approx(math.sqrt(expected2), rel=1e-9)
    # The structure the schema's exactness rests on holds in the returned C.
    x = c.T @ c
    st = Structure(n, schema)
    assert np.max(np.abs(x[st.mask])) <= 1e-12 * np.max(np.abs(x))
    # The loss convention: sens^2 ||B||_F^2 of the returned matrices, and A = B C.
    b = res.factorization.decoder
    assert res.loss_total == pytest.approx(expected2 * float(np.sum(b * b)), rel=1e-12)
    assert np.allclose(b @ c, prefix_workload(n).matrix, atol=1e-10)
    assert np.allclose(c, np.tril(c))


@pytest.mark.parametrize("workload", ["prefix", "momentum"])
@pytest.mark.parametrize("schema", [FixedEpoch(epochs=1), MinSeparation(separation=24), MinSeparation(
    separation=3, max_participations=1)])
def test_one_participation_agrees_with_single_solver(workload, schema):
    a = prefix_workload(24).matrix if workload == "prefix" else momentum_workload(24, beta=0.9).matrix
    single = optimal_factorization(a, tol=1e-10)
    res = multi_participation_factorization(a, schema, tol=1e-9)
    assert res.sensitivity == pytest.approx(1.0, rel=1e-12)
    assert res.loss_total == pytest.approx(single.primal, rel=2e-9)
    assert res.dual <= single.primal * (1 + 1e-12) and single.dual <= res.loss_total * (1 + 1e-12)


@pytest.mark.parametrize("schema", [FixedEpoch(epochs=2), MinSeparation(separation=3)])
def test_independent_optimiser_agrees(schema):
    """scipy SLSQP over the free entries of X with the constraints written out."""
    from scipy.optimize import minimize

    n = 8
    a = prefix_workload(n).matrix
    st = Structure(n, schema)
    iu = [(i, j) for i in range(n) for j in range(i, n) if not st.mask[i, j]]

    def build(theta: np.ndarray) -> np.ndarray:
        x = np.zeros((n, n))
        for t, (i, j) in zip(theta, iu, strict=True):
            x[i, j] = x[j, i] = t
        return x

    def obj(theta: np.ndarray) -> float:
        x = build(theta)
        if np.linalg.eigvalsh(x).min() <= 1e-9:
            return 1e6
        return loss_of(a, x)

    diag_idx = [p for p, (i, j) in enumerate(iu) if i == j]
    cons = [{"type": "eq", "fun": (lambda th, c=c: sum(th[p] for p in diag_idx if st.classes[iu[p][0]] == c) - 1.0)}
            for c in range(len(st.count))]
    theta0 = np.array([1.0 / st.count[st.classes[i]] if i == j else 0.0 for i, j in iu])
    found = minimize(obj, theta0, method="SLSQP", constraints=cons, options={"maxiter": 2000, "ftol": 1e-13})
    res = multi_participation_factorization(a, schema, tol=1e-9)
    independent = st.scale * found.fun
    assert independent >= res.dual * (1 - 1e-12)  # the certificate holds against it
    assert res.loss_total == pytest.approx(independent, rel=1e-6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=hst.integers(0, 2**31 - 1), k=hst.sampled_from([2, 3]), banded=hst.booleans())
def test_random_workloads_dual_below_every_feasible(seed, k, banded):
    rng = np.random.default_rng(seed)
    n = 6 if k == 2 else 9
    a = np.tril(rng.standard_normal((n, n)))
    np.fill_diagonal(a, rng.uniform(0.5, 2.0, n))
    schema: Participation = MinSeparation(separation=n // k) if banded else FixedEpoch(epochs=k)
    res = multi_participation_factorization(a, schema, tol=1e-7, max_iter=3000)
    assert res.dual <= res.loss_total * (1 + 1e-12)  # equal to round-off when the optimum is reached exactly
    st = Structure(n, schema)
    for _ in range(5):
        assert st.scale * loss_of(a, random_feasible(n, schema, rng)) >= res.dual * (1 - 1e-12)


# ---------------------------------------------------------------------------------------------
# CLI


def one_error_line(stderr: str, needle: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], stderr


@pytest.mark.parametrize(("opts", "schema", "sens2"), [
    (["--epochs", "4"], FixedEpoch(epochs=4), 1.0),
    (["--min-sep", "8"], MinSeparation(separation=8), 3.0),
    (["--min-sep", "6", "--max-participations", "2"], MinSeparation(separation=6, max_participations=2), 2.0),
])
def test_cli_optimize_schema_json_artifact_inspect(tmp_path, opts, schema, sens2):
    out = tmp_path / "m.h5"
    r = runner.invoke(app, ["optimize", "--n", "24", *opts, "--tol", "1e-7", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["participation"] == {**json.loads(schema.to_json()), "description": schema.describe(24)}
    assert obj["sensitivity"] == pytest.approx(math.sqrt(sens2), rel=1e-9)
    assert obj["converged"] and obj["gap"] <= 1e-7 and obj["dual"] <= obj["loss"]["total"]
    art = load_artifact(out)
    assert art.participation == schema
    c, b = art.factorization.strategy, art.factorization.decoder
    assert brute_sensitivity_squared(c, schema) == pytest.approx(sens2, rel=1e-9)
    assert obj["loss"]["total"] == pytest.approx(sens2 * float(np.sum(b * b)), rel=1e-12)
    assert obj["loss"]["mean"] == pytest.approx(obj["loss"]["total"] / 24, rel=1e-12)
    assert art.attrs["solver"]["primal"] == pytest.approx(obj["loss"]["total"], rel=1e-12)
    report = inspect_artifact(out)
    assert report.ok, report.problems
    assert report.participation_numbers["exact"]
    assert report.participation_numbers["sensitivity"] == pytest.approx(math.sqrt(sens2), rel=1e-9)
    assert report.participation_numbers["loss_total"] == pytest.approx(obj["loss"]["total"], rel=1e-9)
    shown = runner.invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0 and "all checks passed" in shown.stdout


def test_cli_single_json_names_single_participation(tmp_path):
    r = runner.invoke(app, ["optimize", "--n", "8", "--out", str(tmp_path / "s.h5"), "--json", "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["participation"] == {"version": 1, "kind": "single", "description": "single participation"}


def test_cli_default_name_names_the_schema(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["optimize", "--n", "16", "--epochs", "2", "-q"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "artifacts" / "prefix-n16-epochs2.h5").exists()


@pytest.mark.parametrize(("opts", "needle"), [
    (["--epochs", "5"], "not divisible by epochs = 5"),
    (["--min-sep", "33"], "separation = 33 exceeds"),
    (["--epochs", "2", "--min-sep", "4"], "--epochs and --min-sep"),
    (["--max-participations", "2"], "--max-participations applies to --min-sep only"),
    (["--epochs", "0"], "epochs"),
    (["--epochs", "2", "--method", "anderson"], "--method applies to single participation only"),
    (["--epochs", "2", "--warm-start", "prefix-n256"], "--warm-start applies to single participation only"),
])
def test_cli_bad_input_one_line_nothing_written(tmp_path, opts, needle):
    out = tmp_path / "bad.h5"
    r = runner.invoke(app, ["optimize", "--n", "32", *opts, "--out", str(out)])
    assert r.exit_code != 0
    one_error_line(r.stderr, needle)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opts", [["--epochs", "1"], ["--min-sep", "16"], ["--min-sep", "3", "--max-participations", "1"]])
def test_cli_one_participation_uses_the_single_solver(tmp_path, opts):
    """At most one participation: the single-participation optimum (its own certificate), the
    schema recorded; the loss equals the library's single-participation optimum."""
    out = tmp_path / "one.h5"
    r = runner.invoke(app, ["optimize", "--n", "16", *opts, "--tol", "1e-9", "--out", str(out), "--json", "-q"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    art = load_artifact(out)
    assert obj["participation"] == {**json.loads(art.participation.to_json()), "description": art.participation.describe(16)}
    assert obj["participation"]["kind"] != "single"
    single = optimal_factorization(prefix_workload(16).matrix, tol=1e-10)
    assert obj["loss"]["total"] == pytest.approx(single.primal, rel=2e-9)
    assert obj["sensitivity"] == pytest.approx(1.0, rel=1e-12)
    assert sensitivity(art.factorization.strategy, art.participation).value == pytest.approx(1.0, rel=1e-9)
    assert inspect_artifact(out).ok
