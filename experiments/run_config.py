"""A driver run's settings (`RunConfig`, what `hparams.json` holds) and the setup they imply.

Setup before any training: the strategy (from the run directory on resume, `mechanism_file`, the
registry's parameter-free default, or the registry's optimizer), the run plan
(`dp_ftrl_tff.plan.RunPlan`, written to `plan.json`), and the hparams check of a resumed run. No flag
is read here: the binaries turn flags into a `RunConfig` (`experiments.driver_flags`).

Conventions: rounds are 0-based; `min_sep` = b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1);
the noise multiplier is relative to the clip norm and the mean divides by the fixed
`clients_per_round`.
"""

import dataclasses
import json
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf
from absl import logging

from dp_ftrl_tff import _atomic, _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import calibration, zcdp
from dp_ftrl_tff.learning import remote_execution
from dp_ftrl_tff.mechanisms import base, files, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib
from experiments import run_dir

MECHANISMS = registry.names(streaming_only=True)
SECURE_ROTATIONS = ('dft', 'hd', 'none')

# Settings a resumed run may change (they do not change what was trained).
RESUMABLE_CHANGES = ('rounds', 'checkpoint_every', 'eval_every', 'eval_max_examples',
                     'target_delta', 'banded_beyond_max_rounds', 'workers')
BEYOND_MAX_ROUNDS = ('error', 'restart')
#: Client samplers: min-sep (exactly `clients_per_round`, `learning.client_sampler`) or the random
#: cohorts of `plan.Sampling` (`learning.poisson_sampler`).
SAMPLERS = ('min_sep',) + plan_lib.SAMPLING_KINDS
#: `clients_per_round` of the min-sep sampler when not given.
DEFAULT_CLIENTS_PER_ROUND = 10
# hparams.json keys of earlier releases -> today's names.
_RENAMED_HPARAMS = {'aggregator': 'mechanism'}

PLAN_FILE = 'plan.json'
HPARAMS_FILE = 'hparams.json'
_HPARAMS_REMEDY = ('restore it (it holds the settings of the run in this directory), or start a new '
                   'run with another --experiment_name.')
