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
  * `noise_multiplier`: the accounted noise multiplier sigma (relative to the clip norm; calibrated
    when the run gave `target_epsilon`);
  * `hparams`: the run's `hparams.json` document.
Imports no TensorFlow.
"""

import csv
import json
import math
import os
from typing import Any, Dict, Optional

from dp_ftrl_tff import _atomic
from experiments.run import run_dir

SUMMARY_FILE = 'summary.json'
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
                  rho: Optional[float]) -> Dict[str, Any]:
  """The summary document of the run in `output_dir` (final metrics and per-round times read from
  its `metrics.csv`), not yet written.

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
