"""Second round of fixes from a fresh user's walkthrough of the CLI: one JSON representation of a
participation schema (layout version 2), exit codes of option ranges, plan's error line for an
unwritable target, compare's time estimate, progress of the fixed-epoch solver's coarse stages.
Each case failed before its fix; all run at small n through the real CLI (CliRunner) or the
library."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.cli.common import JSON_SCHEMA_VERSION
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, SingleParticipation
from mfcli.schemas import load_schema, validate

runner = CliRunner()


def _run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def _json(*args: str) -> dict:
    code, stdout, stderr = _run(*args, "--json")
    assert code == 0, stderr
    return json.loads(stdout)


def _expected(schema: Participation, n: int) -> dict:
    """The one representation, spelled out here rather than by the helper that builds it: the
    schema's stored JSON (what the artifact attribute holds) plus its line in words."""
    return {**json.loads(schema.to_json()), "description": schema.describe(n)}


# --- 1: participation is one object in every --json (schema_version 2) ------------------------------------

def test_layout_version_is_2() -> None:
    assert JSON_SCHEMA_VERSION == 2


@pytest.mark.parametrize("strategy", [["--strategy", "banded-toeplitz", "--bands", "3"],
                                      ["--strategy", "blt", "--buffers", "2"]])
def test_structured_optimize_and_inspect_print_the_participation_object(tmp_path: Path, strategy: list[str]) -> None:
    out = tmp_path / "s.h5"
    opt = _json("optimize", "-w", "momentum", "--n", "32", *strategy, "-o", str(out), "-q")
    ins = _json("inspect", str(out))
    want = _expected(SingleParticipation(), 32)
    # inspect adds whether the artifact declares its schema (an artifact written without a schema
    # option declares none: single participation is the default it is read under), as for dense files
    assert opt["participation"] == want and ins["participation"] == {**want, "declared": False}
    for command, obj in (("optimize", opt), ("inspect", ins)):
        assert validate(obj, load_schema(command)) == []


@pytest.mark.parametrize(("opts", "schema"), [([], SingleParticipation()), (["--epochs", "2"], FixedEpoch(epochs=2)),
                                              (["--min-sep", "4"], MinSeparation(separation=4))])
def test_dense_optimize_compare_account_print_the_same_object(tmp_path: Path, opts: list[str],
                                                              schema: Participation) -> None:
    out = tmp_path / "d.h5"
    opt = _json("optimize", "-w", "prefix", "--n", "8", *opts, "-o", str(out), "-q")
    acc = _json("account", str(out), "--sigma", "3", "-q")
    want = _expected(schema, 8)
    assert opt["participation"] == want and acc["participation"] == want
    ins = _json("inspect", str(out), "--no-certificate")["participation"]
    assert {k: ins[k] for k in want} == want  # inspect adds declared (and under_schema) to the same object
    if opts:
        cmp = _json("compare", "-n", "8", "-s", "identity", *opts, "-q")
        assert cmp["participation"] == want


@pytest.mark.parametrize("command", ["optimize", "inspect", "account", "compare", "plan"])
def test_shipped_schemas_refuse_the_version_1_string(command: str) -> None:
    schema = load_schema(command)
    part = schema["$defs"]["participation"]
    assert validate(_expected(FixedEpoch(epochs=2), 8), part) == []
    assert validate("fixed-epoch: 2 epochs of 4 steps", part)
    assert validate({"kind": "single", "version": 1}, part)  # no description: the dense version-1 object


# --- 2: a value outside the range its option allows on its own is a usage error (exit 2) ------------------

