"""The `main` of the simulation drivers: flags -> `RunConfig` -> `training_loop.run`, with one-line
errors.

A driver binary owns a `flags.FlagValues()` with the common flags (`driver_flags`) and its own, and
calls `run_main(flag_values, build_task, task_settings)` under `if __name__ == '__main__'`. Bad input
(flags, settings, data, schedule, run directory, execution context) ends the program before any
training with `<program>: error: <one line>` on stderr and exit status 2; `--help` lists every flag
with its default.
"""

import logging as std_logging
from typing import Any, Callable, Dict

from absl import app, flags, logging

from experiments import driver_flags, flag_parsing, run_config, tff_workers, training_loop


def set_up_logging() -> None:
  """absl INFO lines on stderr without TF's chatter (drivers call it in main)."""
  logging.set_verbosity(logging.INFO)
  std_logging.getLogger('tensorflow').setLevel(std_logging.ERROR)


def run_main(flag_values: flags.FlagValues,
             build_task: Callable[[run_config.RunConfig], run_config.Task],
             task_settings: Callable[[flags.FlagValues], Dict[str, Any]], usage: str) -> None:
  """Runs a driver: parses `flag_values`, builds the `RunConfig` and the task, trains.

  Args:
    flag_values: the driver's `FlagValues`, with `driver_flags.define_common_flags` applied.
    build_task: `RunConfig` -> `run_config.Task`.
    task_settings: parsed `flag_values` -> the driver's own settings (`RunConfig.task`).
    usage: the text `--help` prints before the flags (the driver's docstring).
  """

  def main(argv):
    tff_workers.register_at_exit()
    if len(argv) > 1:
      flag_parsing.exit_with_error(f'unexpected arguments {argv[1:]}', flag_values)
    set_up_logging()
    try:
      config = driver_flags.config_from_flags(flag_values, task_settings(flag_values))
      task = build_task(config)
    except (ValueError, flags.Error) as error:
      flag_parsing.exit_with_error(error, flag_values)
    try:
      training_loop.run(task, config)
    except training_loop.SetupError as error:
      flag_parsing.exit_with_error(error, flag_values)

  app.run(main, flags_parser=flag_parsing.flags_parser(flag_values, usage))
