"""CorrelatedNoiseFactory processes against dense numpy, hand-computed means and theory.

Processes are built once per module (TFF tracing is slow) and shared by the tests.
"""

import asyncio
import collections
import math
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import settings
from dp_ftrl_tff.aggregators import (
  MEASUREMENT_KEYS,
  AdaptiveClipping,
  CorrelatedNoiseFactory,
  RestartSchedule,
  SecureAggregation,
)
from dp_ftrl_tff.aggregators import secure as secure_lib
from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
from dp_ftrl_tff.mechanisms import blt as blt_mechanisms
from dp_ftrl_tff.mechanisms import gaussian as gaussian_mechanisms
from dp_ftrl_tff.mechanisms import square_root as square_root_mechanisms
from dp_ftrl_tff.mechanisms import tree as tree_mechanisms
from dp_ftrl_tff.noise import base

pytestmark = pytest.mark.integration

NUM_ROUNDS = 8
SEED = 1234
BIG_DIM = 100_000
BANDED = banded_mechanisms.BandedStrategy.from_toeplitz([1.0, 0.5, 0.25], num_rounds=NUM_ROUNDS)
BLT = blt_mechanisms.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2))

# name -> (constructor, strategy whose noise_matrix the stream must reproduce)
MECHANISMS = {
    'gaussian': (lambda **kw: CorrelatedNoiseFactory.gaussian(**kw),
                 gaussian_mechanisms.GaussianStrategy()),
    'tree_efficient': (lambda **kw: CorrelatedNoiseFactory.tree(use_efficient=True, **kw),
                       tree_mechanisms.TreeStrategy('efficient')),
    'tree_vanilla': (lambda **kw: CorrelatedNoiseFactory.tree(use_efficient=False, **kw),
                     tree_mechanisms.TreeStrategy('vanilla')),
    'banded': (lambda **kw: CorrelatedNoiseFactory.banded(strategy=BANDED, **kw), BANDED),
    'blt': (lambda **kw: CorrelatedNoiseFactory.blt(strategy=BLT, **kw), BLT),
    'bsr': (lambda **kw: CorrelatedNoiseFactory.bsr(num_bands=3, **kw),
            square_root_mechanisms.BandedSquareRootStrategy(3)),
    'bisr': (lambda **kw: CorrelatedNoiseFactory.bisr(num_bands=3, **kw),
             square_root_mechanisms.BandedInverseSquareRootStrategy(3)),
}


def _flat(structure):
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in tf.nest.flatten(structure)])


def _run(process, client_values, num_rounds, state=None):
  state = process.initialize() if state is None else state
  outputs = []
  for _ in range(num_rounds):
    output = process.next(state, client_values)
    if isinstance(output, dict):  # `_simulated_secure` computations return plain dicts.
      output = types.SimpleNamespace(**output)
    state = output.state
    outputs.append(output)
  return state, outputs


def _dense_noise(strategy, value_type, seed, num_rounds, stddev):
  """stddev * M z with z rows rebuilt by `standard_normal_row`: (num_rounds, dim) float64."""
  specs = tff.types.type_to_tf_tensor_specs(value_type)
  matrix = strategy.noise_matrix(num_rounds)
  seed_tensor = base.initial_seed(seed)
  z = np.stack([_flat(base.standard_normal_row(seed_tensor, r, specs))
                for r in range(matrix.shape[1])])
  return stddev * (matrix @ z)


SMALL_TYPE = tff.types.to_type(collections.OrderedDict(
    w=tff.TensorType(np.float64, [3, 2]), b=tff.TensorType(np.float64, [2])))
BIG_TYPE = tff.TensorType(np.float32, [BIG_DIM])


@pytest.fixture(scope='module', params=sorted(MECHANISMS))
def mechanism(request):
  """(name, strategy, float64 small process, float32 1e5-dim process), noise mult 1, clip 1."""
  constructor, strategy = MECHANISMS[request.param]
  factory = constructor(noise_multiplier=1.0, clients_per_round=1, clip_norm=1.0, noise_seed=SEED)
  return request.param, strategy, factory.create(SMALL_TYPE), factory.create(BIG_TYPE)


