"""Bridges to jax_privacy (mfcli.adapters.jax_privacy).

Import tests that need no jax_privacy run everywhere; their oracles are closed forms (the square
root of the prefix-sum matrix, C = S^1/2 = B) and brute-force column norms, and the imported
artifact goes through ``inspect``, ``compare`` and ``account`` end to end (epsilon against
dp-accounting's Gaussian mechanism at sigma / sens). Tests that build jax_privacy objects or
streams import it (``pytest.importorskip``); their oracles are jax_privacy's own materialisations
and sensitivity formulas, the noise mfcli's stream regenerates from Philox, and the dense
triangular solve C^-1 = solve(C, I).
"""
from __future__ import annotations

import json
import sys
from math import comb
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
from typer.testing import CliRunner

from mfcli.adapters import jax_privacy as bridge
from mfcli.cli.app import app
from mfcli.errors import MfcliError, NoiseStreamExhaustedError
from mfcli.io.artifact import load_artifact
from mfcli.model.workloads import build_workload

from noise_oracles import philox_z, save_truncated_svd_compression

runner = CliRunner()
N = 16


def sqrt_coefs(n: int) -> np.ndarray:
    """binom(2k, k) / 4^k: the Toeplitz coefficients of S^1/2 (S the prefix-sum matrix)."""
    return np.array([comb(2 * k, k) / 4.0**k for k in range(n)])


def column_norm_max(c: np.ndarray) -> float:
    return max(float(np.sqrt(sum(c[i, j] ** 2 for i in range(c.shape[0])))) for j in range(c.shape[1]))


# --------------------------------------------------------------------------------------------
# Import (no jax_privacy needed)


def test_toeplitz_coefficients_import_as_the_square_root_of_prefix_sums(tmp_path: Path) -> None:
    w = build_workload("prefix", N)
    strat = bridge.import_strategy(sqrt_coefs(N), w)
    fact = strat.factorization
    s = np.tril(np.ones((N, N)))
    np.testing.assert_allclose(fact.strategy @ fact.strategy, s, atol=1e-12)   # C^2 = S
    np.testing.assert_allclose(fact.decoder, fact.strategy, atol=1e-10)        # B = S C^-1 = C
    assert fact.sensitivity == pytest.approx(np.sqrt(np.sum(sqrt_coefs(N) ** 2)), rel=1e-14)
    assert strat.name == "jax_privacy-toeplitz"


