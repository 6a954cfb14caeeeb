"""The participation log: who took part in which round. Its format, writer and parsed form.

Format: a CSV file with the header `client_id,round` and one row per (client, 0-based round)
participation. Client ids are arbitrary strings (quoted CSV fields are supported on a slower read
path); the reader accepts any line ending.
  * `ParticipationLogWriter` (the training loop, one cohort of the min-sep client sampler per round)
    appends one round at a time and flushes to disk, so a killed run leaves a log that is complete up
    to its last finished round; a resumed run calls `truncate(first_round)` to drop the rows of rounds
    that were logged but not checkpointed. A writer that checkpoints a byte offset instead (the
    `tff.program` data source, `dp_ftrl_tff.programs.data_source`) writes each round with
    `append_round_at(offset, ...)`, which drops everything past the offset first: the same bytes as
    `append_round`, and idempotent under a restart from the offset.
  * `read_participation_log` (the privacy report, `--participation_log`) parses it in one streaming
    pass into a `ParticipationLog`.

Realized participation (Gboard paper Sec. 2.5 item 7, "precise MaxP and MinS are computed by
post-processing"):
  * `min_sep`: the smallest r2 - r1 over consecutive participations r1 < r2 of one client (the BLT /
    BandMF b; TF-Privacy's and the Gboard tables' MinS = min_sep - 1); None if no client took part
    twice;
  * `max_participations`: the most participations of one client.

Reading streams the file in fixed-size chunks of whole lines (`participation_csv`). Memory is
bounded by the clients and rounds, not the rows: the log is kept as one bit per (client, round)
(order-free, so out-of-order rows are fine and a repeated row is caught exactly) plus a few int64 per
client (participations, smallest gap, gcd of the gaps); client ids are grouped exactly through a
checked 64-bit hash (`participation_bits`).
"""

import csv
import dataclasses
import io
import os
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import _atomic, _validation
from dp_ftrl_tff.accounting import participation_bits, participation_csv
from dp_ftrl_tff.mechanisms import participation as participation_lib

HEADER = participation_csv.HEADER


def _csv_text(rows) -> str:
  """`rows` as the writer's `csv.writer` (default dialect: commas, CRLF line ends) writes them."""
  buffer = io.StringIO(newline='')
  csv.writer(buffer).writerows(rows)
  return buffer.getvalue()


#: The header line as the writer writes it (ASCII); a new log is these bytes, and the first round's
#: rows start at byte offset `len(HEADER_BYTES)`.
HEADER_BYTES = _csv_text([HEADER]).encode('ascii')


class ParticipationLogWriter:
  """Appends `client_id,round` rows to a CSV file (created with its header if missing). An OSError
  of a write names the log (`filename`), a full disk's too."""

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
    with _atomic.naming(self._path), open(self._path, 'a', newline='') as f:
      writer = csv.writer(f)
      writer.writerows((str(c), round_num) for c in client_ids)
      f.flush()
      os.fsync(f.fileno())

  @property
  def size(self) -> int:
    """The log's length in bytes: the offset at which the next appended round starts."""
    return os.path.getsize(self._path)

  def append_round_at(self, offset: int, round_num: int, client_ids: Sequence[str]) -> int:
    """Drops every byte from `offset` on, then writes round `round_num`'s rows there and flushes.

    The rows are the bytes `append_round` writes (same csv dialect, same text encoding as `open`),
    so a log written this way round by round equals one written with `append_round`. Writing the
    same round at the same offset again gives the same file: a caller that checkpoints the returned
    offset with its sampler state resumes idempotently, whatever was written after the checkpoint
    (later rounds, a torn last line) before a crash.

    Args:
      offset: byte offset at which the round's rows start: `len(HEADER_BYTES)` for round 0, else the
        value this method returned for the previous round. It must lie at the start of a line,
        within the file.
      round_num: the 0-based round of the rows.
      client_ids: the round's cohort (possibly empty: only the truncation happens).

    Returns:
      The byte offset just past the round's rows (where the next round starts).

    Raises:
      ValueError: on a bad argument; if the file is missing, no longer starts with the header, is
        shorter than `offset` (edited or replaced since the offset was taken), or `offset` is not at
        the start of a line.
    """
    offset = _validation.check_nonnegative_int(offset, 'offset')
    round_num = _validation.check_nonnegative_int(round_num, 'round_num')
    if isinstance(client_ids, (str, bytes)):
      raise ValueError(f'`client_ids` must be a sequence of ids, got {client_ids!r}.')
    if offset < len(HEADER_BYTES):
      raise ValueError(f'`offset`={offset} lies inside the {len(HEADER_BYTES)}-byte header of '
                       f'{self._path}.')
    if not os.path.isfile(self._path):
      raise ValueError(f'The participation log {self._path} is missing.')
    with _atomic.naming(self._path), open(self._path, 'r+b') as raw:
      size = raw.seek(0, os.SEEK_END)
      raw.seek(0)
      if raw.read(len(HEADER_BYTES)) != HEADER_BYTES:
        raise ValueError(f'{self._path} no longer starts with the participation log header '
                         f'{HEADER_BYTES!r}: it was edited or replaced.')
      if size < offset:
        raise ValueError(f'The participation log {self._path} holds {size} bytes, fewer than the '
                         f'`offset`={offset} of its writer state: it was edited or replaced.')
      raw.seek(offset - 1)
      if raw.read(1) != b'\n':
        raise ValueError(f'`offset`={offset} is not at the start of a line of {self._path}: it was '
                         'edited or replaced.')
      # Truncate first: a crash before the write leaves the log at `offset`, which a retry from the
      # same offset completes.
      raw.truncate(offset)
      raw.seek(offset)
      # The text layer `open(path, 'a', newline='')` uses (same default encoding), so the bytes
      # equal `append_round`'s.
      text = io.TextIOWrapper(raw, newline='')
      try:
        csv.writer(text).writerows((str(c), round_num) for c in client_ids)
        text.flush()
        os.fsync(raw.fileno())
        return raw.tell()
      finally:
        text.detach()

  def _rewrite(self, rows) -> None:
    temp_path = self._path + '.tmp'
    with _atomic.naming(self._path), open(temp_path, 'w', newline='') as f:
      writer = csv.writer(f)
      writer.writerow(HEADER)
      writer.writerows(rows)
    os.replace(temp_path, self._path)


