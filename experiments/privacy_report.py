r"""Privacy report of a planned or finished DP-FTRL training run.

Computes rho-zCDP and (epsilon, delta) (PLD, dp_accounting) from the mechanism, the noise multiplier
(or a calibration target) and the participation (declared with --min_sep / --max_participations, or
observed in a --participation_log), and writes report.json, report.md (the BLT paper's App. C
checklist) and two PNG plots into --output_dir. See docs/privacy_report.md.

Example (the BLT paper's default BLT, production-like setting):
  python -m experiments.privacy_report --mechanism=blt --noise_multiplier=7.379 --rounds=2000 \
      --min_sep=400 --max_participations=5 --output_dir=/tmp/report

Conventions: rounds are 0-based; --min_sep = b means r2 - r1 >= b for two participations of one client
(TF-Privacy's and the Gboard tables' min_separation = b - 1; the report prints both).
Bad input exits with status 1 (2 for unparsable flags) and a one-line error naming the flag.
"""

import sys

from absl import app, flags

from dp_ftrl_tff.accounting import participation_log, report, report_render, zcdp
from dp_ftrl_tff.mechanisms import base, blt, files, gaussian, participation, tree

MECHANISMS = ('gaussian', 'tree', 'tree_efficient', 'banded', 'blt')

_MECHANISM = flags.DEFINE_string(
    'mechanism', None, f'One of {", ".join(MECHANISMS)}; may be omitted with --mechanism_file.')
_MECHANISM_FILE = flags.DEFINE_string(
    'mechanism_file', None, 'A strategy saved by dp_ftrl_tff.mechanisms.files (JSON or .npz).')
_BLT_THETA = flags.DEFINE_list('blt_theta', None, 'BLT buffer decays theta (comma-separated).')
_BLT_OMEGA = flags.DEFINE_list('blt_omega', None, 'BLT output scales omega (comma-separated).')
_TREE_COMPLETION = flags.DEFINE_bool('tree_completion', False, 'Trees: completion trick.')
_NOISE_MULTIPLIER = flags.DEFINE_float(
    'noise_multiplier', None, 'sigma, relative to the clip norm (noise std on the sum / clip).')
_TARGET_EPSILON = flags.DEFINE_float('target_epsilon', None,
                                     'Calibrate sigma to this epsilon at --delta.')
_TARGET_RHO = flags.DEFINE_float('target_rho', None, 'Calibrate sigma to this rho-zCDP.')
_ROUNDS = flags.DEFINE_integer('rounds', None, 'n, the number of training rounds.')
_MIN_SEP = flags.DEFINE_integer('min_sep', None,
                                'b: r2 - r1 >= b between participations (min_separation + 1).')
_MAX_PARTICIPATIONS = flags.DEFINE_integer('max_participations', None,
                                           'k (default: as many as --min_sep allows).')
_FIXED_EPOCH = flags.DEFINE_bool('fixed_epoch', False,
                                 'Declared schema is fixed-epoch (k epochs of --min_sep rounds).')
_RESTART_ROUNDS = flags.DEFINE_list('restart_rounds', [],
                                    '0-based rounds at which the noise restarts.')
_CLIPPED_COUNT_STDDEV = flags.DEFINE_float(
    'clipped_count_stddev', None, 'Adaptive clipping: noise std on the clipped-count sum.')
_PARTICIPATION_LOG = flags.DEFINE_string('participation_log', None,
                                         'CSV `client_id,round` written by the client sampler.')
_OBSERVED_PATTERNS = flags.DEFINE_bool(
    'observed_patterns', True, 'Trees with a log: also account the observed clients\' patterns.')
_DELTA = flags.DEFINE_float('delta', zcdp.DEFAULT_DELTA, 'Target delta.')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where report.json, report.md, plots go.')
_PLOTS = flags.DEFINE_bool('plots', True, 'Write the PNG plots into --output_dir.')
_JSON = flags.DEFINE_bool('json', False, 'Print the JSON report instead of the summary.')


class FlagError(ValueError):
  """Bad flag value; the message starts with the flag name."""


def _floats(values, flag: str) -> tuple:
  try:
    return tuple(float(v) for v in values)
  except ValueError:
    raise FlagError(f'--{flag} must be comma-separated numbers, got {",".join(values)!r}.') from None


def _strategy() -> base.Strategy:
  """The strategy from --mechanism / --mechanism_file / --blt_theta, --blt_omega."""
  name = _MECHANISM.value
  if name is not None and name not in MECHANISMS:
    raise FlagError(f'--mechanism must be one of {", ".join(MECHANISMS)}, got {name!r}.')
  if (_BLT_THETA.value or _BLT_OMEGA.value) and name != 'blt':
    raise FlagError('--blt_theta/--blt_omega need --mechanism=blt.')
  if _MECHANISM_FILE.value:
    if _BLT_THETA.value or _BLT_OMEGA.value:
      raise FlagError('--mechanism_file excludes --blt_theta/--blt_omega.')
    try:
      strategy = files.load_strategy(_MECHANISM_FILE.value)
    except (ValueError, OSError) as e:
      raise FlagError(f'--mechanism_file: {e}') from None
    if name is not None and strategy.name != name:
      raise FlagError(f'--mechanism={name} but --mechanism_file holds a {strategy.name!r} strategy.')
    return strategy
  if name is None:
    raise FlagError('--mechanism (or --mechanism_file) is required.')
  if name == 'gaussian':
    return gaussian.GaussianStrategy()
  if name in ('tree', 'tree_efficient'):
    return tree.TreeStrategy('vanilla' if name == 'tree' else 'efficient',
                             completion=_TREE_COMPLETION.value)
  if name == 'banded':
    raise FlagError('--mechanism=banded needs --mechanism_file (a saved banded strategy).')
  if bool(_BLT_THETA.value) != bool(_BLT_OMEGA.value):
    raise FlagError('--blt_theta and --blt_omega must be given together.')
  if not _BLT_THETA.value:
    return blt.PRODUCTION_STRATEGIES[400]  # the BLT paper's suggested default (App. A, b = 400)
  try:
    return blt.BLTStrategy(theta=_floats(_BLT_THETA.value, 'blt_theta'),
                           omega=_floats(_BLT_OMEGA.value, 'blt_omega'))
  except FlagError:
    raise
  except ValueError as e:
    raise FlagError(f'--blt_theta/--blt_omega: {e}') from None


