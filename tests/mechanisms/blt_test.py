"""Tests for BLT strategies against dense matrix math, brute force and the BLT paper's numbers.

Reference values: the BLT paper (docs/papers.md#blt): App. A parameters and the losses, inverse
coefficients and sensitivities computed from them, Table 3 with its swapped column headers
(docs/papers.md#misprints), Table 4 accounting targets.
"""

import itertools
import math
import time

import numpy as np
import pytest
import scipy.linalg
import scipy.signal
import scipy.special

from dp_ftrl_tff.mechanisms import base, blt, sensitivity, toeplitz
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

MinSep = participation_lib.ParticipationSchema.b_min_sep
APP_A = blt.PRODUCTION_STRATEGIES
# Table 3 setting (StackOverflow): n = 2052 rounds, min-sep b = 342, k = 6 participations.
TABLE3_N, TABLE3 = 2052, MinSep(342, 6)


def _dense_c(strategy, n):
  """C from Eq. 2 with explicit Python loops."""
  c = [1.0] + [sum(w * t**(i - 1) for t, w in zip(strategy.theta, strategy.omega, strict=True))
               for i in range(1, n)]
  return scipy.linalg.toeplitz(c, np.zeros(n))


def _dense_losses(strategy, n, participation):
  """(MaxLoss, RmsLoss) from the dense B = A C^-1 and brute-force sensitivity over all patterns."""
  return _dense_losses_of_matrix(_dense_c(strategy, n), participation)


def _dense_losses_of_matrix(c, participation):
  """`_dense_losses` for a given dense n x n strategy matrix C."""
  n = c.shape[0]
  b = np.tril(np.ones((n, n))) @ scipy.linalg.solve_triangular(c, np.eye(n), lower=True)
  row_sq = np.sum(b**2, axis=1)
  sens_sq = max(np.sum(c[:, list(p)].sum(axis=1)**2) for p in patterns_lib.patterns(participation, n))
  return np.sqrt(row_sq.max() * sens_sq), np.sqrt(row_sq.mean() * sens_sq), sens_sq


def _impulse_response(strategy, n):
  """Alg. 3 run on an impulse, in plain Python: the coefficients of C^-1."""
  buffers = [0.0] * strategy.num_buffers
  out = []
  for t in range(n):
    z_hat = (1.0 if t == 0 else 0.0) - sum(
        w * s for w, s in zip(strategy.omega, buffers, strict=True))
    buffers = [th * s + z_hat for th, s in zip(strategy.theta, buffers, strict=True)]
    out.append(z_hat)
  return np.array(out)


# ------------------------------------------------------------------------------------------------
# Coefficients and inverse.


def test_toeplitz_coefs_app_a_values():
  np.testing.assert_allclose(
      APP_A[400].toeplitz_coefs(6), [1, 0.49964493, 0.37974627, 0.31271353, 0.2724454, 0.24604028],
      atol=1e-8)
  np.testing.assert_allclose(
      APP_A[100].toeplitz_coefs(6), [1, 0.50819845, 0.38632752, 0.32905603, 0.29193331, 0.26504107],
      atol=1e-8)


@pytest.mark.parametrize('b', [100, 400, 1000])
def test_strategy_and_noise_matrices_are_dense_c_and_its_inverse(b):
  n = 60
  strategy = APP_A[b]
  c = _dense_c(strategy, n)
  np.testing.assert_allclose(strategy.strategy_matrix(n), c, atol=1e-14)
  np.testing.assert_allclose(strategy.noise_matrix(n),
                             scipy.linalg.solve_triangular(c, np.eye(n), lower=True), atol=1e-12)
  np.testing.assert_allclose(strategy.noise_coefs(n), _impulse_response(strategy, n), atol=1e-12)


def test_noise_coefs_app_a_values_long_horizon():
  # c_hat of the App. A b=400 BLT (Alg. 3 on an impulse, BLT paper Fig. 10 caption;
  # docs/papers.md#blt), and agreement with the impulse response over 4000 rounds.
  np.testing.assert_allclose(
      APP_A[400].noise_coefs(6),
      [1, -0.49964493, -0.13010121, -0.05797082, -0.0378294, -0.02831443], atol=1e-8)
  np.testing.assert_allclose(APP_A[1000].noise_coefs(4000), _impulse_response(APP_A[1000], 4000),
                             atol=2e-13)


@pytest.mark.parametrize('b, theta_hat, omega_hat', [
    (400, [0.9997003, 0.96756268, 0.75149125, 0.16583864],
     [-1.21733719e-05, -5.14612882e-03, -7.36013962e-02, -4.20885234e-01]),
    (1000, [0.99971309, 0.98770304, 0.87447858, 0.26202937],
     [-8.64092835e-06, -1.15726078e-03, -3.22593843e-02, -4.56634489e-01]),
])
def test_inverse_app_a(b, theta_hat, omega_hat):
  got_theta_hat, got_omega_hat = APP_A[b].inverse()
  np.testing.assert_allclose(got_theta_hat, theta_hat, rtol=1e-7)
  np.testing.assert_allclose(got_omega_hat, omega_hat, rtol=1e-6)
  # Interlacing theta_1 > theta_hat_1 > theta_2 > ... (holds for the App. A BLTs, BLT paper
  # Sec. 2.4; docs/papers.md#blt).
  interlaced = np.ravel(np.column_stack([APP_A[b].theta, got_theta_hat]))
  assert np.all(np.diff(interlaced) < 0)


