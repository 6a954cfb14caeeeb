"""SecAgg-compatible record aggregation: TFF's discretization / modular clipping / secure sum chain.

Gboard paper (Sec. 2.4 and App. C.1, after Kairouz, Liu and Steinke 2021, "The distributed discrete
Gaussian mechanism for FL with SecAgg"): clipped client updates are flattened (concatenated and
optionally rotated), scaled by `scale_factor` = 1 / gamma and stochastically rounded to integers,
modularly clipped into the 2^bits field and summed with SecAgg. The correlated DP noise is added
centrally on the server AFTER the secure sum, so the chain carries no noise of its own.

Rounding inflates the L2 norm of a clipped update: the sensitivity used for the noise is TFF's
`discretization.inflated_l2_norm_bound(clip, gamma, beta, padded_dim)` plus the 1e-5 leeway TFF's
`DistributedDpSumFactory` adds, i.e. the bound on the norm AFTER rounding, in unscaled units.

The settings and the scale-factor arithmetic are `dp_ftrl_tff.settings.SecureAggregation`. The scale
(a constant / clip) follows the active clip: `scale_factor_tensor` and `sensitivity_clip` compute it
in the graph and `with_clip` moves the chain's state to a new clip.
"""

import collections
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation, settings

#: Leeway TFF's DistributedDpSumFactory adds to the inflated norm bound (float32 rounding).
NORM_LEEWAY = 1e-5


def scale_factor_tensor(config: settings.SecureAggregation, clip_norm, clients_per_round: float,
                        dim: int) -> tf.Tensor:
  """`config.scale_factor` as a float32 TF op, for a clip that changes in the graph."""
  unit = config.unit_scale_factor(clients_per_round, dim)
  return tf.minimum(tf.constant(unit, tf.float32) / tf.cast(clip_norm, tf.float32),
                    tf.constant(settings.MAX_SCALE_FACTOR, tf.float32))


def sensitivity_clip(config: settings.SecureAggregation, clip_norm, clients_per_round: float,
                     dim: int) -> tf.Tensor:
  """L2 bound (unscaled) of a record clipped to `clip_norm` after rounding at its scale (TF op)."""
  scale = scale_factor_tensor(config, clip_norm, clients_per_round, dim)
  return inflated_clip(clip_norm, 1.0 / scale, config.beta, config.padded_dim(dim))


def inflated_clip(clip_norm, gamma: float, beta: float, padded_dim: int) -> tf.Tensor:
  """L2 bound (unscaled units) of a clipped update after stochastic rounding, with TFF's leeway.

  A TF op (clip_norm may change at adaptive-clipping restarts): TFF's
  `discretization.inflated_l2_norm_bound` + `NORM_LEEWAY`.
  """
  bound = tff.aggregators.discretization.inflated_l2_norm_bound(
      l2_norm_bound=tf.cast(clip_norm, tf.float32), gamma=gamma, beta=beta, dim=padded_dim)
  return bound + NORM_LEEWAY


