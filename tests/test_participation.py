"""Participation schemas and their sensitivity, against brute force over every pattern and every
sign vector (n <= 10), an independent per-pattern semidefinite oracle over unit vectors (n <= 8),
closed forms, and explicit vector-valued adjacent pairs (each result's witness, checked from C)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sensitivity_oracle import brute_sensitivity_squared, brute_vector_bounds_squared, schema_patterns

import mfcli
import mfcli.model.participation as part
from mfcli.errors import MfcliError
from mfcli.model.participation import (
    FixedEpoch,
    MinSeparation,
    SingleParticipation,
    participation_from_json,
    sensitivity,
)

UNIT_C = np.array([[1, 0, 0, 0], [2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, -6]], dtype=float)


@st.composite
def cases(draw: st.DrawFn, *, nonnegative: bool = False) -> tuple[np.ndarray, part.Participation]:
    n = draw(st.integers(1, 10))
    lower = draw(st.booleans())
    values = st.integers(0 if nonnegative else -4, 4)
    c = np.array(draw(st.lists(values, min_size=n * n, max_size=n * n)), dtype=float).reshape(n, n)
    c += np.eye(n) * 0.5  # full rank is not needed, but keeps some column non-zero
    if lower:
        c = np.tril(c)
    kind = draw(st.sampled_from(["single", "fixed", "minsep"]))
    if kind == "single":
        return c, SingleParticipation()
    if kind == "fixed":
        return c, FixedEpoch(epochs=draw(st.sampled_from([k for k in range(1, n + 1) if n % k == 0])))
    return c, MinSeparation(separation=draw(st.integers(1, n)), max_participations=draw(st.none() | st.integers(1, n)))


def check_witness(c: np.ndarray, schema: part.Participation, res: part.Sensitivity) -> None:
    """``lower`` is the value of an actual pair of adjacent inputs: the witness's rows are unit
    vectors on a pattern of the schema, and ||C[:, P] G||_F^2 (from C, not from C^T C) reaches
    lower^2."""
    w = res.witness
    assert w is not None
    n = c.shape[1]
    if n <= 10:
        assert w.pattern in set(schema_patterns(n, schema))
    else:  # too many patterns to list: the definition, checked on the one pattern
        assert isinstance(schema, MinSeparation) and 1 <= len(w.pattern) <= schema.participations(n)
        assert all(q - r >= schema.separation for r, q in zip(w.pattern, w.pattern[1:], strict=False))
        assert 0 <= w.pattern[0] and w.pattern[-1] < n
    assert w.gradients.shape[0] == len(w.pattern)
    assert w.gradients.shape[1] <= math.isqrt(2 * len(w.pattern)) + 2  # the dimension docs and docstrings state
    assert np.allclose(np.linalg.norm(w.gradients, axis=1), 1.0, rtol=0, atol=1e-12)
    attained = float(np.sum((c[:, list(w.pattern)] @ w.gradients) ** 2))
    assert res.lower**2 <= attained * (1 + 1e-12) + 1e-300


def check_against_brute_force(c: np.ndarray, schema: part.Participation) -> part.Sensitivity:
    """Signs (d = 1, every n <= 10) bound the sensitivity from below; for n <= 8 the oracle's
    explicit vector pairs (attained) and dual certificates (certified) bracket it."""
    signs = brute_sensitivity_squared(c, schema)
    res = sensitivity(c, schema)
    tol = 1e-9 * max(1.0, signs)
    assert res.schema == schema
    assert res.lower <= res.value
    assert res.value**2 >= signs - tol  # never below the truth
    check_witness(c, schema, res)
    if c.shape[1] <= 8:
        attained, certified = brute_vector_bounds_squared(c, schema, restarts=2, sweeps=1000)
        assert res.value**2 >= attained - tol
        assert res.lower**2 <= certified + tol
    if res.exact:
        assert abs(res.value - res.lower) <= 1e-9 * max(1.0, res.value)
    return res


@given(cases())
def test_sensitivity_brackets_brute_force_over_patterns_and_signs(case: tuple[np.ndarray, part.Participation]) -> None:
    check_against_brute_force(*case)


@given(cases())
def test_row_dynamic_program_bound_brackets_brute_force(case: tuple[np.ndarray, part.Participation]) -> None:
    c, schema = case
    with pytest.MonkeyPatch.context() as m:  # no enumeration: the O(n^2 k) bound that runs for large n
        m.setattr(part, "ENUMERATION_LIMIT", 0)
        bound = check_against_brute_force(c, schema)
    if isinstance(schema, MinSeparation):  # the enumerated bound is the tighter of the two
        assert sensitivity(c, schema).value <= bound.value * (1 + 1e-12)


@given(cases(nonnegative=True))
def test_nonnegative_strategies_are_exact(case: tuple[np.ndarray, part.Participation]) -> None:
    """C >= 0 gives C^T C >= 0: all-plus signs attain the bound under every schema (min-sep by
    enumeration, which covers every n <= 10)."""
    res = check_against_brute_force(*case)
    assert res.exact


@given(st.integers(1, 10), st.integers(1, 4), st.data())
def test_banded_strategies_are_exact_under_min_separation(n: int, bands: int, data: st.DataObject) -> None:
    """C lower-triangular with at most b bands: columns b apart have disjoint supports."""
    b = data.draw(st.integers(bands, max(bands, n)))
    if b > n:
        return
    rows = data.draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=n * n, max_size=n * n))
    c = np.tril(np.array(rows).reshape(n, n)) - np.tril(np.array(rows).reshape(n, n), -bands)
    schema = MinSeparation(separation=b, max_participations=data.draw(st.none() | st.integers(1, n)))
    res = check_against_brute_force(c, schema)
    assert res.exact and "zero beyond the band" in res.method


@given(st.integers(1, 10), st.data())
def test_no_bound_is_below_an_explicit_vector_valued_pair(n: int, data: st.DataObject) -> None:
    """Gradients have d coordinates: random unit rows in R^3 on any pattern stay within the bound."""
    c = np.array(data.draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=n * n, max_size=n * n))).reshape(n, n)
    schema = data.draw(st.sampled_from([SingleParticipation(), MinSeparation(separation=1),
                                        FixedEpoch(epochs=max(k for k in (1, 2, n) if n % k == 0))]))
    res = sensitivity(c, schema)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for p in schema_patterns(n, schema)[:50]:
        g = np.zeros((n, 3))
        g[list(p)] = rng.standard_normal((len(p), 3))
        g[list(p)] /= np.linalg.norm(g[list(p)], axis=1, keepdims=True)
        assert np.sum((c @ g) ** 2) <= res.value**2 * (1 + 1e-12) + 1e-12


def test_sign_vectors_are_not_the_sensitivity_of_vector_gradients() -> None:
    """X = C^T C with X_ii = 1 and X_il = -1/2: every sign vector gives 4, three unit vectors at
    120 degrees give 4.5, and that is the maximum (y = (3/2, 3/2, 3/2) is dual feasible:
    Diag(y) - X = (1/2) 1 1^T is PSD, sum(y) = 4.5). sum |X| = 6 is only a bound."""
    x = np.array([[1, -0.5, -0.5], [-0.5, 1, -0.5], [-0.5, -0.5, 1]])
    w, v = np.linalg.eigh(x)
    c = (v * np.sqrt(np.clip(w, 0, None))).T
    assert np.allclose(c.T @ c, x)
    assert brute_sensitivity_squared(c, FixedEpoch(epochs=3)) == pytest.approx(4.0)
    assert np.all(np.linalg.eigvalsh(np.diag([1.5, 1.5, 1.5]) - x) >= -1e-15)
    angles = 2 * np.pi * np.arange(3) / 3
    g = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # three unit vectors in R^2
    assert np.sum((c @ g) ** 2) == pytest.approx(4.5)
    for schema in (FixedEpoch(epochs=3), MinSeparation(separation=1)):
        res = sensitivity(c, schema)
        assert res.exact and "semidefinite" in res.method
        assert res.value**2 == pytest.approx(4.5, rel=1e-10) and res.value**2 >= 4.5 * (1 - 1e-14)
        assert res.lower**2 == pytest.approx(4.5, rel=1e-10) and res.lower**2 <= 4.5 * (1 + 1e-14)
        check_witness(c, schema, res)
        assert res.witness is not None
        gram = res.witness.gradients @ res.witness.gradients.T  # the three vectors are 120 degrees apart
        assert np.allclose(gram[~np.eye(3, dtype=bool)], -0.5, atol=1e-5)


def _negative_c(n: int, seed: int) -> np.ndarray:
    """A random lower-triangular C with negative entries, max column norm 1."""
    rng = np.random.default_rng(seed)
    c = np.tril(rng.normal(size=(n, n)))
    c[np.diag_indices(n)] = np.abs(c[np.diag_indices(n)]) + 1.0
    return c / np.linalg.norm(c, axis=0).max()


NEGATIVE_CASES = [(n, seed, schema) for n, seed in ((4, 0), (6, 1), (6, 3), (8, 2), (8, 4))
                  for schema in (MinSeparation(separation=1), MinSeparation(separation=2),
                                 MinSeparation(separation=1, max_participations=3), FixedEpoch(epochs=n // 2))]


@pytest.mark.parametrize(("n", "seed", "schema"), NEGATIVE_CASES)
def test_negative_strategies_bracket_is_the_semidefinite_truth(n: int, seed: int, schema: part.Participation) -> None:
    """C with negative entries, where signs fall short: the oracle's explicit vector pairs and dual
    certificates meet (to 1e-9), and the result's bracket holds that truth to 1e-9 at both ends."""
    c = _negative_c(n, seed)
    attained, certified = brute_vector_bounds_squared(c, schema)
    assert certified - attained <= 1e-9 * attained  # the oracle converged: the truth is known
    res = check_against_brute_force(c, schema)
    assert res.value**2 >= attained * (1 - 1e-12)
    assert res.value**2 <= certified * (1 + 1e-9)
    assert res.lower**2 >= attained * (1 - 1e-9)


