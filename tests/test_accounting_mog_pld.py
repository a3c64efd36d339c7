"""The vectorised mixture-of-Gaussians PLD builder against dp-accounting's own builder, quadrature,
and dp-accounting's PMF constructors and composition."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from mog_cases import MMCC_LIKE_ROWS, inversion_problem
from scipy import integrate, stats

from mfcli.accounting import mog_pld
from mfcli.errors import MfcliError

MIXTURES = [
    (4.0, [0.0, 1.0], [0.99, 0.01]),                       # DP-SGD step
    (1.0, [0.0, 0.5, 1.3], [0.7, 0.2, 0.1]),
    (2.0, [1.0], [1.0]),                                    # plain Gaussian
    (0.7, [0.2, 0.4, 2.0], [0.5, 0.3, 0.2]),               # no zero component
    (3.0, list(np.arange(12) * 0.05), list(np.exp(-np.arange(12)) / np.exp(-np.arange(12)).sum())),
]


@pytest.mark.parametrize("sigma,sens,probs", MIXTURES)
def test_matches_dp_accounting_builder(sigma: float, sens: list, probs: list) -> None:
    # dp-accounting's builder is slow on wide loss ranges; the comparison means the same at any grid
    d = 1e-3 if sigma >= 3 else 1e-2
    ours = mog_pld.mixture_pld(sigma, sens, probs, value_discretization_interval=d)
    ref = mog_pld.reference_mixture_pld(sigma, sens, probs, value_discretization_interval=d)
    for delta in (1e-2, 1e-5, 1e-8):
        a, b = ours.get_epsilon_for_delta(delta), ref.get_epsilon_for_delta(delta)
        assert a == pytest.approx(b, abs=1e-9)
    for k in (3, 20):
        a = ours.self_compose(k).get_epsilon_for_delta(1e-6)
        b = ref.self_compose(k).get_epsilon_for_delta(1e-6)
        assert a == pytest.approx(b, rel=1e-8, abs=1e-9)


def _numeric_hockey_stick(sigma, sens, probs, eps, remove):
    """H_eps(Q || P) (remove) or H_eps(P || Q) (add) for Q = sum q N(s, sigma^2), P = N(0, sigma^2),
    by quadrature on a wide interval."""
    s, q = np.asarray(sens), np.asarray(probs)

    def qpdf(x):
        return float(np.sum(q * stats.norm.pdf(x, loc=s, scale=sigma)))

    def ppdf(x):
        return float(stats.norm.pdf(x, scale=sigma))

    if remove:
        f = lambda x: max(qpdf(x) - math.exp(eps) * ppdf(x), 0.0)  # noqa: E731
    else:
        f = lambda x: max(ppdf(x) - math.exp(eps) * qpdf(x), 0.0)  # noqa: E731
    lo, hi = -12 * sigma, s.max() + 12 * sigma
    pts = np.linspace(lo, hi, 41)
    return sum(integrate.quad(f, a, b, epsabs=1e-15, epsrel=1e-11, limit=200)[0] for a, b in itertools.pairwise(pts))


@pytest.mark.parametrize("sigma,sens,probs", MIXTURES[:4])
@pytest.mark.parametrize("eps", [0.05, 0.5, 2.0])
def test_hockey_stick_matches_quadrature(sigma, sens, probs, eps) -> None:
    for remove in (True, False):
        ours = mog_pld.hockey_stick(sigma, sens, probs, np.array([eps]), remove=remove)[0]
        ref = _numeric_hockey_stick(sigma, sens, probs, eps, remove)
        assert ours == pytest.approx(ref, rel=1e-6, abs=1e-12)


def test_hockey_stick_matches_dp_accounting_loss_object() -> None:
    from dp_accounting.pld import privacy_loss_mechanism as plm

    sigma, sens, probs = 1.5, [0.0, 0.5, 1.0, 2.0], [0.6, 0.2, 0.15, 0.05]
    eps = np.linspace(0.01, 3.0, 17)
    for remove, adj in ((True, plm.AdjacencyType.REMOVE), (False, plm.AdjacencyType.ADD)):
        ref = plm.MixtureGaussianPrivacyLoss(sigma, sens, probs, adjacency_type=adj).get_delta_for_epsilon(list(eps))
        ours = mog_pld.hockey_stick(sigma, sens, probs, eps, remove=remove)
        # dp-accounting evaluates at a point up to 1e-6 from the maximiser: ours is exact, never smaller
        assert np.all(ours >= np.asarray(ref) - 1e-12)
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-12)


def test_connect_dots_matches_dp_accounting() -> None:
    from dp_accounting.pld import pld_pmf

    d = 1e-4
    ks = np.array([-3, 0, 5, 9, 30])
    de = np.array([0.9, 0.5, 0.2, 0.05, 0.001])
    a = mog_pld.connect_dots_pmf(d, ks, de)
    b = pld_pmf.create_pmf_pessimistic_connect_dots(d, ks, de).to_dense_pmf()
    np.testing.assert_allclose(a.probs, b._probs, rtol=0, atol=1e-15)
    assert (a.lower_loss, a.infinity_mass) == (b._lower_loss, b._infinity_mass)
    ks = np.arange(-5, 100)
    de = np.exp(-np.arange(105) / 10.0) * 0.5
    a = mog_pld.connect_dots_pmf(d, ks, de)
    b = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(d, -5, 99, de).to_dense_pmf()
    np.testing.assert_array_equal(a.probs, b._probs)


def test_compose_matches_dp_accounting() -> None:
    p1 = mog_pld.mixture_pld(2.0, [0, 0.5, 1], [0.8, 0.15, 0.05], value_discretization_interval=1e-3)
    p2 = mog_pld.mixture_pld(1.5, [0, 1], [0.9, 0.1], value_discretization_interval=1e-3)
    ours = mog_pld.compose(p1, p2)
    ref = p1.to_dp_accounting().compose(p2.to_dp_accounting())  # dp-accounting's own composition
    for a, b in ((ours.remove, ref._pmf_remove), (ours.add, ref._pmf_add)):  # bit for bit
        assert a.probs.tobytes() == b._probs.tobytes()
        assert (a.lower_loss, a.infinity_mass) == (b._lower_loss, b._infinity_mass)
    for delta in (1e-3, 1e-6):
        assert ours.get_epsilon_for_delta(delta) == ref.get_epsilon_for_delta(delta)


def test_fewer_curve_points_are_pessimistic() -> None:
    sens = np.arange(30) * 0.04
    probs = np.exp(-np.arange(30) * 0.5)
    probs /= probs.sum()
    full = mog_pld.mixture_pld(2.0, sens, probs, value_discretization_interval=1e-4)
    coarse = mog_pld.mixture_pld(2.0, sens, probs, value_discretization_interval=1e-4, max_points=300)
    for delta in (1e-3, 1e-6):
        e_full, e_coarse = full.get_epsilon_for_delta(delta), coarse.get_epsilon_for_delta(delta)
        assert e_full - 1e-12 <= e_coarse <= e_full * 1.01 + 1e-3


@pytest.mark.parametrize(
    "sigma,sens,probs",
    [(0.0, [1.0], [1.0]), (1.0, [-1.0, 1.0], [0.5, 0.5]), (1.0, [0.0], [1.0]), (1.0, [0.0, 1.0], [0.5, 0.6]),
     (1.0, [0.0, 1.0], [1.0])],
)
def test_bad_mixtures(sigma, sens, probs) -> None:
    with pytest.raises(MfcliError):
        mog_pld.mixture_pld(sigma, sens, probs)


#: Mixtures for the inversion check: the table above plus rows like MMCC's.
_ROWS = [*MIXTURES, *MMCC_LIKE_ROWS]


@pytest.mark.parametrize("sigma,sens,probs", _ROWS)
@pytest.mark.parametrize("remove", [True, False])
def test_inversion_matches_an_independent_root_finder(sigma, sens, probs, remove) -> None:
    """``_invert`` (a chord start from a coarse grid, Halley steps on the points not yet converged)
    against scipy's brentq on L(x) - eps at every connect-the-dots grid point of the PLD: the roots agree
    to 1e-9 (or the loss is flat there, where delta does not depend on x to first order), and the
    hockey-stick values at the two roots to 1e-15 absolute, 1e-9 relative."""
    from scipy import optimize

    loss, lower_x, upper_x, eps = inversion_problem(sigma, sens, probs, remove, 203)
    ours = mog_pld._invert(loss, eps, lower_x, upper_x)
    span = upper_x - lower_x
    ref = np.array([optimize.brentq(lambda x, e=e: float(loss.value(np.array([x]))[0]) - e,
                                    lower_x - 64 * span, upper_x + 64 * span, xtol=1e-14, rtol=1e-15)
                    for e in eps])
    _, slope, _ = loss.value_slope_curvature(ref)
    steep = np.abs(slope) > 1e-6
    np.testing.assert_allclose(ours[steep], ref[steep], rtol=1e-9, atol=1e-9)

    def delta_at(x: np.ndarray) -> np.ndarray:
        return loss.upper_cdf(x) - np.exp(eps) * loss.lower_cdf(x)

    np.testing.assert_allclose(delta_at(ours), delta_at(ref), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("sigma,sens,probs", _ROWS)
@pytest.mark.parametrize("max_points", [None, 37])
def test_paired_deltas_match_each_direction_on_its_own(sigma, sens, probs, max_points) -> None:
    """``mixture_pld``'s deltas of both directions from shared roots and shared CDF entries (the
    ADD loss as the mirrored REMOVE loss, both tails from one erfc) against the path it replaced,
    each direction inverted and its CDFs formed with ``ndtr`` on its own (:func:`_deltas`), at every
    connect-the-dots point, strided grids included: equal to round-off (a few ulps of 1, and 1e-9
    relative where delta is not tiny)."""
    d = 1e-3
    s, q = mog_pld._check_mixture(sigma, sens, probs)
    remove, add = mog_pld._Loss(float(sigma), s, q, True), mog_pld._Loss(float(sigma), s, q, False)
    ks_r, ks_a = mog_pld._grid_points(remove, d, max_points), mog_pld._grid_points(add, d, max_points)
    paired = mog_pld._paired_deltas(remove, add, ks_r * d, ks_a * d)[:2]
    alone = mog_pld._deltas(remove, ks_r * d), mog_pld._deltas(add, ks_a * d)
    for ours, ref in zip(paired, alone, strict=True):
        assert ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=2e-15)


@pytest.mark.parametrize("sigma,sens,probs", _ROWS)
def test_paired_deltas_match_dp_accountings_loss(sigma, sens, probs) -> None:
    """The same deltas against dp-accounting's ``MixtureGaussianPrivacyLoss.get_delta_for_epsilon``
    (its own inversion, up to 1e-6 from the maximiser: ours never smaller beyond round-off)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    s, q = mog_pld._check_mixture(sigma, sens, probs)
    remove, add = mog_pld._Loss(float(sigma), s, q, True), mog_pld._Loss(float(sigma), s, q, False)
    eps_r = mog_pld._grid_points(remove, 0.01, 25) * 0.01
    eps_a = mog_pld._grid_points(add, 0.01, 25) * 0.01
    ours = mog_pld._paired_deltas(remove, add, eps_r, eps_a)
    for got, eps, adj in ((ours[0], eps_r, plm.AdjacencyType.REMOVE), (ours[1], eps_a, plm.AdjacencyType.ADD)):
        ref = np.asarray(plm.MixtureGaussianPrivacyLoss(sigma, list(s), list(q), adjacency_type=adj)
                         .get_delta_for_epsilon(list(eps)))
        assert np.all(got >= ref - 1e-12)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-12)


