"""Every kind of noise stream against its exact operator, in numpy, torch and jax.

Kinds: BandMF (a dense artifact whose C is banded: the banded-inverse recursion), a general
dense C^-1 (the kept rows of Z), compressed (banded plus low-rank), banded Toeplitz (its IIR
recursion) and BLT (its buffers). Oracles, computed here and not through mfcli.training.noise:

* the operator M (C^-1 for gradient noise, B = A C^-1 for iterate noise) from the dense C this
  file builds (or C^ = B^-1 A from the hand-built compression), by numpy inverses;
* Z drawn straight from each generator by its documented contract (noise_oracles: Philox blocks
  for numpy, per-row seeded torch.randn for torch, fold_in keys for jax);
* row t of the stream against (M Z)[t] (same Z), in each framework;
* statistics: the d coordinates of a stream are d independent draws of the n-vector M z, so
  their sample mean and covariance across steps are tested against 0 and M M^T with tolerances
  from the sample size (5 standard errors);
* checkpoint/resume equals the uninterrupted stream, and the same seed gives the same noise.
"""
from __future__ import annotations

import numpy as np
import pytest
from structured_oracles import blt_dense, toeplitz_dense

from mfcli.errors import MfcliError
from mfcli.io.artifact import save_artifact, save_structured_artifact
from mfcli.model.factorization import Factorization
from mfcli.model.workloads import prefix_workload
from mfcli.strategies.blt import BufferedToeplitz
from mfcli.strategies.toeplitz import BandedToeplitz, toeplitz_workload
from mfcli.training.noise import noise_stream
from mfcli.util.memory import MemoryLimitError

from noise_oracles import jax_z, philox_z, save_truncated_svd_compression, torch_z

N = 12
SEED = 2024
KINDS = ["bandmf", "dense", "compressed", "banded-toeplitz", "blt"]
METHOD = {"bandmf": "banded-inverse", "dense": "history", "compressed": "banded-low-rank",
          "banded-toeplitz": "recursion", "blt": "recursion"}


def _banded_c(n: int, bands: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    c = np.tril(rng.uniform(-0.3, 0.3, (n, n)))
    c[np.tril_indices(n, -bands)] = 0.0
    c[np.diag_indices(n)] = rng.uniform(1.0, 1.5, n)
    return c


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """kind -> (artifact path, A, exact C as used by the noise)."""
    tmp = tmp_path_factory.mktemp("streams")
    a = prefix_workload(N).matrix
    out = {}
    for kind, c in (("bandmf", _banded_c(N, 3)), ("dense", _banded_c(N, N))):
        fact = Factorization(workload=a, strategy=c, decoder=a @ np.linalg.inv(c), causal=True)
        save_artifact(tmp / f"{kind}.h5", fact, workload_name="prefix", strategy_name=kind)
        out[kind] = (tmp / f"{kind}.h5", a, c)
    path, a_m, _fact, b_hat = save_truncated_svd_compression(tmp / "compressed.h5", n=N, beta=0.9, band=2, rank=2)
    out["compressed"] = (path, a_m, np.linalg.solve(b_hat, a_m))          # C^ = B^-1 A
    w = toeplitz_workload("prefix")
    coefs = np.array([1.0, 0.6, 0.25])
    save_structured_artifact(tmp / "bt.h5", BandedToeplitz(coefs), workload=w, n=N)
    out["banded-toeplitz"] = (tmp / "bt.h5", a, toeplitz_dense(np.concatenate([coefs, np.zeros(N - 3)])))
    theta, omega = [0.9, 0.4], [0.3, 0.2]
    save_structured_artifact(tmp / "blt.h5", BufferedToeplitz(theta=theta, omega=omega), workload=w, n=N)
    out["blt"] = (tmp / "blt.h5", a, blt_dense(theta, omega, N))
    return out


def exact_operator(case, kind: str) -> np.ndarray:
    _path, a, c = case
    inv = np.linalg.inv(c)
    return inv if kind == "gradient" else a @ inv


def numpy_rows(stream) -> np.ndarray:
    state, rows = stream.init(), []
    for _ in range(stream.n):
        row, state = stream.next(state)
        rows.append(row)
    return np.array(rows, dtype=np.float64)


def torch_rows(stream, steps=None) -> np.ndarray:
    from mfcli.adapters.torch import TorchStream

    ts = TorchStream(stream, "cpu")
    return np.array([ts.next().numpy() for _ in range(steps or stream.n)], dtype=np.float64)


def jax_rows(stream) -> np.ndarray:
    """Rows from the jitted optax update on zero gradients (the adapter's whole path)."""
    import jax
    import jax.numpy as jnp

    from mfcli.adapters.optax import correlated_noise

    tx = correlated_noise(stream, noise_std=1.0, clip_norm=1.0)
    update = jax.jit(tx.update)
    state = tx.init(jnp.zeros(stream.d, dtype=stream.dtype))
    rows = []
    for _ in range(stream.n):
        upd, state = update(jnp.zeros(stream.d, dtype=stream.dtype), state)
        rows.append(np.asarray(upd))
    return np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_streams_by_its_recursion(cases, kind):
    stream = noise_stream(cases[kind][0], kind="gradient", d=5, seed=SEED)
    assert stream.method == METHOD[kind]
    if kind != "dense":   # rows kept independent of n: bands - 1, K + p + R, den order, buffers
        assert stream.width + stream.rank == {"bandmf": 2, "compressed": 2 + 2 + 2, "banded-toeplitz": 2, "blt": 2}[kind]
    else:
        assert stream.width == N and stream.memory_floats() == (N + 1) * 5


@pytest.mark.parametrize("noise", ["gradient", "iterate"])
@pytest.mark.parametrize("kind", KINDS)
def test_numpy_rows_equal_the_exact_operator(cases, kind, noise):
    d = 6
    stream = noise_stream(cases[kind][0], kind=noise, d=d, seed=SEED, dtype="float64")
    want = exact_operator(cases[kind], noise) @ philox_z(SEED, N, d)
    got = numpy_rows(stream)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * np.abs(want).max())


