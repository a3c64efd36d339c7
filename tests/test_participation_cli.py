"""Participation schemas outside the library: the artifact attribute ``participation``, ``mfcli
inspect`` and ``mfcli compare`` under a schema, and ``mfcli account`` refusing a multi-participation
artifact.

The numbers under a schema are checked against an independent derivation in this file: brute
force over every participation pattern of the schema (``patterns``) and every sign vector on it,
which brackets the sensitivity (the best sign vector is an actual pair of adjacent inputs: a lower
bound; sum |X_il| over the pattern is an upper bound), and closed forms (identity under k epochs:
sens = sqrt(k)).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from sensitivity_oracle import brute_bounds_squared
from typer.testing import CliRunner

import mfcli.model.participation as part
from mfcli.cli.app import app
from mfcli.errors import ArtifactError
from mfcli.io import artifact as artifact_module
from mfcli.io.artifact import load_artifact, save_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, SingleParticipation, sensitivity
from mfcli.model.workloads import momentum_workload, prefix_workload
from mfcli.services.compare import run_comparison
from mfcli.services.compress import compress_artifact
from mfcli.strategies.baselines import build_strategy

runner = CliRunner()


def one_error_line(stderr: str, *needles: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], stderr


def factorization(name: str, n: int = 8) -> Factorization:
    return build_strategy(name, prefix_workload(n)).factorization


def upper_bound_factorization() -> Factorization:
    """A causal C with C^T C = X = [[1, -.4, -.4], [-.4, 1, -.4], [-.4, -.4, 1]], B = I, A = C. Under
    3 epochs of one step the single pattern's sign graph is unbalanced: the sum of |X| (5.4) bounds
    the squared sensitivity, the best sign vector reaches 3.8 only. The truth is 4.2: three unit
    vectors at 120 degrees reach it and y = 1.4 (1, 1, 1) is dual feasible (Diag(y) - X = 0.4 1 1^T),
    and mfcli certifies it (exact). With no pattern certified (``no_certificates``) the result is
    the bound 3 lambda_max(X) = 4.2 with the sign witness 3.8: an upper bound, as with a budget
    exhausted on a large schema."""
    x = np.array([[1.0, -0.4, -0.4], [-0.4, 1.0, -0.4], [-0.4, -0.4, 1.0]])
    j = np.eye(3)[::-1]
    c = j @ np.linalg.cholesky(x).T @ j  # lower-triangular, and still C^T C = X (J X J = X)
    return Factorization(workload=c, strategy=c, decoder=np.eye(3), causal=True)


@pytest.fixture
def no_certificates(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pattern gets a semidefinite certificate or a vector witness: results stay bounds."""
    monkeypatch.setattr(part, "CERTIFY_LIMIT", 0)


def test_upper_bound_factorization_is_certified_exact() -> None:
    fact = upper_bound_factorization()
    res = sensitivity(fact.strategy, FixedEpoch(epochs=3))
    assert res.exact and res.value**2 == pytest.approx(4.2, rel=1e-10) and res.value**2 >= 4.2 * (1 - 1e-14)


# ---------------------------------------------------------------------------------------------
# The artifact attribute

