"""`tff.learning.programs.train_model` with the releases: its metrics land in metrics.csv as the
drivers' rows (0-based `round`, `train_<m>`), and its privacy report, written at the last round and
every K rounds, equals the `privacy_report` binary's on the run's files."""

import asyncio
import csv
import json

import pytest
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.mechanisms import blt
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.programs import data_source, metrics_release, report_release
from tests.testing import programs, run_files

pytestmark = pytest.mark.integration

ROUNDS, PER_ROUND, SEED = 4, 3, 4


def test_train_model_releases_the_drivers_metrics_and_report(tmp_path):
  client_data = programs.client_data()
  process = programs.regression_process(client_data)
  plan = plan_lib.RunPlan.build(
      blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2)), 1.0, PER_ROUND, 1.0,
      num_rounds=ROUNDS, population=len(client_data.client_ids),
      participation=participation_lib.ParticipationSchema.b_min_sep(2, 2))
  run = tmp_path / 'run'
  run.mkdir()
  plan_lib.save_plan(plan, run / 'plan.json')
  source = data_source.SampledClientDataSource(
      client_data, plan, f'{run}/participation.csv', SEED)
  report = report_release.PrivacyReportReleaseManager(
      f'{run}/plan.json', f'{run}/participation.csv', f'{run}/privacy_report',
      total_rounds=ROUNDS, metrics=f'{run}/metrics.csv', every=2, plots=False)
  metrics = metrics_release.RoundMetricsReleaseManager(
      [tff.program.CSVFileReleaseManager(f'{run}/metrics.csv', key_fieldname='round')],
      after_metrics=[report])
  context = tff.program.NativeFederatedContext(
      tff.backends.native.create_async_local_cpp_execution_context())
  with tff.framework.get_context_stack().install(context):
    asyncio.run(tff.learning.programs.train_model(
        train_process=process, train_data_source=source, train_per_round_clients=PER_ROUND,
        train_total_rounds=ROUNDS,
        program_state_manager=tff.program.FileProgramStateManager(str(run / 'state')),
        model_output_manager=tff.program.MemoryReleaseManager(),
        train_metrics_manager=metrics, evaluation_manager=None, evaluation_periodicity=1))

  with open(run / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [int(r['round']) for r in rows] == list(range(ROUNDS))
  assert {'train_loss', 'train_num_examples'} <= set(rows[0])
  assert all(name == 'round' or name.startswith(('train_', 'aggregator/')) for name in rows[0])
  assert sorted(p.name for p in (run / 'privacy_report').iterdir()) == [
      'report.json', 'report.md', 'round_2']
  program = json.loads((run / 'privacy_report' / 'report.json').read_text())
  binary = run_files.standalone_report(run, tmp_path / 'binary',
                                     f'--participation_log={run}/participation.csv')
  assert program == binary
