"""Tests of `dp_ftrl_tff.programs.data_source` beyond TFF's contract: the samplers' guarantees, the
drivers' log bytes, restart and discard idempotence, and corrupt state."""

import asyncio
import copy
import dataclasses
import hashlib
import json
import struct

import numpy as np
import pytest
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff import settings
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.learning import client_sampler, poisson_sampler
from dp_ftrl_tff.mechanisms import blt, gaussian
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.programs import data_source

pytestmark = pytest.mark.unit

IDS = [f'client-{i:03d}' for i in range(60)]
HEADER_SIZE = len(b'client_id,round\r\n')
Iterator = data_source.SampledClientDataSourceIterator

BLT = blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2))
POISSON = sampling_lib.Sampling('poisson', 0.1, 1, len(IDS))
CYCLIC = sampling_lib.Sampling('cyclic_poisson', 0.3, 4, len(IDS))
# name -> (the plan, k passed to select, the sampler of the same settings built by hand)
SETTINGS = {
    'min_sep': (plan_lib.RunPlan.build(
        BLT, 1.0, 5, 1.0, num_rounds=48, population=len(IDS),
        participation=participation_lib.ParticipationSchema.b_min_sep(6, 5)), 5,
                lambda ids, seed: client_sampler.ClientSampler(
                    ids, 5, min_sep=6, max_participations=5, seed=seed, num_rounds=48)),
    'poisson': (plan_lib.RunPlan.build(BLT, 1.0, None, 1.0, sampling=POISSON), 6,
                lambda ids, seed: poisson_sampler.PoissonSampler(ids, POISSON, seed=seed)),
    'cyclic_poisson': (plan_lib.RunPlan.build(BLT, 1.0, None, 1.0, sampling=CYCLIC), 5,
                       lambda ids, seed: poisson_sampler.PoissonSampler(ids, CYCLIC, seed=seed)),
}


def _source(path, kind='min_sep', seed=11, ids=IDS):
  return data_source.SampledClientDataSource(ids, SETTINGS[kind][0], str(path), seed)


def _driver_log(path, kind, rounds, seed=11, ids=IDS):
  """The log of a plain loop over the sampler (`sampler.sample(t)` then
  `ParticipationLogWriter.append_round(t, cohort)`, as docs/tutorial.md's own loop writes it) and
  its cohorts."""
  sampler = SETTINGS[kind][2](list(ids), seed)
  writer = participation_log.ParticipationLogWriter(str(path))
  cohorts = []
  for t in range(rounds):
    cohorts.append(sampler.sample(t))
    writer.append_round(t, cohorts[-1])
  return path.read_bytes(), cohorts


def test_min_sep_and_the_cap_hold_over_many_rounds(tmp_path):
  path = tmp_path / 'participation.csv'
  iterator = _source(path).iterator()
  for _ in range(48):
    assert len(iterator.select(5)) == 5
  log = participation_log.read_participation_log(str(path))
  declared = participation_lib.ParticipationSchema.b_min_sep(6, 5)
  assert log.violations(declared, num_rounds=48) == []
  assert log.num_rounds == 48 and log.num_rows == 48 * 5
  assert log.min_sep >= 6 and log.max_participations <= 5
  with pytest.raises(ValueError, match='num_rounds'):  # the schedule ends at round n - 1
    iterator.select(5)


def test_cyclic_poisson_keeps_its_groups_apart(tmp_path):
  path = tmp_path / 'participation.csv'
  iterator = _source(path, 'cyclic_poisson').iterator()
  for _ in range(40):
    iterator.select(5)
  log = participation_log.read_participation_log(str(path))
  assert log.violations(participation_lib.ParticipationSchema.b_min_sep(4), 40) == []
  assert np.all(log.gap_gcds[log.min_gaps > 0] % 4 == 0)  # always a multiple of b-hat apart


@pytest.mark.parametrize('kind', list(SETTINGS))
def test_log_and_cohorts_equal_the_drivers(tmp_path, kind):
  rounds = 30
  expected, cohorts = _driver_log(tmp_path / 'driver.csv', kind, rounds)
  iterator = _source(tmp_path / 'program.csv', kind).iterator()
  selected = [iterator.select(SETTINGS[kind][1]) for _ in range(rounds)]
  assert selected == cohorts
  assert (tmp_path / 'program.csv').read_bytes() == expected
  assert iterator.log_offset == len(expected)


