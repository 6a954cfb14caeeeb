"""Tests for `dp_ftrl_tff.auditing.estimates`: the one-shot estimate against dp_accounting and
numerical integration, MIN_SEEN_CANARIES, input validation."""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

from dp_ftrl_tff.accounting import zcdp_epsilon
from dp_ftrl_tff.auditing import estimates, one_run, threshold_bounds

pytestmark = pytest.mark.unit


def _exact_sample(seed: int, size: int, mean: float, std: float) -> np.ndarray:
  """Random draws standardized so the sample mean and std (ddof=1) are exactly `mean` and `std`."""
  draws = np.random.default_rng(seed).normal(size=size)
  return (draws - draws.mean()) / draws.std(ddof=1) * std + mean


def _pld_epsilon(mu: float, delta: float) -> float:
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / mu), 1)
  return accountant.get_epsilon(delta)


@pytest.mark.parametrize('mu,delta', [(0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-3), (4.0, 1e-10),
                                      (3.0, 1e-6)])
def test_equal_variances_match_the_gaussian_mechanism(mu, delta):
  seen, unseen = _exact_sample(1, 50, mu, 1.0), _exact_sample(2, 70, 0.0, 1.0)
  estimate = estimates.estimate_epsilon(seen, unseen, delta)
  # The PLD accountant discretizes the loss pessimistically in steps of 1e-4: it is above the exact
  # value by at most about one step.
  pld = _pld_epsilon(mu, delta)
  assert pld - 2e-4 <= estimate <= pld + 1e-9
  assert estimate == pytest.approx(
      zcdp_epsilon.epsilon_from_rho(mu**2 / 2, delta, 'gaussian'), rel=1e-9)


def test_scale_and_shift_invariant_and_symmetric():
  seen, unseen = _exact_sample(1, 30, 1.5, 1.0), _exact_sample(2, 30, 0.0, 1.3)
  epsilon = estimates.estimate_epsilon(seen, unseen, 1e-5)
  assert estimates.estimate_epsilon(unseen, seen, 1e-5) == pytest.approx(epsilon, rel=1e-9)
  assert estimates.estimate_epsilon(3 * seen - 7, 3 * unseen - 7, 1e-5) == pytest.approx(
      epsilon, rel=1e-9)


def _hockey_stick_by_quadrature(epsilon, p, q):
  """H_eps(P || Q) = integral of max(0, p(x) - e^eps q(x)), by adaptive quadrature."""
  (m1, s1), (m0, s0) = p, q
  integrand = lambda x: max(0.0, scipy.stats.norm.pdf(x, m1, s1)  # noqa: E731
                            - math.exp(epsilon) * scipy.stats.norm.pdf(x, m0, s0))
  low, high = min(m1 - 40 * s1, m0 - 40 * s0), max(m1 + 40 * s1, m0 + 40 * s0)
  # Breakpoints at both means help quad find the narrow region where p > e^eps q.
  value, _ = scipy.integrate.quad(integrand, low, high, points=sorted({m0, m1}), limit=1000,
                                  epsabs=1e-14, epsrel=1e-10)
  return value


@pytest.mark.parametrize('mu,s1,s0,delta', [
    (1.0, 1.2, 1.0, 1e-3), (1.0, 0.8, 1.0, 1e-3), (2.0, 1.5, 0.7, 1e-4), (0.5, 3.0, 1.0, 1e-2),
    (3.0, 1.0, 1.05, 1e-5), (0.0, 2.0, 1.0, 1e-3)])
def test_unequal_variances_match_numerical_integration(mu, s1, s0, delta):
  seen, unseen = _exact_sample(3, 40, mu, s1), _exact_sample(4, 40, 0.0, s0)
  epsilon = estimates.estimate_epsilon(seen, unseen, delta)
  assert epsilon > 0
  p, q = (mu, s1), (0.0, s0)
  worst = max(_hockey_stick_by_quadrature(epsilon, p, q),
              _hockey_stick_by_quadrature(epsilon, q, p))
  assert worst == pytest.approx(delta, rel=1e-5)
  # Smallest such epsilon: slightly below it, some order exceeds delta.
  below = epsilon * (1 - 1e-3)
  assert max(_hockey_stick_by_quadrature(below, p, q),
             _hockey_stick_by_quadrature(below, q, p)) > delta


