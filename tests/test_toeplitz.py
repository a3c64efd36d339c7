"""Banded Toeplitz strategies (mfcli.strategies.toeplitz) against independent oracles: dense materialisation
at small n (numpy inverses, mfcli.model.factorization's loss code, mfcli.model.participation's sensitivity),
brute force over every participation pattern, finite differences, and the certified dense
optimum (a lower bound every strategy must respect)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sensitivity_oracle import brute_bounds_squared, brute_sensitivity_squared
from structured_oracles import dense_workload

from mfcli.errors import ArtifactError, MfcliError
from mfcli.model.factorization import Factorization
from mfcli.model.participation import FixedEpoch, MinSeparation, SingleParticipation, sensitivity
from mfcli.model.workloads import build_workload, prefix_workload
from mfcli.optimize.dense import optimal_factorization
from mfcli.strategies.toeplitz import (
    TOEPLITZ_PREFIX,
    BandedToeplitz,
    _objective,
    inverse_coefs,
    materialize,
    optimize_banded_toeplitz,
    rational_decoder,
    toeplitz_sensitivity,
    toeplitz_workload,
)

SCHEMAS = [SingleParticipation(), FixedEpoch(epochs=2), FixedEpoch(epochs=3), MinSeparation(separation=3),
           MinSeparation(separation=2, max_participations=3), MinSeparation(separation=5)]


@pytest.mark.parametrize("name,beta", [("prefix", 0.0), ("momentum", 0.0), ("momentum", 0.5), ("momentum", 0.95)])
def test_workload_coefs_are_the_dense_workloads_first_column(name, beta):
    n = 50
    w = toeplitz_workload(name, beta=beta)
    a = dense_workload(w, n)
    assert np.allclose(w.coefs(n), a[:, 0], rtol=1e-13, atol=0)
    assert np.allclose(materialize(w.coefs(n), n), a, rtol=1e-13, atol=0)  # and it is Toeplitz


@pytest.mark.parametrize("kwargs,match", [
    ({"name": "custom"}, "custom"),
    ({"name": "prefix", "lr": "cooldown"}, "not Toeplitz"),
    ({"name": "momentum", "lr": "step-decay"}, "not Toeplitz"),
    ({"name": "momentum", "beta": 1.0}, "beta"),
])
def test_non_toeplitz_workloads_are_refused(kwargs, match):
    with pytest.raises(MfcliError, match=match):
        toeplitz_workload(**kwargs)
    # and a schedule really is not Toeplitz
    a = build_workload("prefix", 8, lr="cooldown").matrix
    assert not np.allclose(a[1:, 1:], a[:-1, :-1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-2, 2), min_size=0, max_size=6), st.integers(1, 20))
def test_inverse_and_decoder_match_dense_inverse(tail, n):
    c = np.array([1.0, *tail])
    c_dense = materialize(c, n)
    inv = np.linalg.inv(c_dense)
    scale = max(1.0, float(np.abs(inv).max()))
    assert np.allclose(inverse_coefs(c, n), inv[:, 0], rtol=0, atol=1e-10 * scale)
    for w in (TOEPLITZ_PREFIX, toeplitz_workload("momentum", beta=0.8)):
        b = dense_workload(w, n) @ inv
        bt = BandedToeplitz(c)
        assert np.allclose(bt.decoder_coefs(w, n), b[:, 0], rtol=0, atol=1e-10 * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.describe())
@pytest.mark.parametrize("w", [TOEPLITZ_PREFIX, toeplitz_workload("momentum", beta=0.9)], ids=lambda w: w.name)
def test_loss_matches_dense_factorization(schema, w):
    n = 12
    bt = optimize_banded_toeplitz(n, 4, workload=w, schema=schema).strategy
    c = bt.dense(n)
    a = dense_workload(w, n)
    f = Factorization(workload=a, strategy=c, decoder=a @ np.linalg.inv(c))
    s = sensitivity(c, schema)
    assert s.exact
    ratio = s.value**2 / f.sensitivity**2  # Factorization's loss is at single-participation sensitivity
    loss = bt.loss(n, w, schema)
    assert loss.sensitivity == pytest.approx(s.value, rel=1e-12)
    assert loss.mean == pytest.approx(f.loss_mean * ratio, rel=1e-10)
    assert loss.max == pytest.approx(f.loss_max * ratio, rel=1e-10)
    assert loss.total == pytest.approx(f.loss_total * ratio, rel=1e-10)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.describe())
@pytest.mark.parametrize("c", [
    [1.0, 0.5, 0.375, 0.3125],         # sqrt: non-negative, non-increasing -> exact everywhere
    [1.0, 0.9, 0.2],
    [1.0, 0.2, 0.9],                   # increasing: min-sep is a bound
    [1.0, -0.7, 0.4],                  # sign changes
    [0.5, 1.0, 1.0, 0.1, 0.0, 0.3],
])
def test_sensitivity_against_brute_force(schema, c):
    n = 12
    s = toeplitz_sensitivity(np.array(c), n, schema)
    lower, upper = brute_bounds_squared(materialize(np.array(c), n), schema)
    assert s.value**2 >= upper * (1 - 1e-12)       # a valid upper bound ...
    assert s.lower**2 <= lower * (1 + 1e-12)       # ... with a witness that is really attained
    dense = sensitivity(materialize(np.array(c), n), schema)
    assert s.value >= dense.lower * (1 - 1e-12)
    if s.exact:
        assert s.value**2 == pytest.approx(lower, rel=1e-12)
    c_arr = np.array(c)
    nonneg_nonincreasing = np.all(c_arr >= 0) and np.all(np.diff(c_arr) <= 0)
    if nonneg_nonincreasing or (isinstance(schema, (SingleParticipation, FixedEpoch)) and np.all(c_arr >= 0)):
        assert s.exact


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=6), st.integers(1, 4), st.integers(4, 11))
def test_minsep_closed_form_is_exact_for_nonincreasing_coefficients(values, sep, n):
    c = np.array(sorted(values, reverse=True))
    c[0] = max(c[0], 1e-3)
    schema = MinSeparation(separation=min(sep, n))
    s = toeplitz_sensitivity(c, n, schema)
    lower = brute_sensitivity_squared(materialize(c, n), schema)
    assert s.exact
    assert s.value**2 == pytest.approx(lower, rel=1e-12, abs=1e-15)


def test_sensitivity_refuses_schema_that_does_not_fit():
    with pytest.raises(MfcliError, match="not divisible"):
        toeplitz_sensitivity(np.ones(3), 10, FixedEpoch(epochs=3))
    with pytest.raises(MfcliError, match="exceeds"):
        toeplitz_sensitivity(np.ones(3), 10, MinSeparation(separation=11))


@pytest.mark.parametrize("n,sep,k", [(3000, 7, 429), (3000, 7, 5), (1000, 1, 1000), (1000, 1, 37), (97, 10, 3),
                                      (10, 3, 4), (10, 10, 1), (50, 7, 8)])
@pytest.mark.parametrize("threshold", [None, 0], ids=["direct", "sliding-window"])
def test_window_sums_is_the_shifted_sum(n, sep, k, threshold, monkeypatch):
    """The pattern vector of the sensitivity (shifted copies added in turn, or the O(n) sliding
    window above FFT_THRESHOLD) against the definition: the sum of k copies of c shifted by
    multiples of sep, cut at n, and against the FFT form."""
    import mfcli.strategies.toeplitz as tp

    if threshold is not None:
        monkeypatch.setattr(tp, "FFT_THRESHOLD", threshold)

    rng = np.random.default_rng(n + sep + k)
    c = rng.uniform(0, 1, size=min(n, 40))
    want = np.zeros(n)
    for m in range(min(k, -(-n // sep))):
        seg = c[: max(0, n - m * sep)]
        want[m * sep: m * sep + seg.size] += seg
    np.testing.assert_allclose(tp.window_sums(c, n, sep, k), want, rtol=1e-13, atol=0)
    fft, _ = tp.pattern_vector(c, n, sep, k)
    np.testing.assert_allclose(fft, want, rtol=1e-12, atol=1e-12)


def test_sensitivity_does_not_depend_on_the_fft_threshold(monkeypatch):
    """The sensitivity never goes through the FFT (whose rounding has no proven relative bound)."""
    import mfcli.strategies.toeplitz as tp

    c = BandedToeplitz.sqrt_init(16).coefs
    direct = tp.toeplitz_sensitivity(c, 3000, MinSeparation(separation=7))
    monkeypatch.setattr(tp, "FFT_THRESHOLD", 0)
    again = tp.toeplitz_sensitivity(c, 3000, MinSeparation(separation=7))
    assert direct.exact and again.exact
    assert again.value == direct.value


@pytest.mark.parametrize("schema", SCHEMAS[:4], ids=lambda s: s.describe())
@pytest.mark.parametrize("weights", ["mean", "max"])
def test_objective_gradient_matches_finite_differences(schema, weights):
    from mfcli.strategies.toeplitz import schema_shape

    n = 24
    sep, k = schema_shape(n, schema)
    w = np.arange(n, 0, -1) / n if weights == "mean" else np.ones(n)
    x = np.array([0.6, 0.3, 0.2, 0.05])
    work = toeplitz_workload("momentum", beta=0.6)
    _f, g = _objective(x, work, n, sep, k, w)
    for j in range(x.size):
        h = 1e-6
        e = np.zeros_like(x)
        e[j] = h
        fd = (_objective(x + e, work, n, sep, k, w)[0] - _objective(x - e, work, n, sep, k, w)[0]) / (2 * h)
        assert g[j] == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("error", ["mean", "max"])
def test_full_band_optimum_is_near_and_never_below_the_certified_dense_optimum(error):
    n = 64
    a = prefix_workload(n).matrix
    res = optimal_factorization(a, tol=1e-8)
    r = optimize_banded_toeplitz(n, n, error=error)
    if error == "mean":
        # the certified dual lower-bounds every factorization's total loss (at unit sensitivity)
        assert r.loss.total >= res.dual * (1 - 1e-9)
        assert r.loss.total <= res.primal * 1.10  # measured: the Toeplitz optimum is 1.077x at n = 64
    sqrt_loss = BandedToeplitz.sqrt_init(n).loss(n, TOEPLITZ_PREFIX)
    assert getattr(r.loss, error) <= getattr(sqrt_loss, error) * (1 + 1e-12)


@pytest.mark.parametrize("schema", [MinSeparation(separation=16), FixedEpoch(epochs=4)], ids=lambda s: s.kind)
def test_optimised_multi_participation_coefficients_certify_exactly(schema):
    r = optimize_banded_toeplitz(256, 16, schema=schema)
    s = r.strategy.sensitivity(256, schema)
    assert s.exact
    c = r.strategy.coefs
    assert np.all(c >= 0) and np.all(np.diff(c) <= 0)
    # more bands never hurt: the 8-band optimum is a feasible 16-band point
    assert r.loss.mean <= optimize_banded_toeplitz(256, 8, schema=schema).loss.mean * (1 + 1e-9)


@pytest.mark.parametrize("n,bands,match", [
    (0, 1, "n must be at least 1"), (10, 11, "exceeds the number of steps"), (10, 0, "bands must be at least 1"),
    (10**8, 4, "at most"), (10, 5000, "at most"),
])
def test_optimize_refuses_bad_sizes(n, bands, match):
    with pytest.raises(MfcliError, match=match):
        optimize_banded_toeplitz(n, bands)


@pytest.mark.parametrize("params,match", [
    ({}, "exactly"), ({"coefs": np.ones(2), "x": np.ones(1)}, "exactly"), ({"coefs": np.array([0.0, 1.0])}, "non-zero"),
    ({"coefs": np.array([-1.0, 1.0])}, "positive"), ({"coefs": np.array([1.0, np.nan])}, "non-finite"),
    ({"coefs": np.ones((2, 2))}, "1-D"), ({"coefs": np.ones(5000)}, "at most"), ([1.0], "exactly"),
])
def test_from_parameters_is_strict(params, match):
    with pytest.raises(ArtifactError, match=match):
        BandedToeplitz.from_parameters(params)


def test_parameters_round_trip():
    bt = BandedToeplitz(np.array([1.0, 0.4, 0.1]))
    again = BandedToeplitz.from_parameters(bt.parameters())
    assert np.array_equal(again.coefs, bt.coefs) and again.kind == "banded-toeplitz"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gradient_stream_matches_dense_noising_and_resumes_bit_identically(dtype):
    """The one noise stream on a banded Toeplitz C in memory (noise.strategy_stream) is C^-1 Z
    (a dense solve here, Z the stream's own rows) and resumes bit-identically from a checkpoint."""
    from mfcli.training.noise import noise_matrix, strategy_stream

    n, d = 40, 7
    bt = BandedToeplitz(np.array([1.3, 0.6, 0.3, 0.1]))
    z = noise_matrix(5, n, d, dtype).astype(np.float64)
    expected = np.linalg.solve(bt.dense(n), z)
    stream = strategy_stream(bt, n=n, seed=5, d=d, dtype=dtype)
    state, rows = stream.init(), []
    for _ in range(n):
        row, state = stream.next(state)
        rows.append(row)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert np.allclose(np.array(rows), expected, rtol=0, atol=tol * np.abs(expected).max())
    state = stream.init()
    for _ in range(15):
        _, state = stream.next(state)
    resumed = strategy_stream(bt, n=n, seed=5, d=d, dtype=dtype)
    state = resumed.load_state_dict(stream.state_dict(state))
    for t in range(15, n):
        row, state = resumed.next(state)
        assert np.array_equal(row, rows[t])


def test_momentum_optimum_beats_sqrt_start_and_the_identity():
    n, w = 512, toeplitz_workload("momentum", beta=0.9)
    r = optimize_banded_toeplitz(n, 32, workload=w)
    assert r.loss.mean < BandedToeplitz.sqrt_init(32).loss(n, w).mean
    assert r.loss.mean < BandedToeplitz(np.array([1.0])).loss(n, w).mean
    assert math.isfinite(r.loss.max)


def test_jax_privacy_banded_toeplitz_is_never_better():
    jp = pytest.importorskip("jax_privacy.matrix_factorization.toeplitz")
    for n, bands in [(256, 8), (512, 32)]:
        theirs = BandedToeplitz(np.asarray(jp.optimize_banded_toeplitz(n, bands), dtype=np.float64))
        ours = optimize_banded_toeplitz(n, bands)
        assert ours.loss.mean <= theirs.loss(n, TOEPLITZ_PREFIX).mean * (1 + 1e-9)


@pytest.mark.parametrize("bands,n", [(1, 1), (3, 2), (8, 5), (8, 8), (40, 7), (16, 300), (64, 1000)])
@pytest.mark.parametrize("workload", [TOEPLITZ_PREFIX, toeplitz_workload("momentum", beta=0.9)])
def test_decoder_is_the_rational_forms_impulse_response_bit_for_bit(bands, n, workload):
    """B's first column of a banded C, the structured mechanism's route (c truncated to n steps),
    against the impulse response of the rational form A(z) / c(z) with every band kept; C is not
    truncated there, so bands beyond n must not change a bit. The dense product A C^-1 checks the
    values."""
    rng = np.random.default_rng(bands * 1000 + n)
    c = np.concatenate([[rng.uniform(0.5, 2.0)], 0.3 * rng.normal(size=bands - 1)])
    bt = BandedToeplitz(c)
    got = bt.workload_decoder(workload, n)
    assert np.array_equal(got, rational_decoder(*bt.rational(), workload, n))
    if n <= 300:
        dense = dense_workload(workload, n) @ np.linalg.inv(bt.dense(n))
        assert np.allclose(got, dense[:, 0], rtol=1e-9, atol=1e-9 * np.abs(dense).max())
