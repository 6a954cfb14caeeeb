"""A training run's settings (`RunConfig`, what `hparams.json` holds) and `hparams.json`.

`RunConfig` holds every setting of a run that is not its task's (`training.task.Task`: model and
data): the mechanism (its options in `mechanism_options`, one per registry option), noise or target
epsilon, clipping, restarts, sampler, SecAgg, canaries, seeds and cadences. The drivers' flags have
the fields' names (`experiments.run.driver_config.DriverConfig` adds the drivers' own: output
location, data, batches). It validates by building the settings objects of the plan
(`dp_ftrl_tff.settings`: SecAgg, adaptive clipping, restarts, the participation schema), so each
setting has one check, and names the field in its errors. A resumed run must match the settings in
`hparams.json` (`check_hparams`) but `RESUMABLE_CHANGES`. The plan itself (strategy, calibration)
is `dp_ftrl_tff.training.run_setup`'s.

Conventions: rounds are 0-based; `min_sep` = b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1);
the noise multiplier is relative to the clip norm and the mean divides by the fixed
`clients_per_round`.
"""

import dataclasses
import json
import os
import re
from typing import Any, Dict, Optional, Tuple

from dp_ftrl_tff import _validation, plan_checks, settings
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.accounting import zcdp_epsilon
from dp_ftrl_tff.learning import remote_execution
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import registry
from dp_ftrl_tff.training import run_dir

SECURE_ROTATIONS = ('dft', 'hd', 'none')

# Settings a resumed run may change (they do not change what was trained).
RESUMABLE_CHANGES = ('rounds', 'checkpoint_every', 'eval_every', 'eval_max_examples',
                     'target_delta', 'banded_beyond_max_rounds', 'workers',
                     'allow_strategy_setting_mismatch')
#: hparams.json's key of the run's identity (`dp_ftrl_tff.auditing.RUN_ID_PATTERN`): not a setting.
RUN_ID_KEY = 'run_id'
#: `clients_per_round` of the min-sep sampler when not given.
DEFAULT_CLIENTS_PER_ROUND = 10

#: The library's name of a setting -> the `RunConfig` field that sets it, where the two differ
#: (a binary's flag has its field's name).
FIELD_NAMES = {
    'num_rounds': 'rounds',
    'delta': 'target_delta',
    'max_elements': 'max_elements_per_client',
    'participation': 'min_sep',
    'beyond_max_rounds': 'banded_beyond_max_rounds',
    'bits': 'secure_bits',
    'rotation': 'secure_rotation',
    'beta': 'secure_beta',
    'modclip_prob': 'secure_modclip_prob',
    'secure': 'secure_aggregation',
    'adaptive_clip': 'adaptive_clipping',
    'initial_clip': 'clip_norm',
    'num_groups': 'sampling_groups',
    'kind': 'sampler',
    'warmup': 'restart_warmup',
    'period': 'restart_period',
    'allow_setting_mismatch': 'allow_strategy_setting_mismatch',
    'num_clients': 'synthetic_num_clients',
    'examples_per_client': 'synthetic_examples_per_client',
}


def field_words(text: str, field_names=None) -> str:
  """`text` with each backticked library name of `FIELD_NAMES` written as its field's name (in
  backticks), where `field_names` (None: all) has that field."""
  def rename(match):
    field = FIELD_NAMES.get(match.group(1))
    if field is None or (field_names is not None and field not in field_names):
      return match.group(0)
    return f'`{field}`'
  return _BACKTICKED.sub(rename, str(text))


_BACKTICKED = re.compile(r'`([A-Za-z_][A-Za-z0-9_]*)`')

