"""One-run auditing (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023): a guessing game over m canaries, bounded by a binomial.

The game. Each of m canaries is inserted or not; the auditor sees the run and guesses "inserted"
for k+ canaries, "not inserted" for k- others, and abstains on the rest: r = k+ + k- guesses, of
which v are correct. Here the m = N_seen + N_unseen canaries are ranked by score: the k+ highest
are guessed seen and the k- lowest unseen.

Ties. A guess may depend on the run's output only, never on the labels it guesses: where equal
scores straddle the k+-th (or the k-th lowest) place, which of them are guessed is not determined
by the scores, and v is counted for the least favourable choice, the minimum over every order of
the tied scores (within a tie, unseen canaries rank above seen ones: the top k+ then holds the
fewest seen canaries and the bottom k- the fewest unseen). Any label-independent tie-break (e.g. a
random one) makes at least that many correct guesses, and the bound only grows with v, so the
minimum keeps the theorem's guarantee: identical samples certify 0. Continuous scores have no ties
and give the same v under every rule.

The bound (their main theorem, Sec. 3). If the mechanism is (eps, delta)-DP in each canary and the
canaries are inserted independently with probability 1/2, then with
  f(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v],
  P[v correct or more] <= f(v) + 2 m delta max_{i = 1 .. v} (f(v - i) - f(v)) / i
(for delta = 0 the number of correct guesses is dominated by the binomial; the second term is
their delta > 0 extension). An epsilon whose p-value is <= the significance is rejected; the bound
is the largest rejected epsilon, found by bracketing and root finding as their algorithm does by
binary search (the p-value increases with epsilon).

Threshold choice: Bonferroni over a fixed family of guess counts. By default the pairs are
(k, k) for k in {1, 2, 4, ...} below min(N_seen, N_unseen), and that minimum itself
(`guess_counts`): symmetric guesses, because the lowest scores tell unseen canaries as well as the
highest tell seen ones when the two samples are alike in size (on the issue's N(0, 1) / N(2, 1)
example the symmetric family certifies 4.49, k- = 0 alone 3.79, all pairs of both grids 3.56: more
pairs cost more in Bonferroni than they add). The family depends only on the sample sizes, so each
pair is tested at significance (1 - confidence) / (number of pairs) and the best pair is taken on
the same scores. (jax_privacy's `CanaryScoreAuditor` uses k- = 0 and one pair per threshold of the
data's ROC hull.)
"""

from typing import Optional, Sequence, Tuple

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

from dp_ftrl_tff import _validation
from dp_ftrl_tff.auditing import bound as bound_lib

#: Epsilons above this are not searched (e^eps / (1 + e^eps) is 1 in float64 beyond about 37).
MAX_EPSILON = 30.0


def guess_counts(num_seen: int, num_unseen: int) -> Tuple[Tuple[int, int], ...]:
  """The default family of (k+, k-) guess counts: (k, k) for k = 1, 2, 4, ... below
  min(num_seen, num_unseen), then that minimum."""
  num_seen = _validation.check_positive_int(num_seen, 'num_seen')
  num_unseen = _validation.check_positive_int(num_unseen, 'num_unseen')
  limit, counts, k = min(num_seen, num_unseen), [], 1
  while k < limit:
    counts.append(k)
    k *= 2
  return tuple((k, k) for k in counts + [limit])


def check_guesses(guesses, num_seen: int, num_unseen: int) -> Tuple[Tuple[int, int], ...]:
  """`guesses` as a tuple of (k+, k-) pairs of non-negative ints, each making between 1 and
  num_seen + num_unseen guesses (so the k+ highest and k- lowest never overlap); None gives
  `guess_counts`. ValueError naming `guesses`."""
  if guesses is None:
    return guess_counts(num_seen, num_unseen)
  try:
    pairs = tuple(tuple(pair) for pair in guesses)
  except TypeError:
    pairs = ()
  if not pairs or any(len(pair) != 2 for pair in pairs):
    raise ValueError(f'`guesses` must be a non-empty sequence of (k_plus, k_minus) pairs, got '
                     f'{guesses!r}.')
  for plus, minus in pairs:
    _validation.check_nonnegative_int(plus, 'guesses')
    _validation.check_nonnegative_int(minus, 'guesses')
    if plus + minus == 0 or plus + minus > num_seen + num_unseen:
      raise ValueError(f'`guesses` pair {(plus, minus)} must make between 1 and '
                       f'{num_seen + num_unseen} guesses (the canaries).')
  return pairs