PARSE_TIME_RANGES: list[tuple[list[str], str]] = [
    (["optimize", "-w", "momentum", "--n", "8", "--beta", "2"], "--beta"),
    (["optimize", "-w", "momentum", "--n", "8", "--beta", "nan"], "--beta"),
    (["compare", "-w", "momentum", "-n", "8", "--beta", "1"], "--beta"),
    (["account", "-s", "tree", "-n", "8", "--sigma", "1", "-w", "momentum", "--beta", "-0.5"], "--beta"),
    (["optimize", "--strategy", "banded-toeplitz", "--n", "8", "--bands", "0"], "--bands"),
    (["optimize", "--strategy", "blt", "--n", "64", "--buffers", "40"], "--buffers"),
    (["optimize", "--strategy", "blt", "--n", "64", "--buffers", "0"], "--buffers"),
    (["compare", "-n", "64", "--bands", "0"], "--bands"),
    (["compare", "-n", "64", "--buffers", "4", "--buffers", "40"], "--buffers"),
    (["optimize", "--n", "8", "--epochs", "0"], "--epochs"),
    (["compare", "-n", "8", "--min-sep", "0"], "--min-sep"),
    (["inspect", "prefix-n256", "--min-sep", "2", "--max-participations", "0"], "--max-participations"),
    (["account", "-s", "tree", "-n", "8", "--sigma", "-1"], "--sigma"),
    (["account", "-s", "tree", "-n", "8", "--sigma", "1", "--sampling", "2"], "--sampling"),
    (["account", "-s", "tree", "-n", "8", "--sigma", "1", "--delta", "1"], "--delta"),
    (["account", "-s", "tree", "-n", "0", "--sigma", "1"], "--n"),
    (["compare", "-n", "8", "-s", "tree", "--epsilon", "0"], "--epsilon"),
    (["compress", "prefix-n256", "--band", "0", "--rank", "1"], "--band"),
    (["compress", "prefix-n256", "--band", "2", "--rank", "-1"], "--rank"),
    (["plan", "--examples", "100", "--batch", "10", "--epsilon", "1", "--epochs", "0"], "--epochs"),
    (["plan", "--examples", "100", "--batch", "10", "--epsilon", "1", "--epochs", "1", "--buffers", "40"], "--buffers"),
    (["plan", "--examples", "100", "--batch", "10", "--epsilon", "1", "--epochs", "1", "--bands", "0"], "--bands"),
    (["plan", "--examples", "100", "--batch", "10", "--epsilon", "1", "--epochs", "1", "--delta", "2"], "--delta"),
    (["plan", "--examples", "100", "--batch", "10", "--epsilon", "-1", "--epochs", "1"], "--epsilon"),
]


@pytest.mark.parametrize(("args", "flag"), PARSE_TIME_RANGES, ids=[" ".join(a) for a, _ in PARSE_TIME_RANGES])
def test_option_range_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], flag: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = _run(*args, "-q")
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}"), lines
    assert stdout == "" and list(tmp_path.iterdir()) == []


DEPENDENT_RANGES: list[list[str]] = [
    ["optimize", "--n", "8", "--epochs", "3"],                                  # K must divide n
    ["optimize", "--strategy", "banded-toeplitz", "--n", "8", "--bands", "9"],  # bands <= n
    ["optimize", "--strategy", "blt", "--n", "8", "--buffers", "8"],            # buffers < n
    ["compress", "prefix-n256", "--band", "300", "--rank", "1"],                # K <= the artifact's n
]


@pytest.mark.parametrize("args", DEPENDENT_RANGES, ids=[" ".join(a) for a in DEPENDENT_RANGES])
def test_range_that_depends_on_n_stays_with_the_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         args: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, stderr = _run(*args, "-q")
    lines = stderr.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), stderr


def test_library_keeps_its_own_range_checks() -> None:
    """The CLI reuses the library's validators; library callers are still refused (MfcliError)."""
    from mfcli.errors import MfcliError
    from mfcli.model.workloads import momentum_workload

    for beta in (1.0, -0.1, float("nan")):
        with pytest.raises(MfcliError, match="beta must be in"):
            momentum_workload(4, beta=beta)


# --- 3: plan --out names the user's target when its temporary file cannot be written ---------------------

PLAN = ["plan", "--examples", "64", "--batch", "16", "--epsilon", "2", "--epochs", "1", "--batching", "fixed-order",
        "--bands", "2", "--buffers", "2", "--workers", "0", "-q"]


def test_plan_out_failure_names_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    real = tempfile.mkstemp

    def no_temp_file_beside_the_target(*args: object, **kwargs: object) -> tuple[int, str]:
        if ".plan-" in str(kwargs.get("prefix", "")):  # plan's own temporary artifact
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tempfile, "mkstemp", no_temp_file_beside_the_target)
    target = tmp_path / "plan.h5"
    code, stdout, stderr = _run(*PLAN, "--out", str(target))
    lines = stderr.strip().splitlines()
    assert code == 1 and len(lines) == 1, stderr
    assert lines[0] == f"error: cannot write {target}: Read-only file system"
    assert list(tmp_path.iterdir()) == [] and stdout == ""


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_plan_out_under_proc_names_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, stderr = _run(*PLAN, "--out", "/proc/mfcli-x.h5")
    lines = stderr.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: cannot write /proc/mfcli-x.h5"), stderr
    assert ".plan-" not in stderr and ".tmp" not in stderr


# --- 4: compare's time estimate at equal privacy: which rows calibrate what, at which cost ----------------

@pytest.mark.parametrize(("s", "a", "c", "target"), [(1.0, 1.5, 2.0, 1.0), (2.0, 2.0, 0.5, 0.2), (1.3, 0.7, 10.0, 4.0),
                                                     (3.0, 1.0, 1.0, 8.0)])
