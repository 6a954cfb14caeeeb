"""The stop signals' handlers only record: a SIGINT / SIGTERM delivered while a garbage-collection
callback or an asyncio callback runs raises nothing there (an exception raised there would be
dropped, as the first test shows), and the run sees it at its next check; the library's check
(`dp_ftrl_tff.stopping`) is the active `StopSignals`'s; a second signal stops at once (a binary) or
gives the signals back (in-process); a signal before a binary's `StopSignals` is taken over by it.
The one line of a full disk names what was being written.
"""

import asyncio
import contextlib
import errno
import gc
import signal
import sys

import pytest

from dp_ftrl_tff import stopping
from dp_ftrl_tff.training import disk_full, stop_signals

pytestmark = pytest.mark.unit


@contextlib.contextmanager
def unraisable():
  """The exceptions Python reports as 'Exception ignored in: ...' (and drops) in the block (inside
  the test's call: pytest installs its own hook around it)."""
  seen, previous = [], sys.unraisablehook
  sys.unraisablehook = seen.append
  try:
    yield seen
  finally:
    sys.unraisablehook = previous


def _signal_in_gc_callback(signum):
  """Delivers `signum` to this process from inside a garbage-collection callback (where Python
  runs the handler: the next bytecode is the callback's)."""
  delivered = []

  def callback(phase, info):
    del info
    if phase == 'start' and not delivered:
      delivered.append(True)
      signal.raise_signal(signum)
      sum(range(10))  # a few bytecodes: the handler runs here, inside the callback

  gc.callbacks.append(callback)
  try:
    gc.collect()
  finally:
    gc.callbacks.remove(callback)
  assert delivered


def test_an_exception_raised_in_a_gc_callback_is_dropped():
  """Why handlers must not raise: what the old handler raised is dropped, the code goes on."""

  def raising(signum, frame):
    raise stop_signals.Interrupted(signum, 'stop')

  previous = signal.signal(signal.SIGTERM, raising)
  try:
    with unraisable() as dropped:
      _signal_in_gc_callback(signal.SIGTERM)  # returns normally: nothing reached this frame
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert [type(u.exc_value) for u in dropped] == [stop_signals.Interrupted]


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_a_gc_callback_is_recorded_and_seen_at_the_next_check(signum):
  with stop_signals.StopSignals() as stop, unraisable() as dropped:
    _signal_in_gc_callback(signum)
    assert stop.signum == signum and dropped == []
    with pytest.raises(stop_signals.Interrupted) as stopped:
      stop_signals.check()
  assert stopped.value.exit_code == 128 + signum
  assert str(stopped.value) == (f'Stopped by {signal.Signals(signum).name} during the start of '
                                'the run, before training: nothing is lost; rerun the same '
                                'command to resume.')


def test_a_signal_in_an_asyncio_callback_is_recorded_and_seen_at_the_next_check():
  errors = []

  async def main():
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    done = loop.create_future()

    def callback():
      signal.raise_signal(signal.SIGINT)
      sum(range(10))
      done.set_result(None)

    loop.call_soon(callback)
    await done

  with stop_signals.StopSignals() as stop:
    stop.where = stop_signals.finish_stage(5)
    asyncio.run(main())
    assert stop.signum == signal.SIGINT and errors == []
    with pytest.raises(stop_signals.Interrupted, match=r'^Stopped by SIGINT after round 5/5, '
                       r'before the run\'s report and summary were complete'):
      stop_signals.check()


def test_the_library_check_is_the_active_stop_signals_and_is_restored():
  stopping.check()  # none installed: nothing
  with stop_signals.StopSignals() as stop:
    assert stop_signals.active() is stop
    stopping.check()  # nothing recorded
    stop.signum = signal.SIGTERM
    with pytest.raises(stop_signals.Interrupted):
      stopping.check()
    with stopping.stop_check(None):  # e.g. the drivers' rounds, which stop after the round
      stopping.check()
    with pytest.raises(stop_signals.Interrupted):
      stopping.check()
    with stop_signals.watching() as same:
      assert same is stop
    with pytest.raises(RuntimeError, match='already active'):
      stop_signals.StopSignals().__enter__()
  assert stop_signals.active() is None
  stopping.check()


