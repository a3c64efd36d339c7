"""The balls-in-bins PLDs are mfcli's own (mfcli.accounting.pld_ops), held equal bit for bit to
dp-accounting's, the oracle: ``pld_ops.from_rounded_probability`` against dp-accounting's
``PrivacyLossDistribution.create_from_rounded_probability`` (probabilities, lower loss, infinity
mass, sparse or dense form), and the tree's and DP-SGD's PLDs after ``self_compose`` over epochs
(the PMFs and the epsilons at deltas 1e-12..0.5, upper and lower PLD), built by dp-accounting from
the same rounded laws and from the dictionaries the code built before (positive masses only, the
add direction's keys descending). And ``mfcli account --batching balls-in-bins`` runs without
importing dp-accounting."""
from __future__ import annotations

import math

import numpy as np
import pytest
from test_account_without_dp_accounting import _imports_dp_accounting

from mfcli.accounting import balls_in_bins as bib
from mfcli.accounting import pld_ops
from mfcli.errors import MfcliError

DELTAS = (1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 0.1, 0.5)


def _dp_pld():
    from dp_accounting.pld import privacy_loss_distribution as pld_mod

    return pld_mod.PrivacyLossDistribution


def _is_sparse(dp_pmf) -> bool:
    from dp_accounting.pld import pld_pmf

    return isinstance(dp_pmf, pld_pmf.SparsePLDPmf)


def _same_pmf(ours: pld_ops.Pmf, theirs, what: str) -> None:
    ref = pld_ops.Pmf.from_dp_accounting(theirs)
    assert ours.sparse == _is_sparse(theirs), what
    assert ours.pessimistic == ref.pessimistic, what
    assert ours.discretization == ref.discretization, what
    assert ours.lower_loss == ref.lower_loss, what
    assert ours.probs.dtype == np.float64 and ours.probs.tobytes() == ref.probs.tobytes(), what
    assert ours.infinity_mass == ref.infinity_mass, what


def _same_pld(ours: pld_ops.Pld, theirs, what: str) -> None:
    _same_pmf(ours.remove, theirs._pmf_remove, what + " remove")
    assert ours.symmetric == theirs._symmetric, what
    _same_pmf(ours.add_pmf, theirs._pmf_add, what + " add")


# ---------------------------------------------------------------------------------------------
# The constructor on its own


def _mapping(rng: np.random.Generator, size: int, lo: int, gaps: bool, descending: bool) -> dict[int, float]:
    keys = np.arange(lo, lo + (2 * size if gaps else size))
    if gaps:
        keys = np.sort(rng.choice(keys, size, replace=False))
    if descending:
        keys = keys[::-1]
    vals = rng.dirichlet(np.ones(size)) * 0.999
    return {int(k): float(v) for k, v in zip(keys, vals, strict=True)}


@pytest.mark.parametrize("size", [1, 2, 999, 1000, 1001, 5000])
@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("gaps, descending", [(False, False), (True, False), (False, True)])
def test_constructor_is_dp_accountings(size: int, pessimistic: bool, symmetric: bool, gaps: bool,
                                       descending: bool) -> None:
    rng = np.random.default_rng(size + 7 * pessimistic + 13 * symmetric + 29 * gaps)
    d = 10.0 ** rng.uniform(-4, -1)
    remove = _mapping(rng, size, int(rng.integers(-3 * size, 3)), gaps, descending)
    inf_r = float(rng.uniform(0, 1e-3))
    kw: dict = {}
    if not symmetric:
        kw = {"rounded_probability_mass_function_add": _mapping(rng, max(1, size - 3), -5, gaps, descending),
              "infinity_mass_add": 0.0 if pessimistic else 1e-10}
    ours = pld_ops.from_rounded_probability(remove, inf_r, d, pessimistic, symmetric=symmetric, **kw)
    theirs = _dp_pld().create_from_rounded_probability(remove, inf_r, d, pessimistic, symmetric=symmetric, **kw)
    _same_pld(ours, theirs, f"size {size}")
    for delta in (1e-9, 1e-6, 1e-3, 0.3):
        assert ours.get_epsilon_for_delta(delta) == theirs.get_epsilon_for_delta(delta), delta


