"""On a model and data of one's own (tests/testing/own_program.py: an MLP over a SQLite file in
TFF's `SqlClientData` format, written by TFF's own writer), the public `train`, one's own
`tff.learning.programs.train_model` call with the run's public parts (`training_loop.run_program`)
and a plain loop over `process.next` give the same participation log (bytes), final weights and
guarantee, canaries and a restart included; `train` and the own train_model call, SIGKILLed after
a checkpoint and rerun, end with the uninterrupted run's files (metrics.csv, the participation log,
the checkpoint, the report); both refuse a resume under any plan-changing setting."""

import dataclasses
import json
import os
import shutil
import signal

import pytest

from tests.testing import binaries, own_program, run_files

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODULE = 'tests.testing.own_program'
ROUNDS = own_program.ROUNDS


def _program(root, name, mode):
  return binaries.RunningBinary(MODULE, root, name, [f'--mode={mode}'], timeout=600)


def _report(run):
  with open(os.path.join(run, 'privacy_report', 'report.json')) as f:
    report = json.load(f)
  return report['rho'], report['epsilon']


def assert_same_run(run, expected):
  run_files.assert_same_run(run, expected, ROUNDS, logs=('participation.csv', 'canaries.csv'))
  rows = run_files.metrics_rows(run)
  assert [bool(row['eval_loss']) for row in rows] == [False, True, False, True, True]
  assert _report(run) == _report(expected)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  root = tmp_path_factory.mktemp('reference')
  program = _program(root, 'run', 'train')
  assert program.wait() == 0, program.stderr()[-3000:]
  return program.dir


@pytest.mark.parametrize('mode, kill_after', [('own', 2), ('train', 3)])
def test_a_killed_run_reruns_to_the_uninterrupted_runs_files(tmp_path, reference, mode, kill_after):
  own = _program(tmp_path, 'straight', mode)
  assert own.wait() == 0, own.stderr()[-3000:]
  assert_same_run(own.dir, reference)
  assert b'canary-' in run_files.read_bytes(os.path.join(own.dir, 'participation.csv'))

  killed = _program(tmp_path, 'killed', mode)
  killed.wait_for(lambda: killed.checkpoint_exists(kill_after), f'checkpoint {kill_after}')
  killed.proc.kill()
  assert killed.wait() == -signal.SIGKILL  # killed mid-run, not after it ended
  rerun = _program(tmp_path, 'killed', mode)
  assert rerun.wait() == 0, rerun.stderr()[-3000:]
  assert 'Resuming' in rerun.stderr() + rerun.stdout()
  assert_same_run(rerun.dir, reference)


#: A plan-changing setting -> its value in the resumed command.
PLAN_CHANGES = {
    'noise_multiplier': 1.5, 'clip_norm': 2.0, 'mechanism': 'gaussian',
    'mechanism_options': {'num_buffers': 2}, 'min_sep': 3, 'max_participations': 1,
    'clients_per_round': 4, 'restart_rounds': (2,), 'adaptive_clipping': True, 'seed': 2,
    'sampler': 'poisson',
}


@pytest.mark.integration
def test_a_resume_under_another_plan_is_refused_in_train_and_in_ones_own_train_model(
    tmp_path, reference):
  from dp_ftrl_tff import training  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff.training import run_start, training_loop  # pylint: disable=g-import-not-at-top
  task, config = own_program.task_and_config(os.path.dirname(reference))
  run = str(tmp_path / 'run')
  shutil.copytree(reference, run)
  metrics = run_files.read_bytes(os.path.join(run, 'metrics.csv'))

  def own_train_model(task, config, output_dir):
    with training_loop.run_program(task, config, output_dir):
      raise AssertionError('the start passed')

  for name, value in PLAN_CHANGES.items():
    changes = {name: value, 'rounds': ROUNDS + 2}
    if name == 'mechanism':  # the BLT's option is not gaussian's
      changes.update(mechanism_options={})
    if name == 'sampler':
      changes.update(clients_per_round=None, sampling_prob=0.1, min_sep=1)
    resumed = dataclasses.replace(config, **changes)
    for path in (training.train, own_train_model):
      with pytest.raises(run_start.SetupError, match=rf'other settings \(.*{name}: '):
        path(task, resumed, run)
      assert run_files.read_bytes(os.path.join(run, 'metrics.csv')) == metrics  # no round ran


@pytest.mark.integration
def test_a_plain_loop_over_the_plan_gives_trains_log_weights_and_guarantee(tmp_path, reference):
  import numpy as np  # pylint: disable=g-import-not-at-top

  from dp_ftrl_tff.accounting import report_files  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff.programs import client_ids, data_source  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff.training import run_dir, run_start  # pylint: disable=g-import-not-at-top
  task, config = own_program.task_and_config(os.path.dirname(reference))
  directory = run_dir.RunDirectory(str(tmp_path / 'loop'))
  start = run_start.start_run(task, config, directory)
  directory.release()
  process = client_ids.process_over_client_ids(
      start.process, task.train_data.preprocess(task.client_preprocess_fn), start.canary_ids)
  log = str(tmp_path / 'participation.csv')
  cohorts = data_source.SampledClientDataSource(start.client_ids, start.plan, log,
                                                config.seed).iterator()
  state = process.initialize()
  for _ in range(ROUNDS):
    state = process.next(state, cohorts.select(config.clients_per_round)).state
  assert run_files.read_bytes(log) == run_files.read_bytes(
      os.path.join(reference, 'participation.csv'))
  # The final weights are leaves of train's last checkpoint, in order and bit for bit.
  leaves = iter(leaf for leaf in run_files.checkpoint_leaves(reference, ROUNDS)
                if isinstance(leaf, np.ndarray))
  for weight in process.get_model_weights(state).trainable:
    assert any(leaf.shape == weight.shape and np.array_equal(leaf, weight) for leaf in leaves)
  guarantee = report_files.report_from_run_files(start.plan, log, trained_rounds=ROUNDS).guarantee
  assert (guarantee.rho, guarantee.epsilon) == _report(reference)
