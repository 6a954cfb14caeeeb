"""Tests of `plan_guarantee` against independent dp_accounting computations.

The independent side: the squared sensitivity by brute force over every admissible participation
pattern (tests/testing/patterns.py) of the dense strategy matrix (block diagonal over restart
segments), the adaptive-clipping composition rho = rho_value + rho_count written out, and the event
built here and converted by a fresh dp_accounting PLD accountant.
"""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.linalg

from dp_ftrl_tff import accounting, settings
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.accounting import run_guarantee, zcdp
from dp_ftrl_tff.mechanisms import banded_optimizer, blt, gaussian, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns

pytestmark = pytest.mark.unit

N, MIN_SEP, K = 12, 3, 3
DELTA = 1e-6
# PLD's pessimistic discretization rounds each privacy loss up to a grid of this width: two
# computations of the same Gaussian whose noise multipliers differ by rounding can land on
# neighbouring grid points, so their epsilons agree to this much.
PLD_INTERVAL = 1e-4
# Large enough that rho stays below 1 (PLD's cost grows with rho).
SIGMA = 8.0


def _banded():
  return banded_optimizer.optimize_banded(N, MIN_SEP, participation_lib.ParticipationSchema(MIN_SEP, K),
                                toeplitz=True).strategy


STRATEGIES = {
    'gaussian': gaussian.GaussianStrategy,
    'tree': lambda: tree.TreeStrategy('vanilla'),
    'tree_efficient': lambda: tree.TreeStrategy('efficient'),
    'banded': _banded,
    'blt': lambda: blt.BLTStrategy(theta=(0.9, 0.4), omega=(0.3, 0.2)),
}


def _brute_force_sensitivity_squared(strategy, segment_lengths, max_participations=K):
  """max over admissible patterns u of ||C u||^2, C block diagonal over the noise segments."""
  c = scipy.linalg.block_diag(*[strategy.strategy_matrix(length) for length in segment_lengths])
  schema = participation_lib.ParticipationSchema(MIN_SEP, max_participations)
  n = sum(segment_lengths)
  best = 0.0
  for pattern in patterns.all_patterns(schema, n):  # all, not only maximal: C^T C may be signed
    u = np.zeros(n)
    u[list(pattern)] = 1.0
    best = max(best, float(np.sum((c @ u)**2)))
  return best


def _pld_epsilon(event):
  accountant = dp_accounting.pld.PLDAccountant()
  accountant.compose(event)
  return accountant.get_epsilon(DELTA)


def _check_against(guarantee, rho):
  """The guarantee equals the one of an independent Gaussian event carrying `rho`."""
  assert guarantee.rho == pytest.approx(rho, rel=1e-12)
  independent = dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / math.sqrt(2.0 * rho))
  assert guarantee.epsilon == pytest.approx(_pld_epsilon(independent), abs=PLD_INTERVAL)
  # The returned event is the one whose PLD epsilon is reported, exactly.
  assert _pld_epsilon(guarantee.dp_event) == guarantee.epsilon
  assert guarantee.delta == DELTA


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_fixed_clip_matches_brute_force_event(name):
  strategy = STRATEGIES[name]()
  sigma = SIGMA
  plan = plan_lib.RunPlan.build(strategy, sigma, 10, 1.0)
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP, max_participations=K,
                                delta=DELTA)
  sens_sq = _brute_force_sensitivity_squared(strategy, [N])
  assert g.guarantee.sensitivity_squared == pytest.approx(sens_sq, rel=1e-12)
  _check_against(g, sens_sq / (2 * sigma**2))
  assert g.rho_count == 0.0 and g.rho_value == pytest.approx(g.rho, rel=1e-15)
  assert g.noise_multiplier == sigma and g.guarantee.mechanism == strategy.name


@pytest.mark.parametrize('name', sorted(STRATEGIES))
def test_adaptive_clipping_composes_value_and_count(name):
  strategy = STRATEGIES[name]()
  sigma, sigma_b = SIGMA, 10.0
  # Restarts past n: one segment, so the brute force covers the whole run.
  clipping = settings.AdaptiveClipping(clipped_count_stddev=sigma_b,
                                       restarts=settings.RestartSchedule(warmup=N, period=N))
  plan = plan_lib.RunPlan.build(strategy, sigma, 10, None, adaptive_clip=clipping)
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP, max_participations=K,
                                delta=DELTA)
  sens_sq = _brute_force_sensitivity_squared(strategy, [N])
  z_value = plan.value_noise_multiplier
  assert z_value > sigma
  rho_value = sens_sq / (2 * z_value**2)  # the model sum
  rho_count = sens_sq * 0.5**2 / (2 * sigma_b**2)  # the centred clipped count, sensitivity 1/2
  _check_against(g, rho_value + rho_count)
  assert g.rho_value == pytest.approx(rho_value, rel=1e-12)
  assert g.rho_count == pytest.approx(rho_count, rel=1e-12)
  assert g.value_noise_multiplier == z_value and g.clipped_count_stddev == sigma_b


