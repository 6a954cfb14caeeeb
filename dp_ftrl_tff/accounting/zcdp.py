"""The DP guarantee of a correlated-noise run without amplification: its rho-zCDP and
(epsilon, delta).

Without sampling, a whole training run of a matrix mechanism is ONE Gaussian release of C x with noise
std sigma * zeta per coordinate (BandMF paper Sec. 2-3, docs/papers.md#bandmf; accounting colab,
cell `privacy_accounting`, docs/papers.md#colab). With clip norm zeta = 1 and squared sensitivity
sens^2 (the mechanisms' own `sensitivity_squared`, never re-derived here):

  * effective noise multiplier  sigma_eff = sigma / sens;
  * rho-zCDP                    rho = sens^2 / (2 sigma^2) = 1 / (2 sigma_eff^2);
  * (epsilon, delta)            the conversions of `dp_ftrl_tff.accounting.zcdp_epsilon` (by default
                                dp_accounting's PLD; above its range an upper bound, flagged).

Conventions: rounds are 0-based; `min_sep` = b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1);
noise multipliers are relative to the clip norm (noise std sigma * zeta on the SUM of clipped updates).
Tree restarts are composed across segments by the tree module (exact, min-sep spanning segments); for
other strategies restarts are composed by adding per-segment worst cases (a valid upper bound).
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import zcdp_epsilon
from dp_ftrl_tff.mechanisms import base
from dp_ftrl_tff.mechanisms import participation as participation_lib


def rho_from_sensitivity(sensitivity_squared: float, noise_multiplier: float) -> float:
  """rho = sens^2 / (2 sigma^2) (clip norm 1, sigma relative to the clip norm); inf when it
  overflows float64."""
  sens_sq = _validation.check_nonnegative_float(sensitivity_squared, 'sensitivity_squared')
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  return _rho(sens_sq, sigma)


def _rho(sens_sq: float, sigma: float) -> float:
  """sens^2 / (2 sigma^2) in numpy float64: inf on overflow, 0 on underflow, never an exception
  (Python's sigma**2 raises OverflowError above 1.3e154 and ZeroDivisionError once it underflows)."""
  with np.errstate(over='ignore', under='ignore', divide='ignore'):
    return float(np.float64(sens_sq) / (2.0 * np.float64(sigma) * np.float64(sigma)))


def effective_noise_multiplier(sensitivity_squared: float, noise_multiplier: float) -> float:
  """sigma / sens: the noise multiplier of the equivalent single Gaussian mechanism (inf if sens=0)."""
  sens_sq = _validation.check_nonnegative_float(sensitivity_squared, 'sensitivity_squared')
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  return math.inf if sens_sq == 0 else sigma / math.sqrt(sens_sq)


def accounted_sensitivity_squared(strategy: base.Strategy, num_rounds: int,
                                  participation: participation_lib.ParticipationSchema,
                                  restart_rounds: Optional[Sequence[int]] = None) -> float:
  """Squared sensitivity (clip norm 1) of a whole run, restarts included.

  Without restarts: `strategy.sensitivity_squared(n, participation)`. With restarts (the noise state
  restarts at each round in `restart_rounds`, so C is block diagonal):
  `strategy.segments_sensitivity_squared` (exact for trees and DP-SGD, an upper bound otherwise).
  """
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a mechanisms Strategy, got {strategy!r}.')
  # Each segment must fit the strategy (a banded strategy restarted past its n rounds runs longer).
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if not isinstance(participation, participation_lib.ParticipationSchema):
    raise ValueError(f'`participation` must be a ParticipationSchema, got {participation!r}.')
  return _sensitivity_squared(strategy, base.segment_lengths(num_rounds, restart_rounds), participation)


def _sensitivity_squared(strategy: base.Strategy, lengths: Sequence[int],
                         participation: participation_lib.ParticipationSchema) -> float:
  if len(lengths) == 1:
    return float(strategy.sensitivity_squared(lengths[0], participation))
  return float(strategy.segments_sensitivity_squared(lengths, participation))


@dataclasses.dataclass(frozen=True)
class Guarantee:
  """The DP guarantee of one training run (clip norm 1; noise multipliers relative to the clip).

  Attributes:
    mechanism: the strategy's name ('gaussian', 'tree', 'tree_efficient', 'banded', 'blt', ...).
    num_rounds: n.
    participation: the `ParticipationSchema` the sensitivity was computed for.
    restart_rounds: 0-based rounds at which the noise restarts (empty: none).
    sensitivity_squared: sens^2 of the whole run.
    noise_multiplier: sigma, the accounted noise multiplier (relative to the clip norm).
    rho: sens^2 / (2 sigma^2).
    epsilon: at `delta`, with `conversion`.
    delta: the target delta.
    conversion: 'pld', 'gaussian', 'rdp', or 'zcdp_bound' where the PLD (or a plan's guarantee in
      any conversion) was asked for above `zcdp_epsilon.MAX_RHO`: then `epsilon` is
      `zcdp_epsilon.zcdp_epsilon_bound`, an upper bound, not a tight figure
      (`epsilon_is_zcdp_bound`).
  """
  mechanism: str
  num_rounds: int
  participation: participation_lib.ParticipationSchema
  restart_rounds: tuple
  sensitivity_squared: float
  noise_multiplier: float
  rho: float
  epsilon: float
  delta: float
  conversion: str = 'pld'

  @property
  def epsilon_is_zcdp_bound(self) -> bool:
    """True when `epsilon` is the zCDP conversion bound (an upper bound: rho above
    `zcdp_epsilon.MAX_RHO`)."""
    return self.conversion == zcdp_epsilon.ZCDP_BOUND

  @property
  def effective_noise_multiplier(self) -> float:
    """sigma / sens, the noise multiplier of the equivalent single Gaussian mechanism."""
    return effective_noise_multiplier(self.sensitivity_squared, self.noise_multiplier)


def guarantee(strategy: base.Strategy, num_rounds: int,
              participation: participation_lib.ParticipationSchema, noise_multiplier: float,
              delta: float = zcdp_epsilon.DEFAULT_DELTA, *,
              restart_rounds: Optional[Sequence[int]] = None, conversion: str = 'pld') -> Guarantee:
  """rho-zCDP and (epsilon, delta) of `strategy` run for `num_rounds` rounds (no amplification).

  Args:
    strategy: a `dp_ftrl_tff.mechanisms` Strategy.
    num_rounds: n >= 1.
    participation: the participation schema (declared, or realized from a log).
    noise_multiplier: sigma > 0, relative to the clip norm. With adaptive clipping pass the accounted
      z (see `dp_ftrl_tff.settings.inflated_noise_multiplier`), not the inflated value multiplier.
    delta: in (0, 1), default 1e-10.
    restart_rounds: 0-based rounds at which the noise state restarts (None: no restart).
    conversion: see `zcdp_epsilon.epsilon_from_rho`.

  Returns:
    A `Guarantee`. With the 'pld' conversion and a rho above `zcdp_epsilon.MAX_RHO`, its epsilon is
    `zcdp_epsilon.zcdp_epsilon_bound` and its conversion 'zcdp_bound' (the closed forms convert any
    rho: the DP-FTRL paper's RDP epsilon 363.66 has rho 248).
  """
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a mechanisms Strategy, got {strategy!r}.')
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  delta = zcdp_epsilon.check_delta(delta)
  _validation.check_one_of(conversion, 'conversion', zcdp_epsilon.CONVERSIONS)
  participation = participation_lib.check_participation(participation)
  restarts = base.check_restart_rounds(restart_rounds, num_rounds)
  return _guarantee(strategy, int(num_rounds), participation, sigma, delta,
                    base.segments_between(int(num_rounds), restarts), conversion)


def guarantee_for_plan(plan: plan_lib.RunPlan, num_rounds: Optional[int] = None,
                       participation: Optional[participation_lib.ParticipationSchema] = None,
                       conversion: str = 'pld') -> Guarantee:
  """The `Guarantee` of a run plan over `num_rounds` rounds (default: the plan's) under
  `participation` (default: the plan's declared one), at the plan's accounted noise multiplier,
  restarts and target delta (`zcdp_epsilon.DEFAULT_DELTA` when it has none); the plan was validated
  when it was built, so only what it lacks is checked here (`planned_guarantee`: the plan's own
  setting).

  Above `zcdp_epsilon.MAX_RHO` the guarantee's epsilon is `zcdp_epsilon.zcdp_epsilon_bound`
  (conversion 'zcdp_bound'), whatever the conversion asked for: a run's header and eval lines (a
  closed form) state the same figure as its report.

  Raises:
    ValueError: the plan adds no noise (it has no DP guarantee), or lacks the rounds or the
      participation and none is given.
  """
  num_rounds, participation = _plan_setting(plan, num_rounds, participation)
  return _plan_guarantee(plan, num_rounds, participation, plan.segments(num_rounds), conversion)


def planned_guarantee(plan: plan_lib.RunPlan, conversion: str = 'pld') -> Guarantee:
  """`guarantee_for_plan` of the plan's own rounds and declared participation, from the segments
  the plan carries (`RunPlan.planned_segments`)."""
  num_rounds, participation = _planned_setting(plan)
  return _plan_guarantee(plan, num_rounds, participation, plan.planned_segments, conversion)


def _plan_guarantee(plan: plan_lib.RunPlan, num_rounds: int,
                    participation: participation_lib.ParticipationSchema,
                    segments: base.Segments, conversion: str) -> Guarantee:
  if plan.noise_multiplier == 0:
    raise ValueError('`plan` has noise_multiplier 0: the run adds no noise and has no DP guarantee.')
  delta = zcdp_epsilon.DEFAULT_DELTA if plan.target_delta is None else plan.target_delta
  # Every conversion: a run's header (a closed form) must state the figure its report (the PLD, or
  # above `zcdp_epsilon.MAX_RHO` the zCDP bound) states.
  return _guarantee(plan.strategy, num_rounds, participation, plan.noise_multiplier, delta,
                    segments, conversion, any_conversion=True)


def plan_sensitivity_squared(plan: plan_lib.RunPlan, num_rounds: Optional[int] = None,
                             participation: Optional[participation_lib.ParticipationSchema] = None
                             ) -> float:
  """`accounted_sensitivity_squared` of the plan's strategy and restarts over `num_rounds`
  (default: the plan's rounds) under `participation` (default: the plan's declared one);
  `planned_sensitivity_squared` is this for the plan's own setting."""
  num_rounds, participation = _plan_setting(plan, num_rounds, participation)
  return _sensitivity_squared(plan.strategy, plan.segments(num_rounds).lengths, participation)


def planned_sensitivity_squared(plan: plan_lib.RunPlan) -> float:
  """`plan_sensitivity_squared` of the plan's own rounds and declared participation, from the
  segments the plan carries (`RunPlan.planned_segments`)."""
  _, participation = _planned_setting(plan)
  return _sensitivity_squared(plan.strategy, plan.planned_segments.lengths, participation)


def _plan_setting(plan, num_rounds, participation) -> tuple:
  """(n, participation) of a plan: the arguments given (checked here), else the plan's own."""
  if num_rounds is not None:
    num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if participation is not None:
    participation = participation_lib.check_participation(participation)
  return _planned_setting(plan, num_rounds, participation)


def _planned_setting(plan, num_rounds=None, participation=None) -> tuple:
  """(n, participation): those given (checked by the caller), else the plan's own (checked when
  the plan was made); ValueError when the plan lacks one that is not given."""
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {plan!r}.')
  setting = (plan.num_rounds if num_rounds is None else num_rounds,
             plan.participation if participation is None else participation)
  if setting[0] is None or setting[1] is None:
    raise ValueError('`plan` lacks the run\'s `rounds` or `participation`; give them.')
  return setting


def _guarantee(strategy: base.Strategy, num_rounds: int,
               participation: participation_lib.ParticipationSchema, sigma: float, delta: float,
               segments: base.Segments, conversion: str,
               any_conversion: bool = False) -> Guarantee:
  """`guarantee` of checked arguments (`segments`' restarts sorted, distinct, in (0, n)); with
  `any_conversion` a rho above `zcdp_epsilon.MAX_RHO` gets the zCDP bound whatever the
  conversion."""
  sens_sq = _sensitivity_squared(strategy, segments.lengths, participation)
  rho = _rho(sens_sq, sigma)
  conversion = zcdp_epsilon.accounted_conversion(
      rho, 'pld' if any_conversion and not zcdp_epsilon.pld_holds(rho) else conversion)
  # An overflowed rho (a noise multiplier near 0) has no finite epsilon in any conversion.
  epsilon = (zcdp_epsilon.epsilon_from_rho(rho, delta, conversion) if math.isfinite(rho)
             else math.inf)
  return Guarantee(mechanism=strategy.name, num_rounds=num_rounds, participation=participation,
                   restart_rounds=segments.restart_rounds, sensitivity_squared=sens_sq,
                   noise_multiplier=sigma,
                   rho=rho, epsilon=epsilon, delta=delta,
                   conversion=conversion)
