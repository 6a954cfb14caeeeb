"""Command line for strategies: `python -m dp_ftrl_tff.mechanisms optimize|evaluate [flags]`.

  optimize --mechanism=blt --rounds=N --min_sep=B [--max_participations=K] [--num_buffers=D]
           [--error=max|rms] [--output=FILE.json] [--json]
  optimize --mechanism=banded --rounds=N [--num_bands=H] --min_sep=B [--max_participations=K]
           [--error=rms|max] [--output=FILE.npz] [--json]
  evaluate --mechanism=gaussian|tree|tree_efficient|tree_full|banded|blt --rounds=N --min_sep=B
           [--max_participations=K] [--theta=a,b --omega=c,d | --mechanism_file=F] [--json]

Conventions: rounds are 0-based; `--min_sep` = b is the BLT/BandMF min-sep (TF-Privacy's
min_separation + 1); `--max_participations` = k defaults to ceil(n / b), and the printed value is the
effective k = min(k, ceil(n / b)). `--min_sep=1 --max_participations=1` is single participation;
`--fixed_epoch` selects (k, b) fixed-epoch participation. Losses use clip norm 1 and noise multiplier 1
(BLT paper Eq. 9-10). Without `--num_buffers` the BLT optimizer tries 1 .. 8 buffers and keeps the
smallest count within 0.05% of the best loss.

The binary: it defines the flags (on its own `FlagValues`) and checks them against the mechanism
registry; the work is `commands.optimize` and `commands.evaluate`, which take plain arguments.

Exit status: 0 on success; 2 on a user mistake (bad or conflicting flags, a missing file, a number of
rounds whose arrays cannot fit in memory: `memory.check_fits`); 1 on a runtime failure (an unwritable
`--output`, a corrupt `--mechanism_file`, I/O errors). Either way one line `error: ...` on stderr
naming the flag; `--debug` prints the traceback before it.
"""

import json
import os
import sys
import traceback
from typing import Sequence

from absl import flags

from dp_ftrl_tff import _deprecated_flags
from dp_ftrl_tff.mechanisms import base, commands, files, memory, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib

COMMANDS = ('optimize', 'evaluate')
# Every mechanism-specific option, from the registry.
_OPTIMIZER_OPTIONS = sorted({option for name in registry.optimizable()
                             for option in registry.get(name).optimizer_options})
_PARAMETER_OPTIONS = sorted({option for name in registry.names()
                             for option in registry.get(name).parameter_options})

