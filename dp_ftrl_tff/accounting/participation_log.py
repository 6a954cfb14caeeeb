"""The participation log: who took part in which round. Its format, writer and reader.

Format: a CSV file with the header `client_id,round` and one row per (client, 0-based round)
participation. Client ids are arbitrary strings (quoted CSV fields are supported on a slower read
path); the reader accepts any line ending.
  * `ParticipationLogWriter` (the training loop, one cohort of the min-sep client sampler per round)
    appends one round at a time and flushes to disk, so a killed run leaves a log that is complete up
    to its last finished round; a resumed run calls `truncate(first_round)` to drop the rows of rounds
    that were logged but not checkpointed.
  * `read_participation_log` (the privacy report, `--participation_log`) parses it.

Realized participation (Gboard paper Sec. 2.5 item 7, "precise MaxP and MinS are computed by
post-processing"):
  * `min_sep`: the smallest r2 - r1 over consecutive participations r1 < r2 of one client (the BLT /
    BandMF b; TF-Privacy's and the Gboard tables' MinS = min_sep - 1); None if no client took part
    twice;
  * `max_participations`: the most participations of one client.

Reading is vectorized numpy over the raw bytes (no per-row Python work): 13 million rows (10^6
clients, 2000 rounds, 6500 clients per round) take a few seconds. Client ids are grouped by a 64-bit
hash of their bytes and the grouping is then checked byte-for-byte, so it is exact.
"""

import csv
import dataclasses
import io
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import participation as participation_lib

HEADER = ('client_id', 'round')

_FNV_PRIME = np.uint64(0x100000001B3)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)


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


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compare fields explicitly
class ParticipationLog:
  """A parsed log, sorted by (client, round).

  Attributes:
    client_index: int64 array, one entry per row: the client's code in [0, num_clients).
    rounds: int64 array, one entry per row: the 0-based round.
    client_ids: 1-D array (bytes or str) with the client id of each code; see `client_id`.
    path: the file it was read from ('' if built in memory).
  """
  client_index: np.ndarray
  rounds: np.ndarray
  client_ids: np.ndarray
  path: str = ''

  @classmethod
  def from_arrays(cls, client_ids, rounds, path: str = '') -> 'ParticipationLog':
    """Builds a log from per-row client ids (any hashable values, stored as str) and rounds."""
    client_ids = np.asarray(client_ids)
    rounds = np.asarray(rounds)
    if client_ids.ndim != 1 or rounds.ndim != 1 or client_ids.shape != rounds.shape:
      raise ValueError('`client_ids` and `rounds` must be 1-D arrays of the same length.')
    if rounds.size and not np.issubdtype(rounds.dtype, np.integer):
      raise ValueError(f'`rounds` must be integers, got dtype {rounds.dtype}.')
    names, codes = np.unique(client_ids.astype(str), return_inverse=True)
    return _sorted_log(codes.astype(np.int64).reshape(-1), rounds.astype(np.int64), names, path)

  def client_id(self, code: int) -> str:
    """The id string of client code `code`."""
    name = self.client_ids[code]
    return name.decode('utf-8') if isinstance(name, bytes) else str(name)

  @property
  def num_rows(self) -> int:
    return int(self.rounds.size)

  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  @property
  def num_rounds(self) -> int:
    """max round + 1 (0 for an empty log)."""
    return int(self.rounds.max()) + 1 if self.rounds.size else 0

  def participations(self) -> np.ndarray:
    """Participation count of each client code."""
    return np.bincount(self.client_index, minlength=self.num_clients)

  def gaps(self) -> Tuple[np.ndarray, np.ndarray]:
    """(gaps, client codes): r2 - r1 for every pair of consecutive participations of one client."""
    same = self.client_index[1:] == self.client_index[:-1]
    return np.diff(self.rounds)[same], self.client_index[1:][same]

  @property
  def min_sep(self) -> Optional[int]:
    """Realized min_sep b (smallest r2 - r1 of one client), None if nobody participated twice."""
    gaps, _ = self.gaps()
    return int(gaps.min()) if gaps.size else None

  @property
  def max_participations(self) -> int:
    """The most participations of one client (0 for an empty log)."""
    return int(self.participations().max()) if self.num_clients else 0

  def participation_histogram(self) -> dict:
    """{number of participations: number of clients}."""
    values, counts = np.unique(self.participations(), return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}

  def realized_schema(self, num_rounds: Optional[int] = None
                      ) -> participation_lib.ParticipationSchema:
    """The b-min-sep schema the log satisfies: (realized min_sep, realized max participations).

    With no repeated client it is single participation, written min_sep = n (any b >= n is the same).
    """
    if not self.num_rows:
      raise ValueError('The participation log is empty.')
    n = self.num_rounds if num_rounds is None else int(num_rounds)
    b = self.min_sep
    return participation_lib.ParticipationSchema(min_sep=max(n, 1) if b is None else b,
                                                 max_participations=self.max_participations)

  def violations(self, declared: participation_lib.ParticipationSchema,
                 num_rounds: Optional[int] = None) -> List[str]:
    """Human-readable breaches of the `declared` schema (empty list: the log complies).

    Checks: rounds beyond `num_rounds`; gaps smaller than min_sep (or, for fixed-epoch schemas, not
    multiples of it); more than max_participations participations.
    """
    if not isinstance(declared, participation_lib.ParticipationSchema):
      raise ValueError(f'`declared` must be a ParticipationSchema, got {declared!r}.')
    found = []
    if num_rounds is not None and self.num_rounds > num_rounds:
      late = int(np.count_nonzero(self.rounds >= num_rounds))
      found.append(f'{late} participations are in rounds >= {num_rounds} (the log reaches round '
                   f'{self.num_rounds - 1}).')
    gaps, codes = self.gaps()
    if declared.fixed_epoch:
      bad = gaps % declared.min_sep != 0
      what = f'not a multiple of the fixed-epoch period {declared.min_sep}'
    else:
      bad = gaps < declared.min_sep
      what = f'closer than min_sep={declared.min_sep}'
    if np.any(bad):
      offenders = np.unique(codes[bad])
      found.append(f'{offenders.size} clients have two participations {what} (realized min_sep '
                   f'{int(gaps.min())}, e.g. client {self.client_id(offenders[0])!r}).')
    k = declared.max_participations
    counts = self.participations()
    if k is not None and self.num_clients and counts.max() > k:
      offenders = np.flatnonzero(counts > k)
      found.append(f'{offenders.size} clients participated more than max_participations={k} '
                   f'times (up to {int(counts.max())}, e.g. client '
                   f'{self.client_id(offenders[0])!r}).')
    return found


