"""Empirical privacy of a run: one row per threat model, each with every certified lower bound.

A row holds, for the seen and unseen canary scores of one threat model (`statistics`): the one-shot
ESTIMATE (`estimates.estimate_epsilon`, no confidence), the certified lower BOUNDS of `METHODS`
(`threshold_bounds`, `one_run`, `one_run_fdp`), and what the attack measures (TPR at the FPRs of
`ATTACK_FPRS`, AUROC; `attack_metrics`). The bounds of all the rows of a run hold TOGETHER with
probability >= `confidence`: each is computed at 1 - (1 - confidence) / K, K the number of bounds
of the run (Bonferroni), so the largest of them (`best_bound`) is itself a lower bound at
`confidence` and a report can warn when any exceeds the accounted epsilon with a false-alarm rate of
at most 1 - confidence.

The per-round threat model: the 'all_iterates_whitened' row (for independent noise the
'all_iterates' one, whose per-round scores are already white) scores each canary by the
likelihood-ratio statistic of its per-round whitened projections (`statistics.whitened_rounds`
combined by `per_round`), the most powerful test of a linear Gaussian mechanism; it is the row
expected to certify the most.
"""

import dataclasses
from typing import Optional, Tuple

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.auditing import attack_metrics, estimates, per_round, records, statistics
from dp_ftrl_tff.auditing import bound as bound_lib

#: The certified lower bounds of every row, in report order (`per_round.BOUNDS` names them).
METHODS = ('clopper_pearson', 'one_run', 'one_run_fdp', 'gdp_fit')
#: The false positive rates at which a row measures the attack's true positive rate.
ATTACK_FPRS = (0.001, 0.01, 0.1)


@dataclasses.dataclass(frozen=True)
class EmpiricalRow:
  """The empirical privacy of one threat model.

  Attributes:
    threat_model: one of `statistics.THREAT_MODELS`.
    epsilon: the one-shot estimate (`estimates.estimate_epsilon`) at `delta`: no confidence.
    epsilon_lower_bound: the largest of `bounds`: with the other rows' bounds, it holds with
      probability >= `confidence` (0 when nothing is certified).
    lower_bound_method: the method of `epsilon_lower_bound` (one of `METHODS`).
    confidence: the confidence with which every bound of the run holds at once.
    bounds: one `bound.EpsilonBound` per method of `METHODS`, each at its own (Bonferroni)
      confidence, with its threshold choice and assumption.
    tpr_at_fpr: ((fpr, tpr), ...) of the threshold attack at `ATTACK_FPRS` (a measurement).
    auroc: the attack's area under the ROC curve (a measurement).
    canaries_seen: seen canaries scored (those that took part at least once).
    canaries_unseen: unseen canaries scored.
    delta: the target delta.
  """
  threat_model: str
  epsilon: float
  epsilon_lower_bound: float
  lower_bound_method: str
  confidence: float
  bounds: Tuple[bound_lib.EpsilonBound, ...]
  tpr_at_fpr: Tuple[Tuple[float, float], ...]
  auroc: float
  canaries_seen: int
  canaries_unseen: int
  delta: float

  def bound_of(self, method: str) -> bound_lib.EpsilonBound:
    """The bound of `method` (one of `METHODS`)."""
    _validation.check_one_of(method, 'method', METHODS)
    return next(b for b in self.bounds if b.method == method)

  def to_dict(self) -> dict:
    out = dataclasses.asdict(self)
    out['bounds'] = [b.to_dict() for b in self.bounds]
    out['tpr_at_fpr'] = [{'fpr': fpr, 'tpr': tpr} for fpr, tpr in self.tpr_at_fpr]
    return out


def bound_confidence(confidence: float, num_rows: int) -> float:
  """The confidence of each bound when the `len(METHODS)` bounds of `num_rows` rows must hold
  together with probability >= `confidence` (Bonferroni)."""
  confidence = bound_lib.check_confidence(confidence)
  num_rows = _validation.check_positive_int(num_rows, 'num_rows')
  return 1.0 - (1.0 - confidence) / (num_rows * len(METHODS))


