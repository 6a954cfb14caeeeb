r"""EMNIST DP-FTRL as a TFF training program: `tff.learning.programs.train_model` with our process.

The run_emnist driver's task, flags, errors, run directory and start (`experiments.run.run_start`:
the resume checks, the strategy, the plan, the header, the process), trained by TFF's own program
loop instead of the drivers' loop: the DP-FTRL process (`learning.dp_ftrl`, over client ids:
`programs.client_ids` builds each client's input, a canary's included, inside the computation),
`programs.data_source.SampledClientDataSource` (the min-sep or (cyclic) Poisson sampler over the
population and the canary clients, writing participation.csv), a
`tff.program.FileProgramStateManager` (checkpoints/program_state_<r> every --checkpoint_every
rounds, after the last and on a stop), the
metrics as the drivers' rows (`programs.metrics_release`: metrics.csv and tensorboard/), the privacy
report at the last round (`programs.report_release`: privacy_report/; these managers are
`experiments.programs.program_managers`'s) and the final state
(model/training_checkpoint_round_<n>). Every --eval_every rounds and after the last, train_model's
`tff.learning.programs.EvaluationManager` evaluates the model as the drivers do (Keras `evaluate`
on the test set, concurrent with training), and the round's metrics row holds the result, as the
drivers' (`experiments.programs.program_evaluation`; its state in checkpoints/eval/). After the
last round the program writes the report and summary.json, as the drivers do.
A killed program rerun with the same command resumes from its last checkpoint and ends with the
same model, participation log and report as an uninterrupted run.

SIGINT / SIGTERM stop the program as they stop the drivers (`experiments.run.stop_signals`): the
handlers only record the signal; the start and the end (final evaluation, report, summary) check it
between their steps, and during training the data source checks it before it draws the next round
(`dp_ftrl_tff.stopping`, called in train_model's own task): train_model stops there, the program
lets the last round's releases and checkpoint finish, and exits with one line (`Stopped by SIGTERM
after round 3/6: checkpoint program_state_3 saved; ...`) and status 130 / 143. A second signal
stops at once, as a kill would (the rerun resumes from the last checkpoint). An error of one of
train_model's background tasks (a release, a save, an evaluation: a full disk) is raised the same
way, before the next round, as one line (exit 1), and no later checkpoint is saved. A finished run
is not trained on with a larger --rounds: another --rounds than the run's is refused (exit 2; use
another --experiment_name).

With --workers=host:port,... every computation runs on those TFF workers, as the drivers' do
(docs/distributed.md): `dp_ftrl_tff.learning.remote_contexts`' asynchronous context over them
(the drivers' workers, merge and retry), in `tff.program.NativeFederatedContext`. A computation that
loses a worker runs again on the workers that still answer; when none answers the program exits 1
with one line, and the rerun resumes from the last checkpoint.

--secure_aggregation runs the process in TFF's asynchronous test context (the one that runs secure
sums; `experiments.run.secure_context.async_secure_context`), with the metrics rows and report of
run_emnist on the same flags. It lifts Python protobuf's limit of 100 nested messages for the
process: TFF's test context compiles each computation by replacing its secure sums with their
bodies and serializing it again, and the process composed over client ids is deeper than that once
compiled (`allow_deep_computations` there says more).

Not available here (an error naming the flag, exit 2): a --rounds other than the run's on resume. A
run directory of a driver is refused, and the reverse.

Example (synthetic clients, about a minute on 2 cores; run from the repository root):
  python -m experiments.programs.emnist_program --root_output_dir=/tmp/runs \
      --experiment_name=program --model=tiny --mechanism=blt --rounds=6 --clients_per_round=3 \
      --min_sep=2 --synthetic_num_clients=30 --synthetic_examples_per_client=8 \
      --client_batch_size=8 --eval_max_examples=64

"""

import os

# Quiet console: TensorFlow's C++ logs off unless the user set TF_CPP_MIN_LOG_LEVEL (it must be set
# before TensorFlow is imported).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
if __name__ == '__main__':  # SIGINT / SIGTERM recorded from the start (experiments.run.stop_signals)
  from experiments.run import stop_signals as _stop_signals
  _stop_signals.record_early()

