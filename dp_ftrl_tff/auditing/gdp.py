"""Gaussian differential privacy (mu-GDP) in closed form: trade-off curve, delta(eps), eps(delta).

A mechanism is mu-GDP (Dong, Roth, Su, "Gaussian Differential Privacy", JRSS-B 2022) when telling
neighbouring inputs apart is no easier than telling N(0, 1) from N(mu, 1): every test with false
positive rate alpha has false negative rate at least
  G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)                          (the trade-off curve; Def. 2.7),
and its privacy profile is (their Cor. 2.13)
  delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2).
A Gaussian mechanism with L2 sensitivity s and noise std sigma is (s / sigma)-GDP, so mu is the
signal-to-noise ratio of a canary's score (e.g. the whitened score of `statistics`). The auditing
bounds use these to turn a certified mu into an epsilon at the report's delta.
"""

import math

import numpy as np
import scipy.optimize
import scipy.special

from dp_ftrl_tff import _validation

#: mu beyond which no delta in (0, 1) is reachable at a finite epsilon in float64 is not searched.
_MAX_MU = 1e3


def _check_mu(mu) -> float:
  return _validation.check_nonnegative_float(mu, 'mu')


def tradeoff(mu: float, alpha):
  """G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu): the smallest false negative rate of a test with
  false positive rate `alpha` (array or float in [0, 1]) against mu-GDP."""
  mu = _check_mu(mu)
  alpha = np.asarray(alpha, dtype=np.float64)
  if np.any((alpha < 0) | (alpha > 1)) or not np.all(np.isfinite(alpha)):
    raise ValueError(f'`alpha` must lie in [0, 1], got {alpha!r}.')
  return scipy.special.ndtr(scipy.special.ndtri(1.0 - alpha) - mu)


def _log_delta(mu: float, epsilon: float) -> float:
  """log delta(eps) of mu-GDP (mu > 0), -inf when delta underflows; logs keep the difference of two
  tiny tails accurate (at mu = 2, eps = 11 both terms are about 1e-6 and differ by their size)."""
  log_first = float(scipy.special.log_ndtr(-epsilon / mu + mu / 2))
  log_second = epsilon + float(scipy.special.log_ndtr(-epsilon / mu - mu / 2))
  if log_first == -math.inf or log_second >= log_first:
    return -math.inf
  return log_first + math.log1p(-math.exp(log_second - log_first))


def delta_for_epsilon(mu: float, epsilon: float) -> float:
  """delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2) of mu-GDP (0 for mu = 0).

  Args:
    mu: >= 0.
    epsilon: >= 0.
  """
  mu = _check_mu(mu)
  epsilon = _validation.check_nonnegative_float(epsilon, 'epsilon')
  if mu == 0:
    return 0.0
  return math.exp(_log_delta(mu, epsilon))


def epsilon_for_delta(mu: float, delta: float) -> float:
  """The smallest eps >= 0 with delta(eps) <= `delta` for mu-GDP (0 for mu = 0).

  Args:
    mu: >= 0.
    delta: in (0, 1).
  """
  mu = _check_mu(mu)
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                           high_inclusive=False)
  if mu == 0:
    return 0.0
  log_target = math.log(delta)

  def excess(epsilon):  # decreasing in epsilon; -inf floored so brentq can interpolate
    return max(_log_delta(mu, epsilon), log_target - 1e3) - log_target

  if excess(0.0) <= 0:
    return 0.0
  upper = max(1.0, mu * mu)
  while excess(upper) > 0:
    upper *= 2.0
  return float(scipy.optimize.brentq(excess, 0.0, upper, xtol=1e-12, rtol=1e-12, maxiter=500))


def mu_for_epsilon(epsilon: float, delta: float) -> float:
  """The mu whose mu-GDP has delta(`epsilon`) = `delta` exactly (delta(eps) increases with mu).

  Args:
    epsilon: >= 0.
    delta: in (0, 1).
  """
  epsilon = _validation.check_nonnegative_float(epsilon, 'epsilon')
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                           high_inclusive=False)
  log_target = math.log(delta)

  def excess(mu):
    return max(_log_delta(mu, epsilon), log_target - 1e3) - log_target

  lower, upper = 1e-12, 1.0
  while excess(upper) < 0:
    upper *= 2.0
    if upper > _MAX_MU:
      return math.inf
  return float(scipy.optimize.brentq(excess, lower, upper, xtol=1e-12, rtol=1e-12, maxiter=500))
