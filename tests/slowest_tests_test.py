"""tools/slowest_tests.py: the table of the slowest tests in docs/TESTING.md, from pytest's JUnit XML."""

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parent.parent

JUNIT = '''<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.noise.tree_test" name="test_a[1]" time="0.5" />
<testcase classname="tests.experiments.drivers_test" name="test_run" time="31.25" />
<testcase classname="tests.accounting.zcdp_test.TestGroup" name="test_b" time="2.0" />
<testcase classname="tests.docs_test" name="test_document_blocks_run[README.md]" time="12.0" />
</testsuite></testsuites>
'''


def _tool():
  spec = importlib.util.spec_from_file_location('slowest_tests', ROOT / 'tools' / 'slowest_tests.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_times_are_node_ids_slowest_first(tmp_path):
  path = tmp_path / 'junit.xml'
  path.write_text(JUNIT)
  rows = _tool().test_times(path)
  assert rows == [(31.25, 'tests/experiments/drivers_test.py::test_run'),
                  (12.0, 'tests/docs_test.py::test_document_blocks_run[README.md]'),
                  (2.0, 'tests/accounting/zcdp_test.py::TestGroup::test_b'),
                  (0.5, 'tests/noise/tree_test.py::test_a[1]')]


def test_table_replaces_only_the_marked_section(tmp_path):
  tool = _tool()
  path = tmp_path / 'junit.xml'
  path.write_text(JUNIT)
  table = tool.table(tool.test_times(path), 2)
  assert table.splitlines()[0] == ('4 tests, 46 s of test time in all (summed over xdist workers); '
                                   'the 2 slowest:')
  assert table.splitlines()[-2:] == [
      '| 31.2 | `tests/experiments/drivers_test.py::test_run` |',
      '| 12.0 | `tests/docs_test.py::test_document_blocks_run[README.md]` |']
  document = f'# T\n\nbefore\n{tool.BEGIN}\nold\n{tool.END}\nafter\n'
  assert tool.rewrite(document, 'new') == f'# T\n\nbefore\n{tool.BEGIN}\nnew\n{tool.END}\nafter\n'
  with pytest.raises(ValueError, match='once each'):
    tool.rewrite('no markers', 'new')


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
  tool = _tool()
  assert tool.main([f'--junit={tmp_path / "missing.xml"}', '--check']) == 2
  (tmp_path / 'empty.xml').write_text('<testsuites></testsuites>')
  assert tool.main([f'--junit={tmp_path / "empty.xml"}', '--check']) == 2
  errors = capsys.readouterr().err.splitlines()
  assert len(errors) == 2 and all(e.startswith('slowest_tests: error: ') for e in errors)
  assert 'no test cases' in errors[1]


def test_testing_md_holds_a_generated_table():
  """docs/TESTING.md's section is what the tool writes: a count line, then 20 rows of times."""
  tool = _tool()
  text = (ROOT / 'docs' / 'TESTING.md').read_text()
  section = text.split(tool.BEGIN)[1].split(tool.END)[0].strip().splitlines()
  assert section[0].endswith('the 20 slowest:') and section[2:4] == ['| seconds | test |', '|---:|---|']
  times = [float(row.split('|')[1]) for row in section[4:]]
  assert len(times) == 20 and times == sorted(times, reverse=True)
  assert all(row.split('`')[1].startswith('tests/') for row in section[4:])
