"""An epsilon lower bound with its confidence, and the checks every bound applies to its inputs.

Every lower bound of the auditing package (`threshold_bounds`, `one_run`, `one_run_fdp`,
`per_round`) takes two samples of scalar scores, `seen` (canaries inserted in training) and `unseen`
(canaries never inserted), with the convention that HIGHER scores mean "seen" (negate scores for
which the opposite holds), a target delta in (0, 1) and a confidence in (0, 1), and returns an
`EpsilonBound`: the bound, the confidence at which it holds, and the choice of thresholds (or
guesses) that was made on the same scores and paid for in the confidence.
"""

import dataclasses

import numpy as np

from dp_ftrl_tff import _validation


@dataclasses.dataclass(frozen=True)
class EpsilonBound:
  """A lower bound on the epsilon at `delta` of the mechanism that produced two score samples.

  With probability >= `confidence` over the scores (the mechanism's noise and the canaries), the
  mechanism is not (eps, delta)-DP for any eps < `epsilon` (for the Gaussian-DP methods, see
  `assumption`).

  Attributes:
    method: 'clopper_pearson', 'gdp_fit', 'one_run', 'one_run_fdp' or 'per_round'.
    epsilon: the bound, >= 0 (0 when nothing is certified).
    delta: the target delta.
    confidence: the probability with which the bound holds.
    threshold_choice: how the thresholds (or guesses) were chosen on the scores and what that
      costs, in words (e.g. Bonferroni over the 2000 count levels of each sample).
    assumption: what the bound assumes beyond independent canary scores, in words ('' for none).
    canaries_seen: seen scores used.
    canaries_unseen: unseen scores used.
  """
  method: str
  epsilon: float
  delta: float
  confidence: float
  threshold_choice: str
  assumption: str
  canaries_seen: int
  canaries_unseen: int

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


#: The assumption of the independent-inclusion game of the one-run papers, which our runs replace by
#: N of 2N exchangeable canaries inserted (`tests/auditing/one_run_test.py` checks the failure rate
#: on that design).
ONE_RUN_ASSUMPTION = (
    'the one-run theorems assume each canary is inserted independently with probability 1/2; a run '
    'inserts N of 2N exchangeable canaries (a uniformly random half)')

#: The assumption of the bounds that fit a Gaussian trade-off curve.
GDP_ASSUMPTION = (
    'certifies that the mechanism is not mu-GDP for smaller mu; epsilon is that of the certified '
    'mu-GDP curve at delta, a lower bound on the epsilon of a mechanism whose trade-off curve is '
    'Gaussian (as for the linear Gaussian mechanisms the accountant assumes)')


def check_scores(values, name: str) -> np.ndarray:
  """`values` as a 1-D float64 array of at least 2 finite scores; ValueError naming `name`."""
  scores = _validation.check_float_array(values, name, 1)
  if scores.size < 2:
    raise ValueError(f'`{name}` must hold at least 2 scores, got {scores.size}.')
  return scores


def check_delta(delta) -> float:
  """`delta` as a float in (0, 1); ValueError naming `delta`."""
  return _validation.check_float_in_range(delta, 'delta', 0.0, 1.0, low_inclusive=False,
                                          high_inclusive=False)


def check_confidence(confidence) -> float:
  """`confidence` as a float in (0, 1); ValueError naming `confidence`."""
  return _validation.check_float_in_range(confidence, 'confidence', 0.0, 1.0,
                                          low_inclusive=False, high_inclusive=False)


def check_bound_inputs(seen, unseen, delta, confidence) -> tuple:
  """(seen, unseen, delta, confidence) of a bound, checked: `check_scores` of each score array,
  `check_delta`, `check_confidence`."""
  return (check_scores(seen, 'seen'), check_scores(unseen, 'unseen'), check_delta(delta),
          check_confidence(confidence))
