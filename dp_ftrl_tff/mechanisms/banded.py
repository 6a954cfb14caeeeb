"""Banded matrix factorization (BandMF): the banded strategy, its optimizer and the streaming C^-1.

BandMF paper (Choquette-Choo et al. 2023, arXiv:2306.08153):
  * Sec. 2 / App. A: a lower-triangular C is `num_bands`-banded (b-hat bands) when C[i, j] = 0 for
    i - j >= b-hat; b-hat counts the non-zero diagonals, the main one included (b-hat = 1 is DP-SGD).
  * Sec. 3, Thm. 2, Alg. 5: with b-hat <= min_sep the columns a client touches are orthogonal, so the
    squared sensitivity is VecSens(diag(C^T C)) exactly; with equal column norms 1 it is k_eff. With
    b-hat > min_sep (realized separation below the bands) Alg. 4 gives an upper bound.
  * Sec. 4, Problem 2: minimize the prefix-sum error ||A C^-1||_F^2 over banded C with equal column
    norms (diag(C^T C) = 1). Sec. 5.8: other workloads, e.g. SGD with momentum and a learning-rate
    schedule (`base.momentum_workload`), through `optimize_banded(..., workload=A)`.
  * Sec. 6, Alg. 9: the noise C^-1 z streams by forward substitution with a buffer of the last
    b-hat - 1 outputs (`stream_inverse`, the numpy reference of `dp_ftrl_tff.noise.banded`).
  * Banded Toeplitz C (one coefficient per band, McKenna 2024, "BandToep") via `toeplitz=True`.

Storage: a banded C is held as its band rows R of shape (n, b-hat), R[t, j] = C[t, t - j] (0 when
t - j < 0). Rounds are 0-based, t = 0 .. n-1. All math is float64 numpy/scipy.

Optimizer cost: B = A C^-1 = (C A^-1)^-1 and A^-1 is banded (prefix sums: I - shift), so the row
errors ||B_i||^2 are the diagonal of (D^T D)^-1 for the banded D = C A^-1. `_RowErrors` gets them by a
block recursion on a q x q window of B B^T (q = bands of D - 1) in O(n q^2) flops, with a
hand-derived reverse mode for the gradient that re-reads the stored windows (O(n q^2 / 64) memory); no
n x n matrix is formed (the previous O(b-hat n^2) evaluation formed C^-1 and B). `BandedStrategy.errors` uses the same recursion; `noise_matrix` still
materializes C^-1 by blocked forward substitution.
"""

import time
from typing import Optional

import numpy as np
import scipy.linalg
import scipy.optimize

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import base, sensitivity
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import toeplitz as toeplitz_lib

_ERRORS = ('rms', 'max')
# Rows per block of the blocked triangular solves: small enough that TRSM work (block * n^2 / 2) stays
# below the GEMM coupling work (~2 b-hat n^2), large enough for BLAS-3 efficiency (measured at n=2052).
_BLOCK = 128
# Rows per block of the row-error recursion (`_RowErrors`): the O(n q^2) window products do not depend
# on it; larger blocks add O(n s q + n s^2) flops, smaller ones per-block call overhead.
_ROW_BLOCK = 64
# Smooth maximum for error='max' with a general banded C: the p-mean of the row errors ||B_i||^2.
_MAX_ERROR_POWER = 64.0


def _check_band_rows(band_rows) -> np.ndarray:
  """Validates band rows R (n, b-hat): finite, R[t, 0] > 0, R[t, j] = 0 for t - j < 0."""
  band_rows = _validation.check_float_array(band_rows, 'band_rows', ndim=2)
  if band_rows.shape[1] > band_rows.shape[0]:
    raise ValueError(f'`band_rows` has {band_rows.shape[1]} bands for {band_rows.shape[0]} rounds.')
  if np.any(band_rows[:, 0] <= 0):
    raise ValueError('`band_rows` must have a positive diagonal (column 0).')
  rows, bands = np.indices(band_rows.shape)
  if np.any(band_rows[rows < bands] != 0):
    raise ValueError('`band_rows` must be zero where t - j < 0 (entries above row t).')
  return band_rows


