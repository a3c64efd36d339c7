"""``mfcli compress`` on a multi-participation artifact stores the schema and the compressed
operator's sensitivity under it, recomputed from C^ = B^-1 A; inspect checks the stored value and
account accounts the compressed operator at it. Oracle: brute force over every participation
pattern and sign vector at n = 8 (a lower bound on the sensitivity that equals it when the
library says exact)."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from sensitivity_oracle import brute_sensitivity
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.io.artifact import load_artifact
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation
from mfcli.services.inspect import inspect_artifact
from mfcli.strategies.operators import GROUP, read_compressed

runner = CliRunner()
N = 8


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("compress-schema")
    out = {"single": d / "single.h5", "epochs2": d / "epochs2.h5"}
    for args, path in ((["--n", str(N)], out["single"]), (["--n", str(N), "--epochs", "2"], out["epochs2"])):
        r = runner.invoke(app, ["optimize", *args, "--out", str(path), "--quiet"])
        assert r.exit_code == 0, r.stderr
    return out


CASES = [
    # (source, CLI schema options, the schema the output must declare)
    ("epochs2", [], FixedEpoch(epochs=2)),
    ("single", ["--epochs", "2"], FixedEpoch(epochs=2)),
    ("single", ["--min-sep", "3"], MinSeparation(separation=3, max_participations=None)),
    ("single", ["--min-sep", "2", "--max-participations", "2"], MinSeparation(separation=2, max_participations=2)),
]


@pytest.mark.parametrize("source, options, schema", CASES, ids=[f"{c[0]}{''.join(c[1])}" for c in CASES])
def test_compressed_artifact_stores_its_schema_sensitivity(
    sources: dict[str, Path], tmp_path: Path, source: str, options: list[str], schema: Participation
) -> None:
    out = tmp_path / "c.h5"
    r = runner.invoke(app, ["compress", str(sources[source]), "--band", "2", "--rank", "1", *options,
                            "--out", str(out), "--json", "--quiet"])
    assert r.exit_code == 0, r.stderr
    art = load_artifact(out)
    assert art.participation == schema
    op = read_compressed(art)
    # C^ from the decoder that streams the noise, solved here independently of the operator's C^
    c_hat = np.linalg.solve(op.factorization.decoder, art.factorization.workload)
    with h5py.File(out, "r") as f:
        attrs = dict(f[GROUP].attrs)
    stored, exact = float(attrs["schema_sensitivity"]), bool(attrs["schema_sensitivity_exact"])
    witness = brute_sensitivity(c_hat, schema)
    assert stored >= witness * (1 - 1e-9)  # an upper bound on the sensitivity
    assert float(attrs["schema_sensitivity_lower"]) <= witness * (1 + 1e-9)
    if exact:
        assert stored == pytest.approx(witness, rel=1e-9)
    # the dense root's sensitivity under the schema is a different number: the stored one is C^'s
    assert stored == pytest.approx(json.loads(r.stdout)["under_schema"]["compressed"]["sensitivity"], rel=1e-12)
    # inspect recomputes and checks it; account accounts the compressed operator at it
    report = inspect_artifact(out, certificate=False)
    assert report.ok, report.problems
    checks = {c.name: c for c in report.compression_numbers}
    assert checks["schema_sensitivity"].ok and checks["schema_sensitivity_exact"].ok
    a = runner.invoke(app, ["account", str(out), "--sigma", "2", "--json", "--quiet"])
    assert a.exit_code == 0, a.stderr
    obj = json.loads(a.stdout)
    assert obj["operator"].startswith("compressed") and obj["schema_sensitivity"] == pytest.approx(stored, rel=1e-12)


def test_inspect_reports_a_tampered_schema_sensitivity(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "c.h5"
    r = runner.invoke(app, ["compress", str(sources["epochs2"]), "--band", "2", "--rank", "1", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    with h5py.File(out, "r+") as f:
        true_value = float(f[GROUP].attrs["schema_sensitivity"])
        f[GROUP].attrs["schema_sensitivity"] = true_value / 2  # claims more privacy than C^ gives
    report = inspect_artifact(out, certificate=False)
    assert any(p.startswith(f"{GROUP}/schema_sensitivity is") for p in report.problems), report.problems
    r = runner.invoke(app, ["inspect", str(out)])
    assert r.exit_code != 0


def test_a_schema_contradicting_the_source_is_refused_and_nothing_written(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "c.h5"
    r = runner.invoke(app, ["compress", str(sources["epochs2"]), "--band", "2", "--rank", "1", "--min-sep", "3",
                            "--out", str(out)])
    assert r.exit_code != 0 and not out.exists()
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] and "Traceback" not in r.stderr


@pytest.mark.parametrize("source, options, schema", CASES[:3], ids=[f"{c[0]}{''.join(c[1])}" for c in CASES[:3]])
def test_loss_budget_holds_under_the_schema(
    sources: dict[str, Path], tmp_path: Path, source: str, options: list[str], schema: Participation
) -> None:
    # The budget is on the mechanism a multi-epoch trainer runs: sens_schema(C^)^2 ||B^||_F^2
    # against sens_schema(C)^2 ||B||_F^2. Recomputed here from the written artifact, with C^
    # solved independently and the sensitivity by brute force (exact at n = 8 for these C: the
    # library says exact, checked by the test above), at each end of the search.
    out = tmp_path / "c.h5"
    budget = 0.02
    r = runner.invoke(app, ["compress", str(sources[source]), "--max-loss-increase", str(budget), *options,
                            "--out", str(out), "--json", "--quiet"])
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    art = load_artifact(out)
    op = read_compressed(art)
    a, b, c = art.factorization.workload, art.factorization.decoder, art.factorization.strategy
    b_hat = op.factorization.decoder
    c_hat = np.linalg.solve(b_hat, a)
    dense = brute_sensitivity(c, schema) ** 2 * float(np.sum(b * b))
    compressed = brute_sensitivity(c_hat, schema) ** 2 * float(np.sum(b_hat * b_hat))
    assert compressed / dense - 1 <= budget + 1e-9
    assert obj["under_schema"]["loss_increase"] == pytest.approx(compressed / dense - 1, abs=1e-9)
    chosen = [e for e in obj["evaluations"] if (e["band"], e["rank"]) == (obj["band"], obj["rank"])]
    assert chosen and chosen[0]["loss_increase"] == pytest.approx(compressed / dense - 1, abs=1e-9)
    # every setting the search rejected really exceeds the budget under the schema
    for e in obj["evaluations"]:
        if e["loss_increase"] > budget:
            alt = runner.invoke(app, ["compress", str(sources[source]), "--band", str(e["band"]), "--rank",
                                      str(e["rank"]), *options, "--out", str(tmp_path / "alt.h5"), "--force",
                                      "--json", "--quiet"])
            assert alt.exit_code == 0, alt.stderr
            alt_art = load_artifact(tmp_path / "alt.h5")
            bh = read_compressed(alt_art).factorization.decoder
            ch = np.linalg.solve(bh, a)
            inc = brute_sensitivity(ch, schema) ** 2 * float(np.sum(bh * bh)) / dense - 1
            assert inc > budget - 1e-9
            break
