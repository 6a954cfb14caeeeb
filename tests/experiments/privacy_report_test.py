"""End-to-end tests of `python -m experiments.privacy_report` (run as a subprocess)."""

import csv
import hashlib
import json

import numpy as np
import pytest

from dp_ftrl_tff.accounting import report_render
from dp_ftrl_tff.mechanisms import banded, banded_optimizer, blt, files, participation
from tests.testing import binaries

pytestmark = pytest.mark.e2e



def _run(*args):
  return binaries.run_process(binaries.REPORT, args)


def test_writes_report_files_and_json_keys(tmp_path):
  out = tmp_path / 'out'
  proc = _run('--mechanism=tree_efficient', '--noise_multiplier=7', '--rounds=2000', '--min_sep=314',
              '--max_participations=6', '--restart_rounds=128,1152', '--clipped_count_stddev=325',
              f'--output_dir={out}', '--json')
  assert proc.returncode == 0, proc.stderr
  printed = json.loads(proc.stdout)
  written = json.loads((out / 'report.json').read_text())
  assert printed == written
  for key in report_render.REQUIRED_KEYS:
    assert key in written
  assert written['min_separation'] == written['min_sep'] - 1 == 313
  assert written['delta'] == 1e-10
  assert written['value_noise_multiplier'] == pytest.approx(7.000405952470763)
  # Restarts only lower the exact tree sensitivity (79 without restarts, TF-Privacy's value).
  assert written['sensitivity_squared'] <= 79
  for name in ('report.md', *report_render.PLOT_FILES):
    assert (out / name).stat().st_size > 0


def test_blt_from_file_and_participation_log(tmp_path):
  path = str(tmp_path / 'blt.json')
  files.save_strategy(blt.PRODUCTION_STRATEGIES[400], path)
  log = tmp_path / 'log.csv'
  with open(log, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(('client_id', 'round'))
    writer.writerows([('u1', 0), ('u2', 1), ('u1', 3), ('u3', 5), ('u2', 6)])
  proc = _run(f'--mechanism_file={path}', '--target_epsilon=2', '--rounds=8', '--min_sep=4',
              f'--participation_log={log}', '--json')
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)
  assert out['mechanism'] == 'blt' and out['participation_source'] == 'observed'
  assert (out['min_sep'], out['max_participations']) == (3, 2)
  assert out['epsilon'] == pytest.approx(2.0, rel=1e-6)
  assert any('min_sep=4' in w for w in [f['text'] for f in out['findings'] if f['severity'] == 'warning'])


@pytest.mark.parametrize('args, flag', [
    (['--mechanism=foo', '--noise_multiplier=1', '--rounds=10', '--min_sep=1'], '--mechanism'),
    (['--mechanism=tree', '--noise_multiplier=1', '--rounds=ten', '--min_sep=1'], '--rounds'),
    (['--mechanism=tree', '--noise_multiplier=1', '--rounds=10', '--min_sep=0'], '--min_sep'),
    (['--mechanism=tree', '--rounds=10', '--min_sep=1'], '--noise_multiplier'),
    (['--mechanism=tree', '--noise_multiplier=1', '--target_rho=1', '--rounds=10', '--min_sep=1'],
     '--target_rho'),
    (['--mechanism=gaussian', '--noise_multiplier=1', '--rounds=10', '--min_sep=1',
      '--target_delta=2'], '--target_delta'),
    (['--mechanism=blt', '--theta=0.9,2', '--omega=0.1,0.1', '--noise_multiplier=1',
      '--rounds=10', '--min_sep=1'], '--theta'),
    (['--plan=/nonexistent.json', '--rounds=10', '--min_sep=1'], '--plan'),
    (['--plan=/nonexistent.json', '--noise_multiplier=1', '--rounds=10', '--min_sep=1'], '--plan'),
    (['--mechanism=gaussian', '--noise_multiplier=1', '--participation_log=/nonexistent.csv'],
     '--participation_log'),
    (['--mechanism=banded', '--noise_multiplier=1', '--rounds=10', '--min_sep=1'],
     '--mechanism_file'),
    (['--mechanism=tree', '--noise_multiplier=1', '--rounds=10', '--min_sep=1',
      '--restart_rounds=10'], '--restart_rounds'),
])
def test_bad_flags_give_one_line_errors(args, flag):
  proc = _run(*args)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert flag in lines[0]


