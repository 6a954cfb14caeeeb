"""A tiny learning process and client data for `tff.learning.programs.train_model` tests."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

NUM_CLIENTS = 12


def client_data(num_clients: int = NUM_CLIENTS):
  """A TFF client data of `num_clients` clients `c00`, `c01`, ..., 4 examples of x: [2], y: [1]."""
  rng = np.random.default_rng(0)
  return tff.simulation.datasets.TestClientData({
      f'c{i:02d}': collections.OrderedDict(
          x=rng.normal(size=(4, 2)).astype(np.float32),
          y=rng.normal(size=(4, 1)).astype(np.float32))
      for i in range(num_clients)})


def regression_process(client_data):
  """FedAvg on a one-layer regression, composed with `client_data`'s dataset computation so that
  it takes client ids (as `train_model` gives them)."""
  spec = (tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None, 1], tf.float32))

  def model_fn():
    keras_model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    return tff.learning.models.from_keras_model(keras_model, input_spec=spec,
                                                loss=tf.keras.losses.MeanSquaredError())

  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))
  batched = client_data.preprocess(lambda ds: ds.map(lambda e: (e['x'], e['y'])).batch(2))
  # The process takes client ids: each id becomes its dataset inside the computation.
  return tff.simulation.compose_dataset_computation_with_learning_process(
      batched.dataset_computation, process)
