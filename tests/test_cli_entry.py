"""The console entry point's BLAS thread rule (mfcli.cli.entry): ``mfcli account`` starts with one
BLAS thread when the user set no thread variable, a user's setting wins, and every other command
starts as the environment says.

The rule acts on the environment before numpy loads, so it is checked in fresh interpreters: a
probe runs the real entry point with the command framework replaced by a function that loads numpy
and scipy.special (as ``account`` does; scipy's OpenBLAS is a second library) and reports the
environment and every BLAS pool's thread count (threadpoolctl). The reference is the same probe
without mfcli: a plain interpreter with the same environment, so a test does not depend on the
machine's CPU count. (tests/conftest.py sets the thread variables to 1 for the test session; the
children here get an environment without them, or with exactly the ones a case names.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mfcli.cli.entry import THREAD_VARIABLES, account_blas_environment, set_account_blas_threads

ONE = dict.fromkeys(THREAD_VARIABLES, "1")


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    pytest.param(["account", "--sigma", "4", "--sampling", "0.01"], {}, ONE, id="account-nothing-set"),
    pytest.param(["account"], {"PATH": "/bin", "OMP_PROC_BIND": "true"}, ONE, id="unrelated-variables"),
    pytest.param(["account"], {"OPENBLAS_NUM_THREADS": ""}, ONE, id="empty-is-unset"),
    pytest.param(["account"], {"OPENBLAS_NUM_THREADS": " "}, ONE, id="blank-is-unset"),
    pytest.param(["account"], {"OPENBLAS_NUM_THREADS": "2"}, {}, id="user-openblas"),
    pytest.param(["account"], {"OMP_NUM_THREADS": "4"}, {}, id="user-omp"),
    pytest.param(["account"], {"MKL_NUM_THREADS": "3"}, {}, id="user-mkl"),
    pytest.param(["account"], {"GOTO_NUM_THREADS": "2"}, {}, id="user-goto"),
    pytest.param(["account"], {"BLIS_NUM_THREADS": "2"}, {}, id="user-blis"),
    pytest.param(["account"], {"VECLIB_MAXIMUM_THREADS": "2"}, {}, id="user-veclib"),
    pytest.param(["account"], {"OPENBLAS_NUM_THREADS": "1"}, {}, id="user-one"),
    pytest.param(["inspect"], {}, {}, id="inspect"),
    pytest.param(["optimize", "--n", "64"], {}, {}, id="optimize"),
    pytest.param(["compare"], {}, {}, id="compare"),
    pytest.param(["plan"], {}, {}, id="plan"),
    pytest.param(["compress"], {}, {}, id="compress"),
    pytest.param(["--help"], {}, {}, id="group-help"),
    pytest.param(["--version", "account"], {}, {}, id="option-first"),
    pytest.param(["inspect", "account"], {}, {}, id="account-as-an-argument"),
    pytest.param([], {}, {}, id="no-arguments"),
])
def test_the_rule(argv: list[str], environ: dict[str, str], expected: dict[str, str]) -> None:
    assert account_blas_environment(argv, environ) == expected
    env = dict(environ)
    set_account_blas_threads(argv, env)
    assert env == {**environ, **expected}


#: Runs the entry point with ``mfcli.cli.app`` replaced by a module whose ``main`` reports the BLAS
#: pools, the thread variables and whether numpy was loaded before the command began (the rule acts
#: only if not); with ``--plain``, the same report without mfcli (the reference).
_PROBE = """
import json, os, sys, types
from mfcli.cli.entry import THREAD_VARIABLES
def report():
    before = "numpy" in sys.modules
    import numpy, scipy.special  # noqa: F401  (as mfcli account loads them)
    from threadpoolctl import threadpool_info
    pools = sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
    env = {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ}
    print(json.dumps({"pools": pools, "env": env, "numpy_before": before}))
if sys.argv[1] == "--plain":
    report()
else:
    sys.modules["mfcli.cli.app"] = types.SimpleNamespace(main=report)
    sys.argv = ["mfcli", *sys.argv[1:]]
    from mfcli.cli.entry import main
    main()