def test_far_apart_gaussians_do_not_underflow():
  # mu = 60: the hockey-stick tails are below 1e-300 in linear space near the root.
  seen, unseen = _exact_sample(5, 20, 60.0, 1.0), _exact_sample(6, 20, 0.0, 1.0)
  assert estimates.estimate_epsilon(seen, unseen, 1e-10) == pytest.approx(
      zcdp_epsilon.epsilon_from_rho(60.0**2 / 2, 1e-10, 'gaussian'), rel=1e-9)
  wide = _exact_sample(7, 20, 60.0, 1.5)
  assert math.isfinite(estimates.estimate_epsilon(wide, unseen, 1e-10))


def test_degenerate_samples():
  unseen = _exact_sample(8, 100, 0.0, 1.0)
  assert estimates.estimate_epsilon(np.ones(100), unseen, 1e-5) == math.inf  # noise multiplier 0
  assert estimates.estimate_epsilon(np.ones(5), np.zeros(5), 1e-5) == math.inf
  assert estimates.estimate_epsilon(np.ones(5), np.ones(7), 1e-5) == 0.0
  assert estimates.estimate_epsilon(unseen, unseen[::-1], 1e-5) == 0.0
  # Close Gaussians: H_0 <= delta gives 0.
  assert estimates.estimate_epsilon(_exact_sample(9, 50, 1e-7, 1.0), unseen, 1e-5) == 0.0


# --- Input validation -----------------------------------------------------------------------------


@pytest.mark.parametrize('seen,unseen,delta,name', [
    ([1.0], [0.0, 1.0], 1e-5, 'seen'), ([[1.0, 2.0]], [0.0, 1.0], 1e-5, 'seen'),
    ([1.0, math.nan], [0.0, 1.0], 1e-5, 'seen'), ('ab', [0.0, 1.0], 1e-5, 'seen'),
    ([1.0, 2.0], [], 1e-5, 'unseen'), ([1.0, 2.0], [0.0, math.inf], 1e-5, 'unseen'),
    ([1.0, 2.0], [0.0, 1.0], 0.0, 'delta'), ([1.0, 2.0], [0.0, 1.0], 1.0, 'delta'),
    ([1.0, 2.0], [0.0, 1.0], 'x', 'delta')])
def test_bad_arguments_name_the_parameter(seen, unseen, delta, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    estimates.estimate_epsilon(seen, unseen, delta)


def _ratios(num_canaries, trials=200):
  """Estimates over the accounted epsilon of a Gaussian mechanism that adds exactly the accounted
  noise (rho = 1: seen scores N(sqrt(2), 1), unseen N(0, 1)) at delta 1e-10, seeded."""
  accounted = zcdp_epsilon.epsilon_from_rho(1.0, 1e-10, 'gaussian')
  rng = np.random.default_rng(num_canaries)
  return np.array([estimates.estimate_epsilon(rng.normal(np.sqrt(2.0), 1.0, num_canaries),
                                              rng.normal(0.0, 1.0, num_canaries), 1e-10)
                   for _ in range(trials)]) / accounted


def test_min_seen_canaries_is_where_the_estimate_stops_being_off_by_a_factor():
  # The reason for MIN_SEEN_CANARIES (docs/auditing.md): below it the estimate of an exactly
  # accounted mechanism is typically far above the accounted epsilon, at it within 1.6x.
  at_minimum = _ratios(estimates.MIN_SEEN_CANARIES)
  assert np.median(at_minimum) < 1.6 and np.quantile(at_minimum, 0.975) < 3.0
  few = _ratios(10)  # the 2-9 seen canaries gave 590 and 3.4e4 against 9.6
  assert np.median(few) > 2.5 and np.quantile(few, 0.975) > 10
  # And a lower bound could show little: with the scores fully separated, at most the figures of
  # MIN_SEEN_CANARIES' comment.
  separated = (np.arange(50.0) + 1e3, np.arange(50.0))
  assert threshold_bounds.clopper_pearson_bound(*separated, 1e-10).epsilon == pytest.approx(
      1.81, abs=0.01)
  assert one_run.one_run_bound(*separated, 1e-10).epsilon == pytest.approx(2.98, abs=0.01)
