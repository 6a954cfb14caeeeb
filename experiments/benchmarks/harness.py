"""What every benchmark shares: its flags' parsing, timed calls and their repeats, the ratio to the
anchor measured in the same run, the machine's conditions, and the docs/BENCHMARKS.md row.

Units: seconds everywhere; wall time is `time.perf_counter`, CPU time `time.process_time` (every
thread of this process). A benchmark states which statistic it reports: the best of the repeats
(`best_of`: the least disturbed run, for pure-numpy work on a shared machine) or their median
(`median_of`: for work whose time varies by itself, e.g. TFF rounds).
"""

import dataclasses
import os
import statistics
import time
from typing import Any, Callable

from absl import app, flags

from experiments.cli import flag_parsing


@dataclasses.dataclass(frozen=True)
class Timing:
  """One measured call: `wall` and `cpu` seconds and what the call returned."""
  wall: float
  cpu: float
  value: Any = None


def run(main: Callable, flag_values: flags.FlagValues, usage: str) -> None:
  """Runs a benchmark's `main` as every binary runs: `--help` prints `usage`, a flag error is one
  line on stderr (exit 2)."""
  app.run(main, flags_parser=flag_parsing.flags_parser(flag_values, usage))


def define_repeats(flag_values: flags.FlagValues, default: int, help_text: str,
                   lower_bound: int = 1):
  """The `--repeats` flag (>= `lower_bound`): how many times each case runs."""
  return flags.DEFINE_integer('repeats', default, help_text, lower_bound=lower_bound,
                              flag_values=flag_values)


def timed(fn: Callable[[], Any]) -> Timing:
  """Calls `fn()` once; its wall and CPU seconds and its value."""
  wall, cpu = time.perf_counter(), time.process_time()
  value = fn()
  return Timing(time.perf_counter() - wall, time.process_time() - cpu, value)


def _timings(fn: Callable[[], Any], repeats: int) -> list:
  if not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f'`repeats` must be a positive integer, got {repeats!r}.')
  return [timed(fn) for _ in range(repeats)]


def best_of(fn: Callable[[], Any], repeats: int) -> Timing:
  """The fastest (wall) of `repeats` calls of `fn()`, with its CPU seconds; the last call's value.

  Raises:
    ValueError: `repeats` is not a positive integer.
  """
  timings = _timings(fn, repeats)
  best = min(timings, key=lambda t: t.wall)
  return Timing(best.wall, best.cpu, timings[-1].value)


def median_of(fn: Callable[[], Any], repeats: int) -> Timing:
  """The median wall and CPU seconds of `repeats` calls of `fn()`; the last call's value.

  Raises:
    ValueError: `repeats` is not a positive integer.
  """
  timings = _timings(fn, repeats)
  return Timing(statistics.median(t.wall for t in timings),
                statistics.median(t.cpu for t in timings), timings[-1].value)


def ratio(ours: float, anchor: float) -> float:
  """`ours` / `anchor` (NaN when the anchor is 0 or NaN): below 1 is faster or smaller than the
  anchor measured in the same run."""
  return ours / anchor if anchor and anchor == anchor else float('nan')


def conditions() -> str:
  """The machine's conditions for the header line: CPUs, the 1-minute load average, and the glibc
  `MALLOC_*` variables set in the environment, if any."""
  malloc = ' '.join(f'{name}={value}' for name, value in sorted(os.environ.items())
                    if name.startswith('MALLOC_'))
  text = f'{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}'
  return text + (f' {malloc}' if malloc else '')


def benchmarks_row(what: str, ours: str, anchor: str, verdict: str, command: str) -> str:
  """One row of docs/BENCHMARKS.md's summary table (what | ours | anchor | ratio / target |
  command), `command` shown as code."""
  cells = (what, ours, anchor, verdict, f'`{command}`')
  if any('\n' in cell for cell in cells):
    raise ValueError('a docs/BENCHMARKS.md row holds no newline.')
  return '| ' + ' | '.join(cell.replace('|', '\\|') for cell in cells) + ' |'
