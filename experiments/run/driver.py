"""The `main` of the simulation drivers: flags -> `DriverConfig` -> `dp_ftrl_tff.training.train`, with
one-line errors.

A driver binary owns a `flags.FlagValues()` with the common flags (`driver_flags`) and its own, and
calls `run_main(flag_values, build_task, task_settings)` under `if __name__ == '__main__'`. Bad input
(flags, settings, input files such as a corrupt --data or --mechanism_file, schedule, run directory,
execution context) ends the program before any training with `<program>: error: <one line>` on
stderr and exit status 2; `--help` lists every flag with its default (`HELP_NOTES` after the
driver's docstring). A run directory in use by another run (its PID named) or holding a corrupt run file
is one such line with exit status 1. SIGINT / SIGTERM are recorded for the driver's whole life and
stop the run at its next safe point (a step of its start or end, an optimizer's evaluation, after
the current round and its checkpoint), with one line and exit status 130 / 143; a second signal
stops at once (`dp_ftrl_tff.training.stop_signals`). Every exit ends the driver's TFF worker_binary
children. A `--rounds` whose arrays cannot fit in memory (`dp_ftrl_tff.mechanisms.memory`) exits 2;
any other failure (I/O: an unwritable --root_output_dir, a full disk, named by what was being
written: `disk_full.disk_full_message`; memory; a bug) is one line with exit status 1. `--debug`
prints the traceback before the line. The console (stdout: header, rounds, evals, summary) is
`dp_ftrl_tff.training.console`.
"""

import logging as std_logging
import os
import sys
import traceback
from typing import Any, Callable, Dict

from absl import flags, logging

import dp_ftrl_tff
import experiments
from dp_ftrl_tff.learning import remote_execution
from dp_ftrl_tff.mechanisms import memory
from dp_ftrl_tff.training import (
  checkpoint_records,
  console,
  disk_full,
  record_checks,
  run_dir,
  run_summary,
  stop_signals,
)
from experiments.cli import flag_parsing
from experiments.run import driver_config, driver_flags

#: What `--help` of every driver prints after the driver's docstring.
HELP_NOTES = """
Logs: WARNING and above on stderr, ours as `<program>: warning: ...`, a library's (TensorFlow, TFF)
in absl's format with its source file; absl's --verbosity=0 (not listed below) shows the INFO logs.
Exit codes: 0 ok; 2 bad input (flags, settings, input files such as --data or --mechanism_file, a
size whose arrays exceed the memory or whose start-up computation exceeds an hour: --rounds,
--num_buffers, --num_bands, populations, the model); 1 runtime failure (I/O, a run directory in use
by another run, a corrupt or edited file of the run directory, a full disk); 130 / 143 stopped by
SIGINT / SIGTERM: during the start or the end (report, summary) at the next step, during training
after the current round and its checkpoint, a second signal at once; the last checkpoint is kept
and rerunning the same command resumes. Rerunning a finished run checks its files against its
last checkpoint's record, then writes nothing and exits 0 (--force_report rewrites its report).
An error is one line `<program>: error: ...` on stderr; --debug adds the traceback.
Docs: docs/training.md.
"""


