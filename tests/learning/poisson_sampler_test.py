"""Tests of the Poisson and cyclic-Poisson samplers: inclusion statistics, groups, reproducibility,
resume.

Statistical bands are exact binomial intervals (scipy.stats.binom) whose false-failure probability,
summed over every count a test checks (union bound), is at most `ALPHA` = 1e-9 per test; the seeds
are fixed, so the tests are deterministic, and a sampler whose rates were off by a few standard
errors would fail them for most seeds.
"""

import numpy as np
import pytest
import scipy.stats

from dp_ftrl_tff import sampling as sampling_lib
from dp_ftrl_tff.learning import poisson_sampler

pytestmark = pytest.mark.unit

ALPHA = 1e-9


def _ids(n):
  return [f'c{i:04d}' for i in range(n)]


def _band(trials, prob, num_checks):
  """[lo, hi] holding a Binomial(trials, prob) count except with probability ALPHA / num_checks."""
  lo, hi = scipy.stats.binom.interval(1.0 - ALPHA / num_checks, trials, prob)
  return int(lo), int(hi)


def _counts(sampler, num_rounds):
  """(cohorts, per-client participation counts in client_ids order)."""
  index = {c: i for i, c in enumerate(sampler.client_ids)}
  counts = np.zeros(len(index), np.int64)
  cohorts = []
  for t in range(num_rounds):
    cohort = sampler.sample(t)
    cohorts.append(cohort)
    counts[[index[c] for c in cohort]] += 1
  return cohorts, counts


def test_poisson_inclusion_rates_and_cohort_sizes_are_binomial():
  population, q, rounds = 40, 0.1, 8000
  sampler = poisson_sampler.PoissonSampler(
      _ids(population), sampling_lib.Sampling('poisson', q, 1, population), seed=7)
  cohorts, counts = _counts(sampler, rounds)
  # Each client's count is Binomial(rounds, q); one band per client.
  lo, hi = _band(rounds, q, population + 3)
  assert np.all((counts >= lo) & (counts <= hi)), (counts.min(), counts.max(), lo, hi)
  # All coins together: Binomial(population * rounds, q) (a 5% bias in q is ~9 standard errors).
  lo, hi = _band(population * rounds, q, population + 3)
  assert lo <= counts.sum() <= hi, (counts.sum(), lo, hi)
  # Independent coins: a round is empty with probability (1 - q)^population (~1.5%); a fixed-size
  # sampler of the expected size would never give one.
  empty = sum(len(c) == 0 for c in cohorts)
  lo, hi = _band(rounds, (1 - q)**population, population + 3)
  assert lo <= empty <= hi, (empty, lo, hi)
  # Pairs are independent: clients 0 and 1 together in Binomial(rounds, q^2) rounds.
  both = sum({'c0000', 'c0001'} <= set(c) for c in cohorts)
  lo, hi = _band(rounds, q * q, population + 3)
  assert lo <= both <= hi, (both, lo, hi)


