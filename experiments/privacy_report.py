r"""Privacy report of a planned or finished DP-FTRL training run.

Computes rho-zCDP and (epsilon, delta) (PLD, dp_accounting) from the run plan (the mechanism, the
noise multiplier or a calibration target, the restarts, the sampling, the declared participation)
and, for a finished run, the participation observed in its --participation_log, and writes
report.json, report.md (the BLT paper's App. C checklist) and three plots (epsilon_over_rounds.png,
epsilon_vs_min_sep.png, and equal_privacy.png when the report has an equal-privacy table) into
--output_dir. Docs: docs/privacy_report.md.

Example (the BLT paper's default BLT, production-like setting):
  python -m experiments.privacy_report --mechanism=blt --noise_multiplier=7.379 --rounds=2000 \
      --min_sep=400 --max_participations=5 --output_dir=/tmp/report
A finished training run: `--plan=RUN/plan.json --participation_log=RUN/participation.csv` gives the
report the run wrote at its end (the plan holds the mechanism and where it came from, the noise
multiplier and its split, the restarts, the sampling, the rounds and the declared participation;
with SecAgg, the segments come from --metrics, by default the metrics.csv beside the plan; with
adaptive clipping, the final clip comes from that metrics file too: add --metrics=RUN/metrics.csv
for the driver's report exactly, byte for byte; both are built by
`accounting.report_files.report_from_run_files`). Add --canaries=RUN/canaries.json (a run with
--canary_clients; needs --participation_log) for the empirical privacy of its canaries beside the
accounted epsilon.
--rounds, --min_sep, --max_participations and --target_delta given with --plan replace the plan's.
The files must be able to belong to one run (else exit 2 naming the flag): every round of the
--participation_log holds at least a min-sep plan's clients_per_round rows, and without --rounds
the log reaches the plan's last round (missing rows would understate epsilon); --canaries was
written for this plan (its population and plan digest), its canaries and the log's clients fit in
the plan's population, its ids are distinct and its cosines in [-1, 1]. The empirical epsilon is
printed only with at least 50 seen canaries (docs/auditing.md).

Without --mechanism_file or parameters, --mechanism=blt is the BLT paper's production BLT (App. A,
b = 400); other mechanisms that need parameters need them. A --mechanism_file must be optimized for
the run's rounds, min_sep and max participations (else exit 2, or a warning with
--allow_strategy_setting_mismatch).

Conventions: rounds are 0-based; --min_sep = b means r2 - r1 >= b for two participations of one client
(TF-Privacy's and the Gboard tables' min_separation = b - 1; the report prints both).
Exit codes: 0 ok; 2 on a user mistake (bad or conflicting flags, a missing input file, a size whose
arrays cannot fit in memory or whose accounting would take over an hour, a --sampling_prob below
2^-52 or a calibration's --target_delta below 2.2e-308 (docs/privacy_report.md, "Calibration"), a
strategy file made for another setting, an input file
that is corrupt, truncated, empty or of another kind: --plan, --mechanism_file, --participation_log,
--metrics, --canaries), 1 on a runtime failure (an unwritable --output_dir, I/O errors) and with
--strict when the log violates the declared schema (after writing the report): one line
`privacy_report.py: error: ...` on stderr naming the flag; `--debug` prints the traceback before it.
"""

import dataclasses
import os
import sys
import traceback
from typing import Optional

from absl import app, flags

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff import settings
from dp_ftrl_tff.accounting import (
  amplified_strategy,
  calibration,
  report,
  report_files,
  report_participation,
  report_render,
  zcdp,
)
from dp_ftrl_tff.mechanisms import memory, registry, resolve
from dp_ftrl_tff.training import console, record_checks, run_dir
from experiments.cli import flag_parsing, plan_flags

FLAGS = flags.FlagValues()
_d = dict(flag_values=FLAGS)
flags.DEFINE_string('plan', None, 'A run plan (`plan.json` of a training run): the mechanism, noise '
                    'multiplier, clipped-count noise, restarts and sampling; excludes the flags it '
                    'sets.', **_d)
