"""Buffered Linear Toeplitz (BLT) strategies: parameters, inverse, losses and the optimizer.

Implements McMahan, Xu, Zhang, "A Hassle-free Algorithm for Private Learning in Practice: Don't Use Tree
Aggregation, Use BLTs" (the BLT paper):
  * Eq. 2: C = LtToep(c), c_0 = 1, c_i = sum_j omega_j theta_j^(i-1) for i >= 1, with buffer decays
    theta in (0, 1]^d and output scales omega (d = `num_buffers`).
  * Sec. 2.4 / Alg. 5: C^-1 is again a d-buffer BLT(theta_hat, omega_hat); theta_hat are the eigenvalues
    of diag(theta) - 1 omega^T, and `calc_output_scale` gives the output scales of either side from the
    two decay vectors in O(d^2). `inverse_parameters` accepts inverse decays in (-1, 1] (the stability
    condition |theta_hat| < 1, or exactly 1): a decay in (-1, 0) is a buffer whose contribution
    alternates in sign while it decays, e.g. theta = (0.9, 0.5, 0.001), omega = (0.1, 0.2, 0.5) has
    theta_hat ~ (0.854, 0.402, -0.655), the pair jax_privacy's BufferedToeplitz tests use.
  * Thm. 3.1: for non-negative, non-increasing c the b-min-sep sensitivity is ||C u(pi*)||_2 with
    pi* = (0, b, ..., (k-1) b).
  * Prop. 3.3 / Alg. 4: MaxLoss and RmsLoss of B = A C^-1 = LtToep(cumsum(c_hat)), differentiable in
    (theta, theta_hat), here with exact hand-derived gradients (`loss_and_gradient`).
  * Sec. 3.3: `optimize_blt` minimizes Alg. 4 plus a log-barrier (strength 1e-7) with L-BFGS in float64.
  * App. A: `PRODUCTION_STRATEGIES`, the three deployed d = 4 BLTs.
  * `limit_normalized_loss`: the n -> inf limit of MaxLoss / sqrt(n ceil(n / b)) (Prop. 3.3 and
    Thm. 3.1 taken to the limit), the n-independent yardstick for optimizations at n = 10^5 .. 10^6.

Conventions: rounds are 0-based (t = 0 .. n-1); `min_sep` = b (two participations r1 < r2 satisfy
r2 - r1 >= b); losses use clip norm 1 and noise multiplier 1 (see `base`). Everything is float64 numpy;
nothing here imports TensorFlow or JAX.

Numerical care near theta = 1: the optimized decays reach 1 - 1e-12 (App. A). The optimizer therefore
works with log-decays (log theta = sum of log-sigmoids, exact far beyond the float64 resolution of theta
itself), forms powers as exp((t - 1) log theta), differences of decays v_l - v_m as
v_l * -expm1(log v_m - log v_l) with the log-ratio summed from its own log-sigmoids, forms the
products of Alg. 5 in extended exponent range (no 0 / 0 when they underflow), and evaluates the
barrier term -log(1 - theta) as -log(-expm1(log theta)). Log-decays need positive decays: the
optimizer's interlaced ones are, while `_coefficients` (C, and a C^-1 whose decays may be negative)
forms signed integer powers theta**t, and `loss_and_gradient` refuses non-positive decays.
"""

import dataclasses
import math
import time
from typing import ClassVar, Dict, Optional, Tuple

import numpy as np
import scipy.optimize
import scipy.special

from dp_ftrl_tff import _validation, stopping
from dp_ftrl_tff.mechanisms import base, memory, toeplitz
from dp_ftrl_tff.mechanisms import participation as participation_lib

_ERRORS = ('max', 'rms')


def _check_vector(values, name: str, length: Optional[int] = None) -> np.ndarray:
  """Returns `values` as a finite 1-D float64 array with at least one entry (and `length` if given),
  each of magnitude at most `_validation.MAX_COEFFICIENT` (the coefficients c_i are sums of d
  omega_j theta_j^(i-1), and the sensitivity sums their squares)."""
  array = _validation.check_float_array(values, name, ndim=1, max_abs=_validation.MAX_COEFFICIENT)
  if length is not None and array.size != length:
    raise ValueError(f'`{name}` must have {length} entries (one per buffer), got {array.size}.')
  return array


def _check_distinct(values: np.ndarray, name: str) -> None:
  if np.unique(values).size != values.size:
    raise ValueError(f'`{name}` must have pairwise distinct entries, got {values.tolist()}.')


