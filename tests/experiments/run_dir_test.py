"""Run-directory safety of the drivers, end to end (the EMNIST driver as a subprocess).

SIGTERM during the start (one line, exit 143, no worker left), then after a round, and SIGKILL
mid-run, then a resume, give the same final weights, metrics and participation log as an
uninterrupted run; two runs on one directory: one refuses with exit status 1 naming the
other's PID; torn last lines of the logs are dropped on resume; no worker_binary of a driver
outlives it (or, after SIGKILL, the next run). The damage table: each run file deleted, truncated
or replaced by the same file of another run, then the same command again: the run resumes to the
uninterrupted run's results (files rebuilt from the checkpoint's record, a damaged checkpoint set
aside) or stops with one line naming the file, never a smaller epsilon.

Tiny settings (as in drivers_test.py): 30 synthetic clients and 2 canaries, 3 per round, 6 rounds,
fixed seeds, a checkpoint every round, an evaluation every 2 rounds (train_model's
EvaluationManager, concurrent with training: a kill may find one in flight). stdout/stderr go to files, never pipes (an orphaned
worker_binary keeps a pipe open). The uninterrupted reference run and another run (other seeds,
whose files replace ours in the damage table) start once per module, in the background.
"""

import json
import os
import shutil
import signal
import time

import pytest

from dp_ftrl_tff.training import run_config, run_dir, run_setup, run_start
from tests.testing import binaries, run_files, runs

pytestmark = pytest.mark.unit

ROUNDS = 6
TIMEOUT = 600
ARGS = ('--model=tiny', '--mechanism=tree', '--noise_multiplier=0.5', f'--rounds={ROUNDS}',
        '--clients_per_round=3', '--synthetic_num_clients=30', '--synthetic_examples_per_client=8',
        '--client_batch_size=8', '--min_sep=2', '--noise_seed=3', '--seed=1',
        '--checkpoint_every=1', '--eval_every=2', '--eval_max_examples=64',
        '--canary_clients=2')
OTHER_RUN = ('--seed=2', '--noise_seed=4')


def Driver(root, name, log_name=None, extra=()):  # noqa: N802 (a constructor, as the class it wraps)
  """The EMNIST driver with `ARGS` (then `extra`) as a subprocess on `<root>/<name>`."""
  return binaries.RunningBinary(binaries.EMNIST, root, name, ARGS + tuple(extra), log_name,
                                timeout=TIMEOUT)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The uninterrupted run, started at once; call the fixture's value to wait for it."""
  yield from _background_run(tmp_path_factory, 'reference')


@pytest.fixture(scope='module')
def other(tmp_path_factory):
  """Another finished run (other seeds), started at once; call the fixture's value to wait."""
  yield from _background_run(tmp_path_factory, 'other', OTHER_RUN)


def _background_run(tmp_path_factory, name, extra=()):
  root = tmp_path_factory.mktemp(name)
  driver = Driver(root, 'run', extra=extra)
  done = {}

  def result():
    if not done:
      assert driver.wait() == 0, driver.stderr()[-3000:]
      binaries.assert_no_workers_left(driver.workers)
      done['dir'] = driver.dir
    return done['dir']

  yield result
  if driver.proc.poll() is None:
    driver.proc.kill()
    driver.proc.wait()


def assert_same_run(run, expected):
  run_files.assert_same_run(run, expected, ROUNDS)


def _stopped_line(binary, signal_name):
  """The binary's one 'Stopped by' line on stderr, which holds nothing else of note."""
  err = binary.stderr()
  stopped = [line for line in err.splitlines() if line.startswith('Stopped by')]
  assert len(stopped) == 1 and stopped[0].startswith(f'Stopped by {signal_name} '), err[-3000:]
  assert 'Traceback' not in err and 'Exception ignored' not in err, err[-3000:]
  return stopped[0]


