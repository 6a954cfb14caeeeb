"""Tests for `dp_ftrl_tff.auditing.attack_metrics`: TPR at FPR, AUROC and accuracy against brute
force over thresholds and pairs, and against the Gaussian figures of the issue's example."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from dp_ftrl_tff.auditing import attack_metrics

pytestmark = pytest.mark.unit


def _rates(seen, unseen):
  """(FPR, TPR) of "score >= t means seen" at every score, below all and above all."""
  thresholds = sorted(set(seen) | set(unseen)) + [math.inf, -math.inf]
  return [(sum(u >= t for u in unseen) / len(unseen), sum(s >= t for s in seen) / len(seen))
          for t in thresholds]


def _tpr_by_mixing_pairs(seen, unseen, fpr):
  """The best TPR of a test mixing two thresholds (or one), with FPR exactly <= fpr."""
  best = 0.0
  points = _rates(seen, unseen)
  for (x0, y0), (x1, y1) in itertools.product(points, points):
    if x0 <= fpr <= x1:
      weight = 0.0 if x1 == x0 else (fpr - x0) / (x1 - x0)
      best = max(best, y0 + weight * (y1 - y0))
    if x0 <= fpr:
      best = max(best, y0)
  return best


def _scores(seed, mu, sizes=(40, 47)):
  rng = np.random.default_rng(seed)
  seen, unseen = rng.normal(mu, 1.0, sizes[0]), rng.normal(0.0, 1.0, sizes[1])
  # Round to create ties within and between the samples.
  return np.round(seen, 1), np.round(unseen, 1)


@pytest.mark.parametrize('seed,mu', [(0, 1.0), (1, 0.0), (2, 3.0), (3, -1.0)])
def test_tpr_at_fpr_matches_mixing_pairs_of_thresholds(seed, mu):
  seen, unseen = _scores(seed, mu)
  fprs = [0.0, 0.01, 0.05, 0.1, 0.33, 0.5, 0.9, 1.0]
  expected = [_tpr_by_mixing_pairs(seen.tolist(), unseen.tolist(), fpr) for fpr in fprs]
  np.testing.assert_allclose(attack_metrics.tpr_at_fpr(seen, unseen, fprs), expected, atol=1e-12)
  assert attack_metrics.tpr_at_fpr(seen, unseen, 0.05) == pytest.approx(expected[2], abs=1e-12)


@pytest.mark.parametrize('seed,mu', [(0, 1.0), (1, 0.0), (2, 3.0)])
def test_auroc_and_accuracy_match_brute_force(seed, mu):
  seen, unseen = _scores(seed, mu)
  pairs = [(s > u) + 0.5 * (s == u) for s in seen for u in unseen]
  assert attack_metrics.attack_auroc(seen, unseen) == pytest.approx(np.mean(pairs), rel=1e-12)
  total = len(seen) + len(unseen)
  accuracy = max((tpr * len(seen) + (1 - fpr) * len(unseen)) / total
                 for fpr, tpr in _rates(seen.tolist(), unseen.tolist()))
  assert attack_metrics.max_accuracy(seen, unseen) == pytest.approx(accuracy, rel=1e-12)
  balanced = max((tpr + 1 - fpr) / 2 for fpr, tpr in _rates(seen.tolist(), unseen.tolist()))
  assert attack_metrics.max_accuracy(seen, unseen, prevalence=0.5) == pytest.approx(balanced)


def test_the_issue_example_meets_the_gaussian_figures():
  """Held-out N(0, 1), held-in N(2, 1), 2000 each: AUROC Phi(2 / sqrt(2)) = 0.921, best accuracy
  Phi(1) = 0.841 (the balanced test), TPR at FPR x of R(x) = Phi(2 - Phi^-1(1 - x)).

  Tolerances at failure probability 1e-6: the AUROC changes by at most 1 / n when one of n scores
  changes, so McDiarmid's inequality gives |AUROC - truth| <= sqrt(log(2e6) (1/n + 1/n) / 2).
  Every empirical rate is within the DKW bound e = sqrt(log(4e6) / (2 n)) of its true value at
  every threshold (both samples, 1e-6 in all); then the accuracy is within 2 e, and the hull's
  TPR at x lies in [R(x - e) - e, R(x + e) + e] (R is concave: a mix of points is below R at the
  mixed FPR, and the threshold of true FPR x - e has an empirical FPR <= x).
  """
  rng = np.random.default_rng(0)
  unseen, seen = rng.normal(0, 1, 2000), rng.normal(2, 1, 2000)
  norm, n = scipy.stats.norm, 2000
  mcdiarmid = math.sqrt(math.log(2e6) * (2 / n) / 2)
  dkw = math.sqrt(math.log(4e6) / (2 * n))
  assert attack_metrics.attack_auroc(seen, unseen) == pytest.approx(norm.cdf(math.sqrt(2)),
                                                                    abs=mcdiarmid)
  assert attack_metrics.max_accuracy(seen, unseen) == pytest.approx(norm.cdf(1), abs=2 * dkw)
  def roc(fpr):
    return norm.sf(norm.isf(min(max(fpr, 0.0), 1.0)) - 2)

  for fpr in (0.01, 0.1, 0.3):
    assert roc(fpr - dkw) - dkw <= attack_metrics.tpr_at_fpr(seen, unseen, fpr) <= (
        roc(fpr + dkw) + dkw)


def test_extremes():
  low, high = np.zeros(30), np.ones(20)
  assert attack_metrics.attack_auroc(high, low) == 1.0
  assert attack_metrics.attack_auroc(low, high) == 0.0
  assert attack_metrics.tpr_at_fpr(high, low, 0.0) == 1.0
  # Seen scores all below: mixing "all seen" with "none seen" is the best, TPR = FPR.
  np.testing.assert_allclose(attack_metrics.tpr_at_fpr(low, high, [0.0, 0.3, 1.0]), [0, 0.3, 1])


@pytest.mark.parametrize('call,name', [
    (lambda: attack_metrics.attack_auroc([1.0], [0.0, 1.0]), 'seen'),
    (lambda: attack_metrics.attack_auroc([1.0, 2.0], [0.0, math.inf]), 'unseen'),
    (lambda: attack_metrics.tpr_at_fpr([1.0, 2.0], [0.0, 1.0], 1.5), 'fpr'),
    (lambda: attack_metrics.tpr_at_fpr([1.0, 2.0], [0.0, 1.0], [0.1, math.nan]), 'fpr'),
    (lambda: attack_metrics.max_accuracy([1.0, 2.0], [0.0, 1.0], prevalence=-0.1), 'prevalence'),
    (lambda: attack_metrics.roc_points([[1.0, 2.0]], [0.0, 1.0]), 'seen'),
])
def test_invalid_arguments_are_named(call, name):
  with pytest.raises(ValueError, match=f'`{name}`'):
    call()
