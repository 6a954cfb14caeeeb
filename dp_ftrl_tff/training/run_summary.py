"""A finished run's summary, `summary.json`: the run directory's completion marker.

A driver writes `<run directory>/summary.json` atomically (`dp_ftrl_tff._atomic`) as its very last
step, after the final checkpoint and the privacy report; its presence means the run trained all of
its `rounds`. A run that starts training more rounds (a resume, or a resume with a larger `--rounds`)
removes it first, so a directory holding it is complete for the `rounds` it names.
`experiments.sweeps.run_sweep` skips the points whose directory holds it;
`experiments.sweeps.summarize` tabulates it.

The document (format 1), all numbers as JSON numbers:
  * `rounds`: n, the number of rounds trained;
  * `final_metrics`: the last round's row of `metrics.csv` (`train_*`, `eval_*` after the final
    evaluation, `aggregator/*`, `round_seconds`), without its `round` key;
  * `accuracy_metric`: the name of the task's accuracy metric (`eval_<it>` is the test accuracy);
  * `train_seconds`: the sum of the per-round wall times (`round_seconds`) of all n rounds, over
    every process that trained a part of the run (evaluations included; setup and the time
    between an interruption and its resume excluded);
  * `epsilon`, `delta`, `rho`: the privacy report's headline guarantee (observed participation, no
    amplification), or null without noise (noise multiplier 0: no DP guarantee);
  * `epsilon_is_zcdp_bound`: true when `epsilon` is the zCDP conversion bound (an upper bound from
    rho-zCDP, not a tight PLD epsilon: rho above `zcdp_epsilon.MAX_RHO`), false otherwise, null
    without noise;
  * `noise_multiplier`: the accounted noise multiplier sigma (relative to the clip norm; calibrated
    when the run gave `target_epsilon`);
  * `hparams`: the run's `hparams.json` document.
Beside it, `write_hparams_summary` writes the TensorBoard HParams session of the run into its
`tensorboard/` directory (next to the per-round scalars of `tff.program.TensorBoardReleaseManager`),
with the HParams plugin's API (`tensorboard.plugins.hparams.api.hparams`), so TensorBoard's HParams
tab compares runs:
  * the session's hyperparameters: every setting of `hparams.json` (the driver's own settings as
    `task/<name>`; unset optional settings, null in the file, are left out), plus the accounted
    `noise_multiplier` under `accounted_noise_multiplier`;
  * the final metrics as scalars `final/<metric>` at step n (rounds): the last round's metrics and
    `final/epsilon` (absent without noise), which the HParams tab lists as metric columns.
`tensorboard --logdir=<root_output_dir>` then shows one session per run directory. No experiment
config (`hparams_config`) is written: TensorBoard infers the hyperparameters and metrics from the
sessions, so runs of different drivers under one root still compare.
Imports TensorFlow only to write the HParams session (the sweeps read summaries without it).
"""

import csv
import json
import math
import os
from typing import Any, Dict, Optional

from dp_ftrl_tff import _atomic
from dp_ftrl_tff.training import run_dir

SUMMARY_FILE = 'summary.json'
TENSORBOARD_DIR = 'tensorboard'
FINAL_PREFIX = 'final/'
FORMAT = 1
_REMEDY = ('delete it and rerun the same command: the run rewrites it from its last checkpoint '
           'without training again.')


def summary_path(output_dir: str) -> str:
  """The path of the summary in the run directory `output_dir`."""
  return os.path.join(os.fspath(output_dir), SUMMARY_FILE)


def is_complete(output_dir: str) -> bool:
  """Whether the run directory `output_dir` holds a finished run (its summary exists)."""
  return os.path.isfile(summary_path(output_dir))


def remove_summary(output_dir: str) -> None:
  """Removes the completion marker before a run trains more rounds (no-op without one)."""
  try:
    os.remove(summary_path(output_dir))
  except FileNotFoundError:
    pass


def final_metrics_from_csv(metrics_csv: str, rounds: int) -> Dict[str, Any]:
  """(last round's metrics, the sum of `round_seconds` over rounds 0..rounds-1) of `metrics.csv`.

  Raises:
    ValueError: the log lacks a row of one of the `rounds` rounds (0-based), naming the file.
  """
  if not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f'`rounds` must be a positive integer, got {rounds!r}.')
  rows = {}
  with open(metrics_csv, newline='', encoding='utf-8') as f:
    for row in csv.DictReader(f):
      rows[int(row['round'])] = row
  missing = [r for r in range(rounds) if r not in rows]
  if missing:
    raise ValueError(f'{metrics_csv} has no row for round(s) {missing[:5]} of the {rounds} rounds.')
  last = {name: _number(value) for name, value in rows[rounds - 1].items()
          if name != 'round' and value not in ('', None)}
  seconds = sum(float(rows[r].get('round_seconds') or 0.0) for r in range(rounds))
  return {'final_metrics': last, 'train_seconds': seconds}


