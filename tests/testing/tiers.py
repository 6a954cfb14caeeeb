"""Test tiers: every test carries exactly one of four markers that say what it exercises.

* `unit`: no TFF computation runs and no binary starts (numpy, scipy, dp_accounting, plain TF).
* `integration`: TFF in-process (computations, processes, `training_loop.train`, `main(argv)`).
* `e2e`: a binary as a subprocess (exit codes, signals, stdio, files on disk).
* `paper`: reproductions of published tables.

A module states its tier with `pytestmark = pytest.mark.<tier>`; a test may state its own, which
then wins over its module's (the closest marker, as pytest's `get_closest_marker`). The plugin keeps
the markers honest: a `unit` test that calls a TFF computation or starts a subprocess, or an
`integration` test that starts a Python or shell subprocess, fails with the reason.
Only the test's call phase is watched: a shared run built by a session fixture counts for the tier of
the fixture's own users, which are integration or e2e tests by construction.

docs/TESTING.md documents the tiers, their budgets and commands.
"""

import os
import subprocess
import sys

import pytest

TIERS = ('unit', 'integration', 'e2e', 'paper')
_COMPUTATION_MODULE = 'tensorflow_federated.python.core.impl.computation.computation_impl'


class _Watch:
  """What the current test's call phase did: subprocesses started, TFF computations called."""

  def __init__(self):
    self.active = False
    self.commands = []
    self.computations = 0


_WATCH = _Watch()
_PATCHED = {'popen': False, 'tff': False}


def _is_program(args) -> bool:
  """A Python interpreter or a shell: what runs the project's binaries and documents. Libraries'
  own helpers (`uname -p` from `platform`, TFF's worker_binary) are not what a tier is about."""
  first = args[0] if isinstance(args, (list, tuple)) and args else args
  name = os.path.basename(str(first).split()[0]) if str(first).strip() else ''
  return name.startswith('python') or name in ('bash', 'sh') or str(first) == sys.executable


def _patch_popen():
  if _PATCHED['popen']:
    return
  original = subprocess.Popen.__init__

  def init(self, args, *rest, **kwargs):
    if _WATCH.active and _is_program(args):
      command = args if isinstance(args, (list, tuple)) else [args]
      _WATCH.commands.append(' '.join(str(part) for part in command))
    original(self, args, *rest, **kwargs)

  subprocess.Popen.__init__ = init
  _PATCHED['popen'] = True


def _patch_tff():
  """Counts ConcreteComputation calls once TFF is imported (test modules import it at collection)."""
  module = sys.modules.get(_COMPUTATION_MODULE)
  if _PATCHED['tff'] or module is None:
    return
  original = module.ConcreteComputation.__call__

  def call(self, *args, **kwargs):
    if _WATCH.active:
      _WATCH.computations += 1
    return original(self, *args, **kwargs)

  module.ConcreteComputation.__call__ = call
  _PATCHED['tff'] = True


def _own_tier(node):
  names = [m.name for m in node.own_markers if m.name in TIERS]
  if len(names) > 1:
    raise pytest.UsageError(f'{node.nodeid}: more than one tier marker ({", ".join(names)})')
  return names[0] if names else None


def tier_of(item) -> str | None:
  return next((m.name for m in item.iter_markers() if m.name in TIERS), None)


def pytest_configure(config):
  for name, text in (
      ('unit', 'no TFF computation, no subprocess; part of `make test-fast`'),
      ('integration', 'TFF in-process; part of `make test-fast`'),
      ('e2e', 'a binary as a subprocess: exit codes, signals, stdio, files on disk'),
      ('paper', 'reproductions of published tables')):
    config.addinivalue_line('markers', f'{name}: {text} (docs/TESTING.md)')


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Gives each test exactly one tier: its own marker, else its class's, else its module's.

  Runs before `-m` selection, so `-m unit` selects by the resolved tier. The module's and class's
  tier markers move onto the tests that have none of their own.
  """
  del config
  missing = []
  parents = {}
  for item in items:
    tier = _own_tier(item)
    for parent in item.listchain()[-2::-1]:
      parent_tier = _own_tier(parent)
      if parent_tier:
        parents[id(parent)] = parent
        tier = tier or parent_tier
    if tier is None:
      missing.append(item.nodeid)
      continue
    if _own_tier(item) is None:
      item.add_marker(getattr(pytest.mark, tier))
  for parent in parents.values():
    parent.own_markers[:] = [m for m in parent.own_markers if m.name not in TIERS]
    # pytest also keeps a module's `pytestmark` in its keywords; the item's own marker now says it.
  if missing:
    raise pytest.UsageError('tests without a tier marker (unit, integration, e2e, paper; see '
                            'docs/TESTING.md): ' + ', '.join(missing[:10]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  _patch_popen()
  _patch_tff()
  _WATCH.active, _WATCH.commands, _WATCH.computations = True, [], 0
  try:
    result = yield
  finally:
    _WATCH.active = False
  tier = tier_of(item)
  started = _WATCH.commands
  if tier == 'unit' and (_WATCH.computations or started):
    what = (f'{_WATCH.computations} TFF computation call(s)' if _WATCH.computations
            else f'a subprocess ({started[0][:120]})')
    pytest.fail(f'a `unit` test ran {what}: mark it integration or e2e (docs/TESTING.md)',
                pytrace=False)
  if tier == 'integration' and started:
    pytest.fail(f'an `integration` test started a subprocess ({started[0][:120]}): mark it e2e '
                '(docs/TESTING.md)', pytrace=False)
  return result

