"""The pairwise covering design of the interacting run settings (tests/testing/interactions.py):
the design covers every allowed pair, and each combination without SecAgg trains 3 rounds the
drivers' way and reports (those with SecAgg: interactions_secure_test.py)."""

import pytest

from tests.testing import interactions

pytestmark = pytest.mark.integration


@pytest.mark.unit
def test_the_design_covers_every_allowed_pair():
  existing = [c for rows in interactions.EXISTING.values() for c in rows]
  combinations = interactions.COMBINATIONS
  assert interactions.uncovered_pairs(existing + combinations) == []
  for combination in combinations:  # none is redundant: each adds a pair nothing else runs
    others = existing + [c for c in combinations if c is not combination]
    assert interactions.uncovered_pairs(others), combination.id
  assert all(interactions.allowed(c.values()) for c in combinations)
  assert len({c.id for c in combinations}) == len(combinations)


@pytest.mark.unit
def test_the_existing_runs_are_tests():
  # The tests `EXISTING` credits exist (a renamed or removed test would leave its pairs uncovered).
  import ast  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  for node_id in interactions.EXISTING:
    path, name = node_id.split('::')
    with open(os.path.join(root, path)) as f:
      names = {n.name for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}
    assert name in names, node_id


@pytest.mark.parametrize('combination', [c for c in interactions.COMBINATIONS if not c.secagg],
                         ids=lambda c: c.id)
def test_combination_trains_and_reports(combination, tmp_path):
  interactions.run_and_check(combination, tmp_path)
