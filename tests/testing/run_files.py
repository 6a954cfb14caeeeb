"""Readers of a run directory's files for comparisons between runs (two runs of one command, a
killed and resumed run, a driver's report and the binary's)."""

import csv
import json
import os
import re

import numpy as np


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


def checkpoint_leaves(run, round_num=None) -> list:
  """The leaves of checkpoint `round_num` (default: the latest) of the run directory `run`:
  train_model's program state (model, optimizer, noise state, round, next evaluation time: None,
  the data source's iterator), the iterator decoded to (client ids, sampler kind, next round, log
  offset), since its bytes hold the log's absolute path."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from dp_ftrl_tff.programs import data_source  # pylint: disable=g-import-not-at-top
  checkpoints = os.path.join(run, 'checkpoints')
  if round_num is None:
    round_num = max(int(m.group(1)) for m in map(re.compile(r'program_state_(\d+)$').match,
                                                 os.listdir(checkpoints)) if m)
  value = tf.saved_model.load(os.path.join(checkpoints, f'program_state_{round_num}'))()
  leaves = []
  for leaf in tf.nest.flatten(value):
    leaf = None if leaf is None else np.asarray(leaf)
    if leaf is not None and leaf.dtype == object and leaf.item().startswith(b'DPFTRLIT'):
      iterator = data_source.SampledClientDataSourceIterator.from_bytes(leaf.item())
      leaf = (iterator.client_ids, iterator.sampler_kind, iterator.next_round, iterator.log_offset)
    leaves.append(leaf)
  return leaves


def assert_same_leaves(got: list, want: list) -> None:
  """`checkpoint_leaves` of two runs are equal, bit for bit."""
  assert len(got) == len(want)
  for a, b in zip(got, want, strict=True):
    if a is None or isinstance(a, tuple):
      assert a == b
    else:
      np.testing.assert_array_equal(a, b)


def assert_same_run(run, expected, rounds: int, logs=('participation.csv',)) -> None:
  """Run directory `run` ends as `expected` (an uninterrupted run of `rounds` rounds): the same
  last checkpoint bit for bit, metrics rows (but the wall clock), and bytes of each of `logs`; no
  checkpoint temp file left."""
  assert_same_leaves(checkpoint_leaves(run, rounds), checkpoint_leaves(expected, rounds))
  rows = metrics_rows(run)
  assert rows == metrics_rows(expected) and len(rows) == rounds
  for name in logs:
    assert (read_bytes(os.path.join(run, name))
            == read_bytes(os.path.join(expected, name))), name
  assert not [name for name in os.listdir(os.path.join(run, 'checkpoints')) if '_temp' in name]
