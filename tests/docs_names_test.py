"""Every `dp_ftrl_tff...` name that README.md and docs/**/*.md mention imports: a module, or an
attribute (a function, a class, a constant, a method) reached from the longest module prefix."""

import importlib
import pathlib
import re

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / 'README.md', *(ROOT / 'docs').rglob('*.md')])
_NAME = re.compile(r'\bdp_ftrl_tff(?:\.[A-Za-z_][A-Za-z0-9_]*)+')


def mentioned_names():
  """{dotted name: first 'document:line' that mentions it}, file paths (`dp_ftrl_tff/x.py`)
  excluded."""
  names = {}
  for document in DOCUMENTS:
    for number, line in enumerate(document.read_text(encoding='utf-8').splitlines(), 1):
      for match in _NAME.finditer(line):
        name = match.group(0)
        if name.endswith(('.py', '.md')) or line[match.end():match.end() + 1] == '/':
          continue
        names.setdefault(name, f'{document.relative_to(ROOT)}:{number}')
  return names


def resolves(name: str) -> bool:
  """Whether `name` is a module or an attribute path from one."""
  parts = name.split('.')
  for cut in range(len(parts), 0, -1):
    try:
      value = importlib.import_module('.'.join(parts[:cut]))
    except ImportError:
      continue
    for attribute in parts[cut:]:
      if not hasattr(value, attribute):
        return False
      value = getattr(value, attribute)
    return True
  return False


def test_the_docs_mention_names():
  assert len(mentioned_names()) > 20


def test_every_name_the_docs_mention_imports():
  missing = [f'{where}: {name}' for name, where in mentioned_names().items()
             if not resolves(name)]
  assert not missing, missing
