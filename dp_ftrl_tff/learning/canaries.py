"""Canary clients for empirical privacy estimation (one-shot EPE, Andrew et al. ICLR 2024).

A run with canaries has `num_canaries` extra clients in its population. Canary i (0-based) has a
seeded random unit direction c_i in the space of the model's trainable weights (all tensors
flattened in order, float32) and, whenever the sampler picks it, returns c_i * `norm` as its model
update instead of training: with `norm` = the fixed clip, its clipped update is exactly c_i * clip;
with adaptive clipping, give a norm above any clip the run can reach and the aggregator's clip
brings it to c_i * (the current clip) (such a canary counts as an update above the clip in the
quantile estimate, as a client with a large update would). Directions `num_canaries` ..
2 * `num_canaries` - 1 are never inserted: the unseen canaries of the null distribution.

The process records, as the aggregator measurement `canary_projections` (float32[2N]), the
projection <c_i, x_t> of each round's released update x_t (the noisy MEAN the aggregator returns,
in TFF's update convention: initial minus trained weights) on every direction. Everything the
auditing needs is then small: a 2N x rounds array and the final model delta's cosines
(`projections(...)` of the final minus initial weights), read by `dp_ftrl_tff.auditing`.

Direction i is `tf.random.stateless_normal([d], seed=(seed, i))` normalized to unit L2 norm, so
the aggregator (in-graph), the driver (eagerly) and any later reader regenerate the same vector on
any CPU. A process with canaries takes, per client, the structure `(data=dataset,
canary=one-element dataset of the canary index)` with `NOT_A_CANARY` for a real client
(`client_data` builds it; TFF's client data must be sequences); a canary's dataset is never read (give any
dataset of the task's type; an empty one costs nothing).
"""

import collections
import dataclasses
from typing import Any, List, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation

#: The canary index of a real client in `client_data`.
NOT_A_CANARY = -1

#: The aggregator measurement holding a round's projections (float32[2 * num_canaries]).
PROJECTIONS_MEASUREMENT = 'canary_projections'


@dataclasses.dataclass(frozen=True)
class Canaries:
  """The canaries of a run.

  Attributes:
    num_canaries: N >= 1 inserted (seen) canaries, and as many unseen directions.
    seed: the directions' seed (an int64; directions of two runs with one seed coincide).
    norm: the L2 norm of a canary's update (> 0), in the units of the clip norm: the clip for a
      fixed clip; above the largest reachable clip with adaptive clipping.
  """
  num_canaries: int
  seed: int
  norm: float

  def __post_init__(self):
    _validation.check_positive_int(self.num_canaries, 'num_canaries')
    if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool):
      raise ValueError(f'`seed` must be an integer, got {self.seed!r}.')
    _validation.check_positive_float(self.norm, 'norm')

  @property
  def num_directions(self) -> int:
    """2N: the seen directions 0 .. N-1, then the unseen N .. 2N-1."""
    return 2 * self.num_canaries


def _size(specs) -> int:
  return sum(int(np.prod(spec.shape)) for spec in specs)


def direction(canaries: Canaries, index, dimension: int) -> tf.Tensor:
  """Direction `index` (a scalar int tensor or int in 0 .. 2N-1): float32[dimension], unit norm."""
  seed = tf.stack([tf.constant(canaries.seed, tf.int64), tf.cast(index, tf.int64)])
  vector = tf.random.stateless_normal([dimension], seed=seed, dtype=tf.float32)
  return vector / tf.norm(vector)


def _flatten(tensors) -> tf.Tensor:
  return tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tf.nest.flatten(tensors)], 0)


def projections(canaries: Canaries, weights) -> tf.Tensor:
  """<c_i, weights> for the 2N directions: float32[2N]. `weights` is a structure of float tensors
  (e.g. a model update), flattened in `tf.nest` order; each direction is drawn once (2N * d
  normals; seconds for millions of weights)."""
  flat = _flatten(weights)
  dimension = int(flat.shape[0])
  return tf.map_fn(lambda i: tf.tensordot(direction(canaries, i, dimension), flat, 1),
                   tf.range(canaries.num_directions), fn_output_signature=tf.float32)


