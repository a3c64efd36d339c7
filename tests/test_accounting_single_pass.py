"""Single-pass Gaussian accounting and the DP-SGD reference, against independent derivations."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate, stats

from mfcli.accounting.single_pass import dpsgd, gaussian_delta, gaussian_epsilon, single_pass
from mfcli.errors import MfcliError


def _hockey_stick_numeric(eps: float, mu: float) -> float:
    """H_eps(N(mu, 1) || N(0, 1)) by quadrature of (q - e^eps p)_+ (no closed form used)."""
    def integrand(x: float) -> float:
        return max(stats.norm.pdf(x, loc=mu) - math.exp(eps) * stats.norm.pdf(x), 0.0)

    # the integrand is positive for x > eps/mu + mu/2 only
    start = eps / mu + mu / 2
    val, _ = integrate.quad(integrand, start, start + 40, limit=200, epsabs=1e-14, epsrel=1e-12)
    return val


@pytest.mark.parametrize("mu", [0.05, 0.25, 0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9])
def test_epsilon_matches_dp_accounting_analytic_gaussian(mu: float, delta: float) -> None:
    import dp_accounting

    ours = gaussian_epsilon(delta, mu)
    theirs = dp_accounting.get_epsilon_gaussian(1.0 / mu, delta)
    assert ours == pytest.approx(theirs, abs=1e-6)
    # the returned eps meets delta (upper end of the bracket)
    assert gaussian_delta(ours, mu) <= delta * (1 + 1e-9)


@pytest.mark.parametrize("eps,mu", [(0.1, 0.3), (1.0, 1.0), (3.0, 2.0), (0.5, 0.2)])
def test_delta_curve_matches_quadrature(eps: float, mu: float) -> None:
    assert gaussian_delta(eps, mu) == pytest.approx(_hockey_stick_numeric(eps, mu), rel=1e-7, abs=1e-15)


@pytest.mark.parametrize("sigma,sens", [(4.0, 1.0), (1.0, 2.0), (10.0, 3.3166247903554)])
def test_single_pass_closed_forms(sigma: float, sens: float) -> None:
    r = single_pass(sigma=sigma, sensitivity=sens, delta=1e-6)
    assert r.rho_zcdp == pytest.approx(sens**2 / (2 * sigma**2), rel=1e-15)
    assert r.mu_gdp == pytest.approx(sens / sigma, rel=1e-15)
    assert r.noise_multiplier == pytest.approx(sigma / sens, rel=1e-15)
    # zCDP implies (rho + 2 sqrt(rho log(1/delta)), delta)-DP, never tighter than the exact curve
    rho = r.rho_zcdp
    assert r.epsilon <= rho + 2 * math.sqrt(rho * math.log(1 / 1e-6))


@given(sigma=st.floats(0.3, 30), k=st.floats(0.1, 10))
def test_single_pass_depends_on_sigma_over_sensitivity(sigma: float, k: float) -> None:
    a = single_pass(sigma=sigma * k, sensitivity=k, delta=1e-5).epsilon
    b = single_pass(sigma=sigma, sensitivity=1.0, delta=1e-5).epsilon
    assert a == pytest.approx(b, rel=1e-8, abs=1e-10)


@given(s1=st.floats(0.3, 20), s2=st.floats(0.3, 20))
def test_single_pass_monotone_in_sigma(s1: float, s2: float) -> None:
    lo, hi = sorted((s1, s2))
    assert single_pass(sigma=hi, sensitivity=1.0).epsilon <= single_pass(sigma=lo, sensitivity=1.0).epsilon + 1e-12


def test_dpsgd_reference_value() -> None:
    # docs/accounting.md, "Oracles": sigma 4, p 0.01, delta 1e-6, n 64, identity -> 0.0767230
    # (PLD, discretization 1e-4)
    r = dpsgd(sigma=4.0, sampling=0.01, steps=64, delta=1e-6)
    assert r.epsilon == pytest.approx(0.0767230, abs=5e-8)
    assert '"PoissonSampledDpEvent"' in r.as_dict()["dp_event"]


def _accountant_epsilon(sigma: float, p: float, steps: int, delta: float, d: float) -> float:
    """dp-accounting's PLDAccountant on the DP-SGD event, run directly (the independent derivation)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=d)
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(sigma)), steps))
    return acc.get_epsilon(delta)


