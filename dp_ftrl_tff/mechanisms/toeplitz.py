"""Lower-triangular Toeplitz helpers (float64).

A lower-triangular Toeplitz matrix C = LtToep(c) in R^{n x n} has C_{ij} = c_{i-j} for i >= j and 0
above the diagonal (the BLT paper prints "i <= j", a typo). Rounds are 0-based, t = 0 .. n-1.
Coefficient vectors shorter than n are padded with zeros (a banded Toeplitz matrix); longer ones are
truncated to n.

Holds:
  * `materialize`: the dense n x n matrix;
  * `inverse_coefs`: the coefficients of C^-1 (itself lower-triangular Toeplitz), by Newton iteration
    on the power series 1 / c(x), O(n log n);
  * `errors_from_noise_coefs`: MaxError and RmsError of the decoder B = A C^-1 from the coefficients
    c_hat of C^-1 (BLT paper Prop. 3.3, after McKenna's Prop. 3.1). B = LtToep(b) with the INCLUSIVE
    cumulative sum b_i = sum_{j <= i} c_hat_j (the paper's printed index is a typo; b_0 = c_hat_0), so
    MaxError = sqrt(sum_i b_i^2) (the last row is the longest) and
    RmsError = sqrt(sum_i (n - i) b_i^2 / n) (b_i appears in the n - i rows i .. n-1).
"""

import numpy as np
import scipy.linalg

from dp_ftrl_tff import _validation


def padded_coefs(coefs, num_rounds: int) -> np.ndarray:
  """`coefs` as a float64 vector of length `num_rounds` (zero-padded or truncated).

  Raises:
    ValueError: if `coefs` is not a non-empty finite 1-D array or `num_rounds` is not positive.
  """
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  coefs = _validation.check_float_array(coefs, 'coefs', ndim=1)
  out = np.zeros(num_rounds)
  m = min(num_rounds, coefs.size)
  out[:m] = coefs[:m]
  return out


def materialize(coefs, num_rounds: int) -> np.ndarray:
  """LtToep(coefs): the n x n matrix with C_{ij} = coefs[i - j] for i >= j, else 0."""
  c = padded_coefs(coefs, num_rounds)
  return scipy.linalg.toeplitz(c, np.zeros(num_rounds))


def inverse_coefs(coefs, num_rounds: int) -> np.ndarray:
  """Coefficients c_hat (length n) with LtToep(c_hat) = LtToep(coefs)^-1.

  c_hat is the power series 1 / c(x) truncated to n terms. Newton's iteration
  g <- g - g (c g - 1) doubles the number of correct terms per step; each step is two convolutions
  (FFT-based when large), so the total cost is O(n log n).

  Raises:
    ValueError: if `coefs[0]` is zero (C is singular).
  """
  # scipy.signal takes about 0.5 s to import: imported here, not with the module, so that the
  # binaries (which import the mechanisms to define their flags) answer `--help` quickly.
  import scipy.signal  # pylint: disable=g-import-not-at-top
  c = padded_coefs(coefs, num_rounds)
  if c[0] == 0.0:
    raise ValueError('`coefs[0]` must be non-zero for LtToep(coefs) to be invertible.')
  inv = np.array([1.0 / c[0]])
  m = 1
  while m < num_rounds:
    m2 = min(2 * m, num_rounds)
    residual = scipy.signal.convolve(c[:m2], inv)[:m2]  # c g; equals 1, 0, ..., 0 below index m.
    correction = scipy.signal.convolve(inv, residual[m:m2])[:m2 - m]
    inv = np.concatenate([inv, -correction])
    m = m2
  return inv


def errors_from_noise_coefs(noise_coefs) -> tuple:
  """(MaxError, RmsError) of B = A LtToep(noise_coefs), with n = len(noise_coefs).

  Args:
    noise_coefs: c_hat, the Toeplitz coefficients of the noise matrix C^-1 (length n = num_rounds).

  Returns:
    (sqrt(sum_i b_i^2), sqrt(sum_i (n - i) b_i^2 / n)) with b = cumsum(c_hat) (inclusive).
  """
  noise_coefs = _validation.check_float_array(noise_coefs, 'noise_coefs', ndim=1)
  n = noise_coefs.size
  b_sq = np.cumsum(noise_coefs)**2
  max_error = np.sqrt(np.sum(b_sq))
  rms_error = np.sqrt(np.sum((n - np.arange(n)) * b_sq) / n)
  return float(max_error), float(rms_error)
