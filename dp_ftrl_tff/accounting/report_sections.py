"""The sections of a privacy report besides participation and empirical privacy.

Each builder returns its section's data and its `report_parts.Finding`s:
  * `guarantee_findings`: the headline's warnings: a fixed noise seed (testing only, no guarantee),
    an epsilon that is the zCDP conversion bound (rho above what the PLD accountant holds: an
    upper bound, not a tight figure), a target delta below what the PLD accountant resolves (with
    the zCDP bound instead);
  * `strategy_file_section`: the strategy file the mechanism came from, with its SHA-256 and the
    setting it was made for (a file made for another setting is a warning);
  * `noise_section`: adaptive clipping's value noise multiplier (a large inflation is a warning) and
    whether the squared sensitivity is exact (an upper bound is a warning: conservative);
  * `secure_aggregation_section`: SecAgg's settings, each segment's post-rounding bound and the
    rounds whose secure sum wrapped (each a warning: the norm bound of that sum is void);
  * `amplification_section`: with the plan's random sampling (Poisson, or cyclic Poisson with b-hat
    groups: BandMF paper Thm. 4, docs/papers.md#bandmf), the amplified guarantee next to the
    unamplified headline, which holds whatever the sampling;
  * `RunFacts.of_plan`: what the plan states about the run: the noise seed, the clip, the sampler,
    clients per round, population and sampling probability.

Conventions: noise multipliers are relative to the clip norm; sensitivities use clip norm 1.
"""

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

from dp_ftrl_tff import _validation, settings
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import (
  amplification,
  amplified_strategy,
  report_parts,
  zcdp,
  zcdp_epsilon,
)

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


def guarantee_findings(plan: plan_lib.RunPlan,
                       headline: zcdp.Guarantee) -> List[report_parts.Finding]:
  """The headline's warnings: a fixed noise seed; an epsilon that is the zCDP bound; a delta too
  small for the PLD accountant."""
  fixed_seed = [report_parts.warning('guarantee', FIXED_SEED_WARNING)]
  findings = fixed_seed if plan.noise_seed_fixed else []
  return findings + zcdp_bound_findings(headline) + _delta_findings(headline)


def zcdp_bound_text(g: zcdp.Guarantee) -> str:
  """The warning of a guarantee whose epsilon is the zCDP conversion bound
  (`zcdp_epsilon.ZCDP_BOUND`)."""
  return (f'epsilon {g.epsilon:.6g} is an UPPER BOUND from rho-zCDP (the zCDP conversion bound), '
          f'not a tight PLD epsilon: {zcdp_epsilon.beyond_pld_text(g.rho)}. The true epsilon at '
          f'delta {g.delta:g} is smaller, never larger; more noise or fewer rounds give a PLD '
          'epsilon.')


def zcdp_bound_findings(headline: zcdp.Guarantee) -> List[report_parts.Finding]:
  """A warning when the headline's epsilon is the zCDP conversion bound (`zcdp_bound_text`)."""
  if not headline.epsilon_is_zcdp_bound:
    return []
  return [report_parts.warning('guarantee', zcdp_bound_text(headline))]


def _delta_findings(headline: zcdp.Guarantee) -> List[report_parts.Finding]:
  """A warning when the PLD gives epsilon inf at a finite rho: the delta is below what it resolves
  (its tail truncation, about 1e-15), not an infinite loss; the zCDP bound stands beside it."""
  if np.isfinite(headline.epsilon) or not np.isfinite(headline.rho):
    return []
  return [report_parts.warning(
      'guarantee', f'the target delta {headline.delta:g} is too small for the PLD accountant (it '
      'resolves deltas down to about 1e-15), so its epsilon is inf; the zCDP bound '
      f'(rho + 2 sqrt(rho ln(1/delta)), rho = {headline.rho:.6g}) gives epsilon <= '
      f'{zcdp_epsilon.bun_steinke_bound(headline.rho, headline.delta):.6g} at this delta. '
      'A larger target delta gives a PLD epsilon.')]


def strategy_file_section(plan: plan_lib.RunPlan
                          ) -> Tuple[Optional[dict], List[report_parts.Finding]]:
  """({'path', 'sha256', 'setting', 'mismatches'} of the plan's strategy file or None, a warning
  when the file was made for another setting)."""
  source = plan.strategy_source
  if source is None:
    return None, []
  findings = [report_parts.warning(
      'mechanism', f'the strategy file {source.path} was optimized for another setting '
      f'({"; ".join(source.mismatches)}).')] if source.mismatches else []
  return source.file_record(), findings


def noise_section(plan: plan_lib.RunPlan, headline: zcdp.Guarantee, exact: bool
                  ) -> Tuple[Optional[float], List[report_parts.Finding]]:
  """(adaptive clipping's value noise multiplier or None, findings about the noise)."""
  findings = [] if exact else [report_parts.warning(
      'noise', 'the squared sensitivity is an upper bound (the guarantee is conservative).')]
  if plan.clipped_count_stddev is None:
    return None, findings
  value_nm = settings.inflated_noise_multiplier(headline.noise_multiplier,
                                                plan.clipped_count_stddev)
  if value_nm >= 2 * headline.noise_multiplier:
    findings.append(report_parts.warning(
        'noise', f'adaptive clipping inflates the value noise multiplier by '
        f'{value_nm / headline.noise_multiplier:.3g}x.'))
  return value_nm, findings


def amplification_section(plan: plan_lib.RunPlan, headline: zcdp.Guarantee, require: bool
                          ) -> Tuple[Optional[amplified_strategy.AmplifiedGuarantee],
                                     List[report_parts.Finding]]:
  """(the amplified guarantee under the plan's sampling or None, findings). A strategy the theorem
  does not cover gets a warning, or with `require` a ValueError."""
  sampling = plan.sampling
  if not sampling.random_cohorts:
    return None, []
  n, restarts = headline.num_rounds, headline.restart_rounds
  try:
    amplified_strategy.check_banded(plan.strategy, n, sampling.num_groups, restarts)
  except ValueError as error:
    if require:
      raise
    return None, [report_parts.warning(
        'amplification',
        f"no amplified guarantee for the plan's {sampling.kind} sampling: {error}")]
  try:
    return amplified_strategy.amplified_guarantee(
        plan.strategy, n, headline.noise_multiplier, sampling.num_groups,
        sampling.sampling_prob, headline.delta, restart_rounds=restarts), []
  except amplification.BelowAccountantRangeError as error:
    # The accountant's memory refuses no run: the unamplified headline holds whatever the sampling.
    if require:
      raise
    return None, [report_parts.warning(
        'amplification', f"no amplified guarantee for the plan's {sampling.kind} sampling: "
        f'{error} The unamplified guarantee above holds whatever the sampling.')]


def secure_aggregation_section(plan: plan_lib.RunPlan, secure_segments: Optional[dict]
                               ) -> Tuple[Optional[dict], List[report_parts.Finding]]:
  """The report's `secure_aggregation` (the plan's SecAgg settings with the run's segments and
  wrapped rounds) and its findings, or (None, []) without SecAgg."""
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
  return secure, [report_parts.warning(
      'secure_aggregation', f"the secure sum wrapped around its {secure['bits']}-bit field in "
      f"rounds {wrap_rounds}: those rounds' sums are not bounded by the clip, and the guarantee "
      'does not cover them.')]