def set_up_logging() -> None:
  """Quiet console: absl WARNING and above on stderr unless the user gave absl's --verbosity
  (`--verbosity=0` brings the INFO logs back), without TF's Python chatter. Results and progress go
  to stdout (`dp_ftrl_tff.training.console`). Our own records read `<program>: <level>: ...`, like the
  errors; a library's (TensorFlow, TFF, ...) keep absl's format, which names its source file, so
  that a library's log line never looks like our error line."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    # Warnings as `<program>: warning: ...`, like the errors; with --verbosity absl's own format.
    logging.get_absl_handler().setFormatter(_PlainFormatter())
  std_logging.getLogger('tensorflow').setLevel(std_logging.ERROR)


#: The directories of this project's packages: a log record from a file under them is ours.
_OWN_PACKAGES = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                      for module in (dp_ftrl_tff, experiments))


class _PlainFormatter(std_logging.Formatter):
  """`<program>: <level>: <message>` for our own records (absl's prefix of time, PID and source
  line left out); any other record (a library's, e.g. TensorFlow's at ERROR level) in absl's own
  format (`E1128 16:44:49.102644 12345 tf_should_use.py:80] ...`), never dressed as ours."""

  def __init__(self):
    super().__init__()
    self._foreign = logging.PythonFormatter()

  def format(self, record: std_logging.LogRecord) -> str:
    if not is_own_record(record):
      return self._foreign.format(record)
    return f'{console.program_name()}: {record.levelname.lower()}: {record.getMessage()}'


def is_own_record(record: std_logging.LogRecord) -> bool:
  """Whether `record` was logged by this project's code (`dp_ftrl_tff`, `experiments`)."""
  path = os.path.abspath(record.pathname or '')
  return path.startswith(_OWN_PACKAGES)


def _fail(error, flag_values: flags.FlagValues, exit_code: int = flag_parsing.ERROR_EXIT_CODE):
  """`flag_parsing.exit_with_error`, after the traceback with --debug."""
  if flag_values['debug'].value:
    traceback.print_exc()
  flag_parsing.exit_with_error(error, flag_values, exit_code)


def _runtime_message(error: BaseException) -> str:
  """One line for an error that is not bad input: I/O, memory, or a bug."""
  if isinstance(error, remote_execution.WorkersLostError):
    return (f'{error}; restart them (python -m experiments.workers start) and rerun the same '
            'command to resume from the last checkpoint.')
  if isinstance(error, remote_execution.WorkerUnavailableError):
    return str(error)
  if isinstance(error, MemoryError):
    return 'out of memory; use a smaller model, fewer clients per round or fewer --rounds.'
  full = disk_full.disk_full_message(error)  # TF's SavedModel writes raise no OSError
  if full is not None:
    return full
  if isinstance(error, OSError):
    where = f' ({error.filename})' if getattr(error, 'filename', None) else ''
    return (f'I/O error{where}: {error.strerror or error}; check that --root_output_dir is '
            'writable and the disk is not full.')
  return f'{type(error).__name__}: {error} (rerun with --debug for the traceback)'


def _finished(config: driver_config.DriverConfig) -> bool:
  """Whether `config`'s run directory holds this run, finished with `config.rounds` rounds (said on
  stderr: nothing to train or rewrite). A directory holding a run with other settings raises
  ValueError; one that trained fewer rounds is not finished (the run trains the rest)."""
  if not run_summary.is_complete(config.output_dir):
    return False
  if run_summary.read_summary(config.output_dir).get('rounds') != config.rounds:
    return False  # the run trains on: its own start checks the settings
  # The settings its last checkpoint trained with (hparams.json's without one): a finished run's
  # hparams.json may be gone or replaced as well; its files must be what that checkpoint's record
  # vouches for (the report the notice points to was built from them).
  resumption = checkpoint_records.find_resumption(config.output_dir)
  record_checks.check_settings(resumption, config, config.output_dir)
  record_checks.check_finished_run(config.output_dir, resumption)
  report = os.path.join(config.output_dir, run_dir.REPORT_DIR, 'report.md')
  console.notice(f'{config.output_dir} holds this run, finished after round {config.rounds}/'
                 f'{config.rounds}: nothing to do. Its report: {report} (--force_report rewrites '
                 'it; a larger --rounds trains on).')
  return True


class Failure(Exception):
  """A driver's failure as its one line: `error` (the message) and the `exit_code`
  (`flag_parsing.ERROR_EXIT_CODE` for bad input, `RUNTIME_ERROR_EXIT_CODE` otherwise)."""

  def __init__(self, error, exit_code: int):
    super().__init__(str(error))
    self.error, self.exit_code = error, exit_code


