"""The resumable training loop of the simulation drivers: setup, rounds, metrics, the privacy report.

`run(task, config)` trains (or resumes) a run described by a `run_config.RunConfig`. A run writes
into `<root_output_dir>/<experiment_name>/`:
  * `hparams.json`: the run's settings (a resumed run must match them, except
    `run_config.RESUMABLE_CHANGES`);
  * `plan.json`: the `dp_ftrl_tff.plan.RunPlan` (mechanism, noise multiplier and its split, clip,
    restarts, SecAgg): everything that determines the privacy guarantee;
  * `mechanism.json` / `mechanism.npz`: the strategy used (loaded, optimized at start, or built);
  * `checkpoints/program_state_<r>`: `tff.program.FileProgramStateManager` states after r rounds
    (learning state incl. aggregator noise state, and the client sampler's state);
  * `participation.csv`: the participation log `client_id,round` (0-based rounds);
  * `metrics.csv` and `tensorboard/`: per-round metrics through `tff.program` release managers;
  * `privacy_report/`: report.json, report.md and plots, its summary printed at the end;
  * `summary.json`: the completion marker, written last (`experiments.run_summary`: final metrics,
    epsilon, per-round times, hparams), with the TensorBoard HParams session and `final/*` scalars
    in `tensorboard/` (`experiments.hparams_summary`).
Rerunning with the same output directory resumes from the latest checkpoint. The directory's safety
(`run.lock` held by one run at a time, atomic files, torn log lines dropped, `workers.json` with the
run's worker_binary PIDs) is `experiments.run_dir`'s; SIGINT / SIGTERM stop after the current round
and its checkpoint (`experiments.stop_signals`).
"""

import asyncio
import contextlib
import csv
import datetime
import os
import time
from typing import Any, Dict, Optional

import numpy as np
import tensorflow_federated as tff
from absl import logging

from dp_ftrl_tff import aggregators
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log, report_render
from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.learning import client_sampler as sampler_lib
from dp_ftrl_tff.learning import dp_ftrl, poisson_sampler, remote_execution
from experiments import (
  console,
  hparams_summary,
  run_config,
  run_dir,
  run_summary,
  secure_context,
  stop_signals,
)
from experiments.run_config import RunConfig, Task


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


