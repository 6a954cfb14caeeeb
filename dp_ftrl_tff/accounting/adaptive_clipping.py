"""Noise inflation for DP-FTRL with adaptive quantile clipping (Gboard paper, Thm. 1 / App. A).

With adaptive clipping each round releases two noisy sums: the clipped model updates (noise multiplier
z_Delta relative to the clip norm) and the clipped-count bits used by the quantile estimator (noise
std sigma_b; the count query is centred, b - 1/2, so its sensitivity is 1/2). Their zCDP adds up:

    1 / z^2 = 1 / z_Delta^2 + 1 / (2 sigma_b)^2,

so one step is as private as a non-adaptive step with noise multiplier z when

    z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)           (Thm. 1, after Andrew et al. 2021).

`noise_multiplier` z is the multiplier the accountant uses (relative to the clip norm); z_Delta is the
larger multiplier the aggregator must put on the model sum. `clipped_count_stddev` sigma_b is the
absolute std of the noise on the SUM of clipped-count bits (Gboard default: clients_per_round / 20).
"""

import math

from dp_ftrl_tff import _validation


def inflated_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float) -> float:
  """z_Delta: the model-sum noise multiplier that makes adaptive clipping as private as z.

  Args:
    noise_multiplier: z > 0, the accounted noise multiplier (relative to the clip norm).
    clipped_count_stddev: sigma_b > 0, std of the noise on the sum of clipped-count bits. Must satisfy
      z < 2 sigma_b, otherwise the count query alone spends the whole budget.

  Returns:
    z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) >= z, as a float.

  Raises:
    ValueError: naming the bad parameter, if a value is not positive or z >= 2 sigma_b.
  """
  z = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  sigma_b = _validation.check_positive_float(clipped_count_stddev, 'clipped_count_stddev')
  if z >= 2.0 * sigma_b:
    raise ValueError(f'`noise_multiplier`={z!r} must be smaller than 2 * `clipped_count_stddev` '
                     f'= {2.0 * sigma_b!r}; otherwise no value noise achieves it.')
  return float((z**-2 - (2.0 * sigma_b)**-2)**-0.5)


def accounted_noise_multiplier(value_noise_multiplier: float, clipped_count_stddev: float) -> float:
  """z: the non-adaptive noise multiplier equivalent to adaptive clipping with (z_Delta, sigma_b).

  The inverse of `inflated_noise_multiplier`: z = (z_Delta^-2 + (2 sigma_b)^-2)^(-1/2) <= z_Delta.

  Args:
    value_noise_multiplier: z_Delta > 0, the noise multiplier on the model sum.
    clipped_count_stddev: sigma_b > 0, std of the noise on the sum of clipped-count bits.

  Returns:
    z as a float.
  """
  z_delta = _validation.check_positive_float(value_noise_multiplier, 'value_noise_multiplier')
  sigma_b = _validation.check_positive_float(clipped_count_stddev, 'clipped_count_stddev')
  return float(1.0 / math.sqrt(z_delta**-2 + (2.0 * sigma_b)**-2))
