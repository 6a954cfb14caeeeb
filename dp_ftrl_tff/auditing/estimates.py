"""Epsilon from canary scores: the one-shot estimate and a lower bound with confidence.

Both take two samples of scalar scores: `seen` (canaries inserted in training) and `unseen` (canaries
never inserted: the null distribution), and a target delta in (0, 1).

  * `estimate_epsilon` is an ESTIMATE (Andrew et al., "One-shot Empirical Privacy Estimation for
    Federated Learning", ICLR 2024): fit a Gaussian to each sample and report the epsilon of that
    pair of Gaussians. It has no confidence statement; it is meaningful when the scores are close to
    Gaussian, as they are for the canary statistics of a linear Gaussian mechanism
    (`statistics.canary_statistics`).
  * `epsilon_lower_bound` is a BOUND: with probability >= `confidence` over the scores, the mechanism
    that produced them is not (epsilon, delta)-DP for any epsilon below it (threshold tests with
    Jeffreys intervals, in the style of jax_privacy's auditing).
"""

import math

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

from dp_ftrl_tff import _validation

#: Brackets beyond this epsilon are not searched: the pair is reported as not separable (inf).
_MAX_EPSILON = 1e6

#: The fewest seen canaries (as many unseen) whose estimate a report prints. With N per sample the
#: fitted standard deviations differ by sampling error (relative sd about 1 / sqrt(2 N) each), and
#: at a small delta unequal variances inflate `estimate_epsilon` far above the mechanism's epsilon:
#: for a Gaussian mechanism that adds exactly the accounted noise (rho = 1, delta = 1e-10, epsilon
#: 9.62) the median estimate is 2.7x the accounted epsilon at N = 10 (97.5% quantile 15x), 1.9x at
#: N = 30 and 1.5x at N = 50 (97.5% quantile 2.8x); and `epsilon_lower_bound` cannot exceed 0.49
#: at N = 10, 2.26 at N = 50 (seen and unseen scores fully separated). docs/auditing.md.
MIN_SEEN_CANARIES = 50


def _check_scores(values, name: str) -> np.ndarray:
  scores = _validation.check_float_array(values, name, 1)
  if scores.size < 2:
    raise ValueError(f'`{name}` must hold at least 2 scores, got {scores.size}.')
  return scores


def _check_delta(delta) -> float:
  return _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                          high_inclusive=False)


# --- The one-shot estimate --------------------------------------------------------------------------
#
# dp_accounting has no privacy loss distribution for a pair of normals with UNEQUAL variances (its
# Gaussian PLD assumes one common std), and the fitted stds of two finite samples always differ, so
# the hockey-stick divergence is computed here in closed form. With L(x) = log p(x) / q(x) for
# P = N(m1, s1^2), Q = N(m0, s0^2):
#   H_eps(P || Q) = P[L > eps] - e^eps Q[L > eps],
# and {L > eps} = {a x^2 + b x + c > 0} with
#   a = 1 / (2 s0^2) - 1 / (2 s1^2),  b = m1 / s1^2 - m0 / s0^2,
#   c = m0^2 / (2 s0^2) - m1^2 / (2 s1^2) + log(s0 / s1) - eps:
# a half-line when a = 0, the complement of the roots' interval when a > 0, the interval when a < 0.
# Probabilities are kept in logs (log_ndtr) so that far-apart Gaussians do not underflow to 0.


def _log_phi(z: float) -> float:
  """log Phi(z), the standard normal CDF (exact at z = +-inf)."""
  return float(scipy.special.log_ndtr(z))


def _log_interval(z_lo: float, z_hi: float) -> float:
  """log (Phi(z_hi) - Phi(z_lo)) for z_lo <= z_hi, from the tail that avoids cancellation."""
  if z_lo >= 0:  # both in the right tail: difference of survival functions
    big, small = _log_phi(-z_lo), _log_phi(-z_hi)
  else:
    big, small = _log_phi(z_hi), _log_phi(z_lo)
  if big == -math.inf or small >= big:
    return -math.inf
  return big + math.log1p(-math.exp(small - big))


def _log_region_probability(region, mean: float, std: float) -> float:
  """log N(mean, std^2)[region] for a region from `_loss_region`."""
  kind, lo, hi = region
  z_lo, z_hi = (lo - mean) / std, (hi - mean) / std
  if kind == 'empty':
    return -math.inf
  if kind == 'all':
    return 0.0
  if kind == 'inside':
    return _log_interval(z_lo, z_hi)
  return float(np.logaddexp(_log_phi(z_lo), _log_phi(-z_hi)))  # 'outside': x < lo or x > hi