def test_handlers_are_restored_and_a_second_signal_in_process_gives_them_back():
  before = {s: signal.getsignal(s) for s in stop_signals.SIGNALS}
  with stop_signals.StopSignals() as stop:
    signal.raise_signal(signal.SIGINT)
    assert stop.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) == stop._handle  # pylint: disable=protected-access
    signal.raise_signal(signal.SIGINT)  # the second: a third would act as without us
    assert {s: signal.getsignal(s) for s in stop_signals.SIGNALS} == before
    assert stop.signum == signal.SIGINT
  assert {s: signal.getsignal(s) for s in stop_signals.SIGNALS} == before


def test_a_second_signal_of_a_binary_stops_at_once(monkeypatch):
  exits = []
  monkeypatch.setattr(stop_signals, '_exit_now', exits.append)
  with stop_signals.StopSignals(exit_on_second=True) as stop:
    signal.raise_signal(signal.SIGTERM)
    assert exits == [] and stop.signum == signal.SIGTERM
    signal.raise_signal(signal.SIGINT)
    assert exits == [signal.SIGINT]


def test_a_signal_before_the_binary_s_stop_signals_is_taken_over(monkeypatch):
  before = {s: signal.getsignal(s) for s in stop_signals.SIGNALS}
  try:
    stop_signals.record_early()
    signal.raise_signal(signal.SIGTERM)
    with stop_signals.StopSignals() as stop:
      assert stop.signum == signal.SIGTERM
      with pytest.raises(stop_signals.Interrupted):
        stop_signals.check()
    with stop_signals.StopSignals() as stop:  # taken over once
      assert stop.signum is None
  finally:
    for signum, handler in before.items():
      signal.signal(signum, handler)


def test_a_full_disk_names_what_was_being_written(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  run = str(tmp_path / 'run')
  checkpoint = tf.errors.ResourceExhaustedError(
      None, None, f'{run}/checkpoints/program_state_1_temp1376/saved_model.pb.tmp26ae; No space '
      'left on device')
  line = disk_full.disk_full_message(checkpoint)
  assert line.startswith('the disk is full (No space left on device) while writing the checkpoint '
                         f'after round 1 ({run}/checkpoints/program_state_1_temp1376/saved_model.'
                         'pb.tmp26ae). Nothing is lost: free space and rerun the same command; it '
                         "resumes from the run's last complete checkpoint, if any"), line
  for name, what in (('participation.csv', 'the participation log'),
                     ('metrics.csv_temp123', 'the metrics'),
                     ('checkpoints/record_4.json', 'the record of the checkpoint after round 4'),
                     ('privacy_report/report.md.77.tmp', 'the privacy report'),
                     ('summary.json', 'the completion marker'), ('plan.json', "the run's settings"),
                     ('model/training_checkpoint_round_6_temp12/variables/x', 'the final model')):
    error = OSError(errno.ENOSPC, 'No space left on device', f'{run}/{name}')
    assert f'while writing {what} ({run}/{name})' in disk_full.disk_full_message(error), name
  assert 'while writing a run file.' in disk_full.disk_full_message(OSError(errno.EDQUOT, 'quota'))
  assert disk_full.disk_full_message(OSError(errno.EACCES, 'Permission denied', run)) is None
  assert disk_full.disk_full_message(ValueError('no')) is None


def test_an_append_on_a_full_disk_names_its_file():
  """/dev/full fails every write with ENOSPC, as a full disk does, naming no file."""
  from dp_ftrl_tff import _atomic  # pylint: disable=g-import-not-at-top

  with pytest.raises(OSError) as failed, _atomic.naming('/dev/full'), open('/dev/full', 'w') as f:
    f.write('client,0\n')
    f.flush()
  assert failed.value.errno == errno.ENOSPC and failed.value.filename == '/dev/full'
  assert 'while writing /dev/full. Nothing is lost' in disk_full.disk_full_message(failed.value)
