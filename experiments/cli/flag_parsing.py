"""Flag parsing for the binaries: `--help` lists every flag, errors are one line naming the flag.

Every binary of `experiments/` owns a `flags.FlagValues()` (so that all binary modules import in one
process) and passes `flags_parser(flag_values, __doc__)` to `absl.app.run`. The library names its
parameters in backticks in every error (`rounds`, `bits`, ...); `error_line` writes each one the
binary has as a flag as `--name`, through `FLAG_NAMES` where the flag is named otherwise (SecAgg's settings carry a `secure_` prefix,
the sampling groups are `--sampling_groups`, ...), so an error names the flag the user typed.
Imports no TensorFlow.
"""

import logging as std_logging
import os
import re
import sys
from typing import Callable, List, NoReturn, Optional, Sequence

from absl import flags

from dp_ftrl_tff.training import console, run_config

#: Exit status of a driver stopped by bad input (flags, settings, execution context).
ERROR_EXIT_CODE = 2
#: Exit status of a driver stopped by a runtime error: a run directory in use by another run, a
#: corrupt run file (`dp_ftrl_tff.training.run_dir.RunDirError`).
RUNTIME_ERROR_EXIT_CODE = 1
_BACKTICKED = re.compile(r'`([A-Za-z_][A-Za-z0-9_]*)`')
#: absl's flagfile directive: `--flagfile=F` or `-flagfile=F` (group 1: F), or `--flagfile` alone.
_FLAGFILE = re.compile(r'^--?flagfile(?:=(.*))?$', re.DOTALL)

#: The library's name of a setting -> the flag that sets it, where the two differ: a flag is named
#: as `RunConfig`'s field of the same setting.
FLAG_NAMES = run_config.FIELD_NAMES


def flag_words(text: str, flag_names=None) -> str:
  """`text` with each backticked library name of `FLAG_NAMES` written as its flag's name (in
  backticks), where `flag_names` (None: all) has that flag."""
  return run_config.field_words(text, flag_names)


def error_line(error, flag_values: flags.FlagValues) -> str:
  """`error` as one line, with every backticked setting that is a flag written as `--name`."""
  def as_flag(match):
    return f'--{match.group(1)}' if match.group(1) in flag_values else match.group(0)
  text = flag_words(str(error), flag_values)
  return ' '.join(_BACKTICKED.sub(as_flag, text).split())


def error_text(error, flag_values: flags.FlagValues, program: Optional[str] = None) -> str:
  """`<program>: error: <one line>`: the one error format of every binary (`program`: default
  `console.program_name()`)."""
  return f'{program or console.program_name()}: error: {error_line(error, flag_values)}'


def exit_with_error(error, flag_values: flags.FlagValues,
                    exit_code: int = ERROR_EXIT_CODE) -> NoReturn:
  """Prints `<program>: error: <one line>` on stderr and exits with `exit_code` (`ERROR_EXIT_CODE`
  for bad input, `RUNTIME_ERROR_EXIT_CODE` for runtime errors).

  Exits with `os._exit` after flushing: no interpreter teardown, in which TFF's local executor
  destructors print "Exception ignored ... Traceback" lines or wait forever for a worker that
  ignores SIGINT (see dp_ftrl_tff/training/secure_context.py). Nothing has been trained at this point.
  """
  exit_now(exit_code, error_text(error, flag_values) + '\n')


#: The clean-ups `exit_now` runs first, since `os._exit` skips the atexit hooks (e.g. ending the
#: process's TFF worker_binary children: `end_workers_at_exit`).
_EXIT_HOOKS = []


def end_workers_at_exit() -> None:
  """Ends this process's TFF worker_binary children at exit, `exit_now` included
  (`dp_ftrl_tff.learning.worker_processes`)."""
  from dp_ftrl_tff.learning import worker_processes  # pylint: disable=g-import-not-at-top
  worker_processes.register_at_exit()
  register_exit_hook(worker_processes.end_child_workers)