def _sorted_log(codes: np.ndarray, rounds: np.ndarray, names: np.ndarray,
                path: str) -> ParticipationLog:
  """Sorts rows by (client, round) and rejects negative rounds and duplicate rows."""
  if rounds.size and rounds.min() < 0:
    raise ValueError(f'{path or "log"}: rounds must be non-negative, found {int(rounds.min())}.')
  span = int(rounds.max()) + 1 if rounds.size else 1
  keys = np.sort(codes * span + rounds)
  codes, rounds = np.divmod(keys, span)
  dup = np.flatnonzero(keys[1:] == keys[:-1])
  if dup.size:
    name = names[codes[dup[0]]]
    name = name.decode('utf-8') if isinstance(name, bytes) else str(name)
    raise ValueError(f'{path or "log"}: client {name!r} is logged twice in round '
                     f'{int(rounds[dup[0]])} ({dup.size} duplicate rows).')
  return ParticipationLog(client_index=codes, rounds=rounds, client_ids=np.asarray(names), path=path)


def _parse_quoted(data: bytes, path: str) -> ParticipationLog:
  """Slow path for logs with quoted CSV fields: the csv module."""
  reader = csv.reader(io.StringIO(data.decode('utf-8')))
  ids, rounds = [], []
  for line_num, row in enumerate(reader, start=2):
    if not row:
      continue
    if len(row) != 2:
      raise ValueError(f'{path}:{line_num}: expected 2 fields `client_id,round`, got {row!r}.')
    try:
      rounds.append(int(row[1]))
    except ValueError:
      raise ValueError(f'{path}:{line_num}: round {row[1]!r} is not an integer.') from None
    ids.append(row[0])
  return ParticipationLog.from_arrays(np.array(ids, dtype=object), np.array(rounds, np.int64), path)


def _column_bytes(padded: np.ndarray, starts: np.ndarray, lengths: np.ndarray, j: int) -> np.ndarray:
  """Byte j of each field (0 where the field is shorter); `padded` has slack bytes at its end."""
  return padded[starts + j] * (lengths > j).astype(np.uint8)


def _parse_rounds(arr, starts, lengths, path) -> np.ndarray:
  if lengths.min() < 1 or lengths.max() > 18:
    raise ValueError(f'{path}: every row needs a round of 1 to 18 digits after the comma.')
  values = np.zeros(starts.size, np.int64)
  for j in range(int(lengths.max())):
    valid = lengths > j
    digit = _column_bytes(arr, starts, lengths, j).astype(np.int64) - 48
    if np.any(valid & ((digit < 0) | (digit > 9))):
      row = int(np.flatnonzero(valid & ((digit < 0) | (digit > 9)))[0])
      raise ValueError(f'{path}: row {row + 1}: the round is not a non-negative integer.')
    values = np.where(valid, values * 10 + digit, values)
  return values


