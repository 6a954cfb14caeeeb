"""A test-only streaming mechanism, 'test_moving_sum', added the way a user adds one.

Its noise is the moving average of the last b-hat = `num_bands` draws: C^-1 = LtToep(1/b-hat, ..,
1/b-hat) (b-hat coefficients), C its Toeplitz inverse. The strategy (`MovingSumStrategy`, a
`ToeplitzStrategy`: matrices, sensitivity and errors follow from the coefficients), its streaming
noise (`MovingSumNoise`) and the registry entry (`MECHANISM`) are all it takes; no other module
knows the name. `tests/experiments/new_mechanism_test.py` registers it with `registry.registered`.
"""

import dataclasses
from typing import Any, ClassVar, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import base, registry, toeplitz
from dp_ftrl_tff.noise import base as noise_base

NAME = 'test_moving_sum'


@dataclasses.dataclass(frozen=True)
class MovingSumStrategy(base.ToeplitzStrategy):
  """C^-1 = LtToep(1/b-hat, .., 1/b-hat) with b-hat = `num_bands` coefficients."""
  num_bands: int
  name: ClassVar[str] = NAME

  def __post_init__(self):
    object.__setattr__(self, 'num_bands',
                       _validation.check_positive_int(self.num_bands, 'num_bands'))

  def noise_coefs(self, num_rounds: int) -> np.ndarray:
    return toeplitz.padded_coefs(np.full(self.num_bands, 1.0 / self.num_bands), num_rounds)

  def toeplitz_coefs(self, num_rounds: int) -> np.ndarray:
    return toeplitz.inverse_coefs(self.noise_coefs(num_rounds), num_rounds)

  def describe(self) -> dict:
    return {'num_bands': self.num_bands}

  def to_config(self) -> dict:
    return {'mechanism': NAME, 'num_bands': self.num_bands}

  @classmethod
  def from_config(cls, config: dict) -> 'MovingSumStrategy':
    base.check_config(config, (NAME,), required=('num_bands',))
    return cls(num_bands=config['num_bands'])


class MovingSumNoiseState(NamedTuple):
  """seed: int64[2]; row: the next z row (0-based round); draws: the last b-hat - 1 scaled draws of
  each leaf, newest first ([b-hat - 1] + leaf shape)."""
  seed: Any
  row: Any
  draws: Any


class MovingSumNoise(noise_base.StreamingNoise):
  """noise_t = (w_t + .. + w_{t - b-hat + 1}) / b-hat with w_t = stddev_t z_t (0 before a segment)."""

  def __init__(self, strategy: MovingSumStrategy):
    if not isinstance(strategy, MovingSumStrategy):
      raise ValueError(f'`strategy` must be a MovingSumStrategy, got {strategy!r}.')
    self.strategy = strategy

  @classmethod
  def from_strategy(cls, strategy: MovingSumStrategy, *, max_segment_rounds: Optional[int] = None,
                    beyond_max_rounds: str = 'error') -> 'MovingSumNoise':
    del max_segment_rounds, beyond_max_rounds  # streams for any number of rounds
    return cls(strategy)

  def initial_state(self, value_specs: Any, seed: tf.Tensor) -> MovingSumNoiseState:
    noise_base.check_value_specs(value_specs)
    return MovingSumNoiseState(tf.convert_to_tensor(seed, tf.int64), tf.constant(0, tf.int64),
                               noise_base.zero_buffers(value_specs, self.strategy.num_bands - 1))

  def next(self, state: MovingSumNoiseState, stddev: tf.Tensor) -> Tuple[Any, MovingSumNoiseState]:
    z = noise_base.standard_normal_row(state.seed, state.row,
                                       noise_base.buffer_row_specs(state.draws))
    noise, draws = [], []
    for z_leaf, past in zip(tf.nest.flatten(z), tf.nest.flatten(state.draws), strict=True):
      draw = tf.cast(stddev, past.dtype) * z_leaf
      noise.append((draw + tf.reduce_sum(past, axis=0)) / self.strategy.num_bands)
      draws.append(tf.concat([draw[tf.newaxis], past], axis=0)[:-1])
    return tf.nest.pack_sequence_as(z, noise), state._replace(
        row=state.row + 1, draws=tf.nest.pack_sequence_as(state.draws, draws))

  def restart(self, state: MovingSumNoiseState) -> MovingSumNoiseState:
    return state._replace(draws=tf.nest.map_structure(tf.zeros_like, state.draws))


MECHANISM = registry.Mechanism(
    name=NAME, summary='test-only moving sum of the last num_bands draws',
    strategy_class=f'{__name__}:MovingSumStrategy', noise_class=f'{__name__}:MovingSumNoise',
    parameter_options=(registry.Option('num_bands', 'int', 'b-hat, the draws averaged.'),))
