"""The wheel works like the checkout, and start-up imports only what a command needs.

The wheel test builds a wheel from a copy of the source, installs it with ``pip install --target``
(no dependencies: those come from the running environment) and runs the shipped-artifact defaults
from a directory outside the checkout. ``.ci/wheel-check`` does the same into a fresh venv with
its dependencies from the index.

The start-up tests check, without timing anything, which heavy modules each command imports.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from mfcli.io.artifact import SHIPPED, is_shipped_artifact, shipped_artifact

ROOT = Path(__file__).resolve().parent.parent


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _env_without_checkout(extra_path: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the source and installed with --target; returns the target."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "mfcli", src / "mfcli", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        capture_output=True, text=True,
    )
    # setuptools comes with the test extra, so a failure here is a real packaging failure.
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("mfcli-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for file_name in SHIPPED.values():
        assert f"mfcli/data/{file_name}" in names
    from mfcli.cli.app import COMMANDS

    for command in COMMANDS:  # the JSON Schema of each command's --json output
        assert f"mfcli/schemas/{command}.json" in names
    target = tmp / "site"
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        capture_output=True, text=True,
    )
    assert inst.returncode == 0, inst.stderr
    return target


def test_wheel_installs_the_shipped_artifacts_byte_identical(installed: Path, tmp_path: Path) -> None:
    code = (
        "import json, mfcli; from mfcli.io.artifact import SHIPPED, is_shipped_artifact; "
        "print(json.dumps({'file': mfcli.__file__, 'paths': {k: str(mfcli.shipped_artifact(k)) for k in SHIPPED}, "
        "'shipped': [is_shipped_artifact(mfcli.shipped_artifact(k)) for k in SHIPPED]}))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env_without_checkout(installed),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert Path(got["file"]).is_relative_to(installed)
    assert all(got["shipped"])
    for name, path in got["paths"].items():
        p = Path(path)
        assert p.is_relative_to(installed / "mfcli" / "data")
        # The installed copy is the one in the checkout, byte for byte.
        assert _sha256(p) == _sha256(shipped_artifact(name))


def test_wheel_runs_the_documented_default_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "mfcli", "account", "--sigma", "4", "--sampling", "0.01", "--json", "-q"],
        cwd=tmp_path, env=_env_without_checkout(installed), capture_output=True, text=True,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert str(installed / "mfcli" / "data" / "momentum-n256.h5") in out["source"]
    assert out["n"] == 256
    res = subprocess.run(
        [sys.executable, "-m", "mfcli", "inspect", "prefix-n256", "--no-certificate", "--json"],
        cwd=tmp_path, env=_env_without_checkout(installed), capture_output=True, text=True,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["path"] == str(installed / "mfcli" / "data" / "prefix-n256.h5")
    # The installed package's schema of the command validates its output.
    code = ("import json, sys; from mfcli.schemas import load_schema, validate; "
            "print(json.dumps(validate(json.loads(sys.stdin.read()), load_schema('inspect'))))")
    check = subprocess.run([sys.executable, "-c", code], input=res.stdout, cwd=tmp_path,
                           env=_env_without_checkout(installed), capture_output=True, text=True)
    assert check.returncode == 0 and json.loads(check.stdout) == [], check.stderr + check.stdout


_OPACUS_FROM_WHEEL = """
import mfcli, torch
from torch.utils.data import DataLoader, TensorDataset
from mfcli.adapters.opacus import make_private
from mfcli.adapters.torch import CorrelatedNoiseOptimizer
torch.manual_seed(0)
net = torch.nn.Linear(4, 2)
data = TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))
model, opt, dl = make_private(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), DataLoader(data, batch_size=8),
                              artifact=mfcli.shipped_artifact("momentum-n256"), seed=1, noise_std=2.0,
                              clip_norm=1.0, variant="dense")
x, y = next(iter(dl))
opt.zero_grad()
torch.nn.functional.cross_entropy(model(x), y).backward()
opt.step()
other = CorrelatedNoiseOptimizer(torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1, momentum=0.9),
                                 artifact=mfcli.shipped_artifact("momentum-n256"), seed=1, noise_std=1.0, clip_norm=1.0)
sched = torch.optim.lr_scheduler.StepLR(other, step_size=1, gamma=0.5)
other.step()
sched.step()
print(mfcli.__file__, opt.steps_taken, opt.sample_rate, other.param_groups[0]["lr"])
"""


def test_wheel_runs_the_opacus_bridge_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    """mfcli.adapters.opacus and the torch conventions work from the installed (non-editable) wheel."""
    pytest.importorskip("torch")
    pytest.importorskip("opacus")
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", _OPACUS_FROM_WHEEL], cwd=tmp_path,
                         env=_env_without_checkout(installed), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    where, steps, rate, lr = res.stdout.split()
    assert where == str(installed / "mfcli" / "__init__.py")
    assert (int(steps), float(rate), float(lr)) == (1, 1 / 5, 0.05)


def test_shipped_artifacts_are_package_data_in_the_checkout() -> None:
    for name, file_name in SHIPPED.items():
        p = shipped_artifact(name)
        assert p == ROOT / "mfcli" / "data" / file_name
        assert is_shipped_artifact(p)
    assert not (ROOT / "artifacts" / "momentum-n256.h5").exists()


def test_is_shipped_artifact_sees_links_but_not_copies(tmp_path: Path) -> None:
    src = shipped_artifact("prefix-n256")
    link = tmp_path / "link.h5"
    link.symlink_to(src)
    hard = tmp_path / "hard.h5"
    try:
        os.link(src, hard)
    except OSError:
        hard = link  # no hard links across file systems here; the symlink case still runs
    copy = tmp_path / "copy.h5"
    shutil.copyfile(src, copy)
    assert is_shipped_artifact(link)
    assert is_shipped_artifact(hard)
    assert not is_shipped_artifact(copy)
    assert not is_shipped_artifact(tmp_path / "missing.h5")


# ---------------------------------------------------------------------------------------------
# Start-up: which heavy modules each command imports (no timing).

HEAVY = ("numpy", "scipy", "h5py", "dp_accounting", "matplotlib", "torch", "jax", "pydantic")

_PROBE = """
import json, os, sys
sys.argv = ["mfcli", *json.loads(sys.argv[1])]
def _exit(code):  # the CLI ends the process with os._exit; report the modules first
    raise SystemExit(code)
