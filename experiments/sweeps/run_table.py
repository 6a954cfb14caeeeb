"""The table of the finished runs under one root (a sweep's), and its accuracy-vs-epsilon plot.

`collect_runs(root)` reads the `summary.json` (`dp_ftrl_tff.training.run_summary`) of every run directory
directly under `root`. `build_table(runs)` makes one row per run with the columns:
  * `run`: the run directory's name;
  * the swept hyperparameters: the `hparams.json` settings whose values differ between the runs
    (the driver's own settings as `task/<name>`; `experiment_name` and `root_output_dir` left out);
  * `rounds`, `epsilon`, `delta` (the privacy report's headline: observed participation, no
    amplification; empty without noise), `epsilon_is_zcdp_bound` (true when that epsilon is the
    zCDP conversion bound, an upper bound from rho-zCDP beyond what the PLD holds; the markdown
    writes such an epsilon '<= e' and the plot marks it), `accounted_noise_multiplier` (sigma
    relative to the clip, calibrated when the run gave `target_epsilon`);
  * the final metrics: every `eval_*`, `train_loss` and the task's training accuracy;
  * `train_seconds`: the sum of the rounds' wall times.
`write_csv`, `write_markdown` and `plot_accuracy_vs_epsilon` (matplotlib's Agg backend: a PNG
without a display) write it. Imports no TensorFlow.
"""

import csv
import os
from typing import Any, Dict, List, Optional, Sequence

from dp_ftrl_tff.training import run_summary

_NOT_SWEPT = ('experiment_name', 'root_output_dir')
#: Settings that set the noise: the plot's x axis varies through them, so they do not split series.
_NOISE_SETTINGS = ('noise_multiplier', 'target_epsilon')


def _flatten(document: Dict[str, Any], prefix: str = '') -> Dict[str, Any]:
  flat = {}
  for key, value in document.items():
    if isinstance(value, dict):
      flat.update(_flatten(value, f'{prefix}{key}/'))
    else:
      flat[prefix + key] = value
  return flat


def collect_runs(root: str) -> Dict[str, List[Any]]:
  """{'finished': [(name, summary document)], 'unfinished': [names]} of the run directories
  directly under `root` (a directory with `hparams.json`), sorted by name.

  Raises:
    ValueError: `root` is not a directory.
  """
  if not os.path.isdir(root):
    raise ValueError(f'`root` {root!r} is not a directory.')
  finished, unfinished = [], []
  for name in sorted(os.listdir(root)):
    path = os.path.join(root, name)
    if run_summary.is_complete(path):
      finished.append((name, run_summary.read_summary(path)))
    elif os.path.isfile(os.path.join(path, 'hparams.json')):
      unfinished.append(name)
  return {'finished': finished, 'unfinished': unfinished}


def swept_hparams(runs: Sequence) -> List[str]:
  """The flattened hparams whose values differ between `runs` ((name, summary) pairs), sorted."""
  flats = [_flatten(summary['hparams']) for _, summary in runs]
  keys = sorted(set().union(*flats)) if flats else []
  return [key for key in keys if key not in _NOT_SWEPT
          and len({repr(flat.get(key)) for flat in flats}) > 1]


def metric_columns(runs: Sequence) -> List[str]:
  """The final-metric columns: every `eval_*`, `train_loss`, and `train_<accuracy metric>`."""
  names = set()
  for _, summary in runs:
    accuracy = f'train_{summary.get("accuracy_metric", "accuracy")}'
    names.update(name for name in summary['final_metrics']
                 if name.startswith('eval_') or name in ('train_loss', accuracy))
  return sorted(names)


def build_table(runs: Sequence) -> Dict[str, Any]:
  """{'columns': [...], 'rows': [{column: value}], 'swept': [...]} of `runs` (module docstring)."""
  swept = swept_hparams(runs)
  metrics = metric_columns(runs)
  columns = ['run', *swept, 'rounds', 'epsilon', 'delta', 'epsilon_is_zcdp_bound',
             'accounted_noise_multiplier', *metrics, 'train_seconds']
  rows = []
  for name, summary in runs:
    flat = _flatten(summary['hparams'])
    row = {'run': name, **{key: flat.get(key) for key in swept}}
    row.update({key: summary.get(key) for key in ('rounds', 'epsilon', 'delta',
                                                  'epsilon_is_zcdp_bound', 'train_seconds')})
    row['accounted_noise_multiplier'] = summary.get('noise_multiplier')
    row.update({key: summary['final_metrics'].get(key) for key in metrics})
    rows.append(row)
  return {'columns': columns, 'rows': rows, 'swept': swept}


