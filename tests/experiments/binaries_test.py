"""Every binary module imports in one process (flags live on each binary's own FlagValues), and
`--help` of each lists its flags."""

import glob
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARIES = sorted(
    ['experiments.emnist.run_emnist', 'experiments.stackoverflow.run_stackoverflow',
     'experiments.privacy_report', 'experiments.demo', 'experiments.mechanisms_cli']
    + [f'experiments.benchmarks.{os.path.basename(p)[:-3]}'
       for p in glob.glob(os.path.join(_ROOT, 'experiments', 'benchmarks', '*_bench.py'))])


def test_all_binaries_import_together_without_global_flags():
  # The libraries define their own flags on import (absl logging, TensorFlow): taken first.
  code = ('import importlib; from absl import app, flags, logging; '
          'import tensorflow, tensorflow_federated, tensorflow_privacy; '
          'before = set(flags.FLAGS); '
          f'[importlib.import_module(m) for m in {BINARIES!r}]; '
          'added = set(flags.FLAGS) - before; '
          "assert not added, f'flags defined on the global FLAGS: {sorted(added)}'")
  proc = subprocess.run([sys.executable, '-c', code], cwd=_ROOT, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize('module, expected', [
    ('experiments.emnist.run_emnist', ['--root_output_dir', '--mechanism', '--noise_multiplier',
                                       '--secure_modclip_prob', '--target_delta', '--model']),
    ('experiments.stackoverflow.run_stackoverflow', ['--mechanism', '--vocab_size']),
    ('experiments.privacy_report', ['--plan', '--target_delta', '--theta']),
    ('experiments.mechanisms_cli', ['--num_buffers', '--num_bands']),
])
def test_help_lists_every_flag(module, expected):
  proc = subprocess.run([sys.executable, '-m', module, '--help'], cwd=_ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert proc.returncode == 0, proc.stderr[-2000:]
  for flag in expected:
    assert flag in proc.stdout, flag


_NO_TF_CASES = [
    ('experiments.emnist.run_emnist', ['--help'], 0),
    ('experiments.emnist.run_emnist', ['--rounds=x'], 2),  # absl's parse error
    ('experiments.emnist.run_emnist', ['--root_output_dir=OUT', '--clients_per_round=0'], 2),
    ('experiments.emnist.run_emnist', ['--root_output_dir=OUT', '--noise_multiplier=1',
                                       '--target_epsilon=2'], 2),  # the RunConfig's checks
    ('experiments.stackoverflow.run_stackoverflow', ['--help'], 0),
    ('experiments.stackoverflow.run_stackoverflow', ['--root_output_dir=OUT', '--mechanism=x'], 2),
    ('experiments.privacy_report', ['--help'], 0),
    ('experiments.privacy_report', ['--rounds=-1'], 2),
    ('experiments.mechanisms_cli', ['--help'], 0),
    ('experiments.mechanisms_cli', ['optimize', '--bogus_flag=1'], 2),
]


@pytest.mark.parametrize('module, args, exit_code', _NO_TF_CASES)
def test_help_and_usage_errors_answer_without_tensorflow(module, args, exit_code, tmp_path):
  # A `tensorflow` (and `tensorflow_federated`) package that ends the process when imported, first
  # on the path: `--help` and flag errors must be answered before TensorFlow would be imported.
  for package in ('tensorflow', 'tensorflow_federated'):
    (tmp_path / package).mkdir()
    (tmp_path / package / '__init__.py').write_text(
        f'import os, sys\nsys.stderr.write("{package} imported\\n")\nos._exit(97)\n')
  out = tmp_path / 'out'
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), _ROOT]))
  proc = subprocess.run([sys.executable, '-m', module,
                         *[a.replace('OUT', str(out)) for a in args]],
                        cwd=_ROOT, capture_output=True, text=True, timeout=300, env=env)
  assert 'imported' not in proc.stderr, proc.stderr[-2000:]
  assert proc.returncode == exit_code, proc.stderr[-2000:]
  if exit_code:
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert not out.exists()


@pytest.mark.parametrize('module, is_driver', [
    ('experiments.emnist.run_emnist', True),
    ('experiments.stackoverflow.run_stackoverflow', True),
    ('experiments.privacy_report', False),
    ('experiments.mechanisms_cli', False),
    ('experiments.demo', False),
])
def test_help_has_an_example_exit_codes_and_docs(module, is_driver):
  # `--help` prints the module docstring, then the flags: the docstring gives a runnable example,
  # the exit codes and where the docs are; the drivers name absl's --verbosity (not in the flags).
  proc = subprocess.run([sys.executable, '-m', module, '--help'], cwd=_ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  assert proc.returncode == 0, proc.stderr[-2000:]
  usage = ' '.join(proc.stdout.split('\nFlags:\n')[0].split())  # one line: wrapping aside
  assert 'Example' in usage and f'python -m {module}' in usage, usage
  assert 'Exit codes: 0 ok; 2 ' in usage and ' 1 ' in usage, usage
  docs = [word.strip('.,;:()`') for word in usage.split() if 'docs/' in word]
  assert docs, usage
  if os.path.isdir(os.path.join(_ROOT, 'docs')):  # Bazel's runfiles hold no docs/
    assert all(os.path.exists(os.path.join(_ROOT, d)) for d in docs), docs
  if is_driver:
    assert '--verbosity=0' in usage and '130 / 143' in usage, usage
    assert 'docs/training.md' in docs and '.py' not in usage.replace(module, ''), usage
