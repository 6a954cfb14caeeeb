"""`python -m experiments.demo` deletes nothing: it checks its flags and settings and takes the run
lock (through the EMNIST driver) before it touches a directory, and each default call writes a new
run directory. In-process (`binaries.run_in_process`); no test here trains."""

import os

import pytest

from dp_ftrl_tff.training import run_dir
from experiments import demo
from experiments.run import driver
from tests.testing import binaries

pytestmark = pytest.mark.integration


def _someones_run(path) -> dict:
  """A run directory holding files (as a finished or running run would); returns its contents."""
  (path / 'checkpoints').mkdir(parents=True)
  (path / 'hparams.json').write_text('{"rounds": 20}\n')
  (path / 'metrics.csv').write_text('round,loss\n0,2.5\n')
  (path / 'checkpoints' / 'ckpt_10.npz').write_bytes(b'\x00\x01state')
  return _contents(path)


def _contents(path) -> dict:
  """{relative path: bytes} of every file under `path`."""
  return {os.path.relpath(os.path.join(d, f), path): open(os.path.join(d, f), 'rb').read()
          for d, _, files in os.walk(path) for f in files}


@pytest.mark.parametrize('bad_flag, fragment', [
    ('--clients_per_round=2000', 'clients'),  # a setting the driver refuses after building the task
    ('--rounds=ten', '--rounds'),  # a flag absl refuses
])
def test_bad_input_leaves_an_existing_run_directory_as_it_was(tmp_path, bad_flag, fragment):
  run = tmp_path / 'root' / 'X'
  before = _someones_run(run)
  code, _, stderr = binaries.run_in_process(
      binaries.DEMO, [f'--root_output_dir={tmp_path / "root"}', '--experiment_name=X', bad_flag])
  assert code == 2, stderr
  assert len(stderr.strip().splitlines()) == 1 and fragment in stderr, stderr
  assert _contents(run) == before
  assert os.listdir(tmp_path / 'root') == ['X']


@pytest.mark.e2e
def test_run_directory_in_use_is_refused_naming_its_pid_and_kept(tmp_path):
  # The demo as a subprocess while this process holds the run's lock, as a running driver does.
  run = tmp_path / 'root' / 'X'
  _someones_run(run)
  holder = run_dir.RunDirectory(str(run))
  holder.acquire()
  try:
    before = _contents(run)
    code, _, stderr = binaries.run(
        binaries.DEMO, [f'--root_output_dir={tmp_path / "root"}', '--experiment_name=X',
                        '--rounds=2'], directory=tmp_path)
    assert code == 1, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert f'PID {os.getpid()}' in stderr and 'in use' in stderr, stderr
    assert _contents(run) == before
  finally:
    holder.release()


@pytest.mark.unit
def test_each_default_call_writes_a_new_run_directory(tmp_path, monkeypatch):
  # The driver's training replaced by a fake that records the run directory and writes a file in
  # it, as a run would: a second call must choose another directory and leave the first (and an
  # older demo run) as they were.
  root = tmp_path / 'root'
  old = _someones_run(root / 'emnist_blt_demo')
  chosen = []

  def fake_run(flag_values, build_task, task_settings):
    del build_task, task_settings
    path = os.path.join(flag_values.root_output_dir, flag_values.experiment_name)
    assert not os.path.exists(path), path
    chosen.append(path)
    os.makedirs(path)
    with open(os.path.join(path, 'metrics.csv'), 'w') as f:
      f.write(f'run {len(chosen)}\n')
    return {}

  monkeypatch.setattr(driver, 'run_from_flags', fake_run)
  for _ in range(2):
    code, stdout, stderr = binaries.run_in_process(binaries.DEMO, [f'--root_output_dir={root}'])
    assert code == 0, stderr
    assert os.path.join(chosen[-1], run_dir.REPORT_DIR, 'report.md') in stdout, stdout
  assert len(set(chosen)) == 2
  assert all(os.path.basename(p).startswith('demo-') for p in chosen), chosen
  assert [open(os.path.join(p, 'metrics.csv')).read() for p in chosen] == ['run 1\n', 'run 2\n']
  assert _contents(root / 'emnist_blt_demo') == old
  # A given --experiment_name is the run directory, as for the driver.
  code, _, stderr = binaries.run_in_process(
      binaries.DEMO, [f'--root_output_dir={root}', '--experiment_name=mine'])
  assert code == 0, stderr
  assert chosen[-1] == os.path.join(root, 'mine')


@pytest.mark.unit
def test_fresh_name_skips_names_the_root_holds(tmp_path):
  first = demo.fresh_experiment_name(str(tmp_path))
  (tmp_path / first).mkdir()
  second = demo.fresh_experiment_name(str(tmp_path))
  assert second != first and not (tmp_path / second).exists()
  assert demo.FRESH_NAME not in (first, second) and '\0' in demo.FRESH_NAME
