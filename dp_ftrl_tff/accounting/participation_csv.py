"""The chunked reader of a participation log's CSV file (`participation_log.read_participation_log`).

`read_arrays` streams the file in chunks of whole lines, each parsed by vectorized numpy over the
raw bytes (no per-row Python work) on a worker thread while the previous chunk is added to a
`participation_bits.LogBuilder`; a body with a double quote anywhere is read with the csv module
instead (slower, same results). A hash collision restarts the read with the next seed.
"""

import concurrent.futures
import csv
import io
from typing import Iterator

import numpy as np

from dp_ftrl_tff.accounting import participation_bits

HEADER = ('client_id', 'round')
_QUOTED_BATCH = 1 << 18  # rows of the csv-module path converted to arrays at once


class _RowError(ValueError):
  """A malformed row of a chunk: its 0-based index in the chunk and the rest of the message."""

  def __init__(self, row: int, text: str):
    super().__init__(f'row {row + 1} of a chunk{text}')
    self.row = row
    self.text = text


class _QuotedLog(Exception):
  """The body holds a double quote: the csv-module path must read it (as the whole file)."""


def _check_header(line: bytes, path: str) -> None:
  header = line.rstrip(b'\n').rstrip(b'\r').decode('utf-8', 'replace').replace('\ufeff', '')
  if tuple(h.strip() for h in header.split(',')) != HEADER:
    raise ValueError(f'{path}: header must be `client_id,round`, got {header!r}.')


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
      raise _RowError(row, ': the round is not a non-negative integer.')
    values = np.where(valid, values * 10 + digit, values)
  return values


