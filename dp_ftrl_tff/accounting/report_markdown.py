"""The markdown of a privacy report (report.md): the BLT paper's App. C checklist, filled in.

After Ponomareva et al. 2023, Sec. 5.3: DP setting, data accesses covered, final output, unit of
privacy, adjacency, accounting method, assumptions, formal statement, then the equal-privacy table
when the report has one, the empirical privacy of the run's canaries when it has them, and the
sections registered with `report_parts.register`. The warnings come first, all of them; each
section's findings (`report_parts.Finding`) are also listed in their section where it has its own
list (the empirical one, the registered ones); notes of the other sections come first. Both
`min_sep` = b (r2 - r1 >= b) and TF-Privacy's `min_separation` = b - 1 are printed.
"""

import json
from typing import List, Tuple

import dp_accounting

from dp_ftrl_tff import auditing
from dp_ftrl_tff.accounting import (
  amplified_strategy,
  report_empirical,
  report_sections,
  zcdp_epsilon,
)
from dp_ftrl_tff.accounting import equal_privacy as equal_privacy_lib
from dp_ftrl_tff.accounting import report as report_lib

DP_ACCOUNTING_VERSION = getattr(dp_accounting, '__version__', '0.4.3')  # the pinned 0.4.3 has none


_CONVERSION_TEXT = {
    'pld': 'PLD accounting (add-or-remove, value discretization 1e-4)',
    'gaussian': 'the exact Gaussian tradeoff curve',
    'rdp': 'RDP with the Canonne-Kamath-Steinke conversion on TF-Privacy\'s orders',
    zcdp_epsilon.ZCDP_BOUND: (
        '**an UPPER BOUND from rho-zCDP (the zCDP conversion bound), not a tight PLD '
        'epsilon**: the smaller of the RDP conversion of Canonne, Kamath & Steinke '
        'on a dense order grid and Bun & Steinke\'s rho + 2 sqrt(rho ln(1/delta)), '
        'both valid for any rho-zCDP mechanism'),
}


def epsilon_value(epsilon: float, bound: bool) -> str:
  """What follows 'epsilon ' in report.md: '= e', or '<= e (an upper bound from rho-zCDP)' for the
  zCDP bound."""
  return f'<= {epsilon:.6g} (an upper bound from rho-zCDP)' if bound else f'= {epsilon:.6g}'


def amplified_text(a: amplified_strategy.AmplifiedGuarantee) -> str:
  """One line: the amplified guarantee and what it rests on."""
  return (f'amplified: (epsilon, delta)=({a.epsilon:.6g}, {a.delta:g}) by {a.accountant.upper()}, '
          f'{a.num_groups} sampling group(s), sampling_prob={a.sampling_prob:.6g}: '
          f'{a.compositions} Poisson-sampled Gaussian rounds with noise multiplier sigma / '
          f'max column norm = {a.effective_noise_multiplier:.6g}')


def empirical_text(row: auditing.EmpiricalRow, accounted_epsilon: float) -> str:
  """One line: an empirical row's certified bounds and estimate beside the accounted epsilon."""
  bounds = ', '.join(f'{report_empirical.METHOD_TEXT[b.method]} {b.epsilon:.4g}'
                     for b in row.bounds)
  return (f'empirical ({row.threat_model}): certified lower bound {row.epsilon_lower_bound:.4g} '
          f'at {report_empirical.confidence_text(row.confidence)} ({bounds}); estimate '
          f'{row.epsilon:.4g}; vs accounted {accounted_epsilon:.4g}')


def row_label(row: equal_privacy_lib.EqualPrivacyRow) -> str:
  """The row's mechanism, marked '(this run)' for the run's own one."""
  if not row.run_mechanism or row.mechanism.endswith('(this run)'):
    return row.mechanism
  return f'{row.mechanism} (this run)'


