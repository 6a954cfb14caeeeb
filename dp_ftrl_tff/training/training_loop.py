"""The training loop of every run: `tff.learning.programs.train_model` with the run's process, data
source and managers.

`train(task, config, output_dir)` trains (or resumes) the `task.Task` with the settings of a
`run_config.RunConfig` in the run directory `output_dir`; `run_program` is the same run for one's
own train_model call. Everything that determines its result lives in what train_model is given, so
a user's own loop over the same parts (docs/tutorial.md) trains the same run:
  * the process: `learning.dp_ftrl`'s (restarts, canaries and the noise state inside it), taking
    client ids (`programs.client_ids`: each client's input, a canary's included, is built inside
    the computation, which also counts the round's clients: `cohort_size`);
  * the data source: `programs.data_source.SampledClientDataSource`, the plan's min-sep or (cyclic)
    Poisson sampler over the population and the canary clients, seeded by `seed`, writing
    participation.csv; a round whose random cohort is empty still runs with no client (the
    aggregator adds the round's noise to a zero sum: the guarantee of Poisson sampling assumes every
    round is released with its noise) and its train metrics are NaN;
  * the managers (`dp_ftrl_tff.training.program_managers`): checkpoints every `checkpoint_every` rounds,
    after the last and on a stop, each with its record (`dp_ftrl_tff.training.checkpoint_records`); the
    metrics rows (metrics.csv, tensorboard/, the console's round lines with ETA); the canary rows;
    train_model's `EvaluationManager` every `eval_every` rounds and after the last
    (`dp_ftrl_tff.training.program_evaluation`: the Keras evaluation on the test set, in the round's row).
The run directory `<root_output_dir>/<experiment_name>/` holds:
  * `hparams.json` (a resumed run must match it, except `run_config.RESUMABLE_CHANGES`) and
    `plan.json` (the `dp_ftrl_tff.plan.RunPlan`: everything that determines the guarantee,
    `dp_ftrl_tff.training.run_setup`);
  * `mechanism.json` / `mechanism.npz`: the strategy used (loaded, optimized at start, or built);
  * `checkpoints/program_state_<r>`: train_model's `ProgramState` after r rounds (the learning
    state, noise state included, and the data source's iterator), each with `record_<r>.json`, what
    it vouches for; `checkpoints/eval/`: the EvaluationManager's state;
  * `participation.csv` (`client_id,round`, 0-based rounds); with `canary_clients` `canaries.json`
    and `canaries.csv` (`dp_ftrl_tff.training.canary_clients`; docs/auditing.md);
  * `metrics.csv`, `tensorboard/`, `model/training_checkpoint_round_<n>` (train_model's final
    state), `privacy_report/` and `summary.json` (the completion marker, written last:
    `dp_ftrl_tff.training.run_summary`).
Rerunning with the same output directory resumes from the latest checkpoint and ends with the same
model, participation log and report as an uninterrupted run; a larger `rounds` trains on, and a run
directory moved elsewhere resumes there. The directory's safety (`run.lock`, atomic files, torn log
lines dropped, `workers.json`) is `dp_ftrl_tff.training.run_dir`'s.

SIGINT / SIGTERM (`dp_ftrl_tff.training.stop_signals`): the handlers only record the signal; the start and
the end (report, summary) check it between their steps, and during training the data source checks
it before it draws the next round (`dp_ftrl_tff.stopping`, in train_model's own task): train_model
stops there, the last round's releases and checkpoint finish, and `Interrupted` is raised (`Stopped
by SIGTERM after round 3/6: checkpoint program_state_3 saved; ...`). An error of one of train_model's
background tasks (a release, a save, an evaluation: a full disk) is raised the same way, before the
next round, and no later checkpoint is saved.

The execution context: TFF's local asynchronous C++ context; with `workers`
(`dp_ftrl_tff.learning.remote_contexts`, docs/distributed.md) one over those TFF workers, where a
computation that loses a worker runs again on those that still answer; with `secure_aggregation`
TFF's asynchronous test context, the one that runs secure sums
(`dp_ftrl_tff.training.secure_context.async_secure_context`). A round whose secure sum wrapped around the
2^bits field (measurement `modular_wrap`) is logged as a warning; the result lists those rounds.
"""

import asyncio
import contextlib
import dataclasses
import os
from typing import Any, Dict, Iterator

import tensorflow_federated as tff

