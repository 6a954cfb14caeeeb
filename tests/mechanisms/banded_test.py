"""Tests for dp_ftrl_tff.mechanisms.banded against dense matrix math, brute force and published tables."""

import itertools

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

from dp_ftrl_tff.mechanisms import banded, banded_optimizer, base, sensitivity
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit


def _random_banded(n, bands, seed=0, normalize=False):
  rng = np.random.default_rng(seed)
  # Off-diagonal entries small enough (row sums of |C| below the diagonal) to keep C well conditioned.
  c = np.tril(rng.uniform(-1, 1, size=(n, n)), -1) / bands
  c *= np.subtract.outer(np.arange(n), np.arange(n)) < bands
  c[np.diag_indices(n)] = 1.0 + rng.uniform(size=n)
  if normalize:
    c /= np.linalg.norm(c, axis=0)
  return c


def _dense_errors(c):
  rows = np.sum((base.prefix_sum_workload(c.shape[0]) @ np.linalg.inv(c))**2, axis=1)
  return np.sqrt(np.max(rows)), np.sqrt(np.mean(rows))


def _eq5_brute_force(c, participation: participation_lib.ParticipationSchema):
  """max over admissible patterns of sum_{i,j in pi} |X_ij| (BandMF Eq. 5), by enumeration."""
  x = np.abs(c.T @ c)
  return max(np.sum(x[np.ix_(p, p)]) for p in patterns_lib.patterns(participation, c.shape[0]))


# --------------------------------------------------------------------------------------------------
# Construction and validation.


def test_band_rows_round_trip_and_bands():
  c = _random_banded(12, 4)
  strategy = banded.BandedStrategy(c)
  assert strategy.num_bands == 4 and strategy.max_rounds == 12
  np.testing.assert_array_equal(strategy.strategy_matrix(12), c)
  for t, j in itertools.product(range(12), range(4)):
    assert strategy.band_rows[t, j] == (c[t, t - j] if t >= j else 0.0)
  np.testing.assert_array_equal(banded.matrix_from_band_rows(strategy.band_rows), c)
  np.testing.assert_array_equal(strategy.strategy_matrix(5), c[:5, :5])


@pytest.mark.parametrize('bad, message', [
    (np.triu(np.ones((3, 3))), 'lower triangular'),
    (np.diag([1.0, 0.0, 1.0]), 'positive diagonal'),
    (np.diag([1.0, np.nan, 1.0]), 'finite'),
    (np.ones((2, 3)), 'square'),
])
def test_rejects_bad_matrices(bad, message):
  with pytest.raises(ValueError, match=message):
    banded.BandedStrategy(bad)


def test_rejects_bad_arguments():
  strategy = banded.BandedStrategy(np.eye(4))
  with pytest.raises(ValueError, match='num_rounds'):
    strategy.strategy_matrix(5)
  with pytest.raises(ValueError, match='participation'):
    strategy.sensitivity_squared(4, 3)
  with pytest.raises(ValueError, match='coefs'):
    banded.BandedStrategy.from_toeplitz(np.ones(5), 4)
  with pytest.raises(ValueError, match='band_rows'):
    banded.BandedStrategy.from_band_rows(np.ones((3, 2)))  # R[0, 1] would lie above the diagonal
  with pytest.raises(ValueError, match='num_bands'):
    banded_optimizer.optimize_banded(4, 5, ParticipationSchema.single())
  with pytest.raises(ValueError, match='error'):
    banded_optimizer.optimize_banded(4, 2, ParticipationSchema.single(), error='mean')
  with pytest.raises(ValueError, match='workload'):
    banded_optimizer.optimize_banded(4, 2, ParticipationSchema.single(), workload=np.ones((4, 4)))
  with pytest.raises(ValueError, match='Toeplitz'):
    banded_optimizer.optimize_banded(4, 2, ParticipationSchema.single(), toeplitz=True,
                           workload=np.diag([1.0, 2.0, 3.0, 4.0]))
  with pytest.raises(ValueError, match='initial'):
    banded_optimizer.optimize_banded(4, 2, ParticipationSchema.single(), initial=strategy)
  two_bands = banded.BandedStrategy(_random_banded(4, 2))
  with pytest.raises(ValueError, match='initial'):
    banded_optimizer.optimize_banded(4, 2, ParticipationSchema.single(), toeplitz=True, initial=two_bands)


