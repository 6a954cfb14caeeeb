"""Tests for `dp_ftrl_tff.accounting.monte_carlo` against independent computations.

References: dp_accounting's PLD of composed Poisson-subsampled Gaussians (C = I, and banded C with
cyclic Poisson, BandMF paper Thm. 4, docs/papers.md#bandmf), the Gaussian mechanism (full
participation), and for n = 2 the exact delta(eps) of the mixture of Gaussians by numerical
integration over every participation pattern. Each check asserts that the Monte Carlo confidence
interval (probability >= 0.99 by the Chernoff-Hoeffding bound) holds the reference epsilon; the
seeds are fixed, so the outcome is deterministic.
"""

import itertools
import math
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
import scipy.optimize
import scipy.special

from dp_ftrl_tff.accounting import monte_carlo, monte_carlo_schemes
from dp_ftrl_tff.mechanisms import banded, gaussian, tree

pytestmark = pytest.mark.unit


def _pld_epsilon(events, delta):
  """PLD epsilon of the composition of (event, count) pairs (pessimistic discretization 1e-3: its
  epsilon error is far below the Monte Carlo interval widths asserted here)."""
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
  for event, count in events:
    accountant.compose(event, count)
  return accountant.get_epsilon(delta)


def _poisson_gaussian(q, noise_multiplier):
  return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier))


def _assert_covers(result, reference, max_width):
  assert result.epsilon_lower <= reference <= result.epsilon_upper, (result, reference)
  assert result.epsilon_lower <= result.epsilon <= result.epsilon_upper
  assert result.epsilon_upper - result.epsilon_lower < max_width, result


