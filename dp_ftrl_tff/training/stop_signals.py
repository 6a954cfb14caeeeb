"""Stops of a run on SIGINT / SIGTERM, at safe points: a handler only records the signal.

Python runs a signal handler between two bytecodes of the main thread, wherever it is: inside a
garbage-collection callback (jax's `_xla_gc_callback`), an asyncio done-callback, a `__del__`. An
exception raised there is printed as "Exception ignored in: ..." and dropped, and the run goes on
(seen: a SIGTERM during the start of a BLT run was dropped so, and training went on for hundreds
of rounds). So `StopSignals` handlers never raise: the first signal is recorded, and the run asks at
its safe points, where `Interrupted` is raised in the run's own code:
  * between the steps of a start (`check()`): the flags, the task, the lock, the resume checks,
    the strategy, the plan, the header, the process, the execution context, the run files, the
    first checkpoint; inside the library's long computations (an optimizer run at start, a
    calibration, the equal-privacy table: `dp_ftrl_tff.stopping`, whose check `StopSignals`
    installs). The line: "Stopped by SIGTERM during the start of the run, before training: ...";
  * between rounds: the training loop (`dp_ftrl_tff.training.training_loop`) stops train_model through
    its data source's check before it draws the next round, lets the last round's releases and
    checkpoint finish, and raises `Interrupted` with `stopped_message`;
  * between the steps of the end (the final evaluation, the privacy report, the summary: `check()`;
    the report's own computations through `dp_ftrl_tff.stopping`): "Stopped by SIGTERM after round
    n/n, before the run's report and summary were complete: ...". A signal after summary.json was
    written (the run is finished) changes nothing.
The drivers turn `Interrupted` into one line on stderr, end their TFF worker_binary children and exit
with 128 + the signal number: 130 for SIGINT, 143 for SIGTERM. A rerun of the same command resumes
from the last checkpoint, bit-identically to an uninterrupted run.

A second signal (any signal of the two, once one was recorded) stops at once, when the binary
asked for it (`StopSignals(exit_on_second=True)`: the drivers, for their whole
life): the handler ends the process's worker_binary children, writes one line to stderr and leaves
with `os._exit(128 + signum)`, raising nothing. The run directory is then as after a SIGKILL, which
a rerun resumes from: checkpoints and records are renamed into place, torn log lines are dropped
(`dp_ftrl_tff.training.run_dir`). In-process (a test, a notebook calling `training_loop.run`), a second
signal instead restores the handlers that were there before, so a third one acts as without us.

Handlers are installed only in the main thread, and the previous ones are restored on exit. One
`StopSignals` is active per process (`active()`); `watching()` gives it, or installs one for a block.
A binary's `__main__` calls `record_early()` before its imports (about 2 s), so that a signal that
arrives before its `StopSignals` is entered is recorded too (and taken over by it).
"""

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator, Optional

from dp_ftrl_tff import stopping
from dp_ftrl_tff.learning import worker_processes

SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: Where a stop seen at a `check()` leaves the run, by stage (`StopSignals.where`).
START = ('during the start of the run, before training: nothing is lost; rerun the same command to '
         'resume')


def finish_stage(num_rounds: int) -> str:
  """`StopSignals.where` after the last round of a run of `num_rounds` rounds."""
  return (f'after round {num_rounds}/{num_rounds}, before the run\'s report and summary were '
          'complete: its last checkpoint is kept; rerun the same command to finish them')


class Interrupted(BaseException):  # like KeyboardInterrupt: not swallowed by `except Exception`
  """A run stopped by a signal. `exit_code` is 128 + the signal number; str() is one line."""

  def __init__(self, signum: int, message: str):
    super().__init__(message)
    self.signum = signum
    self.exit_code = 128 + signum


def signal_name(signum: int) -> str:
  try:
    return signal.Signals(signum).name
  except ValueError:
    return f'signal {signum}'


_active: Optional['StopSignals'] = None
_early_signum: Optional[int] = None


def record_early() -> None:
  """Records SIGINT / SIGTERM from now on, for the `StopSignals` a binary enters later (which takes
  the recorded signal over); a second signal stops at once. For a binary's `__main__`, before its
  imports; main thread only."""

  def handle(signum, frame) -> None:
    global _early_signum
    del frame
    if _early_signum is None:
      _early_signum = signum
    else:
      _exit_now(signum)

  for signum in SIGNALS:
    signal.signal(signum, handle)


def active() -> Optional['StopSignals']:
  """The process's active `StopSignals`, or None."""
  return _active


def check() -> None:
  """A safe point: raises `Interrupted` if the active `StopSignals` recorded a signal (else, and
  without one, nothing)."""
  if _active is not None:
    _active.check()


@contextlib.contextmanager
def watching() -> Iterator['StopSignals']:
  """The active `StopSignals` (a binary's), or one installed for the block (an in-process run)."""
  if _active is not None:
    yield _active
  else:
    with StopSignals() as stop:
      yield stop


class StopSignals:
  """SIGINT / SIGTERM of a process, recorded for its safe points (see the module docstring).

  Attributes:
    signum: the first signal recorded, or None.
    where: what a stop at a `check()` says and leaves (`START` until the run's end sets
      `finish_stage`).
  """

  def __init__(self, exit_on_second: bool = False):
    self._exit_on_second = exit_on_second
    self._previous = {}
    self._scope = None
    self.signum: Optional[int] = None
    self.where = START

  @property
  def requested(self) -> bool:
    """Whether a stop signal arrived."""
    return self.signum is not None

  def check(self) -> None:
    """Raises `Interrupted` (its message from `where`) if a signal was recorded."""
    if self.signum is not None:
      raise Interrupted(self.signum, f'Stopped by {signal_name(self.signum)} {self.where}.')

  def __enter__(self) -> 'StopSignals':
    global _active, _early_signum
    if _active is not None:
      raise RuntimeError('a StopSignals is already active in this process; use watching().')
    self.signum, _early_signum = _early_signum, None
    if threading.current_thread() is threading.main_thread():
      for signum in SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    self._scope = contextlib.ExitStack()
    self._scope.enter_context(stopping.stop_check(self.check))
    _active = self
    return self

  def __exit__(self, *exc_info) -> None:
    global _active
    _active = None
    self._scope.close()
    self._restore()

  def _restore(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    """Records the first signal; a second one stops the process at once or (in-process) restores
    the previous handlers. Raises nothing."""
    del frame
    if self.signum is None:
      self.signum = signum
    elif self._exit_on_second:
      _exit_now(signum)
    else:
      self._restore()


def _exit_now(signum: int) -> None:
  """The second signal's stop: ends this process's worker_binary children, writes one line and
  `os._exit`s, as a kill would but with the exit status 128 + `signum`. Only calls that are safe
  wherever the main thread was: no logging (its locks), no buffered stream that the interrupted
  code may be writing (a reentrant write raises); stdout is flushed if it can be."""
  worker_processes.end_child_workers()
  with contextlib.suppress(Exception):
    sys.stdout.flush()
  line = (f'Stopped by {signal_name(signum)} at once (a second stop signal); the last checkpoint '
          'is kept: rerun the same command to resume.\n')
  with contextlib.suppress(OSError):
    os.write(2, line.encode())
  os._exit(128 + signum)


def stopped_message(signum: int, done: int, num_rounds: int) -> str:
  """The line logged when a signal stopped a run after `done` rounds (checkpoint saved)."""
  return (f'Stopped by {signal_name(signum)} after round {done}/{num_rounds}: checkpoint '
          f'program_state_{done} saved; rerun the same command to resume.')
