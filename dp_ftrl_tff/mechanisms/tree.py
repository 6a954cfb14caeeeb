"""Tree aggregation: tree matrices, decoders, and exact multi-participation sensitivity.

Implements the binary-tree mechanism of DP-FTRL (Kairouz et al. 2021, App. B.1, B.3 and D;
docs/papers.md#dp-ftrl) as a matrix factorization, and TreeAgg-Full (BLT paper Sec. 2.3 and Table 3;
docs/papers.md#blt).

Conventions: rounds (leaves) are 0-based, t = 0 .. n-1; `min_sep` = b: two participations r1 < r2
of one client satisfy r2 - r1 >= b (TF-Privacy's `min_separation` = b - 1).

Nodes and their ORDER (the rows of C and of z). A node is a dyadic interval [s, s + 2^h) of
rounds, at height h (leaves have h = 0, s a multiple of 2^h). Only *released* nodes are rows of C:
  * completion=False (streaming default): every complete node, [s, s + 2^h) inside [0, n); these are
    the nodes of the complete subtrees of the binary decomposition of n, largest first;
  * completion=True: every node of the tree over 2^ceil(log2 n) leaves that holds at least one real
    leaf (leaves >= n are virtual zero rounds, as in the paper's tree completion trick).
Rows are sorted by the round at which the node's last leaf arrives, e = s + 2^h - 1, then by height:
round t completes the nodes of heights 0 .. ctz(t + 1) ending at t. So the node of height h ending
at round e < n is row 2 e - popcount(e) + h (the number of complete nodes ending before e, plus h).
A streaming implementation draws z row r for node r (`dp_ftrl_tff.noise.tree.TreeNoise`).

Decoders B (noise on the prefix sums, B C = A on the released rows):
  * 'vanilla': the dyadic decomposition of [0, t] (popcount(t + 1) nodes), variance popcount(t + 1);
  * 'efficient' (Honaker, streaming): each decomposition node N of height H is replaced by
    r'_N / (2 - 2^-H), with r'_N = z_N + (r'_left + r'_right) / 2 (DP-FTRL paper App. B.1, Eq. 4;
    its denominator typo 2 - (x - z + 1)^-1 is corrected to 2 - 1 / #leaves, see
    docs/papers.md#misprints). Node N's descendant at depth d gets weight 2^-d / (2 - 2^-H);
  * 'full' (TreeAgg-Full, offline, not streamable): B = A C^+ (Moore-Penrose pseudo-inverse).
The per-round noise matrix is M = A^-1 B (the residual of the noisy prefix sums).

Sensitivity. With clip norm 1, sens^2 = max over admissible participation patterns u of
||C u||^2 = sum over released nodes of (number of participations under the node)^2. It is the same
for the three decoders (same C). `tree_sensitivity_squared` computes it EXACTLY by a dynamic program
over the tree (see `_concat`), in O(log n * k^2 * b^2 * R) time (R = the number of distinct values a
node table takes along one axis, small in practice); `segments_sensitivity_squared` does the same
for a run with tree restarts, with the min-sep constraint spanning the segments (also exact).
"""

import dataclasses
from typing import Sequence, Tuple, Union

import numpy as np
import scipy.linalg
import scipy.sparse

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import base
from dp_ftrl_tff.mechanisms import participation as participation_lib

VARIANTS = ('vanilla', 'efficient', 'full')
_NAMES = {'vanilla': 'tree', 'efficient': 'tree_efficient', 'full': 'tree_full'}

# "Infeasible" in the integer DP tables. Entries are clamped at _NEG after every sum of two entries,
# so int32 never overflows as long as real values stay below 2^27 (checked in `_check_dp_size`).
_NEG = np.int32(-(1 << 28))


# ------------------------------------------------------------------------------------------------
# Node enumeration.
# ------------------------------------------------------------------------------------------------


def _popcount(x) -> np.ndarray:
  """Number of set bits of each entry of a non-negative int array."""
  x = np.array(x, dtype=np.int64, copy=True)
  count = np.zeros_like(x)
  while np.any(x):
    count += x & 1
    x >>= 1
  return count


def _padded_leaves(num_rounds: int) -> int:
  """2^ceil(log2 n): the number of leaves of the completed tree."""
  return 1 << (num_rounds - 1).bit_length()


