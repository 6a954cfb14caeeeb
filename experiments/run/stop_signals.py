"""Graceful stop of a training run on SIGINT / SIGTERM.

`StopSignals` (a context manager around a run) installs handlers for SIGINT and SIGTERM:
  * while rounds run (`training` set by the loop), a first signal only sets a flag: the loop
    finishes the current round, saves a checkpoint and raises `Interrupted`; a second signal raises
    `Interrupted` at once (the last checkpoint is intact: checkpoints are renamed into place);
  * outside the rounds (setup, the final report) a signal raises `Interrupted` at once.
The drivers turn `Interrupted` into one logged line, end their TFF worker_binary children and exit
with 128 + signal number: 130 for SIGINT, 143 for SIGTERM. A later run on the same directory
resumes from the last checkpoint, bit-identically to an uninterrupted run. Handlers are only
installed in the main thread, and the previous ones are restored on exit.
"""

import signal
import threading
from typing import Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


class StopSignals:
  """SIGINT / SIGTERM handling of one run (see the module docstring)."""

  def __init__(self):
    self._previous = {}
    #: Set by the loop while rounds run: a first signal then only sets the flag.
    self.training = False
    self.signum: Optional[int] = None

  @property
  def requested(self) -> bool:
    """Whether a stop signal arrived."""
    return self.signum is not None

  def __enter__(self) -> 'StopSignals':
    if threading.current_thread() is threading.main_thread():
      for signum in SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    first = self.signum is None
    self.signum = signum
    if self.training and first:
      return
    where = 'during training (second signal)' if self.training else 'outside the training rounds'
    raise Interrupted(signum, f'Stopped by {signal_name(signum)} {where}; the last checkpoint is '
                              'kept: rerun the same command to resume.')


def install_immediate_stop() -> None:
  """Makes SIGINT and SIGTERM raise `Interrupted` at once (a driver before and after its run), so
  that the driver's exit path ends its worker_binary children. Main thread only."""
  if threading.current_thread() is threading.main_thread():
    StopSignals().__enter__()


def stopped_message(signum: int, done: int, num_rounds: int) -> str:
  """The line logged when a signal stopped a run after `done` rounds (checkpoint saved)."""
  return (f'Stopped by {signal_name(signum)} after round {done}/{num_rounds}: checkpoint '
          f'program_state_{done} saved; rerun the same command to resume.')
