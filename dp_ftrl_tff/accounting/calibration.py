"""Noise calibration: the noise multiplier that meets a target rho-zCDP or a target (epsilon, delta).

rho = sens^2 / (2 sigma^2) inverts in closed form: sigma = sqrt(sens^2 / (2 rho)). A target
(epsilon, delta) is first turned into the largest rho whose single-Gaussian epsilon (see
`zcdp.epsilon_from_rho`) does not exceed it, found with scipy's brentq: epsilon(rho) is continuous and
increasing. For the PLD conversion the root is first located on the exact Gaussian curve (fast), then
refined on the PLD curve inside a narrow bracket, since the two differ by about 1e-7 relative.
Noise multipliers are relative to the clip norm; sensitivities are computed with clip norm 1.
"""

import math

import scipy.optimize

from dp_ftrl_tff import _validation
from dp_ftrl_tff.accounting import zcdp

_RTOL = 1e-12


def noise_multiplier_for_rho(target_rho: float, sensitivity_squared: float) -> float:
  """sigma = sqrt(sens^2 / (2 rho)): the noise multiplier that gives exactly `target_rho`."""
  rho = _validation.check_positive_float(target_rho, 'target_rho')
  sens_sq = _validation.check_positive_float(sensitivity_squared, 'sensitivity_squared')
  return math.sqrt(sens_sq / (2.0 * rho))


def _solve_log_rho(func, low: float, high: float) -> float:
  """Root of func(log rho) in [low, high], widening the bracket geometrically if needed."""
  while func(low) > 0:
    low -= 2.0
  while func(high) < 0:
    high += 2.0
  return scipy.optimize.brentq(func, low, high, xtol=1e-15, rtol=_RTOL, maxiter=500)


def rho_for_epsilon(target_epsilon: float, delta: float = zcdp.DEFAULT_DELTA,
                    conversion: str = 'pld') -> float:
  """The rho whose single-Gaussian epsilon at `delta` equals `target_epsilon` (to ~1e-12 relative).

  Args:
    target_epsilon: > 0.
    delta: in (0, 1).
    conversion: 'pld', 'gaussian' or 'rdp' (see `zcdp.epsilon_from_rho`).
  """
  epsilon = _validation.check_positive_float(target_epsilon, 'target_epsilon')
  _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                   high_inclusive=False)
  _validation.check_one_of(conversion, 'conversion', zcdp.CONVERSIONS)

  def gap(conv):
    return lambda log_rho: (zcdp.epsilon_from_rho(math.exp(log_rho), delta, conv) - epsilon) / epsilon

  # Start from the zCDP bound eps = rho + 2 sqrt(rho log(1/delta)), which under-estimates rho.
  log_term = math.log(1.0 / delta)
  rho_low = (math.sqrt(log_term + epsilon) - math.sqrt(log_term))**2
  log_rho = _solve_log_rho(gap('gaussian'), math.log(rho_low), math.log(rho_low) + 2.0)
  if conversion == 'gaussian':
    return math.exp(log_rho)
  return math.exp(_solve_log_rho(gap(conversion), log_rho - 1e-3, log_rho + 1e-3))


def noise_multiplier_for_epsilon(target_epsilon: float, sensitivity_squared: float,
                                 delta: float = zcdp.DEFAULT_DELTA,
                                 conversion: str = 'pld') -> float:
  """The noise multiplier (relative to the clip norm) that gives `target_epsilon` at `delta`."""
  sens_sq = _validation.check_positive_float(sensitivity_squared, 'sensitivity_squared')
  return noise_multiplier_for_rho(rho_for_epsilon(target_epsilon, delta, conversion), sens_sq)