def node_row(end, height) -> np.ndarray:
  """Row index (in `tree_nodes` order) of the node of height `height` whose last round is `end`.

  Valid for nodes ending before the last real round n - 1 (and always for completion=False):
  2 * end - popcount(end) + height. Vectorized over int arrays.
  """
  end = np.asarray(end, dtype=np.int64)
  height = np.asarray(height, dtype=np.int64)
  if np.any(end < 0) or np.any(height < 0) or np.any(((end + 1) % (1 << height)) != 0):
    raise ValueError('`end` and `height` must describe dyadic nodes: (end + 1) a multiple of '
                     '2^height, both non-negative.')
  return 2 * end - _popcount(end) + height


def tree_nodes(num_rounds: int, completion: bool = False) -> Tuple[np.ndarray, np.ndarray]:
  """The released nodes, in row order: (starts, heights), int64 arrays of equal length.

  Args:
    num_rounds: n, the number of real rounds (leaves).
    completion: False: complete nodes inside [0, n) (2n - popcount(n) of them). True: every node of
      the tree over 2^ceil(log2 n) leaves that holds at least one real leaf.

  Returns:
    Node r covers rounds [starts[r], starts[r] + 2^heights[r]); rows are sorted by last leaf, then
    height (see the module docstring).
  """
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  completion = _check_bool(completion, 'completion')
  leaves = _padded_leaves(num_rounds) if completion else num_rounds
  starts, heights = [], []
  height = 0
  while (1 << height) <= leaves:
    size = 1 << height
    s = np.arange(0, leaves - size + 1, size, dtype=np.int64)
    s = s[s < num_rounds]  # completion: drop all-virtual nodes; otherwise a no-op
    starts.append(s)
    heights.append(np.full(s.shape, height, dtype=np.int64))
    height += 1
  starts = np.concatenate(starts)
  heights = np.concatenate(heights)
  ends = starts + (np.int64(1) << heights) - 1
  order = np.lexsort((heights, ends))
  return starts[order], heights[order]


def tree_matrix(num_rounds: int, completion: bool = False) -> np.ndarray:
  """C: (#nodes, n) 0/1 float64, row r is the indicator of node r's real rounds (`tree_nodes`)."""
  starts, heights = tree_nodes(num_rounds, completion)
  rounds = np.arange(num_rounds)
  ends = starts + (np.int64(1) << heights)
  return ((rounds[None, :] >= starts[:, None]) & (rounds[None, :] < ends[:, None])).astype(
      np.float64)


def _decomposition(prefix_len: int):
  """The dyadic decomposition of [0, prefix_len): (start, height) pairs, largest first."""
  start = 0
  for height in range(prefix_len.bit_length() - 1, -1, -1):
    if prefix_len >> height & 1:
      yield start, height
      start += 1 << height


def _decoder_streaming(num_rounds: int, num_nodes: int, efficient: bool) -> np.ndarray:
  """B for the vanilla or Honaker-efficient streaming decoder: (n, #nodes) float64.

  B = D E with D the 0/1 binary decomposition (round t uses the node of height h that covers bit h
  of t + 1) and E the per-node estimate: the identity (vanilla) or, for a node of height H, weight
  2^-d / (2 - 2^-H) on each descendant at depth d (Honaker).
  """
  prefix = np.arange(1, num_rounds + 1, dtype=np.int64)
  rows, cols = [], []
  for height in range(num_rounds.bit_length()):
    used = (prefix >> height & 1) == 1
    ends = (prefix[used] >> (height + 1) << (height + 1)) + (1 << height) - 1
    rows.append(np.nonzero(used)[0])
    cols.append(node_row(ends, height))
  rows, cols = np.concatenate(rows), np.concatenate(cols)
  decomposition = scipy.sparse.csr_matrix((np.ones(rows.size), (rows, cols)),
                                          shape=(num_rounds, num_nodes))
  if not efficient:
    return decomposition.toarray()
  rows, cols, weights = [], [], []
  for height in range(num_rounds.bit_length()):
    node_ends = np.arange((1 << height) - 1, num_rounds, 1 << height, dtype=np.int64)
    for depth in range(height + 1):
      size = 1 << (height - depth)
      sub_ends = node_ends[:, None] - size * np.arange(1 << depth)[None, :]
      rows.append(np.repeat(node_row(node_ends, height), 1 << depth))
      cols.append(node_row(sub_ends.ravel(), height - depth))
      weights.append(np.full(sub_ends.size, 2.0**-depth / (2.0 - 2.0**-height)))
  estimate = scipy.sparse.csr_matrix(
      (np.concatenate(weights), (np.concatenate(rows), np.concatenate(cols))),
      shape=(num_nodes, num_nodes))
  return (decomposition @ estimate).toarray()


