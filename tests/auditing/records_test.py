"""Tests for `dp_ftrl_tff.auditing.records`: round trip, resume, torn lines, corrupt files."""

import json
import os

import numpy as np
import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.auditing import records
from dp_ftrl_tff.mechanisms import banded, blt, gaussian

pytestmark = pytest.mark.unit

IDS = ('client/7', 'client,8')  # a comma inside an id is fine: ids live in the JSON file
PLAN = plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, 2, 1.0, num_rounds=5,
                              population=10)


RUN_ID = 'ab' * 16


def _writer(directory, plan=PLAN):
  return records.CanaryFilesWriter(directory, seen=2, seed=5, client_ids=IDS, dimension=100,
                                   plan=plan, run_id=RUN_ID)


def _write_rounds(writer, projections, first=0):
  for t in range(first, projections.shape[1]):
    writer.append_round(t, projections[:, t])


def test_round_trip_is_exact(tmp_path):
  projections = np.random.default_rng(0).normal(size=(4, 3)) / 3
  cosines = [0.1, -0.2, 1 / 3, 2e-300]
  writer = _writer(tmp_path)
  writer.write_metadata()
  _write_rounds(writer, projections)
  record = records.read_canaries(writer.path)
  assert writer.path == os.path.join(tmp_path, records.CANARY_FILE)
  assert record.final_cosines is None and record.num_rounds == 3 and record.num_seen == 2
  writer.write_final(cosines)
  record = records.read_canaries(writer.path)
  assert record.client_ids == IDS and record.seed == 5 and record.dimension == 100
  np.testing.assert_array_equal(record.round_projections, projections)  # repr: bit-exact
  np.testing.assert_array_equal(record.final_cosines, cosines)
  metadata = json.loads((tmp_path / records.CANARY_FILE).read_text())
  assert metadata['format'] == 3 and metadata['norm'] == 'clip' and metadata['unseen'] == 2
  assert metadata['run_id'] == record.run_id == RUN_ID
  assert metadata['population'] == record.population == 10
  assert metadata['plan_sha256'] == record.plan_sha256 == records.plan_digest(PLAN)
  header = (tmp_path / records.PROJECTIONS_FILE).read_text().split('\n')[0]
  assert header == 'round,p0,p1,p2,p3'


def test_rows_only_grow_so_a_cut_at_a_rounds_length_resumes_to_the_same_bytes(tmp_path):
  projections = np.random.default_rng(1).normal(size=(4, 5))
  writer = _writer(tmp_path)
  writer.write_metadata()
  _write_rounds(writer, projections[:, :3])
  after_three = (tmp_path / records.PROJECTIONS_FILE).read_bytes()
  _write_rounds(writer, projections, first=3)
  full = (tmp_path / records.PROJECTIONS_FILE).read_bytes()
  assert full.startswith(after_three)
  (tmp_path / records.PROJECTIONS_FILE).write_bytes(after_three)  # a resume's cut
  assert records.read_canaries(writer.path).num_rounds == 3
  resumed = _writer(tmp_path)
  resumed.write_metadata()  # keeps the CSV
  _write_rounds(resumed, projections, first=3)
  assert (tmp_path / records.PROJECTIONS_FILE).read_bytes() == full


def test_torn_last_line_is_dropped_by_the_reader(tmp_path):
  projections = np.random.default_rng(2).normal(size=(4, 2))
  writer = _writer(tmp_path)
  writer.write_metadata()
  _write_rounds(writer, projections)
  with open(tmp_path / records.PROJECTIONS_FILE, 'a') as f:
    f.write('2,0.5,0.')  # a killed writer
  record = records.read_canaries(writer.path)
  np.testing.assert_array_equal(record.round_projections, projections)


def _corrupt(tmp_path, metadata=None, csv=None):
  writer = _writer(tmp_path)
  writer.write_metadata()
  writer.append_round(0, [1.0, 2.0, 3.0, 4.0])
  if metadata is not None:
    (tmp_path / records.CANARY_FILE).write_text(metadata)
  if csv is not None:
    (tmp_path / records.PROJECTIONS_FILE).write_text(csv)
  return writer.path


def _metadata(**changes):
  metadata = {'format': 3, 'seen': 2, 'unseen': 2, 'seed': 5, 'norm': 'clip',
              'client_ids': list(IDS), 'dimension': 100, 'population': 10,
              'plan_sha256': records.plan_digest(PLAN), 'run_id': None,
              'final_model_cosines': None}
  metadata.update(changes)
  return json.dumps(metadata)


