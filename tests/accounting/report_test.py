"""Tests for `dp_ftrl_tff.accounting.report` and `report_render`: keys, realized participation,
observed tree patterns, markdown, files."""

import dataclasses
import json

import numpy as np
import pytest

from dp_ftrl_tff import plan, settings
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.accounting import (
  calibration,
  report,
  report_render,
  report_sections,
  zcdp,
  zcdp_epsilon,
)
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.mechanisms import banded, blt, gaussian, tree
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

Schema = participation_lib.ParticipationSchema


def _report(strategy, num_rounds, participation, noise_multiplier=None, *, delta=None,
            restart_rounds=None, clipped_count_stddev=None, target_rho=None, **kwargs):
  """`report.build_report` of the accounting plan of these settings."""
  run_plan = plan.RunPlan.for_accounting(
      strategy, 0.0 if noise_multiplier is None else noise_multiplier,
      clipped_count_stddev=clipped_count_stddev,
      restarts=None if restart_rounds is None else settings.RestartSchedule.at(restart_rounds),
      num_rounds=num_rounds, participation=participation, target_delta=delta)
  if target_rho is not None:
    run_plan = calibration.calibrate_plan(run_plan, target_rho=target_rho)
  return report.build_report(run_plan, **kwargs)


def test_declared_report_keys_and_values():
  result = _report(gaussian.GaussianStrategy(), 100, Schema(30, 2), noise_multiplier=2.0,
                               delta=1e-6)
  out = json.loads(report_render.to_json(result))
  assert list(out)[:len(report_render.REQUIRED_KEYS)] == list(report_render.REQUIRED_KEYS)
  # DP-SGD: sens^2 = k = 2 (closed form), rho = 2 / (2 * 4).
  assert out['sensitivity_squared'] == 2.0 and out['rho'] == pytest.approx(0.25)
  assert (out['min_sep'], out['min_separation'], out['max_participations']) == (30, 29, 2)
  assert out['effective_noise_multiplier'] == pytest.approx(2.0 / np.sqrt(2.0))
  assert out['epsilon'] == pytest.approx(zcdp_epsilon.epsilon_from_rho(0.25, 1e-6))
  assert out['participation_source'] == 'declared' and [f['text'] for f in out['findings'] if f['severity'] == 'warning'] == []


def test_effective_k_is_reported():
  result = _report(gaussian.GaussianStrategy(), 100, Schema(30), noise_multiplier=1.0)
  assert report_render.to_dict(result)['max_participations'] == 4  # ceil(100 / 30)


def test_log_that_violates_the_schema_is_reported_with_the_realized_guarantee():
  log = log_lib.ParticipationLog.from_arrays(['a', 'b', 'a', 'a', 'c'], [0, 1, 4, 8, 9])
  result = _report(gaussian.GaussianStrategy(), 10, Schema(5, 2), noise_multiplier=1.0,
                               log=log)
  out = report_render.to_dict(result)
  assert out['participation_source'] == 'observed'
  assert (out['min_sep'], out['max_participations']) == (4, 3)
  assert out['sensitivity_squared'] == 3.0  # realized k = 3 participations, C = I
  assert len(out['observed']['violations']) == 2 and len([f['text'] for f in out['findings'] if f['severity'] == 'warning']) == 2
  assert out['declared']['sensitivity_squared'] == 2.0
  markdown = report_render.to_markdown(result)
  assert 'VIOLATES' in markdown and 'does NOT hold' in markdown
  assert 'WARNING' in report_render.summary(result)


def test_compliant_log_has_no_warning():
  log = log_lib.ParticipationLog.from_arrays(['a', 'b', 'a'], [0, 1, 6])
  result = _report(gaussian.GaussianStrategy(), 10, Schema(5, 2), noise_multiplier=1.0,
                               log=log)
  assert result.warnings == () and result.observed.violations == ()


