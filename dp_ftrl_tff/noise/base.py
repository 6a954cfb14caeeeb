"""Common interface and randomness of the streaming noise states (TensorFlow).

A noise state generates, round after round, the correlated noise sigma * zeta * (M z)_t of a strategy
(`dp_ftrl_tff.mechanisms.base.Strategy.noise_matrix`) on a nested structure of tensors shaped like the
model update. The state is a nested structure of tensors (a NamedTuple), so it lives inside the TFF
aggregator state and checkpoints with it.

Randomness is stateless and counter based: row r of z (one standard normal draw per model coordinate)
is `standard_normal_row(seed, r, value_specs)`, a pure function of the int64[2] seed and the row index.
Tests rebuild z in numpy with the same function and compare against dense matrix math.

Also holds the value-structure helpers the buffered states share: `check_value_specs`, `zero_buffers`
(stacked per-leaf buffers of the tree, banded and BLT states) and `buffer_row_specs`, and
`BufferedNoise`, the common part of the streams for any n whose state is a seed, a row and buffers.
"""

import abc
from typing import Any, ClassVar, Optional, Tuple

import numpy as np
import tensorflow as tf

SEED_SHAPE = (2,)


def check_noise_seed(noise_seed) -> Optional[int]:
  """`noise_seed` as an int in [0, 2^63) (it becomes an int64 seed), or None."""
  if noise_seed is None:
    return None
  if isinstance(noise_seed, bool) or not isinstance(noise_seed, (int, np.integer)):
    raise ValueError(f'`noise_seed` must be an int or None, got {noise_seed!r}.')
  if not 0 <= int(noise_seed) < 2**63:
    raise ValueError(f'`noise_seed` must lie in [0, 2**63) (an int64), got {noise_seed}.')
  return int(noise_seed)


def initial_seed(noise_seed: Optional[int]) -> tf.Tensor:
  """An int64[2] seed tensor: fixed from `noise_seed`, or fresh from OS entropy when it is None.

  Call inside a TF computation: with `noise_seed=None`, each execution draws a new seed.
  """
  noise_seed = check_noise_seed(noise_seed)
  if noise_seed is None:
    return tf.random.uniform(SEED_SHAPE, minval=tf.int64.min, maxval=tf.int64.max, dtype=tf.int64)
  return tf.constant([0, int(noise_seed)], dtype=tf.int64)


def standard_normal_row(seed: tf.Tensor, row: tf.Tensor, value_specs: Any) -> Any:
  """Row `row` of z: iid N(0, 1) draws, one structure shaped like `value_specs`.

  Args:
    seed: int64[2] tensor.
    row: scalar integer tensor, the row index r of z (a round for matrix factorizations, a tree node for
      trees; each noise state documents its numbering).
    value_specs: nested structure of `tf.TensorSpec` (floating dtypes).

  Returns:
    A structure like `value_specs`, each leaf drawn from N(0, 1) in the leaf's dtype.
  """
  row_seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(row, tf.int64))
  leaves = tf.nest.flatten(value_specs)
  draws = [
      tf.random.stateless_normal(spec.shape, seed=tf.random.experimental.stateless_fold_in(
          row_seed, leaf_index), dtype=spec.dtype)
      for leaf_index, spec in enumerate(leaves)
  ]
  return tf.nest.pack_sequence_as(value_specs, draws)


def assert_less(x: tf.Tensor, limit: int, message: str) -> tf.Tensor:
  """`x`, after a check that fails the round with `tf.errors.InvalidArgumentError(message)` unless
  x < limit.

  One `Assert` op: `tf.debugging.assert_less` wraps its check in a `cond` (an `If` op with two
  function branches), which TFF's worker instantiates every round (docs/benchmarks/aggregators.md).
  """
  check = tf.raw_ops.Assert(condition=tf.less(x, tf.constant(limit, x.dtype)),
                            data=[tf.constant(message)])
  with tf.control_dependencies([check]):
    return tf.identity(x)


def check_value_specs(value_specs: Any) -> None:
  """Raises ValueError unless `value_specs` holds at least one `tf.TensorSpec`, all of them of fully
  defined shape and floating dtype."""
  leaves = tf.nest.flatten(value_specs)
  if not leaves:
    raise ValueError('`value_specs` must hold at least one tf.TensorSpec.')
  for spec in leaves:
    if not isinstance(spec, tf.TensorSpec) or not spec.dtype.is_floating or (
        not spec.shape.is_fully_defined()):
      raise ValueError(f'`value_specs` must be tf.TensorSpecs of fully defined shape and floating '
                       f'dtype, got {spec!r}.')


