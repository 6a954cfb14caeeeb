"""Adaptive quantile clipping with restarts for correlated noise (Gboard paper, Alg. 1 and Thm. 1).

Two clip quantities (Gboard Alg. 1):
  * the tracked estimate C^t of the `target_quantile` of client update norms, updated EVERY round by
    TF-Privacy's `QuantileEstimatorQuery` (Andrew et al. 2021, geometric update):
    below_t = clamp((sum_i (1[||Delta_i|| <= C^t] - 1/2) + noise_t) / m + 1/2, 0, 1),
    C^{t+1} = C^t exp(-learning_rate (below_t - target_quantile));
  * the active clip zeta (clipping and noise calibration), which takes the value of the estimate only
    at a restart, when the noise mechanism starts a fresh segment (tree, banded or BLT stream).
The count noise uses the SAME correlated mechanism as the model noise (a second stream on a scalar,
restarted together with it), with per-round std `clipped_count_stddev` sigma_b on the count sum.
Stacking the model sum / (z_Delta zeta) and the centred count sum / sigma_b gives one mechanism C with
per-client norm^2 <= 1 / z_Delta^2 + 1 / (2 sigma_b)^2 = 1 / z^2, which is Thm. 1: the value noise
multiplier is inflated to z_Delta (`dp_ftrl_tff.settings.inflated_noise_multiplier`). With iid Gaussian noise
this is TF-Privacy's `QuantileEstimatorQuery` exactly; with trees it matches `TreeQuantileEstimatorQuery`.

Restart rounds come from the plan's `RestartSchedule` (`dp_ftrl_tff.plan`): at a restart round r the
estimate after round r - 1 becomes the active clip for round r. The settings (`AdaptiveClipping`) and
the noise split (Thm. 1, `settings.inflated_noise_multiplier`) live in the plan too.
"""

from typing import Any, Callable, NamedTuple, Optional

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp

from dp_ftrl_tff import _validation, settings
from dp_ftrl_tff.noise import base as noise_base


def is_restart_round(schedule: settings.RestartSchedule, round_index: tf.Tensor) -> tf.Tensor:
  """bool tensor: round `round_index` (int64, 0-based) starts a new segment of `schedule`.

  A pure function of the round index, so the decision needs no state of its own and a restored
  checkpoint restarts on the same rounds. Periodic: r > 0, r >= warmup and (r - warmup) % period
  == 0; TF-Privacy's `PeriodicRoundRestartIndicator` fires on the same rounds (a test compares
  them) but keeps a call counter in its state, which would duplicate the aggregator's round
  counter. Explicit (`RestartSchedule.at`): r is one of the schedule's rounds (a constant False for
  none).
  """
  r = tf.cast(round_index, tf.int64)
  if schedule.rounds is not None:
    if not schedule.rounds:
      return tf.constant(False)
    return tf.reduce_any(tf.equal(r, tf.constant(schedule.rounds, tf.int64)))
  return tf.logical_and(
      tf.logical_and(r > 0, r >= schedule.warmup),
      tf.equal(tf.math.floormod(r - schedule.warmup, schedule.period), 0))


class CountNoiseState(NamedTuple):
  """Global state of `StreamingCountQuery`: the scalar noise stream."""
  noise_state: Any


class StreamingCountQuery(tfp.SumAggregationDPQuery):
  """Sum of centred counts (b - 1/2) plus streaming correlated noise, divided by the expected count.

  Records are +-1/2, so nothing is clipped; the noise of round t is `stddev` * (M z')_t from its own
  noise stream (its own seed lineage, see `count_seed`).
  """

  def __init__(self, noise: noise_base.StreamingNoise, stddev: float, expected_num_records: float):
    self._noise = noise
    self._stddev = _validation.check_nonnegative_float(stddev, 'stddev')
    self._expected = _validation.check_positive_float(expected_num_records,
                                                      'expected_num_records')

  def initial_global_state(self, seed: Optional[tf.Tensor] = None) -> CountNoiseState:
    if seed is None:
      seed = noise_base.initial_seed(None)
    return CountNoiseState(self._noise.initial_state(tf.TensorSpec([], tf.float32), seed))

  def preprocess_record(self, params, record):
    del params
    return record

  def get_noised_result(self, sample_state, global_state: CountNoiseState):
    noise, noise_state = self._noise.next(global_state.noise_state,
                                          tf.constant(self._stddev, tf.float32))
    result = (sample_state + noise) / self._expected
    return result, CountNoiseState(noise_state), dp_accounting.UnsupportedDpEvent()

  def restart(self, global_state: CountNoiseState) -> CountNoiseState:
    return CountNoiseState(self._noise.restart(global_state.noise_state))


class CorrelatedQuantileEstimatorQuery(tfp.QuantileEstimatorQuery):
  """TF-Privacy's geometric quantile estimator with the count noise from a `StreamingNoise`.

  Args:
    noise_fn: builds a fresh `StreamingNoise` of the model's mechanism (used on a scalar).
    initial_estimate, target_quantile, learning_rate: as `tfp.QuantileEstimatorQuery`.
    clipped_count_stddev: std of the per-round noise on the count sum.
    expected_num_records: clients_per_round m.
  """

  def __init__(self, noise_fn: Callable[[], noise_base.StreamingNoise], initial_estimate: float,
               target_quantile: float, learning_rate: float, clipped_count_stddev: float,
               expected_num_records: float):
    self._noise_fn = noise_fn
    super().__init__(initial_estimate=initial_estimate, target_quantile=target_quantile,
                     learning_rate=learning_rate, below_estimate_stddev=clipped_count_stddev,
                     expected_num_records=expected_num_records, geometric_update=True)

  def _construct_below_estimate_query(self, below_estimate_stddev, expected_num_records):
    return StreamingCountQuery(self._noise_fn(), below_estimate_stddev, expected_num_records)

  def initial_global_state(self, seed: Optional[tf.Tensor] = None):
    """TF-Privacy's state, with the count noise stream seeded from `seed` (int64[2])."""
    state = super().initial_global_state()
    return state._replace(
        below_estimate_state=self._below_estimate_query.initial_global_state(seed))

  def restart(self, global_state):
    """Starts a fresh count-noise segment (together with the model noise)."""
    return global_state._replace(below_estimate_state=self._below_estimate_query.restart(
        global_state.below_estimate_state))


def count_seed(seed: tf.Tensor) -> tf.Tensor:
  """The count stream's seed, derived from the model stream's int64[2] seed (disjoint lineage)."""
  return tf.random.experimental.stateless_fold_in(seed, tf.constant(-1, tf.int64))
