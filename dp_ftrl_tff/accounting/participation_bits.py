"""The (client, round) bit matrix of a participation log and the builder that groups client ids.

`LogBuilder` turns batches of rows (client id bytes, 0-based round) into the arrays of a
`participation_log.ParticipationLog` (`LogArrays`): ids get codes in order of first appearance
through a 64-bit hash of their bytes (`hash_ids`), every hash match is checked byte for byte, and a
collision raises `HashCollision` so the reader starts again with the next of `HASH_SEEDS` seeds; the
participations are one bit per (client, round) (`BitMatrix`, blocks of `BLOCK_CLIENTS` clients),
order-free, so a repeated row is caught exactly. The CSV parsing is `participation_csv`'s.
"""

from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from dp_ftrl_tff.mechanisms import memory

BLOCK_CLIENTS = 1 << 16  # clients per block of the participation bit matrix
SCAN_CLIENTS = 1 << 14  # clients expanded to (client, round) rows at once
HASH_SEEDS = 3  # a hash collision between two distinct ids restarts the read with the next seed
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)  # hash seed 0's initial state
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finalizer constants
_MIX_2 = np.uint64(0x94D049BB133111EB)


class HashCollision(Exception):
  """Two distinct client ids have the same 64-bit hash under the current seed."""


class LogArrays(NamedTuple):
  """The fields of a `participation_log.ParticipationLog` (see its attributes)."""
  client_ids: np.ndarray
  participations: np.ndarray
  min_gaps: np.ndarray
  gap_gcds: np.ndarray
  round_counts: np.ndarray
  bits: tuple


