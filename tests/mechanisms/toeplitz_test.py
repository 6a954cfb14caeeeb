"""Tests for toeplitz: dense matrices and published BLT figures as references."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import scipy.linalg

from dp_ftrl_tff.mechanisms import toeplitz

pytestmark = pytest.mark.unit

# BLT paper App. A, b = 400 production parameters (theta, omega).
THETA_400 = np.array([0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778])
OMEGA_400 = np.array([0.0070314825502323835, 0.10613806907600574, 0.1898159060327625,
                      0.1966594748073734])


def blt_coefs(theta, omega, n):
  """c_0 = 1, c_i = sum_j omega_j theta_j^(i-1) (BLT paper Eq. 2), written out independently."""
  i = np.arange(1, n)
  return np.concatenate([[1.0], (omega[None, :] * theta[None, :]**(i[:, None] - 1)).sum(axis=1)])


def test_materialize_entries():
  c = toeplitz.materialize([1.0, 2.0, 3.0], 4)
  expected = np.array([[1, 0, 0, 0], [2, 1, 0, 0], [3, 2, 1, 0], [0, 3, 2, 1]], dtype=float)
  np.testing.assert_array_equal(c, expected)
  np.testing.assert_array_equal(toeplitz.materialize([5.0, 6.0, 7.0], 2), [[5, 0], [6, 5]])
  assert toeplitz.materialize([1.0], 3).dtype == np.float64


@hypothesis.settings(deadline=None, max_examples=60)
@hypothesis.given(n=st.integers(1, 40), length=st.integers(1, 45), seed=st.integers(0, 2**31))
def test_inverse_coefs_match_dense_inverse(n, length, seed):
  rng = np.random.default_rng(seed)
  c = rng.normal(size=length) * 0.5**np.arange(length)
  c[0] = rng.choice([-1, 1]) * rng.uniform(0.5, 2.0)
  dense_inverse = np.linalg.inv(toeplitz.materialize(c, n))
  np.testing.assert_allclose(toeplitz.materialize(toeplitz.inverse_coefs(c, n), n), dense_inverse,
                             atol=1e-10)


def test_inverse_coefs_large_n_against_triangular_solve():
  n = 5000
  c = blt_coefs(THETA_400, OMEGA_400, n)
  impulse = np.zeros(n)
  impulse[0] = 1.0
  expected = scipy.linalg.solve_triangular(toeplitz.materialize(c, n), impulse, lower=True)
  np.testing.assert_allclose(toeplitz.inverse_coefs(c, n), expected, rtol=0, atol=1e-12)


def test_inverse_coefs_published_blt_values():
  # Alg. 3 impulse response of the BLT paper's App. A b=400 BLT (docs/papers.md#blt).
  expected = [1, -0.49964493, -0.13010121, -0.05797082, -0.0378294, -0.02831443]
  got = toeplitz.inverse_coefs(blt_coefs(THETA_400, OMEGA_400, 6), 6)
  np.testing.assert_allclose(got, expected, atol=1e-8)


def test_inverse_of_sqrt_series_is_its_reciprocal_series():
  # sqrt(A) has coefficients binom(2i, i) / 4^i; the inverse series (1 - x)^(1/2) has -1/(2i-1) times them.
  n = 64
  r = np.ones(n)
  for i in range(1, n):
    r[i] = r[i - 1] * (2 * i - 1) / (2 * i)
  expected = np.concatenate([[1.0], -r[1:] / (2 * np.arange(1, n) - 1)])
  np.testing.assert_allclose(toeplitz.inverse_coefs(r, n), expected, atol=1e-14)


@hypothesis.settings(deadline=None, max_examples=60)
@hypothesis.given(n=st.integers(1, 30), seed=st.integers(0, 2**31))
def test_errors_from_noise_coefs_match_dense_decoder(n, seed):
  rng = np.random.default_rng(seed)
  c_hat = rng.normal(size=n)
  decoder = np.tril(np.ones((n, n))) @ toeplitz.materialize(c_hat, n)
  row_sq = np.sum(decoder**2, axis=1)
  max_error, rms_error = toeplitz.errors_from_noise_coefs(c_hat)
  assert max_error == pytest.approx(np.sqrt(row_sq.max()), rel=1e-12)
  assert rms_error == pytest.approx(np.sqrt(row_sq.mean()), rel=1e-12)


def test_errors_of_identity_noise_are_prefix_sum_errors():
  # C^-1 = I: B = A, MaxError sqrt(n), RmsError sqrt((n + 1) / 2).
  n = 2052
  c_hat = np.zeros(n)
  c_hat[0] = 1.0
  max_error, rms_error = toeplitz.errors_from_noise_coefs(c_hat)
  assert max_error == pytest.approx(np.sqrt(n))
  assert rms_error == pytest.approx(np.sqrt((n + 1) / 2))


def test_published_blt_errors():
  # App. A b=400 BLT at its stated n = 4000 (BLT paper Prop. 3.3; docs/papers.md#blt): MaxLoss /
  # sens and RmsLoss / sens, computed from the parameters.
  n = 4000
  c_hat = toeplitz.inverse_coefs(blt_coefs(THETA_400, OMEGA_400, n), n)
  max_error, rms_error = toeplitz.errors_from_noise_coefs(c_hat)
  assert max_error == pytest.approx(2.185522, abs=2e-6)
  assert rms_error == pytest.approx(1.994656, abs=2e-6)


@pytest.mark.parametrize('call', [
    lambda: toeplitz.materialize([], 3),
    lambda: toeplitz.materialize([[1.0]], 3),
    lambda: toeplitz.materialize([1.0, np.nan], 3),
    lambda: toeplitz.inverse_coefs([0.0, 1.0], 3),
    lambda: toeplitz.inverse_coefs([1.0], 0),
])
def test_invalid_inputs_raise(call):
  with pytest.raises(ValueError, match='coefs|num_rounds'):
    call()


def test_invalid_noise_coefs_raise():
  with pytest.raises(ValueError, match='noise_coefs'):
    toeplitz.errors_from_noise_coefs([])
  with pytest.raises(ValueError, match='noise_coefs'):
    toeplitz.errors_from_noise_coefs([1.0, np.inf])
