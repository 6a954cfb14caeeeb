"""The participation log: who took part in which round. Its format, writer and reader.

Format: a CSV file with the header `client_id,round` and one row per (client, 0-based round)
participation. Client ids are arbitrary strings (quoted CSV fields are supported on a slower read
path); the reader accepts any line ending.
  * `ParticipationLogWriter` (the training loop, one cohort of the min-sep client sampler per round)
    appends one round at a time and flushes to disk, so a killed run leaves a log that is complete up
    to its last finished round; a resumed run calls `truncate(first_round)` to drop the rows of rounds
    that were logged but not checkpointed.
  * `read_participation_log` (the privacy report, `--participation_log`) parses it in one streaming
    pass into a `ParticipationLog`.

Realized participation (Gboard paper Sec. 2.5 item 7, "precise MaxP and MinS are computed by
post-processing"):
  * `min_sep`: the smallest r2 - r1 over consecutive participations r1 < r2 of one client (the BLT /
    BandMF b; TF-Privacy's and the Gboard tables' MinS = min_sep - 1); None if no client took part
    twice;
  * `max_participations`: the most participations of one client.

Reading streams the file in fixed-size chunks of whole lines, each parsed by vectorized numpy over
the raw bytes (no per-row Python work) on a worker thread while the previous chunk is added.
Memory is bounded by the clients and rounds, not the rows: the log is kept as one bit per (client,
round) (order-free, so out-of-order rows are fine and a repeated row is caught exactly) plus a few
int64 per client (participations, smallest gap, gcd of the gaps). Client ids get codes through a
64-bit hash of their bytes; every hash match is checked byte for byte, and a collision restarts the
read with another seed, so the grouping is exact.
"""

import concurrent.futures
import csv
import dataclasses
import io
import os
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import memory
from dp_ftrl_tff.mechanisms import participation as participation_lib

HEADER = ('client_id', 'round')

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)  # hash seed 0's initial state
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finalizer constants
_MIX_2 = np.uint64(0x94D049BB133111EB)


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


#: Bytes read per chunk by `read_participation_log` (two chunks are in flight; its working memory
#: is a few times this, plus the per-client state). Smaller chunks sort faster (cache): 4 MB was
#: the fastest of 2-32 MB on a 5M-row log.
DEFAULT_CHUNK_BYTES = 4 << 20
_BLOCK_CLIENTS = 1 << 16  # clients per block of the participation bit matrix
_SCAN_CLIENTS = 1 << 14  # clients expanded to (client, round) rows at once
_QUOTED_BATCH = 1 << 18  # rows of the csv-module path converted to arrays at once
_HASH_SEEDS = 3  # a hash collision between two distinct ids restarts the read with the next seed


class _HashCollision(Exception):
  """Two distinct client ids have the same 64-bit hash under the current seed."""


class _RowError(ValueError):
  """A malformed row of a chunk: its 0-based index in the chunk and the rest of the message."""

  def __init__(self, row: int, text: str):
    super().__init__(f'row {row + 1} of a chunk{text}')
    self.row = row
    self.text = text


class _QuotedLog(Exception):
  """The body holds a double quote: the csv-module path must read it (as the whole file)."""


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
    for seed in range(_HASH_SEEDS):
      builder = _LogBuilder(path, seed)
      try:
        builder.add_text_ids(client_ids.astype(str).tolist(), rounds.astype(np.int64))
        return builder.finish()
      except _HashCollision:
        continue
    raise _collision_error(path or 'log')

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
      base = block_index * _BLOCK_CLIENTS
      used = np.ascontiguousarray(block[:max(0, min(_BLOCK_CLIENTS, self.num_clients - base))])
      if not used.shape[0]:
        continue
      _, first = np.unique(used.view(f'V{used.shape[1]}').reshape(-1), return_index=True)
      first = np.sort(first)
      for start in range(0, first.size, _SCAN_CLIENTS):
        chosen = first[start:start + _SCAN_CLIENTS]
        pattern_index, rounds = _bit_rows(used[chosen])
        yield base + chosen, pattern_index, rounds


