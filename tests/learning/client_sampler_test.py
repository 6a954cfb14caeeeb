"""Tests of the min-sep client sampler (the participation log is tested in tests/accounting/)."""

import collections
import functools
import math

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from dp_ftrl_tff.learning import client_sampler

pytestmark = pytest.mark.unit


def _ids(n):
  return [f'c{i:04d}' for i in range(n)]


def _history(rounds_to_cohorts):
  """client -> sorted rounds, computed from the raw cohorts."""
  history = collections.defaultdict(list)
  for r, cohort in rounds_to_cohorts.items():
    for c in cohort:
      history[c].append(r)
  return history


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    cohort=st.integers(1, 6), min_sep=st.integers(1, 8), slack=st.integers(0, 15),
    cap=st.one_of(st.none(), st.integers(1, 4)), num_rounds=st.integers(1, 40),
    seed=st.integers(0, 2**31))
def test_never_violates_min_sep_or_cap(cohort, min_sep, slack, cap, num_rounds, seed):
  num_clients = min(min_sep, num_rounds) * cohort + slack
  try:
    client_sampler.check_schedule(num_clients, cohort, min_sep, cap, num_rounds)
  except ValueError:
    hypothesis.assume(False)
  sampler = client_sampler.ClientSampler(_ids(num_clients), cohort, min_sep=min_sep,
                                         max_participations=cap, seed=seed, num_rounds=num_rounds)
  cohorts = {}
  for r in range(num_rounds):  # every schedule the check accepts is filled
    cohorts[r] = sampler.sample(r)
    assert len(cohorts[r]) == cohort and len(set(cohorts[r])) == cohort
  for rounds in _history(cohorts).values():
    gaps = np.diff(sorted(rounds))
    assert np.all(gaps >= min_sep)
    if cap is not None:
      assert len(rounds) <= cap


def test_without_cap_min_sep_never_stalls_at_the_bound():
  # Exactly b * m clients: the only feasible schedule is cyclic, every client every b rounds.
  sampler = client_sampler.ClientSampler(_ids(12), 3, min_sep=4, seed=7)
  cohorts = {r: sampler.sample(r) for r in range(20)}
  for rounds in _history(cohorts).values():
    assert np.all(np.diff(rounds) == 4)


def test_deterministic_for_a_seed_and_resumable():
  def run(seed, stop=None):
    sampler = client_sampler.ClientSampler(_ids(50), 5, min_sep=3, max_participations=4, seed=seed,
                                           num_rounds=30)
    out = [sampler.sample(r) for r in range(stop or 30)]
    return out, sampler.state

  full, _ = run(11)
  again, _ = run(11)
  assert full == again
  other, _ = run(12)
  assert other != full
  head, state = run(11, stop=13)
  resumed = client_sampler.ClientSampler(_ids(50), 5, min_sep=3, max_participations=4, seed=11,
                                         num_rounds=30)
  resumed.load_state(state)
  assert head + [resumed.sample(r) for r in range(13, 30)] == full


def test_uniform_over_the_eligible_pool():
  # Round 0 draws 2 of 10 uniformly: each client's frequency over many seeds is near 1/5.
  counts = collections.Counter()
  for seed in range(2000):
    counts.update(client_sampler.ClientSampler(_ids(10), 2, min_sep=2, seed=seed).sample(0))
  freq = np.array([counts[c] for c in _ids(10)]) / 2000
  np.testing.assert_allclose(freq, 0.2, atol=0.03)


def test_sample_must_follow_round_order():
  sampler = client_sampler.ClientSampler(_ids(10), 2, min_sep=2)
  with pytest.raises(ValueError, match='round_num'):
    sampler.sample(1)


