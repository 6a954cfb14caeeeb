"""The run's canary release: each round's canary projections, held until the checkpoint of a later
round writes them to canaries.csv (so the file holds exactly the checkpointed rounds its record
describes), and the run's `CanaryRecorder` with its files started."""

from typing import Optional

import tensorflow_federated as tff

from dp_ftrl_tff.training import canary_clients, checkpoint_records, record_checks


class CanaryRounds(tff.program.ReleaseManager):
  """Holds each round's canary projections (train_model's released value and 1-based key) until
  `write(version)` appends those of the rounds before `version` to canaries.csv
  (`canary_clients.CanaryRecorder.record_round`): the state manager writes them just before the
  checkpoint of `version`, so canaries.csv holds exactly the checkpointed rounds when the
  checkpoint's record describes it (train_model releases round r + 1 while round r saves)."""

  def __init__(self, recorder: canary_clients.CanaryRecorder):
    self._recorder, self._held = recorder, {}

  async def release(self, value, key):
    self._held[int(key) - 1] = value['aggregator']

  def write(self, version: int) -> None:
    for round_num in sorted(r for r in self._held if r < version):
      self._recorder.record_round(round_num, self._held.pop(round_num))


def canary_recorder(output_dir: str, start, num_params: int
                    ) -> Optional[canary_clients.CanaryRecorder]:
  """The `canary_clients.CanaryRecorder` of the run `start` in `output_dir` (`run_start.RunStart`; a model of
  `num_params` trainable parameters) with its files started (a resume trims canaries.csv to its
  checkpoint's record and rebuilds a missing or altered canaries.json), or None without canaries."""
  if start.canaries is None:
    return None
  recorder = canary_clients.CanaryRecorder(start.canaries, start.canary_ids,
                                           output_dir, num_params, start.plan, start.run_id)
  resumption = start.resumption
  if not resumption.fresh:
    checkpoint_records.trim_files(output_dir, resumption)
  recorder.start_files(resumption.fresh, start.rebuild)
  if not resumption.fresh:
    record_checks.check_rebuilt(output_dir, resumption, start.rebuild)
  return recorder
