"""Tests of the completion marker (dp_ftrl_tff/training/run_summary.py) and the runs table and plot
(experiments/sweeps/run_table.py, experiments/sweeps/summarize.py) on hand-written run directories."""

import csv
import os
import subprocess
import sys

import pytest
from matplotlib import figure

from dp_ftrl_tff.training import run_dir, run_summary
from experiments.sweeps import run_table

pytestmark = pytest.mark.unit


def _make_run(root, name, *, noise_multiplier, epsilon, mechanism='blt', rounds=3, accuracy=0.5,
              bound=False):
  """A finished run directory: metrics.csv with `rounds` rows, then its summary."""
  path = os.path.join(root, name)
  os.makedirs(path)
  with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['round', 'train_loss', 'train_accuracy', 'eval_accuracy', 'round_seconds'])
    for r in range(rounds):
      writer.writerow([r, 2.0 - r, 0.1 * r, accuracy if r == rounds - 1 else '', 1.5])
  hparams = {'experiment_name': name, 'root_output_dir': root, 'mechanism': mechanism,
             'noise_multiplier': noise_multiplier, 'clip_norm': 1.0, 'task': {'model': 'tiny'}}
  summary = run_summary.build_summary(
      path, rounds=rounds, hparams=hparams, accuracy_metric='accuracy',
      noise_multiplier=noise_multiplier, epsilon=epsilon, delta=None if epsilon is None else 1e-6,
      rho=None if epsilon is None else 0.1, epsilon_is_zcdp_bound=bound)
  run_summary.write_summary(path, summary)
  return path


def test_summary_reads_the_last_row_and_sums_round_times(tmp_path):
  path = _make_run(str(tmp_path), 'a', noise_multiplier=1.0, epsilon=3.0, rounds=3)
  document = run_summary.read_summary(path)
  assert document['final_metrics'] == {'train_loss': 0.0, 'train_accuracy': pytest.approx(0.2),
                                       'eval_accuracy': 0.5, 'round_seconds': 1.5}
  assert document['train_seconds'] == pytest.approx(4.5)  # 3 rounds x 1.5 s
  assert run_summary.is_complete(path)
  run_summary.remove_summary(path)
  assert not run_summary.is_complete(path)
  run_summary.remove_summary(path)  # no-op without one


def test_summary_refuses_a_log_missing_rounds_and_bad_guarantees(tmp_path):
  path = _make_run(str(tmp_path), 'a', noise_multiplier=1.0, epsilon=3.0, rounds=2)
  with pytest.raises(ValueError, match=r'no row for round\(s\) \[2\]'):
    run_summary.build_summary(path, rounds=3, hparams={}, accuracy_metric='accuracy',
                              noise_multiplier=1.0, epsilon=1.0, delta=1e-6, rho=0.1)
  with pytest.raises(ValueError, match='epsilon'):
    run_summary.build_summary(path, rounds=2, hparams={}, accuracy_metric='accuracy',
                              noise_multiplier=1.0, epsilon=float('nan'), delta=1e-6, rho=0.1)
  with pytest.raises(ValueError, match='together'):
    run_summary.build_summary(path, rounds=2, hparams={}, accuracy_metric='accuracy',
                              noise_multiplier=1.0, epsilon=None, delta=None, rho=0.1)


def test_corrupt_summary_is_named(tmp_path):
  path = _make_run(str(tmp_path), 'a', noise_multiplier=1.0, epsilon=3.0)
  with open(run_summary.summary_path(path), 'w') as f:
    f.write('{"format": 1')
  with pytest.raises(run_dir.CorruptRunFileError, match='summary.json'):
    run_summary.read_summary(path)