def test_tree_observed_patterns_match_dense_matrix():
  rng = np.random.default_rng(0)
  n = 23
  ids = rng.integers(0, 12, size=60).astype(str)
  rounds = rng.integers(0, n, size=60)
  keep = np.unique(np.stack([ids.astype(int), rounds]), axis=1, return_index=True)[1]
  ids, rounds = ids[keep], rounds[keep]
  log = log_lib.ParticipationLog.from_arrays(ids, rounds)
  strategy = tree.TreeStrategy('vanilla')
  result = _report(strategy, n, None, noise_multiplier=6.0, log=log,
                               restart_rounds=[9])
  # Independent: dense block-diagonal C of two trees (9 and 14 rounds), ||C u||^2 per client.
  dense = np.zeros((0, n))
  for start, length in ((0, 9), (9, 14)):
    block = np.zeros((strategy.num_nodes(length), n))
    block[:, start:start + length] = strategy.strategy_matrix(length)
    dense = np.vstack([dense, block])
  best = 0.0
  for client in np.unique(ids):
    u = np.zeros(n)
    u[rounds[ids == client]] = 1.0
    best = max(best, float(np.sum((dense @ u)**2)))
  patterns = result.observed.tree_patterns
  assert patterns['sensitivity_squared'] == best
  assert patterns['rho'] == pytest.approx(best / (2 * 6.0**2))
  assert patterns['sensitivity_squared'] <= result.guarantee.sensitivity_squared


def test_calibration_through_the_report():
  result = _report(tree.TreeStrategy(), 2000, Schema(314, 6), target_rho=0.5)
  assert result.guarantee.rho == pytest.approx(0.5, rel=1e-12)
  assert result.guarantee.noise_multiplier == pytest.approx(np.sqrt(79 / 1.0), rel=1e-12)
  assert result.calibration == {'target_rho': 0.5}


def test_adaptive_clipping_value_noise_multiplier():
  result = _report(tree.TreeStrategy(), 1900, Schema(527, 3), noise_multiplier=7.0,
                               clipped_count_stddev=325.0, restart_rounds=[128, 1152])
  assert result.value_noise_multiplier == pytest.approx(7.000405952470763, rel=1e-14)
  assert result.value_noise_multiplier == settings.inflated_noise_multiplier(7.0, 325.0)
  assert 'z_Delta' in report_render.to_markdown(result)


def test_markdown_has_the_app_c_checklist():
  text = report_render.to_markdown(_report(gaussian.GaussianStrategy(), 10, Schema(2, 2),
                                                      noise_multiplier=1.0))
  for heading in ('DP setting', 'Data accesses covered', 'Final mechanism output',
                  'Unit of privacy', 'Adjacency', 'Accounting', 'Participation', 'min_separation',
                  'Formal statement'):
    assert heading in text


