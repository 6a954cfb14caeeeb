"""Acceptance tests for `dp_ftrl_tff.noise.tree.TreeNoise`.

The streamed noise (fixed seed, stddev 1) must equal `TreeStrategy(variant).noise_matrix(n) @ Z`,
with Z's rows rebuilt independently by `standard_normal_row`, across restarts too (block-diagonal noise
matrices with consecutive z rows): float64 to ~1e-12, float32 to 1e-5 relative.
"""

import collections

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from dp_ftrl_tff.mechanisms import tree as tree_mechanism
from dp_ftrl_tff.noise import base, tree


def _specs(dtype):
  return collections.OrderedDict(a=tf.TensorSpec([3], dtype), b=tf.TensorSpec([2, 2], dtype))


def _stream(noise, specs, seed, segment_lengths, stddev=1.0):
  """Runs the segments back to back, restarting between them: ([rounds, coords], final state)."""
  state = noise.initial_state(specs, seed)
  step = tf.function(noise.next)
  restart = tf.function(noise.restart)
  rows = []
  for index, length in enumerate(segment_lengths):
    if index:
      state = restart(state)
    for _ in range(length):
      value, state = step(state, tf.constant(stddev, tf.float64))
      rows.append(np.concatenate([np.reshape(v.numpy(), -1) for v in tf.nest.flatten(value)]))
  return np.stack(rows), state


def _expected(variant, specs, seed, segment_lengths):
  strategy = tree_mechanism.TreeStrategy(variant)
  matrix = scipy.linalg.block_diag(*[strategy.noise_matrix(m) for m in segment_lengths])
  z = np.stack([
      np.concatenate([np.reshape(v.numpy(), -1) for v in tf.nest.flatten(
          base.standard_normal_row(seed, tf.constant(r, tf.int64), specs))])
      for r in range(matrix.shape[1])
  ])
  return matrix @ z.astype(np.float64), matrix.shape[1]


@pytest.mark.parametrize('efficient', [False, True])
@pytest.mark.parametrize('segment_lengths', [[37], [20, 17, 1]])
def test_stream_matches_noise_matrix_float64(efficient, segment_lengths):
  seed = base.initial_seed(1234)
  specs = _specs(tf.float64)
  noise = tree.TreeNoise(efficient=efficient, max_rounds_per_tree=64)
  streamed, state = _stream(noise, specs, seed, segment_lengths)
  variant = 'efficient' if efficient else 'vanilla'
  expected, num_rows = _expected(variant, specs, seed, segment_lengths)
  np.testing.assert_allclose(streamed, expected, rtol=0, atol=1e-12)
  assert int(state.row) == num_rows  # every node row used once, none skipped or reused
  assert int(state.round) == segment_lengths[-1]


@pytest.mark.parametrize('efficient', [False, True])
def test_stream_matches_noise_matrix_float32(efficient):
  seed = base.initial_seed(7)
  specs = _specs(tf.float32)
  segments = [45, 19]
  streamed, _ = _stream(tree.TreeNoise(efficient=efficient), specs, seed, segments, stddev=1.0)
  expected, _ = _expected('efficient' if efficient else 'vanilla', specs, seed, segments)
  assert streamed.dtype == np.float32
  assert np.max(np.abs(streamed - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_stddev_scales_noise():
  seed = base.initial_seed(3)
  specs = _specs(tf.float64)
  unit, _ = _stream(tree.TreeNoise(), specs, seed, [9])
  scaled, _ = _stream(tree.TreeNoise(), specs, seed, [9], stddev=2.5)
  np.testing.assert_allclose(scaled, 2.5 * unit, rtol=1e-12)


def test_prefix_noise_variance_matches_efficient_table():
  # Monte Carlo over coordinates: the accumulated noise after 25 rounds has variance 2.0495 and
  # after 32 rounds 0.5079 (seed002 Sec. 4.2), vs 3 and 1 for vanilla.
  specs = collections.OrderedDict(x=tf.TensorSpec([20000], tf.float64))
  for efficient, at_25, at_32 in [(True, 2.0495, 0.5079), (False, 3.0, 1.0)]:
    streamed, _ = _stream(tree.TreeNoise(efficient=efficient), specs, base.initial_seed(11), [32])
    prefix = np.cumsum(streamed, axis=0)
    assert np.var(prefix[24]) == pytest.approx(at_25, rel=0.05)
    assert np.var(prefix[31]) == pytest.approx(at_32, rel=0.05)


def test_too_many_rounds_fail():
  noise = tree.TreeNoise(max_rounds_per_tree=3)
  assert noise.num_levels == 2
  state = noise.initial_state(_specs(tf.float32), base.initial_seed(0))
  for _ in range(3):
    _, state = noise.next(state, tf.constant(1.0))
  with pytest.raises(tf.errors.InvalidArgumentError, match='max_rounds_per_tree'):
    noise.next(state, tf.constant(1.0))


def test_runs_inside_tff_computation():
  tff = pytest.importorskip('tensorflow_federated')
  specs = _specs(tf.float32)
  noise = tree.TreeNoise(efficient=True, max_rounds_per_tree=16)

  @tff.tensorflow.computation
  def init_fn():
    return noise.initial_state(specs, base.initial_seed(5))

  @tff.tensorflow.computation(init_fn.type_signature.result)
  def next_fn(state):
    assert isinstance(state, tree.TreeNoiseState)  # TFF keeps the NamedTuple container
    value, state = noise.next(state, tf.constant(1.0))
    return value, state

  @tff.tensorflow.computation(init_fn.type_signature.result)
  def restart_fn(state):
    return noise.restart(state)

  state = init_fn()
  rows = []
  for length_index, length in enumerate([5, 3]):
    if length_index:
      state = restart_fn(state)
    for _ in range(length):
      value, state = next_fn(state)
      rows.append(np.concatenate([np.reshape(value['a'], -1), np.reshape(value['b'], -1)]))
  expected, _ = _expected('efficient', specs, base.initial_seed(5), [5, 3])
  assert np.max(np.abs(np.stack(rows) - expected)) <= 1e-5 * np.max(np.abs(expected))


@pytest.mark.parametrize('kwargs, name', [
    ({'efficient': 1}, 'efficient'),
    ({'max_rounds_per_tree': 0}, 'max_rounds_per_tree'),
])
def test_invalid_arguments_raise(kwargs, name):
  with pytest.raises(ValueError, match=name):
    tree.TreeNoise(**kwargs)


def test_invalid_specs_raise():
  with pytest.raises(ValueError, match='value_specs'):
    tree.TreeNoise().initial_state([tf.TensorSpec([None], tf.float32)], base.initial_seed(0))
  with pytest.raises(ValueError, match='value_specs'):
    tree.TreeNoise().initial_state([tf.TensorSpec([2], tf.int32)], base.initial_seed(0))