def test_ids_that_need_quoting_are_logged_as_the_drivers_log_them(tmp_path):
  ids = ['plain', 'with,comma', 'with "quote"', 'ünïcödé', 'line\nbreak', ' space ']
  source = data_source.SampledClientDataSource(ids, plan_lib.RunPlan.build(BLT, 1.0, 2, 1.0),
                                               str(tmp_path / 'p.csv'), 1)
  iterator = source.iterator()
  sampler = client_sampler.ClientSampler(ids, 2, seed=1)
  writer = participation_log.ParticipationLogWriter(str(tmp_path / 'd.csv'))
  for t in range(6):
    cohort = sampler.sample(t)
    assert iterator.select(2) == cohort
    writer.append_round(t, cohort)
  assert (tmp_path / 'p.csv').read_bytes() == (tmp_path / 'd.csv').read_bytes()
  log = participation_log.read_participation_log(str(tmp_path / 'p.csv'))
  assert {log.client_id(c) for c in range(log.num_clients)} <= set(ids)  # read back intact
  restored = Iterator.from_bytes(iterator.to_bytes())
  assert restored == iterator and restored.client_ids == tuple(ids)


@pytest.mark.parametrize('kind', list(SETTINGS))
@pytest.mark.parametrize('saved_after, ahead', [(0, 0), (7, 0), (7, 3), (29, 1)])
@pytest.mark.parametrize('torn', [False, True])
def test_restart_from_bytes_gives_the_uninterrupted_log(tmp_path, kind, saved_after, ahead, torn):
  rounds, k = 30, SETTINGS[kind][1]
  reference_path = tmp_path / 'reference.csv'
  reference = _source(reference_path, kind).iterator()
  reference_cohorts = [reference.select(k) for _ in range(rounds)]

  path = tmp_path / 'run.csv'
  iterator = _source(path, kind).iterator()
  cohorts = [iterator.select(k) for _ in range(saved_after)]
  saved = copy.deepcopy(iterator).to_bytes()  # what train_model saves after round `saved_after`
  for _ in range(min(ahead, rounds - saved_after)):  # work after the checkpoint, then a crash
    iterator.select(k)
  if torn:
    with open(path, 'ab') as f:
      f.write(b'client-00')
  # The restart: the program builds its data source and a template iterator again (no side
  # effects), then restores the saved iterator from its bytes alone.
  template = _source(path, kind).iterator()
  restored = type(template).from_bytes(saved)
  assert restored.next_round == saved_after
  cohorts += [restored.select(k) for _ in range(rounds - saved_after)]
  assert cohorts == reference_cohorts
  assert path.read_bytes() == reference_path.read_bytes()
  assert restored.log_offset == reference.log_offset
  # Every field but the log path is the uninterrupted iterator's.
  assert _fields(restored.to_bytes()) | {'participation_log': ''} == (
      _fields(reference.to_bytes()) | {'participation_log': ''})


@pytest.mark.parametrize('kind', list(SETTINGS))
def test_resume_continues_a_restored_iterator_in_a_moved_log_with_more_rounds(tmp_path, kind):
  # A run of 30 rounds (the min-sep plan's 48 above), saved after 12, its directory moved, then
  # resumed by a data source of a 48-round plan at the new path: it draws the uninterrupted
  # cohorts into the moved log, up to the new plan's rounds.
  rounds, k = 30, SETTINGS[kind][1]
  reference_path = tmp_path / 'reference.csv'
  reference = _source(reference_path, kind).iterator()
  reference_cohorts = [reference.select(k) for _ in range(rounds)]
  old, new = tmp_path / 'old.csv', tmp_path / 'moved' / 'run.csv'
  iterator = _source(old, kind).iterator()
  cohorts = [iterator.select(k) for _ in range(12)]
  saved = iterator.to_bytes()
  new.parent.mkdir()
  old.rename(new)
  source = _source(new, kind)
  resumed = source.resume(Iterator.from_bytes(saved))
  assert (resumed.next_round, resumed.log_offset) == (12, iterator.log_offset)
  assert _fields(resumed.to_bytes())['participation_log'] == str(new)
  cohorts += [resumed.select(k) for _ in range(rounds - 12)]
  assert cohorts == reference_cohorts
  assert new.read_bytes() == reference_path.read_bytes()
  assert not old.exists()


