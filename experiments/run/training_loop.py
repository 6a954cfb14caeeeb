"""The resumable training loop of the simulation drivers: setup, rounds, metrics, the privacy report.

`run(task, config)` trains (or resumes) a run described by a `run_config.RunConfig`. A run writes
into `<root_output_dir>/<experiment_name>/`:
  * `hparams.json`: the run's settings (a resumed run must match them, except
    `run_config.RESUMABLE_CHANGES`);
  * `plan.json`: the `dp_ftrl_tff.plan.RunPlan` (mechanism and where it came from, noise multiplier
    and its split, clip, restarts, SecAgg, sampling, rounds, declared participation, target delta):
    everything that determines the privacy guarantee (`experiments.run.run_setup`);
  * `mechanism.json` / `mechanism.npz`: the strategy used (loaded, optimized at start, or built);
  * `checkpoints/program_state_<r>`: `tff.program.FileProgramStateManager` states after r rounds
    (learning state incl. aggregator noise state, and the client sampler's state), each with
    `checkpoints/record_<r>.json`, what it vouches for (`experiments.run.checkpoint_records`: a
    resume is checked against it);
  * `participation.csv`: the participation log `client_id,round` (0-based rounds);
  * with `canary_clients`: `canaries.json` and `canaries.csv`, the canaries' ids, seed and
    per-round projections (`dp_ftrl_tff.auditing.records`; docs/auditing.md);
  * `metrics.csv` and `tensorboard/`: per-round metrics through `tff.program` release managers;
  * `privacy_report/`: report.json, report.md and plots, its summary printed at the end
    (`experiments.run.run_report`);
  * `summary.json`: the completion marker, written last (`experiments.run.run_summary`: final
    metrics, epsilon, per-round times, hparams), with the TensorBoard HParams session and `final/*`
    scalars in `tensorboard/` (`experiments.run.hparams_summary`).
Rerunning with the same output directory resumes from the latest checkpoint. The directory's safety
(`run.lock` held by one run at a time, atomic files, torn log lines dropped, `workers.json` with the
run's worker_binary PIDs) is `experiments.run.run_dir`'s; SIGINT / SIGTERM stop after the current
round and its checkpoint (`experiments.run.stop_signals`). The plan is the one road: the factory,
the console and the report all read it.
"""

import asyncio
import contextlib
import dataclasses
import datetime
import os
import time
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow_federated as tff
from absl import logging

from dp_ftrl_tff import aggregators, auditing, sampling
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.learning import canaries as canaries_lib
from dp_ftrl_tff.learning import dp_ftrl, remote_execution
from dp_ftrl_tff.mechanisms import resolve
from dp_ftrl_tff.programs import metrics_release
from experiments.cli import flag_parsing
from experiments.run import (
  checkpoint_records,
  console,
  remote_workers,
  run_config,
  run_dir,
  run_report,
  run_setup,
  run_summary,
  secure_context,
  stop_signals,
)
from experiments.run.run_config import RunConfig, Task


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
MODULAR_WRAP_METRIC = run_dir.MODULAR_WRAP_METRIC


def modular_wrap_warning(round_num: int, config: RunConfig) -> str:
  """The warning logged for a round whose secure sum wrapped around the 2^bits field."""
  return (f'Round {round_num + 1}/{config.rounds}: the secure sum wrapped around the 2^{config.secure_bits} field '
          '(modular_wrap=1): this round\'s aggregate is corrupted, and the privacy guarantee '
          f'assumes no wrap. Increase --secure_bits (now {config.secure_bits}) or lower '
          f'--secure_modclip_prob (now {config.secure_modclip_prob:g}); see docs/aggregators.md, '
          '"Choosing bits, beta and modclip_prob".')


def _round_metrics(output) -> Dict[str, float]:
  """Flat scalar metrics of one round: `train_<metric>` and `aggregator/<measurement>` (the rows of
  train_model programs too: `programs.metrics_release.round_metrics`)."""
  return metrics_release.round_metrics({'model_metrics': output.metrics['client_work']['train'],
                                        'aggregator': output.metrics['aggregator']})


class SetupError(ValueError):
  """A run cannot start (bad settings, impossible schedule, mismatched run directory or mechanism,
  an execution context without secure sums); raised before any training. The drivers print it as
  one line on stderr. Its message names the settings as `RunConfig` (and the flags) does."""


