"""Each kind answers for itself (issue 23, item 1): outside the artifact I/O layer (mfcli/io,
mfcli/cli) no code tests a strategy's kind name or class, the constructor tables cover the name
registry, and what a consumer used to switch on (is the C the binary tree, is X banded, where does
a kind's native export come from) is answered by the object, checked here against an independent
derivation (the tree recognised from its matrix, the band from the schema's participations)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from mfcli.model import kinds
from mfcli.model.participation import FixedEpoch, MinSeparation
from mfcli.optimize.multi_structure import Structure
from mfcli.strategies.baseline_mechanisms import (
    ANY_N_CONSTRUCTORS,
    HonakerMechanism,
    IdentityBaseline,
    SqrtBaseline,
    ToeplitzBaselineMechanism,
    TreeMechanism,
    baseline_mechanism,
)
from mfcli.strategies.baselines import BUILDERS, STRATEGY_NAMES, build_strategy
from mfcli.strategies.operators import tree_release
from mfcli.strategies.toeplitz import toeplitz_workload

ROOT = Path(__file__).resolve().parents[1] / "mfcli"

#: A comparison of a kind-like name with a kind's name, or an isinstance on a kind's class.
KIND_BRANCH = re.compile(
    r'(kind|name|label|strategy)\)? *(==|!=|in|not in) *\(?"(dp-sgd|bandmf|banded|blt|dense|tree|honaker|identity|'
    r'sqrt|banded-toeplitz|compressed|honaker-online|honaker-full|optimal)"'
    r"|isinstance\([^)]*(BandedToeplitz|BufferedToeplitz|StructuredOperator|DenseLowerTriangular|DenseOperator|"
    r"CompressedOperator|TreeMechanism|HonakerMechanism|IdentityBaseline|SqrtBaseline|ToeplitzBaseline)")

#: The justified exceptions, (path under mfcli/, line text): each carries a comment saying why.
ALLOWED: set[tuple[str, str]] = set()


def _branches() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("io/", "cli/")):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if KIND_BRANCH.search(line):
                out.append((rel, i, line.strip()))
    return out


def test_the_pattern_finds_a_kind_branch():
    """The guard below can fail: the pattern matches the switches this issue removed."""
    assert KIND_BRANCH.search('        if self.kind == "identity":')
    assert KIND_BRANCH.search('    causal = name != "honaker-full"')
    assert KIND_BRANCH.search("    if isinstance(mech, TreeMechanism):")
    assert not KIND_BRANCH.search('    if wl.name == "prefix":')


def test_no_code_outside_the_io_layer_branches_on_the_kind():
    found = _branches()
    extra = [f"mfcli/{rel}:{i}: {text}" for rel, i, text in found if (rel, text) not in ALLOWED]
    assert not extra, "a kind answers for itself (a method or a registry entry), not a switch:\n" + "\n".join(extra)
    assert len(ALLOWED) <= 2


def test_the_constructor_tables_cover_the_registry():
    assert tuple(BUILDERS) == STRATEGY_NAMES == kinds.BASELINES
    assert tuple(ANY_N_CONSTRUCTORS) == kinds.ANY_N_BASELINES
    assert kinds.SOLVED == ("optimal",) and not set(kinds.SOLVED) & set(kinds.ANY_N_BASELINES)


@pytest.mark.parametrize(("name", "cls", "strategy_cls"), [
    ("identity", ToeplitzBaselineMechanism, IdentityBaseline),
    ("sqrt", ToeplitzBaselineMechanism, SqrtBaseline),
    ("tree", TreeMechanism, None),
    ("honaker-online", HonakerMechanism, None),
    ("honaker-full", HonakerMechanism, None),
])
def test_each_baseline_is_its_own_class_and_keeps_its_name(name, cls, strategy_cls):
    mech = baseline_mechanism(name, toeplitz_workload("prefix"), 16)
    assert type(mech) is cls and mech.kind == name == mech.label
    if strategy_cls is not None:
        assert type(mech.strategy) is strategy_cls and mech.strategy.kind == name


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("n", [2, 7, 16])
def test_is_tree_is_what_the_matrix_shows(name, n):
    """Strategy.is_tree (set by the kind's builder) and the any-n mechanism's is_tree agree with
    the tree recognised from the dense C (operators.tree_release, an independent path), and with
    the registry's ``tree`` flag."""
    st = build_strategy(name, np.tril(np.ones((n, n))), tol=1e-4)
    from_matrix = tree_release(np.asarray(st.factorization.strategy)) is not None
    assert st.is_tree == from_matrix == (name in kinds.TREE_BASELINES)
    if name in kinds.ANY_N_BASELINES:
        assert baseline_mechanism(name, toeplitz_workload("prefix"), n).is_tree == from_matrix


@pytest.mark.parametrize(("n", "schema", "banded"), [
    (12, MinSeparation(separation=4), True),     # 3 participations: entries >= 4 apart are zero
    (12, MinSeparation(separation=11), True),    # 2 participations
    (12, MinSeparation(separation=12), False),   # one participation: the dense problem
    (12, MinSeparation(separation=4, max_participations=1), False),
    (12, FixedEpoch(epochs=3), False),           # a fixed-epoch mask is periodic, not a band
])
def test_the_structure_says_whether_x_is_banded(n, schema, banded):
    st = Structure(n, schema)
    assert st.banded is banded
    # independent: banded iff more than one participation fits under min-separation
    assert banded == (isinstance(schema, MinSeparation) and schema.participations(n) > 1)
