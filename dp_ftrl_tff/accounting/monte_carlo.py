r"""Monte Carlo (epsilon, delta) of a matrix mechanism under random participation, with confidence.

The release is y = C x + sigma z (clip norm 1, z ~ N(0, I_n), C lower-triangular n x n, rounds
t = 0 .. n-1). One user participates in a random set S of rounds, drawn independently of the data
from one of three `SAMPLINGS`; u_S in {0, 1}^n is its indicator.

Dominating pair (docs/papers.md#mc-accounting, near-exact amplification): for a NON-NEGATIVE
lower-triangular C, the adaptive matrix mechanism with such sampling is dominated by the pair of the
mixture of Gaussians P = E_S[N(C u_S, sigma^2 I)] (the user's contribution, worst-case the same unit
vector in every round) and Q = N(0, sigma^2 I). Its privacy loss at y is

  L(y) = log(P / Q)(y) = log E_S[ exp(<y, C u_S> / sigma^2 - ||C u_S||^2 / (2 sigma^2)) ].

For every epsilon, both neighbouring directions give a delta that is the mean of a [0, 1] variable:

  remove:  delta_r(eps) = E_{y ~ P}[(1 - exp(eps - L(y)))_+],
  add:     delta_a(eps) = E_{y ~ Q}[(1 - exp(eps + L(y)))_+],

and delta(eps) = max(delta_r, delta_a) (the hockey-stick divergence: int (p - e^eps q)_+ dy =
E_P[(1 - e^{eps - L})_+]; likewise with P and Q swapped, whose loss is -L).
`monte_carlo_epsilon` draws `num_samples` outputs y per direction, computes L(y) exactly (below),
and bounds each mean with the Chernoff-Hoeffding inequality for i.i.d. [0, 1] variables (Hoeffding
1963, Thm. 1, docs/papers.md#mc-accounting): P(mean_hat <= mu - t) <= exp(-N KL(mu - t || mu)) and
symmetrically, with KL the Bernoulli relative entropy. Inverted, mean <= UCB(mean_hat) with
probability >= 1 - beta, UCB(m) = sup{mu >= m : N KL(m || mu) <= log(1 / beta)}; likewise a lower
bound. Every sample's term is non-increasing in eps,
so UCB(eps) is non-increasing and `epsilon_upper` = min{eps : UCB_r(eps) <= delta and UCB_a(eps) <=
delta} exceeds the true epsilon except with probability <= beta per bound (the event "eps_upper <
eps*" implies UCB(eps0) <= delta at a fixed eps0 < eps* where the true delta exceeds delta).
The (1 - `confidence`) budget is split evenly over the 4 one-sided bounds (x the number of offsets
evaluated separately, see below), so [epsilon_lower, epsilon_upper] holds with probability >=
`confidence`. A mean whose UCB cannot reach `delta` (N < log(1 / beta) / delta roughly, since even
an all-zero sample gives UCB ~ log(1 / beta) / N) gives epsilon_upper = inf, never an understated
epsilon.
dp_accounting 0.4.3 has no Monte Carlo accountant and no mixture-of-Gaussians event, hence this
module.

Sampling schemes (`sampling`):
  * 'cyclic_poisson' (BandMF paper Alg. 2, Poisson variant, docs/papers.md#bandmf): with `bands` = p
    the data is split into p fixed parts; a user of part j can only join rounds j, j + p, ...
    and joins each independently with probability `sampling_prob`. The offset j is not random, so
    epsilon is the worst over offsets. p = 1 is plain Poisson sampling.
  * 'min_sep' (b-min-sep with Poisson-like participation, docs/papers.md#mc-accounting): with
    `min_sep` = b, a user is eligible in round t unless it participated in one of the rounds
    t - b + 1 .. t - 1; an eligible user participates independently with probability
    `sampling_prob`. So any two participations r1 < r2 satisfy r2 - r1 >= b (TF-Privacy's
    min_separation = b - 1), and b = 1 is Poisson sampling.
  * 'balls_in_bins' (random allocation, docs/papers.md#mc-accounting): with `bands` = b, the n
    rounds form k = n / b epochs of b rounds (b must divide n); a user participates in exactly one
    uniformly random round of each epoch, independently across epochs. `sampling_prob` must be None
    (it is 1 / b).

Exact inner expectation E_S (computed for every sample, in log space):
  * 'per_round' (cyclic_poisson with C's number of bands <= p): the columns of the rounds one user
    can join have disjoint supports, so y's projections t_i = <y, C_i> / (sigma ||C_i||) are
    independent and L = sum_i log(1 - q + q exp(mu_i t_i - mu_i^2 / 2)), mu_i = ||C_i|| / sigma: the
    composition of Poisson-subsampled Gaussians of sensitivities ||C_i|| (BandMF paper Thm. 4-5,
    valid for adaptive queries and any banded C, so non-negativity is not needed here). One run
    covers all offsets: the i-th largest column norm is replaced by its maximum over the offsets,
    which dominates every offset (a smaller sensitivity is a post-processing of a larger one).
  * 'markov' (min_sep with bands <= b): participations are >= b apart, so their columns are
    orthogonal and the exponent is sum_{i in S} a_i with a_i = (C^T y)_i / sigma^2 - ||C_i||^2 /
    (2 sigma^2). The participation process is a Markov chain, so F_t = E[exp(sum_{i in S, i >= t}
    a_i) | eligible at t] obeys F_t = (1 - q) F_{t+1} + q e^{a_t} F_{t+b}, F_{>= n} = 1, and
    L = log F_0 (O(n) per sample).
  * 'per_epoch' (balls_in_bins with a diagonal C): L = sum_epochs log((1 / b) sum_{i in epoch}
    e^{a_i}).
  * 'enumeration' (any other case): the sum over every pattern S with its probability,
    log sum_S p_S exp(<y, C u_S> / sigma^2 - ||C u_S||^2 / (2 sigma^2)), when there are at most
    `max_patterns` of them (cyclic_poisson: 2^k per offset, each offset a separate run).
Beyond that no exact inner expectation is implemented: the function raises ValueError rather than
approximate (MMCC's conditional composition, docs/papers.md#mc-accounting, would give a bound; it is
not implemented here).
All mixture-of-Gaussians paths ('markov', 'per_epoch', 'enumeration') require C >= 0 entrywise.

Cost: 'per_round' O(N k), 'markov' and 'per_epoch' O(N nnz(C)) (sparse C^T y), 'enumeration'
O(N n P); samples are processed in chunks of 2^23 / n (rounds-major (n, chunk) arrays).
"""

