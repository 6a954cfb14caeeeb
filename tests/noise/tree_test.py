"""Acceptance tests for `dp_ftrl_tff.noise.tree.TreeNoise`.

The streamed noise (fixed seed, stddev 1) must equal `TreeStrategy(variant).noise_matrix(n) @ Z`,
with Z's rows rebuilt independently by `standard_normal_row`, across restarts too (block-diagonal noise
matrices with consecutive z rows): float64 to ~1e-12, float32 to 1e-5 relative.
"""

import asyncio
import collections

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff.mechanisms import tree as tree_mechanism
from dp_ftrl_tff.noise import base, tree
from tests.testing import streams as stream_testing

pytestmark = pytest.mark.unit


def _stream(noise, specs, seed, segment_lengths, stddev=1.0):
  """The flattened stream [rounds, coords] of a tree noise run and its final state."""
  stream, state = stream_testing.run_stream(noise, specs, seed, segment_lengths, stddev=stddev,
                                            tf_function=True)
  return stream_testing.flat(stream), state


def _expected(efficient, specs, seed, segment_lengths):
  """blockdiag(TreeStrategy(variant).noise_matrix(m) per segment) @ Z, flattened; and #z rows."""
  strategy = tree_mechanism.TreeStrategy('efficient' if efficient else 'vanilla')
  expected, num_rows = stream_testing.expected_stream(strategy.noise_matrix, segment_lengths, specs,
                                                      seed)
  return stream_testing.flat(expected), num_rows


@pytest.mark.parametrize('efficient', [False, True])
@pytest.mark.parametrize('segment_lengths', [[37], [20, 17, 1]])
def test_stream_matches_noise_matrix_float64(efficient, segment_lengths):
  seed = base.initial_seed(1234)
  specs = stream_testing.value_specs(tf.float64)
  noise = tree.TreeNoise(use_efficient=efficient, max_rounds_per_tree=64)
  streamed, state = _stream(noise, specs, seed, segment_lengths)
  expected, num_rows = _expected(efficient, specs, seed, segment_lengths)
  np.testing.assert_allclose(streamed, expected, rtol=0, atol=1e-12)
  assert int(state.row) == num_rows  # every node row used once, none skipped or reused
  assert int(state.round) == segment_lengths[-1]


@pytest.mark.parametrize('efficient', [False, True])
def test_stream_matches_noise_matrix_float32(efficient):
  seed = base.initial_seed(7)
  specs = stream_testing.value_specs(tf.float32)
  segments = [45, 19]
  streamed, _ = _stream(tree.TreeNoise(use_efficient=efficient), specs, seed, segments)
  expected, _ = _expected(efficient, specs, seed, segments)
  assert streamed.dtype == np.float32
  assert np.max(np.abs(streamed - expected)) <= 1e-5 * np.max(np.abs(expected))


@pytest.mark.parametrize('efficient', [False, True])
def test_long_float32_stream_stays_accurate(efficient):
  # 2000 rounds reach height 10: float32 rounding must not build up over the tree.
  seed = base.initial_seed(21)
  specs = collections.OrderedDict(x=tf.TensorSpec([3], tf.float32))
  segments = [2000]
  noise = tree.TreeNoise(use_efficient=efficient, max_rounds_per_tree=2048)
  streamed, _ = _stream(noise, specs, seed, segments)
  expected, _ = _expected(efficient, specs, seed, segments)
  assert np.max(np.abs(streamed - expected)) <= 1e-5 * np.max(np.abs(expected))
  prefix_error = np.cumsum(streamed.astype(np.float64), axis=0) - np.cumsum(expected, axis=0)
  assert np.max(np.abs(prefix_error)) <= 1e-5 * np.max(np.abs(expected))


def test_stddev_scales_noise():
  seed = base.initial_seed(3)
  specs = stream_testing.value_specs(tf.float64)
  unit, _ = _stream(tree.TreeNoise(), specs, seed, [9])
  scaled, _ = _stream(tree.TreeNoise(), specs, seed, [9], stddev=2.5)
  np.testing.assert_allclose(scaled, 2.5 * unit, rtol=1e-12)


