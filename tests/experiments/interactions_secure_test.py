"""The combinations with SecAgg of the pairwise covering design (tests/testing/interactions.py):
each trains 3 rounds the drivers' way, its secure sums replaced by their bodies (what TFF's test
context runs; the drivers' context switch is secure_driver_test.py's), and reports."""

import pytest

from tests.testing import interactions

pytestmark = pytest.mark.integration


@pytest.mark.parametrize('combination', [c for c in interactions.COMBINATIONS if c.secagg],
                         ids=lambda c: c.id)
def test_secure_combination_trains_and_reports(combination, tmp_path):
  interactions.run_and_check(combination, tmp_path)