import asyncio  # noqa: E402
import contextlib  # noqa: E402
import csv  # noqa: E402
from typing import Any, Dict  # noqa: E402

from absl import flags  # noqa: E402

from experiments.emnist import MODELS, run_emnist  # noqa: E402
from experiments.run import driver, driver_flags, run_config, run_dir  # noqa: E402

FLAGS = flags.FlagValues()
driver_flags.define_common_flags(FLAGS)
flags.DEFINE_enum('model', 'fedavg_cnn', MODELS, 'EMNIST model.', flag_values=FLAGS)
flags.DEFINE_bool('only_digits', True, '10 digit classes (else 62 classes).', flag_values=FLAGS)

#: `RunConfig.task['program']` of a program run (recorded in hparams.json: a driver refuses the
#: directory of a program run, and the program a driver's).
PROGRAM = 'train_model'
#: Where train_model's model output manager writes the final state.
MODEL_DIR = 'model'


def task_settings(fv: flags.FlagValues) -> Dict[str, Any]:
  """run_emnist's settings plus `program`.

  Raises:
    ValueError: naming the flag (the driver prints it as one line, exit 2).
  """
  return {**run_emnist.task_settings(fv), 'program': PROGRAM}


build_task = run_emnist.build_task


def _check_rounds_unchanged(config: run_config.RunConfig, recorded_settings) -> None:
  """A resumed program keeps its rounds: those its checkpoint's record holds (`recorded_settings`),
  else hparams.json's."""
  path = os.path.join(config.output_dir, run_dir.HPARAMS_FILE)
  if recorded_settings is not None:
    saved = recorded_settings
  elif os.path.exists(path):
    saved = run_dir.read_json(path, 'rerun the same command: it rewrites hparams.json.')
  else:
    return
  rounds = saved.get('rounds') if isinstance(saved, dict) else None
  if rounds is not None and rounds != config.rounds:
    raise ValueError(f'`rounds`={config.rounds}, but {config.output_dir} holds a train_model run '
                     f'of {rounds} rounds: its data source\'s schedule is in its checkpoints; '
                     f'resume with --rounds={rounds} or use another --experiment_name.')


def run(task: run_config.Task, config: run_config.RunConfig) -> Dict[str, Any]:
  """Trains (or resumes) `config`'s run through `tff.learning.programs.train_model`; the
  `driver.run_main` `run_fn` of this binary. Returns the final metrics and the privacy report.

  Raises:
    run_start.SetupError: bad settings, a flag train_model cannot honor, a run directory of
      other settings (a driver's included); before any training.
    run_dir.RunDirError: the run directory is in use or holds a corrupt run file.
    stop_signals.Interrupted: on SIGINT / SIGTERM, at the next safe point (see the module
      docstring).
  """
  from experiments.run import stop_signals  # pylint: disable=g-import-not-at-top

  directory = run_dir.RunDirectory(config.output_dir)
  with stop_signals.watching() as stop:
    stop.where = stop_signals.START
    try:
      with contextlib.ExitStack() as scope:
        return _run(task, config, directory, scope, stop)
    finally:
      directory.release(remove_if_created=True)