def _bit_rows(rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """(row index, round) of every set bit of a (clients, bytes) block, sorted by row then round.

  Expands only the non-zero bytes (a client's row is mostly zeros), by table lookups.
  """
  row_index, byte_index = np.nonzero(rows)
  values = rows[row_index, byte_index]
  counts = _POPCOUNT[values]
  owner = np.repeat(np.arange(values.size), counts)
  rank = np.arange(owner.size) - np.repeat(np.cumsum(counts, dtype=np.int64) - counts, counts)
  return row_index[owner], byte_index[owner] * 8 + _BIT_POSITIONS[values[owner], rank]


def _collision_error(where: str) -> ValueError:
  return ValueError(f'{where}: two distinct client ids share a 64-bit hash under each of '
                    f'{_HASH_SEEDS} seeds; the log cannot be grouped exactly.')


class _BitMatrix:
  """The growing (client, round) bit matrix of `ParticipationLog.bits`; rejects repeated bits."""

  def __init__(self):
    self.blocks: List[np.ndarray] = []
    self.row_bytes = 0
    self.repeats = 0  # rows whose (client, round) bit was already set
    self.first_repeat: Optional[Tuple[int, int]] = None  # (client code, round) of one of them

  def _grow(self, num_clients: int, num_rounds: int, where: str) -> None:
    row_bytes = max(self.row_bytes, -(-num_rounds // 64) * 8)
    if row_bytes > self.row_bytes:
      row_bytes = max(row_bytes, self.row_bytes + self.row_bytes // 4 // 8 * 8)  # amortized growth
    full, rest = divmod(num_clients, _BLOCK_CLIENTS)
    last = 0 if not rest else min(_BLOCK_CLIENTS, 1 << (rest - 1).bit_length())
    needed = (full * _BLOCK_CLIENTS + last) * row_bytes
    held = sum(block.nbytes for block in self.blocks)
    if needed > held + memory.available_bytes():
      raise memory.MemoryLimitError(
          f'{where}: one bit per (client, round) for {num_clients} clients x {num_rounds} rounds '
          f'needs {memory.format_bytes(needed)}, more than the memory available.')
    sizes = [_BLOCK_CLIENTS] * full + ([last] if last else [])
    for i, size in enumerate(sizes):
      if i < len(self.blocks) and self.blocks[i].shape == (size, row_bytes):
        continue
      grown = np.zeros((size, row_bytes), np.uint8)
      if i < len(self.blocks):
        old = self.blocks[i]
        grown[:old.shape[0], :old.shape[1]] = old
        self.blocks[i] = grown
      else:
        self.blocks.append(grown)
    self.row_bytes = row_bytes

  def add(self, codes: np.ndarray, rounds: np.ndarray, num_clients: int, where: str) -> None:
    """Sets the bits (codes[i], rounds[i]) (non-negative rounds), counting the repeated ones."""
    if not codes.size:
      return
    self._grow(num_clients, int(rounds.max()) + 1, where)
    row_bits = self.row_bytes * 8
    keys = np.sort(codes * row_bits + rounds)
    repeated = keys[1:] == keys[:-1]
    if np.any(repeated):
      self._note_repeat(int(keys[1:][repeated][0]), int(np.count_nonzero(repeated)), row_bits)
      keys = keys[np.concatenate([[True], ~repeated])]
    block_of = keys // (_BLOCK_CLIENTS * row_bits)
    bounds = np.searchsorted(block_of, np.arange(len(self.blocks) + 1))
    for b in np.unique(block_of):
      local = keys[bounds[b]:bounds[b + 1]] - b * (_BLOCK_CLIENTS * row_bits)
      byte_index = local >> 3  # = client row * row_bytes + round // 8, since row_bits % 8 == 0
      bit = np.left_shift(1, local & 7).astype(np.uint8)
      starts = np.flatnonzero(np.concatenate([[True], byte_index[1:] != byte_index[:-1]]))
      values = np.bitwise_or.reduceat(bit, starts)
      flat = self.blocks[b].reshape(-1)
      positions = byte_index[starts]
      old = flat[positions]
      clash = old & values
      if np.any(clash):
        at = int(np.flatnonzero(clash)[0])
        value = int(clash[at])
        local_key = int(positions[at]) * 8 + (value & -value).bit_length() - 1
        self._note_repeat(b * _BLOCK_CLIENTS * row_bits + local_key,
                          int(_POPCOUNT[clash].sum(dtype=np.int64)), row_bits)
      flat[positions] = old | values

  def _note_repeat(self, key: int, count: int, row_bits: int) -> None:
    if self.first_repeat is None:
      self.first_repeat = divmod(key, row_bits)
    self.repeats += count


_POPCOUNT = np.array([bin(i).count('1') for i in range(256)], np.uint8)
#: _LOW_BYTES[i]: the mask of the i low bytes of a uint64 (i = 0 .. 8).
_LOW_BYTES = np.array([(1 << (8 * i)) - 1 for i in range(9)], np.uint64)
#: _BIT_POSITIONS[v, k]: the position of the k-th set bit of byte v, least significant first.
_BIT_POSITIONS = np.array([[j for j in range(8) if v >> j & 1] + [0] * (8 - bin(v).count('1'))
                           for v in range(256)], np.int64)


def _hash_ids(words: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
  """64-bit hash of each id from its packed words (see `_pack_ids`) and its length.

  Per word: xor into the state, then the splitmix64 finalizer (a bijection of 64-bit values).
  Only the words within each id's length are mixed, so an id's hash does not depend on the width
  of the batch it comes in. Collisions are possible; `_LogBuilder` detects them exactly.
  """
  hashes = np.full(lengths.size, _FNV_OFFSET + np.uint64(seed), np.uint64)
  for k, word in enumerate(np.concatenate([words, lengths.astype(np.uint64)[None, :]])):
    inside = lengths > 8 * k if k < words.shape[0] else True
    mixed = hashes ^ word
    mixed ^= mixed >> np.uint64(30)
    mixed *= _MIX_1
    mixed ^= mixed >> np.uint64(27)
    mixed *= _MIX_2
    mixed ^= mixed >> np.uint64(31)
    hashes = np.where(inside, mixed, hashes)
  return hashes


def _pack_ids(byte_column, lengths: np.ndarray) -> np.ndarray:
  """The ids as little-endian uint64 words (num_words x rows; byte j in word j // 8, 0 past each
  length); `byte_column(j)` returns byte j of every id (0 where it is shorter)."""
  width = max(int(lengths.max()), 1)
  words = np.zeros((-(-width // 8), lengths.size), np.uint64)
  for j in range(width):
    words[j // 8] |= byte_column(j).astype(np.uint64) << np.uint64(8 * (j % 8))
  return words


class _Rows(NamedTuple):
  """A batch of rows with its distinct ids found (`_prepare_rows`), ready for `_LogBuilder.add_rows`.

  hashes: sorted distinct 64-bit id hashes; names, lengths: the id bytes and byte length of each;
  inverse: for every row, the index of its id in `hashes`; rounds: int64 round of every row.
  """
  hashes: np.ndarray
  names: np.ndarray
  lengths: np.ndarray
  inverse: np.ndarray
  rounds: np.ndarray


def _prepare_rows(words: np.ndarray, lengths: np.ndarray, rounds: np.ndarray, seed: int) -> _Rows:
  """Groups a batch's rows by id (ids packed by `_pack_ids`, their byte lengths, int64 rounds).

  Needs no state of the log, so `_read_unquoted` runs it for the next chunk while the previous one
  is added. Raises `_HashCollision` when two distinct ids of the batch share a hash.
  """
  if not rounds.size:
    return _Rows(np.zeros(0, np.uint64), np.zeros(0, 'S8'), np.zeros(0, np.int64),
                 np.zeros(0, np.int64), rounds)
  hashes = _hash_ids(words, lengths, seed)
  order = np.argsort(hashes)  # np.unique's return_index would use a (slower) stable sort
  sorted_hashes = hashes[order]
  new_group = np.concatenate([[True], sorted_hashes[1:] != sorted_hashes[:-1]])
  unique, first = sorted_hashes[new_group], order[new_group]  # first: any row of each hash
  inverse = np.empty(hashes.size, np.int64)
  inverse[order] = np.cumsum(new_group) - 1
  representative = first[inverse]
  if not (np.array_equal(lengths[representative], lengths) and
          all(np.array_equal(word[representative], word) for word in words)):
    raise _HashCollision()
  # Little-endian words hold byte j at offset j; ids never contain NUL bytes (text CSV), so the
  # `S` view strips exactly the padding.
  names = np.ascontiguousarray(words[:, first].T.astype('<u8')).view(
      f'S{8 * words.shape[0]}').reshape(-1)
  return _Rows(unique, names, lengths[first].astype(np.int64), inverse, rounds)


class _LogBuilder:
  """Turns rows (id bytes, round) into a `ParticipationLog`, one batch of rows at a time.

  Ids get codes in order of first appearance, through a sorted table of their 64-bit hashes; every
  hash match (within a batch and against the table) is checked byte for byte, and a mismatch raises
  `_HashCollision` (the caller reads again with another seed), so the grouping is exact.
  """

  def __init__(self, path: str, seed: int):
    self.where = path or 'log'
    self.seed = seed
    self._hashes = np.zeros(0, np.uint64)  # sorted
    self._hash_codes = np.zeros(0, np.int64)
    self._names = np.zeros(0, 'S1')
    self._lengths = np.zeros(0, np.int64)
    self._bits = _BitMatrix()
    self._min_round = 0
    self._path = path

  def add_rows(self, rows: '_Rows') -> None:
    """Adds a batch of rows prepared by `_prepare_rows` (with this builder's seed)."""
    if not rows.rounds.size:
      return
    codes = self._codes(rows.hashes, rows.names, rows.lengths)[rows.inverse]
    self._min_round = min(self._min_round, int(rows.rounds.min()))
    keep = rows.rounds >= 0
    self._bits.add(codes[keep], rows.rounds[keep], self._names.size, self.where)

  def add_text_ids(self, ids: Sequence[str], rounds: np.ndarray) -> None:
    """Adds rows whose ids are str (the csv-module path and `from_arrays`)."""
    encoded = [i.encode('utf-8') for i in ids]
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    width = max(int(lengths.max()) if lengths.size else 0, 1)
    matrix = np.array(encoded, dtype=f'S{width}').view(np.uint8).reshape(len(encoded), width)
    self.add_rows(_prepare_rows(_pack_ids(lambda j: matrix[:, j], lengths), lengths, rounds,
                                self.seed))

  def _codes(self, hashes: np.ndarray, names: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Code of each distinct id of a batch (sorted distinct `hashes`), new ids appended."""
    position = np.minimum(np.searchsorted(self._hashes, hashes), max(self._hashes.size - 1, 0))
    found = (self._hashes[position] == hashes) if self._hashes.size else np.zeros(hashes.size, bool)
    codes = np.empty(hashes.size, np.int64)
    codes[found] = self._hash_codes[position[found]]
    known = codes[found]
    if not (np.array_equal(self._lengths[known], lengths[found]) and
            np.array_equal(self._names[known], names[found])):
      raise _HashCollision()
    new = np.flatnonzero(~found)
    codes[new] = np.arange(self._names.size, self._names.size + new.size)
    if new.size:
      self._names = np.concatenate([self._names, names[new]])
      self._lengths = np.concatenate([self._lengths, lengths[new]])
      all_hashes = np.concatenate([self._hashes, hashes[new]])
      order = np.argsort(all_hashes, kind='stable')
      self._hashes = all_hashes[order]
      self._hash_codes = np.concatenate([self._hash_codes, codes[new]])[order]
    return codes

  def finish(self) -> ParticipationLog:
    """The log; raises ValueError on negative rounds, then on a (client, round) logged twice."""
    if self._min_round < 0:
      raise ValueError(f'{self.where}: rounds must be non-negative, found {self._min_round}.')
    bits = self._bits
    if bits.repeats:
      code, round_num = bits.first_repeat
      raise ValueError(f'{self.where}: client {self._names[code].decode("utf-8")!r} is logged '
                       f'twice in round {round_num} ({bits.repeats} duplicate rows).')
    num_clients = self._names.size
    participations = np.zeros(num_clients, np.int64)
    min_gaps = np.zeros(num_clients, np.int64)
    gap_gcds = np.zeros(num_clients, np.int64)
    round_counts = np.zeros(bits.row_bytes * 8, np.int64)
    for block_index, block in enumerate(bits.blocks):
      for start in range(0, block.shape[0], _SCAN_CLIENTS):
        base = block_index * _BLOCK_CLIENTS + start
        if base >= num_clients:
          break
        rows, rounds = _bit_rows(block[start:start + min(_SCAN_CLIENTS, num_clients - base)])
        participations[base:base + _SCAN_CLIENTS] = np.bincount(
            rows, minlength=min(_SCAN_CLIENTS, num_clients - base))
        round_counts += np.bincount(rounds, minlength=round_counts.size)
        same = rows[1:] == rows[:-1]
        gaps, owners = np.diff(rounds)[same], rows[1:][same]
        if gaps.size:
          starts = np.flatnonzero(np.concatenate([[True], owners[1:] != owners[:-1]]))
          min_gaps[base + owners[starts]] = np.minimum.reduceat(gaps, starts)
          gap_gcds[base + owners[starts]] = np.gcd.reduceat(gaps, starts)
    used = np.flatnonzero(round_counts)
    round_counts = round_counts[:used[-1] + 1 if used.size else 0]
    return ParticipationLog(client_ids=self._names, participations=participations,
                            min_gaps=min_gaps, gap_gcds=gap_gcds, round_counts=round_counts,
                            bits=tuple(bits.blocks), path=self._path)


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


def _parse_chunk(chunk: bytes, seed: int, path: str) -> _Rows:
  """The rows of `chunk` (whole lines of an unquoted body), grouped by `_prepare_rows`.

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
    return _prepare_rows(np.zeros((0, 0), np.uint64), np.zeros(0, np.int64),
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
    word[:] = at_offset[line_starts + 8 * k] & _LOW_BYTES[np.clip(lengths - 8 * k, 0, 8)]
  return _prepare_rows(words, lengths, rounds, seed)


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


def _read_unquoted(path: str, chunk_bytes: int, seed: int) -> ParticipationLog:
  """The vectorized path: raises `_QuotedLog` as soon as the body shows a double quote.

  Two stages overlap: a worker thread parses and groups chunk i + 1 (`_parse_chunk`) while this
  thread adds chunk i to the log (`_LogBuilder.add_rows`). numpy releases the GIL in the sorts and
  array operations of both, so they share two cores; at most two chunks' arrays are alive.
  """
  builder = _LogBuilder(path, seed)
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


def _add_parsed(builder: _LogBuilder, parsing: concurrent.futures.Future, rows: int, f,
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


def _read_quoted(path: str, seed: int) -> ParticipationLog:
  """The csv-module path (quoted fields, possibly with commas or line ends inside)."""
  builder = _LogBuilder(path, seed)
  with open(path, 'rb') as raw:
    raw.readline()  # the header, checked by `_read_unquoted`
    reader = csv.reader(io.TextIOWrapper(raw, encoding='utf-8', newline=''))
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
      if not -2**63 <= rounds[-1] < 2**63:
        raise ValueError(f'{path}:{line_num}: round {row[1]!r} is out of range.')
      ids.append(row[0])
      if len(ids) == _QUOTED_BATCH:
        builder.add_text_ids(ids, np.array(rounds, np.int64))
        ids, rounds = [], []
    builder.add_text_ids(ids, np.array(rounds, np.int64))
  return builder.finish()


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
  for seed in range(_HASH_SEEDS):
    try:
      try:
        return _read_unquoted(path, chunk_bytes, seed)
      except _QuotedLog:
        return _read_quoted(path, seed)
    except _HashCollision:
      continue
  raise _collision_error(path)
