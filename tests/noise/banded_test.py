"""Tests for the banded streaming noise (BandMF Alg. 9) against dense C^-1 @ Z."""

import collections

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
from dp_ftrl_tff.mechanisms import banded_optimizer, square_root
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from dp_ftrl_tff.noise import banded, base
from tests.testing import streams as stream_testing

pytestmark = pytest.mark.unit


def _random_strategy(n, bands, seed=0):
  rng = np.random.default_rng(seed)
  c = np.tril(rng.uniform(-1, 1, size=(n, n)), -1) / bands
  c *= np.subtract.outer(np.arange(n), np.arange(n)) < bands
  c[np.diag_indices(n)] = 0.5 + rng.uniform(size=n)
  return banded_mechanisms.BandedStrategy(c), c


def _dense_inverse(c):
  """C^-1 of a leading block of C by a dense triangular solve (independent of the recurrence)."""
  return lambda m: scipy.linalg.solve_triangular(c[:m, :m], np.eye(m), lower=True)


@pytest.mark.parametrize('bands', [1, 2, 5, 12])
def test_float64_stream_equals_noise_matrix_times_z(bands):
  n = 12
  strategy, c = _random_strategy(n, bands, seed=bands)
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(7)
  rounds, state = stream_testing.run_stream(banded.BandedNoise(strategy), specs, seed, [n])
  by_strategy, _ = stream_testing.expected_stream(strategy.noise_matrix, [n], specs, seed)
  dense, _ = stream_testing.expected_stream(_dense_inverse(c), [n], specs, seed)
  for key in specs:
    np.testing.assert_allclose(rounds[key], by_strategy[key], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rounds[key], dense[key], rtol=1e-12, atol=1e-12)
  assert int(state.row) == n and int(state.segment_round) == n
  assert state.buffers['kernel'].shape == (bands - 1, 3, 2)


def test_float32_stream_matches_within_1e5_and_scales_with_stddev():
  n, bands = 60, 9
  strategy, c = _random_strategy(n, bands, seed=3)
  specs = stream_testing.value_specs(tf.float32)
  seed = base.initial_seed(11)
  rounds, _ = stream_testing.run_stream(banded.BandedNoise(strategy), specs, seed, [n], stddev=2.5)
  expected, _ = stream_testing.expected_stream(_dense_inverse(c), [n], specs, seed, stddev=2.5)
  for key in specs:
    assert np.max(np.abs(rounds[key] - expected[key])) <= 1e-5 * np.max(np.abs(expected[key]))


def test_optimized_strategy_stream():
  n = 30
  result = banded_optimizer.optimize_banded(
      n, 6, ParticipationSchema.b_min_sep(6, 5))
  specs = collections.OrderedDict(w=tf.TensorSpec([7], tf.float64))
  seed = base.initial_seed(5)
  rounds, _ = stream_testing.run_stream(banded.BandedNoise(result.strategy), specs, seed, [n])
  expected, _ = stream_testing.expected_stream(
      _dense_inverse(result.strategy.strategy_matrix(n)), [n], specs, seed)
  np.testing.assert_allclose(rounds['w'], expected['w'], rtol=1e-12, atol=1e-12)


def test_error_beyond_max_rounds():
  strategy, _ = _random_strategy(4, 2)
  noise = banded.BandedNoise(strategy)
  _, state = stream_testing.run_stream(noise, stream_testing.value_specs(tf.float32),
                                       base.initial_seed(1), [4])
  with pytest.raises(tf.errors.InvalidArgumentError, match='built for 4 rounds'):
    noise.next(state, tf.constant(1.0))

  @tf.function
  def step(state):
    return noise.next(state, tf.constant(1.0))

  with pytest.raises(tf.errors.InvalidArgumentError, match='built for 4 rounds'):
    step(state)


def test_beyond_max_rounds_restart_starts_new_segment():
  n, bands = 5, 3
  strategy, c = _random_strategy(n, bands, seed=4)
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(3)
  rounds, state = stream_testing.run_stream(
      banded.BandedNoise(strategy, beyond_max_rounds='restart'), specs, seed, [12])
  expected, _ = stream_testing.expected_stream(_dense_inverse(c), [5, 5, 2], specs, seed)
  for key in specs:
    np.testing.assert_allclose(rounds[key], expected[key], rtol=1e-12, atol=1e-12)
  assert int(state.row) == 12 and int(state.segment_round) == 2


