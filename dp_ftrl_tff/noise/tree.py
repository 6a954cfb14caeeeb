"""Streaming tree-aggregation noise (vanilla and Honaker-efficient) in TensorFlow.

Generates round after round the residual of the noisy prefix sums of the binary-tree mechanism
(DP-FTRL paper, Kairouz et al. 2021, App. B.1, B.3 and D.1; docs/papers.md#dp-ftrl): round t's noise
is stddev * (b_t - b_{t-1}) with b_t the noise of the prefix sum over rounds 0..t, so the noise the
server model accumulates after round t is b_t. `TreeStrategy(variant).noise_matrix(n) @ Z`
(`dp_ftrl_tff.mechanisms.tree`) reproduces it exactly.

Row numbering of z: the tree's nodes in `mechanisms.tree.tree_nodes` order (by last round, then
height). Round t (0-based within a tree) completes the nodes of heights 0 .. h, h = ctz(t + 1);
the node of height j uses row R + j, where R is the state's `row` at the start of the round, and the
round advances `row` by h + 1 (so R = 2 t - popcount(t) plus the rows of earlier trees). Round t
replaces the left siblings of heights j < h (bits 0 .. h-1 of t are all set); the one of height j
ended at round t - 2^j, so its row is R + 1 + j - 2^(j + 1). `restart` starts a fresh tree (round 0)
and rows keep counting: no z row is ever reused. No tree completion is done at a restart.

Per-round cost (h = ctz(t + 1) is 1 on average over rounds). In TFF the state crosses the executor
twice a round, so its size, not the TF work, dominates the round time (docs/benchmarks/aggregators.md):
  * vanilla: round t's noise is z[R + h] minus the h replaced left siblings, drawn again from the
    seed (row formula above). The state stores no model-sized tensor; a round costs h + 1 draws.
  * efficient: Honaker's r' = z + (r'_left + r'_right) / 2 of a node needs its whole subtree, so the
    state stores the r' of the live left siblings only: the heights of the set bits of `round`, in
    ascending height order, stacked in one tensor of dynamic leading dimension per leaf of the value
    structure (TFF type [None, *shape]; one stacked tensor moves through TFF faster than one tensor
    per level). A round reads and pops the h lowest entries (heights 0 .. h - 1, the replaced
    siblings) and pushes the new node, so the state holds popcount(round) model copies (the node of
    the top height is never replaced within a tree, so it is not pushed). A round draws h + 1 rows.
The noise is computed from the nodes themselves (no running sum), so float32 rounding does not build
up over a long tree.
"""

from typing import Any, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import tree as tree_mechanisms
from dp_ftrl_tff.noise import base


class TreeNoiseState(NamedTuple):
  """State of `TreeNoise`.

  Attributes:
    seed: int64[2] seed of the z rows.
    round: int64 scalar, the number of rounds done in the current tree (the next 0-based round).
    row: int64 scalar, the next unused row of z.
    levels: structure like the value specs, each leaf of shape [num_stored, *value_shape]
      (efficient: num_stored = popcount(round) in a dynamic leading dimension, the TFF type is
      [None, *value_shape]; row i holds Honaker's r' of the left sibling of the i-th lowest set bit
      of `round`, not counting the top height; vanilla: num_stored = 0, the leaves only carry the
      value shapes and dtypes).
  """
  seed: Any
  round: Any
  row: Any
  levels: Any


def _dynamic_depth(buffer: tf.Tensor) -> tf.Tensor:
  """`buffer` [depth, *shape] with its leading dimension unknown to tracing (TFF type [None, ...]).

  The efficient tree's stack changes depth every round; a traced `initial_state` must already have
  the type that `next` returns.
  """
  return tf.compat.v1.placeholder_with_default(buffer, [None] + buffer.shape.as_list()[1:])


def _trailing_zeros(x: tf.Tensor) -> tf.Tensor:
  """ctz(x) for an int64 scalar x > 0: popcount of the bits below the lowest set bit."""
  lowest = tf.bitwise.bitwise_and(x, -x)
  return tf.cast(tf.raw_ops.PopulationCount(x=lowest - 1), tf.int64)


