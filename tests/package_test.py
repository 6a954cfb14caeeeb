"""Package-level checks: the numpy-only layers import without TensorFlow."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize('module', ['dp_ftrl_tff.mechanisms', 'dp_ftrl_tff.accounting'])
def test_imports_without_tensorflow(module):
  code = (f'import sys, {module}\n'
          "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)\n"
          "print('ok')")
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == 'ok'