@pytest.mark.e2e
def test_import_does_not_load_tensorflow():
  code = ('import sys; import dp_ftrl_tff.accounting as accounting; '
          'from dp_ftrl_tff.accounting import monte_carlo; '
          'assert accounting.monte_carlo_epsilon is monte_carlo.monte_carlo_epsilon; '
          "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
  subprocess.run([sys.executable, '-c', code], check=True, timeout=120)


# --- C = identity: DP-SGD, whose PLD dp_accounting computes -------------------------------------


@pytest.mark.parametrize('sampling, kwargs, compositions, method', [
    ('cyclic_poisson', {'bands': 1}, 40, 'per_round'),
    ('min_sep', {'min_sep': 1}, 40, 'markov'),
    ('cyclic_poisson', {'bands': 4}, 10, 'per_round'),
])
def test_identity_matches_pld_of_poisson_gaussian(sampling, kwargs, compositions, method):
  q, sigma, delta = 0.1, 1.0, 1e-3
  result = monte_carlo.monte_carlo_epsilon(
      np.eye(40), sigma, sampling=sampling, sampling_prob=q, delta=delta, num_samples=100_000,
      seed=1, **kwargs)
  assert result.method == method
  reference = _pld_epsilon([(_poisson_gaussian(q, sigma), compositions)], delta)
  _assert_covers(result, reference, max_width=0.6)


def test_identity_strategy_object():
  q, sigma, delta = 0.2, 1.5, 1e-2
  result = monte_carlo.monte_carlo_epsilon(
      gaussian.GaussianStrategy(), sigma, num_rounds=20, sampling='cyclic_poisson',
      sampling_prob=q, delta=delta, num_samples=50_000, seed=2, bands=1)
  _assert_covers(result, _pld_epsilon([(_poisson_gaussian(q, sigma), 20)], delta), max_width=0.5)


def test_banded_cyclic_poisson_matches_worst_offset_pld():
  # Banded Toeplitz C with 3 bands, period 3: each offset is a composition of Poisson-subsampled
  # Gaussians with sensitivities ||C_i|| (BandMF Thm. 4-5); offset 0 has the largest norms.
  n, period, q, sigma, delta = 12, 3, 0.3, 1.0, 1e-2
  strategy = banded.BandedStrategy.from_toeplitz([1.0, 0.5, 0.375], n)
  c = strategy.strategy_matrix(n)
  norms = np.linalg.norm(c, axis=0)
  offsets = [np.unique(norms[j::period], return_counts=True) for j in range(period)]
  reference = max(_pld_epsilon([(_poisson_gaussian(q, sigma / norm), int(count))
                                for norm, count in zip(*offset, strict=True)], delta)
                  for offset in offsets)
  result = monte_carlo.monte_carlo_epsilon(
      strategy, sigma, num_rounds=n, sampling='cyclic_poisson', sampling_prob=q, delta=delta,
      num_samples=100_000, seed=3, bands=period)
  assert result.method == 'per_round'
  _assert_covers(result, reference, max_width=0.4)


# --- Full participation: the Gaussian mechanism --------------------------------------------------


def test_full_participation_min_sep_is_gaussian_of_the_pattern_norm():
  # q = 1 under min_sep b: the one pattern (0, b, 2b, ...); with bands <= b the 'markov' method.
  n, b, sigma, delta = 9, 3, 2.0, 1e-2
  strategy = banded.BandedStrategy.from_toeplitz([1.0, 0.6, 0.3], n)
  u = np.zeros(n)
  u[::b] = 1.0
  sensitivity = np.linalg.norm(strategy.strategy_matrix(n) @ u)
  reference = _pld_epsilon([(dp_accounting.GaussianDpEvent(sigma / sensitivity), 1)], delta)
  result = monte_carlo.monte_carlo_epsilon(
      strategy, sigma, num_rounds=n, sampling='min_sep', sampling_prob=1.0, delta=delta,
      num_samples=50_000, seed=4, min_sep=b)
  assert result.method == 'markov'
  _assert_covers(result, reference, max_width=0.3)


# --- n = 2: exact delta(eps) of the mixture by numerical integration -----------------------------


def _exact_epsilon(c, sigma, patterns, probabilities, delta, directions=('remove', 'add')):
  """epsilon at delta of (sum_S p_S N(C u_S, sigma^2 I), N(0, sigma^2 I)), both directions, for
  means C u_S spanning at most 2 dimensions: in an orthonormal basis of their span (the orthogonal
  complement has the same law under both and drops out), by a Riemann sum on a 2-D grid
  (spectrally accurate for these Gaussian tails; the kink of (.)_+ costs O(h^2), about 1e-5
  relative at h = 0.02)."""
  means = np.array([c @ np.asarray(u, dtype=float) for u in patterns]).T  # (n, P)
  basis = np.linalg.svd(means, full_matrices=False)[0][:, :2]
  assert np.allclose(basis @ (basis.T @ means), means), 'means span more than 2 dimensions'
  means = basis.T @ means  # (2, P)
  h = 0.02
  axis = np.arange(-8 * sigma - np.max(np.abs(means)), 8 * sigma + np.max(np.abs(means)) + h, h)
  y0, y1 = np.meshgrid(axis, axis, indexing='ij')
  null = np.exp(-(y0**2 + y1**2) / (2 * sigma**2)) / (2 * np.pi * sigma**2)
  mixture = np.zeros_like(null)
  for m, p in zip(means.T, probabilities, strict=True):
    mixture += p * np.exp(-((y0 - m[0])**2 + (y1 - m[1])**2) / (2 * sigma**2)) / (
        2 * np.pi * sigma**2)

  def delta_of(eps):
    deltas = {'remove': np.sum(np.maximum(mixture - np.exp(eps) * null, 0.0)) * h * h,
              'add': np.sum(np.maximum(null - np.exp(eps) * mixture, 0.0)) * h * h}
    return max(deltas[direction] for direction in directions)

  return scipy.optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 20.0, xtol=1e-6)


_C2 = np.array([[1.0, 0.0], [0.8, 1.0]])