def register_exit_hook(hook: Callable[[], object]) -> None:
  """Runs `hook()` in `exit_now`, before the process ends (once, however often registered)."""
  if not callable(hook):
    raise ValueError(f'`hook` must be callable, got {hook!r}.')
  if hook not in _EXIT_HOOKS:
    _EXIT_HOOKS.append(hook)


def exit_now(exit_code: int, stderr_text: str = '') -> NoReturn:
  """Runs the exit hooks (`register_exit_hook`), flushes, writes `stderr_text` and `os._exit`s
  (no interpreter teardown: see `exit_with_error`)."""
  for hook in _EXIT_HOOKS:
    hook()
  std_logging.shutdown()
  sys.stdout.flush()
  sys.stderr.write(stderr_text)
  sys.stderr.flush()
  os._exit(exit_code)


class FlagfileError(flags.Error):
  """A `--flagfile` that cannot be read, or that includes itself (directly or through others)."""


def _flagfile_names(args: Sequence[str], in_file: bool) -> List[str]:
  """The files that `args` (command-line arguments, or the raw lines of a flagfile) name with
  --flagfile, as absl reads them: `--flagfile=F` or `-flagfile=F` (F stripped, `~` expanded), on the
  command line also `--flagfile F`, up to a `--`; an empty F is ignored."""
  names = []
  for i, arg in enumerate(args):
    if arg == '--' and not in_file:
      break
    match = _FLAGFILE.match(arg)
    if match and match.group(1) is not None:
      names.append(match.group(1).strip())
    elif match and not in_file and i + 1 < len(args):
      names.append(args[i + 1])
  return [os.path.expanduser(name) for name in names if name]


def check_flagfiles(argv: Sequence[str]) -> None:
  """Checks every `--flagfile` of `argv` (argv[0] is the program) and the ones they include before
  absl reads them: absl reports a file it cannot open as `ERROR:: Unable to open flagfile: ...` and
  skips a circular include with a warning of its own, going on with the other flags.

  Raises:
    FlagfileError: naming the file that cannot be read (and why) or the circle of includes.
  """

  def check(path: str, including: tuple) -> None:
    real = os.path.realpath(path)
    reals = [r for _, r in including]
    if real in reals:
      circle = ' -> '.join([p for p, _ in including[reals.index(real):]] + [path])
      raise FlagfileError(f'--flagfile={path} includes itself ({circle}); remove the --flagfile '
                          'line that closes the circle.')
    try:
      with open(path, encoding='utf-8') as f:
        lines = f.readlines()
    except (OSError, UnicodeDecodeError) as error:
      reason = error.strerror if isinstance(error, OSError) else 'not a UTF-8 text file'
      where = f' (included by {including[-1][0]})' if including else ''
      raise FlagfileError(f'--flagfile={path}{where}: cannot read it: {reason}.') from None
    for name in _flagfile_names(lines, in_file=True):
      check(name, including + ((path, real),))

  for name in _flagfile_names(argv[1:], in_file=False):
    check(name, ())


def flags_parser(flag_values: flags.FlagValues, usage: str) -> Callable[[List[str]], List[str]]:
  """An absl `flags_parser` for `flag_values`: `--help` prints `usage` and every flag, a flag error
  (a `--flagfile` that cannot be read or includes itself too: `check_flagfiles`) is one line on
  stderr (`exit_with_error`); absl's own flags (`--verbosity`, ...) still work."""

  def parse(argv: List[str]) -> List[str]:
    if any(arg in ('-h', '--help', '-help', '--helpfull', '-?') for arg in argv[1:]):
      print(f'{usage}\nFlags:\n{flag_values.get_help()}')
      sys.exit(0)
    try:
      check_flagfiles(argv)
      # The binary's flags first; what remains (absl's own, e.g. --verbosity) goes to absl's global
      # FLAGS, which `app.run` requires parsed.
      remaining = flag_values(argv, known_only=True)
      return flags.FLAGS(remaining)
    except flags.Error as error:
      exit_with_error(error, flag_values)

  return parse
