"""The run plan: everything that determines a run's privacy guarantee, in one immutable object.

A `RunPlan` holds the mechanism (`strategy`, from `mechanisms.resolve`, and where it came from), the
accounted noise multiplier sigma (and the target it was calibrated to) with its split between the
model sum (z_Delta) and the clipped-count query (sigma_b) under adaptive clipping, the clip, the
restart schedule, the SecAgg settings, the banded policy past `max_rounds`, the random sampling, and
the run's setting: its rounds, the declared participation, the target delta, the population and
whether the noise seed was fixed (a testing-only run). It imports no
TensorFlow. `aggregators.CorrelatedNoiseFactory` builds the aggregator from it, the drivers write it
to the run directory (`save_plan`), and the accountant, the report and the console read it.
`print(plan)` shows it all. Its parts are `dp_ftrl_tff.settings` (re-exported here).

A plan made for accounting only (`RunPlan.for_accounting`, a planned run's report) leaves
`clients_per_round` and `clip_norm` unset (the guarantee does not depend on them) and may hold any
registered strategy; the factory refuses it.

Conventions (docs/papers.md): rounds are 0-based; the noise multiplier is relative to the clip norm and
applies to the SUM of clipped updates; the mean divides by the fixed `clients_per_round`; `min_sep` =
b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1).
"""

import dataclasses
import hashlib
import json
import numbers
from typing import Optional

import numpy as np

from dp_ftrl_tff import _atomic, _validation, plan_checks
from dp_ftrl_tff.mechanisms import base, registry, resolve
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.plan_checks import (  # noqa: F401  (re-exported)
  CALIBRATION_TARGETS,
  StrategyTooShortError,
  check_sampled_participation,
)
from dp_ftrl_tff.sampling import Sampling
from dp_ftrl_tff.settings import (  # noqa: F401  (the plan's parts, re-exported)
  DEFAULT_INITIAL_CLIP,
  EVERY_ROUND,
  GBOARD_RESTARTS,
  MAX_SCALE_FACTOR,
  AdaptiveClipping,
  RestartSchedule,
  SecureAggregation,
  accounted_noise_multiplier,
  inflated_noise_multiplier,
)

