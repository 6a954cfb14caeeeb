"""BLT correlated noise as a streaming state: multiplication by C^-1 with d buffers (BLT paper Alg. 3).

For C = BLT(theta, omega) the noise of round t is z_hat_t = (C^-1 z)_t, computed without C^-1:
    z_t     = stddev * standard_normal_row(seed, row_t)
    z_hat_t = z_t - sum_j omega_j S_j
    S_j    <- theta_j S_j + z_hat_t          for j = 0 .. d-1, with S = 0 at the start of a segment.
Only the d buffers S_j (each shaped like the model update) persist between rounds. The recursion needs
only C's (theta, omega), never the inverse's parameters: its state transition diag(theta) - 1 omega^T
has the inverse's decays theta_hat as eigenvalues, so the buffers stay bounded for any theta_hat in
(-1, 1], negative ones included (they alternate in sign while they decay; strategy files refuse a BLT
with |theta_hat| > 1, whose noise would grow geometrically).

Row numbering: row r of z is round r (0-based) counted over the whole run, so for a run without
restarts the first n rounds equal stddev * `BLTStrategy.noise_matrix(n)` @ Z with Z[r] =
`base.standard_normal_row(seed, r, specs)`. `restart` zeroes the buffers (a fresh BLT segment) while
the rows keep counting: the segment starting at round r reproduces noise_matrix(m) @ Z[r:r+m].

The buffers and the seed are secret: they determine past and future noise. Arithmetic is in each
leaf's dtype (float32 for model updates; decays within 1e-7 of 1 round to 1 in float32, a relative
change below float32 resolution).
"""

from typing import Any, NamedTuple, Tuple

import tensorflow as tf

from dp_ftrl_tff.mechanisms import blt as blt_mechanisms
from dp_ftrl_tff.noise import base


class BLTNoiseState(NamedTuple):
  """State of `BLTNoise`.

  Attributes:
    seed: int64[2] seed of the z rows.
    row: int64 scalar, the next row of z (= the next 0-based round of the run; not reset by restarts).
    buffers: structure like the value specs; each leaf has shape [d] + leaf shape and the leaf's dtype,
      entry j being buffer S_j.
  """
  seed: Any
  row: Any
  buffers: Any


class BLTNoise(base.BufferedNoise):
  """Streaming noise of a `BLTStrategy` (Alg. 3); the state holds d buffers per model tensor."""
  strategy_class = blt_mechanisms.BLTStrategy
  state_class = BLTNoiseState

  @property
  def num_buffers(self) -> int:
    """d, the strategy's buffers (`restart` zeroes them: a fresh BLT segment)."""
    return self._strategy.num_buffers

  def next(self, state: BLTNoiseState, stddev: tf.Tensor) -> Tuple[Any, BLTNoiseState]:
    """(z_hat_t, new_state): round t's noise, std `stddev` = sigma * zeta before the C^-1 mixing."""
    z = base.standard_normal_row(state.seed, state.row, base.buffer_row_specs(state.buffers))
    noise, buffers = [], []
    for z_leaf, buffer in zip(tf.nest.flatten(z), tf.nest.flatten(state.buffers), strict=True):
      dtype = buffer.dtype
      broadcast = [-1] + [1] * z_leaf.shape.rank
      theta = tf.reshape(tf.constant(self._strategy.theta, dtype), broadcast)
      omega = tf.reshape(tf.constant(self._strategy.omega, dtype), broadcast)
      z_hat = tf.cast(stddev, dtype) * z_leaf - tf.reduce_sum(omega * buffer, axis=0)
      noise.append(z_hat)
      buffers.append(theta * buffer + z_hat[tf.newaxis])
    new_state = state._replace(
        row=state.row + 1, buffers=tf.nest.pack_sequence_as(state.buffers, buffers))
    return tf.nest.pack_sequence_as(z, noise), new_state