def test_vectors_close_a_bracket_that_signs_left_open() -> None:
    """The audit's finding: with signs the bracket was [2.780, 3.196] (best sign vector, sum |X|),
    the truth is 2.8728 (oracle); now the bracket is the truth."""
    c = _negative_c(8, 2)
    schema = MinSeparation(separation=1)
    attained, certified = brute_vector_bounds_squared(c, schema)
    signs = brute_sensitivity_squared(c, schema)
    assert math.sqrt(signs) < 2.781 and math.sqrt(attained) > 2.8727
    res = sensitivity(c, schema)
    assert res.exact and res.lower**2 >= attained * (1 - 1e-10) and res.value**2 <= certified * (1 + 1e-10)


@given(cases(), st.sampled_from([(0, 0, 1), (1, 1, 1), (2, 5, 2), (40, 3000, 4096)]))
def test_bounds_hold_whatever_the_ascent_reached(case: tuple[np.ndarray, part.Participation],
                                                 budget: tuple[int, int, int]) -> None:
    """The dual certificates are bounds for any vectors, converged or not, and patterns left out
    keep a valid bound: starving the ascent or the number of certified patterns loosens the
    bracket, never breaks it."""
    rough, full, limit = budget
    with pytest.MonkeyPatch.context() as m:
        m.setattr(part, "ROUGH_ITERATIONS", rough)
        m.setattr(part, "ASCENT_ITERATIONS", full)
        m.setattr(part, "CERTIFY_LIMIT", limit)
        check_against_brute_force(*case)


