"""SecAgg in the drivers, end to end: TFF's test execution context chosen by the driver, the SecAgg
flags, modular-wrap reporting, and one-line errors.

Every run is a subprocess: SecAgg changes the process's TFF execution context. Output goes to files,
not pipes (an orphaned TFF worker_binary would keep a pipe open).
"""

import csv
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from dp_ftrl_tff.aggregators import SecureAggregation
from experiments.cli import flag_parsing
from experiments.emnist import models as emnist_models

pytestmark = pytest.mark.e2e

TINY_RUN = ('--model=tiny', '--clients_per_round=3', '--synthetic_num_clients=30',
            '--synthetic_examples_per_client=8', '--min_sep=2', '--noise_seed=3',
            '--eval_max_examples=64', '--secure_aggregation', '--secure_bits=16')
CLIENTS_PER_ROUND = 3
# Time limit of a driver run that stops before any training.
FAILS_FAST_SECONDS = 60
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Runs asserting that no round wraps use the Hadamard rotation and this modclip_prob. With random
# signs and the orthonormal Hadamard transform, each coordinate of the rotated (scaled) sum s is a
# Rademacher sum with variance proxy ||s||^2 / d, so by Hoeffding it leaves +-k ||s|| / sqrt(d) with
# probability at most 2 exp(-k^2 / 2), even for identical clients at the clip (||s|| = n c / gamma,
# the norm the scale provisions for). Here k = sqrt(2) erfcinv(1e-12) = 7.13 and ||s|| / sqrt(d) is
# about 4600 scaled units, so the rounding's at most n = 3 units per coordinate lowers k by < 1e-3:
# over d = 8192 padded coordinates a round wraps with probability below 8192 * 2 exp(-7.12^2 / 2)
# < 1e-6. With the default 1e-4 that bound is d x 1e-4 per round (docs/aggregators.md), so a
# zero-wrap assertion there would rest on luck.
NO_WRAP = ('--secure_rotation=hd', '--secure_modclip_prob=1e-12')


def _run(tmp_path, command, *args, timeout=300):
  """Runs `command` (a list) with `args`; returns (exit code, stderr text)."""
  err_path = tmp_path / 'stderr.txt'
  # A script's own directory comes first on its path: the checkout's packages must come next.
  path = os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)
  with open(err_path, 'w') as err:
    proc = subprocess.run([*command, *args], stdout=subprocess.DEVNULL, stderr=err,
                          timeout=timeout,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=path))
  return proc.returncode, err_path.read_text()


def _run_emnist(tmp_path, *args, timeout=300):
  return _run(tmp_path, [sys.executable, '-m', 'experiments.emnist.run_emnist'],
              f'--root_output_dir={tmp_path}', *args, timeout=timeout)


def _blt_file(tmp_path):
  from dp_ftrl_tff.mechanisms import blt, files
  path = str(tmp_path / 'blt.json')
  files.save_strategy(blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2)), path)
  return path


def _rows(tmp_path):
  with open(os.path.join(tmp_path, 'run', 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))


def _hparams(tmp_path):
  with open(os.path.join(tmp_path, 'run', 'hparams.json')) as f:
    return json.load(f)


def _tiny_dim():
  return emnist_models.build_keras_model('tiny', 10, 0).count_params()


def _assert_one_line_error(returncode, stderr, *fragments):
  assert returncode == flag_parsing.ERROR_EXIT_CODE, stderr
  assert 'Traceback' not in stderr
  lines = stderr.splitlines()
  assert len(lines) == 1, stderr
  assert ': error: ' in lines[0]
  for fragment in fragments:
    assert fragment in lines[0]
  return lines[0]


def test_fixed_clip_run_writes_secagg_metrics(tmp_path):
  returncode, stderr = _run_emnist(
      tmp_path, *TINY_RUN, '--mechanism=blt', f'--mechanism_file={_blt_file(tmp_path)}',
      '--rounds=2', '--eval_every=2', *NO_WRAP)
  assert returncode == 0, stderr[-3000:]
  rows = _rows(tmp_path)
  assert [int(r['round']) for r in rows] == [0, 1]
  expected_scale = SecureAggregation(bits=16, rotation='hd', modclip_prob=1e-12).scale_factor(
      1.0, CLIENTS_PER_ROUND, _tiny_dim())
  for row in rows:
    assert float(row['aggregator/modular_wrap']) == 0
    assert float(row['aggregator/scale_factor']) == pytest.approx(expected_scale, rel=1e-6)
  hparams = _hparams(tmp_path)
  assert (hparams['secure_aggregation'], hparams['secure_bits'], hparams['secure_rotation'],
          hparams['secure_beta'], hparams['secure_modclip_prob']) == (True, 16, 'hd', 0.0, 1e-12)
  assert 'SecAgg: modular wraps (secure sum outside the 2^16 field) in 0 of the 2 rounds' in stderr
  assert 'wrapped around' not in stderr