# Noise so small that the loss grid reaches eps > 709, where e^eps overflows: the product e^eps x
# mu_lower_cdf was NaN there (inf x an underflowed CDF), the whole PMF NaN and MMCC's epsilon NaN
# (tree, n = 8, sigma 0.1, rate 0.5). dp-accounting's builder (the oracle) forms it in log space.
@pytest.mark.parametrize("sens", [10.0, 25.0, 40.0])
def test_far_tails_match_dp_accounting_builder(sens: float) -> None:
    ours = mog_pld.mixture_pld(1.0, [0.0, sens], [0.5, 0.5], value_discretization_interval=1e-2)
    ref = mog_pld.reference_mixture_pld(1.0, [0.0, sens], [0.5, 0.5], value_discretization_interval=1e-2)
    assert np.all(np.isfinite(ours.remove.probs))
    assert np.all(np.isfinite(ours.add_pmf.probs))
    for delta in (1e-3, 1e-6):
        a, b = ours.get_epsilon_for_delta(delta), ref.get_epsilon_for_delta(delta)
        assert a == pytest.approx(b, rel=1e-11)


def test_far_tail_hockey_stick_matches_log_space_quadrature() -> None:
    # delta(eps) at eps = 750 for sigma 1, s = 40 (REMOVE: H_eps(N(-40) || N(0))): the plain
    # Gaussian's closed form Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), mu = 40, with the
    # second term in log space
    eps, mu = 750.0, 40.0
    ref = math.exp(stats.norm.logcdf(-eps / mu + mu / 2)) - math.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2))
    ours = mog_pld.hockey_stick(1.0, [mu], [1.0], np.array([eps]), remove=True)[0]
    assert np.isfinite(ours)
    assert ours == pytest.approx(ref, rel=1e-9)


