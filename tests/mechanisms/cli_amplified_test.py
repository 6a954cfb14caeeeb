"""Tests for the mechanisms CLI's amplified commands (`amplified`, `select_bands`), in process."""

import json

import dp_accounting
import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import banded, files
from experiments import mechanisms_cli as cli

pytestmark = pytest.mark.unit


def _main(capsys, *args):
  status = cli.main(['mechanisms', *args])
  out = capsys.readouterr()
  return status, out.out, out.err


def _json(capsys, *args):
  status, out, err = _main(capsys, *args, '--json')
  assert status == 0, err
  return json.loads(out)


def _direct_epsilon(sigma, q, count, delta):
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                     count)
  return accountant.get_epsilon(delta)


def test_amplified_epsilon_from_dataset_and_batch_size(capsys):
  out = _json(capsys, 'amplified', '--rounds=100', '--sampling_groups=8', '--dataset_size=10000',
              '--batch_size=100', '--noise_multiplier=1.5', '--target_delta=1e-6')
  assert out['sampling_prob'] == 100 / (10000 // 8)
  assert out['compositions'] == 13
  assert out['largest_column_norm'] == 1.0
  assert out['epsilon'] == pytest.approx(_direct_epsilon(1.5, out['sampling_prob'], 13, 1e-6),
                                         rel=1e-9)


def test_amplified_calibration_with_a_strategy_file(capsys, tmp_path):
  rng = np.random.default_rng(0)
  lags = np.subtract.outer(np.arange(30), np.arange(30))
  strategy = banded.BandedStrategy(np.where((lags >= 0) & (lags < 3),
                                            rng.uniform(0.2, 1.0, (30, 30)), 0.0))
  path = str(tmp_path / 'c.npz')
  files.save_strategy(strategy, path)
  out = _json(capsys, 'amplified', '--rounds=30', '--sampling_groups=3', '--sampling_prob=0.1',
              '--target_epsilon=2', '--target_delta=1e-6', f'--mechanism_file={path}')
  kappa = np.linalg.norm(strategy.strategy_matrix(30), axis=0).max()
  assert out['largest_column_norm'] == pytest.approx(kappa, rel=1e-12)
  assert out['effective_noise_multiplier'] == pytest.approx(out['noise_multiplier'] / kappa)
  assert _direct_epsilon(out['effective_noise_multiplier'], 0.1, 10, 1e-6) <= 2.0


def test_select_bands_saves_the_chosen_strategy(capsys, tmp_path):
  path = str(tmp_path / 'best.npz')
  out = _json(capsys, 'select_bands', '--rounds=24', '--dataset_size=600', '--batch_size=100',
              '--target_epsilon=8', '--target_delta=1e-6', f'--output={path}')
  assert 1 <= out['num_bands'] <= 6
  best = min(out['candidates'], key=lambda c: c['rmse'])
  assert best['num_bands'] == out['num_bands'] and best['rmse'] == out['rmse']
  saved = files.load_strategy(path)
  assert saved.name == 'banded' and saved.num_bands <= out['num_bands']
  status, text, _ = _main(capsys, 'select_bands', '--rounds=24', '--dataset_size=600',
                          '--batch_size=100', '--target_epsilon=8', '--target_delta=1e-6')
  assert status == 0 and 'candidates (rmse = noise_multiplier * loss):' in text


def test_select_bands_candidates(capsys):
  common = ('select_bands', '--rounds=24', '--dataset_size=600', '--batch_size=100',
            '--target_epsilon=4', '--target_delta=1e-6')
  pow2 = _json(capsys, *common, '--candidates=pow2')
  assert pow2['candidate_set'] == 'pow2 1, 2, 4'
  assert [c['num_bands'] for c in pow2['candidates']] == [1, 2, 4]
  given = _json(capsys, *common, '--candidates=5,3')
  assert given['candidate_set'] == 'given 3, 5'
  assert [c['num_bands'] for c in given['candidates']] == [3, 5]
  full = _json(capsys, *common)
  assert full['candidate_set'] == 'all 1 .. 6 (branch and bound)'
  assert _json(capsys, *common, '--candidates=all') == full
  status, text, _ = _main(capsys, *common, '--candidates=pow2')
  assert status == 0 and 'candidate_set     pow2 1, 2, 4' in text


@pytest.mark.parametrize('args, message', [
    (['select_bands', '--rounds=16', '--dataset_size=100', '--batch_size=10', '--target_epsilon=1',
      '--candidates=2,x'], '--candidates must be all, pow2 or a comma-separated list'),
    (['select_bands', '--rounds=16', '--dataset_size=100', '--batch_size=10', '--target_epsilon=1',
      '--candidates=11'], '--candidates must hold integers in 1 .. 10'),
    (['amplified', '--rounds=10', '--sampling_groups=2', '--sampling_prob=0.1', '--noise_multiplier=1',
      '--candidates=pow2'], '--candidates does not apply to `amplified`'),
    (['evaluate', '--rounds=16', '--min_sep=4', '--mechanism=gaussian', '--candidates=pow2'],
     '--candidates does not apply to `evaluate`'),
    (['amplified', '--rounds=10', '--sampling_prob=0.1', '--noise_multiplier=1'],
     '--sampling_groups is required'),
    (['amplified', '--rounds=10', '--sampling_groups=2', '--sampling_prob=0.1', '--dataset_size=100',
      '--noise_multiplier=1'], '--dataset_size does not apply'),
    (['amplified', '--rounds=10', '--sampling_groups=2', '--sampling_prob=0.1'],
     'exactly one of --noise_multiplier, --target_epsilon'),
    (['amplified', '--rounds=10', '--sampling_groups=2', '--sampling_prob=1.5', '--noise_multiplier=1'],
     '--sampling_prob must lie in (0, 1]'),
    (['amplified', '--rounds=10', '--sampling_groups=20', '--dataset_size=100', '--batch_size=10',
      '--noise_multiplier=1'], 'use at most floor(dataset_size / batch_size) = 10 groups'),
    (['amplified', '--rounds=16', '--sampling_groups=2', '--sampling_prob=0.1', '--noise_multiplier=1',
      '--mechanism=tree'], 'square banded C'),
    (['amplified', '--rounds=16', '--sampling_groups=2', '--sampling_prob=0.1', '--noise_multiplier=1',
      '--target_delta=0'], '--target_delta must lie in (0, 1)'),
    (['select_bands', '--rounds=16', '--dataset_size=100', '--batch_size=10', '--target_epsilon=1',
      '--output=x.json'], 'must end with .npz'),
    (['select_bands', '--rounds=16', '--dataset_size=100', '--batch_size=10'],
     '--target_epsilon is required'),
    (['select_bands', '--rounds=16', '--dataset_size=100', '--batch_size=10', '--target_epsilon=1',
      '--num_bands=3'], '--num_bands does not apply'),
    (['evaluate', '--rounds=16', '--min_sep=4', '--mechanism=gaussian', '--sampling_prob=0.1'],
     '--sampling_prob does not apply to `evaluate`'),
])
def test_usage_errors_are_one_line(capsys, args, message):
  status, out, err = _main(capsys, *args)
  assert status == cli.USAGE_EXIT_CODE and not out
  assert err.startswith('mechanisms: error: ') and err.count('\n') == 1
  assert message in err


def test_accountant_flag_selects_the_accountant(capsys):
  common = ('amplified', '--rounds=40', '--sampling_groups=4', '--sampling_prob=0.05',
            '--noise_multiplier=1.2', '--target_delta=1e-6')
  pld = _json(capsys, *common, '--accountant=pld')
  rdp = _json(capsys, *common, '--accountant=rdp')
  assert pld['epsilon'] == pytest.approx(_direct_epsilon(1.2, 0.05, 10, 1e-6), rel=1e-2)
  # RDP's conversion is an upper bound on the same guarantee.
  assert rdp['epsilon'] > pld['epsilon']
