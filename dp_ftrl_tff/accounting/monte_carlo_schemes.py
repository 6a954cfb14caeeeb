"""The random participation schemes of `monte_carlo`: pattern sampling, enumeration, and the
additive inner expectation of one user's privacy loss (see `monte_carlo`'s docstring for the
schemes: 'cyclic_poisson', 'min_sep' Poisson-like and 'balls_in_bins'). Rounds are 0-based.
"""

import abc
import itertools
import math
from typing import Tuple

import numpy as np
import scipy.special


class Scheme(abc.ABC):
  """Random participation of one user in rounds 0 .. n-1.

  Per-sample arrays are rounds-major, shape (n, count): one contiguous row per round.
  """

  def __init__(self, num_rounds: int):
    self.num_rounds = num_rounds

  @property
  @abc.abstractmethod
  def max_orthogonal_bands(self) -> int:
    """The most bands of C for which any two rounds of one pattern have disjoint columns."""

  @abc.abstractmethod
  def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
    """(n, count) float64 0/1 indicators u_S of independent patterns (one per column)."""

  @abc.abstractmethod
  def num_patterns(self) -> int:
    """How many patterns have positive probability (may be huge)."""

  @abc.abstractmethod
  def patterns(self) -> Tuple[np.ndarray, np.ndarray]:
    """((P, n) 0/1 indicators, (P,) log-probabilities) of every pattern of positive probability."""

  @abc.abstractmethod
  def log_expectation_additive(self, a: np.ndarray) -> np.ndarray:
    """log E_S[exp(sum_{i in S} a_i)] for each column of a, shape (n, count)."""


def log_bernoulli_mgf(x: np.ndarray, q: float) -> np.ndarray:
  """log(1 - q + q e^x) elementwise: log1p(q expm1(x)) (twice as fast as logaddexp) for q <= 1/2,
  where 1 - q >= 1/2 keeps it accurate for x -> -inf; logaddexp otherwise; no overflow."""
  if q > 0.5:
    with np.errstate(divide='ignore'):
      return np.logaddexp(np.log1p(-q), math.log(q) + x)
  out = np.minimum(x, 30.0)  # in place below: these arrays hold samples x rounds entries
  np.expm1(out, out=out)
  out *= q
  np.log1p(out, out=out)
  big = x > 30.0
  if np.any(big):
    out[big] = math.log(q) + x[big] + np.log1p((1 - q) * np.exp(-x[big]))
  return out


class CyclicPoisson(Scheme):
  """Rounds offset, offset + period, ...; each joined independently with probability q."""

  def __init__(self, num_rounds: int, period: int, offset: int, q: float):
    super().__init__(num_rounds)
    self.period, self.q = period, q
    self.rounds = np.arange(offset, num_rounds, period)

  @property
  def max_orthogonal_bands(self) -> int:
    return self.period

  def sample(self, rng, count):
    u = np.zeros((self.num_rounds, count))
    u[self.rounds] = rng.random((self.rounds.size, count)) < self.q
    return u

  def num_patterns(self) -> int:
    return 1 if self.q == 1 else 2**self.rounds.size

  def patterns(self):
    choices = [(1,)] * self.rounds.size if self.q == 1 else [(0, 1)] * self.rounds.size
    joined = np.array(list(itertools.product(*choices)), dtype=np.float64).reshape(
        -1, self.rounds.size)
    u = np.zeros((joined.shape[0], self.num_rounds))
    u[:, self.rounds] = joined
    log_p = joined.sum(1) * math.log(self.q)
    if self.q < 1:
      log_p += (1 - joined).sum(1) * math.log1p(-self.q)
    return u, log_p

  def log_expectation_additive(self, a):
    return np.sum(log_bernoulli_mgf(a[self.rounds], self.q), axis=0)