@pytest.mark.parametrize('c, sampling, kwargs, patterns, probabilities, method', [
    # Poisson (min_sep 1), q = 0.4: all four subsets of the two rounds.
    (_C2, 'min_sep', {'min_sep': 1, 'sampling_prob': 0.4}, [(0, 0), (1, 0), (0, 1), (1, 1)],
     [0.36, 0.24, 0.24, 0.16], 'enumeration'),
    # The same through cyclic Poisson with period 1.
    (_C2, 'cyclic_poisson', {'bands': 1, 'sampling_prob': 0.4}, [(0, 0), (1, 0), (0, 1), (1, 1)],
     [0.36, 0.24, 0.24, 0.16], 'enumeration'),
    # min_sep 2, q = 0.5: {}, {0}, {1} with probabilities 1/4, 1/2, 1/4 (2 bands <= b: Markov).
    (_C2, 'min_sep', {'min_sep': 2, 'sampling_prob': 0.5}, [(0, 0), (1, 0), (0, 1)],
     [0.25, 0.5, 0.25], 'markov'),
    # Balls in bins, one epoch of 2 rounds; a diagonal C takes the per-epoch method.
    (_C2, 'balls_in_bins', {'bands': 2}, [(1, 0), (0, 1)], [0.5, 0.5], 'enumeration'),
    (np.diag([1.0, 0.7]), 'balls_in_bins', {'bands': 2}, [(1, 0), (0, 1)], [0.5, 0.5],
     'per_epoch'),
])
def test_small_n_matches_exact_integration(c, sampling, kwargs, patterns, probabilities, method):
  sigma, delta = 1.0, 1e-2
  reference = _exact_epsilon(c, sigma, patterns, probabilities, delta)
  result = monte_carlo.monte_carlo_epsilon(c, sigma, sampling=sampling, delta=delta,
                                           num_samples=100_000, seed=5, **kwargs)
  assert result.method == method
  _assert_covers(result, reference, max_width=0.4)


def test_each_direction_matches_exact_integration():
  # remove: y ~ mixture, loss L; add: y ~ N(0, sigma^2 I), loss -L. Checked one by one.
  q, sigma, delta = 0.4, 1.0, 1e-2
  scheme = monte_carlo_schemes.MinSepPoisson(2, 1, q)
  patterns, probabilities = [(0, 0), (1, 0), (0, 1), (1, 1)], [0.36, 0.24, 0.24, 0.16]
  for direction, remove, sign in (('remove', True, 1.0), ('add', False, -1.0)):
    reference = _exact_epsilon(_C2, sigma, patterns, probabilities, delta, (direction,))
    losses = monte_carlo._mixture_losses(_C2, sigma, scheme, 'enumeration',
                                         np.random.default_rng(11), 100_000, remove)
    estimate, lower, upper = monte_carlo._epsilons(sign * losses, delta, beta=0.005)
    assert lower <= reference <= upper, (direction, lower, reference, upper)
    assert upper - lower < 0.4


def test_cyclic_poisson_enumeration_takes_the_worst_offset():
  # n = 3, period 2, C with 3 bands (> 2): no per-round product. Offset 0 joins rounds {0, 2}
  # (4 patterns), offset 1 round {1} (2 patterns); epsilon is the larger of the two exact values.
  c = np.tril(np.full((3, 3), 0.6)) + 0.4 * np.eye(3)
  q, sigma, delta = 0.4, 1.0, 1e-2
  offset_0 = _exact_epsilon(c, sigma, [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)],
                            [(1 - q)**2, q * (1 - q), q * (1 - q), q**2], delta)
  offset_1 = _exact_epsilon(c, sigma, [(0, 0, 0), (0, 1, 0)], [1 - q, q], delta)
  assert offset_0 > offset_1
  result = monte_carlo.monte_carlo_epsilon(c, sigma, sampling='cyclic_poisson', sampling_prob=q,
                                           bands=2, delta=delta, num_samples=100_000, seed=10)
  assert result.method == 'enumeration'
  _assert_covers(result, offset_0, max_width=0.5)


