"""The SecAgg chain: inflated L2 bound, a moving clip against the plain sum and TFF's
DistributedDpSumFactory, the wrap check, and the exact secure sum of the quantile bits."""

import gc
import logging
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff.aggregators import (
  AdaptiveClipping,
  CorrelatedNoiseFactory,
  RestartSchedule,
  SecureAggregation,
  secure,
)

pytestmark = pytest.mark.integration


@pytest.mark.unit
def test_inflated_clip_matches_the_ddg_bound():
  # Kairouz et al. 2021, Thm. 1 with beta = 0: ||rounded|| <= c + gamma sqrt(d).
  bound = float(secure.inflated_clip(1.0, 0.01, 0.0, 400).numpy())
  np.testing.assert_allclose(bound, 1.0 + 0.01 * 20 + secure.NORM_LEEWAY, rtol=1e-6)
  # beta > 0: sqrt(c^2 + gamma^2 d / 4 + sqrt(2 log(1/beta)) gamma (c + gamma sqrt(d) / 2)).
  beta = math.exp(-0.5)
  expected = math.sqrt(1.0 + 0.25 * 0.2**2 + 1.0 * 0.01 * (1.0 + 0.1))
  bound = float(secure.inflated_clip(1.0, 0.01, beta, 400).numpy())
  np.testing.assert_allclose(bound, min(expected, 1.2) + secure.NORM_LEEWAY, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# The chain in TFF processes (secure intrinsics replaced by TFF's insecure bodies: the test context
# cannot be entered after other computations ran in this process).

DIM = 50
VALUE_TYPE = tff.TensorType(np.float32, [DIM])
NUM_CLIENTS = 5
ROUNDS = 20


def _simulated(process):
  replace = tff.backends.test.replace_secure_intrinsics_with_bodies
  return replace(process.initialize), replace(process.next)


def _run(process, clients, rounds):
  initialize, next_fn = _simulated(process) if not isinstance(process, tuple) else process
  state = initialize()
  outputs = []
  for _ in range(rounds):
    output = next_fn(state, clients)
    if not isinstance(output, dict):
      output = {'state': output.state, 'result': output.result,
                'measurements': output.measurements}
    state = output['state']
    outputs.append(output)
  return outputs


def _adaptive_factory(config):
  # Noise 0 (deterministic estimate), the clip adopted every round, a fast learning rate: the clip
  # moves by up to exp(0.5 * 0.5) = 1.28x a round.
  adaptive = AdaptiveClipping(initial_clip=1.0, target_unclipped_quantile=0.5,
                              clip_learning_rate=0.5, restarts=RestartSchedule(warmup=1, period=1))
  return CorrelatedNoiseFactory.gaussian(0.0, NUM_CLIENTS, None, adaptive_clip=adaptive,
                                         secure=config)


def _clients(norm_low, norm_high, seed=0):
  rng = np.random.default_rng(seed)
  norms = np.geomspace(norm_low, norm_high, NUM_CLIENTS)
  directions = rng.normal(size=(NUM_CLIENTS, DIM))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  return [(n * u).astype(np.float32) for n, u in zip(norms, directions, strict=True)]


# Clients whose norms are 30..300 (the clip must grow 1 -> >= 10) or 0.003..0.03 (shrink by >= 10x).
SCENARIOS = {'grow': _clients(30.0, 300.0), 'shrink': _clients(0.003, 0.03)}


@pytest.fixture(scope='module')
def plain_outputs():
  process = _adaptive_factory(None).create(VALUE_TYPE)
  return {name: _run((process.initialize, process.next), clients, ROUNDS)
          for name, clients in SCENARIOS.items()}


@pytest.mark.parametrize('beta', [0.0, math.exp(-0.5)])
@pytest.mark.parametrize('rotation', ['dft', 'hd', None])
def test_secure_mean_follows_a_moving_clip(plain_outputs, rotation, beta):
  config = SecureAggregation(bits=16, rotation=rotation, beta=beta)
  process = _simulated(_adaptive_factory(config).create(VALUE_TYPE))
  padded = config.padded_dim(DIM)
  for name, clients in SCENARIOS.items():
    outputs = _run(process, clients, ROUNDS)
    clips = np.array([o['measurements']['clip'] for o in outputs])
    plain_clips = np.array([o['measurements']['clip'] for o in plain_outputs[name]])
    np.testing.assert_allclose(clips, plain_clips, rtol=1e-5)
    change = clips[-1] / clips[0]
    assert change >= 10 if name == 'grow' else change <= 0.1, (name, clips)
    for t, (o, p) in enumerate(zip(outputs, plain_outputs[name], strict=True)):
      m = o['measurements']
      scale = float(m['scale_factor'])
      np.testing.assert_allclose(scale, config.scale_factor(float(m['clip']), NUM_CLIENTS, DIM),
                                 rtol=1e-5)
      assert m['modular_wrap'] == 0, (name, t)
      # Each client's rounding error is below 1 per coordinate in scaled units (also when the
      # rounding is conditional), so ||secure - plain|| <= n * sqrt(padded_dim) / scale / m; the
      # float32 rotation and rescaling add a relative error of a few ulps of the clipped sum.
      bound = NUM_CLIENTS * math.sqrt(padded) / scale / NUM_CLIENTS
      float_error = 1e-5 * NUM_CLIENTS * float(m['clip']) / NUM_CLIENTS
      error = np.linalg.norm(np.asarray(o['result'], np.float64) - p['result'])
      assert error <= bound + float_error, (name, t, error, bound)
      expected_sensitivity = float(secure.sensitivity_clip(config, float(m['clip']), NUM_CLIENTS, DIM))
      np.testing.assert_allclose(m['sensitivity_clip'], expected_sensitivity, rtol=1e-6)
      assert m['sensitivity_clip'] <= float(m['clip']) * (1 + math.sqrt(padded) / (
          float(m['clip']) * scale)) + 1e-4


@pytest.mark.parametrize('rotation', ['dft', 'hd'])
def test_fixed_clip_matches_tff_distributed_dp_sum(rotation):
  config = SecureAggregation(bits=18, rotation=rotation, beta=math.exp(-0.5))
  clip = 2.0
  ours = _simulated(CorrelatedNoiseFactory.gaussian(0.0, NUM_CLIENTS, clip, secure=config)
                    .create(VALUE_TYPE))
  # Not exported by the 0.87 API (`tff.aggregators`); the module ships in the wheel.
  from tensorflow_federated.python.aggregators import distributed_dp
  theirs = _simulated(distributed_dp.DistributedDpSumFactory(
      noise_multiplier=0.0, expected_clients_per_round=NUM_CLIENTS, bits=config.bits,
      l2_clip=clip, modclip_prob=config.modclip_prob, beta=config.beta,
      mechanism='distributed_dgauss', rotation_type=rotation, auto_l2_clip=False)
      .create(VALUE_TYPE))
  clients = _clients(0.5, 5.0)
  (ours_out,) = _run(ours, clients, 1)
  (theirs_out,) = _run(theirs, clients, 1)
  scale = float(ours_out['measurements']['scale_factor'])
  np.testing.assert_allclose(scale, theirs_out['measurements']['scale_factor'], rtol=1e-5)
  # Both round each client independently: the sums differ by at most two rounding errors each.
  bound = 2 * NUM_CLIENTS * math.sqrt(config.padded_dim(DIM)) / scale + 1e-5 * NUM_CLIENTS * clip
  ours_sum = np.asarray(ours_out['result'], np.float64) * NUM_CLIENTS
  assert np.linalg.norm(ours_sum - theirs_out['result']) <= bound
  scaled_bound = float(secure.sensitivity_clip(config, clip, NUM_CLIENTS, DIM)) * scale
  np.testing.assert_allclose(theirs_out['measurements']['scaled_inflated_l2'], scaled_bound,
                             rtol=1e-5)


def _wrap_check_outputs(client_vectors, bits):
  factory = secure.ModularWrapCheckFactory(
      tff.aggregators.modular_clipping.ModularClippingSumFactory(
          -(2**(bits - 1)), 2**(bits - 1), tff.aggregators.SumFactory()), bits)
  process = factory.create(tff.TensorType(np.int32, [len(client_vectors[0])]))
  return _run(process, [np.asarray(v, np.int32) for v in client_vectors], 3)


def test_wrap_check_detects_wraps():
  bits = 8  # field [-128, 128)
  no_wrap = _wrap_check_outputs([[100, -50, 3, 0], [27, -78, -3, 5]], bits)
  assert [int(o['measurements']['modular_wrap']) for o in no_wrap] == [0, 0, 0]
  # Coordinate 0 sums to 128: one wrap, detected whatever the weights.
  one_wrap = _wrap_check_outputs([[100, 0, 0, 0], [28, 0, 0, 0]], bits)
  assert [int(o['measurements']['modular_wrap']) for o in one_wrap] == [1, 1, 1]
  np.testing.assert_array_equal(one_wrap[0]['result'], [-128, 0, 0, 0])
  # w = (1, -1, 1): <r, w> is a sum of three odd weights, hence odd, never 0.
  many = _wrap_check_outputs([[127, -127, 127, 1], [127, -127, 127, 1]], bits)
  assert [int(o['measurements']['modular_wrap']) for o in many] == [1, 1, 1]
  # A client value outside the field wraps at the client: detected too.
  client_wrap = _wrap_check_outputs([[300, 0, 0, 0], [0, 0, 0, 0]], bits)
  assert [int(o['measurements']['modular_wrap']) for o in client_wrap] == [1, 1, 1]


def test_the_projection_is_exact_beyond_a_chunk():
  """The wrap check's projection of a vector longer than its summing chunk (padded, summed per
  chunk, reduced) at the largest field (22 + 16 bits), against Python's unbounded integers."""
  size = secure._PROJECTION_CHUNK + 3
  modulus = 2**(22 + secure.WRAP_CHECK_BITS)
  rng = np.random.default_rng(0)
  value = rng.integers(-2**31, 2**31, size, dtype=np.int64)
  value[:8] = [2**31 - 1, -2**31, modulus - 1, -1, 0, 1, modulus, -modulus]
  projection = int(secure._projection(tf.constant(value), tf.constant(7, tf.int64), size, modulus))
  weights = secure._wrap_check_weights(tf.constant(7, tf.int64), size).numpy()
  expected = sum(int(v) % modulus * int(w) for v, w in zip(value, weights, strict=True)) % modulus
  assert projection == expected


def test_stale_scale_wraps_and_is_detected():
  """A chain whose scale is 20x too large for the clip (the pre-fix behaviour when the clip grew)."""
  config = SecureAggregation(bits=12, rotation='dft')
  clip = 1.0
  scale = 20 * config.scale_factor(clip, NUM_CLIENTS, DIM)
  process = secure.record_aggregation_factory(config, scale, clip).create(VALUE_TYPE)
  clients = [v * (clip / np.linalg.norm(v)) for v in _clients(1.0, 1.0)]
  # The DFT rotation's seed changes every round (and with the TF random state earlier tests of the
  # process left behind), so a round may rarely escape the wrap: every round's flag must say whether
  # its sum is wrong (the check misses a wrap with probability at most 2^-15 a round), and the stale
  # scale must wrap in some round.
  wrapped = []
  for output in _run(process, clients, 4):
    wrap = int(output['measurements']['dft']['discretize']['modular_wrap'])
    error = np.linalg.norm(np.asarray(output['result'], np.float64) - np.sum(clients, axis=0))
    assert wrap == int(error > 0.5 * clip), (wrap, error)
    wrapped.append(wrap)
  assert any(wrapped), wrapped


def test_quantile_bits_sum_exactly():
  process = secure.quantile_bit_aggregation_factory().create(tff.TensorType(np.float32))
  bits = [np.float32(b) for b in (0.5, -0.5, 0.5, 0.5, -0.5, 0.5, 0.5)]
  outputs = _run(process, bits, 2)
  assert [float(o['result']) for o in outputs] == [1.5, 1.5]
  with pytest.raises(ValueError, match='`value_type` must be a float32 scalar'):
    secure.quantile_bit_aggregation_factory().create(tff.TensorType(np.float32, [2]))
  with pytest.raises(ValueError, match='`upper` and `lower` must be integers'):
    secure.count_aggregation_factory(True, 0.5, -0.5)


def test_building_the_secure_adaptive_process_logs_no_tensorflow_error():
  """TFF's float secure sum leaves an unused assertion in a graph, which TensorFlow logs at ERROR
  level when the op is collected ("Object was never used"); a driver once printed it after a
  successful run. Building the process with SecAgg and adaptive clipping must log no TF error."""
  records = []
  handler = logging.Handler(logging.ERROR)
  handler.emit = records.append
  tf_logger = logging.getLogger('tensorflow')
  tf_logger.addHandler(handler)
  try:
    _adaptive_factory(SecureAggregation(bits=16)).create(VALUE_TYPE)
    gc.collect()
  finally:
    tf_logger.removeHandler(handler)
  assert not records, [r.getMessage()[:300] for r in records]