def test_from_toeplitz_matches_scipy_toeplitz():
  coefs = np.array([2.0, -0.5, 0.25])
  dense = scipy.linalg.toeplitz(np.r_[coefs, np.zeros(5)], np.zeros(8))
  strategy = banded.BandedStrategy.from_toeplitz(coefs, 8)
  np.testing.assert_array_equal(strategy.strategy_matrix(8), dense)
  assert strategy.num_bands == 3


def test_fhu_coefficients_square_to_prefix_sums():
  n = 9
  root = scipy.linalg.toeplitz(banded.fhu_coefficients(n), np.zeros(n))
  np.testing.assert_allclose(root @ root, base.prefix_sum_workload(n), atol=1e-14)
  np.testing.assert_allclose(banded.fhu_coefficients(4), [1.0, 0.5, 0.375, 0.3125])


def test_config_round_trip():
  strategy = banded.BandedStrategy(_random_banded(9, 3))
  config = strategy.to_config()
  assert config['mechanism'] == 'banded' and config['band_rows'].shape == (9, 3)
  restored = banded.BandedStrategy.from_config(config)
  np.testing.assert_array_equal(restored.strategy_matrix(9), strategy.strategy_matrix(9))
  with pytest.raises(ValueError, match='Unknown keys'):
    banded.BandedStrategy.from_config(dict(config, extra=1))
  with pytest.raises(ValueError, match='mechanism'):
    banded.BandedStrategy.from_config(dict(config, mechanism='blt'))


# --------------------------------------------------------------------------------------------------
# Dense checks.


