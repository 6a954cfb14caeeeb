"""The privacy report of a run plan: its data (`PrivacyReport`) and computation (`build_report`).

`build_report(plan, log)` turns a `dp_ftrl_tff.plan.RunPlan` (the mechanism and where it came from,
the noise multiplier and what it was calibrated to, the restarts, adaptive clipping, SecAgg, the
sampling, the rounds, the declared participation and the target delta) and optionally the run's
participation log into a `PrivacyReport`:
  * the headline guarantee: rho-zCDP and (epsilon, delta) by PLD (see `zcdp`). With a participation
    log it is computed for the REALIZED participation (realized min_sep and max participations, as the
    Gboard paper's tables are), which holds whatever was declared; a log that breaks the declared
    schema is reported loudly in `warnings`;
  * for trees with a log, also the exact guarantee over the observed clients' actual patterns (the
    tree module's per-client sum of squared node counts);
  * optionally, every mechanism's noise multiplier and losses at the headline's privacy
    (`equal_privacy`); the strategy file the mechanism came from with its SHA-256 and the setting
    it was made for;
  * with the plan's random sampling (Poisson, or cyclic Poisson with b-hat groups: BandMF paper
    Thm. 4, docs/papers.md#bandmf), also the amplified guarantee (`amplification`) next to the
    unamplified headline, which holds whatever the sampling;
  * what the plan states about the run (`RunFacts`): the noise seed (a fixed one is a warning: a
    testing-only run, no guarantee), the clip (fixed, or adaptive with its target quantile and, when
    given, its final value), the sampler, clients per round, population and sampling probability;
    and, with a log in which no client participated twice yet, that fact rather than a min_sep;
  * with the run's canaries (`auditing.CanaryRecord`) and its log, the empirical privacy: one
    `auditing.EmpiricalRow` per threat model (a one-shot epsilon ESTIMATE and a lower BOUND with
    confidence, at the headline's delta), compared with the headline epsilon: a lower bound above it
    is a warning (do not launch), an estimate above it with the bound below is a note.
The drivers' end-of-run report and `python -m experiments.privacy_report --plan=...` both call it, so
they agree. Rendering (JSON, terminal summary, the BLT paper's App. C markdown checklist, plots)
lives in `report_render`.

Conventions: rounds 0-based; `min_sep` = b (r2 - r1 >= b) and `min_separation` = b - 1 (TF-Privacy,
Gboard tables; `ParticipationSchema.tf_privacy_min_separation`); noise multipliers are relative to
the clip norm; sensitivities use clip norm 1.
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import _validation, auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import amplification, zcdp
from dp_ftrl_tff.accounting import equal_privacy as equal_privacy_lib
from dp_ftrl_tff.accounting import participation_log as log_lib
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
    tree_patterns: trees only: {'sensitivity_squared', 'rho', 'epsilon', 'worst_client'} over the
      observed clients' actual patterns, or None.
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


#: The warning of a run whose noise seed was fixed (`RunPlan.noise_seed_fixed`).
FIXED_SEED_WARNING = ('the noise seed was fixed (--noise_seed): anyone who knows the seed can '
                      'regenerate and subtract the noise, so this run is for TESTING ONLY and the '
                      'stated guarantee does not hold for it (a guarantee needs secret noise).')


@dataclasses.dataclass(frozen=True)
class RunFacts:
  """What the plan states about the run besides the accounting: the noise seed, the clip and the
  cohorts. None where the plan does not say (a plan for accounting only, or of an earlier release).

  Attributes:
    noise_seed_fixed: True: the noise seed was given (`--noise_seed`), testing only (see
      `FIXED_SEED_WARNING`); False: drawn from OS entropy (secret); None: not recorded.
    clip: 'fixed' or 'adaptive' (None: accounting only, no clip).
    clip_norm: the fixed L2 clip zeta of one client update, or adaptive clipping's initial clip.
    target_unclipped_quantile: adaptive clipping's target quantile gamma of the update norms (in
      [0, 1]), else None.
    final_clip: adaptive clipping's clip in the run's last round (the run's metrics'
      `aggregator/clip`), when `build_report` was given it; else None.
    sampler: 'min_sep' (exactly `clients_per_round` clients, b rounds apart), 'poisson' or
      'cyclic_poisson' (None: a plan for accounting only without random sampling).
    clients_per_round: m, clients per round (random sampling: the expected cohort size), the fixed
      denominator of the mean.
    population: the number of clients the cohorts are drawn from.
    sampling_prob: q, a client's inclusion probability in a round it is eligible for (random
      sampling only; None with the min-sep sampler, which draws no independent coins).
    sampling_groups: b-hat, the groups of cyclic Poisson sampling (1 for Poisson; None for min-sep).
    cohort_fraction: clients_per_round / population, the fraction of the population in a round
      (None without both).
  """
  noise_seed_fixed: Optional[bool] = None
  clip: Optional[str] = None
  clip_norm: Optional[float] = None
  target_unclipped_quantile: Optional[float] = None
  final_clip: Optional[float] = None
  sampler: Optional[str] = None
  clients_per_round: Optional[float] = None
  population: Optional[int] = None
  sampling_prob: Optional[float] = None
  sampling_groups: Optional[int] = None
  cohort_fraction: Optional[float] = None

  @classmethod
  def of_plan(cls, plan: plan_lib.RunPlan, final_clip: Optional[float] = None) -> 'RunFacts':
    """The facts `plan` states, with adaptive clipping's `final_clip` (> 0) when recorded."""
    adaptive = plan.adaptive_clip
    if final_clip is not None:
      if adaptive is None:
        raise ValueError('`final_clip` is for adaptive clipping; the plan has a fixed clip.')
      final_clip = _validation.check_positive_float(final_clip, 'final_clip')
    sampling, m, population = plan.sampling, plan.clients_per_round, plan.population
    sampler = None if plan.accounting_only and not sampling.random_cohorts else sampling.kind
    return cls(
        noise_seed_fixed=plan.noise_seed_fixed,
        clip=None if plan.accounting_only else 'adaptive' if adaptive else 'fixed',
        clip_norm=plan.clip_norm,
        target_unclipped_quantile=None if adaptive is None else adaptive.target_unclipped_quantile,
        final_clip=final_clip, sampler=sampler, clients_per_round=m, population=population,
        sampling_prob=sampling.sampling_prob,
        sampling_groups=sampling.num_groups if sampling.random_cohorts else None,
        cohort_fraction=None if m is None or population is None else m / population)


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
  """A finished privacy report (`report_render` turns it into JSON, markdown and plots).

  Attributes:
    plan: the `RunPlan` the report is of.
    guarantee: the headline `zcdp.Guarantee`.
    mechanism_config: the strategy's `to_config()` (arrays summarized by their shape).
    participation_source: 'declared' or 'observed' (realized from the log).
    sensitivity_exact: False when sens^2 is an upper bound (BLT outside Thm. 3.1, banded with more
      bands than min_sep, restarts of a non-tree strategy).
    declared: the guarantee under the declared schema when a log was also given, else None.
    observed: `ObservedParticipation` or None.
    clipped_count_stddev: adaptive clipping's sigma_b, or None.
    value_noise_multiplier: the inflated z_Delta the model sum must use with adaptive clipping.
    secure_aggregation: with SecAgg, the chain's settings, each segment's clip and post-rounding
      sensitivity clip, and the rounds whose secure sum wrapped (see `build_report`); else None.
    calibration: {'target_rho': ...} or {'target_epsilon': ...} when sigma was calibrated, else None.
    warnings: loud messages (schema violations, upper bounds, large inflation).
    equal_privacy: `equal_privacy.EqualPrivacy` at the headline's rho and participation, or None.
    strategy_file: {'path', 'sha256', 'setting', 'mismatches'} of the strategy file, or None.
    amplified: the `amplification.AmplifiedGuarantee` under the run's random sampling, or None.
    run_facts: the `RunFacts` of the plan: noise seed, clip, sampler, cohorts and population.
    empirical_privacy: with the run's canaries, a tuple of `auditing.EmpiricalRow` (one per threat
      model with enough canaries; empty when none has), at the headline's delta; else None.
    notes: plain remarks that are not warnings (e.g. an empirical estimate above the accounted
      epsilon whose lower bound is not).
  """
  plan: plan_lib.RunPlan
  guarantee: zcdp.Guarantee
  mechanism_config: dict
  participation_source: str
  sensitivity_exact: bool
  declared: Optional[zcdp.Guarantee] = None
  observed: Optional[ObservedParticipation] = None
  clipped_count_stddev: Optional[float] = None
  value_noise_multiplier: Optional[float] = None
  calibration: Optional[dict] = None
  secure_aggregation: Optional[dict] = None
  warnings: tuple = ()
  equal_privacy: Optional[equal_privacy_lib.EqualPrivacy] = None
  strategy_file: Optional[dict] = None
  amplified: Optional[amplification.AmplifiedGuarantee] = None
  run_facts: RunFacts = RunFacts()
  empirical_privacy: Optional[Tuple[auditing.EmpiricalRow, ...]] = None
  notes: tuple = ()

  @property
  def min_sep(self) -> int:
    """The headline schema's b (with a log in which no client participated twice: n, single
    participation; see `no_client_participated_twice`)."""
    return self.guarantee.participation.min_sep

  @property
  def no_client_participated_twice(self) -> bool:
    """True when the log shows no client in two rounds: no separation is realized yet."""
    return self.observed is not None and not self.observed.participated_twice

  @property
  def max_participations(self) -> int:
    """Effective k = min(k, ceil(n / b))."""
    g = self.guarantee
    return g.participation.effective_max_participations(g.num_rounds)


