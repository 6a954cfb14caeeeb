"""The run directory's safety: one run at a time, atomic files, repairable logs, no stray workers.

A driver run owns `<root_output_dir>/<experiment_name>/` through `RunDirectory`:
  * `run.lock`: an exclusive `fcntl.flock` held for the whole run, with the holder's PID written in
    it. A second run on the same directory stops with `RunDirLockedError` naming that PID (the
    drivers print it as one line and exit with status 1). The kernel releases the lock when the
    holder dies, even by SIGKILL, so a stale lock file never blocks a resume.
  * Atomic writes (`dp_ftrl_tff._atomic`): a temp file in the same directory,
    fsynced, then `os.replace`d into place; a killed run leaves the old file or the new one, never
    half of one. `hparams.json`, `plan.json` and `mechanism.json` / `.npz` are written so.
  * Append-only logs (`participation.csv`, `metrics.csv`): a run killed during an append can leave
    a torn last line (no trailing newline, or a row that does not parse); `drop_torn_last_line`
    drops it on resume with a logged warning. Rows of rounds that were not checkpointed are dropped
    on resume (`checkpoint_records.trim_files`, the CSV release manager's key order).
  * `workers.json`: the PIDs (and start times) of the TFF `worker_binary` children of the run's
    process. A run that was SIGKILLed leaves its workers alive (re-parented); the next run on the
    directory ends the recorded ones whose parent is dead (`end_stale_workers`).
  * Stale temp files and directories of interrupted writes (`checkpoints/program_state_<r>_temp<k>`
    of `tff.program.FileProgramStateManager`, `metrics.csv_temp<k>` of its CSV release manager,
    `model/<key>_temp<k>` of train_model's model release, `*.tmp` of ours, also in
    `privacy_report/`) are removed at start (`remove_stale_temps`).
  * A full disk: every write above leaves the last checkpoint's state readable, and
    `dp_ftrl_tff.training.disk_full` says so in the one line of a failed write.

The names of the run's files are here too (`PLAN_FILE`, `HPARAMS_FILE`, `PARTICIPATION_FILE`,
`METRICS_FILE`, `REPORT_DIR`), with the readers of what a report takes from `metrics.csv` (the
drivers at the end of a run and `experiments.privacy_report --plan` alike): `read_secure_segments`
(a SecAgg run's segments and wrapped rounds) and `read_final_clip` (adaptive clipping's last clip),
re-exported from `dp_ftrl_tff.accounting.run_metrics`.

`RunDirError` (not a ValueError) is what a run cannot recover from by itself: a locked directory or
a corrupt run file; it names the path and what to do. Linux only for the worker parts (/proc).
"""

import contextlib
import csv
import errno
import fcntl
import io
import json
import os
import re
import shutil
import signal
import time
from typing import Callable, Optional, Sequence

from absl import logging

from dp_ftrl_tff import _atomic
from dp_ftrl_tff.accounting import run_metrics
from dp_ftrl_tff.learning import worker_processes

LOCK_FILE = 'run.lock'
WORKERS_FILE = 'workers.json'
PLAN_FILE = 'plan.json'
HPARAMS_FILE = 'hparams.json'
PARTICIPATION_FILE = 'participation.csv'
METRICS_FILE = 'metrics.csv'
REPORT_DIR = 'privacy_report'
# The metric names and readers of what a report takes from metrics.csv live in the library (a
# tff.program program's report release reads them without importing experiments); re-exported.
MODULAR_WRAP_METRIC = run_metrics.MODULAR_WRAP_METRIC
CLIP_METRIC = run_metrics.CLIP_METRIC
read_secure_segments = run_metrics.read_secure_segments
read_final_clip = run_metrics.read_final_clip

# Temp names of tff.program's file writers (`<path>_temp<random>`) and of ours (`<name>.<x>.tmp`,
# `<name>.tmp`).
_STALE_TEMP = re.compile(r'(_temp\d+$)|(\.tmp$)')


class RunDirError(RuntimeError):
  """The run directory cannot be used as it is (locked by another run, a corrupt run file). The
  message is one line naming the path and what to do; the drivers exit with status 1."""


class RunDirLockedError(RunDirError):
  """Another live run holds the run directory's lock."""


class CorruptRunFileError(RunDirError):
  """A run file (hparams.json, plan.json, the mechanism file) cannot be read."""