@pytest.mark.parametrize('n, bands', [(1, 1), (7, 1), (40, 7), (300, 150), (301, 301)])
def test_noise_matrix_is_inverse(n, bands):
  c = _random_banded(n, bands, seed=n)
  strategy = banded.BandedStrategy(c)
  np.testing.assert_allclose(strategy.noise_matrix(n), np.linalg.inv(c), rtol=0, atol=1e-10)
  m = max(1, n // 2)
  np.testing.assert_allclose(strategy.noise_matrix(m), np.linalg.inv(c[:m, :m]), rtol=0, atol=1e-10)


@pytest.mark.parametrize('bands', [1, 2, 5])
def test_stream_inverse_matches_solve_triangular(bands):
  c = _random_banded(23, bands, seed=bands)
  z = np.random.default_rng(1).normal(size=(23, 3, 2))
  expected = scipy.linalg.solve_triangular(c, z.reshape(23, -1), lower=True).reshape(z.shape)
  got = banded.stream_inverse(banded.band_rows_from_matrix(c), z)
  np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_errors_match_materialized_decoder():
  c = _random_banded(30, 6, seed=3)
  strategy = banded.BandedStrategy(c)
  np.testing.assert_allclose(strategy.errors(30), _dense_errors(c), rtol=1e-10)
  np.testing.assert_allclose(strategy.errors(17), _dense_errors(c[:17, :17]), rtol=1e-10)


@pytest.mark.parametrize('n, bands, prefix', [(300, 70, 300), (257, 64, 257), (200, 7, 130),
                                              (130, 130, 65), (150, 1, 150)])
def test_block_recursion_errors_match_dense_inverse(n, bands, prefix):
  # Several row blocks (64 rows each), windows spanning one or more blocks, fewer rows than bands.
  # The recursion and the dense inverse round differently; 1e-10 allows cond(C) ~ 1e5 times eps.
  c = _random_banded(n, bands, seed=11)
  np.testing.assert_allclose(banded.BandedStrategy(c).errors(prefix),
                             _dense_errors(c[:prefix, :prefix]), rtol=1e-10)


# --------------------------------------------------------------------------------------------------
# Sensitivity.


@pytest.mark.parametrize('min_sep, k, bands', [(4, 2, 4), (4, None, 3), (3, 3, 1), (5, 2, 2)])
def test_unit_columns_with_bands_within_min_sep_have_sensitivity_k(min_sep, k, bands):
  n = 14
  participation = ParticipationSchema.b_min_sep(min_sep, k)
  strategy = banded.BandedStrategy(_random_banded(n, bands, seed=bands, normalize=True))
  k_eff = participation.effective_max_participations(n)
  assert strategy.sensitivity_squared(n, participation) == pytest.approx(k_eff, rel=1e-12)
  # Eq. 5 by enumeration: exact here (columns b apart are orthogonal).
  assert _eq5_brute_force(strategy.strategy_matrix(n), participation) == pytest.approx(k_eff)
  fixed = ParticipationSchema.fixed_epoch_order(2, min_sep)
  assert strategy.sensitivity_squared(2 * min_sep, fixed) == pytest.approx(2.0, rel=1e-12)


def test_more_bands_than_min_sep_gives_upper_bound():
  n = 12
  participation = ParticipationSchema.b_min_sep(3, 3)
  c = _random_banded(n, 5, seed=7, normalize=True)
  bound = banded.BandedStrategy(c).sensitivity_squared(n, participation)
  assert bound >= _eq5_brute_force(c, participation) - 1e-12
  assert bound > 3.0  # columns 3 apart overlap, so the bound exceeds k


def test_single_participation_is_max_column_norm():
  c = _random_banded(10, 4, seed=2)
  got = banded.BandedStrategy(c).sensitivity_squared(10, ParticipationSchema.single())
  assert got == pytest.approx(np.max(np.sum(c**2, axis=0)), rel=1e-12)


def test_dp_sgd_prefix_sum_rmse_table2():
  # BandMF paper Table 2 (docs/papers.md#bandmf): C = I normalized to sens 1 under (k=6, b=342) has
  # prefix-sum RMSE sqrt(k (n + 1) / 2) = 78.48 at n = 2052; the RmsLoss (sens * RmsError) is that
  # number.
  n = 2052
  losses = banded.BandedStrategy(np.eye(n)).losses(n, ParticipationSchema.b_min_sep(342, 6))
  assert losses.sensitivity_squared == pytest.approx(6.0)
  assert losses.rms_loss == pytest.approx(np.sqrt(6 * (n + 1) / 2), rel=1e-10)
  assert round(losses.rms_loss, 2) == 78.48


# --------------------------------------------------------------------------------------------------
# Optimizer against independent brute-force optimization.


def _brute_force_x_optimum(n, bands, workload):
  """min tr(A^T A X^-1) / n over symmetric X with unit diagonal, zero beyond the band (Problem 2).

  Parameterized by the free off-diagonal entries of X (not by C); BFGS with finite differences.
  """
  s = workload.T @ workload
  i, j = np.tril_indices(n, -1)
  free = (i - j) < bands
  i, j = i[free], j[free]

  def objective(v):
    x = np.eye(n)
    x[i, j] = v
    x[j, i] = v
    try:
      chol = scipy.linalg.cho_factor(x)
    except np.linalg.LinAlgError:
      return 1e6
    return np.trace(scipy.linalg.cho_solve(chol, s)) / n

  if i.size == 0:
    return objective(np.zeros(0))
  best = scipy.optimize.minimize(objective, np.zeros(i.size), method='BFGS',
                                 options={'gtol': 1e-9, 'maxiter': 5000})
  return best.fun


@pytest.mark.parametrize('n, bands', [(8, 3), (9, 1), (7, 7)])
def test_general_optimizer_matches_brute_force(n, bands):
  participation = ParticipationSchema.b_min_sep(max(bands, 2), 2)
  result = banded_optimizer.optimize_banded(n, bands, participation, max_iterations=500, tolerance=1e-14)
  c = result.strategy.strategy_matrix(n)
  np.testing.assert_allclose(np.linalg.norm(c, axis=0), 1.0, rtol=1e-12)
  _, rms = _dense_errors(c)
  assert rms**2 == pytest.approx(_brute_force_x_optimum(n, bands, base.prefix_sum_workload(n)), rel=1e-6)
  if bands == 1:
    np.testing.assert_allclose(c, np.eye(n), atol=1e-12)  # one band is DP-SGD


def test_general_optimizer_with_momentum_workload_matches_brute_force():
  n, bands = 8, 3
  a = base.momentum_workload(n, 0.9, np.linspace(1.0, 0.25, n))
  result = banded_optimizer.optimize_banded(n, bands, ParticipationSchema.b_min_sep(3, 2), workload=a,
                                  max_iterations=500, tolerance=1e-14)
  got = np.mean(np.sum((a @ result.strategy.noise_matrix(n))**2, axis=1))
  assert result.details['workload_error']**2 == pytest.approx(got, rel=1e-10)
  assert got == pytest.approx(_brute_force_x_optimum(n, bands, a), rel=1e-6)


@pytest.mark.parametrize('error, momentum', [('rms', None), ('max', None), ('rms', 0.8)])
def test_toeplitz_optimizer_matches_brute_force(error, momentum):
  n, bands = 10, 3
  participation = ParticipationSchema.b_min_sep(3, 2)
  workload = base.prefix_sum_workload(n) if momentum is None else base.momentum_workload(n, momentum)
  result = banded_optimizer.optimize_banded(n, bands, participation, toeplitz=True, error=error,
                                  workload=None if momentum is None else workload,
                                  max_iterations=500, tolerance=1e-14)
  c = result.strategy.strategy_matrix(n)
  np.testing.assert_allclose(c, scipy.linalg.toeplitz(c[:, 0], np.zeros(n)), atol=1e-15)

  def loss(coefs):
    dense = scipy.linalg.toeplitz(np.r_[coefs, np.zeros(n - bands)], np.zeros(n))
    rows = np.sum((workload @ np.linalg.inv(dense))**2, axis=1)
    sens_sq = _eq5_brute_force(dense, participation)  # exact: columns 3 apart are orthogonal
    return sens_sq * (np.mean(rows) if error == 'rms' else np.max(rows))

  brute = min((scipy.optimize.minimize(loss, x0, method='Nelder-Mead',
                                       options={'xatol': 1e-10, 'fatol': 1e-12, 'maxiter': 20000})
               for x0 in ([1.0, 0.5, 0.375], [1.0, 0.0, 0.0])), key=lambda r: r.fun)
  got = result.losses.sensitivity_squared * result.details['workload_error']**2
  assert got == pytest.approx(brute.fun, rel=1e-6)


def test_warm_start_from_initial_does_not_increase_loss():
  n, bands = 20, 4
  participation = ParticipationSchema.b_min_sep(4, 5)
  start = banded.BandedStrategy(_random_banded(n, bands, seed=9, normalize=True))
  result = banded_optimizer.optimize_banded(n, bands, participation, initial=start, max_iterations=5)
  assert 'toeplitz_stage' not in result.details
  assert result.losses.rms_loss < start.losses(n, participation).rms_loss


def test_max_error_objective_lowers_max_error():
  n, bands = 24, 4
  participation = ParticipationSchema.b_min_sep(4, 3)
  rms = banded_optimizer.optimize_banded(n, bands, participation, error='rms', max_iterations=300)
  mx = banded_optimizer.optimize_banded(n, bands, participation, error='max', max_iterations=300)
  assert mx.losses.max_loss < rms.losses.max_loss * (1 - 1e-3)
  assert mx.losses.rms_loss > rms.losses.rms_loss
  assert mx.losses.sensitivity_squared == pytest.approx(3.0)


def test_gradient_of_banded_objective_matches_finite_differences():
  # The optimizer's analytic gradient (private) against central differences of its value.
  n, bands = 11, 4
  for error, workload in [('rms', None), ('max', base.momentum_workload(n, 0.5))]:
    objective = banded_optimizer._BandedObjective(n, bands, banded_optimizer._Workload(n, workload), error)
    params = objective.params_from_matrix(_random_banded(n, bands, seed=5))
    _, grad = objective.value_and_grad(params)
    step = 1e-6
    numeric = np.array([
        (objective.value_and_grad(params + step * e)[0]
         - objective.value_and_grad(params - step * e)[0]) / (2 * step)
        for e in np.eye(params.size)])
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('n, bands, error, momentum', [(150, 70, 'rms', None), (200, 7, 'max', None),
                                                       (140, 5, 'rms', 0.9), (130, 100, 'max', None)])
def test_multi_block_gradient_matches_directional_differences(n, bands, error, momentum):
  # Beyond one 64-row block: the window carried between blocks and its adjoint. Central differences
  # along random directions with h = 1e-6: truncation O(h^2) and rounding O(eps |f| / h) both stay
  # near 1e-8 of the derivative here (|f| <= 1e4), well below the 1e-5 asked.
  workload = None if momentum is None else base.momentum_workload(n, momentum)
  objective = banded_optimizer._BandedObjective(n, bands, banded_optimizer._Workload(n, workload), error)
  params = objective.params_from_matrix(_random_banded(n, bands, seed=3))
  value, grad = objective.value_and_grad(params)
  a = base.prefix_sum_workload(n) if workload is None else workload
  rows = np.sum((a @ np.linalg.inv(objective.matrix(params)))**2, axis=1)
  if error == 'rms':
    assert value == pytest.approx(np.mean(rows), rel=1e-10)
  rng = np.random.default_rng(0)
  step = 1e-6
  for _ in range(3):
    direction = rng.normal(size=params.size)
    numeric = (objective.value_and_grad(params + step * direction)[0]
               - objective.value_and_grad(params - step * direction)[0]) / (2 * step)
    assert grad @ direction == pytest.approx(numeric, rel=1e-5)


def test_objective_with_a_workload_whose_inverse_is_dense():
  # A^-1 has no band structure here, so D = C A^-1 is dense lower triangular (one window of n - 1).
  n, bands = 12, 3
  rng = np.random.default_rng(2)
  workload = np.tril(rng.uniform(0.5, 1.0, size=(n, n)))
  objective = banded_optimizer._BandedObjective(n, bands, banded_optimizer._Workload(n, workload), 'rms')
  params = objective.params_from_matrix(_random_banded(n, bands, seed=4))
  rows = np.sum((workload @ np.linalg.inv(objective.matrix(params)))**2, axis=1)
  assert objective.value_and_grad(params)[0] == pytest.approx(np.mean(rows), rel=1e-10)
  with pytest.raises(ValueError, match='workload'):
    banded_optimizer.optimize_banded(n, bands, ParticipationSchema.b_min_sep(3, 2),
                           workload=np.tril(np.ones((n, n)), -1))


@pytest.mark.slow
def test_stackoverflow_bandmf_table2_and_blt_table3():
  # n = 2052, k = 6, b = 342, 342 bands, equal column norms, optimized for RMS (BandMF Table 2 row
  # "MF (342) T"; BLT paper Table 3 row "BandMF (band=342)", whose first loss column is MaxLoss).
  n, k, b = 2052, 6, 342
  participation = ParticipationSchema.b_min_sep(b, k)
  result = banded_optimizer.optimize_banded(n, b, participation)
  losses = result.losses
  assert losses.sensitivity_squared == pytest.approx(k, rel=1e-12)
  assert losses.max_loss <= 10.21 * 1.005
  # Table 2 RMSE columns are relative to Multi-epoch MF; the ratio BandMF / DP-SGD is 1.05 / 9.63,
  # with DP-SGD's absolute RMSE sqrt(k (n + 1) / 2).
  ratio = losses.rms_loss / np.sqrt(k * (n + 1) / 2)
  assert ratio == pytest.approx(1.05 / 9.63, rel=0.01)
  assert losses.rms_loss == pytest.approx(8.60, abs=0.01)  # BLT Table 3 (second loss column)


# --------------------------------------------------------------------------------------------------
# Strided block storage, dense closed-form gradient, coarse-to-fine optimization.


@pytest.mark.parametrize('n, bands, block', [(10, 4, 3), (10, 10, 4), (9, 2, 16), (20, 7, 7),
                                             (30, 5, 4)])
def test_block_views_are_the_dense_blocks_and_gradients_land_on_the_band(n, bands, block):
  d = _random_banded(n, bands, seed=n + bands)
  d_rows = banded.band_rows_from_matrix(d)
  layout = banded.BlockLayout(n, bands, block)
  padded = layout.pack(d_rows)
  covered = 0
  for start, end, left, coupling, diagonal in layout.split(padded):
    np.testing.assert_array_equal(coupling, d[start:end, start - left:start])
    np.testing.assert_array_equal(diagonal, d[start:end, start:end])
    covered += end - start
  assert covered == n
  np.testing.assert_array_equal(layout.unpack(padded), d_rows)
  # Writing through every view of a zero array, structural zeros included, must reach exactly the
  # band entries t - l >= 0, each once (the rest lands in the padding that `unpack` drops).
  grad = np.zeros_like(padded)
  for _, _, _, coupling, diagonal in layout.split(grad):
    coupling += 1.0
    diagonal += 1.0
  rows, lags = np.indices(d_rows.shape)
  np.testing.assert_array_equal(layout.unpack(grad), (rows >= lags).astype(float))


def _dense_objective(objective, params, workload):
  """(value, gradient) of `_BandedObjective` from the materialized C, B = A C^-1 (closed form).

  f = mean_i r_i ('rms') or the p-mean (mean_i r_i^p)^(1/p) ('max'), r_i = ||B_i||^2, with
  df/dr_i = 1/n resp. (r_i / f)^(p - 1) / n. With dB = -B dC C^-1: grad_C = -2 B^T diag(w) B C^-T.
  C = P diag(1 / ||P_j||) gives grad_P[:, j] = (g_j - u_j <u_j, g_j>) / ||P_j|| with g = grad_C
  restricted to the band and u_j = C[:, j].
  """
  n = workload.shape[0]
  p = np.zeros((n, n))
  p[objective.rows, objective.cols] = params
  norms = np.linalg.norm(p, axis=0)
  c = p / norms
  c_inv = np.linalg.inv(c)
  b = workload @ c_inv
  r = np.sum(b**2, axis=1)
  if objective.error == 'rms':
    value, w = np.mean(r), np.full(n, 1.0 / n)
  else:
    power = banded_optimizer._MAX_ERROR_POWER
    peak = np.max(r)
    value = peak * np.mean((r / peak)**power)**(1.0 / power)
    w = (r / value)**(power - 1) / n
  grad_c = -2.0 * b.T @ (w[:, None] * b) @ c_inv.T
  g = np.where(p != 0, grad_c, 0.0)
  grad_p = (g - c * np.sum(c * g, axis=0)) / norms
  return value, grad_p[objective.rows, objective.cols]


@pytest.mark.parametrize('n, bands, error, momentum, block', [
    (40, 7, 'rms', None, 8), (40, 7, 'max', None, 8), (33, 33, 'rms', None, 8),
    (50, 12, 'rms', 0.9, 8), (70, 20, 'max', None, 64), (90, 30, 'max', 0.5, 16)])
def test_objective_and_gradient_match_dense_closed_form(monkeypatch, n, bands, error, momentum,
                                                        block):
  # The block recursion and its hand-written reverse mode against dense linear algebra on the
  # materialized C. Both are exact up to rounding; with these C (diagonal in [1, 2], off-diagonal
  # row sums below 1) cond(C) <~ 10, and cond(A) <~ n / (1 - momentum) (n for prefix sums), so either
  # side's relative error is at most about n cond(A) cond(C) eps: <= 2e-11 for prefix sums and
  # <= 6e-11 with momentum here (n <= 90). 1e-8 leaves a margin of more than 100.
  monkeypatch.setattr(banded, 'ROW_BLOCK', block)
  workload = None if momentum is None else base.momentum_workload(n, momentum)
  a = base.prefix_sum_workload(n) if workload is None else workload
  objective = banded_optimizer._BandedObjective(n, bands, banded_optimizer._Workload(n, workload), error)
  params = objective.params_from_matrix(_random_banded(n, bands, seed=n))
  params *= np.random.default_rng(n).uniform(0.5, 2.0, size=params.size)  # columns of any norm
  value, grad = objective.value_and_grad(params)
  dense_value, dense_grad = _dense_objective(objective, params, a)
  assert value == pytest.approx(dense_value, rel=1e-8)
  np.testing.assert_allclose(grad, dense_grad, rtol=0, atol=1e-8 * np.max(np.abs(dense_grad)))


def test_level_sizes_keep_the_shape():
  assert banded_optimizer._level_sizes(2052, 342) == [(129, 22), (257, 43), (513, 86), (1026, 171),
                                            (2052, 342)]
  assert banded_optimizer._level_sizes(512, 342)[0] == (32, 22)
  assert banded_optimizer._level_sizes(100, 39) == [(100, 39)]


def test_interpolation_reproduces_bilinear_ratios_to_the_square_root():
  # C[j + l, j] = s_l g(j, l) with s the sqrt(A) coefficients and g bilinear in the scaled
  # coordinates: bilinear interpolation is exact for it (up to rounding), then columns are unit.
  nc, qc, n, q = 40, 9, 79, 17

  def columns_of(rounds, bands, ratio):
    t, lag = np.indices((rounds, bands))
    rows = np.zeros((rounds, bands))
    inside = t >= lag  # band rows: R[t, lag] = C[t, t - lag]
    rows[inside] = (banded.fhu_coefficients(bands)[None, :] * ratio(t - lag, lag))[inside]
    return rows

  def ratio_coarse(j, lag):
    return 1.0 + 0.3 * (j / (nc - 1)) * (lag / (qc - 1)) + 0.2 * j / (nc - 1)

  def ratio_fine(j, lag):
    return 1.0 + 0.3 * (j / (n - 1)) * (lag / (q - 1)) + 0.2 * j / (n - 1)

  got = banded_optimizer._interpolate_band_rows(columns_of(nc, qc, ratio_coarse), n, q)
  expected = columns_of(n, q, ratio_fine)
  c_got, c_expected = banded.matrix_from_band_rows(got), banded.matrix_from_band_rows(expected)
  np.testing.assert_allclose(np.linalg.norm(c_got, axis=0), 1.0, rtol=1e-14)
  c_expected /= np.linalg.norm(c_expected, axis=0)
  # Columns whose coarse samples all lie inside the coarse band (no end-of-matrix extension).
  full = n - q - 2 * (n // nc + 1)
  np.testing.assert_allclose(c_got[:, :full], c_expected[:, :full], rtol=1e-13, atol=1e-15)
  # Constant ratio (the banded square root itself) is reproduced in every column.
  def ones(j, lag):
    return np.ones(np.broadcast(j, lag).shape)

  bsr = banded_optimizer._interpolate_band_rows(columns_of(nc, qc, ones), n, q)
  c_bsr = banded.matrix_from_band_rows(columns_of(n, q, ones))
  np.testing.assert_allclose(banded.matrix_from_band_rows(bsr),
                             c_bsr / np.linalg.norm(c_bsr, axis=0), rtol=1e-13, atol=1e-15)


def test_coarse_to_fine_optimizer_matches_single_level_optimum():
  # n = 120, 40 bands: two stages (60 / 20, 120 / 40). The problem is convex in X = C^T C (BandMF
  # Problem 2), so both routes must reach the same RmsLoss; L-BFGS to ftol 1e-12 resolves it to
  # about 1e-9 relative, so 1e-6 is safe.
  n, bands = 120, 40
  participation = ParticipationSchema.b_min_sep(bands, 3)
  multi = banded_optimizer.optimize_banded(n, bands, participation, tolerance=1e-12, max_iterations=3000)
  assert [level['num_rounds'] for level in multi.details['levels']] == [60, 120]
  start = banded.BandedStrategy.from_toeplitz(banded.fhu_coefficients(bands), n)
  single = banded_optimizer.optimize_banded(n, bands, participation, initial=start, tolerance=1e-12,
                                  max_iterations=3000)
  assert len(single.details['levels']) == 1
  assert multi.losses.rms_loss == pytest.approx(single.losses.rms_loss, rel=1e-6)
  c = multi.strategy.strategy_matrix(n)
  assert multi.strategy.num_bands == bands and multi.strategy.max_rounds == n
  np.testing.assert_allclose(np.linalg.norm(c, axis=0), 1.0, rtol=1e-12)
  np.testing.assert_array_equal(banded.band_rows_from_matrix(c), multi.strategy.band_rows)
  _, rms = _dense_errors(c)
  assert multi.details['workload_error'] == pytest.approx(rms, rel=1e-10)
  assert multi.losses.sensitivity_squared == pytest.approx(3.0, rel=1e-12)


def test_time_limit_in_a_coarse_stage_still_returns_the_full_size():
  n, bands = 120, 40
  result = banded_optimizer.optimize_banded(n, bands, ParticipationSchema.b_min_sep(bands, 3),
                                  max_seconds=1e-9)
  assert result.details['banded_stage']['message'] == 'time limit reached'
  assert result.strategy.max_rounds == n and result.strategy.num_bands == bands
  np.testing.assert_allclose(np.linalg.norm(result.strategy.strategy_matrix(n), axis=0), 1.0,
                             rtol=1e-12)


@pytest.mark.parametrize('min_sep, k, bands', [(4, 2, 4), (4, None, 3), (5, 3, 1), (6, 1, 9),
                                               (3, None, 5), (30, 3, 9)])
def test_band_sensitivity_matches_dense(min_sep, k, bands):
  # The optimizer's band route (bands <= min_sep, or single participation) and the strategy's dense
  # route sum the same squared entries in another order: equal to a few ulps. Else it declines.
  n = 23
  participation = ParticipationSchema.b_min_sep(min_sep, k)
  c = _random_banded(n, bands, seed=bands + min_sep)
  for rounds in (n, 11):
    expected = sensitivity.dense_squared(c[:rounds, :rounds], participation)
    got = banded.band_sensitivity_squared(banded.band_rows_from_matrix(c[:rounds, :rounds]),
                                           participation)
    if bands <= min_sep or participation.is_single_participation(rounds):
      assert got == pytest.approx(expected, rel=1e-13)
    else:
      assert got is None
  assert banded.band_sensitivity_squared(banded.band_rows_from_matrix(c),
                                          ParticipationSchema.fixed_epoch_order(2, 11)) is None


def test_minimize_window_rule_stops_on_average_progress():
  # f(x) = sum(d (x - 1)^2): converges; the window rule (average relative decrease over 5
  # iterations) ends it, not the iteration cap, and the point is the minimizer to that tolerance.
  d = np.linspace(1.0, 50.0, 40)

  def fun(x):
    return float(np.sum(d * (x - 1.0)**2)) + 1.0, 2.0 * d * (x - 1.0)

  x, info = banded_optimizer._minimize(fun, np.zeros(40), 500, None, 1e-10, memory=5, window=5)
  assert 'OVER 5 ITERATIONS' in info['message'] and 5 < info['iterations'] < 500
  assert info['objective'] == pytest.approx(1.0, abs=1e-6)


# Every b-hat at n = 1024 (single participation) with every RuntimeWarning an error, including ones
# numpy attributes to its own modules. A trial step of L-BFGS can reach an unstable banded Toeplitz C
# (inverse coefficients growing geometrically) or a numerically singular general C; the objective
# must call such points +inf without overflowing (it once warned at b-hat = 2, 3 and 53).
@pytest.mark.slow
@pytest.mark.filterwarnings('error::RuntimeWarning')
@pytest.mark.parametrize('error', ['rms', 'max'])
def test_toeplitz_objective_never_overflows_for_any_bands(error):
  n = 1024
  work = banded_optimizer._Workload(n, None)
  starts = {banded_optimizer._level_sizes(n, bands)[0] for bands in range(1, n + 1)}
  for toeplitz in (True, False):
    sizes = [(n, bands) for bands in range(1, n + 1)] if toeplitz else sorted(starts)
    for size in sizes:
      band_rows, details = banded_optimizer._toeplitz_stage(size, work, error, toeplitz, 100, 1e-7)
      assert np.all(np.isfinite(band_rows)), (size, details)
      assert np.isfinite(details['objective']), (size, details)


@pytest.mark.slow
@pytest.mark.filterwarnings('error::RuntimeWarning')
@pytest.mark.parametrize('error', ['rms', 'max'])
def test_optimizer_never_overflows_for_any_bands(error):
  n = 1024
  single = ParticipationSchema.single()
  previous = np.inf
  # b-hat = 2, 3 (unstable Toeplitz trial steps) and 53 ('max': a numerically singular general C)
  # once overflowed; 17 and 341 add a short and a coarse-to-fine case (the Toeplitz start of every
  # b-hat is swept above; every 11th b-hat from 40 to 975 was swept by hand, without a warning).
  for bands in [2, 3, 17, 53, 341]:
    result = banded_optimizer.optimize_banded(n, bands, single, error=error)
    loss = result.losses.rms_loss if error == 'rms' else result.losses.max_loss
    assert np.isfinite(loss) and np.all(np.isfinite(result.strategy.band_rows)), bands
    if error == 'rms':
      # More bands never raise the optimum (the fewer-band optimum is feasible); 1% allows for
      # the optimizer's stopping rule. ('max' optimizes a smooth surrogate of the maximum.)
      assert loss <= previous * 1.01, (bands, loss, previous)
      previous = min(previous, loss)


def test_optimizer_refuses_a_size_it_cannot_finish_within_the_limit():
  # Lower bounds of what was measured: 39 s (general) and 10.3 s (Toeplitz) at n = b-hat = 3000.
  assert banded_optimizer.optimization_seconds(3000, 3000) == pytest.approx(36.0)
  assert banded_optimizer.optimization_seconds(3000, 3000, toeplitz=True) == pytest.approx(8.1)
  with pytest.raises(ValueError, match=r'`num_bands`=20000 \(the default, min\(`min_sep`, '
                     r'`num_rounds`\)\) at `num_rounds`=20000: .* about 2.22 hours .* use at most '
                     r'13416 bands'):
    banded_optimizer.optimize_banded(20000, None, ParticipationSchema(20000))
