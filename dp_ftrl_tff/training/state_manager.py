"""The run's program state manager: TFF's `FileProgramStateManager` whose checkpoint of round r is
saved after round r's releases (`release_order.RoundsReleased`), with its record written after it,
on the run's cadence, and whose loaded data iterator continues with the run's data source."""

import asyncio
from typing import Optional

import tensorflow_federated as tff

from dp_ftrl_tff.programs import data_source as data_source_lib
from dp_ftrl_tff.training.release_order import RoundsReleased


class StateManager(tff.program.FileProgramStateManager):
  """`FileProgramStateManager` that saves every `every`-th version, the last (`total_rounds`) and,
  through `save_held`, the latest one it held back (a stop); `before_save(version)` (if given)
  precedes each save and `after_save(version)` follows it. A loaded train_model `ProgramState`'s
  data iterator is replaced by `source.resume(iterator)` (given a `source`): the checkpoint's draws
  continue with the run's data source, its log path and its rounds. A save of version r >= 1 waits for round r's releases, one save at a time (concurrent saves
  race in removing old versions: TFF's check-then-rmtree fails with NotFoundError when two saves
  remove the same one). After a failed release or save (`RoundsReleased.failure`) it saves
  nothing: a checkpoint never runs ahead of what failed. Its own error is recorded there, not
  raised."""

  def __init__(self, root_dir, released: RoundsReleased, after_save, every: int,
               total_rounds: int, before_save=None,
               source: Optional[data_source_lib.SampledClientDataSource] = None, **kwargs):
    super().__init__(root_dir, **kwargs)
    self._released, self._after_save, self._before_save = released, after_save, before_save
    self._source = source
    self._every, self._total_rounds = every, total_rounds
    self._held = None  # (program_state, version) of the latest version not yet due
    self._lock = None

  async def save(self, program_state, version):
    if version % self._every and version != self._total_rounds:
      # train_model hands over a materialized state and a copy of the data iterator: kept as is.
      self._held = (program_state, version)
      return
    await self._save(program_state, version)

  async def load(self, version, structure):
    program_state = await super().load(version, structure)
    if self._source is None:
      return program_state
    return program_state._replace(data_iterator=self._source.resume(program_state.data_iterator))

  async def save_held(self) -> None:
    """Saves the version held back, if it is later than every saved one (a stopped run)."""
    if self._held is not None and self._held[1] > max(await self.get_versions() or [0]):
      await self._save(*self._held)

  async def _save(self, program_state, version):
    if version >= 1:
      await self._released.wait(version)
    if self._lock is None:
      self._lock = asyncio.Lock()
    async with self._lock:
      if self._released.failure is not None:
        return
      try:
        if self._before_save is not None:
          self._before_save(version)
        await super().save(program_state, version)
        self._after_save(version)  # the checkpoint's record (dp_ftrl_tff.training.checkpoint_records)
      except Exception as error:  # noqa: BLE001 (the loop raises it in its own task)
        self._released.fail(error)
