"""`make demo`: BLT-DP-FTRL on a synthetic federated EMNIST population with min-sep client sampling.

Runs the EMNIST driver with `--flagfile=configs/demo.cfg` (the demo's settings live only there):
20 rounds, 1000 synthetic clients, 50 per round, min_sep b = 10, at most 2 participations, a BLT
optimized at start for (n=20, b=10, k=2), noise multiplier 1, clip 1, a softmax-regression model.
Everything is seeded, so two runs print the same numbers (but for the round times). It prints one
line per round, the privacy report, the run directory's files and the path of its report.md.

Each call writes a new run directory, `<root>/demo-<local time YYYYmmdd-HHMMSS>-<PID>` (`-2`, `-3`,
... appended if that name exists), so every call trains from scratch; the demo deletes nothing
(remove old demo runs yourself). With --experiment_name=X the demo runs in <root>/X exactly as the
EMNIST driver does: a new run, a resume of an interrupted one, the finished-run notice, or a refusal
of a directory in use by another run (its PID named) or holding a run with other settings.

Example: python -m experiments.demo   (the same as `make demo`)
Demo-only default: --root_output_dir=/tmp/dp_ftrl_tff_demo (the system temp dir). Any driver flag
given on the command line overrides the flagfile's, e.g. `--rounds=10`.
Exit codes: 0 ok; 2 bad input (flags, settings, input files); 1 runtime failure (I/O, a run
directory in use, a corrupt run file); 130 / 143 stopped by SIGINT / SIGTERM (as the EMNIST driver).
Docs: docs/training.md (section `make demo`).
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')  # as the drivers; before TensorFlow is imported
if __name__ == '__main__':  # SIGINT / SIGTERM recorded from the start (dp_ftrl_tff.training.stop_signals)
  from dp_ftrl_tff.training import stop_signals as _stop_signals
  _stop_signals.record_early()

import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from absl import logging  # noqa: E402

from dp_ftrl_tff.training import run_dir, stop_signals
from experiments.cli import flag_parsing  # noqa: E402
from experiments.emnist import run_emnist  # noqa: E402
from experiments.run import driver

FLAGFILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs',
                        'demo.cfg')
DEFAULT_ROOT_OUTPUT_DIR = os.path.join(tempfile.gettempdir(), 'dp_ftrl_tff_demo')
FLAGS = run_emnist.FLAGS  # the EMNIST driver's flags
#: The --experiment_name that `demo_argv` puts before the user's flags, replaced by a new directory
#: name in `main`: it holds a NUL byte, which no command-line argument can hold.
FRESH_NAME = '\0fresh'


def demo_argv(argv):
  """The driver's command line of the demo: the flagfile, the demo's default root directory and
  `FRESH_NAME`, then the user's flags (later flags win)."""
  return [argv[0], f'--flagfile={FLAGFILE}', f'--root_output_dir={DEFAULT_ROOT_OUTPUT_DIR}',
          f'--experiment_name={FRESH_NAME}', *argv[1:]]


def fresh_experiment_name(root: str) -> str:
  """A run directory name that `root` does not hold: `demo-<local time YYYYmmdd-HHMMSS>-<PID>`
  (two demos started in the same second differ in their PID), with `-2`, `-3`, ... appended while
  `root` holds the name (the same process started a demo in the same second)."""
  base = f'demo-{time.strftime("%Y%m%d-%H%M%S")}-{os.getpid()}'
  name, count = base, 1
  while os.path.lexists(os.path.join(root, name)):
    count += 1
    name = f'{base}-{count}'
  return name


def _fail(error, exit_code: int = flag_parsing.ERROR_EXIT_CODE):
  if FLAGS['debug'].value:
    traceback.print_exc()
  flag_parsing.exit_with_error(error, FLAGS, exit_code)


def main(argv) -> None:
  """`driver.run_main` of the EMNIST driver on a new run directory (unless --experiment_name was
  given), plus the report's path at the end. Deletes nothing: the driver checks the flags and
  settings, then takes the run directory's lock, before it writes anything."""
  flag_parsing.end_workers_at_exit()
  if len(argv) > 1:
    flag_parsing.exit_with_error(f'unexpected arguments {argv[1:]}', FLAGS)
  driver.set_up_logging()
  if FLAGS.experiment_name == FRESH_NAME:
    FLAGS.experiment_name = fresh_experiment_name(FLAGS.root_output_dir or '')
  try:
    stop_signals.check()
    driver.run_from_flags(FLAGS, run_emnist.build_task, run_emnist.task_settings)
  except driver.Failure as failure:
    _fail(failure.error, failure.exit_code)
  except stop_signals.Interrupted as stopped:  # SIGINT / SIGTERM: one line, exit 130 / 143
    logging.warning('%s', stopped)
    flag_parsing.exit_now(stopped.exit_code)
  report = os.path.join(FLAGS.root_output_dir, FLAGS.experiment_name, run_dir.REPORT_DIR,
                        'report.md')
  print(f'\nDemo done. Privacy report (markdown): {report}', flush=True)


def run() -> None:
  """The demo's command line (`sys.argv`): parsed as `driver.run_main` does (without absl's
  app.run; TensorFlow is imported once the flags are checked), then `main`."""
  with stop_signals.StopSignals(exit_on_second=True):  # signals stop at safe points, as a driver's
    main_argv = flag_parsing.flags_parser(FLAGS, __doc__)(demo_argv(sys.argv))
    logging.use_absl_handler()
    main(main_argv)


if __name__ == '__main__':
  run()
