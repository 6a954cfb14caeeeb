"""A task whose model does not fit its data fails before any TFF computation with one line naming
the model function and the batch spec (TFF's executor would fail with a long gRPC error)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import training
from dp_ftrl_tff.training import model_checks, run_start

pytestmark = pytest.mark.unit


def _task(num_outputs: int, labels: np.ndarray) -> training.Task:
  rng = np.random.default_rng(0)
  clients = {f'c{i}': collections.OrderedDict(
      x=rng.normal(size=(len(labels), 4)).astype(np.float32), y=labels) for i in range(8)}
  data = tff.simulation.datasets.TestClientData(clients)

  def preprocess(dataset):
    return dataset.batch(2)

  spec = preprocess(data.create_tf_dataset_for_client('c0')).element_spec

  def my_model_fn():
    model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)),
                                 tf.keras.layers.Dense(num_outputs)])
    return tff.learning.models.from_keras_model(
        model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=spec)

  return training.Task(train_data=data, model_fn=my_model_fn, client_preprocess_fn=preprocess,
                       evaluate_fn=lambda weights: {})


def test_a_fitting_model_passes_and_its_parameters_are_counted():
  task = _task(5, np.array([0, 4, 2, 1], np.int32))
  assert model_checks.check_model_fits_data(task) == 4 * 5 + 5


@pytest.mark.parametrize('num_outputs, labels', [
    (3, np.array([0, 4, 2, 1], np.int32)),  # labels beyond the outputs
    (5, np.zeros((4, 2), np.int32)),  # labels of another shape
], ids=['label_values', 'label_shape'])
def test_a_model_that_does_not_fit_its_labels_is_one_line(num_outputs, labels):
  task = _task(num_outputs, labels)
  with pytest.raises(ValueError, match=r"the task's model \(`model_fn` .*my_model_fn\) does not "
                     r"fit its data: a batch of client 'c0' \(element spec .*y.*\) fails its "
                     r'forward pass: ') as error:
    model_checks.check_model_fits_data(task)
  assert '\n' not in str(error.value)


def test_train_refuses_it_before_any_round(tmp_path):
  task = _task(3, np.array([0, 4, 2, 1], np.int32))
  config = training.RunConfig(rounds=2, clients_per_round=2, mechanism='gaussian', min_sep=1)
  with pytest.raises(run_start.SetupError, match="does not fit its data"):
    training.train(task, config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run' / 'metrics.csv').exists()
