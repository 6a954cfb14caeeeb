"""Tests for the BLT streaming noise (BLT paper Alg. 3) against dense C^-1 @ Z."""

import collections

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from dp_ftrl_tff.mechanisms import blt as blt_mechanisms
from dp_ftrl_tff.noise import base, blt
from tests.testing import streams as stream_testing

pytestmark = pytest.mark.unit

_APP_A_400 = blt_mechanisms.PRODUCTION_STRATEGIES[400]
_TWO_BUFFERS = blt_mechanisms.BLTStrategy(theta=(0.995335, 0.812275), omega=(0.128293, 0.329075))


def _dense_noise_inverse(strategy, num_rounds):
  """C^-1 by a dense triangular solve, independent of the strategy's closed forms."""
  c = np.concatenate([[1.0], [sum(w * t**(i - 1) for t, w in zip(strategy.theta, strategy.omega,
                                                                 strict=True))
                              for i in range(1, num_rounds)]])
  matrix = scipy.linalg.toeplitz(c, np.zeros(num_rounds))
  return scipy.linalg.solve_triangular(matrix, np.eye(num_rounds), lower=True)


@pytest.mark.parametrize('strategy', [_APP_A_400, _TWO_BUFFERS], ids=['app_a_400', 'two_buffers'])
def test_float64_stream_equals_noise_matrix_times_z(strategy):
  n = 40
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(7)
  rounds, state = stream_testing.run_stream(blt.BLTNoise(strategy), specs, seed, [n])
  np.testing.assert_allclose(strategy.noise_matrix(n), _dense_noise_inverse(strategy, n), atol=1e-12)
  expected, _ = stream_testing.expected_stream(strategy.noise_matrix, [n], specs, seed)
  for key in specs:
    np.testing.assert_allclose(rounds[key], expected[key], rtol=0, atol=1e-12)
  assert int(state.row) == n


# Inverses with a negative buffer decay: jax_privacy's pair, theta_hat ~ (0.854, 0.402, -0.655), and a
# BLT with non-monotone c, theta_hat ~ (0.687, -0.787). Alg. 3 streams C^-1 z from (theta, omega) alone;
# its state transition diag(theta) - 1 omega^T has eigenvalues theta_hat, stable for any in (-1, 1].
_NEGATIVE_INVERSE_DECAY = [
    blt_mechanisms.BLTStrategy(theta=(0.9, 0.5, 0.001), omega=(0.1, 0.2, 0.5)),
    blt_mechanisms.BLTStrategy(theta=(0.9, 0.3), omega=(0.6, 0.7)),
]


@pytest.mark.parametrize('strategy', _NEGATIVE_INVERSE_DECAY, ids=['jax_privacy_pair', 'non_monotone'])
def test_stream_with_negative_inverse_decays_equals_dense_inverse_times_z(strategy):
  n1, n2 = 70, 30
  assert strategy.inverse()[0][-1] < 0
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(13)
  rounds, state = stream_testing.run_stream(blt.BLTNoise(strategy), specs, seed, [n1, n2],
                                            stddev=1.5)
  expected, _ = stream_testing.expected_stream(lambda m: _dense_noise_inverse(strategy, m),
                                               [n1, n2], specs, seed, stddev=1.5)
  for key in specs:
    np.testing.assert_allclose(rounds[key], expected[key], rtol=0, atol=1e-12)
  assert int(state.row) == n1 + n2
  # The same dense C^-1 from the inverse's own parameters (negative decays raised to signed powers).
  theta_hat, omega_hat = strategy.inverse()
  c_hat = np.concatenate([[1.0], [omega_hat @ theta_hat**(i - 1) for i in range(1, n1)]])
  np.testing.assert_allclose(scipy.linalg.toeplitz(c_hat, np.zeros(n1)),
                             _dense_noise_inverse(strategy, n1), rtol=0, atol=1e-12)