def correct_guesses(seen, unseen, pairs) -> np.ndarray:
  """The number of correct guesses of each (k+, k-) pair: seen canaries among the k+ highest
  scores plus unseen ones among the k- lowest, the fewest over every order of tied scores (module
  docstring: within a tie, unseen rank above seen)."""
  seen = bound_lib.check_scores(seen, 'seen')
  unseen = bound_lib.check_scores(unseen, 'unseen')
  pairs = check_guesses(pairs, seen.size, unseen.size)
  scores = np.concatenate([seen, unseen])
  is_seen = np.concatenate([np.ones(seen.size), np.zeros(unseen.size)])
  # Highest score first; within a tie unseen first, the least favourable order (module docstring).
  order = np.lexsort((is_seen, -scores))
  seen_prefix = np.concatenate([[0], np.cumsum(is_seen[order])])  # seen among the top j
  m = scores.size
  counts = []
  for plus, minus in pairs:
    unseen_tail = (m - minus) - seen_prefix[m - minus]  # unseen among the top m - k-
    unseen_bottom = unseen.size - unseen_tail
    counts.append(seen_prefix[plus] + unseen_bottom)
  return np.asarray(counts, dtype=np.int64)


def check_game(num_canaries, num_guesses, num_correct) -> Tuple[int, int, int]:
  """The counts of a guessing game as ints, 0 <= num_correct <= num_guesses <= num_canaries and
  num_guesses >= 1; ValueError naming the bad one."""
  num_canaries = _validation.check_positive_int(num_canaries, 'num_canaries')
  num_guesses = _validation.check_positive_int(num_guesses, 'num_guesses')
  num_correct = _validation.check_nonnegative_int(num_correct, 'num_correct')
  if num_guesses > num_canaries:
    raise ValueError(f'`num_guesses` ({num_guesses}) must be at most `num_canaries` '
                     f'({num_canaries}).')
  if num_correct > num_guesses:
    raise ValueError(f'`num_correct` ({num_correct}) must be at most `num_guesses` '
                     f'({num_guesses}).')
  return num_canaries, num_guesses, num_correct


def check_significance(significance) -> float:
  """`significance` as a float in (0, 1); ValueError naming it."""
  return _validation.check_float_in_range(significance, 'significance', 0.0, 1.0,
                                          low_inclusive=False, high_inclusive=False)


def p_value(num_canaries: int, num_guesses: int, num_correct: int, epsilon: float,
            delta: float) -> float:
  """P[num_correct or more correct of num_guesses] for an (epsilon, delta)-DP mechanism (the
  module's bound; capped at 1). Arguments: 0 <= num_correct <= num_guesses <= num_canaries,
  1 <= num_guesses, epsilon >= 0, delta in [0, 1]."""
  num_canaries, num_guesses, num_correct = check_game(num_canaries, num_guesses, num_correct)
  epsilon = _validation.check_nonnegative_float(epsilon, 'epsilon')
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0)
  q = scipy.special.expit(epsilon)  # e^eps / (1 + e^eps), the accuracy of eps-randomized response
  with np.errstate(divide='ignore'):  # scipy's binomial tail warns (harmlessly) as q nears 1
    tail = scipy.stats.binom.sf(num_correct - 1, num_guesses, q)  # f(v)
    if delta == 0 or num_correct == 0:
      return float(min(tail, 1.0))
    steps = np.arange(1, num_correct + 1)
    # f(v - i) - f(v) = P[v - i <= Binomial < v], divided by i; its maximum over i.
    excess = (scipy.stats.binom.sf(num_correct - steps - 1, num_guesses, q) - tail) / steps
  return float(min(tail + 2 * num_canaries * delta * np.max(excess), 1.0))


