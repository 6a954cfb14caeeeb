"""`tff.learning.programs.train_model` runs on `SampledClientDataSource`: its saves hold the iterator
after r selects, a restart restores it from the saved bytes, and the log equals the drivers'."""

import asyncio

import pytest
import tensorflow_federated as tff

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.learning import client_sampler
from dp_ftrl_tff.mechanisms import blt
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.programs import data_source
from tests.testing import programs

pytestmark = pytest.mark.integration

NUM_CLIENTS, PER_ROUND, MIN_SEP, SEED = 12, 3, 2, 4


class _DiscardOnce:
  """should_discard_round: discards the first attempt of the `at`-th round."""

  def __init__(self, at):
    self.calls, self.at = 0, at

  def __call__(self, output):
    del output
    self.calls += 1
    return self.calls == self.at


def _train(process, source, state_dir, rounds, discard=None):
  manager = tff.program.FileProgramStateManager(str(state_dir), keep_total=0)
  asyncio.run(tff.learning.programs.train_model(
      train_process=process, train_data_source=source, train_per_round_clients=PER_ROUND,
      train_total_rounds=rounds, should_discard_round=discard, program_state_manager=manager,
      model_output_manager=tff.program.MemoryReleaseManager(), evaluation_manager=None,
      evaluation_periodicity=1))
  return manager


def _template(process, source):
  """The structure `load` restores into (as train_model builds it)."""

  async def initialize():
    return await tff.program.materialize_value(process.initialize())

  return tff.learning.programs.ProgramState(asyncio.run(initialize()), 0, 0, source.iterator())


def test_train_model_saves_restores_and_logs_like_the_drivers(tmp_path):
  client_data = programs.client_data()
  process = programs.regression_process(client_data)
  context = tff.program.NativeFederatedContext(
      tff.backends.native.create_async_local_cpp_execution_context())
  log_path = tmp_path / 'participation.csv'
  plan = plan_lib.RunPlan.build(
      blt.BLTStrategy(theta=(0.9, 0.5), omega=(0.3, 0.2)), 1.0, PER_ROUND, 1.0, num_rounds=6,
      participation=participation_lib.ParticipationSchema.b_min_sep(MIN_SEP))

  def source():  # what a program builds on every start
    return data_source.SampledClientDataSource(client_data, plan, str(log_path), SEED)

  discard = _DiscardOnce(2)  # round 2 runs twice: its cohort is re-selected from the deep copy
  with tff.framework.get_context_stack().install(context):
    manager = _train(process, source(), tmp_path / 'state', 3, discard=discard)
    assert discard.calls == 4
    template = _template(process, source())
    for version in range(4):  # save r holds the iterator after r selects
      saved = asyncio.run(manager.load(version, template))
      assert saved.round_number == version and saved.data_iterator.next_round == version
    # Work past the last save, then a crash mid-row: the restart cuts both away.
    saved.data_iterator.select(PER_ROUND)
    with open(log_path, 'ab') as f:
      f.write(b'c0')
    _train(process, source(), tmp_path / 'state', 6)
    final = asyncio.run(manager.load_latest(template))[0]
  assert final.data_iterator.next_round == 6

  sampler = client_sampler.ClientSampler(client_data.client_ids, PER_ROUND, min_sep=MIN_SEP,
                                         seed=SEED, num_rounds=6)
  writer = participation_log.ParticipationLogWriter(str(tmp_path / 'driver.csv'))
  for t in range(6):
    writer.append_round(t, sampler.sample(t))
  assert log_path.read_bytes() == (tmp_path / 'driver.csv').read_bytes()
