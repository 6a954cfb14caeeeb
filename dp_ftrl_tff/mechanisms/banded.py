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
block recursion on a q x q window of B B^T (q = bands of D - 1) in O(n q^2) flops (3 n q^2
multiply-adds with the gradient), with a hand-derived reverse mode for the gradient that re-reads
the stored windows (O(n q^2 / 64) memory); the blocks of D are strided views of one padded array
(`_BlockLayout`) and no n x n matrix is formed. `BandedStrategy.errors` uses the same recursion;
`noise_matrix` still materializes C^-1 by blocked forward substitution.

Optimizer schedule (prefix sums, b-hat >= 40): coarse to fine. The optimum C of (n, b-hat) looks like
the optimum of (n / 2, b-hat / 2) stretched by 2 in both directions, once each column is divided by
the Toeplitz square root of A (docs/papers.md#bsr): at n = 2052, 342 bands the stretched 1026 / 171
optimum has RmsLoss 8.5955, the fine optimum 8.5952, the banded Toeplitz start 8.746. So the
optimizer solves 129 / 22, 257 / 43, ..., n / b-hat in turn (`_level_sizes`), each stage started
from the previous optimum (`_interpolate_band_rows`); the cheap coarse stages do most of the work
and the full-size stage needs 19 ('rms') and 31 ('max') evaluations at n = 2052, where the single
stage from the Toeplitz start needed 104 and 151 (docs/benchmarks/banded.md).
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
# Its minimizer's largest row error falls as p grows, its conditioning worsens: at n = 2052, 342
# bands, fully converged, MaxLoss 9.235 (p = 64, the value before issue 16), 9.173 (128), 9.139 (256),
# 9.121 (512), the last two at 2 to 3 times the evaluations of p = 128.
_MAX_ERROR_POWER = 128.0
# Coarse-to-fine optimization of the general banded C (`_level_sizes`): halve n and b-hat while b-hat
# stays >= this many bands.
_COARSEST_BANDS = 20
# Default L-BFGS stopping tolerances (relative objective decrease per iteration, L-BFGS-B's ftol):
# the banded Toeplitz stage (milliseconds per step); the general stage for 'rms', whose objective
# is the squared RmsLoss / sens^2 (1e-6 is 5e-7 relative in the loss); for 'max', whose objective, the
# p-mean of the row errors, differs from their maximum by up to a factor n^(1/p) (6% at n = 2052):
# a decrease of 1e-5 per iteration is already below what the surrogate resolves.
_TOEPLITZ_TOLERANCE = 1e-7
_GENERAL_TOLERANCE = {'rms': 1e-6, 'max': 1e-5}
# Iterations over which the general stages average the relative decrease for their stopping test.
_STOPPING_WINDOW = 5
# Column norms of every L-BFGS start (the objective is invariant to them; see `optimize_banded`).
_START_COLUMN_NORM = 100.0
# L-BFGS correction pairs for the general banded C: at 6e5 parameters (n = 2052, 342 bands)
# L-BFGS-B's own work per iteration is about 0.03 s of CPU with 5 pairs, 0.04 s with 10 and 0.065 s
# with 20, against 0.07 s for one objective evaluation; 5 pairs took the least time in total
# (2.8 s against 3.0 s for 'rms', 4.0 s against 4.5 s for 'max', one BLAS thread).
_LBFGS_MEMORY = 5


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


class _BlockLayout:
  """Row blocks of `_RowErrors` for an n x n lower-triangular D with `num_bands` bands (q = bands - 1).

  Block b holds rows start..end-1 (s = end - start <= `block` rows) and columns start-left..end-1
  (left = min(q, start)) of D as a dense s x (left + s) matrix [E | L]: E = D[I, K] couples the block
  to the q rows K before it, L = D[I, I] is lower triangular.

  Storage: D's band rows reversed, F[t, k] = D[t, t - (q - k)] for k <= q, each row followed by
  `block` zeros (row length w = q + 1 + block). Entry (i, c) of block b is
  D[start + i, start - left + c] = F[start + i, q - left - i + c], at flat offset
  (start w + q - left) + i (w - 1) + c: every block is a strided view of F (row stride w - 1, unit
  column stride, so BLAS reads it without a copy). Its structural zeros land in the zero padding:
  the strict upper triangle of L on the padding of the same row (k > q), the lower-left corner of E
  (lags > q) on the padding of the previous row. No two positions of one view share memory and the
  views only reach band entries (k <= q) of their own rows, so gradients written through the views
  of a zero array land exactly on D's band entries, once each (plus junk in the padding, dropped).
  """

  def __init__(self, num_rounds: int, num_bands: int, block: int):
    self.num_rounds, self.num_bands = num_rounds, num_bands
    self.row_length = num_bands + block
    q = num_bands - 1
    self.blocks = []
    for start in range(0, num_rounds, block):
      end = min(num_rounds, start + block)
      left = min(q, start)
      self.blocks.append((start, end, left, start * self.row_length + q - left))

  def pack(self, d_rows: np.ndarray) -> np.ndarray:
    """The padded reversed storage F (n, q + 1 + s) of D's band rows (n, q + 1)."""
    padded = np.zeros((self.num_rounds, self.row_length))
    padded[:, :self.num_bands] = d_rows[:, ::-1]
    return padded

  def unpack(self, padded: np.ndarray) -> np.ndarray:
    """Band rows (n, q + 1) of D from its padded storage F (inverse of `pack` on the band)."""
    return np.ascontiguousarray(padded[:, self.num_bands - 1::-1])

  def split(self, padded: np.ndarray):
    """Yields (start, end, left, E, L) views of the blocks of the padded storage F."""
    flat = padded.reshape(-1)
    item = flat.itemsize
    for start, end, left, offset in self.blocks:
      size = end - start
      # The last entry read, (end - 1) w + q, lies inside F (see the class docstring).
      matrix = np.lib.stride_tricks.as_strided(
          flat[offset:], shape=(size, left + size), strides=((self.row_length - 1) * item, item))
      yield start, end, left, matrix[:, :left], matrix[:, left:]


class _RowErrors:
  """Squared row norms of B = D^-1 for a banded lower-triangular D, and their gradient, O(n q^2).

  D (n x n, q + 1 bands, band rows as for C) is C A^-1 for a workload A whose inverse is banded (the
  prefix sums: A^-1 = I - shift, two bands), so B = A C^-1 = D^-1 and ||B_i||^2 = Z_ii with
  Z = B B^T. Rows are processed in blocks I (`_BlockLayout`); the q rows K before a block hold every
  entry of D left of its diagonal block, so B_I = T (I_I - E B_K) with T = L^-1 (L = D_II), E = D_IK,
  and B_K lives on columns left of the block (orthogonal to the unit rows I_I). With the window
  W = Z_KK (q x q) carried from block to block:
      P = E W,   Z_IK = -T P,   M = I + P E^T,   Z_II = T M T^T,
  and the next window is assembled from W, Z_IK and Z_II. Per block O(s q^2 + s^2 q + s^3) flops,
  O(n q^2) in all (3 n q^2 multiply-adds with the gradient: P, E-bar and W-bar), never an n x n
  matrix. `gradient` is the hand-derived reverse mode of the same recursion; it re-reads the stored
  windows and products (about (n / s) q^2 floats).
  """

  def __init__(self, d_rows: np.ndarray, layout: _BlockLayout):
    """`d_rows`: band rows (n, q + 1) of D; `layout`: `_BlockLayout(n, q + 1, block)`."""
    n, bands = d_rows.shape
    q = bands - 1
    self._layout = layout
    self._buffer = layout.pack(d_rows)
    self._saved = []
    self.row_errors = np.empty(n)
    window = np.zeros((0, 0))
    for start, end, left, coupling, diagonal in layout.split(self._buffer):
      size = end - start
      inv, info = scipy.linalg.lapack.dtrtri(diagonal, lower=1)
      if info != 0:
        raise np.linalg.LinAlgError('singular diagonal block')
      inv = np.tril(inv)  # dtrtri leaves the (zero) strict upper triangle of its input as it was
      carried = coupling @ window  # P = E W
      middle = carried @ coupling.T  # M = I + P E^T
      middle.flat[::size + 1] += 1.0
      cross = inv @ carried  # -Z_IK
      inv_middle = inv @ middle
      own = inv_middle @ inv.T  # Z_II
      self.row_errors[start:end] = np.diagonal(own)
      self._saved.append((window, inv, carried, middle, inv_middle))
      # Next window: rows and columns max(0, end - q) .. end - 1 of Z.
      width = min(q, end)
      keep = width - size  # rows of the old window that stay
      if keep <= 0:
        window = own[size - width:, size - width:]
        continue
      new = np.empty((width, width))
      new[:keep, :keep] = window[left - keep:, left - keep:]
      np.negative(cross[:, left - keep:], out=new[keep:, :keep])
      new[:keep, keep:] = new[keep:, :keep].T
      new[keep:, keep:] = own
      window = new

  def gradient(self, weights: np.ndarray) -> np.ndarray:
    """d(sum_i weights_i ||B_i||^2) / d band rows of D (same shape as the band rows)."""
    layout = self._layout
    grad_buffer = np.zeros_like(self._buffer)
    grad_next = None  # adjoint of the window the next block read
    blocks = list(layout.split(self._buffer))
    grad_blocks = list(layout.split(grad_buffer))
    for (start, end, left, coupling, _), (_, _, _, grad_coupling, grad_diagonal), saved in zip(
        reversed(blocks), reversed(grad_blocks), reversed(self._saved), strict=True):
      window, inv, carried, middle, inv_middle = saved
      size = end - start
      grad_own = np.zeros((size, size))
      grad_own.flat[::size + 1] = weights[start:end]
      grad_cross = np.zeros((size, left))  # adjoint of -Z_IK = T P
      keep = 0
      if grad_next is not None:
        width = grad_next.shape[0]
        keep = width - size
        if keep <= 0:
          grad_own[size - width:, size - width:] += grad_next
        else:
          grad_cross[:, left - keep:] = -(grad_next[keep:, :keep] + grad_next[:keep, keep:].T)
          grad_own += grad_next[keep:, keep:]
      # own = T M T^T (M symmetric); cross = T P; M = I + P E^T; P = E W; T = L^-1.
      grad_inv = (grad_own + grad_own.T) @ inv_middle + grad_cross @ carried.T
      grad_middle = inv.T @ grad_own @ inv
      grad_carried = grad_middle @ coupling + inv.T @ grad_cross
      grad_coupling[...] = grad_middle.T @ carried + grad_carried @ window
      grad_window = coupling.T @ grad_carried
      if keep > 0:  # the rows of this block's window that the next window kept
        grad_window[left - keep:, left - keep:] += grad_next[:keep, :keep]
      grad_diagonal[...] = -inv.T @ grad_inv @ inv.T
      grad_next = grad_window
    return layout.unpack(grad_buffer)


def _prefix_sum_row_errors(band_rows: np.ndarray) -> np.ndarray:
  """||B_i||^2 for B = A C^-1, A the prefix sums: B = D^-1 with D = C (I - shift), D[t, t - l] =
  C[t, t - l] - C[t, t - l + 1] (b-hat + 1 bands)."""
  n, num_bands = band_rows.shape
  d_rows = np.zeros((n, num_bands + 1))
  d_rows[:, :num_bands] = band_rows
  d_rows[:, 1:] -= band_rows
  d_rows[np.arange(num_bands + 1)[None, :] > np.arange(n)[:, None]] = 0.0  # columns t - l < 0
  return _RowErrors(d_rows, _BlockLayout(n, num_bands + 1, _ROW_BLOCK)).row_errors


def _band_sensitivity_squared(band_rows: np.ndarray,
                              participation: participation_lib.ParticipationSchema):
  """`BandedStrategy.sensitivity_squared` over all n rounds from the band, O(n b-hat), or None.

  Applies where that method's dense route is a function of the column norms alone: single
  participation (the largest squared column norm) and, not fixed-epoch, b-hat <= min_sep
  (BandMF Alg. 5: VecSens of the squared column norms). The dense route sums the same squares in
  another order (equal to a few ulps) but forms n x n arrays (4 s at n = 8192).
  """
  num_rounds, num_bands = band_rows.shape
  single = participation.is_single_participation(num_rounds)
  if participation.fixed_epoch or not (single or num_bands <= participation.min_sep):
    return None
  t, lag = np.nonzero(band_rows)
  column_sq = np.bincount(t - lag, weights=band_rows[t, lag]**2, minlength=num_rounds)
  if single:
    return float(np.max(column_sq))
  return sensitivity.vec_sens(column_sq, participation.min_sep, participation.max_participations)


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
  def _from_band_rows_unchecked(cls, band_rows: np.ndarray) -> 'BandedStrategy':
    """From band rows that are lower triangular by construction (the optimizer's), without the dense
    n x n round trip of `from_band_rows` (537 MB at n = 8192); trailing all-zero bands are dropped
    as there."""
    band_rows = _check_band_rows(band_rows)
    nonzero = np.flatnonzero(np.any(band_rows != 0, axis=0))
    strategy = cls.__new__(cls)
    strategy._band_rows = np.array(band_rows[:, :nonzero[-1] + 1])  # column 0 is positive
    strategy._band_rows.setflags(write=False)
    return strategy

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
    `sensitivity.dense_squared` (n x n; `memory.estimate_bytes` counts on it; `optimize_banded`
    reports its losses through the O(n b-hat) `_band_sensitivity_squared` where that applies).
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
      self.is_prefix_sums = True
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
    self.is_prefix_sums = bool(np.all(workload == np.tril(np.ones_like(workload))))

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


class _BandedObjective:
  """Error of a column-normalized banded C = P diag(1 / ||P[:, j]||) over the free band entries of P.

  With unit column norms and b-hat <= min_sep, sens^2 = k_eff for every P, so minimizing the error
  minimizes the loss (BandMF Problem 2). The row errors ||B_i||^2 of B = A C^-1 = (C A^-1)^-1 come
  from `_RowErrors` on D = C A^-1 (b-hat + w - 1 bands for a w-banded A^-1): O(n (b-hat + w)^2) per
  evaluation, never an n x n matrix.

  Parameters: P's band entries row by row in band-row order (R[t, l] = P[t, t - l], l <= min(t,
  b-hat - 1)), so rows b-hat - 1 .. n - 1 are one contiguous (n - b-hat + 1, b-hat) block and only
  the first b-hat - 1 rows are scattered. Column j of P is the diagonal R[j + l, l] of the band rows:
  a strided view of the band rows padded with b-hat zero rows (`_columns`), and a per-column value
  v_j spread over the band rows, v[t - l], is a sliding-window view of v (`_per_entry`); no
  per-evaluation index arrays.
  """

  def __init__(self, num_rounds: int, num_bands: int, workload: _Workload, error: str):
    self.n = num_rounds
    self.num_bands = num_bands
    self.error = error
    rows, lags = np.indices((num_rounds, num_bands))
    valid = rows >= lags
    self.rows, self.cols = rows[valid], (rows - lags)[valid]
    head = valid[:num_bands - 1]  # the partial rows 0 .. b-hat - 2
    self._head_index = np.flatnonzero(head)
    self._head_size = self._head_index.size
    self._inverse_rows = workload.inverse_band_rows(num_rounds)
    source = rows - lags
    self._inside = source >= 0
    self._source = np.maximum(source, 0)
    # A narrow A^-1 (prefix sums: 2 bands) keeps its factors; a wide one forms them lag by lag.
    self._kept_factors = None
    if self._inverse_rows.shape[1] <= 4:
      self._kept_factors = list(self._factors())
    self._layout = _BlockLayout(num_rounds, num_bands + self._inverse_rows.shape[1] - 1, _ROW_BLOCK)

  def _factors(self):
    """factor[t, m] = A^-1[t - m, t - m - r] for r = 0, 1, ...: D[t, t - m - r] += C[t, t - m] factor.

    Formed one lag r at a time (n x b-hat each), so a workload with a wide inverse costs time, not
    memory.
    """
    if self._kept_factors is not None:
      yield from self._kept_factors
      return
    for r in range(self._inverse_rows.shape[1]):
      yield np.where(self._inside, self._inverse_rows[self._source, r], 0.0)

  def _padded_rows(self, params: np.ndarray) -> np.ndarray:
    """P's band rows (n, b-hat) followed by b-hat zero rows."""
    padded = np.zeros((self.n + self.num_bands, self.num_bands))
    padded.reshape(-1)[self._head_index] = params[:self._head_size]
    padded[self.num_bands - 1:self.n] = params[self._head_size:].reshape(-1, self.num_bands)
    return padded

  def _columns(self, padded: np.ndarray) -> np.ndarray:
    """(n, b-hat) view V[j, l] = padded[j + l, l] = P[j + l, j] (0 past row n - 1).

    Flat offset j b-hat + l (b-hat + 1); the last one read, (n - 1) b-hat + (b-hat - 1)(b-hat + 1),
    is below (n + b-hat) b-hat, the padded size.
    """
    item = padded.itemsize
    return np.lib.stride_tricks.as_strided(
        padded, shape=(self.n, self.num_bands),
        strides=(self.num_bands * item, (self.num_bands + 1) * item), writeable=False)

  def _per_entry(self, per_column: np.ndarray) -> np.ndarray:
    """(n, b-hat) read-only view E[t, l] = per_column[t - l] (0 where t < l)."""
    padded = np.concatenate([np.zeros(self.num_bands - 1), per_column])
    return np.lib.stride_tricks.sliding_window_view(padded, self.num_bands)[:, ::-1]

  def column_norms(self, params: np.ndarray) -> np.ndarray:
    columns = self._columns(self._padded_rows(params))
    return np.sqrt(np.einsum('ij,ij->i', columns, columns))

  def band_rows(self, params: np.ndarray) -> np.ndarray:
    """Band rows (n, b-hat) of the column-normalized C, rows with a negative diagonal entry flipped
    (the same objective, see `value_and_grad`)."""
    padded = self._padded_rows(params)
    columns = self._columns(padded)
    rows = padded[:self.n] * self._per_entry(1.0 / np.sqrt(np.einsum('ij,ij->i', columns, columns)))
    return rows * np.where(rows[:, :1] < 0, -1.0, 1.0)

  def matrix(self, params: np.ndarray) -> np.ndarray:
    return _dense(self.band_rows(params))

  def params_from_matrix(self, c: np.ndarray) -> np.ndarray:
    return c[self.rows, self.cols]

  def params_from_band_rows(self, band_rows: np.ndarray) -> np.ndarray:
    return np.concatenate([band_rows.reshape(-1)[self._head_index],
                           band_rows[self.num_bands - 1:].reshape(-1)])

  def value_and_grad(self, params: np.ndarray) -> tuple:
    padded = self._padded_rows(params)
    columns = self._columns(padded)
    norms = np.sqrt(np.einsum('ij,ij->i', columns, columns))
    if not np.all(norms > 0):  # also catches NaN
      return np.inf, np.zeros_like(params)
    scale = self._per_entry(1.0 / norms)
    unit = padded[:self.n] * scale
    # A negative diagonal entry is allowed: flipping the sign of row t of C (S C) keeps its column
    # norms and the row norms of B = A C^-1 S, so the objective is the same as for the positive
    # diagonal and `band_rows` flips such rows back. Only a singular C (a zero diagonal) is
    # infinite; L-BFGS-B's line search stalls on infinite values (it did on a `diagonal > 0` test).
    d_rows = np.zeros((self.n, self.num_bands + self._inverse_rows.shape[1] - 1))
    for r, factor in enumerate(self._factors()):
      d_rows[:, r:r + self.num_bands] += unit * factor
    try:
      row_errors = _RowErrors(d_rows, self._layout)
    except np.linalg.LinAlgError:
      return np.inf, np.zeros_like(params)
    value, weights = _row_weights(row_errors.row_errors, self.error)
    if not np.isfinite(value):
      return np.inf, np.zeros_like(params)
    grad_d = row_errors.gradient(weights)
    grad_unit = np.zeros((self.n + self.num_bands, self.num_bands))  # padded like the band rows
    for r, factor in enumerate(self._factors()):
      grad_unit[:self.n] += grad_d[:, r:r + self.num_bands] * factor
    # unit = p / ||p_col||: the gradient is projected off each column's radial direction.
    radial = np.einsum('ij,ij->i', self._columns(grad_unit), self._columns(padded)) / norms
    grad_rows = (grad_unit[:self.n] - unit * self._per_entry(radial)) * scale
    return value, self.params_from_band_rows(grad_rows)


class _TimeLimit(Exception):
  pass


class _Converged(Exception):
  pass


def _minimize(fun, x0: np.ndarray, max_iterations: int, max_seconds: Optional[float],
              tolerance: float, memory: int = 20, window: Optional[int] = None) -> tuple:
  """L-BFGS (scipy L-BFGS-B, no bounds) with a wall-clock budget; returns (x, details).

  Stops after `max_iterations` iterations, past `max_seconds` (the best point evaluated so far is
  returned), or when the objective's relative decrease falls below `tolerance`: per iteration
  (L-BFGS-B's own ftol test) without `window`, else on average over the last `window` iterations,
  (f_{k - window} - f_k) / max(|f_k|, 1) <= window tolerance, checked after each iteration. The
  window rule ignores a single iteration of little progress, e.g. a first step that the line search
  had to shrink far, or a step into a kink of the smooth maximum; the per-iteration test ended coarse
  stages after 3 to 6 iterations at n = 8192. With `window`, an L-BFGS-B run that ends without
  meeting it (its line search found no decrease: a trial step far past a nearly singular C, seen
  with error='max') is restarted from its best point with a fresh memory, within the same iteration
  budget, as long as the previous run made progress. The projected-gradient test is off.
  `memory`: L-BFGS correction pairs (maxcor).
  """
  start = time.monotonic()
  best = {'value': np.inf, 'x': x0, 'evaluations': 0}
  history = []  # objective after each iteration (the best so far: L-BFGS-B iterates decrease)

  def wrapped(x):
    if max_seconds is not None and time.monotonic() - start > max_seconds:
      raise _TimeLimit()
    value, grad = fun(x)
    best['evaluations'] += 1
    if value < best['value']:
      best['value'], best['x'] = value, x.copy()
    return value, grad

  def callback(_):
    history.append(best['value'])
    if len(history) > window:
      decrease = history[-1 - window] - history[-1]
      if decrease <= window * tolerance * max(abs(history[-1]), 1.0):
        raise _Converged()

  restarts = 0
  try:
    while True:
      done, value = len(history), best['value']
      result = scipy.optimize.minimize(
          wrapped, best['x'], jac=True, method='L-BFGS-B',
          callback=None if window is None else callback,
          options={'maxiter': max_iterations - done, 'maxcor': memory,
                   'ftol': tolerance if window is None else 0.0, 'gtol': 0.0})
      message, iterations = str(result.message), done + int(result.nit)
      progressed = (best['value'] < value - tolerance * max(abs(value), 1.0)
                    if np.isfinite(value) else np.isfinite(best['value']))
      if window is None or len(history) >= max_iterations or not progressed:
        break
      restarts += 1  # stalled after some progress: restart from the best point
  except _TimeLimit:
    message, iterations = 'time limit reached', -1
  except _Converged:
    message = f'CONVERGENCE: RELATIVE REDUCTION OVER {window} ITERATIONS <= {window} TOLERANCE'
    iterations = len(history)
  return best['x'], {'objective': float(best['value']), 'evaluations': best['evaluations'],
                     'iterations': iterations, 'message': message, 'restarts': restarts}


def _level_sizes(num_rounds: int, num_bands: int) -> list:
  """(n, b-hat) of the coarse-to-fine stages, coarsest first; the last is the problem itself.

  Both n and b-hat are halved (rounding up) while b-hat >= 2 `_COARSEST_BANDS`, so every stage keeps
  the shape n / b-hat of the problem (the StackOverflow setting 2052 / 342: 129 / 22, 257 / 43,
  513 / 86, 1026 / 171, 2052 / 342).
  """
  sizes = [(num_rounds, num_bands)]
  while sizes[-1][1] >= 2 * _COARSEST_BANDS:
    n, bands = sizes[-1]
    sizes.append(((n + 1) // 2, (bands + 1) // 2))
  return sizes[::-1]


def _interpolate_band_rows(band_rows: np.ndarray, num_rounds: int, num_bands: int) -> np.ndarray:
  """A column-normalized banded C for (n, b-hat) = (`num_rounds`, `num_bands`) from a coarser one.

  Column j of C holds C[j + l, j] for lags l < b-hat. Divided by the coefficients s_l of the Toeplitz
  square root of the prefix sums (s_l = binom(2l, l) / 4^l ~ 1 / sqrt(pi l), `fhu_coefficients`;
  docs/papers.md#bsr), the coarse optimum is a smooth function of (j, l) apart from the first rows,
  and it is sampled bilinearly at j (n_c - 1) / (n - 1), l (b_c - 1) / (b-hat - 1), so the first and
  last columns and lags map onto each other and a round t = j + l maps to about t n_c / n (the
  coarse problem has the same n / b-hat, `_level_sizes`). Entries past the last round (j + l >= n_c)
  are extended with the column's last entry before sampling; the result is column-normalized.
  Measured at n = 2052, 342 bands: the interpolated 1026 / 171 optimum has RmsLoss 8.5955 against the
  fine optimum's 8.5952, where the banded Toeplitz start has 8.746.

  Args:
    band_rows: (n_c, b_c) band rows of the coarse C, b_c >= 2.
    num_rounds: n >= n_c.
    num_bands: b-hat >= b_c.

  Returns:
    (n, b-hat) float64 band rows, R[t, l] = C[t, t - l], with unit column norms.
  """
  coarse_rounds, coarse_bands = band_rows.shape
  lags = np.arange(coarse_bands)
  rounds = np.arange(coarse_rounds)[:, None] + lags[None, :]  # the row t = j + l of C[t, j]
  inside = rounds < coarse_rounds
  last = np.minimum(coarse_bands, coarse_rounds - np.arange(coarse_rounds)) - 1  # last lag of column j
  ratio = np.zeros((coarse_rounds, coarse_bands))
  ratio[inside] = band_rows[rounds[inside], np.broadcast_to(lags, rounds.shape)[inside]]
  ratio /= fhu_coefficients(coarse_bands)[None, :]
  ratio = np.where(inside, ratio, ratio[np.arange(coarse_rounds), last][:, None])

  def positions(size, coarse_size):
    x = np.arange(size) * ((coarse_size - 1) / max(size - 1, 1))
    low = np.minimum(x.astype(int), max(coarse_size - 2, 0))
    return low, np.minimum(low + 1, coarse_size - 1), x - low

  j0, j1, wj = positions(num_rounds, coarse_rounds)
  l0, l1, wl = positions(num_bands, coarse_bands)
  wj, wl = wj[:, None], wl[None, :]
  fine = ((1 - wj) * ((1 - wl) * ratio[j0][:, l0] + wl * ratio[j0][:, l1])
          + wj * ((1 - wl) * ratio[j1][:, l0] + wl * ratio[j1][:, l1]))
  fine *= fhu_coefficients(num_bands)[None, :]
  rows = np.arange(num_rounds)[:, None] + np.arange(num_bands)[None, :]
  fine[rows >= num_rounds] = 0.0
  fine /= np.linalg.norm(fine, axis=1, keepdims=True)
  out = np.zeros((num_rounds, num_bands))
  valid = rows < num_rounds
  out[rows[valid], np.broadcast_to(np.arange(num_bands), rows.shape)[valid]] = fine[valid]
  return out


def optimize_banded(num_rounds: int, num_bands: Optional[int],
                    participation: participation_lib.ParticipationSchema, toeplitz: bool = False,
                    error: str = 'rms', workload: Optional[np.ndarray] = None, *,
                    max_iterations: int = 100, max_seconds: Optional[float] = None,
                    tolerance: Optional[float] = None,
                    initial: Optional[BandedStrategy] = None) -> base.OptimizationResult:
  """Optimizes a banded strategy (BandMF Problem 2, or a banded Toeplitz C).

  General (`toeplitz=False`): C lower triangular with `num_bands` bands and unit column norms
  (diag(C^T C) = 1), minimizing the workload error (mean of ||B_i||^2 for 'rms', a smooth maximum for
  'max': the p-mean of the row errors with p = 128, B = A C^-1) by L-BFGS over the band entries with
  analytic gradients. With `num_bands` <= `min_sep` the squared sensitivity is exactly k_eff for every
  candidate (BandMF Thm. 2), so the error is the loss up to that constant; with more bands the
  reported losses use the Alg. 4 upper bound.
  Start: for the prefix sums (no `workload`, or the all-ones lower triangle) with at least 40 bands
  and no `initial`, coarse to fine (module docstring): stages (n, b-hat) halved until b-hat < 40, the
  coarsest started from its column-normalized banded Toeplitz optimum, each finer one from the
  previous optimum stretched (`_interpolate_band_rows`); every stage runs L-BFGS to its own stopping
  test. Otherwise one stage from the column-normalized banded Toeplitz optimum for the workload
  (prefix sums if the workload is not Toeplitz), or from `initial`.

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
    max_iterations: L-BFGS iterations (per stage: the Toeplitz start and each coarse-to-fine stage).
    max_seconds: optional wall-clock budget for the general stages; the best point so far is
      returned (stretched to n x b-hat if the budget ends in a coarse stage).
    tolerance: relative objective decrease per iteration below which L-BFGS stops: in one
      iteration for the banded Toeplitz stage (L-BFGS-B's ftol), on average over the last
      `_STOPPING_WINDOW` = 5 iterations for the general stages (`_minimize`). None (default): 1e-7
      for the Toeplitz stage, 1e-6 for the general stages with 'rms' and 1e-5 with 'max'
      (`_GENERAL_TOLERANCE`; before issue 16 the default was 1e-7 everywhere, and the general stage
      ran into `max_iterations` at n = 2052).
    initial: optional `BandedStrategy` with `num_bands` bands and n rounds to start the general
      optimizer from (not with `toeplitz=True`).

  Returns:
    `base.OptimizationResult` with the prefix-sum `Losses` under `participation`; `details` holds the
    optimizer diagnostics ('toeplitz_stage'; for the general C 'levels', one dict per stage with
    n, bands, evaluations, iterations, message and seconds since the start, and 'banded_stage', the
    last of them) and the optimized workload error.
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
  if tolerance is not None:
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

  multilevel = (not toeplitz and initial is None and work.is_prefix_sums
                and num_bands >= 2 * _COARSEST_BANDS)
  sizes = _level_sizes(num_rounds, num_bands) if multilevel else [(num_rounds, num_bands)]
  if initial is None:
    start_rounds, start_bands = sizes[0]
    workload_coefs = work.toeplitz_coefs(start_rounds)
    if workload_coefs is None:
      if toeplitz:
        raise ValueError('`workload` must be Toeplitz for `toeplitz=True`.')
      workload_coefs = np.ones(start_rounds)  # warm start from the prefix-sum Toeplitz optimum
    coefs, details['toeplitz_stage'] = _minimize(
        lambda c: _toeplitz_objective(c, start_rounds, workload_coefs, error if toeplitz else 'rms'),
        fhu_coefficients(start_bands), max_iterations, None,
        _TOEPLITZ_TOLERANCE if tolerance is None else tolerance)
    coefs = coefs / coefs[0]
    if toeplitz:
      strategy = BandedStrategy.from_toeplitz(coefs, num_rounds)
    band_rows = np.where(np.arange(start_rounds)[:, None] >= np.arange(start_bands)[None, :],
                         coefs[None, :], 0.0)
  else:
    band_rows = np.array(initial.band_rows)

  if not toeplitz:
    levels = []
    for level, (level_rounds, level_bands) in enumerate(sizes):
      if level:
        band_rows = _interpolate_band_rows(band_rows, level_rounds, level_bands)
      objective = _BandedObjective(level_rounds, level_bands,
                                   _Workload(level_rounds, None) if multilevel else work, error)
      remaining = None if max_seconds is None else max(0.0, max_seconds - (time.monotonic() - start))
      params = objective.params_from_band_rows(band_rows)
      # L-BFGS-B's first trial step has unit length along -gradient. With unit columns that moves C
      # by about 1 / sqrt(n) relative (2% at n = 2052), far outside the region where the objective is
      # quadratic: the line search backtracks for several evaluations and can leave so small a first
      # decrease that a per-iteration ftol test ended the stage after one iteration (every level). The
      # objective does not depend on column scales, so columns of norm `_START_COLUMN_NORM` shrink that
      # first step; from the second iteration on L-BFGS scales its steps from the curvature itself.
      params *= _START_COLUMN_NORM / objective.column_norms(params)[objective.cols]
      level_tolerance = _GENERAL_TOLERANCE[error] if tolerance is None else tolerance
      params, info = _minimize(objective.value_and_grad, params, max_iterations, remaining,
                               level_tolerance, _LBFGS_MEMORY, _STOPPING_WINDOW)
      band_rows = objective.band_rows(params)
      levels.append(dict(info, num_rounds=level_rounds, num_bands=level_bands,
                         seconds=time.monotonic() - start))
      if info['message'] == 'time limit reached' and level < len(sizes) - 1:
        band_rows = _interpolate_band_rows(band_rows, num_rounds, num_bands)
        break
    details['banded_stage'] = levels[-1]
    details['levels'] = levels
    strategy = BandedStrategy._from_band_rows_unchecked(band_rows)  # pylint: disable=protected-access
  details['workload_error'] = _workload_error(strategy, work, error)
  sens_sq = _band_sensitivity_squared(np.asarray(strategy.band_rows), participation)
  if sens_sq is None:
    losses = strategy.losses(num_rounds, participation)
  else:  # as `strategy.losses`, without its n x n sensitivity route
    max_error, rms_error = strategy.errors(num_rounds)
    sens = float(np.sqrt(sens_sq))
    losses = base.Losses(max_loss=max_error * sens, rms_loss=rms_error * sens,
                         sensitivity_squared=sens_sq)
  return base.OptimizationResult(strategy=strategy, losses=losses, num_rounds=num_rounds,
                                 participation=participation, seconds=time.monotonic() - start,
                                 details=details)


def _workload_error(strategy: BandedStrategy, work: _Workload, error: str) -> float:
  """sqrt of the mean ('rms') or max ('max') of ||(A C^-1)_i||^2 for the optimized workload A.

  Prefix sums: from the band by the O(n b-hat^2) recursion; another workload: densely.
  """
  if work.is_prefix_sums:
    rows = _prefix_sum_row_errors(np.asarray(strategy.band_rows))
  else:
    rows = np.sum(work.apply(strategy.noise_matrix(strategy.max_rounds))**2, axis=1)
  return float(np.sqrt(np.mean(rows) if error == 'rms' else np.max(rows)))
