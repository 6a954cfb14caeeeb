"""The error contract of the three CLIs, table-driven: every bad input exits 2 (a user mistake: bad
or conflicting flags, a missing, corrupt, truncated, empty or wrongly typed input file, an impossible
schedule, a size that cannot fit in memory) or 1 (a runtime failure: unwritable output), with exactly
one line on stderr and no traceback. Plus the console of a tiny driver run (header, round, eval and summary lines on stdout).

The error contract runs in-process (`binaries.run_in_process`: the binary's own entry point, its
stderr captured, its exit turned into the code): the same parsing, validation and message as the
binary, without an interpreter start per case. `SMOKE` repeats a few cases per binary as a
subprocess (`binaries.run`), for what only a process shows: the exit status, a stderr of exactly
one line with no TensorFlow C++ log noise (the drivers run without TF_CPP_MIN_LOG_LEVEL), no
traceback. The driver cases fail before any TFF computation.
"""

import json

import pytest

from tests.testing import binaries
from tests.testing.binaries import EMNIST, MECH, REPORT, SO

pytestmark = pytest.mark.integration

TINY = ('--model=tiny', '--rounds=2', '--clients_per_round=3', '--synthetic_num_clients=30',
        '--synthetic_examples_per_client=8', '--min_sep=2')

# (module, args, exit code, fragment of the one stderr line). `{dir}` is a per-test directory holding
# `corrupt.json`, `corrupt.npz`, `corrupt.csv`, `corrupt.sqlite`; `{out}` is a root output directory.
CASES = [
    # --- the drivers (EMNIST and StackOverflow) ---
    (EMNIST, ['--mechanism=dpsgd'], 2, '--mechanism'),
    (EMNIST, ['--rounds=0'], 2, 'rounds'),
    (EMNIST, ['--rounds=ten'], 2, '--rounds'),
    (EMNIST, ['--noise_multiplier=1', '--target_epsilon=2'], 2,
     '--target_epsilon excludes --noise_multiplier'),
    (EMNIST, ['--target_epsilon=-1'], 2, 'target_epsilon'),
    (EMNIST, ['--mechanism=banded', '--rounds=1000000000', '--min_sep=1'], 2,
     'too large for banded'),
    (EMNIST, [*TINY[:1], '--clients_per_round=342', '--min_sep=1000', '--rounds=2052',
              '--synthetic_num_clients=1000'], 2, 'Impossible schedule'),
    (EMNIST, ['--mechanism_file=/nonexistent/blt.json'], 2, '--mechanism_file'),
    (EMNIST, [*TINY, '--mechanism_file={dir}/corrupt.json'], 2, 'corrupt'),
    (EMNIST, ['--secure_aggregation', '--secure_bits=1', '--clients_per_round=100'], 2,
     '--secure_bits'),
    (EMNIST, ['--restart_warmup=3'], 2, '--restart_period'),
    (EMNIST, ['extra_argument'], 2, 'unexpected arguments'),
    (EMNIST, [*TINY, '--data=/nonexistent/emnist.sqlite'], 2, '/nonexistent/emnist.sqlite'),
    (EMNIST, [*TINY, '--root_output_dir=/proc/no_such_dir'], 1, '/proc/no_such_dir'),
    (SO, ['--vocab_size=many'], 2, '--vocab_size'),
    (SO, ['--mechanism=blt', '--rounds=1000000000', '--min_sep=1'], 2, 'too large for blt'),
    (SO, ['--server_momentum=1.5'], 2, 'server_momentum'),
    # --- python -m experiments.mechanisms_cli ---
    (MECH, [], 2, 'expected one command'),
    (MECH, ['train'], 2, 'expected one command'),
    (MECH, ['optimize', '--mechanism=gaussian', '--rounds=10', '--min_sep=1'], 2, '--mechanism'),
    (MECH, ['evaluate', '--mechanism=tree', '--rounds=0', '--min_sep=1'], 2, '--rounds'),
    (MECH, ['evaluate', '--mechanism=blt', '--theta=0.9', '--omega=0.1',
            '--rounds=1000000000', '--min_sep=1'], 2, 'too large for blt'),
    (MECH, ['optimize', '--mechanism=banded', '--rounds=1000000', '--min_sep=10'], 2,
     'too large for banded'),
    (MECH, ['evaluate', '--mechanism=tree_full', '--rounds=200000', '--min_sep=1'], 2,
     'too large for tree_full'),
    (MECH, ['evaluate', '--mechanism=blt', '--theta=0.9', '--rounds=10', '--min_sep=1'], 2,
     '--omega'),
    (MECH, ['evaluate', '--mechanism=tree', '--rounds=10', '--min_sep=2', '--fixed_epoch'], 2,
     '--max_participations'),
    (MECH, ['evaluate', '--mechanism_file=/nonexistent.json', '--rounds=10', '--min_sep=1'], 2,
     '--mechanism_file'),
    (MECH, ['evaluate', '--mechanism_file={dir}/corrupt.json', '--rounds=10', '--min_sep=1'], 2,
     '--mechanism_file'),
    (MECH, ['evaluate', '--mechanism_file={dir}/corrupt.npz', '--rounds=10', '--min_sep=1'], 2,
     '--mechanism_file'),
    (MECH, ['optimize', '--mechanism=blt', '--rounds=10', '--min_sep=2',
            '--output=/nonexistent/dir/blt.json'], 1, '--output'),
    (MECH, ['optimize', '--mechanism=blt', '--rounds=10', '--min_sep=2', '--output={dir}'], 1,
     '--output'),
    # --- python -m experiments.privacy_report ---
    (REPORT, ['--mechanism=foo', '--noise_multiplier=1', '--rounds=10', '--min_sep=1'], 2,
     '--mechanism'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1', '--rounds=ten', '--min_sep=1'], 2,
     '--rounds'),
    (REPORT, ['--mechanism=tree', '--rounds=10', '--min_sep=1'], 2, '--noise_multiplier'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1', '--target_epsilon=1', '--rounds=10',
              '--min_sep=1'], 2, '--target_epsilon'),
    (REPORT, ['--mechanism=blt', '--noise_multiplier=1', '--rounds=1000000000', '--min_sep=1'], 2,
     'too large for blt'),
    (REPORT, ['--mechanism=gaussian', '--noise_multiplier=1', '--rounds=10', '--min_sep=1',
              '--target_delta=2'], 2, '--target_delta'),
    (REPORT, ['--plan=/nonexistent/plan.json', '--rounds=10', '--min_sep=1'], 2, '--plan'),
    (REPORT, ['--plan={dir}/corrupt.json', '--rounds=10', '--min_sep=1'], 2, '--plan'),
    (REPORT, ['--mechanism=gaussian', '--noise_multiplier=1', '--participation_log={dir}/corrupt.csv'],
     2, '--participation_log'),
    (REPORT, ['--mechanism_file={dir}/corrupt.json', '--noise_multiplier=1', '--rounds=10',
              '--min_sep=1'], 2, '--mechanism_file'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1', '--rounds=10', '--min_sep=1',
              '--output_dir=/proc/no_such_dir'], 1, '--output_dir'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1', '--rounds=10', '--min_sep=1',
              '--restart_rounds=10'], 2, '--restart_rounds'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1', '--rounds=10', '--min_sep=1', 'extra'], 2,
     'unexpected arguments'),
]


