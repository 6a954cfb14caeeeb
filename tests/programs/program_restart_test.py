"""The example program `experiments.programs.emnist_program` end to end, as a subprocess.

SIGKILLed once a checkpoint of round r >= 2 exists, its latest checkpoint damaged (set aside on
resume: the previous one resumes), and rerun with the same command, it ends with the
final program state (model, optimizer, noise state, sampler state), participation.csv (byte for
byte), metrics.csv and privacy report of an uninterrupted run; the log respects min-sep and the cap;
the report equals the `privacy_report` binary's on the run's files; no worker_binary outlives the
runs. SIGTERM stops it with one line and exit status 143, between rounds once the last round's
checkpoint is saved (or after the last round), and the rerun ends as an uninterrupted run. With
Poisson sampling (empty cohorts included) the program draws the EMNIST driver's cohorts and writes
its metrics rows and report. On 2 TFF workers (--workers), one killed when round 2 starts (the round
runs again on the other) and the other when round 4 starts (one line, exit 1), then resumed on new
workers, it ends as the uninterrupted local run, bit for bit. A driver's run directory and a
program's refuse each other.

Tiny settings (as run_dir_test.py): 30 synthetic clients and 4 canary clients (their
canaries.csv and final cosines are compared too), 3 per round, 6 rounds, min_sep 2, at most 2
participations, an evaluation every 2 rounds (train_model's EvaluationManager, concurrent with
training: a kill may find one in flight), fixed seeds. stdout/stderr go to files, never pipes (an orphaned worker_binary
keeps a pipe open). The uninterrupted reference run starts once per module, in the background.
"""

import csv
import json
import os
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff import auditing
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.programs import data_source
from experiments.run import run_config, run_dir, run_setup
from tests.testing import binaries, remote_workers, run_files

pytestmark = pytest.mark.e2e

ROUNDS, MIN_SEP, CAP = 6, 2, 2
ARGS = ('--model=tiny', '--mechanism=blt', '--noise_multiplier=0.5', f'--rounds={ROUNDS}',
        '--clients_per_round=3', '--synthetic_num_clients=30', '--synthetic_examples_per_client=8',
        '--client_batch_size=8', f'--min_sep={MIN_SEP}', f'--max_participations={CAP}',
        '--noise_seed=3', '--seed=1', '--eval_every=2', '--eval_max_examples=64',
        '--canary_clients=4', '--checkpoint_every=1')
MODULE = 'experiments.programs.emnist_program'


def Program(root, name, log_name=None, args=ARGS, module=MODULE):  # noqa: N802
  """One subprocess of the example program (or of another binary `module` taking its flags) on
  `<root>/<name>`."""
  return binaries.RunningBinary(module, root, name, args, log_name)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The uninterrupted run, started at once; call the fixture's value to wait for it."""
  root = tmp_path_factory.mktemp('reference')
  program = Program(root, 'run')
  done = {}

  def result():
    if not done:
      assert program.wait() == 0, program.stderr()[-3000:]
      binaries.assert_no_workers_left(program.workers)
      done['dir'] = program.dir
    return done['dir']

  yield result
  if program.proc.poll() is None:
    program.proc.kill()
    program.proc.wait()


def final_state(run):
  """The leaves of the last program state (train state incl. the noise state, round, iterator),
  the run directory's path masked in the iterator's bytes."""
  value = tf.saved_model.load(os.path.join(run, 'checkpoints', f'program_state_{ROUNDS}'))()
  leaves = []
  for leaf in tf.nest.flatten(value):  # None: train_model's next evaluation time (no evaluation)
    leaf = np.asarray(leaf) if leaf is not None else None
    if leaf is not None and leaf.dtype == object:
      leaf = leaf.item()
    if isinstance(leaf, bytes) and leaf.startswith(b'DPFTRLIT'):  # the iterator's bytes
      leaf = _iterator_fields(leaf)
    leaves.append(leaf)
  return leaves


def _iterator_fields(buffer):
  """The data-source iterator's bytes decoded, its (absolute) log path left out."""
  iterator = data_source.SampledClientDataSourceIterator.from_bytes(buffer)
  return (iterator.client_ids, iterator.sampler_kind, iterator.next_round, iterator.log_offset)


def masked_report(run):
  with open(os.path.join(run, run_dir.REPORT_DIR, 'report.json')) as f:
    return run_files.masked_report(json.load(f))


