"""Driver integration tests: 2 rounds of the EMNIST driver with every mechanism, of the StackOverflow
driver with one, SecAgg, resume, errors.

Tiny models and populations keep each run to seconds; the TFF processes are built per run, which
dominates the time.
"""

import csv
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.learning import dp_ftrl
from dp_ftrl_tff.training import run_start, training_loop
from experiments.emnist import run_emnist
from experiments.stackoverflow import run_stackoverflow
from tests.testing import binaries, run_files, runs

pytestmark = pytest.mark.integration

EMNIST_TASK = {'model': 'tiny', 'only_digits': True}
SO_TASK = {'vocab_size': 50, 'embedding_size': 8, 'lstm_size': 8, 'sequence_length': 6,
           'max_elements_per_client': 8, 'word_counts': None}


def _check_run(config, result, num_rounds):
  out = config.output_dir
  for name in ('hparams.json', 'metrics.csv', 'participation.csv'):
    assert os.path.exists(os.path.join(out, name)), name
  assert os.listdir(os.path.join(out, 'tensorboard'))
  assert any(f.startswith('mechanism.') for f in os.listdir(out))
  history = runs.read_log(os.path.join(out, 'participation.csv'))
  rounds = sorted(r for rs in history.values() for r in rs)
  assert rounds == sorted(list(range(num_rounds)) * config.clients_per_round)
  for rs in history.values():
    assert np.all(np.diff(rs) >= config.min_sep)
  assert np.isfinite(result['metrics']['train_loss'])
  assert 'eval_loss' in result['metrics']
  with open(os.path.join(out, 'privacy_report', 'report.json')) as f:
    report = json.load(f)
  assert os.path.exists(os.path.join(out, 'privacy_report', 'report.md'))
  assert report['observed']['violations'] == []
  observed = min((b - a for rs in history.values() for a, b in zip(rs, rs[1:], strict=False)), default=None)
  assert report['observed']['min_sep'] == observed
  assert observed is None or observed >= config.min_sep
  if config.noise_multiplier > 0:
    assert report['declared']['rho'] > 0 and np.isfinite(report['declared']['epsilon'])
    assert [row['run_mechanism'] for row in report['equal_privacy']].count(True) == 1
    # The headline uses the observed participation, which is never worse than the declared one.
    assert report['participation_source'] == 'observed'
    assert report['rho'] <= report['declared']['rho'] + 1e-12


def test_emnist_run(config_factory):
  """A whole EMNIST driver run checked file by file; every other mechanism runs a whole driver run
  in canaries_driver_test.py and the pairwise design of interactions_test.py."""
  config = config_factory(mechanism='blt', task=EMNIST_TASK)
  result = training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  _check_run(config, result, 2)


def test_stackoverflow_run(config_factory):
  """The StackOverflow task with one mechanism: the mechanisms are the same objects in both drivers
  (the task only builds the model and data), so the EMNIST runs cover each of them."""
  config = config_factory(mechanism='banded', task=SO_TASK)
  result = training_loop.train(run_stackoverflow.build_task(config), config, config.output_dir)
  _check_run(config, result, 2)
  assert 'train_accuracy_no_oov_or_eos' in result['metrics']


def _final_weights(result):
  return result['process'].get_model_weights(result['state']).trainable


def _write_blt(path):
  from dp_ftrl_tff.mechanisms import blt, files
  files.save_strategy(blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2)), path)


def test_resume_gives_the_same_weights(config_factory, tmp_path):
  mechanism = str(tmp_path / 'blt.json')
  _write_blt(mechanism)
  common = dict(mechanism='blt', mechanism_file=mechanism, task=EMNIST_TASK, rounds=4,
                checkpoint_every=2, restart_period=3)
  straight = config_factory(name='straight', **common)
  expected = _final_weights(training_loop.train(run_emnist.build_task(straight), straight,
                                                  straight.output_dir))
  first = config_factory(name='resumed', **dict(common, rounds=2))
  training_loop.train(run_emnist.build_task(first), first, first.output_dir)
  # A crash after logging round 2 but before its checkpoint: the log row must be dropped on resume.
  with open(os.path.join(first.output_dir, 'participation.csv'), 'a') as f:
    f.write('stale_client,2\n')
  second = config_factory(name='resumed', **common)
  result = training_loop.train(run_emnist.build_task(second), second, second.output_dir)
  for got, want in zip(_final_weights(result), expected, strict=False):
    np.testing.assert_array_equal(got, want)
  history = runs.read_log(os.path.join(second.output_dir, 'participation.csv'))
  assert 'stale_client' not in history
  assert sum(len(r) for r in history.values()) == 4 * second.clients_per_round