def test_adaptive_clipping_with_beta_scale_follows_the_clip(tmp_path):
  beta = math.exp(-0.5)
  returncode, stderr = _run_emnist(
      tmp_path, *TINY_RUN, '--mechanism=blt', f'--mechanism_file={_blt_file(tmp_path)}',
      '--rounds=3', '--eval_every=3', '--adaptive_clipping', '--restart_period=1',
      '--noise_multiplier=0.5', '--clipped_count_stddev=1', f'--secure_beta={beta!r}', *NO_WRAP)
  assert returncode == 0, stderr[-3000:]
  rows = _rows(tmp_path)
  assert [int(r['round']) for r in rows] == [0, 1, 2]
  clips = [float(r['aggregator/clip']) for r in rows]
  assert len(set(clips)) > 1  # the clip moved (a restart every round)
  unit = SecureAggregation(bits=16, rotation='hd', beta=beta, modclip_prob=1e-12).unit_scale_factor(
      CLIENTS_PER_ROUND, _tiny_dim())
  for row, clip in zip(rows, clips, strict=True):
    assert float(row['aggregator/modular_wrap']) == 0
    assert float(row['aggregator/scale_factor']) == pytest.approx(unit / clip, rel=1e-5)
    assert float(row['aggregator/sensitivity_clip']) > clip  # the rounding's norm inflation
  assert _hparams(tmp_path)['secure_beta'] == beta
  assert 'in 0 of the 3 rounds' in stderr
  # A successful run prints no error line: TensorFlow once logged an unused assertion of the
  # quantile bits' secure sum at ERROR level, dressed as ours.
  assert ': error:' not in stderr and 'never used' not in stderr, stderr[-3000:]


def test_modular_wraps_are_logged_and_written(tmp_path):
  # modclip_prob 0.9: the field spans +-0.13 standard deviations of the sum, so it wraps.
  returncode, stderr = _run_emnist(tmp_path, *TINY_RUN, '--mechanism=gaussian', '--rounds=2',
                                   '--eval_every=2', '--secure_modclip_prob=0.9')
  assert returncode == 0, stderr[-3000:]
  wraps = [int(float(r['aggregator/modular_wrap'])) for r in _rows(tmp_path)]
  assert wraps == [1, 1]
  assert 'Round 1/2: the secure sum wrapped around the 2^16 field (modular_wrap=1)' in stderr
  assert 'Increase --secure_bits (now 16) or lower --secure_modclip_prob (now 0.9)' in stderr
  assert 'in 2 of the 2 rounds 1-2: rounds [1, 2].' in stderr


_LAUNCHER = textwrap.dedent('''
    """A launcher that installs its own TFF context (which cannot run secure sums)."""
    import tensorflow_federated as tff
    from experiments.run import driver
    from experiments.emnist import run_emnist

    context = tff.backends.native.create_sync_local_cpp_execution_context()
    with tff.framework.get_context_stack().install(context):
      driver.run_main(run_emnist.FLAGS, run_emnist.build_task, run_emnist.task_settings,
                      run_emnist.__doc__)
''')


def test_a_callers_context_without_secure_sums_is_not_in_the_way(tmp_path):
  # The training loop installs TFF's asynchronous test context over the caller's, for the run.
  launcher = tmp_path / 'launcher.py'
  launcher.write_text(_LAUNCHER)
  returncode, stderr = _run(tmp_path, [sys.executable, str(launcher)],
                            f'--root_output_dir={tmp_path}', *TINY_RUN, '--rounds=2')
  assert returncode == 0, stderr[-3000:]
  assert len(_rows(tmp_path)) == 2



@pytest.mark.parametrize('flag, fragments', [
    ('--secure_beta=1.5', ('--secure_beta must lie in [0.0, 1.0), got 1.5',)),
    ('--secure_modclip_prob=0', ('--secure_modclip_prob must lie in (0.0, 1.0), got 0.0',)),
    ('--secure_rotation=fft', ('--secure_rotation=fft', 'dft|hd|none')),
    ('--secure_bits=23', ('--secure_bits must be at most 22',)),
    ('--secure_bits=2', ('--secure_bits=2 is too small for --clients_per_round=3',
                         'increase --secure_bits')),
])
def test_bad_secure_flag_fails_with_one_line(tmp_path, flag, fragments):
  # The flag comes after TINY_RUN's settings, and the later value of a flag wins.
  returncode, stderr = _run_emnist(tmp_path, *TINY_RUN, flag, timeout=FAILS_FAST_SECONDS)
  _assert_one_line_error(returncode, stderr, 'run_emnist.py: error: ', *fragments)
  assert not os.path.exists(tmp_path / 'run')