@contextlib.contextmanager
def _setup_errors():
  """Turns the ValueErrors (and SecAgg context errors) of a run's setup into `SetupError`."""
  try:
    yield
  except SetupError:
    raise
  except (ValueError, secure_context.SecureContextError) as error:
    raise SetupError(flag_parsing.flag_words(str(error))) from error


@dataclasses.dataclass
class _Setup:
  """What a run starts from: its plan, the strategy behind it, the process and the client sampler
  (min-sep: exactly `clients_per_round` clients; with the plan's `sampling`, Poisson / cyclic
  Poisson cohorts of random size; either seeded by `config.seed` and checkpointed through `state` /
  `load_state`). A round whose random cohort is empty still runs with no client: the aggregator
  adds the round's noise to a zero sum (the guarantee of Poisson sampling assumes every round is
  released with its noise), and its train metrics are NaN."""
  plan: plan_lib.RunPlan
  resolved: resolve.ResolvedStrategy
  strategy_unsaved: bool
  process: Any
  client_ids: List[str]
  sampler: sampling.Sampler
  canaries: Optional[canaries_lib.Canaries]
  canary_ids: List[str]
  resumption: checkpoint_records.Resumption
  rebuild: List[str]  # run files to rebuild from the verified settings (`check_files`)


def _set_up(task: Task, config: RunConfig, directory: run_dir.RunDirectory) -> _Setup:
  """Checks everything and builds the plan and the process, writing nothing (see `run`); prints
  the console header once the plan is built."""
  with _setup_errors():
    canary_ids = canary_client_ids(task, config)
    client_ids = list(task.train_data.client_ids) + canary_ids
    if config.secure_aggregation:
      # Chosen before anything is written or built (see experiments/run/secure_context.py).
      secure_context.use_secure_context()
    elif config.workers is not None:
      # Before any computation runs, as the SecAgg context (see experiments/run/secure_context.py).
      remote_execution.set_remote_execution_context(config.workers)
    # The lock first, then every check (reading only); nothing is written before they pass.
    directory.acquire()
    directory.end_stale_workers()
    # A resumed run is checked against its checkpoint's record, never against hparams.json or
    # plan.json alone (they may be gone or replaced; they are rewritten from the record's settings).
    resumption = checkpoint_records.find_resumption(config.output_dir)
    checkpoint_records.check_settings(resumption, config)
    rebuild = checkpoint_records.check_files(config.output_dir, resumption)
    resolved, strategy_unsaved = run_setup.run_strategy(config, resumption.record and
                                                        resumption.record['plan'])
    plan = run_setup.build_plan(config, resolved, len(client_ids))
    checkpoint_records.check_plan(resumption, checkpoint_records.plan_document(plan))
    sampler = sampling.make_sampler(client_ids, plan, config.seed)  # checks a min-sep schedule
    # The header before the process: TFF takes most of the start-up to build it (10-20 s).
    console.out(console.header(plan, f'{config.data}: {len(client_ids)} training clients',
                               config.output_dir, task.keras_model_fn().count_params()))
    canaries = run_canaries(config, plan)
    process = dp_ftrl.build_dp_ftrl_process(
        task.model_fn, tff.learning.optimizers.build_sgdm(config.client_learning_rate),
        aggregator=aggregators.CorrelatedNoiseFactory(plan, noise_seed=config.noise_seed),
        server_learning_rate=config.server_learning_rate, server_momentum=config.server_momentum,
        canaries=canaries)
  return _Setup(plan, resolved, strategy_unsaved, process, client_ids, sampler, canaries,
                canary_ids, resumption, rebuild)


#: The id of canary client i is CANARY_ID_PREFIX + its 5-digit index.
CANARY_ID_PREFIX = 'canary-'


def canary_client_ids(task: Task, config: RunConfig) -> List[str]:
  """The ids of the run's `canary_clients` canary clients, appended to the task's population."""
  ids = [f'{CANARY_ID_PREFIX}{i:05d}' for i in range(config.canary_clients)]
  clashes = set(ids) & set(task.train_data.client_ids)
  if clashes:
    raise ValueError(f'`canary_clients`: the data has a client named {sorted(clashes)[0]!r}, a '
                     'canary id; rename it or run without canaries.')
  return ids