def test_stream_equals_dense_noise_float64(mechanism):
  _, strategy, small_process, _ = mechanism
  zeros = collections.OrderedDict(w=np.zeros([3, 2]), b=np.zeros([2]))
  _, outputs = _run(small_process, [zeros], NUM_ROUNDS)
  got = np.stack([_flat(o.result) for o in outputs])
  expected = _dense_noise(strategy, SMALL_TYPE, SEED, NUM_ROUNDS, stddev=1.0)
  np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_stream_float32_and_variance_match_theory(mechanism):
  name, strategy, _, big_process = mechanism
  _, outputs = _run(big_process, [np.zeros(BIG_DIM, np.float32)], NUM_ROUNDS)
  got = np.stack([np.asarray(o.result, np.float64) for o in outputs])
  expected = _dense_noise(strategy, BIG_TYPE, SEED, NUM_ROUNDS, stddev=1.0)
  assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected)), name
  # Empirical variance over 1e5 coordinates vs sigma^2 zeta^2 ||M_t||^2 and ||B_t||^2.
  noise_matrix = strategy.noise_matrix(NUM_ROUNDS)
  decoder = np.cumsum(noise_matrix, axis=0)
  np.testing.assert_allclose(np.var(got, axis=1), np.sum(noise_matrix**2, axis=1), rtol=0.05)
  np.testing.assert_allclose(np.var(np.cumsum(got, axis=0), axis=1), np.sum(decoder**2, axis=1),
                             rtol=0.05)
  for o in outputs:
    assert o.measurements['noise_stddev'] == 1.0
    assert o.measurements['clip'] == 1.0


@pytest.fixture(scope='module')
def robust_processes():
  """Gaussian processes with zeroing at 100: no noise (m = 3), and noise (m = 3)."""
  value_type = tff.TensorType(np.float32, [2])
  quiet = CorrelatedNoiseFactory.gaussian(0.0, 3, 1.0, zeroing_norm=100.0).create(value_type)
  noisy = CorrelatedNoiseFactory.gaussian(1.0, 3, 1.0, noise_seed=3,
                                          zeroing_norm=100.0).create(value_type)
  return quiet, noisy


CLIENTS = [np.array([3.0, 4.0], np.float32), np.array([0.3, 0.4], np.float32),
           np.array([np.nan, 1.0], np.float32), np.array([np.inf, 0.0], np.float32),
           np.array([1e3, 0.0], np.float32), np.array([-np.inf, np.nan], np.float32)]


def test_no_noise_gives_clipped_mean_and_counts(robust_processes):
  quiet, _ = robust_processes
  _, outputs = _run(quiet, CLIENTS, 2)
  expected = (np.array([0.6, 0.8]) + np.array([0.3, 0.4])) / 3.0
  for o in outputs:
    np.testing.assert_allclose(o.result, expected, rtol=1e-6)
    assert o.measurements['zeroed_count'] == 4
    assert o.measurements['clipped_count'] == 1
    assert o.measurements['noise_stddev'] == 0.0
  assert [o.measurements['round'] for o in outputs] == [0, 1]


def test_non_finite_updates_never_reach_the_output(robust_processes):
  _, noisy = robust_processes
  state, outputs = _run(noisy, CLIENTS, 3)
  quiet_mean = (np.array([0.6, 0.8]) + np.array([0.3, 0.4])) / 3.0
  expected_noise = _dense_noise(gaussian_mechanisms.GaussianStrategy(), tff.TensorType(
      np.float32, [2]), 3, 3, stddev=1.0) / 3.0
  for t, o in enumerate(outputs):
    assert np.all(np.isfinite(o.result))
    np.testing.assert_allclose(o.result, quiet_mean + expected_noise[t], rtol=1e-5, atol=1e-6)
    assert o.measurements['zeroed_count'] == 4
  assert np.all(np.isfinite(_flat(state.noise_state)))


@pytest.fixture(scope='module')
def adaptive_process():
  """Tree + adaptive clipping, no noise (deterministic estimate), restarts at rounds 2, 5, 8."""
  factory = CorrelatedNoiseFactory.tree(
      0.0, 4, None, noise_seed=1, restarts=RestartSchedule(warmup=2, period=3),
      adaptive_clip=AdaptiveClipping(initial_clip=1.0, target_unclipped_quantile=0.5,
                                     clip_learning_rate=0.2))
  return factory.create(tff.TensorType(np.float32, [1]))