def _json_config(config: dict) -> dict:
  """The strategy config with arrays (e.g. banded `band_rows`) summarized by their shape."""
  return {k: (f'<float64 array of shape {list(np.shape(v))}>' if isinstance(v, np.ndarray) else v)
          for k, v in config.items()}


def _check_inputs(plan: plan_lib.RunPlan, log: Optional[log_lib.ParticipationLog]) -> None:
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a dp_ftrl_tff.plan.RunPlan, got {plan!r}.')
  if plan.noise_multiplier == 0:
    raise ValueError('`noise_multiplier` is 0: the run adds no noise and has no DP guarantee.')
  if log is not None and not isinstance(log, log_lib.ParticipationLog):
    raise ValueError(f'`log` must be a ParticipationLog, got {log!r}.')
  if log is None and (plan.participation is None or plan.num_rounds is None):
    raise ValueError('`participation` (`min_sep`) and `rounds` are required without a '
                     'participation log.')
  if log is not None and log.num_rows == 0:
    raise ValueError('The participation log has no rows.')


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
                      complete: bool) -> None:
  """Raises `LogMismatchError` when `log` cannot be the participation log of `plan`.

  A min-sep plan (no random sampling, a `clients_per_round`) draws exactly `clients_per_round`
  clients in every round (`learning.client_sampler`), so each of the log's rounds 0 .. R-1 must
  hold at least that many rows (Poisson and cyclic Poisson cohorts are random: no such check).
  With `complete` (a finished run's report, its rounds not given explicitly), the log must also
  reach the plan's last round: rows of later rounds that are missing would lower epsilon.
  """
  if not plan.sampling.random_cohorts and plan.clients_per_round is not None:
    short = np.flatnonzero(log.round_counts < plan.clients_per_round)
    if short.size:
      r = int(short[0])
      raise LogMismatchError(
          f'round {r} has {int(log.round_counts[r])} rows, but the plan\'s min-sep sampler draws '
          f'exactly {plan.clients_per_round:g} clients every round ({short.size} of the log\'s '
          f'{log.num_rounds} rounds are short): rows are missing, so it would understate epsilon. '
          'Use the run\'s whole participation log.')
  if complete and plan.num_rounds is not None and log.num_rounds < plan.num_rounds:
    raise LogMismatchError(
        f'it ends at round {log.num_rounds - 1}, but the plan has {plan.num_rounds} rounds: the '
        'rows of the later rounds are missing, so it would understate epsilon. Use the run\'s '
        'whole participation log, or give the number of rounds the log covers explicitly (the '
        'report of the first rounds).')


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


