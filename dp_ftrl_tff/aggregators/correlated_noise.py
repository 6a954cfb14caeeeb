"""`CorrelatedNoiseFactory`: DP mean of client updates with streaming correlated noise (DP-FTRL).

A drop-in `tff.aggregators.UnweightedAggregationFactory` for
`tff.learning.algorithms.build_unweighted_fed_avg(..., model_aggregator=factory)`. Per round t
(0-based) it composes, in this order:
  1. on each client: zeroing of non-finite or too-large updates (counted, never propagated) and L2
     clipping to the active clip zeta (`clipping.py`); with adaptive clipping also the quantile bit
     1[||Delta_i|| <= C^t] - 1/2 (`adaptive_clipping.py`);
  2. the record aggregation: a plain sum, or TFF's SecAgg chain (`secure.py`);
  3. on the server: correlated noise sigma_Delta * zeta_sens * (M z)_t from a pluggable
     `dp_ftrl_tff.noise` state, where zeta_sens = zeta (or its inflated bound after rounding with
     SecAgg) and sigma_Delta = sigma (or its Gboard Thm. 1 inflation with adaptive clipping);
  4. normalization by the fixed `clients_per_round` m (never the realized count):
     result_t = (sum_i clip(Delta_i) + sigma_Delta zeta_sens (M z)_t) / m.
At a restart round r (the plan's `RestartSchedule`, or the end of a banded segment) the noise state (and the count noise
state) starts a fresh segment and, with adaptive clipping, the active clip takes the estimate.

Noise multipliers are relative to the clip norm and apply to the SUM (DP-FTRL convention, TFF's
`DifferentiallyPrivateFactory.tree_aggregation`); the noise seed comes from OS entropy at `initialize`
unless `noise_seed` is given, and lives in the state, so a restored checkpoint continues the noise
sequence bit for bit.
"""

import collections
import dataclasses
import hashlib
import json
import os
import warnings
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import run_guarantee
from dp_ftrl_tff.aggregators import adaptive_clipping as adaptive_lib
from dp_ftrl_tff.aggregators import clipping
from dp_ftrl_tff.aggregators import secure as secure_lib
from dp_ftrl_tff.mechanisms import base as mechanisms_base
from dp_ftrl_tff.mechanisms import blt as blt_mechanisms
from dp_ftrl_tff.mechanisms import files as mechanisms_files
from dp_ftrl_tff.mechanisms import gaussian as gaussian_mechanisms
from dp_ftrl_tff.mechanisms import registry
from dp_ftrl_tff.mechanisms import square_root as square_root_mechanisms
from dp_ftrl_tff.mechanisms import tree as tree_mechanisms
from dp_ftrl_tff.noise import base as noise_base

#: Keys of the measurements `next` reports (server placed), in this order.
MEASUREMENT_KEYS = ('round', 'segment', 'restart', 'clip', 'sensitivity_clip', 'quantile_estimate',
                    'clipped_count', 'zeroed_count', 'noise_stddev')