def _metrics_rows(config):
  """metrics.csv rows without the wall-clock column `round_seconds`."""
  with open(os.path.join(config.output_dir, 'metrics.csv'), newline='') as f:
    return [{k: v for k, v in row.items() if k != 'round_seconds'} for row in csv.DictReader(f)]


def _recording_restart_rounds(monkeypatch):
  """The `restart_rounds` of each process the drivers build (`dp_ftrl.build_dp_ftrl_process`, whose
  finalizer resets the server momentum at those rounds: tests/learning/dp_ftrl_test.py)."""
  built = []
  build = dp_ftrl.build_dp_ftrl_process

  def record(*args, **kwargs):
    built.append(tuple(kwargs.get('restart_rounds', ())))
    return build(*args, **kwargs)

  monkeypatch.setattr(dp_ftrl, 'build_dp_ftrl_process', record)
  return built


def _check_restart_at_3(config, result):
  """Round 3 of a 4-round run with `restart_rounds=(3,)` and adaptive clipping starts a segment:
  in metrics.csv (segment, clip), the momentum reset, the plan and the privacy report."""
  rows = _metrics_rows(config)
  assert [int(float(r['aggregator/segment'])) for r in rows] == [0, 0, 0, 1]
  clips = [float(r['aggregator/clip']) for r in rows]
  estimates = [float(r['aggregator/quantile_estimate']) for r in rows]
  # The clip is the initial one until the restart, then the estimate after round 2.
  assert clips[:3] == [1.0] * 3 and clips[3] == pytest.approx(estimates[2]) != 1.0
  # The process counted its 4 rounds (its finalizer resets the momentum at round 3).
  assert result['state'].finalizer['round'] == 4
  with open(os.path.join(config.output_dir, 'plan.json')) as f:
    assert json.load(f)['restarts'] == {'rounds': [3]}
  assert list(result['privacy_report'].guarantee.restart_rounds) == [3]
  with open(os.path.join(config.output_dir, 'privacy_report', 'report.json')) as f:
    report = json.load(f)
  assert report['restart_rounds'] == [3]
  # The report accounts two segments of 3 and 1 rounds (C block diagonal), not one of 4.
  plan = plan_lib.load_plan(os.path.join(config.output_dir, 'plan.json'))
  assert plan.segment_lengths() == (3, 1)
  assert report['declared']['sensitivity_squared'] == pytest.approx(
      plan.strategy.segments_sensitivity_squared((3, 1), config.participation))
  assert report['declared']['sensitivity_squared'] != pytest.approx(
      plan.strategy.segments_sensitivity_squared((4,), config.participation))


def test_restarts_and_canaries(config_factory, monkeypatch):
  # Explicit restart rounds, adaptive clipping and canaries (`--restart_rounds=3
  # --adaptive_clipping --canary_clients=4`, a 1-buffer BLT optimized at start): the noise
  # segment, the clip and the server momentum (inside the process) restart at round 3, the canaries
  # take part through the data source, and the report accounts the plan's two segments. (A plain
  # loop over `process.next` gives the same run: docs/tutorial.md, tests/docs_test.py.)
  config = config_factory(task=EMNIST_TASK, mechanism='blt', mechanism_options={'num_buffers': 1},
                          rounds=4, eval_every=4, restart_rounds=(3,), adaptive_clipping=True,
                          clipped_count_stddev=1.0, canary_clients=4)
  built = _recording_restart_rounds(monkeypatch)
  result = training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  rows = _metrics_rows(config)
  assert len(rows) == 4 and 'eval_loss' in rows[-1]
  _check_restart_at_3(config, result)
  assert built == [(3,)]
  log = open(os.path.join(config.output_dir, 'participation.csv'), 'rb').read()
  assert b'canary-' in log  # canaries took part
  canaries = auditing.read_canaries(os.path.join(config.output_dir, 'canaries.json'))
  assert canaries.final_cosines is not None
  assert canaries.round_projections.shape == (8, 4)  # 4 seen and 4 unseen directions, 4 rounds


