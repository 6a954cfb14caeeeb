"""Tests for `dp_ftrl_tff.auditing.gdp`: the closed forms of mu-GDP against direct evaluation of
Dong, Roth and Su's formulas and against dp_accounting's PLD of the Gaussian mechanism."""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.optimize
import scipy.stats

from dp_ftrl_tff.auditing import gdp

pytestmark = pytest.mark.unit


def _delta_direct(mu, epsilon):
  """delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2), evaluated plainly."""
  norm = scipy.stats.norm
  return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)


def test_the_issue_figure_mu_2_at_delta_1e_6_is_11():
  # Issue 46: mu = 2 GDP has epsilon 11.0 at delta 1e-6.
  epsilon = gdp.epsilon_for_delta(2.0, 1e-6)
  assert round(epsilon, 1) == 11.0
  # The closed form evaluated plainly gives delta 1e-6 there (float64 keeps ~10 digits of the
  # difference of two terms near 3e-6 and 2e-6).
  assert _delta_direct(2.0, epsilon) == pytest.approx(1e-6, rel=1e-8)


@pytest.mark.parametrize('mu,delta', [(0.5, 1e-5), (1.0, 1e-6), (2.0, 1e-6), (4.0, 1e-10),
                                      (3.0, 1e-3)])
def test_epsilon_matches_the_pld_of_the_gaussian_mechanism(mu, delta):
  # A Gaussian mechanism with sensitivity 1 and noise multiplier 1 / mu is exactly mu-GDP.
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / mu), 1)
  pld = accountant.get_epsilon(delta)
  # The PLD discretizes the loss pessimistically in steps of 1e-4: above the exact value by about
  # one step at most.
  assert pld - 2e-4 <= gdp.epsilon_for_delta(mu, delta) <= pld + 1e-9


@pytest.mark.parametrize('mu', [0.3, 1.0, 2.0, 5.0])
def test_delta_epsilon_and_mu_invert_each_other(mu):
  for delta in (1e-10, 1e-6, 1e-2):
    epsilon = gdp.epsilon_for_delta(mu, delta)
    assert gdp.delta_for_epsilon(mu, epsilon) == pytest.approx(delta, rel=1e-8)
    assert gdp.mu_for_epsilon(epsilon, delta) == pytest.approx(mu, rel=1e-8)
    if mu < 3:  # beyond, the plain form loses the difference of its two terms to rounding
      assert gdp.delta_for_epsilon(mu, epsilon) == pytest.approx(_delta_direct(mu, epsilon),
                                                                 rel=1e-6)


def test_tradeoff_is_the_gaussian_test():
  # G_mu(alpha) is the FNR of the threshold test of N(0, 1) vs N(mu, 1) with FPR alpha.
  alphas = np.array([0.0, 1e-6, 0.01, 0.3, 0.5, 0.9, 1.0])
  for mu in (0.0, 0.5, 2.0):
    thresholds = scipy.stats.norm.isf(alphas)
    np.testing.assert_allclose(gdp.tradeoff(mu, alphas),
                               scipy.stats.norm.cdf(thresholds, loc=mu), atol=1e-15)


def test_epsilon_is_zero_below_the_delta_of_epsilon_zero():
  # delta(0) = 2 Phi(mu / 2) - 1: a larger delta needs no epsilon.
  mu = 0.2
  delta_at_zero = 2 * scipy.stats.norm.cdf(mu / 2) - 1
  assert gdp.epsilon_for_delta(mu, delta_at_zero * 1.01) == 0.0
  assert gdp.epsilon_for_delta(mu, delta_at_zero * 0.99) > 0.0
  assert gdp.epsilon_for_delta(0.0, 1e-6) == 0.0
  assert gdp.delta_for_epsilon(0.0, 1.0) == 0.0


def test_mu_for_epsilon_solves_by_bisection():
  # An independent root of delta_direct(mu, 5) = 1e-5 in mu.
  root = scipy.optimize.bisect(lambda mu: _delta_direct(mu, 5.0) - 1e-5, 0.1, 5.0, xtol=1e-13)
  assert gdp.mu_for_epsilon(5.0, 1e-5) == pytest.approx(root, rel=1e-9)


@pytest.mark.parametrize('call,name', [
    (lambda: gdp.epsilon_for_delta(-1.0, 1e-6), 'mu'),
    (lambda: gdp.epsilon_for_delta(1.0, 0.0), 'delta'),
    (lambda: gdp.epsilon_for_delta(1.0, 1.0), 'delta'),
    (lambda: gdp.delta_for_epsilon(1.0, -0.5), 'epsilon'),
    (lambda: gdp.delta_for_epsilon(math.inf, 1.0), 'mu'),
    (lambda: gdp.mu_for_epsilon(-1.0, 1e-6), 'epsilon'),
    (lambda: gdp.mu_for_epsilon(1.0, 2.0), 'delta'),
    (lambda: gdp.tradeoff(1.0, 1.5), 'alpha'),
    (lambda: gdp.tradeoff(-1.0, 0.5), 'mu'),
])
def test_invalid_arguments_are_named(call, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    call()
