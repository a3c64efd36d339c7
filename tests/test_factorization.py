"""The factorization value object: error and sensitivity against closed forms."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mfcli.errors import MfcliError
from mfcli.model.factorization import Factorization, sensitivity


@pytest.mark.parametrize("n", [1, 2, 3, 10, 100])
def test_identity_on_prefix_has_closed_form_loss(n):
    s = np.tril(np.ones((n, n)))
    f = Factorization(workload=s, strategy=np.eye(n), decoder=s).verify()
    assert f.sensitivity == 1.0
    assert f.loss_total == n * (n + 1) / 2
    assert f.loss_max == n
    assert f.loss_mean == pytest.approx((n + 1) / 2)
    assert f.causal


@pytest.mark.parametrize("n", [1, 4, 9])
def test_prefix_as_strategy_has_sensitivity_sqrt_n(n):
    s = np.tril(np.ones((n, n)))
    f = Factorization(workload=s, strategy=s, decoder=np.eye(n))
    assert f.sensitivity == pytest.approx(np.sqrt(n))
    assert f.loss_total == pytest.approx(n * n)  # n * ||I||_F^2


@given(scale=st.floats(0.1, 10.0), seed=st.integers(0, 1000))
def test_loss_invariant_to_rescaling_strategy(scale, seed):
    rng = np.random.default_rng(seed)
    n = 5
    c = np.tril(rng.normal(size=(n, n))) + 3 * np.eye(n)
    a = np.tril(np.ones((n, n)))
    b = a @ np.linalg.inv(c)
    f1 = Factorization(workload=a, strategy=c, decoder=b)
    f2 = Factorization(workload=a, strategy=scale * c, decoder=b / scale)
    assert f1.loss_total == pytest.approx(f2.loss_total, rel=1e-9)
    assert f2.sensitivity == pytest.approx(scale * sensitivity(c))


def test_verify_rejects_wrong_product_and_shapes():
    a = np.tril(np.ones((3, 3)))
    with pytest.raises(MfcliError, match="A != B C"):
        Factorization(workload=a, strategy=np.eye(3), decoder=np.eye(3)).verify()
    with pytest.raises(MfcliError, match="columns"):
        Factorization(workload=a, strategy=np.eye(2), decoder=np.eye(2))
    with pytest.raises(MfcliError, match="NaN"):
        Factorization(workload=a, strategy=np.full((3, 3), np.nan), decoder=a)


def test_non_triangular_is_not_causal_and_noising_matrix():
    a = np.tril(np.ones((2, 2)))
    c = np.array([[1.0, 0.5], [0.0, 1.0]])
    f = Factorization(workload=a, strategy=c, decoder=a @ np.linalg.inv(c)).verify()
    assert not f.causal
    cl = np.array([[2.0, 0.0], [1.0, 1.0]])
    g = Factorization(workload=a, strategy=cl, decoder=a @ np.linalg.inv(cl))
    np.testing.assert_allclose(g.noising_matrix() @ cl, np.eye(2), atol=1e-15)
