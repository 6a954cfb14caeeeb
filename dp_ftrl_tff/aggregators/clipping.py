"""Client-side zeroing and L2 clipping of one update, as TF ops (run inside the client computation).

Order (DP-FedAvg, McMahan et al. 2018; TFF's `zeroing_factory` then `clipping_factory`):
  1. Zeroing: an update whose global L2 norm is not finite (NaN / Inf anywhere) or exceeds
     `zeroing_norm` is replaced by zeros and counted. TFF's `zeroing_factory` compares
     `norm > zeroing_norm`, which is False for NaN, so it lets NaN through; this module does not.
  2. Clipping: the update is scaled by min(1, clip / norm) and counted as clipped when norm > clip
     (TFF's `clipping_factory` convention).
Both run in ONE client computation with a single norm (TFF's two wrappers would compute it twice and
add a broadcast and a federated sum each); the counts are the ones TFF reports (`zeroed_count`,
`clipped_count`). A zeroed update counts as zeroed, not clipped. Norms are float32 whatever the leaf
dtypes (TFF's convention).
"""

from typing import Any, NamedTuple, Optional

import tensorflow as tf


class ClipResult(NamedTuple):
  """What `zero_and_clip` returns for one client.

  Attributes:
    value: the zeroed-or-clipped update, same structure and dtypes as the input.
    norm: float32 global L2 norm of the input (0 when zeroed for being non-finite).
    was_clipped: int32 0/1.
    was_zeroed: int32 0/1.
  """
  value: Any
  norm: tf.Tensor
  was_clipped: tf.Tensor
  was_zeroed: tf.Tensor


def global_l2_norm(value: Any) -> tf.Tensor:
  """float32 L2 norm of all leaves of `value` together."""
  squares = [tf.reduce_sum(tf.square(tf.cast(x, tf.float32))) for x in tf.nest.flatten(value)]
  return tf.sqrt(tf.add_n(squares))


def zero_and_clip(value: Any, clip: tf.Tensor, zeroing_norm: Optional[float] = None) -> ClipResult:
  """Zeroes a non-finite or too-large update, else clips it to L2 norm `clip`.

  Args:
    value: nested structure of floating tensors (one client's update).
    clip: float32 scalar, the L2 clip norm zeta (> 0).
    zeroing_norm: Python float or None; updates with norm > zeroing_norm are zeroed.

  Returns:
    A `ClipResult`.
  """
  norm = global_l2_norm(value)
  should_zero = tf.logical_not(tf.math.is_finite(norm))
  if zeroing_norm is not None:
    should_zero = tf.logical_or(should_zero, norm > zeroing_norm)
  was_clipped = tf.logical_and(tf.logical_not(should_zero), norm > clip)
  # One multiply per element, as TFF's clipping: by 0 (zeroed), clip / norm (clipped) or 1 (exact).
  # `multiply_no_nan` gives 0 * NaN = 0; no `cond`, whose branch functions TFF's worker would
  # instantiate for every client (docs/benchmarks/aggregators.md).
  factor = tf.where(should_zero, 0.0, tf.where(was_clipped, clip / norm, 1.0))
  clipped = tf.nest.map_structure(lambda x: tf.math.multiply_no_nan(x, tf.cast(factor, x.dtype)),
                                  value)
  return ClipResult(value=clipped,
                    norm=tf.where(tf.math.is_finite(norm), norm, 0.0),
                    was_clipped=tf.cast(was_clipped, tf.int32),
                    was_zeroed=tf.cast(should_zero, tf.int32))
