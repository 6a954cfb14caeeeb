"""Up-front memory checks: refuse a number of rounds whose float64 arrays cannot fit in memory.

The estimates are lower bounds of what each mechanism's computation really materializes (measured
with tracemalloc, float64 = 8 bytes):
  * banded (BandMF): the n x n C and its products, about 4 n x n arrays (32 n^2 bytes) to evaluate,
    load or optimize;
  * tree_full (full-rank tree decoder): 3 n x n arrays (24 n^2 bytes) for its losses; its
    sensitivity alone is O(n);
  * blt: O(n) Toeplitz coefficient arrays (about 56 n bytes), never an n x n matrix;
  * bsr, bisr: O(n) Toeplitz coefficients and their power-series inverse (about 79 n bytes; BSR's
    sensitivity alone about 32 n);
  * tree, tree_efficient: O(n) closed forms (about 33 n bytes);
  * gaussian: closed forms, no array of length n.
`check_fits` raises `MemoryLimitError` (a ValueError) naming the rounds and the memory needed when
the estimate exceeds the memory available now (`MemAvailable` of /proc/meminfo; physical memory
elsewhere). Imports no TensorFlow.
"""

import os
from typing import Optional

#: mechanism -> (bytes per n^2, bytes per n) of its losses / optimization.
_LOSSES_BYTES = {'banded': (32, 0), 'tree_full': (24, 33), 'blt': (0, 56), 'tree': (0, 33),
                 'tree_efficient': (0, 33), 'gaussian': (0, 0), 'bsr': (0, 79), 'bisr': (0, 79)}
#: mechanism -> (bytes per n^2, bytes per n) of its sensitivity alone (accounting).
_SENSITIVITY_BYTES = {'banded': (32, 0), 'tree_full': (0, 33), 'blt': (0, 56), 'tree': (0, 33),
                      'tree_efficient': (0, 33), 'gaussian': (0, 0), 'bsr': (0, 32),
                      'bisr': (0, 79)}


class MemoryLimitError(ValueError):
  """The requested size cannot fit in the memory of this machine."""


def available_bytes() -> int:
  """Memory available to a new allocation now: /proc/meminfo's MemAvailable, else physical RAM."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return 1 << 62


def estimate_bytes(mechanism: str, num_rounds: int, losses: bool = True) -> int:
  """Bytes the float64 arrays of `mechanism` over `num_rounds` rounds need at least (0 if unknown).

  Args:
    mechanism: a registry name.
    num_rounds: n.
    losses: True for losses / optimization (the decoder's errors), False for the sensitivity only.
  """
  quadratic, linear = (_LOSSES_BYTES if losses else _SENSITIVITY_BYTES).get(mechanism, (0, 0))
  n = int(num_rounds)
  return quadratic * n * n + linear * n


def format_bytes(num_bytes: float) -> str:
  for unit, size in (('EB', 1e18), ('PB', 1e15), ('TB', 1e12), ('GB', 1e9), ('MB', 1e6)):
    if num_bytes >= size:
      return f'{num_bytes / size:.1f} {unit}'
  return f'{num_bytes / 1e3:.1f} kB'


def check_fits(mechanism: str, num_rounds: int, losses: bool = True, flag: str = '--rounds',
               available: Optional[int] = None) -> None:
  """Raises `MemoryLimitError` when `estimate_bytes` exceeds the available memory.

  The message names `flag`, the memory needed (with its formula) and the memory available.
  """
  needed = estimate_bytes(mechanism, num_rounds, losses)
  available = available_bytes() if available is None else available
  if needed > available:
    quadratic, linear = (_LOSSES_BYTES if losses else _SENSITIVITY_BYTES)[mechanism]
    formula = f'{quadratic} n^2' if quadratic else f'{linear} n'
    raise MemoryLimitError(
        f'{flag}={num_rounds} is too large for {mechanism}: its float64 arrays need about '
        f'{format_bytes(needed)} ({formula} bytes for n={num_rounds}), but only '
        f'{format_bytes(available)} of memory is available; use fewer rounds (or restarts).')