def _group_ids(padded, starts, lengths) -> Tuple[np.ndarray, np.ndarray]:
  """Exact grouping of the id fields: (code per row, id bytes per code as an `S` array)."""
  width = int(lengths.max())
  columns = np.zeros((width, starts.size), np.uint8)  # byte j of every id is contiguous
  hashes = np.full(starts.size, _FNV_OFFSET, np.uint64)
  for j in range(width):
    columns[j] = _column_bytes(padded, starts, lengths, j)
    hashes ^= columns[j]
    hashes *= _FNV_PRIME
  hashes ^= lengths.astype(np.uint64)
  hashes *= _FNV_PRIME
  order = np.argsort(hashes)
  sorted_hashes = hashes[order]
  new_group = np.concatenate([[True], sorted_hashes[1:] != sorted_hashes[:-1]])
  codes = np.empty(starts.size, np.int64)
  codes[order] = np.cumsum(new_group) - 1
  first = order[new_group]
  representative = first[codes]
  exact = np.array_equal(lengths[representative], lengths) and all(
      np.array_equal(column[representative], column) for column in columns)
  if not exact:  # a 64-bit hash collision: group on the bytes themselves (slow, exact)
    _, first, codes = np.unique(np.concatenate([columns, lengths[None, :].astype(np.uint8)]).T,
                                axis=0, return_index=True, return_inverse=True)
  # Ids never contain NUL bytes (text CSV), so the `S` view strips exactly the padding.
  names = np.ascontiguousarray(columns[:, first].T).view(f'S{width}').reshape(-1)
  return codes.astype(np.int64).reshape(-1), names


def read_participation_log(path: str) -> ParticipationLog:
  """Reads a `client_id,round` CSV participation log.

  Raises:
    ValueError: (naming the file and line where possible) on a missing file, a wrong header, a
      malformed row, a negative or non-integer round, or a client logged twice in one round.
  """
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    raise ValueError(f'`participation_log` must be a non-empty path, got {path!r}.')
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f'`participation_log` file not found: {path}.')
  with open(path, 'rb') as f:
    data = f.read()
  header_end = data.find(b'\n')
  header_end = len(data) if header_end < 0 else header_end
  header = data[:header_end].rstrip(b'\r').decode('utf-8', 'replace').replace('\ufeff', '')
  if tuple(h.strip() for h in header.split(',')) != HEADER:
    raise ValueError(f'{path}: header must be `client_id,round`, got {header!r}.')
  body = data[header_end + 1:]
  if b'"' in body:
    return _parse_quoted(body, path)
  if body and not body.endswith(b'\n'):
    body += b'\n'
  arr = np.frombuffer(body, np.uint8)
  line_ends = np.flatnonzero(arr == 10)
  line_starts = np.concatenate([[0], line_ends[:-1] + 1]).astype(np.int64)
  content_ends = line_ends - ((line_ends > line_starts) & (arr[np.maximum(line_ends - 1, 0)] == 13))
  keep = content_ends > line_starts  # blank lines are ignored
  line_starts, content_ends = line_starts[keep], content_ends[keep]
  if not line_starts.size:
    return ParticipationLog(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, 'S1'), path)
  commas = np.flatnonzero(arr == 44)
  one_comma = commas.size == line_starts.size and bool(
      np.all((commas > line_starts) & (commas < content_ends)))
  if not one_comma:
    line_of_comma = np.searchsorted(line_starts, commas, side='right') - 1
    per_line = np.bincount(line_of_comma, minlength=line_starts.size)
    at_start = np.zeros(line_starts.size, bool)
    at_start[line_of_comma[commas == line_starts[line_of_comma]]] = True
    row = int(np.flatnonzero((per_line != 1) | at_start)[0])
    raise ValueError(f'{path}: row {row + 1} is not `client_id,round` (one comma, non-empty id).')
  slack = int((content_ends - line_starts).max()) + 1  # fixed-width gathers stay in bounds
  padded = np.concatenate([arr, np.zeros(slack, np.uint8)])
  rounds = _parse_rounds(padded, commas + 1, content_ends - commas - 1, path)
  codes, names = _group_ids(padded, line_starts, commas - line_starts)
  return _sorted_log(codes, rounds, names, path)