@pytest.fixture
def inputs_dir(tmp_path):
  directory = tmp_path / 'inputs'
  directory.mkdir()
  (directory / 'corrupt.json').write_text('{"mechanism": "blt", "theta": [0.9')
  (directory / 'corrupt.npz').write_bytes(b'PK\x03\x04 not a zip archive')
  (directory / 'corrupt.csv').write_text('who,when\nu1,zero\n')
  return directory


def _case_id(case):
  module, args, code, _ = case
  return f'{module.rsplit(".", 1)[-1]}:{code}:{" ".join(args)[:60]}'


# One exit-2 and (where the binary has one) one exit-1 case of each binary, as a subprocess.
SMOKE = [
    (EMNIST, [*TINY, '--data=/nonexistent/emnist.sqlite'], 2, '/nonexistent/emnist.sqlite'),
    (EMNIST, [*TINY, '--root_output_dir=/proc/no_such_dir'], 1, '/proc/no_such_dir'),
    (SO, ['--server_momentum=1.5'], 2, 'server_momentum'),
    (MECH, ['evaluate', '--mechanism=tree', '--rounds=0', '--min_sep=1'], 2, '--rounds'),
    (MECH, ['optimize', '--mechanism=blt', '--rounds=10', '--min_sep=2',
            '--output=/nonexistent/dir/blt.json'], 1, '--output'),
    (REPORT, ['--plan=/nonexistent/plan.json', '--rounds=10', '--min_sep=1'], 2, '--plan'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1', '--rounds=10', '--min_sep=1',
              '--output_dir=/proc/no_such_dir'], 1, '--output_dir'),
]


