"""Checkpoint records on hand-made run directories (no training): which checkpoint a resume trusts,
what it refuses, what it trims. The drivers' and the program's damage tables run end to end in
run_dir_test.py and program_restart_test.py."""

import dataclasses
import json
import logging as std_logging
import os
import shutil

import pytest

from dp_ftrl_tff.training import checkpoint_records as records
from dp_ftrl_tff.training import record_checks, run_config, run_dir
from tests.testing import runs

pytestmark = pytest.mark.unit

CONFIG = runs.tiny_config('/x', experiment_name='a', noise_multiplier=1.0)
SETTINGS = run_config.hparams_document(CONFIG)
PLAN = {'noise_multiplier': 1.0, 'num_rounds': 6, 'clip_norm': 1.0}
RUN_ID = '0123456789abcdef' * 2


def _write(path, data: bytes):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(data)


def _checkpoint(run, round_num, log: bytes, metrics: bytes):
  """A fake checkpoint of `round_num` with the logs as they were then, and its record."""
  _write(os.path.join(records.checkpoint_path(run, round_num), 'state.bin'), b'state %d' % round_num)
  _write(os.path.join(run, run_dir.PARTICIPATION_FILE), log)
  _write(os.path.join(run, run_dir.METRICS_FILE), metrics)
  records.write_record(run, round_num, SETTINGS, PLAN, RUN_ID)


LOG = [b'client_id,round\n', b'c1,0\nc2,0\n', b'c3,1\nc1,1\n', b'c2,2\nc3,2\n']
METRICS = [b'round,loss\n', b'0,2.5\n', b'1,2.0\n', b'2,1.5\n']


@pytest.fixture(name='run')
def _run(tmp_path):
  """A run with checkpoints 1 and 2, then round 2's rows (not checkpointed)."""
  run = str(tmp_path / 'run')
  for r in (1, 2):
    _checkpoint(run, r, b''.join(LOG[:r + 1]), b''.join(METRICS[:r + 1]))
  _write(os.path.join(run, run_dir.PARTICIPATION_FILE), b''.join(LOG))
  _write(os.path.join(run, run_dir.METRICS_FILE), b''.join(METRICS))
  return run


def test_the_latest_intact_checkpoint_is_chosen_and_the_logs_are_trimmed_to_it(run):
  resumption = records.find_resumption(run)
  assert (resumption.round_num, resumption.untrusted) == (2, ())
  assert record_checks.check_files(run, resumption) == []
  records.trim_files(run, resumption)
  with open(os.path.join(run, run_dir.PARTICIPATION_FILE), 'rb') as f:
    assert f.read() == b''.join(LOG[:3])


@pytest.mark.parametrize('damage', ['record deleted', 'record not JSON', 'checkpoint altered'])
def test_a_checkpoint_without_an_intact_record_is_set_aside(run, damage):
  if damage == 'record deleted':
    os.remove(records.record_path(run, 2))
  elif damage == 'record not JSON':
    _write(records.record_path(run, 2), b'{"format": ')
  else:
    _write(os.path.join(records.checkpoint_path(run, 2), 'state.bin'), b'state of another run')
  resumption = records.find_resumption(run)
  assert resumption.round_num == 1 and [r for r, _ in resumption.untrusted] == [2]
  records.set_aside(run, resumption)
  assert os.listdir(os.path.join(records.checkpoints_dir(run), records.SET_ASIDE_DIR)) == [
      'program_state_2']
  assert records.find_resumption(run).round_num == 1