def zero_buffers(value_specs: Any, depth: int) -> Any:
  """`depth` stacked zero copies of each leaf: a structure like `value_specs` of [depth, *shape]."""
  return tf.nest.map_structure(lambda spec: tf.zeros([depth] + spec.shape.as_list(), spec.dtype),
                               value_specs)


def buffer_row_specs(buffers: Any) -> Any:
  """The value specs of one row of stacked buffers (leaves [depth, *shape] -> TensorSpec(shape))."""
  return tf.nest.map_structure(lambda b: tf.TensorSpec(b.shape[1:], b.dtype), buffers)


class StreamingNoise(abc.ABC):
  """A streaming correlated-noise generator. Subclasses: one module per kind in this package.

  Objects hold static mechanism parameters (Python / numpy floats) and build TF ops in their methods,
  so they can be called inside `tff.tensorflow.computation`s.
  """

  @classmethod
  @abc.abstractmethod
  def from_strategy(cls, strategy, *, max_segment_rounds: Optional[int] = None,
                    beyond_max_rounds: str = 'error') -> 'StreamingNoise':
    """The stream of `strategy` (the uniform constructor `mechanisms.registry` callers use).

    Args:
      strategy: the `dp_ftrl_tff.mechanisms` strategy of this noise class.
      max_segment_rounds: the longest segment between restarts, or None (unbounded); sizes the state
        of streams whose state grows with the segment (trees).
      beyond_max_rounds: for strategies built for a fixed n (banded): 'error' or 'restart'.
    """

  @abc.abstractmethod
  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> Any:
    """The state before round 0 for updates shaped like `value_specs` (nested `tf.TensorSpec`)."""

  @abc.abstractmethod
  def next(self, state: Any, stddev: tf.Tensor) -> Tuple[Any, Any]:
    """(noise, new_state): the next round's noise, scaled by `stddev` = sigma * zeta."""

  @abc.abstractmethod
  def restart(self, state: Any) -> Any:
    """A state that starts a fresh mechanism segment (new tree / banded / BLT stream), same seed
    lineage: rows keep counting so no z row is ever reused."""

  def segment_ended(self, state: Any) -> tf.Tensor:
    """bool tensor: the stream cannot continue its segment and must `restart` before its next round
    (a banded strategy at its last round with `beyond_max_rounds='restart'`). False by default."""
    del state
    return tf.constant(False)


class BufferedNoise(StreamingNoise):
  """A stream for any number of rounds whose state is (seed, row, buffers): `num_buffers` stacked
  copies of each leaf, zero at the start of every segment, while the rows of z keep counting.

  Subclasses name the strategy they stream (`strategy_class`) and their state (`state_class`, a
  NamedTuple with the fields seed, row and buffers) and give `num_buffers` and `next`.
  """
  strategy_class: ClassVar[type]
  state_class: ClassVar[type]

  def __init__(self, strategy):
    if not isinstance(strategy, self.strategy_class):
      raise ValueError(f'`strategy` must be a {self.strategy_class.__name__}, got {strategy!r}.')
    self._strategy = strategy

  @classmethod
  def from_strategy(cls, strategy, *, max_segment_rounds: Optional[int] = None,
                    beyond_max_rounds: str = 'error') -> 'BufferedNoise':
    """The stream of `strategy` (it streams for any n: the other arguments do not apply)."""
    del max_segment_rounds, beyond_max_rounds
    return cls(strategy)

  @property
  def strategy(self):
    """The strategy this stream draws from (an instance of `strategy_class`)."""
    return self._strategy

  @property
  @abc.abstractmethod
  def num_buffers(self) -> int:
    """How many stacked copies of each leaf the state holds."""

  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> Any:
    """Zero buffers for updates shaped like `value_specs` (nested `tf.TensorSpec`, floating dtypes)."""
    check_value_specs(value_specs)
    zero = tf.constant(0, tf.int64)
    return self.state_class(seed=tf.convert_to_tensor(seed, tf.int64), row=zero,
                            buffers=zero_buffers(value_specs, self.num_buffers))

  def restart(self, state: Any) -> Any:
    """A fresh segment: zero buffers; z rows keep counting."""
    return state._replace(buffers=tf.nest.map_structure(tf.zeros_like, state.buffers))