def band_rows_from_matrix(strategy_matrix) -> np.ndarray:
  """R (n, b-hat) with R[t, j] = C[t, t - j] of a lower-triangular banded C; b-hat = the bands used.

  Raises ValueError unless `strategy_matrix` is square, finite, lower triangular with a positive
  diagonal.
  """
  c = np.asarray(strategy_matrix, dtype=np.float64)
  if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] == 0:
    raise ValueError(f'`strategy_matrix` must be a non-empty square matrix, got shape {c.shape}.')
  if not np.all(np.isfinite(c)):
    raise ValueError('`strategy_matrix` must be finite.')
  if np.any(np.triu(c, 1) != 0):
    raise ValueError('`strategy_matrix` must be lower triangular.')
  if np.any(np.diag(c) <= 0):
    raise ValueError('`strategy_matrix` must have a positive diagonal.')
  n = c.shape[0]
  rows, cols = np.nonzero(c)
  num_bands = int(np.max(rows - cols)) + 1
  t, j = np.indices((n, num_bands))
  valid = t >= j
  band_rows = np.zeros((n, num_bands))
  band_rows[valid] = c[t[valid], (t - j)[valid]]
  return band_rows


def matrix_from_band_rows(band_rows) -> np.ndarray:
  """The dense n x n lower-triangular C with C[t, t - j] = R[t, j]."""
  band_rows = _check_band_rows(band_rows)
  return _dense(band_rows)


def _dense(band_rows: np.ndarray) -> np.ndarray:
  n, num_bands = band_rows.shape
  c = np.zeros((n, n))
  for j in range(num_bands):
    idx = np.arange(j, n)
    c[idx, idx - j] = band_rows[j:, j]
  return c


def _inverse(c: np.ndarray, num_bands: int) -> np.ndarray:
  """C^-1 of a dense-stored lower-triangular banded C, by blocked forward substitution, O(b-hat n^2)."""
  n = c.shape[0]
  s = _BLOCK
  m = np.zeros((n, n))
  for i0 in range(0, n, s):
    i1 = min(n, i0 + s)
    lo = max(0, i0 - num_bands + 1)
    rhs = np.zeros((i1 - i0, i1))
    rhs[:, i0:i1] = np.eye(i1 - i0)
    if lo < i0:  # rows lo..i0-1 of C^-1 vanish beyond column i0 - 1
      rhs[:, :i0] -= c[i0:i1, lo:i0] @ m[lo:i0, :i0]
    m[i0:i1, :i1] = scipy.linalg.solve_triangular(c[i0:i1, i0:i1], rhs, lower=True,
                                                  check_finite=False)
  return m


def _block_layout(num_rounds: int, num_bands: int) -> list:
  """Row blocks of `_RowErrors` for an n x n lower-triangular matrix with `num_bands` bands.

  Each entry is (start, end, left, valid, rows, lags): the block holds rows start..end-1 and columns
  start-left..end-1 (left = min(q, start), q = num_bands - 1); `valid` marks its band entries, whose
  band-row indices are (rows, lags).
  """
  q = num_bands - 1
  layout = []
  for start in range(0, num_rounds, _ROW_BLOCK):
    end = min(num_rounds, start + _ROW_BLOCK)
    left = min(q, start)
    lags = np.arange(start, end)[:, None] - np.arange(start - left, end)[None, :]
    valid = (lags >= 0) & (lags <= q)
    rows = np.broadcast_to(np.arange(start, end)[:, None], lags.shape)[valid]
    layout.append((start, end, left, valid, rows, lags[valid]))
  return layout


