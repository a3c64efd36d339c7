"""One policy for size limits (issue 23): every largest n is a named constant of mfcli.util.limits, and
the checks that enforce one refuse exactly one step above it, naming the value."""
from __future__ import annotations

import pytest

from mfcli.errors import MfcliError
from mfcli.util import limits


def _workload_n(n: int) -> object:
    from mfcli.model.workloads import check_n

    return check_n(n)


def _structured_n(n: int) -> object:
    from mfcli.strategies.toeplitz import check_n

    return check_n(n)


def _blt_n(n: int) -> object:
    from mfcli.strategies.blt import _check_n

    return _check_n(n)


@pytest.mark.parametrize(("check", "limit"), [
    (_workload_n, limits.DENSE_MAX_N),
    (_structured_n, limits.STRUCTURED_MAX_N),
    (_blt_n, limits.BLT_MAX_N),
])
def test_each_check_enforces_its_named_limit(check, limit):
    assert check(limit) == limit
    with pytest.raises(MfcliError, match=str(limit)):
        check(limit + 1)


def test_a_dense_toeplitz_matrix_stops_at_the_structured_dense_limit():
    import numpy as np

    from mfcli.strategies.toeplitz import materialize

    with pytest.raises(MfcliError, match=f"n <= {limits.STRUCTURED_DENSE_MAX_N} only"):
        materialize(np.array([1.0]), limits.STRUCTURED_DENSE_MAX_N + 1)


def test_every_limit_is_a_documented_positive_integer():
    """Each constant has its reason next to it (a ``#:`` comment) and is a positive int."""
    import inspect

    source = inspect.getsource(limits)
    for name in limits.__all__:
        value = getattr(limits, name)
        assert isinstance(value, int) and value > 0, name
        before = source.split(f"\n{name} = ", 1)[0].rstrip().splitlines()[-1]
        assert before.startswith("#:"), f"{name} has no reason comment"
