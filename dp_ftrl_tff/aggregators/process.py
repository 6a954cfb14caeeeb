"""The computations of one aggregation round, and the process with a plain sum.

`RoundComputations.build(plan, ...)` turns a `RunPlan` into the pieces every round is made of: the
initial state, what the clients need of it, the client step (zeroing, clipping, counts, the quantile
bit) and the server step (noise, mean, restarts, adaptive clip, measurements). `plain_process`
assembles them into an `AggregationProcess` whose round is one broadcast, one client map, ONE
federated sum of (update, counts[, quantile bit]) and one server map that returns the whole output:
each intrinsic, selection and state node costs executor work per round
(docs/benchmarks/aggregators.md), so a round has fewer of them than TFF's
`DifferentiallyPrivateFactory`. With SecAgg the sums go through their own chains instead
(`secure_process`).

The state is flat on purpose: TFF's executor serializes every node of the state (struct or tensor)
twice per round, at a fixed cost each, so the state holds only what cannot be recomputed (the noise
multiplier is a constant of the plan, the post-rounding sensitivity bound a function of the clip).
"""

import collections
import dataclasses
import json
from typing import Any, Callable, NamedTuple, Optional

import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.aggregators import adaptive_clipping as adaptive_lib
from dp_ftrl_tff.aggregators import clipping
from dp_ftrl_tff.aggregators import secure as secure_lib
from dp_ftrl_tff.noise import base as noise_base

#: Keys of the measurements `next` reports (server placed), in this order.
MEASUREMENT_KEYS = ('round', 'segment', 'restart', 'clip', 'sensitivity_clip', 'quantile_estimate',
                    'clipped_count', 'zeroed_count', 'noise_stddev')


class CorrelatedNoiseState(NamedTuple):
  """The aggregation process state (server placed; a flat structure of tensors).

  Attributes:
    round: int64, 0-based index of the NEXT round.
    segment: int64, index of the current mechanism segment (number of restarts so far).
    clip: float32, active L2 clip zeta (clipping and noise calibration).
    mechanism: tf.string, JSON of the plan (`RunPlan.to_config(fingerprint_arrays=True)`): what an
      accountant needs, with big arrays as a SHA-256 fingerprint.
    noise_state: the `dp_ftrl_tff.noise` state of the model noise (holds the seed).
    quantile_state: TF-Privacy quantile estimator state with the count noise, or () (fixed clip).
    secure_agg: `SecureAggregationState` with SecAgg, or () with a plain sum (which keeps no state).
  """
  round: Any
  segment: Any
  clip: Any
  mechanism: Any
  noise_state: Any
  quantile_state: Any
  secure_agg: Any


class _ClientParams(NamedTuple):
  clip: Any
  quantile_params: Any


@dataclasses.dataclass(frozen=True)
class RoundComputations:
  """The pieces of a round for one plan and one value type (see the module docstring).

  Attributes:
    plan: the `RunPlan`.
    dim: the number of coordinates of a client update.
    init_state: TFF computation () -> `CorrelatedNoiseState` (without `secure_agg`).
    client_params: Python function state -> what the clients need (clip, quantile parameters).
    client_params_fn: `client_params` as a TFF computation of the plain state.
    client_fn: TFF computation (value, params) -> (clipped value, counts[, quantile bit]).
    server_step: Python function (state, value sum, counts, quantile sum or None) -> (state,
      result, measurements), in TF; `secure_agg` passes through.
  """
  plan: plan_lib.RunPlan
  dim: int
  init_state: Any
  client_params: Callable[..., Any]
  client_params_fn: Any
  client_fn: Any
  server_step: Callable[..., Any]

  @classmethod
  def build(cls, plan: plan_lib.RunPlan, make_noise: Callable[[], noise_base.StreamingNoise],
            noise_seed: Optional[int], value_type, value_specs, dim: int) -> 'RoundComputations':
    """The round of `plan` for client updates of `value_type` (specs `value_specs`, `dim`
    coordinates); `make_noise` returns a fresh stream of the plan's mechanism."""
    value_noise = make_noise()
    adaptive = plan.adaptive_clip
    quantile_query = None
    if adaptive is not None:
      quantile_query = adaptive_lib.CorrelatedQuantileEstimatorQuery(
          make_noise, initial_estimate=plan.clip_norm,
          target_quantile=adaptive.target_unclipped_quantile,
          learning_rate=adaptive.clip_learning_rate,
          clipped_count_stddev=plan.clipped_count_stddev, expected_num_records=plan.clients_per_round)
    mechanism_json = json.dumps(plan.to_config(fingerprint_arrays=True), sort_keys=True)

    @tff.tensorflow.computation
    def init_state():
      seed = noise_base.initial_seed(noise_seed)
      quantile_state = (quantile_query.initial_global_state(adaptive_lib.count_seed(seed))
                        if adaptive is not None else ())
      zero = tf.constant(0, tf.int64)
      return CorrelatedNoiseState(
          round=zero, segment=zero, clip=tf.constant(plan.clip_norm, tf.float32),
          mechanism=tf.constant(mechanism_json),
          noise_state=value_noise.initial_state(value_specs, seed), quantile_state=quantile_state,
          secure_agg=())

    def client_params(state):
      quantile_params = (quantile_query.derive_sample_params(state.quantile_state)
                         if adaptive is not None else ())
      return _ClientParams(clip=state.clip, quantile_params=quantile_params)

    client_params_fn = tff.tensorflow.computation(client_params, init_state.type_signature.result)

    @tff.tensorflow.computation(value_type, client_params_fn.type_signature.result)
    def client_fn(value, params):
      result = clipping.zero_and_clip(value, params.clip, plan.zeroing_norm)
      counts = tf.stack([result.was_clipped, result.was_zeroed])
      if adaptive is None:
        return result.value, counts
      quantile_record = quantile_query.preprocess_record(params.quantile_params, result.norm)
      return result.value, counts, quantile_record

    return cls(plan=plan, dim=dim, init_state=init_state, client_params=client_params,
               client_params_fn=client_params_fn, client_fn=client_fn,
               server_step=_server_step(plan, value_noise, quantile_query, dim))


