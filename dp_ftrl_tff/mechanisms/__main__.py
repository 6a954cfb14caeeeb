"""Command line for strategies: `python -m dp_ftrl_tff.mechanisms optimize|evaluate [flags]`.

  optimize --mechanism=blt --rounds=N --min_sep=B [--max_participations=K] [--num_buffers=D]
           [--error=max|rms] [--output=FILE.json] [--json]
  optimize --mechanism=banded --rounds=N [--num_bands=H] --min_sep=B [--max_participations=K]
           [--error=rms|max] [--output=FILE.npz] [--json]
  optimize --mechanism=bsr|bisr --rounds=N --min_sep=B [--num_bands=H] [--output=FILE.json]
           (closed forms: builds the strategy for the setting, default H = min(min_sep, rounds))
  evaluate --mechanism=gaussian|tree|tree_efficient|tree_full|banded|blt|bsr|bisr --rounds=N
           --min_sep=B [--max_participations=K] [--theta=a,b --omega=c,d | --num_bands=H |
           --mechanism_file=F] [--json]
  amplified --rounds=N --num_bands=H (--sampling_prob=Q | --dataset_size=M --batch_size=B)
           (--noise_multiplier=S | --target_epsilon=E) [--delta=D] [--accountant=pld|rdp]
           [--mechanism_file=F | --mechanism=gaussian] [--json]
  select_bands --rounds=N --dataset_size=M --batch_size=B --target_epsilon=E [--delta=D]
           [--accountant=pld|rdp] [--error=rms|max] [--output=FILE.npz] [--json]

Conventions: rounds are 0-based; `--min_sep` = b is the BLT/BandMF min-sep (TF-Privacy's
min_separation + 1); `--max_participations` = k defaults to ceil(n / b), and the printed value is the
effective k = min(k, ceil(n / b)). `--min_sep=1 --max_participations=1` is single participation;
`--fixed_epoch` selects (k, b) fixed-epoch participation. Losses use clip norm 1 and noise multiplier 1
(BLT paper Eq. 9-10). Without `--num_buffers` the BLT optimizer tries 1 .. 8 buffers and keeps the
smallest count within 0.05% of the best loss.

Amplification (BandMF paper Sec. 5, App. F; `dp_ftrl_tff.accounting.amplification`): the population
of M is split into H = `--num_bands` groups, round t samples group t mod H, each member with
probability Q (`--sampling_prob`, or B / floor(M / H) from `--dataset_size` and `--batch_size`).
`amplified` prints epsilon (or the calibrated sigma) of ceil(N / H) Poisson-sampled Gaussian rounds,
with sigma relative to a largest column norm of 1, or to the strategy's with `--mechanism_file`
(which must have at most H bands). `select_bands` picks the H in 1 .. floor(M / B) minimizing
sigma(H) * RmsLoss(H) of the optimized H-banded strategy and prints every evaluated candidate
(`dp_ftrl_tff.accounting.band_selection`); `--output` saves the chosen strategy.

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
from dp_ftrl_tff.accounting import (  # the amplified commands; only this binary imports accounting
    amplification,
    band_selection,
    zcdp,
)
from dp_ftrl_tff.mechanisms import base, commands, files, memory, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib

COMMANDS = ('optimize', 'evaluate', 'amplified', 'select_bands')
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
flags.DEFINE_integer('num_bands', None, 'Bands b-hat of banded, bsr, bisr (optimize default: '
                     'min(min_sep, rounds)).',
                     lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_enum('error', None, ['max', 'rms'],
                  'Loss to optimize (default: max for blt, rms for banded).', flag_values=_FLAGS)
flags.DEFINE_string('output', None, 'Save the optimized strategy here (.json blt, .npz banded).',
                    flag_values=_FLAGS)
flags.DEFINE_list('theta', None, 'BLT buffer decays, comma separated.', flag_values=_FLAGS)
flags.DEFINE_list('omega', None, 'BLT output scales, comma separated.', flag_values=_FLAGS)
flags.DEFINE_string('mechanism_file', None, 'Strategy file written by `optimize --output`.',
                    flag_values=_FLAGS)
flags.DEFINE_float('sampling_prob', None, "amplified: probability that a member of the round's "
                   'group participates.', flag_values=_FLAGS)
flags.DEFINE_integer('dataset_size', None, 'amplified, select_bands: population M split into the '
                     'sampling groups.', lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_integer('batch_size', None, 'amplified, select_bands: expected participants per round '
                     'B (sampling prob B / floor(M / H)).', lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_float('noise_multiplier', None, 'amplified: sigma, relative to the clip norm.',
                   flag_values=_FLAGS)
flags.DEFINE_float('target_epsilon', None, 'amplified, select_bands: calibrate sigma to this '
                   'epsilon.', flag_values=_FLAGS)
flags.DEFINE_float('delta', zcdp.DEFAULT_DELTA, 'amplified, select_bands: delta.',
                   flag_values=_FLAGS)
flags.DEFINE_enum('accountant', 'pld', list(amplification.ACCOUNTANTS),
                  'amplified, select_bands: dp_accounting accountant.', flag_values=_FLAGS)
# Flags of the amplified commands only.
_AMPLIFICATION_FLAGS = ('sampling_prob', 'dataset_size', 'batch_size', 'noise_multiplier',
                        'target_epsilon', 'delta', 'accountant')
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


def _parameter(fv, option: str):
  """A parameter flag's value: list flags (theta, omega) as floats, integer flags as they are."""
  value = getattr(fv, option)
  return _floats(value, option) if isinstance(value, list) else value


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
  _forbid(fv, 'optimize', 'mechanism_file',
          *(option for option in _PARAMETER_OPTIONS if option not in _OPTIMIZER_OPTIONS))
  if fv.mechanism not in registry.optimizable():
    raise UsageError(f'--mechanism must be one of {list(registry.optimizable())} for optimize, got '
                     f'{fv.mechanism!r}.')
  entry = registry.get(fv.mechanism)
  own = entry.optimizer_options
  _forbid(fv, f'optimize --mechanism={fv.mechanism}',
          *(option for option in _OPTIMIZER_OPTIONS if option not in own))
  if fv.error is not None and entry.default_error is None:
    raise UsageError(f'--error does not apply to optimize --mechanism={fv.mechanism} (a closed form '
                     f'with nothing to minimize).')
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
    values = {option: _parameter(fv, option) for option in entry.parameter_options}
    first = entry.parameter_options[0]
    for option in entry.parameter_options[1:]:  # list-valued options (theta, omega) pair up
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
  _forbid(fv, 'evaluate', 'error', 'output',
          *(option for option in _OPTIMIZER_OPTIONS if option not in _PARAMETER_OPTIONS))
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


