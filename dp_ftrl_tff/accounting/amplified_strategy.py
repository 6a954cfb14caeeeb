"""A strategy's amplified guarantee under cyclic Poisson sampling (BandMF Thm. 4).

The theorem (`dp_ftrl_tff.accounting.amplification`) needs the strategy matrix C of each restart
segment to be square, lower triangular and to have at most b-hat bands; the run is then as private
as DP-SGD with noise multiplier sigma / kappa, kappa = max_j ||C[:, j]||_2. This module reads the
bands and kappa off a strategy (in O(n) or O(n b-hat), never the dense n x n C of a Toeplitz or
banded strategy) and states the run's `AmplifiedGuarantee`.

Conventions: rounds are 0-based; the noise multiplier sigma is relative to the clip norm.
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.accounting import amplification
from dp_ftrl_tff.mechanisms import banded, base, gaussian, tree


def _segment_structure(strategy: base.Strategy, length: int) -> Optional[tuple]:
  """(bands, largest column norm) of C over one segment of `length` rounds, or None when C is not
  square and lower triangular; in O(n) (Toeplitz) or O(n b-hat) (banded) without the n x n C
  (a float64 C of 10^5 rounds would take 80 GB)."""
  if isinstance(strategy, gaussian.GaussianStrategy):
    return 1, 1.0
  if isinstance(strategy, tree.TreeStrategy):
    return None  # a row per node
  if isinstance(strategy, base.ToeplitzStrategy):
    coefs = strategy.toeplitz_coefs(length)
    nonzero = np.flatnonzero(coefs)
    # The first column holds every coefficient; a later column only the first n - j.
    return (int(nonzero[-1]) + 1 if nonzero.size else 1), float(np.linalg.norm(coefs))
  if isinstance(strategy, banded.BandedStrategy):
    # R[t, l] = C[t, t - l]: column j holds R[j + l, l]
    rows = strategy.band_rows[:strategy.check_num_rounds(length)]
    nonzero = np.flatnonzero(np.any(rows != 0, axis=0))
    squares = np.zeros(length)
    for lag in range(rows.shape[1]):
      squares[:length - lag] += rows[lag:, lag]**2
    return (int(nonzero[-1]) + 1 if nonzero.size else 1), float(math.sqrt(np.max(squares)))
  c = strategy.strategy_matrix(length)  # another strategy: its dense C
  if c.ndim != 2 or c.shape[0] != c.shape[1]:
    return None
  rows, cols = np.nonzero(c)
  lags = rows - cols
  if lags.size and lags.min() < 0:
    return None
  return (int(lags.max()) + 1 if lags.size else 1), float(np.max(np.linalg.norm(c, axis=0)))


def _segment_structures(strategy: base.Strategy, num_rounds: int,
                        restart_rounds: Optional[Sequence[int]]) -> list:
  return [_segment_structure(strategy, length)
          for length in base.segment_lengths(num_rounds, restart_rounds)]


def num_bands(strategy: base.Strategy, num_rounds: int,
              restart_rounds: Optional[Sequence[int]] = None) -> Optional[int]:
  """The bands of C over the run's restart segments (the most of any segment: the non-zero
  diagonals, the main one included), or None when some segment's C is not square and lower
  triangular (a tree's C has a row per node). The amplification theorem (BandMF Thm. 4) needs at
  most as many bands as sampling groups."""
  structures = _segment_structures(strategy, num_rounds, restart_rounds)
  if any(structure is None for structure in structures):
    return None
  return max(bands for bands, _ in structures)


def check_banded(strategy: base.Strategy, num_rounds: int, num_groups: int,
                 restart_rounds: Optional[Sequence[int]] = None) -> None:
  """Raises ValueError unless C (each restart segment's) is square, lower triangular and has at
  most `num_groups` bands, as the amplification theorem (BandMF Thm. 4) requires."""
  num_groups = _validation.check_positive_int(num_groups, 'num_groups')
  bands = num_bands(strategy, num_rounds, restart_rounds)
  if bands is None:
    raise ValueError(f'`strategy` ({strategy.name}) has no square lower-triangular strategy '
                     'matrix: amplification by cyclic sampling needs a square banded C.')
  if bands > num_groups:
    raise ValueError(f'`strategy` ({strategy.name}) has {bands} bands but `num_groups`='
                     f'{num_groups}: amplification by cyclic sampling (BandMF Thm. 4) needs a '
                     'strategy with at most as many bands as sampling groups.')


def largest_column_norm(strategy: base.Strategy, num_rounds: int,
                        restart_rounds: Optional[Sequence[int]] = None) -> float:
  """kappa = max_j ||C[:, j]||_2 over the run's restart segments (clip norm 1); ValueError when a
  segment's C is not square and lower triangular."""
  structures = _segment_structures(strategy, num_rounds, restart_rounds)
  if any(structure is None for structure in structures):
    raise ValueError(f'`strategy` ({strategy.name}) has no square lower-triangular strategy '
                     'matrix: amplification by cyclic sampling needs a square banded C.')
  return max(norm for _, norm in structures)


@dataclasses.dataclass(frozen=True)
class AmplifiedGuarantee:
  """(epsilon, delta) of a run with cyclic Poisson sampling (BandMF Thm. 4).

  Attributes:
    mechanism: the strategy's name.
    num_rounds: n.
    num_groups: b-hat, the sampling groups (round t samples group t mod b-hat).
    sampling_prob: q, the probability that a member of the round's group participates.
    compositions: ceil(n / b-hat).
    largest_column_norm: kappa = max_j ||C[:, j]||_2.
    noise_multiplier: sigma, relative to the clip norm.
    epsilon: at `delta`.
    delta: the target delta.
    accountant: 'pld' or 'rdp'.
  """
  mechanism: str
  num_rounds: int
  num_groups: int
  sampling_prob: float
  compositions: int
  largest_column_norm: float
  noise_multiplier: float
  epsilon: float
  delta: float
  accountant: str = 'pld'

  @property
  def effective_noise_multiplier(self) -> float:
    """sigma / kappa: the noise multiplier of each equivalent DP-SGD round."""
    return self.noise_multiplier / self.largest_column_norm


def amplified_guarantee(
    strategy: base.Strategy, num_rounds: int, noise_multiplier: float,
    num_groups: int, sampling_prob: float, delta: float,
    accountant: str = 'pld', *,
    restart_rounds: Optional[Sequence[int]] = None,
    value_discretization_interval: float = amplification.DEFAULT_VALUE_DISCRETIZATION
) -> AmplifiedGuarantee:
  """The amplified guarantee of `strategy` run for `num_rounds` rounds with cyclic Poisson sampling.

  Args:
    strategy: a `dp_ftrl_tff.mechanisms` Strategy whose C is lower triangular with at most
      `num_groups` bands (ValueError otherwise: BandMF Thm. 4 needs it). DP-SGD has 1 band.
    num_rounds: n >= 1.
    noise_multiplier: sigma > 0, relative to the clip norm (with adaptive clipping the accounted z).
    num_groups: b-hat >= 1 sampling groups (1: plain Poisson sampling of the whole population).
    sampling_prob: q in (0, 1].
    delta: in (0, 1).
    accountant: 'pld' or 'rdp'.
    restart_rounds: 0-based rounds at which the noise restarts (C is then block diagonal).
    value_discretization_interval: PLD only.
  """
  if not isinstance(strategy, base.Strategy):
    raise ValueError(f'`strategy` must be a mechanisms Strategy, got {strategy!r}.')
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  num_groups = _validation.check_positive_int(num_groups, 'num_groups')
  restarts = base.check_restart_rounds(restart_rounds, num_rounds)
  check_banded(strategy, num_rounds, num_groups, restarts)
  kappa = largest_column_norm(strategy, num_rounds, restarts)
  epsilon = amplification.amplified_epsilon(
      sigma / kappa, num_rounds, num_groups, sampling_prob, delta, accountant,
      value_discretization_interval=value_discretization_interval)
  return AmplifiedGuarantee(
      mechanism=strategy.name, num_rounds=num_rounds, num_groups=num_groups,
      sampling_prob=float(sampling_prob),
      compositions=amplification.num_compositions(num_rounds, num_groups),
      largest_column_norm=kappa, noise_multiplier=sigma, epsilon=epsilon, delta=float(delta),
      accountant=accountant)
