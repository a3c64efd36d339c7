"""Which accounting settings run without a dense C is each mechanism's to say
(``Mechanism.matrix_free_settings``), and ``services.account`` asks it instead of branching on
names. The tree's own bounds (shuffled tree, balls-in-bins tree) take only n and sigma of the 0/1
encoder, so the tree mechanism of any n runs them without its matrix: checked here against the
matrix path (the dense tree encoder, C at hand) at small n, where both must give the same numbers,
and every setting that needs C is still refused or left out with a note."""
from __future__ import annotations

import numpy as np
import pytest

from mfcli.accounting.defaults import SETTINGS
from mfcli.errors import MfcliError
from mfcli.services.account import _any_n_baseline, account, epsilon_function, resolve_strategy
from mfcli.strategies.baseline_mechanisms import baseline_mechanism
from mfcli.strategies.operators import MATRIX_FREE_SETTINGS, MatrixStrategy
from mfcli.strategies.structured import StructuredOperator
from mfcli.strategies.toeplitz import BandedToeplitz, toeplitz_workload

PREFIX = toeplitz_workload("prefix")
NEEDS_C = ("mmcc", "dp-sgd-reduction")


@pytest.mark.parametrize("mech", [
    MatrixStrategy(np.eye(4), np.arange(4)),
    StructuredOperator(BandedToeplitz(np.array([1.0, 0.5])), PREFIX, 10),
    baseline_mechanism("identity", PREFIX, 10),
    baseline_mechanism("sqrt", PREFIX, 10),
    baseline_mechanism("honaker-online", PREFIX, 10),
    baseline_mechanism("tree", PREFIX, 10, epochs=2),
], ids=lambda m: type(m).__name__ + "-" + m.label)
def test_every_kind_lists_the_common_settings_and_nothing_that_needs_c(mech) -> None:
    free = mech.matrix_free_settings
    assert set(free) <= set(SETTINGS)
    assert set(MATRIX_FREE_SETTINGS) <= set(free)
    assert not set(free) & set(NEEDS_C)
    # only a tree on n leaves adds its own bounds (a restarted tree is blocks of smaller trees)
    assert ("shuffled-tree" in free) == (mech.kind in ("tree", "honaker-online") and mech.is_tree)


def test_the_tree_adds_its_own_bounds() -> None:
    free = baseline_mechanism("tree", PREFIX, 16384).matrix_free_settings
    assert {"shuffled-tree", "balls-in-bins-tree"} <= set(free)


def _pair(n: int):
    """(matrix path, matrix-free path) of the built-in tree on n leaves."""
    dense = resolve_strategy(strategy="tree", n=n)
    free = _any_n_baseline("tree", n=n, workload="prefix", beta=0.9)
    assert dense.has_matrix and not free.has_matrix
    return dense, free


@pytest.mark.parametrize(("n", "batching", "sigma"), [(16, "balls-in-bins", 2.0), (64, "balls-in-bins", 3.0),
                                                       (64, "shuffle", 3.0), (100, "shuffle", 5.0)])
def test_tree_batch_samplers_without_the_matrix_equal_the_matrix_path(n: int, batching: str, sigma: float) -> None:
    dense, free = _pair(n)
    want = account(dense, sigma=sigma, sampling=None, batching=batching).rows
    got_report = account(free, sigma=sigma, sampling=None, batching=batching)
    got = got_report.rows
    assert set(got) == set(want) - {"dp-sgd-reduction"}
    for name in got:
        assert got[name]["epsilon"] == want[name]["epsilon"], name
    assert any(note.startswith("dp-sgd-reduction: not run; it needs") for note in got_report.notes)


@pytest.mark.parametrize(("setting", "sigma"), [("balls-in-bins-tree", 2.5), ("shuffled-tree", 4.0)])
def test_tree_calibration_without_the_matrix_equals_the_matrix_path(setting: str, sigma: float) -> None:
    dense, free = _pair(32)
    assert epsilon_function(free, setting, sampling=None)(sigma) == epsilon_function(dense, setting, sampling=None)(sigma)


@pytest.mark.parametrize(("strategy", "batching"), [("identity", "shuffle"), ("identity", "balls-in-bins"),
                                                    ("sqrt", "shuffle")])
def test_samplers_whose_own_bounds_need_c_are_still_refused(strategy: str, batching: str) -> None:
    inp = _any_n_baseline(strategy, n=20_000, workload="prefix", beta=0.9)
    with pytest.raises(MfcliError, match=f"the {batching} batch sampler .*n <= 8192"):
        account(inp, sigma=2.0, sampling=None, batching=batching)


@pytest.mark.parametrize("setting", NEEDS_C)
def test_settings_that_need_c_are_refused_without_it(setting: str) -> None:
    free = _any_n_baseline("tree", n=20_000, workload="prefix", beta=0.9)
    with pytest.raises(MfcliError, match=f"the {setting} setting needs"):
        epsilon_function(free, setting, sampling=0.01)


@pytest.mark.parametrize("strategy", ["identity", "tree"])
def test_the_dp_sgd_references_alone_run_without_the_matrix(strategy: str) -> None:
    """A request for the shuffled DP-SGD reference alone (what its calibration reports) needs no
    C: the same number as the matrix path below the limit and as at any n."""
    from mfcli.accounting.shuffling import shuffled_dpsgd

    free = _any_n_baseline(strategy, n=20_000, workload="prefix", beta=0.9)
    rows = account(free, sigma=3.0, sampling=None, batching="shuffle", settings=["shuffled-dp-sgd"]).rows
    assert rows["shuffled-dp-sgd"]["epsilon"] == shuffled_dpsgd(n=20_000, sigma=3.0).epsilon
    small = _any_n_baseline(strategy, n=64, workload="prefix", beta=0.9)
    dense = resolve_strategy(strategy=strategy, n=64)
    assert (account(small, sigma=3.0, sampling=None, batching="shuffle", settings=["shuffled-dp-sgd"]).rows
            == account(dense, sigma=3.0, sampling=None, batching="shuffle", settings=["shuffled-dp-sgd"]).rows)