@pytest.mark.parametrize(("z1", "z2"), [(2.0, 1.0), (2.0, 4.0), (0.5, 0.25)])
def test_run_cost_ratio_follows_power_laws(s: float, a: float, c: float, target: float, z1: float, z2: float) -> None:
    """epsilon = c z^-s and seconds = z^-a through the two runs: the target's z is (c / target)^(1/s)
    and the ratio of costs there and at z1 is (z1 / z)^a, here derived by hand."""
    from mfcli.services.compare import run_cost_ratio

    eps, secs = (lambda z: c * z ** -s), (lambda z: z ** -a)
    z_target = (c / target) ** (1 / s)
    got = run_cost_ratio(z1, eps(z1), secs(z1), z2, eps(z2), secs(z2), target)
    assert got == pytest.approx((z1 / z_target) ** a, rel=1e-9)


def test_run_cost_ratio_falls_back_to_the_first_run() -> None:
    from mfcli.services.compare import run_cost_ratio

    assert run_cost_ratio(1.0, 2.0, 1.0, 2.0, 2.0, 0.5, 1.0) == 1.0   # epsilon does not fall: no law
    assert run_cost_ratio(1.0, 2.0, 1.0, 2.0, 1.0, 0.0, 1.0) == 1.0   # a zero time
    # epsilon = 2 / z (s = 1): the target 1 is met at z = 2, the target 4 at z = 1/2; the cost
    # exponent log2(1e6) ~ 20 (timing noise) is clamped to 3
    assert run_cost_ratio(1.0, 2.0, 1.0, 2.0, 1.0, 1e-6, 1.0) == pytest.approx(2.0 ** -3)
    assert run_cost_ratio(1.0, 2.0, 1.0, 2.0, 1.0, 1e-6, 4.0) == pytest.approx(2.0 ** 3)
    assert run_cost_ratio(1.0, 2.0, 1.0, 2.0, 1.0, 1.0, 2.0) == pytest.approx(1.0)  # target met at z1 itself


@pytest.mark.parametrize("schema", [SingleParticipation(), MinSeparation(separation=4), FixedEpoch(epochs=2)],
                         ids=["single", "min-sep 4", "epochs 2"])
def test_row_band_counts_predict_which_rows_run_cyclic_poisson(schema: Participation) -> None:
    """The estimate's count of cyclic Poisson calibrations agrees with the rows the comparison
    actually calibrates that way (each row checks its own C)."""
    from mfcli.accounting.multi import cycle_length
    from mfcli.model.workloads import prefix_workload
    from mfcli.services.compare import PrivacyTarget, row_band_counts, run_comparison, structured_rows
    from mfcli.strategies.toeplitz import toeplitz_workload

    n = 16
    names = ["identity", "tree", "honaker-online", "sqrt", "optimal"]
    target = PrivacyTarget(epsilon=2.0, delta=1e-6, sampling=0.05)
    table = run_comparison(prefix_workload(n), names, participation=schema, privacy=target)
    extra = structured_rows(toeplitz_workload("prefix"), n, bands=(2, 8), buffers=(2,), participation=schema,
                            privacy=target)
    rows = [*table.rows, *extra]
    ran = [r.privacy is not None and "cyclic-poisson" in r.privacy.candidates for r in rows]
    b = cycle_length(schema, n)
    predicted = [k is not None and k <= b for k in row_band_counts(names, n, bands=(2, 8), buffers=(2,))]
    banded = [r.name.startswith("banded-toeplitz") for r in rows]
    # exact for rows whose C is fixed by their kind; a banded row is counted (errs high, never low)
    assert len(predicted) == len(ran) == len(banded)
    assert [predicted[i] for i, x in enumerate(banded) if not x] == [ran[i] for i, x in enumerate(banded) if not x]
    assert all(predicted[i] for i, x in enumerate(banded) if x) and all(p or not r for p, r in zip(predicted, ran, strict=True))