def test_constructor_refuses_what_dp_accounting_refuses() -> None:
    pmf = {0: 0.5, 1: 0.5}
    with pytest.raises(MfcliError, match="symmetric"):
        pld_ops.from_rounded_probability(pmf, 0.0, 1e-3, rounded_probability_mass_function_add=pmf)
    with pytest.raises(MfcliError, match="add direction"):
        pld_ops.from_rounded_probability(pmf, 0.0, 1e-3, symmetric=False)
    with pytest.raises(MfcliError, match="no losses"):
        pld_ops.from_rounded_probability({}, 0.0, 1e-3)


# ---------------------------------------------------------------------------------------------
# The balls-in-bins PLDs, built and composed


def _old_dict(law, sign: int) -> dict[int, float]:
    """The dictionary the code gave dp-accounting before pld_ops: positive masses only, in grid
    order (so the add direction's keys descending)."""
    keep = np.flatnonzero(law.p > 0)
    return {int(sign * (law.lo + k)): float(law.p[k]) for k in keep}


def _dp_plds(laws, h: float, as_dict) -> tuple:
    """(pessimistic, optimistic) built by dp-accounting from the laws the code passes on (each
    mass scaled to its side of the exact law, the missing masses' bounds at infinity)."""
    cls = _dp_pld()
    p_up, q_down = bib._scaled(laws.p_up, True), bib._scaled(laws.q_down, True)
    upper = cls.create_from_rounded_probability(
        as_dict(p_up, +1), p_up.dropped, h, pessimistic_estimate=True,
        rounded_probability_mass_function_add=as_dict(q_down, -1),
        infinity_mass_add=q_down.dropped, symmetric=False)
    lower = cls.create_from_rounded_probability(
        as_dict(bib._scaled(laws.p_down, False), +1), 0.0, h, pessimistic_estimate=False,
        rounded_probability_mass_function_add=as_dict(bib._scaled(laws.q_up, False), -1), infinity_mass_add=0.0,
        symmetric=False)
    return upper, lower


# (kind, n, sigma, grid, epochs): dense PMFs of thousands of points, sparse ones near the 1000
# limit, and tiny sparse ones whose 2- and 3-fold compositions stay sparse (dictionary products)
CASES = [
    ("tree", 4, 2.0, 4e-3, (1, 2, 3, 7, 50)),
    ("tree", 16, 1.0, 4e-3, (1, 4)),
    ("tree", 4, 8.0, 4e-3, (1, 2, 5)),  # 1003 points: dense, just
    ("tree", 8, 9.0, 4e-3, (1, 2, 5)),
    ("tree", 2, 10.0, 0.1, (1, 2, 3, 50)),  # 33 points: sparse, dense from 2 epochs on
    ("tree", 16, 30.0, 0.05, (1, 2, 3)),  # 24-25 points: the 2-fold composition stays sparse
    ("dpsgd", 1024, 8.0, 4e-3, (1, 2, 3, 10)),  # 24 points, the CLI's first grid at sigma 8
    ("dpsgd", 16, 2.0, 1e-3, (1, 3)),
    ("dpsgd", 7, 1.0, 0.05, (1, 2, 20)),
    ("dpsgd", 3, 20.0, 0.1, (1, 2, 3, 4)),  # 9 points: sparse up to the 3-fold composition
    ("dpsgd", 100, 0.7, 2e-3, (1, 2)),
]


def _laws(kind: str, n: int, sigma: float, h: float):
    if kind == "tree":
        return bib._root_laws(bib.tree_height(n), sigma, h)
    return bib._allocation_laws(n, sigma, h)