plan_flags.define_mechanism_flags(FLAGS)
plan_flags.define_setting_flags(FLAGS, fixed_epoch=True)
plan_flags.define_noise_flags(FLAGS, target_rho=True)
plan_flags.define_restart_flags(FLAGS)
plan_flags.define_sampling_flags(FLAGS)
flags.DEFINE_string('participation_log', None,
                    'CSV `client_id,round` written by the client sampler (RUN/participation.csv).',
                    **_d)
flags.DEFINE_string('metrics', None, 'With a --plan: the run\'s metrics.csv, for each SecAgg '
                    'segment\'s clip and post-rounding bound and adaptive clipping\'s final clip '
                    '(default: with SecAgg, the one beside --plan).', **_d)
flags.DEFINE_string('canaries', None, 'With --participation_log: a run\'s canaries.json (written '
                    'with --canary_clients; its canaries.csv beside it), for the empirical privacy '
                    'of its canary clients (one row per threat model) beside the accounted epsilon.',
                    **_d)
flags.DEFINE_bool('observed_patterns', True,
                  'Trees with a log: also account the observed clients\' patterns.', **_d)
flags.DEFINE_string('output_dir', None, 'Where report.json, report.md, plots go.', **_d)
flags.DEFINE_bool('plots', True, 'Write the PNG plots into --output_dir.', **_d)
flags.DEFINE_bool('equal_privacy', True,
                  'With --output_dir, also compare every mechanism at this run\'s privacy (noise '
                  'multiplier, MaxLoss, RmsLoss; a few seconds at 2000 rounds).', **_d)
flags.DEFINE_bool('strict', False,
                  'Exit 1 when the --participation_log violates the declared schema (the report '
                  'is still written, with the guarantee of the observed participation).', **_d)
flags.DEFINE_bool('json', False, 'Print the JSON report instead of the summary.', **_d)
flags.DEFINE_bool('debug', False, 'On an error, print the traceback before the one-line message.',
                  **_d)
#: What --plan sets.
_PLAN_FLAGS = ('mechanism', 'mechanism_file', *sorted(registry.option_table()),
               'noise_multiplier', 'target_epsilon', 'target_rho', 'restart_rounds',
               'restart_warmup', 'restart_period', 'banded_beyond_max_rounds',
               'clipped_count_stddev', 'sampling_prob', 'sampling_groups')
#: What --plan leaves to the flags when they are given.
_SETTING_FLAGS = ('rounds', 'min_sep', 'max_participations', 'fixed_epoch', 'target_delta')


def _sampling(fv):
  """The random sampling of --sampling_prob / --sampling_groups, or min-sep sampling."""
  if fv.sampling_groups is not None and fv.sampling_prob is None:
    raise ValueError('`sampling_groups` needs `sampling_prob`.')
  if fv.sampling_prob is None:
    return sampling_lib.Sampling()
  if fv.sampling_groups is None:
    return sampling_lib.Sampling('poisson', fv.sampling_prob)
  return sampling_lib.Sampling('cyclic_poisson', fv.sampling_prob, fv.sampling_groups)


def _plan_from_flags(fv, log) -> plan_lib.RunPlan:
  """The accounting plan of the mechanism, noise, restart and sampling flags."""
  targets = [f for f in ('noise_multiplier', 'target_epsilon', 'target_rho') if fv[f].value is not None]
  if len(targets) != 1:
    raise ValueError('exactly one of `noise_multiplier`, `target_epsilon`, `target_rho` is '
                     f'required{"" if not targets else ", got `" + "` and `".join(targets) + "`"}.')
  declared = plan_flags.participation(fv)
  rounds = fv.rounds if fv.rounds is not None else (log.num_rounds if log else None)
  resolved = resolve.resolve_strategy(
      fv.mechanism, strategy=fv.mechanism_file, options=plan_flags.mechanism_options(fv),
      num_rounds=rounds, participation=declared,
      allow_setting_mismatch=fv.allow_strategy_setting_mismatch, fallback='reference')
  if rounds is not None:
    memory.check_fits(resolved.strategy.name, max(rounds, log.num_rounds if log else 0),
                      losses=False)
  restarts = settings.RestartSchedule.of(plan_flags.restart_rounds(fv.restart_rounds),
                                         fv.restart_warmup, fv.restart_period)
  sampling = _sampling(fv)
  if sampling.random_cohorts and rounds is not None:  # the amplified figure asked for must apply
    amplified_strategy.check_banded(resolved.strategy, rounds, sampling.num_groups,
                               None if restarts is None else restarts.restart_rounds(rounds))
  run_plan = plan_lib.RunPlan.for_accounting(
      resolved.strategy, fv.noise_multiplier or 0.0, clipped_count_stddev=fv.clipped_count_stddev,
      restarts=restarts, beyond_max_rounds=fv.banded_beyond_max_rounds, sampling=sampling,
      num_rounds=fv.rounds, participation=declared, target_delta=fv.target_delta,
      strategy_source=resolved.source)
  if fv.noise_multiplier is not None:
    return run_plan
  num_rounds, schema, _, _ = report_participation.headline_setting(run_plan, log)
  return calibration.calibrate_plan(
      run_plan, target_epsilon=fv.target_epsilon, target_rho=fv.target_rho,
      sensitivity_squared=zcdp.plan_sensitivity_squared(run_plan, num_rounds, schema))


