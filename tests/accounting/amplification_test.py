"""Tests for `dp_ftrl_tff.accounting.amplification`: epsilons against events built here straight from
dp_accounting (PLD and RDP), b-hat = 1 against TF-Privacy's DP-SGD computation, calibration round
trips, the Table 5 noise multipliers of the BandMF paper, and a strategy's guarantee (largest column
norm, banded check) against dense math."""

import math

import dp_accounting
import numpy as np
import pytest

from dp_ftrl_tff.accounting import amplification, amplified_strategy, zcdp_epsilon
from dp_ftrl_tff.mechanisms import banded, base, blt, gaussian, tree

pytestmark = pytest.mark.unit


def _direct_epsilon(sigma, q, count, delta, accountant, interval=1e-4):
  """epsilon of `count` Poisson-subsampled Gaussians, composed by the accountant one by one."""
  if accountant == 'pld':
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
  else:
    acc = dp_accounting.rdp.RdpAccountant(orders=zcdp_epsilon.TF_PRIVACY_RDP_ORDERS)
  acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), count)
  return acc.get_epsilon(delta)


@pytest.mark.parametrize('accountant', ['pld', 'rdp'])
@pytest.mark.parametrize('sigma, rounds, bands, q, count', [
    (1.2, 50, 7, 0.05, 8),      # ceil(50 / 7) = 8 compositions (the last block is partial)
    (0.9, 64, 1, 0.01, 64),     # b-hat = 1: DP-SGD
    (2.0, 64, 16, 0.3, 4),
])
def test_epsilon_matches_dp_accounting(accountant, sigma, rounds, bands, q, count):
  delta = 1e-6
  ours = amplification.amplified_epsilon(sigma, rounds, bands, q, delta, accountant)
  assert amplification.num_compositions(rounds, bands) == count
  # The same accountant over the same mechanism: equal up to floating-point summation order.
  assert ours == pytest.approx(_direct_epsilon(sigma, q, count, delta, accountant), rel=1e-9)


def test_sampling_prob_one_is_the_unamplified_gaussian():
  # q = 1: k Gaussian rounds with sigma are one Gaussian with sigma / sqrt(k).
  eps = amplification.amplified_epsilon(2.0, 12, 3, 1.0, 1e-6)
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(dp_accounting.GaussianDpEvent(2.0 / math.sqrt(4)))
  assert eps == pytest.approx(acc.get_epsilon(1e-6), rel=1e-3)


def test_bands_one_is_tf_privacy_dp_sgd():
  """b-hat = 1 is DP-SGD: TF-Privacy's example-level computation (Poisson sampling, PLD)."""
  lib = pytest.importorskip('tensorflow_privacy.privacy.analysis.compute_dp_sgd_privacy_lib')
  q, rounds, sigma, delta = 1 / 64, 128, 1.1, 1e-5  # 2 epochs of 64 steps, exact in binary
  # TF-Privacy's statement text wraps this function; microbatching halves sigma, so it is off.
  expected = lib._compute_dp_sgd_example_privacy(  # pylint: disable=protected-access
      num_epochs=rounds * q, noise_multiplier=sigma, example_delta=delta,
      used_microbatching=False, poisson_subsampling_probability=q,
      accountant_type=lib.AccountantType.PLD)
  assert amplification.amplified_epsilon(sigma, rounds, 1, q, delta) == pytest.approx(expected,
                                                                                      rel=1e-9)


@pytest.mark.parametrize('accountant', ['pld', 'rdp'])
@pytest.mark.parametrize('epsilon, rounds, bands, q', [(1.0, 64, 4, 0.1), (4.0, 100, 10, 0.25)])
def test_noise_multiplier_round_trip(accountant, epsilon, rounds, bands, q):
  delta, interval = 1e-6, 1e-3  # a coarser PLD grid keeps the test fast (still an upper bound)
  sigma = amplification.amplified_noise_multiplier(epsilon, rounds, bands, q, delta, accountant,
                                                   value_discretization_interval=interval,
                                                   rtol=1e-6)
  count = amplification.num_compositions(rounds, bands)
  assert _direct_epsilon(sigma, q, count, delta, accountant, interval) <= epsilon
  # Minimal: 1e-4 less noise (100 times the tolerance) misses the target.
  assert _direct_epsilon(sigma * (1 - 1e-4), q, count, delta, accountant, interval) > epsilon


