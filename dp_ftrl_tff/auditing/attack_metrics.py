"""What a membership attack on the canary scores achieves: TPR at a given FPR, AUROC, accuracy.

These are measurements of the attack "score >= t means seen" on the given scores (higher means
seen), not bounds: they carry no confidence statement (the epsilon bounds with confidence are in
`threshold_bounds`, `one_run` and `one_run_fdp`). They are the figures membership-inference papers
report (e.g. Carlini et al., "Membership Inference Attacks From First Principles", S&P 2022: TPR
at low FPR), so a report can be read beside them.
"""

import numpy as np
import scipy.stats

from dp_ftrl_tff import _validation
from dp_ftrl_tff.auditing import bound as bound_lib


def roc_points(seen, unseen) -> np.ndarray:
  """The (FPR, TPR) points of the threshold tests at every distinct score and +inf, FPR ascending
  (from (0, 0) at t = +inf to (1, 1) at the lowest score)."""
  seen = bound_lib.check_scores(seen, 'seen')
  unseen = bound_lib.check_scores(unseen, 'unseen')
  thresholds = np.append(np.union1d(seen, unseen), np.inf)[::-1]
  tpr = (seen.size - np.searchsorted(np.sort(seen), thresholds, side='left')) / seen.size
  fpr = (unseen.size - np.searchsorted(np.sort(unseen), thresholds, side='left')) / unseen.size
  return np.stack([fpr, tpr], axis=1)


def _upper_hull(points: np.ndarray) -> np.ndarray:
  """The upper concave hull of points sorted by x (Andrew's monotone chain): the ROC curve of the
  tests that randomize between two thresholds."""
  hull = []
  for point in points:
    # Drop the last vertex while it lies on or below the segment from its predecessor to `point`.
    while len(hull) >= 2:
      (x0, y0), (x1, y1) = hull[-2], hull[-1]
      if (x1 - x0) * (point[1] - y0) - (y1 - y0) * (point[0] - x0) >= 0:
        hull.pop()
      else:
        break
    hull.append(point)
  return np.asarray(hull)


def tpr_at_fpr(seen, unseen, fpr):
  """The largest TPR of a (possibly randomized) threshold test with false positive rate <= `fpr`.

  Randomizing between two thresholds reaches every point of the ROC curve's concave hull, so this
  interpolates that hull at `fpr`.

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite); higher means seen.
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    fpr: float or array in [0, 1].

  Returns:
    float (or array shaped like `fpr`) in [0, 1].
  """
  points = roc_points(seen, unseen)
  rates = np.asarray(fpr, dtype=np.float64)
  if not np.all(np.isfinite(rates)) or np.any((rates < 0) | (rates > 1)):
    raise ValueError(f'`fpr` must lie in [0, 1], got {fpr!r}.')
  hull = _upper_hull(points)
  # The hull may rise vertically at FPR 0 (TPR increases, FPR does not): keep the highest point of
  # equal FPR, the last one, so that np.interp sees increasing x.
  hull = hull[np.append(hull[1:, 0] != hull[:-1, 0], True)]
  result = np.interp(rates, hull[:, 0], hull[:, 1])
  return float(result) if result.ndim == 0 else result


def attack_auroc(seen, unseen) -> float:
  """The area under the ROC curve: P(a seen score > an unseen one) + P(tie) / 2 (Mann-Whitney).

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite); higher means seen.
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
  """
  seen = bound_lib.check_scores(seen, 'seen')
  unseen = bound_lib.check_scores(unseen, 'unseen')
  # Rank-sum form of the U statistic: midranks count a tie as one half.
  ranks = scipy.stats.rankdata(np.concatenate([seen, unseen]))
  u_statistic = np.sum(ranks[:seen.size]) - seen.size * (seen.size + 1) / 2
  return float(u_statistic / (seen.size * unseen.size))


def max_accuracy(seen, unseen, prevalence=None) -> float:
  """The best accuracy of a threshold test: max over t of prevalence TPR + (1 - prevalence) TNR.

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite); higher means seen.
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    prevalence: the weight of the seen class in [0, 1]; default the seen share of the canaries
      (then the accuracy is the fraction of canaries classified right).
  """
  points = roc_points(seen, unseen)
  if prevalence is None:
    num_seen, num_unseen = np.size(seen), np.size(unseen)
    prevalence = num_seen / (num_seen + num_unseen)
  prevalence = _validation.check_float_in_range(prevalence, 'prevalence', 0.0, 1.0)
  return float(np.max(prevalence * points[:, 1] + (1 - prevalence) * (1 - points[:, 0])))