_MECHANISM_BASENAME = 'mechanism'


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Every setting of a run (what `hparams.json` holds). See the flags of the same names."""
  root_output_dir: str
  experiment_name: str = 'run'
  rounds: int = 20
  clients_per_round: Optional[int] = None  # DEFAULT_CLIENTS_PER_ROUND (min-sep); None with Poisson
  client_learning_rate: float = 0.1
  client_batch_size: int = 16
  client_epochs: int = 1
  server_learning_rate: float = 1.0
  server_momentum: float = 0.9
  mechanism: str = 'blt'
  mechanism_file: Optional[str] = None
  num_bands: Optional[int] = None
  num_buffers: Optional[int] = None
  banded_beyond_max_rounds: str = 'error'
  noise_multiplier: Optional[float] = 1.0  # None with target_epsilon (calibrated at start)
  target_epsilon: Optional[float] = None
  clip_norm: float = 1.0
  adaptive_clipping: bool = False
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clipped_count_stddev: Optional[float] = None
  restart_warmup: Optional[int] = None
  restart_period: Optional[int] = None
  min_sep: int = 1
  max_participations: Optional[int] = None
  sampler: str = 'min_sep'
  sampling_prob: Optional[float] = None
  sampling_groups: Optional[int] = None  # cyclic_poisson b-hat (default: num_bands of banded)
  secure_aggregation: bool = False
  secure_bits: int = 20
  secure_rotation: str = 'dft'
  secure_beta: float = 0.0
  secure_modclip_prob: float = 1e-4
  data: str = 'synthetic'
  synthetic_num_clients: int = 1000
  synthetic_examples_per_client: int = 20
  seed: int = 0
  noise_seed: Optional[int] = None
  checkpoint_every: int = 10
  eval_every: int = 10
  eval_max_examples: int = 10000
  target_delta: float = zcdp.DEFAULT_DELTA
  workers: Optional[str] = None  # 'host:port,...' of TFF workers, None: run locally
  task: Dict[str, Any] = dataclasses.field(default_factory=dict)  # driver-specific settings

  def __post_init__(self):
    if not isinstance(self.root_output_dir, str) or not self.root_output_dir:
      raise ValueError('`root_output_dir` must be given (--root_output_dir).')
    self._resolve_sampler_settings()
    for name in ('rounds', 'client_batch_size', 'client_epochs', 'min_sep',
                 'checkpoint_every', 'eval_every', 'eval_max_examples', 'synthetic_num_clients',
                 'synthetic_examples_per_client', 'secure_bits'):
      _validation.check_positive_int(getattr(self, name), name)
    for name in ('max_participations', 'num_bands', 'num_buffers', 'restart_period'):
      if getattr(self, name) is not None:
        _validation.check_positive_int(getattr(self, name), name)
    if self.restart_warmup is not None:
      _validation.check_nonnegative_int(self.restart_warmup, 'restart_warmup')
      if self.restart_period is None:
        raise ValueError('`restart_warmup` needs `restart_period`.')
    _validation.check_one_of(self.mechanism, 'mechanism', MECHANISMS)
    _validation.check_one_of(self.banded_beyond_max_rounds, 'banded_beyond_max_rounds',
                             BEYOND_MAX_ROUNDS)
    _validation.check_positive_float(self.client_learning_rate, 'client_learning_rate')
    _validation.check_positive_float(self.server_learning_rate, 'server_learning_rate')
    _validation.check_float_in_range(self.server_momentum, 'server_momentum', 0.0, 1.0,
                                     high_inclusive=False)
    if self.target_epsilon is None:
      _validation.check_nonnegative_float(self.noise_multiplier, 'noise_multiplier')
    else:
      _validation.check_positive_float(self.target_epsilon, 'target_epsilon')
      if self.noise_multiplier is not None:
        raise ValueError('`target_epsilon` excludes `noise_multiplier` (the noise multiplier is '
                         'calibrated to the target): give only one of them.')
    _validation.check_positive_float(self.clip_norm, 'clip_norm')
    _validation.check_float_in_range(self.target_delta, 'target_delta', 0.0, 1.0,
                                     low_inclusive=False, high_inclusive=False)
    if self.mechanism_file is not None and not os.path.isfile(self.mechanism_file):
      raise ValueError(f'`mechanism_file`: no file at {self.mechanism_file!r}.')
    self._check_secure_settings()
    if self.workers is not None:
      object.__setattr__(self, 'workers', ','.join(remote_execution.parse_worker_addresses(
          self.workers, 'workers')))
      if self.secure_aggregation:
        raise ValueError(remote_execution.SECURE_SUM_ERROR)

  def _resolve_sampler_settings(self) -> None:
    """Checks the sampler settings and fills their defaults (stored as resolved in hparams.json).

    min_sep: `clients_per_round` defaults to `DEFAULT_CLIENTS_PER_ROUND`; no `sampling_*` settings.
    poisson / cyclic_poisson: `sampling_prob` is required, and `clients_per_round` must not be given:
    the mean divides by the expected cohort size q * population / b-hat (`plan.Sampling`). The
    sampler cannot cap participations (no `max_participations`) and SecAgg is not offered (its field
    is sized for a fixed cohort). Poisson enforces no separation (`min_sep` 1); cyclic Poisson
    enforces b = b-hat, so `min_sep` is set to `sampling_groups` (given as 1 or as b-hat), which
    defaults to `num_bands` for the banded mechanism.
    """
    _validation.check_one_of(self.sampler, 'sampler', SAMPLERS)
    if self.sampler == 'min_sep':
      for name in ('sampling_prob', 'sampling_groups'):
        if getattr(self, name) is not None:
          raise ValueError(f'`{name}` applies only to `sampler`=poisson or cyclic_poisson.')
      if self.clients_per_round is None:
        object.__setattr__(self, 'clients_per_round', DEFAULT_CLIENTS_PER_ROUND)
      _validation.check_positive_int(self.clients_per_round, 'clients_per_round')
      return
    if self.sampling_prob is None:
      raise ValueError(f'`sampler`={self.sampler} needs `sampling_prob` (q in (0, 1]).')
    _validation.check_float_in_range(self.sampling_prob, 'sampling_prob', 0.0, 1.0,
                                     low_inclusive=False)
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
    groups = self.sampling_groups
    if self.sampler == 'poisson':
      if groups not in (None, 1):
        raise ValueError(f'`sampling_groups`={groups} needs `sampler`=cyclic_poisson (poisson '
                         'draws from the whole population).')
      groups = 1
    elif groups is None:
      if self.mechanism != 'banded' or self.num_bands is None:
        raise ValueError('`sampler`=cyclic_poisson needs `sampling_groups` (b-hat; with '
                         '`mechanism`=banded, `num_bands` gives the default).')
      groups = self.num_bands
    groups = _validation.check_positive_int(groups, 'sampling_groups')
    if self.min_sep not in (1, groups):
      raise ValueError(
          f'`min_sep`={self.min_sep} does not match `sampler`={self.sampler}: '
          + ('poisson enforces no separation (min_sep 1).' if self.sampler == 'poisson' else
             f'cyclic Poisson with `sampling_groups`={groups} enforces min_sep {groups}.'))
    object.__setattr__(self, 'sampling_groups', groups)
    object.__setattr__(self, 'min_sep', groups)

  def sampling(self, population: int) -> Optional[plan_lib.Sampling]:
    """The `plan.Sampling` of a Poisson sampler over `population` clients, or None (min-sep)."""
    if self.sampler == 'min_sep':
      return None
    return plan_lib.Sampling(kind=self.sampler, sampling_prob=self.sampling_prob,
                             num_groups=self.sampling_groups, population=population)

  def _check_secure_settings(self) -> None:
    """SecAgg settings, named as the flags (checked even when `secure_aggregation` is off)."""
    if self.secure_bits > 22:
      raise ValueError(f'`secure_bits` must be at most 22 (TFF rounds in float32), got '
                       f'{self.secure_bits!r}.')
    _validation.check_one_of(self.secure_rotation, 'secure_rotation', SECURE_ROTATIONS)
    _validation.check_float_in_range(self.secure_beta, 'secure_beta', 0.0, 1.0,
                                     high_inclusive=False)
    _validation.check_float_in_range(self.secure_modclip_prob, 'secure_modclip_prob', 0.0, 1.0,
                                     low_inclusive=False, high_inclusive=False)
    if self.secure_aggregation:
      try:
        self.secure_config().unit_scale_factor(self.clients_per_round, 2)
      except ValueError as error:
        raise ValueError(
            f'`secure_bits`={self.secure_bits} is too small for `clients_per_round`='
            f'{self.clients_per_round}: the sum of the rounded updates cannot fit in the 2^bits '
            'field; increase `secure_bits`.') from error

  def secure_config(self) -> Optional[plan_lib.SecureAggregation]:
    """The `SecureAggregation` of the run, or None without `secure_aggregation`."""
    if not self.secure_aggregation:
      return None
    rotation = None if self.secure_rotation == 'none' else self.secure_rotation
    return plan_lib.SecureAggregation(bits=self.secure_bits, rotation=rotation,
                                      beta=self.secure_beta, modclip_prob=self.secure_modclip_prob)

  @property
  def output_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  @property
  def participation(self) -> participation_lib.ParticipationSchema:
    return participation_lib.ParticipationSchema.b_min_sep(self.min_sep, self.max_participations)

  def restart_schedule(self) -> Optional[plan_lib.RestartSchedule]:
    """Restarts at rounds warmup + i * period (warmup defaults to the period), or None."""
    if self.restart_period is None:
      return None
    warmup = self.restart_period if self.restart_warmup is None else self.restart_warmup
    return plan_lib.RestartSchedule(warmup=warmup, period=self.restart_period)

  def adaptive_clip(self) -> Optional[plan_lib.AdaptiveClipping]:
    """The `AdaptiveClipping` settings, or None for a fixed clip."""
    if not self.adaptive_clipping:
      return None
    return plan_lib.AdaptiveClipping(
        target_quantile=self.target_unclipped_quantile, learning_rate=self.clip_learning_rate,
        clipped_count_stddev=self.clipped_count_stddev)


@dataclasses.dataclass
class Task:
  """What a driver supplies: data, models and preprocessing.

  Attributes:
    train_data: the federated training population (`tff.simulation.datasets.ClientData`).
    model_fn: no-argument TFF model constructor for training.
    keras_model_fn: no-argument constructor of the same model as a compiled Keras model (evaluation).
    client_preprocess_fn: maps a client's raw dataset to its training batches.
    eval_dataset: centralized test batches (already preprocessed, elements `OrderedDict(x=, y=)`).
    accuracy_metric: name of the training metric printed as "accuracy" in the log line.
  """
  train_data: Any
  model_fn: Callable[[], Any]
  keras_model_fn: Callable[[], tf.keras.Model]
  client_preprocess_fn: Callable[[tf.data.Dataset], tf.data.Dataset]
  eval_dataset: tf.data.Dataset
  accuracy_metric: str = 'accuracy'


# ------------------------------------------------------------------------------------------------
# Setup: hparams, strategy, plan.


def check_hparams(config: RunConfig) -> None:
  """A resumed run must match the settings in `hparams.json` but `RESUMABLE_CHANGES` (reads only).

  Raises:
    ValueError: the directory holds a run with other settings.
    run_dir.CorruptRunFileError: `hparams.json` is not valid JSON.
  """
  path = os.path.join(config.output_dir, HPARAMS_FILE)
  current = _hparams_document(config)
  if os.path.exists(path):
    saved = run_dir.read_json(path, _HPARAMS_REMEDY)
    if not isinstance(saved, dict):
      raise run_dir.corrupt_file_error(path, 'not a JSON object', _HPARAMS_REMEDY)
    saved = {_RENAMED_HPARAMS.get(key, key): value for key, value in saved.items()}
    # A setting added after the run started (absent from its file) had its default value.
    saved = {**{f.name: f.default for f in dataclasses.fields(RunConfig)
                if f.default is not dataclasses.MISSING and f.name not in saved}, **saved}
    changed = sorted(k for k in set(saved) | set(current)
                     if k not in RESUMABLE_CHANGES and saved.get(k) != current.get(k))
    if changed:
      details = ', '.join(f'{k}: {saved.get(k)!r} -> {current.get(k)!r}' for k in changed)
      raise ValueError(f'{config.output_dir} holds a run with other settings ({details}); use '
                       'another --experiment_name or the same settings to resume.')


def write_hparams(config: RunConfig) -> str:
  """Writes `hparams.json` atomically (after `check_hparams`); returns its path."""
  path = os.path.join(config.output_dir, HPARAMS_FILE)
  os.makedirs(config.output_dir, exist_ok=True)
  _atomic.write_text(path, json.dumps(_hparams_document(config), indent=2, sort_keys=True))
  return path


def _hparams_document(config: RunConfig) -> dict:
  return json.loads(json.dumps(dataclasses.asdict(config)))


def check_and_write_hparams(config: RunConfig) -> None:
  """`check_hparams`, then `write_hparams`."""
  check_hparams(config)
  write_hparams(config)


def _saved_mechanism_path(output_dir: str) -> Optional[str]:
  for ext in ('.json', '.npz'):
    path = os.path.join(output_dir, _MECHANISM_BASENAME + ext)
    if os.path.exists(path):
      return path
  return None


def resolve_strategy(config: RunConfig) -> base.Strategy:
  """The run's `Strategy` (`load_or_build_strategy`), saved beside the run if it is not there yet,
  so a resumed run reuses it."""
  strategy, setting, needs_saving = load_or_build_strategy(config)
  if needs_saving:
    save_run_strategy(config, strategy, setting)
  return strategy


def save_run_strategy(config: RunConfig, strategy: base.Strategy, setting=None) -> str:
  """Writes `strategy` (and the setting it was optimized for) atomically to the run directory's
  `mechanism.json` / `.npz`; returns the path."""
  os.makedirs(config.output_dir, exist_ok=True)
  path = os.path.join(config.output_dir,
                      _MECHANISM_BASENAME + registry.get(strategy.name).file_suffix)
  files.save_strategy(strategy, path, setting=setting)
  return path


def load_or_build_strategy(config: RunConfig) -> Tuple[base.Strategy, Any, bool]:
  """(strategy, setting or None, whether it still has to be saved to the run directory), writing
  nothing. The strategy comes from the run directory (resume), `mechanism_file`, the registry's
  parameter-free default, or the registry's optimizer for (rounds, min_sep, max_participations).

  Raises:
    ValueError: a strategy of another kind than `mechanism`, or too few rounds.
    run_dir.CorruptRunFileError: the run directory's mechanism file cannot be read.
  """
  saved = _saved_mechanism_path(config.output_dir)
  setting = None
  if saved is not None or config.mechanism_file is not None:
    path = saved or config.mechanism_file
    try:
      strategy = files.load_strategy(path)
    except (ValueError, OSError) as error:
      if not saved:  # the user's --mechanism_file exists (checked in RunConfig) but is unreadable
        raise run_dir.corrupt_file_error(
            path, error, 'fix `mechanism_file` or rewrite it with `python -m '
            'dp_ftrl_tff.mechanisms optimize --output=...`.') from error
      raise run_dir.corrupt_file_error(
          path, error, 'restore it (the run\'s noise was drawn with this strategy), or start a '
          'new run with another --experiment_name.') from error
    if strategy.name != config.mechanism:
      raise ValueError(f'`mechanism_file` {path!r} holds a {strategy.name!r} strategy, but '
                       f'`mechanism`={config.mechanism}.')
    source = 'run directory' if saved else path
  elif not registry.get(config.mechanism).needs_parameters:
    strategy, source = registry.default_strategy(config.mechanism), 'built'
  else:
    start = time.time()
    options = {'num_bands': config.num_bands, 'num_buffers': config.num_buffers}
    setting = registry.optimizer(config.mechanism)(
        num_rounds=config.rounds, participation=config.participation,
        **{name: options[name] for name in registry.get(config.mechanism).optimizer_options})
    strategy = setting.strategy
    source = (f'optimized for n={config.rounds}, {config.participation} in '
              f'{time.time() - start:.1f} s')
  if (strategy.max_rounds is not None and strategy.max_rounds < config.rounds
      and config.banded_beyond_max_rounds != 'restart'):
    fix = ('or a new `experiment_name`' if saved else
           f'or a strategy file for at least {config.rounds} rounds')
    raise ValueError(f'the {strategy.name} strategy in {saved or config.mechanism_file} covers '
                     f'{strategy.max_rounds} rounds; `rounds`={config.rounds} needs '
                     f'`banded_beyond_max_rounds`=restart (a new noise segment every '
                     f'{strategy.max_rounds} rounds) {fix}.')
  logging.info('Mechanism (%s): %s', source, strategy)
  return strategy, setting, saved is None


def calibrate_noise_multiplier(config: RunConfig, strategy: base.Strategy,
                               restart_rounds) -> float:
  """The accounted noise multiplier meeting `target_epsilon` at `target_delta` for the declared
  participation, the strategy and the plan's restarts (`dp_ftrl_tff.accounting.calibration`)."""
  sens_sq = zcdp.accounted_sensitivity_squared(strategy, config.rounds, config.participation,
                                               zcdp.check_restart_rounds(restart_rounds, config.rounds))
  return calibration.noise_multiplier_for_epsilon(config.target_epsilon, sens_sq,
                                                  config.target_delta)


