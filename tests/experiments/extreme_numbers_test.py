"""Extreme sizes and numbers through the binaries' entry points (in-process): each is one line on
stderr naming the flag or the file, exit status 2, before any training or unbounded search."""

import json

import numpy as np
import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.mechanisms import banded, blt, files
from tests.testing import binaries
from tests.testing.binaries import EMNIST, MECH, REPORT, SO

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
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1e300', *_REPORT],
     '--noise_multiplier=1e+300 is outside'),
    (REPORT, ['--mechanism=tree', '--noise_multiplier=1e-300', *_REPORT],
     '--noise_multiplier=1e-300 is outside'),
    (REPORT, ['--mechanism=blt', '--theta=0.9', '--omega=1e300', '--noise_multiplier=1', *_REPORT],
     '--omega has an entry of magnitude 1e+300'),
    # Issue 44, point 5: sizes that hung or ran out of memory, probabilities and targets whose
    # errors were scipy's or dp_accounting's words, or named another flag.
    (MECH, ['optimize', '--mechanism=blt', '--rounds=100', '--min_sep=10',
            '--num_buffers=9223372036854775808'],
     '--num_buffers=9223372036854775808 at --rounds=100: the BLT optimizer\'s arrays need about'),
    (MECH, ['optimize', '--mechanism=blt', '--rounds=100', '--min_sep=10', '--num_buffers=1_000'],
     '--num_buffers=1000 at --rounds=100: the BLT optimizer, which optimizes'),
    (MECH, ['optimize', '--mechanism=banded', '--rounds=20000', '--min_sep=20000'],
     '--num_bands=20000 (the default, min(--min_sep, --rounds)) at --rounds=20000'),
    (MECH, ['evaluate', '--mechanism=tree', '--rounds=100000000', '--min_sep=1'],
     'the exact tree sensitivity of k=100000000 participations over --rounds=100000000'),
    (MECH, ['amplified', '--rounds=100', '--sampling_groups=2', '--sampling_prob=1e-320',
            '--noise_multiplier=1'], '--sampling_prob=9.99989e-321 is below 2.22e-16'),
    (MECH, ['amplified', '--rounds=100', '--sampling_groups=2', '--dataset_size=9223372036854775808',
            '--batch_size=10', '--noise_multiplier=1'],
     '--dataset_size=9223372036854775808 with --batch_size=10 and --sampling_groups=2 gives'),
    (MECH, ['amplified', '--rounds=100', '--sampling_groups=2', '--sampling_prob=0.1',
            '--noise_multiplier=1e300'], '--noise_multiplier=1e+300 is outside'),
    (MECH, ['amplified', '--rounds=9223372036854775807', '--sampling_groups=1',
            '--sampling_prob=0.1', '--noise_multiplier=1'],
     '--rounds: ceil(num_rounds / num_groups) = 9223372036854775807 compositions'),
    (MECH, ['amplified', '--rounds=100', '--sampling_groups=1', '--sampling_prob=1e-6',
            '--noise_multiplier=100', '--accountant=rdp'],
     '--sampling_prob=1e-06 is too small for the rdp accountant'),
    (MECH, ['select_bands', '--rounds=100', '--dataset_size=9223372036854775807', '--batch_size=1',
            '--target_epsilon=1'], '--dataset_size=9223372036854775807 with --batch_size=1 gives'),
    (MECH, ['select_bands', '--rounds=20000', '--dataset_size=1000000', '--batch_size=1',
            '--target_epsilon=1'], 'the band selection over b-hat = 1 .. 20000'),
    (REPORT, ['--mechanism=gaussian', '--noise_multiplier=1', '--rounds=100', '--min_sep=1',
              '--sampling_prob=1e-320'], '--sampling_prob=9.99989e-321 is below 2.22e-16'),
    (REPORT, ['--mechanism=gaussian', '--noise_multiplier=1', '--rounds=100', '--min_sep=1',
              '--sampling_prob=0.1', '--sampling_groups=0'],
     '--sampling_groups must be a positive integer, got 0'),
    (REPORT, ['--mechanism=tree', '--target_rho=1e-320', *_REPORT],
     '--target_rho=9.99989e-321 needs a noise multiplier'),
    (REPORT, ['--mechanism=tree', '--target_epsilon=1', '--target_delta=1e-320', *_REPORT],
     '--target_delta=9.99989e-321 is below 2.23e-308'),
    (EMNIST, ['--seed=9223372036854775808'], '--seed must lie in [0, 2**63)'),
    (SO, ['--vocab_size=1000000000'],
     '--vocab_size=1000000000, --embedding_size=96, --lstm_size=670, --sequence_length=20 and '
     '--client_batch_size=16: a model of 1.93e+11 float32 parameters'),
    (SO, ['--sequence_length=1000000000'], 'and 2.04e+14 activations of a client batch'),
]

