"""Squared L2 sensitivity of a strategy matrix C under a participation schema (clip norm 1).

Conventions: C has shape (r, n) with one column per round t = 0 .. n-1 (0-based); X = C^T C is its
Gram matrix; `min_sep` = b and the effective number of participations is
k = `participation.effective_max_participations(n)`. Everything is SQUARED sensitivity with clip norm
zeta = 1. The sensitivity of a pattern pi with per-round contributions u_t (||u_t|| <= 1, rows outside
pi zero) is sup ||C u||_F^2 = sup tr(u^T X_{pi,pi} u) (BandMF paper Eq. 2); when X >= 0 elementwise
the sup is sum_{i,j in pi} X_ij = ||C u(pi)||^2, and in general sum_{i,j in pi} |X_ij| bounds it
(BandMF paper Eq. 5).

Holds (BandMF paper Sec. 3 and App. E, BLT paper Sec. 3.1):
  * `vec_sens`: max over patterns of <v, u(pi)> (BandMF Alg. 3), O(nk), signs matter;
  * `single_participation_squared`: max column norm^2 (exact for k = 1);
  * `banded_squared`: exact when X_ij = 0 for |i - j| >= b (BandMF Alg. 5 / Thm. 2);
  * `min_sep_upper_bound_squared`: a valid upper bound for any C (BandMF Alg. 4 / Thm. 3), O(n^2 k);
  * `fixed_epoch_squared`: (k, b) fixed-epoch participation (BandMF Eq. 5 per epoch pattern), exact when
    X >= 0 on the patterns;
  * `toeplitz_squared`: BLT paper Thm. 3.1, O(kn), exact for non-negative non-increasing coefficients,
    otherwise an upper bound via the non-increasing majorant of |c|;
  * `dense_squared` / `dense_method`: a dispatcher for a dense C choosing the exact method when one
    applies and Alg. 4 otherwise, and saying which it used.
"""

from typing import NamedTuple

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import toeplitz

# Rows of |X| processed at once by Alg. 4, sized to keep the working array near 32 MB.
_ALG4_ELEMENTS_PER_CHUNK = 4_000_000


def _check_strategy_matrix(strategy_matrix) -> np.ndarray:
  return _validation.check_float_array(strategy_matrix, 'strategy_matrix', ndim=2)


def _vec_sens_rows(values: np.ndarray, min_sep: int, num_participations: int) -> np.ndarray:
  """VecSens of every row of `values` (shape (m, n)); see `vec_sens`."""
  m, n = values.shape
  # f[:, i] after p passes = best sum of at most p picks among rounds >= i (0 for i >= n).
  f = np.zeros((m, n + min_sep))
  for _ in range(num_participations):
    f[:, :n] = values + f[:, min_sep:min_sep + n]  # pick round i, next pick at >= i + b
    f = np.maximum.accumulate(f[:, ::-1], axis=1)[:, ::-1]  # or skip round i
  return f[:, 0]


def vec_sens(vector, min_sep: int, max_participations=None) -> float:
  """max over b-min-sep patterns pi with |pi| <= k of <v, u(pi)> (BandMF paper Alg. 3).

  The empty pattern is allowed, so the result is >= 0; entries of v may be negative.

  Args:
    vector: v, shape (n,).
    min_sep: b >= 1.
    max_participations: k >= 1, or None for ceil(n / b). Capped at ceil(n / b).

  Returns:
    The maximum, as float.
  """
  v = _validation.check_float_array(vector, 'vector', ndim=1)
  schema = participation_lib.ParticipationSchema(min_sep=min_sep,
                                                 max_participations=max_participations)
  k = schema.effective_max_participations(v.size)
  return float(_vec_sens_rows(v[np.newaxis, :], schema.min_sep, k)[0])


def single_participation_squared(strategy_matrix) -> float:
  """max_j ||C[:, j]||^2: the exact squared sensitivity when each client participates at most once."""
  c = _check_strategy_matrix(strategy_matrix)
  return float(np.max(np.sum(c**2, axis=0)))