@pytest.mark.parametrize(("schema", "expected"), [
    (SingleParticipation(), 6.0),
    (MinSeparation(separation=2), math.sqrt(41)),
    (MinSeparation(separation=3), math.sqrt(41)),
    (MinSeparation(separation=2, max_participations=1), 6.0),
    (MinSeparation(separation=4), 6.0),
])
def test_public_unit_case(schema: part.Participation, expected: float) -> None:
    """jax_privacy's sensitivity_test.py case; sqrt(41) = ||(1, 2, 0, 0)||^2 + ||(0, 0, 1, -6)||^2
    from steps 0 and 3, whose columns have disjoint supports."""
    res = sensitivity(UNIT_C, schema)
    assert res.value == pytest.approx(expected, rel=1e-12)
    assert res.exact


@pytest.mark.parametrize(("n", "k"), [(1, 1), (6, 2), (12, 3), (12, 12), (64, 8), (256, 16)])
def test_fixed_epoch_identity_is_sqrt_k(n: int, k: int) -> None:
    res = sensitivity(np.eye(n), FixedEpoch(epochs=k))
    assert res.value == pytest.approx(math.sqrt(k), rel=1e-15) and res.exact


@pytest.mark.parametrize(("b", "k", "seed"), [(1, 3, 0), (4, 2, 1), (5, 3, 2), (3, 6, 3)])
def test_fixed_epoch_orthogonal_epochs_closed_form(b: int, k: int, seed: int) -> None:
    """C block-diagonal by epoch (signed entries): columns of different epochs have disjoint
    supports, every block of C^T C is diagonal, and sens^2 = max_j sum_e ||C[:, j + e b]||^2."""
    rng = np.random.default_rng(seed)
    c = np.zeros((b * k, b * k))
    for e in range(k):
        c[e * b:(e + 1) * b, e * b:(e + 1) * b] = np.tril(rng.standard_normal((b, b)))
    col2 = np.sum(c**2, axis=0)
    closed = max(sum(col2[j + e * b] for e in range(k)) for j in range(b))
    res = sensitivity(c, FixedEpoch(epochs=k))
    assert res.exact and res.value**2 == pytest.approx(closed, rel=1e-12)
    assert brute_sensitivity_squared(c, FixedEpoch(epochs=k)) == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize(("n", "b", "k", "expected"), [(10, 3, None, 4), (10, 3, 2, 2), (10, 10, None, 1), (7, 1, None, 7)])
