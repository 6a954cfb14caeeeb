"""Tests of the report's empirical privacy (`report.build_report(..., canaries=...)`): rows equal to
`auditing.empirical_privacy`, report.json / summary / report.md (every certified bound, the best
one), the warning when a certified bound exceeds the accounted epsilon, the note for an estimate
above it, and bad inputs.

Canary records are synthetic: seen canary i takes part in rounds i mod b, i mod b + b, ... (k
times), and its projections are its 0/1 pattern plus sigma * noise_scale * M g (M the plan's noise
matrix, g standard normal), as `auditing.statistics` models a linear Gaussian mechanism; unseen
rows hold only the noise. With noise_scale = 1 the projections come from the mechanism the
accountant assumes; with 0.5 they carry half its noise (a mechanism that adds less noise than
accounted).
"""

import dataclasses
import json

import numpy as np
import pytest

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import (
    participation_bits,
    report,
    report_empirical,
    report_markdown,
    report_parts,
    report_render,
    report_sections,
)
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.mechanisms import blt, gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

Schema = participation_lib.ParticipationSchema

NUM_ROUNDS, MIN_SEP, MAX_PARTICIPATIONS = 20, 5, 4


def canary_run(strategy, noise_multiplier, num_canaries, noise_scale, *, delta=1e-3, seed=0,
               final_cosines=False, num_rounds=NUM_ROUNDS, min_sep=MIN_SEP,
               max_participations=MAX_PARTICIPATIONS):
  """(plan, log, record) of a synthetic run with `num_canaries` seen canaries.

  Every round also has one ordinary client (`other<r>`); canary i takes part in rounds
  i mod min_sep + j * min_sep, j < max_participations.
  """
  rng = np.random.default_rng(seed)
  canary_ids = [f'canary{i}' for i in range(num_canaries)]
  patterns = np.zeros((num_canaries, num_rounds))
  ids, rounds = [], []
  for i, client in enumerate(canary_ids):
    taken = [r for r in range(i % min_sep, num_rounds, min_sep)][:max_participations]
    patterns[i, taken] = 1.0
    ids += [client] * len(taken)
    rounds += taken
  ids += [f'other{r}' for r in range(num_rounds)]
  rounds += list(range(num_rounds))
  log = log_lib.ParticipationLog.from_arrays(ids, rounds)
  run_plan = plan_lib.RunPlan.for_accounting(
      strategy, noise_multiplier, num_rounds=num_rounds,
      participation=Schema(min_sep, max_participations), target_delta=delta)
  matrix = auditing.plan_noise_matrix(run_plan, num_rounds)
  if matrix is None:
    matrix = np.eye(num_rounds)
  noise = rng.standard_normal((2 * num_canaries, matrix.shape[1])) @ matrix.T
  projections = noise_scale * noise_multiplier * noise
  projections[:num_canaries] += patterns
  cosines = None
  if final_cosines:
    cosines = 0.01 * rng.standard_normal(2 * num_canaries)
    cosines[:num_canaries] += 0.02
  record = auditing.CanaryRecord(client_ids=tuple(canary_ids), seed=seed, dimension=1000,
                                 round_projections=projections, final_cosines=cosines)
  return run_plan, log, record, patterns


def _direct_rows(run_plan, record, patterns, delta, confidence=0.95):
  return auditing.empirical_privacy(run_plan, record, patterns, delta, confidence)