def _number(text) -> Optional[float]:
  value = float(text)
  return value if math.isfinite(value) else None  # JSON has no inf / nan


def build_summary(output_dir: str, *, rounds: int, hparams: Dict[str, Any], accuracy_metric: str,
                  noise_multiplier: float, epsilon: Optional[float], delta: Optional[float],
                  rho: Optional[float], epsilon_is_zcdp_bound: bool = False) -> Dict[str, Any]:
  """The summary document of the run in `output_dir` (final metrics and per-round times read from
  its `metrics.csv`), not yet written; `epsilon_is_zcdp_bound` says `epsilon` is the zCDP bound.

  Raises:
    ValueError: `metrics.csv` lacks one of the `rounds` rounds, or a bad argument (named).
  """
  if not isinstance(hparams, dict):
    raise ValueError(f'`hparams` must be a dict, got {type(hparams).__name__}.')
  if (epsilon is None) != (rho is None):
    raise ValueError('`epsilon` and `rho` must be given together (or both None without noise).')
  if epsilon is not None and not epsilon >= 0:  # never write a NaN epsilon as a guarantee
    raise ValueError(f'`epsilon` must be a non-negative number, got {epsilon!r}.')
  return {'format': FORMAT, 'rounds': rounds, 'accuracy_metric': accuracy_metric,
          **final_metrics_from_csv(os.path.join(output_dir, 'metrics.csv'), rounds),
          'epsilon': None if epsilon is None else float(epsilon),
          'delta': None if delta is None else float(delta),
          'rho': None if rho is None else float(rho),
          'epsilon_is_zcdp_bound': None if epsilon is None else bool(epsilon_is_zcdp_bound),
          'noise_multiplier': float(noise_multiplier), 'hparams': hparams}


def write_summary(output_dir: str, summary: Dict[str, Any]) -> str:
  """Writes the `summary` document (`build_summary`) atomically as `output_dir`'s completion
  marker; returns its path."""
  if not isinstance(summary, dict) or summary.get('format') != FORMAT:
    raise ValueError(f'`summary` must be a format-{FORMAT} document from build_summary.')
  path = summary_path(output_dir)
  _atomic.write_text(path, json.dumps(summary, indent=2, sort_keys=True) + '\n')
  return path


def read_summary(output_dir: str) -> Dict[str, Any]:
  """The summary document of the finished run in `output_dir`.

  Raises:
    FileNotFoundError: the run has not finished (no summary).
    run_dir.CorruptRunFileError: the summary is not a format-1 JSON object.
  """
  path = summary_path(output_dir)
  document = run_dir.read_json(path, _REMEDY)
  if not isinstance(document, dict) or document.get('format') != FORMAT:
    raise run_dir.corrupt_file_error(path, f'not a format-{FORMAT} summary', _REMEDY)
  return document


def flat_hparams(hparams: Dict[str, Any], accounted_noise_multiplier: Optional[float] = None
                 ) -> Dict[str, Any]:
  """The HParams-tab values of a run's `hparams.json` document: nested dicts flattened to `a/b`,
  None left out, lists as their JSON text (the plugin takes bool, int, float and str only)."""
  if not isinstance(hparams, dict):
    raise ValueError(f'`hparams` must be a dict, got {type(hparams).__name__}.')
  flat = {}

  def visit(prefix, value):
    if isinstance(value, dict):
      for key, item in value.items():
        visit(f'{prefix}{key}/', item)
    elif value is None:
      return
    elif isinstance(value, (bool, int, float, str)):
      flat[prefix[:-1]] = value
    else:
      flat[prefix[:-1]] = json.dumps(value)

  visit('', hparams)
  if accounted_noise_multiplier is not None:
    flat['accounted_noise_multiplier'] = float(accounted_noise_multiplier)
  return flat


def write_hparams_summary(output_dir: str, summary: Dict[str, Any]) -> str:
  """Writes the HParams session and the `final/*` scalars of a run from its `summary` document
  (`build_summary`) into `<output_dir>/tensorboard/`; returns that directory."""
  for key in ('hparams', 'final_metrics', 'rounds', 'noise_multiplier'):
    if key not in summary:
      raise ValueError(f'`summary` lacks {key!r} (expected a `build_summary` document).')
  logdir = os.path.join(os.fspath(output_dir), TENSORBOARD_DIR)
  finals = {name: value for name, value in summary['final_metrics'].items() if value is not None}
  if summary.get('epsilon') is not None:
    finals['epsilon'] = summary['epsilon']
  # TensorFlow only here: the sweeps and their tables read summaries without it.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
  writer = tf.summary.create_file_writer(logdir)
  try:
    with writer.as_default():
      hp.hparams(flat_hparams(summary['hparams'], summary['noise_multiplier']),
                 trial_id=os.path.basename(os.path.normpath(output_dir)))
      for name, value in sorted(finals.items()):
        tf.summary.scalar(FINAL_PREFIX + name, float(value), step=int(summary['rounds']))
    writer.flush()
  finally:
    writer.close()
  return logdir
