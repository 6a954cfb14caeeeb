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

This is `statistics`' 'all_iterates_whitened' score seen from the bounds' side: it takes the
per-round scores themselves (k per canary), so that a simulation or a run with a known signal per
participation can compare it with a single-round audit on the same canaries
(`tests/auditing/per_round_test.py`).
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
    round_scores: (canaries, k) array: each canary's k whitened per-participation scores.
    round_weights: (k,) signal a_j of each participation in noise units (only its direction
      matters), all >= 0 and not all 0; default equal weights (sum / sqrt(k)).

  Returns:
    (canaries,) float64 scores, N(||a||, 1) for a seen canary and N(0, 1) for an unseen one when
    the per-round scores are whitened Gaussians.
  """
  scores = _validation.check_float_array(round_scores, 'round_scores', 2)
  rounds = scores.shape[1]
  if round_weights is None:
    weights = np.ones(rounds)
  else:
    weights = _validation.check_float_array(round_weights, 'round_weights', 1)
    if weights.shape != (rounds,):
      raise ValueError(f'`round_weights` must have shape {(rounds,)} (one per column of '
                       f'`round_scores`), got {weights.shape}.')
    if np.any(weights < 0) or not np.any(weights > 0):
      raise ValueError('`round_weights` must be >= 0 and not all 0.')
  return scores @ (weights / np.linalg.norm(weights))


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