#: (sigma, p, steps, delta, discretization): small and large noise (the DP-SGD reduction runs at
#: sigma ~0.4: 2 x 10^5 grid points), p from 1e-5 to 1 (no subsampling), coarse and fine grids.
DPSGD_CASES = [
    (4.0, 0.01, 256, 1e-6, 1e-4),
    (0.4269453212393082, 0.01, 256, 1e-6, 1e-4),
    (1.0, 0.5, 10, 1e-5, 1e-3),
    (2.0, 1.0, 5, 1e-6, 1e-4),
    (0.3, 0.05, 100, 1e-6, 1e-3),
    (8.0, 0.001, 1000, 1e-6, 1e-4),
    (0.8, 0.2, 3, 1e-3, 1e-2),
    (1.1, 0.999, 7, 1e-6, 1e-3),
    (0.5, 1e-5, 50, 1e-6, 1e-4),
]


@pytest.mark.parametrize(("sigma", "p", "steps", "delta", "d"), DPSGD_CASES)
def test_dpsgd_is_dp_accountings_accountant_bit_for_bit(sigma: float, p: float, steps: int, delta: float,
                                                        d: float) -> None:
    """``dpsgd`` builds the accountant's PLD with the inverse privacy loss on arrays: the same
    epsilon to the last bit."""
    got = dpsgd(sigma=sigma, sampling=p, steps=steps, delta=delta, value_discretization=d).epsilon
    assert got == _accountant_epsilon(sigma, p, steps, delta, d)


def test_dpsgd_array_inverse_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """An array inverse that drifts from the scalar one by an ulp is caught by the spot checks, and
    every grid point then takes the scalar path: the accountant's epsilon all the same."""
    from mfcli.accounting import single_pass as sp

    real = sp._PoissonGaussianLoss._inverse_array
    calls = []

    def drifted(self, eps):  # type: ignore[no-untyped-def]
        calls.append(eps.size)
        return np.nextafter(real(self, eps), np.inf)

    monkeypatch.setattr(sp._PoissonGaussianLoss, "_inverse_array", drifted)
    assert dpsgd(sigma=1.0, sampling=0.1, steps=4, delta=1e-6, value_discretization=1e-3).epsilon == \
        _accountant_epsilon(1.0, 0.1, 4, 1e-6, 1e-3)
    assert calls


#: (sigma, q) of the loss-level comparisons: small and large noise, q from 1e-5 to 1.
LOSS_CASES = [(4.0, 0.01), (0.4269453212393082, 0.01), (1.0, 0.5), (2.0, 1.0), (0.3, 0.05), (8.0, 0.001),
              (1.1, 0.999), (0.5, 1e-5), (50.0, 0.3)]


