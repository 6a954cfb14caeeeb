"""Test-session setup shared by every test directory."""

import os
import signal

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from dp_ftrl_tff.learning import worker_processes  # noqa: E402
from tests.testing import tiers  # noqa: E402
from tests.testing.tiers import (  # noqa: E402, F401
  pytest_collection_modifyitems,
  pytest_runtest_call,
)


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  worker_processes.end_child_workers()


def pytest_configure(config):
  """Lets the worker_binary of every TFF context this session starts stop on SIGINT.

  `make test` runs pytest through tools/in_session.sh, a background job of a non-interactive shell,
  so pytest starts with SIGINT ignored and every process it starts inherits that. TFF's local C++
  contexts stop their worker_binary with SIGINT and wait for it: an ignoring worker never exits and
  the test hangs (dp_ftrl_tff/training/secure_context.py explains the same for the drivers). A handled
  signal is reset to its default in a child at exec, so handling it here makes workers stoppable.
  """
  tiers.pytest_configure(config)
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