SCHEMAS: list[Participation] = [
    SingleParticipation(), FixedEpoch(epochs=2), FixedEpoch(epochs=8), MinSeparation(separation=3),
    MinSeparation(separation=3, max_participations=2),
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.to_json())
def test_artifact_round_trip(schema: Participation, tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    save_artifact(path, factorization("sqrt"), workload_name="prefix", strategy_name="sqrt", participation=schema)
    with h5py.File(path) as f:
        assert json.loads(f.attrs["participation"]) == json.loads(schema.to_json())
    assert load_artifact(path).participation == schema


def test_artifact_without_participation_has_no_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Not given: the attribute is absent (v1 files stay as they were), it reads as single, and the
    # file is byte for byte the one written without the keyword.
    monkeypatch.setattr(artifact_module, "utc_now", lambda: "2026-01-01T00:00:00Z")
    fact = factorization("sqrt")
    digest_plain = save_artifact(tmp_path / "a.h5", fact, workload_name="prefix", strategy_name="sqrt")
    digest_none = save_artifact(tmp_path / "b.h5", fact, workload_name="prefix", strategy_name="sqrt", participation=None)
    assert digest_plain == digest_none
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()
    with h5py.File(tmp_path / "a.h5") as f:
        assert "participation" not in f.attrs
    assert load_artifact(tmp_path / "a.h5").participation == SingleParticipation()


def test_shipped_artifacts_are_single_participation() -> None:
    from mfcli.io.artifact import shipped_artifact

    for name in ("prefix-n256", "momentum-n256"):
        assert load_artifact(shipped_artifact(name)).participation == SingleParticipation()


def test_save_refuses_a_schema_that_does_not_fit(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="not divisible by epochs = 3"):
        save_artifact(tmp_path / "a.h5", factorization("sqrt"), workload_name="prefix", strategy_name="sqrt",
                      participation=FixedEpoch(epochs=3))
    assert list(tmp_path.iterdir()) == []


MALFORMED = [
    ("not json", "not valid JSON"),
    ('["single"]', "must be a JSON object"),
    ('{"version": 2, "kind": "single"}', "version must be 1"),
    ('{"version": 1, "kind": "bogus"}', "kind must be one of"),
    ('{"version": 1, "kind": "fixed-epoch"}', "expected ['epochs', 'kind', 'version']"),
    ('{"version": 1, "kind": "fixed-epoch", "epochs": "2"}', "epochs must be an integer"),
    ('{"version": 1, "kind": "fixed-epoch", "epochs": 3}', "not divisible by epochs = 3"),
    ('{"version": 1, "kind": "min-sep", "separation": 9, "max_participations": null}', "separation = 9 exceeds"),
    (5, "must be a JSON string"),
]


def _with_participation(tmp_path: Path, raw: object) -> Path:
    path = tmp_path / "bad.h5"
    save_artifact(path, factorization("sqrt"), workload_name="prefix", strategy_name="sqrt")
    with h5py.File(path, "r+") as f:  # attributes are not checksummed: the reader must check them
        f.attrs["participation"] = raw
    return path


@pytest.mark.parametrize("raw, message", MALFORMED, ids=[str(r) for r, _ in MALFORMED])
def test_malformed_attribute_is_refused(raw: object, message: str, tmp_path: Path) -> None:
    path = _with_participation(tmp_path, raw)
    with pytest.raises(ArtifactError) as info:
        load_artifact(path)
    text = str(info.value)
    assert "\n" not in text and "participation" in text and message in text, text
    r = runner.invoke(app, ["inspect", str(path)])
    assert r.exit_code == 1
    assert message in r.stderr and r.stderr.count("error:") == 1, r.stderr
    assert "Traceback" not in r.stderr
    r = runner.invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["ok"] is False and report["participation"] is None
    assert any(message in p for p in report["problems"])
    r = runner.invoke(app, ["account", str(path), "--sigma", "4"])
    assert r.exit_code == 1
    one_error_line(r.stderr, message)


# ---------------------------------------------------------------------------------------------
# inspect


def test_inspect_shows_exact_sensitivity_and_losses_under_the_schema(tmp_path: Path) -> None:
    fact = factorization("sqrt")
    schema = FixedEpoch(epochs=2)
    path = tmp_path / "a.h5"
    save_artifact(path, fact, workload_name="prefix", strategy_name="sqrt", participation=schema)
    lower, upper = brute_bounds_squared(fact.strategy, schema)
    assert lower == pytest.approx(upper, rel=1e-12)  # C^T C >= 0 for sqrt: attained
    frob = float(np.sum(fact.decoder**2))
    r = runner.invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.stderr
    part = json.loads(r.stdout)["participation"]
    assert part["kind"] == "fixed-epoch" and part["epochs"] == 2 and part["declared"] is True
    assert part["description"] == "fixed-epoch: 2 epochs of 4 steps"
    nums = part["under_schema"]
    assert nums["exact"] is True
    assert nums["sensitivity"] ** 2 == pytest.approx(upper, rel=1e-12)
    assert nums["loss_total"] == pytest.approx(upper * frob, rel=1e-12)
    assert nums["loss_mean"] == pytest.approx(upper * frob / 8, rel=1e-12)
    assert nums["loss_max"] == pytest.approx(upper * float(np.max(np.sum(fact.decoder**2, axis=1))), rel=1e-12)
    r = runner.invoke(app, ["inspect", str(path)], env={"COLUMNS": "400"})
    assert r.exit_code == 0
    assert "fixed-epoch: 2 epochs of 4 steps (attribute participation)" in r.stdout
    assert "sensitivity (exact)" in r.stdout and "total sq. error sens^2 ||B||_F^2 (exact)" in r.stdout
    assert "upper bound" not in r.stdout


def test_inspect_labels_an_upper_bound_and_rounds_it_up(tmp_path: Path, no_certificates: None) -> None:
    fact = upper_bound_factorization()
    schema = FixedEpoch(epochs=3)
    path = tmp_path / "a.h5"
    save_artifact(path, fact, workload_name="custom", strategy_name="custom", participation=schema)
    lower, a_bound = brute_bounds_squared(fact.strategy, schema)
    assert a_bound == pytest.approx(5.4) and lower == pytest.approx(3.8)
    upper = 3 * float(np.linalg.eigvalsh(fact.strategy.T @ fact.strategy)[-1])  # 4.2, y = lambda_max 1
    r = runner.invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.stderr
    nums = json.loads(r.stdout)["participation"]["under_schema"]
    assert nums["exact"] is False
    # The value is an upper bound, the witness a lower bound, bracketing the brute-force bracket.
    assert nums["sensitivity"] ** 2 == pytest.approx(upper, rel=1e-12)
    assert nums["lower"] ** 2 == pytest.approx(lower, rel=1e-12)
    assert nums["loss_total"] == pytest.approx(upper * 3, rel=1e-12)  # ||I||_F^2 = 3
    r = runner.invoke(app, ["inspect", str(path)], env={"COLUMNS": "400"})
    assert r.exit_code == 0
    assert "sensitivity (upper bound)" in r.stdout and "(upper bound)" in r.stdout
    row = next(line for line in r.stdout.splitlines() if "sensitivity (upper bound)" in line)
    shown = float(row.split("│")[2].strip())
    assert shown >= math.sqrt(upper) and shown - math.sqrt(upper) < 1e-5  # rounded up, 6 digits


def test_inspect_single_participation_shows_the_default(tmp_path: Path) -> None:
    r = runner.invoke(app, ["inspect", "prefix-n256", "--json", "--no-certificate"])
    assert r.exit_code == 0
    part = json.loads(r.stdout)["participation"]
    assert part == {"kind": "single", "version": 1, "declared": False, "description": "single participation"}


# ---------------------------------------------------------------------------------------------
# compare

COMPARE_SCHEMAS: list[tuple[list[str], Participation]] = [
    (["--epochs", "2"], FixedEpoch(epochs=2)),
    (["--epochs", "4"], FixedEpoch(epochs=4)),
    (["--min-sep", "3"], MinSeparation(separation=3)),
    (["--min-sep", "3", "--max-participations", "2"], MinSeparation(separation=3, max_participations=2)),
]
NAMES = ("identity", "tree", "honaker-online", "honaker-full", "sqrt", "optimal")


@pytest.mark.parametrize("workload", ["prefix", "momentum"])
@pytest.mark.parametrize("args, schema", COMPARE_SCHEMAS, ids=[" ".join(a) for a, _ in COMPARE_SCHEMAS])
def test_compare_under_a_schema(args: list[str], schema: Participation, workload: str) -> None:
    n = 8
    r = runner.invoke(app, ["compare", "-w", workload, "-n", str(n), "-q", "--json", "-s", ",".join(NAMES), *args])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["participation"]["kind"] == schema.kind
    assert out["participation"]["description"] == schema.describe(n)
    assert out["units"].startswith(schema.describe(n))
    w = prefix_workload(n) if workload == "prefix" else momentum_workload(n)
    rows = {row["name"]: row for row in out["strategies"]}
    for name in NAMES:
        f = build_strategy(name, w).factorization
        c, b = np.asarray(f.strategy), np.asarray(f.decoder)
        row = rows["optimal-single" if name == "optimal" else name]  # more than one participation in all schemas here
        lower, upper = brute_bounds_squared(c, schema)
        sens2 = row["sensitivity"] ** 2
        assert lower * (1 - 1e-9) <= sens2 <= upper * (1 + 1e-9), (name, lower, sens2, upper)
        assert row["sensitivity"] == pytest.approx(sensitivity(c, schema).value, rel=1e-12)
        if row["sensitivity_exact"]:
            assert sens2 == pytest.approx(lower, rel=1e-9), name
        assert row["loss_total"] == pytest.approx(sens2 * float(np.sum(b**2)), rel=1e-9)
        assert row["loss_mean"] == pytest.approx(sens2 * float(np.sum(b**2)) / n, rel=1e-9)
        assert row["loss_max"] == pytest.approx(sens2 * float(np.max(np.sum(b**2, axis=1))), rel=1e-9)
    best = min(row["loss_total"] for row in out["strategies"] if row["causal"])
    for row in out["strategies"]:
        assert row["ratio_to_best_causal"] == pytest.approx(row["loss_total"] / best, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_compare_identity_fixed_epoch_closed_form(k: int) -> None:
    # C = I: every pattern's block is the k x k identity, so sens = sqrt(k), exactly, and the loss
    # is k ||A||_F^2 = k n (n + 1) / 2 for the prefix sum.
    n = 8
    r = runner.invoke(app, ["compare", "-n", str(n), "-q", "--json", "-s", "identity", "--epochs", str(k)])
    assert r.exit_code == 0, r.stderr
    row = json.loads(r.stdout)["strategies"][0]
    assert row["sensitivity"] == pytest.approx(math.sqrt(k), rel=1e-14)
    assert row["sensitivity_exact"] is True
    assert row["loss_total"] == pytest.approx(k * n * (n + 1) / 2, rel=1e-14)


def test_compare_renderings_name_the_schema_and_exactness() -> None:
    base = ["compare", "-w", "momentum", "-n", "64", "-q", "-s", "identity,tree", "--min-sep", "8",
            "--max-participations", "4"]
    described = "min-separation: at most 4 participations, at least 8 steps apart"
    md = runner.invoke(app, [*base, "-f", "markdown"])
    assert md.exit_code == 0, md.stderr
    assert described in md.stdout.splitlines()[0]
    assert "| sensitivity | sensitivity is |" in md.stdout
    csv_out = runner.invoke(app, [*base, "-f", "csv"])
    header = csv_out.stdout.splitlines()[0]
    assert header.startswith("name,causal,sensitivity,sensitivity_exact,loss_total")
    table = runner.invoke(app, base, env={"COLUMNS": "400"})
    assert table.exit_code == 0
    assert "sens is" in table.stdout and described in " ".join(table.stdout.split())


def test_compare_marks_upper_bounds(tmp_path: Path, no_certificates: None) -> None:
    # The unbalanced C as the optimal row (--artifact) of its own workload, not certified: its row
    # must say "upper bound", with the bound 3 lambda_max as value (rounded up in the Markdown).
    path = tmp_path / "u.h5"
    fact = upper_bound_factorization()
    save_artifact(path, fact, workload_name="custom", strategy_name="custom")
    lower, a_bound = brute_bounds_squared(fact.strategy, FixedEpoch(epochs=3))
    assert a_bound == pytest.approx(5.4) and lower == pytest.approx(3.8)
    upper = 3 * float(np.linalg.eigvalsh(fact.strategy.T @ fact.strategy)[-1])
    base = ["compare", "-w", "custom", "--matrix", str(path), "-q", "-s", "identity", "--artifact", str(path),
            "--epochs", "3"]
    r = runner.invoke(app, [*base, "--json"])
    assert r.exit_code == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)["strategies"]}
    row = rows["custom (u.h5)"]
    assert row["sensitivity_exact"] is False
    assert row["sensitivity"] ** 2 == pytest.approx(upper, rel=1e-12)
    assert row["loss_total"] == pytest.approx(upper * 3, rel=1e-12)
    assert rows["identity"]["sensitivity_exact"] is True
    assert rows["identity"]["sensitivity"] == pytest.approx(math.sqrt(3), rel=1e-14)
    md = runner.invoke(app, [*base, "-f", "markdown"]).stdout
    cells = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in md.splitlines()[4:])}
    assert cells["custom (u.h5)"][3] == "upper bound" and cells["identity"][3] == "exact"
    assert float(cells["custom (u.h5)"][2]) >= math.sqrt(upper)
    assert float(cells["custom (u.h5)"][4]) >= upper * 3


