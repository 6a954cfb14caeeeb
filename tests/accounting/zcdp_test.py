"""Tests for `dp_ftrl_tff.accounting.zcdp`: published numbers, brute-force worst cases, no TensorFlow.

Targets come from the accounting colab (docs/papers.md#colab), the Gboard paper's Tables 1-2
(docs/papers.md#gboard), the BLT paper's Table 4 (docs/papers.md#blt) and the DP-FTRL paper's
Tables 3-5 (docs/papers.md#dp-ftrl); the brute-force checks compare
against max over every admissible pattern of ||C u||^2 computed with dense matrices.
"""

import itertools
import math
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
import scipy.optimize

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import settings
from dp_ftrl_tff.accounting import zcdp, zcdp_epsilon
from dp_ftrl_tff.mechanisms import banded, base, blt, gaussian, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

Schema = participation_lib.ParticipationSchema


@pytest.mark.e2e
def test_import_does_not_load_tensorflow():
  code = ('import sys; import dp_ftrl_tff.accounting, dp_ftrl_tff.accounting.zcdp, '
          'dp_ftrl_tff.accounting.calibration, dp_ftrl_tff.accounting.participation_log, '
          'dp_ftrl_tff.plan, dp_ftrl_tff.accounting.report, '
          'dp_ftrl_tff.accounting.report_render; '
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
          "assert 'matplotlib' not in sys.modules, 'matplotlib imported before plotting'")
  subprocess.run([sys.executable, '-c', code], check=True, timeout=120)


# --- Accounting colab, cells "es-ES / pt-BR / es-US NWP LM" (docs/papers.md#colab) ----------------


def test_colab_es_es_rho_and_epsilon():
  # The colab's sens^2 for C1 is 0.6 up to a few ulp (implied by its printed zcdp).
  sens_sq = 2 * 0.1506840301548885 * 1.411**2
  assert sens_sq == pytest.approx(0.6, rel=1e-14)
  rho = zcdp.rho_from_sensitivity(0.6000000000000015, 1.411)
  assert rho == pytest.approx(0.1506840301548885, rel=1e-12)
  assert zcdp_epsilon.epsilon_from_rho(rho, 1e-10) == pytest.approx(3.4240074094281336, rel=1e-12)
  assert zcdp.effective_noise_multiplier(0.6, 1.411) == pytest.approx(1.8215931671662218, rel=1e-14)


def test_colab_es_es_through_a_banded_strategy():
  # Not the real C1 (unavailable): a 1-band C = sqrt(0.2) I has the same 3-participation sensitivity.
  strategy = banded.BandedStrategy(math.sqrt(0.2) * np.eye(2000))
  result = zcdp.guarantee(strategy, 2000, Schema(min_sep=484 + 1, max_participations=3), 1.411)
  assert result.sensitivity_squared == pytest.approx(0.6, rel=1e-12)
  assert result.rho == pytest.approx(0.1506840301548885, rel=1e-12)
  assert result.epsilon == pytest.approx(3.4240074094281336, rel=1e-12)


@pytest.mark.parametrize('colab_min_separation', [1428, 1132])  # pt-BR, es-US
def test_colab_pt_br_and_es_us(colab_min_separation):
  # Unit-norm columns, 2 participations fit: sens^2 = 2 (implied by the colab's output).
  assert 2 * 0.014342572340349278 * 8.35**2 == pytest.approx(2.0, rel=1e-14)
  result = zcdp.guarantee(gaussian.GaussianStrategy(), 2000,
                          Schema(min_sep=colab_min_separation + 1, max_participations=3), 8.35)
  assert result.sensitivity_squared == 2.0  # k = 3 is reduced to ceil(2000 / b) = 2, as in the colab
  assert result.rho == pytest.approx(0.014342572340349278, rel=1e-12)
  assert result.epsilon == pytest.approx(0.9935500950539097, rel=1e-12)
  assert result.effective_noise_multiplier == pytest.approx(5.904341622907671, rel=1e-14)


# --- Gboard paper Tables 1 and 2 (docs/papers.md#gboard) ------------------------------------------