@pytest.mark.parametrize("kind", KINDS)
def test_numpy_rows_over_blocks_and_threads(cases, kind):
    """d over two blocks of 65,536: each kind's rows (Z[t] drawn into the returned row, the dense
    kind's rows into its kept rows, block by block) equal (M Z)[t], bit for bit in 1 or 2 threads."""
    d = 65536 + 5
    want = exact_operator(cases[kind], "gradient") @ philox_z(SEED, N, d, "float32").astype(np.float64)
    got = [numpy_rows(noise_stream(cases[kind][0], kind="gradient", d=d, seed=SEED, threads=threads))
           for threads in (1, 2)]
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", KINDS)
def test_torch_rows_equal_the_exact_operator(cases, kind):
    pytest.importorskip("torch")
    d = 6
    stream = noise_stream(cases[kind][0], kind="gradient", d=d, seed=SEED, dtype="float64")
    want = exact_operator(cases[kind], "gradient") @ torch_z(SEED, N, d, "float64")
    np.testing.assert_allclose(torch_rows(stream), want, rtol=0, atol=1e-10 * np.abs(want).max())


@pytest.mark.parametrize("kind", KINDS)
def test_jitted_optax_rows_equal_the_exact_operator(cases, kind):
    pytest.importorskip("optax")
    d = 6
    stream = noise_stream(cases[kind][0], kind="gradient", d=d, seed=SEED, dtype="float32")
    want = exact_operator(cases[kind], "gradient") @ jax_z(SEED, N, d, "float32").astype(np.float64)
    np.testing.assert_allclose(jax_rows(stream), want, rtol=0, atol=2e-5 * np.abs(want).max())


def _check_moments(rows: np.ndarray, m: np.ndarray) -> None:
    """rows: n x d, d independent draws of M z. Mean 0 and covariance M M^T within 5 standard
    errors of the sample size d (Var of a sample covariance entry: (S_ii S_jj + S_ij^2) / d)."""
    d = rows.shape[1]
    sigma = m @ m.T
    mean = rows.mean(axis=1)
    assert np.all(np.abs(mean) <= 5 * np.sqrt(np.diag(sigma) / d)), "sample means"
    cov = rows @ rows.T / d
    se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / d)
    assert np.all(np.abs(cov - sigma) <= 5 * se), f"covariance off by {np.max(np.abs(cov - sigma) / se):.1f} SE"


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("kind", KINDS)
def test_moments_across_steps_are_sigma2_cinv_cinvt(cases, kind, framework):
    d = 40_000
    if framework == "torch":
        pytest.importorskip("torch")
    if framework == "jax":
        pytest.importorskip("optax")
    stream = noise_stream(cases[kind][0], kind="gradient", d=d, seed=SEED + 1, dtype="float32")
    rows = {"numpy": numpy_rows, "torch": torch_rows, "jax": jax_rows}[framework](stream)
    _check_moments(rows, exact_operator(cases[kind], "gradient"))