def _check_bad_input(run, tmp_path, inputs_dir, module, args, exit_code, fragment):
  args = [a.replace('{dir}', str(inputs_dir)) for a in args]
  if module in (EMNIST, SO) and not any(a.startswith('--root_output_dir') for a in args):
    args.insert(0, f'--root_output_dir={tmp_path / "runs"}')
  returncode, _, stderr = run(module, args)
  lines = stderr.splitlines()
  assert 'Traceback' not in stderr, stderr[-3000:]
  assert len(lines) == 1, stderr[-3000:]
  assert returncode == exit_code, lines[0]
  assert 'error: ' in lines[0] and fragment in lines[0], lines[0]
  assert not (tmp_path / 'runs').exists()  # a failed start creates no directory
  print(f'TABLE | {module} {" ".join(args)} | {returncode} | {lines[0]}')


@pytest.mark.parametrize('module, args, exit_code, fragment', CASES, ids=map(_case_id, CASES))
def test_bad_input_is_one_line_with_its_exit_code(tmp_path, inputs_dir, module, args, exit_code,
                                                  fragment):
  _check_bad_input(binaries.run_in_process, tmp_path, inputs_dir, module, args, exit_code,
                   fragment)


@pytest.mark.e2e
@pytest.mark.parametrize('module, args, exit_code, fragment', SMOKE, ids=map(_case_id, SMOKE))
def test_bad_input_as_a_process_is_one_quiet_line(tmp_path, inputs_dir, module, args, exit_code,
                                                  fragment):
  _check_bad_input(binaries.run, tmp_path, inputs_dir, module, args, exit_code, fragment)


def test_debug_flag_prints_the_traceback():
  returncode, _, stderr = binaries.run_in_process(
      MECH, ['evaluate', '--mechanism=blt', '--theta=0.9', '--omega=0.1', '--rounds=1000000000',
             '--min_sep=1', '--debug'])
  assert returncode == 2
  assert 'Traceback' in stderr and stderr.splitlines()[-1].startswith('mechanisms: error: --rounds=')
  returncode, _, stderr = binaries.run_in_process(
      REPORT, ['--mechanism=blt', '--noise_multiplier=1', '--rounds=1000000000', '--min_sep=1',
               '--debug'])
  assert returncode == 2
  assert 'Traceback' in stderr and 'too large for blt' in stderr.splitlines()[-1]