def _check_rounds(plan: plan_lib.RunPlan, num_rounds: int) -> None:
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
  return {'sensitivity_squared': sens_sq, 'rho': rho,
          'epsilon': zcdp.epsilon_from_rho(rho, headline.delta), 'worst_client': log.client_id(client)}


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


def _amplified(plan: plan_lib.RunPlan, headline: zcdp.Guarantee,
               require: bool) -> Tuple[Optional[amplification.AmplifiedGuarantee], List[str]]:
  """(the amplified guarantee under the plan's sampling or None, warnings). A strategy the theorem
  does not cover gets a warning, or with `require` a ValueError."""
  sampling = plan.sampling
  if not sampling.random_cohorts:
    return None, []
  n, restarts = headline.num_rounds, headline.restart_rounds
  try:
    amplification.check_banded(plan.strategy, n, sampling.num_groups, restarts)
  except ValueError as error:
    if require:
      raise
    return None, [f"no amplified guarantee for the plan's {sampling.kind} sampling: {error}"]
  return amplification.amplified_guarantee(
      plan.strategy, n, headline.noise_multiplier, sampling.num_groups,
      sampling.sampling_prob, headline.delta, restart_rounds=restarts), []


#: How the warning of a target delta too small for the PLD accountant begins.
SMALL_DELTA_WARNING_START = 'the target delta'


