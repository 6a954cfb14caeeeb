"""Moving-average correlated noise: a banded Toeplitz C^-1 applied to z as a streaming state (BISR).

For a noise matrix C^-1 = LtToep(r_0 .. r_{b-hat - 1}) (banded; `square_root.
BandedInverseSquareRootStrategy`, docs/papers.md#bisr) the noise of round t (within a segment) is
    w_t     = stddev_t * standard_normal_row(seed, row_t)
    noise_t = sum_{j < b-hat} r_j w_{t - j}              (w_{t - j} = 0 before the segment's start),
so only the last b-hat - 1 scaled draws w persist, in a ring buffer (slot t mod (b-hat - 1) holds
w_t). The draws are stored scaled, so the noise is C^-1 applied to the vector of scaled draws even when
the stddev changes between rounds (adaptive clipping), as for the banded and BLT states.

Row numbering: row r of z is round r (0-based) counted over the whole run, so for a run without
restarts the first n rounds equal stddev * `strategy.noise_matrix(n)` @ Z with Z[r] =
`base.standard_normal_row(seed, r, specs)`. `restart` zeroes the ring buffer (a fresh segment) while
the rows keep counting: a segment starting at round r reproduces noise_matrix(m) @ Z[r:r+m]. The
strategy streams for any number of rounds.

The ring buffer and the seed are secret: they determine past and future noise. Arithmetic is in each
leaf's dtype (float32 for model updates). Memory: (b-hat - 1) copies of the model update.
"""

from typing import Any, NamedTuple, Optional, Tuple

import tensorflow as tf

from dp_ftrl_tff.mechanisms import square_root
from dp_ftrl_tff.noise import base


class MovingAverageNoiseState(NamedTuple):
  """State of `MovingAverageNoise`.

  Attributes:
    seed: int64[2] seed of the z rows.
    row: int64 scalar, the next row of z (= the next 0-based round of the run; not reset by restarts).
    segment_round: int64 scalar, rounds generated since the last restart (or the start).
    buffers: structure like the value specs; each leaf has shape [b-hat - 1] + leaf shape and the
      leaf's dtype; slot s holds the scaled draw w_t' of the latest in-segment round t' with
      t' mod (b-hat - 1) = s (zero before the segment's first b-hat - 1 rounds).
  """
  seed: Any
  row: Any
  segment_round: Any
  buffers: Any


class MovingAverageNoise(base.StreamingNoise):
  """Streaming noise of a `BandedInverseSquareRootStrategy` (BISR); b-hat - 1 buffers per tensor."""

  def __init__(self, strategy: square_root.BandedInverseSquareRootStrategy):
    if not isinstance(strategy, square_root.BandedInverseSquareRootStrategy):
      raise ValueError(f'`strategy` must be a BandedInverseSquareRootStrategy, got {strategy!r}.')
    self._strategy = strategy
    self._coefs = strategy.moving_average_coefs()

  @classmethod
  def from_strategy(cls, strategy: square_root.BandedInverseSquareRootStrategy, *,
                    max_segment_rounds: Optional[int] = None,
                    beyond_max_rounds: str = 'error') -> 'MovingAverageNoise':
    """The stream of `strategy` (it streams for any n: the other arguments do not apply)."""
    del max_segment_rounds, beyond_max_rounds
    return cls(strategy)

  @property
  def strategy(self) -> square_root.BandedInverseSquareRootStrategy:
    return self._strategy

  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> MovingAverageNoiseState:
    """Zero buffers for updates shaped like `value_specs` (nested `tf.TensorSpec`, floating dtypes)."""
    base.check_value_specs(value_specs)
    zero = tf.constant(0, tf.int64)
    return MovingAverageNoiseState(seed=tf.convert_to_tensor(seed, tf.int64), row=zero,
                                   segment_round=zero,
                                   buffers=base.zero_buffers(value_specs, self._coefs.size - 1))

  def next(self, state: MovingAverageNoiseState,
           stddev: tf.Tensor) -> Tuple[Any, MovingAverageNoiseState]:
    """(noise_t, new_state): round t's noise, std `stddev` = sigma * zeta before the C^-1 mixing."""
    t = state.segment_round
    z = base.standard_normal_row(state.seed, state.row, base.buffer_row_specs(state.buffers))
    depth = self._coefs.size - 1
    if depth:
      # Slot s holds w_{t - j_s} with j_s = ((t - s - 1) mod depth) + 1 in 1 .. depth.
      lags = tf.math.floormod(t - 1 - tf.range(depth, dtype=tf.int64), depth) + 1
      slot = tf.math.floormod(t, depth)
    noise, buffers = [], []
    for z_leaf, buffer in zip(tf.nest.flatten(z), tf.nest.flatten(state.buffers), strict=True):
      dtype = buffer.dtype
      coefs = tf.constant(self._coefs, dtype)
      draw = tf.cast(stddev, dtype) * z_leaf
      out = coefs[0] * draw
      if depth:
        out += tf.tensordot(tf.gather(coefs, lags), buffer, axes=1)
        buffer = tf.tensor_scatter_nd_update(buffer, [[slot]], draw[tf.newaxis])
      noise.append(out)
      buffers.append(buffer)
    new_state = state._replace(row=state.row + 1, segment_round=t + 1,
                               buffers=tf.nest.pack_sequence_as(state.buffers, buffers))
    return tf.nest.pack_sequence_as(z, noise), new_state

  def restart(self, state: MovingAverageNoiseState) -> MovingAverageNoiseState:
    """A fresh segment: zero buffers, in-segment round 0; z rows keep counting."""
    return state._replace(segment_round=tf.zeros_like(state.segment_round),
                          buffers=tf.nest.map_structure(tf.zeros_like, state.buffers))
