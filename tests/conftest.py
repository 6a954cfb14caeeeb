"""Test-session setup shared by every test directory."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from experiments.cli import tff_workers  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  tff_workers.end_child_workers()
