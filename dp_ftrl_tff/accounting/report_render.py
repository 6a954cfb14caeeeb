"""Rendering of a privacy report: the JSON layout, the terminal summary, the markdown and the plots.

`to_dict` / `to_json` give report.json (`REQUIRED_KEYS` first: the CLI contract), `summary` a few
lines for a terminal, `to_markdown` the BLT paper's App. C checklist (after Ponomareva et al. 2023,
Sec. 5.3): DP setting, data accesses covered, final output, unit of privacy, adjacency, accounting
method, assumptions, formal statement. `write_plots` draws epsilon over rounds and epsilon versus
min_sep (with the exact Gaussian conversion: fast, within ~1e-7 of PLD) with matplotlib's Agg
backend, imported only when plotting; `write_report` writes them all into a directory.

The report itself (`report.PrivacyReport`) and its computation (`report.build_report`) know nothing
about these formats. Both `min_sep` = b (r2 - r1 >= b) and TF-Privacy's `min_separation` = b - 1
are printed.
"""

import dataclasses
import json
import os
from typing import List

import dp_accounting
import numpy as np

from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.accounting import zcdp
from dp_ftrl_tff.mechanisms import base
from dp_ftrl_tff.mechanisms import blt as blt_lib
from dp_ftrl_tff.mechanisms import gaussian as gaussian_lib
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.mechanisms import tree as tree_lib

#: Keys every `report.json` has (the CLI contract), in order.
REQUIRED_KEYS = ('mechanism', 'rounds', 'min_sep', 'min_separation', 'max_participations',
                 'sensitivity_squared', 'noise_multiplier', 'effective_noise_multiplier', 'rho',
                 'epsilon', 'delta')

PLOT_FILES = ('epsilon_over_rounds.png', 'epsilon_vs_min_sep.png')

_DP_ACCOUNTING_VERSION = getattr(dp_accounting, '__version__', '0.4.3')  # the pinned 0.4.3 has none


def to_dict(report: report_lib.PrivacyReport) -> dict:
  """JSON-ready dict: `REQUIRED_KEYS` first, then details."""
  g = report.guarantee
  out = {
      'mechanism': g.mechanism,
      'rounds': g.num_rounds,
      'min_sep': report.min_sep,
      'min_separation': g.participation.tf_privacy_min_separation,
      'max_participations': report.max_participations,
      'sensitivity_squared': g.sensitivity_squared,
      'noise_multiplier': g.noise_multiplier,
      'effective_noise_multiplier': g.effective_noise_multiplier,
      'rho': g.rho,
      'epsilon': g.epsilon,
      'delta': g.delta,
      'conversion': g.conversion,
      'fixed_epoch': g.participation.fixed_epoch,
      'participation_source': report.participation_source,
      'sensitivity_exact': report.sensitivity_exact,
      'restart_rounds': list(g.restart_rounds),
      'mechanism_config': report.mechanism_config,
      'clipped_count_stddev': report.clipped_count_stddev,
      'value_noise_multiplier': report.value_noise_multiplier,
      'calibration': report.calibration,
      'secure_aggregation': report.secure_aggregation,
      'declared': None if report.declared is None else _guarantee_dict(report.declared),
      'observed': None if report.observed is None else dataclasses.asdict(report.observed),
      'warnings': list(report.warnings),
      'dp_accounting_version': _DP_ACCOUNTING_VERSION,
  }
  if out['observed'] is not None:
    out['observed']['histogram'] = {str(k): v for k, v in report.observed.histogram.items()}
    out['observed']['violations'] = list(report.observed.violations)
  return out


def to_json(report: report_lib.PrivacyReport) -> str:
  """report.json's text: `to_dict`, indented."""
  return json.dumps(to_dict(report), indent=2, allow_nan=True)


def summary(report: report_lib.PrivacyReport) -> str:
  """A few lines for a terminal."""
  g = report.guarantee
  lines = [f'{g.mechanism}: n={g.num_rounds}, min_sep={report.min_sep} (min_separation='
           f'{g.participation.tf_privacy_min_separation}), max_participations={report.max_participations} '
           f'[{report.participation_source}], noise_multiplier={g.noise_multiplier:.6g}',
           f'  sens^2={g.sensitivity_squared:.6g}{"" if report.sensitivity_exact else " (upper bound)"}'
           f', effective noise multiplier={g.effective_noise_multiplier:.6g}',
           f'  rho-zCDP={g.rho:.6g}, (epsilon, delta)=({g.epsilon:.6g}, {g.delta:g}) by '
           f'{g.conversion.upper()}']
  if report.value_noise_multiplier is not None:
    lines.append(f'  adaptive clipping: model-sum noise multiplier z_Delta='
                 f'{report.value_noise_multiplier:.10g} (clipped-count std '
                 f'{report.clipped_count_stddev:g})')
  if report.secure_aggregation is not None:
    wraps = report.secure_aggregation['wrap_rounds']
    lines.append(f"  SecAgg: {report.secure_aggregation['bits']} bits, noise on the post-rounding "
                 f'clip, {len(wraps)} round(s) with a modular wrap')
  if report.observed is not None and report.observed.tree_patterns is not None:
    t = report.observed.tree_patterns
    lines.append(f'  observed patterns: sens^2={t["sensitivity_squared"]:.6g}, rho={t["rho"]:.6g}'
                 f', epsilon={t["epsilon"]:.6g}')
  lines.extend(f'  WARNING: {w}' for w in report.warnings)
  return '\n'.join(lines)


