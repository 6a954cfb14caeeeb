"""What a privacy report reads from a run's per-round metrics CSV (`metrics.csv`).

A run's metrics CSV has one row per round, keyed by the 0-based round in its `round` column (the
drivers' `tff.program.CSVFileReleaseManager(..., key_fieldname='round')`, and
`programs.metrics_release.RoundMetricsReleaseManager` in a `tff.program` program), with the
aggregator's measurements as `aggregator/<name>` columns. The report needs two things of it:
`read_secure_segments` (a SecAgg run's noise segments and the rounds whose secure sum wrapped) and
`read_final_clip` (adaptive clipping's last clip). No TensorFlow.
"""

import csv
import os
from typing import Optional

#: The per-round metric holding the aggregator's `modular_wrap` measurement (SecAgg runs).
MODULAR_WRAP_METRIC = 'aggregator/modular_wrap'
#: The per-round metric holding the clip the round used (the aggregator's `clip` measurement).
CLIP_METRIC = 'aggregator/clip'
#: The metrics CSV's key column: the 0-based round.
ROUND_COLUMN = 'round'


def _check_max_rounds(max_rounds: Optional[int]) -> Optional[int]:
  if max_rounds is None:
    return None
  if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
    raise ValueError(f'`max_rounds` must be a positive int or None, got {max_rounds!r}.')
  return max_rounds


def _round_of(row) -> int:
  return int(float(row[ROUND_COLUMN]))


def read_secure_segments(metrics_csv: str, *, max_rounds: Optional[int] = None) -> dict:
  """What a SecAgg run's report needs of its `metrics.csv`: {'segments': each noise segment's clip
  and post-rounding sensitivity clip (first round of the segment), 'wrap_rounds': the rounds whose
  secure sum wrapped around the field}.

  Args:
    metrics_csv: the run's metrics CSV.
    max_rounds: if set, only the rows of rounds 0 .. max_rounds - 1 are read (the report of the
      first `max_rounds` rounds of a run that went on).

  Raises:
    OSError: the file cannot be read.
    ValueError: it lacks the aggregator's columns; `max_rounds` is not a positive int.
  """
  max_rounds = _check_max_rounds(max_rounds)
  segments, wrap_rounds = {}, []
  with open(metrics_csv, newline='') as f:
    for row in csv.DictReader(f):
      try:
        if max_rounds is not None and _round_of(row) >= max_rounds:
          continue
        segment = int(float(row['aggregator/segment']))
        segments.setdefault(segment, {'segment': segment, 'clip': float(row['aggregator/clip']),
                                      'sensitivity_clip': float(row['aggregator/sensitivity_clip'])})
        if float(row.get(MODULAR_WRAP_METRIC) or 0) > 0:
          wrap_rounds.append(int(row[ROUND_COLUMN]))
      except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{metrics_csv} is not the metrics of a SecAgg run (row {row!r}: {e}).'
                         ) from e
  return {'segments': [segments[s] for s in sorted(segments)], 'wrap_rounds': wrap_rounds}


def read_final_clip(metrics_csv: str, *, max_rounds: Optional[int] = None) -> Optional[float]:
  """The clip the run's last round used: `aggregator/clip` of the row of the highest `round` in
  `metrics_csv` (adaptive clipping's final clip); None when the file does not exist, has no such
  column or no row with a value in it.

  Args:
    metrics_csv: the run's metrics CSV.
    max_rounds: if set, the last round is the highest one below `max_rounds`.

  Raises:
    OSError: the file exists but cannot be read.
    ValueError: a row's `round` or clip is not a number; `max_rounds` is not a positive int.
  """
  max_rounds = _check_max_rounds(max_rounds)
  if not os.path.isfile(metrics_csv):
    return None
  last_round, clip = None, None
  with open(metrics_csv, newline='') as f:
    reader = csv.DictReader(f)
    if CLIP_METRIC not in (reader.fieldnames or ()):
      return None
    for row in reader:
      value = row.get(CLIP_METRIC)
      if value is None or not value.strip():
        continue
      try:
        round_num, value = int(float(row[ROUND_COLUMN])), float(value)
      except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{metrics_csv}: row {row!r} has no numeric round and '
                         f'{CLIP_METRIC!r} ({e}).') from e
      if max_rounds is not None and round_num >= max_rounds:
        continue
      if last_round is None or round_num >= last_round:
        last_round, clip = round_num, value
  return clip
