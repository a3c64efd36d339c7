"""The one Mechanism protocol (mfcli.strategies.operators.Mechanism) and the one name registry (mfcli.model.kinds):
every kind implements the protocol, and a structured kind's numbers (computed from its
parameters) agree with the same numbers computed from its materialised matrix C by the dense
implementation (an independent path: participation.sensitivity, accounting.multi's band count and
column norms, mmcc.check_causal)."""
from __future__ import annotations

import numpy as np
import pytest

from mfcli.errors import MfcliError
from mfcli.model import kinds
from mfcli.model.factorization import Factorization
from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation
from mfcli.strategies.baselines import tree_release_steps, tree_strategy_matrix
from mfcli.strategies.blt import BufferedToeplitz
from mfcli.strategies.operators import DenseOperator, MatrixStrategy, Mechanism, NoiseOperator, tree_release
from mfcli.strategies.structured import StructuredOperator, strategy_class
from mfcli.strategies.toeplitz import TOEPLITZ_PREFIX, BandedToeplitz, materialize
from mfcli.util.limits import STRUCTURED_DENSE_MAX_N

BANDED = BandedToeplitz(np.array([1.0, 0.5, 0.375]))
BLT = BufferedToeplitz(theta=np.array([0.9, 0.5]), omega=np.array([0.3, 0.2]))


def structured(strategy: object, n: int) -> StructuredOperator:
    return StructuredOperator(strategy, TOEPLITZ_PREFIX, n)