@pytest.mark.parametrize('strategy, models', [
    (gaussian.GaussianStrategy(), ('final_model', 'all_iterates')),
    (blt.PRODUCTION_STRATEGIES[400], ('final_model', 'all_iterates', 'all_iterates_whitened')),
])
def test_rows_equal_empirical_privacy_computed_directly(strategy, models):
  run_plan, log, record, patterns = canary_run(strategy, 2.0, 200, 1.0, final_cosines=True)
  result = report.build_report(run_plan, log, canaries=record)
  expected = _direct_rows(run_plan, record, patterns, result.guarantee.delta)
  assert tuple(row.threat_model for row in result.empirical_privacy) == models
  assert result.empirical_privacy == expected
  out = json.loads(report_render.to_json(result))
  assert out['empirical_privacy'] == [row.to_dict() for row in expected]
  for row in out['empirical_privacy']:
    assert set(row) == {'threat_model', 'epsilon', 'epsilon_lower_bound', 'lower_bound_method',
                        'confidence', 'bounds', 'tpr_at_fpr', 'auroc', 'canaries_seen',
                        'canaries_unseen', 'delta'}
    assert row['delta'] == out['delta'] == 1e-3 and row['confidence'] == 0.95
    assert [b['method'] for b in row['bounds']] == list(auditing.METHODS)
    assert all(b['confidence'] == 1 - 0.05 / (4 * len(models)) for b in row['bounds'])
    assert row['canaries_seen'] == row['canaries_unseen'] or row['threat_model'] == 'final_model'


def test_confidence_is_passed_to_the_rows():
  run_plan, log, record, patterns = canary_run(gaussian.GaussianStrategy(), 2.0, 100, 1.0)
  result = report.build_report(run_plan, log, canaries=record, confidence=0.8)
  assert result.empirical_privacy == _direct_rows(run_plan, record, patterns, 1e-3, 0.8)
  assert 'at 80%' in report_render.summary(result)
  assert report_render.to_dict(result)['empirical_best_bound']['confidence_together'] == 0.8


def test_without_canaries_the_keys_are_null_and_empty():
  run_plan, log, _, _ = canary_run(gaussian.GaussianStrategy(), 2.0, 10, 1.0)
  result = report.build_report(run_plan, log)
  out = report_render.to_dict(result)
  assert out['empirical_privacy'] is None and out['empirical_best_bound'] is None
  assert [f['text'] for f in out['findings'] if f['severity'] == 'note'] == []
  assert 'Empirical privacy' not in report_render.to_markdown(result)
  assert 'empirical' not in report_render.summary(result)


def test_summary_has_one_line_per_row_and_the_best_bound():
  run_plan, log, record, _ = canary_run(blt.PRODUCTION_STRATEGIES[400], 2.0, 100, 1.0)
  result = report.build_report(run_plan, log, canaries=record)
  summary = [line.strip() for line in report_render.summary(result).splitlines()]
  lines = [line for line in summary if line.startswith('empirical (')]
  assert len(lines) == len(result.empirical_privacy) == 2
  row = result.empirical_privacy[1]
  bounds = ', '.join(f'{report_empirical.METHOD_TEXT[b.method]} {b.epsilon:.4g}'
                     for b in row.bounds)
  assert lines[1] == (f'empirical (all_iterates_whitened): certified lower bound '
                      f'{row.epsilon_lower_bound:.4g} at 95% ({bounds}); estimate '
                      f'{row.epsilon:.4g}; vs accounted {result.guarantee.epsilon:.4g}')
  best_row, best = auditing.best_bound(result.empirical_privacy)
  (line,) = [line for line in summary if line.startswith('Best certified lower bound')]
  assert line == (f'Best certified lower bound: {best.epsilon:.4g} '
                  f'({report_empirical.METHOD_TEXT[best.method]}, {best_row.threat_model}) at 95% '
                  f'confidence, {best.epsilon / result.guarantee.epsilon:.2f} of the accounted '
                  f'epsilon {result.guarantee.epsilon:.4g}')
  out = report_render.to_dict(result)['empirical_best_bound']
  assert out == {**best.to_dict(), 'threat_model': best_row.threat_model,
                 'confidence_together': 0.95, 'accounted_epsilon': result.guarantee.epsilon,
                 'fraction_of_accounted': best.epsilon / result.guarantee.epsilon}