def _start(task: run_config.Task, config: run_config.RunConfig, directory: run_dir.RunDirectory,
           scope: contextlib.ExitStack):
  """The drivers' start (`run_start.start_run`: checks, plan, header, process) with the program's
  own checks, then its context and data source; writes nothing. Returns (start, data source,
  process over client ids)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from dp_ftrl_tff.programs import client_ids, data_source  # pylint: disable=g-import-not-at-top
  from experiments.run import run_start  # pylint: disable=g-import-not-at-top

  with run_start.setup_errors():
    start = run_start.start_run(
        task, config, directory,
        check_resumption=lambda resumption: _check_rounds_unchanged(
            config, resumption.record and resumption.record['settings']))
    # One asynchronous context (train_model needs one) for the rest of this run, once the checks
    # passed and before any computation runs; installed over the caller's and removed on return, so
    # a caller in the same process (a test, a notebook) gets its own context back.
    scope.enter_context(tff.framework.get_context_stack().install(
        tff.program.NativeFederatedContext(_async_context(config))))
    source = data_source.SampledClientDataSource(
        start.client_ids, start.plan,
        os.path.join(config.output_dir, run_dir.PARTICIPATION_FILE), config.seed)
    # The process takes client ids (canaries' included): each id becomes its input inside the
    # computation.
    process = client_ids.process_over_client_ids(
        start.process, task.train_data.preprocess(task.client_preprocess_fn), start.canary_ids)
  return start, source, process


def _async_context(config: run_config.RunConfig):
  """The program's asynchronous context: TFF's local C++ one; with `workers` ('host:port,...',
  waited for up to 30 s) `remote_contexts`' over them; with SecAgg TFF's test context, the one that
  runs secure sums (`secure_context.async_secure_context`: it lifts protobuf's nesting limit for the
  process, which the secure process composed over client ids exceeds once compiled)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from dp_ftrl_tff.learning import (  # pylint: disable=g-import-not-at-top
    remote_contexts,
    remote_execution,
  )
  from experiments.run import secure_context  # pylint: disable=g-import-not-at-top
  if config.secure_aggregation:
    return secure_context.async_secure_context()
  if config.workers is None:
    return tff.backends.native.create_async_local_cpp_execution_context()
  remote_execution.wait_for_workers(config.workers)
  return remote_contexts.create_async_remote_execution_context(config.workers)


def _run(task: run_config.Task, config: run_config.RunConfig, directory: run_dir.RunDirectory,
         scope: contextlib.ExitStack, stop) -> Dict[str, Any]:
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from experiments.programs import (  # pylint: disable=g-import-not-at-top
    program_evaluation,
    program_managers,
  )
  from experiments.run import (  # pylint: disable=g-import-not-at-top
    checkpoint_records,
    console,
    evaluation,
    run_setup,
    run_summary,
    stop_signals,
  )

  out = config.output_dir
  start, source, process = _start(task, config, directory, scope)
  stop_signals.check()
  directory.remove_stale_temps()
  program_evaluation.clear(out)  # nothing in flight to resume: each checkpoint waited for its own
  checkpoint_records.set_aside(out, start.resumption)
  run_setup.write_run_files(config, start.resolved, start.plan, start.saved_strategy,
                            start.run_id)
  # A kill during an append of metrics.csv leaves a torn last line (the CSV manager cannot parse
  # it); the participation log's is cut by the data source at its checkpointed offset.
  run_dir.drop_torn_last_line(os.path.join(out, run_dir.METRICS_FILE), 'round')
  stop_signals.check()

  async def initialize():
    return await tff.program.materialize_value(process.initialize())

  initial_state = asyncio.run(initialize())
  directory.record_workers()  # the worker_binary exists now: a killed run's is ended on resume
  weights = _materialized_weights(process, initial_state)
  canaries = program_managers.canary_recorder(config, start, sum(
      int(w.size) for w in program_evaluation.as_model_weights(weights).trainable))
  managers = program_managers.Managers(config, start.plan, task.accuracy_metric, start.run_id,
                                       canaries)
  stop_signals.check()
  versions = asyncio.run(managers.state.get_versions()) or []
  done_before = max(versions, default=0)
  trained = done_before < config.rounds
  if done_before:
    console.notice(f'Resuming {out} after round {done_before}/{config.rounds}.')
  if trained:
    run_summary.remove_summary(out)
  managers.progress.start()
  model_output = tff.program.SavedModelFileReleaseManager(os.path.join(out, MODEL_DIR), prefix='')
  _train(stop, managers, config.rounds,
         train_process=process, initial_train_state=initial_state, train_data_source=source,
         train_per_round_clients=min(int(round(start.plan.clients_per_round)),
                                     len(task.train_data.client_ids)),
         train_total_rounds=config.rounds, program_state_manager=managers.state,
         model_output_manager=program_managers.RecordingRelease(model_output, managers.released),
         train_metrics_manager=managers.metrics,
         evaluation_manager=program_evaluation.evaluation_manager(
             out, lambda w: evaluation.evaluate(task, w, config.eval_max_examples), weights,
             managers.evaluations, managers.released),
         evaluation_periodicity=config.eval_every)
  directory.record_workers()
  stop.where = stop_signals.finish_stage(config.rounds)
  stop_signals.check()
  template = tff.learning.programs.ProgramState(initial_state, 0, 0, source.iterator())
  program_state, _ = asyncio.run(managers.state.load_latest(template))
  final_model = os.path.join(out, MODEL_DIR, f'training_checkpoint_round_{config.rounds}')
  if not os.path.isdir(final_model):  # its release was cut short (a kill, a full disk)
    asyncio.run(model_output.release(program_state.state, key=os.path.basename(final_model)))
  if canaries is not None:  # the final model's cosines, vouched for by the last record
    canaries.record_final(program_evaluation.as_model_weights(weights).trainable,
                          _model_weights(process, program_state.state).trainable)
    checkpoint_records.record_final_files(out, config.rounds)
    stop_signals.check()
  return _finish(task, config, start, managers, process, program_state.state, trained)