def test_estimate_counts_calibrations_per_accounting() -> None:
    import math

    from mfcli.accounting.calibrate import calibrate_sigma
    from mfcli.accounting.single_pass import gaussian_epsilon
    from mfcli.services.compare import PrivacyTarget, cyclic_start, estimate_equal_privacy

    n, schema = 64, MinSeparation(separation=16)
    target = PrivacyTarget(epsilon=2.0, delta=1e-6, sampling=0.05)
    none = estimate_equal_privacy(n, schema, target, row_bands=[None, 64, 64])  # no row has <= 16 bands
    assert [e.setting for e in none.estimates] == ["deterministic"] and none.calibrations == (3,)
    est = estimate_equal_privacy(n, schema, target, row_bands=[1, None, 64, 8])
    assert [e.setting for e in est.estimates] == ["deterministic", "cyclic-poisson"] and est.calibrations == (4, 2)
    # the cyclic probe runs where the identity row's calibration starts: C = I has sensitivity
    # sqrt(participations) = sqrt(4) under min-sep 16 at n = 64, and column norm 1
    unit = calibrate_sigma(lambda s: gaussian_epsilon(1e-6, 1.0 / s), target_epsilon=2.0, rel_tol=1e-4)
    assert est.estimates[1].sigma == pytest.approx(cyclic_start(unit.sigma * math.sqrt(4)), rel=1e-12)
    expected, most = est.seconds()
    g, c = est.estimates
    assert expected == pytest.approx(4 * g.runs_expected * g.seconds_per_run + 2 * c.runs_expected * c.seconds_per_run)
    assert most >= expected > 0


def test_the_applicability_check_of_cyclic_poisson_is_a_cheap_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """equal_privacy_from checks that cyclic Poisson applies before calibrating; that check's run
    is at a large noise multiplier (a run's cost grows fast as it falls), not at sigma 1."""
    import mfcli.accounting.multi as multi
    from mfcli.services.compare import PrivacyTarget, equal_privacy_from

    seen: list[float] = []
    real = multi.reduced_dpsgd

    def spy(**kw: float) -> object:
        seen.append(kw["sigma"] / kw["column_norm"])
        return real(**kw)  # type: ignore[arg-type]

    monkeypatch.setattr(multi, "reduced_dpsgd", spy)
    equal_privacy_from(2.0, 5.0, 64, MinSeparation(separation=16), PrivacyTarget(2.0, 1e-6, 0.05), cyclic=(1, 0.5))
    assert seen[0] >= 100 and len(seen) > 1


# --- 5: the fixed-epoch dual solver reports its coarse stages, labelled, without a gap --------------------

def test_fixed_epoch_coarse_levels_report_progress_without_a_gap() -> None:
    import math

    from mfcli.model.workloads import prefix_workload
    from mfcli.optimize.dense import Progress
    from mfcli.optimize.multi_fixed_epoch import solve_dual

    events: list[Progress] = []
    sol = solve_dual(prefix_workload(512).matrix, 2, tol=1e-3, max_iter=50, callback=events.append)
    assert sol is not None and sol.coarse  # n = 512 uses the coarse-to-fine start
    coarse = [p for p in events if p.stage]
    full = [p for p in events if not p.stage]
    assert coarse and full and events[:len(coarse)] == coarse  # every coarse event before the first full one
    for level, (m, evals) in enumerate(sol.coarse, start=1):
        mine = [p for p in coarse if p.stage.startswith(f"coarse level {level} of {len(sol.coarse)} ({m} of 512 steps)")]
        assert [p.iteration for p in mine] == list(range(1, evals + 1))
    assert all(math.isnan(p.primal) and math.isnan(p.dual) and math.isnan(p.gap) for p in coarse)
    assert all("no bound on n = 512" in p.stage for p in coarse)
    assert all(not math.isnan(p.gap) for p in full) and sol.history == full  # coarse events stay out of history
    assert [p.seconds for p in events] == sorted(p.seconds for p in events)


def test_cli_prints_coarse_stages_before_the_first_iteration(tmp_path: Path) -> None:
    code, _, stderr = _run("optimize", "--n", "512", "--epochs", "2", "-o", str(tmp_path / "fe.h5"))
    assert code == 0, stderr
    lines = stderr.splitlines()
    coarse = [i for i, line in enumerate(lines) if line.startswith("coarse level ")]
    first = next(i for i, line in enumerate(lines) if line.startswith("iter "))
    assert coarse and max(coarse) < first
    assert {lines[i].split(":")[0] for i in coarse} == {"coarse level 1 of 2 (128 of 512 steps)",
                                                        "coarse level 2 of 2 (256 of 512 steps)"}
    assert not any("gap" in lines[i] or "dual" in lines[i] or "primal" in lines[i] for i in coarse)


def test_terminal_panel_shows_a_coarse_stage_as_its_line_without_numbers() -> None:
    import math

    from rich.console import Console

    from mfcli.cli.display import SolverDisplay
    from mfcli.optimize.dense import Progress

    console = Console(width=200, record=True)
    panel = SolverDisplay(quiet=True, title="t")._panel
    console.print(panel(Progress(3, math.nan, math.nan, math.nan, 1.5, "m", stage="coarse level 1 of 2 (8 of 16 steps): x")))
    text = console.export_text()
    assert "coarse level 1 of 2 (8 of 16 steps): x; step 3, 1.5s" in text and "nan" not in text
