"""The DP-FTRL learning process: unweighted FedAvg, a correlated-noise aggregator, server momentum.

DP-FTRL (Kairouz et al. 2021, Sec. 4 and App. E "DP-FTRLM"; BandMF paper Sec. 6; BLT paper Sec. 5) in
its gradient-space form: the aggregator releases, in round t, the noisy mean model delta
x_t + sigma * zeta * (C^-1 z)_t / clients_per_round, and the server applies it with SGD with momentum.
Everything after the aggregator is post-processing, so the privacy of the model is the privacy of the
aggregator (the tree mechanism in this form is the residual of the noisy prefix sums).

Restarts (DP-FTRL paper Sec. 6 "TreeRestart", App. D.1; Gboard paper Alg. 1): a new mechanism segment
starts at chosen 0-based rounds (e.g. `dp_ftrl_tff.settings.RestartSchedule`, or
epoch boundaries). The model weights are kept and the server momentum buffer is zeroed, as in the
federated DP-FTRLM code's `restart_dp_tree` (the centralized FTRL code keeps the momentum instead; the
two agree for momentum 0). The fresh noise segment (never reusing noise rows) is the aggregator's job:
`CorrelatedNoiseFactory` restarts its noise in-graph on its own schedule; an aggregator that does not
can be restarted through `restart_state(..., aggregator_restart_fn=...)`.
"""

import collections
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import aggregators
from dp_ftrl_tff.aggregators import secure as secure_lib
from dp_ftrl_tff.learning import canaries as canaries_lib