def test_beyond_max_rounds_restart_in_graph_mode_matches_eager():
  strategy, _ = _random_strategy(3, 2, seed=12)
  noise = banded.BandedNoise(strategy, beyond_max_rounds='restart')
  specs = stream_testing.value_specs(tf.float32)
  seed = base.initial_seed(2)
  graph, state = stream_testing.run_stream(noise, specs, seed, [7], tf_function=True)
  eager, _ = stream_testing.run_stream(noise, specs, seed, [7])
  for key in specs:
    np.testing.assert_allclose(graph[key], eager[key], rtol=1e-6, atol=1e-7)
  assert int(state.segment_round) == 1


def test_restart_zeroes_buffers_and_rows_keep_counting():
  n, bands = 8, 4
  strategy, c = _random_strategy(n, bands, seed=6)
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(13)
  rounds, state = stream_testing.run_stream(banded.BandedNoise(strategy), specs, seed, [3, 6])
  expected, _ = stream_testing.expected_stream(_dense_inverse(c), [3, 6], specs, seed)
  for key in specs:
    np.testing.assert_allclose(rounds[key], expected[key], rtol=1e-12, atol=1e-12)
  assert int(state.row) == 9 and int(state.segment_round) == 6


def test_graph_mode_matches_eager():
  strategy, _ = _random_strategy(6, 3, seed=8)
  noise = banded.BandedNoise(strategy)
  specs = stream_testing.value_specs(tf.float32)
  seed = base.initial_seed(9)

  @tf.function
  def three_rounds(state):
    outs = []
    for _ in range(3):
      out, state = noise.next(state, tf.constant(1.0))
      outs.append(out)
    return outs, state

  graph, _ = three_rounds(noise.initial_state(specs, seed))
  eager, _ = stream_testing.run_stream(noise, specs, seed, [3])
  for t in range(3):
    for key in specs:
      np.testing.assert_allclose(np.reshape(graph[t][key], -1), eager[key][t], rtol=1e-6,
                                 atol=1e-7)


@pytest.mark.integration
def test_inside_tff_computation():
  pytest.importorskip('tensorflow_federated')
  strategy, c = _random_strategy(6, 3, seed=10)
  specs = collections.OrderedDict(w=tf.TensorSpec([5], tf.float32))
  rounds, state, step = stream_testing.run_stream_in_tff(banded.BandedNoise(strategy), specs, 21,
                                                         [6])
  expected, _ = stream_testing.expected_stream(_dense_inverse(c), [6], specs, base.initial_seed(21))
  np.testing.assert_allclose(rounds['w'], expected['w'], rtol=1e-5, atol=1e-6)
  with pytest.raises(Exception, match='built for 6 rounds'):
    step(state, 1.0)


@pytest.mark.parametrize('bad', [None, 'banded', np.eye(3)])
def test_rejects_non_banded_strategy(bad):
  with pytest.raises(ValueError, match='strategy'):
    banded.BandedNoise(bad)


def test_rejects_bad_arguments():
  strategy, _ = _random_strategy(4, 2)
  with pytest.raises(ValueError, match='beyond_max_rounds'):
    banded.BandedNoise(strategy, beyond_max_rounds='wrap')
  for specs in ([tf.TensorSpec([2], tf.int32)], [tf.TensorSpec([None], tf.float32)], []):
    with pytest.raises(ValueError, match='value_specs'):
      banded.BandedNoise(strategy).initial_state(specs, base.initial_seed(0))


@pytest.mark.parametrize('bands', [1, 3, 20])
@pytest.mark.parametrize('beyond_max_rounds', ['error', 'restart'])
def test_bsr_streams_past_its_bands_for_any_number_of_rounds(bands, beyond_max_rounds):
  """BSR (Toeplitz, no last round): the stream equals the dense C^-1 @ Z over restarts; the
  beyond-max-rounds policy never applies."""
  strategy = square_root.BandedSquareRootStrategy(bands)
  specs = stream_testing.value_specs(tf.float64)
  seed = base.initial_seed(17)
  noise = banded.BandedNoise.from_strategy(strategy, beyond_max_rounds=beyond_max_rounds)
  rounds, state = stream_testing.run_stream(noise, specs, seed, [9, 4], stddev=1.5)
  dense = lambda m: _dense_inverse(strategy.strategy_matrix(m))(m)  # noqa: E731
  expected, _ = stream_testing.expected_stream(dense, [9, 4], specs, seed, stddev=1.5)
  for key in specs:
    np.testing.assert_allclose(rounds[key], expected[key], rtol=1e-12, atol=1e-12)
  assert int(state.row) == 13 and int(state.segment_round) == 4
  assert not bool(noise.segment_ended(state))
  assert state.buffers['kernel'].shape == (bands - 1, 3, 2)
