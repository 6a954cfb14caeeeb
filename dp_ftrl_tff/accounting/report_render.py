"""Rendering of a privacy report: the JSON layout, the terminal summary, the markdown and the plots.

`to_dict` / `to_json` give report.json (`REQUIRED_KEYS` first: the CLI contract), `summary` a few
lines for a terminal, `to_markdown` report.md (`report_markdown`: the BLT paper's App. C checklist).
`write_plots` draws epsilon over rounds and epsilon versus min_sep of the run's mechanism (with the
exact Gaussian conversion: fast, within ~1e-7 of PLD) and, with an equal-privacy table, every
mechanism's MaxLoss against epsilon (`EQUAL_PRIVACY_PLOT`), with matplotlib's Agg backend, imported
only when plotting; `write_report` writes them all into a directory.

The report itself (`report.PrivacyReport`) and its computation (`report.build_report`) know nothing
about these formats. Both `min_sep` = b (r2 - r1 >= b) and TF-Privacy's `min_separation` = b - 1
are printed.
"""

import dataclasses
import json
import os
from typing import List

import numpy as np

from dp_ftrl_tff.accounting import amplification, report_markdown, zcdp
from dp_ftrl_tff.accounting import equal_privacy as equal_privacy_lib
from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.mechanisms import participation as participation_lib

#: Keys every `report.json` has (the CLI contract), in order.
REQUIRED_KEYS = ('mechanism', 'rounds', 'min_sep', 'min_separation', 'max_participations',
                 'sensitivity_squared', 'noise_multiplier', 'effective_noise_multiplier', 'rho',
                 'epsilon', 'delta')

PLOT_FILES = ('epsilon_over_rounds.png', 'epsilon_vs_min_sep.png')
#: Written besides `PLOT_FILES` when the report has an equal-privacy table.
EQUAL_PRIVACY_PLOT = 'equal_privacy.png'
to_markdown = report_markdown.to_markdown



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
      'dp_accounting_version': report_markdown.DP_ACCOUNTING_VERSION,
      'equal_privacy': (None if report.equal_privacy is None
                        else [dataclasses.asdict(row) for row in report.equal_privacy.rows]),
      'equal_privacy_skipped': (None if report.equal_privacy is None
                                else list(report.equal_privacy.skipped)),
      'strategy_file': report.strategy_file,
      'amplified': None if report.amplified is None else _amplified_dict(report.amplified),
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
  if report.amplified is not None:
    lines.append(f'  {report_markdown.amplified_text(report.amplified)}')
  lines.extend(f'  WARNING: {w}' for w in report.warnings)
  return '\n'.join(lines)


def _amplified_dict(a: amplification.AmplifiedGuarantee) -> dict:
  out = dataclasses.asdict(a)
  out['effective_noise_multiplier'] = a.effective_noise_multiplier
  return out


def _guarantee_dict(g: zcdp.Guarantee) -> dict:
  return {'rounds': g.num_rounds, 'min_sep': g.participation.min_sep,
          'min_separation': g.participation.tf_privacy_min_separation,
          'max_participations': g.participation.effective_max_participations(g.num_rounds),
          'fixed_epoch': g.participation.fixed_epoch, 'sensitivity_squared': g.sensitivity_squared,
          'rho': g.rho, 'epsilon': g.epsilon, 'delta': g.delta}


def _epsilon_curve(plan, schema_for, xs, rounds_for):
  """Epsilon (exact Gaussian conversion) of `plan` at each x: rounds_for(x) rounds under
  schema_for(x)."""
  return [zcdp.guarantee_for_plan(plan, rounds_for(x), schema_for(x), conversion='gaussian').epsilon
          for x in xs]


