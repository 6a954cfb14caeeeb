"""Tests for the closed-form BSR and BISR strategies against dense matrix math and brute force."""

import json

import numpy as np
import pytest
import scipy.linalg
import scipy.special

from dp_ftrl_tff.mechanisms import banded, base, files, registry, sensitivity, square_root
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

BSR = square_root.BandedSquareRootStrategy
BISR = square_root.BandedInverseSquareRootStrategy
MinSep = participation_lib.ParticipationSchema.b_min_sep


def _binomial_sqrt_coefs(n):
  """c_j = binom(2j, j) / 4^j from exact integer binomials (independent of the recursions)."""
  return np.array([scipy.special.comb(2 * j, j, exact=True) / 4**j for j in range(n)], float)


def _dense_inverse(matrix):
  return scipy.linalg.solve_triangular(matrix, np.eye(matrix.shape[0]), lower=True)


def _bandwidth(matrix):
  rows, cols = np.nonzero(np.abs(matrix) > 0)
  return int(np.max(rows - cols)) + 1


def test_coefficients_match_binomials():
  n = 30
  c = _binomial_sqrt_coefs(n)
  r = np.concatenate([[1.0], -c[1:] / (2 * np.arange(1, n) - 1)])
  np.testing.assert_allclose(banded.fhu_coefficients(n), c, rtol=1e-14)
  np.testing.assert_allclose(square_root.inverse_square_root_coefs(n), r, rtol=1e-14)
  # (1 - x)^(1/2) (1 - x)^(-1/2) = 1 and ((1 - x)^(-1/2))^2 = 1 / (1 - x).
  np.testing.assert_allclose(np.convolve(r, c)[:n], np.eye(1, n)[0], atol=1e-15)
  np.testing.assert_allclose(np.convolve(c, c)[:n], np.ones(n), rtol=1e-14)


@pytest.mark.parametrize('cls', [BSR, BISR])
@pytest.mark.parametrize('n', [1, 7, 24])
def test_full_square_root_squares_to_prefix_sums(cls, n):
  strategy = cls(num_bands=n + 3)  # b-hat >= n: the full square root over n rounds
  c = strategy.strategy_matrix(n)
  np.testing.assert_allclose(c @ c, base.prefix_sum_workload(n), rtol=1e-13, atol=1e-13)
  np.testing.assert_allclose(strategy.noise_matrix(n) @ strategy.noise_matrix(n),
                             _dense_inverse(base.prefix_sum_workload(n)), atol=1e-13)