# BandMF paper Table 5 (n = 2052, m = 342477, B = 1000, delta = 1e-6): epsilon -> (b-hat, z). The
# paper's z is for C normalized to sensitivity 1 under k = 6 participations (column norm
# 1 / sqrt(6)), so the accounted noise multiplier is z * sqrt(6).
TABLE5 = [(1.0, 9, 0.79118), (2.0, 18, 0.64708), (4.0, 32, 0.52224), (8.0, 64, 0.43490),
          (1.0, 1, 0.37313),
          # DP-SGD at larger epsilon: 2052 compositions of a wide PLD, about 5 s each.
          pytest.param(2.0, 1, 0.30481, marks=pytest.mark.paper),
          pytest.param(16.0, 1, 0.16876, marks=pytest.mark.paper)]


@pytest.mark.parametrize('epsilon, bands, z', TABLE5)
def test_table5_noise_multipliers(epsilon, bands, z):
  q = amplification.group_sampling_prob(342477, 1000, bands)
  assert q == 1000 / (342477 // bands)
  eps = amplification.amplified_epsilon(z * math.sqrt(6), 2052, bands, q, 1e-6)
  # The table prints 5 significant digits of z; d eps / d z is about -5 eps / z here, so
  # half a unit in the last digit moves epsilon by less than 0.1%. PLD adds its discretization.
  assert eps == pytest.approx(epsilon, rel=2e-3)


def test_group_sampling_prob_refuses_groups_smaller_than_the_batch():
  with pytest.raises(ValueError, match='num_groups'):
    amplification.group_sampling_prob(1000, 100, 11)
  assert amplification.group_sampling_prob(1000, 100, 10) == 1.0


def _random_banded(n, bands, seed):
  rng = np.random.default_rng(seed)
  c = np.tril(rng.uniform(0.1, 1.0, (n, n))) * (np.subtract.outer(np.arange(n), np.arange(n))
                                                 < bands)
  return banded.BandedStrategy(c)


def test_strategy_guarantee_uses_the_largest_column_norm():
  strategy = _random_banded(20, 3, seed=0)
  c = strategy.strategy_matrix(20)
  kappa = max(np.sqrt(np.sum(c[:, j]**2)) for j in range(20))  # column by column
  g = amplified_strategy.amplified_guarantee(strategy, 20, 2.5, 4, 0.2, 1e-6)
  assert g.largest_column_norm == pytest.approx(kappa, rel=1e-12)
  assert g.compositions == 5
  assert g.epsilon == pytest.approx(_direct_epsilon(2.5 / kappa, 0.2, 5, 1e-6, 'pld'), rel=1e-9)


def test_strategy_guarantee_with_restarts_takes_every_segment():
  strategy = _random_banded(12, 2, seed=1)
  g = amplified_strategy.amplified_guarantee(strategy, 20, 1.0, 2, 0.5, 1e-6, restart_rounds=[12])
  kappa = max(np.linalg.norm(strategy.strategy_matrix(length), axis=0).max()
              for length in (12, 8))
  assert g.largest_column_norm == pytest.approx(kappa, rel=1e-12)


def test_dp_sgd_strategy_equals_the_plain_function():
  g = amplified_strategy.amplified_guarantee(gaussian.GaussianStrategy(), 30, 1.3, 1, 0.05, 1e-6)
  assert g.largest_column_norm == 1.0
  assert g.epsilon == amplification.amplified_epsilon(1.3, 30, 1, 0.05, 1e-6)


@pytest.mark.parametrize('strategy, groups, match', [
    (tree.TreeStrategy('vanilla'), 4, 'square banded'),
    (blt.PRODUCTION_STRATEGIES[400], 8, 'at most as many bands as sampling groups'),
    (_random_banded(16, 5, seed=2), 4, '5 bands but `num_groups`=4'),
])
def test_refuses_strategies_the_theorem_does_not_cover(strategy, groups, match):
  with pytest.raises(ValueError, match=match):
    amplified_strategy.amplified_guarantee(strategy, 16, 1.0, groups, 0.1, 1e-6)


@pytest.mark.parametrize('kwargs, name', [
    ({'sampling_prob': 0.0}, 'sampling_prob'), ({'sampling_prob': 1.5}, 'sampling_prob'),
    ({'bands': 0}, 'bands'), ({'rounds': 2.5}, 'rounds'), ({'delta': 1.0}, 'delta'),
    ({'noise_multiplier': -1.0}, 'noise_multiplier'), ({'accountant': 'gdp'}, 'accountant'),
])
def test_bad_inputs_name_the_parameter(kwargs, name):
  args = dict(noise_multiplier=1.0, rounds=10, bands=2, sampling_prob=0.1, delta=1e-6)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    amplification.amplified_epsilon(**args)


@pytest.mark.parametrize('target', [1e6, 1e-5])
def test_amplified_calibration_refuses_a_target_outside_the_range_at_once(target):
  with pytest.raises(ValueError, match=r'`target_epsilon`='):
    amplification.amplified_noise_multiplier(target, 100, 2, 0.1, 1e-10)


def test_amplified_epsilon_refuses_a_noise_multiplier_below_the_accountant_range():
  floor = amplification.min_noise_multiplier(100, 2, 0.1)
  assert math.isclose(floor, 1 / math.sqrt(2 * zcdp_epsilon.MAX_RHO))
  assert amplification.min_noise_multiplier(100, 2, 1.0) == math.sqrt(
      50 / (2 * zcdp_epsilon.MAX_RHO))
  with pytest.raises(ValueError, match=r'`noise_multiplier`=1e-20 is below 0\.07071'):
    amplification.amplified_epsilon(1e-20, 100, 2, 0.1, 1e-10)


def test_rdp_target_below_its_floor_is_refused_not_searched_forever():
  """RDP on TF-Privacy's orders never goes below about log(1/delta) / 62 (0.37 at 1e-10)."""
  with pytest.raises(ValueError, match=r'`target_epsilon`=0\.01 .* not reachable with the rdp'):
    amplification.amplified_noise_multiplier(0.01, 10, 1, 1.0, 1e-10, 'rdp')


def test_the_smallest_sampling_probability_is_float64_machine_epsilon():
  # 2^-52 is accounted (epsilon 0 here); below it 1 - q is 1 in float64 and dp_accounting failed.
  assert amplification.amplified_epsilon(1.0, 100, 1, 2.0**-52, 1e-6) == 0.0
  for q in (2.0**-53, 1e-20, 1e-320):
    with pytest.raises(ValueError, match=r'`sampling_prob`=.* is below 2.22e-16 \(2\^-52'):
      amplification.amplified_epsilon(1.0, 100, 1, q, 1e-6)
  with pytest.raises(ValueError, match=r'`dataset_size`=9223372036854775808 with `batch_size`=10 '
                     r'and `num_groups`=2 gives the sampling probability 2.17e-18'):
    amplification.group_sampling_prob(2**63, 10, 2)


def test_rdp_rounding_below_zero_names_the_sampling_probability():
  # dp_accounting's RDP of a subsampled Gaussian rounds below zero here (its own words: "Renyi
  # divergence cannot be negative").
  with pytest.raises(ValueError, match=r'`sampling_prob`=1e-06 is too small for the rdp '
                     'accountant: .* use the pld accountant'):
    amplification.amplified_epsilon(100.0, 100, 1, 1e-6, 1e-6, 'rdp')


def test_noise_and_compositions_beyond_the_accountant_are_refused():
  with pytest.raises(ValueError, match=r'`noise_multiplier`=1e\+300 is outside'):
    amplification.amplified_epsilon(1e300, 100, 2, 0.1, 1e-6)
  # ceil(n / b-hat) = 2^63 - 1 compositions: dp_accounting overflowed ("Python int too large to
  # convert to C ssize_t") or ran out of memory; its own truncation bound says how long it gets.
  assert amplification.composed_pld_points(1.0, 10**9, 0.01) > 5e8
  with pytest.raises(ValueError, match=r'`num_rounds`: ceil\(num_rounds / num_groups\) = '
                     r'9223372036854775807 compositions .* points long, about .* EB'):
    amplification.amplified_epsilon(1.0, 2**63 - 1, 1, 0.1, 1e-6)


@pytest.mark.parametrize('make', [
    lambda: gaussian.GaussianStrategy(),
    lambda: blt.BLTStrategy((0.9, 0.5), (0.3, 0.2)),
    lambda: banded.BandedStrategy(np.tril(np.ones((30, 30))) - np.tril(np.ones((30, 30)), -4)),
])
def test_bands_and_column_norms_without_the_dense_matrix_equal_the_dense_ones(make):
  strategy = make()
  for restarts in (None, [10, 25]):
    lengths = base.segment_lengths(30, restarts)
    dense = [strategy.strategy_matrix(m) for m in lengths]
    bands = max(int(np.max(np.subtract(*np.nonzero(c)))) + 1 for c in dense)
    norm = max(float(np.max(np.linalg.norm(c, axis=0))) for c in dense)
    assert amplified_strategy.num_bands(strategy, 30, restarts) == bands
    assert amplified_strategy.largest_column_norm(strategy, 30, restarts) == pytest.approx(norm,
                                                                                      rel=1e-14)
  if strategy.max_rounds is None:  # 10^6 rounds: the dense C would take 8 TB
    assert amplified_strategy.largest_column_norm(strategy, 10**6) >= 1.0