def _plan_from_file(fv) -> plan_lib.RunPlan:
  """The plan of --plan, with the setting flags that were given in place of its own."""
  clashing = [name for name in _PLAN_FLAGS if fv[name].present]
  if clashing:
    raise ValueError(f'`plan` sets the mechanism and its noise; it excludes `{clashing[0]}`.')
  try:
    config = plan_lib.load_plan(fv.plan).to_config()
  except plan_lib.InvalidPlanFileError as e:  # JSON, but a field of the wrong type or value
    raise ValueError(f'`plan`: {e}') from None
  except (ValueError, OSError) as e:
    raise report_files.RunFileError('plan', fv.plan, e) from None
  if fv['rounds'].present:
    config['num_rounds'] = fv.rounds
  if fv['min_sep'].present or fv['max_participations'].present or fv.fixed_epoch:
    declared = plan_flags.participation(fv)
    config['participation'] = None if declared is None else dataclasses.asdict(declared)
  if fv['target_delta'].present or config['target_delta'] is None:
    config['target_delta'] = fv.target_delta
  return plan_lib.RunPlan.from_config(config)


def _metrics(fv, run_plan: plan_lib.RunPlan):
  """--metrics, or with a SecAgg plan the metrics.csv beside --plan (its segments are there)."""
  if fv.metrics is not None or run_plan.secure is None:
    return fv.metrics
  return os.path.join(os.path.dirname(os.path.abspath(fv.plan or '.')), run_dir.METRICS_FILE)


def _vouched_run(fv) -> Optional[record_checks.VouchedRun]:
  """The inputs that lie in a run directory checked against its records
  (`record_checks.check_report_inputs`; the metrics.csv beside --plan too, which a SecAgg plan
  reads), or None when none does."""
  metrics = fv.metrics
  if metrics is None and fv.plan:
    beside = os.path.join(os.path.dirname(os.path.abspath(fv.plan)), run_dir.METRICS_FILE)
    metrics = beside if os.path.isfile(beside) else None
  return record_checks.check_report_inputs(
      plan=fv.plan, participation_log=fv.participation_log or None, metrics=metrics,
      canaries=fv.canaries)


def _trained_rounds(fv, vouched: Optional[record_checks.VouchedRun]) -> Optional[int]:
  """The rounds the records of the inputs' run show it trained (what its log covers), or None
  when they are unknown or --rounds gives the report of the first rounds."""
  if vouched is None:
    return None
  done = vouched.trained_rounds
  if fv['rounds'].present:
    if fv.rounds > done:
      raise ValueError(f'`rounds`={fv.rounds}, but the run in {vouched.directory} trained {done} '
                       f'rounds (its checkpoint {done}): its records vouch for no later round.')
    return None
  if not vouched.finished:
    raise ValueError(f'the run in {vouched.directory} has trained {done} of its '
                     f'{vouched.planned_rounds} rounds (checkpoint {done}): give `rounds`={done} '
                     'for the report of its first rounds, or finish the run.')
  return done if fv.participation_log else None