BEYOND_MAX_ROUNDS = ('error', 'restart')


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """What a run releases and how it is noised; see the module docstring. Build with `RunPlan.build`.

  Attributes:
    strategy: the mechanism's `Strategy` (its `name` is the registry key).
    noise_multiplier: sigma, the accounted noise multiplier (relative to the clip, on the sum): 0
      or in [1e-100, 1e100] (`plan_checks.MIN_NOISE_MULTIPLIER`, `MAX_NOISE_MULTIPLIER`).
    clients_per_round: m > 0, the fixed denominator of the mean (None: accounting only).
    clip_norm: zeta > 0, the fixed clip, or the initial clip with adaptive clipping (None:
      accounting only).
    adaptive_clip: `AdaptiveClipping` settings, or None for a fixed clip.
    clipped_count_stddev: sigma_b with adaptive clipping (resolved default), else None.
    value_noise_multiplier: z_Delta, the multiplier on the model sum (= sigma without adaptive
      clipping; `inflated_noise_multiplier` with it; 0 when sigma is 0).
    restarts: the `RestartSchedule` of the mechanism segments, or None (one segment).
    secure: `SecureAggregation` settings, or None (plain sum).
    zeroing_norm: updates with a larger L2 norm are zeroed; None zeroes only non-finite updates.
    beyond_max_rounds: banded strategies past their `max_rounds`: 'error' or 'restart' (the flag
      `--banded_beyond_max_rounds`).
    sampling: the `Sampling` of the cohorts: random ones (then `clients_per_round` is its
      `expected_clients_per_round`), or kind 'min_sep': exactly `clients_per_round` clients,
      accounted with the declared participation schema.
    num_rounds: n, the run's rounds, or None (a plan for an aggregator alone).
    participation: the declared `ParticipationSchema` (b-min-sep with at most k participations),
      or None.
    target_delta: the delta of the run's (epsilon, delta) statement, or None.
    strategy_source: the `resolve.StrategySource` of the strategy (file, optimizer, ...), or None.
    calibration: {'target_epsilon': e} or {'target_rho': r} when sigma was calibrated to it, else
      None.
    population: the number of clients the run samples from (its training clients), or None: not
      recorded (a plan for accounting only, or of an earlier release). With `sampling`, its
      `population`.
    noise_seed_fixed: True when the noise comes from a seed given explicitly (the drivers'
      `--noise_seed`): anyone who knows the seed can regenerate and subtract the noise, so the run
      is for testing only and has no privacy guarantee; False when the seed is drawn from OS
      entropy at the start (secret, as the guarantee requires); None: not recorded.
  """
  strategy: base.Strategy
  noise_multiplier: float
  clients_per_round: Optional[float]
  clip_norm: Optional[float]
  adaptive_clip: Optional[AdaptiveClipping]
  clipped_count_stddev: Optional[float]
  value_noise_multiplier: float
  restarts: Optional[RestartSchedule]
  secure: Optional[SecureAggregation]
  zeroing_norm: Optional[float]
  beyond_max_rounds: str = 'error'
  sampling: Sampling = Sampling()
  num_rounds: Optional[int] = None
  participation: Optional[participation_lib.ParticipationSchema] = None
  target_delta: Optional[float] = None
  strategy_source: Optional[resolve.StrategySource] = None
  calibration: Optional[dict] = None
  population: Optional[int] = None
  noise_seed_fixed: Optional[bool] = None

  @classmethod
  def build(cls, strategy: base.Strategy, noise_multiplier: float,
            clients_per_round: Optional[float], clip_norm: Optional[float], *, adaptive_clip=None,
            secure=None, zeroing_norm: Optional[float] = None,
            restarts: Optional[RestartSchedule] = None, beyond_max_rounds: str = 'error',
            sampling: Sampling = Sampling(), num_rounds: Optional[int] = None,
            participation: Optional[participation_lib.ParticipationSchema] = None,
            target_delta: Optional[float] = None,
            strategy_source: Optional[resolve.StrategySource] = None,
            calibration: Optional[dict] = None, population: Optional[int] = None,
            noise_seed_fixed: Optional[bool] = None) -> 'RunPlan':
    """Validates the arguments and resolves every default into a plan an aggregator can run.

    Args:
      strategy: a registered `Strategy` with a streaming noise state.
      noise_multiplier: sigma: 0 (no noise) or in [1e-100, 1e100]
        (`plan_checks.check_noise_multiplier`).
      clients_per_round: m > 0; with `sampling`, None or its `expected_clients_per_round`.
      clip_norm: the fixed clip; with `adaptive_clip` the initial clip, or None.
      adaptive_clip: None or False (fixed clip), True (Gboard defaults) or an `AdaptiveClipping`.
      secure: None (plain sum), an int number of bits, or a `SecureAggregation`.
      zeroing_norm: > 0 or None.
      restarts: a `RestartSchedule`, or None: the adaptive clipping's schedule, else its mechanism
        default (`EVERY_ROUND` for Gaussian noise, `GBOARD_RESTARTS` otherwise) with adaptive
        clipping, and no restarts with a fixed clip.
      beyond_max_rounds: 'error' or 'restart' (banded strategies).
      sampling: a `Sampling` (default: kind 'min_sep').
      num_rounds: n >= 1, or None; every segment must fit the strategy (`beyond_max_rounds`).
      participation: the declared `ParticipationSchema`, or None; with `sampling`, one the sampler
        enforces (its min_sep at most the groups' b-hat, no cap on participations below it).
      target_delta: in (0, 1), or None.
      strategy_source: where the strategy came from (`resolve.resolve_strategy`), or None.
      calibration: {'target_epsilon': e} or {'target_rho': r}, or None.
      population: the number of clients >= `clients_per_round`, or None (with `sampling`: its
        population).
      noise_seed_fixed: whether the noise seed was given explicitly (True: testing only), or None.
    """
    return cls._make(strategy, noise_multiplier, clients_per_round, clip_norm, adaptive_clip, secure,
                     zeroing_norm, restarts, beyond_max_rounds, sampling, num_rounds,
                     participation, target_delta, strategy_source, calibration, population,
                     noise_seed_fixed, training=True)

  @classmethod
  def for_accounting(cls, strategy: base.Strategy, noise_multiplier: float, *,
                     clipped_count_stddev: Optional[float] = None,
                     restarts: Optional[RestartSchedule] = None, secure=None,
                     beyond_max_rounds: str = 'error', sampling: Sampling = Sampling(),
                     num_rounds: Optional[int] = None,
                     participation: Optional[participation_lib.ParticipationSchema] = None,
                     target_delta: Optional[float] = None,
                     strategy_source: Optional[resolve.StrategySource] = None,
                     calibration: Optional[dict] = None) -> 'RunPlan':
    """A plan for accounting only (a planned run's report): no clients per round, no clip, any
    registered strategy (TreeAgg-Full too). Adaptive clipping is its `clipped_count_stddev`;
    `restarts` are exactly those given. The other arguments are `build`'s."""
    adaptive = (None if clipped_count_stddev is None else
                AdaptiveClipping(clipped_count_stddev=clipped_count_stddev))
    if adaptive is not None and restarts is None:
      restarts = RestartSchedule.at(())  # not adaptive clipping's default schedule
    return cls._make(strategy, noise_multiplier, None, None,
                     adaptive, secure, None, restarts,
                     beyond_max_rounds, sampling, num_rounds, participation, target_delta,
                     strategy_source, calibration, None, None)

  @classmethod
  def _make(cls, strategy, noise_multiplier, m, clip_norm, adaptive_clip, secure, zeroing_norm,
            restarts, beyond_max_rounds, sampling, num_rounds, participation, target_delta,
            strategy_source, calibration, population, noise_seed_fixed,
            training: bool = False) -> 'RunPlan':
    """The plan of `strategy` and clients per round `m`: a plan for `training` (see `build`: m
    None is the sampling's expected cohort size), else for accounting only (m None: no clip)."""
    entry = _strategy_entry(strategy)
    if training and not entry.streams:
      raise ValueError(f'`strategy` {strategy.name!r} has no streaming noise; streaming '
                       f'mechanisms: {list(registry.names(streaming_only=True))}.')
    if training and clip_norm is None and adaptive_clip in (None, False):
      raise ValueError('`clip_norm` is required without `adaptive_clip`.')
    if training and m is None:
      m = plan_checks.check_sampling(sampling).expected_clients_per_round
      if m is None:
        raise ValueError('`clients_per_round` must be given: a positive number, or None with a '
                         '`sampling` of known population (its expected cohort size).')
    sigma = plan_checks.check_noise_multiplier(noise_multiplier)
    if m is not None:
      m = _validation.check_positive_float(m, 'clients_per_round')
    if clip_norm is not None:
      clip_norm = _validation.check_positive_float(clip_norm, 'clip_norm')
    if zeroing_norm is not None:
      zeroing_norm = _validation.check_positive_float(zeroing_norm, 'zeroing_norm')
    _validation.check_one_of(beyond_max_rounds, 'beyond_max_rounds', BEYOND_MAX_ROUNDS)
    if restarts is not None and not isinstance(restarts, RestartSchedule):
      raise ValueError(f'`restarts` must be a RestartSchedule or None, got {restarts!r}.')
    plan_checks.check_clients_per_round(m, plan_checks.check_sampling(sampling))
    population = plan_checks.check_population(population, m, sampling)
    noise_seed_fixed = plan_checks.check_noise_seed_fixed(noise_seed_fixed)
    secure = plan_checks.check_secure(secure)
    adaptive_clip, clip, count_stddev, value_sigma = plan_checks.resolve_clipping(
        adaptive_clip, clip_norm, sigma, m)
    if m is None:  # a plan for accounting only (`for_accounting`): no clip at all
      clip = None
    if adaptive_clip is not None:
      default = GBOARD_RESTARTS if strategy.correlated else EVERY_ROUND
      restarts = restarts or adaptive_clip.restarts or default
    plan = cls(strategy=strategy, noise_multiplier=sigma, clients_per_round=m, clip_norm=clip,
               adaptive_clip=adaptive_clip, clipped_count_stddev=count_stddev,
               value_noise_multiplier=value_sigma, restarts=restarts, secure=secure,
               zeroing_norm=zeroing_norm, beyond_max_rounds=beyond_max_rounds, sampling=sampling,
               num_rounds=num_rounds, participation=participation,
               target_delta=target_delta, strategy_source=strategy_source,
               calibration=calibration, population=population, noise_seed_fixed=noise_seed_fixed)
    plan_checks.check_setting(plan)
    return plan

  @property
  def mechanism(self) -> str:
    """The registry name of the strategy."""
    return self.strategy.name

  @property
  def accounting_only(self) -> bool:
    """True for a plan made by `for_accounting` (no clip): it cannot build an aggregator."""
    return self.clip_norm is None

  @property
  def max_segment_rounds(self) -> Optional[int]:
    """The longest noise segment between restarts, or None without a bound."""
    if self.restarts is None:
      return None
    if self.restarts.rounds is not None and self.num_rounds is not None:
      return max(self.segment_lengths())
    return self.restarts.max_segment_rounds

  def restart_rounds(self, num_rounds: Optional[int] = None) -> list:
    """The scheduled restart rounds below `num_rounds` (default: the plan's rounds); banded
    'restart' segments add theirs."""
    num_rounds = self._rounds(num_rounds)
    rounds = set() if self.restarts is None else set(self.restarts.restart_rounds(num_rounds))
    max_rounds = self.strategy.max_rounds
    if self.beyond_max_rounds == 'restart' and max_rounds is not None:
      rounds.update(range(max_rounds, num_rounds, max_rounds))
    return sorted(rounds)

  def segment_lengths(self, num_rounds: Optional[int] = None) -> tuple:
    """The noise segments' lengths over `num_rounds` rounds (default: the plan's rounds)."""
    restart_rounds = tuple(self.restart_rounds(num_rounds))
    return base.lengths_between(self._rounds(num_rounds), restart_rounds)

  def _rounds(self, num_rounds: Optional[int]) -> int:
    """`num_rounds` checked, or the plan's own rounds (checked when the plan was made)."""
    if num_rounds is not None:
      return _validation.check_nonnegative_int(num_rounds, 'num_rounds')
    if self.num_rounds is None:
      raise ValueError('`num_rounds` is required: the plan has no rounds.')
    return self.num_rounds

  def with_noise_multiplier(self, noise_multiplier: float,
                            calibration: Optional[dict] = None) -> 'RunPlan':
    """The same plan with another accounted noise multiplier (its split recomputed), e.g. the one
    calibrated to `calibration`'s target (`accounting.calibration.calibrate_plan`)."""
    return RunPlan._make(
        self.strategy, noise_multiplier, self.clients_per_round, self.clip_norm,
        self.adaptive_clip, self.secure, self.zeroing_norm, self.restarts, self.beyond_max_rounds,
        self.sampling, self.num_rounds, self.participation, self.target_delta,
        self.strategy_source, calibration, self.population, self.noise_seed_fixed)

  def to_config(self, fingerprint_arrays: bool = False) -> dict:
    """JSON-ready description; `from_config` inverts it. The strategy's arrays (banded
    `band_rows`) are nested lists, or with `fingerprint_arrays` their shape and SHA-256, and the
    optimizer's wall time left out: a short, deterministic description that cannot be inverted
    (the aggregator state's `mechanism`)."""
    source = None if self.strategy_source is None else self.strategy_source.to_config()
    if source is not None and fingerprint_arrays:
      source['seconds'] = None
    return {
        'strategy': _strategy_config(self.strategy, fingerprint_arrays),
        'noise_multiplier': self.noise_multiplier,
        'value_noise_multiplier': self.value_noise_multiplier,
        'clients_per_round': self.clients_per_round,
        'clip_norm': self.clip_norm,
        'adaptive_clip': None if self.adaptive_clip is None else self.adaptive_clip.to_config(),
        'clipped_count_stddev': self.clipped_count_stddev,
        'restarts': None if self.restarts is None else self.restarts.to_config(),
        'secure': None if self.secure is None else self.secure.to_config(),
        'zeroing_norm': self.zeroing_norm,
        'beyond_max_rounds': self.beyond_max_rounds,
        'sampling': self.sampling.to_config(),
        'num_rounds': self.num_rounds,
        'participation': (None if self.participation is None
                          else dataclasses.asdict(self.participation)),
        'target_delta': self.target_delta,
        'strategy_source': source,
        'calibration': self.calibration,
        'population': self.population,
        'noise_seed_fixed': self.noise_seed_fixed,
    }

  @classmethod
  def from_config(cls, config: dict) -> 'RunPlan':
    """Inverse of `to_config`: rebuilds the plan through `build` (so it is validated again). Plans of
    earlier releases (without the run's setting, the population or the seed's origin) load with
    those fields None. A field of the wrong JSON type is a ValueError naming it ("field 'x'")."""
    if not isinstance(config, dict):
      raise ValueError(f'`config` must be a dict, got {type(config).__name__}.')
    missing = sorted({'strategy', 'noise_multiplier', 'clients_per_round', 'clip_norm'} - set(config))
    if missing:
      raise ValueError(f'The plan config lacks {missing}.')
    _check_field_types(config)
    strategy_config = {key: np.asarray(value, np.float64)
                       if isinstance(value, list) and value and isinstance(value[0], list)
                       else value for key, value in config['strategy'].items()}
    optional = {
        'adaptive_clip': AdaptiveClipping.from_config, 'restarts': RestartSchedule.from_config,
        'secure': lambda c: SecureAggregation(**c),
        'participation': lambda c: participation_lib.ParticipationSchema(**c),
        'strategy_source': resolve.StrategySource.from_config,
        'strategy': lambda _: registry.strategy_from_config(strategy_config)}
    parts = {key: None if config.get(key) is None else _parse_field(key, parse, config[key])
             for key, parse in optional.items()}
    strategy = parts.pop('strategy')
    # A plan of an earlier release without a sampling (null) drew min-sep cohorts.
    parts['sampling'] = _parse_field('sampling', lambda c: Sampling(**c),
                                     config.get('sampling') or {})
    setting = dict(population=config.get('population'),
                   noise_seed_fixed=config.get('noise_seed_fixed'))
    if config['clip_norm'] is None:
      # A plan for accounting only: its adaptive clipping is its clipped-count noise.
      return cls._make(strategy, config['noise_multiplier'], config['clients_per_round'],
                       config['clip_norm'], parts['adaptive_clip'], parts['secure'], None,
                       parts['restarts'], config.get('beyond_max_rounds', 'error'),
                       parts['sampling'], config.get('num_rounds'), parts['participation'],
                       config.get('target_delta'), parts['strategy_source'],
                       config.get('calibration'), **setting)
    return cls.build(
        strategy, config['noise_multiplier'], config['clients_per_round'], config['clip_norm'],
        zeroing_norm=config.get('zeroing_norm'),
        beyond_max_rounds=config.get('beyond_max_rounds', 'error'),
        num_rounds=config.get('num_rounds'), target_delta=config.get('target_delta'),
        calibration=config.get('calibration'), **setting, **parts)

  def __str__(self) -> str:
    clip = (f'not set (accounting only), clipped_count_stddev={self.clipped_count_stddev}'
            if self.clip_norm is None else
            f'{"adaptive " + repr(self.adaptive_clip) if self.adaptive_clip else "fixed"} '
            f'clip_norm={self.clip_norm:g}, clipped_count_stddev={self.clipped_count_stddev}')
    lines = [f'RunPlan: {self.mechanism} {self.strategy!r}'
             + ('' if self.strategy_source is None else f' ({self.strategy_source.describe()})'),
             f'  noise_multiplier sigma={self.noise_multiplier:g} (value z_Delta='
             f'{self.value_noise_multiplier:.10g})'
             + ('' if self.calibration is None else f', calibrated to {self.calibration}')
             + f', clients_per_round={self.clients_per_round}',
             f'  clip: {clip}',
             f'  restarts={self.restarts}, beyond_max_rounds={self.beyond_max_rounds}',
             f'  secure={self.secure}, zeroing_norm={self.zeroing_norm}',
             f'  sampling={self.sampling}',
             f'  rounds={self.num_rounds}, participation={self.participation}, '
             f'target_delta={self.target_delta}, population={self.population}',
             '  noise seed: ' + {None: 'not recorded', False: 'from OS entropy (secret)',
                                 True: 'FIXED (testing only: no privacy guarantee)'}[
                                     self.noise_seed_fixed]]
    return '\n'.join(lines)