def test_half_the_noise_warns_do_not_launch():
  # 10^4 canaries, k = 4, sigma = 2, delta = 1e-2: accounted epsilon 2.32; with half the noise the
  # all-iterates scores separate like a Gaussian mechanism of mu = 2 (epsilon 5.99) and the best
  # certified bound (GDP fit) is well above the accounted epsilon (tests/accounting/
  # report_bounds_test.py gives the rates over seeds).
  run_plan, log, record, patterns = canary_run(gaussian.GaussianStrategy(), 2.0, 10_000, 0.5,
                                               delta=1e-2)
  result = report.build_report(run_plan, log, canaries=record)
  assert result.guarantee.epsilon == pytest.approx(2.318, abs=1e-3)
  (row,) = result.empirical_privacy
  assert row.epsilon_lower_bound > 1.4 * result.guarantee.epsilon
  (warning,) = [f.text for f in result.findings_of('empirical') if f.severity == 'warning']
  assert 'all_iterates' in warning and f'{row.epsilon_lower_bound:.4g}' in warning
  assert '95%' in warning and 'Do not launch' in warning
  assert 'the accountant or the mechanism is wrong' in warning
  out = report_render.to_dict(result)
  assert {'section': 'empirical', 'severity': 'warning', 'text': warning} in out['findings']
  markdown = report_render.to_markdown(result)
  assert f'- **WARNING:** {warning}' in markdown and f'> - {warning}' in markdown
  assert '**(above accounted)**' in markdown
  assert f'WARNING: {warning}' in report_render.summary(result)


def test_the_right_noise_does_not_warn():
  run_plan, log, record, _ = canary_run(gaussian.GaussianStrategy(), 2.0, 10_000, 1.0,
                                        delta=1e-2)
  result = report.build_report(run_plan, log, canaries=record)
  (row,) = result.empirical_privacy
  assert row.epsilon_lower_bound < result.guarantee.epsilon
  assert row.epsilon == pytest.approx(result.guarantee.epsilon, rel=0.25)
  assert result.warnings == ()
  assert '(above accounted)' not in report_render.to_markdown(result)


def test_an_estimate_above_the_accounted_epsilon_with_a_lower_bound_below_is_a_note():
  # 100 canaries with 0.7 of the noise: estimate 7.4 against 3.14 accounted, best bound 1.9.
  run_plan, log, record, _ = canary_run(gaussian.GaussianStrategy(), 2.0, 100, 0.7)
  result = report.build_report(run_plan, log, canaries=record)
  (row,) = result.empirical_privacy
  assert row.epsilon_lower_bound < result.guarantee.epsilon < row.epsilon
  assert result.warnings == ()
  (note,) = result.notes
  assert note.startswith('the one-shot empirical estimate') and 'not a proof' in note
  assert result.findings == (report_parts.note('empirical', note),)
  assert report_render.to_dict(result)['findings'] == [
      {'section': 'empirical', 'severity': 'note', 'text': note}]
  assert f'note: {note}' in report_render.summary(result)
  markdown = report_render.to_markdown(result)
  assert f'- Note: {note}' in markdown and '> **Note**' not in markdown


def test_markdown_section():
  run_plan, log, record, _ = canary_run(blt.PRODUCTION_STRATEGIES[400], 2.0, 100, 1.0,
                                        final_cosines=True)
  result = report.build_report(run_plan, log, canaries=record)
  markdown = report_render.to_markdown(result)
  section = markdown[markdown.index('## Empirical privacy (canaries)'):]
  assert f'**epsilon = {result.guarantee.epsilon:.6g}**' in section
  assert report_markdown.EMPIRICAL_CAVEAT in section and 'docs/auditing.md' in section
  rows = result.empirical_privacy
  assert f'**{report_empirical.best_text(rows, result.guarantee.epsilon)}.**' in section
  assert ('Certified lower bounds at 95% confidence together (each at 99.5833%: Bonferroni over '
          'the 12 bounds)') in section
  assert ('| threat model | seen / unseen | Clopper-Pearson | one-run | one-run f-DP | GDP fit | '
          'estimate | TPR at FPR 0.1% / 1% / 10% | AUROC |') in section
  for row in rows:
    bounds = ' | '.join(f'{b.epsilon:.4g}' for b in row.bounds)
    tprs = ' / '.join(f'{tpr:.3g}' for _, tpr in row.tpr_at_fpr)
    assert (f'| `{row.threat_model}` | {row.canaries_seen} / {row.canaries_unseen} | {bounds} | '
            f'{row.epsilon:.4g} | {tprs} | {row.auroc:.4g} |') in section
    assert f'  - `{row.threat_model}`: {auditing.THREAT_MODEL_TEXT[row.threat_model]}' in section
  for method in auditing.METHODS:
    assert f'  - {report_empirical.METHOD_TEXT[method]}: ' in section