def _build_sampler(config: RunConfig, plan: plan_lib.RunPlan, client_ids):
  """The run's client sampler: min-sep (exactly `clients_per_round` clients) or, with the plan's
  `sampling`, Poisson / cyclic Poisson cohorts of random size. Either is seeded by `config.seed` and
  checkpointed through `state` / `load_state`. A round whose random cohort is empty still runs with
  no client: the aggregator adds the round's noise to a zero sum (the guarantee of Poisson sampling
  assumes every round is released with its noise), and its train metrics are NaN."""
  if plan.sampling is not None:
    return poisson_sampler.PoissonSampler(client_ids, plan.sampling, seed=config.seed)
  return sampler_lib.ClientSampler(client_ids, config.clients_per_round, min_sep=config.min_sep,
                                   max_participations=config.max_participations, seed=config.seed)


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
    run_dir.RunDirError: the run directory is in use by another run (its PID in the message) or
      holds a corrupt run file (hparams.json, plan.json, the mechanism file); before any training.
    stop_signals.Interrupted: on SIGINT or SIGTERM; during training only after the current round
      and its checkpoint (see experiments/stop_signals.py). A rerun resumes bit-identically.
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
  with _setup_errors():
    client_ids = list(task.train_data.client_ids)
    if config.sampler == 'min_sep':
      sampler_lib.check_schedule(len(client_ids), config.clients_per_round, config.min_sep,
                                 config.max_participations, config.rounds)
    if config.secure_aggregation:
      # Chosen before anything is written or built (see experiments/secure_context.py).
      secure_context.use_secure_context()
    elif config.workers is not None:
      # Before any computation runs, as the SecAgg context (see experiments/secure_context.py).
      remote_execution.set_remote_execution_context(config.workers)
    # The lock first, then every check (reading only); nothing is written before they pass.
    directory.acquire()
    directory.end_stale_workers()
    run_config.check_hparams(config)
    run_config.check_plan_file(config)
    strategy, setting, strategy_unsaved = run_config.load_or_build_strategy(config)
    plan = run_config.build_plan(config, strategy, len(client_ids))
    aggregator = aggregators.CorrelatedNoiseFactory(plan, noise_seed=config.noise_seed)
    process = dp_ftrl.build_dp_ftrl_process(
        task.model_fn, tff.learning.optimizers.build_sgdm(config.client_learning_rate),
        aggregator=aggregator, server_learning_rate=config.server_learning_rate,
        server_momentum=config.server_momentum)
  directory.remove_stale_temps()
  run_config.write_hparams(config)
  if strategy_unsaved:
    run_config.save_run_strategy(config, strategy, setting)
  run_config.write_plan(config, plan)
  console.out(console.header(config, plan, len(client_ids)))
  sampler = _build_sampler(config, plan, client_ids)
  initial_state = process.initialize()
  directory.record_workers()
  state_manager = tff.program.FileProgramStateManager(
      os.path.join(config.output_dir, 'checkpoints'), keep_total=3)
  structure = {'learning': initial_state, 'sampler': sampler.state.to_dict()}
  loaded, start_round = asyncio.run(state_manager.load_latest(structure))
  if loaded is None:
    state, start_round = initial_state, 0
    asyncio.run(state_manager.save(structure, 0))
  else:
    state = loaded['learning']
    sampler.load_state(type(sampler.state).from_dict(loaded['sampler']))
    console.notice(f'Resuming {config.output_dir} after round {start_round - 1}.')
  if start_round < config.rounds:  # more rounds to train: the run is not complete until they are
    run_summary.remove_summary(config.output_dir)
  # A run killed while appending leaves a torn last line: dropped (with a warning) before reading.
  run_dir.drop_torn_last_line(os.path.join(config.output_dir, 'participation.csv'), 'round')
  run_dir.drop_torn_last_line(os.path.join(config.output_dir, 'metrics.csv'), 'round')
  log = participation_log.ParticipationLogWriter(
      os.path.join(config.output_dir, 'participation.csv'))
  log.truncate(start_round)
  csv_release = tff.program.CSVFileReleaseManager(
      os.path.join(config.output_dir, 'metrics.csv'), key_fieldname='round')
  tb_release = tff.program.TensorBoardReleaseManager(os.path.join(config.output_dir, 'tensorboard'))
  # DP-FTRLM (`restart_dp_tree`) resets the server momentum where a new correlated segment starts.
  restarts = set(plan.restart_rounds(config.rounds) if plan.strategy.correlated else ())
  metrics = {}
  wrap_rounds = []
  workers = RemoteWorkers(config.workers)
  started = time.time()
  stop.training = True  # a first SIGINT / SIGTERM now stops after the current round
  for round_num in range(start_round, config.rounds):
    round_start = time.time()
    if round_num in restarts:
      state = dp_ftrl.restart_state(state, initial_state)
      logging.info('Round %d starts a new mechanism segment (momentum reset).', round_num)
    cohort = sampler.sample(round_num)
    log.append_round(round_num, cohort)
    datasets = [task.client_preprocess_fn(task.train_data.create_tf_dataset_for_client(c))
                for c in cohort]
    output = workers.run(f'round {round_num}', process.next, state, datasets)
    state = output.state
    metrics = _round_metrics(output)
    metrics['cohort_size'] = len(cohort)
    if not cohort:  # TFF reports 0 for the metrics of no client: there is no training loss
      metrics.update({name: float('nan') for name in metrics
                      if name.startswith('train_') and not name.startswith('train_num_')})
    if metrics.get(MODULAR_WRAP_METRIC, 0.0) > 0:
      wrap_rounds.append(round_num)
      logging.warning('%s', modular_wrap_warning(round_num, config))
    done = round_num + 1
    if done % config.eval_every == 0 or done == config.rounds:
      metrics.update(workers.run(f'the evaluation after round {round_num}', evaluate, task, process,
                                 state, config.eval_max_examples))
    round_seconds = time.time() - round_start
    metrics['round_seconds'] = round_seconds
    asyncio.run(csv_release.release(metrics, key=round_num))
    asyncio.run(tb_release.release(metrics, key=round_num))
    if done % config.checkpoint_every == 0 or done == config.rounds:
      asyncio.run(state_manager.save({'learning': state, 'sampler': sampler.state.to_dict()}, done))
    mean_seconds = (time.time() - started) / (done - start_round)
    console.out(round_log_line(round_num, config.rounds, metrics['train_loss'],
                               metrics.get(f'train_{task.accuracy_metric}', float('nan')),
                               round_seconds, mean_seconds * (config.rounds - done)))
    if any(name.startswith('eval_') for name in metrics):
      console.out(console.eval_line(done, config.rounds, metrics,
                                    console.spent_guarantee(config, plan, done)))
    directory.record_workers()
    if stop.requested:
      if not (done % config.checkpoint_every == 0 or done == config.rounds):
        asyncio.run(state_manager.save({'learning': state, 'sampler': sampler.state.to_dict()},
                                       done))
      raise stop_signals.Interrupted(stop.signum, stop_signals.stopped_message(
          stop.signum, done, config.rounds))
  stop.training = False
  if config.secure_aggregation and start_round < config.rounds:
    (logging.warning if wrap_rounds else console.notice)(
        f'SecAgg: modular wraps (secure sum outside the 2^{config.secure_bits} field) in '
        f'{len(wrap_rounds)} of the {config.rounds - start_round} rounds {start_round}-'
        f'{config.rounds - 1}' + (f': rounds {wrap_rounds}.' if wrap_rounds else '.'))
  report = privacy_report(config, plan)
  if start_round < config.rounds or not run_summary.is_complete(config.output_dir):
    write_completion(config, plan, report, task.accuracy_metric)
  console.out(console.summary(config.output_dir,
                              None if report is None else report_render.summary(report)))
  return {'metrics': metrics, 'state': state, 'process': process, 'privacy_report': report,
          'modular_wrap_rounds': wrap_rounds}