def test_min_separation_identity(n: int, b: int, k: int | None, expected: int) -> None:
    res = sensitivity(np.eye(n), MinSeparation(separation=b, max_participations=k))
    assert res.value == pytest.approx(math.sqrt(expected), rel=1e-15) and res.exact


@pytest.mark.parametrize(("n", "k"), [(1, 1), (4, 2), (6, 3), (12, 4), (12, 12), (10, 5), (9, 3)])
def test_prefix_sum_fixed_epoch_closed_form(n: int, k: int) -> None:
    """C = lower-triangular ones: X_il = n - max(i, l) >= 0, worst residue class 0, so
    sens^2 = sum_{e,f<k} (n - max(e, f) b) = b k (k + 1) (2k + 1) / 6, also by enumeration."""
    c = np.tril(np.ones((n, n)))
    b = n // k
    closed = b * k * (k + 1) * (2 * k + 1) / 6
    assert brute_sensitivity_squared(c, FixedEpoch(epochs=k)) == pytest.approx(closed, rel=1e-12)
    res = sensitivity(c, FixedEpoch(epochs=k))
    assert res.value**2 == pytest.approx(closed, rel=1e-12) and res.exact


def test_large_min_separation_bound_runs_and_brackets() -> None:
    """n = 512, beyond enumeration: the row dynamic program's bound is at least its own witness and
    at least the explicit all-plus pairs on the fixed-epoch patterns (valid min-sep patterns)."""
    rng = np.random.default_rng(7)
    n = 512
    c = np.tril(rng.standard_normal((n, n)))
    for schema in (MinSeparation(separation=64), MinSeparation(separation=32, max_participations=4)):
        res = sensitivity(c, schema)
        assert "row-wise" in res.method and res.lower <= res.value
        check_witness(c, schema, res)
        assert res.witness is not None  # the vectors do at least as well as signs on their pattern
        block = (c.T @ c)[np.ix_(res.witness.pattern, res.witness.pattern)]
        assert res.lower**2 >= part._sign_witness(block)[0] * (1 - 1e-9)
        k = schema.participations(n)
        for i in range(32):
            p = [i + 64 * e for e in range(k)]
            assert np.sum(c[:, p].sum(axis=1) ** 2) <= res.value**2 * (1 + 1e-12)
    banded = np.tril(c) - np.tril(c, -16)
    res = sensitivity(banded, MinSeparation(separation=16, max_participations=5))
    col2 = np.sum(banded**2, axis=0)
    assert res.exact and res.value**2 >= np.sort(col2)[-1]


@pytest.mark.parametrize("schema", [SingleParticipation(), FixedEpoch(epochs=4), MinSeparation(separation=3),
                                    MinSeparation(separation=3, max_participations=2)])
def test_json_round_trip(schema: part.Participation) -> None:
    text = schema.to_json()
    assert json.loads(text)["version"] == 1
    assert participation_from_json(text) == schema
    assert participation_from_json(text.encode()) == schema