def test_compare_default_is_single_participation_as_before() -> None:
    # Without a schema option: no new keys or columns, and the single-participation numbers
    # (max column norm) as in tests/test_compare.py.
    r = runner.invoke(app, ["compare", "-n", "8", "-q", "--json", "-s", "identity,sqrt"])
    out = json.loads(r.stdout)
    assert "participation" not in out
    assert out["units"] == "single participation, noise multiplier 1, clip norm 1"
    assert list(out) == ["schema_version", "command", "mfcli_version", "workload", "workload_params", "n", "units", "best_causal",
                         "strategies"]
    for row in out["strategies"]:
        assert "sensitivity_exact" not in row
    assert out["strategies"][0]["sensitivity"] == 1.0 and out["strategies"][0]["loss_total"] == 36.0
    md = runner.invoke(app, ["compare", "-n", "8", "-q", "-s", "identity", "-f", "markdown"]).stdout
    assert md.splitlines()[0] == "**prefix workload, n = 8 (lr=constant)**; single participation, noise multiplier 1, clip norm 1"
    assert md.splitlines()[2] == ("| strategy | causal | sensitivity | total sq. error | mean sq. error | RMSE | "
                                  "worst step sq. error | ratio to best causal |")
    csv_out = runner.invoke(app, ["compare", "-n", "8", "-q", "-s", "identity", "-f", "csv"]).stdout
    assert csv_out.splitlines()[0] == "name,causal,sensitivity,loss_total,loss_mean,rmse,loss_max,ratio,m,description"
    table = runner.invoke(app, ["compare", "-n", "8", "-q", "-s", "identity"], env={"COLUMNS": "400"}).stdout
    assert "sens is" not in table and "upper bound" not in table
    # The library: None and an explicit single schema give the same table.
    w = prefix_workload(8)
    assert (run_comparison(w, ["identity", "sqrt"]).as_dict()
            == run_comparison(w, ["identity", "sqrt"], participation=SingleParticipation()).as_dict())


