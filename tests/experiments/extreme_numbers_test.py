"""Extreme sizes and numbers through the binaries' entry points (in-process): each is one line on
stderr naming the flag or the file, exit status 2, before any training or unbounded search."""

import json

import numpy as np
import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.mechanisms import banded, blt, files
from tests.testing import binaries
from tests.testing.binaries import EMNIST, MECH, REPORT

pytestmark = pytest.mark.integration

_REPORT = ('--rounds=10', '--min_sep=1')

CASES = [
    (EMNIST, ['--canary_clients=1000000000'], '--canary_clients=1000000000 is too large'),
    (EMNIST, ['--noise_multiplier=1e300'], '--noise_multiplier=1e+300 is outside'),
    (EMNIST, ['--noise_multiplier=1e-300'], '--noise_multiplier=1e-300 is outside'),
    (MECH, ['select_bands', '--rounds=100', '--dataset_size=1000', '--batch_size=10',
            '--target_epsilon=1e6'], '--target_epsilon=1e+06 is above'),
    (MECH, ['amplified', '--rounds=100', '--sampling_groups=2', '--sampling_prob=0.1',
            '--target_epsilon=1e6'], '--target_epsilon=1e+06 is above'),
    (MECH, ['evaluate', '--mechanism=blt', '--theta=0.9', '--omega=1e300', *_REPORT],
     '--omega has an entry of magnitude 1e+300'),
    (REPORT, ['--mechanism=tree', '--target_epsilon=1e6', *_REPORT],
     '--target_epsilon=1e+06 is above'),
    (REPORT, ['--mechanism=gaussian', '--noise_multiplier=1', '--rounds=1000000000', '--min_sep=1'],
     'use a --noise_multiplier of at least 2236 (or fewer --rounds)'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1e300', *_REPORT],
     '--noise_multiplier=1e+300 is outside'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1e-300', *_REPORT],
     '--noise_multiplier=1e-300 is outside'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1e-20', *_REPORT],
     '--noise_multiplier=1e-20 gives rho-zCDP'),
    (REPORT, ['--mechanism=blt', '--theta=0.9', '--omega=1e300', '--noise_multiplier=1', *_REPORT],
     '--omega has an entry of magnitude 1e+300'),
]


def _check_one_line(module, args, fragment, tmp_path):
  if module == EMNIST:
    args = [f'--root_output_dir={tmp_path / "runs"}', *args]
  code, _, stderr = binaries.run_in_process(module, args)
  lines = stderr.splitlines()
  assert len(lines) == 1 and 'Traceback' not in stderr, stderr[-3000:]
  assert code == 2 and 'error: ' in lines[0] and fragment in lines[0], lines[0]
  assert not (tmp_path / 'runs').exists()


@pytest.mark.filterwarnings('error::RuntimeWarning')
@pytest.mark.parametrize('module, args, fragment', CASES,
                         ids=[f'{m.rsplit(".", 1)[-1]}:{" ".join(a)[:50]}' for m, a, _ in CASES])
def test_extreme_input_is_one_line_with_exit_2(tmp_path, module, args, fragment):
  _check_one_line(module, args, fragment, tmp_path)


def _plan_file(tmp_path, field, value):
  config = plan_lib.RunPlan.build(blt.BLTStrategy((0.9,), (0.1,)), 1.0, 10, 1.0,
                                  num_rounds=10).to_config()
  config[field] = value
  path = tmp_path / 'plan.json'
  path.write_text(json.dumps(config))
  return path


@pytest.mark.filterwarnings('error::RuntimeWarning')
@pytest.mark.parametrize('field, value', [
    ('noise_multiplier', 1e308),
    ('strategy', {'mechanism': 'blt', 'theta': [0.9], 'omega': [1e300]})])
def test_report_of_a_plan_with_an_extreme_value_names_the_plan(tmp_path, field, value):
  path = _plan_file(tmp_path, field, value)
  _check_one_line(REPORT, [f'--plan={path}'], f'--plan: `path` {str(path)!r}', tmp_path)


@pytest.mark.filterwarnings('error::RuntimeWarning')
def test_banded_file_with_an_overflowing_entry_names_the_file(tmp_path):
  path = str(tmp_path / 'banded.npz')
  files.save_strategy(banded.BandedStrategy.from_toeplitz([1.0, 0.5], num_rounds=10), path)
  with np.load(path) as data:
    arrays = dict(data)
  arrays['config/band_rows'][3, 1] = 1e300
  np.savez(path, **arrays)
  _check_one_line(REPORT, [f'--mechanism_file={path}', '--noise_multiplier=1', *_REPORT], path,
                  tmp_path)
