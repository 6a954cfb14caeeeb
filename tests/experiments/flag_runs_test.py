"""Flags of the drivers that no other test runs (docs/TESTING.md's flag table): one EMNIST run
through those flags, `--force_report` on its finished directory, and `--debug` of each driver."""

import json
import os

import pytest

from experiments.emnist import run_emnist
from experiments.run import driver
from tests.testing import binaries

pytestmark = pytest.mark.integration

#: The run: Gaussian noise with periodic restarts (the clip restarts; the momentum only
#: with a correlated mechanism: tests/experiments/drivers_test.py), cyclic Poisson cohorts,
#: adaptive clipping, a calibrated noise multiplier and the optimizer's settings; seed 1 draws
#: someone in the last round.
FLAGS = (
    '--model=tiny', '--only_digits', '--data=synthetic', '--rounds=3', '--client_batch_size=8',
    '--synthetic_num_clients=30', '--synthetic_examples_per_client=8', '--noise_seed=3', '--seed=1',
    '--eval_max_examples=16', '--mechanism=gaussian', '--restart_warmup=1', '--restart_period=2',
    '--sampler=cyclic_poisson', '--sampling_prob=0.3', '--sampling_groups=2', '--adaptive_clipping',
    '--target_unclipped_quantile=0.7', '--clip_learning_rate=0.1', '--clipped_count_stddev=5',
    '--clip_norm=0.5', '--target_epsilon=3', '--target_delta=1e-6', '--client_learning_rate=0.05',
    '--client_epochs=2', '--server_learning_rate=0.5', '--server_momentum=0.5',
    '--banded_beyond_max_rounds=error')


def _run(root, *extra):
  fv = run_emnist.FLAGS
  try:
    fv(['run_emnist', f'--root_output_dir={root}', *FLAGS, *extra])
    return driver.run_from_flags(fv, run_emnist.build_task, run_emnist.task_settings)
  finally:
    fv.unparse_flags()


def test_a_run_trains_with_these_flags_and_force_report_rewrites_its_report(tmp_path):
  _run(tmp_path)
  run = tmp_path / 'run'
  hparams = json.loads((run / 'hparams.json').read_text())
  assert (hparams['sampler'], hparams['sampling_groups'], hparams['min_sep']) == (
      'cyclic_poisson', 2, 2)
  assert (hparams['target_unclipped_quantile'], hparams['clip_learning_rate'],
          hparams['client_epochs'], hparams['server_momentum']) == (0.7, 0.1, 2, 0.5)
  plan = json.loads((run / 'plan.json').read_text())
  assert plan['restarts'] == {'warmup': 1, 'period': 2}
  assert plan['calibration'] == {'target_epsilon': 3.0}
  report_path = run / 'privacy_report' / 'report.json'
  report = json.loads(report_path.read_text())
  assert report['restart_rounds'] == [1] and report['delta'] == 1e-6
  assert report['declared']['epsilon'] == pytest.approx(3.0, rel=1e-3)  # calibrated to it
  # A finished run: the same command writes nothing; with --force_report it rewrites its report.
  report_path.unlink()
  assert _run(tmp_path) == {}
  assert not report_path.exists()
  _run(tmp_path, '--force_report')
  assert json.loads(report_path.read_text()) == report


@pytest.mark.unit
@pytest.mark.parametrize('module', list(binaries.DRIVERS))
def test_debug_prints_the_traceback_before_the_one_line_error(module, tmp_path):
  code, _, stderr = binaries.run_in_process(
      module, [f'--root_output_dir={tmp_path}', '--sampler=poisson', '--debug'])
  assert code == 2
  assert 'Traceback' in stderr
  assert stderr.strip().splitlines()[-1].endswith(
      'error: --sampler=poisson needs --sampling_prob (q in [2^-52, 1]).'), stderr
  assert not os.listdir(tmp_path)