def test_inverse_b100_has_a_vanishing_buffer():
  theta_hat, omega_hat = APP_A[100].inverse()
  np.testing.assert_allclose(theta_hat, [0.90635825, 0.46050265, 0.167762, 0.0176428], rtol=1e-6)
  np.testing.assert_allclose(omega_hat, [-2.66022514e-02, -2.15539915e-01, 0.0, -2.66056288e-01],
                             atol=1e-9)


@pytest.mark.parametrize('b', [400, 1000])
def test_calc_output_scale_recovers_omega(b):
  strategy = APP_A[b]
  theta_hat = np.linalg.eigvals(np.diag(strategy.theta) - np.asarray(strategy.omega)[None, :]).real
  np.testing.assert_allclose(blt.calc_output_scale(strategy.theta, theta_hat), strategy.omega,
                             rtol=1e-6)


def test_calc_output_scale_b100_nearly_equal_decays():
  strategy = APP_A[100]
  theta_hat = np.linalg.eigvals(np.diag(strategy.theta) - np.asarray(strategy.omega)[None, :]).real
  np.testing.assert_allclose(blt.calc_output_scale(strategy.theta, theta_hat), strategy.omega,
                             atol=1e-6)


def test_calc_output_scale_single_buffer_and_dense_inverse():
  np.testing.assert_allclose(blt.calc_output_scale([0.9], [0.6]), [0.3])
  rng = np.random.default_rng(0)
  for _ in range(5):
    v = np.sort(rng.uniform(0.05, 0.99, size=6))[::-1]
    theta, theta_hat = v[0::2], v[1::2]
    omega = blt.calc_output_scale(theta, theta_hat)
    omega_hat = blt.calc_output_scale(theta_hat, theta)
    strategy = blt.BLTStrategy(theta, omega)
    n = 40
    expected = scipy.linalg.solve_triangular(_dense_c(strategy, n), np.eye(n), lower=True)[:, 0]
    got = np.concatenate([[1.0], [omega_hat @ theta_hat**(i - 1) for i in range(1, n)]])
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_calc_output_scale_many_tiny_decays():
  # d = 8 interlaced decays below 2^-200 = 6e-61: the products of 8 differences underflow in
  # float64 (they used to give 0 / 0 = nan), while omega is of the size of one difference.
  # Reference: Alg. 5 is homogeneous of degree 1 and scaling by a power of two is exact, so the
  # result is exactly 2^-200 times that of the unscaled decays, which match the dense inverse.
  v = np.linspace(0.95, 0.05, 16)
  theta, theta_hat = v[0::2], v[1::2]
  omega = blt.calc_output_scale(theta, theta_hat)
  omega_hat = blt.calc_output_scale(theta_hat, theta)
  n = 40
  expected = scipy.linalg.solve_triangular(_dense_c(blt.BLTStrategy(theta, omega), n), np.eye(n),
                                           lower=True)[:, 0]
  got = np.concatenate([[1.0], [omega_hat @ theta_hat**(i - 1) for i in range(1, n)]])
  np.testing.assert_allclose(got, expected, atol=1e-12)
  scale = 2.0**-200
  cross = scale * (theta[:, None] - theta_hat[None, :])
  own = scale * (theta[:, None] - theta[None, :]) + np.eye(8)
  with np.errstate(under='ignore', invalid='ignore'):
    assert np.all(np.isnan(np.prod(cross, axis=1) / np.prod(own, axis=1)))  # the plain products
  with np.errstate(divide='raise', invalid='raise', over='raise'):
    np.testing.assert_array_equal(blt.calc_output_scale(scale * theta, scale * theta_hat),
                                  scale * omega)
    np.testing.assert_array_equal(blt.calc_output_scale(scale * theta_hat, scale * theta),
                                  scale * omega_hat)


def test_complex_inverse_falls_back_to_series_inverse():
  strategy = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.5, -0.6))
  with pytest.raises(ValueError, match='complex'):
    strategy.inverse()
  n = 30
  np.testing.assert_allclose(
      strategy.noise_coefs(n),
      scipy.linalg.solve_triangular(_dense_c(strategy, n), np.eye(n), lower=True)[:, 0], atol=1e-10)


def _dense_blt(theta, omega, n):
  """LtToep(1, sum_j w_j, sum_j w_j t_j, ...) with explicit Python loops; decays of any sign."""
  c = [1.0] + [sum(w * t**(i - 1) for t, w in zip(theta, omega, strict=True)) for i in range(1, n)]
  return scipy.linalg.toeplitz(c, np.zeros(n))


# jax_privacy's BufferedToeplitz tests pair this BLT with its inverse, whose smallest decay is
# negative: theta_hat = eig(diag(theta) - 1 omega^T), computed independently below.
JAX_PAIR = blt.BLTStrategy(theta=(0.9, 0.5, 0.001), omega=(0.1, 0.2, 0.5))
JAX_PAIR_THETA_HAT = (0.8535358949120166, 0.402215868278796, -0.6547517631908121)
JAX_PAIR_OMEGA_HAT = (-0.020572874781682026, -0.04093937802766855, -0.7384877471906487)