@pytest.mark.parametrize("kind, n, sigma, h, epochs", CASES, ids=[f"{c[0]}-n{c[1]}-s{c[2]}-h{c[3]}" for c in CASES])
def test_balls_in_bins_plds_are_dp_accountings(kind: str, n: int, sigma: float, h: float, epochs: tuple) -> None:
    laws = _laws(kind, n, sigma, h)
    upper, lower = bib._plds(laws, h)
    for as_dict, name in ((bib._as_dict, "same dictionaries"), (_old_dict, "the old dictionaries")):
        dp_upper, dp_lower = _dp_plds(laws, h, as_dict)
        for k in epochs:
            ours_u, ours_l = bib._compose_epochs(upper, lower, k)
            dp_u, dp_l = (dp_upper, dp_lower) if k == 1 else (dp_upper.self_compose(k), dp_lower.self_compose(k))
            _same_pld(ours_u, dp_u, f"{name}, upper, {k} epochs")
            _same_pld(ours_l, dp_l, f"{name}, lower, {k} epochs")
            for delta in DELTAS:
                assert ours_u.get_epsilon_for_delta(delta) == dp_u.get_epsilon_for_delta(delta), (name, k, delta)
                assert ours_l.get_epsilon_for_delta(delta) == dp_l.get_epsilon_for_delta(delta), (name, k, delta)


def test_every_epoch_count_to_fifty() -> None:
    """Epochs 1..50 of a small case (each count its own self-composition window and FFT length)."""
    h = 0.02
    laws = _laws("tree", 4, 3.0, h)
    upper, lower = bib._plds(laws, h)
    dp_upper, dp_lower = _dp_plds(laws, h, _old_dict)
    for k in range(1, 51):
        for ours, theirs in zip(bib._compose_epochs(upper, lower, k), (dp_upper, dp_lower), strict=True):
            a, b = ours, theirs.self_compose(k)
            for delta in DELTAS:
                assert a.get_epsilon_for_delta(delta) == b.get_epsilon_for_delta(delta), (k, delta)


@pytest.mark.parametrize("fn, n, sigma", [(bib.tree_plds, 8, 2.0), (bib.dpsgd_plds, 12, 1.5)])
def test_public_plds_keep_dp_accountings_api(fn, n: int, sigma: float) -> None:
    """tree_plds / dpsgd_plds return pld_ops PLDs whose epsilons, compositions and conversion are
    dp-accounting's."""
    upper, lower = fn(n=n, sigma=sigma, epochs=3, grid=4e-3)
    assert isinstance(upper, pld_ops.Pld) and isinstance(lower, pld_ops.Pld)
    assert upper.remove.pessimistic and not lower.remove.pessimistic
    dp_upper, dp_lower = upper.to_dp_accounting(), lower.to_dp_accounting()
    for ours, theirs in ((upper, dp_upper), (lower, dp_lower)):
        for delta in DELTAS:
            assert ours.get_epsilon_for_delta(delta) == theirs.get_epsilon_for_delta(delta)
        _same_pld(ours.self_compose(2), theirs.self_compose(2), "self_compose")
    # pld_ops cuts a composition's tails on each PMF's own side, as dp-accounting does
    _same_pld(upper.compose(upper), dp_upper.compose(dp_upper), "compose")
    _same_pld(lower.compose(lower), dp_lower.compose(dp_lower), "compose")
    eps_u = upper.get_epsilon_for_delta(1e-6)
    assert math.isfinite(eps_u) and eps_u > lower.get_epsilon_for_delta(1e-6) > 0


# ---------------------------------------------------------------------------------------------
# The CLI without dp-accounting


@pytest.mark.parametrize("args", [
    pytest.param(["account", "--strategy", "tree", "--n", "16", "--sigma", "2", "--batching", "balls-in-bins", "-q"],
                 id="tree"),
    pytest.param(["account", "--strategy", "identity", "--n", "16", "--sigma", "3", "--batching", "balls-in-bins",
                  "--delta", "1e-8", "--json", "-q"], id="identity-json"),
])
def test_balls_in_bins_account_does_not_import_dp_accounting(args: list[str]) -> None:
    imported, proc = _imports_dp_accounting(args)
    assert proc.returncode == 0, proc.stderr
    assert not imported
