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
from typing import List, Optional, Tuple

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


def _rows(metrics_csv: str) -> Tuple[List[str], List[Tuple[int, int, dict]]]:
  """(the header, the (line number, round, row) of every data row) of `metrics_csv` (one row per
  round: small), checked: a header with a `round` column, every row with the header's number of
  fields (a torn last line is not a row to read) and a non-negative integer round.

  Raises:
    ValueError: naming the file and the line.
  """
  with open(metrics_csv, newline='') as f:
    reader = csv.reader(f)
    header = next(reader, None)
    if not header or ROUND_COLUMN not in header:
      raise ValueError(f'{metrics_csv} is not a metrics CSV: its header '
                       f'{",".join(header or [])!r} has no {ROUND_COLUMN!r} column.')
    round_index = header.index(ROUND_COLUMN)
    rows = []
    for fields in reader:
      if not fields:
        continue
      if len(fields) != len(header):
        raise ValueError(f'{metrics_csv}:{reader.line_num}: {len(fields)} fields, the header has '
                         f'{len(header)} (a torn or damaged row).')
      try:
        round_num = float(fields[round_index])
        if not round_num.is_integer() or round_num < 0:
          raise ValueError
      except ValueError:
        raise ValueError(f'{metrics_csv}:{reader.line_num}: round {fields[round_index]!r} is not '
                         'a non-negative integer.') from None
      rows.append((reader.line_num, int(round_num), dict(zip(header, fields, strict=True))))
  return header, rows


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
    ValueError: it does not parse as a metrics CSV (no `round` column, a row with another number
      of fields than the header or a round that is not an integer, naming the line) or lacks the
      aggregator's columns; `max_rounds` is not a positive int.
  """
  max_rounds = _check_max_rounds(max_rounds)
  segments, wrap_rounds = {}, []
  _, rows = _rows(metrics_csv)
  for line, round_num, row in rows:
    if max_rounds is not None and round_num >= max_rounds:
      continue
    try:
      segment = int(float(row['aggregator/segment']))
      segments.setdefault(segment, {'segment': segment, 'clip': float(row['aggregator/clip']),
                                    'sensitivity_clip': float(row['aggregator/sensitivity_clip'])})
      if float(row.get(MODULAR_WRAP_METRIC) or 0) > 0:
        wrap_rounds.append(round_num)
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f'{metrics_csv} is not the metrics of a SecAgg run (line {line}: {e}).'
                       ) from e
  return {'segments': [segments[s] for s in sorted(segments)], 'wrap_rounds': wrap_rounds}


def read_final_clip(metrics_csv: str, *, max_rounds: Optional[int] = None) -> Optional[float]:
  """The clip the run's last round used: `aggregator/clip` of the row of the highest `round` in
  `metrics_csv` (adaptive clipping's final clip); None when the file does not exist, has no such
  column or no row with a value in it. The whole file must parse as a metrics CSV.

  Args:
    metrics_csv: the run's metrics CSV.
    max_rounds: if set, the last round is the highest one below `max_rounds`.

  Raises:
    OSError: the file exists but cannot be read.
    ValueError: it does not parse as a metrics CSV (no `round` column, a row with another number
      of fields than the header, naming the line) or a row's `round` or clip is not a number;
      `max_rounds` is not a positive int.
  """
  max_rounds = _check_max_rounds(max_rounds)
  if not os.path.isfile(metrics_csv):
    return None
  header, rows = _rows(metrics_csv)
  if CLIP_METRIC not in header:
    return None
  last_round, clip = None, None
  for line, round_num, row in rows:
    value = row[CLIP_METRIC]
    if not value.strip() or (max_rounds is not None and round_num >= max_rounds):
      continue
    try:
      value = float(value)
    except ValueError:
      raise ValueError(f'{metrics_csv}:{line}: {CLIP_METRIC!r} {value!r} is not a number.'
                       ) from None
    if last_round is None or round_num >= last_round:
      last_round, clip = round_num, value
  return clip