# (rounds, MinS = TF-Privacy min_separation, MaxP, paper rho, exact integer sens^2 recomputed)
_GBOARD_ROWS = [
    (930, 212, 4, 0.48, 47), (980, 226, 4, 0.48, 47), (1280, 180, 5, 0.89, 87),
    (1620, 303, 5, 0.71, 70), (530, 54, 8, 1.86, 182), (1900, 526, 3, 0.35, 34),
    (1750, 349, 4, 0.52, 51), (2800, 371, 7, 1.31, 128), (1360, 622, 2, 0.25, 24),
    (3600, 909, 3, 0.45, 44), (1290, 170, 6, 1.14, 112), (1980, 343, 5, 0.64, 63),
    (640, 90, 5, 0.84, 82),  # Table 1 (NWP)
    (1170, 206, 5, 0.89, 87), (1220, 206, 5, 0.89, 87), (1280, 197, 5, 0.89, 87),
    (1300, 290, 4, 0.61, 60), (1360, 188, 5, 0.89, 87), (870, 327, 3, 0.32, 31),
    (430, 54, 7, 0.99, 97),  # Table 2 (OTF)
]


@pytest.mark.parametrize('rounds, min_separation, max_part, paper_rho, sens_sq', _GBOARD_ROWS)
def test_gboard_tables_rho(rounds, min_separation, max_part, paper_rho, sens_sq):
  schema = Schema(min_sep=min_separation + 1, max_participations=max_part)
  result = zcdp.guarantee(tree.TreeStrategy('vanilla'), rounds, schema, 7.0, conversion='gaussian')
  assert result.sensitivity_squared == sens_sq
  assert result.rho == pytest.approx(sens_sq / 98.0, rel=1e-14)
  # The paper prints rho to 2 decimals; en-US* (24 / 98 = 0.2449) is printed 0.25, apparently
  # rounded twice (0.245 -> 0.25). Every other row is round(rho, 2).
  assert abs(result.rho - paper_rho) <= 0.0052
  if sens_sq != 24:
    assert round(result.rho, 2) == paper_rho


@pytest.mark.parametrize('paper_rho, paper_epsilon', [
    (0.25, 4.49), (1.86, 13.69), (0.89, 9.01), (0.61, 7.31), (0.32, 5.13), (0.99, 9.56)])
def test_gboard_epsilon_from_rounded_rho(paper_rho, paper_epsilon):
  # The paper converts its 2-decimal rho with PLD at delta = 1e-10.
  assert round(zcdp_epsilon.epsilon_from_rho(paper_rho, 1e-10), 2) == paper_epsilon


def test_adaptive_clipping_tree_keeps_the_accounted_rho():
  # With adaptive clipping the report accounts z = 7; the value noise is inflated (Thm. 1).
  result = zcdp.guarantee(tree.TreeStrategy('efficient'), 1900, Schema(527, 3), 7.0,
                          conversion='gaussian')
  assert result.rho == pytest.approx(34 / 98)


# --- BLT paper Table 4 (docs/papers.md#blt): rows that reproduce ----------------------------------


@pytest.mark.parametrize('b_opt, rounds, min_sep, max_part, sigma, paper_rho, rho_unit, paper_eps', [
    (1000, 2000, 2001, 1, 8.681, 2.23e-2, 1e-4, 1.25),  # pt-BR BLT-8.681
    (1000, 2000, 1181, 2, 16.1, 1.40e-2, 1e-4, 0.98),  # pt-BR BLT-16.1 (rho 1.394e-2)
    (400, 2350, 447, 5, 7.379, 0.20, 1e-2, 3.93),  # id-ID BLT-7.379 (rho 0.19499)
    (400, 1280, 300, 4, 7.379, 0.16, 1e-2, 3.46),  # es-ES BLT-7.379 (rho 0.1535; eps matches it)
])
def test_blt_table4(b_opt, rounds, min_sep, max_part, sigma, paper_rho, rho_unit, paper_eps):
  # Every printed epsilon reproduces to its 2 decimals; the printed rho is within one unit of its
  # last digit (the paper rounds 0.19499 to 0.20, apparently in two steps, as with Gboard's en-US*).
  result = zcdp.guarantee(blt.PRODUCTION_STRATEGIES[b_opt], rounds, Schema(min_sep, max_part), sigma)
  assert abs(result.rho - paper_rho) <= rho_unit
  assert round(result.epsilon, 2) == paper_eps


