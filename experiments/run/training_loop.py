"""The resumable training loop of the simulation drivers: setup, rounds, metrics, the privacy report.

`run(task, config)` trains (or resumes) a run described by a `run_config.RunConfig`. A run writes
into `<root_output_dir>/<experiment_name>/`:
  * `hparams.json`: the run's settings (a resumed run must match them, except
    `run_config.RESUMABLE_CHANGES`);
  * `plan.json`: the `dp_ftrl_tff.plan.RunPlan` (mechanism and where it came from, noise multiplier
    and its split, clip, restarts, SecAgg, sampling, rounds, declared participation, target delta):
    everything that determines the privacy guarantee (`experiments.run.run_setup`, whose
    `start_run` the train_model program shares);
  * `mechanism.json` / `mechanism.npz`: the strategy used (loaded, optimized at start, or built);
  * `checkpoints/program_state_<r>`: `tff.program.FileProgramStateManager` states after r rounds
    (learning state incl. aggregator noise state, and the client sampler's state), each with
    `checkpoints/record_<r>.json`, what it vouches for (`experiments.run.checkpoint_records`: a
    resume is checked against it);
  * `participation.csv`: the participation log `client_id,round` (0-based rounds);
  * with `canary_clients`: `canaries.json` and `canaries.csv`, the canaries' ids, seed and
    per-round projections (`experiments.run.canary_clients`; docs/auditing.md);
  * `metrics.csv` and `tensorboard/`: per-round metrics through `tff.program` release managers;
  * `privacy_report/`: report.json, report.md and plots, its summary printed at the end
    (`experiments.run.run_report`);
  * `summary.json`: the completion marker, written last (`experiments.run.run_summary`: final
    metrics, epsilon, per-round times, hparams), with the TensorBoard HParams session and `final/*`
    scalars in `tensorboard/`.
Rerunning with the same output directory resumes from the latest checkpoint. The directory's safety
(`run.lock` held by one run at a time, atomic files, torn log lines dropped, `workers.json` with the
run's worker_binary PIDs) is `experiments.run.run_dir`'s. SIGINT / SIGTERM are recorded and seen at
the run's safe points (`experiments.run.stop_signals`): between the steps of its start and of its
end (report, summary), in the library's long computations, and after each round, which stops once
the round's checkpoint is saved. The plan is the one road: the factory, the console
(`experiments.run.console`) and the report all read it.
"""

import asyncio
import os
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import tensorflow_federated as tff
from absl import logging

from dp_ftrl_tff import sampling, stopping
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.learning import remote_contexts
from dp_ftrl_tff.programs import metrics_release
from experiments.run import (
  canary_clients,
  checkpoint_records,
  console,
  evaluation,
  record_checks,
  run_config,
  run_dir,
  run_report,
  run_setup,
  run_start,
  run_summary,
  secure_context,
  stop_signals,
)
from experiments.run.run_config import RunConfig, Task
from experiments.workers import remote_workers


def _round_metrics(output) -> Dict[str, float]:
  """Flat scalar metrics of one round: `train_<metric>` and `aggregator/<measurement>` (the rows of
  train_model programs too: `programs.metrics_release.round_metrics`)."""
  return metrics_release.round_metrics({'model_metrics': output.metrics['client_work']['train'],
                                        'aggregator': output.metrics['aggregator']})


def _set_up(task: Task, config: RunConfig, directory: run_dir.RunDirectory
            ) -> Tuple[run_start.RunStart, sampling.Sampler]:
  """The run's start (`run_start.start_run`: every check, the plan, the header and the process,
  writing nothing; see `run`), its execution context and its client sampler (min-sep: exactly
  `clients_per_round` clients; with the plan's `sampling`, Poisson / cyclic Poisson cohorts of
  random size; either seeded by `config.seed` and checkpointed through `state` / `load_state`). A
  round whose random cohort is empty still runs with no client: the aggregator adds the round's
  noise to a zero sum (the guarantee of Poisson sampling assumes every round is released with its
  noise), and its train metrics are NaN."""
  with run_start.setup_errors(secure_context.SecureContextError):
    start = run_start.start_run(task, config, directory)
    # The execution context before any computation runs (see experiments/run/secure_context.py).
    if config.secure_aggregation:
      secure_context.use_secure_context()
    elif config.workers is not None:
      remote_contexts.set_remote_execution_context(config.workers)
    sampler = sampling.make_sampler(start.client_ids, start.plan, config.seed)
  stop_signals.check()
  return start, sampler