def test_table_columns_swept_settings_and_plot(tmp_path):
  root = str(tmp_path / 'sweep')
  _make_run(root, 'blt_1', noise_multiplier=1.0, epsilon=3.0, accuracy=0.6)
  _make_run(root, 'blt_2', noise_multiplier=2.0, epsilon=1.4, accuracy=0.4)
  _make_run(root, 'gauss_1', noise_multiplier=1.0, epsilon=5.0, mechanism='gaussian', accuracy=0.5)
  _make_run(root, 'nonoise', noise_multiplier=0.0, epsilon=None, accuracy=0.9)
  os.makedirs(os.path.join(root, 'unfinished'))
  open(os.path.join(root, 'unfinished', 'hparams.json'), 'w').close()
  runs = run_table.collect_runs(root)
  assert runs['unfinished'] == ['unfinished']
  table = run_table.build_table(runs['finished'])
  assert table['swept'] == ['mechanism', 'noise_multiplier']
  assert table['columns'] == ['run', 'mechanism', 'noise_multiplier', 'rounds', 'epsilon', 'delta',
                              'epsilon_is_zcdp_bound', 'accounted_noise_multiplier',
                              'eval_accuracy', 'train_accuracy', 'train_loss', 'train_seconds']
  png = str(tmp_path / 'plot.png')
  # The run without noise has no epsilon: it is left out of the plot.
  assert run_table.plot_accuracy_vs_epsilon(table, 'eval_accuracy', png) == 3
  with open(png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(ValueError, match='no finished run'):
    run_table.plot_accuracy_vs_epsilon(table, 'eval_loss', png)


def test_an_epsilon_that_is_the_zcdp_bound_is_flagged_in_the_table_and_plot(tmp_path):
  """A sweep's weak-noise point (rho above what the PLD holds) keeps its row: its epsilon is the
  zCDP bound, flagged in summary.json and the table's column, written '<= e' in the markdown and
  marked in the plot."""
  root = str(tmp_path / 'sweep')
  _make_run(root, 'weak', noise_multiplier=0.01, epsilon=9.6e5, accuracy=0.7, bound=True)
  _make_run(root, 'strong', noise_multiplier=1.0, epsilon=3.0, accuracy=0.5)
  _make_run(root, 'nonoise', noise_multiplier=0.0, epsilon=None, accuracy=0.9)
  finished = run_table.collect_runs(root)['finished']
  flags = {name: summary['epsilon_is_zcdp_bound'] for name, summary in finished}
  assert flags == {'nonoise': None, 'strong': False, 'weak': True}
  table = run_table.build_table(finished)
  assert {row['run']: row['epsilon_is_zcdp_bound'] for row in table['rows']} == flags
  markdown = tmp_path / 'runs.md'
  run_table.write_markdown(table, str(markdown))
  (weak,) = [line for line in markdown.read_text().splitlines() if line.startswith('| weak |')]
  assert '| <= 960000 | 1e-06 | True |' in weak
  saved = []
  savefig = figure.Figure.savefig
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(figure.Figure, 'savefig', lambda fig, *a, **k: (saved.append(fig),
                                                                   savefig(fig, *a, **k)))
    assert run_table.plot_accuracy_vs_epsilon(table, 'eval_accuracy',
                                              str(tmp_path / 'plot.png')) == 2
  (ax,) = saved[0].axes
  assert [t.get_text() for t in ax.get_legend().get_texts()] == [
      'runs', 'epsilon: upper bound from rho-zCDP']
  (marked,) = [line for line in ax.get_lines() if line.get_marker() == '<']
  assert list(marked.get_xdata()) == [9.6e5]


@pytest.mark.e2e
def test_summarize_binary_writes_csv_markdown_and_png(tmp_path):
  root = str(tmp_path / 'sweep')
  _make_run(root, 'a', noise_multiplier=1.0, epsilon=3.0, accuracy=0.6)
  _make_run(root, 'b', noise_multiplier=2.0, epsilon=1.4, accuracy=0.4)
  out = tmp_path / 'out'
  done = subprocess.run(
      [sys.executable, '-m', 'experiments.sweeps.summarize', root, f'--output_dir={out}'],
      capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr
  with open(out / 'runs.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  assert [r['run'] for r in rows] == ['a', 'b']
  assert [float(r['epsilon']) for r in rows] == [3.0, 1.4]
  assert [float(r['eval_accuracy']) for r in rows] == [0.6, 0.4]
  assert 'noise_multiplier' in rows[0] and 'train_seconds' in rows[0]
  assert (out / 'runs.md').read_text().startswith('| run | noise_multiplier |')
  assert (out / 'accuracy_vs_epsilon.png').stat().st_size > 1000
  (out / 'accuracy_vs_epsilon.png').unlink()
  done = subprocess.run([sys.executable, '-m', 'experiments.sweeps.summarize', root,
                         f'--output_dir={out}', '--metric=eval_accuracy'],
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr
  assert (out / 'accuracy_vs_epsilon.png').stat().st_size > 1000  # --metric plotted
  for args, code in (([str(tmp_path / 'missing')], 2), ([str(tmp_path / 'out')], 1),
                     ([root, '--metric=eval_nope'], 2)):
    done = subprocess.run([sys.executable, '-m', 'experiments.sweeps.summarize', *args],
                          capture_output=True, text=True, check=False)
    assert done.returncode == code, (args, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and 'error:' in done.stderr, done.stderr