def test_secure_aggregation_with_adaptive_clipping_and_a_restart(tmp_path, monkeypatch):
  # SecAgg with adaptive clipping and a restart at round 2 (where the clip changes, and SecAgg's
  # scale and rounding bound follow it), in TFF's asynchronous test context over client ids
  # (deeper than protobuf's default nesting limit once compiled:
  # `secure_context.allow_deep_computations`), in-process: the loop installs its context and
  # gives the caller's back.
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.aggregators import (  # pylint: disable=g-import-not-at-top
    discretization,
    rotation,
  )

  # TFF seeds SecAgg's stochastic rounding (each call) and rotation (at initialize) from the clock,
  # so two runs of the same flags differ after round 0 in their last digits (the loss): fixed
  # seeds here make the run's rows a function of its flags.
  rounding = discretization._stochastic_rounding  # pylint: disable=protected-access
  monkeypatch.setattr(discretization, '_stochastic_rounding',
                      lambda x, l2_norm_bound=None, scale=1.0, beta=0.0: rounding(
                          x, l2_norm_bound, scale, beta, seed=5))
  monkeypatch.setattr(rotation, '_init_global_seed',
                      lambda: tf.constant([7, 0], rotation.SEED_TF_DTYPE))
  args = ('--model=tiny', '--mechanism=blt', '--num_buffers=1', '--rounds=3',
          '--clients_per_round=3', '--synthetic_num_clients=30',
          '--synthetic_examples_per_client=8', '--client_batch_size=8', '--min_sep=2',
          '--noise_seed=3', '--seed=1', '--eval_max_examples=64', '--secure_aggregation',
          '--secure_bits=16', '--secure_beta=0.1',
          '--secure_modclip_prob=1e-6', '--adaptive_clipping', '--clipped_count_stddev=1.0',
          '--restart_rounds=2', '--experiment_name=run', f'--root_output_dir={tmp_path}')
  before = tff.framework.get_context_stack().current
  rows = []
  for name in ('run', 'again'):
    code, _, err = binaries.run_in_process(
        binaries.EMNIST, (*args, f'--experiment_name={name}'), files=True)
    assert code == 0, err[-3000:]
    rows.append(run_files.metrics_rows(os.path.join(tmp_path, name)))
  assert tff.framework.get_context_stack().current is before
  assert rows[0] == rows[1]  # with TFF's seeds fixed, the same flags give the same rows
  assert len(rows[0]) == 3 and 'eval_loss' in rows[0][-1]
  assert 'aggregator/modular_wrap' in rows[0][0]  # SecAgg's own measurements
  clips = [float(row['aggregator/clip']) for row in rows[0]]
  assert clips[:2] == [1.0, 1.0] and clips[2] != 1.0  # the clip adapted at the restart
  with open(os.path.join(tmp_path, 'run', 'hparams.json')) as f:
    assert json.load(f)['secure_aggregation'] is True
  with open(os.path.join(tmp_path, 'run', 'privacy_report', 'report.json')) as f:
    assert json.load(f)['restart_rounds'] == [2]


def test_resume_gives_the_same_eval_metrics(config_factory, tmp_path):
  # The test set is evaluated in a fixed order: a truncated eval (eval_max_examples=64 of 2000)
  # after a resume sees the same examples as an uninterrupted run. A fixed BLT file: a strategy
  # optimized at start would be optimized for the first run's 1 round and reused on resume.
  mechanism = str(tmp_path / 'blt.json')
  _write_blt(mechanism)
  common = dict(mechanism='blt', mechanism_file=mechanism, task=EMNIST_TASK, rounds=3)
  straight = config_factory(name='straight', **common)
  training_loop.train(run_emnist.build_task(straight), straight, straight.output_dir)
  first = config_factory(name='resumed', **dict(common, rounds=1))
  training_loop.train(run_emnist.build_task(first), first, first.output_dir)
  second = config_factory(name='resumed', **common)
  training_loop.train(run_emnist.build_task(second), second, second.output_dir)
  resumed, expected = _metrics_rows(second), _metrics_rows(straight)
  assert [row['round'] for row in resumed] == ['0', '1', '2']
  assert resumed == expected


def test_banded_resume_past_its_rounds(config_factory):
  common = dict(mechanism='banded', task=EMNIST_TASK, name='banded')
  first = config_factory(**dict(common, rounds=2))
  training_loop.train(run_emnist.build_task(first), first, first.output_dir)  # for 2 rounds
  longer = config_factory(**dict(common, rounds=4))
  with pytest.raises(run_start.SetupError) as error:
    training_loop.train(run_emnist.build_task(longer), longer, longer.output_dir)
  message = str(error.value)
  assert (f'the banded strategy in {os.path.join(first.output_dir, "mechanism.npz")} covers 2 '
          'rounds; `rounds`=4 needs `banded_beyond_max_rounds`=restart') in message
  assert 'new `experiment_name`' in message
  restart = config_factory(**dict(common, rounds=4, banded_beyond_max_rounds='restart'))
  result = training_loop.train(run_emnist.build_task(restart), restart, restart.output_dir)
  history = runs.read_log(os.path.join(restart.output_dir, 'participation.csv'))
  assert sum(len(r) for r in history.values()) == 4 * restart.clients_per_round
  with open(os.path.join(restart.output_dir, 'plan.json')) as f:
    assert json.load(f)['beyond_max_rounds'] == 'restart'
  # Rounds 2-3 are a second segment of the 2-round strategy, accounted as its own mechanism.
  assert list(result['privacy_report'].guarantee.restart_rounds) == [2]


