"""docs/TESTING.md's flag table names, for every flag of every binary (each value of an enum flag,
each command), the test that runs it, and each test it names exists.

The binaries' flags are read from their absl `FlagValues` (as tests/experiments/every_flag_test.py
does), so a new flag, enum value or command without a row fails here, naming it. A cell is a test
(`path::function[parameters]` under tests/, with a note such as `(via run_emnist)`), `—` (not a
flag of that binary) or `gap: <why>` (a known gap, stated).
"""

import ast
import importlib
import os
import re

import pytest

from experiments import mechanisms_cli, privacy_report, run_task
from experiments.emnist import run_emnist
from experiments.stackoverflow import run_stackoverflow
from experiments.sweeps import run_sweep, summarize

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, 'docs', 'TESTING.md')
BEGIN, END = '<!-- flag-coverage:begin -->', '<!-- flag-coverage:end -->'
NOT_A_FLAG = '—'
_WORKERS = importlib.import_module('experiments.workers.__main__')

#: binary -> (its FlagValues, its commands).
BINARIES = {
    'run_emnist': (run_emnist.FLAGS, ()),
    'run_stackoverflow': (run_stackoverflow.FLAGS, ()),
    'run_task': (run_task.FLAGS, ()),
    'privacy_report': (privacy_report.FLAGS, ()),
    'mechanisms_cli': (mechanisms_cli._FLAGS, mechanisms_cli.COMMANDS),  # pylint: disable=protected-access
    'run_sweep': (run_sweep.FLAGS, ()),
    'summarize': (summarize.FLAGS, ()),
    'workers': (_WORKERS.FLAGS, _WORKERS.COMMANDS),
}


def required_rows(binary: str) -> list:
  """The rows a binary needs: its commands, `--flag` for each of its own flags, and
  `--flag=value` instead for each value of an enum flag."""
  flag_values, commands = BINARIES[binary]
  rows = list(commands)
  for flag in (f for flags in flag_values.flags_by_module_dict().values() for f in flags):
    values = getattr(flag.parser, 'enum_values', None)
    rows += [f'--{flag.name}={v}' for v in values] if values else [f'--{flag.name}']
  return rows


def _cells(line: str) -> list:
  return [cell.strip() for cell in line.strip().strip('|').split('|')]


def read_table(path: str = DOC) -> dict:
  """{(binary, row): cell} of the tables between the markers of `path`."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  section = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
  table, binaries = {}, None
  for line in section.splitlines():
    if not line.startswith('|'):
      binaries = None
      continue
    cells = _cells(line)
    if cells[0] == 'flag':
      binaries = cells[1:]
      assert set(binaries) <= set(BINARIES), binaries
      continue
    if set(''.join(cells)) <= set('-:'):
      continue
    assert binaries is not None, f'a row before its header: {line}'
    row = cells[0].strip('`')
    for binary, cell in zip(binaries, cells[1:], strict=True):
      assert (binary, row) not in table, f'{row} of {binary} twice'
      table[binary, row] = cell
  return table


_TEST = re.compile(r'^`(?P<path>[\w/]+\.py)::(?P<name>\w+)(\[[^\]`]*\])?`( \([^)]+\))?$')


def row_problems(table: dict) -> list:
  """What is wrong with `table`'s rows: flags without a row, rows of flags the binary lacks, and
  flags of the binary marked as not its own."""
  required = {b: set(required_rows(b)) for b in BINARIES}
  missing = [f'no row for {b} {row}' for b in BINARIES for row in required_rows(b)
             if (b, row) not in table]
  stale = [f'{b} has no {row}' for (b, row), cell in table.items()
           if cell != NOT_A_FLAG and row not in required[b]]
  unnamed = [f'{b} {row} is marked {NOT_A_FLAG}' for (b, row), cell in table.items()
             if cell == NOT_A_FLAG and row in required[b]]
  return missing + stale + unnamed


def test_every_flag_value_and_command_has_a_row():
  assert row_problems(read_table()) == []


def test_every_cell_names_a_test_that_exists_or_a_stated_gap():
  functions = {}
  bad = []
  for (binary, row), cell in read_table().items():
    if cell == NOT_A_FLAG or re.fullmatch(r'gap: \S.*', cell):
      continue
    match = _TEST.match(cell)
    if match is None:
      bad.append(f'{binary} {row}: {cell!r} is not `path::test` (note)')
      continue
    path = os.path.join(ROOT, 'tests', match['path'])
    if path not in functions:
      functions[path] = set()
      if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
          functions[path] = {n.name for n in ast.parse(f.read()).body
                             if isinstance(n, ast.FunctionDef)}
    if match['name'] not in functions[path]:
      bad.append(f'{binary} {row}: no test {match["name"]} in tests/{match["path"]}')
  assert not bad, bad


def test_a_missing_row_is_named(tmp_path):
  with open(DOC, encoding='utf-8') as f:
    text = f.read()
  doc = tmp_path / 'TESTING.md'
  doc.write_text(re.sub(r'\n\| `--restart_warmup` \|[^\n]*', '', text))
  problems = row_problems(read_table(str(doc)))
  assert 'no row for run_emnist --restart_warmup' in problems
  assert 'no row for privacy_report --restart_warmup' in problems