@pytest.mark.e2e
@pytest.mark.slow
def test_sigterm_during_the_start_and_after_a_round_then_the_resume_is_bit_identical(
    tmp_path, reference):
  # During the start, once the header is printed: the process is being built, TFF's tracing runs
  # garbage collections (whose callbacks dropped the exception the old handler raised).
  early = Driver(tmp_path, 'run', 'early')
  early.wait_for(lambda: '\noutput ' in early.stdout(), 'the header')
  early.proc.send_signal(signal.SIGTERM)
  assert early.wait() == 128 + signal.SIGTERM, early.stderr()[-3000:]
  assert 'during the start of the run, before training' in _stopped_line(early, 'SIGTERM')
  assert not [line for line in early.stdout().splitlines() if line.startswith('round ')]
  assert not early.checkpoint_exists(1)
  binaries.assert_no_workers_left(early.workers)

  first = Driver(tmp_path, 'run', 'first')
  first.wait_for(lambda: first.checkpoint_exists(1), 'the first round\'s checkpoint')
  first.proc.send_signal(signal.SIGTERM)
  assert first.wait() == 128 + signal.SIGTERM, first.stderr()[-3000:]
  stopped = _stopped_line(first, 'SIGTERM')
  assert 'rerun the same command to resume' in stopped, stopped
  binaries.assert_no_workers_left(first.workers)
  done = int(stopped.split('after round ')[1].split('/')[0])
  assert 1 <= done < ROUNDS
  assert first.checkpoint_exists(done)

  second = Driver(tmp_path, 'run', 'second')
  assert second.wait() == 0, second.stderr()[-3000:]
  assert 'resum' in second.stderr().lower()
  binaries.assert_no_workers_left(second.workers)
  assert_same_run(first.dir, reference())


@pytest.mark.e2e
@pytest.mark.slow
def test_two_starts_one_refuses_then_sigkill_and_resume(tmp_path, reference):
  a, b = Driver(tmp_path, 'run', 'a'), Driver(tmp_path, 'run', 'b')
  deadline = time.time() + TIMEOUT
  while a.proc.poll() is None and b.proc.poll() is None:
    a.poll_workers()
    b.poll_workers()
    assert time.time() < deadline
    time.sleep(0.05)
  loser, winner = (a, b) if a.proc.poll() is not None else (b, a)
  assert loser.wait() == 1, loser.stderr()[-3000:]
  lines = loser.stderr().strip().splitlines()
  assert lines[-1].startswith('run_emnist.py: error: ') and f'PID {winner.pid}' in lines[-1], lines
  assert 'in use by another run' in lines[-1] and 'Traceback' not in loser.stderr()
  binaries.assert_no_workers_left(loser.workers)

  winner.wait_for(lambda: winner.checkpoint_exists(1), 'the first round\'s checkpoint')
  winner.poll_workers()
  winner.proc.kill()  # SIGKILL: no handler runs; its worker_binary is orphaned
  assert winner.wait() == -signal.SIGKILL
  orphans = binaries.alive_workers(winner.workers)
  with open(os.path.join(winner.dir, run_dir.WORKERS_FILE)) as f:
    recorded = {w['pid'] for w in json.load(f)['workers']}
  assert set(orphans) <= recorded

  resumed = Driver(tmp_path, 'run', 'resumed')
  assert resumed.wait() == 0, resumed.stderr()[-3000:]
  assert 'resum' in resumed.stderr().lower()
  if orphans:
    assert 'worker_binary process(es) left by an earlier run' in resumed.stderr()
  binaries.assert_no_workers_left(winner.workers | resumed.workers)
  assert_same_run(winner.dir, reference())


def _copy_run(source, root, name):
  """A copy of a finished run directory under `<root>/<name>` (hparams naming the copy)."""
  target = os.path.join(str(root), name)
  shutil.copytree(source, target)
  path = os.path.join(target, 'hparams.json')
  with open(path) as f:
    hparams = json.load(f)
  hparams.update(root_output_dir=str(root), experiment_name=name)
  with open(path, 'w') as f:
    json.dump(hparams, f, indent=2, sort_keys=True)
  return target


