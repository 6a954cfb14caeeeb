"""Tests for `dp_ftrl_tff.accounting.band_selection`: the branch-and-bound search against an exhaustive
search over every b-hat, each candidate's figures against dense math and dp_accounting, and input
validation."""

import math

import dp_accounting
import numpy as np
import pytest

from dp_ftrl_tff.accounting import amplification, band_selection

pytestmark = pytest.mark.unit

# Small settings, a coarse PLD grid (an upper bound all the same) to keep calibrations fast.
FAST = dict(value_discretization_interval=1e-2)


@pytest.fixture(scope='module')
def selector():
  return band_selection.BandSelector(48, 1200, 100, **FAST)  # b-hat in 1 .. 12


@pytest.mark.parametrize('epsilon', [1.0, 8.0])
def test_search_finds_the_exhaustive_optimum(selector, epsilon):
  found = selector.select(epsilon, 1e-6)
  everything = selector.exhaustive(epsilon, 1e-6)
  assert [c.num_bands for c in everything.candidates] == list(range(1, 13))
  assert found.best == everything.best
  # The search optimized fewer strategies than there are b-hat values... unless it had to.
  assert len(found.candidates) <= 12
  assert found.strategy.num_bands <= found.best.num_bands


def test_the_optimum_moves_to_more_bands_with_epsilon(selector):
  # BandMF paper Sec. 5 / App. G.1: the best b-hat does not decrease with epsilon.
  low = selector.exhaustive(0.5, 1e-6).best.num_bands
  high = selector.exhaustive(16.0, 1e-6).best.num_bands
  assert low < high


def test_candidate_against_dense_math_and_dp_accounting(selector):
  epsilon, delta, bands = 2.0, 1e-6, 4
  c = selector.candidate(bands, epsilon, delta)
  assert c.sampling_prob == 100 / (1200 // 4)
  assert c.compositions == 12
  matrix = selector.strategy(bands).strategy_matrix(48)
  assert np.all(np.abs(np.triu(matrix, 1)) == 0)
  assert np.all(np.tril(matrix, -bands) == 0)
  kappa = np.linalg.norm(matrix, axis=0).max()
  decoder = np.tril(np.ones((48, 48))) @ np.linalg.inv(matrix)
  rms_loss = kappa * math.sqrt(np.mean(np.sum(decoder**2, axis=1)))
  assert c.loss == pytest.approx(rms_loss, rel=1e-9)
  assert c.rmse == pytest.approx(c.noise_multiplier * c.loss, rel=1e-15)
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-2)
  accountant.compose(dp_accounting.PoissonSampledDpEvent(
      c.sampling_prob, dp_accounting.GaussianDpEvent(c.noise_multiplier)), c.compositions)
  assert accountant.get_epsilon(delta) <= epsilon


def test_one_band_is_dp_sgd(selector):
  # C = I: RmsLoss^2 = mean_i (i + 1) = (n + 1) / 2.
  assert selector.loss(1) == pytest.approx(math.sqrt(49 / 2), rel=1e-12)


def test_coarse_grid():
  assert band_selection.coarse_grid(12) == (1, 2, 4, 8, 12)
  assert band_selection.coarse_grid(1) == (1,)
  assert band_selection.max_bands(2052, 342477, 1000) == 342
  assert band_selection.max_bands(10, 342477, 1000) == 10


@pytest.mark.parametrize('args, name', [
    ((48, 100, 200), 'batch_size'), ((0, 100, 10), 'num_rounds'), ((48, 100.5, 10), 'dataset_size'),
])
def test_bad_settings_name_the_parameter(args, name):
  with pytest.raises(ValueError, match=name):
    band_selection.BandSelector(*args)


def test_bad_bands_and_targets(selector):
  with pytest.raises(ValueError, match='num_bands'):
    selector.loss(13)
  with pytest.raises(ValueError, match='target_epsilon'):
    selector.select(-1.0, 1e-6)
  with pytest.raises(ValueError, match='error'):
    band_selection.BandSelector(48, 1200, 100, error='mean')


