"""Up-front memory checks: refuse a number of rounds whose float64 arrays cannot fit in memory.

The estimates are each mechanism's `registry.MemoryModel`: lower bounds of what its computation
really materializes (measured with tracemalloc, float64 = 8 bytes), e.g. about 4 n x n arrays
(32 n^2 bytes) for BandMF, O(n) Toeplitz coefficients (56 n bytes) for a BLT, nothing of length n for
Gaussian noise. `check_fits` raises `MemoryLimitError` (a ValueError) naming the rounds and the
memory needed when the estimate exceeds the memory available now (`MemAvailable` of /proc/meminfo;
physical memory elsewhere). `check_canaries_fit` does the same for a driver's canary clients.
Imports no TensorFlow.
"""

import os
from typing import Optional, Tuple

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import registry


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


def _coefficients(mechanism: str, losses: bool) -> Tuple[int, int]:
  model = registry.entry(mechanism).memory
  return model.losses if losses else model.sensitivity


def estimate_bytes(mechanism: str, num_rounds: int, losses: bool = True) -> int:
  """Bytes the float64 arrays of `mechanism` over `num_rounds` rounds need at least.

  Args:
    mechanism: a registry name (ValueError for any other).
    num_rounds: n >= 1.
    losses: True for losses / optimization (the decoder's errors), False for the sensitivity only.
  """
  quadratic, linear = _coefficients(mechanism, losses)
  n = _validation.check_positive_int(num_rounds, 'num_rounds')
  return quadratic * n * n + linear * n


def format_bytes(num_bytes: float) -> str:
  """`num_bytes` in kB .. EB with one decimal (three significant digits from 1000 EB)."""
  if num_bytes >= 1e21:
    return f'{num_bytes / 1e18:.3g} EB'
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
    quadratic, linear = _coefficients(mechanism, losses)
    formula = f'{quadratic} n^2' if quadratic else f'{linear} n'
    raise MemoryLimitError(
        f'{flag}={num_rounds} is too large for {mechanism}: its float64 arrays need about '
        f'{format_bytes(needed)} ({formula} bytes for n={num_rounds}), but only '
        f'{format_bytes(available)} of memory is available; use fewer rounds (or restarts).')


#: Bytes per canary client a driver holds besides its rounds (tracemalloc, 2e5 canaries): its id
#: string (70), the id in the population list (8), in the canary index (66) and in the canary
#: file writer (8). A lower bound: the sampler and the canary file add more.
CANARY_BYTES = 152

#: Bytes per canary and round of the canary projections the report reads back: 2 directions (seen
#: and unseen) of float64 each.
CANARY_ROUND_BYTES = 16


def estimate_canary_bytes(num_canaries: int, num_rounds: int) -> int:
  """Bytes the canary clients of a run need at least: `CANARY_BYTES` N + `CANARY_ROUND_BYTES` N n
  for N = `num_canaries` >= 0 over n = `num_rounds` >= 1."""
  n = _validation.check_positive_int(num_rounds, 'num_rounds')
  num_canaries = _validation.check_nonnegative_int(num_canaries, 'num_canaries')
  return num_canaries * (CANARY_BYTES + CANARY_ROUND_BYTES * n)


def check_canaries_fit(num_canaries: int, num_rounds: int, flag: str = '--canary_clients',
                       available: Optional[int] = None) -> None:
  """Raises `MemoryLimitError` when `estimate_canary_bytes` exceeds the available memory, naming
  `flag`, the memory needed (with its formula) and the memory available."""
  needed = estimate_canary_bytes(num_canaries, num_rounds)
  available = available_bytes() if available is None else available
  if needed > available:
    raise MemoryLimitError(
        f'{flag}={num_canaries} is too large: the canaries need about {format_bytes(needed)} '
        f'({CANARY_BYTES} N + {CANARY_ROUND_BYTES} N n bytes for N={num_canaries} over n='
        f'{num_rounds} rounds), but only {format_bytes(available)} of memory is available; use '
        'fewer canary clients.')