def to_markdown(report: report_lib.PrivacyReport) -> str:
  """The BLT paper's App. C checklist, filled in."""
  g = report.guarantee
  md = [f'# Privacy report: {g.mechanism}, {g.num_rounds} rounds', '']
  if report.warnings:
    md += ['> **WARNING**', '>'] + [f'> - {w}' for w in report.warnings] + ['']
  other_notes = [f.text for f in report.findings
                 if f.severity == 'note' and f.section not in _own_findings(report)]
  if other_notes:
    md += ['> **Note**', '>'] + [f'> - {n}' for n in other_notes] + ['']
  md += _setting_markdown(report) + _mechanism_markdown(report) + _participation_markdown(report)
  md += _accounting_markdown(report)
  if report.equal_privacy is not None:
    md += _equal_privacy_markdown(report)
  if report.empirical_privacy is not None:
    md += _empirical_markdown(report)
  for section, data in report.sections:
    md += section.markdown(data) + _findings_markdown(report.findings_of(section.name))
  return '\n'.join(md)


def _own_findings(report: report_lib.PrivacyReport) -> Tuple[str, ...]:
  """The sections that list their own findings (so their notes are not listed first)."""
  return ('empirical', *(section.name for section, _ in report.sections))


def _findings_markdown(findings) -> List[str]:
  """A section's own findings: its warnings (also listed first), then its notes."""
  return ([f'- **WARNING:** {f.text}' for f in findings if f.severity == 'warning']
          + [f'- Note: {f.text}' for f in findings if f.severity == 'note'] + [''])


def _setting_markdown(report: report_lib.PrivacyReport) -> List[str]:
  """The formal statement and sections 1-2: the DP setting and the DP definition."""
  g = report.guarantee
  return [
      '**Formal statement.** The training run satisfies '
      f'**rho-zCDP with rho = {g.rho:.6g}** and **(epsilon, delta)-DP with epsilon = '
      f'{g.epsilon:.6g}, delta = {g.delta:g}**, at the device (client) level, under the '
      'participation stated below.'
      + (' **This epsilon is an UPPER BOUND from rho-zCDP (the zCDP conversion bound), not a tight '
         f'PLD epsilon: rho is above the {zcdp_epsilon.MAX_RHO:g} whose privacy loss distribution '
         'the PLD accountant holds. The true epsilon is smaller, never larger.**'
         if g.epsilon_is_zcdp_bound else '')
      + (' **This run\'s noise seed was fixed (--noise_seed): the statement does not hold for it; '
         'testing only.**' if report.run_facts.noise_seed_fixed else ''), '',
      '## 1. DP setting',
      '- Central DP: the server is trusted to clip, aggregate and add the correlated noise as '
      'specified.', '',
      '## 2. Instantiating the DP definition',
      '- **Data accesses covered:** every well-behaved client (one that follows the protocol, '
      'including the participation limits) in this single training run. Hyperparameter tuning '
      'and checkpoint selection are not covered.',
      '- **Final mechanism output:** the full sequence of noisy aggregates, hence every '
      'intermediate model (not only the final checkpoint).',
      '- **Unit of privacy:** one device/client (user-level for single-device users); a client '
      'may hold arbitrarily much data.',
      '- **Adjacency:** zero-out: the neighbouring run replaces all updates of one client by zero '
      '(a form of add/remove).', '']


def _mechanism_markdown(report: report_lib.PrivacyReport) -> List[str]:
  """Section 3: the mechanism, its noise, adaptive clipping, SecAgg, calibration, strategy file."""
  g = report.guarantee
  restarts = (', '.join(str(r) for r in g.restart_rounds) if g.restart_rounds else 'none')
  md = ['## 3. Mechanism',
        f'- Mechanism: `{g.mechanism}`, configuration `{json.dumps(report.mechanism_config)}`.',
        f'- Rounds n = {g.num_rounds} (0-based rounds 0..{g.num_rounds - 1}); noise restarts at '
        f'rounds: {restarts}.',
        f'- Noise multiplier sigma = {g.noise_multiplier:.6g} (noise std sigma x clip norm on the '
        f'sum of clipped updates, before correlation); effective noise multiplier sigma / sens = '
        f'{g.effective_noise_multiplier:.6g}.']
  if report.value_noise_multiplier is not None:
    md.append(f'- Adaptive clipping (Gboard Thm. 1): clipped-count noise std '
              f'{report.clipped_count_stddev:g}; the model sum uses z_Delta = '
              f'{report.value_noise_multiplier:.10g}, equivalent to the accounted sigma above.')
  if report.secure_aggregation is not None:
    sa = report.secure_aggregation
    ratio = max((seg['sensitivity_clip'] / seg['clip'] for seg in sa['segments']), default=1.0)
    md.append(f"- SecAgg ({sa['bits']} bits, rotation {sa['rotation']}, beta {sa['beta']:g}): "
              'records are rounded before the secure sum, which can grow their norm; each '
              'segment\'s noise std is sigma x its post-rounding clip (at most '
              f'{ratio:.6g} x the clip), so sigma is relative to the post-rounding bound. Rounds '
              f"whose secure sum wrapped around the field: {sa['wrap_rounds'] or 'none'}.")
  md += run_facts_markdown(report.run_facts)
  if report.calibration is not None:
    (key, value), = report.calibration.items()
    md.append(f'- sigma was calibrated to meet {key} = {value:g}.')
  if report.strategy_file is not None:
    f = report.strategy_file
    md.append(f"- Strategy file `{f['path']}`, SHA-256 `{f['sha256']}`, optimized for "
              f"{json.dumps(f['setting']) if f['setting'] else 'an unrecorded setting'}"
              + (f" (differs from this run: {'; '.join(f['mismatches'])})."
                 if f['mismatches'] else '.'))
  return md + ['']