def canary_update(canaries: Canaries, index, update) -> Any:
  """Canary `index`'s update: c_index * norm, in the structure, shapes and dtypes of `update` (a
  structure of tensors, flattened in `tf.nest` order)."""
  tensors = tf.nest.flatten(update)
  flat = direction(canaries, index, _size(tensors)) * canaries.norm
  parts, start = [], 0
  for tensor in tensors:
    size = int(np.prod(tensor.shape))
    parts.append(tf.cast(tf.reshape(flat[start:start + size], tensor.shape), tensor.dtype))
    start += size
  return tf.nest.pack_sequence_as(update, parts)


def canary_client_work(client_work: tff.learning.templates.ClientWorkProcess,
                       canaries: Canaries) -> tff.learning.templates.ClientWorkProcess:
  """`client_work` whose clients take `client_data`'s structure: a real client
  (`NOT_A_CANARY`) trains as before; canary i returns c_i * norm with weight 1 (its dataset is
  passed through and must be empty or its metrics count)."""
  state_type, weights_type, data_type = client_work.next.type_signature.parameter
  # TFF's client data must be sequences: the index is a one-element dataset.
  pair_type = tff.StructType([('data', data_type.member),
                              ('canary', tff.SequenceType(tff.TensorType(np.int32)))])
  result_type = client_work.next.type_signature.result.result.member

  @tff.tensorflow.computation(result_type, tff.SequenceType(tff.TensorType(np.int32)))
  def insert(result, canary_dataset):
    canary = canary_dataset.reduce(np.int32(NOT_A_CANARY), lambda _, index: index)
    is_canary = canary >= 0
    update = tf.cond(is_canary,
                     lambda: canary_update(canaries, tf.maximum(canary, 0), result.update),
                     lambda: result.update)
    weight = tf.where(is_canary, tf.ones_like(result.update_weight), result.update_weight)
    return tff.learning.templates.ClientResult(update=update, update_weight=weight)

  @tff.federated_computation(state_type, weights_type, tff.FederatedType(pair_type, tff.CLIENTS))
  def next_fn(state, weights, pairs):
    output = client_work.next(state, weights, pairs.data)
    results = tff.federated_map(insert, (output.result, pairs.canary))
    return tff.templates.MeasuredProcessOutput(output.state, results, output.measurements)

  return tff.learning.templates.ClientWorkProcess(
      client_work.initialize, next_fn, get_hparams_fn=client_work.get_hparams,
      set_hparams_fn=client_work.set_hparams)


class _ProjectionFactory(tff.aggregators.WeightedAggregationFactory):
  """See `projection_factory`."""

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory, canaries: Canaries):
    self._inner, self._canaries = inner, canaries

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    inner_process = self._inner.create(value_type, weight_type)
    canaries = self._canaries

    @tff.tensorflow.computation(value_type)
    def project(value):
      return projections(canaries, value)

    @tff.federated_computation(inner_process.initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      output = inner_process.next(state, value, weight)
      names = tff.structure.name_list(output.measurements.type_signature.member)
      fields = collections.OrderedDict((name, output.measurements[name]) for name in names)
      fields[PROJECTIONS_MEASUREMENT] = tff.federated_map(project, output.result)
      return tff.templates.MeasuredProcessOutput(output.state, output.result,
                                                 tff.federated_zip(fields))

    return tff.templates.AggregationProcess(inner_process.initialize, next_fn)


def projection_factory(inner: tff.aggregators.WeightedAggregationFactory, canaries: Canaries
                       ) -> tff.aggregators.WeightedAggregationFactory:
  """`inner` whose measurements also hold `canary_projections`: the released (aggregated) update's
  projections on the 2N canary directions. `inner`'s measurements must be a named structure."""
  if not isinstance(inner, tff.aggregators.WeightedAggregationFactory):
    raise ValueError('`inner` must be a tff.aggregators.WeightedAggregationFactory, got '
                     f'{type(inner).__name__}.')
  if not isinstance(canaries, Canaries):
    raise ValueError(f'`canaries` must be Canaries, got {type(canaries).__name__}.')
  return _ProjectionFactory(inner, canaries)


def client_data(datasets: Sequence[Any], canary_indices: Sequence[int]) -> List[tuple]:
  """The per-client input of a process with canaries: `(data=dataset, canary=a one-element
  dataset of the canary index)` structures, with `NOT_A_CANARY` for a real client."""
  if len(datasets) != len(canary_indices):
    raise ValueError(f'`canary_indices` must have one entry per dataset ({len(datasets)}), got '
                     f'{len(canary_indices)}.')
  return [collections.OrderedDict(data=dataset, canary=tf.data.Dataset.from_tensors(np.int32(index)))
          for dataset, index in zip(datasets, canary_indices, strict=True)]