from dp_ftrl_tff import stopping
from dp_ftrl_tff.learning import remote_contexts, remote_execution, worker_processes
from dp_ftrl_tff.programs import client_ids, data_source
from dp_ftrl_tff.training import (
  canary_release,
  checkpoint_records,
  console,
  evaluation,
  program_evaluation,
  program_managers,
  release_order,
  run_dir,
  run_report,
  run_setup,
  run_start,
  run_summary,
  secure_context,
  stop_signals,
)
from dp_ftrl_tff.training.run_config import RunConfig
from dp_ftrl_tff.training.task import Task

#: Where train_model's model output manager writes the final state, under the run directory.
MODEL_DIR = 'model'


def train(task: Task, config: RunConfig, output_dir: str) -> Dict[str, Any]:
  """Trains (or resumes) `task` with the settings `config` in the run directory `output_dir`;
  returns its final `metrics` (the last row of metrics.csv,
  `run_summary.final_metrics_from_csv`: a NaN is None),
  `state`, `process` (over client ids), `privacy_report` and `modular_wrap_rounds`.

  Raises:
    run_start.SetupError (a ValueError): on bad settings, an impossible schedule, an unknown or
      mismatched mechanism, a run directory holding a run with other settings, a `mechanism_file`
      that cannot be read; before any training.
    run_dir.RunDirError: the run directory is in use by another run (its PID in the message),
      holds a corrupt run file, or a file that does not hold what the checkpoint it resumes from
      recorded; before any training.
    stop_signals.Interrupted: on SIGINT or SIGTERM, at the next safe point (module docstring). A
      rerun resumes bit-identically.
  """
  with stop_signals.watching() as stop:
    stop.where = stop_signals.START
    with run_program(task, config, output_dir) as program:
      _train(stop, program.managers, config.rounds, **program.train_model_args)
      stop.where = stop_signals.finish_stage(config.rounds)
      return program.finish()


@contextlib.contextmanager
def run_program(task: Task, config: RunConfig, output_dir: str) -> Iterator['RunProgram']:
  """The run `train` trains, for one's own `tff.learning.programs.train_model` call:

      with training_loop.run_program(task, config, output_dir) as program:
        asyncio.run(tff.learning.programs.train_model(**program.train_model_args))
        result = program.finish()

  Entering it does `train`'s start (the checks, a resume's included, the plan, the header, the run
  files, the process over client ids, the data source, the managers) and installs the run's
  asynchronous execution context for the block; `program.train_model_args` are train_model's
  arguments (the managers that order checkpoints after their rows, write the records, the canary
  rows and the evaluations), which a caller may extend (e.g. wrap `train_metrics_manager` with
  its own releases); `program.finish()` then writes the final model, the canary cosines, the
  privacy report and the summary, and returns what `train` returns. Without `train`'s stop checks
  a SIGINT ends the program at once; a rerun resumes from the last checkpoint as `train` does.

  Raises:
    what `train` raises before any training.
  """
  with run_start.setup_errors():
    if not isinstance(task, Task):
      raise ValueError(f'`task` must be a Task, got {type(task).__name__}.')
    if not isinstance(config, RunConfig):
      raise ValueError(f'`config` must be a RunConfig, got {type(config).__name__}.')
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
      raise ValueError(f'`output_dir` must be a directory path, got {output_dir!r}.')
  worker_processes.register_at_exit()  # TFF leaves its worker_binary running after exit
  directory = run_dir.RunDirectory(os.fspath(output_dir))
  try:
    with contextlib.ExitStack() as scope:
      yield _program(task, config, directory, scope)
  finally:
    directory.release(remove_if_created=True)


def _start(task: Task, config: RunConfig, directory: run_dir.RunDirectory,
           scope: contextlib.ExitStack):
  """The run's start (`run_start.start_run`: checks, plan, header, process), then its context and
  data source; writes nothing. Returns (start, data source, process over client ids)."""
  with run_start.setup_errors():
    start = run_start.start_run(task, config, directory)
    # One asynchronous context (train_model needs one) for the rest of this run, once the checks
    # passed and before any computation runs; installed over the caller's and removed on return, so
    # a caller in the same process (a test, a notebook) gets its own context back.
    scope.enter_context(tff.framework.get_context_stack().install(
        tff.program.NativeFederatedContext(_async_context(config))))
    source = data_source.SampledClientDataSource(
        start.client_ids, start.plan,
        os.path.join(directory.path, run_dir.PARTICIPATION_FILE), config.seed)
    process = client_ids.process_over_client_ids(
        start.process, task.train_data.preprocess(task.client_preprocess_fn), start.canary_ids)
  return start, source, process


