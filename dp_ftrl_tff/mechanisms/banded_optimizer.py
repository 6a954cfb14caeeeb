"""The BandMF optimizer: `optimize_banded`, a banded C minimizing the workload error.

BandMF paper (Choquette-Choo et al. 2023, arXiv:2306.08153), Sec. 4, Problem 2: minimize the
prefix-sum error ||A C^-1||_F^2 over banded C with equal column norms (diag(C^T C) = 1); Sec. 5.8:
other workloads (`base.momentum_workload`). Banded Toeplitz C (one coefficient per band, McKenna
2024, "BandToep") via `toeplitz=True`. The row errors and their gradient come from
`banded.RowErrors` (O(n q^2) per evaluation, never an n x n matrix).

Schedule (prefix sums, b-hat >= 40): coarse to fine. The optimum C of (n, b-hat) looks like
the optimum of (n / 2, b-hat / 2) stretched by 2 in both directions, once each column is divided by
the Toeplitz square root of A (docs/papers.md#bsr): at n = 2052, 342 bands the stretched 1026 / 171
optimum has RmsLoss 8.5955, the fine optimum 8.5952, the banded Toeplitz start 8.746. So the
optimizer solves 129 / 22, 257 / 43, ..., n / b-hat in turn (`_level_sizes`), each stage started
from the previous optimum (`_interpolate_band_rows`); the cheap coarse stages do most of the work
and the full-size stage needs 19 ('rms') and 31 ('max') evaluations at n = 2052, where the single
stage from the Toeplitz start needed 104 and 151 (docs/benchmarks/banded.md).
"""

import math
import time
from typing import Optional

import numpy as np
import scipy.linalg
import scipy.optimize

from dp_ftrl_tff import _validation, stopping
from dp_ftrl_tff.mechanisms import banded, base, memory
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import toeplitz as toeplitz_lib
from dp_ftrl_tff.mechanisms.banded import BandedStrategy, fhu_coefficients

_ERRORS = ('rms', 'max')
# Smooth maximum for error='max' with a general banded C: the p-mean of the row errors ||B_i||^2.
# Its minimizer's largest row error falls as p grows, its conditioning worsens: at n = 2052, 342
# bands, fully converged, MaxLoss 9.235 (p = 64), 9.173 (128), 9.139 (256), 9.121 (512), the last
# two at 2 to 3 times the evaluations of p = 128.
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

