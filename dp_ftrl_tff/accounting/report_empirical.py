"""The empirical section of a privacy report: the run's canaries beside the accounted epsilon.

With the run's canaries (`auditing.CanaryRecord`) and its participation log, `empirical_section`
gives one `auditing.EmpiricalRow` per threat model (a one-shot epsilon ESTIMATE and a lower BOUND
with confidence, at the headline's delta) and compares them with the headline epsilon: a lower bound
above it is a warning (do not launch), an estimate above it with the bound below is a note, and so
are too few canaries. `CanaryMismatchError` refuses a record that cannot be of the run.
"""

from typing import List, Tuple

import numpy as np

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
from dp_ftrl_tff.accounting import report_parts, zcdp

#: Below this many seen canaries a row's estimate has a sampling error of tens of percent or more
#: (docs/auditing.md): the report says so beside the rows.
FEW_CANARIES = 100


class CanaryMismatchError(ValueError):
  """A canary record that cannot be of the run the report is of (e.g. more rounds than the run).

  Attributes:
    reason: the mismatch in words, without the parameter's name (a CLI adds its flag and path).
  """

  def __init__(self, reason: str):
    super().__init__(f'`canaries`: {reason}')
    self.reason = reason


def _check_canaries_of_run(plan: plan_lib.RunPlan, record: auditing.CanaryRecord,
                           log: log_lib.ParticipationLog, num_rounds: int,
                           canary_ids: np.ndarray) -> None:
  """Raises `CanaryMismatchError` when `record` cannot be the canaries of the run of `plan` and
  `log` (`canary_ids`: the log's rows of the canaries, per row)."""
  if len(set(record.client_ids)) != record.num_seen:
    raise CanaryMismatchError('it lists a canary id twice: canary ids must be distinct.')
  if record.plan_sha256 is not None and record.plan_sha256 != auditing.plan_digest(plan):
    raise CanaryMismatchError(
        'it was written for another plan (its "plan_sha256" is not the digest of this plan\'s '
        'mechanism, noise, clip, cohorts and population): it is of another run.')
  population = plan.population
  if population is not None:
    if record.population is not None and record.population != population:
      raise CanaryMismatchError(
          f'it was written for a population of {record.population} clients, the plan has '
          f'{population}: it is of another run.')
    # The canaries are clients of the population, and so is every client of the log.
    clients = log.num_clients + record.num_seen - len(set(canary_ids.tolist()))
    if clients > population:
      raise CanaryMismatchError(
          f'its {record.num_seen} canaries and the participation log\'s {log.num_clients} clients '
          f'make {clients} distinct clients, more than the plan\'s population of {population}: '
          'it is of another run.')
  if record.num_rounds != num_rounds:
    raise CanaryMismatchError(
        f'the canary record holds {record.num_rounds} rounds, the run {num_rounds} (its plan and '
        'participation log): it is truncated or of another run.')


def _empirical_rows(plan: plan_lib.RunPlan, record: auditing.CanaryRecord,
                    log: log_lib.ParticipationLog, num_rounds: int, delta: float,
                    confidence: float) -> Tuple[auditing.EmpiricalRow, ...]:
  """`auditing.empirical_privacy` of the run's canaries (their rounds read from `log`), without the
  rows of fewer than `auditing.MIN_SEEN_CANARIES` seen canaries."""
  ids, rounds = log.rows_of(record.client_ids)
  _check_canaries_of_run(plan, record, log, num_rounds, ids)
  participation = auditing.canary_participation(record, ids, rounds)
  rows = auditing.empirical_privacy(plan, record, participation, delta, confidence)
  return tuple(row for row in rows if row.canaries_seen >= auditing.MIN_SEEN_CANARIES)


def confidence_text(confidence: float) -> str:
  """A confidence in (0, 1) as a percentage: 0.95 -> '95%', 0.999 -> '99.9%'."""
  return f'{100 * confidence:g}%'


def _empirical_findings(rows: Tuple[auditing.EmpiricalRow, ...], epsilon: float,
                        record: auditing.CanaryRecord) -> List[report_parts.Finding]:
  """The findings comparing the empirical rows with the accounted (headline) `epsilon`."""
  findings = []
  if not rows:
    findings.append(report_parts.note(
        'empirical', f'no empirical privacy: of the {record.num_seen} canaries, fewer than '
        f'{auditing.MIN_SEEN_CANARIES} took part in the {record.num_rounds} recorded rounds (per '
        f'the participation log); an estimate needs at least {auditing.MIN_SEEN_CANARIES} seen '
        'canaries (with fewer it is typically off by 2x or more: docs/auditing.md), so give the '
        f'run enough canary clients that {auditing.MIN_SEEN_CANARIES} of them are sampled.'))
  few = [row for row in rows if row.canaries_seen < FEW_CANARIES]
  if few:
    findings.append(report_parts.note(
        'empirical', f'only a few canaries took part ({few[0].canaries_seen} seen in '
        f'{few[0].threat_model}): with fewer than {FEW_CANARIES} the estimates can be far off '
        '(tens of percent or more) and the lower bounds are weak; thousands make a check.'))
  for row in rows:
    if row.epsilon_lower_bound > epsilon:
      findings.append(report_parts.warning(
          'empirical', f'the measured lower bound on epsilon ({row.threat_model}: '
          f'{row.epsilon_lower_bound:.4g} at {confidence_text(row.confidence)} confidence, '
          f'{row.canaries_seen} seen / {row.canaries_unseen} unseen canaries) exceeds the '
          f'accounted epsilon {epsilon:.4g}: the noise added is less than the accountant assumes, '
          'or the accounting is wrong. Do not launch.'))
    elif row.epsilon > epsilon:
      findings.append(report_parts.note(
          'empirical', f'the one-shot empirical estimate ({row.threat_model}: {row.epsilon:.4g}) '
          f'exceeds the accounted epsilon {epsilon:.4g}, but its lower bound '
          f'({row.epsilon_lower_bound:.4g} at {confidence_text(row.confidence)} confidence) does '
          'not: an estimate, not a proof; more canaries would tell.'))
  return findings

def empirical_section(plan: plan_lib.RunPlan, record: auditing.CanaryRecord,
                      log: log_lib.ParticipationLog, num_rounds: int, headline: zcdp.Guarantee,
                      confidence: float
                      ) -> Tuple[Tuple[auditing.EmpiricalRow, ...], List[report_parts.Finding]]:
  """(the empirical rows at the headline's delta, their findings beside the headline epsilon)."""
  rows = _empirical_rows(plan, record, log, num_rounds, headline.delta, confidence)
  return rows, _empirical_findings(rows, headline.epsilon, record)
