"""Restart schedule vs TF-Privacy's restart indicator; quantile query vs a hand-written update."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_privacy as tfp

from dp_ftrl_tff import settings
from dp_ftrl_tff.aggregators import adaptive_clipping
from dp_ftrl_tff.noise import base, gaussian

pytestmark = pytest.mark.unit


def test_gboard_schedule_matches_tf_privacy_indicator():
  # TFF's tree_adaptive restarts after the k-th `next` call when k % 1024 == 128: the restarted
  # segment's first 0-based round is k.
  indicator = tfp.restart_query.PeriodicRoundRestartIndicator(period=1024, warmup=128)
  state = indicator.initialize()
  expected = []
  for k in range(1, 3300):
    flag, state = indicator.next(state)
    if bool(flag):
      expected.append(k)
  schedule = settings.GBOARD_RESTARTS
  assert schedule.restart_rounds(3300) == expected == [128, 1152, 2176, 3200]
  flags = [bool(adaptive_clipping.is_restart_round(schedule, tf.constant(r, tf.int64)))
           for r in range(3300)]
  assert [r for r, f in enumerate(flags) if f] == expected


def test_quantile_update_with_gaussian_count_noise():
  m, stddev, lr, target, c0 = 10.0, 0.7, 0.2, 0.5, 1.0
  query = adaptive_clipping.CorrelatedQuantileEstimatorQuery(
      gaussian.GaussianNoise, initial_estimate=c0, target_quantile=target, learning_rate=lr,
      clipped_count_stddev=stddev, expected_num_records=m)
  seed = base.initial_seed(5)
  count_seed = adaptive_clipping.count_seed(seed)
  state = query.initial_global_state(count_seed)
  norms = np.array([0.2, 0.5, 3.0, 4.0, 0.9, 2.0])
  estimate = c0
  for t in range(3):
    params = query.derive_sample_params(state)
    records = [query.preprocess_record(params, tf.constant(n, tf.float32)) for n in norms]
    _, state, _ = query.get_noised_result(tf.add_n(records), state)
    # Hand-written Andrew et al. geometric update with the count stream's row t.
    z = float(base.standard_normal_row(count_seed, t, tf.TensorSpec([], tf.float32)))
    below = np.sum((norms <= estimate) - 0.5) + stddev * z
    frac = min(1.0, max(0.0, below / m + 0.5))
    estimate = estimate * math.exp(-lr * (frac - target))
    np.testing.assert_allclose(float(state.current_estimate), estimate, rtol=1e-5)
  restarted = query.restart(state)
  assert float(restarted.current_estimate) == float(state.current_estimate)
