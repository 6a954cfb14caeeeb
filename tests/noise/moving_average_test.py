"""Tests for the moving-average streaming noise (BISR: banded C^-1) against dense C^-1 @ Z."""

import collections

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from dp_ftrl_tff.mechanisms import square_root
from dp_ftrl_tff.noise import base, moving_average
from tests.testing import streams as stream_testing

pytestmark = pytest.mark.unit

BISR = square_root.BandedInverseSquareRootStrategy


def _dense_noise_matrix(strategy):
  """C^-1 by a dense triangular solve on C (independent of the moving-average coefficients)."""
  def noise_matrix(m):
    return scipy.linalg.solve_triangular(strategy.strategy_matrix(m), np.eye(m), lower=True)
  return noise_matrix


@pytest.mark.parametrize('bands', [1, 2, 4, 15])
def test_float64_stream_equals_dense_inverse_times_z_over_restarts(bands):
  strategy = BISR(bands)
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(7)
  noise = moving_average.MovingAverageNoise.from_strategy(strategy)
  rounds, state = stream_testing.run_stream(noise, specs, seed, [10, 5], stddev=2.0)
  expected, _ = stream_testing.expected_stream(_dense_noise_matrix(strategy), [10, 5], specs, seed,
                                               stddev=2.0)
  for key in specs:
    np.testing.assert_allclose(rounds[key], expected[key], rtol=1e-12, atol=1e-12)
  assert int(state.row) == 15
  assert state.buffers['kernel'].shape == (bands - 1, 3, 2)
  assert not bool(noise.segment_ended(state))


def test_changing_stddev_scales_each_draw():
  """noise = C^-1 diag(stddev_t) Z: each round's draw keeps the stddev of its own round."""
  strategy = BISR(3)
  noise = moving_average.MovingAverageNoise(strategy)
  specs = collections.OrderedDict(w=tf.TensorSpec([4], tf.float64))
  seed = base.initial_seed(3)
  stddevs = [1.0, 0.5, 2.0, 3.0, 0.25, 1.5]
  state = noise.initial_state(specs, seed)
  got = []
  for stddev in stddevs:
    out, state = noise.next(state, tf.constant(stddev, tf.float64))
    got.append(np.asarray(out['w']))
  z = stream_testing.z_rows(specs, seed, len(stddevs))['w']
  expected = _dense_noise_matrix(strategy)(len(stddevs)) @ (np.array(stddevs)[:, None] * z)
  np.testing.assert_allclose(np.stack(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.integration
def test_float32_graph_mode_and_tff_match_dense():
  strategy = BISR(5)
  noise = moving_average.MovingAverageNoise(strategy)
  specs = collections.OrderedDict(w=tf.TensorSpec([6], tf.float32))
  seed = base.initial_seed(21)
  expected, _ = stream_testing.expected_stream(_dense_noise_matrix(strategy), [8], specs, seed)
  graph, _ = stream_testing.run_stream(noise, specs, seed, [8], tf_function=True)
  # float32 draws and sums of <= 5 terms with |r_j| <= 1: relative error a few float32 ulps.
  np.testing.assert_allclose(graph['w'], expected['w'], rtol=1e-5, atol=1e-6)
  pytest.importorskip('tensorflow_federated')
  in_tff, _, _ = stream_testing.run_stream_in_tff(noise, specs, 21, [8])
  np.testing.assert_allclose(in_tff['w'], expected['w'], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('bad', [None, square_root.BandedSquareRootStrategy(3), 'bisr'])
def test_rejects_other_strategies_and_bad_specs(bad):
  with pytest.raises(ValueError, match='strategy'):
    moving_average.MovingAverageNoise(bad)
  for specs in ([tf.TensorSpec([2], tf.int32)], [tf.TensorSpec([None], tf.float32)], []):
    with pytest.raises(ValueError, match='value_specs'):
      moving_average.MovingAverageNoise(BISR(2)).initial_state(specs, base.initial_seed(0))