class _RowErrors:
  """Squared row norms of B = D^-1 for a banded lower-triangular D, and their gradient, O(n q^2).

  D (n x n, q + 1 bands, band rows as for C) is C A^-1 for a workload A whose inverse is banded (the
  prefix sums: A^-1 = I - shift, two bands), so B = A C^-1 = D^-1 and ||B_i||^2 = Z_ii with
  Z = B B^T. Rows are processed in blocks I of `_ROW_BLOCK` rows; the q rows K before a block hold every
  entry of D left of its diagonal block, so B_I = T (I_I - E B_K) with T = D_II^-1, E = D_IK, and
  B_K lives on columns left of the block (orthogonal to the unit rows I_I). With the window
  W = Z_KK (q x q) carried from block to block:
      Z_IK = -T E W,   Z_II = T (I + E W E^T) T^T,
  and the next window is assembled from W, Z_IK and Z_II. Per block O(s q^2 + s^2 q + s^3) flops,
  O(n q^2) in all, never an n x n matrix. `gradient` is the hand-derived reverse mode of the same
  recursion (same cost).
  """

  def __init__(self, d_rows: np.ndarray, layout: list):
    """`d_rows`: band rows (n, q + 1) of D; `layout`: `_block_layout(n, q + 1)`."""
    n, bands = d_rows.shape
    self._d_rows = d_rows
    q = bands - 1
    self._blocks = []
    self.row_errors = np.empty(n)
    window = np.zeros((0, 0))
    for start, end, left, valid, rows, lags in layout:
      size = end - start
      block = np.zeros(valid.shape)
      block[valid] = d_rows[rows, lags]
      coupling, diagonal = block[:, :left], block[:, left:]
      inv = scipy.linalg.solve_triangular(diagonal, np.eye(size), lower=True, check_finite=False)
      carried = coupling @ window  # P = E W
      cross = -inv @ carried  # Z_IK
      middle = carried @ coupling.T  # M = I + P E^T
      middle[np.diag_indices_from(middle)] += 1.0
      inv_middle = inv @ middle
      own = inv_middle @ inv.T  # Z_II
      self.row_errors[start:end] = np.diag(own)
      self._blocks.append((start, end, left, window, inv, carried, middle, inv_middle, coupling,
                           valid, rows, lags))
      # Next window: rows and columns max(0, end - q) .. end - 1 of Z.
      keep = min(q, end) - size  # rows of the old window that stay
      if keep <= 0:
        window = own[size - min(q, end):, size - min(q, end):]
        continue
      old = window.shape[0]
      new = np.empty((keep + size, keep + size))
      new[:keep, :keep] = window[old - keep:, old - keep:]
      new[keep:, :keep] = cross[:, left - keep:]
      new[:keep, keep:] = cross[:, left - keep:].T
      new[keep:, keep:] = own
      window = new

  def gradient(self, weights: np.ndarray) -> np.ndarray:
    """d(sum_i weights_i ||B_i||^2) / d band rows of D (same shape as the band rows)."""
    grad_rows = np.zeros_like(self._d_rows)
    grad_window = None  # adjoint of the window the next block read
    for (start, end, left, window, inv, carried, middle, inv_middle, coupling, valid, rows,
         lags) in reversed(self._blocks):
      size = end - start
      grad_own = np.diag(weights[start:end])
      grad_cross = np.zeros((size, left))
      keep = 0
      if grad_window is not None:
        keep = grad_window.shape[0] - size
        if keep <= 0:
          grad_own[size - grad_window.shape[0]:, size - grad_window.shape[0]:] += grad_window
        else:
          grad_cross[:, left - keep:] = grad_window[keep:, :keep] + grad_window[:keep, keep:].T
          grad_own += grad_window[keep:, keep:]
      # own = U T^T with U = T M; cross = -T P; M = I + P E^T; P = E W; T = L^-1.
      grad_u = grad_own @ inv
      grad_inv = grad_own.T @ inv_middle + grad_u @ middle.T - grad_cross @ carried.T
      grad_middle = inv.T @ grad_u
      grad_carried = grad_middle @ coupling - inv.T @ grad_cross
      grad_coupling = grad_middle.T @ carried + grad_carried @ window.T
      grad_previous = grad_window
      grad_window = coupling.T @ grad_carried
      if keep > 0:  # the rows of this block's window that the next window kept
        grad_window[window.shape[0] - keep:, window.shape[0] - keep:] += grad_previous[:keep, :keep]
      grad_block = np.empty((size, left + size))
      grad_block[:, :left] = grad_coupling
      grad_block[:, left:] = -inv.T @ grad_inv @ inv.T
      grad_rows[rows, lags] = grad_block[valid]
    return grad_rows


def _prefix_sum_row_errors(band_rows: np.ndarray) -> np.ndarray:
  """||B_i||^2 for B = A C^-1, A the prefix sums: B = D^-1 with D = C (I - shift), D[t, t - l] =
  C[t, t - l] - C[t, t - l + 1] (b-hat + 1 bands)."""
  n, num_bands = band_rows.shape
  d_rows = np.zeros((n, num_bands + 1))
  d_rows[:, :num_bands] = band_rows
  d_rows[:, 1:] -= band_rows
  d_rows[np.arange(num_bands + 1)[None, :] > np.arange(n)[:, None]] = 0.0  # columns t - l < 0
  return _RowErrors(d_rows, _block_layout(n, num_bands + 1)).row_errors


