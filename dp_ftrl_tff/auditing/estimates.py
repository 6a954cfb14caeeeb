"""Epsilon from canary scores: the one-shot ESTIMATE (no confidence statement).

`estimate_epsilon` (Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning",
ICLR 2024) takes two samples of scalar scores, `seen` (canaries inserted in training) and `unseen`
(canaries never inserted: the null distribution), and a target delta in (0, 1), fits a Gaussian to
each sample and reports the epsilon of that pair of Gaussians. It is meaningful when the scores are
close to Gaussian, as they are for the canary statistics of a linear Gaussian mechanism
(`statistics.canary_statistics`). The lower BOUNDS with a confidence are in `threshold_bounds`,
`one_run`, `one_run_fdp` and `per_round` (`empirical` puts them in a run's rows); they replace the
Jeffreys-interval bound this module used to hold, whose intervals have no guaranteed coverage.
"""

import math

import numpy as np
import scipy.optimize
import scipy.special

from dp_ftrl_tff.auditing import bound as bound_lib

#: Brackets beyond this epsilon are not searched: the pair is reported as not separable (inf).
_MAX_EPSILON = 1e6

#: The fewest seen canaries (as many unseen) whose estimate a report prints. With N per sample the
#: fitted standard deviations differ by sampling error (relative sd about 1 / sqrt(2 N) each), and
#: at a small delta unequal variances inflate `estimate_epsilon` far above the mechanism's epsilon:
#: for a Gaussian mechanism that adds exactly the accounted noise (rho = 1, delta = 1e-10, epsilon
#: 9.62) the median estimate is 2.7x the accounted epsilon at N = 10 (97.5% quantile 15x), 1.9x at
#: N = 30 and 1.5x at N = 50 (97.5% quantile 2.8x); and a lower bound can show little there (seen
#: and unseen scores fully separated, 95% confidence, delta 1e-10: Clopper-Pearson 1.81 at N = 50,
#: the one-run bound 2.98). docs/auditing.md.
MIN_SEEN_CANARIES = 50


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
  seen = bound_lib.check_scores(seen, 'seen')
  unseen = bound_lib.check_scores(unseen, 'unseen')
  delta = bound_lib.check_delta(delta)
  p = (float(np.mean(seen)), float(np.std(seen, ddof=1)))
  q = (float(np.mean(unseen)), float(np.std(unseen, ddof=1)))
  if p == q:
    return 0.0
  if p[1] == 0 or q[1] == 0:
    # A point mass against a different distribution: some event has probability 1 under one and 0
    # under the other, so H_eps = 1 > delta at every epsilon.
    return math.inf
  return max(_pair_epsilon(p, q, delta), _pair_epsilon(q, p, delta))
