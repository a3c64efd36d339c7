"""``mfcli account`` runs without importing dp-accounting (which loads scipy.signal and scipy.stats,
about 1 s of CPU, most of the headline command's import time): the PLDs, their compositions and
the event JSON are mfcli's own (mfcli.accounting.pld_ops, single_pass, mog_pld, events), held equal
to dp-accounting's by tests/test_accounting_pld_ops.py and tests/test_accounting_single_pass.py.

Each command runs in a fresh interpreter (the CLI ends the process with ``os._exit``, patched here
to report ``sys.modules`` first); a control run that does import dp-accounting shows the probe
can fail. And the plain event JSON equals ``event_to_json`` of dp-accounting's own events."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

_PROBE = """
import os, sys
_exit = os._exit
def _report(code):
    sys.stdout.flush()
    sys.stderr.write("\\nDP_ACCOUNTING_IMPORTED=%s\\n" % ("dp_accounting" in sys.modules))
    sys.stderr.flush()
    _exit(code)
os._exit = _report
if sys.argv[1] == "--control":
    import dp_accounting  # noqa: F401
    os._exit(0)
sys.argv = ["mfcli", *sys.argv[1:]]
from mfcli.cli.entry import main
main()
"""


def _imports_dp_accounting(args: list[str]) -> tuple[bool, subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("DP_ACCOUNTING_IMPORTED=")]
    assert lines, proc.stderr
    return lines[-1].endswith("True"), proc


def test_the_probe_sees_an_import() -> None:
    imported, _ = _imports_dp_accounting(["--control"])
    assert imported


@pytest.mark.parametrize("args", [
    pytest.param(["account", "--sigma", "4", "--sampling", "0.01", "-q"], id="headline"),
    pytest.param(["account", "--sigma", "4", "--sampling", "0.01", "--json", "-q"], id="headline-json"),
    pytest.param(["account", "--strategy", "tree", "--n", "16", "--sigma", "4", "--sampling", "0.001", "--json",
                  "-q"], id="tree-sparse-pld"),  # DP-SGD's PLD at sigma 4, p 0.001: 119 points, sparse
])
def test_account_does_not_import_dp_accounting(args: list[str]) -> None:
    imported, proc = _imports_dp_accounting(args)
    assert proc.returncode == 0, proc.stderr
    assert not imported
    if "--json" in args:
        out = json.loads(proc.stdout)
        assert out["settings"]["dp-sgd"]["epsilon"] > 0


def _real_events():
    from dp_accounting import dp_event

    return dp_event


@pytest.mark.parametrize("nm", [4.0, 4, 0.4269453212393082])
def test_plain_gaussian_events_are_event_to_json(nm: float) -> None:
    from mfcli.accounting import events

    e = _real_events()
    assert events.plain_json(events.plain_gaussian(nm)) == events.event_to_json(e.GaussianDpEvent(nm))
    assert events.plain_json(events.plain_poisson_gaussian(0.01, nm, 256)) == \
        events.event_to_json(events.poisson_gaussian_event(0.01, nm, 256))
    groups = [(nm, 3), (2 * nm, 5)]
    assert events.plain_json(events.plain_composed([events.plain_poisson_gaussian(0.1, m, k) for m, k in groups])) \
        == events.event_to_json(e.ComposedDpEvent([events.poisson_gaussian_event(0.1, m, k) for m, k in groups]))


def test_plain_mixture_rows_are_event_to_json() -> None:
    from mfcli.accounting import events

    e = _real_events()
    rows = [([0.0, 0.5, 1.0], [0.25, 0.25, 0.5], 3), ([0.02, 1.0], [0.99, 0.01], 1)]
    real = e.ComposedDpEvent([e.SelfComposedDpEvent(e.MixtureOfGaussiansDpEvent(1.5, s, q), k) for s, q, k in rows])
    assert events.plain_json(events.plain_mixture_rows(1.5, rows)) == events.event_to_json(real)


def test_result_rows_carry_their_events_json() -> None:
    """The rows' JSON (built without dp-accounting) is ``event_to_json`` of their ``dp_event()``."""
    from mfcli.accounting import events
    from mfcli.accounting.single_pass import dpsgd, single_pass

    for res in (dpsgd(sigma=2.0, sampling=0.05, steps=7, value_discretization=1e-3),
                single_pass(sigma=3.0, sensitivity=1.5)):
        assert res.as_dict()["dp_event"] == events.event_to_json(res.dp_event())


def test_multi_participation_rows_carry_their_events_json() -> None:
    """The deterministic and cyclic-Poisson rows (``--epochs``, ``--min-sep``, ``--batching
    cyclic``) write the same event JSON as ``event_to_json`` of their ``dp_event()``."""
    import numpy as np

    from mfcli.accounting import events
    from mfcli.accounting.multi import cyclic_poisson, deterministic
    from mfcli.model.participation import MinSeparation, sensitivity

    c = np.eye(6) + 0.5 * np.eye(6, k=-1)
    schema = MinSeparation(separation=2)
    for res in (deterministic(sigma=2.0, sensitivity=sensitivity(c, schema), n=6),
                cyclic_poisson(c, schema=schema, sigma=2.0, sampling=0.1, value_discretization=1e-3)):
        assert res.as_dict()["dp_event"] == events.event_to_json(res.dp_event())