# --- DP-FTRL paper Tables 3-5 (docs/papers.md#dp-ftrl; RDP, TF-Privacy orders, delta = 1e-6) ------


@pytest.mark.parametrize('sigma, paper_epsilon', [
    (0.149, 363.66), (1.13, 18.71), (2.33, 7.83), (4.03, 4.19), (6.21, 2.60), (8.83, 1.77)])
def test_dp_ftrl_single_tree_stackoverflow(sigma, paper_epsilon):
  # 1600 rounds, each client in one round: sens^2 = floor(log2 1600) + 1 = 11.
  result = zcdp.guarantee(tree.TreeStrategy('vanilla'), 1600, Schema.single(), sigma, 1e-6,
                          conversion='rdp')
  assert result.sensitivity_squared == 11
  assert round(result.epsilon, 2) == paper_epsilon


@pytest.mark.parametrize('report_goal, population, paper_epsilon', [
    (1000, 342477, 32.52), (5060, 342477, 9.76), (16300, 342477, 4.11), (3850, 10**6, 7.57),
    (10300, 10**6, 3.56)])
def test_dp_ftrl_tree_restart_table5(report_goal, population, paper_epsilon):
  # The paper's convention: ceil(1600 rg / pop) trees, each of floor(pop / rg) rounds, one
  # participation per tree (a fixed epoch), noise 0.149 rg / 100.
  per_tree = population // report_goal
  num_trees = math.ceil(1600 * report_goal / population)
  restarts = [per_tree * i for i in range(1, num_trees)]
  result = zcdp.guarantee(tree.TreeStrategy('vanilla'), per_tree * num_trees,
                          Schema.fixed_epoch_order(num_trees, per_tree), 0.149 * report_goal / 100,
                          1e-6, restart_rounds=restarts, conversion='rdp')
  assert result.sensitivity_squared == num_trees * (int(math.log2(per_tree)) + 1)
  assert round(result.epsilon, 2) == paper_epsilon


# --- Conversions ------------------------------------------------------------------------------------


def test_exact_gaussian_conversion_matches_balle_wang_value():
  rho = 0.6 / (2 * 1.411**2)
  assert zcdp_epsilon.epsilon_from_rho(rho, 1e-10, 'gaussian') == pytest.approx(3.4240072730610374,
                                                                        rel=1e-12)


@pytest.mark.parametrize('rho', [0.02, 0.5, 3.0])  # RDP on TF-Privacy's orders is loose at tiny rho
def test_conversions_are_ordered(rho):
  exact = zcdp_epsilon.epsilon_from_rho(rho, 1e-8, 'gaussian')
  pld = zcdp_epsilon.epsilon_from_rho(rho, 1e-8, 'pld')
  rdp = zcdp_epsilon.epsilon_from_rho(rho, 1e-8, 'rdp')
  bound = rho + 2 * math.sqrt(rho * math.log(1e8))  # the simple zCDP conversion
  assert exact <= pld * (1 + 1e-12)
  assert pld == pytest.approx(exact, rel=1e-4)
  assert pld < rdp < bound


def test_zero_rho_is_zero_epsilon():
  assert zcdp_epsilon.epsilon_from_rho(0.0, 1e-10) == 0.0


@pytest.mark.parametrize('kwargs, name', [
    (dict(rho=-1.0), 'rho'), (dict(rho=1.0, delta=0.0), 'delta'), (dict(rho=1.0, delta=1.0), 'delta'),
    (dict(rho=1.0, conversion='renyi'), 'conversion'),
    (dict(rho=1.0, conversion='rdp', orders=[0.5]), 'orders')])
def test_epsilon_from_rho_rejects_bad_input(kwargs, name):
  with pytest.raises(ValueError, match=name):
    zcdp_epsilon.epsilon_from_rho(**kwargs)


@pytest.mark.parametrize('sens_sq, sigma, name', [
    (1.0, 0.0, 'noise_multiplier'), (1.0, -1.0, 'noise_multiplier'),
    (1.0, float('nan'), 'noise_multiplier'), (-1.0, 1.0, 'sensitivity_squared')])
