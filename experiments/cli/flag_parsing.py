"""Flag parsing for the binaries: `--help` lists every flag, errors are one line naming the flag.

Every binary of `experiments/` owns a `flags.FlagValues()` (so that all binary modules import in one
process) and passes `flags_parser(flag_values, __doc__)` to `absl.app.run`, which also applies the
deprecated flag names (`flag_aliases`). The library names its parameters in backticks in every
error (`rounds`, `bits`, ...); `error_line` writes each one the binary has as a flag as `--name`,
through `FLAG_NAMES` where the flag is named otherwise (SecAgg's settings carry a `secure_` prefix,
the sampling groups are `--sampling_groups`, ...), so an error names the flag the user typed.
Imports no TensorFlow.
"""

import logging as std_logging
import os
import re
import sys
from typing import Callable, List, NoReturn, Optional

from absl import flags

from experiments.cli import flag_aliases, tff_workers

#: Exit status of a driver stopped by bad input (flags, settings, execution context).
ERROR_EXIT_CODE = 2
#: Exit status of a driver stopped by a runtime error: a run directory in use by another run, a
#: corrupt run file (`experiments.run.run_dir.RunDirError`).
RUNTIME_ERROR_EXIT_CODE = 1
_BACKTICKED = re.compile(r'`([A-Za-z_][A-Za-z0-9_]*)`')

#: The library's name of a setting -> the flag that sets it, where the two differ.
FLAG_NAMES = {
    'num_rounds': 'rounds',
    'delta': 'target_delta',
    'max_elements': 'max_elements_per_client',
    'participation': 'min_sep',
    'beyond_max_rounds': 'banded_beyond_max_rounds',
    'bits': 'secure_bits',
    'rotation': 'secure_rotation',
    'beta': 'secure_beta',
    'modclip_prob': 'secure_modclip_prob',
    'secure': 'secure_aggregation',
    'adaptive_clip': 'adaptive_clipping',
    'initial_clip': 'clip_norm',
    'num_groups': 'sampling_groups',
    'kind': 'sampler',
    'warmup': 'restart_warmup',
    'period': 'restart_period',
    'allow_setting_mismatch': 'allow_strategy_setting_mismatch',
}


def flag_words(text: str, flag_names=None) -> str:
  """`text` with each backticked library name of `FLAG_NAMES` written as its flag's name (in
  backticks), where `flag_names` (None: all) has that flag."""
  def rename(match):
    flag = FLAG_NAMES.get(match.group(1))
    if flag is None or (flag_names is not None and flag not in flag_names):
      return match.group(0)
    return f'`{flag}`'
  return _BACKTICKED.sub(rename, str(text))


def error_line(error, flag_values: flags.FlagValues) -> str:
  """`error` as one line, with every backticked setting that is a flag written as `--name`."""
  def as_flag(match):
    return f'--{match.group(1)}' if match.group(1) in flag_values else match.group(0)
  text = flag_words(str(error), flag_values)
  return flag_aliases.typed_names(' '.join(_BACKTICKED.sub(as_flag, text).split()), flag_values)


def program_name() -> str:
  """The binary's name in its messages: its file's name (`run_emnist.py`, `mechanisms_cli.py`)."""
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'driver'


def error_text(error, flag_values: flags.FlagValues, program: Optional[str] = None) -> str:
  """`<program>: error: <one line>`: the one error format of every binary (`program`: default
  `program_name()`)."""
  return f'{program or program_name()}: error: {error_line(error, flag_values)}'


def warn(message: str) -> None:
  """`<program>: warning: <message>` on stderr: the one warning format of every binary."""
  print(f'{program_name()}: warning: {message}', file=sys.stderr, flush=True)


def exit_with_error(error, flag_values: flags.FlagValues,
                    exit_code: int = ERROR_EXIT_CODE) -> NoReturn:
  """Prints `<program>: error: <one line>` on stderr and exits with `exit_code` (`ERROR_EXIT_CODE`
  for bad input, `RUNTIME_ERROR_EXIT_CODE` for runtime errors).

  Exits with `os._exit` after flushing: no interpreter teardown, in which TFF's local executor
  destructors print "Exception ignored ... Traceback" lines or wait forever for a worker that
  ignores SIGINT (see experiments/run/secure_context.py). Nothing has been trained at this point.
  """
  exit_now(exit_code, error_text(error, flag_values) + '\n')


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
      flag_aliases.apply_aliases(flag_values)
      return flags.FLAGS(remaining)
    except flags.Error as error:
      exit_with_error(error, flag_values)

  return parse