@pytest.mark.parametrize('kwargs, match', [
    (dict(num_clients=100, clients_per_round=10, min_sep=11, max_participations=None,
          num_rounds=50), 'Impossible schedule.*min_sep'),
    (dict(num_clients=100, clients_per_round=10, min_sep=2, max_participations=1, num_rounds=11),
     'Impossible schedule.*max_participations'),
    (dict(num_clients=5, clients_per_round=6, min_sep=1, max_participations=None, num_rounds=3),
     'clients_per_round'),
    (dict(num_clients=5, clients_per_round=1, min_sep=0, max_participations=None, num_rounds=3),
     'min_sep'),
])
def test_check_schedule_rejects_impossible(kwargs, match):
  with pytest.raises(ValueError, match=match):
    client_sampler.check_schedule(**kwargs)


def test_a_sampler_for_num_rounds_checks_its_schedule():
  with pytest.raises(ValueError, match='Impossible schedule.*min_sep'):
    client_sampler.ClientSampler(_ids(100), 10, min_sep=11, num_rounds=50)
  sampler = client_sampler.ClientSampler(_ids(100), 10, min_sep=10, num_rounds=50)
  assert len(sampler.sample(0)) == 10
  for r in range(1, 50):
    sampler.sample(r)
  with pytest.raises(ValueError, match='num_rounds`=50'):
    sampler.sample(50)


def test_a_sampler_without_num_rounds_checks_every_length_when_built():
  """Without `num_rounds` the sampler may be asked for any number of rounds: it needs b * m
  clients, and a cap (which bounds the rounds) needs `num_rounds`; either way no round fails."""
  with pytest.raises(ValueError, match='Impossible schedule.*min_sep'):
    client_sampler.ClientSampler(_ids(59), 20, min_sep=3)
  with pytest.raises(ValueError, match='`num_rounds` is required with `max_participations`'):
    client_sampler.ClientSampler(_ids(200), 20, min_sep=3, max_participations=2)
  sampler = client_sampler.ClientSampler(_ids(60), 20, min_sep=3)
  for r in range(100):
    assert len(sampler.sample(r)) == 20


def test_check_schedule_accepts_short_runs_with_large_min_sep():
  # n < b: no client can come back, so only n * m distinct clients are needed.
  client_sampler.check_schedule(30, 10, 342, None, 3)


def test_load_state_rejects_other_population():
  state = client_sampler.ClientSampler(_ids(10), 2).state
  with pytest.raises(ValueError, match='population'):
    client_sampler.ClientSampler(_ids(11), 2).load_state(state)


def _run(num_clients, cohort, min_sep, cap, num_rounds, seed):
  """The cohorts of a sampler made for `num_rounds` rounds, every one drawn."""
  sampler = client_sampler.ClientSampler(_ids(num_clients), cohort, min_sep=min_sep,
                                         max_participations=cap, seed=seed, num_rounds=num_rounds)
  return {r: sampler.sample(r) for r in range(num_rounds)}


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(
    cohort=st.integers(1, 6), cap=st.integers(1, 4), multiple=st.integers(1, 20),
    min_sep=st.integers(1, 8), seed=st.integers(0, 2**31))