def test_rho_from_sensitivity_rejects_bad_input(sens_sq, sigma, name):
  with pytest.raises(ValueError, match=name):
    zcdp.rho_from_sensitivity(sens_sq, sigma)


def test_guarantee_rejects_bad_input():
  strategy = gaussian.GaussianStrategy()
  with pytest.raises(ValueError, match='noise_multiplier'):
    zcdp.guarantee(strategy, 10, Schema(), 0.0)
  with pytest.raises(ValueError, match='restart_rounds'):
    zcdp.guarantee(strategy, 10, Schema(), 1.0, restart_rounds=[10])
  with pytest.raises(ValueError, match='participation'):
    zcdp.guarantee(strategy, 10, (2, 3), 1.0)
  with pytest.raises(ValueError, match='strategy'):
    zcdp.guarantee('tree', 10, Schema(), 1.0)


# --- Property: never below the brute-force worst case ------------------------------------------------


def _block_diagonal(strategy, lengths):
  blocks = [strategy.strategy_matrix(m) for m in lengths]
  rows = sum(b.shape[0] for b in blocks)
  out = np.zeros((rows, sum(lengths)))
  r = c = 0
  for block in blocks:
    out[r:r + block.shape[0], c:c + block.shape[1]] = block
    r += block.shape[0]
    c += block.shape[1]
  return out


def _brute_force_sens_sq(matrix, schema, num_rounds):
  best = 0.0
  for pattern in patterns_lib.all_patterns(schema, num_rounds):
    u = np.zeros(num_rounds)
    u[list(pattern)] = 1.0
    best = max(best, float(np.sum((matrix @ u)**2)))
  return best


def _strategies(n):
  rng = np.random.default_rng(n)
  signed = np.tril(rng.normal(size=(n, n)))
  np.fill_diagonal(signed, np.abs(np.diag(signed)) + 0.5)
  three_bands = np.tril(signed) - np.tril(signed, -3)
  return [
      gaussian.GaussianStrategy(), tree.TreeStrategy('vanilla'), tree.TreeStrategy('efficient'),
      tree.TreeStrategy('vanilla', completion=True), blt.PRODUCTION_STRATEGIES[100],
      blt.BLTStrategy(theta=(0.9, 0.3), omega=(0.6, 0.7)),  # sum(omega) > 1: upper-bound path
      banded.BandedStrategy(three_bands),  # signed entries, 3 bands (> min_sep for b < 3)
  ]


@pytest.mark.parametrize('n', [5, 8, 9])
@pytest.mark.parametrize('min_sep, max_part', [(1, 1), (1, 2), (2, 2), (2, 3), (3, None), (4, 2)])
def test_rho_never_below_brute_force(n, min_sep, max_part):
  schema = Schema(min_sep, max_part)
  for strategy in _strategies(n):
    result = zcdp.guarantee(strategy, n, schema, 1.3, conversion='gaussian')
    worst = _brute_force_sens_sq(strategy.strategy_matrix(n), schema, n) / (2 * 1.3**2)
    assert result.rho >= worst * (1 - 1e-12), strategy


@pytest.mark.parametrize('restarts', [(3,), (2, 5), (4,)])
@pytest.mark.parametrize('min_sep, max_part', [(1, 2), (2, 3), (3, None)])
def test_rho_with_restarts_never_below_brute_force(restarts, min_sep, max_part):
  n = 8
  schema = Schema(min_sep, max_part)
  lengths = base.segment_lengths(n, restarts)
  for strategy in _strategies(n):
    result = zcdp.guarantee(strategy, n, schema, 1.0, restart_rounds=restarts,
                            conversion='gaussian')
    worst = _brute_force_sens_sq(_block_diagonal(strategy, lengths), schema, n) / 2
    assert result.rho >= worst * (1 - 1e-12), strategy
  # Trees are exact with restarts: equal to the brute force.
  vanilla = tree.TreeStrategy('vanilla')
  result = zcdp.guarantee(vanilla, n, schema, 1.0, restart_rounds=restarts, conversion='gaussian')
  assert result.sensitivity_squared == _brute_force_sens_sq(_block_diagonal(vanilla, lengths),
                                                            schema, n)