class TreeNoise(base.StreamingNoise):
  """Tree-aggregation residual noise: vanilla binary counter or Honaker efficient (stack form).

  Args:
    use_efficient: True for Honaker's streaming estimator (`TreeStrategy('efficient')`), False for the
      vanilla tree (`TreeStrategy('vanilla')`).
    max_rounds_per_tree: the most rounds one tree may run before a restart; fixes the number of
      levels to its bit length. Running a tree longer fails an assertion.
  """

  def __init__(self, use_efficient: bool = True, max_rounds_per_tree: int = 2**15):
    if not isinstance(use_efficient, bool):
      raise ValueError(f'`use_efficient` must be a bool, got {use_efficient!r}.')
    self._efficient = use_efficient
    self._max_rounds = _validation.check_positive_int(max_rounds_per_tree, 'max_rounds_per_tree')
    self._num_levels = self._max_rounds.bit_length()
    # Honaker weight of a node of height l: its estimate is r' / (2 - 2^-l).
    self._level_weights = 1.0 / (2.0 - 2.0**-np.arange(self._num_levels))

  @classmethod
  def from_strategy(cls, strategy: tree_mechanisms.TreeStrategy, *,
                    max_segment_rounds: Optional[int] = None,
                    beyond_max_rounds: str = 'error') -> 'TreeNoise':
    """The stream of a vanilla or efficient `TreeStrategy`; trees of up to `max_segment_rounds`
    rounds (2^15 when None). `beyond_max_rounds` does not apply (a tree streams for any n)."""
    del beyond_max_rounds
    if not isinstance(strategy, tree_mechanisms.TreeStrategy) or strategy.variant == 'full':
      raise ValueError(f'`strategy` must be a vanilla or efficient TreeStrategy, got {strategy!r}.')
    return cls(use_efficient=strategy.variant == 'efficient',
               max_rounds_per_tree=max_segment_rounds or 2**15)

  @property
  def use_efficient(self) -> bool:
    return self._efficient

  @property
  def num_levels(self) -> int:
    return self._num_levels

  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> TreeNoiseState:
    base.check_value_specs(value_specs)
    levels = base.zero_buffers(value_specs, 0)
    if self._efficient:
      levels = tf.nest.map_structure(_dynamic_depth, levels)
    return TreeNoiseState(seed=tf.convert_to_tensor(seed, tf.int64),
                          round=tf.constant(0, tf.int64), row=tf.constant(0, tf.int64),
                          levels=levels)

  def next(self, state: TreeNoiseState, stddev: tf.Tensor) -> Tuple[Any, TreeNoiseState]:
    specs = base.buffer_row_specs(state.levels)
    tree_round = base.assert_less(
        state.round, self._max_rounds,
        'TreeNoise: the tree ran more rounds than `max_rounds_per_tree`; restart it.')
    height = _trailing_zeros(tree_round + 1)
    if self._efficient:
      new, levels = self._efficient_step(state, height, specs)
    else:
      new, levels = self._vanilla_step(state, height, specs), state.levels
    noise = tf.nest.map_structure(lambda x: x * tf.cast(stddev, x.dtype), new)
    return noise, state._replace(round=state.round + 1, row=state.row + height + 1, levels=levels)

  def _vanilla_step(self, state: TreeNoiseState, height: tf.Tensor, specs: Any) -> Any:
    """z[R + h] minus the replaced left siblings z[R + 1 + j - 2^(j + 1)], j < h."""

    def body(level, value):
      sibling_row = state.row + 1 + level - tf.bitwise.left_shift(tf.constant(2, tf.int64), level)
      sibling = base.standard_normal_row(state.seed, sibling_row, specs)
      return level + 1, tf.nest.map_structure(tf.subtract, value, sibling)

    _, value = tf.while_loop(
        lambda level, _: level < height, body,
        (tf.constant(0, tf.int64), base.standard_normal_row(state.seed, state.row + height, specs)))
    return value

  def _efficient_step(self, state: TreeNoiseState, height: tf.Tensor, specs: Any):
    """(w_h r'_new - sum_{j < h} w_j r'_j, levels with r'_new at height h); w_l = 1 / (2 - 2^-l).

    r'_new is built up the right spine: the leaf z[R], then at each height j + 1 <= h,
    z[R + j + 1] + (r'_j + spine) / 2.
    """

    def climb(level, spine):
      z = base.standard_normal_row(state.seed, state.row + level + 1, specs)
      spine = tf.nest.map_structure(
          lambda z_l, levels, right: z_l + (tf.gather(levels, level) + right) / 2, z, state.levels,
          spine)
      return level + 1, spine

    _, spine = tf.while_loop(lambda level, _: level < height, climb,
                             (tf.constant(0, tf.int64), base.standard_normal_row(
                                 state.seed, state.row, specs)))

    def residual(node, levels):
      weights = tf.constant(self._level_weights, node.dtype)
      replaced = tf.tensordot(weights[:height], levels[:height], axes=1)
      return node * weights[height] - replaced

    new = tf.nest.map_structure(residual, spine, state.levels)
    # Pop the h replaced siblings, push the new node unless it has the top height (never replaced).
    pushed = tf.minimum(tf.constant(self._num_levels - 1, tf.int64) - height, 1)
    levels = tf.nest.map_structure(
        lambda levels, node: tf.concat([node[tf.newaxis][:pushed], levels[height:]], axis=0),
        state.levels, spine)
    return new, levels

  def restart(self, state: TreeNoiseState) -> TreeNoiseState:
    levels = state.levels
    if self._efficient:  # Empty the stack.
      levels = tf.nest.map_structure(lambda buffer: _dynamic_depth(buffer[:0]), levels)
    return state._replace(round=tf.zeros_like(state.round), levels=levels)