def test_prefix_noise_variance_matches_efficient_table():
  # Monte Carlo over coordinates: the accumulated noise after 25 rounds has variance 2.0495 and
  # after 32 rounds 0.5079 (Honaker weights of the DP-FTRL paper's App. B.1; it quotes 2.05 and 0.51
  # in App. D.3.1, docs/papers.md#dp-ftrl), vs 3 and 1 for vanilla.
  specs = collections.OrderedDict(x=tf.TensorSpec([20000], tf.float64))
  for efficient, at_25, at_32 in [(True, 2.0495, 0.5079), (False, 3.0, 1.0)]:
    streamed, _ = _stream(tree.TreeNoise(use_efficient=efficient), specs, base.initial_seed(11), [32])
    prefix = np.cumsum(streamed, axis=0)
    assert np.var(prefix[24]) == pytest.approx(at_25, rel=0.05)
    assert np.var(prefix[31]) == pytest.approx(at_32, rel=0.05)


def test_efficient_state_holds_only_live_levels():
  # After t rounds the live left siblings are the set bits of t, except the top height (3 for
  # max_rounds_per_tree=8), which is never replaced; a restart empties the stack.
  noise = tree.TreeNoise(use_efficient=True, max_rounds_per_tree=8)
  specs = stream_testing.value_specs(tf.float32)
  state = noise.initial_state(specs, base.initial_seed(0))
  depths, states = [], []
  for _ in range(8):
    _, state = noise.next(state, tf.constant(1.0))
    depths.append({int(leaf.shape[0]) for leaf in tf.nest.flatten(state.levels)})
    states.append(state)
  assert depths == [{1}, {1}, {2}, {1}, {2}, {2}, {3}, {0}]
  state = noise.restart(states[6])  # 3 live levels
  assert {int(leaf.shape[0]) for leaf in tf.nest.flatten(state.levels)} == {0}
  _, state = noise.next(state, tf.constant(1.0))
  assert {int(leaf.shape[0]) for leaf in tf.nest.flatten(state.levels)} == {1}


def test_too_many_rounds_fail():
  noise = tree.TreeNoise(max_rounds_per_tree=3)
  assert noise.num_levels == 2
  state = noise.initial_state(stream_testing.value_specs(tf.float32), base.initial_seed(0))
  for _ in range(3):
    _, state = noise.next(state, tf.constant(1.0))
  with pytest.raises(tf.errors.InvalidArgumentError, match='max_rounds_per_tree'):
    noise.next(state, tf.constant(1.0))


@pytest.mark.integration
def test_runs_inside_tff_computation():
  pytest.importorskip('tensorflow_federated')
  specs = stream_testing.value_specs(tf.float32)
  noise = tree.TreeNoise(use_efficient=True, max_rounds_per_tree=16)
  # The helper also checks that TFF keeps the TreeNoiseState container.
  stream, state, step = stream_testing.run_stream_in_tff(noise, specs, 5, [5, 3])
  # The stack of live levels has a dynamic depth in the TFF type: 2 levels after round 3.
  state_type = step.type_signature.parameter[0]
  assert [leaf_type.shape[0] for leaf_type in state_type.levels] == [None] * len(specs)
  assert [np.shape(leaf)[0] for leaf in tf.nest.flatten(state.levels)] == [2] * len(specs)
  expected, _ = _expected(True, specs, base.initial_seed(5), [5, 3])
  streamed = stream_testing.flat(stream)
  assert np.max(np.abs(streamed - expected)) <= 1e-5 * np.max(np.abs(expected))


@pytest.mark.integration
def test_dynamic_depth_state_checkpoint_round_trip(tmp_path):
  # The saved stack (2 live levels) is deeper than the template state (0 levels): the restored state
  # must carry the saved depth and continue the stream bit for bit.
  tff = pytest.importorskip('tensorflow_federated')
  specs = stream_testing.value_specs(tf.float32)
  noise = tree.TreeNoise(use_efficient=True, max_rounds_per_tree=16)
  _, state, step = stream_testing.run_stream_in_tff(noise, specs, 5, [3])
  manager = tff.program.FileProgramStateManager(tmp_path)
  asyncio.run(manager.save(state, 3))
  template = noise.initial_state(specs, base.initial_seed(5))
  restored = asyncio.run(manager.load(3, template))
  assert isinstance(restored, tree.TreeNoiseState)
  continued, _ = step(state, np.float32(1.0))
  resumed, _ = step(restored, np.float32(1.0))
  tf.nest.map_structure(np.testing.assert_array_equal, continued, resumed)


@pytest.mark.parametrize('kwargs, name', [
    ({'use_efficient': 1}, 'use_efficient'),
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