def test_fixed_noise_seed_rows_are_computed_as_usual():
  run_plan, log, record, patterns = canary_run(gaussian.GaussianStrategy(), 2.0, 100, 1.0)
  fixed = dataclasses.replace(run_plan, noise_seed_fixed=True)
  result = report.build_report(fixed, log, canaries=record)
  assert report_sections.FIXED_SEED_WARNING in result.warnings
  assert result.empirical_privacy == _direct_rows(run_plan, record, patterns, 1e-3)


def test_canaries_absent_from_the_log_give_no_rows_and_a_note():
  run_plan, log, record, _ = canary_run(gaussian.GaussianStrategy(), 2.0, 10, 1.0)
  other = dataclasses.replace(record, client_ids=tuple(f'ghost{i}' for i in range(10)))
  result = report.build_report(run_plan, log, canaries=other)
  assert result.empirical_privacy == () and result.warnings == ()
  (note,) = result.notes
  assert note.startswith('no empirical privacy')
  assert report_render.to_dict(result)['empirical_privacy'] == []
  markdown = report_render.to_markdown(result)
  assert '## Empirical privacy (canaries)' in markdown and f'- Note: {note}' in markdown
  assert '| threat model |' not in markdown


def test_log_rows_of_reads_only_the_canaries_in_every_block():
  n = participation_bits.BLOCK_CLIENTS + 5
  ids = [f'c{i}' for i in range(n)] + ['c3', f'c{n - 1}']
  rounds = [i % 7 for i in range(n)] + [9, 12]
  log = log_lib.ParticipationLog.from_arrays(ids, rounds)
  found_ids, found_rounds = log.rows_of([f'c{n - 1}', 'c3', 'missing'])
  assert sorted(zip(found_ids.tolist(), found_rounds.tolist(), strict=True)) == sorted(
      [('c3', 3), ('c3', 9), (f'c{n - 1}', (n - 1) % 7), (f'c{n - 1}', 12)])
  assert found_rounds.dtype == np.int64
  empty_ids, empty_rounds = log.rows_of([])
  assert empty_ids.size == empty_rounds.size == 0


def test_bad_inputs_name_the_parameter():
  run_plan, log, record, _ = canary_run(gaussian.GaussianStrategy(), 2.0, 10, 1.0)
  with pytest.raises(ValueError, match='`canaries` needs the participation log'):
    report.build_report(run_plan, canaries=record)
  with pytest.raises(ValueError, match='`canaries` must be an auditing.CanaryRecord'):
    report.build_report(run_plan, log, canaries={'client_ids': []})
  for confidence in (0.0, 1.0, 1.5, float('nan')):
    with pytest.raises(ValueError, match='confidence'):
      report.build_report(run_plan, log, canaries=record, confidence=confidence)
  longer = dataclasses.replace(record, round_projections=np.zeros((20, NUM_ROUNDS + 3)))
  with pytest.raises(report_empirical.CanaryMismatchError, match='`canaries`: the canary record holds 23 '
                     'rounds, the run 20') as caught:
    report.build_report(run_plan, log, canaries=longer)
  assert isinstance(caught.value, ValueError) and caught.value.reason.startswith('the canary')
  shorter = dataclasses.replace(record, round_projections=record.round_projections[:, :-1])
  with pytest.raises(report_empirical.CanaryMismatchError, match='holds 19 rounds, the run 20 .*: it is '
                     'truncated'):
    report.build_report(run_plan, log, canaries=shorter)
