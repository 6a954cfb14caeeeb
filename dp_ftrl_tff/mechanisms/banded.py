"""Banded matrix factorization (BandMF): the banded strategy, its errors and the streaming C^-1.

BandMF paper (Choquette-Choo et al. 2023, arXiv:2306.08153):
  * Sec. 2 / App. A: a lower-triangular C is `num_bands`-banded (b-hat bands) when C[i, j] = 0 for
    i - j >= b-hat; b-hat counts the non-zero diagonals, the main one included (b-hat = 1 is DP-SGD).
  * Sec. 3, Thm. 2, Alg. 5: with b-hat <= min_sep the columns a client touches are orthogonal, so the
    squared sensitivity is VecSens(diag(C^T C)) exactly; with equal column norms 1 it is k_eff. With
    b-hat > min_sep (realized separation below the bands) Alg. 4 gives an upper bound.
  * Sec. 4, Problem 2: minimize the prefix-sum error ||A C^-1||_F^2 over banded C with equal column
    norms (diag(C^T C) = 1). Sec. 5.8: other workloads, e.g. SGD with momentum and a learning-rate
    schedule (`base.momentum_workload`), through `banded_optimizer.optimize_banded(..., workload=A)`.
  * Sec. 6, Alg. 9: the noise C^-1 z streams by forward substitution with a buffer of the last
    b-hat - 1 outputs (`stream_inverse`, the numpy reference of `dp_ftrl_tff.noise.banded`).

Storage: a banded C is held as its band rows R of shape (n, b-hat), R[t, j] = C[t, t - j] (0 when
t - j < 0). Rounds are 0-based, t = 0 .. n-1. All math is float64 numpy/scipy.

Errors: B = A C^-1 = (C A^-1)^-1 and A^-1 is banded (prefix sums: I - shift), so the row errors
||B_i||^2 are the diagonal of (D^T D)^-1 for the banded D = C A^-1. `RowErrors` gets them by a block
recursion on a q x q window of B B^T (q = bands of D - 1) in O(n q^2) flops, with a hand-derived
reverse mode for the gradient that re-reads the stored windows (O(n q^2 / 64) memory); the blocks of
D are strided views of one padded array (`BlockLayout`) and no n x n matrix is formed. The optimizer
(`banded_optimizer.optimize_banded`) uses the same recursion; `noise_matrix` still materializes C^-1
by blocked forward substitution.
"""


import numpy as np
import scipy.linalg

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import base, sensitivity
from dp_ftrl_tff.mechanisms import participation as participation_lib

# Rows per block of the blocked triangular solves: small enough that TRSM work (block * n^2 / 2) stays
# below the GEMM coupling work (~2 b-hat n^2), large enough for BLAS-3 efficiency (measured at n=2052).
_BLOCK = 128
# Rows per block of the row-error recursion (`RowErrors`): the O(n q^2) window products do not depend
# on it; larger blocks add O(n s q + n s^2) flops, smaller ones per-block call overhead.
ROW_BLOCK = 64


def _check_band_rows(band_rows) -> np.ndarray:
  """Validates band rows R (n, b-hat): finite, of magnitude at most `_validation.MAX_COEFFICIENT`,
  R[t, 0] > 0, R[t, j] = 0 for t - j < 0."""
  band_rows = _validation.check_float_array(band_rows, 'band_rows', ndim=2,
                                          max_abs=_validation.MAX_COEFFICIENT)
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
  return dense_from_band_rows(band_rows)


def dense_from_band_rows(band_rows: np.ndarray) -> np.ndarray:
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