@pytest.mark.parametrize('num_bands', [1, 2, 5, 16])
def test_bsr_is_banded_and_its_inverse_is_dense(num_bands):
  n = 16
  strategy = BSR(num_bands)
  c = strategy.strategy_matrix(n)
  expected = scipy.linalg.toeplitz(np.concatenate([_binomial_sqrt_coefs(num_bands),
                                                   np.zeros(n - num_bands)]), np.zeros(n))
  np.testing.assert_allclose(c, expected, rtol=1e-15)
  assert _bandwidth(c) == num_bands
  np.testing.assert_allclose(strategy.noise_matrix(n), _dense_inverse(c), rtol=1e-12, atol=1e-14)
  # The banded storage the streaming noise uses, and the numpy streaming reference.
  np.testing.assert_array_equal(strategy.band_rows(n), banded.band_rows_from_matrix(c))
  values = np.random.default_rng(0).normal(size=(n, 3))
  np.testing.assert_allclose(banded.stream_inverse(strategy.band_rows(n), values),
                             strategy.noise_matrix(n) @ values, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('num_bands', [1, 2, 5, 16])
def test_bisr_noise_is_banded_and_strategy_is_its_inverse(num_bands):
  n = 16
  strategy = BISR(num_bands)
  m = strategy.noise_matrix(n)
  assert _bandwidth(m) == num_bands
  np.testing.assert_array_equal(m[:num_bands, 0], strategy.moving_average_coefs())
  np.testing.assert_allclose(strategy.strategy_matrix(n), _dense_inverse(m), rtol=1e-12,
                             atol=1e-14)
  # C is dense unless b-hat = 1 (DP-SGD), with non-negative non-increasing coefficients.
  coefs = strategy.toeplitz_coefs(n)
  assert np.all(coefs >= 0) and np.all(np.diff(coefs) <= 0)
  assert _bandwidth(strategy.strategy_matrix(n)) == (1 if num_bands == 1 else n)


def _brute_force_squared(c, schema):
  """max over admissible patterns of ||C u(pi)||^2; the true sensitivity since C^T C >= 0."""
  assert np.all(c.T @ c >= 0)
  n = c.shape[1]
  return max(np.sum(c[:, list(p)].sum(axis=1)**2) for p in patterns_lib.patterns(schema, n))


SCHEMAS = [MinSep(1, 1), MinSep(1, 3), MinSep(2, 2), MinSep(3, 3), MinSep(3, None), MinSep(5, 2),
           participation_lib.ParticipationSchema.fixed_epoch_order(3, 4)]


@pytest.mark.parametrize('cls', [BSR, BISR])
@pytest.mark.parametrize('num_bands', [1, 2, 4, 12])
@pytest.mark.parametrize('schema', SCHEMAS, ids=str)
def test_sensitivity_matches_brute_force(cls, num_bands, schema):
  n = 12
  strategy = cls(num_bands)
  expected = _brute_force_squared(strategy.strategy_matrix(n), schema)
  assert strategy.sensitivity_squared(n, schema) == pytest.approx(expected, rel=1e-12)
  assert strategy.sensitivity_is_exact(n, schema)


@pytest.mark.parametrize('cls', [BSR, BISR])
def test_sensitivity_against_dense_methods_at_larger_n(cls):
  n, schema = 300, MinSep(40, 5)
  strategy = cls(40)
  c = strategy.strategy_matrix(n)
  dense = sensitivity.dense_squared(c, schema)
  if cls is BSR:  # b-hat <= min_sep: BandMF Alg. 5 is exact too
    assert sensitivity.dense_squared_is_exact(c, schema)
    assert strategy.sensitivity_squared(n, schema) == pytest.approx(dense, rel=1e-12)
  else:  # C is dense: Alg. 4 is only an upper bound
    assert strategy.sensitivity_squared(n, schema) <= dense * (1 + 1e-12)
  # Lower bound: the admissible pattern (0, b, ..., 4b) itself.
  u = np.zeros(n)
  u[:5 * 40:40] = 1.0
  assert strategy.sensitivity_squared(n, schema) >= np.sum((c @ u)**2) * (1 - 1e-12)


@pytest.mark.parametrize('cls', [BSR, BISR])
@pytest.mark.parametrize('num_bands', [1, 3, 50])
def test_errors_and_losses_match_dense_decoder(cls, num_bands):
  n, schema = 40, MinSep(7, 3)
  strategy = cls(num_bands)
  decoder = base.prefix_sum_workload(n) @ _dense_inverse(strategy.strategy_matrix(n))
  max_error, rms_error = base.errors_from_decoder(decoder)
  np.testing.assert_allclose(strategy.errors(n), (max_error, rms_error), rtol=1e-12)
  losses = strategy.losses(n, schema)
  sens = np.sqrt(strategy.sensitivity_squared(n, schema))  # checked by brute force above
  assert losses.sensitivity_squared == strategy.sensitivity_squared(n, schema)
  assert losses.max_loss == pytest.approx(max_error * sens, rel=1e-12)
  assert losses.rms_loss == pytest.approx(rms_error * sens, rel=1e-12)


def test_one_band_is_dp_sgd():
  schema = MinSep(3, 4)
  for cls in (BSR, BISR):
    np.testing.assert_array_equal(cls(1).strategy_matrix(10), np.eye(10))
    assert cls(1).sensitivity_squared(10, schema) == 4.0


@pytest.mark.parametrize('cls, name', [(BSR, 'bsr'), (BISR, 'bisr')])
def test_registry_builder_config_and_file_round_trip(cls, name, tmp_path):
  schema = MinSep(5, 3)
  result = registry.optimizer(name)(num_rounds=20, participation=schema)
  assert result.strategy == cls(5)  # default b-hat = min(min_sep, n)
  assert result.losses == cls(5).losses(20, schema)
  assert registry.optimizer(name)(num_rounds=3, participation=schema).strategy == cls(3)
  assert registry.optimizer(name)(num_rounds=20, participation=schema,
                                  num_bands=7).strategy == cls(7)
  strategy = cls(7)
  config = strategy.to_config()
  assert config == {'mechanism': name, 'num_bands': 7}
  assert registry.strategy_from_config(json.loads(json.dumps(config))) == strategy
  path = tmp_path / f'{name}.json'
  files.save_strategy(strategy, str(path), setting=result)
  loaded, setting = files.load_strategy_and_setting(str(path))
  assert loaded == strategy and setting['num_rounds'] == 20
  assert strategy.max_rounds is None and strategy.describe() == {'num_bands': 7}
  assert str(strategy) == f'{cls.__name__}(num_bands=7)'


@pytest.mark.parametrize('cls', [BSR, BISR])
def test_validation_names_the_parameter(cls):
  for bad in (0, -2, 1.5, True, '3', None):
    with pytest.raises(ValueError, match='num_bands'):
      cls(bad)
  with pytest.raises(ValueError, match='Unknown keys'):
    cls.from_config({'mechanism': cls.name, 'num_bands': 2, 'theta': [0.5]})
  with pytest.raises(ValueError, match='num_bands'):
    cls.from_config({'mechanism': cls.name})
  with pytest.raises(ValueError, match='num_rounds'):
    cls(2).strategy_matrix(0)
  with pytest.raises(ValueError, match='num_coefs'):
    square_root.inverse_square_root_coefs(0)
  with pytest.raises(ValueError, match='num_bands'):
    registry.optimizer(cls.name)(num_rounds=5, participation=MinSep(2, 2), num_bands=0)
