"""A stop signal at every safe point of a run, and a full disk, in-process: the EMNIST driver (its
`main`, `binaries.run_in_process`) stops with one line and exit status 130 / 143 (1 for a full
disk), and a chain of reruns ends with the uninterrupted run's checkpoint, metrics and
participation log.

The reference run counts the safe points (`stop_signals.check` calls) of its start and of its end.
Then one chain of runs on one directory, each stopped by a signal delivered through the real
handler (`signal.raise_signal`): at the 3rd objective evaluation of the BLT optimizer of the fresh
start (`dp_ftrl_tff.stopping`); at start point j of run j, for every j; before the second round the
run trains (the data source's check stops train_model there); then a full disk at the checkpoint
after round 2 (TensorFlow's error, after a partial temp directory: the save is a background task of
train_model) and at the participation log's second append (its fsync fails with ENOSPC); at end
point j of run j, for every j; then the rerun that finishes.

Cost: the runs' starts. Tiny settings (3 rounds, 30 synthetic clients, BLT with one buffer, no noise:
no privacy report, whose library checks `tests/stopping_test.py` covers), and the DP-FTRL process
(its composition over client ids and the asynchronous context, whose first computation starts a
worker_binary) built once (the stops after them are still exercised).
"""

import errno
import os
import signal
import sys

import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.program import file_utils

from dp_ftrl_tff import stopping
from dp_ftrl_tff.learning import dp_ftrl
from dp_ftrl_tff.programs import client_ids, data_source
from dp_ftrl_tff.training import stop_signals
from tests.testing import binaries, run_files

pytestmark = pytest.mark.integration

ROUNDS = 3
COMMON = ('--model=tiny', '--mechanism=blt', '--num_buffers=1', '--noise_multiplier=0',
          f'--rounds={ROUNDS}', '--clients_per_round=3', '--synthetic_num_clients=30',
          '--synthetic_examples_per_client=8', '--client_batch_size=8', '--min_sep=2', '--seed=1',
          '--noise_seed=3', '--eval_max_examples=64', '--checkpoint_every=1')
ARGS = COMMON + ('--eval_every=100', '--canary_clients=2')


class SignalAt:
  """Delivers a signal to this process, through the handler of the active `StopSignals`, at the
  `at`-th call of `module.name` made from `caller` (a module name; None: any), then makes the call;
  at=None: only records (stage, caller) of each call."""

  def __init__(self, monkeypatch, module, name, at=None, signum=signal.SIGTERM, caller=None):
    real = getattr(module, name)
    self.calls = []

    def wrapped(*args, **kwargs):
      stop = stop_signals.active()
      source = sys._getframe(1).f_globals.get('__name__')  # pylint: disable=protected-access
      if caller is None or source == caller:
        self.calls.append((stop.where if stop else None, source))
        if len(self.calls) == at:
          assert signal.getsignal(signum) == stop._handle  # pylint: disable=protected-access
          signal.raise_signal(signum)
      return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


def full_disk_at_checkpoint(patch, version):
  """The checkpoint after round `version` fails as on a full disk: a partial temp directory, then
  TensorFlow's error (not an OSError) naming the file it was writing."""
  real = file_utils.write_saved_model

  async def write(value, path, overwrite=False):
    if os.path.basename(os.fspath(path)) == f'program_state_{version}':
      partial = os.path.join(f'{path}_temp1234', 'saved_model.pb.tmp5678')
      os.makedirs(os.path.dirname(partial), exist_ok=True)
      with open(partial, 'wb') as f:
        f.write(b'partial')
      raise tf.errors.ResourceExhaustedError(None, None, f'{partial}; No space left on device')
    return await real(value, path, overwrite)

  patch.setattr(file_utils, 'write_saved_model', write)


def full_disk_at_log(patch, at):
  """The `at`-th append to participation.csv fails as on a full disk: its fsync raises ENOSPC
  (naming no file)."""
  real, appends = os.fsync, []

  def fsync(fd):
    if os.readlink(f'/proc/self/fd/{fd}').endswith('participation.csv'):
      appends.append(fd)
      if len(appends) == at:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(fd)

  patch.setattr(os, 'fsync', fsync)


def _run(root, name):
  return binaries.run_in_process(binaries.EMNIST, (f'--root_output_dir={root}',
                                                   f'--experiment_name={name}', *ARGS), files=True)