def _imported_dense(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(5)
    c = np.tril(rng.uniform(-0.3, 0.3, (N, N)), -1) + np.diag(rng.uniform(0.8, 1.5, N))
    path = tmp_path / "imported.h5"
    bridge.save_imported_strategy(path, c, build_workload("prefix", N))
    return path, c


def test_dense_import_is_a_verified_uncertified_artifact(tmp_path: Path) -> None:
    path, c = _imported_dense(tmp_path)
    art = load_artifact(path)
    np.testing.assert_array_equal(art.factorization.strategy, c)
    assert art.factorization.sensitivity == pytest.approx(column_norm_max(c), rel=1e-14)
    b = art.factorization.decoder
    np.testing.assert_allclose(b @ c, np.tril(np.ones((N, N))), atol=1e-12)
    assert art.attrs["solver"] == {"method": "imported", "certified": False,
                                   "source": "jax_privacy dense strategy (numpy.ndarray)"}
    assert art.groups["imported"]["attrs"]["certified"] is False or art.groups["imported"]["attrs"]["certified"] == 0
    assert art.strategy_name == "jax_privacy-dense"


def test_imported_artifact_works_with_inspect_compare_and_account(tmp_path: Path) -> None:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    path, c = _imported_dense(tmp_path)
    res = runner.invoke(app, ["inspect", str(path), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["problems"] == []
    assert rep["solver"]["method"] == "imported" and rep["solver"]["certified"] is False

    res = runner.invoke(app, ["compare", "--workload", "prefix", "--n", str(N), "--artifact", str(path),
                              "--strategies", "identity", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["strategies"]}
    row = next(r for name, r in rows.items() if name.startswith("jax_privacy-dense"))
    b = np.tril(np.ones((N, N))) @ np.linalg.inv(c)
    assert row["sensitivity"] == pytest.approx(column_norm_max(c), rel=1e-12)
    assert row["loss_total"] == pytest.approx(column_norm_max(c) ** 2 * float(np.sum(b * b)), rel=1e-10)

    sigma, delta = 3.0, 1e-6
    res = runner.invoke(app, ["account", str(path), "--sigma", str(sigma), "--delta", str(delta), "--json", "-q"])
    assert res.exit_code == 0, res.output
    eps = json.loads(res.stdout)["settings"]["single-pass"]["epsilon"]
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
    acc.compose(dp_event.GaussianDpEvent(sigma / column_norm_max(c)))
    assert eps == pytest.approx(acc.get_epsilon(delta), rel=2e-3)
    assert eps >= acc.get_epsilon(delta) * (1 - 1e-9) - 1e-4


@pytest.mark.parametrize(
    "strategy, message",
    [
        (np.triu(np.ones((N, N))), "not lower-triangular"),
        (np.tril(np.ones((N, N))) - np.eye(N), "zero on its diagonal"),
        (np.eye(N + 1), "needs 16 x 16"),
        (np.ones(N + 1), "17 Toeplitz coefficients for n = 16"),
        (np.array([]), "empty"),
        (np.full((N, N), np.nan), "NaN or inf"),
        (np.ones((2, 2, 2)), "3 dimensions"),
        (np.diag(np.r_[np.ones(N - 2), 1e-200, 1e-200]) + np.diag(np.ones(N - 1), -1), "numerically singular"),
    ],
    ids=["upper", "zero-diagonal", "shape", "too-many-coefs", "empty", "nan", "3d", "singular"],
)
def test_bad_strategies_are_refused(strategy: np.ndarray, message: str) -> None:
    with pytest.raises(MfcliError, match=message):
        bridge.import_strategy(strategy, build_workload("prefix", N))


def test_workload_must_be_an_mfcli_workload() -> None:
    with pytest.raises(TypeError, match="Workload"):
        bridge.import_strategy(np.eye(N), np.tril(np.ones((N, N))))


def test_missing_jax_privacy_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in ("jax_privacy", "jax_privacy.matrix_factorization", "jax_privacy.matrix_factorization.streaming_matrix",
                "jax_privacy.noise_addition"):
        monkeypatch.setitem(sys.modules, mod, None)
    for call in (lambda: bridge.streaming_matrix("unused.h5"),
                 lambda: bridge.dense_privatizer("unused.h5", stddev=1.0, prng_key=0)):
        with pytest.raises(MfcliError) as info:
            call()
        msg = str(info.value)
        assert "\n" not in msg and "jax_privacy, which is not installed" in msg and "mfcli[jax]" in msg


# --------------------------------------------------------------------------------------------
# With jax_privacy


@pytest.fixture(scope="module")
def jp():
    pytest.importorskip("jax_privacy")
    import jax

    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, jp):
    return save_truncated_svd_compression(tmp_path_factory.mktemp("jp") / "momentum.h5", n=12, beta=0.9, band=2, rank=2)


@pytest.mark.parametrize("variant", ["dense", "compressed"])
@pytest.mark.parametrize("kind", ["gradient", "iterate"])
@pytest.mark.parametrize("jit", [False, True])
def test_export_streams_the_same_noise_as_mfcli(artifact, variant, kind, jit) -> None:
    import jax
    import jax.numpy as jnp

    from mfcli.training.noise import noise_stream

    path, a, fact, b_hat = artifact
    n, d = 12, 5
    sm = bridge.streaming_matrix(path, kind=kind, variant=variant)
    z = philox_z(41, n, d)
    # Oracle 1: the dense operator by triangular solves (C^-1 = A^-1 B, or B itself).
    decoder = fact.decoder if variant == "dense" else b_hat
    op = scipy.linalg.solve_triangular(a, decoder, lower=True) if kind == "gradient" else decoder
    # Oracle 2: mfcli's own stream on the same Philox Z.
    stream = noise_stream(path, kind=kind, d=d, seed=41, variant=variant, dtype="float64")
    state, rows = stream.init(), []
    for _ in range(n):
        row, state = stream.next(state)
        rows.append(np.array(row))
    multiply = jax.jit(lambda x: sm @ x) if jit else (lambda x: sm @ x)
    got = np.asarray(multiply(jnp.asarray(z)))
    np.testing.assert_allclose(got, np.stack(rows), rtol=0, atol=1e-12 * np.max(np.abs(got)))
    np.testing.assert_allclose(got, op @ z, rtol=0, atol=1e-12 * np.max(np.abs(got)))
    np.testing.assert_allclose(np.asarray(sm.materialize(n)), op, rtol=0, atol=1e-12 * np.max(np.abs(op)))


def test_export_refuses_step_n_where_jax_privacy_reuses_the_last_row(artifact) -> None:
    import jax
    import jax.numpy as jnp
    from jax_privacy import noise_addition

    from mfcli.adapters.optax import checked

    path, _a, fact, _ = artifact
    n = 12
    c_inv = scipy.linalg.solve_triangular(fact.strategy, np.eye(n), lower=True)
    zero = jnp.zeros(3)
    # jax_privacy 2.0.0's dense privatizer: past n the index is clamped and row n-1 comes back.
    plain = noise_addition.matrix_factorization_privatizer(c_inv, stddev=1.0, prng_key=jax.random.key(0))
    state, outs = plain.init(zero), []
    for _ in range(n + 2):
        g, state = jax.jit(plain.update)(zero, state)
        outs.append(np.asarray(g))
    np.testing.assert_array_equal(outs[n], outs[n - 1])
    np.testing.assert_array_equal(outs[n + 1], outs[n - 1])
    # mfcli's guarded privatizer: the same noise for t < n, then a refusal.
    guarded = bridge.dense_privatizer(path, stddev=1.0, prng_key=jax.random.key(0), variant="dense")
    step = checked(jax.jit(guarded.update))
    state = guarded.init(zero)
    for t in range(n):
        g, state = step(zero, state)
        np.testing.assert_array_equal(np.asarray(g), outs[t])
    with pytest.raises(NoiseStreamExhaustedError, match="step 12 >= n = 12"):
        step(zero, state)
    with pytest.raises(NoiseStreamExhaustedError, match="step 12 >= n = 12"):
        guarded.update(zero, state)
    with pytest.raises(Exception, match="exhausted"):   # unwrapped jit: JAX's runtime error carries it
        jax.block_until_ready(jax.jit(guarded.update)(zero, state))
    # The streaming export inside jax_privacy's streaming privatizer, eager and jitted.
    for variant in ("dense", "compressed"):
        priv = noise_addition.matrix_factorization_privatizer(
            bridge.streaming_matrix(path, variant=variant), stddev=1.0, prng_key=jax.random.key(1))
        for update in (priv.update, checked(jax.jit(priv.update))):
            state = priv.init(zero)
            for _ in range(n):
                _, state = update(zero, state)
            with pytest.raises(NoiseStreamExhaustedError, match="exhausted"):
                update(zero, state)


def test_privatizer_with_export_adds_c_inverse_of_its_own_noise(artifact) -> None:
    """jax_privacy draws Z; the exported C^-1 correlates it: the noise equals C^-1 Z with Z the
    rows jax_privacy's isotropic privatizer draws from the same key."""
    import jax
    import jax.numpy as jnp
    from jax_privacy import noise_addition

    path, _a, fact, _ = artifact
    n = 12
    params = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(3)}
    corr = noise_addition.matrix_factorization_privatizer(
        bridge.streaming_matrix(path, variant="dense"), stddev=2.0, prng_key=jax.random.key(3))
    iid = noise_addition.gaussian_privatizer(stddev=2.0, prng_key=jax.random.key(3))
    sc, si, got, zs = corr.init(params), iid.init(params), [], []
    for _ in range(n):
        g, sc = jax.jit(corr.update)(params, sc)
        z, si = jax.jit(iid.update)(params, si)
        got.append(np.concatenate([np.ravel(g["b"]), np.ravel(g["w"])]))
        zs.append(np.concatenate([np.ravel(z["b"]), np.ravel(z["w"])]))
    c_inv = scipy.linalg.solve_triangular(fact.strategy, np.eye(n), lower=True)
    want = c_inv @ np.stack(zs)
    np.testing.assert_allclose(np.stack(got), want, rtol=0, atol=1e-12 * np.max(np.abs(want)))


def _jp_strategies(n: int):
    import jax.numpy as jnp
    from jax_privacy.matrix_factorization import banded, buffered_toeplitz, toeplitz

    blt = buffered_toeplitz.BufferedToeplitz.build(buf_decay=[0.9, 0.5], output_scale=[-0.3, -0.1])
    band = banded.ColumnNormalizedBanded.default(n, 4)
    band = banded.ColumnNormalizedBanded(params=band.params * (1 + 0.1 * jnp.arange(n))[:, None])
    coefs = toeplitz.optimal_max_error_strategy_coefs(n)[:5]
    return {
        "blt": (blt, blt.materialize(n), buffered_toeplitz.sensitivity_squared(blt, n)),
        "banded": (band, band.materialize(), 1.0),
        "toeplitz": (coefs, toeplitz.materialize_lower_triangular(coefs, n), toeplitz.sensitivity_squared(coefs, n)),
    }


@pytest.mark.parametrize("kind", ["blt", "banded", "toeplitz"])
def test_jax_privacy_strategies_import_exactly(jp, tmp_path: Path, kind: str) -> None:
    from jax_privacy.matrix_factorization import dense, sensitivity

    strategy, c_jp, sens_sq = _jp_strategies(N)[kind]
    w = build_workload("prefix", N)
    path = tmp_path / f"{kind}.h5"
    bridge.save_imported_strategy(path, strategy, w)
    art = load_artifact(path)
    fact = art.factorization
    np.testing.assert_allclose(fact.strategy, np.asarray(c_jp), rtol=0, atol=1e-13)
    assert fact.sensitivity == pytest.approx(float(np.sqrt(sens_sq)), rel=1e-12)
    assert fact.sensitivity == pytest.approx(float(sensitivity.single_participation_sensitivity(c_jp)), rel=1e-12)
    per_query = np.asarray(dense.per_query_error(strategy_matrix=c_jp, workload_matrix=np.asarray(w.matrix)))
    np.testing.assert_allclose(fact.per_step_error, fact.sensitivity**2 * per_query, rtol=1e-10)
    assert art.strategy_name == f"jax_privacy-{kind}"
    assert art.groups["imported"]["attrs"]["jax_privacy_version"] == bridge.JAX_PRIVACY_VERSION


def test_blt_round_trip_export_matches_jax_privacys_inverse(jp, tmp_path: Path) -> None:
    """Import a BLT, export the artifact's C^-1: it is jax_privacy's own inverse BLT."""
    blt = _jp_strategies(N)["blt"][0]
    path = tmp_path / "blt.h5"
    bridge.save_imported_strategy(path, blt, build_workload("prefix", N))
    mine = np.asarray(bridge.streaming_matrix(path).materialize(N))
    theirs = np.asarray(blt.inverse_as_streaming_matrix().materialize(N))
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-10)


def test_unknown_jax_privacy_object_is_refused(jp) -> None:
    from jax_privacy.matrix_factorization import streaming_matrix

    with pytest.raises(MfcliError, match="cannot import a StreamingMatrix"):
        bridge.import_strategy(streaming_matrix.prefix_sum(), build_workload("prefix", N))


@pytest.mark.parametrize("variant", ["dense", "compressed"])
def test_exporters_stop_at_n_without_jax_privacy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    """The exporters need only jax: they refuse step n, and with the check removed (as if the
    error were swallowed) step n yields NaN, never a reused row."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from mfcli.strategies.operators import select_operator

    path, *_ = save_truncated_svd_compression(tmp_path / "m.h5", n=6, beta=0.9, band=2, rank=2)
    matrix = select_operator(load_artifact(path), variant).streaming("gradient").matrix
    init, step = bridge._EXPORTERS[type(matrix)](matrix)
    zero = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
    state = init(zero)
    for _ in range(6):
        out, state = step(zero, state)
        assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(out))
    with pytest.raises(NoiseStreamExhaustedError, match="step 6 >= n = 6"):
        step(zero, state)
    with pytest.raises(Exception, match="exhausted"):   # JaxRuntimeError or ValueError, by where JAX notices it
        jax.block_until_ready(jax.jit(step)(zero, state))
    monkeypatch.setattr(bridge, "_guard", lambda t, n: t)
    out, _ = step(zero, state)
    assert all(bool(jnp.all(jnp.isnan(v))) for v in jax.tree.leaves(out))


# --------------------------------------------------------------------------------------------
# Every artifact kind out to jax_privacy's own types and back


def _structured(tmp: Path, kind: str) -> tuple[Path, np.ndarray]:
    """A structured artifact at n = N and its C, written out entry by entry from the parameters
    (C[t, j] = c_{t-j}: the coefficients themselves, or 1 then sum_i omega_i theta_i^(k-1))."""
    from mfcli.io.artifact import save_structured_artifact
    from mfcli.strategies.blt import BufferedToeplitz
    from mfcli.strategies.toeplitz import BandedToeplitz, toeplitz_workload

    if kind == "banded-toeplitz":
        coefs = np.array([1.0, 0.5, 0.25, 0.1])
        strategy: object = BandedToeplitz(coefs)
        col = np.concatenate([coefs, np.zeros(N - coefs.size)])
    else:
        theta, omega = np.array([0.9, 0.4]), np.array([0.3, 0.1])
        strategy = BufferedToeplitz(theta=theta, omega=omega)
        col = np.array([1.0] + [sum(w * th ** (k - 1) for th, w in zip(theta, omega, strict=True))
                                for k in range(1, N)])
    c = np.array([[col[t - j] if t >= j else 0.0 for j in range(N)] for t in range(N)])
    path = tmp / f"{kind}.h5"
    save_structured_artifact(path, strategy, workload=toeplitz_workload("prefix"), n=N)
    return path, c


@pytest.mark.parametrize("kind", ["banded-toeplitz", "blt", "dense", "compressed"])
def test_every_artifact_kind_exports_natively_and_imports_back(jp, tmp_path: Path, kind: str) -> None:
    """banded Toeplitz -> its coefficients, BLT -> jax_privacy's BufferedToeplitz, anything else
    -> the dense C; jax_privacy's own materialisation of the export is C, the exported C^-1 stream
    is C^-1 (so the noise covariance C^-1 C^-T is the operator's), and importing the export back
    gives the same C."""
    import jax
    import jax.numpy as jnp
    from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz

    from mfcli.io.artifact import load_any_artifact

    if kind in ("banded-toeplitz", "blt"):
        path, c = _structured(tmp_path, kind)
        n, sources = N, [path, load_any_artifact(path)]   # a path or the loaded artifact
    else:
        path, _a, fact, b_hat = save_truncated_svd_compression(tmp_path / "m.h5", n=12, beta=0.9, band=2, rank=2)
        n, sources = 12, [path, load_artifact(path)]
        # C = B^-1 A of the operator that runs (A the workload of the artifact: momentum)
        c = fact.strategy if kind == "dense" else scipy.linalg.solve_triangular(b_hat, _a, lower=True)
    variant = kind if kind in ("dense", "compressed") else "auto"   # auto picks the compressed one when present
    for source in sources:
        native = bridge.native_strategy(source, variant=variant)
        if kind == "banded-toeplitz":
            assert isinstance(native, np.ndarray) and native.ndim == 1
            theirs = toeplitz.materialize_lower_triangular(jnp.asarray(native), n)
        elif kind == "blt":
            assert isinstance(native, buffered_toeplitz.BufferedToeplitz)
            theirs = native.materialize(n)
        else:
            assert isinstance(native, np.ndarray) and native.shape == (n, n)
            theirs = native
        np.testing.assert_allclose(np.asarray(theirs), c, rtol=0, atol=1e-12)
        sm = bridge.streaming_matrix(source, variant=variant)
        c_inv = scipy.linalg.solve_triangular(c, np.eye(n), lower=True)
        got = np.asarray(jax.jit(lambda x, sm=sm: sm @ x)(jnp.eye(n)))
        np.testing.assert_allclose(got, c_inv, rtol=0, atol=1e-10)
        np.testing.assert_allclose(got @ got.T, c_inv @ c_inv.T, rtol=0, atol=1e-9)
    w = build_workload("prefix", n)
    back = bridge.import_strategy(native, w)
    np.testing.assert_allclose(back.factorization.strategy, c, rtol=0, atol=1e-12)
    bridge.save_imported_strategy(tmp_path / "back.h5", native, w)
    np.testing.assert_allclose(load_artifact(tmp_path / "back.h5").factorization.strategy, c, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["banded-toeplitz", "blt"])
def test_native_exports_stop_at_n(jp, tmp_path: Path, kind: str) -> None:
    """jax_privacy's Toeplitz and BLT matrices never end; the export refuses step n (eagerly and
    under jit through checked) and the swallowed-error row is NaN."""
    import jax
    import jax.numpy as jnp

    from mfcli.adapters.optax import checked

    path, _ = _structured(tmp_path, kind)
    sm = bridge.streaming_matrix(path)
    x = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
    for step in (sm.multiply_next, checked(jax.jit(sm.multiply_next))):
        state = sm.init_multiply(x)
        for _ in range(N):
            out, state = step(x, state)
            assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(out))
        with pytest.raises(NoiseStreamExhaustedError, match=f"step {N} >= n = {N}"):
            step(x, state)