# The banded Toeplitz stage treats a C whose inverse has a coefficient above this magnitude as
# outside its domain (objective +inf; L-BFGS-B shortens the step). An unstable trial C (a root of
# c(x) inside the unit circle) has inverse coefficients growing geometrically, past float64 at
# n = 1024 for c = (1, 2); such a C has a log objective above 2 log(1e100) = 460, while the optimum's
# is at most that of C = I, log((n + 1) / 2) (< 14 for n <= 2^20), so the optimum is never excluded,
# and every square and product below (beta^2, r * r: at most n^2 1e200) stays finite.
_MAX_INVERSE_COEF = 1e100


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
  if not np.max(np.abs(r)) <= _MAX_INVERSE_COEF:  # also NaN (an overflowed series)
    return np.inf, np.zeros_like(coefs)
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
  from `banded.RowErrors` on D = C A^-1 (b-hat + w - 1 bands for a w-banded A^-1): O(n (b-hat + w)^2) per
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
    self._layout = banded.BlockLayout(num_rounds, num_bands + self._inverse_rows.shape[1] - 1, banded.ROW_BLOCK)

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
    return banded.dense_from_band_rows(self.band_rows(params))

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
      row_errors = banded.RowErrors(d_rows, self._layout)
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
    stopping.check()  # each evaluation is a stop point (dp_ftrl_tff.stopping)
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

  General (`toeplitz=False`, `_optimize_general`): C lower triangular with `num_bands` bands and
  unit column norms (diag(C^T C) = 1), minimizing the workload error of B = A C^-1 (the mean of
  ||B_i||^2 for 'rms', a smooth maximum for 'max') by L-BFGS over the band entries. With `num_bands`
  <= `min_sep` the squared sensitivity is exactly k_eff for every candidate (BandMF Thm. 2), so the
  error is the loss up to that constant; with more bands the reported losses use the Alg. 4 bound.

  Toeplitz (`toeplitz=True`): C[t, t - j] = c_j for j < `num_bands`, L-BFGS over c minimizing
  k_eff ||c||^2 Error^2 (||c||^2 is the largest column norm; exact error: 'max' is the last row),
  started from the sqrt(A) coefficients 1, 1/2, 3/8, ... (`_toeplitz_stage`).

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
    tolerance: relative objective decrease per iteration below which L-BFGS stops (over one
      iteration in the banded Toeplitz stage, on average over the last 5 in the general stages,
      `_minimize`). None: 1e-7 (Toeplitz stage), 1e-6 ('rms') or 1e-5 ('max') (general stages).
    initial: optional `BandedStrategy` with `num_bands` bands and n rounds to start the general
      optimizer from (not with `toeplitz=True`).

  Returns:
    `base.OptimizationResult` with the prefix-sum `Losses` under `participation`; `details` holds
    'error', 'toeplitz', the optimizer diagnostics ('toeplitz_stage', and for the general C 'levels'
    and 'banded_stage', see `_optimize_general`) and the optimized 'workload_error'.
  """
  start = time.monotonic()
  given_bands = num_bands is not None
  num_bands = _check_arguments(num_rounds, num_bands, participation, toeplitz, error,
                               max_iterations, max_seconds, tolerance, initial)
  if max_seconds is None:
    check_optimization_cost(num_rounds, num_bands, toeplitz, given_bands)
  work = _Workload(num_rounds, workload)
  if toeplitz:
    strategy, diagnostics = _optimize_toeplitz(num_rounds, num_bands, work, error, max_iterations,
                                               tolerance)
  else:
    deadline = None if max_seconds is None else start + max_seconds
    strategy, diagnostics = _optimize_general(num_rounds, num_bands, work, error, initial,
                                              max_iterations, deadline, tolerance)
  details = {'error': error, 'toeplitz': toeplitz, **diagnostics,
             'workload_error': _workload_error(strategy, work, error)}
  return base.OptimizationResult(strategy=strategy, losses=_losses(strategy, participation),
                                 num_rounds=num_rounds, participation=participation,
                                 seconds=time.monotonic() - start, details=details)


def _optimize_toeplitz(num_rounds: int, num_bands: int, work: _Workload, error: str,
                       max_iterations: int, tolerance: Optional[float]) -> tuple:
  """(the banded Toeplitz optimum of the workload's own error, {'toeplitz_stage': details})."""
  band_rows, stage = _toeplitz_stage((num_rounds, num_bands), work, error, True, max_iterations,
                                     _TOEPLITZ_TOLERANCE if tolerance is None else tolerance)
  return BandedStrategy.from_toeplitz(band_rows[-1], num_rounds), {'toeplitz_stage': stage}


def _optimize_general(num_rounds: int, num_bands: int, work: _Workload, error: str,
                      initial: Optional[BandedStrategy], max_iterations: int,
                      deadline: Optional[float], tolerance: Optional[float]) -> tuple:
  """(the general banded optimum, diagnostics) for `optimize_banded(toeplitz=False)`.

  The objective is the mean of the row errors ||B_i||^2 for 'rms' and their p-mean with p = 128
  for 'max' (a smooth maximum, `_row_weights`), minimized by L-BFGS with analytic gradients in the
  stages of `_stages`, the first started from `initial` or else from the column-normalized banded
  Toeplitz optimum (`_toeplitz_stage`). `deadline` (a `time.monotonic()` value) bounds the general
  stages. Diagnostics: 'toeplitz_stage' (without `initial`), 'banded_stage' and 'levels', one dict
  per stage with n, bands, evaluations, iterations, message and seconds, the last being
  'banded_stage'.
  """
  diagnostics = {}
  sizes, stage_work = _stages(num_rounds, num_bands, initial, work)
  if initial is None:
    band_rows, diagnostics['toeplitz_stage'] = _toeplitz_stage(
        sizes[0], work, error, False, max_iterations,
        _TOEPLITZ_TOLERANCE if tolerance is None else tolerance)
  else:
    band_rows = np.array(initial.band_rows)
  remaining = None if deadline is None else deadline - time.monotonic()
  band_rows, levels = _general_stages(band_rows, sizes, stage_work, error, max_iterations, remaining,
                                      _GENERAL_TOLERANCE[error] if tolerance is None else tolerance)
  diagnostics['banded_stage'], diagnostics['levels'] = levels[-1], levels
  return BandedStrategy.from_band_rows_unchecked(band_rows), diagnostics


def _stages(num_rounds: int, num_bands: int, initial: Optional[BandedStrategy],
            work: _Workload) -> tuple:
  """(sizes, workload) of the general optimizer: the stages (n, b-hat), coarsest first, and the
  workload they minimize the error of (None: the prefix sums at each stage's own n).

  For the prefix sums (no `workload`, or the all-ones lower triangle) with at least
  2 `_COARSEST_BANDS` = 40 bands and no `initial`: coarse to fine (module docstring), stages
  (n, b-hat) halved until b-hat < 40 (`_level_sizes`), each finer one started from the previous
  optimum stretched (`_interpolate_band_rows`); every stage runs L-BFGS to its own stopping test.
  Otherwise the one stage (n, b-hat) with the given workload.
  """
  if initial is None and work.is_prefix_sums and num_bands >= 2 * _COARSEST_BANDS:
    return _level_sizes(num_rounds, num_bands), None
  return [(num_rounds, num_bands)], work


# The optimizer's cost on this project's machine type (2 cores, BLAS; time.perf_counter). One
# evaluation of the row errors of a b-hat-banded C over n rounds (`banded.RowErrors`) takes about
# 0.2 ns n b-hat^2 (5.5 s at n = b-hat = 3000), and L-BFGS's work is O(n b-hat) per step. Whole
# general optimizations took 4.2 s (n = 1000, b-hat = 100), 8.5 s (2052, 342), 9.1 s (1000, 1000),
# 18 s (3000, 256), 41 s (3000, 1024 and 2048) and 39 s (3000, 3000): at least 4 us n b-hat, and at
# least 5 row-error evaluations, 1 ns n b-hat^2; a banded Toeplitz optimization evaluates the row
# errors about twice for its reported losses (10.3 s at 3000, 3000), at least 0.3 ns n b-hat^2.
# These are lower bounds of the time: a size refused by them would take longer still.
_SECONDS_PER_N_BANDS = {False: 4e-6, True: 0.0}
_SECONDS_PER_N_BANDS_SQUARED = {False: 1e-9, True: 0.3e-9}


def optimization_seconds(num_rounds: int, num_bands: int, toeplitz: bool = False) -> float:
  """A lower bound of the seconds `optimize_banded` takes for `num_bands` = b-hat bands over
  `num_rounds` = n: the larger of 4 us n b-hat and 1 ns n b-hat^2 (general), or 0.3 ns n b-hat^2
  (Toeplitz); see above."""
  n = float(_validation.check_positive_int(num_rounds, 'num_rounds'))
  bands = float(_validation.check_positive_int(num_bands, 'num_bands'))
  toeplitz = bool(toeplitz)
  return max(_SECONDS_PER_N_BANDS[toeplitz] * n * bands,
             _SECONDS_PER_N_BANDS_SQUARED[toeplitz] * n * bands**2)


def check_optimization_cost(num_rounds: int, num_bands: int, toeplitz: bool = False,
                            given: bool = True) -> None:
  """Raises `memory.ComputeLimitError` (a ValueError) when `optimization_seconds` exceeds
  `memory.MAX_SECONDS`, naming `num_bands` (`given`: passed by the caller; else the default
  min(`min_sep`, `num_rounds`)) and `num_rounds`, with the most bands within the limit."""
  seconds = optimization_seconds(num_rounds, num_bands, toeplitz)
  toeplitz = bool(toeplitz)
  linear, quadratic = _SECONDS_PER_N_BANDS[toeplitz], _SECONDS_PER_N_BANDS_SQUARED[toeplitz]
  most = int(math.sqrt(memory.MAX_SECONDS / (quadratic * num_rounds)))
  if linear:
    most = min(most, int(memory.MAX_SECONDS / (linear * num_rounds)))
  what = (f'`num_bands`={num_bands}' + ('' if given else ' (the default, min(`min_sep`, '
                                                          '`num_rounds`))')
          + f' at `num_rounds`={num_rounds}')
  model = (f'at least {quadratic * 1e9:g} ns n b-hat^2' if not linear else
           f'at least max({linear * 1e6:g} us n b-hat, {quadratic * 1e9:g} ns n b-hat^2)')
  memory.check_seconds(
      seconds, f'{what}: the {"banded Toeplitz" if toeplitz else "BandMF"} optimizer, {model},',
      f'use at most {max(most, 1)} bands (`num_bands`) or fewer `num_rounds`'
      + ('.' if toeplitz else ', or the banded Toeplitz optimizer (`toeplitz`).'))


def _check_arguments(num_rounds, num_bands, participation, toeplitz, error, max_iterations,
                     max_seconds, tolerance, initial) -> int:
  """Validates `optimize_banded`'s arguments (each ValueError names one); returns b-hat."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  participation = participation_lib.check_participation(participation)
  if num_bands is None:
    num_bands = min(participation.min_sep, num_rounds)
  num_bands = _validation.check_positive_int(num_bands, 'num_bands')
  if num_bands > num_rounds:
    raise ValueError(f'`num_bands`={num_bands} must not exceed `num_rounds`={num_rounds}.')
  if not isinstance(toeplitz, bool):
    raise ValueError(f'`toeplitz` must be a bool, got {toeplitz!r}.')
  _validation.check_one_of(error, 'error', _ERRORS)
  _validation.check_positive_int(max_iterations, 'max_iterations')
  if max_seconds is not None:
    _validation.check_positive_float(max_seconds, 'max_seconds')
  if tolerance is not None:
    _validation.check_positive_float(tolerance, 'tolerance')
  if initial is not None and (not isinstance(initial, BandedStrategy)
                              or initial.num_bands != num_bands
                              or initial.max_rounds != num_rounds):
    raise ValueError(f'`initial` must be a BandedStrategy with {num_bands} bands and {num_rounds} '
                     f'rounds, got {initial!r}.')
  if initial is not None and toeplitz:
    raise ValueError('`initial` applies to the general optimizer only, not with `toeplitz=True`.')
  return num_bands


def _toeplitz_stage(size: tuple, work: '_Workload', error: str, toeplitz: bool,
                    max_iterations: int, tolerance: float) -> tuple:
  """(band rows of the column-normalized banded Toeplitz optimum at `size` = (n, b-hat), details).

  The optimum of the workload's own error with `toeplitz`, else the prefix-sum 'rms' optimum as the
  general optimizer's start (also for a workload that is not Toeplitz).
  """
  start_rounds, start_bands = size
  workload_coefs = work.toeplitz_coefs(start_rounds)
  if workload_coefs is None:
    if toeplitz:
      raise ValueError('`workload` must be Toeplitz for `toeplitz=True`.')
    workload_coefs = np.ones(start_rounds)
  coefs, details = _minimize(
      lambda c: _toeplitz_objective(c, start_rounds, workload_coefs, error if toeplitz else 'rms'),
      fhu_coefficients(start_bands), max_iterations, None, tolerance)
  coefs = coefs / coefs[0]
  band_rows = np.where(np.arange(start_rounds)[:, None] >= np.arange(start_bands)[None, :],
                       coefs[None, :], 0.0)
  return band_rows, details


def _general_stages(band_rows: np.ndarray, sizes: list, work: Optional['_Workload'], error: str,
                    max_iterations: int, max_seconds: Optional[float], tolerance: float) -> tuple:
  """(band rows, one details dict per stage) of the general optimizer over the stages `sizes`,
  started from `band_rows`; `work` None means the prefix sums at every stage (coarse to fine)."""
  start = time.monotonic()
  num_rounds, num_bands = sizes[-1]
  levels = []
  for level, (level_rounds, level_bands) in enumerate(sizes):
    if level:
      band_rows = _interpolate_band_rows(band_rows, level_rounds, level_bands)
    objective = _BandedObjective(level_rounds, level_bands,
                                 _Workload(level_rounds, None) if work is None else work, error)
    remaining = None if max_seconds is None else max(0.0, max_seconds - (time.monotonic() - start))
    params = objective.params_from_band_rows(band_rows)
    # L-BFGS-B's first trial step has unit length along -gradient. With unit columns that moves C
    # by about 1 / sqrt(n) relative (2% at n = 2052), far outside the region where the objective is
    # quadratic: the line search backtracks for several evaluations and can leave so small a first
    # decrease that a per-iteration ftol test ends the stage after one iteration (every level). The
    # objective does not depend on column scales, so columns of norm `_START_COLUMN_NORM` shrink that
    # first step; from the second iteration on L-BFGS scales its steps from the curvature itself.
    params *= _START_COLUMN_NORM / objective.column_norms(params)[objective.cols]
    params, info = _minimize(objective.value_and_grad, params, max_iterations, remaining,
                             tolerance, _LBFGS_MEMORY, _STOPPING_WINDOW)
    band_rows = objective.band_rows(params)
    levels.append(dict(info, num_rounds=level_rounds, num_bands=level_bands,
                       seconds=time.monotonic() - start))
    if info['message'] == 'time limit reached' and level < len(sizes) - 1:
      band_rows = _interpolate_band_rows(band_rows, num_rounds, num_bands)
      break
  return band_rows, levels


def _losses(strategy: BandedStrategy,
            participation: participation_lib.ParticipationSchema) -> base.Losses:
  """`strategy.losses` over its n rounds, through the O(n b-hat) band sensitivity where it
  applies (`banded.band_sensitivity_squared`) instead of the n x n route."""
  num_rounds = strategy.max_rounds
  sens_sq = banded.band_sensitivity_squared(np.asarray(strategy.band_rows), participation)
  if sens_sq is None:
    return strategy.losses(num_rounds, participation)
  max_error, rms_error = strategy.errors(num_rounds)
  sens = float(np.sqrt(sens_sq))
  return base.Losses(max_loss=max_error * sens, rms_loss=rms_error * sens,
                     sensitivity_squared=sens_sq)


def _workload_error(strategy: BandedStrategy, work: _Workload, error: str) -> float:
  """sqrt of the mean ('rms') or max ('max') of ||(A C^-1)_i||^2 for the optimized workload A.

  Prefix sums: from the band by the O(n b-hat^2) recursion; another workload: densely.
  """
  if work.is_prefix_sums:
    rows = banded.prefix_sum_row_errors(np.asarray(strategy.band_rows))
  else:
    rows = np.sum(work.apply(strategy.noise_matrix(strategy.max_rounds))**2, axis=1)
  return float(np.sqrt(np.mean(rows) if error == 'rms' else np.max(rows)))
