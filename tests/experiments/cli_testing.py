"""Runs the project's CLIs as subprocesses for tests: `python -m module args` with stdout and stderr
redirected to files (an orphaned TFF worker_binary would keep a pipe open)."""

import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EMNIST = 'experiments.emnist.run_emnist'
SO = 'experiments.stackoverflow.run_stackoverflow'
MECH = 'dp_ftrl_tff.mechanisms'
REPORT = 'experiments.privacy_report'


def _env(module):
  env = dict(os.environ)
  if module in (EMNIST, SO):
    env.pop('TF_CPP_MIN_LOG_LEVEL', None)  # the drivers must be quiet on their own
  return env


def run_cli(module, args, directory, timeout=300):
  """Runs `python -m module args`; returns (exit code, stdout text, stderr text)."""
  out_path, err_path = directory / 'stdout.txt', directory / 'stderr.txt'
  with open(out_path, 'w') as out, open(err_path, 'w') as err:
    proc = subprocess.run([sys.executable, '-m', module, *args], cwd=_ROOT, stdout=out,
                          stderr=err, stdin=subprocess.DEVNULL, timeout=timeout, env=_env(module))
  return proc.returncode, out_path.read_text(), err_path.read_text()