def assert_same_run(run, expected):
  got, want = final_state(run), final_state(expected)
  assert len(got) == len(want)
  for a, b in zip(got, want, strict=True):
    if a is None or isinstance(a, tuple):
      assert a == b
    else:
      np.testing.assert_array_equal(a, b)
  for name in (run_dir.PARTICIPATION_FILE, 'canaries.csv'):
    assert (run_files.read_bytes(os.path.join(run, name))
            == run_files.read_bytes(os.path.join(expected, name))), name
  cosines = [auditing.read_canaries(os.path.join(r, 'canaries.json')).final_cosines
             for r in (run, expected)]
  np.testing.assert_array_equal(cosines[0], cosines[1])
  assert run_files.metrics_rows(run) == run_files.metrics_rows(expected)
  assert [int(r['round']) for r in run_files.metrics_rows(run)] == list(range(ROUNDS))
  # Evaluated after rounds 2, 4 and 6 (--eval_every=2), each in its round's row.
  assert [bool(r.get('eval_loss')) for r in run_files.metrics_rows(run)] == [False, True] * 3
  assert masked_report(run) == masked_report(expected)
  for directory in (run, os.path.join(run, 'checkpoints')):
    assert not [name for name in os.listdir(directory) if '_temp' in name or
                name.endswith('.tmp')]
  assert os.path.isfile(os.path.join(run, 'summary.json'))
  assert os.path.isdir(os.path.join(run, 'model', f'training_checkpoint_round_{ROUNDS}'))


def assert_log_respects_the_schedule(run):
  path = os.path.join(run, run_dir.PARTICIPATION_FILE)
  log = participation_log.read_participation_log(path)
  assert log.violations(participation_lib.ParticipationSchema.b_min_sep(MIN_SEP, CAP),
                        ROUNDS) == []
  rounds = {}
  with open(path, newline='') as f:
    for row in csv.DictReader(f):
      rounds.setdefault(row['client_id'], []).append(int(row['round']))
  assert sorted({r for rs in rounds.values() for r in rs}) == list(range(ROUNDS))
  for history in rounds.values():
    assert len(history) <= CAP and all(b - a >= MIN_SEP for a, b in zip(history, history[1:], strict=False))


