"""The run plan: everything that determines a run's privacy guarantee, in one immutable object.

A `RunPlan` holds the mechanism (`strategy`, from `mechanisms.resolve`, and where it came from), the
accounted noise multiplier sigma (and the target it was calibrated to) with its split between the
model sum (z_Delta) and the clipped-count query (sigma_b) under adaptive clipping, the clip, the
restart schedule, the SecAgg settings, the banded policy past `max_rounds`, the random sampling, and
the run's setting: its rounds, the declared participation, the target delta, the population and
whether the noise seed was fixed (a testing-only run); its parts are `dp_ftrl_tff.settings`, its
checks `plan_checks`. It imports no TensorFlow. `aggregators.CorrelatedNoiseFactory` builds the
aggregator from it, the drivers write it to the run directory (`save_plan`), and the accountant, the
report and the console read it. `print(plan)` shows it all.

A plan made for accounting only (`RunPlan.for_accounting`, a planned run's report) leaves
`clients_per_round` and `clip_norm` unset (the guarantee does not depend on them) and may hold any
registered strategy; the factory refuses it. Conventions: docs/papers.md (0-based rounds, sigma
relative to the clip on the SUM, the mean over the fixed `clients_per_round`, `min_sep` = b).
"""

import dataclasses
import functools
import hashlib
import json
from typing import Any, Callable, List, NamedTuple, Optional

import numpy as np

from dp_ftrl_tff import _atomic, _validation, plan_checks, settings
from dp_ftrl_tff.mechanisms import base, registry, resolve
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.sampling import Sampling