@pytest.mark.parametrize(("text", "needle"), [
    ("not json", "not valid JSON"),
    ("[1]", "JSON object"),
    ('{"kind": "single"}', "version"),
    ('{"version": 2, "kind": "single"}', "version"),
    ('{"version": true, "kind": "single"}', "version"),
    ('{"version": 1.0, "kind": "single"}', "version"),
    ('{"version": 1, "kind": "poisson"}', "kind"),
    ('{"version": 1, "kind": "fixed-epoch"}', "keys"),
    ('{"version": 1, "kind": "single", "epochs": 2}', "keys"),
    ('{"version": 1, "kind": "fixed-epoch", "epochs": 0}', "epochs"),
    ('{"version": 1, "kind": "fixed-epoch", "epochs": "4"}', "epochs"),
    ('{"version": 1, "kind": "min-sep", "separation": 2.5, "max_participations": null}', "separation"),
    ('{"version": 1, "kind": "min-sep", "separation": 2, "max_participations": true}', "max_participations"),
])
def test_bad_json_is_one_clear_error(text: str, needle: str) -> None:
    with pytest.raises(MfcliError, match=needle):
        participation_from_json(text)


@pytest.mark.parametrize(("make", "needle"), [
    (lambda: FixedEpoch(epochs=0), "epochs"),
    (lambda: FixedEpoch(epochs=-2), "epochs"),
    (lambda: MinSeparation(separation=0), "separation"),
    (lambda: MinSeparation(separation=2, max_participations=0), "max_participations"),
    (lambda: sensitivity(np.eye(10), FixedEpoch(epochs=3)), "n = 10 is not divisible by epochs = 3"),
    (lambda: FixedEpoch(epochs=3).patterns(10), "epochs = 3"),
    (lambda: sensitivity(np.eye(4), MinSeparation(separation=5)), "separation = 5"),
    (lambda: sensitivity(np.ones(4), SingleParticipation()), "2-D"),
    (lambda: sensitivity(np.array([[1.0, np.nan]]), SingleParticipation()), "non-finite"),
    (lambda: MinSeparation(separation=1).patterns(40), "n <= 24"),
])
def test_bad_parameters_are_value_errors_naming_the_parameter(make: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as info:
        make()  # type: ignore[operator]
    assert isinstance(info.value, MfcliError)


def test_wrong_types_are_type_errors() -> None:
    with pytest.raises(TypeError):
        FixedEpoch(epochs=True)
    with pytest.raises(TypeError):
        MinSeparation(separation="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sensitivity(np.eye(2), "single")  # type: ignore[arg-type]


def test_schemas_are_frozen_and_keyword_only() -> None:
    with pytest.raises(TypeError):
        FixedEpoch(4)  # type: ignore[misc]
    schema = MinSeparation(separation=3)
    with pytest.raises(AttributeError):
        schema.separation = 4  # type: ignore[misc]
    assert FixedEpoch(epochs=4.0).epochs == 4 and isinstance(FixedEpoch(epochs=4.0).epochs, int)


@pytest.mark.parametrize("n", range(1, 13))
def test_patterns_match_the_definition(n: int) -> None:
    schemas: list[part.Participation] = [SingleParticipation(), MinSeparation(separation=1),
                                         MinSeparation(separation=min(3, n), max_participations=2)]
    schemas += [FixedEpoch(epochs=k) for k in range(1, n + 1) if n % k == 0]
    for schema in schemas:
        assert sorted(schema.patterns(n)) == sorted(schema_patterns(n, schema))
        assert max(len(p) for p in schema.patterns(n)) == schema.participations(n)


@pytest.mark.parametrize(("schema", "n", "line"), [
    (SingleParticipation(), 8, "single participation"),
    (FixedEpoch(epochs=4), 1024, "fixed-epoch: 4 epochs of 256 steps"),
    (FixedEpoch(epochs=1), None, "fixed-epoch: 1 epoch"),
    (MinSeparation(separation=64), None, "min-separation: as many participations as fit, at least 64 steps apart"),
    (MinSeparation(separation=64), 1000, "min-separation: at most 16 participations, at least 64 steps apart"),
    (MinSeparation(separation=64, max_participations=4), 1000,
     "min-separation: at most 4 participations, at least 64 steps apart"),
    (MinSeparation(separation=1, max_participations=1), None, "min-separation: at most 1 participation, at least 1 step apart"),
])
def test_describe(schema: part.Participation, n: int | None, line: str) -> None:
    assert schema.describe(n) == line


def test_public_names_resolve_lazily() -> None:
    for name in ("SingleParticipation", "FixedEpoch", "MinSeparation", "Sensitivity", "participation_from_json"):
        assert getattr(mfcli, name) is getattr(part, name)


@pytest.mark.parametrize(("n", "b", "k"), [(n, b, k) for n in (1, 5, 9) for b in range(1, n + 1) for k in range(1, n + 1)])
def test_dynamic_programs_equal_their_definitions(n: int, b: int, k: int) -> None:
    """The two dynamic programs behind the large-n bound, each equal to its definition by brute
    force: the best separated sum, and the row values r_i."""
    rng = np.random.default_rng(1000 * n + 10 * b + k)
    schema = MinSeparation(separation=b, max_participations=k)
    pats = schema_patterns(n, schema)
    values = rng.exponential(size=n) * (rng.random(n) < 0.8)
    best, chosen = part._separated_max(values, b, schema.participations(n))
    assert best == pytest.approx(max(values[list(p)].sum() for p in pats), abs=1e-12)
    assert (tuple(chosen) in pats or (not chosen and best == 0)) and values[chosen].sum() == pytest.approx(best, abs=1e-12)
    a = np.abs(rng.standard_normal((n, n)))
    a = a + a.T
    rows = part._row_bounds(a, b, schema.participations(n))
    for i in range(n):
        assert rows[i] == pytest.approx(max(a[i, list(p)].sum() for p in pats if i in p), abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_dual_certificate_bounds_one_pattern_for_any_vectors(seed: int) -> None:
    """The certificate alone, not masked by the witness: for one pattern (all p steps, fixed-epoch
    with p epochs of one step), sum(y) - p mu is at least the oracle's best pair for random unit
    rows, converged or not, and within 1e-9 of the oracle's certificate at the ascent's rows."""
    rng = np.random.default_rng(seed)
    p = 3 + seed % 4
    c = rng.normal(size=(p + 2, p))
    attained, certified = brute_vector_bounds_squared(c, FixedEpoch(epochs=p))
    assert certified - attained <= 1e-9 * attained
    block = (c.T @ c)[None]
    for rows in (rng.normal(size=(1, p, 3)), rng.normal(size=(1, p, p))):
        rows /= np.linalg.norm(rows, axis=2, keepdims=True)
        assert part._dual_bound(block, rows)[0] >= attained * (1 - 1e-12)
    values, vectors = part._vector_ascent(block, part.ASCENT_ITERATIONS)
    assert values[0] <= certified * (1 + 1e-12)
    dual = part._dual_bound(block, vectors)[0]
    assert attained * (1 - 1e-12) <= dual <= certified * (1 + 1e-9)


# --- the row-wise bound beyond ENUMERATION_LIMIT, against enumeration on small n (issue 27) -----

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(4, 13), b=st.integers(1, 3),
       k=st.sampled_from([None, 1, 2, 3, 4]), nonneg=st.booleans())
def test_row_wise_bound_is_above_every_pattern(seed: int, n: int, b: int, k: int | None, nonneg: bool) -> None:
    """The dynamic-program bound (every split weight) is at least max_P a(P) by brute force over
    the patterns listed from the definition, and its witness at most the enumerated exact value."""
    import itertools as _it

    rng = np.random.default_rng(seed)
    c = np.tril(rng.standard_normal((n, n)))
    if nonneg:
        c = np.abs(c)
    schema = MinSeparation(separation=b, max_participations=k)
    x = c.T @ c
    cap = k or n
    brute = max(float(np.abs(x[np.ix_(p, p)]).sum())
                for r in range(1, cap + 1) for p in _it.combinations(range(n), r)
                if all(q - p_ >= b for p_, q in _it.pairwise(p)))
    exact = sensitivity(c, schema)
    old = part.ENUMERATION_LIMIT
    part.ENUMERATION_LIMIT = 0
    try:
        bound = sensitivity(c, schema)
    finally:
        part.ENUMERATION_LIMIT = old
    assert bound.value**2 >= brute * (1 - 1e-12)
    if "stopped" not in bound.method:  # a finished branch and bound is max_P a(P) itself
        assert bound.value**2 <= brute * (1 + 1e-9)
    assert bound.value >= exact.value * (1 - 1e-12)
    assert bound.lower <= exact.value * (1 + 1e-9)
    if nonneg:  # a(P) is attained (all-plus), so the enumerated value is exact
        assert exact.value**2 == pytest.approx(brute, rel=1e-12)