def _orthogonality_beyond(c: np.ndarray, min_sep: int):
  """(ok, gram): ok is True if (C^T C)_{ij} = 0 exactly for all |i - j| >= min_sep.

  Cheap structural test first: if every column at distance >= b after column j has its first nonzero
  row below column j's last nonzero row, the supports are disjoint (true for lower-triangular C with
  at most b bands) and gram is None. Otherwise the Gram matrix is formed, checked entry by entry and
  returned for reuse.
  """
  n = c.shape[1]
  if min_sep >= n:
    return True, None
  nonzero = c != 0
  has_any = nonzero.any(axis=0)
  rows = c.shape[0]
  first = np.where(has_any, np.argmax(nonzero, axis=0), rows)
  last = np.where(has_any, rows - 1 - np.argmax(nonzero[::-1], axis=0), -1)
  later_first = np.minimum.accumulate(first[::-1])[::-1]  # min first row over columns >= i
  if np.all(later_first[min_sep:] > last[:n - min_sep]):
    return True, None
  gram = c.T @ c
  return not np.any(np.tril(gram, -min_sep)), gram  # symmetric: one triangle suffices


def banded_squared(strategy_matrix, participation) -> float:
  """Exact squared sensitivity when columns of C that are >= b apart are orthogonal (BandMF Alg. 5).

  With X_ij = 0 for |i - j| >= b (e.g. lower-triangular C with at most b bands), the columns of any
  admissible pattern are orthogonal, so sens^2 = max_pi sum_{i in pi} ||C[:, i]||^2 = VecSens(diag X)
  (fixed-epoch: the best epoch pattern). With k = 1 no two columns meet and any C is accepted.

  Raises:
    ValueError: if C has a non-zero Gram entry at |i - j| >= b while k >= 2.
  """
  c = _check_strategy_matrix(strategy_matrix)
  participation = participation_lib.check_participation(participation)
  n = c.shape[1]
  k = participation.effective_max_participations(n)
  if k > 1 and not _orthogonality_beyond(c, participation.min_sep)[0]:
    raise ValueError(f'`strategy_matrix` has non-orthogonal columns at distance >= min_sep='
                     f'{participation.min_sep}; use min_sep_upper_bound_squared or dense_squared.')
  col_sq = np.sum(c**2, axis=0)
  if participation.fixed_epoch:
    return float(np.max(_epoch_sums(col_sq, participation.min_sep, k)))
  return float(_vec_sens_rows(col_sq[np.newaxis, :], participation.min_sep, k)[0])


def min_sep_upper_bound_squared(strategy_matrix, participation) -> float:
  """BandMF Alg. 4: VecSens(v) with v_i = VecSens(|X[i, :]|); an upper bound for any C.

  It bounds the Eq. 5 value max_pi sum_{i,j in pi} |X_ij| (each row may pick its own columns), which
  bounds the true squared sensitivity. Valid for fixed-epoch schemas too (their patterns are b-min-sep
  patterns). Not exact even for banded X (a row may pick two in-band entries b apart, or an
  off-diagonal entry larger than X_ii): use `banded_squared` there. O(n^2 k) time, in row chunks.
  """
  c = _check_strategy_matrix(strategy_matrix)
  participation = participation_lib.check_participation(participation)
  return _alg4_from_gram(c.T @ c, participation)


