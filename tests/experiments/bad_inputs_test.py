"""The error contract of the three CLIs, table-driven: every bad input exits 2 (a user mistake: bad
or conflicting flags, a missing file, an impossible schedule, a size that cannot fit in memory) or 1
(a runtime failure: unwritable output, a corrupt input file), with exactly one line on stderr and no
traceback. Plus the console of a tiny driver run (header, round, eval and summary lines on stdout).

Every CLI runs as a subprocess with stdout/stderr redirected to files (an orphaned TFF worker_binary
would keep a pipe open). The driver cases fail before any TFF computation; they run without
TF_CPP_MIN_LOG_LEVEL, so they also check that the drivers silence TensorFlow's C++ logs by default.
"""

import json

import pytest

from tests.experiments.cli_testing import EMNIST, MECH, REPORT, SO, run_cli

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
    (EMNIST, [*TINY, '--mechanism_file={dir}/corrupt.json'], 1, 'corrupt'),
    (EMNIST, ['--secure_aggregation', '--secure_bits=1', '--clients_per_round=100'], 2,
     '--secure_bits'),
    (EMNIST, ['--restart_warmup=3'], 2, '--restart_period'),
    (EMNIST, ['extra_argument'], 2, 'unexpected arguments'),
    (EMNIST, [*TINY, '--data=/nonexistent/emnist.sqlite'], 2, '/nonexistent/emnist.sqlite'),
    (EMNIST, [*TINY, '--root_output_dir=/proc/no_such_dir'], 1, '/proc/no_such_dir'),
    (SO, ['--vocab_size=many'], 2, '--vocab_size'),
    (SO, ['--mechanism=blt', '--rounds=1000000000', '--min_sep=1'], 2, 'too large for blt'),
    (SO, ['--server_momentum=1.5'], 2, 'server_momentum'),
    # --- python -m dp_ftrl_tff.mechanisms ---
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
    (MECH, ['evaluate', '--mechanism_file={dir}/corrupt.json', '--rounds=10', '--min_sep=1'], 1,
     '--mechanism_file'),
    (MECH, ['evaluate', '--mechanism_file={dir}/corrupt.npz', '--rounds=10', '--min_sep=1'], 1,
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
    (REPORT, ['--plan={dir}/corrupt.json', '--rounds=10', '--min_sep=1'], 1, '--plan'),
    (REPORT, ['--mechanism=gaussian', '--noise_multiplier=1', '--participation_log={dir}/corrupt.csv'],
     1, '--participation_log'),
    (REPORT, ['--mechanism_file={dir}/corrupt.json', '--noise_multiplier=1', '--rounds=10',
              '--min_sep=1'], 1, '--mechanism_file'),
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


@pytest.mark.parametrize('module, args, exit_code, fragment', CASES, ids=map(_case_id, CASES))
def test_bad_input_is_one_line_with_its_exit_code(tmp_path, inputs_dir, module, args, exit_code,
                                                  fragment):
  args = [a.replace('{dir}', str(inputs_dir)) for a in args]
  if module in (EMNIST, SO) and not any(a.startswith('--root_output_dir') for a in args):
    args.insert(0, f'--root_output_dir={tmp_path / "runs"}')
  returncode, _, stderr = run_cli(module, args, tmp_path)
  lines = stderr.splitlines()
  assert 'Traceback' not in stderr, stderr[-3000:]
  assert len(lines) == 1, stderr[-3000:]
  assert returncode == exit_code, lines[0]
  assert 'error: ' in lines[0] and fragment in lines[0], lines[0]
  print(f'TABLE | {module} {" ".join(args)} | {returncode} | {lines[0]}')


def test_debug_flag_prints_the_traceback(tmp_path):
  returncode, _, stderr = run_cli(MECH, ['evaluate', '--mechanism=blt', '--theta=0.9',
                                         '--omega=0.1', '--rounds=1000000000', '--min_sep=1',
                                         '--debug'], tmp_path)
  assert returncode == 2
  assert 'Traceback' in stderr and stderr.splitlines()[-1].startswith('error: --rounds=')
  returncode, _, stderr = run_cli(REPORT, ['--mechanism=blt', '--noise_multiplier=1',
                                           '--rounds=1000000000', '--min_sep=1', '--debug'],
                                  tmp_path)
  assert returncode == 2
  assert 'Traceback' in stderr and 'too large for blt' in stderr.splitlines()[-1]


def test_tiny_run_console(tmp_path):
  """Header, one line per round, eval lines with the epsilon spent, and the final summary on
  stdout; --target_epsilon calibrates the noise multiplier, stored in the plan."""
  root = tmp_path / 'runs'
  returncode, stdout, stderr = run_cli(
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