def test_segment_lengths():
  assert base.segment_lengths(10, ()) == (10,)
  assert base.segment_lengths(10, [7, 3, 3]) == (3, 4, 3)
  assert list(itertools.accumulate(base.segment_lengths(2000, range(128, 2000, 1024)))) == [
      128, 1152, 2000]


def _cks_optimum(rho, delta):
  """The Canonne-Kamath-Steinke conversion of rho-zCDP minimized over every order alpha > 1 (their
  Prop. 12 written out here, scipy's bounded minimizer in log(alpha - 1)): no grid, no
  dp_accounting. Below it no RDP conversion of rho-zCDP goes."""
  def epsilon(log_a1):
    a = 1.0 + math.exp(log_a1)
    return a * rho + math.log1p(-1.0 / a) - (math.log(delta) + math.log(a)) / (a - 1.0)
  return scipy.optimize.minimize_scalar(epsilon, bounds=(-20.0, 30.0), method='bounded',
                                        options={'xatol': 1e-10}).fun


# Moderate rho, where the PLD and the bound can both be computed (a PLD at rho 10 takes 2 s).
@pytest.mark.parametrize('delta', [1e-5, 1e-10])
@pytest.mark.parametrize('rho', [1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0, 3.0, 10.0])
def test_zcdp_bound_is_an_upper_bound_on_the_pld_epsilon(rho, delta):
  """The bound is never below the PLD epsilon (dp_accounting's, not ours) nor the exact Gaussian
  one, never above Bun & Steinke's, and within 0.1% of the best RDP conversion over all orders."""
  bound = zcdp_epsilon.zcdp_epsilon_bound(rho, delta)
  accountant = dp_accounting.pld.PLDAccountant()  # default: add-or-remove, discretization 1e-4
  accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / math.sqrt(2.0 * rho)))
  pld = accountant.get_epsilon(delta)
  # The exact Gaussian epsilon within brentq's relative tolerance.
  assert bound >= pld >= zcdp_epsilon.epsilon_from_rho(rho, delta, 'gaussian') * (1 - 1e-10)
  assert bound <= rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
  optimum = _cks_optimum(rho, delta)
  assert optimum * (1 - 1e-12) <= bound <= optimum * 1.001
  # PLD here, not bound
  assert zcdp_epsilon.epsilon_from_rho(rho, delta) == pytest.approx(pld, rel=1e-12)


@pytest.mark.parametrize('rho', [100.0, 100.0001, 1201.0, 1e4, 1e6, 1e10, 1e100])
def test_zcdp_bound_is_above_the_exact_gaussian_epsilon_at_any_rho(rho):
  """Above the PLD's range the truth of the accounted mechanism (one Gaussian) is the exact
  tradeoff curve: the bound never goes below it; it is the smaller of CKS (on the grid) and
  Bun-Steinke."""
  for delta in (1e-5, 1e-10, 1e-100):
    bound = zcdp_epsilon.zcdp_epsilon_bound(rho, delta)
    assert bound >= zcdp_epsilon.epsilon_from_rho(rho, delta, 'gaussian'), (rho, delta)
    assert bound <= zcdp_epsilon.bun_steinke_bound(rho, delta)
    assert bound >= _cks_optimum(rho, delta) * (1 - 1e-12) or rho >= 1e10  # CKS optimum underflows
  assert zcdp_epsilon.zcdp_epsilon_bound(0.0) == 0.0
  with pytest.raises(ValueError, match='`rho` must be finite'):
    zcdp_epsilon.zcdp_epsilon_bound(math.inf)


def test_rho_above_the_pld_gets_the_zcdp_bound():
  assert zcdp_epsilon.pld_points(zcdp_epsilon.MAX_RHO) < 5e6
  assert zcdp_epsilon.pld_holds(zcdp_epsilon.MAX_RHO) and not zcdp_epsilon.pld_holds(
      np.nextafter(zcdp_epsilon.MAX_RHO, 200))
  assert zcdp_epsilon.accounted_conversion(5e8) == 'zcdp_bound'
  assert zcdp_epsilon.accounted_conversion(5e8, 'gaussian') == 'gaussian'  # a closed form: as asked
  assert zcdp_epsilon.accounted_conversion(1.0) == 'pld'
  assert zcdp_epsilon.epsilon_from_rho(5e8) == zcdp_epsilon.zcdp_epsilon_bound(5e8)
  assert zcdp_epsilon.epsilon_from_rho(5e8, conversion='zcdp_bound') == (
      zcdp_epsilon.zcdp_epsilon_bound(5e8))
  assert zcdp_epsilon.beyond_pld_text(5e8).startswith(
      'rho-zCDP 5e+08 is above the 100 whose privacy loss')
  assert '1e+13 points, about 1.4 PB' in zcdp_epsilon.beyond_pld_text(5e8)
  # At the PLD's edge the figure only rises: the bound just above it exceeds the PLD's range's top.
  assert zcdp_epsilon.epsilon_from_rho(100.0001) > zcdp_epsilon.epsilon_from_rho(
      100.0, conversion='gaussian')