@pytest.mark.parametrize("kind", KINDS)
def test_torch_checkpoint_resume_equals_uninterrupted(cases, kind):
    pytest.importorskip("torch")
    import torch

    from mfcli.adapters.torch import TorchStream

    stream = noise_stream(cases[kind][0], kind="gradient", d=7, seed=SEED, dtype="float64")
    ref = torch_rows(stream)
    a = TorchStream(stream, "cpu")
    for _ in range(5):
        a.next()
    ck = a.state_dict()
    assert ck["generator"] == "torch-cpu" and isinstance(ck["running"], torch.Tensor)
    b = TorchStream(noise_stream(cases[kind][0], kind="gradient", d=7, seed=SEED, dtype="float64"), "cpu")
    b.load_state_dict(ck)
    for t in range(5, N):
        assert np.array_equal(b.next().numpy(), ref[t])
    with pytest.raises(MfcliError, match="authentication tag"):
        b.load_state_dict({**ck, "t": 6})
    with pytest.raises(MfcliError, match="generator"):   # a torch checkpoint is not a numpy one
        stream.load_state_dict({**ck, "running": ck["running"].numpy()})


@pytest.mark.parametrize("kind", KINDS)
def test_optax_checkpoint_resume_equals_uninterrupted(cases, kind):
    pytest.importorskip("optax")
    import jax
    import jax.numpy as jnp

    from mfcli.adapters import optax as ad

    stream = noise_stream(cases[kind][0], kind="gradient", d=7, seed=SEED)
    ref = jax_rows(stream)
    tx = ad.correlated_noise(stream, noise_std=1.0, clip_norm=1.0)
    update = jax.jit(tx.update)
    state = tx.init(jnp.zeros(7))
    for _ in range(5):
        _, state = update(jnp.zeros(7), state)
    ck = ad.state_dict(stream, state)
    again = noise_stream(cases[kind][0], kind="gradient", d=7, seed=SEED)
    state = ad.load_state_dict(again, ck)
    fresh = jax.jit(ad.correlated_noise(again, noise_std=1.0, clip_norm=1.0).update)
    for t in range(5, N):
        upd, state = fresh(jnp.zeros(7), state)
        np.testing.assert_array_equal(np.asarray(upd, dtype=np.float64), ref[t])


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_same_seed_same_noise_other_seed_other_noise(cases, framework):
    if framework == "torch":
        pytest.importorskip("torch")
    if framework == "jax":
        pytest.importorskip("optax")
    rows = {"numpy": numpy_rows, "torch": torch_rows, "jax": jax_rows}[framework]
    path = cases["blt"][0]
    first = rows(noise_stream(path, kind="gradient", d=9, seed=SEED))
    assert np.array_equal(first, rows(noise_stream(path, kind="gradient", d=9, seed=SEED)))
    assert not np.any(first == rows(noise_stream(path, kind="gradient", d=9, seed=SEED + 1)))


