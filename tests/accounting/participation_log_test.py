"""Tests for `dp_ftrl_tff.accounting.participation_log`: the writer, and the reader against a
plain-Python recount."""

import collections
import csv

import numpy as np
import pytest

from dp_ftrl_tff.accounting import participation_bits, participation_log
from dp_ftrl_tff.mechanisms import participation as participation_lib

pytestmark = pytest.mark.unit

Schema = participation_lib.ParticipationSchema


def _write(path, rows, lineterminator='\r\n'):
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f, lineterminator=lineterminator)  # csv's default '\r\n', as the sampler
    writer.writerow(('client_id', 'round'))
    writer.writerows(rows)
  return str(path)


def _recount(rows):
  by_client = collections.defaultdict(list)
  for client, r in rows:
    by_client[client].append(r)
  gaps = [b - a for rounds in map(sorted, by_client.values())
          for a, b in zip(rounds[:-1], rounds[1:], strict=True)]
  return (min(gaps) if gaps else None, max(len(v) for v in by_client.values()), len(by_client))


def _logged_rows(log):
  """Sorted (client id, round) of every set bit of the log's bit matrix."""
  found = []
  for index, block in enumerate(log.bits):
    rows, rounds = np.nonzero(np.unpackbits(block, axis=1, bitorder='little'))
    found += [(log.client_id(index * 65536 + c), int(r)) for c, r in zip(rows, rounds, strict=True)]
  return sorted(found)


def _random_rows(seed, num_clients=50, num_rounds=40, per_round=6):
  rng = np.random.default_rng(seed)
  names = [f'client-{i:0{int(rng.integers(1, 4))}d}{"x" * int(rng.integers(0, 5))}'
           for i in range(num_clients)]
  rows = []
  for r in range(num_rounds):
    for c in rng.choice(num_clients, per_round, replace=False):
      rows.append((names[c], r))
  rng.shuffle(rows)
  return [tuple(row) for row in rows]


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('lineterminator', ['\r\n', '\n'])
def test_realized_participation_matches_recount(tmp_path, seed, lineterminator):
  rows = _random_rows(seed)
  log = participation_log.read_participation_log(_write(tmp_path / 'log.csv', rows, lineterminator))
  min_sep, max_part, num_clients = _recount(rows)
  assert (log.min_sep, log.max_participations, log.num_clients) == (min_sep, max_part, num_clients)
  assert log.num_rows == len(rows)
  assert log.num_rounds == 40
  counts = collections.Counter(c for c, _ in rows)
  assert log.participation_histogram() == dict(collections.Counter(counts.values()))
  assert _logged_rows(log) == sorted((c, int(r)) for c, r in rows)


def test_quoted_ids_use_the_csv_path(tmp_path):
  rows = [('a,b', 0), ('a,b', 3), ('c "q"', 1), ('plain', 2)]
  log = participation_log.read_participation_log(_write(tmp_path / 'log.csv', rows))
  assert (log.min_sep, log.max_participations, log.num_clients) == (3, 2, 3)
  assert sorted(log.client_id(i) for i in range(3)) == ['a,b', 'c "q"', 'plain']


def test_from_arrays_and_violations():
  log = participation_log.ParticipationLog.from_arrays(
      ['a', 'b', 'a', 'a', 'c'], [0, 1, 4, 6, 12])
  assert log.min_sep == 2 and log.max_participations == 3
  assert log.violations(Schema(2, 3), 13) == []
  found = log.violations(Schema(3, 2), 10)
  assert len(found) == 3
  assert 'rounds >= 10' in found[0] and 'min_sep=3' in found[1] and "'a'" in found[1]
  assert 'max_participations=2' in found[2]
  assert log.realized_schema() == Schema(2, 3)
  assert log.violations(Schema.fixed_epoch_order(3, 2), 13) == []
  assert len(log.violations(Schema.fixed_epoch_order(3, 4), 13)) == 1


