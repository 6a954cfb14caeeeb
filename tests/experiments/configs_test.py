"""Every flagfile in configs/ parses with its driver's flags into a valid, schedulable run."""

import glob
import os

import pytest

from dp_ftrl_tff.learning import client_sampler
from experiments import driver_flags
from experiments.emnist import run_emnist
from experiments.stackoverflow import run_stackoverflow

CONFIG_DIR = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')
# Training populations of the real datasets (TFF's documentation).
POPULATIONS = {'emnist': 3383, 'stackoverflow': 342477}


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(CONFIG_DIR, '*.cfg'))))
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
  if 'stackoverflow' in path:
    assert (config.rounds, config.min_sep, config.max_participations) == (2052, 342, 6)
    assert config.task['vocab_size'] == 10000 and config.task['lstm_size'] == 670