def empirical_row(threat_model: str, seen, unseen, delta: float, confidence: float,
                  num_rows: int = 1) -> EmpiricalRow:
  """The row of one threat model's scores (higher means seen).

  Args:
    threat_model: one of `statistics.THREAT_MODELS`.
    seen: 1-D scores of the seen canaries (at least 2, finite).
    unseen: 1-D scores of the unseen canaries (at least 2, finite).
    delta: in (0, 1).
    confidence: with which the bounds of all `num_rows` rows of the run hold together, in (0, 1).
    num_rows: the rows of the run (each bound is at `bound_confidence(confidence, num_rows)`).
  """
  threat_model = _validation.check_one_of(threat_model, 'threat_model', statistics.THREAT_MODELS)
  seen = bound_lib.check_scores(seen, 'seen')
  unseen = bound_lib.check_scores(unseen, 'unseen')
  delta = bound_lib.check_delta(delta)
  each = bound_confidence(confidence, num_rows)
  bounds = tuple(per_round.BOUNDS[method](seen, unseen, delta, each) for method in METHODS)
  best = max(bounds, key=lambda b: b.epsilon)  # the first method of METHODS among ties
  tprs = attack_metrics.tpr_at_fpr(seen, unseen, np.asarray(ATTACK_FPRS))
  return EmpiricalRow(
      threat_model=threat_model, epsilon=estimates.estimate_epsilon(seen, unseen, delta),
      epsilon_lower_bound=best.epsilon, lower_bound_method=best.method, confidence=confidence,
      bounds=bounds,
      tpr_at_fpr=tuple((fpr, float(tpr)) for fpr, tpr in zip(ATTACK_FPRS, tprs, strict=True)),
      auroc=attack_metrics.attack_auroc(seen, unseen), canaries_seen=int(seen.size),
      canaries_unseen=int(unseen.size), delta=delta)


def best_bound(rows) -> Optional[Tuple[EmpiricalRow, bound_lib.EpsilonBound]]:
  """(row, bound) of the largest certified bound of `rows` (a lower bound at the rows'
  `confidence`), the later row among ties (the per-round one comes last); None without rows."""
  rows = tuple(rows)
  if any(not isinstance(row, EmpiricalRow) for row in rows):
    raise ValueError(f'`rows` must hold EmpiricalRow values, got {rows!r}.')
  if not rows:
    return None
  row = max(reversed(rows), key=lambda r: r.epsilon_lower_bound)
  return row, row.bound_of(row.lower_bound_method)


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
                      delta: float, confidence: float = 0.95,
                      min_seen: int = 2) -> Tuple[EmpiricalRow, ...]:
  """The empirical privacy rows of a run, in `statistics.THREAT_MODELS` order.

  Rows: 'final_model' (when the record holds final cosines), 'all_iterates', and
  'all_iterates_whitened' for correlated strategies (`plan.strategy.correlated`; the whitening uses
  `statistics.plan_noise_matrix`). A threat model with fewer than `min_seen` seen or 2 unseen
  scores is left out (and not counted in the Bonferroni share of the bounds), and a record without
  rounds gives no row.

  Args:
    plan: the run's `RunPlan`.
    record: the run's `CanaryRecord`.
    participation: (N, rounds) 0/1 array of the seen canaries' rounds (`canary_participation`).
    delta: in (0, 1).
    confidence: with which all the rows' lower bounds hold together, in (0, 1).
    min_seen: the fewest seen scores of a row, >= 2.
  """
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a RunPlan, got {plan!r}.')
  if not isinstance(record, records.CanaryRecord):
    raise ValueError(f'`record` must be a CanaryRecord, got {record!r}.')
  delta = bound_lib.check_delta(delta)
  confidence = bound_lib.check_confidence(confidence)
  min_seen = _validation.check_positive_int(min_seen, 'min_seen')
  if min_seen < 2:
    raise ValueError(f'`min_seen` must be at least 2, got {min_seen}.')
  if not record.num_rounds:
    return ()  # nothing was released, no canary took part
  noise_matrix = statistics.plan_noise_matrix(plan, record.num_rounds)
  scores = statistics.canary_statistics(record.round_projections, participation,
                                        record.final_cosines, noise_matrix)
  kept = {threat_model: pair for threat_model, pair in scores.items()
          if pair[0].size >= min_seen and pair[1].size >= 2}
  return tuple(empirical_row(threat_model, seen, unseen, delta, confidence, len(kept))
               for threat_model, (seen, unseen) in kept.items())
