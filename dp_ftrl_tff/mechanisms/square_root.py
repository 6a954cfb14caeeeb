"""Closed-form banded square-root strategies: BSR (banded C) and BISR (banded C^-1).

Both truncate the Toeplitz square root of the prefix-sum workload and need no optimization
(docs/papers.md#bsr, docs/papers.md#bisr):
  * A = LtToep(1, 1, ...) is the power series 1 / (1 - x), so A^(1/2) = LtToep(c) with the
    coefficients of (1 - x)^(-1/2), c_j = binom(2j, j) / 4^j = 1, 1/2, 3/8, 5/16, ...
    (`banded.fhu_coefficients`), and A^(-1/2) = LtToep(r) with those of (1 - x)^(1/2),
    r_0 = 1, r_j = -c_j / (2j - 1) = 1, -1/2, -1/8, -1/16, ... (`inverse_square_root_coefs`).
  * BSR (Kalinin & Lampert 2024): C = LtToep(c_0 .. c_{b-hat - 1}), a banded Toeplitz C; C^-1 is the
    (non-banded) Toeplitz power-series inverse. Streams by forward substitution over the last
    b-hat - 1 noise outputs (`dp_ftrl_tff.noise.banded.BandedNoise`).
  * BISR (jax_privacy's banded inverse square root): C^-1 = LtToep(r_0 .. r_{b-hat - 1}), banded, so
    the noise (C^-1 z)_t = sum_{j < b-hat} r_j z_{t - j} is a moving average over the last b-hat
    draws (`dp_ftrl_tff.noise.moving_average.MovingAverageNoise`); C is the (non-banded) Toeplitz
    inverse.
With b-hat >= n both are the full square root, C C = A over n rounds.

Sensitivity: C is lower-triangular Toeplitz, so `sensitivity.toeplitz_squared` applies (BLT paper
Thm. 3.1, O(kn)): exact when the coefficients of C are non-negative and non-increasing (BSR: always,
c_j decreases; BISR: c = 1 / r(x) has non-negative coefficients since r_j <= 0 for j >= 1 and
sum_j |r_j| <= 1, and they are non-increasing in every case we checked, which `sensitivity_is_exact`
verifies each time), otherwise the valid upper bound of the non-increasing majorant.

Conventions: rounds are 0-based (t = 0 .. n-1); `min_sep` = b; `num_bands` = b-hat counts the
non-zero diagonals of the banded factor, the main one included (b-hat = 1 is DP-SGD). Both strategies
stream for any n (`max_rounds` is None). Everything is float64 numpy; no TensorFlow.
"""

import dataclasses
import time
from typing import ClassVar, Optional

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import banded, base, toeplitz
from dp_ftrl_tff.mechanisms import participation as participation_lib


def inverse_square_root_coefs(num_coefs: int) -> np.ndarray:
  """1, -1/2, -1/8, -1/16, -5/128, ...: the first `num_coefs` coefficients of (1 - x)^(1/2), i.e. of
  A^(-1/2) for the prefix-sum A; r_j = -binom(2j, j) / ((2j - 1) 4^j) for j >= 1, float64."""
  num_coefs = _validation.check_positive_int(num_coefs, 'num_coefs')
  j = np.arange(1, num_coefs)
  return np.concatenate([[1.0], -banded.fhu_coefficients(num_coefs)[1:] / (2 * j - 1)])


@dataclasses.dataclass(frozen=True)
class _BandedSquareRootBase(base.ToeplitzStrategy):
  """A lower-triangular Toeplitz strategy defined by `num_bands` (shared by BSR and BISR).

  Subclasses give `toeplitz_coefs` (of C) and `noise_coefs` (of C^-1); the rest follows from them.
  """
  num_bands: int

  def __post_init__(self):
    object.__setattr__(self, 'num_bands',
                       _validation.check_positive_int(self.num_bands, 'num_bands'))

  def describe(self) -> dict:
    return {'num_bands': self.num_bands}

  def to_config(self) -> dict:
    """{'mechanism': name, 'num_bands': b-hat}, JSON-serializable."""
    return {'mechanism': self.name, 'num_bands': self.num_bands}

  @classmethod
  def from_config(cls, config: dict) -> '_BandedSquareRootBase':
    """Inverse of `to_config`; raises ValueError on a wrong `mechanism`, unknown or missing keys,
    or a `num_bands` that is not a positive integer."""
    base.check_config(config, (cls.name,), required=('num_bands',))
    return cls(num_bands=config['num_bands'])

  def __str__(self) -> str:
    return f'{type(self).__name__}(num_bands={self.num_bands})'


