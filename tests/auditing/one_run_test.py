"""Tests for `dp_ftrl_tff.auditing.one_run`: the one-run bound of Steinke, Nasr and Jagielski
against an independent implementation of their p-value, on the issue's example, and its coverage
over many seeds of mu-GDP scores."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from dp_ftrl_tff.auditing import gdp, one_run, one_run_fdp

pytestmark = pytest.mark.unit


def _correct_by_sorting(seen, unseen, plus, minus):
  """Correct guesses when the `plus` highest scores are guessed seen and the `minus` lowest unseen,
  the fewest over every order of tied scores, by brute force: every arrangement of each group of
  equal scores is tried (small groups only)."""
  groups = {}
  for score, is_seen in [(s, True) for s in seen] + [(s, False) for s in unseen]:
    groups.setdefault(float(score), []).append(is_seen)
  ordered = [groups[score] for score in sorted(groups, reverse=True)]
  fewest = None
  for arrangement in itertools.product(*(set(itertools.permutations(g)) for g in ordered)):
    ranked = [is_seen for group in arrangement for is_seen in group]
    bottom = ranked[len(ranked) - minus:] if minus else []
    correct = sum(ranked[:plus]) + sum(1 for is_seen in bottom if not is_seen)
    fewest = correct if fewest is None else min(fewest, correct)
  return fewest


def _p_value_by_sums(m, r, v, epsilon, delta):
  """The paper's p-value from binomial point masses: f(v) = sum_{j >= v} pmf(j), and the delta term
  2 m delta max_i (sum_{j = v - i}^{v - 1} pmf(j)) / i."""
  q = math.exp(epsilon) / (1 + math.exp(epsilon))
  pmf = scipy.stats.binom.pmf(np.arange(r + 1), r, q)
  tail = float(np.sum(pmf[v:]))
  best, running = 0.0, 0.0
  for i in range(1, v + 1):
    running += pmf[v - i]
    best = max(best, running / i)
  return min(1.0, tail + 2 * m * delta * best)


def _epsilon_by_bisection(m, r, v, delta, significance):
  """The largest epsilon in [0, 30] whose p-value is <= significance (p increases with epsilon)."""
  if _p_value_by_sums(m, r, v, 0.0, delta) > significance:
    return 0.0
  low, high = 0.0, 30.0
  if _p_value_by_sums(m, r, v, high, delta) <= significance:
    return high
  for _ in range(60):
    middle = (low + high) / 2
    low, high = (middle, high) if _p_value_by_sums(m, r, v, middle, delta) <= significance else (
        low, middle)
  return low


def _family(num_seen, num_unseen):
  """The documented default: (k, k) for k = 1, 2, 4, ... below min(N_seen, N_unseen), then it."""
  limit = min(num_seen, num_unseen)
  counts = [2**j for j in range(64) if 2**j < limit] + [limit]
  return [(k, k) for k in counts]


def _independent_bound(seen, unseen, delta, confidence, pairs):
  m = len(seen) + len(unseen)
  significance = (1 - confidence) / len(pairs)
  return max(_epsilon_by_bisection(m, plus + minus, _correct_by_sorting(seen, unseen, plus, minus),
                                   delta, significance) for plus, minus in pairs)


def _scores(seed, size, mu):
  rng = np.random.default_rng(seed)
  return rng.normal(mu, 1.0, size), rng.normal(0.0, 1.0, size)


@pytest.mark.parametrize('seed,size,mu,delta,confidence,pairs', [
    (0, 80, 3.0, 1e-5, 0.95, None),
    (1, 60, 2.0, 1e-3, 0.9, None),
    (2, 50, 4.0, 1e-6, 0.95, [(10, 0), (0, 10), (20, 5), (40, 40)]),
    (3, 70, 1.0, 1e-2, 0.8, [(35, 35)]),
])
def test_matches_an_independent_implementation(seed, size, mu, delta, confidence, pairs):
  seen, unseen = _scores(seed, size, mu)
  seen[:4] = unseen[:4]  # ties between the samples
  bound = one_run.one_run_bound(seen, unseen, delta, confidence, guesses=pairs)
  expected = _independent_bound(seen, unseen, delta, confidence,
                                pairs or _family(len(seen), len(unseen)))
  assert bound.epsilon == pytest.approx(expected, abs=1e-5)  # brentq stops within 1e-6
  assert bound.method == 'one_run' and bound.assumption
  assert 'Bonferroni' in bound.threshold_choice


def test_p_value_matches_the_papers_sums():
  for m, r, v, epsilon, delta in [(100, 40, 35, 1.0, 1e-5), (4000, 512, 480, 2.5, 1e-6),
                                  (10, 10, 10, 0.0, 0.0), (50, 20, 0, 1.0, 1e-3)]:
    assert one_run.p_value(m, r, v, epsilon, delta) == pytest.approx(
        _p_value_by_sums(m, r, v, epsilon, delta), rel=1e-9, abs=1e-15)


def test_the_issue_example():
  """Held-out N(0, 1), held-in N(2, 1), 2000 each; true epsilon 11.0 at delta 1e-6.

  Measured at 95% (seed 0): 4.49, with symmetric guesses (k, k), the best k = 256. jax_privacy
  reports 3.38 for the same theorem with k- = 0 and its ROC hull's thresholds; our k- = 0 family
  gives 3.79 on these scores.
  """
  rng = np.random.default_rng(0)
  unseen, seen = rng.normal(0, 1, 2000), rng.normal(2, 1, 2000)
  bound = one_run.one_run_bound(seen, unseen, 1e-6, 0.95).epsilon
  assert 4.0 < bound < gdp.epsilon_for_delta(2.0, 1e-6)
  assert bound < one_run.max_certifiable(2000, 2000, 1e-6, 0.95)


def test_covers_the_truth_at_the_stated_rate():
  # As a run does: N of 2N canaries inserted, mu-GDP scores (the inserted ones shifted by mu).
  # At confidence 0.8 the count of seeds whose bound exceeds the truth is at most the 1 - 1e-6
  # quantile of Binomial(seeds, 0.2).
  seeds, confidence, delta, mu = 200, 0.8, 1e-2, 1.0
  truth = gdp.epsilon_for_delta(mu, delta)
  over = sum(one_run.one_run_bound(*_scores(100 + seed, 150, mu), delta, confidence).epsilon > truth
             for seed in range(seeds))
  assert over <= scipy.stats.binom.ppf(1 - 1e-6, seeds, 1 - confidence)


def test_randomized_response_is_not_rejected_more_often_than_stated():
  # eps-randomized response is the tight case of the theorem with delta = 0: every guess is right
  # with probability e^eps / (1 + e^eps) independently, so rejecting the true eps at
  # significance 0.1 happens with probability <= 0.1.
  rng = np.random.default_rng(5)
  epsilon, guesses, trials = 1.0, 200, 2000
  correct = rng.binomial(guesses, math.exp(epsilon) / (1 + math.exp(epsilon)), size=trials)
  rejected = sum(one_run.p_value(400, guesses, int(v), epsilon, 0.0) <= 0.1 for v in correct)
  assert rejected <= scipy.stats.binom.ppf(1 - 1e-6, trials, 0.1)


def test_guess_counts():
  assert one_run.guess_counts(5, 9) == ((1, 1), (2, 2), (4, 4), (5, 5))
  assert one_run.guess_counts(2000, 2000)[-2:] == ((1024, 1024), (2000, 2000))
  assert len(one_run.guess_counts(2000, 2000)) == 12


@pytest.mark.parametrize('call,name', [
    (lambda: one_run.one_run_bound([1.0], [0.0, 1.0], 1e-6), 'seen'),
    (lambda: one_run.one_run_bound([1.0, 2.0], [0.0], 1e-6), 'unseen'),
    (lambda: one_run.one_run_bound([1.0, 2.0], [0.0, 1.0], 0.0), 'delta'),
    (lambda: one_run.one_run_bound([1.0, 2.0], [0.0, 1.0], 1e-6, 0.0), 'confidence'),
    (lambda: one_run.one_run_bound([1.0, 2.0], [0.0, 1.0], 1e-6, guesses=[(0, 0)]), 'guesses'),
    (lambda: one_run.one_run_bound([1.0, 2.0], [0.0, 1.0], 1e-6, guesses=[(3, 2)]), 'guesses'),
    (lambda: one_run.one_run_bound([1.0, 2.0], [0.0, 1.0], 1e-6, guesses=[1]), 'guesses'),
    (lambda: one_run.p_value(10, 11, 3, 1.0, 1e-6), 'num_guesses'),
    (lambda: one_run.p_value(10, 5, 6, 1.0, 1e-6), 'num_correct'),
    (lambda: one_run.p_value(10, 5, 3, -1.0, 1e-6), 'epsilon'),
    (lambda: one_run.epsilon_for_guesses(10, 5, 3, 1e-6, 1.5), 'significance'),
    (lambda: one_run.guess_counts(0, 3), 'num_seen'),
])
def test_invalid_arguments_are_named(call, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    call()


@pytest.mark.parametrize('plus, minus', [(1, 0), (0, 1), (2, 2), (3, 1), (4, 4), (6, 5)])
def test_ties_count_the_least_favourable_order_as_brute_force_does(plus, minus):
  # Small samples with ties inside and across them, on the guess boundaries.
  seen, unseen = np.array([3.0, 2.0, 2.0, 1.0, 0.0, 0.0]), np.array([2.0, 2.0, 1.0, 1.0, 0.0])
  (count,) = one_run.correct_guesses(seen, unseen, [(plus, minus)])
  assert count == _correct_by_sorting(seen, unseen, plus, minus)


def test_identical_samples_certify_nothing():
  # No leakage at all (true epsilon 0): every guess inside the one tie is counted wrong.
  zeros = np.zeros(1000)
  assert one_run.one_run_bound(zeros, zeros, 1e-6).epsilon == 0.0
  assert one_run_fdp.one_run_fdp_bound(zeros, zeros, 1e-6).epsilon == 0.0
  rng = np.random.default_rng(0)
  values = rng.normal(size=500).round()  # equal samples of tied values
  assert one_run.one_run_bound(values, rng.permutation(values), 1e-6).epsilon == 0.0


@pytest.mark.parametrize('epsilon', [0.5, 1.0, 2.0])
def test_randomized_response_scores_stay_below_their_epsilon(epsilon):
  """Binary scores of epsilon-randomized response (a seen canary scores 1 with probability
  e^eps / (1 + e^eps), an unseen one with 1 / (1 + e^eps)): the mechanism is exactly
  (epsilon, 0)-DP per canary, so at 95% at most 5% of the seeds may certify more; 200 seeds, and
  the count must stay within the binomial's 99.9% quantile."""
  q = math.exp(epsilon) / (1 + math.exp(epsilon))
  exceed = 0
  for seed in range(200):
    rng = np.random.default_rng(seed)
    seen = (rng.random(500) < q).astype(float)
    unseen = (rng.random(500) < 1 - q).astype(float)
    exceed += one_run.one_run_bound(seen, unseen, 1e-6).epsilon > epsilon
  assert exceed <= scipy.stats.binom.ppf(0.999, 200, 0.05), exceed