class _StopRound(BaseException):
  """Raised by the data source's check (`dp_ftrl_tff.stopping`) to stop train_model before a
  round: a stop signal or a failed background task. Never leaves `_train`."""


def _train(stop, managers, num_rounds: int, **train_model_args) -> None:
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
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from dp_ftrl_tff import stopping  # pylint: disable=g-import-not-at-top
  from experiments.run import stop_signals  # pylint: disable=g-import-not-at-top

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


def _quiet_failures(released, loop, context) -> None:
  """An asyncio exception handler that drops the reports of a lost TFF worker (a computation that
  lost every worker fails each reference to its result, and asyncio would log those train_model
  did not await) and of the failure recorded in `released` (EvaluationManager's done-callback
  re-raises a failed evaluation's): with their tracebacks, beside the one line of the failure
  `_train` raises."""
  from dp_ftrl_tff.learning import remote_execution  # pylint: disable=g-import-not-at-top
  error = context.get('exception')
  if not (remote_execution.is_worker_failure(error) or
          (error is not None and error is released.failure)):
    loop.default_exception_handler(context)


def _finish(task: run_config.Task, config: run_config.RunConfig, start, managers,
            process, final_state, trained: bool) -> Dict[str, Any]:
  """The drivers' end of a run: the privacy report, the completion marker and the summary (the
  final model's evaluation is in the last metrics row already: train_model's EvaluationManager
  evaluates the last round). Returns the last row's metrics and the report. A stop signal is seen
  between these steps (`run_report.finish`)."""
  from experiments.run import run_report  # pylint: disable=g-import-not-at-top

  metrics = _last_row(os.path.join(config.output_dir, run_dir.METRICS_FILE), config.rounds)
  privacy_report = run_report.finish(
      config, start.plan, task.accuracy_metric, trained=trained, rounds_done=config.rounds,
      run_id=start.run_id, report=managers.report and managers.report.last_report)
  return {'state': final_state, 'process': process, 'metrics': metrics,
          'privacy_report': privacy_report}


def _materialized_weights(process, state):
  """`process.get_model_weights(state)`, computed in the program's asynchronous context."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  async def weights():
    return await tff.program.materialize_value(process.get_model_weights(state))

  return asyncio.run(weights())


def _model_weights(process, state):
  """`process.get_model_weights(state)` as `tff.learning.models.ModelWeights`."""
  from experiments.programs import program_evaluation  # pylint: disable=g-import-not-at-top
  return program_evaluation.as_model_weights(_materialized_weights(process, state))


def _last_row(metrics_path: str, rounds: int) -> Dict[str, float]:
  """The metrics of round n-1's row of metrics.csv (its evaluation included)."""
  with open(metrics_path, newline='', encoding='utf-8') as f:
    rows = [row for row in csv.DictReader(f) if int(row['round']) == rounds - 1]
  if not rows:
    raise ValueError(f'{metrics_path} has no row of the last round {rounds - 1}.')
  return {name: float(value) for name, value in rows[-1].items()
          if name != 'round' and value not in ('', None)}


def main() -> None:
  driver.run_main(FLAGS, build_task, task_settings, __doc__, run_fn=run)


if __name__ == '__main__':
  main()
