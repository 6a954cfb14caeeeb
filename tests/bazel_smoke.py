"""Entry point of every package's Bazel `smoke` target: imports each module of one package.

Under Bazel a `py_test` sees only the runfiles of its declared deps, so an import that works in the
source tree but is missing from the package's BUILD deps fails here. The test suite itself runs in
`make test`; the Bazel stage only collects it (see Makefile, `bazel-check`), so this import sweep is
the one thing Bazel executes per package.

Usage: bazel_smoke.py DOTTED_PACKAGE (e.g. dp_ftrl_tff.accounting)
"""

import importlib
import os
import pkgutil
import sys


def main(argv) -> int:
  if len(argv) != 2:
    raise SystemExit('usage: bazel_smoke.py DOTTED_PACKAGE')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  # Resolve imports from the runfiles only: Python put this script's real directory (the source
  # tree's tests/, which holds a package named `experiments` too) first on sys.path, and the
  # editable install's finder would find any package missing from the runfiles in the source tree.
  own_directory = os.path.dirname(os.path.realpath(__file__))
  sys.path[:] = [p for p in sys.path if os.path.realpath(p or '.') != own_directory]
  sys.meta_path[:] = [f for f in sys.meta_path
                      if not str(getattr(f, '__module__', '')).startswith('__editable__')]
  package = importlib.import_module(argv[1])
  names = [argv[1]] + [
      f'{argv[1]}.{info.name}' for info in pkgutil.iter_modules(package.__path__)
      if not info.ispkg]
  for name in names:
    importlib.import_module(name)
  print(f'{argv[1]}: imported {len(names)} module(s) under Bazel runfiles')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
