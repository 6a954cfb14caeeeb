"""Tests of the min-sep client sampler (the participation log is tested in tests/accounting/)."""

import collections

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
                                         max_participations=cap, seed=seed)
  cohorts = {}
  for r in range(num_rounds):
    try:
      cohorts[r] = sampler.sample(r)
    except RuntimeError:  # a cap can exhaust the pool late in the run; it never over-draws
      assert cap is not None
      break
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
    sampler = client_sampler.ClientSampler(_ids(50), 5, min_sep=3, max_participations=4, seed=seed)
    out = [sampler.sample(r) for r in range(stop or 30)]
    return out, sampler.state

  full, _ = run(11)
  again, _ = run(11)
  assert full == again
  other, _ = run(12)
  assert other != full
  head, state = run(11, stop=13)
  resumed = client_sampler.ClientSampler(_ids(50), 5, min_sep=3, max_participations=4, seed=11)
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


def test_check_schedule_accepts_short_runs_with_large_min_sep():
  # n < b: no client can come back, so only n * m distinct clients are needed.
  client_sampler.check_schedule(30, 10, 342, None, 3)


def test_load_state_rejects_other_population():
  state = client_sampler.ClientSampler(_ids(10), 2).state
  with pytest.raises(ValueError, match='population'):
    client_sampler.ClientSampler(_ids(11), 2).load_state(state)
