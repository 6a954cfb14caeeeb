"""The program's state manager: which rounds it saves (`--checkpoint_every`, the last, a stop)."""

import asyncio
import collections

import numpy as np
import pytest

from dp_ftrl_tff.training import release_order, state_manager

pytestmark = pytest.mark.unit


def _state(version):
  return collections.OrderedDict(weights=np.full([2], version, np.float32))


def test_saves_every_nth_round_the_last_and_the_held_one_on_a_stop(tmp_path):
  released = release_order.RoundsReleased()
  recorded = []
  manager = state_manager.StateManager(str(tmp_path), released, recorded.append, every=3,
                                          total_rounds=7, keep_total=0)

  async def rounds(versions, stop=False):
    for version in versions:
      released.mark(version)
      await manager.save(_state(version), version)
    if stop:
      await manager.save_held()
    return await manager.get_versions()

  assert asyncio.run(rounds(range(5))) == [0, 3]
  # A stop after round 4 saves round 4, held back; a second call saves nothing more.
  assert asyncio.run(rounds([], stop=True)) == [0, 3, 4]
  assert asyncio.run(rounds([], stop=True)) == [0, 3, 4]
  loaded = asyncio.run(manager.load(4, _state(0)))
  np.testing.assert_array_equal(loaded['weights'], [4, 4])
  # A resumed run: rounds 5 and 6 (the last round is always saved); nothing is held past them.
  assert asyncio.run(rounds([5, 6], stop=True)) == [0, 3, 4, 6]
  assert recorded == [0, 3, 4, 6]


def test_a_held_round_is_not_saved_after_a_failure(tmp_path):
  released = release_order.RoundsReleased()
  manager = state_manager.StateManager(str(tmp_path), released, lambda version: None, every=2,
                                          total_rounds=4, keep_total=0)

  async def run():
    for version in range(2):
      released.mark(version)
      await manager.save(_state(version), version)
    released.fail(OSError('disk full'))
    await manager.save_held()
    return await manager.get_versions()

  assert asyncio.run(run()) == [0]
