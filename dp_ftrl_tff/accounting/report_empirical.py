"""The empirical section of a privacy report: the run's canaries beside the accounted epsilon.

With the run's canaries (`auditing.CanaryRecord`) and its participation log, `empirical_section`
gives one `auditing.EmpiricalRow` per threat model (a one-shot epsilon ESTIMATE, every certified
lower BOUND of `auditing.METHODS` with its confidence, the attack's TPR at FPR and AUROC, at the
headline's delta; all bounds of the run hold together at the report's confidence) and compares them
with the headline epsilon: a certified bound above it is a warning (do not launch: the accountant or
the mechanism is wrong; at most 1 - confidence of correct runs see it), an estimate above it with
every bound below is a note, and so are too few canaries. `best_text` states the largest certified
bound and its method. `CanaryMismatchError` refuses a record that cannot be of the run.

A Gaussian-DP bound (one-run f-DP, GDP fit) certifies that the mechanism is not mu-GDP for some mu;
the headline is the epsilon of one Gaussian mechanism (mu = sqrt(2 rho)-GDP), so such a bound above
the headline contradicts the accountant's model whatever the mechanism's true trade-off curve.
"""

from typing import List, Optional, Tuple

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
  rows of fewer than `auditing.MIN_SEEN_CANARIES` seen canaries (which then take no share of the
  confidence)."""
  ids, rounds = log.rows_of(record.client_ids)
  _check_canaries_of_run(plan, record, log, num_rounds, ids)
  participation = auditing.canary_participation(record, ids, rounds)
  return auditing.empirical_privacy(plan, record, participation, delta, confidence,
                                    min_seen=auditing.MIN_SEEN_CANARIES)


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
      others = [f'{METHOD_TEXT[b.method]} {b.epsilon:.4g}' for b in row.bounds
                if b.epsilon > epsilon and b.method != row.lower_bound_method]
      also = f'; also above it: {", ".join(others)}' if others else ''
      findings.append(report_parts.warning(
          'empirical', f'a certified lower bound on epsilon exceeds the accounted epsilon '
          f'{epsilon:.4g} ({row.threat_model}: {row.epsilon_lower_bound:.4g} by '
          f'{METHOD_TEXT[row.lower_bound_method]}{also}; all the '
          f"report's bounds hold together at {confidence_text(row.confidence)} confidence, "
          f'{row.canaries_seen} seen / {row.canaries_unseen} unseen canaries): the accountant or '
          'the mechanism is wrong (less noise is added than the accountant assumes, or the '
          'accounting is wrong). Do not launch.'))
    elif row.epsilon > epsilon:
      findings.append(report_parts.note(
          'empirical', f'the one-shot empirical estimate ({row.threat_model}: {row.epsilon:.4g}) '
          f'exceeds the accounted epsilon {epsilon:.4g}, but no certified lower bound does (the '
          f'largest: {row.epsilon_lower_bound:.4g} by {METHOD_TEXT[row.lower_bound_method]} at '
          f'{confidence_text(row.confidence)} confidence): an estimate, not a proof; more '
          'canaries would tell.'))
  return findings


#: Each certified method in words (report.md, the console, the findings).
METHOD_TEXT = {
    'clopper_pearson': 'Clopper-Pearson',
    'one_run': 'one-run',
    'one_run_fdp': 'one-run f-DP',
    'gdp_fit': 'GDP fit',
}


def best_bound_dict(rows: Tuple[auditing.EmpiricalRow, ...], epsilon: float) -> Optional[dict]:
  """report.json's 'empirical_best_bound': the largest certified bound of `rows` (its
  `EpsilonBound` fields), its threat model, the confidence with which all bounds hold together and
  its fraction of the accounted `epsilon`; None without rows."""
  best = auditing.best_bound(rows)
  if best is None:
    return None
  row, bound = best
  return {**bound.to_dict(), 'threat_model': row.threat_model,
          'confidence_together': row.confidence, 'accounted_epsilon': epsilon,
          'fraction_of_accounted': bound.epsilon / epsilon}


def best_text(rows: Tuple[auditing.EmpiricalRow, ...], epsilon: float) -> str:
  """One sentence: the largest certified bound of `rows`, its method and threat model, its
  confidence and its fraction of the accounted `epsilon` ('' without rows)."""
  best = auditing.best_bound(rows)
  if best is None:
    return ''
  row, bound = best
  if bound.epsilon == 0:
    return (f'Best certified lower bound: none (no method certifies epsilon > 0 at '
            f'{confidence_text(row.confidence)} confidence)')
  return (f'Best certified lower bound: {bound.epsilon:.4g} ({METHOD_TEXT[bound.method]}, '
          f'{row.threat_model}) at {confidence_text(row.confidence)} confidence, '
          f'{bound.epsilon / epsilon:.2f} of the accounted epsilon {epsilon:.4g}')


def empirical_section(plan: plan_lib.RunPlan, record: auditing.CanaryRecord,
                      log: log_lib.ParticipationLog, num_rounds: int, headline: zcdp.Guarantee,
                      confidence: float
                      ) -> Tuple[Tuple[auditing.EmpiricalRow, ...], List[report_parts.Finding]]:
  """(the empirical rows at the headline's delta, their findings beside the headline epsilon)."""
  rows = _empirical_rows(plan, record, log, num_rounds, headline.delta, confidence)
  return rows, _empirical_findings(rows, headline.epsilon, record)