def test_resume_refuses_an_iterator_of_another_population_or_sampler(tmp_path):
  saved = _source(tmp_path / 'a.csv', 'min_sep').iterator()
  with pytest.raises(ValueError, match=r'the population \(60 clients -> 60\)'):
    _source(tmp_path / 'b.csv', 'min_sep', ids=IDS[:-1] + ['x']).resume(saved)
  with pytest.raises(ValueError, match=r'the population \(60 clients -> 60, reordered\)'):
    _source(tmp_path / 'b.csv', 'min_sep', ids=IDS[::-1]).resume(saved)
  with pytest.raises(ValueError, match='sampling.kind: "min_sep" -> "poisson"'):
    _source(tmp_path / 'c.csv', 'poisson').resume(saved)
  with pytest.raises(ValueError, match='`iterator` must be a SampledClientDataSourceIterator'):
    _source(tmp_path / 'd.csv', 'min_sep').resume('bytes')


def _state_saved_by_tff(tmp_path, source, rounds):
  """The checkpoint directory of `tff.program.FileProgramStateManager` after it saved
  `(rounds, source's iterator after `rounds` selects)`, as a user's own program saves it."""
  iterator = source.iterator()
  k = iterator._sampler.cohort_size
  for _ in range(rounds):
    iterator.select(k if k is not None else 0)
  manager = tff.program.FileProgramStateManager(str(tmp_path / 'checkpoints'))
  asyncio.run(manager.save((np.int32(rounds), iterator), version=rounds))
  return manager


BASE = SETTINGS['min_sep'][0]
# A setting of the plan changed on resume -> the name the refusal gives it.
PLAN_CHANGES = {
    'noise_multiplier': (dataclasses.replace(BASE, noise_multiplier=1.5),
                         'noise_multiplier: 1.0 -> 1.5'),
    'clip_norm': (dataclasses.replace(BASE, clip_norm=2.0), 'clip_norm: 1.0 -> 2.0'),
    'mechanism': (dataclasses.replace(BASE, strategy=gaussian.GaussianStrategy()),
                  'strategy.mechanism: "blt" -> "gaussian"'),
    'mechanism_options': (dataclasses.replace(BASE, strategy=blt.BLTStrategy(
        theta=(0.9, 0.4), omega=(0.3, 0.2))), r'strategy.theta: \[0.9, 0.5\] -> \[0.9, 0.4\]'),
    'min_sep': (dataclasses.replace(BASE, participation=participation_lib.ParticipationSchema
                                    .b_min_sep(7, 5)), 'participation.min_sep: 6 -> 7'),
    'max_participations': (dataclasses.replace(BASE, participation=participation_lib
                                               .ParticipationSchema.b_min_sep(6, 6)),
                           'participation.max_participations: 5 -> 6'),
    'clients_per_round': (dataclasses.replace(BASE, clients_per_round=4),
                          'clients_per_round: 5.0 -> 4.0'),
    'sampler': (plan_lib.RunPlan.build(BLT, 1.0, None, 1.0, num_rounds=48, sampling=POISSON),
                'sampling.kind: "min_sep" -> "poisson"'),
    'restarts': (dataclasses.replace(BASE, restarts=settings.RestartSchedule.at((10,))),
                 r'restarts: null -> {"rounds": \[10\]}'),
    'adaptive_clipping': (plan_lib.RunPlan.build(
        BLT, 1.0, 5, 1.0, adaptive_clip=settings.AdaptiveClipping(clipped_count_stddev=10.0),
        num_rounds=48, population=len(IDS),
        participation=participation_lib.ParticipationSchema.b_min_sep(6, 5)),
        'adaptive_clip: null -> {"clip_learning_rate": 0.2, "clipped_count_stddev": 10.0'),
    'noise_seed': (dataclasses.replace(BASE, noise_seed_fixed=True),
                   'noise_seed_fixed: null -> true'),
}


@pytest.mark.parametrize('setting', list(PLAN_CHANGES) + ['seed'])
def test_a_state_manager_cannot_resume_the_draws_under_another_plan(tmp_path, setting):
  """TFF's own FileProgramStateManager, restoring into a template of a data source built for
  another plan (or seed): refused before any round, naming what changed."""
  manager = _state_saved_by_tff(tmp_path, _source(tmp_path / 'p.csv'), 3)
  plan, match = PLAN_CHANGES.get(setting, (BASE, 'seed: 11 -> 12'))
  changed = data_source.SampledClientDataSource(IDS, plan, str(tmp_path / 'p.csv'),
                                                12 if setting == 'seed' else 11)
  with pytest.raises(ValueError, match=match) as raised:
    asyncio.run(manager.load_latest((np.int32(0), changed.iterator())))
  assert '\n' not in str(raised.value) and 'round 3' in str(raised.value)


