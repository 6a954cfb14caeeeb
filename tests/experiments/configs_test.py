"""Every flagfile in configs/ parses with its driver's flags into a valid, schedulable run.

Paper-scale flagfiles are checked against the real populations; each has a synthetic-scale
companion (`*_synthetic.cfg`) that states its epsilon and is run here for a round.
"""

import glob
import os
import re

import numpy as np
import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import zcdp
from dp_ftrl_tff.learning import client_sampler
from dp_ftrl_tff.training import run_setup, training_loop
from experiments.emnist import run_emnist
from experiments.run import driver_flags
from experiments.stackoverflow import run_stackoverflow
from tests.testing import runs

pytestmark = pytest.mark.unit

CONFIG_DIR = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')
# Training populations of the real datasets (TFF's documentation).
POPULATIONS = {'emnist': 3383, 'stackoverflow': 342477}
# Each paper-scale flagfile X.cfg has a synthetic-scale companion X_synthetic.cfg that runs in minutes.
SYNTHETIC_SUFFIX = '_synthetic.cfg'
SYNTHETIC = sorted(glob.glob(os.path.join(CONFIG_DIR, '*' + SYNTHETIC_SUFFIX)))
PAPER_SCALE = sorted(p for p in glob.glob(os.path.join(CONFIG_DIR, '*.cfg'))
                     if not p.endswith(SYNTHETIC_SUFFIX) and os.path.basename(p) != 'demo.cfg')


def _driver(path):
  return run_stackoverflow if 'stackoverflow' in os.path.basename(path) else run_emnist


def _parse(path, *args):
  """The `RunConfig` of `python -m <driver> --flagfile=path *args`."""
  driver = _driver(path)
  fv = driver.FLAGS
  try:
    fv(['prog', f'--flagfile={path}', *args])
    return driver_flags.config_from_flags(fv, driver.task_settings(fv))
  finally:
    fv.unparse_flags()


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(CONFIG_DIR, '*.cfg'))), ids=os.path.basename)
def test_flagfile_is_valid(path, tmp_path):
  driver = run_stackoverflow if 'stackoverflow' in os.path.basename(path) else run_emnist
  fv = driver.FLAGS
  try:
    fv(['prog', f'--flagfile={path}', f'--root_output_dir={tmp_path}'])
    config = driver_flags.config_from_flags(fv, driver.task_settings(fv))
  finally:
    fv.unparse_flags()
  population = (config.synthetic_num_clients if config.data == 'synthetic' else
                POPULATIONS['stackoverflow' if driver is run_stackoverflow else 'emnist'])
  client_sampler.check_schedule(population, config.clients_per_round, config.min_sep,
                                config.max_participations, config.rounds)
  if 'stackoverflow' in path and not path.endswith(SYNTHETIC_SUFFIX):
    assert (config.rounds, config.min_sep, config.max_participations) == (2052, 342, 6)
    assert config.task['vocab_size'] == 10000 and config.task['lstm_size'] == 670


@pytest.mark.parametrize('path', PAPER_SCALE, ids=os.path.basename)
def test_paper_scale_flagfile_has_a_synthetic_companion(path):
  companion = path[:-len('.cfg')] + SYNTHETIC_SUFFIX
  assert companion in SYNTHETIC, f'{os.path.basename(companion)} is missing'
  paper, synthetic = (_parse(p, '--root_output_dir=/unused') for p in (path, companion))
  assert synthetic.mechanism == paper.mechanism
  assert synthetic.adaptive_clipping == paper.adaptive_clipping


@pytest.mark.parametrize('path', SYNTHETIC, ids=os.path.basename)
def test_synthetic_flagfile_states_its_epsilon(path, tmp_path):
  with open(path) as f:
    stated = re.findall(r'^# .*epsilon=(\d+\.\d+) at delta=(\S+) ', f.read(), re.MULTILINE)
  assert len(stated) == 1, f'{path}: no "# ... epsilon=<e> at delta=<d> " comment'
  epsilon, delta = float(stated[0][0]), float(stated[0][1])
  # The strategy the driver would use (optimized at start), accounted for the declared schedule.
  config = _parse(path, f'--root_output_dir={tmp_path}')
  assert config.target_delta == delta
  plan = run_setup.build_plan(config, run_setup.run_strategy(config)[0],
                              config.synthetic_num_clients)
  guarantee = zcdp.guarantee(plan.strategy, config.rounds, config.participation,
                             plan.noise_multiplier, delta,
                             restart_rounds=plan.restart_rounds(config.rounds))
  assert guarantee.epsilon == pytest.approx(epsilon, abs=0.006)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize('path', SYNTHETIC, ids=os.path.basename)
def test_synthetic_flagfile_runs_a_round(path, tmp_path):
  # The documented command (README, docs/training.md) with `--rounds=1` and a tiny eval appended.
  config = _parse(path, f'--root_output_dir={tmp_path}', '--rounds=1', '--eval_max_examples=64')
  assert config.data == 'synthetic' and config.rounds == 1
  result = training_loop.train(_driver(path).build_task(config), config, config.output_dir)
  assert np.isfinite(result['metrics']['train_loss'])
  assert np.isfinite(result['metrics']['eval_loss'])
  assert result['privacy_report'] is not None


@pytest.mark.parametrize('overrides', [
    {}, {'adaptive_clipping': True, 'clipped_count_stddev': 1.0},
    {'sampler': 'poisson', 'sampling_prob': 0.1, 'clients_per_round': None, 'min_sep': 1}],
    ids=['fixed_clip', 'adaptive_clip', 'poisson'])
def test_the_drivers_plan_is_the_one_plan_build_makes_of_its_settings(tmp_path, overrides):
  # The drivers construct the plan from settings that are already resolved; `RunPlan.build`
  # (which resolves shorthand) must give the same plan.
  config = runs.tiny_config(tmp_path, **overrides)
  resolved = run_setup.run_strategy(config)[0]
  built = plan_lib.RunPlan.build(
      resolved.strategy, config.noise_multiplier, config.clients_per_round, config.clip_norm,
      **config.plan_settings(30), beyond_max_rounds=config.banded_beyond_max_rounds,
      num_rounds=config.rounds, participation=config.participation,
      target_delta=config.target_delta, strategy_source=resolved.source, population=30,
      noise_seed_fixed=True)
  assert run_setup.build_plan(config, resolved, 30) == built