def test_adaptive_clip_changes_only_at_restarts(adaptive_process):
  norms = np.array([0.5, 2.0, 3.0, 4.0])
  clients = [np.array([n], np.float32) for n in norms]
  _, outputs = _run(adaptive_process, clients, 7)
  estimate, clip = 1.0, 1.0
  for t, o in enumerate(outputs):
    m = o.measurements
    assert m['round'] == t
    np.testing.assert_allclose(m['clip'], clip, rtol=1e-6)
    np.testing.assert_allclose(o.result, np.minimum(norms, clip).sum() / 4.0, rtol=1e-5)
    assert m['clipped_count'] == int(np.sum(norms > clip))
    # Andrew et al. geometric update (no noise): fraction below the tracked estimate.
    estimate *= math.exp(-0.2 * (np.mean(norms <= estimate) - 0.5))
    np.testing.assert_allclose(m['quantile_estimate'], estimate, rtol=1e-5)
    assert bool(m['restart']) == (t + 1 in (2, 5, 8))
    assert m['segment'] == sum(t >= r for r in (2, 5))
    if m['restart']:
      clip = estimate


@pytest.mark.unit
def test_adaptive_noise_multiplier_is_inflated():
  factory = CorrelatedNoiseFactory.blt(1.0, 20, None, strategy=BLT, adaptive_clip=True)
  expected = settings.inflated_noise_multiplier(1.0, 1.0)
  assert factory.value_noise_multiplier == pytest.approx(expected)
  assert factory.plan.to_config()['restarts'] == {'warmup': 128, 'period': 1024}
  assert factory.plan.to_config()['clip_norm'] == 0.1


def test_checkpoint_round_trip_and_resume_bit_for_bit(tmp_path):
  factory = CorrelatedNoiseFactory.blt(
      1.0, 20, None, strategy=BLT,
      adaptive_clip=AdaptiveClipping(initial_clip=0.5, restarts=RestartSchedule(2, 2)))
  process = factory.create(tff.TensorType(np.float32, [5]))
  clients = [np.full([5], v, np.float32) for v in (0.1, 0.3, 1.0)]
  state, _ = _run(process, clients, 3)  # OS-entropy seed: only the state knows it.
  manager = tff.program.FileProgramStateManager(tmp_path)
  asyncio.run(manager.save(state, 3))
  _, continued = _run(process, clients, 3, state=state)
  restored = asyncio.run(manager.load(3, process.initialize()))
  _, resumed = _run(process, clients, 3, state=restored)
  for a, b in zip(continued, resumed, strict=False):
    np.testing.assert_array_equal(a.result, b.result)
    assert a.measurements['clip'] == b.measurements['clip']
  assert any(o.measurements['restart'] for o in continued)
  noise_stddevs = [o.measurements['noise_stddev'] for o in continued]
  clips = [o.measurements['clip'] for o in continued]
  np.testing.assert_allclose(noise_stddevs, factory.value_noise_multiplier * np.array(clips),
                             rtol=1e-6)
  assert b'"blt"' in restored.mechanism


@pytest.mark.unit
@pytest.mark.parametrize('kwargs, name', [
    ({'noise_multiplier': -1.0}, 'noise_multiplier'),
    ({'clients_per_round': 0}, 'clients_per_round'),
    ({'clip_norm': 0.0}, 'clip_norm'),
    ({'clip_norm': None}, 'clip_norm'),
    ({'noise_seed': -3}, 'noise_seed'),
    ({'noise_seed': 2**63}, 'noise_seed'),
    ({'noise_seed': 1.5}, 'noise_seed'),
    ({'zeroing_norm': -1.0}, 'zeroing_norm'),
    ({'secure': True}, 'secure'),
    ({'adaptive_clip': 'yes'}, 'adaptive_clip'),
    ({'adaptive_clip': AdaptiveClipping(initial_clip=2.0)}, 'clip_norm'),
    ({'noise_multiplier': 5.0, 'adaptive_clip': True}, 'noise_multiplier'),
])
def test_invalid_parameters_are_named(kwargs, name):
  args = dict(noise_multiplier=1.0, clients_per_round=10, clip_norm=1.0)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    CorrelatedNoiseFactory.gaussian(**args)


