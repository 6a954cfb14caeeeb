"""Drop-in use in `tff.learning.algorithms.build_unweighted_fed_avg` (3 rounds per constructor)."""

import collections
import math
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory, SecureAggregation
from dp_ftrl_tff.mechanisms import banded as banded_mechanisms
from dp_ftrl_tff.mechanisms import blt as blt_mechanisms

pytestmark = pytest.mark.integration

NUM_CLIENTS = 5
BANDED = banded_mechanisms.BandedStrategy.from_toeplitz([1.0, 0.5], num_rounds=4)
BLT = blt_mechanisms.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2))
INPUT_SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32),
                                     y=tf.TensorSpec([None, 1], tf.int32))


def _model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Input(shape=(4,)),
      tf.keras.layers.Dense(2, kernel_initializer='zeros', bias_initializer='zeros')])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=INPUT_SPEC)


def _client_data():
  rng = np.random.default_rng(0)
  datasets = []
  for _ in range(NUM_CLIENTS):
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.int32)
    datasets.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(4))
  return datasets


def _train(aggregator, num_rounds, secure=False):
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      model_aggregator=aggregator)
  if secure:  # Simulate SecAgg in the default context (TFF's insecure bodies).
    replace = tff.backends.test.replace_secure_intrinsics_with_bodies
    process = types.SimpleNamespace(initialize=replace(process.initialize),
                                    next=replace(process.next))
  state = process.initialize()
  data = _client_data()
  weights = []
  for _ in range(num_rounds):
    output = process.next(state, data)
    state = output['state'] if isinstance(output, dict) else output.state
    model = state['global_model_weights'] if isinstance(state, dict) else state.global_model_weights
    trainable = model['trainable'] if isinstance(model, dict) else model.trainable
    weights.append(np.concatenate([np.ravel(w) for w in trainable]))
  return weights


CONSTRUCTORS = {
    'gaussian': lambda: CorrelatedNoiseFactory.gaussian(1.0, NUM_CLIENTS, 1.0, noise_seed=1),
    'tree': lambda: CorrelatedNoiseFactory.tree(1.0, NUM_CLIENTS, 1.0, noise_seed=1),
    'banded': lambda: CorrelatedNoiseFactory.banded(1.0, NUM_CLIENTS, 1.0, strategy=BANDED,
                                                    noise_seed=1),
    'blt': lambda: CorrelatedNoiseFactory.blt(1.0, NUM_CLIENTS, 1.0, strategy=BLT, noise_seed=1),
}


@pytest.mark.parametrize('name', sorted(CONSTRUCTORS))
def test_trains_three_rounds(name):
  weights = _train(CONSTRUCTORS[name](), 3)
  assert all(np.all(np.isfinite(w)) for w in weights)
  assert not np.allclose(weights[0], weights[-1])


@pytest.fixture(scope='module')
def plain_weights():
  return _train(CorrelatedNoiseFactory.blt(0.0, NUM_CLIENTS, 1.0, strategy=BLT), 3)


@pytest.mark.parametrize('bits', [16, 20])
def test_secure_matches_plain_within_discretization_bound(plain_weights, bits):
  config = SecureAggregation(bits=bits)
  factory = CorrelatedNoiseFactory.blt(0.0, NUM_CLIENTS, 1.0, strategy=BLT, secure=config)
  weights = _train(factory, 3, secure=True)
  assert all(np.all(np.isfinite(w)) for w in weights)
  dim = 4 * 2 + 2
  gamma = 1.0 / config.scale_factor(1.0, NUM_CLIENTS, dim)
  # Round 0 starts from the same model: the mean differs by at most the rounding of each client.
  bound = NUM_CLIENTS * gamma * math.sqrt(config.padded_dim(dim)) / NUM_CLIENTS
  error = np.linalg.norm(weights[0] - plain_weights[0])
  assert 0 < error <= bound
