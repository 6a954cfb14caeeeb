"""The report checks its inputs against each other (issue 36): a participation log that cannot be
the plan's (short rounds of a min-sep plan, a log shorter than the plan), canaries of another run,
metrics that do not parse, an empty client id, a delta too small for the PLD, and too few seen
canaries for an empirical epsilon. Plans, logs, metrics and canary files are built by hand."""

import dataclasses
import math

import numpy as np
import pytest

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import (
    report,
    report_empirical,
    report_files,
    report_participation,
    run_metrics,
    zcdp_epsilon,
)
from dp_ftrl_tff.mechanisms import blt, gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

Schema = participation_lib.ParticipationSchema
ROUNDS, COHORT = 6, 3


def _blt_plan(**kwargs):
  """The issue's run: BLT, 6 rounds, 3 clients per round, min_sep 2 (k 3: every client of the
  cohort log takes part 3 times)."""
  args = dict(num_rounds=ROUNDS, participation=Schema(2, 3), population=12)
  args.update(kwargs)
  return plan_lib.RunPlan.build(blt.PRODUCTION_STRATEGIES[400], 1.0, COHORT, 1.0, **args)


def _cohort_log(rounds):
  """3 clients per round, b = 2: clients 0-2 in even rounds, 3-5 in odd ones."""
  ids = [f'c{3 * (r % 2) + i}' for r in rounds for i in range(COHORT)]
  return log_lib.ParticipationLog.from_arrays(ids, np.repeat(list(rounds), COHORT))


def test_a_min_sep_log_missing_its_first_rounds_is_refused():
  whole = report.build_report(_blt_plan(), _cohort_log(range(ROUNDS)))
  with pytest.raises(report_participation.LogMismatchError, match=r'round 0 has 0 rows, but the plan\'s min-sep '
                     r'sampler draws exactly 3 clients every round \(3 of the 6 rounds it covers'):
    report.build_report(_blt_plan(), _cohort_log(range(3, ROUNDS)))
  # What the unchecked report would have said: a smaller epsilon than the whole run's.
  assert whole.guarantee.epsilon > 0
  short = log_lib.ParticipationLog.from_arrays(['c0', 'c1', 'c3', 'c4', 'c5'], [0, 0, 1, 1, 1])
  with pytest.raises(report_participation.LogMismatchError, match='round 0 has 2 rows'):
    report.build_report(_blt_plan(num_rounds=2), short)


def test_random_cohorts_and_planned_reports_have_no_cohort_check():
  sampling = sampling_lib.Sampling('poisson', 0.25, 1, population=12)
  poisson = plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, None, 1.0, sampling=sampling,
                                   num_rounds=ROUNDS)
  assert report.build_report(poisson, _cohort_log(range(3, ROUNDS))).guarantee.epsilon > 0
  assert report.build_report(_blt_plan()).participation_source == 'declared'


def test_a_log_shorter_than_the_plan_is_refused_without_explicit_rounds(tmp_path):
  log = _cohort_log(range(3))
  with pytest.raises(report_participation.LogMismatchError, match='it ends at round 2, but the plan has 6 rounds'):
    report.build_report(_blt_plan(), log, log_complete=True)
  assert report.build_report(_blt_plan(), log).guarantee.num_rounds == ROUNDS
  path = tmp_path / 'participation.csv'
  writer = log_lib.ParticipationLogWriter(str(path))
  for r in range(3):
    writer.append_round(r, [f'c{3 * (r % 2) + i}' for i in range(COHORT)])
  with pytest.raises(ValueError, match=f'^`participation_log`: {path} cannot be the log of this '
                     'plan: it ends at round 2'):
    report_files.report_from_run_files(_blt_plan(), path)
  assert report_files.report_from_run_files(_blt_plan(), path,
                                            num_rounds=3).guarantee.num_rounds == 3


def _random_cohort_plan(kind):
  sampling = sampling_lib.Sampling(kind, 0.25, 1 if kind == 'poisson' else 2, population=12)
  return plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, None, 1.0, sampling=sampling,
                                num_rounds=ROUNDS)