def build_plan(config: RunConfig, strategy: base.Strategy,
               population: Optional[int] = None) -> plan_lib.RunPlan:
  """The run's `RunPlan` (written to `plan.json` by `write_plan`); with `target_epsilon`, its noise
  multiplier is calibrated (`calibrate_noise_multiplier`, restarts from the plan). A Poisson
  `sampler` needs the `population` (number of training clients): the plan's `sampling`, whose
  expected cohort size is the plan's `clients_per_round`."""
  sampling = None
  if config.sampler != 'min_sep':
    if population is None:
      raise ValueError(f'`population` is required with `sampler`={config.sampler}.')
    sampling = config.sampling(population)
    warning = amplification_warning(strategy, sampling)
    if warning:
      logging.warning('%s', warning)
  if config.target_epsilon is not None:
    restarts = _build_plan(config, strategy, 1e-6, sampling).restart_rounds(config.rounds)
    sigma = calibrate_noise_multiplier(config, strategy, restarts)
    logging.info('Noise multiplier %.6g calibrated to epsilon=%g at delta=%g.', sigma,
                 config.target_epsilon, config.target_delta)
    return _build_plan(config, strategy, sigma, sampling)
  return _build_plan(config, strategy, config.noise_multiplier, sampling)


def amplification_warning(strategy: base.Strategy, sampling: plan_lib.Sampling) -> Optional[str]:
  """Why the random sampling cannot amplify the strategy's privacy, or None when it can.

  Amplification by (cyclic) Poisson sampling covers independent noise and banded strategies with at
  most b-hat bands (BandMF paper Sec. 7, docs/papers.md): then the rounds of one group share no
  noise with the other groups. Any other correlated strategy is accounted without amplification
  (with the min-sep schema the sampler enforces).
  """
  if not strategy.correlated:
    return None
  num_bands = getattr(strategy, 'num_bands', None)
  if num_bands is not None and num_bands <= sampling.num_groups:
    return None
  detail = ('it is not banded' if num_bands is None else
            f'its {num_bands} bands exceed the {sampling.num_groups} sampling groups')
  return (f'{sampling.kind} sampling cannot amplify the privacy of the {strategy.name} strategy '
          f'({detail}): the run trains, and its privacy is accounted without amplification.')


