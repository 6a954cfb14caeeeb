"""The order of a run's background releases: which rounds' metrics and evaluations were released
(`RoundsReleased`, which a checkpoint of round r waits for, so it never runs ahead of metrics.csv),
and the run's first failure, recorded instead of dropped.

`tff.learning.programs.train_model` starts a round's save, its releases and its evaluation as
concurrent background tasks, and an error of one of them is only logged by its task manager's
done-callback while training goes on. Here it is recorded (`RoundsReleased.failure`), every wait
ends, no later checkpoint is saved, and the loop raises it before the next round.
"""

import asyncio

import tensorflow_federated as tff


class RoundsReleased:
  """Which rounds' metrics (train_model's 1-based keys) were released, and which rounds'
  evaluations (keys ('eval', r)); a save of version r waits for round r's metrics. `failure`: the
  first error of a release, a save, an evaluation or (recorded by the loop) train_model's own
  task, or None."""

  def __init__(self):
    self._events = {}
    self._ended = False
    self.failure = None

  def fail(self, error: BaseException) -> None:
    """Records `error` (the first one counts) and ends every wait, present and future: the saves
    then save nothing (train_model may have died before it started a save's release)."""
    if self.failure is None:
      self.failure = error
    self._ended = True
    for event in self._events.values():
      event.set()

  def _event(self, key) -> asyncio.Event:
    # A round (int) or another key, e.g. ('eval', round): `program_evaluation.Evaluations`'.
    event = self._events.setdefault(key if isinstance(key, tuple) else int(key), asyncio.Event())
    if self._ended:
      event.set()
    return event

  def mark(self, key: int) -> None:
    self._event(key).set()

  async def wait(self, key: int) -> None:
    await self._event(key).wait()


class RecordingRelease(tff.program.ReleaseManager):
  """Releases through `inner`; an error of the release is recorded (`RoundsReleased.fail`), not
  raised (see the module docstring). The run's model output release is one."""

  def __init__(self, inner, released: RoundsReleased):
    self._inner, self._released = inner, released

  async def release(self, value, key):
    try:
      await self._inner.release(value, key)
    except Exception as error:  # noqa: BLE001 (the loop raises it in its own task)
      self._released.fail(error)


class MarkingRelease(RecordingRelease):
  """A `RecordingRelease` that then marks the round released, also after an error (its save must
  not wait forever; it saves nothing after a failure)."""

  async def release(self, value, key):
    try:
      await super().release(value, key)
    finally:
      self._released.mark(key)