@pytest.mark.parametrize("args, message, code", [
    # ranges that depend on n: the library refuses them (exit 1)
    (["--epochs", "3"], "the number of steps n = 8 is not divisible by epochs = 3", 1),
    (["--min-sep", "9"], "separation = 9 exceeds the number of steps n = 8", 1),
    # ranges of the option alone: usage errors while parsing (exit 2)
    (["--epochs", "0"], "epochs must be at least 1, got 0", 2),
    (["--min-sep", "2", "--max-participations", "0"], "max_participations must be at least 1, got 0", 2),
])
def test_compare_schema_that_does_not_fit(args: list[str], message: str, code: int, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["compare", "-n", "8", "-q", "-s", "identity", "--out", "t.md", *args])
    assert r.exit_code == code
    one_error_line(r.stderr, message)
    assert list(tmp_path.iterdir()) == []


def test_compare_save_strategy_stores_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    r = runner.invoke(app, ["compare", "-n", "8", "-q", "-s", "sqrt", "--epochs", "2", "--save-strategy", "sqrt",
                            "--out", str(path)])
    assert r.exit_code == 0, r.stderr
    assert load_artifact(path).participation == FixedEpoch(epochs=2)
    r = runner.invoke(app, ["compare", "-n", "8", "-q", "-s", "sqrt", "--save-strategy", "sqrt",
                            "--out", str(tmp_path / "t.h5")])
    with h5py.File(tmp_path / "t.h5") as f:
        assert "participation" not in f.attrs