def test_a_state_manager_resumes_the_draws_with_more_rounds_elsewhere(tmp_path):
  """What a run may change on resume (`plan.RESUMABLE_FIELDS`): more rounds, another delta, a
  moved log; the restored draws continue those of an uninterrupted run."""
  reference = _source(tmp_path / 'reference.csv').iterator()
  expected = [reference.select(5) for _ in range(8)]
  manager = _state_saved_by_tff(tmp_path, _source(tmp_path / 'p.csv'), 3)
  (tmp_path / 'moved').mkdir()
  (tmp_path / 'p.csv').rename(tmp_path / 'moved' / 'p.csv')
  longer = dataclasses.replace(BASE, num_rounds=60, target_delta=1e-7,
                               participation=participation_lib.ParticipationSchema.b_min_sep(6, 5))
  source = data_source.SampledClientDataSource(IDS, longer, str(tmp_path / 'moved' / 'p.csv'), 11)
  (rounds, iterator), version = asyncio.run(manager.load_latest((np.int32(0), source.iterator())))
  assert version == rounds == 3 and type(iterator) is type(source.iterator())
  assert [iterator.select(5) for _ in range(5)] == expected[3:]
  assert (tmp_path / 'moved' / 'p.csv').read_bytes() == (tmp_path / 'reference.csv').read_bytes()


PREFIX = 8 + 2 + 32  # magic, version, SHA-256 of the body


def _fields(buffer):
  return json.loads(buffer[PREFIX:])


def _with_body(buffer, body):
  return buffer[:10] + hashlib.sha256(body).digest() + body


def _with_fields(buffer, **changes):
  return _with_body(buffer, json.dumps(_fields(buffer) | changes).encode())


@pytest.mark.parametrize('kind', list(SETTINGS))
def test_a_discarded_round_reselects_the_same_cohort(tmp_path, kind):
  """train_model's discard path: deep copy, select, discard, select again from the deep copy."""
  path = tmp_path / 'participation.csv'
  k = SETTINGS[kind][1]
  iterator = _source(path, kind).iterator()
  for _ in range(3):
    iterator.select(k)
  previous = copy.deepcopy(iterator)
  assert previous == iterator and previous.client_ids is iterator.client_ids  # ids shared
  first = iterator.select(k)
  log, state = path.read_bytes(), iterator.to_bytes()
  assert previous.next_round == 3  # the copy did not move
  iterator = copy.deepcopy(previous)
  for _ in range(3):  # discarded again and again: the same round, cohort, log and state
    assert iterator.select(k) == first
    assert path.read_bytes() == log and iterator.to_bytes() == state
    iterator = copy.deepcopy(previous)


def test_poisson_rounds_can_be_empty(tmp_path):
  plan = plan_lib.RunPlan.build(BLT, 1.0, None, 1.0,
                                sampling=sampling_lib.Sampling('poisson', 0.01, 1, 20))
  source = data_source.SampledClientDataSource(IDS[:20], plan, str(tmp_path / 'p.csv'), 0)
  iterator = source.iterator()
  sizes = [len(iterator.select(0)) for _ in range(20)]
  assert 0 in sizes and iterator.next_round == 20
  log = participation_log.read_participation_log(str(tmp_path / 'p.csv'))
  assert log.num_rows == sum(sizes)


def _corrupt(buffer, what):
  fields = _fields(buffer)
  return {
      'magic': b'NOTMAGIC' + buffer[8:],
      'version': buffer[:8] + struct.pack('<H', 4) + buffer[10:],
      'earlier_version': buffer[:8] + struct.pack('<H', 2) + buffer[10:],
      'truncated_prefix': buffer[:5],
      'truncated_body': buffer[:60],
      'checksum': buffer[:-1] + bytes([buffer[-1] ^ 1]),
      'not_json': _with_body(buffer, b'{' * 20),
      'not_an_object': _with_body(buffer, b'[]'),
      'missing_field': _with_body(buffer, b'{}'),
      'bad_seed': _with_fields(buffer, config=fields['config'] | {'seed': -3}),
      'bad_cohort': _with_fields(buffer, config=fields['config'] | {'clients_per_round': 61}),
      'bad_state': _with_fields(buffer, state=fields['state'] | {'last_round': [0]}),
      'sampler_kind': _with_fields(buffer, sampler='poisson'),
      'unknown_kind': _with_fields(buffer, sampler='uniform'),
      'not_bytes': 'a string',
  }[what]


