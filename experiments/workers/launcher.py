"""Starts local TFF workers (TFF's C++ `worker_binary`), lists and stops their launchers.

`start` launches N workers on ports P..P+N-1, waits until each accepts connections, prints their
addresses as one `--workers=host:port,...` line and stays in the foreground until SIGINT / SIGTERM.
No worker outlives its launcher: every worker is started with the Linux parent-death signal set to
SIGKILL, so it ends even when the launcher is killed with SIGKILL. Each running launcher is recorded
in a state directory (`launcher-PID.json`: its PID and start time, the workers' PIDs and addresses);
`status` and `stop` read these records and ignore stale ones. The command line is
`python -m experiments.workers` (`__main__.py`).
"""

import ctypes
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from typing import List

from dp_ftrl_tff import _atomic
from dp_ftrl_tff.learning import remote_execution, worker_processes

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def worker_binary_path() -> str:
  """The `worker_binary` shipped in the installed tensorflow_federated wheel (found without
  importing TensorFlow)."""
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('tensorflow_federated is not installed (`make install`).')
  path = os.path.join(list(spec.submodule_search_locations)[0], 'data', 'worker_binary')
  if not os.access(path, os.X_OK):
    raise RuntimeError(f'no executable TFF worker_binary at {path}.')
  return path


def _die_with_parent() -> None:
  """In the child before exec: SIGKILL when the launcher exits (Linux prctl PR_SET_PDEATHSIG)."""
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _check_port_free(port: int) -> None:
  with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(('::' if socket.has_ipv6 else '', port))
    except OSError as error:
      raise RuntimeError(f'port {port} is in use ({error.strerror}); choose another --port.') from None


def free_port_range(count: int) -> int:
  """A first port P such that P .. P+count-1 are free on this machine now (random in 20000-60000).

  Raises:
    ValueError: `count` is not a positive integer.
    RuntimeError: no free range was found in 200 tries.
  """
  if not isinstance(count, int) or count < 1:
    raise ValueError(f'`count` must be a positive integer, got {count!r}.')
  rng = random.SystemRandom()
  for _ in range(200):
    port = rng.randint(20000, 60000 - count)
    try:
      for p in range(port, port + count):
        with socket.socket() as s:
          s.bind(('', p))
      return port
    except OSError:
      continue
  raise RuntimeError(f'found no {count} free consecutive ports; give --port.')


def _record_path(state_dir: str, pid: int) -> str:
  return os.path.join(state_dir, f'launcher-{pid}.json')


def _launchers(state_dir: str) -> List[dict]:
  """The records of the launchers still running (stale records are removed)."""
  records = []
  if not os.path.isdir(state_dir):
    return records
  for name in sorted(os.listdir(state_dir)):
    if not (name.startswith('launcher-') and name.endswith('.json')):
      continue
    path = os.path.join(state_dir, name)
    try:
      with open(path) as f:
        record = json.load(f)
      alive = worker_processes.start_time(int(record['pid'])) == record['start']
    except (OSError, ValueError, KeyError, TypeError):
      alive = False
    if alive:
      records.append(record)
    else:
      try:
        os.remove(path)
      except OSError:
        pass
  return records


def _stop_processes(processes: List[subprocess.Popen]) -> None:
  for process in processes:
    if process.poll() is None:
      process.kill()
  for process in processes:
    process.wait()


def start(count: int, port: int, host: str, wait_seconds: float, max_concurrent_calls: int,
          state_dir: str) -> int:
  """Runs `count` workers until SIGINT / SIGTERM; returns the exit status (0)."""
  ports = list(range(port, port + count))
  if ports[-1] > 65535:
    raise ValueError(f'`port` + `count` - 1 = {ports[-1]} exceeds 65535.')
  binary = worker_binary_path()
  for p in ports:
    _check_port_free(p)
  stop = {'signum': None}

  def on_signal(signum, unused_frame):
    stop['signum'] = signum

  signal.signal(signal.SIGINT, on_signal)
  signal.signal(signal.SIGTERM, on_signal)
  processes = []
  record_path = _record_path(state_dir, os.getpid())
  try:
    for p in ports:
      processes.append(subprocess.Popen(
          [binary, f'--port={p}', f'--max_concurrent_computation_calls={max_concurrent_calls}'],
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
          preexec_fn=_die_with_parent))
    addresses = [f'{host}:{p}' for p in ports]
    deadline = time.time() + wait_seconds
    for address, process in zip(addresses, processes, strict=True):
      while not remote_execution.worker_answers(address, 0.5):
        if process.poll() is not None:
          raise RuntimeError(f'the worker for {address} exited at start (code {process.returncode});'
                             ' is the port in use?')
        if time.time() > deadline or stop['signum'] is not None:
          raise RuntimeError(f'the worker for {address} did not answer within {wait_seconds:g} s.')
    os.makedirs(state_dir, exist_ok=True)
    _atomic.write_text(record_path, json.dumps({
        'pid': os.getpid(), 'start': worker_processes.start_time(os.getpid()),
        'workers': [{'pid': pr.pid, 'address': a, 'port': p}
                    for pr, a, p in zip(processes, addresses, ports, strict=True)]}, indent=1))
    print(f'--workers={",".join(addresses)}', flush=True)
    print(f'{count} TFF worker(s) running; stop with Ctrl-C or '
          f'`python -m experiments.workers stop --port={port}`.', file=sys.stderr, flush=True)
    reported = set()
    while stop['signum'] is None:
      for address, process in zip(addresses, processes, strict=True):
        if process.poll() is not None and address not in reported:
          reported.add(address)
          print(f'workers: the worker at {address} exited (code {process.returncode}).',
                file=sys.stderr, flush=True)
      if len(reported) == len(processes):
        raise RuntimeError('every worker exited.')
      time.sleep(0.5)
    print(f'Stopped {count} TFF worker(s).', file=sys.stderr, flush=True)
    return 0
  finally:
    _stop_processes(processes)
    try:
      os.remove(record_path)
    except OSError:
      pass


def status(state_dir: str) -> int:
  """Prints each running launcher and its workers (whether each answers)."""
  records = _launchers(state_dir)
  if not records:
    print('No TFF workers started by `python -m experiments.workers start` are running.')
    return 0
  for record in records:
    print(f'launcher PID {record["pid"]}:')
    for worker in record['workers']:
      answers = remote_execution.worker_answers(worker['address'], 1.0)
      print(f'  {worker["address"]}  PID {worker["pid"]}  '
            f'{"answers" if answers else "does not answer"}')
  return 0


def stop(state_dir: str, port=None, wait_seconds: float = 10.0) -> int:
  """Sends SIGTERM to the running launchers (those serving `port`, or all) and waits for them."""
  records = [r for r in _launchers(state_dir)
             if port is None or any(w['port'] == port for w in r['workers'])]
  if not records:
    print('No matching TFF worker launcher is running.')
    return 0
  for record in records:
    try:
      os.kill(record['pid'], signal.SIGTERM)
    except ProcessLookupError:
      pass
  deadline = time.time() + wait_seconds
  while time.time() < deadline and any(
      worker_processes.start_time(r['pid']) == r['start'] for r in records):
    time.sleep(0.1)
  print(f'Stopped {len(records)} launcher(s): '
        f'{", ".join(w["address"] for r in records for w in r["workers"])}.')
  return 0
