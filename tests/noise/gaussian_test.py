"""Gaussian noise stream vs dense numpy (M = GaussianStrategy().noise_matrix(n) = I) on the same z."""

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff.mechanisms import gaussian as gaussian_mechanisms
from dp_ftrl_tff.noise import base, gaussian

NUM_ROUNDS = 6


def _specs(dtype):
  return {'w': tf.TensorSpec([3, 2], dtype), 'b': tf.TensorSpec([4], dtype)}


def _flat(structure):
  return np.concatenate([np.ravel(np.asarray(x)) for x in tf.nest.flatten(structure)])


def _stream(noise, specs, seed, stddev, num_rounds, restart_at=()):
  state = noise.initial_state(specs, seed)
  rows = []
  for t in range(num_rounds):
    if t in restart_at:
      state = noise.restart(state)
    value, state = noise.next(state, tf.constant(stddev, tf.float32))
    rows.append(_flat(value))
  return np.stack(rows)


@pytest.mark.parametrize('dtype, rtol', [(tf.float64, 0.0), (tf.float32, 1e-5)])
def test_stream_matches_dense_noise_matrix(dtype, rtol):
  specs = _specs(dtype)
  seed = base.initial_seed(123)
  stddev = 0.75
  stream = _stream(gaussian.GaussianNoise(), specs, seed, stddev, NUM_ROUNDS)
  z = np.stack([_flat(base.standard_normal_row(seed, r, specs)) for r in range(NUM_ROUNDS)])
  z = z.astype(np.float64)
  dense = stddev * gaussian_mechanisms.GaussianStrategy().noise_matrix(NUM_ROUNDS) @ z
  np.testing.assert_allclose(stream, dense, rtol=rtol, atol=0.0)
  assert stream.dtype == dtype.as_numpy_dtype


def test_restart_keeps_counting_rows():
  specs = _specs(tf.float32)
  seed = base.initial_seed(7)
  plain = _stream(gaussian.GaussianNoise(), specs, seed, 1.0, NUM_ROUNDS)
  restarted = _stream(gaussian.GaussianNoise(), specs, seed, 1.0, NUM_ROUNDS, restart_at=(2, 4))
  np.testing.assert_array_equal(plain, restarted)
  # Rows differ from round to round (no z row reused).
  assert len({row.tobytes() for row in plain}) == NUM_ROUNDS


def test_different_seeds_give_different_noise():
  specs = _specs(tf.float32)
  a = _stream(gaussian.GaussianNoise(), specs, base.initial_seed(1), 1.0, 2)
  b = _stream(gaussian.GaussianNoise(), specs, base.initial_seed(2), 1.0, 2)
  assert not np.allclose(a, b)


def test_next_before_initial_state_raises():
  noise = gaussian.GaussianNoise()
  state = gaussian.GaussianNoiseState(seed=base.initial_seed(1), row=tf.constant(0, tf.int64))
  with pytest.raises(ValueError, match='initial_state'):
    noise.next(state, tf.constant(1.0))