def stream_inverse(band_rows, values) -> np.ndarray:
  """y = C^-1 v by streaming forward substitution (BandMF Alg. 9): the numpy reference.

  Row t of the output is (v_t - sum_{j=1}^{b-hat - 1} C[t, t - j] y_{t - j}) / C[t, t]; only a ring
  buffer of the last b-hat - 1 outputs is kept.

  Args:
    band_rows: (n, b-hat) band rows of C, R[t, j] = C[t, t - j].
    values: (n, ...) array; row t is v_t.

  Returns:
    (n, ...) float64 array y with C y = v.
  """
  band_rows = _check_band_rows(band_rows)
  values = np.asarray(values, dtype=np.float64)
  n, num_bands = band_rows.shape
  if values.ndim == 0 or values.shape[0] != n:
    raise ValueError(f'`values` must have {n} rows, got shape {values.shape}.')
  depth = num_bands - 1
  buffer = np.zeros((depth,) + values.shape[1:])
  out = np.empty_like(values)
  for t in range(n):
    acc = values[t].copy()
    for j in range(1, min(t, depth) + 1):
      acc -= band_rows[t, j] * buffer[(t - j) % depth]
    out[t] = acc / band_rows[t, 0]
    if depth:
      buffer[t % depth] = out[t]
  return out


class BandedStrategy(base.Strategy):
  """A lower-triangular banded strategy matrix C for n = `max_rounds` rounds (BandMF).

  The per-round noise is sigma * zeta * (C^-1 z)_t (0-based rounds). `num_bands` is the number of
  non-zero diagonals. For fewer rounds the leading principal block of C is used.
  """

  name = 'banded'

  def __init__(self, strategy_matrix):
    """Args: strategy_matrix: n x n lower-triangular banded C with a positive diagonal."""
    self._band_rows = band_rows_from_matrix(strategy_matrix)
    self._band_rows.setflags(write=False)

  @classmethod
  def from_band_rows(cls, band_rows) -> 'BandedStrategy':
    """From band rows R (n, b-hat), R[t, j] = C[t, t - j] (zero for t - j < 0)."""
    return cls(matrix_from_band_rows(band_rows))

  @classmethod
  def from_toeplitz(cls, coefs, num_rounds: int) -> 'BandedStrategy':
    """The banded Toeplitz C[t, t - j] = coefs[j] (j < len(coefs)) for `num_rounds` rounds."""
    num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
    coefs = np.asarray(coefs, dtype=np.float64)
    if coefs.ndim != 1 or coefs.size == 0 or coefs.size > num_rounds:
      raise ValueError(f'`coefs` must be a 1-D array of 1 .. num_rounds={num_rounds} entries, got '
                       f'shape {coefs.shape}.')
    rows = np.tile(coefs, (num_rounds, 1))
    rows[np.indices(rows.shape)[0] < np.indices(rows.shape)[1]] = 0.0
    return cls.from_band_rows(rows)

  @property
  def num_bands(self) -> int:
    return self._band_rows.shape[1]

  @property
  def max_rounds(self) -> int:
    return self._band_rows.shape[0]

  @property
  def band_rows(self) -> np.ndarray:
    """(max_rounds, num_bands) read-only array, R[t, j] = C[t, t - j]."""
    return self._band_rows

  def strategy_matrix(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return _dense(self._band_rows[:num_rounds])

  def noise_matrix(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return _inverse(self.strategy_matrix(num_rounds), self.num_bands)

  def errors(self, num_rounds: int) -> tuple:
    """(MaxError, RmsError) of B = A C^-1 from the band alone, O(n b-hat^2) (`_RowErrors`)."""
    num_rounds = self.check_num_rounds(num_rounds)
    row_errors = _prefix_sum_row_errors(self._band_rows[:num_rounds])
    return float(np.sqrt(np.max(row_errors))), float(np.sqrt(np.mean(row_errors)))

  def sensitivity_squared(self, num_rounds: int,
                          participation: participation_lib.ParticipationSchema) -> float:
    """Squared sensitivity (clip norm 1) of the leading n x n block of C.

    Single participation: the largest squared column norm. With `num_bands` <= `min_sep` the exact
    BandMF Alg. 5 value VecSens(diag(C^T C)) (fixed-epoch: the best epoch pattern); with more bands than
    `min_sep` the Alg. 4 upper bound (fixed-epoch: the per-epoch Eq. 5 value). All through
    `sensitivity.dense_squared`.
    """
    num_rounds = self.check_num_rounds(num_rounds)
    participation_lib.check_participation(participation)
    return float(sensitivity.dense_squared(self.strategy_matrix(num_rounds), participation))

  def sensitivity_is_exact(self, num_rounds: int,
                           participation: participation_lib.ParticipationSchema) -> bool:
    """Exact with single participation or `num_bands` <= `min_sep` (BandMF Alg. 5)."""
    num_rounds = self.check_num_rounds(num_rounds)
    return bool(participation.is_single_participation(num_rounds)
                or self.num_bands <= participation.min_sep)

  def describe(self) -> dict:
    return {'num_bands': self.num_bands}

  def to_config(self) -> dict:
    """{'mechanism': 'banded', 'band_rows': float64 ndarray (n, num_bands)}; `files` writes .npz."""
    return {'mechanism': self.name, 'band_rows': np.array(self._band_rows)}

  @classmethod
  def from_config(cls, config: dict) -> 'BandedStrategy':
    """Inverse of `to_config`; raises ValueError on a wrong `mechanism`, unknown or missing keys."""
    base.check_config(config, (cls.name,), required=('band_rows',))
    return cls.from_band_rows(config['band_rows'])

  def __repr__(self) -> str:
    return f'BandedStrategy(max_rounds={self.max_rounds}, num_bands={self.num_bands})'


# ---------------------------------------------------------------------------------------------------
# Optimization.


def fhu_coefficients(num_bands: int) -> np.ndarray:
  """1, 1/2, 3/8, 5/16, ...: the first `num_bands` coefficients of sqrt(A) (Fichtenberger et al.)."""
  num_bands = _validation.check_positive_int(num_bands, 'num_bands')
  j = np.arange(1, num_bands)
  return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])