def _loss_region(a: float, b: float, c: float):
  """{x: a x^2 + b x + c > 0} as (kind, lo, hi): 'empty', 'all', 'inside' (lo, hi) or 'outside'
  (x < lo or x > hi; a half-line has lo = -inf or hi = +inf)."""
  if a == 0:
    if b == 0:
      return ('all' if c > 0 else 'empty'), 0.0, 0.0
    root = -c / b
    return ('outside', -math.inf, root) if b > 0 else ('outside', root, math.inf)
  disc = b * b - 4 * a * c
  if disc <= 0:
    return ('all' if a > 0 else 'empty'), 0.0, 0.0
  # Numerically stable roots (no cancellation when a is tiny: one root then runs off to infinity).
  q = -0.5 * (b + math.copysign(math.sqrt(disc), b))
  roots = sorted((q / a if q else math.inf, c / q if q else -math.inf))
  return ('outside' if a > 0 else 'inside'), roots[0], roots[1]


def _log_hockey_stick(epsilon: float, p, q) -> float:
  """log H_eps(P || Q) for normals p = (mean, std), q = (mean, std) with std > 0; -inf when H <= 0."""
  (m1, s1), (m0, s0) = p, q
  a = 0.5 / s0**2 - 0.5 / s1**2
  b = m1 / s1**2 - m0 / s0**2
  c = 0.5 * m0**2 / s0**2 - 0.5 * m1**2 / s1**2 + math.log(s0 / s1) - epsilon
  region = _loss_region(a, b, c)
  log_p = _log_region_probability(region, m1, s1)
  log_q = _log_region_probability(region, m0, s0)
  if log_p == -math.inf or epsilon + log_q >= log_p:
    return -math.inf
  return log_p + math.log1p(-math.exp(epsilon + log_q - log_p))


def _pair_epsilon(p, q, delta: float) -> float:
  """The smallest epsilon >= 0 with H_eps(P || Q) <= delta (H is non-increasing in epsilon)."""
  log_delta = math.log(delta)

  def excess(epsilon):
    # -inf (H <= 0) is replaced by a finite value below the target so brentq can interpolate; the
    # function stays monotone, so the sign change it converges to is the root.
    return max(_log_hockey_stick(epsilon, p, q), log_delta - 1e3) - log_delta

  if excess(0.0) <= 0:
    return 0.0
  upper = 1.0
  while excess(upper) > 0:
    upper *= 2.0
    if upper > _MAX_EPSILON:
      return math.inf
  return float(scipy.optimize.brentq(excess, 0.0, upper, xtol=1e-12, rtol=1e-12, maxiter=500))


def estimate_epsilon(seen, unseen, delta: float) -> float:
  """The one-shot epsilon estimate of two score samples (Andrew et al., ICLR 2024).

  Fits N(mean, std^2) to each sample (std with ddof=1) and returns the epsilon at `delta` of that pair
  of Gaussians, exactly (closed-form hockey-stick divergence, unequal variances allowed): the larger
  of the two orders (seen vs unseen and unseen vs seen), as add-or-remove DP requires both.

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite).
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    delta: in (0, 1).

  Returns:
    epsilon >= 0; 0.0 when the fitted Gaussians are within delta at epsilon 0; math.inf when no finite
    epsilon reaches delta (a zero std with different samples, e.g. noise multiplier 0).
  """
  seen = _check_scores(seen, 'seen')
  unseen = _check_scores(unseen, 'unseen')
  delta = _check_delta(delta)
  p = (float(np.mean(seen)), float(np.std(seen, ddof=1)))
  q = (float(np.mean(unseen)), float(np.std(unseen, ddof=1)))
  if p == q:
    return 0.0
  if p[1] == 0 or q[1] == 0:
    # A point mass against a different distribution: some event has probability 1 under one and 0
    # under the other, so H_eps = 1 > delta at every epsilon.
    return math.inf
  return max(_pair_epsilon(p, q, delta), _pair_epsilon(q, p, delta))


# --- The lower bound --------------------------------------------------------------------------------


def _jeffreys_lower(successes: np.ndarray, trials: int, level: float) -> np.ndarray:
  """One-sided Jeffreys lower bounds at `level` of binomial rates (0 for 0 successes)."""
  bound = scipy.stats.beta.ppf(1.0 - level, successes + 0.5, trials - successes + 0.5)
  return np.where(successes == 0, 0.0, bound)