@pytest.mark.unit
def test_invalid_strategy_and_options_are_named():
  with pytest.raises(ValueError, match='strategy'):
    CorrelatedNoiseFactory.banded(1.0, 10, 1.0, strategy=BLT)
  with pytest.raises(ValueError, match='beyond_max_rounds'):
    CorrelatedNoiseFactory.banded(1.0, 10, 1.0, strategy=BANDED, beyond_max_rounds='wrap')
  with pytest.raises(ValueError, match='theta'):
    CorrelatedNoiseFactory.blt(1.0, 10, 1.0)
  with pytest.raises(ValueError, match='restarts'):
    CorrelatedNoiseFactory.tree(1.0, 10, 1.0, restarts=0)


@pytest.mark.unit
def test_blt_from_theta_omega_and_file(tmp_path):
  from dp_ftrl_tff.mechanisms import files
  by_params = CorrelatedNoiseFactory.blt(1.0, 10, 1.0, theta=BLT.theta, omega=BLT.omega)
  path = tmp_path / 'blt.json'
  files.save_strategy(BLT, path)
  by_file = CorrelatedNoiseFactory.blt(1.0, 10, 1.0, strategy=str(path))
  assert by_params.strategy == BLT and by_file.strategy == BLT


@pytest.mark.unit
@pytest.mark.parametrize('value_type', [tff.TensorType(np.int32, [3]),
                                        tff.StructType([tff.TensorType(np.float32, [2])]),
                                        tff.TensorType(np.float32, [None])])
def test_mismatched_value_type_at_create(value_type):
  with pytest.raises(ValueError, match='value_type'):
    CorrelatedNoiseFactory.gaussian(1.0, 10, 1.0).create(value_type)


def test_create_accepts_tensor_specs():
  factory = CorrelatedNoiseFactory.gaussian(0.0, 1, 10.0)
  process = factory.create(tf.TensorSpec([3], tf.float32))
  _, (output,) = _run(process, [np.array([1.0, 2.0, 3.0], np.float32)], 1)
  np.testing.assert_allclose(output.result, [1.0, 2.0, 3.0])
  nested = factory.create(collections.OrderedDict(a=tf.TensorSpec([2], tf.float32),
                                                  b=tf.TensorSpec([1], tf.float32)))
  assert nested.next.type_signature.result.result.member == tff.types.to_type(
      collections.OrderedDict(a=tff.TensorType(np.float32, [2]), b=tff.TensorType(np.float32, [1])))
  with pytest.raises(ValueError, match='tf.TensorSpec'):
    factory.create([tf.TensorSpec([2], tf.float32), 'x'])


