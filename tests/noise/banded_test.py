"""Tests for the banded streaming noise (BandMF Alg. 9) against dense C^-1 @ Z."""

import collections

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from dp_ftrl_tff.noise import banded, base


def _random_strategy(n, bands, seed=0):
  rng = np.random.default_rng(seed)
  c = np.tril(rng.uniform(-1, 1, size=(n, n)), -1) / bands
  c *= np.subtract.outer(np.arange(n), np.arange(n)) < bands
  c[np.diag_indices(n)] = 0.5 + rng.uniform(size=n)
  return banded_mechanisms.BandedStrategy(c), c


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
    out, state = noise.next(state, tf.constant(stddev, tf.float32))
    rounds.append(tf.nest.map_structure(lambda x: np.asarray(x, np.float64), out))
  return rounds, state


def _z_rows(specs, seed, rows):
  """Z[r] for each r, rebuilt from `standard_normal_row`, float64."""
  return [tf.nest.map_structure(lambda x: np.asarray(x, np.float64),
                                base.standard_normal_row(seed, tf.constant(r, tf.int64), specs))
          for r in rows]


def _stack(rounds, key):
  return np.stack([r[key].reshape(-1) for r in rounds])


def _dense_noise(c, z_stack):
  """C^-1 Z by a dense triangular solve (independent of the streaming recurrence)."""
  return scipy.linalg.solve_triangular(c, z_stack, lower=True)


@pytest.mark.parametrize('bands', [1, 2, 5, 12])
def test_float64_stream_equals_noise_matrix_times_z(bands):
  n = 12
  strategy, c = _random_strategy(n, bands, seed=bands)
  specs = _specs(tf.float64)
  seed = base.initial_seed(7)
  rounds, state = _stream(banded.BandedNoise(strategy), specs, seed, n)
  z = _z_rows(specs, seed, range(n))
  for key in specs:
    np.testing.assert_allclose(_stack(rounds, key), strategy.noise_matrix(n) @ _stack(z, key),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_stack(rounds, key), _dense_noise(c, _stack(z, key)), rtol=1e-12,
                               atol=1e-12)
  assert int(state.row) == n and int(state.segment_round) == n
  assert state.buffers['kernel'].shape == (bands - 1, 3, 2)


def test_float32_stream_matches_within_1e5_and_scales_with_stddev():
  n, bands = 60, 9
  strategy, c = _random_strategy(n, bands, seed=3)
  specs = _specs(tf.float32)
  seed = base.initial_seed(11)
  rounds, _ = _stream(banded.BandedNoise(strategy), specs, seed, n, stddev=2.5)
  z = _z_rows(specs, seed, range(n))
  for key in specs:
    expected = 2.5 * _dense_noise(c, _stack(z, key))
    got = _stack(rounds, key)
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_optimized_strategy_stream():
  n = 30
  result = banded_mechanisms.optimize_banded(
      n, 6, ParticipationSchema.min_separation(6, 5))
  specs = collections.OrderedDict(w=tf.TensorSpec([7], tf.float64))
  seed = base.initial_seed(5)
  rounds, _ = _stream(banded.BandedNoise(result.strategy), specs, seed, n)
  z = _z_rows(specs, seed, range(n))
  expected = _dense_noise(result.strategy.strategy_matrix(n), _stack(z, 'w'))
  np.testing.assert_allclose(_stack(rounds, 'w'), expected, rtol=1e-12, atol=1e-12)


def test_error_beyond_max_rounds():
  strategy, _ = _random_strategy(4, 2)
  noise = banded.BandedNoise(strategy)
  _, state = _stream(noise, _specs(tf.float32), base.initial_seed(1), 4)
  with pytest.raises(tf.errors.InvalidArgumentError, match='built for 4 rounds'):
    noise.next(state, tf.constant(1.0))

  @tf.function
  def step(state):
    return noise.next(state, tf.constant(1.0))

  with pytest.raises(tf.errors.InvalidArgumentError, match='built for 4 rounds'):
    step(state)