@pytest.mark.parametrize('kind', ['poisson', 'cyclic_poisson'])
@pytest.mark.parametrize('empty', [(0,), (2, 3), (5,), (4, 5), (0, 5)],
                         ids=['first', 'middle', 'last', 'last two', 'first and last'])
def test_random_cohorts_whose_rounds_drew_nobody_are_the_whole_log_with_the_trained_rounds(
    kind, empty):
  """Issue 44, point 7: an empty round writes no row; the rounds the run trained (its records')
  say what the log covers, not its last row."""
  plan = _random_cohort_plan(kind)
  log = _cohort_log([r for r in range(ROUNDS) if r not in empty])
  report_participation.check_log_of_plan(plan, log, complete=True, trained_rounds=ROUNDS)
  if ROUNDS - 1 in empty:  # without the records, a log that ends early may be missing rows
    with pytest.raises(report_participation.LogMismatchError,
                       match=f'it ends at round {log.num_rounds - 1}, but the plan has 6 rounds'
                       '.*a last round that drew nobody writes no row'):
      report_participation.check_log_of_plan(plan, log, complete=True)
  with pytest.raises(report_participation.LogMismatchError,
                     match=f'holds rows of round {log.num_rounds - 1}, but the run trained 2 '
                     r'rounds \(0 .. 1\): it is of another run'):
    report_participation.check_log_of_plan(plan, log, complete=True, trained_rounds=2)


def test_a_random_cohort_report_whose_last_rounds_drew_nobody():
  plan = _random_cohort_plan('cyclic_poisson')
  log = _cohort_log(range(ROUNDS - 2))
  trained = report.build_report(plan, log, log_complete=True, trained_rounds=ROUNDS)
  assert trained.guarantee.num_rounds == ROUNDS
  # The guarantee of the log over the plan's rounds: what the report says without the check.
  assert trained.guarantee.epsilon == report.build_report(plan, log).guarantee.epsilon


def test_trained_rounds_do_not_excuse_a_min_sep_log_its_last_rows():
  log = _cohort_log(range(4))
  with pytest.raises(report_participation.LogMismatchError,
                     match=r'round 4 has 0 rows.*\(2 of the 6 rounds it covers are short\)'):
    report.build_report(_blt_plan(), log, log_complete=True, trained_rounds=ROUNDS)
  with pytest.raises(ValueError, match='`trained_rounds` must be a positive integer'):
    report.build_report(_blt_plan(), log, trained_rounds=0)
  with pytest.raises(ValueError, match='`trained_rounds` says which rounds .* needs `log`'):
    report.build_report(_blt_plan(), None, trained_rounds=ROUNDS)


def _canary_run(num_canaries, population=None, plan=None):
  """(plan, log, record) with `num_canaries` canaries taking part in rounds i mod 2, i mod 2 + 2."""
  plan = plan or plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 2.0, 1, 1.0, num_rounds=4,
                                        participation=Schema(2, 2), population=population)
  ids = [f'canary{i}' for i in range(num_canaries)]
  rows = [(c, r) for i, c in enumerate(ids) for r in (i % 2, i % 2 + 2)]
  log = log_lib.ParticipationLog.from_arrays(*zip(*rows, strict=True))
  rng = np.random.default_rng(0)
  projections = 2.0 * rng.standard_normal((2 * num_canaries, 4))
  for i in range(num_canaries):
    projections[i, [i % 2, i % 2 + 2]] += 1.0
  record = auditing.CanaryRecord(tuple(ids), 0, 100, projections, None,
                                 population=plan.population, plan_sha256=auditing.plan_digest(plan))
  return plan, log, record


