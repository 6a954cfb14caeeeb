"""A sampler kind registered from outside the package works everywhere without editing any module.

`tests.testing.round_robin` holds a `Sampler` subclass and one registry entry; this test registers
it and takes it through the plan (and its file), `sampling.make_sampler` (the drivers' road), the
program's data source (select, the participation log, the iterator's bytes) and the checkpointed
state a driver stores (the drivers call `make_sampler`; their runs are the shared ones of
tests/experiments).
"""


import pytest

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff import sampling
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.mechanisms import blt
from dp_ftrl_tff.programs import data_source
from tests.testing import round_robin

pytestmark = pytest.mark.unit

IDS = [f'client-{i:02d}' for i in range(10)]
ROUNDS, PER_ROUND = 6, 4


@pytest.fixture(autouse=True)
def registered():
  with sampling.registered(round_robin.KIND):
    yield
  assert round_robin.NAME not in sampling.names()


def _plan():
  return plan_lib.RunPlan.build(blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2)), 1.0,
                                PER_ROUND, 1.0, sampling=sampling.Sampling(round_robin.NAME),
                                num_rounds=ROUNDS, population=len(IDS))


def _expected(t):
  return [IDS[(t * PER_ROUND + i) % len(IDS)] for i in range(PER_ROUND)]


def test_the_kind_is_a_plan_setting(tmp_path):
  plan = _plan()
  assert round_robin.NAME in sampling.names() and not plan.sampling.random_cohorts
  plan_lib.save_plan(plan, tmp_path / 'plan.json')
  assert plan_lib.load_plan(tmp_path / 'plan.json') == plan
  with pytest.raises(ValueError, match='sampling_prob'):
    sampling.Sampling(round_robin.NAME, 0.5)
  with pytest.raises(ValueError, match='already registered'):
    sampling.register(round_robin.KIND)


def test_make_sampler_draws_and_checkpoints_its_state():
  sampler = sampling.make_sampler(IDS, _plan(), seed=3)
  assert isinstance(sampler, round_robin.RoundRobinSampler) and sampler.cohort_size == PER_ROUND
  head = [sampler.sample(t) for t in range(2)]
  saved = sampler.state  # what the drivers' checkpoint stores
  resumed = sampling.make_sampler(IDS, _plan(), seed=3)
  resumed.load_state(saved)
  assert head + [resumed.sample(t) for t in range(2, ROUNDS)] == [
      _expected(t) for t in range(ROUNDS)]


def test_the_data_source_selects_logs_and_restores_it(tmp_path):
  path = tmp_path / 'participation.csv'
  iterator = data_source.SampledClientDataSource(IDS, _plan(), str(path), 3).iterator()
  assert iterator.sampler_kind == round_robin.NAME
  with pytest.raises(ValueError, match='exactly 4 clients'):
    iterator.select(3)
  cohorts = [iterator.select(PER_ROUND) for _ in range(2)]
  restored = type(iterator).from_bytes(iterator.to_bytes())
  assert restored == iterator
  cohorts += [restored.select(PER_ROUND) for _ in range(2, ROUNDS)]
  assert cohorts == [_expected(t) for t in range(ROUNDS)]
  with pytest.raises(ValueError, match='num_rounds'):
    restored.select(PER_ROUND)
  log = participation_log.read_participation_log(str(path))
  assert log.num_rounds == ROUNDS and log.num_rows == ROUNDS * PER_ROUND


def test_unregistered_the_kind_is_unknown():
  sampling.unregister(round_robin.NAME)
  try:
    with pytest.raises(ValueError, match='kind'):
      sampling.Sampling(round_robin.NAME)
  finally:
    sampling.register(round_robin.KIND)
  with pytest.raises(ValueError, match='built in'):
    sampling.unregister('min_sep')
