r"""Privacy report of a planned or finished DP-FTRL training run.

Computes rho-zCDP and (epsilon, delta) (PLD, dp_accounting) from the mechanism, the noise multiplier
(or a calibration target) and the participation (declared with --min_sep / --max_participations, or
observed in a --participation_log), and writes report.json, report.md (the BLT paper's App. C
checklist) and two PNG plots into --output_dir. See docs/privacy_report.md.

Example (the BLT paper's default BLT, production-like setting):
  python -m experiments.privacy_report --mechanism=blt --noise_multiplier=7.379 --rounds=2000 \
      --min_sep=400 --max_participations=5 --output_dir=/tmp/report
A finished training run: `--plan=RUN/plan.json --participation_log=RUN/participation.csv` (the plan
gives the mechanism, the noise multiplier and its split, and the restarts).

Conventions: rounds are 0-based; --min_sep = b means r2 - r1 >= b for two participations of one client
(TF-Privacy's and the Gboard tables' min_separation = b - 1; the report prints both).
Exit status: 2 on a user mistake (bad or conflicting flags, a missing input file, a number of rounds
whose arrays cannot fit in memory, a --mechanism_file optimized for another setting without
--allow_strategy_setting_mismatch), 1 on a runtime failure (an unwritable --output_dir, a corrupt
--plan / --mechanism_file / --participation_log, I/O errors) and with --strict when the log violates
the declared schema (after writing the report): one line `privacy_report: error: ...` on stderr
naming the flag; `--debug` prints the traceback before it.
"""

import dataclasses
import os
import sys
import traceback

from absl import app, flags

from dp_ftrl_tff import _deprecated_flags
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import amplification, participation_log, report, report_render, zcdp
from dp_ftrl_tff.mechanisms import base, blt, files, memory, participation, registry
from experiments import flag_parsing

MECHANISMS = registry.names()

FLAGS = flags.FlagValues()
_d = dict(flag_values=FLAGS)
flags.DEFINE_string('plan', None, 'A run plan (`plan.json` of a training run): the mechanism, noise '
                    'multiplier, clipped-count noise and restarts; excludes the flags it sets.', **_d)
flags.DEFINE_string('mechanism', None,
                    f'One of {", ".join(MECHANISMS)}; may be omitted with --mechanism_file.', **_d)
flags.DEFINE_string('mechanism_file', None,
                    'A strategy saved by dp_ftrl_tff.mechanisms.files (JSON or .npz).', **_d)
flags.DEFINE_list('theta', None, 'BLT buffer decays theta (comma-separated).', **_d)
flags.DEFINE_list('omega', None, 'BLT output scales omega (comma-separated).', **_d)
flags.DEFINE_integer('num_bands', None, 'BSR / BISR bands b-hat (required for them).',
                     lower_bound=1, **_d)
flags.DEFINE_bool('tree_completion', False, 'Trees: completion trick.', **_d)
flags.DEFINE_float('noise_multiplier', None,
                   'sigma, relative to the clip norm (noise std on the sum / clip).', **_d)
flags.DEFINE_float('target_epsilon', None, 'Calibrate sigma to this epsilon at --target_delta.',
                   **_d)
flags.DEFINE_float('target_rho', None, 'Calibrate sigma to this rho-zCDP.', **_d)
flags.DEFINE_integer('rounds', None, 'n, the number of training rounds.', **_d)
flags.DEFINE_integer('min_sep', None,
                     'b: r2 - r1 >= b between participations (min_separation + 1).', **_d)
flags.DEFINE_integer('max_participations', None, 'k (default: as many as --min_sep allows).', **_d)
flags.DEFINE_bool('fixed_epoch', False,
                  'Declared schema is fixed-epoch (k epochs of --min_sep rounds).', **_d)
flags.DEFINE_list('restart_rounds', [], '0-based rounds at which the noise restarts.', **_d)
flags.DEFINE_float('clipped_count_stddev', None,
                   'Adaptive clipping: noise std on the clipped-count sum.', **_d)
flags.DEFINE_float('sampling_prob', None,
                   'Random sampling: probability that a member of the round\'s group participates '
                   '(adds the amplified guarantee, BandMF Thm. 4).', **_d)
flags.DEFINE_integer('sampling_groups', None,
                     'Cyclic Poisson sampling: b-hat groups, round t samples group t mod b-hat '
                     '(default 1: Poisson); the strategy needs at most b-hat bands.', **_d)
flags.DEFINE_string('participation_log', None,
                    'CSV `client_id,round` written by the client sampler.', **_d)
flags.DEFINE_bool('observed_patterns', True,
                  'Trees with a log: also account the observed clients\' patterns.', **_d)
flags.DEFINE_float('target_delta', zcdp.DEFAULT_DELTA, 'delta of the reported (epsilon, delta).',
                   **_d)