@pytest.mark.parametrize('metadata,csv,what', [
    ('{"format": 3', None, 'cannot read'),
    ('[]', None, 'keys'),
    (_metadata(extra=1), None, 'keys'),
    (_metadata(format=2), None, 'format'),
    (_metadata(run_id='not-an-id'), None, 'run_id'),
    (_metadata(run_id=7), None, 'run_id'),
    (_metadata(unseen=3), None, '"seen"'),
    (_metadata(seen=0, unseen=0), None, '"seen"'),
    (_metadata(client_ids=['a']), None, 'client_ids'),
    (_metadata(dimension=0), None, 'dimension'),
    (_metadata(seed=-1), None, 'seed'),
    (_metadata(final_model_cosines=[1.0]), None, 'final_model_cosines'),
    (_metadata(final_model_cosines=['a', 1, 2, 3]), None, 'final_model_cosines'),
    (_metadata(client_ids=['a', 'a']), None, 'twice'),
    (_metadata(final_model_cosines=[0.5, -5.0, 0.0, 0.0]), None, '[-1, 1]'),
    (_metadata(final_model_cosines=[1e308, 0.0, 0.0, 0.0]), None, '[-1, 1]'),
    (_metadata(population=1), None, '"population"'),
    (_metadata(population='10'), None, '"population"'),
    (_metadata(plan_sha256='abc'), None, '"plan_sha256"'),
    (None, 'round,p0,p1\n', 'header'),
    (None, 'round,p0,p1,p2,p3\n1,1,2,3,4\n', 'row 2'),
    (None, 'round,p0,p1,p2,p3\n0,1,2,3,4\n0,1,2,3,4\n', 'row 3'),
    (None, 'round,p0,p1,p2,p3\n0,1,2,3\n', 'row 2'),
    (None, 'round,p0,p1,p2,p3\n0,1,2,x,4\n', 'row 2'),
    (None, 'round,p0,p1,p2,p3\n0,1,2,nan,4\n', 'finite')])
def test_corrupt_files_are_one_line_errors_naming_the_path(tmp_path, metadata, csv, what):
  path = _corrupt(tmp_path, metadata, csv)
  with pytest.raises(ValueError) as error:
    records.read_canaries(path)
  message = str(error.value)
  assert '\n' not in message and what in message and str(tmp_path) in message


def test_missing_files(tmp_path):
  with pytest.raises(ValueError, match='cannot read the canary file'):
    records.read_canaries(tmp_path / records.CANARY_FILE)
  path = _corrupt(tmp_path)
  os.remove(tmp_path / records.PROJECTIONS_FILE)
  with pytest.raises(ValueError, match='cannot read the canary projections'):
    records.read_canaries(path)


@pytest.mark.parametrize('kwargs,name', [
    ({'directory': ''}, 'directory'), ({'seen': 0}, 'seen'), ({'seed': -1}, 'seed'),
    ({'client_ids': ['a']}, 'client_ids'), ({'client_ids': 'ab'}, 'client_ids'),
    ({'dimension': 0}, 'dimension'), ({'client_ids': ['a', 'a']}, 'client_ids'),
    ({'plan': None}, 'plan'),
    ({'plan': plan_lib.RunPlan.build(gaussian.GaussianStrategy(), 1.0, 1, 1.0, population=1)},
     'client_ids')])
def test_writer_bad_arguments(tmp_path, kwargs, name):
  arguments = {'directory': tmp_path, 'seen': 2, 'seed': 5, 'client_ids': IDS, 'dimension': 100,
               'plan': PLAN}
  arguments.update(kwargs)
  with pytest.raises(ValueError, match=f'`{name}`'):
    records.CanaryFilesWriter(**arguments)


def test_writer_methods_bad_arguments(tmp_path):
  writer = _writer(tmp_path)
  writer.write_metadata()
  with pytest.raises(ValueError, match='`round_num`'):
    writer.append_round(-1, [0.0] * 4)
  with pytest.raises(ValueError, match='`projections`'):
    writer.append_round(0, [0.0] * 3)
  with pytest.raises(ValueError, match='`projections`'):
    writer.append_round(0, [0.0, 0.0, 0.0, np.inf])
  with pytest.raises(ValueError, match='`cosines`'):
    writer.write_final([0.0])
  with pytest.raises(ValueError, match=r'`cosines` must be cosines in \[-1, 1\], got -5.0'):
    writer.write_final([0.0, -5.0, 0.0, 0.0])
  with pytest.raises(ValueError, match='`path`'):
    records.read_canaries('')


def test_a_cosine_rounded_past_one_is_clipped(tmp_path):
  writer = _writer(tmp_path)
  writer.write_metadata()
  writer.write_final([1 + 1e-9, -1 - 1e-9, 0.5, 0.0])
  np.testing.assert_array_equal(records.read_canaries(writer.path).final_cosines,
                                [1.0, -1.0, 0.5, 0.0])


@pytest.mark.parametrize('plan', [
    PLAN,
    plan_lib.RunPlan.build(blt.PRODUCTION_STRATEGIES[400], 2.0, 50, 1.0, adaptive_clip=True,
                           num_rounds=2000, population=5000, noise_seed_fixed=False),
    plan_lib.RunPlan.for_accounting(banded.BandedStrategy.from_toeplitz([1.0, 0.5, 0.25], 16), 1.0,
                                    num_rounds=16)])
def test_plan_digest_is_the_plan_files_and_ignores_the_replaceable_setting(tmp_path, plan):
  plan_lib.save_plan(plan, tmp_path / 'plan.json')
  digest = records.plan_digest(plan)
  assert records.plan_digest(plan_lib.load_plan(tmp_path / 'plan.json')) == digest
  config = plan.to_config()
  replaced = plan_lib.RunPlan.from_config({**config, 'num_rounds': 7, 'participation': None,
                                           'target_delta': 1e-3})
  assert records.plan_digest(replaced) == digest
  noisier = plan_lib.RunPlan.from_config({**config, 'noise_multiplier': 3.0})
  assert records.plan_digest(noisier) != digest