def zcdp_epsilon_bound(rho: float, delta: float) -> float:
  """The standard zCDP conversion (Bun & Steinke 2016, Prop. 1.3): rho-zCDP implies
  (rho + 2 sqrt(rho log(1/delta)), delta)-DP. Looser than the PLD, but finite at any delta > 0."""
  return rho + 2.0 * np.sqrt(rho * np.log(1.0 / delta))


def _delta_warnings(headline: zcdp.Guarantee) -> List[str]:
  """A warning when the PLD gives epsilon inf at a finite rho: the delta is below what it resolves
  (its tail truncation, about 1e-15), not an infinite loss; the zCDP bound stands beside it."""
  if np.isfinite(headline.epsilon) or not np.isfinite(headline.rho):
    return []
  return [f'{SMALL_DELTA_WARNING_START} {headline.delta:g} is too small for the PLD accountant '
          '(it resolves deltas down to about 1e-15), so its epsilon is inf; the zCDP bound '
          f'(rho + 2 sqrt(rho ln(1/delta)), rho = {headline.rho:.6g}) gives epsilon <= '
          f'{zcdp_epsilon_bound(headline.rho, headline.delta):.6g} at this delta. A larger target '
          'delta gives a PLD epsilon.']


def _noise_warnings(plan: plan_lib.RunPlan, headline: zcdp.Guarantee,
                    exact: bool) -> Tuple[Optional[float], List[str]]:
  """(adaptive clipping's value noise multiplier or None, warnings about the noise)."""
  warnings = [] if exact else [
      'the squared sensitivity is an upper bound (the guarantee is conservative).']
  if plan.clipped_count_stddev is None:
    return None, warnings
  value_nm = plan_lib.inflated_noise_multiplier(headline.noise_multiplier,
                                                plan.clipped_count_stddev)
  if value_nm >= 2 * headline.noise_multiplier:
    warnings.append(f'adaptive clipping inflates the value noise multiplier by '
                    f'{value_nm / headline.noise_multiplier:.3g}x.')
  return value_nm, warnings


