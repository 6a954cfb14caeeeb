"""Command line for strategies: `python -m dp_ftrl_tff.mechanisms optimize|evaluate [flags]`.

  optimize --mechanism=blt --rounds=N --min_sep=B [--max_participations=K] [--buffers=D]
           [--error=max|rms] [--output=FILE.json] [--json]
  optimize --mechanism=banded --rounds=N --bands=H --min_sep=B [--max_participations=K]
           [--error=rms|max] [--output=FILE.npz] [--json]
  evaluate --mechanism=gaussian|tree|tree_efficient|tree_full|banded|blt --rounds=N --min_sep=B
           [--max_participations=K] [--theta=a,b --omega=c,d | --mechanism_file=F] [--json]

Conventions: rounds are 0-based; `--min_sep` = b is the BLT/BandMF min-sep (TF-Privacy's
min_separation + 1); `--max_participations` = k defaults to ceil(n / b), and the printed value is the
effective k = min(k, ceil(n / b)). `--min_sep=1 --max_participations=1` is single participation;
`--fixed_epoch` selects (k, b) fixed-epoch participation. Losses use clip norm 1 and noise multiplier 1
(BLT paper Eq. 9-10). Without `--buffers` the BLT optimizer tries 1 .. 8 buffers and keeps the
smallest count within 0.05% of the best loss.

This is a binary entry point, so it reads absl flags (from its own `FlagValues`, not the global one);
the work is done by `optimize` and `evaluate`, which take plain arguments. Bad input exits with status
2 and one line `error: ...` naming the flag.
"""

import json
import sys
from typing import Optional, Sequence

from absl import flags

from dp_ftrl_tff.mechanisms import base, files, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib

COMMANDS = ('optimize', 'evaluate')
OPTIMIZABLE = ('blt', 'banded')

