"""Readers of a run directory's files for comparisons between runs (two runs of one command, a
killed and resumed run, a driver and the example program, a driver's report and the binary's)."""

import csv
import json
import os


def metrics_rows(run):
  """metrics.csv rows as dicts of strings, without the wall-clock column `round_seconds`."""
  with open(os.path.join(run, 'metrics.csv'), newline='') as f:
    return [{k: v for k, v in row.items() if k != 'round_seconds'} for row in csv.DictReader(f)]


def read_bytes(path):
  with open(path, 'rb') as f:
    return f.read()


def masked_report(report: dict) -> dict:
  """The report with the participation log's path masked."""
  if report.get('observed'):
    report['observed']['path'] = '<log>'
  return report


def report_texts(report_dir, *roots) -> tuple:
  """(report.json, report.md) of `report_dir` as text, each of `roots` (directories whose paths the
  report may hold: the run's, the strategy file's) replaced by '<root i>'."""
  texts = []
  for name in ('report.json', 'report.md'):
    with open(os.path.join(report_dir, name)) as f:
      text = f.read()
    for i, root in enumerate(roots):
      text = text.replace(os.fspath(root), f'<root {i}>')
    texts.append(text)
  return tuple(texts)


def standalone_report(run_dir, out, *extra) -> dict:
  """The report of `experiments.privacy_report` (its `main`, in-process) on the run's plan and
  metrics, written to `out`; `extra` flags (e.g. `--participation_log=...`) are added."""
  from experiments import privacy_report
  privacy_report.FLAGS.unparse_flags()
  try:
    privacy_report.FLAGS(['privacy_report', f'--plan={run_dir}/plan.json',
                          f'--metrics={run_dir}/metrics.csv', f'--output_dir={out}', '--json',
                          *extra])
    assert privacy_report.main(['privacy_report']) == 0
  finally:
    privacy_report.FLAGS.unparse_flags()
  return json.loads((out / 'report.json').read_text())
