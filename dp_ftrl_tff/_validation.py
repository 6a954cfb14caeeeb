"""Small input validators shared by every public entry point.

Each validator raises `ValueError` naming the offending parameter, in the style of TFF's
`_check_float_positive(value, label)` helpers. They return the value (converted where noted) so callers
can write `n = check_positive_int(n, 'num_rounds')`.
"""

import math
import numbers
from typing import Optional

import numpy as np


def check_positive_int(value, name: str) -> int:
  """Returns `value` as int; raises ValueError unless it is an integer >= 1."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f'`{name}` must be a positive integer, got {value!r}.')
  return int(value)


def check_nonnegative_int(value, name: str) -> int:
  """Returns `value` as int; raises ValueError unless it is an integer >= 0."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
    raise ValueError(f'`{name}` must be a non-negative integer, got {value!r}.')
  return int(value)


def _as_finite_float(value, name: str) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f'`{name}` must be a real number, got {value!r}.')
  value = float(value)
  if not math.isfinite(value):
    raise ValueError(f'`{name}` must be finite, got {value!r}.')
  return value


def check_positive_float(value, name: str) -> float:
  """Returns `value` as float; raises ValueError unless it is finite and > 0."""
  value = _as_finite_float(value, name)
  if value <= 0:
    raise ValueError(f'`{name}` must be positive, got {value!r}.')
  return value


def check_nonnegative_float(value, name: str) -> float:
  """Returns `value` as float; raises ValueError unless it is finite and >= 0."""
  value = _as_finite_float(value, name)
  if value < 0:
    raise ValueError(f'`{name}` must be non-negative, got {value!r}.')
  return value


def check_float_in_range(value, name: str, low: Optional[float], high: Optional[float],
                         *, low_inclusive: bool = True, high_inclusive: bool = True) -> float:
  """Returns `value` as float; raises ValueError unless it lies in the given interval."""
  value = _as_finite_float(value, name)
  too_low = low is not None and (value < low if low_inclusive else value <= low)
  too_high = high is not None and (value > high if high_inclusive else value >= high)
  if too_low or too_high:
    left = '[' if low_inclusive else '('
    right = ']' if high_inclusive else ')'
    raise ValueError(f'`{name}` must lie in {left}{low}, {high}{right}, got {value!r}.')
  return value


def check_one_of(value, name: str, allowed) -> object:
  """Returns `value`; raises ValueError unless it is one of `allowed`."""
  if value not in allowed:
    raise ValueError(f'`{name}` must be one of {sorted(allowed)}, got {value!r}.')
  return value


#: The largest magnitude of a strategy's coefficient (`check_float_array(..., max_abs=...)`): a
#: sensitivity sums k squares of column norms over up to n^2 such entries, at most 1e200 n^2 k,
#: which stays finite in float64 (max 1.8e308) for any n and k up to 1e50.
MAX_COEFFICIENT = 1e100


def check_float_array(value, name: str, ndim: int, max_abs: Optional[float] = None) -> np.ndarray:
  """Returns `value` as a float64 ndarray; raises ValueError unless it converts, has `ndim`
  dimensions, at least one entry, only finite entries, and (with `max_abs`) none of larger
  magnitude."""
  try:
    array = np.array(value, dtype=np.float64)
  except (TypeError, ValueError, OverflowError) as e:
    raise ValueError(f'`{name}` must be a {ndim}-D array of real numbers, got {value!r}.') from e
  if array.ndim != ndim or array.size == 0:
    raise ValueError(f'`{name}` must be a non-empty {ndim}-D array, got shape {array.shape}.')
  if not np.all(np.isfinite(array)):
    raise ValueError(f'`{name}` must be finite.')
  if max_abs is not None and np.max(np.abs(array)) > max_abs:
    raise ValueError(f'`{name}` has an entry of magnitude {np.max(np.abs(array)):g}, above '
                     f'{max_abs:g} (its squares and sums would overflow float64).')
  return array