BEYOND_MAX_ROUNDS = ('error', 'restart')


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """What a run releases and how it is noised; see the module docstring. `RunPlan.build` and
  `RunPlan.for_accounting` resolve the defaults; the constructor (and so `dataclasses.replace`)
  validates every field and derives the noise split. The fields are in the order of `to_config`.

  Attributes:
    strategy: the mechanism's `Strategy` (its `name` is the registry key).
    noise_multiplier: sigma, the accounted noise multiplier (relative to the clip, on the sum): 0
      or in [1e-100, 1e100] (`plan_checks.MIN_NOISE_MULTIPLIER`, `MAX_NOISE_MULTIPLIER`).
    value_noise_multiplier: z_Delta, the multiplier on the model sum (derived: = sigma without
      adaptive clipping; `inflated_noise_multiplier` with it; 0 when sigma is 0).
    clients_per_round: m > 0, the fixed denominator of the mean (None: accounting only).
    clip_norm: zeta > 0, the fixed clip, or the initial clip with adaptive clipping (None:
      accounting only).
    adaptive_clip: `AdaptiveClipping` settings, or None for a fixed clip.
    clipped_count_stddev: sigma_b with adaptive clipping (derived: the settings', else m / 20, 0
      when sigma is 0), else None.
    restarts: the `RestartSchedule` of the mechanism segments, or None (one segment). With adaptive
      clipping None means its schedule, else the mechanism's default (`EVERY_ROUND` for Gaussian
      noise, `GBOARD_RESTARTS` otherwise).
    secure: `SecureAggregation` settings (or an int number of bits: its defaults), or None.
    zeroing_norm: updates with a larger L2 norm are zeroed; None zeroes only non-finite updates.
    beyond_max_rounds: banded strategies past their `max_rounds`: 'error' or 'restart' (the flag
      `--banded_beyond_max_rounds`).
    sampling: the `Sampling` of the cohorts: random ones (then `clients_per_round` is its
      `expected_clients_per_round`, the default with a clip), or kind 'min_sep': exactly
      `clients_per_round` clients, accounted with the declared participation schema.
    num_rounds: n, the run's rounds, or None (a plan for an aggregator alone).
    participation: the declared `ParticipationSchema` (b-min-sep with at most k participations),
      or None; with random cohorts, one the sampler enforces.
    target_delta: the delta of the run's (epsilon, delta) statement, in (0, 1), or None.
    strategy_source: the `resolve.StrategySource` of the strategy (file, optimizer, ...), or None.
    calibration: {'target_epsilon': e} or {'target_rho': r} when sigma was calibrated to it, else
      None.
    population: the number of clients the run samples from (its training clients), or None: not
      recorded (a plan for accounting only). With random cohorts, the sampling's `population`.
    noise_seed_fixed: True for noise from a seed given explicitly (`--noise_seed`: whoever knows
      it can subtract the noise, so a testing-only run without guarantee); False for a secret seed
      from OS entropy (as the guarantee requires); None: not recorded.
  """
  strategy: base.Strategy
  noise_multiplier: float
  value_noise_multiplier: float = dataclasses.field(init=False)
  clients_per_round: Optional[float] = None
  clip_norm: Optional[float] = None
  adaptive_clip: Optional[settings.AdaptiveClipping] = None
  clipped_count_stddev: Optional[float] = dataclasses.field(init=False)
  restarts: Optional[settings.RestartSchedule] = None
  secure: Optional[settings.SecureAggregation] = None
  zeroing_norm: Optional[float] = None
  beyond_max_rounds: str = 'error'
  sampling: Sampling = Sampling()
  num_rounds: Optional[int] = None
  participation: Optional[participation_lib.ParticipationSchema] = None
  target_delta: Optional[float] = None
  strategy_source: Optional[resolve.StrategySource] = None
  calibration: Optional[dict] = None
  population: Optional[int] = None
  noise_seed_fixed: Optional[bool] = None

  def __post_init__(self):
    entry = _strategy_entry(self.strategy)
    if self.clip_norm is not None and not entry.streams:
      raise ValueError(f'`strategy` {self.strategy.name!r} has no streaming noise; streaming '
                       f'mechanisms: {list(registry.names(streaming_only=True))}.')
    sigma = plan_checks.check_noise_multiplier(self.noise_multiplier)
    sampling = plan_checks.check_sampling(self.sampling)
    m, clip, zeroing_norm = (None if value is None else _validation.check_positive_float(value, name)
                             for name, value in (('clients_per_round', self.clients_per_round),
                                                 ('clip_norm', self.clip_norm),
                                                 ('zeroing_norm', self.zeroing_norm)))
    if clip is not None and m is None:  # a trainable plan: random cohorts' expected size
      m = sampling.expected_clients_per_round
      if m is None:
        raise ValueError('`clients_per_round` must be given: a positive number, or None with a '
                         '`sampling` of known population (its expected cohort size).')
    _validation.check_one_of(self.beyond_max_rounds, 'beyond_max_rounds', BEYOND_MAX_ROUNDS)
    restarts = self.restarts
    if restarts is not None and not isinstance(restarts, settings.RestartSchedule):
      raise ValueError(f'`restarts` must be a RestartSchedule or None, got {restarts!r}.')
    plan_checks.check_clients_per_round(m, sampling)
    adaptive = plan_checks.adaptive_settings(self.adaptive_clip)
    if adaptive is not None:
      if clip is not None:
        plan_checks.resolve_clip(adaptive, clip)  # the conflict with its initial clip
      default = settings.GBOARD_RESTARTS if self.strategy.correlated else settings.EVERY_ROUND
      restarts = restarts or adaptive.restarts or default
    count_stddev, value_sigma = plan_checks.noise_split(adaptive, sigma, m)
    resolved = dict(
        noise_multiplier=sigma, value_noise_multiplier=value_sigma, clients_per_round=m,
        clip_norm=clip, adaptive_clip=adaptive, clipped_count_stddev=count_stddev,
        restarts=restarts, secure=plan_checks.check_secure(self.secure), zeroing_norm=zeroing_norm,
        population=plan_checks.check_population(self.population, m, sampling),
        noise_seed_fixed=plan_checks.check_noise_seed_fixed(self.noise_seed_fixed))
    for name, value in resolved.items():
      object.__setattr__(self, name, value)
    plan_checks.check_setting(self)

  @classmethod
  def build(cls, strategy: base.Strategy, noise_multiplier: float,
            clients_per_round: Optional[float], clip_norm: Optional[float], *, adaptive_clip=None,
            sampling: Sampling = Sampling(), **setting) -> 'RunPlan':
    """The plan an aggregator can run, with the clip resolved from the adaptive clipping.

    Args:
      strategy: a registered `Strategy` with a streaming noise state.
      noise_multiplier: sigma: 0 (no noise) or in [1e-100, 1e100] (`check_noise_multiplier`).
      clients_per_round: m > 0; with random cohorts, None or its `expected_clients_per_round`.
      clip_norm: the fixed clip; with `adaptive_clip` the initial clip, or None.
      adaptive_clip: None or False (fixed clip), True (Gboard defaults) or an `AdaptiveClipping`.
      sampling: a `Sampling` (default: kind 'min_sep').
      setting: the other fields of the plan, by keyword: `restarts`, `secure`, `zeroing_norm`,
        `beyond_max_rounds`, `num_rounds` (every segment must fit the strategy), `participation`,
        `target_delta`, `strategy_source`, `calibration`, `population` (>= `clients_per_round`; with
        `sampling`: its population) and `noise_seed_fixed`.
    """
    adaptive = plan_checks.adaptive_settings(adaptive_clip)
    if clip_norm is None and adaptive is None:
      raise ValueError('`clip_norm` is required without `adaptive_clip`.')
    return cls(strategy=strategy, noise_multiplier=noise_multiplier,
               clients_per_round=clients_per_round, clip_norm=plan_checks.resolve_clip(
                   adaptive, clip_norm), adaptive_clip=adaptive, sampling=sampling, **setting)

  @classmethod
  def for_accounting(cls, strategy: base.Strategy, noise_multiplier: float, *,
                     clipped_count_stddev: Optional[float] = None,
                     restarts: Optional[settings.RestartSchedule] = None, **setting) -> 'RunPlan':
    """A plan for accounting only (a planned run's report): no clients per round, no clip, any
    registered strategy (TreeAgg-Full too). Adaptive clipping is its `clipped_count_stddev`;
    `restarts` are exactly those given. `setting`: `secure`, `beyond_max_rounds`, `sampling`,
    `num_rounds`, `participation`, `target_delta`, `strategy_source`, `calibration`, as `build`."""
    adaptive = (None if clipped_count_stddev is None else
                settings.AdaptiveClipping(clipped_count_stddev=clipped_count_stddev))
    if adaptive is not None and restarts is None:
      restarts = settings.RestartSchedule.at(())  # not adaptive clipping's default schedule
    return cls(strategy=strategy, noise_multiplier=noise_multiplier, adaptive_clip=adaptive,
               restarts=restarts, **setting)

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

  @functools.cached_property
  def planned_segments(self) -> base.Segments:
    """The noise segments over the plan's own rounds, computed once and carried with the plan (the
    accountant, the calibration and the console read them); ValueError without rounds."""
    return base.segments_between(self.num_rounds, self.restart_rounds())

  def segments(self, num_rounds: Optional[int] = None) -> base.Segments:
    """The noise segments over `num_rounds` rounds (default: the plan's, `planned_segments`)."""
    num_rounds = self._rounds(num_rounds)
    return (self.planned_segments if num_rounds == self.num_rounds else
            base.segments_between(num_rounds, self.restart_rounds(num_rounds)))

  def segment_lengths(self, num_rounds: Optional[int] = None) -> tuple:
    """The noise segments' lengths over `num_rounds` rounds (default: the plan's rounds)."""
    return self.segments(num_rounds).lengths

  def _rounds(self, num_rounds: Optional[int]) -> int:
    """`num_rounds` checked, or the plan's own rounds (checked when the plan was made)."""
    if num_rounds is not None:
      return _validation.check_nonnegative_int(num_rounds, 'num_rounds')
    if self.num_rounds is None:
      raise ValueError('`num_rounds` is required: the plan has no rounds.')
    return self.num_rounds

  def to_config(self, fingerprint_arrays: bool = False) -> dict:
    """JSON-ready description, one key per field in field order; `from_config` inverts it. The
    strategy's arrays (banded `band_rows`) are nested lists, or with `fingerprint_arrays` their
    shape and SHA-256, and the optimizer's wall time left out: a short, deterministic description
    that cannot be inverted (the aggregator state's `mechanism`)."""
    config = {}
    for field in dataclasses.fields(self):
      value, encode = getattr(self, field.name), _FIELDS[field.name].encode
      config[field.name] = value if value is None or encode is None else encode(
          value, fingerprint_arrays)
    return config

  @classmethod
  def from_config(cls, config: dict) -> 'RunPlan':
    """Inverse of `to_config`: the plan of the config's fields, validated again (the derived
    `value_noise_multiplier` and `clipped_count_stddev` are recomputed). A missing optional field is
    None (its default); a field of the wrong JSON type is a ValueError naming it ("field 'x'")."""
    if not isinstance(config, dict):
      raise ValueError(f'`config` must be a dict, got {type(config).__name__}.')
    missing = sorted({'strategy', 'noise_multiplier', 'clients_per_round', 'clip_norm'} - set(config))
    if missing:
      raise ValueError(f'The plan config lacks {missing}.')
    plan_checks.check_config_types(config, {name: field[:2] for name, field in _FIELDS.items()})
    fields = {}
    for field in dataclasses.fields(cls):
      if field.init and field.name in config:
        value, decode = config[field.name], _FIELDS[field.name].decode
        fields[field.name] = (value if value is None or decode is None
                              else _parse_field(field.name, decode, value))
    return cls(**fields)

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


