"""Remote TFF workers: the launcher CLI, the remote context, the drivers' --workers, lost workers.

Workers are TFF's own C++ `worker_binary`, started on loopback by `python -m experiments.workers`.
The remote context is installed in subprocesses only (this test session keeps TFF's local context).
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dp_ftrl_tff.learning import remote_execution, worker_processes
from experiments.run import driver_config
from tests.testing import aggregation, remote_workers, run_files

pytestmark = pytest.mark.e2e

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')


def _alive(pid: int) -> bool:
  return worker_processes.start_time(pid) is not None


@pytest.mark.unit
def test_parse_worker_addresses():
  assert remote_execution.parse_worker_addresses(' a:1, b.example:8000,[::1]:9 ') == (
      'a:1', 'b.example:8000', '[::1]:9')
  assert remote_execution.parse_worker_addresses(['h:2']) == ('h:2',)
  for bad, message in (('', 'at least one'), ('host', 'not host:port'), ('h:0', '1..65535'),
                       ('h:70000', '1..65535'), ('h:1,h:1', 'twice'), (5, 'must be a string')):
    with pytest.raises(ValueError, match=message):
      remote_execution.parse_worker_addresses(bad, 'workers')


@pytest.mark.unit
def test_run_config_checks_workers(tmp_path):
  config = driver_config.DriverConfig(root_output_dir=str(tmp_path), workers='localhost:1, localhost:2')
  assert config.workers == 'localhost:1,localhost:2'
  with pytest.raises(ValueError, match='`workers`'):
    driver_config.DriverConfig(root_output_dir=str(tmp_path), workers='localhost')
  with pytest.raises(ValueError, match='secure aggregation cannot run on remote workers'):
    driver_config.DriverConfig(root_output_dir=str(tmp_path), workers='localhost:1',
                         secure_aggregation=True)


def test_launcher_start_status_stop_and_errors(tmp_path):
  state = str(tmp_path / 'state')

  def cli(*args):
    return subprocess.run([sys.executable, '-m', 'experiments.workers', *args,
                           f'--state_dir={state}'], cwd=_ROOT, env=_ENV, capture_output=True,
                          text=True, timeout=120)

  # The launcher's other flags: the host its addresses name, its wait, the workers' own limit.
  extra = ('--host=127.0.0.1', '--wait_seconds=90', '--max_concurrent_computation_calls=4')
  with remote_workers.launched(2, state, extra=extra) as (addresses, pids, launcher):
    for address in addresses.split(','):
      assert address.startswith('127.0.0.1:'), addresses
      assert remote_execution.worker_answers(address)
    status = cli('status')
    assert status.returncode == 0 and status.stdout.count('answers') == 2, status.stdout
    port = int(addresses.split(',')[0].rsplit(':', 1)[1])
    in_use = cli('start', f'--port={port}')
    assert in_use.returncode == 1
    assert in_use.stderr.strip().count('\n') == 0 and f'port {port} is in use' in in_use.stderr
    stopped = cli('stop', f'--port={port}')
    assert stopped.returncode == 0, stopped.stderr
    launcher.wait(timeout=30)
    assert launcher.returncode == 0
    assert not any(_alive(pid) for pid in pids)
  assert 'No TFF workers' in cli('status').stdout
  for args, message in ((('bogus',), 'give one command'), (('start',), '--port is required'),
                        (('start', '--port=1', '--count=0'), '--count')):
    result = cli(*args)
    assert result.returncode == 2, result
    assert result.stderr.count('\n') == 1 and message in result.stderr, result.stderr


def test_no_worker_outlives_a_killed_launcher(tmp_path):
  with remote_workers.launched(2, str(tmp_path)) as (_, pids, launcher):
    assert all(_alive(pid) for pid in pids)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=30)
    deadline = time.time() + 10
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
      time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


# Runs in a subprocess: every streaming mechanism (and adaptive clipping) through the factory's
# aggregation process on 1, 2 and 3 workers; prints the results as JSON.
_AGGREGATOR_SCRIPT = r'''
import json, sys
from dp_ftrl_tff.learning import remote_contexts
from tests.testing import aggregation
addresses = sys.argv[1].split(',')
processes = aggregation.processes()
results = {}
for count in (1, 2, 3):
  remote_contexts.set_remote_execution_context(addresses[:count])
  results[count] = aggregation.run_three_rounds(processes)
print(json.dumps(results))
'''


@pytest.mark.slow
def test_every_mechanism_on_1_2_3_workers_equals_local(tmp_path):
  local = aggregation.run_three_rounds(aggregation.processes())
  with remote_workers.launched(3, str(tmp_path)) as (addresses, _, _):
    proc = subprocess.run([sys.executable, '-c', _AGGREGATOR_SCRIPT, addresses], cwd=_ROOT,
                          env=_ENV, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  remote = json.loads(proc.stdout.strip().splitlines()[-1])
  assert sorted(remote) == ['1', '2', '3']
  for count, results in remote.items():
    assert sorted(results) == sorted(local), count
    for name, outputs in results.items():
      # 7 values of magnitude ~1 (clipped to norm 1) plus noise, summed in another order, over
      # 1/7: float32 rounding of the sum, a few ulp of O(10), i.e. well below 1e-5.
      np.testing.assert_allclose(outputs, local[name], rtol=0, atol=1e-5,
                                 err_msg=f'{name} on {count} workers')


_SECURE_SCRIPT = r'''
import numpy as np, tensorflow_federated as tff, sys
from dp_ftrl_tff.learning import remote_contexts, remote_execution
remote_contexts.set_remote_execution_context(sys.argv[1])

@tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
def secure_sum(value):
  return tff.federated_secure_sum_bitwidth(value, 8)

try:
  remote_execution.check_no_secure_sum(secure_sum)
except ValueError as error:
  print('refused:', error)
try:
  secure_sum([1, 2, 3])
except Exception as error:
  print('TFF:', type(error).__name__)
'''


def test_secure_sums_cannot_be_split_across_workers(tmp_path):
  """Verifies the limit rather than assuming it: TFF's mergeable compiler rejects a secure sum."""
  with remote_workers.launched(1, str(tmp_path)) as (addresses, _, _):
    proc = subprocess.run([sys.executable, '-c', _SECURE_SCRIPT, addresses], cwd=_ROOT, env=_ENV,
                          capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'refused: secure aggregation cannot run on remote workers' in proc.stdout
  assert 'TFF: AfterMergeStructureError' in proc.stdout


_DRIVER_FLAGS = ('--model=tiny', '--rounds=4', '--clients_per_round=6', '--synthetic_num_clients=40',
                 '--synthetic_examples_per_client=8', '--mechanism=blt', '--noise_multiplier=0.5',
                 '--noise_seed=5', '--eval_every=4', '--checkpoint_every=1',
                 '--server_learning_rate=0.5', '--adaptive_clipping')


def _driver(root, name, workers=None, timeout=900):
  args = [sys.executable, '-m', 'experiments.emnist.run_emnist', f'--root_output_dir={root}',
          f'--experiment_name={name}', *_DRIVER_FLAGS]
  if workers:
    args.append(f'--workers={workers}')
  return subprocess.Popen(args, cwd=_ROOT, env=_ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _metrics(run_dir):
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return [{k: float(v) for k, v in row.items() if v and 'seconds' not in k}
            for row in csv.DictReader(f)]


def _report(run_dir):
  with open(os.path.join(run_dir, 'privacy_report', 'report.json')) as f:
    report = json.load(f)
  return report['rho'], report['epsilon']


@pytest.mark.slow
def test_driver_on_workers_equals_local_and_survives_lost_workers(tmp_path):
  root = str(tmp_path / 'runs')
  local = _driver(root, 'local')
  assert local.wait(timeout=900) == 0, local.stderr.read()[-3000:]
  with remote_workers.launched(2, str(tmp_path / 'a')) as (addresses, pids, _):
    # Two workers, uninterrupted: the local run within float rounding, the same log and report.
    two = _driver(root, 'two', addresses)
    assert two.wait(timeout=900) == 0, two.stderr.read()[-3000:]
    # Two workers, one killed when round 2 starts: the round runs again on the other.
    watcher = remote_workers.kill_at_round(os.path.join(root, 'lost_one'), 2, pids[1:])
    lost_one = _driver(root, 'lost_one', addresses)
    assert lost_one.wait(timeout=900) == 0, lost_one.stderr.read()[-3000:]
    watcher.join()
    assert 'stopped answering; running it again on' in lost_one.stderr.read()
  for name in ('two', 'lost_one'):
    for ours, theirs in zip(_metrics(os.path.join(root, name)), _metrics(os.path.join(root, 'local')),
                            strict=True):
      assert ours.keys() == theirs.keys()
      for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-4, atol=1e-5, err_msg=key)
    with open(os.path.join(root, name, 'participation.csv')) as a, open(
        os.path.join(root, 'local', 'participation.csv')) as b:
      assert a.read() == b.read()
    assert _report(os.path.join(root, name)) == _report(os.path.join(root, 'local'))

  # Every worker lost in round 2: one line, exit 1; new workers on the same ports resume from the
  # checkpoint after round 1 and end bit-identical to the uninterrupted two-worker run.
  port = int(addresses.split(',')[0].rsplit(':', 1)[1])
  with remote_workers.launched(2, str(tmp_path / 'b'), port) as (_, pids, _):
    watcher = remote_workers.kill_at_round(os.path.join(root, 'lost_all'), 2, pids)
    lost_all = _driver(root, 'lost_all', addresses)
    assert lost_all.wait(timeout=900) == 1
    watcher.join()
    stderr = lost_all.stderr.read().strip().splitlines()
    assert stderr[-1].startswith('run_emnist.py: error: no TFF worker of '), stderr[-5:]
    assert 'Traceback' not in '\n'.join(stderr)
  with remote_workers.launched(2, str(tmp_path / 'c'), port):
    resumed = _driver(root, 'lost_all', addresses)
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err[-3000:]
    assert 'Resuming' in out + err
  assert _metrics(os.path.join(root, 'lost_all')) == _metrics(os.path.join(root, 'two'))
  run_files.assert_same_leaves(run_files.checkpoint_leaves(os.path.join(root, 'lost_all')),
                               run_files.checkpoint_leaves(os.path.join(root, 'two')))
