"""The privacy report of a run plan: its data (`PrivacyReport`) and composition (`build_report`).

`build_report(plan, log)` turns a `dp_ftrl_tff.plan.RunPlan` (the mechanism and where it came from,
the noise multiplier and what it was calibrated to, the restarts, adaptive clipping, SecAgg, the
sampling, the rounds, the declared participation and the target delta) and optionally the run's
participation log into a `PrivacyReport`. It computes the headline guarantee (rho-zCDP and
(epsilon, delta) by PLD, see `zcdp`; with a log, for the REALIZED participation) and composes the
section builders, each of which returns its data and its typed findings (`report_parts.Finding`):
  * `report_participation`: the headline's setting, what the log shows (breaches of the declared
    schema are warnings; trees: the exact guarantee over the observed patterns) and the guarantee
    under the declared schema;
  * `report_sections`: the headline's warnings (fixed noise seed, tiny delta), the strategy file,
    the noise (adaptive clipping, inexact sensitivity), SecAgg, the amplified guarantee under the
    plan's random sampling, and the facts the plan states (`RunFacts`);
  * `equal_privacy`: every mechanism at the headline's privacy (optional);
  * `report_empirical`: with the run's canaries, the empirical privacy beside the accounted epsilon;
  * the sections registered with `report_parts.register`.
The report is a function of its inputs (no wall time, no date): built twice from the same inputs it
renders to the same bytes. Runs build it from their files with `report_files.report_from_run_files`
(the drivers, the programs' release, `python -m experiments.privacy_report`); rendering (JSON,
terminal summary, the BLT paper's App. C markdown checklist, plots) lives in `report_render`.

Conventions: rounds 0-based; `min_sep` = b (r2 - r1 >= b) and `min_separation` = b - 1 (TF-Privacy,
Gboard tables; `ParticipationSchema.tf_privacy_min_separation`); noise multipliers are relative to
the clip norm; sensitivities use clip norm 1.
"""

import dataclasses
from typing import Any, Optional, Tuple

import numpy as np