flags.DEFINE_string('output_dir', None, 'Where report.json, report.md, plots go.', **_d)
flags.DEFINE_bool('plots', True, 'Write the PNG plots into --output_dir.', **_d)
flags.DEFINE_bool('equal_privacy', True,
                  'With --output_dir, also compare every mechanism at this run\'s privacy (noise '
                  'multiplier, MaxLoss, RmsLoss; a few seconds at 2000 rounds).', **_d)
flags.DEFINE_bool('strict', False,
                  'Exit 1 when the --participation_log violates the declared schema (the report '
                  'is still written, with the guarantee of the observed participation).', **_d)
flags.DEFINE_bool('allow_strategy_setting_mismatch', False,
                  'Report a --mechanism_file optimized for other rounds / min_sep / '
                  'max_participations (with a warning) instead of refusing it.', **_d)
flags.DEFINE_bool('json', False, 'Print the JSON report instead of the summary.', **_d)
flags.DEFINE_bool('debug', False, 'On an error, print the traceback before the one-line message.',
                  **_d)
#: Deprecated flag names (one release, see CHANGELOG.md) -> today's names.
DEPRECATED_FLAGS = {'delta': 'target_delta', 'blt_theta': 'theta', 'blt_omega': 'omega'}
for _old, _new in DEPRECATED_FLAGS.items():
  _deprecated_flags.define_alias(_old, _new, FLAGS)
# What --plan sets.
_PLAN_FLAGS = ('mechanism', 'mechanism_file', 'theta', 'omega', 'num_bands', 'tree_completion',
               'noise_multiplier', 'target_epsilon', 'target_rho', 'restart_rounds',
               'clipped_count_stddev', 'sampling_prob', 'sampling_groups')


class FlagError(ValueError):
  """Bad flag value; the message starts with the flag name (exit status 2)."""


class InputFileError(Exception):
  """An input file that exists but cannot be read or parsed (exit status 1)."""


def _input_file_error(flag: str, path: str, error: Exception) -> Exception:
  """A missing `path` is a usage error; an existing one that fails to load is a runtime failure."""
  if not os.path.isfile(path):
    return FlagError(f'--{flag}: no file at {path!r}.')
  return InputFileError(f'--{flag}: {error} Fix or regenerate {path}.')


def _floats(values, flag: str) -> tuple:
  try:
    return tuple(float(v) for v in values)
  except ValueError:
    raise FlagError(f'--{flag} must be comma-separated numbers, got {",".join(values)!r}.') from None


def _strategy(fv) -> base.Strategy:
  """The strategy from --mechanism / --mechanism_file / the registry's parameter flags."""
  name = fv.mechanism
  if name is not None and name not in MECHANISMS:
    raise FlagError(f'--mechanism must be one of {", ".join(MECHANISMS)}, got {name!r}.')
  parameter_flags = sorted({option for m in MECHANISMS for option in registry.get(m).parameter_options})
  given = [option for option in parameter_flags if fv[option].value]
  if fv.mechanism_file:
    if given:
      raise FlagError(f'--mechanism_file excludes --{given[0]}.')
    try:
      strategy = files.load_strategy(fv.mechanism_file)
    except (ValueError, OSError) as e:
      raise _input_file_error('mechanism_file', fv.mechanism_file, e) from None
    if name is not None and strategy.name != name:
      raise FlagError(f'--mechanism={name} but --mechanism_file holds a {strategy.name!r} strategy.')
    return strategy
  if name is None:
    raise FlagError('--mechanism (or --mechanism_file) is required.')
  entry = registry.get(name)
  foreign = [option for option in given if option not in entry.parameter_options]
  if foreign:
    raise FlagError(f'--{foreign[0]} does not apply to --mechanism={name}.')
  if not entry.needs_parameters:
    config = dict(entry.default_config)
    if fv.tree_completion:
      config['completion'] = True  # from_config refuses it for strategies without completion
    try:
      return registry.strategy_from_config(config)
    except ValueError as e:
      raise FlagError(f'--tree_completion: {e}') from None
  if not entry.parameter_options:
    raise FlagError(f'--mechanism={name} needs --mechanism_file (a saved {name} strategy).')
  if given and len(given) != len(entry.parameter_options):
    raise FlagError(f'--{" and --".join(entry.parameter_options)} must be given together.')
  if not given:
    if name != blt.BLTStrategy.name:
      raise FlagError(f'--mechanism={name} needs --{" and --".join(entry.parameter_options)}.')
    return blt.PRODUCTION_STRATEGIES[400]  # the BLT paper's suggested default (App. A, b = 400)
  values = {option: (_floats(fv[option].value, option) if isinstance(fv[option].value, list)
                     else fv[option].value) for option in entry.parameter_options}
  try:
    return registry.strategy_from_config({'mechanism': name, **values})
  except ValueError as e:
    raise FlagError(f'--{"/--".join(entry.parameter_options)}: {e}') from None


