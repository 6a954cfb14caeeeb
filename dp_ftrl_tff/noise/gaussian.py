"""Independent Gaussian noise (DP-SGD / DP-FedAvg, strategy C = I) as a streaming noise state.

The noise of round t is sigma * zeta * z_t with z_t = `base.standard_normal_row(seed, t, specs)`:
row r of z is round r (0-based), so M = `GaussianStrategy().noise_matrix(n)` = I_n reproduces the
stream. A restart changes nothing (rows keep counting: no z row is ever reused).
"""

from typing import Any, NamedTuple, Optional, Tuple

import tensorflow as tf

from dp_ftrl_tff.mechanisms import gaussian as gaussian_mechanisms
from dp_ftrl_tff.noise import base


class GaussianNoiseState(NamedTuple):
  """State of `GaussianNoise`.

  Attributes:
    seed: int64[2] seed of the z rows.
    row: int64 scalar, the next row of z (= the next 0-based round).
  """
  seed: Any
  row: Any


class GaussianNoise(base.StreamingNoise):
  """iid N(0, stddev^2) noise per round and coordinate: the C = I mechanism.

  `initial_state` records the value specs on the object (the state holds no shapes), so call it
  (e.g. by tracing the init computation) before `next`; one object serves one value structure.
  """

  def __init__(self):
    self._value_specs = None

  @classmethod
  def from_strategy(cls, strategy: gaussian_mechanisms.GaussianStrategy, *,
                    max_segment_rounds: Optional[int] = None,
                    beyond_max_rounds: str = 'error') -> 'GaussianNoise':
    """The stream of `GaussianStrategy()` (the other arguments do not apply)."""
    del max_segment_rounds, beyond_max_rounds
    if not isinstance(strategy, gaussian_mechanisms.GaussianStrategy):
      raise ValueError(f'`strategy` must be a GaussianStrategy, got {strategy!r}.')
    return cls()

  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> GaussianNoiseState:
    self._value_specs = value_specs
    return GaussianNoiseState(seed=tf.convert_to_tensor(seed, tf.int64),
                              row=tf.constant(0, tf.int64))

  def next(self, state: GaussianNoiseState, stddev: tf.Tensor) -> Tuple[Any, GaussianNoiseState]:
    if self._value_specs is None:
      raise ValueError('`initial_state` must be called (with the value specs) before `next`.')
    z = base.standard_normal_row(state.seed, state.row, self._value_specs)
    noise = tf.nest.map_structure(lambda x: x * tf.cast(stddev, x.dtype), z)
    return noise, state._replace(row=state.row + 1)

  def restart(self, state: GaussianNoiseState) -> GaussianNoiseState:
    return state