@pytest.mark.e2e
def test_tiny_run_console(tmp_path):
  """Header, one line per round, eval lines with the epsilon spent, and the final summary on
  stdout; --target_epsilon calibrates the noise multiplier, stored in the plan."""
  root = tmp_path / 'runs'
  returncode, stdout, stderr = binaries.run(
      EMNIST, [f'--root_output_dir={root}', *TINY, '--mechanism=blt', '--noise_seed=3',
               '--eval_every=1', '--eval_max_examples=64', '--target_epsilon=5',
               '--target_delta=1e-6'], tmp_path, timeout=600)
  assert returncode == 0, stderr[-3000:]
  assert 'cuda_dnn' not in stderr and 'Traceback' not in stderr, stderr[-3000:]
  lines = stdout.splitlines()
  with open(root / 'run' / 'plan.json') as f:
    sigma = json.load(f)['noise_multiplier']
  header = '\n'.join(lines[:6])
  for fragment in ('data        synthetic: 30 training clients', 'mechanism   blt',
                   f'noise multiplier {sigma:.6g} (calibrated to epsilon=5 at delta=1e-06)',
                   'clip 1', '3 clients per round, 2 rounds, min_sep 2',
                   'planned     epsilon 5 at delta 1e-06'):
    assert fragment in header, header
  rounds = [line for line in lines if line.startswith('round ')]
  assert [r.split()[1] for r in rounds] == ['1/2', '2/2'] and all('ETA' in r for r in rounds)
  evals = [line for line in lines if line.startswith('eval  after round ')]
  assert len(evals) == 2 and all('epsilon spent' in e and 'loss' in e for e in evals)
  assert 'epsilon spent 5 at delta 1e-06' in evals[-1]  # the whole run, as planned
  assert f'run directory {root / "run"}:' in lines
  for name in ('hparams.json', 'plan.json', 'participation.csv', 'metrics.csv', 'checkpoints/',
               'privacy_report/'):
    assert any(line.strip().startswith(name) for line in lines), name
  with open(root / 'run' / 'hparams.json') as f:
    hparams = json.load(f)
  assert hparams['target_epsilon'] == 5 and hparams['noise_multiplier'] is None
  # Rerun: the run is finished; one line says so and nothing is rewritten (exit 0).
  files = {p: p.read_bytes() for p in (root / 'run').rglob('*') if p.is_file()}
  args = [f'--root_output_dir={root}', *TINY, '--mechanism=blt', '--noise_seed=3',
          '--eval_every=1', '--eval_max_examples=64', '--target_epsilon=5', '--target_delta=1e-6']
  returncode, stdout, stderr = binaries.run(EMNIST, args, tmp_path)
  assert returncode == 0 and stdout == '', stderr
  assert stderr.splitlines() == [
      f'{root / "run"} holds this run, finished after round 2/2: nothing to do. Its report: '
      f'{root / "run" / "privacy_report" / "report.md"} (--force_report rewrites it; a larger '
      '--rounds trains on).'], stderr
  assert {p: p.read_bytes() for p in (root / 'run').rglob('*') if p.is_file()} == files
  report = root / 'run' / 'privacy_report' / 'report.json'
  report.unlink()
  returncode, _, stderr = binaries.run(EMNIST, [*args, '--force_report'], tmp_path, timeout=600)
  assert returncode == 0 and report.exists(), stderr[-3000:]


@pytest.mark.parametrize('name, fragment', [
    ('../escaped', 'one directory name'), ('..', 'one directory name'),
    ('a/b', 'one directory name'), ('/tmp/absolute', 'one directory name'),
    ('', 'non-empty'), (' ', 'non-empty'), ('x' * 300, '300 bytes long'),
])
def test_experiment_name_is_one_directory_name(tmp_path, name, fragment):
  root = tmp_path / 'runs'
  returncode, _, stderr = binaries.run_in_process(
      EMNIST, [f'--root_output_dir={root}', *TINY, f'--experiment_name={name}'])
  lines = stderr.splitlines()
  assert returncode == 2 and len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith('run_emnist.py: error: --experiment_name ') and fragment in lines[0]
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('field, value', [('noise_multiplier', 'abc'), ('clients_per_round', [1])])
def test_plan_field_of_the_wrong_type_is_one_line_naming_plan_and_path(tmp_path, field, value):
  """privacy_report --plan with a plan.json field of the wrong JSON type: exit 2, one stderr line
  naming --plan, the file and the field, and no report written."""
  from dp_ftrl_tff import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff.mechanisms import gaussian  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'plan.json'
  plan_lib.save_plan(plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, 10, 1.0,
                                            num_rounds=10, population=100), path)
  config = json.loads(path.read_text())
  config[field] = value
  path.write_text(json.dumps(config))
  out = tmp_path / 'report_out'
  returncode, stdout, stderr = binaries.run_in_process(
      REPORT, [f'--plan={path}', '--min_sep=2', f'--output_dir={out}'])
  lines = stderr.splitlines()
  assert returncode == 2 and len(lines) == 1, stderr[-3000:]
  assert 'error: --plan' in lines[0] and str(path) in lines[0] and f"'{field}'" in lines[0], lines[0]
  assert not out.exists() and stdout == ''


