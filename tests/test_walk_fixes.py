"""Fixes from a fresh user's walkthrough of the CLI (options that were silently ignored,
labels that said the wrong thing, exit codes, loaders, JSON shapes). Each case failed before its
fix; all run at small n through the real CLI (CliRunner)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mfcli.cli.app import app

runner = CliRunner()


def _run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


# --- finding 2: optimize --strategy banded-toeplitz|blt honours or refuses --tol/--max-iter/--method --------

@pytest.mark.parametrize("strategy", [["--strategy", "blt", "--buffers", "2"],
                                      ["--strategy", "banded-toeplitz", "--bands", "4"]])
@pytest.mark.parametrize("extra,needle", [
    (["--method", "anderson"], "--method applies to the dense optimal strategy only"),
    (["--tol", "1e-3"], "--tol is a duality-gap target"),
    (["--max-iter", "0"], "--max-iter must be at least 1"),
])
def test_structured_refuses_options_it_cannot_honour(tmp_path: Path, strategy: list[str], extra: list[str],
                                                     needle: str) -> None:
    out = tmp_path / "x.h5"
    code, stdout, stderr = _run("optimize", "--n", "32", *strategy, *extra, "-o", str(out), "-q")
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert not out.exists() and stdout == ""


def _structured_json(tmp_path: Path, *args: str) -> dict:
    code, stdout, stderr = _run("optimize", "--n", "64", *args, "-o", str(tmp_path / "x.h5"), "--force", "--json")
    assert code == 0, stderr
    return json.loads(stdout)


def test_banded_toeplitz_max_iter_bounds_lbfgs_iterations(tmp_path: Path) -> None:
    free = _structured_json(tmp_path, "--strategy", "banded-toeplitz", "--bands", "4")
    capped = _structured_json(tmp_path, "--strategy", "banded-toeplitz", "--bands", "4", "--max-iter", "2")
    assert free["iterations"] > 2  # so the cap below is what stopped it
    assert capped["iterations"] == 2 and capped["converged"] is False
    assert capped["loss"]["mean"] > free["loss"]["mean"]


def test_blt_max_iter_reaches_the_optimiser(tmp_path: Path) -> None:
    free = _structured_json(tmp_path, "--strategy", "blt", "--buffers", "2")
    capped = _structured_json(tmp_path, "--strategy", "blt", "--buffers", "2", "--max-iter", "1")
    # one L-BFGS-B step per start cannot reach the optimum the default budget finds
    assert capped["loss"]["mean"] > free["loss"]["mean"] * (1 + 1e-6)


# --- finding 1: --sampling under cyclic batching is the per-group rate, and the output says so ------------

def _wide(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env={"COLUMNS": "1000"})
    return res.exit_code, " ".join(res.stdout.split()), res.stderr


def test_account_cyclic_row_names_the_per_group_rate_and_the_batch_fraction() -> None:
    # b = 16 groups (--min-sep 16) at per-group rate 0.2: each step samples one group (1/16 of the
    # examples) with probability 0.2 per example, so the expected batch is 0.2 / 16 = 0.0125
    code, out, err = _wide("account", "--strategy", "identity", "--n", "64", "--min-sep", "16", "--sigma", "2",
                           "--sampling", "0.2", "--batching", "cyclic")
    assert code == 0, err
    assert "per group: each example's group is sampled with probability p at its group's steps" in out
    assert "expected batch p / b = 0.0125 of the examples" in out


def test_compare_caption_names_the_per_group_rate_and_the_batch_fraction() -> None:
    code, out, err = _wide("compare", "--n", "64", "--min-sep", "16", "-s", "identity", "--epsilon", "8",
                           "--sampling", "0.2", "-q")
    assert code == 0, err
    assert ("cyclic Poisson sampling at per-group rate 0.2 (each example's group is sampled with probability 0.2 "
            "at its group's steps; 16 groups, expected batch 0.0125 of the examples)") in out


@pytest.mark.parametrize("command", ["account", "compare"])
def test_sampling_help_says_which_rate(command: str) -> None:
    code, out, _ = _wide(command, "--help")
    assert code == 0
    assert "group is sampled with probability" in out and "b x batch / examples" in out


# --- finding 3: under a multi-participation schema, compare's solved optimum is the single-participation one -

def _compare_json(*args: str) -> tuple[dict, str]:
    res = runner.invoke(app, ["compare", "-w", "prefix", "--n", "16", "-q", "--json", *args])
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout), res.stderr


@pytest.mark.parametrize("schema,options", [
    (["--epochs", "4"], "--epochs 4"),
    (["--min-sep", "4", "--max-participations", "2"], "--min-sep 4 --max-participations 2"),
])
def test_compare_names_the_single_participation_optimum_and_does_not_call_it_best(schema: list[str],
                                                                                   options: str) -> None:
    out, err = _compare_json("-s", "identity,sqrt,optimal", *schema)
    rows = {r["name"]: r for r in out["strategies"]}
    assert set(rows) == {"identity", "sqrt", "optimal-single"}
    assert rows["optimal-single"]["description"].startswith("optimal for single participation, not for ")
    # at n = 16 it has the lowest total of these rows, yet it is not this schema's optimum: not "best"
    assert min(rows.values(), key=lambda r: r["loss_total"])["name"] == "optimal-single"
    assert out["best_causal"] is None
    assert rows["optimal-single"]["ratio_to_best_causal"] == 1.0
    assert "optimal-single is the optimum for single participation" in err
    assert f"{options}, and add its artifact with -a FILE" in err


def test_compare_schema_optimum_from_an_artifact_is_best(tmp_path: Path) -> None:
    art = tmp_path / "ep4.h5"
    code, _, err = _run("optimize", "-w", "prefix", "--n", "16", "--epochs", "4", "-o", str(art), "-q")
    assert code == 0, err
    out, err = _compare_json("-s", "identity,sqrt,optimal", "--epochs", "4", "-a", str(art))
    assert out["best_causal"] == "optimal-fixed-epoch (ep4.h5)" and "optimal-single" not in err


@pytest.mark.parametrize("schema", [[], ["--epochs", "1"]])
def test_compare_optimal_keeps_its_name_with_one_participation(schema: list[str]) -> None:
    out, err = _compare_json("-s", "identity,optimal", *schema)
    assert [r["name"] for r in out["strategies"]] == ["identity", "optimal"]
    assert out["best_causal"] == "optimal" and "optimal-single" not in err


# --- finding 7: the public loader reads every artifact kind; the CLI gives no Python-API advice -----------

@pytest.fixture(scope="module")
def structured_h5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("structured") / "s.h5"
    code, _, err = _run("optimize", "--n", "64", "--strategy", "banded-toeplitz", "--bands", "4", "-o", str(out), "-q")
    assert code == 0, err
    return out


def test_top_level_loader_reads_a_structured_artifact(structured_h5: Path) -> None:
    import mfcli
    from mfcli.errors import ArtifactError

    art = mfcli.load_any_artifact(structured_h5)
    assert isinstance(art, mfcli.StructuredArtifact) and art.n == 64
    assert art.strategy.coefs.size == 4
    dense = mfcli.load_any_artifact(mfcli.shipped_artifact("prefix-n256"))
    assert isinstance(dense, mfcli.Artifact) and dense.n == 256
    with pytest.raises(ArtifactError, match=r"read it with mfcli\.load_any_artifact\)"):
        mfcli.load_artifact(structured_h5)


@pytest.mark.parametrize("args,use", [
    (["compress", "{art}", "-k", "4", "-r", "2", "-o", "{tmp}/c.h5"], "compress needs a dense artifact"),
    (["compare", "-w", "prefix", "--n", "64", "-a", "{art}", "-q"], "--artifact needs a dense artifact"),
    (["optimize", "--n", "64", "--warm-start", "{art}", "-o", "{tmp}/w.h5", "-q"], "--warm-start needs a dense artifact"),
])
def test_cli_refuses_a_structured_artifact_in_cli_terms(structured_h5: Path, tmp_path: Path, args: list[str],
                                                        use: str) -> None:
    code, stdout, err = _run(*(a.format(art=structured_h5, tmp=tmp_path) for a in args))
    assert code == 1 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and use in lines[0]
    assert "holds a structured strategy" in lines[0] and "load_any_artifact" not in lines[0]
    assert "mfcli.strategies.structured" not in lines[0] and list(tmp_path.iterdir()) == []


# --- finding 11: an unwritable --out is reported against the user's path, never a temporary file --------

@pytest.mark.parametrize("args", [
    ["optimize", "--n", "4", "-q", "--out"],
    ["compare", "--n", "4", "-s", "identity", "-q", "--out"],
    ["compress", "prefix-n256", "-k", "2", "-r", "1", "-q", "--out"],
    ["optimize", "--n", "64", "--strategy", "blt", "--buffers", "1", "-q", "--out"],
])
@pytest.mark.parametrize("rel", ["afile/x.h5", "afile/sub/x.h5"])
def test_out_under_a_regular_file_names_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                                   rel: str) -> None:
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("not a folder")
    code, stdout, err = _run(*args, rel)
    assert code == 1 and stdout == ""
    assert err.strip() == f"error: cannot write {rel}: afile is not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_out_whose_temporary_file_cannot_be_made_names_the_target(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    def refuse(*_a: object, **_k: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / ".x.h5.abc.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)  # what /proc does to a new file, without needing /proc
    out = tmp_path / "x.h5"
    code, _, err = _run("optimize", "--n", "4", "-q", "--out", str(out))
    assert code == 1
    assert err.strip() == f"error: cannot write {out}: No such file or directory"


# --- finding 10: a value outside an option's choices or range is a usage error, exit 2 (README's table) ---

@pytest.mark.parametrize("args,needle", [
    (["optimize", "--workload", "foo", "--n", "4"], "--workload must be one of prefix, momentum, custom, not 'foo'"),
    (["optimize", "--n", "0"], "--n must be at least 1, got 0"),
    (["optimize", "--n", "abc"], "'--n'"),
    (["optimize", "--n", "4", "--tol", "-1"], "--tol must be in (0, 1), got -1"),
    (["optimize", "--n", "4", "--max-iter", "0"], "--max-iter must be at least 1, got 0"),
    (["optimize", "--n", "4", "--method", "magic"], "unknown method 'magic'"),
    (["optimize", "--workload", "custom", "--n", "4"], "--workload custom needs --matrix FILE"),
    (["compare", "--n", "4", "-s", "foo"], "unknown strategy 'foo'"),
    (["compare", "--n", "4", "-s", "optimal", "--tol", "2"], "--tol must be in (0, 1), got 2"),
    (["account", "--sigma", "1", "--sampling", "0.1", "--batching", "foo"], "--batching must be one of"),
])
def test_bad_option_value_exits_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "x.h5"
    code, stdout, err = _run(*args, *(["-o", str(out)] if args[0] == "optimize" else []))
    assert code == 2 and stdout == ""
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("try ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert "matrix_file" not in err and not out.exists()


# --- finding 12: option naming and labels ---------------------------------------------------------------

def test_single_participation_optimize_table_names_its_schema(tmp_path: Path) -> None:
    code, out, err = _wide("optimize", "--n", "8", "-o", str(tmp_path / "o.h5"), "-q")
    assert code == 0, err
    assert "optimal factorization: prefix, n = 8, single participation" in out
    # a unit-norm column: sensitivity exactly 1 (the table may draw a cell border between label and value)
    assert re.search(r"sensitivity \(exact, this schema\) (\u2502 )?1 ", out), out


def test_optimize_max_iter_help_says_what_each_solver_counts() -> None:
    _, out, _ = _wide("optimize", "--help")
    assert "with --epochs, Newton steps of the dual solver" in out and "L-BFGS-B iterations" in out


def test_inspect_quiet_silences_the_plot_line(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    loud = runner.invoke(app, ["inspect", "prefix-n256", "--no-certificate", "--plot", str(tmp_path / "a.png")])
    quiet = runner.invoke(app, ["inspect", "prefix-n256", "--no-certificate", "--plot", str(tmp_path / "b.png"), "-q"])
    assert loud.exit_code == 0 and quiet.exit_code == 0
    assert "wrote" in loud.stderr and quiet.stderr == ""
    assert quiet.stdout == loud.stdout.replace("a.png", "b.png")


@pytest.mark.parametrize("command,long", [("account", "--strategy"), ("compare", "--strategies")])
def test_dash_s_is_documented_in_both_commands(command: str, long: str) -> None:
    _, out, _ = _wide(command, "--help")
    assert f"{long} -s" in out or f"-s, {long}" in out or f"{long}, -s" in out or f"-s {long}" in out
    assert ("In mfcli compare, -s is --strategies" if command == "account" else "In mfcli account, -s is --strategy") in out


# --- finding 8: account --json stays small; the full dp-accounting events are opt-in ----------------------

def _account_json(*extra: str) -> tuple[str, dict]:
    code, out, err = _run("account", "--strategy", "sqrt", "--n", "32", "--sigma", "4", "--sampling", "0.05", "--json",
                          "-q", *extra)
    assert code == 0, err
    return out, json.loads(out)


def test_account_json_summarises_events_unless_asked() -> None:
    from mfcli.accounting.events import event_from_json
    from mfcli.schemas import load_schema, validate

    small_text, small = _account_json()
    full_text, full = _account_json("--events")
    for obj in (small, full):
        validate(obj, load_schema("account"))
    assert set(small["settings"]) == set(full["settings"]) >= {"single-pass", "dp-sgd", "mmcc"}
    for name, row in full["settings"].items():
        event = row["dp_event"]
        assert event_from_json(event) is not None  # the opt-in form is the replayable event
        assert "dp_event" not in small["settings"][name]
        assert small["settings"][name]["dp_event_summary"] == {"class_name": json.loads(event)["class_name"],
                                                               "json_chars": len(event)}
        assert small["settings"][name]["epsilon"] == row["epsilon"]
    mmcc_chars = small["settings"]["mmcc"]["dp_event_summary"]["json_chars"]
    assert len(small_text) < len(full_text) - mmcc_chars + 1000


def test_account_events_needs_json() -> None:
    code, _, err = _run("account", "--sigma", "4", "--events", "-q")
    assert code == 2 and err.strip() == "error: --events adds the full events to --json output; give --json"