def corrupt_file_error(path: str, problem, remedy: str) -> CorruptRunFileError:
  """A `CorruptRunFileError` naming `path`, the `problem` and the `remedy`, on one line."""
  problem = ' '.join(str(problem).split())
  return CorruptRunFileError(f'{path} is corrupt ({problem}); {remedy}')


# ------------------------------------------------------------------------------------------------
# Atomic writes.


def read_json(path: str, remedy: str):
  """The JSON document at `path`; `CorruptRunFileError` (naming `path` and `remedy`) if it is not
  valid JSON."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as error:
    raise corrupt_file_error(path, f'not valid JSON: {error}', remedy) from error


# ------------------------------------------------------------------------------------------------
# Append-only CSV logs.


def drop_torn_last_line(path: str, key_field: str,
                        row_ok: Optional[Callable[[Sequence[str], Sequence[str]], bool]] = None
                        ) -> bool:
  """Drops the last line of the CSV log at `path` if it is torn; returns whether it did.

  Torn: no trailing newline, a field count other than the header's, or a `key_field` that is not an
  integer (or `row_ok(header, row)` false). The drop is logged as a warning naming the file. A file
  whose header itself is torn (no newline at all) is removed: it held no rows.
  """
  if not os.path.isfile(path):
    return False
  with open(path, 'rb') as f:
    data = f.read()
  if not data:
    return False
  header_end = data.find(b'\n')
  if header_end < 0:
    logging.warning('%s: its header line is torn (the run was killed while creating it); '
                    'removed it, it held no rows.', path)
    os.remove(path)
    return True
  body_start = header_end + 1
  if data.endswith(b'\n'):
    last_start = data.rfind(b'\n', body_start - 1, len(data) - 1) + 1
    if last_start <= header_end:  # header only
      return False
    last = data[last_start:]
    reason = _row_problem(data[:header_end], last, key_field, row_ok)
    if reason is None:
      return False
  else:
    last_start = data.rfind(b'\n') + 1
    last = data[last_start:]
    reason = 'no trailing newline'
  _atomic.write_bytes(path, data[:last_start])
  shown = last.decode('utf-8', 'replace').rstrip('\r\n')
  if len(shown) > 80:
    shown = shown[:77] + '...'
  logging.warning('%s: dropped its torn last line %r (%s): the run was killed while appending it; '
                  'the round it belongs to is redone.', path, shown, reason)
  return True


def _row_problem(header: bytes, line: bytes, key_field: str, row_ok) -> Optional[str]:
  try:
    fields = next(csv.reader(io.StringIO(header.decode('utf-8').rstrip('\r'))), [])
    row = next(csv.reader(io.StringIO(line.decode('utf-8').rstrip('\r\n'))), [])
  except (UnicodeDecodeError, csv.Error) as error:
    return f'does not parse: {error}'
  if not row:
    return None  # a blank line
  if len(row) != len(fields):
    return f'{len(row)} fields, the header has {len(fields)}'
  if key_field in fields:
    try:
      int(row[fields.index(key_field)])
    except ValueError:
      return f'its {key_field!r} is not an integer'
  if row_ok is not None and not row_ok(fields, row):
    return 'does not parse'
  return None


# ------------------------------------------------------------------------------------------------
# The run directory.


def _missing_directories(path: str) -> list:
  """`path` and its ancestors that do not exist yet, deepest first."""
  missing = []
  path = os.path.abspath(path)
  while not os.path.isdir(path):
    missing.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return missing


class RunDirectory:
  """Exclusive use of a run directory (see the module docstring).

  Usage: `acquire()` before reading the directory's state; `release()` at the end (or let the
  process exit: the kernel drops the lock). `acquire` may create the directory (with `run.lock`
  only, and the missing directories above it); if the run then fails its checks,
  `release(remove_if_created=True)` removes what it created, so a failed start leaves nothing behind.
  """

  def __init__(self, path: str):
    self._path = os.fspath(path)
    self._fd = None
    self._created = []  # the directories `acquire` created, deepest first
    self._recorded_workers = None

  @property
  def path(self) -> str:
    return self._path

  @property
  def lock_path(self) -> str:
    return os.path.join(self._path, LOCK_FILE)

  def acquire(self) -> None:
    """Takes the exclusive lock and writes this process's PID in `run.lock`.

    Raises:
      RunDirLockedError: another live process holds the lock (its PID in the message).
    """
    if self._fd is not None:
      return
    self._created = _missing_directories(self._path)
    os.makedirs(self._path, exist_ok=True)
    # os.open's descriptors are close-on-exec (PEP 446): the worker_binary children that TFF
    # starts do not inherit the lock, so an orphaned worker never keeps a directory locked.
    fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        os.close(fd)
        raise
      holder = ''
      for _ in range(20):  # the holder writes its PID right after locking
        holder = os.pread(fd, 64, 0).decode('ascii', 'replace').strip()
        if holder:
          break
        time.sleep(0.05)
      os.close(fd)
      holder = holder or 'unknown'
      raise RunDirLockedError(
          f'{self._path} is in use by another run (PID {holder}, see {self.lock_path}); wait for '
          'it to finish or stop it, or use another --experiment_name.') from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()}\n'.encode('ascii'), 0)
    self._fd = fd

  def release(self, remove_if_created: bool = False) -> None:
    """Drops the lock; with `remove_if_created`, removes a directory `acquire` created if it holds
    nothing but the lock file, and the empty directories above it that `acquire` created."""
    if self._fd is None:
      return
    if remove_if_created and self._created and os.listdir(self._path) == [LOCK_FILE]:
      with contextlib.suppress(OSError):
        os.remove(self.lock_path)
        for directory in self._created:
          os.rmdir(directory)  # OSError (not empty: another run started there) ends the removal
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None

  def remove_stale_temps(self) -> list:
    """Removes the temp files and directories of writes an earlier run did not finish (a killed
    run's, or one that found the disk full: `checkpoints/program_state_<r>_temp<k>`,
    `metrics.csv_temp<k>`, `model/<key>_temp<k>`, `*.tmp` (also in `privacy_report/`)); returns
    their paths. Call it with the lock held."""
    removed = []
    for directory in (self._path, os.path.join(self._path, 'checkpoints'),
                      os.path.join(self._path, 'model'), os.path.join(self._path, REPORT_DIR)):
      if not os.path.isdir(directory):
        continue
      for name in sorted(os.listdir(directory)):
        if not _STALE_TEMP.search(name):
          continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
          shutil.rmtree(path, ignore_errors=True)
        else:
          with contextlib.suppress(OSError):
            os.remove(path)
        removed.append(path)
    if removed:
      logging.warning('Removed %d unfinished temp file(s) of an interrupted earlier run: %s',
                      len(removed), ', '.join(removed))
    return removed

  # -- worker_binary processes --------------------------------------------------------------------

  @property
  def workers_path(self) -> str:
    return os.path.join(self._path, WORKERS_FILE)

  def end_stale_workers(self) -> list:
    """Ends the `worker_binary` processes recorded by an earlier run of this directory that are
    still alive while that run's process is dead (it was SIGKILLed); returns their PIDs."""
    try:
      with open(self.workers_path, encoding='utf-8') as f:
        record = json.load(f)
      parent = int(record['pid'])
      parent_start = record.get('start')
      workers = [(int(w['pid']), w.get('start')) for w in record['workers']]
    except FileNotFoundError:
      return []
    except (ValueError, KeyError, TypeError) as error:
      logging.warning('%s is unreadable (%s); ignored.', self.workers_path, error)
      return []
    if _alive(parent, parent_start):
      # This process's own workers (an earlier run in the same process shares them), or a live
      # run's (not with the lock held).
      return []
    ended = []
    for pid, start in workers:
      if pid == os.getpid() or not _alive(pid, start) or not worker_processes.is_worker(pid):
        continue
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
        ended.append(pid)
    if ended:
      logging.warning('Ended %d worker_binary process(es) left by an earlier run of %s that was '
                      'killed (PID %d): %s.', len(ended), self._path, parent,
                      ', '.join(map(str, ended)))
    return ended

  def record_workers(self) -> None:
    """Writes this process's current `worker_binary` children to `workers.json` (if they changed
    since the last call)."""
    pids = sorted(worker_processes.child_worker_pids(os.getpid()))
    if pids == self._recorded_workers:
      return
    record = {'pid': os.getpid(), 'start': worker_processes.start_time(os.getpid()),
              'workers': [{'pid': pid, 'start': worker_processes.start_time(pid)} for pid in pids]}
    _atomic.write_text(self.workers_path, json.dumps(record, indent=2) + '\n')
    self._recorded_workers = pids


def _alive(pid: int, start) -> bool:
  """Whether process `pid` exists and (if `start` is known) is the one that started at `start`."""
  now = worker_processes.start_time(pid)
  return now is not None and (start is None or now == start)
