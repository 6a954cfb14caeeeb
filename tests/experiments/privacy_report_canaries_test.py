"""`python -m experiments.privacy_report --canaries=RUN/canaries.json`: the empirical privacy of a run
directory written with the project's writers (plan.json, participation.csv, canaries.json / .csv),
equal to `auditing.empirical_privacy` computed directly; the warning on the console; bad inputs
(one line on stderr naming the flag, exit status 2).

Seen canary i takes part in rounds i mod 5, i mod 5 + 5, ... (4 times in 20 rounds); its projections
are its 0/1 pattern plus noise_scale * sigma * standard normal noise (the Gaussian mechanism has no
noise correlation), unseen ones the noise only.
"""

import json

import numpy as np
import pytest

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.mechanisms import gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import binaries

pytestmark = pytest.mark.e2e

NUM_ROUNDS, MIN_SEP, SIGMA = 20, 5, 2.0


def _write_run(directory, num_canaries, noise_scale, delta=1e-3, seed=0):
  """Writes plan.json, participation.csv and the canary files; returns (plan, patterns)."""
  directory.mkdir(parents=True, exist_ok=True)
  run_plan = plan_lib.RunPlan.for_accounting(
      gaussian.GaussianStrategy(), SIGMA, num_rounds=NUM_ROUNDS,
      participation=participation_lib.ParticipationSchema(MIN_SEP, 4), target_delta=delta)
  plan_lib.save_plan(run_plan, str(directory / 'plan.json'))
  canary_ids = [f'canary{i}' for i in range(num_canaries)]
  patterns = np.zeros((num_canaries, NUM_ROUNDS))
  for i in range(num_canaries):
    patterns[i, i % MIN_SEP::MIN_SEP] = 1.0
  rng = np.random.default_rng(seed)
  log = participation_log.ParticipationLogWriter(str(directory / 'participation.csv'))
  canaries = auditing.CanaryFilesWriter(directory, num_canaries, seed, canary_ids, 1000,
                                        plan=run_plan)
  canaries.write_metadata()
  for t in range(NUM_ROUNDS):
    log.append_round(t, [f'other{t}'] + [c for c, p in zip(canary_ids, patterns[:, t],
                                                            strict=True) if p])
    projections = noise_scale * SIGMA * rng.standard_normal(2 * num_canaries)
    projections[:num_canaries] += patterns[:, t]
    canaries.append_round(t, projections)
  return run_plan, patterns


def _args(run, *extra):
  return [f'--plan={run / "plan.json"}', f'--participation_log={run / "participation.csv"}',
          f'--canaries={run / auditing.CANARY_FILE}', '--json', *extra]


def test_rows_equal_empirical_privacy_of_the_files(tmp_path):
  run = tmp_path / 'run'
  run_plan, patterns = _write_run(run, 200, 1.0)
  code, out, err = binaries.run(binaries.REPORT, _args(run), tmp_path)
  assert code == 0, err
  printed = json.loads(out)
  record = auditing.read_canaries(str(run / auditing.CANARY_FILE))
  expected = auditing.empirical_privacy(run_plan, record, patterns, 1e-3)
  assert printed['empirical_privacy'] == [row.to_dict() for row in expected]
  assert [row['threat_model'] for row in printed['empirical_privacy']] == ['all_iterates']
  assert 'certified lower bound' not in err


def test_lower_bound_above_the_accounted_epsilon_warns_on_the_console(tmp_path):
  # Half the noise, 10^4 canaries, delta 1e-2: the certified bounds clear 2.32 accounted.
  run = tmp_path / 'run'
  _write_run(run, 10_000, 0.5, delta=1e-2)
  out_dir = tmp_path / 'report'
  code, out, err = binaries.run(
      binaries.REPORT, _args(run, f'--output_dir={out_dir}', '--noplots', '--noequal_privacy'),
      tmp_path)
  assert code == 0, err
  printed = json.loads(out)
  (row,) = printed['empirical_privacy']
  assert row['epsilon_lower_bound'] > printed['epsilon']
  (warning,) = [line for line in err.splitlines() if 'certified lower bound' in line]
  assert warning.startswith('privacy_report.py: warning: a certified lower bound on epsilon '
                            'exceeds the accounted epsilon ')
  assert '(all_iterates: ' in warning and 'Do not launch' in warning
  assert json.loads((out_dir / 'report.json').read_text()) == printed
  markdown = (out_dir / 'report.md').read_text()
  assert '## Empirical privacy (canaries)' in markdown
  assert '- **WARNING:** a certified lower bound' in markdown


def _error_line(err):
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  return lines[0]


def test_canaries_without_participation_log_is_a_usage_error(tmp_path):
  run = tmp_path / 'run'
  _write_run(run, 4, 1.0)
  code, _, err = binaries.run(
      binaries.REPORT, [f'--plan={run / "plan.json"}', f'--canaries={run / "canaries.json"}'],
      tmp_path)
  assert code == 2
  line = _error_line(err)
  assert line.startswith('privacy_report.py: error: --canaries requires --participation_log')


@pytest.mark.parametrize('damage', ['corrupt_json', 'missing_csv', 'bad_row', 'no_file',
                                    'other_run'])
def test_bad_canary_file_is_one_line_naming_the_flag_and_path(tmp_path, damage):
  run = tmp_path / 'run'
  _write_run(run, 4, 1.0)
  path = run / auditing.CANARY_FILE
  if damage == 'corrupt_json':
    path.write_text('{"format": 1, "seen": ')
  elif damage == 'missing_csv':
    (run / auditing.PROJECTIONS_FILE).unlink()
  elif damage == 'bad_row':
    with open(run / auditing.PROJECTIONS_FILE, 'a') as f:
      f.write('7,1,2,3\n')
  elif damage == 'no_file':
    path = run / 'nothing.json'
  else:  # canaries of a longer run than the participation log and plan: 25 rounds
    writer = auditing.CanaryFilesWriter(run, 4, 0, [f'canary{i}' for i in range(4)], 1000,
                                        plan=plan_lib.load_plan(run / 'plan.json'))
    for t in range(NUM_ROUNDS, 25):
      writer.append_round(t, np.zeros(8))
  args = _args(run)
  args[2] = f'--canaries={path}'
  code, _, err = binaries.run(binaries.REPORT, args, tmp_path)
  assert code == 2, err
  line = _error_line(err)
  assert line.startswith('privacy_report.py: error: --canaries: ') and str(path) in line
  assert 'Traceback' not in err
