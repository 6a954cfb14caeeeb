r"""Trains any task with DP-FTRL: `--task=PACKAGE.MODULE:FUNCTION` names a function that takes the
run's settings (`experiments.run.driver_config.DriverConfig`: `data`, `synthetic_*`,
`client_batch_size`, `client_epochs`, `seed`, ...) and returns a `dp_ftrl_tff.training.Task` (the
model, the training `ClientData`, the preprocessing, the evaluation). Every flag of the drivers
applies: mechanism, noise, clipping, restarts, sampler, SecAgg, canaries, workers, cadences; the
run directory, resume and report are theirs (docs/training.md).

Example (the tabular MLP of experiments/tabular/task.py on 100 in-memory clients):
  python -m experiments.run_task --task=experiments.tabular.task:build_task \
      --root_output_dir=/tmp/runs --synthetic_num_clients=100 --rounds=4

"""

import importlib
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
if __name__ == '__main__':  # SIGINT / SIGTERM recorded from the start (dp_ftrl_tff.training.stop_signals)
  from dp_ftrl_tff.training import stop_signals as _stop_signals
  _stop_signals.record_early()

from absl import flags  # noqa: E402

from experiments.run import driver, driver_flags  # noqa: E402

FLAGS = flags.FlagValues()
driver_flags.define_common_flags(FLAGS)
flags.DEFINE_string('task', None, 'The task entry (required): PACKAGE.MODULE:FUNCTION, a function '
                    'of the run\'s settings returning a dp_ftrl_tff.training.Task; the module is '
                    'imported from the working directory and sys.path.', flag_values=FLAGS)


def load_task_entry(entry):
  """The function `entry` ('package.module:function') names.

  Raises:
    ValueError: `entry` is missing or malformed, its module cannot be imported, or it names no
      callable.
  """
  if not entry or not isinstance(entry, str) or entry.count(':') != 1:
    raise ValueError(f'`task` must be PACKAGE.MODULE:FUNCTION, got {entry!r}.')
  module_name, function_name = entry.split(':')
  if not module_name or not function_name:
    raise ValueError(f'`task` must be PACKAGE.MODULE:FUNCTION, got {entry!r}.')
  try:
    module = importlib.import_module(module_name)
  except ImportError as error:
    raise ValueError(f'`task`: cannot import {module_name!r} ({error}).') from error
  function = getattr(module, function_name, None)
  if not callable(function):
    raise ValueError(f'`task`: {module_name} has no function {function_name!r}.')
  return function


def build_task(config):
  """The `dp_ftrl_tff.training.Task` the `--task` entry returns for `config`."""
  from dp_ftrl_tff.training import task as task_lib  # pylint: disable=g-import-not-at-top
  task = load_task_entry(config.task['entry'])(config)
  if not isinstance(task, task_lib.Task):
    raise ValueError(f'`task`: {config.task["entry"]} returned a {type(task).__name__}, not a '
                     'dp_ftrl_tff.training.Task.')
  return task


def task_settings(fv: flags.FlagValues) -> dict:
  """The driver's own settings (`DriverConfig.task`): the task entry."""
  if not fv.task:
    raise ValueError('`task` is required: --task=PACKAGE.MODULE:FUNCTION.')
  return {'entry': fv.task}


if __name__ == '__main__':
  driver.run_main(FLAGS, build_task, task_settings, __doc__)