@pytest.mark.e2e
@pytest.mark.slow
def test_torn_log_lines_are_dropped(tmp_path, reference):
  source = reference()
  torn = _copy_run(source, tmp_path, 'torn')
  os.remove(os.path.join(torn, 'summary.json'))  # killed: not finished
  with open(os.path.join(torn, 'participation.csv'), 'a') as f:
    f.write('client_1')  # killed while appending: no newline
  with open(os.path.join(torn, 'metrics.csv'), 'a') as f:
    f.write(f'{ROUNDS},2.3\n')  # a row that does not parse (2 fields)
  os.makedirs(os.path.join(torn, 'checkpoints', f'program_state_{ROUNDS + 1}_temp1234'))

  torn_run = Driver(tmp_path, 'torn')
  assert torn_run.wait() == 0, torn_run.stderr()[-3000:]
  warnings = [line for line in torn_run.stderr().splitlines() if 'torn last line' in line]
  assert len(warnings) == 1 and 'metrics.csv' in warnings[0] and '2 fields' in warnings[0], warnings
  for name in ('participation.csv', 'metrics.csv'):
    assert run_files.read_bytes(os.path.join(torn, name)) == run_files.read_bytes(os.path.join(source, name)), name
  assert not any('_temp' in n for n in os.listdir(os.path.join(torn, 'checkpoints')))
  binaries.assert_no_workers_left(torn_run.workers)


# ------------------------------------------------------------------------------------------------
# The damage table: a run killed during its last round (checkpoint 5 is its latest), or a finished
# one, with one of its files deleted, truncated or replaced by the same file of the other run.

DAMAGES = ('deleted', 'truncated', 'replaced')
# What the checkpoint's record cannot rebuild: the logs and the metrics.
REFUSED_FILES = ('participation.csv', 'metrics.csv', 'canaries.csv')
# What is rewritten from the record's verified settings on every start.
REBUILT_FILES = ('hparams.json', 'plan.json', 'canaries.json')


def _interrupted_copy(source, root, name):
  """A copy of the finished run as killed during its last round: its last checkpoint and record,
  summary and report gone; its logs still hold the last round's rows."""
  target = os.path.join(str(root), name)
  shutil.copytree(source, target)
  shutil.rmtree(os.path.join(target, 'checkpoints', f'program_state_{ROUNDS}'))
  os.remove(os.path.join(target, 'checkpoints', f'record_{ROUNDS}.json'))
  os.remove(os.path.join(target, 'summary.json'))
  shutil.rmtree(os.path.join(target, run_dir.REPORT_DIR))
  return target