def build_report(plan: plan_lib.RunPlan, log: Optional[log_lib.ParticipationLog] = None, *,
                 observed_patterns: bool = True, secure_segments: Optional[dict] = None,
                 equal_privacy: bool = False, require_amplification: bool = False,
                 final_clip: Optional[float] = None,
                 canaries: Optional[auditing.CanaryRecord] = None,
                 confidence: float = 0.95, log_complete: bool = False) -> PrivacyReport:
  """Builds the privacy report of a run plan.

  Args:
    plan: the `RunPlan`, with a noise multiplier > 0 and, without a log, its rounds and declared
      participation (the log gives them otherwise: its last round + 1, no declared schema).
    log: a `ParticipationLog`; the headline then uses the realized participation.
    observed_patterns: trees with a log: also the exact guarantee over the observed patterns.
    secure_segments: with SecAgg, {'segments': one {'segment', 'clip', 'sensitivity_clip'} per
      noise segment (the active clip and the post-rounding L2 bound the noise std was proportional
      to), 'wrap_rounds': rounds whose secure sum wrapped around the field}. A wrap voids the norm
      bound of that round's sum, so each one is a warning.
    equal_privacy: also compare every mechanism at the headline's rho and participation (seconds
      at n = 2000; see `equal_privacy.equal_privacy`).
    require_amplification: with the plan's random sampling, a strategy that amplification does not
      cover is a ValueError (a request for the amplified figure) instead of a warning.
    final_clip: with adaptive clipping, the clip of the run's last round (its metrics'
      `aggregator/clip`), stated in `run_facts`; None when not recorded.
    canaries: the run's `auditing.CanaryRecord` (`auditing.read_canaries` of its canaries.json):
      adds `empirical_privacy`, one row per threat model at the headline's delta; needs `log` (the
      canaries are clients of the log, their rounds come from it). A fixed noise seed changes
      nothing here: the rows are computed as usual.
    confidence: of the empirical lower bounds, in (0, 1).
    log_complete: the log must reach the plan's last round (a finished run's report whose rounds
      were not given explicitly); see `check_log_of_plan`, which checks every log.

  Raises:
    ValueError: on bad arguments (naming the parameter); `LogMismatchError` (a ValueError) when
      `log` cannot be the plan's; `CanaryMismatchError` (a ValueError) when `canaries` cannot be
      of this run.
  """
  _check_inputs(plan, log)
  if log is not None:
    check_log_of_plan(plan, log, complete=log_complete)
  confidence = _validation.check_float_in_range(confidence, 'confidence', 0.0, 1.0,
                                                low_inclusive=False, high_inclusive=False)
  if canaries is not None:
    if not isinstance(canaries, auditing.CanaryRecord):
      raise ValueError(f'`canaries` must be an auditing.CanaryRecord, got {canaries!r}.')
    if log is None:
      raise ValueError('`canaries` needs the participation log (`log`): the canaries\' rounds '
                       'come from it.')
  run_facts = RunFacts.of_plan(plan, final_clip)
  num_rounds, schema, source, observed = headline_setting(plan, log)
  _check_rounds(plan, num_rounds)
  headline = zcdp.guarantee_for_plan(plan, num_rounds, schema)
  warnings: List[str] = [FIXED_SEED_WARNING] if plan.noise_seed_fixed else []
  warnings += _delta_warnings(headline)
  if observed is not None:
    warnings += [f'participation log violates the declared schema: {v}'
                 for v in observed.violations]
  if plan.strategy_source is not None and plan.strategy_source.mismatches:
    warnings.append(f'the strategy file {plan.strategy_source.path} was optimized for another '
                    f'setting ({"; ".join(plan.strategy_source.mismatches)}).')
  amplified, amplified_warnings = _amplified(plan, headline, require_amplification)
  declared = None
  if log is not None and plan.participation is not None:
    declared_rounds = plan.num_rounds or num_rounds
    _check_rounds(plan, declared_rounds)
    declared = zcdp.guarantee_for_plan(plan, declared_rounds)
  if observed is not None and observed_patterns:
    observed = dataclasses.replace(observed,
                                   tree_patterns=_tree_patterns(plan, log, num_rounds, headline))
  exact = plan.strategy.segments_sensitivity_is_exact(plan.segment_lengths(num_rounds), schema)
  value_nm, noise_warnings = _noise_warnings(plan, headline, exact)
  secure, secure_warnings = _secure_aggregation(plan, secure_segments)
  empirical, empirical_warnings, notes = None, [], []
  if canaries is not None:
    empirical = _empirical_rows(plan, canaries, log, num_rounds, headline.delta, confidence)
    empirical_warnings, notes = _empirical_comparison(empirical, headline.epsilon, canaries)
  return PrivacyReport(
      plan=plan, guarantee=headline, mechanism_config=_json_config(plan.strategy.to_config()),
      participation_source=source, sensitivity_exact=exact, declared=declared, observed=observed,
      clipped_count_stddev=plan.clipped_count_stddev, value_noise_multiplier=value_nm,
      calibration=plan.calibration, secure_aggregation=secure,
      warnings=tuple(warnings + noise_warnings + secure_warnings + amplified_warnings
                     + empirical_warnings),
      equal_privacy=(equal_privacy_lib.equal_privacy(num_rounds, schema, rho=headline.rho,
                                                     run_strategy=plan.strategy)
                     if equal_privacy else None),
      strategy_file=None if plan.strategy_source is None else plan.strategy_source.file_record(),
      amplified=amplified, run_facts=run_facts, empirical_privacy=empirical, notes=tuple(notes))