#: The JSON type of each field of `RunPlan.to_config()`: (kind, may it be null).
_FIELD_TYPES = {
    'strategy': ('object', False), 'noise_multiplier': ('number', False),
    'value_noise_multiplier': ('number', True), 'clients_per_round': ('number', True),
    'clip_norm': ('number', True), 'adaptive_clip': ('object', True),
    'clipped_count_stddev': ('number', True), 'restarts': ('object', True),
    'secure': ('object', True), 'zeroing_norm': ('number', True),
    'beyond_max_rounds': ('string', True), 'sampling': ('object', True),
    'num_rounds': ('integer', True), 'participation': ('object', True),
    'target_delta': ('number', True), 'strategy_source': ('object', True),
    'calibration': ('object', True), 'population': ('integer', True),
    'noise_seed_fixed': ('boolean', True),
}
_KIND_CHECKS = {
    'object': lambda v: isinstance(v, dict),
    'number': lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    'integer': lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    'string': lambda v: isinstance(v, str),
    'boolean': lambda v: isinstance(v, bool),
}


def _check_field_types(config: dict) -> None:
  """ValueError naming the first field of a plan config whose JSON type is wrong (e.g. a string
  noise multiplier). Fields are named in quotes, not as flags: they are keys of a file."""
  for name, (kind, nullable) in _FIELD_TYPES.items():
    value = config.get(name)
    if value is None and (nullable or name not in config):
      continue
    if value is None or not _KIND_CHECKS[kind](value):
      article = 'an' if kind[0] in 'aeiou' else 'a'
      raise ValueError(f"field '{name}' must be {article} {kind}{' or null' if nullable else ''}, "
                       f'got {value!r}.')