def test_first_rounds_drops_the_later_rows():
  ids, rounds = ['a', 'b', 'a', 'a', 'c'], [0, 1, 4, 6, 12]
  log = participation_log.ParticipationLog.from_arrays(ids, rounds, path='run/log.csv')
  assert log.first_rounds(13) is log
  first = log.first_rounds(5)
  assert first.num_rounds == 5 and first.path == 'run/log.csv'
  got = first.rows_of(['a', 'b', 'c'])
  assert sorted(zip(got[0].tolist(), got[1].tolist(), strict=True)) == [('a', 0), ('a', 4), ('b', 1)]
  # Rounds that drew nobody (a Poisson run's first round): an empty log.
  empty = participation_log.ParticipationLog.from_arrays(['b'], [1]).first_rounds(1)
  assert (empty.num_rounds, empty.num_clients) == (0, 0)


def test_single_participation_schema():
  log = participation_log.ParticipationLog.from_arrays(['a', 'b', 'c'], [0, 5, 9])
  assert log.min_sep is None
  assert log.realized_schema(20).is_single_participation(20)


@pytest.mark.parametrize('content, match', [
    ('client,round\na,1\n', 'header'),
    ('client_id,round\na,1,2\n', 'row 1'),
    ('client_id,round\na,1\nb\n', 'row 2'),
    ('client_id,round\n,1\n', 'row 1'),
    ('client_id,round\na,-1\n', 'row 1'),
    ('client_id,round\na,x\n', 'row 1'),
    ('client_id,round\na,1\na,1\n', "client 'a' is logged twice in round 1"),
])
def test_malformed_logs_are_rejected(tmp_path, content, match):
  path = tmp_path / 'bad.csv'
  path.write_text(content)
  with pytest.raises(ValueError, match=match):
    participation_log.read_participation_log(str(path))


def test_missing_file(tmp_path):
  with pytest.raises(ValueError, match='participation_log'):
    participation_log.read_participation_log(str(tmp_path / 'none.csv'))


def test_empty_log_and_blank_lines(tmp_path):
  path = tmp_path / 'empty.csv'
  path.write_text('client_id,round\n\n')
  assert participation_log.read_participation_log(str(path)).num_rows == 0
  path.write_text('client_id,round\r\na,2\r\n\r\nb,3')  # no final newline
  log = participation_log.read_participation_log(str(path))
  assert log.num_rows == 2 and log.num_rounds == 4


def test_writer_appends_and_reopens(tmp_path):
  path = tmp_path / 'sub' / 'participation.csv'
  log = participation_log.ParticipationLogWriter(str(path))
  log.append_round(0, ['a', 'b'])
  log.append_round(1, ['c'])
  reopened = participation_log.ParticipationLogWriter(str(path))
  reopened.append_round(2, ['d'])
  with open(path, newline='') as f:
    rows = list(csv.reader(f))
  assert rows == [['client_id', 'round'], ['a', '0'], ['b', '0'], ['c', '1'], ['d', '2']]


def test_writer_rejects_foreign_file(tmp_path):
  path = tmp_path / 'x.csv'
  path.write_text('a,b\n1,2\n')
  with pytest.raises(ValueError, match='not a participation log'):
    participation_log.ParticipationLogWriter(str(path))


def test_reader_reads_what_the_writer_wrote(tmp_path):
  rows = _random_rows(7) + [('with,comma', 40), ('with,comma', 45)]
  writer = participation_log.ParticipationLogWriter(str(tmp_path / 'log.csv'))
  for r in sorted({r for _, r in rows}):
    writer.append_round(r, [c for c, rr in rows if rr == r])
  log = participation_log.read_participation_log(writer.path)
  assert (log.min_sep, log.max_participations, log.num_clients) == _recount(rows)
  assert _logged_rows(log) == sorted((c, int(r)) for c, r in rows)


# --- The streaming reader against a plain-Python reference, with tiny chunks (rows cut anywhere).

_CHUNKS = [1, 3, 17, 1 << 20]