def test_fills_schedules_at_exact_capacity(cohort, cap, multiple, min_sep, seed):
  # n * m == N * k: every client must take exactly k participations, the tightest schedules.
  num_clients = multiple * (cohort // math.gcd(cohort, cap))
  num_rounds = num_clients * cap // cohort
  hypothesis.assume(num_clients >= min(min_sep, num_rounds) * cohort)
  history = _history(_run(num_clients, cohort, min_sep, cap, num_rounds, seed))
  assert sorted(history) == _ids(num_clients)
  for rounds in history.values():
    assert len(rounds) == cap and np.all(np.diff(rounds) >= min_sep)


@pytest.mark.parametrize('seed', range(5))
def test_fills_the_reported_schedule(seed):
  # Issue 44: 200 clients, 10 a round, min_sep 5, at most 2 each, 40 rounds (exactly the capacity);
  # a uniform draw over all eligible clients ran dry in round 39.
  history = _history(_run(200, 10, 5, 2, 40, seed))
  assert len(history) == 200
  for rounds in history.values():
    assert len(rounds) == 2 and rounds[1] - rounds[0] >= 5


def _fillable(num_clients, cohort, min_sep, cap, num_rounds):
  """Whether some choice of cohorts fills every round: an exhaustive search over states by counts.

  A state counts the clients by participations left (index r - 1 for r left, 1 <= r <= cap) and by
  the round they are eligible from; clients in one count are interchangeable.
  """
  def picks(eligible, i, rest):  # x[i] <= eligible[i] for every i, summing to rest
    if i == len(eligible):
      if rest == 0:
        yield ()
      return
    for x in range(min(rest, eligible[i]) + 1):
      for tail in picks(eligible, i + 1, rest - x):
        yield (x,) + tail

  @functools.cache
  def fill(t, eligible, waiting):  # waiting[d]: the counts of the clients eligible from t + d on
    if t == num_rounds:
      return True
    eligible = tuple(e + w for e, w in zip(eligible, waiting[0], strict=True))
    for x in picks(eligible, 0, cohort):
      back = x[1:] + (0,)  # drawn with r left, eligible again in b rounds with r - 1 (0: done)
      if fill(t + 1, tuple(e - d for e, d in zip(eligible, x, strict=True)), waiting[1:] + (back,)):
        return True
    return False

  nobody = (0,) * cap
  everyone = nobody[1:] + (num_clients,)  # all clients, eligible from round 0 with cap left
  return fill(0, nobody, (everyone,) + (nobody,) * (min_sep - 1))


def test_check_accepts_exactly_the_fillable_schedules_and_the_sampler_fills_them():
  # 7200 settings (2491 fillable): the search knows neither the check's conditions nor the
  # sampler's rule.
  seed = 0
  for num_clients in range(1, 9):
    for cohort in range(1, num_clients + 1):
      for min_sep in range(1, 6):
        for num_rounds in range(1, 11):
          for cap in (None, 1, 2, 3):
            # In n rounds a client takes at most ceil(n / b) participations: that cap never binds.
            search_cap = -(-num_rounds // min_sep) if cap is None else cap
            fillable = _fillable(num_clients, cohort, min_sep, search_cap, num_rounds)
            setting = (num_clients, cohort, min_sep, cap, num_rounds)
            try:
              client_sampler.check_schedule(*setting)
            except ValueError:
              assert not fillable, setting
            else:
              assert fillable, setting
              _run(*setting, seed=seed)  # RuntimeError if a round ran dry
              seed += 1


def test_fewest_participations_first_then_uniform_within_the_tier():
  # 5 clients, 2 a round, min_sep 1, cap 2. Round 0 draws 2 of 5; round 1 must draw 2 of the 3
  # others; round 2 takes the last untouched client and 1 of the 4 with one participation.
  for seed in range(20):
    sampler = client_sampler.ClientSampler(_ids(5), 2, min_sep=1, max_participations=2, seed=seed,
                                           num_rounds=3)
    first, second, third = (sampler.sample(r) for r in range(3))
    assert not set(first) & set(second)
    untouched = sorted(set(_ids(5)) - set(first) - set(second))
    assert third[0] == untouched[0]
    tier = np.array(sorted(_ids(5).index(c) for c in first + second))
    drawn = np.random.default_rng([seed, 2]).choice(tier, size=1, replace=False)
    assert third[1:] == [_ids(5)[i] for i in drawn]


@pytest.mark.parametrize('num_clients, cohort, min_sep, num_rounds', [
    (12, 3, 4, 20),  # the pool is exactly one cohort from round 3 on
    (50, 5, 3, 30), (40, 7, 1, 25)])
def test_without_cap_draws_what_a_uniform_draw_over_the_eligible_pool_draws(
    num_clients, cohort, min_sep, num_rounds):
  for seed in (0, 3):
    sampler = client_sampler.ClientSampler(_ids(num_clients), cohort, min_sep=min_sep, seed=seed)
    last = np.full(num_clients, -min_sep)  # every client eligible in round 0
    for r in range(num_rounds):
      pool = np.flatnonzero(r - last >= min_sep)
      expected = np.random.default_rng([seed, r]).choice(pool, size=cohort, replace=False)
      last[expected] = r
      assert sampler.sample(r) == [_ids(num_clients)[i] for i in expected]