def _jeffreys_upper(successes: np.ndarray, trials: int, level: float) -> np.ndarray:
  """One-sided Jeffreys upper bounds at `level` of binomial rates (1 for all successes)."""
  bound = scipy.stats.beta.ppf(level, successes + 0.5, trials - successes + 0.5)
  return np.where(successes == trials, 1.0, bound)


def _bounds(positive: np.ndarray, negative: np.ndarray, thresholds: np.ndarray, delta: float,
            level: float) -> np.ndarray:
  """log((TPR_lo - delta) / FPR_hi) of the tests "score >= t means positive", one per threshold t
  (-inf where TPR_lo <= delta)."""
  positive, negative = np.sort(positive), np.sort(negative)
  true_pos = positive.size - np.searchsorted(positive, thresholds, side='left')
  false_pos = negative.size - np.searchsorted(negative, thresholds, side='left')
  tpr = _jeffreys_lower(true_pos, positive.size, level) - delta
  fpr = _jeffreys_upper(false_pos, negative.size, level)
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.where(tpr > 0, np.log(np.maximum(tpr, 1e-300)) - np.log(fpr), -np.inf)


# The four threshold tests: ("seen" or "unseen" is the positive class) x (high or low scores are
# positive). Negating scores turns "score < t" into "-score > -t"; the bound for "score <= t" (ties
# counted) is as valid as for "score < t", and every pair is a DP test because add-or-remove DP
# bounds both TPR <= e^eps FPR + delta and TNR <= e^eps FNR + delta.
_TESTS = ((0, 1.0), (1, 1.0), (0, -1.0), (1, -1.0))  # (index of the positive sample, sign)


def epsilon_lower_bound(seen, unseen, delta: float, confidence: float = 0.95) -> float:
  """A lower bound on epsilon at `delta` that holds with probability >= `confidence`.

  Not an estimate: if the mechanism is (eps, delta)-DP, every test that tells seen from unseen
  scores has TPR <= e^eps FPR + delta and TNR <= e^eps FNR + delta, so
  eps >= log((TPR - delta) / FPR). The tests are thresholds: "score >= t means seen", its mirror
  "score <= t means seen", and both with the roles of seen and unseen swapped (the TNR / FNR form).
  The rates are replaced by one-sided Jeffreys bounds (Beta(k + 0.5, n - k + 0.5) quantiles; the
  lower bound of k = 0 is 0, the upper bound of k = n is 1), TPR from below and FPR from above.

  Choosing the best threshold on the same scores would void the confidence, so each sample is split
  deterministically in halves (even and odd indices, in the order given): the test (direction,
  roles, threshold) maximizing the bound on the first halves (even indices) is evaluated on the
  second halves (odd indices). The two intervals share 1 - confidence (union bound): each is at level
  1 - (1 - confidence) / 2. Scores must be independent draws (e.g. one per canary) for the binomial
  intervals to hold.

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite).
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    delta: in (0, 1).
    confidence: in (0, 1).

  Returns:
    The bound, >= 0 (0 when no test beats delta).
  """
  seen = _check_scores(seen, 'seen')
  unseen = _check_scores(unseen, 'unseen')
  delta = _check_delta(delta)
  confidence = _validation.check_float_in_range(confidence, 'confidence', 0.0, 1.0,
                                                low_inclusive=False, high_inclusive=False)
  level = 1.0 - (1.0 - confidence) / 2.0
  choose = (seen[0::2], unseen[0::2])
  check = (seen[1::2], unseen[1::2])
  best_bound, best_test = -math.inf, None
  for positive, sign in _TESTS:
    chosen_pos, chosen_neg = sign * choose[positive], sign * choose[1 - positive]
    thresholds = np.unique(chosen_pos)  # higher thresholds lower the TPR, so only these matter
    bounds = _bounds(chosen_pos, chosen_neg, thresholds, delta, level)
    index = int(np.argmax(bounds))
    if bounds[index] > best_bound:
      best_bound, best_test = bounds[index], (positive, sign, thresholds[index])
  if best_test is None:
    return 0.0
  positive, sign, threshold = best_test
  bound = _bounds(sign * check[positive], sign * check[1 - positive], np.array([threshold]), delta,
                  level)[0]
  return max(0.0, float(bound))