_FLAGS = flags.FlagValues()
flags.DEFINE_enum('mechanism', None, list(registry.names()), 'Mechanism name.', flag_values=_FLAGS)
flags.DEFINE_integer('rounds', None, 'Number of rounds n.', lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_integer('min_sep', None, 'Min-sep b (TF-Privacy min_separation + 1).', lower_bound=1,
                     flag_values=_FLAGS)
flags.DEFINE_integer('max_participations', None, 'Max participations k (default ceil(n / b)).',
                     lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_bool('fixed_epoch', False, '(k, b) fixed-epoch participation (needs k).',
                  flag_values=_FLAGS)
flags.DEFINE_integer('buffers', None, 'BLT buffers d (default: try 1..8).', lower_bound=1,
                     flag_values=_FLAGS)
flags.DEFINE_integer('bands', None, 'BandMF bands.', lower_bound=1, flag_values=_FLAGS)
flags.DEFINE_enum('error', None, ['max', 'rms'],
                  'Loss to optimize (default: max for blt, rms for banded).', flag_values=_FLAGS)
flags.DEFINE_string('output', None, 'Save the optimized strategy here (.json blt, .npz banded).',
                    flag_values=_FLAGS)
flags.DEFINE_list('theta', None, 'BLT buffer decays, comma separated.', flag_values=_FLAGS)
flags.DEFINE_list('omega', None, 'BLT output scales, comma separated.', flag_values=_FLAGS)
flags.DEFINE_string('mechanism_file', None, 'Strategy file written by `optimize --output`.',
                    flag_values=_FLAGS)
flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.', flag_values=_FLAGS)


class UsageError(ValueError):
  """Bad command-line input; the message names the flag."""


def _losses_dict(losses: base.Losses) -> dict:
  return {'max_loss': losses.max_loss, 'rms_loss': losses.rms_loss,
          'sensitivity_squared': losses.sensitivity_squared}


def _setting_dict(mechanism: str, num_rounds: int,
                  participation: participation_lib.ParticipationSchema) -> dict:
  return {'mechanism': mechanism, 'rounds': num_rounds, 'min_sep': participation.min_sep,
          'max_participations': participation.effective_max_participations(num_rounds)}


def optimize(mechanism: str, num_rounds: int,
             participation: participation_lib.ParticipationSchema, *,
             num_buffers: Optional[int] = None, num_bands: Optional[int] = None,
             error: Optional[str] = None, output: Optional[str] = None) -> dict:
  """Optimizes a 'blt' or 'banded' strategy; returns the printed record (and saves to `output`).

  Keys: blt -> mechanism, rounds, min_sep, max_participations, buffers, theta, omega, max_loss,
  rms_loss, sensitivity_squared, seconds; banded -> mechanism, rounds, bands, min_sep,
  max_participations, max_loss, rms_loss, sensitivity_squared, seconds.
  """
  if mechanism == 'blt':
    from dp_ftrl_tff.mechanisms import blt  # pylint: disable=g-import-not-at-top
    result = blt.optimize_blt(num_rounds, participation, num_buffers=num_buffers,
                              error=error or 'max')
    record = _setting_dict(mechanism, num_rounds, participation)
    record.update(buffers=result.strategy.num_buffers, theta=list(result.strategy.theta),
                  omega=list(result.strategy.omega))
  elif mechanism == 'banded':
    from dp_ftrl_tff.mechanisms import banded  # pylint: disable=g-import-not-at-top
    result = banded.optimize_banded(num_rounds, num_bands, participation, error=error or 'rms')
    record = {'mechanism': mechanism, 'rounds': num_rounds, 'bands': num_bands}
    record.update(_setting_dict(mechanism, num_rounds, participation))
  else:
    raise ValueError(f'`mechanism` must be one of {list(OPTIMIZABLE)}, got {mechanism!r}.')
  record.update(_losses_dict(result.losses), seconds=result.seconds)
  if output:
    files.save_strategy(result.strategy, output, setting=result)
  return record


def evaluate(strategy: base.Strategy, num_rounds: int,
             participation: participation_lib.ParticipationSchema) -> dict:
  """Losses of `strategy`: mechanism, rounds, min_sep, max_participations, max_loss, rms_loss,
  sensitivity_squared."""
  record = _setting_dict(strategy.name, num_rounds, participation)
  record.update(_losses_dict(strategy.losses(num_rounds, participation)))
  return record


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
  _forbid(fv, 'optimize', 'theta', 'omega', 'mechanism_file')
  if fv.mechanism not in OPTIMIZABLE:
    raise UsageError(f'--mechanism must be one of {list(OPTIMIZABLE)} for optimize, got '
                     f'{fv.mechanism!r}.')
  if fv.mechanism == 'blt':
    _forbid(fv, 'optimize --mechanism=blt', 'bands')
    if fv.output and fv.output.lower().endswith('.npz'):
      raise UsageError('--output for blt must be a JSON path (not .npz).')
  else:
    _forbid(fv, 'optimize --mechanism=banded', 'buffers')
    _require(fv, 'bands')
    if fv.bands > fv.rounds:
      raise UsageError(f'--bands={fv.bands} must not exceed --rounds={fv.rounds}.')
    if fv.output and not fv.output.lower().endswith('.npz'):
      raise UsageError('--output for banded must end with .npz.')
  return optimize(fv.mechanism, fv.rounds, _participation(fv), num_buffers=fv.buffers,
                  num_bands=fv.bands, error=fv.error, output=fv.output)


def _strategy_for_evaluate(fv) -> base.Strategy:
  if fv.mechanism_file is not None:
    if fv.theta is not None or fv.omega is not None:
      raise UsageError('--theta/--omega and --mechanism_file are exclusive.')
    try:
      strategy = files.load_strategy(fv.mechanism_file)
    except ValueError as e:
      raise UsageError(f'--mechanism_file: {e}') from None
    if fv.mechanism is not None and fv.mechanism != strategy.name:
      raise UsageError(f'--mechanism={fv.mechanism} but --mechanism_file holds a '
                       f'{strategy.name} strategy.')
    return strategy
  _require(fv, 'mechanism')
  if fv.mechanism == 'blt':
    _require(fv, 'theta', 'omega')
    theta, omega = _floats(fv.theta, 'theta'), _floats(fv.omega, 'omega')
    if len(theta) != len(omega):
      raise UsageError(f'--theta has {len(theta)} values but --omega has {len(omega)}.')
    try:
      return registry.strategy_from_config({'mechanism': 'blt', 'theta': theta, 'omega': omega})
    except ValueError as e:
      raise UsageError(f'--theta/--omega: {e}') from None
  _forbid(fv, f'evaluate --mechanism={fv.mechanism}', 'theta', 'omega')
  if fv.mechanism == 'banded':
    raise UsageError('--mechanism_file is required for --mechanism=banded.')
  return registry.strategy_from_config({'mechanism': fv.mechanism})


def _run_evaluate(fv) -> dict:
  _require(fv, 'rounds', 'min_sep')
  _forbid(fv, 'evaluate', 'buffers', 'bands', 'error', 'output')
  strategy = _strategy_for_evaluate(fv)
  if strategy.max_rounds is not None and fv.rounds > strategy.max_rounds:
    raise UsageError(f'--rounds={fv.rounds} exceeds the {strategy.max_rounds} rounds of the '
                     f'{strategy.name} strategy.')
  record = evaluate(strategy, fv.rounds, _participation(fv))
  if fv.mechanism_file is not None:
    record['mechanism_file'] = fv.mechanism_file
  elif strategy.name == 'blt':
    record.update(theta=list(strategy.theta), omega=list(strategy.omega))
  return record


def format_table(record: dict) -> str:
  """A two-column, human-readable rendering of a record."""
  width = max(len(key) for key in record)
  lines = []
  for key, value in record.items():
    if isinstance(value, float):
      text = f'{value:.6g}'
    elif isinstance(value, list):
      text = ', '.join(repr(v) for v in value)
    else:
      text = str(value)
    lines.append(f'{key:<{width}}  {text}')
  return '\n'.join(lines)


def _usage() -> str:
  return __doc__ + '\nFlags:\n' + _FLAGS.get_help()


def main(argv: Sequence[str]) -> int:
  """Runs the CLI on `argv` (argv[0] is the program name); returns the exit status."""
  argv = list(argv)
  if any(arg in ('-h', '--help', '-help', '--helpfull') for arg in argv[1:]):
    print(_usage())
    return 0
  try:
    _FLAGS.unparse_flags()
    positional = _FLAGS(argv)[1:]
    if len(positional) != 1 or positional[0] not in COMMANDS:
      raise UsageError(f'expected one command out of {list(COMMANDS)}, got {positional}.')
    record = _run_optimize(_FLAGS) if positional[0] == 'optimize' else _run_evaluate(_FLAGS)
  except (flags.Error, ValueError) as e:
    message = ' '.join(str(e).split())
    print(f'error: {message}', file=sys.stderr)
    return 2
  print(json.dumps(record) if _FLAGS.json else format_table(record))
  return 0
