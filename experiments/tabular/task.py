"""A tabular task as a user would write it for `python -m experiments.run_task
--task=experiments.tabular.task:build_task`: a two-layer MLP on `NUM_FEATURES` float features and
`NUM_CLASSES` classes, over clients whose data is in memory (`--data=synthetic`: a `TestClientData`
of `--synthetic_num_clients` clients) or in a SQLite file in TFF's `SqlClientData` format
(`--data=PATH`, e.g. written by `write_population` with TFF's own writer).

Each client's examples share its own feature shift (non-IID), and the label is the argmax of a
fixed linear map of the features, so the model can learn it.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff.training import task as task_lib
from experiments.run import sqlite_data

NUM_FEATURES = 20
NUM_CLASSES = 5
ELEMENT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([NUM_FEATURES], tf.float32), y=tf.TensorSpec([], tf.int32))
_EVAL_EXAMPLES = 500


def _examples(rng: np.random.Generator, count: int, weights: np.ndarray, shift: np.ndarray):
  x = (rng.normal(size=(count, NUM_FEATURES)) + shift).astype(np.float32)
  return collections.OrderedDict(x=x, y=np.argmax(x @ weights, axis=1).astype(np.int32))


def population(num_clients: int, examples_per_client: int, seed: int):
  """({client id: OrderedDict(x=, y=) arrays}, the central test examples) of a seeded population."""
  if num_clients < 1 or examples_per_client < 1:
    raise ValueError('`num_clients` and `examples_per_client` must be positive.')
  rng = np.random.default_rng(seed)
  weights = rng.normal(size=(NUM_FEATURES, NUM_CLASSES))
  clients = collections.OrderedDict(
      (f'client_{i:04d}', _examples(rng, examples_per_client, weights,
                                    rng.normal(scale=0.5, size=NUM_FEATURES)))
      for i in range(num_clients))
  return clients, _examples(rng, _EVAL_EXAMPLES, weights, np.zeros(NUM_FEATURES))


def write_population(path: str, num_clients: int, examples_per_client: int, seed: int) -> None:
  """Writes `population(...)`'s clients to `path` with TFF's `save_to_sql_client_data`."""
  clients, _ = population(num_clients, examples_per_client, seed)
  tff.simulation.datasets.save_to_sql_client_data(
      list(clients), lambda cid: tf.data.Dataset.from_tensor_slices(clients[cid]), path)


def keras_model(seed: int) -> tf.keras.Model:
  """The MLP: 20 -> 32 (ReLU) -> 5 logits."""
  initializer = lambda i: tf.keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(NUM_FEATURES,)),
      tf.keras.layers.Dense(32, activation='relu', kernel_initializer=initializer(0)),
      tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=initializer(1)),
  ])


def _loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build_task(config) -> task_lib.Task:
  """The task of `config` (`experiments.run.driver_config.DriverConfig`): its `data`, population
  size, batches, epochs and seed."""
  clients, test = population(config.synthetic_num_clients, config.synthetic_examples_per_client,
                             config.seed)
  if config.data == 'synthetic':
    train = tff.simulation.datasets.TestClientData(clients)
  else:  # checked as the drivers check theirs: a bad file is one line naming `--data`
    sqlite_data.check_sqlite_file(
        config.data, flag='data', expected="TFF's SqlClientData file of `write_population`",
        splits=('default_split',),
        features={'x': ('float_list', NUM_FEATURES), 'y': ('int64_list', 1)})
    train = tff.simulation.datasets.load_and_parse_sql_client_data(config.data, ELEMENT_SPEC)

  def preprocess(dataset):
    return dataset.repeat(config.client_epochs).batch(config.client_batch_size)

  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model(config.seed), loss=_loss(), input_spec=preprocess(
            tf.data.Dataset.from_tensor_slices(test)).element_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')])

  def keras_model_fn():
    model = keras_model(config.seed)
    model.compile(loss=_loss(), metrics=[tf.keras.metrics.SparseCategoricalAccuracy(
        name='accuracy')])
    return model

  return task_lib.Task(
      name=f'tabular ({config.data})', train_data=train, model_fn=model_fn,
      client_preprocess_fn=preprocess, keras_model_fn=keras_model_fn,
      eval_dataset=tf.data.Dataset.from_tensor_slices(test).batch(256))
