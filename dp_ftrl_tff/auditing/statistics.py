"""Canary scores of a run, one pair of samples (seen, unseen) per threat model.

A run inserts N "seen" canary clients: canary i has a seeded random unit direction c_i and, in every
round it takes part in, contributes exactly c_i * zeta to the round's clipped SUM (zeta the clip).
N "unseen" directions c_{N+i} are never inserted and give the null distribution. The run records
P[i, t] = <c_i, released noisy sum of round t> / zeta for i in 0 .. 2N - 1 and the 0-based rounds
t = 0 .. n - 1. For a linear Gaussian mechanism with noise matrix M (n x r, `Strategy.noise_matrix`),
the column P_i of canary i with participation pattern u (0/1 over the rounds) is
  P_i = u + sigma * M g_i + (other canaries' interference, O(sqrt(N / d))),  g_i ~ N(0, I_r),
and unseen columns lack the u. Unseen canary N + i is scored with seen canary i's pattern, so both
samples use the same patterns; a seen canary that never took part is left out together with its
unseen partner.
"""

from typing import Optional

import numpy as np
import scipy.linalg

from dp_ftrl_tff import _validation
from dp_ftrl_tff import plan as plan_lib
from dp_ftrl_tff.auditing import per_round

THREAT_MODELS = ('final_model', 'all_iterates', 'all_iterates_whitened')

THREAT_MODEL_TEXT = {
    'final_model': 'The attacker sees the final model only (the cosine of the final model delta '
                   'with the canary direction).',
    'all_iterates': "The attacker sees every round's model update, hence every release, and sums "
                    "the canary's projections over its rounds.",
    'all_iterates_whitened': "The attacker sees every release, knows the mechanism's noise "
                             "correlation and the canary's rounds, and whitens with the strategy "
                             '(the optimal test for a linear Gaussian mechanism).',
}


def _check_participation(participation, num_seen: int, num_rounds: int) -> np.ndarray:
  array = _validation.check_float_array(participation, 'participation', 2)
  if array.shape != (num_seen, num_rounds):
    raise ValueError(f'`participation` must have shape {(num_seen, num_rounds)} (seen canaries x '
                     f'rounds), got {array.shape}.')
  if not np.all((array == 0) | (array == 1)):
    raise ValueError('`participation` must hold only 0 and 1.')
  return array


def _whitening_factor(noise_matrix, num_rounds: int) -> np.ndarray:
  """The lower Cholesky factor L of M M^T (the noise covariance of one canary column / sigma^2)."""
  matrix = _validation.check_float_array(noise_matrix, 'noise_matrix', 2)
  if matrix.shape[0] != num_rounds:
    raise ValueError(f'`noise_matrix` must have {num_rounds} rows (one per round), got shape '
                     f'{matrix.shape}.')
  try:
    return scipy.linalg.cholesky(matrix @ matrix.T, lower=True)
  except np.linalg.LinAlgError:
    raise ValueError('`noise_matrix` M must have full row rank (M M^T positive definite).') from None


def _split(round_projections, participation):
  """(seen rows, unseen partner rows, patterns, took_part mask) of the seen canaries that took
  part, after checking both arrays."""
  projections = _validation.check_float_array(round_projections, 'round_projections', 2)
  num_directions, num_rounds = projections.shape
  if num_directions % 2:
    raise ValueError(f'`round_projections` must have 2N rows (N seen, N unseen), got '
                     f'{num_directions}.')
  num_seen = num_directions // 2
  patterns = _check_participation(participation, num_seen, num_rounds)
  took_part = patterns.sum(axis=1) > 0
  return (projections[:num_seen][took_part], projections[num_seen:][took_part],
          patterns[took_part], took_part)