def build_from_flags(fv) -> report.PrivacyReport:
  """The report of the parsed `fv` (`report_files.report_from_run_files`, as the drivers build
  theirs); raises ValueError (a usage error, naming the flag)."""
  if fv.metrics is not None and not os.path.isfile(fv.metrics):
    raise ValueError(f'`metrics`: no file at {fv.metrics!r}.')
  if fv.canaries is not None and not fv.participation_log:
    raise ValueError('`canaries` requires `participation_log`: the canaries are clients of the '
                     'run\'s participation log, which gives their rounds.')
  vouched = _vouched_run(fv)
  trained_rounds = _trained_rounds(fv, vouched)
  log = report_files.read_log(fv.participation_log) if fv.participation_log else None
  if log is None and (fv.plan is None and (fv.rounds is None or fv.min_sep is None)):
    raise ValueError(f'`{"rounds" if fv.rounds is None else "min_sep"}` is required (or '
                     '`participation_log`).')
  if fv.plan:
    run_plan = _plan_from_file(fv)
    memory.check_fits(run_plan.mechanism,
                      max(run_plan.num_rounds or 1, log.num_rounds if log else 0), losses=False)
  else:
    run_plan = _plan_from_flags(fv, log)
  return report_files.report_from_run_files(
      run_plan, log, metrics=_metrics(fv, run_plan), canaries=fv.canaries,
      trained_rounds=trained_rounds, run_id=None if vouched is None else vouched.run_id,
      log_complete=bool(fv.plan) and not fv['rounds'].present,
      observed_patterns=fv.observed_patterns,
      equal_privacy=fv.equal_privacy and bool(fv.output_dir), require_amplification=not fv.plan)


def _check_output_dir(path: str) -> None:
  """An unwritable --output_dir fails before the accounting (exit status 1)."""
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise OSError(f'--output_dir={path}: {existing} is a file, not a directory.')
  if not os.access(existing, os.W_OK):
    raise OSError(f'--output_dir={path}: {existing} is not writable; choose another --output_dir.')


def _fail(error: BaseException) -> int:
  """One line on stderr (after the traceback with --debug); returns the exit status."""
  if FLAGS.debug:
    traceback.print_exc()
  usage = isinstance(error, ValueError)  # a user mistake; memory refusals included
  if isinstance(error, MemoryError):
    message = 'out of memory; use fewer --rounds.'
  elif isinstance(error, ValueError | OSError):
    message = str(error)
  else:
    message = f'{type(error).__name__}: {error} (rerun with --debug for the traceback)'
  print(flag_parsing.error_text(message, FLAGS), file=sys.stderr)
  return flag_parsing.ERROR_EXIT_CODE if usage else flag_parsing.RUNTIME_ERROR_EXIT_CODE


def main(argv):
  if len(argv) > 1:
    print(flag_parsing.error_text(f'unexpected arguments {argv[1:]}', FLAGS), file=sys.stderr)
    return flag_parsing.ERROR_EXIT_CODE
  try:
    if FLAGS.output_dir:
      _check_output_dir(FLAGS.output_dir)
    result = build_from_flags(FLAGS)
    if FLAGS.output_dir:
      try:
        report_render.write_report(result, FLAGS.output_dir, plots=FLAGS.plots)
      except OSError as e:
        raise OSError(f'--output_dir={FLAGS.output_dir}: cannot write the report ({e}); free disk '
                      'space or choose another --output_dir.') from e
  except Exception as e:  # every error is one line; --debug adds the traceback
    return _fail(e)
  print(report_render.to_json(result) if FLAGS.json else
        report_render.summary(result, warnings=False))
  for warning in result.warnings:
    console.warn(warning)
  if FLAGS.strict and result.observed is not None and result.observed.violations:
    print(flag_parsing.error_text(
        f'--strict: the --participation_log violates the declared schema '
        f'({len(result.observed.violations)} breach(es), first: {result.observed.violations[0]}); '
        'the report states the guarantee of the observed participation.', FLAGS), file=sys.stderr)
    return flag_parsing.RUNTIME_ERROR_EXIT_CODE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=flag_parsing.flags_parser(FLAGS, __doc__))