#: With adaptive clipping a canary's norm is this multiple of the initial clip: above any clip the
#: run reaches, so the clip brings the canary to (its direction) * (the round's clip).
ADAPTIVE_CANARY_NORM_FACTOR = 1e6


def run_canaries(config: RunConfig, plan: plan_lib.RunPlan) -> Optional[canaries_lib.Canaries]:
  """The run's canaries (seeded by `seed`), or None without `canary_clients`."""
  if not config.canary_clients:
    return None
  norm = plan.clip_norm * (1.0 if plan.adaptive_clip is None else ADAPTIVE_CANARY_NORM_FACTOR)
  return canaries_lib.Canaries(config.canary_clients, seed=config.seed, norm=norm)


def run(task: Task, config: RunConfig) -> Dict[str, Any]:
  """Trains (or resumes) a run; returns the final metrics and the privacy report.

  With `secure_aggregation`, the process runs in TFF's test execution context, the only local one
  that runs secure sums (`experiments.run.secure_context.use_secure_context`: it replaces TFF's
  default context, even after computations ran in it, and rejects a context the caller set or
  installed unless it runs secure sums). A round whose secure sum wrapped around the 2^bits field
  (measurement `modular_wrap`) is logged as a warning; the result lists those rounds.

  Raises:
    SetupError (a ValueError): on bad settings, an impossible schedule, an unknown or mismatched
      mechanism, a run directory holding a run with other settings, or an execution context that
      cannot run secure sums, a `mechanism_file` that cannot be read; before any training.
    run_dir.RunDirError: the run directory is in use by another run (its PID in the message),
      holds a corrupt run file (hparams.json, plan.json, the mechanism file), or a file that does
      not hold what the checkpoint it resumes from recorded; before any training.
    stop_signals.Interrupted: on SIGINT or SIGTERM; during training only after the current round
      and its checkpoint (see experiments/run/stop_signals.py). A rerun resumes bit-identically.
  """
  with _setup_errors():
    if not isinstance(config, RunConfig):
      raise ValueError(f'`config` must be a RunConfig, got {type(config).__name__}.')
  directory = run_dir.RunDirectory(config.output_dir)
  with stop_signals.StopSignals() as stop:
    try:
      return _run(task, config, directory, stop)
    finally:
      directory.release(remove_if_created=True)


def _run(task: Task, config: RunConfig, directory: run_dir.RunDirectory,
         stop: stop_signals.StopSignals) -> Dict[str, Any]:
  """`run` with the run directory (not yet locked) and the stop signals installed."""
  setup = _set_up(task, config, directory)
  directory.remove_stale_temps()
  run_setup.write_run_files(config, setup.resolved, setup.plan, setup.strategy_unsaved)
  training = _Training(task, config, setup, directory)
  start_round = training.restore()
  training.train(start_round, stop)
  training.record_final_canaries(trained=start_round < config.rounds)
  report = run_report.finish(config, setup.plan, task.accuracy_metric,
                             trained=start_round < config.rounds)
  return {'metrics': training.metrics, 'state': training.state, 'process': setup.process,
          'privacy_report': report, 'modular_wrap_rounds': training.wrap_rounds}


def _trainable_size(process, state) -> int:
  return sum(int(np.size(w)) for w in process.get_model_weights(state).trainable)