class _Field(NamedTuple):
  """How a field of `RunPlan` reads and writes in `to_config`: its JSON type `kind`, whether it may be
  null, `encode(value, fingerprint_arrays)` and `decode(json)` (None: the value as is)."""
  kind: str
  nullable: bool = True
  encode: Optional[Callable[[Any, bool], Any]] = None
  decode: Optional[Callable[[Any], Any]] = None


def _settings_field(decode: Callable[[Any], Any]) -> _Field:
  """A field holding a settings object: its `to_config()`, read back by `decode`."""
  return _Field('object', True, lambda value, _: value.to_config(), decode)


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


def _strategy_from_config(config: dict) -> base.Strategy:
  """The strategy of `to_config`'s 'strategy' (its nested lists read as float64 arrays)."""
  return registry.strategy_from_config({
      key: np.asarray(value, np.float64) if isinstance(value, list) and value and isinstance(
          value[0], list) else value for key, value in config.items()})


def _source_config(source: resolve.StrategySource, fingerprint_arrays: bool) -> dict:
  """`source.to_config()`, without the optimizer's wall time with `fingerprint_arrays`."""
  config = source.to_config()
  if fingerprint_arrays:
    config['seconds'] = None
  return config


def _strategy_config(strategy: base.Strategy, fingerprint_arrays: bool) -> dict:
  """`strategy.to_config()` with its arrays as nested lists, or as shape and SHA-256."""
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