def test_beyond_max_rounds_restart_starts_new_segment():
  n, bands = 5, 3
  strategy, c = _random_strategy(n, bands, seed=4)
  specs = _specs(tf.float64)
  seed = base.initial_seed(3)
  rounds, state = _stream(banded.BandedNoise(strategy, beyond_max_rounds='restart'), specs, seed,
                          12)
  z = _z_rows(specs, seed, range(12))
  for key in specs:
    zs = _stack(z, key)
    expected = np.concatenate([_dense_noise(c, zs[0:5]), _dense_noise(c, zs[5:10]),
                               _dense_noise(c[:2, :2], zs[10:12])])
    np.testing.assert_allclose(_stack(rounds, key), expected, rtol=1e-12, atol=1e-12)
  assert int(state.row) == 12 and int(state.segment_round) == 2


def test_beyond_max_rounds_restart_in_graph_mode_matches_eager():
  strategy, _ = _random_strategy(3, 2, seed=12)
  noise = banded.BandedNoise(strategy, beyond_max_rounds='restart')
  specs = _specs(tf.float32)
  seed = base.initial_seed(2)
  step = tf.function(lambda state: noise.next(state, tf.constant(1.0)))
  state = noise.initial_state(specs, seed)
  eager, _ = _stream(noise, specs, seed, 7)
  for t in range(7):
    out, state = step(state)
    for key in specs:
      np.testing.assert_allclose(out[key], eager[t][key], rtol=1e-6, atol=1e-7)
  assert int(state.segment_round) == 1


def test_restart_zeroes_buffers_and_rows_keep_counting():
  n, bands = 8, 4
  strategy, c = _random_strategy(n, bands, seed=6)
  specs = _specs(tf.float64)
  seed = base.initial_seed(13)
  rounds, state = _stream(banded.BandedNoise(strategy), specs, seed, 9, restart_at=(3,))
  z = _z_rows(specs, seed, range(9))
  for key in specs:
    zs = _stack(z, key)
    expected = np.concatenate([_dense_noise(c[:3, :3], zs[:3]), _dense_noise(c[:6, :6], zs[3:])])
    np.testing.assert_allclose(_stack(rounds, key), expected, rtol=1e-12, atol=1e-12)
  assert int(state.row) == 9 and int(state.segment_round) == 6


def test_graph_mode_matches_eager():
  strategy, _ = _random_strategy(6, 3, seed=8)
  noise = banded.BandedNoise(strategy)
  specs = _specs(tf.float32)
  seed = base.initial_seed(9)

  @tf.function
  def three_rounds(state):
    outs = []
    for _ in range(3):
      out, state = noise.next(state, tf.constant(1.0))
      outs.append(out)
    return outs, state

  graph, _ = three_rounds(noise.initial_state(specs, seed))
  eager, _ = _stream(noise, specs, seed, 3)
  for t in range(3):
    for key in specs:
      np.testing.assert_allclose(graph[t][key], eager[t][key], rtol=1e-6, atol=1e-7)


def test_inside_tff_computation():
  tff = pytest.importorskip('tensorflow_federated')
  strategy, c = _random_strategy(6, 3, seed=10)
  specs = collections.OrderedDict(w=tf.TensorSpec([5], tf.float32))
  noise = banded.BandedNoise(strategy)

  @tff.tensorflow.computation
  def init():
    return noise.initial_state(specs, base.initial_seed(21))

  @tff.tensorflow.computation(init.type_signature.result, np.float32)
  def step(state, stddev):
    out, state = noise.next(state, stddev)
    return out, state

  state = init()
  outputs = []
  for _ in range(6):
    out, state = step(state, 1.0)
    outputs.append(np.asarray(out['w'], np.float64))
  z = _z_rows(specs, base.initial_seed(21), range(6))
  np.testing.assert_allclose(np.stack(outputs), _dense_noise(c, _stack(z, 'w')), rtol=1e-5,
                             atol=1e-6)
  with pytest.raises(Exception, match='built for 6 rounds'):
    step(state, 1.0)


@pytest.mark.parametrize('bad', [None, 'banded', np.eye(3)])
def test_rejects_non_banded_strategy(bad):
  with pytest.raises(ValueError, match='strategy'):
    banded.BandedNoise(bad)


def test_rejects_bad_arguments():
  strategy, _ = _random_strategy(4, 2)
  with pytest.raises(ValueError, match='beyond_max_rounds'):
    banded.BandedNoise(strategy, beyond_max_rounds='wrap')
  with pytest.raises(ValueError, match='value_specs'):
    banded.BandedNoise(strategy).initial_state([tf.TensorSpec([2], tf.int32)], base.initial_seed(0))