os._exit = _exit
from mfcli.cli.entry import main  # the console script's entry point (pyproject [project.scripts])
try:
    main()
except SystemExit:
    pass
sys.stderr.write("\\nMODULES=" + json.dumps(sorted(m for m in sys.modules if "." not in m)) + "\\n")
"""


def _imported(args: list[str], cwd: Path) -> set[str]:
    res = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("MODULES=")]
    assert line, res.stderr
    return set(json.loads(line[-1][len("MODULES="):])) & set(HEAVY)


@pytest.mark.parametrize(
    "args, allowed",
    [
        (["--help"], set()),
        (["--version"], set()),
        ([], set()),
        (["inspect", "--help"], {"numpy", "pydantic", "h5py"}),
        (["inspect", "SMALL", "--no-certificate"], {"numpy", "pydantic", "h5py"}),
        # The certificate is one eigendecomposition (scipy.linalg); no accounting, no plotting.
        (["inspect", "SMALL"], {"numpy", "pydantic", "h5py", "scipy"}),
        (["compress", "--help"], {"numpy", "pydantic"}),
        # The accounting stack (scipy.stats, dp-accounting) and even numpy load only when account runs.
        (["account", "--help"], {"pydantic"}),
        # scipy.linalg and scipy.sparse load only when the solver runs or a strategy is built.
        (["optimize", "--help"], {"numpy", "pydantic"}),
        (["compare", "--help"], {"numpy", "pydantic"}),
    ],
    ids=["help", "version", "no-args", "inspect-help", "inspect-no-cert", "inspect", "compress-help",
         "account-help", "optimize-help", "compare-help"],
)
def test_commands_import_only_what_they_need(args: list[str], allowed: set[str], tmp_path: Path) -> None:
    if "SMALL" in args:
        from mfcli.io.artifact import save_artifact
        from mfcli.model.workloads import build_workload
        from mfcli.strategies.baselines import build_strategy

        w = build_workload("prefix", 8)
        st = build_strategy("tree", w)
        save_artifact(tmp_path / "small.h5", st.factorization, workload_name=w.name, workload_params=w.params,
                      strategy_name="tree")
        args = [str(tmp_path / "small.h5") if a == "SMALL" else a for a in args]
    assert _imported(args, tmp_path) <= allowed


def test_version_is_answered_before_the_command_framework_loads(tmp_path: Path) -> None:
    """``mfcli --version`` (the entry point's shortcut) loads no Typer, Click or rich, and prints what
    the Typer option prints; any other argument list still reaches Typer."""
    from typer.testing import CliRunner

    from mfcli.cli.app import app

    def probe(args: list[str]) -> tuple[str, set[str]]:
        res = subprocess.run([sys.executable, "-c", _PROBE.replace('"." not in m', "True"), json.dumps(args)],
                             cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = [ln for ln in res.stderr.splitlines() if ln.startswith("MODULES=")]
        assert line, res.stderr
        return res.stdout, {m.split(".")[0] for m in json.loads(line[-1][len("MODULES="):])}

    out, mods = probe(["--version"])
    assert not mods & {"typer", "click", "rich"}
    assert out == CliRunner().invoke(app, ["--version"]).stdout == f"mfcli {__import__('mfcli').__version__}\n"
    _, mods = probe(["--version", "--help"])
    assert "typer" in mods
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mfcli"] == "mfcli.cli.entry:main"


def test_inspect_with_certificate_imports_no_accounting(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(["inspect", str(shipped_artifact("prefix-n256"))])],
        cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    mods = set(json.loads(res.stderr.splitlines()[-1][len("MODULES="):]))
    assert "dp_accounting" not in mods and "matplotlib" not in mods


def test_import_mfcli_is_light_and_the_api_resolves() -> None:
    code = ("import sys, mfcli, mfcli.accounting; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{set(HEAVY)!r}); print(heavy); print(mfcli.load_artifact.__module__, mfcli.accounting.calibrate_sigma.__module__)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    heavy, modules = res.stdout.splitlines()
    assert heavy == "[]"
    assert modules == "mfcli.io.artifact mfcli.accounting.calibrate"


def test_lazy_public_api_is_complete() -> None:
    import mfcli
    import mfcli.accounting

    for pkg in (mfcli, mfcli.accounting):
        assert set(pkg.__all__) == set(pkg._EXPORTS)
        for name in pkg.__all__:
            assert getattr(pkg, name) is not None
        with pytest.raises(AttributeError):
            getattr(pkg, "no_such_name")  # noqa: B009 (the failing attribute access is what is tested)