def test_connect_dots_refuses_nan_deltas() -> None:
    """A NaN delta (e^eps x an underflowed CDF) would spread through every composition: refused
    with the eps where it is."""
    from mfcli.errors import MfcliError

    with pytest.raises(MfcliError, match=r"eps = 0\.003 is not a number"):
        mog_pld.connect_dots_pmf(1e-3, np.arange(5), np.array([0.5, 0.4, 0.3, np.nan, 0.1]))



def _two_fold_delta(sigma: float, sens: list, probs: list, eps: float, *, remove: bool, step: float) -> float:
    """The exact delta(eps) of two compositions of the MoG mechanism, by a route that shares nothing
    with the PLD code: delta_2(eps) = E_y[delta_1(eps - L(y))] over one step's outcome y, by the
    trapezoid rule in y, where delta_1 is the one-step hockey stick in closed form (normal tails at
    the root of L(y) = v, found by bisection) and L(y) = log sum_i q_i exp((s_i y - s_i^2/2)/sigma^2)
    the privacy loss (increasing in y). The caller halves ``step`` to bound the quadrature error."""
    from scipy.special import log_ndtr, logsumexp

    s, lq = np.asarray(sens, float), np.log(np.asarray(probs, float))

    def loss(y: np.ndarray) -> np.ndarray:
        return logsumexp((s * y[:, None] - s * s / 2) / sigma**2 + lq, axis=1)

    def loss_root(v: np.ndarray) -> np.ndarray:
        lo, hi = np.full(v.shape, -1e3), np.full(v.shape, 1e3)
        for _ in range(62):
            mid = (lo + hi) / 2
            up = loss(mid) > v
            hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
        return (lo + hi) / 2

    y = np.arange(-11 * sigma, s.max() + 11 * sigma, step)  # the density beyond is < 1e-26
    if remove:  # mixture against N(0, sigma^2): delta_1(v) is the mixture's mass beyond the root
        dens = np.exp(logsumexp(-(((y[:, None] - s) / sigma) ** 2) / 2 + lq, axis=1))
        v = eps - loss(y)
        root = loss_root(v)
        a = logsumexp(log_ndtr((s - root[:, None]) / sigma) + lq, axis=1)
        b = v + log_ndtr(-root / sigma)
    else:  # N(0, sigma^2) against the mixture: the mass below the root of L = -v
        dens = np.exp(-((y / sigma) ** 2) / 2)
        v = eps + loss(y)
        root = loss_root(-v)
        a = log_ndtr(root / sigma)
        b = v + logsumexp(log_ndtr((root[:, None] - s) / sigma) + lq, axis=1)
    weights = step * dens / (sigma * math.sqrt(2 * math.pi))
    return float(np.dot(weights, np.maximum(np.exp(a) - np.exp(b), 0.0)))


