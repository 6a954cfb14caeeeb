"""Noise calibration: the noise multiplier that meets a target rho-zCDP or a target (epsilon, delta).

Target rho: rho = sens^2 / (2 sigma^2) inverts in closed form, sigma = sqrt(sens^2 / (2 rho)).
(dp_accounting's `calibrate_dp_mechanism` only meets (epsilon, delta) targets and dp_accounting has
no zCDP accountant, so this stays the closed form.)

Target (epsilon, delta): `dp_accounting.calibrate_dp_mechanism` searches sigma on exactly the
accountant and event `zcdp_epsilon.epsilon_from_rho` uses ('pld' or 'rdp' from
`zcdp_epsilon.make_accountant`, composed once with `zcdp_epsilon.gaussian_event(rho)`,
rho = sens^2 / (2 sigma^2)). It returns a sigma whose epsilon does not exceed the target (it checks
the root and steps to the safe side), within `_RTOL` relative of the smallest such sigma. Its
bracket starts at the exact Gaussian tradeoff curve's root: PLD (pessimistic) and RDP epsilons are
upper bounds on the exact one, so a slightly smaller sigma is always over the target.

The 'gaussian' conversion (exact tradeoff curve) has no dp_accounting accountant, hence no
`calibrate_dp_mechanism` for it: its root is found here with scipy's brentq in log sigma, then stepped
to the safe side the same way. Noise multipliers are relative to the clip norm; sensitivities are
computed with clip norm 1.

Beyond the PLD: a target epsilon above `max_epsilon(delta)` (the PLD epsilon at rho-zCDP
`zcdp_epsilon.MAX_RHO`, about 189 at delta 1e-10) is met on the zCDP conversion bound
(`zcdp_epsilon.zcdp_epsilon_bound`, the figure the report states there, flagged as an upper bound):
the largest rho whose bound is <= the target (brentq in log rho), stepped to the safe side. So is
any target with the 'zcdp_bound' conversion. A target rho may be any positive number whose noise
multiplier a plan takes. No target is refused for the accountant's memory.

Bounds: a target epsilon is at least `MIN_TARGET_EPSILON` and finite; a target outside is a ValueError
naming `target_epsilon` (or `target_rho`) with the bound, never an unbounded search.
"""

import dataclasses
import math
import sys
from typing import Optional

import dp_accounting
import scipy.optimize

from dp_ftrl_tff import _validation, plan_checks, stopping
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import zcdp, zcdp_epsilon

#: Relative tolerance on sigma: the calibrated sigma is at most this much above the smallest sigma
#: that meets the target.
_RTOL = 1e-10

#: Start of the search bracket below the exact-Gaussian root (epsilon is well over the target there).
_BRACKET = 1e-3

#: The smallest target epsilon: ten steps of the PLD's value discretization (1e-4, dp_accounting's
#: default). Below it the pessimistic rounding (up to one step) dominates the target: at 1e-4
#: dp_accounting's calibration finds no root, at 1e-5 it returns 5000 times the noise needed.
MIN_TARGET_EPSILON = 1e-3


def max_epsilon(delta: float = zcdp_epsilon.DEFAULT_DELTA) -> float:
  """The largest target epsilon at `delta` that calibration meets on the PLD: the exact-Gaussian
  epsilon of rho = `zcdp_epsilon.MAX_RHO` (about 189 at delta 1e-10, 159 at 1e-5). The PLD's epsilon
  is above the exact one, so the calibrated rho stays within `zcdp_epsilon.MAX_RHO`; a larger target
  is met on the zCDP bound (see the module docstring)."""
  return zcdp_epsilon.epsilon_from_rho(zcdp_epsilon.MAX_RHO, delta, 'gaussian')


#: The smallest delta a calibration takes: float64's smallest normal number (about 2.2e-308). Below
#: it delta is subnormal, and the Gaussian tail of `max_epsilon` loses its digits (scipy's root
#: finder did not converge at 1e-310); the PLD accountant resolves deltas down to about 1e-15 anyway.
MIN_DELTA = sys.float_info.min


def check_delta(delta) -> float:
  """`delta` as float; a ValueError naming it unless it lies in [`MIN_DELTA`, 1)."""
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                           high_inclusive=False)
  if delta < MIN_DELTA:
    raise ValueError(f'`delta`={delta:g} is below {MIN_DELTA:.3g}, float64\'s smallest normal '
                     'number, the smallest delta a calibration takes (a subnormal delta has too few '
                     'digits for its Gaussian tail).')
  return delta