def write_plots(report: report_lib.PrivacyReport, output_dir: str,
                num_points: int = 24) -> List[str]:
  """Writes `PLOT_FILES` into `output_dir`: epsilon over rounds and epsilon versus min_sep of this
  mechanism (exact Gaussian conversion), and `EQUAL_PRIVACY_PLOT` when the report has an
  equal-privacy table."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  os.makedirs(output_dir, exist_ok=True)
  paths = [_write_rounds_plot(report, output_dir, num_points, plt),
           _write_min_sep_plot(report, output_dir, num_points, plt)]
  if report.equal_privacy is not None:
    paths.append(_write_equal_privacy_plot(report, output_dir, plt))
  return paths


def _write_rounds_plot(report: report_lib.PrivacyReport, output_dir: str, num_points: int,
                       plt) -> str:
  """Epsilon over the rounds trained, at the headline's participation."""
  g = report.guarantee
  n, schema = g.num_rounds, g.participation
  rounds = np.unique(np.linspace(1, n, num_points).round().astype(int))
  eps = _epsilon_curve(report.plan, lambda t: schema, rounds, int)
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(rounds, eps, marker='o', ms=3)
  ax.set_xlabel('rounds trained')
  ax.set_ylabel(f'epsilon (delta={g.delta:g})')
  ax.set_title(f'{g.mechanism}, sigma={g.noise_multiplier:.4g}, min_sep={schema.min_sep}, '
               f'k={schema.effective_max_participations(n)}')
  ax.grid(alpha=0.3)
  fig.tight_layout()
  path = os.path.join(output_dir, PLOT_FILES[0])
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _write_min_sep_plot(report: report_lib.PrivacyReport, output_dir: str, num_points: int,
                        plt) -> str:
  """Epsilon of the whole run against min_sep, at the headline's max participations."""
  g = report.guarantee
  n, schema = g.num_rounds, g.participation
  k = schema.max_participations
  low = max(1, n // 64)
  seps = np.unique(np.geomspace(low, n, num_points).round().astype(int))
  fig, ax = plt.subplots(figsize=(6, 4))
  eps = _epsilon_curve(report.plan,
                       lambda b: participation_lib.ParticipationSchema(int(b), k), seps,
                       lambda b: n)
  ax.plot(seps, eps, marker='o', ms=3, label=g.mechanism)
  ax.axvline(schema.min_sep, color='gray', ls='--', lw=1, label=f'min_sep={schema.min_sep}')
  ax.set_xscale('log')
  ax.set_yscale('log')
  ax.set_xlabel('min_sep b (rounds)')
  ax.set_ylabel(f'epsilon (delta={g.delta:g})')
  ax.set_title(f'n={n}, sigma={g.noise_multiplier:.4g}, max_participations={k or "ceil(n/b)"}')
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize=8)
  fig.tight_layout()
  path = os.path.join(output_dir, PLOT_FILES[1])
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _write_equal_privacy_plot(report: report_lib.PrivacyReport, output_dir: str, plt) -> str:
  """MaxLoss at equal privacy against epsilon (0.5 to 16), the run's mechanism highlighted."""
  g, table = report.guarantee, report.equal_privacy
  curves = equal_privacy_lib.loss_against_epsilon(table, g.delta)
  epsilons = equal_privacy_lib.DEFAULT_EPSILONS
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  for row in table.rows:
    style = (dict(lw=3, color='black', zorder=3) if row.run_mechanism else dict(lw=1, alpha=0.8))
    ax.plot(epsilons, curves[row.mechanism], marker='o', ms=3,
            label=report_markdown.row_label(row), **style)
  ax.axvline(g.epsilon, color='gray', ls='--', lw=1, label=f'this run: epsilon={g.epsilon:.3g}')
  ax.set_xscale('log')
  ax.set_yscale('log')
  ax.set_xlabel(f'epsilon (delta={g.delta:g})')
  ax.set_ylabel('MaxLoss at that epsilon (clip norms, on the sum)')
  k = table.participation.effective_max_participations(table.num_rounds)
  ax.set_title(f'Equal privacy: n={table.num_rounds}, min_sep={table.participation.min_sep}, k={k}')
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize=7, loc='lower left')  # the curves fall from top left to bottom right
  fig.tight_layout()
  path = os.path.join(output_dir, EQUAL_PRIVACY_PLOT)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def write_report(report: report_lib.PrivacyReport, output_dir: str,
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
    paths.extend(write_plots(report, output_dir))
  return paths