# --- Corrupt input files (bad_inputs: corrupt files): each is exit 2, one stderr line naming the
# flag and the path, nothing written. ---


def _corrupt_inputs(directory):
  """{name: path} of corrupt, truncated, empty and wrongly typed input files in `directory`."""
  import sqlite3  # pylint: disable=g-import-not-at-top
  directory.mkdir()
  paths = {}

  def write(name, content):
    paths[name] = directory / name
    if isinstance(content, bytes):
      paths[name].write_bytes(content)
    else:
      paths[name].write_text(content)

  garbage = bytes(range(256)) * 16
  write('garbage.sqlite', garbage)
  write('empty.sqlite', b'')
  other = directory / 'other.sqlite'  # a SQLite database, but not TFF's client data
  with sqlite3.connect(other) as connection:
    connection.execute('CREATE TABLE notes (text TEXT)')
    connection.executemany('INSERT INTO notes VALUES (?)', [('x' * 1000,)] * 200)
  connection.close()
  paths['other.sqlite'] = other
  for cache in ('emnist_cache', 'so_cache'):  # cache directories, with a truncated download
    paths[cache] = directory / cache
    paths[cache].mkdir()
  write('emnist_cache/emnist_all.sqlite', other.read_bytes()[:20000])
  write('so_cache/stackoverflow.sqlite', garbage[:100])
  write('word_counts.bin', garbage)
  write('word_counts_bad.txt', 'the 10\nlist of words\n')
  write('corrupt.json', '{"mechanism": "blt", "theta": [0.9')
  write('list.json', '[1, 2, 3]\n')
  write('truncated.npz', b'PK\x03\x04\x14\x00\x00\x00')
  write('empty.csv', b'')
  write('garbage.csv', garbage)
  write('log.json', '{"client_id": "u1", "round": 0}\n')
  write('other_metrics.csv', 'round,loss\n0,1.5\n')
  write('header_only_metrics.csv', 'round,aggregator/segment,aggregator/clip\n')
  return paths


DRIVER_FILE_CASES = [  # (module, flag, file: in the test's directory, extra flags)
    (EMNIST, 'data', 'garbage.sqlite', ()),
    (EMNIST, 'data', 'empty.sqlite', ()),
    (EMNIST, 'data', 'other.sqlite', ()),
    (EMNIST, 'data', 'emnist_cache', ()),
    (SO, 'data', 'so_cache', ()),
    (SO, 'word_counts', 'word_counts.bin', ('--data={dir}/garbage.sqlite',)),
]


@pytest.mark.parametrize('module, flag, name, extra', DRIVER_FILE_CASES,
                         ids=[f'{m.rsplit(".", 1)[-1]}:{f}:{n}' for m, f, n, _ in DRIVER_FILE_CASES])