_HPARAMS_REMEDY = ('restore it (it holds the settings of the run in this directory), or start a new '
                   'run in another output directory.')


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Every setting of a run but its task's (what `hparams.json` holds), validated when built (a
  `ValueError` naming the field). The drivers' flags of the same names document each field;
  `mechanism_options` holds the mechanism's options that were given ({'num_bands': 3})."""
  rounds: int = 20
  clients_per_round: Optional[int] = None  # DEFAULT_CLIENTS_PER_ROUND (min-sep); None with Poisson
  client_learning_rate: float = 0.1
  server_learning_rate: float = 1.0
  server_momentum: float = 0.9
  mechanism: str = 'blt'
  mechanism_file: Optional[str] = None
  mechanism_options: Dict[str, Any] = dataclasses.field(default_factory=dict)
  allow_strategy_setting_mismatch: bool = False
  banded_beyond_max_rounds: str = 'error'
  noise_multiplier: Optional[float] = 1.0  # None with target_epsilon (calibrated at start)
  target_epsilon: Optional[float] = None
  clip_norm: float = 1.0
  adaptive_clipping: bool = False
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clipped_count_stddev: Optional[float] = None
  restart_rounds: Optional[Tuple[int, ...]] = None
  restart_warmup: Optional[int] = None
  restart_period: Optional[int] = None
  min_sep: int = 1
  max_participations: Optional[int] = None
  sampler: str = 'min_sep'
  sampling_prob: Optional[float] = None
  sampling_groups: Optional[int] = None  # cyclic_poisson b-hat (default: the num_bands option)
  secure_aggregation: bool = False
  secure_bits: int = 20
  secure_rotation: str = 'dft'
  secure_beta: float = 0.0
  secure_modclip_prob: float = 1e-4
  seed: int = 0
  noise_seed: Optional[int] = None
  canary_clients: int = 0  # N canary clients in the population (docs/auditing.md)
  checkpoint_every: int = 10
  eval_every: int = 10
  eval_max_examples: int = 10000
  target_delta: float = zcdp_epsilon.DEFAULT_DELTA
  workers: Optional[str] = None  # 'host:port,...' of TFF workers, None: run locally

  def __post_init__(self):
    try:
      self._check()
    except ValueError as error:
      raise ValueError(field_words(
          str(error), frozenset(f.name for f in dataclasses.fields(self)))) from error

  def _check(self) -> None:
    """Validates every setting (errors in the library's words; `__post_init__` renames them)."""
    self._resolve_sampler_settings()
    for name in ('rounds', 'checkpoint_every', 'eval_every', 'eval_max_examples'):
      _validation.check_positive_int(getattr(self, name), name)
    _validation.check_nonnegative_int(self.canary_clients, 'canary_clients')
    if not 0 <= _validation.check_nonnegative_int(self.seed, 'seed') < 2**63:
      # The data, model and sampler seeds become int64 tensors.
      raise ValueError(f'`seed` must lie in [0, 2**63) (an int64), got {self.seed}.')
    if self.canary_clients and self.secure_aggregation:
      # TFF's test context fails to compile the secure sums of the process with canaries.
      raise ValueError('`canary_clients` is not available with `secure_aggregation` (yet): audit '
                       'the same run without SecAgg.')
    self._check_mechanism()
    _validation.check_positive_float(self.client_learning_rate, 'client_learning_rate')
    _validation.check_positive_float(self.server_learning_rate, 'server_learning_rate')
    _validation.check_float_in_range(self.server_momentum, 'server_momentum', 0.0, 1.0,
                                     high_inclusive=False)
    if self.target_epsilon is None:
      plan_checks.check_noise_multiplier(self.noise_multiplier)
    else:
      _validation.check_positive_float(self.target_epsilon, 'target_epsilon')
      if self.noise_multiplier is not None:
        raise ValueError('`target_epsilon` excludes `noise_multiplier` (the noise multiplier is '
                         'calibrated to the target): give only one of them.')
    _validation.check_positive_float(self.clip_norm, 'clip_norm')
    _validation.check_float_in_range(self.target_delta, 'target_delta', 0.0, 1.0,
                                     low_inclusive=False, high_inclusive=False)
    self._check_plan_settings()
    if self.workers is not None:
      object.__setattr__(self, 'workers', ','.join(remote_execution.parse_worker_addresses(
          self.workers, 'workers')))
      if self.secure_aggregation:
        raise ValueError(remote_execution.SECURE_SUM_ERROR)

  def _check_mechanism(self) -> None:
    """A streaming mechanism of the registry, options of its own, an existing strategy file."""
    entry = registry.entry(self.mechanism)
    if not entry.streams:
      raise ValueError(f'`mechanism`={self.mechanism} has no streaming noise (it decodes '
                       f'offline); streaming mechanisms: {list(registry.names(True))}.')
    if not isinstance(self.mechanism_options, dict):
      raise ValueError(f'`mechanism_options` must be a dict, got {self.mechanism_options!r}.')
    for name in self.mechanism_options:
      entry.option(name)
    if self.mechanism_file is not None and not os.path.isfile(self.mechanism_file):
      raise ValueError(f'`mechanism_file`: no file at {self.mechanism_file!r}.')

  def _check_plan_settings(self) -> None:
    """The plan's settings objects validate the SecAgg, adaptive-clipping, restart and
    participation settings (even when their feature is off: a bad value is an error)."""
    _validation.check_one_of(self.secure_rotation, 'secure_rotation', SECURE_ROTATIONS)
    secure = self._secure_settings()
    self._adaptive_settings()
    self.restart_schedule()
    _validation.check_one_of(self.banded_beyond_max_rounds, 'banded_beyond_max_rounds',
                             plan_lib.BEYOND_MAX_ROUNDS)
    participation_lib.ParticipationSchema.b_min_sep(self.min_sep, self.max_participations)
    if self.secure_aggregation:
      secure.unit_scale_factor(self.clients_per_round, 2)

  def _resolve_sampler_settings(self) -> None:
    """Checks the sampler settings and fills their defaults (stored as resolved in hparams.json).

    min_sep: `clients_per_round` defaults to `DEFAULT_CLIENTS_PER_ROUND`; no `sampling_*` settings.
    poisson / cyclic_poisson: `sampling_prob` is required, and `clients_per_round` must not be given:
    the mean divides by the expected cohort size q * population / b-hat (`sampling.Sampling`). The
    sampler cannot cap participations (no `max_participations`) and SecAgg is not offered (its field
    is sized for a fixed cohort). Poisson enforces no separation (`min_sep` 1); cyclic Poisson
    enforces b = b-hat, so `min_sep` is set to `sampling_groups` (given as 1 or as b-hat), which
    defaults to the `num_bands` option.
    """
    _validation.check_one_of(self.sampler, 'sampler', sampling_lib.names())
    if not sampling_lib.entry(self.sampler).random_cohorts:
      for name in ('sampling_prob', 'sampling_groups'):
        if getattr(self, name) is not None:
          raise ValueError(f'`{name}` applies only to `sampler`=poisson or cyclic_poisson.')
      if self.clients_per_round is None:
        object.__setattr__(self, 'clients_per_round', DEFAULT_CLIENTS_PER_ROUND)
      _validation.check_positive_int(self.clients_per_round, 'clients_per_round')
      return
    self._check_random_sampler()
    groups = self.sampling_groups
    if self.sampler == 'poisson':
      if groups not in (None, 1):
        raise ValueError(f'`sampling_groups`={groups} needs `sampler`=cyclic_poisson (poisson '
                         'draws from the whole population).')
      groups = 1
    elif groups is None:
      groups = self.mechanism_options.get('num_bands') if isinstance(
          self.mechanism_options, dict) else None
      if groups is None:
        raise ValueError('`sampler`=cyclic_poisson needs `sampling_groups` (b-hat; the '
                         '`num_bands` option gives the default).')
    groups = _validation.check_positive_int(groups, 'sampling_groups')
    if self.min_sep not in (1, groups):
      raise ValueError(
          f'`min_sep`={self.min_sep} does not match `sampler`={self.sampler}: '
          + ('poisson enforces no separation (min_sep 1).' if self.sampler == 'poisson' else
             f'cyclic Poisson with `sampling_groups`={groups} enforces min_sep {groups}.'))
    object.__setattr__(self, 'sampling_groups', groups)
    object.__setattr__(self, 'min_sep', groups)

  def _check_random_sampler(self) -> None:
    """What a Poisson sampler needs and cannot do."""
    if self.sampling_prob is None:
      raise ValueError(f'`sampler`={self.sampler} needs `sampling_prob` (q in [2^-52, 1]).')
    sampling_lib.check_sampling_prob(self.sampling_prob)
    if self.clients_per_round is not None:
      raise ValueError(f'`clients_per_round` conflicts with `sampler`={self.sampler}: the mean '
                       'divides by the expected cohort size sampling_prob * population / '
                       'sampling_groups; drop `clients_per_round`.')
    if self.max_participations is not None:
      raise ValueError(f'`max_participations` cannot be enforced by `sampler`={self.sampler} '
                       '(independent coins); drop it (cyclic Poisson caps it at ceil(rounds / '
                       'sampling_groups) by itself).')
    if self.secure_aggregation:
      raise ValueError(f'`secure_aggregation` is not supported with `sampler`={self.sampler}: the '
                       'SecAgg field is sized for a fixed number of clients per round.')

  def sampling(self, population: int) -> sampling_lib.Sampling:
    """The `Sampling` of `sampler`; random cohorts are drawn over `population` clients."""
    if not sampling_lib.entry(self.sampler).random_cohorts:
      return sampling_lib.Sampling(self.sampler)
    return sampling_lib.Sampling(kind=self.sampler, sampling_prob=self.sampling_prob,
                                 num_groups=self.sampling_groups, population=population)

  def _secure_settings(self) -> settings.SecureAggregation:
    rotation = None if self.secure_rotation == 'none' else self.secure_rotation
    return settings.SecureAggregation(bits=self.secure_bits, rotation=rotation,
                                      beta=self.secure_beta, modclip_prob=self.secure_modclip_prob)

  def plan_settings(self, population: int) -> Dict[str, Any]:
    """The plan's settings objects (`RunPlan.build` keywords): `adaptive_clip` (None for a fixed
    clip), `secure` (None without SecAgg), `restarts` (None without) and `sampling` (random
    cohorts over `population` clients)."""
    return {'adaptive_clip': self._adaptive_settings() if self.adaptive_clipping else None,
            'secure': self._secure_settings() if self.secure_aggregation else None,
            'restarts': self.restart_schedule(), 'sampling': self.sampling(population)}

  @property
  def participation(self) -> participation_lib.ParticipationSchema:
    return participation_lib.ParticipationSchema.b_min_sep(self.min_sep, self.max_participations)

  def restart_schedule(self) -> Optional[settings.RestartSchedule]:
    """The `RestartSchedule` of `restart_rounds`, or of `restart_warmup` (default: the period) and
    `restart_period`; None without restarts."""
    return settings.RestartSchedule.of(self.restart_rounds, self.restart_warmup, self.restart_period)

  def _adaptive_settings(self) -> settings.AdaptiveClipping:
    return settings.AdaptiveClipping(
        target_unclipped_quantile=self.target_unclipped_quantile,
        clip_learning_rate=self.clip_learning_rate, clipped_count_stddev=self.clipped_count_stddev)


