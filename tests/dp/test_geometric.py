"""Tests for the two-sided Geometric mechanism (fedpriv/dp/geometric.py)."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import stats

from fedpriv.dp import geometric as geo


@pytest.mark.parametrize("epsilon,sensitivity", [(0.8, 1), (1.0, 3), (0.8, 50)])
def test_pmf_normalised_symmetric_and_ratio_is_e_eps(epsilon, sensitivity):
    a = geo.geometric_alpha(epsilon, sensitivity)
    kmax = int(60 * sensitivity / epsilon) + 50  # tail mass a^kmax < 1e-25
    k = np.arange(-kmax, kmax + 1)
    pmf = geo.geometric_pmf(k, epsilon, sensitivity)
    assert math.isclose(pmf.sum(), 1.0, rel_tol=1e-12)
    np.testing.assert_allclose(pmf, pmf[::-1], rtol=1e-15)
    # Closed form (1 - a)/(1 + a) a^|k|.
    np.testing.assert_allclose(pmf, (1 - a) / (1 + a) * a ** np.abs(k), rtol=1e-12)
    # The privacy loss between outputs Delta apart: P(k)/P(k + Delta) = e^eps for k >= 0.
    kk = np.arange(0, 40)
    ratio = np.exp(geo.geometric_log_pmf(kk, epsilon, sensitivity)
                   - geo.geometric_log_pmf(kk + sensitivity, epsilon, sensitivity))
    np.testing.assert_allclose(np.log(ratio), epsilon, rtol=1e-12)
    # ... and never more than e^eps for any shift of at most Delta.
    kk = np.arange(-200, 200)
    for shift in range(-sensitivity, sensitivity + 1):
        lr = (geo.geometric_log_pmf(kk, epsilon, sensitivity)
              - geo.geometric_log_pmf(kk + shift, epsilon, sensitivity))
        assert np.max(np.abs(lr)) <= epsilon * (1 + 1e-12)
    # Variance from the pmf equals 2a/(1-a)^2.
    var = float(np.sum(pmf * k.astype(float) ** 2))
    assert math.isclose(var, geo.geometric_variance(epsilon, sensitivity), rel_tol=1e-9)
    assert math.isclose(var, 2 * a / (1 - a) ** 2, rel_tol=1e-9)


def test_sampler_matches_pmf_chi_square():
    rng = np.random.default_rng(1234)
    epsilon, sensitivity = 1.0, 2
    n = 200_000
    z = geo.geometric_noise(rng, epsilon, sensitivity, size=n)
    assert z.dtype == np.int64 and z.shape == (n,)
    # Bins: every integer in [-K, K] with expected count >= 20, plus the two tails.
    a = geo.geometric_alpha(epsilon, sensitivity)
    K = 0
    while n * geo.geometric_pmf(np.array([K + 1]), epsilon, sensitivity)[0] >= 20:
        K += 1
    k = np.arange(-K, K + 1)
    p_mid = geo.geometric_pmf(k, epsilon, sensitivity)
    tail = (1 - p_mid.sum()) / 2  # = a^(K+1)/(1+a) each side
    assert math.isclose(tail, a ** (K + 1) / (1 + a), rel_tol=1e-9)
    expected = n * np.concatenate([[tail], p_mid, [tail]])
    observed = np.concatenate([[np.sum(z < -K)],
                               np.bincount(z[np.abs(z) <= K] + K, minlength=2 * K + 1),
                               [np.sum(z > K)]])
    chi2, pval = stats.chisquare(observed, expected)
    assert pval > 1e-4, (chi2, pval)
    # Moments: mean 0 and variance 2a/(1-a)^2, within 5 standard errors.
    var = geo.geometric_variance(epsilon, sensitivity)
    assert abs(z.mean()) < 5 * math.sqrt(var / n)
    # Var of the sample variance ~ (mu4 - var^2)/n; mu4 from the exact pmf.
    kk = np.arange(-2000, 2001)
    mu4 = float(np.sum(geo.geometric_pmf(kk, epsilon, sensitivity) * kk.astype(float) ** 4))
    assert abs(z.var() - var) < 5 * math.sqrt((mu4 - var**2) / n)
    # Symmetry: P(Z > 0) = P(Z < 0) within 5 standard errors of the difference.
    diff = np.mean(z > 0) - np.mean(z < 0)
    assert abs(diff) < 5 * math.sqrt(2 * a / (1 + a) / n)  # Var(1[Z>0] - 1[Z<0]) = P(Z != 0)


def test_small_epsilon_large_sensitivity_variance():
    # The unigram setting of Koga et al.: eps0 = 0.8, Delta = 50 -> std ~ 88 per coordinate.
    rng = np.random.default_rng(7)
    n = 100_000
    z = geo.geometric_noise(rng, 0.8, 50, size=n)
    var = geo.geometric_variance(0.8, 50)
    assert 80 < math.sqrt(var) < 95
    assert abs(z.var() / var - 1) < 0.03  # sd of the ratio ~ sqrt(5/n) ~ 0.007


def test_dp_event_and_epsilon():
    event = geo.geometric_dp_event(0.8, 50)
    assert isinstance(event, dp_event.DiscreteLaplaceDpEvent)
    assert event.sensitivity == 50
    assert math.isclose(event.noise_parameter, 0.8 / 50)
    assert math.isclose(geo.geometric_epsilon(event), 0.8)
    # The event's documented pmf exp(-t|x|) tanh(t/2) is ours.
    k = np.arange(-30, 31)
    t = event.noise_parameter
    np.testing.assert_allclose(geo.geometric_pmf(k, 0.8, 50),
                               np.exp(-t * np.abs(k)) * np.tanh(t / 2), rtol=1e-12)
    # The PLD accountant agrees: delta(eps0) ~ 0 and eps(delta=1e-9) <= eps0.
    acc = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(event)
    assert acc.get_epsilon(1e-9) <= 0.8 + 1e-3
    assert acc.get_delta(0.8 + 1e-3) < 1e-9
    with pytest.raises(TypeError):
        geo.geometric_epsilon(dp_event.GaussianDpEvent(1.0))


def test_mechanism_and_errors():
    rng = np.random.default_rng(0)
    counts = np.array([5, 0, 7], dtype=np.int32)
    out = geo.geometric_mechanism(counts, rng, 1.0, 1)
    assert out.shape == (3,) and out.dtype == np.int64
    with pytest.raises(ValueError):
        geo.geometric_mechanism(np.array([0.5]), rng, 1.0, 1)
    for bad_eps in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            geo.geometric_noise(rng, bad_eps, 1)
    for bad_sens in (0, -2, 1.5, True):
        with pytest.raises(ValueError):
            geo.geometric_alpha(1.0, bad_sens)
    with pytest.raises(ValueError):
        geo.geometric_pmf(np.array([0.5]), 1.0)
