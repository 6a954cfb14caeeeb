"""Tests of the program releases (`programs.metrics_release`, `programs.report_release`) and of the
one report path (`accounting.report_files`): a program's report equals the `privacy_report` binary's
on the same files, intermediate reports leave later rounds out, metrics rows are the drivers' and
are released in round order."""

import asyncio
import csv
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.accounting import report_files, run_metrics
from dp_ftrl_tff.mechanisms import blt, gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.programs import data_source, metrics_release, report_release
from tests.testing import run_files

pytestmark = pytest.mark.unit

IDS = [f'client-{i:03d}' for i in range(60)]
ROUNDS = 6
WRAP_ROUND = 3  # 0-based round whose secure sum wraps in the fake metrics


def _plan(kind: str, **kwargs) -> plan_lib.RunPlan:
  if kind == 'poisson':  # amplification by sampling needs independent noise
    return plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, None, 1.0, num_rounds=ROUNDS,
                                  sampling=sampling_lib.Sampling('poisson', 0.1, 1, len(IDS)),
                                  **kwargs)
  strategy = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2))
  return plan_lib.RunPlan.build(strategy, 1.0, 5, 1.0, num_rounds=ROUNDS, population=len(IDS),
                                participation=participation_lib.ParticipationSchema.b_min_sep(2, 3),
                                **kwargs)


def _metrics(t: int) -> dict:
  """train_model's released metrics structure of 0-based round t (as `extract_and_rewrap_metrics`
  leaves it), with the aggregator's measurements of a SecAgg run."""
  return {
      'distributor': (),
      'client_work': {},
      'aggregator': {'round': np.int64(t), 'segment': np.int32(0), 'clip': np.float32(1.0 + t / 8),
                     'sensitivity_clip': np.float32(1.25), 'clipped_count': np.float32(t),
                     'zeroed_count': np.float32(0), 'noise_stddev': np.float32(0.5),
                     'modular_wrap': np.int32(t == WRAP_ROUND),
                     'projections': np.zeros(3, np.float32)},  # not a scalar: left out
      'finalizer': {'update_non_finite': np.int32(0)},
      'model_metrics': {'loss': np.float32(2.0 - t / 10), 'num_examples': np.int64(40)},
  }


def _run_files(run_dir, kind: str, plan: plan_lib.RunPlan, rounds: int = ROUNDS,
               after_metrics=()):
  """A driver-like run directory: plan.json, then per round the data source's select (logging
  participation.csv) and the metrics release into metrics.csv, with train_model's 1-based keys."""
  run_dir.mkdir(parents=True, exist_ok=True)
  plan_lib.save_plan(plan, run_dir / 'plan.json')
  log_path = f'{run_dir}/participation.csv'
  iterator = data_source.SampledClientDataSource(IDS, plan, log_path, 11).iterator()
  csv_manager = tff.program.CSVFileReleaseManager(f'{run_dir}/metrics.csv', key_fieldname='round')
  release = metrics_release.RoundMetricsReleaseManager([csv_manager], after_metrics=after_metrics)

  async def train():
    for t in range(rounds):
      iterator.select(5 if kind == 'min_sep' else 6)
      await release.release(_metrics(t), key=t + 1)
  asyncio.run(train())
  return log_path


@pytest.mark.parametrize('kind', ['min_sep', 'poisson'])
def test_program_report_equals_the_binary_report(tmp_path, kind):
  run = tmp_path / 'run'
  report = report_release.PrivacyReportReleaseManager(
      f'{run}/plan.json', f'{run}/participation.csv', f'{run}/privacy_report',
      total_rounds=ROUNDS, metrics=f'{run}/metrics.csv', plots=False)
  log_path = _run_files(run, kind, _plan(kind), after_metrics=[report])
  program = json.loads((run / 'privacy_report' / 'report.json').read_text())
  binary = run_files.standalone_report(run, tmp_path / 'binary', f'--participation_log={log_path}')
  assert program == binary
  assert sorted(p.name for p in (run / 'privacy_report').iterdir()) == ['report.json', 'report.md']
  if kind == 'poisson':
    assert program['amplified'] is not None


