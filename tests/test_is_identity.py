"""``Mechanism.is_identity``: whether a mechanism's C is exactly the identity (then it is DP-SGD and
a record's ``dp-sgd`` row holds under Poisson sampling, ``training.samplers.held_epsilons_of``).
Each kind answers from its own parameters; the expected answer here is the dense C compared with I
entry by entry (built independently with numpy where the kind has no dense form at hand), and the
near-identity cases, whose C differs from I in one entry by a rounding error, must say False."""
from __future__ import annotations

import numpy as np
import pytest

from mfcli.model.factorization import Factorization
from mfcli.strategies.baseline_mechanisms import baseline_mechanism
from mfcli.strategies.blt import BufferedToeplitz
from mfcli.strategies.operators import (
    BandedLowRank,
    CompressedOperator,
    DenseOperator,
    MatrixStrategy,
)
from mfcli.strategies.structured import StructuredOperator
from mfcli.strategies.toeplitz import BandedToeplitz, toeplitz_workload

PREFIX = toeplitz_workload("prefix")
TINY = np.finfo(np.float64).eps  # one rounding error at 1.0


def _dense(c: np.ndarray) -> DenseOperator:
    """The dense mechanism A = I C with decoder I (so C is exactly the given matrix)."""
    n = c.shape[1]
    return DenseOperator(Factorization(workload=c, strategy=c, decoder=np.eye(n), causal=True))


def _compressed(a: np.ndarray) -> CompressedOperator:
    """The compressed operator with decoder B^ = I (band 1 of ones, rank 0): C^ = B^-1 A = A."""
    n = a.shape[0]
    fact = Factorization(workload=a, strategy=a, decoder=np.eye(n), causal=True)
    return CompressedOperator.build(fact, BandedLowRank(band=np.ones((n, 1)), u=np.zeros((n, 0)), v=np.zeros((n, 0))))


def _near(n: int, i: int, j: int, delta: float) -> np.ndarray:
    c = np.eye(n)
    c[i, j] += delta
    return c


def _blt(theta, omega, n):
    return StructuredOperator(BufferedToeplitz(theta=np.array(theta, float), omega=np.array(omega, float)), PREFIX, n)


def _banded(coefs, n):
    return StructuredOperator(BandedToeplitz(np.array(coefs, float)), PREFIX, n)


CASES = [
    # (id, mechanism, want)
    ("dense I", _dense(np.eye(6)), True),
    ("dense I + eps below the diagonal", _dense(_near(6, 3, 1, 1e-300)), False),
    ("dense diagonal 1 + eps", _dense(_near(6, 2, 2, TINY)), False),
    ("dense 2 I", _dense(2 * np.eye(6)), False),
    ("compressed I", _compressed(np.eye(5)), True),
    ("compressed I + eps", _compressed(_near(5, 4, 0, TINY)), False),
    ("matrix I", MatrixStrategy(np.eye(4), np.arange(4)), True),
    ("matrix 1 + eps", MatrixStrategy(_near(4, 0, 0, TINY), np.arange(4)), False),
    ("banded (1)", _banded([1.0], 50), True),
    ("banded (1, 0, 0): trailing zeros", _banded([1.0, 0.0, 0.0], 50), True),
    ("banded (1, 0.5) at n = 1", _banded([1.0, 0.5], 1), True),
    ("banded (1 + eps)", _banded([1.0 + TINY], 50), False),
    ("banded (1, 1e-300)", _banded([1.0, 1e-300], 50), False),
    ("banded (1, 0, 1e-300) at n = 2: the band beyond n", _banded([1.0, 0.0, 1e-300], 2), True),
    ("banded (1, 0, 1e-300) at n = 3", _banded([1.0, 0.0, 1e-300], 3), False),
    ("blt omega 0", _blt([0.5, 0.25], [0.0, 0.0], 40), True),
    ("blt omega tiny", _blt([0.5, 0.25], [0.0, 1e-12], 40), False),
    ("blt at n = 1", _blt([0.5], [0.3], 1), True),
    ("blt optimised-like", _blt([0.9, 0.5], [0.2, 0.1], 40), False),
    ("identity baseline", baseline_mechanism("identity", PREFIX, 100), True),
    ("sqrt baseline", baseline_mechanism("sqrt", PREFIX, 100), False),
    ("sqrt baseline at n = 1", baseline_mechanism("sqrt", PREFIX, 1), True),
    ("tree", baseline_mechanism("tree", PREFIX, 2), False),
    ("honaker-online", baseline_mechanism("honaker-online", PREFIX, 16), False),
    ("tree restarted", baseline_mechanism("tree", PREFIX, 16, epochs=4), False),
]


@pytest.mark.parametrize(("mech", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_is_identity_per_kind(mech, want: bool) -> None:
    assert mech.is_identity is want
    # independently: the dense C of the kind, compared with I entry by entry
    c = mech.accounting_matrix()
    assert c is not None
    exact = c.shape[0] == c.shape[1] and bool(np.array_equal(c, np.eye(c.shape[1])))
    assert exact is want


def test_blt_says_false_on_the_safe_side_only_below_its_buffer_count() -> None:
    """Two buffers at n = 2 with c_1 = omega_1 + omega_2 = 0: C is I, but the BLT answers from
    its parameters alone (False, so DP-SGD's accounting is not claimed); from n = 3 on (n > d)
    the same parameters give a C that is not I, as the parameter rule says."""
    at2, at3 = _blt([0.5, 0.25], [0.5, -0.5], 2), _blt([0.5, 0.25], [0.5, -0.5], 3)
    assert np.array_equal(at2.accounting_matrix(), np.eye(2)) and at2.is_identity is False
    assert not np.array_equal(at3.accounting_matrix(), np.eye(3)) and at3.is_identity is False
