"""SecAgg-compatible record aggregation: TFF's discretization / modular clipping / secure sum chain.

Gboard paper (Sec. 2.4 and App. C.1, after Kairouz, Liu and Steinke 2021, "The distributed discrete
Gaussian mechanism for FL with SecAgg"): clipped client updates are flattened (concatenated and
optionally rotated), scaled by `scale_factor` = 1 / gamma and stochastically rounded to integers,
modularly clipped into the 2^bits field and summed with SecAgg. The correlated DP noise is added
centrally on the server AFTER the secure sum, so the chain carries no noise of its own.

Rounding inflates the L2 norm of a clipped update: the sensitivity used for the noise is TFF's
`discretization.inflated_l2_norm_bound(clip, gamma, beta, padded_dim)` plus the 1e-5 leeway TFF's
`DistributedDpSumFactory` adds, i.e. the bound on the norm AFTER rounding, in unscaled units.

The scale factor follows the sub-Gaussian heuristic of the DDG paper (Sec. 4.2 / 4.4), with no local
noise: with k = `num_stddevs` (from `modclip_prob`), n = clients_per_round and padded dimension d,
2^bits = 2 k sqrt(c^2 n^2 / d + gamma^2 n / 4) / gamma, so the sum of n flattened updates stays inside
the field with probability about 1 - modclip_prob. Without rotation no flattening holds; the scale
then uses the worst case n (c / gamma + 1) <= 2^(bits - 1).
"""

import dataclasses
import math
from typing import Optional

import numpy as np
import scipy.special
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import _validation

#: TFF's cap on the scale factor (float32 arithmetic in the rounding overflows above it).
MAX_SCALE_FACTOR = 1e6
#: Leeway TFF's DistributedDpSumFactory adds to the inflated norm bound (float32 rounding).
NORM_LEEWAY = 1e-5
_ROTATIONS = ('dft', 'hd', None)


@dataclasses.dataclass(frozen=True)
class SecureAggregation:
  """Settings of the SecAgg chain.

  Attributes:
    bits: field size 2^bits of the secure sum, 1 <= bits <= 22 (TFF's float32 limit).
    rotation: 'dft' (discrete Fourier transform, pads at most one zero), 'hd' (randomized Hadamard,
      pads to a power of 2) or None (no flattening; worst-case scale).
    beta: conditional stochastic rounding bias in [0, 1) (0 = unconditional; DDG paper Sec. 4.1).
    modclip_prob: target probability of a modular wrap of the aggregate, in (0, 1).
  """
  bits: int = 20
  rotation: Optional[str] = 'dft'
  beta: float = 0.0
  modclip_prob: float = 1e-4

  def __post_init__(self):
    _validation.check_positive_int(self.bits, 'bits')
    if self.bits > 22:
      raise ValueError(f'`bits` must be at most 22 (float32 arithmetic), got {self.bits!r}.')
    if self.rotation not in _ROTATIONS:
      raise ValueError(f"`rotation` must be 'dft', 'hd' or None, got {self.rotation!r}.")
    _validation.check_float_in_range(self.beta, 'beta', 0.0, 1.0, high_inclusive=False)
    _validation.check_float_in_range(self.modclip_prob, 'modclip_prob', 0.0, 1.0,
                                     low_inclusive=False, high_inclusive=False)

  def padded_dim(self, dim: int) -> int:
    """Length of the flattened vector the secure sum sees for a `dim`-coordinate update."""
    dim = _validation.check_positive_int(dim, 'dim')
    if self.rotation == 'hd':
      return 2**math.ceil(math.log2(dim))
    if self.rotation == 'dft':
      return 2 * math.ceil(dim / 2)
    return dim

  def scale_factor(self, clip_norm: float, clients_per_round: float, dim: int) -> float:
    """1 / gamma: the scale applied before rounding (see the module docstring)."""
    clip_norm = _validation.check_positive_float(clip_norm, 'clip_norm')
    n = _validation.check_positive_float(clients_per_round, 'clients_per_round')
    d = self.padded_dim(dim)
    field = 2.0**self.bits
    if self.rotation is None:
      scale = (field / 2.0 / n - 1.0) / clip_norm
    else:
      k = math.sqrt(2.0) * float(scipy.special.erfcinv(self.modclip_prob))
      headroom = field**2 - n * k**2
      scale = math.sqrt(max(headroom, 0.0)) / (2.0 * k * clip_norm * n / math.sqrt(d))
    if scale <= 0:
      raise ValueError(f'`bits`={self.bits} is too small for {n:g} clients per round: the sum '
                       'cannot fit in the field. Increase `bits`.')
    return min(scale, MAX_SCALE_FACTOR)


def inflated_clip(clip_norm, gamma: float, beta: float, padded_dim: int) -> tf.Tensor:
  """L2 bound (unscaled units) of a clipped update after stochastic rounding, with TFF's leeway.

  A TF op (clip_norm may change at adaptive-clipping restarts): TFF's
  `discretization.inflated_l2_norm_bound` + `NORM_LEEWAY`.
  """
  bound = tff.aggregators.discretization.inflated_l2_norm_bound(
      l2_norm_bound=tf.cast(clip_norm, tf.float32), gamma=gamma, beta=beta, dim=padded_dim)
  return bound + NORM_LEEWAY


def record_aggregation_factory(config: SecureAggregation, scale_factor: float
                               ) -> tff.aggregators.UnweightedAggregationFactory:
  """TFF's chain: concat -> [rotation] -> stochastic discretization -> modular clips -> secure sum.

  The two modular clips ([-2^(b-1), 2^(b-1)) then [0, 2^b)) and the secure sum with bound 2^b - 1
  are arranged as in TFF's `DistributedDpSumFactory`, so the server output is the centred sum.
  """
  if not isinstance(config, SecureAggregation):
    raise ValueError(f'`config` must be a SecureAggregation, got {config!r}.')
  scale_factor = _validation.check_positive_float(scale_factor, 'scale_factor')
  agg = tff.aggregators.SecureSumFactory(upper_bound_threshold=2**config.bits - 1,
                                         lower_bound_threshold=0)
  agg = tff.aggregators.modular_clipping.ModularClippingSumFactory(
      clip_range_lower=0, clip_range_upper=2**config.bits, inner_agg_factory=agg)
  agg = tff.aggregators.modular_clipping.ModularClippingSumFactory(
      clip_range_lower=-(2**(config.bits - 1)), clip_range_upper=2**(config.bits - 1),
      inner_agg_factory=agg)
  agg = tff.aggregators.discretization.DiscretizationFactory(
      inner_agg_factory=agg, scale_factor=scale_factor, stochastic=True, beta=config.beta)
  if config.rotation == 'hd':
    agg = tff.aggregators.HadamardTransformFactory(inner_agg_factory=agg)
  elif config.rotation == 'dft':
    agg = tff.aggregators.DiscreteFourierTransformFactory(inner_agg_factory=agg)
  return tff.aggregators.concat_factory(inner_agg_factory=agg)


def count_aggregation_factory(secure: bool, upper: float, lower: float
                              ) -> tff.aggregators.UnweightedAggregationFactory:
  """Sum for the per-client counts and quantile bits: secure (bounded) or plain."""
  if secure:
    if isinstance(upper, (int, np.integer)):
      return tff.aggregators.SecureSumFactory(upper_bound_threshold=int(upper),
                                              lower_bound_threshold=int(lower))
    return tff.aggregators.SecureSumFactory(upper_bound_threshold=float(upper),
                                            lower_bound_threshold=float(lower))
  return tff.aggregators.SumFactory()
