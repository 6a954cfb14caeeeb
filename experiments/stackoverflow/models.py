"""StackOverflow next-word prediction model and metrics (Reddi et al. 2021; BandMF / BLT papers).

Embedding (96) -> one LSTM layer (670 units) -> dense projection (96) -> logits over V + 4 ids
(vocabulary V = 10000 plus pad, OOV, BOS, EOS; see `data.special_tokens`); 4,050,748 parameters at
the papers' sizes. Padding is masked (`mask_zero`), so the loss ignores it. The accuracy metrics
follow the papers: with OOV (pad masked), without OOV, and without OOV or EOS.
"""

import collections
from typing import Sequence

import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation
from experiments.stackoverflow import data as so_data


class MaskedAccuracy(tf.keras.metrics.SparseCategoricalAccuracy):
  """Next-word accuracy over the positions whose true id is not in `masked_ids`."""

  def __init__(self, masked_ids: Sequence[int] = (0,), name: str = 'accuracy', dtype=None):
    super().__init__(name=name, dtype=dtype)
    self._masked_ids = [int(i) for i in masked_ids]

  def update_state(self, y_true, y_pred, sample_weight=None):
    y_true = tf.cast(tf.reshape(y_true, [-1, 1]), tf.int64)
    y_pred = tf.reshape(y_pred, [-1, tf.shape(y_pred)[-1]])
    keep = tf.reduce_all(tf.not_equal(y_true, tf.constant(self._masked_ids, tf.int64)), axis=-1)
    weight = tf.cast(keep, tf.float32)
    if sample_weight is not None:
      weight *= tf.reshape(tf.cast(sample_weight, tf.float32), [-1])
    return super().update_state(y_true, y_pred, sample_weight=weight)

  def get_config(self):
    return dict(super().get_config(), masked_ids=self._masked_ids)


def metrics_fn(vocab_size: int):
  """The papers' accuracy metrics for a vocabulary of `vocab_size` words."""
  ids = so_data.special_tokens(vocab_size)
  return [
      MaskedAccuracy([ids['pad']], name='accuracy_with_oov'),
      MaskedAccuracy([ids['pad'], ids['oov']], name='accuracy_no_oov'),
      MaskedAccuracy([ids['pad'], ids['oov'], ids['eos']], name='accuracy_no_oov_or_eos'),
  ]


def build_keras_model(vocab_size: int, embedding_size: int = 96, lstm_size: int = 670,
                      seed: int = 0) -> tf.keras.Model:
  """An uncompiled Keras model: int64[B, L] token ids -> logits [B, L, vocab_size + 4]."""
  vocab_size = _validation.check_positive_int(vocab_size, 'vocab_size')
  embedding_size = _validation.check_positive_int(embedding_size, 'embedding_size')
  lstm_size = _validation.check_positive_int(lstm_size, 'lstm_size')
  extended = vocab_size + 4
  glorot = tf.keras.initializers.GlorotUniform
  layers = tf.keras.layers
  return tf.keras.Sequential([
      layers.Input((None,), dtype=tf.int64),
      layers.Embedding(extended, embedding_size, mask_zero=True,
                       embeddings_initializer=tf.keras.initializers.RandomUniform(
                           -0.05, 0.05, seed=seed * 10)),
      layers.LSTM(lstm_size, return_sequences=True, kernel_initializer=glorot(seed=seed * 10 + 1),
                  recurrent_initializer=tf.keras.initializers.Orthogonal(seed=seed * 10 + 2)),
      layers.Dense(embedding_size, kernel_initializer=glorot(seed=seed * 10 + 3)),
      layers.Dense(extended, kernel_initializer=glorot(seed=seed * 10 + 4)),
  ])


def loss_fn() -> tf.keras.losses.Loss:
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def tff_model_fn(vocab_size: int, embedding_size: int, lstm_size: int, sequence_length: int,
                 seed: int = 0):
  """A no-argument `model_fn` for `tff.learning`."""
  input_spec = collections.OrderedDict(
      x=tf.TensorSpec([None, sequence_length], tf.int64),
      y=tf.TensorSpec([None, sequence_length], tf.int64))

  def model_fn():
    return tff.learning.models.from_keras_model(
        build_keras_model(vocab_size, embedding_size, lstm_size, seed), loss=loss_fn(),
        input_spec=input_spec, metrics=metrics_fn(vocab_size))

  return model_fn
