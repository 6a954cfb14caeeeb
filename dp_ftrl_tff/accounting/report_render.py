"""Rendering of a privacy report: the JSON layout, the terminal summary, the markdown and the plots.

`to_dict` / `to_json` give report.json (`REQUIRED_KEYS` first: the CLI contract; `conversion` says
how epsilon was computed, and `epsilon_is_zcdp_bound` is true when it is the zCDP conversion bound,
an upper bound from rho-zCDP rather than a tight PLD epsilon (rho above `zcdp_epsilon.MAX_RHO`);
`run_facts` states the run: noise seed, clip, sampler, cohorts; `empirical_privacy` the canary rows
(per threat model: the estimate, every certified bound with its confidence, TPR at FPR, AUROC), or
null without canaries, and `empirical_best_bound` the largest certified bound and its method, null
without rows; `findings` the sections' typed remarks, {'section', 'severity': 'warning' or 'note',
'text'}; then each registered section's data under its name), `summary` a few lines for a terminal
(one per empirical row, then the best certified bound), `to_markdown` report.md (`report_markdown`:
the BLT paper's App. C checklist).
`write_plots` draws epsilon over rounds and epsilon versus min_sep of the run's mechanism (with the
exact Gaussian conversion: fast, within ~1e-7 of PLD) and, with an equal-privacy table, every
mechanism's MaxLoss against epsilon (`EQUAL_PRIVACY_PLOT`), with matplotlib's Agg backend, imported
only when plotting; `write_report` writes them all into a directory. In every plot each line has its
own colour and marker from a fixed colour-blind-friendly cycle, legends sit right of the axes, round
axes have integer ticks and log axes plain-number labels.

The report itself (`report.PrivacyReport`) and its computation (`report.build_report`) know nothing
about these formats. Both `min_sep` = b (r2 - r1 >= b) and TF-Privacy's `min_separation` = b - 1
are printed.
"""

import dataclasses
import json
import os
from typing import List

import numpy as np

from dp_ftrl_tff import _atomic
from dp_ftrl_tff.accounting import (
  amplified_strategy,
  report_empirical,
  report_markdown,
  zcdp,
  zcdp_epsilon,
)
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
      'epsilon_is_zcdp_bound': g.epsilon_is_zcdp_bound,
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
      'findings': [f.to_dict() for f in report.findings],
      'dp_accounting_version': report_markdown.DP_ACCOUNTING_VERSION,
      'equal_privacy': (None if report.equal_privacy is None
                        else [dataclasses.asdict(row) for row in report.equal_privacy.rows]),
      'equal_privacy_skipped': (None if report.equal_privacy is None
                                else list(report.equal_privacy.skipped)),
      'strategy_file': report.strategy_file,
      'amplified': None if report.amplified is None else _amplified_dict(report.amplified),
      'run_facts': dataclasses.asdict(report.run_facts),
      'empirical_privacy': (None if report.empirical_privacy is None
                            else [row.to_dict() for row in report.empirical_privacy]),
      'empirical_best_bound': report_empirical.best_bound_dict(report.empirical_privacy or (),
                                                               g.epsilon),
  }
  for section, data in report.sections:
    if section.name in out:
      raise ValueError(f'`report`: the registered section {section.name!r} has the name of a key '
                       'of report.json.')
    out[section.name] = data
  if out['observed'] is not None:
    out['observed']['histogram'] = {str(k): v for k, v in report.observed.histogram.items()}
    out['observed']['violations'] = list(report.observed.violations)
  return out


def to_json(report: report_lib.PrivacyReport) -> str:
  """report.json's text: `to_dict`, indented."""
  return json.dumps(to_dict(report), indent=2, allow_nan=True)


