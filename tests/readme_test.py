"""The README's usage example runs as written and trains one round."""

import collections
import pathlib
import re

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

_README = pathlib.Path(__file__).resolve().parent.parent / 'README.md'


def _usage_block() -> str:
  text = _README.read_text()
  section = text[text.index('## Plug it into a TFF training loop'):]
  return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def _model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(3,)),
                                     tf.keras.layers.Dense(2)])
  spec = collections.OrderedDict(x=tf.TensorSpec([None, 3], tf.float32),
                                 y=tf.TensorSpec([None, 1], tf.int32))
  return tff.learning.models.from_keras_model(
      keras_model, input_spec=spec,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def test_readme_example_trains_one_round():
  namespace = {'model_fn': _model_fn}
  exec(compile(_usage_block(), str(_README), 'exec'), namespace)  # noqa: S102
  process, state = namespace['process'], namespace['state']
  rng = np.random.default_rng(0)
  data = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.normal(size=(8, 3)).astype(np.float32),
      y=rng.integers(0, 2, size=(8, 1)).astype(np.int32))).batch(4) for _ in range(3)]
  output = process.next(state, data)
  weights = process.get_model_weights(output.state).trainable
  before = process.get_model_weights(state).trainable
  assert all(np.all(np.isfinite(w)) for w in weights)
  # Noise with multiplier 7 on 3 clients of clip 1 moves every weight.
  assert all(not np.allclose(a, b) for a, b in zip(weights, before, strict=True))