def test_corrupt_driver_input_names_flag_and_path(tmp_path, module, flag, name, extra):
  """A driver given a corrupt --data / --word_counts: exit 2, one line naming the flag and the path
  (the cache directory's file for a directory), no traceback, no run directory."""
  paths = _corrupt_inputs(tmp_path / 'inputs')
  root = tmp_path / 'runs'
  tiny = TINY if module == EMNIST else ('--vocab_size=20', '--embedding_size=4', '--lstm_size=4',
                                        *TINY[1:])
  args = [f'--root_output_dir={root}', *tiny, f'--{flag}={paths[name]}',
          *(a.replace('{dir}', str(tmp_path / 'inputs')) for a in extra)]
  returncode, stdout, stderr = binaries.run_in_process(module, args)
  lines = stderr.splitlines()
  assert returncode == 2 and len(lines) == 1, stderr[-3000:]
  assert f'error: --{flag}' in lines[0] and str(paths[name]) in lines[0], lines[0]
  assert 'Traceback' not in stderr and not root.exists() and 'round ' not in stdout


def _secure_plan(path):
  """A SecAgg run's plan.json at `path` (its report reads the run's --metrics)."""
  from dp_ftrl_tff import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from dp_ftrl_tff.mechanisms import gaussian  # pylint: disable=g-import-not-at-top
  plan_lib.save_plan(plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, 10, 1.0, secure=16,
                                            num_rounds=10, population=100), path)
  return path


REPORT_FILE_CASES = [  # (flag, file, other flags); {plan} is a SecAgg plan.json
    ('participation_log', 'garbage.csv', ('--mechanism=gaussian', '--noise_multiplier=1')),
    ('participation_log', 'empty.csv', ('--mechanism=gaussian', '--noise_multiplier=1')),
    ('participation_log', 'log.json', ('--mechanism=gaussian', '--noise_multiplier=1')),
    ('metrics', 'garbage.csv', ('--plan={plan}',)),
    ('metrics', 'empty.csv', ('--plan={plan}',)),
    ('metrics', 'other_metrics.csv', ('--plan={plan}',)),
    ('metrics', 'header_only_metrics.csv', ('--plan={plan}',)),
    ('plan', 'empty.csv', ()),
    ('mechanism_file', 'list.json', ('--noise_multiplier=1', '--rounds=10', '--min_sep=1')),
    ('mechanism_file', 'truncated.npz', ('--noise_multiplier=1', '--rounds=10', '--min_sep=1')),
]


@pytest.mark.parametrize('flag, name, extra', REPORT_FILE_CASES,
                         ids=[f'{f}:{n}' for f, n, _ in REPORT_FILE_CASES])
def test_corrupt_report_input_names_flag_and_path(tmp_path, flag, name, extra):
  """privacy_report given a corrupt or wrongly typed input file: exit 2, one line naming the flag
  and the path, no report written."""
  paths = _corrupt_inputs(tmp_path / 'inputs')
  plan = _secure_plan(tmp_path / 'plan.json')
  out = tmp_path / 'report_out'
  args = [f'--{flag}={paths[name]}', *(a.replace('{plan}', str(plan)) for a in extra),
          f'--output_dir={out}']
  returncode, stdout, stderr = binaries.run_in_process(REPORT, args)
  lines = stderr.splitlines()
  assert returncode == 2 and len(lines) == 1, stderr[-3000:]
  assert f'error: --{flag}' in lines[0] and str(paths[name]) in lines[0], lines[0]
  assert not out.exists() and stdout == ''


@pytest.mark.parametrize('name', ['list.json', 'truncated.npz', 'garbage.sqlite', 'empty.sqlite'])
def test_corrupt_mechanism_file_of_the_mechanisms_cli_names_flag_and_path(tmp_path, name):
  paths = _corrupt_inputs(tmp_path / 'inputs')
  returncode, stdout, stderr = binaries.run_in_process(
      MECH, ['evaluate', f'--mechanism_file={paths[name]}', '--rounds=10', '--min_sep=1'])
  lines = stderr.splitlines()
  assert returncode == 2 and len(lines) == 1, stderr[-3000:]
  assert 'error: --mechanism_file' in lines[0] and str(paths[name]) in lines[0], lines[0]
  assert stdout == ''
