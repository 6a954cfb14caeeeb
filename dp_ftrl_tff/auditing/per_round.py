"""Bounds from every round's score of a canary: the likelihood-ratio statistic over its rounds.

DP-FTRL's adversary sees every round's model, so a canary that takes part k times leaves k scores,
one per participation (its projections on the releases, whitened with the mechanism's noise
correlation as in `statistics`). Whitened, a seen canary's k scores are independent
N(a_j, 1) (a_j the signal of its j-th participation in noise units, e.g. mu_round each) and an
unseen canary's are N(0, 1). By Neyman-Pearson the most powerful test of the pair uses the
log-likelihood ratio, which here is a monotone function of
  s = sum_j a_j x_j / ||a||,
distributed N(||a||, 1) for seen and N(0, 1) for unseen canaries: the k rounds compose into one
score whose signal is ||a|| = sqrt(k) mu_round for equal signals, where one round's (or the final
model's) score carries at most max_j a_j. Every single-score bound (`threshold_bounds`,
`one_run`, `one_run_fdp`) is then run on the combined scores, with its own confidence and
threshold choice: the combining weights are fixed before the scores are seen, so nothing is paid
for them.

For a run, the per-round scores are those of `statistics.whitened_rounds`: canary i's projections
P_i and pattern u_i whitened with the Cholesky factor L of the noise covariance M M^T, so that
x = L^-1 P_i has independent coordinates and a = L^-1 u_i is its signal (its entries are spread
over the rounds from the first participation on, and can be negative); the run's
'all_iterates_whitened' (and, for independent noise, 'all_iterates') scores are `combined_scores`
of them, one weight row per canary. With equal weights over k columns this module also takes
simulated per-participation scores directly (`tests/auditing/per_round_test.py`).
"""

import numpy as np

from dp_ftrl_tff import _validation
from dp_ftrl_tff.auditing import bound as bound_lib
from dp_ftrl_tff.auditing import one_run, one_run_fdp, threshold_bounds

#: The single-score bounds the combined scores can be fed to.
BOUNDS = {
    'clopper_pearson': threshold_bounds.clopper_pearson_bound,
    'gdp_fit': threshold_bounds.gdp_fit_bound,
    'one_run': one_run.one_run_bound,
    'one_run_fdp': one_run_fdp.one_run_fdp_bound,
}


def combined_scores(round_scores, round_weights=None) -> np.ndarray:
  """The likelihood-ratio statistic sum_j a_j x_j / ||a|| of each canary's per-round scores.

  Args:
    round_scores: (canaries, k) array: each canary's k whitened per-round scores.
    round_weights: the signal a_j of each round in noise units (only its direction matters), fixed
      before the scores are seen: (k,) for the same signal on every canary, or (canaries, k) for
      one row per canary (e.g. `statistics.whitened_rounds`' L^-1 u for its own pattern u, whose
      entries can be negative); no row all 0. Default equal weights (sum / sqrt(k)).

  Returns:
    (canaries,) float64 scores, N(||a||, 1) for a seen canary and N(0, 1) for an unseen one when
    the per-round scores are whitened Gaussians.
  """
  scores = _validation.check_float_array(round_scores, 'round_scores', 2)
  if round_weights is None:
    return scores.sum(axis=1) / np.sqrt(scores.shape[1])
  weights = np.asarray(round_weights)
  weights = _validation.check_float_array(round_weights, 'round_weights', max(weights.ndim, 1))
  if weights.shape not in ((scores.shape[1],), scores.shape):
    raise ValueError(f'`round_weights` must have shape {(scores.shape[1],)} (one per column of '
                     f'`round_scores`) or {scores.shape} (one row per canary), got '
                     f'{weights.shape}.')
  norms = np.linalg.norm(weights, axis=-1)
  if np.any(norms == 0):
    raise ValueError('`round_weights` must not be all 0 (for any canary).')
  return np.sum(scores * weights, axis=1) / norms if weights.ndim == 2 else scores @ (
      weights / norms)


def per_round_bound(seen_rounds, unseen_rounds, delta: float, confidence: float = 0.95,
                    method: str = 'gdp_fit', round_weights=None) -> bound_lib.EpsilonBound:
  """A single-score lower bound (`method`) on the canaries' combined per-round scores.

  Args:
    seen_rounds: (N_seen, k) per-round whitened scores of the inserted canaries (at least 2).
    unseen_rounds: (N_unseen, k) the same for the never-inserted ones, scored on the same rounds.
    delta: in (0, 1).
    confidence: in (0, 1).
    method: one of `BOUNDS`.
    round_weights: see `combined_scores`; the same for both samples.

  Returns:
    The `EpsilonBound` of `method` on the combined scores, its method named
    'per_round/<method>'.
  """
  method = _validation.check_one_of(method, 'method', BOUNDS)
  seen = combined_scores(seen_rounds, round_weights)
  unseen = combined_scores(unseen_rounds, round_weights)
  if np.shape(seen_rounds)[1] != np.shape(unseen_rounds)[1]:
    raise ValueError(f'`unseen_rounds` must have as many rounds as `seen_rounds` '
                     f'({np.shape(seen_rounds)[1]}), got {np.shape(unseen_rounds)[1]}.')
  inner = BOUNDS[method](seen, unseen, delta, confidence)
  rounds = np.shape(seen_rounds)[1]
  return bound_lib.EpsilonBound(
      method=f'per_round/{method}', epsilon=inner.epsilon, delta=inner.delta,
      confidence=inner.confidence,
      threshold_choice=(f'{inner.threshold_choice}; the {rounds} rounds combined with weights '
                        'fixed in advance (no cost)'),
      assumption=inner.assumption, canaries_seen=inner.canaries_seen,
      canaries_unseen=inner.canaries_unseen)