@pytest.mark.parametrize("sigma,sens,probs", [*MIXTURES[:4], (2.45, [0.728, 1.004, 1.742, 1.802], [0.38, 0.18, 0.37, 0.07])])
def test_composed_epsilon_brackets_an_independent_truth(sigma: float, sens: list, probs: list) -> None:
    """Two compositions of the pessimistic PLD against the exact two-fold delta (above): at our
    epsilon the exact delta is at most the target (our epsilon is not below the truth), and one grid
    step lower it is at least the target less 3e-15 (we are above the truth by at most what the grid
    and the composition's 1e-15 tail masses explain). Down to delta = 1e-12, where a 1e-15 tail mass
    moves epsilon by several grid steps (an audit once suspected the PLD below the truth there: the
    exact value showed it above). The quadrature error is estimated by halving the step."""
    d = 1e-3
    pld = mog_pld.mixture_pld(sigma, sens, probs, value_discretization_interval=d).self_compose(2)

    def exact(eps: float) -> tuple[float, float]:
        coarse, fine = (max(_two_fold_delta(sigma, sens, probs, eps, remove=r, step=h) for r in (True, False))
                        for h in (sigma / 40, sigma / 80))
        return fine, abs(coarse - fine)

    for delta in (1e-3, 1e-6, 1e-12):
        ours = pld.get_epsilon_for_delta(delta)
        at_ours, err = exact(ours)
        assert err < 1e-4 * delta
        assert at_ours <= delta * (1 + 1e-9) + 10 * err, (delta, ours, at_ours)
        below, err = exact(ours - d)
        assert err < 1e-4 * delta
        assert below >= delta - 3e-15 - 10 * err, (delta, ours, below)