def _row_products(factors: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """Row products of `factors` as (mantissa, exponent), product = mantissa * 2**exponent.

  np.frexp splits every factor exactly into m * 2**e with 0.5 <= |m| < 1 (and 0 into 0 * 2**0);
  the product of d mantissas stays above 2**-d in magnitude and the integer exponents add exactly.
  Scaling by powers of two is exact, so the mantissa product rounds as the plain product does
  wherever the plain product stays in the normal range: results are unchanged there, and correct
  where the plain product of d small differences (e.g. d = 8 decays near 1e-60) underflowed to 0.
  """
  mantissas, exponents = np.frexp(factors)
  return np.prod(mantissas, axis=1), np.sum(exponents, axis=1)


def _output_scale_from_differences(cross: np.ndarray, own: np.ndarray) -> np.ndarray:
  """Alg. 5 in product form: omega_i = prod_j cross[i, j] / prod_{j != i} own[i, j].

  With cross[i, j] = theta_i - theta_hat_j and own[i, j] = theta_i - theta_j this is the residue of
  C(x) = prod_j (1 - theta_hat_j x) / prod_j (1 - theta_j x) = 1 + sum_j omega_j x / (1 - theta_j x) at
  x = 1 / theta_i, algebraically identical to the paper's f(1/theta_i) (-theta_i w_i) / z and free of
  divisions by theta. The caller computes the differences accurately (see
  `_decays_and_differences`).

  Both products are formed in extended exponent range (`_row_products`): in plain float64 a product
  of d differences of small decays underflows (to 0 / 0 = nan once numerator and denominator both
  do), although omega_i, a ratio of d and d - 1 such factors, is of the size of one difference.
  """
  numerator, numerator_exponent = _row_products(cross)
  denominator, denominator_exponent = _row_products(own + np.eye(own.shape[0]))
  return np.ldexp(numerator / denominator, numerator_exponent - denominator_exponent)


def calc_output_scale(theta, theta_hat) -> np.ndarray:
  """Alg. 5: the unique omega with BLT(theta, omega)^-1 = BLT(theta_hat, .), in O(d^2).

  `calc_output_scale(theta_hat, theta)` gives the output scales omega_hat of the inverse.

  Args:
    theta: the d buffer decays of C, pairwise distinct (the formula divides by theta_i - theta_j, so
      nearly equal decays lose precision: about 7 digits for the App. A b=100 BLT, whose two smallest
      decays agree to 1e-10).
    theta_hat: the d buffer decays of C^-1 (real; an inverse's lie in (-1, 1] and may be negative).

  Returns:
    omega, float64 array of shape (d,).
  """
  theta = _check_vector(theta, 'theta')
  theta_hat = _check_vector(theta_hat, 'theta_hat', length=theta.size)
  _check_distinct(theta, 'theta')
  cross = theta[:, None] - theta_hat[None, :]
  own = theta[:, None] - theta[None, :]
  return _output_scale_from_differences(cross, own)


def _coefficients(decays: np.ndarray, scales: np.ndarray, num_rounds: int) -> np.ndarray:
  """Eq. 2 for real (decays, scales): (1, sum_j s_j, sum_j s_j d_j, ...), n entries.

  Decays may be negative (an inverse's theta_hat in (-1, 0)): the powers are integer powers d_j**t,
  which keep the sign (-1)**t, never exp(t log d_j).
  """
  coefs = np.empty(num_rounds)
  coefs[0] = 1.0
  exponents = np.arange(num_rounds - 1, dtype=np.int64)
  coefs[1:] = (decays[None, :] ** exponents[:, None]) @ scales
  return coefs


def _check_stable_decays(values: np.ndarray, name: str) -> None:
  """Raises ValueError unless every entry of `values` lies in (-1, 1] (a stable buffer)."""
  if np.any(values <= -1.0) or np.any(values > 1.0):
    raise ValueError(f'`{name}` entries must lie in (-1, 1] (|decay| < 1, or exactly 1, for a '
                     f'stable buffer), got {values.tolist()}.')


def inverse_parameters(theta, omega) -> Tuple[np.ndarray, np.ndarray]:
  """(theta_hat, omega_hat) with BLT(theta, omega)^-1 = BLT(theta_hat, omega_hat) (Sec. 2.4, Alg. 5).

  theta_hat = eig(diag(theta) - 1 omega^T) (Alg. 3 run on an impulse has exactly this state-transition
  matrix), sorted by decreasing value, and omega_hat = calc_output_scale(theta_hat, theta) (Alg. 5
  with swapped arguments). Works on either side of a pair: C's own (theta, omega), or an inverse's
  (theta_hat, omega_hat), whose decays may be negative; `inverse_parameters(*inverse_parameters(
  theta, omega))` gives (theta, omega) back up to rounding and order.

  Args:
    theta: the d buffer decays, each in (-1, 1] (a `BLTStrategy`'s lie in (0, 1]).
    omega: the d output scales, finite.

  Returns:
    (theta_hat, omega_hat), float64 arrays of shape (d,); every theta_hat in (-1, 1].

  Raises:
    ValueError: naming `theta` or `omega` for bad input, or `theta_hat` when the inverse is not a
      stable BLT: its decays are complex, repeated, or outside (-1, 1] (|theta_hat| > 1 makes the
      noise C^-1 z grow geometrically; e.g. theta = (0.9,), omega = (-0.5,) has theta_hat = (1.4,)).
  """
  theta = _check_vector(theta, 'theta')
  omega = _check_vector(omega, 'omega', length=theta.size)
  _check_stable_decays(theta, 'theta')
  eigenvalues = np.linalg.eigvals(np.diag(theta) - omega[None, :])
  if np.max(np.abs(eigenvalues.imag)) > 1e-12 * max(1.0, np.max(np.abs(eigenvalues))):
    raise ValueError(f'`theta_hat` (the inverse\'s buffer decays) is complex, {eigenvalues.tolist()}, '
                     'so the inverse is not a BLT.')
  theta_hat = np.sort(eigenvalues.real)[::-1]
  if np.unique(theta_hat).size != theta_hat.size:
    raise ValueError(f'`theta_hat` (the inverse\'s buffer decays) has repeated entries '
                     f'{theta_hat.tolist()}, so the inverse is not a d-buffer BLT.')
  if theta_hat[-1] <= -1.0 or theta_hat[0] > 1.0:
    raise ValueError(
        f'`theta_hat` (the inverse\'s buffer decays) {theta_hat.tolist()} lies outside (-1, 1], so the '
        'noise C^-1 z is not a stable BLT (it grows without bound).')
  return theta_hat, calc_output_scale(theta_hat, theta)


@dataclasses.dataclass(frozen=True)
class BLTStrategy(base.ToeplitzStrategy):
  """C = BLT(theta, omega): lower-triangular Toeplitz with c_0 = 1, c_i = sum_j omega_j theta_j^(i-1).

  Noise for round t is sigma * zeta * (C^-1 z)_t, generated in streaming form by
  `dp_ftrl_tff.noise.blt.BLTNoise` with d model-sized buffers (BLT paper Alg. 3). The strategy streams
  for any number of rounds (`max_rounds` is None); only the accounting depends on n.

  Attributes:
    theta: buffer decays, each in (0, 1] (C's own; the decays theta_hat of C^-1 lie in (-1, 1] and may
      be negative, see `inverse`).
    omega: output scales, finite and of magnitude at most `_validation.MAX_COEFFICIENT` = 1e100
      (the paper's BLTs have omega > 0 and sum(omega) <= 1, which makes c
      non-negative and non-increasing, the condition of Thm. 3.1 under which `sensitivity_squared`
      is exact; this includes every `optimize_blt` result).
  """
  theta: Tuple[float, ...]
  omega: Tuple[float, ...]

  name: ClassVar[str] = 'blt'

  def __post_init__(self):
    theta = _check_vector(self.theta, 'theta')
    omega = _check_vector(self.omega, 'omega', length=theta.size)
    if np.any(theta <= 0.0) or np.any(theta > 1.0):
      raise ValueError(f'`theta` entries must lie in (0, 1], got {theta.tolist()}.')
    object.__setattr__(self, 'theta', tuple(float(v) for v in theta))
    object.__setattr__(self, 'omega', tuple(float(v) for v in omega))

  @property
  def num_buffers(self) -> int:
    """d, the number of buffers (model-sized tensors of noise state)."""
    return len(self.theta)

  def toeplitz_coefs(self, num_rounds: int) -> np.ndarray:
    """c_0 .. c_{n-1} of C (Eq. 2), float64."""
    num_rounds = self.check_num_rounds(num_rounds)
    return _coefficients(np.asarray(self.theta), np.asarray(self.omega), num_rounds)

  def inverse(self) -> Tuple[np.ndarray, np.ndarray]:
    """(theta_hat, omega_hat) with C^-1 = BLT(theta_hat, omega_hat), sorted by decreasing theta_hat.

    `inverse_parameters(theta, omega)`: theta_hat = eig(diag(theta) - 1 omega^T) and omega_hat =
    calc_output_scale(theta_hat, theta). Inverse decays may be negative: every theta_hat in (-1, 1]
    is a stable buffer (e.g. theta = (0.5,), omega = (0.9,) has theta_hat = (-0.4,)).

    Raises:
      ValueError: naming `theta_hat` if the inverse is not a stable BLT: its decays are complex,
        repeated, or outside (-1, 1] (possible for omega with mixed signs, e.g. theta = (0.9,),
        omega = (-0.5,) has theta_hat = (1.4,)). `noise_coefs` still works for such strategies.
    """
    return inverse_parameters(self.theta, self.omega)

  def check_noise_stable(self) -> None:
    """Raises ValueError (naming `theta_hat`) unless C^-1 is a stable BLT, i.e. `inverse()` succeeds.

    Strategy files refuse a BLT whose inverse is not one: with |theta_hat| > 1 the streamed noise
    grows geometrically with the round, and complex or repeated inverse decays are not a BLT.
    """
    try:
      self.inverse()
    except ValueError as e:
      raise ValueError(f'{self}: {e}') from e

  def noise_coefs(self, num_rounds: int) -> np.ndarray:
    """c_hat_0 .. c_hat_{n-1}, the Toeplitz coefficients of C^-1, float64.

    Uses Eq. 2 on `inverse()` (O(nd), signed powers for negative theta_hat); when the inverse is not a
    BLT (complex, repeated, or out-of-range decays), falls back to `toeplitz.inverse_coefs`
    (power-series inverse, O(n log n)).
    """
    num_rounds = self.check_num_rounds(num_rounds)
    try:
      theta_hat, omega_hat = self.inverse()
    except ValueError:
      return toeplitz.inverse_coefs(self.toeplitz_coefs(num_rounds), num_rounds)
    return _coefficients(theta_hat, omega_hat, num_rounds)

  def describe(self) -> dict:
    return {'num_buffers': self.num_buffers, 'theta': list(self.theta), 'omega': list(self.omega)}

  def to_config(self) -> dict:
    """{'mechanism': 'blt', 'theta': [...], 'omega': [...]}, JSON-serializable, exact floats."""
    return {'mechanism': self.name, 'theta': list(self.theta), 'omega': list(self.omega)}

  @classmethod
  def from_config(cls, config: dict) -> 'BLTStrategy':
    """Inverse of `to_config`; raises ValueError on a wrong `mechanism`, unknown or missing keys."""
    base.check_config(config, (cls.name,), required=('theta', 'omega'))
    return cls(theta=config['theta'], omega=config['omega'])

  def __str__(self) -> str:
    return f'BLTStrategy(theta={self.theta!r}, omega={self.omega!r})'


# BLT paper App. A: the deployed d = 4 BLTs, keyed by the min-sep b they were optimized for. The paper
# states (n, k) = (2000, 10), (4000, 5) and (4000, 2) for b = 100, 400, 1000; the b = 400 one is the
# suggested default (noise multiplier 7.379).
PRODUCTION_STRATEGIES: Dict[int, BLTStrategy] = {
    100: BLTStrategy(
        theta=(0.989739971007307, 0.7352001759538236, 0.16776199983448145, 0.1677619998016191),
        omega=(0.20502892852480875, 0.23357939425278557, 0.03479503245420878,
               0.03479509876050538)),
    400: BLTStrategy(
        theta=(0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778),
        omega=(0.0070314825502323835, 0.10613806907600574, 0.1898159060327625,
               0.1966594748073734)),
    1000: BLTStrategy(
        theta=(0.9999999999983397, 0.9973412136664378, 0.9584629472313878, 0.6581796870749317),
        omega=(0.008657392263671862, 0.05890891298180163, 0.14548176930698697,
               0.2770117005326523)),
}
#: The App. A BLT for b = 400, the paper's suggested default: the registry's reference strategy, which
#: a planned-run report uses when no BLT parameters are given.
REFERENCE_STRATEGY = PRODUCTION_STRATEGIES[400]


# ----------------------------------------------------------------------------------------------------
# The n-independent limit of the losses.


def limit_normalized_loss(strategy: BLTStrategy, min_sep: int) -> float:
  """lim_{n -> inf} MaxLoss_n / sqrt(n k_n), k_n = ceil(n / b): the loss per sqrt(n k) at large n.

  For b-min-sep participation with every admissible participation (`max_participations=None`,
  k_n = ceil(n / b)) and a BLT whose c is non-negative and non-increasing (Thm. 3.1 exact), both loss
  factors grow with n in a fixed way:
    * Error: B = LtToep(cumsum(c_hat)) (Prop. 3.3) and cumsum(c_hat) -> beta = sum_i c_hat_i =
      1 / C(1) = 1 / (1 + sum_j omega_j / (1 - theta_j)), so MaxError_n^2 / n -> beta^2 and
      RmsError_n^2 / n -> beta^2 / 2 (row i holds i + 1 terms);
    * Sensitivity: (C u(pi*))_t = sum_{m <= t / b} c_{r + m b} with r = t mod b tends to
      g_r = sum_{m >= 0} c_{r + m b}, so sens_n^2 / k_n -> sum_{r < b} g_r^2, with
      g_0 = 1 + sum_j a_j theta_j^(b - 1), g_r = sum_j a_j theta_j^(r - 1) (0 < r < b),
      a_j = omega_j / (1 - theta_j^b).
  Hence MaxLoss_n / sqrt(n k_n) -> |beta| sqrt(sum_r g_r^2), and RmsLoss_n / sqrt(n k_n) tends to the
  same value over sqrt(2). The finite-n ratios differ from the limit by O((b + 1 / (1 - theta_max)) / n)
  relative (the boundary rows, and the transient of the slowest buffer).

  Lower bound: sum_r g_r = sum_i c_i = C(1) = 1 / beta, so by Cauchy-Schwarz the limit is at least
  1 / sqrt(b), with equality for constant g_r; BLTs approach it as theta_1 -> 1 (the App. A BLTs,
  theta_1 = 1 - 1e-11, are within 1e-9 of it). 1 / sqrt(b) (1 / sqrt(2 b) for RmsLoss) is thus the
  n-independent value optimized BLTs' normalized losses are compared with.

  Args:
    strategy: a BLT with every theta_j < 1, omega_j > 0 and sum(omega) <= 1.
    min_sep: b >= 1.

  Returns:
    The limit of MaxLoss_n / sqrt(n ceil(n / b)), float.
  """
  min_sep = _validation.check_positive_int(min_sep, 'min_sep')
  if not isinstance(strategy, BLTStrategy):
    raise ValueError(f'`strategy` must be a BLTStrategy, got {strategy!r}.')
  theta = np.asarray(strategy.theta, dtype=np.float64)
  omega = np.asarray(strategy.omega, dtype=np.float64)
  if np.any(theta >= 1.0):
    raise ValueError(f'`strategy` needs every theta < 1 for a finite limit, got {theta.tolist()}.')
  if np.any(omega <= 0.0) or np.sum(omega) > 1.0:
    raise ValueError('`strategy` needs omega > 0 and sum(omega) <= 1 (c non-negative, '
                     f'non-increasing), got {omega.tolist()}.')
  log_theta = np.log(theta)
  beta = 1.0 / (1.0 + np.sum(omega / (1.0 - theta)))  # 1 - theta is exact for theta >= 1/2
  scales = omega / -np.expm1(min_sep * log_theta)
  powers = (np.arange(min_sep) - 1) % min_sep  # r - 1 for r >= 1, b - 1 for r = 0
  periodic = np.exp(powers[:, None] * log_theta[None, :]) @ scales
  periodic[0] += 1.0
  return float(abs(beta) * np.sqrt(np.sum(periodic**2)))


# ----------------------------------------------------------------------------------------------------
# Differentiable loss (Alg. 4) with exact gradients.


_MIN_EXPONENT = -300.0


def _window_sum(values: np.ndarray, min_sep: int, count: int) -> np.ndarray:
  """out[t] = sum_{i < count, i*b <= t} values[t - i*b]: C u(pi*) for pi* = (0, b, ..., (count-1) b).

  Vectorized O(n): view the padded vector as rows of length b; then it is a running sum over `count`
  consecutive rows (difference of two cumulative sums).
  """
  n = values.size
  rows = -(-n // min_sep)
  padded = np.zeros(rows * min_sep)
  padded[:n] = values
  running = np.cumsum(padded.reshape(rows, min_sep), axis=0)
  out = running.copy()
  if count < rows:
    out[count:] -= running[:-count]
  return out.ravel()[:n]


def _window_sum_adjoint(grad: np.ndarray, min_sep: int, count: int) -> np.ndarray:
  """Adjoint of `_window_sum`: out[s] = sum_{i < count, s + i*b < n} grad[s + i*b]."""
  n = grad.size
  rows = -(-n // min_sep)
  padded = np.zeros(rows * min_sep)
  padded[:n] = grad
  running = np.cumsum(padded.reshape(rows, min_sep)[::-1], axis=0)[::-1]
  out = running.copy()
  if count < rows:
    out[:-count] -= running[count:]
  return out.ravel()[:n]


def _coefficients_and_vjp(log_decays: np.ndarray, scales: np.ndarray, num_rounds: int):
  """Eq. 2 from log-decays, and a function mapping d loss / d coefs to (d / d log_decays, d / d scales).

  Powers are exp((t - 1) log theta): exact for theta within 1e-12 of 1, where theta ** t would inherit
  the rounding of theta. Exponents are floored at -300: powers below e^-300 ~ 5e-131 are far beyond
  float64 resolution of any sum they enter, and the floor keeps exp and the products out of the (very
  slow) subnormal range.
  """
  exponents = np.arange(num_rounds - 1, dtype=np.float64)
  powers = np.exp(np.maximum(exponents[:, None] * log_decays[None, :], _MIN_EXPONENT))
  coefs = np.concatenate([[1.0], powers @ scales])

  def vjp(grad_coefs):
    tail = grad_coefs[1:]
    return scales * ((exponents * tail) @ powers), tail @ powers

  return coefs, vjp


def _loss_from_log_decays(log_theta: np.ndarray, log_theta_hat: np.ndarray, cross: np.ndarray,
                          own: np.ndarray, own_hat: np.ndarray, num_rounds: int, min_sep: int,
                          count: int, error: str, barrier_strength: float):
  """Alg. 4 with exact reverse-mode gradients; the single implementation behind both front ends.

  Args:
    log_theta, log_theta_hat: log decays of C and C^-1 (shape (d,)).
    cross: theta_i - theta_hat_j; own: theta_i - theta_j; own_hat: theta_hat_i - theta_hat_j, computed
      as accurately as the caller can (their derivatives are taken through theta = exp(log_theta)).
    num_rounds, min_sep, count: n, b and the number of participations in pi*.
    error: 'max' or 'rms'.
    barrier_strength: lambda of the log-barrier lambda * sum_j (-log theta_j - log(1 - theta_j)
      - log omega_j); 0 to evaluate the loss itself.

  Returns:
    (objective, grad_log_theta, grad_log_theta_hat, loss_without_barrier).
  """
  omega = _output_scale_from_differences(cross, own)
  omega_hat = _output_scale_from_differences(-cross.T, own_hat)

  # Sensitivity^2 = ||C u(pi*)||^2 (Thm. 3.1).
  coefs, coefs_vjp = _coefficients_and_vjp(log_theta, omega, num_rounds)
  column_sum = _window_sum(coefs, min_sep, count)
  sens_sq = column_sum @ column_sum
  # Error^2 of B = LtToep(cumsum(c_hat)) (Prop. 3.3): MaxError^2 = sum_i b_i^2, RmsError^2 weights b_i^2
  # by the (n - i) / n rows it appears in.
  noise, noise_vjp = _coefficients_and_vjp(log_theta_hat, omega_hat, num_rounds)
  prefix = np.cumsum(noise)
  weights = 1.0 if error == 'max' else np.arange(num_rounds, 0, -1) / num_rounds
  err_sq = np.sum(weights * prefix**2)
  loss = math.sqrt(sens_sq * err_sq)

  grad_coefs = _window_sum_adjoint(column_sum, min_sep, count) * (loss / sens_sq)
  grad_log_theta, grad_omega = coefs_vjp(grad_coefs)
  grad_noise = np.cumsum((weights * prefix)[::-1])[::-1] * (loss / err_sq)
  grad_log_theta_hat, grad_omega_hat = noise_vjp(grad_noise)

  objective = loss
  if barrier_strength > 0.0:
    barrier = _barrier(log_theta, omega, barrier_strength)
    if barrier is None:
      return math.inf, np.zeros_like(log_theta), np.zeros_like(log_theta_hat), loss
    penalty, penalty_grad_log_theta, penalty_grad_omega = barrier
    objective += penalty
    grad_log_theta = grad_log_theta + penalty_grad_log_theta
    grad_omega = grad_omega + penalty_grad_omega

  # Back through omega and omega_hat (Alg. 5) to the log decays.
  through_theta, through_theta_hat = _output_scales_vjp(
      log_theta, log_theta_hat, cross, own, own_hat, grad_omega * omega, grad_omega_hat * omega_hat)
  return (objective, grad_log_theta + through_theta, grad_log_theta_hat + through_theta_hat, loss)


def _barrier(log_theta: np.ndarray, omega: np.ndarray, barrier_strength: float):
  """The log-barrier lambda sum_j (-log theta_j - log(1 - theta_j) - log omega_j) and its gradients
  in log theta and in omega, or None outside its domain (some omega_j <= 0 or theta_j >= 1), where
  the objective is +inf."""
  if np.any(omega <= 0.0) or np.any(log_theta >= 0.0):
    return None
  # 1 - theta = -expm1(log theta), exact near theta = 1.
  penalty = barrier_strength * float(
      np.sum(-log_theta - np.log(-np.expm1(log_theta)) - np.log(omega)))
  return (penalty, barrier_strength * (-1.0 + 1.0 / np.expm1(-log_theta)),
          -barrier_strength / omega)


def _output_scales_vjp(log_theta: np.ndarray, log_theta_hat: np.ndarray, cross: np.ndarray,
                       own: np.ndarray, own_hat: np.ndarray, weighted: np.ndarray,
                       weighted_hat: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """(d / d log theta, d / d log theta_hat) of an objective through omega and omega_hat (Alg. 5).

  `weighted` = omega * d objective / d omega, `weighted_hat` the same for omega_hat. With
  omega_i = prod_j cross[i, j] / prod_{j != i} own[i, j] (and omega_hat likewise with -cross^T),
  d omega_i / d cross[i, j] = omega_i / cross[i, j], and so on.
  """
  grad_cross = (weighted[:, None] + weighted_hat[None, :]) / cross
  off_diagonal = 1.0 - np.eye(log_theta.size)
  grad_own = -weighted[:, None] / (own + np.eye(log_theta.size)) * off_diagonal
  grad_own_hat = -weighted_hat[:, None] / (own_hat + np.eye(log_theta.size)) * off_diagonal
  # d(theta_i - theta_hat_j) / d log theta_i = theta_i, / d log theta_hat_j = -theta_hat_j, etc.
  return (np.exp(log_theta) * (grad_cross.sum(axis=1) + grad_own.sum(axis=1)
                               - grad_own.sum(axis=0)),
          np.exp(log_theta_hat) * (-grad_cross.sum(axis=0) + grad_own_hat.sum(axis=1)
                                   - grad_own_hat.sum(axis=0)))


def _pattern_shape(num_rounds: int,
                   participation: participation_lib.ParticipationSchema) -> Tuple[int, int]:
  """(b, k) of pi* = (0, b, ..., (k - 1) b) for `participation` over `num_rounds` rounds."""
  participation_lib.check_participation(participation)
  return participation.min_sep, len(participation.earliest_pattern(num_rounds))


def loss_and_gradient(theta, theta_hat, num_rounds: int,
                      participation: participation_lib.ParticipationSchema, error: str = 'max',
                      barrier_strength: float = 0.0) -> Tuple[float, np.ndarray, np.ndarray]:
  """Alg. 4: MaxLoss or RmsLoss of BLT(theta, omega) with omega = calc_output_scale(theta, theta_hat).

  The sensitivity is ||C u(pi*)||_2 (Thm. 3.1), exact when c is non-negative and non-increasing, which
  holds when the decays interlace, theta_1 > theta_hat_1 > theta_2 > ... > theta_hat_d > 0.

  Args:
    theta: d pairwise distinct buffer decays of C, each in (0, 1].
    theta_hat: d pairwise distinct buffer decays of C^-1, each in (0, 1] here: the loss works with
      log-decays (the optimizer's interlaced decays are positive). An inverse with negative decays
      is still a BLT; evaluate such a strategy with `BLTStrategy.losses`.
    num_rounds: n.
    participation: the `ParticipationSchema` (b, k) of pi*.
    error: 'max' (MaxLoss) or 'rms' (RmsLoss).
    barrier_strength: lambda >= 0 of the log-barrier sum_j (-log theta_j - log(1 - theta_j)
      - log omega_j) added to the loss (the paper optimizes with 1e-7; report losses with 0).

  Returns:
    (value, d value / d theta, d value / d theta_hat); exact gradients (reverse mode, by hand).
  """
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  error = _validation.check_one_of(error, 'error', _ERRORS)
  barrier_strength = _validation.check_nonnegative_float(barrier_strength, 'barrier_strength')
  theta = _check_vector(theta, 'theta')
  theta_hat = _check_vector(theta_hat, 'theta_hat', length=theta.size)
  for values, name in ((theta, 'theta'), (theta_hat, 'theta_hat')):
    # The loss takes logs of both decay vectors, so negative inverse decays (valid for a BLT, see
    # `inverse_parameters`) are refused here rather than reaching a log.
    if np.any(values <= 0.0) or np.any(values > 1.0):
      raise ValueError(f'`{name}` entries must lie in (0, 1] for the log-decay loss, got '
                       f'{values.tolist()} (use BLTStrategy.losses for negative inverse decays).')
    _check_distinct(values, name)
  min_sep, count = _pattern_shape(num_rounds, participation)
  value, grad_log_theta, grad_log_theta_hat, _ = _loss_from_log_decays(
      np.log(theta), np.log(theta_hat), theta[:, None] - theta_hat[None, :],
      theta[:, None] - theta[None, :], theta_hat[:, None] - theta_hat[None, :], num_rounds, min_sep,
      count, error, barrier_strength)
  return value, grad_log_theta / theta, grad_log_theta_hat / theta_hat


# ----------------------------------------------------------------------------------------------------
# Optimizer.

# L-BFGS-B box for the logits; sigmoid(45) = 1 - 3e-20, so theta can get as close to 1 as the barrier
# wants, and no intermediate overflows.
_LOGIT_BOUNDS = (-25.0, 45.0)


def _decays_and_differences(logits: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """log v = cumsum(log sigmoid(logits)) and all differences v_l - v_m, each to a few ulps.

  v_l - v_m = v_l * -expm1(log v_m - log v_l): no cancellation when v_l ~ v_m. The log-ratio
  log v_m - log v_l (l < m) is summed from its own log-sigmoids, terms of one sign (relative error
  <= (m - l) eps), not taken as a difference of the cumulative sums, which loses every digit below
  ulp(|log v_l|): next to log v_l = -16, log sigmoid(44) = -8e-20 vanishes, two distinct decays came
  out equal in float64 and Alg. 5 divided 0 by 0. The lower triangle is the negated upper one.
  """
  log_sigmoid = -np.logaddexp(0.0, -logits)
  log_v = np.cumsum(log_sigmoid)
  upper = np.zeros((logits.size, logits.size))
  for first in range(logits.size - 1):
    log_ratio = np.cumsum(log_sigmoid[first + 1:])  # log v_m - log v_first for m > first, <= 0.
    upper[first, first + 1:] = np.exp(log_v[first]) * -np.expm1(log_ratio)
  return log_v, upper - upper.T


def _objective(logits: np.ndarray, num_rounds: int, min_sep: int, count: int, error: str,
               barrier_strength: float) -> Tuple[float, np.ndarray]:
  """Optimizer objective in the interlaced parameterization, and its exact gradient.

  v = cumprod(sigmoid(logits)) is strictly decreasing in (0, 1); theta = v[0::2], theta_hat = v[1::2].
  Interlacing theta_1 > theta_hat_1 > theta_2 > ... makes omega > 0 and sum(omega) = c_1 =
  sum_j (theta_j - theta_hat_j) < 1, so Thm. 3.1 holds at every point. log v is the cumulative sum of
  log-sigmoids, exact even where v rounds to 1 in float64, and the differences of decays come from
  log-ratios summed directly (`_decays_and_differences`), accurate even where they are far below the
  resolution of v. Each evaluation is a stop point (`dp_ftrl_tff.stopping.check`).
  """
  stopping.check()
  log_v, differences = _decays_and_differences(logits)
  log_theta, log_theta_hat = log_v[0::2], log_v[1::2]
  value, grad_log_theta, grad_log_theta_hat, _ = _loss_from_log_decays(
      log_theta, log_theta_hat, differences[0::2, 1::2], differences[0::2, 0::2],
      differences[1::2, 1::2], num_rounds, min_sep, count, error, barrier_strength)
  grad_log_v = np.empty_like(log_v)
  grad_log_v[0::2], grad_log_v[1::2] = grad_log_theta, grad_log_theta_hat
  # d log sigmoid(x) / dx = sigmoid(-x).
  grad = np.cumsum(grad_log_v[::-1])[::-1] * scipy.special.expit(-logits)
  return value, grad


def _logits_from_decreasing(log_v: np.ndarray) -> np.ndarray:
  """Inverse of log v = cumsum(log sigmoid(x)): x_m = logit(v_m / v_{m-1}), from log-ratios."""
  log_ratio = np.diff(log_v, prepend=0.0)
  return log_ratio - np.log(-np.expm1(log_ratio))


def _initial_logits(num_buffers: int, num_rounds: int) -> list:
  """Deterministic starting points: 1 - v log-spaced from 1e-11 or min(1 / (2n), 0.01) down to 0.5.

  The first start puts theta_1 at 1 - 1e-11 (logit ~25), where the App. A optima sit; a random start
  with moderate logits rarely reaches it.
  """
  starts = []
  for top_gap in (1e-11, min(0.5 / num_rounds, 0.01)):
    gaps = np.geomspace(top_gap, 0.5, 2 * num_buffers + 1)[:-1]
    starts.append(_logits_from_decreasing(np.log1p(-gaps)))
  return starts


def _warm_start(logits: np.ndarray) -> np.ndarray:
  """Starting point for d + 1 buffers from a d-buffer solution: a small extra buffer appended."""
  return np.concatenate([logits, [0.0, 2.0]])


def _minimize(start: np.ndarray, args, max_iterations: int):
  return scipy.optimize.minimize(
      _objective, start, args=args, jac=True, method='L-BFGS-B',
      bounds=[_LOGIT_BOUNDS] * start.size,
      options={'maxiter': max_iterations, 'maxfun': 2 * max_iterations, 'ftol': 1e-12,
               'gtol': 1e-9, 'maxcor': 20})


def _strategy_from_logits(logits: np.ndarray) -> BLTStrategy:
  log_v, differences = _decays_and_differences(logits)
  omega = _output_scale_from_differences(differences[0::2, 1::2], differences[0::2, 0::2])
  return BLTStrategy(theta=np.exp(log_v[0::2]), omega=omega)


# The optimizer's cost on this project's machine type (2 cores; time.perf_counter, tracemalloc). One
# evaluation of `_objective` with d buffers over n rounds takes about 0.3 ms + 60 ns n d + 0.44 us d^2
# (its (n - 1) x d powers, and the O(d^2) differences of decays); for each buffer count d' = 1 .. d
# the optimizer runs about 230 + 10 d' L-BFGS-B steps over all its starts (measured 1862 steps in all
# for d = 8 and 67500 for d = 96 at n = 100, 1714 for d = 8 at n = 2000); its arrays peak at about
# 24 n d + 64 n bytes. The estimates were within a factor of two of the measured times (0.98 s for
# d = 8 and 106 s for d = 96 at n = 100, 2.3 s for d = 8 and 8.2 s for d = 16 at n = 2000).
_SECONDS_PER_EVALUATION = 0.3e-3
_SECONDS_PER_ROUND_BUFFER = 60e-9
_SECONDS_PER_BUFFER_PAIR = 0.44e-6
_STEPS_PER_COUNT = 230
_STEPS_PER_COUNT_AND_BUFFER = 10
_BYTES_PER_ROUND_BUFFER = 24
_BYTES_PER_ROUND = 64


def optimization_cost(num_rounds: int, num_buffers: int) -> Tuple[float, float]:
  """(seconds, bytes) `optimize_blt` needs for `num_buffers` = d (the largest count it tries) over
  `num_rounds` = n: the sum over d' = 1 .. d of (230 + 10 d') steps of (0.3 ms + 60 ns n d' +
  0.44 us d'^2) each, in closed form (any d, however large), and 24 n d + 64 n bytes; measured on this
  project's machine type (see the comment above)."""
  n = float(_validation.check_positive_int(num_rounds, 'num_rounds'))
  d = float(_validation.check_positive_int(num_buffers, 'num_buffers'))
  # sum_{k <= d} (s0 + s1 k)(a + b k + e k^2) from the power sums of k = 1 .. d.
  sums = (d, d * (d + 1) / 2, d * (d + 1) * (2 * d + 1) / 6, (d * (d + 1) / 2)**2)
  s0, s1 = _STEPS_PER_COUNT, _STEPS_PER_COUNT_AND_BUFFER
  a, b, e = _SECONDS_PER_EVALUATION, _SECONDS_PER_ROUND_BUFFER * n, _SECONDS_PER_BUFFER_PAIR
  seconds = s0 * a * sums[0] + (s0 * b + s1 * a) * sums[1] + (s0 * e + s1 * b) * sums[2] + (
      s1 * e * sums[3])
  return seconds, (_BYTES_PER_ROUND_BUFFER * d + _BYTES_PER_ROUND) * n


def check_optimization_cost(num_rounds: int, num_buffers: Optional[int],
                            max_num_buffers: int = 8, available: Optional[int] = None) -> None:
  """Raises `memory.MemoryLimitError` or `memory.ComputeLimitError` (ValueErrors) when
  `optimize_blt` over `num_rounds` rounds with `num_buffers` (None: it tries 1 .. `max_num_buffers`)
  would not fit in the available memory or would take longer than `memory.MAX_SECONDS`
  (`optimization_cost`). The error names `num_buffers` when it was given and is the cause (with the
  most buffers that fit), else `num_rounds`."""
  n = _validation.check_positive_int(num_rounds, 'num_rounds')
  d = max_num_buffers if num_buffers is None else _validation.check_positive_int(
      num_buffers, 'num_buffers')
  seconds, needed = optimization_cost(n, d)
  blame_buffers = num_buffers is not None and num_buffers > 1
  what = (f'`num_buffers`={num_buffers} at `num_rounds`={n}' if blame_buffers else
          f'`num_rounds`={n}' + ('' if num_buffers else f' (buffer counts 1 .. {d})'))
  available = memory.available_bytes() if available is None else available
  if needed > available:
    raise memory.MemoryLimitError(
        f'{what}: the BLT optimizer\'s arrays need about {memory.format_bytes(needed)} (24 n d + 64 n '
        f'bytes for n={n}, d={d}), but only {memory.format_bytes(available)} of memory is available; '
        + _fewer(n, d, blame_buffers, available))
  memory.check_seconds(
      seconds, f'{what}: the BLT optimizer, which optimizes d\' = 1 .. {d} buffers in turn (about '
      "230 + 10 d' L-BFGS-B steps of O(n d') each),", _fewer(n, d, blame_buffers, available))


def _fewer(num_rounds: int, num_buffers: int, blame_buffers: bool, available: float) -> str:
  """The remedy of `check_optimization_cost`: the most buffers within the limits, or fewer rounds."""
  def fits(d):
    seconds, needed = optimization_cost(num_rounds, d)
    return seconds <= memory.MAX_SECONDS and needed <= available

  if blame_buffers and fits(1):
    low, high = 1, num_buffers  # fits(low), not fits(high)
    while high - low > 1:
      middle = (low + high) // 2
      low, high = (middle, high) if fits(middle) else (low, middle)
    return (f'use at most `num_buffers`={low} here (the BLT paper\'s optima need 4 or fewer) or '
            'fewer `num_rounds`.')
  return ('optimize for fewer `num_rounds` (a BLT streams for any number of rounds) or give its '
          '`theta` and `omega`.')


def optimize_blt(num_rounds: int, participation: participation_lib.ParticipationSchema,
                 num_buffers: Optional[int] = None, error: str = 'max', *,
                 barrier_strength: float = 1e-7, max_num_buffers: int = 8,
                 max_iterations: int = 1000,
                 relative_tolerance: float = 5e-4) -> base.OptimizationResult:
  """Optimizes a BLT for MaxLoss or RmsLoss under b-min-sep participation (BLT paper Sec. 3.3).

  Minimizes Alg. 4 plus the log-barrier over the interlaced (theta, theta_hat) (see `_objective`) with
  scipy's L-BFGS-B, exact gradients and float64, from a few deterministic starts (one with theta_1 near
  1 - 1e-11) plus, when several buffer counts are tried, a warm start from the previous count. The
  reported `losses` exclude the barrier.

  Args:
    num_rounds: n the mechanism is optimized for (it still runs for any n).
    participation: the `ParticipationSchema`; its pi* = (0, b, ..., (k_eff - 1) b) sets the loss.
    num_buffers: d >= 1, or None to try 1 .. `max_num_buffers` and keep the smallest d whose loss is
      within `relative_tolerance` of the best. A d (or n) whose optimization would not fit in memory
      or take longer than `memory.MAX_SECONDS` is refused up front (`check_optimization_cost`).
    error: 'max' (MaxLoss, as the paper deploys) or 'rms' (RmsLoss).
    barrier_strength: lambda of the log-barrier (paper: 1e-7).
    max_num_buffers: largest d tried when `num_buffers` is None.
    max_iterations: L-BFGS-B iteration limit per start.
    relative_tolerance: see `num_buffers` (default 0.05%).

  Returns:
    `base.OptimizationResult`; `details` holds the chosen d, the loss for every d tried, and per-start
    objectives and iteration counts.
  """
  start_time = time.perf_counter()
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  error = _validation.check_one_of(error, 'error', _ERRORS)
  barrier_strength = _validation.check_nonnegative_float(barrier_strength, 'barrier_strength')
  max_num_buffers = _validation.check_positive_int(max_num_buffers, 'max_num_buffers')
  max_iterations = _validation.check_positive_int(max_iterations, 'max_iterations')
  relative_tolerance = _validation.check_nonnegative_float(relative_tolerance, 'relative_tolerance')
  candidates = _buffer_counts(num_buffers, max_num_buffers)
  check_optimization_cost(num_rounds, num_buffers, max_num_buffers)
  min_sep, count = _pattern_shape(num_rounds, participation)
  results, runs = _optimize_buffer_counts(
      candidates, num_rounds, participation, (num_rounds, min_sep, count, error, barrier_strength),
      max_iterations)
  pick = (lambda losses: losses.max_loss) if error == 'max' else (lambda losses: losses.rms_loss)
  chosen = _fewest_buffers_near_best(results, pick, relative_tolerance)
  strategy, losses = results[chosen]
  details = {
      'num_buffers': chosen,
      'error': error,
      'barrier_strength': barrier_strength,
      'loss_by_num_buffers': {str(d): pick(losses) for d, (_, losses) in results.items()},
      'runs': runs,
  }
  return base.OptimizationResult(strategy=strategy, losses=losses, num_rounds=num_rounds,
                                 participation=participation,
                                 seconds=time.perf_counter() - start_time, details=details)


def _buffer_counts(num_buffers: Optional[int], max_num_buffers: int):
  """The buffer counts d whose optima `optimize_blt` compares: `num_buffers`, or 1 .. max."""
  if num_buffers is None:
    return range(1, max_num_buffers + 1)
  return [_validation.check_positive_int(num_buffers, 'num_buffers')]


def _optimize_buffer_counts(candidates, num_rounds: int,
                            participation: participation_lib.ParticipationSchema, args: tuple,
                            max_iterations: int) -> Tuple[Dict[int, tuple], list]:
  """({d: (strategy, losses)} for each d in `candidates`, one record per L-BFGS-B run).

  Buffer counts are optimized in increasing order, each also warm-started from the previous optimum
  (with a fixed `num_buffers`, the smaller counts serve only as warm starts). `args` are
  `_objective`'s (n, b, k, error, barrier strength).
  """
  results = {}
  runs = []
  previous = None
  for d in range(1, max(candidates) + 1):
    starts = _initial_logits(d, num_rounds)
    if previous is not None:
      starts.append(_warm_start(previous))
    previous = _best_of_starts(d, starts, args, max_iterations, runs).x
    if d in candidates:
      strategy = _strategy_from_logits(previous)
      results[d] = (strategy, strategy.losses(num_rounds, participation))
  return results, runs


def _best_of_starts(num_buffers: int, starts: list, args: tuple, max_iterations: int,
                    runs: list) -> scipy.optimize.OptimizeResult:
  """The L-BFGS-B result with the lowest finite objective over `starts`; appends one record per
  start to `runs`. Raises RuntimeError when no start reaches a finite objective."""
  best = None
  for start in starts:
    result = _minimize(start, args, max_iterations)
    runs.append({'num_buffers': num_buffers, 'objective': float(result.fun),
                 'iterations': int(result.nit), 'converged': bool(result.success)})
    if np.isfinite(result.fun) and (best is None or result.fun < best.fun):
      best = result
  if best is None:
    raise RuntimeError(f'BLT optimization with {num_buffers} buffers found no finite objective.')
  return best


def _fewest_buffers_near_best(results: Dict[int, tuple], pick, relative_tolerance: float) -> int:
  """The smallest d whose loss `pick(losses)` is within `relative_tolerance` of the best d's."""
  best_loss = min(pick(losses) for _, losses in results.values())
  return min(d for d, (_, losses) in results.items()
             if pick(losses) <= best_loss * (1.0 + relative_tolerance))