@pytest.mark.slow  # about 90-110 s: three program runs of 6 rounds (one killed), two in parallel
def test_sigkill_and_rerun_equals_an_uninterrupted_run(tmp_path, reference):
  first = Program(tmp_path, 'run', 'first')
  first.wait_for(lambda: any(first.checkpoint_exists(r) for r in range(2, ROUNDS)),
                 'a checkpoint of round 2 or later')
  first.poll_workers()
  first.proc.kill()  # SIGKILL: no handler runs; its worker_binary is orphaned
  assert first.wait() == -9
  assert not first.checkpoint_exists(ROUNDS) and not os.path.exists(
      os.path.join(first.dir, 'summary.json')), 'the run finished before it was killed'
  orphans = binaries.alive_workers(first.workers)
  # Its latest checkpoint damaged too (a file cut short): set aside, the previous one resumes.
  checkpoints = os.path.join(first.dir, 'checkpoints')
  latest = max((n for n in os.listdir(checkpoints) if n.startswith('program_state_')
                and n[len('program_state_'):].isdigit()), key=lambda n: int(n.split('_')[-1]))
  largest = max((os.path.join(d, n) for d, _, names in os.walk(os.path.join(checkpoints, latest))
                 for n in names), key=os.path.getsize)
  with open(largest, 'r+b') as f:
    f.truncate(os.path.getsize(largest) // 2)

  second = Program(tmp_path, 'run', 'second')
  assert second.wait() == 0, second.stderr()[-3000:]
  assert 'Resuming' in second.stderr()
  assert f'Checkpoint {os.path.join(checkpoints, latest)} cannot be trusted' in second.stderr()
  assert os.listdir(os.path.join(checkpoints, 'set_aside')) == [latest]
  if orphans:
    assert 'worker_binary process(es) left by an earlier run' in second.stderr()
  binaries.assert_no_workers_left(first.workers | second.workers)
  expected = reference()
  assert_same_run(first.dir, expected)
  assert_log_respects_the_schedule(first.dir)
  # The program's report is the privacy_report binary's on the run's files.
  binary = run_files.standalone_report(
      first.dir, tmp_path / 'binary', f'--participation_log={first.dir}/participation.csv',
      f'--canaries={first.dir}/canaries.json')
  assert run_files.masked_report(binary) == masked_report(first.dir)

  # Rerunning the finished run trains nothing and changes nothing.
  before = run_files.read_bytes(os.path.join(first.dir, run_dir.PARTICIPATION_FILE))
  third = Program(tmp_path, 'run', 'third')
  assert third.wait() == 0, third.stderr()[-3000:]
  assert 'nothing to do' in third.stderr()
  assert run_files.read_bytes(os.path.join(first.dir, run_dir.PARTICIPATION_FILE)) == before
  binaries.assert_no_workers_left(third.workers)


@pytest.mark.slow  # about 60 s: a program run stopped by SIGTERM, then rerun
def test_sigterm_stops_with_143_and_the_rerun_equals_an_uninterrupted_run(tmp_path, reference):
  # Checkpoints every 4 rounds: a stop saves the round it stops after all the same.
  args = (*ARGS, '--checkpoint_every=4')
  first = Program(tmp_path, 'run', 'first', args=args)
  log = os.path.join(first.dir, run_dir.PARTICIPATION_FILE)
  first.wait_for(lambda: os.path.exists(log) and any(
      line.endswith(b',1') for line in run_files.read_bytes(log).splitlines()),
      'the cohort of round 1')
  first.poll_workers()
  first.proc.send_signal(signal.SIGTERM)
  assert first.wait() == 143, first.stderr()[-3000:]
  err = first.stderr()
  stopped = [line for line in err.splitlines() if line.startswith('Stopped by')]
  assert len(stopped) == 1 and stopped[0].startswith('Stopped by SIGTERM after round '), err
  assert 'Traceback' not in err and 'Exception ignored' not in err, err
  # train_model stopped before a round, once the last round's checkpoint and record were saved; or,
  # its saves lagging behind its rounds, it had drawn its last round: the stop came after it.
  done = int(stopped[0].split('after round ')[1].split('/')[0])
  assert first.checkpoint_exists(done) and not first.checkpoint_exists(done + 1)
  saved = {r for r in range(ROUNDS + 1) if first.checkpoint_exists(r)}
  assert saved == {0, done} | ({4} if done >= 4 else set()), saved
  if done == ROUNDS:
    assert 'before the run\'s report and summary were complete' in stopped[0], stopped
  assert not os.path.exists(os.path.join(first.dir, 'summary.json'))
  binaries.assert_no_workers_left(first.workers)
  second = Program(tmp_path, 'run', 'second', args=args)
  assert second.wait() == 0, second.stderr()[-3000:]
  assert 'Resuming' in second.stderr()
  binaries.assert_no_workers_left(second.workers)
  assert_same_run(first.dir, reference())


@pytest.mark.slow  # about 60 s: a program run and a driver run of 5 rounds, in parallel
def test_poisson_program_draws_and_trains_as_the_driver(tmp_path):
  # Poisson cohorts at rate 0.05 of 30 clients (the default seed): rounds 0 and 3 draw no client.
  args = ('--model=tiny', '--mechanism=gaussian', '--rounds=5', '--sampler=poisson',
          '--sampling_prob=0.05', '--synthetic_num_clients=30', '--synthetic_examples_per_client=8',
          '--client_batch_size=8', '--eval_max_examples=64', '--noise_seed=1')
  (tmp_path / 'program').mkdir()
  (tmp_path / 'driver').mkdir()
  program = Program(tmp_path / 'program', 'run', args=args)
  driver = Program(tmp_path / 'driver', 'run', args=args, module='experiments.emnist.run_emnist')
  assert program.wait() == 0, program.stderr()[-3000:]
  assert driver.wait() == 0, driver.stderr()[-3000:]
  binaries.assert_no_workers_left(program.workers | driver.workers)
  log = run_files.read_bytes(os.path.join(program.dir, run_dir.PARTICIPATION_FILE))
  assert log == run_files.read_bytes(os.path.join(driver.dir, run_dir.PARTICIPATION_FILE))
  drawn = {int(line.split(b',')[1]) for line in log.splitlines()[1:]}
  assert drawn == {1, 2, 4}  # the default seed's cohorts: rounds 0 and 3 are empty
  # The same cohorts, noise and model: the same rows, bar the drivers' own cohort_size (and the
  # wall times run_files.metrics_rows leaves out); NaN training metrics in the empty rounds.
  driver_rows = [{k: v for k, v in row.items() if k != 'cohort_size'}
                 for row in run_files.metrics_rows(driver.dir)]
  program_rows = run_files.metrics_rows(program.dir)
  assert program_rows == driver_rows
  assert [row['train_loss'] == 'nan' for row in program_rows] == [True, False, False, True, False]
  assert masked_report(program.dir) == masked_report(driver.dir)


@pytest.mark.slow  # about 80 s: a program run on 2 TFF workers, its resume, beside the reference
def test_program_on_two_workers_equals_a_local_run_and_survives_lost_workers(tmp_path, reference):
  """--workers: the drivers' remote workers and retry (`remote_contexts`), asynchronous. Rounds 0-1
  run on two workers; one is killed when round 2 starts (the data source logs its cohort), so round
  2 runs again on the other, which trains round 3; it is killed when round 4 starts: one line, exit
  1. New workers at the same addresses resume the run, which ends as the local run, bit for bit
  (3 clients a round, split 2 + 1, merge in the local order)."""
  with remote_workers.launched(2, str(tmp_path / 'a')) as (addresses, pids, _):
    watchers = [remote_workers.kill_at_round(os.path.join(tmp_path, 'run'), 2, pids[1:]),
                remote_workers.kill_at_round(os.path.join(tmp_path, 'run'), 4, pids[:1])]
    first = Program(tmp_path, 'run', 'first', args=(*ARGS, f'--workers={addresses}'))
    assert first.wait() == 1, first.stderr()[-3000:]
    for watcher in watchers:
      watcher.join()
  err = first.stderr()
  assert 'stopped answering; running it again on' in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith(f'emnist_program.py: error: no TFF worker of {addresses.split(",")[0]} '
                         'answers; restart them') and 'Traceback' not in err, err[-3000:]
  assert first.checkpoint_exists(4) and not first.checkpoint_exists(5)
  port = int(addresses.split(',')[0].rsplit(':', 1)[1])
  with remote_workers.launched(2, str(tmp_path / 'b'), port):
    second = Program(tmp_path, 'run', 'second', args=(*ARGS, f'--workers={addresses}'))
    assert second.wait() == 0, second.stderr()[-3000:]
  assert 'Resuming' in second.stderr()
  assert not first.workers | second.workers  # no local worker_binary: all ran on the workers
  # participation.csv's bytes, the metrics rows, the report and the final program state (model,
  # optimizer, noise and sampler states) all equal the uninterrupted local run's.
  assert_same_run(first.dir, reference())


@pytest.mark.unit
def test_driver_and_program_run_directories_refuse_each_other(tmp_path):
  common = dict(root_output_dir=str(tmp_path), rounds=2)
  driver = run_config.RunConfig(**common, task={'model': 'tiny', 'only_digits': True})
  program = run_config.RunConfig(**common, task={'model': 'tiny', 'only_digits': True,
                                                 'program': 'train_model'})
  def write_hparams(config):
    os.makedirs(config.output_dir, exist_ok=True)
    with open(os.path.join(config.output_dir, run_dir.HPARAMS_FILE), 'w') as f:
      f.write(run_setup.hparams_json(config))

  write_hparams(driver)
  with pytest.raises(ValueError, match='holds a run with other settings .*task'):
    run_config.check_hparams(program)
  write_hparams(program)
  with pytest.raises(ValueError, match='holds a run with other settings .*task'):
    run_config.check_hparams(driver)


@pytest.mark.e2e  # in-process, on copies of the module's subprocess runs
def test_a_resume_is_checked_against_the_checkpoints_record(tmp_path, reference):
  """Killed in its last round, then hparams.json deleted and --noise_multiplier changed: refused
  (the record holds the settings that trained); the run copied elsewhere: refused."""
  run = os.path.join(str(tmp_path), 'run')
  shutil.copytree(reference(), run)
  shutil.rmtree(os.path.join(run, 'checkpoints', f'program_state_{ROUNDS}'))
  os.remove(os.path.join(run, 'checkpoints', f'record_{ROUNDS}.json'))
  os.remove(os.path.join(run, 'summary.json'))
  os.remove(os.path.join(run, 'hparams.json'))
  place = (f'--root_output_dir={tmp_path}', '--experiment_name=run')
  args = [a for a in ARGS if not a.startswith('--noise_multiplier')] + ['--noise_multiplier=5']
  code, _, err = binaries.run_in_process(MODULE, args + list(place))
  assert code == 2, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert (f'trained up to checkpoint {ROUNDS - 1} with other settings (noise_multiplier: 0.5 -> '
          '5.0' in last and 'checkpoints/record_5.json' in last), last

  # The same command on the copy: refused too, since a program run stays where it started (its
  # data source holds the participation log's absolute path); nothing is written.
  code, _, err = binaries.run_in_process(MODULE, list(ARGS) + list(place))
  assert code == 2, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert 'with other settings (root_output_dir: ' in last and 'Traceback' not in err, last
  assert not os.path.exists(os.path.join(run, 'hparams.json'))
