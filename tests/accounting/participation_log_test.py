"""Tests for `dp_ftrl_tff.accounting.participation_log`: the writer, and the reader against a
plain-Python recount."""

import collections
import csv

import numpy as np
import pytest

from dp_ftrl_tff.accounting import participation_log
from dp_ftrl_tff.mechanisms import participation as participation_lib

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
  observed = sorted((log.client_id(c), int(r)) for c, r in zip(log.client_index, log.rounds, strict=True))
  assert observed == sorted((c, int(r)) for c, r in rows)


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


def test_writer_append_and_truncate(tmp_path):
  path = tmp_path / 'sub' / 'participation.csv'
  log = participation_log.ParticipationLogWriter(str(path))
  log.append_round(0, ['a', 'b'])
  log.append_round(1, ['c'])
  log.append_round(2, ['a'])
  log.truncate(2)
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
  observed = sorted((log.client_id(c), int(r)) for c, r in zip(log.client_index, log.rounds, strict=True))
  assert observed == sorted((c, int(r)) for c, r in rows)