def _leaf_gram(num_rounds: int, completion: bool) -> np.ndarray:
  """G = C^T C: G[p, q] = number of released nodes holding both rounds p and q."""
  rounds = np.arange(num_rounds, dtype=np.int64)
  top = (_padded_leaves(num_rounds) if completion else num_rounds).bit_length()
  gram = np.zeros((num_rounds, num_rounds))
  for height in range(top):
    node = rounds >> height
    released = np.ones(num_rounds, bool) if completion else ((node + 1) << height) <= num_rounds
    gram += (node[:, None] == node[None, :]) & released[:, None]
  return gram


def _full_gram_inverse(num_rounds: int, completion: bool) -> np.ndarray:
  """(C^T C)^-1, so that C^+ = (C^T C)^-1 C^T (C has full column rank: every leaf is a row)."""
  factor = scipy.linalg.cho_factor(_leaf_gram(num_rounds, completion), lower=True)
  return scipy.linalg.cho_solve(factor, np.eye(num_rounds))


# ------------------------------------------------------------------------------------------------
# Exact sensitivity: dynamic program over blocks of rounds.
# ------------------------------------------------------------------------------------------------
#
# A "block" is a run of consecutive real rounds together with the released nodes inside it. Its
# table T has shape (K + 1, D, D), D = min(b, n): T[c, a, e] is the largest sum over the block's
# nodes of (count in node)^2 over patterns of exactly c participations, pairwise >= b apart, whose
# first participation is at offset >= a from the block start and whose last one is at offset
# <= len - 1 - e (_NEG if there is none). T is non-increasing in a and e. Offsets and gaps are
# counted in real rounds: virtual (completion) leaves have length 0.
#
# Concatenating X then Y (`_concat`): all c in X (Y lengthens the tail: e -> max(e - len_Y, 0)),
# all in Y (a -> max(a - len_X, 0)), or c1 >= 1 in X and c2 >= 1 in Y. In the last case the gap
# between X's last and Y's first participation is e1 + a2 + 1 where e1, a2 are the exact margins,
# so max_{e1 in [0, b-1]} X[c1, a, e1] + Y[c2, b-1-e1, e] is exact (margins >= b-1 are all
# equivalent to b-1 by monotonicity). A node adds c^2 to the concatenation of its two children.
# All nodes of one height are translates of each other, so one table per height serves the tree.


@dataclasses.dataclass(frozen=True)
class _Block:
  table: np.ndarray  # (K + 1, D, D) int32
  length: int  # real rounds


def _leaf_block(width: int, max_count: int) -> _Block:
  table = np.full((min(1, max_count) + 1, width, width), _NEG, np.int32)
  table[0] = 0
  if max_count >= 1:
    table[1, 0, 0] = 1  # one participation in one leaf: a = e = 0 only
  return _Block(table, 1)


def _virtual_block(width: int) -> _Block:
  return _Block(np.zeros((1, width, width), np.int32), 0)


def _candidate_margins(table_c: np.ndarray) -> np.ndarray:
  """Per row a, the e1 where table_c[a, e1] > table_c[a, e1 + 1] (and e1 = D - 1): (D, R) int.

  The max over e1 of table_c[a, e1] + (non-decreasing in e1) is attained at one of these. Rows are
  padded with e1 = 0, which is always an admissible (if not optimal) choice.
  """
  width = table_c.shape[0]
  drops = np.ones_like(table_c, dtype=bool)
  drops[:, :-1] = table_c[:, :-1] > table_c[:, 1:]
  drops &= table_c > _NEG
  rows, cols = np.nonzero(drops)
  counts = np.bincount(rows, minlength=width)
  margins = np.zeros((width, max(int(counts.max(initial=0)), 1)), np.int64)
  rank = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
  margins[rows, rank] = cols
  return margins