class MinSepPoisson(Scheme):
  """Eligible unless a participation in the previous b - 1 rounds; eligible joins w.p. q."""

  def __init__(self, num_rounds: int, min_sep: int, q: float):
    super().__init__(num_rounds)
    self.min_sep, self.q = min_sep, q

  @property
  def max_orthogonal_bands(self) -> int:
    return self.min_sep

  def sample(self, rng, count):
    # Eligible from round e on, a user joins in round e + G - 1, G ~ Geometric(q) on {1, 2, ...}
    # (the first success of independent q-coins); it is eligible again from that round + b.
    u = np.zeros((self.num_rounds, count))
    samples = np.arange(count)
    joins = rng.geometric(self.q, size=count) - 1
    while True:
      live = joins < self.num_rounds
      if not np.any(live):
        return u
      u[joins[live], samples[live]] = 1.0
      joins = np.where(live, joins + self.min_sep - 1 + rng.geometric(self.q, size=count), joins)

  def num_patterns(self) -> int:
    # Patterns of rounds >= t that start eligible at t: count_t = count_{t+1} + count_{t+b}.
    n, b = self.num_rounds, self.min_sep
    if self.q == 1:
      return 1
    count = [1] * (n + b)
    for t in range(n - 1, -1, -1):
      count[t] = count[t + 1] + count[t + b]
    return count[0]

  def patterns(self):
    n, b, q = self.num_rounds, self.min_sep, self.q
    rows, log_probs = [], []

    def extend(t, chosen, log_p):
      if t >= n:
        rows.append(chosen)
        log_probs.append(log_p)
        return
      extend(t + b, chosen + [t], log_p + math.log(q))
      if q < 1:
        extend(t + 1, chosen, log_p + math.log1p(-q))

    extend(0, [], 0.0)
    u = np.zeros((len(rows), n))
    for r, chosen in enumerate(rows):
      u[r, chosen] = 1.0
    return u, np.array(log_probs)

  def log_expectation_additive(self, a):
    n, b = self.num_rounds, self.min_sep
    with np.errstate(divide='ignore'):
      log_skip = np.log1p(-self.q)
    join = a + math.log(self.q)  # log(q e^{a_t})
    log_f = np.zeros((n + b, a.shape[1]))  # log F_t; F_t = 1 for t >= n
    skip = np.empty(a.shape[1])
    for t in range(n - 1, -1, -1):  # in place: n steps over rows of `count` samples
      np.add(log_f[t + 1], log_skip, out=skip)
      np.add(join[t], log_f[t + b], out=log_f[t])
      np.logaddexp(skip, log_f[t], out=log_f[t])
    return log_f[0]


class BallsInBins(Scheme):
  """One uniformly random round in each epoch of `epoch` rounds."""

  def __init__(self, num_rounds: int, epoch: int):
    super().__init__(num_rounds)
    self.epoch = epoch
    self.num_epochs = num_rounds // epoch

  @property
  def max_orthogonal_bands(self) -> int:
    return 1

  def sample(self, rng, count):
    u = np.zeros((self.num_rounds, count))
    chosen = rng.integers(0, self.epoch, size=(self.num_epochs, count))
    chosen += (np.arange(self.num_epochs) * self.epoch)[:, None]
    np.put_along_axis(u, chosen, 1.0, axis=0)
    return u

  def num_patterns(self) -> int:
    return self.epoch**self.num_epochs

  def patterns(self):
    starts = np.arange(self.num_epochs) * self.epoch
    choices = np.array(list(itertools.product(range(self.epoch), repeat=self.num_epochs)))
    u = np.zeros((choices.shape[0], self.num_rounds))
    np.put_along_axis(u, choices.reshape(-1, self.num_epochs) + starts, 1.0, axis=1)
    return u, np.full(u.shape[0], -self.num_epochs * math.log(self.epoch))

  def log_expectation_additive(self, a):
    per_epoch = a.reshape(self.num_epochs, self.epoch, a.shape[1])
    return np.sum(scipy.special.logsumexp(per_epoch, axis=1) - math.log(self.epoch), axis=0)
