"""Up-front memory and time checks: refuse a size whose arrays cannot fit in memory, or whose
computation would not finish in reasonable time, before anything is computed.

The memory estimates are each mechanism's `registry.MemoryModel`: lower bounds of what its
computation really materializes (measured with tracemalloc, float64 = 8 bytes), e.g. about 4 n x n
arrays (32 n^2 bytes) for BandMF, O(n) Toeplitz coefficients (56 n bytes) for a BLT, nothing of
length n for Gaussian noise. `check_fits` raises `MemoryLimitError` (a ValueError) naming the rounds
and the memory needed when the estimate exceeds the memory available now (`MemAvailable` of
/proc/meminfo; physical memory elsewhere). `check_canaries_fit` does the same for a driver's canary
clients and `check_noise_state_fits` for the streaming noise state of a TFF simulation (model-sized
float32 buffers: `MemoryModel.noise_vectors`, `NOISE_STATE_COPIES`).

Time: `check_seconds` raises `ComputeLimitError` (a ValueError) when a computation's estimated time
(a cost model measured on this project's machine type, e.g. `blt.optimization_cost`) exceeds
`MAX_SECONDS`, naming the size, the estimate and what to change. Imports no TensorFlow.
"""

import math
import os
from typing import Optional, Tuple

from dp_ftrl_tff import _validation
from dp_ftrl_tff.mechanisms import registry


class MemoryLimitError(ValueError):
  """The requested size cannot fit in the memory of this machine."""


class ComputeLimitError(ValueError):
  """The requested size would take longer than `MAX_SECONDS` to compute."""


#: The longest up-front computation (an optimization, an accounting) a library call or a binary
#: starts: an hour. Longer ones are refused with their estimate, so that a mistyped size is an error
#: within seconds, not a process that seems to hang.
MAX_SECONDS = 3600.0


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


def check_bytes(needed: float, subject: str, formula: str, remedy: str,
                available: Optional[int] = None) -> None:
  """Raises `MemoryLimitError` when `needed` bytes exceed the `available` memory (default
  `available_bytes()`): '`subject` need(s) about <bytes> (`formula`), but only <bytes> of memory is
  available; `remedy`' (`subject` ends with its verb's subject, e.g. 'the canaries need')."""
  available = available_bytes() if available is None else available
  if needed > available:
    raise MemoryLimitError(
        f'{subject} about {format_bytes(needed)} ({formula}), but only {format_bytes(available)} '
        f'of memory is available; {remedy}')


def check_fits(mechanism: str, num_rounds: int, losses: bool = True, flag: str = '--rounds',
               available: Optional[int] = None) -> None:
  """Raises `MemoryLimitError` when `estimate_bytes` exceeds the available memory.

  The message names `flag`, the memory needed (with its formula) and the memory available.
  """
  quadratic, linear = _coefficients(mechanism, losses)
  formula = f'{quadratic} n^2' if quadratic else f'{linear} n'
  check_bytes(estimate_bytes(mechanism, num_rounds, losses),
              f'{flag}={num_rounds} is too large for {mechanism}: its float64 arrays need',
              f'{formula} bytes for n={num_rounds}', 'use fewer rounds (or restarts).', available)


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
  check_bytes(estimate_canary_bytes(num_canaries, num_rounds),
              f'{flag}={num_canaries} is too large: the canaries need',
              f'{CANARY_BYTES} N + {CANARY_ROUND_BYTES} N n bytes for N={num_canaries} over '
              f'n={num_rounds} rounds', 'use fewer canary clients.', available)


#: Copies of each model-sized float32 vector of the streaming noise state that a local TFF simulation
#: holds at its peak (the state in the Python process and in TFF's worker, a round's input and
#: output, their serializations): measured with the EMNIST driver (the 1.66M-parameter CNN, a BLT of
#: d = 1, 32 and 64 buffers), its peak resident memory and its worker's grew by 19.7 (2 rounds) to
#: 23.5 (5 rounds) model-sized vectors per buffer. A lower bound.
NOISE_STATE_COPIES = 19


def noise_state_vectors(strategy, num_rounds: int) -> int:
  """The model-sized vectors the streaming noise state of `strategy` (a registry mechanism's
  `base.Strategy`) holds over `num_rounds` rounds (`registry.MemoryModel.noise_vectors`)."""
  n = _validation.check_positive_int(num_rounds, 'num_rounds')
  return int(registry.entry(strategy.name).memory.noise_vectors(strategy, n))


def estimate_noise_state_bytes(strategy, num_rounds: int, num_parameters: int) -> int:
  """Bytes a local TFF simulation needs at least for the noise state of `strategy` over a model of
  `num_parameters` float32 parameters: `NOISE_STATE_COPIES` x 4 x P x vectors."""
  p = _validation.check_positive_int(num_parameters, 'num_parameters')
  return NOISE_STATE_COPIES * 4 * p * noise_state_vectors(strategy, num_rounds)