def test_inverse_with_a_negative_decay_jax_privacy_pair():
  theta_hat, omega_hat = JAX_PAIR.inverse()
  # Independent: the real roots of det(x I - diag(theta) + 1 omega^T), a cubic.
  theta, omega = np.asarray(JAX_PAIR.theta), np.asarray(JAX_PAIR.omega)
  roots = np.roots(np.poly(np.diag(theta) - omega[None, :]))
  np.testing.assert_allclose(theta_hat, np.sort(roots.real)[::-1], rtol=1e-12)
  np.testing.assert_allclose(theta_hat, JAX_PAIR_THETA_HAT, rtol=1e-12)
  np.testing.assert_allclose(omega_hat, JAX_PAIR_OMEGA_HAT, rtol=1e-12)
  assert np.sum(theta_hat < 0) == 1 and theta_hat[-1] == pytest.approx(-0.655, abs=5e-4)
  n = 50
  c = _dense_blt(JAX_PAIR.theta, JAX_PAIR.omega, n)
  c_inverse = _dense_blt(theta_hat, omega_hat, n)
  # |c_i| <= 1 and |c_hat_i| <= 1, so each entry of the product is a sum of <= 50 terms of size <= 1,
  # accurate to ~50 ulps; the parameters (from eig) carry ~1e-15 relative error. 1e-12 leaves room.
  np.testing.assert_allclose(c_inverse @ c, np.eye(n), rtol=0, atol=1e-12)
  np.testing.assert_allclose(c @ c_inverse, np.eye(n), rtol=0, atol=1e-12)
  np.testing.assert_allclose(JAX_PAIR.noise_coefs(n),
                             toeplitz.inverse_coefs(JAX_PAIR.toeplitz_coefs(n), n), rtol=0,
                             atol=1e-13)
  np.testing.assert_allclose(JAX_PAIR.noise_coefs(n), _impulse_response(JAX_PAIR, n), rtol=0,
                             atol=1e-13)
  # The inverse of the inverse is the original pair (theta is already sorted decreasingly).
  theta_back, omega_back = blt.inverse_parameters(theta_hat, omega_hat)
  np.testing.assert_allclose(theta_back, JAX_PAIR.theta, rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(omega_back, JAX_PAIR.omega, rtol=1e-12)
  np.testing.assert_array_equal(blt.inverse_parameters(JAX_PAIR.theta, JAX_PAIR.omega)[0],
                                theta_hat)
  JAX_PAIR.check_noise_stable()


def test_negative_inverse_decay_powers_keep_their_sign():
  # One buffer: C = 1 / (1 - 0.5 x) (1 + 0.9 x / (1 - 0.5 x)) = (1 + 0.4 x) / (1 - 0.5 x), so
  # C^-1 = (1 - 0.5 x) / (1 + 0.4 x): c_hat = (1, -0.9, 0.36, -0.144, ...) = (1, -0.9 (-0.4)^(i-1)).
  strategy = blt.BLTStrategy(theta=(0.5,), omega=(0.9,))
  theta_hat, omega_hat = strategy.inverse()
  np.testing.assert_allclose(theta_hat, [-0.4], rtol=1e-15)
  np.testing.assert_allclose(omega_hat, [-0.9], rtol=1e-15)
  expected = np.concatenate([[1.0], -0.9 * (-0.4)**np.arange(29)])
  with np.errstate(all='raise'):  # no log of a negative decay, no nan
    np.testing.assert_allclose(strategy.noise_coefs(30), expected, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize('theta, omega', [
    ((0.5,), (0.9,)),           # theta_hat = 0.5 - 0.9 = -0.4
    ((0.9, 0.5), (0.3, 0.8)),   # theta_hat = (0.15 +- sqrt(0.4425)) = (0.815, -0.515)
    ((0.9, 0.3), (0.6, 0.7)),   # theta_hat = (-0.05 +- sqrt(0.5425)) = (0.687, -0.787)
    ((0.5,), (0.5,)),           # theta_hat = 0: C^-1 = 1 - 0.5 x
])
def test_inverse_with_decays_in_minus_one_to_zero_is_a_blt(theta, omega):
  strategy = blt.BLTStrategy(theta=theta, omega=omega)
  theta_hat, omega_hat = strategy.inverse()
  assert np.all(theta_hat > -1) and np.all(theta_hat <= 1) and theta_hat[-1] <= 0
  assert np.all(np.diff(theta_hat) < 0)
  n = 30
  expected = scipy.linalg.solve_triangular(_dense_c(strategy, n), np.eye(n), lower=True)[:, 0]
  np.testing.assert_allclose(strategy.noise_coefs(n), expected, rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(_dense_blt(theta_hat, omega_hat, n)[:, 0], expected, rtol=1e-12,
                             atol=1e-14)


@pytest.mark.parametrize('theta, omega, match', [
    ((0.9,), (-0.5,), r'`theta_hat`.*\[1\.4.*outside \(-1, 1\]'),  # theta_hat = 1.4
    ((0.5,), (1.6,), r'`theta_hat`.*outside \(-1, 1\]'),            # theta_hat = -1.1
    ((0.5,), (1.5,), r'`theta_hat`.*outside \(-1, 1\]'),            # theta_hat = -1 exactly
    ((0.9, 0.5), (0.5, -0.6), r'`theta_hat`.*complex'),
])
def test_inverse_refuses_unstable_or_complex_decays_and_noise_coefs_falls_back(theta, omega, match):
  strategy = blt.BLTStrategy(theta=theta, omega=omega)
  with pytest.raises(ValueError, match=match):
    strategy.inverse()
  with pytest.raises(ValueError, match=match):
    strategy.check_noise_stable()
  n = 30
  expected = scipy.linalg.solve_triangular(_dense_c(strategy, n), np.eye(n), lower=True)[:, 0]
  np.testing.assert_allclose(strategy.noise_coefs(n), expected, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(strategy.noise_matrix(n) @ strategy.strategy_matrix(n), np.eye(n),
                             rtol=0, atol=1e-9 * np.max(np.abs(expected)))


def test_inverse_parameters_validation_names_the_parameter():
  with pytest.raises(ValueError, match=r'`theta` entries must lie in \(-1, 1\]'):
    blt.inverse_parameters([1.2, 0.5], [0.1, 0.1])
  with pytest.raises(ValueError, match=r'`theta` entries must lie in \(-1, 1\]'):
    blt.inverse_parameters([-1.0], [0.1])
  with pytest.raises(ValueError, match='`omega`'):
    blt.inverse_parameters([0.9, 0.5], [0.1])
  with pytest.raises(ValueError, match='`theta`'):
    blt.inverse_parameters([np.nan], [0.1])
  with pytest.raises(ValueError, match='`theta_hat`.*repeated'):
    blt.inverse_parameters([0.5, 0.5], [0.0, 0.0])


# ------------------------------------------------------------------------------------------------
# Sensitivity, errors, losses.


@pytest.mark.parametrize('n, b, k, expected', [
    (30, 7, 3, 3.279278511421676), (40, 9, 4, 4.031994512368695), (25, 5, 5, 4.603543602451992)])
def test_sensitivity_matches_notes_t3(n, b, k, expected):
  strategy = APP_A[400]
  assert np.sqrt(strategy.sensitivity_squared(n, MinSep(b, k))) == pytest.approx(expected, rel=1e-12)
  assert strategy.sensitivity_is_exact(n, MinSep(b, k))


@pytest.mark.parametrize('strategy', [APP_A[100], blt.BLTStrategy((0.95, 0.4), (0.2, 0.3))])
@pytest.mark.parametrize('n, b, k', [(12, 3, None), (13, 4, 2), (10, 1, 1), (11, 2, 4)])
def test_losses_match_dense_brute_force(strategy, n, b, k):
  participation = MinSep(b, k)
  max_loss, rms_loss, sens_sq = _dense_losses(strategy, n, participation)
  losses = strategy.losses(n, participation)
  assert losses.sensitivity_squared == pytest.approx(sens_sq, rel=1e-12)
  assert losses.max_loss == pytest.approx(max_loss, rel=1e-11)
  assert losses.rms_loss == pytest.approx(rms_loss, rel=1e-11)


def test_sensitivity_upper_bound_when_thm31_does_not_apply():
  strategy = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.5, -0.6))  # c changes sign
  n, participation = 12, MinSep(3)
  c = strategy.strategy_matrix(n)
  assert np.any(c.T @ c < 0)
  # Lower bound on the true sensitivity: scalar contributions of either sign on admissible patterns.
  signed = max(np.sum((c[:, list(p)] @ np.array(s))**2)
               for p in patterns_lib.all_patterns(participation, n)
               for s in itertools.product((-1.0, 1.0), repeat=len(p)))
  assert not strategy.sensitivity_is_exact(n, participation)
  assert strategy.sensitivity_squared(n, participation) >= signed - 1e-12


# c of BLT((0.9, 0.3), (0.6, 0.7)) is (1, 1.3, 0.75, ...): non-negative, not monotone (c_1 > c_0),
# and its inverse has theta_hat ~ (0.687, -0.787).
NON_MONOTONE = blt.BLTStrategy(theta=(0.9, 0.3), omega=(0.6, 0.7))


@pytest.mark.parametrize('n, b, k', [(12, 2, None), (12, 3, 3), (11, 4, None), (12, 1, 3),
                                     (10, 2, 2)])
def test_sensitivity_with_negative_inverse_decays_brute_force(n, b, k):
  participation = MinSep(b, k)
  for strategy in (JAX_PAIR, NON_MONOTONE):
    assert strategy.inverse()[0][-1] < 0
    c = _dense_c(strategy, n)
    assert np.all(c >= 0)
    # C >= 0 elementwise, so X = C^T C >= 0 and the worst contribution on a pattern is u = 1 on it:
    # the max over the maximal admissible 0/1 patterns is the exact squared sensitivity.
    brute = max(np.sum(c[:, list(p)].sum(axis=1)**2)
                for p in patterns_lib.patterns(participation, n))
    value = strategy.sensitivity_squared(n, participation)
    coefs = strategy.toeplitz_coefs(n)
    if np.all(np.diff(coefs) <= 0):  # Thm. 3.1: exact
      assert strategy is JAX_PAIR
      assert strategy.sensitivity_is_exact(n, participation)
      assert value == pytest.approx(brute, rel=1e-12)
    else:  # the non-increasing majorant of |c|: an upper bound, reported as such
      assert strategy is NON_MONOTONE
      assert not strategy.sensitivity_is_exact(n, participation)
      assert value >= brute * (1 - 1e-12)
    assert value == sensitivity.toeplitz_squared(coefs, n, participation)


@pytest.mark.parametrize('b, n, k, sens, max_loss, rms_loss', [
    (100, 2000, 10, 7.686141, 18.84705, 15.24772),
    (400, 4000, 5, 4.883132, 10.67219, 9.74017),
    (1000, 4000, 2, 2.833428, 5.68435, 5.33955),
])
def test_app_a_losses(b, n, k, sens, max_loss, rms_loss):
  losses = APP_A[b].losses(n, MinSep(b, k))
  assert np.sqrt(losses.sensitivity_squared) == pytest.approx(sens, abs=1e-6)
  assert losses.max_loss == pytest.approx(max_loss, abs=1e-5)
  assert losses.rms_loss == pytest.approx(rms_loss, abs=1e-5)


@pytest.mark.parametrize('b, n, min_sep, k, sens', [
    (1000, 2000, 2001, 1, 1.8323),  # pt-BR BLT-8.681 (BLT paper Table 4)
    (400, 2350, 447, 5, 4.6081),    # id-ID BLT-7.379
])
def test_table4_accounting_sensitivities(b, n, min_sep, k, sens):
  sens_sq = APP_A[b].sensitivity_squared(n, MinSep(min_sep, k))
  assert np.sqrt(sens_sq) == pytest.approx(sens, abs=5e-5)


def test_errors_closed_form_matches_dense_decoder():
  n = 300
  strategy = APP_A[400]
  assert strategy.errors(n) == pytest.approx(
      base.errors_from_decoder(np.tril(np.ones((n, n))) @ np.linalg.inv(_dense_c(strategy, n))),
      rel=1e-10)


# ------------------------------------------------------------------------------------------------
# Differentiable loss (Alg. 4).


_EPS = np.finfo(np.float64).eps


def _central_differences(f, x, max_step, relative_noise, levels=25):
  """Central differences of f at x, one coordinate at a time, each with a derived error bound.

  For one coordinate let g(s) = f(x + s e_i) and D(h) = (g(h) - g(-h)) / (2 h), with the steps
  actually taken, (x_i + h) - x_i and x_i - (x_i - h): they differ by at most an ulp of x_i, and the
  resulting g''(0) ulp(x_i) / 2 is far below the rounding term below.
    * Truncation (Taylor): D(h) = g'(0) + c h^2 + r(h), c = g'''(0) / 6, r(h) = O(h^4).
    * Rounding: each computed g is within rho = relative_noise * |g| of the exact value, so the
      computed D(h) is within rho / h of the exact D(h).
    * Estimate of c h^2 from a second step: D(2h) - D(h) = 3 c h^2 + r(2h) - r(h), computed with
      rounding <= rho / h + rho / (2 h). Hence
        |D(h) - g'(0)| <= |c h^2| + |r(h)| + rho / h <= |D(2h) - D(h)| / 3 + 6 |r(h)| + 1.5 rho / h
      (r(2h) ~ 16 r(h)).
    * tol(h) = tau(h) + 2 rho / h, tau(h) = max(|D(2h) - D(h)|, |D(4h) - D(2h)| / 4): both terms of
      the max estimate 3 |c| h^2 (the second guards against an accidental cancellation in the
      first), i.e. three times the truncation estimate, which also covers the O(h^4) remainder while
      |r(h)| is below about |c| h^2 / 8 (h well inside the Taylor series' radius, see `max_step`).
  The step is chosen for the conditioning of each coordinate: h runs over max_step * 2^-k and the h
  with the smallest bound wins (large h: truncation dominates; small h: rounding does).

  Args:
    f: the scalar function.
    x: the point.
    max_step: largest step; x +- max_step must stay where f is smooth, below about a quarter of the
      distance to f's nearest singularity or scale of variation.
    relative_noise: bound on the relative rounding error of one evaluation of f.
    levels: number of steps tried.

  Returns:
    (numeric gradient, tol) with |numeric - true gradient| <= tol componentwise.
  """
  numeric, tol = np.empty(x.size), np.empty(x.size)
  for i in range(x.size):
    diffs, steps, noise = [], [], []
    for k in range(levels):
      plus, minus = x.copy(), x.copy()
      plus[i] += max_step * 2.0**-k
      minus[i] -= max_step * 2.0**-k
      f_plus, f_minus = f(plus), f(minus)
      step_sum = (plus[i] - x[i]) + (x[i] - minus[i])
      diffs.append((f_plus - f_minus) / step_sum)
      steps.append(step_sum / 2)
      noise.append(relative_noise * max(abs(f_plus), abs(f_minus)))
    best = np.inf
    for k in range(2, levels):  # h = steps[k], 2h = steps[k - 1], 4h = steps[k - 2].
      tau = max(abs(diffs[k - 1] - diffs[k]), abs(diffs[k - 2] - diffs[k - 1]) / 4)
      bound = tau + 2 * max(noise[k - 2:k + 1]) / steps[k]
      if bound < best:
        best, numeric[i] = bound, diffs[k]
    tol[i] = best
  return numeric, tol


def _check_gradient(grad, f, x, max_step, num_rounds):
  """Asserts `grad` = the gradient of f at x within the bound of `_central_differences`.

  The rounding error of one evaluation of f is taken as num_rounds * eps * |f|: f sums O(n)
  float64 terms, and n eps bounds the relative rounding error of an n-term sum of one sign (Higham,
  Accuracy and Stability of Numerical Algorithms, Sec. 4.2: gamma_n = n u / (1 - n u),
  u = eps / 2); the other operations (O(d) products, exp, log, sqrt) add O(eps) each.
  """
  numeric, tol = _central_differences(f, x, max_step, num_rounds * _EPS)
  assert np.all(np.abs(grad - numeric) <= tol), (grad, numeric, tol)
  # The check can fail: every bound is below 0.5% of its component, so a gradient 1% off in any
  # component is outside it, e.g. 1.01 times the correct one.
  assert np.all(tol < 0.005 * np.abs(grad)), (grad, tol)
  assert np.all(np.abs(1.01 * grad - numeric) > tol)


@pytest.mark.parametrize('error', ['max', 'rms'])
def test_loss_and_gradient_value_matches_dense_losses(error):
  n, participation = 12, MinSep(3)
  theta, theta_hat = np.array([0.97, 0.6]), np.array([0.8, 0.3])
  omega = blt.calc_output_scale(theta, theta_hat)
  max_loss, rms_loss, _ = _dense_losses(blt.BLTStrategy(theta, omega), n, participation)
  value, _, _ = blt.loss_and_gradient(theta, theta_hat, n, participation, error)
  assert value == pytest.approx(max_loss if error == 'max' else rms_loss, rel=1e-12)


def test_loss_and_gradient_app_a_value():
  strategy = APP_A[400]
  theta_hat, _ = strategy.inverse()
  value, _, _ = blt.loss_and_gradient(strategy.theta, theta_hat, 4000, MinSep(400, 5))
  assert value == pytest.approx(10.67219, abs=1e-5)


@pytest.mark.parametrize('error', ['max', 'rms'])
@pytest.mark.parametrize('barrier', [0.0, 1e-3])
@pytest.mark.parametrize('n, b, k', [(30, 7, 3), (200, 40, None), (50, 1, 1)])
def test_gradient_matches_finite_differences(error, barrier, n, b, k):
  participation = MinSep(b, k)
  theta, theta_hat = np.array([0.99, 0.8, 0.3]), np.array([0.95, 0.5, 0.1])
  _, grad_theta, grad_theta_hat = blt.loss_and_gradient(theta, theta_hat, n, participation, error,
                                                        barrier)

  def f_theta(x):
    return blt.loss_and_gradient(x, theta_hat, n, participation, error, barrier)[0]

  def f_theta_hat(x):
    return blt.loss_and_gradient(theta, x, n, participation, error, barrier)[0]

  # f is smooth while the decays stay in (0, 1) and interlaced (omega > 0 for the barrier), and the
  # powers theta^t, t < n, vary on the scale 1 / n.
  decays = np.sort(np.concatenate([[0.0, 1.0], theta, theta_hat]))
  max_step = min(np.min(np.diff(decays)), 1.0 / n) / 8
  _check_gradient(grad_theta, f_theta, theta, max_step, n)
  _check_gradient(grad_theta_hat, f_theta_hat, theta_hat, max_step, n)


@pytest.mark.parametrize('logits', [
    [3.0, 1.0, 2.0, 0.5],
    [25.0, 8.0, 1.5, 0.2],          # theta_1 = 1 - 1.4e-11
    [30.0, 6.0, 3.0, 2.0, 1.0, 0.5],
])
def test_optimizer_objective_gradient_matches_finite_differences(logits):
  logits = np.array(logits)
  args = (500, 100, 5, 'max', 1e-7)
  _, grad = blt._objective(logits, *args)
  # In one logit the objective is analytic at distance >= pi from the real axis (log sigmoid has its
  # branch points at +-i pi; the decay differences and omega vanish only there or beyond), and
  # sum_t theta^t varies on the scale 1 in the logit: steps up to 1/4.
  _check_gradient(grad, lambda x: blt._objective(x, *args)[0], logits, 0.25, args[0])


@pytest.mark.parametrize('barrier', [0.0, 1e-7])
def test_optimizer_objective_with_decays_equal_in_float64(barrier):
  # v = cumprod(sigmoid(logits)): v_1 = 6.3e-8 > v_2 > v_3 differ by factors sigmoid(44) = 1 - 8e-20
  # and sigmoid(40), so all three are equal in float64, and log sigmoid(44) is below the resolution
  # of log v_1 = -16.6. Differences of cumulative log-sums came out 0 and Alg. 5 divided 0 by 0.
  logits = np.array([-2.5, -14.0, 44.0, 40.0])
  n, participation = 20, MinSep(4, 3)
  min_sep, count = blt._pattern_shape(n, participation)
  with np.errstate(divide='raise', invalid='raise', over='raise'):
    value, grad = blt._objective(logits, n, min_sep, count, 'max', barrier)
    strategy = blt._strategy_from_logits(logits)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  # Reference independent of Alg. 5: C(x) = prod_j (1 - theta_hat_j x) / prod_j (1 - theta_j x),
  # expanded by series division (the pole and zeros that coincide in float64 cancel).
  v = np.cumprod(scipy.special.expit(logits))
  impulse = np.eye(1, n)[0]
  coefs = scipy.signal.lfilter(np.poly(v[1::2]), np.poly(v[0::2]), impulse)
  np.testing.assert_allclose(strategy.toeplitz_coefs(n), coefs, rtol=1e-13, atol=1e-15)
  max_loss, _, _ = _dense_losses_of_matrix(scipy.linalg.toeplitz(coefs, np.zeros(n)),
                                           participation)
  # The barrier adds 1e-7 * sum(-log theta - log(1 - theta) - log omega), about 1e-7 * 140 here
  # (omega_2 ~ 2e-50).
  assert value - barrier * 200 <= max_loss * (1 + 1e-12) and value >= max_loss * (1 - 1e-12)


def test_optimizer_objective_equals_strategy_loss_plus_barrier():
  logits = np.array([25.0, 6.0, 2.0, 1.0])
  value, _ = blt._objective(logits, 500, 100, 5, 'rms', 0.0)
  strategy = blt._strategy_from_logits(logits)
  assert value == pytest.approx(strategy.losses(500, MinSep(100, 5)).rms_loss, rel=1e-12)
  with_barrier, _ = blt._objective(logits, 500, 100, 5, 'rms', 1e-3)
  theta, omega = np.array(strategy.theta), np.array(strategy.omega)
  # 1 - theta_1 = sigmoid(-25): use it directly (1 - theta_1 in float64 has 5 digits).
  one_minus = np.array([1 / (1 + np.exp(25.0)), *(1 - theta[1:])])
  barrier = 1e-3 * np.sum(-np.log(theta) - np.log(one_minus) - np.log(omega))
  assert with_barrier == pytest.approx(value + barrier, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# Optimizer (BLT paper Table 3; its printed "RMS Loss" column is MaxLoss and vice versa).


def test_table3_two_buffers_k6():
  result = blt.optimize_blt(TABLE3_N, TABLE3, num_buffers=2)
  assert result.strategy.num_buffers == 2
  assert result.losses.max_loss <= 10.81 * 1.005
  assert result.losses.rms_loss == pytest.approx(9.34, rel=5e-3)
  assert result.losses == result.strategy.losses(TABLE3_N, TABLE3)
  assert sum(result.strategy.omega) < 1 and min(result.strategy.omega) > 0


@pytest.mark.parametrize('num_buffers', [3, 4, 5])
def test_table3_more_buffers_k6(num_buffers):
  result = blt.optimize_blt(TABLE3_N, TABLE3, num_buffers=num_buffers)
  assert result.strategy.num_buffers == num_buffers
  assert result.losses.max_loss <= 10.79 * 1.005


def test_table3_single_participation_parameters_at_k6():
  strategy = blt.BLTStrategy(theta=(0.998902, 0.930336), omega=(0.052455, 0.30442))
  losses = strategy.losses(TABLE3_N, TABLE3)
  assert losses.max_loss == pytest.approx(11.80, rel=5e-3)
  assert losses.rms_loss == pytest.approx(11.15, rel=5e-3)


def test_table3_optimized_for_single_participation_evaluated_at_k6():
  result = blt.optimize_blt(TABLE3_N, participation_lib.ParticipationSchema.single(),
                            num_buffers=2)
  # Single-participation MaxLoss of the k=1 BLT behind Table 3's "BLT (nbuf=2, k=1)" row (BLT paper
  # Sec. 4.1; not printed, recomputed; docs/papers.md#blt).
  assert result.losses.max_loss == pytest.approx(3.5853, rel=1e-3)
  losses = result.strategy.losses(TABLE3_N, TABLE3)
  assert losses.max_loss == pytest.approx(11.80, rel=5e-3)
  assert losses.rms_loss == pytest.approx(11.15, rel=5e-3)


def test_table3_five_buffers_optimized_for_single_participation_evaluated_at_k6():
  # The "BLT (nbuf=5, k=1)" row: 11.40 / 10.87 (MaxLoss / RmsLoss after un-swapping the headers).
  result = blt.optimize_blt(TABLE3_N, participation_lib.ParticipationSchema.single(),
                            num_buffers=5)
  losses = result.strategy.losses(TABLE3_N, TABLE3)
  assert losses.max_loss == pytest.approx(11.40, rel=5e-3)
  assert losses.rms_loss == pytest.approx(10.87, rel=5e-3)


def test_optimizer_reaches_app_a_b400_at_its_stated_setting():
  result = blt.optimize_blt(4000, MinSep(400, 5), num_buffers=4)
  assert result.losses.max_loss <= 10.67219 * (1 + 1e-5)


def test_rms_optimization_beats_max_optimization_on_rms():
  rms = blt.optimize_blt(TABLE3_N, TABLE3, num_buffers=2, error='rms')
  assert rms.details['error'] == 'rms'
  assert rms.losses.rms_loss < 9.3434 * 0.995


def test_num_buffers_none_picks_smallest_within_tolerance():
  result = blt.optimize_blt(1000, MinSep(250), max_num_buffers=4)
  by_d = {int(d): loss for d, loss in result.details['loss_by_num_buffers'].items()}
  assert sorted(by_d) == [1, 2, 3, 4]
  best = min(by_d.values())
  chosen = result.details['num_buffers']
  assert result.strategy.num_buffers == chosen
  assert by_d[chosen] <= best * 1.0005
  assert all(by_d[d] > best * 1.0005 for d in by_d if d < chosen)
  assert by_d[1] > by_d[2]  # one buffer is not enough (BLT paper Fig. 5)


# ------------------------------------------------------------------------------------------------
# Validation, config, printing.


@pytest.mark.parametrize('theta, omega, match', [
    ((0.0, 0.5), (0.1, 0.1), 'theta'),
    ((1.5,), (0.1,), 'theta'),
    ((np.nan,), (0.1,), 'theta'),
    ((), (), 'theta'),
    ((0.9, 0.5), (0.1,), 'omega'),
    ((0.9,), (np.inf,), 'omega'),
    ('abc', (0.1,), 'theta'),
])
def test_strategy_validation(theta, omega, match):
  with pytest.raises(ValueError, match=match):
    blt.BLTStrategy(theta, omega)


def test_theta_one_is_allowed():
  strategy = blt.BLTStrategy((1.0,), (0.5,))
  np.testing.assert_allclose(strategy.toeplitz_coefs(4), [1, 0.5, 0.5, 0.5])


def test_limit_normalized_loss_is_the_large_n_limit():
  # The finite-n ratios approach the limit as c / n (boundary rows, the buffers' transients; the
  # slowest, exp(-n (1 - theta_1)), is below 1e-40 here): n * gap is positive, below
  # 5 (b + 1 / (1 - theta_1)), and the same at n and 10 n up to the next order, O((b + 100) / n).
  strategy = blt.BLTStrategy(theta=(0.99, 0.9), omega=(0.2, 0.3))
  min_sep = 100
  limit = blt.limit_normalized_loss(strategy, min_sep)
  scaled_gaps = []
  for n in (10_000, 100_000):
    losses = strategy.losses(n, MinSep(min_sep))
    scale = np.sqrt(n * -(-n // min_sep))
    scaled_gaps.append([n * (losses.max_loss / scale - limit) / limit,
                        n * (losses.rms_loss * np.sqrt(2) / scale - limit) / limit])
  np.testing.assert_allclose(scaled_gaps[1], scaled_gaps[0], rtol=0.1)
  assert np.all(np.array(scaled_gaps) > 0)
  assert np.all(np.array(scaled_gaps) < 5 * (min_sep + 1 / (1 - 0.99)))


def test_limit_normalized_loss_lower_bound_and_production_blts():
  # Cauchy-Schwarz: sum_r g_r = C(1) = 1 / beta, so beta^2 sum_r g_r^2 >= 1 / b, equality for constant
  # g_r, which the App. A BLTs (theta_1 = 1 - 1e-11) reach up to O(1 - theta_1).
  rng = np.random.default_rng(4)
  for _ in range(20):
    theta = np.sort(rng.uniform(0.05, 0.999, size=3))[::-1]
    omega = rng.uniform(0.01, 1.0, size=3)
    omega /= max(1.0, np.sum(omega))
    for min_sep in (1, 7, 400):
      assert blt.limit_normalized_loss(blt.BLTStrategy(theta=tuple(theta), omega=tuple(omega)),
                                       min_sep) >= 1 / np.sqrt(min_sep) * (1 - 1e-12)
  for min_sep in (400, 1000):
    assert blt.limit_normalized_loss(APP_A[min_sep], min_sep) == pytest.approx(
        1 / np.sqrt(min_sep), rel=1e-9)
  with pytest.raises(ValueError, match='theta < 1'):
    blt.limit_normalized_loss(blt.BLTStrategy(theta=(1.0,), omega=(0.5,)), 10)
  with pytest.raises(ValueError, match='min_sep'):
    blt.limit_normalized_loss(APP_A[400], 0)


def test_function_validation():
  with pytest.raises(ValueError, match='theta'):
    blt.calc_output_scale([0.5, 0.5], [0.4, 0.3])
  with pytest.raises(ValueError, match='theta_hat'):
    blt.calc_output_scale([0.5, 0.4], [0.3])
  with pytest.raises(ValueError, match='error'):
    blt.loss_and_gradient([0.9], [0.5], 10, MinSep(2), error='mean')
  with pytest.raises(ValueError, match='participation'):
    blt.loss_and_gradient([0.9], [0.5], 10, None)
  with pytest.raises(ValueError, match='theta_hat'):
    blt.loss_and_gradient([0.9], [1.5], 10, MinSep(2))
  with pytest.raises(ValueError, match='`theta_hat`.*log-decay'):
    blt.loss_and_gradient([0.9], [-0.4], 10, MinSep(2))  # a valid inverse, but never a log argument
  with pytest.raises(ValueError, match='num_buffers'):
    blt.optimize_blt(100, MinSep(10), num_buffers=0)
  with pytest.raises(ValueError, match='num_rounds'):
    blt.optimize_blt(0, MinSep(10))
  with pytest.raises(ValueError, match='num_rounds'):
    APP_A[400].toeplitz_coefs(0)


def test_config_round_trip_and_copy_pastable_str():
  strategy = APP_A[400]
  config = strategy.to_config()
  assert config['mechanism'] == 'blt'
  assert blt.BLTStrategy.from_config(config) == strategy
  assert eval(str(strategy), {'BLTStrategy': blt.BLTStrategy}) == strategy  # pylint: disable=eval-used
  assert strategy.name == 'blt' and strategy.max_rounds is None
  with pytest.raises(ValueError, match='mechanism'):
    blt.BLTStrategy.from_config({'mechanism': 'banded', 'theta': [0.5], 'omega': [0.1]})
  with pytest.raises(ValueError, match='omega'):
    blt.BLTStrategy.from_config({'mechanism': 'blt', 'theta': [0.5]})
  with pytest.raises(ValueError, match='Unknown'):
    blt.BLTStrategy.from_config({'mechanism': 'blt', 'theta': [0.5], 'omega': [0.1], 'x': 1})


@pytest.mark.e2e
def test_mechanisms_blt_does_not_import_tensorflow_or_jax():
  import subprocess
  import sys
  code = ('import sys; import dp_ftrl_tff.mechanisms.blt as m; '
          'm.optimize_blt(50, m.participation_lib.ParticipationSchema.b_min_sep(10), 1); '
          'assert "tensorflow" not in sys.modules and "jax" not in sys.modules')
  subprocess.run([sys.executable, '-c', code], check=True)


def test_optimizer_cost_model_matches_what_it_took():
  # Measured on this machine type: 0.98 s (d = 8) and 106 s (d = 96) at n = 100, 2.3 s (d = 8) at
  # n = 2000: the model is within a factor of two.
  for n, d, seconds in ((100, 8, 0.98), (100, 96, 106.0), (2000, 8, 2.3)):
    assert seconds / 2 <= blt.optimization_cost(n, d)[0] <= seconds * 2
  assert blt.optimization_cost(10**5, 4)[1] == (24 * 4 + 64) * 10**5
  assert math.isfinite(blt.optimization_cost(100, 2**63)[0])  # closed form: no loop over d


@pytest.mark.parametrize('num_rounds, num_buffers, fragment', [
    (100, 2**63, r'`num_buffers`=9223372036854775808 at `num_rounds`=100: the BLT optimizer\'s '
     r'arrays need about .* EB .* use at most `num_buffers`=2\d\d here'),
    (100, 1000, r'`num_buffers`=1000 at `num_rounds`=100: .* would take about 13.4 days .* use at '
     r'most `num_buffers`=2\d\d here'),
    (10**7, None, r'`num_rounds`=10000000 \(buffer counts 1 \.\. 8\): .* about 1.72 hours .* '
     r'optimize for fewer `num_rounds`'),
])
def test_optimizer_refuses_what_it_cannot_finish_before_it_starts(num_rounds, num_buffers,
                                                                 fragment):
  start = time.perf_counter()
  with pytest.raises(ValueError, match=fragment):
    blt.optimize_blt(num_rounds, participation_lib.ParticipationSchema(10), num_buffers)
  assert time.perf_counter() - start < 5
