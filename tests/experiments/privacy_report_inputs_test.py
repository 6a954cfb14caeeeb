"""`experiments.privacy_report` on files that cannot belong together (issue 36), in-process: a log
missing rows of a min-sep plan, a canary file of another run, metrics that do not parse: exit 2 with
one line naming the flag; a delta too small for the PLD: a warning with the zCDP bound; too few
seen canaries: no empirical epsilon. The run files are written by hand with the project's writers."""

import numpy as np
import pytest

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.mechanisms import blt
from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import binaries

pytestmark = pytest.mark.integration

ROUNDS, COHORT = 6, 3


def _write_run(run, first_round=0, adaptive=False, num_canaries=0):
  """plan.json (BLT, 6 rounds, 3 clients per round, min_sep 2, k 3) and participation.csv from
  `first_round` on; with `num_canaries`, canaries.json / .csv for the first clients."""
  run.mkdir()
  # Adaptive clipping's clipped-count noise (std 0.15) needs a noise multiplier below 0.3.
  plan = plan_lib.RunPlan.build(
      blt.PRODUCTION_STRATEGIES[400], 0.2 if adaptive else 1.0, COHORT, 1.0, num_rounds=ROUNDS,
      participation=participation_lib.ParticipationSchema(2, 3), population=2 * COHORT,
      adaptive_clip=adaptive or None)
  plan_lib.save_plan(plan, run / 'plan.json')
  log = participation_log.ParticipationLogWriter(str(run / 'participation.csv'))
  for r in range(first_round, ROUNDS):
    log.append_round(r, [f'c{COHORT * (r % 2) + i}' for i in range(COHORT)])
  if num_canaries:
    writer = auditing.CanaryFilesWriter(run, num_canaries, 0,
                                        [f'c{i}' for i in range(num_canaries)], 10, plan=plan)
    writer.write_metadata()
    for r in range(ROUNDS):
      writer.append_round(r, np.zeros(2 * num_canaries))
  return plan


def _report(run, *extra):
  return binaries.run_in_process(binaries.REPORT, [
      f'--plan={run / "plan.json"}', f'--participation_log={run / "participation.csv"}',
      '--noequal_privacy', *extra])


def _error_line(code, err):
  assert code == 2, err
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  return lines[0]


def test_a_log_missing_its_first_rounds_is_refused(tmp_path):
  run = tmp_path / 'run'
  _write_run(run, first_round=3)
  line = _error_line(*_report(run)[::2])
  assert line.startswith(f'privacy_report.py: error: --participation_log: {run}/participation.csv '
                         'cannot be the log of this plan: round 0 has 0 rows')


def test_a_log_shorter_than_the_plan_needs_explicit_rounds(tmp_path):
  run = tmp_path / 'run'
  _write_run(run)
  text = (run / 'participation.csv').read_text().splitlines(keepends=True)
  (run / 'participation.csv').write_text(''.join(text[:1 + 3 * COHORT]))
  line = _error_line(*_report(run)[::2])
  assert 'error: --participation_log: ' in line and 'it ends at round 2' in line
  code, _, err = _report(run, '--rounds=3')
  assert code == 0, err


def test_canaries_of_another_plan_are_refused(tmp_path):
  run, other = tmp_path / 'run', tmp_path / 'other'
  _write_run(run)
  _write_run(other, adaptive=True, num_canaries=2)
  line = _error_line(*_report(run, f'--canaries={other / "canaries.json"}')[::2])
  assert line.startswith(f'privacy_report.py: error: --canaries: {other}/canaries.json: it was '
                         'written for another plan')


@pytest.mark.parametrize('metrics', ['garbage\n', 'round,aggregator/clip\n0,1.0\n1,1.1\n2,1.01,x'])
def test_metrics_that_do_not_parse_are_refused_for_the_final_clip(tmp_path, metrics):
  run = tmp_path / 'run'
  _write_run(run, adaptive=True)
  (run / 'metrics.csv').write_text(metrics)
  line = _error_line(*_report(run, f'--metrics={run / "metrics.csv"}')[::2])
  assert line.startswith(f'privacy_report.py: error: --metrics: {run}/metrics.csv')


def test_a_delta_too_small_for_the_pld_warns_with_the_zcdp_bound(tmp_path):
  run = tmp_path / 'run'
  _write_run(run)
  code, out, err = _report(run, '--target_delta=1e-300')
  assert code == 0, err
  (line,) = [w for w in err.splitlines() if 'too small for the PLD' in w]
  assert line.startswith('privacy_report.py: warning: the target delta 1e-300 is too small')
  assert 'the zCDP bound' in line and 'gives epsilon <= ' in line


def test_too_few_seen_canaries_give_no_empirical_epsilon(tmp_path):
  run = tmp_path / 'run'
  _write_run(run, num_canaries=4)
  code, out, err = _report(run, f'--canaries={run / "canaries.json"}')
  assert code == 0, err
  assert 'empirical (' not in out and 'certified lower bound' not in out
  assert f'an estimate needs at least {auditing.MIN_SEEN_CANARIES} seen canaries' in out + err