def bit_rows(rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """(row index, round) of every set bit of a (clients, bytes) block, sorted by row then round.

  Expands only the non-zero bytes (a client's row is mostly zeros), by table lookups.
  """
  row_index, byte_index = np.nonzero(rows)
  values = rows[row_index, byte_index]
  counts = _POPCOUNT[values]
  owner = np.repeat(np.arange(values.size), counts)
  rank = np.arange(owner.size) - np.repeat(np.cumsum(counts, dtype=np.int64) - counts, counts)
  return row_index[owner], byte_index[owner] * 8 + _BIT_POSITIONS[values[owner], rank]


def collision_error(where: str) -> ValueError:
  return ValueError(f'{where}: two distinct client ids share a 64-bit hash under each of '
                    f'{HASH_SEEDS} seeds; the log cannot be grouped exactly.')


class BitMatrix:
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
    full, rest = divmod(num_clients, BLOCK_CLIENTS)
    last = 0 if not rest else min(BLOCK_CLIENTS, 1 << (rest - 1).bit_length())
    needed = (full * BLOCK_CLIENTS + last) * row_bytes
    held = sum(block.nbytes for block in self.blocks)
    if needed > held + memory.available_bytes():
      raise memory.MemoryLimitError(
          f'{where}: one bit per (client, round) for {num_clients} clients x {num_rounds} rounds '
          f'needs {memory.format_bytes(needed)}, more than the memory available.')
    sizes = [BLOCK_CLIENTS] * full + ([last] if last else [])
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
    block_of = keys // (BLOCK_CLIENTS * row_bits)
    bounds = np.searchsorted(block_of, np.arange(len(self.blocks) + 1))
    for b in np.unique(block_of):
      local = keys[bounds[b]:bounds[b + 1]] - b * (BLOCK_CLIENTS * row_bits)
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
        self._note_repeat(b * BLOCK_CLIENTS * row_bits + local_key,
                          int(_POPCOUNT[clash].sum(dtype=np.int64)), row_bits)
      flat[positions] = old | values

  def _note_repeat(self, key: int, count: int, row_bits: int) -> None:
    if self.first_repeat is None:
      self.first_repeat = divmod(key, row_bits)
    self.repeats += count


_POPCOUNT = np.array([bin(i).count('1') for i in range(256)], np.uint8)
#: LOW_BYTES[i]: the mask of the i low bytes of a uint64 (i = 0 .. 8).
LOW_BYTES = np.array([(1 << (8 * i)) - 1 for i in range(9)], np.uint64)
#: _BIT_POSITIONS[v, k]: the position of the k-th set bit of byte v, least significant first.
_BIT_POSITIONS = np.array([[j for j in range(8) if v >> j & 1] + [0] * (8 - bin(v).count('1'))
                           for v in range(256)], np.int64)


def hash_ids(words: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
  """64-bit hash of each id from its packed words (see `pack_ids`) and its length.

  Per word: xor into the state, then the splitmix64 finalizer (a bijection of 64-bit values).
  Only the words within each id's length are mixed, so an id's hash does not depend on the width
  of the batch it comes in. Collisions are possible; `LogBuilder` detects them exactly.
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


def pack_ids(byte_column, lengths: np.ndarray) -> np.ndarray:
  """The ids as little-endian uint64 words (num_words x rows; byte j in word j // 8, 0 past each
  length); `byte_column(j)` returns byte j of every id (0 where it is shorter)."""
  width = max(int(lengths.max()), 1)
  words = np.zeros((-(-width // 8), lengths.size), np.uint64)
  for j in range(width):
    words[j // 8] |= byte_column(j).astype(np.uint64) << np.uint64(8 * (j % 8))
  return words


class Rows(NamedTuple):
  """A batch of rows with its distinct ids found (`prepare_rows`), ready for `LogBuilder.add_rows`.

  hashes: sorted distinct 64-bit id hashes; names, lengths: the id bytes and byte length of each;
  inverse: for every row, the index of its id in `hashes`; rounds: int64 round of every row.
  """
  hashes: np.ndarray
  names: np.ndarray
  lengths: np.ndarray
  inverse: np.ndarray
  rounds: np.ndarray


def prepare_rows(words: np.ndarray, lengths: np.ndarray, rounds: np.ndarray, seed: int) -> Rows:
  """Groups a batch's rows by id (ids packed by `pack_ids`, their byte lengths, int64 rounds).

  Needs no state of the log, so `_read_unquoted` runs it for the next chunk while the previous one
  is added. Raises `HashCollision` when two distinct ids of the batch share a hash.
  """
  if not rounds.size:
    return Rows(np.zeros(0, np.uint64), np.zeros(0, 'S8'), np.zeros(0, np.int64),
                 np.zeros(0, np.int64), rounds)
  hashes = hash_ids(words, lengths, seed)
  order = np.argsort(hashes)  # np.unique's return_index would use a (slower) stable sort
  sorted_hashes = hashes[order]
  new_group = np.concatenate([[True], sorted_hashes[1:] != sorted_hashes[:-1]])
  unique, first = sorted_hashes[new_group], order[new_group]  # first: any row of each hash
  inverse = np.empty(hashes.size, np.int64)
  inverse[order] = np.cumsum(new_group) - 1
  representative = first[inverse]
  if not (np.array_equal(lengths[representative], lengths) and
          all(np.array_equal(word[representative], word) for word in words)):
    raise HashCollision()
  # Little-endian words hold byte j at offset j; ids never contain NUL bytes (text CSV), so the
  # `S` view strips exactly the padding.
  names = np.ascontiguousarray(words[:, first].T.astype('<u8')).view(
      f'S{8 * words.shape[0]}').reshape(-1)
  return Rows(unique, names, lengths[first].astype(np.int64), inverse, rounds)


class LogBuilder:
  """Turns rows (id bytes, round) into the arrays of a `ParticipationLog`, one batch of rows at a time.

  Ids get codes in order of first appearance, through a sorted table of their 64-bit hashes; every
  hash match (within a batch and against the table) is checked byte for byte, and a mismatch raises
  `HashCollision` (the caller reads again with another seed), so the grouping is exact.
  """

  def __init__(self, path: str, seed: int):
    self.where = path or 'log'
    self.seed = seed
    self._hashes = np.zeros(0, np.uint64)  # sorted
    self._hash_codes = np.zeros(0, np.int64)
    self._names = np.zeros(0, 'S1')
    self._lengths = np.zeros(0, np.int64)
    self._bits = BitMatrix()
    self._min_round = 0

  def add_rows(self, rows: 'Rows') -> None:
    """Adds a batch of rows prepared by `prepare_rows` (with this builder's seed)."""
    if not rows.rounds.size:
      return
    codes = self._codes(rows.hashes, rows.names, rows.lengths)[rows.inverse]
    self._min_round = min(self._min_round, int(rows.rounds.min()))
    keep = rows.rounds >= 0
    self._bits.add(codes[keep], rows.rounds[keep], self._names.size, self.where)

  def add_text_ids(self, ids: Sequence[str], rounds: np.ndarray) -> None:
    """Adds rows whose ids are str (the csv-module path and `from_arrays`); none: nothing."""
    if not len(ids):
      return
    encoded = [i.encode('utf-8') for i in ids]
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    width = max(int(lengths.max()) if lengths.size else 0, 1)
    matrix = np.array(encoded, dtype=f'S{width}').view(np.uint8).reshape(len(encoded), width)
    self.add_rows(prepare_rows(pack_ids(lambda j: matrix[:, j], lengths), lengths, rounds,
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
      raise HashCollision()
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

  def finish(self) -> LogArrays:
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
      for start in range(0, block.shape[0], SCAN_CLIENTS):
        base = block_index * BLOCK_CLIENTS + start
        if base >= num_clients:
          break
        rows, rounds = bit_rows(block[start:start + min(SCAN_CLIENTS, num_clients - base)])
        participations[base:base + SCAN_CLIENTS] = np.bincount(
            rows, minlength=min(SCAN_CLIENTS, num_clients - base))
        round_counts += np.bincount(rounds, minlength=round_counts.size)
        same = rows[1:] == rows[:-1]
        gaps, owners = np.diff(rounds)[same], rows[1:][same]
        if gaps.size:
          starts = np.flatnonzero(np.concatenate([[True], owners[1:] != owners[:-1]]))
          min_gaps[base + owners[starts]] = np.minimum.reduceat(gaps, starts)
          gap_gcds[base + owners[starts]] = np.gcd.reduceat(gaps, starts)
    used = np.flatnonzero(round_counts)
    round_counts = round_counts[:used[-1] + 1 if used.size else 0]
    return LogArrays(client_ids=self._names, participations=participations, min_gaps=min_gaps,
                     gap_gcds=gap_gcds, round_counts=round_counts, bits=tuple(bits.blocks))