def test_candidate_sets(selector):
  assert band_selection.powers_of_two(12) == (1, 2, 4, 8)
  assert band_selection.powers_of_two(1) == (1,)
  assert band_selection.powers_of_two(1024)[-1] == 1024
  assert band_selection.candidate_bands(None, 12) is None
  assert band_selection.candidate_bands('all', 12) is None
  assert band_selection.candidate_bands('pow2', 12) == (1, 2, 4, 8)
  assert band_selection.candidate_bands([9, 3, 9, np.int64(5)], 12) == (3, 5, 9)
  pow2 = selector.select(8.0, 1e-6, candidates='pow2')
  assert [c.num_bands for c in pow2.candidates] == [1, 2, 4, 8]
  assert pow2.candidate_set == 'pow2 1, 2, 4, 8'
  everything = selector.exhaustive(8.0, 1e-6)
  assert everything.candidate_set == 'all 1 .. 12 (exhaustive)'
  assert pow2.best == min((c for c in everything.candidates if c.num_bands in (1, 2, 4, 8)),
                          key=lambda c: c.rmse)
  given = band_selection.select_bands(8.0, 1e-6, 48, 1200, 100, candidates=(3, 7), **FAST)
  assert [c.num_bands for c in given.candidates] == [3, 7]
  assert given.candidate_set == 'given 3, 7'
  assert given.best == min(everything.candidates[2], everything.candidates[6], key=lambda c: c.rmse)
  assert selector.select(8.0, 1e-6).candidate_set == 'all 1 .. 12 (branch and bound)'
  assert selector.select(8.0, 1e-6, candidates='all').best == everything.best


@pytest.mark.parametrize('candidates', ['pow3', [], [0], [13], [2.0], [True], 5])
def test_bad_candidates_name_the_parameter(selector, candidates):
  with pytest.raises(ValueError, match='`candidates`'):
    selector.select(1.0, 1e-6, candidates=candidates)


def test_search_discretization_follows_small_epsilons():
  # 1024 compositions at q = 1/2, epsilon 1/32: a fixed PLD discretization of 1e-3 overstated sigma
  # 2.8 times (pessimistic rounding adds up over the compositions); the default scales it with
  # epsilon. Against a 10x finer calibration: never below it (an upper bound), at most 1% above.
  selector = band_selection.BandSelector(1024, 2, 1)
  sigma = selector.noise_multiplier(1, 1 / 32, 1e-6)
  fine = amplification.amplified_noise_multiplier(1 / 32, 1024, 1, 0.5, 1e-6,
                                                  value_discretization_interval=3.125e-6)
  assert fine * (1 - 1e-3) <= sigma <= fine * 1.01
  coarse = band_selection.BandSelector(1024, 2, 1, value_discretization_interval=1e-3)
  assert coarse.noise_multiplier(1, 1 / 32, 1e-6) > 2 * fine


def test_an_unreachable_target_is_refused_before_any_optimization():
  selector = band_selection.BandSelector(100, 1000, 10)
  with pytest.raises(ValueError, match=r'`target_epsilon`=1e\+06 is above'):
    selector.select(1e6, 1e-10)
  assert not selector._strategies  # nothing was optimized


def test_a_search_that_cannot_finish_or_be_accounted_is_refused_up_front():
  with pytest.raises(ValueError, match=r'`dataset_size`=9223372036854775807 with `batch_size`=1 '
                     r'gives the sampling probability'):
    band_selection.select_bands(1.0, 1e-6, 100, 2**63 - 1, 1)
  # b-hat = 1, 2, 4, ..., 20000 at n = 20000: at least 5 ns n b-hat^2 each (the optimizer's model).
  with pytest.raises(ValueError, match=r'the band selection over b-hat = 1 \.\. 20000 \(min\(floor\('
                     r'`dataset_size` / `batch_size`\), `num_rounds`\) .* would take about'):
    band_selection.select_bands(1.0, 1e-6, 20000, 10**6, 1)
  with pytest.raises(ValueError, match=r'`candidates` up to b-hat = 20000 at `num_rounds`=20000'):
    band_selection.select_bands(1.0, 1e-6, 20000, 10**6, 1, candidates=(1, 20000))