def _row_weights(row_errors: np.ndarray, error: str) -> tuple:
  """(objective, d objective / d row_errors) for squared row errors ||B_i||^2."""
  n = row_errors.size
  if error == 'rms':
    return float(np.mean(row_errors)), np.full(n, 1.0 / n)
  peak = np.max(row_errors)
  ratios = row_errors / peak
  mean_power = np.mean(ratios**_MAX_ERROR_POWER)
  value = peak * mean_power**(1.0 / _MAX_ERROR_POWER)
  weights = ratios**(_MAX_ERROR_POWER - 1) * mean_power**(1.0 / _MAX_ERROR_POWER - 1) / n
  return float(value), weights


class _Workload:
  """The workload A: prefix sums (None) or a given lower-triangular matrix; applies A, inverts it."""

  def __init__(self, num_rounds: int, workload: Optional[np.ndarray]):
    if workload is None:
      self._matrix = None
      return
    workload = np.asarray(workload, dtype=np.float64)
    if workload.shape != (num_rounds, num_rounds) or not np.all(np.isfinite(workload)):
      raise ValueError(f'`workload` must be a finite {num_rounds} x {num_rounds} matrix, got shape '
                       f'{workload.shape}.')
    if np.any(np.triu(workload, 1) != 0):
      raise ValueError('`workload` must be lower triangular.')
    if np.any(np.diag(workload) == 0):
      raise ValueError('`workload` must be invertible (a non-zero diagonal).')
    self._matrix = workload

  def apply(self, x: np.ndarray) -> np.ndarray:
    return np.cumsum(x, axis=0) if self._matrix is None else self._matrix @ x

  def inverse_band_rows(self, num_rounds: int) -> np.ndarray:
    """Band rows (n, w) of A^-1, [u, r] = A^-1[u, u - r]: w = 2 for prefix sums (1, -1).

    A given matrix is inverted densely once (O(n^3)); entries below 1e-13 of its largest magnitude
    are taken as rounding of exact zeros when the band count w is chosen (SGD with momentum: w = 3).
    Dropping them only perturbs the optimizer's objective; reported losses are recomputed from C.
    """
    if self._matrix is None:
      rows = np.zeros((num_rounds, 2))
      rows[:, 0] = 1.0
      rows[1:, 1] = -1.0
      return rows
    inverse = scipy.linalg.solve_triangular(self._matrix, np.eye(num_rounds), lower=True,
                                            check_finite=False)
    if not np.all(np.isfinite(inverse)):
      raise ValueError('`workload` must be invertible (its inverse overflowed).')
    significant = np.abs(inverse) > 1e-13 * np.max(np.abs(inverse))
    rows, cols = np.nonzero(significant)
    width = int(np.max(rows - cols)) + 1
    lags = np.arange(width)
    index = np.arange(num_rounds)[:, None] - lags[None, :]
    valid = index >= 0
    band = np.zeros((num_rounds, width))
    band[valid] = inverse[np.nonzero(valid)[0], index[valid]]
    return band

  def toeplitz_coefs(self, num_rounds: int) -> Optional[np.ndarray]:
    """Coefficients of A if it is lower-triangular Toeplitz, else None."""
    if self._matrix is None:
      return np.ones(num_rounds)
    coefs = self._matrix[:, 0]
    if not np.allclose(toeplitz_lib.materialize(coefs, num_rounds), self._matrix, rtol=0, atol=1e-12):
      return None
    return coefs


