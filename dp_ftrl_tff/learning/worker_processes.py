"""Ends the TFF `worker_binary` processes that this Python process started.

TFF's local C++ execution context starts one `worker_binary` child per process that runs a
computation, and does not stop it at exit: it is re-parented to PID 1 and keeps the parent's stdout
open, which can hang pipelines (`python my_loop.py | tail` waits for it). `end_child_workers()` stops
this process's own worker children; a script ends them on leaving `ending_child_workers()` or at
exit (`register_at_exit`; `dp_ftrl_tff.training.train` registers it). Linux only (reads /proc); a
no-op elsewhere.
"""

import atexit
import contextlib
import os
import signal

_WORKER_NAME = 'worker_binary'


def _read_stat(pid) -> list:
  """/proc/PID/stat fields after the command name: [state, ppid, ...] ("pid (comm) state ppid ...";
  comm may contain spaces, so split after the last ')')."""
  with open(f'/proc/{pid}/stat', 'rb') as f:
    return f.read().decode(errors='replace').rsplit(')', 1)[1].split()


def start_time(pid: int):
  """Process `pid`'s start time (clock ticks after boot, /proc/PID/stat field 22), or None if there
  is no such process (or it is a zombie). With the PID, it identifies a process across PID reuse."""
  try:
    fields = _read_stat(pid)
  except (OSError, IndexError):
    return None
  return None if fields[0] == 'Z' else int(fields[19])


def is_worker(pid: int) -> bool:
  """Whether process `pid` runs TFF's worker_binary."""
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return _WORKER_NAME in f.read().decode(errors='replace')
  except OSError:
    return False


def child_worker_pids(parent_pid: int) -> list:
  """The PIDs of the `worker_binary` processes whose parent is `parent_pid`."""
  pids = []
  try:
    entries = os.listdir('/proc')
  except OSError:
    return pids
  for entry in entries:
    if not entry.isdigit():
      continue
    try:
      ppid = int(_read_stat(entry)[1])
    except (OSError, IndexError, ValueError):
      continue
    if ppid == parent_pid and is_worker(int(entry)):
      pids.append(int(entry))
  return pids


def end_child_workers() -> int:
  """Sends SIGKILL to this process's `worker_binary` children; returns how many were ended."""
  pids = child_worker_pids(os.getpid())
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  return len(pids)


def register_at_exit() -> None:
  """Ends this process's worker_binary children when the interpreter exits (once, however often it
  is called). A binary that exits through `os._exit` skips atexit hooks and calls
  `end_child_workers` itself."""
  global _registered
  if not _registered:
    atexit.register(end_child_workers)
    _registered = True


@contextlib.contextmanager
def ending_child_workers():
  """Runs its block, then ends the worker_binary children this process started (on an error too):
  `with worker_processes.ending_child_workers(): <a loop of TFF computations>`."""
  try:
    yield
  finally:
    end_child_workers()


_registered = False