def _check_positive(value, flag: str, integer: bool = False):
  if value is not None and value <= 0:
    kind = 'a positive integer' if integer else 'positive'
    raise FlagError(f'--{flag} must be {kind}, got {value!r}.')
  return value


def _schema():
  min_sep = _check_positive(_MIN_SEP.value, 'min_sep', True)
  k = _check_positive(_MAX_PARTICIPATIONS.value, 'max_participations', True)
  if min_sep is None:
    if k is not None or _FIXED_EPOCH.value:
      raise FlagError('--max_participations/--fixed_epoch need --min_sep.')
    return None
  if _FIXED_EPOCH.value:
    if k is None:
      raise FlagError('--fixed_epoch needs --max_participations (the number of epochs).')
    return participation.ParticipationSchema.fixed_epoch_order(k, min_sep)
  return participation.ParticipationSchema(min_sep=min_sep, max_participations=k)


def build_from_flags() -> tuple:
  """(report, strategy) from the flags; raises FlagError (or ValueError) on bad input."""
  strategy = _strategy()
  targets = [f for f, v in (('noise_multiplier', _NOISE_MULTIPLIER.value),
                            ('target_epsilon', _TARGET_EPSILON.value),
                            ('target_rho', _TARGET_RHO.value)) if v is not None]
  if len(targets) != 1:
    raise FlagError('exactly one of --noise_multiplier, --target_epsilon, --target_rho is required'
                    f'{"" if not targets else ", got --" + " and --".join(targets)}.')
  for flag, value in (('noise_multiplier', _NOISE_MULTIPLIER.value),
                      ('target_epsilon', _TARGET_EPSILON.value), ('target_rho', _TARGET_RHO.value),
                      ('clipped_count_stddev', _CLIPPED_COUNT_STDDEV.value)):
    _check_positive(value, flag)
  if not 0 < _DELTA.value < 1:
    raise FlagError(f'--delta must lie in (0, 1), got {_DELTA.value!r}.')
  rounds = _check_positive(_ROUNDS.value, 'rounds', True)
  schema = _schema()
  log = None
  if _PARTICIPATION_LOG.value:
    try:
      log = participation_log.read_participation_log(_PARTICIPATION_LOG.value)
    except ValueError as e:
      raise FlagError(f'--participation_log: {e}') from None
    if not log.num_rows:
      raise FlagError(f'--participation_log: {_PARTICIPATION_LOG.value} has no rows.')
  else:
    if rounds is None:
      raise FlagError('--rounds is required (or --participation_log).')
    if schema is None:
      raise FlagError('--min_sep is required (or --participation_log).')
  n = rounds if rounds is not None else log.num_rounds
  if strategy.max_rounds is not None and max(n, log.num_rounds if log else 0) > strategy.max_rounds:
    raise FlagError(f'--rounds: the {strategy.name} strategy covers at most {strategy.max_rounds} '
                    f'rounds, the run has {max(n, log.num_rounds if log else 0)}.')
  try:
    restarts = [int(r) for r in _RESTART_ROUNDS.value]
  except ValueError:
    raise FlagError(f'--restart_rounds must be integers, got {_RESTART_ROUNDS.value!r}.') from None
  try:
    zcdp.check_restart_rounds(restarts, max(n, log.num_rounds if log else 0))
  except ValueError as e:
    raise FlagError(f'--restart_rounds: {e}') from None
  if _CLIPPED_COUNT_STDDEV.value is not None and _NOISE_MULTIPLIER.value is not None and (
      _NOISE_MULTIPLIER.value >= 2 * _CLIPPED_COUNT_STDDEV.value):
    raise FlagError('--noise_multiplier must be smaller than 2 * --clipped_count_stddev.')
  result = report.build_report(
      strategy, rounds, schema, noise_multiplier=_NOISE_MULTIPLIER.value,
      target_epsilon=_TARGET_EPSILON.value, target_rho=_TARGET_RHO.value, delta=_DELTA.value,
      restart_rounds=restarts, log=log, clipped_count_stddev=_CLIPPED_COUNT_STDDEV.value,
      observed_patterns=_OBSERVED_PATTERNS.value)
  return result, strategy


def _parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'privacy_report: error: {e}', file=sys.stderr)
    sys.exit(2)


def main(argv):
  if len(argv) > 1:
    print(f'privacy_report: error: unexpected arguments {argv[1:]}', file=sys.stderr)
    return 1
  try:
    result, strategy = build_from_flags()
    if _OUTPUT_DIR.value:
      report_render.write_report(result, strategy, _OUTPUT_DIR.value, plots=_PLOTS.value)
  except ValueError as e:
    print(f'privacy_report: error: {" ".join(str(e).split())}', file=sys.stderr)
    return 1
  print(report_render.to_json(result) if _JSON.value else report_render.summary(result))
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=_parse_flags)
