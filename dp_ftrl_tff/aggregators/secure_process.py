"""The aggregation process with SecAgg: the round of `process.RoundComputations` with secure sums.

The clipped records go through TFF's discretization / modular clipping / secure sum chain
(`secure.record_aggregation_factory`, its scale and prior norm bound following the active clip), and
the clipped / zeroed counts and the quantile bits through their own secure sums
(`secure.count_aggregation_factory`; the bits exactly, as integers:
`secure.quantile_bit_aggregation_factory`). The chains' states live in the aggregator state's
`secure_agg`; the correlated noise is added on the server after the secure sum, as with a plain
sum. The measurements add the scale factor, the record chain's `modular_wrap` and its own
measurements.
"""

import collections
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff.aggregators import secure as secure_lib
from dp_ftrl_tff.aggregators.process import MEASUREMENT_KEYS, RoundComputations


class SecureAggregationState(NamedTuple):
  """States of the SecAgg aggregations (`secure.py`).

  Attributes:
    record: the record chain's state (its scale and prior norm bound follow the active clip).
    count: the clipped / zeroed count sum's state.
    quantile: the quantile-bit sum's state (() with a fixed clip).
  """
  record: Any
  count: Any
  quantile: Any


class _Chains(NamedTuple):
  record: Any
  count: Any
  quantile: Any


def _chains(parts: RoundComputations, value_type) -> _Chains:
  """The record, count and (with adaptive clipping) quantile-bit aggregation processes."""
  plan = parts.plan
  m = plan.clients_per_round
  record = secure_lib.record_aggregation_factory(
      plan.secure, plan.secure.scale_factor(plan.clip_norm, m, parts.dim),
      plan.clip_norm).create(value_type)
  count = secure_lib.count_aggregation_factory(True, 1, 0).create(tff.TensorType(np.int32, [2]))
  quantile = (secure_lib.quantile_bit_aggregation_factory().create(tff.TensorType(np.float32))
               if plan.adaptive_clip is not None else None)
  return _Chains(record, count, quantile)


def _state_type(process) -> Any:
  return (tff.StructType([]) if process is None
          else process.initialize.type_signature.result.member)


def secure_process(parts: RoundComputations, value_type) -> tff.templates.AggregationProcess:
  """The process of `parts` with the secure sums (see the module docstring)."""
  plan, dim = parts.plan, parts.dim
  m = plan.clients_per_round
  adaptive = plan.adaptive_clip is not None
  chains = _chains(parts, value_type)
  plain_state_type = parts.init_state.type_signature.result
  record_type, count_type, quantile_type = (_state_type(p) for p in chains)

  @tff.tensorflow.computation(plain_state_type, record_type, count_type, quantile_type)
  def attach_secure_agg(state, record, count, quantile):
    return state._replace(secure_agg=SecureAggregationState(record, count, quantile))

  @tff.federated_computation
  def init_fn():
    quantile = chains.quantile.initialize() if adaptive else tff.federated_value((), tff.SERVER)
    return tff.federated_map(attach_secure_agg, (
        tff.federated_eval(parts.init_state, tff.SERVER), chains.record.initialize(),
        chains.count.initialize(), quantile))

  state_type = init_fn.type_signature.result
  client_params_fn = tff.tensorflow.computation(parts.client_params, state_type.member)
  value_sum_type = chains.record.next.type_signature.result.result.member

  @tff.tensorflow.computation(state_type.member, value_sum_type, tff.TensorType(np.int32, [2]),
                              tf.float32 if adaptive else tff.StructType([]), record_type,
                              count_type, quantile_type)
  def server_step(state, value_sum, counts, quantile_sum, record, count, quantile):
    new_state, result, measurements = parts.server_step(state, value_sum, counts,
                                                        quantile_sum if adaptive else None)
    # The record chain's scale and prior norm bound follow the (possibly new) active clip.
    record = secure_lib.with_clip(
        record, secure_lib.scale_factor_tensor(plan.secure, new_state.clip, m, dim), new_state.clip)
    new_state = new_state._replace(secure_agg=SecureAggregationState(record, count, quantile))
    return new_state, result, measurements

  @tff.federated_computation(state_type, tff.FederatedType(value_type, tff.CLIENTS))
  def next_fn(state, value):
    params = tff.federated_broadcast(tff.federated_map(client_params_fn, state))
    client_out = tff.federated_map(parts.client_fn, (value, params))
    record_out = chains.record.next(state.secure_agg.record, client_out[0])
    count_out = chains.count.next(state.secure_agg.count, client_out[1])
    if adaptive:
      quantile_out = chains.quantile.next(state.secure_agg.quantile, client_out[2])
      quantile_sum, quantile_state = quantile_out.result, quantile_out.state
    else:
      quantile_sum = quantile_state = tff.federated_value((), tff.SERVER)
    new_state, result, dp_measurements = tff.federated_map(server_step, (
        state, record_out.result, count_out.result, quantile_sum, record_out.state,
        count_out.state, quantile_state))
    measurements = collections.OrderedDict(
        (key, dp_measurements[key]) for key in MEASUREMENT_KEYS)
    measurements['scale_factor'] = dp_measurements['scale_factor']
    measurements['modular_wrap'] = _find_measurement(record_out.measurements, 'modular_wrap')
    measurements['record_agg'] = record_out.measurements
    return tff.templates.MeasuredProcessOutput(
        state=new_state, result=result, measurements=tff.federated_zip(measurements))

  return tff.templates.AggregationProcess(init_fn, next_fn)


def _find_measurement(measurements, key: str):
  """The server value named `key` in a nested federated measurements structure (depth first)."""
  names = tff.structure.name_list(measurements.type_signature.member)
  if key in names:
    return measurements[key]
  for name in names:
    if isinstance(measurements.type_signature.member[name], tff.types.StructType):
      found = _find_measurement(measurements[name], key)
      if found is not None:
        return found
  return None
