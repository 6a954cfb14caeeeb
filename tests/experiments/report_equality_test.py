"""The report a driver writes at the end of a run is, byte for byte (report.json and report.md, paths
masked), the one `experiments.privacy_report` writes from the run's `plan.json`,
`participation.csv` and `metrics.csv`: both call `report_files.report_from_run_files`, and the
report is a function of its inputs (no wall time). --metrics gives the standalone report adaptive
clipping's final clip, as the driver reads it, and --canaries the empirical rows of a run with
canary clients."""

import json

import pytest

from dp_ftrl_tff import auditing
from dp_ftrl_tff.training import run_dir, training_loop
from experiments import privacy_report
from experiments.emnist import run_emnist
from tests.testing import run_files, runs

pytestmark = pytest.mark.integration

EMNIST_TASK = {'model': 'tiny', 'only_digits': True}


def _standalone_report(run_directory, out, canaries: bool) -> dict:
  privacy_report.FLAGS.unparse_flags()
  try:
    privacy_report.FLAGS([
        'privacy_report', f'--plan={run_directory}/{run_dir.PLAN_FILE}',
        f'--participation_log={run_directory}/{run_dir.PARTICIPATION_FILE}',
        f'--metrics={run_directory}/{run_dir.METRICS_FILE}', f'--output_dir={out}', '--json']
        + ([f'--canaries={run_directory}/{auditing.CANARY_FILE}'] if canaries else []))
    assert privacy_report.main(['privacy_report']) == 0
  finally:
    privacy_report.FLAGS.unparse_flags()
  return json.loads((out / 'report.json').read_text())


# One case runs in `make test-fast` (each is a driver run, about 35 s); `make test` runs them all.
@pytest.mark.parametrize('overrides', [
    pytest.param(dict(mechanism='blt', min_sep=2), marks=pytest.mark.slow),
    pytest.param(dict(mechanism='gaussian', sampler='poisson', clients_per_round=None,
                      sampling_prob=0.1, min_sep=1, rounds=3), marks=pytest.mark.slow),
    pytest.param(dict(mechanism='banded', mechanism_options={'num_bands': 2},
                      sampler='cyclic_poisson', sampling_groups=2, clients_per_round=None,
                      sampling_prob=0.2, min_sep=2, rounds=4), marks=pytest.mark.slow),
    pytest.param(dict(mechanism='gaussian', adaptive_clipping=True, clipped_count_stddev=2.0,
                      clip_norm=0.5, min_sep=2, canary_clients=10), marks=pytest.mark.slow),
    dict(mechanism='blt', min_sep=2, canary_clients=20, rounds=3),
], ids=['min_sep', 'poisson', 'cyclic_poisson', 'adaptive_clip_canaries', 'canaries'])
def test_driver_report_equals_standalone_report(tmp_path, overrides):
  config = runs.tiny_config(tmp_path / 'runs', task=EMNIST_TASK, **overrides)
  training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  driver_dir = tmp_path / 'runs' / 'run' / run_dir.REPORT_DIR
  driver = json.loads((driver_dir / 'report.json').read_text())
  standalone = _standalone_report(config.output_dir, tmp_path / 'standalone',
                                  config.canary_clients > 0)
  assert standalone == driver
  driver_texts = run_files.report_texts(driver_dir, config.output_dir)
  assert run_files.report_texts(tmp_path / 'standalone', config.output_dir) == driver_texts
  assert (driver['empirical_privacy'] is not None) == (config.canary_clients > 0)
  if config.sampler != 'min_sep':
    assert driver['amplified'] is not None
  if config.adaptive_clipping:  # the final clip is the last round's, from metrics.csv (--metrics)
    final_clip = driver['run_facts']['final_clip']
    assert final_clip is not None and final_clip == run_dir.read_final_clip(
        f'{config.output_dir}/{run_dir.METRICS_FILE}')
  else:
    assert driver['run_facts']['final_clip'] is None