@pytest.mark.parametrize('name, damage, problem', [
    (run_dir.PARTICIPATION_FILE, 'deleted', 'it is missing'),
    (run_dir.PARTICIPATION_FILE, 'cut', '26 bytes, recorded 36'),
    (run_dir.PARTICIPATION_FILE, 'edited', 'its first 36 bytes were altered'),
    (run_dir.METRICS_FILE, 'cut', '1 rows for the first 2 rounds, recorded 2'),
    (run_dir.METRICS_FILE, 'edited', 'the rows of the first 2 rounds were altered'),
])
def test_a_damaged_log_is_refused_naming_it(run, name, damage, problem):
  path = os.path.join(run, name)
  with open(path, 'rb') as f:
    data = f.read()
  if damage == 'deleted':
    os.remove(path)
  elif damage == 'cut':  # round 1's rows only
    _write(path, b''.join((LOG if name == run_dir.PARTICIPATION_FILE else METRICS)[:2]))
  else:
    _write(path, data.replace(b'c2', b'c9').replace(b'2.0', b'2.1'))
  with pytest.raises(run_dir.CorruptRunFileError) as error:
    record_checks.check_files(run, records.find_resumption(run))
  assert str(error.value) == (
      f'{path} does not hold what checkpoint 2 recorded ({problem}, see checkpoints/record_2.json); '
      'restore it from a backup of the run, or start a new run with another --experiment_name; the '
      'run was not resumed.')


def test_metrics_rows_digest_ignores_a_column_added_later():
  before = records.metrics_rows_digest(b'round,loss\n0,2.5\n1,2.0\n', 2)
  widened = records.metrics_rows_digest(b'round,loss,eval_loss\n0,2.5,\n1,2.0,\n2,1.5,3.0\n', 2)
  assert before == widened and before['rows'] == 2
  with pytest.raises(ValueError, match="round is 'x'"):
    records.metrics_rows_digest(b'round,loss\nx,1\n', 2)


def test_logs_with_trained_rounds_but_no_checkpoint_are_refused(run):
  for round_num in (1, 2):
    os.remove(records.record_path(run, round_num))
  with pytest.raises(run_dir.RunDirError, match='holds trained rounds .*no intact checkpoint'):
    records.find_resumption(run)


def test_a_missing_checkpoint_whose_record_remains_is_named(run, caplog):
  shutil.rmtree(records.checkpoint_path(run, 2))
  resumption = records.find_resumption(run)
  assert resumption.round_num == 1 and resumption.untrusted == (
      (2, 'it is missing (its record remains)'),)
  # At WARNING whatever verbosity an earlier test of this process left absl at.
  with caplog.at_level(std_logging.WARNING, logger='absl'):
    records.set_aside(run, resumption)
  assert 'program_state_2 it is missing (its record remains); the run resumes from checkpoint 1' in (
      caplog.text)


def test_a_fresh_directory_starts_fresh(tmp_path):
  resumption = records.find_resumption(str(tmp_path))
  assert resumption.fresh and resumption.round_num == 0
  assert record_checks.check_files(str(tmp_path), resumption) == []


def test_settings_are_compared_with_the_record_but_the_resumable_ones_and_the_location(run):
  resumption = records.find_resumption(run)
  record_checks.check_settings(resumption, dataclasses.replace(
      CONFIG, rounds=8, root_output_dir='/y', experiment_name='b'), run)  # moved, trained on
  with pytest.raises(ValueError, match=r'checkpoint 2 with other settings \(noise_multiplier: 1.0 '
                     r'-> 5.0, as checkpoints/record_2.json records\)'):
    record_checks.check_settings(resumption, dataclasses.replace(CONFIG, noise_multiplier=5.0),
                                 run)
  record_checks.check_plan(resumption, dict(PLAN, num_rounds=8))
  with pytest.raises(ValueError, match=r'\(clip_norm: 1.0 -> 2.0'):
    record_checks.check_plan(resumption, dict(PLAN, clip_norm=2.0))


def test_records_of_removed_checkpoints_are_removed(run):
  os.rename(records.checkpoint_path(run, 1), records.checkpoint_path(run, 1) + '_gone')
  _checkpoint(run, 3, b''.join(LOG), b''.join(METRICS))
  names = sorted(n for n in os.listdir(records.checkpoints_dir(run)) if n.startswith('record_'))
  assert names == ['record_2.json', 'record_3.json']
  with open(records.record_path(run, 3)) as f:
    assert json.load(f)['files'][run_dir.PARTICIPATION_FILE]['size'] == len(b''.join(LOG))