def test_float32_stream_matches_within_1e5():
  n = 60
  specs = stream_testing.value_specs(tf.float32)
  seed = base.initial_seed(11)
  rounds, _ = stream_testing.run_stream(blt.BLTNoise(_APP_A_400), specs, seed, [n], stddev=2.5)
  expected, _ = stream_testing.expected_stream(
      lambda m: _dense_noise_inverse(_APP_A_400, m), [n], specs, seed, stddev=2.5)
  for key in specs:
    assert rounds[key].dtype == np.float32
    np.testing.assert_allclose(rounds[key], expected[key], rtol=1e-5,
                               atol=1e-5 * np.max(np.abs(expected[key])))
  noise = blt.BLTNoise(_APP_A_400)
  one_round, _ = noise.next(noise.initial_state(specs, seed), 1.0)  # a Python float stddev
  assert all(x.dtype == tf.float32 for x in tf.nest.flatten(one_round))


def test_restart_starts_a_fresh_segment_and_rows_keep_counting():
  n1, n2 = 17, 23
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(3)
  rounds, state = stream_testing.run_stream(blt.BLTNoise(_TWO_BUFFERS), specs, seed, [n1, n2])
  expected, _ = stream_testing.expected_stream(lambda m: _dense_noise_inverse(_TWO_BUFFERS, m),
                                               [n1, n2], specs, seed)
  for key in specs:
    np.testing.assert_allclose(rounds[key], expected[key], atol=1e-12)
  assert int(state.row) == n1 + n2


def test_noise_is_not_independent_gaussian():
  # The BLT stream differs from plain z after round 0 (guards against a no-op buffer update).
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(5)
  rounds, _ = stream_testing.run_stream(blt.BLTNoise(_TWO_BUFFERS), specs, seed, [3])
  z = stream_testing.z_rows(specs, seed, 3)
  np.testing.assert_allclose(rounds['bias'][0], z['bias'][0])
  assert not np.allclose(rounds['bias'][1], z['bias'][1])


def test_graph_mode_matches_eager():
  specs = stream_testing.value_specs(tf.float32)
  noise = blt.BLTNoise(_TWO_BUFFERS)
  seed = base.initial_seed(9)

  @tf.function
  def two_rounds(state):
    first, state = noise.next(state, tf.constant(1.0))
    second, state = noise.next(state, tf.constant(1.0))
    return first, second, state

  graph_first, graph_second, _ = two_rounds(noise.initial_state(specs, seed))
  eager, _ = stream_testing.run_stream(noise, specs, seed, [2])
  for key in specs:
    np.testing.assert_allclose(np.reshape(graph_first[key], -1), eager[key][0], rtol=1e-6)
    np.testing.assert_allclose(np.reshape(graph_second[key], -1), eager[key][1], rtol=1e-6)


@pytest.mark.integration
def test_inside_tff_computation():
  pytest.importorskip('tensorflow_federated')
  specs = collections.OrderedDict(w=tf.TensorSpec([5], tf.float32))
  rounds, _, _ = stream_testing.run_stream_in_tff(blt.BLTNoise(_APP_A_400), specs, 21, [4])
  expected, _ = stream_testing.expected_stream(lambda m: _dense_noise_inverse(_APP_A_400, m), [4],
                                               specs, base.initial_seed(21))
  np.testing.assert_allclose(rounds['w'], expected['w'], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('bad', [None, 'blt', object()])
def test_rejects_non_blt_strategy(bad):
  with pytest.raises(ValueError, match='strategy'):
    blt.BLTNoise(bad)


@pytest.mark.parametrize('specs', [[tf.TensorSpec([2], tf.int32)], [tf.TensorSpec([None], tf.float32)],
                                   []], ids=['integer', 'unknown_shape', 'empty'])
def test_rejects_bad_specs(specs):
  with pytest.raises(ValueError, match='value_specs'):
    blt.BLTNoise(_TWO_BUFFERS).initial_state(specs, base.initial_seed(0))
