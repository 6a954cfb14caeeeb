"""The plots of a privacy report, drawn with matplotlib's Agg backend (imported only when plotting).

`write_plots` draws epsilon over rounds and epsilon versus min_sep of the run's mechanism (with the
exact Gaussian conversion: fast, within ~1e-7 of PLD) and, with an equal-privacy table, every
mechanism's MaxLoss against epsilon (`EQUAL_PRIVACY_PLOT`).
"""

import os
from typing import List

import numpy as np

from dp_ftrl_tff.accounting import equal_privacy as equal_privacy_lib
from dp_ftrl_tff.accounting import report as report_lib
from dp_ftrl_tff.accounting import zcdp
from dp_ftrl_tff.mechanisms import participation as participation_lib

PLOT_FILES = ('epsilon_over_rounds.png', 'epsilon_vs_min_sep.png')
EQUAL_PRIVACY_PLOT = 'equal_privacy.png'


def row_label(row: equal_privacy_lib.EqualPrivacyRow) -> str:
  """The row's mechanism, marked '(this run)' for the run's own one."""
  if not row.run_mechanism or row.mechanism.endswith('(this run)'):
    return row.mechanism
  return f'{row.mechanism} (this run)'


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
            label=row_label(row), **style)
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