def _check_positive(value, flag: str, integer: bool = False):
  if value is not None and value <= 0:
    kind = 'a positive integer' if integer else 'positive'
    raise FlagError(f'--{flag} must be {kind}, got {value!r}.')
  return value


def _schema(fv):
  min_sep = _check_positive(fv.min_sep, 'min_sep', True)
  k = _check_positive(fv.max_participations, 'max_participations', True)
  if min_sep is None:
    if k is not None or fv.fixed_epoch:
      raise FlagError('--max_participations/--fixed_epoch need --min_sep.')
    return None
  if fv.fixed_epoch:
    if k is None:
      raise FlagError('--fixed_epoch needs --max_participations (the number of epochs).')
    return participation.ParticipationSchema.fixed_epoch_order(k, min_sep)
  return participation.ParticipationSchema(min_sep=min_sep, max_participations=k)


def _from_plan(fv, num_rounds: int) -> dict:
  """`build_report` arguments from --plan: strategy, noise multiplier, restarts, count noise."""
  clashing = [name for name in _PLAN_FLAGS if fv[name].present]
  if clashing:
    raise FlagError(f'--plan sets the mechanism and its noise; it excludes --{clashing[0]}.')
  try:
    plan = plan_lib.load_plan(fv.plan)
  except (ValueError, OSError) as e:
    raise _input_file_error('plan', fv.plan, e) from None
  sampling = getattr(plan, 'sampling', None)  # random cohorts: the amplified guarantee too
  skipped = None
  if sampling is not None:
    try:
      amplification.check_banded(plan.strategy, num_rounds, sampling.num_groups,
                                 plan.restart_rounds(num_rounds))
    except ValueError as e:  # the run is valid; only the amplified figure does not apply
      skipped, sampling = f'no amplified guarantee for the plan\'s {sampling.kind} sampling: {e}', None
  return dict(strategy=plan.strategy, noise_multiplier=plan.noise_multiplier, skipped=skipped,
              target_epsilon=None, target_rho=None,
              restart_rounds=plan.restart_rounds(num_rounds),
              clipped_count_stddev=plan.clipped_count_stddev,
              sampling_prob=None if sampling is None else sampling.sampling_prob,
              sampling_groups=None if sampling is None else sampling.num_groups)


def _from_mechanism_flags(fv, num_rounds: int) -> dict:
  """`build_report` arguments from --mechanism*, --noise_multiplier / targets, --restart_rounds."""
  strategy = _strategy(fv)
  targets = [f for f in ('noise_multiplier', 'target_epsilon', 'target_rho')
             if fv[f].value is not None]
  if len(targets) != 1:
    raise FlagError('exactly one of --noise_multiplier, --target_epsilon, --target_rho is required'
                    f'{"" if not targets else ", got --" + " and --".join(targets)}.')
  for flag in ('noise_multiplier', 'target_epsilon', 'target_rho', 'clipped_count_stddev'):
    _check_positive(fv[flag].value, flag)
  try:
    restarts = [int(r) for r in fv.restart_rounds]
  except ValueError:
    raise FlagError(f'--restart_rounds must be integers, got {fv.restart_rounds!r}.') from None
  try:
    zcdp.check_restart_rounds(restarts, num_rounds)
  except ValueError as e:
    raise FlagError(f'--restart_rounds: {e}') from None
  if fv.clipped_count_stddev is not None and fv.noise_multiplier is not None and (
      fv.noise_multiplier >= 2 * fv.clipped_count_stddev):
    raise FlagError('--noise_multiplier must be smaller than 2 * --clipped_count_stddev.')
  if fv.sampling_prob is not None and not 0 < fv.sampling_prob <= 1:
    raise FlagError(f'--sampling_prob must lie in (0, 1], got {fv.sampling_prob!r}.')
  _check_positive(fv.sampling_groups, 'sampling_groups', True)
  if fv.sampling_groups is not None and fv.sampling_prob is None:
    raise FlagError('--sampling_groups needs --sampling_prob.')
  return dict(strategy=strategy, noise_multiplier=fv.noise_multiplier,
              target_epsilon=fv.target_epsilon, target_rho=fv.target_rho, restart_rounds=restarts,
              clipped_count_stddev=fv.clipped_count_stddev, sampling_prob=fv.sampling_prob,
              sampling_groups=fv.sampling_groups)