#: How the empirical-privacy warnings (a lower bound above the accounted epsilon) and notes begin
#: (report.md gathers them in its empirical section).
EMPIRICAL_WARNING_START = 'the measured lower bound on epsilon'
EMPIRICAL_NOTE_STARTS = ('the one-shot empirical estimate', 'no empirical privacy',
                         'only a few canaries')

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


def _empirical_comparison(rows: Tuple[auditing.EmpiricalRow, ...], epsilon: float,
                          record: auditing.CanaryRecord) -> Tuple[List[str], List[str]]:
  """(warnings, notes) comparing the empirical rows with the accounted (headline) `epsilon`."""
  warnings, notes = [], []
  if not rows:
    notes.append(f'{EMPIRICAL_NOTE_STARTS[1]}: of the {record.num_seen} canaries, fewer than '
                 f'{auditing.MIN_SEEN_CANARIES} took part in the {record.num_rounds} recorded rounds '
                 f'(per the participation log); an estimate needs at least '
                 f'{auditing.MIN_SEEN_CANARIES} seen canaries (with fewer it is typically off by 2x '
                 'or more: docs/auditing.md), so give the run enough canary clients that '
                 f'{auditing.MIN_SEEN_CANARIES} of them are sampled.')
  few = [row for row in rows if row.canaries_seen < FEW_CANARIES]
  if few:
    notes.append(f'{EMPIRICAL_NOTE_STARTS[2]} took part ({few[0].canaries_seen} seen in '
                 f'{few[0].threat_model}): with fewer than {FEW_CANARIES} the estimates can be far '
                 'off (tens of percent or more) and the lower bounds are weak; thousands make a '
                 'check.')
  for row in rows:
    if row.epsilon_lower_bound > epsilon:
      warnings.append(
          f'{EMPIRICAL_WARNING_START} ({row.threat_model}: '
          f'{row.epsilon_lower_bound:.4g} at {confidence_text(row.confidence)} confidence, '
          f'{row.canaries_seen} seen / {row.canaries_unseen} unseen canaries) exceeds the '
          f'accounted epsilon {epsilon:.4g}: the noise added is less than the accountant assumes, '
          'or the accounting is wrong. Do not launch.')
    elif row.epsilon > epsilon:
      notes.append(
          f'{EMPIRICAL_NOTE_STARTS[0]} ({row.threat_model}: {row.epsilon:.4g}) exceeds the '
          f'accounted epsilon {epsilon:.4g}, but its lower bound ({row.epsilon_lower_bound:.4g} at '
          f'{confidence_text(row.confidence)} confidence) does not: an estimate, not a proof; more '
          'canaries would tell.')
  return warnings, notes


def _secure_aggregation(plan: plan_lib.RunPlan,
                        secure_segments: Optional[dict]) -> Tuple[Optional[dict], List[str]]:
  """The report's `secure_aggregation` (the plan's SecAgg settings with the run's segments and
  wrapped rounds) and its warnings, or (None, []) without SecAgg."""
  if plan.secure is None:
    return None, []
  if not isinstance(secure_segments, dict) or {'segments', 'wrap_rounds'} - set(secure_segments):
    raise ValueError('`secure_segments` ({"segments": [...], "wrap_rounds": [...]}) is required '
                     f'with SecAgg, got {secure_segments!r}.')
  segments = []
  for segment in secure_segments['segments']:
    clip = _validation.check_positive_float(segment['clip'], 'clip')
    bound = _validation.check_positive_float(segment['sensitivity_clip'], 'sensitivity_clip')
    if bound < clip:
      raise ValueError(f'`sensitivity_clip`={bound} is below the clip {clip}: a post-rounding '
                       'bound is never smaller than the clip.')
    segments.append({'segment': int(segment['segment']), 'clip': clip, 'sensitivity_clip': bound})
  wrap_rounds = sorted(int(r) for r in secure_segments['wrap_rounds'])
  secure = {**plan.secure.to_config(), 'segments': segments, 'wrap_rounds': wrap_rounds}
  if not wrap_rounds:
    return secure, []
  return secure, [f"the secure sum wrapped around its {secure['bits']}-bit field in rounds "
                  f"{wrap_rounds}: those rounds' sums are not bounded by the clip, and the "
                  'guarantee does not cover them.']
