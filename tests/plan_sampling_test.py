"""Tests of `sampling.Sampling` and the plan's `sampling` field."""

import json

import pytest

from dp_ftrl_tff import plan
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.mechanisms import blt

pytestmark = pytest.mark.unit

BLT = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2))


@pytest.mark.parametrize('population, groups, sizes', [
    (10, 1, [10]), (10, 3, [4, 3, 3]), (12, 4, [3, 3, 3, 3]), (5, 5, [1] * 5)])
def test_group_sizes_partition_the_population(population, groups, sizes):
  sampling = sampling_lib.Sampling('cyclic_poisson', 0.25, groups, population)
  assert sampling.group_sizes() == sizes
  assert sampling.expected_clients_per_round == pytest.approx(0.25 * population / groups,
                                                              rel=1e-15)
  # The fixed denominator is the expected cohort size averaged over one cycle of groups.
  assert sampling.expected_clients_per_round == pytest.approx(
      sum(0.25 * s for s in sizes) / groups, rel=1e-12)


@pytest.mark.parametrize('kwargs, name', [
    (dict(kind='uniform'), 'kind'), (dict(sampling_prob=0.0), 'sampling_prob'),
    (dict(sampling_prob=1.5), 'sampling_prob'), (dict(num_groups=0), 'num_groups'),
    (dict(population=0), 'population'), (dict(num_groups=11), 'num_groups'),
    (dict(kind='poisson', num_groups=2), 'num_groups'), (dict(population=2.5), 'population'),
    (dict(sampling_prob=None), 'sampling_prob'),
    (dict(kind='min_sep', num_groups=1, population=None), 'sampling_prob'),
    (dict(kind='min_sep', sampling_prob=None, population=None), 'num_groups'),
    (dict(kind='min_sep', sampling_prob=None, num_groups=1), 'population')])
def test_sampling_validation_names_the_parameter(kwargs, name):
  args = dict(kind='cyclic_poisson', sampling_prob=0.1, num_groups=2, population=10)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    sampling_lib.Sampling(**args)


def test_plan_takes_the_expected_cohort_as_clients_per_round():
  sampling = sampling_lib.Sampling('cyclic_poisson', 0.1, 3, 100)
  run_plan = plan.RunPlan.build(BLT, 1.0, None, 1.0, sampling=sampling)
  assert run_plan.clients_per_round == sampling.expected_clients_per_round
  assert plan.RunPlan.build(BLT, 1.0, 0.1 * 100 / 3, 1.0, sampling=sampling) == run_plan
  # The constructor resolves it for a plan with a clip; one for accounting only keeps None.
  assert plan.RunPlan(strategy=BLT, noise_multiplier=1.0, clip_norm=1.0,
                      sampling=sampling) == run_plan
  assert plan.RunPlan(strategy=BLT, noise_multiplier=1.0,
                      sampling=sampling).clients_per_round is None
  with pytest.raises(ValueError, match='clients_per_round'):
    plan.RunPlan.build(BLT, 1.0, 10, 1.0, sampling=sampling)
  with pytest.raises(ValueError, match='sampling'):
    plan.RunPlan.build(BLT, 1.0, 10, 1.0, sampling={'kind': 'poisson'})
  with pytest.raises(ValueError, match='sampling'):
    plan.RunPlan.build(BLT, 1.0, 10, 1.0, sampling=None)
  with pytest.raises(ValueError, match='clients_per_round'):
    plan.RunPlan.build(BLT, 1.0, None, 1.0)


def test_sampling_round_trips_and_defaults_to_min_sep(tmp_path):
  sampling = sampling_lib.Sampling('poisson', 0.05, 1, 400)
  run_plan = plan.RunPlan.build(BLT, 2.0, None, 1.0, sampling=sampling)
  path = tmp_path / 'plan.json'
  plan.save_plan(run_plan, path)
  assert plan.load_plan(path) == run_plan
  assert json.loads(path.read_text())['sampling'] == {
      'kind': 'poisson', 'sampling_prob': 0.05, 'num_groups': 1, 'population': 400}
  assert 'sampling=Sampling(kind=' in str(run_plan)
  min_sep = plan.RunPlan.build(BLT, 2.0, 10, 1.0)
  config = min_sep.to_config()
  assert config['sampling'] == {'kind': 'min_sep', 'sampling_prob': None, 'num_groups': 1,
                                'population': None}
  assert min_sep.sampling == sampling_lib.Sampling() and not min_sep.sampling.random_cohorts
  # Min-sep is a kind, not the absence of one: a missing field is the default kind, null is refused.
  assert plan.RunPlan.from_config({k: v for k, v in config.items() if k != 'sampling'}) == min_sep
  with pytest.raises(ValueError, match="field 'sampling' must be an object, got None"):
    plan.RunPlan.from_config(dict(config, sampling=None))
  with pytest.raises(ValueError, match="field 'sampling'.*kind"):
    plan.RunPlan.from_config(dict(config, sampling={'kind': 'uniform'}))
