"""The run plan: settings validation, the resolved defaults, the noise split against TFF, round trips.
"""

import dataclasses
import json
import math

import numpy as np
import pytest
import tensorflow_federated as tff

from dp_ftrl_tff import plan, settings
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.mechanisms import banded, blt, gaussian, tree

pytestmark = pytest.mark.unit

BLT = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2))
BANDED = banded.BandedStrategy.from_toeplitz([1.0, 0.5, 0.25], num_rounds=8)


def test_restart_rounds():
  assert settings.EVERY_ROUND.restart_rounds(4) == [1, 2, 3]
  assert settings.RestartSchedule(0, 3).restart_rounds(10) == [3, 6, 9]
  assert settings.GBOARD_RESTARTS.restart_rounds(2200) == [128, 1152, 2176]
  with pytest.raises(ValueError, match='period'):
    settings.RestartSchedule(0, 0)


@pytest.mark.parametrize('kwargs, name', [
    ({'target_unclipped_quantile': 1.5}, 'target_unclipped_quantile'),
    ({'clip_learning_rate': -1.0}, 'clip_learning_rate'),
    ({'initial_clip': 0.0}, 'initial_clip'), ({'clipped_count_stddev': -1.0},
                                              'clipped_count_stddev'),
    ({'restarts': (1, 2)}, 'restarts')])
def test_invalid_adaptive_settings_are_named(kwargs, name):
  with pytest.raises(ValueError, match=name):
    settings.AdaptiveClipping(**kwargs)


@pytest.mark.parametrize('noise_multiplier, num_clients', [(0.5, 100), (3.0, 1000), (1.0, 20)])
def test_noise_split_matches_tff(noise_multiplier, num_clients):
  value, count = tff.aggregators.differential_privacy.adaptive_clip_noise_params(
      noise_multiplier, num_clients)
  assert count == pytest.approx(num_clients / 20.0)
  assert settings.inflated_noise_multiplier(noise_multiplier, count) == pytest.approx(value, rel=1e-12)
  assert settings.accounted_noise_multiplier(value, count) == pytest.approx(noise_multiplier, rel=1e-12)
  built = plan.RunPlan.build(BLT, noise_multiplier, num_clients, None, adaptive_clip=True)
  assert built.value_noise_multiplier == pytest.approx(value, rel=1e-12)
  assert built.clipped_count_stddev == count


def test_build_resolves_defaults():
  fixed = plan.RunPlan.build(BLT, 1.0, 10, 2.0)
  assert (fixed.restarts, fixed.clipped_count_stddev, fixed.value_noise_multiplier) == (None, None,
                                                                                        1.0)
  adaptive = plan.RunPlan.build(tree.TreeStrategy('efficient'), 1.0, 20, None, adaptive_clip=True)
  assert adaptive.clip_norm == settings.DEFAULT_INITIAL_CLIP
  assert adaptive.restarts == settings.GBOARD_RESTARTS
  assert plan.RunPlan.build(gaussian.GaussianStrategy(), 1.0, 20, 0.5,
                            adaptive_clip=True).restarts == settings.EVERY_ROUND
  quiet = plan.RunPlan.build(BLT, 0.0, 20, 0.5, adaptive_clip=True)
  assert (quiet.value_noise_multiplier, quiet.clipped_count_stddev) == (0.0, 0.0)
  assert plan.RunPlan.build(BLT, 1.0, 10, 1.0, secure=16).secure == settings.SecureAggregation(bits=16)
  assert plan.RunPlan.build(BANDED, 1.0, 10, 1.0, beyond_max_rounds='restart').restart_rounds(
      20) == [8, 16]


@pytest.mark.parametrize('kwargs, name', [
    ({'noise_multiplier': -1.0}, 'noise_multiplier'), ({'clients_per_round': 0}, 'clients_per_round'),
    ({'clip_norm': None}, 'clip_norm'), ({'secure': True}, 'secure'),
    ({'adaptive_clip': 'yes'}, 'adaptive_clip'), ({'beyond_max_rounds': 'wrap'}, 'beyond_max_rounds'),
    ({'strategy': tree.TreeStrategy('full')}, 'streaming'), ({'strategy': 'blt'}, 'strategy'),
    ({'restarts': 5}, 'restarts')])
def test_invalid_plans_are_named(kwargs, name):
  args = dict(strategy=BLT, noise_multiplier=1.0, clients_per_round=10, clip_norm=1.0)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    plan.RunPlan.build(**args)


@pytest.mark.parametrize('strategy', [BLT, BANDED, gaussian.GaussianStrategy(),
                                      tree.TreeStrategy('vanilla')])