def epsilon_for_guesses(num_canaries: int, num_guesses: int, num_correct: int, delta: float,
                        significance: float, at_least: float = 0.0) -> float:
  """The largest epsilon in [at_least, MAX_EPSILON] whose p-value is <= `significance`, or
  `at_least` when the p-value at `at_least` exceeds it."""
  check_game(num_canaries, num_guesses, num_correct)
  delta = _validation.check_float_in_range(delta, 'delta', 0.0, 1.0)
  significance = check_significance(significance)
  at_least = _validation.check_nonnegative_float(at_least, 'at_least')

  def slack(epsilon):
    return significance - p_value(num_canaries, num_guesses, num_correct, epsilon, delta)

  if slack(at_least) <= 0:
    return at_least
  upper = max(1.0, 2.0 * at_least)
  while slack(upper) > 0:
    if upper >= MAX_EPSILON:
      return MAX_EPSILON
    at_least, upper = upper, min(2.0 * upper, MAX_EPSILON)
  return float(scipy.optimize.brentq(slack, at_least, upper, xtol=1e-6))


def best_over_guesses(seen: np.ndarray, unseen: np.ndarray, pairs, significance: float,
                      value_fn, accuracy_fn) -> float:
  """max over `pairs` of value_fn(m, r, v, significance, at_least): the best certified value
  (epsilon here, mu in `one_run_fdp`) at `significance` per pair.

  Pairs of highest precision go first, and a pair whose precision v / r is at most
  accuracy_fn(best so far) (the accuracy of the best guess the certified value allows) is skipped:
  it cannot certify more. Skipping only saves time; it never raises the result.
  """
  pairs = check_guesses(pairs, np.size(seen), np.size(unseen))
  correct = correct_guesses(seen, unseen, pairs)
  made = np.asarray([plus + minus for plus, minus in pairs])
  significance = check_significance(significance)
  m = np.size(seen) + np.size(unseen)
  best = 0.0
  for index in np.argsort(-correct / made, kind='stable'):
    if correct[index] / made[index] <= accuracy_fn(best):
      continue
    best = max(best, value_fn(m, int(made[index]), int(correct[index]), significance, best))
  return best


def one_run_bound(seen, unseen, delta: float, confidence: float = 0.95,
                  guesses: Optional[Sequence[Tuple[int, int]]] = None) -> bound_lib.EpsilonBound:
  """The one-run (eps, delta) lower bound of Steinke, Nasr and Jagielski on two score samples.

  Args:
    seen: 1-D scores of the inserted canaries (at least 2, finite); higher means seen.
    unseen: 1-D scores of the never-inserted canaries (at least 2, finite).
    delta: in (0, 1).
    confidence: in (0, 1).
    guesses: the (k+, k-) pairs to try (Bonferroni over them); default `guess_counts`.

  Returns:
    The bound (at most `MAX_EPSILON`), with Bonferroni over the guess counts as its threshold choice
    and the independent-inclusion assumption of the theorem (`bound.ONE_RUN_ASSUMPTION`).
  """
  seen = bound_lib.check_scores(seen, 'seen')
  unseen = bound_lib.check_scores(unseen, 'unseen')
  delta = bound_lib.check_delta(delta)
  confidence = bound_lib.check_confidence(confidence)
  pairs = check_guesses(guesses, seen.size, unseen.size)
  significance = (1.0 - confidence) / len(pairs)

  def epsilon_fn(m, made, correct, level, at_least):
    return epsilon_for_guesses(m, made, correct, delta, level, at_least)

  # e^eps / (1 + e^eps) is the accuracy of a guess under eps-DP (randomized response).
  epsilon = best_over_guesses(seen, unseen, pairs, significance, epsilon_fn, scipy.special.expit)
  return bound_lib.EpsilonBound(
      method='one_run', epsilon=epsilon, delta=delta, confidence=confidence,
      threshold_choice=(f'Bonferroni over {len(pairs)} (k+, k-) guess counts fixed by the sample '
                        'sizes; the best pair is then taken'),
      assumption=bound_lib.ONE_RUN_ASSUMPTION, canaries_seen=int(seen.size),
      canaries_unseen=int(unseen.size))


def max_certifiable(num_seen: int, num_unseen: int, delta: float, confidence: float) -> float:
  """The one-run bound of perfectly separated scores (every guess right): what the canaries can
  show at most, e.g. to size an audit."""
  seen, unseen = np.ones(num_seen), np.zeros(num_unseen)
  return one_run_bound(seen, unseen, delta, confidence).epsilon

