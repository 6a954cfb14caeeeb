"""A process over client ids (`programs.client_ids`) trains as the process over Python datasets."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import aggregators
from dp_ftrl_tff.learning import canaries as canaries_lib
from dp_ftrl_tff.learning import dp_ftrl
from dp_ftrl_tff.programs import client_ids

pytestmark = pytest.mark.integration

SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                               y=tf.TensorSpec([None, 1], tf.float32))
CANARY_IDS = ['canary-a', 'canary-b']


def _model_fn():
  model = tf.keras.Sequential([tf.keras.layers.Input((2,)), tf.keras.layers.Dense(
      1, use_bias=False, kernel_initializer='ones')])
  return tff.learning.models.from_keras_model(model, loss=tf.keras.losses.MeanSquaredError(),
                                              input_spec=SPEC)


@pytest.fixture(scope='module')
def client_data():
  data = {f'c{i}': collections.OrderedDict(x=np.array([[i, 1.0], [1.0, -i]], np.float32),
                                           y=np.array([[1.0], [i]], np.float32))
          for i in range(3)}
  return tff.simulation.datasets.TestClientData(data).preprocess(lambda d: d.batch(2))


def _process(canaries=None):
  return dp_ftrl.build_dp_ftrl_process(
      _model_fn, tff.learning.optimizers.build_sgdm(0.1),
      aggregator=aggregators.CorrelatedNoiseFactory.gaussian(0.0, 3, 10.0),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), canaries=canaries)


def _assert_same(process, a, b):
  for x, y in zip(process.get_model_weights(a.state).trainable,
                  process.get_model_weights(b.state).trainable, strict=True):
    np.testing.assert_array_equal(x, y)


def test_without_canaries_it_is_tffs_composition(client_data):
  process = _process()
  over_ids = client_ids.process_over_client_ids(process, client_data)
  cohort = ['c2', 'c0', 'c1']
  got = over_ids.next(over_ids.initialize(), cohort)
  want = process.next(process.initialize(),
                      [client_data.create_tf_dataset_for_client(c) for c in cohort])
  _assert_same(process, got, want)
  # The same metrics, plus the round's number of clients.
  assert got.metrics[client_ids.COHORT_SIZE] == 3
  assert ({k: v for k, v in got.metrics.items() if k != client_ids.COHORT_SIZE}.keys()
          == want.metrics.keys())
  assert over_ids.next(over_ids.initialize(), []).metrics[client_ids.COHORT_SIZE] == 0


def test_canary_ids_give_the_canary_input_inside_the_computation(client_data):
  canaries = canaries_lib.Canaries(2, seed=5, norm=1.0)
  process = _process(canaries)
  over_ids = client_ids.process_over_client_ids(process, client_data, CANARY_IDS)
  cohort = ['c1', 'canary-b', 'c0']
  got = over_ids.next(over_ids.initialize(), cohort)
  assert got.metrics[client_ids.COHORT_SIZE] == 3  # the canary counts
  empty = client_data.create_tf_dataset_for_client('c0').take(0)
  want = process.next(process.initialize(), canaries_lib.client_data(
      [client_data.create_tf_dataset_for_client('c1'), empty,
       client_data.create_tf_dataset_for_client('c0')], [canaries_lib.NOT_A_CANARY, 1,
                                                         canaries_lib.NOT_A_CANARY]))
  _assert_same(process, got, want)
  projections = got.metrics['aggregator'][canaries_lib.PROJECTIONS_MEASUREMENT]
  np.testing.assert_array_equal(
      projections, want.metrics['aggregator'][canaries_lib.PROJECTIONS_MEASUREMENT])
  # Canary b (index 1) was inserted: its projection stands out from canary a's.
  assert abs(projections[1]) > abs(projections[0])


@pytest.mark.parametrize('kwargs, match', [
    (dict(process='p'), 'process'),
    (dict(client_data=['c0']), 'client_data'),
    (dict(canary_ids='canary-a'), 'canary_ids'),
    (dict(canary_ids=['c0']), 'canary_ids'),
    (dict(canary_ids=['x', 'x']), 'canary_ids'),
    (dict(canary_ids=CANARY_IDS), 'process'),  # a process without canaries
])
def test_validation(client_data, kwargs, match):
  args = dict(process=_process(), client_data=client_data, canary_ids=())
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    client_ids.process_over_client_ids(**args)
