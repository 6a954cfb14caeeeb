"""Every mechanism goes through the same auditing path: its plan's noise matrix whitens the canary
projections into independent per-round scores, and their combination has the predicted law.

Unit level, dense matrix math: for each mechanism (Gaussian, tree, banded, BLT), with and without a
restart, and each way canaries are drawn (min-sep patterns of the schema, Poisson and cyclic Poisson
rounds), N = 4000 seen canaries have projections P_i = u_i + sigma M g_i and their unseen partners
sigma M g'_i (M = `plan_noise_matrix`, block diagonal over the restart's segments; M = I for
Gaussian; g ~ N(0, I_r)), which is the noise of the mechanism's actual correlation. The theory
(`statistics.whitened_rounds`, `per_round`): with L the Cholesky factor of M M^T,
  * the per-round scores x = L^-1 P are u's signal a = L^-1 u plus sigma times independent standard
    normals, for seen and unseen canaries alike: their residuals' sample covariance / sigma^2 is I;
  * the combined score a . x / ||a|| is N(||a||, sigma^2) for seen, N(0, sigma^2) for unseen;
  * ||a||^2 = u^T (M M^T)^-1 u equals ||C u||^2 for a square strategy (Gaussian, banded, BLT: the
    accountant's own quantity) and is at most that for the tree (its decoder is a left inverse of C),
    and on b-min-sep patterns at most the sensitivity^2 of their schema (k = 3 for 'min_sep',
    ceil(n / b) for cyclic Poisson; with the restart, that of the segments): a whitened audit never
    shows more than the accountant counts.
Tolerances are sampling errors: a sample mean of N standard normals has sd 1 / sqrt(N), a sample
variance (or a covariance entry's diagonal) sqrt(2 / N), an off-diagonal entry 1 / sqrt(N); each
check allows 5.5 of those (a false failure below 4e-8 per entry).
"""

import numpy as np
import pytest
import scipy.linalg

from dp_ftrl_tff import auditing
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.auditing import per_round
from dp_ftrl_tff.mechanisms import banded_optimizer, blt, registry
from dp_ftrl_tff.mechanisms import participation as participation_lib
from dp_ftrl_tff.settings import RestartSchedule

pytestmark = pytest.mark.unit

NUM_ROUNDS, NUM_CANARIES, SIGMA = 14, 4000, 0.7
SCHEMA = participation_lib.ParticipationSchema.b_min_sep(4, 3)
SAMPLING_PROB = 0.3
TOLERANCE = 5.5  # sampling standard errors


def _strategy(name):
  if name == 'banded':
    return banded_optimizer.optimize_banded(NUM_ROUNDS, 4, SCHEMA, toeplitz=True).strategy
  if name == 'blt':
    return blt.REFERENCE_STRATEGY
  return registry.default_strategy(name)


def _patterns(sampler: str, rng) -> np.ndarray:
  """(N, n) 0/1 patterns, each with at least one round.

  'min_sep': admissible under SCHEMA (start in [0, b), gaps in [b, b + 3], at most k);
  'poisson': every round with probability q; 'cyclic_poisson': rounds t = g mod b of a random group
  g, each with probability q (b-min-sep by construction)."""
  b, k = SCHEMA.min_sep, SCHEMA.max_participations
  patterns = np.zeros((NUM_CANARIES, NUM_ROUNDS))
  for pattern in patterns:
    if sampler == 'min_sep':
      t = rng.integers(b)
      for _ in range(k):
        if t >= NUM_ROUNDS:
          break
        pattern[t] = 1.0
        t += rng.integers(b, b + 4)
    elif sampler == 'poisson':
      pattern[:] = rng.random(NUM_ROUNDS) < SAMPLING_PROB
    else:
      rounds = np.arange(rng.integers(b), NUM_ROUNDS, b)
      pattern[rounds] = rng.random(rounds.size) < SAMPLING_PROB
    if not pattern.any():
      pattern[rng.integers(NUM_ROUNDS)] = 1.0
  return patterns


def _strategy_matrix(plan) -> np.ndarray:
  """C of the plan over NUM_ROUNDS: block diagonal over the restart's segments."""
  return scipy.linalg.block_diag(*[plan.strategy.strategy_matrix(length)
                                   for length in plan.segment_lengths(NUM_ROUNDS)])