def run_from_flags(flag_values: flags.FlagValues,
                   build_task: Callable[[driver_config.DriverConfig], Any],
                   task_settings: Callable[[flags.FlagValues], Dict[str, Any]]) -> Dict[str, Any]:
  """Builds the `DriverConfig` and the task (`dp_ftrl_tff.training.Task`) from parsed
  `flag_values` and trains (`run_main`'s arguments) with `training_loop.train`; returns its result.

  Raises:
    Failure: bad input (exit 2) or a runtime failure (exit 1), as the driver reports it.
    stop_signals.Interrupted: on SIGINT / SIGTERM.
  """
  try:
    config = driver_flags.config_from_flags(flag_values, task_settings(flag_values))
    memory.check_fits(config.mechanism, config.rounds)
    if not flag_values['force_report'].value and _finished(config):
      return {}
    stop_signals.check()
    task = build_task(config)
  except (ValueError, flags.Error) as error:
    raise Failure(error, flag_parsing.ERROR_EXIT_CODE) from error
  except run_dir.RunDirError as error:
    raise Failure(error, flag_parsing.RUNTIME_ERROR_EXIT_CODE) from error
  except Exception as error:  # I/O while loading data, ...: one line, exit 1
    raise Failure(_runtime_message(error), flag_parsing.RUNTIME_ERROR_EXIT_CODE) from error
  # TensorFlow comes with the training loop (and the task): imported once the flags are checked,
  # so that `--help` and flag errors answer in about a second.
  stop_signals.check()
  from dp_ftrl_tff.training import run_start, training_loop
  try:
    stop_signals.check()
    return training_loop.train(task, config, config.output_dir)
  except run_start.SetupError as error:
    raise Failure(error, flag_parsing.ERROR_EXIT_CODE) from error
  except run_dir.RunDirError as error:
    raise Failure(error, flag_parsing.RUNTIME_ERROR_EXIT_CODE) from error
  except Exception as error:  # I/O (unwritable directory, full disk), memory, bugs: exit 1
    raise Failure(_runtime_message(error), flag_parsing.RUNTIME_ERROR_EXIT_CODE) from error


def run_main(flag_values: flags.FlagValues,
             build_task: Callable[[driver_config.DriverConfig], Any],
             task_settings: Callable[[flags.FlagValues], Dict[str, Any]], usage: str) -> None:
  """Runs a driver: parses `flag_values`, builds the `DriverConfig` and the task, trains.

  Args:
    flag_values: the driver's `FlagValues`, with `driver_flags.define_common_flags` applied.
    build_task: `DriverConfig` -> `dp_ftrl_tff.training.Task`.
    task_settings: parsed `flag_values` -> the driver's own settings (`DriverConfig.task`).
    usage: the text `--help` prints before the flags (the driver's docstring).
  """

  def main(argv):
    try:
      checked_main(argv)
    except stop_signals.Interrupted as stopped:  # SIGINT / SIGTERM: one line, exit 130 / 143
      console.notice(str(stopped))
      flag_parsing.exit_now(stopped.exit_code)

  def checked_main(argv):
    flag_parsing.end_workers_at_exit()
    stop_signals.check()
    if len(argv) > 1:
      flag_parsing.exit_with_error(f'unexpected arguments {argv[1:]}', flag_values)
    set_up_logging()
    try:
      run_from_flags(flag_values, build_task, task_settings)
    except Failure as failure:
      _fail(failure.error, flag_values, failure.exit_code)

  # absl's app.run does more than the drivers need, and TensorFlow first imported inside it builds
  # Keras models that fail (`Flatten` takes its symbolic input for an eager one): the drivers import
  # TensorFlow after their flags are checked, so they parse and start `main` themselves.
  # SIGINT / SIGTERM are only recorded, for the whole run: it stops at its next safe point (the
  # start's steps, between rounds, the end's steps); a second signal stops at once.
  with stop_signals.StopSignals(exit_on_second=True):
    argv = flag_parsing.flags_parser(flag_values, usage.rstrip('\n') + '\n' + HELP_NOTES)(sys.argv)
    logging.use_absl_handler()
    main(argv)