def test_numpy_torch_and_jax_draw_different_z_each_its_own(cases):
    """The contract: the generators are not bit-identical to each other (docs/noise-streams.md)."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    z = [philox_z(SEED, 2, 8, "float32"), torch_z(SEED, 2, 8, "float32"), jax_z(SEED, 2, 8, "float32")]
    for i in range(3):
        for j in range(i):
            assert not np.any(z[i] == z[j])


@pytest.mark.parametrize(("coefs", "n", "dtype", "step"), [
    ([1.0, 2.0], 2000, "float64", 1020),   # (-2)^t: inf from step 1024; refused from the bound's step
    ([1.0, 2.0], 2000, "float32", 124),
    ([1e-300, 1.0], 10, "float64", 1),      # 1e300 at step 0, 1e600 at step 1
    ([1e-300, 1.0], 10, "float32", 0),
])
def test_a_stream_that_would_overflow_is_refused(tmp_path, coefs, n, dtype, step):
    from mfcli.errors import ArtifactError
    from mfcli.strategies.structured import RationalToeplitz, rational
    from mfcli.training.noise import check_finite_rows

    # such a strategy never reaches a file (its loss is not finite: the writer refuses it) ...
    with np.errstate(all="ignore"), pytest.raises(ArtifactError, match="not a finite number"):
        save_structured_artifact(tmp_path / "bad.h5", BandedToeplitz(np.array(coefs)),
                                 workload=toeplitz_workload("prefix"), n=n)
    # ... and the stream's own guard refuses its operator, from the step the bound names:
    # row t of C^-1 has absolute sum sum_k |h_k|; refused where 12 x that exceeds the dtype's max
    h = np.zeros(n)
    with np.errstate(all="ignore"):
        h[0] = 1 / coefs[0]
        for t in range(1, n):
            h[t] = -coefs[1] * h[t - 1] / coefs[0]
        sums = np.cumsum(np.abs(h))
    assert int(np.argmax(~(sums <= np.finfo(dtype).max / 12))) == step
    num, den = rational(BandedToeplitz(np.array(coefs)))
    operator = RationalToeplitz(np.asarray(num, float), np.asarray(den, float), n)
    with np.errstate(all="ignore"), pytest.raises(MfcliError, match=f"overflow to inf from step {step};"):
        check_finite_rows(operator, np.dtype(dtype), where="test")


def test_memory_is_computed_up_front_and_bounded(cases):
    path = cases["blt"][0]
    with pytest.raises(MemoryLimitError, match=r"needs about 110 TiB of memory, over the limit"):
        noise_stream(path, kind="gradient", d=10**13, seed=1)   # (2 buffers + 1 row) x 10^13 x 4 bytes = 109.1 TiB, rounded up
    with pytest.raises(MemoryLimitError, match="compress it"):   # dense: n x d rows of Z, over a small budget
        noise_stream(cases["dense"][0], kind="gradient", d=1000, seed=1, max_memory=(N + 1) * 1000 * 4 - 1)
    noise_stream(cases["dense"][0], kind="gradient", d=1000, seed=1, max_memory=(N + 1) * 1000 * 4)
    with pytest.raises(MfcliError, match="max_memory"):
        noise_stream(path, kind="gradient", d=3, seed=1, max_memory=0)


def _ops(framework: str):
    """(ArrayOps of the framework, to-array, to-numpy, tolerance): float64, but float32 for jax
    (float64 there needs the process-wide jax_enable_x64)."""
    if framework == "numpy":
        from mfcli.training.noise import NumpyOps

        return NumpyOps(np.dtype("float64")), np.array, np.asarray, 1e-13
    if framework == "torch":
        torch = pytest.importorskip("torch")
        from mfcli.adapters.torch import TorchOps

        return TorchOps(torch.device("cpu"), torch.float64), lambda a: torch.tensor(a), lambda a: a.numpy(), 1e-13
    jnp = pytest.importorskip("jax.numpy")
    from mfcli.adapters.optax import JaxOps

    return JaxOps(jnp.float32), lambda a: jnp.asarray(a, dtype=jnp.float32), np.asarray, 1e-5


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("alpha", [-1.0, 1.0, 0.5])
def test_fused_array_ops_equal_their_expressions(framework, alpha):
    """The fused steps every recursion runs (x + alpha coef @ rows; a * scale + row) against the
    plain numpy expressions; the rows read are left as they were (only x, or a, is updated)."""
    ops, arr, back, tol = _ops(framework)
    rng = np.random.default_rng(7)
    x, coef, rows, scale = rng.standard_normal(9), rng.standard_normal(3), rng.standard_normal((3, 9)), rng.standard_normal(3)
    got = back(ops.addmv(arr(x), arr(coef), rows_t := arr(rows), alpha))
    np.testing.assert_allclose(got, x + alpha * (coef @ rows), rtol=tol, atol=tol)
    np.testing.assert_allclose(back(rows_t), rows, rtol=tol, atol=0)   # read, not written
    got = back(ops.scale_add(arr(rows), arr(scale), arr(x)))
    np.testing.assert_allclose(got, rows * scale[:, None] + x[None, :], rtol=tol, atol=tol)
