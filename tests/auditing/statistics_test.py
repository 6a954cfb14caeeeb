"""Tests for `dp_ftrl_tff.auditing.statistics`: scores on hand-built projections, the plan's noise
matrix with restarts, input validation."""

import numpy as np
import pytest
import scipy.linalg

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.auditing import statistics
from dp_ftrl_tff.mechanisms import registry
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from dp_ftrl_tff.settings import RestartSchedule

pytestmark = pytest.mark.unit


def test_threat_models_are_described():
  assert set(statistics.THREAT_MODEL_TEXT) == set(statistics.THREAT_MODELS)


def test_scores_follow_the_documented_formulas():
  rng = np.random.default_rng(0)
  n, num_seen = 6, 4
  projections = rng.normal(size=(2 * num_seen, n))
  participation = np.array([[1, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0],
                            [0, 0, 1, 0, 0, 0]], dtype=float)
  m = np.tril(rng.uniform(0.5, 1.0, size=(n, n + 2)))
  cosines = rng.normal(size=2 * num_seen)
  scores = statistics.canary_statistics(projections, participation, cosines, m)
  assert list(scores) == list(statistics.THREAT_MODELS)
  took_part = [0, 1, 3]  # canary 2 never took part: left out with its unseen partner 6
  w = np.linalg.inv(m @ m.T)
  for score_index, i in enumerate(took_part):
    u = participation[i]
    seen, unseen = projections[i], projections[num_seen + i]
    assert scores['all_iterates'][0][score_index] == pytest.approx(u @ seen / np.linalg.norm(u))
    assert scores['all_iterates'][1][score_index] == pytest.approx(u @ unseen / np.linalg.norm(u))
    norm = np.sqrt(u @ w @ u)
    assert scores['all_iterates_whitened'][0][score_index] == pytest.approx(u @ w @ seen / norm)
    assert scores['all_iterates_whitened'][1][score_index] == pytest.approx(u @ w @ unseen / norm)
  np.testing.assert_array_equal(scores['final_model'][0], cosines[took_part])
  np.testing.assert_array_equal(scores['final_model'][1], cosines[num_seen:])


def test_whitened_signal_is_the_sensitivity_of_a_square_strategy():
  # Noise-free projections P_i = u: the whitened seen score is sqrt(u^T (C^T C) u) = ||C u||.
  rng = np.random.default_rng(1)
  c = np.tril(rng.uniform(0.1, 1.0, size=(5, 5))) + np.eye(5)
  u = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
  projections = np.stack([u, np.zeros(5)])
  scores = statistics.canary_statistics(projections, u[None], noise_matrix=np.linalg.inv(c))
  assert scores['all_iterates_whitened'][0][0] == pytest.approx(np.linalg.norm(c @ u), rel=1e-12)


def test_optional_threat_models_are_left_out():
  scores = statistics.canary_statistics(np.zeros((4, 3)), np.ones((2, 3)))
  assert list(scores) == ['all_iterates']


def test_plan_noise_matrix_is_block_diagonal_over_restarts():
  strategy = registry.default_strategy('tree')
  plan = plan_lib.RunPlan.for_accounting(strategy, 1.0, num_rounds=10,
                                         participation=ParticipationSchema.single(),
                                         restarts=RestartSchedule.at((4,)))
  expected = scipy.linalg.block_diag(strategy.noise_matrix(4), strategy.noise_matrix(6))
  np.testing.assert_array_equal(statistics.plan_noise_matrix(plan, 10), expected)
  gaussian = plan_lib.RunPlan.for_accounting(registry.default_strategy('gaussian'), 1.0,
                                             num_rounds=10)
  assert statistics.plan_noise_matrix(gaussian, 10) is None


@pytest.mark.parametrize('kwargs,name', [
    ({'round_projections': np.zeros((3, 4))}, 'round_projections'),
    ({'round_projections': np.zeros(4)}, 'round_projections'),
    ({'round_projections': [[np.nan] * 4] * 4}, 'round_projections'),
    ({'participation': np.ones((2, 5))}, 'participation'),
    ({'participation': np.full((2, 4), 0.5)}, 'participation'),
    ({'final_cosines': np.zeros(3)}, 'final_cosines'),
    ({'final_cosines': np.zeros((4, 1))}, 'final_cosines'),
    ({'noise_matrix': np.eye(3)}, 'noise_matrix'),
    ({'noise_matrix': np.zeros((4, 4))}, 'noise_matrix')])
def test_canary_statistics_bad_arguments(kwargs, name):
  arguments = {'round_projections': np.zeros((4, 4)), 'participation': np.ones((2, 4))}
  arguments.update(kwargs)
  with pytest.raises(ValueError, match=f'`{name}`'):
    statistics.canary_statistics(**arguments)


def test_plan_noise_matrix_bad_arguments():
  plan = plan_lib.RunPlan.for_accounting(registry.default_strategy('tree'), 1.0, num_rounds=4)
  with pytest.raises(ValueError, match='`plan`'):
    statistics.plan_noise_matrix('plan', 4)
  for bad in (0, 2.5, None):
    with pytest.raises(ValueError, match='`num_rounds`'):
      statistics.plan_noise_matrix(plan, bad)
