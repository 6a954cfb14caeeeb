"""What the StackOverflow and EMNIST drivers share: common flags, the mechanism, the aggregator, the
resumable training loop, metrics releases, the per-round log line and the final privacy report.

A run writes into `<root_output_dir>/<experiment_name>/`:
  * `hparams.json`: the run's settings (a resumed run must match them, except `rounds` and intervals);
  * `mechanism.json` / `mechanism.npz`: the strategy used (loaded, optimized at start, or built);
  * `checkpoints/program_state_<r>`: `tff.program.FileProgramStateManager` states after r rounds
    (learning state incl. aggregator noise state, and the client sampler's state);
  * `participation.csv`: the participation log `client_id,round` (0-based rounds);
  * `metrics.csv` and `tensorboard/`: per-round metrics through `tff.program` release managers;
  * `privacy_report/`: report.json, report.md and plots (`dp_ftrl_tff.accounting.report`), its
    summary printed at the end.
Rerunning with the same output directory resumes from the latest checkpoint.

Conventions: rounds are 0-based; `min_sep` = b (r2 - r1 >= b; TF-Privacy's min_separation = b - 1);
the noise multiplier is relative to the clip norm and the mean divides by the fixed
`clients_per_round`.
"""

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging as std_logging
import os
import re
import sys
import time
from typing import Any, Callable, Dict, List, NoReturn, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import flags, logging

from dp_ftrl_tff import _validation, aggregators
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.learning import client_sampler as sampler_lib
from dp_ftrl_tff.learning import dp_ftrl
from dp_ftrl_tff.mechanisms import participation as participation_lib
from experiments import secure_context

AGGREGATORS = ('gaussian', 'tree', 'tree_efficient', 'banded', 'blt')
SECURE_ROTATIONS = ('dft', 'hd', 'none')

# Settings a resumed run may change.
_RESUMABLE_CHANGES = ('rounds', 'checkpoint_every', 'eval_every', 'eval_max_examples')

# ----------------------------------------------------------------------------------------------------
# Flags common to both drivers.

_ROOT_OUTPUT_DIR = flags.DEFINE_string('root_output_dir', None, 'Root directory of all runs.')
_EXPERIMENT_NAME = flags.DEFINE_string('experiment_name', 'run',
                                       'Run directory name under --root_output_dir.')
_ROUNDS = flags.DEFINE_integer('rounds', 20, 'Number of training rounds n.')
_CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 10,
                                          'Clients per round (also the fixed mean denominator).')
_CLIENT_LR = flags.DEFINE_float('client_learning_rate', 0.1, 'Client SGD learning rate.')
_CLIENT_BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 16, 'Client batch size.')
_CLIENT_EPOCHS = flags.DEFINE_integer('client_epochs', 1, 'Local epochs per round.')
_SERVER_LR = flags.DEFINE_float('server_learning_rate', 1.0, 'Server SGD learning rate.')
_SERVER_MOMENTUM = flags.DEFINE_float('server_momentum', 0.9, 'Server momentum in [0, 1).')
_AGGREGATOR = flags.DEFINE_enum('aggregator', 'blt', AGGREGATORS, 'Noise mechanism.')
_MECHANISM_FILE = flags.DEFINE_string(
    'mechanism_file', None, 'Strategy file (BLT .json / banded .npz from `python -m '
    'dp_ftrl_tff.mechanisms optimize`). Without it, banded/BLT are optimized at start.')
_NUM_BANDS = flags.DEFINE_integer('num_bands', None,
                                  'Bands when optimizing a banded strategy (default: min_sep).')
_NUM_BUFFERS = flags.DEFINE_integer('num_buffers', None,
                                    'BLT buffers when optimizing (default: chosen by the optimizer).')
_NOISE_MULTIPLIER = flags.DEFINE_float('noise_multiplier', 1.0,
                                       'sigma: noise std on the sum relative to the clip norm.')