def build_dp_ftrl_process(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    aggregator: tff.aggregators.UnweightedAggregationFactory,
    server_optimizer_fn: tff.learning.optimizers.Optimizer,
    canaries: Optional[canaries_lib.Canaries] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds DP-FTRL as TFF's unweighted FedAvg with the aggregator's noise and a server optimizer.

  Args:
    model_fn: no-argument callable returning a `tff.learning.models.VariableModel` (e.g. from
      `tff.learning.models.from_keras_model`); must build fresh variables on every call.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for local client training.
    aggregator: an unweighted aggregation factory that clips, sums, adds the (correlated) noise and
      divides by the fixed `clients_per_round`: `dp_ftrl_tff.aggregators.CorrelatedNoiseFactory` or
      TFF's `DifferentiallyPrivateFactory`.
    server_optimizer_fn: a `tff.learning.optimizers.Optimizer` applying the released update, as
      TFF's `build_weighted_fed_avg` takes it: DP-FTRLM's is SGD with heavy-ball momentum,
      `tff.learning.optimizers.build_sgdm(learning_rate, momentum=0.9)` (the drivers' from
      `--server_learning_rate` and `--server_momentum`); post-processing, whatever it is.
    canaries: `dp_ftrl_tff.learning.canaries.Canaries` to insert, or None. With canaries the
      process takes, per client, `(dataset, canary_index)` (`canaries.client_data`) and its
      aggregator measurements hold `canary_projections` (see dp_ftrl_tff/learning/canaries.py).

  Returns:
    A `tff.learning.templates.LearningProcess` (state: `LearningAlgorithmState`).
  """
  if not callable(model_fn):
    raise ValueError(f'`model_fn` must be callable, got {model_fn!r}.')
  if not isinstance(client_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise ValueError('`client_optimizer_fn` must be a `tff.learning.optimizers.Optimizer`, got '
                     f'{type(client_optimizer_fn).__name__}.')
  if not isinstance(server_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise ValueError('`server_optimizer_fn` must be a `tff.learning.optimizers.Optimizer`, got '
                     f'{type(server_optimizer_fn).__name__}.')
  if not isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory):
    raise ValueError('`aggregator` must be a `tff.aggregators.UnweightedAggregationFactory`, got '
                     f'{type(aggregator).__name__}.')
  # build_unweighted_fed_avg is build_weighted_fed_avg with UNIFORM weights and the weights dropped;
  # keeping them lets `zeroed_count` of a CorrelatedNoiseFactory include the updates TFF's client
  # work zeroed.
  counting = isinstance(aggregator, aggregators.CorrelatedNoiseFactory)
  model_aggregator = count_non_finite_updates(aggregator) if counting else aggregator
  if canaries is not None:
    return _build_with_canaries(model_fn, client_optimizer_fn, server_optimizer_fn,
                                model_aggregator, canaries)
  if counting:
    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer_fn, server_optimizer_fn=server_optimizer_fn,
        client_weighting=tff.learning.ClientWeighting.UNIFORM, model_aggregator=model_aggregator)
  return tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn, server_optimizer_fn=server_optimizer_fn,
      model_aggregator=model_aggregator)


def _build_with_canaries(model_fn, client_optimizer_fn, server_optimizer_fn, model_aggregator,
                         canaries: canaries_lib.Canaries) -> tff.learning.templates.LearningProcess:
  """`build_weighted_fed_avg` with UNIFORM weights, from TFF's own parts (the builder takes no
  client work): its client work with the canaries inserted, its broadcast and its optimizer
  finalizer; the aggregator also measures the canary projections."""
  if not isinstance(canaries, canaries_lib.Canaries):
    raise ValueError(f'`canaries` must be Canaries, got {type(canaries).__name__}.')
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    model_aggregator = tff.aggregators.as_weighted_aggregator(model_aggregator)

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  aggregator = canaries_lib.projection_factory(model_aggregator, canaries).create(
      weights_type.trainable, tff.TensorType(np.float32))
  client_work = canaries_lib.canary_client_work(
      tff.learning.templates.build_model_delta_client_work(
          model_fn, client_optimizer_fn, client_weighting=tff.learning.ClientWeighting.UNIFORM),
      canaries)
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn, tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator,
      tff.learning.templates.build_apply_optimizer_finalizer(server_optimizer_fn, weights_type))


class _NonFiniteCountingFactory(tff.aggregators.WeightedAggregationFactory):
  """See `count_non_finite_updates`."""

  def __init__(self, inner: 'aggregators.CorrelatedNoiseFactory'):
    self._inner = inner

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    inner_process = self._inner.create(value_type)
    count_process = secure_lib.count_aggregation_factory(
        self._inner.secure is not None, 1, 0).create(tff.TensorType(np.int32))

    @tff.tensorflow.computation(weight_type)
    def was_zeroed(weight):
      return tf.cast(tf.equal(weight, 0), tf.int32)

    @tff.tensorflow.computation(inner_process.next.type_signature.result.measurements.member
                                .zeroed_count, np.int32)
    def add_counts(zeroed_count, non_finite_count):
      return zeroed_count + tf.cast(non_finite_count, zeroed_count.dtype)

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip((inner_process.initialize(), count_process.initialize()))

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      inner_state, count_state = state
      inner_output = inner_process.next(inner_state, value)
      count_output = count_process.next(count_state, tff.federated_map(was_zeroed, weight))
      measurements = inner_output.measurements
      names = tff.structure.name_list(measurements.type_signature.member)
      fields = collections.OrderedDict((name, measurements[name]) for name in names)
      fields['zeroed_count'] = tff.federated_map(
          add_counts, (fields['zeroed_count'], count_output.result))
      return tff.templates.MeasuredProcessOutput(
          state=tff.federated_zip((inner_output.state, count_output.state)),
          result=inner_output.result, measurements=tff.federated_zip(fields))

    return tff.templates.AggregationProcess(init_fn, next_fn)


def count_non_finite_updates(aggregator: 'aggregators.CorrelatedNoiseFactory'
                             ) -> tff.aggregators.WeightedAggregationFactory:
  """`aggregator` as a weighted factory whose `zeroed_count` also counts TFF's zeroed updates.

  TFF's model-delta client work (inside `build_unweighted_fed_avg` and `build_weighted_fed_avg`)
  replaces a client update with a non-finite value by zeros and gives it weight 0, so an unweighted
  aggregator never sees it. With `client_weighting=tff.learning.ClientWeighting.UNIFORM` every other
  client has weight 1; this wrapper ignores the weights for the mean (the mean stays unweighted, over
  the fixed `clients_per_round`) and adds the clients with weight 0 to the measurement
  `zeroed_count` (summed with SecAgg when the aggregator uses it). Use it as
  `build_weighted_fed_avg(..., client_weighting=UNIFORM, model_aggregator=...)`;
  `build_dp_ftrl_process` does.
  """
  if not isinstance(aggregator, aggregators.CorrelatedNoiseFactory):
    raise ValueError('`aggregator` must be a CorrelatedNoiseFactory, got '
                     f'{type(aggregator).__name__}.')
  return _NonFiniteCountingFactory(aggregator)


AggregatorRestartFn = Callable[[Any], Any]


def restart_state(state: tff.learning.templates.LearningAlgorithmState,
                  fresh_state: tff.learning.templates.LearningAlgorithmState,
                  aggregator_restart_fn: Optional[AggregatorRestartFn] = None,
                  ) -> tff.learning.templates.LearningAlgorithmState:
  """Starts a new DP-FTRL segment: keeps the model weights, zeroes the server momentum.

  Args:
    state: the current state of a process built by `build_dp_ftrl_process`.
    fresh_state: a state from the same process's `initialize()`; its server optimizer state (zero
      momentum buffer, same hyperparameters) replaces the current one.
    aggregator_restart_fn: maps the current aggregator state to the state of a fresh mechanism segment
      that keeps counting noise rows. None keeps the aggregator state as is (right for aggregators that
      restart themselves in-graph, like `CorrelatedNoiseFactory`).

  Returns:
    The restarted `LearningAlgorithmState`.
  """
  if not isinstance(state, tff.learning.templates.LearningAlgorithmState):
    raise ValueError(f'`state` must be a LearningAlgorithmState, got {type(state).__name__}.')
  if not isinstance(fresh_state, tff.learning.templates.LearningAlgorithmState):
    raise ValueError('`fresh_state` must be a LearningAlgorithmState, got '
                     f'{type(fresh_state).__name__}.')
  if aggregator_restart_fn is not None and not callable(aggregator_restart_fn):
    raise ValueError(f'`aggregator_restart_fn` must be callable, got {aggregator_restart_fn!r}.')
  tf.nest.assert_same_structure(state.finalizer, fresh_state.finalizer)
  aggregator_state = state.aggregator
  if aggregator_restart_fn is not None:
    aggregator_state = aggregator_restart_fn(aggregator_state)
  return tff.learning.templates.LearningAlgorithmState(
      global_model_weights=state.global_model_weights,
      distributor=state.distributor,
      client_work=state.client_work,
      aggregator=aggregator_state,
      finalizer=fresh_state.finalizer)