def record_aggregation_factory(config: settings.SecureAggregation, scale_factor: float,
                               prior_norm_bound: float
                               ) -> tff.aggregators.UnweightedAggregationFactory:
  """TFF's chain: concat -> [rotation] -> stochastic discretization -> wrap check -> modular clips
  -> secure sum.

  The two modular clips ([-2^(b-1), 2^(b-1)) then [0, 2^b)) and the secure sum with bound 2^b - 1
  are arranged as in TFF's `DistributedDpSumFactory`, so the server output is the centred sum.
  `scale_factor` and `prior_norm_bound` (the clip, which conditional rounding with beta > 0 needs)
  are the initial values of the discretization state; `with_clip` moves both to a new clip.
  """
  if not isinstance(config, settings.SecureAggregation):
    raise ValueError(f'`config` must be a SecureAggregation, got {config!r}.')
  scale_factor = _validation.check_positive_float(scale_factor, 'scale_factor')
  prior_norm_bound = _validation.check_positive_float(prior_norm_bound, 'prior_norm_bound')
  agg = tff.aggregators.SecureSumFactory(upper_bound_threshold=2**config.bits - 1,
                                         lower_bound_threshold=0)
  agg = tff.aggregators.modular_clipping.ModularClippingSumFactory(
      clip_range_lower=0, clip_range_upper=2**config.bits, inner_agg_factory=agg)
  agg = tff.aggregators.modular_clipping.ModularClippingSumFactory(
      clip_range_lower=-(2**(config.bits - 1)), clip_range_upper=2**(config.bits - 1),
      inner_agg_factory=agg)
  agg = ModularWrapCheckFactory(agg, config.bits)
  agg = tff.aggregators.discretization.DiscretizationFactory(
      inner_agg_factory=agg, scale_factor=scale_factor, stochastic=True, beta=config.beta,
      prior_norm_bound=prior_norm_bound)
  if config.rotation == 'hd':
    agg = tff.aggregators.HadamardTransformFactory(inner_agg_factory=agg)
  elif config.rotation == 'dft':
    agg = tff.aggregators.DiscreteFourierTransformFactory(inner_agg_factory=agg)
  return tff.aggregators.concat_factory(inner_agg_factory=agg)


def with_clip(record_state: Any, scale_factor: tf.Tensor, clip_norm: tf.Tensor) -> Any:
  """The record chain's state with the discretization's scale and prior norm bound replaced.

  Inside a TF computation: walks the nested state of `record_aggregation_factory`'s process (the
  rotation wraps it in a tuple) to the `DiscretizationFactory` state, as TFF's
  `DistributedDpSumFactory._autotune_component_states` does.
  """
  if isinstance(record_state, collections.abc.Mapping):
    if 'scale_factor' in record_state and 'prior_norm_bound' in record_state:
      updated = collections.OrderedDict(record_state)
      updated['scale_factor'] = tf.cast(scale_factor, tf.float32)
      updated['prior_norm_bound'] = tf.cast(clip_norm, tf.float32)
      return type(record_state)(updated) if isinstance(record_state, dict) else updated
    return type(record_state)(
        (key, with_clip(value, scale_factor, clip_norm)) for key, value in record_state.items())
  if isinstance(record_state, (list, tuple)) and not hasattr(record_state, '_fields'):
    return type(record_state)(with_clip(value, scale_factor, clip_norm) for value in record_state)
  return record_state


#: Bits beyond the field that the wrap check's projection keeps (see `ModularWrapCheckFactory`).
WRAP_CHECK_BITS = 16
#: Terms of the projection summed at a time: 2^20 terms below 2^(22 + 16) stay below 2^58.
_PROJECTION_CHUNK = 2**20