"""


def _probe(args: list[str], env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], env={**clean, **env}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["pools"], "no BLAS library found: the probe cannot see the threads"
    assert not out["numpy_before"]  # the rule can act only before numpy loads
    return out


def test_account_starts_with_one_blas_thread() -> None:
    out = _probe(["account", "--sigma", "4", "--sampling", "0.01"], {})
    assert out["env"] == ONE
    assert out["pools"] == [1] * len(out["pools"])


@pytest.mark.parametrize("user", [
    pytest.param({"OPENBLAS_NUM_THREADS": "2"}, id="openblas-2"),
    pytest.param({"OMP_NUM_THREADS": "2"}, id="omp-2"),
])
def test_the_users_setting_wins(user: dict[str, str]) -> None:
    out = _probe(["account", "--sigma", "4", "--sampling", "0.01"], user)
    assert out["env"] == user  # nothing added
    assert out["pools"] == _probe(["--plain"], user)["pools"]


@pytest.mark.parametrize("args", [
    pytest.param(["inspect"], id="inspect"),
    pytest.param(["optimize", "--n", "64"], id="optimize"),
    pytest.param(["plan", "--help"], id="plan"),
])
def test_other_commands_start_as_the_environment_says(args: list[str]) -> None:
    out = _probe(args, {})
    assert out["env"] == {}
    assert out["pools"] == _probe(["--plain"], {})["pools"]


def test_the_probe_can_see_more_than_one_thread() -> None:
    """The control: with two threads asked for, a pool has two where the machine has two CPUs, so
    the one-thread check above can fail (on a one-CPU machine every pool has one thread anyway)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus < 2:
        pytest.skip("one CPU: OpenBLAS starts one thread whatever is asked")
    assert max(_probe(["--plain"], {"OPENBLAS_NUM_THREADS": "2"})["pools"]) == 2


_BLOCK_PROBE = """
import json, sys
from mfcli.cli.entry import set_account_blas_threads
set_account_blas_threads(sys.argv[1:])
import numpy, scipy.special  # noqa: F401
from threadpoolctl import threadpool_info
from mfcli.util.blas import blas_threads
def pools():
    return sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
out = {"start": pools()}
with blas_threads(None, scipy_blas=False):
    out["none"] = pools()
with blas_threads(1, scipy_blas=False):
    out["one"] = pools()
out["after"] = pools()
print(json.dumps(out))
"""


def test_blocks_written_for_the_machines_threads_still_get_them() -> None:
    """Under the rule, ``blas_threads(None)`` (the solver, the reduction's certificate above
    n = 1024) gets the count the BLAS starts with when nothing is set (the plain reference), for
    the block only; with the user's setting, None leaves the pools as the user set them."""
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}

    def run(args: list[str], env: dict[str, str]) -> dict:
        proc = subprocess.run([sys.executable, "-c", _BLOCK_PROBE, *args], env={**clean, **env}, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    default = _probe(["--plain"], {})["pools"]
    out = run(["account"], {})
    assert out["start"] == out["one"] == out["after"] == [1] * len(default)
    assert out["none"] == default
    out = run(["account"], {"OPENBLAS_NUM_THREADS": "1"})
    assert out["start"] == out["none"] == out["after"] == [1] * len(default)
    out = run(["inspect"], {})
    assert out["start"] == out["none"] == default


_DEFER_PROBE = """
import json, sys, types
def report():
    import numpy, scipy.special  # noqa: F401  (scipy.special reads every name of numpy)
    out = {"at_start": ["numpy.f2py.crackfortran" in sys.modules, "numpy.testing._private.utils" in sys.modules]}
    from numpy.testing import assert_allclose  # used: loads then
    assert_allclose(1.0, 1.0)
    out["used"] = [hasattr(numpy.f2py, "crackfortran"), "numpy.testing._private.utils" in sys.modules]
    print(json.dumps(out))
sys.modules["mfcli.cli.app"] = types.SimpleNamespace(main=report)
sys.argv = ["mfcli", *sys.argv[1:]]
from mfcli.cli.entry import main
main()
"""


@pytest.mark.parametrize(("args", "deferred"), [
    pytest.param(["account", "--sigma", "4"], True, id="account"),
    pytest.param(["inspect"], False, id="inspect-control"),
])
def test_numpy_tooling_is_loaded_only_when_used(args: list[str], deferred: bool) -> None:
    """``account`` does not execute numpy.f2py and numpy.testing when scipy.special reads numpy's
    names; they still work when used. The control (another command) shows the probe sees them."""
    proc = subprocess.run([sys.executable, "-c", _DEFER_PROBE, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["at_start"] == [not deferred, not deferred]
    assert out["used"] == [True, True]