def _check_standard_normal(values: np.ndarray, what: str):
  n = values.size
  assert abs(values.mean()) <= TOLERANCE / np.sqrt(n), what
  assert abs(values.var() - 1) <= TOLERANCE * np.sqrt(2 / n), what


MECHANISMS = ('gaussian', 'tree', 'banded', 'blt')
SAMPLERS = ('min_sep', 'poisson', 'cyclic_poisson')


@pytest.mark.parametrize('restart', [False, True])
@pytest.mark.parametrize('sampler', SAMPLERS)
@pytest.mark.parametrize('name', MECHANISMS)
def test_whitened_scores_have_the_predicted_law(name, sampler, restart):
  rng = np.random.default_rng((MECHANISMS.index(name), SAMPLERS.index(sampler), int(restart)))
  plan = plan_lib.RunPlan.for_accounting(
      _strategy(name), SIGMA, num_rounds=NUM_ROUNDS, participation=SCHEMA,
      restarts=RestartSchedule.at((7,) if restart else ()))
  matrix = auditing.plan_noise_matrix(plan, NUM_ROUNDS)
  assert (matrix is None) == (name == 'gaussian')
  dense = np.eye(NUM_ROUNDS) if matrix is None else matrix
  patterns = _patterns(sampler, rng)
  projections = SIGMA * rng.standard_normal((2 * NUM_CANARIES, dense.shape[1])) @ dense.T
  projections[:NUM_CANARIES] += patterns

  seen, unseen, signal = auditing.whitened_rounds(projections, patterns, matrix)
  assert seen.shape == unseen.shape == signal.shape == (NUM_CANARIES, NUM_ROUNDS)
  # Per-round residuals: independent N(0, sigma^2) in every round, seen and unseen alike.
  residuals = np.concatenate([seen - signal, unseen]) / SIGMA
  samples = residuals.shape[0]
  assert np.max(np.abs(residuals.mean(axis=0))) <= TOLERANCE / np.sqrt(samples)
  covariance = residuals.T @ residuals / samples
  off_diagonal = covariance - np.diag(np.diag(covariance))
  assert np.max(np.abs(np.diag(covariance) - 1)) <= TOLERANCE * np.sqrt(2 / samples)
  assert np.max(np.abs(off_diagonal)) <= TOLERANCE / np.sqrt(samples)

  # The combined (likelihood-ratio) scores: N(||a||, sigma^2) seen, N(0, sigma^2) unseen; they are
  # the run's per-round row.
  norms = np.linalg.norm(signal, axis=1)
  seen_scores = per_round.combined_scores(seen, signal)
  unseen_scores = per_round.combined_scores(unseen, signal)
  _check_standard_normal((seen_scores - norms) / SIGMA, 'seen')
  _check_standard_normal(unseen_scores / SIGMA, 'unseen')
  row = 'all_iterates' if matrix is None else 'all_iterates_whitened'
  scores = auditing.canary_statistics(projections, patterns, noise_matrix=matrix)[row]
  np.testing.assert_allclose(scores[0], seen_scores, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(scores[1], unseen_scores, rtol=1e-12, atol=1e-12)

  # The signal is the accountant's ||C u|| (square C) or at most it (the tree's left inverse).
  c = _strategy_matrix(plan)
  accountant = np.sum((patterns @ c.T)**2, axis=1)
  np.testing.assert_allclose(norms**2, np.sum(np.linalg.solve(
      dense @ dense.T, patterns.T) * patterns.T, axis=0), rtol=1e-9)
  if c.shape[0] == NUM_ROUNDS:
    np.testing.assert_allclose(norms**2, accountant, rtol=1e-9)
  else:
    assert np.all(norms**2 <= accountant * (1 + 1e-9))
  if sampler != 'poisson':  # these patterns are b-min-sep (cyclic Poisson: up to ceil(n / b) times)
    schema = (SCHEMA if sampler == 'min_sep' else
              participation_lib.ParticipationSchema.b_min_sep(SCHEMA.min_sep))
    sens_sq = plan.strategy.segments_sensitivity_squared(plan.segment_lengths(NUM_ROUNDS), schema)
    assert np.max(norms**2) <= sens_sq * (1 + 1e-9)
