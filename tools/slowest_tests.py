"""Writes (or checks) the table of the slowest tests in docs/TESTING.md from a pytest JUnit XML file.

`make test` writes `.test-results/junit.xml`; `make slowest` runs this script on it, which rewrites
the lines between `<!-- slowest-tests:begin -->` and `<!-- slowest-tests:end -->` of docs/TESTING.md.

Usage: python tools/slowest_tests.py [--junit FILE] [--count N] [--check]
  --check   only parse the file and the document, fail if either is malformed (no rewrite).
"""

import argparse
import pathlib
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / 'docs' / 'TESTING.md'
BEGIN, END = '<!-- slowest-tests:begin -->', '<!-- slowest-tests:end -->'


def test_times(junit_path: pathlib.Path) -> list:
  """(seconds, test id) of every test case in a JUnit XML file, slowest first.

  The test id is pytest's node id (`tests/x/y_test.py::test_name[param]`), rebuilt from the
  `classname` (dotted module path, then the class if any) and `name` attributes.
  """
  root = ET.parse(junit_path).getroot()
  rows = []
  for case in root.iter('testcase'):
    parts = case.get('classname', '').split('.')
    module_end = next((i for i, p in enumerate(parts) if p.endswith('_test')), len(parts) - 1)
    node = '/'.join(parts[:module_end + 1]) + '.py'
    for cls in parts[module_end + 1:]:
      node += f'::{cls}'
    rows.append((float(case.get('time', 0.0)), f'{node}::{case.get("name")}'))
  if not rows:
    raise ValueError(f'{junit_path}: no test cases')
  return sorted(rows, key=lambda r: (-r[0], r[1]))


def table(rows, count: int) -> str:
  total = sum(s for s, _ in rows)
  lines = [f'{len(rows)} tests, {total:.0f} s of test time in all (summed over xdist workers); '
           f'the {count} slowest:', '', '| seconds | test |', '|---:|---|']
  lines += [f'| {s:.1f} | `{name}` |' for s, name in rows[:count]]
  return '\n'.join(lines)


def rewrite(document: str, new_table: str) -> str:
  if document.count(BEGIN) != 1 or document.count(END) != 1:
    raise ValueError(f'{DOCUMENT.name} must hold {BEGIN} and {END} once each')
  head, rest = document.split(BEGIN)
  _, tail = rest.split(END)
  return f'{head}{BEGIN}\n{new_table}\n{END}{tail}'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--junit', default=str(ROOT / '.test-results' / 'junit.xml'))
  parser.add_argument('--count', type=int, default=20)
  parser.add_argument('--check', action='store_true')
  args = parser.parse_args(argv)
  if args.count < 1:
    parser.error('--count must be at least 1')
  try:
    rows = test_times(pathlib.Path(args.junit))
    updated = rewrite(DOCUMENT.read_text(), table(rows, args.count))
  except (OSError, ValueError, ET.ParseError) as e:
    print(f'slowest_tests: error: {e}', file=sys.stderr)
    return 2
  if not args.check:
    DOCUMENT.write_text(updated)
    print(f'wrote the {args.count} slowest of {len(rows)} tests into {DOCUMENT.relative_to(ROOT)}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