def test_every_k_writes_reports_of_the_first_rounds(tmp_path):
  run = tmp_path / 'run'
  plan = _plan('min_sep')
  _run_files(run, 'min_sep', plan)  # the log already holds every round when the reports run
  report = report_release.PrivacyReportReleaseManager(
      f'{run}/plan.json', f'{run}/participation.csv', f'{run}/out', total_rounds=ROUNDS,
      metrics=f'{run}/metrics.csv', every=4, plots=False)

  async def release_all():
    for key in range(1, ROUNDS + 1):
      await report.release(None, key=key)
  asyncio.run(release_all())
  assert sorted(p.name for p in (run / 'out').iterdir()) == ['report.json', 'report.md', 'round_4']
  assert report.output_dir_for(2) is None and report.output_dir_for(8) is None
  # The report after 4 rounds is that of a run that stopped there: the binary's on a 4-round log
  # with --rounds=4.
  short = tmp_path / 'short'
  short_log = _run_files(short, 'min_sep', plan, rounds=4)
  intermediate = json.loads((run / 'out' / 'round_4' / 'report.json').read_text())
  binary = run_files.standalone_report(short, tmp_path / 'binary', f'--participation_log={short_log}',
                       '--rounds=4')
  assert run_files.masked_report(intermediate) == run_files.masked_report(binary)
  final = json.loads((run / 'out' / 'report.json').read_text())
  assert run_files.masked_report(final) != run_files.masked_report(intermediate)


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


class _SlowRecorder(tff.program.ReleaseManager):
  """Records (key, value) and what metrics.csv holds at release time; earlier keys sleep longer,
  so unordered releases would finish out of order."""

  def __init__(self, metrics_csv=None):
    self.released, self.csv_rounds = [], []
    self._metrics_csv = metrics_csv

  async def release(self, value, key):
    await asyncio.sleep(0.01 * (ROUNDS - key % ROUNDS))
    self.released.append((key, value))
    if self._metrics_csv:
      self.csv_rounds.append([int(r['round']) for r in _rows(self._metrics_csv)])


def test_metrics_release_writes_the_drivers_rows_in_round_order(tmp_path):
  metrics_csv = tmp_path / 'metrics.csv'
  rows = _SlowRecorder()
  after = _SlowRecorder(metrics_csv)
  release = metrics_release.RoundMetricsReleaseManager(
      [rows, tff.program.CSVFileReleaseManager(str(metrics_csv), key_fieldname='round')],
      after_metrics=[after])

  async def train_model_like():  # train_model starts one background release task per round
    tasks = [asyncio.create_task(release.release(_metrics(t), key=t + 1)) for t in range(ROUNDS)]
    await asyncio.gather(*tasks)
  asyncio.run(train_model_like())
  assert [k for k, _ in rows.released] == list(range(ROUNDS))
  assert [k for k, _ in after.released] == list(range(1, ROUNDS + 1))
  assert after.released[0][1] is not None and 'model_metrics' in after.released[0][1]
  # The report release sees the round's row already written.
  assert after.csv_rounds == [list(range(t + 1)) for t in range(ROUNDS)]
  written = _rows(metrics_csv)
  assert [int(r['round']) for r in written] == list(range(ROUNDS))
  assert set(written[0]) == {
      'round', 'train_loss', 'train_num_examples', 'aggregator/round', 'aggregator/segment',
      run_metrics.CLIP_METRIC, 'aggregator/sensitivity_clip', 'aggregator/clipped_count',
      'aggregator/zeroed_count', 'aggregator/noise_stddev', run_metrics.MODULAR_WRAP_METRIC}
  assert rows.released[1][1] == metrics_release.round_metrics(_metrics(1))
  assert rows.released[1][1]['train_loss'] == pytest.approx(1.9)
  # What the report reads of it: the wrapped rounds, the segments and the final clip.
  segments = run_metrics.read_secure_segments(str(metrics_csv))
  assert segments == {'segments': [{'segment': 0, 'clip': 1.0, 'sensitivity_clip': 1.25}],
                      'wrap_rounds': [WRAP_ROUND]}
  assert run_metrics.read_final_clip(str(metrics_csv)) == pytest.approx(1.0 + (ROUNDS - 1) / 8)
  assert run_metrics.read_secure_segments(str(metrics_csv), max_rounds=WRAP_ROUND) == {
      'segments': segments['segments'], 'wrap_rounds': []}
  assert run_metrics.read_final_clip(str(metrics_csv), max_rounds=2) == pytest.approx(1.125)


