"""Driver runs with `canary_clients`: the canaries are clients of the population (sampled, logged,
counted), their files survive a resume byte for byte, and the report states the empirical epsilon
beside the accounted one for every mechanism."""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from dp_ftrl_tff import auditing
from dp_ftrl_tff.mechanisms import blt, files
from dp_ftrl_tff.training import canary_clients, run_start, training_loop
from experiments.emnist import run_emnist
from tests.testing import runs

pytestmark = pytest.mark.integration

EMNIST_TASK = {'model': 'tiny', 'only_digits': True}
CANARIES = 200


def _report(config):
  with open(os.path.join(config.output_dir, 'privacy_report', 'report.json')) as f:
    return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize('mechanism', ['gaussian', 'tree', 'banded', 'blt'])
def test_every_mechanism_reports_empirical_privacy(config_factory, mechanism):
  config = config_factory(mechanism=mechanism, task=EMNIST_TASK, canary_clients=CANARIES,
                          rounds=3, clients_per_round=40, eval_every=3)
  training_loop.train(run_emnist.build_task(config), config, config.output_dir)
  history = runs.read_log(os.path.join(config.output_dir, 'participation.csv'))
  canary_ids = {c for c in history if c.startswith(canary_clients.CANARY_ID_PREFIX)}
  assert canary_ids and len(history) > len(canary_ids)  # sampled with the real clients
  for rounds in history.values():
    assert np.all(np.diff(rounds) >= config.min_sep)
  report = _report(config)
  assert report['run_facts']['population'] == config.synthetic_num_clients + CANARIES
  record = auditing.read_canaries(os.path.join(config.output_dir, auditing.CANARY_FILE))
  assert record.round_projections.shape == (2 * CANARIES, 3)
  assert record.final_cosines is not None
  rows = {row['threat_model']: row for row in report['empirical_privacy']}
  expected = {'final_model', 'all_iterates'} | ({'all_iterates_whitened'}
                                                if mechanism != 'gaussian' else set())
  assert set(rows) == expected
  for row in rows.values():
    assert math.isfinite(row['epsilon']) and row['epsilon'] >= 0
    assert row['epsilon_lower_bound'] <= report['epsilon']
    assert row['canaries_seen'] == len(canary_ids) or row['threat_model'] == 'final_model'
    assert row['delta'] == report['delta'] and row['confidence'] == 0.95


def _canary_document(config) -> dict:
  with open(os.path.join(config.output_dir, auditing.CANARY_FILE)) as f:
    return json.load(f)


@pytest.mark.slow
def test_resume_gives_the_same_canary_files(config_factory, tmp_path):
  # A fixed BLT file: a strategy optimized at start would be optimized for the first run's rounds.
  mechanism_file = str(tmp_path / 'blt.json')
  files.save_strategy(blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2)), mechanism_file)
  common = dict(mechanism='blt', mechanism_file=mechanism_file, task=EMNIST_TASK,
                canary_clients=30, rounds=4, checkpoint_every=2, noise_seed=3)
  straight = config_factory(name='straight', **common)
  training_loop.train(run_emnist.build_task(straight), straight, straight.output_dir)
  first = config_factory(name='resumed', **dict(common, rounds=2))
  training_loop.train(run_emnist.build_task(first), first, first.output_dir)
  first_id = _canary_document(first)['run_id']
  # A crash while appending round 2's projections: the torn row must be dropped on resume.
  with open(os.path.join(first.output_dir, auditing.PROJECTIONS_FILE), 'a') as f:
    f.write('2,0.5,0.')
  second = config_factory(name='resumed', **common)
  training_loop.train(run_emnist.build_task(second), second, second.output_dir)
  with open(os.path.join(straight.output_dir, auditing.PROJECTIONS_FILE), 'rb') as f:
    want = f.read()
  with open(os.path.join(second.output_dir, auditing.PROJECTIONS_FILE), 'rb') as f:
    assert f.read() == want
  # canaries.json the same but for the run's identity: its own, kept by the resume.
  resumed, uninterrupted = _canary_document(second), _canary_document(straight)
  assert resumed.pop('run_id') == first_id != uninterrupted.pop('run_id')
  assert resumed == uninterrupted
  assert _report(second)['empirical_privacy'] == _report(straight)['empirical_privacy']


@pytest.mark.unit
def test_a_client_named_like_a_canary_is_an_error(config_factory):
  config = config_factory(task=EMNIST_TASK, canary_clients=2)
  task = run_emnist.build_task(config)
  task = dataclasses.replace(task, train_data=_Renamed(task.train_data))
  with pytest.raises(run_start.SetupError, match='canary_clients'):
    training_loop.train(task, config, config.output_dir)
  assert not os.path.exists(config.output_dir)


class _Renamed:
  """Client data whose first client is called like canary 0."""

  def __init__(self, data):
    self._data = data
    self.client_ids = [canary_clients.CANARY_ID_PREFIX + '00000'] + list(data.client_ids[1:])

  def create_tf_dataset_for_client(self, client_id):
    return self._data.create_tf_dataset_for_client(self._data.client_ids[0] if client_id ==
                                                    self.client_ids[0] else client_id)


@pytest.mark.unit
def test_secure_aggregation_with_canaries_is_refused(config_factory):
  with pytest.raises(ValueError, match='canary_clients.*secure_aggregation'):
    config_factory(task=EMNIST_TASK, canary_clients=2, secure_aggregation=True)