def _toeplitz_objective(coefs: np.ndarray, num_rounds: int, workload_coefs: np.ndarray,
                        error: str) -> tuple:
  """(log(||c||^2 * Error^2), gradient) of a banded Toeplitz C with coefficients c.

  For a Toeplitz workload with coefficients a, B = A C^-1 is Toeplitz with coefficients
  beta = a * r (r = inverse coefficients of c); ||B_i||^2 = sum_{t <= i} beta_t^2. The gradient uses
  d r = -r * dc * r (series products truncated to n).
  """
  n = num_rounds
  r = toeplitz_lib.inverse_coefs(coefs, n)
  beta = np.convolve(workload_coefs, r)[:n]
  if error == 'rms':
    weights = (n - np.arange(n)) / n
  else:
    weights = np.ones(n)
  err2 = float(np.sum(weights * beta**2))
  norm2 = float(coefs @ coefs)
  grad_beta = 2.0 * weights * beta
  grad_r = np.convolve(grad_beta[::-1], workload_coefs)[:n][::-1]  # adjoint of beta = a * r
  r2 = np.convolve(r, r)[:n]
  grad_c = -np.convolve(grad_r[::-1], r2)[n - 1 - np.arange(coefs.size)]
  value = np.log(norm2) + np.log(err2)
  grad = 2.0 * coefs / norm2 + grad_c / err2
  return value, grad


def _column_indices(num_rounds: int, num_bands: int) -> tuple:
  """Row and column indices of the band of an n x n lower-triangular C, column by column."""
  j, r = np.indices((num_rounds, num_bands))
  valid = j + r < num_rounds
  return (j + r)[valid], j[valid]


class _BandedObjective:
  """Error of a column-normalized banded C = P diag(1 / ||P[:, j]||) over the free band entries of P.

  With unit column norms and b-hat <= min_sep, sens^2 = k_eff for every P, so minimizing the error
  minimizes the loss (BandMF Problem 2). The row errors ||B_i||^2 of B = A C^-1 = (C A^-1)^-1 come
  from `_RowErrors` on D = C A^-1 (b-hat + w - 1 bands for a w-banded A^-1): O(n (b-hat + w)^2) per
  evaluation, never an n x n matrix.
  """

  def __init__(self, num_rounds: int, num_bands: int, workload: _Workload, error: str):
    self.n = num_rounds
    self.num_bands = num_bands
    self.error = error
    self.rows, self.cols = _column_indices(num_rounds, num_bands)
    self._inverse_rows = workload.inverse_band_rows(num_rounds)
    source = np.arange(num_rounds)[:, None] - np.arange(num_bands)[None, :]
    self._inside = source >= 0
    self._source = np.maximum(source, 0)
    self._layout = _block_layout(num_rounds, num_bands + self._inverse_rows.shape[1] - 1)

  def _factors(self):
    """factor[t, m] = A^-1[t - m, t - m - r] for r = 0, 1, ...: D[t, t - m - r] += C[t, t - m] factor.

    Formed one lag r at a time (n x b-hat each), so a workload with a wide inverse costs time, not
    memory.
    """
    for r in range(self._inverse_rows.shape[1]):
      yield np.where(self._inside, self._inverse_rows[self._source, r], 0.0)

  def matrix(self, params: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.bincount(self.cols, weights=params**2, minlength=self.n))
    c = np.zeros((self.n, self.n))
    c[self.rows, self.cols] = params / norms[self.cols]
    return c

  def params_from_matrix(self, c: np.ndarray) -> np.ndarray:
    return c[self.rows, self.cols]

  def value_and_grad(self, params: np.ndarray) -> tuple:
    norms = np.sqrt(np.bincount(self.cols, weights=params**2, minlength=self.n))
    unit = params / norms[self.cols]
    band_rows = np.zeros((self.n, self.num_bands))
    band_rows[self.rows, self.rows - self.cols] = unit
    if np.any(band_rows[:, 0] <= 0):
      return np.inf, np.zeros_like(params)
    d_rows = np.zeros((self.n, self.num_bands + self._inverse_rows.shape[1] - 1))
    for r, factor in enumerate(self._factors()):
      d_rows[:, r:r + self.num_bands] += band_rows * factor
    row_errors = _RowErrors(d_rows, self._layout)
    value, weights = _row_weights(row_errors.row_errors, self.error)
    if not np.isfinite(value):
      return np.inf, np.zeros_like(params)
    grad_d = row_errors.gradient(weights)
    grad_band = sum(grad_d[:, r:r + self.num_bands] * factor
                    for r, factor in enumerate(self._factors()))
    grad_unit = grad_band[self.rows, self.rows - self.cols]
    radial = np.bincount(self.cols, weights=grad_unit * unit, minlength=self.n)
    grad = (grad_unit - unit * radial[self.cols]) / norms[self.cols]
    return value, grad


