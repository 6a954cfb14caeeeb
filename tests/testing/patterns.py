"""Brute-force participation patterns of a `ParticipationSchema`, for tests on small n.

Exponential in the number of rounds: the independent reference the sensitivity tests compare the
closed forms and dynamic programs against (n <= ~20).
"""

import itertools
import numbers
from typing import Iterator, Tuple

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms.participation import ParticipationSchema


def patterns(schema: ParticipationSchema, num_rounds: int) -> Iterator[Tuple[int, ...]]:
  """Yields every maximal admissible participation pattern (sorted round indices).

  Brute force, exponential in `num_rounds`: meant for tests and small n (n <= ~20). Non-maximal
  patterns are subsets of the ones yielded; for the sensitivity of a C with non-negative C^T C they
  never matter, but `all_patterns` yields them too for signed cases.
  """
  yield from (p for p in all_patterns(schema, num_rounds) if _is_maximal(schema, p, num_rounds))


def all_patterns(schema: ParticipationSchema, num_rounds: int) -> Iterator[Tuple[int, ...]]:
  """Yields every non-empty admissible participation pattern. Brute force; for tests."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  k = schema.effective_max_participations(num_rounds)
  if schema.fixed_epoch:
    for offset in range(min(schema.min_sep, num_rounds)):
      rounds = tuple(offset + i * schema.min_sep for i in range(k)
                     if offset + i * schema.min_sep < num_rounds)
      for size in range(1, len(rounds) + 1):
        yield from itertools.combinations(rounds, size)  # subsets of an epoch-aligned pattern
    return
  for size in range(1, k + 1):
    for pattern in itertools.combinations(range(num_rounds), size):
      if all(b - a >= schema.min_sep for a, b in zip(pattern, pattern[1:], strict=False)):
        yield pattern


def admits(schema: ParticipationSchema, pattern, num_rounds: int) -> bool:
  """True if the round indices `pattern` (integers, any order) are allowed in `num_rounds` rounds."""
  num_rounds = _validation.check_positive_int(num_rounds, 'num_rounds')
  if any(isinstance(r, bool) or not isinstance(r, numbers.Integral) for r in pattern):
    raise ValueError(f'`pattern` must hold integer rounds, got {pattern!r}.')
  pattern = tuple(sorted(int(r) for r in pattern))
  if len(set(pattern)) != len(pattern):
    return False
  if not pattern:
    return True
  if pattern[0] < 0 or pattern[-1] >= num_rounds:
    return False
  if len(pattern) > schema.effective_max_participations(num_rounds):
    return False
  gaps = [b - a for a, b in zip(pattern, pattern[1:], strict=False)]
  if schema.fixed_epoch:
    # A subset of {j, j + b, ..., j + (k_eff - 1) b} with offset j = pattern[0] mod b.
    last_allowed = pattern[0] % schema.min_sep + (
        schema.effective_max_participations(num_rounds) - 1) * schema.min_sep
    return all(g % schema.min_sep == 0 for g in gaps) and pattern[-1] <= last_allowed
  return all(g >= schema.min_sep for g in gaps)


def _is_maximal(schema: ParticipationSchema, pattern, num_rounds: int) -> bool:
  if len(pattern) >= schema.effective_max_participations(num_rounds):
    return True
  for r in range(num_rounds):
    if r not in pattern and admits(schema, pattern + (r,), num_rounds):
      return False
  return True