def run_facts_markdown(facts: report_sections.RunFacts) -> List[str]:
  """The noise seed and the clip (section 3 bullets); what the plan does not record is omitted."""
  md = []
  if facts.noise_seed_fixed is not None:
    md.append('- Noise seed: **FIXED (--noise_seed): testing only.** Anyone who knows the seed can '
              'regenerate the noise; the guarantee above does not hold for this run.'
              if facts.noise_seed_fixed else
              '- Noise seed: drawn from OS entropy at the start (secret, as the guarantee needs).')
  if facts.clip == 'fixed':
    md.append(f'- Clip: fixed, L2 norm {facts.clip_norm:g} per client update.')
  elif facts.clip == 'adaptive':
    final = ('not recorded' if facts.final_clip is None else
             f'{facts.final_clip:.6g} in the last round')
    md.append(f'- Clip: adaptive (quantile clipping), target unclipped quantile '
              f'{facts.target_unclipped_quantile:g}, initial clip {facts.clip_norm:g}, final '
              f'clip {final}.')
  return md


def cohorts_text(facts: report_sections.RunFacts) -> str:
  """The sampler, clients per round, population and sampling probability, in words."""
  population = ('an unrecorded population' if facts.population is None else
                f'a population of {facts.population} clients')
  fraction = ('' if facts.cohort_fraction is None else
              f', {facts.cohort_fraction:.4g} of the population per round')
  if facts.sampling_prob is None:  # fixed cohorts
    return (f'{facts.sampler.replace("_", "-")} sampler: exactly {facts.clients_per_round:g} '
            f'clients per round from {population}{fraction} (no random sampling probability: no '
            'amplification)')
  groups = (f' in {facts.sampling_groups} fixed groups (round t samples group t mod '
            f'{facts.sampling_groups})' if facts.sampler == 'cyclic_poisson' else '')
  expected = ('' if facts.clients_per_round is None else
              f', expected {facts.clients_per_round:.6g} clients per round')
  return (f'{facts.sampler} sampler: each client of {population}{groups} joins a round it is '
          f'eligible for with sampling probability q = {facts.sampling_prob:g}{expected}')