def _alg4_from_gram(gram: np.ndarray, participation) -> float:
  n = gram.shape[0]
  b = participation.min_sep
  k = participation.effective_max_participations(n)
  abs_gram = np.abs(gram)
  chunk = max(1, _ALG4_ELEMENTS_PER_CHUNK // (n + b))
  row_values = np.concatenate([
      _vec_sens_rows(abs_gram[start:start + chunk], b, k) for start in range(0, n, chunk)
  ])
  return float(_vec_sens_rows(row_values[np.newaxis, :], b, k)[0])


def _epoch_indices(num_rounds: int, min_sep: int, num_participations: int):
  """(index, mask) of shape (min(b, n), k): rounds j + i b of epoch offset j, mask = inside [0, n)."""
  offsets = np.arange(min(min_sep, num_rounds))[:, np.newaxis]
  index = offsets + min_sep * np.arange(num_participations)[np.newaxis, :]
  mask = index < num_rounds
  return np.where(mask, index, 0), mask


def _epoch_sums(values: np.ndarray, min_sep: int, num_participations: int) -> np.ndarray:
  """sum_i values[j + i b] over each epoch pattern j."""
  index, mask = _epoch_indices(values.size, min_sep, num_participations)
  return np.sum(np.where(mask, values[index], 0.0), axis=1)


def _epoch_blocks(c: np.ndarray, participation) -> np.ndarray:
  """X restricted to each epoch pattern: shape (min(b, n), k, k), zero outside [0, n)."""
  n = c.shape[1]
  k = participation.effective_max_participations(n)
  index, mask = _epoch_indices(n, participation.min_sep, k)
  cols = np.where(mask[np.newaxis, :, :], c[:, index], 0.0)  # (r, offsets, k)
  return np.einsum('rjp,rjq->jpq', cols, cols)


def _require_fixed_epoch(participation) -> None:
  if not participation.fixed_epoch:
    raise ValueError(f'`participation` must be a fixed-epoch schema, got {participation}.')


def fixed_epoch_squared(strategy_matrix, participation) -> float:
  """(k, b) fixed-epoch squared sensitivity: max_j sum_{p,q} |X_{j+pb, j+qb}| (BandMF Eq. 5).

  Exact when X >= 0 on every epoch pattern (then the full pattern with equal unit vectors is worst);
  an upper bound otherwise. O(r n k) time: only the k x k blocks of X on the patterns are formed.

  Raises:
    ValueError: if `participation` is not a fixed-epoch schema.
  """
  c = _check_strategy_matrix(strategy_matrix)
  participation = participation_lib.check_participation(participation)
  _require_fixed_epoch(participation)
  return float(np.max(np.sum(np.abs(_epoch_blocks(c, participation)), axis=(1, 2))))


def fixed_epoch_is_exact(strategy_matrix, participation) -> bool:
  """True when `fixed_epoch_squared` is exact: X >= 0 on every epoch pattern."""
  c = _check_strategy_matrix(strategy_matrix)
  participation = participation_lib.check_participation(participation)
  _require_fixed_epoch(participation)
  return bool(np.all(_epoch_blocks(c, participation) >= 0))


def _toeplitz_exact_case(c: np.ndarray, participation, k: int) -> bool:
  if k == 1:
    return True
  if np.any(c < 0):
    return False
  return participation.fixed_epoch or bool(np.all(np.diff(c) <= 0))


def toeplitz_is_exact(coefs, num_rounds: int, participation) -> bool:
  """True when `toeplitz_squared` is exact, False when it is the majorant upper bound.

  Exact cases: k = 1; non-negative, non-increasing coefficients (BLT Thm. 3.1); non-negative
  coefficients under a fixed-epoch schema.
  """
  c = toeplitz.padded_coefs(coefs, num_rounds)
  participation = participation_lib.check_participation(participation)
  return _toeplitz_exact_case(c, participation, participation.effective_max_participations(c.size))


def toeplitz_squared(coefs, num_rounds: int, participation) -> float:
  """Squared sensitivity of C = LtToep(coefs) over n = `num_rounds` rounds, O(kn) (BLT Thm. 3.1).

  Returns ||C u(pi*)||^2 with pi* = (0, b, ..., (k-1) b), the sum of k shifted copies of c. This is:
    * exact for c >= 0 non-increasing under b-min-sep (Kalinin & Lampert Thm. 2 = BLT Thm. 3.1);
    * exact for c >= 0 under fixed-epoch participation (the epoch at offset j has the same sums as
      offset 0 restricted to the first n - j rows, so offset 0 is worst, and C >= 0);
    * exact for k = 1 (||c||^2, the first column is the longest).
  Otherwise the same formula is applied to the non-increasing majorant m_i = max_{j >= i} |c_j|: since
  |X_ij| <= (LtToep(m)^T LtToep(m))_ij elementwise, the Eq. 5 bound of C is at most the exact
  sensitivity of LtToep(m), so the result is an UPPER BOUND (never an underestimate).
  See `toeplitz_is_exact`.
  """
  c = toeplitz.padded_coefs(coefs, num_rounds)
  participation = participation_lib.check_participation(participation)
  n = c.size
  k = participation.effective_max_participations(n)
  if not _toeplitz_exact_case(c, participation, k):
    c = np.maximum.accumulate(np.abs(c)[::-1])[::-1]
  column_sum = strided_window_sum(c, participation.min_sep, k)
  return float(np.dot(column_sum, column_sum))


def strided_window_sum(values: np.ndarray, min_sep: int, count: int) -> np.ndarray:
  """out[t] = sum_{p < count, p b <= t} values[t - p b] (C u(pi*) for C = LtToep(values) and
  pi* = (0, b, ..., (count - 1) b)), in O(n) time and memory rather than O(count n).

  The padded vector is viewed as rows of length b; out is the sum of the last `count` rows up to
  each row. With count >= the number of rows it is a running sum down the rows. Otherwise the rows
  are cut into blocks of `count` rows, and a window is the sum from its first row to the end of that
  row's block plus the sum from the next block's start to its last row (a running sum backwards
  and one forwards within the blocks): additions only, no difference of running sums, so no
  cancellation.
  """
  values = np.asarray(values, dtype=np.float64)
  min_sep = _validation.check_positive_int(min_sep, 'min_sep')
  count = _validation.check_positive_int(count, 'count')
  n = values.size
  rows = -(-n // min_sep)
  if count >= rows:
    padded = np.zeros(rows * min_sep)
    padded[:n] = values
    return np.cumsum(padded.reshape(rows, min_sep), axis=0).ravel()[:n]
  blocks = -(-rows // count)
  padded = np.zeros(blocks * count * min_sep)
  padded[:n] = values
  grid = padded.reshape(blocks, count, min_sep)
  out = np.cumsum(grid, axis=1).reshape(blocks * count, min_sep)  # block start .. row
  backward = np.cumsum(grid[:, ::-1], axis=1)[:, ::-1].reshape(blocks * count, min_sep)  # row .. block end
  last = np.arange(count, blocks * count)
  last = last[(last + 1) % count != 0]  # a window ending on a block's last row is that block
  out[last] += backward[last - count + 1]
  return out.ravel()[:n]


class DenseMethod(NamedTuple):
  """Which formula `dense_squared` uses for a given C and schema, and whether it is exact."""
  name: str  # 'single', 'banded', 'fixed_epoch' or 'min_sep_upper_bound'
  exact: bool


def _dense_plan(c: np.ndarray, participation):
  """(DenseMethod, Gram matrix if it was formed, else None) for a validated C."""
  if not participation.fixed_epoch and participation.is_single_participation(c.shape[1]):
    return DenseMethod('single', True), None
  orthogonal, gram = _orthogonality_beyond(c, participation.min_sep)
  if orthogonal:
    return DenseMethod('banded', True), gram
  if participation.fixed_epoch:
    return DenseMethod('fixed_epoch', fixed_epoch_is_exact(c, participation)), gram
  return DenseMethod('min_sep_upper_bound', False), gram


def dense_method(strategy_matrix, participation) -> DenseMethod:
  """The method `dense_squared` applies: the exact one when available, BandMF Alg. 4 otherwise.

  Order: single participation (k = 1 under b-min-sep, exact); columns >= b apart orthogonal (Alg. 5,
  exact; for fixed-epoch the epoch formula, exact); fixed-epoch (exact iff X >= 0 on the patterns;
  this also covers k = 1, where only the first b rounds are admissible); Alg. 4 (upper bound).
  """
  c = _check_strategy_matrix(strategy_matrix)
  return _dense_plan(c, participation_lib.check_participation(participation))[0]


def dense_squared(strategy_matrix, participation) -> float:
  """Squared sensitivity of a dense C (clip norm 1): exact where possible, else an upper bound.

  See `dense_method` for the choice and `dense_squared_is_exact` for whether the value is exact.
  """
  c = _check_strategy_matrix(strategy_matrix)
  participation = participation_lib.check_participation(participation)
  method, gram = _dense_plan(c, participation)
  if method.name == 'single':
    return single_participation_squared(c)
  if method.name == 'banded':
    return banded_squared(c, participation)
  if method.name == 'fixed_epoch':
    return fixed_epoch_squared(c, participation)
  return _alg4_from_gram(gram, participation)


def dense_squared_is_exact(strategy_matrix, participation) -> bool:
  """True when `dense_squared` returns the exact value, False when it returns an upper bound."""
  return dense_method(strategy_matrix, participation).exact
