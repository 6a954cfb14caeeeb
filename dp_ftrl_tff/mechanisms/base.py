"""The interface every correlated-noise strategy implements, the loss figures they report, workloads.

Holds `Strategy` (the ABC), `Losses`, `OptimizationResult`, the workloads `prefix_sum_workload` and
`momentum_workload` (SGD with momentum and a learning-rate schedule, BandMF paper Sec. 5.8),
`errors_from_decoder` and `check_config` (the validation every `from_config` shares).

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
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import sensitivity as sensitivity_lib
from dp_ftrl_tff.mechanisms import toeplitz


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


def momentum_workload(num_rounds: int, momentum: float,
                      learning_rates: Optional[Sequence[float]] = None) -> np.ndarray:
  """A for SGD with momentum and a learning-rate schedule (BandMF paper Sec. 5.8), float64 n x n.

  The server keeps a momentum buffer m_t = momentum * m_{t-1} + x_t (m_{-1} = 0) and steps
  theta_{t+1} = theta_t - lr_t m_t, so theta_{t+1} = theta_0 - (A x)_t with
  A[t, s] = sum_{j=s}^{t} lr_j momentum^(j - s) for t >= s (0 above the diagonal), i.e.
  A = (prefix sums) diag(lr) (momentum^(t - s))_{t >= s}. Rounds are 0-based. The learning rates carry
  only the schedule's shape; the server learning rate supplies the magnitude. `momentum=0` with unit
  learning rates is `prefix_sum_workload`.

  Args:
    num_rounds: n.
    momentum: beta in [0, 1).
    learning_rates: lr_0 .. lr_{n-1}, each finite and > 0; None for all ones (constant rate).

  Returns:
    The lower-triangular workload A, shape (n, n).
  """
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  momentum = _validation.check_float_in_range(momentum, 'momentum', 0.0, 1.0, high_inclusive=False)
  if learning_rates is None:
    learning_rates = np.ones(num_rounds)
  else:
    try:
      learning_rates = np.asarray(learning_rates, dtype=np.float64)
    except (TypeError, ValueError) as e:
      raise ValueError(f'`learning_rates` must be a 1-D sequence of reals, got '
                       f'{learning_rates!r}.') from e
    if learning_rates.shape != (num_rounds,):
      raise ValueError(f'`learning_rates` must have shape ({num_rounds},), got '
                       f'{learning_rates.shape}.')
    if not np.all(np.isfinite(learning_rates)) or np.any(learning_rates <= 0):
      raise ValueError(f'`learning_rates` must be finite and positive, got {learning_rates}.')
  lags = np.subtract.outer(np.arange(num_rounds), np.arange(num_rounds))
  buffer_weights = np.where(lags >= 0, momentum**np.maximum(lags, 0), 0.0)  # beta^(t - s), t >= s
  return np.cumsum(learning_rates[:, None] * buffer_weights, axis=0)


def check_config(config, mechanisms: Sequence[str], required: Sequence[str] = (),
                 optional: Sequence[str] = ()) -> str:
  """Validates a strategy config for a `from_config`; returns its `mechanism` entry.

  Raises ValueError unless `config` is a dict whose `mechanism` is one of `mechanisms`, holding every
  key of `required` and no keys beyond `mechanism`, `required` and `optional`.
  """
  if not isinstance(config, dict):
    raise ValueError(f'`config` must be a dict, got {type(config).__name__}.')
  mechanism = config.get('mechanism')
  if mechanism not in mechanisms:
    expected = repr(mechanisms[0]) if len(mechanisms) == 1 else f'one of {sorted(mechanisms)}'
    raise ValueError(f'`mechanism` must be {expected}, got {mechanism!r}.')
  unknown = sorted(set(config) - {'mechanism', *required, *optional})
  if unknown:
    raise ValueError(f'Unknown keys for the {mechanism} mechanism: {unknown}.')
  for key in required:
    if key not in config:
      raise ValueError(f'`{key}` is missing from the {mechanism} config.')
  return mechanism


def check_restart_rounds(restart_rounds: Optional[Sequence[int]], num_rounds: int) -> tuple:
  """Validates 0-based restart rounds (a restart at r starts a fresh segment AT round r).

  Returns the sorted tuple of distinct rounds in (0, n); an empty tuple means no restart.
  """
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if restart_rounds is None:
    return ()
  rounds = []
  for r in restart_rounds:
    r = _validation.check_positive_int(r, 'restart_rounds')
    if r >= num_rounds:
      raise ValueError(f'`restart_rounds` must lie in (0, {num_rounds}), got {r}.')
    rounds.append(r)
  return tuple(sorted(set(rounds)))


def segment_lengths(num_rounds: int, restart_rounds: Sequence[int]) -> tuple:
  """Lengths of the segments [0, r_1), [r_1, r_2), ..., [r_last, n) for restarts r_1 < r_2 < ..."""
  return lengths_between(int(num_rounds), check_restart_rounds(restart_rounds, num_rounds))


def lengths_between(num_rounds: int, restarts: tuple) -> tuple:
  """`segment_lengths` for restarts already checked (sorted, distinct, in (0, n))."""
  bounds = (0,) + tuple(restarts) + (num_rounds,)
  return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))


class Segments(NamedTuple):
  """The noise segments of a run over some rounds: the 0-based rounds at which the noise restarts
  (sorted, distinct, inside the run) and the lengths of the segments between them."""
  restart_rounds: Tuple[int, ...]
  lengths: Tuple[int, ...]


def segments_between(num_rounds: int, restarts: Sequence[int]) -> Segments:
  """The `Segments` of restarts already checked (sorted, distinct, in (0, n))."""
  return Segments(tuple(restarts), lengths_between(num_rounds, tuple(restarts)))


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
  `blt.BLTStrategy`, `square_root.BandedSquareRootStrategy` and `BandedInverseSquareRootStrategy`. Each is an immutable description (parameters only); matrices are materialized on
  demand for a given number of rounds n.
  """

  #: Short name used by CLIs, files and reports: 'gaussian', 'tree', 'tree_efficient', 'tree_full',
  #: 'banded', 'blt', 'bsr', 'bisr'.
  name: str = ''

  @property
  def correlated(self) -> bool:
    """Whether the noise of different rounds is correlated, so that a restart starts a new segment
    of the mechanism (True unless C = I, where a restart changes nothing but the adaptive clip)."""
    return True

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

  def sensitivity_is_exact(self, num_rounds: int,
                           participation: participation_lib.ParticipationSchema) -> bool:
    """True when `sensitivity_squared` is exact rather than an upper bound (False unless known)."""
    del num_rounds, participation
    return False

  def segments_sensitivity_squared(self, segment_lengths: Sequence[int],
                                   participation: participation_lib.ParticipationSchema) -> float:
    """Squared sensitivity of a run whose noise restarts after each segment (C block diagonal).

    The segments are consecutive, with `segment_lengths` rounds each. Default: the sum of the
    per-segment worst cases, sum_s sens^2(C_{n_s}), an upper bound (the participation limits span
    the segments); strategies with an exact method override it.
    """
    lengths = [self.check_num_rounds(length) for length in segment_lengths]
    if not lengths:
      raise ValueError('`segment_lengths` must not be empty.')
    return float(sum(self.sensitivity_squared(length, participation) for length in lengths))

  def segments_sensitivity_is_exact(self, segment_lengths: Sequence[int],
                                    participation: participation_lib.ParticipationSchema) -> bool:
    """True when `segments_sensitivity_squared` is exact (by default: one segment, exact)."""
    return (len(segment_lengths) == 1
            and self.sensitivity_is_exact(segment_lengths[0], participation))

  def clients_sensitivity_squared(self, client_index, rounds, segment_lengths: Sequence[int]):
    """Per-client squared sensitivity of the participation observed in a log, or None when the
    strategy has no exact per-pattern method (trees have one).

    Args:
      client_index: int array, the client of each log row.
      rounds: int array, the 0-based round of each log row.
      segment_lengths: the noise segments, as in `segments_sensitivity_squared`.

    Returns:
      (client ids, squared sensitivities) arrays, or None.
    """
    del client_index, rounds, segment_lengths
    return None

  def errors(self, num_rounds: int) -> tuple:
    """(MaxError, RmsError) of the decoder B. Subclasses override with closed forms."""
    return errors_from_decoder(self.decoder_matrix(num_rounds))

  def losses(self, num_rounds: int,
             participation: participation_lib.ParticipationSchema) -> Losses:
    """MaxLoss, RmsLoss and squared sensitivity (clip norm 1, noise multiplier 1)."""
    num_rounds = self.check_num_rounds(num_rounds)
    participation_lib.check_participation(participation)
    sens_sq = self.sensitivity_squared(num_rounds, participation)
    max_error, rms_error = self.errors(num_rounds)
    sens = float(np.sqrt(sens_sq))
    return Losses(max_loss=max_error * sens, rms_loss=rms_error * sens,
                  sensitivity_squared=float(sens_sq))

  def describe(self) -> dict:
    """The strategy's defining parameters as JSON scalars / lists, for tables (none by default)."""
    return {}

  def check_noise_stable(self) -> None:
    """Raises ValueError when valid parameters still give noise C^-1 z that is not stable.

    Strategy files (`files.save_strategy`, `files.load_strategy`) call it, so a file never holds such
    parameters. The default accepts every strategy; `blt.BLTStrategy` requires an inverse BLT with
    real, distinct decays in (-1, 1].
    """
    return None  # No stability condition is checked for the other strategies' parameters.

  @classmethod
  @abc.abstractmethod
  def from_config(cls, config: dict) -> 'Strategy':
    """Inverse of `to_config`; ValueError naming the bad entry (`registry.strategy_from_config`
    dispatches here by the config's 'mechanism')."""

  @abc.abstractmethod
  def to_config(self) -> dict:
    """JSON-serializable parameters; `registry.strategy_from_config` inverts it."""