# ---------------------------------------------------------------------------------------------
# account and compress


@pytest.mark.parametrize("schema", [FixedEpoch(epochs=2), MinSeparation(separation=3, max_participations=2)],
                         ids=lambda s: s.kind)
def test_account_uses_the_declared_schema_and_refuses_another(schema: Participation, tmp_path: Path) -> None:
    """An artifact that declares a schema is accounted under it by default (its epsilon comes from
    the schema's sensitivity, checked by brute force), and under no other: a contradicting
    option is one error line and the file is untouched."""
    path = tmp_path / "a.h5"
    save_artifact(path, factorization("sqrt"), workload_name="prefix", strategy_name="sqrt", participation=schema)
    before = path.read_bytes()
    r = runner.invoke(app, ["account", str(path), "--sigma", "4", "--json"])
    assert r.exit_code == 0, r.stderr
    row = json.loads(r.stdout)["settings"]["deterministic"]
    assert set(json.loads(r.stdout)["settings"]) == {"deterministic"}
    _, brute = brute_bounds_squared(factorization("sqrt").strategy, schema)
    assert row["sensitivity"] == pytest.approx(math.sqrt(brute), rel=1e-9)
    assert row["participation"]["kind"] == schema.kind
    other = ["--min-sep", "2"] if isinstance(schema, FixedEpoch) else ["--epochs", "4"]
    for extra in (["--sigma", "4", *other], ["--epsilon", "2", *other], ["--sigma", "4", "--write", *other]):
        r = runner.invoke(app, ["account", str(path), *extra])
        assert r.exit_code == 1, (extra, r.stdout)
        one_error_line(r.stderr, "declares", schema.describe(8), "refused")
        assert "epsilon" not in r.stdout.lower()
    assert path.read_bytes() == before


def test_account_accepts_an_explicit_single_schema(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    save_artifact(path, factorization("sqrt"), workload_name="prefix", strategy_name="sqrt",
                  participation=SingleParticipation())
    r = runner.invoke(app, ["account", str(path), "--sigma", "4", "--json"])
    assert r.exit_code == 0, r.stderr


def test_compress_keeps_the_schema(tmp_path: Path) -> None:
    src = tmp_path / "a.h5"
    w = momentum_workload(16)
    fact = build_strategy("optimal", w).factorization
    save_artifact(src, fact, workload_name="momentum", strategy_name="optimal", participation=FixedEpoch(epochs=4))
    out = compress_artifact(src, band=2, rank=1, out=tmp_path / "c.h5")
    assert load_artifact(out.path).participation == FixedEpoch(epochs=4)
    plain = tmp_path / "p.h5"
    save_artifact(plain, fact, workload_name="momentum", strategy_name="optimal")
    out = compress_artifact(plain, band=2, rank=1, out=tmp_path / "pc.h5")
    with h5py.File(out.path) as f:
        assert "participation" not in f.attrs