def test_file_round_trip(strategy, tmp_path):
  original = plan.RunPlan.build(
      strategy, 2.0, 50, None, adaptive_clip=settings.AdaptiveClipping(
          initial_clip=0.3, clipped_count_stddev=4.0, restarts=settings.RestartSchedule(5, 10)),
      secure=settings.SecureAggregation(bits=18, rotation='hd', beta=math.exp(-0.5)),
      zeroing_norm=100.0)
  path = tmp_path / 'plan.json'
  plan.save_plan(original, path)
  loaded = plan.load_plan(path)
  for field in dataclasses.fields(plan.RunPlan):
    if field.name != 'strategy':
      assert getattr(loaded, field.name) == getattr(original, field.name), field.name
  for key, value in original.strategy.to_config().items():
    np.testing.assert_array_equal(loaded.strategy.to_config()[key], value)
  assert 'RunPlan' in str(loaded) and strategy.name in str(loaded)


def test_replace_revalidates_and_recomputes_the_noise_split():
  adaptive = plan.RunPlan.build(BLT, 0.0, 100, None, adaptive_clip=True, num_rounds=10)
  assert (adaptive.clipped_count_stddev, adaptive.value_noise_multiplier) == (0.0, 0.0)
  noisy = dataclasses.replace(adaptive, noise_multiplier=1.0)
  assert noisy.clipped_count_stddev == 5.0  # clients_per_round / 20
  assert noisy.value_noise_multiplier == settings.inflated_noise_multiplier(1.0, 5.0)
  assert noisy == plan.RunPlan.build(BLT, 1.0, 100, None, adaptive_clip=True, num_rounds=10)
  with pytest.raises(ValueError, match='noise_multiplier'):
    dataclasses.replace(adaptive, noise_multiplier=-1.0)
  with pytest.raises(ValueError, match='target_delta'):
    dataclasses.replace(adaptive, target_delta=2.0)


def test_config_keys_are_the_fields_in_order():
  config = plan.RunPlan.build(BLT, 1.0, 10, 1.0).to_config()
  assert list(config) == [field.name for field in dataclasses.fields(plan.RunPlan)]
  assert plan.RunPlan.from_config(config) == plan.RunPlan.build(BLT, 1.0, 10, 1.0)


def test_bad_plan_files_are_named(tmp_path):
  with pytest.raises(ValueError, match='plan'):
    plan.load_plan(tmp_path / 'missing.json')
  (tmp_path / 'bad.json').write_text('{"strategy": {"mechanism": "blt"}}')
  with pytest.raises(ValueError, match='lacks'):
    plan.load_plan(tmp_path / 'bad.json')
  with pytest.raises(ValueError, match='plan'):
    plan.save_plan('x', tmp_path / 'x.json')


def test_scale_factor_fits_the_field_at_k_stddevs():
  config = settings.SecureAggregation(bits=16, rotation='dft', modclip_prob=1e-4)
  clip, n, dim = 0.5, 100, 10_000
  gamma = 1.0 / config.scale_factor(clip, n, dim)
  # k stddevs of the aggregate (sub-Gaussian, all clients aligned) span exactly the field.
  k = 3.890591886413094  # sqrt(2) erfcinv(1e-4), from a table of the normal quantile.
  assert config.num_stddevs == pytest.approx(k, rel=1e-12)
  d = config.padded_dim(dim)
  span = 2 * k * math.sqrt(clip**2 * n**2 / d + gamma**2 * n / 4)
  np.testing.assert_allclose(span, 2.0**16 * gamma, rtol=1e-6)
  # The scale is a constant over the clip, up to the cap.
  assert config.scale_factor(10 * clip, n, dim) == pytest.approx(
      config.scale_factor(clip, n, dim) / 10, rel=1e-12)
  assert config.scale_factor(1e-12, n, dim) == settings.MAX_SCALE_FACTOR


def test_scale_factor_without_rotation_is_worst_case():
  config = settings.SecureAggregation(bits=12, rotation=None)
  # n * (clip * scale + 1) = 2^(bits - 1).
  np.testing.assert_allclose(10 * (config.scale_factor(1.0, 10, 50) + 1), 2**11)


def test_too_few_bits_is_named():
  with pytest.raises(ValueError, match='bits'):
    settings.SecureAggregation(bits=4, rotation=None).scale_factor(1.0, 100, 10)


@pytest.mark.parametrize('kwargs, name', [({'bits': 0}, 'bits'), ({'bits': 23}, 'bits'),
                                          ({'rotation': 'fft'}, 'rotation'),
                                          ({'beta': 1.0}, 'beta'),
                                          ({'modclip_prob': 0.0}, 'modclip_prob')])