def _participation_markdown(report: report_lib.PrivacyReport) -> List[str]:
  """Section 4: the cohorts and the participation, declared or observed in the log."""
  g = report.guarantee
  facts = report.run_facts
  md = ['## 4. Participation']
  if facts.sampler is not None:
    md.append(f'- Cohorts: {cohorts_text(facts)}.')
  md.append(f'- Source: **{report.participation_source}**'
            + (' (realized in the participation log; Gboard-paper practice)'
               if report.participation_source == 'observed'
               else ' (enforced by the client sampler)'))
  if report.no_client_participated_twice:
    md.append(f'- min_sep: **no client participated twice yet**, so no separation is realized; '
              f'accounted as single participation over the n = {g.num_rounds} rounds (written '
              f'min_sep b = {report.min_sep}, min_separation = '
              f'{g.participation.tf_privacy_min_separation}).')
  else:
    md.append(f'- min_sep b = {report.min_sep}: two participations r1 < r2 of one client satisfy '
              f'r2 - r1 >= b; min_separation (rounds strictly between, TF-Privacy / Gboard MinS) = '
              f'{g.participation.tf_privacy_min_separation}.')
  md.append(f'- max_participations k = {report.max_participations} (effective: min(k, ceil(n / b)))'
            + ('; fixed-epoch schema.' if g.participation.fixed_epoch else '.'))
  if report.observed is not None:
    o = report.observed
    realized = ('no client participated twice yet' if not o.participated_twice else
                f'realized min_sep = {o.min_sep}')
    md += [f'- Log `{o.path}`: {o.num_rows} rows, {o.num_clients} clients, rounds 0..'
           f'{o.num_rounds - 1}; {realized}, realized max participations = '
           f'{o.max_participations}.',
           f'- Participations per client: {o.histogram}.']
    if o.violations:
      md += ['- **The log VIOLATES the declared schema:**'] + [f'  - {v}' for v in o.violations]
      md.append('  The guarantee above is the one that holds for the realized participation.')
    if o.tree_patterns is not None:
      t = o.tree_patterns
      md.append(f'- Exact over the observed clients\' actual patterns (tree): sens^2 = '
                f'{t["sensitivity_squared"]:.6g}, rho = {t["rho"]:.6g}, epsilon '
                f'{epsilon_value(t["epsilon"], t.get("conversion") == zcdp_epsilon.ZCDP_BOUND)} '
                f'(worst client `{t["worst_client"]}`).')
  if report.declared is not None:
    d = report.declared
    md.append(f'- Under the declared schema ({d.participation}): sens^2 = '
              f'{d.sensitivity_squared:.6g}, rho = {d.rho:.6g}, epsilon '
              f'{epsilon_value(d.epsilon, d.epsilon_is_zcdp_bound)}'
              + (' (does NOT hold: the log violates it).'
                 if report.observed is not None and report.observed.violations else '.'))
  return md + ['']


def _accounting_markdown(report: report_lib.PrivacyReport) -> List[str]:
  """Section 5: sensitivity, rho, the (epsilon, delta) conversion and amplification."""
  g = report.guarantee
  exact = 'exact' if report.sensitivity_exact else 'an upper bound'
  return [
      '## 5. Accounting',
      f'- Squared sensitivity (clip norm 1) sens^2 = {g.sensitivity_squared:.10g}, {exact}: max '
      'over admissible patterns of ||C u||^2, composed across restart segments.',
      f'- rho-zCDP = sens^2 / (2 sigma^2) = {g.rho:.10g}.',
      f'- (epsilon, delta): {_CONVERSION_TEXT[g.conversion]} (dp_accounting '
      f'{DP_ACCOUNTING_VERSION}) on one Gaussian mechanism with noise '
      f'multiplier 1 / sqrt(2 rho): epsilon {"<=" if g.epsilon_is_zcdp_bound else "="} '
      f'{g.epsilon:.10g} at delta = {g.delta:g}.'
      + (f' The PLD is not used: {zcdp_epsilon.beyond_pld_text(g.rho)}.' if g.epsilon_is_zcdp_bound
         else ''),
      ('- No amplification by sampling is assumed.' if report.amplified is None else
       '- The figures above assume no amplification by sampling; they hold whatever the '
       f'sampling. With it: {amplified_text(report.amplified)} (BandMF paper Thm. 4, '
       'cyclic Poisson sampling: the groups are disjoint and fixed, round t samples group '
       't mod b-hat, every member independently with probability q).'),
      '- Transparency: computed with `python -m experiments.privacy_report` (dp_ftrl_tff).', '']