def test_banded_restart_beyond_max_rounds_is_measured():
  process = CorrelatedNoiseFactory.banded(
      1.0, 1, 1.0, strategy=BANDED, noise_seed=0, beyond_max_rounds='restart').create(
          tff.TensorType(np.float32, [2]))
  _, outputs = _run(process, [np.zeros(2, np.float32)], 2 * NUM_ROUNDS + 1)
  restarts = [bool(o.measurements['restart']) for o in outputs]
  segments = [int(o.measurements['segment']) for o in outputs]
  # Rounds 0..7 form segment 0 (the strategy's 8 rounds); round 7 ends it, round 8 starts segment 1.
  assert restarts == [t in (NUM_ROUNDS - 1, 2 * NUM_ROUNDS - 1) for t in range(2 * NUM_ROUNDS + 1)]
  assert segments == [t // NUM_ROUNDS for t in range(2 * NUM_ROUNDS + 1)]
  # Segment 1 is the strategy's noise again on the next z rows (8..15): dense check.
  specs = tff.types.type_to_tf_tensor_specs(tff.TensorType(np.float32, [2]))
  z = np.stack([_flat(base.standard_normal_row(base.initial_seed(0), r, specs))
                for r in range(NUM_ROUNDS, 2 * NUM_ROUNDS)])
  expected = BANDED.noise_matrix(NUM_ROUNDS) @ z
  got = np.stack([_flat(o.result) for o in outputs[NUM_ROUNDS:2 * NUM_ROUNDS]])
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_banded_beyond_max_rounds_errors():
  process = CorrelatedNoiseFactory.banded(1.0, 1, 1.0, strategy=BANDED, noise_seed=0).create(
      tff.TensorType(np.float32, [2]))
  with pytest.raises(Exception, match='built for'):
    _run(process, [np.zeros(2, np.float32)], NUM_ROUNDS + 1)


def _simulated_secure(process):
  """The process with SecAgg intrinsics replaced by their insecure bodies (runs in the default
  context; switching to TFF's test context mid-session kills the worker)."""
  replace = tff.backends.test.replace_secure_intrinsics_with_bodies
  return types.SimpleNamespace(initialize=replace(process.initialize), next=replace(process.next))


@pytest.mark.parametrize('bits', [16, 20])
def test_secure_matches_plain_within_discretization_bound(bits):
  dim, num_clients, m = 50, 5, 5.0
  value_type = tff.TensorType(np.float32, [dim])
  rng = np.random.default_rng(bits)
  clients = [rng.normal(size=dim).astype(np.float32) * 0.3 for _ in range(num_clients)]
  plain = CorrelatedNoiseFactory.gaussian(0.0, m, 1.0).create(value_type)
  config = SecureAggregation(bits=bits)
  secure = _simulated_secure(
      CorrelatedNoiseFactory.gaussian(0.0, m, 1.0, secure=config).create(value_type))
  _, (plain_out,) = _run(plain, clients, 1)
  _, (secure_out,) = _run(secure, clients, 1)
  gamma = 1.0 / config.scale_factor(1.0, m, dim)
  bound = num_clients * gamma * math.sqrt(config.padded_dim(dim)) / m
  error = np.linalg.norm(np.asarray(secure_out.result, np.float64) - plain_out.result)
  assert 0 < error <= bound
  sensitivity = float(secure_lib.sensitivity_clip(config, 1.0, m, dim))
  np.testing.assert_allclose(secure_out.measurements['sensitivity_clip'], sensitivity, rtol=1e-6)
  assert 1.0 < sensitivity <= 1.0 + gamma * math.sqrt(config.padded_dim(dim)) + 1e-4


def _intrinsic_counts(process) -> collections.Counter:
  """URI -> number of intrinsic uses in `process.next` (and 'selection' -> selections)."""
  counts = collections.Counter()

  def visit(comp):
    if isinstance(comp, tff.framework.Intrinsic):
      counts[comp.uri] += 1
    elif isinstance(comp, tff.framework.Selection):
      counts['selection'] += 1
    return comp, False

  tff.framework.transform_postorder(process.next.to_building_block(), visit)
  return counts


@pytest.mark.parametrize('adaptive', [False, True])
def test_plain_sum_round_is_no_bigger_than_tffs(adaptive):
  # Every intrinsic and selection in `next` costs per-round executor work. With a plain
  # sum, a round is one broadcast, one client map, ONE federated sum (update, counts and quantile
  # bit together) and one server step; TFF's gaussian_fixed round has more of each.
  value_type = tff.TensorType(np.float32, [4])
  kwargs = dict(adaptive_clip=AdaptiveClipping(clipped_count_stddev=1.0)) if adaptive else {}
  ours = _intrinsic_counts(CorrelatedNoiseFactory.blt(0.5, 10, 1.0, strategy=BLT,
                                                      **kwargs).create(value_type))
  theirs = _intrinsic_counts(tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      0.5, 10, 1.0).create(value_type))
  assert ours['federated_sum'] == 1 and ours['federated_map'] == 1, ours
  assert ours['federated_broadcast'] == 1, ours
  assert sum(ours.values()) <= sum(theirs.values()), (ours, theirs)


def _type_nodes(type_spec) -> int:
  """Structs and tensors in a (federated) type: what TFF serializes one by one."""
  if isinstance(type_spec, tff.FederatedType):
    return _type_nodes(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return 1 + sum(_type_nodes(element) for element in type_spec)
  return 1


def test_plain_sum_state_and_measurements_cross_in_few_nodes():
  # TFF serializes and deserializes every node of the state (in and out) and of the
  # measurements each round, at a fixed cost each. The Gaussian state must be no bigger than TFF's
  # gaussian_fixed state; the measurements add the nine documented scalars.
  value_type = tff.TensorType(np.float32, [4])
  ours = CorrelatedNoiseFactory.gaussian(0.5, 10, 1.0).create(value_type)
  theirs = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(0.5, 10, 1.0).create(
      value_type)
  our_state = _type_nodes(ours.initialize.type_signature.result)
  assert our_state <= _type_nodes(theirs.initialize.type_signature.result)
  assert our_state == 10  # the struct, 4 scalars, noise_state (3), quantile_state, secure_agg
  measurements = ours.next.type_signature.result.measurements.member
  assert tuple(tff.structure.name_list(measurements)) == MEASUREMENT_KEYS
  assert _type_nodes(measurements) == 1 + len(MEASUREMENT_KEYS)