class _Training:
  """The rounds of a run: its sampler, checkpoints, participation log and metric releases."""

  def __init__(self, task: Task, config: RunConfig, setup: _Setup,
               directory: run_dir.RunDirectory):
    self.task, self.config, self.setup, self.directory = task, config, setup, directory
    self.sampler = setup.sampler
    self.initial_state = setup.process.initialize()
    directory.record_workers()
    self.state_manager = tff.program.FileProgramStateManager(
        checkpoint_records.checkpoints_dir(config.output_dir), keep_total=3)
    self.state, self.metrics, self.wrap_rounds = self.initial_state, {}, []
    self.workers = remote_workers.RemoteWorkers(config.workers)
    self.canary_index = {client: i for i, client in enumerate(setup.canary_ids)}
    self.canary_files = None
    if setup.canaries is not None:
      first = setup.client_ids[0]
      # A canary's dataset is never read: an empty one of the task's type.
      self.canary_dataset = task.client_preprocess_fn(
          task.train_data.create_tf_dataset_for_client(first)).take(0)
      self.canary_files = auditing.CanaryFilesWriter(
          config.output_dir, setup.canaries.num_canaries, setup.canaries.seed,
          list(self.canary_index), _trainable_size(setup.process, self.initial_state),
          plan=setup.plan)

  def _path(self, name: str) -> str:
    return os.path.join(self.config.output_dir, name)

  def checkpoint(self, done: int) -> None:
    """Saves the state after `done` rounds, then its record of the run's files
    (`checkpoint_records`): a checkpoint counts only once its record is written."""
    asyncio.run(self.state_manager.save({'learning': self.state,
                                         'sampler': self.sampler.state}, done))
    checkpoint_records.write_record(self.config.output_dir, done,
                                    run_config.hparams_document(self.config),
                                    checkpoint_records.plan_document(self.setup.plan))

  def restore(self) -> int:
    """Loads the checkpoint the run resumes from (`_Setup.resumption`, its files checked) and trims
    the logs to its record, or starts the logs and saves round 0's checkpoint; returns the first
    round to train."""
    resumption, output_dir = self.setup.resumption, self.config.output_dir
    checkpoint_records.set_aside(output_dir, resumption)
    if resumption.fresh:  # a run killed while creating the log leaves a torn header
      run_dir.drop_torn_last_line(self._path(run_dir.PARTICIPATION_FILE), 'round')
    else:
      checkpoint_records.trim_files(output_dir, resumption)
    # A run killed while appending to metrics.csv leaves a torn last line (of a round it redoes).
    run_dir.drop_torn_last_line(self._path(run_dir.METRICS_FILE), 'round')
    self.log = participation_log.ParticipationLogWriter(self._path(run_dir.PARTICIPATION_FILE))
    if self.canary_files is not None and (resumption.fresh or
                                          checkpoint_records.CANARY_METADATA in self.setup.rebuild):
      if not resumption.fresh:
        logging.warning('%s is missing or altered: rebuilt from the run\'s settings.',
                        self.canary_files.path)
      self.canary_files.write_metadata()
    if resumption.fresh:
      self.checkpoint(0)
      return 0
    checkpoint_records.check_rebuilt(output_dir, resumption, self.setup.rebuild)
    start_round = resumption.round_num
    structure = {'learning': self.initial_state, 'sampler': self.sampler.state}
    try:
      loaded = asyncio.run(self.state_manager.load(start_round, structure))
    except Exception as error:  # noqa: BLE001 (TFF's SavedModel reader raises many kinds)
      raise run_dir.corrupt_file_error(
          checkpoint_records.checkpoint_path(output_dir, start_round),
          f'{type(error).__name__}: {error}', 'start a new run with another --experiment_name.'
      ) from error
    self.state = loaded['learning']
    self.sampler.load_state(loaded['sampler'])
    console.notice(f'Resuming {output_dir} after round {start_round}/{self.config.rounds}.')
    if start_round < self.config.rounds:  # more rounds to train: not complete until they are
      run_summary.remove_summary(output_dir)
    return start_round

  def train(self, start_round: int, stop: stop_signals.StopSignals) -> None:
    """Trains rounds `start_round` .. n-1, checkpointing on schedule and on a stop signal."""
    config, plan = self.config, self.setup.plan
    releases = (tff.program.CSVFileReleaseManager(self._path(run_dir.METRICS_FILE),
                                                  key_fieldname='round'),
                tff.program.TensorBoardReleaseManager(self._path('tensorboard')))
    # DP-FTRLM (`restart_dp_tree`) resets the server momentum where a new correlated segment starts.
    restarts = set(plan.restart_rounds() if plan.strategy.correlated else ())
    started = time.time()
    stop.training = True  # a first SIGINT / SIGTERM now stops after the current round
    for round_num in range(start_round, config.rounds):
      round_start = time.time()
      if round_num in restarts:
        self.state = dp_ftrl.restart_state(self.state, self.initial_state)
        logging.info('Round %d starts a new mechanism segment (momentum reset).', round_num)
      self._round(round_num)
      done = round_num + 1
      self.metrics['round_seconds'] = time.time() - round_start
      for release in releases:
        asyncio.run(release.release(self.metrics, key=round_num))
      scheduled = done % config.checkpoint_every == 0 or done == config.rounds
      if scheduled:
        self.checkpoint(done)
      self._print_round(round_num, (time.time() - started) / (done - start_round))
      self.directory.record_workers()
      if stop.requested:
        if not scheduled:
          self.checkpoint(done)
        raise stop_signals.Interrupted(stop.signum, stop_signals.stopped_message(
            stop.signum, done, config.rounds))
    stop.training = False
    self._wrap_summary(start_round)

  def _round(self, round_num: int) -> None:
    """One round: sample, log, train, and the round's metrics (with the evaluation when due)."""
    cohort = self.sampler.sample(round_num)
    self.log.append_round(round_num, cohort)
    datasets = [self.canary_dataset if c in self.canary_index else
                self.task.client_preprocess_fn(self.task.train_data.create_tf_dataset_for_client(c))
                for c in cohort]
    if self.canary_files is not None:
      datasets = canaries_lib.client_data(
          datasets, [self.canary_index.get(c, canaries_lib.NOT_A_CANARY) for c in cohort])
    output = self.workers.run(f'round {round_num}', self.setup.process.next, self.state, datasets)
    self.state = output.state
    self.metrics = _round_metrics(output)
    if self.canary_files is not None:
      self._record_canaries(round_num, output.metrics['aggregator'])
    self.metrics = metrics_release.blank_untrained(self.metrics)
    self.metrics['cohort_size'] = len(cohort)
    if self.metrics.get(MODULAR_WRAP_METRIC, 0.0) > 0:
      self.wrap_rounds.append(round_num)
      logging.warning('%s', modular_wrap_warning(round_num, self.config))
    done = round_num + 1
    if done % self.config.eval_every == 0 or done == self.config.rounds:
      self.metrics.update(self.workers.run(
          f'the evaluation after round {round_num}', evaluate, self.task, self.setup.process,
          self.state, self.config.eval_max_examples))

  def _record_canaries(self, round_num: int, measurements) -> None:
    """Appends the round's canary projections in units of the round's clip on the SUM: the
    aggregator measures them on the mean, the sum over the fixed `clients_per_round`."""
    plan = self.setup.plan
    clip = float(measurements.get('clip', plan.clip_norm))
    projections = np.asarray(measurements[canaries_lib.PROJECTIONS_MEASUREMENT], np.float64)
    self.canary_files.append_round(round_num, projections * plan.clients_per_round / clip)

  def record_final_canaries(self, trained: bool) -> None:
    """Records the final model delta's cosines with the canary directions (once rounds were
    trained, or when a finished run lacks them)."""
    if self.canary_files is None:
      return
    if not trained and auditing.read_canaries(self.canary_files.path).final_cosines is not None:
      return
    process = self.setup.process
    delta = [initial - final for initial, final in zip(
        process.get_model_weights(self.initial_state).trainable,
        process.get_model_weights(self.state).trainable, strict=True)]
    projections = canaries_lib.projections(self.setup.canaries, delta).numpy().astype(np.float64)
    norm = float(np.sqrt(sum(np.sum(np.square(np.asarray(d, np.float64))) for d in delta)))
    self.canary_files.write_final(projections / norm if norm > 0 else projections)

  def _print_round(self, round_num: int, mean_seconds: float) -> None:
    config, metrics = self.config, self.metrics
    done = round_num + 1
    console.out(round_log_line(round_num, config.rounds, metrics['train_loss'],
                               metrics.get(f'train_{self.task.accuracy_metric}', float('nan')),
                               metrics['round_seconds'], mean_seconds * (config.rounds - done)))
    if any(name.startswith('eval_') for name in metrics):
      spent = console.spent_guarantee(self.setup.plan, self._path(run_dir.PARTICIPATION_FILE),
                                      done)
      console.out(console.eval_line(done, config.rounds, metrics, spent))

  def _wrap_summary(self, start_round: int) -> None:
    config = self.config
    if not config.secure_aggregation or start_round >= config.rounds:
      return
    (logging.warning if self.wrap_rounds else console.notice)(
        f'SecAgg: modular wraps (secure sum outside the 2^{config.secure_bits} field) in '
        f'{len(self.wrap_rounds)} of the {config.rounds - start_round} rounds {start_round + 1}-'
        f'{config.rounds}' + (f': rounds {[r + 1 for r in self.wrap_rounds]}.' if self.wrap_rounds
                              else '.'))