def run(task: Task, config: RunConfig) -> Dict[str, Any]:
  """Trains (or resumes) a run; returns the final metrics and the privacy report.

  With `secure_aggregation`, the process runs in TFF's test execution context, the only local one
  that runs secure sums (`experiments.run.secure_context.use_secure_context`: it replaces TFF's
  default context, even after computations ran in it, and rejects a context the caller set or
  installed unless it runs secure sums). A round whose secure sum wrapped around the 2^bits field
  (measurement `modular_wrap`) is logged as a warning; the result lists those rounds.

  Raises:
    run_start.SetupError (a ValueError): on bad settings, an impossible schedule, an unknown or
      mismatched mechanism, a run directory holding a run with other settings, or an execution
      context that cannot run secure sums, a `mechanism_file` that cannot be read; before any
      training.
    run_dir.RunDirError: the run directory is in use by another run (its PID in the message),
      holds a corrupt run file (hparams.json, plan.json, the mechanism file), or a file that does
      not hold what the checkpoint it resumes from recorded; before any training.
    stop_signals.Interrupted: on SIGINT or SIGTERM, at the next safe point: a step of the start
      or of the end, or after the current round and its checkpoint (see
      experiments/run/stop_signals.py; the process's `StopSignals`, or one installed for the run).
      A rerun resumes bit-identically.
  """
  with run_start.setup_errors():
    if not isinstance(config, RunConfig):
      raise ValueError(f'`config` must be a RunConfig, got {type(config).__name__}.')
  directory = run_dir.RunDirectory(config.output_dir)
  with stop_signals.watching() as stop:
    stop.where = stop_signals.START
    try:
      return _run(task, config, directory, stop)
    finally:
      directory.release(remove_if_created=True)


def _run(task: Task, config: RunConfig, directory: run_dir.RunDirectory,
         stop: stop_signals.StopSignals) -> Dict[str, Any]:
  """`run` with the run directory (not yet locked) and the stop signals installed."""
  start, sampler = _set_up(task, config, directory)
  directory.remove_stale_temps()
  run_setup.write_run_files(config, start.resolved, start.plan, start.saved_strategy,
                            start.run_id)
  stop_signals.check()
  training = _Training(task, config, start, sampler, directory)
  stop_signals.check()
  start_round = training.restore()
  training.train(start_round, stop)
  rounds_done = max(start_round, config.rounds)  # the round of the checkpoint the run ends on
  stop.where = stop_signals.finish_stage(config.rounds)
  stop_signals.check()
  if training.canaries is not None:
    training.canaries.record_final(start.process.get_model_weights(training.initial_state).trainable,
                                   start.process.get_model_weights(training.state).trainable)
    # The record of the checkpoint the run ends on vouches for the cosines too.
    checkpoint_records.record_final_files(config.output_dir, rounds_done)
    stop_signals.check()
  report = run_report.finish(config, start.plan, task.accuracy_metric,
                            trained=start_round < config.rounds, rounds_done=rounds_done,
                            run_id=start.run_id)
  return {'metrics': training.metrics, 'state': training.state, 'process': start.process,
          'privacy_report': report, 'modular_wrap_rounds': training.wrap_rounds}


def _trainable_size(process, state) -> int:
  return sum(int(np.size(w)) for w in process.get_model_weights(state).trainable)


