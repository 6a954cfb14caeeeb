"""The amplified guarantee in the privacy report: `build_report(sampling_prob=, sampling_groups=)`
against dp_accounting, and `python -m experiments.privacy_report --sampling_prob --sampling_groups`
or a `--plan` with random sampling (run as subprocesses)."""

import json

import dp_accounting
import numpy as np
import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.accounting import report, report_render
from dp_ftrl_tff.mechanisms import banded, files, gaussian, participation
from tests.testing import binaries

pytestmark = pytest.mark.e2e



def _run(*args):
  return binaries.run_process(binaries.REPORT, args)


def _banded(n=24, bands=3):
  rng = np.random.default_rng(0)
  lags = np.subtract.outer(np.arange(n), np.arange(n))
  return banded.BandedStrategy(np.where((lags >= 0) & (lags < bands),
                                        rng.uniform(0.2, 1.0, (n, n)), 0.0))


def _direct_epsilon(sigma, q, count, delta):
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                     count)
  return accountant.get_epsilon(delta)


def _report(strategy, schema, sampling=sampling_lib.Sampling(), **kwargs):
  run_plan = plan_lib.RunPlan.for_accounting(strategy, 3.0, sampling=sampling, num_rounds=24,
                                             participation=schema, target_delta=1e-6)
  return report.build_report(run_plan, **kwargs)


@pytest.mark.unit
def test_build_report_adds_the_amplified_guarantee_next_to_the_headline():
  strategy = _banded()
  schema = participation.ParticipationSchema(min_sep=4)
  plain = _report(strategy, schema)
  sampled = _report(strategy, schema, sampling_lib.Sampling('cyclic_poisson', 0.2, 4))
  assert plain.amplified is None
  assert sampled.guarantee == plain.guarantee  # the headline holds whatever the sampling
  kappa = np.linalg.norm(strategy.strategy_matrix(24), axis=0).max()
  a = sampled.amplified
  assert (a.num_groups, a.compositions, a.sampling_prob) == (4, 6, 0.2)
  assert a.epsilon == pytest.approx(_direct_epsilon(3.0 / kappa, 0.2, 6, 1e-6), rel=1e-9)
  assert a.epsilon < plain.guarantee.epsilon
  rendered = report_render.to_dict(sampled)['amplified']
  assert rendered['epsilon'] == a.epsilon and rendered['num_groups'] == 4
  assert 'amplified' in report_render.summary(sampled)
  assert 'BandMF paper Thm. 4' in report_render.to_markdown(sampled)


@pytest.mark.unit
def test_build_report_refuses_more_bands_than_groups_and_groups_without_probability():
  schema = participation.ParticipationSchema(min_sep=2)
  with pytest.raises(ValueError, match='3 bands but `num_groups`=2'):
    _report(_banded(), schema, sampling_lib.Sampling('cyclic_poisson', 0.2, 2),
            require_amplification=True)
  with pytest.raises(ValueError, match='sampling_prob'):
    sampling_lib.Sampling('cyclic_poisson', None, 2)


def test_flags(tmp_path):
  path = str(tmp_path / 'banded.npz')
  files.save_strategy(_banded(), path)
  proc = _run(f'--mechanism_file={path}', '--noise_multiplier=3', '--rounds=24', '--min_sep=4',
              '--sampling_prob=0.2', '--sampling_groups=4', '--target_delta=1e-6', '--json')
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)
  assert out['amplified']['compositions'] == 6
  assert out['amplified']['epsilon'] < out['epsilon']
  proc = _run(f'--mechanism_file={path}', '--noise_multiplier=3', '--rounds=24', '--min_sep=4',
              '--sampling_prob=0.2', '--sampling_groups=2')
  assert proc.returncode == 2
  assert proc.stderr.count('\n') == 1 and 'at most as many bands as sampling groups' in proc.stderr
  proc = _run('--mechanism=gaussian', '--noise_multiplier=3', '--rounds=24', '--min_sep=1',
              '--sampling_prob=1.5')
  assert proc.returncode == 2 and proc.stderr.startswith('privacy_report.py: error: --sampling_prob')


def test_plan_with_sampling(tmp_path):
  sampling = sampling_lib.Sampling(kind='poisson', sampling_prob=0.05, num_groups=1,
                                   population=2000)
  run_plan = plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.5, None, 1.0, sampling=sampling)
  path = str(tmp_path / 'plan.json')
  plan_lib.save_plan(run_plan, path)
  proc = _run(f'--plan={path}', '--rounds=30', '--min_sep=1', '--target_delta=1e-6', '--json')
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)['amplified']
  assert (out['num_groups'], out['sampling_prob'], out['compositions']) == (1, 0.05, 30)
  assert out['epsilon'] == pytest.approx(_direct_epsilon(1.5, 0.05, 30, 1e-6), rel=1e-9)
  proc = _run(f'--plan={path}', '--rounds=30', '--min_sep=1', '--sampling_prob=0.1')
  assert proc.returncode == 2 and 'excludes --sampling_prob' in proc.stderr


def test_plan_whose_strategy_the_theorem_does_not_cover_keeps_the_unamplified_report(tmp_path):
  sampling = sampling_lib.Sampling(kind='poisson', sampling_prob=0.05, num_groups=1,
                                   population=2000)
  run_plan = plan_lib.RunPlan.build(_banded(), 3.0, None, 1.0, sampling=sampling)
  path = str(tmp_path / 'plan.json')
  plan_lib.save_plan(run_plan, path)
  # Poisson sampling enforces no separation: the declared schema is min_sep 1 (a declared min_sep 4
  # is refused, as the headline would understate epsilon).
  refused = _run(f'--plan={path}', '--rounds=24', '--min_sep=4', '--json')
  assert refused.returncode == 2 and 'min_sep' in refused.stderr
  proc = _run(f'--plan={path}', '--rounds=24', '--min_sep=1', '--json')
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)
  assert out['amplified'] is None
  assert any('no amplified guarantee' in w and '3 bands' in w for w in [f['text'] for f in out['findings'] if f['severity'] == 'warning'])
