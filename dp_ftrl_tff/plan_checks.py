"""How `plan.RunPlan` checks its arguments and its run setting, and resolves its clipping.

The strategy must cover every noise segment of the run (`StrategyTooShortError` otherwise), the
restarts lie inside the run, a declared participation must be one the random sampling enforces
(`check_sampled_participation`: never an optimistic one), the target delta lies in (0, 1) and a
calibration names a known target. `resolve_clip` and `noise_split` give the clip and the split of
the noise multiplier under adaptive clipping; `check_config_types` the JSON types of a plan file's
fields. Rounds are 0-based, `min_sep` = b.
"""

import math
import numbers
from typing import Dict, Optional, Tuple

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import base, resolve
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.sampling import Sampling
from dp_ftrl_tff.settings import (
  DEFAULT_INITIAL_CLIP,
  AdaptiveClipping,
  SecureAggregation,
  inflated_noise_multiplier,
)

CALIBRATION_TARGETS = ('target_epsilon', 'target_rho')

#: The range of a non-zero noise multiplier sigma: sigma^2 lies in [1e-200, 1e200], so
#: rho = sens^2 / (2 sigma^2) is a finite, non-zero float64 number for every squared sensitivity in
#: [1e-100, 1e100] (float64 spans 2.2e-308 .. 1.8e308; Python's sigma**2 overflows above 1.3e154
#: and underflows to 0 below 1.5e-154). A rho above what the PLD holds
#: (`accounting.zcdp_epsilon.MAX_RHO`) gets the zCDP conversion bound, flagged as an upper bound: no
#: noise multiplier in range is refused for the accountant's memory.
MIN_NOISE_MULTIPLIER = 1e-100
MAX_NOISE_MULTIPLIER = 1e100


def check_noise_multiplier(noise_multiplier) -> float:
  """sigma as float: 0 (no noise) or in [`MIN_NOISE_MULTIPLIER`, `MAX_NOISE_MULTIPLIER`]; else a
  ValueError naming `noise_multiplier`."""
  sigma = _validation.check_nonnegative_float(noise_multiplier, 'noise_multiplier')
  if sigma != 0.0 and not MIN_NOISE_MULTIPLIER <= sigma <= MAX_NOISE_MULTIPLIER:
    raise ValueError(f'`noise_multiplier`={sigma:g} is outside [{MIN_NOISE_MULTIPLIER:g}, '
                     f'{MAX_NOISE_MULTIPLIER:g}] (or 0 for no noise): its rho-zCDP sens^2 / '
                     '(2 sigma^2) would overflow or underflow float64.')
  return sigma


def check_sampling(sampling) -> Sampling:
  """`sampling` (a `Sampling`); ValueError otherwise."""
  if not isinstance(sampling, Sampling):
    raise ValueError(f'`sampling` must be a dp_ftrl_tff.sampling.Sampling, got {sampling!r}.')
  return sampling


def check_clients_per_round(m: Optional[float], sampling: Sampling) -> None:
  """Raises ValueError unless a clients per round `m` (checked, or None) given with random
  cohorts is their expected cohort size."""
  if m is None or not sampling.random_cohorts:
    return
  expected = sampling.expected_clients_per_round
  if not (expected is not None and math.isclose(m, expected, rel_tol=1e-12)):
    raise ValueError(f'`clients_per_round`={m!r} conflicts with `sampling`: the mean divides by '
                     f'the expected cohort size {expected!r} (q * population / num_groups); '
                     'pass None.')


def check_population(population, m: Optional[float], sampling: Sampling) -> Optional[int]:
  """The population (a number of clients >= 1, or None: not recorded), checked against the plan:
  it equals a random sampling's population, and a fixed cohort of `m` clients fits in it. With
  None, the sampling's population is taken."""
  if population is None:
    return sampling.population
  population = _validation.check_positive_int(population, 'population')
  if sampling.population not in (None, population):
    raise ValueError(f'`population`={population} conflicts with `sampling`, whose population is '
                     f'{sampling.population}.')
  if not sampling.random_cohorts and m is not None and m > population:
    raise ValueError(f'`clients_per_round`={m:g} exceeds the `population` of {population} '
                     'clients.')
  return population


