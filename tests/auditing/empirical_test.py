"""Tests for `dp_ftrl_tff.auditing.empirical` and the package: rows per threat model, participation
from log rows, input validation, no TensorFlow."""

import subprocess
import sys

import numpy as np
import pytest

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.auditing import empirical, records
from dp_ftrl_tff.mechanisms import registry

pytestmark = pytest.mark.unit


@pytest.mark.e2e
def test_import_does_not_load_tensorflow():
  code = ("import sys; import dp_ftrl_tff.auditing; "
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
  subprocess.run([sys.executable, '-c', code], check=True, timeout=120)


def test_package_exports():
  assert set(auditing.__all__) <= set(dir(auditing))


def _record(num_seen=50, num_rounds=4, final=True, signal=3.0, seed=0):
  rng = np.random.default_rng(seed)
  projections = rng.normal(size=(2 * num_seen, num_rounds))
  projections[:num_seen] += signal
  cosines = rng.normal(size=2 * num_seen) if final else None
  if final:
    cosines[:num_seen] += signal
  return records.CanaryRecord(client_ids=tuple(f'c{i}' for i in range(num_seen)), seed=seed,
                              dimension=10, round_projections=projections, final_cosines=cosines)


def test_canary_participation_from_log_rows():
  record = _record(num_seen=3, num_rounds=4)
  participation = empirical.canary_participation(
      record, ['c0', 'other', 'c2', 'c0', 'c2'], np.array([1, 0, 3, 2, 9]))  # round 9: not recorded
  np.testing.assert_array_equal(participation, [[0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]])


def test_rows_per_threat_model():
  record = _record()
  participation = np.ones((50, 4))
  tree = plan_lib.RunPlan.for_accounting(registry.default_strategy('tree'), 1.0, num_rounds=4)
  rows = empirical.empirical_privacy(tree, record, participation, 1e-5, confidence=0.9)
  assert [row.threat_model for row in rows] == list(auditing.THREAT_MODELS)
  each = 1 - 0.1 / (3 * len(auditing.METHODS))  # Bonferroni over the run's 3 x 4 bounds
  for row in rows:
    assert row.epsilon > row.epsilon_lower_bound > 0
    assert (row.canaries_seen, row.canaries_unseen, row.delta, row.confidence) == (
        50, 50, 1e-5, 0.9)
    assert [b.method for b in row.bounds] == list(auditing.METHODS)
    assert all(b.confidence == pytest.approx(each, rel=1e-15) for b in row.bounds)
    assert row.epsilon_lower_bound == max(b.epsilon for b in row.bounds)
    assert row.bound_of(row.lower_bound_method).epsilon == row.epsilon_lower_bound
    assert [fpr for fpr, _ in row.tpr_at_fpr] == list(empirical.ATTACK_FPRS)
    assert 0.5 < row.auroc <= 1
    as_dict = row.to_dict()
    assert as_dict['threat_model'] == row.threat_model and len(as_dict) == 11
    assert as_dict['bounds'][0]['method'] == 'clopper_pearson'
    assert as_dict['tpr_at_fpr'][1] == {'fpr': 0.01, 'tpr': row.tpr_at_fpr[1][1]}
  best_row, best = auditing.best_bound(rows)
  assert best.epsilon == max(row.epsilon_lower_bound for row in rows)
  assert best_row.epsilon_lower_bound == best.epsilon
  assert auditing.best_bound(()) is None
  gaussian = plan_lib.RunPlan.for_accounting(registry.default_strategy('gaussian'), 1.0,
                                             num_rounds=4)
  rows = empirical.empirical_privacy(gaussian, _record(final=False), participation, 1e-5)
  assert [row.threat_model for row in rows] == ['all_iterates']


def test_threat_models_with_too_few_scores_are_left_out():
  participation = np.zeros((50, 4))
  participation[0, 1] = 1.0  # one seen canary took part: the per-round scores have one sample each
  plan = plan_lib.RunPlan.for_accounting(registry.default_strategy('tree'), 1.0, num_rounds=4)
  rows = empirical.empirical_privacy(plan, _record(), participation, 1e-5)
  assert [row.threat_model for row in rows] == []  # final model: 1 seen score too
  participation[1, 2] = 1.0
  rows = empirical.empirical_privacy(plan, _record(), participation, 1e-5)
  assert [(row.threat_model, row.canaries_seen, row.canaries_unseen) for row in rows] == [
      ('final_model', 2, 50), ('all_iterates', 2, 2), ('all_iterates_whitened', 2, 2)]
  # min_seen leaves the rows out, and they no longer take a share of the confidence.
  assert empirical.empirical_privacy(plan, _record(), participation, 1e-5, min_seen=3) == ()
  empty = records.CanaryRecord(('a', 'b'), 0, 10, np.zeros((4, 0)), None)
  assert empirical.empirical_privacy(plan, empty, np.zeros((2, 0)), 1e-5) == ()


def test_bad_arguments_name_the_parameter():
  record = _record()
  plan = plan_lib.RunPlan.for_accounting(registry.default_strategy('tree'), 1.0, num_rounds=4)
  good = np.ones((50, 4))
  cases = [
      (lambda: empirical.empirical_privacy('plan', record, good, 1e-5), 'plan'),
      (lambda: empirical.empirical_privacy(plan, 'record', good, 1e-5), 'record'),
      (lambda: empirical.empirical_privacy(plan, record, np.ones((50, 3)), 1e-5), 'participation'),
      (lambda: empirical.empirical_privacy(plan, record, good, 0.0), 'delta'),
      (lambda: empirical.empirical_privacy(plan, record, good, 1e-5, 1.0), 'confidence'),
      (lambda: empirical.empirical_privacy(plan, record, good, 1e-5, 0.9, 1), 'min_seen'),
      (lambda: empirical.empirical_row('x', [1.0, 2.0], [0.0, 1.0], 1e-5, 0.9), 'threat_model'),
      (lambda: empirical.empirical_row('final_model', [1.0, 2.0], [0.0, 1.0], 1e-5, 0.9, 0),
       'num_rows'),
      (lambda: empirical.best_bound(['row']), 'rows'),
      (lambda: empirical.canary_participation('record', [], []), 'record'),
      (lambda: empirical.canary_participation(record, ['c0'], [0, 1]), 'client_ids_per_row'),
      (lambda: empirical.canary_participation(record, ['c0'], [-1]), 'rounds_per_row'),
      (lambda: empirical.canary_participation(record, ['c0'], [0.5]), 'rounds_per_row'),
  ]
  for call, name in cases:
    with pytest.raises(ValueError, match=f'`{name}`'):
      call()
