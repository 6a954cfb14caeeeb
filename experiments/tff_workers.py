"""Ends the TFF `worker_binary` processes that this Python process started.

TFF's local C++ execution context starts one `worker_binary` child per process that runs a
computation, and does not stop it at exit: it is re-parented to PID 1 and keeps the parent's stdout
open, which can hang pipelines. `end_child_workers()` stops this process's own worker children; test
sessions and binaries register it at exit (`register_at_exit`). Linux only (reads /proc); a no-op
elsewhere.
"""

import atexit
import os
import signal

_WORKER_NAME = 'worker_binary'


def _child_worker_pids(parent_pid: int) -> list:
  pids = []
  try:
    entries = os.listdir('/proc')
  except OSError:
    return pids
  for entry in entries:
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        stat = f.read().decode(errors='replace')
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        cmdline = f.read().decode(errors='replace')
    except OSError:
      continue
    # /proc/PID/stat: "pid (comm) state ppid ..."; comm may contain spaces, so split after ')'.
    ppid = int(stat.rsplit(')', 1)[1].split()[1])
    if ppid == parent_pid and _WORKER_NAME in cmdline:
      pids.append(int(entry))
  return pids


def end_child_workers() -> int:
  """Sends SIGKILL to this process's `worker_binary` children; returns how many were ended."""
  pids = _child_worker_pids(os.getpid())
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  return len(pids)


def register_at_exit() -> None:
  """Ends this process's worker_binary children when the interpreter exits."""
  atexit.register(end_child_workers)