def _forbid_present(fv, command: str, *names) -> None:
  """Like `_forbid`, for flags with defaults: refuses any of `names` given on the command line."""
  for name in names:
    if fv[name].present:
      raise UsageError(f'--{name} does not apply to `{command}`.')


def _check_privacy_flags(fv, *, need_target: bool) -> None:
  if not 0 < fv.delta < 1:
    raise UsageError(f'--delta must lie in (0, 1), got {fv.delta!r}.')
  for name in ('noise_multiplier', 'target_epsilon'):
    if getattr(fv, name) is not None and getattr(fv, name) <= 0:
      raise UsageError(f'--{name} must be positive, got {getattr(fv, name)!r}.')
  if need_target:
    _require(fv, 'target_epsilon')
  elif (fv.noise_multiplier is None) == (fv.target_epsilon is None):
    raise UsageError('exactly one of --noise_multiplier, --target_epsilon is required.')


def _group_sampling_prob(fv, num_groups: int) -> float:
  """q from --sampling_prob, or B / floor(M / H) from --dataset_size and --batch_size."""
  if fv.sampling_prob is not None:
    _forbid(fv, 'amplified --sampling_prob', 'dataset_size', 'batch_size')
    if not 0 < fv.sampling_prob <= 1:
      raise UsageError(f'--sampling_prob must lie in (0, 1], got {fv.sampling_prob!r}.')
    return fv.sampling_prob
  if fv.dataset_size is None or fv.batch_size is None:
    raise UsageError('--sampling_prob (or --dataset_size with --batch_size) is required.')
  try:
    return amplification.group_sampling_prob(fv.dataset_size, fv.batch_size, num_groups)
  except ValueError as e:
    raise UsageError(f'--num_bands/--dataset_size/--batch_size: {e}') from None


def _amplified_strategy(fv):
  """The strategy of --mechanism_file / --mechanism, or None (largest column norm 1)."""
  if fv.mechanism_file is not None:
    strategy = _load_strategy_file(fv.mechanism_file)
    if fv.mechanism is not None and fv.mechanism != strategy.name:
      raise UsageError(f'--mechanism={fv.mechanism} but --mechanism_file holds a '
                       f'{strategy.name} strategy.')
  elif fv.mechanism is not None:
    if registry.get(fv.mechanism).needs_parameters:
      raise UsageError(f'--mechanism_file is required for --mechanism={fv.mechanism}.')
    strategy = registry.default_strategy(fv.mechanism)
  else:
    return None
  if strategy.max_rounds is not None and fv.rounds > strategy.max_rounds:
    raise UsageError(f'--rounds={fv.rounds} exceeds the {strategy.max_rounds} rounds of the '
                     f'{strategy.name} strategy.')
  memory.check_fits(strategy.name, fv.rounds, losses=False)
  return strategy