def _concat(left: _Block, right: _Block, max_count: int) -> _Block:
  """The block `left` followed by `right` (no node spans both)."""
  kl, kr = left.table.shape[0] - 1, right.table.shape[0] - 1
  width = left.table.shape[1]
  # At most ceil(length / b) participations fit (width = b whenever two can fit at all).
  k = min(max_count, kl + kr, -(-(left.length + right.length) // width))
  offsets = np.arange(width)
  out = np.full((k + 1, width, width), _NEG, np.int32)
  out[:min(kl, k) + 1] = left.table[:k + 1][:, :, np.maximum(offsets - right.length, 0)]
  top = min(kr, k) + 1
  np.maximum(out[1:top], right.table[1:top][:, np.maximum(offsets - left.length, 0), :],
             out=out[1:top])
  rows = np.arange(width)
  for c1 in range(1, min(kl, k - 1) + 1):
    k2 = min(kr, k - c1)
    if k2 < 1:
      continue
    table_c1 = left.table[c1]
    margins = _candidate_margins(table_c1)
    for r in range(margins.shape[1]):
      e1 = margins[:, r]
      left_vals = table_c1[rows, e1]
      cand = left_vals[None, :, None] + right.table[1:k2 + 1][:, width - 1 - e1, :]
      np.maximum(cand, _NEG, out=cand)
      np.maximum(out[c1 + 1:c1 + k2 + 1], cand, out=out[c1 + 1:c1 + k2 + 1])
  return _Block(out, left.length + right.length)


def _as_node(block: _Block) -> _Block:
  """Adds the node term c^2 over the whole block (the block is exactly one released node)."""
  counts = np.arange(block.table.shape[0], dtype=np.int32)[:, None, None]
  table = np.where(block.table > _NEG, block.table + counts**2, _NEG).astype(np.int32)
  return _Block(table, block.length)


class _BlockBuilder:
  """Tables of complete subtrees (cached per height) and of completed (padded) segments."""

  def __init__(self, width: int, max_count: int):
    self._width = width
    self._max_count = max_count
    self._complete = [_leaf_block(width, max_count)]

  def complete(self, height: int) -> _Block:
    while len(self._complete) <= height:
      child = self._complete[-1]
      self._complete.append(_as_node(_concat(child, child, self._max_count)))
    return self._complete[height]

  def partial(self, height: int, real: int) -> _Block:
    """A node of height `height` whose first `real` leaves are real, the rest virtual."""
    if real == 1 << height:
      return self.complete(height)
    if real == 0:
      return _virtual_block(self._width)
    half = 1 << (height - 1)
    left = self.partial(height - 1, min(real, half))
    right = self.partial(height - 1, max(real - half, 0))
    return _as_node(_concat(left, right, self._max_count))

  def segment(self, length: int, completed: bool) -> _Block:
    """A tree segment of `length` real rounds: a forest of complete subtrees, or one padded tree."""
    if completed:
      return self.partial((length - 1).bit_length(), length)
    block = None
    for _, height in _decomposition(length):
      sub = self.complete(height)
      block = sub if block is None else _concat(block, sub, self._max_count)
    return block


def _check_bool(value, name: str) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f'`{name}` must be a bool, got {value!r}.')
  return bool(value)


def _check_segments(segment_lengths, completion) -> Tuple[Tuple[int, ...], Tuple[bool, ...]]:
  if isinstance(segment_lengths, (str, bytes)) or not hasattr(segment_lengths, '__len__') or (
      len(segment_lengths) == 0):
    raise ValueError(f'`segment_lengths` must be a non-empty sequence of positive ints, got '
                     f'{segment_lengths!r}.')
  lengths = tuple(_validation.check_positive_int(m, 'segment_lengths') for m in segment_lengths)
  if isinstance(completion, (bool, np.bool_)):
    completed = (bool(completion),) * len(lengths)
  else:
    if not hasattr(completion, '__len__') or len(completion) != len(lengths):
      raise ValueError(f'`completion` must be a bool or one bool per segment, got {completion!r}.')
    completed = tuple(_check_bool(c, 'completion') for c in completion)
  return lengths, completed


#: Entries of the exact sensitivity's tables, k^2 (bit length of n + 1), that it builds at most:
#: 2^27, half a GB of int32 (and the int32 counts stay exact below it).
_MAX_TABLE_ENTRIES = 1 << 27


def _check_dp_size(max_count: int, num_rounds: int) -> None:
  entries = max_count**2 * (num_rounds.bit_length() + 1)
  if entries >= _MAX_TABLE_ENTRIES:
    raise ValueError(
        f'the exact tree sensitivity of k={max_count} participations over `num_rounds`={num_rounds} '
        f'(k = min(`max_participations`, ceil(`num_rounds` / `min_sep`))) needs int32 tables of '
        f'k^2 (log2 n + 2) = {entries:.3g} entries, more than the 2^27 it builds; use fewer '
        '`num_rounds` or restarts, a larger `min_sep`, or a smaller `max_participations`.')


def segments_sensitivity_squared(segment_lengths: Sequence[int],
                                 participation: participation_lib.ParticipationSchema,
                                 completion: Union[bool, Sequence[bool]] = False) -> int:
  """Exact squared sensitivity (clip norm 1) of tree aggregation with restarts.

  The run is a sequence of independent trees (segments) of the given numbers of real rounds; global
  rounds are 0-based and contiguous across segments. The participation constraint (min-sep b, at
  most k participations, or fixed-epoch) applies to the whole run, across segment boundaries. The
  result is max over admissible patterns of sum over all released nodes of all segments of
  (count)^2: the squared sensitivity of the composed segments (rho = sens^2 / (2 sigma^2)).
  EXACT, not an upper bound.

  Args:
    segment_lengths: the number of real rounds of each tree, in order.
    participation: a `ParticipationSchema`.
    completion: one bool for all segments, or one per segment: a completed segment releases every
      node of its tree padded to 2^ceil(log2 m) leaves with virtual zero rounds (DP-FTRL's tree
      completion; the paper's code completes every segment except the last). Virtual rounds take no
      time: the min-sep gap is counted in real rounds.

  Returns:
    The squared sensitivity, an int.
  """
  lengths, completed = _check_segments(segment_lengths, completion)
  participation = participation_lib.check_participation(participation)
  num_rounds = sum(lengths)
  max_count = participation.effective_max_participations(num_rounds)
  if participation.fixed_epoch:
    return _fixed_epoch_sensitivity_squared(lengths, completed, participation)
  _check_dp_size(max_count, num_rounds)
  width = min(participation.min_sep, num_rounds)
  builder = _BlockBuilder(width, max_count)
  block = None
  for length, done in zip(lengths, completed, strict=True):
    segment = builder.segment(length, done)
    block = segment if block is None else _concat(block, segment, max_count)
  return int(block.table[:, 0, 0].max())


def tree_sensitivity_squared(num_rounds: int, participation: participation_lib.ParticipationSchema,
                             completion: bool = False) -> int:
  """Exact squared sensitivity of one tree over `num_rounds` rounds (see the segments version).

  Matches TF-Privacy's `compute_zcdp_single_tree(...) * 2 sigma^2` with its min_separation = b - 1,
  e.g. 79 for n=2000, k=6, b=314; single participation gives floor(log2 n) + 1.
  """
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  return segments_sensitivity_squared([num_rounds], participation,
                                      _check_bool(completion, 'completion'))


# ------------------------------------------------------------------------------------------------
# Sensitivity of given participation patterns (observed-participation accounting, lower bounds).
# ------------------------------------------------------------------------------------------------


def clients_sensitivity_squared(client_ids, rounds, segment_lengths: Sequence[int],
                                completion: Union[bool, Sequence[bool]] = False
                                ) -> Tuple[np.ndarray, np.ndarray]:
  """Per-client sum over released nodes of (client's participations under the node)^2.

  Vectorized over a participation log: entry i says client `client_ids[i]` took part in global round
  `rounds[i]` (0-based). Repeated (client, round) entries count as separate contributions (a leaf
  count of 2 adds 4).

  Args:
    client_ids: 1-D array of client identifiers (any sortable dtype).
    rounds: 1-D int array of the same length, each in [0, sum(segment_lengths)).
    segment_lengths: real rounds of each tree segment (one tree: `[num_rounds]`).
    completion: as in `segments_sensitivity_squared`.

  Returns:
    (ids, sens_squared): the sorted distinct client ids and their squared sensitivities (int64).
  """
  lengths, completed = _check_segments(segment_lengths, completion)
  client_ids = np.asarray(client_ids)
  rounds = np.asarray(rounds)
  if client_ids.ndim != 1 or rounds.ndim != 1 or client_ids.shape != rounds.shape:
    raise ValueError('`client_ids` and `rounds` must be 1-D arrays of the same length.')
  if rounds.size and (not np.issubdtype(rounds.dtype, np.integer) or rounds.min() < 0 or
                      rounds.max() >= sum(lengths)):
    raise ValueError(f'`rounds` must be integers in [0, {sum(lengths)}).')
  ids, client_index = np.unique(client_ids, return_inverse=True)
  totals = np.zeros(ids.size, np.int64)
  if not rounds.size:
    return ids, totals
  rounds = rounds.astype(np.int64)
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  segment = np.searchsorted(starts, rounds, side='right') - 1
  local = rounds - starts[segment]
  seg_len = np.asarray(lengths, np.int64)[segment]
  seg_done = np.asarray(completed)[segment]
  top = max(_padded_leaves(m) for m in lengths).bit_length()
  num_segments = len(lengths)
  node_stride = max(_padded_leaves(m) for m in lengths)  # node index < padded leaves at height 0
  if ids.size * num_segments * node_stride >= np.iinfo(np.int64).max:
    raise ValueError('`client_ids`: too many clients x rounds to index with int64 keys.')
  for height in range(top):
    node = local >> height
    released = np.where(seg_done, (_padded_leaves_array(seg_len) >> height) > 0,
                        ((node + 1) << height) <= seg_len)
    if not np.any(released):
      continue
    # One int64 key per (client, segment, node): 1-D np.unique is ~40x faster than unique(axis=0).
    keys = (client_index[released].astype(np.int64) * num_segments
            + segment[released]) * node_stride + node[released]
    uniq, counts = np.unique(keys, return_counts=True)
    np.add.at(totals, uniq // (num_segments * node_stride), counts.astype(np.int64)**2)
  return ids, totals


def _padded_leaves_array(lengths: np.ndarray) -> np.ndarray:
  """Vectorized `_padded_leaves`."""
  padded = np.ones_like(lengths)
  while np.any(padded < lengths):
    padded = np.where(padded < lengths, padded * 2, padded)
  return padded


def pattern_sensitivity_squared(num_rounds: int, rounds, completion: bool = False) -> int:
  """||C u||^2 for ONE participation pattern u (0-based rounds) of a single tree of n rounds."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  rounds = np.asarray(rounds).reshape(-1)  # integer check in `clients_sensitivity_squared`
  _, values = clients_sensitivity_squared(np.zeros(rounds.size, np.int64), rounds, [num_rounds],
                                          _check_bool(completion, 'completion'))
  return int(values.sum())


def earliest_pattern_sensitivity_squared(num_rounds: int,
                                         participation: participation_lib.ParticipationSchema,
                                         completion: bool = False) -> int:
  """BLT paper Remark 3.2 lower bound ||C u(pi*)||^2 with pi* = (0, b, ..., (k-1) b).

  The BLT paper accounts TreeAgg-Full with it (Table 3); `tree_sensitivity_squared` is exact.
  """
  participation = participation_lib.check_participation(participation)
  return pattern_sensitivity_squared(num_rounds, participation.earliest_pattern(num_rounds),
                                     completion)


def _fixed_epoch_sensitivity_squared(lengths, completed, participation) -> int:
  """Max over offsets j in [0, b) of the pattern j, j + b, ..., (k patterns; supersets dominate)."""
  num_rounds = sum(lengths)
  k = participation.effective_max_participations(num_rounds)
  b = participation.min_sep
  offsets = np.arange(min(b, num_rounds))
  rounds = offsets[:, None] + b * np.arange(k)[None, :]
  clients = np.broadcast_to(offsets[:, None], rounds.shape)
  keep = rounds < num_rounds
  _, values = clients_sensitivity_squared(clients[keep], rounds[keep], lengths, list(completed))
  return int(values.max())


# ------------------------------------------------------------------------------------------------
# The strategy.
# ------------------------------------------------------------------------------------------------


class TreeStrategy(base.Strategy):
  """Binary-tree aggregation as a factorization: C = `tree_matrix`, decoder per `variant`.

  Attributes:
    variant: 'vanilla' (name 'tree'), 'efficient' (Honaker streaming, name 'tree_efficient') or
      'full' (B = A C^+, name 'tree_full'; offline: B row t uses nodes completed after round t, so
      it has no streaming form and is meant for simulation figures, as in the BLT paper).
    completion: release the nodes of the tree padded to 2^ceil(log2 n) leaves (see `tree_nodes`).
      For 'vanilla'/'efficient' the decoder over rounds < n never uses the extra nodes (they only
      matter before a restart), so it only adds sensitivity; for 'full' it changes the decoder.
  """

  def __init__(self, variant: str = 'efficient', completion: bool = False):
    self.variant = _validation.check_one_of(variant, 'variant', VARIANTS)
    self.completion = _check_bool(completion, 'completion')
    self.name = _NAMES[self.variant]

  def num_nodes(self, num_rounds: int) -> int:
    """r: the number of released nodes (rows of C and of z)."""
    return int(tree_nodes(self.check_num_rounds(num_rounds), self.completion)[0].size)

  def strategy_matrix(self, num_rounds: int) -> np.ndarray:
    return tree_matrix(self.check_num_rounds(num_rounds), self.completion)

  def decoder_matrix(self, num_rounds: int) -> np.ndarray:
    """B, (n, r): vanilla / Honaker weights, or A C^+ for 'full'."""
    num_rounds = self.check_num_rounds(num_rounds)
    if self.variant == 'full':
      proj = _full_gram_inverse(num_rounds, self.completion) @ tree_matrix(num_rounds,
                                                                           self.completion).T
      return np.cumsum(proj, axis=0)
    return _decoder_streaming(num_rounds, self.num_nodes(num_rounds), self.variant == 'efficient')

  def noise_matrix(self, num_rounds: int) -> np.ndarray:
    """M = A^-1 B, (n, r): round t's noise is sigma * zeta * (M z)_t, z row r for node r."""
    decoder = self.decoder_matrix(num_rounds)
    return np.diff(decoder, axis=0, prepend=0.0)

  def sensitivity_squared(self, num_rounds: int,
                          participation: participation_lib.ParticipationSchema) -> float:
    """Exact max over patterns of ||C u||^2 (`tree_sensitivity_squared`)."""
    return float(tree_sensitivity_squared(self.check_num_rounds(num_rounds), participation,
                                          self.completion))

  def sensitivity_is_exact(self, num_rounds: int,
                           participation: participation_lib.ParticipationSchema) -> bool:
    return True

  def segments_sensitivity_squared(self, segment_lengths: Sequence[int],
                                   participation: participation_lib.ParticipationSchema) -> float:
    """Exact: one tree per segment, the participation limits spanning the segments
    (`segments_sensitivity_squared`)."""
    return float(segments_sensitivity_squared(segment_lengths, participation, self.completion))

  def segments_sensitivity_is_exact(self, segment_lengths: Sequence[int],
                                    participation: participation_lib.ParticipationSchema) -> bool:
    return True

  def clients_sensitivity_squared(self, client_index, rounds, segment_lengths: Sequence[int]):
    """Exact per-client values over the observed patterns (`clients_sensitivity_squared`)."""
    return clients_sensitivity_squared(client_index, rounds, segment_lengths, self.completion)

  def errors(self, num_rounds: int) -> tuple:
    """(MaxError, RmsError): closed forms for vanilla/efficient, (C^T C)^-1 for 'full'.

    Round t's prefix-sum noise variance is popcount(t + 1) (vanilla), sum over set bits h of t + 1
    of 1 / (2 - 2^-h) (efficient), or sum_{i, j <= t} ((C^T C)^-1)_{ij} (full).
    """
    num_rounds = self.check_num_rounds(num_rounds)
    if self.variant == 'full':
      inverse = _full_gram_inverse(num_rounds, self.completion)
      variances = np.diagonal(np.cumsum(np.cumsum(inverse, axis=0), axis=1))
    else:
      prefix = np.arange(1, num_rounds + 1, dtype=np.int64)
      variances = np.zeros(num_rounds)
      for height in range(num_rounds.bit_length()):
        weight = 1.0 if self.variant == 'vanilla' else 1.0 / (2.0 - 2.0**-height)
        variances += weight * (prefix >> height & 1)
    return float(np.sqrt(variances.max())), float(np.sqrt(variances.mean()))

  def to_config(self) -> dict:
    return {'mechanism': self.name, 'completion': self.completion}

  @classmethod
  def from_config(cls, config: dict) -> 'TreeStrategy':
    """Inverse of `to_config`; raises ValueError on a wrong `mechanism` or unknown keys."""
    variants = {name: variant for variant, name in _NAMES.items()}
    mechanism = base.check_config(config, tuple(variants), optional=('completion',))
    return cls(variant=variants[mechanism], completion=config.get('completion', False))

  def __eq__(self, other) -> bool:
    return (isinstance(other, TreeStrategy) and other.variant == self.variant and
            other.completion == self.completion)

  def __hash__(self) -> int:
    return hash((self.name, self.completion))

  def __repr__(self) -> str:
    return f'TreeStrategy(variant={self.variant!r}, completion={self.completion})'