def test_inversion_finishes_where_halley_steps_are_short() -> None:
    """A far, tiny component makes a start cell hundreds wide and the loss nearly flat at the start
    (slope ~1e-204): Halley's steps are ~1 long there, so the root is finished by bisection of its
    bracket (reviewer's case: a RuntimeError after 100 steps). Each root must bracket L = eps."""
    sigma, sens, probs = 0.3, [0.0, 0.2, 0.4, 60.0], [0.5, 0.3, 0.2 - 1e-8, 1e-8]
    pld = mog_pld.mixture_pld(sigma, sens, probs, value_discretization_interval=1e-3)
    assert math.isfinite(pld.get_epsilon_for_delta(1e-9))
    s, q = np.asarray(sens), np.asarray(probs)
    loss = mog_pld._Loss(sigma, s, q, True)
    lower_x, upper_x = mog_pld._truncation(loss, mog_pld.LOG_MASS_TRUNCATION_BOUND)
    eps = np.array([-0.693, -0.69, -0.5, 0.0, 1.0, 50.0, 2000.0, 15000.0])
    x = mog_pld._invert(loss, eps, lower_x, upper_x)
    gap = 1e-12 * (1 + np.abs(x))
    assert np.all(loss.value(x - gap) >= eps) and np.all(loss.value(x + gap) <= eps)
    # the hockey stick there against quadrature (the flat limit's neighbourhood)
    for e in (-0.69, 0.0):
        ours = mog_pld.hockey_stick(sigma, sens, probs, np.array([e]), remove=True)[0]
        assert ours == pytest.approx(_numeric_hockey_stick(sigma, sens, probs, e, True), rel=1e-6, abs=1e-12)


def test_a_batch_of_epsilons_is_inverted_as_each_alone() -> None:
    """Two components 500 standard deviations apart: delta(eps) = 0.001 (the far component's mass)
    for every eps >= 0 up to ~1.2e5; an earlier inversion returned 0 for part of a large batch."""
    eps = np.arange(1, 20001) * 0.01
    vals = mog_pld.hockey_stick(1.0, [0.0, 500.0], [0.999, 0.001], eps, remove=True)
    np.testing.assert_allclose(vals, 0.001, rtol=1e-12)


@pytest.mark.parametrize("sens", [1e-300, 1e-200])
def test_a_sensitivity_too_small_to_bound_is_refused(sens: float) -> None:
    """A sensitivity about 1e-200 of sigma leaves the loss's slope range 0 and the proven delta
    bounds NaN; the lift would spread NaN to every mass (reviewer, 2026-12-03: a PMF of NaNs was
    returned without an error). One clear error instead, for one mixture and for rows together."""
    with pytest.raises(MfcliError, match="could not bound its round-off"):
        mog_pld.mixture_pld(1.0, [sens], [1.0], value_discretization_interval=1e-3)
    with pytest.raises(MfcliError, match="could not bound its round-off"):
        mog_pld.mixture_plds(1.0, [([0.0, 1.0], [0.5, 0.5], 0.0), ([sens], [1.0], 0.0)],
                             value_discretization_interval=1e-3)
