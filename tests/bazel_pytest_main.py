"""Entry point of every Bazel `py_test`: runs pytest on the one test module named in argv[1].

Extra pytest options come from the PYTEST_ADDOPTS environment variable (`--test_env`).
"""

import sys

import pytest

if __name__ == '__main__':
  if len(sys.argv) != 2:
    raise SystemExit('usage: bazel_pytest_main.py TEST_MODULE_PATH')
  sys.exit(pytest.main([sys.argv[1], '-q', '-p', 'no:cacheprovider']))
