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
  for row in rows:
    assert row.epsilon > row.epsilon_lower_bound > 0
    assert (row.canaries_seen, row.canaries_unseen, row.delta, row.confidence) == (
        50, 50, 1e-5, 0.9)
    assert row.to_dict()['threat_model'] == row.threat_model and len(row.to_dict()) == 7
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
      (lambda: empirical.canary_participation('record', [], []), 'record'),
      (lambda: empirical.canary_participation(record, ['c0'], [0, 1]), 'client_ids_per_row'),
      (lambda: empirical.canary_participation(record, ['c0'], [-1]), 'rounds_per_row'),
      (lambda: empirical.canary_participation(record, ['c0'], [0.5]), 'rounds_per_row'),
  ]
  for call, name in cases:
    with pytest.raises(ValueError, match=f'`{name}`'):
      call()
