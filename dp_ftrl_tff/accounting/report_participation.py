"""The participation section of a privacy report: the headline's setting and what the log shows.

`headline_setting` gives the rounds and the participation schema the headline is computed for: the
plan's declared ones, or with a participation log the REALIZED participation (realized min_sep and
max participations, as the Gboard paper's tables are), which holds whatever was declared.
`participation_section` adds what the log shows (`ObservedParticipation`: its breaches of the
declared schema are warnings; for trees, the exact guarantee over the observed clients' actual
patterns) and the guarantee under the declared schema. `check_log_of_plan` refuses a log that
cannot be the plan's.

Conventions: rounds 0-based; `min_sep` = b (r2 - r1 >= b) and `min_separation` = b - 1 (TF-Privacy,
Gboard tables; `ParticipationSchema.tf_privacy_min_separation`); sensitivities use clip norm 1.
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import report_parts, zcdp, zcdp_epsilon
from dp_ftrl_tff.mechanisms import participation as participation_lib


@dataclasses.dataclass(frozen=True)
class ObservedParticipation:
  """What a participation log shows.

  Attributes:
    path: the log file.
    num_rows, num_clients, num_rounds: rows, distinct clients, last logged round + 1.
    min_sep: realized b, or None when no client participated twice (yet): then the headline's
      schema is single participation, written min_sep = n, which is no separation realized.
    max_participations: realized k.
    participated_twice: whether some client participated in two rounds or more (False: "no client
      participated twice yet", `min_sep` is None).
    histogram: {participations: clients}.
    violations: breaches of the declared schema (empty: compliant or nothing declared).
    tree_patterns: trees only: {'sensitivity_squared', 'rho', 'epsilon', 'conversion',
      'worst_client'} over the observed clients' actual patterns ('conversion' 'zcdp_bound': epsilon
      is the zCDP bound, an upper bound), or None.
  """
  path: str
  num_rows: int
  num_clients: int
  num_rounds: int
  min_sep: Optional[int]
  max_participations: int
  histogram: dict
  violations: tuple
  tree_patterns: Optional[dict] = None
  participated_twice: bool = True




class LogMismatchError(ValueError):
  """A participation log that cannot be the log of the plan the report is of: it would state the
  guarantee of fewer participations than the run had (an understated epsilon).

  Attributes:
    reason: the mismatch in words, without the parameter's name (a CLI adds its flag and path).
  """

  def __init__(self, reason: str):
    super().__init__(f'`log`: {reason}')
    self.reason = reason


def check_log_of_plan(plan: plan_lib.RunPlan, log: log_lib.ParticipationLog, *,
                      complete: bool, trained_rounds: Optional[int] = None) -> None:
  """Raises `LogMismatchError` when `log` cannot be the participation log of `plan`.

  A min-sep plan (no random sampling, a `clients_per_round`) draws exactly `clients_per_round`
  clients in every round (`learning.client_sampler`), so each of the rounds the log covers must
  hold at least that many rows (Poisson and cyclic Poisson cohorts are random: no such check).
  The log covers rounds 0 .. R-1, R its last round + 1, or `trained_rounds` when the run's own
  records give it: a round whose random cohort was empty writes no row, so a run's last rounds may
  leave no trace in its log. With `complete` (a finished run's report, its rounds not given
  explicitly), the log must cover the plan's every round: rows of later rounds that are missing
  would lower epsilon.
  """
  covered = log.num_rounds
  if trained_rounds is not None:
    if log.num_rounds > trained_rounds:
      raise LogMismatchError(
          f'it holds rows of round {log.num_rounds - 1}, but the run trained {trained_rounds} '
          f'rounds (0 .. {trained_rounds - 1}): it is of another run.')
    covered = trained_rounds
  if not plan.sampling.random_cohorts and plan.clients_per_round is not None:
    counts = np.zeros(covered, np.int64)
    counts[:log.num_rounds] = log.round_counts
    short = np.flatnonzero(counts < plan.clients_per_round)
    if short.size:
      r = int(short[0])
      raise LogMismatchError(
          f'round {r} has {int(counts[r])} rows, but the plan\'s min-sep sampler draws '
          f'exactly {plan.clients_per_round:g} clients every round ({short.size} of the '
          f'{covered} rounds it covers are short): rows are missing, so it would understate '
          'epsilon. Use the run\'s whole participation log.')
  if complete and plan.num_rounds is not None and covered < plan.num_rounds:
    empty = (' (with random cohorts, a last round that drew nobody writes no row: then give the '
             'rounds the run trained)' if plan.sampling.random_cohorts else '')
    raise LogMismatchError(
        f'it ends at round {covered - 1}, but the plan has {plan.num_rounds} rounds: the '
        'rows of the later rounds are missing, so it would understate epsilon. Use the run\'s '
        'whole participation log, or give the number of rounds the log covers explicitly (the '
        f'report of the first rounds){empty}.')


def headline_setting(plan: plan_lib.RunPlan, log: Optional[log_lib.ParticipationLog]) -> tuple:
  """(n, the headline schema, 'declared' or 'observed', `ObservedParticipation` or None).

  With a log, n covers the plan's rounds and the logged ones, and the schema is the realized one.
  """
  if log is None:
    return plan.num_rounds, plan.participation, 'declared', None
  declared_rounds = log.num_rounds if plan.num_rounds is None else plan.num_rounds
  declared = plan.participation or participation_lib.ParticipationSchema()
  violations = tuple(log.violations(declared, declared_rounds))
  num_rounds = max(declared_rounds, log.num_rounds)
  observed = ObservedParticipation(
      path=log.path, num_rows=log.num_rows, num_clients=log.num_clients,
      num_rounds=log.num_rounds, min_sep=log.min_sep, max_participations=log.max_participations,
      histogram=log.participation_histogram(), violations=violations,
      participated_twice=log.max_participations > 1)
  return num_rounds, log.realized_schema(num_rounds), 'observed', observed


def check_rounds(plan: plan_lib.RunPlan, num_rounds: int) -> None:
  """Every segment of `num_rounds` rounds must fit the strategy (a banded strategy restarted past
  its n rounds covers a longer run)."""
  for length in plan.segment_lengths(num_rounds):
    plan.strategy.check_num_rounds(length)


def _tree_patterns(plan: plan_lib.RunPlan, log: log_lib.ParticipationLog, num_rounds: int,
                   headline: zcdp.Guarantee) -> Optional[dict]:
  """The exact guarantee over the observed clients' actual patterns (strategies with a
  per-pattern method: the trees), or None."""
  worst = _worst_observed_pattern(plan, log, plan.segment_lengths(num_rounds))
  if worst is None:
    return None
  sens_sq, client = worst
  rho = zcdp.rho_from_sensitivity(sens_sq, headline.noise_multiplier)
  # 'conversion': 'zcdp_bound' when rho is above what the PLD holds (epsilon an upper bound).
  return {'sensitivity_squared': sens_sq, 'rho': rho,
          'epsilon': zcdp_epsilon.epsilon_from_rho(rho, headline.delta),
          'conversion': zcdp_epsilon.accounted_conversion(rho),
          'worst_client': log.client_id(client)}


def _worst_observed_pattern(plan: plan_lib.RunPlan, log: log_lib.ParticipationLog,
                            segment_lengths: Sequence[int]) -> Optional[Tuple[float, int]]:
  """(largest squared sensitivity, a client code with it) over the log's observed patterns, or
  None when the strategy has no per-pattern method. Reads the distinct patterns batch by batch
  (`ParticipationLog.iter_patterns`), so memory stays bounded by one batch."""
  worst = None
  for clients, pattern_index, rounds in log.iter_patterns():
    found = plan.strategy.clients_sensitivity_squared(pattern_index, rounds, segment_lengths)
    if found is None:
      return None
    ids, sens = found
    i = int(np.argmax(sens))
    if worst is None or sens[i] > worst[0]:
      worst = (float(sens[i]), int(clients[ids[i]]))
  return worst


def participation_section(plan: plan_lib.RunPlan, log: Optional[log_lib.ParticipationLog],
                          observed: Optional[ObservedParticipation], num_rounds: int,
                          headline: zcdp.Guarantee, observed_patterns: bool
                          ) -> Tuple[Optional[zcdp.Guarantee], Optional[ObservedParticipation],
                                     List[report_parts.Finding]]:
  """(the guarantee under the declared schema when a log was also given, `observed` with the tree
  patterns when asked for, the log's breaches of the declared schema as warnings)."""
  declared = None
  if log is not None and plan.participation is not None:
    declared_rounds = plan.num_rounds or num_rounds
    check_rounds(plan, declared_rounds)
    declared = zcdp.guarantee_for_plan(plan, declared_rounds)
  if observed is None:
    return declared, None, []
  if observed_patterns:
    observed = dataclasses.replace(observed,
                                   tree_patterns=_tree_patterns(plan, log, num_rounds, headline))
  findings = [report_parts.warning('participation',
                                   f'participation log violates the declared schema: {v}')
              for v in observed.violations]
  return declared, observed, findings