def _parse_chunk(chunk: bytes, seed: int, path: str) -> participation_bits.Rows:
  """The rows of `chunk` (whole lines of an unquoted body), grouped by `participation_bits.prepare_rows`.

  Raises `_RowError` (row numbers relative to the chunk) or ValueError on a malformed row.
  """
  if not chunk.endswith(b'\n'):
    chunk += b'\n'  # a last line without its line end
  arr = np.frombuffer(chunk, np.uint8)
  line_ends = np.flatnonzero(arr == 10)
  line_starts = np.concatenate([[0], line_ends[:-1] + 1]).astype(np.int64)
  content_ends = line_ends - ((line_ends > line_starts) & (arr[np.maximum(line_ends - 1, 0)] == 13))
  keep = content_ends > line_starts  # blank lines are ignored
  line_starts, content_ends = line_starts[keep], content_ends[keep]
  if not line_starts.size:
    return participation_bits.prepare_rows(np.zeros((0, 0), np.uint64), np.zeros(0, np.int64),
                         np.zeros(0, np.int64), seed)
  commas = np.flatnonzero(arr == 44)
  one_comma = commas.size == line_starts.size and bool(
      np.all((commas > line_starts) & (commas < content_ends)))
  if not one_comma:
    line_of_comma = np.searchsorted(line_starts, commas, side='right') - 1
    per_line = np.bincount(line_of_comma, minlength=line_starts.size)
    at_start = np.zeros(line_starts.size, bool)
    at_start[line_of_comma[commas == line_starts[line_of_comma]]] = True
    row = int(np.flatnonzero((per_line != 1) | at_start)[0])
    raise _RowError(row, ' is not `client_id,round` (one comma, non-empty id).')
  slack = int((content_ends - line_starts).max()) + 8  # fixed-width gathers stay in bounds
  padded = np.concatenate([arr, np.zeros(slack, np.uint8)])
  rounds = _parse_rounds(padded, commas + 1, content_ends - commas - 1, path)
  lengths = commas - line_starts
  # 8 id bytes per gather: a uint64 view starting at every byte offset (unaligned loads).
  at_offset = np.ndarray(shape=(padded.size - 7,), dtype='<u8', buffer=padded, strides=(1,))
  words = np.empty((-(-int(lengths.max()) // 8), lengths.size), np.uint64)
  for k, word in enumerate(words):
    word[:] = at_offset[line_starts + 8 * k] & participation_bits.LOW_BYTES[np.clip(lengths - 8 * k, 0, 8)]
  return participation_bits.prepare_rows(words, lengths, rounds, seed)


def _line_chunks(f, chunk_bytes: int) -> Iterator[bytes]:
  """Whole lines of `f`, about `chunk_bytes` at a time (the last one may lack its line end)."""
  while True:
    chunk = f.read(chunk_bytes)
    if not chunk:
      return
    if not chunk.endswith(b'\n'):
      chunk += f.readline()
    yield chunk


def _rest_has_quote(f, chunk_bytes: int) -> bool:
  return any(b'"' in chunk for chunk in iter(lambda: f.read(chunk_bytes), b''))


def _read_unquoted(path: str, chunk_bytes: int, seed: int) -> participation_bits.LogArrays:
  """The vectorized path: raises `_QuotedLog` as soon as the body shows a double quote.

  Two stages overlap: a worker thread parses and groups chunk i + 1 (`_parse_chunk`) while this
  thread adds chunk i to the log (`participation_bits.LogBuilder.add_rows`). numpy releases the GIL in the sorts and
  array operations of both, so they share two cores; at most two chunks' arrays are alive.
  """
  builder = participation_bits.LogBuilder(path, seed)
  with open(path, 'rb') as f, concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    _check_header(f.readline(), path)
    rows = 0
    pending = None  # the previous chunk, being parsed
    for chunk in _line_chunks(f, chunk_bytes):
      if b'"' in chunk:
        raise _QuotedLog()
      parsing = pool.submit(_parse_chunk, chunk, seed, path)
      if pending is not None:
        rows = _add_parsed(builder, pending, rows, f, chunk_bytes)
      pending = parsing
    if pending is not None:
      _add_parsed(builder, pending, rows, f, chunk_bytes)
  return builder.finish()


def _add_parsed(builder: participation_bits.LogBuilder, parsing: concurrent.futures.Future, rows: int, f,
                chunk_bytes: int) -> int:
  """Adds a parsed chunk to `builder`; returns `rows` (the rows before it) plus its rows.

  A malformed row raises ValueError naming the row, unless the rest of the file `f` has a double
  quote: then the log is quoted CSV (`_QuotedLog`), parsed and judged by the csv module.
  """
  try:
    prepared = parsing.result()
  except ValueError as error:
    if _rest_has_quote(f, chunk_bytes):
      raise _QuotedLog() from None
    if isinstance(error, _RowError):
      raise ValueError(f'{builder.where}: row {rows + error.row + 1}{error.text}') from None
    raise
  builder.add_rows(prepared)
  return rows + int(prepared.rounds.size)


def _read_quoted(path: str, seed: int) -> participation_bits.LogArrays:
  """The csv-module path (quoted fields, possibly with commas or line ends inside)."""
  builder = participation_bits.LogBuilder(path, seed)
  with open(path, 'rb') as raw:
    raw.readline()  # the header, checked by `_read_unquoted`
    reader = csv.reader(io.TextIOWrapper(raw, encoding='utf-8', newline=''))
    ids, rounds = [], []
    for line_num, row in enumerate(reader, start=2):
      if not row:
        continue
      if len(row) != 2:
        raise ValueError(f'{path}:{line_num}: expected 2 fields `client_id,round`, got {row!r}.')
      if not row[0]:  # as the unquoted path: an empty id is no client
        raise ValueError(f'{path}:{line_num}: the client id is empty.')
      try:
        rounds.append(int(row[1]))
      except ValueError:
        raise ValueError(f'{path}:{line_num}: round {row[1]!r} is not an integer.') from None
      if not -2**63 <= rounds[-1] < 2**63:
        raise ValueError(f'{path}:{line_num}: round {row[1]!r} is out of range.')
      ids.append(row[0])
      if len(ids) == _QUOTED_BATCH:
        builder.add_text_ids(ids, np.array(rounds, np.int64))
        ids, rounds = [], []
    builder.add_text_ids(ids, np.array(rounds, np.int64))
  return builder.finish()


def read_arrays(path: str, chunk_bytes: int) -> participation_bits.LogArrays:
  """The arrays of the log at `path` (checked by the caller), read `chunk_bytes` at a time."""
  for seed in range(participation_bits.HASH_SEEDS):
    try:
      try:
        return _read_unquoted(path, chunk_bytes, seed)
      except _QuotedLog:
        return _read_quoted(path, seed)
    except participation_bits.HashCollision:
      continue
  raise participation_bits.collision_error(path)
