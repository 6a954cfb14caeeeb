"""A sweep's grid: the flag values of each point, and the name of each point's run directory.

Two spellings of one grid (the Cartesian product of each flag's values, in the order written):
  * `--grid` text: `name=v1,v2;name2=w1,w2` (`;` between flags, `,` between values), e.g.
    `noise_multiplier=0.5,1.0;mechanism=blt,banded` gives 4 points;
  * a JSON file (`--grid_file`): an object `{"name": [v1, v2], ...}` (one product), or a list of such
    objects (the union of their products, in order, duplicates dropped), so that a grid can pair
    values, e.g. `[{"mechanism": ["blt"], "num_buffers": [2, 3]}, {"mechanism": ["gaussian"]}]`.
    JSON booleans become `true` / `false`, numbers and strings their text.
A point is an ordered tuple of (flag name, value text) pairs; its run directory name joins them as
`name=value` with `,` (e.g. `noise_multiplier=0.5,mechanism=blt`), characters other than letters,
digits and `._+-=,` replaced by `_`. Imports no TensorFlow.
"""

import itertools
import json
import re
from typing import Any, List, Sequence, Tuple

Point = Tuple[Tuple[str, str], ...]

#: Flags the sweep sets itself for every point: a grid or the passed-through flags may not set them.
RESERVED_FLAGS = ('root_output_dir', 'experiment_name')
_FLAG_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
_UNSAFE = re.compile(r'[^A-Za-z0-9._+=,-]')


def _check_name(name: str, source: str) -> str:
  if not _FLAG_NAME.match(name):
    raise ValueError(f'`{source}`: {name!r} is not a flag name.')
  if name in RESERVED_FLAGS:
    raise ValueError(f'`{source}` may not set --{name}: the sweep sets it for every point.')
  return name


def _product(axes: Sequence[Tuple[str, List[str]]]) -> List[Point]:
  names = [name for name, _ in axes]
  return [tuple(zip(names, values, strict=True))
          for values in itertools.product(*(values for _, values in axes))]


def parse_grid_text(text: str) -> List[Point]:
  """The points of a `--grid` text `name=v1,v2;name2=w1` (see the module docstring).

  Raises:
    ValueError: malformed text, a repeated flag, an empty value list, or a reserved flag.
  """
  if not isinstance(text, str) or not text.strip():
    raise ValueError('`grid` must be a non-empty text like "noise_multiplier=0.5,1.0;mechanism=blt".')
  axes, seen = [], set()
  for part in filter(None, (p.strip() for p in text.split(';'))):
    name, sep, values = part.partition('=')
    name = _check_name(name.strip(), 'grid')
    if not sep:
      raise ValueError(f'`grid`: {part!r} lacks "=" (expected name=v1,v2).')
    if name in seen:
      raise ValueError(f'`grid` names --{name} twice.')
    seen.add(name)
    values = [v.strip() for v in values.split(',')]
    if not all(values):
      raise ValueError(f'`grid`: --{name} has an empty value in {part!r}.')
    axes.append((name, values))
  if not axes:
    raise ValueError('`grid` holds no flag.')
  return _product(axes)


def _value_text(value: Any, name: str) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (int, float, str)) and str(value):
    return str(value)
  raise ValueError(f'`grid_file`: --{name} has a value {value!r} that is not a number, a string or '
                   'a boolean.')


def parse_grid_document(document: Any) -> List[Point]:
  """The points of a JSON grid (an object of value lists, or a list of them; see the module
  docstring).

  Raises:
    ValueError: not an object or a list of objects, a value list that is empty or not a list, a bad
      value, or a reserved flag.
  """
  groups = document if isinstance(document, list) else [document]
  if not groups or not all(isinstance(group, dict) and group for group in groups):
    raise ValueError('`grid_file` must hold a non-empty JSON object {"flag": [values], ...} or a '
                     'list of them.')
  points, seen = [], set()
  for group in groups:
    axes = []
    for name, values in group.items():
      _check_name(name, 'grid_file')
      if not isinstance(values, list) or not values:
        raise ValueError(f'`grid_file`: --{name} must map to a non-empty list of values.')
      axes.append((name, [_value_text(v, name) for v in values]))
    for point in _product(axes):
      if point not in seen:
        seen.add(point)
        points.append(point)
  return points


def load_grid_file(path: str) -> List[Point]:
  """`parse_grid_document` of the JSON file at `path` (ValueError naming the file if unreadable)."""
  try:
    with open(path, encoding='utf-8') as f:
      document = json.load(f)
  except OSError as error:
    raise ValueError(f'`grid_file`: cannot read {path!r}: {error.strerror or error}.') from error
  except (json.JSONDecodeError, UnicodeDecodeError) as error:
    raise ValueError(f'`grid_file`: {path!r} is not valid JSON: {error}.') from error
  return parse_grid_document(document)


def point_name(point: Point) -> str:
  """The run directory name of `point`: `name=value` pairs joined by `,`, unsafe characters `_`."""
  if not point:
    raise ValueError('`point` must hold at least one (flag, value) pair.')
  return _UNSAFE.sub('_', ','.join(f'{name}={value}' for name, value in point))


def point_flags(point: Point) -> List[str]:
  """The command-line flags `--name=value` of `point`."""
  return [f'--{name}={value}' for name, value in point]


def check_unique_names(points: Sequence[Point]) -> None:
  """Raises ValueError if two points share a run directory name (values differing only in
  characters the name replaces)."""
  names = {}
  for point in points:
    name = point_name(point)
    if name in names and names[name] != point:
      raise ValueError(f'grid points {names[name]} and {point} share the run directory name '
                       f'{name!r}; rename a value.')
    names[name] = point
