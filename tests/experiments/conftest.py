"""Fixtures of the driver tests (helpers live in tests/testing/)."""

import pytest

from tests.testing import runs


@pytest.fixture
def config_factory(tmp_path):
  def make(**overrides):
    return runs.tiny_config(tmp_path / overrides.pop('name', 'runs'), **overrides)
  return make