def _async_context(config: RunConfig):
  """TFF's local asynchronous C++ context; with `workers` ('host:port,...', waited for up to 30 s)
  `remote_contexts`' over them; with SecAgg TFF's test context, the one that runs secure sums
  (`secure_context.async_secure_context`: it lifts protobuf's nesting limit for the process, which
  the secure process composed over client ids exceeds once compiled)."""
  if config.secure_aggregation:
    return secure_context.async_secure_context()
  if config.workers is None:
    return tff.backends.native.create_async_local_cpp_execution_context()
  remote_execution.wait_for_workers(config.workers)
  return remote_contexts.create_async_remote_execution_context(config.workers)


def _program(task: Task, config: RunConfig, directory: run_dir.RunDirectory,
             scope: contextlib.ExitStack) -> 'RunProgram':
  out = directory.path
  start, source, process = _start(task, config, directory, scope)
  stop_signals.check()
  directory.remove_stale_temps()
  program_evaluation.clear(out)  # nothing in flight to resume: each checkpoint waited for its own
  checkpoint_records.set_aside(out, start.resumption)
  run_setup.write_run_files(config, out, start.resolved, start.plan, start.saved_strategy,
                            start.run_id)
  # A kill during an append of metrics.csv leaves a torn last line (the CSV manager cannot parse
  # it); the participation log's is cut by the data source at its checkpointed offset.
  run_dir.drop_torn_last_line(os.path.join(out, run_dir.METRICS_FILE), 'round')
  stop_signals.check()
  initial_state = _materialized(process.initialize)
  directory.record_workers()  # the worker_binary exists now: a killed run's is ended on resume
  weights = program_evaluation.as_model_weights(
      _materialized(lambda: process.get_model_weights(initial_state)))
  canaries = canary_release.canary_recorder(
      out, start, sum(int(w.size) for w in weights.trainable))
  managers = program_managers.Managers(config, out, start.plan, task.accuracy_metric, start.run_id,
                                       source, canaries)
  stop_signals.check()
  done_before = max(asyncio.run(managers.state.get_versions()) or [0])
  if done_before:
    console.notice(f'Resuming {out} after round {done_before}/{config.rounds}.')
  if done_before < config.rounds:
    run_summary.remove_summary(out)
  managers.progress.start()
  model_output = tff.program.SavedModelFileReleaseManager(os.path.join(out, MODEL_DIR), prefix='')
  train_model_args = dict(
      train_process=process, initial_train_state=initial_state, train_data_source=source,
      train_per_round_clients=min(int(round(start.plan.clients_per_round)),
                                  len(source.client_ids)),
      train_total_rounds=config.rounds, program_state_manager=managers.state,
      model_output_manager=release_order.RecordingRelease(model_output, managers.released),
      train_metrics_manager=managers.metrics,
      evaluation_manager=program_evaluation.evaluation_manager(
          out, lambda w: evaluation.evaluate(task, w, config.eval_max_examples), weights,
          managers.evaluations, managers.released),
      evaluation_periodicity=config.eval_every)
  return RunProgram(task, config, directory, start, source, managers, model_output, canaries,
                    weights, done_before, train_model_args)


@dataclasses.dataclass
class RunProgram:
  """A started run (`run_program`): `train_model_args`, what `tff.learning.programs.train_model`
  is given, and the parts they hold: the `start` (`run_start.RunStart`: plan, process, ...), the
  data `source`, the `managers` (`program_managers.Managers`), the final model's release, the
  `canaries` recorder (None without), the initial model `weights` and `done_before`, the rounds
  the run directory had trained when it started."""
  task: Task
  config: RunConfig
  directory: run_dir.RunDirectory
  start: Any
  source: data_source.SampledClientDataSource
  managers: program_managers.Managers
  model_output: Any
  canaries: Any
  weights: Any
  done_before: int
  train_model_args: Dict[str, Any]

  def finish(self) -> Dict[str, Any]:
    """After train_model: the final model (if its release was cut short), the canary cosines, the
    privacy report and the summary; returns `train`'s result.

    Raises:
      the first error of train_model's background tasks (a release, a save, an evaluation).
    """
    config, managers, out = self.config, self.managers, self.directory.path
    if managers.released.failure is not None:
      raise managers.released.failure
    process = self.train_model_args['train_process']
    self.directory.record_workers()
    managers.progress.wrap_summary(self.done_before)
    stop_signals.check()
    template = tff.learning.programs.ProgramState(
        self.train_model_args['initial_train_state'], 0, 0, self.source.iterator())
    program_state, _ = asyncio.run(managers.state.load_latest(template))
    final_state = program_state.state
    final_model = os.path.join(out, MODEL_DIR, f'training_checkpoint_round_{config.rounds}')
    if not os.path.isdir(final_model):  # its release was cut short (a kill, a full disk)
      asyncio.run(self.model_output.release(final_state, key=os.path.basename(final_model)))
    if self.canaries is not None:  # the final model's cosines, vouched for by the last record
      self.canaries.record_final(self.weights.trainable, program_evaluation.as_model_weights(
          _materialized(lambda: process.get_model_weights(final_state))).trainable)
      checkpoint_records.record_final_files(out, config.rounds)
      stop_signals.check()
    privacy_report = run_report.finish(
        config, out, self.start.plan, self.task.accuracy_metric,
        trained=self.done_before < config.rounds, rounds_done=config.rounds,
        run_id=self.start.run_id, report=managers.report and managers.report.last_report)
    return {'state': final_state, 'process': process,
            'metrics': run_summary.final_metrics_from_csv(
                os.path.join(out, run_dir.METRICS_FILE), config.rounds)['final_metrics'],
            'privacy_report': privacy_report,
            'modular_wrap_rounds': managers.progress.wrap_rounds}