class CorrelatedNoiseState(NamedTuple):
  """The aggregation process state (server placed; a flat structure of tensors).

  Flat on purpose: TFF's executor serializes every node of the state (struct or tensor) twice per
  round, at a fixed cost each (issue 16, docs/benchmarks/aggregators.md), so the state holds only
  what cannot be recomputed: the noise multiplier is a constant of the plan (also in `mechanism`),
  the post-rounding sensitivity bound a function of `clip`.

  Attributes:
    round: int64, 0-based index of the NEXT round.
    segment: int64, index of the current mechanism segment (number of restarts so far).
    clip: float32, active L2 clip zeta (clipping and noise calibration).
    mechanism: tf.string, JSON of `CorrelatedNoiseFactory.accounting_config()` (what an accountant
      needs: mechanism kind and parameters, accounted noise multiplier, restart schedule, ...).
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


class _ClientParams(NamedTuple):
  clip: Any
  quantile_params: Any


def _strategy_from(strategy, expected_name: str) -> mechanisms_base.Strategy:
  """A strategy object from an object or a file path (`mechanisms.files.load_strategy`)."""
  if isinstance(strategy, (str, os.PathLike)):
    strategy = mechanisms_files.load_strategy(strategy)
  if not isinstance(strategy, mechanisms_base.Strategy) or strategy.name != expected_name:
    raise ValueError(f'`strategy` must be a {expected_name} strategy or a path to one, got '
                     f'{strategy!r}.')
  return strategy


def _mechanism_description(strategy: mechanisms_base.Strategy) -> dict:
  """JSON description of a strategy: `to_config()`, with big arrays replaced by a fingerprint."""
  description = {}
  for key, value in strategy.to_config().items():
    if isinstance(value, np.ndarray):
      array = np.ascontiguousarray(value, dtype=np.float64)
      description[key + '_shape'] = list(array.shape)
      description[key + '_sha256'] = hashlib.sha256(array.tobytes()).hexdigest()
    else:
      description[key] = value
  if strategy.max_rounds is not None:
    description['max_rounds'] = strategy.max_rounds
  return description


class CorrelatedNoiseFactory(tff.aggregators.UnweightedAggregationFactory):
  """DP mean with correlated streaming noise; see the module docstring for the composition.

  Built from a `dp_ftrl_tff.plan.RunPlan` (everything that determines the privacy guarantee); the
  classmethods `gaussian`, `tree`, `banded`, `blt`, `bsr`, `bisr` build the plan for the common
  configurations. The
  streaming noise is the registry's noise class for the plan's mechanism
  (`mechanisms.registry.noise_class`), one stream for the model and, with adaptive clipping, one for
  the clipped count.

  Args:
    plan: the `RunPlan`.
    noise_seed: int seed in [0, 2^63), or None for a fresh seed from OS entropy at each `initialize`.
    max_rounds_per_tree: trees only: the longest tree (sizes the noise state); None means the plan's
      longest segment, or 2^15 rounds without restarts.
  """

  def __init__(self, plan: plan_lib.RunPlan, *, noise_seed: Optional[int] = None,
               max_rounds_per_tree: Optional[int] = None):
    if not isinstance(plan, plan_lib.RunPlan):
      raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {plan!r}.')
    self._plan = plan
    self._noise_seed = noise_base.check_noise_seed(noise_seed)
    if max_rounds_per_tree is not None:
      max_rounds_per_tree = _validation.check_positive_int(max_rounds_per_tree,
                                                           'max_rounds_per_tree')
    self._max_segment_rounds = max_rounds_per_tree or plan.max_segment_rounds

  def _noise(self) -> noise_base.StreamingNoise:
    """A fresh stream of the plan's mechanism (the registry's noise class)."""
    return registry.noise_class(self._plan.mechanism).from_strategy(
        self._plan.strategy, max_segment_rounds=self._max_segment_rounds,
        beyond_max_rounds=self._plan.beyond_max_rounds)

  # ----------------------------------------------------------------------------------------------
  # Named constructors: `RunPlan.build` arguments (`adaptive_clip`, `secure`, `zeroing_norm`,
  # `restarts`, `beyond_max_rounds`) pass through `kwargs`.

  @classmethod
  def gaussian(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
               noise_seed: Optional[int] = None, **kwargs) -> 'CorrelatedNoiseFactory':
    """Independent Gaussian noise each round (DP-FedAvg; strategy C = I).

    With adaptive clipping the clip follows the estimate every round (`EVERY_ROUND`) unless a
    schedule is given.
    """
    return cls(plan_lib.RunPlan.build(gaussian_mechanisms.GaussianStrategy(), noise_multiplier,
                                      clients_per_round, clip_norm, **kwargs),
               noise_seed=noise_seed)

  @classmethod
  def tree(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
           use_efficient: bool = True, restarts=None, noise_seed: Optional[int] = None, *,
           max_rounds_per_tree: Optional[int] = None, efficient: Optional[bool] = None,
           restart_rounds=None, **kwargs) -> 'CorrelatedNoiseFactory':
    """Tree aggregation (DP-FTRL, Kairouz et al. 2021): residuals of the noisy prefix sums.

    Args:
      use_efficient: Honaker's efficient estimator (True, mechanism 'tree_efficient') or the vanilla
        tree (False, mechanism 'tree'), as TFF's `DifferentiallyPrivateFactory.tree_aggregation`.
      restarts: a `RestartSchedule`, an int period p (restarts at p, 2p, ...) or None (no restarts
        with a fixed clip; rounds 128 + 1024 i with adaptive clipping).
      max_rounds_per_tree: the longest tree (sets the stored levels of the noise state); None means
        the longest segment of the restart schedule, or 2^15 rounds without restarts.
      efficient, restart_rounds: deprecated names of `use_efficient` and `restarts`.
    """
    if efficient is not None:
      warnings.warn('`efficient` is deprecated; use `use_efficient` (TFF\'s name).',
                    DeprecationWarning, stacklevel=2)
      use_efficient = efficient
    if restart_rounds is not None:
      warnings.warn('`restart_rounds` is deprecated; use `restarts`.', DeprecationWarning,
                    stacklevel=2)
      restarts = restart_rounds
    if not isinstance(use_efficient, bool):
      raise ValueError(f'`use_efficient` must be a bool, got {use_efficient!r}.')
    if restarts is not None and not isinstance(restarts, plan_lib.RestartSchedule):
      period = _validation.check_positive_int(restarts, 'restarts')
      restarts = plan_lib.RestartSchedule(warmup=period, period=period)
    strategy = tree_mechanisms.TreeStrategy('efficient' if use_efficient else 'vanilla')
    plan = plan_lib.RunPlan.build(strategy, noise_multiplier, clients_per_round, clip_norm,
                                  restarts=restarts, **kwargs)
    return cls(plan, noise_seed=noise_seed, max_rounds_per_tree=max_rounds_per_tree)

  @classmethod
  def banded(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
             strategy, noise_seed: Optional[int] = None, beyond_max_rounds: str = 'error',
             **kwargs) -> 'CorrelatedNoiseFactory':
    """Banded matrix factorization (BandMF, Choquette-Choo et al. 2023).

    Args:
      strategy: a `mechanisms.banded.BandedStrategy` or a path `load_strategy` reads.
      beyond_max_rounds: 'error' (default: running past `strategy.max_rounds` fails) or 'restart'
        (a fresh segment starts, counted as a restart in the measurements and the accounting).
    """
    plan = plan_lib.RunPlan.build(_strategy_from(strategy, 'banded'), noise_multiplier,
                                  clients_per_round, clip_norm, beyond_max_rounds=beyond_max_rounds,
                                  **kwargs)
    return cls(plan, noise_seed=noise_seed)

  @classmethod
  def blt(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
          strategy=None, noise_seed: Optional[int] = None, *, theta=None, omega=None,
          **kwargs) -> 'CorrelatedNoiseFactory':
    """Buffered Linear Toeplitz noise (BLT, Dvijotham et al. 2024).

    Args:
      strategy: a `mechanisms.blt.BLTStrategy` or a path `load_strategy` reads; or None with
        `theta=` (buffer decays) and `omega=` (output scales).
    """
    if strategy is None:
      if theta is None or omega is None:
        raise ValueError('`blt` needs `strategy`, or both `theta` and `omega`.')
      strategy = blt_mechanisms.BLTStrategy(theta=np.asarray(theta, np.float64),
                                            omega=np.asarray(omega, np.float64))
    elif theta is not None or omega is not None:
      raise ValueError('Give either `strategy` or `theta`/`omega`, not both.')
    plan = plan_lib.RunPlan.build(_strategy_from(strategy, 'blt'), noise_multiplier,
                                  clients_per_round, clip_norm, **kwargs)
    return cls(plan, noise_seed=noise_seed)

  @classmethod
  def bsr(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
          num_bands: int, noise_seed: Optional[int] = None, **kwargs) -> 'CorrelatedNoiseFactory':
    """Banded square root (BSR, Kalinin & Lampert 2024): C = the first `num_bands` diagonals of the
    square root of the prefix-sum matrix; closed form, streams for any number of rounds.

    Args:
      num_bands: b-hat >= 1 (min(min_sep, rounds) is a good choice: `mechanisms.square_root`).
    """
    plan = plan_lib.RunPlan.build(square_root_mechanisms.BandedSquareRootStrategy(num_bands),
                                  noise_multiplier, clients_per_round, clip_norm, **kwargs)
    return cls(plan, noise_seed=noise_seed)

  @classmethod
  def bisr(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
           num_bands: int, noise_seed: Optional[int] = None, **kwargs) -> 'CorrelatedNoiseFactory':
    """Banded inverse square root (BISR): C^-1 = the first `num_bands` diagonals of the inverse
    square root of the prefix-sum matrix, so the noise is a moving average of the last `num_bands`
    draws; closed form, streams for any number of rounds.

    Args:
      num_bands: b-hat >= 1 (the state holds b-hat - 1 copies of the model update).
    """
    plan = plan_lib.RunPlan.build(
        square_root_mechanisms.BandedInverseSquareRootStrategy(num_bands), noise_multiplier,
        clients_per_round, clip_norm, **kwargs)
    return cls(plan, noise_seed=noise_seed)

  # ----------------------------------------------------------------------------------------------

  @property
  def plan(self) -> plan_lib.RunPlan:
    """The `RunPlan` this factory aggregates with."""
    return self._plan

  @property
  def strategy(self) -> mechanisms_base.Strategy:
    """The mechanism's `Strategy` (for the accountant: sensitivity, losses)."""
    return self._plan.strategy

  @property
  def noise_multiplier(self) -> float:
    """sigma: the accounted noise multiplier."""
    return self._plan.noise_multiplier

  @property
  def secure(self) -> Optional[plan_lib.SecureAggregation]:
    """The SecAgg settings, or None for a plain sum."""
    return self._plan.secure

  @property
  def value_noise_multiplier(self) -> float:
    """sigma_Delta: the multiplier on the model sum (> sigma with adaptive clipping, Thm. 1)."""
    return self._plan.value_noise_multiplier

  def privacy_guarantee(self, *, rounds: int, min_sep: int,
                        max_participations: Optional[int] = None,
                        delta: float) -> run_guarantee.RunGuarantee:
    """rho-zCDP, (epsilon, delta) and a composable dp_accounting `DpEvent` of training with this
    aggregator for `rounds` rounds under b-min-sep participation (no amplification).

    Delegates to `dp_ftrl_tff.accounting.plan_guarantee` with this factory's plan: the mechanism,
    the restart schedule, adaptive clipping's noise split and SecAgg's post-rounding bound are all
    accounted. The returned object's `rho`, `epsilon`, `delta` and `dp_event` (its PLD epsilon at
    `delta` is `epsilon`) compose with anything else released.

    Args:
      rounds: n >= 1, 0-based rounds 0 .. n-1.
      min_sep: b >= 1: r2 - r1 >= b for two participations of one client (TF-Privacy's
        min_separation + 1).
      max_participations: k >= 1, or None for the schema's maximum ceil(n / b).
      delta: in (0, 1).
    """
    return run_guarantee.plan_guarantee(self._plan, rounds=rounds, min_sep=min_sep,
                                        max_participations=max_participations, delta=delta)

  def accounting_config(self) -> dict:
    """JSON-serializable description for the accountant (also stored in the state's `mechanism`).

    Keys: 'mechanism' (kind and parameters, big arrays as a SHA-256 fingerprint), 'noise_multiplier'
    (accounted sigma), 'value_noise_multiplier', 'clipped_count_stddev' (None with a fixed clip),
    'clients_per_round', 'initial_clip', 'adaptive_clip' (bool), 'restarts' ({'warmup', 'period'}
    or None), 'secure' ({'bits', 'rotation', 'beta', 'modclip_prob'} or None), 'zeroing_norm'.
    """
    plan = self._plan
    mechanism = _mechanism_description(plan.strategy)
    if plan.strategy.max_rounds is not None:  # built for a fixed n: the policy past it matters
      mechanism['beyond_max_rounds'] = plan.beyond_max_rounds
    return {'mechanism': mechanism, 'noise_multiplier': plan.noise_multiplier,
            'value_noise_multiplier': plan.value_noise_multiplier,
            'clipped_count_stddev': plan.clipped_count_stddev,
            'clients_per_round': plan.clients_per_round, 'initial_clip': plan.clip_norm,
            'adaptive_clip': plan.adaptive_clip is not None,
            'restarts': None if plan.restarts is None else dataclasses.asdict(plan.restarts),
            'secure': None if plan.secure is None else plan.secure.to_config(),
            'zeroing_norm': plan.zeroing_norm}

  def create(self, value_type) -> tff.templates.AggregationProcess:
    """The `AggregationProcess` for client updates of `value_type` (a structure of floats).

    `value_type`: a `tff.TensorType`, a `tff.StructWithPythonType` of them, or the same as a
    `tf.TensorSpec` or a (nested) list / tuple / dict of `tf.TensorSpec`s (converted with
    `tff.types.tensorflow_to_type`).
    """
    if isinstance(value_type, tf.TensorSpec) or (
        isinstance(value_type, (list, tuple, dict)) and value_type):
      try:
        value_type = (tff.types.tensorflow_to_type(value_type) if all(
            isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(value_type))
                      else tff.types.to_type(value_type))
      except (TypeError, ValueError) as error:
        raise ValueError('`value_type` must be a tff.TensorType, a tf.TensorSpec or a structure of '
                         f'them, got {value_type!r} ({error}).') from error
    if not (isinstance(value_type, tff.types.TensorType) or (
        isinstance(value_type, tff.types.StructWithPythonType)
        and tff.types.is_structure_of_tensors(value_type))):
      raise ValueError('`value_type` must be a tff.TensorType, a tf.TensorSpec or a structure of '
                       f'them (tff.StructWithPythonType), got {value_type!r}.')
    if not tff.types.is_structure_of_floats(value_type):
      raise ValueError(f'`value_type` must hold only floating tensors, got {value_type!r}.')
    value_specs = tff.types.type_to_tf_tensor_specs(value_type)
    if not all(spec.shape.is_fully_defined() for spec in tf.nest.flatten(value_specs)):
      raise ValueError(f'`value_type` must have fully defined shapes, got {value_type!r}.')
    dim = int(sum(spec.shape.num_elements() for spec in tf.nest.flatten(value_specs)))
    return self._build_process(value_type, value_specs, dim)


  def _build_process(self, value_type, value_specs, dim: int) -> tff.templates.AggregationProcess:
    """Builds the init / next computations: per round one broadcast of the client parameters, one
    client map, the sums, one server map. With a plain sum (no SecAgg) the sums are ONE federated sum
    of (update, counts[, quantile bit]) and the server map returns the whole output, so a round has
    fewer intrinsics and selections than TFF's `DifferentiallyPrivateFactory` (issue 16)."""
    plan = self._plan
    value_noise = self._noise()
    adaptive = plan.adaptive_clip
    restarts = plan.restarts
    zeroing_norm = plan.zeroing_norm
    m = plan.clients_per_round
    secure = plan.secure
    config = self.accounting_config()

    if secure is None:
      sensitivity_fn = tf.identity
    else:
      # The scale, the rounding's prior norm bound and the post-rounding sensitivity follow the
      # active clip (TFF's DistributedDpSumFactory keeps them in its state the same way).
      config['secure'].update(unit_scale_factor=secure.unit_scale_factor(m, dim),
                              padded_dim=secure.padded_dim(dim))

      def sensitivity_fn(clip):
        return secure_lib.sensitivity_clip(secure, clip, m, dim)

    if adaptive is not None:
      quantile_query = adaptive_lib.CorrelatedQuantileEstimatorQuery(
          self._noise, initial_estimate=plan.clip_norm,
          target_quantile=adaptive.target_quantile, learning_rate=adaptive.learning_rate,
          clipped_count_stddev=plan.clipped_count_stddev,
          expected_num_records=m)
    mechanism_json = json.dumps(config, sort_keys=True)
    noise_multiplier = plan.value_noise_multiplier

    @tff.tensorflow.computation
    def init_state():
      seed = noise_base.initial_seed(self._noise_seed)
      quantile_state = (quantile_query.initial_global_state(adaptive_lib.count_seed(seed))
                        if adaptive is not None else ())
      zero = tf.constant(0, tf.int64)
      return CorrelatedNoiseState(
          round=zero, segment=zero, clip=tf.constant(plan.clip_norm, tf.float32),
          mechanism=tf.constant(mechanism_json),
          noise_state=value_noise.initial_state(value_specs, seed), quantile_state=quantile_state,
          secure_agg=())

    def client_params(state):
      """What the clients need of the state (in TF; the state may carry `secure_agg`)."""
      quantile_params = (quantile_query.derive_sample_params(state.quantile_state)
                         if adaptive is not None else ())
      return _ClientParams(clip=state.clip, quantile_params=quantile_params)

    plain_state_type = init_state.type_signature.result
    client_params_fn = tff.tensorflow.computation(client_params, plain_state_type)

    @tff.tensorflow.computation(value_type, client_params_fn.type_signature.result)
    def client_fn(value, params):
      result = clipping.zero_and_clip(value, params.clip, zeroing_norm)
      counts = tf.stack([result.was_clipped, result.was_zeroed])
      if adaptive is None:
        return result.value, counts
      quantile_record = quantile_query.preprocess_record(params.quantile_params, result.norm)
      return result.value, counts, quantile_record

    def server_step_impl(state, value_sum, counts, quantile_sum):
      """(new state, result, measurements) of a round, in TF; `secure_agg` passes through."""
      sensitivity_clip = sensitivity_fn(state.clip)
      stddev = tf.constant(noise_multiplier, tf.float32) * sensitivity_clip
      noise, noise_state = value_noise.next(state.noise_state, stddev)
      result = tf.nest.map_structure(lambda s, z: (s + z) / tf.constant(m, s.dtype), value_sum, noise)
      next_round = state.round + 1
      # A new segment starts on the schedule, or when the stream has no rounds left in its segment
      # (a banded strategy with beyond_max_rounds='restart'): either way it is counted here.
      restart = value_noise.segment_ended(noise_state)
      if restarts is not None:
        restart = tf.logical_or(restart, adaptive_lib.is_restart_round(restarts, next_round))
      clip = state.clip
      quantile_state = state.quantile_state
      estimate = clip
      if adaptive is not None:
        _, quantile_state, _ = quantile_query.get_noised_result(quantile_sum, quantile_state)
        estimate = quantile_state.current_estimate
        clip = tf.where(restart, estimate, clip)
        quantile_state = tf.cond(restart, lambda: quantile_query.restart(quantile_state),
                                 lambda: quantile_state)
      static_restart = tf.get_static_value(restart)
      if static_restart is None or bool(static_restart):  # no restart op when none can happen
        noise_state = tf.cond(restart, lambda: value_noise.restart(noise_state),
                              lambda: noise_state)
      new_state = state._replace(round=next_round, segment=state.segment + tf.cast(restart, tf.int64),
                                 clip=clip, noise_state=noise_state, quantile_state=quantile_state)
      measurements = collections.OrderedDict(
          round=state.round, segment=state.segment, restart=restart, clip=state.clip,
          sensitivity_clip=sensitivity_clip, quantile_estimate=estimate, clipped_count=counts[0],
          zeroed_count=counts[1], noise_stddev=stddev)
      if secure is not None:
        measurements['scale_factor'] = secure_lib.scale_factor_tensor(secure, state.clip, m, dim)
      return new_state, result, measurements

    @tff.federated_computation
    def init_fn():
      return tff.federated_eval(init_state, tff.SERVER)

    if secure is None:
      # One federated sum of the client tuple (update, counts[, quantile bit]) and one server
      # computation that returns the whole (state, result, measurements) in its final structure:
      # nothing else is selected, summed or zipped in the federated computation. Each intrinsic,
      # selection and state node costs per-round executor work (docs/benchmarks/aggregators.md,
      # issue 16).
      @tff.tensorflow.computation(plain_state_type, client_fn.type_signature.result)
      def server_step(state, sums):
        return server_step_impl(state, sums[0], sums[1], sums[2] if adaptive is not None else None)

      @tff.federated_computation(init_fn.type_signature.result,
                                 tff.FederatedType(value_type, tff.CLIENTS))
      def next_fn(state, value):
        params = tff.federated_broadcast(tff.federated_map(client_params_fn, state))
        client_out = tff.federated_map(client_fn, (value, params))
        output = tff.federated_map(server_step, (state, tff.federated_sum(client_out)))
        return tff.templates.MeasuredProcessOutput(state=output[0], result=output[1],
                                                   measurements=output[2])

      return tff.templates.AggregationProcess(init_fn, next_fn)

    return self._build_secure_process(value_type, dim, init_fn, client_params, client_fn,
                                      server_step_impl)

  def _build_secure_process(self, value_type, dim: int, plain_init_fn, client_params, client_fn,
                            server_step_impl) -> tff.templates.AggregationProcess:
    """The process with SecAgg: the record chain, the counts and the quantile bits go through their
    own secure aggregations (`secure.py`), whose states live in `secure_agg`."""
    plan = self._plan
    secure = plan.secure
    m = plan.clients_per_round
    adaptive = plan.adaptive_clip is not None
    record_process = secure_lib.record_aggregation_factory(
        secure, secure.scale_factor(plan.clip_norm, m, dim), plan.clip_norm).create(value_type)
    count_type = tff.TensorType(np.int32, [2])
    count_process = secure_lib.count_aggregation_factory(True, 1, 0).create(count_type)
    quantile_process = (secure_lib.count_aggregation_factory(True, 0.5, -0.5).create(
        tff.TensorType(np.float32)) if adaptive else None)
    plain_state_type = plain_init_fn.type_signature.result.member
    record_state_type = record_process.initialize.type_signature.result.member
    count_state_type = count_process.initialize.type_signature.result.member
    quantile_state_type = (quantile_process.initialize.type_signature.result.member if adaptive
                           else tff.StructType([]))

    @tff.tensorflow.computation(plain_state_type, record_state_type, count_state_type,
                                quantile_state_type)
    def attach_secure_agg(state, record, count, quantile):
      return state._replace(secure_agg=SecureAggregationState(record, count, quantile))

    @tff.federated_computation
    def init_fn():
      quantile = (quantile_process.initialize() if adaptive
                  else tff.federated_value((), tff.SERVER))
      return tff.federated_map(attach_secure_agg, (
          plain_init_fn(), record_process.initialize(), count_process.initialize(), quantile))

    state_type = init_fn.type_signature.result
    client_params_fn = tff.tensorflow.computation(client_params, state_type.member)
    value_sum_type = record_process.next.type_signature.result.result.member
    quantile_sum_type = tf.float32 if adaptive else tff.StructType([])

    @tff.tensorflow.computation(state_type.member, value_sum_type, count_type, quantile_sum_type,
                                record_state_type, count_state_type, quantile_state_type)
    def server_step(state, value_sum, counts, quantile_sum, record, count, quantile):
      new_state, result, measurements = server_step_impl(state, value_sum, counts,
                                                         quantile_sum if adaptive else None)
      # The record chain's scale and prior norm bound follow the (possibly new) active clip.
      record = secure_lib.with_clip(
          record, secure_lib.scale_factor_tensor(secure, new_state.clip, m, dim), new_state.clip)
      new_state = new_state._replace(secure_agg=SecureAggregationState(record, count, quantile))
      return new_state, result, measurements

    @tff.federated_computation(state_type, tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      params = tff.federated_broadcast(tff.federated_map(client_params_fn, state))
      client_out = tff.federated_map(client_fn, (value, params))
      record_out = record_process.next(state.secure_agg.record, client_out[0])
      count_out = count_process.next(state.secure_agg.count, client_out[1])
      if adaptive:
        quantile_out = quantile_process.next(state.secure_agg.quantile, client_out[2])
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