class ModularWrapCheckFactory(tff.aggregators.UnweightedAggregationFactory):
  """Detects modular wraps of a secure sum of integer vectors in a 2^bits field.

  TFF's modular clips return v = s - 2^b w, where s = sum_i x_i is the true sum of the rounded
  client vectors and w is an integer vector (w != 0 exactly when some coordinate of a client vector
  or of the sum left [-2^(b-1), 2^(b-1))). Each client also sends, through a second secure sum, the
  projection p_i = <r, x_i> mod 2^(b+q) with random odd weights r_j = 2 a_j + 1, a_j uniform in
  [0, 2^(q-1)) (q = `WRAP_CHECK_BITS`, fresh weights every round). The server computes
  (sum_i p_i - <r, v>) mod 2^(b+q) = 2^b (<r, w> mod 2^q), which is
    * zero when there was no wrap;
    * nonzero when exactly one coordinate wrapped once (r_j is odd);
    * nonzero with probability at least 1 - 2^-(q-1) over r whenever some w_j is odd (with w_1 odd,
      2 a_1 w_1 mod 2^q is uniform over the even residues, so <r, w> mod 2^q is uniform over one
      parity class).
  The measurement `modular_wrap` is 1 in a round where a wrap was detected, else 0. The projection
  reveals nothing the server does not already see: without a wrap the server holds s itself, and the
  DP noise is added after the secure sum.
  """

  def __init__(self, inner_agg_factory: tff.aggregators.UnweightedAggregationFactory, bits: int):
    self._inner = inner_agg_factory
    self._bits = _validation.check_positive_int(bits, 'bits')
    if self._bits > settings.MAX_SECURE_BITS:  # the projection's int64 bound assumes it
      raise ValueError(f'`bits` must be at most {settings.MAX_SECURE_BITS}, got {bits}.')
    self._modulus = 2**(self._bits + WRAP_CHECK_BITS)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    inner_process = self._inner.create(value_type)
    projection_type = tff.TensorType(np.int64, [1])
    projection_process = tff.aggregators.SecureSumFactory(
        upper_bound_threshold=self._modulus - 1, lower_bound_threshold=0).create(projection_type)
    init_round, client_projection, detect_wrap, next_round = _wrap_check_computations(
        value_type, inner_process.next.type_signature.result.result.member, projection_type,
        self._modulus)

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          round=tff.federated_eval(init_round, tff.SERVER),
          inner=inner_process.initialize(), projection=projection_process.initialize()))

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      round_index = state['round']
      projections = tff.federated_map(
          client_projection, (value, tff.federated_broadcast(round_index)))
      inner_output = inner_process.next(state['inner'], value)
      projection_output = projection_process.next(state['projection'], projections)
      wrap = tff.federated_map(detect_wrap,
                                (inner_output.result, round_index, projection_output.result))
      new_state = collections.OrderedDict(
          round=tff.federated_map(next_round, round_index), inner=inner_output.state,
          projection=projection_output.state)
      measurements = collections.OrderedDict(modular_wrap=wrap,
                                             wrap_check=inner_output.measurements)
      return tff.templates.MeasuredProcessOutput(
          state=tff.federated_zip(new_state), result=inner_output.result,
          measurements=tff.federated_zip(measurements))

    return tff.templates.AggregationProcess(init_fn, next_fn)


def _wrap_check_weights(round_index, size: int) -> tf.Tensor:
  """The round's odd weights r_j = 2 a_j + 1, a_j uniform in [0, 2^(q-1)) (TF op): drawn from a
  stateless seed of the round index, so every client and the server draw the same ones."""
  seed = tf.stack([tf.cast(round_index, tf.int64), tf.constant(0x5EC, tf.int64)])
  half = tf.random.stateless_uniform([size], seed, minval=0, maxval=2**(WRAP_CHECK_BITS - 1),
                                     dtype=tf.int64)
  return 2 * half + 1


def _projection(value, round_index, size: int, modulus: int) -> tf.Tensor:
  """<r, value> mod `modulus` with the round's weights r (`_wrap_check_weights`), a TF op."""
  # Residues in [0, 2^(b+q)) times weights < 2^q stay below 2^(22 + 2 * 16) = 2^54. The reduced
  # terms (< 2^38) are summed `_PROJECTION_CHUNK` at a time, each chunk's sum reduced again: exact
  # in int64 up to 2^45 coordinates.
  residues = tf.math.floormod(tf.cast(tf.reshape(value, [-1]), tf.int64), modulus)
  terms = tf.math.floormod(residues * _wrap_check_weights(round_index, size), modulus)
  if size > _PROJECTION_CHUNK:
    terms = tf.reshape(tf.pad(terms, [[0, -size % _PROJECTION_CHUNK]]), [-1, _PROJECTION_CHUNK])
    terms = tf.math.floormod(tf.reduce_sum(terms, axis=1), modulus)
  return tf.math.floormod(tf.reduce_sum(terms), modulus)