@pytest.mark.parametrize('what, match', [
    ('magic', 'magic'), ('version', 'version 4'), ('earlier_version', 'version 2 .*earlier'),
    ('truncated_prefix', 'Truncated'),
    ('truncated_body', 'SHA-256'), ('checksum', 'SHA-256'), ('not_json', 'JSON'),
    ('not_an_object', 'lack'), ('missing_field', 'lack'), ('bad_seed', 'seed'),
    ('bad_cohort', 'clients_per_round'), ('bad_state', 'population changed'),
    ('sampler_kind', "'poisson' sampler.*config"), ('unknown_kind', 'kind'),
    ('not_bytes', '`buffer`')])
def test_corrupt_bytes_raise_value_error_naming_the_problem(tmp_path, what, match):
  iterator = _source(tmp_path / 'p.csv').iterator()
  iterator.select(5)
  with pytest.raises(ValueError, match=match):
    Iterator.from_bytes(_corrupt(iterator.to_bytes(), what))


def test_an_impossible_state_is_refused(tmp_path):
  buffer = _source(tmp_path / 'p.csv', 'poisson').iterator().to_bytes()
  config = _fields(buffer)['config']
  config['sampling']['sampling_prob'] = 2.0
  with pytest.raises(ValueError, match='sampling_prob'):
    Iterator.from_bytes(_with_fields(buffer, config=config))


@pytest.mark.parametrize('damage, match', [
    (lambda p: p.write_bytes(p.read_bytes()[:30]), 'fewer than'),
    (lambda p: p.write_bytes(b'a,b\r\n' + p.read_bytes()[5:]), 'header'),
    (lambda p: p.write_bytes(p.read_bytes()[:HEADER_SIZE] + b'x' + p.read_bytes()[HEADER_SIZE:]),
     'start of a line'),
    (lambda p: p.unlink(), 'missing'),
])
def test_a_damaged_log_is_refused_and_the_iterator_is_unchanged(tmp_path, damage, match):
  path = tmp_path / 'p.csv'
  iterator = _source(path).iterator()
  for _ in range(3):
    iterator.select(5)
  before = iterator.to_bytes()
  damage(path)
  with pytest.raises(ValueError, match=match):
    iterator.select(5)
  assert iterator.to_bytes() == before


def test_append_round_at_writes_the_bytes_of_append_round(tmp_path):
  rows = [(0, ['a', 'b,c']), (1, []), (2, ['ü', 'd "e"', 'a'])]
  appended = participation_log.ParticipationLogWriter(str(tmp_path / 'appended.csv'))
  at = participation_log.ParticipationLogWriter(str(tmp_path / 'at.csv'))
  offset = len(participation_log.HEADER_BYTES)
  assert offset == HEADER_SIZE == at.size
  for round_num, ids in rows:
    appended.append_round(round_num, ids)
    offset = at.append_round_at(offset, round_num, ids)
    assert offset == at.size == appended.size
  assert (tmp_path / 'at.csv').read_bytes() == (tmp_path / 'appended.csv').read_bytes()
  with pytest.raises(ValueError, match='offset'):
    at.append_round_at(3, 0, ['a'])
  with pytest.raises(ValueError, match='client_ids'):
    at.append_round_at(offset, 3, 'abc')
  with pytest.raises(ValueError, match='round_num'):
    at.append_round_at(offset, -1, ['a'])


def _plan(**kwargs):
  return plan_lib.RunPlan.build(BLT, 1.0, **kwargs)


def test_the_plan_makes_the_sampler(tmp_path):
  for kind in SETTINGS:
    iterator = _source(tmp_path / f'{kind}.csv', kind).iterator()
    assert iterator.sampler_kind == kind and iterator.select(SETTINGS[kind][1]) == (
        SETTINGS[kind][2](IDS, 11).sample(0))
  with pytest.raises(ValueError, match='population'):
    data_source.SampledClientDataSource(
        IDS[:50], _plan(clients_per_round=5, clip_norm=1.0, population=len(IDS)),
        str(tmp_path / 'c.csv'), 11)
  with pytest.raises(ValueError, match='fractional'):
    data_source.SampledClientDataSource(
        IDS, _plan(clients_per_round=2.5, clip_norm=1.0), str(tmp_path / 'c.csv'), 11)
  with pytest.raises(ValueError, match='`plan`'):
    data_source.SampledClientDataSource(IDS, {'plan': 1}, str(tmp_path / 'c.csv'), 11)