@pytest.mark.parametrize('sigma, rounds', [(1e-20, 10), (1.0, 10**9), (0.05, 6)])
def test_guarantee_beyond_the_pld_is_the_flagged_zcdp_bound(sigma, rounds):
  """A Gaussian plan of 1e9 rounds, a noise multiplier of 1e-20 or 0.05 (rho above 100): the
  guarantee is the zCDP bound, flagged, in every conversion for a plan (the drivers' header uses
  the exact Gaussian curve and must state the report's figure); `guarantee` with a closed form
  converts as asked."""
  participation = participation_lib.ParticipationSchema(min_sep=1)
  result = zcdp.guarantee(gaussian.GaussianStrategy(), rounds, participation, sigma)
  assert result.rho > zcdp_epsilon.MAX_RHO
  assert result.conversion == 'zcdp_bound' and result.epsilon_is_zcdp_bound
  assert result.epsilon == zcdp_epsilon.zcdp_epsilon_bound(result.rho)
  assert result.epsilon >= zcdp_epsilon.epsilon_from_rho(result.rho, conversion='gaussian')
  exact = zcdp.guarantee(gaussian.GaussianStrategy(), rounds, participation, sigma,
                         conversion='gaussian')
  assert not exact.epsilon_is_zcdp_bound and exact.epsilon <= result.epsilon
  run_plan = plan_lib.RunPlan.for_accounting(gaussian.GaussianStrategy(), sigma,
                                             num_rounds=rounds, participation=participation)
  for conversion in ('pld', 'gaussian', 'rdp'):
    planned = zcdp.guarantee_for_plan(run_plan, conversion=conversion)
    assert planned.epsilon_is_zcdp_bound and planned.epsilon == result.epsilon
  below = zcdp.guarantee(gaussian.GaussianStrategy(), 10, participation, 1.0)
  assert below.conversion == 'pld' and not below.epsilon_is_zcdp_bound


def test_rho_of_extreme_noise_multipliers_is_a_number_not_an_exception():
  assert zcdp.rho_from_sensitivity(1.0, 1e300) == 0.0
  assert zcdp.rho_from_sensitivity(1.0, 1e-300) == math.inf


@pytest.mark.parametrize('restarts', [None, settings.RestartSchedule.at((3, 7)),
                                      settings.EVERY_ROUND])
def test_planned_guarantee_is_the_guarantee_of_the_plans_own_setting(restarts):
  # The segments a plan carries (`RunPlan.planned_segments`) against the ones computed from its
  # restart rounds over the same rounds, given explicitly.
  run_plan = plan_lib.RunPlan.build(tree.TreeStrategy(), 2.0, 10, 1.0, restarts=restarts,
                                    num_rounds=12, participation=Schema(3, 2), target_delta=1e-6)
  restart_rounds = tuple(run_plan.restart_rounds(12))
  assert run_plan.planned_segments == (restart_rounds, base.segment_lengths(12, restart_rounds))
  planned = zcdp.planned_guarantee(run_plan)
  assert planned == zcdp.guarantee_for_plan(run_plan, 12, Schema(3, 2))
  assert planned == zcdp.guarantee(tree.TreeStrategy(), 12, Schema(3, 2), 2.0, 1e-6,
                                   restart_rounds=restart_rounds)
  assert zcdp.planned_sensitivity_squared(run_plan) == zcdp.plan_sensitivity_squared(
      run_plan, 12, Schema(3, 2)) == planned.sensitivity_squared