def to_markdown(report: report_lib.PrivacyReport) -> str:
  """The BLT paper's App. C checklist, filled in."""
  g = report.guarantee
  exact = 'exact' if report.sensitivity_exact else 'an upper bound'
  restarts = (', '.join(str(r) for r in g.restart_rounds) if g.restart_rounds else 'none')
  md = [f'# Privacy report: {g.mechanism}, {g.num_rounds} rounds', '']
  if report.warnings:
    md += ['> **WARNING**', '>'] + [f'> - {w}' for w in report.warnings] + ['']
  md += [
      '**Formal statement.** The training run satisfies '
      f'**rho-zCDP with rho = {g.rho:.6g}** and **(epsilon, delta)-DP with epsilon = '
      f'{g.epsilon:.6g}, delta = {g.delta:g}**, at the device (client) level, under the '
      'participation stated below.', '',
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
      '(a form of add/remove).', '',
      '## 3. Mechanism',
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
  if report.calibration is not None:
    (key, value), = report.calibration.items()
    md.append(f'- sigma was calibrated to meet {key} = {value:g}.')
  md += ['', '## 4. Participation',
         f'- Source: **{report.participation_source}**'
         + (' (realized in the participation log; Gboard-paper practice)'
            if report.participation_source == 'observed' else ' (enforced by the client sampler)'),
         f'- min_sep b = {report.min_sep}: two participations r1 < r2 of one client satisfy '
         f'r2 - r1 >= b; min_separation (rounds strictly between, TF-Privacy / Gboard MinS) = '
         f'{g.participation.tf_privacy_min_separation}.',
         f'- max_participations k = {report.max_participations} (effective: min(k, ceil(n / b)))'
         + ('; fixed-epoch schema.' if g.participation.fixed_epoch else '.')]
  if report.observed is not None:
    o = report.observed
    md += [f'- Log `{o.path}`: {o.num_rows} rows, {o.num_clients} clients, rounds 0..'
           f'{o.num_rounds - 1}; realized min_sep = {o.min_sep}, realized max participations = '
           f'{o.max_participations}.',
           f'- Participations per client: {o.histogram}.']
    if o.violations:
      md += ['- **The log VIOLATES the declared schema:**'] + [f'  - {v}' for v in o.violations]
      md.append('  The guarantee above is the one that holds for the realized participation.')
    if o.tree_patterns is not None:
      t = o.tree_patterns
      md.append(f'- Exact over the observed clients\' actual patterns (tree): sens^2 = '
                f'{t["sensitivity_squared"]:.6g}, rho = {t["rho"]:.6g}, epsilon = '
                f'{t["epsilon"]:.6g} (worst client `{t["worst_client"]}`).')
  if report.declared is not None:
    d = report.declared
    md.append(f'- Under the declared schema ({d.participation}): sens^2 = '
              f'{d.sensitivity_squared:.6g}, rho = {d.rho:.6g}, epsilon = {d.epsilon:.6g}'
              + (' (does NOT hold: the log violates it).'
                 if report.observed is not None and report.observed.violations else '.'))
  md += ['', '## 5. Accounting',
         f'- Squared sensitivity (clip norm 1) sens^2 = {g.sensitivity_squared:.10g}, {exact}: max '
         'over admissible patterns of ||C u||^2, composed across restart segments.',
         f'- rho-zCDP = sens^2 / (2 sigma^2) = {g.rho:.10g}.',
         f'- (epsilon, delta): {_CONVERSION_TEXT[g.conversion]} (dp_accounting '
         f'{_DP_ACCOUNTING_VERSION}) on one Gaussian mechanism with noise '
         f'multiplier 1 / sqrt(2 rho): epsilon = {g.epsilon:.10g} at delta = {g.delta:g}.',
         '- No amplification by sampling is assumed.',
         '- Transparency: computed with `python -m experiments.privacy_report` (dp_ftrl_tff).', '']
  return '\n'.join(md)


_CONVERSION_TEXT = {
    'pld': 'PLD accounting (add-or-remove, value discretization 1e-4)',
    'gaussian': 'the exact Gaussian tradeoff curve',
    'rdp': 'RDP with the Canonne-Kamath-Steinke conversion on TF-Privacy\'s orders',
}


def _guarantee_dict(g: zcdp.Guarantee) -> dict:
  return {'rounds': g.num_rounds, 'min_sep': g.participation.min_sep,
          'min_separation': g.participation.tf_privacy_min_separation,
          'max_participations': g.participation.effective_max_participations(g.num_rounds),
          'fixed_epoch': g.participation.fixed_epoch, 'sensitivity_squared': g.sensitivity_squared,
          'rho': g.rho, 'epsilon': g.epsilon, 'delta': g.delta}


def alternative_strategies(strategy: base.Strategy) -> dict:
  """{label: strategy}: this one plus DP-SGD, the efficient tree and the BLT paper's default BLT."""
  out = {f'{strategy.name} (this report)': strategy}
  for label, other in (('gaussian', gaussian_lib.GaussianStrategy()),
                       ('tree_efficient', tree_lib.TreeStrategy('efficient')),
                       ('blt (App. A, b=400)', blt_lib.PRODUCTION_STRATEGIES[400])):
    if other.name != strategy.name:
      out[label] = other
  return out


def _epsilon_curve(strategy, schema_for, xs, sigma, delta, restarts, rounds_for):
  values = []
  for x in xs:
    n = rounds_for(x)
    g = zcdp.guarantee(strategy, n, schema_for(x), sigma, delta,
                       restart_rounds=[r for r in restarts if r < n], conversion='gaussian')
    values.append(g.epsilon)
  return values


def write_plots(report: report_lib.PrivacyReport, strategy: base.Strategy, output_dir: str,
                num_points: int = 24) -> List[str]:
  """Writes `PLOT_FILES` into `output_dir`: epsilon over rounds, and epsilon versus min_sep for this
  mechanism and the alternatives at the same noise multiplier (exact Gaussian conversion)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  g = report.guarantee
  n, sigma, delta, restarts = g.num_rounds, g.noise_multiplier, g.delta, g.restart_rounds
  schema = g.participation
  os.makedirs(output_dir, exist_ok=True)
  paths = []

  rounds = np.unique(np.linspace(1, n, num_points).round().astype(int))
  eps = _epsilon_curve(strategy, lambda t: schema, rounds, sigma, delta, restarts, lambda t: int(t))
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(rounds, eps, marker='o', ms=3)
  ax.set_xlabel('rounds trained')
  ax.set_ylabel(f'epsilon (delta={delta:g})')
  ax.set_title(f'{g.mechanism}, sigma={sigma:.4g}, min_sep={schema.min_sep}, '
               f'k={schema.effective_max_participations(n)}')
  ax.grid(alpha=0.3)
  fig.tight_layout()
  paths.append(os.path.join(output_dir, PLOT_FILES[0]))
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)

  k = schema.max_participations
  low = max(1, n // 64)
  seps = np.unique(np.geomspace(low, n, num_points).round().astype(int))
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, other in alternative_strategies(strategy).items():
    if other.max_rounds is not None and other.max_rounds < n:
      continue
    eps = _epsilon_curve(
        other, lambda b: participation_lib.ParticipationSchema(int(b), k), seps, sigma, delta,
        restarts, lambda b: n)
    ax.plot(seps, eps, marker='o', ms=3, label=label)
  ax.axvline(schema.min_sep, color='gray', ls='--', lw=1, label=f'min_sep={schema.min_sep}')
  ax.set_xscale('log')
  ax.set_yscale('log')
  ax.set_xlabel('min_sep b (rounds)')
  ax.set_ylabel(f'epsilon (delta={delta:g})')
  ax.set_title(f'n={n}, sigma={sigma:.4g}, max_participations={k or "ceil(n/b)"}')
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize=8)
  fig.text(0.01, 0.01, 'Same noise multiplier for all; their errors differ (DP-SGD adds the most).',
           fontsize=7, color='gray')
  fig.tight_layout()
  paths.append(os.path.join(output_dir, PLOT_FILES[1]))
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)
  return paths


def write_report(report: report_lib.PrivacyReport, strategy: base.Strategy, output_dir: str,
                 plots: bool = True) -> List[str]:
  """Writes report.json, report.md and (optionally) the plots; returns the paths written."""
  if not isinstance(output_dir, str) or not output_dir:
    raise ValueError(f'`output_dir` must be a non-empty path, got {output_dir!r}.')
  os.makedirs(output_dir, exist_ok=True)
  paths = [os.path.join(output_dir, 'report.json'), os.path.join(output_dir, 'report.md')]
  with open(paths[0], 'w') as f:
    f.write(to_json(report) + '\n')
  with open(paths[1], 'w') as f:
    f.write(to_markdown(report))
  if plots:
    paths.extend(write_plots(report, strategy, output_dir))
  return paths
