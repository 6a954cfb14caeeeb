"""The generic driver `experiments.run_task` on a task that is neither EMNIST nor StackOverflow
(experiments/tabular/task.py: an MLP on 20 features, 5 classes, its clients in a SQLite file written
by TFF's own `save_to_sql_client_data`): a run with canaries, a restart and an evaluation every 2
rounds; a resume under any plan-changing setting refused before any round, naming it; the
task-entry errors; SecAgg and two TFF workers (separate runs: canaries with SecAgg, and SecAgg on
workers, are refused)."""

import csv
import json
import os

import pytest

from tests.testing import binaries, remote_workers

pytestmark = pytest.mark.integration

_ENTRY = '--task=experiments.tabular.task:build_task'
_FLAGS = (_ENTRY, '--synthetic_num_clients=60', '--synthetic_examples_per_client=10',
          '--clients_per_round=5', '--min_sep=2', '--mechanism=blt', '--noise_multiplier=0.5',
          '--noise_seed=3', '--seed=1', '--checkpoint_every=2', '--eval_every=2',
          '--client_batch_size=5')


@pytest.fixture(scope='module')
def population(tmp_path_factory):
  """The tabular population of `--seed=1` in TFF's SqlClientData format (TFF's own writer)."""
  from experiments.tabular import task  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp('tabular') / 'clients.sqlite')
  task.write_population(path, 60, 10, seed=1)
  return path


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


@pytest.fixture(scope='module')
def trained(tmp_path_factory, population):
  """A 2-round run (checkpoint 2) with 20 canaries and a restart at round 2 (0-based 1)."""
  root = str(tmp_path_factory.mktemp('runs'))
  args = [*_FLAGS, f'--root_output_dir={root}', f'--data={population}', '--rounds=2',
          '--canary_clients=20', '--restart_rounds=1']
  code, out, err = binaries.run_in_process(binaries.TASK, args, files=True)
  assert code == 0, err[-3000:]
  return root, args, out


@pytest.mark.slow
def test_a_task_module_trains_with_canaries_a_restart_and_evaluations(trained):
  root, args, out = trained
  run = os.path.join(root, 'run')
  rows = _rows(os.path.join(run, 'metrics.csv'))
  assert [row['round'] for row in rows] == ['0', '1']
  assert rows[1]['eval_accuracy'] and not rows[0]['eval_accuracy']  # every 2 rounds
  assert 'tabular (' in out and 'training clients' in out
  with open(os.path.join(run, 'hparams.json')) as f:
    assert json.load(f)['task']['entry'] == 'experiments.tabular.task:build_task'
  with open(os.path.join(run, 'plan.json')) as f:
    assert json.load(f)['restarts'] == {'rounds': [1]}
  assert os.path.isfile(os.path.join(run, 'canaries.json'))
  with open(os.path.join(run, 'privacy_report', 'report.json')) as f:
    assert json.load(f)['epsilon'] > 0
  # Trained on: a larger --rounds resumes from checkpoint 2 (the resumable setting).
  code, out, err = binaries.run_in_process(
      binaries.TASK, [a for a in args if not a.startswith('--rounds')] + ['--rounds=4'],
      files=True)
  assert code == 0, err[-3000:]
  assert 'Resuming' in out + err
  assert [row['round'] for row in _rows(os.path.join(run, 'metrics.csv'))] == ['0', '1', '2', '3']
  log = _rows(os.path.join(run, 'participation.csv'))
  assert any(row['client_id'].startswith('canary-') for row in log)
  with open(os.path.join(run, 'privacy_report', 'report.md')) as f:
    assert 'canar' in f.read()


#: A plan-changing flag -> (its new value, the setting the refusal names).
PLAN_CHANGES = {
    'noise_multiplier': ('--noise_multiplier=1.5', 'noise_multiplier'),
    'clip_norm': ('--clip_norm=2.0', 'clip_norm'),
    'mechanism': ('--mechanism=gaussian', 'mechanism'),
    'mechanism_option': ('--num_buffers=2', 'mechanism_options'),
    'min_sep': ('--min_sep=3', 'min_sep'),
    'max_participations': ('--max_participations=1', 'max_participations'),
    'clients_per_round': ('--clients_per_round=4', 'clients_per_round'),
    'sampler': ('--sampler=poisson', 'sampler'),
    'restart_schedule': ('--restart_rounds=2', 'restart_rounds'),
    'adaptive_clipping': ('--adaptive_clipping', 'adaptive_clipping'),
    'seed': ('--seed=2', 'seed'),
}


