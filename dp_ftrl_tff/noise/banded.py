"""Banded (BandMF) correlated noise as a streaming state: C^-1 z by forward substitution (BandMF Alg. 9).

For a lower-triangular C with b-hat bands the noise of round t (within a segment) is
    noise_t = (stddev * z_t - sum_{j=1}^{b-hat - 1} C[t, t - j] noise_{t - j}) / C[t, t],
so only the last b-hat - 1 outputs persist, newest first (a shift register: row j - 1 holds
noise_{t - j}).
The band rows of C (the strategy's `streaming_band_rows`, shape [m, b-hat]: `BandedStrategy` drops
the trailing rows that repeat the last one, a banded Toeplitz C that streams for any n (BSR) keeps
its first b-hat rows) are constants of the TF graph, gathered by the round within the segment,
clamped at the last row; a strategy without `max_rounds` has no segment limit.

Row numbering: row r of z is round r (0-based) counted over the whole run, so for a run without
restarts the first n rounds equal stddev * `BandedStrategy.noise_matrix(n)` @ Z with Z[r] =
`base.standard_normal_row(seed, r, specs)`. `restart` zeroes the buffers and the in-segment round
(a fresh C) while the rows keep counting: a segment starting at round r reproduces
noise_matrix(m) @ Z[r:r+m].

A BandMF C is built for n = `max_rounds` rounds. Asked for round n of a segment, the state fails with
`tf.errors.InvalidArgumentError` (`beyond_max_rounds='error'`, the default) or starts a new segment
(`beyond_max_rounds='restart'`; privacy accounting must then treat each segment as its own mechanism).

The buffers and the seed are secret: they determine past and future noise. Arithmetic is in each
leaf's dtype (float32 for model updates). Memory: (b-hat - 1) copies of the model update.
"""

from typing import Any, NamedTuple, Optional, Tuple

import tensorflow as tf

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
from dp_ftrl_tff.noise import base

_BEYOND_MAX_ROUNDS = ('error', 'restart')


class BandedNoiseState(NamedTuple):
  """State of `BandedNoise`.

  Attributes:
    seed: int64[2] seed of the z rows.
    row: int64 scalar, the next row of z (= the next 0-based round of the run; not reset by restarts).
    segment_round: int64 scalar, rounds generated since the last restart (or the start): the row of C
      used next.
    buffers: structure like the value specs; each leaf has shape [b-hat - 1] + leaf shape and the
      leaf's dtype; before in-segment round t, row j - 1 holds the output of round t - j (zeros
      before the segment's first round).
  """
  seed: Any
  row: Any
  segment_round: Any
  buffers: Any


class BandedNoise(base.StreamingNoise):
  """Streaming noise of a `BandedStrategy` (BandMF Alg. 9) or a `BandedSquareRootStrategy` (BSR);
  b-hat - 1 buffers per model tensor."""

  def __init__(self, strategy, beyond_max_rounds: str = 'error'):
    """Args:
      strategy: the `BandedStrategy` or `square_root.BandedSquareRootStrategy` C.
      beyond_max_rounds: 'error' (default) to fail past `strategy.max_rounds` rounds of a segment, or
        'restart' to begin a fresh segment there (no effect for BSR, which has no last round).
    """
    if not callable(getattr(strategy, 'streaming_band_rows', None)):
      raise ValueError(f'`strategy` must be a banded strategy (BandedStrategy, '
                       f'BandedSquareRootStrategy: with `streaming_band_rows`), got {strategy!r}.')
    self._band_rows = strategy.streaming_band_rows()
    self._strategy = strategy
    self._beyond_max_rounds = _validation.check_one_of(beyond_max_rounds, 'beyond_max_rounds',
                                                       _BEYOND_MAX_ROUNDS)

  @classmethod
  def from_strategy(cls, strategy: banded_mechanisms.BandedStrategy, *,
                    max_segment_rounds: Optional[int] = None,
                    beyond_max_rounds: str = 'error') -> 'BandedNoise':
    """The stream of `strategy` with the `beyond_max_rounds` policy (`max_segment_rounds` does not
    apply: the state holds num_bands - 1 buffers)."""
    del max_segment_rounds
    return cls(strategy, beyond_max_rounds=beyond_max_rounds)

  @property
  def strategy(self):
    """The `BandedStrategy` or `BandedSquareRootStrategy` this stream draws from."""
    return self._strategy

  @property
  def beyond_max_rounds(self) -> str:
    return self._beyond_max_rounds

  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> BandedNoiseState:
    """Zero buffers for updates shaped like `value_specs` (nested `tf.TensorSpec`, floating dtypes)."""
    base.check_value_specs(value_specs)
    zero = tf.constant(0, tf.int64)
    return BandedNoiseState(seed=tf.convert_to_tensor(seed, tf.int64), row=zero, segment_round=zero,
                            buffers=base.zero_buffers(value_specs, self._strategy.num_bands - 1))

  def next(self, state: BandedNoiseState, stddev: tf.Tensor) -> Tuple[Any, BandedNoiseState]:
    """(noise_t, new_state): round t's noise, std `stddev` = sigma * zeta before the C^-1 mixing."""
    max_rounds = self._strategy.max_rounds  # None: a Toeplitz C (BSR) streams for any n
    if max_rounds is not None and self._beyond_max_rounds == 'restart':
      state = tf.cond(state.segment_round >= max_rounds, lambda: self.restart(state), lambda: state)
    elif max_rounds is not None:
      state = state._replace(segment_round=base.assert_less(
          state.segment_round, max_rounds,
          f'BandedNoise: the banded strategy was built for {max_rounds} rounds; use '
          f"beyond_max_rounds='restart' to start a new segment."))
    t = state.segment_round
    z = base.standard_normal_row(state.seed, state.row, base.buffer_row_specs(state.buffers))
    depth = self._band_rows.shape[1] - 1
    coef_tables = {}
    noise, buffers = [], []
    for z_leaf, buffer in zip(tf.nest.flatten(z), tf.nest.flatten(state.buffers), strict=True):
      dtype = buffer.dtype
      if dtype not in coef_tables:
        coef_tables[dtype] = tf.gather(tf.constant(self._band_rows, dtype),
                                       tf.minimum(t, self._band_rows.shape[0] - 1))
      coefs = coef_tables[dtype]
      value = tf.cast(stddev, dtype) * z_leaf
      if depth:  # buffer row j - 1 holds noise_{t - j}, and coefs[j] = C[t, t - j]
        value -= tf.tensordot(coefs[1:], buffer, axes=1)
      out = value / coefs[0]
      noise.append(out)
      if depth:
        buffer = tf.concat([out[tf.newaxis], buffer[:-1]], axis=0)
      buffers.append(buffer)
    new_state = state._replace(row=state.row + 1, segment_round=t + 1,
                               buffers=tf.nest.pack_sequence_as(state.buffers, buffers))
    return tf.nest.pack_sequence_as(z, noise), new_state

  def segment_ended(self, state: BandedNoiseState) -> tf.Tensor:
    """True after the strategy's last round when `beyond_max_rounds='restart'`."""
    if self._beyond_max_rounds != 'restart' or self._strategy.max_rounds is None:
      return tf.constant(False)
    return state.segment_round >= self._strategy.max_rounds

  def restart(self, state: BandedNoiseState) -> BandedNoiseState:
    """A fresh banded segment: zero buffers, in-segment round 0; z rows keep counting."""
    return state._replace(segment_round=tf.zeros_like(state.segment_round),
                          buffers=tf.nest.map_structure(tf.zeros_like, state.buffers))