def test_saved_banded_file(tmp_path):
  path = str(tmp_path / 'banded.npz')
  files.save_strategy(banded.BandedStrategy(np.eye(50) + np.eye(50, k=-1)), path)  # 2 bands
  proc = _run(f'--mechanism_file={path}', '--noise_multiplier=2', '--rounds=50', '--min_sep=1',
              '--max_participations=2', '--json')
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)
  assert out['mechanism'] == 'banded' and not out['sensitivity_exact']
  proc = _run(f'--mechanism_file={path}', '--noise_multiplier=2', '--rounds=51', '--min_sep=1')
  assert proc.returncode != 0 and '--rounds' in proc.stderr


def test_plan_file_gives_the_same_report_as_its_flags(tmp_path):
  from dp_ftrl_tff import plan as plan_lib
  from dp_ftrl_tff import settings
  strategy = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.1, 0.1))
  run_plan = plan_lib.RunPlan.build(strategy, 3.0, 100, None, adaptive_clip=settings.AdaptiveClipping(
      initial_clip=1.0, clipped_count_stddev=10.0, restarts=settings.RestartSchedule(4, 6)))
  path = tmp_path / 'plan.json'
  plan_lib.save_plan(run_plan, path)
  from_plan = _run(f'--plan={path}', '--rounds=20', '--min_sep=3', '--json')
  from_flags = _run('--mechanism=blt', '--theta=0.9,0.5', '--omega=0.1,0.1', '--noise_multiplier=3',
                    '--clipped_count_stddev=10', '--restart_rounds=4,10,16', '--rounds=20',
                    '--min_sep=3', '--json')
  assert from_plan.returncode == 0, from_plan.stderr
  assert from_flags.returncode == 0, from_flags.stderr
  a, b = json.loads(from_plan.stdout), json.loads(from_flags.stdout)
  for key in ('rho', 'epsilon', 'sensitivity_squared', 'restart_rounds', 'value_noise_multiplier'):
    assert a[key] == b[key], key



@pytest.mark.slow  # three subprocesses
def test_square_root_mechanisms_report():
  from dp_ftrl_tff.mechanisms import participation, registry  # pylint: disable=g-import-not-at-top
  for mechanism in ('bsr', 'bisr'):
    proc = _run(f'--mechanism={mechanism}', '--num_bands=342', '--noise_multiplier=7',
                '--rounds=2052', '--min_sep=342', '--max_participations=6', '--json')
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    strategy = registry.strategy_from_config({'mechanism': mechanism, 'num_bands': 342})
    sens_sq = strategy.sensitivity_squared(2052, participation.ParticipationSchema(342, 6))
    assert out['mechanism'] == mechanism and out['sensitivity_exact']
    assert out['sensitivity_squared'] == pytest.approx(sens_sq, rel=1e-12)
    assert out['rho'] == pytest.approx(sens_sq / (2 * 7.0**2), rel=1e-12)
  proc = _run('--mechanism=bisr', '--noise_multiplier=7', '--rounds=20', '--min_sep=2')
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1 and '--num_bands' in proc.stderr


