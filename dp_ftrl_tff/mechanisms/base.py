"""The interface every correlated-noise strategy implements, and the loss figures they report.

Notation (matrix-factorization view, BLT paper Eq. 1; BandMF paper Sec. 2):
  * `workload` A: the n x n lower-triangular all-ones prefix-sum matrix (A_{ij} = 1 for i >= j).
  * `strategy_matrix` C (shape r x n): what is privatized; r = n for matrix factorizations, r = number
    of tree nodes for trees.
  * `noise_matrix` M (shape n x r): the per-round noise in gradient space is sigma * zeta * (M z)_t for
    iid standard normal z in R^r. For a square factorization M = C^-1; for a tree M = A^-1 B, the residual
    of the noisy prefix sums decoded by B.
  * `decoder_matrix` B = A M (shape n x r): the noise on the prefix sums is B z.
  * Sensitivity is computed with clip norm zeta = 1: sens^2 = max over admissible participation patterns
    of ||C u(pi)||^2 (for C^T C >= 0; upper bounds otherwise, as each strategy documents).
  * MaxLoss = sens * sqrt(max_i ||B_i||^2) and RmsLoss = sens * sqrt(mean_i ||B_i||^2) (BLT paper Eq. 9,
    10). Losses do not depend on the noise multiplier.

All computations are float64 numpy; nothing here imports TensorFlow.
"""

import abc
import dataclasses
from typing import Optional

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import participation as participation_lib


@dataclasses.dataclass(frozen=True)
class Losses:
  """Loss figures of a strategy under a participation schema (clip norm 1, noise multiplier 1)."""
  max_loss: float
  rms_loss: float
  sensitivity_squared: float

  @property
  def max_error(self) -> float:
    return self.max_loss / np.sqrt(self.sensitivity_squared)

  @property
  def rms_error(self) -> float:
    return self.rms_loss / np.sqrt(self.sensitivity_squared)


def prefix_sum_workload(num_rounds: int) -> np.ndarray:
  """A: the n x n lower-triangular all-ones matrix, float64."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  return np.tril(np.ones((num_rounds, num_rounds)))


def errors_from_decoder(decoder_matrix: np.ndarray) -> tuple:
  """(MaxError, RmsError) of a decoder B: sqrt(max_i ||B_i||^2) and sqrt(mean_i ||B_i||^2)."""
  decoder_matrix = np.asarray(decoder_matrix, dtype=np.float64)
  if decoder_matrix.ndim != 2 or decoder_matrix.shape[0] == 0:
    raise ValueError(f'`decoder_matrix` must be a non-empty 2-D array, got shape '
                     f'{decoder_matrix.shape}.')
  row_norms_sq = np.sum(decoder_matrix**2, axis=1)
  return float(np.sqrt(np.max(row_norms_sq))), float(np.sqrt(np.mean(row_norms_sq)))


class Strategy(abc.ABC):
  """A correlated-noise mechanism for the prefix-sum workload.

  Subclasses: `gaussian.GaussianStrategy`, `tree.TreeStrategy`, `banded.BandedStrategy`,
  `blt.BLTStrategy`. Each is an immutable description (parameters only); matrices are materialized on
  demand for a given number of rounds n.
  """

  #: Short name used by CLIs, files and reports: 'gaussian', 'tree', 'tree_efficient', 'tree_full',
  #: 'banded', 'blt'.
  name: str = ''

  @property
  def max_rounds(self) -> Optional[int]:
    """The largest n this strategy is defined for, or None when it streams for any n."""
    return None

  def check_num_rounds(self, num_rounds: int) -> int:
    """Validates `num_rounds` against `max_rounds`; returns it as int."""
    num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
    if self.max_rounds is not None and num_rounds > self.max_rounds:
      raise ValueError(f'`num_rounds`={num_rounds} exceeds the {self.max_rounds} rounds this '
                       f'{self.name} strategy was built for.')
    return num_rounds

  @abc.abstractmethod
  def strategy_matrix(self, num_rounds: int) -> np.ndarray:
    """C, shape (r, n), float64."""

  @abc.abstractmethod
  def noise_matrix(self, num_rounds: int) -> np.ndarray:
    """M, shape (n, r), float64: per-round noise is sigma * zeta * M z for z ~ N(0, I_r)."""

  def decoder_matrix(self, num_rounds: int) -> np.ndarray:
    """B = A M, shape (n, r): noise on the prefix sums."""
    return np.cumsum(self.noise_matrix(num_rounds), axis=0)

  @abc.abstractmethod
  def sensitivity_squared(self, num_rounds: int,
                          participation: participation_lib.ParticipationSchema) -> float:
    """Squared L2 sensitivity of C (clip norm 1) under `participation` over n = `num_rounds`."""

  def errors(self, num_rounds: int) -> tuple:
    """(MaxError, RmsError) of the decoder B. Subclasses override with closed forms."""
    return errors_from_decoder(self.decoder_matrix(num_rounds))

  def losses(self, num_rounds: int,
             participation: participation_lib.ParticipationSchema) -> Losses:
    """MaxLoss, RmsLoss and squared sensitivity (clip norm 1, noise multiplier 1)."""
    num_rounds = self.check_num_rounds(num_rounds)
    if not isinstance(participation, participation_lib.ParticipationSchema):
      raise ValueError(f'`participation` must be a ParticipationSchema, got {participation!r}.')
    sens_sq = self.sensitivity_squared(num_rounds, participation)
    max_error, rms_error = self.errors(num_rounds)
    sens = float(np.sqrt(sens_sq))
    return Losses(max_loss=max_error * sens, rms_loss=rms_error * sens,
                  sensitivity_squared=float(sens_sq))

  @abc.abstractmethod
  def to_config(self) -> dict:
    """JSON-serializable parameters; `files.strategy_from_config` inverts it."""


@dataclasses.dataclass(frozen=True)
class OptimizationResult:
  """What a strategy optimizer returns.

  Attributes:
    strategy: the optimized `Strategy`.
    losses: its `Losses` at the setting it was optimized for (barrier/penalty excluded).
    num_rounds: n it was optimized for.
    participation: the `ParticipationSchema` it was optimized for.
    seconds: wall time of the optimization.
    details: optimizer diagnostics (iterations, restarts, objective), JSON-serializable.
  """
  strategy: Strategy
  losses: Losses
  num_rounds: int
  participation: participation_lib.ParticipationSchema
  seconds: float
  details: dict = dataclasses.field(default_factory=dict)
