"""The Gaussian (DP-SGD) strategy: independent noise each round, C = I.

With C = I (n x n) every column has norm 1 and distinct columns are orthogonal, so the squared
sensitivity is the number of participations k = min(k, ceil(n / b)) under b-min-sep and fixed-epoch
schemas (BandMF paper Thm. 2 with kappa = 1). The decoder is B = A, whose row i has i + 1 ones
(0-based), so MaxError = sqrt(n) and RmsError = sqrt(mean_i (i + 1)) = sqrt((n + 1) / 2)
(BandMF paper Table 2: DP-SGD prefix-sum RMSE sqrt(k (n + 1) / 2)).
"""

from typing import Sequence

import numpy as np

from dp_ftrl_tff.mechanisms import base
from dp_ftrl_tff.mechanisms import participation as participation_lib


class GaussianStrategy(base.Strategy):
  """DP-SGD noise: round t gets sigma * zeta * z_t with z_t iid standard normal (0-based rounds)."""

  name = 'gaussian'

  def strategy_matrix(self, num_rounds: int) -> np.ndarray:
    return np.eye(self.check_num_rounds(num_rounds))

  def noise_matrix(self, num_rounds: int) -> np.ndarray:
    return np.eye(self.check_num_rounds(num_rounds))

  def sensitivity_squared(self, num_rounds: int,
                          participation: participation_lib.ParticipationSchema) -> float:
    """k_eff = min(k, ceil(n / b)): orthogonal unit columns, one per participation."""
    num_rounds = self.check_num_rounds(num_rounds)
    participation_lib.check_participation(participation)
    return float(participation.effective_max_participations(num_rounds))

  @property
  def correlated(self) -> bool:
    return False

  def sensitivity_is_exact(self, num_rounds: int,
                           participation: participation_lib.ParticipationSchema) -> bool:
    return True

  def segments_sensitivity_squared(self, segment_lengths: Sequence[int],
                                   participation: participation_lib.ParticipationSchema) -> float:
    """Restarts do not change C = I: the whole run's k_eff."""
    if not segment_lengths:
      raise ValueError('`segment_lengths` must not be empty.')
    return self.sensitivity_squared(int(sum(segment_lengths)), participation)

  def segments_sensitivity_is_exact(self, segment_lengths: Sequence[int],
                                    participation: participation_lib.ParticipationSchema) -> bool:
    return True

  def errors(self, num_rounds: int) -> tuple:
    """(sqrt(n), sqrt((n + 1) / 2)), closed form of the decoder B = A."""
    num_rounds = self.check_num_rounds(num_rounds)
    return float(np.sqrt(num_rounds)), float(np.sqrt((num_rounds + 1) / 2))

  def to_config(self) -> dict:
    return {'mechanism': self.name}

  @classmethod
  def from_config(cls, config: dict) -> 'GaussianStrategy':
    """Inverse of `to_config`; raises ValueError on a wrong `mechanism` or unknown keys."""
    base.check_config(config, (cls.name,))
    return cls()

  def __eq__(self, other) -> bool:
    return isinstance(other, GaussianStrategy)

  def __hash__(self) -> int:
    return hash(self.name)

  def __repr__(self) -> str:
    return 'GaussianStrategy()'