def _violating_log(tmp_path):
  """u1 returns after 3 rounds: breaks a declared --min_sep=4."""
  log = tmp_path / 'log.csv'
  with open(log, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(('client_id', 'round'))
    writer.writerows([('u1', 0), ('u2', 1), ('u1', 3), ('u3', 5), ('u2', 6)])
  return log


def test_strict_exits_1_on_a_schema_violation_after_writing_the_report(tmp_path):
  log = _violating_log(tmp_path)
  args = ['--mechanism=tree', '--noise_multiplier=3', '--rounds=8', '--min_sep=4',
          f'--participation_log={log}', '--noequal_privacy', '--noplots']
  assert _run(*args).returncode == 0
  out = tmp_path / 'out'
  proc = _run(*args, '--strict', f'--output_dir={out}')
  assert proc.returncode == 1
  *warnings, error = proc.stderr.strip().splitlines()  # the report's warnings, then the error
  assert error.startswith('privacy_report.py: error: --strict'), proc.stderr
  assert warnings and all(w.startswith('privacy_report.py: warning: ') for w in warnings), warnings
  written = json.loads((out / 'report.json').read_text())
  # The report states the guarantee of what was observed (realized min_sep 3).
  assert written['participation_source'] == 'observed' and written['min_sep'] == 3
  assert written['observed']['violations']
  compliant = ['--mechanism=tree', '--noise_multiplier=3', '--rounds=8', '--min_sep=3',
               f'--participation_log={log}', '--noequal_privacy', '--strict']
  assert _run(*compliant).returncode == 0


def test_equal_privacy_rows_table_and_plot(tmp_path):
  out = tmp_path / 'out'
  proc = _run('--mechanism=blt', '--noise_multiplier=3', '--rounds=40', '--min_sep=8',
              f'--output_dir={out}', '--json')
  assert proc.returncode == 0, proc.stderr
  rows = json.loads(proc.stdout)['equal_privacy']
  labels = [row['mechanism'] for row in rows]
  assert labels[0] == 'gaussian' and labels[-1] == 'blt (this run)'
  assert [row['run_mechanism'] for row in rows].count(True) == 1
  for row in rows:
    assert {'noise_multiplier', 'max_loss', 'rms_loss', 'sensitivity_squared'} <= set(row)
  gaussian_row, run_row = rows[0], rows[-1]
  assert run_row['noise_multiplier'] == pytest.approx(3.0, rel=1e-12)  # the run's own noise
  assert run_row['max_loss'] < gaussian_row['max_loss']
  markdown = (out / 'report.md').read_text()
  assert '## 6. Mechanisms at equal privacy' in markdown and '**blt (this run)**' in markdown
  assert (out / report_render.EQUAL_PRIVACY_PLOT).stat().st_size > 0


def test_strategy_file_for_another_setting_is_refused_or_reported_with_its_sha256(tmp_path):
  result = blt.optimize_blt(20, participation.ParticipationSchema(4, 3), num_buffers=2)
  path = tmp_path / 'blt.json'
  files.save_strategy(result.strategy, str(path), result)
  digest = hashlib.sha256(path.read_bytes()).hexdigest()
  common = [f'--mechanism_file={path}', '--noise_multiplier=3', '--rounds=20',
            '--max_participations=3', '--noequal_privacy', '--json']
  matching = _run(*common, '--min_sep=4')
  assert matching.returncode == 0, matching.stderr
  record = json.loads(matching.stdout)['strategy_file']
  assert record['sha256'] == digest and record['path'] == str(path)
  assert record['mismatches'] == [] and record['setting']['min_sep'] == 4
  refused = _run(*common, '--min_sep=5')
  assert refused.returncode == 2 and refused.stdout == ''
  assert len(refused.stderr.strip().splitlines()) == 1
  assert '--mechanism_file' in refused.stderr and 'min_sep: optimized for 4' in refused.stderr
  allowed = _run(*common, '--min_sep=5', '--allow_strategy_setting_mismatch')
  assert allowed.returncode == 0, allowed.stderr
  out = json.loads(allowed.stdout)
  assert out['strategy_file']['sha256'] == digest
  assert out['strategy_file']['mismatches'] == ['min_sep: optimized for 4, the run has 5']
  assert any('optimized for another setting' in w for w in [f['text'] for f in out['findings'] if f['severity'] == 'warning'])


@pytest.mark.unit
def test_planned_report_flags_of_trees_banded_restarts_and_blt(tmp_path):
  """The flags no other test runs in this binary: --completion, --fixed_epoch, --target_rho,
  --restart_warmup / --restart_period, --observed_patterns, --noplots, --noequal_privacy,
  both --banded_beyond_max_rounds values, --theta / --omega, --target_delta (in process)."""
  def report(*args):
    code, out, err = binaries.run_in_process(binaries.REPORT, [*args, '--json'])
    assert code == 0, err
    return json.loads(out)

  log = tmp_path / 'log.csv'  # fixed-epoch: each client once in each of 2 epochs of 4 rounds
  log.write_text('client_id,round\n' + ''.join(f'{c},{r}\n{c},{r + 4}\n' for r, c in enumerate('abcd')))
  out = tmp_path / 'out'
  tree = report('--mechanism=tree', '--completion', '--rounds=8', '--min_sep=4',
                '--max_participations=2', '--fixed_epoch', '--target_rho=0.5', '--restart_warmup=2',
                '--restart_period=4', f'--participation_log={log}', '--observed_patterns',
                f'--output_dir={out}', '--noplots', '--noequal_privacy')
  assert tree['restart_rounds'] == [2, 6] and tree['declared']['fixed_epoch'] is True
  assert tree['calibration'] == {'target_rho': 0.5}
  assert tree['declared']['rho'] == pytest.approx(0.5, rel=1e-6)
  assert tree['observed']['violations'] == [] and tree['observed']['tree_patterns'] is not None
  assert tree['equal_privacy'] is None
  assert sorted(p.name for p in out.iterdir()) == ['report.json', 'report.md']  # no plots
  completed = report('--mechanism=tree', '--completion', '--rounds=6', '--min_sep=2',
                     '--noise_multiplier=2')
  plain = report('--mechanism=tree', '--rounds=6', '--min_sep=2', '--noise_multiplier=2')
  assert completed['sensitivity_squared'] > plain['sensitivity_squared']  # 8 leaves, more nodes

  path = str(tmp_path / 'banded.npz')
  files.save_strategy(banded.BandedStrategy.from_toeplitz([1.0, 0.5], num_rounds=4), path)
  common = (f'--mechanism_file={path}', '--rounds=8', '--min_sep=2', '--noise_multiplier=2')
  code, _, err = binaries.run_in_process(binaries.REPORT, [*common,
                                                           '--banded_beyond_max_rounds=error'])
  assert code == 2 and '--banded_beyond_max_rounds' in err, err
  beyond = report(*common, '--banded_beyond_max_rounds=restart')
  assert beyond['restart_rounds'] == [4]
  bltr = report('--mechanism=blt', '--theta=0.9,0.5', '--omega=0.3,0.2', '--rounds=8', '--min_sep=2',
                '--noise_multiplier=2', '--target_delta=1e-6')
  assert bltr['mechanism_config']['theta'] == [0.9, 0.5] and bltr['delta'] == 1e-6


@pytest.mark.unit
def test_optimizer_options_optimize_for_the_reports_setting():
  """--num_buffers, --error and --toeplitz ask for the mechanism's optimizer (issue 44): the report
  states the guarantee of the strategy `optimize_blt` / `optimize_banded` give for its setting."""
  def report(*args):
    code, out, err = binaries.run_in_process(binaries.REPORT, [
        *args, '--rounds=8', '--min_sep=2', '--max_participations=4', '--noise_multiplier=2',
        '--json'])
    assert code == 0, err
    return json.loads(out)

  schema = participation.ParticipationSchema(2, 4)
  for error in ('max', 'rms'):
    one = report('--mechanism=blt', '--num_buffers=1', f'--error={error}')
    optimized = blt.optimize_blt(8, schema, num_buffers=1, error=error)
    assert len(one['mechanism_config']['theta']) == 1
    assert one['sensitivity_squared'] == pytest.approx(
        optimized.strategy.sensitivity_squared(8, schema), rel=1e-6)
  toeplitz = report('--mechanism=banded', '--num_bands=2', '--toeplitz')
  expected = banded_optimizer.optimize_banded(8, 2, schema, toeplitz=True).strategy
  assert toeplitz['sensitivity_squared'] == pytest.approx(expected.sensitivity_squared(8, schema),
                                                          rel=1e-6)
