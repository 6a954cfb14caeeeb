"""EMNIST models: the CNN of the FedAvg paper (McMahan et al. 2017, Sec. 3 "CNN") and a tiny model.

`fedavg_cnn`: two 5x5 convolutions (32 and 64 channels, each followed by 2x2 max pooling), a dense
layer of 512 units and a softmax layer; 1,663,370 parameters for 10 classes. `tiny`: a single dense
layer over the flattened image, for fast tests. Initializers are seeded so a run is reproducible.
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation
from experiments.emnist import MODELS

INPUT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, 28, 28, 1], tf.float32), y=tf.TensorSpec([None, 1], tf.int32))


def build_keras_model(name: str, num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
  """An uncompiled Keras model producing logits over `num_classes` classes."""
  _validation.check_one_of(name, 'model', MODELS)
  _validation.check_positive_int(num_classes, 'num_classes')
  seeds = iter(range(seed * 100, seed * 100 + 100))

  def init():
    return tf.keras.initializers.GlorotUniform(seed=next(seeds))

  layers = tf.keras.layers
  if name == 'tiny':
    body = [layers.Flatten(), layers.Dense(num_classes, kernel_initializer=init())]
  else:
    body = [
        layers.Conv2D(32, 5, padding='same', activation='relu', kernel_initializer=init()),
        layers.MaxPool2D(2, padding='same'),
        layers.Conv2D(64, 5, padding='same', activation='relu', kernel_initializer=init()),
        layers.MaxPool2D(2, padding='same'),
        layers.Flatten(),
        layers.Dense(512, activation='relu', kernel_initializer=init()),
        layers.Dense(num_classes, kernel_initializer=init()),
    ]
  return tf.keras.Sequential([layers.Input((28, 28, 1))] + body)


def loss_fn() -> tf.keras.losses.Loss:
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def metrics_fn():
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


def tff_model_fn(name: str, num_classes: int = 10, seed: int = 0):
  """A no-argument `model_fn` for `tff.learning` building the model `name`."""
  _validation.check_one_of(name, 'model', MODELS)

  def model_fn():
    return tff.learning.models.from_keras_model(
        build_keras_model(name, num_classes, seed), loss=loss_fn(), input_spec=INPUT_SPEC,
        metrics=metrics_fn())

  return model_fn
