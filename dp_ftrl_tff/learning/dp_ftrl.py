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
two agree for momentum 0). Both happen inside the process, so any loop over `next` restarts where the
plan says: `CorrelatedNoiseFactory` starts its fresh noise segment (never reusing noise rows) on its own
schedule, and the process's finalizer counts its rounds and resets the server optimizer's state at
`restart_rounds` (`RunPlan.planned_segments.restart_rounds` for a correlated mechanism).
"""

import collections
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation, aggregators
from dp_ftrl_tff.aggregators import secure as secure_lib
from dp_ftrl_tff.learning import canaries as canaries_lib


def build_dp_ftrl_process(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    aggregator: tff.aggregators.UnweightedAggregationFactory,
    server_optimizer_fn: tff.learning.optimizers.Optimizer,
    canaries: Optional[canaries_lib.Canaries] = None,
    restart_rounds: Sequence[int] = (),
) -> tff.learning.templates.LearningProcess:
  """Builds DP-FTRL as TFF's unweighted FedAvg with the aggregator's noise and a server optimizer.

  The process is `tff.learning.algorithms.build_weighted_fed_avg` with UNIFORM client weights,
  composed from the same TFF parts (model-delta client work, broadcast, the optimizer finalizer) so
  that canaries and restarts can join them.

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
    restart_rounds: 0-based rounds (>= 1; round r is the r-th call of `next` from `initialize`'s
      state, counted in the state) that start a new mechanism segment: the server optimizer's state
      (momentum) is reset to its initial value before the round's update is applied.

  Returns:
    A `tff.learning.templates.LearningProcess` (state: `LearningAlgorithmState`, whose `finalizer`
    state is `OrderedDict(round=<rounds done>, optimizer=<the server optimizer's state>)`).
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
  if canaries is not None and not isinstance(canaries, canaries_lib.Canaries):
    raise ValueError(f'`canaries` must be Canaries, got {type(canaries).__name__}.')
  restart_rounds = _check_restart_rounds(restart_rounds)
  # With UNIFORM weights every client has weight 1 but those whose update TFF's client work zeroed
  # (weight 0): `count_non_finite_updates` adds them to a CorrelatedNoiseFactory's `zeroed_count`.
  if isinstance(aggregator, aggregators.CorrelatedNoiseFactory):
    model_aggregator = count_non_finite_updates(aggregator)
  else:
    model_aggregator = tff.aggregators.as_weighted_aggregator(aggregator)

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  client_work = tff.learning.templates.build_model_delta_client_work(
      model_fn, client_optimizer_fn, client_weighting=tff.learning.ClientWeighting.UNIFORM)
  if canaries is not None:
    client_work = canaries_lib.canary_client_work(client_work, canaries)
    model_aggregator = canaries_lib.projection_factory(model_aggregator, canaries)
  # Always with its round counter, restarts or not: the state's structure must not depend on
  # whether the run's rounds reach a restart (a run resumed with more rounds may reach one).
  finalizer = _restarting_finalizer(tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer_fn, weights_type), restart_rounds)
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn, tff.learning.templates.build_broadcast_process(weights_type),
      client_work, model_aggregator.create(weights_type.trainable, tff.TensorType(np.float32)),
      finalizer)


def _check_restart_rounds(restart_rounds) -> Tuple[int, ...]:
  if isinstance(restart_rounds, (str, bytes)) or not hasattr(restart_rounds, '__iter__'):
    raise ValueError(f'`restart_rounds` must be a sequence of rounds, got {restart_rounds!r}.')
  rounds = [_validation.check_positive_int(r, 'restart_rounds') for r in restart_rounds]
  if len(set(rounds)) != len(rounds):
    raise ValueError(f'`restart_rounds` must be distinct, got {list(restart_rounds)}.')
  return tuple(sorted(rounds))


def _restarting_finalizer(inner: tff.learning.templates.FinalizerProcess,
                          restart_rounds: Tuple[int, ...]
                          ) -> tff.learning.templates.FinalizerProcess:
  """`inner` (TFF's optimizer finalizer) with a round counter in its state: at `restart_rounds` (may
  be empty) the optimizer's state is its initial one before the round's update is applied (a pure function of
  the counted round, so a restored checkpoint resets on the same rounds).

  TFF's finalizers have no hook for this, and the round cannot live in the optimizer's state: TFF's
  finalizer keeps the old optimizer state when it rejects a non-finite update, which would stop the
  count."""
  optimizer_type = inner.initialize.type_signature.result.member

  @tff.tensorflow.computation()
  def first_round():
    return tf.constant(0, tf.int64)

  @tff.tensorflow.computation(optimizer_type, optimizer_type, np.int64)
  def round_optimizer_state(current, initial, round_num):
    restart = tf.reduce_any(tf.equal(round_num, tf.constant(restart_rounds, tf.int64)))
    return tf.nest.map_structure(lambda fresh, kept: tf.where(restart, fresh, kept), initial,
                                 current)

  @tff.tensorflow.computation(np.int64)
  def next_round(round_num):
    return round_num + 1

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(collections.OrderedDict(
        round=tff.federated_eval(first_round, tff.SERVER), optimizer=inner.initialize()))

  state_type = init_fn.type_signature.result

  @tff.federated_computation(state_type, inner.next.type_signature.parameter[1],
                             inner.next.type_signature.parameter[2])
  def next_fn(state, weights, update):
    optimizer_state = tff.federated_map(round_optimizer_state,
                                        (state.optimizer, inner.initialize(), state.round))
    output = inner.next(optimizer_state, weights, update)
    new_state = tff.federated_zip(collections.OrderedDict(
        round=tff.federated_map(next_round, state.round), optimizer=output.state))
    return tff.templates.MeasuredProcessOutput(new_state, output.result, output.measurements)

  @tff.tensorflow.computation(state_type.member)
  def get_hparams_fn(state):
    return inner.get_hparams(state['optimizer'])

  @tff.tensorflow.computation(state_type.member, inner.get_hparams.type_signature.result)
  def set_hparams_fn(state, hparams):
    return collections.OrderedDict(round=state['round'],
                                   optimizer=inner.set_hparams(state['optimizer'], hparams))

  return tff.learning.templates.FinalizerProcess(init_fn, next_fn, get_hparams_fn=get_hparams_fn,
                                                 set_hparams_fn=set_hparams_fn)


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
