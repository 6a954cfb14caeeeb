"""`CorrelatedNoiseFactory`: DP mean of client updates with streaming correlated noise (DP-FTRL).

A drop-in `tff.aggregators.UnweightedAggregationFactory` for
`tff.learning.algorithms.build_unweighted_fed_avg(..., model_aggregator=factory)`. Per round t
(0-based) it composes, in this order:
  1. on each client: zeroing of non-finite or too-large updates (counted, never propagated) and L2
     clipping to the active clip zeta (`clipping.py`); with adaptive clipping also the quantile bit
     1[||Delta_i|| <= C^t] - 1/2 (`adaptive_clipping.py`);
  2. the record aggregation: a plain sum (`process.py`), or TFF's SecAgg chain (`secure_process.py`);
  3. on the server: correlated noise sigma_Delta * zeta_sens * (M z)_t from a pluggable
     `dp_ftrl_tff.noise` state, where zeta_sens = zeta (or its inflated bound after rounding with
     SecAgg) and sigma_Delta = sigma (or its Gboard Thm. 1 inflation with adaptive clipping);
  4. normalization by the fixed `clients_per_round` m (never the realized count):
     result_t = (sum_i clip(Delta_i) + sigma_Delta zeta_sens (M z)_t) / m.
At a restart round r (the plan's `RestartSchedule`, or the end of a banded segment) the noise state
(and the count noise state) starts a fresh segment and, with adaptive clipping, the active clip takes
the estimate.

Noise multipliers are relative to the clip norm and apply to the SUM (DP-FTRL convention, TFF's
`DifferentiallyPrivateFactory.tree_aggregation`); the noise seed comes from OS entropy at `initialize`
unless `noise_seed` is given, and lives in the state, so a restored checkpoint continues the noise
sequence bit for bit.
"""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation, settings
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import run_guarantee
from dp_ftrl_tff.aggregators import process as process_lib
from dp_ftrl_tff.aggregators import secure_process
from dp_ftrl_tff.mechanisms import base as mechanisms_base
from dp_ftrl_tff.mechanisms import registry, resolve
from dp_ftrl_tff.noise import base as noise_base


def _strategy(mechanism: str, strategy=None, **parameters) -> mechanisms_base.Strategy:
  """The strategy of a classmethod: a `Strategy`, a file path, or the mechanism's parameters
  (`resolve.resolve_strategy`, without optimization: a factory knows no setting)."""
  return resolve.resolve_strategy(mechanism, strategy=strategy, options=parameters,
                                  fallback='error').strategy