def summary(report: report_lib.PrivacyReport, warnings: bool = True) -> str:
  """A few lines for a terminal; the report's warnings last unless `warnings` is False (the
  binaries print them on stderr)."""
  g = report.guarantee
  separation = ('no client participated twice yet' if report.no_client_participated_twice else
                f'min_sep={report.min_sep} (min_separation='
                f'{g.participation.tf_privacy_min_separation})')
  lines = [f'{g.mechanism}: n={g.num_rounds}, {separation}, max_participations='
           f'{report.max_participations} [{report.participation_source}], noise_multiplier='
           f'{g.noise_multiplier:.6g}',
           f'  sens^2={g.sensitivity_squared:.6g}{"" if report.sensitivity_exact else " (upper bound)"}'
           f', effective noise multiplier={g.effective_noise_multiplier:.6g}',
           f'  rho-zCDP={g.rho:.6g}, {epsilon_text(g)}']
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
                 f', epsilon={"<= " if t.get("conversion") == zcdp_epsilon.ZCDP_BOUND else ""}'
                f'{t["epsilon"]:.6g}')
  if report.amplified is not None:
    lines.append(f'  {report_markdown.amplified_text(report.amplified)}')
  for row in report.empirical_privacy or ():
    lines.append(f'  {report_markdown.empirical_text(row, g.epsilon)}')
  if report.empirical_privacy:
    lines.append(f'  {report_empirical.best_text(report.empirical_privacy, g.epsilon)}')
  lines.extend(f'  note: {n}' for n in report.notes)
  if warnings:
    lines.extend(f'  WARNING: {w}' for w in report.warnings)
  return '\n'.join(lines)


def epsilon_text(g: zcdp.Guarantee) -> str:
  """'(epsilon, delta)=(e, d) by PLD', or for the zCDP bound '(epsilon, delta)=(<= e, d): an
  UPPER BOUND from rho-zCDP, not a tight PLD epsilon'."""
  if g.epsilon_is_zcdp_bound:
    return (f'(epsilon, delta)=(<= {g.epsilon:.6g}, {g.delta:g}): an UPPER BOUND from rho-zCDP '
            f'(zCDP conversion bound; rho above the PLD\'s {zcdp_epsilon.MAX_RHO:g}), '
            'not a tight PLD epsilon')
  return f'(epsilon, delta)=({g.epsilon:.6g}, {g.delta:g}) by {g.conversion.upper()}'


def _amplified_dict(a: amplified_strategy.AmplifiedGuarantee) -> dict:
  out = dataclasses.asdict(a)
  out['effective_noise_multiplier'] = a.effective_noise_multiplier
  return out


def _guarantee_dict(g: zcdp.Guarantee) -> dict:
  return {'rounds': g.num_rounds, 'min_sep': g.participation.min_sep,
          'min_separation': g.participation.tf_privacy_min_separation,
          'max_participations': g.participation.effective_max_participations(g.num_rounds),
          'fixed_epoch': g.participation.fixed_epoch, 'sensitivity_squared': g.sensitivity_squared,
          'rho': g.rho, 'epsilon': g.epsilon, 'delta': g.delta, 'conversion': g.conversion,
          'epsilon_is_zcdp_bound': g.epsilon_is_zcdp_bound}


def _epsilon_curve(plan, schema_for, xs, rounds_for):
  """Epsilon (exact Gaussian conversion) of `plan` at each x: rounds_for(x) rounds under
  schema_for(x); where its rho exceeds `zcdp_epsilon.MAX_RHO` (e.g. a min_sep far below the run's),
  the zCDP bound the report states there (`zcdp.guarantee_for_plan`), an upper bound."""
  return [zcdp.guarantee_for_plan(plan, rounds_for(x), schema_for(x), conversion='gaussian').epsilon
          for x in xs]


#: A fixed, colour-blind-friendly cycle (Paul Tol's "muted" scheme, then black) and the markers that
#: go with it: line i gets colour i mod 10 and marker i mod 11, so the first 110 (colour, marker)
#: pairs are distinct, and so are the colours of the first 10 lines and the markers of the first 11.
_COLORS = ('#332288', '#DDCC77', '#44AA99', '#CC6677', '#88CCEE', '#882255', '#117733',
           '#AA4499', '#999933', '#000000')
_MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '<', 'h', '>', 'p')
#: Major-tick mantissas tried on a log axis, coarsest first (see `_label_log_axis`).
_LOG_SUBS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0))
_REFERENCE_LINE = dict(color='gray', ls='--', lw=1, zorder=0)


def _line_style(i: int) -> dict:
  """Colour and (white-filled) marker of the i-th line of a plot, from the fixed cycle."""
  return dict(color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)], ms=6,
              mfc='white', mew=1.5, lw=1.3)


def _log_ticks(lo: float, hi: float, subs) -> List[float]:
  """The values s * 10^k (s in `subs`) in [lo, hi]."""
  decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
  ticks = (float(f'{s * 10.0**k:.12g}') for k in decades for s in subs)
  return [t for t in ticks if lo <= t <= hi]


def _label_log_axis(ax, which: str, integer: bool = False) -> None:
  """Plain-number labels ('0.5', '20', '2000') on the log axis `which` ('x' or 'y') of `ax`.

  The major ticks are the coarsest of `_LOG_SUBS` that puts at least four of them in the axis' limits
  (so a short axis is labelled up to its top too); `integer` keeps only whole numbers (an axis in
  rounds). Minor ticks keep their marks but lose matplotlib's '2x10^0' labels. Call it once the data
  are plotted: it reads the limits.
  """
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  lo, hi = sorted(ax.get_xlim() if which == 'x' else ax.get_ylim())
  for subs in _LOG_SUBS:
    ticks = [t for t in _log_ticks(lo, hi, subs) if not integer or t == round(t)]
    if len(ticks) >= 4:
      break
  if len(ticks) < 2:  # less than a factor 2 between the limits: a linear choice of a few ticks
    ticks = [t for t in ticker.MaxNLocator(nbins=4, integer=integer).tick_values(lo, hi)
             if lo <= t <= hi and t > 0]
  axis = ax.xaxis if which == 'x' else ax.yaxis
  axis.set_major_locator(ticker.FixedLocator(ticks))
  axis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f'{x:g}'))
  axis.set_minor_formatter(ticker.NullFormatter())


def _legend_outside(ax, handles=None, labels=None, **kwargs):
  """The legend to the right of the axes, off the data (saved whole by `_save`'s tight bbox)."""
  if handles is None:
    handles, labels = ax.get_legend_handles_labels()
  return ax.legend(handles, labels, loc='upper left', bbox_to_anchor=(1.02, 1.0),
                   borderaxespad=0.0, fontsize=8, **kwargs)


def _save(fig, output_dir: str, name: str, plt) -> str:
  """Writes `fig` as `output_dir/name`, legend included (`bbox_inches='tight'`), and closes it. An
  OSError (a full disk) names the file."""
  path = os.path.join(output_dir, name)
  with _atomic.naming(path):
    fig.savefig(path, dpi=100, bbox_inches='tight')
  plt.close(fig)
  return path


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
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  g = report.guarantee
  n, schema = g.num_rounds, g.participation
  rounds = np.unique(np.linspace(1, n, num_points).round().astype(int))
  eps = _epsilon_curve(report.plan, lambda t: schema, rounds, int)
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(rounds, eps, **_line_style(0))
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  ax.set_xlabel('rounds n (trained so far)')
  ax.set_ylabel(f'epsilon (delta={g.delta:g})')
  ax.set_title(f'{g.mechanism}, sigma={g.noise_multiplier:.4g}, min_sep={schema.min_sep}, '
               f'k={schema.effective_max_participations(n)}')
  ax.grid(alpha=0.3)
  return _save(fig, output_dir, PLOT_FILES[0], plt)


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
  ax.plot(seps, eps, label=g.mechanism, **_line_style(0))
  ax.axvline(schema.min_sep, label=f'this run: min_sep={schema.min_sep}', **_REFERENCE_LINE)
  ax.set_xscale('log')
  ax.set_yscale('log')
  _label_log_axis(ax, 'x', integer=True)
  _label_log_axis(ax, 'y')
  ax.set_xlabel('min_sep b (rounds)')
  ax.set_ylabel(f'epsilon (delta={g.delta:g})')
  ax.set_title(f'n={n}, sigma={g.noise_multiplier:.4g}, max_participations={k or "ceil(n/b)"}')
  ax.grid(alpha=0.3, which='both')
  _legend_outside(ax)
  return _save(fig, output_dir, PLOT_FILES[1], plt)


