"""Laplacian smoothing u = A_s^-1 v against dense solves, closed forms and its post-processing role."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mfcli.errors import MfcliError
from mfcli.training.smoothing import (
    LaplacianSmoother,
    laplacian_smooth,
    noise_variance_factor,
    smoothing_denominators,
    smoothing_matrix,
)


def dense_a_s(d: int, s: float) -> np.ndarray:
    """A_s = I - s L built entry by entry from the definition (the oracle; no FFT, no np.roll).

    L[i, i] = -2 and L[i, j] += 1 for each periodic neighbour j = i +- 1 (mod d); for d = 2 the two
    neighbours coincide and L[0, 1] = 2, for d = 1 both neighbours are the node itself and L = 0.
    """
    lap = np.zeros((d, d))
    for i in range(d):
        lap[i, i] -= 2.0
        lap[i, (i - 1) % d] += 1.0
        lap[i, (i + 1) % d] += 1.0
    return np.eye(d) - s * lap


# --------------------------------------------------------------------------------------------
# s = 0 is the identity


@pytest.mark.parametrize("shape", [(1,), (7,), (64,), (3, 10), (2, 3, 5)])
def test_s_zero_is_identity_bit_for_bit(shape):
    v = np.random.default_rng(0).normal(size=shape)
    u = laplacian_smooth(v, s=0.0)
    assert np.array_equal(u, v)
    assert u is not v  # a copy: the caller's array is never aliased
    assert np.array_equal(LaplacianSmoother(0.0)(v), v)
    assert LaplacianSmoother(0).is_identity


# --------------------------------------------------------------------------------------------
# equals the dense solve (I - s L) u = v


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 8, 17, 32])
@pytest.mark.parametrize("s", [0.05, 0.5, 1.0, 3.0, 25.0])
def test_equals_dense_solve(d, s):
    rng = np.random.default_rng(d * 1000 + int(s * 100))
    v = rng.normal(size=d)
    expected = np.linalg.solve(dense_a_s(d, s), v)
    np.testing.assert_allclose(laplacian_smooth(v, s=s), expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 3, 6, 9])
def test_smoothing_matrix_matches_definition(d):
    np.testing.assert_array_equal(smoothing_matrix(d, s=0.7), dense_a_s(d, 0.7))


@pytest.mark.parametrize("d", [1, 2, 5, 8, 13])
def test_denominators_are_the_eigenvalues_of_a_s(d):
    s = 1.3
    full = np.concatenate([smoothing_denominators(d, s=s), smoothing_denominators(d, s=s)[1:(d + 1) // 2]])
    np.testing.assert_allclose(np.sort(full), np.linalg.eigvalsh(dense_a_s(d, s)), atol=1e-12)


def test_batches_and_axis():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(4, 9))
    inv = np.linalg.inv(dense_a_s(9, 2.0))
    np.testing.assert_allclose(laplacian_smooth(v, s=2.0), v @ inv.T, atol=1e-12)
    inv4 = np.linalg.inv(dense_a_s(4, 2.0))
    np.testing.assert_allclose(laplacian_smooth(v, s=2.0, axis=0), inv4 @ v, atol=1e-12)
    np.testing.assert_allclose(LaplacianSmoother(2.0)(v), v @ inv.T, atol=1e-12)


def test_paper_denoising_example():
    """The 1-D illustration of DP-LSSGD (Wang et al. 2019, arXiv:1906.12056):
    sin(2 pi i / 100) + 0.1 N(0, 1) is pulled towards the sine."""
    i = np.arange(1, 101)
    clean = np.sin(2 * np.pi * i / 100)
    noisy = clean + 0.1 * np.random.default_rng(2).normal(size=100)
    err_before = np.linalg.norm(noisy - clean)
    err_after = np.linalg.norm(laplacian_smooth(noisy, s=3.0) - clean)
    assert err_after < 0.5 * err_before


# --------------------------------------------------------------------------------------------
# properties of A_s^-1


vectors = st.integers(1, 40).flatmap(
    lambda d: st.lists(st.floats(-1e3, 1e3), min_size=d, max_size=d).map(np.array)
)


@given(v=vectors, w_seed=st.integers(0, 10_000), s=st.floats(0.0, 50.0))
def test_linear_symmetric_contractive_mean_preserving(v, w_seed, s):
    d = v.shape[0]
    w = np.random.default_rng(w_seed).normal(size=d)
    u = laplacian_smooth(v, s=s)
    uw = laplacian_smooth(w, s=s)
    scale = 1.0 + np.abs(v).max()
    # linear
    np.testing.assert_allclose(laplacian_smooth(2.0 * v - w, s=s), 2.0 * u - uw, atol=1e-9 * scale)
    # symmetric: <A^-1 v, w> = <v, A^-1 w>
    assert np.dot(u, w) == pytest.approx(np.dot(v, uw), abs=1e-9 * scale * d)
    # operator norm 1 and the coordinate sum (the k = 0 mode) preserved
    assert np.linalg.norm(u) <= np.linalg.norm(v) * (1 + 1e-12) + 1e-12
    assert u.sum() == pytest.approx(v.sum(), abs=1e-9 * scale * d)
    # invertible: A_s u = v recovers the input exactly (nothing is lost, nothing added)
    np.testing.assert_allclose(dense_a_s(d, s) @ u, v, atol=1e-8 * scale * (1 + s))


@pytest.mark.parametrize("d", [1, 2, 7, 50])
@pytest.mark.parametrize("s", [0.0, 0.5, 3.0])
def test_noise_variance_factor_is_trace_of_dense_inverse_squared(d, s):
    inv = np.linalg.inv(dense_a_s(d, s))
    assert noise_variance_factor(d, s=s) == pytest.approx(np.trace(inv @ inv) / d, rel=1e-12)


@pytest.mark.parametrize("s", [0.5, 1.0, 3.0, 10.0])
def test_noise_variance_factor_tends_to_closed_form(s):
    # mean over a period of (a - b cos t)^-2 = a / (a^2 - b^2)^(3/2) with a = 1 + 2 s, b = 2 s
    assert noise_variance_factor(4096, s=s) == pytest.approx((1 + 2 * s) / (1 + 4 * s) ** 1.5, rel=1e-9)


def test_empirical_noise_variance_matches_factor():
    d, reps, s = 128, 4000, 2.0
    z = np.random.default_rng(3).normal(size=(reps, d))
    var = laplacian_smooth(z, s=s).var()
    # reps * d = 512k draws, but coordinates within a row are correlated: the variance estimate
    # averages reps independent rows, each the mean of d squared values; its relative standard
    # error is below sqrt(2 / reps) = 2.2 %; allow 4x that.
    assert var == pytest.approx(noise_variance_factor(d, s=s), rel=4 * np.sqrt(2 / reps))


# --------------------------------------------------------------------------------------------
# post-processing: a deterministic function of the noisy vector alone


def test_post_processing_is_pure():
    rng = np.random.default_rng(4)
    g, noise = rng.normal(size=30), rng.normal(size=30)
    v = g + noise
    before = v.copy()
    state = np.random.get_state()
    u1 = laplacian_smooth(v, s=1.5)
    u2 = LaplacianSmoother(1.5)(v)
    after = np.random.get_state()
    assert np.array_equal(v, before)  # input untouched
    assert np.array_equal(u1, u2)  # deterministic
    assert all(np.array_equal(a, b) for a, b in zip(state[1:2], after[1:2], strict=True))  # no randomness drawn
    # composes with any noise stream: smoothing the noisy gradient = smoothing each part
    np.testing.assert_allclose(u1, laplacian_smooth(g, s=1.5) + laplacian_smooth(noise, s=1.5), atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"v": np.ones(3), "s": -0.1}, "s must be finite and >= 0"),
        ({"v": np.ones(3), "s": float("nan")}, "s must be finite"),
        ({"v": np.ones(3), "s": float("inf")}, "s must be finite"),
        ({"v": np.ones(3), "s": "x"}, "must be a number"),
        ({"v": np.array([]), "s": 1.0}, "empty"),
        ({"v": np.float64(1.0), "s": 1.0}, "scalar"),
        ({"v": np.array([1.0, np.nan]), "s": 1.0}, "NaN or inf"),
        ({"v": np.array([1.0 + 1j]), "s": 1.0}, "complex"),
        ({"v": np.ones((2, 3)), "s": 1.0, "axis": 2}, "out of range"),
        ({"v": ["a", "b"], "s": 1.0}, "non-numeric"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs, match):
    with pytest.raises(MfcliError, match=match):
        laplacian_smooth(**kwargs)


def test_bad_smoother_and_d():
    with pytest.raises(MfcliError, match="s must be finite"):
        LaplacianSmoother(-1.0)
    with pytest.raises(MfcliError, match="positive integer"):
        noise_variance_factor(0, s=1.0)


def test_torch_tensors_match_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    v = rng.normal(size=(3, 11))
    out = LaplacianSmoother(1.7)(torch.from_numpy(v))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), laplacian_smooth(v, s=1.7), atol=1e-12)
    out32 = LaplacianSmoother(1.7)(torch.from_numpy(v).float())
    assert out32.dtype == torch.float32
    np.testing.assert_allclose(out32.numpy(), laplacian_smooth(v, s=1.7), atol=1e-5)


# --------------------------------------------------------------------------------------------
# as the adapters' postprocess hook (optional frameworks)


def _prefix_artifact(tmp_path, n=6):
    from mfcli.io.artifact import save_artifact
    from mfcli.model.workloads import prefix_workload
    from mfcli.optimize.dense import optimal_factorization

    fact = optimal_factorization(prefix_workload(n).matrix, tol=1e-8).factorization
    path = tmp_path / "prefix.h5"
    save_artifact(path, fact, workload_name="prefix", strategy_name="optimal")
    return path, fact


def test_torch_optimizer_hook_smooths_the_noisy_gradient(tmp_path):
    """CorrelatedNoiseOptimizer(postprocess=LaplacianSmoother(s)): step 0 moves the parameters by
    -lr A_s^-1 (grad + sigma clip (C^-1 Z)[0]), computed here from the stream's own noise row."""
    torch = pytest.importorskip("torch")
    from mfcli.adapters.torch import CorrelatedNoiseOptimizer
    from mfcli.training.noise import noise_stream

    path, _fact = _prefix_artifact(tmp_path)
    d, seed, sigma, lr, s = 10, 99, 0.8, 0.5, 2.0
    w = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    opt = CorrelatedNoiseOptimizer(torch.optim.SGD([w], lr=lr), artifact=path, seed=seed, noise_std=sigma,
                                   clip_norm=1.0, postprocess=LaplacianSmoother(s), dtype="float64")
    grad = np.linspace(-1.0, 1.0, d)
    w.grad = torch.from_numpy(grad.copy())
    opt.step()
    row, _ = noise_stream(path, kind="gradient", d=d, seed=seed, dtype="float64").next(
        noise_stream(path, kind="gradient", d=d, seed=seed, dtype="float64").init())
    expected = -lr * np.linalg.solve(dense_a_s(d, s), grad + sigma * row)
    np.testing.assert_allclose(w.detach().numpy(), expected, atol=1e-12)


