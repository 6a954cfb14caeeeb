"""The drivers' log format (`driver.set_up_logging`): our own records read `<program>: <level>:
...` like our errors; a library's record (TensorFlow's ERROR log from a graph, e.g. "Object was
never used") keeps absl's format with its source file, never dressed as our error line."""

import logging
import os

import pytest

import experiments
from dp_ftrl_tff.training import console
from experiments.run import driver

pytestmark = pytest.mark.unit


def _record(pathname: str, level: int, message: str, name: str = 'absl') -> logging.LogRecord:
  return logging.LogRecord(name, level, pathname, 80, message, (), None)


def test_our_records_read_as_the_program_s_lines():
  own = os.path.join(os.path.dirname(experiments.__file__), 'run', 'run_dir.py')
  line = driver._PlainFormatter().format(_record(own, logging.WARNING, 'a stale lock'))
  assert line == f'{console.program_name()}: warning: a stale lock'


def test_a_library_s_error_record_is_not_dressed_as_ours():
  library = '/venv/lib/python3.11/site-packages/tensorflow/python/util/tf_should_use.py'
  record = _record(library, logging.ERROR, '====\nObject was never used', name='tensorflow')
  text = driver._PlainFormatter().format(record)
  assert not text.startswith(f'{console.program_name()}:'), text
  assert ': error:' not in text
  assert text.startswith('E') and 'tf_should_use.py:80] ====' in text, text
  assert not driver.is_own_record(record)
  # A path that only begins like a package directory is not inside it.
  assert not driver.is_own_record(_record(os.path.dirname(experiments.__file__) + '_x/a.py',
                                          logging.ERROR, 'x'))