def dense_c(strategy: object, n: int) -> np.ndarray:
    """C from the first column, built here without mfcli (lower-triangular Toeplitz)."""
    c = np.asarray(strategy.strategy_coefs(n), dtype=np.float64)  # type: ignore[attr-defined]
    return np.array([[c[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def test_the_registry_names_every_list():
    from mfcli.accounting.defaults import BUILTIN
    from mfcli.strategies.baselines import DESCRIPTIONS, STRATEGY_NAMES, TREE_STRATEGIES

    assert STRATEGY_NAMES == kinds.BASELINES == ("identity", "tree", "honaker-online", "honaker-full", "sqrt",
                                                  "optimal")
    assert BUILTIN == kinds.ACCOUNTABLE == ("identity", "tree", "sqrt", "optimal")
    assert TREE_STRATEGIES == ("tree", "honaker-online", "honaker-full")
    assert set(DESCRIPTIONS) == set(STRATEGY_NAMES)
    assert len({k.name for k in kinds.KINDS}) == len(kinds.KINDS)
    for name in kinds.STRUCTURED:
        assert strategy_class(name).kind == name
    with pytest.raises(MfcliError, match="structured kind must be one of banded-toeplitz, blt"):
        strategy_class("dense")


@pytest.mark.parametrize("op", [
    MatrixStrategy(np.eye(4), np.arange(4)),
    DenseOperator(Factorization(workload=np.tril(np.ones((4, 4))), strategy=np.eye(4),
                                decoder=np.tril(np.ones((4, 4))), causal=True)),
    structured(BANDED, 16),
    structured(BLT, 16),
])
def test_every_kind_implements_the_protocol(op):
    if isinstance(op, MatrixStrategy):
        # a bare C has no decoder: its decoder-side members refuse in one line instead
        with pytest.raises(MfcliError, match="needs the decoder B"):
            op.streaming("gradient")
        assert op.group() is None
    else:
        assert isinstance(op, Mechanism) and NoiseOperator is Mechanism
    assert op.kind in {k.name for k in kinds.KINDS} | {"matrix"}
    assert op.rows == op.n and len(op.release_steps) == op.n and not op.is_tree
    assert op.no_matrix_reason is None and op.accounting_matrix().shape == (op.n, op.n)


@pytest.mark.parametrize("strategy", [BANDED, BLT], ids=["banded-toeplitz", "blt"])
@pytest.mark.parametrize("schema", [SingleParticipation(), FixedEpoch(epochs=4), MinSeparation(separation=5)],
                         ids=["single", "epochs", "min-sep"])
def test_structured_numbers_match_the_dense_path_on_its_matrix(strategy, schema):
    n = 20
    op = structured(strategy, n)
    c = dense_c(strategy, n)
    np.testing.assert_allclose(op.accounting_matrix(), c, rtol=1e-12, atol=1e-15)
    dense = MatrixStrategy(c, np.arange(n))
    got, want = op.schema_sensitivity(schema), dense.schema_sensitivity(schema)
    # the structured value is exact where the dense one is, and never below it (a certified bound)
    assert got.value >= want.value * (1 - 1e-9)
    if want.exact and got.exact:
        assert got.value == pytest.approx(want.value, rel=1e-9)
    assert op.sensitivity == pytest.approx(float(np.sqrt((c * c).sum(axis=0).max())), rel=1e-12)
    op.check_causal("the test bound")  # a Toeplitz C is causal: no refusal


def test_cyclic_numbers_of_a_banded_c_match_the_matrix():
    n = 24
    op = structured(BANDED, n)
    c = dense_c(BANDED, n)
    bands, col = op.cyclic_numbers(MinSeparation(separation=4))
    dense_bands, dense_col = MatrixStrategy(c, np.arange(n)).cyclic_numbers(MinSeparation(separation=4))
    assert (bands, dense_bands) == (3, 3)
    assert col == pytest.approx(dense_col, rel=1e-12) and dense_col == pytest.approx(np.linalg.norm(BANDED.coefs))


def test_a_matrix_kind_refuses_a_non_causal_c():
    c = np.triu(np.ones((3, 3)))
    with pytest.raises(MfcliError, match="not causal"):
        MatrixStrategy(c, np.arange(3)).check_causal("the test bound")


def test_the_tree_is_recognised_by_its_matrix():
    c = tree_strategy_matrix(8)
    np.testing.assert_array_equal(tree_release(c), tree_release_steps(8))
    assert tree_release(2.5 * c) is not None and tree_release(np.eye(8)) is None
    assert MatrixStrategy(c, tree_release_steps(8)).is_tree


def test_above_the_dense_limit_there_is_no_matrix_and_the_reason_says_why():
    op = structured(BANDED, STRUCTURED_DENSE_MAX_N + 1)
    assert op.max_n["matrix"] == STRUCTURED_DENSE_MAX_N and op.max_n["sensitivity"] is None
    assert op.accounting_matrix() is None
    assert f"n <= {STRUCTURED_DENSE_MAX_N} only (this one has n = {STRUCTURED_DENSE_MAX_N + 1})" in (op.no_matrix_reason or "")
    assert op.matrix_refusal("the mmcc setting").startswith("the mmcc setting needs the dense strategy C")
    # the parameters still give every number that needs no matrix, at any n
    assert op.sensitivity == pytest.approx(float(np.linalg.norm(BANDED.coefs)), rel=1e-12)
    assert op.cyclic_numbers(MinSeparation(separation=4))[0] == 3


def test_session_accounts_a_structured_mechanism_like_its_matrix():
    """The one accounting path: a structured mechanism and the plain matrix of the same C give the
    same epsilons in the settings computed from the parameters."""
    from mfcli.services.account import StrategyInput, account

    n = 16
    op = structured(BANDED, n)
    c = dense_c(BANDED, n)
    inp_s = StrategyInput(name="s", strategy=op.accounting_matrix(), release_steps=np.arange(n), source="s",
                          mechanism=op)
    inp_d = StrategyInput(name="d", strategy=c, release_steps=np.arange(n), source="d")
    schema = MinSeparation(separation=4)
    for batching, sampling in ((None, None), ("cyclic", 0.1)):
        rs = account(inp_s, sigma=2.0, sampling=sampling, participation=schema, batching=batching,
                     settings=["deterministic", "cyclic-poisson"])
        rd = account(inp_d, sigma=2.0, sampling=sampling, participation=schema, batching=batching,
                     settings=["deterministic", "cyclic-poisson"])
        for name, row in rd.rows.items():
            assert rs.rows[name]["epsilon"] == pytest.approx(row["epsilon"], rel=1e-9), name
    assert materialize(BANDED.strategy_coefs(4), 4)[3, 0] == 0.0  # 3 bands: C[3, 0] is outside the band


def test_single_pass_uses_the_certified_sensitivity_also_where_c_is_materialised():
    """At n <= the dense limit a structured strategy's single-pass row uses its certified
    parametric sensitivity (never below the float column norm of its C), as at every n."""
    from mfcli.services.account import StrategyInput, account

    n = 64
    op = structured(BLT, n)
    inp = StrategyInput(name="blt", strategy=op.accounting_matrix(), release_steps=np.arange(n), source="t",
                        mechanism=op)
    row = account(inp, sigma=2.0, sampling=None, settings=["single-pass"]).rows["single-pass"]
    assert row["sensitivity"] == op.sensitivity == BLT.sensitivity(n, SingleParticipation()).value
    c = dense_c(BLT, n)
    assert row["sensitivity"] >= float(np.sqrt((c * c).sum(axis=0).max()))