class BlockLayout:
  """Row blocks of `RowErrors` for an n x n lower-triangular D with `num_bands` bands (q = bands - 1).

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


# `RowErrors` refuses (LinAlgError) a D with a squared row error above `_MAX_ROW_ERROR`, or a
# diagonal-block inverse entry above its square root (those entries are entries of B = D^-1, so
# they bound a row error from below), before any product can overflow: with the window's and T's
# entries so bounded, every forward and gradient product stays below about 1e200 times a polynomial
# in n. The optimizer takes such a C as outside its domain: the best row errors of any workload it
# accepts are those of C = I, at most n for the prefix sums.
_MAX_ROW_ERROR = 1e80
_MAX_INVERSE_ENTRY = 1e40


class RowErrors:
  """Squared row norms of B = D^-1 for a banded lower-triangular D, and their gradient, O(n q^2).

  D (n x n, q + 1 bands, band rows as for C) is C A^-1 for a workload A whose inverse is banded (the
  prefix sums: A^-1 = I - shift, two bands), so B = A C^-1 = D^-1 and ||B_i||^2 = Z_ii with
  Z = B B^T. Rows are processed in blocks I (`BlockLayout`); the q rows K before a block hold every
  entry of D left of its diagonal block, so B_I = T (I_I - E B_K) with T = L^-1 (L = D_II), E = D_IK,
  and B_K lives on columns left of the block (orthogonal to the unit rows I_I). With the window
  W = Z_KK (q x q) carried from block to block:
      P = E W,   Z_IK = -T P,   M = I + P E^T,   Z_II = T M T^T,
  and the next window is assembled from W, Z_IK and Z_II. Per block O(s q^2 + s^2 q + s^3) flops,
  O(n q^2) in all (3 n q^2 multiply-adds with the gradient: P, E-bar and W-bar), never an n x n
  matrix. `gradient` is the hand-derived reverse mode of the same recursion; it re-reads the stored
  windows and products (about (n / s) q^2 floats).
  """

  def __init__(self, d_rows: np.ndarray, layout: BlockLayout):
    """`d_rows`: band rows (n, q + 1) of D; `layout`: `BlockLayout(n, q + 1, block)`."""
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
      if not np.max(np.abs(inv)) <= _MAX_INVERSE_ENTRY:  # also inf / NaN from dtrtri
        raise np.linalg.LinAlgError('row errors beyond 1e80 (a numerically singular D)')
      carried = coupling @ window  # P = E W
      middle = carried @ coupling.T  # M = I + P E^T
      middle.flat[::size + 1] += 1.0
      cross = inv @ carried  # -Z_IK
      inv_middle = inv @ middle
      own = inv_middle @ inv.T  # Z_II
      self.row_errors[start:end] = np.diagonal(own)
      if not np.max(self.row_errors[start:end]) <= _MAX_ROW_ERROR:
        raise np.linalg.LinAlgError('row errors beyond 1e80 (a numerically singular D)')
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


def prefix_sum_row_errors(band_rows: np.ndarray) -> np.ndarray:
  """||B_i||^2 for B = A C^-1, A the prefix sums: B = D^-1 with D = C (I - shift), D[t, t - l] =
  C[t, t - l] - C[t, t - l + 1] (b-hat + 1 bands)."""
  n, num_bands = band_rows.shape
  d_rows = np.zeros((n, num_bands + 1))
  d_rows[:, :num_bands] = band_rows
  d_rows[:, 1:] -= band_rows
  d_rows[np.arange(num_bands + 1)[None, :] > np.arange(n)[:, None]] = 0.0  # columns t - l < 0
  return RowErrors(d_rows, BlockLayout(n, num_bands + 1, ROW_BLOCK)).row_errors


def band_sensitivity_squared(band_rows: np.ndarray,
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
  def from_band_rows_unchecked(cls, band_rows: np.ndarray) -> 'BandedStrategy':
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

  def streaming_band_rows(self) -> np.ndarray:
    """The band rows a stream looks up, round t reading row min(t, len - 1): the band rows up to the
    first of the trailing rows that all equal the last one (a Toeplitz band from some round on is
    one row). The table is a constant of the TF graph that TFF sends to its worker every round."""
    rows = self._band_rows
    differs = np.flatnonzero(np.any(rows != rows[-1], axis=1))
    return rows[:differs[-1] + 2] if differs.size else rows[:1]

  def strategy_matrix(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return dense_from_band_rows(self._band_rows[:num_rounds])

  def noise_matrix(self, num_rounds: int) -> np.ndarray:
    num_rounds = self.check_num_rounds(num_rounds)
    return _inverse(self.strategy_matrix(num_rounds), self.num_bands)

  def errors(self, num_rounds: int) -> tuple:
    """(MaxError, RmsError) of B = A C^-1 from the band alone, O(n b-hat^2) (`RowErrors`)."""
    num_rounds = self.check_num_rounds(num_rounds)
    row_errors = prefix_sum_row_errors(self._band_rows[:num_rounds])
    return float(np.sqrt(np.max(row_errors))), float(np.sqrt(np.mean(row_errors)))

  def sensitivity_squared(self, num_rounds: int,
                          participation: participation_lib.ParticipationSchema) -> float:
    """Squared sensitivity (clip norm 1) of the leading n x n block of C.

    Single participation: the largest squared column norm. With `num_bands` <= `min_sep` the exact
    BandMF Alg. 5 value VecSens(diag(C^T C)) (fixed-epoch: the best epoch pattern); with more bands than
    `min_sep` the Alg. 4 upper bound (fixed-epoch: the per-epoch Eq. 5 value). All through
    `sensitivity.dense_squared` (n x n; `memory.estimate_bytes` counts on it; `optimize_banded`
    reports its losses through the O(n b-hat) `band_sensitivity_squared` where that applies).
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

def fhu_coefficients(num_bands: int) -> np.ndarray:
  """1, 1/2, 3/8, 5/16, ...: the first `num_bands` coefficients of sqrt(A) (Fichtenberger et al.)."""
  num_bands = _validation.check_positive_int(num_bands, 'num_bands')
  j = np.arange(1, num_bands)
  return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])