#: Settings whose rho-zCDP is far above what the PLD holds (rho 100): once refused, now accounted
#: with the zCDP conversion bound, flagged as an upper bound (no setting is refused for the
#: accountant's memory).
BEYOND_PLD = [
    ['--mechanism=tree', '--target_epsilon=1e6', *_REPORT],
    ['--mechanism=gaussian', '--noise_multiplier=1', '--rounds=1000000000', '--min_sep=1'],
    ['--mechanism=tree', '--noise_multiplier=1e-20', *_REPORT],
]


@pytest.mark.parametrize('args', BEYOND_PLD, ids=[' '.join(a)[:50] for a in BEYOND_PLD])
def test_noise_beyond_the_pld_is_accounted_with_the_flagged_zcdp_bound(args):
  code, stdout, stderr = binaries.run_in_process(REPORT, args)
  assert code == 0, stderr
  assert '(epsilon, delta)=(<= ' in stdout and 'an UPPER BOUND from rho-zCDP' in stdout, stdout
  (warning,) = stderr.splitlines()
  assert warning.startswith('privacy_report.py: warning: epsilon ') and (
      'is an UPPER BOUND from rho-zCDP (the zCDP conversion bound), not a tight PLD epsilon: '
      'rho-zCDP ') in warning, warning


# Refused after TensorFlow is imported (in the strategy's resolution or the data's generation):
# a second or two each once a test has imported it.
TINY_EMNIST = ('--model=tiny', '--rounds=3', '--clients_per_round=3', '--synthetic_num_clients=30',
               '--synthetic_examples_per_client=8', '--min_sep=2', '--eval_max_examples=16')
DRIVER_CASES = [
    (['--num_buffers=1000'], '--num_buffers=1000 at --rounds=3: the BLT optimizer'),
    (['--mechanism=bsr', '--num_bands=100000000'], '--num_bands=100000000 must not exceed --rounds=3'),
    (['--synthetic_num_clients=1000000000'],
     '--synthetic_num_clients=1000000000 clients of --synthetic_examples_per_client=8 examples'),
]


def _check_one_line(module, args, fragment, tmp_path):
  if module in (EMNIST, SO):
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


@pytest.mark.filterwarnings('error::RuntimeWarning')
@pytest.mark.parametrize('args, fragment', DRIVER_CASES,
                         ids=[' '.join(a)[:50] for a, _ in DRIVER_CASES])
def test_extreme_driver_size_is_one_line_with_exit_2(tmp_path, args, fragment):
  _check_one_line(EMNIST, [*TINY_EMNIST, *args], fragment, tmp_path)


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


def test_the_stackoverflow_size_check_counts_the_model_s_parameters():
  from experiments.stackoverflow import models, run_stackoverflow
  for sizes in ((30, 4, 5), (100, 8, 3)):
    assert run_stackoverflow.model_parameters(*sizes) == models.build_keras_model(
        *sizes).count_params()
  assert run_stackoverflow.model_parameters(10000, 96, 670) == 4_050_748