def _server_step(plan: plan_lib.RunPlan, value_noise: noise_base.StreamingNoise, quantile_query,
                 dim: int) -> Callable[..., Any]:
  """The server step of a round (see `RoundComputations.server_step`)."""
  m = plan.clients_per_round
  secure, restarts = plan.secure, plan.restarts
  noise_multiplier = plan.value_noise_multiplier

  def sensitivity(clip):
    # With SecAgg the post-rounding bound follows the active clip (TFF's DistributedDpSumFactory
    # keeps its scale and norm bound in its state the same way).
    return clip if secure is None else secure_lib.sensitivity_clip(secure, clip, m, dim)

  def step(state, value_sum, counts, quantile_sum):
    sensitivity_clip = sensitivity(state.clip)
    stddev = tf.constant(noise_multiplier, tf.float32) * sensitivity_clip
    noise, noise_state = value_noise.next(state.noise_state, stddev)
    result = tf.nest.map_structure(lambda s, z: (s + z) / tf.constant(m, s.dtype), value_sum, noise)
    next_round = state.round + 1
    # A new segment starts on the schedule, or when the stream has no rounds left in its segment
    # (a banded strategy with beyond_max_rounds='restart'): either way it is counted here.
    restart = value_noise.segment_ended(noise_state)
    if restarts is not None and restarts.rounds != ():  # `RestartSchedule.at(())`: never
      restart = tf.logical_or(restart, adaptive_lib.is_restart_round(restarts, next_round))
    clip, quantile_state, estimate = state.clip, state.quantile_state, state.clip
    if quantile_query is not None:
      _, quantile_state, _ = quantile_query.get_noised_result(quantile_sum, quantile_state)
      estimate = quantile_state.current_estimate
      clip = tf.where(restart, estimate, clip)
      quantile_state = tf.cond(restart, lambda: quantile_query.restart(quantile_state),
                               lambda: quantile_state)
    static_restart = tf.get_static_value(restart)
    if static_restart is None or bool(static_restart):  # no restart op when none can happen
      noise_state = tf.cond(restart, lambda: value_noise.restart(noise_state), lambda: noise_state)
    new_state = state._replace(round=next_round, segment=state.segment + tf.cast(restart, tf.int64),
                               clip=clip, noise_state=noise_state, quantile_state=quantile_state)
    measurements = collections.OrderedDict(
        round=state.round, segment=state.segment, restart=restart, clip=state.clip,
        sensitivity_clip=sensitivity_clip, quantile_estimate=estimate, clipped_count=counts[0],
        zeroed_count=counts[1], noise_stddev=stddev)
    if secure is not None:
      measurements['scale_factor'] = secure_lib.scale_factor_tensor(secure, state.clip, m, dim)
    return new_state, result, measurements

  return step


def plain_process(parts: RoundComputations, value_type) -> tff.templates.AggregationProcess:
  """The process with a plain sum: one federated sum of the client tuple and one server
  computation that returns the whole (state, result, measurements) in its final structure."""
  adaptive = parts.plan.adaptive_clip is not None
  state_type = parts.init_state.type_signature.result

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(parts.init_state, tff.SERVER)

  @tff.tensorflow.computation(state_type, parts.client_fn.type_signature.result)
  def server_step(state, sums):
    return parts.server_step(state, sums[0], sums[1], sums[2] if adaptive else None)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(value_type, tff.CLIENTS))
  def next_fn(state, value):
    params = tff.federated_broadcast(tff.federated_map(parts.client_params_fn, state))
    client_out = tff.federated_map(parts.client_fn, (value, params))
    output = tff.federated_map(server_step, (state, tff.federated_sum(client_out)))
    return tff.templates.MeasuredProcessOutput(state=output[0], result=output[1],
                                               measurements=output[2])

  return tff.templates.AggregationProcess(init_fn, next_fn)
