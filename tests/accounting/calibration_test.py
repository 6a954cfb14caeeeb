"""Tests for `dp_ftrl_tff.accounting.calibration`: round trips target -> sigma -> target, and the
calibrated sigma checked against an independent dp_accounting (or closed-form) computation: it meets
the target, and 0.1% less noise does not."""

import math

import dp_accounting
import pytest
from scipy import stats

from dp_ftrl_tff.accounting import calibration, zcdp, zcdp_epsilon
from dp_ftrl_tff.mechanisms import gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit


def _independent_epsilon(sigma, sens_sq, delta, conversion):
  """epsilon of one Gaussian with noise multiplier sigma / sens, straight from dp_accounting."""
  if conversion == 'pld':
    accountant = dp_accounting.pld.PLDAccountant()  # default: add-or-remove, discretization 1e-4
  else:
    accountant = dp_accounting.rdp.RdpAccountant(orders=zcdp_epsilon.TF_PRIVACY_RDP_ORDERS)
  accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma / math.sqrt(sens_sq)))
  return accountant.get_epsilon(delta)


def _meets(sigma, sens_sq, epsilon, delta, conversion):
  """Whether sigma gives (epsilon, delta)-DP, computed without `zcdp` or `calibration`."""
  if conversion != 'gaussian':
    return _independent_epsilon(sigma, sens_sq, delta, conversion) <= epsilon
  mu = math.sqrt(sens_sq) / sigma  # exact Gaussian tradeoff (Balle & Wang 2018, Thm. 8)
  curve = (stats.norm.cdf(-epsilon / mu + mu / 2)
           - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2))
  return curve <= delta


@pytest.mark.parametrize('target_rho, sens_sq', [(1e-3, 1.0), (0.15, 0.6), (0.8, 79.0), (5.0, 3.0)])
def test_rho_round_trip(target_rho, sens_sq):
  sigma = calibration.noise_multiplier_for_rho(target_rho, sens_sq)
  assert zcdp.rho_from_sensitivity(sens_sq, sigma) == pytest.approx(target_rho, rel=1e-12)


@pytest.mark.parametrize('conversion', ['pld', 'gaussian', 'rdp'])
@pytest.mark.parametrize('target_epsilon, delta', [(0.5, 1e-10), (3.0, 1e-10), (8.0, 1e-6)])
def test_epsilon_round_trip(conversion, target_epsilon, delta):
  sigma = calibration.noise_multiplier_for_epsilon(target_epsilon, 21.0, delta, conversion)
  rho = zcdp.rho_from_sensitivity(21.0, sigma)
  epsilon = zcdp_epsilon.epsilon_from_rho(rho, delta, conversion)
  assert epsilon <= target_epsilon  # never understated
  assert epsilon == pytest.approx(target_epsilon, rel=1e-6)
  # Independent: the calibrated sigma meets the target, 0.1% less noise does not.
  assert _meets(sigma, 21.0, target_epsilon, delta, conversion)
  assert not _meets(sigma * (1 - 1e-3), 21.0, target_epsilon, delta, conversion)


def test_colab_epsilon_recovers_the_colab_noise_multiplier():
  # es-ES: sens^2 0.6 and epsilon 3.4240074094281336 came from sigma = 1.411 (PLD, delta 1e-10).
  sigma = calibration.noise_multiplier_for_epsilon(3.4240074094281336, 0.6, 1e-10)
  assert sigma == pytest.approx(1.411, rel=1e-9)
  assert _meets(sigma, 0.6, 3.4240074094281336, 1e-10, 'pld')
  assert not _meets(sigma * (1 - 1e-6), 0.6, 3.4240074094281336, 1e-10, 'pld')


def test_gboard_rounded_rho_recovers_paper_epsilon():
  rho = calibration.rho_for_epsilon(4.492218378173317, 1e-10)
  assert rho == pytest.approx(0.25, rel=1e-6)
  assert zcdp_epsilon.epsilon_from_rho(rho, 1e-10) <= 4.492218378173317


@pytest.mark.parametrize('call, name', [
    (lambda: calibration.noise_multiplier_for_rho(0.0, 1.0), 'target_rho'),
    (lambda: calibration.noise_multiplier_for_rho(1.0, -1.0), 'sensitivity_squared'),
    (lambda: calibration.rho_for_epsilon(-1.0), 'target_epsilon'),
    (lambda: calibration.rho_for_epsilon(1.0, 2.0), 'delta'),
    (lambda: calibration.rho_for_epsilon(1.0, 1e-6, 'zcdp'), 'conversion'),
    (lambda: calibration.noise_multiplier_for_epsilon(1.0, 0.0), 'sensitivity_squared'),
    (lambda: zcdp_epsilon.make_accountant('gaussian'), 'conversion')])