@dataclasses.dataclass(frozen=True)
class BandedSquareRootStrategy(_BandedSquareRootBase):
  """BSR: C = LtToep(c_0 .. c_{b-hat - 1}) with c_j = binom(2j, j) / 4^j, banded Toeplitz.

  The noise of round t is sigma * zeta * (C^-1 z)_t, streamed by forward substitution with b-hat - 1
  buffers (`dp_ftrl_tff.noise.banded.BandedNoise`). `band_rows(num_rounds)` gives C in the banded
  storage of `banded.BandedStrategy`.

  Attributes:
    num_bands: b-hat >= 1, the non-zero diagonals of C.
  """
  name: ClassVar[str] = 'bsr'

  def toeplitz_coefs(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return toeplitz.padded_coefs(banded.fhu_coefficients(min(self.num_bands, num_rounds)),
                                 num_rounds)

  def noise_coefs(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return toeplitz.inverse_coefs(self.toeplitz_coefs(num_rounds), num_rounds)

  def band_rows(self, num_rounds: int) -> np.ndarray:
    """R (n, min(b-hat, n)) with R[t, j] = C[t, t - j] = c_j for t >= j, else 0 (banded storage)."""
    num_rounds = self.check_num_rounds(num_rounds)
    coefs = banded.fhu_coefficients(min(self.num_bands, num_rounds))
    rows, lags = np.indices((num_rounds, coefs.size))
    return np.where(rows >= lags, coefs[lags], 0.0)

  def streaming_band_rows(self) -> np.ndarray:
    """The band rows a stream looks up (round t reads row min(t, b-hat - 1)): the first b-hat rows,
    as every later row equals row b-hat - 1 (`banded.BandedStrategy.streaming_band_rows`)."""
    return self.band_rows(self.num_bands)


@dataclasses.dataclass(frozen=True)
class BandedInverseSquareRootStrategy(_BandedSquareRootBase):
  """BISR: C^-1 = LtToep(r_0 .. r_{b-hat - 1}) with the coefficients r of (1 - x)^(1/2), banded.

  The noise of round t is sigma * zeta * sum_{j < b-hat} r_j z_{t - j}, a moving average of the last
  b-hat draws (`dp_ftrl_tff.noise.moving_average.MovingAverageNoise`); C is its Toeplitz inverse.

  Attributes:
    num_bands: b-hat >= 1, the non-zero diagonals of C^-1.
  """
  name: ClassVar[str] = 'bisr'

  def noise_coefs(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return toeplitz.padded_coefs(inverse_square_root_coefs(min(self.num_bands, num_rounds)),
                                 num_rounds)

  def toeplitz_coefs(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return toeplitz.inverse_coefs(self.noise_coefs(num_rounds), num_rounds)

  def moving_average_coefs(self) -> np.ndarray:
    """r_0 .. r_{b-hat - 1}: the weights of z_t .. z_{t - b-hat + 1} in the noise of round t."""
    return inverse_square_root_coefs(self.num_bands)


def _for_setting(strategy_class, num_rounds: int,
                 participation: participation_lib.ParticipationSchema,
                 num_bands: Optional[int]) -> base.OptimizationResult:
  start = time.perf_counter()
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  participation = participation_lib.check_participation(participation)
  if num_bands is None:
    num_bands = min(participation.min_sep, num_rounds)
  num_bands = _validation.check_positive_int(num_bands, 'num_bands')
  if num_bands > num_rounds:  # its stream would hold num_bands - 1 buffers for nothing
    raise ValueError(f'`num_bands`={num_bands} must not exceed `num_rounds`={num_rounds}.')
  strategy = strategy_class(num_bands=num_bands)
  losses = strategy.losses(num_rounds, participation)
  return base.OptimizationResult(
      strategy=strategy, losses=losses, num_rounds=num_rounds, participation=participation,
      seconds=time.perf_counter() - start,
      details={'closed_form': True,
               'sensitivity_exact': strategy.sensitivity_is_exact(num_rounds, participation)})


def optimize_bsr(num_rounds: int, participation: participation_lib.ParticipationSchema,
                    num_bands: Optional[int] = None) -> base.OptimizationResult:
  """The BSR strategy for a setting, with its losses: the registry's optimizer for 'bsr', a closed
  form (nothing is minimized; named like the other optimizers).

  Args:
    num_rounds: n the losses are reported for (the strategy streams for any n).
    participation: the `ParticipationSchema` of the reported losses.
    num_bands: 1 <= b-hat <= n, or None for min(min_sep, n).

  Returns:
    `base.OptimizationResult` of a `BandedSquareRootStrategy`; `details` says whether the sensitivity
    is exact.
  """
  return _for_setting(BandedSquareRootStrategy, num_rounds, participation, num_bands)


def optimize_bisr(num_rounds: int, participation: participation_lib.ParticipationSchema,
                     num_bands: Optional[int] = None) -> base.OptimizationResult:
  """The BISR strategy for a setting, with its losses; as `optimize_bsr`."""
  return _for_setting(BandedInverseSquareRootStrategy, num_rounds, participation, num_bands)