def write_completion(config: RunConfig, plan: plan_lib.RunPlan,
                     report: Optional[report_lib.PrivacyReport], accuracy_metric: str) -> None:
  """Marks the run complete: its TensorBoard HParams session and final scalars
  (`experiments.hparams_summary`), then `summary.json` (`experiments.run_summary`, written last and
  atomically: its presence means the run finished)."""
  guarantee = None if report is None else report.guarantee
  summary = run_summary.build_summary(
      config.output_dir, rounds=config.rounds,
      hparams=run_dir.read_json(os.path.join(config.output_dir, run_config.HPARAMS_FILE),
                                'rerun the same command: it rewrites hparams.json.'),
      accuracy_metric=accuracy_metric, noise_multiplier=plan.noise_multiplier,
      epsilon=None if guarantee is None else guarantee.epsilon,
      delta=None if guarantee is None else guarantee.delta,
      rho=None if guarantee is None else guarantee.rho)
  hparams_summary.write_hparams_summary(config.output_dir, summary)
  run_summary.write_summary(config.output_dir, summary)


class RemoteWorkers:
  """The TFF workers of a run (`--workers`) and the retry of a computation that lost one.

  A round's output depends only on its input state and data (the noise comes from the seeded noise
  state), so re-running a round whose worker died gives the same round on the workers that still
  answer; the sums are merged in another order, so values agree within float32 rounding.
  """

  def __init__(self, addresses: Optional[str]):
    self.addresses = () if addresses is None else remote_execution.parse_worker_addresses(addresses)

  def run(self, what: str, fn, *args):
    """`fn(*args)`; when a worker is lost, again on the others (the TFF context is rebuilt).

    Raises:
      remote_execution.WorkerUnavailableError: no worker answers any more.
    """
    for _ in range(len(self.addresses) + 1):
      try:
        return fn(*args)
      except Exception as error:  # pylint: disable=broad-except
        if not self.addresses or not remote_execution.is_worker_failure(error):
          raise
        alive = remote_execution.responsive_workers(self.addresses)
        lost = [a for a in self.addresses if a not in alive]
        if not alive:
          raise remote_execution.WorkerUnavailableError(
              f'{what} failed: no TFF worker of {",".join(self.addresses)} answers; restart them '
              '(python -m experiments.workers start) and rerun the same command to resume from the '
              'last checkpoint.') from error
        logging.warning('%s: TFF worker(s) %s stopped answering; running it again on %s.', what,
                        ', '.join(lost) or '(none; a transient failure)', ', '.join(alive))
        self.addresses = remote_execution.set_remote_execution_context(alive)
    raise remote_execution.WorkerUnavailableError(
        f'{what} failed on the TFF workers {",".join(self.addresses)} after '
        f'{len(self.addresses) + 1} attempts; check them and rerun the same command to resume.')