def _assert_same_run(run, expected):
  run_files.assert_same_leaves(run_files.checkpoint_leaves(run, ROUNDS),
                               run_files.checkpoint_leaves(expected, ROUNDS))
  assert run_files.metrics_rows(run) == run_files.metrics_rows(expected)
  assert (run_files.read_bytes(os.path.join(run, 'participation.csv'))
          == run_files.read_bytes(os.path.join(expected, 'participation.csv')))
  assert os.path.isfile(os.path.join(run, 'summary.json'))
  for directory in (run, os.path.join(run, 'checkpoints')):
    assert not [n for n in os.listdir(directory) if '_temp' in n or n.endswith('.tmp')]


def _once(monkeypatch, module, name):
  """`module.name` builds once per test: every run of a chain has the same settings, hence the
  same process."""
  real, built = getattr(module, name), []

  def build(*args, **kwargs):
    if not built:
      built.append(real(*args, **kwargs))
    return built[0]

  monkeypatch.setattr(module, name, build)


@pytest.mark.slow
def test_a_stop_at_every_safe_point_and_a_full_disk_then_the_rerun_equals_the_uninterrupted_run(
    tmp_path, monkeypatch):
  _once(monkeypatch, dp_ftrl, 'build_dp_ftrl_process')
  # The process over client ids and the asynchronous context (each starts a worker_binary at its
  # first computation).
  _once(monkeypatch, client_ids, 'process_over_client_ids')
  _once(monkeypatch, tff.backends.native, 'create_async_local_cpp_execution_context')
  with monkeypatch.context() as patch:
    points = SignalAt(patch, stop_signals, 'check')
    code, _, err = _run(tmp_path, 'reference')
  assert code == 0, err
  stages = [stage for stage, _ in points.calls]
  start = stages.count(stop_signals.START)
  end = len(stages) - start
  assert start >= 12 and end >= 2, points.calls
  assert stages == [stop_signals.START] * start + [stop_signals.finish_stage(ROUNDS)] * end

  def round_link(patch, signum):  # the data source's check before the second round of the run
    SignalAt(patch, stopping, 'check', 2, signum, caller=data_source.__name__)

  def point(j):
    return lambda patch, signum: SignalAt(patch, stop_signals, 'check', j, signum)

  links = ([('the BLT optimizer', 'start', lambda p, s: SignalAt(p, stopping, 'check', 3, s))]
           + [(f'start point {j}', 'start', point(j)) for j in range(1, start + 1)]
           + [('a round', 'round', round_link)]
           + [('a full disk at a checkpoint', 'the checkpoint after round 2',
               lambda p, s: full_disk_at_checkpoint(p, 2)),
              ('a full disk at the log', 'the participation log',
               lambda p, s: full_disk_at_log(p, 2))]
           + [(f'end point {j}', 'end', point(start + j)) for j in range(1, end + 1)])
  for i, (where, stage, deliver) in enumerate(links):
    signum = (signal.SIGTERM, signal.SIGINT)[i % 2]
    with monkeypatch.context() as patch:
      deliver(patch, signum)
      code, _, err = _run(tmp_path, 'run')
    name = signal.Signals(signum).name
    assert 'Traceback' not in err and 'Exception ignored' not in err, (where, err[-2000:])
    if where.startswith('a full disk'):  # `stage`: what was being written
      assert code == 1, f'{where}: {err[-2000:]}'
      lines = [line for line in err.splitlines() if ': error: ' in line]
      assert len(lines) == 1 and lines[0].split(': error: ')[1].startswith(
          f'the disk is full (No space left on device) while writing {stage} ({tmp_path}/run/'), (
              where, err[-2000:])
      assert 'Nothing is lost: free space and rerun the same command' in lines[0]
      continue
    assert code == 128 + signum, f'{where}: {err[-2000:]}'
    stopped = [line for line in err.splitlines() if line.startswith('Stopped by')]
    expected = {'start': f'Stopped by {name} during the start of the run, before training',
                'round': f'Stopped by {name} after round ',
                'end': f'Stopped by {name} after round {ROUNDS}/{ROUNDS}, before the run\'s '
                       'report and summary were complete'}[stage]
    assert len(stopped) == 1 and stopped[0].startswith(expected), (where, err[-2000:])
  code, _, err = _run(tmp_path, 'run')
  assert code == 0, err
  _assert_same_run(str(tmp_path / 'run'), str(tmp_path / 'reference'))
