"""A learning process over client ids: each id's input is built inside the computation.

`process_over_client_ids(process, client_data, canary_ids)` is what a loop over a client-id data
source (`programs.data_source.SampledClientDataSource`, TFF's `ClientIdDataSource`) trains: its
`next` takes the round's client ids, as `tff.learning.programs.train_model` passes them, and its
metrics add `cohort_size`, the number of clients of the round. Without
canaries it is TFF's `compose_dataset_computation_with_learning_process` of the ClientData's
dataset computation. With canaries (a process of `learning.dp_ftrl.build_dp_ftrl_process(...,
canaries=)`) the population is the data's clients plus `canary_ids`: a client's input is
`OrderedDict(data=its dataset, canary=NOT_A_CANARY)` and canary i's is an empty dataset of the
data's type with index i, the structure `learning.canaries.client_data` builds in Python; TFF's
composition takes only computations that return one sequence, which this input is not.
"""

import collections
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff.learning import canaries as canaries_lib

#: The metric (top level of the process's metrics) counting the round's clients.
COHORT_SIZE = 'cohort_size'


def process_over_client_ids(process: tff.learning.templates.LearningProcess,
                            client_data: tff.simulation.datasets.ClientData,
                            canary_ids: Sequence[str] = ()
                            ) -> tff.learning.templates.LearningProcess:
  """`process` taking the ids of `client_data`'s clients (and of `canary_ids`) at CLIENTS.

  Args:
    process: a learning process whose `next` takes each client's dataset of `client_data`'s
      element type or, with `canary_ids`, the canary structure (see the module docstring).
    client_data: the (preprocessed) `tff.simulation.datasets.ClientData` of the population; it
      needs a `serializable_dataset_fn` (a TF function of the client id), as TFF's dataset
      computation does.
    canary_ids: the ids of the canary clients, canary i the i-th; none of `client_data`'s.

  Returns:
    A `tff.learning.templates.LearningProcess` with `process`'s state, weights and hparams.

  Raises:
    ValueError: a bad argument (naming it), or a `process` whose client input is not the one
      `canary_ids` asks for.
  """
  if not isinstance(process, tff.learning.templates.LearningProcess):
    raise ValueError(f'`process` must be a LearningProcess, got {type(process).__name__}.')
  if not isinstance(client_data, tff.simulation.datasets.ClientData):
    raise ValueError(f'`client_data` must be a ClientData, got {type(client_data).__name__}.')
  if isinstance(canary_ids, (str, bytes)) or not all(isinstance(c, str) for c in canary_ids):
    raise ValueError(f'`canary_ids` must be a sequence of client ids, got {canary_ids!r}.')
  canary_ids = list(canary_ids)
  if len(set(canary_ids)) != len(canary_ids) or set(canary_ids) & set(client_data.client_ids):
    raise ValueError('`canary_ids` must be distinct and none of `client_data`\'s client ids.')
  if not canary_ids:
    return _counting_clients(tff.simulation.compose_dataset_computation_with_learning_process(
        client_data.dataset_computation, process))
  dataset_fn = client_data.serializable_dataset_fn
  stand_in = client_data.client_ids[0]  # a canary's data: none of this client's elements

  @tff.tensorflow.computation(np.str_)
  def client_input(client_id):
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(canary_ids), tf.range(len(canary_ids), dtype=tf.int32)),
        default_value=tf.constant(canaries_lib.NOT_A_CANARY, tf.int32))
    index = table.lookup(client_id)
    is_canary = tf.not_equal(index, canaries_lib.NOT_A_CANARY)
    data = dataset_fn(tf.where(is_canary, tf.constant(stand_in), client_id))
    return collections.OrderedDict(
        data=data.take(tf.where(is_canary, tf.constant(0, tf.int64), tf.constant(-1, tf.int64))),
        canary=tf.data.Dataset.from_tensors(index))

  client_type = process.next.type_signature.parameter[1]
  if not client_type.member.is_assignable_from(client_input.type_signature.result):
    raise ValueError(f'`process` takes {client_type}, not the canary input '
                     f'{client_input.type_signature.result} of `canary_ids`.')
  state_type = process.next.type_signature.parameter[0]

  @tff.federated_computation(state_type, tff.FederatedType(np.str_, tff.CLIENTS))
  def next_fn(state, client_ids):
    return process.next(state, tff.federated_map(client_input, client_ids))

  return _counting_clients(tff.learning.templates.LearningProcess(
      process.initialize, next_fn, process.get_model_weights, process.set_model_weights,
      get_hparams_fn=process.get_hparams, set_hparams_fn=process.set_hparams))


def _counting_clients(process: tff.learning.templates.LearningProcess
                      ) -> tff.learning.templates.LearningProcess:
  """`process` (over client ids) whose metrics also hold `cohort_size`: the number of clients the
  round ran on (0 for an empty Poisson cohort), summed by the computation itself."""
  state_type, ids_type = process.next.type_signature.parameter
  metric_names = tff.structure.name_list(process.next.type_signature.result.metrics.member)

  @tff.tensorflow.computation(np.str_)
  def one(client_id):
    del client_id
    return np.int32(1)

  @tff.federated_computation(state_type, ids_type)
  def next_fn(state, client_ids):
    output = process.next(state, client_ids)
    metrics = collections.OrderedDict((name, output.metrics[name]) for name in metric_names)
    metrics[COHORT_SIZE] = tff.federated_sum(tff.federated_map(one, client_ids))
    return tff.learning.templates.LearningProcessOutput(output.state, tff.federated_zip(metrics))

  return tff.learning.templates.LearningProcess(
      process.initialize, next_fn, process.get_model_weights, process.set_model_weights,
      get_hparams_fn=process.get_hparams, set_hparams_fn=process.set_hparams)
