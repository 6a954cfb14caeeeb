"""Streaming tree-aggregation noise (vanilla and Honaker-efficient) in TensorFlow.

Generates round after round the residual of the noisy prefix sums of the binary-tree mechanism
(DP-FTRL, Kairouz et al. 2021, App. B.1 and B.3; notes/seed002.md Sec. 4.1-4.4): round t's noise
is stddev * (b_t - b_{t-1}) with b_t the noise of the prefix sum over rounds 0..t, so the noise the
server model accumulates after round t is b_t. `TreeStrategy(variant).noise_matrix(n) @ Z`
(`dp_ftrl_tff.mechanisms.tree`) reproduces it exactly.

Row numbering of z: the tree's nodes in `mechanisms.tree.tree_nodes` order (by last round, then
height). Round t (0-based within a tree) completes the nodes of heights 0 .. h, h = ctz(t + 1);
the node of height j uses row R + j, where R is the state's `row` at the start of the round, and the
round advances `row` by h + 1 (so R = 2 t - popcount(t) plus the rows of earlier trees). The
vanilla tree draws only row R + h (the lower nodes are never used by its decoder); the efficient
tree draws all of rows R .. R + h. `restart` starts a fresh tree (round 0, cleared levels) and rows
keep counting: no z row is ever reused. No tree completion is done at a restart.

State memory: one stored node per level, `num_levels` = max_rounds_per_tree.bit_length() copies of
the value structure (the vanilla tree stores node noises z, the efficient one Honaker's r' values).
"""

from typing import Any, NamedTuple, Tuple

import numpy as np
import tensorflow as tf

from dp_ftrl_tff import _validation
from dp_ftrl_tff.noise import base


class TreeNoiseState(NamedTuple):
  """State of `TreeNoise`.

  Attributes:
    seed: int64[2] seed of the z rows.
    round: int64 scalar, the number of rounds done in the current tree (the next 0-based round).
    row: int64 scalar, the next unused row of z.
    levels: structure like the value specs, each leaf of shape [num_levels, *value_shape]: the
      stored left-sibling node of each height (vanilla: z; efficient: r' = z + (r'_left + r'_right) / 2).
      Only the heights of the set bits of `round` hold live values.
  """
  seed: Any
  round: Any
  row: Any
  levels: Any


def _trailing_zeros(x: tf.Tensor) -> tf.Tensor:
  """ctz(x) for an int64 scalar x > 0: popcount of the bits below the lowest set bit."""
  lowest = tf.bitwise.bitwise_and(x, -x)
  return tf.cast(tf.raw_ops.PopulationCount(x=lowest - 1), tf.int64)


class TreeNoise(base.StreamingNoise):
  """Tree-aggregation residual noise: vanilla binary counter or Honaker efficient (stack form).

  Args:
    efficient: True for Honaker's streaming estimator (`TreeStrategy('efficient')`), False for the
      vanilla tree (`TreeStrategy('vanilla')`).
    max_rounds_per_tree: the most rounds one tree may run before a restart; fixes the number of
      stored levels to its bit length (fixed-shape state for TFF). Running a tree longer fails an
      assertion.
  """

  def __init__(self, efficient: bool = True, max_rounds_per_tree: int = 2**15):
    if not isinstance(efficient, bool):
      raise ValueError(f'`efficient` must be a bool, got {efficient!r}.')
    self._efficient = efficient
    self._max_rounds = _validation.check_positive_int(max_rounds_per_tree, 'max_rounds_per_tree')
    self._num_levels = self._max_rounds.bit_length()
    # Honaker weight of a stored node of height l: its estimate is r' / (2 - 2^-l).
    self._level_weights = 1.0 / (2.0 - 2.0**-np.arange(self._num_levels))

  @property
  def efficient(self) -> bool:
    return self._efficient

  @property
  def num_levels(self) -> int:
    return self._num_levels

  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> TreeNoiseState:
    base.check_value_specs(value_specs)
    return TreeNoiseState(seed=tf.convert_to_tensor(seed, tf.int64),
                          round=tf.constant(0, tf.int64), row=tf.constant(0, tf.int64),
                          levels=base.zero_buffers(value_specs, self._num_levels))

  def next(self, state: TreeNoiseState, stddev: tf.Tensor) -> Tuple[Any, TreeNoiseState]:
    specs = base.buffer_row_specs(state.levels)
    check = tf.debugging.assert_less(
        state.round, tf.constant(self._max_rounds, tf.int64),
        message='TreeNoise: the tree ran more rounds than `max_rounds_per_tree`; restart it.')
    with tf.control_dependencies([check]):
      height = _trailing_zeros(state.round + 1)
    if self._efficient:
      node = self._efficient_node(state, height, specs)
    else:
      node = base.standard_normal_row(state.seed, state.row + height, specs)

    def residual(node_value, levels):
      weights = tf.constant(self._level_weights if self._efficient else
                            np.ones(self._num_levels), levels.dtype)
      merged = tf.tensordot(weights[:height], levels[:height], axes=1)  # the nodes node replaces
      new = node_value * weights[height] - merged
      return new * tf.cast(stddev, levels.dtype)

    noise = tf.nest.map_structure(residual, node, state.levels)
    levels = tf.nest.map_structure(
        lambda levels, value: tf.tensor_scatter_nd_update(levels, [[height]], value[tf.newaxis]),
        state.levels, node)
    return noise, state._replace(round=state.round + 1, row=state.row + height + 1, levels=levels)

  def _efficient_node(self, state: TreeNoiseState, height: tf.Tensor, specs: Any) -> Any:
    """r' of the node of height `height` ending this round: rows row .. row + height."""
    leaf = base.standard_normal_row(state.seed, state.row, specs)

    def body(level, value):
      z = base.standard_normal_row(state.seed, state.row + level + 1, specs)
      value = tf.nest.map_structure(
          lambda z_l, left, right: z_l + (tf.gather(left, level) + right) / 2, z, state.levels,
          value)
      return level + 1, value

    _, node = tf.while_loop(lambda level, _: level < height, body,
                            (tf.constant(0, tf.int64), leaf))
    return node

  def restart(self, state: TreeNoiseState) -> TreeNoiseState:
    return state._replace(round=tf.zeros_like(state.round),
                          levels=tf.nest.map_structure(tf.zeros_like, state.levels))