@pytest.mark.parametrize(("sigma", "q"), LOSS_CASES)
@pytest.mark.parametrize("remove", [True, False], ids=["remove", "add"])
def test_poisson_gaussian_loss_is_dp_accountings_bit_for_bit(sigma: float, q: float, remove: bool) -> None:
    """Each piece of the sampled Gaussian's loss against dp-accounting's ``GaussianPrivacyLoss``
    (the oracle: its scipy.stats distributions), bit for bit: the connect-the-dots bounds, the
    scalar loss and inverse, the CDFs and the deltas on a grid that crosses every branch (below
    log(1 - q), at 0, at the limit itself)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    from mfcli.accounting.single_pass import _PoissonGaussianLoss

    ours = _PoissonGaussianLoss(sigma, q, remove)
    theirs = plm.GaussianPrivacyLoss(sigma, sampling_prob=q, adjacency_type=plm.AdjacencyType.REMOVE if remove
                                     else plm.AdjacencyType.ADD)
    b = theirs.connect_dots_bounds()
    assert ours.connect_dots_bounds() == (b.epsilon_upper, b.epsilon_lower)
    xs = np.linspace(-30 * sigma, 30 * sigma, 401)
    assert [float(ours.privacy_loss(x)) for x in xs] == [float(theirs.privacy_loss(x)) for x in xs]
    assert ours.mu_upper_cdf(xs).tobytes() == np.asarray(theirs.mu_upper_cdf(xs)).tobytes()
    assert ours.mu_lower_log_cdf(xs).tobytes() == np.asarray(theirs.mu_lower_log_cdf(xs)).tobytes()
    lo, hi = b.epsilon_lower, b.epsilon_upper
    limit = math.log(1 - q) if q < 1 else 0.0
    eps = np.concatenate([np.linspace(lo - 1, hi + 1, 3001), [0.0, limit, -limit, math.log1p(-q) if q < 1 else 0.0]])
    eps_in = eps[(eps > limit) if remove else (eps < -limit)] if q < 1 else eps
    assert [float(ours.inverse_privacy_loss(e)) for e in eps_in] == \
        [float(theirs.inverse_privacy_loss(e)) for e in eps_in]
    assert ours.deltas(eps).tobytes() == np.asarray(theirs.get_delta_for_epsilon(eps)).tobytes()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sigma=0.0, sensitivity=1.0),
        dict(sigma=-1.0, sensitivity=1.0),
        dict(sigma=float("nan"), sensitivity=1.0),
        dict(sigma=float("inf"), sensitivity=1.0),
        dict(sigma=1.0, sensitivity=1.0, delta=0.0),
        dict(sigma=1.0, sensitivity=1.0, delta=1.0),
        dict(sigma=1.0, sensitivity=1.0, delta=-1e-6),
        dict(sigma=1.0, sensitivity=0.0),
    ],
)
def test_single_pass_bad_input(kwargs: dict) -> None:
    with pytest.raises(MfcliError):
        single_pass(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sigma=1.0, sampling=0.0, steps=4),
        dict(sigma=1.0, sampling=1.5, steps=4),
        dict(sigma=1.0, sampling=0.1, steps=0),
        dict(sigma=1.0, sampling=0.1, steps=4, value_discretization=0.0),
    ],
)
def test_dpsgd_bad_input(kwargs: dict) -> None:
    with pytest.raises(MfcliError):
        dpsgd(**kwargs)


def test_gaussian_delta_vectorised() -> None:
    e = np.array([0.0, 0.5, 1.0])
    d = gaussian_delta(e, 1.0)
    assert d.shape == (3,) and np.all(np.diff(d) < 0)


@pytest.mark.parametrize(("sigma", "p", "d"), [(c[0], c[1], c[4]) for c in DPSGD_CASES] + [(50.0, 0.3, 1e-2)])
def test_poisson_gaussian_pld_is_dp_accountings_bit_for_bit(sigma: float, p: float, d: float) -> None:
    """The PLD of one Poisson-sampled Gaussian (built as an array where dp-accounting's is dense,
    by dp-accounting where it is sparse) equals dp-accounting's ``from_gaussian_mechanism``, as its
    accountant builds it: same PMF type, grid, probabilities and infinity mass, both directions."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    from mfcli.accounting.single_pass import _poisson_gaussian_pld

    ours = _poisson_gaussian_pld(sigma, p, d).to_dp_accounting()
    theirs = pld_lib.from_gaussian_mechanism(standard_deviation=sigma, value_discretization_interval=d,
                                             sampling_prob=p)
    assert ours._symmetric == theirs._symmetric
    for a, b in ((ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)):
        assert type(a) is type(b)
        assert a._infinity_mass == b._infinity_mass
        if hasattr(b, "_probs"):
            assert a._lower_loss == b._lower_loss
            assert a._probs.tobytes() == b._probs.tobytes()
        else:
            assert a._loss_probs == b._loss_probs