_CLIP_NORM = flags.DEFINE_float('clip_norm', 1.0, 'L2 clip norm zeta (initial value if adaptive).')
_ADAPTIVE_CLIPPING = flags.DEFINE_bool('adaptive_clipping', False,
                                       'Quantile-based adaptive clipping (Gboard Alg. 1).')
_TARGET_QUANTILE = flags.DEFINE_float('target_unclipped_quantile', 0.5,
                                      'Adaptive clipping: target quantile.')
_CLIP_LR = flags.DEFINE_float('clip_learning_rate', 0.2, 'Adaptive clipping: learning rate.')
_CLIPPED_COUNT_STDDEV = flags.DEFINE_float(
    'clipped_count_stddev', None, 'Adaptive clipping: count noise std (default clients_per_round/20).')
_RESTART_WARMUP = flags.DEFINE_integer('restart_warmup', None,
                                       'First restart round (0-based); needs --restart_period.')
_RESTART_PERIOD = flags.DEFINE_integer('restart_period', None,
                                       'Rounds between mechanism restarts (e.g. an epoch).')
_MIN_SEP = flags.DEFINE_integer('min_sep', 1, 'b: rounds between two participations, r2 - r1 >= b.')
_MAX_PARTICIPATIONS = flags.DEFINE_integer('max_participations', None,
                                           'k: cap on participations per client (default none).')
_SECURE = flags.DEFINE_bool('secure_aggregation', False, 'Sum client updates with SecAgg.')
_SECURE_BITS = flags.DEFINE_integer('secure_bits', 20, 'SecAgg field size 2^bits, 1 <= bits <= 22.')
_SECURE_ROTATION = flags.DEFINE_enum(
    'secure_rotation', 'dft', SECURE_ROTATIONS,
    'SecAgg rotation before rounding: dft, hd (randomized Hadamard) or none (worst-case scale).')
_SECURE_BETA = flags.DEFINE_float(
    'secure_beta', 0.0,
    'SecAgg conditional stochastic rounding bias beta in [0, 1) (0: unconditional).')
_SECURE_MODCLIP_PROB = flags.DEFINE_float(
    'secure_modclip_prob', 1e-4,
    'SecAgg target probability of a modular wrap of the sum, in (0, 1).')
_DATA = flags.DEFINE_string('data', 'synthetic',
                            '"synthetic", "tff" (TFF loader) or a local cache dir / SQLite file.')
_SYNTHETIC_CLIENTS = flags.DEFINE_integer('synthetic_num_clients', 1000,
                                          'Synthetic data: population size.')
_SYNTHETIC_EXAMPLES = flags.DEFINE_integer('synthetic_examples_per_client', 20,
                                           'Synthetic data: mean examples per client.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the data, model init and client sampling.')
_NOISE_SEED = flags.DEFINE_integer('noise_seed', None,
                                   'Noise seed (default: OS entropy, stored in the checkpoint).')
