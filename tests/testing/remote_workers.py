"""TFF remote workers for tests: started on loopback by the launcher, and killed when a round starts.

Workers are TFF's own C++ `worker_binary`, started by `python -m experiments.workers start`; no
worker outlives its launcher (parent-death signal), and the launcher is stopped on exit.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

from experiments.workers import launcher as workers_launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')


@contextlib.contextmanager
def launched(count: int, state_dir, port=None, extra=()):
  """Runs `python -m experiments.workers start` (with the `extra` flags); yields (addresses
  'host:port,...', worker PIDs, launcher `Popen`)."""
  port = port or workers_launcher.free_port_range(count)
  launcher = subprocess.Popen(
      [sys.executable, '-m', 'experiments.workers', 'start', f'--count={count}', f'--port={port}',
       f'--state_dir={state_dir}', *extra], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  try:
    line = launcher.stdout.readline().strip()
    assert line.startswith('--workers='), (line, launcher.stderr.read() if launcher.poll() else '')
    addresses = line[len('--workers='):]
    with open(os.path.join(state_dir, f'launcher-{launcher.pid}.json')) as f:
      pids = [w['pid'] for w in json.load(f)['workers']]
    yield addresses, pids, launcher
  finally:
    if launcher.poll() is None:
      launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=60)


def kill_at_round(run_dir, round_num: int, pids) -> threading.Thread:
  """Kills `pids` (SIGKILL) once the run's participation.csv logs `round_num` (a driver and the
  train_model program both log a round's cohort right before they run it); returns the watcher."""
  path = os.path.join(run_dir, 'participation.csv')

  def watch():
    deadline = time.time() + 900
    while time.time() < deadline:
      try:
        with open(path) as f:
          if any(line.rstrip().endswith(f',{round_num}') for line in f):
            break
      except OSError:
        pass
      time.sleep(0.05)
    for pid in pids:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread
