"""Flag parsing for the binaries: `--help` lists every flag, errors are one line on stderr.

Every binary of `experiments/` owns a `flags.FlagValues()` (so that all binary modules import in one
process) and passes `flags_parser(flag_values, __doc__)` to `absl.app.run`. Imports no TensorFlow.
"""

import logging as std_logging
import os
import re
import sys
from typing import Callable, List, NoReturn

from absl import flags

from experiments import tff_workers

#: Exit status of a driver stopped by bad input (flags, settings, execution context).
ERROR_EXIT_CODE = 2
#: Exit status of a driver stopped by a runtime error: a run directory in use by another run, a
#: corrupt run file (`experiments.run_dir.RunDirError`).
RUNTIME_ERROR_EXIT_CODE = 1
_BACKTICKED = re.compile(r'`([A-Za-z_][A-Za-z0-9_]*)`')


def error_line(error, flag_values: flags.FlagValues) -> str:
  """`error` as one line, with every backticked setting that is a flag written as `--name`."""
  def as_flag(match):
    return f'--{match.group(1)}' if match.group(1) in flag_values else match.group(0)
  return ' '.join(_BACKTICKED.sub(as_flag, str(error)).split())


def exit_with_error(error, flag_values: flags.FlagValues,
                    exit_code: int = ERROR_EXIT_CODE) -> NoReturn:
  """Prints `<program>: error: <one line>` on stderr and exits with `exit_code` (`ERROR_EXIT_CODE`
  for bad input, `RUNTIME_ERROR_EXIT_CODE` for runtime errors).

  Exits with `os._exit` after flushing: no interpreter teardown, in which TFF's local executor
  destructors print "Exception ignored ... Traceback" lines or wait forever for a worker that
  ignores SIGINT (see experiments/secure_context.py). Nothing has been trained at this point.
  """
  program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'driver'
  exit_now(exit_code, f'{program}: error: {error_line(error, flag_values)}\n')


def exit_now(exit_code: int, stderr_text: str = '') -> NoReturn:
  """Ends this process's worker_binary children, flushes, writes `stderr_text` and `os._exit`s
  (no interpreter teardown: see `exit_with_error`)."""
  tff_workers.end_child_workers()  # os._exit skips the atexit hooks that would.
  std_logging.shutdown()
  sys.stdout.flush()
  sys.stderr.write(stderr_text)
  sys.stderr.flush()
  os._exit(exit_code)


def flags_parser(flag_values: flags.FlagValues, usage: str) -> Callable[[List[str]], List[str]]:
  """An absl `flags_parser` for `flag_values`: `--help` prints `usage` and every flag, a flag error
  is one line on stderr (`exit_with_error`); absl's own flags (`--verbosity`, ...) still work."""

  def parse(argv: List[str]) -> List[str]:
    if any(arg in ('-h', '--help', '-help', '--helpfull', '-?') for arg in argv[1:]):
      print(f'{usage}\nFlags:\n{flag_values.get_help()}')
      sys.exit(0)
    try:
      # The binary's flags first; what remains (absl's own, e.g. --verbosity) goes to absl's global
      # FLAGS, which `app.run` requires parsed.
      remaining = flag_values(argv, known_only=True)
      return flags.FLAGS(remaining)
    except flags.Error as error:
      exit_with_error(error, flag_values)

  return parse