def _run_amplified(fv) -> dict:
  _require(fv, 'rounds', 'num_bands')
  _forbid(fv, 'amplified', 'min_sep', 'max_participations', 'fixed_epoch', 'num_buffers', 'error',
          'output', *(option for option in _PARAMETER_OPTIONS if option != 'num_bands'))
  _check_privacy_flags(fv, need_target=False)
  q = _group_sampling_prob(fv, fv.num_bands)
  strategy = _amplified_strategy(fv)
  kappa = 1.0
  if strategy is not None:
    try:
      amplification.check_banded(strategy, fv.rounds, fv.num_bands)
    except ValueError as e:
      raise UsageError(f'--num_bands/--mechanism_file: {e}') from None
    kappa = amplification.largest_column_norm(strategy, fv.rounds)
  record = {'mechanism': None if strategy is None else strategy.name, 'rounds': fv.rounds,
            'num_bands': fv.num_bands, 'sampling_prob': q,
            'compositions': amplification.num_compositions(fv.rounds, fv.num_bands),
            'largest_column_norm': kappa}
  if fv.target_epsilon is not None:
    sigma = kappa * amplification.amplified_noise_multiplier(
        fv.target_epsilon, fv.rounds, fv.num_bands, q, fv.delta, fv.accountant)
    record['target_epsilon'] = fv.target_epsilon
  else:
    sigma = fv.noise_multiplier
  record.update(noise_multiplier=sigma, effective_noise_multiplier=sigma / kappa,
                epsilon=amplification.amplified_epsilon(sigma / kappa, fv.rounds, fv.num_bands, q,
                                                        fv.delta, fv.accountant),
                delta=fv.delta, accountant=fv.accountant)
  if fv.mechanism_file is not None:
    record['mechanism_file'] = fv.mechanism_file
  return record


def _run_select_bands(fv) -> dict:
  _require(fv, 'rounds', 'dataset_size', 'batch_size')
  _forbid(fv, 'select_bands', 'sampling_prob', 'noise_multiplier', 'num_bands', 'min_sep',
          'max_participations', 'fixed_epoch', 'num_buffers', 'mechanism', 'mechanism_file',
          *_PARAMETER_OPTIONS)
  _check_privacy_flags(fv, need_target=True)
  if fv.batch_size > fv.dataset_size:
    raise UsageError(f'--batch_size={fv.batch_size} exceeds --dataset_size={fv.dataset_size}.')
  if fv.output:
    if not fv.output.lower().endswith('.npz'):
      raise UsageError('--output for select_bands must end with .npz (a banded strategy).')
    _check_output(fv.output)
  memory.check_fits('banded', fv.rounds)
  selection = band_selection.select_bands(
      fv.target_epsilon, fv.delta, fv.rounds, fv.dataset_size, fv.batch_size,
      error=fv.error or 'rms', accountant=fv.accountant)
  if fv.output:
    files.save_strategy(selection.strategy, fv.output)
  best = selection.best
  record = {'rounds': fv.rounds, 'dataset_size': fv.dataset_size, 'batch_size': fv.batch_size,
            'target_epsilon': fv.target_epsilon, 'delta': fv.delta, 'accountant': fv.accountant,
            'error': selection.error, **best.to_dict(),
            'candidates': [c.to_dict() for c in selection.candidates]}
  if fv.output:
    record['output'] = fv.output
  return record


def _format_selection(record: dict) -> str:
  """`select_bands` as text: the choice, then one line per evaluated candidate."""
  head = commands.format_table({k: v for k, v in record.items() if k != 'candidates'})
  rows = ['num_bands  sampling_prob  compositions  noise_multiplier  loss      rmse']
  rows += [f'{c["num_bands"]:>9}  {c["sampling_prob"]:>13.6g}  {c["compositions"]:>12}  '
           f'{c["noise_multiplier"]:>16.6g}  {c["loss"]:<8.6g}  {c["rmse"]:.6g}'
           for c in record['candidates']]
  return head + '\ncandidates (rmse = noise_multiplier * loss):\n' + '\n'.join(rows)


_RUNNERS = {'amplified': _run_amplified, 'select_bands': _run_select_bands}


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
    command = positional[0]
    if command in _RUNNERS:
      record = _RUNNERS[command](_FLAGS)
    else:
      _forbid_present(_FLAGS, command, *_AMPLIFICATION_FLAGS)
      record = _run_optimize(_FLAGS) if command == 'optimize' else _run_evaluate(_FLAGS)
  except Exception as e:  # every error is one line; --debug adds the traceback
    return _report_error(e, argv)
  if _FLAGS.json:
    print(json.dumps(record))
  elif positional[0] == 'select_bands':
    print(_format_selection(record))
  else:
    print(commands.format_table(record))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