import dataclasses
import math
from typing import Optional, Tuple, Union

import numpy as np
import scipy.optimize
import scipy.sparse
import scipy.special

from dp_ftrl_tff import _validation, stopping
from dp_ftrl_tff.accounting import monte_carlo_schemes
from dp_ftrl_tff.mechanisms import base

SAMPLINGS = ('cyclic_poisson', 'min_sep', 'balls_in_bins')

#: Entries of a (rounds x samples) block processed at once (64 MB of float64).
_CHUNK_ENTRIES = 2**23


@dataclasses.dataclass(frozen=True)
class MonteCarloEpsilon:
  """A Monte Carlo epsilon at `delta` with its confidence interval.

  Attributes:
    epsilon: the point estimate (the empirical delta(eps) meets `delta`).
    epsilon_lower: lower confidence bound.
    epsilon_upper: upper confidence bound (inf when `num_samples` is too small for `delta`); the
      number to report.
    delta: the target delta.
    confidence: [epsilon_lower, epsilon_upper] holds with at least this probability.
    num_samples: samples per direction (and per offset for a 'cyclic_poisson' enumeration).
    sampling: the sampling scheme.
    method: how the inner expectation was computed: 'per_round', 'markov', 'per_epoch' or
      'enumeration' (see the module docstring).
  """
  epsilon: float
  epsilon_lower: float
  epsilon_upper: float
  delta: float
  confidence: float
  num_samples: int
  sampling: str
  method: str


# --------------------------------------------------------------------------------------------------
# Privacy-loss samples.


def _num_bands(c: np.ndarray) -> int:
  """1 + the largest t - s with C[t, s] != 0 (structural bandwidth; 1 for a diagonal C)."""
  rows, cols = np.nonzero(c)
  return int(np.max(rows - cols)) + 1 if rows.size else 1