def _damage(path, damage, other_path):
  """Deletes the file or directory at `path`, removes its first row, truncates it (a directory: its
  largest file) to half its bytes, or replaces it by `other_path`."""
  is_dir = os.path.isdir(path)
  if damage == 'deleted':
    (shutil.rmtree if is_dir else os.remove)(path)
  elif damage == 'early row removed':  # a CSV file without the row after its header's first
    with open(path, 'rb') as f:
      lines = f.read().split(b'\n')
    with open(path, 'wb') as f:
      f.write(b'\n'.join(lines[:1] + lines[2:]))
  elif damage == 'truncated':
    target = path if not is_dir else max(
        (os.path.join(d, n) for d, _, names in os.walk(path) for n in names), key=os.path.getsize)
    with open(target, 'r+b') as f:
      f.truncate(os.path.getsize(target) // 2)
  else:
    (shutil.rmtree if is_dir else os.remove)(path)
    (shutil.copytree if is_dir else shutil.copyfile)(other_path, path)


def _files(run):
  return {name: run_files.read_bytes(os.path.join(run, name)) for name in sorted(os.listdir(run))
          if os.path.isfile(os.path.join(run, name)) and name != run_dir.LOCK_FILE}


@pytest.mark.e2e  # in-process, on copies of the module's subprocess runs
@pytest.mark.parametrize('name', REFUSED_FILES)
def test_a_damaged_log_is_refused_naming_it(tmp_path, reference, other, name):
  for damage in DAMAGES + ('early row removed',):
    run = _interrupted_copy(reference(), tmp_path, damage.replace(' ', '_'))
    path = os.path.join(run, name)
    _damage(path, damage, os.path.join(other(), name))
    before = _files(run)
    code, _, err = binaries.run_in_process(binaries.EMNIST, ARGS + (
        f'--root_output_dir={tmp_path}', f'--experiment_name={os.path.basename(run)}'))
    lines = err.strip().splitlines()
    assert code == 1, (damage, err[-3000:])
    assert lines[-1].startswith(f'run_emnist.py: error: {path} does not hold what checkpoint '
                                f'{ROUNDS - 1} recorded'), (damage, lines[-3:])
    assert 'start a new run with another --experiment_name' in lines[-1]
    assert 'Traceback' not in err
    assert _files(run) == before, damage  # nothing written: the run was not resumed


@pytest.mark.e2e  # in-process, on copies of the module's subprocess runs
@pytest.mark.parametrize('finished', [False, True])
def test_other_settings_are_refused_without_hparams_json(tmp_path, reference, finished):
  source = reference()
  run = (shutil.copytree(source, os.path.join(str(tmp_path), 'run')) if finished else
         _interrupted_copy(source, tmp_path, 'run'))
  os.remove(os.path.join(run, 'hparams.json'))
  args = [a for a in ARGS if not a.startswith('--noise_multiplier')]
  code, _, err = binaries.run_in_process(binaries.EMNIST, args + [
      '--noise_multiplier=5', f'--root_output_dir={tmp_path}', '--experiment_name=run'])
  assert code == 2, err[-3000:]
  last = err.strip().splitlines()[-1]
  checkpoint = ROUNDS if finished else ROUNDS - 1
  assert last.startswith(f'run_emnist.py: error: the run was trained up to checkpoint {checkpoint} '
                         'with other settings (noise_multiplier: 0.5 -> 5.0'), last
  assert f'checkpoints/record_{checkpoint}.json' in last
  assert not os.path.exists(os.path.join(run, 'hparams.json'))


def _assert_same_results(run, source):
  assert_same_run(run, source)
  for name in ('canaries.csv', 'plan.json'):
    assert run_files.read_bytes(os.path.join(run, name)) == run_files.read_bytes(
        os.path.join(source, name)), name
  settings = [json.load(open(os.path.join(r, 'hparams.json'))) for r in (run, source)]
  for document in settings:
    del document['root_output_dir'], document['experiment_name']
  assert settings[0] == settings[1]
  reports = [json.load(open(os.path.join(r, run_dir.REPORT_DIR, 'report.json')))
             for r in (run, source)]
  assert reports[0]['epsilon'] == reports[1]['epsilon'] and reports[0]['rho'] == reports[1]['rho']


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize('damage', DAMAGES)
def test_damaged_settings_files_are_rebuilt_from_the_checkpoint(tmp_path, reference, other, damage):
  source = reference()
  run = _interrupted_copy(source, tmp_path, 'run')
  for name in REBUILT_FILES:
    _damage(os.path.join(run, name), damage, os.path.join(other(), name))
  driver = Driver(tmp_path, 'run')
  assert driver.wait() == 0, driver.stderr()[-3000:]
  assert f'Resuming {run} after round {ROUNDS - 1}/{ROUNDS}' in driver.stderr()
  assert 'canaries.json is missing or altered: rebuilt' in driver.stderr()
  binaries.assert_no_workers_left(driver.workers)
  _assert_same_results(run, source)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize('damage', DAMAGES)
def test_a_damaged_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous(
    tmp_path, reference, other, damage):
  source = reference()
  run = _copy_run(source, tmp_path, 'run')
  os.remove(os.path.join(run, 'summary.json'))
  latest = os.path.join(run, 'checkpoints', f'program_state_{ROUNDS}')
  _damage(latest, damage, os.path.join(other(), 'checkpoints', f'program_state_{ROUNDS}'))
  driver = Driver(tmp_path, 'run')
  assert driver.wait() == 0, driver.stderr()[-3000:]
  assert f'Resuming {run} after round {ROUNDS - 1}/{ROUNDS}' in driver.stderr()
  if damage != 'deleted':
    assert f'Checkpoint {latest} cannot be trusted' in driver.stderr()
    assert os.listdir(os.path.join(run, 'checkpoints', 'set_aside')) == [f'program_state_{ROUNDS}']
  binaries.assert_no_workers_left(driver.workers)
  _assert_same_results(run, source)


# ------------------------------------------------------------------------------------------------
# The edit table (issue 44): a finished run whose files were edited after the run, with or without
# its checkpoint records beside them. Neither privacy_report on the directory's files nor the
# driver's rerun reports an epsilon below the intact run's: each refuses with one line naming the
# file.


def _distinct_cohorts(path, other_path):
  """Valid cohorts of distinct ids: no client participated twice (a smaller epsilon)."""
  del other_path
  with open(path, 'w') as f:
    f.write('client_id,round\n' + ''.join(f'synthetic_{3 * r + i},{r}\n'
                                           for r in range(ROUNDS) for i in range(3)))


def _plan_noise_7(path, other_path):
  del other_path
  with open(path) as f:
    plan = json.load(f)
  plan['noise_multiplier'] = plan['value_noise_multiplier'] = 7.0
  with open(path, 'w') as f:
    json.dump(plan, f)


def _zero_final_cosines(path, other_path):
  del other_path
  with open(path) as f:
    canaries = json.load(f)
  canaries['final_model_cosines'] = [0.0] * len(canaries['final_model_cosines'])
  with open(path, 'w') as f:
    json.dump(canaries, f)


def _replace(path, other_path):
  shutil.copyfile(other_path, path)


EDITS = {
    ('plan.json', 'noise multiplier 0.5 -> 7'): _plan_noise_7,
    ('participation.csv', 'valid cohorts of distinct ids'): _distinct_cohorts,
    ('participation.csv', "another run's"): _replace,
    ('metrics.csv', "another run's"): _replace,
    ('canaries.json', "another run's"): _replace,
    ('canaries.json', 'final cosines set to 0'): _zero_final_cosines,
    ('canaries.csv', "another run's"): _replace,
}


def _report_args(run):
  return [f'--plan={run}/plan.json', f'--participation_log={run}/participation.csv',
          f'--metrics={run}/metrics.csv', f'--canaries={run}/canaries.json', '--json',
          '--noequal_privacy']


@pytest.mark.e2e  # in-process, on copies of the module's subprocess runs
@pytest.mark.parametrize('records', [True, False], ids=['with records', 'records deleted'])
def test_files_edited_after_the_run_never_give_a_smaller_epsilon(tmp_path, reference, other,
                                                                 records):
  source = reference()
  code, out, err = binaries.run_in_process(binaries.REPORT, _report_args(source))
  assert code == 0, err
  intact = json.loads(out)['epsilon']
  for (name, edit), apply in EDITS.items():
    run = shutil.copytree(source, os.path.join(str(tmp_path), f'{name}-{edit}'.replace(' ', '_')))
    path = os.path.join(run, name)
    apply(path, os.path.join(other(), name))
    if not records:
      for record in os.listdir(os.path.join(run, 'checkpoints')):
        if record.startswith('record_'):
          os.remove(os.path.join(run, 'checkpoints', record))
    code, out, err = binaries.run_in_process(binaries.REPORT, _report_args(run))
    case = (name, edit, records)
    if code == 0:  # an edit that changes nothing the report reads must not lower epsilon
      assert json.loads(out)['epsilon'] >= intact, case
      continue
    line = err.strip().splitlines()[-1]
    assert code == 2 and 'Traceback' not in err, (case, err[-2000:])
    assert line.startswith('privacy_report.py: error: --'), (case, line)
    if records:
      assert f'{path} does not hold what checkpoint {ROUNDS} of its run recorded' in line, (case,
                                                                                           line)
    else:
      assert 'holds no checkpoint with an intact record' in line, (case, line)
    code, out, err = binaries.run_in_process(binaries.EMNIST, ARGS + (
        f'--root_output_dir={tmp_path}', f'--experiment_name={os.path.basename(run)}'))
    line = err.strip().splitlines()[-1]
    assert code == 1 and 'nothing to do' not in out + err, (case, err[-2000:])
    if records:
      assert line.startswith(f'run_emnist.py: error: {path} does not hold what checkpoint '
                             f'{ROUNDS} recorded'), (case, line)
    else:
      assert 'no intact checkpoint to resume them from' in line, (case, line)


@pytest.mark.e2e  # in-process, on the module's subprocess runs
def test_canaries_of_another_run_of_the_same_plan_are_refused(tmp_path, reference, other):
  """Issue 44, point 2: the other run has the same plan (other seeds), so its canaries.json has the
  same plan digest and population; its run identity tells them apart, in its run directory or
  copied out of it."""
  source, foreign = reference(), other()
  assert (json.load(open(os.path.join(source, 'canaries.json')))['plan_sha256']
          == json.load(open(os.path.join(foreign, 'canaries.json')))['plan_sha256'])
  copied = tmp_path / 'copied'
  copied.mkdir()
  for name in ('canaries.json', 'canaries.csv'):
    shutil.copyfile(os.path.join(foreign, name), copied / name)
  for canaries, match in ((os.path.join(foreign, 'canaries.json'), 'a report reads the files of '
                           'one run'), (str(copied / 'canaries.json'), 'was recorded by another '
                                        'run')):
    args = _report_args(source)
    args[3] = f'--canaries={canaries}'
    code, _, err = binaries.run_in_process(binaries.REPORT, args)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith('privacy_report.py: error: --canaries: '), line
    assert match in line, line


# ------------------------------------------------------------------------------------------------
# In-process checks of the pieces (no TFF computation: fast).


def test_second_lock_names_the_holder_and_a_failed_start_leaves_nothing(tmp_path):
  path = str(tmp_path / 'run')
  holder = run_dir.RunDirectory(path)
  holder.acquire()
  with pytest.raises(run_dir.RunDirLockedError, match=f'in use by another run \\(PID {os.getpid()}'):
    run_dir.RunDirectory(path).acquire()
  holder.release(remove_if_created=True)
  assert not os.path.exists(path)  # created by acquire, nothing else written: removed


def test_torn_last_lines(tmp_path):
  path = str(tmp_path / 'log.csv')
  cases = [('client_id,round\nc1,0\nc2,1', 'client_id,round\nc1,0\n'),   # no newline
           ('client_id,round\nc1,0\nc2\n', 'client_id,round\nc1,0\n'),    # one field
           ('client_id,round\nc1,0\nc2,x\n', 'client_id,round\nc1,0\n'),  # round not an int
           ('client_id,round\nc1,0\n', None), ('client_id,round\n', None)]
  for text, expected in cases:
    with open(path, 'w') as f:
      f.write(text)
    assert run_dir.drop_torn_last_line(path, 'round') == (expected is not None), text
    with open(path) as f:
      assert f.read() == (text if expected is None else expected)
  with open(path, 'w') as f:
    f.write('client_id,ro')  # a torn header: no rows
  assert run_dir.drop_torn_last_line(path, 'round') and not os.path.exists(path)


def test_corrupt_run_files_name_the_path(tmp_path):
  config = runs.tiny_config(tmp_path, mechanism='tree')
  os.makedirs(config.output_dir)
  resolved, saved = run_setup.run_strategy(config, config.output_dir)
  assert saved is None
  run_setup.write_run_files(config, config.output_dir, resolved, run_setup.build_plan(
      config, resolved, config.synthetic_num_clients), saved, run_start.new_run_id())
  saved = run_setup.saved_strategy_path(config.output_dir)
  assert sorted(os.listdir(config.output_dir)) == sorted([  # no temp file left
      'hparams.json', os.path.basename(saved), 'plan.json'])
  assert run_setup.run_strategy(config, config.output_dir)[1] == saved
  for name, check in (('hparams.json', run_config.check_hparams),
                      ('plan.json', lambda config, out: run_setup.check_plan_file(out)),
                      (os.path.basename(saved), run_setup.run_strategy)):
    path = os.path.join(config.output_dir, name)
    keep = run_files.read_bytes(path) if os.path.exists(path) else None
    with open(path, 'w') as f:
      f.write('{"mechanism": "tr')
    with pytest.raises(run_dir.CorruptRunFileError, match=f'{path} is corrupt .*restore it|'
                       f'{path} is corrupt .*delete it'):
      check(config, config.output_dir)
    if keep is None:
      os.remove(path)
    else:
      with open(path, 'wb') as f:
        f.write(keep)


def test_read_final_clip_is_the_clip_of_the_highest_round(tmp_path):
  path = str(tmp_path / 'metrics.csv')

  def read(text):
    with open(path, 'w') as f:
      f.write(text)
    return run_dir.read_final_clip(path)

  header = f'round,{run_dir.CLIP_METRIC},train_loss\n'
  assert read(header + '0,1.0,2.5\n1,0.75,2.0\n2,0.5,1.5\n') == 0.5
  assert read(header + '2,0.5,1.5\n0,1.0,2.5\n1,0.75,2.0\n') == 0.5  # by round, not row order
  assert read(header + '0,1.0,2.5\n1,,2.0\n') == 1.0  # a round without the metric is skipped
  assert read(header) is None  # no rounds yet
  assert read('round,train_loss\n0,2.5\n') is None  # a fixed-clip run's metrics: no column
  os.remove(path)
  assert run_dir.read_final_clip(path) is None  # no metrics.csv
  with pytest.raises(ValueError, match='metrics.csv'):
    read(header + '0,1.0,2.5\nx,0.5,1.5\n')