def _reference(rows, declared, num_rounds):
  """Plain-Python figures of a list of (client id, round) rows without repeats."""
  by_client = collections.defaultdict(list)
  for client, r in rows:
    by_client[client].append(r)
  gaps = {c: [b - a for a, b in zip(sorted(v)[:-1], sorted(v)[1:], strict=True)]
          for c, v in by_client.items()}
  all_gaps = [g for v in gaps.values() for g in v]
  counts = {c: len(v) for c, v in by_client.items()}
  if declared.fixed_epoch:
    bad_gap = [c for c, v in gaps.items() if any(g % declared.min_sep for g in v)]
  else:
    bad_gap = [c for c, v in gaps.items() if any(g < declared.min_sep for g in v)]
  return {
      'num_rows': len(rows), 'num_clients': len(by_client),
      'num_rounds': max((r for _, r in rows), default=-1) + 1,
      'min_sep': min(all_gaps) if all_gaps else None,
      'max_participations': max(counts.values(), default=0),
      'histogram': dict(collections.Counter(counts.values())),
      'late': sum(r >= num_rounds for _, r in rows),
      'bad_gap': len(bad_gap),
      'too_many': sum(v > declared.max_participations for v in counts.values()),
      'rows': sorted(rows)}


def _figures(log, declared, num_rounds):
  def count(marker):  # the number each violation message starts with
    hit = [v for v in log.violations(declared, num_rounds) if marker in v]
    return int(hit[0].split()[0]) if hit else 0
  return {
      'num_rows': log.num_rows, 'num_clients': log.num_clients, 'num_rounds': log.num_rounds,
      'min_sep': log.min_sep, 'max_participations': log.max_participations,
      'histogram': log.participation_histogram(), 'late': count('rounds >='),
      'bad_gap': count('two participations'), 'too_many': count('more than max_participations'),
      'rows': _logged_rows(log)}


def _random_log_rows(seed):
  """Rows in random order (rounds out of order), ids of 1-20 bytes, some needing CSV quotes."""
  rng = np.random.default_rng(seed)
  quoted = seed % 3 == 0
  alphabet = list('abcxyz019-_é') + ([',', '"', ' '] if quoted else [])
  names = sorted({''.join(rng.choice(alphabet, int(rng.integers(1, 21)))) for _ in range(30)})
  pairs = {(names[int(rng.integers(len(names)))], int(rng.integers(0, 200)))
           for _ in range(int(rng.integers(1, 300)))}
  rows = sorted(pairs)
  rng.shuffle(rows)
  return [tuple(row) for row in rows]


@pytest.mark.parametrize('seed', range(12))
def test_streaming_reader_matches_reference_for_any_chunk_size(tmp_path, seed):
  rows = _random_log_rows(seed)
  path = _write(tmp_path / 'log.csv', rows, '\r\n' if seed % 2 else '\n')
  for declared, n in ((Schema(7, 3), 150), (Schema.fixed_epoch_order(3, 5), 200)):
    expected = _reference(rows, declared, n)
    for chunk in _CHUNKS:
      log = participation_log.read_participation_log(path, chunk_bytes=chunk)
      assert _figures(log, declared, n) == expected, (chunk, declared)