@pytest.mark.unit
def test_impossible_schedule_fails_before_training(config_factory):
  config = config_factory(min_sep=11, rounds=20, task=EMNIST_TASK)  # 11 * 3 clients > 30
  with pytest.raises(ValueError, match='Impossible schedule'):
    training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  assert not os.path.exists(config.output_dir)


@pytest.mark.unit
def test_mechanism_file_of_another_kind_fails(config_factory, tmp_path):
  mechanism = str(tmp_path / 'blt.json')
  _write_blt(mechanism)
  config = config_factory(mechanism='banded', mechanism_file=mechanism, task=EMNIST_TASK)
  with pytest.raises(ValueError, match="holds a 'blt' strategy.*`mechanism`=banded"):
    training_loop.train(run_emnist.build_task(config), config, config.output_dir)


def test_rerun_with_other_settings_fails(config_factory):
  config = config_factory(task=EMNIST_TASK, rounds=1)
  training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  other = config_factory(task=EMNIST_TASK, rounds=1, noise_multiplier=2.0)
  with pytest.raises(ValueError, match='noise_multiplier'):
    training_loop.train(run_emnist.build_task(other), other, other.output_dir)


def _run_driver(tmp_path, *args):
  """Runs the EMNIST driver CLI; returns (exit code, stderr text)."""
  returncode, _, stderr = binaries.run(binaries.EMNIST, [f'--root_output_dir={tmp_path}', *args],
                                       tmp_path, timeout=600)
  return returncode, stderr


@pytest.mark.e2e
def test_unknown_mechanism_flag_fails_with_usage_message(tmp_path):
  returncode, stderr = _run_driver(tmp_path, '--mechanism=dpsgd')
  assert returncode != 0
  assert '--mechanism' in stderr and 'gaussian|tree|tree_efficient|banded|blt' in stderr
  assert len(stderr.strip().splitlines()) == 1 and 'Traceback' not in stderr


def test_weak_noise_trains_and_reports_the_flagged_zcdp_bound(tmp_path):
  """`--noise_multiplier=0.05 --rounds=6` (issue 46: once refused before training, rho-zCDP above
  the 100 the PLD holds) trains its 6 rounds; the header, the eval lines, the summary line,
  report.json, report.md, summary.json and the warning on stderr give the zCDP bound, flagged as an
  upper bound. In-process: the driver's own entry point, no interpreter start."""
  code, stdout, stderr = binaries.run_in_process(binaries.EMNIST, (
      f'--root_output_dir={tmp_path}', '--model=tiny', '--rounds=6', '--noise_multiplier=0.05',
      '--clients_per_round=3', '--synthetic_num_clients=30', '--synthetic_examples_per_client=8',
      '--min_sep=2', '--eval_every=3', '--eval_max_examples=16'), files=True)
  assert code == 0, stderr[-3000:]
  run = tmp_path / 'run'
  assert len(run_files.metrics_rows(str(run))) == 6
  report = json.loads((run / 'privacy_report' / 'report.json').read_text())
  assert report['rho'] > 100 and report['noise_multiplier'] == 0.05
  assert report['conversion'] == 'zcdp_bound' and report['epsilon_is_zcdp_bound'] is True
  epsilon = report['epsilon']
  assert epsilon >= report['rho']  # far above any meaningful guarantee, and stated as a bound
  assert 'This epsilon is an UPPER BOUND from rho-zCDP' in (
      run / 'privacy_report' / 'report.md').read_text()
  summary = json.loads((run / 'summary.json').read_text())
  assert (summary['epsilon'], summary['epsilon_is_zcdp_bound']) == (epsilon, True)
  lines = stdout.splitlines()
  (planned,) = [line for line in lines if line.startswith('planned     ')]
  assert planned.startswith('planned     epsilon <= ') and 'an upper bound from rho-zCDP' in planned
  evals = [line for line in lines if line.startswith('eval  after round ')]
  assert len(evals) == 2 and f'epsilon spent <= {epsilon:.4g} (an upper bound' in evals[-1]
  assert any(f'(epsilon, delta)=(<= {epsilon:.6g}, 1e-10): an UPPER BOUND from rho-zCDP' in line
             for line in lines), stdout
  (warning,) = [line for line in stderr.splitlines() if 'UPPER BOUND' in line]
  assert warning.startswith(f'run_emnist.py: warning: epsilon {epsilon:.6g} is an UPPER BOUND')