def check_target_epsilon(target_epsilon, delta) -> float:
  """`target_epsilon` as float; a ValueError naming it unless it is finite and at least
  `MIN_TARGET_EPSILON` (a ValueError naming `delta` unless it passes `check_delta`)."""
  check_delta(delta)
  epsilon = _validation.check_positive_float(target_epsilon, 'target_epsilon')
  if epsilon < MIN_TARGET_EPSILON:
    raise ValueError(f'`target_epsilon`={epsilon:g} is below {MIN_TARGET_EPSILON:g}, ten steps of '
                     'the PLD accountant\'s 1e-4 discretization, whose rounding would dominate it.')
  if not math.isfinite(epsilon):
    raise ValueError(f'`target_epsilon` must be finite, got {epsilon!r}.')
  return epsilon


def check_pld_target_epsilon(target_epsilon, delta) -> float:
  """`check_target_epsilon`, and a ValueError naming `target_epsilon` above `max_epsilon(delta)`:
  for the amplified calibrations (`amplification.amplified_noise_multiplier`, band selection), whose
  only accountant is the PLD of a composition (no zCDP bound of a subsampled composition here)."""
  epsilon = check_target_epsilon(target_epsilon, delta)
  largest = max_epsilon(delta)
  if epsilon > largest:
    raise ValueError(f'`target_epsilon`={epsilon:g} is above {largest:.4g}, the largest epsilon at '
                     f'delta {delta:g} that the amplified calibration meets (rho-zCDP '
                     f'{zcdp_epsilon.MAX_RHO:g}, beyond which its PLD would not fit in memory); '
                     'give a smaller target, or calibrate without amplification (any target).')
  return epsilon


def _check_target_rho(target_rho) -> float:
  rho = _validation.check_positive_float(target_rho, 'target_rho')
  if not math.isfinite(rho):
    raise ValueError(f'`target_rho` must be finite, got {rho!r}.')
  return rho


def noise_multiplier_for_rho(target_rho: float, sensitivity_squared: float) -> float:
  """sigma = sqrt(sens^2 / (2 rho)): the noise multiplier that gives exactly `target_rho` (> 0,
  finite; above `zcdp_epsilon.MAX_RHO` the report's epsilon is the zCDP bound)."""
  rho = _check_target_rho(target_rho)
  sens_sq = _validation.check_positive_float(sensitivity_squared, 'sensitivity_squared')
  return _noise_multiplier_for_rho(rho, sens_sq)


def _noise_multiplier_for_rho(rho: float, sens_sq: float) -> float:
  """sqrt(sens^2 / (2 rho)); a ValueError naming `target_rho` when it exceeds the largest noise
  multiplier a plan takes (`plan_checks.MAX_NOISE_MULTIPLIER`)."""
  largest = plan_checks.MAX_NOISE_MULTIPLIER
  if rho < sens_sq / (2.0 * largest**2):  # also where sens^2 / (2 rho) overflows
    raise ValueError(f'`target_rho`={rho:g} needs a noise multiplier sqrt(sens^2 / (2 rho)) above '
                     f'{largest:g} (sens^2 = {sens_sq:.4g}), the largest a plan takes; use a '
                     f'`target_rho` of at least {sens_sq / (2.0 * largest**2):.3g}.')
  return math.sqrt(sens_sq / (2.0 * rho))


def _check_epsilon_target(target_epsilon, delta, conversion) -> float:
  _validation.check_positive_float(target_epsilon, 'target_epsilon')
  _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                   high_inclusive=False)
  _validation.check_one_of(conversion, 'conversion', zcdp_epsilon.CONVERSIONS)
  return check_target_epsilon(target_epsilon, delta)


def _epsilon(sens_sq: float, sigma: float, delta: float, conversion: str) -> float:
  return zcdp_epsilon.epsilon_from_rho(zcdp.rho_from_sensitivity(sens_sq, sigma), delta, conversion)