def _write_equal_privacy_plot(report: report_lib.PrivacyReport, output_dir: str, plt) -> str:
  """MaxLoss at equal privacy against epsilon (0.5 to 16), the run's mechanism highlighted.

  Rows often nearly coincide (banded and BLT): each has its own colour and marker, its markers at
  points no other row marks, drawn above every line; the run's row has its own too, drawn beneath
  the others on a wide translucent band (so it hides none). The legend gives each row's MaxLoss at
  the run's epsilon, which tells coinciding rows apart.
  """
  g, table = report.guarantee, report.equal_privacy
  curves = equal_privacy_lib.loss_against_epsilon(table, g.delta)
  epsilons = equal_privacy_lib.DEFAULT_EPSILONS
  fig, ax = plt.subplots(figsize=(6, 4.5))
  handles, labels = [], []
  # Row i marks points i, i + step, ...: rows that coincide (banded, BLT) show their markers side
  # by side, above all lines, instead of on top of each other.
  step = max(1, min(len(table.rows), len(epsilons)))
  for i, row in enumerate(table.rows):
    style, curve = _line_style(i), curves[row.mechanism]
    handle = (ax.plot(epsilons, curve, color=style['color'], lw=style['lw'],
                      zorder=1.5 if row.run_mechanism else 2)[0],
              ax.plot(epsilons, curve, ls='none', markevery=(i % step, step), zorder=3,
                      **style)[0])
    if row.run_mechanism:
      handle = (ax.plot(epsilons, curve, color='black', lw=7, alpha=0.2, solid_capstyle='round',
                        zorder=1)[0],) + handle
    handles.append(handle)
    labels.append(f'{report_markdown.row_label(row)}: {row.max_loss:.4g}')
  handles.append(ax.axvline(g.epsilon, **_REFERENCE_LINE))
  labels.append(f'this run: epsilon={"<= " if g.epsilon_is_zcdp_bound else ""}{g.epsilon:.3g}')
  ax.set_xscale('log')
  ax.set_yscale('log')
  _label_log_axis(ax, 'x')
  _label_log_axis(ax, 'y')
  ax.set_xlabel(f'epsilon (delta={g.delta:g})')
  ax.set_ylabel('MaxLoss at that epsilon (clip norms, on the sum)')
  k = table.participation.effective_max_participations(table.num_rounds)
  ax.set_title(f'Equal privacy: n={table.num_rounds}, min_sep={table.participation.min_sep}, k={k}')
  ax.grid(alpha=0.3, which='both')
  # A handle's artists (band, line, markers) are drawn overlaid (matplotlib's default HandlerTuple).
  _legend_outside(ax, handles, labels, title=f'MaxLoss at epsilon={g.epsilon:.3g}',
                  title_fontsize=8)
  return _save(fig, output_dir, EQUAL_PRIVACY_PLOT, plt)


def write_report(report: report_lib.PrivacyReport, output_dir: str,
                 plots: bool = True) -> List[str]:
  """Writes report.json and report.md atomically (a failed write, e.g. on a full disk, leaves the
  file as it was and names it) and (optionally) the plots; returns the paths written."""
  if not isinstance(output_dir, str) or not output_dir:
    raise ValueError(f'`output_dir` must be a non-empty path, got {output_dir!r}.')
  os.makedirs(output_dir, exist_ok=True)
  paths = [os.path.join(output_dir, 'report.json'), os.path.join(output_dir, 'report.md')]
  _atomic.write_text(paths[0], to_json(report) + '\n')
  _atomic.write_text(paths[1], to_markdown(report))
  if plots:
    paths.extend(write_plots(report, output_dir))
  return paths
