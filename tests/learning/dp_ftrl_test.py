"""Tests of the DP-FTRL learning process: server momentum, validation and restarts."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff.learning import dp_ftrl

pytestmark = pytest.mark.integration

SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 2], tf.float32),
                               y=tf.TensorSpec([None, 1], tf.float32))


def _model_fn():
  model = tf.keras.Sequential([tf.keras.layers.Input((2,)), tf.keras.layers.Dense(
      1, use_bias=False, kernel_initializer='zeros')])
  return tff.learning.models.from_keras_model(model, loss=tf.keras.losses.MeanSquaredError(),
                                              input_spec=SPEC)


@pytest.fixture(scope='module')
def process():
  # No noise, no effective clipping: the process must be plain FedAvg with server SGD-momentum.
  aggregator = tff.aggregators.UnweightedMeanFactory()
  return dp_ftrl.build_dp_ftrl_process(_model_fn, tff.learning.optimizers.build_sgdm(0.1),
                                       aggregator=aggregator,
                                       server_optimizer_fn=tff.learning.optimizers.build_sgdm(
                                           0.5, momentum=0.9))


def _client(x, y):
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=np.array(x, np.float32), y=np.array(y, np.float32))).batch(len(x))


_CLIENTS = [([[1.0, 0.0]], [[1.0]]), ([[0.0, 2.0]], [[-1.0]])]


def _by_hand(rounds, restart_rounds=()):
  """FedAvg with server SGD-momentum (lr 0.5, momentum 0.9) in numpy, the momentum buffer zeroed
  before the update of each restart round: the final weights."""
  w, buf = np.zeros(2), np.zeros(2)
  for t in range(rounds):
    deltas = []
    for x, y in _CLIENTS:  # one local SGD step on the MSE: grad = 2 x (x.w - y)
      x, y = np.array(x[0]), y[0][0]
      deltas.append(-0.1 * 2 * x * (x @ w - y))
    if t in restart_rounds:
      buf = np.zeros(2)
    buf = 0.9 * buf + -np.mean(deltas, axis=0)
    w = w - 0.5 * buf
  return w


def _train(process, rounds):
  data = [_client(x, y) for x, y in _CLIENTS]
  state = process.initialize()
  for _ in range(rounds):
    state = process.next(state, data).state
  return state


def test_matches_fedavg_with_momentum_by_hand(process):
  state = _train(process, 3)
  got = process.get_model_weights(state).trainable[0].reshape(-1)
  np.testing.assert_allclose(got, _by_hand(3), rtol=1e-5)


def test_restart_rounds_zero_the_momentum_inside_the_process():
  process = dp_ftrl.build_dp_ftrl_process(
      _model_fn, tff.learning.optimizers.build_sgdm(0.1),
      aggregator=tff.aggregators.UnweightedMeanFactory(),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5, momentum=0.9),
      restart_rounds=[3, 2])
  state = _train(process, 4)
  got = process.get_model_weights(state).trainable[0].reshape(-1)
  np.testing.assert_allclose(got, _by_hand(4, restart_rounds=(2, 3)), rtol=1e-5)
  # Not the unrestarted trajectory (the restarts change the weights).
  assert np.max(np.abs(_by_hand(4) - _by_hand(4, restart_rounds=(2, 3)))) > 1e-3
  assert state.finalizer['round'] == 4
  # The optimizer's hyperparameters stay reachable through the process.
  hparams = process.get_hparams(state)
  assert hparams['finalizer']['learning_rate'] == pytest.approx(0.5)
  hparams['finalizer']['learning_rate'] = 0.25
  changed = process.set_hparams(state, hparams)
  assert changed.finalizer['optimizer']['learning_rate'] == pytest.approx(0.25)
  assert changed.finalizer['round'] == 4


@pytest.mark.unit
@pytest.mark.parametrize('kwargs, match', [
    (dict(server_optimizer_fn=0.5), 'server_optimizer_fn'),
    (dict(server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), aggregator=object()),
     'aggregator'),
    (dict(restart_rounds=[0]), 'restart_rounds'),
    (dict(restart_rounds=[2, 2]), 'restart_rounds'),
    (dict(restart_rounds='3'), 'restart_rounds'),
    (dict(restart_rounds=3), 'restart_rounds'),
])
def test_validation(kwargs, match):
  kwargs.setdefault('aggregator', tff.aggregators.UnweightedMeanFactory())
  kwargs.setdefault('server_optimizer_fn', tff.learning.optimizers.build_sgdm(1.0))
  with pytest.raises(ValueError, match=match):
    dp_ftrl.build_dp_ftrl_process(_model_fn, tff.learning.optimizers.build_sgdm(0.1), **kwargs)


def test_non_finite_client_updates_are_counted_in_zeroed_count():
  from dp_ftrl_tff.aggregators import CorrelatedNoiseFactory
  factory = CorrelatedNoiseFactory.gaussian(0.0, 3, 10.0)
  ours = dp_ftrl.build_dp_ftrl_process(_model_fn, tff.learning.optimizers.build_sgdm(0.1),
                                       aggregator=factory,
                                       server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
  plain = tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn, tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), model_aggregator=factory)
  # The third client's label is NaN: its update is non-finite and TFF's client work zeroes it.
  data = [_client([[1.0, 0.0]], [[1.0]]), _client([[0.0, 2.0]], [[-1.0]]),
          _client([[1.0, 1.0]], [[np.nan]])]
  ours_out = ours.next(ours.initialize(), data)
  plain_out = plain.next(plain.initialize(), data)
  assert ours_out.metrics['aggregator']['zeroed_count'] == 1
  assert plain_out.metrics['aggregator']['zeroed_count'] == 0  # What TFF alone lets it see.
  for a, b in zip(ours.get_model_weights(ours_out.state).trainable,
                  plain.get_model_weights(plain_out.state).trainable, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  assert np.all(np.isfinite(ours.get_model_weights(ours_out.state).trainable[0]))
  with pytest.raises(ValueError, match='aggregator'):
    dp_ftrl.count_non_finite_updates(tff.aggregators.UnweightedMeanFactory())