def test_invalid_secure_settings_are_named(kwargs, name):
  with pytest.raises(ValueError, match=name):
    settings.SecureAggregation(**kwargs)


def test_padded_dim():
  assert settings.SecureAggregation(rotation='hd').padded_dim(5) == 8
  assert settings.SecureAggregation(rotation='dft').padded_dim(5) == 6
  assert settings.SecureAggregation(rotation=None).padded_dim(5) == 5


@pytest.mark.parametrize('z, sigma_b, expected', [
    # Gboard paper Sec. 2.1 / Thm. 1 (docs/papers.md#gboard); values computed from its formula.
    (7.0, 325.0, 7.000405952470763),  # report goal 6500, sigma_b = 6500 / 20
    (0.54, 25.0, 0.540031495555258),  # report goal 500
    (7.0, 25.0, 7.069625178409298),
])
def test_inflated_noise_multiplier_matches_notes(z, sigma_b, expected):
  assert settings.inflated_noise_multiplier(z, sigma_b) == pytest.approx(expected, rel=1e-14)


def test_inflation_composes_to_the_accounted_zcdp():
  # zCDP of the two releases (model sum, sensitivity 1; centred count, sensitivity 1/2) adds up.
  z, sigma_b = 3.0, 4.0
  z_delta = settings.inflated_noise_multiplier(z, sigma_b)
  rho_total = 1 / (2 * z_delta**2) + 0.5**2 / (2 * sigma_b**2)
  assert rho_total == pytest.approx(1 / (2 * z**2), rel=1e-13)


def test_accounted_noise_multiplier_inverts_inflation():
  z_delta = settings.inflated_noise_multiplier(7.0, 325.0)
  assert settings.accounted_noise_multiplier(z_delta, 325.0) == pytest.approx(7.0, rel=1e-14)
  assert settings.accounted_noise_multiplier(7.0, 325.0) < 7.0


@pytest.mark.parametrize('z, sigma_b, name', [
    (7.0, 3.5, 'noise_multiplier'),  # z == 2 sigma_b
    (8.0, 3.5, 'noise_multiplier'),
    (0.0, 3.5, 'noise_multiplier'),
    (1.0, -1.0, 'clipped_count_stddev'),
    (1.0, math.inf, 'clipped_count_stddev'),
])
def test_inflated_noise_multiplier_rejects_bad_input(z, sigma_b, name):
  with pytest.raises(ValueError, match=name):
    settings.inflated_noise_multiplier(z, sigma_b)


def test_the_state_description_leaves_out_the_optimizer_wall_time():
  from dp_ftrl_tff.mechanisms import resolve  # pylint: disable=g-import-not-at-top
  plans = [plan.RunPlan.build(gaussian.GaussianStrategy(), 1.0, 10, 1.0,
                              strategy_source=resolve.StrategySource('optimized', seconds=s))
           for s in (1.5, 2.5)]
  assert plans[0].to_config(fingerprint_arrays=True) == plans[1].to_config(fingerprint_arrays=True)
  assert plans[0].to_config()['strategy_source']['seconds'] == 1.5  # the plan file keeps it


def _min_sep_plan(**kwargs):
  return plan.RunPlan.build(BLT, 1.0, 10, 1.0, num_rounds=6,
                            participation=plan.participation_lib.ParticipationSchema.b_min_sep(2),
                            **kwargs)


def test_population_and_noise_seed_round_trip(tmp_path):
  original = _min_sep_plan(population=1000, noise_seed_fixed=True)
  assert (original.population, original.noise_seed_fixed) == (1000, True)
  config = original.to_config()
  assert (config['population'], config['noise_seed_fixed']) == (1000, True)
  plan.save_plan(original, tmp_path / 'plan.json')
  loaded = plan.load_plan(tmp_path / 'plan.json')
  assert (loaded.population, loaded.noise_seed_fixed) == (1000, True)
  assert 'noise seed: FIXED (testing only' in str(loaded) and 'population=1000' in str(loaded)
  secret = _min_sep_plan(population=1000, noise_seed_fixed=False)
  assert 'from OS entropy' in str(secret)
  # Calibration keeps them.
  assert dataclasses.replace(secret, noise_multiplier=2.0).noise_seed_fixed is False
  assert dataclasses.replace(secret, noise_multiplier=2.0).population == 1000


def test_plan_without_population_and_seed_keys_loads(tmp_path):
  """A plan.json of an earlier release (no 'population', no 'noise_seed_fixed') loads with None."""
  config = _min_sep_plan(population=50, noise_seed_fixed=False).to_config()
  del config['population'], config['noise_seed_fixed']
  (tmp_path / 'plan.json').write_text(json.dumps(config))
  loaded = plan.load_plan(tmp_path / 'plan.json')
  assert (loaded.population, loaded.noise_seed_fixed) == (None, None)
  assert 'noise seed: not recorded' in str(loaded)