def canary_statistics(round_projections, participation, final_cosines=None,
                      noise_matrix=None) -> dict:
  """The seen and unseen canary scores of each available threat model.

  Scores (u the 0/1 pattern of seen canary i, P_i a column of projections, W = (M M^T)^-1):
    * 'all_iterates': s = u . P_i / ||u||, the sum of the canary's rounds (optimal without noise
      correlation; its signal-to-noise is ||u||^2 / (sigma sqrt(u^T M M^T u))).
    * 'all_iterates_whitened' (with `noise_matrix`): s = u^T W P_i / sqrt(u^T W u), the
      Neyman-Pearson test of the canary's pattern for a linear Gaussian mechanism (the
      `per_round.combined_scores` of its `whitened_rounds`, weights L^-1 u), with
      signal-to-noise sqrt(u^T W u) / sigma. For a square invertible C (M = C^-1) that is
      ||C u|| / sigma, the accountant's own quantity; for a tree decoded with the pseudo-inverse too;
      for any other left inverse M of C it is <= ||C u|| / sigma (post-processing).
    * 'final_model' (with `final_cosines`): the cosines of the final model delta with the directions.

  Args:
    round_projections: (2N, n) array: P[i, t] for the seen (rows 0 .. N-1) and unseen (rows
      N .. 2N-1) directions over the 0-based rounds t.
    participation: (N, n) 0/1 array: the rounds each seen canary took part in.
    final_cosines: (2N,) array of final-model cosines (seen then unseen), or None.
    noise_matrix: M (n x r) of the run (`plan_noise_matrix`), or None for no whitened scores.

  Returns:
    {threat model: (seen_scores, unseen_scores)}, float64 arrays, in `THREAT_MODELS` order; a seen
    canary that never took part is left out of 'seen' (and, for the per-round scores, its unseen
    partner N + i out of 'unseen'); 'final_model' keeps all N unseen cosines.
  """
  seen, unseen, patterns, took_part = _split(round_projections, participation)
  num_seen, num_rounds = took_part.size, patterns.shape[1]
  num_directions = 2 * num_seen
  scores = {}
  if final_cosines is not None:
    cosines = _validation.check_float_array(final_cosines, 'final_cosines', 1)
    if cosines.shape != (num_directions,):
      raise ValueError(f'`final_cosines` must have shape {(num_directions,)}, got '
                       f'{cosines.shape}.')
    scores['final_model'] = (cosines[:num_seen][took_part], cosines[num_seen:])
  # Independent noise: the rounds are already white, the pattern is the signal.
  scores['all_iterates'] = (_combined(seen, patterns), _combined(unseen, patterns))
  if noise_matrix is not None:
    seen_rounds, unseen_rounds, signal = _whiten(seen, unseen, patterns, noise_matrix, num_rounds)
    scores['all_iterates_whitened'] = (_combined(seen_rounds, signal),
                                       _combined(unseen_rounds, signal))
  return scores


def _combined(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """`per_round.combined_scores`, and no scores when no canary took part."""
  return per_round.combined_scores(rows, weights) if rows.shape[0] else np.zeros(0)


def _whiten(seen: np.ndarray, unseen: np.ndarray, patterns: np.ndarray, noise_matrix,
            num_rounds: int):
  """(L^-1 P_seen, L^-1 P_unseen, L^-1 u) as rows, L the Cholesky factor of M M^T: two triangular
  solves per sample, no explicit inverse."""
  factor = _whitening_factor(noise_matrix, num_rounds)
  def solve(rows):
    return scipy.linalg.solve_triangular(factor, rows.T, lower=True).T
  return solve(seen), solve(unseen), solve(patterns)


def whitened_rounds(round_projections, participation, noise_matrix):
  """Each canary's per-round scores whitened with the noise correlation, and their signal.

  With L the lower Cholesky factor of M M^T, x_i = L^-1 P_i has, for a linear Gaussian mechanism,
  independent N(a_t, sigma^2) coordinates for seen canary i, a = L^-1 u_i (in units of the clip),
  and N(0, sigma^2) ones for its unseen partner: the per-round scores that `per_round` combines
  into the 'all_iterates_whitened' score (a . x / ||a||, of signal ||a|| / sigma =
  sqrt(u^T W u) / sigma). For M = I (independent noise) x = P and a = u.

  Args:
    round_projections: (2N, n) array of projections, as in `canary_statistics`.
    participation: (N, n) 0/1 array of the seen canaries' rounds.
    noise_matrix: M (n x r) of the run (`plan_noise_matrix`), or None for independent noise.

  Returns:
    (seen_rounds, unseen_rounds, signal), three (N', n) float64 arrays over the N' seen canaries
    that took part (and their unseen partners), in order.
  """
  seen, unseen, patterns, _ = _split(round_projections, participation)
  if noise_matrix is None:
    return seen, unseen, patterns
  return _whiten(seen, unseen, patterns, noise_matrix, patterns.shape[1])


def plan_noise_matrix(plan: plan_lib.RunPlan, num_rounds: int) -> Optional[np.ndarray]:
  """The n x R noise matrix of `plan` over `num_rounds` rounds, restarts included.

  Each restart starts a fresh noise segment, so the matrix is block diagonal with one
  `plan.strategy.noise_matrix(length)` per segment (`RunPlan.segment_lengths`). None when the
  strategy adds independent noise (`strategy.correlated` False: whitening changes nothing).
  """
  if not isinstance(plan, plan_lib.RunPlan):
    raise ValueError(f'`plan` must be a RunPlan, got {plan!r}.')
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if not plan.strategy.correlated:
    return None
  blocks = [plan.strategy.noise_matrix(length) for length in plan.segment_lengths(num_rounds)]
  return scipy.linalg.block_diag(*blocks)
