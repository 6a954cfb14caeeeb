"""Tests for the BLT streaming noise (BLT paper Alg. 3) against dense C^-1 @ Z."""

import collections

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from dp_ftrl_tff.mechanisms import blt as blt_mechanisms
from dp_ftrl_tff.noise import base, blt

_APP_A_400 = blt_mechanisms.PRODUCTION_STRATEGIES[400]
_TWO_BUFFERS = blt_mechanisms.BLTStrategy(theta=(0.995335, 0.812275), omega=(0.128293, 0.329075))


def _specs(dtype):
  return collections.OrderedDict(
      kernel=tf.TensorSpec([3, 2], dtype), bias=tf.TensorSpec([4], dtype),
      scalar=tf.TensorSpec([], dtype))


def _stream(noise, specs, seed, num_rounds, stddev=1.0, restart_at=()):
  state = noise.initial_state(specs, seed)
  rounds = []
  for t in range(num_rounds):
    if t in restart_at:
      state = noise.restart(state)
    z_hat, state = noise.next(state, tf.constant(stddev, tf.float32))
    rounds.append(tf.nest.map_structure(lambda x: np.asarray(x, np.float64), z_hat))
  return rounds, state


def _z_rows(specs, seed, rows):
  """Z[r] for each r, rebuilt from `standard_normal_row` (flattened per leaf), float64."""
  return [tf.nest.map_structure(lambda x: np.asarray(x, np.float64),
                                base.standard_normal_row(seed, tf.constant(r, tf.int64), specs))
          for r in rows]


def _dense_noise_inverse(strategy, num_rounds):
  """C^-1 by a dense triangular solve, independent of the strategy's closed forms."""
  c = np.concatenate([[1.0], [sum(w * t**(i - 1) for t, w in zip(strategy.theta, strategy.omega, strict=False))
                              for i in range(1, num_rounds)]])
  matrix = scipy.linalg.toeplitz(c, np.zeros(num_rounds))
  return scipy.linalg.solve_triangular(matrix, np.eye(num_rounds), lower=True)


def _stack(rounds, key):
  return np.stack([r[key].reshape(-1) for r in rounds])


@pytest.mark.parametrize('strategy', [_APP_A_400, _TWO_BUFFERS], ids=['app_a_400', 'two_buffers'])
def test_float64_stream_equals_noise_matrix_times_z(strategy):
  n = 40
  specs = _specs(tf.float64)
  seed = base.initial_seed(7)
  rounds, state = _stream(blt.BLTNoise(strategy), specs, seed, n)
  z = _z_rows(specs, seed, range(n))
  noise_matrix = strategy.noise_matrix(n)
  np.testing.assert_allclose(noise_matrix, _dense_noise_inverse(strategy, n), atol=1e-12)
  for key in specs:
    np.testing.assert_allclose(_stack(rounds, key), noise_matrix @ _stack(z, key), rtol=0,
                               atol=1e-12)
  assert int(state.row) == n and int(state.segment_round) == n


def test_float32_stream_matches_within_1e5():
  n = 60
  specs = _specs(tf.float32)
  seed = base.initial_seed(11)
  rounds, _ = _stream(blt.BLTNoise(_APP_A_400), specs, seed, n, stddev=2.5)
  z = _z_rows(specs, seed, range(n))
  inverse = _dense_noise_inverse(_APP_A_400, n)
  for key in specs:
    expected = 2.5 * inverse @ _stack(z, key)
    np.testing.assert_allclose(_stack(rounds, key), expected, rtol=1e-5,
                               atol=1e-5 * np.max(np.abs(expected)))
  noise, _ = blt.BLTNoise(_APP_A_400).next(blt.BLTNoise(_APP_A_400).initial_state(specs, seed), 1.0)
  assert all(x.dtype == tf.float32 for x in tf.nest.flatten(noise))


def test_restart_starts_a_fresh_segment_and_rows_keep_counting():
  n1, n2 = 17, 23
  specs = _specs(tf.float64)
  seed = base.initial_seed(3)
  rounds, state = _stream(blt.BLTNoise(_TWO_BUFFERS), specs, seed, n1 + n2, restart_at=(n1,))
  z = _z_rows(specs, seed, range(n1 + n2))
  for key in specs:
    got = _stack(rounds, key)
    zk = _stack(z, key)
    np.testing.assert_allclose(got[:n1], _dense_noise_inverse(_TWO_BUFFERS, n1) @ zk[:n1], atol=1e-12)
    np.testing.assert_allclose(got[n1:], _dense_noise_inverse(_TWO_BUFFERS, n2) @ zk[n1:], atol=1e-12)
  assert int(state.row) == n1 + n2
  assert int(state.segment_round) == n2


def test_noise_is_not_independent_gaussian():
  # The BLT stream differs from plain z after round 0 (guards against a no-op buffer update).
  specs = _specs(tf.float64)
  seed = base.initial_seed(5)
  rounds, _ = _stream(blt.BLTNoise(_TWO_BUFFERS), specs, seed, 3)
  z = _z_rows(specs, seed, range(3))
  np.testing.assert_allclose(rounds[0]['bias'], z[0]['bias'])
  assert not np.allclose(rounds[1]['bias'], z[1]['bias'])


def test_graph_mode_matches_eager():
  specs = _specs(tf.float32)
  noise = blt.BLTNoise(_TWO_BUFFERS)
  seed = base.initial_seed(9)

  @tf.function
  def two_rounds(state):
    first, state = noise.next(state, tf.constant(1.0))
    second, state = noise.next(state, tf.constant(1.0))
    return first, second, state

  graph_first, graph_second, _ = two_rounds(noise.initial_state(specs, seed))
  eager, _ = _stream(noise, specs, seed, 2)
  for key in specs:
    np.testing.assert_allclose(graph_first[key], eager[0][key], rtol=1e-6)
    np.testing.assert_allclose(graph_second[key], eager[1][key], rtol=1e-6)


def test_inside_tff_computation():
  tff = pytest.importorskip('tensorflow_federated')
  specs = collections.OrderedDict(w=tf.TensorSpec([5], tf.float32))
  noise = blt.BLTNoise(_APP_A_400)

  @tff.tensorflow.computation
  def init():
    return noise.initial_state(specs, base.initial_seed(21))

  @tff.tensorflow.computation(init.type_signature.result, np.float32)
  def step(state, stddev):
    z_hat, state = noise.next(state, stddev)
    return z_hat, state

  state = init()
  outputs = []
  for _ in range(4):
    z_hat, state = step(state, 1.0)
    outputs.append(np.asarray(z_hat['w'], np.float64))
  z = _z_rows(specs, base.initial_seed(21), range(4))
  expected = _dense_noise_inverse(_APP_A_400, 4) @ _stack(z, 'w')
  np.testing.assert_allclose(np.stack(outputs), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('bad', [None, 'blt', object()])
def test_rejects_non_blt_strategy(bad):
  with pytest.raises(ValueError, match='strategy'):
    blt.BLTNoise(bad)


def test_rejects_integer_specs():
  with pytest.raises(ValueError, match='value_specs'):
    blt.BLTNoise(_TWO_BUFFERS).initial_state([tf.TensorSpec([2], tf.int32)], base.initial_seed(0))
