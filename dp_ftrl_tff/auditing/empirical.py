"""Empirical privacy of a run: one row (estimate and lower bound) per threat model."""

import dataclasses
from typing import Tuple

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.auditing import estimates, records, statistics


@dataclasses.dataclass(frozen=True)
class EmpiricalRow:
  """The empirical privacy of one threat model.

  Attributes:
    threat_model: one of `statistics.THREAT_MODELS`.
    epsilon: the one-shot estimate (`estimates.estimate_epsilon`) at `delta`.
    epsilon_lower_bound: the bound holding with probability >= `confidence`
      (`estimates.epsilon_lower_bound`).
    confidence: the lower bound's confidence.
    canaries_seen: seen canaries scored (those that took part at least once).
    canaries_unseen: unseen canaries scored.
    delta: the target delta.
  """
  threat_model: str
  epsilon: float
  epsilon_lower_bound: float
  confidence: float
  canaries_seen: int
  canaries_unseen: int
  delta: float

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def canary_participation(record: records.CanaryRecord, client_ids_per_row,
                         rounds_per_row) -> np.ndarray:
  """The (N, rounds) 0/1 participation of the seen canaries from participation-log rows.

  Args:
    record: the run's `CanaryRecord` (its client ids and number of rounds).
    client_ids_per_row: 1-D array of the log rows' client ids (compared as str).
    rounds_per_row: 1-D array of the log rows' 0-based rounds, as long; rows of other clients or of
      rounds >= `record.num_rounds` (not recorded) are ignored.
  """
  if not isinstance(record, records.CanaryRecord):
    raise ValueError(f'`record` must be a CanaryRecord, got {record!r}.')
  ids = np.asarray(client_ids_per_row)
  rounds = np.asarray(rounds_per_row)
  if ids.ndim != 1 or rounds.shape != ids.shape:
    raise ValueError('`client_ids_per_row` and `rounds_per_row` must be 1-D arrays of the same '
                     f'length, got shapes {ids.shape} and {rounds.shape}.')
  if rounds.size and (not np.issubdtype(rounds.dtype, np.integer) or rounds.min() < 0):
    raise ValueError('`rounds_per_row` must hold non-negative integers.')
  index = {client: i for i, client in enumerate(record.client_ids)}
  participation = np.zeros((record.num_seen, record.num_rounds))
  for client, round_num in zip(ids.astype(str).tolist(), rounds.tolist(), strict=True):
    if client in index and round_num < record.num_rounds:
      participation[index[client], round_num] = 1.0
  return participation


def empirical_privacy(plan: plan_lib.RunPlan, record: records.CanaryRecord, participation,
                      delta: float, confidence: float = 0.95) -> Tuple[EmpiricalRow, ...]:
  """The empirical privacy rows of a run, in `statistics.THREAT_MODELS` order.

  Rows: 'final_model' (when the record holds final cosines), 'all_iterates', and
  'all_iterates_whitened' for correlated strategies (`plan.strategy.correlated`; the whitening uses
  `statistics.plan_noise_matrix`). A threat model with fewer than 2 seen or unseen scores is left
  out, and a record without rounds gives no row.

  Args:
    plan: the run's `RunPlan`.
    record: the run's `CanaryRecord`.
    participation: (N, rounds) 0/1 array of the seen canaries' rounds (`canary_participation`).
    delta: in (0, 1).
    confidence: of the lower bounds, in (0, 1).
  """
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a RunPlan, got {plan!r}.')
  if not isinstance(record, records.CanaryRecord):
    raise ValueError(f'`record` must be a CanaryRecord, got {record!r}.')
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                           high_inclusive=False)
  confidence = _validation.check_float_in_range(confidence, 'confidence', 0.0, 1.0,
                                                low_inclusive=False, high_inclusive=False)
  if not record.num_rounds:
    return ()  # nothing was released, no canary took part
  noise_matrix = statistics.plan_noise_matrix(plan, record.num_rounds)
  scores = statistics.canary_statistics(record.round_projections, participation,
                                        record.final_cosines, noise_matrix)
  rows = []
  for threat_model, (seen, unseen) in scores.items():
    if seen.size < 2 or unseen.size < 2:
      continue
    rows.append(EmpiricalRow(
        threat_model=threat_model, epsilon=estimates.estimate_epsilon(seen, unseen, delta),
        epsilon_lower_bound=estimates.epsilon_lower_bound(seen, unseen, delta, confidence),
        confidence=confidence, canaries_seen=int(seen.size), canaries_unseen=int(unseen.size),
        delta=delta))
  return tuple(rows)