@pytest.mark.slow
def test_a_resume_under_another_plan_is_refused_before_any_round(tmp_path, population):
  # Its own 2-round run (the shared one trains on in the test above).
  args = [*_FLAGS, f'--root_output_dir={tmp_path}', f'--data={population}', '--rounds=2']
  code, _, err = binaries.run_in_process(binaries.TASK, args, files=True)
  assert code == 0, err[-3000:]
  run = os.path.join(str(tmp_path), 'run')
  with open(os.path.join(run, 'metrics.csv'), 'rb') as f:
    metrics = f.read()
  answers = {}
  for name, (flag, setting) in PLAN_CHANGES.items():
    flag_name = flag.split('=')[0]
    changed = [a for a in args if a.split('=')[0] not in (flag_name, '--rounds')]
    if name == 'sampler':  # Poisson draws q * N clients: no --clients_per_round
      changed = [a for a in changed if not a.startswith('--clients_per_round')] + [
          '--sampling_prob=0.1', '--min_sep=1']
    code, _, err = binaries.run_in_process(binaries.TASK, [*changed, flag, '--rounds=4'],
                                           files=True)
    lines = err.strip().splitlines()
    answers[name] = (code, lines[-1] if lines else '')
    assert code == 2 and len(lines) == 1 and setting in lines[0], (name, err[-2000:])
    assert lines[0].startswith('run_task.py: error: '), lines
    with open(os.path.join(run, 'metrics.csv'), 'rb') as f:
      assert f.read() == metrics, name  # no round ran
  print(json.dumps(answers, indent=1))


@pytest.mark.parametrize('args, message', [
    ((), '--task is required'),
    (('--task=no_such_module_xyz:build',), "cannot import 'no_such_module_xyz'"),
    (('--task=experiments.tabular.task',), 'must be PACKAGE.MODULE:FUNCTION'),
    (('--task=experiments.tabular.task:nothing',), "no function 'nothing'"),
    (('--task=builtins:str',), 'returned a str, not a dp_ftrl_tff.training.Task'),
])
def test_a_bad_task_entry_is_one_line(tmp_path, args, message):
  code, _, err = binaries.run_in_process(
      binaries.TASK, [f'--root_output_dir={tmp_path}', *args], files=True)
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and message in lines[0], err
  assert lines[0].startswith('run_task.py: error: ')


@pytest.mark.parametrize('content', [None, b'', b'not a database'], ids=['missing', 'empty', 'text'])
def test_a_bad_data_file_of_the_task_is_one_line_naming_data(tmp_path, content):
  path = tmp_path / 'clients.sqlite'
  if content is not None:
    path.write_bytes(content)
  code, _, err = binaries.run_in_process(
      binaries.TASK, [_ENTRY, f'--root_output_dir={tmp_path / "runs"}', f'--data={path}'],
      files=True)
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1, err
  assert lines[0].startswith(f'run_task.py: error: --data: {path} '), lines
  assert not (tmp_path / 'runs').exists()  # nothing written


def test_help_lists_the_task_entry():
  code, out, err = binaries.run_in_process(binaries.TASK, ['--help'])
  assert code == 0, err
  assert '--task: The task entry (required): PACKAGE.MODULE:FUNCTION' in out + err


def _run_binary(root, name, *extra):
  args = [*_FLAGS, f'--root_output_dir={root}', f'--experiment_name={name}', '--rounds=2',
          '--restart_rounds=1', *extra]
  code, _, err = binaries.run(binaries.TASK, args, timeout=900)
  assert code == 0, err[-3000:]
  return os.path.join(str(root), name)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_task_module_trains_with_secure_aggregation(tmp_path, population):
  run = _run_binary(tmp_path, 'secagg', f'--data={population}', '--secure_aggregation',
                    '--secure_bits=20')
  rows = _rows(os.path.join(run, 'metrics.csv'))
  assert len(rows) == 2 and rows[1]['eval_accuracy']
  with open(os.path.join(run, 'plan.json')) as f:
    assert json.load(f)['secure'] is not None


@pytest.mark.e2e
@pytest.mark.slow
def test_the_task_module_trains_on_two_tff_workers_with_canaries(tmp_path, population):
  with remote_workers.launched(2, str(tmp_path / 'workers')) as (addresses, _, _):
    run = _run_binary(tmp_path, 'workers', f'--data={population}', '--canary_clients=20',
                      f'--workers={addresses}')
  local = _run_binary(tmp_path, 'local', f'--data={population}', '--canary_clients=20')
  with open(os.path.join(run, 'participation.csv'), 'rb') as a, open(
      os.path.join(local, 'participation.csv'), 'rb') as b:
    assert a.read() == b.read()
  assert len(_rows(os.path.join(run, 'canaries.csv'))) == len(_rows(os.path.join(local,
                                                                              'canaries.csv')))
  assert len(_rows(os.path.join(run, 'metrics.csv'))) == 2