def _secure_segments(config: RunConfig, plan: plan_lib.RunPlan) -> Optional[dict]:
  """With SecAgg, `build_report`'s `secure_aggregation` dict from `metrics.csv`: each segment's clip
  and post-rounding sensitivity clip (first round of the segment), and the rounds that wrapped."""
  if plan.secure is None:
    return None
  segments, wrap_rounds = {}, []
  with open(os.path.join(config.output_dir, 'metrics.csv'), newline='') as f:
    for row in csv.DictReader(f):
      segment = int(float(row['aggregator/segment']))
      segments.setdefault(segment, {'segment': segment, 'clip': float(row['aggregator/clip']),
                                    'sensitivity_clip': float(row['aggregator/sensitivity_clip'])})
      if float(row.get(MODULAR_WRAP_METRIC) or 0) > 0:
        wrap_rounds.append(int(row['round']))
  return {**plan.secure.to_config(), 'segments': [segments[s] for s in sorted(segments)],
          'wrap_rounds': wrap_rounds}


def privacy_report(config: RunConfig, plan: plan_lib.RunPlan) -> Optional[report_lib.PrivacyReport]:
  """The finished run's privacy report from its plan, participation log and metrics, or None
  without noise.

  Written to `privacy_report/` (report.json, report.md with the BLT paper's App. C checklist, plots).
  The headline uses the participation observed in `participation.csv`; the declared schema's
  guarantee is under `declared`, and any violation of it is a warning. No amplification by sampling
  is claimed. With adaptive clipping the accounted noise multiplier is sigma (the model noise uses
  the inflated z_Delta, Gboard Thm. 1); with SecAgg the report lists each segment's post-rounding
  bound and the rounds whose secure sum wrapped.
  """
  if plan.noise_multiplier == 0:
    logging.warning('Noise multiplier 0: the run has no differential-privacy guarantee.')
    return None
  log = participation_log.read_participation_log(
      os.path.join(config.output_dir, 'participation.csv'))
  report = report_lib.build_report(
      plan.strategy, config.rounds, config.participation, noise_multiplier=plan.noise_multiplier,
      delta=config.target_delta, restart_rounds=plan.restart_rounds(config.rounds), log=log,
      clipped_count_stddev=plan.clipped_count_stddev,
      secure_aggregation=_secure_segments(config, plan), equal_privacy=True)
  report_render.write_report(report, plan.strategy,
                             os.path.join(config.output_dir, 'privacy_report'))
  return report