def _noise_multiplier_on_gaussian_curve(epsilon: float, sens_sq: float, delta: float) -> float:
  """The smallest sigma (to `_RTOL`) whose exact-Gaussian epsilon is <= `epsilon` (brentq)."""
  def gap(log_sigma):
    return _epsilon(sens_sq, math.exp(log_sigma), delta, 'gaussian') - epsilon

  # The zCDP bound eps <= rho + 2 sqrt(rho log(1/delta)) meets the target at rho_low, so that sigma
  # is always enough; widen geometrically in case of rounding at either end.
  log_term = math.log(1.0 / delta)
  # (sqrt(L + eps) - sqrt(L))^2, in a form that does not cancel to 0 for a small eps.
  rho_low = (epsilon / (math.sqrt(log_term + epsilon) + math.sqrt(log_term)))**2
  high = 0.5 * math.log(sens_sq / (2.0 * rho_low))
  low = high - 1.0
  while gap(low) <= 0:
    low -= 1.0
  while gap(high) > 0:
    high += 1.0
  xtol = _RTOL / 4
  log_sigma = scipy.optimize.brentq(gap, low, high, xtol=xtol, maxiter=500)
  while gap(log_sigma) > 0:  # brentq's root lies within 2 xtol of the sign change: a step or two
    log_sigma = min(log_sigma + xtol, high)
  return math.exp(log_sigma)


def _noise_multiplier_on_zcdp_bound(epsilon: float, sens_sq: float, delta: float) -> float:
  """The smallest sigma (to `_RTOL`) whose `zcdp_epsilon.zcdp_epsilon_bound` is <= `epsilon`: the
  largest rho under the bound's root (brentq in log rho), stepped to the safe side. Above
  `zcdp_epsilon.MAX_RHO` the report states this bound; below it, the PLD epsilon, which the bound
  exceeds."""
  def gap(log_rho):
    stopping.check()
    return zcdp_epsilon.zcdp_epsilon_bound(math.exp(log_rho), delta) - epsilon

  # Bun & Steinke's bound, which `zcdp_epsilon_bound` never exceeds, meets the target at rho_low
  # ((sqrt(L + eps) - sqrt(L))^2, written not to cancel): rho_low is feasible. The bound is at least
  # about rho, so rho = 2 eps is over the target; widen in case of rounding.
  log_term = math.log(1.0 / delta)
  low = math.log((epsilon / (math.sqrt(log_term + epsilon) + math.sqrt(log_term)))**2)
  high = math.log(2.0 * epsilon)
  while gap(low) > 0:
    low -= 1.0
  while gap(high) <= 0:
    high += 1.0
  log_rho = scipy.optimize.brentq(gap, low, high, xtol=_RTOL / 4, maxiter=500)
  sigma = _noise_multiplier_for_rho(math.exp(log_rho), sens_sq)
  # The plan recomputes rho from sigma: step sigma up until that rho's bound meets the target.
  while zcdp_epsilon.zcdp_epsilon_bound(zcdp.rho_from_sensitivity(sens_sq, sigma), delta) > epsilon:
    sigma *= 1.0 + _RTOL / 4
  return sigma


def noise_multiplier_for_epsilon(target_epsilon: float, sensitivity_squared: float,
                                 delta: float = zcdp_epsilon.DEFAULT_DELTA,
                                 conversion: str = 'pld') -> float:
  """The noise multiplier (relative to the clip norm) that meets `target_epsilon` at `delta`.

  Args:
    target_epsilon: at least `MIN_TARGET_EPSILON`, finite.
    sensitivity_squared: sens^2 > 0 of the whole run (clip norm 1).
    delta: in (0, 1).
    conversion: 'pld', 'gaussian', 'rdp' or 'zcdp_bound' (see `zcdp_epsilon.epsilon_from_rho`). With
      'pld', a target above `max_epsilon(delta)` is met on the zCDP bound, the figure the report
      states beyond `zcdp_epsilon.MAX_RHO`.

  Returns:
    sigma with epsilon(sigma) <= `target_epsilon` (never above it), at most `_RTOL` relative above
    the smallest such sigma.
  """
  epsilon = _check_epsilon_target(target_epsilon, delta, conversion)
  sens_sq = _validation.check_positive_float(sensitivity_squared, 'sensitivity_squared')
  return _noise_multiplier_for_epsilon(epsilon, sens_sq, delta, conversion)


def _noise_multiplier_for_epsilon(epsilon: float, sens_sq: float, delta: float,
                                  conversion: str) -> float:
  """`noise_multiplier_for_epsilon` of checked arguments."""
  if conversion == zcdp_epsilon.ZCDP_BOUND or (conversion == 'pld' and
                                               epsilon > max_epsilon(delta)):
    return _noise_multiplier_on_zcdp_bound(epsilon, sens_sq, delta)
  sigma_gaussian = _noise_multiplier_on_gaussian_curve(epsilon, sens_sq, delta)
  if conversion == 'gaussian':
    return sigma_gaussian
  return calibrate(
      make_fresh_accountant=lambda: zcdp_epsilon.make_accountant(conversion),
      make_event_from_param=lambda sigma: zcdp_epsilon.gaussian_event(
          zcdp.rho_from_sensitivity(sens_sq, sigma)),
      target_epsilon=epsilon, target_delta=delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(
          lower_endpoint=sigma_gaussian * (1.0 - _BRACKET),
          initial_guess=sigma_gaussian * (1.0 + _BRACKET)),
      tol=_RTOL * sigma_gaussian, accountant=conversion)