def test_canaries_of_another_run_are_refused():
  plan, log, record = _canary_run(60, population=200)
  assert len(report.build_report(plan, log, canaries=record).empirical_privacy) == 1
  other_plan = dataclasses.replace(plan, noise_multiplier=3.0)
  with pytest.raises(report_empirical.CanaryMismatchError, match='written for another plan'):
    report.build_report(plan, log, canaries=dataclasses.replace(
        record, plan_sha256=auditing.plan_digest(other_plan)))
  with pytest.raises(report_empirical.CanaryMismatchError, match='population of 250 clients, the plan has 200'):
    report.build_report(plan, log, canaries=dataclasses.replace(record, population=250))
  # The case: 150 canary ids against a population of 120 (a record without the binding).
  small, log, record = _canary_run(150, population=120)
  unbound = dataclasses.replace(record, population=None, plan_sha256=None)
  with pytest.raises(report_empirical.CanaryMismatchError, match='make 150 distinct clients, more than the '
                     "plan's population of 120"):
    report.build_report(small, log, canaries=unbound)
  twice = dataclasses.replace(unbound, client_ids=('canary0',) * 150)
  with pytest.raises(report_empirical.CanaryMismatchError, match='lists a canary id twice'):
    report.build_report(small, log, canaries=twice)


def test_below_the_minimum_of_seen_canaries_no_empirical_epsilon_is_given():
  plan, log, record = _canary_run(auditing.MIN_SEEN_CANARIES - 1)
  result = report.build_report(plan, log, canaries=record)
  assert result.empirical_privacy == ()
  (note,) = result.notes
  assert note.startswith('no empirical privacy')
  assert f'fewer than {auditing.MIN_SEEN_CANARIES} took part' in note
  assert f'needs at least {auditing.MIN_SEEN_CANARIES} seen canaries' in note
  plan, log, record = _canary_run(auditing.MIN_SEEN_CANARIES)
  (row,) = report.build_report(plan, log, canaries=record).empirical_privacy
  assert row.canaries_seen == auditing.MIN_SEEN_CANARIES


def test_a_delta_too_small_for_the_pld_warns_with_the_zcdp_bound():
  plan = plan_lib.RunPlan.for_accounting(gaussian.GaussianStrategy(), 1.0, num_rounds=10,
                                         participation=Schema(10, 1), target_delta=1e-300)
  result = report.build_report(plan)
  assert math.isinf(result.guarantee.epsilon)
  rho = result.guarantee.rho
  bound = rho + 2 * math.sqrt(rho * math.log(1e300))
  assert zcdp_epsilon.bun_steinke_bound(rho, 1e-300) == pytest.approx(bound, rel=1e-12)
  assert bound >= zcdp_epsilon.epsilon_from_rho(rho, 1e-300, 'gaussian')  # a valid, looser bound
  (warning,) = [f.text for f in result.findings_of('guarantee') if f.severity == 'warning']
  assert warning.startswith('the target delta')
  assert 'too small for the PLD accountant' in warning and f'{bound:.6g}' in warning
  usual = dataclasses.replace(plan, target_delta=1e-10)
  assert report.build_report(usual).warnings == ()


@pytest.mark.parametrize('text, match', [
    # The torn last row `2,1.01` under a header of three columns.
    ('round,aggregator/clip,loss\n0,1.0,2.0\n1,1.1,2.0\n2,1.01', ':4: 2 fields, the header has 3'),
    ('garbage\n', 'is not a metrics CSV'),
    ('', 'is not a metrics CSV'),
    ('round,aggregator/clip,loss\n0,1.0,2.0\nx,1.1,2.0\n', ":3: round 'x' is not"),
])
def test_metrics_that_do_not_parse_are_errors_naming_the_file(tmp_path, text, match):
  path = tmp_path / 'metrics.csv'
  path.write_text(text)
  with pytest.raises(ValueError, match=match) as caught:
    run_metrics.read_final_clip(str(path))
  assert str(path) in str(caught.value)
  with pytest.raises(ValueError, match=match):
    run_metrics.read_secure_segments(str(path))


@pytest.mark.parametrize('body', ['"a",0\n,1\n', 'a,0\n,1\n', 'a,0\n"",1\n', '"a",0\n"",1\n'])
def test_an_empty_client_id_is_refused_quoted_or_not(tmp_path, body):
  path = tmp_path / 'participation.csv'
  path.write_text('client_id,round\n' + body)
  with pytest.raises(ValueError) as caught:
    log_lib.read_participation_log(str(path))
  message = str(caught.value)
  assert str(path) in message and ('empty' in message or 'non-empty id' in message)
