"""Shared helpers for the streaming-noise tests: run a noise state, rebuild z, form the dense reference.

A run is a list of segment lengths: the segments stream back to back with `restart` between them.
Results are structures like the value specs whose leaves are arrays [rounds, leaf size] (the stream in
the leaves' dtype, the references in float64). The reference is stddev * blockdiag(M_1, M_2, ...) @ Z
with M_i = `noise_matrix_fn(m_i)` and Z[r] = `base.standard_normal_row(seed, r, specs)` rebuilt here,
independently of the noise state.
"""

import collections

import numpy as np
import scipy.linalg
import tensorflow as tf

from dp_ftrl_tff.noise import base


def value_specs(dtype):
  """A small model-like value structure: a matrix, a vector and a scalar of `dtype`."""
  return collections.OrderedDict(
      kernel=tf.TensorSpec([3, 2], dtype), bias=tf.TensorSpec([4], dtype),
      scalar=tf.TensorSpec([], dtype))


def _stack_rounds(rounds):
  """[round structures] -> one structure of arrays [rounds, leaf size]."""
  return tf.nest.map_structure(lambda *leaves: np.stack([np.reshape(x, -1) for x in leaves]),
                               *rounds)


def _run(state, step, restart, segment_lengths, stddev):
  rounds = []
  for index, length in enumerate(segment_lengths):
    if index:
      state = restart(state)
    for _ in range(length):
      value, state = step(state, stddev)
      rounds.append(tf.nest.map_structure(np.asarray, value))
  return _stack_rounds(rounds), state


def run_stream(noise, specs, seed, segment_lengths, *, stddev=1.0, tf_function=False):
  """(stream, final state): `noise` run eagerly (or through `tf.function`) over the segments."""
  step, restart = noise.next, noise.restart
  if tf_function:
    step, restart = tf.function(step), tf.function(restart)
  return _run(noise.initial_state(specs, seed), step, restart, segment_lengths,
              tf.constant(stddev, tf.float32))


def run_stream_in_tff(noise, specs, noise_seed, segment_lengths):
  """(stream, final state, step computation): the same run inside TFF computations (stddev 1).

  Also checks that TFF hands `next` and `restart` the state's own NamedTuple class.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  state_type = type(noise.initial_state(specs, base.initial_seed(noise_seed)))

  @tff.tensorflow.computation
  def init():
    return noise.initial_state(specs, base.initial_seed(noise_seed))

  @tff.tensorflow.computation(init.type_signature.result, np.float32)
  def step(state, stddev):
    assert isinstance(state, state_type)
    return noise.next(state, stddev)

  @tff.tensorflow.computation(init.type_signature.result)
  def restart(state):
    assert isinstance(state, state_type)
    return noise.restart(state)

  stream, state = _run(init(), step, restart, segment_lengths, 1.0)
  return stream, state, step


def z_rows(specs, seed, num_rows):
  """Z[0 .. num_rows - 1] rebuilt from `standard_normal_row`: structure of float64 [rows, leaf size]."""
  return _stack_rounds([
      tf.nest.map_structure(lambda x: np.asarray(x, np.float64),
                            base.standard_normal_row(seed, tf.constant(r, tf.int64), specs))
      for r in range(num_rows)])


def expected_stream(noise_matrix_fn, segment_lengths, specs, seed, *, stddev=1.0):
  """(reference, number of z rows): stddev * blockdiag(noise_matrix_fn(m) per segment) @ Z."""
  matrix = scipy.linalg.block_diag(*[noise_matrix_fn(m) for m in segment_lengths])
  z = z_rows(specs, seed, matrix.shape[1])
  return tf.nest.map_structure(lambda z_leaf: stddev * (matrix @ z_leaf), z), matrix.shape[1]


def flat(structure):
  """The leaves side by side: [rounds, total size]."""
  return np.concatenate(tf.nest.flatten(structure), axis=1)