def test_population_of_a_sampling_is_the_plans():
  sampling = sampling_lib.Sampling('poisson', 0.1, population=200)
  sampled = plan.RunPlan.build(gaussian.GaussianStrategy(), 1.0, None, 1.0, sampling=sampling)
  assert sampled.population == 200
  with pytest.raises(ValueError, match='population'):
    plan.RunPlan.build(gaussian.GaussianStrategy(), 1.0, None, 1.0, sampling=sampling,
                       population=300)


@pytest.mark.parametrize('kwargs, name', [
    ({'population': 5}, 'population'),  # fewer clients than the 10 per round
    ({'population': 0}, 'population'), ({'population': 2.5}, 'population'),
    ({'noise_seed_fixed': 'yes'}, 'noise_seed_fixed'), ({'noise_seed_fixed': 1}, 'noise_seed_fixed')])
def test_invalid_population_and_seed_are_named(kwargs, name):
  with pytest.raises(ValueError, match=name):
    _min_sep_plan(**kwargs)


@pytest.mark.parametrize('field, value', [
    ('noise_multiplier', 'abc'), ('noise_multiplier', None), ('clients_per_round', [1]),
    ('clip_norm', True), ('num_rounds', 2.5), ('target_delta', '1e-6'), ('population', '1000'),
    ('noise_seed_fixed', 'true'), ('noise_seed_fixed', 0), ('beyond_max_rounds', 3),
    ('adaptive_clip', 'abc'), ('sampling', 'poisson'), ('participation', [2, 3]),
    ('restarts', [1]), ('strategy', 'blt'), ('value_noise_multiplier', 'x')])
def test_wrong_field_type_is_one_line_naming_field_and_path(tmp_path, field, value):
  config = _min_sep_plan(population=100, noise_seed_fixed=False).to_config()
  config[field] = value
  path = tmp_path / 'plan.json'
  path.write_text(json.dumps(config))
  with pytest.raises(ValueError) as raised:
    plan.load_plan(path)
  message = str(raised.value)
  assert isinstance(raised.value, plan.InvalidPlanFileError)
  assert f"field '{field}'" in message and str(path) in message and '\n' not in message, message


@pytest.mark.parametrize('field, value, fragment', [
    ('participation', {'min_sep': 'two'}, 'min_sep'),
    ('sampling', {'kind': 'poisson', 'sampling_prob': 0.1, 'bogus': 1}, 'bogus'),
    ('adaptive_clip', {'target_unclipped_quantile': 'x'}, 'target_unclipped_quantile')])
def test_wrong_nested_field_names_the_plan_field(tmp_path, field, value, fragment):
  config = _min_sep_plan().to_config()
  config[field] = value
  path = tmp_path / 'plan.json'
  path.write_text(json.dumps(config))
  with pytest.raises(plan.InvalidPlanFileError, match=fragment) as raised:
    plan.load_plan(path)
  assert f"field '{field}'" in str(raised.value) and str(path) in str(raised.value)


@pytest.mark.parametrize('sigma', [1e300, 1e-300, 1e101, 1e-101])
def test_noise_multiplier_outside_the_float64_range_is_refused(sigma):
  with pytest.raises(ValueError, match=r'`noise_multiplier`=.* is outside \[1e-100, 1e\+100\]'):
    plan.RunPlan.build(BLT, sigma, 10, 1.0)
  assert plan.RunPlan.build(BLT, 1e-100, 10, 1.0).noise_multiplier == 1e-100
  assert plan.RunPlan.build(BLT, 0.0, 10, 1.0).noise_multiplier == 0.0


@pytest.mark.parametrize('field, value, fragment', [
    ('noise_multiplier', 1e308, "field 'noise_multiplier'|`noise_multiplier`=1e\\+308"),
    ('strategy', {'mechanism': 'blt', 'theta': [0.9], 'omega': [1e300]}, 'omega'),
])
def test_plan_file_with_an_extreme_value_is_one_line_naming_the_file(tmp_path, field, value,
                                                                     fragment):
  path = tmp_path / 'plan.json'
  config = plan.RunPlan.build(BLT, 1.0, 10, 1.0, num_rounds=4).to_config()
  config[field] = value
  path.write_text(json.dumps(config))
  with pytest.raises(plan.InvalidPlanFileError, match=fragment) as error:
    plan.load_plan(path)
  assert str(path) in str(error.value) and '\n' not in str(error.value)