#: Bytes read per chunk by `read_participation_log` (two chunks are in flight; its working memory
#: is a few times this, plus the per-client state). Smaller chunks sort faster (cache): 4 MB was
#: the fastest of 2-32 MB on a 5M-row log.
DEFAULT_CHUNK_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compare fields explicitly
class ParticipationLog:
  """A parsed log: one bit per (client, round), and the per-client figures the report reads.

  Its memory is bounded by the clients and rounds, not by the rows: the bit matrix takes about
  num_clients x num_rounds / 8 bytes (250 MB for 10^6 clients x 2000 rounds), the per-client arrays
  and ids a few tens of bytes per client.

  Attributes:
    client_ids: `S` array: the UTF-8 id of each client code in [0, num_clients); see `client_id`.
    participations: int64 array: the participation count of each client code.
    min_gaps: int64 array: each client's smallest r2 - r1 over its consecutive participations r1 < r2
      (0: it took part once).
    gap_gcds: int64 array: the gcd of each client's gaps (0: it took part once); every gap is a
      multiple of P iff the gcd is (the fixed-epoch check).
    round_counts: int64 array: the participations in each round 0 .. num_rounds - 1.
    bits: tuple of uint8 arrays; block i holds clients [i * 65536, (i + 1) * 65536) as rows of
      `row_bytes` bytes (at least ceil(num_rounds / 8)); round r of a client is bit r % 8 (least
      significant first) of byte r // 8 of its row. Rows past num_clients are zero.
    path: the file it was read from ('' if built in memory).
  """
  client_ids: np.ndarray
  participations: np.ndarray
  min_gaps: np.ndarray
  gap_gcds: np.ndarray
  round_counts: np.ndarray
  bits: tuple
  path: str = ''

  @classmethod
  def from_arrays(cls, client_ids, rounds, path: str = '') -> 'ParticipationLog':
    """Builds a log from per-row client ids (any values, stored as their str) and 0-based rounds.

    Raises:
      ValueError: on arrays of different shapes, non-integer or negative rounds, or a client
        listed twice in one round.
    """
    client_ids = np.asarray(client_ids)
    rounds = np.asarray(rounds)
    if client_ids.ndim != 1 or rounds.ndim != 1 or client_ids.shape != rounds.shape:
      raise ValueError('`client_ids` and `rounds` must be 1-D arrays of the same length.')
    if rounds.size and not np.issubdtype(rounds.dtype, np.integer):
      raise ValueError(f'`rounds` must be integers, got dtype {rounds.dtype}.')
    for seed in range(participation_bits.HASH_SEEDS):
      builder = participation_bits.LogBuilder(path, seed)
      try:
        builder.add_text_ids(client_ids.astype(str).tolist(), rounds.astype(np.int64))
        return cls(**builder.finish()._asdict(), path=path)
      except participation_bits.HashCollision:
        continue
    raise participation_bits.collision_error(path or 'log')

  def client_id(self, code: int) -> str:
    """The id string of client code `code`."""
    return self.client_ids[code].decode('utf-8')

  @property
  def num_rows(self) -> int:
    return int(self.participations.sum())

  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  @property
  def num_rounds(self) -> int:
    """max round + 1 (0 for an empty log)."""
    return int(self.round_counts.size)

  @property
  def min_sep(self) -> Optional[int]:
    """Realized min_sep b (smallest r2 - r1 of one client), None if nobody participated twice."""
    gaps = self.min_gaps[self.min_gaps > 0]
    return int(gaps.min()) if gaps.size else None

  @property
  def max_participations(self) -> int:
    """The most participations of one client (0 for an empty log)."""
    return int(self.participations.max()) if self.num_clients else 0

  def participation_histogram(self) -> dict:
    """{number of participations: number of clients}."""
    values, counts = np.unique(self.participations, return_counts=True)
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
      late = int(self.round_counts[max(int(num_rounds), 0):].sum())
      found.append(f'{late} participations are in rounds >= {num_rounds} (the log reaches round '
                   f'{self.num_rounds - 1}).')
    repeated = self.min_gaps > 0
    if declared.fixed_epoch:
      bad = repeated & (self.gap_gcds % declared.min_sep != 0)
      what = f'not a multiple of the fixed-epoch period {declared.min_sep}'
    else:
      bad = repeated & (self.min_gaps < declared.min_sep)
      what = f'closer than min_sep={declared.min_sep}'
    if np.any(bad):
      offenders = np.flatnonzero(bad)
      found.append(f'{offenders.size} clients have two participations {what} (realized min_sep '
                   f'{self.min_sep}, e.g. client {self.client_id(offenders[0])!r}).')
    k = declared.max_participations
    counts = self.participations
    if k is not None and self.num_clients and counts.max() > k:
      offenders = np.flatnonzero(counts > k)
      found.append(f'{offenders.size} clients participated more than max_participations={k} '
                   f'times (up to {int(counts.max())}, e.g. client '
                   f'{self.client_id(offenders[0])!r}).')
    return found

  def rows_of(self, client_ids: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """The log's rows of the clients `client_ids`: (client id per row, as str; 0-based round per
    row, int64), ordered by client code then round; ids absent from the log have no row."""
    if isinstance(client_ids, str):
      raise ValueError(f'`client_ids` must be a sequence of ids, got {client_ids!r}.')
    wanted = np.array([str(c).encode('utf-8') for c in client_ids], dtype=bytes)
    ids, rounds = [], []
    for code in np.flatnonzero(np.isin(self.client_ids, wanted)).tolist():
      block, row = divmod(code, participation_bits.BLOCK_CLIENTS)
      found = np.flatnonzero(np.unpackbits(self.bits[block][row], bitorder='little'))
      found = found[found < self.num_rounds]
      ids.extend([self.client_id(code)] * found.size)
      rounds.append(found.astype(np.int64))
    return (np.array(ids, dtype=str),
            np.concatenate(rounds) if rounds else np.zeros(0, dtype=np.int64))

  def first_rounds(self, num_rounds: int) -> 'ParticipationLog':
    """This log without its rows of rounds >= `num_rounds` (the same object when it has none)."""
    if self.num_rounds <= num_rounds:
      return self
    ids, rounds = self.rows_of([self.client_id(code) for code in range(self.num_clients)])
    keep = rounds < num_rounds
    return ParticipationLog.from_arrays(ids[keep], rounds[keep], path=self.path)

  def iter_patterns(self) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The distinct participation patterns (sets of rounds), in batches of bounded size.

    Clients of one 65536-client block that share a pattern yield it once, so a sampler with few
    distinct patterns (cyclic cohorts) yields few rows.

    Yields:
      (clients, pattern_index, rounds): `clients` holds one client code per pattern of the batch
      (the lowest code of its block with that pattern); rows (pattern_index[i], rounds[i]) list the
      0-based rounds of pattern `pattern_index[i]` (an index into `clients`), sorted by pattern then
      round. Every client's pattern is in some batch.
    """
    for block_index, block in enumerate(self.bits):
      base = block_index * participation_bits.BLOCK_CLIENTS
      used = np.ascontiguousarray(block[:max(0, min(participation_bits.BLOCK_CLIENTS, self.num_clients - base))])
      if not used.shape[0]:
        continue
      _, first = np.unique(used.view(f'V{used.shape[1]}').reshape(-1), return_index=True)
      first = np.sort(first)
      for start in range(0, first.size, participation_bits.SCAN_CLIENTS):
        chosen = first[start:start + participation_bits.SCAN_CLIENTS]
        pattern_index, rounds = participation_bits.bit_rows(used[chosen])
        yield base + chosen, pattern_index, rounds


def read_participation_log(path: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> ParticipationLog:
  """Reads a `client_id,round` CSV participation log in one streaming pass.

  The file is read `chunk_bytes` at a time (whole lines), one chunk parsed on a worker thread while
  the previous one is added; memory holds two chunks' arrays plus the per-client state of
  `ParticipationLog`, never every row. A body with a double quote anywhere is
  read with the csv module instead (slower, same results).

  Args:
    path: the CSV file.
    chunk_bytes: bytes read at a time (positive).

  Raises:
    ValueError: (naming the file and row where possible) on a missing file, a wrong header, a
      malformed row, a negative or non-integer round, or a client logged twice in one round;
      `memory.MemoryLimitError` (a ValueError) when the bit matrix cannot fit in memory.
  """
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    raise ValueError(f'`participation_log` must be a non-empty path, got {path!r}.')
  chunk_bytes = _validation.check_positive_int(chunk_bytes, 'chunk_bytes')
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f'`participation_log` file not found: {path}.')
  return ParticipationLog(**participation_csv.read_arrays(path, chunk_bytes)._asdict(), path=path)