def _text(value) -> str:
  if value is None:
    return ''
  if isinstance(value, float):
    return f'{value:.6g}'
  return str(value)


def _cell(row: Dict[str, Any], column: str) -> str:
  """A markdown cell: an epsilon that is the zCDP bound reads '<= e' (an upper bound)."""
  text = _text(row.get(column))
  return f'<= {text}' if column == 'epsilon' and row.get('epsilon_is_zcdp_bound') else text


def write_csv(table: Dict[str, Any], path: str) -> None:
  """The table as CSV (full float precision; empty cells for missing values)."""
  with open(path, 'w', newline='', encoding='utf-8') as f:
    writer = csv.writer(f)
    writer.writerow(table['columns'])
    for row in table['rows']:
      writer.writerow(['' if row.get(c) is None else row.get(c) for c in table['columns']])


def write_markdown(table: Dict[str, Any], path: str, note: str = '') -> None:
  """The table as a markdown table (6 significant digits), with an optional note below it."""
  lines = ['| ' + ' | '.join(table['columns']) + ' |',
           '|' + '|'.join('---' for _ in table['columns']) + '|']
  for row in table['rows']:
    lines.append('| ' + ' | '.join(_cell(row, c).replace('|', '\\|')
                                   for c in table['columns']) + ' |')
  if note:
    lines += ['', note]
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')


def plot_accuracy_vs_epsilon(table: Dict[str, Any], metric: str, path: str) -> Optional[int]:
  """Plots `metric` against epsilon, one line per combination of the swept settings other than the
  noise's; writes a PNG to `path`. Returns the number of points plotted; runs without a guarantee
  (no noise) or without `metric` are left out.

  Raises:
    ValueError: no run has both an epsilon and `metric`.
  """
  import matplotlib
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt

  series_keys = [key for key in table['swept'] if key not in _NOISE_SETTINGS]
  series = {}
  for row in table['rows']:
    if row.get('epsilon') is None or row.get(metric) is None:
      continue
    label = ', '.join(f'{key}={_text(row.get(key))}' for key in series_keys) or 'runs'
    series.setdefault(label, []).append((row['epsilon'], row[metric]))
  count = sum(len(points) for points in series.values())
  if not count:
    raise ValueError(f'no finished run has both an epsilon and the metric `{metric}`.')
  figure, axes = plt.subplots(figsize=(6.4, 4.4))
  epsilons = []
  for label, points in sorted(series.items()):
    points.sort()
    epsilons += [e for e, _ in points]
    axes.plot([e for e, _ in points], [v for _, v in points], marker='o', label=label)
  bounds = [(r['epsilon'], r[metric]) for r in table['rows'] if r.get('epsilon_is_zcdp_bound')
            and r.get('epsilon') is not None and r.get(metric) is not None]
  if bounds:  # an epsilon that is only an upper bound: the true point lies to its left
    axes.plot([e for e, _ in bounds], [v for _, v in bounds], ls='none', marker='<', ms=11,
              mfc='none', color='black', label='epsilon: upper bound from rho-zCDP')
  if min(epsilons) > 0 and max(epsilons) / min(epsilons) > 10:
    axes.set_xscale('log')
  delta = next((r['delta'] for r in table['rows'] if r.get('delta') is not None), None)
  axes.set_xlabel('epsilon' + ('' if delta is None else f' (delta={delta:g}, observed '
                                                        'participation, no amplification)'))
  axes.set_ylabel(metric)
  axes.set_title(f'{metric} vs epsilon ({count} runs)')
  axes.grid(True, alpha=0.3)
  if len(series) > 1 or series_keys or bounds:
    axes.legend(fontsize='small')
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  plt.close(figure)
  return count


def default_metric(runs: Sequence) -> str:
  """`eval_<accuracy metric>` of the first run (`eval_accuracy` for EMNIST)."""
  accuracy = runs[0][1].get('accuracy_metric', 'accuracy') if runs else 'accuracy'
  return f'eval_{accuracy}'
