"""End-to-end test of `python -m experiments.sweeps.run_sweep` on a 2-point grid of tiny EMNIST
synthetic runs: completion markers, skipping a finished point, resuming an interrupted one, bad input,
the TensorBoard HParams summaries and `experiments.sweeps.summarize` on the sweep's root."""

import csv
import glob
import os
import shutil
import subprocess
import sys

import pytest

from dp_ftrl_tff.training import run_summary

pytestmark = pytest.mark.e2e

TINY = ['--model=tiny', '--rounds=2', '--clients_per_round=3', '--client_batch_size=8',
        '--synthetic_num_clients=30', '--synthetic_examples_per_client=8', '--min_sep=2',
        '--mechanism=gaussian', '--checkpoint_every=1', '--eval_every=1', '--eval_max_examples=64',
        '--noise_seed=3']
GRID = '--grid=noise_multiplier=0.5,1.0'
NAMES = ('noise_multiplier=0.5', 'noise_multiplier=1.0')


def _sweep(root, *args, driver_args=TINY, driver='emnist'):
  return subprocess.run([sys.executable, '-m', 'experiments.sweeps.run_sweep', f'--driver={driver}',
                         f'--root_output_dir={root}', *args, '--', *driver_args],
                        capture_output=True, text=True, check=False, timeout=600,
                        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})  # TF's C++ log lines off


def _hparams_events(logdir):
  """{tag: plugin name} of the summaries in the event files of `logdir` (read with TF's reader)."""
  import tensorflow as tf
  tags = {}
  for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        tags[value.tag] = value.metadata.plugin_data.plugin_name
  return tags


def _session_hparams(logdir):
  """The hyperparameters of the HParams session written in `logdir`."""
  import tensorflow as tf
  from tensorboard.plugins.hparams import metadata
  for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == metadata.SESSION_START_INFO_TAG:
          content = metadata.parse_session_start_info_plugin_data(
              value.metadata.plugin_data.content)
          return {k: v.WhichOneof('kind') and getattr(v, v.WhichOneof('kind'))
                  for k, v in content.hparams.items()}
  return None


@pytest.mark.slow
def test_sweep_skips_finished_points_and_resumes_interrupted_ones(tmp_path):
  root = tmp_path / 'sweep'
  done = _sweep(root, GRID, '--parallel=2')
  assert done.returncode == 0, done.stdout + done.stderr
  for name in NAMES:
    summary = run_summary.read_summary(str(root / name))
    assert summary['rounds'] == 2 and summary['epsilon'] > 0
    assert summary['hparams']['noise_multiplier'] == float(name.split('=')[1])
  # Interrupt the second point after round 1: no marker, and its last checkpoint gone.
  second = root / NAMES[1]
  os.remove(second / run_summary.SUMMARY_FILE)
  shutil.rmtree(second / 'checkpoints' / 'program_state_2')
  done = _sweep(root, GRID)
  assert done.returncode == 0, done.stdout + done.stderr
  assert f'skipped {NAMES[0]}' in done.stdout
  assert f'resuming {NAMES[1]}' in done.stdout
  assert 'after round 1/2' in (second / 'sweep.log').read_text()  # the driver resumed, not restarted
  assert run_summary.is_complete(str(second))
  # TensorBoard's HParams tab: a session with the run's settings, and the final metrics.
  logdir = str(second / 'tensorboard')
  tags = _hparams_events(logdir)
  assert tags['_hparams_/session_start_info'] == 'hparams'
  assert {'final/eval_accuracy', 'final/epsilon', 'final/train_loss'} <= set(tags)
  hparams = _session_hparams(logdir)
  assert hparams['noise_multiplier'] == 1.0 and hparams['mechanism'] == 'gaussian'
  assert hparams['task/model'] == 'tiny'
  # A passed-through setting that differs from a finished run's: failed in one line, not skipped.
  done = _sweep(root, GRID, driver_args=[*TINY, '--clip_norm=2'])
  assert done.returncode == 1
  assert done.stdout.count('FAILED') == 2 and 'other settings' in done.stdout
  # The table of the sweep.
  done = subprocess.run([sys.executable, '-m', 'experiments.sweeps.summarize', str(root)],
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr
  with open(root / 'runs.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['run'] for r in rows] == list(NAMES)
  assert float(rows[0]['epsilon']) > float(rows[1]['epsilon'])  # more noise, smaller epsilon
  assert (root / 'accuracy_vs_epsilon.png').exists()


@pytest.mark.parametrize('args, driver_args, message', [
    ([GRID], [*TINY, '--experiment_name=x'], 'sweep sets it'),
    (['--grid=mechanism=nope'], TINY, 'rejects the point'),
    (['--grid=no_such_flag=1'], TINY, 'rejects the point'),
    ([], TINY, 'exactly one of --grid and --grid_file'),
])
def test_bad_input_is_one_line_before_anything_runs(tmp_path, args, driver_args, message):
  done = _sweep(tmp_path / 'root', *args, driver_args=driver_args)
  assert done.returncode == 2, done.stdout + done.stderr
  assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
  assert not (tmp_path / 'root').exists()


def test_grid_file_points_are_checked_with_the_stackoverflow_drivers_flags(tmp_path):
  # --grid_file and --driver=stackoverflow: each point is parsed with that driver's flags first.
  grid = tmp_path / 'grid.json'
  grid.write_text('[{"vocab_size": [50]}, {"vocab_size": ["ten"]}]')
  done = _sweep(tmp_path / 'root', f'--grid_file={grid}', driver='stackoverflow',
                driver_args=['--rounds=1', '--embedding_size=8', '--lstm_size=8'])
  assert done.returncode == 2, done.stdout + done.stderr
  assert len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert 'rejects the point' in done.stderr and '--vocab_size' in done.stderr, done.stderr
  assert not (tmp_path / 'root').exists()


@pytest.mark.slow
def test_ctrl_c_checkpoints_the_running_points_and_leaves_no_process(tmp_path):
  import re
  import signal
  import time

  from experiments.sweeps import run_sweep
  root = tmp_path / 'sweep'
  args = [sys.executable, '-m', 'experiments.sweeps.run_sweep', '--driver=emnist',
          f'--root_output_dir={root}', GRID, '--parallel=2', '--', *[a for a in TINY if not a.startswith('--rounds')],
          '--rounds=50']
  child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
  deadline = time.time() + 300
  metrics = [root / name / 'metrics.csv' for name in NAMES]
  while time.time() < deadline and not all(
      p.exists() and p.read_text().count('\n') >= 2 for p in metrics):  # a round of each done
    time.sleep(0.5)
  child.send_signal(signal.SIGINT)
  stdout, stderr = child.communicate(timeout=300)
  assert child.returncode == 130, stdout + stderr
  assert stdout.count('stopped noise_multiplier=') == 2, stdout
  for pid in map(int, re.findall(r'\(PID (\d+)\)', stdout)):
    assert run_sweep._session_pids(pid) == []  # the driver and its worker_binary are gone
  for name in NAMES:
    assert not run_summary.is_complete(str(root / name))
    checkpoints = os.listdir(root / name / 'checkpoints')
    assert any(c != 'program_state_0' for c in checkpoints), checkpoints  # checkpointed after a round
    assert 'Stopped by SIGINT after round' in (root / name / 'sweep.log').read_text()