# ------------------------------------------------------------------------------------------------
# hparams.json


def check_hparams(config: RunConfig, output_dir: str) -> None:
  """A resumed run must match the settings in `output_dir`'s `hparams.json` but
  `RESUMABLE_CHANGES` (reads only).

  Raises:
    ValueError: the directory holds a run with other settings.
    run_dir.CorruptRunFileError: `hparams.json` is not valid JSON.
  """
  path = os.path.join(output_dir, run_dir.HPARAMS_FILE)
  current = hparams_document(config)
  if not os.path.exists(path):
    return
  saved = run_dir.read_json(path, _HPARAMS_REMEDY)
  if not isinstance(saved, dict):
    raise run_dir.corrupt_file_error(path, 'not a JSON object', _HPARAMS_REMEDY)
  # A setting added after the run started (absent from its file) had its default value.
  saved = {**{k: v for k, v in _default_hparams(type(config)).items() if k not in saved}, **saved}
  saved.pop(RUN_ID_KEY, None)
  changed = sorted(k for k in set(saved) | set(current)
                   if k not in RESUMABLE_CHANGES and saved.get(k) != current.get(k))
  if changed:
    details = ', '.join(f'{k}: {saved.get(k)!r} -> {current.get(k)!r}' for k in changed)
    raise ValueError(f'{output_dir} holds a run with other settings ({details}); use another '
                     'output directory or the same settings to resume.')


def hparams_document(config: RunConfig) -> dict:
  """The `hparams.json` document of `config` (JSON types: what reading the file back gives)."""
  return json.loads(json.dumps(dataclasses.asdict(config)))


def _default_hparams(config_type) -> dict:
  """The hparams of a run of `config_type` (a `RunConfig` or a subclass) with every default."""
  defaults = {}
  for field in dataclasses.fields(config_type):
    if field.default is not dataclasses.MISSING:
      defaults[field.name] = field.default
    elif field.default_factory is not dataclasses.MISSING:
      defaults[field.name] = field.default_factory()
  return json.loads(json.dumps(defaults))