def check_noise_state_fits(strategy, num_rounds: int, num_parameters: int,
                           available: Optional[int] = None) -> None:
  """Raises `MemoryLimitError` when `estimate_noise_state_bytes` exceeds the available memory,
  naming the option that sets the number of vectors (`MemoryModel.noise_option`, e.g.
  `num_buffers`), the memory needed (with its formula) and the memory available."""
  vectors = noise_state_vectors(strategy, num_rounds)
  option = registry.entry(strategy.name).memory.noise_option
  check_bytes(estimate_noise_state_bytes(strategy, num_rounds, num_parameters),
              f'the {strategy.name} noise state holds {vectors} model-sized buffers (from '
              f'`{option}`) of {num_parameters} float32 parameters, and a TFF simulation keeps '
              f'about {NOISE_STATE_COPIES} copies of each, which need',
              f'{NOISE_STATE_COPIES} x 4 x {num_parameters} x {vectors} bytes',
              f'use fewer buffers (`{option}`) or a smaller model.', available)


def format_seconds(seconds: float) -> str:
  """`seconds` as seconds, minutes, hours, days or years with three significant digits."""
  if not math.isfinite(seconds):
    return 'forever'
  unit, size = next(((unit, size) for unit, size in (
      ('year', 365.25 * 86400), ('day', 86400), ('hour', 3600), ('minute', 60))
      if seconds >= size), ('second', 1.0))
  text = f'{seconds / size:.3g}'
  return f'{text} {unit}' + ('' if text == '1' else 's')


def check_seconds(seconds: float, subject: str, remedy: str,
                  max_seconds: Optional[float] = None) -> None:
  """Raises `ComputeLimitError` when `seconds` (a computation's estimated time) exceeds
  `max_seconds` (default `MAX_SECONDS`): '`subject` would take about <time> on this machine type
  (...), above the limit ...; `remedy`'."""
  limit = MAX_SECONDS if max_seconds is None else max_seconds
  if seconds > limit:
    raise ComputeLimitError(
        f'{subject} would take about {format_seconds(seconds)} on this project\'s machine type, '
        f'above the {format_seconds(limit)} a computation here may take; {remedy}')


def check_generated_clients(num_clients: int, examples_per_client: int, bytes_per_example: int,
                            seconds_per_client: float, seconds_per_example: float,
                            available: Optional[int] = None) -> None:
  """Raises `MemoryLimitError` or `ComputeLimitError` (ValueErrors naming `num_clients` and
  `examples_per_client`) when a generated population of N = `num_clients` clients of about
  E = `examples_per_client` examples each needs more than the available memory (N E x
  `bytes_per_example`) or longer than `MAX_SECONDS` to generate (N x `seconds_per_client` + N E x
  `seconds_per_example`); the per-example figures are the generator's, measured."""
  n = _validation.check_positive_int(num_clients, 'num_clients')
  e = _validation.check_positive_int(examples_per_client, 'examples_per_client')
  what = f'`num_clients`={n} clients of `examples_per_client`={e} examples'
  check_bytes(float(n) * e * bytes_per_example, f'{what}: the generated population needs',
              f'{bytes_per_example} bytes an example', 'use fewer clients or examples per client.',
              available)
  check_seconds(float(n) * seconds_per_client + float(n) * e * seconds_per_example,
                f'{what}: generating the population', 'use fewer clients or examples per client.')


#: Copies of the model's float32 parameters a local TFF simulation holds at its peak (the Keras and
#: TFF models, the server state and its optimizer, the clients' copies, updates and gradients, the
#: worker's and their serializations): the EMNIST driver with its 1.66M-parameter CNN peaked 703 MB
#: above the tiny model's run, about 106 model-sized vectors, 87 of them without its BLT buffer's
#: 19. A lower bound.
MODEL_COPIES = 80


def check_model_fits(num_parameters: int, what: str, activation_floats: int = 0,
                     available: Optional[int] = None) -> None:
  """Raises `MemoryLimitError` when a model of `num_parameters` float32 parameters (`MODEL_COPIES`
  copies) plus `activation_floats` float32 activations of one client batch exceeds the available
  memory; `what` names the settings that make them (e.g. '`vocab_size`=..., ...')."""
  p = _validation.check_positive_int(num_parameters, 'num_parameters')
  activations = _validation.check_nonnegative_int(activation_floats, 'activation_floats')
  check_bytes(4.0 * (MODEL_COPIES * p + activations),
              f'{what}: a model of {p:.3g} float32 parameters and {activations:.3g} activations of '
              'a client batch need', f'{MODEL_COPIES} copies of the model in a TFF simulation',
              'use a smaller model or shorter sequences.', available)
