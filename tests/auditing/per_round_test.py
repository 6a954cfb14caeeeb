"""Tests for `dp_ftrl_tff.auditing.per_round`: the likelihood-ratio statistic over a canary's
rounds certifies more than a single-round audit of the same canaries, and stays a lower bound."""

import numpy as np
import pytest
import scipy.stats

from dp_ftrl_tff.auditing import gdp, per_round, threshold_bounds

pytestmark = pytest.mark.unit


def _whitened_rounds(seed, canaries, rounds, mu_round):
  """Simulated whitened projections: seen canaries N(mu_round, 1) in each of their `rounds`
  participations, unseen N(0, 1); independent rounds (whitening made the noise white)."""
  rng = np.random.default_rng(seed)
  return (rng.normal(mu_round, 1.0, (canaries, rounds)),
          rng.normal(0.0, 1.0, (canaries, rounds)))


def test_combined_scores_are_the_weighted_sum():
  scores = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]])
  np.testing.assert_allclose(per_round.combined_scores(scores), scores.sum(axis=1) / np.sqrt(3))
  weights = np.array([3.0, 0.0, 4.0])
  np.testing.assert_allclose(per_round.combined_scores(scores, weights),
                             (3 * scores[:, 0] + 4 * scores[:, 2]) / 5)


def test_one_weight_row_per_canary():
  # A whitened signal L^-1 u has negative entries; each canary is combined with its own row.
  scores = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]])
  weights = np.array([[1.0, -1.0, 0.0], [0.0, 3.0, 4.0]])
  np.testing.assert_allclose(per_round.combined_scores(scores, weights),
                             [-1.0 / np.sqrt(2), (-3.0 + 16.0) / 5])


@pytest.mark.parametrize('method', sorted(per_round.BOUNDS))
def test_every_round_certifies_more_than_one_round(method):
  # 4 participations of signal 1 each: the mechanism is 2-GDP for a canary (4-fold composition of
  # 1-GDP), true epsilon 11.0 at delta 1e-6. One round's score sees a 1-GDP pair; the combined
  # score sees the whole 2-GDP pair. 1000 canaries of each kind.
  seen, unseen = _whitened_rounds(0, 1000, 4, 1.0)
  truth = gdp.epsilon_for_delta(2.0, 1e-6)
  combined = per_round.per_round_bound(seen, unseen, 1e-6, 0.95, method=method)
  single = per_round.BOUNDS[method](seen[:, 0], unseen[:, 0], 1e-6, 0.95)
  assert single.epsilon < combined.epsilon < truth
  assert combined.method == f'per_round/{method}'
  assert combined.confidence == 0.95 and 'combined' in combined.threshold_choice


def test_the_gain_on_the_gdp_fit():
  """The figures docs/auditing.md states (seed 0, 1000 + 1000 canaries, k = 4, mu_round = 1)."""
  seen, unseen = _whitened_rounds(0, 1000, 4, 1.0)
  combined = per_round.per_round_bound(seen, unseen, 1e-6, method='gdp_fit').epsilon
  single = threshold_bounds.gdp_fit_bound(seen[:, 0], unseen[:, 0], 1e-6).epsilon
  assert combined > 2 * single


def test_covers_the_truth_at_the_stated_rate():
  # 200 seeds, 100 canaries each, k = 3 rounds of signal 0.8: sqrt(3) 0.8-GDP. At confidence 0.8
  # the exceedances are at most Binomial(200, 0.2)'s 1 - 1e-6 quantile.
  seeds, confidence, delta = 200, 0.8, 1e-2
  truth = gdp.epsilon_for_delta(np.sqrt(3) * 0.8, delta)
  over = sum(per_round.per_round_bound(*_whitened_rounds(50 + seed, 100, 3, 0.8), delta,
                                       confidence).epsilon > truth for seed in range(seeds))
  assert over <= scipy.stats.binom.ppf(1 - 1e-6, seeds, 1 - confidence)


@pytest.mark.parametrize('call,name', [
    (lambda: per_round.combined_scores([1.0, 2.0]), 'round_scores'),
    (lambda: per_round.combined_scores([[1.0, 2.0]], [1.0]), 'round_weights'),
    (lambda: per_round.combined_scores([[1.0, 2.0]], [0.0, 0.0]), 'round_weights'),
    (lambda: per_round.combined_scores([[1.0, 2.0], [0.0, 1.0]], [[1.0, 2.0], [0.0, 0.0]]),
     'round_weights'),
    (lambda: per_round.combined_scores([[1.0, 2.0]], [[1.0, 2.0], [1.0, 1.0]]), 'round_weights'),
    (lambda: per_round.per_round_bound([[1.0], [2.0]], [[0.0], [1.0]], 1e-6, method='x'), 'method'),
    (lambda: per_round.per_round_bound([[1.0], [2.0]], [[0.0, 1.0], [1.0, 1.0]], 1e-6),
     'unseen_rounds'),
    (lambda: per_round.per_round_bound([[1.0], [2.0]], [[0.0], [1.0]], 0.0), 'delta'),
])
def test_invalid_arguments_are_named(call, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    call()