class _Training:
  """The rounds of a run: its sampler, checkpoints, participation log and metric releases."""

  def __init__(self, task: Task, config: RunConfig, start: run_start.RunStart,
               sampler: sampling.Sampler,
               directory: run_dir.RunDirectory):
    self.task, self.config, self.start, self.directory = task, config, start, directory
    self.plan = start.plan
    self.sampler = sampler
    self.initial_state = start.process.initialize()
    directory.record_workers()
    self.state_manager = tff.program.FileProgramStateManager(
        checkpoint_records.checkpoints_dir(config.output_dir), keep_total=3)
    self.state, self.metrics, self.wrap_rounds = self.initial_state, {}, []
    self.workers = remote_workers.RemoteWorkers(config.workers)
    self.canaries = None
    if start.canaries is not None:
      # A canary's dataset is never read: an empty one of the task's type.
      empty = task.client_preprocess_fn(
          task.train_data.create_tf_dataset_for_client(start.client_ids[0])).take(0)
      self.canaries = canary_clients.CanaryRecorder(
          start.canaries, start.canary_ids, empty, config.output_dir,
          _trainable_size(start.process, self.initial_state), self.plan, start.run_id)

  def _path(self, name: str) -> str:
    return os.path.join(self.config.output_dir, name)

  def checkpoint(self, done: int) -> None:
    """Saves the state after `done` rounds, then its record of the run's files
    (`checkpoint_records`): a checkpoint counts only once its record is written."""
    asyncio.run(self.state_manager.save({'learning': self.state,
                                         'sampler': self.sampler.state}, done))
    checkpoint_records.write_record(self.config.output_dir, done,
                                    run_config.hparams_document(self.config),
                                    checkpoint_records.plan_document(self.plan), self.start.run_id)

  def restore(self) -> int:
    """Loads the checkpoint the run resumes from (`RunStart.resumption`, its files checked) and
    trims the logs to its record, or starts the logs and saves round 0's checkpoint; returns the
    first round to train."""
    resumption, rebuild = self.start.resumption, self.start.rebuild
    output_dir = self.config.output_dir
    checkpoint_records.set_aside(output_dir, resumption)
    if resumption.fresh:  # a run killed while creating the log leaves a torn header
      run_dir.drop_torn_last_line(self._path(run_dir.PARTICIPATION_FILE), 'round')
    else:
      checkpoint_records.trim_files(output_dir, resumption)
    # A run killed while appending to metrics.csv leaves a torn last line (of a round it redoes).
    run_dir.drop_torn_last_line(self._path(run_dir.METRICS_FILE), 'round')
    self.log = participation_log.ParticipationLogWriter(self._path(run_dir.PARTICIPATION_FILE))
    if self.canaries is not None:
      self.canaries.start_files(resumption.fresh, rebuild)
    if resumption.fresh:
      self.checkpoint(0)
      return 0
    record_checks.check_rebuilt(output_dir, resumption, rebuild)
    return self._load(resumption.round_num)

  def _load(self, start_round: int) -> int:
    """Loads checkpoint `start_round` (the state and the sampler's); returns it."""
    output_dir = self.config.output_dir
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
    """Trains rounds `start_round` .. n-1, checkpointing on schedule and on a stop signal: a signal
    recorded during a round (`stop`) stops the run after it, once its checkpoint is saved."""
    config = self.config
    releases = (tff.program.CSVFileReleaseManager(self._path(run_dir.METRICS_FILE),
                                                  key_fieldname='round'),
                tff.program.TensorBoardReleaseManager(self._path('tensorboard')))
    stop_signals.check()  # the start's last safe point
    started = time.time()
    with stopping.stop_check(None):  # during the rounds a signal is seen after the round, below
      for round_num in range(start_round, config.rounds):
        round_start = time.time()
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
    self._wrap_summary(start_round)

  def _datasets(self, cohort: List[str]) -> list:
    """The process's input for `cohort` (with canaries: paired with their canary indices)."""
    task = self.task
    dataset_fn = lambda c: task.client_preprocess_fn(  # noqa: E731
        task.train_data.create_tf_dataset_for_client(c))
    if self.canaries is None:
      return [dataset_fn(c) for c in cohort]
    return self.canaries.client_data(cohort, dataset_fn)

  def _round(self, round_num: int) -> None:
    """One round: sample, log, train, and the round's metrics (with the evaluation when due)."""
    config, process = self.config, self.start.process
    cohort = self.sampler.sample(round_num)
    self.log.append_round(round_num, cohort)
    output = self.workers.run(f'round {round_num}', process.next, self.state,
                              self._datasets(cohort))
    self.state = output.state
    self.metrics = _round_metrics(output)
    if self.canaries is not None:
      self.canaries.record_round(round_num, output.metrics['aggregator'])
    self.metrics = metrics_release.blank_untrained(self.metrics)
    self.metrics['cohort_size'] = len(cohort)
    if self.metrics.get(run_dir.MODULAR_WRAP_METRIC, 0.0) > 0:
      self.wrap_rounds.append(round_num)
      logging.warning('%s', console.modular_wrap_warning(
          round_num, config.rounds, config.secure_bits, config.secure_modclip_prob))
    done = round_num + 1
    if done % config.eval_every == 0 or done == config.rounds:
      state = self.state
      self.metrics.update(self.workers.run(
          f'the evaluation after round {round_num}', lambda: evaluation.evaluate(
              self.task, process.get_model_weights(state), config.eval_max_examples)))

  def _print_round(self, round_num: int, mean_seconds: float) -> None:
    config, metrics = self.config, self.metrics
    done = round_num + 1
    console.out(console.round_log_line(
        round_num, config.rounds, metrics['train_loss'],
        metrics.get(f'train_{self.task.accuracy_metric}', float('nan')), metrics['round_seconds'],
        mean_seconds * (config.rounds - done)))
    if any(name.startswith('eval_') for name in metrics):
      spent = console.spent_guarantee(self.plan, self._path(run_dir.PARTICIPATION_FILE), done)
      console.out(console.eval_line(done, config.rounds, metrics, spent))

  def _wrap_summary(self, start_round: int) -> None:
    config = self.config
    if not config.secure_aggregation or start_round >= config.rounds:
      return
    (logging.warning if self.wrap_rounds else console.notice)(console.wrap_summary(
        self.wrap_rounds, start_round, config.rounds, config.secure_bits))
