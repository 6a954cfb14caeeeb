"""The canary clients of a run (`canary_clients`): their ids, canaries and files.

A run with N canary clients appends N clients to the task's population, named `CANARY_ID_PREFIX`
and a 5-digit index; the sampler draws them like any client. A canary's dataset is empty (the
process over client ids builds it: `dp_ftrl_tff.programs.client_ids`): in its rounds the process
inserts the canary's direction instead (`dp_ftrl_tff.learning.canaries`). `CanaryRecorder` writes `canaries.json` (ids, seed, metadata)
and `canaries.csv` (per-round projections, in units of the round's clip on the sum), then the final
model delta's cosines with the canary directions (`dp_ftrl_tff.auditing.records`; docs/auditing.md).
"""

from typing import List, Optional, Sequence, Tuple

import numpy as np
from absl import logging

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.learning import canaries as canaries_lib

#: The id of canary client i is CANARY_ID_PREFIX + its 5-digit index.
CANARY_ID_PREFIX = 'canary-'
#: With adaptive clipping a canary's norm is this multiple of the initial clip: above any clip the
#: run reaches, so the clip brings the canary to (its direction) * (the round's clip).
ADAPTIVE_CANARY_NORM_FACTOR = 1e6


def run_canaries(client_ids: Sequence[str], num_canaries: int, seed: int, plan: plan_lib.RunPlan
                 ) -> Tuple[List[str], Optional[canaries_lib.Canaries]]:
  """(the ids of the run's `num_canaries` canary clients, appended to the population `client_ids`;
  its canaries, seeded by `seed`, or None without canaries).

  Raises:
    ValueError: a client of `client_ids` bears a canary id (naming `canary_clients`).
  """
  ids = [f'{CANARY_ID_PREFIX}{i:05d}' for i in range(num_canaries)]
  clashes = set(ids) & set(client_ids)
  if clashes:
    raise ValueError(f'`canary_clients`: the data has a client named {sorted(clashes)[0]!r}, a '
                     'canary id; rename it or run without canaries.')
  if not num_canaries:
    return ids, None
  norm = plan.clip_norm * (1.0 if plan.adaptive_clip is None else ADAPTIVE_CANARY_NORM_FACTOR)
  return ids, canaries_lib.Canaries(num_canaries, seed=seed, norm=norm)


class CanaryRecorder:
  """The canary clients of a run in its rounds, and their files in the run directory."""

  def __init__(self, canaries: canaries_lib.Canaries, canary_ids: Sequence[str],
               output_dir: str, num_params: int, plan: plan_lib.RunPlan, run_id: str):
    """Args: the run's `canaries` and their client ids; the run directory; the model's
    `num_params` trainable parameters; the run's `plan` and identity `run_id`."""
    self.canaries, self.plan = canaries, plan
    self.rounds_recorded = 0  # by this process: rounds it trained
    self.index = {client: i for i, client in enumerate(canary_ids)}
    self.files = auditing.CanaryFilesWriter(output_dir, canaries.num_canaries, canaries.seed,
                                            list(self.index), num_params, plan=plan,
                                            run_id=run_id)

  def start_files(self, fresh: bool, rebuild: Sequence[str]) -> None:
    """Writes canaries.json (and canaries.csv's header) at a run's start (`fresh`), or rebuilds
    canaries.json from the run's settings when a resume found it missing or altered (its name in
    `rebuild`, `RunStart.rebuild`)."""
    if fresh or auditing.CANARY_FILE in rebuild:
      if not fresh:
        logging.warning('%s is missing or altered: rebuilt from the run\'s settings.',
                        self.files.path)
      self.files.write_metadata()

  def record_round(self, round_num: int, measurements) -> None:
    """Appends the round's canary projections in units of the round's clip on the SUM: the
    aggregator measures them on the mean, the sum over the fixed `clients_per_round`."""
    clip = float(measurements.get('clip', self.plan.clip_norm))
    projections = np.asarray(measurements[canaries_lib.PROJECTIONS_MEASUREMENT], np.float64)
    self.files.append_round(round_num, projections * self.plan.clients_per_round / clip)
    self.rounds_recorded += 1

  def record_final(self, initial_weights: Sequence, final_weights: Sequence) -> None:
    """Records the cosines of the final model delta (the trainable weights `initial_weights` minus
    `final_weights`, e.g. `process.get_model_weights(state).trainable` of the initial and the final
    state) with the canary directions, once this recorder recorded rounds or when a finished run's
    `canaries.json` lacks them."""
    if not self.rounds_recorded and auditing.read_canaries(self.files.path).final_cosines is not None:
      return
    delta = [np.asarray(initial) - np.asarray(final)
             for initial, final in zip(initial_weights, final_weights, strict=True)]
    projections = canaries_lib.projections(self.canaries, delta).numpy().astype(np.float64)
    norm = float(np.sqrt(sum(np.sum(np.square(np.asarray(d, np.float64))) for d in delta)))
    self.files.write_final(projections / norm if norm > 0 else projections)