def build_from_flags(fv) -> tuple:
  """(report, strategy) from the parsed `fv`; raises FlagError (or ValueError) on bad input."""
  if not 0 < fv.target_delta < 1:
    raise FlagError(f'--target_delta must lie in (0, 1), got {fv.target_delta!r}.')
  rounds = _check_positive(fv.rounds, 'rounds', True)
  schema = _schema(fv)
  log = None
  if fv.participation_log:
    try:
      log = participation_log.read_participation_log(fv.participation_log)
    except (ValueError, OSError) as e:
      raise _input_file_error('participation_log', fv.participation_log, e) from None
    if not log.num_rows:
      raise FlagError(f'--participation_log: {fv.participation_log} has no rows.')
  else:
    if rounds is None:
      raise FlagError('--rounds is required (or --participation_log).')
    if schema is None:
      raise FlagError('--min_sep is required (or --participation_log).')
  n = max(rounds or 0, log.num_rounds if log else 0)
  settings = _from_plan(fv, n) if fv.plan else _from_mechanism_flags(fv, n)
  strategy = settings.pop('strategy')
  skipped = settings.pop('skipped', None)
  if strategy.max_rounds is not None and n > strategy.max_rounds:
    raise FlagError(f'--rounds: the {strategy.name} strategy covers at most {strategy.max_rounds} '
                    f'rounds, the run has {n}.')
  memory.check_fits(strategy.name, n, losses=False)
  try:
    result = report.build_report(
        strategy, rounds, schema, delta=fv.target_delta, log=log,
        observed_patterns=fv.observed_patterns,
        equal_privacy=fv.equal_privacy and bool(fv.output_dir),
        strategy_file=None if fv.plan else fv.mechanism_file,
        allow_strategy_setting_mismatch=fv.allow_strategy_setting_mismatch, **settings)
  except report.StrategySettingMismatchError as e:
    raise FlagError(f'--mechanism_file: {e} (--allow_strategy_setting_mismatch reports it '
                    'anyway)') from None
  if skipped:
    result = dataclasses.replace(result, warnings=result.warnings + (skipped,))
  return result, strategy


def _parse_flags(argv):
  argv = flag_parsing.flags_parser(FLAGS, __doc__)(argv)
  try:
    _deprecated_flags.apply_aliases(FLAGS, DEPRECATED_FLAGS)
  except flags.Error as e:
    flag_parsing.exit_with_error(e, FLAGS)
  return argv


def _check_output_dir(path: str) -> None:
  """An unwritable --output_dir fails before the accounting (exit status 1)."""
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise OSError(f'--output_dir={path}: {existing} is a file, not a directory.')
  if not os.access(existing, os.W_OK):
    raise OSError(f'--output_dir={path}: {existing} is not writable; choose another --output_dir.')


def _exit_code(error: BaseException) -> int:
  if isinstance(error, FlagError | memory.MemoryLimitError):
    return flag_parsing.ERROR_EXIT_CODE
  return flag_parsing.RUNTIME_ERROR_EXIT_CODE


def _fail(error: BaseException) -> int:
  """One line on stderr (after the traceback with --debug); returns the exit status."""
  if FLAGS.debug:
    traceback.print_exc()
  if isinstance(error, MemoryError):
    message = 'out of memory; use fewer --rounds.'
  elif isinstance(error, ValueError | OSError | InputFileError):
    message = str(error)
  else:
    message = f'{type(error).__name__}: {error} (rerun with --debug for the traceback)'
  print(f'privacy_report: error: {" ".join(message.split())}', file=sys.stderr)
  return _exit_code(error)


def main(argv):
  if len(argv) > 1:
    print(f'privacy_report: error: unexpected arguments {argv[1:]}', file=sys.stderr)
    return flag_parsing.ERROR_EXIT_CODE
  try:
    if FLAGS.output_dir:
      _check_output_dir(FLAGS.output_dir)
    result, strategy = build_from_flags(FLAGS)
    if FLAGS.output_dir:
      try:
        report_render.write_report(result, strategy, FLAGS.output_dir, plots=FLAGS.plots)
      except OSError as e:
        raise OSError(f'--output_dir={FLAGS.output_dir}: cannot write the report ({e}); free disk '
                      'space or choose another --output_dir.') from e
  except ValueError as e:
    # A ValueError of the library (not a FlagError) is a bad setting too: e.g. a participation
    # schema or strategy parameters that cannot hold together.
    return _fail(e if isinstance(e, FlagError | memory.MemoryLimitError) else FlagError(str(e)))
  except Exception as e:  # every error is one line; --debug adds the traceback
    return _fail(e)
  print(report_render.to_json(result) if FLAGS.json else report_render.summary(result))
  if FLAGS.strict and result.observed is not None and result.observed.violations:
    print(f'privacy_report: error: --strict: the --participation_log violates the declared schema '
          f'({len(result.observed.violations)} breach(es), first: {result.observed.violations[0]}); '
          'the report states the guarantee of the observed participation.', file=sys.stderr)
    return flag_parsing.RUNTIME_ERROR_EXIT_CODE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=_parse_flags)