def _materialized(compute):
  """The materialized result of `compute()` (a call of a computation of the run's asynchronous
  context: it needs a running event loop)."""

  async def materialize():
    return await tff.program.materialize_value(compute())

  return asyncio.run(materialize())


class _StopRound(BaseException):
  """Raised by the data source's check (`dp_ftrl_tff.stopping`) to stop train_model before a
  round: a stop signal or a failed background task. Never leaves `_train`."""


def _train(stop: stop_signals.StopSignals, managers: program_managers.Managers, num_rounds: int,
           **train_model_args) -> None:
  """`tff.learning.programs.train_model(**train_model_args)`, stopped between rounds.

  The data source's `select` calls `dp_ftrl_tff.stopping.check()` before each round; the check
  installed here raises `_StopRound` there when a stop signal was recorded (`stop`) or a background
  task failed (`managers.released.failure`), only in train_model's own task: in one of its
  background tasks (the report release of the last round runs the library's checks too) the
  exception would be dropped. train_model then ends, its pending tasks (the last round's releases
  and save) finish, and the failure or `stop_signals.Interrupted` (after the last saved round) is
  raised here. Another error of train_model's own task (a full disk while the data source writes
  the participation log) is recorded as a failure (no later save), and the pending tasks finish
  before it is raised.
  """
  own = {}

  def before_round():
    try:
      current = asyncio.current_task()
    except RuntimeError:  # no running loop: not train_model's task
      return
    if current is own.get('task') and (stop.requested or managers.released.failure is not None):
      raise _StopRound()

  async def train() -> int:
    own['task'] = asyncio.current_task()
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: _quiet_failures(managers.released, loop, context))
    try:
      await tff.learning.programs.train_model(**train_model_args)
    except BaseException as error:  # noqa: BLE001 (re-raised below, but for `_StopRound`)
      if not isinstance(error, _StopRound):  # no later save; none waits for a release that
        managers.released.fail(error)       # train_model may not have started
      # Else asyncio.run would cancel them: a save cut short leaves a checkpoint without record.
      pending = [task for task in asyncio.all_tasks() if task is not own['task']]
      if pending:
        await asyncio.wait(pending)
      if not isinstance(error, _StopRound):
        raise
      await managers.state.save_held()  # a stop saves its last round (--checkpoint_every)
    return max(await managers.state.get_versions() or [0])

  with stopping.stop_check(before_round):
    done = asyncio.run(train())
  if managers.released.failure is not None:
    raise managers.released.failure
  if stop.requested and done < num_rounds:
    raise stop_signals.Interrupted(stop.signum, stop_signals.stopped_message(
        stop.signum, done, num_rounds))


def _quiet_failures(released: release_order.RoundsReleased, loop, context) -> None:
  """An asyncio exception handler that drops the reports of a lost TFF worker (a computation that
  lost every worker fails each reference to its result, and asyncio would log those train_model
  did not await) and of the failure recorded in `released` (EvaluationManager's done-callback
  re-raises a failed evaluation's): with their tracebacks, beside the one line of the failure
  `_train` raises."""
  error = context.get('exception')
  if not (remote_execution.is_worker_failure(error) or
          (error is not None and error is released.failure)):
    loop.default_exception_handler(context)