class CorrelatedNoiseFactory(tff.aggregators.UnweightedAggregationFactory):
  """DP mean with correlated streaming noise; see the module docstring for the composition.

  Built from a `dp_ftrl_tff.plan.RunPlan` (everything that determines the privacy guarantee); the
  classmethods `gaussian`, `tree`, `banded`, `blt`, `bsr`, `bisr` build the plan for the common
  configurations. The streaming noise is the registry's noise class for the plan's mechanism
  (`mechanisms.registry.noise_class`), one stream for the model and, with adaptive clipping, one for
  the clipped count.

  Args:
    plan: the `RunPlan` (with its `clients_per_round` and `clip_norm`).
    noise_seed: int seed in [0, 2^63), or None for a fresh seed from OS entropy at each `initialize`.
    max_rounds_per_tree: trees only: the longest tree (sizes the noise state); None means the
      plan's longest segment (`RunPlan.max_segment_rounds`), or 2^15 rounds without restarts.
  """

  def __init__(self, plan: plan_lib.RunPlan, *, noise_seed: Optional[int] = None,
               max_rounds_per_tree: Optional[int] = None):
    if not isinstance(plan, plan_lib.RunPlan):
      raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {plan!r}.')
    if plan.accounting_only:
      raise ValueError('`plan` has no `clients_per_round` or `clip_norm` (a plan for accounting '
                       'only): an aggregator needs both.')
    if not registry.entry(plan.mechanism).streams:
      raise ValueError(f'`strategy` {plan.mechanism!r} has no streaming noise; streaming mechanisms: '
                       f'{list(registry.names(streaming_only=True))}.')
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
    return cls(plan_lib.RunPlan.build(_strategy('gaussian'), noise_multiplier, clients_per_round,
                                      clip_norm, **kwargs), noise_seed=noise_seed)

  @classmethod
  def tree(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
           use_efficient: bool = True, restarts=None, noise_seed: Optional[int] = None, *,
           max_rounds_per_tree: Optional[int] = None, **kwargs) -> 'CorrelatedNoiseFactory':
    """Tree aggregation (DP-FTRL, Kairouz et al. 2021): residuals of the noisy prefix sums.

    Args:
      use_efficient: Honaker's efficient estimator (True, mechanism 'tree_efficient') or the vanilla
        tree (False, mechanism 'tree'), as TFF's `DifferentiallyPrivateFactory.tree_aggregation`.
      restarts: a `RestartSchedule`, an int period p (restarts at p, 2p, ...) or None (no restarts
        with a fixed clip; rounds 128 + 1024 i with adaptive clipping).
      max_rounds_per_tree: the longest tree (sets the stored levels of the noise state); None means
        the longest segment of the restart schedule, or 2^15 rounds without restarts.
      kwargs: `RunPlan.build` arguments.
    """
    if not isinstance(use_efficient, bool):
      raise ValueError(f'`use_efficient` must be a bool, got {use_efficient!r}.')
    if restarts is not None and not isinstance(restarts, settings.RestartSchedule):
      period = _validation.check_positive_int(restarts, 'restarts')
      restarts = settings.RestartSchedule(warmup=period, period=period)
    strategy = _strategy('tree_efficient' if use_efficient else 'tree')
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
    plan = plan_lib.RunPlan.build(_strategy('banded', strategy), noise_multiplier,
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
    if strategy is None and (theta is None or omega is None):
      raise ValueError('`blt` needs `strategy`, or both `theta` and `omega`.')
    plan = plan_lib.RunPlan.build(_strategy('blt', strategy, theta=theta, omega=omega),
                                  noise_multiplier, clients_per_round, clip_norm, **kwargs)
    return cls(plan, noise_seed=noise_seed)

  @classmethod
  def bsr(cls, noise_multiplier: float, clients_per_round: float, clip_norm: Optional[float],
          num_bands: int, noise_seed: Optional[int] = None, **kwargs) -> 'CorrelatedNoiseFactory':
    """Banded square root (BSR, Kalinin & Lampert 2024): C = the first `num_bands` diagonals of the
    square root of the prefix-sum matrix; closed form, streams for any number of rounds.

    Args:
      num_bands: b-hat >= 1 (min(min_sep, rounds) is a good choice: `mechanisms.square_root`).
    """
    plan = plan_lib.RunPlan.build(_strategy('bsr', num_bands=num_bands), noise_multiplier,
                                  clients_per_round, clip_norm, **kwargs)
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
    plan = plan_lib.RunPlan.build(_strategy('bisr', num_bands=num_bands), noise_multiplier,
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
  def secure(self) -> Optional[settings.SecureAggregation]:
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

  def create(self, value_type) -> tff.templates.AggregationProcess:
    """The `AggregationProcess` for client updates of `value_type` (a structure of floats).

    `value_type`: a `tff.TensorType`, a `tff.StructWithPythonType` of them, or the same as a
    `tf.TensorSpec` or a (nested) list / tuple / dict of `tf.TensorSpec`s (converted with
    `tff.types.tensorflow_to_type`).
    """
    value_type = _check_value_type(value_type)
    value_specs = tff.types.type_to_tf_tensor_specs(value_type)
    if not all(spec.shape.is_fully_defined() for spec in tf.nest.flatten(value_specs)):
      raise ValueError(f'`value_type` must have fully defined shapes, got {value_type!r}.')
    dim = int(sum(spec.shape.num_elements() for spec in tf.nest.flatten(value_specs)))
    parts = process_lib.RoundComputations.build(self._plan, self._noise, self._noise_seed,
                                                value_type, value_specs, dim)
    if self._plan.secure is None:
      return process_lib.plain_process(parts, value_type)
    return secure_process.secure_process(parts, value_type)


def _check_value_type(value_type):
  """`value_type` as a TFF type: a tensor or a structure of floating tensors."""
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
  return value_type
