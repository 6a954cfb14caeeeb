"""Lower bounds from threshold tests with Clopper-Pearson intervals, valid at every threshold at once.

The test "score >= t means seen" has false positive rate FPR(t) (unseen scores >= t) and false
negative rate FNR(t) (seen scores < t). If the mechanism is (eps, delta)-DP, every test obeys
  1 - FNR <= e^eps FPR + delta   and   1 - FPR <= e^eps FNR + delta
(the hypothesis-testing view of DP: Kairouz, Oh, Viswanath, "The Composition Theorem for
Differential Privacy", ICML 2015); if it is mu-GDP, FNR >= G_mu(FPR) (`gdp.tradeoff`),
i.e. mu >= Phi^-1(1 - FPR) - Phi^-1(FNR). Replacing FPR and FNR by upper confidence bounds keeps
both inequalities, so each gives a lower bound (Jagielski, Ullman, Oprea, "Auditing Differentially
Private Machine Learning: How Private is Private SGD?", NeurIPS 2020, with Clopper-Pearson
intervals; for the Gaussian fit, Nasr et al., "Tight Auditing of Differentially Private Machine
Learning", USENIX Security 2023).

Threshold choice: Bonferroni over thresholds, done so that it covers every threshold t in R at
once and does not depend on the data. For one sample of n scores, the count of scores >= t takes
n + 1 values, and the one-sided Clopper-Pearson upper bound at count k can only fail at the
(population) threshold where the true rate first exceeds the bound for k: n events (k = n never
fails), each of probability <= a. With a = (1 - confidence) / (2 n) per sample, the bands on FPR
and on FNR hold at all thresholds simultaneously with probability >= `confidence`, so the best
threshold may be picked on the same scores. (jax_privacy's `CanaryScoreAuditor` divides instead
by the number of points on the data's ROC hull, a smaller, data-chosen family.)
"""

import math

import numpy as np
import scipy.special
import scipy.stats

from dp_ftrl_tff.auditing import bound as bound_lib
from dp_ftrl_tff.auditing import gdp


def clopper_pearson_upper(count, trials: int, level: float) -> np.ndarray:
  """One-sided Clopper-Pearson upper bounds at confidence `level` of binomial rates.

  The bound u for k successes of n solves P(Binomial(n, u) <= k) = 1 - level, i.e. the `level`
  quantile of Beta(k + 1, n - k); it is 1 for k = n.
  """
  count = np.asarray(count)
  # Beta's second parameter must be > 0: clip it where k = n, which the np.where then replaces.
  upper = scipy.stats.beta.ppf(level, count + 1, np.maximum(trials - count, 1))
  return np.where(count >= trials, 1.0, upper)


def _simultaneous_bands(seen: np.ndarray, unseen: np.ndarray, confidence: float):
  """(FPR upper bounds, FNR upper bounds) of "score >= t means seen" at every distinct threshold
  (the distinct scores and +inf), holding together with probability >= `confidence`."""
  thresholds = np.append(np.union1d(seen, unseen), math.inf)
  false_neg = np.searchsorted(np.sort(seen), thresholds, side='left')  # seen < t
  false_pos = unseen.size - np.searchsorted(np.sort(unseen), thresholds, side='left')
  failure = 1.0 - confidence
  fpr_upper = clopper_pearson_upper(false_pos, unseen.size, 1.0 - failure / (2 * unseen.size))
  fnr_upper = clopper_pearson_upper(false_neg, seen.size, 1.0 - failure / (2 * seen.size))
  return fpr_upper, fnr_upper


def _band_text(seen: np.ndarray, unseen: np.ndarray) -> str:
  return ('Bonferroni over thresholds: one-sided Clopper-Pearson bands on FPR and FNR valid at '
          f'every threshold at once ((1 - confidence) / 2 per sample, split over its {unseen.size} '
          f'unseen and {seen.size} seen count levels); the best threshold is then taken')


def _log_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
  """log(numerator / denominator) where numerator > 0, else -inf."""
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.where(numerator > 0, np.log(np.maximum(numerator, 1e-300)) - np.log(denominator),
                    -math.inf)


def clopper_pearson_bound(seen, unseen, delta: float,
                          confidence: float = 0.95) -> bound_lib.EpsilonBound:
  """The (eps, delta) lower bound of the best threshold test, with Clopper-Pearson intervals.

  eps >= max over thresholds t of log((1 - FNR_up(t) - delta) / FPR_up(t)) and of
  log((1 - FPR_up(t) - delta) / FNR_up(t)), with the simultaneous bands of the module docstring
  (Bonferroni over thresholds, no split). No assumption on the mechanism beyond independent
  scores (one per canary).

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite); higher means seen.
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    delta: in (0, 1).
    confidence: in (0, 1).
  """
  seen, unseen, delta, confidence = bound_lib.check_bound_inputs(seen, unseen, delta, confidence)
  fpr_upper, fnr_upper = _simultaneous_bands(seen, unseen, confidence)
  bounds = np.concatenate([_log_ratio(1.0 - fnr_upper - delta, fpr_upper),
                           _log_ratio(1.0 - fpr_upper - delta, fnr_upper)])
  return bound_lib.EpsilonBound(
      method='clopper_pearson', epsilon=max(0.0, float(np.max(bounds))), delta=delta,
      confidence=confidence, threshold_choice=_band_text(seen, unseen), assumption='',
      canaries_seen=int(seen.size), canaries_unseen=int(unseen.size))


def gdp_mu_lower_bound(seen, unseen, confidence: float = 0.95) -> float:
  """A lower bound on mu, holding with probability >= `confidence` if the mechanism is mu-GDP.

  mu >= max over thresholds of Phi^-1(1 - FPR_up(t)) - Phi^-1(FNR_up(t)) (the same simultaneous
  bands as `clopper_pearson_bound`; the expression is symmetric in the roles of seen and unseen,
  so one direction covers both). 0 when no threshold certifies mu > 0.
  """
  seen = bound_lib.check_scores(seen, 'seen')
  unseen = bound_lib.check_scores(unseen, 'unseen')
  confidence = bound_lib.check_confidence(confidence)
  fpr_upper, fnr_upper = _simultaneous_bands(seen, unseen, confidence)
  mus = -scipy.special.ndtri(fpr_upper) - scipy.special.ndtri(fnr_upper)  # -inf where a rate is 1
  return max(0.0, float(np.max(mus)))


def gdp_fit_bound(seen, unseen, delta: float, confidence: float = 0.95) -> bound_lib.EpsilonBound:
  """The epsilon at `delta` of the Gaussian-DP curve certified by the scores' threshold tests.

  mu_lo = `gdp_mu_lower_bound` (Bonferroni over thresholds, no split); the bound is
  `gdp.epsilon_for_delta(mu_lo, delta)`. Assumes the mechanism's trade-off curve is Gaussian
  (`bound.GDP_ASSUMPTION`): then it is tighter than `clopper_pearson_bound` at small delta,
  because every threshold's pair of rates constrains the whole curve, not one point of it.

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite); higher means seen.
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    delta: in (0, 1).
    confidence: in (0, 1).
  """
  seen, unseen, delta, confidence = bound_lib.check_bound_inputs(seen, unseen, delta, confidence)
  mu = gdp_mu_lower_bound(seen, unseen, confidence)
  return bound_lib.EpsilonBound(
      method='gdp_fit', epsilon=gdp.epsilon_for_delta(mu, delta), delta=delta,
      confidence=confidence, threshold_choice=_band_text(seen, unseen),
      assumption=bound_lib.GDP_ASSUMPTION, canaries_seen=int(seen.size),
      canaries_unseen=int(unseen.size))
