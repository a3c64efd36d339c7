"""The jax_privacy export through the registry of native forms (``adapters.jax_privacy._NATIVE``,
keyed by the class of a kind's strategy object) rather than branches on kind names: every
structured kind has its entry, the baselines without one export densely and import back to the
same C (checked against C written out here from its definition), the tree (a non-square C) is
refused in one line, and a newly registered kind is exported through its entry with no change
to the adapter. Oracles: C from its definition, C^-1 by a triangular solve, jax_privacy's own
materialisations."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.linalg

from mfcli.adapters import jax_privacy as bridge
from mfcli.errors import MfcliError
from mfcli.model.kinds import STRUCTURED
from mfcli.model.workloads import build_workload
from mfcli.strategies.baseline_mechanisms import SqrtBaseline, ToeplitzBaseline, baseline_mechanism
from mfcli.strategies.structured import strategy_class
from mfcli.strategies.toeplitz import toeplitz_workload

N = 12


@pytest.fixture(scope="module")
def jp():
    pytest.importorskip("jax_privacy")
    import jax

    with jax.enable_x64(True):
        yield


def test_every_structured_kind_has_a_native_form() -> None:
    assert set(bridge._NATIVE) == {strategy_class(k) for k in STRUCTURED}


def _baseline_c(name: str, n: int) -> np.ndarray:
    """C from its definition: identity I; sqrt the Toeplitz matrix of binom(2k, k) / 4^k."""
    if name == "identity":
        return np.eye(n)
    col = [1.0]
    for k in range(1, n):
        col.append(col[-1] * (2 * k - 1) / (2 * k))
    return np.array([[col[t - j] if t >= j else 0.0 for j in range(n)] for t in range(n)])


@pytest.mark.parametrize("name", ["identity", "sqrt"])
def test_baselines_export_densely_and_import_back(jp, tmp_path: Path, name: str) -> None:
    import jax
    import jax.numpy as jnp

    mech = baseline_mechanism(name, toeplitz_workload("prefix"), N)
    c = _baseline_c(name, N)
    native = bridge.native_strategy(mech)
    assert isinstance(native, np.ndarray) and native.shape == (N, N)
    np.testing.assert_allclose(native, c, rtol=0, atol=1e-14)
    sm = bridge.streaming_matrix(mech)
    got = np.asarray(jax.jit(lambda x: sm @ x)(jnp.eye(N)))
    np.testing.assert_allclose(got, scipy.linalg.solve_triangular(c, np.eye(N), lower=True), rtol=0, atol=1e-12)
    w = build_workload("prefix", N)
    np.testing.assert_allclose(bridge.import_strategy(native, w).factorization.strategy, c, rtol=0, atol=1e-14)


def test_the_tree_is_refused_in_one_line(jp) -> None:
    """The tree's C has 2n - 1 rows: jax_privacy streams one noise row per step."""
    tree = baseline_mechanism("tree", toeplitz_workload("prefix"), N)
    native = bridge.native_strategy(tree)
    assert native.shape == (tree.rows, N)
    with pytest.raises(MfcliError, match=f"the strategy matrix is {tree.rows} x {N}"):
        bridge.import_strategy(native, build_workload("prefix", N))
    with pytest.raises(MfcliError, match="square"):
        bridge.streaming_matrix(tree)


def test_a_registered_kind_exports_through_its_entry(jp, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new kind needs one entry: registered here for the sqrt baseline (its strategy class
    :class:`SqrtBaseline`; its first column is jax_privacy's Toeplitz form), sqrt then exports as
    its coefficients and streams C^-1 by jax_privacy's own Toeplitz inverse, equal to the
    triangular solve."""
    import jax
    import jax.numpy as jnp
    from jax_privacy.matrix_factorization import toeplitz

    monkeypatch.setitem(bridge._NATIVE, SqrtBaseline, bridge.NativeExport(
        lambda st: np.asarray(st.strategy_coefs(N), dtype=np.float64),
        lambda st: toeplitz.inverse_as_streaming_matrix(np.asarray(st.strategy_coefs(N), dtype=np.float64))))
    mech = baseline_mechanism("sqrt", toeplitz_workload("prefix"), N)
    c = _baseline_c("sqrt", N)
    native = bridge.native_strategy(mech)
    assert native.shape == (N,)
    np.testing.assert_allclose(np.asarray(toeplitz.materialize_lower_triangular(jnp.asarray(native), N)), c,
                               rtol=0, atol=1e-14)
    sm = bridge.streaming_matrix(mech)
    got = np.asarray(jax.jit(lambda x: sm @ x)(jnp.eye(N)))
    np.testing.assert_allclose(got, scipy.linalg.solve_triangular(c, np.eye(N), lower=True), rtol=0, atol=1e-10)
    back = bridge.import_strategy(native, build_workload("prefix", N))
    np.testing.assert_allclose(back.factorization.strategy, c, rtol=0, atol=1e-14)


@pytest.mark.parametrize(("registered", "native"), [
    (SqrtBaseline, {"sqrt"}),                  # its own class: identity stays dense
    (ToeplitzBaseline, {"identity", "sqrt"}),  # a base class: every kind on it
])
def test_an_entry_for_a_class_covers_its_subclasses(jp, monkeypatch: pytest.MonkeyPatch, registered, native) -> None:
    """The export registry is keyed by strategy class and looked up along the class's bases: an
    entry for the shared ToeplitzBaseline exports identity and sqrt as their coefficients, one
    for SqrtBaseline only sqrt; the coefficients are C's first column from its definition."""
    monkeypatch.setitem(bridge._NATIVE, registered, bridge.NativeExport(
        lambda st: np.asarray(st.strategy_coefs(N), dtype=np.float64), lambda st: None))
    for name in ("identity", "sqrt"):
        got = bridge.native_strategy(baseline_mechanism(name, toeplitz_workload("prefix"), N))
        if name in native:
            np.testing.assert_allclose(got, _baseline_c(name, N)[:, 0], rtol=0, atol=1e-15)
        else:
            np.testing.assert_allclose(got, _baseline_c(name, N), rtol=0, atol=1e-14)