@pytest.mark.parametrize('chunk', _CHUNKS)
def test_repeated_rows_are_caught_across_chunks(tmp_path, chunk):
  rows = [(f'c{i % 7}', i // 7) for i in range(60)]
  path = _write(tmp_path / 'log.csv', rows + [('c3', 2), rows[0], ('c3', 2)])
  with pytest.raises(ValueError, match=r'logged twice in round \d+ \(3 duplicate rows\)'):
    participation_log.read_participation_log(path, chunk_bytes=chunk)


@pytest.mark.parametrize('chunk', _CHUNKS)
@pytest.mark.parametrize('bad_line, match', [
    ('a,1,2', 'row 41 is not'), ('b', 'row 41 is not'), (',1', 'row 41 is not'),
    ('a,x', 'row 41: the round'), ('a,', 'round of 1 to 18 digits'),
    ('"q",-4', 'rounds must be non-negative, found -4'),
    ('"q",x', r'log.csv:42: round .x. is not an integer')])
def test_a_corrupt_row_gives_the_same_error_for_any_chunk_size(tmp_path, chunk, bad_line, match):
  good = ''.join(f'client{i},{i}\n' for i in range(40))
  path = tmp_path / 'log.csv'
  path.write_text('client_id,round\n' + good + bad_line + '\n' + good.replace('client', 'other'))
  with pytest.raises(ValueError, match=match):
    participation_log.read_participation_log(str(path), chunk_bytes=chunk)


@pytest.mark.parametrize('chunk', _CHUNKS)
def test_torn_last_line(tmp_path, chunk):
  path = tmp_path / 'log.csv'
  path.write_text('client_id,round\r\na,0\r\nb,1\r\na,2\r\nclien')  # killed mid-row
  with pytest.raises(ValueError, match='row 4 is not'):
    participation_log.read_participation_log(str(path), chunk_bytes=chunk)
  path.write_text('client_id,round\r\na,0\r\nb,1\r\na,2\r\nb,12')  # no final line end
  assert participation_log.read_participation_log(str(path), chunk_bytes=chunk).num_rounds == 13


def test_hash_collisions_are_detected_and_the_read_is_exact(tmp_path, monkeypatch):
  rows = _random_log_rows(1)
  path = _write(tmp_path / 'log.csv', rows)
  expected = _reference(rows, Schema(7, 3), 150)
  real_hash = participation_bits.hash_ids

  def colliding_first_seed(words, lengths, seed):  # every id of a length shares one hash
    return lengths.astype(np.uint64) if seed == 0 else real_hash(words, lengths, seed)

  monkeypatch.setattr(participation_bits, 'hash_ids', colliding_first_seed)
  for chunk in _CHUNKS:
    log = participation_log.read_participation_log(path, chunk_bytes=chunk)
    assert _figures(log, Schema(7, 3), 150) == expected
  monkeypatch.setattr(participation_bits, 'hash_ids',
                      lambda words, lengths, seed: np.zeros(lengths.size, np.uint64))
  with pytest.raises(ValueError, match='share a 64-bit hash'):
    participation_log.read_participation_log(path)


def test_patterns_cover_every_client(tmp_path):
  period = 5  # cyclic cohorts: clients c and c + 5 share a pattern
  rows = [(f'c{c}', r) for r in range(40) for c in range(60) if (c - r) % period == 0]
  log = participation_log.read_participation_log(_write(tmp_path / 'log.csv', rows), 11)
  patterns = {}
  for clients, pattern_index, rounds in log.iter_patterns():
    for i, client in enumerate(clients):
      patterns[log.client_id(client)] = sorted(rounds[pattern_index == i].tolist())
  assert len(patterns) == period
  by_client = collections.defaultdict(list)
  for client, r in rows:
    by_client[client].append(r)
  assert sorted(map(tuple, patterns.values())) == sorted({tuple(sorted(v))
                                                          for v in by_client.values()})
  for client, pattern in patterns.items():
    assert by_client[client] == pattern


def test_a_bit_matrix_beyond_memory_is_refused(tmp_path, monkeypatch):
  path = tmp_path / 'log.csv'
  path.write_text('client_id,round\na,0\nb,100000000\n')
  monkeypatch.setattr(participation_bits.memory, 'available_bytes', lambda: 10**6)
  with pytest.raises(ValueError, match=r'2 clients x 100000001 rounds needs'):
    participation_log.read_participation_log(str(path))


def test_read_rejects_a_bad_chunk_size(tmp_path):
  with pytest.raises(ValueError, match='chunk_bytes'):
    participation_log.read_participation_log(_write(tmp_path / 'log.csv', [('a', 1)]), 0)