def test_secure_run_report_lists_the_wrapped_round(tmp_path):
  run = tmp_path / 'run'
  plan = _plan('min_sep', secure=16)
  log_path = _run_files(run, 'min_sep', plan)
  report = report_files.report_from_run_files(f'{run}/plan.json', log_path,
                                              metrics=f'{run}/metrics.csv')
  assert any(f'{WRAP_ROUND}' in w and 'wrap' in w for w in report.warnings)
  before = report_files.report_from_run_files(plan, log_path, metrics=f'{run}/metrics.csv',
                                              num_rounds=WRAP_ROUND)
  assert not any('wrap' in w for w in before.warnings)
  with pytest.raises(ValueError, match='`metrics`'):
    report_files.report_from_run_files(plan, log_path)


def test_bad_arguments_raise_value_error_naming_the_parameter(tmp_path):
  make = report_release.PrivacyReportReleaseManager
  good = dict(plan='p.json', participation_log='l.csv', output_dir='out', total_rounds=4)
  for name, value in [('plan', ''), ('participation_log', None), ('output_dir', 3),
                      ('total_rounds', 0), ('total_rounds', True), ('every', 0),
                      ('every', 1.5), ('metrics', ''), ('canaries', 7), ('plots', 'yes')]:
    with pytest.raises(ValueError, match=f'`{name}`'):
      make(**{**good, name: value})
  manager = make(**good)
  for key in (0, 5, 'a', True):
    with pytest.raises(ValueError, match='`key`'):
      asyncio.run(manager.release(None, key=key))
  for managers in ('csv', [object()], None):
    with pytest.raises(ValueError, match='`managers`'):
      metrics_release.RoundMetricsReleaseManager(managers)
  with pytest.raises(ValueError, match='`after_metrics`'):
    metrics_release.RoundMetricsReleaseManager([], after_metrics=[1])
  rows = metrics_release.RoundMetricsReleaseManager([])
  with pytest.raises(ValueError, match='`key`'):
    asyncio.run(rows.release(_metrics(0), key=0))
  with pytest.raises(ValueError, match='`metrics`'):
    asyncio.run(rows.release({'aggregator': {}}, key=1))
  plan = _plan('min_sep')
  log = _run_files(tmp_path / 'run', 'min_sep', plan, rounds=2)
  with pytest.raises(ValueError, match='`plan`'):
    report_files.report_from_run_files({'plan': 1}, log)
  with pytest.raises(ValueError, match='`plan`'):
    report_files.report_from_run_files(dataclasses.replace(plan, noise_multiplier=0.0), log)
  for num_rounds in (0, 2.0, True):
    with pytest.raises(ValueError, match='`num_rounds`'):
      report_files.report_from_run_files(plan, log, num_rounds=num_rounds)
  with pytest.raises(ValueError, match='`max_rounds`'):
    run_metrics.read_final_clip(f'{tmp_path}/run/metrics.csv', max_rounds=0)


@pytest.mark.e2e
def test_the_report_path_does_not_load_tensorflow():
  """The one report path stays in `accounting` (no TensorFlow): the CLI and launch owners use it."""
  code = ('import sys; import dp_ftrl_tff.accounting.report_files, '
          'dp_ftrl_tff.accounting.run_metrics; '
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
          "assert 'matplotlib' not in sys.modules, 'matplotlib imported before plotting'")
  subprocess.run([sys.executable, '-c', code], check=True, timeout=120)


def test_a_round_without_examples_has_no_training_loss():
  row = {'train_loss': 0.0, 'train_accuracy': 0.0, 'train_num_examples': 0.0,
         'train_num_batches': 0.0, 'aggregator/clip': 1.0}
  blanked = metrics_release.blank_untrained(row)
  assert np.isnan(blanked['train_loss']) and np.isnan(blanked['train_accuracy'])
  assert {k: v for k, v in blanked.items() if k not in ('train_loss', 'train_accuracy')} == {
      'train_num_examples': 0.0, 'train_num_batches': 0.0, 'aggregator/clip': 1.0}
  trained = dict(row, train_num_examples=3.0)
  assert metrics_release.blank_untrained(trained) == trained