def test_jax_arrays_and_optax_hook(tmp_path):
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax")
    import jax.numpy as jnp

    from mfcli.adapters.optax import correlated_noise
    from mfcli.training.noise import noise_stream

    v = np.random.default_rng(6).normal(size=(2, 13)).astype(np.float32)
    got = jax.jit(LaplacianSmoother(1.2))(jnp.asarray(v))  # traced under jit
    np.testing.assert_allclose(np.asarray(got), laplacian_smooth(v, s=1.2), atol=1e-5)
    arr = jnp.asarray(v)
    assert LaplacianSmoother(0.0)(arr) is arr  # s = 0: the hook is the identity

    path, _ = _prefix_artifact(tmp_path)
    d, seed, sigma, s = 7, 5, 1.3, 0.7
    stream = noise_stream(path, kind="gradient", d=d, seed=seed, dtype="float32")
    tx = correlated_noise(stream, noise_std=sigma, clip_norm=1.0, postprocess=LaplacianSmoother(s))
    params = jnp.zeros(d, dtype=jnp.float32)
    grad = jnp.asarray(np.linspace(0.0, 1.0, d), dtype=jnp.float32)
    updates, _ = jax.jit(tx.update)(grad, tx.init(params))
    from noise_oracles import jax_z  # the jax stream draws Z with jax.random: row 0 is C^-1[0, 0] Z[0]

    row = stream.operator_matrix()[0, 0] * jax_z(seed, 1, d, "float32")[0].astype(np.float64)
    expected = np.linalg.solve(dense_a_s(d, s), np.asarray(grad, dtype=np.float64) + sigma * row)
    np.testing.assert_allclose(np.asarray(updates), expected, rtol=1e-5, atol=1e-5)