def test_rejects_bad_input(call, name):
  with pytest.raises(ValueError, match=name):
    call()


@pytest.mark.parametrize('target, fragment', [
    (1e-5, r'`target_epsilon`=1e-05 is below 0\.001'),
    (1e-300, r'`target_epsilon`=1e-300 is below 0\.001'),
])
def test_a_target_epsilon_below_the_discretization_is_refused(target, fragment):
  for conversion in ('pld', 'gaussian'):
    with pytest.raises(ValueError, match=fragment):
      calibration.noise_multiplier_for_epsilon(target, 1.0, conversion=conversion)


@pytest.mark.slow  # about 40 s: PLDs of rho near the accountant's limit
def test_the_largest_target_calibrates_within_the_accountant_limit():
  largest = calibration.max_epsilon(1e-10)
  sigma = calibration.noise_multiplier_for_epsilon(largest, 1.0)
  assert zcdp.rho_from_sensitivity(1.0, sigma) <= zcdp_epsilon.MAX_RHO


def test_the_smallest_target_calibrates():
  assert calibration.noise_multiplier_for_epsilon(calibration.MIN_TARGET_EPSILON, 1.0) > 0


def test_a_target_rho_above_the_pld_range_calibrates():
  """Its report states the flagged zCDP bound; the calibration itself is the closed form."""
  assert calibration.noise_multiplier_for_rho(1e6, 2.0) == math.sqrt(2.0 / 2e6)
  with pytest.raises(ValueError, match='`target_rho` must be finite'):
    calibration.noise_multiplier_for_rho(math.inf, 1.0)


@pytest.mark.parametrize('target', [200.0, 1000.0, 1e6])
@pytest.mark.parametrize('conversion', ['pld', 'zcdp_bound'])
def test_a_target_epsilon_above_the_pld_range_is_met_on_the_zcdp_bound(target, conversion):
  """Above `max_epsilon` (189 at delta 1e-10) a 'pld' calibration meets the target on the zCDP
  bound, the figure the report states there: the calibrated run's guarantee is the flagged bound,
  at most the target, and 0.1% less noise exceeds it. Bun & Steinke's bound, computed here, is
  never below it."""
  sens_sq = 3.0
  assert target > calibration.max_epsilon(1e-10)
  sigma = calibration.noise_multiplier_for_epsilon(target, sens_sq, 1e-10, conversion)
  one_release = participation_lib.ParticipationSchema(min_sep=1)
  strategy = gaussian.GaussianStrategy()  # sens^2 = 1 per round: 3 rounds give sens^2 = 3
  guarantee = zcdp.guarantee(strategy, 3, one_release, sigma)
  assert guarantee.sensitivity_squared == sens_sq and guarantee.epsilon_is_zcdp_bound
  assert guarantee.epsilon <= target
  assert zcdp.guarantee(strategy, 3, one_release, sigma * 0.999).epsilon > target
  rho = sens_sq / (2 * sigma**2)
  assert rho + 2 * math.sqrt(rho * math.log(1e10)) >= guarantee.epsilon


def test_a_subnormal_delta_is_refused_naming_it():
  assert calibration.max_epsilon(calibration.MIN_DELTA) > 600  # the smallest normal float64 works
  with pytest.raises(ValueError, match=r'`delta`=9.99989e-321 is below 2.23e-308'):
    calibration.noise_multiplier_for_epsilon(1.0, 10.0, 1e-320)


def test_a_target_rho_needing_more_noise_than_a_plan_takes_names_the_target():
  assert calibration.noise_multiplier_for_rho(1e-200, 1.0) == pytest.approx(math.sqrt(0.5e200))
  with pytest.raises(ValueError, match=r'`target_rho`=1e-201 needs a noise multiplier .* above '
                     r'1e\+100 .* use a `target_rho` of at least 5e-201'):
    calibration.noise_multiplier_for_rho(1e-201, 1.0)
  with pytest.raises(ValueError, match=r'`target_rho`=9.99989e-321'):
    calibration.noise_multiplier_for_rho(1e-320, 1.0)