def _chunks(num_samples: int, num_rounds: int):
  size = max(1, _CHUNK_ENTRIES // max(num_rounds, 1))
  for start in range(0, num_samples, size):
    stopping.check()  # each chunk of samples is a stop point (dp_ftrl_tff.stopping)
    yield min(size, num_samples - start)


def _mixture_losses(c: np.ndarray, sigma: float, scheme: monte_carlo_schemes.Scheme, method: str,
                    rng: np.random.Generator, num_samples: int, remove: bool) -> np.ndarray:
  """Samples of L(y) for y ~ P (remove=True) or y ~ Q, with the 'markov' / 'per_epoch' (additive)
  or 'enumeration' inner expectation."""
  n = c.shape[0]
  sparse_c = scipy.sparse.csr_matrix(c)
  if method == 'enumeration':
    u_all, log_p = scheme.patterns()
    means = u_all @ c.T  # (P, n): row S is C u_S
    offsets = (log_p - np.sum(means**2, axis=1) / (2 * sigma**2))[:, None]
  else:
    half_norms = (np.sum(c**2, axis=0) / (2 * sigma**2))[:, None]
    sparse_c_t = scipy.sparse.csr_matrix(c.T)
  losses = []
  for count in _chunks(num_samples, n):
    y = rng.standard_normal((n, count))  # one output y per column
    y *= sigma
    if remove:
      y += sparse_c @ scheme.sample(rng, count)
    if method == 'enumeration':
      losses.append(scipy.special.logsumexp(means @ y / sigma**2 + offsets, axis=0))
    else:
      a = sparse_c_t @ y
      a *= 1.0 / sigma**2
      a -= half_norms
      losses.append(scheme.log_expectation_additive(a))
  return np.concatenate(losses)


def _dominating_column_norms(c: np.ndarray, period: int) -> np.ndarray:
  """For each rank i, the largest i-th biggest column norm over the offsets of `period`."""
  norms = np.sqrt(np.sum(c**2, axis=0))
  k = -(-c.shape[0] // period)
  ranked = np.zeros((period, k))
  for offset in range(period):
    column = np.sort(norms[offset::period])[::-1]
    ranked[offset, :column.size] = column
  return ranked.max(axis=0)


def _per_round_losses(norms: np.ndarray, sigma: float, q: float, rng: np.random.Generator,
                      num_samples: int, remove: bool) -> np.ndarray:
  """Samples of sum_i log(1 - q + q exp(mu_i t_i - mu_i^2 / 2)), t_i ~ N(mu_i B_i, 1) with
  B_i ~ Bernoulli(q) (remove) or B_i = 0 (add), mu_i = norms_i / sigma."""
  mu = norms / sigma
  losses = []
  for count in _chunks(num_samples, mu.size):
    x = rng.standard_normal((count, mu.size))  # t_i, then (in place) mu_i t_i - mu_i^2 / 2
    if remove:
      samples, rounds = np.nonzero(rng.random((count, mu.size)) < q)
      x[samples, rounds] += mu[rounds]
    x *= mu
    x -= mu**2 / 2
    losses.append(np.sum(monte_carlo_schemes.log_bernoulli_mgf(x, q), axis=1))
  return np.concatenate(losses)


# --------------------------------------------------------------------------------------------------
# From loss samples to epsilon with confidence (Chernoff-Hoeffding, Hoeffding 1963 Thm. 1).


def _kl_bernoulli(p: float, q: float) -> float:
  """KL(Bernoulli(p) || Bernoulli(q)) in nats, 0 log 0 = 0."""
  return float(scipy.special.rel_entr(p, q) + scipy.special.rel_entr(1 - p, 1 - q))


def _upper_mean_threshold(delta: float, num_samples: int, log_inv_beta: float) -> Optional[float]:
  """The largest empirical mean m whose upper confidence bound is <= delta: m <= delta and
  N KL(m || delta) >= log(1/beta). None when even m = 0 does not qualify."""
  if num_samples * _kl_bernoulli(0.0, delta) < log_inv_beta:
    return None
  root = scipy.optimize.brentq(lambda m: num_samples * _kl_bernoulli(m, delta) - log_inv_beta,
                               0.0, delta, xtol=1e-16 * delta, rtol=1e-12)
  return float(root) * (1.0 - 1e-9)  # below the root: brentq's tolerance must not loosen the bound


def _lower_mean_threshold(delta: float, num_samples: int, log_inv_beta: float) -> float:
  """The largest empirical mean m whose lower confidence bound is <= delta: m <= delta, or m > delta
  with N KL(m || delta) <= log(1/beta)."""
  if num_samples * _kl_bernoulli(1.0, delta) <= log_inv_beta:
    return 1.0
  return float(scipy.optimize.brentq(
      lambda m: num_samples * _kl_bernoulli(m, delta) - log_inv_beta, delta, 1.0, rtol=1e-12))


def _empirical_delta(losses: np.ndarray, epsilon: float) -> float:
  """Mean of (1 - exp(eps - L))_+ over the samples."""
  above = losses[losses > epsilon]
  return float(-np.sum(np.expm1(epsilon - above)) / losses.size)


def _epsilon_at(losses: np.ndarray, threshold: Optional[float], upper: bool) -> float:
  """min{eps >= 0 : empirical delta(eps) <= threshold}; the bracket end on the side of `upper`."""
  if threshold is None:
    return math.inf
  if _empirical_delta(losses, 0.0) <= threshold:
    return 0.0
  low, high = 0.0, float(np.max(losses))  # delta(high) = 0 <= threshold
  while high - low > 1e-9 * (1.0 + high):
    middle = 0.5 * (low + high)
    if _empirical_delta(losses, middle) <= threshold:
      high = middle
    else:
      low = middle
  return high if upper else low


def _epsilons(losses: np.ndarray, delta: float, beta: float) -> Tuple[float, float, float]:
  """(estimate, lower, upper) epsilon of one direction's loss samples, each bound at level beta."""
  n, log_inv_beta = losses.size, math.log(1.0 / beta)
  return (_epsilon_at(losses, delta, upper=True),
          _epsilon_at(losses, _lower_mean_threshold(delta, n, log_inv_beta), upper=False),
          _epsilon_at(losses, _upper_mean_threshold(delta, n, log_inv_beta), upper=True))


# --------------------------------------------------------------------------------------------------
# Public entry point.


def _strategy_matrix(strategy, num_rounds) -> np.ndarray:
  if isinstance(strategy, base.Strategy):
    if num_rounds is None:
      raise ValueError('`num_rounds` is required when `strategy` is a Strategy.')
    c = strategy.strategy_matrix(strategy.check_num_rounds(num_rounds))
  else:
    c = _validation.check_float_array(strategy, 'strategy', ndim=2)
    if num_rounds is not None and num_rounds != c.shape[0]:
      raise ValueError(f'`num_rounds`={num_rounds!r} differs from the {c.shape[0]} rows of '
                       f'`strategy`.')
  if c.shape[0] != c.shape[1]:
    raise ValueError(f'`strategy` must have a square lower-triangular strategy matrix, got shape '
                     f'{c.shape} (tree strategies release r != n nodes).')
  if np.any(np.triu(c, 1) != 0):
    raise ValueError('`strategy` must have a lower-triangular strategy matrix.')
  return np.asarray(c, dtype=np.float64)


def _scheme_settings(sampling, sampling_prob, bands, min_sep, num_rounds):
  """Validates the scheme's parameters; returns (q or None, period or b)."""
  _validation.check_one_of(sampling, 'sampling', SAMPLINGS)
  uses = {'cyclic_poisson': 'bands', 'min_sep': 'min_sep', 'balls_in_bins': 'bands'}[sampling]
  given = {'bands': bands, 'min_sep': min_sep}
  for name, value in given.items():
    if name != uses and value is not None:
      raise ValueError(f'`{name}` does not apply to sampling={sampling!r} (it uses `{uses}`).')
  size = _validation.check_positive_int(given[uses], uses)
  if sampling == 'balls_in_bins':
    if sampling_prob is not None:
      raise ValueError("`sampling_prob` must be None for sampling='balls_in_bins' (it is "
                       '1 / bands).')
    if num_rounds % size:
      raise ValueError(f'`bands`={size} must divide the number of rounds {num_rounds} for '
                       f"sampling='balls_in_bins'.")
    return None, size
  q = _validation.check_float_in_range(sampling_prob, 'sampling_prob', 0.0, 1.0,
                                       low_inclusive=False)
  return q, size


def monte_carlo_epsilon(strategy: Union[base.Strategy, np.ndarray], noise_multiplier: float, *,
                        sampling: str, sampling_prob: Optional[float] = None, delta: float,
                        num_samples: int, seed: Optional[int], bands: Optional[int] = None,
                        min_sep: Optional[int] = None, num_rounds: Optional[int] = None,
                        confidence: float = 0.99,
                        max_patterns: int = 4096) -> MonteCarloEpsilon:
  """Monte Carlo epsilon at `delta` of C x + sigma z under random participation (module docstring).

  Args:
    strategy: a `mechanisms` Strategy with a square strategy matrix (with `num_rounds`), or a
      lower-triangular n x n numpy matrix C.
    noise_multiplier: sigma, relative to the clip norm (noise std sigma on C x with clip norm 1).
    sampling: one of `SAMPLINGS`.
    sampling_prob: q in (0, 1] for 'cyclic_poisson' and 'min_sep'; None for 'balls_in_bins'.
    delta: in (0, 1).
    num_samples: privacy-loss samples per direction (per offset for a cyclic enumeration).
    seed: seed of numpy's generator; None draws from OS entropy.
    bands: the period p of 'cyclic_poisson' or the epoch length of 'balls_in_bins'.
    min_sep: b of 'min_sep' (r2 - r1 >= b; TF-Privacy's min_separation = b - 1).
    num_rounds: n, required with a Strategy.
    confidence: probability that [epsilon_lower, epsilon_upper] holds, in (0, 1).
    max_patterns: the largest pattern count the 'enumeration' method accepts.

  Returns:
    `MonteCarloEpsilon`; report `epsilon_upper`.

  Raises:
    ValueError: naming the bad parameter, or when no exact inner expectation applies (see the
      module docstring) or a mixture-of-Gaussians path meets a C with negative entries.
  """
  c = _strategy_matrix(strategy, num_rounds)
  n = c.shape[0]
  sigma = _validation.check_positive_float(noise_multiplier, 'noise_multiplier')
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                           high_inclusive=False)
  num_samples = _validation.check_positive_int(num_samples, 'num_samples')
  if seed is not None:
    seed = _validation.check_nonnegative_int(seed, 'seed')
  confidence = _validation.check_float_in_range(confidence, 'confidence', 0.0, 1.0,
                                                low_inclusive=False, high_inclusive=False)
  max_patterns = _validation.check_positive_int(max_patterns, 'max_patterns')
  q, size = _scheme_settings(sampling, sampling_prob, bands, min_sep, n)
  runs, beta, method = _loss_runs(c, sigma, sampling, q, size, np.random.default_rng(seed),
                                  num_samples, confidence, max_patterns)
  estimates, lowers, uppers = [], [], []
  for remove_losses, add_losses in runs:
    for losses in (remove_losses, -add_losses):
      estimate, lower, upper = _epsilons(losses, delta, beta)
      estimates.append(estimate)
      lowers.append(lower)
      uppers.append(upper)
  return MonteCarloEpsilon(epsilon=max(estimates), epsilon_lower=max(lowers),
                           epsilon_upper=max(uppers), delta=delta, confidence=confidence,
                           num_samples=num_samples, sampling=sampling, method=method)


def _loss_runs(c: np.ndarray, sigma: float, sampling: str, q: Optional[float], size: int,
               rng: np.random.Generator, num_samples: int, confidence: float,
               max_patterns: int) -> Tuple[list, float, str]:
  """([[remove losses, add losses] per run], beta of each one-sided bound, method) of checked
  arguments; one run, or one per offset of a cyclic enumeration."""
  n, num_bands = c.shape[0], _num_bands(c)
  if sampling == 'cyclic_poisson' and num_bands <= size:
    norms = _dominating_column_norms(c, size)
    return ([[_per_round_losses(norms, sigma, q, rng, num_samples, remove)
              for remove in (True, False)]], (1.0 - confidence) / 4, 'per_round')
  if np.any(c < 0):
    raise ValueError('`strategy` must be non-negative for the mixture-of-Gaussians dominating '
                     f'pair used with sampling={sampling!r} (C has negative entries).')
  if sampling == 'cyclic_poisson':
    schemes = [monte_carlo_schemes.CyclicPoisson(n, size, offset, q)
               for offset in range(min(size, n))]
  elif sampling == 'min_sep':
    schemes = [monte_carlo_schemes.MinSepPoisson(n, size, q)]
  else:
    schemes = [monte_carlo_schemes.BallsInBins(n, size)]
  if num_bands <= schemes[0].max_orthogonal_bands:
    method = 'markov' if sampling == 'min_sep' else 'per_epoch'
  else:
    method = 'enumeration'
    count = max(scheme.num_patterns() for scheme in schemes)
    if count > max_patterns:
      raise ValueError(
          f'No exact inner expectation for sampling={sampling!r} with a C of {num_bands} bands: '
          f'{count} participation patterns exceed `max_patterns`={max_patterns} (the structured '
          f'methods need at most {schemes[0].max_orthogonal_bands} bands).')
  runs = [[_mixture_losses(c, sigma, scheme, method, rng, num_samples, remove)
           for remove in (True, False)] for scheme in schemes]
  return runs, (1.0 - confidence) / (4 * len(schemes)), method
