"""One-run f-DP auditing (Mahloujifar, Melis, Chaudhuri, "Auditing f-Differential Privacy in One
Run", ICML 2025) with the Gaussian-DP family of trade-off curves, converted to (eps, delta).

The game is that of `one_run` (m canaries ranked by score, the k+ highest guessed seen, the k-
lowest unseen: c = k+ + k- guesses, c' correct). Instead of bounding the correct guesses by a
binomial, the paper bounds them with the whole trade-off curve f of the hypothesis: if the
mechanism is f-DP in each canary, c' correct guesses or more happen with probability < tau unless
the following recursion ends with r + h <= c / m (their recursive bound, in the capped form that
jax_privacy's `CanaryScoreAuditor.epsilon_one_run_fdp` also computes):
  r = tau c' / m,  h = tau (c - c') / m;
  for i = c' - 1, c' - 2, ..., 0:
    h' = max(h, f(1 - r))      (the least mass of a wrong guess that f allows given r),
    r  = min(1, r + i (h' - h) / (c - i)),  h = h';  stop early once h' = h.
So r + h > c / m rejects "f-DP" at significance tau.

Here f = G_mu (`gdp.tradeoff`). The rejected set is an interval (0, mu_lo] (a larger mu is a weaker
claim); mu_lo is found by root finding and reported as its epsilon at delta
(`gdp.epsilon_for_delta`): the mechanism is not mu-GDP for any mu <= mu_lo, hence, if its trade-off
curve is Gaussian, its epsilon at delta is at least that (`bound.GDP_ASSUMPTION`).

Threshold choice: Bonferroni over the fixed family of guess counts of `one_run.guess_counts`
(tau = (1 - confidence) / number of pairs), as in `one_run`.
"""

from typing import Optional, Sequence, Tuple

import scipy.optimize
import scipy.special

from dp_ftrl_tff import _validation
from dp_ftrl_tff.auditing import bound as bound_lib
from dp_ftrl_tff.auditing import gdp, one_run

#: mu above this is not searched (its epsilon at any delta of interest is far beyond an audit's).
MAX_MU = 40.0


def excess_mass(mu: float, num_canaries: int, num_guesses: int, num_correct: int,
                significance: float) -> float:
  """r + h - c / m of the module's recursion for the hypothesis mu-GDP: positive rejects it.

  Arguments: mu >= 0; 0 <= num_correct <= num_guesses <= num_canaries, 1 <= num_guesses;
  significance (tau) in (0, 1).
  """
  mu = _validation.check_nonnegative_float(mu, 'mu')
  num_canaries, num_guesses, num_correct = one_run.check_game(num_canaries, num_guesses,
                                                              num_correct)
  significance = one_run.check_significance(significance)
  r = significance * num_correct / num_canaries
  h = significance * (num_guesses - num_correct) / num_canaries
  for i in range(num_correct - 1, -1, -1):
    # G_mu(1 - r) = Phi(Phi^-1(r) - mu).
    h_next = max(h, float(scipy.special.ndtr(scipy.special.ndtri(r) - mu)))
    if h_next == h:
      break  # neither r nor h changes again
    r = min(1.0, r + i * (h_next - h) / (num_guesses - i))
    h = h_next
  return r + h - num_guesses / num_canaries


def mu_for_guesses(num_canaries: int, num_guesses: int, num_correct: int, significance: float,
                   at_least: float = 0.0) -> float:
  """The largest mu in [at_least, MAX_MU] that c' = `num_correct` of c = `num_guesses` correct
  guesses reject at `significance`, or `at_least` when they do not reject mu = `at_least`."""
  one_run.check_game(num_canaries, num_guesses, num_correct)
  one_run.check_significance(significance)
  at_least = _validation.check_nonnegative_float(at_least, 'at_least')
  def excess(mu):
    return excess_mass(mu, num_canaries, num_guesses, num_correct, significance)

  # mu = 0 would make every guess a coin flip; start just above it.
  lower = max(at_least, 1e-9)
  if excess(lower) <= 0:
    return at_least
  if excess(MAX_MU) > 0:
    return MAX_MU
  return float(scipy.optimize.brentq(excess, lower, MAX_MU, xtol=1e-6))


def one_run_fdp_bound(seen, unseen, delta: float, confidence: float = 0.95,
                      guesses: Optional[Sequence[Tuple[int, int]]] = None
                      ) -> bound_lib.EpsilonBound:
  """The one-run f-DP lower bound of Mahloujifar, Melis and Chaudhuri with Gaussian-DP curves.

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite); higher means seen.
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    delta: in (0, 1).
    confidence: in (0, 1).
    guesses: the (k+, k-) pairs to try (Bonferroni over them); default `one_run.guess_counts`.

  Returns:
    The epsilon at `delta` of the largest mu-GDP curve rejected, with its threshold choice and the
    assumptions of the one-run game and of the Gaussian family.
  """
  seen, unseen, delta, confidence = bound_lib.check_bound_inputs(seen, unseen, delta, confidence)
  pairs = one_run.check_guesses(guesses, seen.size, unseen.size)
  significance = (1.0 - confidence) / len(pairs)

  # Unlike eps-DP, mu-GDP allows any precision for a few very selective guesses, so only pairs no
  # better than coin flips are skipped unseen.
  mu = one_run.best_over_guesses(seen, unseen, pairs, significance, mu_for_guesses,
                                 lambda mu: 0.5)
  return bound_lib.EpsilonBound(
      method='one_run_fdp', epsilon=gdp.epsilon_for_delta(mu, delta), delta=delta,
      confidence=confidence,
      threshold_choice=(f'Bonferroni over {len(pairs)} (k+, k-) guess counts fixed by the sample '
                        'sizes; the best pair is then taken'),
      assumption=f'{bound_lib.ONE_RUN_ASSUMPTION}; {bound_lib.GDP_ASSUMPTION}',
      canaries_seen=int(seen.size), canaries_unseen=int(unseen.size))