_JSON_KINDS = {
    'object': lambda v: isinstance(v, dict),
    'number': lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    'integer': lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    'string': lambda v: isinstance(v, str),
    'boolean': lambda v: isinstance(v, bool),
}


def check_config_types(config: dict, kinds: Dict[str, Tuple[str, bool]]) -> None:
  """ValueError naming the first field of a plan config whose JSON type is wrong (e.g. a string
  noise multiplier); `kinds` maps each field to its JSON type ('object', 'number', 'integer',
  'string', 'boolean') and whether it may be null. Fields are named in quotes, not as flags: they
  are keys of a file."""
  for name, (kind, nullable) in kinds.items():
    value = config.get(name)
    if value is None and (nullable or name not in config):
      continue
    if value is None or not _JSON_KINDS[kind](value):
      article = 'an' if kind[0] in 'aeiou' else 'a'
      raise ValueError(f"field '{name}' must be {article} {kind}{' or null' if nullable else ''}, "
                       f'got {value!r}.')


def check_noise_seed_fixed(noise_seed_fixed) -> Optional[bool]:
  """`noise_seed_fixed` (True, False, or None: not recorded); ValueError otherwise."""
  if noise_seed_fixed is not None and not isinstance(noise_seed_fixed, bool):
    raise ValueError(f'`noise_seed_fixed` must be True, False or None, got {noise_seed_fixed!r}.')
  return noise_seed_fixed


class StrategyTooShortError(ValueError):
  """A segment of the run is longer than the strategy's `max_rounds` (a banded strategy built for
  fewer rounds), and `beyond_max_rounds` is not 'restart'. `with_context` rewords the origin of
  the strategy and the remedy for a caller that knows them better (a resumed run)."""

  def __init__(self, mechanism: str, max_rounds: int, num_rounds: int, origin: str = '',
               remedy: Optional[str] = None):
    self.mechanism, self.max_rounds, self.num_rounds = mechanism, max_rounds, num_rounds
    remedy = remedy or f'a strategy for at least {num_rounds} rounds'
    super().__init__(f'the {mechanism} strategy{origin} covers {max_rounds} rounds; `rounds`='
                     f'{num_rounds} needs `beyond_max_rounds`=restart (a new noise segment every '
                     f'{max_rounds} rounds) or {remedy}.')

  def with_context(self, origin: str, remedy: str) -> 'StrategyTooShortError':
    """The same error with `origin` (e.g. ' in RUN/mechanism.npz') and `remedy`."""
    return StrategyTooShortError(self.mechanism, self.max_rounds, self.num_rounds, origin, remedy)


def check_setting(plan) -> None:
  """Raises ValueError unless a `plan.RunPlan`'s run setting holds: rounds that the strategy
  covers (else `StrategyTooShortError`), restarts inside the run, a declared participation the
  sampling enforces, a delta in (0, 1), a known calibration target."""
  if plan.participation is not None:
    participation_lib.check_participation(plan.participation)
  if plan.target_delta is not None:
    _validation.check_float_in_range(plan.target_delta, 'target_delta', 0.0, 1.0,
                                     low_inclusive=False, high_inclusive=False)
  if plan.strategy_source is not None and not isinstance(plan.strategy_source,
                                                         resolve.StrategySource):
    raise ValueError(f'`strategy_source` must be a StrategySource, got {plan.strategy_source!r}.')
  if plan.calibration is not None and (not isinstance(plan.calibration, dict) or set(
      plan.calibration) - set(CALIBRATION_TARGETS) or len(plan.calibration) != 1):
    raise ValueError(f'`calibration` must be {{target: value}} with a target in '
                     f'{CALIBRATION_TARGETS}, got {plan.calibration!r}.')
  if plan.num_rounds is None:
    return
  n = _validation.check_positive_int(plan.num_rounds, 'rounds')
  if plan.restarts is not None and plan.restarts.rounds is not None:
    base.check_restart_rounds(plan.restarts.rounds, n)
  max_rounds = plan.strategy.max_rounds
  if max_rounds is not None and plan.beyond_max_rounds != 'restart':
    longest = max(plan.segment_lengths(n))
    if longest > max_rounds:
      path = None if plan.strategy_source is None else plan.strategy_source.path
      raise StrategyTooShortError(plan.mechanism, max_rounds, longest,
                                  origin='' if path is None else f' in {path}')
  if plan.sampling.random_cohorts and plan.participation is not None:
    check_sampled_participation(plan.sampling, plan.participation, n)