def _build_plan(config: RunConfig, strategy: base.Strategy, sigma: float,
                sampling: Optional[plan_lib.Sampling]) -> plan_lib.RunPlan:
  return plan_lib.RunPlan.build(
      strategy, sigma, config.clients_per_round, config.clip_norm,
      adaptive_clip=config.adaptive_clip(), secure=config.secure_config(),
      restarts=config.restart_schedule(), beyond_max_rounds=config.banded_beyond_max_rounds,
      sampling=sampling)


def check_plan_file(config: RunConfig) -> None:
  """Raises `run_dir.CorruptRunFileError` if the run directory's `plan.json` is not valid JSON."""
  path = os.path.join(config.output_dir, PLAN_FILE)
  if os.path.exists(path):
    remedy = ('delete it: the run rewrites it from hparams.json and the mechanism file (both '
              'checked); or start a new run with another --experiment_name.')
    if not isinstance(run_dir.read_json(path, remedy), dict):
      raise run_dir.corrupt_file_error(path, 'not a JSON object', remedy)


def write_plan(config: RunConfig, plan: plan_lib.RunPlan) -> str:
  """Writes `plan.json` into the run directory; returns its path."""
  path = os.path.join(config.output_dir, PLAN_FILE)
  plan_lib.save_plan(plan, path)
  return path