def test_write_report_files(tmp_path):
  strategy = tree.TreeStrategy('efficient')
  result = _report(strategy, 64, Schema(8, 4), noise_multiplier=3.0)
  paths = report_render.write_report(result, str(tmp_path), plots=True)
  assert sorted(p.split('/')[-1] for p in paths) == sorted(
      ['report.json', 'report.md', *report_render.PLOT_FILES])
  for name in report_render.PLOT_FILES:
    assert (tmp_path / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert json.loads((tmp_path / 'report.json').read_text())['rho'] == result.guarantee.rho


def _gaussian_plan(noise_multiplier, participation=Schema(2, 2), **kwargs):
  return plan.RunPlan.for_accounting(gaussian.GaussianStrategy(), noise_multiplier, num_rounds=10,
                                     participation=participation, **kwargs)


@pytest.mark.parametrize('make, match', [
    (lambda: calibration.calibrate_plan(_gaussian_plan(1.0), target_epsilon=1.0, target_rho=1.0),
     'Exactly one'),
    (lambda: calibration.calibrate_plan(_gaussian_plan(0.0)), 'Exactly one'),
    (lambda: calibration.calibrate_plan(_gaussian_plan(1.0), target_rho=1.0,
                                        sensitivity_squared=0.0), 'sensitivity_squared'),
    (lambda: calibration.calibrate_plan(_gaussian_plan(1.0), target_rho=1.0,
                                        sensitivity_squared='2'), 'sensitivity_squared'),
    (lambda: report.build_report(_gaussian_plan(1.0, participation=None)), 'participation'),
    (lambda: _gaussian_plan(-1.0), 'noise_multiplier'),
    (lambda: _gaussian_plan(1.0, clipped_count_stddev=0.4), 'noise_multiplier'),
])
def test_build_report_rejects_bad_input(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_banded_with_more_bands_than_min_sep_is_flagged_as_upper_bound():
  c = np.tril(np.ones((12, 12))) - np.tril(np.ones((12, 12)), -4)  # 4 bands
  strategy = banded.BandedStrategy(c)
  loose = _report(strategy, 12, Schema(2, 3), noise_multiplier=2.0)
  tight = _report(strategy, 12, Schema(4, 3), noise_multiplier=2.0)
  assert not loose.sensitivity_exact and any('upper bound' in w for w in loose.warnings)
  assert tight.sensitivity_exact and tight.warnings == ()
  # Alg. 5 with bands <= min_sep: 3 disjoint column groups of squared norm 4 (first columns).
  assert tight.guarantee.sensitivity_squared == 12.0


def test_blt_with_non_monotone_coefficients_is_reported_as_upper_bound(tmp_path):
  # Both BLTs have an inverse with a negative decay; only the first has non-increasing c (Thm. 3.1).
  monotone = blt.BLTStrategy(theta=(0.9, 0.5, 0.001), omega=(0.1, 0.2, 0.5))  # c = (1, 0.8, 0.19, ...)
  non_monotone = blt.BLTStrategy(theta=(0.9, 0.3), omega=(0.6, 0.7))  # c = (1, 1.3, 0.75, ...)
  for strategy in (monotone, non_monotone):
    assert strategy.inverse()[0][-1] < 0
  tight = _report(monotone, 12, Schema(3, 3), noise_multiplier=2.0)
  loose = _report(non_monotone, 12, Schema(3, 3), noise_multiplier=2.0)
  assert tight.sensitivity_exact and tight.warnings == ()
  assert not loose.sensitivity_exact and any('upper bound' in w for w in loose.warnings)
  assert 'sens^2 = ' in report_render.to_markdown(tight)
  assert ', exact: max over admissible patterns' in report_render.to_markdown(tight)
  assert ', an upper bound: max over admissible patterns' in report_render.to_markdown(loose)
  assert '(upper bound)' in report_render.summary(loose)
  report_render.write_report(loose, str(tmp_path), plots=False)
  assert json.loads((tmp_path / 'report.json').read_text())['sensitivity_exact'] is False
  assert 'an upper bound' in (tmp_path / 'report.md').read_text()
  assert json.loads(report_render.to_json(tight))['sensitivity_exact'] is True


def test_secure_aggregation_segments_and_wraps_are_reported():
  secure_settings = settings.SecureAggregation(bits=16, rotation='dft', beta=0.0, modclip_prob=1e-4)
  secure = {'segments': [{'segment': 0, 'clip': 1.0, 'sensitivity_clip': 1.002},
                         {'segment': 1, 'clip': 10.0, 'sensitivity_clip': 10.02}],
            'wrap_rounds': []}

  def secure_report(segments):
    run_plan = plan.RunPlan.for_accounting(gaussian.GaussianStrategy(), 2.0, secure=secure_settings,
                                           num_rounds=100, participation=Schema(30, 2))
    return report.build_report(run_plan, secure_segments=segments)

  plain = _report(gaussian.GaussianStrategy(), 100, Schema(30, 2), noise_multiplier=2.0)
  clean = secure_report(secure)
  # The noise is proportional to the post-rounding bound: the guarantee is the plain one.
  assert clean.guarantee.epsilon == plain.guarantee.epsilon and clean.warnings == ()
  assert json.loads(report_render.to_json(clean))['secure_aggregation']['segments'][1]['clip'] == 10.0
  assert '1.002 x the clip' in report_render.to_markdown(clean)
  wrapped = secure_report(dict(secure, wrap_rounds=[7, 3]))
  assert any('rounds [3, 7]' in w for w in wrapped.warnings)
  assert 'WARNING' in report_render.summary(wrapped)
  bad = dict(secure, segments=[{'segment': 0, 'clip': 1.0, 'sensitivity_clip': 0.5}])
  with pytest.raises(ValueError, match='sensitivity_clip'):
    secure_report(bad)
  with pytest.raises(ValueError, match='secure_segments'):
    secure_report({'bits': 16})


def _run_plan(**kwargs):
  """A training plan (clip, clients per round) of 10 rounds declared 5-min-sep with k = 2."""
  args = dict(num_rounds=10, participation=Schema(5, 2))
  args.update(kwargs)
  return plan.RunPlan.build(gaussian.GaussianStrategy(), 1.0, args.pop('clients_per_round', 10),
                            args.pop('clip_norm', 1.0), **args)


def test_fixed_noise_seed_is_flagged_testing_only():
  fixed = report.build_report(_run_plan(noise_seed_fixed=True, population=100))
  assert fixed.run_facts.noise_seed_fixed is True
  assert report_sections.FIXED_SEED_WARNING in fixed.warnings
  out = report_render.to_dict(fixed)
  assert any('TESTING ONLY' in w and '--noise_seed' in w for w in [f['text'] for f in out['findings'] if f['severity'] == 'warning'])
  markdown = report_render.to_markdown(fixed)
  assert '**WARNING**' in markdown and 'Noise seed: **FIXED (--noise_seed): testing only.**' in markdown
  assert 'the statement does not hold for it' in markdown.split('## 1.')[0]
  secret = report.build_report(_run_plan(noise_seed_fixed=False, population=100))
  assert secret.warnings == () and secret.run_facts.noise_seed_fixed is False
  assert 'Noise seed: drawn from OS entropy' in report_render.to_markdown(secret)
  unknown = report.build_report(_run_plan())  # a plan of an earlier release
  assert unknown.run_facts.noise_seed_fixed is None and 'Noise seed' not in report_render.to_markdown(
      unknown)


def test_fixed_clip_and_min_sep_cohorts_are_stated():
  result = report.build_report(_run_plan(clip_norm=0.5, population=1000, noise_seed_fixed=False))
  assert result.run_facts == report_sections.RunFacts(
      noise_seed_fixed=False, clip='fixed', clip_norm=0.5, sampler='min_sep',
      clients_per_round=10.0, population=1000, cohort_fraction=0.01)
  assert json.loads(report_render.to_json(result))['run_facts'] == {
      'noise_seed_fixed': False, 'clip': 'fixed', 'clip_norm': 0.5,
      'target_unclipped_quantile': None, 'final_clip': None, 'sampler': 'min_sep',
      'clients_per_round': 10.0, 'population': 1000, 'sampling_prob': None,
      'sampling_groups': None, 'cohort_fraction': 0.01}
  markdown = report_render.to_markdown(result)
  assert '- Clip: fixed, L2 norm 0.5 per client update.' in markdown
  assert ('- Cohorts: min-sep sampler: exactly 10 clients per round from a population of 1000 '
          'clients, 0.01 of the population per round') in markdown
  with pytest.raises(ValueError, match='final_clip'):
    report.build_report(_run_plan(), final_clip=0.3)


def test_adaptive_clip_states_its_quantile_and_final_clip():
  adaptive = settings.AdaptiveClipping(target_unclipped_quantile=0.7, clipped_count_stddev=2.0)
  run_plan = _run_plan(clients_per_round=50, clip_norm=0.2, adaptive_clip=adaptive)
  recorded = report.build_report(run_plan, final_clip=0.123456789)
  facts = recorded.run_facts
  assert (facts.clip, facts.clip_norm, facts.target_unclipped_quantile, facts.final_clip) == (
      'adaptive', 0.2, 0.7, 0.123456789)
  assert ('- Clip: adaptive (quantile clipping), target unclipped quantile 0.7, initial clip 0.2, '
          'final clip 0.123457 in the last round.') in report_render.to_markdown(recorded)
  unrecorded = report.build_report(run_plan)
  assert unrecorded.run_facts.final_clip is None
  assert 'final clip not recorded' in report_render.to_markdown(unrecorded)
  out = json.loads(report_render.to_json(recorded))  # report.json states the run
  assert out['run_facts'] == dataclasses.asdict(facts)
  assert (out['run_facts']['clip'], out['run_facts']['target_unclipped_quantile'],
          out['run_facts']['final_clip']) == ('adaptive', 0.7, 0.123456789)
  assert json.loads(report_render.to_json(unrecorded))['run_facts']['final_clip'] is None
  with pytest.raises(ValueError, match='final_clip'):
    report.build_report(run_plan, final_clip=-1.0)


@pytest.mark.parametrize('kind, groups, fragment', [
    ('poisson', 1, 'poisson sampler: each client of a population of 400 clients joins a round it '
     'is eligible for with sampling probability q = 0.05, expected 20 clients per round'),
    ('cyclic_poisson', 2, 'cyclic_poisson sampler: each client of a population of 400 clients in 2 '
     'fixed groups (round t samples group t mod 2) joins a round it is eligible for with sampling '
     'probability q = 0.05, expected 10 clients per round')])
def test_random_sampling_cohorts_are_stated(kind, groups, fragment):
  sampling = sampling_lib.Sampling(kind, 0.05, groups, population=400)
  run_plan = plan.RunPlan.build(gaussian.GaussianStrategy(), 1.0, None, 1.0, sampling=sampling,
                                num_rounds=4, participation=Schema(groups))
  facts = report.build_report(run_plan).run_facts
  assert (facts.sampler, facts.sampling_prob, facts.sampling_groups, facts.population) == (
      kind, 0.05, groups, 400)
  assert facts.clients_per_round == pytest.approx(0.05 * 400 / groups)
  assert facts.cohort_fraction == pytest.approx(0.05 / groups)
  assert fragment in report_render.to_markdown(report.build_report(run_plan))


def test_accounting_only_plan_states_no_clip_or_sampler():
  result = _report(gaussian.GaussianStrategy(), 10, Schema(2, 2), noise_multiplier=1.0)
  assert result.run_facts == report_sections.RunFacts()
  assert set(report_render.to_dict(result)['run_facts'].values()) == {None}


def test_no_client_participated_twice_is_said_not_a_small_min_sep():
  """Three rounds of distinct clients in a run declared 5-min-sep: the realized schema is single
  participation (written min_sep = 3), which must not read as a violation of min_sep 5."""
  log = log_lib.ParticipationLog.from_arrays(['a', 'b', 'c', 'd'], [0, 1, 1, 2])
  result = report.build_report(_run_plan(clients_per_round=1), log)
  assert result.no_client_participated_twice and result.warnings == ()
  observed = report_render.to_dict(result)['observed']
  assert observed['min_sep'] is None and observed['participated_twice'] is False
  markdown = report_render.to_markdown(result)
  assert 'no client participated twice yet' in markdown
  assert 'min_sep b = 3' not in markdown and 'realized min_sep = None' not in markdown
  summary = report_render.summary(result)
  assert 'no client participated twice yet' in summary.splitlines()[0]
  assert 'min_sep=' not in summary and 'min_separation=' not in summary
  repeated = report.build_report(_run_plan(clients_per_round=1), log_lib.ParticipationLog.from_arrays(
      ['a', 'b', 'c', 'd', 'e', 'f', 'a'], [0, 1, 2, 3, 4, 5, 6]))
  assert not repeated.no_client_participated_twice
  assert report_render.to_dict(repeated)['observed']['participated_twice'] is True
  markdown = report_render.to_markdown(repeated)
  assert 'min_sep b = 6' in markdown and 'realized min_sep = 6' in markdown
  assert 'no client participated twice' not in markdown
  summary = report_render.summary(repeated)
  assert 'min_sep=6 (min_separation=5)' in summary and 'participated twice' not in summary


def test_an_epsilon_beyond_the_pld_is_the_flagged_zcdp_bound(tmp_path):
  """noise_multiplier 0.05 over 6 rounds of a tree with a client in every round (rho 6800, PLD
  distribution of 22 GB): the report is written with the zCDP bound, flagged as an upper bound in
  report.json, report.md, the summary line, the declared guarantee, the observed tree patterns and
  the equal-privacy table, and warned about."""
  run_plan = plan.RunPlan.for_accounting(tree.TreeStrategy('vanilla'), 0.05, num_rounds=6,
                                         participation=Schema(1, 6))
  log = log_lib.ParticipationLog.from_arrays(['a'] * 6, list(range(6)))
  result = report.build_report(run_plan, log, equal_privacy=True)
  g = result.guarantee
  assert g.rho == pytest.approx(34 / (2 * 0.05**2)) and g.epsilon_is_zcdp_bound
  assert g.epsilon == zcdp_epsilon.zcdp_epsilon_bound(g.rho) >= zcdp_epsilon.epsilon_from_rho(
      g.rho, g.delta, 'gaussian')
  report_render.write_report(result, str(tmp_path), plots=False)  # plots: report_render_test
  out = json.loads((tmp_path / 'report.json').read_text())
  assert (out['epsilon'], out['conversion'], out['epsilon_is_zcdp_bound']) == (
      g.epsilon, 'zcdp_bound', True)
  assert out['declared']['epsilon_is_zcdp_bound'] and out['observed']['tree_patterns'][
      'conversion'] == 'zcdp_bound'
  (warning,) = [f for f in out['findings'] if f['severity'] == 'warning']
  assert warning['section'] == 'guarantee'
  assert warning['text'].startswith(f'epsilon {g.epsilon:.6g} is an UPPER BOUND from rho-zCDP')
  assert 'rho-zCDP 6800 is above the 100 whose privacy loss distribution' in warning['text']
  markdown = (tmp_path / 'report.md').read_text()
  assert 'This epsilon is an UPPER BOUND from rho-zCDP' in markdown
  assert f'epsilon <= {g.epsilon:.10g} at delta = 1e-10. The PLD is not used' in markdown
  assert f'(epsilon <= {g.epsilon:.6g} (an upper bound from rho-zCDP) at delta' in markdown
  assert result.equal_privacy.rho == g.rho and result.equal_privacy.rows  # the table at rho 6800
  summary = report_render.summary(result)
  assert (f'rho-zCDP=6800, (epsilon, delta)=(<= {g.epsilon:.6g}, 1e-10): an UPPER BOUND from '
          'rho-zCDP') in summary
  below = report.build_report(dataclasses.replace(run_plan, noise_multiplier=1.0))
  assert not below.guarantee.epsilon_is_zcdp_bound and below.warnings == ()
  assert report_render.to_dict(below)['epsilon_is_zcdp_bound'] is False


def test_sampling_below_the_amplified_accountant_range_keeps_the_unamplified_bound():
  """Poisson sampling at noise 0.05: no amplified figure (its PLD would not fit), a warning, and
  the unamplified headline (the flagged zCDP bound) holds whatever the sampling."""
  sampling = sampling_lib.Sampling('poisson', 0.1, 1, population=100)
  run_plan = plan.RunPlan.build(gaussian.GaussianStrategy(), 0.05, None, 1.0, sampling=sampling,
                                num_rounds=6, participation=Schema(1))
  result = report.build_report(run_plan)
  assert result.amplified is None and result.guarantee.epsilon_is_zcdp_bound
  (warning,) = [f.text for f in result.findings_of('amplification')]
  assert 'is below' in warning and 'The unamplified guarantee above holds' in warning


def test_a_noise_sweep_from_0_01_to_10_accounts_every_point():
  """A sweep's points, at the accounting level (what each point's driver computes before and after
  training: the planned guarantee of its header, the report): every
  noise multiplier from 0.01 to 10 is accounted, none refused; epsilon falls as the noise rises,
  across the switch from the zCDP bound (rho above 100, flagged) to the PLD."""
  sigmas = np.geomspace(0.01, 10.0, 10)
  epsilons, flags = [], []
  for sigma in sigmas:
    run_plan = plan.RunPlan.for_accounting(tree.TreeStrategy('vanilla'), float(sigma),
                                           num_rounds=6, participation=Schema(1, 6))
    result = report.build_report(run_plan)
    g = result.guarantee
    assert g.epsilon_is_zcdp_bound == (g.rho > zcdp_epsilon.MAX_RHO)
    assert report_render.to_dict(result)['epsilon_is_zcdp_bound'] == g.epsilon_is_zcdp_bound
    header = zcdp.planned_guarantee(run_plan, conversion='gaussian')  # the drivers' header
    assert header.epsilon_is_zcdp_bound == g.epsilon_is_zcdp_bound
    assert header.epsilon == pytest.approx(g.epsilon, rel=1e-4)
    epsilons.append(g.epsilon)
    flags.append(g.epsilon_is_zcdp_bound)
  assert flags == [True] * 5 + [False] * 5  # rho 170000 .. 367, then 79 .. 0.17
  assert all(a > b for a, b in zip(epsilons, epsilons[1:], strict=False))