def check_sampled_participation(sampling: Sampling,
                                participation: participation_lib.ParticipationSchema,
                                num_rounds: int) -> None:
  """Raises ValueError unless `participation` is one that `sampling` enforces over `num_rounds`
  rounds: with random sampling a declared schema must never be an optimistic one."""
  enforced = sampling.enforced_min_sep
  if participation.min_sep > enforced:
    raise ValueError(f'`min_sep`={participation.min_sep} exceeds the {enforced} rounds the '
                     f'plan\'s {sampling.kind} sampling keeps between participations.')
  most = -(-num_rounds // enforced)
  if participation.effective_max_participations(num_rounds) < most:
    raise ValueError(f'`max_participations`={participation.max_participations} is not enforced by '
                     f'the plan\'s {sampling.kind} sampling (a client may join {most} of the '
                     f'{num_rounds} rounds); pass None.')


def check_secure(secure) -> Optional[SecureAggregation]:
  """The SecAgg setting: None, a `SecureAggregation`, or an int number of bits (its defaults)."""
  if isinstance(secure, bool) or not (secure is None or isinstance(
      secure, (int, np.integer, SecureAggregation))):
    raise ValueError(f'`secure` must be None, an int number of bits or a SecureAggregation, got '
                     f'{secure!r}.')
  if isinstance(secure, (int, np.integer)):
    return SecureAggregation(bits=int(secure))
  return secure


def adaptive_settings(adaptive_clip) -> Optional[AdaptiveClipping]:
  """The adaptive clipping of `adaptive_clip`: None or False (a fixed clip), True (Gboard defaults)
  or an `AdaptiveClipping`; ValueError otherwise."""
  if adaptive_clip is True:
    return AdaptiveClipping()
  if adaptive_clip is False:
    return None
  if adaptive_clip is not None and not isinstance(adaptive_clip, AdaptiveClipping):
    raise ValueError(f'`adaptive_clip` must be None, a bool or an AdaptiveClipping, got '
                     f'{adaptive_clip!r}.')
  return adaptive_clip


def resolve_clip(adaptive: Optional[AdaptiveClipping], clip_norm: Optional[float]):
  """The clip of a plan: `clip_norm` with a fixed clip; with adaptive clipping the initial clip
  (its `initial_clip`, else `clip_norm`, else `DEFAULT_INITIAL_CLIP`). ValueError when
  `clip_norm` and `initial_clip` are both given and differ."""
  if adaptive is None:
    return clip_norm
  if clip_norm is not None and adaptive.initial_clip not in (None, clip_norm):
    raise ValueError(f'`clip_norm`={clip_norm!r} conflicts with `adaptive_clip.initial_clip`'
                     f'={adaptive.initial_clip!r}; give only one.')
  if adaptive.initial_clip is not None:
    return adaptive.initial_clip
  return DEFAULT_INITIAL_CLIP if clip_norm is None else clip_norm


def noise_split(adaptive: Optional[AdaptiveClipping], sigma: float,
                m: Optional[float]) -> Tuple[Optional[float], float]:
  """(sigma_b, z_Delta): the clipped-count std (None without adaptive clipping) and the value noise
  multiplier of the accounted sigma (checked) with `m` clients per round (checked, or None).
  sigma_b is the adaptive clipping's, else m / 20 (TFF's default), 0 without noise."""
  if adaptive is None:
    return None, sigma
  count_stddev = adaptive.clipped_count_stddev
  if sigma == 0.0:
    return float(count_stddev or 0.0), sigma
  if count_stddev is None:
    if m is None:
      raise ValueError('`clipped_count_stddev` is required with adaptive clipping when '
                       '`clients_per_round` is not set (its default is clients_per_round / 20).')
    count_stddev = m / 20.0
  count_stddev = float(count_stddev)
  return count_stddev, inflated_noise_multiplier(sigma, count_stddev)