def calibrate(*, accountant: str, **kwargs) -> float:
  """`dp_accounting.calibrate_dp_mechanism(**kwargs)` as a float; its failures (no bracket within
  2^30 of the guess, no root: the `accountant`'s epsilon never reaches the target) are a ValueError
  naming `target_epsilon`. Each accountant evaluation is a stop point (`dp_ftrl_tff.stopping`)."""
  make_event = kwargs.pop('make_event_from_param')

  def make_event_from_param(param):
    stopping.check()
    return make_event(param)

  try:
    return float(dp_accounting.calibrate_dp_mechanism(make_event_from_param=make_event_from_param,
                                                      **kwargs))
  except (dp_accounting.mechanism_calibration.NoBracketIntervalFoundError,
          dp_accounting.mechanism_calibration.NoOptimumFoundError) as e:
    raise ValueError(f'`target_epsilon`={kwargs["target_epsilon"]:g} at delta '
                     f'{kwargs["target_delta"]:g} is not reachable with the {accountant} '
                     f'accountant ({e}); give a larger target.') from e


def rho_for_epsilon(target_epsilon: float, delta: float = zcdp_epsilon.DEFAULT_DELTA,
                    conversion: str = 'pld') -> float:
  """The largest rho (to `_RTOL`) whose single-Gaussian epsilon at `delta` is <= `target_epsilon`.

  The calibrated noise multiplier at sensitivity 1, as rho = 1 / (2 sigma^2).

  Args:
    target_epsilon: at least `MIN_TARGET_EPSILON`, finite.
    delta: in (0, 1).
    conversion: see `noise_multiplier_for_epsilon`.
  """
  _check_epsilon_target(target_epsilon, delta, conversion)
  return zcdp.rho_from_sensitivity(1.0, noise_multiplier_for_epsilon(target_epsilon, 1.0, delta,
                                                                     conversion))


def calibrate_plan(plan: plan_lib.RunPlan, *, target_epsilon: Optional[float] = None,
                   target_rho: Optional[float] = None,
                   sensitivity_squared: Optional[float] = None) -> plan_lib.RunPlan:
  """`plan` with the noise multiplier that meets one target, recorded in its `calibration`.

  The sensitivity is the plan's strategy over its rounds, restarts and declared participation
  (`zcdp.planned_sensitivity_squared`), or `sensitivity_squared` when given (a report of a finished
  run passes `zcdp.plan_sensitivity_squared` of the participation realized in its log). A
  (epsilon, delta) target is met at the plan's `target_delta` (`zcdp_epsilon.DEFAULT_DELTA` without
  one), never exceeded (`noise_multiplier_for_epsilon`).

  Args:
    plan: the `RunPlan` (its noise multiplier is replaced).
    target_epsilon, target_rho: exactly one: a finite target epsilon of at least
      `MIN_TARGET_EPSILON` (above `max_epsilon(delta)` met on the zCDP bound) or a finite target
      rho > 0.
    sensitivity_squared: sens^2 > 0 of the run to calibrate for (clip norm 1), or None.
  """
  if (target_epsilon is None) == (target_rho is None):
    raise ValueError('Exactly one of `target_epsilon`, `target_rho` must be given.')
  delta = zcdp_epsilon.DEFAULT_DELTA if plan.target_delta is None else plan.target_delta
  if target_rho is None:
    target, name = check_target_epsilon(target_epsilon, delta), 'target_epsilon'
  else:
    target, name = _check_target_rho(target_rho), 'target_rho'
  if sensitivity_squared is None:
    sens_sq = zcdp.planned_sensitivity_squared(plan)
  else:
    sens_sq = _validation.check_positive_float(sensitivity_squared, 'sensitivity_squared')
  if not sens_sq > 0:
    raise ValueError(f'`sensitivity_squared` must be positive, got {sens_sq!r}.')
  if name == 'target_rho':
    sigma = _noise_multiplier_for_rho(target, sens_sq)
  else:
    sigma = _noise_multiplier_for_epsilon(target, sens_sq, delta, 'pld')
  return dataclasses.replace(plan, noise_multiplier=sigma, calibration={name: target})