from dp_ftrl_tff import _validation, auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.accounting import (
  amplified_strategy,
  report_empirical,
  report_participation,
  report_parts,
  report_sections,
  zcdp,
)
from dp_ftrl_tff.accounting import equal_privacy as equal_privacy_lib
from dp_ftrl_tff.accounting import participation_log as log_lib


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
    calibration: {'target_rho': ...} or {'target_epsilon': ...} when sigma was calibrated, else
      None.
    equal_privacy: `equal_privacy.EqualPrivacy` at the headline's rho and participation, or None.
    strategy_file: {'path', 'sha256', 'setting', 'mismatches'} of the strategy file, or None.
    amplified: the `amplified_strategy.AmplifiedGuarantee` under the run's random sampling, or None.
    run_facts: the `RunFacts` of the plan: noise seed, clip, sampler, cohorts and population.
    empirical_privacy: with the run's canaries, a tuple of `auditing.EmpiricalRow` (one per threat
      model with enough canaries; empty when none has), at the headline's delta; else None.
    findings: the sections' `report_parts.Finding`s (warnings: schema violations, upper bounds,
      large inflation, ...; notes: remarks that are not warnings), warnings in the order of the
      sections.
    sections: (section, data) of each registered `report_parts.Section`, in registration order
      (the section renders its data: the report needs no registry to be written).
  """
  plan: plan_lib.RunPlan
  guarantee: zcdp.Guarantee
  mechanism_config: dict
  participation_source: str
  sensitivity_exact: bool
  declared: Optional[zcdp.Guarantee] = None
  observed: Optional[report_participation.ObservedParticipation] = None
  clipped_count_stddev: Optional[float] = None
  value_noise_multiplier: Optional[float] = None
  calibration: Optional[dict] = None
  secure_aggregation: Optional[dict] = None
  equal_privacy: Optional[equal_privacy_lib.EqualPrivacy] = None
  strategy_file: Optional[dict] = None
  amplified: Optional[amplified_strategy.AmplifiedGuarantee] = None
  run_facts: report_sections.RunFacts = report_sections.RunFacts()
  empirical_privacy: Optional[Tuple[auditing.EmpiricalRow, ...]] = None
  findings: Tuple[report_parts.Finding, ...] = ()
  sections: Tuple[Tuple[report_parts.Section, Any], ...] = ()

  @property
  def warnings(self) -> Tuple[str, ...]:
    """The texts of the warning findings, in order."""
    return tuple(f.text for f in self.findings if f.severity == 'warning')

  @property
  def notes(self) -> Tuple[str, ...]:
    """The texts of the note findings, in order."""
    return tuple(f.text for f in self.findings if f.severity == 'note')

  def findings_of(self, section: str) -> Tuple[report_parts.Finding, ...]:
    """The findings of `section`, in order."""
    return tuple(f for f in self.findings if f.section == section)

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


def _check_inputs(plan: plan_lib.RunPlan, log: Optional[log_lib.ParticipationLog],
                  canaries: Optional[auditing.CanaryRecord], confidence: float,
                  trained_rounds: Optional[int]) -> float:
  """Raises ValueError naming the bad argument; returns `confidence` as a float."""
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
  confidence = _validation.check_float_in_range(confidence, 'confidence', 0.0, 1.0,
                                                low_inclusive=False, high_inclusive=False)
  if canaries is not None:
    if not isinstance(canaries, auditing.CanaryRecord):
      raise ValueError(f'`canaries` must be an auditing.CanaryRecord, got {canaries!r}.')
    if log is None:
      raise ValueError('`canaries` needs the participation log (`log`): the canaries\' rounds '
                       'come from it.')
  if trained_rounds is not None:
    _validation.check_positive_int(trained_rounds, 'trained_rounds')
    if log is None:
      raise ValueError('`trained_rounds` says which rounds the participation log covers: it needs '
                       '`log`.')
  return confidence


def build_report(plan: plan_lib.RunPlan, log: Optional[log_lib.ParticipationLog] = None, *,
                 observed_patterns: bool = True, secure_segments: Optional[dict] = None,
                 equal_privacy: bool = False, require_amplification: bool = False,
                 final_clip: Optional[float] = None,
                 canaries: Optional[auditing.CanaryRecord] = None,
                 confidence: float = 0.95, log_complete: bool = False,
                 trained_rounds: Optional[int] = None) -> PrivacyReport:
  """Builds the privacy report of a run plan.

  Args:
    plan: the `RunPlan`, with a noise multiplier > 0 and, without a log, its rounds and declared
      participation (the log gives them otherwise: its last round + 1, no declared schema).
    log: a `ParticipationLog`; the headline then uses the realized participation.
    observed_patterns: trees with a log: also the exact guarantee over the observed patterns.
    secure_segments: with SecAgg, {'segments': one {'segment', 'clip', 'sensitivity_clip'} per
      noise segment, 'wrap_rounds': rounds whose secure sum wrapped around the field} (see
      `report_sections.secure_aggregation_section`).
    equal_privacy: also compare every mechanism at the headline's rho and participation.
    require_amplification: with the plan's random sampling, a strategy that amplification does not
      cover is a ValueError (a request for the amplified figure) instead of a warning.
    final_clip: with adaptive clipping, the clip of the run's last round, or None.
    canaries: the run's `auditing.CanaryRecord`: adds `empirical_privacy` at the headline's delta;
      needs `log` (the canaries' rounds come from it).
    confidence: of the empirical lower bounds, in (0, 1).
    log_complete: the log must cover the plan's every round (see
      `report_participation.check_log_of_plan`, which checks every log).
    trained_rounds: the rounds the run trained, from its own records (its loop, its checkpoint
      record), or None: the log then covers rounds 0 .. trained_rounds - 1 even when its last
      rounds drew nobody (random cohorts' empty rounds write no row).

  Raises:
    ValueError: on bad arguments (naming the parameter); `LogMismatchError` (a ValueError) when
      `log` cannot be the plan's; `CanaryMismatchError` (a ValueError) when `canaries` cannot be
      of this run.
  """
  confidence = _check_inputs(plan, log, canaries, confidence, trained_rounds)
  if log is not None:
    report_participation.check_log_of_plan(plan, log, complete=log_complete,
                                           trained_rounds=trained_rounds)
  run_facts = report_sections.RunFacts.of_plan(plan, final_clip)
  num_rounds, schema, source, observed = report_participation.headline_setting(plan, log)
  report_participation.check_rounds(plan, num_rounds)
  headline = zcdp.guarantee_for_plan(plan, num_rounds, schema)
  inputs = report_parts.SectionInputs(plan, log, headline, num_rounds, schema)
  report = _compose(inputs, source, observed, observed_patterns=observed_patterns,
                    secure_segments=secure_segments,
                    require_amplification=require_amplification)
  empirical, empirical_findings = None, []
  if canaries is not None:
    empirical, empirical_findings = report_empirical.empirical_section(
        plan, canaries, log, num_rounds, headline, confidence)
  sections, section_findings = _registered_sections(inputs)
  return dataclasses.replace(
      report, run_facts=run_facts, empirical_privacy=empirical,
      equal_privacy=(equal_privacy_lib.equal_privacy(num_rounds, schema, rho=headline.rho,
                                                     run_strategy=plan.strategy)
                     if equal_privacy else None),
      findings=report.findings + tuple(empirical_findings + section_findings),
      sections=sections)


def _compose(inputs: report_parts.SectionInputs, source: str,
             observed: Optional[report_participation.ObservedParticipation], *,
             observed_patterns: bool, secure_segments: Optional[dict],
             require_amplification: bool) -> PrivacyReport:
  """The report of the participation, mechanism, noise, SecAgg and amplification sections, their
  findings in that order after the headline's."""
  plan, headline = inputs.plan, inputs.headline
  declared, observed, participation_findings = report_participation.participation_section(
      plan, inputs.log, observed, inputs.num_rounds, headline, observed_patterns)
  strategy_file, mechanism_findings = report_sections.strategy_file_section(plan)
  amplified, amplified_findings = report_sections.amplification_section(
      plan, headline, require_amplification)
  exact = plan.strategy.segments_sensitivity_is_exact(plan.segment_lengths(inputs.num_rounds),
                                                      inputs.schema)
  value_nm, noise_findings = report_sections.noise_section(plan, headline, exact)
  secure, secure_findings = report_sections.secure_aggregation_section(plan, secure_segments)
  findings = (report_sections.guarantee_findings(plan, headline) + participation_findings
              + mechanism_findings + noise_findings + secure_findings + amplified_findings)
  return PrivacyReport(
      plan=plan, guarantee=headline, mechanism_config=_json_config(plan.strategy.to_config()),
      participation_source=source, sensitivity_exact=exact, declared=declared, observed=observed,
      clipped_count_stddev=plan.clipped_count_stddev, value_noise_multiplier=value_nm,
      calibration=plan.calibration, secure_aggregation=secure, strategy_file=strategy_file,
      amplified=amplified, findings=tuple(findings))


def _registered_sections(inputs: report_parts.SectionInputs
                         ) -> Tuple[Tuple[Tuple[report_parts.Section, Any], ...], list]:
  """((section, data) of each registered section, their findings)."""
  sections, findings = [], []
  for section in report_parts.registered_sections():
    data, found = section.build(inputs)
    sections.append((section, data))
    findings += list(found)
  return tuple(sections), findings