def test_cyclic_poisson_inclusion_rates_and_groups():
  population, groups, q, rounds = 103, 4, 0.3, 2000
  sampling = sampling_lib.Sampling('cyclic_poisson', q, groups, population)
  sampler = poisson_sampler.PoissonSampler(_ids(population), sampling, seed=3)
  members = [sampler.group(g) for g in range(groups)]
  # A partition of the population, sizes as stated (103 = 26 + 26 + 26 + 25).
  assert sorted(c for m in members for c in m) == _ids(population)
  assert [len(m) for m in members] == sampling.group_sizes() == [26, 26, 26, 25]
  cohorts, counts = _counts(sampler, rounds)
  for t, cohort in enumerate(cohorts):
    assert set(cohort) <= set(members[t % groups]), t
    assert cohort == sorted(cohort)
  # Each client is eligible in rounds / groups = 500 rounds: Binomial(500, q) participations.
  lo, hi = _band(rounds // groups, q, population + 1)
  assert np.all((counts >= lo) & (counts <= hi)), (counts.min(), counts.max(), lo, hi)
  lo, hi = _band(population * rounds // groups, q, population + 1)
  assert lo <= counts.sum() <= hi, (counts.sum(), lo, hi)
  # The mean's denominator is the expected cohort size averaged over a cycle.
  assert sampling.expected_clients_per_round == pytest.approx(q * population / groups, rel=1e-15)
  # Mean of `rounds` independent Binomial(|G|, q) sizes: 6 standard errors (normal tail ~2e-9).
  assert np.mean([len(c) for c in cohorts]) == pytest.approx(
      sampling.expected_clients_per_round, abs=6 * np.sqrt(q * (1 - q) * 26 / rounds))


def test_cyclic_participations_are_multiples_of_the_group_count_apart():
  sampling = sampling_lib.Sampling('cyclic_poisson', 0.9, 5, 23)
  sampler = poisson_sampler.PoissonSampler(_ids(23), sampling, seed=11)
  history = {}
  for t in range(60):
    for c in sampler.sample(t):
      history.setdefault(c, []).append(t)
  for rounds in history.values():
    assert all((b - a) % 5 == 0 and b - a >= 5 for a, b in zip(rounds, rounds[1:], strict=False))


def test_probability_one_takes_the_whole_group():
  sampler = poisson_sampler.PoissonSampler(_ids(7),
                                           sampling_lib.Sampling('cyclic_poisson', 1.0, 2, 7))
  assert sampler.sample(0) == sampler.group(0) and sampler.sample(1) == sampler.group(1)
  assert len(sampler.group(0)) == 4 and len(sampler.group(1)) == 3


def test_same_seed_same_cohorts_other_seed_other_cohorts():
  sampling = sampling_lib.Sampling('cyclic_poisson', 0.5, 3, 30)
  draws = {}
  for seed in (1, 1, 2):
    sampler = poisson_sampler.PoissonSampler(_ids(30), sampling, seed=seed)
    draws.setdefault(seed, []).append([sampler.sample(t) for t in range(12)])
  assert draws[1][0] == draws[1][1]
  assert draws[1][0] != draws[2][0]


def test_resume_from_state_is_bit_identical():
  sampling = sampling_lib.Sampling('poisson', 0.3, 1, 50)
  uninterrupted = poisson_sampler.PoissonSampler(_ids(50), sampling, seed=5)
  expected = [uninterrupted.sample(t) for t in range(20)]
  first = poisson_sampler.PoissonSampler(_ids(50), sampling, seed=5)
  got = [first.sample(t) for t in range(8)]
  saved = first.state
  resumed = poisson_sampler.PoissonSampler(_ids(50), sampling, seed=5)
  resumed.load_state(saved)
  got += [resumed.sample(t) for t in range(8, 20)]
  assert got == expected
  # The cohort of a round does not depend on the rounds drawn before it.
  assert list(np.asarray(_ids(50))[resumed.cohort_indices(3)]) == expected[3]


def test_errors_name_the_parameter():
  sampling = sampling_lib.Sampling('poisson', 0.3, 1, 5)
  sampler = poisson_sampler.PoissonSampler(_ids(5), sampling)
  with pytest.raises(ValueError, match='next round 0'):
    sampler.sample(1)
  with pytest.raises(ValueError, match='population'):
    poisson_sampler.PoissonSampler(_ids(6), sampling)
  with pytest.raises(ValueError, match='unique'):
    poisson_sampler.PoissonSampler(['a', 'a', 'b', 'c', 'd'], sampling)
  with pytest.raises(ValueError, match='sampling'):
    poisson_sampler.PoissonSampler(_ids(5), {'kind': 'poisson'})
  with pytest.raises(ValueError, match='seed'):
    poisson_sampler.PoissonSampler(_ids(5), sampling, seed=-1)
  other = poisson_sampler.PoissonSampler(_ids(4), sampling_lib.Sampling('poisson', 0.3, 1, 4))
  with pytest.raises(ValueError, match='population changed'):
    sampler.load_state(other.state)
  with pytest.raises(ValueError, match='state'):
    sampler.load_state({'next_round': 0})
  with pytest.raises(ValueError, match='group_num'):
    sampler.group(1)