_CHECKPOINT_EVERY = flags.DEFINE_integer('checkpoint_every', 10, 'Checkpoint every k rounds.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 10, 'Evaluate on the test set every k rounds.')
_EVAL_MAX_EXAMPLES = flags.DEFINE_integer('eval_max_examples', 10000,
                                          'Test examples used per evaluation.')
_TARGET_DELTA = flags.DEFINE_float('target_delta', 1e-6, 'delta of the (epsilon, delta) report.')

flags.register_validator('clip_norm', lambda v: v > 0, '--clip_norm must be positive.')


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
  aggregator: str = 'blt'
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
  target_delta: float = 1e-6
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
    _validation.check_one_of(self.aggregator, 'aggregator', AGGREGATORS)
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

  def secure_config(self) -> Optional[aggregators.SecureAggregation]:
    """The `SecureAggregation` of the run, or None without `secure_aggregation`."""
    if not self.secure_aggregation:
      return None
    rotation = None if self.secure_rotation == 'none' else self.secure_rotation
    return aggregators.SecureAggregation(bits=self.secure_bits, rotation=rotation,
                                         beta=self.secure_beta,
                                         modclip_prob=self.secure_modclip_prob)

  @property
  def output_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  @property
  def participation(self) -> participation_lib.ParticipationSchema:
    return participation_lib.ParticipationSchema.b_min_sep(self.min_sep,
                                                                 self.max_participations)

  def restart_schedule(self) -> Optional[aggregators.RestartSchedule]:
    """Restarts at rounds warmup + i * period (warmup defaults to the period), or None."""
    if self.restart_period is None:
      return None
    warmup = self.restart_period if self.restart_warmup is None else self.restart_warmup
    return aggregators.RestartSchedule(warmup=warmup, period=self.restart_period)


def config_from_flags(task_settings: Dict[str, Any]) -> RunConfig:
  """A `RunConfig` from the parsed common flags plus the driver's own settings."""
  names = [f.name for f in dataclasses.fields(RunConfig) if f.name != 'task']
  return RunConfig(**{n: flags.FLAGS[n].value for n in names}, task=dict(task_settings))


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


# ----------------------------------------------------------------------------------------------------
# Mechanism and aggregator.

_MECHANISM_BASENAME = 'mechanism'


def _saved_mechanism_path(output_dir: str) -> Optional[str]:
  for ext in ('.json', '.npz'):
    path = os.path.join(output_dir, _MECHANISM_BASENAME + ext)
    if os.path.exists(path):
      return path
  return None


def resolve_strategy(config: RunConfig):
  """The run's `Strategy`: from the run directory (resume), `--mechanism_file`, or built/optimized.

  Banded and BLT strategies without a file are optimized for (rounds, min_sep, max_participations) and
  saved beside the run, so a resumed run reuses them.
  """
  from dp_ftrl_tff.mechanisms import files  # pylint: disable=g-import-not-at-top

  saved = _saved_mechanism_path(config.output_dir)
  if saved is not None or config.mechanism_file is not None:
    strategy = files.load_strategy(saved or config.mechanism_file)
    if strategy.name != config.aggregator and not (
        config.aggregator.startswith('tree') and strategy.name.startswith('tree')):
      raise ValueError(f'`mechanism_file` {saved or config.mechanism_file!r} holds a '
                       f'{strategy.name!r} strategy, but --aggregator={config.aggregator}.')
    source, setting = ('run directory' if saved else config.mechanism_file), None
  else:
    strategy, source, setting = _build_strategy(config)
  if strategy.max_rounds is not None and strategy.max_rounds < config.rounds:
    raise ValueError(f'The {strategy.name} strategy covers {strategy.max_rounds} rounds, '
                     f'--rounds={config.rounds}.')
  if saved is None:
    os.makedirs(config.output_dir, exist_ok=True)
    ext = '.npz' if strategy.name == 'banded' else '.json'
    files.save_strategy(strategy, os.path.join(config.output_dir, _MECHANISM_BASENAME + ext),
                        setting=setting)
  logging.info('Mechanism (%s): %s', source, strategy)
  return strategy


def _build_strategy(config: RunConfig):
  participation = config.participation
  if config.aggregator == 'gaussian':
    from dp_ftrl_tff.mechanisms import gaussian  # pylint: disable=g-import-not-at-top
    return gaussian.GaussianStrategy(), 'built', None
  if config.aggregator in ('tree', 'tree_efficient'):
    from dp_ftrl_tff.mechanisms import tree  # pylint: disable=g-import-not-at-top
    variant = 'efficient' if config.aggregator == 'tree_efficient' else 'vanilla'
    return tree.TreeStrategy(variant), 'built', None
  start = time.time()
  if config.aggregator == 'blt':
    from dp_ftrl_tff.mechanisms import blt  # pylint: disable=g-import-not-at-top
    result = blt.optimize_blt(config.rounds, participation, num_buffers=config.num_buffers)
  else:
    from dp_ftrl_tff.mechanisms import banded  # pylint: disable=g-import-not-at-top
    num_bands = min(config.num_bands or config.min_sep, config.rounds)
    result = banded.optimize_banded(config.rounds, num_bands, participation)
  source = f'optimized for n={config.rounds}, {participation} in {time.time() - start:.1f} s'
  return result.strategy, source, result


def build_aggregator(config: RunConfig, strategy) -> aggregators.CorrelatedNoiseFactory:
  """The run's `CorrelatedNoiseFactory` for `strategy` (clipping, SecAgg, restarts from `config`)."""
  kwargs = dict(noise_seed=config.noise_seed, secure=config.secure_config())
  if config.adaptive_clipping:
    kwargs['adaptive_clip'] = aggregators.AdaptiveClipping(
        target_quantile=config.target_unclipped_quantile, learning_rate=config.clip_learning_rate,
        clipped_count_stddev=config.clipped_count_stddev)
  schedule = config.restart_schedule()
  args = (config.noise_multiplier, config.clients_per_round, config.clip_norm)
  factory = aggregators.CorrelatedNoiseFactory
  if config.aggregator == 'gaussian':
    return factory.gaussian(*args, restarts=schedule, **kwargs)
  if config.aggregator in ('tree', 'tree_efficient'):
    return factory.tree(*args, efficient=config.aggregator == 'tree_efficient',
                        restart_rounds=schedule, **kwargs)
  if config.aggregator == 'banded':
    return factory.banded(*args, strategy=strategy, restarts=schedule, **kwargs)
  return factory.blt(*args, strategy=strategy, restarts=schedule, **kwargs)


def momentum_reset_rounds(config: RunConfig, factory: aggregators.CorrelatedNoiseFactory
                          ) -> List[int]:
  """Rounds where the aggregator starts a new correlated-noise segment; the server momentum is reset
  there (DP-FTRLM `restart_dp_tree`). None for Gaussian noise, whose "restarts" only adopt a clip."""
  restarts = factory.accounting_config()['restarts']
  if config.aggregator == 'gaussian' or restarts is None:
    return []
  schedule = aggregators.RestartSchedule(warmup=restarts['warmup'], period=restarts['period'])
  return schedule.restart_rounds(config.rounds)


# ----------------------------------------------------------------------------------------------------
# The loop.


def _check_hparams(config: RunConfig) -> None:
  path = os.path.join(config.output_dir, 'hparams.json')
  current = json.loads(json.dumps(dataclasses.asdict(config)))
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    # A setting added after the run started (absent from its file) had its default value.
    saved = {**{f.name: f.default for f in dataclasses.fields(RunConfig)
                if f.default is not dataclasses.MISSING and f.name not in saved}, **saved}
    changed = sorted(k for k in set(saved) | set(current)
                     if k not in _RESUMABLE_CHANGES and saved.get(k) != current.get(k))
    if changed:
      details = ', '.join(f'{k}: {saved.get(k)!r} -> {current.get(k)!r}' for k in changed)
      raise ValueError(f'{config.output_dir} holds a run with other settings ({details}); use '
                       'another --experiment_name or the same settings to resume.')
  os.makedirs(config.output_dir, exist_ok=True)
  with open(path, 'w') as f:
    json.dump(current, f, indent=2, sort_keys=True)


def _format_duration(seconds: float) -> str:
  return str(datetime.timedelta(seconds=int(round(seconds))))


def round_log_line(round_num: int, num_rounds: int, loss: float, accuracy: float,
                   round_seconds: float, eta_seconds: float) -> str:
  """One progress line: 1-based round counter, loss, accuracy, round time and ETA."""
  return (f'round {round_num + 1:>{len(str(num_rounds))}}/{num_rounds}  loss {loss:.4f}  '
          f'accuracy {accuracy:.4f}  round {round_seconds:.2f} s  ETA {_format_duration(eta_seconds)}')


def evaluate(task: Task, process, state, max_examples: int) -> Dict[str, float]:
  """Centralized evaluation of the current global model on (up to `max_examples` of) the test set."""
  model = task.keras_model_fn()
  process.get_model_weights(state).assign_weights_to(model)
  dataset = (task.eval_dataset.unbatch().take(max_examples).batch(256)
             .map(lambda batch: (batch['x'], batch['y'])))
  return {f'eval_{k}': float(v) for k, v in model.evaluate(dataset, verbose=0,
                                                             return_dict=True).items()}


#: The per-round metric holding the aggregator's `modular_wrap` measurement (SecAgg runs).
MODULAR_WRAP_METRIC = 'aggregator/modular_wrap'


def modular_wrap_warning(round_num: int, config: RunConfig) -> str:
  """The warning logged for a round whose secure sum wrapped around the 2^bits field."""
  return (f'Round {round_num}: the secure sum wrapped around the 2^{config.secure_bits} field '
          '(modular_wrap=1): this round\'s aggregate is corrupted, and the privacy guarantee '
          f'assumes no wrap. Increase --secure_bits (now {config.secure_bits}) or lower '
          f'--secure_modclip_prob (now {config.secure_modclip_prob:g}); see docs/aggregators.md, '
          '"Choosing bits, beta and modclip_prob".')


def _round_metrics(output) -> Dict[str, float]:
  """Flat scalar metrics of one round: `train_<metric>` and `aggregator/<measurement>`."""
  train = output.metrics['client_work']['train']
  values = {f'train_{k}': float(np.asarray(v)) for k, v in train.items()}
  for name, value in tff.program.structure_utils.flatten_with_name(output.metrics['aggregator']):
    value = np.asarray(value)
    if value.shape == () and np.issubdtype(value.dtype, np.number):
      values[f'aggregator/{name}'] = float(value)
  return values


class SetupError(ValueError):
  """A run cannot start (bad settings, impossible schedule, mismatched run directory or mechanism,
  an execution context without secure sums); raised before any training. The drivers print it as
  one line on stderr."""


@contextlib.contextmanager
def _setup_errors():
  """Turns the ValueErrors (and SecAgg context errors) of a run's setup into `SetupError`."""
  try:
    yield
  except SetupError:
    raise
  except (ValueError, secure_context.SecureContextError) as error:
    raise SetupError(str(error)) from error


def run(task: Task, config: RunConfig) -> Dict[str, Any]:
  """Trains (or resumes) a run; returns the final metrics and the privacy report.

  With `secure_aggregation`, the process runs in TFF's test execution context, the only local one
  that runs secure sums (`experiments.secure_context.use_secure_context`: it replaces TFF's default
  context, even after computations ran in it, and rejects a context the caller set or installed
  unless it runs secure sums). A round whose secure sum wrapped around the 2^bits field
  (measurement `modular_wrap`) is logged as a warning; the result lists those rounds.

  Raises:
    SetupError (a ValueError): on bad settings, an impossible schedule, an unknown or mismatched
      mechanism, a run directory holding a run with other settings, or an execution context that
      cannot run secure sums; before any training.
  """
  with _setup_errors():
    if not isinstance(config, RunConfig):
      raise ValueError(f'`config` must be a RunConfig, got {type(config).__name__}.')
    client_ids = list(task.train_data.client_ids)
    sampler_lib.check_schedule(len(client_ids), config.clients_per_round, config.min_sep,
                               config.max_participations, config.rounds)
    if config.secure_aggregation:
      # Chosen before anything is written or built (see experiments/secure_context.py).
      secure_context.use_secure_context()
    _check_hparams(config)
    strategy = resolve_strategy(config)
    aggregator = build_aggregator(config, strategy)
    process = dp_ftrl.build_dp_ftrl_process(
        task.model_fn, tff.learning.optimizers.build_sgdm(config.client_learning_rate),
        aggregator=aggregator, server_learning_rate=config.server_learning_rate,
        server_momentum=config.server_momentum)
  sampler = sampler_lib.ClientSampler(client_ids, config.clients_per_round, min_sep=config.min_sep,
                                      max_participations=config.max_participations,
                                      seed=config.seed)
  initial_state = process.initialize()
  state_manager = tff.program.FileProgramStateManager(
      os.path.join(config.output_dir, 'checkpoints'), keep_total=3)
  structure = {'learning': initial_state, 'sampler': sampler.state.to_dict()}
  loaded, start_round = asyncio.run(state_manager.load_latest(structure))
  if loaded is None:
    state, start_round = initial_state, 0
    asyncio.run(state_manager.save(structure, 0))
  else:
    state = loaded['learning']
    sampler.load_state(sampler_lib.SamplerState.from_dict(loaded['sampler']))
    logging.info('Resuming %s after round %d.', config.output_dir, start_round - 1)
  log = participation_log.ParticipationLogWriter(
      os.path.join(config.output_dir, 'participation.csv'))
  log.truncate(start_round)
  csv_release = tff.program.CSVFileReleaseManager(
      os.path.join(config.output_dir, 'metrics.csv'), key_fieldname='round')
  tb_release = tff.program.TensorBoardReleaseManager(os.path.join(config.output_dir, 'tensorboard'))
  restarts = set(momentum_reset_rounds(config, aggregator))
  metrics = {}
  wrap_rounds = []
  started = time.time()
  for round_num in range(start_round, config.rounds):
    round_start = time.time()
    if round_num in restarts:
      state = dp_ftrl.restart_state(state, initial_state)
      logging.info('Round %d starts a new mechanism segment (momentum reset).', round_num)
    cohort = sampler.sample(round_num)
    log.append_round(round_num, cohort)
    datasets = [task.client_preprocess_fn(task.train_data.create_tf_dataset_for_client(c))
                for c in cohort]
    output = process.next(state, datasets)
    state = output.state
    metrics = _round_metrics(output)
    if metrics.get(MODULAR_WRAP_METRIC, 0.0) > 0:
      wrap_rounds.append(round_num)
      logging.warning('%s', modular_wrap_warning(round_num, config))
    done = round_num + 1
    if done % config.eval_every == 0 or done == config.rounds:
      metrics.update(evaluate(task, process, state, config.eval_max_examples))
    round_seconds = time.time() - round_start
    metrics['round_seconds'] = round_seconds
    asyncio.run(csv_release.release(metrics, key=round_num))
    asyncio.run(tb_release.release(metrics, key=round_num))
    if done % config.checkpoint_every == 0 or done == config.rounds:
      asyncio.run(state_manager.save({'learning': state, 'sampler': sampler.state.to_dict()}, done))
    mean_seconds = (time.time() - started) / (done - start_round)
    logging.info('%s', round_log_line(round_num, config.rounds, metrics['train_loss'],
                                      metrics.get(f'train_{task.accuracy_metric}', float('nan')),
                                      round_seconds, mean_seconds * (config.rounds - done)))
  if config.secure_aggregation and start_round < config.rounds:
    log_fn = logging.warning if wrap_rounds else logging.info
    log_fn('SecAgg: modular wraps (secure sum outside the 2^%d field) in %d of the %d rounds '
           '%d-%d%s', config.secure_bits, len(wrap_rounds), config.rounds - start_round,
           start_round, config.rounds - 1, f': rounds {wrap_rounds}.' if wrap_rounds else '.')
  report = privacy_report(config, aggregator, strategy)
  if report is not None:
    logging.info('Privacy report (%s):\n%s', os.path.join(config.output_dir, 'privacy_report'),
                 report.summary())
  return {'metrics': metrics, 'state': state, 'process': process, 'privacy_report': report,
          'modular_wrap_rounds': wrap_rounds}


def privacy_report(config: RunConfig, factory: aggregators.CorrelatedNoiseFactory,
                   strategy) -> Optional[report_lib.PrivacyReport]:
  """The finished run's privacy report (`dp_ftrl_tff.accounting.report`), or None without noise.

  Written to `privacy_report/` (report.json, report.md with the BLT paper's App. C checklist, plots).
  The headline uses the participation observed in `participation.csv`; the declared schema's
  guarantee is under `declared`, and any violation of it is a warning. No amplification by sampling
  is claimed. With adaptive clipping the accounted noise multiplier is sigma (the model noise uses
  the inflated sigma_Delta, Gboard Thm. 1), and the report states both.
  """
  if factory.noise_multiplier == 0:
    logging.warning('Noise multiplier 0: the run has no differential-privacy guarantee.')
    return None
  accounting = factory.accounting_config()
  restart_rounds = None
  if accounting['restarts'] is not None and config.aggregator != 'gaussian':
    restart_rounds = aggregators.RestartSchedule(**accounting['restarts']).restart_rounds(
        config.rounds)
  log = log_lib.read_participation_log(os.path.join(config.output_dir, 'participation.csv'))
  report = report_lib.build_report(
      strategy, config.rounds, config.participation, noise_multiplier=factory.noise_multiplier,
      delta=config.target_delta, restart_rounds=restart_rounds, log=log,
      clipped_count_stddev=accounting['clipped_count_stddev'])
  report_lib.write_report(report, strategy, os.path.join(config.output_dir, 'privacy_report'))
  return report


def driver_main(build_task: Callable, config_from_flags: Callable[[], RunConfig]) -> Callable:
  """The absl `main` of a driver: flags -> `RunConfig` -> `run(build_task(config), config)`.

  Bad input (settings, data, schedule, run directory, execution context) ends the program before
  any training with one line on stderr naming the flag (`exit_with_error`); errors during training
  keep their traceback. Use with `app.run(main, flags_parser=parse_flags)`.
  """

  def main(argv):
    if len(argv) > 1:
      exit_with_error(f'unexpected arguments {argv[1:]}')
    set_up_logging()
    try:
      config = config_from_flags()
      task = build_task(config)
    except ValueError as error:
      exit_with_error(error)
    try:
      run(task, config)
    except SetupError as error:
      exit_with_error(error)

  return main


#: Exit status of a driver stopped by bad input (flags, settings, execution context).
ERROR_EXIT_CODE = 2
_BACKTICKED = re.compile(r'`([A-Za-z_][A-Za-z0-9_]*)`')


def error_line(error) -> str:
  """`error` as one line, with every backticked setting that is a flag written as `--name`."""
  def as_flag(match):
    return f'--{match.group(1)}' if match.group(1) in flags.FLAGS else match.group(0)
  return ' '.join(_BACKTICKED.sub(as_flag, str(error)).split())


def exit_with_error(error) -> NoReturn:
  """Prints `<program>: error: <one line>` on stderr and exits with `ERROR_EXIT_CODE`.

  Exits with `os._exit` after flushing: no interpreter teardown, in which TFF's local executor
  destructors print "Exception ignored ... Traceback" lines or wait forever for a worker that
  ignores SIGINT (see experiments/secure_context.py). Nothing has been trained at this point.
  """
  program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'driver'
  std_logging.shutdown()
  sys.stdout.flush()
  sys.stderr.write(f'{program}: error: {error_line(error)}\n')
  sys.stderr.flush()
  os._exit(ERROR_EXIT_CODE)


def parse_flags(argv: List[str]) -> List[str]:
  """The drivers' absl `flags_parser`: a flag error is one line on stderr (`exit_with_error`)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    exit_with_error(error)


def set_up_logging() -> None:
  """absl INFO lines on stderr without TF's chatter (drivers call it in main)."""
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger('tensorflow').setLevel(std_logging.ERROR)
