"""zero_and_clip against numpy: clipping, zeroing of non-finite and too-large updates, counts."""

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff import plan
from dp_ftrl_tff.aggregators import clipping
from dp_ftrl_tff.mechanisms.gaussian import GaussianStrategy

pytestmark = pytest.mark.unit


def _value(a, b):
  return [tf.constant(a, tf.float32), tf.constant(b, tf.float64)]


@pytest.mark.parametrize('a, b, clip', [([3.0, 4.0], [0.0], 1.0), ([0.3, 0.4], [0.0], 1.0),
                                        ([1.0, 2.0], [2.0], 3.0)])
def test_clips_to_l2_ball(a, b, clip):
  result = clipping.zero_and_clip(_value(a, b), tf.constant(clip))
  flat = np.concatenate([a, b])
  norm = np.linalg.norm(flat)
  expected = flat * min(1.0, clip / norm)
  got = np.concatenate([result.value[0].numpy(), result.value[1].numpy()])
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert result.value[1].dtype == tf.float64
  assert int(result.was_clipped) == int(norm > clip)
  assert int(result.was_zeroed) == 0
  np.testing.assert_allclose(float(result.norm), norm, rtol=1e-6)


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_non_finite_update_is_zeroed_and_counted(bad):
  result = clipping.zero_and_clip(_value([1.0, bad], [2.0]), tf.constant(1.0))
  for leaf in result.value:
    np.testing.assert_array_equal(leaf.numpy(), 0.0)
  assert int(result.was_zeroed) == 1
  assert int(result.was_clipped) == 0
  assert float(result.norm) == 0.0


def test_zeroing_norm():
  value = _value([30.0, 40.0], [0.0])
  zeroed = clipping.zero_and_clip(value, tf.constant(1.0), zeroing_norm=49.0)
  assert int(zeroed.was_zeroed) == 1
  np.testing.assert_array_equal(zeroed.value[0].numpy(), 0.0)
  kept = clipping.zero_and_clip(value, tf.constant(1.0), zeroing_norm=51.0)
  assert int(kept.was_zeroed) == 0 and int(kept.was_clipped) == 1


def test_float32_overflow_is_zeroed():
  result = clipping.zero_and_clip(_value([3e38, 3e38], [0.0]), tf.constant(1.0))
  assert int(result.was_zeroed) == 1


@pytest.mark.parametrize('bad', [0.0, -1.0, float('nan'), 'x'])
def test_invalid_zeroing_norm_is_named(bad):
  with pytest.raises(ValueError, match='zeroing_norm'):
    plan.RunPlan.build(GaussianStrategy(), 1.0, 10, 1.0, zeroing_norm=bad)