class ToeplitzStrategy(Strategy):
  """A strategy whose C is lower-triangular Toeplitz, LtToep(c), given by its coefficients.

  Subclasses (`blt.BLTStrategy`, the square-root strategies) supply the coefficients of C and of
  C^-1; the matrices, the sensitivity (`sensitivity.toeplitz_squared`, O(kn)) and the errors
  (BLT paper Prop. 3.3, from the coefficients of C^-1) follow from them here.
  """

  @abc.abstractmethod
  def toeplitz_coefs(self, num_rounds: int) -> np.ndarray:
    """c_0 .. c_{n-1}, the Toeplitz coefficients of C, float64."""

  @abc.abstractmethod
  def noise_coefs(self, num_rounds: int) -> np.ndarray:
    """c_hat_0 .. c_hat_{n-1}, the Toeplitz coefficients of C^-1, float64."""

  def strategy_matrix(self, num_rounds: int) -> np.ndarray:
    """C = LtToep(toeplitz_coefs), shape (n, n), float64."""
    return toeplitz.materialize(self.toeplitz_coefs(num_rounds), num_rounds)

  def noise_matrix(self, num_rounds: int) -> np.ndarray:
    """C^-1 = LtToep(noise_coefs), shape (n, n), float64."""
    return toeplitz.materialize(self.noise_coefs(num_rounds), num_rounds)

  def sensitivity_squared(self, num_rounds: int,
                          participation: participation_lib.ParticipationSchema) -> float:
    """Squared sensitivity (clip norm 1): `sensitivity.toeplitz_squared` of C's coefficients, O(kn);
    exact for non-negative non-increasing coefficients, else an upper bound (`sensitivity_is_exact`).
    """
    num_rounds = self.check_num_rounds(num_rounds)
    return sensitivity_lib.toeplitz_squared(self.toeplitz_coefs(num_rounds), num_rounds,
                                            participation)

  def sensitivity_is_exact(self, num_rounds: int,
                           participation: participation_lib.ParticipationSchema) -> bool:
    """True when `sensitivity_squared` is exact rather than an upper bound."""
    num_rounds = self.check_num_rounds(num_rounds)
    return sensitivity_lib.toeplitz_is_exact(self.toeplitz_coefs(num_rounds), num_rounds,
                                             participation)

  def errors(self, num_rounds: int) -> tuple:
    """(MaxError, RmsError) of B = A C^-1 from the coefficients of C^-1 (BLT paper Prop. 3.3)."""
    return toeplitz.errors_from_noise_coefs(self.noise_coefs(num_rounds))


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