_FLAGS = flags.FlagValues()
flags.DEFINE_enum('mechanism', None, list(registry.names()), 'Mechanism name.', flag_values=_FLAGS)
flags.DEFINE_integer('rounds', None, 'Number of rounds n.', lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_integer('min_sep', None, 'Min-sep b (TF-Privacy min_separation + 1).', lower_bound=1,
                     flag_values=_FLAGS)
flags.DEFINE_integer('max_participations', None, 'Max participations k (default ceil(n / b)).',
                     lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_bool('fixed_epoch', False, '(k, b) fixed-epoch participation (needs k).',
                  flag_values=_FLAGS)
flags.DEFINE_integer('num_buffers', None, 'BLT buffers d (default: try 1..8).', lower_bound=1,
                     flag_values=_FLAGS)
flags.DEFINE_integer('num_bands', None, 'BandMF bands b-hat (default: min(min_sep, rounds)).',
                     lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_enum('error', None, ['max', 'rms'],
                  'Loss to optimize (default: max for blt, rms for banded).', flag_values=_FLAGS)
flags.DEFINE_string('output', None, 'Save the optimized strategy here (.json blt, .npz banded).',
                    flag_values=_FLAGS)
flags.DEFINE_list('theta', None, 'BLT buffer decays, comma separated.', flag_values=_FLAGS)
flags.DEFINE_list('omega', None, 'BLT output scales, comma separated.', flag_values=_FLAGS)
flags.DEFINE_string('mechanism_file', None, 'Strategy file written by `optimize --output`.',
                    flag_values=_FLAGS)
flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.', flag_values=_FLAGS)
flags.DEFINE_bool('debug', False, 'On an error, print the traceback before the one-line message.',
                  flag_values=_FLAGS)
_ALIASES = {'buffers': 'num_buffers', 'bands': 'num_bands'}
for _old, _new in _ALIASES.items():
  _deprecated_flags.define_alias(_old, _new, _FLAGS)


USAGE_EXIT_CODE = 2
RUNTIME_EXIT_CODE = 1


class UsageError(ValueError):
  """Bad command-line input; the message names the flag (exit status 2)."""


class RuntimeFailure(Exception):
  """A runtime failure: unwritable output, corrupt input file (exit status 1)."""


def _load_strategy_file(path: str) -> base.Strategy:
  if not os.path.isfile(path):
    raise UsageError(f'--mechanism_file: no file at {path!r}.')
  try:
    return files.load_strategy(path)
  except ValueError as e:
    raise RuntimeFailure(f'--mechanism_file: {e}; rewrite it with `optimize --output`.') from e


def _check_output(path: str) -> None:
  """An unwritable --output fails before the optimization, not after it."""
  directory = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise RuntimeFailure(f'--output={path} is a directory; give a file path.')
  if not os.path.isdir(directory):
    raise RuntimeFailure(f'--output={path}: directory {directory} does not exist; create it first.')
  if not os.access(directory, os.W_OK):
    raise RuntimeFailure(f'--output={path}: directory {directory} is not writable.')


def _floats(values, flag: str) -> list:
  try:
    return [float(v) for v in values]
  except ValueError:
    raise UsageError(f'--{flag} must be comma-separated numbers, got {",".join(values)!r}.') from None


def _participation(fv) -> participation_lib.ParticipationSchema:
  if fv.fixed_epoch and fv.max_participations is None:
    raise UsageError('--max_participations is required with --fixed_epoch.')
  return participation_lib.ParticipationSchema(min_sep=fv.min_sep,
                                                max_participations=fv.max_participations,
                                                fixed_epoch=fv.fixed_epoch)


def _require(fv, *names) -> None:
  for name in names:
    if getattr(fv, name) is None:
      raise UsageError(f'--{name} is required.')


def _forbid(fv, command: str, *names) -> None:
  for name in names:
    if getattr(fv, name) not in (None, False):
      raise UsageError(f'--{name} does not apply to `{command}`.')


def _run_optimize(fv) -> dict:
  _require(fv, 'mechanism', 'rounds', 'min_sep')
  _forbid(fv, 'optimize', 'mechanism_file', *_PARAMETER_OPTIONS)
  if fv.mechanism not in registry.optimizable():
    raise UsageError(f'--mechanism must be one of {list(registry.optimizable())} for optimize, got '
                     f'{fv.mechanism!r}.')
  entry = registry.get(fv.mechanism)
  own = entry.optimizer_options
  _forbid(fv, f'optimize --mechanism={fv.mechanism}',
          *(option for option in _OPTIMIZER_OPTIONS if option not in own))
  if fv.num_bands is not None and fv.num_bands > fv.rounds:
    raise UsageError(f'--num_bands={fv.num_bands} must not exceed --rounds={fv.rounds}.')
  if fv.output and fv.output.lower().endswith('.npz') != (entry.file_suffix == '.npz'):
    raise UsageError(f'--output for {fv.mechanism} must '
                     + ('end with .npz.' if entry.file_suffix == '.npz' else
                        'be a JSON path (not .npz).'))
  memory.check_fits(fv.mechanism, fv.rounds)
  if fv.output:
    _check_output(fv.output)
  return commands.optimize(fv.mechanism, fv.rounds, _participation(fv), error=fv.error,
                           output=fv.output, **{option: getattr(fv, option) for option in own})


def _strategy_for_evaluate(fv) -> base.Strategy:
  if fv.mechanism_file is not None:
    _forbid(fv, 'evaluate --mechanism_file', *_PARAMETER_OPTIONS)
    strategy = _load_strategy_file(fv.mechanism_file)
    if fv.mechanism is not None and fv.mechanism != strategy.name:
      raise UsageError(f'--mechanism={fv.mechanism} but --mechanism_file holds a '
                       f'{strategy.name} strategy.')
    return strategy
  _require(fv, 'mechanism')
  entry = registry.get(fv.mechanism)
  _forbid(fv, f'evaluate --mechanism={fv.mechanism}',
          *(option for option in _PARAMETER_OPTIONS if option not in entry.parameter_options))
  if entry.parameter_options:
    _require(fv, *entry.parameter_options)
    values = {option: _floats(getattr(fv, option), option) for option in entry.parameter_options}
    first = entry.parameter_options[0]
    for option in entry.parameter_options[1:]:
      if len(values[option]) != len(values[first]):
        raise UsageError(f'--{first} has {len(values[first])} values but --{option} has '
                         f'{len(values[option])}.')
    try:
      return registry.strategy_from_config({'mechanism': fv.mechanism, **values})
    except ValueError as e:
      raise UsageError(f'--{"/--".join(entry.parameter_options)}: {e}') from None
  if entry.needs_parameters:
    raise UsageError(f'--mechanism_file is required for --mechanism={fv.mechanism}.')
  return registry.default_strategy(fv.mechanism)


def _run_evaluate(fv) -> dict:
  _require(fv, 'rounds', 'min_sep')
  _forbid(fv, 'evaluate', 'error', 'output', *_OPTIMIZER_OPTIONS)
  strategy = _strategy_for_evaluate(fv)
  if strategy.max_rounds is not None and fv.rounds > strategy.max_rounds:
    raise UsageError(f'--rounds={fv.rounds} exceeds the {strategy.max_rounds} rounds of the '
                     f'{strategy.name} strategy.')
  memory.check_fits(strategy.name, fv.rounds)
  record = commands.evaluate(strategy, fv.rounds, _participation(fv))
  if fv.mechanism_file is not None:
    record['mechanism_file'] = fv.mechanism_file
  else:
    record.update(strategy.describe())
  return record


def _usage() -> str:
  return __doc__ + '\nFlags:\n' + _FLAGS.get_help()


def _exit_code(error: BaseException) -> int:
  if isinstance(error, RuntimeFailure | OSError | MemoryError):
    return RUNTIME_EXIT_CODE
  if isinstance(error, flags.Error | ValueError):
    return USAGE_EXIT_CODE
  return RUNTIME_EXIT_CODE


def _report_error(error: BaseException, argv: Sequence[str]) -> int:
  """Prints `error: <one line>` on stderr (the traceback first with --debug); returns the status."""
  debug = _FLAGS['debug'].value if _FLAGS.is_parsed() else any(
      arg in ('--debug', '-debug', '--debug=true', '--debug=1') for arg in argv[1:])
  if debug:
    traceback.print_exc()
  if isinstance(error, MemoryError):
    message = 'out of memory; use fewer --rounds.'
  elif isinstance(error, flags.Error | ValueError | RuntimeFailure):
    message = str(error)
  else:
    message = f'{type(error).__name__}: {error} (rerun with --debug for the traceback)'
  print(f'error: {" ".join(message.split())}', file=sys.stderr)
  return _exit_code(error)


def main(argv: Sequence[str]) -> int:
  """Runs the CLI on `argv` (argv[0] is the program name); returns the exit status."""
  argv = list(argv)
  if any(arg in ('-h', '--help', '-help', '--helpfull') for arg in argv[1:]):
    print(_usage())
    return 0
  try:
    _FLAGS.unparse_flags()
    positional = _FLAGS(argv)[1:]
    _deprecated_flags.apply_aliases(_FLAGS, _ALIASES)
    if len(positional) != 1 or positional[0] not in COMMANDS:
      raise UsageError(f'expected one command out of {list(COMMANDS)}, got {positional}.')
    record = _run_optimize(_FLAGS) if positional[0] == 'optimize' else _run_evaluate(_FLAGS)
  except Exception as e:  # every error is one line; --debug adds the traceback
    return _report_error(e, argv)
  print(json.dumps(record) if _FLAGS.json else commands.format_table(record))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
