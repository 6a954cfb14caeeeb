"""Canaries on the project's REAL streaming noise, for the auditing tests (TensorFlow).

The released sum of round t is X_t = sum over seen canaries i taking part in round t of c_i (clip 1)
+ noise_t, with noise_t the t-th value of the strategy's `StreamingNoise` on a float32 vector of
`DIMENSION` parameters, and every direction's projection P[i, t] = <c_i, X_t> is recorded.

The directions are ORTHONORMAL: c_i = D h_{r_i} / sqrt(d), with h_r the r-th row of the d x d
Walsh-Hadamard matrix (d = 2^15), r_0 .. r_{2N-1} distinct random rows and D random signs
(`Canaries`). Projections then are one fast Walsh-Hadamard transform per round, and given the noise
they carry no interference between canaries: P[i, t] = u_i[t] + <c_i, noise_t> exactly, so the
scores are exactly the Gaussians of the model in `dp_ftrl_tff.auditing.statistics`. Independent
Gaussian directions (what a training run inserts) are only nearly orthogonal: each score then gets
an extra variance of about (canaries sharing its rounds) * mu^2 / d in units of the noise, which
for N = 8000 canaries on one pattern, mu = 2 and d = 2^15 is ~1 (a much lower estimate), while
Hadamard canaries allow N up to d / 2 with none.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from dp_ftrl_tff.auditing import estimates
from dp_ftrl_tff.mechanisms import banded_optimizer, blt, registry
from dp_ftrl_tff.noise import base
from tests.testing import patterns as patterns_lib

DIMENSION = 2**15
NUM_ROUNDS = 14


def hadamard(values: np.ndarray) -> np.ndarray:
  """values @ H along the last axis (H the unnormalized d x d Walsh-Hadamard matrix, symmetric,
  H H = d I), d a power of 2: the iterative butterfly, O(d log d) per row."""
  shape = values.shape
  d = shape[-1]
  out = np.array(values, dtype=np.float64).reshape(-1, d)
  half = 1
  while half < d:
    blocks = out.reshape(-1, d // (2 * half), 2, half)
    first, second = blocks[:, :, 0, :], blocks[:, :, 1, :]
    out = np.stack((first + second, first - second), axis=2)
    half *= 2
  return out.reshape(shape)


@dataclasses.dataclass(frozen=True, eq=False)
class Canaries:
  """2N orthonormal directions c_i = signs * H[rows[i]] / sqrt(d): seen i < N, unseen i >= N."""
  signs: np.ndarray
  rows: np.ndarray

  @classmethod
  def draw(cls, num_seen: int, seed: int) -> 'Canaries':
    rng = np.random.default_rng(seed)
    return cls(signs=rng.choice([-1.0, 1.0], DIMENSION),
               rows=rng.permutation(DIMENSION)[:2 * num_seen])

  @property
  def num_seen(self) -> int:
    return self.rows.size // 2

  def directions(self, indices) -> np.ndarray:
    """(len(indices), d): the directions, explicitly (for checks on a few)."""
    unit = np.zeros((len(indices), DIMENSION))
    unit[np.arange(len(indices)), self.rows[np.asarray(indices)]] = 1.0
    return self.signs * hadamard(unit) / np.sqrt(DIMENSION)

  def seen_sums(self, participation: np.ndarray) -> np.ndarray:
    """(n, d): sum over the seen canaries taking part in each round of their directions."""
    weights = np.zeros((participation.shape[1], DIMENSION))
    weights[:, self.rows[:self.num_seen]] = participation.T
    return self.signs * hadamard(weights) / np.sqrt(DIMENSION)

  def project(self, released: np.ndarray) -> np.ndarray:
    """(2N, n): <c_i, released_t> for the (n, d) released sums."""
    return (hadamard(self.signs * released)[:, self.rows] / np.sqrt(DIMENSION)).T


def streaming_noise(strategy, stddev: float, seed: int) -> np.ndarray:
  """(n, d) float64: the strategy's TensorFlow noise stream over NUM_ROUNDS rounds (float32)."""
  noise_class = registry.noise_class(strategy.name)
  stream = noise_class.from_strategy(strategy, max_segment_rounds=NUM_ROUNDS)
  specs = {'w': tf.TensorSpec([DIMENSION], tf.float32)}
  state = stream.initial_state(specs, base.initial_seed(seed))
  rows = []
  for _ in range(NUM_ROUNDS):
    value, state = stream.next(state, tf.constant(stddev, tf.float32))
    rows.append(value['w'].numpy())
  return np.stack(rows).astype(np.float64)


def projections(canaries: Canaries, participation: np.ndarray, noise_values: np.ndarray):
  """P (2N, n): every direction's projection on the released sums (seen canaries + noise)."""
  return canaries.project(canaries.seen_sums(participation) + noise_values)


def make_strategy(name: str, schema):
  """The strategies of the tests: the registry defaults, a 4-band Toeplitz optimized for `schema`
  over NUM_ROUNDS ('banded') and the reference BLT ('blt')."""
  if name == 'banded':
    return banded_optimizer.optimize_banded(NUM_ROUNDS, 4, schema, toeplitz=True).strategy
  if name == 'blt':
    return blt.REFERENCE_STRATEGY
  return registry.default_strategy(name)


def worst_pattern(strategy, schema, noise_matrix) -> np.ndarray:
  """The schema's worst-case pattern u (maximizing ||C u||, the accountant's sensitivity; brute
  force), ties broken by the whitened signal sqrt(u^T (M M^T)^-1 u) (the attacker's best canary;
  `noise_matrix` None: independent noise, M = I)."""
  c = strategy.strategy_matrix(NUM_ROUNDS)
  covariance = np.eye(NUM_ROUNDS) if noise_matrix is None else noise_matrix @ noise_matrix.T
  best_key, best = None, None
  for pattern in patterns_lib.patterns(schema, NUM_ROUNDS):
    u = np.zeros(NUM_ROUNDS)
    u[list(pattern)] = 1.0
    key = (round(float(np.sum((c @ u)**2)), 9), float(u @ np.linalg.solve(covariance, u)))
    if best_key is None or key > best_key:
      best_key, best = key, u
  assert best_key[0] == pytest.approx(strategy.sensitivity_squared(NUM_ROUNDS, schema), rel=1e-9)
  return best


def one_shot_band(mu: float, num: int, delta: float, seed: int, simulations: int = 2000):
  """The 0.1% and 99.9% quantiles of `estimates.estimate_epsilon` on `num` draws of N(mu, 1) vs as
  many of N(0, 1) (the exact model of the scores, scale-free), over `simulations` draws."""
  rng = np.random.default_rng(seed)
  values = [estimates.estimate_epsilon(rng.normal(mu, 1.0, num), rng.normal(0.0, 1.0, num), delta)
            for _ in range(simulations)]
  return tuple(np.quantile(values, (0.001, 0.999)))