def _parse_field(name: str, parse, value):
  """`parse(value)`, its errors named by the plan field `name`."""
  try:
    return parse(value)
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    raise ValueError(f"field '{name}': {e}") from e


def _strategy_entry(strategy) -> registry.Mechanism:
  """The registry entry of a `Strategy` (ValueError for anything else or an unknown name)."""
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a dp_ftrl_tff.mechanisms Strategy, got {strategy!r}.')
  return registry.entry(strategy.name)


def _strategy_config(strategy: base.Strategy, fingerprint_arrays: bool) -> dict:
  config = {}
  for key, value in strategy.to_config().items():
    if not isinstance(value, np.ndarray):
      config[key] = value
    elif fingerprint_arrays:
      array = np.ascontiguousarray(value, dtype=np.float64)
      config[key + '_shape'] = list(array.shape)
      config[key + '_sha256'] = hashlib.sha256(array.tobytes()).hexdigest()
    else:
      config[key] = value.tolist()
  return config


def save_plan(plan: RunPlan, path) -> None:
  """Writes `plan.to_config()` as JSON to `path` (via a temp file, renamed into place)."""
  if not isinstance(plan, RunPlan):
    raise ValueError(f'`plan` must be a RunPlan, got {type(plan).__name__}.')
  _atomic.write_text(path, json.dumps(plan.to_config(), indent=2, allow_nan=False) + '\n')


class InvalidPlanFileError(ValueError):
  """A plan file that reads as JSON but holds no valid plan: a field of the wrong type (e.g.
  "noise_multiplier": "abc") or value. Its one-line message names the file and the field."""


def load_plan(path) -> RunPlan:
  """The plan `save_plan` wrote to `path`.

  Raises:
    ValueError: the file cannot be read or is not JSON (naming the file).
    InvalidPlanFileError: its JSON is not a valid plan (naming the file and the field).
  """
  try:
    with open(path) as f:
      config = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f'`path` {str(path)!r} is not a readable plan file: {e}') from e
  try:
    return RunPlan.from_config(config)
  except (ValueError, TypeError) as e:
    message = ' '.join(str(e).split())  # one line, whatever a nested error printed
    raise InvalidPlanFileError(f'`path` {str(path)!r} is not a valid plan file: {message}') from e
