"""Writer of the participation log: which client took part in which round.

Format (read by `dp_ftrl_tff.accounting.participation_log` and `python -m experiments.privacy_report
--participation_log`): a CSV file with the header `client_id,round` and one row per (client, round)
participation; rounds are 0-based. Rows are appended one round at a time and flushed to disk, so a
killed run leaves a log that is complete up to its last finished round. A resumed run calls
`truncate(first_round)` to drop the rows of rounds that were logged but not checkpointed.
"""

import csv
import os
from typing import Sequence

from dp_ftrl_tff import _validation

HEADER = ('client_id', 'round')


class ParticipationLogWriter:
  """Appends `client_id,round` rows to a CSV file (created with its header if missing)."""

  def __init__(self, path: str):
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
      raise ValueError(f'`path` must be a non-empty path, got {path!r}.')
    self._path = os.fspath(path)
    if not os.path.exists(self._path):
      os.makedirs(os.path.dirname(os.path.abspath(self._path)), exist_ok=True)
      self._rewrite([])
    else:
      with open(self._path, newline='') as f:
        header = tuple(next(csv.reader(f), ()))
      if header != HEADER:
        raise ValueError(f'{self._path} is not a participation log: header {header!r}, expected '
                         f'{HEADER!r}.')

  @property
  def path(self) -> str:
    return self._path

  def append_round(self, round_num: int, client_ids: Sequence[str]) -> None:
    """Appends one row per client of round `round_num` (0-based) and flushes to disk."""
    round_num = _validation.check_nonnegative_int(round_num, 'round_num')
    with open(self._path, 'a', newline='') as f:
      writer = csv.writer(f)
      writer.writerows((str(c), round_num) for c in client_ids)
      f.flush()
      os.fsync(f.fileno())

  def truncate(self, first_round: int) -> None:
    """Drops every row whose round is >= `first_round` (rounds a resumed run will redo)."""
    first_round = _validation.check_nonnegative_int(first_round, 'first_round')
    with open(self._path, newline='') as f:
      rows = [row for row in csv.DictReader(f) if int(row['round']) < first_round]
    self._rewrite([(row['client_id'], row['round']) for row in rows])

  def _rewrite(self, rows) -> None:
    temp_path = self._path + '.tmp'
    with open(temp_path, 'w', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(HEADER)
      writer.writerows(rows)
    os.replace(temp_path, self._path)
