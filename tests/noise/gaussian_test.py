"""Gaussian noise stream vs dense numpy (M = GaussianStrategy().noise_matrix(n) = I) on the same z."""

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff.mechanisms import gaussian as gaussian_mechanisms
from dp_ftrl_tff.noise import base, gaussian
from tests.testing import streams as stream_testing

pytestmark = pytest.mark.unit

NUM_ROUNDS = 6


def _flat_stream(seed, segment_lengths, dtype=tf.float32, stddev=1.0):
  specs = stream_testing.value_specs(dtype)
  stream, _ = stream_testing.run_stream(gaussian.GaussianNoise(), specs, seed, segment_lengths,
                                        stddev=stddev)
  return stream_testing.flat(stream)


@pytest.mark.parametrize('dtype, rtol', [(tf.float64, 0.0), (tf.float32, 1e-5)])
def test_stream_matches_dense_noise_matrix(dtype, rtol):
  specs = stream_testing.value_specs(dtype)
  seed = base.initial_seed(123)
  stream, _ = stream_testing.run_stream(gaussian.GaussianNoise(), specs, seed, [NUM_ROUNDS],
                                        stddev=0.75)
  expected, _ = stream_testing.expected_stream(gaussian_mechanisms.GaussianStrategy().noise_matrix,
                                               [NUM_ROUNDS], specs, seed, stddev=0.75)
  for leaf, reference in zip(tf.nest.flatten(stream), tf.nest.flatten(expected), strict=True):
    assert leaf.dtype == dtype.as_numpy_dtype
    np.testing.assert_allclose(leaf, reference, rtol=rtol, atol=0.0)


def test_restart_keeps_counting_rows():
  seed = base.initial_seed(7)
  plain = _flat_stream(seed, [NUM_ROUNDS])
  restarted = _flat_stream(seed, [2, 2, 2])
  np.testing.assert_array_equal(plain, restarted)
  # Rows differ from round to round (no z row reused).
  assert len({row.tobytes() for row in plain}) == NUM_ROUNDS


def test_different_seeds_give_different_noise():
  a = _flat_stream(base.initial_seed(1), [2])
  b = _flat_stream(base.initial_seed(2), [2])
  assert not np.allclose(a, b)


def test_next_before_initial_state_raises():
  noise = gaussian.GaussianNoise()
  state = gaussian.GaussianNoiseState(seed=base.initial_seed(1), row=tf.constant(0, tf.int64))
  with pytest.raises(ValueError, match='initial_state'):
    noise.next(state, tf.constant(1.0))
