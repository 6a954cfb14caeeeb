"""Tests for participation.ParticipationSchema against independent enumeration."""

import itertools
import math

import numpy as np
import pytest

from dp_ftrl_tff.mechanisms import participation as participation_lib
from tests.testing import patterns as patterns_lib

pytestmark = pytest.mark.unit

P = participation_lib.ParticipationSchema


def _reference_min_sep(n, b, k):
  """Every non-empty subset of range(n) with gaps >= b and size <= k (k None = unbounded)."""
  out = set()
  for mask in range(1, 2**n):
    pattern = tuple(t for t in range(n) if mask >> t & 1)
    if k is not None and len(pattern) > k:
      continue
    if all(y - x >= b for x, y in zip(pattern, pattern[1:], strict=False)):
      out.add(pattern)
  return out


def _reference_fixed_epoch(n, b, k):
  out = set()
  for j in range(min(b, n)):
    epoch = [j + i * b for i in range(k) if j + i * b < n]
    for size in range(1, len(epoch) + 1):
      out.update(itertools.combinations(epoch, size))
  return out


@pytest.mark.parametrize('n', [1, 2, 5, 9, 11])
@pytest.mark.parametrize('b', [1, 2, 3, 5])
@pytest.mark.parametrize('k', [None, 1, 2, 3])
def test_min_sep_patterns_match_bitmask_enumeration(n, b, k):
  schema = P.b_min_sep(b, k)
  expected = _reference_min_sep(n, b, k)
  got = list(patterns_lib.all_patterns(schema, n))
  assert len(got) == len(set(got))
  assert set(got) == expected
  for mask in range(2**n):
    pattern = tuple(t for t in range(n) if mask >> t & 1)
    assert patterns_lib.admits(schema, pattern, n) == (not pattern or pattern in expected)


@pytest.mark.parametrize('n', [1, 4, 6, 10])
@pytest.mark.parametrize('b', [1, 2, 3])
@pytest.mark.parametrize('k', [1, 2, 3])
def test_fixed_epoch_patterns_and_admits_agree(n, b, k):
  schema = P.fixed_epoch_order(k, b)
  expected = _reference_fixed_epoch(n, b, min(k, math.ceil(n / b)))
  assert set(patterns_lib.all_patterns(schema, n)) == expected
  for mask in range(1, 2**n):
    pattern = tuple(t for t in range(n) if mask >> t & 1)
    assert patterns_lib.admits(schema, pattern, n) == (pattern in expected), pattern


def test_fixed_epoch_rejects_later_epochs_beyond_k():
  schema = P.fixed_epoch_order(num_epochs=2, rounds_per_epoch=3)
  assert patterns_lib.admits(schema, (0, 3), 10)
  assert not patterns_lib.admits(schema, (0, 6), 10)  # gap is a multiple of b but spans 3 epochs
  assert not patterns_lib.admits(schema, (5, 8), 10)  # offset 2 starts at round 2, its epochs are (2, 5)


@pytest.mark.parametrize('schema', [P.single(), P.b_min_sep(2, 2), P.b_min_sep(3),
                                    P.fixed_epoch_order(2, 3)])
def test_maximal_patterns_are_exactly_the_unextendable_ones(schema):
  n = 8
  every = set(patterns_lib.all_patterns(schema, n))
  maximal = set(patterns_lib.patterns(schema, n))
  for pattern in every:
    extendable = any(set(pattern) < set(other) for other in every)
    assert (pattern in maximal) == (not extendable), pattern


@pytest.mark.parametrize('n,b,k,expected', [(10, 3, None, 4), (10, 3, 2, 2), (9, 3, 5, 3),
                                            (1, 7, 3, 1), (2052, 342, 6, 6), (2000, 2001, 1, 1)])
def test_effective_max_participations(n, b, k, expected):
  assert P.b_min_sep(b, k).effective_max_participations(n) == expected


@pytest.mark.parametrize('n,b,k,expected', [(10, 3, None, 4), (10, 3, 2, 2), (2000, 2001, 1, 1)])
def test_run_setting_carries_the_effective_max_participations_of_its_schema(n, b, k, expected):
  run = participation_lib.RunSetting(np.int64(n), P.b_min_sep(b, k))
  assert run.num_rounds == n and type(run.num_rounds) is int
  assert run.effective_max_participations == expected
  assert participation_lib.RunSetting(n).effective_max_participations is None


@pytest.mark.parametrize('args,name', [((0,), 'num_rounds'), ((2.5,), 'num_rounds'),
                                       ((5, 'min_sep=2'), 'participation')])
def test_run_setting_names_its_bad_field(args, name):
  with pytest.raises(ValueError, match=name):
    participation_lib.RunSetting(*args)


def test_earliest_pattern_and_single():
  assert P.b_min_sep(3, 2).earliest_pattern(10) == (0, 3)
  assert P.b_min_sep(4).earliest_pattern(10) == (0, 4, 8)
  assert P.single().earliest_pattern(5) == (0,)
  assert P.single().is_single_participation(100)
  assert P.b_min_sep(100, 5).is_single_participation(100)
  assert not P.b_min_sep(99, 5).is_single_participation(100)


def test_tf_privacy_min_separation_is_b_minus_one():
  assert P.b_min_sep(342, 6).tf_privacy_min_separation == 341
  assert P.single().tf_privacy_min_separation == 0


@pytest.mark.parametrize('kwargs,name', [
    ({'min_sep': 0}, 'min_sep'),
    ({'min_sep': 2.5}, 'min_sep'),
    ({'max_participations': 0}, 'max_participations'),
    ({'fixed_epoch': 1, 'max_participations': 2}, 'fixed_epoch'),
    ({'fixed_epoch': True}, 'max_participations'),
])
def test_invalid_schema_names_parameter(kwargs, name):
  with pytest.raises(ValueError, match=name):
    P(**kwargs)


def test_num_rounds_is_validated():
  with pytest.raises(ValueError, match='num_rounds'):
    P.single().effective_max_participations(0)
  with pytest.raises(ValueError, match='num_rounds'):
    patterns_lib.admits(P.single(), (0,), 0)
  with pytest.raises(ValueError, match='num_rounds'):
    list(patterns_lib.all_patterns(P.single(), -1))


def test_str_mentions_kind():
  assert str(P.fixed_epoch_order(2, 3)) == 'fixed-epoch(min_sep=3, max_participations=2)'
  assert str(P.b_min_sep(3)) == 'min-sep(min_sep=3, max_participations=ceil(n/b))'


@pytest.mark.parametrize('call, name', [
    (lambda: P.fixed_epoch_order(0, 3), 'num_epochs'),
    (lambda: P.fixed_epoch_order(2, 0), 'rounds_per_epoch'),
    (lambda: patterns_lib.admits(P.b_min_sep(3), (0, 'a'), 10), 'pattern'),
    (lambda: patterns_lib.admits(P.b_min_sep(3), (0, 3.0), 10), 'pattern'),
])
def test_constructors_and_admits_name_bad_arguments(call, name):
  with pytest.raises(ValueError, match=name):
    call()


def test_admits_rejects_rounds_outside_the_run():
  assert not patterns_lib.admits(P.b_min_sep(3), (-3, 0), 10)
  assert not patterns_lib.admits(P.b_min_sep(3), (0, 10), 10)


def test_check_participation():
  schema = P.b_min_sep(3, 2)
  assert participation_lib.check_participation(schema) is schema
  with pytest.raises(ValueError, match='participation'):
    participation_lib.check_participation((3, 2))