def _equal_privacy_markdown(report: report_lib.PrivacyReport) -> List[str]:
  """Section 6: every mechanism at this report's rho and participation."""
  g, table = report.guarantee, report.equal_privacy
  md = ['## 6. Mechanisms at equal privacy',
        f'Each mechanism with the noise multiplier that gives it this run\'s rho = {g.rho:.6g} '
        f'(epsilon {epsilon_value(g.epsilon, g.epsilon_is_zcdp_bound)} at delta = {g.delta:g}) '
        'under the same participation, one '
        'noise segment of n rounds, fixed clip. Losses are the std of the noise on the worst '
        '(MaxLoss) and the root-mean-square (RmsLoss) prefix sum of the SUM of clipped updates, in '
        'clip norms (divide by clients per round for the mean).', '',
        '| mechanism | noise multiplier | MaxLoss | RmsLoss | sens^2 | how |',
        '|---|---|---|---|---|---|']
  for row in table.rows:
    name = f'**{row_label(row)}**' if row.run_mechanism else row.mechanism
    sens = f'{row.sensitivity_squared:.6g}' + ('' if row.sensitivity_exact else ' (bound)')
    md.append(f'| {name} | {row.noise_multiplier:.6g} | {row.max_loss:.6g} | '
              f'{row.rms_loss:.6g} | {sens} | {row.source} |')
  md += [f'- Not compared: {s}.' for s in table.skipped] + ['']
  return md


#: Why an empirical figure is not a guarantee (report.md's empirical section).
EMPIRICAL_CAVEAT = (
    'An empirical figure is not a guarantee: it measures how well one particular test tells this '
    "run's seen canaries from unseen ones, so it can show that a run leaks more than accounted (a "
    'lower bound above the accounted epsilon), never that it leaks less (docs/auditing.md explains '
    'more).')


def _empirical_markdown(report: report_lib.PrivacyReport) -> List[str]:
  """The empirical privacy of the run's canaries beside the accounted epsilon, with its warnings."""
  g, rows = report.guarantee, report.empirical_privacy
  md = ['## Empirical privacy (canaries)',
        f'Accounted: **epsilon = {g.epsilon:.6g}** at delta = {g.delta:g} (section 5). Empirical, '
        'from the run\'s canary clients at the same delta, per threat model: certified lower '
        'bounds on epsilon (each method\'s own threshold choice; all of them hold together with '
        'the stated confidence), the one-shot estimate (two fitted Gaussians, no confidence) and '
        'what the membership attack measures (TPR at a fixed FPR, AUROC).', '',
        EMPIRICAL_CAVEAT, '']
  if not rows:
    return md + _findings_markdown(report.findings_of('empirical'))
  confidence = report_empirical.confidence_text(rows[0].confidence)
  each = report_empirical.confidence_text(rows[0].bounds[0].confidence)
  md += [f'**{report_empirical.best_text(rows, g.epsilon)}.**', '',
         f'Certified lower bounds at {confidence} confidence together (each at {each}: '
         f'Bonferroni over the {len(rows) * len(auditing.METHODS)} bounds):', '',
         '| threat model | seen / unseen | '
         + ' | '.join(report_empirical.METHOD_TEXT[m] for m in auditing.METHODS)
         + ' | estimate | TPR at FPR 0.1% / 1% / 10% | AUROC |',
         '|---|---|' + '---|' * (len(auditing.METHODS) + 3)]
  for row in rows:
    cells = [f'{b.epsilon:.4g}' + (' **(above accounted)**' if b.epsilon > g.epsilon else '')
             for b in row.bounds]
    tprs = ' / '.join(f'{tpr:.3g}' for _, tpr in row.tpr_at_fpr)
    md.append(f'| `{row.threat_model}` | {row.canaries_seen} / {row.canaries_unseen} | '
              + ' | '.join(cells) + f' | {row.epsilon:.4g} | {tprs} | {row.auroc:.4g} |')
  md += ['', '- Threat models:'] + [
      f'  - `{row.threat_model}`: {auditing.THREAT_MODEL_TEXT[row.threat_model]}' for row in rows]
  md += [f'- Methods (docs/auditing.md; counts of the `{rows[-1].threat_model}` row):'] + [
      f'  - {report_empirical.METHOD_TEXT[b.method]}: {b.threshold_choice}'
      + (f'; assumes: {b.assumption}' if b.assumption else '') for b in rows[-1].bounds]
  md.append('- A Gaussian-DP bound (one-run f-DP, GDP fit) certifies that the mechanism is not '
            'mu-GDP for a smaller mu; the accounted epsilon is that of one Gaussian mechanism, so '
            'such a bound above it contradicts the accountant as surely as the others.')
  md.append('')
  return md + _findings_markdown(report.findings_of('empirical'))