# --- The structured inner expectations against brute-force enumeration ---------------------------


@pytest.mark.parametrize('scheme', [
    monte_carlo_schemes.MinSepPoisson(7, 2, 0.3),
    monte_carlo_schemes.MinSepPoisson(6, 3, 1.0),
    monte_carlo_schemes.CyclicPoisson(7, 3, 1, 0.6),
    monte_carlo_schemes.CyclicPoisson(7, 3, 0, 0.2),
    monte_carlo_schemes.BallsInBins(6, 2),
], ids=['min_sep_q03', 'min_sep_q1', 'cyclic_offset1', 'cyclic_offset0', 'balls_in_bins'])
def test_schemes_enumeration_sampling_and_additive_expectation(scheme):
  rng = np.random.default_rng(6)
  u, log_p = scheme.patterns()
  assert u.shape[0] == scheme.num_patterns()
  np.testing.assert_allclose(scipy.special.logsumexp(log_p), 0.0, atol=1e-12)
  # Brute force over all 2^n subsets: the admissible ones are exactly the enumerated ones.
  n = scheme.num_rounds
  enumerated = {tuple(row) for row in u.astype(int)}
  assert len(enumerated) == u.shape[0]
  for subset in itertools.product((0, 1), repeat=n):
    admissible = _admissible(scheme, np.flatnonzero(subset))
    assert (subset in enumerated) == bool(admissible), subset
  # Sampled pattern frequencies agree with the probabilities (5 standard deviations).
  draws = 100_000
  sampled = scheme.sample(rng, draws)
  assert sampled.shape == (n, draws)
  index = {tuple(row): i for i, row in enumerate(u.astype(int))}
  counts = np.bincount([index[tuple(row)] for row in sampled.T.astype(int)], minlength=u.shape[0])
  p = np.exp(log_p)
  assert np.all(np.abs(counts - draws * p) <= 5 * np.sqrt(draws * p * (1 - p)) + 1e-9)
  # The structured log E_S exp(sum_{i in S} a_i) equals the sum over patterns.
  a = rng.normal(scale=2.0, size=(50, n))  # 50 samples of (a_0 .. a_{n-1})
  brute = scipy.special.logsumexp(a @ u.T + log_p, axis=1)
  np.testing.assert_allclose(scheme.log_expectation_additive(a.T), brute, rtol=1e-12, atol=1e-12)