#: Every field of `RunPlan`, by name.
_FIELDS = {
    'strategy': _Field('object', False, _strategy_config, _strategy_from_config),
    'noise_multiplier': _Field('number', False),
    'value_noise_multiplier': _Field('number'),
    'clients_per_round': _Field('number'),
    'clip_norm': _Field('number'),
    'adaptive_clip': _settings_field(settings.AdaptiveClipping.from_config),
    'clipped_count_stddev': _Field('number'),
    'restarts': _settings_field(settings.RestartSchedule.from_config),
    'secure': _settings_field(lambda config: settings.SecureAggregation(**config)),
    'zeroing_norm': _Field('number'),
    'beyond_max_rounds': _Field('string'),
    'sampling': _Field('object', False, lambda value, _: value.to_config(),
                       lambda config: Sampling(**config)),
    'num_rounds': _Field('integer'),
    'participation': _Field('object', True, lambda schema, _: dataclasses.asdict(schema),
                            lambda config: participation_lib.ParticipationSchema(**config)),
    'target_delta': _Field('number'),
    'strategy_source': _Field('object', True, _source_config, resolve.StrategySource.from_config),
    'calibration': _Field('object'),
    'population': _Field('integer'),
    'noise_seed_fixed': _Field('boolean'),
}


#: The plan fields a run may change when it resumes (`resume_changes`): its rounds, the delta of its
#: (epsilon, delta) statement, the banded policy past `max_rounds` (it acts only on rounds past them),
#: the target a noise multiplier was calibrated to (the multiplier itself must stay) and where the
#: strategy came from (a resumed run uses the strategy it trained with). Every other field
#: determines how the rounds already trained were sampled, clipped and noised.
RESUMABLE_FIELDS = ('num_rounds', 'target_delta', 'beyond_max_rounds', 'calibration',
                    'strategy_source')


def resume_changes(trained: dict, resumed: dict) -> List[str]:
  """How a resumed run's plan `resumed` departs from the plan `trained` its earlier rounds were
  trained with: 'name: trained -> resumed' for each differing leaf outside `RESUMABLE_FIELDS`
  (nested names joined by '.', e.g. 'participation.max_participations: 2 -> 3'), sorted; [] when
  the run may resume. Both are `RunPlan.to_config` documents (or read back from JSON), with or
  without `fingerprint_arrays`, the same on both sides."""
  if not isinstance(trained, dict) or not isinstance(resumed, dict):
    raise ValueError('`trained` and `resumed` must be plan documents (dicts of `to_config`).')
  changes = []

  def compare(name: str, before, after) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
      for key in sorted(set(before) | set(after)):
        compare(f'{name}.{key}', before.get(key), after.get(key))
    elif before != after:
      changes.append(f'{name}: {_short(before)} -> {_short(after)}')

  for key in sorted(set(trained) | set(resumed)):
    if key not in RESUMABLE_FIELDS:
      compare(key, trained.get(key), resumed.get(key))
  return changes


def _short(value, limit: int = 60) -> str:
  """`value` as JSON, cut to `limit` characters (a strategy's arrays can be long)."""
  text = json.dumps(value)
  return text if len(text) <= limit else text[:limit - 3] + '...'


def plan_json(plan: RunPlan) -> str:
  """The text of a plan file: `plan.to_config()` as JSON, what `load_plan` reads."""
  if not isinstance(plan, RunPlan):
    raise ValueError(f'`plan` must be a RunPlan, got {type(plan).__name__}.')
  return json.dumps(plan.to_config(), indent=2, allow_nan=False) + '\n'


def save_plan(plan: RunPlan, path) -> None:
  """Writes `plan_json(plan)` to `path` (via a temp file, renamed into place)."""
  _atomic.write_text(path, plan_json(plan))


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
