"""Moving-average correlated noise: a banded Toeplitz C^-1 applied to z as a streaming state (BISR).

For a noise matrix C^-1 = LtToep(r_0 .. r_{b-hat - 1}) (banded; `square_root.
BandedInverseSquareRootStrategy`, docs/papers.md#bisr) the noise of round t (within a segment) is
    w_t     = stddev_t * standard_normal_row(seed, row_t)
    noise_t = sum_{j < b-hat} r_j w_{t - j}              (w_{t - j} = 0 before the segment's start),
so only the last b-hat - 1 scaled draws w persist, newest first (a shift register: row j - 1 holds
w_{t - j}). The draws are stored scaled, so the noise is C^-1 applied to the vector of scaled draws
even when the stddev changes between rounds (adaptive clipping), as for the banded and BLT states.

Row numbering: row r of z is round r (0-based) counted over the whole run, so for a run without
restarts the first n rounds equal stddev * `strategy.noise_matrix(n)` @ Z with Z[r] =
`base.standard_normal_row(seed, r, specs)`. `restart` zeroes the buffers (a fresh segment) while
the rows keep counting: a segment starting at round r reproduces noise_matrix(m) @ Z[r:r+m]. The
strategy streams for any number of rounds.

The buffers and the seed are secret: they determine past and future noise. Arithmetic is in each
leaf's dtype (float32 for model updates). Memory: (b-hat - 1) copies of the model update.
"""

from typing import Any, NamedTuple, Tuple

import tensorflow as tf

from dp_ftrl_tff.mechanisms import square_root
from dp_ftrl_tff.noise import base


class MovingAverageNoiseState(NamedTuple):
  """State of `MovingAverageNoise`.

  Attributes:
    seed: int64[2] seed of the z rows.
    row: int64 scalar, the next row of z (= the next 0-based round of the run; not reset by restarts).
    buffers: structure like the value specs; each leaf has shape [b-hat - 1] + leaf shape and the
      leaf's dtype; before in-segment round t, row j - 1 holds the scaled draw w_{t - j} (zeros
      before the segment's first round).
  """
  seed: Any
  row: Any
  buffers: Any


class MovingAverageNoise(base.BufferedNoise):
  """Streaming noise of a `BandedInverseSquareRootStrategy` (BISR); b-hat - 1 buffers per tensor."""
  strategy_class = square_root.BandedInverseSquareRootStrategy
  state_class = MovingAverageNoiseState

  def __init__(self, strategy: square_root.BandedInverseSquareRootStrategy):
    super().__init__(strategy)
    self._coefs = strategy.moving_average_coefs()

  @property
  def num_buffers(self) -> int:
    """b-hat - 1, the past scaled draws the noise mixes in."""
    return self._coefs.size - 1

  def next(self, state: MovingAverageNoiseState,
           stddev: tf.Tensor) -> Tuple[Any, MovingAverageNoiseState]:
    """(noise_t, new_state): round t's noise, std `stddev` = sigma * zeta before the C^-1 mixing."""
    z = base.standard_normal_row(state.seed, state.row, base.buffer_row_specs(state.buffers))
    depth = self._coefs.size - 1
    noise, buffers = [], []
    for z_leaf, buffer in zip(tf.nest.flatten(z), tf.nest.flatten(state.buffers), strict=True):
      dtype = buffer.dtype
      coefs = tf.constant(self._coefs, dtype)
      draw = tf.cast(stddev, dtype) * z_leaf
      out = coefs[0] * draw
      if depth:  # buffer row j - 1 holds w_{t - j}
        out += tf.tensordot(coefs[1:], buffer, axes=1)
        buffer = tf.concat([draw[tf.newaxis], buffer[:-1]], axis=0)
      noise.append(out)
      buffers.append(buffer)
    new_state = state._replace(row=state.row + 1,
                               buffers=tf.nest.pack_sequence_as(state.buffers, buffers))
    return tf.nest.pack_sequence_as(z, noise), new_state
