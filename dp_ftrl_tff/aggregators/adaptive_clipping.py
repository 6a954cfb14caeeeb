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
multiplier is inflated to z_Delta (`dp_ftrl_tff.accounting.adaptive_clipping`). With iid Gaussian noise
this is TF-Privacy's `QuantileEstimatorQuery` exactly; with trees it matches `TreeQuantileEstimatorQuery`.

Restart rounds (0-based) are R = {warmup + period * i, i >= 0} \\ {0}: round r in R is the FIRST round
of a new segment; the estimate after round r - 1 becomes the active clip for round r. Gboard default
(warmup 128, period 1024): rounds 128, 1152, 2176, ..., the same rounds as TFF's
`tree_adaptive` (`PeriodicRoundRestartIndicator(period=1024, warmup=128)` fires after the 128th call).
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp

from dp_ftrl_tff import _validation
from dp_ftrl_tff.noise import base as noise_base


@dataclasses.dataclass(frozen=True)
class RestartSchedule:
  """Restart rounds R = {warmup + period * i, i >= 0} without round 0 (0-based first rounds).

  Attributes:
    warmup: first restart round (>= 0; 0 means the first restart is at round `period`).
    period: rounds between restarts (>= 1).
  """
  warmup: int
  period: int

  def __post_init__(self):
    _validation.check_nonnegative_int(self.warmup, 'warmup')
    _validation.check_positive_int(self.period, 'period')

  def is_restart_round(self, round_index: tf.Tensor) -> tf.Tensor:
    """bool tensor: round `round_index` (int64) starts a new segment."""
    r = tf.cast(round_index, tf.int64)
    return tf.logical_and(
        tf.logical_and(r > 0, r >= self.warmup),
        tf.equal(tf.math.floormod(r - self.warmup, self.period), 0))

  def restart_rounds(self, num_rounds: int) -> list:
    """The restart rounds below `num_rounds` (Python ints), for accounting and tests."""
    num_rounds = _validation.check_nonnegative_int(num_rounds, 'num_rounds')
    return [r for r in range(self.warmup, num_rounds, self.period) if r > 0]


#: Gboard Alg. 1 / TFF `tree_adaptive`: restarts at rounds 128 + 1024 i.
GBOARD_RESTARTS = RestartSchedule(warmup=128, period=1024)
#: Clip adopted every round: right for iid Gaussian noise, where every round is its own segment.
EVERY_ROUND = RestartSchedule(warmup=1, period=1)


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
  """Settings of adaptive quantile clipping (defaults: Gboard paper Alg. 1 / TFF).

  Attributes:
    target_quantile: gamma in [0, 1], the quantile of update norms to track (0.5).
    learning_rate: eta_gamma >= 0 of the geometric update (0.2).
    initial_clip: C^0 > 0, or None to take the factory's `clip_norm` (else TFF's default 0.1).
    clipped_count_stddev: sigma_b >= 0, std of the noise on the clipped-count SUM; None means
      clients_per_round / 20 (0 when the noise multiplier is 0).
    restarts: the `RestartSchedule`; None means the mechanism's default (every round for iid
      Gaussian noise, `GBOARD_RESTARTS` otherwise).
  """
  target_quantile: float = 0.5
  learning_rate: float = 0.2
  initial_clip: Optional[float] = None
  clipped_count_stddev: Optional[float] = None
  restarts: Optional[RestartSchedule] = None

  def __post_init__(self):
    _validation.check_float_in_range(self.target_quantile, 'target_quantile', 0.0, 1.0)
    _validation.check_nonnegative_float(self.learning_rate, 'learning_rate')
    if self.initial_clip is not None:
      _validation.check_positive_float(self.initial_clip, 'initial_clip')
    if self.clipped_count_stddev is not None:
      _validation.check_nonnegative_float(self.clipped_count_stddev, 'clipped_count_stddev')
    if self.restarts is not None and not isinstance(self.restarts, RestartSchedule):
      raise ValueError(f'`restarts` must be a RestartSchedule or None, got {self.restarts!r}.')


DEFAULT_INITIAL_CLIP = 0.1


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
