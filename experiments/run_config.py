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
from typing import Any, Callable, Dict, Optional

import tensorflow as tf
from absl import logging

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import zcdp
from dp_ftrl_tff.mechanisms import base, files, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib

MECHANISMS = registry.names(streaming_only=True)
SECURE_ROTATIONS = ('dft', 'hd', 'none')

# Settings a resumed run may change (they do not change what was trained).
RESUMABLE_CHANGES = ('rounds', 'checkpoint_every', 'eval_every', 'eval_max_examples',
                     'target_delta')
# hparams.json keys of earlier releases -> today's names.
_RENAMED_HPARAMS = {'aggregator': 'mechanism'}

PLAN_FILE = 'plan.json'
_MECHANISM_BASENAME = 'mechanism'


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Every setting of a run (what `hparams.json` holds). See the flags of the same names."""
  root_output_dir: str
  experiment_name: str = 'run'
  rounds: int = 20
  clients_per_round: int = 10
  client_learning_rate: float = 0.1
  client_batch_size: int = 16
  client_epochs: int = 1
  server_learning_rate: float = 1.0
  server_momentum: float = 0.9
  mechanism: str = 'blt'
  mechanism_file: Optional[str] = None
  num_bands: Optional[int] = None
  num_buffers: Optional[int] = None
  noise_multiplier: float = 1.0
  clip_norm: float = 1.0
  adaptive_clipping: bool = False
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clipped_count_stddev: Optional[float] = None
  restart_warmup: Optional[int] = None
  restart_period: Optional[int] = None
  min_sep: int = 1
  max_participations: Optional[int] = None
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
  task: Dict[str, Any] = dataclasses.field(default_factory=dict)  # driver-specific settings

  def __post_init__(self):
    if not isinstance(self.root_output_dir, str) or not self.root_output_dir:
      raise ValueError('`root_output_dir` must be given (--root_output_dir).')
    for name in ('rounds', 'clients_per_round', 'client_batch_size', 'client_epochs', 'min_sep',
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
    _validation.check_positive_float(self.client_learning_rate, 'client_learning_rate')
    _validation.check_positive_float(self.server_learning_rate, 'server_learning_rate')
    _validation.check_float_in_range(self.server_momentum, 'server_momentum', 0.0, 1.0,
                                     high_inclusive=False)
    _validation.check_nonnegative_float(self.noise_multiplier, 'noise_multiplier')
    _validation.check_positive_float(self.clip_norm, 'clip_norm')
    _validation.check_float_in_range(self.target_delta, 'target_delta', 0.0, 1.0,
                                     low_inclusive=False, high_inclusive=False)
    if self.mechanism_file is not None and not os.path.isfile(self.mechanism_file):
      raise ValueError(f'`mechanism_file`: no file at {self.mechanism_file!r}.')
    self._check_secure_settings()

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


def check_and_write_hparams(config: RunConfig) -> None:
  """Writes `hparams.json`; a resumed run must match the stored settings but `RESUMABLE_CHANGES`."""
  path = os.path.join(config.output_dir, 'hparams.json')
  current = json.loads(json.dumps(dataclasses.asdict(config)))
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
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
  os.makedirs(config.output_dir, exist_ok=True)
  with open(path, 'w') as f:
    json.dump(current, f, indent=2, sort_keys=True)


def _saved_mechanism_path(output_dir: str) -> Optional[str]:
  for ext in ('.json', '.npz'):
    path = os.path.join(output_dir, _MECHANISM_BASENAME + ext)
    if os.path.exists(path):
      return path
  return None


def resolve_strategy(config: RunConfig) -> base.Strategy:
  """The run's `Strategy`: from the run directory (resume), `mechanism_file`, the registry's
  parameter-free default, or the registry's optimizer for (rounds, min_sep, max_participations).

  An optimized strategy is saved beside the run, so a resumed run reuses it.
  """
  saved = _saved_mechanism_path(config.output_dir)
  setting = None
  if saved is not None or config.mechanism_file is not None:
    path = saved or config.mechanism_file
    strategy = files.load_strategy(path)
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
  if strategy.max_rounds is not None and strategy.max_rounds < config.rounds:
    raise ValueError(f'The {strategy.name} strategy covers {strategy.max_rounds} rounds, '
                     f'`rounds`={config.rounds}.')
  if saved is None:
    os.makedirs(config.output_dir, exist_ok=True)
    suffix = registry.get(strategy.name).file_suffix
    files.save_strategy(strategy, os.path.join(config.output_dir, _MECHANISM_BASENAME + suffix),
                        setting=setting)
  logging.info('Mechanism (%s): %s', source, strategy)
  return strategy


def build_plan(config: RunConfig, strategy: base.Strategy) -> plan_lib.RunPlan:
  """The run's `RunPlan` (written to `plan.json` by `write_plan`)."""
  return plan_lib.RunPlan.build(
      strategy, config.noise_multiplier, config.clients_per_round, config.clip_norm,
      adaptive_clip=config.adaptive_clip(), secure=config.secure_config(),
      restarts=config.restart_schedule())


def write_plan(config: RunConfig, plan: plan_lib.RunPlan) -> str:
  """Writes `plan.json` into the run directory; returns its path."""
  path = os.path.join(config.output_dir, PLAN_FILE)
  plan_lib.save_plan(plan, path)
  return path