def _wrap_check_computations(value_type, sum_type, projection_type, modulus: int) -> tuple:
  """The wrap check's TF computations (init_round, client_projection, detect_wrap, next_round):
  the round counter's start and step, a client's projection, and the server's test of the summed
  projection against the projection of the secure sum (1 on a detected wrap, else 0)."""
  size = int(np.prod(value_type.shape))

  @tff.tensorflow.computation
  def init_round():
    return tf.constant(0, tf.int64)

  @tff.tensorflow.computation(value_type, np.int64)
  def client_projection(value, round_index):
    return tf.reshape(_projection(value, round_index, size, modulus), [1])

  @tff.tensorflow.computation(sum_type, np.int64, projection_type)
  def detect_wrap(value_sum, round_index, projection_sum):
    difference = tf.math.floormod(
        projection_sum[0] - _projection(value_sum, round_index, size, modulus), modulus)
    return tf.cast(tf.not_equal(difference, 0), tf.int32)

  @tff.tensorflow.computation(np.int64)
  def next_round(round_index):
    return round_index + 1

  return init_round, client_projection, detect_wrap, next_round


def count_aggregation_factory(secure: bool, upper: int, lower: int
                              ) -> tff.aggregators.UnweightedAggregationFactory:
  """Sum for the per-client integer counts: secure (bounded by the integers `lower` <= `upper`)
  or plain."""
  if not secure:
    return tff.aggregators.SumFactory()
  if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (upper, lower)):
    raise ValueError(f'`upper` and `lower` must be integers, got {upper!r} and {lower!r} (the '
                     'quantile bits: `quantile_bit_aggregation_factory`).')
  if lower > upper:
    raise ValueError(f'`lower` must not exceed `upper`, got {lower} > {upper}.')
  return tff.aggregators.SecureSumFactory(upper_bound_threshold=int(upper),
                                          lower_bound_threshold=int(lower))


def quantile_bit_aggregation_factory() -> tff.aggregators.UnweightedAggregationFactory:
  """Secure sum of adaptive clipping's float32 quantile bits (TF-Privacy's below-estimate bits
  shifted to -0.5 / +0.5), exact: `QuantileBitSecureSumFactory`."""
  return QuantileBitSecureSumFactory()


class QuantileBitSecureSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """Sums float32 scalars in {-0.5, +0.5} with SecAgg as the integers 2x in {-1, +1}: each client
  maps x to round(2x) (int32), TFF's integer `SecureSumFactory` over [-1, 1] sums them, and the
  server halves the sum (float32; exact for any number of clients below 2^24).

  Why not TFF's float `SecureSumFactory(0.5, -0.5)`: its quantization (`secure_quantized_sum`)
  rounds each bit to a 32-bit grid and builds an unused `tf.debugging.assert_less_equal` in a graph,
  which TensorFlow reports at ERROR level ("Object was never used") every time it is built.
  """

  def create(self, value_type) -> tff.templates.AggregationProcess:
    if not (isinstance(value_type, tff.TensorType) and value_type.dtype == np.float32
            and value_type.shape == ()):
      raise ValueError(f'`value_type` must be a float32 scalar, got {value_type}.')
    integer_type = tff.TensorType(np.int32)
    inner_process = tff.aggregators.SecureSumFactory(
        upper_bound_threshold=1, lower_bound_threshold=-1).create(integer_type)

    @tff.tensorflow.computation(value_type)
    def doubled(value):
      return tf.cast(tf.round(2.0 * value), tf.int32)

    @tff.tensorflow.computation(integer_type)
    def halved(value_sum):
      return tf.cast(value_sum, tf.float32) / 2.0

    @tff.federated_computation
    def init_fn():
      return inner_process.initialize()

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      output = inner_process.next(state, tff.federated_map(doubled, value))
      return tff.templates.MeasuredProcessOutput(
          state=output.state, result=tff.federated_map(halved, output.result),
          measurements=output.measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)