def _admissible(scheme, rounds):
  """Whether the sorted round set `rounds` is a pattern of positive probability (by definition)."""
  if isinstance(scheme, monte_carlo_schemes.MinSepPoisson):  # with q = 1 a user joins whenever eligible
    if scheme.q == 1:
      return np.array_equal(rounds, np.arange(0, scheme.num_rounds, scheme.min_sep))
    return bool(np.all(np.diff(rounds) >= scheme.min_sep))
  if isinstance(scheme, monte_carlo_schemes.CyclicPoisson):
    if scheme.q == 1:
      return set(rounds) == set(scheme.rounds)
    return set(rounds) <= set(scheme.rounds)
  per_epoch = np.bincount(rounds // scheme.epoch, minlength=scheme.num_epochs)
  return np.array_equal(per_epoch, np.ones(scheme.num_epochs))


def test_markov_losses_equal_enumeration_losses():
  # Same seed, same y: the Markov recursion and the sum over the 13 patterns agree sample by sample.
  c = banded.BandedStrategy.from_toeplitz([1.0, 0.7], 8).strategy_matrix(8)
  scheme = monte_carlo_schemes.MinSepPoisson(8, 2, 0.35)
  for remove in (True, False):
    markov = monte_carlo._mixture_losses(c, 0.8, scheme, 'markov', np.random.default_rng(7), 300,
                                         remove)
    brute = monte_carlo._mixture_losses(c, 0.8, scheme, 'enumeration', np.random.default_rng(7),
                                        300, remove)
    np.testing.assert_allclose(markov, brute, rtol=1e-10, atol=1e-10)


# --- Confidence, reproducibility, errors ---------------------------------------------------------


def test_too_few_samples_for_delta_gives_infinite_upper_bound():
  # With N samples even an all-zero sample only certifies delta >= about log(1/beta) / N.
  result = monte_carlo.monte_carlo_epsilon(np.eye(10), 1.0, sampling='cyclic_poisson',
                                           sampling_prob=0.1, delta=1e-6, num_samples=1000,
                                           seed=8, bands=1)
  assert math.isinf(result.epsilon_upper)
  assert math.isfinite(result.epsilon)


def test_same_seed_same_result():
  kwargs = dict(sampling='balls_in_bins', delta=1e-2, num_samples=2000, seed=9, bands=5)
  first = monte_carlo.monte_carlo_epsilon(np.eye(10), 1.0, **kwargs)
  assert first.method == 'per_epoch'
  assert first == monte_carlo.monte_carlo_epsilon(np.eye(10), 1.0, **kwargs)


@pytest.mark.parametrize('strategy, kwargs, message', [
    (np.eye(4), {'sampling': 'shuffle', 'bands': 1}, '`sampling`'),
    (np.eye(4), {'sampling': 'min_sep', 'min_sep': 1, 'bands': 2}, '`bands`'),
    (np.eye(4), {'sampling': 'cyclic_poisson'}, '`bands`'),
    (np.eye(4), {'sampling': 'cyclic_poisson', 'bands': 1, 'sampling_prob': 0.0},
     '`sampling_prob`'),
    (np.eye(4), {'sampling': 'balls_in_bins', 'bands': 2, 'sampling_prob': 0.5}, '`sampling_prob`'),
    (np.eye(4), {'sampling': 'balls_in_bins', 'bands': 3}, '`bands`'),
    (np.eye(4), {'sampling': 'min_sep', 'min_sep': 1, 'delta': 1.0}, '`delta`'),
    (np.eye(4), {'sampling': 'min_sep', 'min_sep': 1, 'num_samples': 0}, '`num_samples`'),
    (np.eye(4), {'sampling': 'min_sep', 'min_sep': 1, 'confidence': 1.0}, '`confidence`'),
    (np.eye(4), {'sampling': 'min_sep', 'min_sep': 1, 'seed': -1}, '`seed`'),
    (np.triu(np.ones((3, 3))), {'sampling': 'min_sep', 'min_sep': 1}, 'lower-triangular'),
    (np.tril(np.ones((3, 3))) - 2 * np.eye(3), {'sampling': 'min_sep', 'min_sep': 1},
     'non-negative'),
    (np.tril(np.ones((20, 20))), {'sampling': 'min_sep', 'min_sep': 1}, '`max_patterns`'),
    (tree.TreeStrategy('vanilla'), {'sampling': 'min_sep', 'min_sep': 1, 'num_rounds': 4},
     'square'),
    (gaussian.GaussianStrategy(), {'sampling': 'min_sep', 'min_sep': 1}, '`num_rounds`'),
    (np.eye(4), {'sampling': 'min_sep', 'min_sep': 1, 'num_rounds': 5}, '`num_rounds`'),
])
def test_errors_name_the_parameter(strategy, kwargs, message):
  arguments = dict(sampling_prob=0.5, delta=1e-3, num_samples=10, seed=0)
  arguments.update(kwargs)
  if arguments['sampling'] == 'balls_in_bins' and 'sampling_prob' not in kwargs:
    arguments['sampling_prob'] = None
  with pytest.raises(ValueError, match=message):
    monte_carlo.monte_carlo_epsilon(strategy, 1.0, **arguments)