@pytest.mark.parametrize('name', ['gaussian', 'tree', 'tree_efficient'])
def test_restart_schedule_exact_for_trees_and_gaussian(name):
  strategy = STRATEGIES[name]()
  clipping = settings.AdaptiveClipping(clipped_count_stddev=10.0,
                                       restarts=settings.RestartSchedule(warmup=5, period=4))
  plan = plan_lib.RunPlan.build(strategy, SIGMA, 10, None, adaptive_clip=clipping)
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP, max_participations=K,
                                delta=DELTA)
  if strategy.correlated:
    assert g.guarantee.restart_rounds == (5, 9)
    lengths = [5, 4, 3]
  else:  # iid noise: the clip is adopted every round
    lengths = [1] * N
  sens_sq = _brute_force_sensitivity_squared(strategy, lengths)
  assert g.guarantee.sensitivity_squared == pytest.approx(sens_sq, rel=1e-12)
  _check_against(g, sens_sq / (2 * settings.accounted_noise_multiplier(
      plan.value_noise_multiplier, 10.0)**2))
  assert g.sensitivity_exact


@pytest.mark.parametrize('name', ['banded', 'blt'])
def test_restart_schedule_never_understates_for_other_strategies(name):
  strategy = STRATEGIES[name]()
  plan = plan_lib.RunPlan.build(strategy, SIGMA, 10, 1.0,
                                restarts=settings.RestartSchedule(warmup=5, period=4))
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP, max_participations=K,
                                delta=DELTA)
  sens_sq = _brute_force_sensitivity_squared(strategy, [5, 4, 3])
  assert g.guarantee.sensitivity_squared >= sens_sq * (1 - 1e-12)
  assert g.epsilon >= _pld_epsilon(dp_accounting.GaussianDpEvent(SIGMA / math.sqrt(sens_sq)))


@pytest.mark.parametrize('name', ['tree_efficient', 'blt'])
def test_secure_aggregation_guarantee_is_relative_to_the_post_rounding_bound(name):
  """The aggregator's noise std is sigma x the post-rounding bound, so sigma's guarantee stands."""
  strategy = STRATEGIES[name]()
  secure = settings.SecureAggregation(bits=16)
  plan = plan_lib.RunPlan.build(strategy, SIGMA, 10, 1.0, secure=secure)
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP, max_participations=K,
                                delta=DELTA)
  _check_against(g, _brute_force_sensitivity_squared(strategy, [N]) / (2 * SIGMA**2))
  assert g.secure == secure


def test_max_participations_defaults_to_the_schema_maximum():
  plan = plan_lib.RunPlan.build(tree.TreeStrategy('vanilla'), SIGMA, 10, 1.0)
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP, delta=DELTA)
  explicit = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP,
                                       max_participations=math.ceil(N / MIN_SEP), delta=DELTA)
  assert g.rho == explicit.rho
  assert g.guarantee.participation.max_participations is None


def test_matches_zcdp_guarantee_for_the_run():
  strategy = STRATEGIES['blt']()
  plan = plan_lib.RunPlan.build(strategy, SIGMA, 10, 1.0)
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=MIN_SEP, max_participations=K,
                                delta=DELTA)
  assert g.guarantee == zcdp.guarantee(strategy, N, participation_lib.ParticipationSchema(
      MIN_SEP, K), SIGMA, DELTA)


def test_sampled_plan_refuses_a_schema_its_sampler_does_not_enforce():
  sampling = sampling_lib.Sampling(kind='cyclic_poisson', sampling_prob=0.5, num_groups=3,
                               population=30)
  plan = plan_lib.RunPlan.build(tree.TreeStrategy('vanilla'), SIGMA, None, 1.0, sampling=sampling)
  with pytest.raises(ValueError, match='min_sep'):
    accounting.plan_guarantee(plan, rounds=N, min_sep=4, delta=DELTA)
  with pytest.raises(ValueError, match='max_participations'):
    accounting.plan_guarantee(plan, rounds=N, min_sep=3, max_participations=2, delta=DELTA)
  g = accounting.plan_guarantee(plan, rounds=N, min_sep=3, delta=DELTA)
  _check_against(g, _brute_force_sensitivity_squared(tree.TreeStrategy('vanilla'), [N], None)
                 / (2 * SIGMA**2))


@pytest.mark.parametrize('kwargs, match', [
    (dict(rounds=0, min_sep=1, delta=DELTA), 'rounds'),
    (dict(rounds=5, min_sep=0, delta=DELTA), 'min_sep'),
    (dict(rounds=5, min_sep=1, max_participations=0, delta=DELTA), 'max_participations'),
    (dict(rounds=5, min_sep=1, delta=1.0), 'delta'),
])
def test_rejects_bad_arguments(kwargs, match):
  plan = plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, 10, 1.0)
  with pytest.raises(ValueError, match=match):
    accounting.plan_guarantee(plan, **kwargs)


def test_rejects_a_plan_without_noise_and_a_non_plan():
  plan = plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 0.0, 10, 1.0)
  with pytest.raises(ValueError, match='noise_multiplier 0'):
    accounting.plan_guarantee(plan, rounds=5, min_sep=1, delta=DELTA)
  with pytest.raises(ValueError, match='plan'):
    run_guarantee.plan_guarantee('plan.json', rounds=5, min_sep=1, delta=DELTA)