class _TimeLimit(Exception):
  pass


def _minimize(fun, x0: np.ndarray, max_iterations: int, max_seconds: Optional[float],
              tolerance: float) -> tuple:
  """L-BFGS (scipy L-BFGS-B, no bounds) with a wall-clock budget; returns (x, details)."""
  start = time.monotonic()
  best = {'value': np.inf, 'x': x0, 'evaluations': 0}

  def wrapped(x):
    if max_seconds is not None and time.monotonic() - start > max_seconds:
      raise _TimeLimit()
    value, grad = fun(x)
    best['evaluations'] += 1
    if value < best['value']:
      best['value'], best['x'] = value, x.copy()
    return value, grad

  try:
    result = scipy.optimize.minimize(wrapped, x0, jac=True, method='L-BFGS-B', options={
        'maxiter': max_iterations, 'maxcor': 20, 'ftol': tolerance, 'gtol': 0.0})
    message, iterations = str(result.message), int(result.nit)
  except _TimeLimit:
    message, iterations = 'time limit reached', -1
  return best['x'], {'objective': float(best['value']), 'evaluations': best['evaluations'],
                     'iterations': iterations, 'message': message}


def optimize_banded(num_rounds: int, num_bands: Optional[int],
                    participation: participation_lib.ParticipationSchema, toeplitz: bool = False,
                    error: str = 'rms', workload: Optional[np.ndarray] = None, *,
                    max_iterations: int = 100, max_seconds: Optional[float] = None,
                    tolerance: float = 1e-7,
                    initial: Optional[BandedStrategy] = None) -> base.OptimizationResult:
  """Optimizes a banded strategy (BandMF Problem 2, or a banded Toeplitz C).

  General (`toeplitz=False`): C lower triangular with `num_bands` bands and unit column norms
  (diag(C^T C) = 1), minimizing the workload error (mean of ||B_i||^2 for 'rms', a smooth maximum for
  'max', B = A C^-1) by L-BFGS over the band entries with analytic gradients. It starts from the
  column-normalized banded Toeplitz optimum for the workload (prefix sums if the workload is not
  Toeplitz), or from `initial`. With `num_bands` <= `min_sep` the squared sensitivity is exactly k_eff
  for every candidate (BandMF Thm. 2), so the error is the loss up to that constant; with more bands
  the reported losses use the Alg. 4 upper bound.

  Toeplitz (`toeplitz=True`): C[t, t - j] = c_j for j < `num_bands`, L-BFGS over c minimizing
  k_eff ||c||^2 Error^2 (||c||^2 is the largest column norm; exact error: 'max' is the last row),
  started from the sqrt(A) coefficients 1, 1/2, 3/8, ...

  Args:
    num_rounds: n.
    num_bands: b-hat, 1 <= b-hat <= n; None for min(min_sep, n), where the sensitivity is exact.
    participation: the schema the result's losses are reported for.
    toeplitz: optimize a banded Toeplitz C (b-hat parameters, milliseconds per step).
    error: 'rms' (default, BandMF paper) or 'max'.
    workload: optional lower-triangular n x n A (e.g. `base.momentum_workload`, SGD with momentum
      and a learning-rate schedule, BandMF Sec. 5.8); prefix sums by default. Must be Toeplitz with
      `toeplitz=True` (momentum with a constant learning rate is).
    max_iterations: L-BFGS iterations (per stage).
    max_seconds: optional wall-clock budget for the general stage; the best point so far is returned.
    tolerance: relative objective decrease below which L-BFGS stops.
    initial: optional `BandedStrategy` with `num_bands` bands and n rounds to start the general
      optimizer from (not with `toeplitz=True`).

  Returns:
    `base.OptimizationResult` with the prefix-sum `Losses` under `participation`; `details` holds the
    optimizer diagnostics and the optimized workload error.
  """
  start = time.monotonic()
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if num_bands is None:
    num_bands = min(participation_lib.check_participation(participation).min_sep,
                    _validation.check_positive_int(num_rounds, 'num_rounds'))
  num_bands = _validation.check_positive_int(num_bands, 'num_bands')
  if num_bands > num_rounds:
    raise ValueError(f'`num_bands`={num_bands} must not exceed `num_rounds`={num_rounds}.')
  participation_lib.check_participation(participation)
  if not isinstance(toeplitz, bool):
    raise ValueError(f'`toeplitz` must be a bool, got {toeplitz!r}.')
  error = _validation.check_one_of(error, 'error', _ERRORS)
  max_iterations = _validation.check_positive_int(max_iterations, 'max_iterations')
  if max_seconds is not None:
    max_seconds = _validation.check_positive_float(max_seconds, 'max_seconds')
  tolerance = _validation.check_positive_float(tolerance, 'tolerance')
  work = _Workload(num_rounds, workload)
  if initial is not None and (not isinstance(initial, BandedStrategy)
                              or initial.num_bands != num_bands
                              or initial.max_rounds != num_rounds):
    raise ValueError(f'`initial` must be a BandedStrategy with {num_bands} bands and {num_rounds} '
                     f'rounds, got {initial!r}.')
  if initial is not None and toeplitz:
    raise ValueError('`initial` applies to the general optimizer only, not with `toeplitz=True`.')
  details = {'error': error, 'toeplitz': toeplitz}

  if initial is None:
    workload_coefs = work.toeplitz_coefs(num_rounds)
    if workload_coefs is None:
      if toeplitz:
        raise ValueError('`workload` must be Toeplitz for `toeplitz=True`.')
      workload_coefs = np.ones(num_rounds)  # warm start from the prefix-sum Toeplitz optimum
    coefs, details['toeplitz_stage'] = _minimize(
        lambda c: _toeplitz_objective(c, num_rounds, workload_coefs, error if toeplitz else 'rms'),
        fhu_coefficients(num_bands), max_iterations, None, tolerance)
    coefs = coefs / coefs[0]
    strategy = BandedStrategy.from_toeplitz(coefs, num_rounds)
  else:
    strategy = initial

  if not toeplitz:
    objective = _BandedObjective(num_rounds, num_bands, work, error)
    params, details['banded_stage'] = _minimize(
        objective.value_and_grad, objective.params_from_matrix(strategy.strategy_matrix(num_rounds)),
        max_iterations, max_seconds, tolerance)
    strategy = BandedStrategy(objective.matrix(params))
  details['workload_error'] = _workload_error(strategy, work, error)
  losses = strategy.losses(num_rounds, participation)
  return base.OptimizationResult(strategy=strategy, losses=losses, num_rounds=num_rounds,
                                 participation=participation, seconds=time.monotonic() - start,
                                 details=details)


def _workload_error(strategy: BandedStrategy, work: _Workload, error: str) -> float:
  """sqrt of the mean ('rms') or max ('max') of ||(A C^-1)_i||^2 for the optimized workload A."""
  rows = np.sum(work.apply(strategy.noise_matrix(strategy.max_rounds))**2, axis=1)
  return float(np.sqrt(np.mean(rows) if error == 'rms' else np.max(rows)))
