"""A mechanism registered from outside the package works everywhere without editing any module.

`tests.testing.moving_sum` holds a strategy, its streaming noise and one registry entry; this
test registers it and takes it through the mechanisms CLI, a strategy file, the aggregator factory,
a 2-round driver run and the standalone privacy report, checking each against dense matrix math.
"""

import collections
import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from dp_ftrl_tff import aggregators
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.mechanisms import files, memory, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.noise import base as noise_base
from dp_ftrl_tff.training import training_loop
from experiments import mechanisms_cli, privacy_report
from experiments.emnist import run_emnist
from tests.testing import moving_sum, runs

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def registered():
  with registry.registered(moving_sum.MECHANISM):
    yield
  assert moving_sum.NAME not in registry.names()


@pytest.mark.unit
def test_adding_it_touches_one_module_and_this_test():
  """The files adding a mechanism touches, counted: its one module (strategy, streaming noise and
  registry entry) and the test that registers it; no module of the package or of experiments/ (nor
  any other test) names it, and the registry module is not edited."""
  entry = moving_sum.MECHANISM
  assert {entry.strategy_class.split(':')[0], entry.noise_class.split(':')[0]} == {
      moving_sum.__name__}
  root = pathlib.Path(__file__).resolve().parents[2]
  naming = sorted(path.relative_to(root).as_posix()
                  for folder in ('dp_ftrl_tff', 'experiments', 'tests')
                  for path in (root / folder).rglob('*.py') if 'moving_sum' in path.read_text())
  assert naming == ['tests/experiments/new_mechanism_test.py', 'tests/testing/moving_sum.py']


def _dense_sensitivity_squared(c: np.ndarray, schema) -> float:
  """The largest ||C u||^2 over the 0/1 vectors u of every participation pattern (min_sep b, at
  most k rounds), by brute force: a lower bound of the sensitivity^2 (equal to it when C's Gram
  matrix is non-negative)."""
  n = c.shape[0]
  gram = c.T @ c
  best = 0.0

  def extend(pattern):
    nonlocal best
    best = max(best, gram[np.ix_(pattern, pattern)].sum())
    if len(pattern) == schema.effective_max_participations(n):
      return
    for nxt in range(pattern[-1] + schema.min_sep, n):
      extend(pattern + [nxt])

  for first in range(n):
    extend([first])
  return best


@pytest.mark.unit
def test_cli_evaluate_matches_dense_math(capsys, tmp_path):
  n, schema = 12, participation_lib.ParticipationSchema(4, 3)
  strategy = moving_sum.MovingSumStrategy(3)
  code = mechanisms_cli.main(['mechanisms', 'evaluate', f'--mechanism={moving_sum.NAME}',
                              '--num_bands=3', f'--rounds={n}', '--min_sep=4', '--json'])
  record = json.loads(capsys.readouterr().out)
  assert code == 0 and record['mechanism'] == moving_sum.NAME and record['num_bands'] == 3
  c, noise = strategy.strategy_matrix(n), strategy.noise_matrix(n)
  np.testing.assert_allclose(c @ noise, np.eye(n), atol=1e-12)
  decoder = np.tril(np.ones((n, n))) @ noise
  max_error = np.sqrt(np.max(np.sum(decoder**2, axis=1)))
  sens_sq = record['sensitivity_squared']
  assert sens_sq >= _dense_sensitivity_squared(c, schema) * (1 - 1e-12)  # never understated
  assert record['max_loss'] == pytest.approx(max_error * np.sqrt(sens_sq), rel=1e-12)
  # A strategy file of the mechanism: written in the entry's format, read back by the CLI.
  path = tmp_path / f'moving_sum{moving_sum.MECHANISM.file_suffix}'
  files.save_strategy(strategy, path)
  code = mechanisms_cli.main(['mechanisms', 'evaluate', f'--mechanism_file={path}', f'--rounds={n}',
                              '--min_sep=4', '--json'])
  assert code == 0
  assert json.loads(capsys.readouterr().out)['sensitivity_squared'] == sens_sq
  assert memory.estimate_bytes(moving_sum.NAME, n) >= 0


def test_factory_stream_equals_dense_noise():
  strategy, rounds, seed = moving_sum.MovingSumStrategy(3), 5, 7
  factory = aggregators.CorrelatedNoiseFactory(
      plan_lib.RunPlan.build(strategy, 1.0, 1, 1.0), noise_seed=seed)
  value_type = tff.types.to_type(collections.OrderedDict(w=tff.TensorType(np.float64, [2, 2])))
  process = factory.create(value_type)
  state, got = process.initialize(), []
  for _ in range(rounds):
    output = process.next(state, [collections.OrderedDict(w=np.zeros([2, 2]))])
    state = output.state
    got.append(np.ravel(output.result['w']))
  specs = tff.types.type_to_tf_tensor_specs(value_type)
  z = np.stack([np.ravel(noise_base.standard_normal_row(noise_base.initial_seed(seed), r,
                                                        specs)['w']) for r in range(rounds)])
  np.testing.assert_allclose(np.stack(got), strategy.noise_matrix(rounds) @ z, atol=1e-12)


def test_driver_run_and_its_report(tmp_path, capfd):  # capfd: the TFF worker writes to fd 1
  config = runs.tiny_config(tmp_path, mechanism=moving_sum.NAME,
                                mechanism_options={'num_bands': 2},
                                task={'model': 'tiny', 'only_digits': True})
  result = training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  assert set(result['metrics']) >= {'train_loss', 'eval_loss'}
  with open(os.path.join(config.output_dir, 'plan.json')) as f:
    assert json.load(f)['strategy']['mechanism'] == moving_sum.NAME
  driver_report = json.loads(
      (tmp_path / 'run' / 'privacy_report' / 'report.json').read_text())
  out = tmp_path / 'standalone'
  privacy_report.FLAGS.unparse_flags()
  try:
    privacy_report.FLAGS(['privacy_report', f'--plan={config.output_dir}/plan.json',
                          f'--participation_log={config.output_dir}/participation.csv',
                          f'--output_dir={out}', '--json'])
    assert privacy_report.main(['privacy_report']) == 0, capfd.readouterr().err
  finally:
    privacy_report.FLAGS.unparse_flags()
  standalone = json.loads((out / 'report.json').read_text())
  assert standalone['mechanism'] == driver_report['mechanism'] == moving_sum.NAME
  assert standalone['epsilon'] == driver_report['epsilon'] > 0
  expected = result['privacy_report'].guarantee.epsilon
  assert driver_report['epsilon'] == expected
  tf.keras.backend.clear_session()
